// Training and scoring a model on a synthetic task by its protocol (run.h).
#include "synth/run.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "model/model.h"
#include "model/presets.h"
#include "synth/regbench.h"
#include "train/checkpoint.h"
#include "train/optim.h"
#include "train/step.h"

// ---------------------------------------------------------------------------
// RegBench as a task of the table's form (src/synth/regbench.h generates it): seq_len is the
// longest string (49), n_train / n_test the automata (one example each). Its examples depend on
// the split's automata, so synth_run makes them itself (gen is NULL: synth_make refuses nothing
// but must not be called with it).

static RbConfig rb_settings_config(const SynthSettings *s) {
    RbConfig c = rb_config_default();
    c.max_len = s->seq_len;
    if (c.min_len > c.max_len) c.min_len = c.max_len;
    return c;
}

static int rb_task_check(const SynthSettings *s) {
    if (s->seq_len < 1 || s->seq_len > 1000)
        return mn_error(MN_ERR_ARG, "regbench: seq_len (the longest string) must be in [1, 1000], got %d", s->seq_len);
    if (s->vocab != RB_VOCAB) return mn_error(MN_ERR_ARG, "regbench: vocab must be %d, got %d", RB_VOCAB, s->vocab);
    RbConfig c = rb_settings_config(s);
    return rb_config_check(&c);
}

static void rb_task_shape(const SynthSettings *s, int split, int *vocab, int *T) {
    RbConfig c = rb_settings_config(s);
    *vocab = RB_VOCAB;
    *T = rb_max_tokens(&c) - 1;
}

static const SynthVary RB_VARY[] = {{"n_train", 5, {2500, 5000, 10000, 20000, 40000}, NULL, {0}, "training automata"}};

const SynthTask synth_task_regbench = {
    .name = "regbench",
    .family = "regbench",
    .summary = "RegBench: in-context language learning of random automata (greedy validity accuracy)",
    .metric = SYNTH_METRIC_POSITION,
    .base = {.vocab = RB_VOCAB, .seq_len = 49, .n_train = 1000, .n_test = 500},
    .vary = RB_VARY,
    .n_vary = 1,
    .check = rb_task_check,
    .shape = rb_task_shape,
};

const SynthTask *synth_find_any(const char *name) {
    if (name && !strcmp(name, "regbench")) return &synth_task_regbench;
    return synth_find(name);
}

const SynthGroup synth_groups[] = {
    {"mad", "MAD's six tasks (mad-compression with the autoencoder head)"},
    {"niah", "S-NIAH 1, 2 and 3"},
    {"all", "every task above, RegBench last"},
};

int synth_group_count(void) { return (int)(sizeof synth_groups / sizeof synth_groups[0]); }

int synth_expand(const char *name, const SynthTask **out, int max) {
    const SynthTask *one = name ? synth_find_any(name) : NULL;
    if (one) {
        if (max > 0) out[0] = one;
        return 1;
    }
    int all = name && !strcmp(name, "all"), n = 0;
    for (int i = 0; name && i < synth_task_count(); i++)
        if (all || !strcmp(synth_task(i)->family, name)) {
            if (n < max) out[n] = synth_task(i);
            n++;
        }
    if (all) {
        if (n < max) out[n] = &synth_task_regbench;
        n++;
    }
    if (n > 0) return n;
    char names[768] = "";
    for (int i = 0; i < synth_task_count(); i++) {
        strncat(names, synth_task(i)->name, sizeof names - strlen(names) - 1);
        strncat(names, ", ", sizeof names - strlen(names) - 1);
    }
    strncat(names, synth_task_regbench.name, sizeof names - strlen(names) - 1);
    strncat(names, "; groups: ", sizeof names - strlen(names) - 1);
    for (int i = 0; i < synth_group_count(); i++) {
        if (i) strncat(names, ", ", sizeof names - strlen(names) - 1);
        strncat(names, synth_groups[i].name, sizeof names - strlen(names) - 1);
    }
    mn_error(MN_ERR_ARG, "unknown synthetic task '%s' (tasks: %s)", name ? name : "(null)", names);
    return -1;
}

// The examples of a run: the task's generator, or RegBench's automata made once.
typedef struct {
    const SynthTask *t;
    const SynthSettings *s;
    uint64_t seed;
    RbConfig rc;
    RbDfa *dfa[2];  // RegBench: the train and test automata
    int32_t *tok;   // RegBench: one example's tokens
    int cap;
} Examples;

static int examples_open(Examples *e, const SynthTask *t, const SynthSettings *s, uint64_t seed) {
    memset(e, 0, sizeof *e);
    e->t = t, e->s = s, e->seed = seed;
    if (t != &synth_task_regbench) return MN_OK;
    e->rc = rb_settings_config(s);
    e->cap = rb_max_tokens(&e->rc);
    if (s->n_train > 1000000 || s->n_test > 1000000)
        return mn_error(MN_ERR_ARG, "regbench: at most 1000000 automata per split");
    MN_TRY(rb_make_splits(&e->rc, seed, (int)s->n_train, (int)s->n_test, &e->dfa[0], &e->dfa[1]));
    e->tok = malloc(sizeof(int32_t) * (size_t)e->cap);
    return e->tok ? MN_OK : mn_error(MN_ERR_NOMEM, "regbench: out of memory");
}

static void examples_close(Examples *e) {
    mn_free(e->dfa[0]), mn_free(e->dfa[1]);
    free(e->tok);
}

// Example `index` of a split into in / tg (T each); RegBench: *len gets its length in tokens.
static int examples_get(Examples *e, int split, int64_t index, int T, int32_t *in, int32_t *tg, int *len) {
    if (e->t != &synth_task_regbench) return synth_make(e->t, e->s, split, e->seed, index, 1, in, tg);
    int n;
    MN_TRY(rb_make_example(&e->rc, e->seed, split, index, &e->dfa[split][index], e->tok, e->cap, &n));
    for (int i = 0; i < T; i++) in[i] = RB_PAD, tg[i] = -1;
    for (int i = 0; i < n - 1 && i < T; i++) in[i] = e->tok[i];
    rb_labels(e->tok, n, tg);
    for (int i = 0; i < n - 1; i++)
        if (tg[i] < 0) tg[i] = -1;
    if (len) *len = n;
    return MN_OK;
}

