// The hawk mixer beyond the conformance battery: its forward against transformers' RecurrentGemma
// recurrent block written out here in float64 (their code's orientation of the gate weights, x W),
// bad sizes refused by name, tiny hawk and hawk,mesa models that learn, an exact checkpoint round
// trip with a recurrence width of its own, and the hybrids' matched presets.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "core/common.h"
#include "fd.h"
#include "mixer_case.h"
#include "mixers/mixer.h"
#include "model/config.h"
#include "model/model.h"
#include "model/presets.h"
#include "test.h"
#include "tmpdir.h"
#include "train/checkpoint.h"
#include "train/optim.h"

static double *param(Model *m, int slot, size_t n) {
    double *p = xcalloc(n, sizeof(double));
    if (m->be->download(m->be, p, m->mixers[0].w[slot], n, MEM_PARAM)) die("%s", mn_last_error());
    return p;
}

static double sigm(double x) { return 1 / (1 + exp(-x)); }
static double gelu_tanh(double x) { return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }

// transformers' RecurrentGemmaRecurrentBlock.forward without a cache, for one sequence of T tokens
// u [T, D] (position_ids 0..T-1): its steps in its order. Wg[h][i][o] is transformers' gate weight
// (x W), which is ours transposed: ours[h][o][i].
static void hf_block(Model *m, const double *u, int T, double *out) {
    const ModelConfig *c = &m->cfg;
    int D = c->dim, L = c->lru_width ? c->lru_width : D, H = c->n_heads, bw = L / H, K = c->conv_size;
    size_t LD = (size_t)L * D;
    double *wy = param(m, 0, LD), *by = param(m, 1, L), *wx = param(m, 2, LD), *bx = param(m, 3, L);
    double *wo = param(m, 4, LD), *bo = param(m, 5, D), *cw = param(m, 6, (size_t)L * K), *cb = param(m, 7, L);
    double *wi = param(m, 8, (size_t)H * bw * bw), *bi = param(m, 9, L), *wr = param(m, 10, (size_t)H * bw * bw);
    double *br = param(m, 11, L), *lam = param(m, 12, L);
    double *y = xcalloc((size_t)T * L, 8), *xb = xcalloc((size_t)T * L, 8), *x = xcalloc((size_t)T * L, 8);
    double *h = xcalloc(L, 8), *g = xcalloc(L, 8);
    for (int t = 0; t < T; t++)
        for (int o = 0; o < L; o++) {
            double sy = by[o], sx = bx[o];
            for (int d = 0; d < D; d++) {
                sy += wy[(size_t)o * D + d] * u[(size_t)t * D + d];
                sx += wx[(size_t)o * D + d] * u[(size_t)t * D + d];
            }
            y[(size_t)t * L + o] = gelu_tanh(sy);
            xb[(size_t)t * L + o] = sx;
        }
    // nn.Conv1d(groups = L, padding = K - 1)[..., :T]: a cross-correlation over the left-padded input
    for (int t = 0; t < T; t++)
        for (int ch = 0; ch < L; ch++) {
            double s = cb[ch];
            for (int j = 0; j < K; j++) {
                int src = t + j - (K - 1);
                if (src >= 0) s += cw[(size_t)ch * K + j] * xb[(size_t)src * L + ch];
            }
            x[(size_t)t * L + ch] = s;
        }
    for (int t = 0; t < T; t++) {
        const double *xt = x + (size_t)t * L;
        for (int hd = 0; hd < H; hd++)
            for (int o = 0; o < bw; o++) {
                double ri = bi[hd * bw + o], rr = br[hd * bw + o];
                for (int i = 0; i < bw; i++) {  // baddbmm(bias, x, W): sum_i x[i] W[h, i, o], W[h, i, o] = ours[h, o, i]
                    ri += xt[hd * bw + i] * wi[((size_t)hd * bw + o) * bw + i];
                    rr += xt[hd * bw + i] * wr[((size_t)hd * bw + o) * bw + i];
                }
                int ch = hd * bw + o;
                double ig = sigm(ri), rg = sigm(rr);
                double log_a = -8.0 * rg * log1p(exp(lam[ch])), a = exp(log_a), a2 = exp(2 * log_a);
                double mult = t == 0 ? 1 : sqrt(1 - a2);  // reset + ~reset * multiplier
                h[ch] = (t == 0 ? 0 : a) * h[ch] + xt[ch] * ig * mult;
            }
        for (int ch = 0; ch < L; ch++) g[ch] = h[ch] * y[(size_t)t * L + ch];
        for (int d = 0; d < D; d++) {
            double s = bo[d];
            for (int ch = 0; ch < L; ch++) s += wo[(size_t)d * L + ch] * g[ch];
            out[(size_t)t * D + d] = s;
        }
    }
    double *f[] = {wy, by, wx, bx, wo, bo, cw, cb, wi, bi, wr, br, lam, y, xb, x, h, g};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) free(f[i]);
}

