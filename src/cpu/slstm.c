/*
 * The sLSTM core, float32 (the float64 reference, src/ref/slstm_ref.c, has the
 * step's and the backward's algebra in its header comment).
 *
 * Sequential over time; the heads in parallel, each head for all B sequences
 * at once. Per head, the recurrent kernel R_h is [Dh, 4 Dh] (gate-major
 * columns), so a step's pre-activations of the head are one product
 *
 *     r [B, 4 Dh] = x_t (gathered from [B,T,4,D]) + h_{t-1} [B, Dh] R_h
 *
 * and its recurrent gradient dh_rec [B, Dh] = dg_t [B, 4 Dh] R_h^T. The
 * backward recomputes every step's pre-activations in one product per head
 * from the cached h_{t-1}, overwrites them with the gate gradients going back
 * in time, and forms dR_h += h_{t-1}^T [Dh, B T] dg [B T, 4 Dh] with one more.
 *
 * The same bits for any thread count: a head's arithmetic is the same whoever
 * runs it (gemm cuts its products by their sizes alone, blas.h), and nothing is
 * summed across heads.
 */
#include <limits.h>
#include <math.h>
#include <string.h>

#include "blas.h"
#include "core/common.h"
#include "ref/ref.h"
#include "slstm_cpu.h"
#include "vmath.h"

static int check(const char *fn, const SlstmDims *d) {
    MN_TRY(ref_slstm_check(fn, d));
    // gemm's sizes and leading dimensions are ints: B T rows, T 4 Dh columns apart
    if ((long)d->B * d->T * 4 * d->Dh > INT_MAX)
        return mn_error(MN_ERR_UNSUPPORTED, "%s: B T 4 Dh = %ld is too large (at most %d)", fn,
                        (long)d->B * d->T * 4 * d->Dh, INT_MAX);
    return MN_OK;
}

// The step's loops vectorise (vmath.h's expf, tanhf, log1pf) only without branches: the clamps
// are written without comparisons, min(1, exp(a)) as exp(min0(a)) (the same number: exp(0) = 1), or
// GCC would turn them into branches around a folded exp(0) = 1, which -ftrapping-math then keeps
// from being if-converted. fminf, fmaxf do not vectorise at all.
static inline float min0(float a) { return 0.5f * (a - fabsf(a)); }  // min(a, 0) exactly: a - |a| is 0 or 2a
static inline float maxf_(float a, float b) { return a > b ? a : b; }
static inline float logsigmoidf(float x) { return min0(x) - log1pf(expf(-fabsf(x))); }

// One step of one sequence in one head: the pre-activations r [4][Dh] (gate-major), the state rows
// h, c, n, m [Dh] updated in place.
static void fwd_cells(const float *restrict r, float *restrict h, float *restrict c, float *restrict n,
                      float *restrict m, int Dh) {
    for (int j = 0; j < Dh; j++) {
        float ri = r[j], rf = r[Dh + j], rz = r[2 * Dh + j], ro = r[3 * Dh + j];
        float lf = logsigmoidf(rf) + m[j];
        float mt = n[j] == 0 ? ri : maxf_(lf, ri);
        float ip = expf(min0(ri - mt)), fp = expf(min0(lf - mt));
        float z = tanhf(rz), o = 1 / (1 + expf(-ro));
        float ct = fp * c[j] + ip * z, nt = fp * n[j] + ip;
        c[j] = ct;
        n[j] = nt;
        m[j] = mt;
        h[j] = o * ct / nt;
    }
}

// One step back of one sequence in one head: g [4][Dh] holds the pre-activations and receives the
// gate gradients; s, sp the step's and the previous state, (h, c, n, m) rows D apart; dhe, dhr the
// external and the recurrent gradient of h; dc, dn the carried ones, updated.
static void bwd_cells(float *restrict g, const float *restrict s, const float *restrict sp, size_t D,
                      const float *restrict dhe, const float *restrict dhr, float *restrict dc, float *restrict dn,
                      int Dh) {
    for (int j = 0; j < Dh; j++) {
        float ri = g[j], rf = g[Dh + j], rz = g[2 * Dh + j], ro = g[3 * Dh + j];
        float h = s[j], n = s[2 * D + j], m = s[3 * D + j], cp = sp[D + j], np = sp[2 * D + j];
        float ip = expf(min0(ri - m)), fp = expf(min0(logsigmoidf(rf) + sp[3 * D + j] - m));
        float z = tanhf(rz), o = 1 / (1 + expf(-ro)), sf = 1 / (1 + expf(rf));
        float dy = dhe[j] + dhr[j];
        float dcj = dc[j] + dy * o / n, dnj = dn[j] - dy * h / n;
        g[j] = ip * (z * dcj + dnj);
        g[Dh + j] = fp * (dcj * cp + dnj * np) * sf;
        g[2 * Dh + j] = dcj * ip * (1 - z * z);
        g[3 * Dh + j] = (1 - o) * h * dy;
        dc[j] = fp * dcj;
        dn[j] = fp * dnj;
    }
}

