// The gated linear-attention family (GLA / Mamba2, DeltaNet / Gated DeltaNet):
// the float64 reference against hand-computed numbers and finite differences,
// and the float32 CPU forms (recurrent, chunkwise) against the reference.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "core/backend.h"
#include "core/common.h"
#include "fd.h"
#include "ref/ref.h"
#include "test.h"

typedef struct {
    MnSeqDims d;
    MnLinOpts o;
    size_t nq, nv, ng, ns;                // element counts: q/k, v, g/beta, states
    double *q, *k, *v, *g, *beta, *s0;    // inputs (g, beta, s0 may be NULL)
    double *dout, *dsT;                   // L = sum(o dout) + sum(sT dsT)
} LinCase;

typedef struct {
    double *dq, *dk, *dv, *dg, *dbeta, *ds0;
} LinGrads;

static void l2_rows(double *x, size_t rows, int d) {
    for (size_t r = 0; r < rows; r++) {
        double s = 0;
        for (int j = 0; j < d; j++) s += x[r * d + j] * x[r * d + j];
        s = 1 / sqrt(s);
        for (int j = 0; j < d; j++) x[r * d + j] *= s;
    }
}

// Every input rounded to float, so that the float64 reference and the float32
// forms see the same numbers and differ only by their arithmetic.
static void round_f32(double *x, size_t n) {
    if (x)
        for (size_t i = 0; i < n; i++) x[i] = (float)x[i];
}

static void lin_case_round(LinCase *c) {
    round_f32(c->q, c->nq); round_f32(c->k, c->nq); round_f32(c->v, c->nv); round_f32(c->g, c->ng);
    round_f32(c->beta, c->ng); round_f32(c->s0, c->ns); round_f32(c->dout, c->nv); round_f32(c->dsT, c->ns);
}

// q, k L2-normalised (as the layer makes them), v in [-1, 1), g in [-0.5, -0.01)
// (gamma in (0.6, 0.99)), beta in [blo, bhi), s0 in [-0.5, 0.5).
static void lin_case_init(LinCase *c, MnSeqDims d, MnLinRule rule, unsigned long long seed, int with_g,
                          int with_beta, int with_s0, double blo, double bhi) {
    memset(c, 0, sizeof *c);
    c->d = d;
    c->o = mn_lin_opts_default(rule);
    size_t ntok = (size_t)d.B * d.T * d.H;
    c->nq = ntok * d.Dk;
    c->nv = ntok * d.Dv;
    c->ng = ntok;
    c->ns = (size_t)d.B * d.H * d.Dv * d.Dk;
    c->q = rand_doubles(seed, c->nq, -1, 1);
    c->k = rand_doubles(seed + 1, c->nq, -1, 1);
    l2_rows(c->q, ntok, d.Dk);
    l2_rows(c->k, ntok, d.Dk);
    c->v = rand_doubles(seed + 2, c->nv, -1, 1);
    if (with_g) c->g = rand_doubles(seed + 3, ntok, -0.5, -0.01);
    if (with_beta) c->beta = rand_doubles(seed + 4, ntok, blo, bhi);
    if (with_s0) c->s0 = rand_doubles(seed + 5, c->ns, -0.5, 0.5);
    c->dout = rand_doubles(seed + 6, c->nv, -1, 1);
    c->dsT = rand_doubles(seed + 7, c->ns, -1, 1);
    lin_case_round(c);
}

static void lin_case_free(LinCase *c) {
    free(c->q); free(c->k); free(c->v); free(c->g); free(c->beta); free(c->s0); free(c->dout); free(c->dsT);
}

static void grads_alloc(LinGrads *g, const LinCase *c) {
    g->dq = xcalloc(c->nq, 8);
    g->dk = xcalloc(c->nq, 8);
    g->dv = xcalloc(c->nv, 8);
    g->dg = c->g ? xcalloc(c->ng, 8) : NULL;
    g->dbeta = c->beta ? xcalloc(c->ng, 8) : NULL;
    g->ds0 = xcalloc(c->ns, 8);
}

