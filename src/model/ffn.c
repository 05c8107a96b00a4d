// The feed-forward half of a block (ffn.h).
#include "ffn.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/common.h"
#include "model/names.h"

// One tensor of the block, named prefix + name; its index, or -1 (and an error) when the table is full.
static int add(ParamSpec *s, int *n, int max, const char *prefix, const char *name, int ndim, int64_t a, int64_t b,
               InitKind init, double value, int decay) {
    char full[96];
    int64_t shape[2] = {a, b};
    snprintf(full, sizeof full, "%s%s", prefix, name);
    int i = param_add(s, n, max, full, ndim, shape, init, value, decay);
    if (i < 0) mn_error(MN_ERR_ARG, "too many parameter tensors");
    return i;
}

int ffn_declare(const ModelConfig *c, const BlockShape *b, const char *prefix, ParamSpec *s, int *n, int max, Ffn *f) {
    memset(f, 0, sizeof *f);
    f->kind = b->ffn;
    f->norm = f->gate = f->up = f->down = f->gate_b = f->up_b = f->down_b = -1;
    if (f->kind == FFN_NONE) return MN_OK;
    f->bias = b->ffn_bias;
    f->norm_kind = norm_kind(c);
    f->F = ffn_width(c, b);
    if (f->F < 1) return mn_error(MN_ERR_ARG, "the feed-forward width is %d, expected at least 1", f->F);
    int64_t D = c->dim, F = f->F;
    double resid = pow((double)c->n_layers, -c->resid_scale);
    const ArchNames *an = arch_names(c);
    char w[96], bn[96];
    snprintf(w, sizeof w, "%s.weight", an->ffn_norm);
    f->norm = add(s, n, max, prefix, w, 1, D, 0, INIT_CONST, 1, 0);
    snprintf(w, sizeof w, "%s.weight", an->ffn_gate);
    snprintf(bn, sizeof bn, "%s.bias", an->ffn_gate);
    f->gate = add(s, n, max, prefix, w, 2, F, D, INIT_NORMAL, 1 / sqrt((double)D), 1);
    if (f->bias) f->gate_b = add(s, n, max, prefix, bn, 1, F, 0, INIT_CONST, 0, 0);
    snprintf(w, sizeof w, "%s.weight", an->ffn_up);
    snprintf(bn, sizeof bn, "%s.bias", an->ffn_up);
    f->up = add(s, n, max, prefix, w, 2, F, D, INIT_NORMAL, 1 / sqrt((double)D), 1);
    if (f->bias) f->up_b = add(s, n, max, prefix, bn, 1, F, 0, INIT_CONST, 0, 0);
    snprintf(w, sizeof w, "%s.weight", an->ffn_down);
    snprintf(bn, sizeof bn, "%s.bias", an->ffn_down);
    f->down = add(s, n, max, prefix, w, 2, D, F, INIT_NORMAL, resid / sqrt((double)F), 1);
    if (f->bias) f->down_b = add(s, n, max, prefix, bn, 1, D, 0, INIT_CONST, 0, 0);
    if (f->norm < 0 || f->gate < 0 || f->up < 0 || f->down < 0 || (f->bias && (f->gate_b < 0 || f->up_b < 0 || f->down_b < 0)))
        return MN_ERR_ARG;
    return MN_OK;
}

int ffn_width(const ModelConfig *c, const BlockShape *b) {
    return b->ffn == FFN_NONE ? 0 : b->ffn_hidden ? b->ffn_hidden(c) : c->mlp_hidden;
}

static const void *param_or_null(void *const *p, int i) { return i < 0 ? NULL : p[i]; }
static void *grad_or_null(void *const *g, int i) { return i < 0 ? NULL : g[i]; }

int ffn_forward(const Backend *be, const Ffn *f, void *const *p, const FfnActs *a, const FfnShared *s, const void *u,
                void *out, int N, int D, float eps) {
    size_t nd = (size_t)N * D, nf = (size_t)N * f->F;
    if (f->kind == FFN_NONE) {
        be->copy(be, out, u, nd, MEM_ACT);
        return MN_OK;
    }
    MN_TRY(norm_fwd(be, f->norm_kind, s->v, a->rstd, u, p[f->norm], N, D, eps));
    MN_TRY(be->linear_fwd(be, a->gate, s->v, p[f->gate], param_or_null(p, f->gate_b), N, D, f->F));
    MN_TRY(be->linear_fwd(be, a->up, s->v, p[f->up], param_or_null(p, f->up_b), N, D, f->F));
    if (f->kind == FFN_GEGLU) MN_TRY(be->geglu_fwd(be, a->act, a->gate, a->up, nf));
    else if (f->kind == FFN_GEGLU_TANH) MN_TRY(be->geglu_tanh_fwd(be, a->act, a->gate, a->up, nf));
    else MN_TRY(be->swiglu_fwd(be, a->act, a->gate, a->up, nf));
    MN_TRY(be->linear_fwd(be, out, a->act, p[f->down], param_or_null(p, f->down_b), N, f->F, D));
    return be->add(be, out, u, nd);
}

int ffn_backward(const Backend *be, const Ffn *f, void *const *p, void *const *g, const FfnActs *a, const FfnShared *s,
                 const void *u, void *dx, int N, int D, float eps) {
    if (f->kind == FFN_NONE) return MN_OK;  // x' = u: the gradient passes as it is
    size_t nf = (size_t)N * f->F;
    // the normalised input again (one buffer serves every block: cheap to recompute, [N, D] a
    // block to keep); dx flows to u directly and through the FFN
    MN_TRY(norm_fwd(be, f->norm_kind, s->v, a->rstd, u, p[f->norm], N, D, eps));
    MN_TRY(be->linear_bwd(be, s->dact, g[f->down], grad_or_null(g, f->down_b), dx, a->act, p[f->down], N, f->F, D, 0));
    if (f->kind == FFN_GEGLU) MN_TRY(be->geglu_bwd(be, s->dgate, s->dup, s->dact, a->gate, a->up, nf));
    else if (f->kind == FFN_GEGLU_TANH) MN_TRY(be->geglu_tanh_bwd(be, s->dgate, s->dup, s->dact, a->gate, a->up, nf));
    else MN_TRY(be->swiglu_bwd(be, s->dgate, s->dup, s->dact, a->gate, a->up, nf));
    MN_TRY(be->linear_bwd(be, s->dv, g[f->gate], grad_or_null(g, f->gate_b), s->dgate, s->v, p[f->gate], N, D, f->F, 0));
    MN_TRY(be->linear_bwd(be, s->dv, g[f->up], grad_or_null(g, f->up_b), s->dup, s->v, p[f->up], N, D, f->F, 1));
    return norm_bwd(be, f->norm_kind, dx, g[f->norm], s->dv, u, p[f->norm], a->rstd, N, D, 1);
}
