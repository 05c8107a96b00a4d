// The float64 reference of the Mesa core: against the golden file, finite
// differences, and its own CG.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/json.h"
#include "mesa_case.h"
#include "ref/ref.h"
#include "test.h"

#define GOLDEN "tests/data/mesa-core-small.json"

TEST(mesa_ref_matches_golden) {
    Json *j;
    if (json_parse_file(GOLDEN, &j)) {
        CHECK(0, "%s", mn_last_error());
        return;
    }
    MnSeqDims d = {1, (int)json_get(j, "T")->number, 1, (int)json_get(j, "Dk")->number,
                    (int)json_get(j, "Dv")->number};
    size_t T = (size_t)d.T, dk = (size_t)d.Dk, dv = (size_t)d.Dv;
    struct {
        const char *name;
        size_t n;
        double *p;
    } f[] = {{"q", T * dk}, {"k", T * dk}, {"v", T * dv}, {"g", T}, {"beta", T}, {"lambda", dk},
             {"o", T * dv}, {"x", T * dk}, {"H_final", dk * dk}, {"G_final", dv * dk}, {"dO", T * dv},
             {"dq", T * dk}, {"dk", T * dk}, {"dv", T * dv}, {"dg", T}, {"dbeta", T}, {"dlambda", dk}};
    enum { Q, K, V, G, BETA, LAMBDA, O, X, HF, GF, DO, DQ, DK, DV, DG, DBETA, DLAMBDA, NF };
    for (int i = 0; i < NF; i++) {
        f[i].p = xcalloc(f[i].n, sizeof(double));
        if (json_numbers(json_get(j, f[i].name), f[i].p, f[i].n, f[i].name)) CHECK(0, "%s", mn_last_error());
    }
    json_free(j);
    double *o = xcalloc(T * dv, 8), *x = xcalloc(T * dk, 8), *hT = xcalloc(dk * dk, 8), *gT = xcalloc(dv * dk, 8);
    MesaFwd64 fw = {.q = f[Q].p, .k = f[K].p, .v = f[V].p, .g = f[G].p, .beta = f[BETA].p, .lambda = f[LAMBDA].p,
                    .o = o, .x = x, .hT = hT, .gT = gT};
    CHECK(!ref_mesa_forward(&d, NULL, &fw), "forward: %s", mn_last_error());
    CHECK_REL("o", rel_err64(o, f[O].p, T * dv), 1e-12);
    CHECK_REL("x", rel_err64(x, f[X].p, T * dk), 1e-12);
    CHECK_REL("H_final", rel_err64(hT, f[HF].p, dk * dk), 1e-12);
    CHECK_REL("G_final", rel_err64(gT, f[GF].p, dv * dk), 1e-12);
    double *gr[6];
    size_t gn[6] = {T * dk, T * dk, T * dv, T, T, dk};
    for (int i = 0; i < 6; i++) gr[i] = xcalloc(gn[i], 8);
    MesaBwd64 bw = {.q = f[Q].p, .k = f[K].p, .v = f[V].p, .g = f[G].p, .beta = f[BETA].p, .lambda = f[LAMBDA].p,
                    .x = x, .o = o, .dout = f[DO].p, .dq = gr[0], .dk = gr[1], .dv = gr[2], .dg = gr[3],
                    .dbeta = gr[4], .dlambda = gr[5]};
    CHECK(!ref_mesa_backward(&d, NULL, &bw), "backward: %s", mn_last_error());
    const char *names[6] = {"dq", "dk", "dv", "dg", "dbeta", "dlambda"};
    for (int i = 0; i < 6; i++) {
        double e = rel_err64(gr[i], f[DQ + i].p, gn[i]);
        test_note("%-8s rel err %.2e", names[i], e);
        CHECK_REL(names[i], e, 1e-12);
        free(gr[i]);
    }
    for (int i = 0; i < NF; i++) free(f[i].p);
    free(o); free(x); free(hT); free(gT);
}

// L = sum(o dout) + sum(hT dhT) + sum(gT dgT) with the exact-solve forward.
static double loss64(const MesaCase *c) {
    size_t no = c->nv, nx = c->nq;
    double *o = xcalloc(no, 8), *x = xcalloc(nx, 8), *hT = xcalloc(c->nh, 8), *gT = xcalloc(c->ngs, 8);
    MesaFwd64 fw = {.q = c->q, .k = c->k, .v = c->v, .g = c->g, .beta = c->beta, .lambda = c->lambda,
                    .h0 = c->h0, .g0 = c->g0, .o = o, .x = x, .hT = hT, .gT = gT};
    if (ref_mesa_forward(&c->d, NULL, &fw)) die("%s", mn_last_error());
    double l = 0;
    for (size_t i = 0; i < no; i++) l += o[i] * c->dout[i];
    for (size_t i = 0; i < c->nh; i++) l += hT[i] * (c->dhT ? c->dhT[i] : 0);
    for (size_t i = 0; i < c->ngs; i++) l += gT[i] * (c->dgT ? c->dgT[i] : 0);
    free(o); free(x); free(hT); free(gT);
    return l;
}

