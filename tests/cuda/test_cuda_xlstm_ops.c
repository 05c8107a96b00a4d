// The xLSTM and hawk blocks' generic ops on the GPU (layernorm in src/cuda/cuda_norm.cu; headwise,
// scale_add and the mLSTM gates in src/cuda/cuda_xlstm_ops.cu; bias in src/cuda/cuda_linear.cu;
// GELU's tanh approximation in src/cuda/cuda_elementwise.cu) against the float64 reference
// (src/ref/ref_backend.c; the CPU backend matches it to 1e-6, tests/test_xlstm_ops.c), and the
// mLSTM gates against their formulas in float64 here. Inputs the GPU holds in bf16 (activations,
// and the weights' copy that products read) are rounded to bf16 before the reference sees them,
// so both compute on the same numbers.
//
// Tolerances (relative, L2 over the tensor):
//  - BF16_TOL 4e-3: a bf16 output carries a rounding error of up to 2^-9 = 2e-3 of each element,
//    about 1.2e-3 in the L2 sense; the float32 arithmetic before it adds ~1e-6. Any real error
//    (an index, a missing term) shows up as O(0.1 .. 1).
//  - F32_TOL 2e-5: float32 outputs computed elementwise or over one group (mean, rstd, the gates):
//    a few float32 roundings each, ~1e-7.
//  - SUM_TOL 1e-4: weight gradients, float32 sums over up to N = 1500 tokens of products of bf16
//    values (exact in float32): rounding grows like sqrt(N) 6e-8 ~ 2e-6 for random signs, with
//    margin for the partial sums' order (strips, cuBLAS's split of k).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "core/backend.h"
#include "core/common.h"
#include "core/half.h"
#include "../fd.h"
#include "../test.h"

#define BF16_TOL 4e-3
#define F32_TOL 2e-5
#define SUM_TOL 1e-4

// The mLSTM gates' kernels (C linkage), called directly until a CUDA MlstmOps table holds them.
int g_mlstm_gates_fwd(const Backend *be, void *fg, void *ig, const void *a, const void *b, size_t n, float cap);
int g_mlstm_gates_bwd(const Backend *be, void *da, void *db, const void *dfg, const void *dig, const void *a,
                      const void *b, size_t n, float cap);

static const Backend *G, *R;

static int setup(void) {
    R = backend_ref();
    G = backend_cuda();
    if (!G) test_fail(__FILE__, __LINE__, "no CUDA backend: %s", mn_last_error());
    return G != NULL;
}

static void round_bf16(double *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = bf16_to_f32(f32_to_bf16((float)x[i]));
}

// Random values, rounded as the GPU keeps them (bf16 activations, float32 otherwise).
static double *input(uint64_t seed, size_t n, double lo, double hi, MemKind k) {
    double *x = rand_doubles(seed, n, lo, hi);
    if (k == MEM_ACT) round_bf16(x, n);
    else
        for (size_t i = 0; i < n; i++) x[i] = (float)x[i];
    return x;
}

static double *bf16_copy(const double *x, size_t n) {
    double *y = xcalloc(n ? n : 1, sizeof(double));
    memcpy(y, x, sizeof(double) * n);
    round_bf16(y, n);
    return y;
}

static double *copy64(const double *x, size_t n) {
    double *y = xcalloc(n ? n : 1, sizeof(double));
    memcpy(y, x, sizeof(double) * n);
    return y;
}

static void *to_gpu(const double *h, size_t n, MemKind k) {
    void *p = G->alloc(G, n, k);
    if (!p || G->upload(G, p, h, n, k)) die("%s", mn_last_error());
    return p;
}

static void *gpu_zeros(size_t n, MemKind k) {
    void *p = G->alloc(G, n, k);
    if (!p) die("%s", mn_last_error());
    return p;
}

