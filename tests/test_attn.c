// The attention family (causal / sliding-window softmax attention with grouped
// key/value heads, decoding over a key/value cache, rotary embeddings): the
// float64 reference against hand-computed numbers and finite differences, the
// float32 CPU cores against the reference.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "core/backend.h"
#include "core/common.h"
#include "fd.h"
#include "ref/ref.h"
#include "test.h"

// Every input rounded to float, so that the backends see the same numbers.
static void round_f32(double *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = (float)x[i];
}

typedef struct {
    AttnDims d;
    size_t nq, nkv, nrow;
    double *q, *k, *v, *dout;
} AttnCase;

static AttnCase attn_case(int B, int T, int H, int Hkv, int D, int window, double qk_mag, unsigned long long seed) {
    AttnCase c = {{B, T, H, Hkv, D, window, (float)(1 / sqrt(D))}, 0, 0, 0, NULL, NULL, NULL, NULL};
    c.nrow = (size_t)B * T * H;
    c.nq = c.nrow * D;
    c.nkv = (size_t)B * T * Hkv * D;
    c.q = rand_doubles(seed, c.nq, -qk_mag, qk_mag);
    c.k = rand_doubles(seed + 1, c.nkv, -qk_mag, qk_mag);
    c.v = rand_doubles(seed + 2, c.nkv, -1, 1);
    c.dout = rand_doubles(seed + 3, c.nq, -1, 1);
    round_f32(c.q, c.nq); round_f32(c.k, c.nkv); round_f32(c.v, c.nkv); round_f32(c.dout, c.nq);
    return c;
}

static void attn_case_free(AttnCase *c) { free(c->q); free(c->k); free(c->v); free(c->dout); }

// Results of one backend, downloaded to double.
typedef struct {
    double *o, *lse, *dq, *dk, *dv;
} AttnOut;

static void attn_out_free(AttnOut *r) { free(r->o); free(r->lse); free(r->dq); free(r->dk); free(r->dv); }

static void *up(const Backend *be, const double *x, size_t n, MemKind kind) {
    void *p = be->alloc(be, n, kind);
    if (x) CHECK(!be->upload(be, p, x, n, kind), "%s", mn_last_error());
    return p;
}

static double *down(const Backend *be, const void *p, size_t n, MemKind kind) {
    double *x = xcalloc(n, sizeof(double));
    CHECK(!be->download(be, x, p, n, kind), "%s", mn_last_error());
    return x;
}

// Forward and (with bwd) backward of c on be.
static AttnOut attn_run(const Backend *be, const AttnCase *c, int bwd) {
    AttnOut r = {0};
    void *q = up(be, c->q, c->nq, MEM_ACT), *k = up(be, c->k, c->nkv, MEM_ACT), *v = up(be, c->v, c->nkv, MEM_ACT);
    void *o = up(be, NULL, c->nq, MEM_ACT), *lse = up(be, NULL, c->nrow, MEM_F32);
    AttnFwd f = {q, k, v, o, lse};
    CHECK(!be->attn->fwd(be, &c->d, &f), "%s attn_fwd: %s", be->name, mn_last_error());
    r.o = down(be, o, c->nq, MEM_ACT);
    r.lse = down(be, lse, c->nrow, MEM_F32);
    if (bwd) {
        void *dout = up(be, c->dout, c->nq, MEM_ACT), *dq = up(be, NULL, c->nq, MEM_ACT);
        void *dk = up(be, NULL, c->nkv, MEM_ACT), *dv = up(be, NULL, c->nkv, MEM_ACT);
        AttnBwd b = {q, k, v, o, lse, dout, dq, dk, dv};
        CHECK(!be->attn->bwd(be, &c->d, &b), "%s attn_bwd: %s", be->name, mn_last_error());
        r.dq = down(be, dq, c->nq, MEM_ACT);
        r.dk = down(be, dk, c->nkv, MEM_ACT);
        r.dv = down(be, dv, c->nkv, MEM_ACT);
        be->free(be, dout); be->free(be, dq); be->free(be, dk); be->free(be, dv);
    }
    be->free(be, q); be->free(be, k); be->free(be, v); be->free(be, o); be->free(be, lse);
    return r;
}