static void grads_free(LinGrads *g) { free(g->dq); free(g->dk); free(g->dv); free(g->dg); free(g->dbeta); free(g->ds0); }

static void ref_fwd(const LinCase *c, double *o, double *sT) {
    LinFwd64 f = {c->q, c->k, c->v, c->g, c->beta, c->s0, o, sT};
    if (ref_lin_forward(&c->d, &c->o, &f)) die("%s", mn_last_error());
}

static void ref_bwd(const LinCase *c, LinGrads *g) {
    LinBwd64 b = {c->q, c->k, c->v, c->g, c->beta, c->s0, c->dout, c->dsT,
                  g->dq, g->dk, g->dv, g->dg, g->dbeta, g->ds0};
    if (ref_lin_backward(&c->d, &c->o, &b)) die("%s", mn_last_error());
}

static double ref_loss(void *ctx) {
    const LinCase *c = ctx;
    double *o = xcalloc(c->nv, 8), *sT = xcalloc(c->ns, 8), l = 0;
    ref_fwd(c, o, sT);
    for (size_t i = 0; i < c->nv; i++) l += o[i] * c->dout[i];
    for (size_t i = 0; i < c->ns; i++) l += sT[i] * c->dsT[i];
    free(o); free(sT);
    return l;
}

// ---------------------------------------------------------------------------
// The reference

TEST(lin_ref_matches_hand_computed) {
    // One head, T = 2, Dk = 2, Dv = 1, scale 1:
    //   k1 = (1,0), v1 = 2, q1 = (1,1), beta1 = 1/2, gamma1 = 1/2
    //   k2 = (1,1), v2 = 4, q2 = (1,-1), beta2 = 1/4, gamma2 = 1/2
    // GLA:   S1 = [1, 0], o1 = 1;  S2 = 1/2 [1,0] + 1/4 * 4 [1,1] = [1.5, 1], o2 = 0.5
    // DELTA: S1 = 1/2 (2 - 0) [1,0] = [1, 0], o1 = 1;  P = [0.5, 0], P k2 = 0.5,
    //        u2 = 1/4 (4 - 0.5) = 0.875, S2 = [1.375, 0.875], o2 = 0.5
    // Without g and beta (gamma = beta = 1):
    // GLA:   S1 = [2, 0], o1 = 2;  S2 = [6, 4], o2 = 2
    // DELTA: S1 = [2, 0], o1 = 2;  u2 = 4 - 2 = 2, S2 = [4, 2], o2 = 2
    MnSeqDims d = {1, 2, 1, 2, 1};
    double q[] = {1, 1, 1, -1}, k[] = {1, 0, 1, 1}, v[] = {2, 4}, g[] = {log(0.5), log(0.5)}, beta[] = {0.5, 0.25};
    struct {
        MnLinRule rule;
        int gated;
        double o[2], s[2];
    } want[] = {{MN_LIN_GLA, 1, {1, 0.5}, {1.5, 1}},
                {MN_LIN_DELTA, 1, {1, 0.5}, {1.375, 0.875}},
                {MN_LIN_GLA, 0, {2, 2}, {6, 4}},
                {MN_LIN_DELTA, 0, {2, 2}, {4, 2}}};
    for (int i = 0; i < 4; i++) {
        MnLinOpts o = mn_lin_opts_default(want[i].rule);
        double out[2], sT[2];
        LinFwd64 f = {q, k, v, want[i].gated ? g : NULL, want[i].gated ? beta : NULL, NULL, out, sT};
        CHECK(!ref_lin_forward(&d, &o, &f), "%s", mn_last_error());
        CHECK_REL("o (hand-computed)", rel_err64(out, want[i].o, 2), 1e-15);
        CHECK_REL("sT (hand-computed)", rel_err64(sT, want[i].s, 2), 1e-15);
    }
}

