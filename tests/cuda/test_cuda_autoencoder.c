// The autoencoder head on the GPU (build/run_tests_cuda): its ops (GELU, the last-position pooling
// with the sin-cos embedding) against the float64 reference on bf16-rounded inputs, and a whole
// autoencoder model (gdn blocks) against the CPU's. Not yet run on a GPU: the bounds are those of
// test_cuda.c's ops (bf16 rounding, 4e-3) and model (loss 5e-3, gradient cosine 0.99).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "core/backend.h"
#include "core/common.h"
#include "core/half.h"
#include "../fd.h"
#include "model/model.h"
#include "../test.h"

// bf16 outputs: up to 2^-9 relative per element, ~1.2e-3 in the L2 sense (test_cuda.c).
#define BF16_TOL 4e-3

static const Backend *G, *R;

static int setup(void) {
    R = backend_ref();
    G = backend_cuda();
    if (!G) test_fail(__FILE__, __LINE__, "no CUDA backend: %s", mn_last_error());
    return G != NULL;
}

static double *input_bf16(uint64_t seed, size_t n, double lo, double hi) {
    double *x = rand_doubles(seed, n, lo, hi);
    for (size_t i = 0; i < n; i++) x[i] = bf16_to_f32(f32_to_bf16((float)x[i]));
    return x;
}

static void *to_gpu(const double *h, size_t n) {
    void *p = G->alloc(G, n, MEM_ACT);
    if (!p || G->upload(G, p, h, n, MEM_ACT)) die("%s", mn_last_error());
    return p;
}

static void cmp(const char *what, const void *gpu, const double *ref, size_t n) {
    double *h = xcalloc(n, sizeof(double));
    if (G->download(G, h, gpu, n, MEM_ACT)) die("%s", mn_last_error());
    double e = rel_err64(h, ref, n);
    test_note("%-26s cuda vs float64: rel err %.2e", what, e);
    if (!(e <= BF16_TOL)) test_fail(__FILE__, __LINE__, "%s: rel err %.3g > %.3g", what, e, BF16_TOL);
    free(h);
}

TEST(cuda_op_gelu_pool_last) {
    if (!setup()) return;
    size_t n = 1003;  // pieces of 8 and a tail of 3
    double *x = input_bf16(80, n, -5, 5), *dy = input_bf16(81, n, -1, 1), *y = xcalloc(n, 8), *dx = xcalloc(n, 8);
    R->gelu_fwd(R, y, x, n);
    R->gelu_bwd(R, dx, dy, x, n);
    void *gx = to_gpu(x, n), *gdy = to_gpu(dy, n), *gy = G->alloc(G, n, MEM_ACT);
    CHECK(!G->gelu_fwd(G, gy, gx, n) && !G->gelu_bwd(G, gdy, gdy, gx, n), "%s", mn_last_error());  // dx in place
    cmp("gelu y", gy, y, n);
    cmp("gelu dx (in place)", gdy, dx, n);
    G->free(G, gx), G->free(G, gdy), G->free(G, gy);
    free(x), free(dy), free(y), free(dx);
    const int dims[2][3] = {{3, 37, 40}, {2, 5, 13}};  // B, T, D: an odd D's zero column
    for (int k = 0; k < 2; k++) {
        int B = dims[k][0], T = dims[k][1], D = dims[k][2];
        size_t m = (size_t)B * T * D;
        double *a = input_bf16(82 + k, m, -2, 2), *dz = input_bf16(84 + k, m, -1, 1);
        double *z = xcalloc(m, 8), *da = xcalloc(m, 8);
        R->pool_last_fwd(R, z, a, B, T, D);
        R->pool_last_bwd(R, da, dz, B, T, D);
        void *ga = to_gpu(a, m), *gdz = to_gpu(dz, m), *gz = G->alloc(G, m, MEM_ACT), *gda = to_gpu(dz, m);
        CHECK(!G->pool_last_fwd(G, gz, ga, B, T, D) && !G->pool_last_bwd(G, gda, gdz, B, T, D), "%s", mn_last_error());
        cmp("pool_last z", gz, z, m);
        cmp("pool_last dx", gda, da, m);
        G->free(G, ga), G->free(G, gdz), G->free(G, gz), G->free(G, gda);
        free(a), free(dz), free(z), free(da);
    }
}

// An autoencoder model (2 gdn blocks) on the GPU and on the CPU from the same initialisation, on
// MAD compression sequences: the loss and the gradients (bf16 activations on the GPU).
TEST(cuda_autoencoder_matches_cpu) {
    if (!setup()) return;
    ModelConfig cfg;
    config_default(&cfg);
    snprintf(cfg.mixer, sizeof cfg.mixer, "gdn");
    snprintf(cfg.head, sizeof cfg.head, "autoencoder");
    cfg.tie_embeddings = 0, cfg.logit_cap = 0, cfg.embed_scale = 0;
    cfg.vocab_size = 16, cfg.dim = 64, cfg.n_layers = 2, cfg.n_heads = 2, cfg.head_dim = 32, cfg.mlp_hidden = 96;
    cfg.seq_len = 32, cfg.gate_bound = 32;
    Model *mc = NULL, *mg = NULL;  // (clang: set only where the first create succeeds)
    CHECK(!model_create(&mc, &cfg, backend_cpu()) && !model_create(&mg, &cfg, G), "%s", mn_last_error());
    model_init_params(mc, 5);
    model_init_params(mg, 5);
    int B = 4, T = 32;
    size_t N = (size_t)B * T;
    int32_t *tok = xcalloc(N, 4);
    MnRng r;
    mn_rng_seed(&r, 12);
    for (size_t i = 0; i < N; i++) tok[i] = (int)(i % T) == T - 1 ? 15 : (int32_t)(mn_rng_u64(&r) % 15);
    double lc, lg;
    model_zero_grad(mc);
    model_zero_grad(mg);
    CHECK(!model_forward(mc, tok, tok, B, T, 1.0f / N, &lc) && !model_backward(mc), "%s", mn_last_error());
    CHECK(!model_forward(mg, tok, tok, B, T, 1.0f / N, &lg) && !model_backward(mg), "%s", mn_last_error());
    test_note("loss: cpu %.5f cuda %.5f", lc / N, lg / N);
    CHECK(fabs(lc - lg) <= 5e-3 * fabs(lc), "loss %g (cuda) vs %g (cpu)", lg / N, lc / N);
    double *gc = xcalloc(mc->total, 8), *gg = xcalloc(mg->total, 8);
    mc->be->download(mc->be, gc, mc->grads, mc->total, MEM_F32);
    mg->be->download(mg->be, gg, mg->grads, mg->total, MEM_F32);
    double e = rel_err64(gg, gc, mc->total), dot = 0, n1 = 0, n2 = 0;
    for (size_t i = 0; i < mc->total; i++) dot += gg[i] * gc[i], n1 += gg[i] * gg[i], n2 += gc[i] * gc[i];
    test_note("gradients: cuda vs cpu rel err %.2e, cosine %.4f (bf16 activations)", e, dot / sqrt(n1 * n2));
    CHECK(e <= 0.15 && dot / sqrt(n1 * n2) >= 0.99, "gradients differ: rel err %.3g, cosine %.4f", e, dot / sqrt(n1 * n2));
    free(gc), free(gg), free(tok);
    model_free(mc);
    model_free(mg);
}
