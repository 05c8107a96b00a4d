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
 */
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"

extern "C" int cuda_mesa_fwd(const Backend *be, const MnMesaDims *d, const MnSolver *s, const MnMesaFwd *io);
extern "C" int cuda_mesa_bwd(const Backend *be, const MnMesaDims *d, const MnSolver *s, const MnMesaBwd *io);
extern "C" int cuda_lin_fwd(const Backend *be, const MnMesaDims *d, const MnLinOpts *o, const MnLinFwd *io);
extern "C" int cuda_lin_bwd(const Backend *be, const MnMesaDims *d, const MnLinOpts *o, const MnLinBwd *io);
extern "C" int cuda_attn_fwd(const Backend *be, const AttnDims *d, const AttnFwd *io);
extern "C" int cuda_attn_bwd(const Backend *be, const AttnDims *d, const AttnBwd *io);
extern "C" int cuda_attn_decode(const Backend *be, const AttnDims *d, int n, int cap, const void *q, const void *kc,
                                const void *vc, void *o);
extern "C" int cuda_rope(const Backend *be, void *x, const void *pos, int N, int H, int D, float theta, int inverse);

// ---------------------------------------------------------------------------- memory

enum { MAX_PARAM_ALLOCS = 256 };
static struct {
    char *base;  // the float32 masters; the bf16 copy follows at base + shadow_offset(n)
    size_t n;
} param_allocs[MAX_PARAM_ALLOCS];

static size_t shadow_offset(size_t n) { return (n * sizeof(float) + 255) & ~(size_t)255; }

const bf16 *cuda_param_bf16(const void *p) {
    const char *c = (const char *)p;
    for (int i = 0; i < MAX_PARAM_ALLOCS; i++) {
        char *b = param_allocs[i].base;
        if (b && c >= b && c < b + param_allocs[i].n * sizeof(float))
            return (const bf16 *)(b + shadow_offset(param_allocs[i].n)) + (c - b) / sizeof(float);
    }
    return NULL;
}

static size_t elem(MemKind k) { return k == MEM_ACT ? 2 : 4; }

static size_t g_elem_size(const Backend *be, MemKind k) { return elem(k); }

static void *g_alloc(const Backend *be, size_t n, MemKind k) {
    size_t bytes = k == MEM_PARAM ? shadow_offset(n) + n * sizeof(bf16) : n * elem(k);
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 256);
    if (e != cudaSuccess) {
        mn_error(MN_ERR_NOMEM, "cudaMalloc of %zu bytes failed: %s", bytes, cudaGetErrorString(e));
        return NULL;
    }
    cudaMemsetAsync(p, 0, bytes ? bytes : 256, cuda_ctx(be)->stream);
    if (k == MEM_PARAM) {
        int slot = -1;
        for (int i = 0; i < MAX_PARAM_ALLOCS && slot < 0; i++)
            if (!param_allocs[i].base) slot = i;
        if (slot < 0) {
            cudaFree(p);
            mn_error(MN_ERR_NOMEM, "more than %d parameter allocations", MAX_PARAM_ALLOCS);
            return NULL;
        }
        param_allocs[slot].base = (char *)p;
        param_allocs[slot].n = n;
    }
    return p;
}

static void g_free(const Backend *be, void *p) {
    for (int i = 0; i < MAX_PARAM_ALLOCS; i++)
        if (param_allocs[i].base == p) param_allocs[i].base = NULL;
    cudaStreamSynchronize(cuda_ctx(be)->stream);
    cudaFree(p);
}

__global__ void f32_to_bf16_kernel(bf16 *dst, const float *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16(src[i]);
}

// Refreshes the bf16 copy of n parameters starting at p.
static int refresh_shadow(const Backend *be, const void *p, size_t n) {
    const bf16 *sh = cuda_param_bf16(p);
    if (!sh || !n) return MN_OK;
    f32_to_bf16_kernel<<<grid_for(n, 256), 256, 0, cuda_ctx(be)->stream>>>((bf16 *)sh, (const float *)p, n);
    LAUNCH_CHECK();
    return MN_OK;
}

static void g_zero(const Backend *be, void *p, size_t n, MemKind k) {
    cudaMemsetAsync(p, 0, n * elem(k), cuda_ctx(be)->stream);
    if (k == MEM_PARAM) refresh_shadow(be, p, n);
}

static void g_copy(const Backend *be, void *dst, const void *src, size_t n, MemKind k) {
    cudaMemcpyAsync(dst, src, n * elem(k), cudaMemcpyDeviceToDevice, cuda_ctx(be)->stream);
    if (k == MEM_PARAM) refresh_shadow(be, dst, n);
}
// One 2D copy for all rows (parameters, whose bf16 shadow follows each copy, row by row).
static void g_copy_rows(const Backend *be, void *dst, size_t ds, const void *src, size_t ss, size_t rows, size_t n,
                        MemKind k) {
    size_t e = elem(k);
    if (k == MEM_PARAM) {
        for (size_t r = 0; r < rows; r++) g_copy(be, (char *)dst + r * ds * e, (const char *)src + r * ss * e, n, k);
        return;
    }
    if (rows && n)
        cudaMemcpy2DAsync(dst, ds * e, src, ss * e, n * e, rows, cudaMemcpyDeviceToDevice, cuda_ctx(be)->stream);
}

// Host <-> device with conversion through a host staging buffer.
static int g_upload(const Backend *be, void *dst, const double *src, size_t n, MemKind k) {
    size_t bytes = n * elem(k);
    void *h = malloc(bytes ? bytes : 1);
    if (!h) return mn_error(MN_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        if (k == MEM_ACT) ((bf16 *)h)[i] = __float2bfloat16((float)src[i]);
        else ((float *)h)[i] = (float)src[i];
    }
    cudaError_t e = cudaMemcpy(dst, h, bytes, cudaMemcpyHostToDevice);
    free(h);
    CU_TRY(e);
    return k == MEM_PARAM ? refresh_shadow(be, dst, n) : MN_OK;
}

static int g_upload_f32(const Backend *be, void *dst, const float *src, size_t n, MemKind k) {
    if (k != MEM_ACT) {
        CU_TRY(cudaMemcpy(dst, src, n * sizeof(float), cudaMemcpyHostToDevice));
        return k == MEM_PARAM ? refresh_shadow(be, dst, n) : MN_OK;
    }
    bf16 *h = (bf16 *)malloc(n * sizeof(bf16) + 1);
    if (!h) return mn_error(MN_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) h[i] = __float2bfloat16(src[i]);
    cudaError_t e = cudaMemcpy(dst, h, n * sizeof(bf16), cudaMemcpyHostToDevice);
    free(h);
    CU_TRY(e);
    return MN_OK;
}

static int g_download_f32(const Backend *be, float *dst, const void *src, size_t n, MemKind k) {
    CU_TRY(cudaStreamSynchronize(cuda_ctx(be)->stream));
    if (k != MEM_ACT) {
        CU_TRY(cudaMemcpy(dst, src, n * sizeof(float), cudaMemcpyDeviceToHost));
        return MN_OK;
    }
    // through page-locked staging: a pageable copy goes through the driver's own staging at a
    // fraction of the speed, which showed when decoding many sequences (their logits every step)
    CudaCtx *c = cuda_ctx(be);
    size_t bytes = n * sizeof(bf16);
    if (bytes > c->pinned_bytes) {
        if (c->pinned) cudaFreeHost(c->pinned);
        c->pinned_bytes = 0;
        CU_TRY(cudaMallocHost(&c->pinned, bytes));
        c->pinned_bytes = bytes;
    }
    CU_TRY(cudaMemcpyAsync(c->pinned, src, bytes, cudaMemcpyDeviceToHost, c->stream));
    CU_TRY(cudaStreamSynchronize(c->stream));
    // bf16 is the top half of a float: a shift, over all cores (a step's logits for 128
    // sequences are 6.4M values, memory-bound on one core)
    const uint16_t *h = (const uint16_t *)c->pinned;
#pragma omp parallel for if (n > (1u << 16))
    for (long i = 0; i < (long)n; i++) {
        uint32_t b = (uint32_t)h[i] << 16;
        memcpy(&dst[i], &b, sizeof b);
    }
    return MN_OK;
}

static int g_download(const Backend *be, double *dst, const void *src, size_t n, MemKind k) {
    float *h = (float *)malloc(n * sizeof(float) + 1);
    if (!h) return mn_error(MN_ERR_NOMEM, "out of memory");
    int s = g_download_f32(be, h, src, n, k);
    for (size_t i = 0; i < n && !s; i++) dst[i] = h[i];
    free(h);
    return s;
}

