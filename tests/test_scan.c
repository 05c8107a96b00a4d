// The diagonal recurrences (core/backend.h's ScanOps: the RG-LRU and Longhorn kinds): the float64
// reference against finite differences, the reset rule and the sqrt bound; forwards in pieces with
// the state handed on against one forward; the float32 CPU core against the reference, over long
// sequences and at the gates' extremes; the same bits for any thread count; bad sizes refused.
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "core/backend.h"
#include "core/common.h"
#include "fd.h"
#include "ref/ref.h"
#include "test.h"

typedef struct {
    ScanDims d;
    size_t nx, nk, nc, ns;  // element counts: x, r, i, y [B,T,C]; k, q [B,T,N]; w, skip [C]; states [B,C,N]
    double *x, *r, *i, *k, *q, *w, *skip, *s0;  // i NULL (Longhorn); k, q, skip NULL (RG-LRU); s0 NULL: zero
    double *wl;                                 // the loss weights: L = sum(y wl), so dy = wl
} SCase;

typedef struct {
    double *y, *sT, *dx, *dr, *di, *dk, *dq, *dw, *dskip;
} SOut;

// Every input rounded to float, so that the float64 reference and the float32 core see the same
// numbers and differ only by their arithmetic.
static void round_f32(double *x, size_t n) {
    if (x)
        for (size_t i = 0; i < n; i++) x[i] = (float)x[i];
}

static const char *kind_name(ScanKind k) { return k == SCAN_RGLRU ? "rglru" : "longhorn"; }

// Inputs uniform in: x, k, q, skip, wl and s0 [-1, 1); r and i [-2, 2); w [wlo, whi). The RG-LRU's
// decay is a = exp(-8 sigmoid(r) softplus(w)), Longhorn's beta = sigmoid(r + w): w sets the memory.
static void case_init(SCase *c, ScanDims d, unsigned long long seed, double wlo, double whi, int with_s0) {
    memset(c, 0, sizeof *c);
    c->d = d;
    c->nx = (size_t)d.B * d.T * d.C;
    c->nk = (size_t)d.B * d.T * d.N;
    c->nc = (size_t)d.C;
    c->ns = (size_t)d.B * d.C * d.N;
    c->x = rand_doubles(seed, c->nx, -1, 1);
    c->r = rand_doubles(seed + 1, c->nx, -2, 2);
    c->w = rand_doubles(seed + 2, c->nc, wlo, whi);
    c->wl = rand_doubles(seed + 3, c->nx, -1, 1);
    if (d.kind == SCAN_RGLRU) {
        c->i = rand_doubles(seed + 4, c->nx, -2, 2);
    } else {
        c->k = rand_doubles(seed + 5, c->nk, -1, 1);
        c->q = rand_doubles(seed + 6, c->nk, -1, 1);
        c->skip = rand_doubles(seed + 7, c->nc, -1, 1);
    }
    if (with_s0) c->s0 = rand_doubles(seed + 8, c->ns, -1, 1);
    double *all[] = {c->x, c->r, c->w, c->wl, c->i, c->k, c->q, c->skip, c->s0};
    size_t n[] = {c->nx, c->nx, c->nc, c->nx, c->nx, c->nk, c->nk, c->nc, c->ns};
    for (int j = 0; j < 9; j++) round_f32(all[j], n[j]);
}

static void case_free(SCase *c) {
    free(c->x); free(c->r); free(c->i); free(c->k); free(c->q); free(c->w); free(c->skip); free(c->s0); free(c->wl);
}

static void out_free(SOut *o) {
    free(o->y); free(o->sT); free(o->dx); free(o->dr); free(o->di); free(o->dk); free(o->dq); free(o->dw);
    free(o->dskip);
}

static void *up(const Backend *be, const double *x, size_t n, MemKind k) {
    if (!x) return NULL;
    void *p = be->alloc(be, n, k);
    if (!p) die("%s", mn_last_error());
    CHECK(!be->upload(be, p, x, n, k), "%s", mn_last_error());
    return p;
}

static void *alloc_filled(const Backend *be, size_t n, MemKind k, double v) {
    double *h = xcalloc(n, sizeof(double));
    for (size_t j = 0; j < n; j++) h[j] = v;
    void *p = up(be, h, n, k);
    free(h);
    return p;
}

static double *down(const Backend *be, const void *p, size_t n, MemKind k) {
    if (!p) return NULL;
    double *x = xcalloc(n, sizeof(double));
    CHECK(!be->download(be, x, p, n, k), "%s", mn_last_error());
    return x;
}