// The float64 layer against transformers' block as written above, on randomised weights (Lambda
// about 1: a from 0.01 to 0.3, so that the state carries over several tokens; sizeable gates) with
// a recurrence width of its own (lru_width 36 in 3 blocks of 12 over D = 24): the same numbers to
// float64 rounding (1e-12: the two sum in different orders).
TEST(hawk_matches_transformers_block) {
    ModelConfig c;
    config_default(&c);
    mc_tiny_sizes(&c, "hawk", 1);
    c.dim = 24, c.n_heads = 3, c.lru_width = 36;
    CHECK(!config_validate(&c, "hawk"), "%s", mn_last_error());
    Model *m = mc_make(&c, backend_ref());
    mc_randomise(m, 17, mc_base_bias_lambda);
    int B = 2, T = 9, D = c.dim;
    size_t nd = (size_t)B * T * D;
    double *u = rand_doubles(18, nd, -1, 1), *want = xcalloc(nd, 8), *got = xcalloc(nd, 8);
    for (int b = 0; b < B; b++) hf_block(m, u + (size_t)b * T * D, T, want + (size_t)b * T * D);
    double *dy = rand_doubles(19, nd, -1, 1);
    mc_layer_run(m, 0, u, dy, B, T, got, NULL, NULL);
    double e = rel_err64(got, want, nd);
    test_note("hawk vs transformers' block: rel err %.2e", e);
    CHECK_REL("hawk vs transformers' block (float64)", e, 1e-12);
    free(u); free(want); free(got); free(dy);
    model_free(m);
}

// A config the hawk mixer cannot be built with is refused before anything is made, naming the
// field and what was expected; a field hawk reads refused where no block reads it.
TEST(hawk_bad_sizes_are_refused) {
    struct {
        const char *mixer;
        int dim, heads, lru;
        const char *msg;
    } bad[] = {
        {"hawk", 32, 3, 0, "lru_width = 32 (0: dim) must be a multiple of n_heads = 3"},
        {"hawk", 32, 2, 33, "lru_width = 33 must be a multiple of n_heads = 2"},
        {"hawk,mesa", 32, 4, 30, "lru_width = 30 must be a multiple of n_heads = 4"},
        {"hawk", 32, 2, -4, "lru_width = -4 (hawk's recurrence width (0: dim)), expected 0 to"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ModelConfig c;
        CHECK(!config_preset(&c, "tiny"), "%s", mn_last_error());
        snprintf(c.mixer, sizeof c.mixer, "%s", bad[i].mixer);
        c.dim = bad[i].dim, c.n_heads = bad[i].heads, c.lru_width = bad[i].lru;
        int st = config_validate(&c, "cfg");
        CHECK(st == MN_ERR_ARG && strstr(mn_last_error(), bad[i].msg), "%s lru_width %d: status %d, '%s' lacks '%s'",
              bad[i].mixer, bad[i].lru, st, mn_last_error(), bad[i].msg);
    }
    // in a config file, a field no block reads is refused by name
    TmpDir t;
    tmp_make(&t);
    const char *json = "{\"preset\": \"tiny\", \"mixer\": \"gdn\", \"lru_width\": 64}";
    const char *path = tmp_path(&t, "c.json");
    write_bytes(path, json, strlen(json));
    ModelConfig c;
    int st = config_load(&c, path);
    CHECK(st && strstr(mn_last_error(), "\"lru_width\" does not apply to mixer \"gdn\": only hawk read it"), "status %d, '%s'",
          st, mn_last_error());
    tmp_remove(&t);
}

// Tiny models memorise one batch on the CPU (as train_overfits_a_tiny_batch): hawk alone with its
// MLP, and Hawk-MesaNet (hawk,mesa).
TEST(hawk_tiny_models_train) {
    const char *mixers[] = {"hawk", "hawk,mesa"};
    for (int k = 0; k < 2; k++) {
        ModelConfig c;
        CHECK(!config_preset(&c, "tiny"), "%s", mn_last_error());
        c.vocab_size = 64;
        snprintf(c.mixer, sizeof c.mixer, "%s", mixers[k]);
        Model *m = mc_make(&c, backend_cpu());
        model_init_params(m, 3);
        double first, last;
        mc_train_tiny(m, mixers[k], 200, &first, &last);
        test_note("%-10s loss %.3f -> %.4f after 200 steps on one batch", mixers[k], first, last);
        CHECK(last < 0.05, "%s did not memorise the batch: loss %.4f", mixers[k], last);
        model_free(m);
    }
}

// Weights, optimiser moments and config (lru_width 48 over D = 32) come back exactly.
TEST(hawk_checkpoint_round_trip_is_exact) {
    TmpDir t;
    tmp_make(&t);
    ModelConfig c;
    CHECK(!config_preset(&c, "tiny"), "%s", mn_last_error());
    c.vocab_size = 64;
    snprintf(c.mixer, sizeof c.mixer, "hawk,mesa");
    c.lru_width = 48;
    Model *m = mc_make(&c, backend_cpu()), *m2;
    model_init_params(m, 5);
    AdamW o = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .clip = 1}, o2;
    adamw_init(&o, m);
    int32_t tok[64], tgt[64];
    mc_tiny_batch(tok, tgt);
    model_zero_grad(m);
    CHECK(!model_forward(m, tok, tgt, 2, 32, 1.0f / 64, NULL) && !model_backward(m), "%s", mn_last_error());
    adamw_step(&o, m, 1e-3f, NULL);
    TrainState st = {1, 0, 1, 42, 64, 4.0}, st2;
    CHECK(!checkpoint_save_model(t.dir, m, 1) && !checkpoint_save_state(t.dir, m, &o, &st), "%s", mn_last_error());
    CHECK(!checkpoint_load_model(t.dir, backend_cpu(), &m2), "%s", mn_last_error());
    o2 = o;
    adamw_init(&o2, m2);
    CHECK(!checkpoint_load_state(t.dir, m2, &o2, &st2), "%s", mn_last_error());
    CHECK(!memcmp(&m->cfg, &m2->cfg, sizeof c) && m2->cfg.lru_width == 48, "config differs after the round trip");
    CHECK(m->total == m2->total && !memcmp(m->params, m2->params, m->total * 4), "weights differ after the round trip");
    CHECK(!memcmp(o.m, o2.m, m->total * 4) && !memcmp(o.v, o2.v, m->total * 4), "optimizer moments differ");
    adamw_free(&o, m);
    adamw_free(&o2, m2);
    model_free(m);
    model_free(m2);
    tmp_remove(&t);
}

