/*
 * Row-major matrix products through CBLAS, with the argument order of the
 * math: C = alpha op(A) op(B) + beta C, where op(A) is m x k and op(B) k x n.
 */
#ifndef MN_BLAS_H
#define MN_BLAS_H

#include <cblas.h>

static inline void gemm(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda,
                        const float *b, int ldb, float beta, float *c, int ldc) {
    if (m <= 0 || n <= 0) return;
    if (k <= 0) {  // BLAS leaves C untouched when k = 0; the math says C = beta C
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) c[(long)i * ldc + j] = beta == 0 ? 0 : beta * c[(long)i * ldc + j];
        return;
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k,
                alpha, a, lda, b, ldb, beta, c, ldc);
}

#endif
