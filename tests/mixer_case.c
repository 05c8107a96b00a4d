// Models and mixers on a backend for the mixer tests (see mixer_case.h).
#include "mixer_case.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "core/common.h"
#include "fd.h"
#include "mixers/mixer.h"
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
    if (s->init == INIT_A_LOG) return -1.2;
    if (s->init == INIT_DT_BIAS) return 0;
    // weights that start at zero (xLSTM's gate projections, the sLSTM's recurrent kernel) about 0,
    // as trained ones are: about 1 each, a gate would sum its hundreds of inputs into saturation
    if (s->init == INIT_CONST && s->init_value == 0 && s->ndim >= 2) return 0;
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
    // the loss's scale for the differences' rounding floor (fd_noise_floor): its terms' magnitudes
    double scale = 0;
    for (size_t i = 0; i < N * D; i++) scale += fabs(c.y[i] * c.wy[i]);
    double *du = xcalloc(N * D, 8);
    model_zero_grad(m);
    CHECK(!c.mx->ops->backward(c.mx, du, c.wy), "%s: %s", name, mn_last_error());
    test_note("%s: %d tensors", name, m->blocks[0].count);
    char what[160];  // the case's name in every line, so that a failure names it
    snprintf(what, sizeof what, "%s: %s", name, du_what);
    fd_check(what, mix_loss, &c, c.u, du, N * D, 1e-6);
    for (int t = m->blocks[0].first; t < m->blocks[0].first + m->blocks[0].count; t++) {  // past "model.layers.0."
        snprintf(what, sizeof what, "%s: %s", name, m->specs[t].name + 15);
        // Where the rounding of the differences would exceed the tolerance (a gradient tiny against
        // the loss: mLSTM's input-gate bias, which the output's normalisation nearly cancels), a
        // step of 1e-4 cuts it 100-fold; the layers are smooth, so the step's own error (h^2) stays
        // near 1e-8. The tolerance is then the larger of 1e-6 and that step's floor.
        double h = 1e-6, floor = fd_noise_floor(m->g[t], m->specs[t].numel, scale, h);
        if (floor > 1e-6) {
            h = 1e-4;
            floor = fd_noise_floor(m->g[t], m->specs[t].numel, scale, h);
            test_note("%s: step %g (the differences' rounding floor %.1e at 1e-6)", what, h, floor * 100);
        }
        fd_check_step(what, mix_loss, &c, m->p[t], m->g[t], m->specs[t].numel, fmax(1e-6, floor), h);
    }
    free(c.u); free(c.wy); free(c.y); free(du);
}

void mc_layer_run(Model *m, int layer, const double *u, const double *dy, int B, int T, double *y, double *du,
                  double *grads) {
    const Backend *be = m->be;
    size_t nd = (size_t)B * T * m->cfg.dim;
    void *ub = be->alloc(be, nd, MEM_ACT), *yb = be->alloc(be, nd, MEM_ACT), *dyb = be->alloc(be, nd, MEM_ACT),
         *dub = be->alloc(be, nd, MEM_ACT);
    if (!ub || !yb || !dyb || !dub) die("%s", mn_last_error());
    be->upload(be, ub, u, nd, MEM_ACT);
    be->upload(be, dyb, dy, nd, MEM_ACT);
    Mixer *mx = &m->mixers[layer];
    model_zero_grad(m);
    CHECK(!mx->ops->forward(mx, yb, ub, B, T, 0) && !mx->ops->backward(mx, dub, dyb), "%s on %s: %s", mx->ops->name,
          be->name, mn_last_error());
    if (y) be->download(be, y, yb, nd, MEM_ACT);
    if (du) be->download(be, du, dub, nd, MEM_ACT);
    if (grads) be->download(be, grads, m->grads, m->total, MEM_F32);
    be->free(be, ub); be->free(be, yb); be->free(be, dyb); be->free(be, dub);
}

