// The mLSTM core (core/backend.h's MlstmOps): the float64 reference's three forward forms against
// each other, its backward and gates against finite differences, and the float32 CPU forms
// (recurrent, chunkwise) against the reference, with state hand-off and thread counts.
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

// Gate distributions (pre-activations; fg = logsigmoid(f~), ig = i~):
enum {
    G_REAL,      // f~ ~ N(3, 1), i~ ~ N(0, 2): a trained layer's range
    G_HARD,      // f~ ~ N(3, 1), i~ = +-20 (random signs)
    G_MODERATE,  // f~ ~ N(3, 1), i~ ~ N(0, 1): the unstabilised form stays well inside float64
    G_HUGE,      // f~ ~ N(3, 1), i~ = +-50: exp(i~) = 5e21, far outside float32
    G_MIXED,     // f~ ~ N(0, 1.5), i~ ~ N(-1, 2): the floor exp(-m) active at some tokens
};

typedef struct {
    MnSeqDims d;
    MlstmOpts o;
    size_t nq, nv, ng, nc, nn, nm;  // element counts: q/k, v, gates, c state, n state, m state
    double *q, *k, *v, *fg, *ig, *dh;
    double *c0, *n0, *m0;  // NULL, or a random initial state
} MCase;

static double log_sigmoid(double x) { return x >= 0 ? -log1p(exp(-x)) : x - log1p(exp(x)); }

static double *normals(MnRng *r, size_t n, double mu, double sd) {
    double *x = xcalloc(n ? n : 1, sizeof(double));
    for (size_t i = 0; i < n; i++) x[i] = mu + sd * mn_rng_normal(r);
    return x;
}

// Every input rounded to float, so that the float64 reference and the float32 forms see the same
// numbers and differ only by their arithmetic.
static void round_f32(double *x, size_t n) {
    if (x)
        for (size_t i = 0; i < n; i++) x[i] = (float)x[i];
}

// q, k, v ~ N(0, 1) (s = Dk^-1/2 makes s q.k ~ N(0, 1)), dh ~ N(0, 1), the gates as `kind`.
static void mcase_init(MCase *c, MnSeqDims d, int kind, unsigned long long seed, int with_state) {
    memset(c, 0, sizeof *c);
    c->d = d;
    c->o.scale = (float)(1 / sqrt((double)d.Dk));
    c->o.eps = 1e-6f;
    c->o.form = MN_FORM_AUTO;
    size_t ntok = (size_t)d.B * d.T * d.H;
    c->nq = ntok * d.Dk;
    c->nv = ntok * d.Dv;
    c->ng = ntok;
    c->nc = (size_t)d.B * d.H * d.Dv * d.Dk;
    c->nn = (size_t)d.B * d.H * d.Dk;
    c->nm = (size_t)d.B * d.H;
    MnRng r;
    mn_rng_seed(&r, seed);
    c->q = normals(&r, c->nq, 0, 1);
    c->k = normals(&r, c->nq, 0, 1);
    c->v = normals(&r, c->nv, 0, 1);
    c->dh = normals(&r, c->nv, 0, 1);
    double fmu = kind == G_MIXED ? 0 : 3, fsd = kind == G_MIXED ? 1.5 : 1;
    c->fg = normals(&r, ntok, fmu, fsd);
    for (size_t i = 0; i < ntok; i++) c->fg[i] = log_sigmoid(c->fg[i]);
    double imu = kind == G_MIXED ? -1 : 0, isd = kind == G_REAL || kind == G_MIXED ? 2 : 1;
    c->ig = normals(&r, ntok, imu, isd);
    if (kind == G_HARD || kind == G_HUGE)
        for (size_t i = 0; i < ntok; i++) c->ig[i] = (mn_rng_uniform(&r) < 0.5 ? -1 : 1) * (kind == G_HARD ? 20 : 50);
    if (with_state) {
        // a state as a run would leave it: m0 in [0, 5], C and n of O(1) (any state is valid)
        c->c0 = normals(&r, c->nc, 0, 1);
        c->n0 = normals(&r, c->nn, 0, 1);
        c->m0 = rand_doubles(seed + 99, c->nm, 0, 5);
    }
    double *all[] = {c->q, c->k, c->v, c->dh, c->fg, c->ig, c->c0, c->n0, c->m0};
    size_t ns[] = {c->nq, c->nq, c->nv, c->nv, ntok, ntok, c->nc, c->nn, c->nm};
    for (int i = 0; i < 9; i++) round_f32(all[i], ns[i]);
}

static void mcase_free(MCase *c) {
    free(c->q); free(c->k); free(c->v); free(c->fg); free(c->ig); free(c->dh);
    free(c->c0); free(c->n0); free(c->m0);
}

typedef struct {
    double *h, *nq, *m, *cT, *nT, *mT;
} MOut;

static void mout_alloc(MOut *o, const MCase *c) {
    o->h = xcalloc(c->nv, 8);
    o->nq = xcalloc(c->ng, 8);
    o->m = xcalloc(c->ng, 8);
    o->cT = xcalloc(c->nc, 8);
    o->nT = xcalloc(c->nn, 8);
    o->mT = xcalloc(c->nm, 8);
}

static void mout_free(MOut *o) { free(o->h); free(o->nq); free(o->m); free(o->cT); free(o->nT); free(o->mT); }

enum { F_REC, F_PAR, F_UNSTAB };

// The reference form `form` on c (the parallel and unstabilised forms from a zero state only;
// the unstabilised one writes h alone).
static void ref_run(const MCase *c, const MlstmOpts *o, int form, MOut *out) {
    MlstmFwd64 f = {c->q, c->k, c->v, c->fg, c->ig, c->c0, c->n0, c->m0, out->h, out->nq, out->m, out->cT, out->nT, out->mT};
    int st;
    if (form == F_REC) {
        st = ref_mlstm_forward(&c->d, o, &f);
    } else {
        f.cT = f.nT = f.mT = NULL;
        if (form == F_UNSTAB) f.nq = f.m = NULL;
        st = form == F_PAR ? ref_mlstm_parallel(&c->d, o, &f) : ref_mlstm_unstabilised(&c->d, o, &f);
    }
    if (st) die("%s", mn_last_error());
}

typedef struct {
    double *dq, *dk, *dv, *dfg, *dig;
} MGrads;

static void mgrads_alloc(MGrads *g, const MCase *c) {
    g->dq = xcalloc(c->nq, 8);
    g->dk = xcalloc(c->nq, 8);
    g->dv = xcalloc(c->nv, 8);
    g->dfg = xcalloc(c->ng, 8);
    g->dig = xcalloc(c->ng, 8);
}

static void mgrads_free(MGrads *g) { free(g->dq); free(g->dk); free(g->dv); free(g->dfg); free(g->dig); }

static void ref_bwd(const MCase *c, MGrads *g) {
    MlstmBwd64 b = {c->q, c->k, c->v, c->fg, c->ig, c->dh, g->dq, g->dk, g->dv, g->dfg, g->dig};
    if (ref_mlstm_backward(&c->d, &c->o, &b)) die("%s", mn_last_error());
}