TEST(lin_ref_backward_matches_finite_differences) {
    // Central differences with h = 1e-6 on O(1) values: truncation ~h^2 = 1e-12,
    // rounding ~1e-16 / 1e-6 = 1e-10 relative; 1e-7 leaves a wide margin while any
    // wrong term (O(1) relative) fails by orders of magnitude.
    MnSeqDims d = {1, 5, 3, 3, 2};
    for (int rule = 0; rule < 2; rule++)
        for (int gated = 0; gated < 4; gated++) {  // bit 0: g given, bit 1: beta given
            LinCase c;
            lin_case_init(&c, d, (MnLinRule)rule, 100 + 10 * rule + gated, gated & 1, gated >> 1, 1, 0.2, 1.5);
            c.o.scale = 0.7f;
            LinGrads gr;
            grads_alloc(&gr, &c);
            ref_bwd(&c, &gr);
            test_note("rule %d, g %s, beta %s", rule, c.g ? "given" : "NULL", c.beta ? "given" : "NULL");
            fd_check("q", ref_loss, &c, c.q, gr.dq, c.nq, 1e-7);
            fd_check("k", ref_loss, &c, c.k, gr.dk, c.nq, 1e-7);
            fd_check("v", ref_loss, &c, c.v, gr.dv, c.nv, 1e-7);
            fd_check("s0", ref_loss, &c, c.s0, gr.ds0, c.ns, 1e-7);
            if (c.g) fd_check("g", ref_loss, &c, c.g, gr.dg, c.ng, 1e-7);
            if (c.beta) fd_check("beta", ref_loss, &c, c.beta, gr.dbeta, c.ng, 1e-7);
            grads_free(&gr);
            lin_case_free(&c);
        }
}

// Prefill of T tokens, then decode of one token from the state, equals one forward over T + 1.
TEST(lin_ref_prefill_then_decode_is_exact) {
    MnSeqDims d = {2, 9, 1, 4, 3}, d1 = d, d2 = d;
    d1.T = 8;
    d2.T = 1;
    for (int rule = 0; rule < 2; rule++) {
        LinCase c;
        lin_case_init(&c, d, (MnLinRule)rule, 300 + rule, 1, 1, 1, 0.1, 0.9);
        double *o = xcalloc(c.nv, 8), *sT = xcalloc(c.ns, 8), *o1 = xcalloc(c.nv, 8), *s1 = xcalloc(c.ns, 8);
        ref_fwd(&c, o, sT);
        // the two halves as separate [B, T', H, D] tensors
        size_t nt1 = (size_t)d.B * 8, nt2 = (size_t)d.B;
        double *q1 = xcalloc(nt1 * 4, 8), *k1 = xcalloc(nt1 * 4, 8), *v1 = xcalloc(nt1 * 3, 8), *g1 = xcalloc(nt1, 8),
               *b1 = xcalloc(nt1, 8), *q2 = xcalloc(nt2 * 4, 8), *k2 = xcalloc(nt2 * 4, 8), *v2 = xcalloc(nt2 * 3, 8),
               *g2 = xcalloc(nt2, 8), *b2 = xcalloc(nt2, 8), *oa = xcalloc(nt1 * 3, 8), *ob = xcalloc(nt2 * 3, 8);
        for (int b = 0; b < d.B; b++)
            for (int t = 0; t < 9; t++) {
                size_t src = (size_t)b * 9 + t;
                int first = t < 8;
                size_t dst = first ? (size_t)b * 8 + t : (size_t)b;
                memcpy((first ? q1 : q2) + dst * 4, c.q + src * 4, 4 * 8);
                memcpy((first ? k1 : k2) + dst * 4, c.k + src * 4, 4 * 8);
                memcpy((first ? v1 : v2) + dst * 3, c.v + src * 3, 3 * 8);
                (first ? g1 : g2)[dst] = c.g[src];
                (first ? b1 : b2)[dst] = c.beta[src];
            }
        LinFwd64 f1 = {q1, k1, v1, g1, b1, c.s0, oa, s1};
        CHECK(!ref_lin_forward(&d1, &c.o, &f1), "%s", mn_last_error());
        LinFwd64 f2 = {q2, k2, v2, g2, b2, s1, ob, s1};  // sT aliasing s0
        CHECK(!ref_lin_forward(&d2, &c.o, &f2), "%s", mn_last_error());
        for (int b = 0; b < d.B; b++) {
            memcpy(o1 + ((size_t)b * 9) * 3, oa + (size_t)b * 8 * 3, 8 * 3 * 8);
            memcpy(o1 + ((size_t)b * 9 + 8) * 3, ob + (size_t)b * 3, 3 * 8);
        }
        CHECK(rel_err64(o1, o, c.nv) == 0, "rule %d: prefill + decode outputs differ: %.3g", rule, rel_err64(o1, o, c.nv));
        CHECK(rel_err64(s1, sT, c.ns) == 0, "rule %d: prefill + decode states differ: %.3g", rule, rel_err64(s1, sT, c.ns));
        free(o); free(sT); free(o1); free(s1);
        free(q1); free(k1); free(v1); free(g1); free(b1); free(q2); free(k2); free(v2); free(g2); free(b2);
        free(oa); free(ob);
        lin_case_free(&c);
    }
}

