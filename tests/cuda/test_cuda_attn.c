// Softmax attention on the GPU (src/cuda/attn_cuda.cu: the backend's attn_fwd, attn_bwd,
// attn_decode, rope) against the float64 reference (src/ref/attn_ref.c), through the op table. The
// GPU holds q, k, v, o, dout, dq, dk, dv in bf16 and lse in float32: the inputs are rounded to
// bf16 before the reference sees them, and the reference backward takes the GPU's o (as the
// model's backward does), so the two differ only by the GPU's arithmetic and output rounding.
//
// Tolerances (relative, L2 over the tensor):
//   o:   the bf16 rounding of o itself, at most 2^-9 = 2e-3 of each element (~1.1e-3 in L2), plus
//        P rounded to bf16 for the P V product (another 2^-9 relative on each term; the terms'
//        errors average out over the row, adding ~1e-3 at most). Scores are exact products of
//        bf16 summed in fp32 (~1e-6). Measured in the emulator: 1.8e-3 .. 2.0e-3. ATTN_TOL = 1e-2.
//   dq, dk, dv: the same two roundings (P, dS to bf16 for the tensor-core products, the outputs to
//        bf16), and dS = P (dP - Delta) subtracts nearly equal numbers where P is large: measured
//        2.1e-3 .. 2.5e-3 in the emulator. GRAD_TOL = 1.5e-2 (6x).
//   lse: float32 from exact scores: absolute error ~1e-6 of the largest logit; LSE_TOL 1e-3 x the
//        logit multiplier (absolute).
//   A wrong index, lane mapping or mask shows up as O(0.1 .. 1).
// A gradient that is 0 in exact arithmetic (window 1: the only weight is P = 1, dS = 0) has its
// reference norm floored at an RMS of 1e-3 (so an absolute RMS error of 1.5e-5 passes).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "core/backend.h"
#include "core/common.h"
#include "core/half.h"
#include "cuda/attn_cudnn.h"
#include "../fd.h"
#include "model/model.h"
#include "model/presets.h"
#include "ref/ref.h"
#include "../test.h"

#define ATTN_TOL 1e-2
#define GRAD_TOL 1.5e-2
#define LSE_TOL 1e-3

static const Backend *G;

static int setup(void) {
    G = backend_cuda();
    if (!G) test_fail(__FILE__, __LINE__, "no CUDA backend: %s", mn_last_error());
    if (G && (!G->attn->fwd || !G->attn->bwd || !G->attn->decode || !G->attn->rope)) {
        test_fail(__FILE__, __LINE__, "the CUDA backend has no attn_fwd / attn_bwd / attn_decode / rope");
        return 0;
    }
    return G != NULL;
}

// n random numbers in [-a, a], rounded to bf16
static double *rand_bf16(unsigned long long seed, size_t n, double a) {
    double *x = rand_doubles(seed, n ? n : 1, -a, a);
    for (size_t i = 0; i < n; i++) x[i] = bf16_to_f32(f32_to_bf16((float)x[i]));
    return x;
}

static void *to_gpu(const double *h, size_t n, MemKind k) {
    void *p = G->alloc(G, n, k);
    if (!p || G->upload(G, p, h, n, k)) die("%s", mn_last_error());
    return p;
}

// n elements of junk (large values): an output element never written shows
static void *gpu_junk(size_t n, MemKind k) {
    double *j = rand_doubles(77, n ? n : 1, 1e3, 2e3);
    void *p = to_gpu(j, n, k);
    free(j);
    return p;
}

static double *from_gpu(const void *p, size_t n, MemKind k) {
    double *h = xcalloc(n ? n : 1, sizeof(double));
    if (G->download(G, h, p, n, k)) die("%s", mn_last_error());
    return h;
}

// relative L2 error, the reference's norm floored at an RMS of 1e-3 (see the header)
static double rel_floor(const double *a, const double *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = a[i] - b[i];
        if (!isfinite(d)) return INFINITY;
        num += d * d;
        den += b[i] * b[i];
    }
    return sqrt(num) / fmax(sqrt(den), 1e-3 * sqrt((double)n));
}

