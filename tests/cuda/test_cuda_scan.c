// The diagonal recurrences on the GPU (src/cuda/scan_cuda.cu: the backend's scan->fwd, bwd; RG-LRU and
// Longhorn) against the float64 reference backend (src/ref/scan_ref.c) through the op tables, on awkward
// shapes: C not a multiple of 8 (element copies) or of the 64-channel tile, T not a multiple of the
// 32-token stage, T = 1, T = 4100 (128 stages: the state carried and the backward's checkpoints), Longhorn
// with d_state 16 and 5 (k, q padded), the RG-LRU with and without `reset` and with channels whose decay
// is within 2.5e-7 of 1 (w = -20: SqrtBoundDerivative's clip), Longhorn with large keys (|k|^2 up to 64).
// Both get the same inputs, the activations rounded to bf16 first (what the GPU holds), w, skip and s0 to
// float32. The forward runs from a given state (y and sT), the backward from the zero state (core/backend.h);
// dw and dskip start at a known value (they accumulate). Every other GPU output is poisoned with NaN first.
// Then decoding: a prefill and T = 1 steps with sT aliasing s0, against one forward; and three runs of
// a large shape, bit for bit the same (every cross-thread sum in a fixed order).
//
// Tolerances (relative L2 over the tensor). A bf16 output is its float32 value rounded once: at most
// 2^-9 relative an element, so at most 2^-9 = 3.9e-3 in L2; the float32 walks add ~1e-6 (a contracting
// recurrence forgets its rounding; measured in the emulation, scripts/cuda_emulate.sh scan: 1.4e-3 ..
// 2.1e-3 in all): BF16_TOL = 2^-9 + 1e-3. The float32 outputs: sT is the walk's own float32 state (the
// emulation: 3e-8 .. 1.5e-7), F32_TOL = 1e-5 allows ~100 ulp of gate arithmetic (__expf's 2 ulp) carried
// over the memory of the slowest channels; dw and dskip are sums over B T tokens of terms of both signs,
// so their relative error is that of the terms times sum |term| / |sum| (~ sqrt(B T) = 90 at 2 x 4100):
// SUM_TOL = 1e-6 x 90 x 10 = 1e-3. A wrong index or a missing term is O(0.1 .. 1).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "core/backend.h"
#include "core/common.h"
#include "core/half.h"
#include "../fd.h"
#include "../test.h"

#define BF16_TOL (1.0 / 512 + 1e-3)
#define F32_TOL 1e-5
#define SUM_TOL 1e-3

static const Backend *G;

static int setup(void) {
    G = backend_cuda();
    if (!G) test_fail(__FILE__, __LINE__, "no CUDA backend: %s", mn_last_error());
    if (G && (!G->scan || !G->scan->fwd || !G->scan->bwd)) {
        test_fail(__FILE__, __LINE__, "the CUDA backend has no scan ops");
        return 0;
    }
    return G != NULL;
}

static void round_act(double *x, size_t n) {
    if (x)
        for (size_t i = 0; i < n; i++) x[i] = bf16_to_f32(f32_to_bf16((float)x[i]));
}
static void round_f32(double *x, size_t n) {
    if (x)
        for (size_t i = 0; i < n; i++) x[i] = (double)(float)x[i];
}

static void *up(const Backend *be, const double *h, size_t n, MemKind k) {
    if (!h) return NULL;
    void *p = be->alloc(be, n, k);
    if (!p || be->upload(be, p, h, n, k)) die("%s", mn_last_error());
    return p;
}
static void *filled(const Backend *be, size_t n, MemKind k, double v) {
    double *h = xcalloc(n ? n : 1, sizeof(double));
    for (size_t i = 0; i < n; i++) h[i] = v;
    void *p = up(be, h, n, k);
    free(h);
    return p;
}
static double *down(const Backend *be, const void *p, size_t n, MemKind k) {
    if (!p) return NULL;
    double *h = xcalloc(n ? n : 1, sizeof(double));
    if (be->download(be, h, p, n, k)) die("%s", mn_last_error());
    return h;
}

typedef struct {
    ScanKind kind;
    int B, T, C, N, reset, hard;
} SShape;

