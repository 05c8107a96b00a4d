// The attention mixers mha and swa (mixers/attn.c): float64 layer gradients against finite
// differences, the float32 CPU layer against the float64 reference, prefill + decode against one
// forward (the sliding window's ring buffer wrapping), swa's decoding memory, tiny Transformers and
// hybrids that learn, and the configs and backends refused.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/common.h"
#include "fd.h"
#include "model/model.h"
#include "test.h"
#include "train/optim.h"

typedef struct {
    const char *mixer;
    int kv, window;  // n_kv_heads (0: n_heads), swa's window
} ACase;

static const ACase acases[] = {{"mha", 0, 0}, {"mha", 1, 0}, {"swa", 0, 3}, {"swa", 1, 5}};
enum { NA = sizeof acases / sizeof acases[0] };

static ModelConfig acfg(const ACase *k, int layers) {
    ModelConfig c;
    config_default(&c);
    snprintf(c.mixer, sizeof c.mixer, "%s", k->mixer);
    c.vocab_size = 11;
    c.dim = 12;
    c.n_layers = layers;
    c.n_heads = 2;
    c.head_dim = 4;
    c.mlp_hidden = 10;
    c.seq_len = 8;
    c.n_kv_heads = k->kv;
    if (k->window) c.window = k->window;
    c.rope_theta = 100;  // rotations that differ visibly across a few positions
    c.logit_cap = 0;
    return c;
}

static Model *amake(const ModelConfig *c, const Backend *be) {
    Model *m = NULL;
    if (model_create(&m, c, be)) die("%s: %s", c->mixer, mn_last_error());
    return m;
}

static void arandomise(Model *m, uint64_t seed) {
    MnRng r;
    mn_rng_seed(&r, seed);
    double *v = xcalloc(m->total, sizeof(double));
    for (int i = 0; i < m->nparams; i++) {
        const ParamSpec *s = &m->specs[i];
        for (size_t j = 0; j < s->numel; j++) v[s->offset + j] = (s->init == INIT_NORMAL ? 0 : 1) + 0.5 * mn_rng_normal(&r);
    }
    if (m->be->upload(m->be, m->params, v, m->total, MEM_PARAM)) die("%s", mn_last_error());
    free(v);
}

static void acopy_params(Model *to, const Model *from) {
    double *v = xcalloc(from->total, sizeof(double));
    if (from->be->download(from->be, v, from->params, from->total, MEM_PARAM) ||
        to->be->upload(to->be, to->params, v, to->total, MEM_PARAM))
        die("%s", mn_last_error());
    free(v);
}

static const char *aname(const ACase *k, char *buf, size_t n) {
    snprintf(buf, n, "%s kv=%d w=%d", k->mixer, k->kv, k->window);
    return buf;
}

// ------------------------------------------------------------------- the layer (float64)

typedef struct {
    Mixer *mx;
    int B, T, D;
    double *u, *wy, *y;
} ACtx;

static double aloss(void *p) {
    ACtx *c = p;
    if (c->mx->ops->forward(c->mx, c->y, c->u, c->B, c->T, 0)) die("%s", mn_last_error());
    double s = 0;
    for (size_t i = 0; i < (size_t)c->B * c->T * c->D; i++) s += c->y[i] * c->wy[i];
    return s;
}

TEST(attn_layer_gradients_match_finite_differences) {
    for (int i = 0; i < NA; i++) {
        char name[64];
        aname(&acases[i], name, sizeof name);
        ModelConfig cfg = acfg(&acases[i], 1);
        Model *m = amake(&cfg, backend_ref());
        arandomise(m, 7 + i);
        int B = 2, T = 7, D = cfg.dim;
        size_t N = (size_t)B * T;
        ACtx c = {&m->mixers[0], B, T, D, rand_doubles(1, N * D, -1, 1), rand_doubles(2, N * D, -1, 1), xcalloc(N * D, 8)};
        aloss(&c);
        double *du = xcalloc(N * D, 8);
        model_zero_grad(m);
        CHECK(!c.mx->ops->backward(c.mx, du, c.wy), "%s: %s", name, mn_last_error());
        fd_check("attn du", aloss, &c, c.u, du, N * D, 1e-6);
        for (int t = m->blocks[0].first; t < m->blocks[0].first + m->blocks[0].count; t++)
            fd_check(m->specs[t].name, aloss, &c, m->p[t], m->g[t], m->specs[t].numel, 1e-6);
        free(c.u); free(c.wy); free(c.y); free(du);
        model_free(m);
    }
}