void synth_protocol(const SynthTask *t, int quick, SynthProtocol *p) {
    memset(p, 0, sizeof *p);
    p->n_layers = 2;
    p->lr_final = 0.1f;
    p->clip = 1.0f;
    p->warmup_frac = 0.02f;
    if (quick) {
        p->dim = 32, p->n_heads = 2, p->head_dim = 16, p->mlp_hidden = 64;
        p->batch = 16, p->epochs = 1000, p->max_steps = 40;
        p->nlr = 1, p->lrs[0] = 3e-3f, p->wds[0] = 0.0f;
        p->warmup_frac = 0.1f;
        p->source = "--quick: tiny settings for tests (not a protocol)";
        return;
    }
    p->dim = 128, p->n_heads = 4, p->head_dim = 32;
    if (!strcmp(t->family, "mqar")) {
        // Zoology Fig. 2 (iclr24_zoology_figure2/configs.py): 2 layers, d_model 64..512 (128 here),
        // lr logspace(-4, -2, 4), 64 epochs, batch 512 (L <= 128), 256 (L = 256), 128 (L = 512); no MLP
        // in Zoology (the smallest SwiGLU here, width 16: the config has no MLP-less block).
        p->mlp_hidden = 16, p->batch = t->base.seq_len <= 128 ? 512 : 256, p->epochs = 64;
        p->nlr = 4;
        const float lr[4] = {1e-4f, 4.6e-4f, 2.2e-3f, 1e-2f};
        for (int i = 0; i < 4; i++) p->lrs[i] = lr[i], p->wds[i] = 0.1f;
        p->stop_acc = 0;
        p->source = "Zoology Fig. 2: 2 layers, width 128, lr {1e-4, 4.6e-4, 2.2e-3, 1e-2}, 64 epochs, best lr";
    } else if (!strcmp(t->family, "mad")) {
        // MAD (benchmark.py / train.py): width 128, 2 x (mixer, SwiGLU 352), batch 128, 200 epochs,
        // lr {1e-4, 5e-4, 1e-3} x wd {0, 0.1}, cosine per epoch to 1e-6, no warm-up, stop at 0.999.
        p->mlp_hidden = 352, p->batch = 128, p->epochs = 200, p->warmup_frac = 0, p->lr_final = 0.001f;
        p->stop_acc = 0.999f;
        p->nlr = 6;
        const float lr[3] = {1e-4f, 5e-4f, 1e-3f};
        for (int i = 0; i < 6; i++) p->lrs[i] = lr[i / 2], p->wds[i] = (i % 2) ? 0.1f : 0.0f;
        p->source = "MAD: width 128, 2 blocks, lr {1e-4, 5e-4, 1e-3} x wd {0, 0.1}, 200 epochs, stop at 0.999";
    } else if (!strcmp(t->family, "regbench")) {
        // seq_icl (Akyurek et al. 2024): AdamW, lr 2.5e-4 (5e-4 in its base config), wd 0.1, batch 32,
        // 200 epochs, warm-up 10%, cosine to 0.1 lr. Its models are deeper (Transformer 12 layers);
        // here the 4 blocks of width 128 of the other tasks' scale.
        p->n_layers = 4, p->mlp_hidden = 352, p->batch = 32, p->epochs = 200, p->warmup_frac = 0.1f;
        p->nlr = 3;
        const float lr[3] = {2.5e-4f, 5e-4f, 1e-3f};
        for (int i = 0; i < 3; i++) p->lrs[i] = lr[i], p->wds[i] = 0.1f;
        p->source = "seq_icl: lr {2.5e-4, 5e-4, 1e-3}, wd 0.1, batch 32, 200 epochs, warm-up 10% (4 blocks, width 128)";
    } else {
        // parity, S-NIAH: no protocol in the spec's notes for this size; MAD's model and grid,
        // 100 epochs, stop at 0.999.
        p->mlp_hidden = 352, p->batch = 128, p->epochs = 100, p->stop_acc = 0.999f;
        p->nlr = 3;
        const float lr[3] = {1e-4f, 5e-4f, 1e-3f};
        for (int i = 0; i < 3; i++) p->lrs[i] = lr[i], p->wds[i] = 0.1f;
        p->source = "ours (no published protocol): MAD's model, lr {1e-4, 5e-4, 1e-3}, 100 epochs, stop at 0.999";
    }
}

static void try_set(const SynthTask *t, SynthSettings *s, const char *field, double v) {
    SynthSettings c = *s;
    char text[32];
    snprintf(text, sizeof text, "%g", v);
    if (synth_set(&c, field, text)) return;
    if (!synth_check(t, &c)) *s = c;
}

void synth_quick_settings(const SynthTask *t, SynthSettings *s) {
    s->n_train = 256, s->n_test = 64;
    if (t == &synth_task_regbench) {
        s->seq_len = 8;
        return;
    }
    if (s->num_pairs > 4) try_set(t, s, "num_pairs", 4);
    if (s->num_copy > 4) try_set(t, s, "num_copy", 4);
    if (s->seq_len > 32) try_set(t, s, "seq_len", 32);
    if (s->seq_len > 64) try_set(t, s, "seq_len", 64);
    if (s->seq_len > 128) try_set(t, s, "seq_len", 128);
    if (s->test_len > 64) try_set(t, s, "test_len", 64);
    if (s->vocab > 64) try_set(t, s, "vocab", 64);
    if (s->vocab > 256) try_set(t, s, "vocab", 256);
}

int synth_task_supported(const SynthTask *t) {
    (void)t;  // every task runs: the autoencoder ones (MAD compression) with the autoencoder head
    return MN_OK;
}