typedef struct {
    ScanDims d;
    size_t nx, nk, ns;
    double *x, *r, *i, *k, *q, *w, *skip, *s0, *dy;
} SCase;

static void scase_init(SCase *c, const SShape *s, unsigned long long seed) {
    memset(c, 0, sizeof *c);
    ScanDims d = {s->kind, s->B, s->T, s->C, s->N, s->reset};
    c->d = d;
    c->nx = (size_t)s->B * s->T * s->C;
    c->nk = (size_t)s->B * s->T * s->N;
    c->ns = (size_t)s->B * s->C * s->N;
    c->x = rand_doubles(seed, c->nx, -1, 1);
    c->r = rand_doubles(seed + 1, c->nx, -2, 2);
    c->dy = rand_doubles(seed + 2, c->nx, -1, 1);
    c->s0 = rand_doubles(seed + 3, c->ns, -1, 1);
    if (s->kind == SCAN_RGLRU) {
        c->i = rand_doubles(seed + 4, c->nx, -2, 2);
        c->w = rand_doubles(seed + 5, (size_t)s->C, s->hard ? -8 : -2, s->hard ? 6 : 2);
        if (s->hard)
            for (int j = 0; j < s->C; j += 5) c->w[j] = -20;  // a within 2.5e-7 of 1: the sqrt bound's clip
    } else {
        const double kr = s->hard ? 2 : 1;
        c->k = rand_doubles(seed + 6, c->nk, -kr, kr);
        c->q = rand_doubles(seed + 7, c->nk, -1, 1);
        c->w = rand_doubles(seed + 8, (size_t)s->C, -2, 2);
        c->skip = rand_doubles(seed + 9, (size_t)s->C, -1, 1);
    }
    round_act(c->x, c->nx);
    round_act(c->r, c->nx);
    round_act(c->i, c->nx);
    round_act(c->dy, c->nx);
    round_act(c->k, c->nk);
    round_act(c->q, c->nk);
    round_f32(c->w, (size_t)s->C);
    round_f32(c->skip, (size_t)s->C);
    round_f32(c->s0, c->ns);
}

static void scase_free(SCase *c) {
    free(c->x); free(c->r); free(c->i); free(c->k); free(c->q); free(c->w); free(c->skip); free(c->s0); free(c->dy);
}

typedef struct {
    double *y, *sT, *dx, *dr, *di, *dk, *dq, *dw, *dskip;
} SOuts;

static void souts_free(SOuts *o) {
    free(o->y); free(o->sT); free(o->dx); free(o->dr); free(o->di); free(o->dk); free(o->dq); free(o->dw);
    free(o->dskip);
}

// The forward from s0 and the backward (from the zero state) on be.
static int run_on(const Backend *be, const SCase *c, SOuts *o) {
    memset(o, 0, sizeof *o);
    const ScanDims *d = &c->d;
    const int lh = d->kind == SCAN_LONGHORN;
    const size_t C = (size_t)d->C;
    void *x = up(be, c->x, c->nx, MEM_ACT), *r = up(be, c->r, c->nx, MEM_ACT), *i = up(be, c->i, c->nx, MEM_ACT);
    void *k = up(be, c->k, c->nk, MEM_ACT), *q = up(be, c->q, c->nk, MEM_ACT), *dy = up(be, c->dy, c->nx, MEM_ACT);
    void *w = up(be, c->w, C, MEM_PARAM), *skip = up(be, c->skip, C, MEM_PARAM), *s0 = up(be, c->s0, c->ns, MEM_F32);
    void *y = filled(be, c->nx, MEM_ACT, NAN), *sT = filled(be, c->ns, MEM_F32, NAN);
    void *dx = filled(be, c->nx, MEM_ACT, NAN), *dr = filled(be, c->nx, MEM_ACT, NAN);
    void *di = lh ? NULL : filled(be, c->nx, MEM_ACT, NAN);
    void *dk = lh ? filled(be, c->nk, MEM_ACT, NAN) : NULL, *dq = lh ? filled(be, c->nk, MEM_ACT, NAN) : NULL;
    void *dw = filled(be, C, MEM_F32, 0.5), *dskip = lh ? filled(be, C, MEM_F32, -0.25) : NULL;
    ScanFwd f = {x, r, i, k, q, w, skip, s0, y, sT};
    int rc = be->scan->fwd(be, d, &f);
    ScanBwd b = {x, r, i, k, q, w, skip, dy, dx, dr, di, dk, dq, dw, dskip};
    if (!rc) rc = be->scan->bwd(be, d, &b);
    if (!rc) rc = be->sync(be);
    if (!rc) {
        o->y = down(be, y, c->nx, MEM_ACT), o->sT = down(be, sT, c->ns, MEM_F32);
        o->dx = down(be, dx, c->nx, MEM_ACT), o->dr = down(be, dr, c->nx, MEM_ACT);
        o->di = down(be, di, c->nx, MEM_ACT);
        o->dk = down(be, dk, c->nk, MEM_ACT), o->dq = down(be, dq, c->nk, MEM_ACT);
        o->dw = down(be, dw, C, MEM_F32), o->dskip = down(be, dskip, C, MEM_F32);
    }
    void *bufs[] = {x, r, i, k, q, dy, w, skip, s0, y, sT, dx, dr, di, dk, dq, dw, dskip};
    for (size_t j = 0; j < sizeof bufs / sizeof bufs[0]; j++)
        if (bufs[j]) be->free(be, bufs[j]);
    return rc;
}

