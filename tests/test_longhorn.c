// Longhorn's layers beyond the conformance battery (which runs longhorn and longhorn-exact through
// every mixer's checks): the exact form against the online regression it solves, the paper's
// parameter counts, the official checkpoint folder both ways, and what is refused.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "core/common.h"
#include "core/safetensors.h"
#include "fd.h"
#include "mixer_case.h"
#include "model/config.h"
#include "model/format_longhorn.h"
#include "model/model.h"
#include "model/presets.h"
#include "model/weights.h"
#include "test.h"
#include "tmpdir.h"
#include "tool_run.h"
#include "train/checkpoint.h"

// ------------------------------------------------------------------- the exact form

static const double *param(const Model *m, const char *suffix) {
    char name[96];
    snprintf(name, sizeof name, "model.layers.0.%s", suffix);
    int i = weights_find(m->specs, m->nparams, name);
    if (i < 0) die("no tensor %s", name);
    return m->p[i];
}

// x A = b for a symmetric positive definite A [n,n] (Gaussian elimination, no pivoting needed), in place.
static void solve_right(double *A, double *x, int n) {
    for (int k = 0; k < n; k++)
        for (int i = k + 1; i < n; i++) {
            double f = A[i * n + k] / A[k * n + k];
            for (int j = k; j < n; j++) A[i * n + j] -= f * A[k * n + j];
            x[i] -= f * x[k];
        }
    for (int k = n - 1; k >= 0; k--) {
        for (int j = k + 1; j < n; j++) x[k] -= A[k * n + j] * x[j];
        x[k] /= A[k * n + k];
    }
}

// longhorn-exact on the float64 reference against the regression it is the closed form of: with the
// layer's own q, k, v and beta (its projections, convolutions and gate through the reference's
// ops), every row of S_t minimises |s - s_{t-1}|^2 + beta_t (s . k_t - v_t)^2, i.e. solves
// s (I + beta_t k_t k_t^T) = s_{t-1} + beta_t v_t k_t^T, done here by elimination (no
// Sherman-Morrison, no delta rule); then o_t = S_t q_t, the per-head RMSNorm and o_proj. The keys
// are raw (norms above and below 1: beta |k|^2 reaches well past 1, where eps and beta differ
// most). Both are float64 computations of one function: 1e-10.
TEST(longhorn_exact_is_the_implicit_regression) {
    ModelConfig c;
    config_default(&c);
    mc_tiny_sizes(&c, "longhorn-exact", 1);
    Model *m = mc_make(&c, backend_ref());
    mc_randomise(m, 5, mc_base_bias_lambda);
    const Backend *R = m->be;
    int B = 2, T = 9, N = B * T, D = c.dim, H = c.n_heads, Dk = c.head_dim, Q = H * Dk, K = c.conv_size;
    double *u = rand_doubles(6, (size_t)N * D, -1, 1), *y = xcalloc((size_t)N * D, 8);
    CHECK(!m->mixers[0].ops->forward(&m->mixers[0], y, u, B, T, 0), "%s", mn_last_error());
    // q, k: SiLU(conv(W u)); v = W_v u; beta = sigmoid(W_b u + b_b)
    double *qp = xcalloc((size_t)N * Q, 8), *kp = xcalloc((size_t)N * Q, 8), *q = xcalloc((size_t)N * Q, 8);
    double *k = xcalloc((size_t)N * Q, 8), *v = xcalloc((size_t)N * Q, 8), *b = xcalloc((size_t)N * H, 8);
    R->linear_fwd(R, qp, u, param(m, "attn.q_proj.weight"), NULL, N, D, Q);
    R->linear_fwd(R, kp, u, param(m, "attn.k_proj.weight"), NULL, N, D, Q);
    R->linear_fwd(R, v, u, param(m, "attn.v_proj.weight"), NULL, N, D, Q);
    R->linear_fwd(R, b, u, param(m, "attn.b_proj.weight"), param(m, "attn.b_proj.bias"), N, D, H);
    R->conv_fwd(R, q, qp, param(m, "attn.q_conv1d.weight"), B, T, Q, K, NULL, NULL);
    R->conv_fwd(R, k, kp, param(m, "attn.k_conv1d.weight"), B, T, Q, K, NULL, NULL);
    R->silu_fwd(R, q, q, (size_t)N * Q);
    R->silu_fwd(R, k, k, (size_t)N * Q);
    double *o = xcalloc((size_t)N * Q, 8), *S = xcalloc((size_t)Dk * Dk, 8), A[64 * 64], row[64], worst = 0;
    for (int s = 0; s < B; s++)
        for (int h = 0; h < H; h++) {
            memset(S, 0, sizeof(double) * Dk * Dk);
            for (int t = 0; t < T; t++) {
                size_t n = (size_t)s * T + t;
                const double *kt = k + n * Q + h * Dk, *vt = v + n * Q + h * Dk, *qt = q + n * Q + h * Dk;
                double beta = 1 / (1 + exp(-b[n * H + h])), kk = 0;
                for (int j = 0; j < Dk; j++) kk += kt[j] * kt[j];
                worst = fmax(worst, beta * kk);
                for (int i = 0; i < Dk; i++) {  // row i of S: its own regression
                    for (int a = 0; a < Dk; a++)
                        for (int c2 = 0; c2 < Dk; c2++) A[a * Dk + c2] = (a == c2) + beta * kt[a] * kt[c2];
                    for (int j = 0; j < Dk; j++) row[j] = S[i * Dk + j] + beta * vt[i] * kt[j];
                    solve_right(A, row, Dk);
                    memcpy(S + i * Dk, row, sizeof(double) * Dk);
                }
                for (int i = 0; i < Dk; i++) {
                    double acc = 0;
                    for (int j = 0; j < Dk; j++) acc += S[i * Dk + j] * qt[j];
                    o[n * Q + h * Dk + i] = acc;
                }
            }
        }
    double *on = xcalloc((size_t)N * Q, 8), *rstd = xcalloc((size_t)N * H, 8), *want = xcalloc((size_t)N * D, 8);
    R->rmsnorm_fwd(R, on, rstd, o, param(m, "attn.o_norm.weight"), N, Q, Dk, Q, c.norm_eps);
    R->linear_fwd(R, want, on, param(m, "attn.o_proj.weight"), NULL, N, Q, D);
    double e = rel_err64(y, want, (size_t)N * D);
    test_note("longhorn-exact vs the regression solved by elimination: rel err %.2e (beta |k|^2 up to %.1f)", e, worst);
    CHECK(worst > 2, "the keys' norms stay small (beta |k|^2 at most %.2f): the implicit step is barely exercised", worst);
    CHECK_REL("longhorn-exact vs the implicit regression", e, 1e-10);
    free(u); free(y); free(qp); free(kp); free(q); free(k); free(v); free(b); free(o); free(S); free(on); free(rstd);
    free(want);
    model_free(m);
}

