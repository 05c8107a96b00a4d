// The Gated DeltaNet paper's layer (gdn-paper) and DeltaNet's (deltanet-paper) as fla has them:
// the layer against a plain float64 transcription of fla's layer (naive_recurrent_gated_delta_rule
// and the module's forward), fla's initialisation of the gate, fla's checkpoints (config.json and
// model.safetensors named and shaped as fla's modeling files make them) loaded and saved back, and
// the configs and the backend without the gate's op refused. What every mixer passes (gradients,
// the CPU against the reference, decoding, training, backends without the core) is the
// conformance battery's (test_conformance.c), whose rows hold these cases' variants.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "core/backend.h"
#include "core/common.h"
#include "core/safetensors.h"
#include "fd.h"
#include "mixer_case.h"
#include "model/model.h"
#include "model/presets.h"
#include "test.h"
#include "tmpdir.h"
#include "train/checkpoint.h"
#include "train/optim.h"

typedef struct {
    const char *mixer;
    int gate, shared_onorm, neg_eigen, dv;  // output gate, fla's shared o_norm, beta in (0, 2), Dv (0: Dk)
} Case;

static const Case cases[] = {
    {"gdn-paper", 1, 1, 0, 8},        // fla's GatedDeltaNet defaults: gate, shared norm, expand_v 2
    {"gdn-paper", 0, 0, 1, 6},        // no gate (RMSNorm), per-head norm, allow_neg_eigval, expand_v 1.5
    {"deltanet-paper", 0, 1, 0, 0},   // fla's DeltaNet defaults
    {"deltanet-paper", 1, 1, 1, 8},   // with use_gate, allow_neg_eigval, expand_v 2
};
enum { NCASES = sizeof cases / sizeof cases[0] };

static const char *case_name(const Case *c, char *buf, size_t n) {
    snprintf(buf, n, "%s%s%s%s Dv=%d", c->mixer, c->gate ? " +gate" : "", c->shared_onorm ? " +shared norm" : "",
             c->neg_eigen ? " +neg_eigen" : "", c->dv ? c->dv : 4);
    return buf;
}

static ModelConfig config_of(const Case *k, int layers) {
    ModelConfig c;
    if (config_preset(&c, "tiny")) die("%s", mn_last_error());
    strcpy(c.arch, "fla");
    c.embed_scale = 0;
    c.tie_embeddings = 0;
    c.gate_bound = 0;
    c.resid_scale = 0;
    mc_tiny_sizes(&c, k->mixer, layers);
    c.head_v_dim = k->dv;
    c.output_gate = k->gate;
    c.shared_onorm = k->shared_onorm;
    c.neg_eigen = k->neg_eigen;
    c.logit_cap = 0;
    return c;
}

// Random parameters larger than the initialisation (every path carries gradient); A_log near
// log 0.3 and dt_bias near 0 keep the decay moderate (mc_base_bias_lambda).
static void randomise(Model *m, uint64_t seed) { mc_randomise(m, seed, mc_base_bias_lambda); }

// ------------------------------------------------------------------- fla's layer, transcribed

// Block 0's tensor `attn.<name>` of a reference-backend model (host doubles), or NULL.
static const double *P(const Model *m, const char *name) {
    char full[96];
    snprintf(full, sizeof full, "model.layers.0.attn.%s", name);
    int t = model_find_param(m, full);
    return t < 0 ? NULL : (const double *)m->p[t];
}

static double silu(double x) { return x / (1 + exp(-x)); }
static double softplus(double x) { return x > 30 ? x : log1p(exp(x)); }

// y[n,o] = sum_i x[n,i] W[o,i]
static void proj(double *y, const double *x, const double *w, int N, int in, int out) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < out; o++) {
            double s = 0;
            for (int i = 0; i < in; i++) s += x[(size_t)n * in + i] * w[(size_t)o * in + i];
            y[(size_t)n * out + o] = s;
        }
}

