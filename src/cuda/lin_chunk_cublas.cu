/*
 * The chunkwise form's cuBLAS path (lc_: lin_chunk.cuh), for every shape: everything laid out chunk
 * major in float32 (row buffers [nch][C][D], square ones [nch][C][C], gates [nch][C]).
 *
 * What does not depend on the running state is computed for all chunks of all pairs at once: small
 * kernels (gathers with row scalings, the decay masks, the UT transform's forward substitution
 * Tt = (I + A)^{-1} one block per chunk, the backward's per-token sums) and cuBLAS strided-batched
 * TF32 products over the nch chunks. Only the state's hand-off from chunk to chunk is sequential:
 *
 *     forward   V'_c = U_c - W_c S_c^T (delta);  S_{c+1} = gamma_n S_c + V'_c^T diag(lambda) K_c
 *     backward  dV'_c += diag(lambda) K_c dS_c^T;
 *               dS_{c-1} = gamma_n dS_c + dO_c^T diag(gamma) Qs_c - dV'_c^T W_c (delta)
 *
 * (dS_c: the adjoint of the state at the end of chunk c.) The GLA rule's V' does not depend on the
 * state (nor its dS on dV'): the increments of all chunks are one batched product, and the hand-off
 * a scan, one thread per state element walking the chunks (lc_scan_kernel). The delta rule's is a
 * loop over the N chunks of products batched over the P pairs. The entry states S_c (and the
 * adjoints dS_c) of every chunk are kept, so that the products that read them (O, dQs, dK, dW) run
 * batched over all chunks afterwards. Launches: forward 12 (GLA) or 15 + 3 N (delta); backward 21
 * (GLA) or 33 + 6 N (delta), the forward's state pass included (the backward recomputes it).
 *
 * Precision: float32 storage and sums; the products round their operands to TF32 (10-bit
 * mantissa, 2^-11 relative), which the tests' tolerances account for.
 */
#include <string.h>

#include "lin_chunk.cuh"

// ------------------------------------------------------------------------------- kernels

// x [B,T,H,D] bf16 into chunk-major float32: y1 = scale x, y2 = rs2 y1, y3 = rs3 y1 (row scales
// [nch][C]; any output may be NULL). Zero past the sequence's end.
static __global__ void lc_gather_kernel(const LcDims d, const bf16 *x, int D, float scale, float *y1, const float *rs2,
                                        float *y2, const float *rs3, float *y3) {
    size_t n = d.nch * d.C * D;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t row = e / D, ch = row / d.C;
        int j = (int)(e - row * D), t = (int)(row - ch * d.C) + (int)(ch % d.N) * d.C, p = (int)(ch / d.N);
        float a = t < d.T ? scale * ld(x, lc_tok(d, p, t) * D + j) : 0.0f;
        if (y1) y1[e] = a;
        if (y2) y2[e] = rs2[row] * a;
        if (y3) y3[e] = rs3[row] * a;
    }
}

// Chunk-major rows back to [B,T,H,D] bf16 (the real tokens only).
static __global__ void lc_scatter_kernel(const LcDims d, bf16 *y, const float *x, int D, float scale) {
    size_t n = d.nch * d.C * D;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t row = e / D, ch = row / d.C;
        int j = (int)(e - row * D), t = (int)(row - ch * d.C) + (int)(ch % d.N) * d.C, p = (int)(ch / d.N);
        if (t < d.T) st(y, lc_tok(d, p, t) * D + j, scale * x[e]);
    }
}

// m[ch] (.)= Gamma: m_ij e^{b_i - b_j} for j <= i, 0 above the diagonal.
static __global__ void lc_mask_kernel(const LcDims d, float *m, const float *b) {
    size_t n = d.nch * d.C * d.C, cc = (size_t)d.C * d.C;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t ch = e / cc;
        int i = (int)((e - ch * cc) / d.C), j = (int)(e - ch * cc - (size_t)i * d.C);
        const float *bc = b + ch * d.C;
        m[e] = j <= i ? m[e] * expf(bc[i] - bc[j]) : 0.0f;
    }
}

