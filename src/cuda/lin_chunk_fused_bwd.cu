/*
 * The fused path's backward kernels (lin_chunk_fused.cuh): dQs and dK (lf_dqk_kernel; the delta
 * rule's first terms, lf_dqk_delta_kernel), the delta rule's UT-transform adjoint (lf_utb_kernel) and
 * the gate gradients (lf_gates_bwd_kernel). A block per chunk (and slice of columns), four warps of
 * 16 rows; the score blocks in registers, the states' slices in shared memory.
 */
#include "lin_chunk_fused.cuh"

// Columns c0 .. c0 + 63 of the chunk's state (float32 [Dv][Dk]; zero past Dk), all Dv rows, into two
// bf16 tiles [Dv][LF_LDO], hi + lo (the B operand [k = Dv][n = columns] of dO S and V' dS).
static __device__ __forceinline__ void lf_load_state_cols(const LcDims d, const float *states, size_t ch, int c0,
                                                          bf16 *hi, bf16 *lo) {
    const int n4 = LF_RO / 4, total = d.Dv * n4;
    for (int e0 = threadIdx.x; e0 < total; e0 += LF_UNR * blockDim.x) {
        float4 f[LF_UNR];
#pragma unroll
        for (int u = 0; u < LF_UNR; u++) {
            int e = e0 + u * blockDim.x, r = e / n4, col = c0 + 4 * (e - r * n4);
            f[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (e < total && col < d.Dk) f[u] = *(const float4 *)(states + (ch * d.Dv + r) * d.Dk + col);
        }
#pragma unroll
        for (int u = 0; u < LF_UNR; u++) {
            int e = e0 + u * blockDim.x, r = e / n4;
            if (e >= total) continue;
            size_t o = (size_t)r * LF_LDO + 4 * (e - r * n4);
            lf_st2s(hi + o, lo + o, f[u].x, f[u].y);
            lf_st2s(hi + o + 2, lo + o + 2, f[u].z, f[u].w);
        }
    }
}

// acc (16 rows of the warp x 64 columns: 8 n-tiles) += P X, P the warp's masked scores (fp32, 8 tiles
// of 16 x 8 over the chunk's 64 columns, tiles kk < kmin or kk > kmax zero and skipped) split into A
// fragments hi + lo, X [64][LF_LDO] exact bf16 in shared memory; columns c0 + 16 dp past D skipped.
static __device__ __forceinline__ void lf_pv(float acc[8][4], const float att[8][4], const bf16 *X, int kmin, int kmax,
                                             int c0, int D) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        if (kk < kmin || kk > kmax) continue;
        float hv[8];
#pragma unroll
        for (int e = 0; e < 8; e++) hv[e] = lf_hi(att[2 * kk + (e >> 2)][e & 3]);
        uint32_t ph[4] = {pack_bf16(hv[0], hv[1]), pack_bf16(hv[2], hv[3]), pack_bf16(hv[4], hv[5]),
                          pack_bf16(hv[6], hv[7])};
        uint32_t pl[4] = {pack_bf16(att[2 * kk][0] - hv[0], att[2 * kk][1] - hv[1]),
                          pack_bf16(att[2 * kk][2] - hv[2], att[2 * kk][3] - hv[3]),
                          pack_bf16(att[2 * kk + 1][0] - hv[4], att[2 * kk + 1][1] - hv[5]),
                          pack_bf16(att[2 * kk + 1][2] - hv[6], att[2 * kk + 1][3] - hv[7])};
#pragma unroll
        for (int dp = 0; dp < 4; dp++) {
            if (c0 + dp * 16 >= D) continue;
            uint32_t bb[4];
            ldsm_x4_t(bb, X + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LF_LDO + dp * 16 + (lane >> 4) * 8);
            if (LF_SPLIT) mma_bf16_x2(&acc[2 * dp], pl, bb);
            mma_bf16_x2(&acc[2 * dp], ph, bb);
        }
    }
}