// fla's ShortConvolution (weight [C,1,K], no bias) with SiLU, over one sequence of T tokens.
static void conv_silu(double *y, const double *x, const double *w, int T, int C, int K) {
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) {
            double s = 0;
            for (int j = 0; j < K; j++) {
                int ts = t - (K - 1) + j;
                if (ts >= 0) s += w[(size_t)c * K + j] * x[(size_t)ts * C + c];
            }
            y[(size_t)t * C + c] = silu(s);
        }
}

// fla's GatedDeltaNet / DeltaNet forward over B sequences (float64, written from fla's layers and
// naive_recurrent_gated_delta_rule: h *= exp(g); v -= h^T k; v *= beta; h += k v^T; o = (scale q)^T h).
static void fla_layer(const Model *m, const double *u, int B, int T, double *y) {
    const ModelConfig *c = &m->cfg;
    int D = c->dim, H = c->n_heads, Dk = c->head_dim, Dv = c->head_v_dim ? c->head_v_dim : Dk, K = c->conv_size;
    int Q = H * Dk, V = H * Dv;
    const double *A_log = P(m, "A_log"), *dt_bias = P(m, "dt_bias"), *onw = P(m, "o_norm.weight");
    double *qp = xcalloc((size_t)T * Q, 8), *kp = xcalloc((size_t)T * Q, 8), *vp = xcalloc((size_t)T * V, 8);
    double *q = xcalloc((size_t)T * Q, 8), *k = xcalloc((size_t)T * Q, 8), *v = xcalloc((size_t)T * V, 8);
    double *a = xcalloc((size_t)T * H, 8), *b = xcalloc((size_t)T * H, 8), *gp = xcalloc((size_t)T * V, 8);
    double *o = xcalloc((size_t)T * V, 8), *h = xcalloc((size_t)H * Dk * Dv, 8), *vt = xcalloc((size_t)Dv, 8);
    double scale = 1 / sqrt((double)Dk);
    for (int s = 0; s < B; s++) {
        const double *us = u + (size_t)s * T * D;
        proj(qp, us, P(m, "q_proj.weight"), T, D, Q);
        proj(kp, us, P(m, "k_proj.weight"), T, D, Q);
        proj(vp, us, P(m, "v_proj.weight"), T, D, V);
        proj(b, us, P(m, "b_proj.weight"), T, D, H);
        if (A_log) proj(a, us, P(m, "a_proj.weight"), T, D, H);
        if (c->output_gate) proj(gp, us, P(m, "g_proj.weight"), T, D, V);
        conv_silu(q, qp, P(m, "q_conv1d.weight"), T, Q, K);
        conv_silu(k, kp, P(m, "k_conv1d.weight"), T, Q, K);
        conv_silu(v, vp, P(m, "v_conv1d.weight"), T, V, K);
        for (int r = 0; r < T * H; r++) {  // use_qk_l2norm_in_kernel: x / sqrt(sum x^2 + 1e-6)
            double sq = 0, sk = 0;
            for (int i = 0; i < Dk; i++) sq += q[r * Dk + i] * q[r * Dk + i], sk += k[r * Dk + i] * k[r * Dk + i];
            for (int i = 0; i < Dk; i++) q[r * Dk + i] /= sqrt(sq + 1e-6), k[r * Dk + i] /= sqrt(sk + 1e-6);
        }
        memset(h, 0, sizeof(double) * H * Dk * Dv);
        for (int t = 0; t < T; t++)
            for (int hh = 0; hh < H; hh++) {
                double beta = 1 / (1 + exp(-b[t * H + hh])) * (c->neg_eigen ? 2 : 1);
                double g = A_log ? -exp(A_log[hh]) * softplus(a[t * H + hh] + dt_bias[hh]) : 0;
                double *hs = h + (size_t)hh * Dk * Dv;
                const double *qt = q + (size_t)t * Q + hh * Dk, *kt = k + (size_t)t * Q + hh * Dk;
                for (int i = 0; i < Dk * Dv; i++) hs[i] *= exp(g);
                for (int j = 0; j < Dv; j++) {
                    double s2 = 0;
                    for (int i = 0; i < Dk; i++) s2 += hs[i * Dv + j] * kt[i];
                    vt[j] = (v[(size_t)t * V + hh * Dv + j] - s2) * beta;
                }
                for (int i = 0; i < Dk; i++)
                    for (int j = 0; j < Dv; j++) hs[i * Dv + j] += kt[i] * vt[j];
                for (int j = 0; j < Dv; j++) {
                    double s2 = 0;
                    for (int i = 0; i < Dk; i++) s2 += scale * qt[i] * hs[i * Dv + j];
                    o[(size_t)t * V + hh * Dv + j] = s2;
                }
            }
        for (int r = 0; r < T * H; r++) {  // o_norm: RMSNorm over the value head (x) SiLU(g) with use_gate
            double ss = 0;
            for (int j = 0; j < Dv; j++) ss += o[r * Dv + j] * o[r * Dv + j];
            double rstd = 1 / sqrt(ss / Dv + c->norm_eps);
            for (int j = 0; j < Dv; j++) {
                double w = onw[c->shared_onorm ? j : (r % H) * Dv + j];
                o[r * Dv + j] *= rstd * w * (c->output_gate ? silu(gp[r * Dv + j]) : 1);
            }
        }
        proj(y + (size_t)s * T * D, o, P(m, "o_proj.weight"), T, V, D);
    }
    free(qp); free(kp); free(vp); free(q); free(k); free(v); free(a); free(b); free(gp); free(o); free(h); free(vt);
}

