// The float32 CPU Mesa core (both forms) against the float64 reference.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "mesa_case.h"
#include "ref/ref.h"
#include "test.h"

// Float64 results of one case: outputs, solutions, final states, gradients.
typedef struct {
    double *o, *x, *hT, *gT;
    double *dq, *dk, *dv, *dg, *dbeta, *dlambda, *dh0, *dg0;
    double mean_steps;
} Result;

static void result_alloc(Result *r, const MesaCase *c) {
    r->o = xcalloc(c->nv, 8);
    r->x = xcalloc(c->nq, 8);
    r->hT = xcalloc(c->nh, 8);
    r->gT = xcalloc(c->ngs, 8);
    r->dq = xcalloc(c->nq, 8);
    r->dk = xcalloc(c->nq, 8);
    r->dv = xcalloc(c->nv, 8);
    r->dg = xcalloc(c->ng, 8);
    r->dbeta = xcalloc(c->ng, 8);
    r->dlambda = xcalloc(c->nl, 8);
    r->dh0 = xcalloc(c->nh, 8);
    r->dg0 = xcalloc(c->ngs, 8);
}

static void result_free(Result *r) {
    double *p[] = {r->o, r->x, r->hT, r->gT, r->dq, r->dk, r->dv, r->dg, r->dbeta, r->dlambda, r->dh0, r->dg0};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
}

// Exact-solve float64 forward and backward.
static void run_ref(const MesaCase *c, Result *r) {
    result_alloc(r, c);
    MesaFwd64 fw = {.q = c->q, .k = c->k, .v = c->v, .g = c->g, .beta = c->beta, .lambda = c->lambda,
                    .h0 = c->h0, .g0 = c->g0, .o = r->o, .x = r->x, .hT = r->hT, .gT = r->gT};
    if (ref_mesa_forward(&c->d, NULL, &fw)) die("%s", mn_last_error());
    MesaBwd64 bw = {.q = c->q, .k = c->k, .v = c->v, .g = c->g, .beta = c->beta, .lambda = c->lambda,
                    .h0 = c->h0, .g0 = c->g0, .x = r->x, .o = r->o, .dout = c->dout, .dhT = c->dhT, .dgT = c->dgT,
                    .dq = r->dq, .dk = r->dk, .dv = r->dv, .dg = r->dg, .dbeta = r->dbeta, .dlambda = r->dlambda,
                    .dh0 = r->dh0, .dg0 = r->dg0};
    if (ref_mesa_backward(&c->d, NULL, &bw)) die("%s", mn_last_error());
}

static void copy64(double *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = src ? src[i] : 0;
}

