// Runs trained as one model of runs (model_create_runs, core/runs.h) on the GPU against the same runs
// trained alone: the MAD model (width 128, 2 blocks, 128 tokens), 4 runs of different seeds, data,
// learning rates and weight decays, 3 steps; the projections a run at a time, then as strided
// batches (Backend.linear_runs_*, whose cuBLAS algorithm may differ from the single products').
//
// What may differ from the runs alone: every op that reads a parameter runs once a run on that run's
// rows, as alone, so the products with weights are the same calls (batched: one strided product,
// which cuBLAS may block differently); the parameter-free kernels (the linear-attention, attention
// and mLSTM cores, the elementwise ops) see 4 times the sequences and may block their work
// differently (the lin family's walks take two-group blocks when they fill the GPU better; cuDNN may
// choose another plan). Each sequence's arithmetic is its own in every kernel here, so bit-identical
// results are expected and are what the test reports. The bounds it enforces are those of a
// differently blocked float32 sum of bf16 products, and catch a run given another run's weights,
// data or gradients (differences of percents):
//   - the first step's loss sums within 1e-4 relative (a few float32 roundings of a sum of ~1000
//     terms, where one bf16 rounding of one term is already 4e-3 of it), later steps' within 1e-3
//     (the updates in between have moved by those roundings);
//   - every weight after 3 AdamW steps within 3 lr a step of the run alone's: rounding can flip the
//     sign of a gradient near zero, and AdamW then moves that weight the other way; each moves by at
//     most about 1.2 lr a step at these decays (|m^|/sqrt(v^) over three steps), so they end at most
//     2.4 lr a step apart; anything else is far smaller.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "core/common.h"
#include "model/model.h"
#include "model/presets.h"
#include "../test.h"
#include "train/optim.h"
#include "train/step.h"

enum { V = 97, R = 4, BR = 8, T = 128, STEPS = 3 };
static const float lrs[R] = {1e-3f, 5e-4f, 2e-3f, 1e-3f}, wds[R] = {0.1f, 0, 0.1f, 0};
static const uint64_t seeds[R] = {7, 7, 8, 9};

static ModelConfig mad_config(const char *mixer) {
    ModelConfig c;
    config_preset(&c, "tiny");
    c.vocab_size = V, c.dim = 128, c.n_heads = 2, c.head_dim = 64, c.n_layers = 2;
    snprintf(c.mixer, sizeof c.mixer, "%s", mixer);
    return c;
}

static void batch(int r, int k, int32_t *tok, int32_t *tgt) {
    for (int i = 0; i < BR * T; i++) {
        tok[i] = (int32_t)((i * 31 + k * 7 + r * 13 + 3) % V);
        tgt[i] = i % T == T - 1 ? -1 : (int32_t)((tok[i] * 5 + r + 1) % V);
    }
}

static double rel_l2(const float *a, const float *b, size_t n) {
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), s += (double)b[i] * b[i];
    return sqrt(d / (s > 0 ? s : 1));
}

