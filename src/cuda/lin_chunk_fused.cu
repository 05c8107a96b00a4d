/*
 * The fused path's host side and its chunk-local kernels (lin_chunk_fused.cuh): the delta rule's UT
 * transform (lf_prep_kernel), the output (lf_out_kernel) and, by the same body with the roles
 * swapped, the backward's dV' (lf_dv_kernel; lf_dvi_kernel, its intra-chunk part for the delta
 * rule). A block per chunk (and slice of columns), four warps of 16 rows.
 */
#include <stdlib.h>
#include <string.h>

#include "lin_chunk_fused.cuh"

// ------------------------------------------------------------------------------- kernels

// The delta rule's UT transform of one chunk (one block, 4 warps of 16 rows), for the fused
// forward: A = strictLower(diag(beta) (Gamma (.) K K^T)) (K K^T on the tensor cores), Tt = (I + A)^{-1}
// by forward substitution in fp32 (thread j < C owns column j: Tt_ij = -sum_{j <= m < i} A_im Tt_mj
// only reads its own column, so no barrier between rows), then W = Tt diag(beta gamma) K and
// U = Tt diag(beta) V on the tensor cores: the row scales folded into Tt's columns (fp32), which is
// split hi + lo (two products against the exact bf16 K or V), float32 chunk major [nch][C][D] (the
// bf16 build: bf16 chunk major, one product).
// tn holds -A transposed in its upper triangle (tn[m][i] = -A_im, m < i) and Tt in its lower one.
// Dynamic shared memory: LF_PREP_SMEM bytes.
#define LF_TT (LF_C * LF_LDO)
#define LF_PREP_SMEM ((LF_TK + LF_TT + LF_LO(LF_TT)) * 2 + LF_C * (LF_C + 1) * 4)
static __global__ void __launch_bounds__(LF_THREADS) lf_prep_kernel(const LcDims d, const LcGates gt, const bf16 *kin,
                                                                   const bf16 *vin, float *wout, float *uout,
                                                                   float *ttout) {
    extern __shared__ __align__(16) unsigned char lf_dsmem[];
    bf16 *Ks = (bf16 *)lf_dsmem, *Th = Ks + LF_TK, *Tl = Th + LF_TT;
    float(*tn)[LF_C + 1] = (float(*)[LF_C + 1])(Tl + LF_LO(LF_TT));
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, Dk = d.Dk, Dv = d.Dv, lr = lane >> 2, lc = 2 * (lane & 3);
    const size_t ch = blockIdx.x;
    const float *b = gt.b + ch * LF_C, *beta = gt.beta + ch * LF_C;
    LfSrc ks = {kin, NULL, 1, Dk};
    lf_load(d, ks, ch, 0, Dk, Ks, LF_LDK, LF_UNR);
    lf_sync();
    {
        float kk[8][4];
        lf_abt(kk, Ks, NULL, Ks, NULL, Dk, 0, w);  // columns past the warp's rows (above the diagonal) left zero
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int i = 16 * w + lr + 8 * (e >> 1), j = 8 * n + lc + (e & 1);
                if (j < i) tn[j][i] = -beta[i] * expf(b[i] - b[j]) * kk[n][e];
            }
    }
    lf_sync();
    const int j = threadIdx.x;
    if (j < LF_C)
        for (int i = j + 1; i < LF_C; i++) {
            float a = tn[j][i];
            for (int m = j + 1; m < i; m++) a = fmaf(tn[m][i], tn[m][j], a);
            tn[i][j] = a;
        }
    lf_sync();
    if (ttout)  // Tt itself (the fused delta backward's lf_utb_kernel)
        for (int e = threadIdx.x; e < LF_C * LF_C; e += blockDim.x) {
            int i = e / LF_C, m = e - i * LF_C;
            ttout[ch * LF_C * LF_C + e] = m < i ? tn[i][m] : m == i ? 1.0f : 0.0f;
        }
    for (int pass = 0; pass < 2; pass++) {  // W, then U
        const int D = pass ? Dv : Dk;
        const float *sc = (pass ? gt.beta : gt.bg) + ch * LF_C;
        for (int e = threadIdx.x; e < LF_C * LF_C; e += blockDim.x) {
            int i = e / LF_C, m = e - i * LF_C;
            float x = m < i ? tn[i][m] * sc[m] : m == i ? sc[i] : 0.0f, h = lf_hi(x);
            st(Th, (size_t)i * LF_LDO + m, h);
            if (LF_SPLIT) st(Tl, (size_t)i * LF_LDO + m, x - h);
        }
        LfSrc src = {pass ? (const void *)vin : (const void *)kin, NULL, 1, D};
        lf_load(d, src, ch, 0, D, Ks, LF_LDK, LF_UNR);
        lf_sync();
        float acc[16][4];
#pragma unroll
        for (int n = 0; n < 16; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[n][e] = 0.0f;
        for (int kt = 0; kt <= w; kt++) {  // Tt is lower triangular
            uint32_t ah[4], al[4];
            ldsm_x4(ah, Th + (16 * w + (lane & 15)) * LF_LDO + kt * 16 + (lane >> 4) * 8);
            if (LF_SPLIT) ldsm_x4(al, Tl + (16 * w + (lane & 15)) * LF_LDO + kt * 16 + (lane >> 4) * 8);
#pragma unroll
            for (int dp = 0; dp < 8; dp++) {
                if (dp * 16 >= D) continue;
                uint32_t bb[4];
                ldsm_x4_t(bb, Ks + (kt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LF_LDK + dp * 16 + (lane >> 4) * 8);
                if (LF_SPLIT) mma_bf16_x2(&acc[2 * dp], al, bb);
                mma_bf16_x2(&acc[2 * dp], ah, bb);
            }
        }
        float *out = pass ? uout : wout;
#pragma unroll
        for (int n = 0; n < 16; n++) {
            if (n * 8 >= D) continue;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int t = 16 * w + lr + 8 * h;
                const size_t at = (ch * LF_C + t) * D + 8 * n + lc;
                if (LF_SPLIT) {
                    out[at] = acc[n][2 * h];
                    out[at + 1] = acc[n][2 * h + 1];
                } else {  // the bf16 build's W and U: bf16, for the walks' cp.async
                    *(uint32_t *)((bf16 *)out + at) = pack_bf16(acc[n][2 * h], acc[n][2 * h + 1]);
                }
            }
        }
        lf_sync();
    }
}

