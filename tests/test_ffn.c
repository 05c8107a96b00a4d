// The feed-forward half of a block (model/ffn.c) on its own: every kind against finite
// differences in float64, and the CPU against the reference.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "core/common.h"
#include "fd.h"
#include "model/ffn.h"
#include "model/presets.h"
#include "test.h"

// Central differences in float64 (h = 1e-6): ~1e-9 typical; the CPU's float32 through three
// products and a norm: ~1e-6, so 1e-5 (as the op tests).
#define FD_TOL 1e-6
#define F32_TOL 1e-5

enum { NMAX = 8, N_TOK = 7, DIM = 6 };

static int width7(const ModelConfig *c) {
    (void)c;
    return 7;
}

typedef struct {
    const Backend *be;
    Ffn f;
    ParamSpec specs[NMAX];
    int n;
    void *p[NMAX], *g[NMAX];
    FfnActs a;
    FfnShared s;
    void *u, *out, *dx;
    double *wy;  // the loss is sum(out * wy)
} Case;

static void *alloc_up(const Backend *be, const double *x, size_t n, MemKind k) {
    void *p = be->alloc(be, n, k);
    if (!p) die("out of memory");
    if (x && be->upload(be, p, x, n, k)) die("%s", mn_last_error());
    return p;
}

// A case of the given block shape on backend be; parameters and inputs from fixed seeds, so that
// two backends get the same numbers.
static void case_make(Case *t, const Backend *be, const BlockShape *b) {
    memset(t, 0, sizeof *t);
    t->be = be;
    ModelConfig c;
    if (config_preset(&c, "tiny")) die("%s", mn_last_error());
    c.dim = DIM;
    c.mlp_hidden = 5;
    if (ffn_declare(&c, b, "model.layers.0.", t->specs, &t->n, NMAX, &t->f)) die("%s", mn_last_error());
    size_t N = N_TOK, D = DIM, F = (size_t)(t->f.F ? t->f.F : 1);
    for (int i = 0; i < t->n; i++) {
        double *x = rand_doubles(100 + (unsigned)i, t->specs[i].numel, -0.8, 0.8);
        if (t->specs[i].ndim == 1 && strstr(t->specs[i].name, "norm"))
            for (size_t j = 0; j < t->specs[i].numel; j++) x[j] += 1;  // norm weights near 1
        t->p[i] = alloc_up(be, x, t->specs[i].numel, MEM_PARAM);
        t->g[i] = alloc_up(be, NULL, t->specs[i].numel, MEM_F32);
        free(x);
    }
    FfnActs a = {alloc_up(be, NULL, N * F, MEM_ACT), alloc_up(be, NULL, N * F, MEM_ACT), alloc_up(be, NULL, N * F, MEM_ACT),
                 alloc_up(be, NULL, N, MEM_F32)};
    FfnShared s = {alloc_up(be, NULL, N * D, MEM_ACT), alloc_up(be, NULL, N * D, MEM_ACT),
                   alloc_up(be, NULL, N * F, MEM_ACT), alloc_up(be, NULL, N * F, MEM_ACT),
                   alloc_up(be, NULL, N * F, MEM_ACT)};
    t->a = a;
    t->s = s;
    double *u = rand_doubles(7, N * D, -1.5, 1.5);
    t->wy = rand_doubles(8, N * D, -1, 1);
    t->u = alloc_up(be, u, N * D, MEM_ACT);
    t->out = alloc_up(be, NULL, N * D, MEM_ACT);
    t->dx = alloc_up(be, NULL, N * D, MEM_ACT);
    free(u);
}

static void case_free(Case *t) {
    const Backend *be = t->be;
    for (int i = 0; i < t->n; i++) {
        be->free(be, t->p[i]);
        be->free(be, t->g[i]);
    }
    void *bufs[] = {t->a.gate, t->a.up, t->a.act, t->a.rstd, t->s.v, t->s.dv, t->s.dact, t->s.dgate, t->s.dup,
                    t->u, t->out, t->dx};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(be, bufs[i]);
    free(t->wy);
}

static void forward(Case *t) {
    if (ffn_forward(t->be, &t->f, t->p, &t->a, &t->s, t->u, t->out, N_TOK, DIM, 1e-6f)) die("%s", mn_last_error());
}

// dx = d(sum out wy)/du, and the parameter gradients (from zero).
static void backward(Case *t) {
    for (int i = 0; i < t->n; i++) t->be->zero(t->be, t->g[i], t->specs[i].numel, MEM_F32);
    if (t->be->upload(t->be, t->dx, t->wy, (size_t)N_TOK * DIM, MEM_ACT)) die("%s", mn_last_error());
    if (ffn_backward(t->be, &t->f, t->p, t->g, &t->a, &t->s, t->u, t->dx, N_TOK, DIM, 1e-6f))
        die("%s", mn_last_error());
}

