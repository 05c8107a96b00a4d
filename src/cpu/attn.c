/*
 * Causal softmax attention (full or sliding window, grouped key/value heads)
 * and rotary embeddings, float32 (attn_cpu.h).
 *
 * Forward: per (sequence, head, query tile of BQ rows), the key tiles that the
 * tile's rows can see, in order: S = scale Q K^T (BLAS), masked; the online
 * softmax keeps each row's running maximum m and sum l, rescales the
 * accumulator by exp(m_old - m_new) and adds exp(S - m_new) V (BLAS). Memory:
 * a BQ x BK score tile and a BQ x D accumulator per thread, never T x T.
 *
 * Backward, without a T x T matrix: P = exp(S - lse) recomputed tile by tile;
 * dP = dO V^T, dS = P (dP - Delta) with Delta_t = dO_t . O_t. Two passes, so
 * that each output block has one writer: over key tiles (dk += scale dS^T Q,
 * dv += P^T dO, over every query head of the group and every query tile that
 * sees the keys), then over query tiles (dq = scale dS K).
 */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "attn_cpu.h"
#include "blas.h"
#include "core/common.h"
#include "ref/ref.h"
#include "vmath.h"

enum { BQ = 64, BK = 128 };

static int imin(int a, int b) { return a < b ? a : b; }
static int imax(int a, int b) { return a > b ? a : b; }

// Row maximum and sum with 16 partial results, so that they vectorise without -ffast-math.
static float row_max(const float *r, int n) {
    float acc[16];
    for (int j = 0; j < 16; j++) acc[j] = -INFINITY;
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) acc[j] = r[i + j] > acc[j] ? r[i + j] : acc[j];
    for (; i < n; i++) acc[0] = r[i] > acc[0] ? r[i] : acc[0];
    for (int j = 1; j < 16; j++) acc[0] = acc[j] > acc[0] ? acc[j] : acc[0];
    return acc[0];
}

static float row_sum(const float *r, int n) {
    float acc[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) acc[j] += r[i + j];
    float s = 0;
    for (; i < n; i++) s += r[i];
    for (int j = 0; j < 8; j++) acc[j] += acc[j + 8];
    for (int j = 0; j < 4; j++) acc[j] += acc[j + 4];
    return s + (acc[0] + acc[2]) + (acc[1] + acc[3]);
}

// r = exp(r - m) (exp(-inf) = 0 for masked entries; libmvec's vector expf where available).
static void row_exp(float *restrict r, int n, float m) {
    for (int j = 0; j < n; j++) r[j] = expf(r[j] - m);
}

// Keys visible to query t: [lo(t), t].
static int key_lo(const AttnDims *d, int t) { return d->window > 0 ? imax(0, t - d->window + 1) : 0; }
// Queries that see key s: [s, hi(s)).
static int query_hi(const AttnDims *d, int s) { return d->window > 0 ? imin(d->T, s + d->window) : d->T; }

// Scores of query rows [t0, t0+nq) against key rows [s0, s0+nk) into S (nq x ldS), scaled, with
// the causal / window mask as -inf.
static void scores(const AttnDims *d, const float *q, const float *k, int b, int h, int hk, int t0, int nq, int s0,
                   int nk, float *S, int ldS) {
    int D = d->D;
    const float *qt = q + (((size_t)b * d->T + t0) * d->H + h) * D;
    const float *ks = k + (((size_t)b * d->T + s0) * d->Hkv + hk) * D;
    gemm(0, 1, nq, nk, D, d->scale, qt, d->H * D, ks, d->Hkv * D, 0, S, ldS);
    if (s0 + nk - 1 <= t0 && s0 >= key_lo(d, t0 + nq - 1)) return;  // every pair visible: no mask
    for (int i = 0; i < nq; i++) {
        int t = t0 + i, lo = key_lo(d, t);
        float *r = S + (size_t)i * ldS;
        for (int j = 0; j < nk; j++) {
            int s = s0 + j;
            if (s > t || s < lo) r[j] = -INFINITY;
        }
    }
}