static double *from_gpu(const void *p, size_t n, MemKind k) {
    double *h = xcalloc(n ? n : 1, sizeof(double));
    if (G->download(G, h, p, n, k)) die("%s", mn_last_error());
    return h;
}

static double cmp(const char *what, const void *gpu, const double *ref, size_t n, MemKind k, double tol) {
    double *h = from_gpu(gpu, n, k), e = rel_err64(h, ref, n);
    test_note("%-36s cuda vs float64: rel err %.2e", what, e);
    if (!(e <= tol)) test_fail(__FILE__, __LINE__, "%s: rel err %.3g > %.3g", what, e, tol);
    free(h);
    return e;
}

// Whether two float32 device buffers hold the same bits (the weight gradients' sums, run twice).
static void same_bits(const char *what, const void *a, const void *b, size_t n) {
    float *x = xcalloc(n, 4), *y = xcalloc(n, 4);
    CHECK(!G->download_f32(G, x, a, n, MEM_F32) && !G->download_f32(G, y, b, n, MEM_F32), "%s", mn_last_error());
    size_t diff = 0;
    for (size_t i = 0; i < n; i++) diff += memcmp(x + i, y + i, 4) != 0;
    CHECK(diff == 0, "%s: %zu of %zu values differ between two runs", what, diff, n);
    free(x);
    free(y);
}

// ------------------------------------------------------------------------------ layernorm

// D = 96: whole rows, heads of 32 with a shared weight and one of D, groups of 12 (rows not read
// 8 at a time), groups of 4 (4 lanes a row, 8 rows a warp) with a weight of D; 700 rows: the
// weight gradient's column sums over several strips. x spans [-1, 3]: a mean of ~1 beside a
// spread of ~1.2, so that the centring counts.
TEST(cuda_op_layernorm) {
    if (!setup()) return;
    int D = 96;
    int cfg[][3] = {{96, 96, 13}, {32, 32, 13}, {32, 96, 13}, {12, 12, 13}, {4, 96, 37}, {32, 32, 700}, {96, 96, 700}};
    for (size_t k = 0; k < sizeof cfg / sizeof cfg[0]; k++) {
        int group = cfg[k][0], wlen = cfg[k][1], N = cfg[k][2];
        size_t nd = (size_t)N * D, nr = nd / group;
        test_note("N %d, group %d, weight %d:", N, group, wlen);
        double *x = input(600 + k, nd, -1, 3, MEM_ACT), *w = input(610 + k, wlen, 0.5, 1.5, MEM_PARAM);
        double *dy = input(620 + k, nd, -1, 1, MEM_ACT), *dx0 = input(630 + k, nd, -1, 1, MEM_ACT);
        double *dw0 = input(640 + k, wlen, -1, 1, MEM_F32), *y = xcalloc(nd, 8), *mean = xcalloc(nr, 8);
        double *rstd = xcalloc(nr, 8), *dx = copy64(dx0, nd), *dw = copy64(dw0, wlen);
        R->layernorm_fwd(R, y, mean, rstd, x, w, N, D, group, wlen, 1e-5f);
        R->layernorm_bwd(R, dx, dw, dy, x, w, mean, rstd, N, D, group, wlen, 1);
        void *gx = to_gpu(x, nd, MEM_ACT), *gw = to_gpu(w, wlen, MEM_PARAM), *gdy = to_gpu(dy, nd, MEM_ACT);
        void *gdx = to_gpu(dx0, nd, MEM_ACT), *gdw = to_gpu(dw0, wlen, MEM_F32), *gy = gpu_zeros(nd, MEM_ACT);
        void *gm = gpu_zeros(nr, MEM_F32), *grs = gpu_zeros(nr, MEM_F32);
        CHECK(!G->layernorm_fwd(G, gy, gm, grs, gx, gw, N, D, group, wlen, 1e-5f) &&
                  !G->layernorm_bwd(G, gdx, gdw, gdy, gx, gw, gm, grs, N, D, group, wlen, 1),
              "%s", mn_last_error());
        cmp("layernorm y", gy, y, nd, MEM_ACT, BF16_TOL);
        cmp("layernorm mean", gm, mean, nr, MEM_F32, F32_TOL);
        cmp("layernorm rstd", grs, rstd, nr, MEM_F32, F32_TOL);
        cmp("layernorm dx (accumulated)", gdx, dx, nd, MEM_ACT, BF16_TOL);
        cmp("layernorm dw (accumulated)", gdw, dw, wlen, MEM_F32, SUM_TOL);
        // overwriting dx; dw's sums again from zero, twice: the same bits
        for (size_t i = 0; i < nd; i++) dx[i] -= dx0[i];
        void *gdw1 = gpu_zeros(wlen, MEM_F32), *gdw2 = gpu_zeros(wlen, MEM_F32);
        CHECK(!G->layernorm_bwd(G, gdx, gdw1, gdy, gx, gw, gm, grs, N, D, group, wlen, 0) &&
                  !G->layernorm_bwd(G, gdx, gdw2, gdy, gx, gw, gm, grs, N, D, group, wlen, 0),
              "%s", mn_last_error());
        cmp("layernorm dx", gdx, dx, nd, MEM_ACT, BF16_TOL);
        same_bits("layernorm dw", gdw1, gdw2, wlen);
        void *g[] = {gx, gw, gdy, gdx, gdw, gy, gm, grs, gdw1, gdw2};
        for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) G->free(G, g[i]);
        free(x); free(w); free(dy); free(dx0); free(dw0); free(y); free(mean); free(rstd); free(dx); free(dw);
    }
}