static int finite64(const double *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

static int finite32(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

// ---------------------------------------------------------------------------
// The reference

// Two tokens by hand, one head, Dk = Dv = 1, s = 1, eps = 0:
//   t1: f = log 1/2, i = 1: m1 = max(log 1/2 + 0, 1) = 1, b = 1: C1 = v1 k1 = 2, n1 = k1 = 1;
//       q1 = 1: nq = 1 > exp(-1), h1 = 2 / 1 = 2
//   t2: f = log 1/2, i = 0: m2 = max(log 1/2 + 1, 0) = 1 - log 2, a = exp(f + m1 - m2) = 1,
//       b = exp(-m2) = 2/e: C2 = 2 + (2/e) 3 (-1) = 2 - 6/e, n2 = 1 - 2/e; q2 = 2: nq = 2 - 4/e = 0.53,
//       below the floor exp(-m2) = 2/e = 0.74, so h2 = 2 C2 / (2/e) = 2e - 6
TEST(mlstm_ref_hand_computed) {
    MnSeqDims d = {1, 2, 1, 1, 1};
    MlstmOpts o = {1, 0, MN_FORM_AUTO, 0};
    double q[] = {1, 2}, k[] = {1, -1}, v[] = {2, 3}, fg[] = {log(0.5), log(0.5)}, ig[] = {1, 0};
    double e = exp(1), h[2], nq[2], m[2], cT, nT, mT;
    double want_h[] = {2, 2 * e - 6}, want_nq[] = {1, 2 - 4 / e}, want_m[] = {1, 1 - log(2)};
    double want_c = 2 - 6 / e, want_n = 1 - 2 / e;
    MlstmFwd64 f = {q, k, v, fg, ig, NULL, NULL, NULL, h, nq, m, &cT, &nT, &mT};
    CHECK(!ref_mlstm_forward(&d, &o, &f), "%s", mn_last_error());
    CHECK_REL("h", rel_err64(h, want_h, 2), 1e-15);
    CHECK_REL("nq", rel_err64(nq, want_nq, 2), 1e-15);
    CHECK_REL("m", rel_err64(m, want_m, 2), 1e-15);
    CHECK_REL("state", fabs(cT - want_c) + fabs(nT - want_n) + fabs(mT - want_m[1]), 1e-15);
}

// The three float64 forms agree. Each output is a sum of at most T terms of O(1) (stabilised),
// formed in a different order by each form, with exponentials of arguments up to ~20 (relative
// error ~20 ulp), more where nq nearly cancels: up to 1.5e-13 measured; 1e-12 leaves a margin while
// a wrong term is O(1).
TEST(mlstm_ref_forms_agree) {
    MnSeqDims sizes[8] = {{1, 1, 1, 3, 2}, {2, 17, 3, 5, 7}, {1, 64, 2, 8, 4}, {3, 40, 1, 4, 9}};
    MnRng rng;  // and four drawn at random: B, H in 1..3, T in 1..80, Dk, Dv in 1..9
    mn_rng_seed(&rng, 5);
    for (int i = 4; i < 8; i++)
        sizes[i] = (MnSeqDims){1 + (int)(mn_rng_u64(&rng) % 3), 1 + (int)(mn_rng_u64(&rng) % 80),
                               1 + (int)(mn_rng_u64(&rng) % 3), 1 + (int)(mn_rng_u64(&rng) % 9),
                               1 + (int)(mn_rng_u64(&rng) % 9)};
    double worst[3] = {0, 0, 0};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (int kind = 0; kind < 3; kind++)  // G_REAL, G_HARD, G_MODERATE
            for (int ei = 0; ei < 2; ei++) {
                MCase c;
                mcase_init(&c, sizes[si], kind, 10 + si * 8 + kind * 2 + ei, 0);
                MlstmOpts o = c.o;
                o.eps = ei ? 1e-6f : 0;
                MOut rec, par;
                mout_alloc(&rec, &c);
                mout_alloc(&par, &c);
                ref_run(&c, &o, F_REC, &rec);
                ref_run(&c, &o, F_PAR, &par);
                double eh = rel_err64(par.h, rec.h, c.nv), en = rel_err64(par.nq, rec.nq, c.ng),
                       em = rel_err64(par.m, rec.m, c.ng);
                if (!(eh <= 1e-12 && en <= 1e-12 && em <= 1e-12))
                    test_fail(__FILE__, __LINE__, "size %zu gates %d eps %g: parallel vs recurrent h %.3g nq %.3g m %.3g",
                              si, kind, (double)o.eps, eh, en, em);
                worst[0] = fmax(worst[0], fmax(eh, fmax(en, em)));
                if (kind == G_MODERATE && ei == 0) {
                    MOut un;
                    mout_alloc(&un, &c);
                    ref_run(&c, &o, F_UNSTAB, &un);
                    double e = rel_err64(un.h, rec.h, c.nv);
                    CHECK(e <= 1e-12, "size %zu: unstabilised vs recurrent h %.3g", si, e);
                    worst[1] = fmax(worst[1], e);
                    mout_free(&un);
                }
                mout_free(&rec);
                mout_free(&par);
                mcase_free(&c);
            }
    test_note("worst rel err: parallel vs recurrent %.2e, unstabilised vs recurrent (eps 0) %.2e", worst[0], worst[1]);
}

// Loss = sum h . dh of the reference recurrence (for finite differences).
static double ref_loss(void *ctx) {
    const MCase *c = ctx;
    MOut o;
    mout_alloc(&o, c);
    ref_run(c, &c->o, F_REC, &o);
    double l = 0;
    for (size_t i = 0; i < c->nv; i++) l += o.h[i] * c->dh[i];
    mout_free(&o);
    return l;
}

// The exact gradient, m's path included, against central differences (h = 1e-6, truncation ~1e-12,
// rounding ~1e-10 relative on O(1) values): to 1e-7, while any wrong term is O(1) off. With eps = 0
// the output does not depend on m at all (the stop-gradient part alone is exact); with eps = 1e-6
// (the layers') m's path moves dig and dfg by ~1e-6 relative, which 1e-7 sees; with eps = 0.25 it
// moves them by O(1) (the test of the path itself). The MIXED gates put some tokens on the floor
// exp(-m) and some with nq < 0 (checked), so both branches of dnq are exercised; the HARD ones
// (+-20) make the input gate win the max at some tokens and the forget gate at others (checked).
TEST(mlstm_ref_backward_matches_finite_differences) {
    struct {
        MnSeqDims d;
        int kind;
    } cases[] = {{{1, 7, 2, 3, 2}, G_REAL}, {{2, 9, 1, 4, 3}, G_MIXED}, {{1, 6, 1, 2, 2}, G_HARD}};
    const float epss[] = {0, 1e-6f, 0.25f};
    int floor_total = 0, neg_total = 0, pos_total = 0, iwon = 0, fwon = 0;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (int ei = 0; ei < 3; ei++) {
            MCase c;
            mcase_init(&c, cases[ci].d, cases[ci].kind, 200 + ci, 0);
            c.o.eps = epss[ei];
            c.o.scale = 0.6f;
            MOut o;
            mout_alloc(&o, &c);
            ref_run(&c, &c.o, F_REC, &o);
            int on_floor = 0, negative = 0;
            for (size_t t = 0; t < c.ng; t++) {
                on_floor += fabs(o.nq[t]) < exp(-o.m[t]);
                negative += o.nq[t] < 0 && fabs(o.nq[t]) > exp(-o.m[t]);
                int first = t / c.d.H % c.d.T == 0;  // [B, T, H]: m_{t-1} is m[t - H], or 0
                int i_won = c.ig[t] >= c.fg[t] + (first ? 0 : o.m[t - c.d.H]);
                if (ei == 0) iwon += i_won, fwon += !i_won;
            }
            test_note("case %zu eps %g: %d of %zu tokens on the floor, %d with nq < 0 above it", ci, (double)c.o.eps,
                      on_floor, c.ng, negative);
            floor_total += on_floor;
            neg_total += negative;
            pos_total += (int)c.ng - on_floor - negative;
            MGrads g;
            mgrads_alloc(&g, &c);
            ref_bwd(&c, &g);
            fd_check("q", ref_loss, &c, c.q, g.dq, c.nq, 1e-7);
            fd_check("k", ref_loss, &c, c.k, g.dk, c.nq, 1e-7);
            fd_check("v", ref_loss, &c, c.v, g.dv, c.nv, 1e-7);
            fd_check("fg", ref_loss, &c, c.fg, g.dfg, c.ng, 1e-7);
            fd_check("ig", ref_loss, &c, c.ig, g.dig, c.ng, 1e-7);
            mgrads_free(&g);
            mout_free(&o);
            mcase_free(&c);
        }
    CHECK(floor_total > 0 && neg_total > 0 && pos_total > 0, "a branch is not exercised: %d tokens on the floor, "
          "%d with nq < 0, %d with nq > 0 above it", floor_total, neg_total, pos_total);
    CHECK(iwon > 0 && fwon > 0, "a branch of m's max is not exercised: i won %d times, f %d", iwon, fwon);
}

typedef struct {
    MCase *c;
    int head;
    double shift;
} ShiftCtx;

// ref_loss with every input gate of one head moved by `shift`.
static double shifted_loss(void *ctx) {
    ShiftCtx *x = ctx;
    for (size_t t = x->head; t < x->c->ng; t += x->c->d.H) x->c->ig[t] += x->shift;
    double l = ref_loss(x->c);
    for (size_t t = x->head; t < x->c->ng; t += x->c->d.H) x->c->ig[t] -= x->shift;
    return l;
}

// A head's input-gate bias gradient, sum_t dig_t. Moving every i of a head by the same c moves m_t by
// c too (where the max chain of m_t ends at an input gate, as it does past the first tokens) and
// leaves h_t as it is, eps included (in unstabilised terms h_t = num / (max(|nq|, 1) + eps e^{m_t})),
// except at tokens on the floor (max(|nq|, 1) = 1 then). So the sum is structurally small: with no
// token on the floor and every chain ending at an input gate (i ~ N(6, 2): the floor exp(-m) is far
// below nq) it is 0 exactly; the stop-gradient part alone misses the m path's share, ~eps / den of
// the terms (measured 1e-6 to 2e-6 of their sizes; with it, 1e-16, double rounding): to 1e-13 of the
// terms' sizes. With realistic gates (i ~ N(0, 2): some tokens on the floor carry the sum) against
// central differences in the shift, h = 1e-4 (truncation ~1e-8, rounding ~1e-16 |L| / h ~1e-11 of
// the sum; measured 1.7e-9): to 1e-7, where the stop-gradient sum was 3e-6 and 6e-5 off.
TEST(mlstm_ref_input_gate_sum) {
    MnSeqDims d = {2, 40, 2, 4, 3};
    for (int real = 0; real < 2; real++) {
        MCase c;
        mcase_init(&c, d, G_REAL, 210, 0);
        if (!real)
            for (size_t t = 0; t < c.ng; t++) c.ig[t] += 6;
        MOut o;
        mout_alloc(&o, &c);
        ref_run(&c, &c.o, F_REC, &o);
        int on_floor = 0, chain0 = 0;
        for (size_t t = 0; t < c.ng; t++) on_floor += fabs(o.nq[t]) < exp(-o.m[t]);
        for (size_t t = 0; t < c.ng; t++) chain0 += t / d.H % d.T == 0 && c.ig[t] < c.fg[t];  // f won at the first
        MGrads g;
        mgrads_alloc(&g, &c);
        ref_bwd(&c, &g);
        for (int h = 0; h < d.H; h++) {
            double sum = 0, terms = 0;
            for (size_t t = h; t < c.ng; t += d.H) sum += g.dig[t], terms += fabs(g.dig[t]);
            if (!real) {
                CHECK(on_floor == 0 && chain0 == 0, "%d tokens on the floor, %d first tokens where f won: the test's "
                      "premise fails", on_floor, chain0);
                test_note("no floor, head %d: sum of dig %.2e, the terms' sizes %.2e (%.1e of them)", h, sum, terms,
                          fabs(sum) / terms);
                CHECK(fabs(sum) <= 1e-13 * terms, "head %d: sum of dig %.3g, %.3g of the terms' sizes", h, sum,
                      fabs(sum) / terms);
            } else {
                ShiftCtx x = {&c, h, 1e-4};
                double lp = shifted_loss(&x);
                x.shift = -1e-4;
                double num = (lp - shifted_loss(&x)) / 2e-4, e = fabs(sum - num) / fabs(num);
                test_note("realistic, head %d: sum of dig %.6e, finite differences %.6e (rel err %.1e; the terms' sizes "
                          "%.1e; %d tokens on the floor)", h, sum, num, e, terms, on_floor);
                CHECK(e <= 1e-7, "head %d: sum of dig %.6e vs finite differences %.6e, rel err %.3g", h, sum, num, e);
            }
        }
        mgrads_free(&g);
        mout_free(&o);
        mcase_free(&c);
    }
}

typedef struct {
    double *a, *b, *wf, *wi;
    size_t n;
    double cap;
} GateCase;

static double gate_loss(void *ctx) {
    const GateCase *g = ctx;
    double *fg = xcalloc(g->n, 8), *ig = xcalloc(g->n, 8), l = 0;
    ref_mlstm_gates_fwd(fg, ig, g->a, g->b, g->n, g->cap);
    for (size_t i = 0; i < g->n; i++) l += fg[i] * g->wf[i] + ig[i] * g->wi[i];
    free(fg); free(ig);
    return l;
}

// The gates against finite differences (as above: 1e-7), with pre-activations in [-40, 40) so that
// the cap of 15 saturates some; the CPU gates against the reference to float rounding (a few ulp
// of O(1) values through tanh, log1p and exp: 1e-6).
TEST(mlstm_gates_match_finite_differences) {
    size_t n = 200;
    for (int ci = 0; ci < 2; ci++) {
        GateCase g = {rand_doubles(40 + ci, n, -40, 40), rand_doubles(50 + ci, n, -40, 40), rand_doubles(60, n, -1, 1),
                      rand_doubles(70, n, -1, 1), n, ci ? 15 : 0};
        round_f32(g.a, n);
        round_f32(g.b, n);
        double *da = xcalloc(n, 8), *db = xcalloc(n, 8);
        ref_mlstm_gates_bwd(da, db, g.wf, g.wi, g.a, g.b, n, g.cap);
        test_note("cap %g", g.cap);
        fd_check("a", gate_loss, &g, g.a, da, n, 1e-7);
        fd_check("b", gate_loss, &g, g.b, db, n, 1e-7);
        // the CPU's, through its op table
        const Backend *be = backend_cpu();
        float *a = floats_of(g.a, n), *b = floats_of(g.b, n), *wf = floats_of(g.wf, n), *wi = floats_of(g.wi, n);
        float *fg = xcalloc(n, 4), *ig = xcalloc(n, 4), *fda = xcalloc(n, 4), *fdb = xcalloc(n, 4);
        double *rfg = xcalloc(n, 8), *rig = xcalloc(n, 8);
        ref_mlstm_gates_fwd(rfg, rig, g.a, g.b, n, g.cap);
        CHECK(!be->mlstm->gates_fwd(be, fg, ig, a, b, n, (float)g.cap), "%s", mn_last_error());
        CHECK(!be->mlstm->gates_bwd(be, fda, fdb, wf, wi, a, b, n, (float)g.cap), "%s", mn_last_error());
        // wf, wi as floats: the reference's gradients from the same rounded numbers
        double *wf64 = xcalloc(n, 8), *wi64 = xcalloc(n, 8);
        for (size_t i = 0; i < n; i++) wf64[i] = wf[i], wi64[i] = wi[i];
        ref_mlstm_gates_bwd(da, db, wf64, wi64, g.a, g.b, n, g.cap);
        CHECK_REL("cpu fg", rel_err32(fg, rfg, n), 1e-6);
        CHECK_REL("cpu ig", rel_err32(ig, rig, n), 1e-6);
        CHECK_REL("cpu da", rel_err32(fda, da, n), 1e-6);
        CHECK_REL("cpu db", rel_err32(fdb, db, n), 1e-6);
        test_note("cpu vs ref: fg %.1e ig %.1e da %.1e db %.1e", rel_err32(fg, rfg, n), rel_err32(ig, rig, n),
                  rel_err32(fda, da, n), rel_err32(fdb, db, n));
        free(a); free(b); free(wf); free(wi); free(fg); free(ig); free(fda); free(fdb); free(rfg); free(rig);
        free(wf64); free(wi64); free(da); free(db);
        free(g.a); free(g.b); free(g.wf); free(g.wi);
    }
}

// ---------------------------------------------------------------------------
// The float32 CPU forms

typedef struct {
    float *q, *k, *v, *fg, *ig, *dh, *c0, *n0, *m0;
} MIn32;

static float *f32(const double *x, size_t n) { return x ? floats_of(x, n) : NULL; }

static void in32_make(MIn32 *x, const MCase *c) {
    x->q = f32(c->q, c->nq); x->k = f32(c->k, c->nq); x->v = f32(c->v, c->nv); x->fg = f32(c->fg, c->ng);
    x->ig = f32(c->ig, c->ng); x->dh = f32(c->dh, c->nv); x->c0 = f32(c->c0, c->nc); x->n0 = f32(c->n0, c->nn);
    x->m0 = f32(c->m0, c->nm);
}

static void in32_free(MIn32 *x) {
    free(x->q); free(x->k); free(x->v); free(x->fg); free(x->ig); free(x->dh); free(x->c0); free(x->n0); free(x->m0);
}

typedef struct {
    float *h, *nq, *m, *cT, *nT, *mT, *dq, *dk, *dv, *dfg, *dig;
} MOut32;

static void out32_alloc(MOut32 *o, const MCase *c) {
    o->h = xcalloc(c->nv, 4); o->nq = xcalloc(c->ng, 4); o->m = xcalloc(c->ng, 4); o->cT = xcalloc(c->nc, 4);
    o->nT = xcalloc(c->nn, 4); o->mT = xcalloc(c->nm, 4); o->dq = xcalloc(c->nq, 4); o->dk = xcalloc(c->nq, 4);
    o->dv = xcalloc(c->nv, 4); o->dfg = xcalloc(c->ng, 4); o->dig = xcalloc(c->ng, 4);
}

static void out32_free(MOut32 *o) {
    free(o->h); free(o->nq); free(o->m); free(o->cT); free(o->nT); free(o->mT);
    free(o->dq); free(o->dk); free(o->dv); free(o->dfg); free(o->dig);
}

static int cpu_fwd(const MCase *c, const MIn32 *x, const MlstmOpts *o, MOut32 *out) {
    const Backend *be = backend_cpu();
    MlstmFwd f = {x->q, x->k, x->v, x->fg, x->ig, x->c0, x->n0, x->m0, out->h, out->nq, out->m, out->cT, out->nT, out->mT};
    return be->mlstm->fwd(be, &c->d, o, &f);
}

static int cpu_bwd(const MCase *c, const MIn32 *x, const MlstmOpts *o, MOut32 *out) {
    const Backend *be = backend_cpu();
    MlstmBwd b = {x->q, x->k, x->v, x->fg, x->ig, out->h, out->nq, out->m, x->dh,
                  out->dq, out->dk, out->dv, out->dfg, out->dig};
    return be->mlstm->bwd(be, &c->d, o, &b);
}

enum { E_H, E_NQ, E_M, E_CT, E_NT, E_MT, E_DQ, E_DK, E_DV, E_DFG, E_DIG, E_SIG, E_N };
static const char *const err_names[E_N] = {"h", "nq", "m", "cT", "nT", "mT", "dq", "dk", "dv", "dfg", "dig", "sum dig"};

static double *f64(const float *x, size_t n) {
    double *y = xcalloc(n ? n : 1, 8);
    for (size_t i = 0; i < n; i++) y[i] = x[i];
    return y;
}

// ||a - b|| / max(||b||, scale)
static double rel_err_scaled(const double *a, const double *b, size_t n, double scale) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) return INFINITY;
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    return sqrt(num) / fmax(fmax(sqrt(den), scale), 1e-300);
}

