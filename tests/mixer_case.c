// Models and mixers on a backend for the mixer tests (see mixer_case.h).
#include "mixer_case.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "fd.h"
#include "test.h"
#include "train/optim.h"

void mc_tiny_sizes(ModelConfig *c, const char *mixer, int layers) {
    if (mixer) snprintf(c->mixer, sizeof c->mixer, "%s", mixer);
    c->vocab_size = 11;
    c->dim = 12;
    c->n_layers = layers;
    c->n_heads = 2;
    c->head_dim = 4;
    c->mlp_hidden = 10;
    c->seq_len = 8;
}

Model *mc_make(const ModelConfig *c, const Backend *be) {
    Model *m = NULL;
    if (model_create(&m, c, be)) die("%s: %s", c->mixer, mn_last_error());
    return m;
}

double mc_base_bias_lambda(const ParamSpec *s) {
    if (strstr(s->name, "bias") || strstr(s->name, "lambda")) return 0.5;
    return s->init == INIT_NORMAL ? 0 : 1;
}

void mc_randomise(Model *m, uint64_t seed, McBase base) {
    MnRng r;
    mn_rng_seed(&r, seed);
    double *v = xcalloc(m->total, sizeof(double));
    for (int i = 0; i < m->nparams; i++) {
        const ParamSpec *s = &m->specs[i];
        double b = base ? base(s) : s->init == INIT_NORMAL ? 0 : 1;
        for (size_t j = 0; j < s->numel; j++) v[s->offset + j] = b + 0.5 * mn_rng_normal(&r);
    }
    if (m->be->upload(m->be, m->params, v, m->total, MEM_PARAM)) die("%s", mn_last_error());
    free(v);
}

void mc_copy_params(Model *to, const Model *from) {
    double *v = xcalloc(from->total, sizeof(double));
    if (from->be->download(from->be, v, from->params, from->total, MEM_PARAM) ||
        to->be->upload(to->be, to->params, v, to->total, MEM_PARAM))
        die("%s", mn_last_error());
    free(v);
}

void mc_tokens(int32_t *tok, int32_t *tgt, size_t n, int V, uint64_t seed) {
    MnRng r;
    mn_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) {
        tok[i] = (int32_t)(mn_rng_u64(&r) % (uint64_t)V);
        if (tgt) tgt[i] = i % 5 == 3 ? -1 : (int32_t)(mn_rng_u64(&r) % (uint64_t)V);  // some without loss
    }
}

// ------------------------------------------------------------------- the layer alone

typedef struct {
    Mixer *mx;
    int B, T, D;
    double *u, *wy, *y;
} MixCtx;

// sum(y wy) of the mixer's forward
static double mix_loss(void *p) {
    MixCtx *c = p;
    if (c->mx->ops->forward(c->mx, c->y, c->u, c->B, c->T, 0)) die("%s", mn_last_error());
    double s = 0;
    for (size_t i = 0; i < (size_t)c->B * c->T * c->D; i++) s += c->y[i] * c->wy[i];
    return s;
}

void mc_check_layer_gradients(Model *m, const char *name, const char *du_what) {
    int B = 2, T = 7, D = m->cfg.dim;
    size_t N = (size_t)B * T;
    MixCtx c = {&m->mixers[0], B, T, D, rand_doubles(1, N * D, -1, 1), rand_doubles(2, N * D, -1, 1),
                xcalloc(N * D, 8)};
    mix_loss(&c);
    double *du = xcalloc(N * D, 8);
    model_zero_grad(m);
    CHECK(!c.mx->ops->backward(c.mx, du, c.wy), "%s: %s", name, mn_last_error());
    test_note("%s: %d tensors", name, m->blocks[0].count);
    fd_check(du_what, mix_loss, &c, c.u, du, N * D, 1e-6);
    for (int t = m->blocks[0].first; t < m->blocks[0].first + m->blocks[0].count; t++)  // past "model.layers.0."
        fd_check(m->specs[t].name + 15, mix_loss, &c, m->p[t], m->g[t], m->specs[t].numel, 1e-6);
    free(c.u); free(c.wy); free(c.y); free(du);
}