static void cmp(const char *tag, const char *what, const double *gpu, const double *ref, size_t n, double tol) {
    double e = rel_floor(gpu, ref, n);
    test_note("%-40s %-4s rel err %.2e", tag, what, e);
    if (!(e <= tol)) test_fail(__FILE__, __LINE__, "%s %s: rel err %.3g > %.3g", tag, what, e, tol);
}

typedef struct {
    int B, T, H, Hkv, D, window;
    double mult;  // the scale is mult D^-1/2: 8 for large logits
} Shape;

// MESANET_ATTN for the next attn_fwd / attn_bwd (attn_cudnn.cu reads it on every call); NULL unsets it
static void set_path(const char *sel) {
    if (sel)
        setenv("MESANET_ATTN", sel, 1);
    else
        unsetenv("MESANET_ATTN");
}

// A refusal by cuDNN under MESANET_ATTN=cudnn (the message attn_cudnn.cu writes)
static int cudnn_refused(int rc) { return rc == MN_ERR_UNSUPPORTED && strstr(mn_last_error(), "cuDNN refused"); }

// fwd_sel, bwd_sel: MESANET_ATTN for the forward and the backward ("own", "cudnn"; NULL: as it is),
// and the path each must take then. A shape cuDNN refuses under "cudnn" is noted and counted in
// *refused (when refused is not NULL) instead of failing.
static void run_case_on(const Shape *s, unsigned long long seed, const char *fwd_sel, const char *bwd_sel, int *refused) {
    AttnDims d = {s->B, s->T, s->H, s->Hkv, s->D, s->window, (float)(s->mult / sqrt((double)s->D))};
    size_t nq = (size_t)s->B * s->T * s->H * s->D, nk = (size_t)s->B * s->T * s->Hkv * s->D;
    size_t rows = (size_t)s->B * s->T * s->H;
    char tag[96];
    snprintf(tag, sizeof tag, "B%d T%d H%d Hkv%d D%d w%d x%g", s->B, s->T, s->H, s->Hkv, s->D, s->window, s->mult);
    double *q = rand_bf16(seed, nq, 1), *k = rand_bf16(seed + 1, nk, 1), *v = rand_bf16(seed + 2, nk, 1);
    double *dout = rand_bf16(seed + 3, nq, 1);
    double *o = xcalloc(nq, 8), *lse = xcalloc(rows, 8), *dq = xcalloc(nq, 8), *dk = xcalloc(nk, 8), *dv = xcalloc(nk, 8);
    AttnFwd rf = {q, k, v, o, lse};
    CHECK(!ref_attn_fwd(NULL, &d, &rf), "%s", mn_last_error());
    void *gq = to_gpu(q, nq, MEM_ACT), *gk = to_gpu(k, nk, MEM_ACT), *gv = to_gpu(v, nk, MEM_ACT);
    void *gdout = to_gpu(dout, nq, MEM_ACT), *go = gpu_junk(nq, MEM_ACT), *glse = gpu_junk(rows, MEM_F32);
    void *gdq = gpu_junk(nq, MEM_ACT), *gdk = gpu_junk(nk, MEM_ACT), *gdv = gpu_junk(nk, MEM_ACT);
    AttnFwd f = {gq, gk, gv, go, glse};
    if (fwd_sel) set_path(fwd_sel);
    int rc = G->attn->fwd(G, &d, &f);
    const char *fwd_path = cuda_attn_path();
    if (!rc) rc = G->sync(G);
    if (refused && cudnn_refused(rc)) {
        test_note("%-40s fwd refused: %s", tag, mn_last_error());
        ++*refused;
    } else {
        CHECK(!rc, "%s: %s", tag, mn_last_error());
        if (!rc && fwd_sel) CHECK(!strcmp(fwd_path, fwd_sel), "%s: the forward ran %s, not %s", tag, fwd_path, fwd_sel);
    }
    if (!rc) {
        double *ho = from_gpu(go, nq, MEM_ACT), *hl = from_gpu(glse, rows, MEM_F32);
        cmp(tag, "o", ho, o, nq, ATTN_TOL);
        double worst = 0;
        for (size_t i = 0; i < rows; i++) worst = fmax(worst, isfinite(hl[i]) ? fabs(hl[i] - lse[i]) : INFINITY);
        test_note("%-40s lse max abs err %.2e", tag, worst);
        CHECK(worst <= LSE_TOL * s->mult, "%s lse: max abs err %.3g > %.3g", tag, worst, LSE_TOL * s->mult);
        // the backward from the GPU's o, as the model runs it
        AttnBwd rb = {q, k, v, ho, NULL, dout, dq, dk, dv};
        CHECK(!ref_attn_bwd(NULL, &d, &rb), "%s", mn_last_error());
        AttnBwd b = {gq, gk, gv, go, glse, gdout, gdq, gdk, gdv};
        if (bwd_sel) set_path(bwd_sel);
        rc = G->attn->bwd(G, &d, &b);
        const char *bwd_path = cuda_attn_path();
        if (!rc) rc = G->sync(G);
        if (refused && cudnn_refused(rc)) {
            test_note("%-40s bwd refused: %s", tag, mn_last_error());
            ++*refused;
        } else {
            CHECK(!rc, "%s: %s", tag, mn_last_error());
            if (!rc && bwd_sel) CHECK(!strcmp(bwd_path, bwd_sel), "%s: the backward ran %s, not %s", tag, bwd_path, bwd_sel);
        }
        if (!rc) test_note("%-40s paths: fwd %s, bwd %s", tag, fwd_path, bwd_path);
        if (!rc) {
            double *hq = from_gpu(gdq, nq, MEM_ACT), *hk = from_gpu(gdk, nk, MEM_ACT), *hv = from_gpu(gdv, nk, MEM_ACT);
            cmp(tag, "dq", hq, dq, nq, GRAD_TOL);
            cmp(tag, "dk", hk, dk, nk, GRAD_TOL);
            cmp(tag, "dv", hv, dv, nk, GRAD_TOL);
            free(hq); free(hk); free(hv);
        }
        free(ho); free(hl);
    }
    void *bufs[] = {gq, gk, gv, gdout, go, glse, gdq, gdk, gdv};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) G->free(G, bufs[i]);
    free(q); free(k); free(v); free(dout); free(o); free(lse); free(dq); free(dk); free(dv);
}

