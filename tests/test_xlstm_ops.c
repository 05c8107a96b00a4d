// The generic ops of the xLSTM blocks (core/backend.h: layernorm, headwise, scale_add): the float64
// reference against finite differences and against the definitions written out here, and the
// float32 CPU backend against the reference on awkward sizes, bit-identical for any thread count.
//
// Tolerances (relative, L2 over the tensor):
//  - FD_TOL 1e-6: central differences with h = 1e-6 in float64 have a truncation error of O(h^2)
//    and a rounding error of about 1e-16 / 1e-6 = 1e-10 of the loss's scale; measured 1e-10 ..
//    1e-9. A wrong term of a gradient shows up as O(1e-2 .. 1).
//  - DEF_TOL 1e-12: the reference against the same formulas in float64 (different order of
//    operations only).
//  - F32_TOL 1e-5: float32 (unit roundoff 6e-8; the inputs themselves rounded to float) against
//    float64, sums of up to 64 products (the 64 x 64 blocks) or N = 37 tokens, and LayerNorm's
//    gradient cancelling over groups of 4: a few 1e-7 expected; measured 4e-8 .. 6.4e-7 (layernorm
//    dx, groups of 4 with weights of D). Any indexing error is O(1).
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "core/backend.h"
#include "core/common.h"
#include "fd.h"
#include "test.h"

#define FD_TOL 1e-6
#define DEF_TOL 1e-12
#define F32_TOL 1e-5

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

// float32 (cpu) against float64 (ref), the measured error noted.
static void cmp(const char *what, const float *got, const double *want, size_t n, double tol) {
    double e = rel_err32(got, want, n);
    test_note("%-34s cpu vs ref: rel err %.2e", what, e);
    if (!(e <= tol)) test_fail(__FILE__, __LINE__, "%s: cpu vs ref rel err %.3g > %.3g", what, e, tol);
}

static void cmp64(const char *what, const double *got, const double *want, size_t n, double tol) {
    double e = rel_err64(got, want, n);
    if (!(e <= tol)) test_fail(__FILE__, __LINE__, "%s: rel err %.3g > %.3g", what, e, tol);
}

static double *copy64(const double *x, size_t n) {
    double *y = xcalloc(n ? n : 1, sizeof(double));
    memcpy(y, x, sizeof(double) * n);
    return y;
}

// ---------------------------------------------------------------------------- layernorm

typedef struct {
    int N, D, group, wlen;
    double *x, *w, *wy, *y, *mean, *rstd;
} LnCtx;

#define LN_EPS 1e-5f

static double ln_loss(void *p) {
    LnCtx *c = p;
    R->layernorm_fwd(R, c->y, c->mean, c->rstd, c->x, c->w, c->N, c->D, c->group, c->wlen, LN_EPS);
    return dot64(c->y, c->wy, (size_t)c->N * c->D);
}

// torch's LayerNorm / GroupNorm without bias, written out: the biased variance.
static void ln_definition(const LnCtx *c, double *y) {
    int per = c->D / c->group;
    for (size_t r = 0; r < (size_t)c->N * per; r++) {
        const double *xr = c->x + r * c->group;
        double m = 0, v = 0;
        for (int i = 0; i < c->group; i++) m += xr[i] / c->group;
        for (int i = 0; i < c->group; i++) v += (xr[i] - m) * (xr[i] - m) / c->group;
        for (int i = 0; i < c->group; i++) {
            double w = c->w[c->wlen == c->group ? i : (int)(r % per) * c->group + i];
            y[r * c->group + i] = (xr[i] - m) / sqrt(v + (double)LN_EPS) * w;
        }
    }
}