static double norm2(const double *x, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += x[i] * x[i];
    return sqrt(s);
}

// The relative errors of (o, g) against the reference (r, rg); rg NULL: forward only (-1 for the
// gradients). dq, dk, dig and dfg are sums of the terms P_tj (.) that also make dv, and some of
// them cancel by structure, exactly: where the floor is inactive h_t does not change with the
// scale of q_t (so dq_t . q_t = 0), nor, for T = 1, with i_t or f_t (dq = dk = dig = dfg = 0).
// There float32 keeps ~1e-7 of the terms where float64 keeps 1e-16, so these errors are measured
// against the larger of their own norm and dv's (no such cancellation: the terms' size).
static void measure(const MCase *c, const MOut *o, const MGrads *g, const MOut *r, const MGrads *rg, double *e) {
    e[E_H] = rel_err64(o->h, r->h, c->nv);
    e[E_NQ] = rel_err64(o->nq, r->nq, c->ng);
    e[E_M] = rel_err64(o->m, r->m, c->ng);
    e[E_CT] = rel_err64(o->cT, r->cT, c->nc);
    e[E_NT] = rel_err64(o->nT, r->nT, c->nn);
    e[E_MT] = rel_err64(o->mT, r->mT, c->nm);
    for (int i = E_DQ; i < E_N; i++) e[i] = -1;
    if (!rg) return;
    double terms = norm2(rg->dv, c->nv);
    e[E_DQ] = rel_err_scaled(g->dq, rg->dq, c->nq, terms);
    e[E_DK] = rel_err_scaled(g->dk, rg->dk, c->nq, terms);
    e[E_DV] = rel_err64(g->dv, rg->dv, c->nv);
    e[E_DFG] = rel_err_scaled(g->dfg, rg->dfg, c->ng, terms);
    e[E_DIG] = rel_err_scaled(g->dig, rg->dig, c->ng, terms);
    // sum dig, per head over the sequences and tokens (an input-gate bias's gradient): structurally
    // small (moving every i of a head alike changes h only through the floor and eps, see
    // mlstm_ref_input_gate_sum), so measured against itself, where it is not structurally zero (at
    // least 2^-10 of the terms' norm; with +-20 gates it is ~e^-20 of them, below what float32
    // outputs resolve)
    int H = c->d.H;
    double *sums = xcalloc(2 * (size_t)H, 8);
    for (size_t t = 0; t < c->ng; t++) {
        sums[t % H] += g->dig[t];
        sums[H + t % H] += rg->dig[t];
    }
    e[E_SIG] = norm2(sums + H, H) >= 0x1p-10 * norm2(rg->dig, c->ng) ? rel_err64(sums, sums + H, H) : -1;
    free(sums);
}