// acc += A X with A the warp's 16 rows of a [64][LF_LDK] bf16 tile over nk = D / 16 steps of k
// (exact, or hi A + lo Al) and X [D][LF_LDO] a state slice hi + lo (two products, three with Al);
// columns c0 + 16 dp past Dc skipped.
static __device__ __forceinline__ void lf_as(float acc[8][4], const bf16 *A, const bf16 *Al, const bf16 *Xh,
                                             const bf16 *Xl, int D, int c0, int Dc) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int s = 0; s < D / 16; s++) {
        uint32_t af[4], al[4];
        ldsm_x4(af, A + (16 * w + (lane & 15)) * LF_LDK + s * 16 + (lane >> 4) * 8);
        if (LF_SPLIT && Al) ldsm_x4(al, Al + (16 * w + (lane & 15)) * LF_LDK + s * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int dp = 0; dp < 4; dp++) {
            if (c0 + dp * 16 >= Dc) continue;
            const int bo = (s * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LF_LDO + dp * 16 + (lane >> 4) * 8;
            uint32_t bh[4], bl[4];
            ldsm_x4_t(bh, Xh + bo);
            if (LF_SPLIT) {
                ldsm_x4_t(bl, Xl + bo);
                if (Al) mma_bf16_x2(&acc[2 * dp], al, bh);
                mma_bf16_x2(&acc[2 * dp], af, bl);
            }
            mma_bf16_x2(&acc[2 * dp], af, bh);
        }
    }
}

