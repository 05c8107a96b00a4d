/*
 * The chunkwise form's fused path (lf_: lin_chunk.cuh), the pieces its kernels share: the fused
 * kernels read q, k, v, dO bf16 as the call gives them (no chunk-major copies), run every product as
 * mma.sync on bf16 with fp32 sums, and take a fixed number of launches whatever T (forward 3 for
 * GLA, 4 for the delta rule; forward+backward 9 and 12).
 *
 *   lin_chunk_fused.cu       the path's host side; the delta rule's UT transform (lf_prep_kernel); the
 *                            output and its backward counterparts (lf_out, lf_dv, lf_dvi kernels)
 *   lin_chunk_fused_walk.cu  the state walks: the chunk-to-chunk recurrence of a slice of the state (or
 *                            of its adjoint) held in registers (lf_walk_kernel, lf_walk2_kernel)
 *   lin_chunk_fused_bwd.cu   the backward's dQ and dK, the UT transform's adjoint, the gate gradients
 *
 * Precision: q, k, v, dO are exact bf16 operands; every rounded operand (states, V', W, U, Tt, the
 * masked scores) is split into bf16 hi + lo and its products run two or three times (mma3), so that
 * the state does not compound bf16's rounding from chunk to chunk and the outputs carry about their
 * own bf16 rounding only.
 */
#ifndef MN_LIN_CHUNK_FUSED_CUH
#define MN_LIN_CHUNK_FUSED_CUH

#include "lin_chunk.cuh"
#include "mma.cuh"

#define LF_C 64      // the chunk size of the fused path
#ifndef LF_KMAX
#define LF_KMAX 128  // Dk, Dv at most (lin_chunk_fused_d32.cu builds the path again for 32)
#endif
#define LF_LDK (LF_KMAX + 8)  // row stride (elements) of the [64][Dk] tiles: 16 bytes of padding, so that
                              // ldmatrix's eight rows fall on distinct banks (for LF_KMAX a multiple of 16)
#define LF_R 32      // state rows (of Dv) a walk block holds
#define LF_NS (LF_KMAX / 32)  // the walk's slots: a thread holds its rows' columns 8 (w + 4 s), s < LF_NS
#define LF_LDR 40    // row stride of the walk's [64][32] Y tile
#define LF_RO 64     // output columns (of Dv) an output block computes
#define LF_LDO 72    // row stride of the output kernel's [64][64] V' tile and of the prep's Tt
#define LF_THREADS 128
// The products' precision (a build option: lin_chunk_fused_bf16.cu builds the path again with 0):
// 1, every operand not exact in bf16 split hi + lo and its products run two or three times; 0, one
// bf16 product (fp32 sums) for every product, as fla's kernels, the lo tiles neither written nor
// read. The state itself stays float32 in registers either way.
#ifndef LF_SPLIT
#define LF_SPLIT 1
#endif
// Elements of the lo tile of an n-element tile: none in the bf16 build, whose lo pointers then alias
// the next tile and are never touched, so that its kernels ask for about half the shared memory.
#define LF_LO(n) (LF_SPLIT ? (n) : 0)
// The walks' A and B tiles in two stages (the bf16 build, where every A and B is exact bf16 and
// copied by cp.async): chunk i + 1's copies are in flight while chunk i's products run.
#define LF_WDB (!LF_SPLIT)

// Where a chunk's [C][D] operand is read: bf16 [B,T,H,D] as the call gives it (tok 1), a float32
// chunk-major [nch][C][D] buffer (tok 0) or a bf16 one (tok LF_CHUNK_BF16: the bf16 build's W and U);
// times a row scale [nch][C] (NULL: none). Zero past T and past D.
#define LF_CHUNK_BF16 2
typedef struct {
    const void *p;
    const float *rs;
    int tok, D;
} LfSrc;

