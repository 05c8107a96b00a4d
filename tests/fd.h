// Finite-difference gradient checks in float64, shared by the op, layer and
// model tests.
#ifndef MN_TEST_FD_H
#define MN_TEST_FD_H

#include <stddef.h>

typedef double (*LossFn)(void *ctx);

// Central differences (step h) of loss(ctx) in every element of p[0..n), into num.
void fd_gradient(LossFn loss, void *ctx, double *p, size_t n, double h, double *num);

// Checks rel_err64(analytic, numeric) <= tol for one tensor, noting the error;
// returns the error.
double fd_check(const char *what, LossFn loss, void *ctx, double *p, const double *analytic, size_t n, double tol);

// The same with central differences of step h.
double fd_check_step(const char *what, LossFn loss, void *ctx, double *p, const double *analytic, size_t n, double tol,
                     double h);

// The rounding floor of differences of step h, relative to the analytic gradient's norm: each
// difference quotient carries the loss's own rounding, about 2^-52 `scale` (the sum of the
// magnitudes of the terms the loss adds up), divided by the step 2h. A tensor whose gradient is
// tiny against the loss (a gate bias whose effect a layer's normalisation nearly cancels) cannot
// be checked more closely than that with that step.
double fd_noise_floor(const double *analytic, size_t n, double scale, double h);

// Uniform random doubles in [lo, hi), and their float copies.
double *rand_doubles(unsigned long long seed, size_t n, double lo, double hi);
float *floats_of(const double *x, size_t n);

#endif