// The backward's dQs and dK of one (chunk, slice of LF_RO columns of Dk), GLA (V' = diag(beta) V), 4
// warps of 16 rows:
//     dQs = diag(gamma) dO S + P1 K,         P1 = (dO V'^T) (.) Gamma
//     dK  = diag(lambda) V' dS + P1^T Qs,    P1^T = (V' dO^T) (.) Gamma^T
// dO, V, q, k bf16 as given (exact operands; beta and the decays applied to the scores in fp32), S
// (the chunk's entry state) and dS (the adjoint of its end state) float32 [nch][Dv][Dk], their
// column slices split hi + lo in shared memory (S first, then dS in its place); the masked scores
// in registers, split into A fragments hi + lo (lf_pv). Out: dq = scale dQs, dk (bf16 [B,T,H,Dk]),
// part[(ch C + t) gridDim.y + blockIdx.y] the slice's share of q_t . dq_t. Dynamic shared memory
// LF_DQK_SMEM bytes.
//
// DELTA = 1: V' is the delta rule's (vp: float32 [nch][C][Dv], split hi + lo into one more tile: three
// products where it enters), no beta in the scores, lambda alone on V' dS; out: dq and part as GLA's,
// and dK before the UT transform's terms, float32 chunk major [nch][C][Dk] (fdk; every row), which
// lf_utb_kernel completes. Dynamic shared memory LF_DQK_SMEM + (DELTA) LF_LO(LF_TK) * 2 bytes.
// DELTA (0 or 1, a constant at each call, folded by the inlining): the delta rule's variant.
static __device__ __forceinline__ void lf_dqk_body(const LcDims d, const LcGates gt, const bf16 *qin, const bf16 *kin,
                                                   const bf16 *vin, const float *vp, const bf16 *doin,
                                                   const float *sts, const float *dst, float scale, bf16 *dq,
                                                   bf16 *dk, float *part, float *fdk, const int DELTA) {
    extern __shared__ __align__(16) unsigned char lf_dsmem[];
    bf16 *Do = (bf16 *)lf_dsmem, *Vt = Do + LF_TK, *Sh = Vt + LF_TK, *Sl = Sh + LF_TSV, *Kc = Sl + LF_LO(LF_TSV),
         *Qc = Kc + LF_TO;
    float *red = (float *)(Qc + LF_TO);
    bf16 *Vl = DELTA ? (bf16 *)(red + LF_C * 4) : NULL;  // V' lo
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, Dk = d.Dk, Dv = d.Dv, lr = lane >> 2, lc = 2 * (lane & 3);
    const size_t ch = blockIdx.x;
    const int c0 = blockIdx.y * LF_RO, p = (int)(ch / d.N), t0 = (int)(ch % d.N) * LF_C;
    const float *b = gt.b + ch * LF_C, *beta = gt.beta + ch * LF_C;
    lf_load(d, lf_src_d(doin, Dv), ch, 0, Dv, Do, LF_LDK, LF_UNR);
    const LfSrc vps = {vp, NULL, 0, Dv};
    if (DELTA) lf_load2(d, vps, ch, 0, Dv, Vt, Vl, LF_LDK, LF_UNR);
    else lf_load(d, lf_src_d(vin, Dv), ch, 0, Dv, Vt, LF_LDK, LF_UNR);
    lf_load(d, lf_src_d(kin, Dk), ch, c0, LF_RO, Kc, LF_LDO, LF_UNR);
    lf_load(d, lf_src_d(qin, Dk), ch, c0, LF_RO, Qc, LF_LDO, LF_UNR);
    lf_load_state_cols(d, sts, ch, c0, Sh, Sl);
    lf_sync();
    float acc[8][4], att[8][4];
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[n][e] = 0.0f;
    lf_as(acc, Do, NULL, Sh, Sl, Dv, c0, Dk);  // dO S
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[n][e] *= gt.gam[ch * LF_C + 16 * w + lr + 8 * (e >> 1)];
    lf_abt(att, Do, NULL, Vt, Vl, Dv, 0, w);  // dO V^T, then (.) Gamma, beta on the columns (DELTA: dO V'^T)
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int i = 16 * w + lr + 8 * (e >> 1), j = 8 * n + lc + (e & 1);
            att[n][e] = j <= i ? (DELTA ? 1.0f : beta[j]) * expf(b[i] - b[j]) * att[n][e] : 0.0f;
        }
    lf_pv(acc, att, Kc, 0, w, c0, Dk);  // + P1 K
    float rs[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int i = 16 * w + lr + 8 * h, cl = 8 * n + lc, col = c0 + cl;
            if (t0 + i >= d.T || col >= Dk) continue;
            const float x0 = scale * acc[n][2 * h], x1 = scale * acc[n][2 * h + 1];
            rs[h] = fmaf(ld(Qc, (size_t)i * LF_LDO + cl), x0, rs[h]);
            rs[h] = fmaf(ld(Qc, (size_t)i * LF_LDO + cl + 1), x1, rs[h]);
            lf_st_pair(dq, lc_tok(d, p, t0 + i) * Dk + col, x0, x1);
        }
    red[(16 * w + lr) * 4 + (lane & 3)] = rs[0];
    red[(16 * w + lr + 8) * 4 + (lane & 3)] = rs[1];
    lf_sync();  // S read: dS takes its tiles
    if (threadIdx.x < LF_C) {
        const float *rr = red + threadIdx.x * 4;
        part[(ch * LF_C + threadIdx.x) * gridDim.y + blockIdx.y] = (rr[0] + rr[1]) + (rr[2] + rr[3]);
    }
    lf_load_state_cols(d, dst, ch, c0, Sh, Sl);
    lf_sync();
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[n][e] = 0.0f;
    lf_as(acc, Vt, Vl, Sh, Sl, Dv, c0, Dk);  // V dS, then diag(lambda beta) (DELTA: V' dS, lambda)
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const size_t r = ch * LF_C + 16 * w + lr + 8 * (e >> 1);
            acc[n][e] *= DELTA ? gt.lam[r] : gt.lam[r] * gt.beta[r];
        }
    lf_abt(att, Vt, Vl, Do, NULL, Dv, w, 3);  // V dO^T, then (.) Gamma^T, beta on the rows, scale (Qs = scale q)
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int i = 16 * w + lr + 8 * (e >> 1), j = 8 * n + lc + (e & 1);
            att[n][e] = j >= i ? scale * (DELTA ? 1.0f : beta[i]) * expf(b[j] - b[i]) * att[n][e] : 0.0f;
        }
    lf_pv(acc, att, Qc, w, 3, c0, Dk);  // + P1^T Qs
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int i = 16 * w + lr + 8 * h, col = c0 + 8 * n + lc;
            if (col >= Dk) continue;
            if (DELTA) *(float2 *)(fdk + (ch * LF_C + i) * Dk + col) = make_float2(acc[n][2 * h], acc[n][2 * h + 1]);
            else if (t0 + i < d.T) lf_st_pair(dk, lc_tok(d, p, t0 + i) * Dk + col, acc[n][2 * h], acc[n][2 * h + 1]);
        }
}