static void run_case(const Shape *s, unsigned long long seed) { run_case_on(s, seed, NULL, NULL, NULL); }

// T against the tiles (128 query rows forward, 64 keys; 64 and 64 backward): under one, past one,
// T = 1; windows 1, < T, > T; grouped heads; D = 64, 128 and padded ones (40, 96, 8); long T with
// large logits (scale x 8).
static const Shape attn_shapes[] = {
    {1, 37, 2, 1, 64, 0, 1},     // T < a tile, GQA 2:1
    {2, 130, 2, 2, 40, 0, 1},    // T just past a 128-row tile, D 40 padded to 64
    {3, 1, 2, 2, 64, 0, 1},      // T = 1
    {1, 100, 4, 2, 64, 1, 1},    // window 1, GQA
    {1, 300, 4, 1, 128, 50, 1},  // window < T, D 128, GQA 4:1
    {1, 20, 2, 2, 96, 64, 1},    // window > T, D 96 padded to 128
    {2, 1000, 2, 2, 128, 0, 8},  // long T, large logits
    {1, 1000, 4, 2, 64, 300, 8}, // long T in a window, large logits
    {1, 200, 3, 3, 8, 0, 1},     // the smallest head
    {2, 257, 8, 2, 128, 128, 1}, // the window a tile exactly
};
#define N_ATTN_SHAPES (sizeof attn_shapes / sizeof attn_shapes[0])