// c[0..1] += a b for a 16 x 16 block of columns: b the four registers of a transposed ldmatrix x4
// (two n8 tiles), a the A fragment: the pair of mma every product of the fused kernels issues.
static __device__ __forceinline__ void mma_bf16_x2(float c[][4], const uint32_t a[4], const uint32_t b[4]) {
    mma_bf16(c[0], a, b[0], b[1]);
    mma_bf16(c[1], a, b[2], b[3]);
}

// A bf16 [B,T,H,D] input as an LfSrc (no row scale).
static __device__ __forceinline__ LfSrc lf_src_d(const bf16 *p, int D) {
    LfSrc s = {p, NULL, 1, D};
    return s;
}

static __device__ __forceinline__ float lf_at(const LcDims d, const LfSrc s, size_t ch, int t, int col) {
    if (col >= s.D) return 0.0f;
    float x;
    if (s.tok == LF_CHUNK_BF16) {
        x = ld((const bf16 *)s.p, (ch * d.C + t) * s.D + col);
    } else if (s.tok) {
        int tt = (int)(ch % d.N) * d.C + t;
        if (tt >= d.T) return 0.0f;
        x = ld((const bf16 *)s.p, lc_tok(d, (int)(ch / d.N), tt) * s.D + col);
    } else {
        x = ((const float *)s.p)[(ch * d.C + t) * s.D + col];
    }
    return s.rs ? x * s.rs[ch * d.C + t] : x;
}

// A bf16 (the high half of a 32-bit word; the low half zero) as a float.
static __device__ __forceinline__ float lf_bf(uint32_t w) {
    float f;
    memcpy(&f, &w, 4);
    return f;
}

// Four consecutive elements (col a multiple of 4; D is one of 16) of row t of s, as lf_at: one
// 8-byte (bf16) or 16-byte (float32) load where the address allows (the float32 buffers are
// scratch, 128-byte aligned, rows of a multiple of 16 floats; a bf16 input may start anywhere).
static __device__ __forceinline__ void lf_at4(const LcDims d, const LfSrc s, size_t ch, int t, int col, float v[4]) {
    v[0] = v[1] = v[2] = v[3] = 0.0f;
    if (col >= s.D) return;
    if (s.tok) {
        int tt = (int)(ch % d.N) * d.C + t;
        if (s.tok == 1 && tt >= d.T) return;
        const bf16 *x = (const bf16 *)s.p + (s.tok == 1 ? lc_tok(d, (int)(ch / d.N), tt) * s.D + col
                                                          : (ch * d.C + t) * s.D + col);
        if ((uintptr_t)x % 8 == 0) {
            const uint32_t *u = (const uint32_t *)x;
            uint32_t u0 = u[0], u1 = u[1];
            v[0] = lf_bf(u0 << 16);
            v[1] = lf_bf(u0 & 0xffff0000u);
            v[2] = lf_bf(u1 << 16);
            v[3] = lf_bf(u1 & 0xffff0000u);
        } else {
            for (int i = 0; i < 4; i++) v[i] = ld(x, i);
        }
    } else {
        float4 f = *(const float4 *)((const float *)s.p + (ch * d.C + t) * s.D + col);
        v[0] = f.x;
        v[1] = f.y;
        v[2] = f.z;
        v[3] = f.w;
    }
    if (s.rs) {
        float r = s.rs[ch * d.C + t];
        for (int i = 0; i < 4; i++) v[i] *= r;
    }
}

