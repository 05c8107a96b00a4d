// Benchmarks behind `mesanet bench`, and their shared helpers.
#ifndef MN_BENCH_H
#define MN_BENCH_H

#include "core/backend.h"

int bench_mesa(int argc, char **argv);
int bench_train(int argc, char **argv);
int bench_mesa_gpu(int argc, char **argv);

double bench_median(double *t, int n);
// Best-of-reps rate of an n x n x n sgemm with the current threads.
double bench_sgemm_gflops(int n, int reps);
// Best-of-10 rate of an n x n x n bf16 product through a backend's linear op (TFLOP/s).
double bench_gemm_tflops(const Backend *be, int n);

#endif