// The forward (from c->s0) with the final state, and with bwd the backward of L = sum(y wl) (from a
// zero state, as the op defines it): dx, dr, di, dk, dq onto garbage (they must be overwritten), dw
// and dskip onto zeros.
static SOut srun(const Backend *be, const SCase *c, int bwd) {
    SOut o = {0};
    void *x = up(be, c->x, c->nx, MEM_ACT), *r = up(be, c->r, c->nx, MEM_ACT), *i = up(be, c->i, c->nx, MEM_ACT);
    void *k = up(be, c->k, c->nk, MEM_ACT), *q = up(be, c->q, c->nk, MEM_ACT);
    void *w = up(be, c->w, c->nc, MEM_PARAM), *skip = up(be, c->skip, c->nc, MEM_PARAM);
    void *s0 = up(be, c->s0, c->ns, MEM_F32), *y = alloc_filled(be, c->nx, MEM_ACT, 0);
    void *sT = alloc_filled(be, c->ns, MEM_F32, 0);
    ScanFwd f = {x, r, i, k, q, w, skip, s0, y, sT};
    CHECK(!be->scan->fwd(be, &c->d, &f), "%s fwd: %s", be->name, mn_last_error());
    o.y = down(be, y, c->nx, MEM_ACT);
    o.sT = down(be, sT, c->ns, MEM_F32);
    if (bwd) {
        int lh = c->d.kind == SCAN_LONGHORN;
        void *dy = up(be, c->wl, c->nx, MEM_ACT);
        void *dx = alloc_filled(be, c->nx, MEM_ACT, 1e30), *dr = alloc_filled(be, c->nx, MEM_ACT, 1e30);
        void *di = lh ? NULL : alloc_filled(be, c->nx, MEM_ACT, 1e30);
        void *dk = lh ? alloc_filled(be, c->nk, MEM_ACT, 1e30) : NULL;
        void *dq = lh ? alloc_filled(be, c->nk, MEM_ACT, 1e30) : NULL;
        void *dw = alloc_filled(be, c->nc, MEM_F32, 0), *dskip = lh ? alloc_filled(be, c->nc, MEM_F32, 0) : NULL;
        ScanBwd b = {x, r, i, k, q, w, skip, dy, dx, dr, di, dk, dq, dw, dskip};
        CHECK(!be->scan->bwd(be, &c->d, &b), "%s bwd: %s", be->name, mn_last_error());
        o.dx = down(be, dx, c->nx, MEM_ACT);
        o.dr = down(be, dr, c->nx, MEM_ACT);
        o.di = down(be, di, c->nx, MEM_ACT);
        o.dk = down(be, dk, c->nk, MEM_ACT);
        o.dq = down(be, dq, c->nk, MEM_ACT);
        o.dw = down(be, dw, c->nc, MEM_F32);
        o.dskip = down(be, dskip, c->nc, MEM_F32);
        void *bufs[] = {dy, dx, dr, di, dk, dq, dw, dskip};
        for (int j = 0; j < 8; j++) be->free(be, bufs[j]);
    }
    void *bufs[] = {x, r, i, k, q, w, skip, s0, y, sT};
    for (int j = 0; j < 10; j++) be->free(be, bufs[j]);
    return o;
}

// L = sum(y wl) of the reference's forward from a zero state (the backward's function).
static double ref_loss(void *ctx) {
    const SCase *c = ctx;
    double *y = xcalloc(c->nx, sizeof(double)), l = 0;
    ScanFwd f = {c->x, c->r, c->i, c->k, c->q, c->w, c->skip, NULL, y, NULL};
    if (ref_scan_fwd(backend_ref(), &c->d, &f)) die("%s", mn_last_error());
    for (size_t j = 0; j < c->nx; j++) l += y[j] * c->wl[j];
    free(y);
    return l;
}

