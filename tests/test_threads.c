// CPU results do not depend on the number of threads: the same losses and weights, bit for bit.
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "core/common.h"
#include "cpu/blas.h"
#include "model/model.h"
#include "test.h"
#include "tmpdir.h"
#include "toy.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

// A model just large enough that every parallel path of the CPU backend runs on several threads:
// elementwise loops over more than PAR_MIN elements (N * F = 256 x 352), matrix products of many
// tiles, more (sequence, head) pairs than threads in the mixer cores.
static const char *const family_configs[][2] = {
    {"mesa", "{\"preset\":\"tiny\",\"mixer\":\"mesa\",\"dim\":128,\"head_dim\":32,\"n_heads\":4,\"mlp_hidden\":352}"},
    {"gdn", "{\"preset\":\"tiny\",\"mixer\":\"gdn\",\"dim\":128,\"head_dim\":32,\"n_heads\":4,\"mlp_hidden\":352}"},
    {"gdn-paper", "{\"preset\":\"tiny\",\"mixer\":\"gdn-paper\",\"dim\":128,\"head_dim\":32,\"n_heads\":4,"
                  "\"mlp_hidden\":352,\"output_gate\":true}"},
    {"mamba2", "{\"preset\":\"tiny\",\"mixer\":\"mamba2\",\"dim\":128,\"head_dim\":32,\"n_heads\":4,\"mlp_hidden\":352}"},
    {"mha,swa", "{\"preset\":\"tiny\",\"mixer\":\"mha,swa\",\"dim\":128,\"head_dim\":32,\"n_heads\":4,"
                "\"mlp_hidden\":352,\"window\":8}"},
};

// Trains the config in `json` for 6 steps with `threads` OpenMP threads into `out`; fills the loss
// history and returns the final weights (malloc'ed, *n floats), or NULL after a test failure.
static float *train_with_threads(const char *tmp, const char *data, const char *json, int threads, const char *out,
                                 double *losses, int *nloss, size_t *n) {
    char cfg[512];
    snprintf(cfg, sizeof cfg, "%s/config-%d.json", tmp, threads);
    FILE *f = fopen(cfg, "w");
    if (!f) {
        CHECK(0, "cannot write %s", cfg);
        return NULL;
    }
    fputs(json, f);
    fclose(f);
    TrainOptions o = toy_train_options(data, out);
    o.config = cfg;
    o.batch = 8;
    o.seq = 32;
    o.steps = 6;
    o.warmup = 2;
    o.eval_every = 3;
    o.cg_steps = strstr(json, "\"mesa\"") ? 8 : 0;  // (--cg-steps is refused where no layer solves with CG)
    int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    FILE *devnull = fopen("/dev/null", "w");
    int st = train_run(&o, devnull);
    fclose(devnull);
    omp_set_num_threads(saved);
    if (st) {
        CHECK(0, "training with %d threads: %s", threads, mn_last_error());
        return NULL;
    }
    *nloss = read_losses(out, losses, 16);
    Model *m = NULL;
    if (checkpoint_load_model(out, backend_cpu(), &m)) {
        CHECK(0, "%s", mn_last_error());
        return NULL;
    }
    float *w = malloc(sizeof(float) * m->total);
    if (w) memcpy(w, m->params, sizeof(float) * m->total);
    *n = m->total;
    model_free(m);
    return w;
}

TEST(cpu_training_is_bit_identical_for_1_2_3_threads) {
    TmpDir t;
    tmp_make(&t);
    char data[256];
    snprintf(data, sizeof data, "%s/data", t.dir);
    write_toy_shards(data);
    for (size_t c = 0; c < sizeof family_configs / sizeof family_configs[0]; c++) {
        double loss[3][16];
        int nloss[3] = {0};
        size_t n[3] = {0};
        float *w[3] = {NULL};
        for (int i = 0; i < 3; i++) {
            char out[300];
            snprintf(out, sizeof out, "%s/run-%zu-%d", t.dir, c, i + 1);
            w[i] = train_with_threads(t.dir, data, family_configs[c][1], i + 1, out, loss[i], &nloss[i], &n[i]);
        }
        for (int i = 1; i < 3 && w[0]; i++) {
            if (!w[i]) continue;
            CHECK(nloss[i] == nloss[0] && nloss[0] == 6, "%s: %d and %d loss rows", family_configs[c][0], nloss[0],
                  nloss[i]);
            int same_loss = nloss[i] == nloss[0], first = -1;
            for (int s = 0; s < nloss[0] && s < nloss[i]; s++)
                if (loss[i][s] != loss[0][s] && first < 0) first = s;
            same_loss &= first < 0;
            CHECK(same_loss, "%s: the losses with %d threads differ from 1 thread's (step %d: %.17g vs %.17g)",
                  family_configs[c][0], i + 1, first + 1, first >= 0 ? loss[i][first] : 0, first >= 0 ? loss[0][first] : 0);
            CHECK(n[i] == n[0] && !memcmp(w[i], w[0], sizeof(float) * n[0]),
                  "%s: the weights after training with %d threads differ from 1 thread's", family_configs[c][0], i + 1);
        }
        if (w[0]) test_note("%s: loss %.9f -> %.9f with 1, 2 and 3 threads", family_configs[c][0], loss[0][0],
                            loss[0][nloss[0] > 0 ? nloss[0] - 1 : 0]);
        for (int i = 0; i < 3; i++) free(w[i]);
    }
    tmp_remove(&t);
}

