/*
 * The public gated linear-attention cores on the CPU (GLA / Mamba2, DeltaNet /
 * Gated DeltaNet): argument checks, the choice between the chunkwise and the
 * recurrent form, and threads over (sequence, head) pairs.
 */
#include <omp.h>
#include <string.h>

#include "core/common.h"
#include "core/seq_args.h"
#include "lin_cpu.h"
#include "workspace.h"

MnLinOpts mn_lin_opts_default(MnLinRule rule) {
    MnLinOpts o = {.rule = rule, .scale = 1.0f, .form = MN_FORM_AUTO, .chunk = 0, .precision = MN_PREC_AUTO};
    return o;
}

// C = 64, as the official Gated DeltaNet kernels: the products C x Dk by Dk x Dv
// are then large enough for BLAS, and the C x C work (K K^T, the triangular
// inverse, the masks) stays below the state terms for head sizes >= 64.
enum { LIN_DEFAULT_CHUNK = 64 };

// AUTO: the recurrent form only for decoding (T < 4): the chunkwise form was the
// faster from T = 4 up, for both rules, and the recurrent backward at T = 1
// (docs/results.md, "Gated linear-attention cores on the CPU").
static MnForm pick_form(const MnSeqDims *d, const MnLinOpts *o) {
    if (o->form != MN_FORM_AUTO) return o->form;
    return d->T < 4 ? MN_FORM_RECURRENT : MN_FORM_CHUNK;
}

static int check_common(const char *fn, const MnSeqDims *d, const MnLinOpts *o, const void *io, const float *q,
                        const float *k, const float *v) {
    MN_TRY(lin_check_args(fn, d, o, io));
    if (!q || !k || !v) return mn_error(MN_ERR_ARG, "%s: q, k and v are required", fn);
    return MN_OK;
}

typedef struct {
    const MnLinOpts *o;
    const MnLinFwd *fwd;
    const MnLinBwd *bwd;
    MnForm form;
} LinRun;

static void fwd_pair(void *ctx, const SeqPair *p, int bh, float *work) {
    const LinRun *r = ctx;
    if (r->form == MN_FORM_CHUNK) lin_chunk_forward(p, r->o, r->fwd, bh, work);
    else lin_rec_forward(p, r->o, r->fwd, bh, work);
}

static void bwd_pair(void *ctx, const SeqPair *p, int bh, float *work) {
    const LinRun *r = ctx;
    if (r->form == MN_FORM_CHUNK) lin_chunk_backward(p, r->o, r->bwd, bh, work);
    else lin_rec_backward(p, r->o, r->bwd, bh, work);
}

int mn_lin_forward(const MnSeqDims *d, const MnLinOpts *o, const MnLinFwd *io) {
    const char *fn = "mn_lin_forward";
    MN_TRY(check_common(fn, d, o, io, io ? io->q : NULL, io ? io->k : NULL, io ? io->v : NULL));
    if (!io->o) return mn_error(MN_ERR_ARG, "%s: o is NULL", fn);
    int C = o->chunk ? o->chunk : LIN_DEFAULT_CHUNK;
    MnForm form = pick_form(d, o);
    size_t per = form == MN_FORM_CHUNK ? lin_chunk_fwd_floats(d, C) : lin_rec_fwd_floats(d);
    LinRun r = {o, io, NULL, form};
    return cpu_for_pairs(d, C, per, 0, NULL, fwd_pair, &r);
}

int mn_lin_backward(const MnSeqDims *d, const MnLinOpts *o, const MnLinBwd *io) {
    const char *fn = "mn_lin_backward";
    MN_TRY(check_common(fn, d, o, io, io ? io->q : NULL, io ? io->k : NULL, io ? io->v : NULL));
    if (!io->dout || !io->dq || !io->dk || !io->dv) return mn_error(MN_ERR_ARG, "%s: dout, dq, dk and dv are required", fn);
    if (io->g && !io->dg) return mn_error(MN_ERR_ARG, "%s: dg is NULL while g is given", fn);
    if (io->beta && !io->dbeta) return mn_error(MN_ERR_ARG, "%s: dbeta is NULL while beta is given", fn);
    int C = o->chunk ? o->chunk : LIN_DEFAULT_CHUNK;
    MnForm form = pick_form(d, o);
    size_t per = form == MN_FORM_CHUNK ? lin_chunk_bwd_floats(d, C) : lin_rec_bwd_floats(d, C);
    LinRun r = {o, NULL, io, form};
    return cpu_for_pairs(d, C, per, 0, NULL, bwd_pair, &r);
}
