// The recurrent_gemma architecture (transformers' RecurrentGemmaForCausalLM), CPU only: its
// config.json read (the hub's form and transformers 5's rope_parameters), written and read again, and
// what mesanet does not compute refused by name; a checkpoint's logits against a float64 transcription
// of transformers' modeling_recurrent_gemma.py that reads the checkpoint's own file (so the tensor
// names, the norms' stored offsets w of 1 + w, the gates' [H, in, out] blocks, the bf16 embedding
// scale, the rotary half and the cycled block types are all checked against transformers' arithmetic,
// not against our own); and export / reload giving the same logits bit for bit. The comparison with
// transformers itself is bench/rgemma_check.py's (not part of this suite).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "core/common.h"
#include "core/safetensors.h"
#include "mixers/mixer.h"
#include "model/config.h"
#include "model/model.h"
#include "model/presets.h"
#include "test.h"
#include "tmpdir.h"
#include "train/checkpoint.h"

// ------------------------------------------------------------------------------ configs

// A config.json as the hub's recurrentgemma-2b has it (transformers 4's keys), at tiny sizes.
static const char *hub_config =
    "{\"architectures\": [\"RecurrentGemmaForCausalLM\"], \"attention_bias\": false, \"attention_window_size\": 5, "
    "\"block_types\": [\"recurrent\", \"recurrent\", \"attention\"], \"bos_token_id\": 2, \"conv1d_width\": 4, "
    "\"embeddings_scale_by_sqrt_dim\": true, \"eos_token_id\": 1, \"final_w_init_variance_scale\": 0.5, "
    "\"head_dim\": 12, \"hidden_activation\": \"gelu_pytorch_tanh\", \"hidden_size\": 24, \"intermediate_size\": 40, "
    "\"logits_soft_cap\": 5.0, \"lru_width\": 32, \"model_type\": \"recurrent_gemma\", \"num_attention_heads\": 2, "
    "\"num_hidden_layers\": 4, \"num_key_value_heads\": 1, \"pad_token_id\": 0, \"partial_rotary_factor\": 0.5, "
    "\"rms_norm_eps\": 1e-06, \"rope_theta\": 100.0, \"torch_dtype\": \"float32\", \"transformers_version\": "
    "\"4.40.0\", \"use_cache\": true, \"vocab_size\": 37, \"w_init_variance_scale\": 0.01}";

static int load_text(ModelConfig *c, TmpDir *t, const char *text) {
    const char *path = tmp_path(t, "config.json");
    write_bytes(path, text, strlen(text));
    return config_load(c, path);
}

// text with the first occurrence of `from` replaced by `to` (owned by the caller).
static char *edited(const char *text, const char *from, const char *to) {
    const char *p = strstr(text, from);
    if (!p) die("edited: '%s' not in the config", from);
    size_t n = strlen(text) - strlen(from) + strlen(to) + 1;
    char *out = xcalloc(n, 1);
    snprintf(out, n, "%.*s%s%s", (int)(p - text), text, to, p + strlen(from));
    return out;
}

// The hub config with n edits (pairs from, to) applied in order (owned by the caller).
static char *hub_edited(const char *const (*e)[2], int n) {
    char *text = edited(hub_config, "", "");
    for (int i = 0; i < n; i++) {
        char *next = edited(text, e[i][0], e[i][1]);
        free(text);
        text = next;
    }
    return text;
}