// gemm's cuts depend on the sizes alone, cover C (and k) exactly and fall at multiples of 64.
TEST(cpu_gemm_tiles_follow_the_sizes_alone) {
    const int sizes[][3] = {{1, 1, 1}, {7, 5, 3}, {4096, 256, 192}, {576, 192, 4096}, {100003, 3, 17}, {65, 4097, 512}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        int m = sizes[i][0], n = sizes[i][1], k = sizes[i][2];
        GemmTiles t;
        gemm_tiles(m, n, k, &t);
        int pieces = ((m + t.mb - 1) / t.mb) * ((n + t.nb - 1) / t.nb) * ((k + t.kb - 1) / t.kb);
        CHECK(t.mb >= 1 && t.mb <= m && t.nb >= 1 && t.nb <= n && t.kb >= 1 && t.kb <= k, "%d x %d x %d: %d, %d, %d", m,
              n, k, t.mb, t.nb, t.kb);
        CHECK((t.mb == m || t.mb % 64 == 0) && (t.nb == n || t.nb % 64 == 0) && (t.kb == k || t.kb % 64 == 0),
              "%d x %d x %d: cuts %d, %d, %d not at 64s", m, n, k, t.mb, t.nb, t.kb);
        CHECK(pieces <= 64 && (t.kb == k || (t.mb == m && t.nb == n)), "%d x %d x %d: %d pieces", m, n, k, pieces);
    }
    GemmTiles t;
    gemm_tiles(4096, 256, 192, &t);
    CHECK(t.mb < 4096 && t.kb == 192, "a 4096 x 256 x 192 product (403 MFLOP) is not cut in rows (%d, %d, %d)", t.mb,
          t.nb, t.kb);
    gemm_tiles(576, 192, 4096, &t);
    CHECK(t.kb < 4096 && t.mb == 576 && t.nb == 192, "a weight gradient 576 x 192 over 4096 tokens is not cut in k "
          "(%d, %d, %d)", t.mb, t.nb, t.kb);
}

// A product gives the same bits with 1, 2 and 3 threads, inside and outside a parallel region, on
// sizes that are not multiples of the cuts: one whose C is cut in rows, one whose k is cut in
// slices; and it is the product (float64 check: 1e-5, float32 sums of a few thousand terms).
static void check_gemm_threads(int m, int n, int k, const char *what) {
    float *a = malloc(sizeof(float) * m * k), *b = malloc(sizeof(float) * k * n), *c[4];
    MnRng r;
    mn_rng_seed(&r, 3);
    for (int i = 0; i < m * k; i++) a[i] = (float)mn_rng_normal(&r);
    for (int i = 0; i < k * n; i++) b[i] = (float)mn_rng_normal(&r);
    int saved = omp_get_max_threads();
    for (int v = 0; v < 4; v++) {
        c[v] = calloc((size_t)m * n, sizeof(float));
        for (int i = 0; i < m * n; i++) c[v][i] = 1;  // beta = 0.5 below: C is read too
        if (v < 3) {
            omp_set_num_threads(v + 1);
            gemm(0, 0, m, n, k, 1, a, k, b, n, 0.5f, c[v], n);
        } else {  // from inside a parallel region of 2 threads, as the mixer cores call it
            omp_set_num_threads(2);
#pragma omp parallel num_threads(2)
            {
#pragma omp single
                gemm(0, 0, m, n, k, 1, a, k, b, n, 0.5f, c[v], n);
            }
        }
    }
    omp_set_num_threads(saved);
    for (int v = 1; v < 4; v++)
        CHECK(!memcmp(c[v], c[0], sizeof(float) * m * n), "%s: variant %d (%s) differs from one thread's", what, v,
              v < 3 ? "more threads" : "inside a parallel region");
    double *want = calloc((size_t)m * n, sizeof(double));
    for (int i = 0; i < m; i++)
        for (int p = 0; p < k; p++)
            for (int j = 0; j < n; j++) want[(size_t)i * n + j] += (double)a[(size_t)i * k + p] * b[(size_t)p * n + j];
    for (int i = 0; i < m * n; i++) want[i] += 0.5;
    double e = rel_err32(c[0], want, (size_t)m * n);
    test_note("%s: %d x %d x %d, rel err %.2e against float64", what, m, n, k, e);
    CHECK(e <= 1e-5, "%s: rel err %.3g against the float64 product", what, e);
    for (int v = 0; v < 4; v++) free(c[v]);
    free(want);
    free(a);
    free(b);
}

TEST(cpu_gemm_is_bit_identical_for_any_thread_count) {
    GemmTiles t;
    gemm_tiles(1000, 333, 517, &t);
    CHECK(t.mb < 1000 && t.kb == 517, "the first product is not cut in rows");
    check_gemm_threads(1000, 333, 517, "rows cut");
    gemm_tiles(200, 133, 3001, &t);
    CHECK(t.kb < 3001, "the second product is not cut in k");
    check_gemm_threads(200, 133, 3001, "k cut");
}