static double relerr(const double *got, const double *want, size_t n) {
    double e = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        e += (got[i] - want[i]) * (got[i] - want[i]);
        r += want[i] * want[i];
    }
    return r > 0 ? sqrt(e / r) : sqrt(e);
}

static void cmp(const char *tag, const char *what, const double *got, const double *want, size_t n, double tol) {
    if (!got || !want) return;
    double e = relerr(got, want, n);
    test_note("%-44s %-5s rel err %.2e", tag, what, e);
    if (!(e <= tol)) test_fail(__FILE__, __LINE__, "%s %s: rel err %.3g > %.3g", tag, what, e, tol);
}

static void shape_tag(char *tag, size_t n, const SShape *s) {
    snprintf(tag, n, "%s B%d T%d C%d N%d%s%s", s->kind == SCAN_RGLRU ? "rglru" : "longhorn", s->B, s->T, s->C, s->N,
             s->reset ? " reset" : "", s->hard ? " hard" : "");
}

TEST(cuda_scan_matches_reference) {
    if (!setup()) return;
    const Backend *ref = backend_ref();
    if (!ref->scan || !ref->scan->fwd) {
        test_fail(__FILE__, __LINE__, "the reference backend has no scan ops to compare with");
        return;
    }
    static const SShape shapes[] = {
        {SCAN_RGLRU, 2, 67, 70, 1, 1, 0},      // C % 8 != 0: element copies, a partial tile; reset
        {SCAN_RGLRU, 3, 200, 136, 1, 0, 1},    // 16-byte copies, three tiles, hard gates (the sqrt clip)
        {SCAN_RGLRU, 2, 1, 40, 1, 1, 0},       // T = 1
        {SCAN_RGLRU, 2, 32, 72, 1, 1, 0},      // T one chunk exactly: one launch from s0
        {SCAN_RGLRU, 2, 4100, 24, 1, 0, 1},    // long: 129 stages
        {SCAN_LONGHORN, 2, 70, 96, 16, 0, 0},  // d_state 16, a partial stage and tile
        {SCAN_LONGHORN, 2, 45, 37, 5, 0, 0},   // d_state 5: k, q by elements, padded
        {SCAN_LONGHORN, 1, 300, 130, 16, 0, 1}, // large keys, C % 8 != 0
        {SCAN_LONGHORN, 2, 256, 64, 16, 0, 0}, // two 128-token chunks exactly
        {SCAN_LONGHORN, 1, 129, 72, 7, 0, 0},  // a 128-token chunk and one token
        {SCAN_LONGHORN, 3, 1, 64, 16, 0, 0},   // T = 1
        {SCAN_LONGHORN, 1, 4100, 16, 16, 0, 0}, // long
    };
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const SShape *s = &shapes[si];
        char tag[96];
        shape_tag(tag, sizeof tag, s);
        SCase c;
        scase_init(&c, s, 1000 + 31 * si);
        SOuts g, w;
        if (run_on(G, &c, &g) || run_on(ref, &c, &w)) {
            test_fail(__FILE__, __LINE__, "%s: %s", tag, mn_last_error());
            scase_free(&c);
            continue;
        }
        cmp(tag, "y", g.y, w.y, c.nx, BF16_TOL);
        cmp(tag, "sT", g.sT, w.sT, c.ns, F32_TOL);
        cmp(tag, "dx", g.dx, w.dx, c.nx, BF16_TOL);
        cmp(tag, "dr", g.dr, w.dr, c.nx, BF16_TOL);
        cmp(tag, "di", g.di, w.di, c.nx, BF16_TOL);
        cmp(tag, "dk", g.dk, w.dk, c.nk, BF16_TOL);
        cmp(tag, "dq", g.dq, w.dq, c.nk, BF16_TOL);
        cmp(tag, "dw", g.dw, w.dw, (size_t)s->C, SUM_TOL);
        cmp(tag, "dskip", g.dskip, w.dskip, (size_t)s->C, SUM_TOL);
        souts_free(&g);
        souts_free(&w);
        scase_free(&c);
    }
}