void mc_check_layer_cpu_vs_ref(Model *r, Model *c, int B, int T, uint64_t su, uint64_t sdy, const char *name,
                               int width) {
    size_t nd = (size_t)B * T * r->cfg.dim;
    double *u = rand_doubles(su, nd, -1, 1), *wy = rand_doubles(sdy, nd, -1, 1);
    double *ys[2] = {xcalloc(nd, 8), xcalloc(nd, 8)}, *dus[2] = {xcalloc(nd, 8), xcalloc(nd, 8)};
    Model *ms[2] = {r, c};
    for (int b = 0; b < 2; b++) {
        const Backend *be = ms[b]->be;
        void *ub = be->alloc(be, nd, MEM_ACT), *yb = be->alloc(be, nd, MEM_ACT), *dyb = be->alloc(be, nd, MEM_ACT),
             *dub = be->alloc(be, nd, MEM_ACT);
        be->upload(be, ub, u, nd, MEM_ACT);
        be->upload(be, dyb, wy, nd, MEM_ACT);
        Mixer *mx = &ms[b]->mixers[0];
        model_zero_grad(ms[b]);
        CHECK(!mx->ops->forward(mx, yb, ub, B, T, 0) && !mx->ops->backward(mx, dub, dyb), "%s %s: %s", name, be->name,
              mn_last_error());
        be->download(be, ys[b], yb, nd, MEM_ACT);
        be->download(be, dus[b], dub, nd, MEM_ACT);
        be->free(be, ub); be->free(be, yb); be->free(be, dyb); be->free(be, dub);
    }
    double ey = rel_err64(ys[1], ys[0], nd), edu = rel_err64(dus[1], dus[0], nd), eg = 0;
    double *gr = xcalloc(r->total, 8), *gc = xcalloc(c->total, 8);
    r->be->download(r->be, gr, r->grads, r->total, MEM_F32);
    c->be->download(c->be, gc, c->grads, c->total, MEM_F32);
    for (int t = r->blocks[0].first; t < r->blocks[0].first + r->blocks[0].count; t++) {
        double et = rel_err64(gc + r->specs[t].offset, gr + r->specs[t].offset, r->specs[t].numel);
        if (!(et <= 1e-5)) test_fail(__FILE__, __LINE__, "%s: %s: cpu vs ref rel err %.3g", name, r->specs[t].name, et);
        eg = fmax(eg, et);
    }
    test_note("%-*s cpu vs ref: y %.2e, du %.2e, parameter gradients (worst) %.2e", width, name, ey, edu, eg);
    char what[128];
    snprintf(what, sizeof what, "%s y", name);
    CHECK_REL(what, ey, 1e-5);
    snprintf(what, sizeof what, "%s du", name);
    CHECK_REL(what, edu, 1e-5);
    free(u); free(wy); free(ys[0]); free(ys[1]); free(dus[0]); free(dus[1]); free(gr); free(gc);
}

// ------------------------------------------------------------------- the whole model

typedef struct {
    Model *m;
    int B, T;
    int32_t *tok, *tgt;
} ModelCtx;

static double model_loss(void *p) {
    ModelCtx *c = p;
    double loss;
    if (model_forward(c->m, c->tok, c->tgt, c->B, c->T, 0, &loss)) die("%s", mn_last_error());
    return loss;
}

double mc_model_gradients(Model *m, const char *name, double *worst, const char **worst_name) {
    int B = 2, T = 6;
    int32_t tok[12], tgt[12];
    mc_tokens(tok, tgt, 12, m->cfg.vocab_size, 5);
    ModelCtx c = {m, B, T, tok, tgt};
    model_zero_grad(m);
    double loss;
    CHECK(!model_forward(m, tok, tgt, B, T, 1.0f, &loss) && !model_backward(m), "%s: %s", name, mn_last_error());
    double *num = xcalloc(m->total, 8);
    fd_gradient(model_loss, &c, m->params, m->total, 1e-6, num);
    double e = rel_err64(m->grads, num, m->total), w = 0;
    const char *wn = "";
    // tensor by tensor, so that a failure names its tensor
    for (int t = 0; t < m->nparams; t++) {
        double et = rel_err64((double *)m->g[t], num + m->specs[t].offset, m->specs[t].numel);
        if (!(et <= 1e-5)) test_fail(__FILE__, __LINE__, "%s: %s: rel err %.3g", name, m->specs[t].name, et);
        if (et > w) w = et, wn = m->specs[t].name;
    }
    if (worst) *worst = w;
    if (worst_name) *worst_name = wn;
    free(num);
    return e;
}