TEST(gdn_paper_layer_matches_fla_transcription) {
    for (int i = 0; i < NCASES; i++) {
        char name[96];
        case_name(&cases[i], name, sizeof name);
        ModelConfig cfg = config_of(&cases[i], 1);
        Model *m = mc_make(&cfg, backend_ref());
        randomise(m, 70 + i);
        int B = 2, T = 9;
        size_t nd = (size_t)B * T * cfg.dim;
        double *u = rand_doubles(3, nd, -1, 1), *y = xcalloc(nd, 8), *want = xcalloc(nd, 8);
        CHECK(!m->mixers[0].ops->forward(&m->mixers[0], y, u, B, T, 0), "%s: %s", name, mn_last_error());
        fla_layer(m, u, B, T, want);
        double e = rel_err64(y, want, nd);
        test_note("%-44s vs fla's layer transcribed: rel err %.2e", name, e);
        CHECK_REL(name, e, 1e-12);
        free(u); free(y); free(want);
        model_free(m);
    }
}

// ------------------------------------------------------------------- fla's initialisation

// The initialisation of A_log and dt_bias is fla's: A = exp(A_log) in (0, 16], softplus(dt_bias)
// in [1e-3, 1e-1], and they spread over those ranges.
TEST(gdn_paper_gate_initialisation_is_fla_s) {
    Case k = {"gdn-paper", 1, 1, 0, 8};
    ModelConfig cfg = config_of(&k, 1);
    cfg.n_heads = 64;
    Model *m = mc_make(&cfg, backend_ref());
    model_init_params(m, 5);
    const double *A_log = P(m, "A_log"), *dt = P(m, "dt_bias");
    double amin = 1e9, amax = 0, dmin = 1e9, dmax = 0;
    for (int h = 0; h < 64; h++) {
        double A = exp(A_log[h]), d = softplus(dt[h]);
        amin = fmin(amin, A), amax = fmax(amax, A), dmin = fmin(dmin, d), dmax = fmax(dmax, d);
    }
    test_note("64 heads: A in [%.3g, %.3g], dt in [%.3g, %.3g]", amin, amax, dmin, dmax);
    CHECK(amin > 0 && amax <= 16 + 1e-9 && amax - amin > 8, "A = exp(A_log) in [%g, %g]", amin, amax);
    CHECK(dmin >= 1e-3 * (1 - 1e-9) && dmax <= 1e-1 * (1 + 1e-9) && dmax / dmin > 10, "dt in [%g, %g]", dmin, dmax);
    model_free(m);
}

// ------------------------------------------------------------------- fla's checkpoints