__global__ void __launch_bounds__(LF_THREADS) lf_dqk_kernel(const LcDims d, const LcGates gt, const bf16 *qin,
                                                           const bf16 *kin, const bf16 *vin, const bf16 *doin,
                                                           const float *sts, const float *dst, float scale,
                                                           bf16 *dq, bf16 *dk, float *part) {
    lf_dqk_body(d, gt, qin, kin, vin, NULL, doin, sts, dst, scale, dq, dk, part, NULL, 0);
}

__global__ void __launch_bounds__(LF_THREADS) lf_dqk_delta_kernel(const LcDims d, const LcGates gt,
                                                                 const bf16 *qin, const bf16 *kin,
                                                                 const float *vp, const bf16 *doin,
                                                                 const float *sts, const float *dst, float scale,
                                                                 bf16 *dq, float *part, float *fdk) {
    lf_dqk_body(d, gt, qin, kin, NULL, vp, doin, sts, dst, scale, dq, NULL, part, fdk, 1);
}

// acc (the warp's 16 rows x 64 columns) += A X: A [64][lda] bf16 (hi, and lo Al or NULL), rows 16 w..,
// K / 16 steps of k; X [K][ldx] (hi, and lo Xl or NULL) read transposed (row-major [k][n]), columns 0
// .. ncol - 1 of the 64 (16 at a time). Products: Ah Xh (+ Al Xh) (+ Ah Xl).
static __device__ __forceinline__ void lf_mm(float acc[8][4], const bf16 *Ah, const bf16 *Al, int lda, const bf16 *Xh,
                                             const bf16 *Xl, int ldx, int K, int ncol) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int s = 0; s < K / 16; s++) {
        uint32_t ah[4], al[4];
        const int ao = (16 * w + (lane & 15)) * lda + s * 16 + (lane >> 4) * 8;
        ldsm_x4(ah, Ah + ao);
        if (LF_SPLIT && Al) ldsm_x4(al, Al + ao);
#pragma unroll
        for (int dp = 0; dp < 4; dp++) {
            if (dp * 16 >= ncol) continue;
            const int bo = (s * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * ldx + dp * 16 + (lane >> 4) * 8;
            uint32_t bh[4], bl[4];
            ldsm_x4_t(bh, Xh + bo);
            if (LF_SPLIT && Xl) {
                ldsm_x4_t(bl, Xl + bo);
                mma_bf16_x2(&acc[2 * dp], ah, bl);
            }
            if (LF_SPLIT && Al) {
                mma_bf16_x2(&acc[2 * dp], al, bh);
            }
            mma_bf16_x2(&acc[2 * dp], ah, bh);
        }
    }
}

static __device__ __forceinline__ void lf_zero(float a[8][4]) {
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) a[n][e] = 0.0f;
}

// The warp's fragment a (16 rows x 64 columns, mma accumulator layout) times s into hi + lo tiles
// (row stride ld; columns past ncol skipped); transposed (element (i, j) to [j][i]) where tr.
static __device__ __forceinline__ void lf_st_frag(const float a[8][4], float s, bf16 *hi, bf16 *lo, int ld, int ncol,
                                                  int tr) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, lr = lane >> 2, lc = 2 * (lane & 3);
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int i = 16 * w + lr + 8 * h, j = 8 * n + lc;
            if (j >= ncol) continue;
            if (!tr) {
                lf_st2s(hi + i * ld + j, lo + i * ld + j, s * a[n][2 * h], s * a[n][2 * h + 1]);
            } else {
#pragma unroll
                for (int u = 0; u < 2; u++) {
                    float x = s * a[n][2 * h + u], xh = lf_hi(x);
                    st(hi, (size_t)(j + u) * ld + i, xh);
                    if (LF_SPLIT) st(lo, (size_t)(j + u) * ld + i, x - xh);
                }
            }
        }
}