// Rows c0 .. c0 + 63 of the chunk's state (float32 [Dv][Dk]; zero past Dv) into two bf16 tiles of
// row stride LF_LDK, hi + lo.
static __device__ __forceinline__ void lf_load_state(const LcDims d, const float *states, size_t ch, int c0, bf16 *hi,
                                                     bf16 *lo) {
    const int n4 = d.Dk / 4, total = LF_RO * n4;
    for (int e0 = threadIdx.x; e0 < total; e0 += LF_UNR * blockDim.x) {
        float4 f[LF_UNR];
#pragma unroll
        for (int u = 0; u < LF_UNR; u++) {
            int e = e0 + u * blockDim.x, r = e / n4;
            f[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (e < total && c0 + r < d.Dv) f[u] = *(const float4 *)(states + (ch * d.Dv + c0 + r) * d.Dk + 4 * (e - r * n4));
        }
#pragma unroll
        for (int u = 0; u < LF_UNR; u++) {
            int e = e0 + u * blockDim.x, r = e / n4;
            if (e >= total) continue;
            size_t o = (size_t)r * LF_LDK + 4 * (e - r * n4);
            lf_st2s(hi + o, lo + o, f[u].x, f[u].y);
            lf_st2s(hi + o + 2, lo + o + 2, f[u].z, f[u].w);
        }
    }
}

// The output of one (chunk, slice of LF_RO columns of Dv), both rules, 4 warps of 16 rows:
//     O = diag(gamma) Qs S^T + ((Qs K^T) (.) Gamma) V'
// q, k bf16 as given (exact operands); S the chunk's entry state (float32 [nch][Dv][Dk]); V' from vp
// (LfSrc: the delta rule's float32 V', or GLA's diag(beta) V read from v). Qs K^T masked and scaled
// in fp32 in registers, then split into bf16 A fragments hi + lo for the second product
// (FlashAttention's P V); S and V' split too (two products for Q S^T, three for P V'), so that O
// carries about its own bf16 rounding only. Dynamic shared memory: LF_OUT_SMEM bytes.
//
// BWD = 1: the same kernel gives the backward's dV' (GLA), the roles swapped:
//     dV' = diag(lambda) K dS^T + ((K Qs^T) (.) Gamma^T) dO
// with qin = k (the rows' operand), kin = q, states = the adjoints dS, vp = dO (exact bf16), the
// scores' upper triangle (j >= i, scale e^{b_j - b_i}); out gets dv = diag(beta) dV' (bf16) and
// part[(ch C + t) gridDim.y + blockIdx.y] the slice's share of v_t . dV'_t (vin = v).
// BWD = 2 (the delta rule's backward): the intra-chunk part ((K Qs^T) (.) Gamma^T) dO only (no
// states), out float32 chunk major [nch][C][Dv] (fout, every row), read by the reverse walk as Y0.

// BWD (0, 1 or 2, a constant at each call, folded by the inlining): which of the three kernels.
static __device__ __forceinline__ void lf_out_body(const LcDims d, const LcGates gt, const bf16 *qin, const bf16 *kin,
                                                   const float *states, const LfSrc vp, float scale, bf16 *out,
                                                   const bf16 *vin, float *part, float *fout, const int BWD) {
    extern __shared__ __align__(16) unsigned char lf_dsmem[];
    bf16 *Qs = (bf16 *)lf_dsmem, *KS = Qs + LF_TK, *Sl = KS + LF_TK, *Vh = Sl + LF_LO(LF_TK), *Vl = Vh + LF_TO;
    float *red = (float *)(Vl + LF_LO(LF_TO));  // [64][4] (BWD): the row sums' shares of the lanes
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, Dk = d.Dk, Dv = d.Dv, lr = lane >> 2, lc = 2 * (lane & 3);
    const size_t ch = blockIdx.x;
    const int c0 = blockIdx.y * LF_RO, p = (int)(ch / d.N), t0 = (int)(ch % d.N) * LF_C;
    const float *b = gt.b + ch * LF_C;
    LfSrc qsrc = {qin, NULL, 1, Dk}, ksrc = {kin, NULL, 1, Dk};
    lf_load(d, qsrc, ch, 0, Dk, Qs, LF_LDK, LF_UNR);
    if (BWD != 2) lf_load_state(d, states, ch, c0, KS, Sl);  // S now (hi + lo), K in S's hi tile after it
    lf_load2(d, vp, ch, c0, LF_RO, Vh, Vl, LF_LDO, LF_UNR);
    lf_sync();
    float o[8][4];
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[n][e] = 0.0f;
    for (int s = 0; s < (BWD == 2 ? 0 : Dk / 16); s++) {
        uint32_t af[4], bh[4], bl[4];
        ldsm_x4(af, Qs + (16 * w + (lane & 15)) * LF_LDK + s * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int np = 0; np < 4; np++) {
            if (c0 + np * 16 >= Dv) continue;
            const int bo = (np * 16 + (lane & 7) + (lane >> 4) * 8) * LF_LDK + s * 16 + ((lane >> 3) & 1) * 8;
            ldsm_x4(bh, KS + bo);
            if (LF_SPLIT) {
                ldsm_x4(bl, Sl + bo);
                mma_bf16_x2(&o[2 * np], af, bl);
            }
            mma_bf16_x2(&o[2 * np], af, bh);
        }
    }
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const size_t r = ch * LF_C + 16 * w + lr + 8 * (e >> 1);
            o[n][e] *= BWD ? gt.lam[r] : scale * gt.gam[r];
        }
    lf_sync();  // S's hi tile read: it takes K
    lf_load(d, ksrc, ch, 0, Dk, KS, LF_LDK, LF_UNR);
    lf_sync();
    float att[8][4];
    lf_abt(att, Qs, NULL, KS, NULL, Dk, BWD ? w : 0, BWD ? 3 : w);  // keys after the warp's last row (BWD: before its first) left zero
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int i = 16 * w + lr + 8 * (e >> 1), j = 8 * n + lc + (e & 1);
            if (BWD) att[n][e] = j >= i ? scale * expf(b[j] - b[i]) * att[n][e] : 0.0f;
            else att[n][e] = j <= i ? scale * expf(b[i] - b[j]) * att[n][e] : 0.0f;
        }
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        if (BWD ? kk < w : kk > w) continue;
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
            if (c0 + dp * 16 >= Dv) continue;
            const int bo = (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LF_LDO + dp * 16 + (lane >> 4) * 8;
            uint32_t bh[4], bl[4];
            ldsm_x4_t(bh, Vh + bo);
            if (LF_SPLIT) ldsm_x4_t(bl, Vl + bo);
            mma3(o[2 * dp], ph, pl, bh[0], bh[1], bl[0], bl[1]);
            mma3(o[2 * dp + 1], ph, pl, bh[2], bh[3], bl[2], bl[3]);
        }
    }
    if (!BWD)
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int i = 16 * w + lr + 8 * h, col = c0 + 8 * n + lc;
                if (t0 + i < d.T && col < Dv) lf_st_pair(out, lc_tok(d, p, t0 + i) * Dv + col, o[n][2 * h], o[n][2 * h + 1]);
            }
    if (BWD == 2)
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int i = 16 * w + lr + 8 * (e >> 1), col = c0 + 8 * n + lc + (e & 1);
                if (col < Dv) fout[(ch * LF_C + i) * Dv + col] = o[n][e];
            }
    if (BWD != 1) return;
    float rs[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int i = 16 * w + lr + 8 * h, col = c0 + 8 * n + lc;
            if (t0 + i >= d.T || col >= Dv) continue;
            const size_t o_ = lc_tok(d, p, t0 + i) * Dv + col;
            const float bt = gt.beta[ch * LF_C + i];
            rs[h] = fmaf(ld(vin, o_), o[n][2 * h], rs[h]);
            rs[h] = fmaf(ld(vin, o_ + 1), o[n][2 * h + 1], rs[h]);
            lf_st_pair(out, o_, bt * o[n][2 * h], bt * o[n][2 * h + 1]);
        }
    red[(16 * w + lr) * 4 + (lane & 3)] = rs[0];
    red[(16 * w + lr + 8) * 4 + (lane & 3)] = rs[1];
    lf_sync();
    if (threadIdx.x < LF_C) {
        const float *rr = red + threadIdx.x * 4;
        part[(ch * LF_C + threadIdx.x) * gridDim.y + blockIdx.y] = (rr[0] + rr[1]) + (rr[2] + rr[3]);
    }
}