double mc_layer_steps_vs_forward(Model *m, int B, int T, uint64_t seed) {
    const Backend *be = m->be;
    Mixer *mx = &m->mixers[0];
    int D = m->cfg.dim;
    size_t nd = (size_t)B * T * D, n1 = (size_t)B * D;
    double *u = rand_doubles(seed, nd, -1, 1), *y = xcalloc(nd, 8), *ys = xcalloc(nd, 8), *ut = xcalloc(n1, 8),
           *yt = xcalloc(n1, 8);
    void *ub = be->alloc(be, nd, MEM_ACT), *yb = be->alloc(be, nd, MEM_ACT);
    if (!ub || !yb) die("%s", mn_last_error());
    be->upload(be, ub, u, nd, MEM_ACT);
    CHECK(!mx->ops->forward(mx, yb, ub, B, T, 0), "%s: %s", mx->ops->name, mn_last_error());
    be->download(be, y, yb, nd, MEM_ACT);
    CHECK(!mx->ops->reset_state(mx, B), "%s: %s", mx->ops->name, mn_last_error());
    for (int t = 0; t < T; t++) {
        for (int b = 0; b < B; b++) memcpy(ut + (size_t)b * D, u + ((size_t)b * T + t) * D, sizeof(double) * D);
        be->upload(be, ub, ut, n1, MEM_ACT);
        CHECK(!mx->ops->forward(mx, yb, ub, B, 1, 1), "%s step %d: %s", mx->ops->name, t, mn_last_error());
        be->download(be, yt, yb, n1, MEM_ACT);
        for (int b = 0; b < B; b++) memcpy(ys + ((size_t)b * T + t) * D, yt + (size_t)b * D, sizeof(double) * D);
    }
    double e = rel_err64(ys, y, nd);
    be->free(be, ub);
    be->free(be, yb);
    free(u); free(y); free(ys); free(ut); free(yt);
    return e;
}

// x (.) (1 + 2^-24 e), e ~ N(0, 1) per element: a float32 rounding's worth of change.
static void nudge(double *x, size_t n, uint64_t seed) {
    MnRng r;
    mn_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) x[i] *= 1 + 0x1p-24 * mn_rng_normal(&r);
}

// The layer's own sensitivity to float32 rounding: how much the reference's output, input gradient
// and each parameter gradient move when its input and weights are nudged by a rounding's worth
// (nudge). A float32 computation cannot agree with float64 better than that; ill-conditioned
// quantities (an input gate's bias gradient, a sum of terms that nearly cancel) move by far more
// than 6e-8. Into ey, edu, eg[nparams].
static void layer_sensitivity(Model *r, int B, int T, const double *u, const double *wy, const double *y0,
                              const double *du0, const double *g0, double *ey, double *edu, double *eg) {
    size_t nd = (size_t)B * T * r->cfg.dim;
    double *un = xcalloc(nd, 8), *p = xcalloc(r->total, 8), *pn = xcalloc(r->total, 8);
    double *y = xcalloc(nd, 8), *du = xcalloc(nd, 8), *g = xcalloc(r->total, 8);
    memcpy(un, u, nd * 8);
    nudge(un, nd, 77);
    r->be->download(r->be, p, r->params, r->total, MEM_PARAM);
    memcpy(pn, p, r->total * 8);
    nudge(pn, r->total, 78);
    r->be->upload(r->be, r->params, pn, r->total, MEM_PARAM);
    mc_layer_run(r, 0, un, wy, B, T, y, du, g);
    r->be->upload(r->be, r->params, p, r->total, MEM_PARAM);
    *ey = rel_err64(y, y0, nd);
    *edu = rel_err64(du, du0, nd);
    for (int t = 0; t < r->nparams; t++)
        eg[t] = rel_err64(g + r->specs[t].offset, g0 + r->specs[t].offset, r->specs[t].numel);
    free(un); free(p); free(pn); free(y); free(du); free(g);
}