TEST(rgemma_config_reads_transformers_keys) {
    TmpDir t;
    tmp_make(&t);
    ModelConfig c;
    CHECK(!load_text(&c, &t, hub_config), "%s", mn_last_error());
    CHECK(!strcmp(c.arch, "recurrent_gemma") && !strcmp(c.mixer, "hawk*2,swa") && c.dim == 24 && c.n_layers == 4 &&
              c.n_heads == 2 && c.head_dim == 12 && c.rope_dim == 6 && c.o_bias && c.n_kv_heads == 1 &&
              c.lru_width == 32 && c.mlp_hidden == 20 && c.window == 5 && c.conv_size == 4 && c.vocab_size == 37 &&
              c.logit_cap == 5.0f && c.rope_theta == 100.0f && c.tie_embeddings && c.embed_scale,
          "arch %s mixer %s dim %d layers %d heads %d x %d rope_dim %d o_bias %d kv %d lru %d mlp %d window %d", c.arch,
          c.mixer, c.dim, c.n_layers, c.n_heads, c.head_dim, c.rope_dim, c.o_bias, c.n_kv_heads, c.lru_width,
          c.mlp_hidden, c.window);
    // transformers 5's RoPE (rope_parameters), the defaults of absent keys, and a block_types list longer
    // than the model (cut to its layers, as transformers' layers_block_type is)
    CHECK(!load_text(&c, &t,
                     "{\"model_type\": \"recurrent_gemma\", \"hidden_size\": 32, \"num_attention_heads\": 4, "
                     "\"num_hidden_layers\": 3, \"intermediate_size\": 97, \"vocab_size\": 50, \"rope_parameters\": "
                     "{\"rope_type\": \"default\", \"rope_theta\": 500.0, \"partial_rotary_factor\": 0.5}, "
                     "\"block_types\": [\"attention\", \"recurrent\", \"recurrent\", \"attention\"], "
                     "\"tie_word_embeddings\": false}"),
          "%s", mn_last_error());
    CHECK(!strcmp(c.mixer, "swa,hawk*2") && c.head_dim == 8 && c.rope_dim == 4 && c.mlp_hidden == 48 &&
              c.rope_theta == 500.0f && c.lru_width == 0 && c.n_kv_heads == 0 && c.window == 2048 &&
              c.conv_size == 4 && c.logit_cap == 30.0f && !c.tie_embeddings,
          "mixer %s head_dim %d mlp %d theta %g lru %d window %d", c.mixer, c.head_dim, c.mlp_hidden,
          (double)c.rope_theta, c.lru_width, c.window);
    tmp_remove(&t);
}

TEST(rgemma_config_round_trip) {
    TmpDir t;
    tmp_make(&t);
    ModelConfig c, back, hf;
    CHECK(!load_text(&c, &t, hub_config), "%s", mn_last_error());
    const char *saved = tmp_path(&t, "saved.json");
    CHECK(!config_save(&c, saved), "%s", mn_last_error());
    CHECK(!config_load(&back, saved), "%s", mn_last_error());
    char diff[256];
    CHECK(!config_diff(&c, &back, diff, sizeof diff), "our config.json read back differs: %s", diff);
    // its Hugging Face part alone (our block cut off) reads as the same model
    size_t n;
    char *text = (char *)read_bytes(saved, &n);
    char *cut = strstr(text, ",\n  \"mesanet\"");
    CHECK(cut != NULL, "no mesanet block in %s", saved);
    if (cut) strcpy(cut, "\n}\n");
    CHECK(!load_text(&hf, &t, text), "%s", mn_last_error());
    CHECK(!config_diff(&c, &hf, diff, sizeof diff), "its Hugging Face part reads back different: %s", diff);
    CHECK(strstr(text, "\"block_types\": [\"recurrent\", \"recurrent\", \"attention\"]") &&
              strstr(text, "\"intermediate_size\": 40") && strstr(text, "\"partial_rotary_factor\": 0.5"),
          "config.json: %s", text);
    free(text);
    tmp_remove(&t);
}

