/*
 * The runs backend (runs.h): R copies of a model as one batch. Each wrapped op finds the runs'
 * slabs through `be` (the RunsBackend it is), splits its rows (or sequences) in R equal parts and
 * calls the inner op once a run with that run's rows and tensors.
 */
#include "runs.h"

#include <stdlib.h>
#include <string.h>

#include "core/common.h"

static const RunsBackend *rbk(const Backend *be) { return (const RunsBackend *)be; }

// `elems` elements of kind k past p (NULL stays NULL).
static void *off(const RunsBackend *rb, const void *p, size_t elems, MemKind k) {
    return p ? (char *)p + elems * rb->in->elem_size(rb->in, k) : NULL;
}

// Whether p lies in run 0's slab [base, base + run).
static int in_slab(const char *base, size_t run, const void *p) {
    return base && (const char *)p >= base && (const char *)p < base + run;
}

// Run r's copy of the tensor at p (run 0's, in the parameter or the gradient slab); NULL stays NULL.
static void *tensor(const RunsBackend *rb, const void *p, int r) {
    if (!p) return NULL;
    if (in_slab(rb->params, rb->params_run, p)) return (char *)p + (size_t)r * rb->params_run;
    return (char *)p + (size_t)r * rb->grads_run;  // (checked by tensors_ok)
}

// MN_ERR_UNSUPPORTED unless each of the n pointers is NULL or in run 0's slabs.
static int tensors_ok(const RunsBackend *rb, const char *op, int n, const void *const *p) {
    for (int i = 0; i < n; i++)
        if (p[i] && !in_slab(rb->params, rb->params_run, p[i]) && !in_slab(rb->grads, rb->grads_run, p[i]))
            return mn_error(MN_ERR_UNSUPPORTED, "runs backend: %s was given a weight outside the model's parameter and "
                                                "gradient slabs (argument %d): it cannot tell the runs' copies apart", op, i + 1);
    return MN_OK;
}
#define TENSORS(op, ...)                                                          \
    do {                                                                          \
        const void *ps_[] = {__VA_ARGS__};                                        \
        MN_TRY(tensors_ok(rb, op, (int)(sizeof ps_ / sizeof ps_[0]), ps_));       \
    } while (0)

// Elements between two runs' copies of a tensor: one run's slab (the same count in both slabs).
static size_t run_elems(const RunsBackend *rb) { return rb->params_run / rb->in->elem_size(rb->in, MEM_PARAM); }

// A run's share of n rows (n a multiple of R).
static int share(const RunsBackend *rb, const char *op, long long n, int *out) {
    *out = 0;
    if (n % rb->R) return mn_error(MN_ERR_ARG, "runs backend: %s over %lld rows, not a multiple of its %d runs", op, n, rb->R);
    *out = (int)(n / rb->R);
    return MN_OK;
}

// --- dense layers, norms, biases: rows [r n, (r+1) n) are run r's -----------------------------------

static int r_linear_fwd(const Backend *be, void *y, const void *x, const void *w, const void *bias, int N, int nin,
                        int nout) {
    const RunsBackend *rb = rbk(be);
    int n;
    MN_TRY(share(rb, "linear_fwd", N, &n));
    TENSORS("linear_fwd", w, bias);
    if (rb->batched && rb->in->linear_runs_fwd)
        return rb->in->linear_runs_fwd(rb->in, y, x, w, bias, rb->R, n, nin, nout, run_elems(rb));
    for (int r = 0; r < rb->R; r++)
        MN_TRY(rb->in->linear_fwd(rb->in, off(rb, y, (size_t)r * n * nout, MEM_ACT), off(rb, x, (size_t)r * n * nin, MEM_ACT),
                                  tensor(rb, w, r), tensor(rb, bias, r), n, nin, nout));
    return MN_OK;
}

static int r_linear_bwd(const Backend *be, void *dx, void *dw, void *dbias, const void *dy, const void *x, const void *w,
                        int N, int nin, int nout, int accum) {
    const RunsBackend *rb = rbk(be);
    int n;
    MN_TRY(share(rb, "linear_bwd", N, &n));
    TENSORS("linear_bwd", dw, dbias, w);
    if (rb->batched && rb->in->linear_runs_bwd)
        return rb->in->linear_runs_bwd(rb->in, dx, dw, dbias, dy, x, w, rb->R, n, nin, nout, run_elems(rb), accum);
    for (int r = 0; r < rb->R; r++)
        MN_TRY(rb->in->linear_bwd(rb->in, off(rb, dx, (size_t)r * n * nin, MEM_ACT), tensor(rb, dw, r), tensor(rb, dbias, r),
                                  off(rb, dy, (size_t)r * n * nout, MEM_ACT), off(rb, x, (size_t)r * n * nin, MEM_ACT),
                                  tensor(rb, w, r), n, nin, nout, accum));
    return MN_OK;
}