// One tensor of fla's state_dict: its name and shape.
typedef struct {
    char name[96];
    int ndim;
    int64_t shape[3];
} FlaTensor;

static int fla_add(FlaTensor *t, int n, const char *name, int ndim, int64_t a, int64_t b, int64_t c) {
    snprintf(t[n].name, sizeof t[n].name, "%s", name);
    t[n].ndim = ndim;
    t[n].shape[0] = a, t[n].shape[1] = b, t[n].shape[2] = c;
    return n + 1;
}

// The state_dict of fla's GatedDeltaNetForCausalLM (gated) or DeltaNetForCausalLM, as its modules
// register them: model.embeddings; per block attn_norm, attn (GatedDeltaNet: q_proj, k_proj,
// v_proj, a_proj, b_proj, A_log, dt_bias, q_conv1d, k_conv1d, v_conv1d, g_proj with use_gate,
// o_norm, o_proj; DeltaNet: the same without a_proj, A_log, dt_bias), mlp_norm, mlp (GatedMLP:
// gate_proj, up_proj, down_proj); model.norm; lm_head unless tied.
static int fla_tensors(FlaTensor *t, int gated, int L, int D, int H, int Dk, int Dv, int F, int V, int K, int gate,
                       int tied) {
    int n = 0, Q = H * Dk, Vd = H * Dv;
    n = fla_add(t, n, "model.embeddings.weight", 2, V, D, 0);
    for (int l = 0; l < L; l++) {
        char p[160];
#define ADD(suffix, nd, a, b, c) (snprintf(p, sizeof p, "model.layers.%d.%s", l, suffix), n = fla_add(t, n, p, nd, a, b, c))
        ADD("attn_norm.weight", 1, D, 0, 0);
        ADD("attn.q_proj.weight", 2, Q, D, 0);
        ADD("attn.k_proj.weight", 2, Q, D, 0);
        ADD("attn.v_proj.weight", 2, Vd, D, 0);
        if (gated) ADD("attn.a_proj.weight", 2, H, D, 0);
        ADD("attn.b_proj.weight", 2, H, D, 0);
        if (gated) ADD("attn.A_log", 1, H, 0, 0);
        if (gated) ADD("attn.dt_bias", 1, H, 0, 0);
        ADD("attn.q_conv1d.weight", 3, Q, 1, K);
        ADD("attn.k_conv1d.weight", 3, Q, 1, K);
        ADD("attn.v_conv1d.weight", 3, Vd, 1, K);
        if (gate) ADD("attn.g_proj.weight", 2, Vd, D, 0);
        ADD("attn.o_norm.weight", 1, Dv, 0, 0);
        ADD("attn.o_proj.weight", 2, D, Vd, 0);
        ADD("mlp_norm.weight", 1, D, 0, 0);
        ADD("mlp.gate_proj.weight", 2, F, D, 0);
        ADD("mlp.up_proj.weight", 2, F, D, 0);
        ADD("mlp.down_proj.weight", 2, D, F, 0);
#undef ADD
    }
    n = fla_add(t, n, "model.norm.weight", 1, D, 0, 0);
    if (!tied) n = fla_add(t, n, "lm_head.weight", 2, V, D, 0);
    return n;
}

// Writes model.safetensors of those tensors with random values (kept in vals[i]).
static void write_fla_weights(const char *path, const FlaTensor *ft, int n, float **vals) {
    StTensor *st = xcalloc((size_t)n, sizeof(StTensor));
    MnRng r;
    mn_rng_seed(&r, 77);
    for (int i = 0; i < n; i++) {
        size_t numel = 1;
        for (int d = 0; d < ft[i].ndim; d++) numel *= (size_t)ft[i].shape[d];
        vals[i] = xcalloc(numel, sizeof(float));
        int norm = strstr(ft[i].name, "norm.weight") != NULL, alog = strstr(ft[i].name, "A_log") != NULL;
        for (size_t j = 0; j < numel; j++)
            vals[i][j] = (float)((norm ? 1 : alog ? -0.5 : 0) + (norm ? 0.1 : 0.3) * mn_rng_normal(&r));
        st[i].name = ft[i].name;
        st[i].dtype = ST_F32;
        st[i].ndim = ft[i].ndim;
        for (int d = 0; d < ft[i].ndim; d++) st[i].shape[d] = ft[i].shape[d];
        st[i].data = vals[i];
    }
    StMeta meta[] = {{"format", "pt"}};
    if (st_write(path, st, n, meta, 1)) die("%s", mn_last_error());
    free(st);
}