int synth_model_config(const SynthTask *t, const SynthSettings *s, const SynthProtocol *p, const char *mixer,
                       ModelConfig *c) {
    int V, Ttr, Tte;
    MN_TRY(synth_check(t, s));
    MN_TRY(synth_shape(t, s, SYNTH_TRAIN, &V, &Ttr));
    MN_TRY(synth_shape(t, s, SYNTH_TEST, &V, &Tte));
    MN_TRY(config_preset(c, "tiny"));
    // "NAME:neg": the mixer (or pattern) with the delta rules' negative eigenvalues (beta in (0, 2))
    size_t n = strlen(mixer);
    int neg = n > 4 && !strcmp(mixer + n - 4, ":neg");
    if (neg) n -= 4;
    if (n >= sizeof c->mixer) return mn_error(MN_ERR_ARG, "mixer '%.40s...' is too long", mixer);
    snprintf(c->mixer, sizeof c->mixer, "%.*s", (int)n, mixer);
    c->neg_eigen = neg;
    c->vocab_size = V;
    c->dim = p->dim, c->n_layers = p->n_layers, c->n_heads = p->n_heads, c->head_dim = p->head_dim;
    c->mlp_hidden = p->mlp_hidden;
    c->seq_len = Ttr > Tte ? Ttr : Tte;
    if (c->seq_len < 2) c->seq_len = 2;
    c->gate_bound = (float)c->seq_len;
    if (t->autoencoder) {  // MAD's AutoEncoder: every position decoded from the last one's state (model/autoencoder.c)
        snprintf(c->head, sizeof c->head, "autoencoder");
        c->tie_embeddings = 0, c->logit_cap = 0;
    }
    if (c->window > c->seq_len) c->window = c->seq_len;
    char where[128];
    snprintf(where, sizeof where, "mixer '%s'", mixer);
    return config_validate(c, where);
}

// Greedy predictions (argmax of the logits) of the last forward, n = B*T positions.
static int predict(Model *m, int n, float *logits, int32_t *pred) {
    int V = m->cfg.vocab_size;
    MN_TRY(m->be->download_f32(m->be, logits, m->logits, (size_t)n * V, MEM_ACT));
    for (int i = 0; i < n; i++) {
        const float *l = logits + (size_t)i * V;
        int best = 0;
        for (int v = 1; v < V; v++)
            if (l[v] > l[best]) best = v;
        pred[i] = best;
    }
    return MN_OK;
}

// Softmax of n rows of V logits into probs.
static void softmax_rows(const float *logits, int n, int V, float *probs) {
    for (int i = 0; i < n; i++) {
        const float *l = logits + (size_t)i * V;
        float *p = probs + (size_t)i * V, mx = l[0];
        for (int v = 1; v < V; v++)
            if (l[v] > mx) mx = l[v];
        double sum = 0;
        for (int v = 0; v < V; v++) sum += p[v] = expf(l[v] - mx);
        for (int v = 0; v < V; v++) p[v] = (float)(p[v] / sum);
    }
}

// The test metric of R runs of a model (R = m->runs; a model of one: R = 1) into out[r], RegBench's
// mean TVD into tvd[r] (NAN for the other tasks; tvd may be NULL), for the runs r with want[r] (NULL:
// every run), each on its own test examples ex[r]: one forward a batch of every run's examples.
static int score_runs(const SynthTask *t, const SynthSettings *s, Model *m, Examples *const *ex, const int *want,
                      double *out, double *tvd) {
    const int R = m->runs;
    int V, T;
    MN_TRY(synth_shape(t, s, SYNTH_TEST, &V, &T));
    int64_t n = synth_split_size(s, SYNTH_TEST);
    size_t per = (size_t)T * (size_t)V;
    int B = (int)(((size_t)1 << 24) / (per ? per : 1));  // at most 64 MB of logits at a time
    if (B < 1) B = 1;
    if (B > 256) B = 256;
    B = B / R > 0 ? B / R : 1;  // a run's share
    if (B > n) B = (int)n;
    size_t rows = (size_t)R * B;
    int32_t *in = calloc(rows * T, sizeof(int32_t)), *tg = malloc(sizeof(int32_t) * rows * T);
    int32_t *pred = malloc(sizeof(int32_t) * rows * T);
    float *logits = malloc(sizeof(float) * rows * per);
    int st = (!in || !tg || !pred || !logits) ? mn_error(MN_ERR_NOMEM, "synth: out of memory scoring") : MN_OK;
    int rb = t == &synth_task_regbench;
    int *lens = malloc(sizeof(int) * rows);
    if (!lens && !st) st = mn_error(MN_ERR_NOMEM, "synth: out of memory scoring");
    float *probs = rb ? malloc(sizeof(float) * per) : NULL;
    if (rb && !probs && !st) st = mn_error(MN_ERR_NOMEM, "synth: out of memory scoring");
    if (rb && V != RB_VOCAB && !st) st = mn_error(MN_ERR_ARG, "regbench: vocabulary %d, expected %d", V, RB_VOCAB);
    SynthMeter *meter = calloc((size_t)R, sizeof *meter);
    RbMetrics *rbm = calloc((size_t)R, sizeof *rbm);
    if ((!meter || !rbm) && !st) st = mn_error(MN_ERR_NOMEM, "synth: out of memory scoring");
    for (int64_t first = 0; !st && first < n; first += B) {
        int b = (int)(n - first < B ? n - first : B);
        for (int r = 0; r < R && !st; r++)  // run r's examples in rows [r b, (r+1) b); a run not scored: token 0
            for (int i = 0; i < b && !st; i++) {
                size_t at = ((size_t)r * b + i) * T;
                if (want && !want[r]) memset(in + at, 0, sizeof(int32_t) * T);
                else st = examples_get(ex[r], SYNTH_TEST, first + i, T, in + at, tg + at, &lens[r * b + i]);
            }
        if (!st) st = model_forward(m, in, NULL, R * b, T, 0, NULL);
        if (!st) st = predict(m, R * b * T, logits, pred);
        for (int r = 0; r < R && !st; r++) {
            if (want && !want[r]) continue;
            const size_t r0 = (size_t)r * b;
            if (!rb) synth_meter_add(t, &meter[r], pred + r0 * T, tg + r0 * T, b, T, V);
            for (int i = 0; i < b && !st && rb; i++) {
                st = examples_get(ex[r], SYNTH_TEST, first + i, T, in, tg, &lens[r0 + i]);  // ex->tok: the example
                if (!st)
                    st = rb_metrics_greedy(&rbm[r], &ex[r]->dfa[SYNTH_TEST][first + i], ex[r]->tok, lens[r0 + i],
                                           pred + (r0 + i) * T);
                if (!st && lens[r0 + i] > 1) {
                    softmax_rows(logits + (r0 + i) * per, lens[r0 + i] - 1, V, probs);
                    st = rb_metrics_tvd(&rbm[r], &ex[r]->dfa[SYNTH_TEST][first + i], ex[r]->tok, lens[r0 + i], probs);
                }
            }
        }
    }
    for (int r = 0; r < R && !st; r++) {
        if (want && !want[r]) continue;
        out[r] = rb ? rb_metrics_accuracy(&rbm[r]) : synth_meter_value(&meter[r]);
        if (tvd) tvd[r] = rb && rbm[r].n_tvd > 0 ? rb_metrics_tvd_mean(&rbm[r]) : NAN;
    }
    free(in), free(tg), free(pred), free(logits), free(lens), free(probs), free(meter), free(rbm);
    return st;
}