// The chunk's rows 0..63, columns c0 .. c0 + ncols - 1 of s into a bf16 tile (row stride lds; c0,
// ncols, lds multiples of 4), four elements a thread at a time, LF_UNR such loads issued before the
// first is used (a thread's loads in flight together: the tiles come from L2 or memory).
#define LF_UNR 4
#define LF_UNR_WALK 2  // (the state walk, whose registers hold the state: 4 would spill)
// UNR (at most LF_UNR) loads a thread issues before it uses them: a constant at every call, which the
// inlining folds (as a template parameter would; the kernels are C-style CUDA).
//
// A bf16 input as the call gives it, unscaled, whose rows are 16-byte aligned, is copied as it is:
// cp.async, every row of the tile in flight at once without registers (lf_sync completes it before
// the barrier that publishes the tile). Through registers, a block had only a few KiB in flight,
// and each kernel spent most of its time waiting on its loads.
static __device__ __forceinline__ int lf_async_ok(const LfSrc s, int c0, int ncols) {
    return s.tok && !s.rs && s.D % 8 == 0 && c0 % 8 == 0 && ncols % 8 == 0 && c0 + ncols <= s.D &&
           (uintptr_t)s.p % 16 == 0;
}
static __device__ __forceinline__ void lf_load_async(const LcDims d, const LfSrc s, size_t ch, int c0, int ncols,
                                                     bf16 *dst, int lds) {
    const int n8 = ncols / 8, total = LF_C * n8, p = (int)(ch / d.N), tb = (int)(ch % d.N) * LF_C;
    const int chunk = s.tok == LF_CHUNK_BF16;  // (every row of a chunk-major buffer is there: no bound)
    for (int e = threadIdx.x; e < total; e += blockDim.x) {
        const int t = e / n8, j = 8 * (e - t * n8), ok = chunk || tb + t < d.T;
        const bf16 *src = (const bf16 *)s.p + (chunk ? (ch * LF_C + t) * s.D + c0 + j
                                                     : ok ? lc_tok(d, p, tb + t) * s.D + c0 + j : 0);
        cp_async16(dst + (size_t)t * lds + j, src, ok ? 16 : 0);
    }
    cp_async_commit();
}

// Completes the thread's cp.async copies, then the block's barrier: every barrier of the fused
// kernels, so that no tile is read before its copies land.
static __device__ __forceinline__ void lf_sync(void) {
    cp_async_wait0();
    __syncthreads();
}

// Two adjacent bf16 outputs p[i], p[i + 1] (a fragment's pair: i even, rows of a multiple of 16) as one
// 4-byte store where the address allows (an output may start anywhere), else two: the chunk kernels'
// token-major outputs, whose 2-byte stores cost lf_utb a fifth of its time.
static __device__ __forceinline__ void lf_st_pair(bf16 *p, size_t i, float a, float b) {
    if ((uintptr_t)(p + i) % 4 == 0) {
        *(uint32_t *)(p + i) = pack_bf16(a, b);
    } else {
        st(p, i, a);
        st(p, i + 1, b);
    }
}

// x as a bf16 pair hi + lo (hi = bf16(x), lo = bf16(x - hi): 16 bits of mantissa between them).
static __device__ __forceinline__ float lf_hi(float x) {
    bf16 h;
    st(&h, 0, x);
    return ld(&h, 0);
}

// a, b as bf16 pairs hi + lo into hi[0..1], lo[0..1] (4-byte aligned).
static __device__ __forceinline__ void lf_st2s(bf16 *hi, bf16 *lo, float a, float b) {
    float ha = lf_hi(a), hb = lf_hi(b);
    *(uint32_t *)hi = pack_bf16(ha, hb);
    if (LF_SPLIT) *(uint32_t *)lo = pack_bf16(a - ha, b - hb);
}

// The chunk's rows through registers into a bf16 tile (lo NULL) or split into a hi and a lo tile.
static __device__ __forceinline__ void lf_load2(const LcDims d, const LfSrc s, size_t ch, int c0, int ncols, bf16 *hi,
                                                bf16 *lo, int lds, const int UNR) {
    const int n4 = ncols / 4, total = LF_C * n4;
    for (int e0 = threadIdx.x; e0 < total; e0 += UNR * blockDim.x) {
        float v[LF_UNR][4];
#pragma unroll
        for (int u = 0; u < UNR; u++) {
            int e = e0 + u * blockDim.x, t = e / n4;
            if (e < total) lf_at4(d, s, ch, t, c0 + 4 * (e - t * n4), v[u]);
        }
#pragma unroll
        for (int u = 0; u < UNR; u++) {
            int e = e0 + u * blockDim.x, t = e / n4;
            if (e >= total) continue;
            size_t o = (size_t)t * lds + 4 * (e - t * n4);
            if (lo) {
                lf_st2s(hi + o, lo + o, v[u][0], v[u][1]);
                lf_st2s(hi + o + 2, lo + o + 2, v[u][2], v[u][3]);
            } else {
                uint32_t *w = (uint32_t *)(hi + o);
                w[0] = pack_bf16(v[u][0], v[u][1]);
                w[1] = pack_bf16(v[u][2], v[u][3]);
            }
        }
    }
}