// ------------------------------------------------------------------- cpu against ref (the layer)

TEST(attn_layer_cpu_matches_reference) {
    for (int i = 0; i < NA; i++) {
        char name[64];
        aname(&acases[i], name, sizeof name);
        ModelConfig cfg = acfg(&acases[i], 1);
        cfg.dim = 32;
        cfg.head_dim = 8;
        cfg.n_heads = 4;
        if (cfg.n_kv_heads) cfg.n_kv_heads = 2;
        Model *r = amake(&cfg, backend_ref()), *c = amake(&cfg, backend_cpu());
        arandomise(r, 3 + i);
        acopy_params(c, r);
        int B = 2, T = 19, D = cfg.dim;
        size_t N = (size_t)B * T;
        double *u = rand_doubles(5, N * D, -1, 1), *dy = rand_doubles(6, N * D, -1, 1);
        double *yr = xcalloc(N * D, 8), *dur = xcalloc(N * D, 8);
        float *uf = floats_of(u, N * D), *dyf = floats_of(dy, N * D), *yc = xcalloc(N * D, 4), *duc = xcalloc(N * D, 4);
        const Backend *cb = backend_cpu();
        void *ub = cb->alloc(cb, N * D, MEM_ACT), *yb = cb->alloc(cb, N * D, MEM_ACT), *dyb = cb->alloc(cb, N * D, MEM_ACT),
             *dub = cb->alloc(cb, N * D, MEM_ACT);
        cb->upload_f32(cb, ub, uf, N * D, MEM_ACT);
        cb->upload_f32(cb, dyb, dyf, N * D, MEM_ACT);
        model_zero_grad(r);
        model_zero_grad(c);
        CHECK(!r->mixers[0].ops->forward(&r->mixers[0], yr, u, B, T, 0) &&
                  !r->mixers[0].ops->backward(&r->mixers[0], dur, dy),
              "%s ref: %s", name, mn_last_error());
        CHECK(!c->mixers[0].ops->forward(&c->mixers[0], yb, ub, B, T, 0) &&
                  !c->mixers[0].ops->backward(&c->mixers[0], dub, dyb),
              "%s cpu: %s", name, mn_last_error());
        cb->download_f32(cb, yc, yb, N * D, MEM_ACT);
        cb->download_f32(cb, duc, dub, N * D, MEM_ACT);
        char what[96];
        snprintf(what, sizeof what, "%s y", name);
        CHECK_REL(what, rel_err32(yc, yr, N * D), 1e-5);
        snprintf(what, sizeof what, "%s du", name);
        CHECK_REL(what, rel_err32(duc, dur, N * D), 1e-5);
        for (int t = r->blocks[0].first; t < r->blocks[0].first + r->blocks[0].count; t++) {
            size_t n = r->specs[t].numel;
            float *g = xcalloc(n, 4);
            double *gr = xcalloc(n, 8);
            cb->download_f32(cb, g, c->g[t], n, MEM_F32);
            r->be->download(r->be, gr, r->g[t], n, MEM_F32);
            snprintf(what, sizeof what, "%s %s", name, r->specs[t].name);
            CHECK_REL(what, rel_err32(g, gr, n), 1e-5);
            free(g); free(gr);
        }
        cb->free(cb, ub); cb->free(cb, yb); cb->free(cb, dyb); cb->free(cb, dub);
        free(u); free(dy); free(yr); free(dur); free(uf); free(dyf); free(yc); free(duc);
        model_free(r);
        model_free(c);
    }
}

// ------------------------------------------------------------------- decoding