// The reference forward (and from a zero state the backward) on c.
static void ref_all(const MCase *c, MOut *r, MGrads *g) {
    mout_alloc(r, c);
    ref_run(c, &c->o, F_REC, r);
    mgrads_alloc(g, c);
    if (!c->c0) ref_bwd(c, g);
}

// How much the reference's outputs move when every input moves by float32's rounding: q, k, v,
// dh and the state's C, n by a relative u 2^-24, the gates and m0 (exponents, whose rounding
// matters in absolute terms) by an absolute u 2^-24 (u uniform in [-1, 1)). A float32 computation
// of the same function cannot be expected much closer than this; where the outputs are
// ill-conditioned (a token's nq near 0 beside the terms it sums makes h_t = num / nq large and
// sensitive; with large input gates one key dominates each output), it is far above 1e-7.
static void ref_sensitivity(const MCase *c, const MOut *r, const MGrads *g, double *sens) {
    MCase p = *c;
    double **fields[] = {&p.q, &p.k, &p.v, &p.fg, &p.ig, &p.dh, &p.c0, &p.n0, &p.m0};
    size_t ns[] = {c->nq, c->nq, c->nv, c->ng, c->ng, c->nv, c->nc, c->nn, c->nm};
    MnRng rng;
    mn_rng_seed(&rng, 77);
    for (int f = 0; f < 9; f++) {
        const double *src = *fields[f];
        if (!src) continue;
        double *x = xcalloc(ns[f], 8);
        int gate = f == 3 || f == 4 || f == 8;  // fg, ig, m0: absolute
        for (size_t i = 0; i < ns[f]; i++) {
            double u = ldexp(2 * mn_rng_uniform(&rng) - 1, -24);
            x[i] = gate ? src[i] + u : src[i] * (1 + u);
        }
        *fields[f] = x;
    }
    MOut pr;
    MGrads pg;
    ref_all(&p, &pr, &pg);
    measure(c, &pr, &pg, r, c->c0 ? NULL : g, sens);
    mout_free(&pr);
    mgrads_free(&pg);
    for (int f = 0; f < 9; f++) free(*fields[f]);
}