static int r_rmsnorm_fwd(const Backend *be, void *y, void *rstd, const void *x, const void *w, int N, int D, int group,
                         int wlen, float eps) {
    const RunsBackend *rb = rbk(be);
    int n;
    MN_TRY(share(rb, "rmsnorm_fwd", N, &n));
    TENSORS("rmsnorm_fwd", w);
    size_t rows = (size_t)n * D, stats = (size_t)n * (D / group);
    for (int r = 0; r < rb->R; r++)
        MN_TRY(rb->in->rmsnorm_fwd(rb->in, off(rb, y, r * rows, MEM_ACT), off(rb, rstd, r * stats, MEM_F32),
                                   off(rb, x, r * rows, MEM_ACT), tensor(rb, w, r), n, D, group, wlen, eps));
    return MN_OK;
}

static int r_rmsnorm_bwd(const Backend *be, void *dx, void *dw, const void *dy, const void *x, const void *w,
                         const void *rstd, int N, int D, int group, int wlen, int accum) {
    const RunsBackend *rb = rbk(be);
    int n;
    MN_TRY(share(rb, "rmsnorm_bwd", N, &n));
    TENSORS("rmsnorm_bwd", dw, w);
    size_t rows = (size_t)n * D, stats = (size_t)n * (D / group);
    for (int r = 0; r < rb->R; r++)
        MN_TRY(rb->in->rmsnorm_bwd(rb->in, off(rb, dx, r * rows, MEM_ACT), tensor(rb, dw, r), off(rb, dy, r * rows, MEM_ACT),
                                   off(rb, x, r * rows, MEM_ACT), tensor(rb, w, r), off(rb, rstd, r * stats, MEM_F32), n, D,
                                   group, wlen, accum));
    return MN_OK;
}

static int r_layernorm_fwd(const Backend *be, void *y, void *mean, void *rstd, const void *x, const void *w, int N, int D,
                           int group, int wlen, float eps) {
    const RunsBackend *rb = rbk(be);
    int n;
    MN_TRY(share(rb, "layernorm_fwd", N, &n));
    TENSORS("layernorm_fwd", w);
    size_t rows = (size_t)n * D, stats = (size_t)n * (D / group);
    for (int r = 0; r < rb->R; r++)
        MN_TRY(rb->in->layernorm_fwd(rb->in, off(rb, y, r * rows, MEM_ACT), off(rb, mean, r * stats, MEM_F32),
                                     off(rb, rstd, r * stats, MEM_F32), off(rb, x, r * rows, MEM_ACT), tensor(rb, w, r), n,
                                     D, group, wlen, eps));
    return MN_OK;
}

static int r_layernorm_bwd(const Backend *be, void *dx, void *dw, const void *dy, const void *x, const void *w,
                           const void *mean, const void *rstd, int N, int D, int group, int wlen, int accum) {
    const RunsBackend *rb = rbk(be);
    int n;
    MN_TRY(share(rb, "layernorm_bwd", N, &n));
    TENSORS("layernorm_bwd", dw, w);
    size_t rows = (size_t)n * D, stats = (size_t)n * (D / group);
    for (int r = 0; r < rb->R; r++)
        MN_TRY(rb->in->layernorm_bwd(rb->in, off(rb, dx, r * rows, MEM_ACT), tensor(rb, dw, r), off(rb, dy, r * rows, MEM_ACT),
                                     off(rb, x, r * rows, MEM_ACT), tensor(rb, w, r), off(rb, mean, r * stats, MEM_F32),
                                     off(rb, rstd, r * stats, MEM_F32), n, D, group, wlen, accum));
    return MN_OK;
}