static int g_upload_i32(const Backend *be, void *dst, const int32_t *src, size_t n) {
    CU_TRY(cudaMemcpyAsync(dst, src, n * sizeof(int32_t), cudaMemcpyHostToDevice, cuda_ctx(be)->stream));
    CU_TRY(cudaStreamSynchronize(cuda_ctx(be)->stream));  // src is pageable and may change right after
    return MN_OK;
}

static int g_download_i32(const Backend *be, int32_t *dst, const void *src, size_t n) {
    CU_TRY(cudaMemcpyAsync(dst, src, n * sizeof(int32_t), cudaMemcpyDeviceToHost, cuda_ctx(be)->stream));
    CU_TRY(cudaStreamSynchronize(cuda_ctx(be)->stream));
    return MN_OK;
}

__global__ void tally_i32_kernel(int32_t *sum, int32_t *count, const int32_t *x, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        sum[i] += x[i];
        count[i] += 1;
    }
}

static int g_tally_i32(const Backend *be, void *sum, void *count, const void *x, size_t n) {
    tally_i32_kernel<<<grid_for(n, 256), 256, 0, cuda_ctx(be)->stream>>>((int32_t *)sum, (int32_t *)count,
                                                                        (const int32_t *)x, n);
    LAUNCH_CHECK();
    return MN_OK;
}

static size_t g_mem_used(const Backend *be) {
    size_t free_b = 0, total = 0;
    if (cudaMemGetInfo(&free_b, &total) != cudaSuccess) return 0;
    return total - free_b;
}

// The device's free memory (cudaMemGetInfo); SIZE_MAX when it cannot be read.
static size_t g_mem_available(const Backend *be) {
    size_t free_b = 0, total = 0;
    if (cudaMemGetInfo(&free_b, &total) != cudaSuccess) return SIZE_MAX;
    return free_b;
}

static int g_sync(const Backend *be) {
    CU_TRY(cudaStreamSynchronize(cuda_ctx(be)->stream));
    if (cuda_ctx(be)->comm_stream) CU_TRY(cudaStreamSynchronize(cuda_ctx(be)->comm_stream));  // a group's sums
    CU_TRY(cudaGetLastError());
    return MN_OK;
}

// ------------------------------------------------------------- pieces, column sums

// Pieces of rows: a lane takes 8 contiguous bf16 at a time (one 16-byte load) where rows allow
// it (vec: a multiple of 8 long, 16-byte aligned), else 1: with 2-byte loads a lane's loads form
// a chain, and a decode step's norms (one row per sequence) were latency-bound on it (10 us for
// a row of 768).
__device__ __forceinline__ int piece_load(const bf16 *p, int vec, float v[8]) {
    if (!vec) {
        v[0] = __bfloat162float(*p);
        return 1;
    }
    uint4 u = *(const uint4 *)p;
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float2 f = __bfloat1622float2(h[k]);
        v[2 * k] = f.x;
        v[2 * k + 1] = f.y;
    }
    return 8;
}

// The float piece (a norm's weights) beside a bf16 piece: two 16-byte loads where vec (float rows
// of a multiple of 8, 16-byte aligned, as the parameter slab keeps them), else one value.
__device__ __forceinline__ void piece_load_f32(const float *p, int vec, float v[8]) {
    if (!vec) {
        v[0] = *p;
        return;
    }
    float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

__device__ __forceinline__ void piece_store(bf16 *p, int vec, const float v[8]) {
    if (!vec) {
        *p = __float2bfloat16(v[0]);
        return;
    }
    uint4 u;
    __nv_bfloat162 *h = (__nv_bfloat162 *)&u;
#pragma unroll
    for (int k = 0; k < 4; k++) h[k] = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
    *(uint4 *)p = u;
}

// Whether these addresses are 16-byte aligned (NULL is).
static int aligned16(const void *a, const void *b, const void *c, const void *d) {
    return (((uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d) % 16) == 0;
}

// Whether rows of n bf16 at these addresses can be read 8 at a time.
static int rows_vec(int n, const void *a, const void *b, const void *c, const void *d) {
    return n % 8 == 0 && aligned16(a, b, c, d);
}

// Column sums over many rows, added to out[L] (the gradients of biases and norm weights):
// out[c] += sum_r dy[r L + c] (times x[r L + c] rstd[(r L + c) / group] when x is given). A block
// takes a strip of rows and 32 pieces of columns (256 columns, or 32 without 16-byte pieces):
// lane l of warp w reads piece l of rows w, w + 8, .. (coalesced across the warp), the warps'
// sums meet in smem, and one atomic per column adds the block's sum. (A thread per column
// walking all rows, the first version, took 0.46 ms for the bias of a [16384, 6] product and
// 0.2 ms for a norm weight, with one load in flight per thread.)
#define COLSUM_WARPS 8

// The block's column sums out of the warps' partial sums acc (width columns a lane) through
// part: out[c stride] += the block's sum of column c, for the block's columns below L.
__device__ __forceinline__ void colsum_flush(float part[COLSUM_WARPS][256], const float acc[8], int width, int L,
                                             float *out, int stride) {
    int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, tile = 32 * width;
#pragma unroll
    for (int k = 0; k < 8; k++)
        if (k < width) part[wp][lane * width + k] = acc[k];
    __syncthreads();
    for (int i = threadIdx.x; i < tile; i += blockDim.x) {
        int c = blockIdx.x * tile + i;
        if (c >= L) continue;
        float sum = 0;
        for (int w = 0; w < COLSUM_WARPS; w++) sum += part[w][i];
        atomicAdd(&out[(size_t)c * stride], sum);
    }
}
__global__ void colsum_kernel(float *out, const bf16 *dy, const bf16 *x, const float *rstd, long rows, int L, int group,
                              long per_strip, int vec) {
    __shared__ float part[COLSUM_WARPS][256];
    int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, width = vec ? 8 : 1, tile = 32 * width;
    int c0 = blockIdx.x * tile + lane * width;
    long r0 = blockIdx.y * per_strip, r1 = min(rows, r0 + per_strip);
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (c0 < L)
        for (long r = r0 + wp; r < r1; r += COLSUM_WARPS) {
            size_t e = (size_t)r * L + c0;
            float a[8], b[8];
            piece_load(dy + e, vec, a);
            if (x) {
                piece_load(x + e, vec, b);
                float rs = rstd[e / group];
#pragma unroll
                for (int k = 0; k < 8; k++)
                    if (k < width) a[k] *= b[k] * rs;
            }
#pragma unroll
            for (int k = 0; k < 8; k++)
                if (k < width) acc[k] += a[k];
        }
    colsum_flush(part, acc, width, L, out, 1);
}

// The grid of a column-sum kernel: tiles of 32 pieces of columns by strips of rows (about 1024
// blocks, 64 rows a strip at least). Returns the rows per strip.
static long strip_rows(long rows, int cols, int vec, int *tiles, long *strips) {
    int tile = vec ? 256 : 32;
    if (rows < 1) rows = 1;  // (no rows: one empty strip, whose blocks add zeros)
    *tiles = (cols + tile - 1) / tile;
    long n = (rows + 63) / 64, cap = 1024 / *tiles > 1 ? 1024 / *tiles : 1;
    if (n > cap) n = cap;
    long per = (rows + n - 1) / n;
    *strips = (rows + per - 1) / per;
    return per;
}

static int colsum(const Backend *be, float *out, const bf16 *dy, const bf16 *x, const float *rstd, long rows, int L,
                  int group) {
    int vec = L % 8 == 0 && rows_vec(group, dy, x, x, x), tiles;
    long strips, per = strip_rows(rows, L, vec, &tiles, &strips);
    colsum_kernel<<<dim3((unsigned)tiles, (unsigned)strips), 32 * COLSUM_WARPS, 0, cuda_ctx(be)->stream>>>(
        out, dy, x, rstd, rows, L, group, per, vec);
    LAUNCH_CHECK();
    return MN_OK;
}

// ---------------------------------------------------------------------- dense layers

__global__ void add_bias_kernel(bf16 *y, const float *b, int N, int O) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)N * O; i += (size_t)gridDim.x * blockDim.x)
        st(y, i, ld(y, i) + b[i % O]);
}