// ------------------------------------------------------------------------------- headwise

// {N, nb, bin, bout}: the CPU suite's shapes (4 x 4, 7 x 9: the plain kernels; 64 x 64: cuBLAS);
// xLSTM's q/k/v at d_in = 4000 (1000 blocks of 4 x 4) over 700 tokens: the weight gradient's
// column sums over several tiles and strips; 16 x 16, the largest blocks of the plain kernels,
// over 1500 tokens; 17 x 16, the smallest of cuBLAS's, at odd strides; the sLSTM's largest
// (4 heads of 512).
TEST(cuda_op_headwise) {
    if (!setup()) return;
    int cfg[][4] = {{37, 5, 4, 4},     {37, 3, 7, 9},   {37, 4, 64, 64},  {700, 1000, 4, 4},
                    {1500, 4, 16, 16}, {37, 2, 17, 16}, {129, 4, 512, 512}};
    for (size_t k = 0; k < sizeof cfg / sizeof cfg[0]; k++) {
        int N = cfg[k][0], nb = cfg[k][1], bin = cfg[k][2], bout = cfg[k][3];
        size_t nx = (size_t)N * nb * bin, ny = (size_t)N * nb * bout, nw = (size_t)nb * bout * bin;
        test_note("N %d, %d blocks of %d in x %d out:", N, nb, bin, bout);
        double *x = input(700 + k, nx, -1, 1, MEM_ACT), *w = input(710 + k, nw, -1, 1, MEM_PARAM);
        double *dy = input(720 + k, ny, -1, 1, MEM_ACT), *dx0 = input(730 + k, nx, -1, 1, MEM_ACT);
        double *dw0 = input(740 + k, nw, -1, 1, MEM_F32), *wb = bf16_copy(w, nw);  // products read w's bf16 copy
        double *y = xcalloc(ny, 8), *dx = copy64(dx0, nx), *dw = copy64(dw0, nw);
        R->headwise_fwd(R, y, x, wb, N, nb, bin, bout);
        R->headwise_bwd(R, dx, dw, dy, x, wb, N, nb, bin, bout, 1);
        void *gx = to_gpu(x, nx, MEM_ACT), *gw = to_gpu(w, nw, MEM_PARAM), *gdy = to_gpu(dy, ny, MEM_ACT);
        void *gdx = to_gpu(dx0, nx, MEM_ACT), *gdw = to_gpu(dw0, nw, MEM_F32), *gy = gpu_zeros(ny, MEM_ACT);
        CHECK(!G->headwise_fwd(G, gy, gx, gw, N, nb, bin, bout) &&
                  !G->headwise_bwd(G, gdx, gdw, gdy, gx, gw, N, nb, bin, bout, 1),
              "%s", mn_last_error());
        cmp("headwise y", gy, y, ny, MEM_ACT, BF16_TOL);
        cmp("headwise dx (accumulated)", gdx, dx, nx, MEM_ACT, BF16_TOL);
        cmp("headwise dw (accumulated)", gdw, dw, nw, MEM_F32, SUM_TOL);
        for (size_t i = 0; i < nx; i++) dx[i] -= dx0[i];
        void *gdw1 = gpu_zeros(nw, MEM_F32), *gdw2 = gpu_zeros(nw, MEM_F32);
        CHECK(!G->headwise_bwd(G, gdx, gdw1, gdy, gx, gw, N, nb, bin, bout, 0) &&
                  !G->headwise_bwd(G, gdx, gdw2, gdy, gx, gw, N, nb, bin, bout, 0),
              "%s", mn_last_error());
        cmp("headwise dx", gdx, dx, nx, MEM_ACT, BF16_TOL);
        same_bits("headwise dw", gdw1, gdw2, nw);
        // the weight must be a parameter allocation (its bf16 copy): anything else is refused
        CHECK(G->headwise_fwd(G, gy, gx, gdw, N, nb, bin, bout) == MN_ERR_ARG, "a float32 weight was not refused");
        void *g[] = {gx, gw, gdy, gdx, gdw, gy, gdw1, gdw2};
        for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) G->free(G, g[i]);
        free(x); free(w); free(dy); free(dx0); free(dw0); free(wb); free(y); free(dx); free(dw);
    }
}