// Every tensor of fla's list is in the model with its shape and the values written, and the
// model has no other.
static void check_tensors(const char *what, Model *m, const FlaTensor *ft, int n, float **vals) {
    CHECK(m->nparams == n, "%s: %d tensors, fla's model has %d", what, m->nparams, n);
    int bad = 0;
    for (int i = 0; i < n; i++) {
        int t = model_find_param(m, ft[i].name);
        if (t < 0) {
            test_fail(__FILE__, __LINE__, "%s: no tensor %s", what, ft[i].name);
            continue;
        }
        const ParamSpec *s = &m->specs[t];
        int same = s->ndim == ft[i].ndim;
        for (int d = 0; same && d < s->ndim; d++) same = s->shape[d] == ft[i].shape[d];
        CHECK(same, "%s: %s has another shape", what, ft[i].name);
        if (!same) continue;
        float *got = xcalloc(s->numel, sizeof(float));
        m->be->download_f32(m->be, got, m->p[t], s->numel, MEM_PARAM);
        bad += memcmp(got, vals[i], s->numel * sizeof(float)) != 0;
        free(got);
    }
    CHECK(!bad, "%s: %d tensors differ from those written", what, bad);
}

static void logits_of(Model *m, const int32_t *tok, int T, float *out) {
    if (model_forward(m, tok, NULL, 1, T, 0, NULL)) die("%s", mn_last_error());
    m->be->download_f32(m->be, out, m->logits, (size_t)T * m->cfg.vocab_size, MEM_ACT);
}

