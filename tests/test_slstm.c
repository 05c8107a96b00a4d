// The sLSTM core (core/backend.h's SlstmOps): the float64 reference against the unstabilised
// recurrence, finite differences and the first-step rule; the float32 CPU core against the
// reference; prefill then single steps against one forward; the same bits for any thread count.
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
    SlstmDims d;
    size_t nx, nh, ns, nr;   // element counts: x (and cache, dx) [B,T,4,D], h [B,T,D], state [B,4,D], R
    double *x, *r, *s0, *w;  // inputs (s0 may be NULL); w: the loss weights, L = sum(h w), so dh = w
} SCase;

typedef struct {
    double *h, *cache, *sT, *dx, *dr;
} SOut;

static int dim_D(const SlstmDims *d) { return d->H * d->Dh; }

// Every input rounded to float, so that the float64 reference and the float32 core see the same
// numbers and differ only by their arithmetic.
static void round_f32(double *x, size_t n) {
    if (x)
        for (size_t i = 0; i < n; i++) x[i] = (float)x[i];
}

// Gate pre-activations uniform in: i [ilo, ihi), f [-1, 4) (mostly remembering, as xLSTM's forget
// biases make it), z and o [-2, 2); R uniform in +-rscale / sqrt(Dh); w in [-1, 1); with_s0: a
// state of h in +-0.5, n in [0.5, 2), c = n a with a in +-1 (|c / n| <= 1, as the forward's own),
// m in +-2.
static void case_init(SCase *c, SlstmDims d, unsigned long long seed, double ilo, double ihi, double rscale,
                      int with_s0) {
    memset(c, 0, sizeof *c);
    c->d = d;
    int D = dim_D(&d);
    c->nx = (size_t)d.B * d.T * 4 * D;
    c->nh = (size_t)d.B * d.T * D;
    c->ns = (size_t)d.B * 4 * D;
    c->nr = (size_t)d.H * d.Dh * 4 * d.Dh;
    c->x = rand_doubles(seed, c->nx, 0, 1);
    const double lo[4] = {ilo, -1, -2, -2}, hi[4] = {ihi, 4, 2, 2};
    for (size_t e = 0; e < c->nx; e++) {
        int g = (int)(e / D % 4);
        c->x[e] = lo[g] + (hi[g] - lo[g]) * c->x[e];
    }
    double rs = rscale / sqrt(d.Dh);
    c->r = rand_doubles(seed + 1, c->nr, -rs, rs);
    c->w = rand_doubles(seed + 2, c->nh, -1, 1);
    if (with_s0) {
        c->s0 = rand_doubles(seed + 3, c->ns, 0, 1);
        for (int b = 0; b < d.B; b++) {
            double *s = c->s0 + (size_t)b * 4 * D;
            for (int k = 0; k < D; k++) {
                s[k] = s[k] - 0.5;
                s[2 * D + k] = 0.5 + 1.5 * s[2 * D + k];
                s[D + k] = s[2 * D + k] * (2 * s[D + k] - 1);
                s[3 * D + k] = 4 * s[3 * D + k] - 2;
            }
        }
    }
    round_f32(c->x, c->nx);
    round_f32(c->r, c->nr);
    round_f32(c->w, c->nh);
    round_f32(c->s0, c->ns);
}

static void case_free(SCase *c) { free(c->x); free(c->r); free(c->s0); free(c->w); }
static void out_free(SOut *o) { free(o->h); free(o->cache); free(o->sT); free(o->dx); free(o->dr); }

static void *up(const Backend *be, const double *x, size_t n, MemKind k) {
    void *p = be->alloc(be, n, k);
    if (!p) die("%s", mn_last_error());
    if (x) CHECK(!be->upload(be, p, x, n, k), "%s", mn_last_error());
    return p;
}

static double *down(const Backend *be, const void *p, size_t n, MemKind k) {
    double *x = xcalloc(n, sizeof(double));
    CHECK(!be->download(be, x, p, n, k), "%s", mn_last_error());
    return x;
}

