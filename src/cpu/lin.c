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
    MnLinOpts o = {rule, 1.0f, MN_FORM_AUTO, 0};
    return o;
}

// C = 64, as the official Gated DeltaNet kernels: the products C x Dk by Dk x Dv
// are then large enough for BLAS, and the C x C work (K K^T, the triangular
// inverse, the masks) stays below the state terms for head sizes >= 64.
enum { LIN_DEFAULT_CHUNK = 64 };

// AUTO: the recurrent form only for decoding (T < 4). Measured on one core of
// the 2-core Zen 5 of the README (B = H = 4, Dk = Dv = 64, both rules), the
// chunkwise form is faster from T = 4 up (T = 16: fwd 0.09 / 0.13 ms, bwd 0.29 /
// 0.58 ms against the recurrent form; T = 1024 on 2 threads: fwd+bwd 44 / 80 ms
// for GLA, 88 / 110 ms for the delta rule), and at T = 1 the recurrent backward
// is the faster (0.05 / 0.09 ms).
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

static MesaPair pair_of(const MnSeqDims *d, int bh, int C) {
    MesaPair p = {d->T, d->H, d->Dk, d->Dv, C, (size_t)(bh / d->H) * d->T * d->H + (size_t)(bh % d->H), bh % d->H};
    return p;
}

static int threads_for(const MnSeqDims *d) { return mn_max(1, mn_min(omp_get_max_threads(), d->B * d->H)); }

int mn_lin_forward(const MnSeqDims *d, const MnLinOpts *o, const MnLinFwd *io) {
    const char *fn = "mn_lin_forward";
    MN_TRY(check_common(fn, d, o, io, io ? io->q : NULL, io ? io->k : NULL, io ? io->v : NULL));
    if (!io->o) return mn_error(MN_ERR_ARG, "%s: o is NULL", fn);
    int C = o->chunk ? o->chunk : LIN_DEFAULT_CHUNK;
    MnForm form = pick_form(d, o);
    size_t per = form == MN_FORM_CHUNK ? lin_chunk_fwd_floats(d, C) : lin_rec_fwd_floats(d);
    int nt = threads_for(d);
    float *work = cpu_workspace((size_t)nt * per);
    if (!work) return MN_ERR_NOMEM;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int bh = 0; bh < d->B * d->H; bh++) {
        MesaPair p = pair_of(d, bh, C);
        float *mine = work + (size_t)omp_get_thread_num() * per;
        if (form == MN_FORM_CHUNK)
            lin_chunk_forward(&p, o, io, bh, mine);
        else
            lin_rec_forward(&p, o, io, bh, mine);
    }
    return MN_OK;
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
    int nt = threads_for(d);
    float *work = cpu_workspace((size_t)nt * per);
    if (!work) return MN_ERR_NOMEM;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int bh = 0; bh < d->B * d->H; bh++) {
        MesaPair p = pair_of(d, bh, C);
        float *mine = work + (size_t)omp_get_thread_num() * per;
        if (form == MN_FORM_CHUNK)
            lin_chunk_backward(&p, o, io, bh, mine);
        else
            lin_rec_backward(&p, o, io, bh, mine);
    }
    return MN_OK;
}