// The CPU forward (form, chunk) and, from a zero state, the backward, as float64 arrays;
// returns 0 on a non-finite output.
static int cpu_all(const MCase *c, MnForm form, int chunk, MOut *r, MGrads *g) {
    MIn32 x;
    in32_make(&x, c);
    MOut32 o;
    out32_alloc(&o, c);
    MlstmOpts opts = c->o;
    opts.form = form;
    opts.chunk = chunk;
    CHECK(!cpu_fwd(c, &x, &opts, &o), "forward: %s", mn_last_error());
    if (!c->c0) CHECK(!cpu_bwd(c, &x, &opts, &o), "backward: %s", mn_last_error());
    float *all[] = {o.h, o.nq, o.m, o.cT, o.nT, o.mT, o.dq, o.dk, o.dv, o.dfg, o.dig};
    size_t ns[] = {c->nv, c->ng, c->ng, c->nc, c->nn, c->nm, c->nq, c->nq, c->nv, c->ng, c->ng};
    int finite = 1;
    for (int i = 0; i < E_SIG; i++) finite = finite && finite32(all[i], ns[i]);
    *r = (MOut){f64(o.h, c->nv), f64(o.nq, c->ng), f64(o.m, c->ng), f64(o.cT, c->nc), f64(o.nT, c->nn), f64(o.mT, c->nm)};
    *g = (MGrads){f64(o.dq, c->nq), f64(o.dk, c->nq), f64(o.dv, c->nv), f64(o.dfg, c->ng), f64(o.dig, c->ng)};
    out32_free(&o);
    in32_free(&x);
    return finite;
}

// Checks e[i] <= max(floor, K sens[i]) (K = SENS_FACTOR) and notes the errors (with the
// sensitivities in parentheses); returns the worst error.
enum { SENS_FACTOR = 10 };
static double check_errs(const char *what, const double *e, const double *sens, int finite, double floor_) {
    CHECK(finite, "%s: non-finite output", what);
    double w = 0;
    char line[768];
    int len = snprintf(line, sizeof line, "%-34s", what);
    for (int i = 0; i < E_N; i++) {
        if (e[i] < 0) continue;
        double tol = fmax(floor_, SENS_FACTOR * sens[i]);
        if (!(e[i] <= tol)) test_fail(__FILE__, __LINE__, "%s: %s rel err %.3g > %.3g (ref's own sensitivity %.3g)", what,
                                      err_names[i], e[i], tol, sens[i]);
        w = fmax(w, e[i]);
        if (len < (int)sizeof line - 32) len += snprintf(line + len, sizeof line - len, " %s %.1e(%.0e)", err_names[i], e[i], sens[i]);
    }
    test_note("%s", line);
    return w;
}

// Float32 against float64 on the same (float-rounded) inputs. Each output is a ratio num / den of
// sums of up to T terms of O(1) (the stabiliser keeps the largest weight at 1), formed with
// exponentials of float-rounded arguments. Tolerance: 1e-5, or SENS_FACTOR (10) times the
// reference's own change under a float32 rounding of its inputs (ref_sensitivity) where that is
// larger, i.e. where the outputs are ill-conditioned (large input gates, nq near 0). Measured on
// realistic gates: h and the states ~1e-6, the gradients up to 1.7e-5 (sensitivity 8e-6); on hard
// gates up to 5e-4 (h; sensitivity 1e-4: one token with nq = -0.003 and |h| = 900 carries it);
// wherever above 1e-5, at most 4.2 x the sensitivity. A wrong term is O(1) off either way.
// The input gates' sums (sum dig, see measure): 7e-9 to 1.9e-6, within 4.5 x the sensitivity (2e-8
// to 2e-6; the per-token float32 outputs' own rounding alone gives 5e-8 to 7e-7 of them); from dk's
// dot products or the R_tj alone they were 20 to 570 x. eps 0.25 makes m's path O(1) of dig and dfg
// (at eps = 1e-6 it is ~1e-6 of them, below the tolerance).
TEST(mlstm_cpu_matches_ref) {
    struct {
        MnSeqDims d;
        int chunk;
        float eps;
    } sizes[] = {
        {{2, 67, 3, 5, 7}, 16, 1e-6f},   // a tail of 3 after 4 chunks, B*H odd, Dk < Dv
        {{2, 67, 3, 5, 7}, 0, 0},        // T < the default chunk (64) + 3; (the floor alone)
        {{2, 130, 3, 5, 7}, 16, 1e-6f},  // many chunks, tail of 2
        {{1, 130, 2, 7, 5}, 0, 0},       // two chunks of 64 and a tail of 2, Dk > Dv
        {{1, 150, 2, 64, 64}, 0, 1e-6f}, // a layer's head size
        {{1, 1, 3, 8, 5}, 0, 0},         // T = 1
        {{1, 21, 1, 6, 6}, 1, 1e-6f},    // chunk 1
        {{2, 67, 3, 5, 7}, 16, 0.25f},   // m's path large
        {{1, 21, 1, 6, 6}, 1, 0.25f},
    };
    double worst[2] = {0, 0}, worst_ratio = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (int kind = 0; kind < 2; kind++)  // G_REAL, G_HARD
            for (int st = 0; st < 2; st++) {   // from zero (and the backward), or a given state
                MCase c;
                mcase_init(&c, sizes[si].d, kind, 1000 + si * 8 + kind * 4 + st * 2, st);
                c.o.eps = sizes[si].eps;
                MOut r;
                MGrads rg;
                ref_all(&c, &r, &rg);
                double sens[E_N];
                ref_sensitivity(&c, &r, &rg, sens);
                for (int fi = 0; fi < 2; fi++) {
                    MOut o;
                    MGrads g;
                    int finite = cpu_all(&c, fi ? MN_FORM_CHUNK : MN_FORM_RECURRENT, sizes[si].chunk, &o, &g);
                    double e[E_N];
                    measure(&c, &o, &g, &r, st ? NULL : &rg, e);
                    char what[128];
                    snprintf(what, sizeof what, "size %zu %s%s eps %g %s", si, kind ? "hard" : "real", st ? " state" : "",
                             (double)c.o.eps, fi ? "chunk" : "rec");
                    worst[fi] = fmax(worst[fi], check_errs(what, e, sens, finite, 1e-5));
                    for (int i = 0; i < E_N; i++)
                        if (e[i] > 1e-5) worst_ratio = fmax(worst_ratio, e[i] / sens[i]);
                    mout_free(&o);
                    mgrads_free(&g);
                }
                mout_free(&r);
                mgrads_free(&rg);
                mcase_free(&c);
            }
    test_note("worst rel err vs ref: recurrent %.2e, chunkwise %.2e; above 1e-5, at most %.1f x the ref's sensitivity",
              worst[0], worst[1], worst_ratio);
}

