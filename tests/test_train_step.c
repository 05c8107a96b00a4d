// The training step on the backend (train/step.h) against the explicit sequence it replaces
// (model_zero_grad, model_forward with the loss read back, model_backward, adamw_step), on the
// reference and the CPU, bit for bit; a clipped update, a refused one; the recording's logic
// (recorded_run) on a backend that only counts.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "core/common.h"
#include "model/model.h"
#include "model/presets.h"
#include "test.h"
#include "train/optim.h"
#include "train/step.h"

enum { V = 64, B = 2, T = 16, N = B * T, STEPS = 4 };

static Model *tiny_model(const Backend *be, const char *mixer) {
    ModelConfig c;
    if (config_preset(&c, "tiny")) die("%s", mn_last_error());
    c.vocab_size = V;
    snprintf(c.mixer, sizeof c.mixer, "%s", mixer);
    Model *m = NULL;
    if (model_create(&m, &c, be) || model_init_params(m, 3)) die("%s", mn_last_error());
    return m;
}

// Step k's batch: accum micro-batches of random tokens, a few targets not scored.
static int batch(int k, int32_t *tok, int32_t *tgt) {
    int accum = k == 2 ? 2 : 1;
    MnRng r;
    mn_rng_seed(&r, 100 + (uint64_t)k);
    for (int i = 0; i < accum * N; i++) {
        tok[i] = (int32_t)(mn_rng_uniform(&r) * V) % V;
        tgt[i] = i % 7 == 3 ? -1 : (int32_t)(mn_rng_uniform(&r) * V) % V;
    }
    return accum;
}

static double scored(const int32_t *tgt, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += tgt[i] >= 0;
    return s;
}

static AdamW opt_for(Model *m) {
    // a clip the early steps exceed (their norms are about 1-3 here): clipped updates are compared too
    AdamW o = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .clip = 0.5f};
    if (adamw_init(&o, m)) die("%s", mn_last_error());
    return o;
}

// The parameters and moments of two models, bit for bit (elements of the backend's own size).
static int same_state(const Model *a, const AdamW *oa, const Model *b, const AdamW *ob) {
    size_t e = a->be->elem_size(a->be, MEM_F32);
    return !memcmp(a->params, b->params, a->total * e) && !memcmp(oa->m, ob->m, a->total * e) &&
           !memcmp(oa->v, ob->v, a->total * e) && oa->step == ob->step;
}