// The test metric of a model of one run into *out; RegBench: the mean TVD into *tvd (NAN for the
// other tasks).
static int score(const SynthTask *t, const SynthSettings *s, Model *m, Examples *ex, double *out, double *tvd) {
    Examples *one[1] = {ex};
    double o = NAN, v = NAN;
    int st = score_runs(t, s, m, one, NULL, &o, &v);
    *out = o;
    if (tvd) *tvd = v;
    return st;
}

// A new epoch's order of the training examples: a Fisher-Yates shuffle of the last one.
static void shuffle_order(int64_t *order, int64_t n, MnRng *rng) {
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(mn_rng_uniform(rng) * (double)(i + 1));
        if (j > i) j = i;
        int64_t x = order[i];
        order[i] = order[j], order[j] = x;
    }
}

// The training batches, B examples each in the epochs' orders (a fresh shuffle an epoch).
typedef struct {
    int64_t *order, n;  // [n] the epoch's order of the training examples
    int64_t pos;        // the next example of it (n: the epoch is used up)
    int epochs;         // epochs begun
    MnRng rng;
} Feed;

// The next batch that scores a token, into in / tg (*scored: how many tokens it scores); batches
// that score none are passed over (no step is taken on them).
static int feed_next(Feed *f, Examples *ex, int B, int T, int32_t *in, int32_t *tg, double *scored) {
    for (int64_t tries = 0;; tries++) {
        if (tries > f->n / B + 1) return mn_error(MN_ERR_ARG, "synth: %s: an epoch of training examples scores no token",
                                                  ex->t->name);
        if (f->pos + B > f->n) {  // a new epoch: a fresh order
            shuffle_order(f->order, f->n, &f->rng);
            f->pos = 0;
            f->epochs++;
        }
        for (int b = 0; b < B; b++)
            MN_TRY(examples_get(ex, SYNTH_TRAIN, f->order[f->pos + b], T, in + (size_t)b * T, tg + (size_t)b * T, NULL));
        f->pos += B;
        *scored = 0;
        for (size_t i = 0; i < (size_t)B * T; i++) *scored += tg[i] >= 0;
        if (*scored > 0) return MN_OK;
    }
}

// The data order's start: the examples in order (shuffled as each epoch begins), from the run's seed.
static int feed_open(Feed *f, int64_t ntrain, uint64_t seed) {
    *f = (Feed){.order = malloc(sizeof(int64_t) * (size_t)ntrain), .n = ntrain, .pos = ntrain};
    if (!f->order) return mn_error(MN_ERR_NOMEM, "synth: out of memory");
    mn_rng_seed(&f->rng, synth_mix(seed + 77));
    for (int64_t i = 0; i < ntrain; i++) f->order[i] = i;
    return MN_OK;
}

// The data order where a saved run was: its epochs' shuffles again, then its position.
static void feed_resume(Feed *f, const TrainState *saved) {
    for (uint64_t e = 0; e < saved->epoch; e++) shuffle_order(f->order, f->n, &f->rng);
    f->epochs = (int)saved->epoch, f->pos = (int64_t)saved->index;
}

// A run's shape by its protocol: the model, the training sequences' length T, the training
// examples, the batch B and the steps in all.
typedef struct {
    ModelConfig cfg;
    int T, B;
    int64_t ntrain, total;
} RunPlan;

static int run_plan(const SynthTask *t, const SynthSettings *s, const SynthProtocol *p, const char *mixer,
                    RunPlan *rp) {
    int V;
    MN_TRY(synth_task_supported(t));
    MN_TRY(synth_model_config(t, s, p, mixer, &rp->cfg));
    MN_TRY(synth_shape(t, s, SYNTH_TRAIN, &V, &rp->T));
    rp->ntrain = synth_split_size(s, SYNTH_TRAIN);
    if (rp->ntrain < 1) return mn_error(MN_ERR_ARG, "synth: task %s has no training examples", t->name);
    rp->B = p->batch < rp->ntrain ? p->batch : (int)rp->ntrain;
    rp->total = rp->ntrain / rp->B * p->epochs;
    if (p->max_steps > 0 && rp->total > p->max_steps) rp->total = p->max_steps;
    if (rp->total > 1000000000) rp->total = 1000000000;
    return MN_OK;
}