static __device__ __forceinline__ void lf_load(const LcDims d, const LfSrc s, size_t ch, int c0, int ncols, bf16 *dst,
                                               int lds, const int UNR) {
    if (lf_async_ok(s, c0, ncols)) lf_load_async(d, s, ch, c0, ncols, dst, lds);
    else lf_load2(d, s, ch, c0, ncols, dst, NULL, lds, UNR);
}

// c += a b in three products of split operands (a_hi b_hi + a_hi b_lo + a_lo b_hi): float32-like
// accuracy (~2^-16 relative per product) where bf16 alone (2^-9) would compound from chunk to chunk.
// (LF_SPLIT 0: a_hi b_hi alone.)
static __device__ __forceinline__ void mma3(float c[4], const uint32_t ah[4], const uint32_t al[4], uint32_t bh0,
                                            uint32_t bh1, uint32_t bl0, uint32_t bl1) {
    if (LF_SPLIT) {
        mma_bf16(c, al, bh0, bh1);
        mma_bf16(c, ah, bl0, bl1);
    }
    mma_bf16(c, ah, bh0, bh1);
}

// The state walk of one (pair, slice of LF_R rows of Dv), chunk after chunk (reverse: last first),
// with the slice X [LF_R][Dk] of the running state in registers (fp32, mma accumulator layout):
//     Y = Y0 + sa diag(ra) A X^T                (Y: [C][LF_R]; no A: Y = Y0; ra, rb [nch][C] or NULL)
//     X <- dec X (+ inc) + sb (diag(rb) Y)^T B
// forward (delta):  A = W, Y0 = U, B = K, rb = lambda, sa = -1, sb = 1  (Y = V', X = S)
// forward (GLA):    no A, Y0 = diag(beta) V, B = K, rb = lambda, sb = 1
// backward (delta): A = K, ra = lambda, Y0 = the intra-chunk dV', B = W, sa = 1, sb = -1,
//                   inc = dO^T diag(gamma) Qs  (Y = dV', X = dS, reverse)
// X on entering each chunk goes to xs (float32 [nch][Dv][Dk]), Y to y (float32 [nch][C][Dv], in
// place over Y0 allowed: each element is read and written by the same thread), the last X to xfin.
// Every operand is split (lf_load2, mma3), except an A or B exact in bf16 (a_exact, b_exact: K, the

// row scales lambda being applied to the products' rows instead): its lo tile is not loaded and its
// products are two. Dynamic shared memory: LF_WALK_SMEM bytes.
typedef struct {
    LfSrc a, y0, b;
    const float *ra, *rb;
    int a_exact, b_exact;
    float sa, sb;
    const float *dec, *inc, *init;
    float *xs, *y, *xfin;
    int reverse;
    LfSrc y2, b2;  // (y2.p: a second increment X += sb2 (diag(rb2) Y2)^T B2, B2 exact in bf16)
    const float *rb2;
    float sb2;
} LfWalk;