// The default selection: cuDNN where it is built in and takes the shape, our kernels otherwise.
TEST(cuda_attn_matches_reference) {
    if (!setup()) return;
    const char *saved = getenv("MESANET_ATTN");
    char keep[64];
    snprintf(keep, sizeof keep, "%s", saved ? saved : "");
    set_path(NULL);
    for (size_t i = 0; i < N_ATTN_SHAPES; i++) run_case(&attn_shapes[i], 5000 + 16 * i);
    set_path(saved ? keep : NULL);
}

// Each path on its own against the reference: MESANET_ATTN=own (our kernels), MESANET_ATTN=cudnn
// (cuDNN's fused attention, forward and backward; skipped in builds without cuDNN), and the two
// mixed (cuDNN's forward, our backward from its lse, and the other way round: the lse conventions
// agree). cuDNN may refuse some shapes (noted); it must take the common ones: D 64 or 128 with
// T >= 64.
TEST(cuda_attn_paths_match_reference) {
    if (!setup()) return;
    const char *saved = getenv("MESANET_ATTN");
    char keep[64];
    snprintf(keep, sizeof keep, "%s", saved ? saved : "");
    for (size_t i = 0; i < N_ATTN_SHAPES; i++) run_case_on(&attn_shapes[i], 5000 + 16 * i, "own", "own", NULL);
    int ver = cuda_attn_cudnn_version();
    if (!ver) {
        test_note("no cuDNN in this build: the cudnn path is skipped");
    } else {
        test_note("cuDNN %d.%d.%d", ver / 10000, ver / 100 % 100, ver % 100);
        for (int mix = 0; mix < 3; mix++) {
            static const char *sel[3][2] = {{"cudnn", "cudnn"}, {"cudnn", "own"}, {"own", "cudnn"}};
            for (size_t i = 0; i < N_ATTN_SHAPES; i++) {
                const Shape *s = &attn_shapes[i];
                int refused = 0;
                run_case_on(s, 5000 + 16 * i, sel[mix][0], sel[mix][1], &refused);
                CHECK(!refused || !(s->D % 64 == 0 && s->T >= 64), "cuDNN refused B%d T%d H%d Hkv%d D%d w%d", s->B,
                      s->T, s->H, s->Hkv, s->D, s->window);
            }
        }
    }
    // an unknown selection is an error
    set_path("fast");
    AttnDims d = {1, 4, 1, 1, 64, 0, 0.125f};
    void *x = G->alloc(G, 4 * 64, MEM_ACT), *l = G->alloc(G, 4, MEM_F32);
    AttnFwd f = {x, x, x, x, l};
    int rc = G->attn->fwd(G, &d, &f);
    CHECK(rc == MN_ERR_ARG && strstr(mn_last_error(), "MESANET_ATTN"), "MESANET_ATTN=fast: rc %d: %s", rc,
          mn_last_error());
    G->free(G, x);
    G->free(G, l);
    set_path(saved ? keep : NULL);
}

typedef struct {
    int B, H, Hkv, D, n, cap;
} DecShape;

