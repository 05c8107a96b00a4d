// Matrix products in tiles of a fixed grid, each a single-threaded BLAS call (blas.h says why).
#include "blas.h"

#include <cblas.h>
#include <omp.h>
#include <stdio.h>

// A tile is worth a call of its own from this much work on (flops): below it, the call and the
// packing of its operands cost a noticeable part of the product.
#define TILE_MIN_FLOPS (4.0 * 1024 * 1024)
#define MAX_TILES 64
#define TILE_ALIGN 64  // tile edges at multiples of 64 rows/columns: whole micro-kernel blocks

static int ceil_div(long a, long b) { return (int)((a + b - 1) / b); }
static int round_up(int a, int to) { return (a + to - 1) / to * to; }

void gemm_tiles(int m, int n, int k, int *mb, int *nb) {
    double flops = 2.0 * m * n * k;
    int want = flops / TILE_MIN_FLOPS >= MAX_TILES ? MAX_TILES : (int)(flops / TILE_MIN_FLOPS);
    *mb = m, *nb = n;
    if (want <= 1) return;
    // Cut the longer side first, then the other with what is left of the tile budget.
    int *first = m >= n ? mb : nb, *second = m >= n ? nb : mb;
    int len1 = *first, len2 = *second;
    int t1 = ceil_div(len1, TILE_ALIGN) < want ? ceil_div(len1, TILE_ALIGN) : want;
    *first = round_up(ceil_div(len1, t1), TILE_ALIGN);
    int t1_real = ceil_div(len1, *first), left = want / t1_real;
    int t2 = ceil_div(len2, TILE_ALIGN) < left ? ceil_div(len2, TILE_ALIGN) : left;
    if (t2 > 1) *second = round_up(ceil_div(len2, t2), TILE_ALIGN);
    if (*first > len1) *first = len1;
    if (*second > len2) *second = len2;
}

// One tile through the BLAS, single-threaded: the OpenMP build of OpenBLAS takes its thread count
// from the calling task's nthreads ICV, which omp_set_num_threads sets for this task alone.
static void tile_call(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda,
                      const float *b, int ldb, float beta, float *c, int ldc) {
    int saved = omp_get_max_threads();
    if (saved != 1) omp_set_num_threads(1);
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k,
                alpha, a, lda, b, ldb, beta, c, ldc);
    if (saved != 1) omp_set_num_threads(saved);
}

void gemm(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda, const float *b,
          int ldb, float beta, float *c, int ldc) {
    if (m <= 0 || n <= 0) return;
    if (k <= 0) {  // BLAS leaves C untouched when k = 0; the math says C = beta C
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) c[(long)i * ldc + j] = beta == 0 ? 0 : beta * c[(long)i * ldc + j];
        return;
    }
    int mb, nb;
    gemm_tiles(m, n, k, &mb, &nb);
    int tm = ceil_div(m, mb), tn = ceil_div(n, nb), tiles = tm * tn;
#pragma omp parallel for schedule(dynamic, 1) if (tiles > 1 && !omp_in_parallel())
    for (int t = 0; t < tiles; t++) {
        int i0 = t / tn * mb, j0 = t % tn * nb;
        int mi = m - i0 < mb ? m - i0 : mb, nj = n - j0 < nb ? n - j0 : nb;
        // op(A)'s rows i0.. are A's rows (columns when transposed); op(B)'s columns j0.. likewise
        const float *ai = trans_a ? a + i0 : a + (long)i0 * lda;
        const float *bj = trans_b ? b + (long)j0 * ldb : b + j0;
        tile_call(trans_a, trans_b, mi, nj, k, alpha, ai, lda, bj, ldb, beta, c + (long)i0 * ldc + j0, ldc);
    }
}

#ifdef OPENBLAS_VERSION
// The pthreads build of OpenBLAS ignores the OpenMP thread count: it is set to one thread here,
// once, before any product (our tiles run in parallel instead).
__attribute__((constructor)) static void blas_one_thread(void) {
    if (openblas_get_parallel() == 1) openblas_set_num_threads(1);
}

const char *blas_name(void) {
    static char name[96];
    snprintf(name, sizeof name, "OpenBLAS %s", openblas_get_corename());
    return name;
}
#else
const char *blas_name(void) { return "CBLAS"; }
#endif