#define LF_TK (LF_C * LF_LDK)  // elements of a [64][Dk] tile
#define LF_TX (LF_R * LF_LDK)
#define LF_TY (LF_C * LF_LDR)
// The walks' shared memory (lf_walk_body): the X region (G groups' X tiles, hi and lo; INC2: room for
// a [64][LF_LDK] tile), a group's Y tile (INC2: Y's and Y2's rows).
#define LF_XREG(G, INC2) ((G) * (LF_TX + LF_LO(LF_TX)) > ((INC2) ? LF_TK : 0) ? (G) * (LF_TX + LF_LO(LF_TX)) : ((INC2) ? LF_TK : 0))
#define LF_YT(INC2) ((1 + (INC2)) * LF_TY)
#define LF_WALK_SMEM_G(G, INC2) \
    ((size_t)(2 * LF_TK + 2 * LF_LO(LF_TK) + (LF_WDB ? 2 * LF_TK : 0) + LF_XREG(G, INC2) + (G) * (LF_YT(INC2) + LF_LO(LF_YT(INC2)))) * 2)
#define LF_WALK_SMEM LF_WALK_SMEM_G(1, 0)  // the forward's and GLA's walks
// Walk blocks of two groups of 4 warps (lf_walk_groups): the bf16 build for heads up to 128, whose two
// such blocks fit a multiprocessor's registers and shared memory (the split build's would not).
#define LF_WALK_G2 (!LF_SPLIT && LF_KMAX == 128)

// att = the warp's 16 rows of A B^T (A, B [64][LF_LDK] bf16, D / 16 steps of k; exact, or one of them
// split, its lo tile Al or Bl: one more product), the 16 x 16 column blocks np outside [nmin, nmax]
// left zero.
static __device__ __forceinline__ void lf_abt(float att[8][4], const bf16 *A, const bf16 *Al, const bf16 *B,
                                              const bf16 *Bl, int D, int nmin, int nmax) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) att[n][e] = 0.0f;
    for (int s = 0; s < D / 16; s++) {
        uint32_t af[4], al[4], bb[4], bl[4];
        ldsm_x4(af, A + (16 * w + (lane & 15)) * LF_LDK + s * 16 + (lane >> 4) * 8);
        if (LF_SPLIT && Al) ldsm_x4(al, Al + (16 * w + (lane & 15)) * LF_LDK + s * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int np = 0; np < 4; np++) {
            if (np < nmin || np > nmax) continue;
            const int bo = (np * 16 + (lane & 7) + (lane >> 4) * 8) * LF_LDK + s * 16 + ((lane >> 3) & 1) * 8;
            ldsm_x4(bb, B + bo);
            if (LF_SPLIT && Al) {
                mma_bf16_x2(&att[2 * np], al, bb);
            }
            if (LF_SPLIT && Bl) {
                ldsm_x4(bl, Bl + bo);
                mma_bf16_x2(&att[2 * np], af, bl);
            }
            mma_bf16_x2(&att[2 * np], af, bb);
        }
    }
}

// The other kernels' dynamic shared memory, in bytes (the tiles: lin_chunk_fused.cu's and
// lin_chunk_fused_bwd.cu's kernel comments).
#define LF_TO (LF_C * LF_LDO)
#define LF_OUT_SMEM ((2 * LF_TK + LF_LO(LF_TK) + LF_TO + LF_LO(LF_TO)) * 2 + LF_C * 4 * 4)  // lf_out_body's kernels
#define LF_TSV (LF_KMAX * LF_LDO)  // a state slice [Dv][64]
#define LF_DQK_SMEM ((2 * LF_TK + LF_TSV + LF_LO(LF_TSV) + 2 * LF_TO) * 2 + LF_C * 4 * 4)  // lf_dqk_kernel (+ LF_LO(LF_TK) * 2: delta)
// lf_utb_kernel's region of S's slice (hi + lo), which then holds the four [64][64] tiles M, N hi + lo
#define LF_TSR (LF_TSV + LF_LO(LF_TSV) > 2 * (LF_TO + LF_LO(LF_TO)) ? LF_TSV + LF_LO(LF_TSV) : 2 * (LF_TO + LF_LO(LF_TO)))
#define LF_UTB_SMEM ((4 * LF_TK + 2 * LF_LO(LF_TK) + LF_TSR + LF_TO + LF_LO(LF_TO)) * 2 + LF_C * 4 * 4)  // lf_utb_kernel
#define LF_MAX(a, b) ((size_t)(a) > (size_t)(b) ? (size_t)(a) : (size_t)(b))
// The most any kernel of the delta rule's backward asks for (lf_use's test).
#define LF_BWD_DELTA_SMEM LF_MAX(LF_MAX(LF_UTB_SMEM, LF_WALK_SMEM_G(1, 1)), LF_DQK_SMEM + LF_LO(LF_TK) * 2)