static int r_headwise_fwd(const Backend *be, void *y, const void *x, const void *w, int N, int nb, int bin, int bout) {
    const RunsBackend *rb = rbk(be);
    int n;
    MN_TRY(share(rb, "headwise_fwd", N, &n));
    TENSORS("headwise_fwd", w);
    for (int r = 0; r < rb->R; r++)
        MN_TRY(rb->in->headwise_fwd(rb->in, off(rb, y, (size_t)r * n * nb * bout, MEM_ACT),
                                    off(rb, x, (size_t)r * n * nb * bin, MEM_ACT), tensor(rb, w, r), n, nb, bin, bout));
    return MN_OK;
}

static int r_headwise_bwd(const Backend *be, void *dx, void *dw, const void *dy, const void *x, const void *w, int N,
                          int nb, int bin, int bout, int accum) {
    const RunsBackend *rb = rbk(be);
    int n;
    MN_TRY(share(rb, "headwise_bwd", N, &n));
    TENSORS("headwise_bwd", dw, w);
    size_t in_rows = (size_t)n * nb * bin, out_rows = (size_t)n * nb * bout;
    for (int r = 0; r < rb->R; r++)
        MN_TRY(rb->in->headwise_bwd(rb->in, off(rb, dx, r * in_rows, MEM_ACT), tensor(rb, dw, r),
                                    off(rb, dy, r * out_rows, MEM_ACT), off(rb, x, r * in_rows, MEM_ACT), tensor(rb, w, r), n,
                                    nb, bin, bout, accum));
    return MN_OK;
}

static int r_scale_add_fwd(const Backend *be, void *y, const void *a, const void *s, const void *b, int N, int C) {
    const RunsBackend *rb = rbk(be);
    int n;
    MN_TRY(share(rb, "scale_add_fwd", N, &n));
    TENSORS("scale_add_fwd", s);
    size_t rows = (size_t)n * C;
    for (int r = 0; r < rb->R; r++)
        MN_TRY(rb->in->scale_add_fwd(rb->in, off(rb, y, r * rows, MEM_ACT), off(rb, a, r * rows, MEM_ACT), tensor(rb, s, r),
                                     off(rb, b, r * rows, MEM_ACT), n, C));
    return MN_OK;
}

static int r_scale_add_bwd(const Backend *be, void *db, void *ds, const void *dy, const void *b, const void *s, int N, int C,
                           int accum) {
    const RunsBackend *rb = rbk(be);
    int n;
    MN_TRY(share(rb, "scale_add_bwd", N, &n));
    TENSORS("scale_add_bwd", ds, s);
    size_t rows = (size_t)n * C;
    for (int r = 0; r < rb->R; r++)
        MN_TRY(rb->in->scale_add_bwd(rb->in, off(rb, db, r * rows, MEM_ACT), tensor(rb, ds, r), off(rb, dy, r * rows, MEM_ACT),
                                     off(rb, b, r * rows, MEM_ACT), tensor(rb, s, r), n, C, accum));
    return MN_OK;
}

static int r_bias_fwd(const Backend *be, void *y, const void *b, int N, int C) {
    const RunsBackend *rb = rbk(be);
    int n;
    MN_TRY(share(rb, "bias_fwd", N, &n));
    TENSORS("bias_fwd", b);
    for (int r = 0; r < rb->R; r++)
        MN_TRY(rb->in->bias_fwd(rb->in, off(rb, y, (size_t)r * n * C, MEM_ACT), tensor(rb, b, r), n, C));
    return MN_OK;
}

static int r_bias_bwd(const Backend *be, void *db, const void *dy, int N, int C) {
    const RunsBackend *rb = rbk(be);
    int n;
    MN_TRY(share(rb, "bias_bwd", N, &n));
    TENSORS("bias_bwd", db);
    for (int r = 0; r < rb->R; r++)
        MN_TRY(rb->in->bias_bwd(rb->in, tensor(rb, db, r), off(rb, dy, (size_t)r * n * C, MEM_ACT), n, C));
    return MN_OK;
}

// --- sequence ops: sequences [r B/R, (r+1) B/R) are run r's ------------------------------------------