// Takes up the state saved in dir: weights, AdamW's moments and the training state into *ts.
static int load_run_state(const char *dir, Model *m, AdamW *opt, TrainState *ts) {
    char ck[4096], path[4200];
    MN_TRY(checkpoint_dir(dir, ck, sizeof ck));
    snprintf(path, sizeof path, "%s/model.safetensors", ck);
    MN_TRY(checkpoint_load_weights(path, m));
    return checkpoint_load_state(dir, m, opt, ts);
}

// Removes a finished run's saved state: the checkpoint set, then its folder.
static int remove_run_state(const char *dir) {
    MN_TRY(checkpoint_remove_all(dir));
    if (rmdir(dir) && errno != ENOENT) return mn_error(MN_ERR_IO, "%s: cannot remove: %s", dir, strerror(errno));
    return MN_OK;
}

int synth_run(const SynthTask *t, const SynthSettings *s, const SynthProtocol *p, const char *mixer, float lr,
              float wd, uint64_t seed, const Backend *be, FILE *log, SynthRunResult *r) {
    return synth_run_resumable(t, s, p, mixer, lr, wd, seed, be, log, NULL, r);
}

int synth_run_resumable(const SynthTask *t, const SynthSettings *s, const SynthProtocol *p, const char *mixer,
                        float lr, float wd, uint64_t seed, const Backend *be, FILE *log, const SynthResume *rs,
                        SynthRunResult *r) {
    memset(r, 0, sizeof *r);
    r->tvd = NAN;
    RunPlan rp;
    MN_TRY(run_plan(t, s, p, mixer, &rp));
    const int T = rp.T, B = rp.B;
    const int64_t ntrain = rp.ntrain, total = rp.total;
    const char *dir = rs ? rs->state_dir : NULL;

    double t0 = mn_now();
    Model *m = NULL;
    AdamW opt = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = wd, .clip = p->clip};
    // two batches: the step's, and the next one, made on the host while the step runs
    size_t nb = (size_t)B * T;
    int32_t *in[2] = {malloc(sizeof(int32_t) * nb), malloc(sizeof(int32_t) * nb)};
    int32_t *tg[2] = {malloc(sizeof(int32_t) * nb), malloc(sizeof(int32_t) * nb)};
    Feed feed = {0};
    int st = (!in[0] || !in[1] || !tg[0] || !tg[1]) ? mn_error(MN_ERR_NOMEM, "synth: out of memory") : MN_OK;
    if (!st) st = feed_open(&feed, ntrain, seed);
    int have_opt = 0, found = 0;
    Examples ex;
    int have_ex = 0;
    TrainState saved = {.seed = seed};
    if (!st) st = examples_open(&ex, t, s, seed), have_ex = 1;
    if (!st) st = model_create(&m, &rp.cfg, be);
    if (!st) {  // a batch that cannot fit is refused before its buffers are allocated
        MemNeeds needs = {"synth", 2 * sizeof(int32_t) * (size_t)T, 0, 1};
        st = model_check_batch(m, B, T, &needs);
    }
    if (!st) st = model_init_params(m, synth_mix(seed ^ 0x5157ull));
    if (!st) st = adamw_init(&opt, m), have_opt = !st;
    if (!st && dir) st = checkpoint_find(dir, &found);
    if (!st && found) st = load_run_state(dir, m, &opt, &saved);
    TrainStep ts = {0};
    if (!st) st = train_step_init(&ts, m, &opt);
    LrSchedule sched = {lr, (int)(p->warmup_frac * (float)total), (int)total, p->lr_final};
    int64_t step = 0;
    if (!st && found) {
        step = saved.step, r->resumed_at = saved.step;
        feed_resume(&feed, &saved);
        r->epochs = feed.epochs;
    }
    double metric = NAN, t_log = t0, t_saved = t0, scored[2];
    int cur = 0, have_next = 0;
    while (!st && step < total) {
        if (!have_next && (st = feed_next(&feed, &ex, B, T, in[cur], tg[cur], &scored[cur]))) break;
        have_next = 0;
        double loss;
        st = train_step_queue(&ts, in[cur], tg[cur], B, T, 1, (float)(1.0 / scored[cur]), lr_at(&sched, (int)step));
        // where the data stands after this step's batch (what a saved state records), then the next
        // batch while the step runs
        int64_t pos = feed.pos;
        r->epochs = feed.epochs;
        if (!st && step + 1 < total) st = feed_next(&feed, &ex, B, T, in[cur ^ 1], tg[cur ^ 1], &scored[cur ^ 1]), have_next = !st;
        if (!st) st = train_step_result(&ts, &loss, NULL);
        if (st) {
            char why[MN_ERROR_MAX];
            snprintf(why, sizeof why, "%s", mn_last_error());
            st = mn_error(st, "synth: %s", why);  // (a refused update's message names the step)
            break;
        }
        step++;
        r->final_loss = loss / scored[cur];
        cur ^= have_next;
        if (!isfinite(r->final_loss)) {
            st = mn_error(MN_ERR_NUMERIC, "synth: loss is %g at step %lld", r->final_loss, (long long)step);
            break;
        }
        int epoch_end = pos + B > ntrain || step == total;
        if (log && epoch_end && !(p->stop_acc > 0) && mn_now() - t_log >= 10) {
            fprintf(log, "    epoch %d: step %lld of %lld, loss %.4f\n", r->epochs, (long long)step, (long long)total,
                    r->final_loss);
            fflush(log);
            t_log = mn_now();
        }
        if (p->stop_acc > 0 && epoch_end && step < total) {
            if ((st = score(t, s, m, &ex, &metric, &r->tvd))) break;
            if (log) fprintf(log, "    epoch %d: step %lld of %lld, loss %.4f, test %.4f\n", r->epochs, (long long)step,
                             (long long)total, r->final_loss, metric), fflush(log);
            if (metric >= p->stop_acc) {
                r->stopped_early = 1;
                break;
            }
            metric = NAN;
        }
        if (!dir || step == total) continue;
        double now = mn_now();
        int cut = (rs->deadline > 0 && now >= rs->deadline) || (rs->stop_at > 0 && step >= rs->stop_at);
        if (cut || (rs->save_every > 0 && now - t_saved >= rs->save_every)) {  // the state, as a kill would find it
            TrainState ts_now = {.step = (int)step, .epoch = (uint64_t)r->epochs, .index = (uint64_t)pos, .seed = seed,
                                 .tokens = (double)step * B * T, .elapsed = saved.elapsed + (now - t0)};
            if ((st = mn_mkdirs(dir)) || (st = checkpoint_save(dir, m, &opt, &ts_now))) break;
            t_saved = mn_now();
        }
        if (cut) {
            r->cut_short = 1;
            break;
        }
    }
    if (!st && !r->cut_short && isnan(metric)) st = score(t, s, m, &ex, &metric, &r->tvd);
    if (!st && !r->cut_short && dir) st = remove_run_state(dir);  // ended: nothing to take up again
    r->metric = r->cut_short ? NAN : metric;
    r->steps = (int)step;
    r->seconds = saved.elapsed + (mn_now() - t0);
    train_step_free(&ts);
    if (have_opt) adamw_free(&opt, m);
    if (have_ex) examples_close(&ex);
    if (m) model_free(m);
    free(in[0]), free(in[1]), free(tg[0]), free(tg[1]), free(feed.order);
    return st;
}

