// The conformance battery on the GPU (build/run_tests_cuda; tests/test_conformance.c is the CPU's):
// every registered mixer and the patterns of its table (tests/mixer_case.c: mc_cases), each model
// on the CUDA backend against the same model on the CPU (loss and gradients, bf16 activations on
// the GPU), and decoding on the GPU against one forward there. A case whose core family the CUDA
// backend lacks must be refused by name when its model is made. The bounds are
// those of test_cuda.c's whole model (loss 5e-3, gradients rel err 0.15 and cosine 0.99) and of the
// GPU suite's decoding tests (2e-2: two bf16 paths).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "core/backend.h"
#include "core/common.h"
#include "core/half.h"
#include "../fd.h"
#include "../mixer_case.h"
#include "model/model.h"
#include "../test.h"

static const Backend *G;

static int setup(void) {
    G = backend_cuda();
    if (!G) test_fail(__FILE__, __LINE__, "no CUDA backend: %s", mn_last_error());
    return G != NULL;
}

enum { MAXCASES = 64, W = 50 };

// The sizes of test_cuda.c's models (width 64, 2 heads of 32: sizes every CUDA core takes), the
// tiny preset's context of 64.
static const McSizes gpu = {97, 64, 2, 32, 96, 64};

// A case's config on the GPU: two blocks at least, and, as test_cuda.c's whole-model comparison
// explains, a well-conditioned setting: lambda 4 (Mesa's ridge), an untied and unscaled embedding
// (at the default initialisation the q/k gradients of a small random model are so sensitive that
// rounding the weights to bf16 moves them by half); the paper's logit cap of 30 where the case has one.
static ModelConfig gpu_config(const McCase *k) {
    ModelConfig c = mc_case_config(k, &gpu, 2);
    c.lambda_init = 4;
    c.tie_embeddings = 0;
    c.embed_scale = 0;
    if (c.logit_cap > 0) c.logit_cap = 30;
    return c;
}

// The case's model on the GPU, or NULL where the CUDA backend lacks a core family the case runs on
// (observed on the CPU: mc_families): model_create must then refuse it, MN_ERR_UNSUPPORTED naming the
// first such block's mixer and the backend.
static Model *gpu_model(const ModelConfig *cfg, const char *name) {
    unsigned per[64] = {0};
    unsigned missing = mc_families(cfg, per) & mc_lacking(G);
    Model *m = NULL;
    int st = model_create(&m, cfg, G);
    if (!missing) {
        CHECK(!st, "%s on cuda: %s", name, mn_last_error());
        return m;
    }
    int n = mc_pattern_len(cfg->mixer), l = 0;
    while (l < n && !(per[l] & missing)) l++;
    char mixer[64], want[96], be[64];
    snprintf(want, sizeof want, "mixer %s ", mc_pattern_name(cfg->mixer, l, mixer, sizeof mixer));
    snprintf(be, sizeof be, "the %s backend", G->name);
    CHECK(st == MN_ERR_UNSUPPORTED && !m && strstr(mn_last_error(), want) && strstr(mn_last_error(), be),
          "%s: the CUDA backend lacks its core, but: status %d, '%s' (wanted '%s' and '%s')", name, st, mn_last_error(),
          want, be);
    test_note("%-*s refused on cuda, which lacks its core: %s", W, name, mn_last_error());
    model_free(m);
    return NULL;
}

// The gradients' relative error and cosine of g against the reference r over n numbers.
static void compare(const double *g, const double *r, size_t n, double *e, double *cosine) {
    double dot = 0, n1 = 0, n2 = 0;
    for (size_t j = 0; j < n; j++) dot += g[j] * r[j], n1 += g[j] * g[j], n2 += r[j] * r[j];
    *e = rel_err64(g, r, n);
    *cosine = dot / sqrt(n1 * n2);
}

// How far the CPU model's own gradients move under rounding of bf16's size: its weights rounded
// to bf16 (as the GPU's copies are) and every weight moved by a random 2^-8 relative (a stand-in
// for the GPU's bf16 activations), worst of two draws. Some cases are ill-conditioned there: a
// delta rule without forget gate carries every token's error through the whole sequence.
static void rounding_sensitivity(Model *mc, const int32_t *tok, const int32_t *tgt, int B, int T, const double *gc,
                                 double *e, double *cosine) {
    float *w = mc->params, *saved = xcalloc(mc->total, sizeof(float));
    memcpy(saved, w, mc->total * sizeof(float));
    double *gp = xcalloc(mc->total, sizeof(double));
    *e = 0, *cosine = 1;
    for (int r = 0; r < 2; r++) {
        double *noise = rand_doubles(700 + r, mc->total, -1, 1);
        for (size_t i = 0; i < mc->total; i++) w[i] = bf16_to_f32(f32_to_bf16(saved[i] * (float)(1 + ldexp(noise[i], -8))));
        free(noise);
        mc_model_run(mc, tok, tgt, B, T, gp);
        double er, cr;
        compare(gp, gc, mc->total, &er, &cr);
        *e = fmax(*e, er);
        *cosine = fmin(*cosine, cr);
    }
    memcpy(w, saved, mc->total * sizeof(float));
    free(saved);
    free(gp);
}

