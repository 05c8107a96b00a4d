/*
 * Small dense vector kernels for the recurrent forms, written as plain loops
 * that the compiler vectorises (the sizes, 16 to 256, are too small for BLAS
 * calls to pay off).
 */
#ifndef MN_VEC_H
#define MN_VEC_H

#include <stddef.h>

// a . b with 16 partial sums: ISO C forbids reassociating a single running
// sum, which compiles to a chain of dependent scalar adds (4 cycles each); the
// partial sums vectorise into one register of multiply-adds.
static inline float vdot(const float *restrict a, const float *restrict b, int n) {
    float acc[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) acc[j] += a[i + j] * b[i + j];
    float s = 0;
    for (; i < n; i++) s += a[i] * b[i];
    for (int j = 0; j < 8; j++) acc[j] += acc[j + 8];
    for (int j = 0; j < 4; j++) acc[j] += acc[j + 4];
    return s + (acc[0] + acc[2]) + (acc[1] + acc[3]);
}

// y = A x, A rows x cols row-major (one dot product per row).
static inline void matvec(float *restrict y, const float *restrict a, const float *restrict x, int rows, int cols) {
    for (int i = 0; i < rows; i++) y[i] = vdot(a + (size_t)i * cols, x, cols);
}

// y = A^T x, A rows x cols row-major (a sum of scaled rows: no horizontal
// reductions, so it is also the fast way to apply a symmetric matrix).
static inline void matvec_t(float *restrict y, const float *restrict a, const float *restrict x, int rows,
                            int cols) {
    for (int j = 0; j < cols; j++) y[j] = 0;
    for (int i = 0; i < rows; i++) {
        const float *ai = a + (size_t)i * cols;
        float xi = x[i];
        for (int j = 0; j < cols; j++) y[j] += xi * ai[j];
    }
}

// y = A x for a symmetric n x n A whose size is a compile-time constant once
// inlined: y lives in registers, split over two accumulators so that the
// multiply-adds of consecutive rows do not wait on each other (2.7x the
// generic loop at n = 64 on one Zen 5 core).
static inline __attribute__((always_inline)) void symv_fixed(float *restrict y, const float *restrict a,
                                                             const float *restrict x, const int n) {
    float y0[n], y1[n];
    for (int j = 0; j < n; j++) y0[j] = y1[j] = 0;
    for (int i = 0; i < n; i += 2) {
        const float *a0 = a + (size_t)i * n, *a1 = a0 + n;
        float x0 = x[i], x1 = x[i + 1];
        for (int j = 0; j < n; j++) {
            y0[j] += x0 * a0[j];
            y1[j] += x1 * a1[j];
        }
    }
    for (int j = 0; j < n; j++) y[j] = y0[j] + y1[j];
}

// y = A x for a symmetric n x n A: the specialised kernel for common head sizes.
static inline void symv(float *restrict y, const float *restrict a, const float *restrict x, int n) {
    switch (n) {
    case 16: symv_fixed(y, a, x, 16); break;
    case 32: symv_fixed(y, a, x, 32); break;
    case 64: symv_fixed(y, a, x, 64); break;
    case 128: symv_fixed(y, a, x, 128); break;
    default: matvec_t(y, a, x, n, n);
    }
}

// A = decay A + c u w^T, A rows x cols: one token's state update.
static inline void decay_rank1(float *restrict a, float decay, float c, const float *restrict u,
                               const float *restrict w, int rows, int cols) {
    for (int i = 0; i < rows; i++) {
        float *ai = a + (size_t)i * cols;
        float cu = c * u[i];
        for (int j = 0; j < cols; j++) ai[j] = decay * ai[j] + cu * w[j];
    }
}

#endif