// ------------------------------------------------------------------- parameter counts

// The Longhorn paper's Table 3 sizes (gdn-longhorn-notes.md B.2, B.4): 128.6M at d_model 768 with 24
// blocks, 370.0M at 1024 with 48 (the paper prints 369.8M), vocabulary 50304, tied; and a block's
// tensors counted by hand: in_proj 2 E D, conv E K + E, x_proj E (R + 2 N), dt_head R E + E, D E,
// out_proj D E, its norm D.
TEST(longhorn_paper_counts) {
    const struct {
        const char *preset;
        long D, L;
        size_t want;
    } p[] = {{"longhorn-125m", 768, 24, 128563968}, {"longhorn-350m", 1024, 48, 369968128}};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) {
        ModelConfig c;
        CHECK(!config_preset(&c, p[i].preset) && !config_validate(&c, p[i].preset), "%s", mn_last_error());
        size_t total = 0, mixers = 0;
        CHECK(!config_param_count(&c, &total, &mixers, NULL), "%s", mn_last_error());
        long D = p[i].D, E = 2 * D, N = 16, R = (D + 15) / 16, K = 4;
        long block = 2 * E * D + E * K + E + E * (R + 2 * N) + R * E + E + E + D * E;
        test_note("%s: %zu parameters (%.1fM); the mixers %zu", p[i].preset, total, total / 1e6, mixers);
        CHECK(total == p[i].want, "%s: %zu parameters, want %zu", p[i].preset, total, p[i].want);
        CHECK((long)mixers == p[i].L * block, "%s: mixers %zu, by hand %ld", p[i].preset, mixers, p[i].L * block);
        CHECK(c.tie_embeddings && !c.embed_scale && c.logit_cap == 0 && c.norm_eps == 1e-5f && c.d_state == 16 &&
                  c.expand == 2 && c.conv_size == 4,
              "%s: not the official backbone", p[i].preset);
    }
}

