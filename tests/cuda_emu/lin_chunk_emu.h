// A host emulation of what src/cuda/lin_chunk*.cu use, kernels and host side alike, so that
// the whole chunkwise path runs on a machine without a GPU (scripts/cuda_emulate.sh lin_chunk):
// one OS thread per CUDA thread of a block, the blocks one after another (static __shared__ arrays
// are then shared by a block's threads, as on the GPU); __syncthreads through a barrier; device
// memory is host memory; cuBLAS's strided-batched product is a plain loop that rounds its operands
// to TF32 (round to nearest even to 10 mantissa bits), as CUBLAS_COMPUTE_32F_FAST_TF32 does, and
// sums in float32. Slow: for checking the indexing, the synchronisation and the math, not speed.
#pragma once
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
#include <thread>
#include <vector>
extern "C" {
#include "core/half.h"
#include "core/common.h"
#include "core/backend.h"
}
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
struct dim3 { unsigned x, y, z; dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {} };
typedef struct { uint16_t b; } bf16;
static thread_local dim3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;
static pthread_barrier_t emu_bar;
static inline void __syncthreads(void) { pthread_barrier_wait(&emu_bar); }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline float ld(const bf16 *p, size_t i) { return bf16_to_f32(p[i].b); }
static inline void st(bf16 *p, size_t i, float v) { p[i].b = f32_to_bf16(v); }

// mma_emu.h (ldmatrix, mma.sync, cp.async with the PTX fragment layouts) for the fused kernels: its
// warp-collective operations meet at per-warp barriers (emu_warp_bar, 32 threads or the block's
// last partial warp), set up by emu_launch.
static pthread_barrier_t emu_warp_bar[32];
static pthread_mutex_t emu_atomic = PTHREAD_MUTEX_INITIALIZER;
static inline float atomicAdd(float *p, float v) {
    pthread_mutex_lock(&emu_atomic);
    float old = *p;
    *p = old + v;
    pthread_mutex_unlock(&emu_atomic);
    return old;
}
#include "mma_emu.h"
static float emu_xch[32][32];
static inline float __shfl_xor_sync(unsigned, float v, int o) {  // through the warp's barrier
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    emu_xch[w][lane] = v;
    pthread_barrier_wait(&emu_warp_bar[w]);
    float r = emu_xch[w][lane ^ o];
    pthread_barrier_wait(&emu_warp_bar[w]);
    return r;
}
static inline float warp_sum(float v) {  // __shfl_xor_sync's butterfly through the warp's barrier
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        emu_xch[w][lane] = v;
        pthread_barrier_wait(&emu_warp_bar[w]);
        float x = emu_xch[w][lane ^ o];
        pthread_barrier_wait(&emu_warp_bar[w]);
        v += x;
    }
    return v;
}
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
struct float2 { float x, y; };
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
uint32_t emu_mx[32][32][6];
const void *emu_px[32][32];

typedef int cudaStream_t;
typedef int cudaError_t;
typedef int cublasHandle_t;
typedef int cublasStatus_t;
enum { cudaSuccess = 0, cudaMemcpyDeviceToDevice = 3 };
enum { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUDA_R_32F = 0, CUBLAS_COMPUTE_32F_FAST_TF32 = 0,
       CUBLAS_GEMM_DEFAULT = 0 };
