// Every backend op: the float64 reference against finite differences, and the
// float32 CPU backend against the reference, on awkward sizes.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "core/backend.h"
#include "core/common.h"
#include "fd.h"
#include "test.h"

// Float32 against float64: unit roundoff 6e-8, sums of up to ~100 terms with
// some cancellation: 1e-5 relative (L2 over the tensor) is ample and still
// catches any indexing or formula error, which shows up as O(1).
#define F32_TOL 1e-5
// Central differences with h = 1e-6 in float64: ~1e-9 typical.
#define FD_TOL 1e-6

static const Backend *R, *C;

static void backends(void) {
    R = backend_ref();
    C = backend_cpu();
}

static double dot64(const double *a, const double *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static void cmp(const char *what, const float *got, const double *want, size_t n, double tol) {
    double e = rel_err32(got, want, n);
    if (!(e <= tol)) test_fail(__FILE__, __LINE__, "%s: cpu vs ref rel err %.3g > %.3g", what, e, tol);
}

// ---------------------------------------------------------------------------- linear

typedef struct {
    int N, I, O;
    double *x, *w, *b, *wy, *y;
} LinCtx;

static double lin_loss(void *p) {
    LinCtx *c = p;
    R->linear_fwd(R, c->y, c->x, c->w, c->b, c->N, c->I, c->O);
    return dot64(c->y, c->wy, (size_t)c->N * c->O);
}

TEST(op_linear) {
    backends();
    int N = 7, I = 13, O = 5;
    LinCtx c = {N, I, O, rand_doubles(1, N * I, -1, 1), rand_doubles(2, O * I, -1, 1), rand_doubles(3, O, -1, 1),
                rand_doubles(4, N * O, -1, 1), xcalloc(N * O, 8)};
    double *dx = rand_doubles(5, N * I, -1, 1), *dx0 = xcalloc(N * I, 8), *dw = xcalloc(O * I, 8), *db = xcalloc(O, 8);
    memcpy(dx0, dx, sizeof(double) * N * I);
    R->linear_bwd(R, dx, dw, db, c.wy, c.x, c.w, N, I, O, 1);  // accumulate onto dx0
    for (int i = 0; i < N * I; i++) dx[i] -= dx0[i];
    fd_check("linear dx (accum)", lin_loss, &c, c.x, dx, N * I, FD_TOL);
    fd_check("linear dw", lin_loss, &c, c.w, dw, O * I, FD_TOL);
    fd_check("linear db", lin_loss, &c, c.b, db, O, FD_TOL);
    // float32
    float *x = floats_of(c.x, N * I), *w = floats_of(c.w, O * I), *b = floats_of(c.b, O), *wy = floats_of(c.wy, N * O);
    float *y = xcalloc(N * O, 4), *fdx = xcalloc(N * I, 4), *fdw = xcalloc(O * I, 4), *fdb = xcalloc(O, 4);
    lin_loss(&c);
    C->linear_fwd(C, y, x, w, b, N, I, O);
    cmp("linear y", y, c.y, N * O, F32_TOL);
    C->linear_bwd(C, fdx, fdw, fdb, wy, x, w, N, I, O, 0);
    cmp("linear dx", fdx, dx, N * I, F32_TOL);
    cmp("linear dw", fdw, dw, O * I, F32_TOL);
    cmp("linear db", fdb, db, O, F32_TOL);
    free(c.x); free(c.w); free(c.b); free(c.wy); free(c.y); free(dx); free(dx0); free(dw); free(db);
    free(x); free(w); free(b); free(wy); free(y); free(fdx); free(fdw); free(fdb);
}

// ---------------------------------------------------------------------------- rmsnorm

typedef struct {
    int N, D, group, wlen;
    double *x, *w, *wy, *y, *rstd;
} NormCtx;

static double norm_loss(void *p) {
    NormCtx *c = p;
    R->rmsnorm_fwd(R, c->y, c->rstd, c->x, c->w, c->N, c->D, c->group, c->wlen, 1e-5f);
    return dot64(c->y, c->wy, (size_t)c->N * c->D);
}

TEST(op_rmsnorm) {
    backends();
    // whole rows; per-head groups with one shared weight (fla's o_norm); per-head groups, own weights
    int cfg[3][2] = {{18, 18}, {6, 6}, {6, 18}};  // group, wlen with D = 18
    for (int k = 0; k < 3; k++) {
        int N = 9, D = 18, group = cfg[k][0], wlen = cfg[k][1];
        size_t nd = (size_t)N * D, nr = nd / group;
        NormCtx c = {N, D, group, wlen, rand_doubles(10 + k, nd, -2, 2), rand_doubles(20 + k, wlen, 0.5, 1.5),
                     rand_doubles(30 + k, nd, -1, 1), xcalloc(nd, 8), xcalloc(nr, 8)};
        norm_loss(&c);
        double *dx = xcalloc(nd, 8), *dw = xcalloc(wlen, 8);
        R->rmsnorm_bwd(R, dx, dw, c.wy, c.x, c.w, c.rstd, N, D, group, wlen, 0);
        char name[64];
        snprintf(name, sizeof name, "rmsnorm dx (group %d, w %d)", group, wlen);
        fd_check(name, norm_loss, &c, c.x, dx, nd, FD_TOL);
        snprintf(name, sizeof name, "rmsnorm dw (group %d, w %d)", group, wlen);
        fd_check(name, norm_loss, &c, c.w, dw, wlen, FD_TOL);
        float *x = floats_of(c.x, nd), *w = floats_of(c.w, wlen), *wy = floats_of(c.wy, nd);
        float *y = xcalloc(nd, 4), *rstd = xcalloc(nr, 4), *fdx = xcalloc(nd, 4), *fdw = xcalloc(wlen, 4);
        norm_loss(&c);
        C->rmsnorm_fwd(C, y, rstd, x, w, N, D, group, wlen, 1e-5f);
        cmp("rmsnorm y", y, c.y, nd, F32_TOL);
        C->rmsnorm_bwd(C, fdx, fdw, wy, x, w, rstd, N, D, group, wlen, 0);
        cmp("rmsnorm dx", fdx, dx, nd, F32_TOL);
        cmp("rmsnorm dw", fdw, dw, wlen, F32_TOL);
        free(c.x); free(c.w); free(c.wy); free(c.y); free(c.rstd); free(dx); free(dw);
        free(x); free(w); free(wy); free(y); free(rstd); free(fdx); free(fdw);
    }
}

// ---------------------------------------------------------------------------- l2norm

typedef struct {
    int N, D, group;
    double *x, *wy, *y, *inv;
} L2Ctx;

static double l2_loss(void *p) {
    L2Ctx *c = p;
    R->l2norm_fwd(R, c->y, c->inv, c->x, c->N, c->D, c->group, 1e-6f);
    return dot64(c->y, c->wy, (size_t)c->N * c->D);
}

TEST(op_l2norm) {
    backends();
    int N = 5, D = 21, group = 7;
    size_t nd = (size_t)N * D;
    L2Ctx c = {N, D, group, rand_doubles(40, nd, -1, 1), rand_doubles(41, nd, -1, 1), xcalloc(nd, 8), xcalloc(nd / group, 8)};
    l2_loss(&c);
    double *dx = xcalloc(nd, 8);
    R->l2norm_bwd(R, dx, c.wy, c.y, c.inv, N, D, group);
    fd_check("l2norm dx", l2_loss, &c, c.x, dx, nd, FD_TOL);
    float *x = floats_of(c.x, nd), *wy = floats_of(c.wy, nd), *y = xcalloc(nd, 4), *inv = xcalloc(nd / group, 4);
    float *fdx = xcalloc(nd, 4);
    l2_loss(&c);
    C->l2norm_fwd(C, y, inv, x, N, D, group, 1e-6f);
    cmp("l2norm y", y, c.y, nd, F32_TOL);
    C->l2norm_bwd(C, fdx, wy, y, inv, N, D, group);
    cmp("l2norm dx", fdx, dx, nd, F32_TOL);
    free(c.x); free(c.wy); free(c.y); free(c.inv); free(dx); free(x); free(wy); free(y); free(inv); free(fdx);
}

// ------------------------------------------------------------------- silu and swiglu

typedef struct {
    size_t n;
    double *g, *u, *wy, *y;
} ActCtx;

static double silu_loss(void *p) {
    ActCtx *c = p;
    R->silu_fwd(R, c->y, c->g, c->n);
    return dot64(c->y, c->wy, c->n);
}

static double swiglu_loss(void *p) {
    ActCtx *c = p;
    R->swiglu_fwd(R, c->y, c->g, c->u, c->n);
    return dot64(c->y, c->wy, c->n);
}

TEST(op_silu_swiglu) {
    backends();
    size_t n = 37;
    ActCtx c = {n, rand_doubles(50, n, -6, 6), rand_doubles(51, n, -2, 2), rand_doubles(52, n, -1, 1), xcalloc(n, 8)};
    double *dg = xcalloc(n, 8), *du = xcalloc(n, 8);
    R->silu_bwd(R, dg, c.wy, c.g, n);
    fd_check("silu dx", silu_loss, &c, c.g, dg, n, FD_TOL);
    R->swiglu_bwd(R, dg, du, c.wy, c.g, c.u, n);
    fd_check("swiglu dg", swiglu_loss, &c, c.g, dg, n, FD_TOL);
    fd_check("swiglu du", swiglu_loss, &c, c.u, du, n, FD_TOL);
    float *g = floats_of(c.g, n), *u = floats_of(c.u, n), *wy = floats_of(c.wy, n), *y = xcalloc(n, 4);
    float *fdg = xcalloc(n, 4), *fdu = xcalloc(n, 4);
    silu_loss(&c);
    C->silu_fwd(C, y, g, n);
    cmp("silu y", y, c.y, n, F32_TOL);
    swiglu_loss(&c);
    C->swiglu_fwd(C, y, g, u, n);
    cmp("swiglu y", y, c.y, n, F32_TOL);
    C->swiglu_bwd(C, fdg, fdu, wy, g, u, n);
    cmp("swiglu dg", fdg, dg, n, F32_TOL);
    cmp("swiglu du", fdu, du, n, F32_TOL);
    C->silu_bwd(C, fdg, wy, g, n);
    R->silu_bwd(R, dg, c.wy, c.g, n);
    cmp("silu dx", fdg, dg, n, F32_TOL);
    free(c.g); free(c.u); free(c.wy); free(c.y); free(dg); free(du); free(g); free(u); free(wy); free(y);
    free(fdg); free(fdu);
}

static double sigmoid_gate_loss(void *p) {
    ActCtx *c = p;
    R->sigmoid_gate_fwd(R, c->y, c->g, c->u, c->n);
    return dot64(c->y, c->wy, c->n);
}

// xLSTM-7B's output gate, sigmoid(g) u: finite differences on 37 elements, the CPU against the
// reference on 4099 (past its parallel chunks of 4096), F32_TOL as the other element-wise ops.
TEST(op_sigmoid_gate) {
    backends();
    for (int pass = 0; pass < 2; pass++) {
        size_t n = pass ? 4099 : 37;
        ActCtx c = {n, rand_doubles(56, n, -6, 6), rand_doubles(57, n, -2, 2), rand_doubles(58, n, -1, 1), xcalloc(n, 8)};
        double *dg = xcalloc(n, 8), *du = xcalloc(n, 8);
        R->sigmoid_gate_bwd(R, dg, du, c.wy, c.g, c.u, n);
        if (!pass) {
            fd_check("sigmoid gate dg", sigmoid_gate_loss, &c, c.g, dg, n, FD_TOL);
            fd_check("sigmoid gate du", sigmoid_gate_loss, &c, c.u, du, n, FD_TOL);
        }
        float *g = floats_of(c.g, n), *u = floats_of(c.u, n), *wy = floats_of(c.wy, n), *y = xcalloc(n, 4);
        float *fdg = xcalloc(n, 4), *fdu = xcalloc(n, 4);
        sigmoid_gate_loss(&c);
        C->sigmoid_gate_fwd(C, y, g, u, n);
        cmp("sigmoid gate y", y, c.y, n, F32_TOL);
        C->sigmoid_gate_bwd(C, fdg, fdu, wy, g, u, n);
        cmp("sigmoid gate dg", fdg, dg, n, F32_TOL);
        cmp("sigmoid gate du", fdu, du, n, F32_TOL);
        free(c.g); free(c.u); free(c.wy); free(c.y); free(dg); free(du); free(g); free(u); free(wy); free(y);
        free(fdg); free(fdu);
    }
}

static double geglu_loss(void *p) {
    ActCtx *c = p;
    R->geglu_fwd(R, c->y, c->g, c->u, c->n);
    return dot64(c->y, c->wy, c->n);
}

// The GELU-gated product of the feed-forward part (model/ffn.c): finite differences on 37 elements,
// the CPU on 4099, which cross its parallel chunks (4096) into a scalar remainder.
TEST(op_geglu) {
    backends();
    for (int pass = 0; pass < 2; pass++) {
        size_t n = pass ? 4099 : 37;
        ActCtx c = {n, rand_doubles(53, n, -6, 6), rand_doubles(54, n, -2, 2), rand_doubles(55, n, -1, 1), xcalloc(n, 8)};
        double *dg = xcalloc(n, 8), *du = xcalloc(n, 8);
        R->geglu_bwd(R, dg, du, c.wy, c.g, c.u, n);
        if (!pass) {
            fd_check("geglu dg", geglu_loss, &c, c.g, dg, n, FD_TOL);
            fd_check("geglu du", geglu_loss, &c, c.u, du, n, FD_TOL);
        }
        float *g = floats_of(c.g, n), *u = floats_of(c.u, n), *wy = floats_of(c.wy, n), *y = xcalloc(n, 4);
        float *fdg = xcalloc(n, 4), *fdu = xcalloc(n, 4);
        geglu_loss(&c);
        C->geglu_fwd(C, y, g, u, n);
        cmp("geglu y", y, c.y, n, F32_TOL);
        C->geglu_bwd(C, fdg, fdu, wy, g, u, n);
        cmp("geglu dg", fdg, dg, n, F32_TOL);
        cmp("geglu du", fdu, du, n, F32_TOL);
        free(c.g); free(c.u); free(c.wy); free(c.y); free(dg); free(du); free(g); free(u); free(wy); free(y);
        free(fdg); free(fdu);
    }
}

static double gelu_tanh_loss(void *p) {
    ActCtx *c = p;
    R->gelu_tanh_fwd(R, c->y, c->g, c->n);
    return dot64(c->y, c->wy, c->n);
}

static double geglu_tanh_loss(void *p) {
    ActCtx *c = p;
    R->geglu_tanh_fwd(R, c->y, c->g, c->u, c->n);
    return dot64(c->y, c->wy, c->n);
}

// GELU's tanh approximation, alone and gating (hawk's output, RecurrentGemma's MLP): known values
// of torch's gelu(x, approximate='tanh') (its formula in float64), finite differences on 37
// elements, the CPU against the reference on 37 and on 4099 (past its parallel chunks of 4096).
TEST(op_gelu_tanh) {
    backends();
    double kx[3] = {1, -0.5, 3}, ky[3], want[3] = {0.8411919906082768, -0.15428599017485606, 2.996362607918227};
    R->gelu_tanh_fwd(R, ky, kx, 3);
    for (int i = 0; i < 3; i++)
        CHECK(fabs(ky[i] - want[i]) < 1e-15, "gelu_tanh(%g) = %.17g, expected %.17g", kx[i], ky[i], want[i]);
    for (int pass = 0; pass < 2; pass++) {
        size_t n = pass ? 4099 : 37;
        ActCtx c = {n, rand_doubles(59, n, -6, 6), rand_doubles(60, n, -2, 2), rand_doubles(61, n, -1, 1), xcalloc(n, 8)};
        double *dx = xcalloc(n, 8), *dg = xcalloc(n, 8), *du = xcalloc(n, 8);
        R->gelu_tanh_bwd(R, dx, c.wy, c.g, n);
        R->geglu_tanh_bwd(R, dg, du, c.wy, c.g, c.u, n);
        if (!pass) {
            fd_check("gelu_tanh dx", gelu_tanh_loss, &c, c.g, dx, n, FD_TOL);
            fd_check("geglu_tanh dg", geglu_tanh_loss, &c, c.g, dg, n, FD_TOL);
            fd_check("geglu_tanh du", geglu_tanh_loss, &c, c.u, du, n, FD_TOL);
        }
        float *g = floats_of(c.g, n), *u = floats_of(c.u, n), *wy = floats_of(c.wy, n), *y = xcalloc(n, 4);
        float *fdg = xcalloc(n, 4), *fdu = xcalloc(n, 4);
        gelu_tanh_loss(&c);
        C->gelu_tanh_fwd(C, y, g, n);
        cmp("gelu_tanh y", y, c.y, n, F32_TOL);
        C->gelu_tanh_bwd(C, fdg, wy, g, n);
        cmp("gelu_tanh dx", fdg, dx, n, F32_TOL);
        C->gelu_tanh_bwd(C, wy, wy, g, n);  // in place (dx = dy)
        cmp("gelu_tanh dx in place", wy, dx, n, F32_TOL);
        free(wy);
        wy = floats_of(c.wy, n);
        geglu_tanh_loss(&c);
        C->geglu_tanh_fwd(C, y, g, u, n);
        cmp("geglu_tanh y", y, c.y, n, F32_TOL);
        C->geglu_tanh_bwd(C, fdg, fdu, wy, g, u, n);
        cmp("geglu_tanh dg", fdg, dg, n, F32_TOL);
        cmp("geglu_tanh du", fdu, du, n, F32_TOL);
        free(c.g); free(c.u); free(c.wy); free(c.y); free(dx); free(dg); free(du); free(g); free(u); free(wy); free(y);
        free(fdg); free(fdu);
    }
}

typedef struct {
    int N, C;
    double *y0, *b, *wy, *y;
} BiasCtx;

static double bias_loss(void *p) {
    BiasCtx *c = p;
    memcpy(c->y, c->y0, sizeof(double) * c->N * c->C);
    R->bias_fwd(R, c->y, c->b, c->N, c->C);
    return dot64(c->y, c->wy, (size_t)c->N * c->C);
}

// y += b over rows; db += column sums of dy (accumulating onto what db held). Finite differences
// at 7 x 13; the CPU at 7 x 13 and 600 x 37 (its fixed blocks of 256 rows: a partial last one).
TEST(op_bias) {
    backends();
    int cfg[][2] = {{7, 13}, {600, 37}};
    for (int k = 0; k < 2; k++) {
        int N = cfg[k][0], Cn = cfg[k][1];
        size_t n = (size_t)N * Cn;
        BiasCtx c = {N, Cn, rand_doubles(70 + k, n, -1, 1), rand_doubles(72 + k, Cn, -1, 1),
                     rand_doubles(74 + k, n, -1, 1), xcalloc(n, 8)};
        double *db = rand_doubles(76 + k, Cn, -1, 1), *db0 = xcalloc(Cn, 8);
        memcpy(db0, db, sizeof(double) * Cn);
        R->bias_bwd(R, db, c.wy, N, Cn);
        for (int i = 0; i < Cn; i++) db[i] -= db0[i];
        if (!k) fd_check("bias db (accum)", bias_loss, &c, c.b, db, Cn, FD_TOL);
        for (int i = 0; i < Cn; i++) db[i] += db0[i];
        bias_loss(&c);
        float *y = floats_of(c.y0, n), *b = floats_of(c.b, Cn), *wy = floats_of(c.wy, n), *fdb = floats_of(db0, Cn);
        C->bias_fwd(C, y, b, N, Cn);
        cmp("bias y", y, c.y, n, F32_TOL);
        C->bias_bwd(C, fdb, wy, N, Cn);
        cmp("bias db", fdb, db, Cn, F32_TOL);
        free(c.y0); free(c.b); free(c.wy); free(c.y); free(db); free(db0); free(y); free(b); free(wy); free(fdb);
    }
}

// Soft cap (decoding only: no backward) and the int32 counters.
TEST(op_softcap_and_counters) {
    backends();
    size_t n = 41;
    double *x = rand_doubles(60, n, -80, 80), *want = xcalloc(n, 8);
    float *xf = floats_of(x, n);
    for (size_t i = 0; i < n; i++) want[i] = 30 * tanh(x[i] / 30);
    R->softcap(R, x, n, 30);
    C->softcap(C, xf, n, 30);
    for (size_t i = 0; i < n; i++) CHECK(fabs(x[i] - want[i]) <= 1e-12 * 30, "ref softcap[%zu] %g vs %g", i, x[i], want[i]);
    cmp("softcap", xf, want, n, F32_TOL);
    const Backend *both[] = {R, C};
    for (int b = 0; b < 2; b++) {
        int32_t *acc = both[b]->alloc(both[b], 10, MEM_I32), d[5] = {3, 0, -2, 7, 1}, got[10];
        both[b]->tally_i32(both[b], acc, acc + 5, d, 5);
        both[b]->tally_i32(both[b], acc, acc + 5, d, 5);
        both[b]->download_i32(both[b], got, acc, 10);
        for (int i = 0; i < 5; i++)
            CHECK(got[i] == 2 * d[i] && got[5 + i] == 2, "%s tally_i32[%d] = (%d, %d), want (%d, 2)", both[b]->name, i,
                  got[i], got[5 + i], 2 * d[i]);
        both[b]->free(both[b], acc);
    }
    free(x); free(want); free(xf);
}

// ---------------------------------------------------------------------------- conv

typedef struct {
    int B, T, Ch, K;
    double *x, *w, *sin, *wy, *y;
} ConvCtx;

static double conv_loss(void *p) {
    ConvCtx *c = p;
    R->conv_fwd(R, c->y, c->x, c->w, c->B, c->T, c->Ch, c->K, c->sin, NULL);
    return dot64(c->y, c->wy, (size_t)c->B * c->T * c->Ch);
}

TEST(op_conv) {
    backends();
    int B = 2, T = 6, Ch = 5, K = 4;
    size_t nx = (size_t)B * T * Ch, ns = (size_t)B * (K - 1) * Ch;
    for (int with_state = 0; with_state < 2; with_state++) {
        ConvCtx c = {B, T, Ch, K, rand_doubles(60, nx, -1, 1), rand_doubles(61, (size_t)Ch * K, -1, 1),
                     with_state ? rand_doubles(62, ns, -1, 1) : NULL, rand_doubles(63, nx, -1, 1), xcalloc(nx, 8)};
        double *dx = xcalloc(nx, 8), *dw = xcalloc((size_t)Ch * K, 8);
        R->conv_bwd(R, dx, dw, c.wy, c.x, c.w, B, T, Ch, K, c.sin);
        fd_check(with_state ? "conv dx (state)" : "conv dx", conv_loss, &c, c.x, dx, nx, FD_TOL);
        fd_check(with_state ? "conv dw (state)" : "conv dw", conv_loss, &c, c.w, dw, (size_t)Ch * K, FD_TOL);
        float *x = floats_of(c.x, nx), *w = floats_of(c.w, (size_t)Ch * K), *wy = floats_of(c.wy, nx);
        float *sin = c.sin ? floats_of(c.sin, ns) : NULL, *y = xcalloc(nx, 4), *fdx = xcalloc(nx, 4);
        float *fdw = xcalloc((size_t)Ch * K, 4);
        conv_loss(&c);
        C->conv_fwd(C, y, x, w, B, T, Ch, K, sin, NULL);
        cmp("conv y", y, c.y, nx, F32_TOL);
        C->conv_bwd(C, fdx, fdw, wy, x, w, B, T, Ch, K, sin);
        cmp("conv dx", fdx, dx, nx, F32_TOL);
        cmp("conv dw", fdw, dw, (size_t)Ch * K, F32_TOL);
        free(c.x); free(c.w); free(c.sin); free(c.wy); free(c.y); free(dx); free(dw);
        free(x); free(w); free(wy); free(sin); free(y); free(fdx); free(fdw);
    }
}

// Streaming: the output over T tokens equals running the tokens one at a time
// through the state (in place), with T < K - 1 cases included.
TEST(op_conv_state_streaming) {
    backends();
    int B = 3, T = 9, Ch = 4, K = 4;
    size_t nx = (size_t)B * T * Ch;
    double *x = rand_doubles(70, nx, -1, 1), *w = rand_doubles(71, (size_t)Ch * K, -1, 1), *y = xcalloc(nx, 8);
    R->conv_fwd(R, y, x, w, B, T, Ch, K, NULL, NULL);
    float *fx = floats_of(x, nx), *fw = floats_of(w, (size_t)Ch * K);
    float *state = xcalloc((size_t)B * (K - 1) * Ch, 4), *step_y = xcalloc(nx, 4), *xt = xcalloc((size_t)B * 2 * Ch, 4);
    float *yt = xcalloc((size_t)B * 2 * Ch, 4);
    for (int t0 = 0; t0 < T;) {
        int n = t0 == 0 ? 2 : 1;  // a 2-token prefill (shorter than K - 1), then single steps
        for (int b = 0; b < B; b++)
            memcpy(xt + (size_t)b * n * Ch, fx + ((size_t)b * T + t0) * Ch, sizeof(float) * n * Ch);
        C->conv_fwd(C, yt, xt, fw, B, n, Ch, K, t0 ? state : NULL, state);
        for (int b = 0; b < B; b++)
            memcpy(step_y + ((size_t)b * T + t0) * Ch, yt + (size_t)b * n * Ch, sizeof(float) * n * Ch);
        t0 += n;
    }
    cmp("conv streamed through its state", step_y, y, nx, F32_TOL);
    free(x); free(w); free(y); free(fx); free(fw); free(state); free(step_y); free(xt); free(yt);
}

// -------------------------------------------------------------------- embedding

typedef struct {
    int N, D;
    int32_t *tok;
    double *e, *wy, *y;
} EmbCtx;

static double emb_loss(void *p) {
    EmbCtx *c = p;
    R->embed_fwd(R, c->y, c->tok, c->e, c->N, c->D, 1.7f);
    return dot64(c->y, c->wy, (size_t)c->N * c->D);
}

TEST(op_embed) {
    backends();
    int N = 8, D = 6, V = 5;
    int32_t tok[8] = {0, 3, 3, 4, 1, 0, 3, 2};
    EmbCtx c = {N, D, tok, rand_doubles(80, V * D, -1, 1), rand_doubles(81, N * D, -1, 1), xcalloc(N * D, 8)};
    double *de = xcalloc(V * D, 8);
    R->embed_bwd(R, de, c.wy, tok, N, D, 1.7f);
    fd_check("embed dE (repeated tokens)", emb_loss, &c, c.e, de, V * D, FD_TOL);
    float *e = floats_of(c.e, V * D), *wy = floats_of(c.wy, N * D), *y = xcalloc(N * D, 4), *fde = xcalloc(V * D, 4);
    emb_loss(&c);
    C->embed_fwd(C, y, tok, e, N, D, 1.7f);
    cmp("embed y", y, c.y, N * D, F32_TOL);
    C->embed_bwd(C, fde, wy, tok, N, D, 1.7f);
    cmp("embed dE", fde, de, V * D, F32_TOL);
    free(c.e); free(c.wy); free(c.y); free(de); free(e); free(wy); free(y); free(fde);
}

// ----------------------------------------------------------------- cross-entropy

typedef struct {
    int N, V;
    float cap;
    int32_t *tgt;
    double *z, *work, *loss;
} XentCtx;

static double xent_loss(void *p) {
    XentCtx *c = p;
    memcpy(c->work, c->z, sizeof(double) * c->N * c->V);
    R->xent(R, c->work, c->loss, c->tgt, c->N, c->V, c->cap, 0, NULL);
    double s = 0;
    for (int n = 0; n < c->N; n++) s += c->loss[n] * (n + 1);  // distinct weights per row
    return s;
}

TEST(op_softcapped_cross_entropy) {
    backends();
    int N = 6, V = 11;
    int32_t tgt[6] = {3, -1, 0, 10, 7, 3};
    for (int k = 0; k < 2; k++) {
        float cap = k ? 3.0f : 0.0f;  // a small cap, so that tanh bends the logits a lot
        XentCtx c = {N, V, cap, tgt, rand_doubles(90, N * V, -5, 5), xcalloc(N * V, 8), xcalloc(N, 8)};
        // analytic: one call per row weight (grad_scale applies to all rows, so weight rows via the logits)
        double *grad = xcalloc(N * V, 8);
        for (int n = 0; n < N; n++) {
            memcpy(c.work, c.z, sizeof(double) * N * V);
            R->xent(R, c.work, c.loss, tgt, N, V, cap, (float)(n + 1), NULL);
            memcpy(grad + (size_t)n * V, c.work + (size_t)n * V, sizeof(double) * V);
        }
        fd_check(cap > 0 ? "xent dlogits (cap 3)" : "xent dlogits (no cap)", xent_loss, &c, c.z, grad, N * V, FD_TOL);
        CHECK(c.loss[1] == 0, "ignored target has loss %g", c.loss[1]);
        float *fz = floats_of(c.z, N * V), *fl = xcalloc(N, 4);
        memcpy(c.work, c.z, sizeof(double) * N * V);
        R->xent(R, c.work, c.loss, tgt, N, V, cap, 0.5f, NULL);
        C->xent(C, fz, fl, tgt, N, V, cap, 0.5f, NULL);
        cmp("xent losses", fl, c.loss, N, F32_TOL);
        cmp("xent grad", fz, c.work, N * V, F32_TOL);
        // the scale read from the backend's memory (a recorded step's): the same numbers, exactly
        float *fz2 = floats_of(c.z, N * V), *fl2 = xcalloc(N, 4), at32 = 0.5f;
        double *z2 = xcalloc(N * V, 8), *l2 = xcalloc(N, 8), at64 = 0.5;
        memcpy(z2, c.z, sizeof(double) * N * V);
        CHECK(!C->xent(C, fz2, fl2, tgt, N, V, cap, 1.0f, &at32) && !R->xent(R, z2, l2, tgt, N, V, cap, 1.0f, &at64),
              "%s", mn_last_error());
        CHECK(!memcmp(fz2, fz, sizeof(float) * N * V) && !memcmp(fl2, fl, sizeof(float) * N), "cpu xent, scale at");
        CHECK(!memcmp(z2, c.work, sizeof(double) * N * V) && !memcmp(l2, c.loss, sizeof(double) * N), "ref xent, scale at");
        free(fz2); free(fl2); free(z2); free(l2);
        free(c.z); free(c.work); free(c.loss); free(grad); free(fz); free(fl);
    }
}

// ------------------------------------------------------------------- Mesa gates

typedef struct {
    size_t n;
    float hmax;
    double *a, *b, *wg, *wb, *g, *beta;
} GateCtx;

static double gate_loss(void *p) {
    GateCtx *c = p;
    R->gates_fwd(R, c->g, c->beta, c->a, c->b, c->n, c->hmax);
    return dot64(c->g, c->wg, c->n) + dot64(c->beta, c->wb, c->n);
}

TEST(op_gates) {
    backends();
    size_t n = 40;
    // hmax = 8 with a in [-2, 8]: the bound log(1 - beta/8) is active for large a (both branches tested)
    GateCtx c = {n, 8.0f, rand_doubles(100, n, -2, 8), rand_doubles(101, n, -3, 3), rand_doubles(102, n, -1, 1),
                 rand_doubles(103, n, -1, 1), xcalloc(n, 8), xcalloc(n, 8)};
    gate_loss(&c);
    int bounded = 0;
    for (size_t i = 0; i < n; i++) bounded += c.g[i] < -log1p(exp(-c.a[i])) - 1e-12;
    test_note("forget-gate bound active for %d of %zu gates", bounded, n);
    CHECK(bounded > 3 && bounded < (int)n - 3, "both branches of the bound must be exercised (%d bounded)", bounded);
    double *da = xcalloc(n, 8), *db = xcalloc(n, 8);
    R->gates_bwd(R, da, db, c.wg, c.wb, c.a, c.b, n, c.hmax);
    fd_check("gates da", gate_loss, &c, c.a, da, n, FD_TOL);
    fd_check("gates db (through beta and the bound)", gate_loss, &c, c.b, db, n, FD_TOL);
    float *a = floats_of(c.a, n), *b = floats_of(c.b, n), *wg = floats_of(c.wg, n), *wb = floats_of(c.wb, n);
    float *g = xcalloc(n, 4), *beta = xcalloc(n, 4), *fda = xcalloc(n, 4), *fdb = xcalloc(n, 4);
    gate_loss(&c);
    C->gates_fwd(C, g, beta, a, b, n, c.hmax);
    cmp("gates g", g, c.g, n, F32_TOL);
    cmp("gates beta", beta, c.beta, n, F32_TOL);
    C->gates_bwd(C, fda, fdb, wg, wb, a, b, n, c.hmax);
    cmp("gates da", fda, da, n, F32_TOL);
    cmp("gates db", fdb, db, n, F32_TOL);
    free(c.a); free(c.b); free(c.wg); free(c.wb); free(c.g); free(c.beta); free(da); free(db);
    free(a); free(b); free(wg); free(wb); free(g); free(beta); free(fda); free(fdb);
}

typedef struct {
    size_t n;
    double *p, *wy, *y;
} SpCtx;

static double sp_loss(void *p) {
    SpCtx *c = p;
    R->mesa->softplus_fwd(R, c->y, c->p, c->n, 0.25f);
    return dot64(c->y, c->wy, c->n);
}

TEST(op_softplus) {
    backends();
    size_t n = 25;
    SpCtx c = {n, rand_doubles(110, n, -8, 8), rand_doubles(111, n, -1, 1), xcalloc(n, 8)};
    double *dp = xcalloc(n, 8);
    R->mesa->softplus_bwd(R, dp, c.wy, c.p, n);
    fd_check("softplus dp", sp_loss, &c, c.p, dp, n, FD_TOL);
    float *p = floats_of(c.p, n), *wy = floats_of(c.wy, n), *y = xcalloc(n, 4), *fdp = xcalloc(n, 4);
    sp_loss(&c);
    C->mesa->softplus_fwd(C, y, p, n, 0.25f);
    cmp("softplus y", y, c.y, n, F32_TOL);
    C->mesa->softplus_bwd(C, fdp, wy, p, n);
    cmp("softplus dp", fdp, dp, n, F32_TOL);
    free(c.p); free(c.wy); free(c.y); free(dp); free(p); free(wy); free(y); free(fdp);
}

// ------------------------------------------------------------------- Longhorn's implicit step

typedef struct {
    int N, H, Dk;
    double *beta, *k, *w, *eps;
} EpsCtx;

static double eps_loss(void *p) {
    EpsCtx *c = p;
    R->lin->longhorn_eps_fwd(R, c->eps, c->beta, c->k, c->N, c->H, c->Dk);
    return dot64(c->eps, c->w, (size_t)c->N * c->H);
}

// eps = beta / (1 + beta |k|^2) on keys of norms from 0 to about 4 (beta kappa up to ~16: the step
// shrinks well below beta), 7 tokens of 3 heads of 5: the reference against finite differences, its
// key gradient added to what dk held; the CPU against the reference.
TEST(op_longhorn_eps) {
    backends();
    int N = 7, H = 3, Dk = 5;
    size_t nh = (size_t)N * H, nk = nh * Dk;
    EpsCtx c = {N, H, Dk, rand_doubles(130, nh, 0.01, 0.99), rand_doubles(131, nk, -2, 2), rand_doubles(132, nh, -1, 1),
                xcalloc(nh, 8)};
    double *dk0 = rand_doubles(133, nk, -1, 1), *dk = xcalloc(nk, 8), *dbeta = xcalloc(nh, 8);
    memcpy(dk, dk0, nk * 8);
    CHECK(!R->lin->longhorn_eps_bwd(R, dbeta, dk, c.w, c.beta, c.k, N, H, Dk), "%s", mn_last_error());
    for (size_t i = 0; i < nk; i++) dk[i] -= dk0[i];  // the op's own part (it adds)
    fd_check("longhorn eps dbeta", eps_loss, &c, c.beta, dbeta, nh, FD_TOL);
    fd_check("longhorn eps dk (added)", eps_loss, &c, c.k, dk, nk, FD_TOL);
    for (size_t i = 0; i < nk; i++) dk[i] += dk0[i];
    eps_loss(&c);
    float *beta = floats_of(c.beta, nh), *k = floats_of(c.k, nk), *w = floats_of(c.w, nh), *fdk = floats_of(dk0, nk);
    float *eps = xcalloc(nh, 4), *fdb = xcalloc(nh, 4);
    CHECK(!C->lin->longhorn_eps_fwd(C, eps, beta, k, N, H, Dk), "%s", mn_last_error());
    cmp("longhorn eps", eps, c.eps, nh, F32_TOL);
    // dbeta in place of deps (the op allows the alias)
    memcpy(fdb, w, nh * 4);
    CHECK(!C->lin->longhorn_eps_bwd(C, fdb, fdk, fdb, beta, k, N, H, Dk), "%s", mn_last_error());
    cmp("longhorn eps dbeta", fdb, dbeta, nh, F32_TOL);
    cmp("longhorn eps dk (added)", fdk, dk, nk, F32_TOL);
    free(c.beta); free(c.k); free(c.w); free(c.eps); free(dk0); free(dk); free(dbeta);
    free(beta); free(k); free(w); free(fdk); free(eps); free(fdb);
}

// ---------------------------------------------------------------- optimiser ops

// AdamW over a slab (Backend.adamw), the CPU against the reference over 3 steps of 1000 elements
// (not a multiple of 8: a partial last group), half of the 8-element groups decaying, step 2
// clipped to half its norm: the norm from each backend's own sumsq.
TEST(op_adamw_sumsq_add) {
    backends();
    size_t n = 1000, words = (n + 255) / 256;
    double *p = rand_doubles(120, n, -1, 1), *g = rand_doubles(121, n, -1, 1), *m = xcalloc(n, 8), *v = xcalloc(n, 8);
    float *fp = floats_of(p, n), *fg = floats_of(g, n), *fm = xcalloc(n, 4), *fv = xcalloc(n, 4);
    int32_t mask[4] = {0x5555aaaa, 0x0f0f0f0f, -1, 0x12345};  // bit j of word w: elements 8 (32 w + j) ..
    double st64[2], sched64[2];
    float sched32[2];
    double st32[2];
    for (int t = 1; t <= 3; t++) {
        R->sumsq(R, st64, g, n);
        C->sumsq(C, st32, fg, n);
        CHECK(fabs(st32[0] - st64[0]) <= 1e-6 * st64[0], "sumsq %g vs %g", st32[0], st64[0]);
        float clip = t == 2 ? (float)(0.5 * sqrt(st64[0])) : 0;  // step 2 clips its gradients by about half
        AdamwOpts o = {0.9f, 0.95f, 1e-8f, 0.1f, clip};
        sched32[0] = 1e-2f, sched32[1] = (float)t;
        sched64[0] = sched32[0], sched64[1] = t;
        AdamwIo r = {p, g, m, v, n, mask, sched64, st64}, c = {fp, fg, fm, fv, n, mask, sched32, st32};
        CHECK(!R->adamw(R, &o, &r) && !C->adamw(C, &o, &c), "%s", mn_last_error());
        CHECK(st64[1] == 0 && st32[1] == 0, "step %d refused: %g %g", t, st64[1], st32[1]);
    }
    CHECK(words == 4, "the mask's words");
    cmp("adamw p", fp, p, n, F32_TOL);
    cmp("adamw m", fm, m, n, F32_TOL);
    cmp("adamw v", fv, v, n, F32_TOL);
    // The first AdamW step moves every weight by lr (sign of g) plus decay where its bit is set:
    // elements 0-7 (bit 0 set) decay, 8-15 (bit 1 clear) do not.
    double q[16], dq[16], mq[16] = {0}, vq[16] = {0}, sq[2] = {0, 0}, lr1[2] = {0.1, 1};
    int32_t one[1] = {1};
    for (int i = 0; i < 16; i++) q[i] = 0.5, dq[i] = i % 2 ? -5 : 1e-3;
    for (int i = 0; i < 16; i++) sq[0] += dq[i] * dq[i];
    AdamwOpts o1 = {0.9f, 0.95f, 1e-12f, 0.5f, 0};
    AdamwIo io1 = {q, dq, mq, vq, 16, one, lr1, sq};
    CHECK(!R->adamw(R, &o1, &io1), "%s", mn_last_error());
    for (int i = 0; i < 16; i++) {
        double want = 0.5 - 0.1 * ((i % 2 ? -1 : 1) + (i < 8 ? 0.5 * 0.5 : 0));
        CHECK(fabs(q[i] - want) < 1e-6, "first step, element %d: %g, want %g", i, q[i], want);
    }
    // The clipping factor scales the gradients: the moments of gscale g, not of g (clip 1, |g| 4).
    double c[1] = {0}, dc[1] = {4}, mc[1] = {0}, vc[1] = {0}, sc[2] = {16, 0};
    AdamwOpts o2 = {0.9f, 0.95f, 1e-12f, 0, 1};
    AdamwIo io2 = {c, dc, mc, vc, 1, one, lr1, sc};
    CHECK(!R->adamw(R, &o2, &io2), "%s", mn_last_error());
    double m1 = (1 - (double)0.9f) * 4 * (float)(1.0 / 4), v1 = 1 - (double)0.95f;  // (1 - beta) (g / 4)^k, beta as passed (float)
    CHECK(fabs(mc[0] - m1) < 1e-15 && fabs(vc[0] - v1) < 1e-15, "clipped moments: %.17g %.17g", mc[0], vc[0]);
    // A non-finite norm: nothing changes, the refusal is flagged, on both backends.
    double pn[16], mn[16] = {0}, vn[16] = {0}, sn[2] = {NAN, 0};
    float fpn[16], fdq[16], fmn[16] = {0}, fvn[16] = {0}, fl[2] = {0.1f, 1};
    double fsn[2] = {INFINITY, 0};
    for (int i = 0; i < 16; i++) pn[i] = fpn[i] = 0.25f, fdq[i] = (float)dq[i];
    AdamwIo ion = {pn, dq, mn, vn, 16, one, lr1, sn}, fion = {fpn, fdq, fmn, fvn, 16, one, fl, fsn};
    CHECK(!R->adamw(R, &o1, &ion) && !C->adamw(C, &o1, &fion), "%s", mn_last_error());
    CHECK(sn[1] == 1 && fsn[1] == 1, "non-finite norm flagged: %g %g", sn[1], fsn[1]);
    for (int i = 0; i < 16; i++)
        CHECK(pn[i] == 0.25 && fpn[i] == 0.25f && mn[i] == 0 && fvn[i] == 0, "refused update changed element %d", i);
    // sum_f32 adds, in order: the CPU's is the host's sum of the same floats, exactly.
    double acc64[1] = {1.5}, acc32[1] = {1.5}, host = 0;
    R->sum_f32(R, acc64, g, n);
    C->sum_f32(C, acc32, fg, n);
    for (size_t i = 0; i < n; i++) host += fg[i];
    CHECK(acc32[0] == 1.5 + host, "cpu sum_f32 %.17g vs %.17g", acc32[0], 1.5 + host);
    CHECK(fabs(acc64[0] - acc32[0]) <= 1e-6 * n, "sum_f32 %g vs %g", acc32[0], acc64[0]);
    R->add(R, g, p, n);
    C->add(C, fg, fp, n);
    cmp("add", fg, g, n, F32_TOL);
    free(p); free(g); free(m); free(v); free(fp); free(fg); free(fm); free(fv);
}

// ---------------------------------------------------------------------------- copy_rows

// Strided row copies (attention's cache: a token of every sequence) against a plain loop, on both
// backends: exact (a copy), rows of odd length at odd strides, the rows around the copied ones
// untouched.
TEST(op_copy_rows) {
    backends();
    enum { ROWS = 5, N = 7, SS = 11, DS = 13 };
    double src[ROWS * SS], want[ROWS * DS], dr[ROWS * DS];
    float srcf[ROWS * SS], df[ROWS * DS];
    for (int i = 0; i < ROWS * SS; i++) srcf[i] = (float)(src[i] = i + 0.5);
    for (int i = 0; i < ROWS * DS; i++) want[i] = dr[i] = df[i] = (float)(-1 - i);
    for (int r = 0; r < ROWS; r++)
        for (int j = 0; j < N; j++) want[r * DS + 2 + j] = src[r * SS + 3 + j];
    R->copy_rows(R, dr + 2, DS, src + 3, SS, ROWS, N, MEM_ACT);
    C->copy_rows(C, df + 2, DS, srcf + 3, SS, ROWS, N, MEM_ACT);
    for (int i = 0; i < ROWS * DS; i++) {
        CHECK(dr[i] == want[i], "ref copy_rows: element %d is %g, want %g", i, dr[i], want[i]);
        CHECK(df[i] == (float)want[i], "cpu copy_rows: element %d is %g, want %g", i, df[i], want[i]);
    }
}
