/*
 * Mesa core, chunkwise-parallel form, float32 (spec sections 3 and 4).
 *
 * Forward, per chunk of n <= C tokens with entry states Hc (Dk x Dk) and
 * Gc (Dv x Dk), all C systems are solved together by CG with the operator
 *     A(X) = diag(e^b) X Hc + ((X K^T) (.) D) diag(beta) K + X diag(lambda),
 * the output is O = diag(e^b) X Gc^T + ((X K^T) (.) D) diag(beta) V, and the
 * states advance with K^T diag(w) K and V^T diag(w) K, w = e^{b_n - b} beta.
 *
 * Backward (implicit differentiation), chunks in reverse, with the adjoints
 * Gbar, Hbar of the states at the chunk's end (spec section 4):
 *     R  = G_t^T delta_t (GLA form with query delta),  Y = A^{-1} R (second CG)
 *     P  = Gbar_t k_t,  Qv = Gbar_t^T v_t,  R1 = Hbar_t k_t,  R2 = Hbar_t^T k_t
 *     dv = beta P, dk = beta (Qv + R1 + R2), dbeta = v.P + k.R1,
 *     db = y.(lambda (.) x) - beta dbeta,  dg = reverse cumsum of db.
 * (The spec writes db = delta.o - y.(H_t x) - beta dbeta. With exact solves
 * delta.o = (G^T delta).x = (A y).x = y.(H x) + y.(lambda (.) x): the two large
 * terms cancel, and in bf16 or float32 the difference drowns in their
 * rounding. The form used here is the same number without the cancellation,
 * and needs neither o nor H x.)
 * Each of P, Qv, R1, R2 is a reversed GLA form (mask D^T, row decay to the
 * chunk end). The code keeps Hn = -Hbar (a positive sum of y x^T terms).
 */
#include <string.h>

#include "core/common.h"
#include "blas.h"
#include "cg.h"
#include "chunk.h"
#include "mesa_cpu.h"

// Per-thread scratch of one chunk. Rows are tokens, gathered contiguous.
typedef struct {
    int C, Dk, Dv;
    ChunkDecay cd;
    float *q, *k, *v, *kb, *vb;  // [C x D] chunk inputs; kb = beta k, vb = beta v
    float *x, *o, *x0;           // [C x D] solutions, outputs, initial guesses
    float *diag;                 // [C x Dk] diag(H_t + Lambda) for Jacobi
    float *attn;                 // [C x C] scratch of gla_apply
    float *kw;                   // [C x Dk] rows scaled by a decay (state hand-offs)
    float *dout, *r, *y, *pv, *qv, *r1, *r2;       // backward rows
    float *dbeta, *db;           // [C]
    const float *hc, *lambda;    // operator: entry state H, ridge
    CgWork cg;
} Chunk;

static size_t chunk_floats(int C, int Dk, int Dv) {
    int D = Dk > Dv ? Dk : Dv;
    return chunk_decay_floats(C) + 17 * (size_t)C * D + (size_t)C * C + 2 * (size_t)C + cg_work_floats(C, Dk);
}

static float *chunk_init(Chunk *c, float *mem, int C, int Dk, int Dv) {
    int D = Dk > Dv ? Dk : Dv;
    size_t cd = (size_t)C * D;
    c->C = C;
    c->Dk = Dk;
    c->Dv = Dv;
    chunk_decay_init(&c->cd, mem, C);
    mem += chunk_decay_floats(C);
    float **rows[] = {&c->q, &c->k, &c->v, &c->kb, &c->vb, &c->x, &c->o, &c->x0, &c->diag, &c->kw,
                      &c->dout, &c->r, &c->y, &c->pv, &c->qv, &c->r1, &c->r2};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++, mem += cd) *rows[i] = mem;
    c->attn = mem;
    mem += (size_t)C * C;
    c->dbeta = mem;
    c->db = mem + C;
    mem += 2 * (size_t)C;
    cg_work_init(&c->cg, mem, C, Dk);
    return mem + cg_work_floats(C, Dk);
}

// Copies rows t0..t0+n-1 of one pair's [B,T,H,d] tensor into dst (n x d).
static void gather(float *dst, const float *src, const SeqPair *p, int t0, int n, int d) {
    for (int t = 0; t < n; t++) memcpy(dst + (size_t)t * d, src + pair_tok(p, t0 + t) * d, sizeof(float) * d);
}