static int r_conv_fwd(const Backend *be, void *y, const void *x, const void *w, int B, int T, int C, int K,
                      const void *state_in, void *state_out) {
    const RunsBackend *rb = rbk(be);
    int b;
    MN_TRY(share(rb, "conv_fwd", B, &b));
    TENSORS("conv_fwd", w);
    size_t seqs = (size_t)b * T * C, tails = (size_t)b * (K - 1) * C;
    for (int r = 0; r < rb->R; r++)
        MN_TRY(rb->in->conv_fwd(rb->in, off(rb, y, r * seqs, MEM_ACT), off(rb, x, r * seqs, MEM_ACT), tensor(rb, w, r), b, T, C,
                                K, off(rb, state_in, r * tails, MEM_ACT), off(rb, state_out, r * tails, MEM_ACT)));
    return MN_OK;
}

static int r_conv_bwd(const Backend *be, void *dx, void *dw, const void *dy, const void *x, const void *w, int B, int T,
                      int C, int K, const void *state_in) {
    const RunsBackend *rb = rbk(be);
    int b;
    MN_TRY(share(rb, "conv_bwd", B, &b));
    TENSORS("conv_bwd", dw, w);
    size_t seqs = (size_t)b * T * C, tails = (size_t)b * (K - 1) * C;
    for (int r = 0; r < rb->R; r++)
        MN_TRY(rb->in->conv_bwd(rb->in, off(rb, dx, r * seqs, MEM_ACT), tensor(rb, dw, r), off(rb, dy, r * seqs, MEM_ACT),
                                off(rb, x, r * seqs, MEM_ACT), tensor(rb, w, r), b, T, C, K,
                                off(rb, state_in, r * tails, MEM_ACT)));
    return MN_OK;
}

static int r_embed_fwd(const Backend *be, void *x, const void *tokens, const void *e, int N, int D, float scale) {
    const RunsBackend *rb = rbk(be);
    int n;
    MN_TRY(share(rb, "embed_fwd", N, &n));
    TENSORS("embed_fwd", e);
    for (int r = 0; r < rb->R; r++)
        MN_TRY(rb->in->embed_fwd(rb->in, off(rb, x, (size_t)r * n * D, MEM_ACT), off(rb, tokens, (size_t)r * n, MEM_I32),
                                 tensor(rb, e, r), n, D, scale));
    return MN_OK;
}

static int r_embed_bwd(const Backend *be, void *de, const void *dx, const void *tokens, int N, int D, float scale) {
    const RunsBackend *rb = rbk(be);
    int n;
    MN_TRY(share(rb, "embed_bwd", N, &n));
    TENSORS("embed_bwd", de);
    for (int r = 0; r < rb->R; r++)
        MN_TRY(rb->in->embed_bwd(rb->in, tensor(rb, de, r), off(rb, dx, (size_t)r * n * D, MEM_ACT),
                                 off(rb, tokens, (size_t)r * n, MEM_I32), n, D, scale));
    return MN_OK;
}

// --- a training step's per-run sums: the gradient's weight grad_scale_at [R], the loss sum [R] -------

static int r_xent(const Backend *be, void *logits, void *losses, const void *targets, int N, int V, float cap,
                  float grad_scale, const void *grad_scale_at) {
    const RunsBackend *rb = rbk(be);
    if (!grad_scale_at) return rb->in->xent(rb->in, logits, losses, targets, N, V, cap, grad_scale, NULL);
    int n;
    MN_TRY(share(rb, "xent", N, &n));
    for (int r = 0; r < rb->R; r++)
        MN_TRY(rb->in->xent(rb->in, off(rb, logits, (size_t)r * n * V, MEM_ACT), off(rb, losses, (size_t)r * n, MEM_F32),
                            off(rb, targets, (size_t)r * n, MEM_I32), n, V, cap, grad_scale, off(rb, grad_scale_at, r, MEM_F32)));
    return MN_OK;
}

static int r_sum_f32(const Backend *be, void *sum, const void *x, size_t n) {
    const RunsBackend *rb = rbk(be);
    int k;
    MN_TRY(share(rb, "sum_f32", (long long)n, &k));
    for (int r = 0; r < rb->R; r++)
        MN_TRY(rb->in->sum_f32(rb->in, off(rb, sum, r, MEM_F64), off(rb, x, (size_t)r * k, MEM_F32), (size_t)k));
    return MN_OK;
}

// --- the Mesa layer: its ridge is per run: the core once a run, or (batched) once over every run's
// sequences with a ridge row a run (MnMesaFwd.lambda_seqs) ----------------------------------------------