// One state walk (lin_chunk_fused_walk.cu).
int lf_walk(CudaCtx *c, const LcDims *d, const LfWalk *wk);

// The backward's kernels of lin_chunk_fused_bwd.cu, launched by lin_chunk_fused.cu.
__global__ void lf_dqk_kernel(const LcDims d, const LcGates gt, const bf16 *qin, const bf16 *kin, const bf16 *vin,
                              const bf16 *doin, const float *sts, const float *dst, float scale, bf16 *dq, bf16 *dk,
                              float *part);
__global__ void lf_dqk_delta_kernel(const LcDims d, const LcGates gt, const bf16 *qin, const bf16 *kin, const float *vp,
                                    const bf16 *doin, const float *sts, const float *dst, float scale, bf16 *dq,
                                    float *part, float *fdk);
__global__ void lf_utb_kernel(const LcDims d, const LcGates gt, const bf16 *kin, const bf16 *vin, const float *dvp,
                              const float *sts, const float *tt, const float *fdk, bf16 *dko, bf16 *dvo, float *pv,
                              float *dbt);
__global__ void lf_gates_bwd_kernel(const LcDims d, const LcGates gt, const float *pq, int nq, const float *pv, int nv,
                                    const float *dbt, const float *st, const float *sfin, const float *dst, float *dg,
                                    float *dbeta, int has_g, int has_beta);

// The fused path's host side (lin_chunk_fused.cu): whether it takes a call, and its forward and
// backward.
int lf_use(const CudaCtx *c, const LcDims *d, size_t smem);
int lf_forward(const Backend *be, CudaCtx *c, const LcDims *d, int delta, float scale, const MnLinFwd *io);
int lf_backward_gla(const Backend *be, CudaCtx *c, const LcDims *d, float scale, const MnLinBwd *io);
int lf_backward_delta(const Backend *be, CudaCtx *c, const LcDims *d, float scale, const MnLinBwd *io);

// The same path built for head sizes up to 32 (lin_chunk_fused_d32.cu): tiles of row stride 40
// instead of 136, so that the kernels ask for a fraction of the shared memory (lf_utb 59 KB instead
// of 160) and several blocks share a multiprocessor at small widths. Its shared-memory sizes.
int lf_use_d32(const CudaCtx *c, const LcDims *d, size_t smem);
int lf_forward_d32(const Backend *be, CudaCtx *c, const LcDims *d, int delta, float scale, const MnLinFwd *io);
int lf_backward_gla_d32(const Backend *be, CudaCtx *c, const LcDims *d, float scale, const MnLinBwd *io);
int lf_backward_delta_d32(const Backend *be, CudaCtx *c, const LcDims *d, float scale, const MnLinBwd *io);
extern const size_t lf_walk_smem_d32, lf_bwd_delta_smem_d32;

// The same path built with one bf16 product for every product (lin_chunk_fused_bf16.cu, LF_SPLIT 0),
// taken when MESANET_LIN=bf16.
int lf_use_bf16(const CudaCtx *c, const LcDims *d, size_t smem);
int lf_forward_bf16(const Backend *be, CudaCtx *c, const LcDims *d, int delta, float scale, const MnLinFwd *io);
int lf_backward_gla_bf16(const Backend *be, CudaCtx *c, const LcDims *d, float scale, const MnLinBwd *io);
int lf_backward_delta_bf16(const Backend *be, CudaCtx *c, const LcDims *d, float scale, const MnLinBwd *io);
extern const size_t lf_walk_smem_bf16, lf_bwd_delta_smem_bf16;

#endif