static void scatter(float *dst, const float *src, const SeqPair *p, int t0, int n, int d) {
    for (int t = 0; t < n; t++) memcpy(dst + pair_tok(p, t0 + t) * d, src + (size_t)t * d, sizeof(float) * d);
}

// Loads a chunk's k, v, gates and decays; kb = beta k, vb = beta v.
static void load_chunk(Chunk *c, const SeqPair *p, int t0, int n, const float *k, const float *v, const float *g,
                       const float *beta) {
    gather(c->k, k, p, t0, n, c->Dk);
    gather(c->v, v, p, t0, n, c->Dv);
    chunk_decay_compute(&c->cd, g + pair_tok(p, t0), p->H, n);
    float bt[n];
    for (int t = 0; t < n; t++) bt[t] = beta[pair_tok(p, t0 + t)];
    scale_rows(c->kb, c->k, bt, n, c->Dk);
    scale_rows(c->vb, c->v, bt, n, c->Dv);
}

// A(P) for the listed rows: the CgApply of the chunkwise form.
static void chunk_operator(void *ctx, const float *pm, const int *rows, int m, float *ap) {
    const Chunk *c = ctx;
    GlaTerms t = {.x = pm, .s = c->hc, .a = c->k, .b = c->kb, .mask = c->cd.mask, .rowscale = c->cd.head,
                  .rows = rows, .m = m, .n = c->cd.n, .C = c->C, .dx = c->Dk, .dout = c->Dk};
    gla_apply(&t, ap, c->attn);
    for (int r = 0; r < m; r++)
        for (int i = 0; i < c->Dk; i++) ap[(size_t)r * c->Dk + i] += c->lambda[i] * pm[(size_t)r * c->Dk + i];
}

// diag(H_t) + lambda = e^{b_t} diag(Hc) + sum_{s<=t} D_ts beta_s k_s (.) k_s + lambda.
static void jacobi_diagonal(Chunk *c) {
    int n = c->cd.n, dk = c->Dk;
    for (int t = 0; t < n; t++)
        for (int i = 0; i < dk; i++) c->kw[(size_t)t * dk + i] = c->kb[(size_t)t * dk + i] * c->k[(size_t)t * dk + i];
    gemm(0, 0, n, dk, n, 1, c->cd.mask, c->C, c->kw, dk, 0, c->diag, dk);
    for (int t = 0; t < n; t++)
        for (int i = 0; i < dk; i++)
            c->diag[(size_t)t * dk + i] += c->cd.head[t] * c->hc[(size_t)i * dk + i] + c->lambda[i];
}

// Solves the chunk's n systems with right-hand sides rhs into sol.
static void solve_chunk(Chunk *c, const MnSolver *s, const float *rhs, const float *x0, float *sol, int *steps) {
    if (mesa_needs_diagonal(s)) jacobi_diagonal(c);
    cg_solve(chunk_operator, c, c->cd.n, c->Dk, s, rhs, mesa_needs_diagonal(s) ? c->diag : NULL, x0, sol, steps, &c->cg);
}

// The forward GLA form of a chunk: out = diag(e^b) X op(S) + ((X A^T) (.) D) B.
static void forward_form(Chunk *c, float *out, const float *x, int dx, const float *s, int s_trans, const float *a,
                         const float *b, int dout) {
    GlaTerms t = {.x = x, .s = s, .a = a, .b = b, .mask = c->cd.mask, .rowscale = c->cd.head, .m = c->cd.n,
                  .n = c->cd.n, .C = c->C, .dx = dx, .dout = dout, .s_trans = s_trans};
    gla_apply(&t, out, c->attn);
}

// The reversed GLA form: out = diag(e^{b_n - b}) X op(S) + ((X A^T) (.) D^T) B.
static void backward_form(Chunk *c, float *out, const float *x, int dx, const float *s, int s_trans, const float *a,
                          const float *b, int dout) {
    GlaTerms t = {.x = x, .s = s, .a = a, .b = b, .mask = c->cd.mask, .rowscale = c->cd.tail, .m = c->cd.n,
                  .n = c->cd.n, .C = c->C, .dx = dx, .dout = dout, .s_trans = s_trans, .mask_trans = 1};
    gla_apply(&t, out, c->attn);
}