// Large input gates, |i~| = 50 with random signs over T = 1000: exp(50) = 5e21 would overflow a
// float32 state within a few tokens unstabilised. Every form stays finite and equals the
// unstabilised float64 form with eps = 0 (finite here: its states reach ~1e23): the float64 forms
// to 1e-12 (as mlstm_ref_forms_agree, with exponent arguments up to ~50: ~50 ulp each), the float32
// ones as in mlstm_cpu_matches_ref (1e-5, or 10 x the reference's own sensitivity to a float32
// rounding of the inputs), their backward against the reference's likewise.
TEST(mlstm_stabiliser_large_gates) {
    MnSeqDims d = {1, 1000, 2, 8, 8};
    MCase c;
    mcase_init(&c, d, G_HUGE, 3000, 0);
    c.o.eps = 0;
    MOut un, par, r;
    MGrads rg;
    mout_alloc(&un, &c);
    mout_alloc(&par, &c);
    ref_run(&c, &c.o, F_UNSTAB, &un);
    ref_run(&c, &c.o, F_PAR, &par);
    ref_all(&c, &r, &rg);
    CHECK(finite64(un.h, c.nv), "the unstabilised float64 form overflowed: the test's premise fails");
    CHECK(finite64(r.h, c.nv) && finite64(par.h, c.nv), "a float64 form is not finite");
    double er = rel_err64(r.h, un.h, c.nv), ep = rel_err64(par.h, un.h, c.nv);
    CHECK_REL("ref recurrent vs unstabilised", er, 1e-12);
    CHECK_REL("ref parallel vs unstabilised", ep, 1e-12);
    double mmax = 0;
    for (size_t i = 0; i < c.ng; i++) mmax = fmax(mmax, r.m[i]);
    test_note("ref vs unstabilised: recurrent %.2e, parallel %.2e (max m %.1f)", er, ep, mmax);
    double sens[E_N];
    ref_sensitivity(&c, &r, &rg, sens);
    for (int fi = 0; fi < 2; fi++) {
        MOut o;
        MGrads g;
        int finite = cpu_all(&c, fi ? MN_FORM_CHUNK : MN_FORM_RECURRENT, 0, &o, &g);
        double eu = rel_err64(o.h, un.h, c.nv), tol = fmax(1e-5, SENS_FACTOR * sens[E_H]), e[E_N];
        test_note("cpu %s h vs unstabilised: %.2e (tolerance %.1e)", fi ? "chunk" : "recurrent", eu, tol);
        CHECK(eu <= tol, "cpu %s vs unstabilised: h rel err %.3g > %.3g", fi ? "chunk" : "recurrent", eu, tol);
        measure(&c, &o, &g, &r, &rg, e);
        check_errs(fi ? "cpu chunk vs ref" : "cpu recurrent vs ref", e, sens, finite, 1e-5);
        mout_free(&o);
        mgrads_free(&g);
    }
    mout_free(&un);
    mout_free(&par);
    mout_free(&r);
    mgrads_free(&rg);
    mcase_free(&c);
}

// Tokens [t0, t1) of a [B, T, H, D] tensor, as a [B, t1 - t0, H, D] one (doubles).
static double *slice64(const double *x, const MnSeqDims *d, int D, int t0, int t1) {
    size_t row = (size_t)d->H * D, n = (size_t)(t1 - t0);
    double *y = xcalloc((size_t)d->B * n * row, 8);
    for (int b = 0; b < d->B; b++)
        memcpy(y + (size_t)b * n * row, x + ((size_t)b * d->T + t0) * row, sizeof(double) * n * row);
    return y;
}

static void unslice64(double *x, const double *y, const MnSeqDims *d, int D, int t0, int t1) {
    size_t row = (size_t)d->H * D, n = (size_t)(t1 - t0);
    for (int b = 0; b < d->B; b++)
        memcpy(x + ((size_t)b * d->T + t0) * row, y + (size_t)b * n * row, sizeof(double) * n * row);
}

// Runs c from its state over tokens [t0, t1) with `form` (CPU: chunk size `chunk`; ref: -1), the
// state handed on in st (c, n, m: read, then overwritten in place, aliased), outputs into h, nq, m.
static void run_piece(const MCase *c, int t0, int t1, int cpu, MnForm form, int chunk, double *st_c, double *st_n,
                      double *st_m, MOut *all) {
    MnSeqDims d = c->d;
    d.T = t1 - t0;
    double *q = slice64(c->q, &c->d, d.Dk, t0, t1), *k = slice64(c->k, &c->d, d.Dk, t0, t1),
           *v = slice64(c->v, &c->d, d.Dv, t0, t1), *fg = slice64(c->fg, &c->d, 1, t0, t1),
           *ig = slice64(c->ig, &c->d, 1, t0, t1);
    size_t nt = (size_t)d.B * d.T * d.H;
    double *h = xcalloc(nt * d.Dv, 8), *nq = xcalloc(nt, 8), *m = xcalloc(nt, 8);
    MlstmOpts o = c->o;
    o.form = form;
    o.chunk = chunk;
    if (!cpu) {
        MlstmFwd64 f = {q, k, v, fg, ig, st_c, st_n, st_m, h, nq, m, st_c, st_n, st_m};
        CHECK(!ref_mlstm_forward(&d, &o, &f), "%s", mn_last_error());
    } else {
        // the state through float: it stays float between pieces (st_* hold float-rounded values)
        float *fq = floats_of(q, nt * d.Dk), *fk = floats_of(k, nt * d.Dk), *fv = floats_of(v, nt * d.Dv),
              *ffg = floats_of(fg, nt), *fig = floats_of(ig, nt), *fc = floats_of(st_c, c->nc),
              *fn = floats_of(st_n, c->nn), *fm = floats_of(st_m, c->nm), *fh = xcalloc(nt * d.Dv, 4),
              *fnq = xcalloc(nt, 4), *fmm = xcalloc(nt, 4);
        const Backend *be = backend_cpu();
        MlstmFwd f = {fq, fk, fv, ffg, fig, fc, fn, fm, fh, fnq, fmm, fc, fn, fm};
        CHECK(!be->mlstm->fwd(be, &d, &o, &f), "%s", mn_last_error());
        for (size_t i = 0; i < nt * d.Dv; i++) h[i] = fh[i];
        for (size_t i = 0; i < nt; i++) nq[i] = fnq[i], m[i] = fmm[i];
        for (size_t i = 0; i < c->nc; i++) st_c[i] = fc[i];
        for (size_t i = 0; i < c->nn; i++) st_n[i] = fn[i];
        for (size_t i = 0; i < c->nm; i++) st_m[i] = fm[i];
        free(fq); free(fk); free(fv); free(ffg); free(fig); free(fc); free(fn); free(fm); free(fh); free(fnq); free(fmm);
    }
    unslice64(all->h, h, &c->d, d.Dv, t0, t1);
    unslice64(all->nq, nq, &c->d, 1, t0, t1);
    unslice64(all->m, m, &c->d, 1, t0, t1);
    free(q); free(k); free(v); free(fg); free(ig); free(h); free(nq); free(m);
}