static void adecode_check(const char *mixer, int kv, int window, const Backend *be, double tol) {
    ACase k = {mixer, kv, window};
    ModelConfig cfg = acfg(&k, 3);
    cfg.dim = 32;
    cfg.head_dim = 8;
    cfg.n_heads = 4;
    if (kv) cfg.n_kv_heads = 2;
    cfg.vocab_size = 50;
    cfg.mlp_hidden = 48;
    Model *m = amake(&cfg, be);
    model_init_params(m, 1);
    arandomise(m, 12);
    int B = 2, T = 30, V = cfg.vocab_size, T1 = 11;
    int32_t tok[60], buf[60];
    MnRng r;
    mn_rng_seed(&r, 3);
    for (int i = 0; i < 60; i++) tok[i] = (int32_t)(mn_rng_u64(&r) % (uint64_t)V);
    CHECK(!model_forward(m, tok, NULL, B, T, 0, NULL), "%s", mn_last_error());
    float *full = xcalloc((size_t)B * T * V, 4), *step = xcalloc((size_t)B * T * V, 4);
    be->download_f32(be, full, m->logits, (size_t)B * T * V, MEM_ACT);
    CHECK(!model_reset_state(m, B), "%s", mn_last_error());
    double worst = 0;
    // a prefill of T1, single tokens, a prefill of 5 after earlier tokens, single tokens again
    for (int t0 = 0; t0 < T;) {
        int n = t0 == 0 ? T1 : t0 == 15 ? 5 : 1;
        for (int b = 0; b < B; b++) memcpy(buf + b * n, tok + b * T + t0, sizeof(int32_t) * n);
        CHECK(!model_decode(m, buf, B, n, step), "%s: %s", mixer, mn_last_error());
        t0 += n;
        for (int b = 0; b < B; b++)
            worst = fmax(worst, rel_err_ff(step + (size_t)b * V, full + ((size_t)b * T + t0 - 1) * V, V));
    }
    test_note("%s kv=%d window=%d on %s: decoded logits vs full forward, worst rel err %.2e", mixer, kv, window, be->name,
              worst);
    CHECK(worst <= tol, "%s window %d on %s: decoded logits differ by %.3g", mixer, window, be->name, worst);
    free(full); free(step);
    model_free(m);
}

TEST(attn_decode_matches_forward) {
    const Backend *bes[2] = {backend_ref(), backend_cpu()};
    double tol[2] = {1e-6, 3e-5};
    for (int i = 0; i < 2; i++) {
        adecode_check("mha", 0, 0, bes[i], tol[i]);
        adecode_check("mha", 1, 0, bes[i], tol[i]);
        adecode_check("swa", 0, 4, bes[i], tol[i]);   // T = 30 > window: the ring wraps
        adecode_check("swa", 1, 7, bes[i], tol[i]);
        adecode_check("swa", 0, 13, bes[i], tol[i]);  // window > the first prefill
        adecode_check("gdn,swa", 0, 4, bes[i], tol[i]);
    }
}

// swa's decoding memory: the cache's slots are the window's, whatever the length; mha's grows.
// Measured with the CPU backend wrapped to count the bytes it holds.
enum { MAXLIVE = 4096 };
static struct {
    void *p;
    size_t bytes;
} live[MAXLIVE];
static size_t live_bytes;

static void *count_alloc(const Backend *be, size_t n, MemKind kind) {
    void *p = backend_cpu()->alloc(backend_cpu(), n, kind);
    if (!p) return p;
    for (int i = 0; i < MAXLIVE; i++)
        if (!live[i].p) {
            live[i].p = p;
            live[i].bytes = n * backend_cpu()->elem_size(backend_cpu(), kind);
            live_bytes += live[i].bytes;
            break;
        }
    return p;
}

static void count_free(const Backend *be, void *p) {
    for (int i = 0; i < MAXLIVE; i++)
        if (live[i].p == p) {
            live_bytes -= live[i].bytes;
            live[i].p = NULL;
            break;
        }
    backend_cpu()->free(backend_cpu(), p);
}

// Bytes the backend holds after decoding `steps` single tokens (after a prefill of 4).
static size_t bytes_after(const char *mixer, int steps) {
    Backend counted = *backend_cpu();
    counted.alloc = count_alloc;
    counted.free = count_free;
    memset(live, 0, sizeof live);
    live_bytes = 0;
    ModelConfig c;
    config_preset(&c, "tiny");
    c.vocab_size = 16;
    strcpy(c.mixer, mixer);
    c.window = 8;
    Model *m = amake(&c, &counted);
    model_init_params(m, 1);
    CHECK(!model_reset_state(m, 2), "%s", mn_last_error());
    int32_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    float *logits = xcalloc(2 * 16, 4);
    CHECK(!model_decode(m, tok, 2, 4, logits), "%s", mn_last_error());
    for (int t = 0; t < steps; t++) CHECK(!model_decode(m, tok, 2, 1, logits), "%s", mn_last_error());
    size_t b = live_bytes;
    free(logits);
    model_free(m);
    CHECK(live_bytes == 0, "%s: %zu bytes left after model_free", mixer, live_bytes);
    return b;
}