// Float32 forward (and backward unless fwd_only) through the public API.
static int run_cpu(const MesaCase *c, const MnSolver *s, Result *r, int fwd_only) {
    result_alloc(r, c);
    float *q = to_f32(c->q, c->nq), *k = to_f32(c->k, c->nq), *v = to_f32(c->v, c->nv), *g = to_f32(c->g, c->ng);
    float *beta = to_f32(c->beta, c->ng), *lambda = to_f32(c->lambda, c->nl), *h0 = to_f32(c->h0, c->nh);
    float *g0 = to_f32(c->g0, c->ngs), *dout = to_f32(c->dout, c->nv), *dhT = to_f32(c->dhT, c->nh);
    float *dgT = to_f32(c->dgT, c->ngs);
    float *o = xcalloc(c->nv, 4), *x = xcalloc(c->nq, 4), *hT = xcalloc(c->nh, 4), *gT = xcalloc(c->ngs, 4);
    int *steps = xcalloc(c->ng, sizeof(int));
    MnMesaFwd fw = {.q = q, .k = k, .v = v, .g = g, .beta = beta, .lambda = lambda, .h0 = h0, .g0 = g0,
                    .o = o, .x = x, .hT = hT, .gT = gT, .steps = steps};
    int status = mn_mesa_forward(&c->d, s, &fw);
    copy64(r->o, o, c->nv);
    copy64(r->x, x, c->nq);
    copy64(r->hT, hT, c->nh);
    copy64(r->gT, gT, c->ngs);
    r->mean_steps = 0;
    for (size_t i = 0; i < c->ng; i++) r->mean_steps += steps[i] / (double)c->ng;
    if (!status && !fwd_only) {
        float *dq = xcalloc(c->nq, 4), *dk = xcalloc(c->nq, 4), *dv = xcalloc(c->nv, 4), *dg = xcalloc(c->ng, 4);
        float *dbeta = xcalloc(c->ng, 4), *dl = xcalloc(c->nl, 4), *dh0 = xcalloc(c->nh, 4), *dg0 = xcalloc(c->ngs, 4);
        MnMesaBwd bw = {.q = q, .k = k, .v = v, .g = g, .beta = beta, .lambda = lambda, .h0 = h0, .g0 = g0,
                        .x = x, .o = o, .dout = dout, .dhT = dhT, .dgT = dgT, .dq = dq, .dk = dk, .dv = dv,
                        .dg = dg, .dbeta = dbeta, .dlambda = dl, .dh0 = h0 ? dh0 : NULL, .dg0 = g0 ? dg0 : NULL};
        status = mn_mesa_backward(&c->d, s, &bw);
        copy64(r->dq, dq, c->nq);
        copy64(r->dk, dk, c->nq);
        copy64(r->dv, dv, c->nv);
        copy64(r->dg, dg, c->ng);
        copy64(r->dbeta, dbeta, c->ng);
        copy64(r->dlambda, dl, c->nl);
        copy64(r->dh0, h0 ? dh0 : NULL, c->nh);
        copy64(r->dg0, g0 ? dg0 : NULL, c->ngs);
        free(dq); free(dk); free(dv); free(dg); free(dbeta); free(dl); free(dh0); free(dg0);
    }
    free(q); free(k); free(v); free(g); free(beta); free(lambda); free(h0); free(g0); free(dout); free(dhT);
    free(dgT); free(o); free(x); free(hT); free(gT); free(steps);
    return status;
}

typedef struct {
    int B, T, H, Dk, Dv, C;
} Shape;

// Awkward sizes: T < C, T not a multiple of C, Dk != Dv, several heads.
static const Shape shapes[] = {
    {1, 5, 1, 4, 4, 8},    {2, 37, 3, 8, 5, 16},  {3, 64, 2, 16, 24, 16},
    {2, 50, 2, 12, 6, 64}, {1, 130, 1, 32, 32, 64}, {2, 33, 2, 7, 3, 5},
};

static const char *form_name(MnForm f) { return f == MN_FORM_CHUNK ? "chunk" : "recurrent"; }

// Float32 vs the float64 exact solve. Inputs are drawn as the layer makes
// them: lambda >= 0.25 and ||H_t|| <~ beta/(1-gamma) ~ 10, so cond(A) <~ 50 and
// float32 (unit roundoff 6e-8) lands near 50 * 6e-8 = 3e-6: 1e-5 for the
// forward. CG runs 4 Dk steps, enough to converge to float32 precision.
#define FWD_TOL 1e-5
// The backward composes two solves and sums of products; measured <= 2e-6 on
// these draws, so 2e-5 leaves a factor of 10.
#define BWD_TOL 2e-5

