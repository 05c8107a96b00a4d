/*
 * Mesa core, float64 reference: the recurrent form of spec sections 1, 2 and 4,
 * one token at a time, with an exact (Cholesky) or CG solve per token. The
 * backward keeps every H_t and G_t and runs the adjoint recurrences literally.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/seq_args.h"
#include "ref.h"

int ref_cholesky(double *a, int n) {
    for (int j = 0; j < n; j++) {
        double s = a[j * n + j];
        for (int p = 0; p < j; p++) s -= a[j * n + p] * a[j * n + p];
        if (!(s > 0)) return mn_error(MN_ERR_NUMERIC, "matrix not positive definite (pivot %d = %g)", j, s);
        double l = sqrt(s);
        a[j * n + j] = l;
        for (int i = j + 1; i < n; i++) {
            double t = a[i * n + j];
            for (int p = 0; p < j; p++) t -= a[i * n + p] * a[j * n + p];
            a[i * n + j] = t / l;
        }
    }
    return MN_OK;
}

void ref_cholesky_solve(const double *l, int n, const double *b, double *x) {
    for (int i = 0; i < n; i++) {  // L y = b
        double t = b[i];
        for (int p = 0; p < i; p++) t -= l[i * n + p] * x[p];
        x[i] = t / l[i * n + i];
    }
    for (int i = n - 1; i >= 0; i--) {  // L^T x = y
        double t = x[i];
        for (int p = i + 1; p < n; p++) t -= l[p * n + i] * x[p];
        x[i] = t / l[i * n + i];
    }
}

static double dot(const double *a, const double *b, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static void matvec(const double *a, int rows, int cols, const double *x, double *y) {
    for (int i = 0; i < rows; i++) y[i] = dot(a + (size_t)i * cols, x, cols);
}

int ref_cg(const double *a, int n, const double *q, const double *x0, const MnSolver *s, double *x) {
    double r[n], z[n], p[n], ap[n], minv[n];
    for (int i = 0; i < n; i++) minv[i] = s->precond == MN_PRECOND_JACOBI ? 1.0 / a[i * n + i] : 1.0;
    for (int i = 0; i < n; i++) {
        if (s->init == MN_CG_INIT_JACOBI)
            x[i] = q[i] / a[i * n + i];
        else if (s->init == MN_CG_INIT_GIVEN)
            x[i] = x0[i];
        else
            x[i] = 0;
    }
    matvec(a, n, n, x, ap);
    for (int i = 0; i < n; i++) r[i] = q[i] - ap[i];
    double qnorm = sqrt(dot(q, q, n));
    if (sqrt(dot(r, r, n)) <= s->tol * qnorm) return 0;
    for (int i = 0; i < n; i++) p[i] = z[i] = minv[i] * r[i];
    double rz = dot(r, z, n);
    int step = 0;
    while (step < s->max_steps) {
        matvec(a, n, n, p, ap);
        double pap = dot(p, ap, n);
        if (!(pap > 0) || !(rz > 0)) break;  // converged exactly: nothing left to do
        double alpha = rz / pap;
        for (int i = 0; i < n; i++) {
            x[i] += alpha * p[i];
            r[i] -= alpha * ap[i];
        }
        step++;
        if (sqrt(dot(r, r, n)) <= s->tol * qnorm) break;
        for (int i = 0; i < n; i++) z[i] = minv[i] * r[i];
        double rz_new = dot(r, z, n);
        for (int i = 0; i < n; i++) p[i] = z[i] + (rz_new / rz) * p[i];
        rz = rz_new;
    }
    return step;
}

// Solves (H + diag(lambda)) x = q exactly (solver NULL) or by CG.
static int solve(const double *h, const double *lambda, int n, const double *q, const double *x0,
                 const MnSolver *solver, double *x, int *steps, double *work) {
    for (int i = 0; i < n * n; i++) work[i] = h[i];
    for (int i = 0; i < n; i++) work[i * n + i] += lambda[i];
    if (solver) {
        int st = ref_cg(work, n, q, x0, solver, x);
        if (steps) *steps = st;
        return MN_OK;
    }
    MN_TRY(ref_cholesky(work, n));
    ref_cholesky_solve(work, n, q, x);
    if (steps) *steps = 0;
    return MN_OK;
}

// Index helpers for the [B,T,H,D] and [B,H,...] layouts.
static size_t tok(const MnSeqDims *d, int b, int t, int h) { return ((size_t)b * d->T + t) * d->H + h; }
static size_t head(const MnSeqDims *d, int b, int h) { return (size_t)b * d->H + h; }

// One token of the state recurrences: H = gamma H + beta k k^T, G = gamma G + beta v k^T.
static void update_states(double *hs, double *gs, const double *k, const double *v, double gamma, double beta,
                          int dk, int dv) {
    for (int i = 0; i < dk; i++)
        for (int j = 0; j < dk; j++) hs[i * dk + j] = gamma * hs[i * dk + j] + beta * k[i] * k[j];
    for (int i = 0; i < dv; i++)
        for (int j = 0; j < dk; j++) gs[i * dk + j] = gamma * gs[i * dk + j] + beta * v[i] * k[j];
}

static void init_states(const MnSeqDims *d, int b, int h, const double *h0, const double *g0, double *hs,
                        double *gs) {
    size_t hh = (size_t)d->Dk * d->Dk, gg = (size_t)d->Dv * d->Dk;
    for (size_t i = 0; i < hh; i++) hs[i] = h0 ? h0[head(d, b, h) * hh + i] : 0;
    for (size_t i = 0; i < gg; i++) gs[i] = g0 ? g0[head(d, b, h) * gg + i] : 0;
}

int ref_mesa_forward(const MnSeqDims *d, const MnSolver *solver, const MesaFwd64 *io) {
    MN_TRY(seq_check_dims(d));
    if (!io->q || !io->k || !io->v || !io->g || !io->beta || !io->lambda || !io->o || !io->x)
        return mn_error(MN_ERR_ARG, "mesa reference forward: a required tensor is NULL");
    MN_TRY(seq_check_groups(d, io->lambda_seqs, "mesa reference forward: lambda_seqs"));
    int dk = d->Dk, dv = d->Dv;
    size_t hh = (size_t)dk * dk, gg = (size_t)dv * dk;
    double *hs = malloc(sizeof(double) * (2 * hh + gg));
    if (!hs) return mn_error(MN_ERR_NOMEM, "out of memory");
    double *gs = hs + hh, *work = gs + gg;
    int status = MN_OK;
    for (int b = 0; b < d->B && !status; b++)
        for (int h = 0; h < d->H && !status; h++) {
            init_states(d, b, h, io->h0, io->g0, hs, gs);
            for (int t = 0; t < d->T && !status; t++) {
                size_t i = tok(d, b, t, h);
                update_states(hs, gs, io->k + i * dk, io->v + i * dv, exp(io->g[i]), io->beta[i], dk, dv);
                const double *x0 = io->x0 ? io->x0 + i * dk : NULL;
                status = solve(hs, io->lambda + mn_mesa_lambda_at(io->lambda_seqs, d->H, dk, b, h), dk, io->q + i * dk, x0,
                               solver, io->x + i * dk,
                               io->steps ? io->steps + i : NULL, work);
                matvec(gs, dv, dk, io->x + i * dk, io->o + i * dv);
            }
            if (io->hT) memcpy(io->hT + head(d, b, h) * hh, hs, sizeof(double) * hh);
            if (io->gT) memcpy(io->gT + head(d, b, h) * gg, gs, sizeof(double) * gg);
        }
    free(hs);
    return status;
}

int ref_mesa_backward(const MnSeqDims *d, const MnSolver *solver, const MesaBwd64 *io) {
    MN_TRY(seq_check_dims(d));
    if (!io->q || !io->k || !io->v || !io->g || !io->beta || !io->lambda || !io->x || !io->o || !io->dout ||
        !io->dq || !io->dk || !io->dv || !io->dg || !io->dbeta || !io->dlambda)
        return mn_error(MN_ERR_ARG, "mesa reference backward: a required tensor is NULL");
    MN_TRY(seq_check_groups(d, io->lambda_seqs, "mesa reference backward: lambda_seqs"));
    int T = d->T, dk = d->Dk, dv = d->Dv;
    size_t hh = (size_t)dk * dk, gg = (size_t)dv * dk;
    // Every state H_t, G_t of one sequence and head, then the adjoints and scratch.
    double *hist = malloc(sizeof(double) * ((size_t)T * (hh + gg) + 4 * hh + 2 * gg + 8 * (size_t)(dk + dv)));
    if (!hist) return mn_error(MN_ERR_NOMEM, "out of memory");
    double *hs = hist + (size_t)T * (hh + gg), *gs = hs + hh, *hbar = gs + gg, *gbar = hbar + hh, *work = gbar + gg;
    double *r = work + hh, *y = r + dk, *hx = y + dk, *pv = hx + dk, *qv = pv + dv, *r1 = qv + dk, *r2 = r1 + dk;
    double *db = malloc(sizeof(double) * (size_t)T);
    if (!db) {
        free(hist);
        return mn_error(MN_ERR_NOMEM, "out of memory");
    }
    memset(io->dlambda, 0, sizeof(double) * mn_mesa_lambda_len(d, io->lambda_seqs));
    int status = MN_OK;
    for (int b = 0; b < d->B && !status; b++)
        for (int h = 0; h < d->H && !status; h++) {
            init_states(d, b, h, io->h0, io->g0, hs, gs);
            for (int t = 0; t < T; t++) {
                size_t i = tok(d, b, t, h);
                update_states(hs, gs, io->k + i * dk, io->v + i * dv, exp(io->g[i]), io->beta[i], dk, dv);
                memcpy(hist + (size_t)t * (hh + gg), hs, sizeof(double) * hh);
                memcpy(hist + (size_t)t * (hh + gg) + hh, gs, sizeof(double) * gg);
            }
            for (size_t e = 0; e < hh; e++) hbar[e] = io->dhT ? io->dhT[head(d, b, h) * hh + e] : 0;
            for (size_t e = 0; e < gg; e++) gbar[e] = io->dgT ? io->dgT[head(d, b, h) * gg + e] : 0;
            const size_t lat = mn_mesa_lambda_at(io->lambda_seqs, d->H, dk, b, h);
            const double *lam = io->lambda + lat;
            for (int t = T - 1; t >= 0 && !status; t--) {
                size_t i = tok(d, b, t, h);
                const double *ht = hist + (size_t)t * (hh + gg), *gt = ht + hh;
                const double *q = io->q + i * dk, *k = io->k + i * dk, *v = io->v + i * dv;
                const double *x = io->x + i * dk, *o = io->o + i * dv, *delta = io->dout + i * dv;
                double beta = io->beta[i];
                // Adjoints of H_t and G_t: direct terms plus the decayed future.
                double gnext = t + 1 < T ? exp(io->g[tok(d, b, t + 1, h)]) : 1.0;
                for (int a = 0; a < dv; a++)
                    for (int c = 0; c < dk; c++) gbar[a * dk + c] = gnext * gbar[a * dk + c] + delta[a] * x[c];
                // r = G_t^T delta; y = A_t^{-1} r (second solve, same matrix)
                for (int c = 0; c < dk; c++) {
                    r[c] = 0;
                    for (int a = 0; a < dv; a++) r[c] += gt[a * dk + c] * delta[a];
                }
                status = solve(ht, lam, dk, r, NULL, solver, y, NULL, work);
                for (int a = 0; a < dk; a++)
                    for (int c = 0; c < dk; c++) hbar[a * dk + c] = gnext * hbar[a * dk + c] - y[a] * x[c];
                (void)q;
                matvec(ht, dk, dk, x, hx);
                // P = Gbar k, Qv = Gbar^T v, R1 = Hbar k, R2 = Hbar^T k
                matvec(gbar, dv, dk, k, pv);
                matvec(hbar, dk, dk, k, r1);
                for (int c = 0; c < dk; c++) {
                    qv[c] = r2[c] = 0;
                    for (int a = 0; a < dv; a++) qv[c] += gbar[a * dk + c] * v[a];
                    for (int a = 0; a < dk; a++) r2[c] += hbar[a * dk + c] * k[a];
                }
                for (int a = 0; a < dv; a++) io->dv[i * dv + a] = beta * pv[a];
                for (int c = 0; c < dk; c++) {
                    io->dk[i * dk + c] = beta * (qv[c] + r1[c] + r2[c]);
                    io->dq[i * dk + c] = y[c];
                    io->dlambda[lat + c] -= y[c] * x[c];
                }
                double dbeta = dot(v, pv, dv) + dot(k, r1, dk);
                io->dbeta[i] = dbeta;
                db[t] = dot(delta, o, dv) - dot(y, hx, dk) - beta * dbeta;
                if (t == T - 1) {  // the final states' own adjoints also see the last decay
                    if (io->dhT) db[t] += dot(io->dhT + head(d, b, h) * hh, ht, (int)hh);
                    if (io->dgT) db[t] += dot(io->dgT + head(d, b, h) * gg, gt, (int)gg);
                }
            }
            // dg_t = sum_{u >= t} db_u; the initial states' adjoints are gamma_1 times those at t = 1.
            double acc = 0;
            for (int t = T - 1; t >= 0; t--) {
                acc += db[t];
                io->dg[tok(d, b, t, h)] = acc;
            }
            double g1 = exp(io->g[tok(d, b, 0, h)]);
            if (io->dh0)
                for (size_t e = 0; e < hh; e++) io->dh0[head(d, b, h) * hh + e] = g1 * hbar[e];
            if (io->dg0)
                for (size_t e = 0; e < gg; e++) io->dg0[head(d, b, h) * gg + e] = g1 * gbar[e];
        }
    free(db);
    free(hist);
    return status;
}