// ---------------------------------------------------------------------------
// The float32 CPU forms against the reference

static float *f32(const double *x, size_t n) { return x ? floats_of(x, n) : NULL; }

typedef struct {
    double o, sT, dq, dk, dv, dg, dbeta, ds0;
} LinErrs;

static int finite_f(const float *x, size_t n) {
    if (x)
        for (size_t i = 0; i < n; i++)
            if (!isfinite(x[i])) return 0;
    return 1;
}

// Runs the CPU core (form, chunk) forward and backward on c and measures its
// relative errors against the reference; *finite is cleared on any non-finite output.
static LinErrs cpu_vs_ref(const LinCase *c, MnForm form, int chunk, int *finite) {
    LinErrs e;
    double *o = xcalloc(c->nv, 8), *sT = xcalloc(c->ns, 8);
    ref_fwd(c, o, sT);
    LinGrads r;
    grads_alloc(&r, c);
    ref_bwd(c, &r);
    float *q = f32(c->q, c->nq), *k = f32(c->k, c->nq), *v = f32(c->v, c->nv), *g = f32(c->g, c->ng),
          *beta = f32(c->beta, c->ng), *s0 = f32(c->s0, c->ns), *dout = f32(c->dout, c->nv), *dsT = f32(c->dsT, c->ns);
    float *fo = xcalloc(c->nv, 4), *fsT = xcalloc(c->ns, 4), *dq = xcalloc(c->nq, 4), *dk = xcalloc(c->nq, 4),
          *dv = xcalloc(c->nv, 4), *dg = c->g ? xcalloc(c->ng, 4) : NULL, *db = c->beta ? xcalloc(c->ng, 4) : NULL,
          *ds0 = xcalloc(c->ns, 4);
    MnLinOpts opts = c->o;
    opts.form = form;
    opts.chunk = chunk;
    MnLinFwd f = {q, k, v, g, beta, s0, fo, fsT};
    CHECK(!mn_lin_forward(&c->d, &opts, &f), "forward: %s", mn_last_error());
    MnLinBwd b = {q, k, v, g, beta, s0, dout, dsT, dq, dk, dv, dg, db, ds0};
    CHECK(!mn_lin_backward(&c->d, &opts, &b), "backward: %s", mn_last_error());
    e.o = rel_err32(fo, o, c->nv);
    e.sT = rel_err32(fsT, sT, c->ns);
    e.dq = rel_err32(dq, r.dq, c->nq);
    e.dk = rel_err32(dk, r.dk, c->nq);
    e.dv = rel_err32(dv, r.dv, c->nv);
    e.dg = c->g ? rel_err32(dg, r.dg, c->ng) : 0;
    e.dbeta = c->beta ? rel_err32(db, r.dbeta, c->ng) : 0;
    e.ds0 = rel_err32(ds0, r.ds0, c->ns);
    *finite = finite_f(fo, c->nv) && finite_f(fsT, c->ns) && finite_f(dq, c->nq) && finite_f(dk, c->nq) &&
              finite_f(dv, c->nv) && finite_f(dg, c->ng) && finite_f(db, c->ng) && finite_f(ds0, c->ns);
    free(q); free(k); free(v); free(g); free(beta); free(s0); free(dout); free(dsT);
    free(fo); free(fsT); free(dq); free(dk); free(dv); free(dg); free(db); free(ds0); free(o); free(sT);
    grads_free(&r);
    return e;
}