TEST(gdn_paper_fla_checkpoints_load_and_round_trip) {
    struct {
        int gated;
        const char *json;
        int L, D, H, Dk, Dv, F, V, gate, tied, neg;
    } fx[] = {
        {1,
         "{\"architectures\": [\"GatedDeltaNetForCausalLM\"], \"model_type\": \"gated_deltanet\", \"attn\": null,\n"
         " \"attn_mode\": \"chunk\", \"attnres_block_size\": null, \"bos_token_id\": 1, \"conv_size\": 4,\n"
         " \"eos_token_id\": 2, \"expand_v\": 1.5, \"fuse_cross_entropy\": true, \"fuse_linear_cross_entropy\": false,\n"
         " \"fuse_norm\": true, \"fuse_swiglu\": true, \"head_dim\": 8, \"hidden_act\": \"swish\", \"hidden_ratio\": 4,\n"
         " \"hidden_size\": 16, \"initializer_range\": 0.02, \"intermediate_size\": null, \"max_position_embeddings\": 2048,\n"
         " \"norm_eps\": 1e-06, \"num_heads\": 2, \"num_hidden_layers\": 2, \"num_v_heads\": null, \"pad_token_id\": null,\n"
         " \"tie_word_embeddings\": false, \"torch_dtype\": \"float32\", \"transformers_version\": \"4.53.3\",\n"
         " \"use_cache\": true, \"use_gate\": true, \"use_l2warp\": false, \"use_short_conv\": true,\n"
         " \"allow_neg_eigval\": false, \"vocab_size\": 40}\n",
         2, 16, 2, 8, 12, 256, 40, 1, 0, 0},
        {0,
         "{\"architectures\": [\"DeltaNetForCausalLM\"], \"model_type\": \"delta_net\", \"attn\": null,\n"
         " \"attn_mode\": \"chunk\", \"bos_token_id\": 1, \"conv_size\": 4, \"eos_token_id\": 2, \"expand_k\": 1.0,\n"
         " \"expand_v\": 2.0, \"fuse_cross_entropy\": true, \"fuse_norm\": true, \"fuse_swiglu\": true,\n"
         " \"hidden_act\": \"swish\", \"hidden_ratio\": 4, \"hidden_size\": 16, \"initializer_range\": 0.02,\n"
         " \"intermediate_size\": null, \"max_position_embeddings\": 2048, \"norm_eps\": 1e-06, \"num_heads\": 2,\n"
         " \"num_hidden_layers\": 2, \"qk_activation\": \"silu\", \"qk_norm\": \"l2\", \"tie_word_embeddings\": true,\n"
         " \"use_beta\": true, \"use_cache\": true, \"use_gate\": false, \"use_output_norm\": true,\n"
         " \"use_short_conv\": true, \"allow_neg_eigval\": true, \"vocab_size\": 40}\n",
         2, 16, 2, 8, 16, 256, 40, 0, 1, 1},
    };
    for (size_t f = 0; f < sizeof fx / sizeof fx[0]; f++) {
        const char *what = fx[f].gated ? "gated_deltanet" : "delta_net";
        TmpDir t;
        tmp_make(&t);
        char fla_dir[256], ours[256], path[320];
        snprintf(fla_dir, sizeof fla_dir, "%s/fla", t.dir);
        snprintf(ours, sizeof ours, "%s/ours", t.dir);
        if (mn_mkdirs(fla_dir) || mn_mkdirs(ours)) die("%s", mn_last_error());
        snprintf(path, sizeof path, "%s/config.json", fla_dir);
        write_bytes(path, fx[f].json, strlen(fx[f].json));
        FlaTensor ft[64];
        int n = fla_tensors(ft, fx[f].gated, fx[f].L, fx[f].D, fx[f].H, fx[f].Dk, fx[f].Dv, fx[f].F, fx[f].V, 4,
                            fx[f].gate, fx[f].tied);
        float *vals[64];
        snprintf(path, sizeof path, "%s/model.safetensors", fla_dir);
        write_fla_weights(path, ft, n, vals);
        Model *m = NULL;
        CHECK(!checkpoint_load_model(fla_dir, backend_cpu(), &m), "%s: %s", what, mn_last_error());
        if (!m) continue;
        const ModelConfig *c = &m->cfg;
        CHECK(!strcmp(c->mixer, fx[f].gated ? "gdn-paper" : "deltanet-paper") && !strcmp(c->arch, "fla"),
              "%s: mixer %s, arch %s", what, c->mixer, c->arch);
        CHECK(c->dim == fx[f].D && c->n_layers == fx[f].L && c->n_heads == fx[f].H && c->head_dim == fx[f].Dk &&
                  (c->head_v_dim ? c->head_v_dim : c->head_dim) == fx[f].Dv && c->mlp_hidden == fx[f].F &&
                  c->vocab_size == fx[f].V && c->output_gate == fx[f].gate && c->tie_embeddings == fx[f].tied &&
                  c->neg_eigen == fx[f].neg && c->shared_onorm && !c->embed_scale && c->logit_cap == 0 &&
                  c->norm_eps == 1e-6f && c->conv_size == 4,
              "%s: the config read differs from fla's", what);
        check_tensors(what, m, ft, n, vals);
        test_note("%s: fla's %d tensors loaded (D %d, H %d, Dk %d, Dv %d, F %d)", what, n, c->dim, c->n_heads,
                  c->head_dim, fx[f].Dv, c->mlp_hidden);
        // saved by mesanet: fla's config.json and names; loads again with every tensor and the same logits
        CHECK(!checkpoint_save_model(ours, m, 0), "%s: %s", what, mn_last_error());
        snprintf(path, sizeof path, "%s/config.json", ours);
        size_t len;
        char *text = (char *)read_bytes(path, &len);
        char want[64];
        snprintf(want, sizeof want, "\"model_type\": \"%s\"", what);
        CHECK(text && strstr(text, want) && strstr(text, fx[f].gated ? "\"expand_v\": 1.5," : "\"expand_v\": 2,"),
              "%s: saved config.json:\n%s", what, text ? text : "(none)");
        free(text);
        Model *m2 = NULL;
        CHECK(!checkpoint_load_model(ours, backend_cpu(), &m2), "%s: %s", what, mn_last_error());
        if (m2) {
            char diff[256];
            CHECK(!config_diff(&m->cfg, &m2->cfg, diff, sizeof diff), "%s: round trip changed %s", what, diff);
            check_tensors("round trip", m2, ft, n, vals);
            int32_t tok[7] = {1, 5, 9, 13, 2, 39, 0};
            float *l1 = xcalloc(7 * 40, 4), *l2 = xcalloc(7 * 40, 4);
            logits_of(m, tok, 7, l1);
            logits_of(m2, tok, 7, l2);
            CHECK(!memcmp(l1, l2, sizeof(float) * 7 * 40), "%s: logits differ after the round trip", what);
            free(l1);
            free(l2);
            model_free(m2);
        }
        // the saved config without our block (as fla would write it back) reads as the same config
        snprintf(path, sizeof path, "%s/config.json", ours);
        text = (char *)read_bytes(path, &len);
        char *block = text ? strstr(text, ",\n  \"mesanet\"") : NULL;
        if (block) {
            strcpy(block, "\n}\n");
            snprintf(path, sizeof path, "%s/hf.json", ours);
            write_bytes(path, text, strlen(text));
            ModelConfig hf;
            CHECK(!config_load(&hf, path), "%s: %s", what, mn_last_error());
            char diff[256];
            CHECK(!config_diff(&m->cfg, &hf, diff, sizeof diff), "%s: fla's fields alone give another config: %s", what,
                  diff);
        }
        CHECK(block != NULL, "%s: no mesanet block", what);
        free(text);
        for (int i = 0; i < n; i++) free(vals[i]);
        model_free(m);
        tmp_remove(&t);
    }
}