// N = 37 rows of D = 12: groups of 4 (three a row) with a shared weight and one of its own per
// group; whole rows. x is offset (mean ~1 beside a spread of ~1.2) so that centring matters.
TEST(op_layernorm) {
    backends();
    int cfg[3][2] = {{4, 4}, {4, 12}, {12, 12}};  // group, wlen
    for (int k = 0; k < 3; k++) {
        int N = 37, D = 12, group = cfg[k][0], wlen = cfg[k][1];
        size_t nd = (size_t)N * D, nr = nd / group;
        LnCtx c = {N, D, group, wlen, rand_doubles(200 + k, nd, -1, 3), rand_doubles(210 + k, wlen, 0.5, 1.5),
                   rand_doubles(220 + k, nd, -1, 1), xcalloc(nd, 8), xcalloc(nr, 8), xcalloc(nr, 8)};
        ln_loss(&c);
        double *want = xcalloc(nd, 8);
        ln_definition(&c, want);
        cmp64("layernorm y vs its definition", c.y, want, nd, DEF_TOL);
        double *dx0 = rand_doubles(230 + k, nd, -1, 1), *dx = copy64(dx0, nd), *dw = rand_doubles(240 + k, wlen, -1, 1);
        double *dw0 = copy64(dw, wlen);
        R->layernorm_bwd(R, dx, dw, c.wy, c.x, c.w, c.mean, c.rstd, N, D, group, wlen, 1);  // both accumulate
        for (size_t i = 0; i < nd; i++) dx[i] -= dx0[i];
        for (int i = 0; i < wlen; i++) dw[i] -= dw0[i];
        char name[80];
        snprintf(name, sizeof name, "layernorm dx (group %d, w %d)", group, wlen);
        fd_check(name, ln_loss, &c, c.x, dx, nd, FD_TOL);
        snprintf(name, sizeof name, "layernorm dw (group %d, w %d)", group, wlen);
        fd_check(name, ln_loss, &c, c.w, dw, wlen, FD_TOL);
        // float32: forward, then the backward overwriting and accumulating
        float *x = floats_of(c.x, nd), *w = floats_of(c.w, wlen), *wy = floats_of(c.wy, nd), *fdx0 = floats_of(dx0, nd);
        float *y = xcalloc(nd, 4), *mean = xcalloc(nr, 4), *rstd = xcalloc(nr, 4), *fdx = xcalloc(nd, 4);
        float *fdw = floats_of(dw0, wlen);
        ln_loss(&c);
        C->layernorm_fwd(C, y, mean, rstd, x, w, N, D, group, wlen, LN_EPS);
        cmp("layernorm y", y, c.y, nd, F32_TOL);
        cmp("layernorm mean", mean, c.mean, nr, F32_TOL);
        cmp("layernorm rstd", rstd, c.rstd, nr, F32_TOL);
        C->layernorm_bwd(C, fdx, fdw, wy, x, w, mean, rstd, N, D, group, wlen, 0);
        cmp("layernorm dx", fdx, dx, nd, F32_TOL);
        for (int i = 0; i < wlen; i++) dw[i] += dw0[i];
        cmp("layernorm dw (accumulated)", fdw, dw, wlen, F32_TOL);
        memcpy(fdx, fdx0, sizeof(float) * nd);
        C->layernorm_bwd(C, fdx, NULL, wy, x, w, mean, rstd, N, D, group, wlen, 1);
        for (size_t i = 0; i < nd; i++) dx[i] += dx0[i];
        cmp("layernorm dx (accumulated)", fdx, dx, nd, F32_TOL);
        free(c.x); free(c.w); free(c.wy); free(c.y); free(c.mean); free(c.rstd); free(want); free(dx0); free(dx);
        free(dw); free(dw0); free(x); free(w); free(wy); free(fdx0); free(y); free(mean); free(rstd); free(fdx);
        free(fdw);
    }
}

// ---------------------------------------------------------------------------- headwise

typedef struct {
    int N, nb, bin, bout;
    double *x, *w, *wy, *y;
} HwCtx;

static double hw_loss(void *p) {
    HwCtx *c = p;
    R->headwise_fwd(R, c->y, c->x, c->w, c->N, c->nb, c->bin, c->bout);
    return dot64(c->y, c->wy, (size_t)c->N * c->nb * c->bout);
}