static double worst(const LinErrs *e) {
    double w = 0, x[] = {e->o, e->sT, e->dq, e->dk, e->dv, e->dg, e->dbeta, e->ds0};
    for (int i = 0; i < 8; i++) w = fmax(w, x[i]);
    return w;
}

static void check_errs(const char *what, const LinErrs *e, int finite, double tol) {
    CHECK(finite, "%s: non-finite output", what);
    const char *names[] = {"o", "sT", "dq", "dk", "dv", "dg", "dbeta", "ds0"};
    double x[] = {e->o, e->sT, e->dq, e->dk, e->dv, e->dg, e->dbeta, e->ds0};
    for (int i = 0; i < 8; i++)
        if (!(x[i] <= tol)) test_fail(__FILE__, __LINE__, "%s: %s rel err %.3g > %.3g", what, names[i], x[i], tol);
}

TEST(lin_cpu_matches_ref_awkward_sizes) {
    // Float32 against float64 on well-scaled inputs (unit q and k, |v| <= 1, gamma
    // in (0.6, 0.99), beta <= 1): each output is a sum of O(T) terms of O(1) whose
    // float32 rounding (6e-8 a step) adds up to ~1e-6 relative over these lengths;
    // 1e-5 leaves a margin of ~10 while any algebra error is O(1).
    struct {
        MnSeqDims d;
        int chunk;
    } sizes[] = {
        {{1, 1, 3, 8, 5}, 0},     // T = 1
        {{1, 13, 3, 8, 5}, 0},    // T < C (= 64)
        {{3, 37, 1, 16, 12}, 16}, // T not a multiple of C, B*H odd, Dk > Dv
        {{1, 130, 1, 12, 20}, 0}, // two full chunks of 64 and a tail of 2, Dk < Dv
        {{1, 21, 1, 6, 6}, 1},    // C = 1
        {{1, 150, 1, 64, 64}, 0}, // a layer's head size, full chunks of 64
    };
    double w[2] = {0, 0};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (int rule = 0; rule < 2; rule++)
            for (int gated = 0; gated < 4; gated++)  // bit 0: g given (and s0), bit 1: beta given
                for (int fi = 0; fi < 2; fi++) {
                    LinCase c;
                    lin_case_init(&c, sizes[si].d, (MnLinRule)rule, 500 + si * 8 + rule * 4 + gated, gated & 1,
                                  gated >> 1, gated & 1, 0.1, 1.0);
                    c.o.scale = gated ? 0.5f : 1.0f;
                    MnForm form = fi ? MN_FORM_CHUNK : MN_FORM_RECURRENT;
                    int finite;
                    LinErrs e = cpu_vs_ref(&c, form, sizes[si].chunk, &finite);
                    char what[128];
                    snprintf(what, sizeof what, "size %zu rule %d gates %d %s", si, rule, gated,
                             fi ? "chunk" : "recurrent");
                    check_errs(what, &e, finite, 1e-5);
                    w[fi] = fmax(w[fi], worst(&e));
                    lin_case_free(&c);
                }
    test_note("worst rel err vs ref: recurrent %.2e, chunkwise %.2e", w[0], w[1]);
}