TEST(rgemma_config_refusals_name_the_key) {
    static const struct {
        const char *from, *to, *why;
    } bad[] = {
        {"\"attention_bias\": false", "\"attention_bias\": true", "attention_bias"},
        {"\"gelu_pytorch_tanh\"", "\"gelu\"", "hidden_activation"},
        {"\"partial_rotary_factor\": 0.5", "\"partial_rotary_factor\": 0.25", "partial_rotary_factor"},
        {"\"logits_soft_cap\": 5.0", "\"logits_soft_cap\": null", "logits_soft_cap"},
        {"\"head_dim\": 12", "\"head_dim\": 16", "head_dim"},
        {"\"recurrent\", \"attention\"]", "\"recurrent\", \"mlp\"]", "block_types[2]"},
        {"\"embeddings_scale_by_sqrt_dim\": true", "\"embeddings_scale_by_sqrt_dim\": false",
         "embeddings_scale_by_sqrt_dim"},
        {"\"attention_bias\": false", "\"attention_bias\": false, \"attention_dropout\": 0.1", "attention_dropout"},
        {"\"rope_theta\": 100.0", "\"rope_theta\": 100.0, \"rope_scaling\": {\"type\": \"linear\"}", "rope_scaling"},
        {"\"rope_theta\": 100.0",
         "\"rope_theta\": 100.0, \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 200.0}",
         "rope_parameters.rope_theta"},
        {"\"rope_theta\": 100.0", "\"rope_parameters\": {\"rope_type\": \"yarn\"}", "rope_type"},
        {"\"hidden_size\": 24", "\"hidden_size\": 25", "num_attention_heads"},
        {"\"lru_width\": 32", "\"lru_width\": 33", "lru_width"},
        {"\"num_key_value_heads\": 1", "\"num_key_value_heads\": 3", "num_key_value_heads"},
    };
    TmpDir t;
    tmp_make(&t);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *text = edited(hub_config, bad[i].from, bad[i].to);
        ModelConfig c;
        int st = load_text(&c, &t, text);
        CHECK(st && strstr(mn_last_error(), bad[i].why), "%s: status %d, message '%s' (expected it to name %s)", bad[i].to,
              st, st ? mn_last_error() : "", bad[i].why);
        free(text);
    }
    // head_dim 12 / 2 = 6 features rotate in 3 pairs; head_dim 10 would leave a feature of the rotary half alone
    static const char *const e10[][2] = {{"\"hidden_size\": 24", "\"hidden_size\": 20"},
                                         {"\"head_dim\": 12", "\"head_dim\": 10"}};
    char *text = hub_edited(e10, 2);
    ModelConfig c;
    CHECK(load_text(&c, &t, text) && strstr(mn_last_error(), "multiple of 4"), "head_dim 10: %s", mn_last_error());
    free(text);
    // the architecture's own checks, on a config of ours
    CHECK(!load_text(&c, &t, hub_config), "%s", mn_last_error());
    ModelConfig b = c;
    snprintf(b.mixer, sizeof b.mixer, "hawk,mha");
    CHECK(config_validate(&b, "t") && strstr(mn_last_error(), "\"mha\""), "mixer mha: %s", mn_last_error());
    b = c;
    b.rope_dim = 0;
    CHECK(config_validate(&b, "t") && strstr(mn_last_error(), "rope_dim"), "rope_dim 0: %s", mn_last_error());
    b = c;
    b.logit_cap = 0;
    CHECK(config_validate(&b, "t") && strstr(mn_last_error(), "logit_cap"), "no cap: %s", mn_last_error());
    tmp_remove(&t);
}

// ------------------------------------------------------------------------------ the forward

// Every tensor of m random: norm gains in [0.5, 2) (their stored offsets g - 1 are exact), matrices
// N(0, 1/fan-in), the rest N(0, 1) (biases, the embedding, Lambda), so that every layout error shows.
static void fill_random(Model *m, uint64_t seed) {
    MnRng r;
    mn_rng_seed(&r, seed);
    for (int i = 0; i < m->nparams; i++) {
        const ParamSpec *s = &m->specs[i];
        float *v = xcalloc(s->numel, sizeof(float));
        int unit = strstr(s->name, "norm") != NULL, embed = strstr(s->name, "embed") != NULL;
        double scale = s->ndim > 1 && !embed ? 1 / sqrt((double)s->shape[s->ndim - 1]) : 1;
        for (size_t k = 0; k < s->numel; k++)
            v[k] = (float)(unit ? 0.5 + 1.5 * mn_rng_uniform(&r) : scale * mn_rng_normal(&r));
        if (m->be->upload_f32(m->be, m->p[i], v, s->numel, MEM_PARAM)) die("%s", mn_last_error());
        free(v);
    }
}

// A tensor of the checkpoint file, by transformers' name, as doubles (owned by the caller).
static double *tensor(const StFile *f, const char *fmt, int layer) {
    char name[160];
    snprintf(name, sizeof name, fmt, layer);
    int i = st_find(f, name);
    if (i < 0) die("transcription: no tensor %s in the checkpoint", name);
    int ndim;
    const int64_t *shape;
    st_info(f, i, NULL, NULL, &ndim, &shape);
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    float *v = xcalloc((size_t)n, sizeof(float));
    if (st_read_f32(f, name, v, n, ndim, shape)) die("%s", mn_last_error());
    double *out = xcalloc((size_t)n, sizeof(double));
    for (int64_t k = 0; k < n; k++) out[k] = v[k];
    free(v);
    return out;
}

