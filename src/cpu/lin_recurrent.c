/*
 * The gated linear-attention family, recurrent form, float32: one token at a
 * time with the state S (Dv x Dk), as the float64 reference (src/ref/lin_ref.c,
 * whose header comment has the backward's algebra):
 *
 *     GLA:    S = gamma S + beta v k^T
 *     DELTA:  u = beta (v - gamma S k);  S = gamma S + u k^T
 *     o = scale S q
 *
 * The backward keeps the state every C tokens and recomputes the C states of
 * one segment at a time in reverse: memory (T/C + C) Dv Dk, not T Dv Dk.
 */
#include <math.h>
#include <string.h>

#include "core/common.h"
#include "lin_cpu.h"
#include "vec.h"

static inline float gate(const float *g, size_t ti) { return g ? expf(g[ti]) : 1.0f; }
static inline float beta_of(const float *beta, size_t ti) { return beta ? beta[ti] : 1.0f; }

// S = gamma S + c u k^T, row by row, and (out non-NULL) out = S q on the updated
// rows while they are in cache: one pass over the state.
static void update_rows(float *restrict s, float gamma, float c, const float *restrict u, const float *restrict k,
                        const float *restrict q, float *restrict out, int dk, int dv) {
    for (int i = 0; i < dv; i++) {
        float *restrict si = s + (size_t)i * dk, cu = c * u[i];
        for (int j = 0; j < dk; j++) si[j] = gamma * si[j] + cu * k[j];
        if (out) out[i] = vdot(si, q, dk);
    }
}

// S = next state after one token (and out = S q if out is not NULL). u: Dv scratch.
static void step(MnLinRule rule, float *s, float gamma, float beta, const float *k, const float *v, float *u, int dk,
                 int dv, const float *q, float *out) {
    if (rule == MN_LIN_GLA) {
        update_rows(s, gamma, beta, v, k, q, out, dk, dv);
        return;
    }
    matvec(u, s, k, dv, dk);
    for (int i = 0; i < dv; i++) u[i] = beta * (v[i] - gamma * u[i]);
    update_rows(s, gamma, 1, u, k, q, out, dk, dv);
}

size_t lin_rec_fwd_floats(const MnSeqDims *d) { return (size_t)d->Dv * d->Dk + (size_t)d->Dv; }

void lin_rec_forward(const SeqPair *p, const MnLinOpts *o, const MnLinFwd *io, int bh, float *work) {
    int dk = p->Dk, dv = p->Dv;
    float *s = work, *u = s + (size_t)dv * dk;
    lin_load_state(s, io->s0, bh, dk, dv);
    for (int t = 0; t < p->T; t++) {
        size_t ti = pair_tok(p, t);
        float *out = io->o + ti * dv;
        step(o->rule, s, gate(io->g, ti), beta_of(io->beta, ti), io->k + ti * dk, io->v + ti * dv, u, dk, dv,
             io->q + ti * dk, out);
        if (o->scale != 1)
            for (int i = 0; i < dv; i++) out[i] *= o->scale;
    }
    if (io->sT) memcpy(io->sT + (size_t)bh * dv * dk, s, sizeof(float) * dv * dk);
}

size_t lin_rec_bwd_floats(const MnSeqDims *d, int C) {
    size_t ss = (size_t)d->Dv * d->Dk, nseg = (size_t)(d->T + C - 1) / C;
    return (nseg + 1) * ss + ((size_t)C + 1) * ss + ss + 3 * (size_t)d->Dv + 2 * (size_t)d->Dk;
}