// Prefill of P tokens, then decoding token by token with the state handed on (aliased in and
// out), equals one forward over all T, across chunk boundaries (P = 37 with chunks of 16), from a
// given initial state. The reference and the CPU's recurrent form do the same operations in the
// same order: bit for bit. The CPU's chunkwise prefill against its own one-piece run: the same
// chunks up to P, then recurrent steps where the one piece has chunks: float32 rounding (1e-5:
// each output ~1e-6 as in mlstm_cpu_matches_ref, on realistic gates). Also a prefill followed by
// a chunkwise continuation of 30 tokens (chunk 16 again, unaligned to the whole run's chunks).
TEST(mlstm_prefill_then_decode) {
    MnSeqDims d = {2, 67, 2, 5, 7};
    int P = 37;
    MCase c;
    mcase_init(&c, d, G_REAL, 4000, 1);
    for (int mode = 0; mode < 4; mode++) {  // ref, cpu recurrent, cpu chunk + decode, cpu chunk + chunk
        int cpu = mode > 0;
        MnForm form = mode == 1 ? MN_FORM_RECURRENT : MN_FORM_CHUNK;
        MOut one, pieces;
        mout_alloc(&one, &c);
        mout_alloc(&pieces, &c);
        double *sc = xcalloc(c.nc, 8), *sn = xcalloc(c.nn, 8), *sm = xcalloc(c.nm, 8);
        memcpy(sc, c.c0, 8 * c.nc); memcpy(sn, c.n0, 8 * c.nn); memcpy(sm, c.m0, 8 * c.nm);
        run_piece(&c, 0, d.T, cpu, form, 16, sc, sn, sm, &one);
        double *fc = xcalloc(c.nc, 8), *fn = xcalloc(c.nn, 8), *fm = xcalloc(c.nm, 8);
        memcpy(fc, sc, 8 * c.nc); memcpy(fn, sn, 8 * c.nn); memcpy(fm, sm, 8 * c.nm);
        memcpy(sc, c.c0, 8 * c.nc); memcpy(sn, c.n0, 8 * c.nn); memcpy(sm, c.m0, 8 * c.nm);
        run_piece(&c, 0, P, cpu, form, 16, sc, sn, sm, &pieces);
        if (mode == 3) {
            run_piece(&c, P, d.T, cpu, MN_FORM_CHUNK, 16, sc, sn, sm, &pieces);
        } else {
            for (int t = P; t < d.T; t++)  // AUTO: the recurrent step for one token
                run_piece(&c, t, t + 1, cpu, mode == 1 ? MN_FORM_RECURRENT : MN_FORM_AUTO, 0, sc, sn, sm, &pieces);
        }
        double e[] = {rel_err64(pieces.h, one.h, c.nv), rel_err64(pieces.nq, one.nq, c.ng),
                      rel_err64(pieces.m, one.m, c.ng), rel_err64(sc, fc, c.nc), rel_err64(sn, fn, c.nn),
                      rel_err64(sm, fm, c.nm)};
        const char *names[] = {"ref", "cpu recurrent", "cpu chunk + decode", "cpu chunk + chunk"};
        test_note("%-20s pieces vs one run: h %.1e nq %.1e m %.1e cT %.1e nT %.1e mT %.1e", names[mode], e[0], e[1],
                  e[2], e[3], e[4], e[5]);
        double tol = mode < 2 ? 0 : 1e-5;
        for (int i = 0; i < 6; i++)
            if (!(e[i] <= tol)) test_fail(__FILE__, __LINE__, "%s: output %d rel err %.3g > %.3g", names[mode], i, e[i], tol);
        free(sc); free(sn); free(sm); free(fc); free(fn); free(fm);
        mout_free(&one);
        mout_free(&pieces);
    }
    mcase_free(&c);
}

// The CPU results do not depend on the thread count (pairs are independent): bit for bit with 1,
// 2 and 3 threads, forward (both forms) and backward.
TEST(mlstm_cpu_threads_bitwise) {
    MnSeqDims d = {3, 70, 3, 8, 6};
    MCase c;
    mcase_init(&c, d, G_REAL, 5000, 0);
    MIn32 x;
    in32_make(&x, &c);
    MOut32 o[3];
    int saved = omp_get_max_threads();
    for (int fi = 0; fi < 2; fi++) {
        for (int ti = 0; ti < 3; ti++) {
            out32_alloc(&o[ti], &c);
            omp_set_num_threads(ti + 1);
            MlstmOpts opts = c.o;
            opts.form = fi ? MN_FORM_CHUNK : MN_FORM_RECURRENT;
            opts.chunk = 16;
            CHECK(!cpu_fwd(&c, &x, &opts, &o[ti]), "%s", mn_last_error());
            CHECK(!cpu_bwd(&c, &x, &opts, &o[ti]), "%s", mn_last_error());
        }
        omp_set_num_threads(saved);
        for (int ti = 1; ti < 3; ti++) {
            int same = !memcmp(o[ti].h, o[0].h, 4 * c.nv) && !memcmp(o[ti].nq, o[0].nq, 4 * c.ng) &&
                       !memcmp(o[ti].m, o[0].m, 4 * c.ng) && !memcmp(o[ti].dq, o[0].dq, 4 * c.nq) &&
                       !memcmp(o[ti].dk, o[0].dk, 4 * c.nq) && !memcmp(o[ti].dv, o[0].dv, 4 * c.nv) &&
                       !memcmp(o[ti].dfg, o[0].dfg, 4 * c.ng) && !memcmp(o[ti].dig, o[0].dig, 4 * c.ng);
            CHECK(same, "form %d: %d threads differ from 1", fi, ti + 1);
        }
        for (int ti = 0; ti < 3; ti++) out32_free(&o[ti]);
    }
    in32_free(&x);
    mcase_free(&c);
}