static __global__ void __launch_bounds__(LF_THREADS) lf_out_kernel(const LcDims d, const LcGates gt, const bf16 *qin,
                                                                  const bf16 *kin, const float *states, const LfSrc vp,
                                                                  float scale, bf16 *out) {
    lf_out_body(d, gt, qin, kin, states, vp, scale, out, NULL, NULL, NULL, 0);
}

static __global__ void __launch_bounds__(LF_THREADS) lf_dv_kernel(const LcDims d, const LcGates gt, const bf16 *kin,
                                                                 const bf16 *qin, const float *dst, const LfSrc dout,
                                                                 float scale, bf16 *dv, const bf16 *vin, float *part) {
    lf_out_body(d, gt, kin, qin, dst, dout, scale, dv, vin, part, NULL, 1);
}

static __global__ void __launch_bounds__(LF_THREADS) lf_dvi_kernel(const LcDims d, const LcGates gt, const bf16 *kin,
                                                                  const bf16 *qin, const LfSrc dout, float scale,
                                                                  float *dvp) {
    lf_out_body(d, gt, kin, qin, NULL, dout, scale, NULL, NULL, NULL, dvp, 2);
}

// ------------------------------------------------------------------------------ host side

static LfSrc lf_src(const void *p, const float *rs, int tok, int D) {
    LfSrc s = {p, rs, tok, D};
    return s;
}