TEST(attn_ref_hand_case) {
    // T = 3, D = 2, scale 1. Scores are 0 or log 2 / log 3, so the softmax weights are quarters
    // and thirds: t = 0 sees k0 alone: o = v0, lse = q0.k0 = 0; t = 1: scores (0, log 3), p =
    // (1/4, 3/4), lse = log 4; t = 2: scores (0, 0, log 2), p = (1/4, 1/4, 1/2), lse = log 4;
    // window 2 at t = 2: scores (0, log 2), p = (1/3, 2/3), lse = log 3.
    double q[] = {1, 1, 1, 0, 0, 1}, k[] = {0, 0, log(3), 0, 0, log(2)}, v[] = {1, 0, 0, 1, 2, 2};
    double o[6], lse[3];
    const Backend *be = backend_ref();
    AttnDims d = {1, 3, 1, 1, 2, 0, 1.0f};
    AttnFwd f = {q, k, v, o, lse};
    CHECK(!be->attn->fwd(be, &d, &f), "%s", mn_last_error());
    double wo[] = {1, 0, 0.25, 0.75, 1.25, 1.25}, wl[] = {0, log(4), log(4)};
    CHECK_REL("o (full)", rel_err64(o, wo, 6), 1e-15);
    CHECK_REL("lse (full)", rel_err64(lse, wl, 3), 1e-15);
    d.window = 2;
    CHECK(!be->attn->fwd(be, &d, &f), "%s", mn_last_error());
    double wo2[] = {1, 0, 0.25, 0.75, 4.0 / 3, 5.0 / 3}, wl2[] = {0, log(4), log(3)};
    CHECK_REL("o (window 2)", rel_err64(o, wo2, 6), 1e-15);
    CHECK_REL("lse (window 2)", rel_err64(lse, wl2, 3), 1e-15);
    d.window = 0;
    d.T = 0;
    CHECK(be->attn->fwd(be, &d, &f) == MN_ERR_ARG, "T = 0 accepted");
    d.T = 3, d.Hkv = 2;
    CHECK(be->attn->fwd(be, &d, &f) == MN_ERR_ARG, "Hkv not dividing H accepted");
    CHECK(backend_cpu()->attn->fwd(backend_cpu(), &d, &f) == MN_ERR_ARG, "cpu: Hkv not dividing H accepted");
}

// L = sum(o dout) on the reference, for finite differences.
static const AttnCase *fd_case;
static double attn_loss(void *ctx) {
    const AttnCase *c = fd_case;
    double *o = xcalloc(c->nq, 8);
    AttnFwd f = {c->q, c->k, c->v, o, NULL};
    backend_ref()->attn->fwd(backend_ref(), &c->d, &f);
    double L = 0;
    for (size_t i = 0; i < c->nq; i++) L += o[i] * c->dout[i];
    free(o);
    return L;
}

TEST(attn_ref_grad_fd) {
    // Central differences in float64 with step 1e-6: truncation ~h^2 = 1e-12, rounding
    // ~1e-16 / 1e-6 = 1e-10 of |L| ~ 1; the gradients are O(1), so 1e-7 relative is far above
    // both and far below any real error (a dropped term is O(1e-1)).
    int wins[] = {0, 3};
    for (int wi = 0; wi < 2; wi++) {
        AttnCase c = attn_case(2, 5, 4, 2, 3, wins[wi], 1.5, 100 + wi);
        c.d.scale = 0.7f;
        AttnOut r = attn_run(backend_ref(), &c, 1);
        fd_case = &c;
        fd_check(wi ? "attn window 3: dq" : "attn full: dq", attn_loss, NULL, c.q, r.dq, c.nq, 1e-7);
        fd_check(wi ? "attn window 3: dk" : "attn full: dk", attn_loss, NULL, c.k, r.dk, c.nkv, 1e-7);
        fd_check(wi ? "attn window 3: dv" : "attn full: dv", attn_loss, NULL, c.v, r.dv, c.nkv, 1e-7);
        attn_out_free(&r);
        attn_case_free(&c);
    }
}