// Through both backends' op tables (buffers of each backend's own type, moved with upload and
// download), AUTO form and chunk, realistic gates: ref equals ref_mlstm_* exactly, cpu to 1e-5 (the
// well-conditioned floor of mlstm_cpu_matches_ref).
TEST(mlstm_backend_ops) {
    MnSeqDims d = {2, 70, 3, 8, 6};
    MCase c;
    mcase_init(&c, d, G_REAL, 6000, 0);
    MOut r;
    mout_alloc(&r, &c);
    ref_run(&c, &c.o, F_REC, &r);
    MGrads g;
    mgrads_alloc(&g, &c);
    ref_bwd(&c, &g);
    const Backend *bes[2] = {backend_ref(), backend_cpu()};
    for (int bi = 0; bi < 2; bi++) {
        const Backend *be = bes[bi];
        if (!be->mlstm || !be->mlstm->fwd || !be->mlstm->bwd) {
            CHECK(0, "%s: mlstm ops missing", be->name);
            continue;
        }
        struct {
            const double *src;
            size_t n;
            MemKind kind;
            void *buf;
        } t[] = {{c.q, c.nq, MEM_ACT},  {c.k, c.nq, MEM_ACT},  {c.v, c.nv, MEM_ACT},  {c.fg, c.ng, MEM_F32},
                 {c.ig, c.ng, MEM_F32}, {c.dh, c.nv, MEM_ACT}, {NULL, c.nv, MEM_ACT}, {NULL, c.ng, MEM_F32},
                 {NULL, c.ng, MEM_F32}, {NULL, c.nc, MEM_F32}, {NULL, c.nn, MEM_F32}, {NULL, c.nm, MEM_F32},
                 {NULL, c.nq, MEM_ACT}, {NULL, c.nq, MEM_ACT}, {NULL, c.nv, MEM_ACT}, {NULL, c.ng, MEM_F32},
                 {NULL, c.ng, MEM_F32}};
        enum { Q, K, V, FG, IG, DH, H, NQ, M, CT, NT, MT, DQ, DK, DV, DFG, DIG, NB };
        for (int i = 0; i < NB; i++) {
            t[i].buf = be->alloc(be, t[i].n, t[i].kind);
            if (t[i].src) CHECK(!be->upload(be, t[i].buf, t[i].src, t[i].n, t[i].kind), "%s", mn_last_error());
        }
        MlstmFwd f = {t[Q].buf, t[K].buf, t[V].buf, t[FG].buf, t[IG].buf, NULL, NULL, NULL,
                      t[H].buf, t[NQ].buf, t[M].buf, t[CT].buf, t[NT].buf, t[MT].buf};
        CHECK(!be->mlstm->fwd(be, &d, &c.o, &f), "%s forward: %s", be->name, mn_last_error());
        MlstmBwd b = {t[Q].buf, t[K].buf, t[V].buf, t[FG].buf, t[IG].buf, t[H].buf, t[NQ].buf, t[M].buf, t[DH].buf,
                      t[DQ].buf, t[DK].buf, t[DV].buf, t[DFG].buf, t[DIG].buf};
        CHECK(!be->mlstm->bwd(be, &d, &c.o, &b), "%s backward: %s", be->name, mn_last_error());
        const double *want[] = {r.h, r.nq, r.m, r.cT, r.nT, r.mT, g.dq, g.dk, g.dv, g.dfg, g.dig};
        double worst = 0;
        for (int i = 0; i < 11; i++) {
            size_t n = t[H + i].n;
            double *got = xcalloc(n, 8);
            CHECK(!be->download(be, got, t[H + i].buf, n, t[H + i].kind), "%s", mn_last_error());
            double e = rel_err64(got, want[i], n);
            if (!(e <= (bi ? 1e-5 : 0))) test_fail(__FILE__, __LINE__, "%s: %s rel err %.3g", be->name, err_names[i], e);
            worst = fmax(worst, e);
            free(got);
        }
        test_note("%s: worst rel err %.2e", be->name, worst);
        for (int i = 0; i < NB; i++) be->free(be, t[i].buf);
    }
    mgrads_free(&g);
    mout_free(&r);
    mcase_free(&c);
}

TEST(mlstm_rejects_bad_arguments) {
    MnSeqDims d = {1, 4, 1, 2, 2}, bad = d;
    bad.T = 0;
    float q[8] = {0}, k[8] = {0}, v[8] = {0}, fg[4] = {0}, ig[4] = {0}, h[8], nq[4], m[4], c0[4] = {0}, n0[2] = {0};
    float dq[8], dk[8], dv[8], dfg[4], dig[4];
    MlstmOpts o = {0.7f, 1e-6f, MN_FORM_AUTO, 0};
    const Backend *bes[2] = {backend_ref(), backend_cpu()};
    for (int bi = 0; bi < 2; bi++) {
        const Backend *be = bes[bi];
        // the buffers are only read after the checks pass; the ref backend's are doubles, so size them for it
        double Q[8] = {0}, K[8] = {0}, V[8] = {0}, FG[4] = {0}, IG[4] = {0}, Hh[8], NQ[4], M[4], C0[4] = {0}, N0[2] = {0};
        double DQ[8], DK[8], DV[8], DFG[4], DIG[4];
        void *pq = bi ? (void *)q : Q, *pk = bi ? (void *)k : K, *pv = bi ? (void *)v : V, *pf = bi ? (void *)fg : FG,
             *pi = bi ? (void *)ig : IG, *ph = bi ? (void *)h : Hh, *pn = bi ? (void *)nq : NQ, *pm = bi ? (void *)m : M,
             *pc0 = bi ? (void *)c0 : C0, *pn0 = bi ? (void *)n0 : N0;
        MlstmFwd f = {pq, pk, pv, pf, pi, NULL, NULL, NULL, ph, pn, pm, NULL, NULL, NULL};
        CHECK(be->mlstm->fwd(be, &d, &o, &f) == MN_OK, "%s: %s", be->name, mn_last_error());
        CHECK(be->mlstm->fwd(be, &bad, &o, &f) == MN_ERR_ARG, "%s: T = 0 accepted", be->name);
        CHECK(be->mlstm->fwd(be, &d, NULL, &f) == MN_ERR_ARG, "%s: NULL opts accepted", be->name);
        MlstmOpts r = o;
        r.chunk = -1;
        CHECK(be->mlstm->fwd(be, &d, &r, &f) == MN_ERR_ARG, "%s: chunk -1 accepted", be->name);
        r = o;
        r.form = (MnForm)9;
        CHECK(be->mlstm->fwd(be, &d, &r, &f) == MN_ERR_ARG, "%s: form 9 accepted", be->name);
        r = o;
        r.eps = -1;
        CHECK(be->mlstm->fwd(be, &d, &r, &f) == MN_ERR_ARG, "%s: eps -1 accepted", be->name);
        MlstmFwd nf = f;
        nf.h = NULL;
        CHECK(be->mlstm->fwd(be, &d, &o, &nf) == MN_ERR_ARG, "%s: NULL h accepted", be->name);
        nf = f;
        nf.c0 = pc0;
        nf.n0 = pn0;  // m0 missing
        CHECK(be->mlstm->fwd(be, &d, &o, &nf) == MN_ERR_ARG, "%s: a partial initial state accepted", be->name);
        MlstmBwd b = {pq, pk, pv, pf, pi, ph, pn, pm, ph, bi ? (void *)dq : DQ, bi ? (void *)dk : DK,
                      bi ? (void *)dv : DV, bi ? (void *)dfg : DFG, NULL};
        CHECK(be->mlstm->bwd(be, &d, &o, &b) == MN_ERR_ARG, "%s: NULL dig accepted", be->name);
        b.dig = bi ? (void *)dig : DIG;
        CHECK(be->mlstm->bwd(be, &d, &o, &b) == MN_OK, "%s: %s", be->name, mn_last_error());
    }
}