TEST(cuda_attn_decode_matches_reference) {
    if (!setup()) return;
    static const DecShape shapes[] = {
        {1, 16, 16, 128, 2048, 4096}, // B = 1, a long cache: many chunks
        {2, 4, 2, 64, 150, 160},      // GQA, n < cap
        {1, 2, 1, 128, 1, 4},         // one slot
        {16, 8, 2, 40, 700, 1024},    // D 40
        {128, 4, 4, 64, 33, 64},      // many sequences, one chunk each
        {1, 4, 1, 96, 8191, 8192},    // the longest
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const DecShape *s = &shapes[i];
        AttnDims d = {s->B, 1, s->H, s->Hkv, s->D, 0, (float)(2 / sqrt((double)s->D))};
        size_t nq = (size_t)s->B * s->H * s->D, nc = (size_t)s->B * s->cap * s->Hkv * s->D;
        double *q = rand_bf16(600 + i, nq, 1), *kc = rand_bf16(700 + i, nc, 1), *vc = rand_bf16(800 + i, nc, 1);
        double *o = xcalloc(nq, 8);
        CHECK(!ref_attn_decode(NULL, &d, s->n, s->cap, q, kc, vc, o), "%s", mn_last_error());
        void *gq = to_gpu(q, nq, MEM_ACT), *gk = to_gpu(kc, nc, MEM_ACT), *gv = to_gpu(vc, nc, MEM_ACT);
        void *go = gpu_junk(nq, MEM_ACT);
        int rc = G->attn->decode(G, &d, s->n, s->cap, gq, gk, gv, go);
        if (!rc) rc = G->sync(G);
        char tag[96];
        snprintf(tag, sizeof tag, "decode B%d H%d Hkv%d D%d n%d cap%d", s->B, s->H, s->Hkv, s->D, s->n, s->cap);
        CHECK(!rc, "%s: %s", tag, mn_last_error());
        if (!rc) {
            double *h = from_gpu(go, nq, MEM_ACT);
            cmp(tag, "o", h, o, nq, ATTN_TOL);
            free(h);
        }
        G->free(G, gq); G->free(G, gk); G->free(G, gv); G->free(G, go);
        free(q); free(kc); free(vc); free(o);
    }
}

// RoPE both ways against the reference (positions up to ~1e5: the angle is computed in double on
// both), and the inverse undoing the forward (to bf16 rounding: two roundings, ~3e-3).
TEST(cuda_rope_matches_reference) {
    if (!setup()) return;
    // N, H, D, rot (rot < D: partial rotary, RecurrentGemma's first half of each head)
    static const int shapes[][4] = {{5, 3, 40, 40}, {64, 4, 128, 128}, {1, 1, 2, 2}, {33, 2, 96, 96},
                                    {17, 3, 40, 20}, {9, 2, 128, 64}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        int N = shapes[i][0], H = shapes[i][1], D = shapes[i][2], rot = shapes[i][3];
        size_t n = (size_t)N * H * D;
        int32_t *pos = xcalloc((size_t)N, sizeof(int32_t));
        for (int t = 0; t < N; t++) pos[t] = t * 37 + (int)(i * 31337 % 100000);
        void *gpos = G->alloc(G, (size_t)N, MEM_I32);
        CHECK(gpos && !G->upload_i32(G, gpos, pos, (size_t)N), "%s", mn_last_error());
        for (int inverse = 0; inverse < 2; inverse++) {
            double *x = rand_bf16(900 + i, n, 1), *r = xcalloc(n, 8);
            memcpy(r, x, n * 8);
            CHECK(!ref_rope(NULL, r, pos, N, H, D, rot, 10000.0f, inverse), "%s", mn_last_error());
            void *gx = to_gpu(x, n, MEM_ACT);
            int rc = G->attn->rope(G, gx, gpos, N, H, D, rot, 10000.0f, inverse);
            if (!rc) rc = G->sync(G);
            char tag[64];
            snprintf(tag, sizeof tag, "rope N%d H%d D%d rot %d inverse %d", N, H, D, rot, inverse);
            CHECK(!rc, "%s: %s", tag, mn_last_error());
            double *h = from_gpu(gx, n, MEM_ACT);
            cmp(tag, "x", h, r, n, 6e-3);
            if (!inverse) {  // back again
                rc = G->attn->rope(G, gx, gpos, N, H, D, rot, 10000.0f, 1);
                if (!rc) rc = G->sync(G);
                CHECK(!rc, "%s: %s", tag, mn_last_error());
                double *back = from_gpu(gx, n, MEM_ACT);
                cmp(tag, "back", back, x, n, 6e-3);
                free(back);
            }
            G->free(G, gx);
            free(x); free(r); free(h);
        }
        G->free(G, gpos);
        free(pos);
    }
}