// ||a - b|| / max(||b||, 0.1 ||dout||): relative, except where the true gradient vanishes (T = 1 or
// window 1: dq = dk = 0, as dS = P (dO.v - dO.o) = 0), where float rounding leaves ~1e-8 of noise
// that is then measured against the size of the incoming gradient.
static double grad_err(const double *a, const double *b, size_t n, const AttnCase *c) {
    double e = 0, nb = 0, nd = 0;
    for (size_t i = 0; i < n; i++) e += (a[i] - b[i]) * (a[i] - b[i]), nb += b[i] * b[i];
    for (size_t i = 0; i < c->nq; i++) nd += c->dout[i] * c->dout[i];
    nb = fmax(sqrt(nb), 0.1 * sqrt(nd));
    return sqrt(e) / nb;
}

static void cpu_vs_ref(const char *what, AttnCase *c, int bwd, double tol) {
    AttnOut r = attn_run(backend_ref(), c, bwd), g = attn_run(backend_cpu(), c, bwd);
    double e[5] = {rel_err64(g.o, r.o, c->nq), rel_err64(g.lse, r.lse, c->nrow), 0, 0, 0};
    for (size_t i = 0; i < c->nq; i++)
        if (!isfinite(g.o[i])) {
            test_fail(__FILE__, __LINE__, "%s: o[%zu] = %g", what, i, g.o[i]);
            break;
        }
    if (bwd) {
        e[2] = grad_err(g.dq, r.dq, c->nq, c);
        e[3] = grad_err(g.dk, r.dk, c->nkv, c);
        e[4] = grad_err(g.dv, r.dv, c->nkv, c);
    }
    test_note("%-34s o %.1e lse %.1e dq %.1e dk %.1e dv %.1e", what, e[0], e[1], e[2], e[3], e[4]);
    const char *names[] = {"o", "lse", "dq", "dk", "dv"};
    for (int i = 0; i < 5; i++)
        if (!(e[i] <= tol)) test_fail(__FILE__, __LINE__, "%s: %s rel err %.3g > %.3g", what, names[i], e[i], tol);
    attn_out_free(&r);
    attn_out_free(&g);
}

TEST(attn_cpu_matches_ref) {
    // float32 against float64 on the same (float-rounded) inputs: scores, exps and sums of at most
    // a few hundred terms in float give errors of a few eps (1e-7) times sqrt(terms); 1e-5
    // relative leaves a margin of ~10x over what is measured and catches any masking or
    // indexing error (those are O(1e-2) or more).
    struct {
        const char *what;
        int B, T, H, Hkv, D, w;
    } cs[] = {
        {"T=1", 2, 1, 2, 1, 8, 0},
        {"T=100 (not a tile multiple)", 1, 100, 2, 2, 24, 0},
        {"T=150 D=64 GQA Hkv=1", 2, 150, 4, 1, 64, 0},
        {"T=200 window 37 Hkv=H/2", 1, 200, 4, 2, 24, 37},
        {"T=70 window 300 (T < w)", 1, 70, 2, 1, 16, 300},
        {"T=130 window 1", 1, 130, 2, 2, 8, 1},
        {"T=300 window 128 D=64", 1, 300, 2, 1, 64, 128},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        AttnCase c = attn_case(cs[i].B, cs[i].T, cs[i].H, cs[i].Hkv, cs[i].D, cs[i].w, 1.0, 200 + i);
        cpu_vs_ref(cs[i].what, &c, 1, 1e-5);
        if (cs[i].w == 1) {  // each token sees only itself: o = v of its kv head
            AttnOut g = attn_run(backend_cpu(), &c, 0);
            int gsz = c.d.H / c.d.Hkv;
            double *want = xcalloc(c.nq, 8);
            for (size_t r = 0; r < c.nrow; r++) {
                size_t bt = r / c.d.H, h = r % c.d.H;
                memcpy(want + r * c.d.D, c.v + (bt * c.d.Hkv + h / gsz) * c.d.D, 8 * (size_t)c.d.D);
            }
            CHECK_REL("window 1: o = v", rel_err64(g.o, want, c.nq), 1e-6);
            free(want);
            attn_out_free(&g);
        }
        attn_case_free(&c);
    }
}