// y = rs x, rows of D (rs [rows]).
static __global__ void lc_rowscale_kernel(float *y, const float *x, const float *rs, size_t rows, int D) {
    size_t n = rows * D;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x)
        y[e] = rs[e / D] * x[e];
}

// The decay step of the state hand-off: y[p] = dec[p * dstride] x[p] (+ add[p], if given) for the P
// pairs' states (strides in floats between pairs; add's is xstride).
static __global__ void lc_decay_state_kernel(float *y, size_t ystride, const float *x, size_t xstride,
                                             const float *dec, size_t dstride, const float *add, int P, size_t ss) {
    size_t n = (size_t)P * ss;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t p = e / ss, i = e - p * ss;
        float a = dec[p * dstride] * x[p * xstride + i];
        y[p * ystride + i] = add ? a + add[p * xstride + i] : a;
    }
}

// The GLA rule's hand-off as a scan over the chunks, each thread one element i of one pair's state:
// X_c = the running value on entering chunk c (into out[ch]), X <- dec_ch X + inc[ch], from init
// (or 0) to fin (if given). Forward: c = 0 .. N-1 (states); reverse: c = N-1 .. 0 (adjoints).
static __global__ void lc_scan_kernel(const LcDims d, float *out, const float *inc, const float *dec,
                                      const float *init, float *fin, int reverse) {
    size_t n = (size_t)d.P * d.ss;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t p = e / d.ss, i = e - p * d.ss;
        float x = init ? init[e] : 0.0f;
        for (int k = 0; k < d.N; k++) {
            size_t ch = p * d.N + (reverse ? d.N - 1 - k : k), o = ch * d.ss + i;
            out[o] = x;
            x = fmaf(dec[ch], x, inc[o]);
        }
        if (fin) fin[e] = x;
    }
}

// The UT transform's inverse, one block of C threads per chunk: Tt = (I + A)^{-1} with
// A = strictLower(diag(beta) (Gamma (.) K K^T)), by forward substitution (lin_chunk.c values()):
// row i of Tt = e_i + sum_{m < i} N_im (row m), N = -A; thread j owns column j.
static __global__ void __launch_bounds__(LC_CMAX) lc_tinv_kernel(const LcDims d, const float *kk, const float *b,
                                                                 const float *beta, float *tt) {
    __shared__ float sn[LC_CMAX][LC_CMAX + 1], st_[LC_CMAX][LC_CMAX + 1];
    int C = d.C, j = threadIdx.x;
    size_t ch = blockIdx.x, cc = (size_t)C * C;
    const float *bc = b + ch * C, *bt = beta + ch * C, *kc = kk + ch * cc;
    for (int e = threadIdx.x; e < C * C; e += blockDim.x) {
        int i = e / C, m = e - i * C;
        sn[i][m] = m < i ? -bt[i] * expf(bc[i] - bc[m]) * kc[e] : 0.0f;
        st_[i][m] = i == m ? 1.0f : 0.0f;
    }
    __syncthreads();
    for (int i = 1; i < C; i++) {
        if (j < i) {
            float a = 0.0f;
            for (int m = j; m < i; m++) a = fmaf(sn[i][m], st_[m][j], a);
            st_[i][j] = a;
        }
        __syncthreads();
    }
    for (int e = threadIdx.x; e < C * C; e += blockDim.x) tt[ch * cc + e] = st_[e / C][e % C];
}

// The delta rule's backward per chunk (lin_chunk.c, the DELTA branch), one thread per row t:
//   dbeta_t = tdu_t . v_t + gamma_t tdw_t . k_t + sum_{j<t} dA_tj Gamma_tj (K K^T)_tj,
//   dA <- D = diag(beta) dA (.) Gamma (strictly lower),  dK_t += beta_t gamma_t tdw_t.
typedef struct {
    const float *tdu, *tdw, *v, *k, *kk;
    float *da, *dk, *dbt;
} LcComb;