// The forward (from c->s0) with the cache and the final state, and with bwd (c->s0 NULL) the
// backward of L = sum(h w): dx onto garbage (it must be overwritten), dR onto zeros.
static SOut srun(const Backend *be, const SCase *c, int bwd) {
    SOut o = {0};
    void *x = up(be, c->x, c->nx, MEM_ACT), *r = up(be, c->r, c->nr, MEM_PARAM);
    void *s0 = c->s0 ? up(be, c->s0, c->ns, MEM_F32) : NULL;
    void *h = up(be, NULL, c->nh, MEM_ACT), *cache = up(be, NULL, c->nx, MEM_F32), *sT = up(be, NULL, c->ns, MEM_F32);
    SlstmFwd f = {x, r, s0, h, cache, sT};
    CHECK(!be->slstm->fwd(be, &c->d, &f), "%s fwd: %s", be->name, mn_last_error());
    o.h = down(be, h, c->nh, MEM_ACT);
    o.cache = down(be, cache, c->nx, MEM_F32);
    o.sT = down(be, sT, c->ns, MEM_F32);
    if (bwd) {
        double *junk = xcalloc(c->nx, sizeof(double));
        for (size_t i = 0; i < c->nx; i++) junk[i] = 1e30;
        void *dh = up(be, c->w, c->nh, MEM_ACT), *dx = up(be, junk, c->nx, MEM_ACT), *dr = up(be, NULL, c->nr, MEM_F32);
        SlstmBwd b = {x, r, cache, dh, dx, dr};
        CHECK(!be->slstm->bwd(be, &c->d, &b), "%s bwd: %s", be->name, mn_last_error());
        o.dx = down(be, dx, c->nx, MEM_ACT);
        o.dr = down(be, dr, c->nr, MEM_F32);
        be->free(be, dh); be->free(be, dx); be->free(be, dr);
        free(junk);
    }
    be->free(be, x); be->free(be, r); be->free(be, s0); be->free(be, h); be->free(be, cache); be->free(be, sT);
    return o;
}

// The reference's backward on double buffers directly (the reference backend's buffers are double).
static void ref_bwd(const SlstmDims *d, const double *x, const double *r, const double *cache, const double *dh,
                    double *dx, double *dr) {
    SlstmBwd b = {x, r, cache, dh, dx, dr};
    CHECK(!ref_slstm_bwd(backend_ref(), d, &b), "%s", mn_last_error());
}

static double ref_loss(void *ctx) {
    const SCase *c = ctx;
    double *h = xcalloc(c->nh, sizeof(double)), l = 0;
    SlstmFwd f = {c->x, c->r, c->s0, h, NULL, NULL};
    if (ref_slstm_fwd(backend_ref(), &c->d, &f)) die("%s", mn_last_error());
    for (size_t i = 0; i < c->nh; i++) l += h[i] * c->w[i];
    free(h);
    return l;
}

// The unstabilised recurrence in float64 (xlstm-notes.md 1.1, sigmoid forget gate): C, N without
// m, i = exp(r_i), f = sigmoid(r_f), h = o C / N, from (h0, C0 = c0 e^m0, N0 = n0 e^m0) of c->s0.
// Products with R's zeros are skipped, so that a cell that has overflowed spreads no NaN through
// them. Fills h and N [B,T,D].
static void unstabilised(const SCase *c, double *h, double *N) {
    const SlstmDims *d = &c->d;
    int T = d->T, H = d->H, Dh = d->Dh, D = dim_D(d);
    double *hs = xcalloc((size_t)7 * D, sizeof(double)), *C = hs + D, *Ns = C + D, *r = Ns + D;
    for (int b = 0; b < d->B; b++) {
        memset(hs, 0, sizeof(double) * 3 * D);
        if (c->s0) {
            const double *s = c->s0 + (size_t)b * 4 * D;
            for (int k = 0; k < D; k++) {
                hs[k] = s[k];
                C[k] = s[D + k] * exp(s[3 * D + k]);
                Ns[k] = s[2 * D + k] * exp(s[3 * D + k]);
            }
        }
        for (int t = 0; t < T; t++) {
            size_t bt = (size_t)b * T + t;
            for (int hd = 0; hd < H; hd++)
                for (int g = 0; g < 4; g++)
                    for (int j = 0; j < Dh; j++) {
                        double s = c->x[(bt * 4 + g) * D + hd * Dh + j];
                        for (int i = 0; i < Dh; i++) {
                            double w = c->r[(((size_t)hd * Dh + i) * 4 + g) * Dh + j];
                            if (w != 0) s += hs[hd * Dh + i] * w;
                        }
                        r[g * D + hd * Dh + j] = s;
                    }
            for (int k = 0; k < D; k++) {
                double ig = exp(r[k]), fg = 1 / (1 + exp(-r[D + k])), z = tanh(r[2 * D + k]);
                double o = 1 / (1 + exp(-r[3 * D + k]));
                C[k] = fg * C[k] + ig * z;
                Ns[k] = fg * Ns[k] + ig;
                hs[k] = o * C[k] / Ns[k];
                h[bt * D + k] = hs[k];
                N[bt * D + k] = Ns[k];
            }
        }
    }
    free(hs);
}