TEST(attn_swa_decode_memory_is_fixed) {
    ModelConfig c;
    config_preset(&c, "tiny");
    c.vocab_size = 16;
    strcpy(c.mixer, "swa");
    c.window = 8;
    size_t per_layer = 2 * (size_t)c.window * c.n_heads * c.head_dim;
    CHECK(model_state_floats(&c) == (size_t)c.n_layers * per_layer, "swa state floats %zu", model_state_floats(&c));
    CHECK(mixer_swa.state_floats_per_token(&c) == 0, "swa grows per token");
    strcpy(c.mixer, "mha");
    CHECK(model_state_floats(&c) == 0 && mixer_mha.state_floats_per_token(&c) == 2 * (size_t)c.n_heads * c.head_dim,
          "mha per-token floats");
    size_t s10 = bytes_after("swa", 10), s1000 = bytes_after("swa", 1000);
    size_t m10 = bytes_after("mha", 10), m1000 = bytes_after("mha", 1000);
    test_note("backend bytes after 10 and 1000 decoded tokens: swa %zu, %zu; mha %zu, %zu", s10, s1000, m10, m1000);
    CHECK(s10 == s1000, "swa's decoding memory grew: %zu -> %zu bytes", s10, s1000);
    // mha: 2 sequences x 2 layers x 2 (k, v) x H D floats per token, in chunks of 256 tokens
    size_t expect = (size_t)2 * 2 * 2 * c.n_heads * c.head_dim * 4 * (1024 - 256);
    CHECK(m1000 - m10 == expect, "mha's cache grew by %zu bytes, expected %zu", m1000 - m10, expect);
}

// ------------------------------------------------------------------- tiny models learn

TEST(attn_tiny_models_train) {
    const char *mixers[] = {"mha", "swa", "gdn,swa", "mesa,swa"};
    for (size_t i = 0; i < sizeof mixers / sizeof mixers[0]; i++) {
        ModelConfig c;
        if (config_preset(&c, "tiny")) die("%s", mn_last_error());
        c.vocab_size = 64;
        snprintf(c.mixer, sizeof c.mixer, "%s", mixers[i]);
        c.window = 8;
        Model *m = amake(&c, backend_cpu());
        model_init_params(m, 3);
        AdamW o = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0, .clip = 1};
        adamw_init(&o, m);
        MnRng r;
        mn_rng_seed(&r, 9);
        int32_t tok[64], tgt[64];
        for (int j = 0; j < 64; j++) tok[j] = (int32_t)(mn_rng_u64(&r) % 64);
        for (int j = 0; j < 64; j++) tgt[j] = j % 32 == 31 ? (int32_t)(mn_rng_u64(&r) % 64) : tok[j + 1];
        double first = 0, last = 0;
        for (int step = 0; step < 20; step++) {
            double loss;
            model_zero_grad(m);
            CHECK(!model_forward(m, tok, tgt, 2, 32, 1.0f / 64, &loss) && !model_backward(m), "%s: %s", mixers[i],
                  mn_last_error());
            adamw_step(&o, m, 1e-2f, NULL);
            if (step == 0) first = loss / 64;
            last = loss / 64;
        }
        test_note("%-10s loss %.3f -> %.3f in 20 steps", mixers[i], first, last);
        CHECK(isfinite(last) && last < first - 1.0, "%s: the loss did not fall: %.3f -> %.3f", mixers[i], first, last);
        adamw_free(&o, m);
        model_free(m);
    }
    // the JSON form of the task's Transformer
    ModelConfig c;
    FILE *f = fopen("/tmp/mesanet_attn_tiny.json", "w");
    if (f) {
        fputs("{\"preset\":\"tiny\",\"mixer\":\"mha\"}", f);
        fclose(f);
        CHECK(!config_load(&c, "/tmp/mesanet_attn_tiny.json") && !strcmp(c.mixer, "mha"), "%s", mn_last_error());
        remove("/tmp/mesanet_attn_tiny.json");
    }
}

// ------------------------------------------------------------------- refusals