static __global__ void lc_delta_comb_kernel(const LcDims d, const LcGates gt, const LcComb a) {
    int C = d.C, Dk = d.Dk, Dv = d.Dv, t = threadIdx.x;
    size_t ch = blockIdx.x, r = ch * C;
    const float *bc = gt.b + r;
    if (t < C) {
        size_t row = r + t;
        const float *tdu = a.tdu + row * Dv, *vt = a.v + row * Dv, *tdw = a.tdw + row * Dk, *kt = a.k + row * Dk;
        float x = 0.0f, y = 0.0f;
        for (int j = 0; j < Dv; j++) x = fmaf(tdu[j], vt[j], x);
        for (int j = 0; j < Dk; j++) y = fmaf(tdw[j], kt[j], y);
        x = fmaf(gt.gam[row], y, x);
        float *da = a.da + (ch * C + t) * C;
        const float *kk = a.kk + (ch * C + t) * C;
        for (int j = 0; j < C; j++) {
            float m = j < t ? da[j] * expf(bc[t] - bc[j]) : 0.0f;
            x = fmaf(m, kk[j], x);
            da[j] = gt.beta[row] * m;
        }
        a.dbt[row] = x;
    }
    for (size_t e = threadIdx.x; e < (size_t)C * Dk; e += blockDim.x) {
        size_t i = r * Dk + e;
        a.dk[i] = fmaf(gt.bg[r + e / Dk], a.tdw[i], a.dk[i]);
    }
}

// The cuBLAS path's token gradients out of chunk-major float32, one block per chunk (lin_chunk.c's last
// loop): dq = scale dQs, dk, dv (GLA: beta dV'; delta: beta Tt^T dU), dbeta (GLA: v . dV'), and
// dg_t = <dS_end, S_end> + sum_{t' >= t} (qs . dqs - v . dv)_t' (in double: the terms cancel).
typedef struct {
    const float *qs, *dqs, *v, *dvp, *tdu, *dk, *dbt, *st, *sfin, *dst;
    bf16 *dq, *dko, *dv;
    float *dg, *dbeta;
    int has_g, has_beta;
    float scale;
} LcOut;

static __global__ void __launch_bounds__(LC_OUT_THREADS) lc_bwd_out_kernel(const LcDims d, const LcGates gt,
                                                                           const LcOut a) {
    __shared__ double dG[LC_CMAX], red[LC_OUT_THREADS];
    __shared__ float dbs[LC_CMAX];
    int C = d.C, Dk = d.Dk, Dv = d.Dv, tid = threadIdx.x;
    size_t ch = blockIdx.x, r = ch * C;
    int p = (int)(ch / d.N), c = (int)(ch % d.N), t0 = c * C, n = min(C, d.T - t0);
    const float *dvsrc = a.tdu ? a.tdu : a.dvp;  // dv = beta dvsrc
    // The rows' dot products, a warp a row (lanes along the row: coalesced; with a thread a row, each
    // warp's loads touch 32 rows at once).
    for (int t = tid >> 5, lane = tid & 31; t < n; t += blockDim.x >> 5) {
        size_t row = r + t;
        const float *dqs = a.dqs + row * Dk, *dvs = dvsrc + row * Dv, *dvp = a.dvp + row * Dv;
        float qd = 0.0f, vd = 0.0f, vp = 0.0f;
        for (int j = lane; j < Dk; j += 32) qd = fmaf(a.qs[row * Dk + j], dqs[j], qd);
        for (int j = lane; j < Dv; j += 32) {
            float vt = a.v[row * Dv + j];
            vd = fmaf(vt, dvs[j], vd);
            vp = fmaf(vt, dvp[j], vp);
        }
        qd = warp_sum(qd);
        vd = warp_sum(vd);
        vp = warp_sum(vp);
        if (lane == 0) {
            dG[t] = (double)qd - (double)gt.beta[row] * vd;
            dbs[t] = a.tdu ? a.dbt[row] : vp;
        }
    }
    if (a.dg && a.has_g) {  // <dS_end, S_end>
        const float *se = c + 1 < d.N ? a.st + (ch + 1) * d.ss : a.sfin + (size_t)p * d.ss;
        red[tid] = lc_dot_share(se, a.dst + ch * d.ss, d.ss);
    }
    lc_gates_store(d, p, t0, n, dG, dbs, red, a.dg, a.dbeta, a.has_g, a.has_beta);
    for (int e = tid; e < n * Dk; e += blockDim.x) {
        int t = e / Dk, j = e - t * Dk;
        size_t o = lc_tok(d, p, t0 + t) * Dk + j;
        st(a.dq, o, a.scale * a.dqs[r * Dk + e]);
        st(a.dko, o, a.dk[r * Dk + e]);
    }
    for (int e = tid; e < n * Dv; e += blockDim.x) {
        int t = e / Dv, j = e - t * Dv;
        st(a.dv, lc_tok(d, p, t0 + t) * Dv + j, gt.beta[r + t] * dvsrc[r * Dv + e]);
    }
}

