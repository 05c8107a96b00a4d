// A host emulation of the subset of CUDA that src/cuda/lin_cuda.cu's kernels use, so that they run
// on a machine without a GPU (scripts/cuda_emulate.sh lin): one OS thread per CUDA thread of a
// block, the blocks one after another; __syncthreads and the warp shuffles through barriers,
// atomicAdd under a lock. Slow (~1 minute for small problems), for checking indexing and
// synchronisation, not speed.
#pragma once
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
extern "C" {
#include "core/half.h"
#include "core/common.h"
#include "core/backend.h"
#include "ref/ref.h"
}
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
struct dim3 { unsigned x, y, z; dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {} };
typedef struct { uint16_t b; } bf16;
extern thread_local dim3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
extern pthread_barrier_t emu_block_bar, emu_warp_bar[32];
extern float emu_xch[32][32];
extern pthread_mutex_t emu_atomic;
static inline void __syncthreads(void) { pthread_barrier_wait(&emu_block_bar); }
static inline float __shfl_xor_sync(unsigned mask, float v, int o) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    emu_xch[w][lane] = v;
    pthread_barrier_wait(&emu_warp_bar[w]);
    float r = emu_xch[w][lane ^ o];
    pthread_barrier_wait(&emu_warp_bar[w]);
    return r;
}
static inline float atomicAdd(float *p, float v) {
    pthread_mutex_lock(&emu_atomic);
    float old = *p;
    *p = old + v;
    pthread_mutex_unlock(&emu_atomic);
    return old;
}
static inline int min(int a, int b) { return a < b ? a : b; }
static inline float ld(const bf16 *p, size_t i) { return bf16_to_f32(p[i].b); }
static inline void st(bf16 *p, size_t i, float v) { p[i].b = f32_to_bf16(v); }
static inline float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
