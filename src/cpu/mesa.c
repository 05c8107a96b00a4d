/*
 * The public Mesa core on the CPU: argument checks, the choice between the
 * chunkwise and the recurrent form, and threads over (sequence, head) pairs.
 */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "core/common.h"
#include "core/seq_args.h"
#include "mesa_cpu.h"
#include "workspace.h"

// The form AUTO runs, from `mesanet bench mesa` (docs/results.md, "Mesa layer
// on the CPU"): the chunkwise form was faster at every head size
// measured (16 to 128) once a sequence fills a few chunks; the recurrent form
// wins for short inputs, where a chunk would be mostly empty (decode, T = 1).
static MnForm pick_form(const MnSeqDims *d, const MnSolver *s, int C) {
    if (s->form != MN_FORM_AUTO) return s->form;
    return d->T < C / 2 ? MN_FORM_RECURRENT : MN_FORM_CHUNK;
}

// The CPU's chunk size when the solver leaves it to us (chunk = 0): per CG
// step a chunk costs 2 C Dk^2 (the state term, as the recurrent form) plus
// 4 C^2 Dk (the intra-chunk products), so small chunks waste the least work
// as long as the matrix products stay efficient: 16 measured best at Dk = 64;
// at Dk = 128, 16 and 32 tie within noise and 32 keeps the products larger
// (docs/results.md, "Mesa layer on the CPU").
static int default_chunk(const MnSeqDims *d) { return d->Dk <= 64 ? 16 : 32; }

static int require(const void *p, const char *fn, const char *name) {
    return p ? MN_OK : mn_error(MN_ERR_ARG, "%s: %s is NULL", fn, name);
}

// Every element finite (and, for gates, in range): the check mode.
static int check_finite(const char *fn, const char *name, const float *x, size_t n) {
    if (!x) return MN_OK;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return mn_error(MN_ERR_NUMERIC, "%s: %s[%zu] = %g is not finite", fn, name, i, (double)x[i]);
    return MN_OK;
}

static int check_lambda(const char *fn, const MnSeqDims *d, const float *lambda, int lambda_seqs) {
    char what[96];
    snprintf(what, sizeof what, "%s: lambda_seqs", fn);
    MN_TRY(seq_check_groups(d, lambda_seqs, what));
    for (size_t i = 0; i < mn_mesa_lambda_len(d, lambda_seqs); i++)
        if (!(lambda[i] > 0))
            return mn_error(MN_ERR_ARG, "%s: lambda[%zu] = %g, must be > 0 (H + Lambda must be positive definite)", fn,
                            i, (double)lambda[i]);
    return MN_OK;
}

static int check_gates(const char *fn, const MnSeqDims *d, const float *g, const float *beta) {
    size_t n = (size_t)d->B * d->T * d->H;
    for (size_t i = 0; i < n; i++) {
        if (!(g[i] <= 0)) return mn_error(MN_ERR_NUMERIC, "%s: g[%zu] = %g, the log forget gate must be <= 0", fn, i, (double)g[i]);
        if (!(beta[i] >= 0 && isfinite(beta[i])))
            return mn_error(MN_ERR_NUMERIC, "%s: beta[%zu] = %g, must be finite and >= 0", fn, i, (double)beta[i]);
    }
    return MN_OK;
}

typedef struct {
    size_t nqk, nv, ng, nh, ngs;  // element counts of q/k, v, g/beta, H states, G states
} Counts;

static Counts counts(const MnSeqDims *d) {
    size_t ntok = (size_t)d->B * d->T * d->H;
    Counts c = {ntok * d->Dk, ntok * d->Dv, ntok, (size_t)d->B * d->H * d->Dk * d->Dk, (size_t)d->B * d->H * d->Dv * d->Dk};
    return c;
}

static int check_inputs(const char *fn, const MnSeqDims *d, const float *q, const float *k, const float *v,
                        const float *g, const float *beta, const float *h0, const float *g0) {
    Counts c = counts(d);
    MN_TRY(check_finite(fn, "q", q, c.nqk));
    MN_TRY(check_finite(fn, "k", k, c.nqk));
    MN_TRY(check_finite(fn, "v", v, c.nv));
    MN_TRY(check_gates(fn, d, g, beta));
    MN_TRY(check_finite(fn, "h0", h0, c.nh));
    return check_finite(fn, "g0", g0, c.ngs);
}

typedef struct {
    const MnSolver *s;
    const MnMesaFwd *fwd;
    const MnMesaBwd *bwd;
    MnForm form;
    float *parts;  // [B*H, Dk] the pairs' dlambda partials
    int Dk;
} MesaRun;

static void fwd_pair(void *ctx, const SeqPair *p, int bh, float *work) {
    const MesaRun *r = ctx;
    if (r->form == MN_FORM_CHUNK) mesa_chunk_forward(p, r->s, r->fwd, bh, work);
    else mesa_rec_forward(p, r->s, r->fwd, bh, work);
}

static void bwd_pair(void *ctx, const SeqPair *p, int bh, float *work) {
    const MesaRun *r = ctx;
    float *part = r->parts + (size_t)bh * r->Dk;
    if (r->form == MN_FORM_CHUNK) mesa_chunk_backward(p, r->s, r->bwd, bh, work, part);
    else mesa_rec_backward(p, r->s, r->bwd, bh, work, part);
}