// ------------------------------------------------------------------------------ scale_add

// C = 13: element by element; C = 1024 over 700 rows: 16-byte pieces, ds over several strips.
// The forward in place (y = a) too.
TEST(cuda_op_scale_add) {
    if (!setup()) return;
    int cfg[][2] = {{37, 13}, {700, 1024}};
    for (size_t k = 0; k < sizeof cfg / sizeof cfg[0]; k++) {
        int N = cfg[k][0], C = cfg[k][1];
        size_t n = (size_t)N * C;
        test_note("N %d, C %d:", N, C);
        double *a = input(800 + k, n, -1, 1, MEM_ACT), *s = input(810 + k, C, -2, 2, MEM_PARAM);
        double *b = input(820 + k, n, -1, 1, MEM_ACT), *dy = input(830 + k, n, -1, 1, MEM_ACT);
        double *db0 = input(840 + k, n, -1, 1, MEM_ACT), *ds0 = input(850 + k, C, -1, 1, MEM_F32);
        double *y = xcalloc(n, 8), *db = copy64(db0, n), *ds = copy64(ds0, C);
        R->scale_add_fwd(R, y, a, s, b, N, C);
        R->scale_add_bwd(R, db, ds, dy, b, s, N, C, 1);
        void *ga = to_gpu(a, n, MEM_ACT), *gs = to_gpu(s, C, MEM_PARAM), *gb = to_gpu(b, n, MEM_ACT);
        void *gdy = to_gpu(dy, n, MEM_ACT), *gdb = to_gpu(db0, n, MEM_ACT), *gds = to_gpu(ds0, C, MEM_F32);
        void *gy = gpu_zeros(n, MEM_ACT);
        CHECK(!G->scale_add_fwd(G, gy, ga, gs, gb, N, C) && !G->scale_add_bwd(G, gdb, gds, gdy, gb, gs, N, C, 1), "%s",
              mn_last_error());
        cmp("scale_add y", gy, y, n, MEM_ACT, BF16_TOL);
        cmp("scale_add db (accumulated)", gdb, db, n, MEM_ACT, BF16_TOL);
        cmp("scale_add ds (accumulated)", gds, ds, C, MEM_F32, SUM_TOL);
        CHECK(!G->scale_add_fwd(G, ga, ga, gs, gb, N, C), "%s", mn_last_error());
        cmp("scale_add y (in place)", ga, y, n, MEM_ACT, BF16_TOL);
        for (size_t i = 0; i < n; i++) db[i] -= db0[i];
        void *gds1 = gpu_zeros(C, MEM_F32), *gds2 = gpu_zeros(C, MEM_F32);
        CHECK(!G->scale_add_bwd(G, gdb, gds1, gdy, gb, gs, N, C, 0) && !G->scale_add_bwd(G, gdb, gds2, gdy, gb, gs, N, C, 0),
              "%s", mn_last_error());
        cmp("scale_add db", gdb, db, n, MEM_ACT, BF16_TOL);
        same_bits("scale_add ds", gds1, gds2, C);
        void *g[] = {ga, gs, gb, gdy, gdb, gds, gy, gds1, gds2};
        for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) G->free(G, g[i]);
        free(a); free(s); free(b); free(dy); free(db0); free(ds0); free(y); free(db); free(ds);
    }
}