static void compare_case(const Shape *sh, MnForm form, int with_states, int variant) {
    MnSeqDims d = {sh->B, sh->T, sh->H, sh->Dk, sh->Dv};
    MesaCase c;
    mesa_case_init(&c, d, 1000 + (uint64_t)variant * 7 + (uint64_t)sh->T, with_states, 3.0);
    Result ref, got;
    run_ref(&c, &ref);
    MnSolver s = mn_solver_default();
    s.max_steps = 4 * sh->Dk;
    s.form = form;
    s.chunk = sh->C;
    s.precond = variant & 1 ? MN_PRECOND_JACOBI : MN_PRECOND_NONE;
    s.init = variant & 2 ? MN_CG_INIT_JACOBI : MN_CG_INIT_ZERO;
    CHECK(!run_cpu(&c, &s, &got, 0), "%s", mn_last_error());
    struct {
        const char *name;
        double *a, *b;
        size_t n;
        double tol;
    } cmp[] = {{"o", got.o, ref.o, c.nv, FWD_TOL},          {"x", got.x, ref.x, c.nq, FWD_TOL},
               {"hT", got.hT, ref.hT, c.nh, FWD_TOL},       {"gT", got.gT, ref.gT, c.ngs, FWD_TOL},
               {"dq", got.dq, ref.dq, c.nq, BWD_TOL},       {"dk", got.dk, ref.dk, c.nq, BWD_TOL},
               {"dv", got.dv, ref.dv, c.nv, BWD_TOL},       {"dg", got.dg, ref.dg, c.ng, BWD_TOL},
               {"dbeta", got.dbeta, ref.dbeta, c.ng, BWD_TOL}, {"dlambda", got.dlambda, ref.dlambda, c.nl, BWD_TOL},
               {"dh0", got.dh0, ref.dh0, c.nh, BWD_TOL},    {"dg0", got.dg0, ref.dg0, c.ngs, BWD_TOL}};
    char line[512];
    int at = snprintf(line, sizeof line, "%-9s B=%d T=%3d H=%d Dk=%2d Dv=%2d C=%2d st=%d v=%d:", form_name(form), sh->B,
                      sh->T, sh->H, sh->Dk, sh->Dv, sh->C, with_states, variant);
    double worst_f = 0, worst_b = 0;
    for (size_t i = 0; i < sizeof cmp / sizeof cmp[0]; i++) {
        if (!with_states && (i == 10 || i == 11)) continue;
        double e = rel_err64(cmp[i].a, cmp[i].b, cmp[i].n);
        if (cmp[i].tol == FWD_TOL) worst_f = fmax(worst_f, e); else worst_b = fmax(worst_b, e);
        if (!(e <= cmp[i].tol))
            test_fail(__FILE__, __LINE__, "%s %s rel err %.3g > %.3g", line, cmp[i].name, e, cmp[i].tol);
    }
    snprintf(line + at, sizeof line - (size_t)at, " fwd %.1e bwd %.1e", worst_f, worst_b);
    test_note("%s", line);
    result_free(&ref);
    result_free(&got);
    mesa_case_free(&c);
}

TEST(mesa_cpu_chunk_matches_reference) {
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int st = 0; st < 2; st++) compare_case(&shapes[i], MN_FORM_CHUNK, st, (int)i % 4);
}

TEST(mesa_cpu_recurrent_matches_reference) {
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int st = 0; st < 2; st++) compare_case(&shapes[i], MN_FORM_RECURRENT, st, (int)(i + 1) % 4);
}