// Head sizes the kernels are not built for are refused by name.
TEST(cuda_attn_refuses) {
    if (!setup()) return;
    static const int Ds[] = {36, 136, 256};
    for (size_t i = 0; i < sizeof Ds / sizeof Ds[0]; i++) {
        AttnDims d = {1, 4, 1, 1, Ds[i], 0, 0.1f};
        size_t n = (size_t)4 * Ds[i];
        void *x = G->alloc(G, n, MEM_ACT), *l = G->alloc(G, 4, MEM_F32);
        AttnFwd f = {x, x, x, x, l};
        int rc = G->attn->fwd(G, &d, &f);
        CHECK(rc == MN_ERR_UNSUPPORTED, "D = %d: attn_fwd returned %d, not MN_ERR_UNSUPPORTED", Ds[i], rc);
        char want[32];
        snprintf(want, sizeof want, "D = %d", Ds[i]);
        CHECK(strstr(mn_last_error(), want), "D = %d: the error does not name the size: %s", Ds[i], mn_last_error());
        rc = G->attn->decode(G, &d, 1, 4, x, x, x, x);
        CHECK(rc == MN_ERR_UNSUPPORTED, "D = %d: attn_decode returned %d", Ds[i], rc);
        G->free(G, x);
        G->free(G, l);
    }
}

// A model of mha and swa blocks on the GPU: decoding (a prefill of 50 tokens, then one at a time)
// against one forward. The model does not record attention's steps into CUDA graphs (no_graph):
// this checks that the step, eager, gives the forward's logits.
TEST(cuda_attn_model_decode_matches_forward) {
    if (!setup()) return;
    ModelConfig cfg;
    config_preset(&cfg, "tiny");
    cfg.vocab_size = 97;
    cfg.dim = 128;
    cfg.n_heads = 2;
    cfg.head_dim = 64;
    cfg.n_kv_heads = 1;
    cfg.mlp_hidden = 96;
    cfg.window = 24;
    cfg.n_layers = 2;
    snprintf(cfg.mixer, sizeof cfg.mixer, "mha,swa");
    Model *m;
    if (model_create(&m, &cfg, G)) {
        test_fail(__FILE__, __LINE__, "%s", mn_last_error());
        return;
    }
    CHECK(!m->use_graphs, "a model with attention layers records its decoding steps into graphs");
    model_init_params(m, 2);
    int B = 2, T = 80, V = cfg.vocab_size;
    int32_t tok[160], buf[160];
    for (int i = 0; i < B * T; i++) tok[i] = (i * 37 + 11) % V;
    CHECK(!model_forward(m, tok, NULL, B, T, 0, NULL), "%s", mn_last_error());
    float *full = xcalloc((size_t)B * T * V, 4), *step = xcalloc((size_t)B * V, 4);
    G->download_f32(G, full, m->logits, (size_t)B * T * V, MEM_ACT);
    if (cfg.logit_cap > 0)
        for (size_t i = 0; i < (size_t)B * T * V; i++) full[i] = cfg.logit_cap * tanhf(full[i] / cfg.logit_cap);
    CHECK(!model_reset_state(m, B), "%s", mn_last_error());
    double worst = 0;
    for (int t0 = 0; t0 < T;) {
        int n = t0 == 0 ? 50 : 1;
        for (int b = 0; b < B; b++) memcpy(buf + b * n, tok + b * T + t0, sizeof(int32_t) * n);
        CHECK(!model_decode(m, buf, B, n, step), "%s", mn_last_error());
        t0 += n;
        for (int b = 0; b < B; b++)
            worst = fmax(worst, rel_err_ff(step + (size_t)b * V, full + ((size_t)b * T + t0 - 1) * V, V));
    }
    test_note("decoding vs one forward: worst rel err %.2e", worst);
    CHECK(worst <= 2e-2, "decoded logits differ by %.3g", worst);  // two bf16 paths
    free(full); free(step);
    model_free(m);
}
