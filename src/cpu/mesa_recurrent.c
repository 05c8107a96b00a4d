/*
 * Mesa core, recurrent form, float32: one token at a time with the states H
 * and G kept explicitly (spec sections 1, 2, 4, 6). Per token it costs a
 * rank-one update and one Dk x Dk matrix-vector product per CG step; with
 * small heads the matrix stays in the L1 cache, which makes this form faster
 * than the chunkwise one on a CPU. It is also the decode step (T = 1).
 *
 * The backward recomputes the states from checkpoints every SEGMENT tokens,
 * keeps the segment's H_t and G_t, and runs the adjoint recurrences of spec
 * section 4 in reverse.
 */
#include <math.h>
#include <string.h>

#include "cg.h"
#include "core/common.h"
#include "mesa_cpu.h"
#include "vec.h"

enum { SEGMENT = 16 };  // tokens between state checkpoints in the backward

// The operator of one token's system: A p = H p + lambda p (H symmetric).
typedef struct {
    const float *h, *lambda;
    int dk;
} DenseOp;

static void dense_operator(void *ctx, const float *p, const int *rows, int m, float *ap) {
    const DenseOp *op = ctx;
    for (int r = 0; r < m; r++) {  // m is 1 here: one system per token
        const float *pr = p + (size_t)r * op->dk;
        float *ar = ap + (size_t)r * op->dk;
        symv(ar, op->h, pr, op->dk);
        for (int i = 0; i < op->dk; i++) ar[i] += op->lambda[i] * pr[i];
    }
}

// Solves (H + Lambda) x = q for one token.
static void solve_token(const float *h, const float *lambda, int dk, const MnSolver *s, const float *q,
                        const float *x0, float *x, int *steps, float *diag, CgWork *cg) {
    DenseOp op = {h, lambda, dk};
    if (mesa_needs_diagonal(s))
        for (int i = 0; i < dk; i++) diag[i] = h[(size_t)i * dk + i] + lambda[i];
    cg_solve(dense_operator, &op, 1, dk, s, q, mesa_needs_diagonal(s) ? diag : NULL, x0, x, steps, cg);
}

// One token of the state recurrences.
static void update_states(float *h, float *g, const float *k, const float *v, float gamma, float beta, int dk,
                          int dv) {
    decay_rank1(h, gamma, beta, k, k, dk, dk);
    decay_rank1(g, gamma, beta, v, k, dv, dk);
}

size_t mesa_rec_fwd_floats(const MnSeqDims *d) {
    return (size_t)d->Dk * d->Dk + (size_t)d->Dv * d->Dk + d->Dk + cg_work_floats(1, d->Dk);
}

void mesa_rec_forward(const SeqPair *p, const MnSolver *s, const MnMesaFwd *io, int bh, float *work) {
    int dk = p->Dk, dv = p->Dv;
    float *h = work, *g = h + (size_t)dk * dk, *diag = g + (size_t)dv * dk;
    CgWork cg;
    cg_work_init(&cg, diag + dk, 1, dk);
    mesa_load_states(h, g, io->h0, io->g0, bh, dk, dv);
    const float *lambda = io->lambda + mn_mesa_lambda_at(io->lambda_seqs, p->H, dk, bh / p->H, p->h);
    for (int t = 0; t < p->T; t++) {
        size_t ti = pair_tok(p, t);
        update_states(h, g, io->k + ti * dk, io->v + ti * dv, expf(io->g[ti]), io->beta[ti], dk, dv);
        solve_token(h, lambda, dk, s, io->q + ti * dk, io->x0 ? io->x0 + ti * dk : NULL, io->x + ti * dk,
                    io->steps ? io->steps + ti : NULL, diag, &cg);
        matvec(io->o + ti * dv, g, io->x + ti * dk, dv, dk);
    }
    if (io->hT) memcpy(io->hT + (size_t)bh * dk * dk, h, sizeof(float) * dk * dk);
    if (io->gT) memcpy(io->gT + (size_t)bh * dv * dk, g, sizeof(float) * dv * dk);
}

size_t mesa_rec_bwd_floats(const MnSeqDims *d, int C) {
    size_t hg = (size_t)d->Dk * d->Dk + (size_t)d->Dv * d->Dk;
    size_t nseg = (size_t)(d->T + SEGMENT - 1) / SEGMENT;
    int D = d->Dk > d->Dv ? d->Dk : d->Dv;
    return (nseg + 1) * hg + SEGMENT * hg + hg + 8 * (size_t)D + cg_work_floats(1, d->Dk) + (size_t)d->T;
}