TEST(attn_bad_configs_are_refused) {
    ModelConfig c;
    config_preset(&c, "tiny");
    c.vocab_size = 16;
    strcpy(c.mixer, "mha");
    c.n_kv_heads = 3;  // n_heads = 2
    CHECK(config_validate(&c, "t") == MN_ERR_ARG && strstr(mn_last_error(), "n_kv_heads = 3 does not divide n_heads = 2"),
          "kv: %s", mn_last_error());
    c.n_kv_heads = 1;
    CHECK(!config_validate(&c, "t"), "kv 1: %s", mn_last_error());
    strcpy(c.mixer, "gdn,swa");
    c.window = 0;
    CHECK(config_validate(&c, "t") == MN_ERR_ARG && strstr(mn_last_error(), "window = 0"), "window: %s",
          mn_last_error());
    strcpy(c.mixer, "mha");  // the window is swa's alone
    CHECK(!config_validate(&c, "t"), "mha window 0: %s", mn_last_error());
    c.window = -1;
    CHECK(config_validate(&c, "t") == MN_ERR_ARG, "window -1 accepted");
}

TEST(attn_refused_on_a_backend_without_attention) {
    Backend noattn = *backend_cpu();
    noattn.name = "cuda";
    noattn.attn_fwd = NULL;
    noattn.attn_bwd = NULL;
    ModelConfig c;
    config_preset(&c, "tiny");
    c.vocab_size = 16;
    const char *mixers[] = {"mha", "swa", "gdn,swa"};
    for (size_t i = 0; i < 3; i++) {
        snprintf(c.mixer, sizeof c.mixer, "%s", mixers[i]);
        Model *m = NULL;
        char want[96];
        snprintf(want, sizeof want, "mixer %s is not available on the cuda backend yet (it has no attention",
                 strchr(mixers[i], ',') ? strchr(mixers[i], ',') + 1 : mixers[i]);
        int s = model_create(&m, &c, &noattn);
        CHECK(s == MN_ERR_UNSUPPORTED && !m && strstr(mn_last_error(), want), "%s: status %d, '%s' lacks '%s'",
              mixers[i], s, mn_last_error(), want);
    }
}

// ------------------------------------------------------------------- fla's TransformerForCausalLM

// fla's config.json of a Transformer (model_type "transformer") loads as the fla architecture with
// mha (swa where window_size is set); a saved fla mha/swa config is fla's and loads back the same.
TEST(attn_fla_transformer_config) {
    const char *path = "/tmp/mesanet_attn_hf.json", *saved = "/tmp/mesanet_attn_saved.json";
    const char *texts[2] = {
        "{\"model_type\": \"transformer\", \"hidden_size\": 64, \"num_hidden_layers\": 3, \"num_heads\": 4, "
        "\"num_kv_heads\": 2, \"window_size\": null, \"rope_theta\": 500000.0, \"vocab_size\": 100, "
        "\"hidden_ratio\": 4, \"intermediate_size\": null, \"norm_eps\": 1e-05, \"tie_word_embeddings\": false, "
        "\"max_position_embeddings\": 512, \"qkv_bias\": false, \"qk_norm\": false, \"hidden_act\": \"swish\"}",
        "{\"model_type\": \"transformer\", \"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_heads\": 4, "
        "\"window_size\": 16, \"vocab_size\": 100, \"intermediate_size\": 128}"};
    for (int i = 0; i < 2; i++) {
        FILE *f = fopen(path, "w");
        if (!f) die("cannot write %s", path);
        fputs(texts[i], f);
        fclose(f);
        ModelConfig c, back;
        CHECK(!config_load(&c, path), "%d: %s", i, mn_last_error());
        CHECK(!strcmp(c.arch, "fla") && !strcmp(c.mixer, i ? "swa" : "mha") && c.dim == 64 && c.head_dim == 16 &&
                  c.n_kv_heads == (i ? 0 : 2) && (i ? c.window == 16 : c.rope_theta == 500000.0f) &&
                  c.mlp_hidden == (i ? 128 : 256) && !c.embed_scale && c.logit_cap == 0,
              "%d: mixer %s arch %s dim %d head_dim %d kv %d window %d theta %g mlp %d", i, c.mixer, c.arch, c.dim,
              c.head_dim, c.n_kv_heads, c.window, (double)c.rope_theta, c.mlp_hidden);
        CHECK(!config_save(&c, saved), "%s", mn_last_error());
        CHECK(!config_load(&back, saved), "%s", mn_last_error());
        char diff[256];
        CHECK(!config_diff(&c, &back, diff, sizeof diff), "%d: saved config differs: %s", i, diff);
        char *text = NULL;
        size_t n = 0;
        FILE *g = fopen(saved, "r");
        if (g) {
            text = xcalloc(1 << 16, 1);
            n = fread(text, 1, (1 << 16) - 1, g);
            fclose(g);
        }
        CHECK(text && n && strstr(text, "\"TransformerForCausalLM\"") && strstr(text, i ? "\"window_size\": 16" : "\"window_size\": null"),
              "%d: not fla's Transformer config:\n%s", i, text ? text : "");
        free(text);
    }
    FILE *f = fopen(path, "w");
    fputs("{\"model_type\": \"transformer\", \"hidden_size\": 64, \"num_heads\": 4, \"qkv_bias\": true}", f);
    fclose(f);
    ModelConfig c;
    CHECK(config_load(&c, path) && strstr(mn_last_error(), "qkv_bias"), "qkv_bias accepted: %s", mn_last_error());
    remove(path);
    remove(saved);
}