// y[n] = b[n] + sum_i W[n, i] x[i]: nn.Linear (b NULL: none).
static void linear(double *y, const double *W, const double *b, const double *x, int nout, int nin) {
    for (int o = 0; o < nout; o++) {
        double s = b ? b[o] : 0;
        for (int i = 0; i < nin; i++) s += W[(size_t)o * nin + i] * x[i];
        y[o] = s;
    }
}

// RecurrentGemmaRMSNorm: x * rsqrt(mean(x^2) + eps) * (1 + w), w as the file stores it.
static void rmsnorm(double *y, const double *x, const double *w, int D, double eps) {
    double ss = 0;
    for (int d = 0; d < D; d++) ss += x[d] * x[d];
    double r = 1 / sqrt(ss / D + eps);
    for (int d = 0; d < D; d++) y[d] = x[d] * r * (1 + w[d]);
}

static double gelu_tanh(double x) { return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }
static double sigmoid(double x) { return 1 / (1 + exp(-x)); }
static double softplus(double x) { return x > 30 ? x : log1p(exp(x)); }

// sqrt(D) rounded to bfloat16 (8 significant bits, to nearest even), as the `normalizer` buffer.
static double bf16_sqrt(int D) {
    int e;
    double m = frexp(sqrt((double)D), &e);
    return ldexp(nearbyint(ldexp(m, 8)), e - 8);
}