// H = e^{b_n} H + K^T diag(w) K,  G = e^{b_n} G + V^T diag(w) K,  w = e^{b_n - b} beta.
static void advance_states(Chunk *c, float *h, float *g) {
    int n = c->cd.n;
    scale_rows(c->kw, c->kb, c->cd.tail, n, c->Dk);
    state_advance(h, *c->cd.decay, c->k, c->kw, n, c->Dk, c->Dk);
    state_advance(g, *c->cd.decay, c->v, c->kw, n, c->Dv, c->Dk);
}

size_t mesa_chunk_fwd_floats(const MnSeqDims *d, int C) {
    return chunk_floats(C, d->Dk, d->Dv) + (size_t)d->Dk * d->Dk + (size_t)d->Dv * d->Dk;
}

void mesa_chunk_forward(const SeqPair *p, const MnSolver *s, const MnMesaFwd *io, int bh, float *work) {
    Chunk c;
    int dk = p->Dk, dv = p->Dv;
    float *h = chunk_init(&c, work, p->C, dk, dv), *g = h + (size_t)dk * dk;
    mesa_load_states(h, g, io->h0, io->g0, bh, dk, dv);
    c.hc = h;
    c.lambda = io->lambda + mn_mesa_lambda_at(io->lambda_seqs, p->H, dk, bh / p->H, p->h);
    for (int t0 = 0; t0 < p->T; t0 += p->C) {
        int n = mn_min(p->C, p->T - t0);
        load_chunk(&c, p, t0, n, io->k, io->v, io->g, io->beta);
        gather(c.q, io->q, p, t0, n, dk);
        if (s->init == MN_CG_INIT_GIVEN) gather(c.x0, io->x0, p, t0, n, dk);
        int steps[n];
        solve_chunk(&c, s, c.q, c.x0, c.x, steps);
        forward_form(&c, c.o, c.x, dk, g, 1, c.k, c.vb, dv);
        scatter(io->x, c.x, p, t0, n, dk);
        scatter(io->o, c.o, p, t0, n, dv);
        if (io->steps)
            for (int t = 0; t < n; t++) io->steps[pair_tok(p, t0 + t)] = steps[t];
        advance_states(&c, h, g);
    }
    if (io->hT) memcpy(io->hT + (size_t)bh * dk * dk, h, sizeof(float) * dk * dk);
    if (io->gT) memcpy(io->gT + (size_t)bh * dv * dk, g, sizeof(float) * dv * dk);
}

size_t mesa_chunk_bwd_floats(const MnSeqDims *d, int C) {
    size_t nchunks = (size_t)(d->T + C - 1) / C;
    size_t hh = (size_t)d->Dk * d->Dk, gg = (size_t)d->Dv * d->Dk;
    return chunk_floats(C, d->Dk, d->Dv) + (nchunks + 1) * (hh + gg) + gg + hh + (size_t)d->T;
}

static float sum_product(const float *a, const float *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return (float)s;
}