// Row-major y[N,O] = x[N,I] W[O,I]^T is, in cuBLAS's column-major terms,
// y^T (O x N) = W (O x I, stored as I x O: transposed) times x^T (I x N).
static int g_linear_fwd(const Backend *be, void *y, const void *x, const void *w, const void *bias, int N, int nin,
                        int nout) {
    CudaCtx *c = cuda_ctx(be);
    const bf16 *wb = cuda_param_bf16(w);
    if (!wb) return mn_error(MN_ERR_ARG, "cuda linear: the weight is not a parameter allocation");
    float one = 1, zero = 0;
    CUBLAS_TRY(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, nout, N, nin, &one, wb, CUDA_R_16BF, nin, x, CUDA_R_16BF,
                            nin, &zero, y, CUDA_R_16BF, nout, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (bias) {
        add_bias_kernel<<<grid_for((size_t)N * nout, 256), 256, 0, c->stream>>>((bf16 *)y, (const float *)bias, N, nout);
        LAUNCH_CHECK();
    }
    return MN_OK;
}

static int g_linear_bwd(const Backend *be, void *dx, void *dw, void *dbias, const void *dy, const void *x, const void *w,
                        int N, int nin, int nout, int accum) {
    CudaCtx *c = cuda_ctx(be);
    const bf16 *wb = cuda_param_bf16(w);
    if (!wb) return mn_error(MN_ERR_ARG, "cuda linear: the weight is not a parameter allocation");
    float one = 1, beta_dx = accum ? 1.0f : 0.0f;
    if (dx)  // dx^T (I x N) = W^T (I x O, as stored) dy^T (O x N)
        CUBLAS_TRY(cublasGemmEx(c->blas, CUBLAS_OP_N, CUBLAS_OP_N, nin, N, nout, &one, wb, CUDA_R_16BF, nin, dy,
                                CUDA_R_16BF, nout, &beta_dx, dx, CUDA_R_16BF, nin, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (dw)  // dW^T (I x O) += x^T (I x N) dy (N x O), accumulated in float32
        CUBLAS_TRY(cublasGemmEx(c->blas, CUBLAS_OP_N, CUBLAS_OP_T, nin, nout, N, &one, x, CUDA_R_16BF, nin, dy,
                                CUDA_R_16BF, nout, &one, dw, CUDA_R_32F, nin, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (dbias) return colsum(be, (float *)dbias, (const bf16 *)dy, NULL, NULL, N, nout, 1);
    return MN_OK;
}

// ---------------------------------------------------------------- norms, activations

// The norms take a row (a group of `group` features) with `lanes` lanes of a warp: a power of two
// up to 32, enough for the row's pieces, so that short rows (a head's 128 features are 16 pieces)
// leave no lanes idle; a warp takes 32 / lanes rows. Lane `sub` of its row reads pieces sub, sub +
// lanes, ..; rows past the end (ok = 0) still take part in the shuffles.
typedef struct {
    long r;
    int sub, ok;
} NormRow;

static int norm_lanes(int group, int vec) {
    int pieces = vec ? group / 8 : group, lanes = 1;
    while (lanes < pieces && lanes < 32) lanes *= 2;
    return lanes;
}

static unsigned norm_grid(long rows, int lanes) {  // 256-thread blocks
    long per_block = 8L * (32 / lanes);
    return (unsigned)((rows + per_block - 1) / per_block);
}

__device__ __forceinline__ NormRow norm_row(long rows, int lanes) {
    int lane = threadIdx.x & 31;
    long r = ((long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * (32 / lanes) + lane / lanes;
    NormRow n = {r, lane % lanes, r < rows};
    return n;
}

// The sum over the lanes of each row (all lanes of the warp call it).
__device__ __forceinline__ float row_sum(float v, int lanes) {
    for (int o = lanes / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// RMS norm.
__global__ void rmsnorm_fwd_kernel(bf16 *y, float *rstd, const bf16 *x, const float *w, long rows, int group, int per_row,
                                   int wfull, float eps, int vec, int lanes) {
    NormRow nr = norm_row(rows, lanes);
    long r = nr.ok ? nr.r : 0;
    int width = vec ? 8 : 1, i0 = nr.ok ? nr.sub * width : group, step = lanes * width;
    const bf16 *xr = x + (size_t)r * group;
    const float *wr = w + (wfull ? (size_t)(r % per_row) * group : 0);
    float ss = 0, v[8], wv[8];
    for (int i = i0; i < group; i += step) {
        int n = piece_load(xr + i, vec, v);
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (k < n) ss += v[k] * v[k];
    }
    float rs = rsqrtf(row_sum(ss, lanes) / group + eps);
    if (nr.ok && nr.sub == 0) rstd[r] = rs;
    for (int i = i0; i < group; i += step) {
        int n = piece_load(xr + i, vec, v);
        piece_load_f32(wr + i, vec, wv);
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (k < n) v[k] *= rs * wv[k];
        piece_store(y + (size_t)r * group + i, vec, v);
    }
}

static int g_rmsnorm_fwd(const Backend *be, void *y, void *rstd, const void *x, const void *w, int N, int D, int group,
                         int wlen, float eps) {
    long rows = (long)N * (D / group);
    int vec = rows_vec(group, x, y, w, w), lanes = norm_lanes(group, vec);
    rmsnorm_fwd_kernel<<<norm_grid(rows, lanes), 256, 0, cuda_ctx(be)->stream>>>(
        (bf16 *)y, (float *)rstd, (const bf16 *)x, (const float *)w, rows, group, D / group, wlen != group, eps, vec, lanes);
    LAUNCH_CHECK();
    return MN_OK;
}

__global__ void rmsnorm_bwd_dx_kernel(bf16 *dx, const bf16 *dy, const bf16 *x, const float *w, const float *rstd,
                                      long rows, int group, int per_row, int wfull, int accum, int vec, int lanes) {
    NormRow nr = norm_row(rows, lanes);
    long r = nr.ok ? nr.r : 0;
    int width = vec ? 8 : 1, i0 = nr.ok ? nr.sub * width : group, step = lanes * width;
    size_t o = (size_t)r * group;
    const float *wr = w + (wfull ? (size_t)(r % per_row) * group : 0);
    float dot = 0, a[8], b[8], d[8], wv[8];
    for (int i = i0; i < group; i += step) {
        int n = piece_load(dy + o + i, vec, a);
        piece_load(x + o + i, vec, b);
        piece_load_f32(wr + i, vec, wv);
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (k < n) dot += a[k] * wv[k] * b[k];
    }
    dot = row_sum(dot, lanes);
    float rs = rstd[r], c = rs * rs * dot / group;
    for (int i = i0; i < group; i += step) {
        int n = piece_load(dy + o + i, vec, a);
        piece_load(x + o + i, vec, b);
        piece_load_f32(wr + i, vec, wv);
        if (accum) piece_load(dx + o + i, vec, d);
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (k < n) a[k] = (accum ? d[k] : 0.0f) + rs * (a[k] * wv[k] - b[k] * c);
        piece_store(dx + o + i, vec, a);
    }
}

// dw: column sums of dy x rstd over rows of wlen (a whole row of D, or one group when the weight is shared).
static int g_rmsnorm_bwd(const Backend *be, void *dx, void *dw, const void *dy, const void *x, const void *w,
                         const void *rstd, int N, int D, int group, int wlen, int accum) {
    long rows = (long)N * (D / group);
    int vec = rows_vec(group, dy, x, dx, w), lanes = norm_lanes(group, vec);
    rmsnorm_bwd_dx_kernel<<<norm_grid(rows, lanes), 256, 0, cuda_ctx(be)->stream>>>(
        (bf16 *)dx, (const bf16 *)dy, (const bf16 *)x, (const float *)w, (const float *)rstd, rows, group, D / group,
        wlen != group, accum, vec, lanes);
    LAUNCH_CHECK();
    if (dw)
        return colsum(be, (float *)dw, (const bf16 *)dy, (const bf16 *)x, (const float *)rstd, (long)N * (D / wlen), wlen,
                      group);
    return MN_OK;
}

__global__ void l2norm_fwd_kernel(bf16 *y, float *inv, const bf16 *x, long rows, int group, float eps, int vec,
                                  int lanes) {
    NormRow nr = norm_row(rows, lanes);
    long r = nr.ok ? nr.r : 0;
    int width = vec ? 8 : 1, i0 = nr.ok ? nr.sub * width : group, step = lanes * width;
    size_t o = (size_t)r * group;
    float ss = 0, v[8];
    for (int i = i0; i < group; i += step) {
        int n = piece_load(x + o + i, vec, v);
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (k < n) ss += v[k] * v[k];
    }
    float iv = rsqrtf(row_sum(ss, lanes) + eps);
    if (nr.ok && nr.sub == 0) inv[r] = iv;
    for (int i = i0; i < group; i += step) {
        int n = piece_load(x + o + i, vec, v);
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (k < n) v[k] *= iv;
        piece_store(y + o + i, vec, v);
    }
}

__global__ void l2norm_bwd_kernel(bf16 *dx, const bf16 *dy, const bf16 *y, const float *inv, long rows, int group,
                                  int vec, int lanes) {
    NormRow nr = norm_row(rows, lanes);
    long r = nr.ok ? nr.r : 0;
    int width = vec ? 8 : 1, i0 = nr.ok ? nr.sub * width : group, step = lanes * width;
    size_t o = (size_t)r * group;
    float dot = 0, a[8], b[8];
    for (int i = i0; i < group; i += step) {
        int n = piece_load(dy + o + i, vec, a);
        piece_load(y + o + i, vec, b);
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (k < n) dot += a[k] * b[k];
    }
    dot = row_sum(dot, lanes);
    for (int i = i0; i < group; i += step) {
        int n = piece_load(dy + o + i, vec, a);
        piece_load(y + o + i, vec, b);
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (k < n) a[k] = inv[r] * (a[k] - b[k] * dot);
        piece_store(dx + o + i, vec, a);
    }
}

static int g_l2norm_fwd(const Backend *be, void *y, void *inv, const void *x, int N, int D, int group, float eps) {
    long rows = (long)N * (D / group);
    int vec = rows_vec(group, x, y, y, y), lanes = norm_lanes(group, vec);
    l2norm_fwd_kernel<<<norm_grid(rows, lanes), 256, 0, cuda_ctx(be)->stream>>>((bf16 *)y, (float *)inv, (const bf16 *)x,
                                                                               rows, group, eps, vec, lanes);
    LAUNCH_CHECK();
    return MN_OK;
}

static int g_l2norm_bwd(const Backend *be, void *dx, const void *dy, const void *y, const void *inv, int N, int D,
                        int group) {
    long rows = (long)N * (D / group);
    int vec = rows_vec(group, dy, y, dx, dx), lanes = norm_lanes(group, vec);
    l2norm_bwd_kernel<<<norm_grid(rows, lanes), 256, 0, cuda_ctx(be)->stream>>>(
        (bf16 *)dx, (const bf16 *)dy, (const bf16 *)y, (const float *)inv, rows, group, vec, lanes);
    LAUNCH_CHECK();
    return MN_OK;
}

#define GRID_LOOP(i, n) for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

__global__ void softcap_kernel(bf16 *x, size_t n, float cap) {
    GRID_LOOP(i, n) st(x, i, cap * tanhf(ld(x, i) / cap));
}

static int g_softcap(const Backend *be, void *x, size_t n, float cap) {
    softcap_kernel<<<grid_for(n, 256), 256, 0, cuda_ctx(be)->stream>>>((bf16 *)x, n, cap);
    LAUNCH_CHECK();
    return MN_OK;
}

// Element-wise kernels: a thread takes 8 elements at a time, one 16-byte load or store per
// operand where the pointers allow it (vec), else (and at the tail) element by element.
#define PIECE_LOOP(i, n) \
    for (size_t i = 8 * (blockIdx.x * (size_t)blockDim.x + threadIdx.x); i < (n); i += 8 * (size_t)gridDim.x * blockDim.x)

__device__ __forceinline__ int piece_get(const bf16 *p, size_t i, size_t n, int vec, float v[8]) {
    int m = n - i < 8 ? (int)(n - i) : 8;
    if (vec && m == 8) return piece_load(p + i, 1, v);
#pragma unroll
    for (int k = 0; k < 8; k++) v[k] = k < m ? __bfloat162float(p[i + k]) : 0.0f;
    return m;
}

__device__ __forceinline__ void piece_put(bf16 *p, size_t i, int m, int vec, const float v[8]) {
    if (vec && m == 8) {
        piece_store(p + i, 1, v);
        return;
    }
    for (int k = 0; k < m; k++) p[i + k] = __float2bfloat16(v[k]);
}

static unsigned piece_grid(size_t n) { return grid_for((n + 7) / 8, 256); }

__global__ void silu_fwd_kernel(bf16 *y, const bf16 *x, size_t n, int vec) {
    PIECE_LOOP(i, n) {
        float v[8];
        int m = piece_get(x, i, n, vec, v);
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] *= sigmoidf_(v[k]);
        piece_put(y, i, m, vec, v);
    }
}

// The two-input element-wise ops: out = f(a, b).
enum { BIN_ADD, BIN_SILU_BWD, BIN_SWIGLU };

__device__ __forceinline__ float binary_op(int op, float a, float b) {
    if (op == BIN_ADD) return a + b;
    if (op == BIN_SWIGLU) return a * sigmoidf_(a) * b;  // a = g, b = u
    float s = sigmoidf_(b);                              // SiLU's backward: a = dy, b = x
    return a * s * (1 + b * (1 - s));
}

__global__ void binary_kernel(bf16 *out, const bf16 *a, const bf16 *b, size_t n, int vec, int op) {
    PIECE_LOOP(i, n) {
        float u[8], w[8];
        int m = piece_get(a, i, n, vec, u);
        piece_get(b, i, n, vec, w);
#pragma unroll
        for (int k = 0; k < 8; k++) u[k] = binary_op(op, u[k], w[k]);
        piece_put(out, i, m, vec, u);
    }
}

static int binary(const Backend *be, void *out, const void *a, const void *b, size_t n, int op) {
    binary_kernel<<<piece_grid(n), 256, 0, cuda_ctx(be)->stream>>>((bf16 *)out, (const bf16 *)a, (const bf16 *)b, n,
                                                                   aligned16(out, a, b, b), op);
    LAUNCH_CHECK();
    return MN_OK;
}

__global__ void swiglu_bwd_kernel(bf16 *dg, bf16 *du, const bf16 *dh, const bf16 *g, const bf16 *u, size_t n, int vec) {
    PIECE_LOOP(i, n) {
        float d[8], v[8], w[8], a[8], b[8];
        int m = piece_get(dh, i, n, vec, d);
        piece_get(g, i, n, vec, v);
        piece_get(u, i, n, vec, w);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            float s = sigmoidf_(v[k]);
            a[k] = d[k] * w[k] * s * (1 + v[k] * (1 - s));
            b[k] = d[k] * v[k] * s;
        }
        piece_put(dg, i, m, vec, a);
        piece_put(du, i, m, vec, b);
    }
}

// Exact GELU (erff, as torch's nn.GELU()) and its derivative Phi(x) + x phi(x).
__device__ __forceinline__ float gelu_(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }
__device__ __forceinline__ float gelu_grad_(float x) {
    return 0.5f * (1.0f + erff(x * 0.70710678118654752f)) + x * expf(-0.5f * x * x) * 0.39894228040143268f;
}

__global__ void gelu_kernel(bf16 *y, const bf16 *x, const bf16 *dy, size_t n, int vec) {  // dy: the backward
    PIECE_LOOP(i, n) {
        float v[8], d[8] = {0};
        int m = piece_get(x, i, n, vec, v);
        if (dy) piece_get(dy, i, n, vec, d);
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = dy ? d[k] * gelu_grad_(v[k]) : gelu_(v[k]);
        piece_put(y, i, m, vec, v);
    }
}

static int g_gelu_fwd(const Backend *be, void *y, const void *x, size_t n) {
    gelu_kernel<<<piece_grid(n), 256, 0, cuda_ctx(be)->stream>>>((bf16 *)y, (const bf16 *)x, NULL, n,
                                                                  aligned16(y, x, x, x));
    LAUNCH_CHECK();
    return MN_OK;
}
static int g_gelu_bwd(const Backend *be, void *dx, const void *dy, const void *x, size_t n) {
    gelu_kernel<<<piece_grid(n), 256, 0, cuda_ctx(be)->stream>>>((bf16 *)dx, (const bf16 *)x, (const bf16 *)dy, n,
                                                                  aligned16(dx, x, dy, dy));
    LAUNCH_CHECK();
    return MN_OK;
}

// The autoencoder head's pooling (backend.h): z[b,t,:] = x[b,T-1,:] + pe[t,:] (pe in double, as mn_posemb),
// and its backward, a thread per element of dx (those at t = T-1 sum their column of dz in float).
__global__ void pool_last_fwd_kernel(bf16 *z, const bf16 *x, int B, int T, int D) {
    size_t n = (size_t)B * T * D;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(e % D), t = (int)(e / D % T);
        size_t b = e / ((size_t)D * T);
        int h = D / 2, j = i < h ? i : i - h;
        double a = (double)t * exp(-(double)j * log(10000.0) / (double)(h - 1));
        double pe = i >= 2 * h ? 0.0 : i < h ? sin(a) : cos(a);
        z[e] = __float2bfloat16(ld(x, (b * T + T - 1) * D + i) + (float)pe);
    }
}

__global__ void pool_last_bwd_kernel(bf16 *dx, const bf16 *dz, int B, int T, int D) {
    size_t n = (size_t)B * T * D;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(e % D), t = (int)(e / D % T);
        size_t b = e / ((size_t)D * T);
        float s = 0;
        if (t == T - 1)
            for (int u = 0; u < T; u++) s += ld(dz, (b * T + u) * D + i);
        dx[e] = __float2bfloat16(s);
    }
}

static int g_pool_last_fwd(const Backend *be, void *z, const void *x, int B, int T, int D) {
    pool_last_fwd_kernel<<<grid_for((size_t)B * T * D, 256), 256, 0, cuda_ctx(be)->stream>>>((bf16 *)z, (const bf16 *)x,
                                                                                            B, T, D);
    LAUNCH_CHECK();
    return MN_OK;
}
static int g_pool_last_bwd(const Backend *be, void *dx, const void *dz, int B, int T, int D) {
    pool_last_bwd_kernel<<<grid_for((size_t)B * T * D, 256), 256, 0, cuda_ctx(be)->stream>>>((bf16 *)dx,
                                                                                            (const bf16 *)dz, B, T, D);
    LAUNCH_CHECK();
    return MN_OK;
}

static int g_silu_fwd(const Backend *be, void *y, const void *x, size_t n) {
    silu_fwd_kernel<<<piece_grid(n), 256, 0, cuda_ctx(be)->stream>>>((bf16 *)y, (const bf16 *)x, n, aligned16(y, x, x, x));
    LAUNCH_CHECK();
    return MN_OK;
}
static int g_silu_bwd(const Backend *be, void *dx, const void *dy, const void *x, size_t n) {
    return binary(be, dx, dy, x, n, BIN_SILU_BWD);
}
static int g_swiglu_fwd(const Backend *be, void *h, const void *g, const void *u, size_t n) {
    return binary(be, h, g, u, n, BIN_SWIGLU);
}
static int g_swiglu_bwd(const Backend *be, void *dg, void *du, const void *dh, const void *g, const void *u, size_t n) {
    swiglu_bwd_kernel<<<piece_grid(n), 256, 0, cuda_ctx(be)->stream>>>(
        (bf16 *)dg, (bf16 *)du, (const bf16 *)dh, (const bf16 *)g, (const bf16 *)u, n,
        aligned16(dg, du, dh, g) && aligned16(u, u, u, u));
    LAUNCH_CHECK();
    return MN_OK;
}
static int g_add(const Backend *be, void *x, const void *y, size_t n) { return binary(be, x, x, y, n, BIN_ADD); }

// ------------------------------------------------------------------- sequence ops

// The causal depthwise convolution reads channels in pieces of 8 (one 16-byte load) where C and
// the pointers allow it (vec), else one by one. Its input at t < 0 is the state (or zero).
__device__ __forceinline__ float conv_in(const bf16 *x, const bf16 *state, int b, int t, int c, int T, int C, int K) {
    if (t >= 0) return ld(x, ((size_t)b * T + t) * C + c);
    return state ? ld(state, ((size_t)b * (K - 1) + (t + K - 1)) * C + c) : 0.0f;
}

// The piece of x at (b, t, c): the state before t = 0 (or zero), zero from t = T on.
__device__ __forceinline__ void conv_piece(float v[8], const bf16 *x, const bf16 *state, int b, int t, int c, int T,
                                           int C, int K, int vec) {
    if (t >= 0 && t < T) {
        piece_load(x + ((size_t)b * T + t) * C + c, vec, v);
    } else if (t < 0 && state) {
        piece_load(state + ((size_t)b * (K - 1) + (t + K - 1)) * C + c, vec, v);
    } else {
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = 0;
    }
}

// A window of the last `taps` pieces (a constant), win[taps - 1] the newest. conv_window_fill
// sets it as before a shift at t: win[q] = the piece at t + dir (q - taps) for q >= 1 (zero where
// the taps of a width-K kernel never read it); conv_window_push shifts in the piece at t.
__device__ __forceinline__ void conv_window_fill(float (*win)[8], const bf16 *x, const bf16 *state, int b, int t, int dir,
                                                 int c, int T, int C, int K, int vec, const int taps) {
#pragma unroll
    for (int q = 1; q < taps; q++) {
        if (q >= taps + 1 - K) conv_piece(win[q], x, state, b, t + dir * (q - taps), c, T, C, K, vec);
        else
#pragma unroll
            for (int k = 0; k < 8; k++) win[q][k] = 0;
    }
}

__device__ __forceinline__ void conv_window_push(float (*win)[8], const bf16 *x, const bf16 *state, int b, int t, int c,
                                                 int T, int C, int K, int vec, const int taps) {
#pragma unroll
    for (int q = 0; q < taps - 1; q++)
#pragma unroll
        for (int k = 0; k < 8; k++) win[q][k] = win[q + 1][k];
    conv_piece(win[taps - 1], x, state, b, t, c, T, C, K, vec);
}

// A thread takes a piece of channels over CONV_TT time steps: it reads its weights once and
// keeps a window of its last `taps` input pieces in registers, so every input is read once (a
// thread per output piece read the K inputs and 8 K scattered weights each time: 2x slower than
// one channel at a time). Window and weights are `taps` wide (a constant: 4, or 8 for K > 4;
// 8 everywhere took 189 registers a thread), right-aligned, zero beyond K, so that registers are
// indexed by constants.
#define CONV_TT 16

// One step at t: the window shifts in the piece at t, the output piece goes out.
__device__ __forceinline__ void conv_step(bf16 *out, const bf16 *in, const bf16 *sin, const float (*wt)[8], float (*win)[8],
                                          int b, int t, int c, int T, int C, int K, int vec, const int taps) {
    conv_window_push(win, in, sin, b, t, c, T, C, K, vec, taps);
    float y[8];
#pragma unroll
    for (int k = 0; k < 8; k++) {
        y[k] = 0;
#pragma unroll
        for (int q = 0; q < taps; q++) y[k] += wt[q][k] * win[q][k];
    }
    piece_store(out + ((size_t)b * T + t) * C + c, vec, y);
}

// The forward, y[b, t, c] = sum_j w[c, j] x[b, t - K + 1 + j, c], walks t upwards with the window
// holding x at t - taps + 1 .. t. With rev, the input gradient dx[b, t, c] = sum_j w[c, j] dy[b, t +
// K - 1 - j, c] is the same sum walked downwards (the window holds dy at t + taps - 1 .. t, zero
// past T).
__device__ __forceinline__ void conv_run(bf16 *out, const bf16 *in, const float *w, int B, int T, int C, int K,
                                         const bf16 *sin, int vec, int rev, const int taps) {
    int width = vec ? 8 : 1, cp = C / width, tb = (T + CONV_TT - 1) / CONV_TT, dir = rev ? -1 : 1;
    GRID_LOOP(i, (size_t)B * tb * cp) {
        size_t r = i / cp;
        int c = (int)(i % cp) * width, t0 = (int)(r % tb) * CONV_TT, b = (int)(r / tb), t1 = min(T, t0 + CONV_TT);
        int ts = rev ? t1 - 1 : t0, n = t1 - t0;  // the first step, and the steps
        float wt[8][8], win[8][8];  // [taps][8] used
#pragma unroll
        for (int q = 0; q < taps; q++)  // wt[q][k] = w[c + k, q - (taps - K)], zero for q < taps - K
#pragma unroll
            for (int k = 0; k < 8; k++) {
                int j = q - (taps - K);
                wt[q][k] = k < width && j >= 0 ? w[(c + k) * K + j] : 0.0f;
            }
        conv_window_fill(win, in, sin, b, ts, dir, c, T, C, K, vec, taps);
        if (n == CONV_TT) {  // unrolled, so that the loads of all steps are in flight together
#pragma unroll
            for (int s = 0; s < CONV_TT; s++) conv_step(out, in, sin, wt, win, b, ts + dir * s, c, T, C, K, vec, taps);
        } else {
            for (int s = 0; s < n; s++) conv_step(out, in, sin, wt, win, b, ts + dir * s, c, T, C, K, vec, taps);
        }
    }
}

__global__ void conv_kernel4(bf16 *out, const bf16 *in, const float *w, int B, int T, int C, int K, const bf16 *sin,
                             int vec, int rev) {
    conv_run(out, in, w, B, T, C, K, sin, vec, rev, 4);
}

__global__ void conv_kernel8(bf16 *out, const bf16 *in, const float *w, int B, int T, int C, int K, const bf16 *sin,
                             int vec, int rev) {
    conv_run(out, in, w, B, T, C, K, sin, vec, rev, 8);
}

// conv_run over [B, T, C] with K <= 8 taps (forward, or with rev the input gradient).
static int conv_launch(cudaStream_t st, bf16 *out, const bf16 *in, const float *w, int B, int T, int C, int K,
                       const bf16 *sin, int vec, int rev) {
    unsigned grid = grid_for((size_t)B * ((T + CONV_TT - 1) / CONV_TT) * (C / (vec ? 8 : 1)), 256);
    if (K <= 4) conv_kernel4<<<grid, 256, 0, st>>>(out, in, w, B, T, C, K, sin, vec, rev);
    else conv_kernel8<<<grid, 256, 0, st>>>(out, in, w, B, T, C, K, sin, vec, rev);
    LAUNCH_CHECK();
    return MN_OK;
}

__global__ void conv_state_kernel(bf16 *tmp, const bf16 *x, int B, int T, int C, int K, const bf16 *sin) {
    GRID_LOOP(i, (size_t)B * (K - 1) * C) {
        int c = (int)(i % C), j = (int)((i / C) % (K - 1)), b = (int)(i / ((size_t)C * (K - 1)));
        st(tmp, i, conv_in(x, sin, b, T - (K - 1) + j, c, T, C, K));
    }
}


static int g_conv_fwd(const Backend *be, void *y, const void *x, const void *w, int B, int T, int C, int K,
                      const void *sin, void *sout) {
    CudaCtx *cx = cuda_ctx(be);
    if (K > 8) return mn_error(MN_ERR_ARG, "cuda conv: kernel width %d, at most 8", K);
    int vec = rows_vec(C, y, x, sin, sin);
    MN_TRY(conv_launch(cx->stream, (bf16 *)y, (const bf16 *)x, (const float *)w, B, T, C, K, (const bf16 *)sin, vec, 0));
    if (sout && K > 1) {  // via scratch: state_out may alias state_in
        size_t ns = (size_t)B * (K - 1) * C;
        bf16 *tmp = (bf16 *)cuda_scratch(be, ns * sizeof(bf16));
        if (!tmp) return MN_ERR_NOMEM;
        conv_state_kernel<<<grid_for(ns, 256), 256, 0, cx->stream>>>(tmp, (const bf16 *)x, B, T, C, K, (const bf16 *)sin);
        LAUNCH_CHECK();
        CU_TRY(cudaMemcpyAsync(sout, tmp, ns * sizeof(bf16), cudaMemcpyDeviceToDevice, cx->stream));
    }
    return MN_OK;
}

// dw[c, j] = sum over (b, t) of dy[b, t, c] x[b, t - K + 1 + j, c]: column sums (colsum_kernel's
// strips and tiles) of K products per row. Each warp walks its own run of consecutive rows with a
// window of the last `taps` x pieces (as conv_run), so that a row costs one new x piece, not K;
// the window is refilled where a run or a sequence starts. acc[q] gathers tap q - (taps - K).
__device__ __forceinline__ void conv_dw_run(float *dw, const bf16 *dy, const bf16 *x, int B, int T, int C, int K,
                                            const bf16 *sin, long per_strip, int vec, const int taps) {
    __shared__ float part[COLSUM_WARPS][256];
    int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, width = vec ? 8 : 1, tile = 32 * width;
    int c0 = blockIdx.x * tile + lane * width;
    long r0 = blockIdx.y * per_strip, r1 = min((long)B * T, r0 + per_strip);
    long span = (per_strip + COLSUM_WARPS - 1) / COLSUM_WARPS, w0 = r0 + wp * span, w1 = min(r1, w0 + span);
    float acc[8][8], win[8][8];  // [taps][8] used
#pragma unroll
    for (int q = 0; q < taps; q++)
#pragma unroll
        for (int k = 0; k < 8; k++) acc[q][k] = 0;
    if (c0 < C)
        for (long r = w0; r < w1; r++) {
            int b = (int)(r / T), t = (int)(r % T);
            if (r == w0 || t == 0) conv_window_fill(win, x, sin, b, t, 1, c0, T, C, K, vec, taps);
            conv_window_push(win, x, sin, b, t, c0, T, C, K, vec, taps);
            float g[8];
            piece_load(dy + (size_t)r * C + c0, vec, g);
#pragma unroll
            for (int q = 0; q < taps; q++)
#pragma unroll
                for (int k = 0; k < 8; k++) acc[q][k] += g[k] * win[q][k];
        }
#pragma unroll
    for (int q = 0; q < taps; q++) {
        int j = q - (taps - K);
        if (j < 0) continue;
        colsum_flush(part, acc[q], width, C, dw + j, K);
        __syncthreads();  // part is reused
    }
}

__global__ void conv_bwd_dw_kernel4(float *dw, const bf16 *dy, const bf16 *x, int B, int T, int C, int K, const bf16 *sin,
                                    long per_strip, int vec) {
    conv_dw_run(dw, dy, x, B, T, C, K, sin, per_strip, vec, 4);
}

__global__ void conv_bwd_dw_kernel8(float *dw, const bf16 *dy, const bf16 *x, int B, int T, int C, int K, const bf16 *sin,
                                    long per_strip, int vec) {
    conv_dw_run(dw, dy, x, B, T, C, K, sin, per_strip, vec, 8);
}

static int g_conv_bwd(const Backend *be, void *dx, void *dw, const void *dy, const void *x, const void *w, int B, int T,
                      int C, int K, const void *sin) {
    if (K > 8) return mn_error(MN_ERR_ARG, "cuda conv: kernel width %d, at most 8", K);
    cudaStream_t s = cuda_ctx(be)->stream;
    int vec = rows_vec(C, dx, dy, x, sin);
    MN_TRY(conv_launch(s, (bf16 *)dx, (const bf16 *)dy, (const float *)w, B, T, C, K, NULL, vec, 1));
    int tiles;
    long strips, per = strip_rows((long)B * T, C, vec, &tiles, &strips);
    dim3 grid((unsigned)tiles, (unsigned)strips);
    if (K <= 4)
        conv_bwd_dw_kernel4<<<grid, 32 * COLSUM_WARPS, 0, s>>>((float *)dw, (const bf16 *)dy, (const bf16 *)x, B, T, C, K,
                                                               (const bf16 *)sin, per, vec);
    else
        conv_bwd_dw_kernel8<<<grid, 32 * COLSUM_WARPS, 0, s>>>((float *)dw, (const bf16 *)dy, (const bf16 *)x, B, T, C, K,
                                                               (const bf16 *)sin, per, vec);
    LAUNCH_CHECK();
    return MN_OK;
}

__global__ void embed_fwd_kernel(bf16 *x, const int32_t *tok, const float *e, int N, int D, float scale) {
    GRID_LOOP(i, (size_t)N * D) st(x, i, scale * e[(size_t)tok[i / D] * D + i % D]);
}

__global__ void embed_bwd_kernel(float *de, const bf16 *dx, const int32_t *tok, int N, int D, float scale) {
    GRID_LOOP(i, (size_t)N * D) atomicAdd(&de[(size_t)tok[i / D] * D + i % D], scale * ld(dx, i));
}

static int g_embed_fwd(const Backend *be, void *x, const void *tok, const void *e, int N, int D, float scale) {
    embed_fwd_kernel<<<grid_for((size_t)N * D, 256), 256, 0, cuda_ctx(be)->stream>>>(
        (bf16 *)x, (const int32_t *)tok, (const float *)e, N, D, scale);
    LAUNCH_CHECK();
    return MN_OK;
}

static int g_embed_bwd(const Backend *be, void *de, const void *dx, const void *tok, int N, int D, float scale) {
    embed_bwd_kernel<<<grid_for((size_t)N * D, 256), 256, 0, cuda_ctx(be)->stream>>>(
        (float *)de, (const bf16 *)dx, (const int32_t *)tok, N, D, scale);
    LAUNCH_CHECK();
    return MN_OK;
}

// (m, s) <- the log-sum-exp pair of the union of two sets, each held as its
// maximum m and sum of e^{v - m} (m = -inf: empty).
__device__ __forceinline__ void lse_merge(float *m, float *s, float m2, float s2) {
    float M = fmaxf(*m, m2);
    if (M == -INFINITY) return;
    *s = *s * expf(*m - M) + s2 * expf(m2 - M);
    *m = M;
}

__device__ __forceinline__ float soft_cap(float v, float cap) { return cap > 0 ? cap * tanhf(v / cap) : v; }

// One block per row: soft cap, log-sum-exp, loss, and the gradient in place, in two passes
// over the row: the log-sum-exp online (a running maximum rescales the running sum), then
// the gradient (the row, 100 KB at GPT-2's vocabulary, is still in L2). Rows are read in
// 16-byte pieces where they allow it. (Three passes of 2-byte loads took 5.2 ms for 16384 x
// 50304 logits on an H100.)
__global__ void xent_kernel(bf16 *logits, float *losses, const int32_t *targets, int V, float cap, float grad_scale,
                            int vec) {
    __shared__ float red_m[32], red_s[32];
    __shared__ float zt;
    int n = blockIdx.x, tgt = targets[n], width = vec ? 8 : 1, lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
    bf16 *z = logits + (size_t)n * V;
    if (tgt < 0) {
        if (threadIdx.x == 0) losses[n] = 0;
        if (grad_scale != 0)
            for (int i = threadIdx.x; i < V; i += blockDim.x) st(z, i, 0);
        return;
    }
    float mx = -INFINITY, sum = 0, v[8];
    for (int i = threadIdx.x * width; i < V; i += blockDim.x * width) {
        int w = piece_load(z + i, vec, v);
        float pm = -INFINITY;
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (k < w) {
                v[k] = soft_cap(v[k], cap);
                pm = fmaxf(pm, v[k]);
                if (i + k == tgt) zt = v[k];
            }
        if (pm > mx) {
            sum *= expf(mx - pm);
            mx = pm;
        }
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (k < w) sum += expf(v[k] - mx);
    }
    for (int o = 16; o > 0; o >>= 1) lse_merge(&mx, &sum, __shfl_xor_sync(0xffffffffu, mx, o), __shfl_xor_sync(0xffffffffu, sum, o));
    if (lane == 0) {
        red_m[wp] = mx;
        red_s[wp] = sum;
    }
    __syncthreads();  // (also publishes zt)
    mx = -INFINITY;
    sum = 0;
    for (int w = 0; w < (int)blockDim.x / 32; w++) lse_merge(&mx, &sum, red_m[w], red_s[w]);
    float lse = mx + logf(sum);
    if (threadIdx.x == 0) losses[n] = lse - zt;
    for (int i = threadIdx.x * width; i < V; i += blockDim.x * width) {
        int w = piece_load(z + i, vec, v);
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (k < w) {
                float c = soft_cap(v[k], cap);
                if (grad_scale != 0) {
                    float d = expf(c - lse) - (i + k == tgt), dcap = cap > 0 ? 1 - (c / cap) * (c / cap) : 1.0f;
                    v[k] = grad_scale * d * dcap;
                } else {
                    v[k] = c;  // leave the capped logits, as the other backends do
                }
            }
        piece_store(z + i, vec, v);
    }
}

static int g_xent(const Backend *be, void *logits, void *losses, const void *targets, int N, int V, float cap,
                  float grad_scale) {
    xent_kernel<<<(unsigned)N, 256, 0, cuda_ctx(be)->stream>>>((bf16 *)logits, (float *)losses, (const int32_t *)targets,
                                                               V, cap, grad_scale, rows_vec(V, logits, logits, logits, logits));
    LAUNCH_CHECK();
    return MN_OK;
}

// -------------------------------------------------------------------- Mesa gates

__device__ __forceinline__ float log_sigmoid(float a) { return a >= 0 ? -log1pf(expf(-a)) : a - log1pf(expf(a)); }

__global__ void gates_fwd_kernel(float *g, float *beta, const bf16 *a, const bf16 *b, size_t n, float hmax) {
    GRID_LOOP(i, n) {
        float bt = 1.0f / (1.0f + expf(-ld(b, i))), gi = log_sigmoid(ld(a, i));
        if (hmax > 0) gi = fminf(gi, log1pf(-bt / hmax));
        beta[i] = bt;
        g[i] = gi;
    }
}

__global__ void gates_bwd_kernel(bf16 *da, bf16 *db, const float *dg, const float *dbeta, const bf16 *a, const bf16 *b,
                                 size_t n, float hmax) {
    GRID_LOOP(i, n) {
        float av = ld(a, i), bt = 1.0f / (1.0f + expf(-ld(b, i))), dbt = dbeta[i];
        int bounded = hmax > 0 && log1pf(-bt / hmax) < log_sigmoid(av);
        st(da, i, bounded ? 0.0f : dg[i] / (1.0f + expf(av)));
        if (bounded) dbt += dg[i] * (-1 / hmax) / (1 - bt / hmax);
        st(db, i, dbt * bt * (1 - bt));
    }
}

static int g_gates_fwd(const Backend *be, void *g, void *beta, const void *a, const void *b, size_t n, float hmax) {
    gates_fwd_kernel<<<grid_for(n, 256), 256, 0, cuda_ctx(be)->stream>>>((float *)g, (float *)beta, (const bf16 *)a,
                                                                         (const bf16 *)b, n, hmax);
    LAUNCH_CHECK();
    return MN_OK;
}

static int g_gates_bwd(const Backend *be, void *da, void *db, const void *dg, const void *dbeta, const void *a,
                       const void *b, size_t n, float hmax) {
    gates_bwd_kernel<<<grid_for(n, 256), 256, 0, cuda_ctx(be)->stream>>>(
        (bf16 *)da, (bf16 *)db, (const float *)dg, (const float *)dbeta, (const bf16 *)a, (const bf16 *)b, n, hmax);
    LAUNCH_CHECK();
    return MN_OK;
}

__global__ void scale_f32_kernel(float *x, size_t n, float s) {
    GRID_LOOP(i, n) x[i] *= s;
}

static int g_scale_f32(const Backend *be, void *x, size_t n, float s) {
    scale_f32_kernel<<<grid_for(n, 256), 256, 0, cuda_ctx(be)->stream>>>((float *)x, n, s);
    LAUNCH_CHECK();
    return MN_OK;
}

__global__ void softplus_fwd_kernel(float *y, const float *p, size_t n, float lo) {
    GRID_LOOP(i, n) y[i] = (p[i] > 30 ? p[i] : log1pf(expf(p[i]))) + lo;
}

__global__ void softplus_bwd_kernel(float *dp, const float *dy, const float *p, size_t n) {
    GRID_LOOP(i, n) dp[i] += dy[i] / (1.0f + expf(-p[i]));
}

static int g_softplus_fwd(const Backend *be, void *y, const void *p, size_t n, float lo) {
    softplus_fwd_kernel<<<grid_for(n, 256), 256, 0, cuda_ctx(be)->stream>>>((float *)y, (const float *)p, n, lo);
    LAUNCH_CHECK();
    return MN_OK;
}

static int g_softplus_bwd(const Backend *be, void *dp, const void *dy, const void *p, size_t n) {
    softplus_bwd_kernel<<<grid_for(n, 256), 256, 0, cuda_ctx(be)->stream>>>((float *)dp, (const float *)dy,
                                                                            (const float *)p, n);
    LAUNCH_CHECK();
    return MN_OK;
}

// ------------------------------------------------------------------------ the Gated DeltaNet paper's gate

__device__ __forceinline__ float softplus_(float z) { return z > 30 ? z : log1pf(expf(z)); }

__global__ void gdn_gate_fwd_kernel(float *g, const bf16 *a, const float *A_log, const float *dt, size_t n, int H) {
    GRID_LOOP(i, n) {
        int h = (int)(i % (size_t)H);
        g[i] = -expf(A_log[h]) * softplus_(ld(a, i) + dt[h]);
    }
}

// One block per head: the token terms, then the head's sums (in a fixed order: deterministic).
__global__ void gdn_gate_bwd_kernel(bf16 *da, float *dA, float *ddt, const float *dg, const bf16 *a, const float *A_log,
                                    const float *dt, int N, int H) {
    __shared__ float red[32];
    int h = blockIdx.x;
    float e = expf(A_log[h]), sa = 0, sd = 0;
    for (int n = threadIdx.x; n < N; n += blockDim.x) {
        size_t i = (size_t)n * H + h;
        float z = ld(a, i) + dt[h], d = dg[i], dz = -d * e / (1.0f + expf(-z));
        st(da, i, dz);
        sa += d * (-e * softplus_(z));
        sd += dz;
    }
    sa = block_sum(sa, red);
    sd = block_sum(sd, red);
    if (threadIdx.x == 0) {
        dA[h] += sa;
        ddt[h] += sd;
    }
}

static int g_gdn_gate_fwd(const Backend *be, void *g, const void *a, const void *A_log, const void *dt_bias, int N,
                          int H) {
    size_t n = (size_t)N * H;
    gdn_gate_fwd_kernel<<<grid_for(n, 256), 256, 0, cuda_ctx(be)->stream>>>((float *)g, (const bf16 *)a,
                                                                            (const float *)A_log, (const float *)dt_bias, n, H);
    LAUNCH_CHECK();
    return MN_OK;
}

static int g_gdn_gate_bwd(const Backend *be, void *da, void *dA_log, void *ddt_bias, const void *dg, const void *a,
                          const void *A_log, const void *dt_bias, int N, int H) {
    gdn_gate_bwd_kernel<<<(unsigned)H, 256, 0, cuda_ctx(be)->stream>>>((bf16 *)da, (float *)dA_log, (float *)ddt_bias,
                                                                       (const float *)dg, (const bf16 *)a,
                                                                       (const float *)A_log, (const float *)dt_bias, N, H);
    LAUNCH_CHECK();
    return MN_OK;
}

// ------------------------------------------------------------------------ optimiser

__global__ void adamw_kernel(float *p, bf16 *shadow, const float *g, float *m, float *v, size_t n, float gs, float lr,
                             float b1, float b2, float eps, float wd, float c1, float c2) {
    GRID_LOOP(i, n) {
        float gi = gs * g[i], mi = b1 * m[i] + (1 - b1) * gi, vi = b2 * v[i] + (1 - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float pi = p[i] - lr * (mi / c1 / (sqrtf(vi / c2) + eps) + wd * p[i]);
        p[i] = pi;
        if (shadow) shadow[i] = __float2bfloat16(pi);
    }
}

static int g_adamw(const Backend *be, void *p, const void *g, void *m, void *v, size_t n, float gs, float lr, float b1,
                   float b2, float eps, float wd, int t) {
    float c1 = 1 - powf(b1, (float)t), c2 = 1 - powf(b2, (float)t);
    adamw_kernel<<<grid_for(n, 256), 256, 0, cuda_ctx(be)->stream>>>((float *)p, (bf16 *)cuda_param_bf16(p),
                                                                     (const float *)g, (float *)m, (float *)v, n, gs, lr,
                                                                     b1, b2, eps, wd, c1, c2);
    LAUNCH_CHECK();
    return MN_OK;
}

// Per-block partial sums of squares (fixed blocks, summed in order on the host: deterministic).
__global__ void sumsq_kernel(double *part, const float *x, size_t n, size_t per_block) {
    __shared__ float red[32];
    size_t lo = blockIdx.x * per_block, hi = lo + per_block < n ? lo + per_block : n;
    float s = 0;
    for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x) s += x[i] * x[i];
    s = block_sum(s, red);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

static int g_sumsq(const Backend *be, const void *x, size_t n, double *out) {
    CudaCtx *c = cuda_ctx(be);
    size_t per = 1 << 16, nb = (n + per - 1) / per;
    double *part = (double *)cuda_scratch(be, (nb ? nb : 1) * sizeof(double));
    if (!part) return MN_ERR_NOMEM;
    sumsq_kernel<<<(unsigned)(nb ? nb : 1), 256, 0, c->stream>>>(part, (const float *)x, n, per);
    LAUNCH_CHECK();
    double *h = (double *)malloc((nb ? nb : 1) * sizeof(double));
    if (!h) return mn_error(MN_ERR_NOMEM, "out of memory");
    cudaError_t e = cudaMemcpyAsync(h, part, nb * sizeof(double), cudaMemcpyDeviceToHost, c->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    double s = 0;
    for (size_t i = 0; i < nb; i++) s += h[i];
    free(h);
    CU_TRY(e);
    *out = s;
    return MN_OK;
}

// ------------------------------------------------------------------ recorded launches

// A decode step of a small model is hundreds of short kernels; launched one by one from the host
// they take longer than they run. CUDA graphs record the step once and replay it in one launch.
typedef struct {
    cudaGraphExec_t exec;
    void *scratch;  // the scratch buffer the recording saw (replaying after it moved would be wrong)
} Recording;

static int g_graph_begin(const Backend *be) {
    CU_TRY(cudaStreamBeginCapture(cuda_ctx(be)->stream, cudaStreamCaptureModeThreadLocal));
    return MN_OK;
}

static int g_graph_end(const Backend *be, void **out) {
    CudaCtx *c = cuda_ctx(be);
    *out = NULL;
    cudaGraph_t graph;
    CU_TRY(cudaStreamEndCapture(c->stream, &graph));
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
    cudaGraphExecDestroy(r->exec);
    free(r);
}

// ------------------------------------------------------------------------- the table

static CudaCtx ctx;
static Backend cuda_backend;
static int initialised;

CudaCtx *cuda_ctx(const Backend *be) { return (CudaCtx *)be->ctx; }

void *cuda_scratch(const Backend *be, size_t bytes) {
    CudaCtx *c = cuda_ctx(be);
    if (bytes <= c->scratch_bytes) return c->scratch;
    cudaStreamSynchronize(c->stream);  // the old buffer may still be in use by queued work
    if (c->scratch) cudaFree(c->scratch);
    c->scratch = NULL;
    c->scratch_bytes = 0;
    size_t n = bytes + bytes / 4;
    if (cudaMalloc(&c->scratch, n) != cudaSuccess) {
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

extern "C" const Backend *backend_cuda(void) {
    if (initialised) return initialised > 0 ? &cuda_backend : NULL;
    initialised = -1;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        // Without a GPU or its driver the runtime says "driver version is insufficient" or "no
        // CUDA-capable device": said plainly, CUDA's words only as the detail. A driver that is
        // there (version > 0) but older than the runtime is the one case an update fixes.
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
        return NULL;
    }
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess || cudaStreamCreate(&ctx.stream) != cudaSuccess ||
        cublasCreate(&ctx.blas) != CUBLAS_STATUS_SUCCESS || cublasSetStream(ctx.blas, ctx.stream) != CUBLAS_STATUS_SUCCESS) {
        mn_error(MN_ERR_UNSUPPORTED, "backend 'cuda': could not initialise the device, a stream or cuBLAS");
        return NULL;
    }
    if (cudaStreamCreateWithFlags(&ctx.side, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(&ctx.side_fork, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&ctx.side_join, cudaEventDisableTiming) != cudaSuccess) {
        mn_error(MN_ERR_UNSUPPORTED, "backend 'cuda': could not create the side stream and its events");
        return NULL;
    }
    // an explicit cuBLAS workspace (32 MiB, cuBLAS's own default on Hopper), so that products
    // recorded into a graph allocate nothing (set after the stream: cublasSetStream resets it)
    size_t ws_bytes = (size_t)32 << 20;
    if (cudaMalloc(&ctx.blas_ws, ws_bytes) != cudaSuccess ||
        cublasSetWorkspace(ctx.blas, ctx.blas_ws, ws_bytes) != CUBLAS_STATUS_SUCCESS) {
        mn_error(MN_ERR_UNSUPPORTED, "backend 'cuda': could not set up the cuBLAS workspace");
        return NULL;
    }
    ctx.sm_count = prop.multiProcessorCount;
    ctx.cc_major = prop.major;
    ctx.smem_optin = prop.sharedMemPerBlockOptin;
    Backend b = {};
    b.name = "cuda";
    b.ctx = &ctx;
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
    b.rmsnorm_fwd = g_rmsnorm_fwd;
    b.rmsnorm_bwd = g_rmsnorm_bwd;
    b.l2norm_fwd = g_l2norm_fwd;
    b.l2norm_bwd = g_l2norm_bwd;
    b.silu_fwd = g_silu_fwd;
    b.softcap = g_softcap;
    b.silu_bwd = g_silu_bwd;
    b.gelu_fwd = g_gelu_fwd;
    b.gelu_bwd = g_gelu_bwd;
    b.pool_last_fwd = g_pool_last_fwd;
    b.pool_last_bwd = g_pool_last_bwd;
    b.swiglu_fwd = g_swiglu_fwd;
    b.swiglu_bwd = g_swiglu_bwd;
    b.add = g_add;
    b.conv_fwd = g_conv_fwd;
    b.conv_bwd = g_conv_bwd;
    b.embed_fwd = g_embed_fwd;
    b.embed_bwd = g_embed_bwd;
    b.xent = g_xent;
    b.mesa_gates_fwd = g_gates_fwd;
    b.mesa_gates_bwd = g_gates_bwd;
    b.scale_f32 = g_scale_f32;
    b.softplus_fwd = g_softplus_fwd;
    b.softplus_bwd = g_softplus_bwd;
    b.gdn_gate_fwd = g_gdn_gate_fwd;
    b.gdn_gate_bwd = g_gdn_gate_bwd;
    // sequence-mixer cores: mesa (mesa_cuda.cu); mamba2, gla, deltanet, gdn, gdn-paper,
    // deltanet-paper (lin_cuda.cu)
    b.mesa_fwd = cuda_mesa_fwd;
    b.mesa_bwd = cuda_mesa_bwd;
    b.lin_fwd = cuda_lin_fwd;
    b.lin_bwd = cuda_lin_bwd;
    b.attn_fwd = cuda_attn_fwd;
    b.attn_bwd = cuda_attn_bwd;
    b.attn_decode = cuda_attn_decode;
    b.rope = cuda_rope;
    b.adamw = g_adamw;
    b.sumsq = g_sumsq;
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
    cuda_backend = b;
    initialised = 1;
    return &cuda_backend;
}
