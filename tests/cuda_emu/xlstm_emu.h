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
#include <functional>
#include <thread>
#include <vector>
#include <stdio.h>
#include <sched.h>
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
// Per block of a running cluster (EMU_MAXC at once; a plain launch is a cluster of one): its
// barrier, its warps' barriers and exchange tables, its shared memory.
#define EMU_MAXC 4
static thread_local int emu_cta;
static pthread_barrier_t emu_bar_c[EMU_MAXC], emu_warp_bar_c[EMU_MAXC][32], emu_cluster_bar;
static uint32_t emu_mx_c[EMU_MAXC][32][32][6];
static const void *emu_px_c[EMU_MAXC][32][32];
static float emu_xch_c[EMU_MAXC][32][32];
static unsigned char emu_dsmem_c[EMU_MAXC][1 << 18] __attribute__((aligned(128)));
static inline void __syncthreads(void) { pthread_barrier_wait(&emu_bar_c[emu_cta]); }
static inline void emu_warp_sync(void) { pthread_barrier_wait(&emu_warp_bar_c[emu_cta][threadIdx.x >> 5]); }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline float ld(const bf16 *p, size_t i) { return bf16_to_f32(p[i].b); }
static inline void st(bf16 *p, size_t i, float v) { p[i].b = f32_to_bf16(v); }
static inline float __uint_as_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t __float_as_uint(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
#define __expf(x) expf(x)
#define __logf(x) logf(x)
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }
static pthread_mutex_t emu_atomic = PTHREAD_MUTEX_INITIALIZER;
static inline float atomicAdd(float *p, float v) {
    pthread_mutex_lock(&emu_atomic);
    float old = *p;
    *p = old + v;
    pthread_mutex_unlock(&emu_atomic);
    return old;
}
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static
static inline void emu_align(const void *p, unsigned n, const char *what) {
    if ((uintptr_t)p % n) {
        fprintf(stderr, "%s: address %p not %u-byte aligned\n", what, p, n);
        abort();
    }
}
#define __fdividef(a, b) ((a) / (b))
static inline unsigned __ldg(const unsigned *p) {
    emu_align(p, 4, "__ldg");
    return *p;
}
typedef struct { bf16 x, y; } __nv_bfloat162;
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
    __nv_bfloat162 r;
    r.x.b = f32_to_bf16(a), r.y.b = f32_to_bf16(b);
    return r;
}
static inline uint32_t pack_bf16(float lo, float hi) { return (uint32_t)f32_to_bf16(lo) | (uint32_t)f32_to_bf16(hi) << 16; }
// mma.cuh's ldmatrix and mma.sync as warp-collective operations with the PTX ISA's fragment layouts
// (as tests/cuda_emu/mma_emu.h, per block of the cluster)
static inline void emu_ldsm(uint32_t r[4], const void *row, int trans) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    emu_align(row, 16, "ldmatrix");
    emu_px_c[emu_cta][w][lane] = row;
    emu_warp_sync();
    for (int i = 0; i < 4; i++) {
        if (!trans) {
            const uint16_t *p = (const uint16_t *)emu_px_c[emu_cta][w][i * 8 + lane / 4];
            r[i] = (uint32_t)p[2 * (lane % 4)] | (uint32_t)p[2 * (lane % 4) + 1] << 16;
        } else {
            const uint16_t *p0 = (const uint16_t *)emu_px_c[emu_cta][w][i * 8 + 2 * (lane % 4)];
            const uint16_t *p1 = (const uint16_t *)emu_px_c[emu_cta][w][i * 8 + 2 * (lane % 4) + 1];
            r[i] = (uint32_t)p0[lane / 4] | (uint32_t)p1[lane / 4] << 16;
        }
    }
    emu_warp_sync();
}
static inline void ldsm_x4(uint32_t r[4], const void *row) { emu_ldsm(r, row, 0); }
static inline void ldsm_x4_t(uint32_t r[4], const void *row) { emu_ldsm(r, row, 1); }
static inline float emu_half(uint32_t x, int hi) { return bf16_to_f32((uint16_t)(hi ? x >> 16 : x & 0xffff)); }
static inline void mma_bf16(float c[4], const uint32_t a[4], const uint32_t b0, const uint32_t b1) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    uint32_t (*mx)[6] = emu_mx_c[emu_cta][w];
    for (int i = 0; i < 4; i++) mx[lane][i] = a[i];
    mx[lane][4] = b0;
    mx[lane][5] = b1;
    emu_warp_sync();
    float out[4];
    for (int e = 0; e < 4; e++) {
        int R = lane / 4 + 8 * (e >> 1), N = 2 * (lane % 4) + (e & 1);
        double s = 0;
        for (int K = 0; K < 16; K++) {
            float av = emu_half(mx[(R % 8) * 4 + (K % 8) / 2][(R >= 8) + 2 * (K >= 8)], K & 1);
            float bv = emu_half(mx[N * 4 + (K % 8) / 2][4 + (K >= 8)], K & 1);
            s += (double)av * bv;
        }
        out[e] = (float)(c[e] + s);
    }
    emu_warp_sync();
    for (int e = 0; e < 4; e++) c[e] = out[e];
}
static inline void cp_async16(void *dst, const void *src, int bytes) {
    emu_align(dst, 16, "cp.async dst");
    emu_align(src, 16, "cp.async src");
    memcpy(dst, src, (size_t)bytes);
    memset((char *)dst + bytes, 0, (size_t)(16 - bytes));
}
static inline void cp_async4(void *dst, const void *src, int bytes) {
    emu_align(dst, 4, "cp.async dst");
    emu_align(src, 4, "cp.async src");
    if (bytes) memcpy(dst, src, 4);
    else memset(dst, 0, 4);
}
static inline void cp_async_commit(void) {}
static inline void cp_async_wait1(void) {}
static inline void cp_async_wait0(void) {}
static inline void prefetch_l2(const void *) {}
static inline uint32_t smem_addr(const void *p) { return (uint32_t)(uintptr_t)p; }
// The cluster (slstm_cluster.cu's device-only block): rank, barrier, a block's shared memory by
// address in another's.
static inline unsigned slc_rank(void) { return (unsigned)emu_cta; }
static pthread_barrier_t *emu_cluster_bar_p;
static inline void slc_sync(void) { pthread_barrier_wait(emu_cluster_bar_p); }
static inline uintptr_t slc_map(const void *p, unsigned rank) {
    ptrdiff_t off = (const unsigned char *)p - emu_dsmem_c[emu_cta];
    if (off < 0 || off >= (ptrdiff_t)sizeof emu_dsmem_c[0]) { fprintf(stderr, "mapa of a non-shared address\n"); abort(); }
    return (uintptr_t)(emu_dsmem_c[rank] + off);
}
// mbarriers (8 bytes of shared memory: tx count, phase bit, arrivals a phase, arrivals pending) under
// one lock; a wait spins (yielding) until the phase of the other parity is the current one.
struct EmuMbar { int32_t tx; uint8_t phase, count; int16_t pending; };
static pthread_mutex_t emu_mbar_lock = PTHREAD_MUTEX_INITIALIZER;
static inline void emu_mbar_check(EmuMbar *m) {
    if (m->pending == 0 && m->tx == 0) {
        m->phase ^= 1;
        m->pending = m->count;
    }
}
static inline void slc_mbar_init(void *p, unsigned count) {
    emu_align(p, 8, "mbarrier");
    EmuMbar *m = (EmuMbar *)p;
    pthread_mutex_lock(&emu_mbar_lock);
    m->tx = 0, m->phase = 0, m->count = (uint8_t)count, m->pending = (int16_t)count;
    pthread_mutex_unlock(&emu_mbar_lock);
}
static inline void slc_mbar_expect(void *p, unsigned bytes) {
    EmuMbar *m = (EmuMbar *)p;
    pthread_mutex_lock(&emu_mbar_lock);
    m->tx += (int32_t)bytes;
    m->pending--;
    emu_mbar_check(m);
    pthread_mutex_unlock(&emu_mbar_lock);
}
static inline void slc_mbar_wait(void *p, unsigned parity) {
    EmuMbar *m = (EmuMbar *)p;
    for (;;) {
        pthread_mutex_lock(&emu_mbar_lock);
        int done = m->phase != parity;
        pthread_mutex_unlock(&emu_mbar_lock);
        if (done) return;
        sched_yield();
    }
}
static inline void emu_st_async(uintptr_t a, const void *v, unsigned bytes, uintptr_t mbar) {
    emu_align((void *)a, bytes, "st.async");
    EmuMbar *m = (EmuMbar *)mbar;
    pthread_mutex_lock(&emu_mbar_lock);
    memcpy((void *)a, v, bytes);
    m->tx -= (int32_t)bytes;
    emu_mbar_check(m);
    pthread_mutex_unlock(&emu_mbar_lock);
}
static inline void slc_st_async32(uintptr_t a, uint32_t v, uintptr_t mbar) { emu_st_async(a, &v, 4, mbar); }
static inline void slc_st_async64(uintptr_t a, uint32_t lo, uint32_t hi, uintptr_t mbar) {
    uint32_t v[2] = {lo, hi};
    emu_st_async(a, v, 8, mbar);
}
static inline float emu_shfl(float v, int src) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    emu_xch_c[emu_cta][w][lane] = v;
    emu_warp_sync();
    float x = emu_xch_c[emu_cta][w][src & 31];
    emu_warp_sync();
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