static void grid_vs_alone(const Backend *G, const char *mixer, int batched) {
    ModelConfig c = mad_config(mixer);
    double loss[R][STEPS];
    float *w[R] = {0}, *wg = NULL;
    size_t total = 0;
    static int32_t tok[R][BR * T], tgt[R][BR * T];
    for (int r = 0; r < R; r++) {
        Model *m = NULL;
        AdamW o = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = wds[r], .clip = 1};
        TrainStep ts = {0};
        if (model_create(&m, &c, G) || model_init_params(m, seeds[r]) || adamw_init(&o, m) || train_step_init(&ts, m, &o))
            die("%s alone: %s", mixer, mn_last_error());
        for (int k = 0; k < STEPS; k++) {
            batch(r, k, tok[r], tgt[r]);
            if (train_step(&ts, tok[r], tgt[r], BR, T, 1, 1.0f / (BR * (T - 1)), lrs[r], &loss[r][k], NULL))
                die("%s alone: %s", mixer, mn_last_error());
        }
        total = m->total;
        w[r] = xcalloc(total, sizeof(float));
        if (G->download_f32(G, w[r], m->params, total, MEM_PARAM)) die("%s", mn_last_error());
        train_step_free(&ts), adamw_free(&o, m), model_free(m);
    }
    Model *g = NULL;
    AdamW o = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .wds = wds, .clip = 1};
    TrainStep ts = {0};
    if (model_create_runs(&g, &c, G, R) || model_init_params_runs(g, seeds) || adamw_init(&o, g) ||
        train_step_init(&ts, g, &o))
        die("%s as one model: %s", mixer, mn_last_error());
    g->rb->batched = batched;  // the projections as strided batches (Backend.linear_runs_*), or a run at a time
    static int32_t all_tok[R * BR * T], all_tgt[R * BR * T];
    float wt[R];
    double worst_loss = 0, worst_later = 0;
    int identical = 1;
    for (int k = 0; k < STEPS; k++) {
        for (int r = 0; r < R; r++) {
            batch(r, k, all_tok + (size_t)r * BR * T, all_tgt + (size_t)r * BR * T);
            wt[r] = 1.0f / (BR * (T - 1));
        }
        double l[R];
        int refused[R];
        if (train_step_queue_runs(&ts, all_tok, all_tgt, R * BR, T, 1, wt, lrs) || train_step_result_runs(&ts, l, NULL, refused))
            die("%s as one model: %s", mixer, mn_last_error());
        for (int r = 0; r < R; r++) {
            double e = fabs(l[r] - loss[r][k]) / fabs(loss[r][k]);
            identical &= l[r] == loss[r][k];
            if (k == 0) worst_loss = e > worst_loss ? e : worst_loss;
            else worst_later = e > worst_later ? e : worst_later;
            CHECK(!refused[r], "%s run %d step %d refused", mixer, r, k);
        }
    }
    CHECK(worst_loss <= 1e-4, "%s: first step's loss sums %.3g relative from the runs alone", mixer, worst_loss);
    CHECK(worst_later <= 1e-3, "%s: later steps' loss sums %.3g relative from the runs alone", mixer, worst_later);
    wg = xcalloc((size_t)R * total, sizeof(float));
    if (G->download_f32(G, wg, g->params, (size_t)R * total, MEM_PARAM)) die("%s", mn_last_error());
    double worst_w = 0, worst_abs = 0;  // relative L2; and the largest move against its bound, 3 lr a step
    for (int r = 0; r < R; r++) {
        const float *a = wg + (size_t)r * total;
        double e = rel_l2(a, w[r], total);
        identical &= !memcmp(a, w[r], total * sizeof(float));
        worst_w = e > worst_w ? e : worst_w;
        for (size_t i = 0; i < total; i++) {
            double m = fabs((double)a[i] - w[r][i]) / (3.0 * lrs[r] * STEPS);
            worst_abs = m > worst_abs ? m : worst_abs;
        }
        free(w[r]);
    }
    CHECK(worst_abs <= 1, "%s: a weight after %d steps %.3g of 3 lr a step from the run alone's", mixer, STEPS, worst_abs);
    test_note("%-8s %d runs as one model (%s): losses %.2g, then %.2g; weights after %d steps %.2g (L2), the largest move "
              "%.2g of its bound: %s", mixer, R, batched ? "batched" : "a run at a time", worst_loss, worst_later, STEPS,
              worst_w, worst_abs, identical ? "bit for bit as alone" : "not bit for bit");
    free(wg);
    train_step_free(&ts), adamw_free(&o, g), model_free(g);
}

TEST(cuda_runs_train_as_they_do_alone) {
    const Backend *G = backend_cuda();
    if (!G) {
        test_fail(__FILE__, __LINE__, "no CUDA backend: %s", mn_last_error());
        return;
    }
    const char *mixers[] = {"gdn", "mha", "hawk", "swa", "mlstm", "mesa", "gla", "longhorn"};
    for (int batched = 0; batched < 2; batched++)
        for (size_t i = 0; i < sizeof mixers / sizeof mixers[0]; i++) grid_vs_alone(G, mixers[i], batched);
}
