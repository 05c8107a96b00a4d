/*
 * Shared pieces of the CUDA backend: error checks that become mn_error
 * messages, bf16 conversions, warp and block reductions, launch helpers.
 * Written in the C subset of CUDA (no templates, no classes).
 */
#ifndef MN_CUDA_COMMON_CUH
#define MN_CUDA_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "core/backend.h"
#include "core/common.h"
}

typedef __nv_bfloat16 bf16;

// Returns an error status from the enclosing function when a CUDA call fails.
#define CU_TRY(call)                                                                                       \
    do {                                                                                                   \
        cudaError_t e_ = (call);                                                                           \
        if (e_ != cudaSuccess)                                                                             \
            return mn_error(MN_ERR_UNSUPPORTED, "CUDA error %s at %s:%d: %s", cudaGetErrorName(e_), __FILE__, \
                            __LINE__, cudaGetErrorString(e_));                                             \
    } while (0)

#define CUBLAS_TRY(call)                                                                                  \
    do {                                                                                                  \
        cublasStatus_t s_ = (call);                                                                       \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                                  \
            return mn_error(MN_ERR_UNSUPPORTED, "cuBLAS error %d at %s:%d", (int)s_, __FILE__, __LINE__); \
    } while (0)

// After a kernel launch: catches launch errors (bad configuration) at once.
#define LAUNCH_CHECK() CU_TRY(cudaGetLastError())

typedef struct {
    cudaStream_t stream;
    cudaStream_t side;                  // a second compute stream: half of a Mesa call's (b, h) pairs run there
    cudaEvent_t side_fork, side_join;   // orders: stream -> side (fork); side -> stream (join)
    cublasHandle_t blas;
    int device;         // the device the context lives on (a thread using it has it current)
    int sm_count;
    int cc_major;       // compute capability (9: Hopper, where the sm_90a kernels run)
    size_t smem_optin;  // the most shared memory one block may ask for
    void *blas_ws;      // cuBLAS workspace (fixed, so that products can be recorded into graphs)
    void *scratch;      // device scratch, grow-only (cuda_scratch)
    void *pinned;       // page-locked host staging for bf16 downloads, grow-only
    size_t pinned_bytes;
    // Page-locked staging of small uploads (a batch's tokens, a step's scalars), so that they queue
    // without waiting: a ring of slots, each reused once the copy from it has run (its event).
    struct {
        void *p;
        size_t bytes;
        cudaEvent_t done;  // recorded after the copy from it (created on first use)
        int queued;        // done has been recorded
    } stage[8];
    int stage_next;
    size_t scratch_bytes;
    void *comm;         // the NCCL communicator of a data-parallel group (cuda_nccl.cu), or NULL
    cudaStream_t comm_stream;        // where its reductions run, beside the compute stream
    cudaEvent_t comm_after, comm_done;  // orders: compute -> a reduction; reductions -> compute
} CudaCtx;

CudaCtx *cuda_ctx(const Backend *be);
// Allocation and release of device and page-locked memory, for every caller in the backend. A
// release makes the device wait for its work (cudaFree synchronises), which would break a recording
// (graph_begin .. graph_end) in progress on another thread's stream: several instances record at
// once in one process (synth --parallel). So recordings and these calls exclude each other (a
// recording holds a lock shared, these exclusively), except on the recording thread itself.
cudaError_t cuda_malloc(void **p, size_t bytes);
cudaError_t cuda_free(void *p);
cudaError_t cuda_malloc_host(void **p, size_t bytes);
cudaError_t cuda_free_host(void *p);
// The same exclusion around other calls that may synchronise the device (a context's set-up and
// release, a recording's release): cuda_exclusive(1) before, cuda_exclusive(0) after.
void cuda_exclusive(int begin);
// The group ops of the backend table (cuda_nccl.cu; in builds with NCCL only).
int cuda_group_id(const Backend *be, void *id);
int cuda_group_join(const Backend *be, const void *id, int rank, int size);
int cuda_allreduce(const Backend *be, void *x, size_t n);
int cuda_allreduce_wait(const Backend *be);
// Device scratch of at least `bytes`, valid until the next call (stream-ordered).
void *cuda_scratch(const Backend *be, size_t bytes);
// The bf16 copy of a parameter (an element inside a MEM_PARAM allocation), or NULL.
const bf16 *cuda_param_bf16(const void *p);

// Programmatic dependent launch (Hopper on): a kernel launched by launch_after() may start while the
// kernel before it in its stream is still ending, so that its launch and first instructions overlap
// that kernel's last blocks. It must call grid_wait() before it touches memory that kernel (or any
// before it) writes or reads; grid_wait() returns at once in a kernel launched plainly. No kernel
// triggers its dependants before it ends (griddepcontrol.launch_dependents): their blocks then
// wait on multiprocessors the other stream's kernels need (docs/cuda.md).
__device__ __forceinline__ void grid_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

typedef struct {
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute attr;
} Launch;

// The configuration of such a launch (a plain one before Hopper), to pass to cudaLaunchKernelEx.
static inline const cudaLaunchConfig_t *launch_after(Launch *l, const CudaCtx *c, dim3 grid, unsigned block, size_t smem,
                                                     cudaStream_t stream) {
    l->attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    l->attr.val.programmaticStreamSerializationAllowed = 1;
    l->cfg.gridDim = grid;
    l->cfg.blockDim = dim3(block);
    l->cfg.dynamicSmemBytes = smem;
    l->cfg.stream = stream;
    l->cfg.attrs = &l->attr;
    l->cfg.numAttrs = c->cc_major >= 9 ? 1 : 0;
    return &l->cfg;
}

static inline unsigned grid_for(size_t n, unsigned block) {
    size_t g = (n + block - 1) / block;
    return (unsigned)(g < 65535u * 32u ? (g ? g : 1) : 65535u * 32u);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ __forceinline__ float block_sum(float v, float *shared32) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) shared32[warp] = v;
    __syncthreads();
    v = lane < nw ? shared32[lane] : 0.0f;
    return warp_sum(v);
}

__device__ __forceinline__ float ld(const bf16 *p, size_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void st(bf16 *p, size_t i, float v) { p[i] = __float2bfloat16(v); }
__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + __expf(-x)); }

#endif