// ------------------------------------------------------------------------------ host side

// Row-major strided-batched product on the tensor cores (TF32):
//   C_i = alpha op(A_i) op(B_i) + beta C_i,  op(A): m x k, op(B): k x n, C: m x n, i < batch,
// as cuBLAS's column-major C^T = op(B)^T op(A)^T. Batches over 65535 go in pieces.
static int bgemm(CudaCtx *c, int ta, int tb, int m, int n, int k, float alpha, const float *A, int lda, size_t sA,
                 const float *B, int ldb, size_t sB, float beta, float *Cm, int ldc, size_t sC, size_t batch) {
    for (size_t b0 = 0; b0 < batch; b0 += 65535) {
        int nb = (int)(batch - b0 < 65535 ? batch - b0 : 65535);
        CUBLAS_TRY(cublasGemmStridedBatchedEx(c->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, n,
                                              m, k, &alpha, B + b0 * sB, CUDA_R_32F, ldb, (long long)sB, A + b0 * sA,
                                              CUDA_R_32F, lda, (long long)sA, &beta, Cm + b0 * sC, CUDA_R_32F, ldc,
                                              (long long)sC, nb, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT));
    }
    return MN_OK;
}

// Carves the buffers from one scratch allocation (bwd: the backward's too). (Products also read at
// chunk offsets c C D floats, 16-byte aligned where C D is a multiple of 4: C = 64 always.)
static int lc_alloc(const Backend *be, const LcDims *d, int delta, int bwd, LcWork *w) {
    size_t rk = d->nch * d->C * d->Dk, rv = d->nch * d->C * d->Dv, cc = d->nch * d->C * d->C, rg = d->nch * d->C;
    size_t states = d->nch * d->ss, fins = (size_t)d->P * d->ss;
    size_t nk = 4 + (delta ? 2 : 0) + (bwd ? 2 + (delta ? 2 : 0) : 0);
    size_t nv = (bwd ? 1 : 0) + 1 + (delta ? 1 : 0) + (bwd ? 4 + (delta ? 1 : 0) : 1);
    size_t nsq = (delta ? 2 : 0) + 1 + (bwd ? 1 : 0);
    size_t total = 6 * rg + d->nch + nk * rk + nv * rv + nsq * cc + states + fins + (bwd ? states + rg : 0) +
                   (!delta || bwd ? states : 0) + 40 * LC_ALIGN;  // (at most 40 buffers, each rounded up)
    float *m = (float *)cuda_scratch(be, sizeof(float) * total);
    if (!m) return MN_ERR_NOMEM;
    memset(w, 0, sizeof *w);
#define TAKE(ptr, n) (ptr = m, m += ((n) + LC_ALIGN - 1) / LC_ALIGN * LC_ALIGN)
    TAKE(w->gt.b, rg); TAKE(w->gt.gam, rg); TAKE(w->gt.lam, rg); TAKE(w->gt.beta, rg); TAKE(w->gt.bg, rg);
    TAKE(w->gt.dec, d->nch);
    TAKE(w->qs, rk); TAKE(w->qg, rk); TAKE(w->k, rk); TAKE(w->kl, rk);
    if (delta) { TAKE(w->kb, rk); TAKE(w->w, rk); }
    if (bwd) {
        TAKE(w->dqs, rk); TAKE(w->dk, rk);
        if (delta) { TAKE(w->dw, rk); TAKE(w->tdw, rk); }
        TAKE(w->v, rv);
    }
    TAKE(w->vb, rv);
    if (delta) TAKE(w->vp, rv); else w->vp = w->vb;
    if (bwd) {
        TAKE(w->dout, rv); TAKE(w->dog, rv); TAKE(w->dvp, rv); TAKE(w->vl, rv);
        if (delta) TAKE(w->tdu, rv);
    } else {
        TAKE(w->o, rv);
    }
    if (delta) { TAKE(w->kk, cc); TAKE(w->tt, cc); }
    TAKE(w->sq1, cc);
    if (bwd) TAKE(w->sq2, cc);
    TAKE(w->st, states); TAKE(w->sfin, fins);
    if (!delta || bwd) TAKE(w->inc, states);
    if (bwd) { TAKE(w->dst, states); TAKE(w->dbt, rg); }
#undef TAKE
    return MN_OK;
}

