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

// Uniform random doubles in [lo, hi), and their float copies.
double *rand_doubles(unsigned long long seed, size_t n, double lo, double hi);
float *floats_of(const double *x, size_t n);

#endif
