// The gated linear-attention mixers (mamba2, gla, deltanet, gdn) in the paper's shared
// parameterisation, and per-block mixer patterns ("gdn,mesa"): the gates' wiring (each mixer is
// the one it reduces to with a gate pinned), a pattern trained, checkpointed and loaded back, and
// the configs refused. What every mixer passes (gradients, the CPU against the reference, decoding,
// training, backends without the core) is the conformance battery's (test_conformance.c).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "core/backend.h"
#include "core/common.h"
#include "fd.h"
#include "mixer_case.h"
#include "model/model.h"
#include "model/presets.h"
#include "test.h"
#include "tmpdir.h"
#include "toy.h"
#include "train/checkpoint.h"
#include "train/optim.h"
#include "train/trainer.h"

// A mixer and its switches: output gate, fla's shared o_norm, beta in (0, 2).
typedef struct {
    const char *mixer;
    int gate, shared_onorm, neg_eigen;
} Case;

static const char *case_name(const Case *c, char *buf, size_t n) {
    snprintf(buf, n, "%s%s%s%s", c->mixer, c->gate ? " +gate" : "", c->shared_onorm ? " +shared norm" : "",
             c->neg_eigen ? " +neg_eigen" : "");
    return buf;
}

static ModelConfig config_of(const Case *k, int layers) {
    ModelConfig c;
    config_default(&c);
    mc_tiny_sizes(&c, k->mixer, layers);
    c.output_gate = k->gate;
    c.shared_onorm = k->shared_onorm;
    c.neg_eigen = k->neg_eigen;
    c.gate_bound = 3.0f;  // (Mesa's; the linear mixers have none)
    c.logit_cap = 2.5f;
    return c;
}

// ------------------------------------------------------------------- the gates' wiring

// Sets the named tensor of block 0 to a constant.
static void set_param(Model *m, const char *suffix, double value) {
    char name[96];
    snprintf(name, sizeof name, "model.layers.0.attn.%s", suffix);
    int t = model_find_param(m, name);
    if (t < 0) die("no tensor %s", name);
    double *v = m->p[t];  // (the reference's host memory)
    for (size_t j = 0; j < m->specs[t].numel; j++) v[j] = value;
}

// The parameters of `from` into `to` by name (the tensors `to` has).
static void copy_by_name(Model *to, const Model *from) {
    for (int t = 0; t < to->nparams; t++) {
        int f = model_find_param(from, to->specs[t].name);
        if (f < 0) die("%s: not in the source", to->specs[t].name);
        memcpy(to->p[t], from->p[f], to->specs[t].numel * sizeof(double));
    }
}

static double *layer_out(Model *m, const double *u, int B, int T) {
    size_t nd = (size_t)B * T * m->cfg.dim;
    double *y = xcalloc(nd, 8);
    if (m->mixers[0].ops->forward(&m->mixers[0], y, u, B, T, 0)) die("%s", mn_last_error());
    return y;
}

// Each mixer is the one it reduces to when a gate is pinned: gla with beta = 1 (W_b = 0,
// b_b = 40) is mamba2; gdn with gamma = 1 (W_a = 0, b_a = 40: log gamma = -4e-18) is deltanet;
// deltanet with neg_eigen and b = 0 (beta = 2 sigmoid(0) = 1) is deltanet with beta = 1. So
// mamba2 has no input gate, deltanet no decay, and neg_eigen doubles beta.
TEST(mixers_gates_reduce_to_each_other) {
    struct {
        Case big, small;
        const char *pin_w, *pin_b;  // the tensors of `big` pinned: weight 0, bias `value`
        double value;
        const char *pin_small_w, *pin_small_b;  // and of `small` (or NULL)
        double small_value;
    } pairs[] = {
        {{"gla", 1, 0, 0}, {"mamba2", 1, 0, 0}, "b_proj.weight", "b_proj.bias", 40, NULL, NULL, 0},
        {{"gdn", 0, 1, 0}, {"deltanet", 0, 1, 0}, "a_proj.weight", "a_proj.bias", 40, NULL, NULL, 0},
        {{"gdn", 1, 0, 1}, {"deltanet", 1, 0, 1}, "a_proj.weight", "a_proj.bias", 40, NULL, NULL, 0},
        {{"deltanet", 0, 0, 1}, {"deltanet", 0, 0, 0}, "b_proj.weight", "b_proj.bias", 0, "b_proj.weight",
         "b_proj.bias", 40},
    };
    int B = 2, T = 9;
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        char nb[96], ns[96];
        case_name(&pairs[i].big, nb, sizeof nb);
        case_name(&pairs[i].small, ns, sizeof ns);
        ModelConfig cb = config_of(&pairs[i].big, 1), cs = config_of(&pairs[i].small, 1);
        Model *mb = mc_make(&cb, backend_ref()), *ms = mc_make(&cs, backend_ref());
        mc_randomise(mb, 40 + i, mc_base_bias_lambda);
        set_param(mb, pairs[i].pin_w, 0);
        set_param(mb, pairs[i].pin_b, pairs[i].value);
        copy_by_name(ms, mb);
        if (pairs[i].pin_small_w) {
            set_param(ms, pairs[i].pin_small_w, 0);
            set_param(ms, pairs[i].pin_small_b, pairs[i].small_value);
        }
        double *u = rand_doubles(8, (size_t)B * T * cb.dim, -1, 1);
        double *yb = layer_out(mb, u, B, T), *ys = layer_out(ms, u, B, T);
        double e = rel_err64(yb, ys, (size_t)B * T * cb.dim);
        test_note("%s pinned == %s: rel err %.2e", nb, ns, e);
        CHECK(e <= 1e-12, "%s with %s pinned differs from %s by %.3g", nb, pairs[i].pin_b, ns, e);
        // and they are not the same without the pin (the check can fail)
        mc_randomise(mb, 50 + i, mc_base_bias_lambda);
        copy_by_name(ms, mb);
        free(yb);
        free(ys);
        yb = layer_out(mb, u, B, T);
        ys = layer_out(ms, u, B, T);
        e = rel_err64(yb, ys, (size_t)B * T * cb.dim);
        CHECK(e > 1e-3, "%s unpinned equals %s (rel err %.3g)", nb, ns, e);
        free(yb); free(ys); free(u);
        model_free(mb);
        model_free(ms);
    }
}