void mesa_rec_backward(const SeqPair *p, const MnSolver *s, const MnMesaBwd *io, int bh, float *work,
                       float *dlambda_part) {
    int dk = p->Dk, dv = p->Dv, T = p->T, D = dk > dv ? dk : dv;
    size_t hh = (size_t)dk * dk, gg = (size_t)dv * dk, hg = hh + gg;
    int nseg = (T + SEGMENT - 1) / SEGMENT;
    float *cps = work;                               // [nseg+1] states entering each segment, then the final
    float *snap = cps + (size_t)(nseg + 1) * hg;     // [SEGMENT] H_t, G_t of the current segment
    float *hbar = snap + SEGMENT * hg, *gbar = hbar + hh;
    float *r = gbar + gg, *y = r + D, *pv = y + D, *qv = pv + D, *r1 = qv + D, *r2 = r1 + D;
    float *diag = r2 + D, *db = diag + D + cg_work_floats(1, dk);
    CgWork cg;
    cg_work_init(&cg, diag + D, 1, dk);
    const float *lambda = io->lambda + mn_mesa_lambda_at(io->lambda_seqs, p->H, dk, bh / p->H, p->h);
    MnSolver s2 = *s;
    if (s2.init == MN_CG_INIT_GIVEN) s2.init = MN_CG_INIT_ZERO;  // the given guesses were for the forward

    mesa_load_states(cps, cps + hh, io->h0, io->g0, bh, dk, dv);
    for (int sg = 0; sg < nseg; sg++) {  // checkpoints: the state entering each segment
        float *next = cps + (size_t)(sg + 1) * hg;
        memcpy(next, next - hg, sizeof(float) * hg);
        for (int t = sg * SEGMENT; t < mn_min(T, (sg + 1) * SEGMENT); t++) {
            size_t ti = pair_tok(p, t);
            update_states(next, next + hh, io->k + ti * dk, io->v + ti * dv, expf(io->g[ti]), io->beta[ti], dk, dv);
        }
    }
    const float *final = cps + (size_t)nseg * hg;
    float db_final = 0;
    if (io->dhT) db_final += vdot(io->dhT + (size_t)bh * hh, final, (int)hh);
    if (io->dgT) db_final += vdot(io->dgT + (size_t)bh * gg, final + hh, (int)gg);
    if (io->dhT) memcpy(hbar, io->dhT + (size_t)bh * hh, sizeof(float) * hh); else memset(hbar, 0, sizeof(float) * hh);
    if (io->dgT) memcpy(gbar, io->dgT + (size_t)bh * gg, sizeof(float) * gg); else memset(gbar, 0, sizeof(float) * gg);

    for (int sg = nseg - 1; sg >= 0; sg--) {
        int t0 = sg * SEGMENT, n = mn_min(SEGMENT, T - t0);
        for (int j = 0; j < n; j++) {  // recompute the segment's states
            float *sj = snap + (size_t)j * hg;
            memcpy(sj, j ? sj - hg : cps + (size_t)sg * hg, sizeof(float) * hg);
            size_t ti = pair_tok(p, t0 + j);
            update_states(sj, sj + hh, io->k + ti * dk, io->v + ti * dv, expf(io->g[ti]), io->beta[ti], dk, dv);
        }
        for (int j = n - 1; j >= 0; j--) {
            int t = t0 + j;
            size_t ti = pair_tok(p, t);
            const float *ht = snap + (size_t)j * hg, *gt = ht + hh;
            const float *k = io->k + ti * dk, *v = io->v + ti * dv, *x = io->x + ti * dk;
            const float *delta = io->dout + ti * dv;
            float beta = io->beta[ti];
            float gnext = t + 1 < T ? expf(io->g[pair_tok(p, t + 1)]) : 1.0f;
            matvec_t(r, gt, delta, dv, dk);                          // r = G_t^T delta
            solve_token(ht, lambda, dk, &s2, r, NULL, y, io->steps ? io->steps + ti : NULL, diag, &cg);
            decay_rank1(gbar, gnext, 1.0f, delta, x, dv, dk);        // Gbar_t = delta x^T + gamma Gbar_{t+1}
            decay_rank1(hbar, gnext, -1.0f, y, x, dk, dk);           // Hbar_t = -y x^T + gamma Hbar_{t+1}
            matvec(pv, gbar, k, dv, dk);
            matvec_t(qv, gbar, v, dv, dk);
            matvec(r1, hbar, k, dk, dk);
            matvec_t(r2, hbar, k, dk, dk);
            float *dq = io->dq + ti * dk, *dkk = io->dk + ti * dk, *dvv = io->dv + ti * dv;
            for (int i = 0; i < dv; i++) dvv[i] = beta * pv[i];
            for (int i = 0; i < dk; i++) {
                dq[i] = y[i];
                dkk[i] = beta * (qv[i] + r1[i] + r2[i]);
                dlambda_part[i] -= y[i] * x[i];
            }
            float dbeta = vdot(v, pv, dv) + vdot(k, r1, dk);
            io->dbeta[ti] = dbeta;
            float ylx = 0;  // db = y.(lambda (.) x) - beta dbeta: see mesa_chunk.c for why not delta.o - y.Hx
            for (int i = 0; i < dk; i++) ylx += y[i] * lambda[i] * x[i];
            db[t] = ylx - beta * dbeta;
        }
    }
    db[T - 1] += db_final;
    float acc = 0;
    for (int t = T - 1; t >= 0; t--) {
        acc += db[t];
        io->dg[pair_tok(p, t)] = acc;
    }
    float g1 = expf(io->g[pair_tok(p, 0)]);
    if (io->dh0)
        for (size_t e = 0; e < hh; e++) io->dh0[(size_t)bh * hh + e] = g1 * hbar[e];
    if (io->dg0)
        for (size_t e = 0; e < gg; e++) io->dg0[(size_t)bh * gg + e] = g1 * gbar[e];
}