// The delta rule's UT-transform adjoint of one chunk (one block of 4 warps, 16 rows each), for the
// fused backward (lin_chunk.c's DELTA terms), from dU = dV' (float32 [nch][C][Dv], split hi + lo), S
// (the entry state, float32, column slices split hi + lo), Tt (float32 [nch][C][C], transposed and
// split), k and v bf16 as given:
//     dW = -dV' S (shared memory, hi + lo),  Tt^T dW: dK += diag(beta gamma) Tt^T dW,
//     Tt^T dU: dv = diag(beta) Tt^T dU (bf16 [B,T,H,Dv]) and pv_t = v_t . (Tt^T dU)_t (float32 [nch][C]),
//     dTt = dU (diag(beta) V)^T + dW (diag(beta gamma) K)^T,
//     dA = -Tt^T dTt Tt^T (strictly lower),  D = diag(beta) dA (.) Gamma,  dK += D K + D^T K,
//     dbeta = rowsum(Tt^T dU (.) V) + gamma rowsum(Tt^T dW (.) K) + rowsum(dA (.) Gamma (.) K K^T)
// (dbt, float32 [nch][C]); dK's first terms fdk (float32 [nch][C][Dk], lf_dqk_delta_kernel's) read and
// the whole dK written (bf16 [B,T,H,Dk]): the token gradients leave the chunk kernels final. Dynamic
// shared memory LF_UTB_SMEM bytes: dV', dW hi + lo and V, K ([64][LF_LDK] each), Tt^T hi + lo, and
// a region that holds S's column slice, then dTt / Tt^T dTt / D and D^T (hi + lo, [64][LF_LDO]).
__global__ void __launch_bounds__(LF_THREADS) lf_utb_kernel(const LcDims d, const LcGates gt, const bf16 *kin,
                                                           const bf16 *vin, const float *dvp, const float *sts,
                                                           const float *tt, const float *fdk, bf16 *dko, bf16 *dvo,
                                                           float *pv, float *dbt) {
    extern __shared__ __align__(16) unsigned char lf_dsmem[];
    bf16 *Uh = (bf16 *)lf_dsmem, *Ul = Uh + LF_TK, *Wh = Ul + LF_LO(LF_TK), *Wl = Wh + LF_TK, *Vt = Wl + LF_LO(LF_TK),
         *Kt = Vt + LF_TK, *Sh = Kt + LF_TK, *Sl = Sh + LF_TSV, *Th = Sh + LF_TSR, *Tl = Th + LF_TO;
    bf16 *Mh = Sh, *Ml = Mh + LF_TO, *Nh = Ml + LF_LO(LF_TO), *Nl = Nh + LF_TO;  // (in S's place, after dW)
    float *red = (float *)(Tl + LF_LO(LF_TO));
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, Dk = d.Dk, Dv = d.Dv, lr = lane >> 2, lc = 2 * (lane & 3);
    const size_t ch = blockIdx.x, r = ch * LF_C;
    const int p = (int)(ch / d.N), t0 = (int)(ch % d.N) * LF_C;
    const float *b = gt.b + r;
    const LfSrc us = {dvp, NULL, 0, Dv};
    lf_load(d, lf_src_d(vin, Dv), ch, 0, Dv, Vt, LF_LDK, LF_UNR);  // (copies in flight during lf_load2)
    lf_load(d, lf_src_d(kin, Dk), ch, 0, Dk, Kt, LF_LDK, LF_UNR);
    lf_load2(d, us, ch, 0, Dv, Uh, Ul, LF_LDK, LF_UNR);
    for (int e = threadIdx.x; e < LF_C * LF_C; e += blockDim.x) {  // Th[i][m] = Tt[m][i]
        int m = e / LF_C, i = e - m * LF_C;
        float x = tt[(r + m) * LF_C + i], h = lf_hi(x);
        st(Th, (size_t)i * LF_LDO + m, h);
        if (LF_SPLIT) st(Tl, (size_t)i * LF_LDO + m, x - h);
    }
    float acc[8][4], att[8][4], rs[2] = {0.0f, 0.0f};
    for (int c0 = 0; c0 < Dk; c0 += LF_RO) {  // dW = -dV' S, a slice of 64 columns at a time
        lf_sync();
        lf_load_state_cols(d, sts, ch, c0, Sh, Sl);
        lf_sync();
        lf_zero(acc);
        lf_mm(acc, Uh, Ul, LF_LDK, Sh, Sl, LF_LDO, Dv, Dk - c0);
        lf_st_frag(acc, -1.0f, Wh + c0, Wl + c0, LF_LDK, Dk - c0, 0);
    }
    lf_sync();
    for (int c0 = 0; c0 < Dv; c0 += LF_RO) {  // Tt^T dU: dv; dbeta's first term
        lf_zero(acc);
        lf_mm(acc, Th, Tl, LF_LDO, Uh + c0, Ul + c0, LF_LDK, LF_C, Dv - c0);
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int i = 16 * w + lr + 8 * h, col = c0 + 8 * n + lc;
                if (col >= Dv) continue;
                rs[h] = fmaf(ld(Vt, (size_t)i * LF_LDK + col), acc[n][2 * h], rs[h]);
                rs[h] = fmaf(ld(Vt, (size_t)i * LF_LDK + col + 1), acc[n][2 * h + 1], rs[h]);
                const float bt = gt.beta[r + i];
                if (t0 + i < d.T) lf_st_pair(dvo, lc_tok(d, p, t0 + i) * Dv + col, bt * acc[n][2 * h], bt * acc[n][2 * h + 1]);
            }
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {  // v . Tt^T dU, the row's four lanes joined (the first term alone so far)
        float x = rs[h];
        x += __shfl_xor_sync(0xffffffffu, x, 1);
        x += __shfl_xor_sync(0xffffffffu, x, 2);
        if ((lane & 3) == 0) pv[r + 16 * w + lr + 8 * h] = x;
    }
    // dTt = (dU V^T) diag(beta) + (dW K^T) diag(beta gamma)
    lf_abt(att, Uh, Ul, Vt, NULL, Dv, 0, 3);
    lf_abt(acc, Wh, Wl, Kt, NULL, Dk, 0, 3);
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int j = 8 * n + lc + (e & 1);
            att[n][e] = gt.beta[r + j] * att[n][e] + gt.bg[r + j] * acc[n][e];
        }
    lf_st_frag(att, 1.0f, Mh, Ml, LF_LDO, LF_C, 0);
    lf_sync();
    lf_zero(acc);
    lf_mm(acc, Th, Tl, LF_LDO, Mh, Ml, LF_LDO, LF_C, LF_C);  // Tt^T dTt
    lf_sync();
    lf_st_frag(acc, 1.0f, Mh, Ml, LF_LDO, LF_C, 0);
    lf_sync();
    lf_zero(acc);
    lf_mm(acc, Mh, Ml, LF_LDO, Th, Tl, LF_LDO, LF_C, LF_C);  // (Tt^T dTt) Tt^T = -dA
    lf_abt(att, Kt, NULL, Kt, NULL, Dk, 0, w);                // K K^T
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int i = 16 * w + lr + 8 * (e >> 1), j = 8 * n + lc + (e & 1);
            float x = j < i ? -acc[n][e] * expf(b[i] - b[j]) : 0.0f;  // dA (.) Gamma
            rs[e >> 1] = fmaf(x, att[n][e], rs[e >> 1]);
            acc[n][e] = gt.beta[r + i] * x;  // D
        }
    lf_sync();  // Tt^T dTt read: D and D^T take the region
    lf_st_frag(acc, 1.0f, Mh, Ml, LF_LDO, LF_C, 0);
    lf_st_frag(acc, 1.0f, Nh, Nl, LF_LDO, LF_C, 1);
    lf_sync();
    for (int c0 = 0; c0 < Dk; c0 += LF_RO) {  // dK += diag(beta gamma) Tt^T dW + D K + D^T K (dbeta's second term)
        lf_zero(acc);
        lf_mm(acc, Th, Tl, LF_LDO, Wh + c0, Wl + c0, LF_LDK, LF_C, Dk - c0);
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int i = 16 * w + lr + 8 * (e >> 1), col = c0 + 8 * n + lc + (e & 1);
                if (col < Dk) rs[e >> 1] = fmaf(gt.gam[r + i] * ld(Kt, (size_t)i * LF_LDK + col), acc[n][e], rs[e >> 1]);
                acc[n][e] *= gt.bg[r + i];
            }
        lf_mm(acc, Mh, Ml, LF_LDO, Kt + c0, NULL, LF_LDK, LF_C, Dk - c0);
        lf_mm(acc, Nh, Nl, LF_LDO, Kt + c0, NULL, LF_LDK, LF_C, Dk - c0);
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int i = 16 * w + lr + 8 * h, col = c0 + 8 * n + lc;
                if (col >= Dk || t0 + i >= d.T) continue;
                const float2 f = *(const float2 *)(fdk + (r + i) * Dk + col);
                lf_st_pair(dko, lc_tok(d, p, t0 + i) * Dk + col, f.x + acc[n][2 * h], f.y + acc[n][2 * h + 1]);
            }
    }
    red[(16 * w + lr) * 4 + (lane & 3)] = rs[0];
    red[(16 * w + lr + 8) * 4 + (lane & 3)] = rs[1];
    lf_sync();
    if (threadIdx.x < LF_C) {
        const float *rr = red + threadIdx.x * 4;
        dbt[r + threadIdx.x] = (rr[0] + rr[1]) + (rr[2] + rr[3]);
    }
}