TEST(attn_cpu_long_large_logits) {
    // T = 777, q and k in [-30, 30): scores of a few hundred, rows near one-hot. A float score
    // carries an absolute error of ~eps * scale * sum|q_i k_i| ~ 1e-4 here, which moves the softmax
    // weights by as much relatively (measured: o 6e-6, dq and dk 8e-5); so 3e-4 relative, not the
    // 1e-5 of O(1) logits. The point is
    // that nothing overflows (exp of s - running max <= 0) and the result is the reference's.
    AttnCase c = attn_case(1, 777, 2, 1, 64, 0, 30.0, 300);
    cpu_vs_ref("T=777 logits x30 full", &c, 1, 3e-4);
    attn_case_free(&c);
    c = attn_case(1, 777, 2, 2, 24, 200, 30.0, 301);
    cpu_vs_ref("T=777 logits x30 window 200", &c, 1, 3e-4);
    attn_case_free(&c);
}

// Last token's output of attn_fwd against attn_decode over a cache of the visible tokens' k/v
// (full: slots in order; window: the ring buffer's order, slot s % w; then shuffled).
static void decode_case(const Backend *be, int w, double tol) {
    int B = 2, T = 23, H = 4, Hkv = 2, D = 16;
    AttnCase c = attn_case(B, T, H, Hkv, D, w, 1.0, 400 + w);
    AttnOut r = attn_run(be, &c, 0);
    int n = w ? w : T, cap = n + 3;  // spare slots past n must be ignored
    double *kc = rand_doubles(9, (size_t)B * cap * Hkv * D, -5, 5), *vc = rand_doubles(10, (size_t)B * cap * Hkv * D, -5, 5);
    double *qd = xcalloc((size_t)B * H * D, 8), *want = xcalloc((size_t)B * H * D, 8);
    for (int b = 0; b < B; b++) {
        memcpy(qd + (size_t)b * H * D, c.q + ((size_t)b * T + T - 1) * H * D, 8 * (size_t)H * D);
        memcpy(want + (size_t)b * H * D, r.o + ((size_t)b * T + T - 1) * H * D, 8 * (size_t)H * D);
    }
    int perm[64];
    for (int order = 0; order < 2; order++) {
        for (int i = 0; i < n; i++) perm[i] = i;
        if (order) {  // a fixed shuffle
            MnRng rng;
            mn_rng_seed(&rng, 77 + w);
            for (int i = n - 1; i > 0; i--) {
                int j = (int)(mn_rng_uniform(&rng) * (i + 1)), t = perm[i];
                perm[i] = perm[j], perm[j] = t;
            }
        }
        for (int b = 0; b < B; b++)
            for (int s = T - n; s < T; s++) {
                int slot = perm[w ? s % w : s];
                for (int hk = 0; hk < Hkv; hk++) {
                    size_t src = (((size_t)b * T + s) * Hkv + hk) * D, dst = (((size_t)b * cap + slot) * Hkv + hk) * D;
                    memcpy(kc + dst, c.k + src, 8 * (size_t)D);
                    memcpy(vc + dst, c.v + src, 8 * (size_t)D);
                }
            }
        size_t nc = (size_t)B * cap * Hkv * D, nqd = (size_t)B * H * D;
        void *bq = up(be, qd, nqd, MEM_ACT), *bk = up(be, kc, nc, MEM_ACT), *bv = up(be, vc, nc, MEM_ACT);
        void *bo = up(be, NULL, nqd, MEM_ACT);
        CHECK(!be->attn->decode(be, &c.d, n, cap, bq, bk, bv, bo), "%s attn_decode: %s", be->name, mn_last_error());
        double *got = down(be, bo, nqd, MEM_ACT);
        double e = rel_err64(got, want, nqd);
        test_note("%s decode window %d %s: rel err %.1e", be->name, w, order ? "shuffled" : "ring order", e);
        if (!(e <= tol)) test_fail(__FILE__, __LINE__, "%s decode window %d order %d: rel err %.3g", be->name, w, order, e);
        free(got);
        be->free(be, bq); be->free(be, bk); be->free(be, bv); be->free(be, bo);
    }
    CHECK(be->attn->decode(be, &c.d, cap + 1, cap, qd, kc, vc, want) == MN_ERR_ARG, "n > cap accepted");
    free(kc); free(vc); free(qd); free(want);
    attn_out_free(&r);
    attn_case_free(&c);
}