static void compare_with_sequence(const Backend *be, const char *mixer) {
    Model *a = tiny_model(be, mixer), *b = tiny_model(be, mixer);
    AdamW oa = opt_for(a), ob = opt_for(b);
    TrainStep ts;
    CHECK(!train_step_init(&ts, b, &ob), "%s", mn_last_error());
    int32_t tok[2 * N], tgt[2 * N];
    int clipped = 0;
    for (int k = 0; k < STEPS; k++) {
        int accum = batch(k, tok, tgt);
        float w = (float)(1.0 / scored(tgt, accum * N)), lr = 1e-2f * (float)(k + 1);
        double la = 0, ga, lb, gb;
        CHECK(!model_zero_grad(a), "%s", mn_last_error());
        for (int i = 0; i < accum; i++) {
            double l;
            CHECK(!model_forward(a, tok + i * N, tgt + i * N, B, T, w, &l) && !model_backward(a), "%s", mn_last_error());
            la += l;
        }
        CHECK(!adamw_step(&oa, a, lr, &ga), "%s", mn_last_error());
        CHECK(!train_step(&ts, tok, tgt, B, T, accum, w, lr, &lb, &gb), "%s %s step %d: %s", be->name, mixer, k,
              mn_last_error());
        CHECK(la == lb && ga == gb, "%s %s step %d: loss %.17g vs %.17g, norm %.17g vs %.17g", be->name, mixer, k, lb, la,
              gb, ga);
        CHECK(same_state(a, &oa, b, &ob), "%s %s step %d: weights or moments differ from the explicit sequence", be->name,
              mixer, k);
        clipped += ga > oa.clip;
    }
    CHECK(clipped > 0, "%s %s: no step was clipped (the test means to compare clipped updates)", be->name, mixer);
    // A non-finite gradient (an infinite weight): refused, naming the step, nothing changed.
    Model *c = tiny_model(be, mixer);
    AdamW oc = opt_for(c);
    TrainStep tc;
    CHECK(!train_step_init(&tc, c, &oc), "%s", mn_last_error());
    batch(0, tok, tgt);
    double l, g;
    CHECK(!train_step(&tc, tok, tgt, B, T, 1, 0.01f, 1e-2f, &l, &g), "%s", mn_last_error());
    size_t e = be->elem_size(be, MEM_F32);
    void *before = malloc(c->total * e);
    if (!before) die("out of memory");
    memcpy(before, c->params, c->total * e);
    int st = train_step(&tc, tok, tgt, B, T, 1, INFINITY, 1e-2f, &l, &g);
    CHECK(st == MN_ERR_NUMERIC, "%s %s: a non-finite gradient was not refused (%d)", be->name, mixer, st);
    CHECK(strstr(mn_last_error(), "step 2: gradient norm is") && strstr(mn_last_error(), "refusing the update"),
          "the refusal's message: %s", mn_last_error());
    CHECK(!memcmp(before, c->params, c->total * e) && oc.step == 1, "%s %s: the refused update changed the model",
          be->name, mixer);
    CHECK(isfinite(l), "%s %s: the refused step's loss %g (its forward is finite)", be->name, mixer, l);
    // and the next step goes on as it would have
    CHECK(!train_step(&tc, tok, tgt, B, T, 1, 0.01f, 1e-2f, &l, &g) && oc.step == 2, "%s", mn_last_error());
    free(before);
    train_step_free(&ts);
    train_step_free(&tc);
    adamw_free(&oa, a), adamw_free(&ob, b), adamw_free(&oc, c);
    model_free(a), model_free(b), model_free(c);
}

TEST(train_step_matches_the_explicit_sequence_ref) {
    compare_with_sequence(backend_ref(), "gdn");
    compare_with_sequence(backend_ref(), "mha");
}

TEST(train_step_matches_the_explicit_sequence_cpu) {
    const char *mixers[] = {"mesa", "gdn", "mha", "hawk", "mlstm"};
    for (int i = 0; i < 5; i++) compare_with_sequence(backend_cpu(), mixers[i]);
}

// One AdamW pass over the slab (its decay from the mask) is the update per tensor, each with its
// own decay, bit for bit: the slab op against itself called tensor by tensor with a mask of all ones
// or all zeros, over a few clipped steps of random gradients. (That the per-element arithmetic is
// the earlier per-tensor op's: the same results as before for `mesanet synth --quick` and a short
// `mesanet train`, checked when the op was introduced.)
TEST(train_step_update_is_the_per_tensor_adamw) {
    const Backend *be = backend_cpu();
    Model *m = tiny_model(be, "gdn");
    AdamW o = opt_for(m);
    float *p = malloc(m->total * 4), *mm = calloc(m->total, 4), *vv = calloc(m->total, 4);
    size_t words = (m->total + 255) / 256;
    int32_t *ones = malloc(words * 4), *zeros = calloc(words, 4);
    if (!p || !mm || !vv || !ones || !zeros) die("out of memory");
    memset(ones, 0xff, words * 4);
    memcpy(p, m->params, m->total * 4);
    MnRng r;
    mn_rng_seed(&r, 9);
    int decaying = 0;
    for (int t = 1; t <= 3; t++) {
        float *g = m->grads;
        for (int i = 0; i < m->nparams; i++)
            for (size_t j = 0; j < m->specs[i].numel; j++) g[m->specs[i].offset + j] = (float)(mn_rng_normal(&r) * 0.3);
        double ss[2];
        CHECK(!be->sumsq(be, ss, m->grads, m->total), "%s", mn_last_error());
        float lr = 1e-2f / (float)t, sched[2] = {lr, (float)t};
        AdamwOpts opts = {o.beta1, o.beta2, o.eps, o.weight_decay, o.clip};
        for (int i = 0; i < m->nparams; i++) {
            const ParamSpec *s = &m->specs[i];
            double st[2] = {ss[0], 0};
            AdamwIo io = {p + s->offset, g + s->offset, mm + s->offset, vv + s->offset, s->numel, s->decay ? ones : zeros,
                          sched, st};
            CHECK(!be->adamw(be, &opts, &io), "%s", mn_last_error());
            decaying += s->decay;
        }
        double gn;
        CHECK(!adamw_step(&o, m, lr, &gn) && gn == sqrt(ss[0]), "%s", mn_last_error());
        CHECK(gn > o.clip, "step %d was not clipped (norm %g)", t, gn);
    }
    CHECK(decaying > 0 && decaying < 3 * m->nparams, "the model has tensors with and without decay");
    CHECK(!memcmp(p, m->params, m->total * 4) && !memcmp(mm, o.m, m->total * 4) && !memcmp(vv, o.v, m->total * 4),
          "the slab update differs from the per-tensor one");
    free(p), free(mm), free(vv), free(ones), free(zeros);
    adamw_free(&o, m);
    model_free(m);
}

