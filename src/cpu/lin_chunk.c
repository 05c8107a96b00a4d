/*
 * The gated linear-attention family, chunkwise form, float32
 * (docs/spec/mixers.md section 2; docs/spec/reference/gdn-longhorn-notes.md A.3.5, A.4).
 *
 * Per chunk of n <= C tokens with entry state S (Dv x Dk), chunk-local cumulative
 * log decay b, gamma = e^b (ChunkDecay's head), lambda = e^{b_n - b} (tail), the
 * decay mask Gamma (mask) and the scaled queries Qs = scale Q, both rules are
 *
 *     O      = diag(gamma) Qs S^T + ((Qs K^T) (.) Gamma) V'
 *     S_next = gamma_n S + V'^T diag(lambda) K
 *
 * with V' = diag(beta) V for GLA, and for the delta rule (the WY / UT transform)
 *
 *     A = strictLower(diag(beta) (Gamma (.) K K^T)),  Tt = (I + A)^{-1}  (forward substitution)
 *     U = Tt diag(beta) V,  W = Tt diag(beta gamma) K,  V' = U - W S^T.
 *
 * Backward, chunks in reverse with dS the adjoint of the state at the chunk's end
 * (notes B1-B5, B7 with H = S^T):
 *
 *     dV'  = diag(lambda) K dS^T + ((K Qs^T) (.) Gamma^T) dO
 *     dQs  = diag(gamma) dO S + ((dO V'^T) (.) Gamma) K
 *     dK   = diag(lambda) V' dS + ((V' dO^T) (.) Gamma^T) Qs        (+ the WY terms)
 *     dS  <- gamma_n dS + dO^T diag(gamma) Qs - dV'^T W             (W = 0 for GLA)
 *     GLA:   dv = beta dV',  dbeta = v . dV'
 *     DELTA: dW = -dV' S,  dU = dV',  dv = diag(beta) Tt^T dU,  dK += diag(beta gamma) Tt^T dW,
 *            dbeta = rowsum(Tt^T dU (.) V) + gamma rowsum(Tt^T dW (.) K),
 *            dA = strictLower(-Tt^T (dU (diag(beta) V)^T + dW (diag(beta gamma) K)^T) Tt^T),
 *            dbeta += rowsum(dA (.) Gamma (.) K K^T),  D = diag(beta) dA (.) Gamma,  dK += D K + D^T K.
 *
 * The decay gradient needs none of the notes' B6 / B7 dg terms: inside a chunk, with
 * its entry state fixed and S~_t = e^{-b_t} S_t, the recurrence is the same rule with
 * values e^{-b_t} v_t, o_t = e^{b_t} scale S~_t q_t and S_end = e^{b_n} S~_n, so
 *     dL/db_t = q_t . dq_t - v_t . dv_t  (+ <dS_end, S_end> at t = n),
 *     dg_t = sum_{t' >= t in the chunk} dL/db_t'
 * for both rules, from the gradients already computed. (The same identity over the
 * whole sequence would do, but its running sum over T terms that cancel in part
 * loses digits: restarting at each chunk, from <dS_end, S_end>, keeps them.)
 */
#include <string.h>

#include "core/common.h"
#include "blas.h"
#include "chunk.h"
#include "lin_cpu.h"
#include "vec.h"

// Per-thread scratch of one chunk; rows are tokens, gathered contiguous.
typedef struct {
    int C, Dk, Dv;
    ChunkDecay cd;
    float *q, *k, *v, *vp, *out;  // [C x D] Qs, K, V, V', O (or dQs in the backward)
    float *kw, *dout, *dvp, *dk;  // [C x D] row-scaled K, dO, dV', dK
    float *kb, *vb, *w, *tdu, *tdw, *dw;  // delta rule: beta gamma K, beta V, W, Tt^T dU, Tt^T dW, dW
    float *attn, *kk, *tt, *m1, *m2;      // [C x C]
    float *beta;                          // [C]
} LinChunk;

static size_t chunk_floats(int C, int Dk, int Dv) {
    int D = Dk > Dv ? Dk : Dv;
    return chunk_decay_floats(C) + 15 * (size_t)C * D + 5 * (size_t)C * C + (size_t)C;
}