// ---------------------------------------------------------------------------- bias

// y += b, db += column sums of dy: C = 13 over 37 rows (element by element), C = 1024 over 700
// (16-byte pieces, several strips). The sums run twice from zero: the same bits.
TEST(cuda_op_bias) {
    if (!setup()) return;
    int cfg[][2] = {{37, 13}, {700, 1024}};
    for (size_t k = 0; k < sizeof cfg / sizeof cfg[0]; k++) {
        int N = cfg[k][0], C = cfg[k][1];
        size_t n = (size_t)N * C;
        test_note("N %d, C %d:", N, C);
        double *y0 = input(900 + k, n, -1, 1, MEM_ACT), *b = input(910 + k, C, -2, 2, MEM_PARAM);
        double *dy = input(920 + k, n, -1, 1, MEM_ACT), *db0 = input(930 + k, C, -1, 1, MEM_F32);
        double *y = copy64(y0, n), *db = copy64(db0, C);
        R->bias_fwd(R, y, b, N, C);
        R->bias_bwd(R, db, dy, N, C);
        void *gy = to_gpu(y0, n, MEM_ACT), *gb = to_gpu(b, C, MEM_PARAM), *gdy = to_gpu(dy, n, MEM_ACT);
        void *gdb = to_gpu(db0, C, MEM_F32), *gdb1 = gpu_zeros(C, MEM_F32), *gdb2 = gpu_zeros(C, MEM_F32);
        CHECK(!G->bias_fwd(G, gy, gb, N, C) && !G->bias_bwd(G, gdb, gdy, N, C), "%s", mn_last_error());
        cmp("bias y", gy, y, n, MEM_ACT, BF16_TOL);
        cmp("bias db (accumulated)", gdb, db, C, MEM_F32, SUM_TOL);
        CHECK(!G->bias_bwd(G, gdb1, gdy, N, C) && !G->bias_bwd(G, gdb2, gdy, N, C), "%s", mn_last_error());
        same_bits("bias db", gdb1, gdb2, C);
        void *g[] = {gy, gb, gdy, gdb, gdb1, gdb2};
        for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) G->free(G, g[i]);
        free(y0); free(b); free(dy); free(db0); free(y); free(db);
    }
}

// ------------------------------------------------------------------- GELU, tanh approximation