// Widths whose ratios are not exact in binary (fla computes int(hidden * expand_k)): the saved
// config.json, read without our block, gives the same widths.
TEST(gdn_paper_saved_ratios_give_back_the_widths) {
    struct {
        const char *mixer;
        int dim, heads, dk, dv;
    } w[] = {{"deltanet-paper", 12, 2, 4, 6}, {"deltanet-paper", 30, 2, 7, 11}, {"gdn-paper", 12, 2, 12, 20},
             {"gdn-paper", 40, 3, 24, 7}};
    TmpDir t;
    tmp_make(&t);
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
        Case k = {w[i].mixer, 1, 1, 0, 0};
        ModelConfig c = config_of(&k, 2);
        c.dim = w[i].dim;
        c.n_heads = w[i].heads;
        c.head_dim = w[i].dk;
        c.head_v_dim = w[i].dv;
        c.mlp_hidden = 256;
        c.vocab_size = 50;
        const char *path = tmp_path(&t, "config.json");
        CHECK(!config_save(&c, path), "%s", mn_last_error());
        size_t len;
        char *text = (char *)read_bytes(path, &len);
        char *block = text ? strstr(text, ",\n  \"mesanet\"") : NULL;
        CHECK(block != NULL, "no mesanet block");
        if (!block) continue;
        strcpy(block, "\n}\n");
        write_bytes(path, text, strlen(text));
        free(text);
        ModelConfig h;
        CHECK(!config_load(&h, path), "%s", mn_last_error());
        CHECK(h.head_dim == w[i].dk && (h.head_v_dim ? h.head_v_dim : h.head_dim) == w[i].dv && h.n_heads == w[i].heads,
              "%s D %d: Dk %d, Dv %d read back as %d, %d", w[i].mixer, w[i].dim, w[i].dk, w[i].dv, h.head_dim,
              h.head_v_dim);
    }
    tmp_remove(&t);
}

// ------------------------------------------------------------------- refusals