// The logits [T, V] transformers' RecurrentGemmaForCausalLM computes for tokens, transcribed in
// float64 from modeling_recurrent_gemma.py, the weights read from the checkpoint file `path` under
// transformers' names and layouts. Attention as its decoding keeps it: each token reads the last
// `window` keys, itself included.
static double *transcribed_logits(const char *path, const ModelConfig *c, const int32_t *tok, int T) {
    StFile *f;
    if (st_open(path, &f)) die("%s", mn_last_error());
    int D = c->dim, V = c->vocab_size, H = c->n_heads, hd = D / H, Hkv = c->n_kv_heads ? c->n_kv_heads : H;
    int L = c->lru_width ? c->lru_width : D, bw = L / H, K = c->conv_size, F = c->mlp_hidden, W = c->window;
    double eps = c->norm_eps, *E = tensor(f, "model.embed_tokens.weight", 0), norm = bf16_sqrt(D);
    double *x = xcalloc((size_t)T * D, sizeof(double)), *n = xcalloc((size_t)T * D, sizeof(double));
    double *out = xcalloc((size_t)T * D, sizeof(double)), *tmp = xcalloc((size_t)(T + 1) * (L + F + 3 * D), sizeof(double));
    for (int t = 0; t < T; t++)
        for (int d = 0; d < D; d++) x[(size_t)t * D + d] = E[(size_t)tok[t] * D + d] * norm;
    for (int l = 0; l < c->n_layers; l++) {
        double *w1 = tensor(f, "model.layers.%d.temporal_pre_norm.weight", l);
        for (int t = 0; t < T; t++) rmsnorm(n + (size_t)t * D, x + (size_t)t * D, w1, D, eps);
        free(w1);
        if (!strcmp(mixer_at(c, l)->name, "hawk")) {  // RecurrentGemmaRecurrentBlock
            double *Wy = tensor(f, "model.layers.%d.temporal_block.linear_y.weight", l),
                   *by = tensor(f, "model.layers.%d.temporal_block.linear_y.bias", l),
                   *Wx = tensor(f, "model.layers.%d.temporal_block.linear_x.weight", l),
                   *bx = tensor(f, "model.layers.%d.temporal_block.linear_x.bias", l),
                   *Wo = tensor(f, "model.layers.%d.temporal_block.linear_out.weight", l),
                   *bo = tensor(f, "model.layers.%d.temporal_block.linear_out.bias", l),
                   *cw = tensor(f, "model.layers.%d.temporal_block.conv_1d.weight", l),  // [L, 1, K]
                   *cb = tensor(f, "model.layers.%d.temporal_block.conv_1d.bias", l),
                   *Wi = tensor(f, "model.layers.%d.temporal_block.rg_lru.input_gate_weight", l),  // [H, in, out]
                   *bi = tensor(f, "model.layers.%d.temporal_block.rg_lru.input_gate_bias", l),
                   *Wr = tensor(f, "model.layers.%d.temporal_block.rg_lru.recurrent_gate_weight", l),
                   *br = tensor(f, "model.layers.%d.temporal_block.rg_lru.recurrent_gate_bias", l),
                   *lam = tensor(f, "model.layers.%d.temporal_block.rg_lru.recurrent_param", l);
            double *xb = xcalloc((size_t)T * L, sizeof(double)), *h = xcalloc((size_t)L, sizeof(double));
            for (int t = 0; t < T; t++) linear(xb + (size_t)t * L, Wx, bx, n + (size_t)t * D, L, D);
            for (int t = 0; t < T; t++) {
                double *y = tmp, *xc = tmp + L, *g = tmp + 2 * L;
                linear(y, Wy, by, n + (size_t)t * D, L, D);
                for (int ch = 0; ch < L; ch++) {  // Conv1d(groups = L, padding K - 1)[..., :T]
                    double s = cb[ch];
                    for (int j = 0; j < K; j++) {
                        int src = t - (K - 1) + j;
                        if (src >= 0) s += cw[(size_t)ch * K + j] * xb[(size_t)src * L + ch];
                    }
                    xc[ch] = s;
                }
                for (int hh = 0; hh < H; hh++)
                    for (int o = 0; o < bw; o++) {  // baddbmm(bias, x, W): x [bw] times W [bw_in, bw_out]
                        double si = bi[(size_t)hh * bw + o], sr = br[(size_t)hh * bw + o];
                        for (int i = 0; i < bw; i++) {
                            double xi = xc[hh * bw + i];
                            si += xi * Wi[((size_t)hh * bw + i) * bw + o];
                            sr += xi * Wr[((size_t)hh * bw + i) * bw + o];
                        }
                        int ch = hh * bw + o;
                        double ig = sigmoid(si), rg = sigmoid(sr), log_a = -8 * rg * softplus(lam[ch]);
                        // sqrt(1 - a^2), its 1 - a^2 without the cancellation near a = 1 (float64 throughout);
                        // no input scaling at position 0 (the reset)
                        double a = exp(log_a), mult = t == 0 ? 1 : sqrt(-expm1(2 * log_a));
                        h[ch] = (t == 0 ? 0 : a * h[ch]) + xc[ch] * ig * mult;
                        g[ch] = h[ch] * gelu_tanh(y[ch]);
                    }
                linear(out + (size_t)t * D, Wo, bo, g, D, L);
            }
            free(Wy), free(by), free(Wx), free(bx), free(Wo), free(bo), free(cw), free(cb), free(Wi), free(bi);
            free(Wr), free(br), free(lam), free(xb), free(h);
        } else {  // RecurrentGemmaSdpaAttention
            double *Wq = tensor(f, "model.layers.%d.temporal_block.q_proj.weight", l),
                   *Wk = tensor(f, "model.layers.%d.temporal_block.k_proj.weight", l),
                   *Wv = tensor(f, "model.layers.%d.temporal_block.v_proj.weight", l),
                   *Wo = tensor(f, "model.layers.%d.temporal_block.o_proj.weight", l),
                   *bo = tensor(f, "model.layers.%d.temporal_block.o_proj.bias", l);
            double *q = xcalloc((size_t)T * D, sizeof(double)), *k = xcalloc((size_t)T * Hkv * hd, sizeof(double));
            double *v = xcalloc((size_t)T * Hkv * hd, sizeof(double));
            int rot = hd / 2, half = rot / 2;  // torch.chunk(q, 2)[0], rotate_half within it
            for (int t = 0; t < T; t++) {
                linear(q + (size_t)t * D, Wq, NULL, n + (size_t)t * D, D, D);
                linear(k + (size_t)t * Hkv * hd, Wk, NULL, n + (size_t)t * D, Hkv * hd, D);
                linear(v + (size_t)t * Hkv * hd, Wv, NULL, n + (size_t)t * D, Hkv * hd, D);
                for (int i = 0; i < half; i++) {
                    double ang = t * pow((double)c->rope_theta, -2.0 * i / rot), cs = cos(ang), sn = sin(ang);
                    for (int hh = 0; hh < H + Hkv; hh++) {
                        double *r = hh < H ? q + (size_t)t * D + hh * hd : k + ((size_t)t * Hkv + hh - H) * hd;
                        double x1 = r[i], x2 = r[i + half];
                        r[i] = x1 * cs - x2 * sn;
                        r[i + half] = x2 * cs + x1 * sn;
                    }
                }
            }
            for (int t = 0; t < T; t++) {
                double *o = tmp, *p = tmp + D;
                for (int hh = 0; hh < H; hh++) {
                    int g = hh / (H / Hkv), s0 = t - W + 1 > 0 ? t - W + 1 : 0;
                    double mx = -INFINITY, z = 0;
                    for (int s = s0; s <= t; s++) {
                        double dot = 0;
                        for (int j = 0; j < hd; j++)
                            dot += q[(size_t)t * D + hh * hd + j] * k[((size_t)s * Hkv + g) * hd + j];
                        // scale head_dim^-0.5 as a float: transformers' SDPA applies it in the inputs' float32
                        // (so does our AttnDims.scale)
                        p[s - s0] = dot * (double)(float)(1 / sqrt((double)hd));
                        mx = fmax(mx, p[s - s0]);
                    }
                    for (int s = s0; s <= t; s++) z += p[s - s0] = exp(p[s - s0] - mx);
                    for (int j = 0; j < hd; j++) {
                        double acc = 0;
                        for (int s = s0; s <= t; s++) acc += p[s - s0] / z * v[((size_t)s * Hkv + g) * hd + j];
                        o[hh * hd + j] = acc;
                    }
                }
                linear(out + (size_t)t * D, Wo, bo, o, D, D);
            }
            free(Wq), free(Wk), free(Wv), free(Wo), free(bo), free(q), free(k), free(v);
        }
        for (size_t i = 0; i < (size_t)T * D; i++) x[i] += out[i];
        // RecurrentGemmaMlp: down(gelu_tanh(gate(x)) * up(x)), intermediate_size // 2 wide, biases on all
        double *w2 = tensor(f, "model.layers.%d.channel_pre_norm.weight", l),
               *Wg = tensor(f, "model.layers.%d.mlp_block.gate_proj.weight", l),
               *bg = tensor(f, "model.layers.%d.mlp_block.gate_proj.bias", l),
               *Wu = tensor(f, "model.layers.%d.mlp_block.up_proj.weight", l),
               *bu = tensor(f, "model.layers.%d.mlp_block.up_proj.bias", l),
               *Wd = tensor(f, "model.layers.%d.mlp_block.down_proj.weight", l),
               *bd = tensor(f, "model.layers.%d.mlp_block.down_proj.bias", l);
        for (int t = 0; t < T; t++) {
            double *m = tmp, *g = tmp + D, *u = tmp + D + F, *o = tmp + D + 2 * F;
            rmsnorm(m, x + (size_t)t * D, w2, D, eps);
            linear(g, Wg, bg, m, F, D);
            linear(u, Wu, bu, m, F, D);
            for (int j = 0; j < F; j++) g[j] = gelu_tanh(g[j]) * u[j];
            linear(o, Wd, bd, g, D, F);
            for (int d = 0; d < D; d++) x[(size_t)t * D + d] += o[d];
        }
        free(w2), free(Wg), free(bg), free(Wu), free(bu), free(Wd), free(bd);
    }
    double *wf = tensor(f, "model.final_norm.weight", 0);
    double *head = c->tie_embeddings ? E : tensor(f, "lm_head.weight", 0);
    double *logits = xcalloc((size_t)T * V, sizeof(double));
    for (int t = 0; t < T; t++) {
        rmsnorm(n, x + (size_t)t * D, wf, D, eps);
        linear(logits + (size_t)t * V, head, NULL, n, V, D);
        for (int j = 0; j < V; j++) {
            double *z = &logits[(size_t)t * V + j];
            *z = c->logit_cap * tanh(*z / c->logit_cap);
        }
    }
    if (head != E) free(head);
    free(E), free(wf), free(x), free(n), free(out), free(tmp);
    st_close(f);
    return logits;
}