// The fused path takes the call where it takes the shape (chunks of 64, Dk and Dv multiples of 16 up
// to 128) and the device allows its kernels' shared memory (smem bytes: LF_WALK_SMEM for the forward
// and GLA's backward, LF_BWD_DELTA_SMEM for the delta rule's backward); lin_chunk.cu chooses among the
// builds (lin_path) and sends what none takes to the cuBLAS path.
int lf_use(const CudaCtx *c, const LcDims *d, size_t smem) {
    return smem <= c->smem_optin && d->C == LF_C && d->Dk % 16 == 0 && d->Dk <= LF_KMAX && d->Dv % 16 == 0 && d->Dv <= LF_KMAX;
}

// The fused forward: gates (lc_gates_kernel), the delta rule's UT transform (lf_prep_kernel), the
// state walk (lf_walk_kernel) and the output (lf_out_kernel): 3 launches (GLA) or 4 (delta).
int lf_forward(const Backend *be, CudaCtx *c, const LcDims *d, int delta, float scale, const MnLinFwd *io) {
    int Dk = d->Dk, Dv = d->Dv;
    size_t rg = d->nch * LF_C, rk = rg * Dk, rv = rg * Dv, states = d->nch * d->ss;
    size_t total = 6 * rg + d->nch + (delta ? rk + 2 * rv : 0) + states + 11 * LC_ALIGN;
    float *m = (float *)cuda_scratch(be, sizeof(float) * total);
    if (!m) return MN_ERR_NOMEM;
    LcGates gt;
    float *wb = NULL, *ub = NULL, *vpb = NULL, *st_;
#define TAKE(ptr, n) (ptr = m, m += ((n) + LC_ALIGN - 1) / LC_ALIGN * LC_ALIGN)
    TAKE(gt.b, rg); TAKE(gt.gam, rg); TAKE(gt.lam, rg); TAKE(gt.beta, rg); TAKE(gt.bg, rg);
    TAKE(gt.dec, d->nch);
    if (delta) { TAKE(wb, rk); TAKE(ub, rv); }
    if (delta && !LF_SPLIT) TAKE(vpb, rv);  // (V' float32 beside the bf16 U; the split build's in U's place)
    else vpb = ub;
    TAKE(st_, states);
#undef TAKE
    const bf16 *q = (const bf16 *)io->q, *k = (const bf16 *)io->k, *v = (const bf16 *)io->v;
    lc_gates_kernel<<<grid_for(d->nch, LC_GPB), LC_GPB * LC_CMAX, 0, c->stream>>>(*d, io->g, io->beta, gt);
    LAUNCH_CHECK();
    if (delta) {
        CU_TRY(cudaFuncSetAttribute(lf_prep_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, LF_PREP_SMEM));
        lf_prep_kernel<<<(unsigned)d->nch, LF_THREADS, LF_PREP_SMEM, c->stream>>>(*d, gt, k, v, wb, ub, (float *)NULL);
        LAUNCH_CHECK();
    }
    LfWalk wk;
    memset(&wk, 0, sizeof wk);
    if (delta) {
        wk.a = lf_src(wb, NULL, LF_SPLIT ? 0 : LF_CHUNK_BF16, Dk);
        wk.a_exact = !LF_SPLIT;
        wk.y0 = lf_src(ub, NULL, LF_SPLIT ? 0 : LF_CHUNK_BF16, Dv);
        wk.sa = -1.0f;
        wk.y = vpb;  // V'
    } else {
        wk.y0 = lf_src(v, gt.beta, 1, Dv);
    }
    wk.b = lf_src(k, NULL, 1, Dk);  // K (exact in bf16), lambda on Y's rows
    wk.rb = gt.lam;
    wk.b_exact = 1;
    wk.sb = 1.0f;
    wk.dec = gt.dec;
    wk.init = io->s0;
    wk.xs = st_;
    wk.xfin = io->sT;
    MN_TRY(lf_walk(c, d, &wk));
    LfSrc vp = delta ? lf_src(vpb, NULL, 0, Dv) : lf_src(v, gt.beta, 1, Dv);
    CU_TRY(cudaFuncSetAttribute(lf_out_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, LF_OUT_SMEM));
    lf_out_kernel<<<dim3((unsigned)d->nch, (unsigned)((Dv + LF_RO - 1) / LF_RO)), LF_THREADS, LF_OUT_SMEM, c->stream>>>(*d, gt, q, k, st_, vp, scale, (bf16 *)io->o);
    LAUNCH_CHECK();
    return MN_OK;
}

