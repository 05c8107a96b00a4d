/*
 * The Mesa core on the GPU: the chunkwise algorithm of src/cpu/mesa_chunk.c
 * (spec sections 3-4) as fused CUDA kernels. Inputs arrive in bf16; states H,
 * G, all CG arithmetic and every product stay at float32 accuracy.
 *
 * Products run on the tensor cores with fp32 accumulation. The chunk
 * kernels' products (CG's operator, the output, the backward's right-hand side
 * and gradients) run in fp16 (mma.sync m16n8k16, ldmatrix) on operands scaled
 * by powers of two, split hi + lo where they are fp32 (see tile_mma16). The
 * scans run in bf16 (the same instruction): the right factor is a bf16 input,
 * the weighted left one is split into three bf16 terms (24 bits, fp32's range:
 * no scaling). cuBLAS cannot do these products: they are 64-row blocks inside
 * one kernel, interleaved with CG's per-row scalars.
 *
 * This file is compiled twice: for head sizes up to 128, and (mesa_cuda_d64.cu,
 * MAXD 64, NCG 2) for heads up to 64 with 8-warp blocks, two chunk blocks per
 * multiprocessor; everything here is static but the entry points, whose names
 * MESA_NAME suffixes in the second build.
 *
 * One thread block (16 warps) per (chunk, sequence, head) solves the chunk's
 * C = 64 systems at once. A 64 x N tile lives in registers in the mma
 * accumulator layout: warp w owns rows 16 (w & 3) .. + 15 and the column group
 * w >> 2 of NCG = 4 (see f_row, f_col). Four groups, not two, leave half the
 * registers per thread and twice the warps to hide latency: 1.25x faster
 * measured (eight groups spill and were slower). Operands of products sit in
 * shared memory with strides chosen so fragment loads hit distinct banks.
 *
 * The chunk-to-chunk recurrences (chunk-entry states forward, the adjoints in
 * reverse) are one sliced scan kernel: a block per (64-row slice of a state,
 * sequence, head) keeps its slice in registers across the chunks.
 *
 * Kernels, forward: scan (states) -> cg_forward. Backward: scan (states) ->
 * cg_backward (the second solve, per-token terms) -> scan (adjoints) -> grads
 * (per chunk) -> dg_scan (reverse cumulative sum of dL/db). Decoding (T = 1):
 * decode_kernel alone, the recurrent form with a block per (sequence, head).
 *
 * Measured on an H100 (ncu, 8x2048x16x128): see docs/cuda.md for every
 * change tried and its effect. With TF32 everywhere, the chunk kernels were
 * latency-bound (0.35 instructions per cycle per scheduler, tensor pipe 13%
 * busy); fp16 operands took the CG kernels from 5.0 to 2.1-2.2 ms and the
 * gradients kernel from 5.0 to 1.0 ms; bf16 and cp.async took each scan from
 * 0.77 to 0.42 ms.
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda.h>  // CUtensorMap (the scans' TMA copies; the driver's encoder is looked up at run time)
#include <cuda_fp16.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include "cuda_common.cuh"

extern "C" {
#include "core/mesa_args.h"
}

#define CH 64                 // chunk size on the GPU
#ifndef NCG
#define NCG 4                 // column groups of a 64-row tile: warp w owns rows 16 (w & 3).., columns group w >> 2
#endif
#define NT (128 * NCG)        // threads per block: 4 row blocks x NCG column groups of warps
#ifndef MAXD
#define MAXD 128              // largest head size the fused kernels take (mesa_cuda_d64.cu: 64)
#endif
#ifndef MESA_NAME
#define MESA_NAME(f) f        // the entry points' names (mesa_cuda_d64.cu suffixes its build's)
#endif
// Chunk-kernel blocks per multiprocessor: one at head size 128 (16 warps, 128 registers a thread,
// ~210 KB of smem); two at MAXD 64 (mesa_cuda_d64.cu: 8 warps, 128 registers, ~108 KB).
#define CHUNK_BLOCKS (MAXD <= 64 ? 2 : 1)
#define MAXNT (MAXD / (8 * NCG))  // n-tiles (8 columns) per warp, at most
#define NTILES(n) ((n) / (8 * NCG))  // n-tiles per warp of a tile n columns wide
#define FR 2                  // rows per thread in a tile: groupID and groupID + 8
#define MFN (4 * NTILES(CH))    // elements of a 64 x 64 tile per thread (the precomputed mask)
#define LDT (CH + 8)          // stride of k-major blocks: 8 mod 32, so fragment loads are conflict-free
#define RESIDUAL_FLOOR (4.0f / 16777216.0f)  // as on the CPU (src/cpu/cg.c)

// The chunk kernels' head size: heads (Dk and Dv) are padded with zeros to the build's largest, so
// that every tile's width, stride and loop count is a compile-time constant. (With the padded size
// read from the problem, ptxas kept a bounds test and a branch before every product's n-tiles, in
// the innermost loops: 16% of the CG kernel's instructions were compares and branches.)
#define DP MAXD

// Hopper's warpgroup products (wgmma) for the CG operator's state term, in the sm_90a build: a
// warpgroup's 64 x 32 product reads each operand once from shared memory, where mma.sync has every
// warp load its own fragments (the CG loop is bound by that traffic). Other builds use mma.sync.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WGMMA 1
#else
#define WGMMA 0
#endif

// wgmma's core-matrix layout without swizzling, of a matrix DP columns wide: 8 x 8 blocks of
// 16-bit values, each 128 contiguous bytes (its row r at byte 16 r), the blocks of a row of blocks
// side by side along the columns, the rows of blocks DP / 8 blocks apart. Passing LD_CORE where a
// row stride is expected selects it.
#define LD_CORE (-1)
static __device__ __forceinline__ int mat_off(int r, int c, int ld) {
    return ld == LD_CORE ? (((r >> 3) * (DP / 8) + (c >> 3)) << 6) + ((r & 7) << 3) + (c & 7) : r * ld + c;
}
// The layout of the CG operator's direction P and state H.
#define LD_OP (WGMMA ? LD_CORE : ldrow(DP))
// Stride of a row-major operand with n columns (n a multiple of 16): 8 or 24 mod 32, conflict-free.
static __host__ __device__ __forceinline__ int ldrow(int n) { return n + 8; }

// Sizes of one problem, passed to every kernel.
typedef struct {
    int B, T, H, Dk, Dv, nchunks;
    int max_steps, precond, init;
    float tol2;  // squared stopping tolerance (at least the rounding floor)
    int pair0;   // the launch's first (b, h) pair: the grid's pair index counts on from it (Part)
} Geo;

static __device__ __forceinline__ size_t tok_index(const Geo *g, int pair, int t) {
    int b = pair / g->H, h = pair % g->H;
    return ((size_t)b * g->T + t) * g->H + h;
}

// ------------------------------------------------------------ tiles in registers

// A 64 x (16 nc) tile in the mma accumulator layout: element e of n-tile j is
// at row f_row(e >> 1), column f_col(j, e, nc).
typedef struct {
    float v[MAXNT][4];
} Tile;

static __device__ __forceinline__ int lane_id() { return threadIdx.x & 31; }
// Tells the compiler that the block has n threads (a constant), which __launch_bounds__ leaves
// unsaid; the chunk kernels, the scans, dg_scan and decode call it first. In the chunk kernels the
// staging loops' tests whether a thread's vector lies inside its block then fold away where the
// vectors cover it exactly, and the register allocation changed with them: ptxas's spills went to
// none in the CG kernels and 8 bytes in grads_kernel (from 20, 4 and 36), and forward+backward at
// 8 x 2048 x 16 x 128 ran 1.7% faster (grads_kernel 3.9%, the CG kernels 0.9% and 1.8%;
// docs/cuda.md).
static __device__ __forceinline__ void assume_threads(unsigned n) { __builtin_assume(threadIdx.x < n); }
static __device__ __forceinline__ int warp_id() { return threadIdx.x >> 5; }
static __device__ __forceinline__ int f_row(int i) { return 16 * (warp_id() & 3) + (lane_id() >> 2) + 8 * i; }
static __device__ __forceinline__ int f_col(int j, int e, int nc) {
    return (warp_id() >> 2) * 8 * nc + 8 * j + 2 * (lane_id() & 3) + (e & 1);
}
// Whether this thread reports its rows' scalars (one thread per row).
static __device__ __forceinline__ int row_owner() { return (lane_id() & 3) == 0 && warp_id() < 4; }

static __device__ __forceinline__ void tile_zero(Tile *t) {
#pragma unroll
    for (int j = 0; j < MAXNT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) t->v[j][e] = 0;
}

// The thread's partial sums of a_row . b_row for its rows (over its own columns; rows_join completes them).
static __device__ __forceinline__ void tile_rowdot(float s[FR], const Tile *a, const Tile *b, int nc) {
    s[0] = s[1] = 0;
#pragma unroll
    for (int j = 0; j < MAXNT; j++)
        if (j < nc)
#pragma unroll
            for (int e = 0; e < 4; e++) s[e >> 1] += a->v[j][e] * b->v[j][e];
}

// out[i] = the sum of the partials s[i] of the thread's rows: rows span the 4
// lanes of a quad and the NCG column-group warps; `red` ([NCG][CH] floats of
// smem) joins the groups. Called by all threads (it synchronizes the block).
// With `fresh`, the caller guarantees that every thread has passed a barrier
// since its last reads of red (the CG loop alternates two buffers), and the
// join takes one barrier instead of two.
static __device__ void rows_join(float out[FR], float s[FR], float *red, int fresh) {
#pragma unroll
    for (int i = 0; i < FR; i++) {
        s[i] += __shfl_xor_sync(0xffffffffu, s[i], 1);
        s[i] += __shfl_xor_sync(0xffffffffu, s[i], 2);
    }
    if (!fresh) __syncthreads();  // the previous readers of red are done
    if ((lane_id() & 3) == 0)
#pragma unroll
        for (int i = 0; i < FR; i++) red[(warp_id() >> 2) * CH + f_row(i)] = s[i];
    __syncthreads();
#pragma unroll
    for (int i = 0; i < FR; i++) {
        out[i] = 0;
#pragma unroll
        for (int q = 0; q < NCG; q++) out[i] += red[q * CH + f_row(i)];
    }
}

// out[i] = a_row . b_row for the thread's rows (all threads; synchronizes).
static __device__ __forceinline__ void tile_dot(float out[FR], const Tile *a, const Tile *b, int nc, float *red,
                                         int fresh) {
    float s[FR];
    tile_rowdot(s, a, b, nc);
    rows_join(out, s, red, fresh);
}

// Multiplies the thread's rows by f.
static __device__ __forceinline__ void tile_scale_rows(Tile *t, const float f[FR]) {
#pragma unroll
    for (int j = 0; j < MAXNT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) t->v[j][e] *= f[e >> 1];
}

// The largest magnitude in the thread's part of the tile.
static __device__ __forceinline__ float tile_absmax(const Tile *t, int nc) {
    float m = 0;
#pragma unroll
    for (int j = 0; j < MAXNT; j++)
        if (j < nc)
#pragma unroll
            for (int e = 0; e < 4; e++) m = fmaxf(m, fabsf(t->v[j][e]));
    return m;
}

// The block's maxima of n per-thread values at once (non-negative): m in, the
// maxima out, for every thread. red: n NT / 32 floats of smem (n <= 5: at most
// 20 NCG, inside the [NCG][CH] regions that callers pass). Synchronizes.
static __device__ void block_max_n(float *m, int n, float *red) {
    for (int i = 0; i < n; i++) m[i] = warp_max(m[i]);
    __syncthreads();  // the previous readers of red are done
    if (lane_id() == 0)
        for (int i = 0; i < n; i++) red[NT / 32 * i + warp_id()] = m[i];
    __syncthreads();
    for (int i = 0; i < n; i++) {
        float v = 0;
        for (int w = 0; w < NT / 32; w++) v = fmaxf(v, red[NT / 32 * i + w]);
        m[i] = v;
    }
}

// ------------------------------------------------------------ tensor-core products

// ------------------------------------------- fp16 tensor-core products (the CG operator)
//
// CG applies the same operator (state H, keys K) to a new direction at every
// step, which makes it the bulk of the chunk kernels' time. These products run
// in fp16 (mma m16n8k16: twice TF32's rate) with operands fetched by ldmatrix
// (one instruction per 16 x 16 block instead of eight scalar loads), each
// operand scaled by a power of two into fp16's range so that nothing is lost:
// bf16 keys are exact in fp16's 11 bits, the state is split hi + lo (22 bits,
// as the TF32 split), the direction is rounded to 11 bits (as TF32 rounding
// was; see cg_solve), and the masked scores are split hi + lo.

static __device__ __forceinline__ unsigned smem_u32(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

// Four (two) 8 x 8 blocks of 16-bit values; `trans` transposes each block.
static __device__ __forceinline__ void ldsm4(unsigned r[4], const __half *p, int trans) {
    if (trans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(p)));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(p)));
}

static __device__ __forceinline__ void ldsm2(unsigned r[2], const __half *p, int trans) {
    if (trans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(smem_u32(p)));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(smem_u32(p)));
}

static __device__ __forceinline__ void mma_f16(float c[4], const unsigned a[4], const unsigned b[2]) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

static __device__ __forceinline__ void mma_bf16(float c[4], const unsigned a[4], const unsigned b[2]) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

static __device__ __forceinline__ void mma16(float c[4], const unsigned a[4], const unsigned b[2], int bf) {
    if (bf) mma_bf16(c, a, b);
    else mma_f16(c, a, b);
}

// The B operand of a warp's product: B and B2 (B2, the low half of a split
// operand, may be NULL) by k (B(k, n) = B[k ldb + n]) or, with b_nmajor, by n
// (B(k, n) = B[n ldb + k]), and where the lane's ldmatrix rows lie in them.
typedef struct {
    const __half *B, *B2;
    int off, kstep, jstep, trans;  // the lane's row at k = 0, n-tile 0; the steps to k + 1 and to n-tile + 1
} BFrag;

// The lane's row address inside the 16 (k) x 16 (n) block of B (two n-tiles) at k = 0, column n0
// (the first of its warp's columns: (w >> 2) 8 nc for nc n-tiles a warp).
static __device__ __forceinline__ int b_lane_off(int l, int n0, int ldb, int b_nmajor) {
    return b_nmajor ? (n0 + (l & 7) + (l >> 4) * 8) * ldb + ((l >> 3) & 1) * 8
                    : ((l & 7) + ((l >> 3) & 1) * 8) * ldb + n0 + (l >> 4) * 8;
}

// B's fragments for the lane at offset off (b_lane_off). (The caller computes the offset: computed
// in here, it made ptxas spill twice as much in the CG forward kernel, which ran 2% slower.)
static __device__ __forceinline__ BFrag b_frag_at(const __half *B, const __half *B2, int ldb, int b_nmajor, int off) {
    BFrag f = {B, B2, off, b_nmajor ? 1 : ldb, b_nmajor ? 8 * ldb : 8, !b_nmajor};
    return f;
}

// acc += (a + a2) B[k:k+16, :] + a B2[k:k+16, :] over the warp's nc n-tiles, for
// A's fragments a (and, with has_a2, its low half's a2) of the k-step at k.
static __device__ __forceinline__ void mma_kstep(Tile *acc, const unsigned a[4], const unsigned a2[4], int has_a2,
                                             const BFrag *f, int k, int nc, int bf) {
#pragma unroll
    for (int j = 0; j < MAXNT; j += 2) {
        if (j >= nc) break;
        int off = f->off + k * f->kstep + j * f->jstep;
        if (j + 1 < nc) {
            unsigned b[4];
            ldsm4(b, f->B + off, f->trans);
            mma16(acc->v[j], a, b, bf);
            mma16(acc->v[j + 1], a, b + 2, bf);
            if (has_a2) {
                mma16(acc->v[j], a2, b, bf);
                mma16(acc->v[j + 1], a2, b + 2, bf);
            }
            if (f->B2) {
                ldsm4(b, f->B2 + off, f->trans);
                mma16(acc->v[j], a, b, bf);
                mma16(acc->v[j + 1], a, b + 2, bf);
            }
        } else {
            unsigned b[2];
            ldsm2(b, f->B + off, f->trans);
            mma16(acc->v[j], a, b, bf);
            if (has_a2) mma16(acc->v[j], a2, b, bf);
            if (f->B2) {
                ldsm2(b, f->B2 + off, f->trans);
                mma16(acc->v[j], a, b, bf);
            }
        }
    }
}

// The lane's row address inside the warp's 16 x 16 block of A at k = 0: A
// row-major (A(i, k) = A[i lda + k], or lda LD_CORE) or, with a_kmajor, by k (A(i, k) = A[k lda + i]).
static __device__ __forceinline__ int a_frag_off(int lda, int a_kmajor) {
    int l = lane_id(), m0 = 16 * (warp_id() & 3);
    if (lda == LD_CORE) return mat_off(m0 + (l & 15), (l >> 4) * 8, LD_CORE);
    return a_kmajor ? ((l & 7) + (l >> 4) * 8) * lda + m0 + ((l >> 3) & 1) * 8 : (m0 + (l & 15)) * lda + (l >> 4) * 8;
}
// The step of that address from k to k + 1 (k a multiple of 16 where lda is LD_CORE).
static __device__ __forceinline__ int a_frag_kstep(int lda, int a_kmajor) { return lda == LD_CORE ? 8 : a_kmajor ? lda : 1; }

// acc += (A + A2)[:, k0:k1] (B + B2)[k0:k1, :] less A2 B2, for this warp's part
// of the tile (nc n-tiles). 16-bit operands in smem, fp16 or, with bf, bf16
// (passed as __half pointers: ldmatrix moves bits); layouts as a_frag_off's and
// BFrag's. A2 and B2 (the low halves of split operands) may be NULL. k0, k1
// multiples of 16; strides of 16 mod 128 bytes (ldrow) keep ldmatrix free of
// bank conflicts.
static __device__ __forceinline__ void tile_mma_b16(Tile *acc, const __half *A, const __half *A2, int lda, int a_kmajor,
                                             const __half *B, const __half *B2, int ldb, int b_nmajor, int k0, int k1,
                                             int nc, int bf) {
    int a_off = a_frag_off(lda, a_kmajor), akstep = a_frag_kstep(lda, a_kmajor);
    BFrag f = b_frag_at(B, B2, ldb, b_nmajor, b_lane_off(lane_id(), (warp_id() >> 2) * 8 * nc, ldb, b_nmajor));
    for (int k = k0; k < k1; k += 16) {
        unsigned a[4], a2[4];
        ldsm4(a, A + a_off + k * akstep, a_kmajor);
        if (A2) ldsm4(a2, A2 + a_off + k * akstep, a_kmajor);
        mma_kstep(acc, a, a2, A2 != NULL, &f, k, nc, bf);
    }
}

#if WGMMA
#if MAXNT != 4
#error "the wgmma state term is written for 4 n-tiles a warp (m64n32)"
#endif
// The descriptor of a 16-bit operand in LD_CORE layout from p (16-byte aligned): core matrices
// 128 bytes apart along k (LBO), rows of them DP / 8 x 128 bytes apart along m or n (SBO), no
// swizzle. Its high word (SBO) is the same for every operand, so the products take the low word
// (the address and LBO) and add the high one themselves: half the registers per descriptor.
static __device__ __forceinline__ unsigned wg_desc(const __half *p) {
    return ((smem_u32(p) & 0x3FFFF) >> 4) | ((128 >> 4) << 16);
}
#define WG_DESC_HI (DP / 8 * 128 >> 4)

// Keeps the compiler from moving the accumulator's uses across the asynchronous product.
static __device__ __forceinline__ void wg_pin(Tile *acc) {
#pragma unroll
    for (int j = 0; j < MAXNT; j++)
        asm volatile("" : "+f"(acc->v[j][0]), "+f"(acc->v[j][1]), "+f"(acc->v[j][2]), "+f"(acc->v[j][3])::"memory");
}

// acc += A B for the warpgroup's 64 x 32 tile (warp w: rows 16 (w & 3).., the mma.sync layout),
// A and B from their descriptors (both k-major), issued asynchronously.
static __device__ __forceinline__ void wg_mma_n32(Tile *acc, unsigned da, unsigned db) {
    asm volatile(
        "{\n.reg .pred p;\n.reg .b64 da, db;\nsetp.ne.b32 p, 1, 0;\n"
        "mov.b64 da, {%16, %18};\nmov.b64 db, {%17, %18};\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, da, db, p, 1, 1, 0, 0;\n}\n"
        : "+f"(acc->v[0][0]), "+f"(acc->v[0][1]), "+f"(acc->v[0][2]), "+f"(acc->v[0][3]), "+f"(acc->v[1][0]),
          "+f"(acc->v[1][1]), "+f"(acc->v[1][2]), "+f"(acc->v[1][3]), "+f"(acc->v[2][0]), "+f"(acc->v[2][1]),
          "+f"(acc->v[2][2]), "+f"(acc->v[2][3]), "+f"(acc->v[3][0]), "+f"(acc->v[3][1]), "+f"(acc->v[3][2]),
          "+f"(acc->v[3][3])
        : "r"(da), "r"(db), "r"(WG_DESC_HI));
}

// Starts acc += A (Bh + Bl) for the warpgroup's 32 columns (w >> 2): A [64][DP] and B [DP][DP] in
// LD_CORE layout, B's rows read as its columns (B symmetric: the state H), over k = 0 .. DP.
// wg_state_wait completes it. Callers have made the operands visible to the async proxy
// (fence_async_smem, then a barrier).
//
// A descriptor's address field counts 16 bytes, and the block k .. k + 15 of a row of core matrices
// starts 16 k bytes after column 0: stepping over k adds k to the descriptor (no carry: shared
// addresses stay under 2^18). The bases are computed once, so that a product costs an add, not the
// descriptor's masks and shifts again (ptxas then keeps the descriptors in uniform registers).
static __device__ __forceinline__ void wg_state_start(Tile *acc, const __half *A, const __half *Bh, const __half *Bl) {
    // (the warpgroup's number broadcast from lane 0, so that ptxas knows it is the same across the
    // warp and keeps the descriptors in uniform registers: from warp_id() it moved each of them to
    // one (R2UR) before every product, 32 instructions a CG step)
    int n0 = __shfl_sync(0xffffffffu, warp_id() >> 2, 0) * 32;
    unsigned da = wg_desc(A), dh = wg_desc(Bh + mat_off(n0, 0, LD_CORE)), dl = wg_desc(Bl + mat_off(n0, 0, LD_CORE));
    wg_pin(acc);
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int k = 0; k < DP; k += 16) {
        wg_mma_n32(acc, da + k, dh + k);
        wg_mma_n32(acc, da + k, dl + k);
    }
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

static __device__ __forceinline__ void wg_state_wait(Tile *acc) {
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    wg_pin(acc);
}
#endif

// Orders this thread's writes to shared memory before later reads by the async proxy (wgmma).
static __device__ __forceinline__ void fence_async_smem() {
#if WGMMA
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

// The chunk kernels' fp16 products: A row-major.
static __device__ __forceinline__ void tile_mma16(Tile *acc, const __half *A, const __half *A2, int lda, const __half *B,
                                           const __half *B2, int ldb, int b_nmajor, int k0, int k1, int nc) {
    tile_mma_b16(acc, A, A2, lda, 0, B, B2, ldb, b_nmajor, k0, k1, nc, 0);
}

// floor(log2 m) for a positive normal m, clamped to [-100, 100]; 0 for zero, subnormal or non-finite m.
static __device__ __forceinline__ int log2_floor(float m) {
    int e = ((__float_as_int(m) >> 23) & 0xff) - 127;
    return (m > 0 && e > -127 && e < 128) ? max(-100, min(100, e)) : 0;
}

static __device__ __forceinline__ float pow2f_(int e) { return __int_as_float((127 + e) << 23); }  // 2^e, |e| <= 126
// 1 / x for x a power of two 2^e, |e| <= 126: exact, by negating the exponent (a division costs a
// reciprocal, its refinement and a branch to IEEE's slow path, in the CG loop's critical path).
static __device__ __forceinline__ float inv_pow2(float x) { return __int_as_float((254 << 23) - __float_as_int(x)); }

// The power of two that brings a largest magnitude m into [1, 2) (1 for m = 0).
static __device__ __forceinline__ float fp16_scale(float m) { return pow2f_(-log2_floor(m)); }

// fp16 hi + lo of v (both halves of a value pair)
static __device__ __forceinline__ void split_half2(float v0, float v1, __half2 *hi, __half2 *lo) {
    *hi = __floats2half2_rn(v0, v1);
    float2 h = __half22float2(*hi);
    *lo = __floats2half2_rn(v0 - h.x, v1 - h.y);
}

// Where the thread's tile elements lie in a matrix with row stride ld (or LD_CORE): the pair
// (f_row(i), f_col(j, 2 i, nc)) at frag_off + i frag_rstep + j frag_cstep. (Written as a base and
// constant steps, the addresses cost one add each; ptxas did not see that f_row and f_col move by
// whole 8 x 8 blocks, and recomputed mat_off's shifts and masks for every element at every CG step.)
static __device__ __forceinline__ int frag_off(int ld, int nc) { return mat_off(f_row(0), f_col(0, 0, nc), ld); }
static __device__ __forceinline__ int frag_rstep(int ld) { return ld == LD_CORE ? 8 * DP : 8 * ld; }
static __device__ __forceinline__ int frag_cstep(int ld) { return ld == LD_CORE ? 64 : 8; }

// Writes the tile, each row times its scale sc, into fp16 smem, row-major
// (M[r ld + c]; or LD_CORE); split hi + lo when lo is given.
static __device__ __forceinline__ void tile_put16(__half *hi, __half *lo, int ld, const Tile *t, const float sc[FR], int nc) {
    int o0 = frag_off(ld, nc), rs = frag_rstep(ld), cs = frag_cstep(ld);
#pragma unroll
    for (int j = 0; j < MAXNT; j++)
        if (j < nc)
#pragma unroll
            for (int i = 0; i < FR; i++) {
                int o = o0 + i * rs + j * cs;
                float v0 = t->v[j][2 * i] * sc[i], v1 = t->v[j][2 * i + 1] * sc[i];
                if (lo) split_half2(v0, v1, (__half2 *)(hi + o), (__half2 *)(lo + o));
                else *(__half2 *)(hi + o) = __floats2half2_rn(v0, v1);
            }
}

// The thread's partial sums of t_row . M_row (M fp16 in smem, row-major, times
// `scale`) for its rows; rows_join completes them.
static __device__ __forceinline__ void tile_rowdot16(float s[FR], const Tile *t, const __half *M, int ld, float scale, int nc) {
    s[0] = s[1] = 0;
#pragma unroll
    for (int j = 0; j < MAXNT; j++)
        if (j < nc)
#pragma unroll
            for (int i = 0; i < FR; i++) {
                float2 m = __half22float2(*(const __half2 *)(M + f_row(i) * ld + f_col(j, 2 * i, nc)));
                s[i] += scale * (t->v[j][2 * i] * m.x + t->v[j][2 * i + 1] * m.y);
            }
}

// ------------------------------------------------------------------ chunk loading

// One operand of a block in global memory: rows x cols values of a bf16 or
// float tensor, row r at p + r rstride elements, read as an rpad x cpad block
// (zero outside) in 16-byte vectors: 8 bf16 or 4 floats.
typedef struct {
    const void *p;
    size_t rstride;
    int rows, cols, rpad, cpad;
    int f32;  // float elements, else bf16
    int vec;  // every row starts 16-byte aligned: one load per vector, else element by element
} Src;

// Rows t0 .. t0+C of one (sequence, head) of a [B,T,H,d] tensor, padded to dpad columns.
static __device__ __forceinline__ Src tok_src(const void *p, int f32, int d, int dpad, const Geo *g, int pair, int t0, int vec) {
    size_t o = tok_index(g, pair, t0) * d;
    Src s = {f32 ? (const void *)((const float *)p + o) : (const void *)((const bf16 *)p + o), (size_t)g->H * d,
             min(CH, g->T - t0), d, CH, dpad, f32, vec};
    return s;
}

// A rows x cols float matrix (row stride cols), padded to rpad x cpad.
static __device__ __forceinline__ Src mat_src(const float *p, int rows, int cols, int rpad, int cpad, int vec) {
    Src s = {p, (size_t)cols, rows, cols, rpad, cpad, 1, vec};
    return s;
}

typedef union {
    uint4 u;
    float f[4];
    unsigned short h[8];  // bf16 bits
} Vec16;

static __device__ __forceinline__ float vec_at(const Vec16 *v, int i, int f32) {
    return f32 ? v->f[i] : __uint_as_float((unsigned)v->h[i] << 16);
}

// Asks the L2 for the n bytes at p, a 128-byte line a thread, so that a later phase's loads of
// them hit the L2 instead of waiting on DRAM with nothing else to run (one block fills a
// multiprocessor in the chunk kernels).
static __device__ __forceinline__ void l2_prefetch(const void *p, size_t n) {
    for (size_t o = (size_t)threadIdx.x * 128; o < n; o += (size_t)NT * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)p + o));
}
// The same for the rows of tokens t0.. of a token-major tensor [B, T, H, d] (es bytes an element).
static __device__ __forceinline__ void l2_prefetch_rows(const void *p, int es, int d, const Geo *g, int pair, int t0) {
    int n = min(CH, g->T - t0), lines = (d * es + 127) / 128;
    for (int e = threadIdx.x; e < n * lines; e += NT)
        asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)p + tok_index(g, pair, t0 + e / lines) * d * es + e % lines * 128));
}

// The thread's vectors u = 0 .. nv-1 of the block (vector threadIdx.x + u NT,
// row-major over the padded block) into registers. nv is a constant at every
// call, so that v stays in registers; every load is issued before any is used.
static __device__ __forceinline__ void stage_fetch(Vec16 *v, int nv, const Src *s) {
    int w = s->f32 ? 4 : 8, vpr = s->cpad / w;
#pragma unroll
    for (int u = 0; u < nv; u++) {
        int e = threadIdx.x + u * NT, r = e / vpr, c = e % vpr * w;
        v[u].u = make_uint4(0, 0, 0, 0);
        if (r >= s->rows || c >= s->cols) continue;
        size_t i = r * s->rstride + c;
        if (s->vec) {
            v[u].u = s->f32 ? *(const uint4 *)((const float *)s->p + i) : *(const uint4 *)((const bf16 *)s->p + i);
        } else if (s->f32) {
#pragma unroll
            for (int k = 0; k < 4; k++)
                if (c + k < s->cols) v[u].f[k] = ((const float *)s->p)[i + k];
        } else {
#pragma unroll
            for (int k = 0; k < 8; k++)
                if (c + k < s->cols) v[u].h[k] = ((const unsigned short *)s->p)[i + k];
        }
    }
}

// The largest magnitude among the thread's staged values.
static __device__ __forceinline__ float stage_absmax(const Vec16 *v, int nv, int f32) {
    float m = 0;
#pragma unroll
    for (int u = 0; u < nv; u++)
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (k < (f32 ? 4 : 8)) m = fmaxf(m, fabsf(vec_at(&v[u], k, f32)));
    return m;
}

// One vector (4 floats or 8 bf16 values, from column c of row r) times `scale` into fp16 smem,
// row-major (M[r ld + c]; or LD_CORE), split hi + lo when lo is given.
static __device__ __forceinline__ void vec_put16(const Vec16 *v, int f32, int r, int c, __half *hi, __half *lo, int ld,
                                                 float scale) {
    __half2 h[4], l[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        if (f32 && k >= 2) break;
        float a = vec_at(v, 2 * k, f32) * scale, b = vec_at(v, 2 * k + 1, f32) * scale;
        if (lo) split_half2(a, b, &h[k], &l[k]);
        else h[k] = __floats2half2_rn(a, b);
    }
    __half *dh = hi + mat_off(r, c, ld), *dl = lo ? lo + mat_off(r, c, ld) : NULL;
    if (!f32) {
        *(uint4 *)dh = *(const uint4 *)h;
        if (lo) *(uint4 *)dl = *(const uint4 *)l;
    } else {
        *(uint2 *)dh = *(const uint2 *)h;
        if (lo) *(uint2 *)dl = *(const uint2 *)l;
    }
}

// The staged values times `scale` into fp16 smem (vec_put16).
static __device__ __forceinline__ void stage_put16(const Vec16 *v, int nv, const Src *s, __half *hi, __half *lo, int ld,
                                            float scale) {
    int w = s->f32 ? 4 : 8, vpr = s->cpad / w;
#pragma unroll
    for (int u = 0; u < nv; u++) {
        int e = threadIdx.x + u * NT, r = e / vpr, c = e % vpr * w;
        if (r >= s->rpad) continue;
        vec_put16(&v[u], s->f32, r, c, hi, lo, ld, scale);
    }
}

// A batch of a block's operands into fp16 smem with every load in flight at
// once: n (at most 4) blocks of bf16 token rows, each exact at its own scale,
// and one fp32 block (nf vectors per thread, at most 8) split hi + lo. One
// reduction gives all the scales: sc[0..n-1] the rows', sc[n] the fp32
// block's. No barrier after the stores. Behind the batch's loads, the L2 is
// asked for the pf_bytes at pf (the next phase's operands; none if 0): ahead
// of them, such requests delayed the batch (measured).
static __device__ __forceinline__ void stage_batch16(float *sc, const Src *rows, __half *const *dst, const int *ld, int n,
                                              const Src *f, __half *fh, __half *fl, int fld, int nf, float *red,
                                              const void *pf, size_t pf_bytes) {
    Vec16 rv[4][CH * MAXD / 8 / NT], fv[MAXD * MAXD / 4 / NT];
#pragma unroll
    for (int i = 0; i < 4; i++)
        if (i < n) stage_fetch(rv[i], CH * MAXD / 8 / NT, &rows[i]);
    stage_fetch(fv, nf, f);
    l2_prefetch(pf, pf_bytes);
#pragma unroll
    for (int i = 0; i < 4; i++)
        if (i < n) sc[i] = stage_absmax(rv[i], CH * MAXD / 8 / NT, 0);
    sc[n] = stage_absmax(fv, nf, 1);
    block_max_n(sc, n + 1, red);
    for (int i = 0; i <= n; i++) sc[i] = fp16_scale(sc[i]);
#pragma unroll
    for (int i = 0; i < 4; i++)
        if (i < n) stage_put16(rv[i], CH * MAXD / 8 / NT, &rows[i], dst[i], NULL, ld[i], sc[i]);
    stage_put16(fv, nf, f, fh, fl, fld, sc[n]);
}

// 16 bytes from global to smem in the background (cp.async): `bytes` (16 or 0)
// are read, the rest zero-filled. cp_async_wait completes the thread's copies;
// a barrier after it publishes them to the block.
static __device__ __forceinline__ void cp_async16(void *dst, const void *src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_u32(dst)), "l"(src), "r"(bytes) : "memory");
}
// The same for 4 bytes (`bytes` 4 or 0), through L1 (.ca: 4-byte copies cannot bypass it).
static __device__ __forceinline__ void cp_async4(void *dst, const void *src, int bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem_u32(dst)), "l"(src), "r"(bytes) : "memory");
}
static __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_all;" ::: "memory"); }
static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most n of the thread's committed groups are still in flight (n a literal: an
// immediate of the instruction, hence a macro).
#define CP_ASYNC_WAIT_GROUPS(n) asm volatile("cp.async.wait_group " #n ";" ::: "memory")

// n floats from global to smem (16-byte aligned) in the background, the block's nt threads
// striding: 16-byte copies when src and n allow, else 4-byte ones.
static __device__ void copy_async_f32(float *dst, const float *src, int n, int nt) {
    if ((uintptr_t)src % 16 == 0 && n % 4 == 0)
        for (int e = 4 * threadIdx.x; e < n; e += 4 * nt) cp_async16(dst + e, src + e, 16);
    else
        for (int e = threadIdx.x; e < n; e += nt) cp_async4(dst + e, src + e, 4);
}

// The block of s (rpad x cpad, zero outside rows x cols) into smem as it is,
// bf16 or float, row-major with stride ld elements: 16-byte copies in the
// background, or element by element (at once) when rows are not 16-byte aligned.
static __device__ void stage_raw(void *dst, int ld, const Src *s) {
    int es = s->f32 ? 4 : 2, w = 16 / es, vpr = s->cpad / w;
    for (int e = threadIdx.x; e < s->rpad * vpr; e += NT) {
        int r = e / vpr, c = e % vpr * w, in = r < s->rows && c < s->cols;
        char *d = (char *)dst + ((size_t)r * ld + c) * es;
        const char *p = (const char *)s->p + ((size_t)r * s->rstride + c) * es;
        if (s->vec) {
            cp_async16(d, in ? p : s->p, in ? 16 : 0);
        } else if (s->f32) {
            for (int k = 0; k < w; k++) ((float *)d)[k] = in && c + k < s->cols ? ((const float *)p)[k] : 0.0f;
        } else {
            for (int k = 0; k < w; k++)
                ((unsigned short *)d)[k] = in && c + k < s->cols ? ((const unsigned short *)p)[k] : 0;
        }
    }
}

// One warp (warp 0 of the block, or of a scan block's warpgroup): a chunk's log decays and betas
// of tokens lane and lane + 32 (0 past the end) into smem in the background (cp.async;
// cp_async_wait completes it): glog[t], beta[t].
// (Fetched into registers a chunk ahead, the scan kept them across the chunk's products and ptxas
// spilled them: warp 0 then waited for the loads before every chunk's barrier, and the block with it.)
static __device__ __forceinline__ void fetch_decays_async(float *glog, float *beta, const float *g_log, const float *g_beta,
                                                   const Geo *g, int pair, int t0) {
    int n = min(CH, g->T - t0);
    size_t base = tok_index(g, pair, t0);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int t = lane_id() + 32 * h, in = t < n;
        size_t i = in ? base + (size_t)t * g->H : 0;
        cp_async4(glog + t, g_log + i, in ? 4 : 0);
        cp_async4(beta + t, g_beta + i, in ? 4 : 0);
    }
}

// A warp: b = the inclusive cumulative sum over the chunk of the fetched log
// decays, for tokens lane and lane + 32 (a warp scan; rows past the end repeat the last).
static __device__ __forceinline__ void chunk_cumsum(float b[2], const float glog[2]) {
    float run = 0;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float v = glog[h];
        for (int o = 1; o < 32; o <<= 1) {
            float u = __shfl_up_sync(0xffffffffu, v, o);
            if (lane_id() >= o) v += u;
        }
        b[h] = run + v;
        run += __shfl_sync(0xffffffffu, v, 31);
    }
}

// A chunk kernel's small first loads, in two steps: chunk_fetch requests them (cp.async, one
// committed group) before the chunk's large operands, behind which their latency held up the
// chunk's constants that wait on them (measured); chunk_put waits for that group alone and
// cumulates b. Warp 0: the raw log decays into b, and beta; threads below DP, where lam is given:
// lambda (1 past Dk). (cg_backward loads lambda after its operands: with it here, ptxas spilled
// 64 bytes there and the kernel was no faster.)
static __device__ __forceinline__ void chunk_fetch(float *b, float *beta, float *lam, const float *g_log, const float *g_beta,
                                                   const float *lambda, const Geo *g, int pair, int t0) {
    if (threadIdx.x < 32) fetch_decays_async(b, beta, g_log, g_beta, g, pair, t0);
    int i = threadIdx.x;
    if (lam && i < DP) {
        if (i < g->Dk) cp_async4(lam + i, lambda + (size_t)(pair % g->H) * g->Dk + i, 4);
        else lam[i] = 1.0f;
    }
    cp_async_commit();
}

// Once the group of chunk_fetch has landed: b, the cumulative log decay (rows past the end repeat
// the last). Callers synchronise before reading b, beta and lambda.
static __device__ __forceinline__ void chunk_put(float *b) {
    CP_ASYNC_WAIT_GROUPS(0);  // (the copies issued since are not committed yet: not waited for)
    if (threadIdx.x < 32) {
        float gl[2] = {b[threadIdx.x], b[threadIdx.x + 32]}, c[2];
        chunk_cumsum(c, gl);
        __syncwarp();
        b[threadIdx.x] = c[0];
        b[threadIdx.x + 32] = c[1];
    }
}

// The thread's tiles against rows t0 .. t0+C of a [B,T,H,d] tensor (zero past T
// and d): a thread's two adjacent columns are one 4-byte (bf16) or 8-byte (float)
// access where d is even and the tensor so aligned, else two.
static __device__ __forceinline__ int pairs_ok(const void *p, int d, int size) {
    return d % 2 == 0 && (uintptr_t)p % (2 * size) == 0;
}

static __device__ void tile_load(Tile *t, const bf16 *src, const Geo *g, int pair, int t0, int d, int nc) {
    int two = pairs_ok(src, d, 2);
#pragma unroll
    for (int j = 0; j < MAXNT; j++)
#pragma unroll
        for (int i = 0; i < FR; i++) {
            int tt = t0 + f_row(i), c = f_col(j, 2 * i, nc);
            float2 v = make_float2(0.0f, 0.0f);
            if (j < nc && tt < g->T && c < d) {
                const bf16 *p = src + tok_index(g, pair, tt) * d + c;
                if (two) v = __bfloat1622float2(*(const __nv_bfloat162 *)p);
                else v = make_float2(ld(p, 0), c + 1 < d ? ld(p, 1) : 0.0f);
            }
            t->v[j][2 * i] = v.x;
            t->v[j][2 * i + 1] = v.y;
        }
}

// Stores the thread's tile to rows t0 .. of a [B,T,H,d] tensor of bf16 or (f32) float.
static __device__ void tile_store(void *dst, int f32, const Tile *t, const Geo *g, int pair, int t0, int d, int nc) {
    int two = pairs_ok(dst, d, f32 ? 4 : 2);
#pragma unroll
    for (int j = 0; j < MAXNT; j++)
#pragma unroll
        for (int i = 0; i < FR; i++) {
            int tt = t0 + f_row(i), c = f_col(j, 2 * i, nc);
            if (j >= nc || tt >= g->T || c >= d) continue;
            size_t o = tok_index(g, pair, tt) * d + c;
            float a = t->v[j][2 * i], b = t->v[j][2 * i + 1];
            if (f32 && two) {
                *(float2 *)((float *)dst + o) = make_float2(a, b);
            } else if (two) {
                *(__nv_bfloat162 *)((bf16 *)dst + o) = __floats2bfloat162_rn(a, b);
            } else if (f32) {
                ((float *)dst)[o] = a;
                if (c + 1 < d) ((float *)dst)[o + 1] = b;
            } else {
                st((bf16 *)dst, o, a);
                if (c + 1 < d) st((bf16 *)dst, o + 1, b);
            }
        }
}

// The thread's tile of a [CH][ld] bf16 block in smem (nc n-tiles).
static __device__ __forceinline__ void tile_from_bf16(Tile *t, const bf16 *m, int ld, int nc) {
#pragma unroll
    for (int j = 0; j < MAXNT; j++)
#pragma unroll
        for (int i = 0; i < FR; i++) {
            float2 v = j < nc ? __bfloat1622float2(*(const __nv_bfloat162 *)(m + f_row(i) * ld + f_col(j, 2 * i, nc)))
                              : make_float2(0.0f, 0.0f);
            t->v[j][2 * i] = v.x;
            t->v[j][2 * i + 1] = v.y;
        }
}

// ------------------------------------------------------------------ the GLA forms

// The chunk's causal decay mask at (row r, column s): forward (dir 0)
// e^{b_r - b_s} beta_s for s <= r; backward (dir 1) e^{b_s - b_r} for s >= r.
static __device__ __forceinline__ float chunk_mask(const float *b, const float *beta, int r, int s, int dir) {
    if (dir == 0) return s <= r ? __expf(b[r] - b[s]) * beta[s] : 0.0f;
    return s >= r ? __expf(b[s] - b[r]) : 0.0f;
}

// Whether the warp's block of a 64 x 64 tile of scores (rows 16 (w & 3).., CH / NCG columns from
// (w >> 2) CH / NCG) lies wholly outside the mask of direction dir, so that its product can be
// skipped: the mask would zero it. At NCG 4, 6 of the 16 warps (about a tenth of a CG step's
// operand traffic through shared memory, where the loop is bound: 2.8% of the layer's
// forward+backward at 8 x 2048 x 16 x 128).
static __device__ __forceinline__ int scores_masked_out(int dir) {
    int r0 = 16 * (warp_id() & 3), c0 = (warp_id() >> 2) * (CH / NCG);
    return dir == 0 ? c0 > r0 + 15 : c0 + CH / NCG - 1 < r0;
}

// Multiplies a 64 x 64 tile of scores by the mask of direction dir.
static __device__ __forceinline__ void tile_mask(Tile *t, const float *b, const float *beta, int dir) {
#pragma unroll
    for (int j = 0; j < NTILES(CH); j++)
#pragma unroll
        for (int e = 0; e < 4; e++) t->v[j][e] *= chunk_mask(b, beta, f_row(e >> 1), f_col(j, e, NTILES(CH)), dir);
}

// The same with the forward mask precomputed in fragment order (chunk_consts): a 16-byte load per n-tile.
static __device__ __forceinline__ void tile_mask_f(Tile *t, const float *Mf) {
    const float4 *m = (const float4 *)(Mf + MFN * threadIdx.x);
#pragma unroll
    for (int j = 0; j < NTILES(CH); j++) {
        float4 v = m[j];
        t->v[j][0] *= v.x;
        t->v[j][1] *= v.y;
        t->v[j][2] *= v.z;
        t->v[j][3] *= v.w;
    }
}

// Shared-memory layout of the CG kernels: regions of floats, most of them
// holding fp16 operands (DP: the padded head size).
typedef struct {
    float *Hs;   // [DP][ldrow(DP)] the state term's matrix hi + lo (H; G for the output and the rhs)
    float *Kp;   // [CH][ldrow(DP)] the chunk's keys and CG's direction
    float *Bm;   // [CH][ldrow(DP)] X hi + lo (the forward's output) or Delta (the backward's rhs)
    float *St;   // [CH][LDT] the masked scores, hi + lo
    float *Dg;   // [CH][DP]  the Jacobi diagonal; then V (the output and the rhs)
    float *b, *beta, *lam, *red;  // [CH], [CH], [DP], [NCG][CH] (tile_dot's, at least DP)
    float *red2;                  // [NCG][CH] a second one (the CG loop alternates them)
    // constant over the chunk, in the thread's fragment order (chunk_consts)
    float *Mf;    // [NT][MFN] the forward mask at the thread's elements of a 64 x 64 tile
    float *eb;    // [CH] e^{b_row}
    float *lamf;  // [NCG][4][2 MAXNT] lambda at the columns of a DP-wide tile's fragments
} Smem;

static size_t smem_floats(void) {
    return (size_t)DP * ldrow(DP) + 2 * CH * ldrow(DP) + (size_t)CH * LDT + CH * DP + 2 * CH + DP + 2 * NCG * CH +
           (size_t)NT * MFN + CH + NCG * 4 * 2 * MAXNT;
}

static __device__ Smem carve(float *base, const Geo *g) {
    Smem s;
    s.Hs = base;
    s.Kp = s.Hs + DP * ldrow(DP);
    s.St = s.Kp + CH * ldrow(DP);
    s.Bm = s.St + CH * LDT;
    s.Dg = s.Bm + CH * ldrow(DP);  // right after Bm: the two hold the forward's staged G (stage_g)
    s.b = s.Dg + CH * DP;
    s.beta = s.b + CH;
    s.lam = s.beta + CH;
    s.red = s.lam + DP;
    s.red2 = s.red + NCG * CH;
    s.Mf = s.red2 + NCG * CH;  // 16-byte aligned: every region above is a multiple of 4 floats
    s.eb = s.Mf + NT * MFN;
    s.lamf = s.eb + CH;
    return s;
}

// u[i] = e^{b_{n-1} - b_row}, the decay from the thread's rows to the end of a chunk of n tokens.
static __device__ __forceinline__ void decay_to_end(float u[FR], const float *b, int n) {
#pragma unroll
    for (int i = 0; i < FR; i++) u[i] = __expf(b[n - 1] - b[f_row(i)]);
}

// lambda at the thread's columns of a DP-wide tile: element (j, e) is lambda[2 j + (e & 1)].
static __device__ __forceinline__ float *lam_frag(const Smem *s) {
    return s->lamf + ((warp_id() >> 2) * 4 + (lane_id() & 3)) * 2 * MAXNT;
}
// Whether this thread writes its lam_frag (one writer per column group and lane & 3).
static __device__ __forceinline__ int lamf_writer() { return (lane_id() >> 2) == 0 && (warp_id() & 3) == 0; }

// The chunk's constants that CG would otherwise recompute at every step, in
// the order the threads read them: the forward mask, e^b, lambda (s->b,
// s->beta and s->lam loaded and synchronized). Ends synchronized.
static __device__ void chunk_consts(const Smem *s, const Geo *g) {
    int nc = NTILES(DP);
#pragma unroll
    for (int j = 0; j < NTILES(CH); j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            s->Mf[MFN * threadIdx.x + 4 * j + e] = chunk_mask(s->b, s->beta, f_row(e >> 1), f_col(j, e, NTILES(CH)), 0);
    for (int r = threadIdx.x; r < CH; r += NT) s->eb[r] = __expf(s->b[r]);
    if (lamf_writer())
        for (int j = 0; j < nc; j++)
            for (int e = 0; e < 2; e++) lam_frag(s)[2 * j + e] = s->lam[f_col(j, e, nc)];
    __syncthreads();
}

// The CG operator's fp16 operands, carved from the Smem regions. Every value is held
// times a power-of-two scale, so rounding to fp16 loses nothing but what is
// stated at tile_mma16.
typedef struct {
    __half *Hh, *Hl;  // [DP][ldrow(DP)] the state times sH, hi + lo, in LD_OP layout
    __half *K;        // [CH][ldrow(DP)] the chunk's keys times sK
    __half *P;        // [CH][ldrow(DP)] the direction, each row times its scale (LD_OP layout)
    __half *Sh, *Sl;  // [CH][ldrow(CH)] the masked scores (scaled), hi + lo
    float sH, sK;
} Op16;

static __device__ Op16 op16_carve(const Smem *s, const Geo *g) {
    int ld = ldrow(DP);
    Op16 o;
    o.Hh = (__half *)s->Hs;
    o.Hl = o.Hh + DP * ld;
    o.K = (__half *)s->Kp;  // with P: CH ldrow(DP) floats
    o.P = o.K + CH * ld;
    o.Sh = (__half *)s->St;  // both halves: exactly St
    o.Sl = o.Sh + CH * ldrow(CH);
    o.sH = o.sK = 1;
    return o;
}

// Starts copying the chunk's operator into smem as it is, in the background (stage_raw), for
// op16_load to take into fp16 once the chunk's constants are worked out: the state (Hg: [Dk][Dk]
// float, global) into Bm and Dg (free until stage_g), the keys into the scores' region and the
// queries into the direction's (both free until CG starts). (Fetched into registers after the
// constants, the loads had waited alone: ncu put a tenth of cg_forward's samples on them.)
static __device__ void op16_stage(const Op16 *o, const Smem *s, const float *Hg, const bf16 *kg, const bf16 *qg, int vec,
                                  const Geo *g, int pair, int t0) {
    Src keys = tok_src(kg, 0, g->Dk, DP, g, pair, t0, vec), state = mat_src(Hg, g->Dk, g->Dk, DP, DP, vec);
    Src qs = tok_src(qg, 0, g->Dk, DP, g, pair, t0, vec);
    stage_raw(s->Bm, DP, &state);
    stage_raw(s->St, ldrow(DP), &keys);
    stage_raw(o->P, ldrow(DP), &qs);
}

// Blocks copied raw into smem (stage_raw), then taken into fp16 by the block: R holds CH rows of
// DP bf16 values (stride ld), F DP rows of DP floats (stride DP). raw16_absmax and raw32_absmax:
// the thread's share of the largest magnitude; raw16_put and raw32_put: the values times `scale`
// into fp16 (vec_put16; F split hi + lo).
static __device__ __forceinline__ float raw16_absmax(const bf16 *R, int ld) {
    float m = 0;
    for (int e = threadIdx.x; e < CH * DP / 8; e += NT) {
        Vec16 v;
        v.u = *(const uint4 *)(R + e / (DP / 8) * ld + e % (DP / 8) * 8);
        m = fmaxf(m, stage_absmax(&v, 1, 0));
    }
    return m;
}
static __device__ __forceinline__ void raw16_put(const bf16 *R, int ld, __half *dst, int ldd, float scale) {
    for (int e = threadIdx.x; e < CH * DP / 8; e += NT) {
        int r = e / (DP / 8), c = e % (DP / 8) * 8;
        Vec16 v;
        v.u = *(const uint4 *)(R + r * ld + c);
        vec_put16(&v, 0, r, c, dst, NULL, ldd, scale);
    }
}
static __device__ __forceinline__ float raw32_absmax(const float *F) {
    float m = 0;
    for (int e = threadIdx.x; e < DP * DP / 4; e += NT) {
        Vec16 v;
        v.u = *(const uint4 *)(F + 4 * e);
        m = fmaxf(m, stage_absmax(&v, 1, 1));
    }
    return m;
}
static __device__ __forceinline__ void raw32_put(const float *F, __half *hi, __half *lo, int ld, float scale) {
    for (int e = threadIdx.x; e < DP * DP / 4; e += NT) {
        Vec16 v;
        v.u = *(const uint4 *)(F + 4 * e);
        vec_put16(&v, 1, e / (DP / 4), e % (DP / 4) * 4, hi, lo, ld, scale);
    }
}

// The staged state and keys (op16_stage) into fp16, scaled so that their largest magnitudes lie
// in [1, 2), the state split hi + lo; the queries into the tile q. Ends synchronized.
static __device__ void op16_load(Op16 *o, const Smem *s, Tile *q) {
    static_assert(DP * DP <= CH * ((DP + 8) + DP), "Bm and Dg (ldrow: n + 8) hold the raw state");
    static_assert(CH * (DP + 8) <= 2 * CH * LDT, "St holds the raw keys");
    const bf16 *K = (const bf16 *)s->St;
    int ld = ldrow(DP);
    cp_async_wait();
    __syncthreads();
    float m[2] = {raw16_absmax(K, ld), raw32_absmax(s->Bm)};  // the keys', the state's
    block_max_n(m, 2, s->red);
    o->sK = fp16_scale(m[0]);
    o->sH = fp16_scale(m[1]);
    raw16_put(K, ld, o->K, ld, o->sK);
    raw32_put(s->Bm, o->Hh, o->Hl, LD_OP, o->sH);
    __syncthreads();
    tile_from_bf16(q, (const bf16 *)o->P, ld, NTILES(DP));
}

// The state alone into fp16 (as op16_load does), from registers: hv, fetched ahead
// by stage_fetch from `state`. Every thread must be done with the previous
// contents of o->Hh, o->Hl (block_max_n's first barrier orders them). Ends
// synchronized.
static __device__ void op16_put_state(Op16 *o, const Smem *s, const Vec16 *hv, const Src *state, const Geo *g) {
    float m = stage_absmax(hv, MAXD * MAXD / 4 / NT, 1);
    block_max_n(&m, 1, s->red);
    o->sH = fp16_scale(m);
    stage_put16(hv, MAXD * MAXD / 4 / NT, state, o->Hh, o->Hl, LD_OP, o->sH);
    __syncthreads();
}

// Per-row power-of-two scales from norm2 (the row's squared norm, or CG's
// r.z) that bring the row's norm near [1/4, 1/2), far inside fp16's range.
// (floor(log2 sqrt(n)) = floor(floor(log2 n) / 2): no square root needed.)
static __device__ __forceinline__ void row_scales16(float sc[FR], const float norm2[FR]) {
#pragma unroll
    for (int i = 0; i < FR; i++) sc[i] = pow2f_(-((log2_floor(norm2[i]) >> 1) + 2));
}

// Rounds each of the tile's (DP-wide) rows to fp16 at its scale (row_scales16, returned in sc),
// stores the rounded rows, times their scales, into P ([CH][DP], LD_OP layout: the operand of the
// next product, fenced for wgmma; the caller's next barrier publishes it) and keeps them in t: the
// exact values of the operand, which the caller uses instead of the unrounded ones, in true units
// or, without true_units, as stored (times the scales: CG folds the scales into its step lengths).
static __device__ __forceinline__ void round_put_rows16(Tile *t, float sc[FR], const float norm2[FR], __half *P,
                                                        int true_units) {
    row_scales16(sc, norm2);
    float inv[FR] = {inv_pow2(sc[0]), inv_pow2(sc[1])};
    int o0 = frag_off(LD_OP, NTILES(DP)), rs = frag_rstep(LD_OP), cs = frag_cstep(LD_OP);
#pragma unroll
    for (int j = 0; j < NTILES(DP); j++)
#pragma unroll
        for (int i = 0; i < FR; i++) {
            __half2 h = __floats2half2_rn(t->v[j][2 * i] * sc[i], t->v[j][2 * i + 1] * sc[i]);
            *(__half2 *)(P + o0 + i * rs + j * cs) = h;
            float2 f = __half22float2(h);
            t->v[j][2 * i] = true_units ? f.x * inv[i] : f.x;
            t->v[j][2 * i + 1] = true_units ? f.y * inv[i] : f.y;
        }
    fence_async_smem();  // (P, and the state and keys written before CG)
}

// The operands of a forward GLA form of the chunk, fp16 in smem, each times
// a power of two (rows of A each times their own):
//   out = e^b (.) A S + ((A B^T) (.) M) R
// (M the forward mask; A [CH][k] row-major; S [k][n] hi + lo, stored by k or,
// with s_nmajor, by n; B [CH][k] and R [CH][n] row-major). Forms: the CG
// operator (A = P, S = H, B = R = K), the forward's output (A = X, S = G^T,
// B = K, R = V), the backward's right-hand side (A = Delta, S = G, B = V, R = K).
typedef struct {
    const __half *Ah, *Al;  // Al: NULL when A is exact in fp16
    const __half *Sh, *Sl;
    const __half *B, *R;
    int lda, lds, ldb, ldr;
    int s_nmajor;
    int dk, nc;             // A's columns (padded), the output's n-tiles
    float sS, sB, sR;       // the scales of S, B, R
} Gla16;

// The scores tile masked (unless the mask zeroes all of it: skip) and split into fp16 hi + lo.
static __device__ __forceinline__ void put_scores(Tile *sc, int skip, __half *Sh, __half *Sl, const Smem *s) {
    const float one[FR] = {1.0f, 1.0f};
    if (!skip) tile_mask_f(sc, s->Mf);
    tile_put16(Sh, Sl, ldrow(CH), sc, one, NTILES(CH));
}

// acc = the form, for the thread's rows (sa: the scales of A's rows), through
// the fp16 scores buffers Sh, Sl ([CH][ldrow(CH)], hi + lo), with the chunk's
// constants (chunk_consts). Evaluated on the
// scaled operands as
//   [ (e^b sB sR / sS) (.) (A S)^ + ((A B^T)^ (.) M) R^ ] / (sa sB sR),
// or, without scale_out, the same times (sa sB sR): the form of the scaled A.
// Callers have synchronized since writing the operands and since the last
// reads of Sh, Sl.
static __device__ __forceinline__ void tile_gla16(Tile *acc, const Gla16 *f, const float sa[FR], __half *Sh, __half *Sl,
                                           const Smem *s, int scale_out) {
    // the scores A B^T and the state term A S in one pass over k, which loads each k-step's fragments
    // of A once for both (1.5% of the layer's forward+backward at 8 x 2048 x 16 x 128, when the
    // state term still ran on mma.sync and shared-memory traffic bound the CG loop; docs/cuda.md)
    Tile sc;
    tile_zero(&sc);
    tile_zero(acc);
    int skip = scores_masked_out(0), a_off = a_frag_off(f->lda, 0), ak = a_frag_kstep(f->lda, 0);
    int l = lane_id(), cg = warp_id() >> 2;
    BFrag fb = b_frag_at(f->B, NULL, f->ldb, 1, b_lane_off(l, cg * 8 * NTILES(CH), f->ldb, 1));
#if WGMMA
    if (f->lds == LD_CORE) {  // the CG operator (A = P exact in fp16, S = H symmetric): the state term
                              // by wgmma, running while the scores' pass loads its own fragments
        wg_state_start(acc, f->Ah, f->Sh, f->Sl);
        if (!skip)
            for (int k = 0; k < f->dk; k += 16) {
                unsigned a[4];
                ldsm4(a, f->Ah + a_off + k * ak, 0);
                mma_kstep(&sc, a, a, 0, &fb, k, NTILES(CH), 0);
            }
        put_scores(&sc, skip, Sh, Sl, s);  // while the state term runs
        wg_state_wait(acc);
    } else
#endif
    {
        BFrag fs = b_frag_at(f->Sh, f->Sl, f->lds, f->s_nmajor, b_lane_off(l, cg * 8 * f->nc, f->lds, f->s_nmajor));
        for (int k = 0; k < f->dk; k += 16) {
            unsigned a[4], a2[4];
            ldsm4(a, f->Ah + a_off + k * ak, 0);
            if (f->Al) ldsm4(a2, f->Al + a_off + k * ak, 0);
            if (!skip) mma_kstep(&sc, a, a2, f->Al != NULL, &fb, k, NTILES(CH), 0);
            mma_kstep(acc, a, a2, f->Al != NULL, &fs, k, f->nc, 0);
        }
        put_scores(&sc, skip, Sh, Sl, s);
    }
    float d[FR], inv[FR];
#pragma unroll
    for (int i = 0; i < FR; i++) {
        d[i] = s->eb[f_row(i)] * (f->sB * f->sR * inv_pow2(f->sS));
        inv[i] = inv_pow2(sa[i] * f->sB * f->sR);
    }
    tile_scale_rows(acc, d);
    __syncthreads();  // the scores are complete
    // the scores times R, over the causal range of the warp's rows
    tile_mma16(acc, Sh, Sl, ldrow(CH), f->R, NULL, f->ldr, 0, 0, 16 * (warp_id() & 3) + 16, f->nc);
    if (scale_out) tile_scale_rows(acc, inv);
}

// sK^2 A(P) = sK^2 [e^b (.) P Hc + ((P K^T) (.) M) K + lambda (.) P] for the tile's rows,
// P the direction on its rows' fp16 grids times their scales sp, as stored in o->P by
// round_put_rows16 and as passed in p: so A(P) is sp (.) A(p) for the direction p in true
// units, and the result is kept in the units of the scaled products (sp sK^2), which cg_solve
// folds into its step lengths (the scalings back cost two multiplies an element a step). The
// lambda term takes lamf times sK^2 (cg_solve). Rows that stopped pass p = 0. Callers have
// synchronized since writing o->P and since the last reads of o->S (cg_solve: the dots' barriers).
static __device__ void apply_operator(Tile *ap, const Tile *p, const float sp[FR], const Smem *s, const Op16 *o, const Geo *g) {
    int nc = NTILES(DP);
    Gla16 f = {o->P, NULL, o->Hh, o->Hl, o->K, o->K, LD_OP, LD_OP, ldrow(DP), ldrow(DP), 0, DP, nc, o->sH, o->sK, o->sK};
    tile_gla16(ap, &f, sp, o->Sh, o->Sl, s, 0);
    const float *lam = lam_frag(s);
#pragma unroll
    for (int j = 0; j < MAXNT; j++)
        if (j < nc) {
            float2 l = *(const float2 *)(lam + 2 * j);
            ap->v[j][0] += l.x * p->v[j][0];
            ap->v[j][1] += l.y * p->v[j][1];
            ap->v[j][2] += l.x * p->v[j][2];
            ap->v[j][3] += l.y * p->v[j][3];
        }
}

// The Jacobi diagonal of each row's A_t into Dg: e^{b_t} diag(Hc) + sum_{s<=t} e^{b_t-b_s} beta_s k_s^2 + lambda
// (from the fp16 operands: a preconditioner need not be exact).
static __device__ void jacobi_diagonal(const Smem *s, const Op16 *o, const Geo *g) {
    int ld = ldrow(DP);
    float ih = 1.0f / o->sH, ik2 = 1.0f / (o->sK * o->sK);
    for (int e = threadIdx.x; e < CH * DP; e += NT) {
        int r = e / DP, c = e % DP;
        float hc = __half2float(o->Hh[mat_off(c, c, LD_OP)]) + __half2float(o->Hl[mat_off(c, c, LD_OP)]);
        float acc = __expf(s->b[r]) * hc * ih + s->lam[c];
        for (int t = 0; t <= r; t++) {
            float kv = __half2float(o->K[t * ld + c]);
            acc += __expf(s->b[r] - s->b[t]) * s->beta[t] * kv * kv * ik2;
        }
        s->Dg[r * DP + c] = acc;
    }
    __syncthreads();
}

// Whether CG uses the Jacobi diagonal (in Dg): preconditioned, or starting from q / diag.
static __device__ __forceinline__ int cg_jacobi(const Geo *g) { return g->precond || g->init == MN_CG_INIT_JACOBI; }

// z = r / diag (Jacobi) or r.
static __device__ __forceinline__ void precondition(Tile *z, const Tile *r, const Smem *s, const Geo *g, int use) {
    int nc = NTILES(DP);
#pragma unroll
    for (int j = 0; j < MAXNT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            z->v[j][e] = (use && j < nc) ? r->v[j][e] / s->Dg[f_row(e >> 1) * DP + f_col(j, e, nc)] : r->v[j][e];
}

// Conjugate gradient for the chunk's rows (spec section 2): q in, x out,
// steps per row, with the operator o (op16_load: the chunk's entry state and
// keys). A row stops at its tolerance (or the floor); the block
// stops when all rows have, or after max_steps. Stopped rows carry p = 0;
// every thread runs every step (the dots synchronize the block).
//
// The directions p are rounded to fp16 at a per-row scale (11 bits), so the
// operator takes p in one tensor-core pass. x and r are updated with the same
// rounded p and its exact image A p, so r stays the residual of x and the
// stopping test keeps its meaning; only conjugacy is perturbed (relative
// 2^-12), which can cost a step, not accuracy. A starting guess is rounded
// the same way (it is only a guess).
static __device__ void cg_solve(Tile *x, const Tile *q, const Smem *s, const Geo *g, const Op16 *op, int steps[FR],
                                const Tile *x0, int use_given) {
    int nc = NTILES(DP), jac = cg_jacobi(g);
    const Op16 o = *op;
    Tile r, p, ap;
    float sp[FR], c = o.sK * o.sK;  // (apply_operator's units: sp c A p)
    if (lamf_writer())  // lambda in those units
        for (int j = 0; j < 2 * NTILES(DP); j++) lam_frag(s)[j] *= c;
    __syncthreads();
    if (jac) jacobi_diagonal(s, &o, g);
    if (use_given) {
        *x = *x0;
    } else if (g->init == MN_CG_INIT_JACOBI) {
        precondition(x, q, s, g, 1);
    } else {
        tile_zero(x);
    }
    int guess = use_given || g->init == MN_CG_INIT_JACOBI;  // else x = 0 and r = q
    if (guess) {
        float xx[FR];
        tile_dot(xx, x, x, nc, s->red, 0);
        round_put_rows16(x, sp, xx, o.P, 1);
        __syncthreads();
        float u[FR] = {inv_pow2(sp[0] * c), inv_pow2(sp[1] * c)};
#pragma unroll
        for (int j = 0; j < MAXNT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) p.v[j][e] = x->v[j][e] * sp[e >> 1];  // the guess as stored
        apply_operator(&ap, &p, sp, s, &o, g);
#pragma unroll
        for (int j = 0; j < MAXNT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) r.v[j][e] = q->v[j][e] - ap.v[j][e] * u[e >> 1];
    } else {
        r = *q;
    }
    float qq[FR], rr[FR], rz[FR], thresh[FR];
    int active[FR];
    tile_dot(qq, q, q, nc, s->red, 0);
    if (guess) tile_dot(rr, &r, &r, nc, s->red, 0);
    else
#pragma unroll
        for (int i = 0; i < FR; i++) rr[i] = qq[i];
    precondition(&p, &r, s, g, g->precond);
    if (g->precond) tile_dot(rz, &r, &p, nc, s->red, 0);
    else
#pragma unroll
        for (int i = 0; i < FR; i++) rz[i] = rr[i];  // z = r
#pragma unroll
    for (int i = 0; i < FR; i++) {
        thresh[i] = g->tol2 * qq[i];
        active[i] = rr[i] > thresh[i];
        steps[i] = 0;
    }
#pragma unroll
    for (int j = 0; j < MAXNT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            if (!active[e >> 1]) p.v[j][e] = 0.0f;
    round_put_rows16(&p, sp, rz, o.P, 0);
    // p is kept as stored, sp (.) p in true units, and Ap as apply_operator returns it, c sp (.) A p:
    // so p.Ap comes out times c sp^2, and the updates of x, r and p take the step lengths over
    // those factors (powers of two: exact).
    for (int step = 1; step <= g->max_steps; step++) {
        if (!__syncthreads_or(active[0] | active[1])) break;  // (also publishes P)
        apply_operator(&ap, &p, sp, s, &o, g);
        float pap[FR], ax[FR], ar[FR];
        // (the loop's dots join through red, red2, red in turn: each buffer's last readers have
        // passed a barrier since, so that a join needs one barrier, not two)
        tile_dot(pap, &p, &ap, nc, s->red, 1);
#pragma unroll
        for (int i = 0; i < FR; i++) {
            if (active[i] && (!(pap[i] > 0) || !(rz[i] > 0))) active[i] = 0;  // converged exactly, or non-finite input
            // __fdividef (2 ulp): a step length, with which x and r move alike, needs no IEEE division;
            // alpha = a c sp^2 moves x by alpha p = (a c sp) (sp p) and r by alpha Ap = (a sp) (c sp Ap)
            float a = active[i] ? __fdividef(rz[i], pap[i]) : 0.0f;
            ax[i] = a * c * sp[i];
            ar[i] = a * sp[i];
            if (active[i]) steps[i] = step;
        }
#pragma unroll
        for (int j = 0; j < MAXNT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                x->v[j][e] += ax[e >> 1] * p.v[j][e];
                r.v[j][e] -= ar[e >> 1] * ap.v[j][e];
            }
        tile_dot(rr, &r, &r, nc, s->red2, 1);
#pragma unroll
        for (int i = 0; i < FR; i++)
            if (active[i] && !(rr[i] > thresh[i])) active[i] = 0;
        precondition(&ap, &r, s, g, g->precond);  // z, in the space of ap
        float rzn[FR], beta[FR];
        if (g->precond) tile_dot(rzn, &r, &ap, nc, s->red, 1);
        else
#pragma unroll
            for (int i = 0; i < FR; i++) rzn[i] = rr[i];  // z = r
#pragma unroll
        for (int i = 0; i < FR; i++) {
            beta[i] = active[i] ? __fdividef(rzn[i], rz[i]) * inv_pow2(sp[i]) : 0.0f;  // (over p's scale)
            if (active[i]) rz[i] = rzn[i];
        }
#pragma unroll
        for (int j = 0; j < MAXNT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) p.v[j][e] = active[e >> 1] ? ap.v[j][e] + beta[e >> 1] * p.v[j][e] : 0.0f;
        round_put_rows16(&p, sp, rz, o.P, 0);
    }
}

// ---------------------------------------------------------------- the chunk scan

// One recurrence over the chunks of each (sequence, head), for two matrices
// side by side (rows d[0] + d[1], columns Dk):
//   S <- e^{b_n} S + (diag(w) L)^T R   per chunk,
// forward (the states: L = K for H, V for G; R = K; w_s = e^{b_n - b_s} beta_s)
// or in reverse (the adjoints: L = Delta for Gbar, Y for Hn; R = X; w_s = e^{b_s}).
// out[pair][slot] holds S at every chunk boundary: forward, slot c is the entry
// of chunk c (slot nchunks the final state); reverse, slot c is the end of chunk c.
typedef struct {
    const bf16 *l16[2];    // left factors [B,T,H,d], bf16 ...
    const float *l32[2];   // ... or float
    int d[2];              // rows of the two matrices
    const bf16 *r;         // right factor [B,T,H,Dk]
    const float *init[2];  // the starting values [pair][d x Dk] (NULL: zero), times init_sign
    float init_sign[2];
    float *out;            // [pair][nslots][(d0 + d1) x Dk]
    int nslots;
    float *fin[2];         // reverse: where S before chunk 0 goes [pair][d x Dk] (NULL: nowhere), times fin_sign
    float fin_sign[2];
    int reverse;
    int vec;               // every row of every factor starts 16-byte aligned: 16-byte loads (run_scan sets it)
} Scan;

// Stores the block's 64-row slice (rows i0.., of a matrix of `rows` rows and
// Dk columns) times sign; a thread's two adjacent columns as one 8-byte store.
static __device__ void slice_store(float *dst, const Tile *acc, int i0, int rows, int dk, int nc, float sign) {
#pragma unroll
    for (int j = 0; j < MAXNT; j++)
#pragma unroll
        for (int i = 0; i < FR; i++) {
            int r = i0 + f_row(i), c = f_col(j, 2 * i, nc);
            if (j >= nc || r >= rows || c >= dk) continue;
            float *d = dst + (size_t)r * dk + c, v0 = sign * acc->v[j][2 * i], v1 = sign * acc->v[j][2 * i + 1];
            if (dk % 2 == 0) {
                *(float2 *)d = make_float2(v0, v1);
            } else {
                d[0] = v0;
                if (c + 1 < dk) d[1] = v1;
            }
        }
}

// slice_store through 1 KB of smem per warp (scr), so that every store instruction writes four
// whole 128-byte rows: from the mma layout (two adjacent columns a thread), 8-byte stores had cost
// an L2 request per 32 bytes, and the scan was bound by L2 tag lookups (ncu: 80% of their peak).
// Needs dk % 4 == 0 and dst 16-byte aligned (slice_rows_ok). A row's 8-byte units are swizzled
// (unit u of row r at u ^ 4 (r & 3)), so that the writes and the 16-byte reads are free of bank conflicts.
static __device__ void slice_store_rows(float *dst, const Tile *acc, int i0, int rows, int dk, float sign, float *scr) {
    int l = lane_id(), w = warp_id(), c0 = (w >> 2) * 8 * MAXNT;
    float *my = scr + w * 8 * 32;  // 8 rows x 32 columns: the warp's rows f_row(i) for one i
#pragma unroll
    for (int i = 0; i < FR; i++) {
        int r = l >> 2;
#pragma unroll
        for (int j = 0; j < MAXNT; j++) {
            int u = 4 * j + (l & 3);  // columns 2u, 2u + 1 of the warp's 32
            *(float2 *)(my + r * 32 + 2 * (u ^ (4 * (r & 3)))) = make_float2(sign * acc->v[j][2 * i], sign * acc->v[j][2 * i + 1]);
        }
        __syncwarp();
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int rr = (l >> 3) + 4 * h, f = l & 7;  // row rr, columns 4f .. 4f + 3
            float4 v = *(const float4 *)(my + rr * 32 + 2 * ((2 * f) ^ (4 * (rr & 3))));
            int row = i0 + 16 * (w & 3) + 8 * i + rr, col = c0 + 4 * f;
            if (row < rows && col < dk) *(float4 *)(dst + (size_t)row * dk + col) = v;
        }
        __syncwarp();
    }
}

static __device__ __forceinline__ int slice_rows_ok(const float *dst, int dk) {
    return MAXNT == 4 && dk % 4 == 0 && (uintptr_t)dst % 16 == 0;
}

// A scan chunk's raw operands, fetched in the background: the left factor's
// 64-column slice (from column i0 of dl; stride CH + 4 floats or CH + 8 bf16)
// at dst, the right factor (stride ldrow(DP)) at dst + lbytes.
static __device__ __forceinline__ void scan_stage(unsigned char *dst, size_t lbytes, const void *l, int l32, int i0, int dl,
                                           const bf16 *r, int vec, const Geo *g, int pair, int t0) {
    Src ls = tok_src(l, l32, dl, CH, g, pair, t0, vec), rs = tok_src(r, 0, g->Dk, DP, g, pair, t0, vec);
    ls.p = (const char *)ls.p + (size_t)i0 * (l32 ? 4 : 2);
    ls.cols = min(CH, dl - i0);
    stage_raw(dst, l32 ? CH + 4 : CH + 8, &ls);
    stage_raw(dst + lbytes, ldrow(DP), &rs);
}

// A warp: a scan chunk's token weights for tokens lane and lane + 32 (forward
// e^{b_n - b_s} beta_s, reverse e^{b_s}; 0 past the end); returns its decay e^{b_n}.
static __device__ __forceinline__ float chunk_weights(float wt[2], const float glog[2], const float beta[2], int n,
                                                      int reverse) {
    float b[2];
    chunk_cumsum(b, glog);
    float bn = __shfl_sync(0xffffffffu, n > 32 ? b[1] : b[0], (n - 1) & 31);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int t = lane_id() + 32 * h;
        wt[h] = t < n ? (reverse ? __expf(b[h]) : __expf(bn - b[h]) * beta[h]) : 0.0f;
    }
    return __expf(bn);
}

// Warp 0: the same into smem (w, decay).
static __device__ __forceinline__ void scan_weights(float *w, float *decay, const float glog[2], const float beta[2], int n,
                                             int reverse) {
    float wt[2], d = chunk_weights(wt, glog, beta, n, reverse);
    w[threadIdx.x] = wt[0];
    w[threadIdx.x + 32] = wt[1];
    if (threadIdx.x == 0) *decay = d;
}

// a, b as three bf16 terms each, hi + mid + lo: 24 significant bits (float32's)
// with float32's exponent range, so that no operand needs scaling.
static __device__ __forceinline__ void split_bf16x3(float a, float b, __nv_bfloat162 t[3]) {
#pragma unroll
    for (int i = 0; i < 3; i++) {
        t[i] = __floats2bfloat162_rn(a, b);
        float2 f = __bfloat1622float2(t[i]);
        a -= f.x;
        b -= f.y;
    }
}

// The left operand A(s, i) = w_s L[s][i] of the staged slice (bf16 or float),
// split in three (split_bf16x3) into A, A + CH ldrow(CH), A + 2 CH ldrow(CH):
// k-major (by token s), stride ldrow(CH).
static __device__ __forceinline__ void scan_put_a(bf16 *A, const unsigned char *L, int l32, const float *w) {
    for (int e = threadIdx.x; e < CH * CH / 8; e += NT) {  // 8 values of one token each
        int s = e / 8, i = 8 * (e % 8), o = s * ldrow(CH) + i;
        float v[8];
        if (l32) {
            const float4 *p = (const float4 *)((const float *)L + s * (CH + 4) + i);
            float4 x = p[0], y = p[1];
            v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w, v[4] = y.x, v[5] = y.y, v[6] = y.z, v[7] = y.w;
        } else {
            Vec16 x;
            x.u = *(const uint4 *)((const bf16 *)L + s * (CH + 8) + i);
#pragma unroll
            for (int k = 0; k < 8; k++) v[k] = vec_at(&x, k, 0);
        }
        __nv_bfloat162 t[4][3];
#pragma unroll
        for (int k = 0; k < 4; k++) split_bf16x3(w[s] * v[2 * k], w[s] * v[2 * k + 1], t[k]);
#pragma unroll
        for (int q = 0; q < 3; q++) {
            __nv_bfloat162 u[4] = {t[0][q], t[1][q], t[2][q], t[3][q]};
            *(uint4 *)(A + q * CH * ldrow(CH) + o) = *(const uint4 *)u;
        }
    }
}

// Grid (slices, pairs): slice z < ceil(d0 / 64) covers rows 64 z.. of matrix 0,
// the rest matrix 1. Per chunk, two barriers: the chunk's raw operands (fetched
// by cp.async during the previous chunk into one of two stage buffers) and its
// weights are in place; then the split left operand. The products run in bf16
// (mma m16n8k16): the right factor is bf16 and used as fetched, the weighted
// left one is split in three (24 bits), so the state keeps float32 accuracy
// with no scaling. Two blocks per multiprocessor (95 KB of smem each).
static __global__ void __launch_bounds__(NT, 2) scan_kernel(Scan sc, const float *glog, const float *gbeta, Geo g) {
    assume_threads(NT);
    grid_wait();
    extern __shared__ __align__(16) unsigned char smb[];
    int pair = g.pair0 + blockIdx.y, z = blockIdx.x, s0 = (sc.d[0] + CH - 1) / CH, m = z < s0 ? 0 : 1;
    // the slice's operands, picked without indexing the parameter arrays (which would copy them to the stack)
    int i0 = CH * (m ? z - s0 : z), dl = m ? sc.d[1] : sc.d[0], dk = g.Dk, nc = NTILES(DP);
    const float *l32p = m ? sc.l32[1] : sc.l32[0], *init = m ? sc.init[1] : sc.init[0];
    const void *l = l32p ? (const void *)l32p : (const void *)(m ? sc.l16[1] : sc.l16[0]);
    int l32 = l32p != NULL;
    float *fin = m ? sc.fin[1] : sc.fin[0];
    float init_sign = m ? sc.init_sign[1] : sc.init_sign[0], fin_sign = m ? sc.fin_sign[1] : sc.fin_sign[0];
    size_t lbytes = (size_t)CH * (CH + 4) * sizeof(float), sbytes = lbytes + (size_t)CH * ldrow(DP) * sizeof(bf16);
    bf16 *A = (bf16 *)(smb + 2 * sbytes);
    float *w = (float *)(A + 3 * CH * ldrow(CH)), *decay = w + 2 * CH, *dec = decay + 2;  // dec: [2][glog, beta][CH]
    size_t slot_sz = (size_t)(sc.d[0] + sc.d[1]) * dk, off = m ? (size_t)sc.d[0] * dk : 0;
    float *out = sc.out + (size_t)pair * sc.nslots * slot_sz + off;
    Tile acc;
    tile_zero(&acc);
    if (init) {
        const float *src = init + (size_t)pair * dl * dk;
#pragma unroll
        for (int j = 0; j < MAXNT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int i = i0 + f_row(e >> 1), c = f_col(j, e, nc);
                if (j < nc && i < dl && c < dk) acc.v[j][e] = init_sign * src[(size_t)i * dk + c];
            }
    }
    int dir = sc.reverse ? -1 : 1, c = sc.reverse ? g.nchunks - 1 : 0;
    int rows_ok = slice_rows_ok(out, dk) && slot_sz % 4 == 0;
    scan_stage(smb, lbytes, l, l32, i0, dl, sc.r, sc.vec, &g, pair, c * CH);
    if (threadIdx.x < 32) fetch_decays_async(dec, dec + CH, glog, gbeta, &g, pair, c * CH);
    for (int step = 0; step < g.nchunks; step++, c += dir) {
        int n = min(CH, g.T - c * CH), buf = step & 1, more = step + 1 < g.nchunks;
        const unsigned char *st = smb + buf * sbytes;
        float *scr = (float *)(smb + buf * sbytes);  // the left slice's space, free once A is in place
        cp_async_wait();
        if (threadIdx.x < 32) {
            const float *d = dec + buf * 2 * CH;
            float gl[2] = {d[threadIdx.x], d[threadIdx.x + 32]}, bt[2] = {d[CH + threadIdx.x], d[CH + threadIdx.x + 32]};
            scan_weights(w + buf * CH, decay + buf, gl, bt, n, sc.reverse);
        }
        __syncthreads();  // chunk c's operands and weights are in place; the other stage buffer and A are free
        if (more) {
            scan_stage(smb + (buf ^ 1) * sbytes, lbytes, l, l32, i0, dl, sc.r, sc.vec, &g, pair, (c + dir) * CH);
            if (threadIdx.x < 32)
                fetch_decays_async(dec + (buf ^ 1) * 2 * CH, dec + (buf ^ 1) * 2 * CH + CH, glog, gbeta, &g, pair, (c + dir) * CH);
        }
        scan_put_a(A, st, l32, w + buf * CH);
        if (!rows_ok) slice_store(out + (size_t)c * slot_sz, &acc, i0, dl, dk, nc, 1.0f);
        __syncthreads();  // A is in place
        if (rows_ok) slice_store_rows(out + (size_t)c * slot_sz, &acc, i0, dl, dk, 1.0f, scr);
        float d = decay[buf];
#pragma unroll
        for (int j = 0; j < MAXNT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc.v[j][e] *= d;
        const __half *a = (const __half *)A, *r = (const __half *)(st + lbytes);
        tile_mma_b16(&acc, a + 2 * CH * ldrow(CH), NULL, ldrow(CH), 1, r, NULL, ldrow(DP), 0, 0, CH, nc, 1);
        tile_mma_b16(&acc, a, a + CH * ldrow(CH), ldrow(CH), 1, r, NULL, ldrow(DP), 0, 0, CH, nc, 1);
    }
    // (each warp stores through its own part of the last chunk's scratch, which it alone uses)
    float *scr = (float *)(smb + ((g.nchunks - 1) & 1) * sbytes);
    float *last = sc.reverse ? (fin ? fin + (size_t)pair * dl * dk : NULL) : out + (size_t)g.nchunks * slot_sz;
    float sign = sc.reverse ? fin_sign : 1.0f;
    if (last && slice_rows_ok(last, dk)) slice_store_rows(last, &acc, i0, dl, dk, sign, scr);
    else if (last) slice_store(last, &acc, i0, dl, dk, nc, sign);
}

// Two stage buffers (the left slice as floats at most, the right factor), the split left operand,
// weights, decays and two chunks' fetched log decays and betas.
static size_t scan_smem(const Geo *g) {
    return 2 * ((size_t)CH * (CH + 4) * sizeof(float) + (size_t)CH * ldrow(DP) * sizeof(bf16)) +
           3 * (size_t)CH * ldrow(CH) * sizeof(bf16) + 2 * CH * sizeof(float) + 2 * sizeof(float) + 4 * CH * sizeof(float);
}

// ---------------------------------------------------------------- the scan by wgmma (sm_90a)

// The same recurrence on Hopper, one warpgroup a block (grid and slices as scan_kernel's), when
// the state is DP columns wide and both matrices' rows come in whole slices of 64. What the
// profile of scan_kernel said (docs/cuda.md, the table of what was tried): 16 warps in lockstep
// between two barriers a chunk, every warp computing addresses and loading fragments for its part
// of the product, and the state stored through a per-warp scratch; issue 0.55 a scheduler, DRAM
// at 43%. Here a chunk needs one barrier: the warpgroup's product is asynchronous (wgmma, the
// right factor read once from smem), the left factor goes straight from the staged slice into
// the A fragments in registers (weighted and split in three there), and each warp hands its 16
// rows of the state to the tensor-memory accelerator (TMA) in one store. The right factor comes
// by TMA too (one copy a chunk), the left by cp.async.
#define SW_NT 128                      // threads of a slice: one warpgroup
#define SW_OBYTES (CH * DP * 4)        // the staged state, fp32, in the out map's swizzled boxes
#define SW_RBYTES (CH * DP * 2)        // the right factor, bf16, in wgmma's 128-byte swizzled layout
#define SW_LBYTES (CH * (CH + 4) * 4)  // the left factor's slice, as fetched (float at most)
// a warpgroup's smem, with two mbarriers, in whole KB so that every staged state is aligned to 1024
// bytes (the swizzle's period)
#define SW_WG_SMEM ((SW_OBYTES + 2 * SW_RBYTES + 2 * SW_LBYTES + 4 * CH * 4 + 2 * 8 + 1023) / 1024 * 1024)
// Warpgroups a block, each its own slice, independent but for sharing a multiprocessor. Where a
// chunk block takes a whole multiprocessor (head size 128), two: as two blocks of one warpgroup,
// the 256 scan blocks of a half-call left 8 multiprocessors half used in their second wave, where
// no chunk block fits (docs/cuda.md, "Where the GPU sits idle"). Where two chunk blocks share one
// (mesa_cuda_d64.cu), one, so that a scan block still fits beside a chunk block.
#define SW_WGS (MAXD > 64 ? 2 : 1)
#define SW_SMEM (SW_WGS * SW_WG_SMEM + 1024)  // + 1 KB to align

#if WGMMA
// A scan block's thread and warp within its warpgroup
static __device__ __forceinline__ int wg_thread() { return threadIdx.x & (SW_NT - 1); }
static __device__ __forceinline__ int wg_warp() { return warp_id() & 3; }
// The warpgroup's own barrier (named barrier 1 + wg of SW_NT threads; 0 is __syncthreads')
static __device__ __forceinline__ void wg_sync(int wg) { asm volatile("bar.sync %0, %1;" ::"r"(1 + wg), "n"(SW_NT) : "memory"); }
// acc += A B over the warpgroup's 64 x DP tile: A (64 x 16 bf16) from registers in mma.sync's
// fragment layout (warp w: rows 16 w..), B (16 x DP bf16) from smem by descriptor, N-major (its
// rows are k, as the scan's right factor is stored). acc in the accumulator layout: element e of
// 8-column group j at row 16 w + lane / 4 + 8 (e >> 1), column 8 j + 2 (lane & 3) + (e & 1).
static __device__ __forceinline__ void wg_mma_rs(float *acc, const unsigned a[4], unsigned long long db) {
#if DP == 128
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3]), "+f"(acc[4]), "+f"(acc[5]), "+f"(acc[6]),
          "+f"(acc[7]), "+f"(acc[8]), "+f"(acc[9]), "+f"(acc[10]), "+f"(acc[11]), "+f"(acc[12]), "+f"(acc[13]),
          "+f"(acc[14]), "+f"(acc[15]), "+f"(acc[16]), "+f"(acc[17]), "+f"(acc[18]), "+f"(acc[19]), "+f"(acc[20]),
          "+f"(acc[21]), "+f"(acc[22]), "+f"(acc[23]), "+f"(acc[24]), "+f"(acc[25]), "+f"(acc[26]), "+f"(acc[27]),
          "+f"(acc[28]), "+f"(acc[29]), "+f"(acc[30]), "+f"(acc[31]), "+f"(acc[32]), "+f"(acc[33]), "+f"(acc[34]),
          "+f"(acc[35]), "+f"(acc[36]), "+f"(acc[37]), "+f"(acc[38]), "+f"(acc[39]), "+f"(acc[40]), "+f"(acc[41]),
          "+f"(acc[42]), "+f"(acc[43]), "+f"(acc[44]), "+f"(acc[45]), "+f"(acc[46]), "+f"(acc[47]), "+f"(acc[48]),
          "+f"(acc[49]), "+f"(acc[50]), "+f"(acc[51]), "+f"(acc[52]), "+f"(acc[53]), "+f"(acc[54]), "+f"(acc[55]),
          "+f"(acc[56]), "+f"(acc[57]), "+f"(acc[58]), "+f"(acc[59]), "+f"(acc[60]), "+f"(acc[61]), "+f"(acc[62]),
          "+f"(acc[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
#elif DP == 64
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3]), "+f"(acc[4]), "+f"(acc[5]), "+f"(acc[6]),
          "+f"(acc[7]), "+f"(acc[8]), "+f"(acc[9]), "+f"(acc[10]), "+f"(acc[11]), "+f"(acc[12]), "+f"(acc[13]),
          "+f"(acc[14]), "+f"(acc[15]), "+f"(acc[16]), "+f"(acc[17]), "+f"(acc[18]), "+f"(acc[19]), "+f"(acc[20]),
          "+f"(acc[21]), "+f"(acc[22]), "+f"(acc[23]), "+f"(acc[24]), "+f"(acc[25]), "+f"(acc[26]), "+f"(acc[27]),
          "+f"(acc[28]), "+f"(acc[29]), "+f"(acc[30]), "+f"(acc[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
#else
#error "the wgmma scan is written for head sizes 64 and 128"
#endif
}

// Keeps the compiler from moving accesses of n registers across the asynchronous products.
static __device__ __forceinline__ void wg_pin_n(float *v, int n) {
#pragma unroll
    for (int i = 0; i < n; i++) asm volatile("" : "+f"(v[i])::"memory");
}
static __device__ __forceinline__ void wg_pin_u(unsigned *v, int n) {
#pragma unroll
    for (int i = 0; i < n; i++) asm volatile("" : "+r"(v[i])::"memory");
}

// The descriptor of the right factor as the TMA copy lays it out (scan_right_map), read N-major
// (k along its rows) with the 128-byte swizzle: each token's 64 columns of a half are one 128-byte
// row, 8 rows (k) a swizzle atom, atoms 1024 bytes apart along k (SBO), the halves CH x 128 bytes
// apart along n (LBO).
static __device__ __forceinline__ unsigned long long wg_desc_kn(const void *p) {
    return (unsigned long long)((smem_u32(p) & 0x3FFFF) >> 4) | (unsigned long long)(CH * 128 >> 4) << 16 |
           (unsigned long long)(1024 >> 4) << 32 | 1ull << 62;
}

// mbarriers, for the completion of the TMA copies: one arrival (the thread that issues the copy,
// announcing its bytes) and the copy's bytes complete a phase; the readers wait on its parity.
static __device__ __forceinline__ void mbar_init(unsigned long long *bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(bar)) : "memory");
}
static __device__ __forceinline__ void mbar_wait(unsigned long long *bar, int parity) {
    asm volatile(
        "{\n.reg .pred p;\nWAIT:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra WAIT;\n}\n" ::"r"(
            smem_u32(bar)),
        "r"(parity)
        : "memory");
}
// The right factor's chunk at token t0 of pair (b, h) into R (SW_RBYTES), completing on bar.
static __device__ __forceinline__ void tma_right(unsigned char *R, const CUtensorMap *map, int t0, int pair, int H,
                                                 unsigned long long *bar) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "n"(SW_RBYTES) : "memory");
    asm volatile(
        "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {0, %2, 0, %3, %4}], "
        "[%5];" ::"r"(smem_u32(R)),
        "l"(map), "r"(t0), "r"(pair % H), "r"(pair / H), "r"(smem_u32(bar))
        : "memory");
}

// Waits until this thread's bulk stores have read their smem (read) or are done (all).
static __device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
static __device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

// The left factor's chunk into smem in the background (cp.async, zero past the sequence's end):
// its 64 columns from i0 (dl wide, es = 2: bf16, 4: float) row-major at L (stride CH + 8 bf16 or
// CH + 4 floats). es is a constant at both calls (scan_wg_stage), so that a thread's 16-byte unit
// e splits into row and column by shifts: with es read at run time, the division by a row's units
// took 150 of a warp's 870 instructions a chunk. (The general stage_raw, with a thread count as
// parameter, made the scan 11% slower: here the loops' counts and strides are constants and rows
// always 16-byte aligned.)
static __device__ __forceinline__ void scan_wg_stage_es(unsigned char *L, const void *l, int es, int i0, int dl,
                                                        const Geo *g, int pair, int t0) {
    const int w = 16 / es, units = CH / w, ld = es == 4 ? CH + 4 : CH + 8;  // units: a row's 16-byte units
    int n = min(CH, g->T - t0);
    size_t base = tok_index(g, pair, t0);
#pragma unroll
    for (int e = wg_thread(); e < CH * units; e += SW_NT) {
        int s = e / units, c = e % units * w;
        const char *src = (const char *)l + ((base + (size_t)s * g->H) * dl + i0 + c) * es;
        cp_async16(L + (s * ld + c) * es, s < n ? (const void *)src : l, s < n ? 16 : 0);
    }
}
static __device__ __forceinline__ void scan_wg_stage(unsigned char *L, const void *l, int l32, int i0, int dl,
                                                     const Geo *g, int pair, int t0) {
    if (l32) scan_wg_stage_es(L, l, 4, i0, dl, g, pair, t0);
    else scan_wg_stage_es(L, l, 2, i0, dl, g, pair, t0);
}

// The warpgroup's state to rows row0.. of the out map (scan_out_map), each warp its 16 rows
// through its 8 KB of the staging O: DP / 32 boxes of 16 rows x 32 floats, each row's 16-byte
// units at unit ^ (row & 7) (TMA's 128-byte swizzle), so that a warp's 8-byte stores (8 rows x 4
// lanes) fill every bank twice, no more; lane 0 then hands them to one TMA store. (Stores of a row
// each, by cp.async.bulk, were 16 a warp and a chunk, issued one lane at a time: 24% of the scan's
// stall samples waited on them.)
static __device__ __forceinline__ void scan_wg_put(const CUtensorMap *map, int row0, const float *acc, unsigned char *O) {
    int w = wg_warp(), l = lane_id(), r = l >> 2, q = l & 3;
    unsigned char *Ow = O + w * (SW_OBYTES / 4);
    if (l == 0) bulk_wait_read();  // the warp's previous store has read its rows
    __syncwarp();
#pragma unroll
    for (int j = 0; j < DP / 8; j++)  // columns 8 j + 2 q, + 1: box j / 4, unit 2 (j % 4) + q / 2
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int row = r + 8 * h, unit = (2 * (j & 3) + (q >> 1)) ^ r;
            *(float2 *)(Ow + (j >> 2) * 2048 + row * 128 + unit * 16 + (q & 1) * 8) =
                make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
        }
    fence_async_smem();
    __syncwarp();
    if (l == 0)
        asm volatile(
            "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {0, %1, 0}], [%2];\n"
            "cp.async.bulk.commit_group;" ::"l"(map),
            "r"(row0 + 16 * w), "r"(smem_u32(Ow))
            : "memory");
}

// The same straight from registers to dst (rows 0..63, stride DP), times sign: the one final
// store of a reverse scan, into a buffer of its own.
static __device__ __forceinline__ void scan_wg_put_direct(float *dst, const float *acc, float sign) {
    int r0 = 16 * wg_warp() + (lane_id() >> 2), q = lane_id() & 3;
#pragma unroll
    for (int j = 0; j < DP / 8; j++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            *(float2 *)(dst + (size_t)(r0 + 8 * h) * DP + 8 * j + 2 * q) =
                make_float2(sign * acc[4 * j + 2 * h], sign * acc[4 * j + 2 * h + 1]);
}

// The thread's A fragments of k-step kk (tokens 16 kk..) of A(i, s) = w_s L[s][i], split in three
// (split_bf16x3) into t[0] (hi), t[1], t[2] (lo). wt: the weights of tokens lane and lane + 32.
static __device__ __forceinline__ void scan_wg_afrag(unsigned t[3][4], const unsigned char *L, int l32, int kk,
                                                     const float wt[2]) {
    int l = lane_id(), q = l & 3, r0 = 16 * wg_warp() + (l >> 2);
    float ws[4], v[8];  // ws: tokens 2q, 2q + 1, 2q + 8, 2q + 9 of the k-step
#pragma unroll
    for (int d = 0; d < 4; d++) ws[d] = __shfl_sync(0xffffffffu, wt[kk >> 1], (16 * kk + 2 * q + (d & 1) + 8 * (d >> 1)) & 31);
    if (l32) {
        const float *F = (const float *)L + 16 * kk * (CH + 4);
#pragma unroll
        for (int f = 0; f < 4; f++)  // fragment f: row r0 + 8 (f & 1), tokens 2q (+ 8 (f >> 1)), + 1
#pragma unroll
            for (int e = 0; e < 2; e++) v[2 * f + e] = F[(2 * q + e + 8 * (f >> 1)) * (CH + 4) + r0 + 8 * (f & 1)];
    } else {
        unsigned b[4];
        ldsm4(b, (const __half *)L + a_frag_off(CH + 8, 1) + 16 * kk * (CH + 8), 1);
#pragma unroll
        for (int f = 0; f < 4; f++) {
            v[2 * f] = __uint_as_float(b[f] << 16);
            v[2 * f + 1] = __uint_as_float(b[f] & 0xffff0000u);
        }
    }
#pragma unroll
    for (int f = 0; f < 4; f++) {
        __nv_bfloat162 p[3];
        split_bf16x3(ws[2 * (f >> 1)] * v[2 * f], ws[2 * (f >> 1) + 1] * v[2 * f + 1], p);
#pragma unroll
        for (int i = 0; i < 3; i++) t[i][f] = *(const unsigned *)&p[i];
    }
}
#endif

static __global__ void __launch_bounds__(SW_WGS * SW_NT, 3 - SW_WGS) scan_wg_kernel(Scan sc, const float *glog, const float *gbeta, Geo g,
                                                                  const __grid_constant__ CUtensorMap rmap,
                                                                  const __grid_constant__ CUtensorMap omap) {
    assume_threads(SW_WGS * SW_NT);
    grid_wait();
#if WGMMA
    extern __shared__ __align__(128) unsigned char smw[];
    int wg = threadIdx.x / SW_NT, pair = g.pair0 + blockIdx.y, z = SW_WGS * blockIdx.x + wg, s0 = sc.d[0] / CH, m = z < s0 ? 0 : 1;
    if (z >= s0 + sc.d[1] / CH) return;  // (an odd count of slices: the last block's second warpgroup)
    int i0 = CH * (m ? z - s0 : z), dl = m ? sc.d[1] : sc.d[0];
    const float *l32p = m ? sc.l32[1] : sc.l32[0], *init = m ? sc.init[1] : sc.init[0];
    const void *l = l32p ? (const void *)l32p : (const void *)(m ? sc.l16[1] : sc.l16[0]);
    int l32 = l32p != NULL;
    float *fin = m ? sc.fin[1] : sc.fin[0];
    float init_sign = m ? sc.init_sign[1] : sc.init_sign[0], fin_sign = m ? sc.fin_sign[1] : sc.fin_sign[0];
    unsigned char *O = smw + (-smem_u32(smw) & 1023) + wg * SW_WG_SMEM, *Rb = O + SW_OBYTES, *Lb = Rb + 2 * SW_RBYTES;
    float *dec = (float *)(Lb + 2 * SW_LBYTES);                      // [2][glog, beta][CH]
    unsigned long long *bar = (unsigned long long *)(dec + 4 * CH);  // [2]: the right factor's copies
    // the slice's row in the out map at slot 0; a slot is d0 + d1 rows on
    int slot_rows = sc.d[0] + sc.d[1], orow = pair * sc.nslots * slot_rows + (m ? sc.d[0] : 0) + i0;
    int lane = lane_id(), r0 = 16 * wg_warp() + (lane >> 2), q = lane & 3, t = wg_thread();
    float acc[DP / 2];
#pragma unroll
    for (int j = 0; j < DP / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            acc[4 * j + e] = init ? init_sign * init[((size_t)pair * dl + i0 + r0 + 8 * (e >> 1)) * DP + 8 * j + 2 * q + (e & 1)]
                                  : 0.0f;
    int dir = sc.reverse ? -1 : 1, c = sc.reverse ? g.nchunks - 1 : 0;
    if (t == 0) {
        mbar_init(&bar[0]);
        mbar_init(&bar[1]);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");  // (visible to the copies)
        tma_right(Rb, &rmap, c * CH, pair, g.H, &bar[0]);
    }
    scan_wg_stage(Lb, l, l32, i0, dl, &g, pair, c * CH);
    if (t < 32) fetch_decays_async(dec, dec + CH, glog, gbeta, &g, pair, c * CH);
    for (int step = 0; step < g.nchunks; step++, c += dir) {
        int n = min(CH, g.T - c * CH), buf = step & 1;
        cp_async_wait();
        wg_sync(wg);  // chunk c's left factor and decays are in place; the other buffers' readers are done
        if (step + 1 < g.nchunks) {
            int nb = buf ^ 1;
            if (t == 0) tma_right(Rb + nb * SW_RBYTES, &rmap, (c + dir) * CH, pair, g.H, &bar[nb]);
            scan_wg_stage(Lb + nb * SW_LBYTES, l, l32, i0, dl, &g, pair, (c + dir) * CH);
            if (t < 32) fetch_decays_async(dec + nb * 2 * CH, dec + nb * 2 * CH + CH, glog, gbeta, &g, pair, (c + dir) * CH);
        }
        scan_wg_put(&omap, orow + c * slot_rows, acc, O);
        // the chunk's weights and decay (chunk_weights)
        const float *d = dec + buf * 2 * CH;
        float gl[2] = {d[lane], d[lane + 32]}, bt[2] = {d[CH + lane], d[CH + lane + 32]}, wt[2];
        float decay = chunk_weights(wt, gl, bt, n, sc.reverse);
        unsigned a[CH / 16][3][4];
#pragma unroll
        for (int kk = 0; kk < CH / 16; kk++) scan_wg_afrag(a[kk], Lb + buf * SW_LBYTES, l32, kk, wt);
#pragma unroll
        for (int i = 0; i < DP / 2; i++) acc[i] *= decay;
        unsigned long long db = wg_desc_kn(Rb + buf * SW_RBYTES);
        mbar_wait(&bar[buf], (step >> 1) & 1);  // chunk c's right factor has arrived
        wg_pin_n(acc, DP / 2);  // (the fence must follow every write of the products' registers)
        wg_pin_u(&a[0][0][0], CH / 16 * 12);
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < CH / 16; kk++)
#pragma unroll
            for (int i = 2; i >= 0; i--)  // lo, mid, hi: the small terms first
                wg_mma_rs(acc, a[kk][i], db + (unsigned long long)(kk * 16 * 128 >> 4));
        asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;" ::: "memory");
        wg_pin_n(acc, DP / 2);  // (no read of acc moves above the wait)
    }
    if (!sc.reverse) scan_wg_put(&omap, orow + g.nchunks * slot_rows, acc, O);
    else if (fin) scan_wg_put_direct(fin + ((size_t)pair * dl + i0) * DP, acc, fin_sign);
    if (lane == 0) bulk_wait_all();  // (smem must outlive the stores' reads)
#endif
}

// The driver's tensor-map encoder (cuTensorMapEncodeTiled), looked up once through the runtime,
// so that the build needs no link to the driver library; NULL where the driver lacks it.
static PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder(void) {
    void *fn = NULL;
    cudaDriverEntryPointQueryResult found;
#if CUDART_VERSION >= 12050
    cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found);
#else
    cudaError_t e = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &found);
#endif
    if (e != cudaSuccess || found != cudaDriverEntryPointSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return (PFN_cuTensorMapEncodeTiled_v12000)fn;
}

// A tensor map (cuTensorMapEncodeTiled's arguments, strides of the dimensions above the first);
// false (with a warning, once) where the driver cannot encode it: the scan then takes scan_kernel.
static int encode_map(CUtensorMap *map, CUtensorMapDataType type, int rank, const void *p, const cuuint64_t *dim,
                      const cuuint64_t *stride, const cuuint32_t *box, CUtensorMapSwizzle swizzle) {
    static const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
    static int warned;
    const cuuint32_t step[5] = {1, 1, 1, 1, 1};
    CUresult e = encode ? encode(map, type, (cuuint32_t)rank, (void *)p, dim, stride, box, step, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                 swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
                        : CUDA_ERROR_NOT_FOUND;
    if (e != CUDA_SUCCESS && !warned) {
        warned = 1;
        fprintf(stderr, "cuda mesa: no tensor map for the scans (CUresult %d); they run without TMA, slower\n", (int)e);
    }
    return e == CUDA_SUCCESS;
}

// The right factor r [B, T, H, DP] bf16 as scan_wg_kernel's TMA copies see it: five dimensions
// (column within a half of 64, token, half, head, sequence), so that one box of {64, CH, DP / 64,
// 1, 1} lands a chunk as the halves' 128-byte token rows, swizzled (see wg_desc_kn), tokens past T
// read as zeros. (A box of 16-byte pieces in the unswizzled core-matrix layout had the L2 serve a
// 32-byte sector for each.)
static int scan_right_map(CUtensorMap *map, const bf16 *r, const Geo *g) {
    const cuuint64_t row = (cuuint64_t)DP * 2;  // bytes
    cuuint64_t dim[5] = {64, (cuuint64_t)g->T, DP / 64, (cuuint64_t)g->H, (cuuint64_t)g->B};
    cuuint64_t stride[4] = {g->H * row, 128, row, (cuuint64_t)g->T * g->H * row};
    cuuint32_t box[5] = {64, CH, DP / 64, 1, 1};
    return encode_map(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 5, r, dim, stride, box, CU_TENSOR_MAP_SWIZZLE_128B);
}

// The scan's output [pair][slot][d0 + d1][DP] fp32 as its TMA stores see it: rows of DP floats
// in groups of 32 (128 bytes, the swizzle's span), so that a box of {32, 16, DP / 32} is a warp's
// 16 rows (scan_wg_put).
static int scan_out_map(CUtensorMap *map, const Scan *s, const Geo *g) {
    cuuint64_t rows = (cuuint64_t)g->B * g->H * s->nslots * (s->d[0] + s->d[1]);
    cuuint64_t dim[3] = {32, rows, DP / 32}, stride[2] = {(cuuint64_t)DP * 4, 128};
    cuuint32_t box[3] = {32, 16, DP / 32};
    return encode_map(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, s->out, dim, stride, box, CU_TENSOR_MAP_SWIZZLE_128B);
}

// Whether scan_wg_kernel takes a scan: a Hopper device (the sm_90a build), the state DP columns
// wide, both matrices in whole slices, 16-byte rows everywhere.
static int scan_wg_ok(const CudaCtx *c, const Scan *s, const Geo *g) {
    int ok = c->cc_major == 9 && g->Dk == DP && s->d[0] % CH == 0 && s->d[1] % CH == 0 && s->vec &&
             (uintptr_t)s->out % 16 == 0;
    // the TMA stores' row coordinate in the out map (scan_out_map) is a 32-bit int
    ok &= (size_t)g->B * g->H * s->nslots * (s->d[0] + s->d[1]) <= (size_t)INT_MAX;
    for (int m = 0; m < 2; m++) ok &= !s->fin[m] || (uintptr_t)s->fin[m] % 16 == 0;
    return ok;
}

// ---------------------------------------------------------------- the chunk kernels

// The token index of the thread's row i of the chunk at t0 in [B,T,H] order;
// false past the end of the sequence (the per-row results' writers).
static __device__ __forceinline__ int row_token(size_t *ti, const Geo *g, int pair, int t0, int i) {
    int t = t0 + f_row(i);
    if (t >= g->T) return 0;
    *ti = tok_index(g, pair, t);
    return 1;
}

// Writes per-row integers (CG steps) for the thread's rows, one writer per row.
static __device__ void store_row_ints(int *dst, const int v[FR], const Geo *g, int pair, int t0) {
    if (!dst || !row_owner()) return;
    size_t ti;
#pragma unroll
    for (int i = 0; i < FR; i++)
        if (row_token(&ti, g, pair, t0, i)) dst[ti] = v[i];
}

// Whether the forward stages G in smem during CG (stage_g): Bm and Dg are free
// then unless CG uses the Jacobi diagonal, and hold [DP][DP] floats.
static_assert(MAXD * MAXD <= CH * (2 * MAXD + 8), "Bm and Dg hold a [DP][DP] float matrix");
static __device__ __forceinline__ int g_staged(const Geo *g, int vec) { return vec && !cg_jacobi(g); }

// Starts copying the chunk's G ([Dv][Dk] float, global) into Bm and Dg as
// [DP][DP] floats (zero outside), in the background while CG runs.
static __device__ __forceinline__ void stage_g(const Smem *s, const float *G, const Geo *g) {
    Src sg = mat_src(G, g->Dv, g->Dk, DP, DP, 1);
    stage_raw(s->Bm, DP, &sg);
}

// The forward's output O = e^b (.) X G^T + ((X K^T) (.) M) V (G: the chunk's
// entry state [Dv][Dk], global, or staged in smem by stage_g when g_staged)
// on fp16 operands (tile_gla16): X split hi + lo at per-row scales into Bm's
// region, G hi + lo into the state's buffers, V into the Jacobi diagonal's; K
// (scale sK) is still in place from CG.
static __device__ __forceinline__ void forward_output(Tile *out, const Tile *xp, float sK, const Smem *sp, const bf16 *v,
                                            const float *G, int vec, const Geo *gp, int pair, int t0) {
    const Smem s = *sp;
    const Geo g = *gp;
    const Tile xt = *xp;
    Op16 op = op16_carve(&s, &g);
    int nc = NTILES(DP), ldk = ldrow(DP), staged = g_staged(&g, vec);  // (keys and values: both DP wide)
    __half *Xh = (__half *)s.Bm, *Xl = Xh + CH * ldk, *V16 = (__half *)s.Dg;
    __half *Gh = (__half *)s.Hs, *Gl = Gh + DP * ldk;  // G hi + lo, in the state's region
    Src sg = staged ? mat_src(s.Bm, DP, DP, DP, DP, 1) : mat_src(G, g.Dv, g.Dk, DP, DP, vec);
    Src sv = tok_src(v, 0, g.Dv, DP, &g, pair, t0, vec);
    float sx[FR], sG, sV;
    {
        Vec16 gv[MAXD * MAXD / 4 / NT], vv[CH * MAXD / 8 / NT];
        stage_fetch(vv, CH * MAXD / 8 / NT, &sv);
        if (staged) {
            cp_async_wait();
            __syncthreads();  // G is in place
        }
        stage_fetch(gv, MAXD * MAXD / 4 / NT, &sg);
        float xx[FR];
        tile_dot(xx, &xt, &xt, nc, s.red, 0);  // (its barriers also end CG's reads, and those of the staged G)
        row_scales16(sx, xx);
        tile_put16(Xh, Xl, ldk, &xt, sx, nc);
        float m[2] = {stage_absmax(gv, MAXD * MAXD / 4 / NT, 1), stage_absmax(vv, CH * MAXD / 8 / NT, 0)};
        block_max_n(m, 2, s.red);
        sG = fp16_scale(m[0]);
        sV = fp16_scale(m[1]);
        stage_put16(gv, MAXD * MAXD / 4 / NT, &sg, Gh, Gl, ldk, sG);
        stage_put16(vv, CH * MAXD / 8 / NT, &sv, V16, NULL, ldk, sV);
    }
    __syncthreads();
    Gla16 f = {Xh, Xl, Gh, Gl, op.K, V16, ldk, ldk, ldk, ldk, 1, DP, nc, sG, sK, sV};
    tile_gla16(out, &f, sx, op.Sh, op.Sl, &s, 1);
}

// Forward per chunk: CG for the chunk's systems, then the output (forward_output).
static __global__ void __launch_bounds__(NT, CHUNK_BLOCKS) cg_forward_kernel(bf16 *o, bf16 *x_out, int *steps_out, const bf16 *q,
                                                           const bf16 *k, const bf16 *v, const float *glog,
                                                           const float *gbeta, const float *lambda, const float *states,
                                                           const bf16 *x0, int vec, Geo g) {
    assume_threads(NT);
    grid_wait();
    extern __shared__ float sm[];
    Smem s = carve(sm, &g);
    // chunk-major from the last chunk down: the last wave is of first chunks, whose systems (a state of
    // few tokens) take the fewest CG steps, so the kernel's tail is short (cg_backward alike)
    int c = g.nchunks - 1 - blockIdx.y, pair = g.pair0 + blockIdx.x, t0 = c * CH, nc = NTILES(DP);
    size_t hh = (size_t)g.Dk * g.Dk, hg = hh + (size_t)g.Dv * g.Dk;
    const float *st_in = states + ((size_t)pair * (g.nchunks + 1) + c) * hg;
    Op16 op = op16_carve(&s, &g);
    chunk_fetch(s.b, s.beta, s.lam, glog, gbeta, lambda, &g, pair, t0);
    op16_stage(&op, &s, st_in, k, q, vec, &g, pair, t0);
    l2_prefetch_rows(v, 2, g.Dv, &g, pair, t0);  // the values, for the output after CG
    chunk_put(s.b);
    __syncthreads();
    chunk_consts(&s, &g);
    Tile qt, xt, x0t;
    if (x0) tile_load(&x0t, x0, &g, pair, t0, g.Dk, nc);
    op16_load(&op, &s, &qt);
    if (g_staged(&g, vec)) stage_g(&s, st_in + hh, &g);  // for the output, while CG runs
    int steps[FR];
    cg_solve(&xt, &qt, &s, &g, &op, steps, &x0t, x0 != NULL);
    tile_store(x_out, 0, &xt, &g, pair, t0, g.Dk, nc);
    store_row_ints(steps_out, steps, &g, pair, t0);
    Tile out;
    forward_output(&out, &xt, op.sK, &s, v, st_in + hh, vec, &g, pair, t0);
    tile_store(o, 0, &out, &g, pair, t0, g.Dv, nc);
}

// Where rhs_stage copies the right-hand side's operands raw: G (float, [DP][DP]) in the state's
// region, Delta in the second half of Bm's, V in the direction's, the keys in the scores' (each
// free until backward_rhs has taken them into fp16).
typedef struct {
    float *G;
    bf16 *D, *V, *K;
} RhsRaw;

static __device__ __forceinline__ RhsRaw rhs_raw(const Smem *s) {
    int ld = ldrow(DP);
    RhsRaw r = {s->Hs, (bf16 *)s->Bm + CH * ld, (bf16 *)s->Kp + CH * ld, (bf16 *)s->St};
    return r;
}

// Starts copying the chunk's Delta, V, keys and G (the entry state [Dv][Dk], global) into smem as
// they are (rhs_raw), in the background, for backward_rhs once the chunk's constants are worked
// out (as op16_stage does for the forward).
static __device__ void rhs_stage(const Smem *s, const bf16 *dout, const bf16 *v, const bf16 *k, const float *G, int vec,
                                 const Geo *g, int pair, int t0) {
    RhsRaw r = rhs_raw(s);
    int ld = ldrow(DP);
    Src sg = mat_src(G, g->Dv, g->Dk, DP, DP, vec), sd = tok_src(dout, 0, g->Dv, DP, g, pair, t0, vec);
    Src sv = tok_src(v, 0, g->Dv, DP, g, pair, t0, vec), sk = tok_src(k, 0, g->Dk, DP, g, pair, t0, vec);
    stage_raw(r.G, DP, &sg);
    stage_raw(r.D, ld, &sd);
    stage_raw(r.V, ld, &sv);
    stage_raw(r.K, ld, &sk);
}

// The backward's right-hand side R = e^b (.) Delta G + ((Delta V^T) (.) M) K
// on fp16 operands (tile_gla16), from the raw copies of rhs_stage: G into the
// state's buffers (through registers: its raw copy lies there), K into CG's,
// Delta into Bm's region, V into the Jacobi diagonal's; meanwhile CG's state
// (sh) is fetched into hv, registers. Returns the keys' scale (they stay in
// CG's buffer). (Inlined: as a called function it left ptxas spilling less,
// but the kernels ran 1.2-1.5x slower, measured.)
static __device__ __forceinline__ float backward_rhs(Tile *rhs, Vec16 *hv, const Src *sh, const Smem *sp, const Geo *gp) {
    const Smem s = *sp;
    const Geo g = *gp;
    Op16 op = op16_carve(&s, &g);
    int nc = NTILES(DP), ldk = ldrow(DP);  // (keys and values: both DP wide)
    // G [DP][ldk] hi + lo in the state's region
    __half *D16 = (__half *)s.Bm, *V16 = (__half *)s.Dg, *Gh = (__half *)s.Hs, *Gl = Gh + DP * ldk;
    RhsRaw raw = rhs_raw(&s);
    cp_async_wait();
    __syncthreads();
    Vec16 gv[MAXD * MAXD / 4 / NT];
#pragma unroll
    for (int u = 0; u < MAXD * MAXD / 4 / NT; u++) gv[u].u = ((const uint4 *)raw.G)[threadIdx.x + u * NT];
    float sc[4] = {raw16_absmax(raw.D, ldk), raw16_absmax(raw.V, ldk), raw16_absmax(raw.K, ldk),
                   stage_absmax(gv, MAXD * MAXD / 4 / NT, 1)};  // the scales of Delta, V, K, G
    block_max_n(sc, 4, s.red);  // (its barriers also end the reads of G's raw copy)
    for (int i = 0; i < 4; i++) sc[i] = fp16_scale(sc[i]);
    raw16_put(raw.D, ldk, D16, ldk, sc[0]);
    raw16_put(raw.V, ldk, V16, ldk, sc[1]);
    raw16_put(raw.K, ldk, op.K, ldk, sc[2]);
#pragma unroll
    for (int u = 0; u < MAXD * MAXD / 4 / NT; u++) {
        int e = threadIdx.x + u * NT;
        vec_put16(&gv[u], 1, e / (DP / 4), e % (DP / 4) * 4, Gh, Gl, ldk, sc[3]);
    }
    stage_fetch(hv, MAXD * MAXD / 4 / NT, sh);  // CG's state, in flight while the right-hand side is computed
    __syncthreads();
    Gla16 f = {D16, NULL, Gh, Gl, V16, op.K, ldk, ldk, ldk, ldk, 0, DP, nc, sc[3], sc[1], sc[2]};
    float sa[FR] = {sc[0], sc[0]};
    tile_gla16(rhs, &f, sa, op.Sh, op.Sl, &s, 1);
    return sc[2];
}

// Backward, per chunk: R = G_t^T delta, Y = A^{-1} R (the second solve);
// writes dq = Y, Y (float) for the adjoints, the per-token term y.(lambda (.) x)
// of dL/db (src/cpu/mesa_chunk.c says why this form), and adds -sum_t y (.) x
// to dlambda.
static __global__ void __launch_bounds__(NT, CHUNK_BLOCKS) cg_backward_kernel(bf16 *dq, float *y_out, float *tok_terms, float *dlambda,
                                                            int *steps_out, const bf16 *k, const bf16 *v, const bf16 *x,
                                                            const bf16 *dout, const float *glog, const float *gbeta,
                                                            const float *lambda, const float *states, int vec, Geo g) {
    assume_threads(NT);
    grid_wait();
    extern __shared__ float sm[];
    Smem s = carve(sm, &g);
    int c = g.nchunks - 1 - blockIdx.y, pair = g.pair0 + blockIdx.x, t0 = c * CH, h = pair % g.H, nc = NTILES(DP);
    size_t hh = (size_t)g.Dk * g.Dk, hg = hh + (size_t)g.Dv * g.Dk;
    const float *st_in = states + ((size_t)pair * (g.nchunks + 1) + c) * hg;
    chunk_fetch(s.b, s.beta, NULL, glog, gbeta, NULL, &g, pair, t0);
    rhs_stage(&s, dout, v, k, st_in + hh, vec, &g, pair, t0);
    l2_prefetch(st_in, hh * sizeof(float));  // CG's state, fetched while the right-hand side is computed
    for (int i = threadIdx.x; i < DP; i += NT) s.lam[i] = i < g.Dk ? lambda[(size_t)h * g.Dk + i] : 1.0f;
    chunk_put(s.b);
    __syncthreads();
    chunk_consts(&s, &g);
    Tile rhs;
    Op16 op = op16_carve(&s, &g);
    Vec16 hv[MAXD * MAXD / 4 / NT];
    Src sh = mat_src(st_in, g.Dk, g.Dk, DP, DP, vec);
    op.sK = backward_rhs(&rhs, hv, &sh, &s, &g);  // leaves the keys in op.K
    // the second solve, with the forward's operator: H over the right-hand side's G
    op16_put_state(&op, &s, hv, &sh, &g);
    Src xs = tok_src(x, 0, g.Dk, DP, &g, pair, t0, vec);
    stage_raw(s.Bm, ldrow(DP), &xs);  // x, for after CG, in the background (CG leaves Bm alone)
    Tile y, xt;
    int steps[FR];
    cg_solve(&y, &rhs, &s, &g, &op, steps, &y, 0);
    cp_async_wait();
    __syncthreads();
    tile_from_bf16(&xt, (const bf16 *)s.Bm, ldrow(DP), nc);
    // y.(lambda (.) x) per token, and -sum over the chunk's rows of y (.) x for dlambda
    Tile lx;
#pragma unroll
    for (int j = 0; j < MAXNT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) lx.v[j][e] = j < nc ? s.lam[f_col(j, e, nc)] * xt.v[j][e] : 0.0f;
    float ylx[FR];
    tile_dot(ylx, &y, &lx, nc, s.red, 0);
    tile_store(dq, 0, &y, &g, pair, t0, g.Dk, nc);
    tile_store(y_out, 1, &y, &g, pair, t0, g.Dk, nc);
    size_t ti;
    if (row_owner())
#pragma unroll
        for (int i = 0; i < FR; i++)
            if (row_token(&ti, &g, pair, t0, i)) {
                tok_terms[ti] = ylx[i];
                if (steps_out) steps_out[ti] = steps[i];
            }
    __syncthreads();
    for (int i = threadIdx.x; i < DP; i += NT) s.red[i] = 0;
    __syncthreads();
    // column sums: over the quad's 8 row groups by shuffles, then across warps in smem
#pragma unroll
    for (int j = 0; j < MAXNT; j++) {
        if (j >= nc) continue;
#pragma unroll
        for (int e = 0; e < 2; e++) {
            float acc = 0;
#pragma unroll
            for (int i = 0; i < FR; i++)
                if (t0 + f_row(i) < g.T) acc -= y.v[j][e + 2 * i] * xt.v[j][e + 2 * i];
            for (int o = 4; o < 32; o <<= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
            if (lane_id() < 4) atomicAdd(&s.red[f_col(j, e, nc)], acc);
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < g.Dk; i += NT) atomicAdd(&dlambda[(size_t)h * g.Dk + i], s.red[i]);
}

// Shared memory of grads_kernel: fp16 operands, each times a power of two
// (ld = ldrow(DP)).
typedef struct {
    __half *Mh, *Ml;                  // [DP][ld] an adjoint, hi + lo: Hn, then Gbar
    __half *Yh, *Yl;                  // [CH][ld] Y, hi + lo
    __half *S1h, *S1l, *S2h, *S2l;    // [CH][ldrow(CH)] the masked scores S1 and S2 (below), hi + lo
    __half *K, *X, *V, *D;            // [CH][ld] the chunk's k, x, v and Delta (exact in fp16)
    float *b, *beta, *red;            // [CH], [CH], [NCG][CH]
} GradSmem;

static size_t grads_smem(const Geo *g) {
    size_t ld = ldrow(DP);
    size_t halves = 2 * DP * ld + 2 * CH * ld + 4 * (size_t)CH * ldrow(CH) + 4 * CH * ld;
    return 2 * halves + sizeof(float) * (2 * CH + NCG * CH);
}

static __device__ GradSmem grads_carve(float *base, const Geo *g) {
    int ld = ldrow(DP), ls = CH * ldrow(CH);
    GradSmem s;
    s.Mh = (__half *)base;
    s.Ml = s.Mh + DP * ld;
    s.Yh = s.Ml + DP * ld;
    s.Yl = s.Yh + CH * ld;
    s.S1h = s.Yl + CH * ld;
    s.S1l = s.S1h + ls;
    s.S2h = s.S1l + ls;
    s.S2l = s.S2h + ls;
    s.K = s.S2l + ls;
    s.X = s.K + CH * ld;
    s.V = s.X + CH * ld;
    s.D = s.V + CH * ld;
    s.b = (float *)(s.D + CH * ld);
    s.beta = s.b + CH;
    s.red = s.beta + CH;
    return s;
}

// acc = f (.) (A S) + C R for the thread's rows, C masked scores of the
// backward mask (hi + lo, [CH][ldrow(CH)]: only columns from the warp's first
// row on are nonzero); A [CH][k], S (hi + lo; by k, or by n with s_nmajor) and
// R [CH][n] fp16 with stride ld.
static __device__ __forceinline__ void tile_gla16_rev(Tile *acc, const __half *A, const __half *Sh, const __half *Sl,
                                               int s_nmajor, int dk, const float f[FR], const __half *Ch,
                                               const __half *Cl, const __half *R, int ld, int nc) {
    tile_zero(acc);
    tile_mma16(acc, A, NULL, ld, Sh, Sl, ld, s_nmajor, 0, dk, nc);
    tile_scale_rows(acc, f);
    tile_mma16(acc, Ch, Cl, ldrow(CH), R, NULL, ld, 0, 16 * (warp_id() & 3), CH, nc);
}

// Backward, per chunk, with the adjoints Gbar and Hn = -Hbar at the chunk's
// end. With the backward mask M (chunk_mask, dir 1) and u = e^{b_n - b_t}
// (the decay from a token to the chunk's end):
//   S1 = (K X^T) (.) M                S2 = (V Delta^T - K Y^T) (.) M
//   P  = S1 Delta + u (.) K Gbar^T     T  = S1 Y + u (.) K (Hn + Hn^T)
//   Q  = S2 X + u (.) V Gbar
//   dv = beta P, dk = beta (Q - T), dbeta = v.P - k.T + u k.Hn k, db = y.(lambda (.) x) - beta dbeta
// These regroup R1, R2 and Qv of src/cpu/mesa_chunk.c: with W = (K Y^T) (.) M,
// R1 + R2 = T + W X and Qv = Q + W X, so Qv - R1 - R2 = Q - T. The two state
// terms of Hn meet in one product, the two score matrices that multiply X in
// one; and k.R1 = k.T - u k.Hn k.
//
// Every product runs in fp16 on the tensor cores (tile_mma16): the bf16 rows
// are exact in fp16 after a power-of-two scale; Y, the adjoints and the
// scores are split hi + lo (22 bits, as the TF32 split was). All operands are
// fetched with 16-byte loads in three batches (the rows and Y; Hn while the
// scores are computed; Gbar while T is), so the kernel waits on global memory
// once per batch, not once per element row.
static __global__ void __launch_bounds__(NT, CHUNK_BLOCKS) grads_kernel(bf16 *dk_out, bf16 *dv_out, float *dbeta_out, float *db_out,
                                                      const bf16 *k, const bf16 *v, const bf16 *x, const bf16 *dout,
                                                      const float *y, const float *tok_terms, const float *glog,
                                                      const float *gbeta, const float *adj, int vec, Geo g) {
    assume_threads(NT);
    grid_wait();
    extern __shared__ float sm[];
    GradSmem s = grads_carve(sm, &g);
    int c = blockIdx.x, pair = g.pair0 + blockIdx.y, t0 = c * CH, nc = NTILES(DP), ncs = NTILES(CH);
    int ld = ldrow(DP), lds = ldrow(CH), rb = 16 * (warp_id() & 3);
    size_t gg = (size_t)g.Dv * g.Dk, hh = (size_t)g.Dk * g.Dk;
    const float *gbar = adj + ((size_t)pair * g.nchunks + c) * (gg + hh), *hn = gbar + gg;
    chunk_fetch(s.b, s.beta, NULL, glog, gbeta, NULL, &g, pair, t0);

    // the chunk's rows and Y: every load in flight at once, then scaled into fp16
    Src src[5] = {tok_src(k, 0, g.Dk, DP, &g, pair, t0, vec), tok_src(x, 0, g.Dk, DP, &g, pair, t0, vec),
                  tok_src(v, 0, g.Dv, DP, &g, pair, t0, vec), tok_src(dout, 0, g.Dv, DP, &g, pair, t0, vec),
                  tok_src(y, 1, g.Dk, DP, &g, pair, t0, vec)};
    Src shn = mat_src(hn, g.Dk, g.Dk, DP, DP, vec), sgb = mat_src(gbar, g.Dv, g.Dk, DP, DP, vec);
    __half *dst[4] = {s.K, s.X, s.V, s.D};
    float sc[5];  // the scales of K, X, V, Delta, Y
    int lds4[4] = {ld, ld, ld, ld};
    stage_batch16(sc, src, dst, lds4, 4, &src[4], s.Yh, s.Yl, ld, CH * MAXD / 4 / NT, s.red, hn, hh * sizeof(float));
    float sK = sc[0], sX = sc[1], sV = sc[2], sD = sc[3], sY = sc[4];
    // (the adjoints are fetched a phase ahead; fetching them in the first batch spills registers)
    Vec16 hv[MAXD * MAXD / 4 / NT];  // Hn, in flight while S1 and S2 are computed
    stage_fetch(hv, MAXD * MAXD / 4 / NT, &shn);
    l2_prefetch(gbar, gg * sizeof(float));  // Gbar, for the third phase
    chunk_put(s.b);
    __syncthreads();
    float u[FR];
    decay_to_end(u, s.b, min(CH, g.T - t0));

    // S1 and S2, in true units, then each scaled into fp16 by its block maximum
    Tile s1, s2, ky;
    tile_zero(&s1);
    tile_zero(&s2);
    tile_zero(&ky);
    if (!scores_masked_out(1)) {
        tile_mma16(&s1, s.K, NULL, ld, s.X, NULL, ld, 1, 0, DP, ncs);
        tile_mma16(&s2, s.V, NULL, ld, s.D, NULL, ld, 1, 0, DP, ncs);
        tile_mma16(&ky, s.K, NULL, ld, s.Yh, s.Yl, ld, 1, 0, DP, ncs);
    }
    float ikx = 1.0f / (sK * sX), ivd = 1.0f / (sV * sD), iky = 1.0f / (sK * sY);  // powers of two: exact
#pragma unroll
    for (int j = 0; j < MAXNT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            s1.v[j][e] *= ikx;
            s2.v[j][e] = s2.v[j][e] * ivd - ky.v[j][e] * iky;
        }
    tile_mask(&s1, s.b, s.beta, 1);
    tile_mask(&s2, s.b, s.beta, 1);
    float ms[3] = {tile_absmax(&s1, ncs), tile_absmax(&s2, ncs), stage_absmax(hv, MAXD * MAXD / 4 / NT, 1)};
    block_max_n(ms, 3, s.red);
    float ss1 = fp16_scale(ms[0]), ss2 = fp16_scale(ms[1]), sH = fp16_scale(ms[2]);
    stage_put16(hv, MAXD * MAXD / 4 / NT, &shn, s.Mh, s.Ml, ld, sH);
    {
        float f1[FR] = {ss1, ss1}, f2[FR] = {ss2, ss2};
        tile_put16(s.S1h, s.S1l, lds, &s1, f1, ncs);
        tile_put16(s.S2h, s.S2l, lds, &s2, f2, ncs);
    }
    __syncthreads();

    Vec16 gv[MAXD * MAXD / 4 / NT];  // Gbar, in flight while T is computed
    stage_fetch(gv, MAXD * MAXD / 4 / NT, &sgb);

    // T = u (.) K (Hn^T + Hn) + S1 Y, and k.R1 = k.T - (1/2) k.(its state term)
    Tile t;
    float f[FR], ka[FR], kt[FR], kr[FR];
    tile_zero(&t);
    tile_mma16(&t, s.K, NULL, ld, s.Mh, s.Ml, ld, 1, 0, DP, nc);  // K Hn^T
    tile_mma16(&t, s.K, NULL, ld, s.Mh, s.Ml, ld, 0, 0, DP, nc);  // K Hn
#pragma unroll
    for (int i = 0; i < FR; i++) f[i] = u[i] * (ss1 * sY) / (sK * sH);
    tile_scale_rows(&t, f);
    tile_rowdot16(ka, &t, s.K, ld, 1.0f, nc);
    tile_mma16(&t, s.S1h, s.S1l, lds, s.Yh, s.Yl, ld, 0, rb, CH, nc);
    float it = 1.0f / (ss1 * sY), iK = 1.0f / sK;
    for (int i = 0; i < FR; i++) f[i] = it;
    tile_scale_rows(&t, f);
    tile_rowdot16(kt, &t, s.K, ld, iK, nc);
    for (int i = 0; i < FR; i++) kt[i] -= 0.5f * ka[i] * it * iK;
    rows_join(kr, kt, s.red, 0);  // (its barriers also end the reads of Hn)
    float sG = stage_absmax(gv, MAXD * MAXD / 4 / NT, 1);
    block_max_n(&sG, 1, s.red);
    sG = fp16_scale(sG);
    stage_put16(gv, MAXD * MAXD / 4 / NT, &sgb, s.Mh, s.Ml, ld, sG);
    __syncthreads();

    // P = u (.) K Gbar^T + S1 Delta; dv = beta P
    Tile pq;
    float vp[FR];
#pragma unroll
    for (int i = 0; i < FR; i++) f[i] = u[i] * (ss1 * sD) / (sK * sG);
    tile_gla16_rev(&pq, s.K, s.Mh, s.Ml, 1, DP, f, s.S1h, s.S1l, s.D, ld, nc);
    for (int i = 0; i < FR; i++) f[i] = 1.0f / (ss1 * sD);
    tile_scale_rows(&pq, f);
    tile_rowdot16(kt, &pq, s.V, ld, 1.0f / sV, nc);
    rows_join(vp, kt, s.red, 0);
    for (int i = 0; i < FR; i++) f[i] = s.beta[f_row(i)];
    tile_scale_rows(&pq, f);
    tile_store(dv_out, 0, &pq, &g, pair, t0, g.Dv, nc);

    // Q = u (.) V Gbar + S2 X; dk = beta (Q - T)
#pragma unroll
    for (int i = 0; i < FR; i++) f[i] = u[i] * (ss2 * sX) / (sV * sG);
    tile_gla16_rev(&pq, s.V, s.Mh, s.Ml, 0, DP, f, s.S2h, s.S2l, s.X, ld, nc);
#pragma unroll
    for (int j = 0; j < MAXNT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            pq.v[j][e] = s.beta[f_row(e >> 1)] * (pq.v[j][e] * (1.0f / (ss2 * sX)) - t.v[j][e]);
    tile_store(dk_out, 0, &pq, &g, pair, t0, g.Dk, nc);
    size_t ti;
    if (row_owner())
#pragma unroll
        for (int i = 0; i < FR; i++)
            if (row_token(&ti, &g, pair, t0, i)) {
                float dbeta = vp[i] - kr[i];
                dbeta_out[ti] = dbeta;
                db_out[ti] = tok_terms[ti] - s.beta[f_row(i)] * dbeta;
            }
}

// db_final[pair] = <dhT, H_T> + <dgT, G_T> (the final states' term of dL/db), one block per pair.
static __global__ void final_dot_kernel(float *db_final, const float *states, const float *dhT, const float *dgT, Geo g) {
    grid_wait();
    __shared__ float red[32];
    int pair = g.pair0 + blockIdx.x;
    size_t hh = (size_t)g.Dk * g.Dk, gg = (size_t)g.Dv * g.Dk;
    const float *fin = states + ((size_t)pair * (g.nchunks + 1) + g.nchunks) * (hh + gg);
    float acc = 0;
    for (size_t e = threadIdx.x; e < hh + gg; e += blockDim.x)
        acc += e < hh ? (dhT ? dhT[(size_t)pair * hh + e] * fin[e] : 0.0f) : (dgT ? dgT[(size_t)pair * gg + e - hh] * fin[e] : 0.0f);
    acc = block_sum(acc, red);
    if (threadIdx.x == 0) db_final[pair] = acc;
}

// dg_t = db_final + sum_{u >= t} db_u (db_final NULL: 0): a block per pair, over tiles of
// DG_THREADS x DG_RUN tokens from the end. Each thread loads its run of DG_RUN consecutive tokens
// (all loads in flight) and sums it; a block scan of the runs' sums gives each run what lies after
// it. (One warp walking windows of 32 tokens, a dependent load each, took 48 us at 8 x 2048 x 16.)
#define DG_THREADS 256
#define DG_RUN 8
static __global__ void __launch_bounds__(DG_THREADS) dg_scan_kernel(float *dg, const float *db, const float *db_final, Geo g) {
    assume_threads(DG_THREADS);
    grid_wait();
    __shared__ float part[DG_THREADS / 32];
    int pair = g.pair0 + blockIdx.x, lane = lane_id(), w = warp_id();
    float carry = db_final ? db_final[pair] : 0.0f;
    for (int end = g.T; end > 0; end -= DG_THREADS * DG_RUN) {
        int top = end - 1 - (int)threadIdx.x * DG_RUN;  // thread 0 takes the latest run
        float v[DG_RUN], s = 0;
#pragma unroll
        for (int r = 0; r < DG_RUN; r++) v[r] = top - r >= 0 ? db[tok_index(&g, pair, top - r)] : 0.0f;
#pragma unroll
        for (int r = 0; r < DG_RUN; r++) v[r] = s += v[r];  // the run's sums from its top down
        float x = s;  // then the sums over this warp's runs up to this one
        for (int o = 1; o < 32; o <<= 1) {
            float u = __shfl_up_sync(0xffffffffu, x, o);
            if (lane >= o) x += u;
        }
        if (lane == 31) part[w] = x;
        __syncthreads();
        float after = carry + x - s, total = 0;  // after: the tokens after this run
        for (int i = 0; i < DG_THREADS / 32; i++) {
            if (i < w) after += part[i];
            total += part[i];
        }
#pragma unroll
        for (int r = 0; r < DG_RUN; r++)
            if (top - r >= 0) dg[tok_index(&g, pair, top - r)] = after + v[r];
        carry += total;
        __syncthreads();  // part is written again
    }
}

#define DEC_ROWS 8  // rows of G each decode warp loads at once

// n floats rounded up to whole 16-byte units, so that what follows in smem stays aligned
static __host__ __device__ __forceinline__ size_t decode_pad4(size_t n) { return (n + 3) & ~(size_t)3; }

// Both sums over the block at once; red: 64 floats of smem. With fence, a barrier first lets the
// previous readers of red finish; without, the caller ensures a barrier has passed since they read.
static __device__ __forceinline__ void block_sum2(float *a, float *b, float *red, int fence) {
    float x = warp_sum(*a), y = warp_sum(*b);
    if (fence) __syncthreads();
    if (lane_id() == 0) {
        red[warp_id()] = x;
        red[32 + warp_id()] = y;
    }
    __syncthreads();
    int nw = blockDim.x >> 5;
    x = lane_id() < nw ? red[lane_id()] : 0.0f;
    y = lane_id() < nw ? red[32 + lane_id()] : 0.0f;
    *a = warp_sum(x);
    *b = warp_sum(y);
}

// CG's operator on p (in ps, 16-byte aligned, written before the call): returns (H' p)_i to the
// owners (tid < Dk) and sets *pap = p.(H' + diag(lambda)) p for every thread (lam: the thread's
// lambda_i, 0 for non-owners). H' is symmetric, so thread i reads column i (consecutive threads,
// consecutive banks); the parts = nt / 128 groups of 128 threads each take a contiguous range of
// k, whose p they read 4 at a time. The dot is summed from the groups' parts directly, so the
// parts (in `part`, [parts][128]) and the dot (in red, 32 floats) meet behind one barrier.
static __device__ __forceinline__ float decode_apply(const float *Hs, const float *ps, float *part, float *red, int dk,
                                                     int nt, float lam, float *pap) {
    const int parts = nt / 128;
    int i = threadIdx.x & 127, grp = threadIdx.x >> 7;
    float dot = 0;
    __syncthreads();  // ps is written; the previous readers of part and red are done
    if (i < dk) {
        int per = ((dk + parts - 1) / parts + 3) & ~3, k = grp * per, k1 = min(k + per, dk);
        float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma unroll 4
        for (; k + 4 <= k1; k += 4) {
            float4 p4 = *(const float4 *)(ps + k);
            const float *h = Hs + k * dk + i;
            s0 += h[0] * p4.x;
            s1 += h[dk] * p4.y;
            s2 += h[2 * dk] * p4.z;
            s3 += h[3 * dk] * p4.w;
        }
        for (; k < k1; k++) s0 += Hs[k * dk + i] * ps[k];
        float sum = (s0 + s1) + (s2 + s3), pi = ps[i];
        part[grp * 128 + i] = sum;
        dot = pi * (sum + lam * pi);
    }
    dot = warp_sum(dot);
    if (lane_id() == 0) red[warp_id()] = dot;
    __syncthreads();
    float y = 0;
    if (threadIdx.x < dk)
#pragma unroll
        for (int q = 0; q < parts; q++) y += part[q * 128 + threadIdx.x];
    *pap = warp_sum(lane_id() < nt / 32 ? red[lane_id()] : 0.0f);
    return y;
}

// One token for every (sequence, head), a block each (nt threads): the
// recurrent form (spec section 1) without the chunk machinery, which would pad
// the one row to 64. H' = gamma H + beta k k^T is built in smem (and written to
// hT), CG solves (H' + diag(lambda)) x = q with thread i < Dk owning x_i, then
// G' = gamma G + beta v k^T (written to gT) gives o = G' x. H is copied into
// smem by cp.async as the block starts; with stage_g G too, so that its load
// runs under the CG (else G streams from global after it). Two widths (the
// wrappers below): few blocks (small batches) run 512 threads each with G
// staged, shortening every phase; many run 256 at three blocks per
// multiprocessor, where G's 64 KB in smem would not fit.
// In place (hT = h0, gT = g0) is safe: H (and a staged G) is read whole
// before any of it is written, and a streamed G's elements are each read and
// written by the same thread.
static __device__ __forceinline__ void decode_body(bf16 *o, bf16 *x_out, int *steps_out, const bf16 *q, const bf16 *k,
                                            const bf16 *v, const float *glog, const float *gbeta, const float *lambda,
                                            const float *h0, const float *g0, float *hT, float *gT, const bf16 *x0,
                                            Geo g, int nt, int stage_g) {
    assume_threads(nt);  // (nt a constant at both kernels)
    extern __shared__ float sm[];
    int pair = blockIdx.x, h = pair % g.H, dk = g.Dk, dv = g.Dv, tid = threadIdx.x, own = tid < dk;
    size_t hh = (size_t)dk * dk, gg = (size_t)dv * dk;
    float *Hs = sm, *Gs = Hs + decode_pad4(hh), *ps = Gs + (stage_g ? decode_pad4(gg) : 0), *ks = ps + decode_pad4(dk);
    float *vs = ks + dk, *part = vs + dv, *red = part + 4 * 128, *red_op = red + 64;
    size_t ti = pair;  // T = 1: token index = b H + h = pair
    const float *hin = h0 ? h0 + pair * hh : NULL, *gin = g0 ? g0 + pair * gg : NULL;
    float *hout = hT ? hT + pair * hh : NULL, *gout = gT ? gT + pair * gg : NULL;
    if (hin) copy_async_f32(Hs, hin, (int)hh, nt);
    cp_async_commit();
    if (stage_g && gin) copy_async_f32(Gs, gin, (int)gg, nt);
    cp_async_commit();
    float gamma = __expf(glog[ti]), beta = gbeta[ti];
    float qi = own ? ld(q, ti * dk + tid) : 0.0f, lam = own ? lambda[(size_t)h * dk + tid] : 0.0f;
    for (int j = tid; j < dk; j += nt) ks[j] = ld(k, ti * dk + j);
    for (int i = tid; i < dv; i += nt) vs[i] = beta * ld(v, ti * dv + i);
    CP_ASYNC_WAIT_GROUPS(1);  // H has arrived (G may still be on its way)
    __syncthreads();
    // element e = (r, c) of H, its row and column stepped along (no division per element)
    for (int e = tid, r = tid / dk, c = tid % dk; e < dk * dk; e += nt) {
        float val = (hin ? gamma * Hs[e] : 0.0f) + beta * ks[r] * ks[c];
        Hs[e] = val;
        if (hout) hout[e] = val;
        r += nt / dk;
        c += nt % dk;
        if (c >= dk) c -= dk, r++;
    }
    __syncthreads();
    // CG (the same rules as cg_solve: relative tolerance with its floor, exact-convergence stop)
    float diag = own ? Hs[tid * dk + tid] + lam : 1.0f, x = 0, r = qi;
    if (g.init == MN_CG_INIT_GIVEN && x0) x = own ? ld(x0, ti * dk + tid) : 0.0f;
    else if (g.init == MN_CG_INIT_JACOBI) x = qi / diag;
    if ((x0 && g.init == MN_CG_INIT_GIVEN) || g.init == MN_CG_INIT_JACOBI) {
        float unused;
        if (own) ps[tid] = x;
        r = qi - decode_apply(Hs, ps, part, red_op, dk, nt, lam, &unused) - lam * x;
    }
    float z = g.precond ? r / diag : r, qq = qi * qi, rr = r * r, rz = r * z, p = z;
    block_sum2(&qq, &rr, red, 1);
    float none = 0;
    block_sum2(&rz, &none, red, 1);
    float thresh = g.tol2 * qq;
    int steps = 0;
    int active = rr > thresh;
    if (own) ps[tid] = p;  // (the sums' barriers ordered the readers of ps before)
    // three barriers a step: the operator's two, then the residual's sums, whose buffer (red) the
    // operator's (red_op) alternates with, so that neither needs one of its own first
    for (int step = 1; active && step <= g.max_steps; step++) {
        float pap, ap = decode_apply(Hs, ps, part, red_op, dk, nt, lam, &pap) + lam * p;
        if (!(pap > 0) || !(rz > 0)) break;  // converged exactly, or non-finite input
        float alpha = rz / pap;
        x += alpha * p;
        r -= alpha * ap;
        steps = step;
        z = g.precond ? r / diag : r;
        float rr2 = r * r, rzn = r * z;
        block_sum2(&rr2, &rzn, red, 0);
        if (!(rr2 > thresh)) break;
        p = z + (rzn / rz) * p;
        rz = rzn;
        if (own) ps[tid] = p;  // every read of ps in this step came before the sums' barrier
    }
    if (own) st(x_out, ti * dk + tid, x);
    if (steps_out && tid == 0) steps_out[ti] = steps;
    CP_ASYNC_WAIT_GROUPS(0);  // a staged G has arrived
    __syncthreads();
    if (own) ps[tid] = x;
    __syncthreads();
    // o = G' x, G' = gamma G + beta v k^T: a warp per row of G, lanes along its
    // columns (Dk <= 128: four per lane), DEC_ROWS rows' loads in flight at once
    const float *gsrc = stage_g ? Gs : gin;
    for (int i0 = warp_id(); i0 < dv; i0 += DEC_ROWS * (nt / 32)) {
        float gv[DEC_ROWS][MAXD / 32];
#pragma unroll
        for (int u = 0; u < DEC_ROWS; u++)
#pragma unroll
            for (int c = 0; c < MAXD / 32; c++) {
                int i = i0 + u * (nt / 32), j = lane_id() + 32 * c;
                gv[u][c] = gin && i < dv && j < dk ? gsrc[(size_t)i * dk + j] : 0.0f;
            }
#pragma unroll
        for (int u = 0; u < DEC_ROWS; u++) {
            int i = i0 + u * (nt / 32);
            if (i >= dv) break;  // the same for the whole warp
            float acc = 0;
#pragma unroll
            for (int c = 0; c < MAXD / 32; c++) {
                int j = lane_id() + 32 * c;
                if (j >= dk) break;
                float val = gamma * gv[u][c] + vs[i] * ks[j];
                if (gout) gout[(size_t)i * dk + j] = val;
                acc += val * ps[j];
            }
            acc = warp_sum(acc);
            if (lane_id() == 0) st(o, ti * dv + i, acc);
        }
    }
}

#define DECODE_ARGS                                                                                                  \
    bf16 *o, bf16 *x_out, int *steps_out, const bf16 *q, const bf16 *k, const bf16 *v, const float *glog,           \
        const float *gbeta, const float *lambda, const float *h0, const float *g0, float *hT, float *gT, const bf16 *x0, \
        Geo g
static __global__ void __launch_bounds__(256, 3) decode_kernel_narrow(DECODE_ARGS) {
    decode_body(o, x_out, steps_out, q, k, v, glog, gbeta, lambda, h0, g0, hT, gT, x0, g, 256, 0);
}
static __global__ void __launch_bounds__(512) decode_kernel_wide(DECODE_ARGS) {
    decode_body(o, x_out, steps_out, q, k, v, glog, gbeta, lambda, h0, g0, hT, gT, x0, g, 512, 1);
}

static size_t decode_smem(const Geo *g, int stage_g) {
    size_t hh = (size_t)g->Dk * g->Dk, gg = (size_t)g->Dv * g->Dk;
    return sizeof(float) * (decode_pad4(hh) + (stage_g ? decode_pad4(gg) : 0) + decode_pad4(g->Dk) + g->Dk + g->Dv +
                            4 * 128 + 64 + 32);
}

// ------------------------------------------------------------------------ the host side

static int make_geo(Geo *g, const MnMesaDims *d, const MnSolver *s) {
    if (d->Dk > MAXD || d->Dv > MAXD)
        return mn_error(MN_ERR_UNSUPPORTED, "cuda mesa: head sizes up to %d (got Dk=%d, Dv=%d)", MAXD, d->Dk, d->Dv);
    g->B = d->B;
    g->T = d->T;
    g->H = d->H;
    g->Dk = d->Dk;
    g->Dv = d->Dv;
    g->nchunks = (d->T + CH - 1) / CH;
    // grid y is at most 65535: the CG kernels' grids have the chunks there, the scans' and grads' the pairs
    if (d->T > 1 && (g->nchunks > 65535 || (long)d->B * d->H > 65535))
        return mn_error(MN_ERR_UNSUPPORTED, "cuda mesa: at most 65535 chunks of %d tokens and 65535 (sequence, head) pairs (got T=%d, B*H=%ld)",
                        CH, d->T, (long)d->B * d->H);
    g->max_steps = s->max_steps;
    g->precond = s->precond == MN_PRECOND_JACOBI;
    g->init = s->init;
    float tol = s->tol > RESIDUAL_FLOOR ? s->tol : RESIDUAL_FLOOR;
    g->tol2 = tol * tol;
    return MN_OK;
}

// Raises a kernel's dynamic shared-memory limit to `bytes`, once per kernel and size: the
// attribute is the kernel's, so a larger earlier setting serves (and decode steps, which may be
// recorded into a graph, then make no call at all).
static int set_smem(const void *kernel, size_t bytes, const CudaCtx *c) {
    enum { SLOTS = 16 };
    static struct {
        const void *kernel;
        size_t bytes;
    } done[SLOTS];
    if (bytes > c->smem_optin)
        return mn_error(MN_ERR_UNSUPPORTED, "cuda mesa: needs %zu bytes of shared memory, the device allows %zu", bytes,
                        c->smem_optin);
    int slot = 0;
    while (slot < SLOTS && done[slot].kernel && done[slot].kernel != kernel) slot++;
    if (slot < SLOTS && done[slot].kernel == kernel && done[slot].bytes >= bytes) return MN_OK;
    CU_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    if (slot < SLOTS) {
        done[slot].kernel = kernel;
        done[slot].bytes = bytes;
    }
    return MN_OK;
}

static size_t states_floats(const Geo *g) {
    return (size_t)g->B * g->H * (g->nchunks + 1) * ((size_t)g->Dk * g->Dk + (size_t)g->Dv * g->Dk);
}

// Whether rows of n elements of `size` bytes from p all start 16-byte aligned.
static int rows_aligned(const void *p, int n, int size) { return !p || ((uintptr_t)p % 16 == 0 && n * size % 16 == 0); }

// A launch's share of the (b, h) pairs and the stream it runs on. A chunked call with more than a
// wave of chunk blocks splits its pairs in two halves, the second on the side stream. In one stream
// each kernel waits for the last block of the one before, and every kernel here ends in a partly
// empty last wave (a chunk kernel holds a multiprocessor a block); the other half's blocks now take
// those multiprocessors (docs/cuda.md, "Two streams": forward+backward 4.46 -> 4.36 ms at
// 8 x 2048 x 16 x 128). Every kernel of a call takes its pairs from Geo.pair0 on, so a half is the
// same launch with a smaller grid.
typedef struct {
    cudaStream_t stream;
    Geo g;       // the call's sizes, with g.pair0 this part's first pair
    int npairs;  // the part's pairs: the pair dimension of its grids
} Part;

// Fills part[] and *nparts (1 or 2); two are forked from the compute stream here and joined back
// by join_parts.
static int split_pairs(CudaCtx *c, const Geo *g, Part part[2], int *nparts) {
    int pairs = g->B * g->H;
    int n = *nparts = pairs >= 2 && (long)pairs * g->nchunks > c->sm_count ? 2 : 1;
    part[0].stream = c->stream;
    part[0].g = *g;
    part[0].npairs = n == 2 ? pairs / 2 : pairs;
    part[1].stream = c->side;
    part[1].g = *g;
    part[1].g.pair0 = part[0].npairs;
    part[1].npairs = pairs - part[0].npairs;
    if (n == 2) {
        CU_TRY(cudaEventRecord(c->side_fork, c->stream));
        CU_TRY(cudaStreamWaitEvent(c->side, c->side_fork, 0));
    }
    return MN_OK;
}

static int join_parts(CudaCtx *c, int nparts) {
    if (nparts < 2) return MN_OK;
    CU_TRY(cudaEventRecord(c->side_join, c->side));
    CU_TRY(cudaStreamWaitEvent(c->stream, c->side_join, 0));
    return MN_OK;
}

// Joins the parts whatever the launches between split_pairs and here returned (rc), so that a
// failed launch never leaves the side stream forked: later work on the compute stream would not
// wait for what the side stream had already been given. Returns rc, or the join's own error.
static int join_parts_after(CudaCtx *c, int nparts, int rc) {
    int rj = join_parts(c, nparts);
    return rc ? rc : rj;
}

static int run_scan(const Backend *be, const Part *p, const Scan *scan, const float *glog, const float *beta) {
    CudaCtx *c = cuda_ctx(be);
    const Geo *g = &p->g;
    Scan s = *scan, *sc = &s;
    s.vec = rows_aligned(s.r, g->Dk, 2);
    for (int m = 0; m < 2; m++) s.vec &= rows_aligned(s.l16[m], s.d[m], 2) && rows_aligned(s.l32[m], s.d[m], 4);
    unsigned slices = (unsigned)((sc->d[0] + CH - 1) / CH + (sc->d[1] + CH - 1) / CH);
    CUtensorMap rmap, omap;
    Launch l;
    if (scan_wg_ok(c, sc, g) && scan_right_map(&rmap, sc->r, g) && scan_out_map(&omap, sc, g)) {
        MN_TRY(set_smem((const void *)scan_wg_kernel, SW_SMEM, c));
        dim3 grid((slices + SW_WGS - 1) / SW_WGS, (unsigned)p->npairs);  // SW_WGS slices a block
        CU_TRY(cudaLaunchKernelEx(launch_after(&l, c, grid, SW_WGS * SW_NT, SW_SMEM, p->stream), scan_wg_kernel, *sc, glog, beta, *g,
                                  rmap, omap));
    } else {
        size_t smem = scan_smem(g);
        MN_TRY(set_smem((const void *)scan_kernel, smem, c));
        dim3 grid(slices, (unsigned)p->npairs);
        CU_TRY(cudaLaunchKernelEx(launch_after(&l, c, grid, NT, smem, p->stream), scan_kernel, *sc, glog, beta, *g));
    }
    return MN_OK;
}

// The states entering every chunk, and the final ones: states[pair][c] = (H [Dk*Dk], G [Dv*Dk]), c = 0 .. nchunks.
static int run_states(const Backend *be, const Part *p, float *states, const bf16 *k, const bf16 *v, const float *glog,
                      const float *beta, const float *h0, const float *g0) {
    const Geo *g = &p->g;
    Scan sc = {{k, v}, {NULL, NULL}, {g->Dk, g->Dv}, k, {h0, g0}, {1, 1}, states, g->nchunks + 1, {NULL, NULL}, {1, 1}, 0};
    return run_scan(be, p, &sc, glog, beta);
}

// Copies the final states (the last entry of the states workspace) out.
static __global__ void final_states_kernel(float *hT, float *gT, const float *states, Geo g) {
    size_t hh = (size_t)g.Dk * g.Dk, hg = hh + (size_t)g.Dv * g.Dk;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < (size_t)g.B * g.H * hg; e += (size_t)gridDim.x * blockDim.x) {
        size_t pair = e / hg, i = e % hg;
        float val = states[(pair * (g.nchunks + 1) + g.nchunks) * hg + i];
        if (i < hh) {
            if (hT) hT[pair * hh + i] = val;
        } else if (gT) {
            gT[pair * (hg - hh) + i - hh] = val;
        }
    }
}

// The forward's launches for each part: the states, then CG and the output per chunk.
static int forward_parts(const Backend *be, const Part *part, int np, float *states, const MnMesaFwd *io, const bf16 *x0,
                         size_t smem, int vec) {
    CudaCtx *c = cuda_ctx(be);
    for (const Part *p = part; p < part + np; p++)
        MN_TRY(run_states(be, p, states, (const bf16 *)io->k, (const bf16 *)io->v, io->g, io->beta, io->h0, io->g0));
    for (const Part *p = part; p < part + np; p++) {
        Launch l;
        CU_TRY(cudaLaunchKernelEx(launch_after(&l, c, dim3((unsigned)p->npairs, (unsigned)p->g.nchunks), NT, smem, p->stream),
                                  cg_forward_kernel, (bf16 *)io->o, (bf16 *)io->x, io->steps, (const bf16 *)io->q,
                                  (const bf16 *)io->k, (const bf16 *)io->v, io->g, io->beta, io->lambda, states, x0, vec, p->g));
    }
    return MN_OK;
}

// The backward's workspace (cuda_scratch), carved in cuda_mesa_bwd.
typedef struct {
    float *states;    // states_floats: the recomputed states
    float *adj;       // [pair][chunk] (Gbar, Hn) at every chunk's end
    float *y;         // [B,T,H,Dk] the second solve
    float *terms;     // [B,T,H] y.(lambda (.) x)
    float *db;        // [B,T,H] dL/db per token
    float *db_final;  // [pair] the final states' term of dL/db, or NULL (then 0)
} BwdWork;

// The backward's launches for each part: the states again, the second solve, the adjoints'
// reverse scan, the intra-chunk gradients and dg's reverse sums.
static int backward_parts(const Backend *be, const Part *part, int np, const MnMesaBwd *io, const BwdWork *w, size_t smem,
                          size_t gsmem, int vec) {
    CudaCtx *c = cuda_ctx(be);
    const Part *end = part + np;
    const Geo *g = &part[0].g;
    // the adjoints at every chunk's end (Gbar [Dv*Dk], Hn = -Hbar [Dk*Dk]), from (dgT, -dhT) in reverse
    Scan adjoints = {{(const bf16 *)io->dout, NULL}, {NULL, w->y}, {g->Dv, g->Dk}, (const bf16 *)io->x, {io->dgT, io->dhT}, {1, -1},
                     w->adj, g->nchunks, {io->dg0, io->dh0}, {1, -1}, 1};
    for (const Part *p = part; p < end; p++)
        MN_TRY(run_states(be, p, w->states, (const bf16 *)io->k, (const bf16 *)io->v, io->g, io->beta, io->h0, io->g0));
    for (const Part *p = part; p < end; p++) {
        Launch l;
        CU_TRY(cudaLaunchKernelEx(launch_after(&l, c, dim3((unsigned)p->npairs, (unsigned)g->nchunks), NT, smem, p->stream),
                                  cg_backward_kernel, (bf16 *)io->dq, w->y, w->terms, io->dlambda, io->steps, (const bf16 *)io->k,
                                  (const bf16 *)io->v, (const bf16 *)io->x, (const bf16 *)io->dout, io->g, io->beta,
                                  io->lambda, w->states, vec, p->g));
        if (w->db_final)
            CU_TRY(cudaLaunchKernelEx(launch_after(&l, c, dim3((unsigned)p->npairs), 256, 0, p->stream), final_dot_kernel,
                                      w->db_final, w->states, io->dhT, io->dgT, p->g));
    }
    for (const Part *p = part; p < end; p++) MN_TRY(run_scan(be, p, &adjoints, io->g, io->beta));
    for (const Part *p = part; p < end; p++) {
        Launch l;
        CU_TRY(cudaLaunchKernelEx(launch_after(&l, c, dim3((unsigned)g->nchunks, (unsigned)p->npairs), NT, gsmem, p->stream),
                                  grads_kernel, (bf16 *)io->dk, (bf16 *)io->dv, io->dbeta, w->db, (const bf16 *)io->k,
                                  (const bf16 *)io->v, (const bf16 *)io->x, (const bf16 *)io->dout, (const float *)w->y,
                                  (const float *)w->terms, io->g, io->beta, (const float *)w->adj, vec, p->g));
        CU_TRY(cudaLaunchKernelEx(launch_after(&l, c, dim3((unsigned)p->npairs), DG_THREADS, 0, p->stream), dg_scan_kernel,
                                  io->dg, (const float *)w->db, (const float *)w->db_final, p->g));
    }
    return MN_OK;
}

#if MAXD > 64
extern "C" int cuda_mesa_fwd_d64(const Backend *be, const MnMesaDims *d, const MnSolver *s, const MnMesaFwd *io);
extern "C" int cuda_mesa_bwd_d64(const Backend *be, const MnMesaDims *d, const MnSolver *s, const MnMesaBwd *io);

// Whether the build for head sizes up to 64 (mesa_cuda_d64.cu) takes the problem: chunked, and
// both head sizes padded to at most 64.
static int narrow_heads(const MnMesaDims *d) { return d->T > 1 && d->Dk <= 64 && d->Dv <= 64; }
#endif

extern "C" int MESA_NAME(cuda_mesa_fwd)(const Backend *be, const MnMesaDims *d, const MnSolver *s, const MnMesaFwd *io) {
    MN_TRY(mesa_check_dims(d));
    MN_TRY(mesa_check_solver(s));
#if MAXD > 64
    if (narrow_heads(d)) return cuda_mesa_fwd_d64(be, d, s, io);
#endif
    if (!io || !io->q || !io->k || !io->v || !io->g || !io->beta || !io->lambda || !io->o || !io->x)
        return mn_error(MN_ERR_ARG, "cuda mesa forward: a required tensor is NULL");
    Geo g = {0};
    MN_TRY(make_geo(&g, d, s));
    CudaCtx *c = cuda_ctx(be);
    int *steps = io->steps;  // a device buffer (MEM_I32), or NULL
    if (d->T == 1) {  // decoding: the recurrent kernel, wide blocks when they all fit in one wave
        int blocks = d->B * d->H, wide = blocks <= c->sm_count;
        size_t smem = decode_smem(&g, wide);
        const void *kern = wide ? (const void *)decode_kernel_wide : (const void *)decode_kernel_narrow;
        MN_TRY(set_smem(kern, smem, c));
        const bf16 *x0 = s->init == MN_CG_INIT_GIVEN ? (const bf16 *)io->x0 : NULL;
        if (wide)
            decode_kernel_wide<<<(unsigned)blocks, 512, smem, c->stream>>>(
                (bf16 *)io->o, (bf16 *)io->x, steps, (const bf16 *)io->q, (const bf16 *)io->k, (const bf16 *)io->v,
                io->g, io->beta, io->lambda, io->h0, io->g0, io->hT, io->gT, x0, g);
        else
            decode_kernel_narrow<<<(unsigned)blocks, 256, smem, c->stream>>>(
                (bf16 *)io->o, (bf16 *)io->x, steps, (const bf16 *)io->q, (const bf16 *)io->k, (const bf16 *)io->v,
                io->g, io->beta, io->lambda, io->h0, io->g0, io->hT, io->gT, x0, g);
        LAUNCH_CHECK();
        return MN_OK;
    }
    float *states = (float *)cuda_scratch(be, states_floats(&g) * sizeof(float));
    if (!states) return MN_ERR_NOMEM;
    size_t smem = sizeof(float) * smem_floats();
    MN_TRY(set_smem((const void *)cg_forward_kernel, smem, c));
    int vec = rows_aligned(io->k, g.Dk, 2) && rows_aligned(io->v, g.Dv, 2) && rows_aligned(states, g.Dk, 4) &&
              rows_aligned(io->q, g.Dk, 2);  // (q is fetched by cp.async with the keys)
    const bf16 *x0 = s->init == MN_CG_INIT_GIVEN ? (const bf16 *)io->x0 : NULL;
    Part part[2];
    int np;
    MN_TRY(split_pairs(c, &g, part, &np));
    MN_TRY(join_parts_after(c, np, forward_parts(be, part, np, states, io, x0, smem, vec)));
    if (io->hT || io->gT) {
        final_states_kernel<<<grid_for((size_t)d->B * d->H * 1024, 256), 256, 0, c->stream>>>(io->hT, io->gT, states, g);
        LAUNCH_CHECK();
    }
    return MN_OK;
}

extern "C" int MESA_NAME(cuda_mesa_bwd)(const Backend *be, const MnMesaDims *d, const MnSolver *s, const MnMesaBwd *io) {
    MN_TRY(mesa_check_dims(d));
    MN_TRY(mesa_check_solver(s));
#if MAXD > 64
    if (narrow_heads(d)) return cuda_mesa_bwd_d64(be, d, s, io);
#endif
    if (!io || !io->q || !io->k || !io->v || !io->g || !io->beta || !io->lambda || !io->x || !io->o || !io->dout ||
        !io->dq || !io->dk || !io->dv || !io->dg || !io->dbeta || !io->dlambda)
        return mn_error(MN_ERR_ARG, "cuda mesa backward: a required tensor is NULL");
    Geo g = {0};
    MN_TRY(make_geo(&g, d, s));
    if (g.init == MN_CG_INIT_GIVEN) g.init = MN_CG_INIT_ZERO;  // the given guesses were for the forward
    CudaCtx *c = cuda_ctx(be);
    size_t pairs = (size_t)d->B * d->H, ntok = (size_t)d->B * d->T * d->H;
    size_t nst = states_floats(&g), nadj = pairs * g.nchunks * ((size_t)g.Dv * g.Dk + (size_t)g.Dk * g.Dk);
    size_t ny = ntok * g.Dk, bytes = sizeof(float) * (nst + nadj + ny + ntok + ntok + pairs);
    char *ws = (char *)cuda_scratch(be, bytes);
    if (!ws) return MN_ERR_NOMEM;
    BwdWork w;
    w.states = (float *)ws;
    w.adj = w.states + nst;
    w.y = w.adj + nadj;
    w.terms = w.y + ny;
    w.db = w.terms + ntok;
    w.db_final = io->dhT || io->dgT ? w.db + ntok : NULL;  // (without final-state gradients the term is 0)
    CU_TRY(cudaMemsetAsync(io->dlambda, 0, sizeof(float) * (size_t)d->H * d->Dk, c->stream));
    size_t smem = sizeof(float) * smem_floats(), gsmem = grads_smem(&g);
    MN_TRY(set_smem((const void *)cg_backward_kernel, smem, c));
    MN_TRY(set_smem((const void *)grads_kernel, gsmem, c));
    // 16-byte loads when every operand's rows start aligned
    int vec = rows_aligned(io->k, g.Dk, 2) && rows_aligned(io->x, g.Dk, 2) && rows_aligned(io->v, g.Dv, 2) &&
              rows_aligned(io->dout, g.Dv, 2) && rows_aligned(w.states, g.Dk, 4) && rows_aligned(w.y, g.Dk, 4) &&
              rows_aligned(w.adj, g.Dk, 4);
    Part part[2];
    int np;
    MN_TRY(split_pairs(c, &g, part, &np));
    return join_parts_after(c, np, backward_parts(be, part, np, io, &w, smem, gsmem, vec));
}
