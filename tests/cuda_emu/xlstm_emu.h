// A host emulation of what src/cuda/mlstm_cuda.cu and slstm_cuda.cu use, kernels and host side, so
// that the xLSTM cores run on a machine without a GPU (scripts/cuda_emulate.sh mlstm | slstm): one OS
// thread per CUDA thread of a block, the blocks one after another; __syncthreads and the warp
// shuffles through barriers; mma_emu.h for ldmatrix / mma.sync in their PTX fragment layouts; device
// memory is host memory. A block's dynamic shared memory is one static array, filled with NaN before
// every block (a read of an element never written shows), as is the scratch at every call. Slow: for
// checking the indexing, the synchronisation and the math, not speed.
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
struct dim3 { unsigned x, y, z; dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {} };
typedef struct { uint16_t b; } bf16;
static thread_local dim3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;
static pthread_barrier_t emu_bar;
static inline void __syncthreads(void) { pthread_barrier_wait(&emu_bar); }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline float ld(const bf16 *p, size_t i) { return bf16_to_f32(p[i].b); }
static inline void st(bf16 *p, size_t i, float v) { p[i].b = f32_to_bf16(v); }
static inline float __uint_as_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t __float_as_uint(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
#define __expf(x) expf(x)
#define __logf(x) logf(x)
static inline float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }
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
uint32_t emu_mx[32][32][6];
const void *emu_px[32][32];
static float emu_xch[32][32];
static inline float emu_shfl(float v, int src) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    emu_xch[w][lane] = v;
    pthread_barrier_wait(&emu_warp_bar[w]);
    float x = emu_xch[w][src & 31];
    pthread_barrier_wait(&emu_warp_bar[w]);
    return x;
}
static inline float __shfl_sync(unsigned, float v, int src) { return emu_shfl(v, src); }
static inline float __shfl_xor_sync(unsigned, float v, int o) { return emu_shfl(v, (threadIdx.x & 31) ^ o); }
static inline float __shfl_up_sync(unsigned, float v, int o) {
    int l = threadIdx.x & 31;
    return emu_shfl(v, l >= o ? l - o : l);
}
static inline float __shfl_down_sync(unsigned, float v, int o) {
    int l = threadIdx.x & 31;
    return emu_shfl(v, l + o < 32 ? l + o : l);
}
static inline float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static inline void grid_wait(void) {}

typedef int cudaStream_t;
typedef int cudaError_t;
typedef int cublasHandle_t;
typedef int cublasStatus_t;
enum { cudaSuccess = 0, cudaMemcpyDeviceToDevice = 3 };
enum { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUDA_R_32F = 0, CUDA_R_16BF = 1,
       CUBLAS_COMPUTE_32F = 0, CUBLAS_GEMM_DEFAULT = 0 };
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
    int sm_count;
    int cc_major;
    size_t smem_optin;
} CudaCtx;
static CudaCtx emu_ctx = {0, 0, 132, 9, (size_t)227 * 1024};
static inline CudaCtx *cuda_ctx(const Backend *) { return &emu_ctx; }
static void *emu_scratch;
static size_t emu_scratch_bytes;
static inline void *cuda_scratch(const Backend *, size_t bytes) {
    if (bytes > emu_scratch_bytes) {
        free(emu_scratch);
        emu_scratch = aligned_alloc(256, (bytes + 255) / 256 * 256);
        emu_scratch_bytes = bytes;
    }
    memset(emu_scratch, 0xff, bytes);  // NaN
    return emu_scratch;
}
static inline const bf16 *cuda_param_bf16(const void *) { return NULL; }  // (the emulation's R is given as bf16)
static inline unsigned grid_for(size_t n, unsigned block) {
    size_t g = (n + block - 1) / block;
    return (unsigned)(g < 8 ? (g ? g : 1) : 8);  // (the kernels loop over their grid: a few blocks do)
}
static inline int cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t) { memset(p, v, n); return 0; }
static inline int cudaMemcpyAsync(void *d, const void *s, size_t n, int, cudaStream_t) { memmove(d, s, n); return 0; }

static unsigned char emu_dsmem[1 << 18] __attribute__((aligned(128)));

// kernel<<<grid, block, smem, stream>>>(args): the blocks in turn, a thread per CUDA thread.
template <typename T> struct emu_id { typedef T type; };
template <typename... P>
static void emu_launch(void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t,
                       typename emu_id<P>::type... args) {
    if (smem > sizeof emu_dsmem) { fprintf(stderr, "emu: %zu bytes of shared memory\n", smem); abort(); }
    gridDim = grid;
    blockDim = block;
    unsigned nt = block.x * block.y * block.z;
    pthread_barrier_init(&emu_bar, NULL, nt);
    unsigned nw = (nt + 31) / 32;
    for (unsigned w = 0; w < nw; w++) pthread_barrier_init(&emu_warp_bar[w], NULL, nt - 32 * w < 32 ? nt - 32 * w : 32);
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                memset(emu_dsmem, 0xff, smem);
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

// The vector types and cuBLAS's strided-batched product (bf16 or float32 operands, float32 output,
// float32 sums: what slstm_cuda.cu asks of it), column-major as cuBLAS.
struct uint4 { uint32_t x, y, z, w; };
struct uint2 { uint32_t x, y; };
static inline uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return uint4{a, b, c, d}; }
static inline float emu_elem(const void *p, int type, size_t i) {
    return type == CUDA_R_16BF ? bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}
static inline int cublasGemmStridedBatchedEx(cublasHandle_t, int opa, int opb, int m, int n, int k, const float *alpha,
                                             const void *A, int ta, int lda, long long sA, const void *B, int tb, int ldb,
                                             long long sB, const float *beta, void *C, int, int ldc, long long sC,
                                             int batch, int, int) {
    for (int b = 0; b < batch; b++)
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                float s = 0;
                for (int l = 0; l < k; l++) {
                    float x = emu_elem(A, ta, b * sA + (opa ? l + (size_t)i * lda : i + (size_t)l * lda));
                    float y = emu_elem(B, tb, b * sB + (opb ? j + (size_t)l * ldb : l + (size_t)j * ldb));
                    s = fmaf(x, y, s);
                }
                float *o = (float *)C + b * sC + i + (size_t)j * ldc;
                *o = *beta == 0 ? *alpha * s : *alpha * s + *beta * *o;
            }
    return 0;
}