// N = 37 tokens: 5 blocks of 4 x 4 (xLSTM's q/k/v), 3 of 7 in x 9 out (neither a power of two nor
// square), 4 of 64 x 64 (the sLSTM's gate projections: the CPU's product path). The reference
// against a dense linear layer whose weight is the block-diagonal matrix; finite differences on
// the two small shapes (the 64 x 64 one would take 1e10 operations; its loops are the same).
TEST(op_headwise) {
    backends();
    int cfg[3][3] = {{5, 4, 4}, {3, 7, 9}, {4, 64, 64}};
    for (int k = 0; k < 3; k++) {
        int N = 37, nb = cfg[k][0], bin = cfg[k][1], bout = cfg[k][2];
        size_t nx = (size_t)N * nb * bin, ny = (size_t)N * nb * bout, nw = (size_t)nb * bout * bin;
        HwCtx c = {N, nb, bin, bout, rand_doubles(300 + k, nx, -1, 1), rand_doubles(310 + k, nw, -1, 1),
                   rand_doubles(320 + k, ny, -1, 1), xcalloc(ny, 8)};
        hw_loss(&c);
        // the dense equivalent: W [nb bout, nb bin], zero off the diagonal blocks
        size_t I = (size_t)nb * bin, O = (size_t)nb * bout;
        double *dense = xcalloc(I * O, 8), *want = xcalloc(ny, 8);
        for (int b = 0; b < nb; b++)
            for (int o = 0; o < bout; o++)
                for (int i = 0; i < bin; i++)
                    dense[((size_t)b * bout + o) * I + (size_t)b * bin + i] = c.w[((size_t)b * bout + o) * bin + i];
        R->linear_fwd(R, want, c.x, dense, NULL, N, (int)I, (int)O);
        cmp64("headwise y vs the block-diagonal linear", c.y, want, ny, DEF_TOL);
        double *dx0 = rand_doubles(330 + k, nx, -1, 1), *dx = copy64(dx0, nx), *dw0 = rand_doubles(340 + k, nw, -1, 1);
        double *dw = copy64(dw0, nw);
        R->headwise_bwd(R, dx, dw, c.wy, c.x, c.w, N, nb, bin, bout, 1);
        for (size_t i = 0; i < nx; i++) dx[i] -= dx0[i];
        for (size_t i = 0; i < nw; i++) dw[i] -= dw0[i];
        char name[80];
        if (bin * bout <= 64) {
            snprintf(name, sizeof name, "headwise dx (%d x %d in %d)", bin, bout, nb);
            fd_check(name, hw_loss, &c, c.x, dx, nx, FD_TOL);
            snprintf(name, sizeof name, "headwise dw (%d x %d in %d)", bin, bout, nb);
            fd_check(name, hw_loss, &c, c.w, dw, nw, FD_TOL);
        } else {  // the gradients against the dense layer's instead
            double *ddx = xcalloc(nx, 8), *ddw = xcalloc(I * O, 8), *bw = xcalloc(nw, 8);
            R->linear_bwd(R, ddx, ddw, NULL, c.wy, c.x, dense, N, (int)I, (int)O, 0);
            for (int b = 0; b < nb; b++)
                for (int o = 0; o < bout; o++)
                    for (int i = 0; i < bin; i++)
                        bw[((size_t)b * bout + o) * bin + i] = ddw[((size_t)b * bout + o) * I + (size_t)b * bin + i];
            cmp64("headwise dx vs the dense layer's", dx, ddx, nx, DEF_TOL);
            cmp64("headwise dw vs the dense layer's", dw, bw, nw, DEF_TOL);
            free(ddx); free(ddw); free(bw);
        }
        float *x = floats_of(c.x, nx), *w = floats_of(c.w, nw), *wy = floats_of(c.wy, ny), *y = xcalloc(ny, 4);
        float *fdx = floats_of(dx0, nx), *fdw = floats_of(dw0, nw);
        C->headwise_fwd(C, y, x, w, N, nb, bin, bout);
        snprintf(name, sizeof name, "headwise y (%d x %d in %d)", bin, bout, nb);
        cmp(name, y, c.y, ny, F32_TOL);
        C->headwise_bwd(C, fdx, fdw, wy, x, w, N, nb, bin, bout, 1);
        for (size_t i = 0; i < nx; i++) dx[i] += dx0[i];
        for (size_t i = 0; i < nw; i++) dw[i] += dw0[i];
        snprintf(name, sizeof name, "headwise dx (accumulated, %d x %d)", bin, bout);
        cmp(name, fdx, dx, nx, F32_TOL);
        snprintf(name, sizeof name, "headwise dw (accumulated, %d x %d)", bin, bout);
        cmp(name, fdw, dw, nw, F32_TOL);
        C->headwise_bwd(C, fdx, NULL, wy, x, w, N, nb, bin, bout, 0);
        for (size_t i = 0; i < nx; i++) dx[i] -= dx0[i];
        snprintf(name, sizeof name, "headwise dx (%d x %d)", bin, bout);
        cmp(name, fdx, dx, nx, F32_TOL);
        free(c.x); free(c.w); free(c.wy); free(c.y); free(dense); free(want); free(dx0); free(dx); free(dw0); free(dw);
        free(x); free(w); free(wy); free(y); free(fdx); free(fdw);
    }
}

