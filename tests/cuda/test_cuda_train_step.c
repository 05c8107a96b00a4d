// The recorded training step (train/step.h) on the GPU against the same steps run eagerly: N
// replayed steps give the same losses, norms and weights as N eager ones, for several mixers,
// through an evaluation forward of another shape between steps (one eager step, then replays), a
// change of the batch shape (a new recording) and a recording gone stale (the backend's scratch
// grown by another model: dropped where it moved, one eager step, recorded again). Bit for bit where two eager
// runs agree bit for bit (deterministic kernels); where they do not, within their own spread.
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

enum { V = 97, STEPS = 12 };

static const Backend *G;

// The MAD model's size: width 128, 2 blocks.
static ModelConfig mad_config(const char *mixer) {
    ModelConfig c;
    config_preset(&c, "tiny");
    c.vocab_size = V;
    c.dim = 128;
    c.n_heads = 2;
    c.head_dim = 64;
    c.n_layers = 2;
    snprintf(c.mixer, sizeof c.mixer, "%s", mixer);
    return c;
}

typedef struct {
    double loss[STEPS], norm[STEPS];
    float *w;  // the weights after the steps
    size_t n;
    int ok;
} Run;

// Step k's shape: 4 x 64 tokens, 4 x 128 at steps 5 and 6 (at least 64 tokens: the lin family's
// chunked kernels, deterministic; its recurrent backward for T < 64 adds by atomics, docs/cuda.md).
// The expected course of a recorded run: 0 eager (the first), 1 recorded, 2 replayed, 3 eager (after
// an evaluation), 4 replayed, 5 eager (new shape), 6 recorded, 7 eager (the first shape again:
// recorded anew), 8 recorded, 9 replayed, or eager where the other model's forward moved the
// backend's scratch (the recording stale; cudaMalloc may hand back the address it freed, and the
// recording is then still good), 10 replayed or recorded, 11 replayed: 8 replays, or 7.
static int seq_of(int k) { return k == 5 || k == 6 ? 128 : 64; }

static void run_steps(const char *mixer, int record, Run *out) {
    memset(out, 0, sizeof *out);
    ModelConfig c = mad_config(mixer);
    Model *m = NULL, *big = NULL;
    AdamW o = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .clip = 1};
    TrainStep ts = {0};
    int stale = 0;
    int32_t tok[4 * 128], tgt[4 * 128], *btok = malloc(sizeof(int32_t) * 32 * 512);
    if (!btok || model_create(&m, &c, G) || model_init_params(m, 7) || adamw_init(&o, m) || train_step_init(&ts, m, &o)) {
        CHECK(0, "%s: %s", mixer, mn_last_error());
        goto done;
    }
    ts.record = record;
    for (int k = 0; k < STEPS; k++) {
        int B = 4, T = seq_of(k);
        for (int i = 0; i < B * T; i++) {
            tok[i] = (i * 31 + k * 7 + 3) % V;
            tgt[i] = i % T == T - 1 ? -1 : (tok[i] * 5 + 1) % V;
        }
        if (k == 3) {  // an evaluation of another shape between steps
            double l;
            CHECK(!model_forward(m, tok, tgt, 2, 96, 0, &l), "%s: %s", mixer, mn_last_error());
        }
        if (k == 9) {  // another model's larger batch grows the backend's scratch: the recording may be stale
            if (model_create(&big, &c, G) || model_init_params(big, 1)) {
                CHECK(0, "%s: %s", mixer, mn_last_error());
                goto done;
            }
            for (int i = 0; i < 32 * 512; i++) btok[i] = i % V;
            CHECK(!model_forward(big, btok, NULL, 32, 512, 0, NULL), "%s: %s", mixer, mn_last_error());
        }
        double scored = 0;
        for (int i = 0; i < B * T; i++) scored += tgt[i] >= 0;
        int st = train_step(&ts, tok, tgt, B, T, 1, (float)(1 / scored), 1e-3f, &out->loss[k], &out->norm[k]);
        CHECK(!st, "%s step %d: %s", mixer, k, mn_last_error());
        if (st) goto done;
        if (record && k == 8) CHECK(ts.rec.graph != NULL, "%s: step 8 was not recorded", mixer);
        if (record && k == 9) stale = ts.rec.graph == NULL;
    }
    if (record) {
        CHECK(ts.rec.graph != NULL, "%s: the steps were not recorded", mixer);
        test_note("%s: %ld of %d steps replayed%s", mixer, ts.rec.replays, STEPS,
                  stale ? " (step 9 found the recording stale)" : "");
        CHECK(ts.rec.replays == 8 - stale, "%s: %ld steps were replayed, %d expected (seq_of's course)", mixer,
              ts.rec.replays, 8 - stale);
    }
    out->n = m->total;
    out->w = malloc(m->total * sizeof(float));
    if (!out->w || G->download_f32(G, out->w, m->params, m->total, MEM_PARAM)) {
        CHECK(0, "%s: reading the weights back: %s", mixer, mn_last_error());
        goto done;
    }
    out->ok = 1;
done:
    free(btok);
    train_step_free(&ts);
    if (m) adamw_free(&o, m);
    model_free(m);
    model_free(big);
}

static double max_diff(const Run *a, const Run *b) {
    double d = 0;
    for (int k = 0; k < STEPS; k++) d = fmax(d, fmax(fabs(a->loss[k] - b->loss[k]), fabs(a->norm[k] - b->norm[k])));
    for (size_t i = 0; i < a->n; i++) d = fmax(d, fabs((double)a->w[i] - b->w[i]));
    return d;
}

TEST(cuda_train_step_recorded_matches_eager) {
    G = backend_cuda();
    if (!G) {
        test_fail(__FILE__, __LINE__, "no CUDA backend: %s", mn_last_error());
        return;
    }
    const char *mixers[] = {"mesa", "gdn", "mha", "hawk", "mlstm", "swa", "gla", "deltanet", "mamba2"};
    for (size_t i = 0; i < sizeof mixers / sizeof mixers[0]; i++) {
        Run e1, e2, r;
        run_steps(mixers[i], 0, &e1);
        run_steps(mixers[i], 0, &e2);
        run_steps(mixers[i], 1, &r);
        if (e1.ok && e2.ok && r.ok) {
            double spread = max_diff(&e1, &e2), d = max_diff(&e1, &r);
            if (spread == 0) {
                CHECK(d == 0, "%s: recorded steps differ from eager ones by %.3g (eager runs agree bit for bit)",
                      mixers[i], d);
            } else {  // nondeterministic kernels (atomics): the recording within the eager runs' own spread
                // (Mesa's: its dlambda sums; over 10 steps two eager runs end from 4e-4 to 0.27 apart, so
                // a third eager run sets the spread and the recording is compared with the nearer one.)
                Run e3;
                run_steps(mixers[i], 0, &e3);
                if (e3.ok) {
                    spread = fmax(spread, fmax(max_diff(&e1, &e3), max_diff(&e2, &e3)));
                    d = fmin(d, fmin(max_diff(&e2, &r), max_diff(&e3, &r)));
                }
                free(e3.w);
                test_note("%s: three eager runs differ by up to %.3g: its kernels are not deterministic", mixers[i],
                          spread);
                CHECK(d <= 4 * spread, "%s: recorded steps differ from the nearest eager run by %.3g (eager spread %.3g)",
                      mixers[i], d, spread);
            }
            for (int k = 0; k < STEPS; k++)
                CHECK(isfinite(r.loss[k]) && r.loss[k] > 0, "%s step %d: loss %g", mixers[i], k, r.loss[k]);
        }
        free(e1.w), free(e2.w), free(r.w);
    }
}
