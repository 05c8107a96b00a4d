// The attention mixers mha and swa (mixers/attn.c): prompts prefilled in pieces (the sliding
// window's ring buffer wrapping inside a piece), mha's cache growing in chunks, the decoding memory
// by the formulas of the key/value caches, fla's and Hugging Face's configs and tensor names, and
// the configs refused. What every mixer passes (gradients, the CPU against the reference, prefill +
// decode against one forward, a fixed decoding state, training, backends without the core) is the
// conformance battery's (test_conformance.c).
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

// ------------------------------------------------------------------- decoding

// A prompt prefilled in pieces (model_prefill_pieces; what model_decode does with a prompt too
// long for the activations' buffers) leaves the same state as one prefill: the last tokens'
// logits equal the whole prompt's decode and the last row of the forward, and so do the single
// steps after it. Pieces of 1, 3 and 7 tokens (7 does not divide 20: a shorter last piece); swa's
// window of 2 is shorter than the pieces of 3 and 7, so the ring wraps inside a piece. The
// tolerances are those of prefill + decode against one forward (float64 reference 1e-6, float32
// CPU 3e-5: conformance_decode's where the float32 model's own rounding is small): the
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
// token's logits equal the forward's (the tolerances of attn_prefill_pieces_match_decode_and_forward).
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

// The decoding memory by the caches' formulas (conformance_state checks that state_floats is what
// reset_state allocates and that a fixed state does not grow): swa's ring holds 2 window n_kv_heads
// head_dim floats a layer, and none grow with the tokens; mha's cache holds 2 n_kv_heads head_dim a
// token and grows in chunks of 256 tokens, counted in the bytes the CPU backend holds.
static size_t bytes_after(const char *mixer, int steps) {
    Backend counted = mc_counted_cpu();
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
    size_t b = mc_counted_bytes();
    free(logits);
    model_free(m);
    return b;
}

TEST(attn_decode_memory_follows_the_formulas) {
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
    size_t m10 = bytes_after("mha", 10), m1000 = bytes_after("mha", 1000);
    test_note("backend bytes after 10 and 1000 decoded tokens: mha %zu, %zu", m10, m1000);
    // mha: 2 sequences x 2 layers x 2 (k, v) x H D floats per token, in chunks of 256 tokens
    size_t expect = (size_t)2 * 2 * 2 * c.n_heads * c.head_dim * 4 * (1024 - 256);
    CHECK(m1000 - m10 == expect, "mha's cache grew by %zu bytes, expected %zu", m1000 - m10, expect);
}

// ------------------------------------------------------------------- configs

// The JSON form of the task's Transformer.
TEST(attn_tiny_transformer_config_loads) {
    ModelConfig c;
    FILE *f = fopen("/tmp/mesanet_attn_tiny.json", "w");
    CHECK(f != NULL, "cannot write /tmp/mesanet_attn_tiny.json");
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
