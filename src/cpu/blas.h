/*
 * Row-major matrix products through CBLAS, with the argument order of the
 * math: C = alpha op(A) op(B) + beta C, where op(A) is m x k and op(B) k x n.
 *
 * The same bits for any thread count: a threaded BLAS may split a product's
 * sums differently with another number of threads (OpenBLAS blocks k one way
 * single-threaded and another way threaded), which would make every CPU result
 * depend on OMP_NUM_THREADS. So gemm cuts C into tiles (or a long inner
 * dimension into slices summed in order) by a rule of (m, n, k) alone, runs each
 * piece as a single-threaded BLAS call and spreads the pieces over our own OpenMP
 * threads (one after another when called from inside a parallel region). Any CBLAS that computes one call the same way each time
 * gives results independent of the thread count: OpenBLAS (its OpenMP build
 * honours the per-call limit of one thread; the pthreads build is set to one
 * thread by gemm_init) and the reference CBLAS do.
 */
#ifndef MN_BLAS_H
#define MN_BLAS_H

void gemm(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda, const float *b,
          int ldb, float beta, float *c, int ldc);

// How gemm cuts an m x n product with inner size k (a function of the sizes alone; for the tests):
// C's rows in tiles of mb and its columns in tiles of nb, or the inner dimension in slices of kb
// whose products are summed in order (kb = k: none).
typedef struct {
    int mb, nb, kb;
} GemmTiles;
void gemm_tiles(int m, int n, int k, GemmTiles *t);

#endif