// Bit for bit the same outputs on every run: every sum across threads or blocks (the chunks' states
// and adjoints in chunk order, the dk, dq, dw, dskip partials) is taken in a fixed order, so a
// scheduling-dependent order would show here. RG-LRU 8 x 2048 x 1000: 64 chunks of 16 tiles a
// sequence, 8192 blocks a launch; Longhorn with 9 tiles and 8 chunks.
static int same_bits(const double *a, const double *b, size_t n) { return !a || !b || !memcmp(a, b, n * sizeof *a); }

TEST(cuda_scan_is_deterministic) {
    if (!setup()) return;
    static const SShape shapes[] = {
        {SCAN_RGLRU, 8, 2048, 1000, 1, 0, 0},
        {SCAN_LONGHORN, 2, 1000, 520, 16, 0, 0},
    };
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const SShape *s = &shapes[si];
        char tag[96];
        shape_tag(tag, sizeof tag, s);
        SCase c;
        scase_init(&c, s, 7000 + 13 * si);
        SOuts o[3];
        int ok = 1;
        for (int run = 0; run < 3 && ok; run++) ok = !run_on(G, &c, &o[run]);
        if (!ok) {
            test_fail(__FILE__, __LINE__, "%s: %s", tag, mn_last_error());
            scase_free(&c);
            continue;
        }
        int all = 1;
        for (int run = 1; run < 3; run++) {
            const SOuts *a = &o[0], *b = &o[run];
            const int same = same_bits(a->y, b->y, c.nx) && same_bits(a->sT, b->sT, c.ns) &&
                             same_bits(a->dx, b->dx, c.nx) && same_bits(a->dr, b->dr, c.nx) &&
                             same_bits(a->di, b->di, c.nx) && same_bits(a->dk, b->dk, c.nk) &&
                             same_bits(a->dq, b->dq, c.nk) && same_bits(a->dw, b->dw, (size_t)s->C) &&
                             same_bits(a->dskip, b->dskip, (size_t)s->C);
            if (!same) test_fail(__FILE__, __LINE__, "%s: run %d differs from run 0", tag, run);
            all = all && same;
        }
        if (all) test_note("%-44s 3 runs bit-identical", tag);
        for (int run = 0; run < 3; run++) souts_free(&o[run]);
        scase_free(&c);
    }
}

// Rows [t0, t0 + n) of a [B,T,D] tensor as a [B,n,D] one.
static double *rows_of(const double *x, int B, int T, int D, int t0, int n) {
    if (!x) return NULL;
    double *o = xcalloc((size_t)B * n * D, sizeof(double));
    for (int b = 0; b < B; b++) memcpy(o + (size_t)b * n * D, x + ((size_t)b * T + t0) * D, sizeof(double) * n * D);
    return o;
}