// Float32 tolerance mode: every system meets its tolerance (residual checked
// in float64 against the exact states) with fewer steps than fixed mode.
TEST(mesa_cpu_tolerance_mode) {
    MnSeqDims d = {2, 96, 2, 48, 16};
    MesaCase c;
    mesa_case_init(&c, d, 77, 0, 3.0);
    for (int f = 1; f <= 2; f++) {
        MnSolver s = mn_solver_default();
        s.form = (MnForm)f;
        s.max_steps = 200;
        s.tol = 1e-4f;
        s.chunk = 32;
        Result got;
        CHECK(!run_cpu(&c, &s, &got, 1), "%s", mn_last_error());
        double worst = 0;
        double *hs = xcalloc((size_t)d.Dk * d.Dk, 8);
        for (int b = 0; b < d.B; b++)
            for (int h = 0; h < d.H; h++) {
                memset(hs, 0, sizeof(double) * d.Dk * d.Dk);
                for (int t = 0; t < d.T; t++) {
                    size_t i = ((size_t)b * d.T + t) * d.H + h;
                    const double *k = c.k + i * d.Dk, *q = c.q + i * d.Dk, *x = got.x + i * d.Dk;
                    double gamma = exp(c.g[i]), rr = 0, qq = 0;
                    for (int a = 0; a < d.Dk; a++)
                        for (int e = 0; e < d.Dk; e++) hs[a * d.Dk + e] = gamma * hs[a * d.Dk + e] + c.beta[i] * k[a] * k[e];
                    for (int a = 0; a < d.Dk; a++) {
                        double ax = c.lambda[h * d.Dk + a] * x[a];
                        for (int e = 0; e < d.Dk; e++) ax += hs[a * d.Dk + e] * x[e];
                        rr += (q[a] - ax) * (q[a] - ax);
                        qq += q[a] * q[a];
                    }
                    worst = fmax(worst, sqrt(rr / qq));
                }
            }
        free(hs);
        test_note("%s: worst true relative residual %.2e (tol 1e-4), mean steps %.1f", form_name(s.form), worst,
                  got.mean_steps);
        // The recursive residual meets 1e-4; the true one differs by float32
        // rounding, ~cond * u = 50 * 6e-8 = 3e-6 relative: allow 1.1e-4.
        CHECK(worst <= 1.1e-4, "%s: true residual %.3g above the tolerance", form_name(s.form), worst);
        CHECK(got.mean_steps < 0.75 * d.Dk, "%s: %.1f mean steps, expected well under Dk = %d",
              form_name(s.form), got.mean_steps, d.Dk);
        result_free(&got);
    }
    mesa_case_free(&c);
}

// Prefill T1 tokens with the chunkwise form, then decode the rest one token at
// a time (recurrent form, states updated in place): equals one long forward.
TEST(mesa_cpu_decode_after_prefill_equals_forward) {
    MnSeqDims d = {2, 75, 3, 16, 12};
    MesaCase c;
    mesa_case_init(&c, d, 5, 0, 3.0);
    MnSolver s = mn_solver_default();
    s.max_steps = 64;
    s.chunk = 16;
    s.form = MN_FORM_CHUNK;
    Result full;
    CHECK(!run_cpu(&c, &s, &full, 1), "%s", mn_last_error());
    int T1 = 40, B = d.B, H = d.H, dk = d.Dk, dv = d.Dv;
    size_t per_tok = (size_t)H;
    float *h = xcalloc(c.nh, 4), *g = xcalloc(c.ngs, 4), *o = xcalloc(c.nv, 4), *x = xcalloc(c.nq, 4);
    // Gathers tokens [t0, t0+n) of every sequence into a [B, n, H, D] tensor.
    float *buf[5];
    for (int i = 0; i < 5; i++) buf[i] = xcalloc(c.nq + c.nv, 4);
    for (int t0 = 0; t0 < d.T;) {
        int n = t0 == 0 ? T1 : 1;
        const double *src[5] = {c.q, c.k, c.v, c.g, c.beta};
        int width[5] = {dk, dk, dv, 1, 1};
        for (int i = 0; i < 5; i++)
            for (int b = 0; b < B; b++)
                for (int t = 0; t < n; t++)
                    for (size_t e = 0; e < per_tok * width[i]; e++)
                        buf[i][((size_t)b * n + t) * per_tok * width[i] + e] =
                            (float)src[i][((size_t)b * d.T + t0 + t) * per_tok * width[i] + e];
        float *lam = to_f32(c.lambda, c.nl);
        float *oo = xcalloc((size_t)B * n * H * dv, 4), *xx = xcalloc((size_t)B * n * H * dk, 4);
        MnSeqDims dd = {B, n, H, dk, dv};
        MnSolver s2 = s;
        s2.form = t0 == 0 ? MN_FORM_CHUNK : MN_FORM_AUTO;
        MnMesaFwd fw = {.q = buf[0], .k = buf[1], .v = buf[2], .g = buf[3], .beta = buf[4], .lambda = lam,
                        .h0 = t0 ? h : NULL, .g0 = t0 ? g : NULL, .o = oo, .x = xx, .hT = h, .gT = g};
        CHECK(!mn_mesa_forward(&dd, &s2, &fw), "%s", mn_last_error());
        for (int b = 0; b < B; b++)
            for (int t = 0; t < n; t++)
                memcpy(o + ((size_t)b * d.T + t0 + t) * H * dv, oo + ((size_t)b * n + t) * H * dv, sizeof(float) * H * dv);
        free(lam); free(oo); free(xx);
        t0 += n;
    }
    double e = rel_err32(o, full.o, c.nv);
    test_note("prefill %d + decode %d tokens vs one forward: rel err %.2e", T1, d.T - T1, e);
    CHECK_REL("decoded outputs", e, 2e-6);  // two float32 paths, each ~3e-7 from exact
    for (int i = 0; i < 5; i++) free(buf[i]);
    free(h); free(g); free(o); free(x);
    result_free(&full);
    mesa_case_free(&c);
}