// The same model (the same initialisation) and batch of 3 x 70 tokens on the GPU and the CPU: the
// loss to 5e-3, and the gradients by how well the case is conditioned (rounding_sensitivity). Where
// the CPU's own gradients keep a cosine of 0.9975 under bf16-sized rounding, the GPU's are held to
// test_cuda.c's whole-model bounds (rel err 0.15, cosine 0.99; measured 1.5e-2 to 5.2e-2 and at
// least 0.9986 on an H200); where they do not (a delta rule without forget gate, a tight forget-gate
// bound, wide value heads: the CPU moved to cosines of 0.98 and below), to a cosine of 0.9 (measured
// 0.951 to 0.9947): a wrong term leaves far less, and the loss check holds for every case.
TEST(cuda_conformance_matches_cpu) {
    if (!setup()) return;
    McCase cases[MAXCASES];
    int n = mc_cases(cases, MAXCASES);
    for (int i = 0; i < n; i++) {
        char name[128];
        mc_case_name(&cases[i], name, sizeof name);
        ModelConfig cfg = gpu_config(&cases[i]);
        Model *mg = gpu_model(&cfg, name);
        if (!mg) continue;
        Model *mc = mc_make(&cfg, backend_cpu());
        model_init_params(mc, 4 + i);
        model_init_params(mg, 4 + i);
        int B = 3, T = 70;
        size_t N = (size_t)B * T;
        int32_t *tok = xcalloc(N, 4), *tgt = xcalloc(N, 4);
        mc_tokens(tok, tgt, N, cfg.vocab_size, 8 + i);
        double *gc = xcalloc(mc->total, 8), *gg = xcalloc(mg->total, 8);
        double lc = mc_model_run(mc, tok, tgt, B, T, gc), lg = mc_model_run(mg, tok, tgt, B, T, gg);
        double e, cosine, se, sc;
        compare(gg, gc, mc->total, &e, &cosine);
        rounding_sensitivity(mc, tok, tgt, B, T, gc, &se, &sc);
        int ill = !(sc >= 0.9975);
        double tol_e = ill ? INFINITY : 0.15, tol_c = ill ? 0.9 : 0.99;
        test_note("%-*s loss cpu %.5f cuda %.5f; gradients rel err %.2e, cosine %.4f (the CPU's own under rounding: "
                  "%.2e, %.4f%s)",
                  W, name, lc / N, lg / N, e, cosine, se, sc, ill ? ": ill-conditioned" : "");
        CHECK(fabs(lc - lg) <= 5e-3 * fabs(lc), "%s: loss %g (cuda) vs %g (cpu)", name, lg / N, lc / N);
        CHECK(e <= tol_e && cosine >= tol_c, "%s: gradients differ: rel err %.3g (tol %.3g), cosine %.4f (tol %.4f)",
              name, e, tol_e, cosine, tol_c);
        free(gc), free(gg), free(tok), free(tgt);
        model_free(mc);
        model_free(mg);
    }
}

// Decoding on the GPU: 2 sequences of 80 tokens as a prefill of 50, single tokens (recorded into
// CUDA graphs where the blocks allow: model.h), a prefill of 5 after 60 tokens and single tokens
// again, the logits at every decoded position against one forward's on the GPU: 2e-2, the bound of
// the GPU suite's decoding tests (two bf16 paths; a lost state hand-off is O(1)). A model with an
// mLSTM block: 4e-2. Its chunkwise kernels take one bf16 product per product, as TFLA and fla do
// (docs/cuda.md; 2.3e-3 on h at bench xlstm's inputs, TFLA's 2.35e-3), where the delta rules'
// split products into two or three; this test's exp(i)-weighted scores of both signs amplify that
// rounding (1.7e-2 to 3.6e-2 measured on an H200) where the float32 CPU decodes these models as
// closely as the others (1.1e-6 to 1.8e-6 against 0.8e-6 to 3.2e-6).
TEST(cuda_conformance_decode) {
    if (!setup()) return;
    McCase cases[MAXCASES];
    int n = mc_cases(cases, MAXCASES);
    for (int i = 0; i < n; i++) {
        char name[128];
        mc_case_name(&cases[i], name, sizeof name);
        ModelConfig cfg = gpu_config(&cases[i]);
        Model *m = gpu_model(&cfg, name);
        if (!m) continue;
        model_init_params(m, 2 + i);
        int32_t tok[160];
        mc_tokens(tok, NULL, 160, cfg.vocab_size, 3 + i);
        double worst = mc_decode_vs_forward(m, tok, 2, 80, 50, 60, 5, cfg.logit_cap, name, NULL);
        double tol = mc_families(&cfg, NULL) & MC_FAM_MLSTM ? 4e-2 : 2e-2;
        test_note("%-*s decoded logits vs one forward on the GPU: worst rel err %.2e (tolerance %g)", W, name, worst, tol);
        CHECK(worst <= tol, "%s: decoded logits differ by %.3g (tolerance %g)", name, worst, tol);
        model_free(m);
    }
}