// A prefill of T0 tokens from s0, then T = 1 steps with sT aliasing s0 (the decoding step: one launch,
// no scratch), against one forward over all tokens: the same float32 walk, so y within its bf16
// rounding and the state within float32 rounding.
static void prefill_decode(const SShape *s, int T0) {
    char tag[96];
    shape_tag(tag, sizeof tag, s);
    SCase c;
    scase_init(&c, s, 77);
    const ScanDims *d = &c.d;
    const int lh = d->kind == SCAN_LONGHORN, B = d->B, T = d->T, C = d->C, N = d->N;
    SOuts whole;
    if (run_on(G, &c, &whole)) {
        test_fail(__FILE__, __LINE__, "%s: %s", tag, mn_last_error());
        scase_free(&c);
        return;
    }
    void *st = up(G, c.s0, c.ns, MEM_F32);
    void *w = up(G, c.w, (size_t)C, MEM_PARAM), *skip = up(G, c.skip, (size_t)C, MEM_PARAM);
    double *y = xcalloc(c.nx, sizeof(double));
    int rc = 0;
    for (int t0 = 0; t0 < T && !rc;) {
        const int n = t0 == 0 ? T0 : 1;
        ScanDims dn = *d;
        dn.T = n;
        dn.reset = d->reset && t0 == 0;
        double *xs = rows_of(c.x, B, T, C, t0, n), *rs = rows_of(c.r, B, T, C, t0, n);
        double *is = rows_of(c.i, B, T, C, t0, n);
        double *ks = rows_of(c.k, B, T, N, t0, n), *qs = rows_of(c.q, B, T, N, t0, n);
        void *x = up(G, xs, (size_t)B * n * C, MEM_ACT), *r = up(G, rs, (size_t)B * n * C, MEM_ACT);
        void *i = up(G, is, (size_t)B * n * C, MEM_ACT), *k = up(G, ks, (size_t)B * n * N, MEM_ACT);
        void *q = up(G, qs, (size_t)B * n * N, MEM_ACT), *yo = filled(G, (size_t)B * n * C, MEM_ACT, NAN);
        ScanFwd f = {x, r, i, k, q, w, lh ? skip : NULL, st, yo, st};
        rc = G->scan->fwd(G, &dn, &f);
        if (!rc) rc = G->sync(G);
        if (!rc) {
            double *yh = down(G, yo, (size_t)B * n * C, MEM_ACT);
            for (int b = 0; b < B; b++)
                memcpy(y + ((size_t)b * T + t0) * C, yh + (size_t)b * n * C, sizeof(double) * n * C);
            free(yh);
        }
        void *bufs[] = {x, r, i, k, q, yo};
        for (size_t j = 0; j < 6; j++)
            if (bufs[j]) G->free(G, bufs[j]);
        free(xs); free(rs); free(is); free(ks); free(qs);
        t0 += n;
    }
    if (rc) {
        test_fail(__FILE__, __LINE__, "%s decode: %s", tag, mn_last_error());
    } else {
        double *sT = down(G, st, c.ns, MEM_F32);
        strncat(tag, " decode", sizeof tag - strlen(tag) - 1);
        cmp(tag, "y", y, whole.y, c.nx, BF16_TOL);
        cmp(tag, "sT", sT, whole.sT, c.ns, F32_TOL);
        free(sT);
    }
    free(y);
    G->free(G, st);
    G->free(G, w);
    if (skip) G->free(G, skip);
    souts_free(&whole);
    scase_free(&c);
}

TEST(cuda_scan_prefill_decode_matches_forward) {
    if (!setup()) return;
    const SShape rg = {SCAN_RGLRU, 3, 45, 72, 1, 1, 0}, lh = {SCAN_LONGHORN, 2, 40, 100, 16, 0, 0};
    prefill_decode(&rg, 37);
    prefill_decode(&lh, 33);
}

TEST(cuda_scan_refuses_bad_sizes) {
    if (!setup()) return;
    ScanDims d = {SCAN_LONGHORN, 1, 8, 8, 32, 0};
    if (G->scan->supports(G, &d) != MN_ERR_UNSUPPORTED) test_fail(__FILE__, __LINE__, "Longhorn N = 32 accepted");
    ScanDims e = {SCAN_RGLRU, 1, 8, 8, 2, 0};
    if (G->scan->supports(G, &e) != MN_ERR_UNSUPPORTED) test_fail(__FILE__, __LINE__, "RG-LRU N = 2 accepted");
}