// Our logits [T, V] of m (capped as the model's are read out: cmd_logits).
static double *our_logits(Model *m, const int32_t *tok, int T) {
    size_t nv = (size_t)T * m->cfg.vocab_size;
    if (model_forward(m, tok, NULL, 1, T, 0, NULL)) die("%s", mn_last_error());
    double *l = xcalloc(nv, sizeof(double));
    if (m->be->download(m->be, l, m->logits, nv, MEM_ACT)) die("%s", mn_last_error());
    for (size_t i = 0; i < nv; i++) l[i] = m->cfg.logit_cap * tanh(l[i] / m->cfg.logit_cap);
    return l;
}

static double rel_err(const double *a, const double *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
    return sqrt(num / den);
}

enum { TT = 23 };  // more than four windows of 5

// The hub config's model (tied head, r,r,a,r: the pattern cycles), and an untied one of 3 blocks a,r,a
// with full key/value heads: saved by training's checkpoint writer, the logits of the reference
// (float64) and the CPU (float32) backends against the transcription reading that file. The
// reference computes the same float64 arithmetic in another order: measured 4e-16; 1e-12. The CPU
// runs float32 through 4 blocks whose outputs are sums of a few dozen terms each; every operand
// carries 6e-8 of rounding, grown a little by the blocks: measured 1.8e-7; 2e-6 allows ten times
// that, and a layout error (a transposed gate block, the rotary half on the wrong features, an
// unrounded embedding scale: 1e-3) fails it by orders of magnitude.
TEST(rgemma_logits_match_transformers_transcription) {
    TmpDir t;
    tmp_make(&t);
    ModelConfig cfgs[2];
    CHECK(!load_text(&cfgs[0], &t, hub_config), "%s", mn_last_error());
    static const char *const e2[][2] = {
        {"\"num_hidden_layers\": 4", "\"num_hidden_layers\": 3"},
        {"\"num_key_value_heads\": 1", "\"num_key_value_heads\": 2"},
        {"[\"recurrent\", \"recurrent\", \"attention\"]", "[\"attention\", \"recurrent\"]"},
        {"\"w_init_variance_scale\": 0.01", "\"w_init_variance_scale\": 0.01, \"tie_word_embeddings\": false"}};
    char *text = hub_edited(e2, 4);
    CHECK(!load_text(&cfgs[1], &t, text), "%s", mn_last_error());
    free(text);
    int32_t tok[TT];
    for (int i = 0; i < TT; i++) tok[i] = (i * 7 + 3) % 37;
    for (int k = 0; k < 2; k++) {
        const ModelConfig *c = &cfgs[k];
        Model *m[2];
        const Backend *bes[2] = {backend_ref(), backend_cpu()};
        for (int b = 0; b < 2; b++)
            if (model_create(&m[b], c, bes[b])) die("%s", mn_last_error());
        fill_random(m[1], 40 + k);
        float *all = xcalloc(m[1]->total, sizeof(float));
        for (int i = 0; i < m[1]->nparams; i++) {  // the same weights on both
            m[1]->be->download_f32(m[1]->be, all, m[1]->p[i], m[1]->specs[i].numel, MEM_PARAM);
            m[0]->be->upload_f32(m[0]->be, m[0]->p[i], all, m[1]->specs[i].numel, MEM_PARAM);
        }
        free(all);
        char dir[64];
        snprintf(dir, sizeof dir, "ckpt%d", k);
        const char *d = tmp_path(&t, dir);
        char saved[300];
        snprintf(saved, sizeof saved, "%s/model.safetensors", d);
        CHECK(!mn_mkdirs(d) && !checkpoint_save_model(d, m[1], 0), "%s", mn_last_error());
        double *want = transcribed_logits(saved, c, tok, TT);
        double tol[2] = {1e-12, 2e-6};
        for (int b = 0; b < 2; b++) {
            double *got = our_logits(m[b], tok, TT), e = rel_err(got, want, (size_t)TT * c->vocab_size);
            test_note("%s (%s): %s logits vs the float64 transcription of transformers: rel err %.2e", c->mixer,
                      c->tie_embeddings ? "tied" : "untied", bes[b]->name, e);
            CHECK_REL(bes[b]->name, e, tol[b]);
            free(got);
        }
        free(want);
        model_free(m[0]);
        model_free(m[1]);
    }
    tmp_remove(&t);
}

