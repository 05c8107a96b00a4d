// Matrix products in pieces cut by a rule of their sizes, each a single-threaded BLAS call (blas.h says why).
#include "blas.h"

#include <cblas.h>
#include <omp.h>
#include <stdlib.h>

// A tile is worth a call of its own from this much work on (flops), and from this many rows or
// columns on: each tile packs its own copy of the operand it shares with the others (the whole of
// op(B) when the rows of C are cut), so thin tiles spend more on packing than on products.
#define TILE_MIN_FLOPS (16.0 * 1024 * 1024)
#define TILE_MIN_EDGE 128
#define MAX_TILES 64
#define TILE_ALIGN 64  // tile edges at multiples of 64 rows/columns: whole micro-kernel blocks
// A long inner dimension (a weight's gradient: k the batch's tokens, C as small as the weight) is
// cut into slices of KSLICE whose products are summed in order, rather than C into tiles too small
// to share out.
#define KSLICE 512

static int ceil_div(long a, long b) { return (int)((a + b - 1) / b); }
static int round_up(int a, int to) { return (a + to - 1) / to * to; }

void gemm_tiles(int m, int n, int k, GemmTiles *t) {
    double flops = 2.0 * m * n * k;
    int len = m >= n ? m : n;
    int want = flops / TILE_MIN_FLOPS >= MAX_TILES ? MAX_TILES : (int)(flops / TILE_MIN_FLOPS);
    t->mb = m, t->nb = n, t->kb = k;
    if (want <= 1) return;
    if (k >= 2 * KSLICE && k >= 4 * len) {
        int slices = ceil_div(k, KSLICE) < MAX_TILES ? ceil_div(k, KSLICE) : MAX_TILES;
        t->kb = round_up(ceil_div(k, slices), TILE_ALIGN);
        return;
    }
    // Only the longer side of C is cut: the operand of the other side is then packed once a tile,
    // and the cut one once in all.
    int tiles = want < len / TILE_MIN_EDGE ? want : len / TILE_MIN_EDGE;
    if (tiles <= 1) return;
    int edge = round_up(ceil_div(len, tiles), TILE_ALIGN);
    if (edge > len) edge = len;
    if (m >= n) t->mb = edge;
    else t->nb = edge;
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

// C = beta C + sum over the k slices of alpha op(A)_s op(B)_s, the slices' products each into a
// buffer of its own (in parallel), then added in the slices' order (in parallel over C's rows).
// 0, or -1 where the buffer cannot be had.
static int gemm_sliced(int trans_a, int trans_b, int m, int n, int k, int kb, float alpha, const float *a, int lda,
                       const float *b, int ldb, float beta, float *c, int ldc) {
    int ns = ceil_div(k, kb);
    size_t mn = (size_t)m * n;
    float *part = malloc(sizeof(float) * mn * ns);
    if (!part) return -1;
    int outer = !omp_in_parallel();
#pragma omp parallel for schedule(dynamic, 1) if (outer)
    for (int s = 0; s < ns; s++) {
        int k0 = s * kb, ks = k - k0 < kb ? k - k0 : kb;
        const float *as = trans_a ? a + (long)k0 * lda : a + k0;
        const float *bs = trans_b ? b + k0 : b + (long)k0 * ldb;
        tile_call(trans_a, trans_b, m, n, ks, alpha, as, lda, bs, ldb, 0, part + mn * s, n);
    }
#pragma omp parallel for schedule(static, 16) if (outer && mn > 32768)
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            float sum = part[(size_t)i * n + j];
            for (int s = 1; s < ns; s++) sum += part[mn * s + (size_t)i * n + j];
            float *cij = c + (long)i * ldc + j;
            *cij = beta == 0 ? sum : beta * *cij + sum;
        }
    free(part);
    return 0;
}

void gemm(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda, const float *b,
          int ldb, float beta, float *c, int ldc) {
    if (m <= 0 || n <= 0) return;
    if (k <= 0) {  // BLAS leaves C untouched when k = 0; the math says C = beta C
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) c[(long)i * ldc + j] = beta == 0 ? 0 : beta * c[(long)i * ldc + j];
        return;
    }
    GemmTiles t;
    gemm_tiles(m, n, k, &t);
    // (Out of memory for the slices' buffer: C's tiles instead; still the same bits for any thread
    // count, though not those of the slices.)
    if (t.kb < k && !gemm_sliced(trans_a, trans_b, m, n, k, t.kb, alpha, a, lda, b, ldb, beta, c, ldc)) return;
    int tm = ceil_div(m, t.mb), tn = ceil_div(n, t.nb), tiles = tm * tn;
    if (tiles == 1) {  // (no OpenMP construct at all: the cores call small products by the million, and even
                       // an inactive parallel region costs libgomp a team and, waiting passively, futex calls)
        tile_call(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
#pragma omp parallel for schedule(dynamic, 1) if (!omp_in_parallel())
    for (int i = 0; i < tiles; i++) {
        int i0 = i / tn * t.mb, j0 = i % tn * t.nb;
        int mi = m - i0 < t.mb ? m - i0 : t.mb, nj = n - j0 < t.nb ? n - j0 : t.nb;
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
#endif
