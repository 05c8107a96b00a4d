/*
 * The gated linear-attention family, float64 reference (include/mesanet.h;
 * docs/spec/mixers.md sections 1-2): the recurrence one token at a time,
 * per (sequence, head) pair, with S of Dv x Dk:
 *
 *     GLA:    S_t = gamma_t S_{t-1} + beta_t v_t k_t^T
 *     DELTA:  P = gamma_t S_{t-1};  u_t = beta_t (v_t - P k_t);  S_t = P + u_t k_t^T
 *     o_t = scale S_t q_t
 *
 * The backward keeps every S_t and runs reverse mode through the recurrence
 * literally. With the adjoint dS of S_t (after the read-out's dS += scale dout_t q_t^T):
 *
 *     GLA:    dv = beta dS k,  dk = beta dS^T v,  dbeta = v^T dS k,  dP = dS
 *     DELTA:  du = dS k,  dv = beta du,  dk = dS^T u - beta P^T du,
 *             dbeta = (v - P k) . du,  dP = dS - beta du k^T
 *     dg_t = gamma_t <dP, S_{t-1}>,  dS_{t-1} = gamma_t dP
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/seq_args.h"
#include "ref.h"

static int lin_check(const char *fn, const MnSeqDims *d, const MnLinOpts *o, const void *q, const void *k,
                     const void *v) {
    MN_TRY(seq_check_dims(d));
    if (!o) return mn_error(MN_ERR_ARG, "%s: opts is NULL", fn);
    if (o->rule != MN_LIN_GLA && o->rule != MN_LIN_DELTA) return mn_error(MN_ERR_ARG, "%s: unknown rule %d", fn, (int)o->rule);
    if (!q || !k || !v) return mn_error(MN_ERR_ARG, "%s: q, k and v are required", fn);
    return MN_OK;
}

static double dot(const double *a, const double *b, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

// One token's update S_prev -> S (may not alias), with the rule's algebra.
static void step(MnLinRule rule, double gamma, double beta, const double *k, const double *v, const double *sp,
                 double *s, int dk, int dv) {
    for (int i = 0; i < dv; i++) {
        const double *pi = sp + (size_t)i * dk;
        double u = beta * v[i];
        if (rule == MN_LIN_DELTA) u -= beta * gamma * dot(pi, k, dk);
        double *si = s + (size_t)i * dk;
        for (int j = 0; j < dk; j++) si[j] = gamma * pi[j] + u * k[j];
    }
}

int ref_lin_forward(const MnSeqDims *d, const MnLinOpts *opts, const LinFwd64 *io) {
    const char *fn = "ref_lin_forward";
    if (!io) return mn_error(MN_ERR_ARG, "%s: io is NULL", fn);
    MN_TRY(lin_check(fn, d, opts, io->q, io->k, io->v));
    if (!io->o) return mn_error(MN_ERR_ARG, "%s: o is NULL", fn);
    int T = d->T, H = d->H, dk = d->Dk, dv = d->Dv;
    size_t ss = (size_t)dv * dk;
    double *s = xcalloc(2 * ss, sizeof(double)), *tmp = s + ss;
    for (int bh = 0; bh < d->B * d->H; bh++) {
        size_t tok0 = (size_t)(bh / H) * T * H + (size_t)(bh % H);
        if (io->s0) memcpy(s, io->s0 + bh * ss, sizeof(double) * ss); else memset(s, 0, sizeof(double) * ss);
        for (int t = 0; t < T; t++) {
            size_t ti = tok0 + (size_t)t * H;
            double gamma = io->g ? exp(io->g[ti]) : 1, beta = io->beta ? io->beta[ti] : 1;
            step(opts->rule, gamma, beta, io->k + ti * dk, io->v + ti * dv, s, tmp, dk, dv);
            memcpy(s, tmp, sizeof(double) * ss);
            for (int i = 0; i < dv; i++) io->o[ti * dv + i] = opts->scale * dot(s + (size_t)i * dk, io->q + ti * dk, dk);
        }
        if (io->sT) memcpy(io->sT + bh * ss, s, sizeof(double) * ss);
    }
    free(s);
    return MN_OK;
}

int ref_lin_backward(const MnSeqDims *d, const MnLinOpts *opts, const LinBwd64 *io) {
    const char *fn = "ref_lin_backward";
    if (!io) return mn_error(MN_ERR_ARG, "%s: io is NULL", fn);
    MN_TRY(lin_check(fn, d, opts, io->q, io->k, io->v));
    if (!io->dout || !io->dq || !io->dk || !io->dv) return mn_error(MN_ERR_ARG, "%s: dout, dq, dk, dv are required", fn);
    if (io->g && !io->dg) return mn_error(MN_ERR_ARG, "%s: dg is NULL while g is given", fn);
    if (io->beta && !io->dbeta) return mn_error(MN_ERR_ARG, "%s: dbeta is NULL while beta is given", fn);
    int T = d->T, H = d->H, dk = d->Dk, dv = d->Dv;
    MnLinRule rule = opts->rule;
    double scale = opts->scale;
    size_t ss = (size_t)dv * dk;
    double *st = xcalloc((size_t)(T + 1) * ss + 2 * ss + 2 * (size_t)dv, sizeof(double));
    double *ds = st + (size_t)(T + 1) * ss, *dp = ds + ss, *pk = dp + ss, *du = pk + dv;
    for (int bh = 0; bh < d->B * d->H; bh++) {
        size_t tok0 = (size_t)(bh / H) * T * H + (size_t)(bh % H);
        // st[t] = S_{t-1}: st[0] the initial state, st[T] the final one
        if (io->s0) memcpy(st, io->s0 + bh * ss, sizeof(double) * ss); else memset(st, 0, sizeof(double) * ss);
        for (int t = 0; t < T; t++) {
            size_t ti = tok0 + (size_t)t * H;
            double gamma = io->g ? exp(io->g[ti]) : 1, beta = io->beta ? io->beta[ti] : 1;
            step(rule, gamma, beta, io->k + ti * dk, io->v + ti * dv, st + (size_t)t * ss, st + (size_t)(t + 1) * ss,
                 dk, dv);
        }
        if (io->dsT) memcpy(ds, io->dsT + bh * ss, sizeof(double) * ss); else memset(ds, 0, sizeof(double) * ss);
        for (int t = T - 1; t >= 0; t--) {
            size_t ti = tok0 + (size_t)t * H;
            double gamma = io->g ? exp(io->g[ti]) : 1, beta = io->beta ? io->beta[ti] : 1;
            const double *q = io->q + ti * dk, *k = io->k + ti * dk, *v = io->v + ti * dv, *dout = io->dout + ti * dv;
            const double *sp = st + (size_t)t * ss, *s = st + (size_t)(t + 1) * ss;
            double *dq = io->dq + ti * dk, *dkk = io->dk + ti * dk, *dvv = io->dv + ti * dv;
            // read-out o = scale S q
            for (int j = 0; j < dk; j++) {
                double a = 0;
                for (int i = 0; i < dv; i++) a += s[(size_t)i * dk + j] * dout[i];
                dq[j] = scale * a;
            }
            for (int i = 0; i < dv; i++)
                for (int j = 0; j < dk; j++) ds[(size_t)i * dk + j] += scale * dout[i] * q[j];
            // the update
            double dbeta = 0;
            for (int i = 0; i < dv; i++) du[i] = dot(ds + (size_t)i * dk, k, dk);  // dS k
            if (rule == MN_LIN_GLA) {
                for (int i = 0; i < dv; i++) {
                    dvv[i] = beta * du[i];
                    dbeta += v[i] * du[i];
                }
                for (int j = 0; j < dk; j++) {
                    double a = 0;
                    for (int i = 0; i < dv; i++) a += ds[(size_t)i * dk + j] * v[i];
                    dkk[j] = beta * a;
                }
                memcpy(dp, ds, sizeof(double) * ss);
            } else {
                for (int i = 0; i < dv; i++) pk[i] = gamma * dot(sp + (size_t)i * dk, k, dk);  // P k
                for (int i = 0; i < dv; i++) {
                    dvv[i] = beta * du[i];
                    dbeta += (v[i] - pk[i]) * du[i];
                }
                for (int j = 0; j < dk; j++) {
                    double a = 0;
                    for (int i = 0; i < dv; i++)
                        a += ds[(size_t)i * dk + j] * beta * (v[i] - pk[i]) - beta * gamma * sp[(size_t)i * dk + j] * du[i];
                    dkk[j] = a;
                }
                for (int i = 0; i < dv; i++)
                    for (int j = 0; j < dk; j++) dp[(size_t)i * dk + j] = ds[(size_t)i * dk + j] - beta * du[i] * k[j];
            }
            if (io->dbeta) io->dbeta[ti] = io->beta ? dbeta : 0;
            if (io->dg) io->dg[ti] = io->g ? gamma * dot(dp, sp, (int)ss) : 0;
            for (size_t e = 0; e < ss; e++) ds[e] = gamma * dp[e];
        }
        if (io->ds0) memcpy(io->ds0 + bh * ss, ds, sizeof(double) * ss);
    }
    free(st);
    return MN_OK;
}
