#include "optim.h"

#include <math.h>
#include <stdint.h>

#include "core/common.h"

int adamw_init(AdamW *o, const Model *model) {
    const Backend *be = model->be;
    o->step = 0;
    o->m = o->v = NULL;
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
    if (!o->m || !o->v) {
        adamw_free(o, model);
        return MN_ERR_NOMEM;
    }
    return MN_OK;
}

void adamw_free(AdamW *o, const Model *model) {
    if (o->m) model->be->free(model->be, o->m);
    if (o->v) model->be->free(model->be, o->v);
    o->m = o->v = NULL;
}

int adamw_step(AdamW *o, Model *model, float lr, double *grad_norm) {
    const Backend *be = model->be;
    double ss;
    MN_TRY(be->sumsq(be, model->grads, model->total, &ss));
    double norm = sqrt(ss);
    if (grad_norm) *grad_norm = norm;
    if (!isfinite(norm)) return mn_error(MN_ERR_NUMERIC, "gradient norm is %g: refusing the update", norm);
    float gscale = o->clip > 0 && norm > o->clip ? (float)(o->clip / norm) : 1.0f;  // clipping, applied by adamw
    o->step++;
    size_t esize = be->elem_size(be, MEM_F32);
    for (int i = 0; i < model->nparams; i++) {
        const ParamSpec *s = &model->specs[i];
        void *m = (char *)o->m + s->offset * esize, *v = (char *)o->v + s->offset * esize;
        MN_TRY(be->adamw(be, model->p[i], model->g[i], m, v, s->numel, gscale, lr, o->beta1, o->beta2, o->eps,
                         s->decay ? o->weight_decay : 0, o->step));
    }
    return MN_OK;
}

float lr_at(const LrSchedule *s, int step) {
    if (step < s->warmup) return s->peak * (float)(step + 1) / (float)s->warmup;
    int span = s->total - s->warmup;
    if (span <= 0) return s->peak;
    double progress = fmin(1.0, (double)(step - s->warmup) / span);
    double cosine = 0.5 * (1 + cos(M_PI * progress));
    return (float)(s->peak * (s->final + (1 - s->final) * cosine));
}
