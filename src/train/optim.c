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
    // refused before allocating, as the model's own buffers are (model.h: model_check_batch)
    double need = 2.0 * (double)model->total * (double)be->elem_size(be, MEM_F32);
    size_t avail = be->mem_available ? be->mem_available(be) : SIZE_MAX;
    if (avail != SIZE_MAX && need > (double)avail)
        return mn_error(MN_ERR_NOMEM,
                        "optimizer: the AdamW moments of %zu parameters need about %.0f bytes (%.2f GiB), but %zu bytes "
                        "(%.2f GiB) are available on backend '%s'",
                        model->count, need, need / 1073741824.0, avail, (double)avail / 1073741824.0, be->name);
    o->m = be->alloc(be, model->total, MEM_F32);
    o->v = be->alloc(be, model->total, MEM_F32);
    o->decay = be->alloc(be, (model->total + 255) / 256, MEM_I32);
    o->sched = be->alloc(be, 2, MEM_F32);
    o->stats = be->alloc(be, 2, MEM_F64);
    int st = !o->m || !o->v || !o->decay || !o->sched || !o->stats ? MN_ERR_NOMEM : upload_decay_mask(o, model);
    if (st) adamw_free(o, model);
    return st;
}

void adamw_free(AdamW *o, const Model *model) {
    void **bufs[] = {&o->m, &o->v, &o->decay, &o->sched, &o->stats};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        if (*bufs[i]) model->be->free(model->be, *bufs[i]);
        *bufs[i] = NULL;
    }
}

int adamw_stage(AdamW *o, const Model *model, float lr) {
    float sched[2] = {lr, (float)(o->step + 1)};
    if (o->step + 1 > (1 << 24)) return mn_error(MN_ERR_ARG, "optimizer: step %d is past float's exact integers", o->step + 1);
    MN_TRY(model->be->upload_f32(model->be, o->sched, sched, 2, MEM_F32));
    o->step++;
    return MN_OK;
}

int adamw_queue(const AdamW *o, Model *model) {
    const Backend *be = model->be;
    MN_TRY(be->sumsq(be, o->stats, model->grads, model->total));
    AdamwOpts opts = {o->beta1, o->beta2, o->eps, o->weight_decay, o->clip};
    AdamwIo io = {model->params, model->grads, o->m, o->v, model->total, o->decay, o->sched, o->stats};
    return be->adamw(be, &opts, &io);
}

int adamw_result(AdamW *o, const Model *model, double *grad_norm) {
    double stats[2];
    MN_TRY(model->be->download(model->be, stats, o->stats, 2, MEM_F64));
    double norm = sqrt(stats[0]);
    if (grad_norm) *grad_norm = norm;
    if (stats[1] != 0) {
        o->step--;  // not taken
        return mn_error(MN_ERR_NUMERIC, "step %d: gradient norm is %g: refusing the update", o->step + 1, norm);
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