TEST(attn_decode_matches_fwd) {
    // Same backend on both sides, the same sums in another order: float64 to 1e-13, float32 to
    // 1e-6 (a few eps over 23 terms).
    int ws[] = {0, 5, 1};
    for (int i = 0; i < 3; i++) {
        decode_case(backend_ref(), ws[i], 1e-13);
        decode_case(backend_cpu(), ws[i], 1e-6);
    }
}

TEST(attn_rope) {
    const Backend *bes[2] = {backend_ref(), backend_cpu()};
    // D = 4, theta = 100: frequencies 1 and 100^(-1/2) = 0.1; position 1 rotates the pairs
    // (x0, x2) by 1 and (x1, x3) by 0.1; position 0 leaves x unchanged.
    double x[] = {1, 2, 3, 4, 1, 2, 3, 4};
    int32_t pos[] = {1, 0};
    double want[] = {cos(1) - 3 * sin(1), 2 * cos(0.1) - 4 * sin(0.1), 3 * cos(1) + sin(1), 4 * cos(0.1) + 2 * sin(0.1),
                     1, 2, 3, 4};
    for (int i = 0; i < 2; i++) {
        const Backend *be = bes[i];
        void *bx = up(be, x, 8, MEM_ACT), *bp = be->alloc(be, 2, MEM_I32);
        be->upload_i32(be, bp, pos, 2);
        CHECK(!be->attn->rope(be, bx, bp, 2, 1, 4, 4, 100.0f, 0), "%s rope: %s", be->name, mn_last_error());
        double *got = down(be, bx, 8, MEM_ACT);
        CHECK_REL(i ? "cpu rope hand case" : "ref rope hand case", rel_err64(got, want, 8), i ? 1e-6 : 1e-15);
        CHECK(be->attn->rope(be, bx, bp, 2, 1, 3, 3, 100.0f, 0) == MN_ERR_ARG, "%s: odd D accepted", be->name);
        CHECK(be->attn->rope(be, bx, bp, 2, 1, 4, 6, 100.0f, 0) == MN_ERR_ARG, "%s: rot > D accepted", be->name);
        CHECK(be->attn->rope(be, bx, bp, 1, 2, 4, 1, 100.0f, 0) == MN_ERR_ARG, "%s: odd rot accepted", be->name);
        free(got);
        be->free(be, bx); be->free(be, bp);
    }
    // rope(inverse) o rope = identity, and cpu == ref, at large positions (angles in the 1e4s).
    int N = 37, H = 3, D = 24;
    size_t nx = (size_t)N * H * D;
    double *xr = rand_doubles(500, nx, -1, 1);
    round_f32(xr, nx);
    int32_t *ps = xcalloc(N, sizeof(int32_t));
    for (int n = 0; n < N; n++) ps[n] = n * 997 % 20011;
    double *fwd[2];
    for (int i = 0; i < 2; i++) {
        const Backend *be = bes[i];
        void *bx = up(be, xr, nx, MEM_ACT), *bp = be->alloc(be, N, MEM_I32);
        be->upload_i32(be, bp, ps, N);
        CHECK(!be->attn->rope(be, bx, bp, N, H, D, D, 10000.0f, 0), "%s", mn_last_error());
        fwd[i] = down(be, bx, nx, MEM_ACT);
        CHECK(!be->attn->rope(be, bx, bp, N, H, D, D, 10000.0f, 1), "%s", mn_last_error());
        double *back = down(be, bx, nx, MEM_ACT);
        CHECK_REL(i ? "cpu rope inverse o rope" : "ref rope inverse o rope", rel_err64(back, xr, nx), i ? 1e-6 : 1e-14);
        free(back);
        be->free(be, bx); be->free(be, bp);
    }
    // the angle is computed in double on both; float rounding of cos/sin and the products only
    CHECK_REL("cpu rope vs ref", rel_err64(fwd[1], fwd[0], nx), 1e-6);
    free(fwd[0]); free(fwd[1]); free(xr); free(ps);
}