// gelu_tanh alone (forward, backward, backward in place) and gating (geglu_tanh) over [-6, 6]:
// n = 37 (element by element), 4099 (16-byte pieces and a tail); outputs in bf16 (BF16_TOL).
TEST(cuda_op_gelu_tanh) {
    if (!setup()) return;
    size_t sizes[] = {37, 4099};
    for (size_t k = 0; k < 2; k++) {
        size_t n = sizes[k];
        test_note("n %zu:", n);
        double *g = input(940 + k, n, -6, 6, MEM_ACT), *u = input(950 + k, n, -2, 2, MEM_ACT);
        double *dy = input(960 + k, n, -1, 1, MEM_ACT);
        double *y = xcalloc(n, 8), *dx = xcalloc(n, 8), *h = xcalloc(n, 8), *dg = xcalloc(n, 8), *du = xcalloc(n, 8);
        R->gelu_tanh_fwd(R, y, g, n);
        R->gelu_tanh_bwd(R, dx, dy, g, n);
        R->geglu_tanh_fwd(R, h, g, u, n);
        R->geglu_tanh_bwd(R, dg, du, dy, g, u, n);
        void *gg = to_gpu(g, n, MEM_ACT), *gu = to_gpu(u, n, MEM_ACT), *gdy = to_gpu(dy, n, MEM_ACT);
        void *gy = gpu_zeros(n, MEM_ACT), *gdx = gpu_zeros(n, MEM_ACT), *gh = gpu_zeros(n, MEM_ACT);
        void *gdg = gpu_zeros(n, MEM_ACT), *gdu = gpu_zeros(n, MEM_ACT);
        CHECK(!G->gelu_tanh_fwd(G, gy, gg, n) && !G->gelu_tanh_bwd(G, gdx, gdy, gg, n) &&
                  !G->geglu_tanh_fwd(G, gh, gg, gu, n) && !G->geglu_tanh_bwd(G, gdg, gdu, gdy, gg, gu, n),
              "%s", mn_last_error());
        cmp("gelu_tanh y", gy, y, n, MEM_ACT, BF16_TOL);
        cmp("gelu_tanh dx", gdx, dx, n, MEM_ACT, BF16_TOL);
        cmp("geglu_tanh h", gh, h, n, MEM_ACT, BF16_TOL);
        cmp("geglu_tanh dg", gdg, dg, n, MEM_ACT, BF16_TOL);
        cmp("geglu_tanh du", gdu, du, n, MEM_ACT, BF16_TOL);
        CHECK(!G->gelu_tanh_bwd(G, gdy, gdy, gg, n), "%s", mn_last_error());
        cmp("gelu_tanh dx (in place)", gdy, dx, n, MEM_ACT, BF16_TOL);
        void *gp[] = {gg, gu, gdy, gy, gdx, gh, gdg, gdu};
        for (size_t i = 0; i < sizeof gp / sizeof gp[0]; i++) G->free(G, gp[i]);
        free(g); free(u); free(dy); free(y); free(dx); free(h); free(dg); free(du);
    }
}

// ---------------------------------------------------------------------------- mLSTM gates

// fg = logsigmoid(c tanh(a / c)), ig = c tanh(b / c) (c = 0: a, b uncapped), in float64.
static double capped(double v, double cap) { return cap > 0 ? cap * tanh(v / cap) : v; }
static double capped_grad(double v, double cap) { return cap > 0 ? 1 - tanh(v / cap) * tanh(v / cap) : 1; }
static double log_sigmoid(double u) { return u >= 0 ? -log1p(exp(-u)) : u - log1p(exp(u)); }

static void gates64(double *fg, double *ig, const double *a, const double *b, size_t n, double cap) {
    for (size_t i = 0; i < n; i++) {
        fg[i] = log_sigmoid(capped(a[i], cap));
        ig[i] = capped(b[i], cap);
    }
}