// ------------------------------------------------------------------- Hugging Face's LlamaForCausalLM

TEST(attn_llama_config_and_names) {
    const char *path = "/tmp/mesanet_attn_llama.json", *saved = "/tmp/mesanet_attn_llama_saved.json";
    FILE *f = fopen(path, "w");
    if (!f) die("cannot write %s", path);
    fputs("{\"model_type\": \"llama\", \"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 48, "
          "\"intermediate_size\": 96, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
          "\"head_dim\": 16, \"rms_norm_eps\": 1e-05, \"rope_theta\": 500000.0, \"rope_scaling\": null, "
          "\"attention_bias\": false, \"mlp_bias\": false, \"vocab_size\": 40, \"tie_word_embeddings\": true, "
          "\"max_position_embeddings\": 256, \"hidden_act\": \"silu\"}",
          f);
    fclose(f);
    ModelConfig c, back;
    CHECK(!config_load(&c, path), "%s", mn_last_error());
    CHECK(!strcmp(c.arch, "llama") && !strcmp(c.mixer, "mha") && c.dim == 48 && c.head_dim == 16 && c.n_heads == 4 &&
              c.n_kv_heads == 2 && c.mlp_hidden == 96 && c.tie_embeddings && c.rope_theta == 500000.0f &&
              !c.embed_scale && c.logit_cap == 0 && c.norm_eps == 1e-5f,
          "llama config: arch %s mixer %s dim %d mlp %d", c.arch, c.mixer, c.dim, c.mlp_hidden);
    CHECK(!config_save(&c, saved) && !config_load(&back, saved), "%s", mn_last_error());
    char diff[256];
    CHECK(!config_diff(&c, &back, diff, sizeof diff), "saved llama config differs: %s", diff);
    Model *m = amake(&c, backend_cpu());
    const char *want[] = {"model.embed_tokens.weight", "model.layers.1.input_layernorm.weight",
                          "model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight",
                          "model.layers.0.post_attention_layernorm.weight", "model.layers.0.mlp.down_proj.weight",
                          "model.norm.weight"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        CHECK(model_find_param(m, want[i]) >= 0, "no tensor %s", want[i]);
    int k = model_find_param(m, "model.layers.1.self_attn.k_proj.weight");
    CHECK(k >= 0 && m->specs[k].shape[0] == 32 && m->specs[k].shape[1] == 48, "k_proj shape");
    model_free(m);
    // other mixers, and the paper's embedding scale, are not Llama's
    ModelConfig bad = c;
    strcpy(bad.mixer, "swa");
    CHECK(config_validate(&bad, "t") == MN_ERR_ARG && strstr(mn_last_error(), "llama"), "llama swa: %s", mn_last_error());
    f = fopen(path, "w");
    fputs("{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_attention_heads\": 4, \"rope_scaling\": {\"rope_type\": "
          "\"llama3\"}}",
          f);
    fclose(f);
    CHECK(config_load(&c, path) && strstr(mn_last_error(), "rope_scaling"), "rope_scaling accepted: %s", mn_last_error());
    remove(path);
    remove(saved);
}