// Prefill of T tokens then decode of one token from the final state equals one
// forward over T + 1. With B = 1 the first T tokens of [1, T+1, H, D] are a prefix.
TEST(lin_cpu_prefill_then_decode) {
    MnSeqDims d = {1, 101, 2, 16, 8}, d1 = d, d2 = d;
    d1.T = 100;
    d2.T = 1;
    for (int rule = 0; rule < 2; rule++) {
        LinCase c;
        lin_case_init(&c, d, (MnLinRule)rule, 700 + rule, 1, 1, 1, 0.1, 1.0);
        float *q = f32(c.q, c.nq), *k = f32(c.k, c.nq), *v = f32(c.v, c.nv), *g = f32(c.g, c.ng),
              *beta = f32(c.beta, c.ng), *s0 = f32(c.s0, c.ns);
        size_t p = (size_t)d1.T * d.H;  // tokens x heads of the prefix
        float *o = xcalloc(c.nv, 4), *sT = xcalloc(c.ns, 4), *o1 = xcalloc(c.nv, 4), *s1 = xcalloc(c.ns, 4);
        for (int fi = 0; fi < 2; fi++) {
            MnLinOpts opts = c.o;
            opts.form = fi ? MN_FORM_CHUNK : MN_FORM_RECURRENT;
            MnLinFwd all = {q, k, v, g, beta, s0, o, sT};
            CHECK(!mn_lin_forward(&d, &opts, &all), "%s", mn_last_error());
            MnLinFwd pre = {q, k, v, g, beta, s0, o1, s1};
            CHECK(!mn_lin_forward(&d1, &opts, &pre), "%s", mn_last_error());
            MnLinOpts dec = c.o;  // AUTO: the recurrent step for one token
            MnLinFwd one = {q + p * d.Dk, k + p * d.Dk, v + p * d.Dv, g + p, beta + p, s1, o1 + p * d.Dv, s1};
            CHECK(!mn_lin_forward(&d2, &dec, &one), "%s", mn_last_error());
            double eo = rel_err_ff(o1, o, c.nv), es = rel_err_ff(s1, sT, c.ns);
            test_note("rule %d, %s prefill + decode vs one forward: o %.2e, state %.2e", rule,
                      fi ? "chunkwise" : "recurrent", eo, es);
            if (fi == 0) {
                // the same operations in the same order: bit for bit
                CHECK(eo == 0 && es == 0, "rule %d: recurrent prefill + decode differs (%.3g, %.3g)", rule, eo, es);
            } else {
                // the chunkwise prefix against its own whole-sequence run: only the
                // last token's step differs in form (float32 rounding, as above)
                CHECK_REL("o (chunkwise prefill + decode)", eo, 1e-5);
                CHECK_REL("state (chunkwise prefill + decode)", es, 1e-5);
            }
        }
        free(q); free(k); free(v); free(g); free(beta); free(s0); free(o); free(sT); free(o1); free(s1);
        lin_case_free(&c);
    }
}