// ---------------------------------------------------------------------------- scale_add

typedef struct {
    int N, C;
    double *a, *s, *b, *wy, *y;
} SaCtx;

static double sa_loss(void *p) {
    SaCtx *c = p;
    R->scale_add_fwd(R, c->y, c->a, c->s, c->b, c->N, c->C);
    return dot64(c->y, c->wy, (size_t)c->N * c->C);
}

// N = 37 rows of C = 13 (not a multiple of the vector widths).
TEST(op_scale_add) {
    backends();
    int N = 37, Cn = 13;
    size_t n = (size_t)N * Cn;
    SaCtx c = {N, Cn, rand_doubles(400, n, -1, 1), rand_doubles(401, Cn, -2, 2), rand_doubles(402, n, -1, 1),
               rand_doubles(403, n, -1, 1), xcalloc(n, 8)};
    sa_loss(&c);
    double *want = xcalloc(n, 8);
    for (size_t i = 0; i < n; i++) want[i] = c.a[i] + c.s[i % Cn] * c.b[i];
    cmp64("scale_add y vs a + s b", c.y, want, n, DEF_TOL);
    double *db0 = rand_doubles(404, n, -1, 1), *db = copy64(db0, n), *ds0 = rand_doubles(405, Cn, -1, 1);
    double *ds = copy64(ds0, Cn);
    R->scale_add_bwd(R, db, ds, c.wy, c.b, c.s, N, Cn, 1);
    for (size_t i = 0; i < n; i++) db[i] -= db0[i];
    for (int i = 0; i < Cn; i++) ds[i] -= ds0[i];
    fd_check("scale_add db (accum)", sa_loss, &c, c.b, db, n, FD_TOL);
    fd_check("scale_add ds", sa_loss, &c, c.s, ds, Cn, FD_TOL);
    fd_check("scale_add da (= dy)", sa_loss, &c, c.a, c.wy, n, FD_TOL);
    float *a = floats_of(c.a, n), *s = floats_of(c.s, Cn), *b = floats_of(c.b, n), *wy = floats_of(c.wy, n);
    float *y = xcalloc(n, 4), *fdb = floats_of(db0, n), *fds = floats_of(ds0, Cn);
    sa_loss(&c);
    C->scale_add_fwd(C, y, a, s, b, N, Cn);
    cmp("scale_add y", y, c.y, n, F32_TOL);
    C->scale_add_fwd(C, a, a, s, b, N, Cn);  // in place: y aliases a
    CHECK(!memcmp(a, y, sizeof(float) * n), "scale_add in place differs from out of place");
    C->scale_add_bwd(C, fdb, fds, wy, b, s, N, Cn, 1);
    for (size_t i = 0; i < n; i++) db[i] += db0[i];
    for (int i = 0; i < Cn; i++) ds[i] += ds0[i];
    cmp("scale_add db (accumulated)", fdb, db, n, F32_TOL);
    cmp("scale_add ds (accumulated)", fds, ds, Cn, F32_TOL);
    C->scale_add_bwd(C, fdb, NULL, wy, b, s, N, Cn, 0);
    for (size_t i = 0; i < n; i++) db[i] -= db0[i];
    cmp("scale_add db", fdb, db, n, F32_TOL);
    free(c.a); free(c.s); free(c.b); free(c.wy); free(c.y); free(want); free(db0); free(db); free(ds0); free(ds);
    free(a); free(s); free(b); free(wy); free(y); free(fdb); free(fds);
}