// ------------------------------------------------------------------- the official checkpoint folder

static void check_same_logits(const char *what, Model *a, Model *b) {
    int B = 2, T = 7, V = a->cfg.vocab_size;
    int32_t tok[14];
    mc_tokens(tok, NULL, 14, V, 3);
    CHECK(!model_forward(a, tok, NULL, B, T, 0, NULL) && !model_forward(b, tok, NULL, B, T, 0, NULL), "%s: %s", what,
          mn_last_error());
    size_t n = (size_t)B * T * V;
    float *la = xcalloc(n, 4), *lb = xcalloc(n, 4);
    a->be->download_f32(a->be, la, a->logits, n, MEM_ACT);
    b->be->download_f32(b->be, lb, b->logits, n, MEM_ACT);
    CHECK(!memcmp(la, lb, n * 4), "%s: logits differ (rel err %.3g)", what, rel_err_ff(lb, la, n));
    free(la);
    free(lb);
}

static Model *load(const char *dir) {
    Model *m = NULL;
    if (checkpoint_load_model(dir, backend_cpu(), &m)) die("%s: %s", dir, mn_last_error());
    return m;
}

// A tiny longhorn model (d_state 5, expand 3, conv 3: every size differs), randomised.
static Model *tiny_longhorn(int tie) {
    ModelConfig c;
    config_default(&c);
    mc_tiny_sizes(&c, "longhorn", 2);
    c.d_state = 5;
    c.expand = 3;
    c.conv_size = 3;
    c.embed_scale = 0;
    c.logit_cap = 0;
    c.norm_eps = 1e-5f;
    c.tie_embeddings = tie;
    c.vocab_size = 16;
    Model *m = mc_make(&c, backend_cpu());
    mc_randomise(m, 11 + tie, mc_base_bias_lambda);
    return m;
}

// The tensor `name` of a safetensors file: its shape, and (where out is not NULL) its floats.
static void file_tensor(const char *path, const char *name, int64_t r, int64_t cols, float *out) {
    StFile *f;
    if (st_open(path, &f)) die("%s", mn_last_error());
    int64_t shape[2] = {r, cols};
    float *buf = xcalloc((size_t)(r * cols), 4);
    CHECK(!st_read_f32(f, name, buf, r * cols, cols ? 2 : 1, shape), "%s", mn_last_error());
    if (out) memcpy(out, buf, (size_t)(r * cols) * 4);
    free(buf);
    st_close(f);
}