int mn_mesa_forward(const MnSeqDims *d, const MnSolver *s, const MnMesaFwd *io) {
    const char *fn = "mn_mesa_forward";
    MN_TRY(seq_check_dims(d));
    MN_TRY(seq_check_solver(s));
    if (!io) return mn_error(MN_ERR_ARG, "%s: io is NULL", fn);
    MN_TRY(require(io->q, fn, "q"));
    MN_TRY(require(io->k, fn, "k"));
    MN_TRY(require(io->v, fn, "v"));
    MN_TRY(require(io->g, fn, "g"));
    MN_TRY(require(io->beta, fn, "beta"));
    MN_TRY(require(io->lambda, fn, "lambda"));
    MN_TRY(require(io->o, fn, "o"));
    MN_TRY(require(io->x, fn, "x"));
    if (s->init == MN_CG_INIT_GIVEN) MN_TRY(require(io->x0, fn, "x0 (initial guess MN_CG_INIT_GIVEN)"));
    MN_TRY(check_lambda(fn, d, io->lambda, io->lambda_seqs));
    if (s->check) MN_TRY(check_inputs(fn, d, io->q, io->k, io->v, io->g, io->beta, io->h0, io->g0));

    int C = s->chunk ? s->chunk : default_chunk(d);
    MnForm form = pick_form(d, s, C);
    size_t per = form == MN_FORM_CHUNK ? mesa_chunk_fwd_floats(d, C) : mesa_rec_fwd_floats(d);
    MesaRun r = {s, io, NULL, form, NULL, d->Dk};
    MN_TRY(cpu_for_pairs(d, C, per, 0, NULL, fwd_pair, &r));
    if (s->check) {
        Counts c = counts(d);
        MN_TRY(check_finite(fn, "output o", io->o, c.nv));
        MN_TRY(check_finite(fn, "final state hT", io->hT, c.nh));
        MN_TRY(check_finite(fn, "final state gT", io->gT, c.ngs));
    }
    return MN_OK;
}

int mn_mesa_backward(const MnSeqDims *d, const MnSolver *s, const MnMesaBwd *io) {
    const char *fn = "mn_mesa_backward";
    MN_TRY(seq_check_dims(d));
    MN_TRY(seq_check_solver(s));
    if (!io) return mn_error(MN_ERR_ARG, "%s: io is NULL", fn);
    const struct {
        const void *p;
        const char *name;
    } req[] = {{io->q, "q"},       {io->k, "k"},   {io->v, "v"},   {io->g, "g"},   {io->beta, "beta"},
               {io->lambda, "lambda"}, {io->x, "x"}, {io->o, "o"}, {io->dout, "dout"}, {io->dq, "dq"},
               {io->dk, "dk"},     {io->dv, "dv"}, {io->dg, "dg"}, {io->dbeta, "dbeta"}, {io->dlambda, "dlambda"}};
    for (size_t i = 0; i < sizeof req / sizeof req[0]; i++) MN_TRY(require(req[i].p, fn, req[i].name));
    MN_TRY(check_lambda(fn, d, io->lambda, io->lambda_seqs));
    Counts c = counts(d);
    if (s->check) {
        MN_TRY(check_inputs(fn, d, io->q, io->k, io->v, io->g, io->beta, io->h0, io->g0));
        MN_TRY(check_finite(fn, "x", io->x, c.nqk));
        MN_TRY(check_finite(fn, "dout", io->dout, c.nv));
    }

    int C = s->chunk ? s->chunk : default_chunk(d);
    MnForm form = pick_form(d, s, C);
    size_t per = form == MN_FORM_CHUNK ? mesa_chunk_bwd_floats(d, C) : mesa_rec_bwd_floats(d, C);
    int npairs = d->B * d->H;
    // One dlambda partial per pair, summed in a fixed order: results do not
    // depend on how the pairs were scheduled (resumed runs stay bit-exact).
    MesaRun r = {s, NULL, io, form, NULL, d->Dk};
    MN_TRY(cpu_for_pairs(d, C, per, (size_t)npairs * d->Dk, &r.parts, bwd_pair, &r));
    float *parts = r.parts;
    memset(io->dlambda, 0, sizeof(float) * mn_mesa_lambda_len(d, io->lambda_seqs));
    for (int bh = 0; bh < npairs; bh++) {  // (a group's pairs in order: as the group alone sums them)
        float *dl = io->dlambda + mn_mesa_lambda_at(io->lambda_seqs, d->H, d->Dk, bh / d->H, bh % d->H);
        for (int i = 0; i < d->Dk; i++) dl[i] += parts[(size_t)bh * d->Dk + i];
    }
    if (s->check) {
        MN_TRY(check_finite(fn, "dq", io->dq, c.nqk));
        MN_TRY(check_finite(fn, "dk", io->dk, c.nqk));
        MN_TRY(check_finite(fn, "dv", io->dv, c.nv));
        MN_TRY(check_finite(fn, "dg", io->dg, c.ng));
        MN_TRY(check_finite(fn, "dbeta", io->dbeta, c.ng));
    }
    return MN_OK;
}
