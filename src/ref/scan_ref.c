/*
 * The diagonal recurrences (core/backend.h's ScanOps; docs/spec/mixers.md sections 3 and 6,
 * docs/spec/reference/gdn-longhorn-notes.md B.2-B.3), float64, the plainest loops: one sequence,
 * one step, one channel at a time. Per channel c and slot j, h_t = a_t h_{t-1} + b_t.
 *
 * RG-LRU (N = 1), r = sigmoid(r~), i = sigmoid(i~), sp = softplus(w):
 *     la = -8 r sp;  a = exp(la);  u = 1 - a^2 = -expm1(2 la);  m = sqrt(u);  h = a h + m i x
 * with a = 0, m = 1 at t = 0 under `reset`. Its backward, with dh_t = dy_t + a_{t+1} dh_{t+1}:
 *     dx = dh m i;  di~ = dh m x i (1 - i);  du = dh i x / (2 sqrt(max(u, 1/(4 1000^2))))
 *     dla = dh h_{t-1} a - 2 a^2 du;  dr~ = -8 sp dla r (1 - r);  dw += -8 r dla sigmoid(w)
 * (transformers' SqrtBoundDerivative: the bound changes nothing where u >= 2.5e-7; at a reset
 * position a and m are constants, so r~ and w get nothing from it). 1 - sigmoid(z) is computed as
 * sigmoid(-z) here and in the other backends: 1 - sigmoid(z) would cancel for large z.
 *
 * Longhorn (N = d_state), beta = sigmoid(r~ + w), kappa = |k|^2, Delta = beta / (1 + beta kappa):
 *     h[c,j] = (1 - Delta k_j^2) h[c,j] + Delta x k_j;  y = sum_j h[c,j] q_j + skip x
 * and its backward (B.3), dS_t = dy_t q_t + a_{t+1} dS_{t+1}:
 *     dq_j = sum_c S_t[c,j] dy[c];  dDelta = sum_j dS_j (x k_j - S_{t-1,j} k_j^2)
 *     dk_j = sum_c dS_j Delta (x - 2 S_{t-1,j} k_j) + 2 k_j dkappa,  dkappa = -sum_c dDelta Delta^2
 *     dx = sum_j dS_j Delta k_j + skip dy;  dr~ = dDelta beta (1 - beta) / (1 + beta kappa)^2
 *     dw += dr~;  dskip += dy x
 *
 * The backward keeps every state of a sequence (T C N doubles): speed and memory are not the
 * reference's concern.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/common.h"
#include "ref.h"

// transformers' SqrtBoundDerivative(max_grad = 1000): d sqrt(u)/du is taken at max(u, 1/(4 1000^2)).
#define SQRT_U_MIN (1.0 / (4.0 * 1000.0 * 1000.0))

int ref_scan_check(const char *fn, const ScanDims *d) {
    if (!d) return mn_error(MN_ERR_ARG, "%s: dims are NULL", fn);
    if (d->kind != SCAN_RGLRU && d->kind != SCAN_LONGHORN)
        return mn_error(MN_ERR_ARG, "%s: unknown scan kind %d (SCAN_RGLRU or SCAN_LONGHORN)", fn, (int)d->kind);
    if (d->B <= 0 || d->T <= 0 || d->C <= 0 || d->N <= 0)
        return mn_error(MN_ERR_ARG, "%s: B, T, C, N must be > 0 (got %d, %d, %d, %d)", fn, d->B, d->T, d->C, d->N);
    if (d->kind == SCAN_RGLRU && d->N != 1)
        return mn_error(MN_ERR_ARG, "%s: the RG-LRU has one state slot a channel: N must be 1, got %d", fn, d->N);
    if (d->reset != 0 && d->reset != 1) return mn_error(MN_ERR_ARG, "%s: reset must be 0 or 1, got %d", fn, d->reset);
    if (d->reset && d->kind != SCAN_RGLRU)
        return mn_error(MN_ERR_ARG, "%s: reset applies to SCAN_RGLRU only (Longhorn starts from s0 or zero)", fn);
    if (d->w_seqs < 0 || (d->w_seqs > 0 && (d->B % d->w_seqs || d->w_stride < (size_t)d->C)))
        return mn_error(MN_ERR_ARG, "%s: w_seqs = %d, w_stride = %zu: 0, or a divisor of the %d sequences with a "
                                    "stride of at least C = %d", fn, d->w_seqs, d->w_stride, d->B, d->C);
    return MN_OK;
}

int ref_scan_check_fwd(const char *fn, const ScanDims *d, const ScanFwd *io) {
    MN_TRY(ref_scan_check(fn, d));
    if (!io) return mn_error(MN_ERR_ARG, "%s: io is NULL", fn);
    if (!io->x || !io->r || !io->w || !io->y) return mn_error(MN_ERR_ARG, "%s: x, r, w and y are required", fn);
    if (d->kind == SCAN_RGLRU && !io->i) return mn_error(MN_ERR_ARG, "%s: SCAN_RGLRU needs the input gate i", fn);
    if (d->kind == SCAN_LONGHORN && (!io->k || !io->q || !io->skip))
        return mn_error(MN_ERR_ARG, "%s: SCAN_LONGHORN needs k, q and skip", fn);
    return MN_OK;
}

int ref_scan_check_bwd(const char *fn, const ScanDims *d, const ScanBwd *io) {
    MN_TRY(ref_scan_check(fn, d));
    if (!io) return mn_error(MN_ERR_ARG, "%s: io is NULL", fn);
    if (!io->x || !io->r || !io->w || !io->dy || !io->dx || !io->dr || !io->dw)
        return mn_error(MN_ERR_ARG, "%s: x, r, w, dy, dx, dr and dw are required", fn);
    if (d->kind == SCAN_RGLRU && (!io->i || !io->di))
        return mn_error(MN_ERR_ARG, "%s: SCAN_RGLRU needs the input gate i and di", fn);
    if (d->kind == SCAN_LONGHORN && (!io->k || !io->q || !io->skip || !io->dk || !io->dq || !io->dskip))
        return mn_error(MN_ERR_ARG, "%s: SCAN_LONGHORN needs k, q, skip, dk, dq and dskip", fn);
    return MN_OK;
}

static double sigmoid(double x) { return 1 / (1 + exp(-x)); }
static double softplus(double x) { return fmax(x, 0) + log1p(exp(-fabs(x))); }

// The RG-LRU's decay a and input multiplier m at one position (first: t = 0 under reset).
static void rglru_gates(double rt, double w, int first, double *a, double *m) {
    if (first) {
        *a = 0;
        *m = 1;
        return;
    }
    double la = -8 * sigmoid(rt) * softplus(w);
    *a = exp(la);
    *m = sqrt(-expm1(2 * la));
}

// Sequence b's forward (io's inputs): h [C,N] the state, updated; y (if not NULL) [T,C] the
// sequence's outputs; hs (if not NULL) [T,C,N] receives every state.
static void fwd_seq(const ScanDims *d, const ScanFwd *io, int b, double *h, double *y, double *hs) {
    int T = d->T, C = d->C, N = d->N;
    const double *w = (const double *)io->w + scan_w_at(d, b);
    const double *skip = io->skip ? (const double *)io->skip + scan_w_at(d, b) : NULL;
    for (int t = 0; t < T; t++) {
        size_t row = ((size_t)b * T + t) * C;
        const double *x = (const double *)io->x + row, *r = (const double *)io->r + row;
        if (d->kind == SCAN_RGLRU) {
            const double *ig = (const double *)io->i + row;
            for (int c = 0; c < C; c++) {
                double a, m;
                rglru_gates(r[c], w[c], d->reset && t == 0, &a, &m);
                h[c] = a * h[c] + m * sigmoid(ig[c]) * x[c];
                if (y) y[(size_t)t * C + c] = h[c];
            }
        } else {
            const double *k = (const double *)io->k + ((size_t)b * T + t) * N;
            const double *q = (const double *)io->q + ((size_t)b * T + t) * N;
            double kappa = 0;
            for (int j = 0; j < N; j++) kappa += k[j] * k[j];
            for (int c = 0; c < C; c++) {
                double beta = sigmoid(r[c] + w[c]), delta = beta / (1 + beta * kappa), o = skip[c] * x[c];
                double *hc = h + (size_t)c * N;
                for (int j = 0; j < N; j++) {
                    hc[j] = (1 - delta * k[j] * k[j]) * hc[j] + delta * x[c] * k[j];
                    o += hc[j] * q[j];
                }
                if (y) y[(size_t)t * C + c] = o;
            }
        }
        if (hs) memcpy(hs + (size_t)t * C * N, h, sizeof(double) * C * N);
    }
}

int ref_scan_fwd(const Backend *be, const ScanDims *d, const ScanFwd *io) {
    MN_TRY(ref_scan_check_fwd("scan_fwd", d, io));
    size_t cn = (size_t)d->C * d->N;
    double *h = mn_calloc(cn, sizeof(double));
    if (!h) return MN_ERR_NOMEM;
    for (int b = 0; b < d->B; b++) {
        if (io->s0) memcpy(h, (const double *)io->s0 + b * cn, sizeof(double) * cn);
        else memset(h, 0, sizeof(double) * cn);
        fwd_seq(d, io, b, h, (double *)io->y + (size_t)b * d->T * d->C, NULL);
        if (io->sT) memcpy((double *)io->sT + b * cn, h, sizeof(double) * cn);
    }
    mn_free(h);
    return MN_OK;
}

// One RG-LRU step back at (t, c): dh the state's gradient there (dy plus what t + 1 passed down),
// hp the state before; writes dx, dr~, di~, adds to *dw, returns what passes on to h_{t-1}.
static double rglru_back(double dh, double hp, double x, double rt, double it, double w, int first, double *dx,
                         double *dr, double *di, double *dw) {
    double a, m, ig = sigmoid(it);
    rglru_gates(rt, w, first, &a, &m);
    *dx = dh * m * ig;
    *di = dh * m * x * ig * sigmoid(-it);
    *dr = 0;
    if (first) return 0;
    double rg = sigmoid(rt), sp = softplus(w), u = -expm1(-16 * rg * sp);
    double du = dh * ig * x / (2 * sqrt(fmax(u, SQRT_U_MIN)));
    double dla = dh * hp * a - 2 * a * a * du;
    *dr = -8 * sp * dla * rg * sigmoid(-rt);
    *dw += -8 * rg * dla * sigmoid(w);
    return a * dh;
}

int ref_scan_bwd(const Backend *be, const ScanDims *d, const ScanBwd *io) {
    MN_TRY(ref_scan_check_bwd("scan_bwd", d, io));
    int T = d->T, C = d->C, N = d->N;
    size_t cn = (size_t)C * N;
    const double *dy = io->dy;
    // hs [T+1][C][N]: the zero state (never written), then every step's; g [C][N]: the running
    // state of the recomputed forward, then a_{t+1} dS_{t+1}
    double *hs = mn_calloc((size_t)(T + 2) * cn, sizeof(double));
    if (!hs) return MN_ERR_NOMEM;
    double *g = hs + (size_t)(T + 1) * cn;
    ScanFwd f = {io->x, io->r, io->i, io->k, io->q, io->w, io->skip, NULL, NULL, NULL};
    for (int b = 0; b < d->B; b++) {
        const size_t wo = scan_w_at(d, b);  // the sequence's group's w, skip, dw, dskip
        const double *w = (const double *)io->w + wo, *skip = io->skip ? (const double *)io->skip + wo : NULL;
        memset(g, 0, sizeof(double) * cn);
        fwd_seq(d, &f, b, g, NULL, hs + cn);
        memset(g, 0, sizeof(double) * cn);
        for (int t = T - 1; t >= 0; t--) {
            size_t row = ((size_t)b * T + t) * C;
            const double *x = (const double *)io->x + row, *r = (const double *)io->r + row, *dyt = dy + row;
            const double *hp = hs + (size_t)t * cn, *ht = hs + (size_t)(t + 1) * cn;
            double *dx = (double *)io->dx + row, *dr = (double *)io->dr + row;
            if (d->kind == SCAN_RGLRU) {
                const double *it = (const double *)io->i + row;
                double *di = (double *)io->di + row, *dw = (double *)io->dw + wo;
                for (int c = 0; c < C; c++)
                    g[c] = rglru_back(dyt[c] + g[c], hp[c], x[c], r[c], it[c], w[c], d->reset && t == 0, dx + c,
                                      dr + c, di + c, dw + c);
                continue;
            }
            size_t kr = ((size_t)b * T + t) * N;
            const double *k = (const double *)io->k + kr, *q = (const double *)io->q + kr;
            double *dk = (double *)io->dk + kr, *dq = (double *)io->dq + kr, *dw = (double *)io->dw + wo;
            double *dskip = (double *)io->dskip + wo;
            double kappa = 0, dkappa = 0;
            for (int j = 0; j < N; j++) {
                kappa += k[j] * k[j];
                dk[j] = dq[j] = 0;
            }
            for (int c = 0; c < C; c++) {
                double beta = sigmoid(r[c] + w[c]), den = 1 + beta * kappa, delta = beta / den, ddelta = 0;
                double dxc = skip[c] * dyt[c];
                for (int j = 0; j < N; j++) {
                    size_t cj = (size_t)c * N + j;
                    double ds = dyt[c] * q[j] + g[cj];
                    dq[j] += ht[cj] * dyt[c];
                    ddelta += ds * (x[c] * k[j] - hp[cj] * k[j] * k[j]);
                    dk[j] += ds * delta * (x[c] - 2 * hp[cj] * k[j]);
                    dxc += ds * delta * k[j];
                    g[cj] = (1 - delta * k[j] * k[j]) * ds;
                }
                dx[c] = dxc;
                dkappa -= ddelta * delta * delta;
                dr[c] = ddelta / (den * den) * beta * sigmoid(-(r[c] + w[c]));
                dw[c] += dr[c];
                dskip[c] += dyt[c] * x[c];
            }
            for (int j = 0; j < N; j++) dk[j] += 2 * k[j] * dkappa;
        }
    }
    mn_free(hs);
    return MN_OK;
}

const ScanOps ref_scan = {.fwd = ref_scan_fwd, .bwd = ref_scan_bwd};