static int all_finite(const double *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

// ---------------------------------------------------------------------------
// The reference

TEST(slstm_ref_matches_unstabilised_form) {
    // The stabilised and the unstabilised recurrences are the same function (c, n carry a factor
    // exp(-m) that h = o c / n cancels): in float64 they differ by rounding alone, a few ulp a step
    // (1e-16 relative) through T steps of a contracting recurrence, and by exp's argument's rounding
    // in the stabilised form, |r_i| eps (5e-15 at |r_i| = 50). 1e-12 leaves a wide margin for
    // moderate inputs and |r_i| up to 50; a missing factor or a wrong gate is O(1).
    SlstmDims d = {2, 20, 2, 4, 0};
    struct {
        double ilo, ihi;
        int with_s0;
    } cases[] = {{-3, 3, 0}, {-3, 3, 1}, {-50, 50, 0}, {-50, 50, 1}};
    for (int ci = 0; ci < 4; ci++) {
        SCase c;
        case_init(&c, d, 10 + ci, cases[ci].ilo, cases[ci].ihi, 1, cases[ci].with_s0);
        SOut o = srun(backend_ref(), &c, 0);
        double *hu = xcalloc(c.nh, 8), *nu = xcalloc(c.nh, 8);
        unstabilised(&c, hu, nu);
        test_note("x_i in [%g, %g), s0 %s", cases[ci].ilo, cases[ci].ihi, c.s0 ? "given" : "NULL");
        double e = rel_err64(o.h, hu, c.nh);
        test_note("h: stabilised vs unstabilised rel err %.2e", e);
        CHECK_REL("h", e, 1e-12);
        CHECK(all_finite(o.cache, c.nx) && all_finite(o.sT, c.ns), "non-finite state");
        out_free(&o);
        free(hu); free(nu);
        case_free(&c);
    }
    // |x_i| up to 1000: exp(r_i) overflows (past 709.8) or underflows (n = 0, then 0/0) in the
    // unstabilised form; the stabilised one stays finite everywhere, and equals the unstabilised
    // wherever that is finite with N a normal number (>= 1e-200, so that no term of C lost digits
    // to a subnormal). There the difference is the rounding of exp's argument, r_i - m with
    // |r_i| <= 1000: 1e3 * 1.1e-16 = 1e-13 relative a step, hence 1e-12 (absolute; |h| < 1).
    // R = 0: no mixing, so that every cell is finite in the unstabilised form until its own overflow.
    SlstmDims d2 = {2, 40, 2, 4, 0};
    for (int mix = 0; mix < 2; mix++) {
        SCase c;
        case_init(&c, d2, 20 + mix, -1000, 1000, 1, 0);
        if (!mix) memset(c.r, 0, sizeof(double) * c.nr);
        SOut o = srun(backend_ref(), &c, 0);
        CHECK(all_finite(o.h, c.nh) && all_finite(o.cache, c.nx) && all_finite(o.sT, c.ns),
              "stabilised form not finite with |x_i| <= 1000 (R %s)", mix ? "mixing" : "zero");
        if (!mix) {
            double *hu = xcalloc(c.nh, 8), *nu = xcalloc(c.nh, 8), worst = 0;
            size_t compared = 0, nonfinite = 0;
            unstabilised(&c, hu, nu);
            for (size_t i = 0; i < c.nh; i++) {
                if (!isfinite(hu[i])) nonfinite++;
                if (!isfinite(hu[i]) || !isfinite(nu[i]) || nu[i] < 1e-200) continue;
                compared++;
                worst = fmax(worst, fabs(o.h[i] - hu[i]));
            }
            test_note("|x_i| <= 1000: %zu of %zu outputs compared (%zu not finite unstabilised), max |diff| %.2e",
                      compared, c.nh, nonfinite, worst);
            CHECK(compared >= c.nh / 10 && nonfinite >= c.nh / 10, "the case compares too little or overflows too little");
            CHECK(worst <= 1e-12, "stabilised vs unstabilised: max |diff| %.3g > 1e-12", worst);
            free(hu); free(nu);
        }
        out_free(&o);
        case_free(&c);
    }
}

TEST(slstm_ref_first_step_rule) {
    // From a zero state the first step has m = r_i, so i' = 1, c = 0 f' + 1 tanh(r_z) and
    // n = 0 f' + 1 = 1 exactly, and h = sigmoid(r_o) tanh(r_z) / 1: bit for bit (r = x exactly,
    // h_0 = 0). Without the rule, x_i <= -745 would give i' = exp(x_i - logsigmoid(x_f)) = 0 and
    // h = 0/0; elsewhere i' z / i' would round.
    SlstmDims d = {2, 3, 2, 8, 0};
    SCase c;
    case_init(&c, d, 30, -800, 800, 1, 0);
    int D = dim_D(&d), T = d.T;
    for (int b = 0; b < d.B; b++)  // spread x_i of the first step over [-800, 800]
        for (int k = 0; k < D; k++) c.x[(size_t)b * T * 4 * D + k] = -800 + 1600.0 * (b * D + k) / (d.B * D - 1);
    SOut o = srun(backend_ref(), &c, 0);
    int bad = 0;
    for (int b = 0; b < d.B; b++)
        for (int k = 0; k < D; k++) {
            const double *x = c.x + (size_t)b * T * 4 * D, *s = o.cache + (size_t)b * T * 4 * D;
            double want = 1 / (1 + exp(-x[3 * D + k])) * tanh(x[2 * D + k]);
            if (o.h[(size_t)b * T * D + k] != want || s[D + k] != tanh(x[2 * D + k]) || s[2 * D + k] != 1 ||
                s[3 * D + k] != x[k])
                bad++;
        }
    CHECK(!bad, "%d of %d first-step cells are not sigmoid(x_o) tanh(x_z) (c = tanh, n = 1, m = x_i) exactly", bad,
          d.B * D);
    CHECK(all_finite(o.h, c.nh), "non-finite output");
    out_free(&o);
    case_free(&c);
}

// The largest |dh_rec| of a backward, before its clip: dh_rec for step t-1 = R dg_t (per head),
// dg = dx; *over (if not NULL) counts those beyond clip, of *total.
static double dh_rec_stats(const SCase *c, const double *dx, double clip, size_t *over, size_t *total) {
    const SlstmDims *d = &c->d;
    int T = d->T, H = d->H, Dh = d->Dh, D = dim_D(d);
    double mx = 0;
    for (int b = 0; b < d->B; b++)
        for (int t = 1; t < T; t++)
            for (int hd = 0; hd < H; hd++)
                for (int i = 0; i < Dh; i++) {
                    double a = 0;
                    for (int g = 0; g < 4; g++)
                        for (int j = 0; j < Dh; j++)
                            a += c->r[(((size_t)hd * Dh + i) * 4 + g) * Dh + j] *
                                 dx[(((size_t)b * T + t) * 4 + g) * D + hd * Dh + j];
                    mx = fmax(mx, fabs(a));
                    if (over) *over += fabs(a) > clip, ++*total;
                }
    return mx;
}

TEST(slstm_ref_backward_matches_finite_differences) {
    // Central differences with h = 1e-6 on O(1) values: truncation ~h^2 = 1e-12, rounding
    // ~1e-16 * |L| / 1e-6 ~ 1e-9 relative; 1e-7 leaves a wide margin while any wrong term (O(1)
    // relative in some entry) fails by orders of magnitude. Two regimes of the input gate: moderate,
    // and spread over +-12 so that m switches between its branches.
    SlstmDims d = {2, 7, 2, 3, 0};
    double ranges[2][2] = {{-3, 3}, {-12, 12}};
    for (int ci = 0; ci < 2; ci++) {
        SCase c;
        case_init(&c, d, 40 + ci, ranges[ci][0], ranges[ci][1], 1.5, 0);
        SOut o = srun(backend_ref(), &c, 1);
        test_note("x_i in [%g, %g)", ranges[ci][0], ranges[ci][1]);
        fd_check("x", ref_loss, &c, c.x, o.dx, c.nx, 1e-7);
        fd_check("R", ref_loss, &c, c.r, o.dr, c.nr, 1e-7);
        // A clip just above the largest recurrent gradient: no entry is clipped, so the gradients
        // are the unclipped ones bit for bit.
        double mx = dh_rec_stats(&c, o.dx, 0, NULL, NULL);
        SCase cc = c;
        cc.d.clip = (float)(1.01 * mx);
        double *dx = xcalloc(c.nx, 8), *dr = xcalloc(c.nr, 8);
        ref_bwd(&cc.d, c.x, c.r, o.cache, c.w, dx, dr);
        test_note("clip %.3g (max |dh_rec| %.3g): dx rel diff %.1e, dR %.1e", (double)cc.d.clip, mx,
                  rel_err64(dx, o.dx, c.nx), rel_err64(dr, o.dr, c.nr));
        CHECK(!memcmp(dx, o.dx, sizeof(double) * c.nx) && !memcmp(dr, o.dr, sizeof(double) * c.nr),
              "a clip that clips nothing changed the gradients");
        free(dx); free(dr);
        out_free(&o);
        case_free(&c);
    }
}

TEST(slstm_ref_clip_clips) {
    // T = 2 from a zero state: the clipped backward's step 1 is the unclipped one's, and dR is
    // unchanged (h_{-1} = 0, so step 0 adds nothing to it). Step 0's gradients are linear in its
    // dy = dh_0 + dh_rec and in the carried dc, dn, which clipping leaves alone: clipped minus
    // unclipped step 0 is the backward of the first token alone with dh = clamp(a) - a, a = R dg_1.
    // The difference cancels about 2 digits (it is ~3e-2 of dx); each side has ~1e-16 relative
    // rounding: 1e-12.
    SlstmDims d = {2, 2, 2, 3, 0}, d1 = {2, 1, 2, 3, 0};
    SCase c;
    case_init(&c, d, 50, -3, 3, 1.5, 0);
    int D = dim_D(&d), Dh = d.Dh, H = d.H;
    SOut o = srun(backend_ref(), &c, 1);
    double mx = dh_rec_stats(&c, o.dx, 0, NULL, NULL), clip = (float)(0.5 * mx);
    d.clip = d1.clip = (float)clip;
    double *dx = xcalloc(c.nx, 8), *dr = xcalloc(c.nr, 8);
    ref_bwd(&d, c.x, c.r, o.cache, c.w, dx, dr);
    // the first token's problem: x, cache, dh of t = 0, dh plus the clamped recurrent gradient
    size_t n1 = (size_t)d.B * 4 * D;
    double *x1 = xcalloc(n1, 8), *cache1 = xcalloc(n1, 8), *dh1 = xcalloc((size_t)d.B * D, 8), *dx1 = xcalloc(n1, 8),
           *dr1 = xcalloc(c.nr, 8);
    int clipped = 0, free_ = 0;
    for (int b = 0; b < d.B; b++) {
        memcpy(x1 + (size_t)b * 4 * D, c.x + (size_t)b * 2 * 4 * D, sizeof(double) * 4 * D);
        memcpy(cache1 + (size_t)b * 4 * D, o.cache + (size_t)b * 2 * 4 * D, sizeof(double) * 4 * D);
        for (int hd = 0; hd < H; hd++)
            for (int i = 0; i < Dh; i++) {
                double a = 0;
                for (int g = 0; g < 4; g++)
                    for (int j = 0; j < Dh; j++)
                        a += c.r[(((size_t)hd * Dh + i) * 4 + g) * Dh + j] *
                             o.dx[(((size_t)b * 2 + 1) * 4 + g) * D + hd * Dh + j];
                if (fabs(a) > clip) clipped++; else free_++;
                dh1[(size_t)b * D + hd * Dh + i] = fmin(fmax(a, -clip), clip) - a;
            }
    }
    ref_bwd(&d1, x1, c.r, cache1, dh1, dx1, dr1);
    test_note("clip %.3g: %d of %d recurrent gradients clipped", clip, clipped, clipped + free_);
    CHECK(clipped > 0 && free_ > 0, "the case should clip some entries and not others");
    double e1 = 0, e0 = 0, eu = 0, *diff = xcalloc((size_t)4 * D, 8);
    for (int b = 0; b < d.B; b++) {
        const double *c0 = dx + (size_t)b * 2 * 4 * D, *u0 = o.dx + (size_t)b * 2 * 4 * D;
        for (int k = 0; k < 4 * D; k++) diff[k] = c0[k] - u0[k];
        e1 = fmax(e1, rel_err64(dx + ((size_t)b * 2 + 1) * 4 * D, o.dx + ((size_t)b * 2 + 1) * 4 * D, 4 * D));
        e0 = fmax(e0, rel_err64(dx1 + (size_t)b * 4 * D, diff, 4 * D));
        eu = fmax(eu, rel_err64(c0, u0, 4 * D));
    }
    free(diff);
    test_note("step 1 vs unclipped %.1e; step 0: clipped vs unclipped %.2e, the difference vs the first token's "
              "backward of clamp(a) - a %.1e", e1, eu, e0);
    CHECK(e1 == 0, "the last step's gradient changed with clipping (rel %.3g)", e1);
    CHECK_REL("step 0's change vs the backward of clamp(a) - a", e0, 1e-12);
    CHECK(eu > 1e-3, "clipping did not change step 0's gradient (rel %.3g)", eu);
    CHECK(!memcmp(dr, o.dr, sizeof(double) * c.nr), "dR changed with clipping at T = 2");
    free(x1); free(cache1); free(dh1); free(dx1); free(dr1); free(dx); free(dr);
    out_free(&o);
    case_free(&c);
}

// ---------------------------------------------------------------------------
// Prefill then single steps

// The forward over T from c->s0, against a prefill of T1 tokens and then steps of one token, the
// state handed on through sT aliasing s0. Both the reference and the CPU core do the same arithmetic
// either way (the CPU's per-step products have the sizes [B, Dh] x [Dh, 4 Dh] whatever T), so the
// outputs and the final state agree bit for bit.
static void prefill_case(const Backend *be, const SCase *c, int T1) {
    const SlstmDims *d = &c->d;
    int B = d->B, T = d->T, D = dim_D(d);
    SOut all = srun(be, c, 0);
    // the tokens of [t0, t0 + n) as a [B, n, ...] problem
    double *hcat = xcalloc(c->nh, 8), *ccat = xcalloc(c->nx, 8);
    void *r = up(be, c->r, c->nr, MEM_PARAM), *s = up(be, c->s0, c->ns, MEM_F32);
    int had_s0 = c->s0 != NULL;
    for (int t0 = 0; t0 < T;) {
        int n = t0 ? 1 : T1;
        SlstmDims dn = *d;
        dn.T = n;
        double *xs = xcalloc((size_t)B * n * 4 * D, 8);
        for (int b = 0; b < B; b++)
            memcpy(xs + (size_t)b * n * 4 * D, c->x + ((size_t)b * T + t0) * 4 * D, sizeof(double) * n * 4 * D);
        void *x = up(be, xs, (size_t)B * n * 4 * D, MEM_ACT), *h = up(be, NULL, (size_t)B * n * D, MEM_ACT),
             *cache = up(be, NULL, (size_t)B * n * 4 * D, MEM_F32);
        SlstmFwd f = {x, r, (t0 || had_s0) ? s : NULL, h, cache, s};
        CHECK(!be->slstm->fwd(be, &dn, &f), "%s fwd: %s", be->name, mn_last_error());
        double *hh = down(be, h, (size_t)B * n * D, MEM_ACT), *cc = down(be, cache, (size_t)B * n * 4 * D, MEM_F32);
        for (int b = 0; b < B; b++) {
            memcpy(hcat + ((size_t)b * T + t0) * D, hh + (size_t)b * n * D, sizeof(double) * n * D);
            memcpy(ccat + ((size_t)b * T + t0) * 4 * D, cc + (size_t)b * n * 4 * D, sizeof(double) * n * 4 * D);
        }
        free(hh); free(cc); free(xs);
        be->free(be, x); be->free(be, h); be->free(be, cache);
        t0 += n;
    }
    double *sT = down(be, s, c->ns, MEM_F32);
    int same = !memcmp(hcat, all.h, sizeof(double) * c->nh) && !memcmp(ccat, all.cache, sizeof(double) * c->nx) &&
               !memcmp(sT, all.sT, sizeof(double) * c->ns);
    test_note("%s, s0 %s: prefill %d + %d steps vs one forward: h rel diff %.1e, state %.1e", be->name,
              had_s0 ? "given" : "NULL", T1, T - T1, rel_err64(hcat, all.h, c->nh), rel_err64(sT, all.sT, c->ns));
    CHECK(same, "%s: prefill then steps differs from one forward", be->name);
    free(hcat); free(ccat); free(sT);
    be->free(be, r); be->free(be, s);
    out_free(&all);
}

TEST(slstm_prefill_then_steps_is_exact) {
    SlstmDims ds[] = {{2, 12, 2, 4, 0}, {3, 9, 2, 64, 0}};
    for (int di = 0; di < 2; di++)
        for (int with_s0 = 0; with_s0 < 2; with_s0++) {
            SCase c;
            case_init(&c, ds[di], 60 + 2 * di + with_s0, -6, 6, 1, with_s0);
            prefill_case(backend_ref(), &c, 5);
            prefill_case(backend_cpu(), &c, 5);
            case_free(&c);
        }
}

// ---------------------------------------------------------------------------
// The float32 CPU core

TEST(slstm_cpu_matches_ref) {
    // Float32 against float64 on the same (float-rounded) inputs. Each step's pre-activations carry
    // ~sqrt(Dh) eps |r| of rounding (eps = 6e-8), exp, tanh and the divisions a few ulp; the
    // recurrence contracts (f' <= 1, R's mixing of norm ~1.5 damped by o and the gates' slopes), so
    // the errors do not grow with T: measured 6e-8 to 1.3e-7 in the forward, 1.4e-7 to 3.1e-7 in the
    // backward (the reverse recursion and dR's sums over B T tokens). 2e-6 and 5e-6 leave a margin
    // of 15 for other compilers and BLAS kernels; any wrong formula is O(1e-2) or more.
    struct {
        SlstmDims d;
        double ilo, ihi;
    } cases[] = {
        {{3, 37, 4, 5, 0}, -3, 3},
        {{2, 19, 4, 64, 0}, -3, 3},
        {{1, 29, 3, 7, 0}, -8, 8},
        {{3, 37, 4, 5, 0.15f}, -3, 3},  // the clip: some recurrent gradients beyond it, most within
    };
    for (int ci = 0; ci < 4; ci++) {
        const SlstmDims *d = &cases[ci].d;
        for (int with_s0 = 0; with_s0 < 2; with_s0++) {
            SCase c;
            case_init(&c, *d, 70 + 2 * ci + with_s0, cases[ci].ilo, cases[ci].ihi, 1.5, with_s0);
            int bwd = !with_s0;
            SOut r = srun(backend_ref(), &c, bwd), g = srun(backend_cpu(), &c, bwd);
            test_note("B %d T %d H %d Dh %d clip %g, s0 %s", d->B, d->T, d->H, d->Dh, (double)d->clip,
                      with_s0 ? "given" : "NULL");
            double eh = rel_err64(g.h, r.h, c.nh), ec = rel_err64(g.cache, r.cache, c.nx),
                   es = rel_err64(g.sT, r.sT, c.ns);
            test_note("h %.2e  cache %.2e  sT %.2e", eh, ec, es);
            CHECK_REL("h", eh, 2e-6);
            CHECK_REL("cache", ec, 2e-6);
            CHECK_REL("sT", es, 2e-6);
            if (bwd && d->clip > 0) {
                size_t over = 0, total = 0;
                dh_rec_stats(&c, r.dx, d->clip, &over, &total);
                test_note("%zu of %zu recurrent gradients clipped", over, total);
                CHECK(over > 0 && over < total, "the clip should clip some recurrent gradients, not all");
            }
            if (bwd) {
                double ex = rel_err64(g.dx, r.dx, c.nx), er = rel_err64(g.dr, r.dr, c.nr);
                test_note("dx %.2e  dR %.2e", ex, er);
                CHECK_REL("dx", ex, 5e-6);
                CHECK_REL("dR", er, 5e-6);
            }
            out_free(&r);
            out_free(&g);
            case_free(&c);
        }
    }
}

TEST(slstm_cpu_large_input_gate) {
    // |x_i| up to 1000: the float32 core stays finite (exp's arguments are r_i - m <= 0 and
    // lf - m <= 0) and follows the reference. The dominant gate's argument is exactly 0 (m is its
    // own exponent); the other's is a difference of numbers up to ~1000, rounded to ~1000 eps =
    // 6e-5 absolute, a relative error of that gate, which matters only where the two exponents are
    // close. Measured 1.1e-6 (h) to 2.7e-6 (dx); 3e-5 allowed, well under the 6e-5 bound and far
    // under a wrong formula's O(1e-2).
    SlstmDims d = {2, 30, 2, 8, 0};
    SCase c;
    case_init(&c, d, 80, -1000, 1000, 1, 0);
    SOut r = srun(backend_ref(), &c, 1), g = srun(backend_cpu(), &c, 1);
    CHECK(all_finite(g.h, c.nh) && all_finite(g.cache, c.nx) && all_finite(g.dx, c.nx) && all_finite(g.dr, c.nr),
          "cpu: non-finite results with |x_i| <= 1000");
    double eh = rel_err64(g.h, r.h, c.nh), ex = rel_err64(g.dx, r.dx, c.nx), er = rel_err64(g.dr, r.dr, c.nr);
    test_note("h %.2e  dx %.2e  dR %.2e", eh, ex, er);
    CHECK_REL("h", eh, 3e-5);
    CHECK_REL("dx", ex, 3e-5);
    CHECK_REL("dR", er, 3e-5);
    out_free(&r);
    out_free(&g);
    case_free(&c);
}

TEST(slstm_cpu_first_step_rule) {
    // From a zero state the first output is sigmoid(x_o) tanh(x_z): c = tanh(x_z), n = 1 exactly (as
    // in the reference), with x_i down to -120, where float's exp(x_i - lf) underflows and h would
    // be 0/0 without the rule. The core's expf and tanhf may be the vector ones (within 4 ulp of the
    // scalar ones the test calls): 2e-6 relative.
    SlstmDims d = {2, 2, 2, 16, 0};
    SCase c;
    case_init(&c, d, 90, -120, 120, 1, 0);
    int D = dim_D(&d), T = d.T;
    SOut g = srun(backend_cpu(), &c, 0);
    double worst = 0;
    int nonunit = 0;
    for (int b = 0; b < d.B; b++)
        for (int k = 0; k < D; k++) {
            const double *x = c.x + (size_t)b * T * 4 * D, *s = g.cache + (size_t)b * T * 4 * D;
            float want = 1 / (1 + expf(-(float)x[3 * D + k])) * tanhf((float)x[2 * D + k]);
            double h = g.h[(size_t)b * T * D + k];
            worst = fmax(worst, fabs(h - want) / fmax(fabs(want), 1e-30));
            if (s[2 * D + k] != 1 || s[3 * D + k] != x[k]) nonunit++;
        }
    test_note("max rel diff to sigmoid(x_o) tanh(x_z): %.2e", worst);
    CHECK(worst <= 2e-6, "first step: rel diff %.3g > 2e-6", worst);
    CHECK(!nonunit, "%d first-step cells with n != 1 or m != x_i", nonunit);
    CHECK(all_finite(g.h, c.nh), "non-finite output");
    out_free(&g);
    case_free(&c);
}

TEST(slstm_cpu_same_bits_any_thread_count) {
    // The heads run in parallel, each with the same arithmetic whoever runs it; with one head the
    // products themselves are cut by their sizes alone (blas.h). 1, 2 and 3 threads: the same bits.
    SlstmDims ds[] = {{3, 20, 4, 32, 0.5f}, {4, 300, 1, 128, 0}};
    int saved = omp_get_max_threads();
    for (int di = 0; di < 2; di++) {
        SCase c;
        case_init(&c, ds[di], 100 + di, -4, 4, 1.5, 0);
        SOut o[3];
        for (int th = 1; th <= 3; th++) {
            omp_set_num_threads(th);
            o[th - 1] = srun(backend_cpu(), &c, 1);
        }
        omp_set_num_threads(saved);
        for (int th = 2; th <= 3; th++) {
            int same = !memcmp(o[0].h, o[th - 1].h, 8 * c.nh) && !memcmp(o[0].cache, o[th - 1].cache, 8 * c.nx) &&
                       !memcmp(o[0].dx, o[th - 1].dx, 8 * c.nx) && !memcmp(o[0].dr, o[th - 1].dr, 8 * c.nr);
            CHECK(same, "H %d Dh %d: %d threads differ from 1", ds[di].H, ds[di].Dh, th);
        }
        for (int i = 0; i < 3; i++) out_free(&o[i]);
        case_free(&c);
    }
}

TEST(slstm_dr_accumulates) {
    // dR is a parameter gradient (+=): a second backward onto the first's dR doubles it (the same
    // products added to themselves; 1e-6 allows a different rounding of the sum), and dx is
    // overwritten (srun starts it at 1e30).
    SlstmDims d = {2, 9, 2, 6, 0};
    SCase c;
    case_init(&c, d, 110, -3, 3, 1, 0);
    const Backend *bes[2] = {backend_ref(), backend_cpu()};
    for (int bi = 0; bi < 2; bi++) {
        const Backend *be = bes[bi];
        void *x = up(be, c.x, c.nx, MEM_ACT), *r = up(be, c.r, c.nr, MEM_PARAM), *h = up(be, NULL, c.nh, MEM_ACT),
             *cache = up(be, NULL, c.nx, MEM_F32), *dh = up(be, c.w, c.nh, MEM_ACT), *dx = up(be, NULL, c.nx, MEM_ACT),
             *dr = up(be, NULL, c.nr, MEM_F32);
        SlstmFwd f = {x, r, NULL, h, cache, NULL};
        CHECK(!be->slstm->fwd(be, &d, &f), "%s", mn_last_error());
        SlstmBwd b = {x, r, cache, dh, dx, dr};
        CHECK(!be->slstm->bwd(be, &d, &b), "%s", mn_last_error());
        double *dx1 = down(be, dx, c.nx, MEM_ACT), *dr1 = down(be, dr, c.nr, MEM_F32);
        CHECK(!be->slstm->bwd(be, &d, &b), "%s", mn_last_error());
        double *dx2 = down(be, dx, c.nx, MEM_ACT), *dr2 = down(be, dr, c.nr, MEM_F32);
        for (size_t i = 0; i < c.nr; i++) dr1[i] *= 2;
        double er = rel_err64(dr2, dr1, c.nr), ex = rel_err64(dx2, dx1, c.nx);
        test_note("%s: second dR vs twice the first %.1e, second dx vs first %.1e", be->name, er, ex);
        CHECK_REL("dR accumulates", er, 1e-6);
        CHECK_REL("dx overwritten", ex, 0);
        free(dx1); free(dr1); free(dx2); free(dr2);
        be->free(be, x); be->free(be, r); be->free(be, h); be->free(be, cache); be->free(be, dh); be->free(be, dx);
        be->free(be, dr);
    }
    case_free(&c);
}

TEST(slstm_rejects_bad_arguments) {
    const Backend *bes[2] = {backend_ref(), backend_cpu()};
    for (int bi = 0; bi < 2; bi++) {
        const Backend *be = bes[bi];
        CHECK(be->slstm && be->slstm->fwd && be->slstm->bwd, "%s: no sLSTM core", be->name);
        void *buf = be->alloc(be, 4096, MEM_F32);
        SlstmDims ok = {1, 2, 2, 4, 0}, bad[] = {{0, 2, 2, 4, 0}, {1, 0, 2, 4, 0}, {1, 2, 0, 4, 0}, {1, 2, 2, 0, 0},
                                              {1, 2, 2, 4, -1}, {1, 2, 2, 4, INFINITY}};
        SlstmFwd f = {buf, buf, NULL, buf, NULL, NULL};
        SlstmBwd b = {buf, buf, buf, buf, buf, buf};
        for (int i = 0; i < 6; i++) {
            CHECK(be->slstm->fwd(be, &bad[i], &f) == MN_ERR_ARG, "%s: bad dims %d accepted by fwd", be->name, i);
            CHECK(be->slstm->bwd(be, &bad[i], &b) == MN_ERR_ARG, "%s: bad dims %d accepted by bwd", be->name, i);
        }
        SlstmFwd fn = f;
        fn.h = NULL;
        CHECK(be->slstm->fwd(be, &ok, &fn) == MN_ERR_ARG, "%s: fwd without h accepted", be->name);
        SlstmBwd bn = b;
        bn.cache = NULL;
        CHECK(be->slstm->bwd(be, &ok, &bn) == MN_ERR_ARG, "%s: bwd without cache accepted", be->name);
        CHECK(be->slstm->fwd(be, &ok, NULL) == MN_ERR_ARG, "%s: NULL io accepted", be->name);
        be->free(be, buf);
    }
}