void mesa_chunk_backward(const SeqPair *p, const MnSolver *s, const MnMesaBwd *io, int bh, float *work,
                         float *dlambda_part) {
    Chunk c;
    int dk = p->Dk, dv = p->Dv, T = p->T, C = p->C;
    int nchunks = (T + C - 1) / C;
    size_t hh = (size_t)dk * dk, gg = (size_t)dv * dk;
    float *states = chunk_init(&c, work, C, dk, dv);       // entry states of every chunk, and the final ones
    float *gbar = states + (size_t)(nchunks + 1) * (hh + gg), *hn = gbar + gg;  // adjoints at the chunk's end
    float *db_all = hn + hh;                               // [T] gradient wrt the cumulative log decay
    c.lambda = io->lambda + mn_mesa_lambda_at(io->lambda_seqs, p->H, dk, bh / p->H, p->h);

    // Recompute the chunk-entry states (cheaper than storing them in the forward).
    mesa_load_states(states, states + hh, io->h0, io->g0, bh, dk, dv);
    for (int ci = 0; ci < nchunks; ci++) {
        float *cur = states + (size_t)ci * (hh + gg), *next = cur + hh + gg;
        memcpy(next, cur, sizeof(float) * (hh + gg));
        int t0 = ci * C;
        load_chunk(&c, p, t0, mn_min(C, T - t0), io->k, io->v, io->g, io->beta);
        advance_states(&c, next, next + hh);
    }
    if (io->dgT) memcpy(gbar, io->dgT + (size_t)bh * gg, sizeof(float) * gg); else memset(gbar, 0, sizeof(float) * gg);
    if (io->dhT)
        for (size_t e = 0; e < hh; e++) hn[e] = -io->dhT[(size_t)bh * hh + e];
    else
        memset(hn, 0, sizeof(float) * hh);
    const float *final = states + (size_t)nchunks * (hh + gg);
    float db_final = (io->dhT ? sum_product(io->dhT + (size_t)bh * hh, final, hh) : 0) +
                     (io->dgT ? sum_product(io->dgT + (size_t)bh * gg, final + hh, gg) : 0);

    for (int ci = nchunks - 1; ci >= 0; ci--) {
        int t0 = ci * C, n = mn_min(C, T - t0);
        const float *hc = states + (size_t)ci * (hh + gg), *gc = hc + hh;
        load_chunk(&c, p, t0, n, io->k, io->v, io->g, io->beta);
        gather(c.x, io->x, p, t0, n, dk);
        gather(c.dout, io->dout, p, t0, n, dv);
        c.hc = hc;

        // R = G_t^T delta, Y = A^{-1} R
        forward_form(&c, c.r, c.dout, dv, gc, 0, c.v, c.kb, dk);
        int steps[n];
        MnSolver s2 = *s;
        if (s2.init == MN_CG_INIT_GIVEN) s2.init = MN_CG_INIT_ZERO;  // the given guesses were for the forward
        solve_chunk(&c, &s2, c.r, NULL, c.y, steps);

        // The reversed forms with the adjoints at the chunk's end.
        backward_form(&c, c.pv, c.k, dk, gbar, 1, c.x, c.dout, dv);  // P  = Gbar_t k_t
        backward_form(&c, c.qv, c.v, dv, gbar, 0, c.dout, c.x, dk);  // Qv = Gbar_t^T v_t
        backward_form(&c, c.r1, c.k, dk, hn, 1, c.x, c.y, dk);       // -R1 = Hn_t k_t
        backward_form(&c, c.r2, c.k, dk, hn, 0, c.y, c.x, dk);       // -R2 = Hn_t^T k_t

        for (int t = 0; t < n; t++) {
            size_t ti = pair_tok(p, t0 + t);
            float beta = io->beta[ti];
            const float *k = c.k + (size_t)t * dk, *v = c.v + (size_t)t * dv, *x = c.x + (size_t)t * dk;
            const float *y = c.y + (size_t)t * dk, *pv = c.pv + (size_t)t * dv, *qv = c.qv + (size_t)t * dk;
            const float *r1 = c.r1 + (size_t)t * dk, *r2 = c.r2 + (size_t)t * dk;
            float *dq = io->dq + ti * dk, *dkk = io->dk + ti * dk, *dvv = io->dv + ti * dv;
            float dbeta = 0, ylx = 0;
            for (int j = 0; j < dv; j++) {
                dvv[j] = beta * pv[j];
                dbeta += v[j] * pv[j];
            }
            for (int j = 0; j < dk; j++) {
                dq[j] = y[j];
                dkk[j] = beta * (qv[j] - r1[j] - r2[j]);
                dbeta -= k[j] * r1[j];
                ylx += y[j] * c.lambda[j] * x[j];
                dlambda_part[j] -= y[j] * x[j];
            }
            io->dbeta[ti] = dbeta;
            db_all[t0 + t] = ylx - beta * dbeta;
            if (io->steps) io->steps[ti] = steps[t];
        }

        // Adjoints to the chunk's start: Gbar = e^{b_n} Gbar + Delta^T diag(e^b) X, Hn likewise with Y.
        scale_rows(c.kw, c.x, c.cd.head, n, dk);
        state_advance(gbar, *c.cd.decay, c.dout, c.kw, n, dv, dk);
        state_advance(hn, *c.cd.decay, c.y, c.kw, n, dk, dk);
    }
    db_all[T - 1] += db_final;
    float acc = 0;
    for (int t = T - 1; t >= 0; t--) {
        acc += db_all[t];
        io->dg[pair_tok(p, t)] = acc;
    }
    if (io->dg0) memcpy(io->dg0 + (size_t)bh * gg, gbar, sizeof(float) * gg);
    if (io->dh0)
        for (size_t e = 0; e < hh; e++) io->dh0[(size_t)bh * hh + e] = -hn[e];
}
