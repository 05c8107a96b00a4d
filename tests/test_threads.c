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

// The tile grid of gemm depends on the sizes alone, covers C exactly and cuts at multiples of 64.
TEST(cpu_gemm_tiles_follow_the_sizes_alone) {
    const int sizes[][3] = {{1, 1, 1}, {7, 5, 3}, {4096, 256, 192}, {192, 704, 4096}, {100003, 3, 17}, {65, 4097, 512}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        int m = sizes[i][0], n = sizes[i][1], k = sizes[i][2], mb, nb;
        gemm_tiles(m, n, k, &mb, &nb);
        int tiles = ((m + mb - 1) / mb) * ((n + nb - 1) / nb);
        CHECK(mb >= 1 && mb <= m && nb >= 1 && nb <= n, "%d x %d x %d: tiles %d x %d", m, n, k, mb, nb);
        CHECK((mb == m || mb % 64 == 0) && (nb == n || nb % 64 == 0), "%d x %d x %d: tiles %d x %d not at 64s", m, n, k,
              mb, nb);
        CHECK(tiles <= 64, "%d x %d x %d: %d tiles", m, n, k, tiles);
    }
    int mb, nb;
    gemm_tiles(4096, 256, 192, &mb, &nb);
    CHECK(mb < 4096, "a 4096 x 256 x 192 product (403 MFLOP) is one tile (%d x %d)", mb, nb);
}

// A product gives the same bits with 1, 2 and 3 threads, inside and outside a parallel region,
// on sizes that are not multiples of the tiles.
TEST(cpu_gemm_is_bit_identical_for_any_thread_count) {
    int m = 1000, n = 333, k = 517;
    float *a = malloc(sizeof(float) * m * k), *b = malloc(sizeof(float) * k * n), *c[4];
    MnRng r;
    mn_rng_seed(&r, 3);
    for (int i = 0; i < m * k; i++) a[i] = (float)mn_rng_normal(&r);
    for (int i = 0; i < k * n; i++) b[i] = (float)mn_rng_normal(&r);
    int saved = omp_get_max_threads();
    for (int v = 0; v < 4; v++) {
        c[v] = calloc((size_t)m * n, sizeof(float));
        if (v < 3) {
            omp_set_num_threads(v + 1);
            gemm(0, 0, m, n, k, 1, a, k, b, n, 0, c[v], n);
        } else {  // from inside a parallel region of 2 threads, as the mixer cores call it
            omp_set_num_threads(2);
#pragma omp parallel num_threads(2)
            {
#pragma omp single
                gemm(0, 0, m, n, k, 1, a, k, b, n, 0, c[v], n);
            }
        }
    }
    omp_set_num_threads(saved);
    for (int v = 1; v < 4; v++)
        CHECK(!memcmp(c[v], c[0], sizeof(float) * m * n), "variant %d (%s) differs from one thread's", v,
              v < 3 ? "more threads" : "inside a parallel region");
    for (int v = 0; v < 4; v++) free(c[v]);
    free(a);
    free(b);
}