// ---------------------------------------------------------------------------
// Runs of one architecture as one model (synth_run_grid)

// A run's part of a grid: its data, schedule and where it stands.
typedef struct {
    Examples ex;
    int have_ex;
    Feed feed;
    LrSchedule sched;
    int active;       // still training
    double scored[2]; // tokens each of its two batches (the step's, the next) scores
    int64_t pos[2];   // its data position after each
    int epochs[2];    // and its epochs begun
    TrainState saved; // its saved state (step, data position, seconds so far)
    double metric;    // its test metric (NAN: none yet)
} GridPart;

static void grid_fail(SynthGridRun *g, GridPart *part, int st) {
    g->status = st;
    snprintf(g->error, sizeof g->error, "%s", mn_last_error());
    part->active = 0;
}

// Every run alone, in turn (runs saved at different steps).
static void grid_one_by_one(const SynthTask *t, const SynthSettings *s, const SynthProtocol *p, const char *mixer,
                            SynthGridRun *runs, int n, const Backend *be) {
    for (int r = 0; r < n; r++) {
        SynthGridRun *g = &runs[r];
        g->status = synth_run_resumable(t, s, p, mixer, g->lr, g->wd, g->seed, be, NULL,
                                        g->resume.state_dir ? &g->resume : NULL, &g->result);
        if (g->status) snprintf(g->error, sizeof g->error, "%s", mn_last_error());
    }
}

// The test metrics (and TVDs) of the runs marked in want, all at once (score_runs); a failure ends them.
static void grid_score(const SynthTask *t, const SynthSettings *s, Model *m, SynthGridRun *runs, GridPart *part,
                       Examples **exs, const int *want, double *metric, double *tvd) {
    int st = score_runs(t, s, m, exs, want, metric, tvd);
    for (int r = 0; r < m->runs; r++)
        if (want[r]) {
            if (st) grid_fail(&runs[r], &part[r], st);
            else part[r].metric = metric[r], runs[r].result.tvd = tvd[r];
        }
}

// Batch `which` (of the two) of every active run, from its own data; a run whose data fails ends with
// that error (as it would alone).
static void grid_feed(SynthGridRun *runs, GridPart *part, int n, int which, int32_t *in, int32_t *tg, size_t nb, int B,
                      int T) {
    for (int r = 0; r < n; r++) {
        GridPart *q = &part[r];
        if (!q->active) continue;
        size_t at = which * nb + (size_t)r * B * T;
        int e = feed_next(&q->feed, &q->ex, B, T, in + at, tg + at, &q->scored[which]);
        if (e) grid_fail(&runs[r], q, e);
        q->pos[which] = q->feed.pos, q->epochs[which] = q->feed.epochs;
    }
}

// Saves run r's state where synth_run_resumable would save it alone (`cur`: the batch of the step just taken).
static int grid_save(Model *m, const AdamW *o, int r, const SynthGridRun *g, const GridPart *part, int cur, int step,
                     int B, int T, double since) {
    Model view = model_run_view(m, r);
    AdamW ov = adamw_run_view(o, m, r);
    TrainState ts = {.step = step, .epoch = (uint64_t)part->epochs[cur], .index = (uint64_t)part->pos[cur], .seed = g->seed,
                     .tokens = (double)step * B * T, .elapsed = part->saved.elapsed + since};
    MN_TRY(mn_mkdirs(g->resume.state_dir));
    return checkpoint_save(g->resume.state_dir, &view, &ov, &ts);
}

// A run that ended: its metric, steps and time; its saved state removed.
static void grid_end(SynthGridRun *g, GridPart *part, int step, double since) {
    SynthRunResult *r = &g->result;
    r->metric = part->metric;
    r->steps = step;
    r->seconds = part->saved.elapsed + since;
    part->active = 0;
    int st = g->resume.state_dir ? remove_run_state(g->resume.state_dir) : MN_OK;
    if (st) grid_fail(g, part, st);
}

