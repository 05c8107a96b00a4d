// The autoencoder head (ModelConfig.head "autoencoder", src/model/autoencoder.c) and its ops:
// GELU and the last-position pooling with the sin-cos embedding against finite differences
// (float64) and the CPU against the reference; the whole model's gradients against finite
// differences, the CPU model against the reference; a tiny model learning MAD's compression; the
// config field's round trip and refusals.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "core/backend.h"
#include "core/common.h"
#include "fd.h"
#include "mixer_case.h"
#include "model/model.h"
#include "test.h"
#include "tmpdir.h"
#include "train/optim.h"

// Float32 against float64 of an elementwise op or a sum of at most 7 terms: roundoff ~1e-7;
// 1e-5 (the op tests' bound) still catches any formula or index error, which shows as O(1).
#define F32_TOL 1e-5
// Central differences with h = 1e-6 in float64: truncation ~h^2 |f'''| ~1e-12 and cancellation
// ~1e-16 / 1e-6 = 1e-10 relative; 1e-6 leaves room and catches a wrong derivative (O(1)).
#define FD_TOL 1e-6

static double dot64(const double *a, const double *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

typedef struct {
    size_t n;
    int B, T, D;
    double *x, *wy, *y;
} OpCtx;

static double gelu_loss(void *p) {
    OpCtx *c = p;
    backend_ref()->gelu_fwd(backend_ref(), c->y, c->x, c->n);
    return dot64(c->y, c->wy, c->n);
}

static double pool_loss(void *p) {
    OpCtx *c = p;
    backend_ref()->pool_last_fwd(backend_ref(), c->y, c->x, c->B, c->T, c->D);
    return dot64(c->y, c->wy, c->n);
}

TEST(op_gelu) {
    const Backend *R = backend_ref(), *C = backend_cpu();
    // known values of x Phi(x): Phi(1) = 0.8413447460685429, Phi(-1) = 0.15865525393145707,
    // Phi(3) = 0.9986501019683699 (the normal CDF's tables)
    double kx[3] = {1, -1, 3}, ky[3];
    R->gelu_fwd(R, ky, kx, 3);
    double want[3] = {0.8413447460685429, -0.15865525393145707, 2.9959503059051097};
    for (int i = 0; i < 3; i++)
        CHECK(fabs(ky[i] - want[i]) < 1e-15, "gelu(%g) = %.17g, expected %.17g", kx[i], ky[i], want[i]);
    size_t n = 41;
    OpCtx c = {n, 0, 0, 0, rand_doubles(60, n, -5, 5), rand_doubles(61, n, -1, 1), xcalloc(n, 8)};
    double *dx = xcalloc(n, 8);
    R->gelu_bwd(R, dx, c.wy, c.x, n);
    double e = fd_check("gelu dx", gelu_loss, &c, c.x, dx, n, FD_TOL);
    test_note("gelu: float64 dx vs finite differences %.2e", e);
    float *x = floats_of(c.x, n), *wy = floats_of(c.wy, n), *y = xcalloc(n, 4), *fdx = xcalloc(n, 4);
    gelu_loss(&c);
    C->gelu_fwd(C, y, x, n);
    double ey = rel_err32(y, c.y, n);
    CHECK_REL("gelu y cpu vs ref", ey, F32_TOL);
    C->gelu_bwd(C, fdx, wy, x, n);
    double ed = rel_err32(fdx, dx, n);
    CHECK_REL("gelu dx cpu vs ref", ed, F32_TOL);
    C->gelu_bwd(C, wy, wy, x, n);  // in place (dx = dy), as the autoencoder head runs it
    CHECK_REL("gelu dx in place", rel_err_ff(wy, fdx, n), 0);
    test_note("gelu: cpu vs ref y %.2e, dx %.2e", ey, ed);
    free(c.x), free(c.wy), free(c.y), free(dx), free(x), free(wy), free(y), free(fdx);
}

TEST(op_pool_last) {
    const Backend *R = backend_ref(), *C = backend_cpu();
    // MAD's posemb_sincos_1d at D = 8 (h = 4): f_0 = 1, f_3 = 1e-4
    CHECK(fabs(mn_posemb(3, 0, 8) - sin(3.0)) < 1e-15 && fabs(mn_posemb(3, 4, 8) - cos(3.0)) < 1e-15 &&
              fabs(mn_posemb(5, 3, 8) - sin(5e-4)) < 1e-15 && fabs(mn_posemb(5, 7, 8) - cos(5e-4)) < 1e-15 &&
              mn_posemb(5, 8, 9) == 0,
          "mn_posemb differs from MAD's posemb_sincos_1d");
    for (int odd = 0; odd < 2; odd++) {
        int B = 3, T = 5, D = 8 + odd;
        size_t n = (size_t)B * T * D;
        OpCtx c = {n, B, T, D, rand_doubles(70 + odd, n, -2, 2), rand_doubles(72 + odd, n, -1, 1), xcalloc(n, 8)};
        pool_loss(&c);
        CHECK(fabs(c.y[((size_t)1 * T + 2) * D + 1] - c.x[((size_t)1 * T + T - 1) * D + 1] - mn_posemb(2, 1, D)) <
                  1e-15,
              "pool_last: z[1,2,1] != x[1,T-1,1] + pe[2,1]");
        double *dx = xcalloc(n, 8);
        R->pool_last_bwd(R, dx, c.wy, B, T, D);
        double e = fd_check(odd ? "pool_last dx (odd D)" : "pool_last dx", pool_loss, &c, c.x, dx, n, FD_TOL);
        float *x = floats_of(c.x, n), *wy = floats_of(c.wy, n), *y = xcalloc(n, 4), *fdx = xcalloc(n, 4);
        pool_loss(&c);
        C->pool_last_fwd(C, y, x, B, T, D);
        double ey = rel_err32(y, c.y, n);
        CHECK_REL("pool_last z cpu vs ref", ey, F32_TOL);
        memset(fdx, 0x7f, n * 4);  // overwritten everywhere, zeros included
        C->pool_last_bwd(C, fdx, wy, B, T, D);
        double ed = rel_err32(fdx, dx, n);
        CHECK_REL("pool_last dx cpu vs ref", ed, F32_TOL);
        test_note("pool_last (D = %d): float64 dx vs finite differences %.2e; cpu vs ref z %.2e, dx %.2e", D, e, ey, ed);
        free(c.x), free(c.wy), free(c.y), free(dx), free(x), free(wy), free(y), free(fdx);
    }
}

// ------------------------------------------------------------------------- the model

static ModelConfig ae_config(const char *mixer) {
    ModelConfig c;
    config_default(&c);
    snprintf(c.head, sizeof c.head, "autoencoder");
    c.tie_embeddings = 0;
    c.logit_cap = 0;
    mc_tiny_sizes(&c, mixer, 2);
    c.gate_bound = 0;
    return c;
}

TEST(autoencoder_gradients_match_finite_differences) {
    // a delta-rule block and an attention block, then a Mesa block and a GLA block
    const char *mixers[2] = {"gdn,mha", "mesa,gla"};
    for (int k = 0; k < 2; k++) {
        ModelConfig cfg = ae_config(mixers[k]);
        Model *m = mc_make(&cfg, backend_ref());
        CHECK(m->ae.on && model_find_param(m, "unembed.1.bias") >= 0 && model_find_param(m, "model.norm.weight") < 0 &&
                  model_find_param(m, "lm_head.weight") < 0,
              "the autoencoder's tensors replace the final norm and the head");
        mc_randomise(m, 21 + k, mc_base_bias_lambda);
        double worst;
        const char *wn;
        double e = mc_model_gradients(m, mixers[k], &worst, &wn);  // (and tensor by tensor, to 1e-5)
        test_note("autoencoder (%s): %zu parameters, whole-model gradient rel err %.2e (worst tensor %s %.2e)",
                  mixers[k], m->count, e, wn, worst);
        CHECK_REL("autoencoder whole-model gradient", e, FD_TOL);
        model_free(m);
    }
}

// The head's forward written out by hand in float64 from the residual stream leaving the last
// block (x_L, the reference model's own) and the parameters: MAD's decode(), step by step.
static void rms_ref(double *v, const double *w, int D, double eps) {
    double s = 0;
    for (int i = 0; i < D; i++) s += v[i] * v[i];
    double r = 1 / sqrt(s / D + eps);
    for (int i = 0; i < D; i++) v[i] *= r * w[i];
}

static void lin_ref(double *y, const double *x, const double *w, const double *b, int I, int O) {
    for (int o = 0; o < O; o++) {
        y[o] = b[o];
        for (int i = 0; i < I; i++) y[o] += w[(size_t)o * I + i] * x[i];
    }
}

TEST(autoencoder_forward_is_mads_decoder) {
    ModelConfig cfg = ae_config("gdn,mha");
    Model *m = mc_make(&cfg, backend_ref());
    mc_randomise(m, 31, mc_base_bias_lambda);
    enum { B = 2, T = 5 };
    int32_t tok[B * T];
    mc_tokens(tok, NULL, B * T, cfg.vocab_size, 4);
    CHECK(!model_forward(m, tok, NULL, B, T, 0, NULL), "%s", mn_last_error());
    int D = cfg.dim, V = cfg.vocab_size;
    const double *xl = (const double *)m->x + (size_t)cfg.n_layers * B * T * D, *const *p = (const double *const *)m->p;
    const AeHead *a = &m->ae;
    double err = 0, norm = 0, z[64], h[64], lg[64];
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            for (int i = 0; i < D; i++) z[i] = xl[((size_t)b * T + T - 1) * D + i] + mn_posemb(t, i, D);
            rms_ref(z, p[a->norm0], D, cfg.norm_eps);
            lin_ref(h, z, p[a->w1], p[a->b1], D, D);
            for (int i = 0; i < D; i++) h[i] = 0.5 * h[i] * (1 + erf(h[i] / sqrt(2.0)));
            rms_ref(h, p[a->norm1], D, cfg.norm_eps);
            lin_ref(z, h, p[a->w2], p[a->b2], D, D);
            for (int i = 0; i < D; i++) z[i] = 0.5 * z[i] * (1 + erf(z[i] / sqrt(2.0)));
            rms_ref(z, p[a->norm2], D, cfg.norm_eps);
            lin_ref(lg, z, p[a->wout], p[a->bout], D, V);
            const double *got = (const double *)m->logits + ((size_t)b * T + t) * V;
            for (int v = 0; v < V; v++) err += (got[v] - lg[v]) * (got[v] - lg[v]), norm += lg[v] * lg[v];
        }
    err = sqrt(err / norm);
    test_note("autoencoder logits vs the decoder written out in float64: rel err %.2e", err);
    CHECK_REL("autoencoder forward", err, 1e-13);  // the same float64 arithmetic in another order: ~1e-16
    model_free(m);
}