// Ours exported as the official folder: config.json as LonghornConfig's fields, the joined in_proj
// and x_proj in their row order (x then z; delta's rank, then k, then q), the module's names (the
// head under lm_head.weight where tied too); it loads back to the same tensors and the same logits,
// bit for bit, and exported as ours again likewise; LonghornLM's "transformer." names load too.
TEST(longhorn_format_round_trips) {
    TmpDir td;
    tmp_make(&td);
    for (int tie = 0; tie < 2; tie++) {
        Model *m = tiny_longhorn(tie);
        char ours[320], theirs[320], back[320], path[400];
        snprintf(ours, sizeof ours, "%s/ours-%d", td.dir, tie);
        snprintf(theirs, sizeof theirs, "%s/theirs-%d", td.dir, tie);
        snprintf(back, sizeof back, "%s/back-%d", td.dir, tie);
        CHECK(!mn_mkdirs(ours) && !checkpoint_save_model(ours, m, 3), "%s", mn_last_error());
        CHECK(!checkpoint_export(ours, theirs, "longhorn", NULL), "%s", mn_last_error());
        snprintf(path, sizeof path, "%s/config.json", theirs);
        char *cfg = read_text(path);
        CHECK(cfg && strstr(cfg, "\"d_model\": 12") && strstr(cfg, "\"n_layer\": 2") &&
                  strstr(cfg, "\"ssm_cfg\": {\"d_state\": 5, \"d_conv\": 3, \"expand\": 3}") &&
                  strstr(cfg, tie ? "\"tie_embeddings\": true" : "\"tie_embeddings\": false"),
              "config.json:\n%s", cfg ? cfg : "(none)");
        free(cfg);
        // the joined tensors hold ours row block by row block
        snprintf(path, sizeof path, "%s/model.safetensors", theirs);
        int E = 36, D = 12, N = 5, R = 1;
        float *in = xcalloc((size_t)2 * E * D, 4), *xp = xcalloc((size_t)(R + 2 * N) * E, 4);
        file_tensor(path, "backbone.layers.1.mixer.in_proj.weight", 2 * E, D, in);
        file_tensor(path, "backbone.layers.1.mixer.x_proj.weight", R + 2 * N, E, xp);
        file_tensor(path, "lm_head.weight", 16, D, NULL);
        const struct {
            const char *ours;
            const float *at;
            size_t n;
        } parts[] = {{"mixer.in_proj_x.weight", in, (size_t)E * D},       {"mixer.in_proj_z.weight", in + E * D, (size_t)E * D},
                     {"mixer.x_proj_dt.weight", xp, (size_t)R * E},       {"mixer.x_proj_k.weight", xp + R * E, (size_t)N * E},
                     {"mixer.x_proj_q.weight", xp + (R + N) * E, (size_t)N * E}};
        for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
            char name[96];
            snprintf(name, sizeof name, "model.layers.1.%s", parts[i].ours);
            int t = weights_find(m->specs, m->nparams, name);
            CHECK(t >= 0 && !memcmp(m->p[t], parts[i].at, parts[i].n * 4), "%s: not where the official layout puts it",
                  name);
        }
        free(in);
        free(xp);
        Model *a = load(theirs);
        CHECK(a->total == m->total && !memcmp(a->params, m->params, m->total * 4), "tie %d: the weights changed", tie);
        check_same_logits(tie ? "official folder, tied" : "official folder, untied", m, a);
        CHECK(!checkpoint_export(theirs, back, "hf", NULL), "%s", mn_last_error());
        Model *b = load(back);
        check_same_logits("official folder exported as ours", m, b);
        model_free(a);
        model_free(b);
        // LonghornLM (nanoGPT's train.py) saves the same tensors under "transformer."
        StFile *f;
        if (st_open(path, &f)) die("%s", mn_last_error());
        int nt = st_count(f);
        StTensor *tt = xcalloc((size_t)nt, sizeof(StTensor));
        char (*names)[128] = xcalloc((size_t)nt, 128);
        for (int i = 0; i < nt; i++) {
            const char *name;
            const int64_t *shape;
            st_info(f, i, &name, &tt[i].dtype, &tt[i].ndim, &shape);
            snprintf(names[i], 128, "transformer.%s", name);
            tt[i].name = names[i];
            memcpy(tt[i].shape, shape, sizeof(int64_t) * tt[i].ndim);
            tt[i].data = st_data(f, i, NULL);
        }
        CHECK(!st_write(path, tt, nt, NULL, 0), "%s", mn_last_error());
        st_close(f);
        free(tt);
        free(names);
        Model *p = load(theirs);
        check_same_logits("LonghornLM's transformer. names", m, p);
        model_free(p);
        model_free(m);
    }
    tmp_remove(&td);
}

// ------------------------------------------------------------------- refusals

static void write_text(const char *path, const char *text) { write_bytes(path, text, strlen(text)); }

#define LH_CONFIG(extra, ssm)                                                                                     \
    "{\"d_model\": 12, \"n_layer\": 2, \"vocab_size\": 13, \"ssm_cfg\": {\"d_state\": 4" ssm "}, "               \
    "\"pad_vocab_size_multiple\": 8" extra "}"