// Central differences of loss64 in every element of p (n of them); symmetric
// perturbs (i,j) and (j,i) of dim x dim blocks together (for H_0).
static void numeric_grad(MesaCase *c, double *p, size_t n, double *out, int symmetric, int dim) {
    const double h = 1e-6;
    for (size_t i = 0; i < n; i++) {
        size_t mirror = i;
        if (symmetric) {
            size_t base = i / ((size_t)dim * dim) * dim * dim, e = i - base;
            mirror = base + (e % dim) * dim + e / dim;
        }
        double a = p[i], b = p[mirror];
        p[i] = a + h;
        if (mirror != i) p[mirror] = b + h;
        double lp = loss64(c);
        p[i] = a - h;
        if (mirror != i) p[mirror] = b - h;
        double lm = loss64(c);
        p[i] = a;
        p[mirror] = b;
        out[i] = (lp - lm) / (2 * h);
    }
}

TEST(mesa_ref_backward_matches_finite_differences) {
    MnSeqDims d = {2, 7, 2, 4, 3};
    MesaCase c;
    mesa_case_init(&c, d, 11, 1, 1.0);
    double *o = xcalloc(c.nv, 8), *x = xcalloc(c.nq, 8);
    MesaFwd64 fw = {.q = c.q, .k = c.k, .v = c.v, .g = c.g, .beta = c.beta, .lambda = c.lambda,
                    .h0 = c.h0, .g0 = c.g0, .o = o, .x = x};
    CHECK(!ref_mesa_forward(&d, NULL, &fw), "%s", mn_last_error());
    double *dq = xcalloc(c.nq, 8), *dk = xcalloc(c.nq, 8), *dv = xcalloc(c.nv, 8), *dg = xcalloc(c.ng, 8),
           *dbeta = xcalloc(c.ng, 8), *dl = xcalloc(c.nl, 8), *dh0 = xcalloc(c.nh, 8), *dg0 = xcalloc(c.ngs, 8);
    MesaBwd64 bw = {.q = c.q, .k = c.k, .v = c.v, .g = c.g, .beta = c.beta, .lambda = c.lambda, .h0 = c.h0,
                    .g0 = c.g0, .x = x, .o = o, .dout = c.dout, .dhT = c.dhT, .dgT = c.dgT, .dq = dq, .dk = dk,
                    .dv = dv, .dg = dg, .dbeta = dbeta, .dlambda = dl, .dh0 = dh0, .dg0 = dg0};
    CHECK(!ref_mesa_backward(&d, NULL, &bw), "%s", mn_last_error());
    // dL/dH_0 for a symmetric H_0: perturbing (i,j) and (j,i) together gives dh0_ij + dh0_ji.
    double *dh0_sym = xcalloc(c.nh, 8);
    for (size_t i = 0; i < c.nh; i++) {
        size_t base = i / ((size_t)d.Dk * d.Dk) * d.Dk * d.Dk, e = i - base;
        size_t m = base + (e % d.Dk) * d.Dk + e / d.Dk;
        dh0_sym[i] = m == i ? dh0[i] : dh0[i] + dh0[m];
    }
    struct {
        const char *name;
        double *p, *grad;
        size_t n;
        int sym;
    } in[] = {{"q", c.q, dq, c.nq, 0},         {"k", c.k, dk, c.nq, 0},          {"v", c.v, dv, c.nv, 0},
              {"g", c.g, dg, c.ng, 0},         {"beta", c.beta, dbeta, c.ng, 0}, {"lambda", c.lambda, dl, c.nl, 0},
              {"h0", c.h0, dh0_sym, c.nh, 1}, {"g0", c.g0, dg0, c.ngs, 0}};
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) {
        double *num = xcalloc(in[i].n, 8);
        numeric_grad(&c, in[i].p, in[i].n, num, in[i].sym, d.Dk);
        // Central differences with h = 1e-6 on O(1) values: truncation ~1e-12,
        // cancellation ~1e-16/1e-6 = 1e-10; 1e-7 leaves a wide margin.
        double e = rel_err64(in[i].grad, num, in[i].n);
        test_note("d%-7s rel err vs finite differences %.2e", in[i].name, e);
        CHECK_REL(in[i].name, e, 1e-7);
        free(num);
    }
    free(o); free(x); free(dq); free(dk); free(dv); free(dg); free(dbeta); free(dl); free(dh0); free(dg0);
    free(dh0_sym);
    mesa_case_free(&c);
}

