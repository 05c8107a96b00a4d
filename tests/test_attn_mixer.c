// The attention mixers mha and swa (mixers/attn.c): float64 layer gradients against finite
// differences, the float32 CPU layer against the float64 reference, prefill + decode against one
// forward (the sliding window's ring buffer wrapping), swa's decoding memory, tiny Transformers and
// hybrids that learn, and the configs and backends refused.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "core/atomic_file.h"
#include "core/backend.h"
#include "core/common.h"
#include "fd.h"
#include "mixer_case.h"
#include "model/model.h"
#include "model/presets.h"
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
    mc_tiny_sizes(&c, k->mixer, layers);
    c.n_kv_heads = k->kv;
    if (k->window) c.window = k->window;
    c.rope_theta = 100;  // rotations that differ visibly across a few positions
    c.logit_cap = 0;
    return c;
}

static const char *aname(const ACase *k, char *buf, size_t n) {
    snprintf(buf, n, "%s kv=%d w=%d", k->mixer, k->kv, k->window);
    return buf;
}

// ------------------------------------------------------------------- the layer (float64)

TEST(attn_layer_gradients_match_finite_differences) {
    for (int i = 0; i < NA; i++) {
        char name[64];
        aname(&acases[i], name, sizeof name);
        ModelConfig cfg = acfg(&acases[i], 1);
        Model *m = mc_make(&cfg, backend_ref());
        mc_randomise(m, 7 + i, NULL);
        mc_check_layer_gradients(m, name, "attn du");
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
        Model *r = mc_make(&cfg, backend_ref()), *c = mc_make(&cfg, backend_cpu());
        mc_randomise(r, 3 + i, NULL);
        mc_copy_params(c, r);
        mc_check_layer_cpu_vs_ref(r, c, 2, 19, 5, 6, name, 16);
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
    Model *m = mc_make(&cfg, be);
    model_init_params(m, 1);
    mc_randomise(m, 12, NULL);
    int32_t tok[60];
    mc_tokens(tok, NULL, 60, cfg.vocab_size, 3);
    // a prefill of 11, single tokens, a prefill of 5 after earlier tokens, single tokens again
    double worst = mc_decode_vs_forward(m, tok, 2, 30, 11, 15, 5, 0, mixer, NULL);
    test_note("%s kv=%d window=%d on %s: decoded logits vs full forward, worst rel err %.2e", mixer, kv, window, be->name,
              worst);
    CHECK(worst <= tol, "%s window %d on %s: decoded logits differ by %.3g", mixer, window, be->name, worst);
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

// A prompt prefilled in pieces (model_prefill_pieces; what model_decode does with a prompt too
// long for the activations' buffers) leaves the same state as one prefill: the last tokens'
// logits equal the whole prompt's decode and the last row of the forward, and so do the single
// steps after it. Pieces of 1, 3 and 7 tokens (7 does not divide 20: a shorter last piece); swa's
// window of 2 is shorter than the pieces of 3 and 7, so the ring wraps inside a piece. The
// tolerances are attn_decode_matches_forward's (float64 reference 1e-6, float32 CPU 3e-5): the
// pieces run the same sums in another order (the per-token decode kernels and gdn's recurrent
// step instead of the whole-sequence cores), which moves the float32 logits by rounding only.
enum { PB = 3, PT = 20, PSTEPS = 4, PTT = PT + PSTEPS };

// Worst rel err over the B sequences of logits [B, V] against rows `t` of the forward's [B, PTT, V].
static double rows_err(const float *got, const float *full, int t, int V) {
    double w = 0;
    for (int b = 0; b < PB; b++) w = fmax(w, rel_err_ff(got + (size_t)b * V, full + ((size_t)b * PTT + t) * V, V));
    return w;
}

static void pieces_check(const char *mixer, int window, const Backend *be, double tol) {
    ACase k = {mixer, 0, window};
    ModelConfig cfg = acfg(&k, 2);
    cfg.dim = 32, cfg.head_dim = 8, cfg.n_heads = 4, cfg.vocab_size = 50, cfg.mlp_hidden = 48;
    Model *m = mc_make(&cfg, be);
    model_init_params(m, 1);
    mc_randomise(m, 12, NULL);
    int V = cfg.vocab_size;
    int32_t tok[PB * PTT], prompt[PB * PT], step[PB];
    mc_tokens(tok, NULL, PB * PTT, V, 5);
    for (int b = 0; b < PB; b++) memcpy(prompt + b * PT, tok + b * PTT, sizeof(int32_t) * PT);
    float *full = xcalloc((size_t)PB * PTT * V, 4), *whole = xcalloc((size_t)PB * V, 4), *got = xcalloc((size_t)PB * V, 4);
    CHECK(!model_forward(m, tok, NULL, PB, PTT, 0, NULL), "%s", mn_last_error());
    be->download_f32(be, full, m->logits, (size_t)PB * PTT * V, MEM_ACT);
    CHECK(!model_reset_state(m, PB) && !model_decode(m, prompt, PB, PT, whole), "%s: %s", mixer, mn_last_error());
    double vs_fwd = rows_err(whole, full, PT - 1, V), vs_whole = 0, steps = 0;
    const int pieces[3] = {1, 3, 7};
    for (int i = 0; i < 3; i++) {
        CHECK(!model_reset_state(m, PB) && !model_prefill_pieces(m, prompt, PB, PT, pieces[i], got), "%s piece %d: %s",
              mixer, pieces[i], mn_last_error());
        vs_whole = fmax(vs_whole, rel_err_ff(got, whole, (size_t)PB * V));
        vs_fwd = fmax(vs_fwd, rows_err(got, full, PT - 1, V));
        for (int t = PT; t < PTT; t++) {  // the state the pieces left goes on decoding
            for (int b = 0; b < PB; b++) step[b] = tok[b * PTT + t];
            CHECK(!model_decode(m, step, PB, 1, got), "%s: %s", mixer, mn_last_error());
            steps = fmax(steps, rows_err(got, full, t, V));
        }
    }
    test_note("%s window %d on %s: pieces vs whole prefill %.2e, vs forward %.2e, steps after %.2e", mixer, window,
              be->name, vs_whole, vs_fwd, steps);
    CHECK(vs_whole <= tol && vs_fwd <= tol && steps <= tol, "%s on %s: pieces differ by %.3g, %.3g, %.3g", mixer,
          be->name, vs_whole, vs_fwd, steps);
    free(full), free(whole), free(got);
    model_free(m);
}

TEST(attn_prefill_pieces_match_decode_and_forward) {
    const Backend *bes[2] = {backend_ref(), backend_cpu()};
    double tol[2] = {1e-6, 3e-5};
    for (int i = 0; i < 2; i++) {
        pieces_check("mha", 0, bes[i], tol[i]);
        pieces_check("swa", 2, bes[i], tol[i]);
        pieces_check("swa", 5, bes[i], tol[i]);
        pieces_check("gdn,mha", 0, bes[i], tol[i]);
    }
}

// mha's cache grows in chunks of 256 tokens, copying what it holds into the larger one: a prompt
// of 300 tokens in pieces of 128 grows it once with 256 tokens kept (the third piece); the last
// token's logits equal the forward's (tolerances of attn_decode_matches_forward).
TEST(attn_cache_growth_keeps_what_it_holds) {
    const Backend *bes[2] = {backend_ref(), backend_cpu()};
    double tol[2] = {1e-6, 3e-5};
    enum { GB = 2, GT = 300 };
    for (int i = 0; i < 2; i++) {
        ACase k = {"mha", 0, 0};
        ModelConfig cfg = acfg(&k, 1);
        Model *m = mc_make(&cfg, bes[i]);
        model_init_params(m, 1);
        int V = cfg.vocab_size;
        int32_t *tok = xcalloc(GB * GT, sizeof(int32_t));
        mc_tokens(tok, NULL, GB * GT, V, 9);
        float *full = xcalloc((size_t)GB * GT * V, 4), *got = xcalloc((size_t)GB * V, 4);
        CHECK(!model_forward(m, tok, NULL, GB, GT, 0, NULL), "%s", mn_last_error());
        bes[i]->download_f32(bes[i], full, m->logits, (size_t)GB * GT * V, MEM_ACT);
        CHECK(!model_reset_state(m, GB) && !model_prefill_pieces(m, tok, GB, GT, 128, got), "%s", mn_last_error());
        double w = 0;
        for (int b = 0; b < GB; b++) w = fmax(w, rel_err_ff(got + (size_t)b * V, full + ((size_t)b * GT + GT - 1) * V, V));
        test_note("mha on %s, 300 tokens in pieces of 128 (the cache grown once): vs forward %.2e", bes[i]->name, w);
        CHECK(w <= tol[i], "on %s: logits after the cache grew differ by %.3g", bes[i]->name, w);
        free(tok), free(full), free(got);
        model_free(m);
    }
}

// model_decode prefills in pieces by itself when the whole prompt's activations do not fit: the
// CPU backend wrapped to report only the bytes of 5 tokens a sequence and the room the piece
// choice keeps for mha's cache (the halving from 20 gives 10, then 5). The refusal it handled
// leaves no message behind; a model where not even one token fits gets the whole prompt's refusal.
static size_t fake_avail = SIZE_MAX;
static size_t fake_mem_available(const Backend *be) { return fake_avail; }

TEST(model_decode_prefills_in_pieces_when_short_of_memory) {
    Backend small = *backend_cpu();
    small.mem_available = fake_mem_available;
    ACase k = {"gdn,mha", 0, 0};
    ModelConfig cfg = acfg(&k, 2);
    int V = cfg.vocab_size;
    int32_t tok[2 * PT];
    mc_tokens(tok, NULL, 2 * PT, V, 7);
    float a[2 * 11], w[2 * 11];
    fake_avail = SIZE_MAX;
    Model *m = mc_make(&cfg, &small), *m0 = mc_make(&cfg, &small);
    model_init_params(m, 1);
    size_t cache = 2 * model_state_floats_per_token(&cfg) * 2 * PT * small.elem_size(&small, MEM_ACT);
    fake_avail = model_activation_bytes(&cfg, &small, 2 * 5) + cache;
    mn_error(MN_OK, "%s", "");
    CHECK(!model_reset_state(m, 2) && !model_decode(m, tok, 2, PT, a), "%s", mn_last_error());
    CHECK(m->cap == 2 * 5, "activations for %d tokens, expected 10 (pieces of 5)", m->cap);
    CHECK(!strcmp(mn_last_error(), "no error"), "a stale message: %s", mn_last_error());
    fake_avail = SIZE_MAX;
    CHECK(!model_reset_state(m, 2) && !model_decode(m, tok, 2, PT, w), "%s", mn_last_error());
    CHECK(m->cap == 2 * PT, "activations for %d tokens, expected the whole prompt's", m->cap);
    CHECK_REL("pieces of 5 vs the whole prompt", rel_err_ff(a, w, 2 * (size_t)V), 3e-5);
    fake_avail = 0;
    CHECK(!model_reset_state(m0, 2), "%s", mn_last_error());
    int st = model_decode(m0, tok, 2, PT, a);
    CHECK(st == MN_ERR_NOMEM && strstr(mn_last_error(), "a batch of 2 sequences of 20 tokens") &&
              strstr(mn_last_error(), "not even one sequence of 20 tokens fits"),
          "status %d: %s", st, mn_last_error());
    fake_avail = SIZE_MAX;
    model_free(m);
    model_free(m0);
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
    Model *m = mc_make(&c, &counted);
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
        Model *m = mc_make(&c, backend_cpu());
        model_init_params(m, 3);
        mc_check_tiny_trains(m, mixers[i], 10);
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
    Model *m = mc_make(&c, backend_cpu());
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
    strcpy(bad.mixer, "gdn");
    CHECK(config_validate(&bad, "t") == MN_ERR_ARG && strstr(mn_last_error(), "llama"), "llama gdn: %s", mn_last_error());
    bad = c;
    bad.embed_scale = 1;
    CHECK(config_validate(&bad, "t") == MN_ERR_ARG && strstr(mn_last_error(), "embed_scale"), "llama embed_scale");
    // Mistral: Llama's tensors, attention within sliding_window tokens (swa); null: full attention
    f = fopen(path, "w");
    fputs("{\"model_type\": \"mistral\", \"hidden_size\": 48, \"intermediate_size\": 96, \"num_hidden_layers\": 2, "
          "\"num_attention_heads\": 4, \"num_key_value_heads\": 1, \"head_dim\": 12, \"sliding_window\": 7, "
          "\"vocab_size\": 40}",
          f);
    fclose(f);
    CHECK(!config_load(&c, path), "%s", mn_last_error());
    CHECK(!strcmp(c.arch, "llama") && !strcmp(c.mixer, "swa") && c.window == 7 && c.n_kv_heads == 1 && c.head_dim == 12,
          "mistral config: arch %s mixer %s window %d", c.arch, c.mixer, c.window);
    CHECK(!config_save(&c, saved) && !config_load(&back, saved), "%s", mn_last_error());
    CHECK(!config_diff(&c, &back, diff, sizeof diff), "saved mistral config differs: %s", diff);
    char *text = NULL;
    size_t text_n = 0;
    if (file_read_all(saved, 1 << 20, &text, &text_n)) text = NULL;
    CHECK(text && strstr(text, "\"MistralForCausalLM\"") && strstr(text, "\"sliding_window\": 7"), "saved: %s",
          text ? text : mn_last_error());
    free(text);
    m = mc_make(&c, backend_cpu());
    CHECK(model_find_param(m, "model.layers.1.self_attn.v_proj.weight") >= 0, "mistral tensor names");
    model_free(m);
    f = fopen(path, "w");
    fputs("{\"model_type\": \"mistral\", \"hidden_size\": 48, \"num_attention_heads\": 4, \"sliding_window\": null}", f);
    fclose(f);
    CHECK(!config_load(&c, path) && !strcmp(c.mixer, "mha"), "mistral without a window: %s", mn_last_error());
    // transformers 5's RoPE block
    f = fopen(path, "w");
    fputs("{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_attention_heads\": 4, \"rope_parameters\": "
          "{\"rope_type\": \"default\", \"rope_theta\": 500000.0}}",
          f);
    fclose(f);
    CHECK(!config_load(&c, path) && c.rope_theta == 500000.0f, "rope_parameters: %s", mn_last_error());
    f = fopen(path, "w");
    fputs("{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_attention_heads\": 4, \"rope_parameters\": "
          "{\"rope_type\": \"yarn\", \"rope_theta\": 500000.0, \"factor\": 4.0}}",
          f);
    fclose(f);
    CHECK(config_load(&c, path) && strstr(mn_last_error(), "rope_type"), "yarn accepted: %s", mn_last_error());
    f = fopen(path, "w");
    fputs("{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_attention_heads\": 4, \"rope_scaling\": {\"rope_type\": "
          "\"llama3\"}}",
          f);
    fclose(f);
    CHECK(config_load(&c, path) && strstr(mn_last_error(), "rope_scaling"), "rope_scaling accepted: %s", mn_last_error());
    remove(path);
    remove(saved);
}
