/*
 * Small dense vector kernels for the recurrent forms, written as plain loops
 * that the compiler vectorises (the sizes, 16 to 256, are too small for BLAS
 * calls to pay off).
 */
#ifndef MN_VEC_H
#define MN_VEC_H

#include <stddef.h>

static inline float vdot(const float *a, const float *b, int n) {
    float s = 0;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
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