int cpu_attn_fwd(const Backend *be, const AttnDims *d, const AttnFwd *io) {
    int rc = ref_attn_check("attn_fwd", d);
    if (rc) return rc;
    if (!io || !io->q || !io->k || !io->v || !io->o) return mn_error(MN_ERR_ARG, "attn_fwd: q, k, v and o are required");
    const float *q = io->q, *k = io->k, *v = io->v;
    float *o = io->o, *lse = io->lse;
    int B = d->B, T = d->T, H = d->H, Hkv = d->Hkv, D = d->D, g = H / Hkv;
    int nqt = (T + BQ - 1) / BQ;
    long items = (long)B * H * nqt;
    int fail = 0;
#pragma omp parallel
    {
        float *S = malloc(sizeof(float) * ((size_t)BQ * BK + (size_t)BQ * D + 2 * BQ));
        if (!S) {
#pragma omp atomic write
            fail = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (long it = 0; it < items; it++) {
            if (!S) continue;
            float *acc = S + (size_t)BQ * BK, *m = acc + (size_t)BQ * D, *l = m + BQ;
            // the longest tiles first: the last query tiles see the most keys
            int qt = nqt - 1 - (int)(it % nqt);
            int bh = (int)(it / nqt), b = bh / H, h = bh % H, hk = h / g;
            int t0 = qt * BQ, nq = imin(BQ, T - t0);
            for (int i = 0; i < nq; i++) m[i] = -INFINITY, l[i] = 0;
            memset(acc, 0, sizeof(float) * (size_t)nq * D);
            int klo = key_lo(d, t0), khi = t0 + nq;  // keys [klo, khi)
            for (int s0 = klo; s0 < khi; s0 += BK) {
                int nk = imin(BK, khi - s0);
                scores(d, q, k, b, h, hk, t0, nq, s0, nk, S, BK);
                for (int i = 0; i < nq; i++) {
                    float *r = S + (size_t)i * BK, mx = row_max(r, nk);
                    mx = mx > m[i] ? mx : m[i];
                    if (mx == -INFINITY) {  // nothing visible yet in this row
                        memset(r, 0, sizeof(float) * nk);
                        continue;
                    }
                    float alpha = expf(m[i] - mx);  // exp(-inf) = 0 on the first tile
                    row_exp(r, nk, mx);
                    l[i] = l[i] * alpha + row_sum(r, nk);
                    m[i] = mx;
                    if (alpha != 1) {
                        float *a = acc + (size_t)i * D;
                        for (int j = 0; j < D; j++) a[j] *= alpha;
                    }
                }
                const float *vs = v + (((size_t)b * T + s0) * Hkv + hk) * D;
                gemm(0, 0, nq, D, nk, 1, S, BK, vs, Hkv * D, 1, acc, D);
            }
            for (int i = 0; i < nq; i++) {
                size_t row = ((size_t)b * T + t0 + i) * H + h;
                float inv = 1 / l[i], *orow = o + row * D, *a = acc + (size_t)i * D;
                for (int j = 0; j < D; j++) orow[j] = a[j] * inv;
                if (lse) lse[row] = m[i] + logf(l[i]);
            }
        }
        free(S);
    }
    return fail ? mn_error(MN_ERR_NOMEM, "attn_fwd: out of memory") : MN_OK;
}

// P = exp(S - lse) and dS = P (dO V^T - Delta) for query rows [t0, t0+nq) of head h against
// keys [s0, s0+nk): P into S, dS into dP (both nq x BK).
static void probs_and_dS(const AttnDims *d, const AttnBwd *io, const float *delta, int b, int h, int hk, int t0,
                         int nq, int s0, int nk, float *S, float *dP) {
    int T = d->T, H = d->H, Hkv = d->Hkv, D = d->D;
    const float *lse = io->lse;
    scores(d, io->q, io->k, b, h, hk, t0, nq, s0, nk, S, BK);
    const float *dot = (const float *)io->dout + (((size_t)b * T + t0) * H + h) * D;
    const float *vs = (const float *)io->v + (((size_t)b * T + s0) * Hkv + hk) * D;
    gemm(0, 1, nq, nk, D, 1, dot, H * D, vs, Hkv * D, 0, dP, BK);
    for (int i = 0; i < nq; i++) {
        size_t row = ((size_t)b * T + t0 + i) * H + h;
        float L = lse[row], Dl = delta[row], *r = S + (size_t)i * BK, *dr = dP + (size_t)i * BK;
        row_exp(r, nk, L);  // masked: exp(-inf) = 0
        for (int j = 0; j < nk; j++) dr[j] = r[j] * (dr[j] - Dl);
    }
}

int cpu_attn_bwd(const Backend *be, const AttnDims *d, const AttnBwd *io) {
    int rc = ref_attn_check("attn_bwd", d);
    if (rc) return rc;
    if (!io || !io->q || !io->k || !io->v || !io->o || !io->lse || !io->dout || !io->dq || !io->dk || !io->dv)
        return mn_error(MN_ERR_ARG, "attn_bwd: q, k, v, o, lse, dout, dq, dk and dv are required");
    const float *q = io->q, *o = io->o, *dout = io->dout;
    float *dq = io->dq, *dk = io->dk, *dv = io->dv;
    int B = d->B, T = d->T, H = d->H, Hkv = d->Hkv, D = d->D, g = H / Hkv;
    size_t rows = (size_t)B * T * H;
    float *delta = malloc(sizeof(float) * rows);
    if (!delta) return mn_error(MN_ERR_NOMEM, "attn_bwd: out of memory");
#pragma omp parallel for if (rows * D > 32768)
    for (size_t r = 0; r < rows; r++) {
        float s = 0;
        for (int j = 0; j < D; j++) s += dout[r * D + j] * o[r * D + j];
        delta[r] = s;
    }
    int fail = 0;
    size_t per = (size_t)2 * BQ * BK + (size_t)2 * BK * D + (size_t)BQ * D;
    // pass 1: dk, dv per (sequence, kv head, key tile)
    int nkt = (T + BK - 1) / BK, nqt = (T + BQ - 1) / BQ;
#pragma omp parallel
    {
        float *S = malloc(sizeof(float) * per);
        if (!S) {
#pragma omp atomic write
            fail = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (long it = 0; it < (long)B * Hkv * nkt; it++) {
            if (!S) continue;
            float *dP = S + (size_t)BQ * BK, *dka = dP + (size_t)BQ * BK, *dva = dka + (size_t)BK * D;
            int kt = (int)(it % nkt), bk = (int)(it / nkt), b = bk / Hkv, hk = bk % Hkv;
            int s0 = kt * BK, nk = imin(BK, T - s0);
            memset(dka, 0, sizeof(float) * (size_t)2 * BK * D);
            int tlo = s0, thi = query_hi(d, s0 + nk - 1);  // queries [tlo, thi) see some key of the tile
            for (int h = hk * g; h < (hk + 1) * g; h++)
                for (int t0 = tlo; t0 < thi; t0 += BQ) {
                    int nq = imin(BQ, thi - t0);
                    probs_and_dS(d, io, delta, b, h, hk, t0, nq, s0, nk, S, dP);
                    const float *qt = q + (((size_t)b * T + t0) * H + h) * D;
                    const float *dot = dout + (((size_t)b * T + t0) * H + h) * D;
                    gemm(1, 0, nk, D, nq, 1, S, BK, dot, H * D, 1, dva, D);
                    gemm(1, 0, nk, D, nq, d->scale, dP, BK, qt, H * D, 1, dka, D);
                }
            for (int j = 0; j < nk; j++) {
                size_t r = (((size_t)b * T + s0 + j) * Hkv + hk) * D;
                memcpy(dk + r, dka + (size_t)j * D, sizeof(float) * D);
                memcpy(dv + r, dva + (size_t)j * D, sizeof(float) * D);
            }
        }
        // pass 2: dq per (sequence, head, query tile)
#pragma omp for schedule(dynamic, 1)
        for (long it = 0; it < (long)B * H * nqt; it++) {
            if (!S) continue;
            float *dP = S + (size_t)BQ * BK, *dqa = dP + (size_t)BQ * BK;
            int qt = nqt - 1 - (int)(it % nqt), bh = (int)(it / nqt), b = bh / H, h = bh % H, hk = h / g;
            int t0 = qt * BQ, nq = imin(BQ, T - t0);
            memset(dqa, 0, sizeof(float) * (size_t)BQ * D);
            int klo = key_lo(d, t0), khi = t0 + nq;
            for (int s0 = klo; s0 < khi; s0 += BK) {
                int nk = imin(BK, khi - s0);
                probs_and_dS(d, io, delta, b, h, hk, t0, nq, s0, nk, S, dP);
                const float *ks = (const float *)io->k + (((size_t)b * T + s0) * Hkv + hk) * D;
                gemm(0, 0, nq, D, nk, d->scale, dP, BK, ks, Hkv * D, 1, dqa, D);
            }
            for (int i = 0; i < nq; i++)
                memcpy(dq + (((size_t)b * T + t0 + i) * H + h) * D, dqa + (size_t)i * D, sizeof(float) * D);
        }
        free(S);
    }
    free(delta);
    return fail ? mn_error(MN_ERR_NOMEM, "attn_bwd: out of memory") : MN_OK;
}

int cpu_attn_decode(const Backend *be, const AttnDims *d, int n, int cap, const void *q_, const void *kc_,
                    const void *vc_, void *o_) {
    if (!d || d->B <= 0 || d->H <= 0 || d->Hkv <= 0 || d->D <= 0 || d->H % d->Hkv)
        return mn_error(MN_ERR_ARG, "attn_decode: bad dims");
    if (n <= 0 || n > cap) return mn_error(MN_ERR_ARG, "attn_decode: n = %d, must be in 1..cap = %d", n, cap);
    if (!q_ || !kc_ || !vc_ || !o_) return mn_error(MN_ERR_ARG, "attn_decode: q, kc, vc and o are required");
    const float *q = q_, *kc = kc_, *vc = vc_;
    float *o = o_;
    int B = d->B, H = d->H, Hkv = d->Hkv, D = d->D, g = H / Hkv;
    int fail = 0;
#pragma omp parallel if ((long)B * H * n * D > 32768)
    {
        float *p = malloc(sizeof(float) * (size_t)n);
        if (!p) {
#pragma omp atomic write
            fail = 1;
        }
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * H; bh++) {
            if (!p) continue;
            int b = bh / H, h = bh % H, hk = h / g;
            const float *qh = q + (size_t)bh * D;
            float *oh = o + (size_t)bh * D, m = -INFINITY, z = 0;
            for (int s = 0; s < n; s++) {
                const float *ks = kc + (((size_t)b * cap + s) * Hkv + hk) * D;
                float a = 0;
                for (int j = 0; j < D; j++) a += qh[j] * ks[j];
                p[s] = a * d->scale;
                m = p[s] > m ? p[s] : m;
            }
            for (int s = 0; s < n; s++) z += p[s] = expf(p[s] - m);
            float inv = 1 / z;
            for (int j = 0; j < D; j++) oh[j] = 0;
            for (int s = 0; s < n; s++) {
                const float *vs = vc + (((size_t)b * cap + s) * Hkv + hk) * D;
                float w = p[s] * inv;
                for (int j = 0; j < D; j++) oh[j] += w * vs[j];
            }
        }
        free(p);
    }
    return fail ? mn_error(MN_ERR_NOMEM, "attn_decode: out of memory") : MN_OK;
}

int cpu_rope(const Backend *be, void *x_, const void *pos_, int N, int H, int D, int rot, float theta, int inverse) {
    MN_TRY(ref_rope_check(x_, pos_, N, H, D, rot, theta));
    float *x = x_;
    const int32_t *pos = pos_;
    int half = rot / 2;
    double lt = log((double)theta);
    int fail = 0;
#pragma omp parallel if ((long)N * H * D > 32768) reduction(| : fail)
    {
        float *cs = malloc(sizeof(float) * (size_t)rot);  // cos, sin per frequency
        fail |= !cs;
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            if (!cs) continue;
            for (int i = 0; i < half; i++) {
                // the angle in double: positions in the 1e5s would lose it in float
                double a = pos[n] * exp(-2.0 * i / rot * lt);
                cs[i] = (float)cos(a);
                cs[half + i] = (float)(inverse ? -sin(a) : sin(a));
            }
            for (int h = 0; h < H; h++) {
                float *r = x + ((size_t)n * H + h) * D;
                for (int i = 0; i < half; i++) {
                    float x1 = r[i], x2 = r[i + half], c = cs[i], s = cs[half + i];
                    r[i] = x1 * c - x2 * s;
                    r[i + half] = x2 * c + x1 * s;
                }
            }
        }
        free(cs);
    }
    return fail ? mn_error(MN_ERR_NOMEM, "rope: out of memory") : MN_OK;
}