// lambda = softplus(p) + lo: y (the mixer's [R, n] buffer) from each run's p
static int r_softplus_fwd(const Backend *be, void *y, const void *p, size_t n, float lo) {
    const RunsBackend *rb = rbk(be);
    TENSORS("mesa softplus_fwd", p);
    for (int r = 0; r < rb->R; r++)
        MN_TRY(rb->in->mesa->softplus_fwd(rb->in, off(rb, y, r * n, MEM_F32), tensor(rb, p, r), n, lo));
    return MN_OK;
}

static int r_softplus_bwd(const Backend *be, void *dp, const void *dy, const void *p, size_t n) {
    const RunsBackend *rb = rbk(be);
    TENSORS("mesa softplus_bwd", dp, p);
    for (int r = 0; r < rb->R; r++)
        MN_TRY(rb->in->mesa->softplus_bwd(rb->in, tensor(rb, dp, r), off(rb, dy, r * n, MEM_F32), tensor(rb, p, r), n));
    return MN_OK;
}

// Element counts per sequence of the Mesa core's tensors: token rows (q, k, x), value rows (v, o),
// gates (g, beta, steps), and the states.
typedef struct {
    size_t qk, vo, gate, h, g;
} MesaSeq;

static MesaSeq mesa_seq(const MnSeqDims *d) {
    size_t T = (size_t)d->T, H = (size_t)d->H, Dk = (size_t)d->Dk, Dv = (size_t)d->Dv;
    return (MesaSeq){T * H * Dk, T * H * Dv, T * H, H * Dk * Dk, H * Dv * Dk};
}

static int r_mesa_fwd(const Backend *be, const MnSeqDims *d, const MnSolver *s, const MnMesaFwd *io) {
    const RunsBackend *rb = rbk(be);
    int b;
    MN_TRY(share(rb, "mesa fwd", d->B, &b));
    if (rb->batched) {  // every run's sequences in one call, each run's b with its own ridge row
        MnMesaFwd all = *io;
        all.lambda_seqs = b;
        return rb->in->mesa->fwd(rb->in, d, s, &all);
    }
    MnSeqDims dr = *d;
    dr.B = b;
    MesaSeq z = mesa_seq(d);
    size_t lam = (size_t)d->H * d->Dk;
    for (int r = 0; r < rb->R; r++) {
        size_t s0 = (size_t)r * b;  // the run's first sequence
        MnMesaFwd o = {
            .q = off(rb, io->q, s0 * z.qk, MEM_ACT), .k = off(rb, io->k, s0 * z.qk, MEM_ACT),
            .v = off(rb, io->v, s0 * z.vo, MEM_ACT), .g = off(rb, io->g, s0 * z.gate, MEM_F32),
            .beta = off(rb, io->beta, s0 * z.gate, MEM_F32), .lambda = off(rb, io->lambda, r * lam, MEM_F32),
            .h0 = off(rb, io->h0, s0 * z.h, MEM_F32), .g0 = off(rb, io->g0, s0 * z.g, MEM_F32),
            .x0 = off(rb, io->x0, s0 * z.qk, MEM_ACT), .o = off(rb, io->o, s0 * z.vo, MEM_ACT),
            .x = off(rb, io->x, s0 * z.qk, MEM_ACT), .hT = off(rb, io->hT, s0 * z.h, MEM_F32),
            .gT = off(rb, io->gT, s0 * z.g, MEM_F32), .steps = off(rb, io->steps, s0 * z.gate, MEM_I32),
        };
        MN_TRY(rb->in->mesa->fwd(rb->in, &dr, s, &o));
    }
    return MN_OK;
}

