/*
 * The CUDA backend: the op table of core/backend.h on an NVIDIA GPU.
 *
 * Memory kinds: MEM_ACT is bf16 (activations and their gradients), MEM_F32 is
 * float (gradients of the parameters, optimiser state, norm statistics,
 * gates, losses), MEM_I32 is int32. A MEM_PARAM allocation holds n float32
 * master weights followed by their bf16 copy: matrix products read the copy
 * (cuBLAS with bf16 inputs and float32 accumulation), everything else reads
 * the master, and every write (upload, AdamW) refreshes both, so the copy is
 * never stale. Mixed precision as in the paper: float32 weights and optimiser
 * state, bf16 activations and products, the Mesa states and CG in float32.
 *
 * This file holds the table, the device context and the recorded launches (CUDA graphs); the ops
 * are in one file per group (cuda_ops.cuh lists them), the sequence-mixer cores in their own
 * (mesa_cuda.cu, lin_cuda.cu, lin_chunk*.cu, attn_cuda.cu, attn_cudnn.cu, mlstm_cuda.cu, slstm_cuda.cu, scan_cuda.cu).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_ops.cuh"

extern "C" int cuda_mesa_fwd(const Backend *be, const MnSeqDims *d, const MnSolver *s, const MnMesaFwd *io);
extern "C" int cuda_mesa_bwd(const Backend *be, const MnSeqDims *d, const MnSolver *s, const MnMesaBwd *io);
extern "C" int cuda_lin_fwd(const Backend *be, const MnSeqDims *d, const MnLinOpts *o, const MnLinFwd *io);
extern "C" int cuda_lin_bwd(const Backend *be, const MnSeqDims *d, const MnLinOpts *o, const MnLinBwd *io);
extern "C" int cuda_attn_fwd(const Backend *be, const AttnDims *d, const AttnFwd *io);
extern "C" int cuda_attn_bwd(const Backend *be, const AttnDims *d, const AttnBwd *io);
extern "C" int cuda_attn_decode(const Backend *be, const AttnDims *d, int n, int cap, const void *q, const void *kc,
                                const void *vc, void *o);
extern "C" int cuda_rope(const Backend *be, void *x, const void *pos, int N, int H, int D, int rot, float theta,
                         int inverse);
extern "C" int cuda_mesa_supports(const Backend *be, const MnSeqDims *d);
extern "C" int cuda_lin_supports(const Backend *be, const MnSeqDims *d);
extern "C" int cuda_mlstm_fwd(const Backend *be, const MnSeqDims *d, const MlstmOpts *o, const MlstmFwd *io);
extern "C" int cuda_mlstm_bwd(const Backend *be, const MnSeqDims *d, const MlstmOpts *o, const MlstmBwd *io);
extern "C" int cuda_mlstm_supports(const Backend *be, const MnSeqDims *d);
extern "C" int cuda_slstm_fwd(const Backend *be, const SlstmDims *d, const SlstmFwd *io);
extern "C" int cuda_slstm_bwd(const Backend *be, const SlstmDims *d, const SlstmBwd *io);
extern "C" int cuda_slstm_supports(const Backend *be, const SlstmDims *d);
extern "C" int cuda_scan_fwd(const Backend *be, const ScanDims *d, const ScanFwd *io);
extern "C" int cuda_scan_bwd(const Backend *be, const ScanDims *d, const ScanBwd *io);
extern "C" int cuda_scan_supports(const Backend *be, const ScanDims *d);

// The sequence-mixer families: mesa (mesa_cuda.cu); the linear-attention family (lin_cuda.cu and
// lin_chunk*.cu); attention (attn_cudnn.cu, or attn_cuda.cu without cuDNN). Aggregates in the
// order of backend.h's sub-tables.
static const MesaOps cuda_mesa = {cuda_mesa_fwd, cuda_mesa_bwd, g_softplus_fwd, g_softplus_bwd, cuda_mesa_supports};
static const LinOps cuda_lin = {cuda_lin_fwd,       cuda_lin_bwd,       g_gdn_gate_fwd,   g_gdn_gate_bwd,
                                g_longhorn_eps_fwd, g_longhorn_eps_bwd, cuda_lin_supports};
static const AttnOps cuda_attn = {cuda_attn_fwd, cuda_attn_bwd, cuda_attn_decode, cuda_rope, NULL};
// The xLSTM family's cores (mlstm_cuda.cu, mlstm_chunk.cuh; slstm_cuda.cu, slstm_cluster.cu) and
// the mLSTM gates (cuda_xlstm_ops.cu).
static const MlstmOps cuda_mlstm = {cuda_mlstm_fwd, cuda_mlstm_bwd, g_mlstm_gates_fwd, g_mlstm_gates_bwd,
                                    cuda_mlstm_supports};
static const SlstmOps cuda_slstm = {cuda_slstm_fwd, cuda_slstm_bwd, cuda_slstm_supports};
// The diagonal recurrences, RG-LRU and Longhorn (scan_cuda.cu).
static const ScanOps cuda_scan = {cuda_scan_fwd, cuda_scan_bwd, cuda_scan_supports};

// ------------------------------------------------------------------ recordings and releases

static pthread_rwlock_t record_lock = PTHREAD_RWLOCK_INITIALIZER;
static thread_local int recording;  // this thread records: its own calls take no lock (they would wait for it)

void cuda_exclusive(int begin) {
    if (recording) return;
    if (begin) pthread_rwlock_wrlock(&record_lock);
    else pthread_rwlock_unlock(&record_lock);
}

// A call under cuda_exclusive: its status.
#define EXCLUSIVE(call)              \
    do {                             \
        cuda_exclusive(1);           \
        cudaError_t e_ = (call);     \
        cuda_exclusive(0);           \
        return e_;                   \
    } while (0)

cudaError_t cuda_malloc(void **p, size_t bytes) { EXCLUSIVE(cudaMalloc(p, bytes)); }
cudaError_t cuda_free(void *p) { EXCLUSIVE(cudaFree(p)); }
cudaError_t cuda_malloc_host(void **p, size_t bytes) { EXCLUSIVE(cudaMallocHost(p, bytes)); }
cudaError_t cuda_free_host(void *p) { EXCLUSIVE(cudaFreeHost(p)); }

// ------------------------------------------------------------------ recorded launches

// A decode step of a small model is hundreds of short kernels; launched one by one from the host
// they take longer than they run. CUDA graphs record the step once and replay it in one launch.
typedef struct {
    cudaGraphExec_t exec;
    void *scratch;  // the scratch buffer the recording saw (replaying after it moved would be wrong)
} Recording;

static int g_graph_begin(const Backend *be) {
    if (recording) return mn_error(MN_ERR_ARG, "cuda graph: a recording inside a recording");
    pthread_rwlock_rdlock(&record_lock);
    cudaError_t e = cudaStreamBeginCapture(cuda_ctx(be)->stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) pthread_rwlock_unlock(&record_lock);
    CU_TRY(e);
    recording = 1;
    return MN_OK;
}

static int g_graph_end(const Backend *be, void **out) {
    CudaCtx *c = cuda_ctx(be);
    *out = NULL;
    cudaGraph_t graph;
    cudaError_t ended = cudaStreamEndCapture(c->stream, &graph);
    if (recording) {
        recording = 0;
        pthread_rwlock_unlock(&record_lock);
    }
    CU_TRY(ended);
    Recording *r = (Recording *)calloc(1, sizeof *r);
    if (!r) {
        cudaGraphDestroy(graph);
        return mn_error(MN_ERR_NOMEM, "out of memory");
    }
    cudaError_t e = cudaGraphInstantiate(&r->exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
        free(r);
        CU_TRY(e);
    }
    r->scratch = c->scratch;
    *out = r;
    return MN_OK;
}

static int g_graph_run(const Backend *be, void *graph) {
    CudaCtx *c = cuda_ctx(be);
    Recording *r = (Recording *)graph;
    if (r->scratch != c->scratch) return mn_error(MN_ERR_ARG, "cuda graph: the scratch buffer moved since the recording");
    CU_TRY(cudaGraphLaunch(r->exec, c->stream));
    return MN_OK;
}

static void g_graph_free(const Backend *be, void *graph) {
    Recording *r = (Recording *)graph;
    if (!r) return;
    cudaStreamSynchronize(cuda_ctx(be)->stream);  // a replay may still be running
    cuda_exclusive(1);
    cudaGraphExecDestroy(r->exec);
    cuda_exclusive(0);
    free(r);
}

// ------------------------------------------------------------------------- the table

static Backend cuda_backend;  // backend_cuda(): the process's default instance, on device 0
static int initialised;

CudaCtx *cuda_ctx(const Backend *be) { return (CudaCtx *)be->ctx; }

void *cuda_scratch(const Backend *be, size_t bytes) {
    CudaCtx *c = cuda_ctx(be);
    if (bytes <= c->scratch_bytes) return c->scratch;
    cudaStreamSynchronize(c->stream);  // the old buffer may still be in use by queued work
    if (c->scratch) cuda_free(c->scratch);
    c->scratch = NULL;
    c->scratch_bytes = 0;
    size_t n = bytes + bytes / 4;
    if (cuda_malloc(&c->scratch, n) != cudaSuccess) {
        mn_error(MN_ERR_NOMEM, "cudaMalloc of %zu bytes of scratch failed", n);
        return NULL;
    }
    c->scratch_bytes = n;
    return c->scratch;
}

// How many devices this process sees (0 where there is no driver or device).
extern "C" int cuda_device_count(void) {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

// Why there is no usable device, as an mn_error (CUDA's own words only as the detail).
static void no_device(cudaError_t e) {
    // Without a GPU or its driver the runtime says "driver version is insufficient" or "no
    // CUDA-capable device": said plainly. A driver that is there (version > 0) but older than the
    // runtime is the one case an update fixes.
    int drv = 0, rt = 0;
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    const char *detail = e != cudaSuccess ? cudaGetErrorString(e) : "no device found";
    if (e == cudaErrorInsufficientDriver && drv > 0)
        mn_error(MN_ERR_UNSUPPORTED, "backend 'cuda': the GPU driver supports CUDA %d.%d, older than this build's %d.%d (%s)",
                 drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10, detail);
    else if (e == cudaSuccess || e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver)
        mn_error(MN_ERR_UNSUPPORTED, "backend 'cuda': no CUDA GPU or driver found on this machine (CUDA: %s)", detail);
    else
        mn_error(MN_ERR_UNSUPPORTED, "backend 'cuda': no usable CUDA device (%s)", detail);
}

// Releases what ctx_open made (the parts it made before a failure too); device current. Called
// under cuda_exclusive.
static void ctx_close(CudaCtx *c) {
    if (c->stream) cudaStreamSynchronize(c->stream);
    if (c->side) cudaStreamSynchronize(c->side);
    if (c->blas) cublasDestroy(c->blas);
    if (c->blas_ws) cudaFree(c->blas_ws);
    if (c->scratch) cudaFree(c->scratch);
    if (c->pinned) cudaFreeHost(c->pinned);
    for (size_t i = 0; i < sizeof c->stage / sizeof c->stage[0]; i++) {
        if (c->stage[i].done) cudaEventDestroy(c->stage[i].done);
        if (c->stage[i].p) cudaFreeHost(c->stage[i].p);
    }
    if (c->side_fork) cudaEventDestroy(c->side_fork);
    if (c->side_join) cudaEventDestroy(c->side_join);
    if (c->side) cudaStreamDestroy(c->side);
    if (c->stream) cudaStreamDestroy(c->stream);
    memset(c, 0, sizeof *c);
}

// A context on `device`, which becomes the calling thread's current device: its streams, cuBLAS
// handle and workspace, the device's properties. The compute stream does not wait for the legacy
// default stream (nothing of ours uses it), so that contexts on one device run side by side.
static int ctx_open_locked(CudaCtx *c, int device) {
    memset(c, 0, sizeof *c);
    cudaDeviceProp prop;
    if (cudaSetDevice(device) != cudaSuccess || cudaGetDeviceProperties(&prop, device) != cudaSuccess ||
        cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking) != cudaSuccess ||
        cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS || cublasSetStream(c->blas, c->stream) != CUBLAS_STATUS_SUCCESS) {
        ctx_close(c);
        return mn_error(MN_ERR_UNSUPPORTED, "backend 'cuda': could not initialise device %d, a stream or cuBLAS", device);
    }
    if (cudaStreamCreateWithFlags(&c->side, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(&c->side_fork, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&c->side_join, cudaEventDisableTiming) != cudaSuccess) {
        ctx_close(c);
        return mn_error(MN_ERR_UNSUPPORTED, "backend 'cuda': could not create the side stream and its events");
    }
    // an explicit cuBLAS workspace (32 MiB, cuBLAS's own default on Hopper), so that products
    // recorded into a graph allocate nothing (set after the stream: cublasSetStream resets it)
    size_t ws_bytes = (size_t)32 << 20;
    if (cudaMalloc(&c->blas_ws, ws_bytes) != cudaSuccess ||
        cublasSetWorkspace(c->blas, c->blas_ws, ws_bytes) != CUBLAS_STATUS_SUCCESS) {
        ctx_close(c);
        return mn_error(MN_ERR_UNSUPPORTED, "backend 'cuda': could not set up the cuBLAS workspace");
    }
    c->device = device;
    c->sm_count = prop.multiProcessorCount;
    c->cc_major = prop.major;
    c->smem_optin = prop.sharedMemPerBlockOptin;
    return MN_OK;
}

static int ctx_open(CudaCtx *c, int device) {
    cuda_exclusive(1);
    int st = ctx_open_locked(c, device);
    cuda_exclusive(0);
    return st;
}

// The op table (every instance's: they differ by their context alone).
static void fill_table(Backend *bp, CudaCtx *c) {
    Backend b = {};
    b.name = "cuda";
    b.ctx = c;
    b.elem_size = g_elem_size;
    b.alloc = g_alloc;
    b.free = g_free;
    b.zero = g_zero;
    b.copy = g_copy;
    b.copy_rows = g_copy_rows;
    b.upload = g_upload;
    b.download = g_download;
    b.upload_f32 = g_upload_f32;
    b.download_f32 = g_download_f32;
    b.upload_i32 = g_upload_i32;
    b.download_i32 = g_download_i32;
    b.tally_i32 = g_tally_i32;
    b.sync = g_sync;
    b.device_mem_used = g_mem_used;
    b.mem_available = g_mem_available;
    b.linear_fwd = g_linear_fwd;
    b.linear_bwd = g_linear_bwd;
    b.linear_runs_fwd = g_linear_runs_fwd;
    b.linear_runs_bwd = g_linear_runs_bwd;
    b.rmsnorm_fwd = g_rmsnorm_fwd;
    b.rmsnorm_bwd = g_rmsnorm_bwd;
    b.l2norm_fwd = g_l2norm_fwd;
    b.l2norm_bwd = g_l2norm_bwd;
    b.layernorm_fwd = g_layernorm_fwd;
    b.layernorm_bwd = g_layernorm_bwd;
    b.silu_fwd = g_silu_fwd;
    b.softcap = g_softcap;
    b.silu_bwd = g_silu_bwd;
    b.gelu_fwd = g_gelu_fwd;
    b.gelu_bwd = g_gelu_bwd;
    b.pool_last_fwd = g_pool_last_fwd;
    b.pool_last_bwd = g_pool_last_bwd;
    b.swiglu_fwd = g_swiglu_fwd;
    b.swiglu_bwd = g_swiglu_bwd;
    b.sigmoid_gate_fwd = g_sigmoid_gate_fwd;
    b.sigmoid_gate_bwd = g_sigmoid_gate_bwd;
    b.geglu_fwd = g_geglu_fwd;
    b.geglu_bwd = g_geglu_bwd;
    b.gelu_tanh_fwd = g_gelu_tanh_fwd;
    b.gelu_tanh_bwd = g_gelu_tanh_bwd;
    b.geglu_tanh_fwd = g_geglu_tanh_fwd;
    b.geglu_tanh_bwd = g_geglu_tanh_bwd;
    b.bias_fwd = g_bias_fwd;
    b.bias_bwd = g_bias_bwd;
    b.headwise_fwd = g_headwise_fwd;
    b.headwise_bwd = g_headwise_bwd;
    b.scale_add_fwd = g_scale_add_fwd;
    b.scale_add_bwd = g_scale_add_bwd;
    b.add = g_add;
    b.conv_fwd = g_conv_fwd;
    b.conv_bwd = g_conv_bwd;
    b.embed_fwd = g_embed_fwd;
    b.embed_bwd = g_embed_bwd;
    b.xent = g_xent;
    b.gates_fwd = g_gates_fwd;
    b.gates_bwd = g_gates_bwd;
    b.scale_f32 = g_scale_f32;
    b.mesa = &cuda_mesa;
    b.lin = &cuda_lin;
    b.attn = &cuda_attn;
    b.mlstm = &cuda_mlstm;
    b.slstm = &cuda_slstm;
    b.scan = &cuda_scan;
    b.sum_f32 = g_sum_f32;
    b.sumsq = g_sumsq;
    b.adamw = g_adamw;
#ifdef MN_HAVE_NCCL
    b.group_id = cuda_group_id;
    b.group_join = cuda_group_join;
    b.allreduce = cuda_allreduce;
    b.allreduce_wait = cuda_allreduce_wait;
#endif
    b.graph_begin = g_graph_begin;
    b.graph_end = g_graph_end;
    b.graph_run = g_graph_run;
    b.graph_free = g_graph_free;
    *bp = b;
}

extern "C" const Backend *backend_cuda(void) {
    static CudaCtx ctx;
    if (initialised) return initialised > 0 ? &cuda_backend : NULL;
    initialised = -1;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        no_device(e);
        return NULL;
    }
    if (ctx_open(&ctx, 0)) return NULL;
    fill_table(&cuda_backend, &ctx);
    initialised = 1;
    return &cuda_backend;
}

extern "C" Backend *backend_cuda_open(int device) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        no_device(e);
        return NULL;
    }
    if (device < 0 || device >= n) {
        mn_error(MN_ERR_ARG, "backend 'cuda': device %d, this process sees %d (0 to %d)", device, n, n - 1);
        return NULL;
    }
    Backend *b = (Backend *)calloc(1, sizeof *b);
    CudaCtx *c = (CudaCtx *)calloc(1, sizeof *c);
    if (!b || !c) {
        free(b), free(c);
        mn_error(MN_ERR_NOMEM, "backend 'cuda': out of memory");
        return NULL;
    }
    if (ctx_open(c, device)) {
        free(b), free(c);
        return NULL;
    }
    fill_table(b, c);
    return b;
}

extern "C" void backend_cuda_close(Backend *b) {
    if (!b) return;
    CudaCtx *c = cuda_ctx(b);
    cudaSetDevice(c->device);
    cuda_exclusive(1);
    ctx_close(c);
    cuda_exclusive(0);
    free(c);
    free(b);
}