TEST(autoencoder_cpu_matches_reference) {
    ModelConfig cfg = ae_config("gdn,mha");
    cfg.dim = 24, cfg.n_heads = 3, cfg.head_dim = 8, cfg.mlp_hidden = 40, cfg.vocab_size = 37;
    Model *r = mc_make(&cfg, backend_ref()), *c = mc_make(&cfg, backend_cpu());
    model_init_params(r, 9);
    mc_randomise(r, 9, mc_base_bias_lambda);  // larger than the initialisation: every path carries gradient
    mc_copy_params(c, r);
    mc_check_model_cpu_vs_ref(r, c, "autoencoder gdn,mha", 0);  // loss 1e-5, gradients 1e-4 (float32 through the blocks)
    CHECK(model_reset_state(c, 1) != 0 && strstr(mn_last_error(), "autoencoder"), "decoding an autoencoder: '%s'",
          mn_last_error());
    model_free(r);
    model_free(c);
}

// MAD's compression on the CPU: 8 fixed sequences of 7 tokens below V-1 and the compression token;
// 60 AdamW steps on them. The loss starts near log V and must fall well below it.
TEST(autoencoder_tiny_learns_compression) {
    ModelConfig cfg = ae_config("gdn");
    cfg.vocab_size = 8, cfg.dim = 32, cfg.n_heads = 2, cfg.head_dim = 16, cfg.mlp_hidden = 64, cfg.gate_bound = 8;
    Model *m = mc_make(&cfg, backend_cpu());
    CHECK(!model_init_params(m, 3), "%s", mn_last_error());
    enum { B = 8, T = 8 };
    int32_t tok[B * T];
    MnRng r;
    mn_rng_seed(&r, 17);
    for (int i = 0; i < B * T; i++) tok[i] = i % T == T - 1 ? 7 : (int32_t)(mn_rng_u64(&r) % 7);
    AdamW o = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0, .clip = 1};
    CHECK(!adamw_init(&o, m), "%s", mn_last_error());
    double first = 0, last = 0;
    for (int step = 0; step < 60; step++) {
        double loss;
        model_zero_grad(m);
        CHECK(!model_forward(m, tok, tok, B, T, 1.0f / (B * T), &loss) && !model_backward(m), "%s", mn_last_error());
        adamw_step(&o, m, 1e-2f, NULL);
        if (step == 0) first = loss / (B * T);
        last = loss / (B * T);
    }
    adamw_free(&o, m);
    test_note("autoencoder (gdn) on 8 compression sequences: loss %.3f -> %.3f in 60 steps (log 8 = %.3f)", first, last,
              log(8.0));
    CHECK(fabs(first - log(8.0)) < 0.3, "initial loss %.3f far from log V", first);
    CHECK(isfinite(last) && last < first - 1.0, "the loss did not fall: %.3f -> %.3f", first, last);
    model_free(m);
}