static int r_mesa_bwd(const Backend *be, const MnSeqDims *d, const MnSolver *s, const MnMesaBwd *io) {
    const RunsBackend *rb = rbk(be);
    int b;
    MN_TRY(share(rb, "mesa bwd", d->B, &b));
    if (rb->batched) {
        MnMesaBwd all = *io;
        all.lambda_seqs = b;
        return rb->in->mesa->bwd(rb->in, d, s, &all);
    }
    MnSeqDims dr = *d;
    dr.B = b;
    MesaSeq z = mesa_seq(d);
    size_t lam = (size_t)d->H * d->Dk;
    for (int r = 0; r < rb->R; r++) {
        size_t s0 = (size_t)r * b;
        MnMesaBwd o = {
            .q = off(rb, io->q, s0 * z.qk, MEM_ACT), .k = off(rb, io->k, s0 * z.qk, MEM_ACT),
            .v = off(rb, io->v, s0 * z.vo, MEM_ACT), .g = off(rb, io->g, s0 * z.gate, MEM_F32),
            .beta = off(rb, io->beta, s0 * z.gate, MEM_F32), .lambda = off(rb, io->lambda, r * lam, MEM_F32),
            .h0 = off(rb, io->h0, s0 * z.h, MEM_F32), .g0 = off(rb, io->g0, s0 * z.g, MEM_F32),
            .x = off(rb, io->x, s0 * z.qk, MEM_ACT), .o = off(rb, io->o, s0 * z.vo, MEM_ACT),
            .dout = off(rb, io->dout, s0 * z.vo, MEM_ACT), .dhT = off(rb, io->dhT, s0 * z.h, MEM_F32),
            .dgT = off(rb, io->dgT, s0 * z.g, MEM_F32), .dq = off(rb, io->dq, s0 * z.qk, MEM_ACT),
            .dk = off(rb, io->dk, s0 * z.qk, MEM_ACT), .dv = off(rb, io->dv, s0 * z.vo, MEM_ACT),
            .dg = off(rb, io->dg, s0 * z.gate, MEM_F32), .dbeta = off(rb, io->dbeta, s0 * z.gate, MEM_F32),
            .dlambda = off(rb, io->dlambda, r * lam, MEM_F32), .dh0 = off(rb, io->dh0, s0 * z.h, MEM_F32),
            .dg0 = off(rb, io->dg0, s0 * z.g, MEM_F32), .steps = off(rb, io->steps, s0 * z.gate, MEM_I32),
        };
        MN_TRY(rb->in->mesa->bwd(rb->in, &dr, s, &o));
    }
    return MN_OK;
}

// --- the Gated DeltaNet paper's gate: per-head parameters over rows of H -------------------------------

static int r_gdn_gate_fwd(const Backend *be, void *g, const void *a, const void *A_log, const void *dt_bias, int N, int H) {
    const RunsBackend *rb = rbk(be);
    int n;
    MN_TRY(share(rb, "gdn_gate_fwd", N, &n));
    TENSORS("gdn_gate_fwd", A_log, dt_bias);
    size_t rows = (size_t)n * H;
    for (int r = 0; r < rb->R; r++)
        MN_TRY(rb->in->lin->gdn_gate_fwd(rb->in, off(rb, g, r * rows, MEM_F32), off(rb, a, r * rows, MEM_ACT),
                                         tensor(rb, A_log, r), tensor(rb, dt_bias, r), n, H));
    return MN_OK;
}

static int r_gdn_gate_bwd(const Backend *be, void *da, void *dA_log, void *ddt_bias, const void *dg, const void *a,
                          const void *A_log, const void *dt_bias, int N, int H) {
    const RunsBackend *rb = rbk(be);
    int n;
    MN_TRY(share(rb, "gdn_gate_bwd", N, &n));
    TENSORS("gdn_gate_bwd", dA_log, ddt_bias, A_log, dt_bias);
    size_t rows = (size_t)n * H;
    for (int r = 0; r < rb->R; r++)
        MN_TRY(rb->in->lin->gdn_gate_bwd(rb->in, off(rb, da, r * rows, MEM_ACT), tensor(rb, dA_log, r),
                                         tensor(rb, ddt_bias, r), off(rb, dg, r * rows, MEM_F32),
                                         off(rb, a, r * rows, MEM_ACT), tensor(rb, A_log, r), tensor(rb, dt_bias, r), n, H));
    return MN_OK;
}

// --- the diagonal scans (per-channel parameters: once a run, or batched with a group a run) and the
// sLSTM (its recurrent kernel): once a run -----------------------------------------------------------

// Batched: every run's sequences in one call, each run's b with its own w and skip (ScanDims.w_seqs).
static ScanDims scan_all(const RunsBackend *rb, const ScanDims *d, int b) {
    ScanDims all = *d;
    all.w_seqs = b, all.w_stride = run_elems(rb);
    return all;
}

