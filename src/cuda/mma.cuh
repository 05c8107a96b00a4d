/*
 * Tensor-core and async-copy helpers for the kernels (attn_cuda.cu, lin_chunk*.cu, mesa_cuda.cu), as
 * small functions over inline PTX so that the kernels read as calls. tests/cuda_emu/mma_emu.h
 * implements the same functions on the CPU, warp-collectively, with the PTX ISA's fragment layouts,
 * so that a kernel's lane mapping can be checked without a GPU.
 *
 * Fragments of mma.sync.m16n8k16 (bf16 inputs, fp32 accumulators), lane l, r = l / 4, c = 2 (l % 4):
 *   A (16 x 16, row-major) a[0]: (r, c..c+1)  a[1]: (r+8, c..c+1)  a[2]: (r, c+8..)  a[3]: (r+8, c+8..)
 *   B (16 x 8,  "col")     b[0]: (k = c..c+1, n = r)                 b[1]: (k = c+8.., n = r)
 *   C (16 x 8)             c[0..1]: (r, c..c+1)                     c[2..3]: (r+8, c..c+1)
 * Each 32-bit register holds two bf16, the lower column in the low half.
 */
#ifndef MN_MMA_CUH
#define MN_MMA_CUH

#include <cuda_bf16.h>
#include <stdint.h>

static __device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

// Four 8x8 b16 matrices from shared memory: lane l gives the address of row l % 8 of matrix l / 8
// (16 contiguous bytes), and receives in r[i] the elements (l / 4, 2 (l % 4) .. +1) of matrix i.
static __device__ __forceinline__ void ldsm_x4(uint32_t r[4], const void *row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(row)));
}

// The same, each matrix transposed: r[i] holds elements (2 (l % 4) .. +1, l / 4) of matrix i.
static __device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], const void *row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(row)));
}

// c += a b (m16n8k16, bf16 in, fp32 accumulate), fragments as above.
static __device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], const uint32_t b0, const uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as a bf16 pair (round to nearest even), lo in the low half.
static __device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&h;
}

// 2^x on the special-function unit (ex2.approx.ftz: ~2 ulp; -inf gives 0), without exp2f's
// handling of denormal results, which the softmax's weights do not need.
static __device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// p[0] += a, p[1] += b in global memory, atomically (p 8-byte aligned): one vector reduction on
// Hopper, two scalar ones before.
static __device__ __forceinline__ void red_add2(float *p, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd((float2 *)p, make_float2(a, b));
#else
    atomicAdd(p, a);
    atomicAdd(p + 1, b);
#endif
}

// 16 bytes from global to shared memory in the background: `bytes` (16 or 0) are read, the rest
// zero-filled (the tails of a tile: rows past T, columns past D).
static __device__ __forceinline__ void cp_async16(void *dst, const void *src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes) : "memory");
}
static __device__ __forceinline__ void cp_async_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most 1 (cp_async_wait1) or 0 (cp_async_wait0) of the thread's groups are in flight.
static __device__ __forceinline__ void cp_async_wait1(void) { asm volatile("cp.async.wait_group 1;" ::: "memory"); }
static __device__ __forceinline__ void cp_async_wait0(void) { asm volatile("cp.async.wait_group 0;" ::: "memory"); }
// Asks the L2 for the 128-byte line holding p (a hint: nothing waits for it), so that a later load
// of it hits the L2 instead of waiting on DRAM.
static __device__ __forceinline__ void prefetch_l2(const void *p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

#endif