int synth_run_grid(const SynthTask *t, const SynthSettings *s, const SynthProtocol *p, const char *mixer,
                   SynthGridRun *runs, int n, const Backend *be) {
    if (n < 1) return mn_error(MN_ERR_ARG, "synth: a grid of %d runs", n);
    for (int r = 0; r < n; r++) {
        memset(&runs[r].result, 0, sizeof runs[r].result);
        runs[r].result.tvd = NAN, runs[r].status = MN_OK, runs[r].error[0] = 0;
    }
    if (n == 1) {
        grid_one_by_one(t, s, p, mixer, runs, n, be);
        return MN_OK;
    }
    RunPlan rp = {0};
    int st = run_plan(t, s, p, mixer, &rp);
    if (st) rp.T = rp.B = 0, rp.ntrain = rp.total = 0;  // (nothing is allocated for a grid that cannot be made)
    const int T = rp.T, B = rp.B;
    const int64_t ntrain = rp.ntrain, total = rp.total;
    const SynthResume *rs0 = &runs[0].resume;

    double t0 = mn_now();
    size_t nb = (size_t)n * B * T;  // two batches of every run's: the step's, and the next, made while it runs
    GridPart *part = calloc((size_t)n, sizeof *part);
    int32_t *in = calloc(2 * nb + 1, sizeof(int32_t)), *tg = calloc(2 * nb + 1, sizeof(int32_t));
    float *w = calloc((size_t)n * 3, sizeof(float)), *lrs = w + n, *wds = w + 2 * n;
    double *loss = calloc((size_t)n * 2, sizeof(double)), *norm = loss + n;
    int *refused = calloc((size_t)n, sizeof(int));
    uint64_t *seeds = calloc((size_t)n, sizeof(uint64_t));
    int *want = calloc((size_t)n, sizeof(int));          // the runs to score
    double *smetric = calloc((size_t)n * 2, sizeof(double)), *stvd = smetric ? smetric + n : NULL;
    Examples **exs = calloc((size_t)n, sizeof *exs);      // each run's test examples
    if (!st && (!part || !in || !tg || !w || !loss || !refused || !seeds || !want || !smetric || !exs))
        st = mn_error(MN_ERR_NOMEM, "synth: out of memory");
    Model *m = NULL;
    AdamW opt = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .wds = wds, .clip = p->clip};
    int have_opt = 0, have_ts = 0;
    TrainStep ts = {0};
    for (int r = 0; r < n && !st; r++) {
        SynthGridRun *g = &runs[r];
        wds[r] = g->wd, seeds[r] = synth_mix(g->seed ^ 0x5157ull);
        part[r].metric = NAN, part[r].active = 1, part[r].saved.seed = g->seed;
        part[r].sched = (LrSchedule){g->lr, (int)(p->warmup_frac * (float)total), (int)total, p->lr_final};
        st = examples_open(&part[r].ex, t, s, g->seed), part[r].have_ex = 1, exs[r] = &part[r].ex;
        if (!st) st = feed_open(&part[r].feed, ntrain, g->seed);
    }
    if (!st) st = model_create_runs(&m, &rp.cfg, be, n);
    if (!st) {
        MemNeeds needs = {"synth", 2 * sizeof(int32_t) * (size_t)T, 0, 1};
        st = model_check_batch(m, n * B, T, &needs);
    }
    if (!st) st = model_init_params_runs(m, seeds);
    if (!st) st = adamw_init(&opt, m), have_opt = !st;
    // the saved states: every run's at one step, or the runs go one by one
    int step0 = -1, mixed = 0;
    for (int r = 0; r < n && !st; r++) {
        const char *dir = runs[r].resume.state_dir;
        int found = 0;
        if (dir) st = checkpoint_find(dir, &found);
        if (!st && found) {
            Model view = model_run_view(m, r);
            AdamW ov = adamw_run_view(&opt, m, r);
            st = load_run_state(dir, &view, &ov, &part[r].saved);
        }
        int at = found ? part[r].saved.step : 0;
        mixed |= step0 >= 0 && at != step0;
        step0 = at;
    }
    const int alone = !st && mixed;  // (then each run alone, below, from its own state)
    int64_t step = step0 > 0 ? step0 : 0;
    if (!st && !alone) {
        opt.step = (int)step;
        for (int r = 0; r < n && step > 0; r++) {
            feed_resume(&part[r].feed, &part[r].saved);
            runs[r].result.resumed_at = (int)step, runs[r].result.epochs = part[r].feed.epochs;
        }
        st = train_step_init(&ts, m, &opt), have_ts = !st;
    }
    double t_saved = t0;
    int cut = 0, cur = 0, have_next = 0;
    for (;;) {
        int any = 0;
        for (int r = 0; r < n; r++) any |= part[r].active;
        if (st || alone || !any || step >= total) break;
        if (!have_next) grid_feed(runs, part, n, cur, in, tg, nb, B, T);
        have_next = 0;
        for (int r = 0; r < n; r++) {  // an idle run keeps its last batch, at weight 0 and learning rate 0
            GridPart *q = &part[r];
            w[r] = q->active ? (float)(1.0 / q->scored[cur]) : 0, lrs[r] = q->active ? lr_at(&q->sched, (int)step) : 0;
            if (q->active) runs[r].result.epochs = q->epochs[cur];
        }
        if ((st = train_step_queue_runs(&ts, in + cur * nb, tg + cur * nb, n * B, T, 1, w, lrs))) break;
        if (step + 1 < total) grid_feed(runs, part, n, cur ^ 1, in, tg, nb, B, T), have_next = 1;
        if ((st = train_step_result_runs(&ts, loss, norm, refused))) break;
        step++;
        int nwant = 0;
        for (int r = 0; r < n; r++) {
            GridPart *q = &part[r];
            SynthGridRun *g = &runs[r];
            want[r] = 0;
            if (!q->active) continue;
            if (refused[r]) {
                grid_fail(g, q, mn_error(MN_ERR_NUMERIC, "synth: step %lld: gradient norm is %g: refusing the update",
                                         (long long)step, norm[r]));
                continue;
            }
            g->result.final_loss = loss[r] / q->scored[cur];
            if (!isfinite(g->result.final_loss)) {
                grid_fail(g, q, mn_error(MN_ERR_NUMERIC, "synth: loss is %g at step %lld", g->result.final_loss, (long long)step));
                continue;
            }
            int epoch_end = q->pos[cur] + B > ntrain || step == total;
            want[r] = p->stop_acc > 0 && epoch_end && step < total;
            nwant += want[r];
        }
        if (nwant) {  // the runs at an epoch's end, scored together: those at stop_acc end
            grid_score(t, s, m, runs, part, exs, want, smetric, stvd);
            for (int r = 0; r < n; r++) {
                if (!want[r] || !part[r].active) continue;
                if (part[r].metric >= p->stop_acc) {
                    runs[r].result.stopped_early = 1;
                    grid_end(&runs[r], &part[r], (int)step, mn_now() - t0);
                } else {
                    part[r].metric = NAN;
                }
            }
        }
        if (step == total) break;
        double now = mn_now();
        cut = (rs0->deadline > 0 && now >= rs0->deadline) || (rs0->stop_at > 0 && step >= rs0->stop_at);
        int save = cut || (rs0->save_every > 0 && now - t_saved >= rs0->save_every);
        for (int r = 0; r < n && save; r++)  // the states, as a kill would find them
            if (part[r].active && runs[r].resume.state_dir) {
                int e = grid_save(m, &opt, r, &runs[r], &part[r], cur, (int)step, B, T, now - t0);
                if (e) grid_fail(&runs[r], &part[r], e);
            }
        if (save) t_saved = mn_now();
        if (cut) {
            for (int r = 0; r < n; r++)
                if (part[r].active) {
                    runs[r].result.cut_short = 1, runs[r].result.metric = NAN, runs[r].result.steps = (int)step;
                    runs[r].result.seconds = part[r].saved.elapsed + (mn_now() - t0);
                    part[r].active = 0;
                }
            break;
        }
        cur ^= have_next;
    }
    int nwant = 0;  // the runs that trained to the end, scored together
    for (int r = 0; r < n && !st && !alone; r++) nwant += want[r] = part[r].active && isnan(part[r].metric);
    if (nwant) grid_score(t, s, m, runs, part, exs, want, smetric, stvd);
    for (int r = 0; r < n && !st && !alone; r++)
        if (part[r].active) grid_end(&runs[r], &part[r], (int)step, mn_now() - t0);
    if (st) {
        char why[MN_ERROR_MAX];
        snprintf(why, sizeof why, "%s", mn_last_error());
        for (int r = 0; r < n; r++) runs[r].status = st, snprintf(runs[r].error, sizeof runs[r].error, "synth: %s", why);
    }
    if (have_ts) train_step_free(&ts);
    if (have_opt) adamw_free(&opt, m);
    if (m) model_free(m);
    for (int r = 0; part && r < n; r++) {
        if (part[r].have_ex) examples_close(&part[r].ex);
        free(part[r].feed.order);
    }
    free(part), free(in), free(tg), free(w), free(loss), free(refused), free(seeds), free(want), free(smetric), free(exs);
    if (alone) grid_one_by_one(t, s, p, mixer, runs, n, be);  // saved at different steps
    return st;
}