// Hard inputs: no forgetting (gamma = 1), 500 copies of one key, lambda at its
// lower bound. cond(A) = (250 + 0.25)/0.25 ~ 1000 here, so float32 answers can
// be ~1000 * 6e-8 = 6e-5 off: 5e-4 allows for it; the point is finite, sane output.
TEST(mesa_cpu_hard_inputs) {
    MnSeqDims d = {1, 520, 2, 16, 8};
    MesaCase c;
    mesa_case_init(&c, d, 9, 0, 3.0);
    for (size_t i = 0; i < c.ng; i++) c.g[i] = 0;                 // gamma = 1
    for (size_t i = 0; i < c.nl; i++) c.lambda[i] = 0.25;          // lower bound
    for (int t = 10; t < 510; t++)                                 // one key, 500 times
        for (int h = 0; h < d.H; h++) memcpy(c.k + ((size_t)t * d.H + h) * d.Dk, c.k + h * d.Dk, sizeof(double) * d.Dk);
    Result ref;
    run_ref(&c, &ref);
    for (int f = 1; f <= 2; f++)
        for (int pre = 0; pre < 2; pre++) {
            MnSolver s = mn_solver_default();
            s.form = (MnForm)f;
            s.max_steps = 100;
            s.precond = pre ? MN_PRECOND_JACOBI : MN_PRECOND_NONE;
            s.check = 1;
            Result got;
            CHECK(!run_cpu(&c, &s, &got, 0), "%s", mn_last_error());
            double eo = rel_err64(got.o, ref.o, c.nv), eq = rel_err64(got.dq, ref.dq, c.nq);
            double ek = rel_err64(got.dk, ref.dk, c.nq), eg = rel_err64(got.dg, ref.dg, c.ng);
            test_note("%s %s: o %.1e dq %.1e dk %.1e dg %.1e, mean steps %.1f", form_name(s.form),
                      pre ? "jacobi" : "plain", eo, eq, ek, eg, got.mean_steps);
            CHECK_REL("o", eo, 5e-4);
            CHECK_REL("dq", eq, 5e-4);
            CHECK_REL("dk", ek, 5e-4);
            CHECK_REL("dg", eg, 5e-4);
            result_free(&got);
        }
    result_free(&ref);
    mesa_case_free(&c);
}

