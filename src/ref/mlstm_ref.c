/*
 * The mLSTM core, float64 reference (core/backend.h's MlstmOps; docs/spec/mixers.md section 4,
 * docs/spec/reference/xlstm-notes.md 2.2-2.4), per (sequence, head) pair:
 *
 *   recurrent (the stabilised form, from the given state or zero, m_0 = 0):
 *     m_t = max(f_t + m_{t-1}, i_t);  a_t = exp(f_t + m_{t-1} - m_t),  b_t = exp(i_t - m_t)
 *     C_t = a_t C_{t-1} + b_t v_t k_t^T;  n_t = a_t n_{t-1} + b_t k_t
 *     nq_t = s n_t . q_t;  h_t = s C_t q_t / (max(|nq_t|, exp(-m_t)) + eps)
 *   parallel (from a zero state), with cs_t = f_1 + ... + f_t:
 *     m_t = max(cs_t, max_{j<=t} (cs_t - cs_j + i_j))     (cs_t: the m_0 = 0 path of the recurrence)
 *     E_tj = exp(cs_t - cs_j + i_j - m_t) <= 1 (j <= t)
 *     nq_t = s sum_j E_tj (q_t . k_j),  num_t = s sum_j E_tj (q_t . k_j) v_j,  h_t = num_t / den_t,
 *     den_t = max(|nq_t|, exp(-m_t)) + eps
 *   unstabilised (zero state; equals the others for eps = 0 where it does not overflow):
 *     C_t = e^{f_t} C_{t-1} + e^{i_t} v_t k_t^T (n likewise),  h_t = s C_t q_t / (max(|s n_t . q_t|, 1) + eps)
 *
 * The backward is the exact gradient of the function computed, the stabiliser's path included. First
 * the parallel form's with m held constant (the paper's stop-gradient):
 *     dnum_t = dh_t / den_t;  dnq_t = -(dh_t . h_t) / den_t sign(nq_t) [|nq_t| > exp(-m_t)]
 *     P_tj = s E_tj (dnum_t . v_j + dnq_t)                 (dL/d(q_t . k_j))
 *     dq_t = sum_{j<=t} P_tj k_j;  dk_j = sum_{t>=j} P_tj q_t;  dv_j = s sum_{t>=j} E_tj (q_t . k_j) dnum_t
 *     R_tj = P_tj (q_t . k_j)                               (dL/d log E_tj)
 *     dig_j = sum_{t>=j} R_tj  (= k_j . dk_j);  dcs_t = sum_{j<=t} R_tj - sum_{u>=t} R_ut  (= q_t . dq_t - k_t . dk_t)
 *     dfg_t = sum_{u>=t} dcs_u
 * Then m's own: num_t, nq_t and the floor all scale as exp(-m_t), so h_t = num_u / (max(|nq_u|, 1) e^{-m_t}
 * + eps) in unstabilised terms (num_u, nq_u free of m) and
 *     dL/dm_t = -(dh_t . h_t) eps / den_t       (0 for eps = 0: the stop-gradient is then exact)
 * carried back through m_t = max(f_t + m_{t-1}, i_t) from m_{-1} = 0 by a reverse scan with
 * g_t = dL/dm_t + (what m_{t+1} passed down): where i_t won (i_t >= f_t + m_{t-1}, ties to i)
 * dig_t += g_t and nothing passes further; else dfg_t += g_t and g_t passes to m_{t-1}. Without it
 * the gradient is off by ~eps / den relative, which matters where the true value is structurally
 * small: adding a constant to every i_j changes h only through the floor and eps, so an input
 * gate's bias gradient is a near-cancelling sum.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/seq_args.h"
#include "ref.h"

static double dot(const double *a, const double *b, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static int check_opts(const char *fn, const MnSeqDims *d, const MlstmOpts *o, const void *io) {
    MN_TRY(seq_check_dims(d));
    if (!o) return mn_error(MN_ERR_ARG, "%s: opts is NULL", fn);
    if (!io) return mn_error(MN_ERR_ARG, "%s: io is NULL", fn);
    if (!isfinite(o->scale)) return mn_error(MN_ERR_ARG, "%s: scale must be finite, got %g", fn, (double)o->scale);
    if (!(o->eps >= 0) || !isfinite(o->eps)) return mn_error(MN_ERR_ARG, "%s: eps must be >= 0, got %g", fn, (double)o->eps);
    if (o->form != MN_FORM_AUTO && o->form != MN_FORM_CHUNK && o->form != MN_FORM_RECURRENT)
        return mn_error(MN_ERR_ARG, "%s: unknown form %d", fn, (int)o->form);
    if (o->chunk < 0) return mn_error(MN_ERR_ARG, "%s: chunk = %d, must be >= 0", fn, o->chunk);
    return MN_OK;
}

static int check_fwd(const char *fn, const MnSeqDims *d, const MlstmOpts *o, const MlstmFwd64 *io) {
    MN_TRY(check_opts(fn, d, o, io));
    if (!io->q || !io->k || !io->v || !io->fg || !io->ig || !io->h)
        return mn_error(MN_ERR_ARG, "%s: q, k, v, fg, ig and h are required", fn);
    if (!!io->c0 + !!io->n0 + !!io->m0 == 1 || !!io->c0 + !!io->n0 + !!io->m0 == 2)
        return mn_error(MN_ERR_ARG, "%s: the initial state c0, n0, m0 is given in part", fn);
    if (!!io->cT + !!io->nT + !!io->mT == 1 || !!io->cT + !!io->nT + !!io->mT == 2)
        return mn_error(MN_ERR_ARG, "%s: the final state cT, nT, mT is asked for in part", fn);
    return MN_OK;
}

int ref_mlstm_forward(const MnSeqDims *d, const MlstmOpts *o, const MlstmFwd64 *io) {
    const char *fn = "ref_mlstm_forward";
    MN_TRY(check_fwd(fn, d, o, io));
    int T = d->T, H = d->H, dk = d->Dk, dv = d->Dv;
    size_t ss = (size_t)dv * dk;
    double s = o->scale, eps = o->eps;
    double *c = xcalloc(ss + dk, sizeof(double)), *n = c + ss;
    for (int bh = 0; bh < d->B * H; bh++) {
        size_t tok0 = (size_t)(bh / H) * T * H + (size_t)(bh % H);
        double m = 0;
        if (io->c0) {
            memcpy(c, io->c0 + bh * ss, sizeof(double) * ss);
            memcpy(n, io->n0 + (size_t)bh * dk, sizeof(double) * dk);
            m = io->m0[bh];
        } else {
            memset(c, 0, sizeof(double) * (ss + dk));
        }
        for (int t = 0; t < T; t++) {
            size_t ti = tok0 + (size_t)t * H;
            const double *q = io->q + ti * dk, *k = io->k + ti * dk, *v = io->v + ti * dv;
            double f = io->fg[ti], i = io->ig[ti], mt = fmax(f + m, i);
            double a = exp(f + m - mt), b = exp(i - mt);
            m = mt;
            for (int r = 0; r < dv; r++)
                for (int j = 0; j < dk; j++) c[(size_t)r * dk + j] = a * c[(size_t)r * dk + j] + b * v[r] * k[j];
            for (int j = 0; j < dk; j++) n[j] = a * n[j] + b * k[j];
            double nq = s * dot(n, q, dk), den = fmax(fabs(nq), exp(-m)) + eps;
            for (int r = 0; r < dv; r++) io->h[ti * dv + r] = s * dot(c + (size_t)r * dk, q, dk) / den;
            if (io->nq) io->nq[ti] = nq;
            if (io->m) io->m[ti] = m;
        }
        if (io->cT) {
            memcpy(io->cT + bh * ss, c, sizeof(double) * ss);
            memcpy(io->nT + (size_t)bh * dk, n, sizeof(double) * dk);
            io->mT[bh] = m;
        }
    }
    free(c);
    return MN_OK;
}

// One pair's cs and m (the parallel form's row maximum, the cs_t term included) and E, the
// T x T lower triangle of exp(cs_t - cs_j + i_j - m_t).
static void pair_weights(const MlstmFwd64 *io, size_t tok0, int T, int H, double *cs, double *m, double *e) {
    double acc = 0;
    for (int t = 0; t < T; t++) cs[t] = acc += io->fg[tok0 + (size_t)t * H];
    for (int t = 0; t < T; t++) {
        double mt = cs[t];
        for (int j = 0; j <= t; j++) mt = fmax(mt, cs[t] - cs[j] + io->ig[tok0 + (size_t)j * H]);
        m[t] = mt;
        for (int j = 0; j < T; j++)
            e[(size_t)t * T + j] = j <= t ? exp(cs[t] - cs[j] + io->ig[tok0 + (size_t)j * H] - mt) : 0;
    }
}

int ref_mlstm_parallel(const MnSeqDims *d, const MlstmOpts *o, const MlstmFwd64 *io) {
    const char *fn = "ref_mlstm_parallel";
    MN_TRY(check_fwd(fn, d, o, io));
    if (io->c0 || io->cT) return mn_error(MN_ERR_ARG, "%s: the parallel form runs from a zero state, without a final one", fn);
    int T = d->T, H = d->H, dk = d->Dk, dv = d->Dv;
    double s = o->scale, eps = o->eps;
    double *cs = xcalloc(2 * (size_t)T + (size_t)T * T, sizeof(double)), *m = cs + T, *e = m + T;
    for (int bh = 0; bh < d->B * H; bh++) {
        size_t tok0 = (size_t)(bh / H) * T * H + (size_t)(bh % H);
        pair_weights(io, tok0, T, H, cs, m, e);
        for (int t = 0; t < T; t++) {
            size_t ti = tok0 + (size_t)t * H;
            double *h = io->h + ti * dv, nq = 0;
            for (int r = 0; r < dv; r++) h[r] = 0;
            for (int j = 0; j <= t; j++) {
                size_t tj = tok0 + (size_t)j * H;
                double w = s * e[(size_t)t * T + j] * dot(io->q + ti * dk, io->k + tj * dk, dk);
                nq += w;
                for (int r = 0; r < dv; r++) h[r] += w * io->v[tj * dv + r];
            }
            double den = fmax(fabs(nq), exp(-m[t])) + eps;
            for (int r = 0; r < dv; r++) h[r] /= den;
            if (io->nq) io->nq[ti] = nq;
            if (io->m) io->m[ti] = m[t];
        }
    }
    free(cs);
    return MN_OK;
}

int ref_mlstm_unstabilised(const MnSeqDims *d, const MlstmOpts *o, const MlstmFwd64 *io) {
    const char *fn = "ref_mlstm_unstabilised";
    MN_TRY(check_fwd(fn, d, o, io));
    if (io->c0 || io->cT || io->nq || io->m)
        return mn_error(MN_ERR_ARG, "%s: writes h only, from a zero state", fn);
    int T = d->T, H = d->H, dk = d->Dk, dv = d->Dv;
    size_t ss = (size_t)dv * dk;
    double s = o->scale, eps = o->eps;
    double *c = xcalloc(ss + dk, sizeof(double)), *n = c + ss;
    for (int bh = 0; bh < d->B * H; bh++) {
        size_t tok0 = (size_t)(bh / H) * T * H + (size_t)(bh % H);
        memset(c, 0, sizeof(double) * (ss + dk));
        for (int t = 0; t < T; t++) {
            size_t ti = tok0 + (size_t)t * H;
            const double *q = io->q + ti * dk, *k = io->k + ti * dk, *v = io->v + ti * dv;
            double a = exp(io->fg[ti]), b = exp(io->ig[ti]);
            for (int r = 0; r < dv; r++)
                for (int j = 0; j < dk; j++) c[(size_t)r * dk + j] = a * c[(size_t)r * dk + j] + b * v[r] * k[j];
            for (int j = 0; j < dk; j++) n[j] = a * n[j] + b * k[j];
            double den = fmax(fabs(s * dot(n, q, dk)), 1) + eps;
            for (int r = 0; r < dv; r++) io->h[ti * dv + r] = s * dot(c + (size_t)r * dk, q, dk) / den;
        }
    }
    free(c);
    return MN_OK;
}

int ref_mlstm_backward(const MnSeqDims *d, const MlstmOpts *o, const MlstmBwd64 *io) {
    const char *fn = "ref_mlstm_backward";
    MN_TRY(check_opts(fn, d, o, io));
    if (!io->q || !io->k || !io->v || !io->fg || !io->ig || !io->dh || !io->dq || !io->dk || !io->dv || !io->dfg ||
        !io->dig)
        return mn_error(MN_ERR_ARG, "%s: q, k, v, fg, ig, dh, dq, dk, dv, dfg and dig are required", fn);
    int T = d->T, H = d->H, dk = d->Dk, dv = d->Dv;
    double s = o->scale, eps = o->eps;
    size_t tt = (size_t)T * T;
    double *cs = xcalloc(7 * (size_t)T + 3 * tt + dv, sizeof(double)), *m = cs + T, *nq = m + T, *den = nq + T,
           *dnq = den + T, *dm = dnq + T, *mprev = dm + T, *e = mprev + T, *qk = e + tt, *p = qk + tt, *h = p + tt;
    MlstmFwd64 w = {.q = io->q, .k = io->k, .v = io->v, .fg = io->fg, .ig = io->ig};
    for (int bh = 0; bh < d->B * H; bh++) {
        size_t tok0 = (size_t)(bh / H) * T * H + (size_t)(bh % H);
#define TOK(t) (tok0 + (size_t)(t) * H)
        pair_weights(&w, tok0, T, H, cs, m, e);
        for (int t = 0; t < T; t++)
            for (int j = 0; j <= t; j++) qk[(size_t)t * T + j] = dot(io->q + TOK(t) * dk, io->k + TOK(j) * dk, dk);
        // the forward again: nq, den, h; then dnq (dnum_t = dh_t / den_t is formed where used)
        for (int t = 0; t < T; t++) {
            double a = 0;
            for (int r = 0; r < dv; r++) h[r] = 0;
            for (int j = 0; j <= t; j++) {
                double x = s * e[(size_t)t * T + j] * qk[(size_t)t * T + j];
                a += x;
                for (int r = 0; r < dv; r++) h[r] += x * io->v[TOK(j) * dv + r];
            }
            nq[t] = a;
            den[t] = fmax(fabs(a), exp(-m[t])) + eps;
            double floor_ = exp(-m[t]), dhh = 0;
            for (int r = 0; r < dv; r++) dhh += io->dh[TOK(t) * dv + r] * h[r] / den[t];
            dnq[t] = fabs(a) > floor_ ? -dhh / den[t] * (a > 0 ? 1 : -1) : 0;
            dm[t] = -dhh * eps / den[t];  // dL/dm_t (h[] holds num_t, so dhh = dh_t . h_t)
        }
        // P_tj and the token gradients
        for (int t = 0; t < T; t++)
            for (int j = 0; j <= t; j++) {
                const double *dh = io->dh + TOK(t) * dv, *v = io->v + TOK(j) * dv;
                p[(size_t)t * T + j] = s * e[(size_t)t * T + j] * (dot(dh, v, dv) / den[t] + dnq[t]);
            }
        for (int t = 0; t < T; t++) {
            double *dq = io->dq + TOK(t) * dk, *dkk = io->dk + TOK(t) * dk, *dvv = io->dv + TOK(t) * dv;
            for (int c = 0; c < dk; c++) dq[c] = dkk[c] = 0;
            for (int r = 0; r < dv; r++) dvv[r] = 0;
            for (int j = 0; j <= t; j++)
                for (int c = 0; c < dk; c++) dq[c] += p[(size_t)t * T + j] * io->k[TOK(j) * dk + c];
            for (int u = t; u < T; u++) {
                double pu = p[(size_t)u * T + t], x = s * e[(size_t)u * T + t] * qk[(size_t)u * T + t] / den[u];
                for (int c = 0; c < dk; c++) dkk[c] += pu * io->q[TOK(u) * dk + c];
                for (int r = 0; r < dv; r++) dvv[r] += x * io->dh[TOK(u) * dv + r];
            }
        }
        // the gates, from R_tj = P_tj (q_t . k_j)
        double acc = 0;
        for (int t = T - 1; t >= 0; t--) {
            double row = 0, col = 0;
            for (int j = 0; j <= t; j++) row += p[(size_t)t * T + j] * qk[(size_t)t * T + j];
            for (int u = t; u < T; u++) col += p[(size_t)u * T + t] * qk[(size_t)u * T + t];
            io->dig[TOK(t)] = col;
            acc += row - col;
            io->dfg[TOK(t)] = acc;
        }
        // m's path: the recurrence's m_{t-1} (the forward's, from m_{-1} = 0) decides which argument won
        double mr = 0, g = 0;
        for (int t = 0; t < T; t++) {
            mprev[t] = mr;
            mr = fmax(io->fg[TOK(t)] + mr, io->ig[TOK(t)]);
        }
        for (int t = T - 1; t >= 0; t--) {
            g += dm[t];
            if (io->ig[TOK(t)] >= io->fg[TOK(t)] + mprev[t]) {
                io->dig[TOK(t)] += g;
                g = 0;
            } else {
                io->dfg[TOK(t)] += g;
            }
        }
#undef TOK
    }
    free(cs);
    return MN_OK;
}

static double log_sigmoid(double x) { return x >= 0 ? -log1p(exp(-x)) : x - log1p(exp(x)); }
static double sigmoid(double x) {
    if (x >= 0) return 1 / (1 + exp(-x));
    double e = exp(x);
    return e / (1 + e);
}

void ref_mlstm_gates_fwd(double *fg, double *ig, const double *a, const double *b, size_t n, double cap) {
    for (size_t i = 0; i < n; i++) {
        fg[i] = log_sigmoid(cap != 0 ? cap * tanh(a[i] / cap) : a[i]);
        ig[i] = cap != 0 ? cap * tanh(b[i] / cap) : b[i];
    }
}

// d logsigmoid(x)/dx = sigmoid(-x);  d (c tanh(a/c))/da = 1 - tanh(a/c)^2
void ref_mlstm_gates_bwd(double *da, double *db, const double *dfg, const double *dig, const double *a,
                         const double *b, size_t n, double cap) {
    for (size_t i = 0; i < n; i++) {
        double ta = cap != 0 ? tanh(a[i] / cap) : 0, tb = cap != 0 ? tanh(b[i] / cap) : 0;
        double x = cap != 0 ? cap * ta : a[i];
        da[i] = dfg[i] * sigmoid(-x) * (cap != 0 ? 1 - ta * ta : 1);
        db[i] = dig[i] * (cap != 0 ? 1 - tb * tb : 1);
    }
}

// The backend slots on double buffers: the recurrent form forward (every form's numbers), the
// parallel form's backward (recomputing what it needs; the forward's h, nq, m are not read).
#define D64(p) ((const double *)(const void *)(p))
#define W64(p) ((double *)(void *)(p))

static int r_mlstm_fwd(const Backend *be, const MnSeqDims *d, const MlstmOpts *o, const MlstmFwd *io) {
    if (!io) return mn_error(MN_ERR_ARG, "ref mlstm fwd: io is NULL");
    MlstmFwd64 f = {D64(io->q),  D64(io->k),  D64(io->v), D64(io->fg), D64(io->ig), D64(io->c0), D64(io->n0),
                    D64(io->m0), W64(io->h),  W64(io->nq), W64(io->m), W64(io->cT), W64(io->nT), W64(io->mT)};
    return ref_mlstm_forward(d, o, &f);
}

static int r_mlstm_bwd(const Backend *be, const MnSeqDims *d, const MlstmOpts *o, const MlstmBwd *io) {
    if (!io) return mn_error(MN_ERR_ARG, "ref mlstm bwd: io is NULL");
    MlstmBwd64 b = {D64(io->q),  D64(io->k),  D64(io->v),  D64(io->fg),  D64(io->ig), D64(io->dh),
                    W64(io->dq), W64(io->dk), W64(io->dv), W64(io->dfg), W64(io->dig)};
    return ref_mlstm_backward(d, o, &b);
}

static int r_mlstm_gates_fwd(const Backend *be, void *fg, void *ig, const void *a, const void *b, size_t n, float cap) {
    ref_mlstm_gates_fwd(W64(fg), W64(ig), D64(a), D64(b), n, cap);
    return MN_OK;
}

static int r_mlstm_gates_bwd(const Backend *be, void *da, void *db, const void *dfg, const void *dig, const void *a,
                             const void *b, size_t n, float cap) {
    ref_mlstm_gates_bwd(W64(da), W64(db), D64(dfg), D64(dig), D64(a), D64(b), n, cap);
    return MN_OK;
}

const MlstmOps ref_mlstm = {.fwd = r_mlstm_fwd, .bwd = r_mlstm_bwd, .gates_fwd = r_mlstm_gates_fwd,
                            .gates_bwd = r_mlstm_gates_bwd};