static float *chunk_init(LinChunk *c, float *mem, int C, int Dk, int Dv) {
    int D = Dk > Dv ? Dk : Dv;
    size_t cd = (size_t)C * D, cc = (size_t)C * C;
    c->C = C;
    c->Dk = Dk;
    c->Dv = Dv;
    chunk_decay_init(&c->cd, mem, C);
    mem += chunk_decay_floats(C);
    float **rows[] = {&c->q, &c->k, &c->v, &c->vp, &c->out, &c->kw, &c->dout, &c->dvp,
                      &c->dk, &c->kb, &c->vb, &c->w, &c->tdu, &c->tdw, &c->dw};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++, mem += cd) *rows[i] = mem;
    float **sq[] = {&c->attn, &c->kk, &c->tt, &c->m1, &c->m2};
    for (size_t i = 0; i < sizeof sq / sizeof sq[0]; i++, mem += cc) *sq[i] = mem;
    c->beta = mem;
    return mem + C;
}

static void gather(float *dst, const float *src, const SeqPair *p, int t0, int n, int d) {
    for (int t = 0; t < n; t++) memcpy(dst + (size_t)t * d, src + pair_tok(p, t0 + t) * d, sizeof(float) * d);
}

static void scatter(float *dst, const float *src, const SeqPair *p, int t0, int n, int d) {
    for (int t = 0; t < n; t++) memcpy(dst + pair_tok(p, t0 + t) * d, src + (size_t)t * d, sizeof(float) * d);
}

// Loads a chunk: Qs, K, V, beta, the decays.
static void load_chunk(LinChunk *c, const SeqPair *p, int t0, int n, float scale, const float *q, const float *k,
                       const float *v, const float *g, const float *beta) {
    gather(c->q, q, p, t0, n, c->Dk);
    for (size_t e = 0; e < (size_t)n * c->Dk; e++) c->q[e] *= scale;
    gather(c->k, k, p, t0, n, c->Dk);
    gather(c->v, v, p, t0, n, c->Dv);
    chunk_decay_compute(&c->cd, g ? g + pair_tok(p, t0) : NULL, p->H, n);
    for (int t = 0; t < n; t++) c->beta[t] = beta ? beta[pair_tok(p, t0 + t)] : 1.0f;
}

// V' of the chunk from its entry state s; for the delta rule also K K^T, Tt, W, beta gamma K, beta V.
static void values(LinChunk *c, MnLinRule rule, const float *s) {
    int n = c->cd.n, dk = c->Dk, dv = c->Dv, C = c->C;
    if (rule == MN_LIN_GLA) {
        scale_rows(c->vp, c->v, c->beta, n, dv);
        return;
    }
    const float *gam = c->cd.head, *mask = c->cd.mask;
    gemm(0, 1, n, n, dk, 1, c->k, dk, c->k, dk, 0, c->kk, n);
    // Tt = (I + A)^{-1}, unit lower triangular: row i = sum_{m < i} N_im row m (Tt_mm = 1), N = -A.
    float *tt = c->tt;
    for (int i = 0; i < n; i++) {
        float *ri = tt + (size_t)i * n;
        for (int j = 0; j < n; j++) ri[j] = 0;
        for (int m = 0; m < i; m++) {
            float nim = -c->beta[i] * mask[(size_t)i * C + m] * c->kk[(size_t)i * n + m];
            const float *rm = tt + (size_t)m * n;
            for (int j = 0; j <= m; j++) ri[j] += nim * rm[j];
        }
        ri[i] = 1;
    }
    for (int t = 0; t < n; t++) {
        float bg = c->beta[t] * gam[t];
        for (int j = 0; j < dk; j++) c->kb[(size_t)t * dk + j] = bg * c->k[(size_t)t * dk + j];
    }
    scale_rows(c->vb, c->v, c->beta, n, dv);
    gemm(0, 0, n, dv, n, 1, tt, n, c->vb, dv, 0, c->vp, dv);     // U
    gemm(0, 0, n, dk, n, 1, tt, n, c->kb, dk, 0, c->w, dk);      // W
    gemm(0, 1, n, dv, dk, -1, c->w, dk, s, dk, 1, c->vp, dv);    // V' = U - W S^T
}

// out = diag(rowscale) X op(S) + ((X A^T) (.) mask') B, mask' = Gamma or Gamma^T.
static void form(LinChunk *c, float *out, const float *x, int dx, const float *s, int s_trans, const float *a,
                 const float *b, int dout, int reversed) {
    GlaTerms t = {.x = x, .s = s, .a = a, .b = b, .mask = c->cd.mask, .rowscale = reversed ? c->cd.tail : c->cd.head,
                  .m = c->cd.n, .n = c->cd.n, .C = c->C, .dx = dx, .dout = dout, .s_trans = s_trans,
                  .mask_trans = reversed};
    gla_apply(&t, out, c->attn);
}