// kernel<<<grid, block, smem, stream>>>(args): the clusters of cs blocks in turn (cs = 1: the blocks),
// a thread per CUDA thread of each block of the cluster, all at once.
template <typename T> struct emu_id { typedef T type; };
template <typename F> struct EmuJob { F f; };
template <typename F> static void *emu_run(void *p) { (*(F *)p)(); return NULL; }
template <typename... P>
static void emu_launch_cluster(void (*k)(P...), dim3 grid, dim3 block, size_t smem, unsigned cs, typename emu_id<P>::type... args) {
    if (smem > sizeof emu_dsmem_c[0]) { fprintf(stderr, "emu: %zu bytes of shared memory\n", smem); abort(); }
    if (cs < 1 || cs > EMU_MAXC || grid.x % cs) { fprintf(stderr, "emu: cluster of %u\n", cs); abort(); }
    gridDim = grid;
    blockDim = block;
    const unsigned nt = block.x * block.y * block.z, nw = (nt + 31) / 32;
    pthread_barrier_init(&emu_cluster_bar, NULL, cs * nt);
    emu_cluster_bar_p = &emu_cluster_bar;
    for (unsigned r = 0; r < cs; r++) {
        pthread_barrier_init(&emu_bar_c[r], NULL, nt);
        for (unsigned w = 0; w < nw; w++) pthread_barrier_init(&emu_warp_bar_c[r][w], NULL, nt - 32 * w < 32 ? nt - 32 * w : 32);
    }
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, 1 << 20);
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx += cs) {
                for (unsigned r = 0; r < cs; r++) memset(emu_dsmem_c[r], 0xff, smem);
                std::vector<pthread_t> th(cs * nt);
                auto body = [=](unsigned r, unsigned t) {
                    emu_cta = (int)r;
                    blockIdx = dim3(bx + r, by, bz);
                    threadIdx = dim3(t % block.x, t / block.x % block.y, t / (block.x * block.y));
                    k(args...);
                };
                typedef std::function<void()> Fn;
                std::vector<Fn> fns(cs * nt);
                for (unsigned r = 0; r < cs; r++)
                    for (unsigned t = 0; t < nt; t++) {
                        fns[r * nt + t] = [=]() { body(r, t); };
                        if (pthread_create(&th[r * nt + t], &at, emu_run<Fn>, &fns[r * nt + t])) { fprintf(stderr, "emu: pthread_create\n"); abort(); }
                    }
                for (auto &x : th) pthread_join(x, NULL);
            }
    pthread_attr_destroy(&at);
    pthread_barrier_destroy(&emu_cluster_bar);
    for (unsigned r = 0; r < cs; r++) {
        pthread_barrier_destroy(&emu_bar_c[r]);
        for (unsigned w = 0; w < nw; w++) pthread_barrier_destroy(&emu_warp_bar_c[r][w]);
    }
}
template <typename... P>
static void emu_launch(void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t, typename emu_id<P>::type... args) {
    emu_launch_cluster(k, grid, block, smem, 1, args...);
}
// cudaLaunchKernelEx with a cluster dimension (the one attribute slstm_cluster.cu sets)
struct cudaLaunchAttribute { int id; struct { struct { unsigned x, y, z; } clusterDim; } val; };
struct cudaLaunchConfig_t { dim3 gridDim, blockDim; size_t dynamicSmemBytes; cudaStream_t stream; cudaLaunchAttribute *attrs; unsigned numAttrs; };
enum { cudaLaunchAttributeClusterDimension = 4 };
// cuda_common.cuh's programmatic dependent launch: a plain launch here (grid_wait returns at once)
typedef struct { cudaLaunchConfig_t cfg; } Launch;
static inline const cudaLaunchConfig_t *launch_after(Launch *l, const CudaCtx *, dim3 grid, unsigned block, size_t smem,
                                                     cudaStream_t stream) {
    l->cfg.gridDim = grid;
    l->cfg.blockDim = dim3(block);
    l->cfg.dynamicSmemBytes = smem;
    l->cfg.stream = stream;
    l->cfg.attrs = NULL;
    l->cfg.numAttrs = 0;
    return &l->cfg;
}
template <typename... P, typename... A>
static int cudaLaunchKernelEx(const cudaLaunchConfig_t *c, void (*k)(P...), A... args) {
    unsigned cs = 1;
    for (unsigned i = 0; i < c->numAttrs; i++)
        if (c->attrs[i].id == cudaLaunchAttributeClusterDimension) cs = c->attrs[i].val.clusterDim.x;
    emu_launch_cluster(k, c->gridDim, c->blockDim, c->dynamicSmemBytes, cs, args...);
    return 0;
}

// The vector types and cuBLAS's strided-batched product (bf16 or float32 operands, float32 output,
// float32 sums: what slstm_cuda.cu asks of it), column-major as cuBLAS.
struct uint4 { uint32_t x, y, z, w; };
struct float2 { float x, y; };
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