// ------------------------------------------------------------- thread-count independence

// Every output of the three ops, run with `threads` OpenMP threads, one after another into out.
// Sizes over the parallel threshold (PAR_MIN = 32768 elements), several token blocks of the weight
// sums (256 tokens each), 4 x 4 blocks in several runs of 64, and 128 x 128 blocks whose products
// run in tiles, the weight gradient's cut into slices of the tokens (blas.c's rules for 1100 x 128
// x 128).
enum { TN = 1100, TD = 64, TG = 16, TNB = 150, TBIG = 128 };

static size_t thread_outputs(int threads, const float *in, float *out) {
    int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    size_t nd = (size_t)TN * TD, nx = (size_t)TN * TNB * 4, nbig = (size_t)TN * 4 * TBIG, o = 0;
    // layernorm, groups of 16 with weights of D
    float *y = out + o, *mean = y + nd, *rstd = mean + nd / TG, *dx = rstd + nd / TG, *dw = dx + nd;
    o += 3 * nd + 2 * nd / TG + TD;
    C->layernorm_fwd(C, y, mean, rstd, in, in + nd, TN, TD, TG, TD, 1e-5f);
    C->layernorm_bwd(C, dx, dw, in + 2 * nd, in, in + nd, mean, rstd, TN, TD, TG, TD, 0);
    // headwise 4 x 4 and 128 x 128
    float *hy = out + o, *hdx = hy + nx, *hdw = hdx + nx;
    o += 2 * nx + (size_t)TNB * 16;
    C->headwise_fwd(C, hy, in, in + nx, TN, TNB, 4, 4);
    C->headwise_bwd(C, hdx, hdw, in + 2 * nx, in, in + nx, TN, TNB, 4, 4, 0);
    float *by = out + o, *bdx = by + nbig, *bdw = bdx + nbig;
    o += 2 * nbig + 4 * TBIG * TBIG;
    C->headwise_fwd(C, by, in, in + nbig, TN, 4, TBIG, TBIG);
    C->headwise_bwd(C, bdx, bdw, in + 2 * nbig, in, in + nbig, TN, 4, TBIG, TBIG, 0);
    // scale_add over rows of D
    float *sy = out + o, *sdb = sy + nd, *sds = sdb + nd;
    o += 2 * nd + TD;
    C->scale_add_fwd(C, sy, in, in + nd, in + 2 * nd, TN, TD);
    C->scale_add_bwd(C, sdb, sds, in + 3 * nd, in + 2 * nd, in + nd, TN, TD, 0);
    omp_set_num_threads(saved);
    return o;
}

TEST(op_xlstm_ops_thread_count_independent) {
    backends();
    size_t nin = (size_t)4 * TN * TNB * 4, nout = 4 * nin;  // (ample for every input and output above)
    double *in64 = rand_doubles(500, nin, -1, 1);
    float *in = floats_of(in64, nin), *one = xcalloc(nout, 4), *many = xcalloc(nout, 4);
    size_t n = thread_outputs(1, in, one);
    CHECK(n <= nout, "output buffer too small: %zu > %zu", n, nout);
    for (int t = 2; t <= 3; t++) {
        memset(many, 0, sizeof(float) * nout);
        thread_outputs(t, in, many);
        size_t diff = 0;
        for (size_t i = 0; i < n; i++) diff += memcmp(one + i, many + i, sizeof(float)) != 0;
        test_note("%d threads: %zu of %zu outputs differ from 1 thread's", t, diff, n);
        CHECK(diff == 0, "%d threads: %zu of %zu outputs differ from 1 thread's", t, diff, n);
    }
    free(in64); free(in); free(one); free(many);
}