static double loss_ref(void *ctx) {  // the reference backend's buffers are host doubles
    Case *t = ctx;
    forward(t);
    double s = 0;
    for (size_t i = 0; i < (size_t)N_TOK * DIM; i++) s += ((double *)t->out)[i] * t->wy[i];
    return s;
}

static double *down(const Backend *be, const void *p, size_t n, MemKind k) {
    double *x = xcalloc(n, sizeof(double));
    if (be->download(be, x, p, n, k)) die("%s", mn_last_error());
    return x;
}

static const struct {
    const char *name;
    BlockShape shape;
} shapes[] = {
    {"swiglu", {FFN_SWIGLU, 0, NULL}},
    {"geglu", {FFN_GEGLU, 0, NULL}},
    {"geglu +bias, width 7", {FFN_GEGLU, 1, width7}},
    {"swiglu +bias", {FFN_SWIGLU, 1, NULL}},
    {"geglu-tanh +bias", {FFN_GEGLU_TANH, 1, NULL}},
};

TEST(ffn_gradients_match_finite_differences) {
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        Case t;
        case_make(&t, backend_ref(), &shapes[k].shape);
        forward(&t);
        backward(&t);
        char what[96];
        snprintf(what, sizeof what, "%s du", shapes[k].name);
        double *du = down(t.be, t.dx, (size_t)N_TOK * DIM, MEM_ACT);
        fd_check(what, loss_ref, &t, t.u, du, (size_t)N_TOK * DIM, FD_TOL);
        free(du);
        for (int i = 0; i < t.n; i++) {
            double *g = down(t.be, t.g[i], t.specs[i].numel, MEM_F32);
            snprintf(what, sizeof what, "%s %s", shapes[k].name, t.specs[i].name + strlen("model.layers.0."));
            fd_check(what, loss_ref, &t, t.p[i], g, t.specs[i].numel, FD_TOL);
            free(g);
        }
        CHECK(t.n == (shapes[k].shape.ffn_bias ? 7 : 4), "%s: %d tensors", shapes[k].name, t.n);
        CHECK(t.f.F == (shapes[k].shape.ffn_hidden ? 7 : 5), "%s: width %d", shapes[k].name, t.f.F);
        case_free(&t);
    }
}

TEST(ffn_cpu_matches_reference) {
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        Case r, c;
        case_make(&r, backend_ref(), &shapes[k].shape);
        case_make(&c, backend_cpu(), &shapes[k].shape);
        forward(&r);
        forward(&c);
        backward(&r);
        backward(&c);
        size_t nd = (size_t)N_TOK * DIM;
        double *ro = down(r.be, r.out, nd, MEM_ACT), *co = down(c.be, c.out, nd, MEM_ACT);
        double *rd = down(r.be, r.dx, nd, MEM_ACT), *cd = down(c.be, c.dx, nd, MEM_ACT);
        double eo = rel_err64(co, ro, nd), ed = rel_err64(cd, rd, nd), eg = 0;
        for (int i = 0; i < r.n; i++) {
            double *rg = down(r.be, r.g[i], r.specs[i].numel, MEM_F32), *cg = down(c.be, c.g[i], c.specs[i].numel, MEM_F32);
            double e = rel_err64(cg, rg, r.specs[i].numel);
            eg = e > eg ? e : eg;
            free(rg);
            free(cg);
        }
        test_note("%-22s out %.2e, du %.2e, parameter gradients %.2e (worst)", shapes[k].name, eo, ed, eg);
        CHECK(eo <= F32_TOL && ed <= F32_TOL && eg <= F32_TOL, "%s: cpu vs ref %.3g %.3g %.3g > %g", shapes[k].name, eo, ed,
              eg, F32_TOL);
        free(ro);
        free(co);
        free(rd);
        free(cd);
        case_free(&r);
        case_free(&c);
    }
}

// No feed-forward part: no tensors, out = u exactly, the gradient passes as it is.
TEST(ffn_none_is_the_identity) {
    BlockShape none = {FFN_NONE, 0, NULL};
    Case t;
    case_make(&t, backend_cpu(), &none);
    CHECK(t.n == 0 && t.f.F == 0 && ffn_width(NULL, &none) == 0, "%d tensors, width %d", t.n,
          t.f.F);
    forward(&t);
    backward(&t);
    size_t nd = (size_t)N_TOK * DIM;
    CHECK(!memcmp(t.out, t.u, nd * sizeof(float)), "out differs from u");
    double *dx = down(t.be, t.dx, nd, MEM_ACT);
    float *wy = floats_of(t.wy, nd);
    int same = 1;
    for (size_t i = 0; i < nd; i++) same &= (float)dx[i] == wy[i];
    CHECK(same, "the gradient changed");
    free(dx);
    free(wy);
    case_free(&t);
}