// The fused backward of the GLA rule: gates (lc_gates_kernel), the chunks' entry states again and
// the end states' adjoints (lf_walk_kernel twice: forward, then reverse with X = dS, Y = dO, B = Qs,
// gamma on Y's rows), dV' (lf_dv_kernel), dQs and dK (lf_dqk_kernel), dg and dbeta
// (lf_gates_bwd_kernel): 6 launches, reading the inputs as the call gives them.
int lf_backward_gla(const Backend *be, CudaCtx *c, const LcDims *d, float scale, const MnLinBwd *io) {
    const int Dk = d->Dk, Dv = d->Dv, nyk = (Dk + LF_RO - 1) / LF_RO, nyv = (Dv + LF_RO - 1) / LF_RO;
    size_t rg = d->nch * LF_C, states = d->nch * d->ss, fins = (size_t)d->P * d->ss;
    size_t total = 5 * rg + d->nch + 2 * states + fins + rg * (nyk + nyv) + 11 * LC_ALIGN;
    float *m = (float *)cuda_scratch(be, sizeof(float) * total);
    if (!m) return MN_ERR_NOMEM;
    LcGates gt;
    float *st_, *dst, *sfin, *pq, *pv;
#define TAKE(ptr, n) (ptr = m, m += ((n) + LC_ALIGN - 1) / LC_ALIGN * LC_ALIGN)
    TAKE(gt.b, rg); TAKE(gt.gam, rg); TAKE(gt.lam, rg); TAKE(gt.beta, rg); TAKE(gt.bg, rg);
    TAKE(gt.dec, d->nch);
    TAKE(st_, states); TAKE(dst, states); TAKE(sfin, fins);
    TAKE(pq, rg * nyk); TAKE(pv, rg * nyv);
#undef TAKE
    const bf16 *q = (const bf16 *)io->q, *k = (const bf16 *)io->k, *v = (const bf16 *)io->v,
               *dout = (const bf16 *)io->dout;
    lc_gates_kernel<<<grid_for(d->nch, LC_GPB), LC_GPB * LC_CMAX, 0, c->stream>>>(*d, io->g, io->beta, gt);
    LAUNCH_CHECK();
    LfWalk wk;
    memset(&wk, 0, sizeof wk);  // S_c = the states entering the chunks
    wk.y0 = lf_src(v, gt.beta, 1, Dv);
    wk.b = lf_src(k, NULL, 1, Dk);
    wk.rb = gt.lam;
    wk.b_exact = 1;
    wk.sb = 1.0f;
    wk.dec = gt.dec;
    wk.init = io->s0;
    wk.xs = st_;
    wk.xfin = sfin;
    MN_TRY(lf_walk(c, d, &wk));
    memset(&wk, 0, sizeof wk);  // dS_c, last chunk first: dS <- gamma_n dS + dO^T diag(gamma) Qs
    wk.y0 = lf_src(dout, NULL, 1, Dv);
    wk.b = lf_src(q, NULL, 1, Dk);
    wk.rb = gt.gam;
    wk.b_exact = 1;
    wk.sb = scale;
    wk.dec = gt.dec;
    wk.init = io->dsT;
    wk.xs = dst;
    wk.xfin = io->ds0;
    wk.reverse = 1;
    MN_TRY(lf_walk(c, d, &wk));
    const LfSrc dos = lf_src(dout, NULL, 1, Dv);
    CU_TRY(cudaFuncSetAttribute(lf_dv_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, LF_OUT_SMEM));
    lf_dv_kernel<<<dim3((unsigned)d->nch, (unsigned)nyv), LF_THREADS, LF_OUT_SMEM, c->stream>>>(*d, gt, k, q, dst, dos, scale, (bf16 *)io->dv, v, pv);
    LAUNCH_CHECK();
    CU_TRY(cudaFuncSetAttribute(lf_dqk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, LF_DQK_SMEM));
    lf_dqk_kernel<<<dim3((unsigned)d->nch, (unsigned)nyk), LF_THREADS, LF_DQK_SMEM, c->stream>>>(*d, gt, q, k, v, dout, st_, dst, scale, (bf16 *)io->dq, (bf16 *)io->dk, pq);
    LAUNCH_CHECK();
    lf_gates_bwd_kernel<<<(unsigned)d->nch, LC_OUT_THREADS, 0, c->stream>>>(*d, gt, pq, nyk, pv, nyv, (const float *)NULL, st_, sfin, dst, io->dg, io->dbeta, io->g != NULL, io->beta != NULL);
    LAUNCH_CHECK();
    return MN_OK;
}