static int r_scan_fwd(const Backend *be, const ScanDims *d, const ScanFwd *io) {
    const RunsBackend *rb = rbk(be);
    int b;
    MN_TRY(share(rb, "scan fwd", d->B, &b));
    TENSORS("scan fwd", io->w, io->skip);
    if (rb->batched) {
        ScanDims all = scan_all(rb, d, b);
        return rb->in->scan->fwd(rb->in, &all, io);
    }
    ScanDims dr = *d;
    dr.B = b;
    size_t xc = (size_t)b * d->T * d->C, kn = (size_t)b * d->T * d->N, st = (size_t)b * d->C * d->N;
    for (int r = 0; r < rb->R; r++) {
        ScanFwd o = {.x = off(rb, io->x, r * xc, MEM_ACT), .r = off(rb, io->r, r * xc, MEM_ACT),
                     .i = off(rb, io->i, r * xc, MEM_ACT), .k = off(rb, io->k, r * kn, MEM_ACT),
                     .q = off(rb, io->q, r * kn, MEM_ACT), .w = tensor(rb, io->w, r), .skip = tensor(rb, io->skip, r),
                     .s0 = off(rb, io->s0, r * st, MEM_F32), .y = off(rb, io->y, r * xc, MEM_ACT),
                     .sT = off(rb, io->sT, r * st, MEM_F32)};
        MN_TRY(rb->in->scan->fwd(rb->in, &dr, &o));
    }
    return MN_OK;
}

static int r_scan_bwd(const Backend *be, const ScanDims *d, const ScanBwd *io) {
    const RunsBackend *rb = rbk(be);
    int b;
    MN_TRY(share(rb, "scan bwd", d->B, &b));
    TENSORS("scan bwd", io->w, io->skip, io->dw, io->dskip);
    if (rb->batched) {
        ScanDims all = scan_all(rb, d, b);
        return rb->in->scan->bwd(rb->in, &all, io);
    }
    ScanDims dr = *d;
    dr.B = b;
    size_t xc = (size_t)b * d->T * d->C, kn = (size_t)b * d->T * d->N;
    for (int r = 0; r < rb->R; r++) {
        ScanBwd o = {.x = off(rb, io->x, r * xc, MEM_ACT), .r = off(rb, io->r, r * xc, MEM_ACT),
                     .i = off(rb, io->i, r * xc, MEM_ACT), .k = off(rb, io->k, r * kn, MEM_ACT),
                     .q = off(rb, io->q, r * kn, MEM_ACT), .w = tensor(rb, io->w, r), .skip = tensor(rb, io->skip, r),
                     .dy = off(rb, io->dy, r * xc, MEM_ACT), .dx = off(rb, io->dx, r * xc, MEM_ACT),
                     .dr = off(rb, io->dr, r * xc, MEM_ACT), .di = off(rb, io->di, r * xc, MEM_ACT),
                     .dk = off(rb, io->dk, r * kn, MEM_ACT), .dq = off(rb, io->dq, r * kn, MEM_ACT),
                     .dw = tensor(rb, io->dw, r), .dskip = tensor(rb, io->dskip, r)};
        MN_TRY(rb->in->scan->bwd(rb->in, &dr, &o));
    }
    return MN_OK;
}

static int r_slstm_fwd(const Backend *be, const SlstmDims *d, const SlstmFwd *io) {
    const RunsBackend *rb = rbk(be);
    int b;
    MN_TRY(share(rb, "slstm fwd", d->B, &b));
    TENSORS("slstm fwd", io->r);
    SlstmDims dr = *d;
    dr.B = b;
    size_t D = (size_t)d->H * d->Dh, x = (size_t)b * d->T * 4 * D, h = (size_t)b * d->T * D, st = (size_t)b * 4 * D;
    for (int r = 0; r < rb->R; r++) {
        SlstmFwd o = {.x = off(rb, io->x, r * x, MEM_ACT), .r = tensor(rb, io->r, r), .s0 = off(rb, io->s0, r * st, MEM_F32),
                      .h = off(rb, io->h, r * h, MEM_ACT), .cache = off(rb, io->cache, r * x, MEM_F32),
                      .sT = off(rb, io->sT, r * st, MEM_F32)};
        MN_TRY(rb->in->slstm->fwd(rb->in, &dr, &o));
    }
    return MN_OK;
}

