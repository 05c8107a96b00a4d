#include "fd.h"

#include <math.h>
#include <stdlib.h>

#include "core/common.h"
#include "test.h"

void fd_gradient(LossFn loss, void *ctx, double *p, size_t n, double h, double *num) {
    for (size_t i = 0; i < n; i++) {
        double v = p[i];
        p[i] = v + h;
        double lp = loss(ctx);
        p[i] = v - h;
        double lm = loss(ctx);
        p[i] = v;
        num[i] = (lp - lm) / (2 * h);
    }
}

double fd_check(const char *what, LossFn loss, void *ctx, double *p, const double *analytic, size_t n, double tol) {
    return fd_check_step(what, loss, ctx, p, analytic, n, tol, 1e-6);
}

double fd_check_step(const char *what, LossFn loss, void *ctx, double *p, const double *analytic, size_t n, double tol,
                     double h) {
    double *num = xcalloc(n, sizeof(double));
    fd_gradient(loss, ctx, p, n, h, num);
    double e = rel_err64(analytic, num, n);
    test_note("%-28s grad vs finite differences: rel err %.2e", what, e);
    if (!(e <= tol)) test_fail(__FILE__, __LINE__, "%s: gradient rel err %.3g > %.3g", what, e, tol);
    free(num);
    return e;
}

double fd_noise_floor(const double *analytic, size_t n, double scale, double h) {
    double g = 0;
    for (size_t i = 0; i < n; i++) g += analytic[i] * analytic[i];
    double per = 0x1p-52 * scale / (2 * h);
    return g > 0 ? per * sqrt((double)n) / sqrt(g) : 0;
}

double *rand_doubles(unsigned long long seed, size_t n, double lo, double hi) {
    MnRng r;
    mn_rng_seed(&r, seed);
    double *x = xcalloc(n ? n : 1, sizeof(double));
    for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * mn_rng_uniform(&r);
    return x;
}

float *floats_of(const double *x, size_t n) {
    float *y = xcalloc(n ? n : 1, sizeof(float));
    for (size_t i = 0; i < n; i++) y[i] = (float)x[i];
    return y;
}