TEST(mesa_cpu_rejects_bad_arguments) {
    MnSeqDims d = {1, 4, 1, 2, 2};
    float q[8] = {1, 0, 0, 1, 1, 1, 0.5f, 0}, o[8], x[8], g[4] = {0}, beta[4] = {0.5f, 0.5f, 0.5f, 0.5f};
    float lambda[2] = {1, 1}, bad_lambda[2] = {1, 0};
    MnSolver s = mn_solver_default();
    MnMesaFwd ok = {.q = q, .k = q, .v = q, .g = g, .beta = beta, .lambda = lambda, .o = o, .x = x};
    CHECK(mn_mesa_forward(&d, &s, &ok) == MN_OK, "valid call failed: %s", mn_last_error());
    const char *want[] = {"T must be > 0", "Dk must be > 0", "B must be > 0"};
    MnSeqDims bad[] = {{1, 0, 1, 2, 2}, {1, 4, 1, -3, 2}, {-1, 4, 1, 2, 2}};
    for (int i = 0; i < 3; i++) {
        CHECK(mn_mesa_forward(&bad[i], &s, &ok) == MN_ERR_ARG, "bad dims %d accepted", i);
        CHECK(strstr(mn_last_error(), want[i]), "message '%s' lacks '%s'", mn_last_error(), want[i]);
    }
    MnMesaFwd nul = ok;
    nul.k = NULL;
    CHECK(mn_mesa_forward(&d, &s, &nul) == MN_ERR_ARG && strstr(mn_last_error(), "k is NULL"), "NULL k: %s",
          mn_last_error());
    CHECK(mn_mesa_forward(&d, &s, NULL) == MN_ERR_ARG, "NULL io accepted");
    MnMesaFwd bl = ok;
    bl.lambda = bad_lambda;
    CHECK(mn_mesa_forward(&d, &s, &bl) == MN_ERR_ARG && strstr(mn_last_error(), "lambda[1]"), "lambda 0: %s",
          mn_last_error());
    MnSolver bs = s;
    bs.max_steps = -1;
    CHECK(mn_mesa_forward(&d, &bs, &ok) == MN_ERR_ARG && strstr(mn_last_error(), "max_steps"), "steps -1: %s",
          mn_last_error());
    bs = s;
    bs.init = MN_CG_INIT_GIVEN;
    CHECK(mn_mesa_forward(&d, &bs, &ok) == MN_ERR_ARG && strstr(mn_last_error(), "x0"), "GIVEN without x0: %s",
          mn_last_error());
    MnMesaBwd bw = {.q = q, .k = q, .v = q, .g = g, .beta = beta, .lambda = lambda, .x = x, .o = o};
    CHECK(mn_mesa_backward(&d, &s, &bw) == MN_ERR_ARG && strstr(mn_last_error(), "dout is NULL"),
          "backward without dout: %s", mn_last_error());
}

// NaN inputs: the solver stops (bounded steps, no hang) and check mode reports them.
TEST(mesa_cpu_nan_inputs_are_reported) {
    MnSeqDims d = {1, 70, 2, 8, 8};
    MesaCase c;
    mesa_case_init(&c, d, 3, 0, 3.0);
    c.q[5 * 8 + 3] = NAN;
    c.k[20 * 8 + 1] = NAN;
    for (int f = 1; f <= 2; f++) {
        MnSolver s = mn_solver_default();
        s.form = (MnForm)f;
        s.max_steps = 1000;
        s.chunk = 16;
        Result got;
        double t = mn_now();
        CHECK(run_cpu(&c, &s, &got, 0) == MN_OK, "unchecked run failed: %s", mn_last_error());
        CHECK(mn_now() - t < 5, "NaN inputs took %.1f s", mn_now() - t);
        CHECK(got.mean_steps <= 1000, "steps beyond the limit");
        result_free(&got);
        s.check = 1;
        CHECK(run_cpu(&c, &s, &got, 1) == MN_ERR_NUMERIC, "check mode let NaN through");
        CHECK(strstr(mn_last_error(), "q[43]"), "message '%s' does not name q[43]", mn_last_error());
        result_free(&got);
    }
    mesa_case_free(&c);
}
