#include "norm.h"

#include <string.h>

#include "core/common.h"

NormKind norm_kind(const ModelConfig *c) { return !strcmp(c->norm, "layernorm") ? NORM_LAYER : NORM_RMS; }

float norm_file_offset(const ModelConfig *c) { return !strcmp(c->arch, "recurrent_gemma") ? 1.0f : 0.0f; }

// The mean's place after the N reciprocal deviations.
static void *mean_of(const Backend *be, const void *stats, int N) {
    return (char *)stats + (size_t)N * be->elem_size(be, MEM_F32);
}

int norm_fwd(const Backend *be, NormKind k, void *y, void *stats, const void *x, const void *w, int N, int D,
             float eps) {
    if (k == NORM_RMS) return be->rmsnorm_fwd(be, y, stats, x, w, N, D, D, D, eps);
    if (!be->layernorm_fwd) return mn_error(MN_ERR_UNSUPPORTED, "the %s backend has no LayerNorm yet", be->name);
    return be->layernorm_fwd(be, y, mean_of(be, stats, N), stats, x, w, N, D, D, D, eps);
}

int norm_bwd(const Backend *be, NormKind k, void *dx, void *dw, const void *dy, const void *x, const void *w,
             const void *stats, int N, int D, int accum) {
    if (k == NORM_RMS) return be->rmsnorm_bwd(be, dx, dw, dy, x, w, stats, N, D, D, D, accum);
    return be->layernorm_bwd(be, dx, dw, dy, x, w, mean_of(be, stats, N), stats, N, D, D, D, accum);
}