// ---------------------------------------------------------------------------
// Published numbers

const char *const synth_published_source =
    "MesaNet paper (von Oswald et al., 2025), Table 1 (MAD; in-context and noisy recall merged in one column; "
    "each task the mean over all its settings, 66 in all, where a --settings baseline run has one a task)";

static const char *const mad_columns[5] = {"IC & noisy recall", "fuzzy recall", "memorize", "selective copy",
                                           "compress"};
static const struct {
    const char *mixer;  // our mixer name, or NULL where we have none
    double v[6];        // the five columns and the average
} mad_table[] = {
    {"mamba2", {100, 51.2, 42.0, 95.4, 41.3, 66.0}},      {"gla", {100, 39.0, 82.5, 96.1, 42.3, 72.0}},
    {"xlstm", {100, 47.6, 79.8, 95.4, 43.4, 73.2}},       {"deltanet", {100, 55.5, 40.8, 98.8, 43.3, 67.7}},
    {"gdn", {100, 32.7, 81.7, 95.7, 45.0, 71.0}},         {"hawk", {93.0, 13.6, 91.3, 77.0, 47.7, 64.5}},
    {"mesa", {100, 58.5, 77.2, 99.2, 45.4, 76.1}},        {"hawk,mesa", {100, 30.2, 85.6, 99.6, 52.3, 73.5}},
    {"mha", {100, 48.6, 84.7, 96.0, 49.5, 75.8}},
};

static const char *const mqar_source =
    "Zoology (Arora et al., 2023), Fig. 2: attention about 1.0 at every width and sequence length (read from the "
    "figure, approximate)";

const char *synth_published_source_of(const char *task) {
    if (!strcmp(task, "mqar")) return mqar_source;
    if (!strcmp(task, "mad") || !strncmp(task, "mad-", 4)) return synth_published_source;
    return NULL;
}

int synth_published(const char *task, const char *mixer, double *value, const char **column) {
    if (!strcmp(task, "mqar")) {
        if (strcmp(mixer, "mha")) return 0;
        *value = 100;
        if (column) *column = "Zoology Fig. 2, approx.";
        return 1;
    }
    int col = -1;
    if (!strcmp(task, "mad-recall") || !strcmp(task, "mad-noisy-recall")) col = 0;
    else if (!strcmp(task, "mad-fuzzy-recall")) col = 1;
    else if (!strcmp(task, "mad-memorization")) col = 2;
    else if (!strcmp(task, "mad-selective-copy")) col = 3;
    else if (!strcmp(task, "mad-compression")) col = 4;
    else if (!strcmp(task, "mad")) col = 5;
    if (col < 0) return 0;
    const char *name = !strcmp(mixer, "gdn-paper") ? "gdn" : !strcmp(mixer, "deltanet-paper") ? "deltanet" : mixer;
    for (size_t i = 0; i < sizeof mad_table / sizeof mad_table[0]; i++)
        if (!strcmp(mad_table[i].mixer, name)) {
            *value = mad_table[i].v[col];
            if (column) *column = col < 5 ? mad_columns[col] : "avg";
            return 1;
        }
    return 0;
}