// The fused backward of the delta rule: 8 launches reading the inputs as the call gives them (no
// float32 copies of them): gates; W, U and Tt (lf_prep_kernel); the entry states and V' (lf_walk_kernel);
// the intra-chunk dV' (lf_dvi_kernel); dV' and the adjoints dS (lf_walk2_kernel, reverse); dq and dK's
// first terms (lf_dqk_delta_kernel); the UT transform's adjoint, dk and dv (lf_utb_kernel); dg and
// dbeta (lf_gates_bwd_kernel).
int lf_backward_delta(const Backend *be, CudaCtx *c, const LcDims *d, float scale, const MnLinBwd *io) {
    const int Dk = d->Dk, Dv = d->Dv, nyk = (Dk + LF_RO - 1) / LF_RO;
    size_t rg = d->nch * LF_C, rk = rg * Dk, rv = rg * Dv, cc = rg * LF_C, states = d->nch * d->ss;
    size_t fins = (size_t)d->P * d->ss;
    size_t total = (7 + nyk) * rg + d->nch + 2 * rk + 3 * rv + cc + 2 * states + fins + 21 * LC_ALIGN;
    float *m = (float *)cuda_scratch(be, sizeof(float) * total);
    if (!m) return MN_ERR_NOMEM;
    LcWork w;
    memset(&w, 0, sizeof w);
#define TAKE(ptr, n) (ptr = m, m += ((n) + LC_ALIGN - 1) / LC_ALIGN * LC_ALIGN)
    TAKE(w.gt.b, rg); TAKE(w.gt.gam, rg); TAKE(w.gt.lam, rg); TAKE(w.gt.beta, rg); TAKE(w.gt.bg, rg);
    TAKE(w.gt.dec, d->nch);
    TAKE(w.w, rk); TAKE(w.vp, rv); TAKE(w.tt, cc); TAKE(w.st, states); TAKE(w.sfin, fins);
    float *pq, *pv;  // the rows' q . dq (a share a slice of Dk) and v . Tt^T dU
    TAKE(w.dvp, rv); TAKE(w.dst, states); TAKE(w.dk, rk); TAKE(w.dbt, rg); TAKE(pq, rg * nyk); TAKE(pv, rg);
    float *ub = w.vp;  // U, then V' in its place; the bf16 build: U bf16 in its own buffer
    if (!LF_SPLIT) TAKE(ub, rv);
#undef TAKE
    const bf16 *q = (const bf16 *)io->q, *k = (const bf16 *)io->k, *v = (const bf16 *)io->v,
               *dout = (const bf16 *)io->dout;
    lc_gates_kernel<<<grid_for(d->nch, LC_GPB), LC_GPB * LC_CMAX, 0, c->stream>>>(*d, io->g, io->beta, w.gt);
    LAUNCH_CHECK();
    CU_TRY(cudaFuncSetAttribute(lf_prep_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, LF_PREP_SMEM));
    lf_prep_kernel<<<(unsigned)d->nch, LF_THREADS, LF_PREP_SMEM, c->stream>>>(*d, w.gt, k, v, w.w, ub, w.tt);
    LAUNCH_CHECK();
    const int wtok = LF_SPLIT ? 0 : LF_CHUNK_BF16;  // W and U float32, or bf16 (exact operands)
    LfWalk wk;
    memset(&wk, 0, sizeof wk);  // S_c, and V' = U - W S^T
    wk.a = lf_src(w.w, NULL, wtok, Dk);
    wk.a_exact = !LF_SPLIT;
    wk.y0 = lf_src(ub, NULL, wtok, Dv);
    wk.b = lf_src(k, NULL, 1, Dk);
    wk.rb = w.gt.lam;
    wk.b_exact = 1;
    wk.sa = -1.0f;
    wk.sb = 1.0f;
    wk.dec = w.gt.dec;
    wk.init = io->s0;
    wk.xs = w.st;
    wk.y = w.vp;
    wk.xfin = w.sfin;
    MN_TRY(lf_walk(c, d, &wk));
    CU_TRY(cudaFuncSetAttribute(lf_dvi_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, LF_OUT_SMEM));
    lf_dvi_kernel<<<dim3((unsigned)d->nch, (unsigned)((Dv + LF_RO - 1) / LF_RO)), LF_THREADS, LF_OUT_SMEM, c->stream>>>(*d, w.gt, k, q, lf_src(dout, NULL, 1, Dv), scale, w.dvp);
    LAUNCH_CHECK();
    memset(&wk, 0, sizeof wk);  // dS_c and dV', last chunk first
    wk.a = lf_src(k, NULL, 1, Dk);
    wk.ra = w.gt.lam;
    wk.a_exact = 1;
    wk.y0 = lf_src(w.dvp, NULL, 0, Dv);
    wk.b = lf_src(w.w, NULL, wtok, Dk);
    wk.b_exact = !LF_SPLIT;
    wk.sa = 1.0f;
    wk.sb = -1.0f;
    wk.dec = w.gt.dec;
    wk.y2 = lf_src(dout, NULL, 1, Dv);
    wk.b2 = lf_src(q, NULL, 1, Dk);
    wk.rb2 = w.gt.gam;
    wk.sb2 = scale;
    wk.init = io->dsT;
    wk.xs = w.dst;
    wk.y = w.dvp;
    wk.xfin = io->ds0;
    wk.reverse = 1;
    MN_TRY(lf_walk(c, d, &wk));
    const int smem = LF_DQK_SMEM + LF_LO(LF_TK) * 2;
    CU_TRY(cudaFuncSetAttribute(lf_dqk_delta_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    lf_dqk_delta_kernel<<<dim3((unsigned)d->nch, (unsigned)nyk), LF_THREADS, smem, c->stream>>>(*d, w.gt, q, k, w.vp, dout, w.st, w.dst, scale, (bf16 *)io->dq, pq, w.dk);
    LAUNCH_CHECK();
    CU_TRY(cudaFuncSetAttribute(lf_utb_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, LF_UTB_SMEM));
    lf_utb_kernel<<<(unsigned)d->nch, LF_THREADS, LF_UTB_SMEM, c->stream>>>(*d, w.gt, k, v, w.dvp, w.st, w.tt, w.dk, (bf16 *)io->dk, (bf16 *)io->dv, pv, w.dbt);
    LAUNCH_CHECK();
    lf_gates_bwd_kernel<<<(unsigned)d->nch, LC_OUT_THREADS, 0, c->stream>>>(*d, w.gt, pq, nyk, pv, 1, w.dbt, w.st, w.sfin, w.dst, io->dg, io->dbeta, io->g != NULL, io->beta != NULL);
    LAUNCH_CHECK();
    return MN_OK;
}