// Hard inputs: no decay over long inputs, one key repeated, the delta rule's
// beta near 2 (negative eigenvalues, L2-normalised keys). Everything stays finite
// and agrees with the float64 reference to 2e-5: the states stay bounded (the
// delta rule's transitions have eigenvalues in [1 - beta, 1] on unit keys), so
// the outputs keep ~5e-7; the chunkwise dg, a running sum inside each chunk of
// q . dq - v . dv terms that cancel in part, measured up to 4e-6 (one key
// repeated, where the true dg is small beside those terms).
TEST(lin_cpu_hard_inputs) {
    enum { NOGATE, REPEAT, BETA2, BETA2_REPEAT };
    const char *names[] = {"gamma = 1, T = 1000", "one key x 500", "beta in [1.9, 2)", "beta in [1.9, 2), one key"};
    for (int kind = 0; kind < 4; kind++)
        for (int rule = 0; rule < 2; rule++) {
            if (kind >= BETA2 && rule == MN_LIN_GLA) continue;
            MnSeqDims d = {1, kind == NOGATE ? 1000 : 500, 1, 16, 16};
            LinCase c;
            int b2 = kind >= BETA2;
            lin_case_init(&c, d, (MnLinRule)rule, 900 + kind * 2 + rule, 1, 1, 1, b2 ? 1.9 : 0.1, b2 ? 2.0 : 1.0);
            if (kind == NOGATE)
                for (size_t i = 0; i < c.ng; i++) c.g[i] = 0;
            if (kind == REPEAT || kind == BETA2_REPEAT)
                for (size_t t = 1; t < c.ng; t++) memcpy(c.k + t * d.Dk, c.k, sizeof(double) * d.Dk);
            for (int fi = 0; fi < 2; fi++) {
                int finite;
                LinErrs e = cpu_vs_ref(&c, fi ? MN_FORM_CHUNK : MN_FORM_RECURRENT, 0, &finite);
                char what[128];
                snprintf(what, sizeof what, "%s, rule %d, %s", names[kind], rule, fi ? "chunk" : "recurrent");
                test_note("%-44s worst rel err %.2e (o %.1e sT %.1e dq %.1e dk %.1e dv %.1e dg %.1e dbeta %.1e ds0 %.1e)",
                          what, worst(&e), e.o, e.sT, e.dq, e.dk, e.dv, e.dg, e.dbeta, e.ds0);
                check_errs(what, &e, finite, 2e-5);
            }
            lin_case_free(&c);
        }
}

// Through the backends' op tables (buffers of each backend's own type, moved with
// upload / download), with AUTO form and chunk: ref matches ref_lin_* exactly, cpu
// to the float32 tolerance above.
TEST(lin_backend_ops) {
    MnSeqDims d = {2, 70, 3, 8, 6};
    const Backend *bes[2] = {backend_ref(), backend_cpu()};
    for (int rule = 0; rule < 2; rule++) {
        LinCase c;
        lin_case_init(&c, d, (MnLinRule)rule, 1100 + rule, 1, 1, 1, 0.1, 1.0);
        double *o = xcalloc(c.nv, 8), *sT = xcalloc(c.ns, 8);
        ref_fwd(&c, o, sT);
        LinGrads r;
        grads_alloc(&r, &c);
        ref_bwd(&c, &r);
        for (int bi = 0; bi < 2; bi++) {
            const Backend *be = bes[bi];
            if (!be->lin->fwd || !be->lin->bwd) {
                CHECK(0, "%s: lin ops missing", be->name);
                continue;
            }
            struct {
                const double *src;
                size_t n;
                MemKind kind;
                void *buf;
            } t[] = {{c.q, c.nq, MEM_ACT},  {c.k, c.nq, MEM_ACT},    {c.v, c.nv, MEM_ACT},  {c.g, c.ng, MEM_F32},
                     {c.beta, c.ng, MEM_F32}, {c.s0, c.ns, MEM_F32}, {c.dout, c.nv, MEM_ACT}, {c.dsT, c.ns, MEM_F32},
                     {NULL, c.nv, MEM_ACT}, {NULL, c.ns, MEM_F32}, {NULL, c.nq, MEM_ACT}, {NULL, c.nq, MEM_ACT},
                     {NULL, c.nv, MEM_ACT}, {NULL, c.ng, MEM_F32}, {NULL, c.ng, MEM_F32}, {NULL, c.ns, MEM_F32}};
            enum { Q, K, V, G, BETA, S0, DOUT, DST, O, ST, DQ, DK, DV, DG, DBETA, DS0, NT };
            for (int i = 0; i < NT; i++) {
                t[i].buf = be->alloc(be, t[i].n, t[i].kind);
                if (t[i].src) CHECK(!be->upload(be, t[i].buf, t[i].src, t[i].n, t[i].kind), "%s", mn_last_error());
            }
            MnLinOpts opts = c.o;
            MnLinFwd f = {t[Q].buf, t[K].buf, t[V].buf, t[G].buf, t[BETA].buf, t[S0].buf, t[O].buf, t[ST].buf};
            CHECK(!be->lin->fwd(be, &d, &opts, &f), "%s forward: %s", be->name, mn_last_error());
            MnLinBwd b = {t[Q].buf, t[K].buf, t[V].buf, t[G].buf, t[BETA].buf, t[S0].buf, t[DOUT].buf, t[DST].buf,
                          t[DQ].buf, t[DK].buf, t[DV].buf, t[DG].buf, t[DBETA].buf, t[DS0].buf};
            CHECK(!be->lin->bwd(be, &d, &opts, &b), "%s backward: %s", be->name, mn_last_error());
            const double *want[] = {o, sT, r.dq, r.dk, r.dv, r.dg, r.dbeta, r.ds0};
            const char *names[] = {"o", "sT", "dq", "dk", "dv", "dg", "dbeta", "ds0"};
            for (int i = 0; i < 8; i++) {
                size_t n = t[O + i].n;
                double *got = xcalloc(n, 8);
                CHECK(!be->download(be, got, t[O + i].buf, n, t[O + i].kind), "%s", mn_last_error());
                double e = rel_err64(got, want[i], n);
                if (!(e <= (bi ? 1e-5 : 0)))
                    test_fail(__FILE__, __LINE__, "%s rule %d: %s rel err %.3g", be->name, rule, names[i], e);
                free(got);
            }
            for (int i = 0; i < NT; i++) be->free(be, t[i].buf);
        }
        free(o); free(sT);
        grads_free(&r);
        lin_case_free(&c);
    }
}