// Partial rotary (RecurrentGemma's: the first half of each head): the first rot features rotate as
// a head of rot would, with frequencies theta^(-2i/rot), and the rest pass untouched; the cpu
// against the reference and the inverse undoing it, at large positions.
TEST(attn_rope_partial) {
    const Backend *bes[2] = {backend_ref(), backend_cpu()};
    // D = 8, rot = 4, theta = 100: features 0..3 as attn_rope's hand case, 4..7 unchanged.
    double x[] = {1, 2, 3, 4, 5, 6, 7, 8};
    int32_t pos[] = {1};
    double want[] = {cos(1) - 3 * sin(1), 2 * cos(0.1) - 4 * sin(0.1), 3 * cos(1) + sin(1), 4 * cos(0.1) + 2 * sin(0.1),
                     5, 6, 7, 8};
    for (int i = 0; i < 2; i++) {
        const Backend *be = bes[i];
        void *bx = up(be, x, 8, MEM_ACT), *bp = be->alloc(be, 1, MEM_I32);
        be->upload_i32(be, bp, pos, 1);
        CHECK(!be->attn->rope(be, bx, bp, 1, 1, 8, 4, 100.0f, 0), "%s rope: %s", be->name, mn_last_error());
        double *got = down(be, bx, 8, MEM_ACT), e = rel_err64(got, want, 8);
        test_note("%s partial rope, hand case: rel err %.2e", be->name, e);
        CHECK_REL(i ? "cpu partial rope hand case" : "ref partial rope hand case", e, i ? 1e-6 : 1e-15);
        free(got);
        be->free(be, bx); be->free(be, bp);
    }
    int N = 29, H = 3, D = 40, rot = 20;
    size_t nx = (size_t)N * H * D;
    double *xr = rand_doubles(501, nx, -1, 1);
    round_f32(xr, nx);
    int32_t *ps = xcalloc(N, sizeof(int32_t));
    for (int n = 0; n < N; n++) ps[n] = n * 1009 % 30011;
    double *fwd[2];
    for (int i = 0; i < 2; i++) {
        const Backend *be = bes[i];
        void *bx = up(be, xr, nx, MEM_ACT), *bp = be->alloc(be, N, MEM_I32);
        be->upload_i32(be, bp, ps, N);
        CHECK(!be->attn->rope(be, bx, bp, N, H, D, rot, 10000.0f, 0), "%s", mn_last_error());
        fwd[i] = down(be, bx, nx, MEM_ACT);
        int untouched = 1;
        for (size_t r = 0; r < (size_t)N * H; r++)
            for (int j = rot; j < D; j++) untouched &= fwd[i][r * D + j] == xr[r * D + j];
        CHECK(untouched, "%s: rope changed features past rot", be->name);
        CHECK(!be->attn->rope(be, bx, bp, N, H, D, rot, 10000.0f, 1), "%s", mn_last_error());
        double *back = down(be, bx, nx, MEM_ACT), e = rel_err64(back, xr, nx);
        test_note("%s partial rope, inverse o rope: rel err %.2e", be->name, e);
        CHECK_REL(i ? "cpu partial rope inverse o rope" : "ref partial rope inverse o rope", e, i ? 1e-6 : 1e-14);
        free(back);
        be->free(be, bx); be->free(be, bp);
    }
    double e = rel_err64(fwd[1], fwd[0], nx);
    test_note("cpu partial rope vs ref: rel err %.2e", e);
    CHECK_REL("cpu partial rope vs ref", e, 1e-6);
    free(fwd[0]); free(fwd[1]); free(xr); free(ps);
}