// ------------------------------------------------------------------- training

// The trainer with a JSON config of a pattern: it trains, checkpoints, and the checkpoint loads
// as the same pattern and gives the same loss.
TEST(mixers_train_run_with_a_pattern) {
    TmpDir t;
    tmp_make(&t);
    char data[256], out[256], cfgpath[256];
    snprintf(data, sizeof data, "%s/data", t.dir);
    snprintf(out, sizeof out, "%s/run", t.dir);
    snprintf(cfgpath, sizeof cfgpath, "%s/gdn.json", t.dir);
    write_toy_shards(data);
    const char *json = "{\"preset\": \"tiny\", \"mixer\": \"gdn,mesa\", \"neg_eigen\": true}";
    write_bytes(cfgpath, json, strlen(json));
    TrainOptions o = toy_train_options(data, out);
    o.config = cfgpath;
    o.eval_every = 0;  // (validation at the end only)
    FILE *devnull = fopen("/dev/null", "w");
    CHECK(!train_run(&o, devnull), "%s", mn_last_error());
    fclose(devnull);
    double l[64];
    int n = read_losses(out, l, 64);
    CHECK(n == 12, "loss rows: %d, expected 12", n);
    if (n == 12) test_note("gdn,mesa (neg_eigen): loss %.3f -> %.3f in 12 steps", l[0], l[11]);
    CHECK(n == 12 && l[11] < l[0] - 0.15, "training did not reduce the loss");
    Model *m = NULL;
    CHECK(!checkpoint_load_model(out, backend_cpu(), &m), "%s", mn_last_error());
    if (m) {
        CHECK(!strcmp(m->cfg.mixer, "gdn,mesa") && m->cfg.neg_eigen, "checkpoint's mixer '%s', neg_eigen %d",
              m->cfg.mixer, m->cfg.neg_eigen);
        CHECK(m->mixers[0].ops == &mixer_gdn && m->mixers[1].ops == &mixer_mesa, "blocks' mixers: %s, %s",
              m->mixers[0].ops->name, m->mixers[1].ops->name);
        CHECK(model_find_param(m, "model.layers.0.attn.lambda_params") < 0 &&
                  model_find_param(m, "model.layers.1.attn.lambda_params") >= 0 &&
                  model_find_param(m, "model.layers.0.attn.b_proj.bias") >= 0,
              "the blocks' tensors are not their mixers'");
        model_free(m);
    }
    tmp_remove(&t);
}

// ------------------------------------------------------------------- refusals