// S = gamma_n S + V'^T diag(lambda) K
static void advance(LinChunk *c, float *s) {
    scale_rows(c->kw, c->k, c->cd.tail, c->cd.n, c->Dk);
    state_advance(s, *c->cd.decay, c->vp, c->kw, c->cd.n, c->Dv, c->Dk);
}

// The decay gradient's terms cancel partly (a difference of two sums, then a
// running sum over the sequence): they are formed and summed in double.
static double dot64(const float *a, const float *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

size_t lin_chunk_fwd_floats(const MnSeqDims *d, int C) {
    return chunk_floats(C, d->Dk, d->Dv) + (size_t)d->Dv * d->Dk;
}

void lin_chunk_forward(const SeqPair *p, const MnLinOpts *o, const MnLinFwd *io, int bh, float *work) {
    LinChunk c;
    int dk = p->Dk, dv = p->Dv;
    float *s = chunk_init(&c, work, p->C, dk, dv);
    lin_load_state(s, io->s0, bh, dk, dv);
    for (int t0 = 0; t0 < p->T; t0 += p->C) {
        int n = mn_min(p->C, p->T - t0);
        load_chunk(&c, p, t0, n, o->scale, io->q, io->k, io->v, io->g, io->beta);
        values(&c, o->rule, s);
        form(&c, c.out, c.q, dk, s, 1, c.k, c.vp, dv, 0);
        scatter(io->o, c.out, p, t0, n, dv);
        advance(&c, s);
    }
    if (io->sT) memcpy(io->sT + (size_t)bh * dv * dk, s, sizeof(float) * dv * dk);
}

size_t lin_chunk_bwd_floats(const MnSeqDims *d, int C) {
    size_t nchunks = (size_t)(d->T + C - 1) / C, ss = (size_t)d->Dv * d->Dk;
    return chunk_floats(C, d->Dk, d->Dv) + (nchunks + 1) * ss + ss;
}

void lin_chunk_backward(const SeqPair *p, const MnLinOpts *o, const MnLinBwd *io, int bh, float *work) {
    LinChunk c;
    int dk = p->Dk, dv = p->Dv, T = p->T, C = p->C, nchunks = (T + C - 1) / C;
    size_t ss = (size_t)dv * dk;
    MnLinRule rule = o->rule;
    float *states = chunk_init(&c, work, C, dk, dv);  // entry state of every chunk, and the final one
    float *ds = states + (size_t)(nchunks + 1) * ss;

    lin_load_state(states, io->s0, bh, dk, dv);
    for (int ci = 0; ci < nchunks; ci++) {
        int t0 = ci * C, n = mn_min(C, T - t0);
        float *cur = states + (size_t)ci * ss, *next = cur + ss;
        load_chunk(&c, p, t0, n, o->scale, io->q, io->k, io->v, io->g, io->beta);
        values(&c, rule, cur);
        memcpy(next, cur, sizeof(float) * ss);
        advance(&c, next);
    }
    lin_load_state(ds, io->dsT, bh, dk, dv);

    for (int ci = nchunks - 1; ci >= 0; ci--) {
        int t0 = ci * C, n = mn_min(C, T - t0);
        const float *s = states + (size_t)ci * ss;
        double dG[n], dG_end = io->g && io->dg ? dot64(ds, s + ss, ss) : 0;  // <dS_end, S_end>
        load_chunk(&c, p, t0, n, o->scale, io->q, io->k, io->v, io->g, io->beta);
        values(&c, rule, s);
        gather(c.dout, io->dout, p, t0, n, dv);

        form(&c, c.dvp, c.k, dk, ds, 1, c.q, c.dout, dv, 1);   // dV'
        form(&c, c.out, c.dout, dv, s, 0, c.vp, c.k, dk, 0);   // dQs
        form(&c, c.dk, c.vp, dv, ds, 0, c.dout, c.q, dk, 1);   // dK, the direct terms
        float dbeta[n];
        if (rule == MN_LIN_GLA) {
            for (int t = 0; t < n; t++) {
                float *dvt = c.dvp + (size_t)t * dv, b = 0;
                const float *vt = c.v + (size_t)t * dv;
                for (int j = 0; j < dv; j++) {
                    b += vt[j] * dvt[j];
                    dvt[j] *= c.beta[t];  // dv
                }
                dbeta[t] = b;
            }
        } else {
            float *tt = c.tt, *dA = c.m2;
            const float *gam = c.cd.head, *mask = c.cd.mask;
            gemm(0, 0, n, dk, dv, -1, c.dvp, dv, s, dk, 0, c.dw, dk);       // dW = -dV' S
            gemm(1, 0, n, dv, n, 1, tt, n, c.dvp, dv, 0, c.tdu, dv);       // Tt^T dU
            gemm(1, 0, n, dk, n, 1, tt, n, c.dw, dk, 0, c.tdw, dk);        // Tt^T dW
            gemm(0, 1, n, n, dv, 1, c.dvp, dv, c.vb, dv, 0, c.m1, n);      // dTt
            gemm(0, 1, n, n, dk, 1, c.dw, dk, c.kb, dk, 1, c.m1, n);
            gemm(1, 0, n, n, n, 1, tt, n, c.m1, n, 0, c.attn, n);          // Tt^T dTt
            gemm(0, 1, n, n, n, -1, c.attn, n, tt, n, 0, dA, n);           // dA = -Tt^T dTt Tt^T
            for (int t = 0; t < n; t++) {
                const float *tdu = c.tdu + (size_t)t * dv, *tdw = c.tdw + (size_t)t * dk;
                const float *vt = c.v + (size_t)t * dv, *kt = c.k + (size_t)t * dk;
                float *dkt = c.dk + (size_t)t * dk, b = c.beta[t], bg = b * gam[t];
                float a = vdot(tdu, vt, dv) + gam[t] * vdot(tdw, kt, dk);
                // row t of dA (.) Gamma (.) K K^T, and D = diag(beta) dA (.) Gamma, strictly lower
                float *da = dA + (size_t)t * n;
                for (int j = 0; j < t; j++) {
                    float x = da[j] * mask[(size_t)t * C + j];
                    a += x * c.kk[(size_t)t * n + j];
                    da[j] = b * x;
                }
                for (int j = t; j < n; j++) da[j] = 0;
                dbeta[t] = a;
                for (int j = 0; j < dk; j++) dkt[j] += bg * tdw[j];
            }
            gemm(0, 0, n, dk, n, 1, dA, n, c.k, dk, 1, c.dk, dk);   // dK += D K
            gemm(1, 0, n, dk, n, 1, dA, n, c.k, dk, 1, c.dk, dk);   // dK += D^T K
        }
        // dL/dG_t = q . dq - v . dv (Qs . dQs = q . dq), dq = scale dQs; scatter the token gradients
        for (int t = 0; t < n; t++) {
            size_t ti = pair_tok(p, t0 + t);
            const float *dqs = c.out + (size_t)t * dk, *qs = c.q + (size_t)t * dk, *vt = c.v + (size_t)t * dv;
            float *dq = io->dq + ti * dk, *dvv = io->dv + ti * dv;
            if (rule == MN_LIN_GLA)
                memcpy(dvv, c.dvp + (size_t)t * dv, sizeof(float) * dv);
            else
                for (int j = 0; j < dv; j++) dvv[j] = c.beta[t] * c.tdu[(size_t)t * dv + j];
            for (int j = 0; j < dk; j++) dq[j] = o->scale * dqs[j];
            memcpy(io->dk + ti * dk, c.dk + (size_t)t * dk, sizeof(float) * dk);
            dG[t] = dot64(qs, dqs, dk) - dot64(vt, dvv, dv);
            if (io->dbeta) io->dbeta[ti] = io->beta ? dbeta[t] : 0;
        }
        if (io->dg) {
            double acc = dG_end;
            for (int t = n - 1; t >= 0; t--) {
                acc += dG[t];
                io->dg[pair_tok(p, t0 + t)] = io->g ? (float)acc : 0;
            }
        }
        // dS to the chunk's start: gamma_n dS + dO^T diag(gamma) Qs - dV'^T W
        // (the GLA branch rescaled dV' into dv in place, but its W term is 0)
        scale_rows(c.kw, c.q, c.cd.head, n, dk);
        state_advance(ds, *c.cd.decay, c.dout, c.kw, n, dv, dk);
        if (rule == MN_LIN_DELTA) gemm(1, 0, dv, dk, n, -1, c.dvp, dv, c.w, dk, 1, ds, dk);
    }
    if (io->ds0) memcpy(io->ds0 + (size_t)bh * ss, ds, sizeof(float) * ss);
}
