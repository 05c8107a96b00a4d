/*
 * The attention family (causal softmax attention, full or within a sliding
 * window, grouped key/value heads; rotary position embeddings), float64, the
 * plainest loops: one query at a time, a stable softmax (the row's maximum
 * subtracted), no tiling. The ground truth the float32 CPU cores are tested
 * against. Buffers are the reference backend's: double, int32 for positions.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/common.h"
#include "ref.h"

int ref_attn_check(const char *fn, const AttnDims *d) {
    if (!d) return mn_error(MN_ERR_ARG, "%s: dims are NULL", fn);
    if (d->B <= 0 || d->T <= 0 || d->H <= 0 || d->Hkv <= 0 || d->D <= 0)
        return mn_error(MN_ERR_ARG, "%s: B, T, H, Hkv, D must be > 0 (got %d, %d, %d, %d, %d)", fn, d->B, d->T, d->H,
                        d->Hkv, d->D);
    if (d->H % d->Hkv) return mn_error(MN_ERR_ARG, "%s: Hkv = %d does not divide H = %d", fn, d->Hkv, d->H);
    if (d->window < 0) return mn_error(MN_ERR_ARG, "%s: window = %d, must be >= 0", fn, d->window);
    return MN_OK;
}

// The first key a query at t sees.
static int first_key(const AttnDims *d, int t) { return d->window > 0 && t - d->window + 1 > 0 ? t - d->window + 1 : 0; }

static double dot(const double *a, const double *b, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

// p[s - s0] = softmax over s in [s0, t] of scale q . k_s; returns the log-sum-exp.
static double row_softmax(const AttnDims *d, const double *q, const double *k, int b, int hk, int s0, int t,
                          double *p) {
    int D = d->D;
    double m = -INFINITY;
    for (int s = s0; s <= t; s++) {
        p[s - s0] = d->scale * dot(q, k + (((size_t)b * d->T + s) * d->Hkv + hk) * D, D);
        if (p[s - s0] > m) m = p[s - s0];
    }
    double z = 0;
    for (int s = s0; s <= t; s++) z += p[s - s0] = exp(p[s - s0] - m);
    for (int s = s0; s <= t; s++) p[s - s0] /= z;
    return m + log(z);
}

int ref_attn_fwd(const Backend *be, const AttnDims *d, const AttnFwd *io) {
    int rc = ref_attn_check("attn_fwd", d);
    if (rc) return rc;
    if (!io || !io->q || !io->k || !io->v || !io->o) return mn_error(MN_ERR_ARG, "attn_fwd: q, k, v and o are required");
    const double *q = io->q, *k = io->k, *v = io->v;
    double *o = io->o, *lse = io->lse;
    int B = d->B, T = d->T, H = d->H, Hkv = d->Hkv, D = d->D, g = H / Hkv;
    double *p = mn_calloc((size_t)T, sizeof(double));
    if (!p) return MN_ERR_NOMEM;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++) {
                size_t row = ((size_t)b * T + t) * H + h;
                int s0 = first_key(d, t), hk = h / g;
                double l = row_softmax(d, q + row * D, k, b, hk, s0, t, p);
                if (lse) lse[row] = l;
                double *orow = o + row * D;
                for (int j = 0; j < D; j++) orow[j] = 0;
                for (int s = s0; s <= t; s++) {
                    const double *vs = v + (((size_t)b * T + s) * Hkv + hk) * D;
                    for (int j = 0; j < D; j++) orow[j] += p[s - s0] * vs[j];
                }
            }
    mn_free(p);
    return MN_OK;
}

int ref_attn_bwd(const Backend *be, const AttnDims *d, const AttnBwd *io) {
    int rc = ref_attn_check("attn_bwd", d);
    if (rc) return rc;
    if (!io || !io->q || !io->k || !io->v || !io->o || !io->dout || !io->dq || !io->dk || !io->dv)
        return mn_error(MN_ERR_ARG, "attn_bwd: q, k, v, o, dout, dq, dk and dv are required");
    const double *q = io->q, *k = io->k, *v = io->v, *o = io->o, *dout = io->dout;
    double *dq = io->dq, *dk = io->dk, *dv = io->dv;
    int B = d->B, T = d->T, H = d->H, Hkv = d->Hkv, D = d->D, g = H / Hkv;
    size_t nkv = (size_t)B * T * Hkv * D;
    memset(dk, 0, nkv * sizeof(double));
    memset(dv, 0, nkv * sizeof(double));
    double *p = mn_calloc((size_t)T, sizeof(double));
    if (!p) return MN_ERR_NOMEM;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++) {
                size_t row = ((size_t)b * T + t) * H + h;
                int s0 = first_key(d, t), hk = h / g;
                const double *qt = q + row * D, *dot_ = dout + row * D;
                row_softmax(d, qt, k, b, hk, s0, t, p);  // P recomputed; lse not needed at float64
                double Dt = dot(dot_, o + row * D, D);
                double *dqt = dq + row * D;
                for (int j = 0; j < D; j++) dqt[j] = 0;
                for (int s = s0; s <= t; s++) {
                    size_t kr = (((size_t)b * T + s) * Hkv + hk) * D;
                    double P = p[s - s0];
                    double dS = P * (dot(dot_, v + kr, D) - Dt);
                    for (int j = 0; j < D; j++) {
                        dqt[j] += d->scale * dS * k[kr + j];
                        dk[kr + j] += d->scale * dS * qt[j];
                        dv[kr + j] += P * dot_[j];
                    }
                }
            }
    mn_free(p);
    return MN_OK;
}

int ref_attn_decode(const Backend *be, const AttnDims *d, int n, int cap, const void *q_, const void *kc_,
                    const void *vc_, void *o_) {
    if (!d || d->B <= 0 || d->H <= 0 || d->Hkv <= 0 || d->D <= 0 || d->H % d->Hkv)
        return mn_error(MN_ERR_ARG, "attn_decode: bad dims");
    if (n <= 0 || n > cap) return mn_error(MN_ERR_ARG, "attn_decode: n = %d, must be in 1..cap = %d", n, cap);
    if (!q_ || !kc_ || !vc_ || !o_) return mn_error(MN_ERR_ARG, "attn_decode: q, kc, vc and o are required");
    const double *q = q_, *kc = kc_, *vc = vc_;
    double *o = o_;
    int B = d->B, H = d->H, Hkv = d->Hkv, D = d->D, g = H / Hkv;
    double *p = mn_calloc((size_t)n, sizeof(double));
    if (!p) return MN_ERR_NOMEM;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const double *qh = q + ((size_t)b * H + h) * D;
            double *oh = o + ((size_t)b * H + h) * D;
            int hk = h / g;
            double m = -INFINITY, z = 0;
            for (int s = 0; s < n; s++) {
                p[s] = d->scale * dot(qh, kc + (((size_t)b * cap + s) * Hkv + hk) * D, D);
                if (p[s] > m) m = p[s];
            }
            for (int s = 0; s < n; s++) z += p[s] = exp(p[s] - m);
            for (int j = 0; j < D; j++) oh[j] = 0;
            for (int s = 0; s < n; s++) {
                const double *vs = vc + (((size_t)b * cap + s) * Hkv + hk) * D;
                for (int j = 0; j < D; j++) oh[j] += p[s] / z * vs[j];
            }
        }
    mn_free(p);
    return MN_OK;
}

int ref_rope_check(const void *x, const void *pos, int N, int H, int D, int rot, float theta) {
    if (N <= 0 || H <= 0 || D <= 0 || rot <= 0 || rot > D || rot % 2)
        return mn_error(MN_ERR_ARG, "rope: N, H, D > 0 and an even rot in (0, D] are required (got N %d, H %d, D %d, "
                                    "rot %d)", N, H, D, rot);
    if (!(theta > 0)) return mn_error(MN_ERR_ARG, "rope: theta must be > 0");
    if (!x || !pos) return mn_error(MN_ERR_ARG, "rope: x and pos are required");
    return MN_OK;
}

int ref_rope(const Backend *be, void *x_, const void *pos_, int N, int H, int D, int rot, float theta, int inverse) {
    MN_TRY(ref_rope_check(x_, pos_, N, H, D, rot, theta));
    double *x = x_;
    const int32_t *pos = pos_;
    int half = rot / 2;
    for (int n = 0; n < N; n++)
        for (int i = 0; i < half; i++) {
            double a = pos[n] * pow((double)theta, -2.0 * i / rot), c = cos(a), s = inverse ? -sin(a) : sin(a);
            for (int h = 0; h < H; h++) {
                double *r = x + ((size_t)n * H + h) * D, x1 = r[i], x2 = r[i + half];
                r[i] = x1 * c - x2 * s;
                r[i + half] = x2 * c + x1 * s;
            }
        }
    return MN_OK;
}