// recorded_run's order of events on a backend whose graph ops count: eager first, then a
// recording and its replay, then replays; a stale replay runs eagerly and the next call records
// again; a failed op while recording ends the recording and returns its error.
static struct {
    int begin, end, run, freed, ops, stale, fail;
} ev;

static int f_begin(const Backend *be) { return ev.begin++, MN_OK; }
static int f_end(const Backend *be, void **g) {
    ev.end++;
    *g = &ev;
    return MN_OK;
}
static int f_run(const Backend *be, void *g) {
    ev.run++;
    if (ev.stale) return ev.stale = 0, mn_error(MN_ERR_ARG, "stale");
    return MN_OK;
}
static void f_free(const Backend *be, void *g) { ev.freed++; }
static int f_ops(void *arg) {
    ev.ops++;
    return ev.fail ? mn_error(MN_ERR_NUMERIC, "failed op") : MN_OK;
}

TEST(train_step_recorded_run_order) {
    Backend fake = {.name = "fake", .graph_begin = f_begin, .graph_end = f_end, .graph_run = f_run, .graph_free = f_free};
    Recorded r = {0};
    memset(&ev, 0, sizeof ev);
    CHECK(!recorded_run(&r, &fake, f_ops, NULL) && ev.ops == 1 && ev.begin == 0 && ev.run == 0, "1st call: eager");
    CHECK(!recorded_run(&r, &fake, f_ops, NULL) && ev.ops == 2 && ev.begin == 1 && ev.end == 1 && ev.run == 1,
          "2nd call: recorded and replayed");
    CHECK(!recorded_run(&r, &fake, f_ops, NULL) && ev.ops == 2 && ev.begin == 1 && ev.run == 2, "3rd call: replayed");
    ev.stale = 1;
    CHECK(!recorded_run(&r, &fake, f_ops, NULL) && ev.ops == 3 && ev.run == 3 && ev.freed == 1 && !r.graph,
          "stale: dropped and run eagerly");
    CHECK(!recorded_run(&r, &fake, f_ops, NULL) && ev.begin == 2 && ev.run == 4 && r.graph, "after stale: recorded again");
    recorded_reset(&r, &fake);
    CHECK(ev.freed == 2 && !r.graph && !r.warm, "reset frees the recording");
    CHECK(!recorded_run(&r, &fake, f_ops, NULL) && ev.begin == 2, "after reset: eager again");
    ev.fail = 1;
    CHECK(recorded_run(&r, &fake, f_ops, NULL) == MN_ERR_NUMERIC && ev.begin == 3 && ev.end == 3 && !r.graph,
          "a failed op while recording: the recording ended, the error returned");
}