// The hybrids' matched presets (SIZE-hawk-mesa, SIZE-griffin): their pattern, the size's backbone,
// Mesa's parameter count within half a step of the MLP width, by name and as a JSON "preset".
TEST(hawk_hybrid_presets) {
    TmpDir t;
    tmp_make(&t);
    for (int i = 0; config_matched_sizes[i]; i++) {
        ModelConfig ref;
        size_t target;
        CHECK(!config_preset(&ref, config_matched_sizes[i]) && !config_param_count(&ref, &target, NULL, NULL), "%s",
              mn_last_error());
        double tol = 3.0 * ref.dim * ref.n_layers * CONFIG_MATCH_STEP / 2;
        for (int h = 0; config_hybrids[h].name; h++) {
            char name[64];
            snprintf(name, sizeof name, "%s-%s", config_matched_sizes[i], config_hybrids[h].name);
            ModelConfig c, byjson;
            size_t total = 0;
            int st = config_preset(&c, name);
            CHECK(!st, "%s: %s", name, mn_last_error());
            if (st) continue;
            CHECK(!strcmp(c.mixer, config_hybrids[h].pattern), "%s: mixer '%s'", name, c.mixer);
            CHECK(!config_validate(&c, name) && !config_param_count(&c, &total, NULL, NULL), "%s: %s", name,
                  mn_last_error());
            CHECK(c.dim == ref.dim && c.n_layers == ref.n_layers && c.n_heads == ref.n_heads, "%s: backbone changed", name);
            CHECK(fabs((double)total - (double)target) <= tol, "%s: %zu parameters, Mesa's %zu (within %.0f)", name, total,
                  target, tol);
            char json[128];
            snprintf(json, sizeof json, "{\"preset\": \"%s\"}", name);
            write_bytes(tmp_path(&t, "p.json"), json, strlen(json));
            CHECK(!config_load(&byjson, tmp_path(&t, "p.json")) && !memcmp(&c, &byjson, sizeof c), "%s as a JSON preset: %s",
                  name, mn_last_error());
            test_note("%-18s %-14s %zu parameters (Mesa's %zu), MLP %d", name, c.mixer, total, target, c.mlp_hidden);
        }
    }
    ModelConfig c;
    CHECK(config_preset(&c, "125m-hawk-swa") == MN_ERR_ARG && strstr(mn_last_error(), "griffin"), "%s", mn_last_error());
    tmp_remove(&t);
}