void lin_rec_backward(const SeqPair *p, const MnLinOpts *o, const MnLinBwd *io, int bh, float *work) {
    int dk = p->Dk, dv = p->Dv, T = p->T, C = p->C, nseg = (T + C - 1) / C;
    size_t ss = (size_t)dv * dk;
    MnLinRule rule = o->rule;
    float scale = o->scale;
    float *ck = work;                          // [nseg + 1] states entering each segment, and the final one
    float *seg = ck + (size_t)(nseg + 1) * ss;  // [C + 1] the states S_{t0-1} .. S_{t0+n-1} of one segment
    float *ds = seg + (size_t)(C + 1) * ss;
    float *u = ds + ss, *du = u + dv, *pk = du + dv, *a = pk + dv, *b = a + dk;

    lin_load_state(ck, io->s0, bh, dk, dv);
    for (int si = 0; si < nseg; si++) {
        float *next = ck + (size_t)(si + 1) * ss;
        memcpy(next, ck + (size_t)si * ss, sizeof(float) * ss);
        for (int t = si * C; t < mn_min(T, (si + 1) * C); t++) {
            size_t ti = pair_tok(p, t);
            step(rule, next, gate(io->g, ti), beta_of(io->beta, ti), io->k + ti * dk, io->v + ti * dv, u, dk, dv,
                 NULL, NULL);
        }
    }
    lin_load_state(ds, io->dsT, bh, dk, dv);
    for (int si = nseg - 1; si >= 0; si--) {
        int t0 = si * C, n = mn_min(C, T - t0);
        memcpy(seg, ck + (size_t)si * ss, sizeof(float) * ss);
        for (int t = 0; t < n; t++) {
            size_t ti = pair_tok(p, t0 + t);
            float *nx = seg + (size_t)(t + 1) * ss;
            memcpy(nx, nx - ss, sizeof(float) * ss);
            step(rule, nx, gate(io->g, ti), beta_of(io->beta, ti), io->k + ti * dk, io->v + ti * dv, u, dk, dv, NULL,
                 NULL);
        }
        for (int t = n - 1; t >= 0; t--) {
            size_t ti = pair_tok(p, t0 + t);
            float gamma = gate(io->g, ti), beta = beta_of(io->beta, ti);
            const float *q = io->q + ti * dk, *k = io->k + ti * dk, *v = io->v + ti * dv, *dout = io->dout + ti * dv;
            const float *sp = seg + (size_t)t * ss, *s = sp + ss;
            float *dq = io->dq + ti * dk, *dkk = io->dk + ti * dk, *dvv = io->dv + ti * dv;
            // read-out o = scale S q
            matvec_t(dq, s, dout, dv, dk);
            for (int j = 0; j < dk; j++) dq[j] *= scale;
            decay_rank1(ds, 1, scale, dout, q, dv, dk);
            // the update
            matvec(du, ds, k, dv, dk);
            float dbeta = 0;
            if (rule == MN_LIN_GLA) {
                for (int i = 0; i < dv; i++) {
                    dvv[i] = beta * du[i];
                    dbeta += v[i] * du[i];
                }
                matvec_t(dkk, ds, v, dv, dk);
                for (int j = 0; j < dk; j++) dkk[j] *= beta;
            } else {
                matvec(pk, sp, k, dv, dk);
                for (int i = 0; i < dv; i++) {
                    float r = v[i] - gamma * pk[i];
                    dvv[i] = beta * du[i];
                    dbeta += r * du[i];
                    u[i] = beta * r;
                }
                matvec_t(a, ds, u, dv, dk);
                matvec_t(b, sp, du, dv, dk);
                for (int j = 0; j < dk; j++) dkk[j] = a[j] - beta * gamma * b[j];
                decay_rank1(ds, 1, -beta, du, k, dv, dk);  // dP
            }
            if (io->dbeta) io->dbeta[ti] = io->beta ? dbeta : 0;
            if (io->dg) io->dg[ti] = io->g ? gamma * vdot(ds, sp, (int)ss) : 0;
            if (gamma != 1)
                for (size_t e = 0; e < ss; e++) ds[e] *= gamma;
        }
    }
    if (io->ds0) memcpy(io->ds0 + (size_t)bh * ss, ds, sizeof(float) * ss);
}