void mc_check_layer_cpu_vs_ref(Model *r, Model *c, int B, int T, uint64_t su, uint64_t sdy, double tol_bwd,
                               const char *name, int width) {
    size_t nd = (size_t)B * T * r->cfg.dim;
    double *u = rand_doubles(su, nd, -1, 1), *wy = rand_doubles(sdy, nd, -1, 1);
    double *ys[2] = {xcalloc(nd, 8), xcalloc(nd, 8)}, *dus[2] = {xcalloc(nd, 8), xcalloc(nd, 8)};
    double *gr = xcalloc(r->total, 8), *gc = xcalloc(c->total, 8), *sens = xcalloc((size_t)r->nparams, 8);
    mc_layer_run(r, 0, u, wy, B, T, ys[0], dus[0], gr);
    mc_layer_run(c, 0, u, wy, B, T, ys[1], dus[1], gc);
    double sy, sdu;
    layer_sensitivity(r, B, T, u, wy, ys[0], dus[0], gr, &sy, &sdu, sens);
    // the tolerance: the fixed one, or 10 times the layer's own sensitivity where that is larger
    // (float32 rounds every op of the layer, not once: 10 covers the ~15 ops measured, and a wrong
    // term is still off by 1e-2 and more)
    double ey = rel_err64(ys[1], ys[0], nd), edu = rel_err64(dus[1], dus[0], nd), eg = 0, worst_ratio = 0;
    const char *worst_name = "";
    // A tensor's error is taken against its gradient's norm, or against 1% of the layer's largest
    // tensor gradient norm where its own is smaller: a gradient that the layer structurally cancels
    // (mLSTM's input-gate bias: shifting every input gate changes the output only through the
    // normaliser's floor and eps, so its gradient is a sum of terms that cancel to ~1e-5 of their
    // size) is resolved by float32 only to its rounding of the terms; rounding the core's float32
    // inputs alone moves it by 24 to 250 times the sensitivity measured above (float64 core on the
    // CPU layer's inputs), while its terms are as accurate as every other tensor's.
    double gmax = 0;
    for (int t = r->blocks[0].first; t < r->blocks[0].first + r->blocks[0].count; t++) {
        double g = 0;
        for (size_t i = 0; i < r->specs[t].numel; i++) g += gr[r->specs[t].offset + i] * gr[r->specs[t].offset + i];
        gmax = fmax(gmax, sqrt(g));
    }
    for (int t = r->blocks[0].first; t < r->blocks[0].first + r->blocks[0].count; t++) {
        double d = 0, g = 0;
        for (size_t i = 0; i < r->specs[t].numel; i++) {
            double a = gc[r->specs[t].offset + i], b = gr[r->specs[t].offset + i];
            d += (a - b) * (a - b);
            g += b * b;
        }
        double et = sqrt(d) / fmax(fmax(sqrt(g), 1e-2 * gmax), 1e-300);
        double tol = fmax(tol_bwd, 10 * sens[t]);
        if (!(et <= tol))
            test_fail(__FILE__, __LINE__, "%s: %s: cpu vs ref rel err %.3g > %.3g (the layer's sensitivity %.2g)", name,
                      r->specs[t].name, et, tol, sens[t]);
        eg = fmax(eg, et);
        if (sens[t] > 0 && et / sens[t] > worst_ratio) {  // (a bias after the layer's last product: no sensitivity)
            worst_ratio = et / fmax(sens[t], 1e-300);
            worst_name = r->specs[t].name + 15;  // past "model.layers.0."
        }
    }
    test_note("%-*s cpu vs ref: y %.2e, du %.2e, parameter gradients (worst) %.2e; sensitivity y %.1e du %.1e; "
              "worst gradient/sensitivity %.1f (%s)", width, name, ey, edu, eg, sy, sdu, worst_ratio, worst_name);
    char what[128];
    snprintf(what, sizeof what, "%s y", name);
    CHECK_REL(what, ey, fmax(1e-5, 10 * sy));
    snprintf(what, sizeof what, "%s du", name);
    CHECK_REL(what, edu, fmax(tol_bwd, 10 * sdu));
    free(u); free(wy); free(ys[0]); free(ys[1]); free(dus[0]); free(dus[1]); free(gr); free(gc); free(sens);
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

double mc_model_run(Model *m, const int32_t *tok, const int32_t *tgt, int B, int T, double *grads) {
    double loss = 0;
    model_zero_grad(m);
    CHECK(!model_forward(m, tok, tgt, B, T, 1.0f / ((float)B * T), &loss) && !model_backward(m), "%s on %s: %s",
          m->cfg.mixer, m->be->name, mn_last_error());
    if (grads) m->be->download(m->be, grads, m->grads, m->total, MEM_F32);
    return loss;
}

void mc_check_model_cpu_vs_ref(Model *r, Model *c, const char *name, int width) {
    int B = 3, T = 21;
    int32_t tok[63], tgt[63];
    mc_tokens(tok, tgt, 63, r->cfg.vocab_size, 11);
    double *gr = xcalloc(r->total, 8), *gc = xcalloc(c->total, 8);
    double lr = mc_model_run(r, tok, tgt, B, T, gr), lc = mc_model_run(c, tok, tgt, B, T, gc);
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
    CHECK(!model_forward(m, tok, NULL, B, T, 0, NULL), "%s: %s", name, mn_last_error());
    float *full = xcalloc((size_t)B * T * V, 4), *step = xcalloc((size_t)B * T * V, 4);
    int32_t *buf = xcalloc((size_t)B * T, sizeof(int32_t));
    be->download_f32(be, full, m->logits, (size_t)B * T * V, MEM_ACT);
    if (cap > 0)
        for (size_t i = 0; i < (size_t)B * T * V; i++) full[i] = cap * tanhf(full[i] / cap);
    CHECK(!model_reset_state(m, B), "%s: %s", name, mn_last_error());
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

// ------------------------------------------------------------------- core families

const unsigned mc_fam[MC_FAMS] = {MC_FAM_MESA, MC_FAM_LIN, MC_FAM_ATTN, MC_FAM_MLSTM, MC_FAM_SLSTM, MC_FAM_SCAN};
const char *const mc_fam_name[MC_FAMS] = {"mesa", "lin", "attn", "mlstm", "slstm", "scan"};

static unsigned fam_seen;  // the families called since it was zeroed (the wrappers below)

static int fam_mesa_fwd(const Backend *be, const MnSeqDims *d, const MnSolver *s, const MnMesaFwd *io) {
    fam_seen |= MC_FAM_MESA;
    return backend_cpu()->mesa->fwd(be, d, s, io);
}

static int fam_lin_fwd(const Backend *be, const MnSeqDims *d, const MnLinOpts *o, const MnLinFwd *io) {
    fam_seen |= MC_FAM_LIN;
    return backend_cpu()->lin->fwd(be, d, o, io);
}

static int fam_attn_fwd(const Backend *be, const AttnDims *d, const AttnFwd *io) {
    fam_seen |= MC_FAM_ATTN;
    return backend_cpu()->attn->fwd(be, d, io);
}

static int fam_mlstm_fwd(const Backend *be, const MnSeqDims *d, const MlstmOpts *o, const MlstmFwd *io) {
    fam_seen |= MC_FAM_MLSTM;
    return backend_cpu()->mlstm->fwd(be, d, o, io);
}

static int fam_slstm_fwd(const Backend *be, const SlstmDims *d, const SlstmFwd *io) {
    fam_seen |= MC_FAM_SLSTM;
    return backend_cpu()->slstm->fwd(be, d, io);
}

static int fam_scan_fwd(const Backend *be, const ScanDims *d, const ScanFwd *io) {
    fam_seen |= MC_FAM_SCAN;
    return backend_cpu()->scan->fwd(be, d, io);
}

unsigned mc_families(const ModelConfig *c, unsigned *per_block) {
    Backend w = *backend_cpu();
    MesaOps mesa = *w.mesa;
    LinOps lin = *w.lin;
    AttnOps attn = *w.attn;
    mesa.fwd = fam_mesa_fwd;
    lin.fwd = fam_lin_fwd;
    attn.fwd = fam_attn_fwd;
    w.mesa = &mesa, w.lin = &lin, w.attn = &attn;
    MlstmOps mlstm;
    SlstmOps slstm;
    if (w.mlstm) {
        mlstm = *w.mlstm;
        mlstm.fwd = fam_mlstm_fwd;
        w.mlstm = &mlstm;
    }
    if (w.slstm) {
        slstm = *w.slstm;
        slstm.fwd = fam_slstm_fwd;
        w.slstm = &slstm;
    }
    ScanOps scan;
    if (w.scan) {
        scan = *w.scan;
        scan.fwd = fam_scan_fwd;
        w.scan = &scan;
    }
    Model *m = mc_make(c, &w);
    int n = mc_pattern_len(c->mixer), B = 1, T = 4;
    size_t nd = (size_t)B * T * c->dim;
    double *u = rand_doubles(3, nd, -1, 1);
    void *ub = w.alloc(&w, nd, MEM_ACT), *yb = w.alloc(&w, nd, MEM_ACT);
    if (!ub || !yb) die("%s", mn_last_error());
    w.upload(&w, ub, u, nd, MEM_ACT);
    unsigned all = 0;
    for (int l = 0; l < n; l++) {
        Mixer *mx = &m->mixers[l];
        fam_seen = 0;
        if (mx->ops->forward(mx, yb, ub, B, T, 0)) die("%s: %s", mx->ops->name, mn_last_error());
        if (per_block) per_block[l] = fam_seen;
        all |= fam_seen;
    }
    w.free(&w, ub);
    w.free(&w, yb);
    free(u);
    model_free(m);
    return all;
}

Backend mc_without(const Backend *be, unsigned fams, const char *name) {
    Backend b = *be;
    b.name = name;
    if (fams & MC_FAM_MESA) b.mesa = NULL;
    if (fams & MC_FAM_LIN) b.lin = NULL;
    if (fams & MC_FAM_ATTN) b.attn = NULL;
    if (fams & MC_FAM_MLSTM) b.mlstm = NULL;
    if (fams & MC_FAM_SLSTM) b.slstm = NULL;
    if (fams & MC_FAM_SCAN) b.scan = NULL;
    return b;
}

unsigned mc_lacking(const Backend *be) {
    unsigned f = 0;
    if (!be->mesa || !be->mesa->fwd || !be->mesa->bwd) f |= MC_FAM_MESA;
    if (!be->lin || !be->lin->fwd || !be->lin->bwd) f |= MC_FAM_LIN;
    if (!be->attn || !be->attn->fwd || !be->attn->bwd || !be->attn->decode || !be->attn->rope) f |= MC_FAM_ATTN;
    if (!be->mlstm || !be->mlstm->fwd || !be->mlstm->bwd || !be->mlstm->gates_fwd || !be->mlstm->gates_bwd)
        f |= MC_FAM_MLSTM;
    if (!be->slstm || !be->slstm->fwd || !be->slstm->bwd) f |= MC_FAM_SLSTM;
    if (!be->scan || !be->scan->fwd || !be->scan->bwd) f |= MC_FAM_SCAN;
    return f;
}

// ------------------------------------------------------------------- memory held

enum { MAXLIVE = 8192 };
static struct {
    void *p;
    size_t bytes;
} live[MAXLIVE];
static size_t live_bytes;

static void *count_alloc(const Backend *be, size_t n, MemKind kind) {
    const Backend *cpu = backend_cpu();
    void *p = cpu->alloc(cpu, n, kind);
    if (!p) return p;
    for (int i = 0; i < MAXLIVE; i++)
        if (!live[i].p) {
            live[i].p = p;
            live[i].bytes = n * cpu->elem_size(cpu, kind);
            live_bytes += live[i].bytes;
            return p;
        }
    die("mc_counted_cpu: more than %d buffers held", MAXLIVE);
}

static void count_free(const Backend *be, void *p) {
    for (int i = 0; i < MAXLIVE; i++)
        if (live[i].p == p) {
            live_bytes -= live[i].bytes;
            live[i].p = NULL;
            break;
        }
    backend_cpu()->free(backend_cpu(), p);
}

Backend mc_counted_cpu(void) {
    memset(live, 0, sizeof live);
    live_bytes = 0;
    Backend b = *backend_cpu();
    b.alloc = count_alloc;
    b.free = count_free;
    return b;
}

size_t mc_counted_bytes(void) { return live_bytes; }

// ------------------------------------------------------------------- the conformance cases

// The variants that matter: each switch a mixer reads, on and off somewhere, and the settings its
// family's tests single out. A new mixer with no row still runs as a case of its preset's settings.
static const McCase rows[] = {
    // Mesa: a tight forget-gate bound and per-head o_norm; fla's architecture, the output gate and
    // the shared o_norm without a bound
    {"mesa", .bound = 3},
    {"mesa", .gate = 1, .onorm = 1, .fla = 1},
    // the linear-attention family in the paper's shared parameterisation
    {"mamba2"},
    {"gla", .gate = 1, .onorm = 1},
    {"deltanet"},
    {"deltanet", .gate = 1, .neg = 1},
    {"gdn"},
    {"gdn", .gate = 1, .onorm = 1, .neg = 1},
    // fla's layers: GatedDeltaNet's defaults (gate, shared norm, expand_v 2), and without the gate,
    // per-head norm, negative eigenvalues, expand_v 1.5; DeltaNet's defaults, and with all of them
    {"gdn-paper", .gate = 1, .onorm = 1, .expand_v = 2, .fla = 1},
    {"gdn-paper", .neg = 1, .expand_v = 1.5, .fla = 1},
    {"deltanet-paper", .onorm = 1, .fla = 1},
    {"deltanet-paper", .gate = 1, .onorm = 1, .neg = 1, .expand_v = 2, .fla = 1},
    // attention: grouped key/value heads; windows shorter than the sequences (the ring buffer
    // wraps) and one longer than the decoding checks' first prefill
    {"mha"},
    {"mha", .kv = 1},
    {"swa", .window = 3},
    {"swa", .kv = 1, .window = 5},
    {"swa", .window = 13},
    // mLSTM: the paper's parameterisation with and without the output gate; the xLSTM paper's blocks
    {"mlstm"},
    {"mlstm", .gate = 1, .onorm = 1},
    // Longhorn's exact form (raw keys, the implicit step) with the output gate and shared norm; its
    // diagonal block (longhorn) runs as its defaults' case
    {"longhorn-exact", .gate = 1, .onorm = 1},
    // patterns: the blocks of different mixers meet in one model
    {"gdn,mesa", .gate = 1, .bound = 3},
    {"mesa,gla,deltanet", .onorm = 1, .neg = 1},
    {"mha,swa", .kv = 1, .window = 4},
    {"gdn,mha", .neg = 1},
    {"gdn-paper,swa", .gate = 1, .expand_v = 2, .window = 4, .fla = 1},
    {"mlstm-block,slstm-block"},
    {"mlstm,mesa", .gate = 1},
    // Hawk-MesaNet, alternating; Griffin (two RG-LRU blocks, then local attention)
    {"hawk,mesa"},
    {"hawk,hawk,swa", .window = 3},
    // attention as RecurrentGemma has it: RoPE on the first half of each head, a bias on W_o
    {"mha,swa", .kv = 1, .window = 5, .partial = 1},
    {"longhorn,longhorn-exact,mha"},
};

const McCase *mc_rows(int *n) {
    *n = (int)(sizeof rows / sizeof rows[0]);
    return rows;
}

int mc_cases(McCase *out, int max) {
    int n = 0, nr;
    const McCase *r = mc_rows(&nr);
    for (int i = 0; mixer_all[i]; i++) {
        int found = 0;
        for (int j = 0; j < nr; j++)
            if (!strcmp(r[j].mixer, mixer_all[i]->name)) {
                if (n < max) out[n] = r[j];
                n++, found = 1;
            }
        if (!found) {
            if (n < max) out[n] = (McCase){mixer_all[i]->name, .defaults = 1};
            n++;
        }
    }
    for (int j = 0; j < nr; j++)
        if (strchr(r[j].mixer, ',')) {
            if (n < max) out[n] = r[j];
            n++;
        }
    if (n > max) die("mc_cases: %d cases, room for %d", n, max);
    return n;
}

const char *mc_case_name(const McCase *k, char *buf, size_t n) {
    char ev[32] = "", kv[16] = "", w[16] = "", b[16] = "";
    if (k->expand_v) snprintf(ev, sizeof ev, " Dv=%gDk", k->expand_v);
    if (k->kv) snprintf(kv, sizeof kv, " kv=%d", k->kv);
    if (k->window) snprintf(w, sizeof w, " window=%d", k->window);
    if (k->bound) snprintf(b, sizeof b, " bound=%g", (double)k->bound);
    snprintf(buf, n, "%s%s%s%s%s%s%s%s%s%s%s", k->mixer, k->defaults ? " (defaults)" : "", k->gate ? " +gate" : "",
             k->onorm ? " +shared norm" : "", k->neg ? " +neg_eigen" : "", ev, kv, w, b,
             k->partial ? " +half rope +o bias" : "", k->fla ? " fla" : "");
    return buf;
}

const McSizes mc_tiny = {11, 12, 2, 4, 10, 8};

int mc_pattern_len(const char *mixer) {
    int n = mixer_pattern_check(mixer, 0);
    if (n < 0) die("%s", mn_last_error());
    return n;
}

const char *mc_pattern_name(const char *mixer, int i, char *buf, size_t n) {
    const char *p = mixer;
    for (int j = 0; j < i && p; j++)
        if ((p = strchr(p, ','))) p++;
    if (!p) die("mixer \"%s\" has no name %d", mixer, i);
    size_t len = strcspn(p, ",");
    snprintf(buf, n, "%.*s", (int)len, p);
    return buf;
}

ModelConfig mc_case_config(const McCase *k, const McSizes *s, int layers) {
    ModelConfig c;
    config_default(&c);
    int n = mc_pattern_len(k->mixer);
    mc_tiny_sizes(&c, k->mixer, layers > n ? layers : n);
    c.vocab_size = s->vocab;
    c.dim = s->dim;
    c.n_heads = s->heads;
    c.head_dim = s->head_dim;
    c.mlp_hidden = s->mlp;
    c.seq_len = s->seq_len;
    c.logit_cap = 2.5f;
    c.rope_theta = 100;
    for (int i = 0; i < n; i++) {
        const MixerOps *ops = mixer_at(&c, i);
        if (!ops) die("%s", mn_last_error());
        if (ops->preset) ops->preset(&c);
    }
    if (!k->defaults) {
        c.output_gate = k->gate;
        c.shared_onorm = k->onorm;
        c.neg_eigen = k->neg;
        c.head_v_dim = k->expand_v ? (int)lround(k->expand_v * c.head_dim) : 0;
        c.n_kv_heads = k->kv;
        if (k->window) c.window = k->window;
        c.gate_bound = k->bound;
        if (k->partial) c.rope_dim = c.head_dim / 2, c.o_bias = 1;
    }
    if (k->fla) {
        strcpy(c.arch, "fla");
        c.embed_scale = 0;
        c.tie_embeddings = 0;
        c.logit_cap = 0;
        c.resid_scale = 0;
    }
    return c;
}