int cpu_slstm_fwd(const Backend *be, const SlstmDims *d, const SlstmFwd *io) {
    const char *fn = "slstm_fwd";
    MN_TRY(check(fn, d));
    if (!io || !io->x || !io->r || !io->h) return mn_error(MN_ERR_ARG, "%s: x, r and h are required", fn);
    int B = d->B, T = d->T, H = d->H, Dh = d->Dh, D4 = 4 * Dh;
    size_t D = (size_t)H * Dh, bd = (size_t)B * Dh, per = 8 * bd;
    const float *x = io->x, *R = io->r, *s0 = io->s0;
    float *hout = io->h, *cache = io->cache, *sT = io->sT;
    float *work = mn_calloc(per * H, sizeof(float));
    if (!work) return MN_ERR_NOMEM;
#pragma omp parallel for schedule(static, 1) if (H > 1)
    for (int hd = 0; hd < H; hd++) {
        // the state (h, c, n, m), four [B, Dh], and the pre-activations rb [B, 4 Dh]
        float *st = work + per * hd, *rb = st + 4 * bd;
        const float *Rh = R + (size_t)hd * Dh * D4;
        size_t col = (size_t)hd * Dh;
        if (s0)
            for (int b = 0; b < B; b++)
                for (int q = 0; q < 4; q++)
                    memcpy(st + q * bd + (size_t)b * Dh, s0 + ((size_t)b * 4 + q) * D + col, sizeof(float) * Dh);
        for (int t = 0; t < T; t++) {
            for (int b = 0; b < B; b++)
                for (int g = 0; g < 4; g++)
                    memcpy(rb + (size_t)b * D4 + g * Dh, x + (((size_t)b * T + t) * 4 + g) * D + col,
                           sizeof(float) * Dh);
            gemm(0, 0, B, D4, Dh, 1, st, Dh, Rh, D4, 1, rb, D4);
            for (int b = 0; b < B; b++) {
                size_t bt = (size_t)b * T + t, o = (size_t)b * Dh;
                fwd_cells(rb + (size_t)b * D4, st + o, st + bd + o, st + 2 * bd + o, st + 3 * bd + o, Dh);
                memcpy(hout + bt * D + col, st + o, sizeof(float) * Dh);
                if (cache)
                    for (int q = 0; q < 4; q++)
                        memcpy(cache + (bt * 4 + q) * D + col, st + q * bd + o, sizeof(float) * Dh);
            }
        }
        if (sT)  // (a head writes the columns of s0 it alone has read: sT may alias s0)
            for (int b = 0; b < B; b++)
                for (int q = 0; q < 4; q++)
                    memcpy(sT + ((size_t)b * 4 + q) * D + col, st + q * bd + (size_t)b * Dh, sizeof(float) * Dh);
    }
    mn_free(work);
    return MN_OK;
}

int cpu_slstm_bwd(const Backend *be, const SlstmDims *d, const SlstmBwd *io) {
    const char *fn = "slstm_bwd";
    MN_TRY(check(fn, d));
    if (!io || !io->x || !io->r || !io->cache || !io->dh || !io->dx || !io->dr)
        return mn_error(MN_ERR_ARG, "%s: x, r, cache, dh, dx and dr are required", fn);
    int B = d->B, T = d->T, H = d->H, Dh = d->Dh, D4 = 4 * Dh, BT = B * T;
    size_t D = (size_t)H * Dh, bd = (size_t)B * Dh, per = (size_t)BT * 5 * Dh + 3 * bd;
    const float *x = io->x, *R = io->r, *cache = io->cache, *dh = io->dh;
    float *dx = io->dx, *dR = io->dr, clip = d->clip;
    // per head: hp [B T, Dh] the states h_{t-1}, G [B T, 4 Dh] pre-activations then gate gradients,
    // dhr, dc, dn [B, Dh]; then the zero state before the first step, [4, D] as the cache's rows
    float *work = mn_calloc(per * H + 4 * D, sizeof(float));
    if (!work) return MN_ERR_NOMEM;
    const float *zero = work + per * H;
#pragma omp parallel for schedule(static, 1) if (H > 1)
    for (int hd = 0; hd < H; hd++) {
        float *hp = work + per * hd, *G = hp + (size_t)BT * Dh, *dhr = G + (size_t)BT * D4, *dc = dhr + bd,
              *dn = dc + bd;
        const float *Rh = R + (size_t)hd * Dh * D4;
        size_t col = (size_t)hd * Dh;
        for (size_t n = 0; n < (size_t)BT; n++) {
            if (n % T) memcpy(hp + n * Dh, cache + (n - 1) * 4 * D + col, sizeof(float) * Dh);
            for (int g = 0; g < 4; g++) memcpy(G + n * D4 + g * Dh, x + (n * 4 + g) * D + col, sizeof(float) * Dh);
        }
        gemm(0, 0, BT, D4, Dh, 1, hp, Dh, Rh, D4, 1, G, D4);
        for (int t = T - 1; t >= 0; t--) {
            for (int b = 0; b < B; b++) {
                size_t n = (size_t)b * T + t;
                const float *s = cache + n * 4 * D + col, *sp = t ? s - 4 * D : zero + col;
                bwd_cells(G + n * D4, s, sp, D, dh + n * D + col, dhr + (size_t)b * Dh, dc + (size_t)b * Dh,
                          dn + (size_t)b * Dh, Dh);
            }
            if (t == 0) break;
            // dh_rec of step t-1 = dg_t R_h^T, the B rows of step t T 4 Dh apart in G
            gemm(0, 1, B, Dh, D4, 1, G + (size_t)t * D4, T * D4, Rh, D4, 0, dhr, Dh);
            if (clip > 0)
                for (size_t i = 0; i < bd; i++) dhr[i] = dhr[i] < -clip ? -clip : dhr[i] > clip ? clip : dhr[i];
        }
        for (size_t n = 0; n < (size_t)BT; n++)
            for (int g = 0; g < 4; g++) memcpy(dx + (n * 4 + g) * D + col, G + n * D4 + g * Dh, sizeof(float) * Dh);
        gemm(1, 0, Dh, D4, BT, 1, hp, Dh, G, D4, 1, dR + (size_t)hd * Dh * D4, D4);
    }
    mn_free(work);
    return MN_OK;
}

const SlstmOps cpu_slstm = {.fwd = cpu_slstm_fwd, .bwd = cpu_slstm_bwd};