enum { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
template <typename F> static inline int cudaFuncSetAttribute(F, int, int) { return 0; }
static inline const char *cudaGetErrorName(int) { return "emu"; }
static inline const char *cudaGetErrorString(int) { return "emu"; }
static inline int cudaGetLastError(void) { return 0; }

#define CU_TRY(call)                                                                                 \
    do {                                                                                             \
        if ((call) != cudaSuccess) return mn_error(MN_ERR_UNSUPPORTED, "CUDA error at %d", __LINE__); \
    } while (0)
#define CUBLAS_TRY(call)                                                                               \
    do {                                                                                               \
        if ((call) != CUBLAS_STATUS_SUCCESS) return mn_error(MN_ERR_UNSUPPORTED, "cuBLAS error at %d", __LINE__); \
    } while (0)
#define LAUNCH_CHECK() CU_TRY(cudaGetLastError())

typedef struct {
    cudaStream_t stream;
    cublasHandle_t blas;
    size_t smem_optin;  // the most shared memory one block may ask for (an H100's)
    int sm_count;       // multiprocessors: one, so that every grid of more than a few blocks takes
                        // waves and the walks' blocks of two groups (lf_walk_groups) are exercised
} CudaCtx;
static CudaCtx emu_ctx = {{}, {}, (size_t)227 * 1024, 1};
static inline CudaCtx *cuda_ctx(const Backend *) { return &emu_ctx; }
static void *emu_scratch;
static size_t emu_scratch_bytes;
// Grow-only, and filled with NaN at every call: a buffer read before it is written shows.
static inline void *cuda_scratch(const Backend *, size_t bytes) {
    if (bytes > emu_scratch_bytes) {
        free(emu_scratch);
        emu_scratch = malloc(bytes);
        emu_scratch_bytes = bytes;
    }
    float *f = (float *)emu_scratch;
    for (size_t i = 0; i < bytes / 4; i++) f[i] = NAN;
    return emu_scratch;
}
static inline unsigned grid_for(size_t n, unsigned block) {
    size_t g = (n + block - 1) / block;
    return (unsigned)(g < 8 ? (g ? g : 1) : 8);  // (the kernels loop over their grid: a few blocks do)
}

static inline int cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t) { memset(p, v, n); return 0; }
static inline int cudaMemcpyAsync(void *d, const void *s, size_t n, int, cudaStream_t) { memmove(d, s, n); return 0; }
static inline int cudaMemcpy2DAsync(void *d, size_t dp, const void *s, size_t sp, size_t w, size_t h, int, cudaStream_t) {
    for (size_t r = 0; r < h; r++) memmove((char *)d + r * dp, (const char *)s + r * sp, w);
    return 0;
}
static inline int cudaMemset2DAsync(void *d, size_t dp, int v, size_t w, size_t h, cudaStream_t) {
    for (size_t r = 0; r < h; r++) memset((char *)d + r * dp, v, w);
    return 0;
}

static int emu_tf32 = 1;  // round the products' operands to TF32
static inline float tf32(float x) {
    if (!emu_tf32 || !isfinite(x)) return x;
    uint32_t u;
    memcpy(&u, &x, 4);
    u += 0xfffu + ((u >> 13) & 1u);
    u &= ~0x1fffu;
    memcpy(&x, &u, 4);
    return x;
}
// Column-major C = alpha op(A) op(B) + beta C (op(A): m x k), batched with strides.
static inline int cublasGemmStridedBatchedEx(cublasHandle_t, int opa, int opb, int m, int n, int k, const float *alpha,
                                             const float *A, int, int lda, long long sA, const float *B, int, int ldb,
                                             long long sB, const float *beta, float *C, int, int ldc, long long sC,
                                             int batch, int, int) {
    for (int b = 0; b < batch; b++) {
        const float *a = A + b * sA, *bb = B + b * sB;
        float *c = C + b * sC;
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                float s = 0;
                for (int l = 0; l < k; l++) {
                    float x = opa ? a[l + (size_t)i * lda] : a[i + (size_t)l * lda];
                    float y = opb ? bb[j + (size_t)l * ldb] : bb[l + (size_t)j * ldb];
                    s = fmaf(tf32(x), tf32(y), s);
                }
                float *o = c + i + (size_t)j * ldc;
                *o = *beta == 0 ? *alpha * s : *alpha * s + *beta * *o;
            }
    }
    return 0;
}

// kernel<<<grid, block, smem, stream>>>(args): the blocks in turn, a thread per CUDA thread.
template <typename T> struct emu_id { typedef T type; };
template <typename... P>
static void emu_launch(void (*k)(P...), dim3 grid, dim3 block, size_t, cudaStream_t,
                       typename emu_id<P>::type... args) {  // (args converted to the kernel's types: NULL)
    gridDim = grid;
    blockDim = block;
    unsigned nt = block.x * block.y * block.z;
    pthread_barrier_init(&emu_bar, NULL, nt);
    unsigned nw = (nt + 31) / 32;
    for (unsigned w = 0; w < nw; w++) pthread_barrier_init(&emu_warp_bar[w], NULL, nt - 32 * w < 32 ? nt - 32 * w : 32);
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                std::vector<std::thread> th;
                for (unsigned t = 0; t < nt; t++)
                    th.emplace_back([=]() {
                        blockIdx = dim3(bx, by, bz);
                        threadIdx = dim3(t % block.x, t / block.x % block.y, t / (block.x * block.y));
                        k(args...);
                    });
                for (auto &x : th) x.join();
            }
    pthread_barrier_destroy(&emu_bar);
    for (unsigned w = 0; w < nw; w++) pthread_barrier_destroy(&emu_warp_bar[w]);
}