TEST(gdn_paper_bad_configs_are_refused) {
    struct {
        const char *json, *msg;
    } bad[] = {
        {"{\"model_type\": \"gated_deltanet\", \"num_v_heads\": 12}", "num_v_heads = 12 differs from num_heads = 6"},
        {"{\"model_type\": \"gated_deltanet\", \"use_short_conv\": false}", "use_short_conv = false"},
        {"{\"model_type\": \"gated_deltanet\", \"expand_v\": 1.001}", "is not a whole value head width"},
        {"{\"model_type\": \"gated_deltanet\", \"attn\": {\"layers\": [1], \"num_heads\": 4}}", "\"attn\" is set"},
        {"{\"model_type\": \"delta_net\", \"qk_norm\": \"sum\"}", "\"qk_norm\" must be \"l2\""},
        {"{\"model_type\": \"delta_net\", \"qk_activation\": \"relu\"}", "\"qk_activation\" must be \"silu\""},
        {"{\"model_type\": \"delta_net\", \"use_beta\": false}", "use_beta = false"},
        {"{\"model_type\": \"delta_net\", \"num_heads\": 3}", "must be positive multiples of num_heads = 3"},
        {"{\"model_type\": \"gated_deltanet\", \"hidden_act\": \"gelu\"}", "hidden_act must be \"swish\""},
        {"{\"preset\": \"tiny\", \"mixer\": \"gdn\", \"head_v_dim\": 32}",
         ":1: \"head_v_dim\" does not apply to mixer \"gdn\": only gdn-paper, deltanet-paper, mlstm-large read it"},
    };
    TmpDir t;
    tmp_make(&t);
    const char *path = tmp_path(&t, "config.json");
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_bytes(path, bad[i].json, strlen(bad[i].json));
        ModelConfig c;
        int s = config_load(&c, path);
        CHECK(s != MN_OK && strstr(mn_last_error(), bad[i].msg), "%s: status %d, '%s' lacks '%s'", bad[i].json, s,
              mn_last_error(), bad[i].msg);
    }
    // fla's defaults for absent keys (configuration_gated_deltanet.py, configuration_delta_net.py)
    ModelConfig c;
    const char *g = "{\"model_type\": \"gated_deltanet\"}", *d = "{\"model_type\": \"delta_net\"}";
    write_bytes(path, g, strlen(g));
    CHECK(!config_load(&c, path) && c.dim == 2048 && c.n_heads == 6 && c.head_dim == 256 && c.head_v_dim == 512 &&
              c.n_layers == 21 && c.output_gate && !c.neg_eigen && c.mlp_hidden == 5632 && c.vocab_size == 32000,
          "gated_deltanet defaults: %s", mn_last_error());
    write_bytes(path, d, strlen(d));
    CHECK(!config_load(&c, path) && c.dim == 2048 && c.n_heads == 16 && c.head_dim == 128 && c.head_v_dim == 0 &&
              c.n_layers == 24 && !c.output_gate,
          "delta_net defaults: %s", mn_last_error());
    tmp_remove(&t);
}

// gdn-paper's forget gate is an op of its own (gdn_gate_fwd / gdn_gate_bwd): a backend without it
// refuses gdn-paper by name, and builds deltanet-paper, which has no gate. (A backend without the
// linear-attention core refuses both: conformance_refused.)
TEST(gdn_paper_refused_on_a_backend_without_the_gate) {
    Backend no = *backend_cpu();
    LinOps lin = *no.lin;
    lin.gdn_gate_fwd = NULL, lin.gdn_gate_bwd = NULL;
    no.name = "bare";
    no.lin = &lin;
    const char *mixers[] = {"gdn-paper", "deltanet-paper"};
    for (int i = 0; i < 2; i++) {
        Case k = {mixers[i], 1, 1, 0, 0};
        ModelConfig c = config_of(&k, 2);
        Model *m = NULL;
        int s = model_create(&m, &c, &no);
        if (i == 0)
            CHECK(s == MN_ERR_UNSUPPORTED && !m && strstr(mn_last_error(), "mixer gdn-paper is not available on the bare backend"),
                  "gdn-paper without the gate op: status %d, '%s'", s, mn_last_error());
        else
            CHECK(s == MN_OK, "deltanet-paper without the gate op: %s", mn_last_error());
        model_free(m);
    }
}