// Gates, the gathered inputs and (delta rule) K K^T, Tt, U (into V'), W: all chunks at once.
static int lc_prepare(CudaCtx *c, const LcDims *d, int delta, float scale, const bf16 *q, const bf16 *k,
                      const bf16 *v, const float *g, const float *beta, LcWork *w) {
    int C = d->C, Dk = d->Dk, Dv = d->Dv;
    size_t ck = (size_t)C * Dk, cv = (size_t)C * Dv, cc = (size_t)C * C;
    lc_gates_kernel<<<grid_for(d->nch, LC_GPB), LC_GPB * LC_CMAX, 0, c->stream>>>(*d, g, beta, w->gt);
    LAUNCH_CHECK();
    unsigned gk = grid_for(d->nch * ck, LC_THREADS), gv = grid_for(d->nch * cv, LC_THREADS);
    lc_gather_kernel<<<gk, LC_THREADS, 0, c->stream>>>(*d, q, Dk, scale, w->qs, w->gt.gam, w->qg, NULL, NULL);
    LAUNCH_CHECK();
    lc_gather_kernel<<<gk, LC_THREADS, 0, c->stream>>>(*d, k, Dk, 1.0f, w->k, w->gt.lam, w->kl, w->gt.bg, w->kb);
    LAUNCH_CHECK();
    lc_gather_kernel<<<gv, LC_THREADS, 0, c->stream>>>(*d, v, Dv, 1.0f, w->v, w->gt.beta, w->vb, NULL, NULL);
    LAUNCH_CHECK();
    if (!delta) return MN_OK;  // V' = diag(beta) V
    MN_TRY(bgemm(c, 0, 1, C, C, Dk, 1, w->k, Dk, ck, w->k, Dk, ck, 0, w->kk, C, cc, d->nch));  // K K^T
    lc_tinv_kernel<<<(unsigned)d->nch, C, 0, c->stream>>>(*d, w->kk, w->gt.b, w->gt.beta, w->tt);
    LAUNCH_CHECK();
    MN_TRY(bgemm(c, 0, 0, C, Dv, C, 1, w->tt, C, cc, w->vb, Dv, cv, 0, w->vp, Dv, cv, d->nch));  // U = Tt beta V
    MN_TRY(bgemm(c, 0, 0, C, Dk, C, 1, w->tt, C, cc, w->kb, Dk, ck, 0, w->w, Dk, ck, d->nch));   // W
    return MN_OK;
}

