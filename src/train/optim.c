#include "optim.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "core/common.h"

// The decay mask of the slab (AdamwIo.decay): a bit per 8 elements, set over the tensors that
// decay (each starts at a multiple of 8 elements, so no 8 elements belong to two tensors).
static int upload_decay_mask(AdamW *o, const Model *model) {
    const Backend *be = model->be;
    size_t words = (model->total + 255) / 256;
    int32_t *mask = calloc(words ? words : 1, sizeof(int32_t));
    if (!mask) return mn_error(MN_ERR_NOMEM, "out of memory");
    for (int i = 0; i < model->nparams; i++) {
        const ParamSpec *s = &model->specs[i];
        if (!s->decay || !s->numel) continue;
        for (size_t g = s->offset / 8; g <= (s->offset + s->numel - 1) / 8; g++)
            mask[g / 32] = (int32_t)((uint32_t)mask[g / 32] | 1u << (g % 32));
    }
    int st = be->upload_i32(be, o->decay, mask, words);
    free(mask);
    return st;
}

int adamw_init(AdamW *o, const Model *model) {
    const Backend *be = model->be;
    o->step = 0;
    o->m = o->v = o->decay = o->sched = o->stats = NULL;
    o->hsched = NULL, o->hstats = NULL;
    // refused before allocating, as the model's own buffers are (model.h: model_check_batch)
    size_t n = (size_t)model->runs * model->total;
    double need = 2.0 * (double)n * (double)be->elem_size(be, MEM_F32);
    size_t avail = be->mem_available ? be->mem_available(be) : SIZE_MAX;
    if (avail != SIZE_MAX && need > (double)avail)
        return mn_error(MN_ERR_NOMEM,
                        "optimizer: the AdamW moments of %zu parameters need about %.0f bytes (%.2f GiB), but %zu bytes "
                        "(%.2f GiB) are available on backend '%s'",
                        model->count, need, need / 1073741824.0, avail, (double)avail / 1073741824.0, be->name);
    o->m = be->alloc(be, n, MEM_F32);
    o->v = be->alloc(be, n, MEM_F32);
    o->decay = be->alloc(be, (model->total + 255) / 256, MEM_I32);
    o->sched = be->alloc(be, 2 * (size_t)model->runs, MEM_F32);
    o->stats = be->alloc(be, 2 * (size_t)model->runs, MEM_F64);
    o->hsched = malloc(sizeof(float) * 2 * (size_t)model->runs);
    o->hstats = malloc(sizeof(double) * 2 * (size_t)model->runs);
    int st = !o->m || !o->v || !o->decay || !o->sched || !o->stats ? MN_ERR_NOMEM
             : !o->hsched || !o->hstats                             ? mn_error(MN_ERR_NOMEM, "out of memory")
                                                                    : upload_decay_mask(o, model);
    if (st) adamw_free(o, model);
    return st;
}

void adamw_free(AdamW *o, const Model *model) {
    void **bufs[] = {&o->m, &o->v, &o->decay, &o->sched, &o->stats};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        if (*bufs[i]) model->be->free(model->be, *bufs[i]);
        *bufs[i] = NULL;
    }
    free(o->hsched), free(o->hstats);
    o->hsched = NULL, o->hstats = NULL;
}

// The learning rates (lrs[r], or lr for every run where lrs is NULL) and the step to the backend.
static int stage(AdamW *o, const Model *model, const float *lrs, float lr) {
    if (o->step + 1 > (1 << 24)) return mn_error(MN_ERR_ARG, "optimizer: step %d is past float's exact integers", o->step + 1);
    for (int r = 0; r < model->runs; r++) o->hsched[2 * r] = lrs ? lrs[r] : lr, o->hsched[2 * r + 1] = (float)(o->step + 1);
    MN_TRY(model->be->upload_f32(model->be, o->sched, o->hsched, 2 * (size_t)model->runs, MEM_F32));
    o->step++;
    return MN_OK;
}

int adamw_stage(AdamW *o, const Model *model, float lr) { return stage(o, model, NULL, lr); }

int adamw_stage_runs(AdamW *o, const Model *model, const float *lrs) { return stage(o, model, lrs, 0); }

// `elems` elements of kind k past p.
static void *past(const Backend *be, void *p, size_t elems, MemKind k) { return (char *)p + elems * be->elem_size(be, k); }

int adamw_queue(const AdamW *o, Model *model) {
    const Backend *be = model->be;
    size_t n = model->total;
    for (int r = 0; r < model->runs; r++) {  // each run: its own norm, clip, learning rate and decay
        void *g = past(be, model->grads, r * n, MEM_F32), *stats = past(be, o->stats, 2 * (size_t)r, MEM_F64);
        MN_TRY(be->sumsq(be, stats, g, n));
        AdamwOpts opts = {o->beta1, o->beta2, o->eps, o->wds ? o->wds[r] : o->weight_decay, o->clip};
        AdamwIo io = {past(be, model->params, r * n, MEM_PARAM), g, past(be, o->m, r * n, MEM_F32),
                      past(be, o->v, r * n, MEM_F32), n, o->decay, past(be, o->sched, 2 * (size_t)r, MEM_F32), stats};
        MN_TRY(be->adamw(be, &opts, &io));
    }
    return MN_OK;
}

AdamW adamw_run_view(const AdamW *o, const Model *model, int r) {
    AdamW v = *o;
    const Backend *be = model->be;
    v.m = past(be, o->m, (size_t)r * model->total, MEM_F32);
    v.v = past(be, o->v, (size_t)r * model->total, MEM_F32);
    v.wds = NULL;
    v.weight_decay = o->wds ? o->wds[r] : o->weight_decay;
    return v;
}

int adamw_result_runs(AdamW *o, const Model *model, double *norms, int *refused) {
    MN_TRY(model->be->download(model->be, o->hstats, o->stats, 2 * (size_t)model->runs, MEM_F64));
    for (int r = 0; r < model->runs; r++) {
        if (norms) norms[r] = sqrt(o->hstats[2 * r]);
        refused[r] = o->hstats[2 * r + 1] != 0;
    }
    return MN_OK;
}

int adamw_result(AdamW *o, const Model *model, double *grad_norm) {
    MN_TRY(model->be->download(model->be, o->hstats, o->stats, 2 * (size_t)model->runs, MEM_F64));
    int bad = 0;  // the first run refused, or run 0
    while (bad < model->runs && o->hstats[2 * bad + 1] == 0) bad++;
    int refused = bad < model->runs;
    double norm = sqrt(o->hstats[2 * (refused ? bad : 0)]);
    if (grad_norm) *grad_norm = norm;
    if (refused) {
        o->step--;  // not taken
        return mn_error(MN_ERR_NUMERIC, "step %d: gradient norm is %g%s: refusing the update", o->step + 1, norm,
                        model->runs > 1 ? " in one of the runs" : "");
    }
    return MN_OK;
}

int adamw_step(AdamW *o, Model *model, float lr, double *grad_norm) {
    MN_TRY(adamw_stage(o, model, lr));
    int st = adamw_queue(o, model);
    if (st) {
        o->step--;
        return st;
    }
    return adamw_result(o, model, grad_norm);
}

float lr_at(const LrSchedule *s, int step) {
    if (step < s->warmup) return s->peak * (float)(step + 1) / (float)s->warmup;
    int span = s->total - s->warmup;
    if (span <= 0) return s->peak;
    double progress = fmin(1.0, (double)(step - s->warmup) / span);
    double cosine = 0.5 * (1 + cos(M_PI * progress));
    return (float)(s->peak * (s->final + (1 - s->final) * cosine));
}