// da = dfg sigmoid(-a') c'(a), a' = c tanh(a / c);  db = dig c'(b)
static void gates64_bwd(double *da, double *db, const double *dfg, const double *dig, const double *a, const double *b,
                        size_t n, double cap) {
    for (size_t i = 0; i < n; i++) {
        da[i] = dfg[i] / (1 + exp(capped(a[i], cap))) * capped_grad(a[i], cap);
        db[i] = dig[i] * capped_grad(b[i], cap);
    }
}

typedef struct {
    size_t n;
    double cap, *a, *b, *wf, *wi, *fg, *ig;
} GateCtx;

static double gate_loss(void *p) {
    GateCtx *c = p;
    gates64(c->fg, c->ig, c->a, c->b, c->n, c->cap);
    double s = 0;
    for (size_t i = 0; i < c->n; i++) s += c->fg[i] * c->wf[i] + c->ig[i] * c->wi[i];
    return s;
}

// No cap, xLSTM-7B's 15, and 3 (tanh bent hard over a, b in [-30, 30]). The float64 formulas are
// checked against finite differences first (1e-6: as tests/test_ops.c's), then the kernels
// against them; n = 1003: a grid-stride tail.
TEST(cuda_op_mlstm_gates) {
    if (!setup()) return;
    size_t n = 1003;
    float caps[] = {0, 15, 3};
    for (int k = 0; k < 3; k++) {
        double cap = caps[k];
        test_note("cap %g:", cap);
        double *a = input(900 + k, n, -30, 30, MEM_ACT), *b = input(910 + k, n, -30, 30, MEM_ACT);
        double *dfg = input(920 + k, n, -1, 1, MEM_F32), *dig = input(930 + k, n, -1, 1, MEM_F32);
        double *fg = xcalloc(n, 8), *ig = xcalloc(n, 8), *da = xcalloc(n, 8), *db = xcalloc(n, 8);
        GateCtx c = {n, cap, a, b, dfg, dig, fg, ig};
        gates64_bwd(da, db, dfg, dig, a, b, n, cap);
        fd_check("mlstm gates da (float64)", gate_loss, &c, a, da, n, 1e-6);
        fd_check("mlstm gates db (float64)", gate_loss, &c, b, db, n, 1e-6);
        gates64(fg, ig, a, b, n, cap);
        void *ga = to_gpu(a, n, MEM_ACT), *gb = to_gpu(b, n, MEM_ACT), *gdfg = to_gpu(dfg, n, MEM_F32);
        void *gdig = to_gpu(dig, n, MEM_F32), *gfg = gpu_zeros(n, MEM_F32), *gig = gpu_zeros(n, MEM_F32);
        void *gda = gpu_zeros(n, MEM_ACT), *gdb = gpu_zeros(n, MEM_ACT);
        CHECK(!g_mlstm_gates_fwd(G, gfg, gig, ga, gb, n, (float)cap) &&
                  !g_mlstm_gates_bwd(G, gda, gdb, gdfg, gdig, ga, gb, n, (float)cap),
              "%s", mn_last_error());
        cmp("mlstm gates fg", gfg, fg, n, MEM_F32, F32_TOL);
        cmp("mlstm gates ig", gig, ig, n, MEM_F32, F32_TOL);
        cmp("mlstm gates da", gda, da, n, MEM_ACT, BF16_TOL);
        cmp("mlstm gates db", gdb, db, n, MEM_ACT, BF16_TOL);
        double *h = from_gpu(gfg, n, MEM_F32);
        int finite = 1, nonpos = 1;
        for (size_t i = 0; i < n; i++) finite &= isfinite(h[i]), nonpos &= h[i] <= 0;
        CHECK(finite && nonpos, "mlstm gates: fg must be finite and <= 0 (log of a sigmoid)");
        void *g[] = {ga, gb, gdfg, gdig, gfg, gig, gda, gdb};
        for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) G->free(G, g[i]);
        free(a); free(b); free(dfg); free(dig); free(fg); free(ig); free(da); free(db); free(h);
    }
}