// The states entering every chunk (w->st) and the final ones (w->sfin), from s0 (or zero);
// for the delta rule V' = U - W S^T of every chunk on the way (in place in w->vp). The GLA rule's
// V' does not depend on the state: every chunk's increment V'^T diag(lambda) K is one product over
// all chunks, and the hand-off a scan (two launches); the delta rule's goes chunk by chunk.
static int lc_states(CudaCtx *c, const LcDims *d, int delta, const float *s0, LcWork *w) {
    int C = d->C, Dk = d->Dk, Dv = d->Dv, N = d->N, P = d->P;
    size_t ck = (size_t)C * Dk, cv = (size_t)C * Dv, ss = d->ss, sb = sizeof(float) * ss;
    if (!delta) {
        MN_TRY(bgemm(c, 1, 0, Dv, Dk, C, 1, w->vp, Dv, cv, w->kl, Dk, ck, 0, w->inc, Dk, ss, d->nch));
        lc_scan_kernel<<<grid_for((size_t)P * ss, LC_THREADS), LC_THREADS, 0, c->stream>>>(*d, w->st, w->inc, w->gt.dec, s0, w->sfin, 0);
        LAUNCH_CHECK();
        return MN_OK;
    }
    if (s0)
        CU_TRY(cudaMemcpy2DAsync(w->st, N * sb, s0, sb, sb, P, cudaMemcpyDeviceToDevice, c->stream));
    else
        CU_TRY(cudaMemset2DAsync(w->st, N * sb, 0, sb, P, c->stream));
    for (int ci = 0; ci < N; ci++) {
        float *cur = w->st + ci * ss, *next = ci + 1 < N ? cur + ss : w->sfin;
        size_t ns = ci + 1 < N ? N * ss : ss;
        MN_TRY(bgemm(c, 0, 1, C, Dv, Dk, -1, w->w + ci * ck, Dk, N * ck, cur, Dk, N * ss, 1, w->vp + ci * cv, Dv,
                     N * cv, P));  // V' = U - W S^T
        lc_decay_state_kernel<<<grid_for((size_t)P * ss, LC_THREADS), LC_THREADS, 0, c->stream>>>(next, ns, cur, N * ss, w->gt.dec + ci, N, NULL, P, ss);
        LAUNCH_CHECK();
        MN_TRY(bgemm(c, 1, 0, Dv, Dk, C, 1, w->vp + ci * cv, Dv, N * cv, w->kl + ci * ck, Dk, N * ck, 1, next, Dk, ns,
                     P));
    }
    return MN_OK;
}

// The cuBLAS path's forward: the buffers, the gates and gathered inputs (lc_prepare), the states
// (lc_states), then O over all chunks at once.
int lc_forward(const Backend *be, CudaCtx *c, const LcDims *d, int delta, float scale, const MnLinFwd *io) {
    int C = d->C, Dk = d->Dk, Dv = d->Dv;
    size_t ck = (size_t)C * Dk, cv = (size_t)C * Dv, cc = (size_t)C * C;
    LcWork w;
    MN_TRY(lc_alloc(be, d, delta, 0, &w));
    MN_TRY(lc_prepare(c, d, delta, scale, (const bf16 *)io->q, (const bf16 *)io->k, (const bf16 *)io->v, io->g,
                      io->beta, &w));
    MN_TRY(lc_states(c, d, delta, io->s0, &w));
    // O = diag(gamma) Qs S^T + ((Qs K^T) (.) Gamma) V'
    MN_TRY(bgemm(c, 0, 1, C, Dv, Dk, 1, w.qg, Dk, ck, w.st, Dk, d->ss, 0, w.o, Dv, cv, d->nch));
    MN_TRY(bgemm(c, 0, 1, C, C, Dk, 1, w.qs, Dk, ck, w.k, Dk, ck, 0, w.sq1, C, cc, d->nch));
    lc_mask_kernel<<<grid_for(d->nch * cc, LC_THREADS), LC_THREADS, 0, c->stream>>>(*d, w.sq1, w.gt.b);
    LAUNCH_CHECK();
    MN_TRY(bgemm(c, 0, 0, C, Dv, C, 1, w.sq1, C, cc, w.vp, Dv, cv, 1, w.o, Dv, cv, d->nch));
    lc_scatter_kernel<<<grid_for(d->nch * cv, LC_THREADS), LC_THREADS, 0, c->stream>>>(*d, (bf16 *)io->o, w.o, Dv, 1.0f);
    LAUNCH_CHECK();
    if (io->sT) CU_TRY(cudaMemcpyAsync(io->sT, w.sfin, sizeof(float) * d->P * d->ss, cudaMemcpyDeviceToDevice, c->stream));
    return MN_OK;
}