TEST(mesa_ref_cg_with_dk_steps_is_exact) {
    MnSeqDims d = {2, 13, 2, 8, 5};
    MesaCase c;
    mesa_case_init(&c, d, 5, 1, 3.0);
    double *o = xcalloc(c.nv, 8), *x = xcalloc(c.nq, 8), *o2 = xcalloc(c.nv, 8), *x2 = xcalloc(c.nq, 8);
    MesaFwd64 fw = {.q = c.q, .k = c.k, .v = c.v, .g = c.g, .beta = c.beta, .lambda = c.lambda,
                    .h0 = c.h0, .g0 = c.g0, .o = o, .x = x};
    CHECK(!ref_mesa_forward(&d, NULL, &fw), "%s", mn_last_error());
    MnSolver variants[3] = {mn_solver_default(), mn_solver_default(), mn_solver_default()};
    variants[1].precond = MN_PRECOND_JACOBI;
    variants[2].precond = MN_PRECOND_JACOBI;
    variants[2].init = MN_CG_INIT_JACOBI;
    for (int v = 0; v < 3; v++) {
        variants[v].max_steps = d.Dk;  // CG is exact in n steps (in exact arithmetic)
        MesaFwd64 f2 = fw;
        f2.o = o2;
        f2.x = x2;
        CHECK(!ref_mesa_forward(&d, &variants[v], &f2), "%s", mn_last_error());
        double e = rel_err64(x2, x, c.nq);
        test_note("variant %d: x rel err %.2e", v, e);
        // lambda >= 0.25 and ||H|| <~ 5 here: condition numbers ~20, so
        // rounding over 8 steps stays ~1e-14; 1e-10 is the spec's figure.
        CHECK_REL("x (CG, Dk steps)", e, 1e-10);
        CHECK_REL("o (CG, Dk steps)", rel_err64(o2, o, c.nv), 1e-10);
    }
    free(o); free(x); free(o2); free(x2);
    mesa_case_free(&c);
}

TEST(mesa_ref_cg_tolerance_mode) {
    // Larger systems, where a tolerance stops well before Dk steps.
    MnSeqDims d = {1, 40, 2, 48, 4};
    MesaCase c;
    mesa_case_init(&c, d, 7, 0, 3.0);
    size_t ntok = c.ng;
    double *o = xcalloc(c.nv, 8), *x = xcalloc(c.nq, 8);
    int *steps = xcalloc(ntok, sizeof(int));
    for (int pre = 0; pre < 2; pre++) {
        MnSolver s = mn_solver_default();
        s.max_steps = 200;
        s.tol = 1e-4f;
        s.precond = pre ? MN_PRECOND_JACOBI : MN_PRECOND_NONE;
        MesaFwd64 fw = {.q = c.q, .k = c.k, .v = c.v, .g = c.g, .beta = c.beta, .lambda = c.lambda, .o = o,
                        .x = x, .steps = steps};
        CHECK(!ref_mesa_forward(&d, &s, &fw), "%s", mn_last_error());
        // Recompute every residual from scratch, independent of the solver.
        double worst = 0, mean_steps = 0;
        double *hs = xcalloc((size_t)d.Dk * d.Dk, 8);
        for (int h = 0; h < d.H; h++) {
            memset(hs, 0, sizeof(double) * d.Dk * d.Dk);
            for (int t = 0; t < d.T; t++) {
                size_t i = (size_t)t * d.H + h;
                const double *k = c.k + i * d.Dk, *q = c.q + i * d.Dk, *xi = x + i * d.Dk;
                double gamma = exp(c.g[i]), rr = 0, qq = 0;
                for (int a = 0; a < d.Dk; a++)
                    for (int b = 0; b < d.Dk; b++) hs[a * d.Dk + b] = gamma * hs[a * d.Dk + b] + c.beta[i] * k[a] * k[b];
                for (int a = 0; a < d.Dk; a++) {
                    double ax = c.lambda[h * d.Dk + a] * xi[a];
                    for (int b = 0; b < d.Dk; b++) ax += hs[a * d.Dk + b] * xi[b];
                    rr += (q[a] - ax) * (q[a] - ax);
                    qq += q[a] * q[a];
                }
                worst = fmax(worst, sqrt(rr / qq));
                mean_steps += steps[i];
            }
        }
        free(hs);
        mean_steps /= (double)ntok;
        test_note("%s: worst relative residual %.2e, mean steps %.1f of Dk = %d", pre ? "jacobi" : "plain", worst,
                  mean_steps, d.Dk);
        CHECK(worst <= 1e-4 * (1 + 1e-9), "residual %.3g above the tolerance 1e-4", worst);
        CHECK(mean_steps < d.Dk, "tolerance mode used %.1f steps on average, not fewer than Dk", mean_steps);
    }
    free(o); free(x); free(steps);
    mesa_case_free(&c);
}