// LonghornConfig's fields that mesanet does not compute are refused naming the key and what it
// takes; the vocabulary is padded as the module pads it; our own config's impossible sizes are
// refused naming the field; a model the official module cannot hold is not exported as it; a file
// of the official names whose sizes differ from the config is refused naming the tensor.
TEST(longhorn_refusals_name_the_field) {
    TmpDir td;
    tmp_make(&td);
    const char *path = tmp_path(&td, "config.json");
    ModelConfig c;
    write_text(path, LH_CONFIG("", ""));
    CHECK(!config_load(&c, path) && !strcmp(c.mixer, "longhorn") && c.vocab_size == 16 && c.d_state == 4 &&
              c.expand == 2 && c.tie_embeddings && c.norm_eps == 1e-5f,
          "the official config: %s (vocab %d)", mn_last_error(), c.vocab_size);
    const struct {
        const char *text, *want;
    } bad[] = {
        {LH_CONFIG(", \"d_intermediate\": 64", ""), "d_intermediate"},
        {LH_CONFIG(", \"attn_layer_idx\": [1]", ""), "attn_layer_idx"},
        {LH_CONFIG(", \"rms_norm\": false", ""), "rms_norm"},
        {LH_CONFIG(", \"n_heads\": 4", ""), "unknown key \"n_heads\""},
        {LH_CONFIG("", ", \"dt_rank\": 3"), "ssm_cfg.dt_rank"},
        {LH_CONFIG("", ", \"bias\": true"), "ssm_cfg.bias"},
        {LH_CONFIG("", ", \"conv_bias\": false"), "ssm_cfg.conv_bias"},
        {LH_CONFIG("", ", \"expand\": 1.5"), "ssm_cfg.expand"},
        {LH_CONFIG("", ", \"d_conv\": 0"), "ssm_cfg.d_conv"},
        {LH_CONFIG("", ", \"headdim\": 4"), "ssm_cfg.headdim"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_text(path, bad[i].text);
        int st = config_load(&c, path);
        CHECK(st == MN_ERR_FORMAT && strstr(mn_last_error(), bad[i].want), "%s: status %d, '%s' (wanted '%s')",
              bad[i].text, st, mn_last_error(), bad[i].want);
    }
    // our config: d_state and expand out of range, named
    ModelConfig o;
    CHECK(!config_preset(&o, "longhorn-125m"), "%s", mn_last_error());
    o.d_state = 0;
    CHECK(config_validate(&o, "cfg") == MN_ERR_ARG && strstr(mn_last_error(), "d_state"), "%s", mn_last_error());
    o.d_state = 16;
    o.expand = 17;
    CHECK(config_validate(&o, "cfg") == MN_ERR_ARG && strstr(mn_last_error(), "expand"), "%s", mn_last_error());
    // a mixer that reads neither refuses them
    CHECK(!config_preset(&o, "tiny"), "%s", mn_last_error());
    char json[128];
    snprintf(json, sizeof json, "{\"preset\": \"tiny\", \"d_state\": 8}");
    write_text(path, json);
    CHECK(config_load(&o, path) == MN_ERR_FORMAT && strstr(mn_last_error(), "longhorn"), "%s", mn_last_error());
    // the official module holds longhorn blocks only
    Model *mesa = NULL;
    ModelConfig mc;
    config_default(&mc);
    mc_tiny_sizes(&mc, "mesa", 1);
    char ours[320], out[320];
    snprintf(ours, sizeof ours, "%s/mesa", td.dir);
    snprintf(out, sizeof out, "%s/mesa-out", td.dir);
    if (model_create(&mesa, &mc, backend_cpu()) || model_init_params(mesa, 1)) die("%s", mn_last_error());
    CHECK(!mn_mkdirs(ours) && !checkpoint_save_model(ours, mesa, 1), "%s", mn_last_error());
    CHECK(checkpoint_export(ours, out, "longhorn", NULL) == MN_ERR_ARG && strstr(mn_last_error(), "mixer \"mesa\""),
          "%s", mn_last_error());
    // nor another norm eps than its RMSNorm's 1e-5 (not in its config: it would change the function)
    ModelConfig eps;
    CHECK(!config_preset(&eps, "longhorn-125m"), "%s", mn_last_error());
    eps.norm_eps = 1e-6f;
    CHECK(longhorn_check(&eps) == MN_ERR_ARG && strstr(mn_last_error(), "norm_eps"), "%s", mn_last_error());
    model_free(mesa);
    // an official folder whose tensors are not the config's sizes: the tensor is named
    Model *m = tiny_longhorn(1);
    snprintf(ours, sizeof ours, "%s/lh", td.dir);
    snprintf(out, sizeof out, "%s/lh-out", td.dir);
    CHECK(!mn_mkdirs(ours) && !checkpoint_save_model(ours, m, 1) && !checkpoint_export(ours, out, "longhorn", NULL), "%s",
          mn_last_error());
    snprintf(json, sizeof json, "%s/config.json", out);
    char *text = read_text(json), *at = text ? strstr(text, "\"d_state\": 5, \"d_conv\"") : NULL;
    CHECK(at != NULL, "the exported config has no ssm_cfg d_state");
    if (at) {
        at[11] = '6';  // ssm_cfg.d_state 6: x_proj is one row per state slot longer than the file's
        write_text(json, text);
        Model *bad_m = NULL;
        int st = checkpoint_load_model(out, backend_cpu(), &bad_m);
        CHECK(st && !bad_m && strstr(mn_last_error(), "x_proj.weight"), "status %d: %s", st, mn_last_error());
    }
    free(text);
    model_free(m);
    tmp_remove(&td);
}