TEST(mixers_bad_configs_are_refused) {
    ModelConfig c;
    config_preset(&c, "tiny");
    c.vocab_size = 16;
    struct {
        const char *mixer;
        int layers, neg;
        const char *msg;
    } bad[] = {
        {"gdm", 2, 0, "unknown mixer 'gdm' (known: mesa, mamba2, gla, deltanet, gdn"},
        {"gdn,mesa2", 2, 0, "unknown mixer 'mesa2' (known: mesa, mamba2, gla, deltanet, gdn"},
        {"gdn,,mesa", 4, 0, "name 2 of the pattern is empty"},
        {"gdn,", 4, 0, "name 2 of the pattern is empty"},
        {"", 4, 0, "name 1 of the pattern is empty"},
        {"gdn, mesa", 4, 0, "unknown mixer ' mesa'"},
        {"gdn,mesa,gla", 2, 0, "a pattern of 3 mixers for 2 blocks"},
        {"gdn*3,mesa", 3, 0, "a pattern of 4 mixers for 3 blocks"},
        {"gdn*0,mesa", 4, 0, "item 1 \"gdn*0\" repeats a name by \"*N\" with N from 1 to 200"},
        {"gdn*,mesa", 4, 0, "item 1 \"gdn*\" repeats"},
        {"gdn*2x", 4, 0, "item 1 \"gdn*2x\" repeats"},
        {"gdn*999", 4, 0, "repeats a name"},
        {"*2", 4, 0, "name 1 of the pattern is empty"},
        {"mesa,gla", 2, 1, "neg_eigen = true does not apply to mixer \"mesa,gla\": only deltanet, gdn, gdn-paper, deltanet-paper read it"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ModelConfig d = c;
        snprintf(d.mixer, sizeof d.mixer, "%s", bad[i].mixer);
        d.n_layers = bad[i].layers;
        d.neg_eigen = bad[i].neg;
        int s = config_validate(&d, "cfg");
        CHECK(s == MN_ERR_ARG && strstr(mn_last_error(), bad[i].msg), "mixer \"%s\": status %d, '%s' lacks '%s'",
              bad[i].mixer, s, mn_last_error(), bad[i].msg);
        Model *m = NULL;
        CHECK(model_create(&m, &d, backend_cpu()) == MN_ERR_ARG && !m, "mixer \"%s\": a model was made", bad[i].mixer);
    }
    // valid patterns, also where the depth is not a multiple of the pattern's length
    const char *good[] = {"gdn", "gdn,mesa", "mamba2,gla,deltanet", "gdn,gdn,mesa,gla"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        ModelConfig d = c;
        snprintf(d.mixer, sizeof d.mixer, "%s", good[i]);
        d.n_layers = 5;
        CHECK(!config_validate(&d, "cfg"), "\"%s\": %s", good[i], mn_last_error());
    }
    ModelConfig d = c;
    // "name*k" repeats a name: block l of 7 gets gdn, gdn, mesa, gla, gla, gla, then gdn again
    strcpy(d.mixer, "gdn*2,mesa,gla*3");
    d.n_layers = 7;
    CHECK(mixer_pattern_check(d.mixer, 7) == 6, "gdn*2,mesa,gla*3 spans 6 blocks: %s", mn_last_error());
    const char *rep[7] = {"gdn", "gdn", "mesa", "gla", "gla", "gla", "gdn"};
    for (int l = 0; l < 7; l++)
        CHECK(!strcmp(mixer_at(&d, l)->name, rep[l]), "block %d: %s, expected %s", l, mixer_at(&d, l)->name, rep[l]);
    strcpy(d.mixer, "mamba2,gla,deltanet");
    d.n_layers = 5;
    Model *m = mc_make(&d, backend_cpu());
    const char *want[5] = {"mamba2", "gla", "deltanet", "mamba2", "gla"};
    for (int l = 0; l < 5; l++)
        CHECK(!strcmp(m->mixers[l].ops->name, want[l]), "block %d: %s, expected %s", l, m->mixers[l].ops->name, want[l]);
    CHECK(model_find_param(m, "model.layers.0.attn.b_proj.weight") < 0 &&
              model_find_param(m, "model.layers.2.attn.a_proj.weight") < 0 &&
              model_find_param(m, "model.layers.1.attn.a_proj.bias") >= 0,
          "mamba2 has no b_proj, deltanet no a_proj, gla both");
    // decoding with another batch than the state's: refused by the model and by the layer
    CHECK(!model_reset_state(m, 2), "%s", mn_last_error());
    int32_t tok[3] = {1, 2, 3};
    float logits[48];
    CHECK(model_decode(m, tok, 3, 1, logits) == MN_ERR_ARG && strstr(mn_last_error(), "reset for 2"), "'%s'",
          mn_last_error());
    void *y = m->be->alloc(m->be, 3 * 32, MEM_ACT), *u = m->be->alloc(m->be, 3 * 32, MEM_ACT);
    Mixer *mx = &m->mixers[1];
    CHECK(mx->ops->forward(mx, y, u, 3, 1, 1) == MN_ERR_ARG &&
              strstr(mn_last_error(), "gla: decoding 3 sequences, but the state was reset for 2"),
          "'%s'", mn_last_error());
    m->be->free(m->be, y);
    m->be->free(m->be, u);
    model_free(m);
    // JSON: a pattern that does not fit the field, and one that does
    TmpDir t;
    tmp_make(&t);
    const char *path = tmp_path(&t, "c.json");
    char long_json[400] = "{\"preset\": \"tiny\", \"mixer\": \"gdn";
    for (int i = 0; i < 60; i++) strcat(long_json, ",mesa");
    strcat(long_json, "\"}");
    write_bytes(path, long_json, strlen(long_json));
    CHECK(config_load(&d, path) != MN_OK && strstr(mn_last_error(), "\"mixer\" must be a string shorter than 256"),
          "'%s'", mn_last_error());
    const char *ok_json = "{\"preset\": \"demo\", \"mixer\": \"gdn\"}";
    write_bytes(path, ok_json, strlen(ok_json));
    CHECK(!config_load(&d, path) && !strcmp(d.mixer, "gdn") && d.dim == 192 && d.n_layers == 4, "demo gdn: %s",
          mn_last_error());
    tmp_remove(&t);
}