void mc_check_model_cpu_vs_ref(Model *r, Model *c, const char *name, int width) {
    int B = 3, T = 21;
    int32_t tok[63], tgt[63];
    mc_tokens(tok, tgt, 63, r->cfg.vocab_size, 11);
    double lr, lc;
    model_zero_grad(r);
    model_zero_grad(c);
    CHECK(!model_forward(r, tok, tgt, B, T, 1.0f / 63, &lr) && !model_backward(r), "%s: %s", name, mn_last_error());
    CHECK(!model_forward(c, tok, tgt, B, T, 1.0f / 63, &lc) && !model_backward(c), "%s: %s", name, mn_last_error());
    double *gr = xcalloc(r->total, 8), *gc = xcalloc(c->total, 8);
    r->be->download(r->be, gr, r->grads, r->total, MEM_F32);
    c->be->download(c->be, gc, c->grads, c->total, MEM_F32);
    double e = rel_err64(gc, gr, r->total);
    test_note("%-*s loss ref %.10f cpu %.10f; gradients rel err %.2e", width, name, lr / 63, lc / 63, e);
    CHECK(fabs(lr - lc) <= 1e-5 * fabs(lr), "%s: loss %g vs %g", name, lc, lr);
    CHECK_REL(name, e, 1e-4);
    free(gr); free(gc);
}

// ------------------------------------------------------------------- decoding

double mc_decode_vs_forward(Model *m, const int32_t *tok, int B, int T, int T1, int mid_at, int mid_n, float cap,
                            const char *name, int *argmax_diff) {
    const Backend *be = m->be;
    int V = m->cfg.vocab_size;
    CHECK(!model_forward(m, tok, NULL, B, T, 0, NULL), "%s", mn_last_error());
    float *full = xcalloc((size_t)B * T * V, 4), *step = xcalloc((size_t)B * T * V, 4);
    int32_t *buf = xcalloc((size_t)B * T, sizeof(int32_t));
    be->download_f32(be, full, m->logits, (size_t)B * T * V, MEM_ACT);
    if (cap > 0)
        for (size_t i = 0; i < (size_t)B * T * V; i++) full[i] = cap * tanhf(full[i] / cap);
    CHECK(!model_reset_state(m, B), "%s", mn_last_error());
    double worst = 0;
    int diff = 0;
    for (int t0 = 0; t0 < T;) {
        int n = t0 == 0 ? T1 : mid_n && t0 == mid_at ? mid_n : 1;
        for (int b = 0; b < B; b++) memcpy(buf + b * n, tok + b * T + t0, sizeof(int32_t) * n);
        CHECK(!model_decode(m, buf, B, n, step), "%s: %s", name, mn_last_error());
        t0 += n;
        for (int b = 0; b < B; b++) {
            const float *want = full + ((size_t)b * T + t0 - 1) * V, *got = step + (size_t)b * V;
            worst = fmax(worst, rel_err_ff(got, want, V));
            int ag = 0, aw = 0;
            for (int i = 1; i < V; i++) {
                if (got[i] > got[ag]) ag = i;
                if (want[i] > want[aw]) aw = i;
            }
            diff += ag != aw;
        }
    }
    if (argmax_diff) *argmax_diff = diff;
    free(full); free(step); free(buf);
    return worst;
}

// ------------------------------------------------------------------- a tiny batch that a model learns

void mc_tiny_batch(int32_t tok[64], int32_t tgt[64]) {
    MnRng r;
    mn_rng_seed(&r, 9);
    for (int j = 0; j < 64; j++) tok[j] = (int32_t)(mn_rng_u64(&r) % 64);
    for (int j = 0; j < 64; j++) tgt[j] = j % 32 == 31 ? (int32_t)(mn_rng_u64(&r) % 64) : tok[j + 1];
}

void mc_train_tiny(Model *m, const char *name, int steps, double *first, double *last) {
    AdamW o = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0, .clip = 1};
    adamw_init(&o, m);
    int32_t tok[64], tgt[64];
    mc_tiny_batch(tok, tgt);
    *first = *last = 0;
    for (int step = 0; step < steps; step++) {
        double loss;
        model_zero_grad(m);
        CHECK(!model_forward(m, tok, tgt, 2, 32, 1.0f / 64, &loss) && !model_backward(m), "%s: %s", name,
              mn_last_error());
        adamw_step(&o, m, 1e-2f, NULL);
        if (step == 0) *first = loss / 64;
        *last = loss / 64;
    }
    adamw_free(&o, m);
}

void mc_check_tiny_trains(Model *m, const char *name, int width) {
    double first, last;
    mc_train_tiny(m, name, 20, &first, &last);
    test_note("%-*s loss %.3f -> %.3f in 20 steps", width, name, first, last);
    CHECK(isfinite(last) && last < first - 1.0, "%s: the loss did not fall: %.3f -> %.3f", name, first, last);
}