static int r_slstm_bwd(const Backend *be, const SlstmDims *d, const SlstmBwd *io) {
    const RunsBackend *rb = rbk(be);
    int b;
    MN_TRY(share(rb, "slstm bwd", d->B, &b));
    TENSORS("slstm bwd", io->r, io->dr);
    SlstmDims dr = *d;
    dr.B = b;
    size_t D = (size_t)d->H * d->Dh, x = (size_t)b * d->T * 4 * D, h = (size_t)b * d->T * D;
    for (int r = 0; r < rb->R; r++) {
        SlstmBwd o = {.x = off(rb, io->x, r * x, MEM_ACT), .r = tensor(rb, io->r, r), .cache = off(rb, io->cache, r * x, MEM_F32),
                      .dh = off(rb, io->dh, r * h, MEM_ACT), .dx = off(rb, io->dx, r * x, MEM_ACT),
                      .dr = tensor(rb, io->dr, r)};
        MN_TRY(rb->in->slstm->bwd(rb->in, &dr, &o));
    }
    return MN_OK;
}

// Ops a model of several runs cannot use: each would mix the runs (a collective over the whole slab
// is data parallelism's, over one model).
static int r_allreduce(const Backend *be, void *x, size_t n) {
    return mn_error(MN_ERR_UNSUPPORTED, "runs backend: data parallelism over a model of several runs");
}

int runs_backend_init(RunsBackend *rb, const Backend *in, int R) {
    if (R < 2) return mn_error(MN_ERR_ARG, "runs backend: %d runs (at least 2; one run is the plain backend)", R);
    memset(rb, 0, sizeof *rb);
    rb->be = *in;  // every op not wrapped below goes to `in` as it is (its ctx, its name)
    rb->in = in;
    rb->R = R;
    const char *env = getenv("MESANET_RUNS_BATCHED");
    rb->batched = env && !strcmp(env, "1");
    Backend *b = &rb->be;
    b->runs = R;
    b->linear_fwd = r_linear_fwd, b->linear_bwd = r_linear_bwd;
    b->linear_runs_fwd = NULL, b->linear_runs_bwd = NULL;  // (in's, called with in's own rows and tensors above)
    b->rmsnorm_fwd = r_rmsnorm_fwd, b->rmsnorm_bwd = r_rmsnorm_bwd;
    if (in->layernorm_fwd) b->layernorm_fwd = r_layernorm_fwd, b->layernorm_bwd = r_layernorm_bwd;
    if (in->headwise_fwd) b->headwise_fwd = r_headwise_fwd, b->headwise_bwd = r_headwise_bwd;
    if (in->scale_add_fwd) b->scale_add_fwd = r_scale_add_fwd, b->scale_add_bwd = r_scale_add_bwd;
    b->bias_fwd = r_bias_fwd, b->bias_bwd = r_bias_bwd;
    b->conv_fwd = r_conv_fwd, b->conv_bwd = r_conv_bwd;
    b->embed_fwd = r_embed_fwd, b->embed_bwd = r_embed_bwd;
    b->xent = r_xent;
    b->sum_f32 = r_sum_f32;
    if (in->allreduce) b->allreduce = r_allreduce;
    b->group_id = NULL, b->group_join = NULL;
    if (in->mesa) {
        rb->mesa = *in->mesa;
        rb->mesa.fwd = r_mesa_fwd, rb->mesa.bwd = r_mesa_bwd;
        rb->mesa.softplus_fwd = r_softplus_fwd, rb->mesa.softplus_bwd = r_softplus_bwd;
        b->mesa = &rb->mesa;
    }
    if (in->lin) {  // the cores read no parameters: all runs' sequences in one call
        rb->lin = *in->lin;
        if (in->lin->gdn_gate_fwd) rb->lin.gdn_gate_fwd = r_gdn_gate_fwd, rb->lin.gdn_gate_bwd = r_gdn_gate_bwd;
        b->lin = &rb->lin;
    }
    if (in->scan) {
        rb->scan = *in->scan;
        rb->scan.fwd = r_scan_fwd, rb->scan.bwd = r_scan_bwd;
        b->scan = &rb->scan;
    }
    if (in->slstm) {
        rb->slstm = *in->slstm;
        rb->slstm.fwd = r_slstm_fwd, rb->slstm.bwd = r_slstm_bwd;
        b->slstm = &rb->slstm;
    }
    return MN_OK;  // attention and the mLSTM core read no parameters: in's, all runs at once
}

void runs_backend_slabs(RunsBackend *rb, const void *params, size_t params_run, const void *grads, size_t grads_run) {
    rb->params = params, rb->params_run = params_run;
    rb->grads = grads, rb->grads_run = grads_run;
}