// The cuBLAS path's backward: the forward's states again, then the adjoints and the gradients.
int lc_backward(const Backend *be, CudaCtx *c, const LcDims *d, int delta, float scale, const MnLinBwd *io) {
    int C = d->C, Dk = d->Dk, Dv = d->Dv, N = d->N, P = d->P;
    size_t ck = (size_t)C * Dk, cv = (size_t)C * Dv, cc = (size_t)C * C, ss = d->ss, sb = sizeof(float) * ss;
    LcWork w;
    MN_TRY(lc_alloc(be, d, delta, 1, &w));
    MN_TRY(lc_prepare(c, d, delta, scale, (const bf16 *)io->q, (const bf16 *)io->k, (const bf16 *)io->v, io->g,
                      io->beta, &w));
    MN_TRY(lc_states(c, d, delta, io->s0, &w));
    lc_gather_kernel<<<grid_for(d->nch * cv, LC_THREADS), LC_THREADS, 0, c->stream>>>(*d, (const bf16 *)io->dout, Dv, 1.0f, w.dout, w.gt.gam, w.dog, NULL, NULL);
    LAUNCH_CHECK();
    // dV' = ((K Qs^T) (.) Gamma^T) dO for all chunks; the state term is added in the pass below
    MN_TRY(bgemm(c, 0, 1, C, C, Dk, 1, w.qs, Dk, ck, w.k, Dk, ck, 0, w.sq1, C, cc, d->nch));
    lc_mask_kernel<<<grid_for(d->nch * cc, LC_THREADS), LC_THREADS, 0, c->stream>>>(*d, w.sq1, w.gt.b);
    LAUNCH_CHECK();
    MN_TRY(bgemm(c, 1, 0, C, Dv, C, 1, w.sq1, C, cc, w.dout, Dv, cv, 0, w.dvp, Dv, cv, d->nch));
    // the adjoints dS_c of the chunks' end states, last chunk first:
    //     dS_{c-1} = gamma_n dS_c + dO_c^T diag(gamma) Qs_c - dV'_c^T W_c (delta),  dV'_c += diag(lambda) K_c dS_c^T
    // The increments dO^T diag(gamma) Qs of all chunks in one product; then GLA (no W term): a scan,
    // and dV' of all chunks in one product; the delta rule chunk by chunk (dV'_c enters dS_{c-1}).
    MN_TRY(bgemm(c, 1, 0, Dv, Dk, C, 1, w.dout, Dv, cv, w.qg, Dk, ck, 0, w.inc, Dk, ss, d->nch));
    if (!delta) {
        lc_scan_kernel<<<grid_for((size_t)P * ss, LC_THREADS), LC_THREADS, 0, c->stream>>>(*d, w.dst, w.inc, w.gt.dec, io->dsT, io->ds0, 1);
        LAUNCH_CHECK();
        MN_TRY(bgemm(c, 0, 1, C, Dv, Dk, 1, w.kl, Dk, ck, w.dst, Dk, ss, 1, w.dvp, Dv, cv, d->nch));
    } else {
        float *last = w.dst + (size_t)(N - 1) * ss;
        if (io->dsT)
            CU_TRY(cudaMemcpy2DAsync(last, N * sb, io->dsT, sb, sb, P, cudaMemcpyDeviceToDevice, c->stream));
        else
            CU_TRY(cudaMemset2DAsync(last, N * sb, 0, sb, P, c->stream));
        for (int ci = N - 1; ci >= 0; ci--) {
            float *cur = w.dst + ci * ss, *prev = ci > 0 ? cur - ss : io->ds0;
            size_t ps = ci > 0 ? N * ss : ss;
            MN_TRY(bgemm(c, 0, 1, C, Dv, Dk, 1, w.kl + ci * ck, Dk, N * ck, cur, Dk, N * ss, 1, w.dvp + ci * cv, Dv,
                         N * cv, P));  // dV' += diag(lambda) K dS^T
            if (!prev) break;  // (no ds0 wanted)
            lc_decay_state_kernel<<<grid_for((size_t)P * ss, LC_THREADS), LC_THREADS, 0, c->stream>>>(prev, ps, cur, N * ss, w.gt.dec + ci, N, w.inc + ci * ss, P, ss);  // gamma_n dS + dO^T diag(gamma) Qs
            LAUNCH_CHECK();
            MN_TRY(bgemm(c, 1, 0, Dv, Dk, C, -1, w.dvp + ci * cv, Dv, N * cv, w.w + ci * ck, Dk, N * ck, 1, prev, Dk,
                         ps, P));  // - dV'^T W
        }
    }
    // P1 = (dO V'^T) (.) Gamma;  dQs = diag(gamma) dO S + P1 K;  dK = diag(lambda) V' dS + P1^T Qs
    MN_TRY(bgemm(c, 0, 1, C, C, Dv, 1, w.dout, Dv, cv, w.vp, Dv, cv, 0, w.sq1, C, cc, d->nch));
    lc_mask_kernel<<<grid_for(d->nch * cc, LC_THREADS), LC_THREADS, 0, c->stream>>>(*d, w.sq1, w.gt.b);
    LAUNCH_CHECK();
    MN_TRY(bgemm(c, 0, 0, C, Dk, Dv, 1, w.dog, Dv, cv, w.st, Dk, ss, 0, w.dqs, Dk, ck, d->nch));
    MN_TRY(bgemm(c, 0, 0, C, Dk, C, 1, w.sq1, C, cc, w.k, Dk, ck, 1, w.dqs, Dk, ck, d->nch));
    lc_rowscale_kernel<<<grid_for(d->nch * cv, LC_THREADS), LC_THREADS, 0, c->stream>>>(w.vl, w.vp, w.gt.lam, d->nch * C, Dv);
    LAUNCH_CHECK();
    MN_TRY(bgemm(c, 0, 0, C, Dk, Dv, 1, w.vl, Dv, cv, w.dst, Dk, ss, 0, w.dk, Dk, ck, d->nch));
    MN_TRY(bgemm(c, 1, 0, C, Dk, C, 1, w.sq1, C, cc, w.qs, Dk, ck, 1, w.dk, Dk, ck, d->nch));
    if (delta) {
        MN_TRY(bgemm(c, 0, 0, C, Dk, Dv, -1, w.dvp, Dv, cv, w.st, Dk, ss, 0, w.dw, Dk, ck, d->nch));    // dW = -dV' S
        MN_TRY(bgemm(c, 1, 0, C, Dv, C, 1, w.tt, C, cc, w.dvp, Dv, cv, 0, w.tdu, Dv, cv, d->nch));      // Tt^T dU
        MN_TRY(bgemm(c, 1, 0, C, Dk, C, 1, w.tt, C, cc, w.dw, Dk, ck, 0, w.tdw, Dk, ck, d->nch));       // Tt^T dW
        MN_TRY(bgemm(c, 0, 1, C, C, Dv, 1, w.dvp, Dv, cv, w.vb, Dv, cv, 0, w.sq2, C, cc, d->nch));      // dTt
        MN_TRY(bgemm(c, 0, 1, C, C, Dk, 1, w.dw, Dk, ck, w.kb, Dk, ck, 1, w.sq2, C, cc, d->nch));
        MN_TRY(bgemm(c, 1, 0, C, C, C, 1, w.tt, C, cc, w.sq2, C, cc, 0, w.sq1, C, cc, d->nch));         // Tt^T dTt
        MN_TRY(bgemm(c, 0, 1, C, C, C, -1, w.sq1, C, cc, w.tt, C, cc, 0, w.sq2, C, cc, d->nch));        // dA
        LcComb cb = {w.tdu, w.tdw, w.v, w.k, w.kk, w.sq2, w.dk, w.dbt};
        lc_delta_comb_kernel<<<(unsigned)d->nch, LC_CMAX, 0, c->stream>>>(*d, w.gt, cb);
        LAUNCH_CHECK();
        MN_TRY(bgemm(c, 0, 0, C, Dk, C, 1, w.sq2, C, cc, w.k, Dk, ck, 1, w.dk, Dk, ck, d->nch));        // dK += D K
        MN_TRY(bgemm(c, 1, 0, C, Dk, C, 1, w.sq2, C, cc, w.k, Dk, ck, 1, w.dk, Dk, ck, d->nch));        // dK += D^T K
    }
    LcOut a = {w.qs, w.dqs, w.v, w.dvp, delta ? w.tdu : NULL, w.dk, w.dbt, w.st, w.sfin, w.dst,
               (bf16 *)io->dq, (bf16 *)io->dk, (bf16 *)io->dv, io->dg, io->dbeta, io->g != NULL, io->beta != NULL,
               scale};
    lc_bwd_out_kernel<<<(unsigned)d->nch, LC_OUT_THREADS, 0, c->stream>>>(*d, w.gt, a);
    LAUNCH_CHECK();
    return MN_OK;
}