// The backward's per-token gate gradients of one chunk (one block of LC_OUT_THREADS), fused path:
// from the slices' shares pq (q . dq, nq of them a token) and pv (v . dV', nv; the delta rule's:
// v . Tt^T dU, one), dbeta = v . dV' (the delta rule's: dbt, lf_utb_kernel's) and
// dg_t = <dS_end, S_end> + sum_{t' >= t} (q . dq - beta v . dV')_t' (in double: the terms cancel).
__global__ void __launch_bounds__(LC_OUT_THREADS) lf_gates_bwd_kernel(const LcDims d, const LcGates gt,
                                                                      const float *pq, int nq, const float *pv,
                                                                      int nv, const float *dbt, const float *st,
                                                                      const float *sfin, const float *dst, float *dg,
                                                                      float *dbeta, int has_g, int has_beta) {
    __shared__ double dG[LC_CMAX], red[LC_OUT_THREADS];
    __shared__ float dbs[LC_CMAX];
    const int tid = threadIdx.x;
    const size_t ch = blockIdx.x, r = ch * LF_C;
    const int p = (int)(ch / d.N), c = (int)(ch % d.N), t0 = c * LF_C, n = min(LF_C, d.T - t0);
    if (tid < n) {
        float qd = 0.0f, vd = 0.0f;
        for (int i = 0; i < nq; i++) qd += pq[(r + tid) * nq + i];
        for (int i = 0; i < nv; i++) vd += pv[(r + tid) * nv + i];
        dG[tid] = (double)qd - (double)gt.beta[r + tid] * vd;
        dbs[tid] = dbt ? dbt[r + tid] : vd;
    }
    if (dg && has_g)  // <dS_end, S_end>
        red[tid] = lc_dot_share(c + 1 < d.N ? st + (ch + 1) * d.ss : sfin + (size_t)p * d.ss, dst + ch * d.ss, d.ss);
    lc_gates_store(d, p, t0, n, dG, dbs, red, dg, dbeta, has_g, has_beta);  // (no copies in flight: a plain barrier)
}