// ------------------------------------------------------------------------- the config field

TEST(autoencoder_config_round_trip_and_refusals) {
    TmpDir t;
    tmp_make(&t);
    ModelConfig c = ae_config("gdn"), back;
    const char *path = tmp_path(&t, "config.json");
    memset(&back, 0x5a, sizeof back);
    CHECK(!config_save(&c, path) && !config_load(&back, path), "%s", mn_last_error());
    char diff[256];
    CHECK(!config_diff(&c, &back, diff, sizeof diff) && !strcmp(back.head, "autoencoder"), "round trip: %s", diff);
    ModelConfig d;
    config_default(&d);
    CHECK(!strcmp(d.head, "lm"), "default head '%s'", d.head);
    const struct {
        const char *json, *want;
    } cases[] = {
        {"{\"preset\": \"tiny\", \"head\": \"decoder\"}", "head = \"decoder\", expected \"lm\""},
        {"{\"preset\": \"tiny\", \"head\": \"autoencoder\"}", "expected tie_embeddings 0, logit_cap 0"},
        {"{\"preset\": \"tiny\", \"head\": \"autoencoder\", \"tie_embeddings\": false}", "logit_cap 30"},
        {"{\"preset\": \"tiny\", \"head\": 3}", "\"head\" must be a string"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        FILE *f = fopen(path, "w");
        fputs(cases[i].json, f);
        fclose(f);
        ModelConfig x;
        int s = config_load(&x, path);
        CHECK(s != 0 && strstr(mn_last_error(), cases[i].want), "%s: status %d, message '%s', expected '%s'",
              cases[i].json, s, mn_last_error(), cases[i].want);
    }
    FILE *f = fopen(path, "w");
    fputs("{\"preset\": \"tiny\", \"head\": \"autoencoder\", \"tie_embeddings\": false, \"logit_cap\": 0}", f);
    fclose(f);
    CHECK(!config_load(&d, path) && !strcmp(d.head, "autoencoder"), "a valid autoencoder config: %s", mn_last_error());
    tmp_remove(&t);
}