TEST(lin_rejects_bad_arguments) {
    MnSeqDims d = {1, 4, 1, 2, 2}, bad = d;
    bad.T = 0;
    float q[8] = {0}, k[8] = {0}, v[8] = {0}, o[8], g[4] = {0}, dq[8], dk[8], dv[8];
    MnLinOpts opts = mn_lin_opts_default(MN_LIN_DELTA);
    MnLinFwd f = {q, k, v, NULL, NULL, NULL, o, NULL};
    CHECK(mn_lin_forward(&d, &opts, &f) == MN_OK, "%s", mn_last_error());
    CHECK(mn_lin_forward(&bad, &opts, &f) == MN_ERR_ARG, "T = 0 accepted");
    CHECK(mn_lin_forward(&d, NULL, &f) == MN_ERR_ARG, "NULL opts accepted");
    MnLinOpts r = opts;
    r.rule = (MnLinRule)7;
    CHECK(mn_lin_forward(&d, &r, &f) == MN_ERR_ARG, "unknown rule accepted");
    r = opts;
    r.chunk = -1;
    CHECK(mn_lin_forward(&d, &r, &f) == MN_ERR_ARG, "chunk -1 accepted");
    r = opts;
    r.precision = (MnPrecision)3;
    CHECK(mn_lin_forward(&d, &r, &f) == MN_ERR_ARG && strstr(mn_last_error(), "precision"), "precision 3 accepted");
    for (int p = MN_PREC_AUTO; p <= MN_PREC_BF16; p++) {  // (the CPU computes in float32 whatever it says)
        r.precision = (MnPrecision)p;
        CHECK(mn_lin_forward(&d, &r, &f) == MN_OK, "precision %d: %s", p, mn_last_error());
    }
    MnLinFwd nf = f;
    nf.o = NULL;
    CHECK(mn_lin_forward(&d, &opts, &nf) == MN_ERR_ARG, "NULL o accepted");
    MnLinBwd b = {q, k, v, g, NULL, NULL, o, NULL, dq, dk, dv, NULL, NULL, NULL};
    CHECK(mn_lin_backward(&d, &opts, &b) == MN_ERR_ARG, "g without dg accepted");
}