// A checkpoint exported (`mesanet export --format hf`) and its export's export: the same logits bit
// for bit, the same file bytes; the norms' tensors in the file are the model's gains less 1, the
// gates' blocks transposed.
TEST(rgemma_export_round_trips) {
    TmpDir t;
    tmp_make(&t);
    ModelConfig c;
    CHECK(!load_text(&c, &t, hub_config), "%s", mn_last_error());
    Model *m;
    if (model_create(&m, &c, backend_cpu())) die("%s", mn_last_error());
    fill_random(m, 77);
    char src[300], out1[300], out2[300], f1[320], f2[320];
    snprintf(src, sizeof src, "%s", tmp_path(&t, "src"));
    snprintf(out1, sizeof out1, "%s", tmp_path(&t, "out1"));
    snprintf(out2, sizeof out2, "%s", tmp_path(&t, "out2"));
    CHECK(!mn_mkdirs(src) && !checkpoint_save_model(src, m, 0), "%s", mn_last_error());
    CHECK(!checkpoint_export(src, out1, "hf", NULL) && !checkpoint_export(out1, out2, "hf", NULL), "%s", mn_last_error());
    snprintf(f1, sizeof f1, "%s/model.safetensors", out1);
    snprintf(f2, sizeof f2, "%s/model.safetensors", out2);
    size_t n1, n2;
    unsigned char *b1 = read_bytes(f1, &n1), *b2 = read_bytes(f2, &n2);
    CHECK(b1 && b2 && n1 == n2 && !memcmp(b1, b2, n1), "the export of the export differs (%zu vs %zu bytes)", n1, n2);
    free(b1), free(b2);
    int32_t tok[TT];
    for (int i = 0; i < TT; i++) tok[i] = (i * 5 + 1) % 37;
    Model *back;
    CHECK(!checkpoint_load_model(out1, backend_cpu(), &back), "%s", mn_last_error());
    double *a = our_logits(m, tok, TT), *b = our_logits(back, tok, TT);
    CHECK(!memcmp(a, b, sizeof(double) * TT * c.vocab_size), "the exported checkpoint's logits differ");
    free(a), free(b);
    // the file's view of the tensors
    StFile *f;
    CHECK(!st_open(f1, &f), "%s", mn_last_error());
    const char *names[2] = {"model.layers.1.channel_pre_norm.weight",
                            "model.layers.0.temporal_block.rg_lru.input_gate_weight"};
    for (int k = 0; k < 2; k++) {
        int i = model_find_param(m, names[k]);
        CHECK(i >= 0, "no tensor %s", names[k]);
        if (i < 0) continue;
        const ParamSpec *s = &m->specs[i];
        float *mine = xcalloc(s->numel, sizeof(float)), *file = xcalloc(s->numel, sizeof(float));
        m->be->download_f32(m->be, mine, m->p[i], s->numel, MEM_PARAM);
        CHECK(!st_read_f32(f, names[k], file, (int64_t)s->numel, s->ndim, s->shape), "%s", mn_last_error());
        int same = 1;
        if (k == 0) {
            for (size_t j = 0; j < s->numel; j++) same &= file[j] == mine[j] - 1;
        } else {
            size_t bw = (size_t)s->shape[2];
            for (size_t j = 0; j < s->numel; j++) {
                size_t blk = j / (bw * bw), r = j / bw % bw, col = j % bw;
                same &= file[j] == mine[blk * bw * bw + col * bw + r];
            }
        }
        CHECK(same, "%s: the file does not hold the model's tensor %s", names[k], k ? "transposed" : "less 1");
        free(mine), free(file);
    }
    st_close(f);
    model_free(back);
    model_free(m);
    tmp_remove(&t);
}

// griffin-160m: the architecture's preset near 160M parameters, valid, its config.json read back.
TEST(rgemma_preset) {
    ModelConfig c;
    CHECK(!config_preset(&c, "griffin-160m"), "%s", mn_last_error());
    size_t total;
    CHECK(!config_param_count(&c, &total, NULL, NULL), "%s", mn_last_error());
    test_note("griffin-160m: %zu parameters", total);
    CHECK(total > 150000000 && total < 170000000, "griffin-160m has %zu parameters", total);
    TmpDir t;
    tmp_make(&t);
    ModelConfig back;
    char diff[256];
    CHECK(!config_save(&c, tmp_path(&t, "c.json")) && !config_load(&back, t.path), "%s", mn_last_error());
    CHECK(!config_diff(&c, &back, diff, sizeof diff), "griffin-160m read back differs: %s", diff);
    tmp_remove(&t);
}