static int all_finite(const double *x, size_t n) {
    if (!x) return 1;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

static int out_finite(const SCase *c, const SOut *o) {
    return all_finite(o->y, c->nx) && all_finite(o->sT, c->ns) && all_finite(o->dx, c->nx) &&
           all_finite(o->dr, c->nx) && all_finite(o->di, c->nx) && all_finite(o->dk, c->nk) &&
           all_finite(o->dq, c->nk) && all_finite(o->dw, c->nc) && all_finite(o->dskip, c->nc);
}

// ---------------------------------------------------------------------------
// The reference

TEST(scan_ref_backward_matches_finite_differences) {
    // Central differences with h = 1e-6 on O(1) values: truncation ~h^2 |L'''| = 1e-12, rounding
    // ~1e-16 |L| / 1e-6 ~ 1e-10 relative; 1e-7 leaves a wide margin while any wrong term fails by
    // orders of magnitude. The RG-LRU with w in [-2, 1) (decays 1e-4 to 0.9), in [-9, -6) (a within
    // 1e-3 of 1, where the multiplier sqrt(1 - a^2) is steep: u = 1 - a^2 >= 2e-3, far above the
    // sqrt bound's 2.5e-7, so the gradient is the exact one), with and without the reset; Longhorn
    // with N = 4 and 1.
    struct {
        ScanDims d;
        double wlo, whi;
    } cases[] = {
        {{SCAN_RGLRU, 2, 9, 3, 1, 0}, -2, 1},
        {{SCAN_RGLRU, 2, 9, 3, 1, 1}, -2, 1},
        {{SCAN_RGLRU, 2, 9, 3, 1, 1}, -9, -6},
        {{SCAN_LONGHORN, 2, 8, 3, 4, 0}, -1, 1},
        {{SCAN_LONGHORN, 1, 7, 2, 1, 0}, -1, 1},
    };
    for (int ci = 0; ci < 5; ci++) {
        SCase c;
        case_init(&c, cases[ci].d, 10 + 10 * ci, cases[ci].wlo, cases[ci].whi, 0);
        SOut o = srun(backend_ref(), &c, 1);
        test_note("%s B %d T %d C %d N %d reset %d, w in [%g, %g)", kind_name(c.d.kind), c.d.B, c.d.T, c.d.C, c.d.N,
                  c.d.reset, cases[ci].wlo, cases[ci].whi);
        fd_check("x", ref_loss, &c, c.x, o.dx, c.nx, 1e-7);
        fd_check("r", ref_loss, &c, c.r, o.dr, c.nx, 1e-7);
        fd_check("w", ref_loss, &c, c.w, o.dw, c.nc, 1e-7);
        if (c.i) fd_check("i", ref_loss, &c, c.i, o.di, c.nx, 1e-7);
        if (c.k) {
            fd_check("k", ref_loss, &c, c.k, o.dk, c.nk, 1e-7);
            fd_check("q", ref_loss, &c, c.q, o.dq, c.nk, 1e-7);
            fd_check("skip", ref_loss, &c, c.skip, o.dskip, c.nc, 1e-7);
        }
        out_free(&o);
        case_free(&c);
    }
}

TEST(scan_ref_rglru_reset_and_sqrt_bound) {
    // Under `reset` the first position is y_0 = sigmoid(i_0) x_0 exactly (a_0 = 0 drops the given
    // state, the multiplier is 1), and no gradient reaches r_0 or w from it: with T = 1, dr = 0 and
    // dw = 0 exactly, and dx = dy sigmoid(i).
    ScanDims d = {SCAN_RGLRU, 3, 4, 5, 1, 1};
    SCase c;
    case_init(&c, d, 100, -2, 1, 1);
    SOut o = srun(backend_ref(), &c, 0);
    c.s0[0] += 10;  // another initial state changes nothing
    SOut o2 = srun(backend_ref(), &c, 0);
    int bad = 0;
    for (int b = 0; b < d.B; b++)
        for (int ch = 0; ch < d.C; ch++) {
            size_t e = (size_t)b * d.T * d.C + ch;
            if (o.y[e] != 1 / (1 + exp(-c.i[e])) * c.x[e]) bad++;
        }
    CHECK(!bad, "%d of %d first outputs under reset are not sigmoid(i) x exactly", bad, d.B * d.C);
    CHECK(!memcmp(o.y, o2.y, sizeof(double) * c.nx), "the initial state leaked through the reset");
    out_free(&o); out_free(&o2);
    case_free(&c);
    ScanDims d1 = {SCAN_RGLRU, 2, 1, 4, 1, 1};
    case_init(&c, d1, 110, -2, 1, 0);
    o = srun(backend_ref(), &c, 1);
    double e = 0;
    for (size_t j = 0; j < c.nx; j++) {
        CHECK(o.dr[j] == 0, "reset position: dr = %g, not 0", o.dr[j]);
        e = fmax(e, fabs(o.dx[j] - c.wl[j] / (1 + exp(-c.i[j]))));
    }
    for (size_t j = 0; j < c.nc; j++) CHECK(o.dw[j] == 0, "reset position: dw = %g, not 0", o.dw[j]);
    CHECK(e <= 1e-16, "reset position: dx differs from dy sigmoid(i) by %.3g", e);
    out_free(&o);
    case_free(&c);

    // The sqrt bound: with w = -20 (softplus 2e-9), u = 1 - a^2 = 16 sigmoid(r) softplus(w) < 4e-8,
    // below 1/(4 1000^2) = 2.5e-7: one step without reset has y = sqrt(u) i x, and the backward
    // takes d sqrt(u)/du as 1000, so dr = -8 sp (-2 a^2 dy i x 1000) r (1 - r) to rounding (the
    // exact derivative, 1/(2 sqrt(u)) > 2500, would be 2.5x larger or more).
    ScanDims d2 = {SCAN_RGLRU, 2, 1, 4, 1, 0};
    case_init(&c, d2, 120, -20, -20 + 1e-9, 0);
    o = srun(backend_ref(), &c, 1);
    e = 0;
    for (size_t j = 0; j < c.nx; j++) {
        double sp = log1p(exp(c.w[j % 4])), rg = 1 / (1 + exp(-c.r[j])), ig = 1 / (1 + exp(-c.i[j]));
        double a = exp(-8 * rg * sp), u = -expm1(-16 * rg * sp);
        CHECK(u < 2.5e-7, "the case should be below the bound (u = %.3g)", u);
        double want = -8 * sp * (-2 * a * a * c.wl[j] * ig * c.x[j] * 1000) * rg * (1 - rg);
        e = fmax(e, fabs(o.dr[j] - want) / fabs(want));
    }
    test_note("bounded sqrt derivative: dr max rel diff %.2e", e);
    CHECK(e <= 1e-12, "dr below the sqrt bound: rel diff %.3g to the bounded formula", e);
    out_free(&o);
    case_free(&c);
}

// The forward over T from c->s0, against pieces of T1 tokens then of `step`, the state handed on
// through sT aliasing s0 (the reset, if any, on the first piece only). Every output is computed by
// the same operations either way, so the results agree bit for bit.
static void pieces_case(const Backend *be, const SCase *c, int T1, int step) {
    const ScanDims *d = &c->d;
    int B = d->B, T = d->T, C = d->C, N = d->N;
    SOut all = srun(be, c, 0);
    double *ycat = xcalloc(c->nx, sizeof(double));
    void *w = up(be, c->w, c->nc, MEM_PARAM), *skip = up(be, c->skip, c->nc, MEM_PARAM);
    void *s = c->s0 ? up(be, c->s0, c->ns, MEM_F32) : alloc_filled(be, c->ns, MEM_F32, 0);
    for (int t0 = 0; t0 < T;) {
        int n = mn_min(t0 ? step : T1, T - t0);
        ScanDims dn = *d;
        dn.T = n;
        dn.reset = d->reset && t0 == 0;
        // the tokens [t0, t0 + n) of every sequence, as a [B, n, ...] problem
        const double *src[5] = {c->x, c->r, c->i, c->k, c->q};
        void *dev[5] = {0};
        for (int j = 0; j < 5; j++) {
            const double *a = src[j];
            int width = j < 3 ? C : N;
            if (!a) continue;
            double *piece = xcalloc((size_t)B * n * width, sizeof(double));
            for (int b = 0; b < B; b++)
                memcpy(piece + (size_t)b * n * width, a + ((size_t)b * T + t0) * width, sizeof(double) * n * width);
            dev[j] = up(be, piece, (size_t)B * n * width, MEM_ACT);
            free(piece);
        }
        void *y = alloc_filled(be, (size_t)B * n * C, MEM_ACT, 0);
        ScanFwd f = {dev[0], dev[1], dev[2], dev[3], dev[4], w, skip, (t0 || c->s0) ? s : NULL, y, s};
        CHECK(!be->scan->fwd(be, &dn, &f), "%s fwd: %s", be->name, mn_last_error());
        double *yy = down(be, y, (size_t)B * n * C, MEM_ACT);
        for (int b = 0; b < B; b++)
            memcpy(ycat + ((size_t)b * T + t0) * C, yy + (size_t)b * n * C, sizeof(double) * n * C);
        free(yy);
        be->free(be, y);
        for (int j = 0; j < 5; j++) be->free(be, dev[j]);
        t0 += n;
    }
    double *sT = down(be, s, c->ns, MEM_F32);
    int same = !memcmp(ycat, all.y, sizeof(double) * c->nx) && !memcmp(sT, all.sT, sizeof(double) * c->ns);
    test_note("%s %s reset %d, s0 %s: pieces %d + %d... vs one forward: y rel diff %.1e, state %.1e", be->name,
              kind_name(d->kind), d->reset, c->s0 ? "given" : "NULL", T1, step, rel_err64(ycat, all.y, c->nx),
              rel_err64(sT, all.sT, c->ns));
    CHECK(same, "%s %s: the forward in pieces differs from one forward", be->name, kind_name(d->kind));
    free(ycat); free(sT);
    be->free(be, w); be->free(be, skip); be->free(be, s);
    out_free(&all);
}

static const ScanDims piece_dims[] = {
    {SCAN_RGLRU, 2, 23, 5, 1, 0},
    {SCAN_RGLRU, 3, 150, 70, 1, 1},
    {SCAN_LONGHORN, 2, 23, 5, 16, 0},
    {SCAN_LONGHORN, 3, 150, 70, 7, 0},
};

TEST(scan_ref_forward_in_pieces_is_exact) {
    for (int di = 0; di < 4; di++)
        for (int with_s0 = 0; with_s0 < 2; with_s0++) {
            SCase c;
            case_init(&c, piece_dims[di], 200 + 2 * di + with_s0, -3, 1, with_s0);
            pieces_case(backend_ref(), &c, 7, 1);
            pieces_case(backend_ref(), &c, 64, 5);
            case_free(&c);
        }
}

// ---------------------------------------------------------------------------
// The float32 CPU core

// rel err of every output of g against r, noted; checked against tol_f (forward) and tol_b (backward).
static void compare(const SCase *c, const SOut *g, const SOut *r, double tol_f, double tol_b) {
    struct {
        const char *name;
        const double *a, *b;
        size_t n;
        double tol;
    } t[] = {{"y", g->y, r->y, c->nx, tol_f},         {"sT", g->sT, r->sT, c->ns, tol_f},
             {"dx", g->dx, r->dx, c->nx, tol_b},      {"dr", g->dr, r->dr, c->nx, tol_b},
             {"di", g->di, r->di, c->nx, tol_b},      {"dk", g->dk, r->dk, c->nk, tol_b},
             {"dq", g->dq, r->dq, c->nk, tol_b},      {"dw", g->dw, r->dw, c->nc, tol_b},
             {"dskip", g->dskip, r->dskip, c->nc, tol_b}};
    char line[512];
    int len = 0;
    for (int j = 0; j < 9; j++) {
        if (!t[j].a || !t[j].b) continue;
        double e = rel_err64(t[j].a, t[j].b, t[j].n);
        len += snprintf(line + len, sizeof line - (size_t)len, " %s %.1e", t[j].name, e);
        CHECK_REL(t[j].name, e, t[j].tol);
    }
    test_note("%s", line);
}

TEST(scan_cpu_matches_ref) {
    // Float32 against float64 on the same (float-rounded) inputs. Each step adds a few ulp of
    // rounding (eps = 6e-8) from the gates (expf, expm1f, sqrtf, the division, ~4 ulp each) and
    // the update; a state remembers its errors for its memory length 1/(1 - a), here a few to ~30
    // steps (w in [-3, 1): RG-LRU decays up to 0.95; Longhorn's a = 1 - Delta k^2 >= 1/(1 + beta
    // kappa) with k in +-1), so the forward's relative error stays ~1e-6 whatever T. The backward's
    // reverse scan carries the same, and dw, dskip, dk, dq sum O(B T) or O(C) terms of mixed signs
    // (cancellation: sums smaller than their terms lose a few digits more). Measured up to 1.5e-7
    // (forward) and 4.4e-7 (backward, dw); 2e-6 and 5e-6 keep a margin of 10 or more for other
    // compilers and vector math libraries, while any wrong term is O(1e-2) or more.
    ScanDims ds[] = {
        {SCAN_RGLRU, 3, 37, 5, 1, 0},     {SCAN_RGLRU, 3, 129, 67, 1, 1},  {SCAN_RGLRU, 2, 64, 128, 1, 0},
        {SCAN_LONGHORN, 3, 37, 5, 16, 0}, {SCAN_LONGHORN, 3, 129, 67, 7, 0}, {SCAN_LONGHORN, 2, 33, 70, 1, 0},
    };
    for (int di = 0; di < 6; di++)
        for (int with_s0 = 0; with_s0 < 2; with_s0++) {
            SCase c;
            case_init(&c, ds[di], 300 + 2 * di + with_s0, -3, 1, with_s0);
            int bwd = !with_s0;  // the backward is from a zero state
            SOut r = srun(backend_ref(), &c, bwd), g = srun(backend_cpu(), &c, bwd);
            test_note("%s B %d T %d C %d N %d reset %d, s0 %s", kind_name(c.d.kind), c.d.B, c.d.T, c.d.C, c.d.N,
                      c.d.reset, with_s0 ? "given" : "NULL");
            compare(&c, &g, &r, 2e-6, 5e-6);
            CHECK(out_finite(&c, &g), "non-finite CPU results");
            out_free(&r);
            out_free(&g);
            case_free(&c);
        }
}

TEST(scan_cpu_forward_in_pieces_is_exact) {
    for (int di = 0; di < 4; di++)
        for (int with_s0 = 0; with_s0 < 2; with_s0++) {
            SCase c;
            case_init(&c, piece_dims[di], 400 + 2 * di + with_s0, -3, 1, with_s0);
            pieces_case(backend_cpu(), &c, 7, 1);
            pieces_case(backend_cpu(), &c, 64, 5);
            case_free(&c);
        }
}

TEST(scan_long_sequences_at_the_extremes) {
    // T = 4100 (128 chunks and a piece) at the gates' extremes. The RG-LRU with w = -20: softplus
    // 2e-9, a = 1 - O(1e-8), the multiplier sqrt(1 - a^2) ~ 1e-4 (expm1, not 1 - a^2, which
    // float32 would round to 0); with w = 12: a = exp(-8 r 12) ~ 0 (underflowing for most r); with
    // r~, i~ in +-12, sigmoids within 6e-6 of 0 and 1 (their slopes taken as sigmoid(z) sigmoid(-z),
    // not sigmoid(z) (1 - sigmoid(z)), which cancels). Longhorn with w = -30: beta ~ 1e-13, a = 1 -
    // O(1e-13), b ~ 0; with w = 12 and |k|^2 up to 16: beta within 6e-6 of 1, Delta k_j^2 close to
    // 1 (a near 0). Everything stays finite, and the CPU follows the reference. Where a is within
    // eps32 of 1, float32 rounds it (to 1, or to 1 - 6e-8): an error of up to 3e-8 in each step's
    // decay, T 3e-8 = 1.2e-4 relative after T steps, and the state sums T terms (rounding eps32
    // sqrt(T) to eps32 T); eps32 T = 2.5e-4 bounds both. Measured 2e-5 to 3.5e-5 (RG-LRU, w = -20);
    // elsewhere the memory is short and the errors ~1e-7 to 1e-6. 2.5e-4 for the forward and 5e-4
    // for the backward (its reverse scan is as long, and dw sums B T of its terms).
    struct {
        ScanDims d;
        double w, scale;  // w; the scale of k (Longhorn) or of r~ and i~ (RG-LRU)
    } cases[] = {
        {{SCAN_RGLRU, 2, 4100, 5, 1, 1}, -20, 1},
        {{SCAN_RGLRU, 2, 4100, 5, 1, 0}, 12, 1},
        {{SCAN_RGLRU, 2, 4100, 5, 1, 1}, 0, 6},
        {{SCAN_LONGHORN, 2, 4100, 3, 4, 0}, -30, 1},
        {{SCAN_LONGHORN, 2, 4100, 3, 4, 0}, 12, 2},
    };
    for (int ci = 0; ci < 5; ci++) {
        SCase c;
        case_init(&c, cases[ci].d, 500 + ci, cases[ci].w, cases[ci].w + 1e-3, 1);
        for (size_t j = 0; c.k && j < c.nk; j++) c.k[j] *= cases[ci].scale;
        for (size_t j = 0; c.i && j < c.nx; j++) {
            c.r[j] *= cases[ci].scale;
            c.i[j] *= cases[ci].scale;
        }
        SOut r = srun(backend_ref(), &c, 0), g = srun(backend_cpu(), &c, 0);
        free(c.s0);
        c.s0 = NULL;
        SOut rb = srun(backend_ref(), &c, 1), gb = srun(backend_cpu(), &c, 1);
        test_note("%s T %d w %g, scale %g: from s0, then the backward from zero", kind_name(c.d.kind), c.d.T,
                  cases[ci].w, cases[ci].scale);
        CHECK(out_finite(&c, &r) && out_finite(&c, &rb), "non-finite reference results");
        CHECK(out_finite(&c, &g) && out_finite(&c, &gb), "non-finite CPU results");
        compare(&c, &g, &r, 2.5e-4, 5e-4);
        compare(&c, &gb, &rb, 2.5e-4, 5e-4);
        out_free(&r); out_free(&g); out_free(&rb); out_free(&gb);
        case_free(&c);
    }
}

TEST(scan_cpu_same_bits_any_thread_count) {
    // Tasks of one sequence and one channel block, each with the same arithmetic whoever runs it;
    // Longhorn's sums over channels are added in block order. 1, 2 and 3 threads: the same bits.
    ScanDims ds[] = {
        {SCAN_RGLRU, 3, 70, 150, 1, 1}, {SCAN_LONGHORN, 3, 70, 150, 16, 0}, {SCAN_LONGHORN, 1, 40, 200, 7, 0}};
    int saved = omp_get_max_threads();
    for (int di = 0; di < 3; di++) {
        SCase c;
        case_init(&c, ds[di], 600 + di, -3, 1, 0);
        SOut o[3];
        for (int th = 1; th <= 3; th++) {
            omp_set_num_threads(th);
            o[th - 1] = srun(backend_cpu(), &c, 1);
        }
        omp_set_num_threads(saved);
        for (int th = 2; th <= 3; th++) {
            const SOut *a = &o[0], *b = &o[th - 1];
            int same = !memcmp(a->y, b->y, 8 * c.nx) && !memcmp(a->sT, b->sT, 8 * c.ns) &&
                       !memcmp(a->dx, b->dx, 8 * c.nx) && !memcmp(a->dr, b->dr, 8 * c.nx) &&
                       !memcmp(a->dw, b->dw, 8 * c.nc) && (!a->di || !memcmp(a->di, b->di, 8 * c.nx)) &&
                       (!a->dk || !memcmp(a->dk, b->dk, 8 * c.nk)) && (!a->dq || !memcmp(a->dq, b->dq, 8 * c.nk)) &&
                       (!a->dskip || !memcmp(a->dskip, b->dskip, 8 * c.nc));
            CHECK(same, "%s C %d N %d: %d threads differ from 1", kind_name(ds[di].kind), ds[di].C, ds[di].N, th);
        }
        for (int i = 0; i < 3; i++) out_free(&o[i]);
        case_free(&c);
    }
}

TEST(scan_dw_accumulates) {
    // dw and dskip are parameter gradients (+=): a second backward onto the first's doubles them
    // (the same sums added to themselves: exact but for the float sum's last rounding, 1e-7), and
    // the activation gradients are overwritten (the same bits again).
    ScanDims ds[] = {{SCAN_RGLRU, 2, 9, 6, 1, 0}, {SCAN_LONGHORN, 2, 9, 6, 3, 0}};
    const Backend *bes[2] = {backend_ref(), backend_cpu()};
    for (int di = 0; di < 2; di++)
        for (int bi = 0; bi < 2; bi++) {
            const Backend *be = bes[bi];
            SCase c;
            case_init(&c, ds[di], 700 + di, -3, 1, 0);
            int lh = ds[di].kind == SCAN_LONGHORN;
            void *x = up(be, c.x, c.nx, MEM_ACT), *r = up(be, c.r, c.nx, MEM_ACT), *i = up(be, c.i, c.nx, MEM_ACT);
            void *k = up(be, c.k, c.nk, MEM_ACT), *q = up(be, c.q, c.nk, MEM_ACT), *w = up(be, c.w, c.nc, MEM_PARAM);
            void *skip = up(be, c.skip, c.nc, MEM_PARAM), *dy = up(be, c.wl, c.nx, MEM_ACT);
            void *dx = alloc_filled(be, c.nx, MEM_ACT, 0), *dr = alloc_filled(be, c.nx, MEM_ACT, 0);
            void *dii = lh ? NULL : alloc_filled(be, c.nx, MEM_ACT, 0);
            void *dk = lh ? alloc_filled(be, c.nk, MEM_ACT, 0) : NULL;
            void *dq = lh ? alloc_filled(be, c.nk, MEM_ACT, 0) : NULL;
            void *dw = alloc_filled(be, c.nc, MEM_F32, 0), *dskip = lh ? alloc_filled(be, c.nc, MEM_F32, 0) : NULL;
            ScanBwd b = {x, r, i, k, q, w, skip, dy, dx, dr, dii, dk, dq, dw, dskip};
            CHECK(!be->scan->bwd(be, &c.d, &b), "%s", mn_last_error());
            double *dw1 = down(be, dw, c.nc, MEM_F32), *ds1 = down(be, dskip, c.nc, MEM_F32);
            double *dx1 = down(be, dx, c.nx, MEM_ACT);
            CHECK(!be->scan->bwd(be, &c.d, &b), "%s", mn_last_error());
            double *dw2 = down(be, dw, c.nc, MEM_F32), *ds2 = down(be, dskip, c.nc, MEM_F32);
            double *dx2 = down(be, dx, c.nx, MEM_ACT);
            for (size_t j = 0; j < c.nc; j++) {
                dw1[j] *= 2;
                if (ds1) ds1[j] *= 2;
            }
            test_note("%s %s: second dw vs twice the first %.1e", be->name, kind_name(c.d.kind),
                      rel_err64(dw2, dw1, c.nc));
            CHECK_REL("dw accumulates", rel_err64(dw2, dw1, c.nc), 1e-7);
            if (lh) CHECK_REL("dskip accumulates", rel_err64(ds2, ds1, c.nc), 1e-7);
            CHECK(!memcmp(dx1, dx2, sizeof(double) * c.nx), "%s: dx not overwritten", be->name);
            free(dw1); free(ds1); free(dx1); free(dw2); free(ds2); free(dx2);
            void *bufs[] = {x, r, i, k, q, w, skip, dy, dx, dr, dii, dk, dq, dw, dskip};
            for (int j = 0; j < 15; j++) be->free(be, bufs[j]);
            case_free(&c);
        }
}

TEST(scan_rejects_bad_arguments) {
    const Backend *bes[] = {backend_ref(), backend_cpu()};
    for (int bi = 0; bi < 2; bi++) {
        const Backend *be = bes[bi];
        CHECK(be->scan && be->scan->fwd && be->scan->bwd, "%s: no scan core", be->name);
        if (!be->scan || !be->scan->fwd || !be->scan->bwd) continue;
        void *buf = be->alloc(be, 4096, MEM_F32);
        ScanDims ok = {SCAN_LONGHORN, 1, 2, 3, 4, 0};
        ScanDims bad[] = {{(ScanKind)7, 1, 2, 3, 1, 0},    {SCAN_RGLRU, 0, 2, 3, 1, 0}, {SCAN_RGLRU, 1, 0, 3, 1, 0},
                          {SCAN_RGLRU, 1, 2, 0, 1, 0},     {SCAN_RGLRU, 1, 2, 3, 2, 0}, {SCAN_LONGHORN, 1, 2, 3, 0, 0},
                          {SCAN_RGLRU, 1, 2, 3, 1, 2},     {SCAN_LONGHORN, 1, 2, 3, 4, 1}};
        int nbad = (int)(sizeof bad / sizeof bad[0]);
        ScanFwd f = {buf, buf, buf, buf, buf, buf, buf, NULL, buf, NULL};
        ScanBwd b = {buf, buf, buf, buf, buf, buf, buf, buf, buf, buf, buf, buf, buf, buf, buf};
        for (int i = 0; i < nbad; i++) {
            CHECK(be->scan->fwd(be, &bad[i], &f) == MN_ERR_ARG, "%s: bad dims %d accepted by fwd", be->name, i);
            CHECK(be->scan->bwd(be, &bad[i], &b) == MN_ERR_ARG, "%s: bad dims %d accepted by bwd", be->name, i);
        }
        ScanFwd fn = f;
        fn.k = NULL;  // Longhorn without its key
        CHECK(be->scan->fwd(be, &ok, &fn) == MN_ERR_ARG, "%s: Longhorn fwd without k accepted", be->name);
        ScanDims rg = {SCAN_RGLRU, 1, 2, 3, 1, 0};
        ScanBwd bn = b;
        bn.di = NULL;  // the RG-LRU without di
        CHECK(be->scan->bwd(be, &rg, &bn) == MN_ERR_ARG, "%s: RG-LRU bwd without di accepted", be->name);
        CHECK(be->scan->fwd(be, &ok, NULL) == MN_ERR_ARG, "%s: NULL io accepted", be->name);
        be->free(be, buf);
    }
}
