/*
 * The sLSTM core (core/backend.h's SlstmOps; docs/spec/mixers.md section 5,
 * docs/spec/reference/xlstm-notes.md 1.3-1.4), float64, the plainest loops:
 * one sequence and one step at a time. Buffers are the reference backend's
 * (double). Per cell, from the previous state (h_p, c_p, n_p, m_p) and the
 * gate pre-activations r_g = x_g + (h_p R)_g:
 *
 *     lf = logsigmoid(r_f) + m_p;  m = (n_p == 0) ? r_i : max(lf, r_i)
 *     i' = min(1, exp(r_i - m));   f' = min(1, exp(lf - m))
 *     z = tanh(r_z);  o = sigmoid(r_o)
 *     c = f' c_p + i' z;  n = f' n_p + i';  h = o c / n
 *
 * The output does not depend on the choice of m (c and n both carry the
 * factor exp(-m)), so m is a constant to the backward, which runs NX-AI's
 * equations (xlstm-notes.md 1.4 [code]) with the carried dc, dn and the
 * recurrent gradient dh_rec = R dg of the step after:
 *
 *     dy = dh + dh_rec;  dc += dy o / n;  dn -= dy h / n
 *     dg_i = i' (z dc + dn);  dg_f = f' (dc c_p + dn n_p) sigmoid(-r_f)
 *     dg_z = dc i' (1 - z^2);  dg_o = (1 - o) h dy
 *     dc <- f' dc;  dn <- f' dn
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/common.h"
#include "ref.h"

int ref_slstm_check(const char *fn, const SlstmDims *d) {
    if (!d) return mn_error(MN_ERR_ARG, "%s: dims are NULL", fn);
    if (d->B <= 0 || d->T <= 0 || d->H <= 0 || d->Dh <= 0)
        return mn_error(MN_ERR_ARG, "%s: B, T, H, Dh must be > 0 (got %d, %d, %d, %d)", fn, d->B, d->T, d->H, d->Dh);
    if (!(d->clip >= 0) || isinf(d->clip))
        return mn_error(MN_ERR_ARG, "%s: clip = %g, must be finite and >= 0", fn, (double)d->clip);
    return MN_OK;
}

static double sigmoid(double x) { return 1 / (1 + exp(-x)); }
static double logsigmoid(double x) { return fmin(x, 0) - log1p(exp(-fabs(x))); }

// r[4][D] = x_t + h_p R (per head), x_t of one token [4][D].
static void preact(const SlstmDims *d, const double *x, const double *R, const double *hp, double *r) {
    int H = d->H, Dh = d->Dh, D = H * Dh;
    for (int h = 0; h < H; h++)
        for (int g = 0; g < 4; g++)
            for (int j = 0; j < Dh; j++) {
                double s = x[(size_t)g * D + h * Dh + j];
                for (int i = 0; i < Dh; i++) s += hp[h * Dh + i] * R[(((size_t)h * Dh + i) * 4 + g) * Dh + j];
                r[(size_t)g * D + h * Dh + j] = s;
            }
}

// The stabilised gates of one cell: m, i', f' from r_i, r_f and the previous n, m.
static void gates(double ri, double rf, double np, double mp, double *m, double *ip, double *fp) {
    double lf = logsigmoid(rf) + mp;
    *m = np == 0 ? ri : fmax(lf, ri);
    *ip = fmin(1, exp(ri - *m));
    *fp = fmin(1, exp(lf - *m));
}

int ref_slstm_fwd(const Backend *be, const SlstmDims *d, const SlstmFwd *io) {
    const char *fn = "slstm_fwd";
    MN_TRY(ref_slstm_check(fn, d));
    if (!io || !io->x || !io->r || !io->h) return mn_error(MN_ERR_ARG, "%s: x, r and h are required", fn);
    int B = d->B, T = d->T, D = d->H * d->Dh;
    const double *x = io->x, *R = io->r, *s0 = io->s0;
    double *hout = io->h, *cache = io->cache, *sT = io->sT;
    // st: the state (h, c, n, m) [4][D]; nx the next one; r the pre-activations [4][D]
    double *st = mn_calloc((size_t)12 * D, sizeof(double));
    if (!st) return MN_ERR_NOMEM;
    double *nx = st + (size_t)4 * D, *r = nx + (size_t)4 * D;
    for (int b = 0; b < B; b++) {
        if (s0) memcpy(st, s0 + (size_t)b * 4 * D, sizeof(double) * 4 * D);
        else memset(st, 0, sizeof(double) * 4 * D);
        for (int t = 0; t < T; t++) {
            size_t bt = (size_t)b * T + t;
            preact(d, x + bt * 4 * D, R, st, r);
            for (int k = 0; k < D; k++) {
                double m, ip, fp;
                gates(r[k], r[D + k], st[2 * D + k], st[3 * D + k], &m, &ip, &fp);
                double z = tanh(r[2 * D + k]), o = sigmoid(r[3 * D + k]);
                double c = fp * st[D + k] + ip * z, n = fp * st[2 * D + k] + ip;
                nx[k] = o * c / n;
                nx[D + k] = c;
                nx[2 * D + k] = n;
                nx[3 * D + k] = m;
            }
            memcpy(st, nx, sizeof(double) * 4 * D);
            memcpy(hout + bt * D, st, sizeof(double) * D);
            if (cache) memcpy(cache + bt * 4 * D, st, sizeof(double) * 4 * D);
        }
        if (sT) memcpy(sT + (size_t)b * 4 * D, st, sizeof(double) * 4 * D);
    }
    mn_free(st);
    return MN_OK;
}

int ref_slstm_bwd(const Backend *be, const SlstmDims *d, const SlstmBwd *io) {
    const char *fn = "slstm_bwd";
    MN_TRY(ref_slstm_check(fn, d));
    if (!io || !io->x || !io->r || !io->cache || !io->dh || !io->dx || !io->dr)
        return mn_error(MN_ERR_ARG, "%s: x, r, cache, dh, dx and dr are required", fn);
    int B = d->B, T = d->T, H = d->H, Dh = d->Dh, D = H * Dh;
    const double *x = io->x, *R = io->r, *cache = io->cache, *dh = io->dh;
    double *dx = io->dx, *dR = io->dr, clip = d->clip;
    // zero: the state before the first step; r: pre-activations [4][D]; dhr: dh_rec [D]; dc, dn [D]
    double *zero = mn_calloc((size_t)12 * D, sizeof(double));
    if (!zero) return MN_ERR_NOMEM;
    double *r = zero + (size_t)4 * D, *dhr = r + (size_t)4 * D, *dc = dhr + D, *dn = dc + D;
    for (int b = 0; b < B; b++) {
        memset(dhr, 0, sizeof(double) * 3 * D);
        for (int t = T - 1; t >= 0; t--) {
            size_t bt = (size_t)b * T + t;
            const double *sp = t > 0 ? cache + (bt - 1) * 4 * D : zero, *s = cache + bt * 4 * D;
            double *dg = dx + bt * 4 * D;
            preact(d, x + bt * 4 * D, R, sp, r);
            for (int k = 0; k < D; k++) {
                // i', f' with the forward's m (kept in the cache)
                double m = s[3 * D + k], ip = fmin(1, exp(r[k] - m));
                double fp = fmin(1, exp(logsigmoid(r[D + k]) + sp[3 * D + k] - m));
                double z = tanh(r[2 * D + k]), o = sigmoid(r[3 * D + k]);
                double h = s[k], n = s[2 * D + k], dy = dh[bt * D + k] + dhr[k];
                dc[k] += dy * o / n;
                dn[k] -= dy * h / n;
                dg[k] = ip * (z * dc[k] + dn[k]);
                dg[D + k] = fp * (dc[k] * sp[D + k] + dn[k] * sp[2 * D + k]) * sigmoid(-r[D + k]);
                dg[2 * D + k] = dc[k] * ip * (1 - z * z);
                dg[3 * D + k] = (1 - o) * h * dy;
                dc[k] *= fp;
                dn[k] *= fp;
            }
            // dR += h_{t-1}^T dg;  dh_rec = R dg (per head), clipped
            for (int hd = 0; hd < H; hd++)
                for (int i = 0; i < Dh; i++) {
                    double hpi = sp[hd * Dh + i], a = 0;
                    for (int g = 0; g < 4; g++)
                        for (int j = 0; j < Dh; j++) {
                            size_t ri = (((size_t)hd * Dh + i) * 4 + g) * Dh + j;
                            double dgj = dg[(size_t)g * D + hd * Dh + j];
                            dR[ri] += hpi * dgj;
                            a += R[ri] * dgj;
                        }
                    dhr[hd * Dh + i] = clip > 0 ? fmin(fmax(a, -clip), clip) : a;
                }
        }
    }
    mn_free(zero);
    return MN_OK;
}

const SlstmOps ref_slstm = {.fwd = ref_slstm_fwd, .bwd = ref_slstm_bwd};
