/*
 * The float64 reference backend: every op of core/backend.h as the plainest
 * loops in double precision, single-threaded. Buffers are double arrays
 * (int32 for MEM_I32). The Mesa core solves exactly (Cholesky), whatever the
 * solver asks: the reference is the ground truth, not a CG study.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/common.h"
#include "ref.h"

static size_t elem(MemKind k) { return k == MEM_I32 ? sizeof(int32_t) : sizeof(double); }

static size_t r_elem_size(const Backend *be, MemKind k) { return elem(k); }
static void *r_alloc(const Backend *be, size_t n, MemKind k) { return mn_calloc(n ? n : 1, elem(k)); }
static void r_free(const Backend *be, void *p) { mn_free(p); }
static void r_zero(const Backend *be, void *p, size_t n, MemKind k) { memset(p, 0, n * elem(k)); }
static void r_copy(const Backend *be, void *dst, const void *src, size_t n, MemKind k) { memmove(dst, src, n * elem(k)); }
static void r_copy_rows(const Backend *be, void *dst, size_t ds, const void *src, size_t ss, size_t rows, size_t n,
                        MemKind k) {
    size_t e = elem(k);
    for (size_t r = 0; r < rows; r++) memmove((char *)dst + r * ds * e, (const char *)src + r * ss * e, n * e);
}

static int r_upload(const Backend *be, void *dst, const double *src, size_t n, MemKind k) {
    memcpy(dst, src, n * sizeof(double));
    return MN_OK;
}
static int r_download(const Backend *be, double *dst, const void *src, size_t n, MemKind k) {
    memcpy(dst, src, n * sizeof(double));
    return MN_OK;
}
static int r_upload_f32(const Backend *be, void *dst, const float *src, size_t n, MemKind k) {
    double *d = dst;
    for (size_t i = 0; i < n; i++) d[i] = src[i];
    return MN_OK;
}
static int r_download_f32(const Backend *be, float *dst, const void *src, size_t n, MemKind k) {
    const double *s = src;
    for (size_t i = 0; i < n; i++) dst[i] = (float)s[i];
    return MN_OK;
}
static int r_sync(const Backend *be) { return MN_OK; }

static int r_linear_fwd(const Backend *be, void *y_, const void *x_, const void *w_, const void *b_, int N, int nin, int nout) {
    double *y = y_;
    const double *x = x_, *w = w_, *b = b_;
    for (int n = 0; n < N; n++)
        for (int o = 0; o < nout; o++) {
            double s = b ? b[o] : 0;
            for (int i = 0; i < nin; i++) s += x[(size_t)n * nin + i] * w[(size_t)o * nin + i];
            y[(size_t)n * nout + o] = s;
        }
    return MN_OK;
}

static int r_linear_bwd(const Backend *be, void *dx_, void *dw_, void *db_, const void *dy_, const void *x_,
                        const void *w_, int N, int nin, int nout, int accum) {
    double *dx = dx_, *dw = dw_, *db = db_;
    const double *dy = dy_, *x = x_, *w = w_;
    if (dx)
        for (int n = 0; n < N; n++)
            for (int i = 0; i < nin; i++) {
                double s = 0;
                for (int o = 0; o < nout; o++) s += dy[(size_t)n * nout + o] * w[(size_t)o * nin + i];
                dx[(size_t)n * nin + i] = (accum ? dx[(size_t)n * nin + i] : 0) + s;
            }
    for (int n = 0; n < N; n++)
        for (int o = 0; o < nout; o++) {
            double g = dy[(size_t)n * nout + o];
            if (dw)
                for (int i = 0; i < nin; i++) dw[(size_t)o * nin + i] += g * x[(size_t)n * nin + i];
            if (db) db[o] += g;
        }
    return MN_OK;
}

static int r_rmsnorm_fwd(const Backend *be, void *y_, void *rstd_, const void *x_, const void *w_, int N, int D,
                         int group, int wlen, float eps) {
    double *y = y_, *rstd = rstd_;
    const double *x = x_, *w = w_;
    for (size_t r = 0; r < (size_t)N * D / group; r++) {
        const double *xr = x + r * group;
        double ss = 0;
        for (int i = 0; i < group; i++) ss += xr[i] * xr[i];
        double rs = 1 / sqrt(ss / group + eps);
        rstd[r] = rs;
        const double *wr = w + (wlen == group ? 0 : (r % (D / group)) * group);
        for (int i = 0; i < group; i++) y[r * group + i] = xr[i] * rs * wr[i];
    }
    return MN_OK;
}

static int r_rmsnorm_bwd(const Backend *be, void *dx_, void *dw_, const void *dy_, const void *x_, const void *w_,
                         const void *rstd_, int N, int D, int group, int wlen, int accum) {
    double *dx = dx_, *dw = dw_;
    const double *dy = dy_, *x = x_, *w = w_, *rstd = rstd_;
    for (size_t r = 0; r < (size_t)N * D / group; r++) {
        const double *xr = x + r * group, *dyr = dy + r * group;
        size_t woff = wlen == group ? 0 : (r % (D / group)) * group;
        double rs = rstd[r], dot = 0;
        for (int i = 0; i < group; i++) dot += dyr[i] * w[woff + i] * xr[i];
        for (int i = 0; i < group; i++) {
            double g = rs * (dyr[i] * w[woff + i] - xr[i] * rs * rs * dot / group);
            dx[r * group + i] = (accum ? dx[r * group + i] : 0) + g;
            if (dw) dw[woff + i] += dyr[i] * xr[i] * rs;
        }
    }
    return MN_OK;
}

// LayerNorm without bias over groups (torch's LayerNorm / GroupNorm): the biased variance, taken
// about the mean (two passes).
static int r_layernorm_fwd(const Backend *be, void *y_, void *mean_, void *rstd_, const void *x_, const void *w_, int N,
                           int D, int group, int wlen, float eps) {
    double *y = y_, *mean = mean_, *rstd = rstd_;
    const double *x = x_, *w = w_;
    for (size_t r = 0; r < (size_t)N * D / group; r++) {
        const double *xr = x + r * group;
        double mu = 0, var = 0;
        for (int i = 0; i < group; i++) mu += xr[i];
        mu /= group;
        for (int i = 0; i < group; i++) var += (xr[i] - mu) * (xr[i] - mu);
        double rs = 1 / sqrt(var / group + eps);
        mean[r] = mu;
        rstd[r] = rs;
        const double *wr = w + (wlen == group ? 0 : (r % (D / group)) * group);
        for (int i = 0; i < group; i++) y[r * group + i] = (xr[i] - mu) * rs * wr[i];
    }
    return MN_OK;
}

// With xh = (x - mean) rstd and g = dy w: dx = rstd (g - mean(g) - xh mean(g xh));  dw += dy xh.
static int r_layernorm_bwd(const Backend *be, void *dx_, void *dw_, const void *dy_, const void *x_, const void *w_,
                           const void *mean_, const void *rstd_, int N, int D, int group, int wlen, int accum) {
    double *dx = dx_, *dw = dw_;
    const double *dy = dy_, *x = x_, *w = w_, *mean = mean_, *rstd = rstd_;
    for (size_t r = 0; r < (size_t)N * D / group; r++) {
        const double *xr = x + r * group, *dyr = dy + r * group;
        size_t woff = wlen == group ? 0 : (r % (D / group)) * group;
        double rs = rstd[r], mu = mean[r], sg = 0, sgx = 0;
        for (int i = 0; i < group; i++) {
            double g = dyr[i] * w[woff + i];
            sg += g;
            sgx += g * (xr[i] - mu) * rs;
        }
        for (int i = 0; i < group; i++) {
            double xh = (xr[i] - mu) * rs;
            double g = rs * (dyr[i] * w[woff + i] - sg / group - xh * sgx / group);
            dx[r * group + i] = (accum ? dx[r * group + i] : 0) + g;
            if (dw) dw[woff + i] += dyr[i] * xh;
        }
    }
    return MN_OK;
}

static int r_l2norm_fwd(const Backend *be, void *y_, void *inv_, const void *x_, int N, int D, int group, float eps) {
    double *y = y_, *inv = inv_;
    const double *x = x_;
    for (size_t r = 0; r < (size_t)N * D / group; r++) {
        double ss = 0;
        for (int i = 0; i < group; i++) ss += x[r * group + i] * x[r * group + i];
        inv[r] = 1 / sqrt(ss + eps);
        for (int i = 0; i < group; i++) y[r * group + i] = x[r * group + i] * inv[r];
    }
    return MN_OK;
}

static int r_l2norm_bwd(const Backend *be, void *dx_, const void *dy_, const void *y_, const void *inv_, int N, int D,
                        int group) {
    double *dx = dx_;
    const double *dy = dy_, *y = y_, *inv = inv_;
    for (size_t r = 0; r < (size_t)N * D / group; r++) {
        double dot = 0;
        for (int i = 0; i < group; i++) dot += dy[r * group + i] * y[r * group + i];
        for (int i = 0; i < group; i++) dx[r * group + i] = inv[r] * (dy[r * group + i] - y[r * group + i] * dot);
    }
    return MN_OK;
}

static double sigmoid(double x) { return 1 / (1 + exp(-x)); }

static int r_softcap(const Backend *be, void *x_, size_t n, float cap) {
    double *x = x_;
    for (size_t i = 0; i < n; i++) x[i] = cap * tanh(x[i] / cap);
    return MN_OK;
}

static int r_silu_fwd(const Backend *be, void *y_, const void *x_, size_t n) {
    double *y = y_;
    const double *x = x_;
    for (size_t i = 0; i < n; i++) y[i] = x[i] * sigmoid(x[i]);
    return MN_OK;
}

static double silu_grad(double x) {
    double s = sigmoid(x);
    return s * (1 + x * (1 - s));
}

static int r_silu_bwd(const Backend *be, void *dx_, const void *dy_, const void *x_, size_t n) {
    double *dx = dx_;
    const double *dy = dy_, *x = x_;
    for (size_t i = 0; i < n; i++) dx[i] = dy[i] * silu_grad(x[i]);
    return MN_OK;
}

static int r_swiglu_fwd(const Backend *be, void *h_, const void *g_, const void *u_, size_t n) {
    double *h = h_;
    const double *g = g_, *u = u_;
    for (size_t i = 0; i < n; i++) h[i] = g[i] * sigmoid(g[i]) * u[i];
    return MN_OK;
}

static int r_swiglu_bwd(const Backend *be, void *dg_, void *du_, const void *dh_, const void *g_, const void *u_,
                        size_t n) {
    double *dg = dg_, *du = du_;
    const double *dh = dh_, *g = g_, *u = u_;
    for (size_t i = 0; i < n; i++) {
        dg[i] = dh[i] * u[i] * silu_grad(g[i]);
        du[i] = dh[i] * g[i] * sigmoid(g[i]);
    }
    return MN_OK;
}

static int r_sigmoid_gate_fwd(const Backend *be, void *h_, const void *g_, const void *u_, size_t n) {
    double *h = h_;
    const double *g = g_, *u = u_;
    for (size_t i = 0; i < n; i++) h[i] = sigmoid(g[i]) * u[i];
    return MN_OK;
}

static int r_sigmoid_gate_bwd(const Backend *be, void *dg_, void *du_, const void *dh_, const void *g_, const void *u_,
                              size_t n) {
    double *dg = dg_, *du = du_;
    const double *dh = dh_, *g = g_, *u = u_;
    for (size_t i = 0; i < n; i++) {
        double s = sigmoid(g[i]);
        dg[i] = dh[i] * u[i] * s * (1 - s);
        du[i] = dh[i] * s;
    }
    return MN_OK;
}

// The block-diagonal projection: y[n,b,o] = sum_i w[b,o,i] x[n,b,i].
static int r_headwise_fwd(const Backend *be, void *y_, const void *x_, const void *w_, int N, int nb, int bin,
                          int bout) {
    double *y = y_;
    const double *x = x_, *w = w_;
    for (size_t n = 0; n < (size_t)N; n++)
        for (int b = 0; b < nb; b++)
            for (int o = 0; o < bout; o++) {
                double s = 0;
                for (int i = 0; i < bin; i++) s += w[((size_t)b * bout + o) * bin + i] * x[(n * nb + b) * bin + i];
                y[(n * nb + b) * bout + o] = s;
            }
    return MN_OK;
}

static int r_headwise_bwd(const Backend *be, void *dx_, void *dw_, const void *dy_, const void *x_, const void *w_,
                          int N, int nb, int bin, int bout, int accum) {
    double *dx = dx_, *dw = dw_;
    const double *dy = dy_, *x = x_, *w = w_;
    for (size_t n = 0; n < (size_t)N; n++)
        for (int b = 0; b < nb; b++) {
            const double *dyr = dy + (n * nb + b) * bout, *xr = x + (n * nb + b) * bin;
            double *dxr = dx + (n * nb + b) * bin;
            for (int i = 0; i < bin; i++) {
                double s = 0;
                for (int o = 0; o < bout; o++) s += dyr[o] * w[((size_t)b * bout + o) * bin + i];
                dxr[i] = (accum ? dxr[i] : 0) + s;
            }
            if (dw)
                for (int o = 0; o < bout; o++)
                    for (int i = 0; i < bin; i++) dw[((size_t)b * bout + o) * bin + i] += dyr[o] * xr[i];
        }
    return MN_OK;
}

static int r_bias_fwd(const Backend *be, void *y_, const void *b_, int N, int C) {
    double *y = y_;
    const double *b = b_;
    for (size_t n = 0; n < (size_t)N; n++)
        for (int c = 0; c < C; c++) y[n * C + c] += b[c];
    return MN_OK;
}

static int r_bias_bwd(const Backend *be, void *db_, const void *dy_, int N, int C) {
    double *db = db_;
    const double *dy = dy_;
    for (size_t n = 0; n < (size_t)N; n++)
        for (int c = 0; c < C; c++) db[c] += dy[n * C + c];
    return MN_OK;
}

// The learnable skip: y = a + s b over rows of C (y may alias a).
static int r_scale_add_fwd(const Backend *be, void *y_, const void *a_, const void *s_, const void *b_, int N, int C) {
    double *y = y_;
    const double *a = a_, *s = s_, *b = b_;
    for (size_t n = 0; n < (size_t)N; n++)
        for (int c = 0; c < C; c++) y[n * C + c] = a[n * C + c] + s[c] * b[n * C + c];
    return MN_OK;
}

static int r_scale_add_bwd(const Backend *be, void *db_, void *ds_, const void *dy_, const void *b_, const void *s_,
                           int N, int C, int accum) {
    double *db = db_, *ds = ds_;
    const double *dy = dy_, *b = b_, *s = s_;
    for (size_t n = 0; n < (size_t)N; n++)
        for (int c = 0; c < C; c++) {
            size_t i = n * C + c;
            if (ds) ds[c] += dy[i] * b[i];
            db[i] = (accum ? db[i] : 0) + dy[i] * s[c];
        }
    return MN_OK;
}

static int r_add(const Backend *be, void *x_, const void *y_, size_t n) {
    double *x = x_;
    const double *y = y_;
    for (size_t i = 0; i < n; i++) x[i] += y[i];
    return MN_OK;
}

// x at time t of sequence b, channel c, with t < 0 read from the state.
static double conv_input(const double *x, const double *state, int b, int t, int c, int T, int C, int K) {
    if (t >= 0) return x[((size_t)b * T + t) * C + c];
    return state ? state[((size_t)b * (K - 1) + (t + K - 1)) * C + c] : 0;
}

static int r_conv_fwd(const Backend *be, void *y_, const void *x_, const void *w_, int B, int T, int C, int K,
                      const void *sin_, void *sout_) {
    double *y = y_, *sout = sout_;
    const double *x = x_, *w = w_, *sin = sin_;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++) {
                double s = 0;
                for (int j = 0; j < K; j++) s += w[(size_t)c * K + j] * conv_input(x, sin, b, t - K + 1 + j, c, T, C, K);
                y[((size_t)b * T + t) * C + c] = s;
            }
    if (sout) {
        size_t n = (size_t)B * (K - 1) * C;
        double *tmp = malloc(sizeof(double) * (n ? n : 1));
        if (!tmp) return mn_error(MN_ERR_NOMEM, "out of memory");
        for (int b = 0; b < B; b++)
            for (int i = 0; i < K - 1; i++)
                for (int c = 0; c < C; c++)
                    tmp[((size_t)b * (K - 1) + i) * C + c] = conv_input(x, sin, b, T - (K - 1) + i, c, T, C, K);
        memcpy(sout, tmp, sizeof(double) * n);  // via tmp: state_out may alias state_in
        free(tmp);
    }
    return MN_OK;
}

static int r_conv_bwd(const Backend *be, void *dx_, void *dw_, const void *dy_, const void *x_, const void *w_, int B,
                      int T, int C, int K, const void *sin_) {
    double *dx = dx_, *dw = dw_;
    const double *dy = dy_, *x = x_, *w = w_, *sin = sin_;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++) {
                double s = 0;
                for (int j = 0; j < K; j++) {
                    int to = t + K - 1 - j;  // the output that reads x[t] through tap j
                    if (to < T) s += w[(size_t)c * K + j] * dy[((size_t)b * T + to) * C + c];
                }
                dx[((size_t)b * T + t) * C + c] = s;
            }
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++)
                for (int j = 0; j < K; j++)
                    dw[(size_t)c * K + j] += dy[((size_t)b * T + t) * C + c] * conv_input(x, sin, b, t - K + 1 + j, c, T, C, K);
    return MN_OK;
}

static int r_embed_fwd(const Backend *be, void *x_, const void *tok_, const void *e_, int N, int D, float scale) {
    double *x = x_;
    const int32_t *tok = tok_;
    const double *e = e_;
    for (int n = 0; n < N; n++)
        for (int i = 0; i < D; i++) x[(size_t)n * D + i] = scale * e[(size_t)tok[n] * D + i];
    return MN_OK;
}

static int r_embed_bwd(const Backend *be, void *de_, const void *dx_, const void *tok_, int N, int D, float scale) {
    double *de = de_;
    const double *dx = dx_;
    const int32_t *tok = tok_;
    for (int n = 0; n < N; n++)
        for (int i = 0; i < D; i++) de[(size_t)tok[n] * D + i] += scale * dx[(size_t)n * D + i];
    return MN_OK;
}

static int r_xent(const Backend *be, void *logits_, void *losses_, const void *targets_, int N, int V, float cap,
                  float grad_scale, const void *grad_scale_at) {
    double *logits = logits_, *losses = losses_;
    double gs = grad_scale_at ? *(const double *)grad_scale_at : grad_scale;
    const int32_t *targets = targets_;
    for (int n = 0; n < N; n++) {
        double *z = logits + (size_t)n * V;
        int tgt = targets[n];
        if (tgt < 0) {
            losses[n] = 0;
            if (grad_scale != 0) memset(z, 0, sizeof(double) * V);
            continue;
        }
        double mx = -INFINITY;
        for (int i = 0; i < V; i++) {
            if (cap > 0) z[i] = cap * tanh(z[i] / cap);
            mx = fmax(mx, z[i]);
        }
        double sum = 0;
        for (int i = 0; i < V; i++) sum += exp(z[i] - mx);
        double lse = mx + log(sum);
        losses[n] = lse - z[tgt];
        if (grad_scale != 0)
            for (int i = 0; i < V; i++) {
                double d = exp(z[i] - lse) - (i == tgt);
                double dcap = cap > 0 ? 1 - (z[i] / cap) * (z[i] / cap) : 1;
                z[i] = gs * d * dcap;
            }
    }
    return MN_OK;
}

// log sigmoid(a) without overflow.
static double log_sigmoid(double a) { return a >= 0 ? -log1p(exp(-a)) : a - log1p(exp(a)); }

static int r_gates_fwd(const Backend *be, void *g_, void *beta_, const void *a_, const void *b_, size_t n,
                            float hmax) {
    double *g = g_, *beta = beta_;
    const double *a = a_, *b = b_;
    for (size_t i = 0; i < n; i++) {
        beta[i] = sigmoid(b[i]);
        g[i] = log_sigmoid(a[i]);
        if (hmax > 0) g[i] = fmin(g[i], log1p(-beta[i] / hmax));
    }
    return MN_OK;
}

static int r_gates_bwd(const Backend *be, void *da_, void *db_, const void *dg_, const void *dbeta_,
                            const void *a_, const void *b_, size_t n, float hmax) {
    double *da = da_, *db = db_;
    const double *dg = dg_, *dbeta = dbeta_, *a = a_, *b = b_;
    for (size_t i = 0; i < n; i++) {
        double beta = sigmoid(b[i]), dbt = dbeta[i];
        int bounded = hmax > 0 && log1p(-beta / hmax) < log_sigmoid(a[i]);
        da[i] = bounded ? 0 : dg[i] * sigmoid(-a[i]);
        if (bounded) dbt += dg[i] * (-1 / hmax) / (1 - beta / hmax);
        db[i] = dbt * beta * (1 - beta);
    }
    return MN_OK;
}

static int r_scale_f32(const Backend *be, void *x_, size_t n, float s) {
    double *x = x_;
    for (size_t i = 0; i < n; i++) x[i] *= s;
    return MN_OK;
}

static double softplus(double p) { return p > 30 ? p : log1p(exp(p)); }

static int r_softplus_fwd(const Backend *be, void *y_, const void *p_, size_t n, float lo) {
    double *y = y_;
    const double *p = p_;
    for (size_t i = 0; i < n; i++) y[i] = softplus(p[i]) + lo;
    return MN_OK;
}

static int r_softplus_bwd(const Backend *be, void *dp_, const void *dy_, const void *p_, size_t n) {
    double *dp = dp_;
    const double *dy = dy_, *p = p_;
    for (size_t i = 0; i < n; i++) dp[i] += dy[i] * sigmoid(p[i]);
    return MN_OK;
}

static int r_gdn_gate_fwd(const Backend *be, void *g_, const void *a_, const void *A_log_, const void *dt_bias_, int N,
                          int H) {
    double *g = g_;
    const double *a = a_, *A_log = A_log_, *dt = dt_bias_;
    for (size_t n = 0; n < (size_t)N; n++)
        for (int h = 0; h < H; h++) g[n * H + h] = -exp(A_log[h]) * softplus(a[n * H + h] + dt[h]);
    return MN_OK;
}

// Longhorn's implicit step: eps = beta / (1 + beta kappa), kappa = |k|^2 over the head's Dk keys.
static double sq_norm(const double *x, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += x[i] * x[i];
    return s;
}

static int r_longhorn_eps_fwd(const Backend *be, void *eps_, const void *beta_, const void *k_, int N, int H, int Dk) {
    double *eps = eps_;
    const double *beta = beta_, *k = k_;
    for (size_t i = 0; i < (size_t)N * H; i++) eps[i] = beta[i] / (1 + beta[i] * sq_norm(k + i * Dk, Dk));
    return MN_OK;
}

// d eps / d beta = 1 / (1 + beta kappa)^2;  d eps / d kappa = -eps^2;  d kappa / dk = 2 k
static int r_longhorn_eps_bwd(const Backend *be, void *dbeta_, void *dk_, const void *deps_, const void *beta_,
                              const void *k_, int N, int H, int Dk) {
    double *dbeta = dbeta_, *dk = dk_;
    const double *deps = deps_, *beta = beta_, *k = k_;
    for (size_t i = 0; i < (size_t)N * H; i++) {
        double den = 1 + beta[i] * sq_norm(k + i * Dk, Dk), e = beta[i] / den, d = deps[i];
        for (int j = 0; j < Dk; j++) dk[i * Dk + j] -= 2 * d * e * e * k[i * Dk + j];
        dbeta[i] = d / (den * den);
    }
    return MN_OK;
}

static int r_gdn_gate_bwd(const Backend *be, void *da_, void *dA_log_, void *ddt_bias_, const void *dg_, const void *a_,
                          const void *A_log_, const void *dt_bias_, int N, int H) {
    double *da = da_, *dA = dA_log_, *ddt = ddt_bias_;
    const double *dg = dg_, *a = a_, *A_log = A_log_, *dt = dt_bias_;
    for (int h = 0; h < H; h++) {
        double sa = 0, sd = 0, e = exp(A_log[h]);
        for (size_t n = 0; n < (size_t)N; n++) {
            double z = a[n * H + h] + dt[h], d = dg[n * H + h];
            da[n * H + h] = -d * e * sigmoid(z);
            sa += d * -e * softplus(z);
            sd += da[n * H + h];
        }
        dA[h] += sa;
        ddt[h] += sd;
    }
    return MN_OK;
}

// The MnMesa* structs carry this backend's double buffers behind float pointers.
#define D64(p) ((const double *)(const void *)(p))
#define W64(p) ((double *)(void *)(p))

static int r_mesa_fwd(const Backend *be, const MnSeqDims *d, const MnSolver *s, const MnMesaFwd *io) {
    MesaFwd64 f = {D64(io->q), D64(io->k), D64(io->v), D64(io->g), D64(io->beta), D64(io->lambda), D64(io->h0),
                   D64(io->g0), D64(io->x0), W64(io->o), W64(io->x), W64(io->hT), W64(io->gT), io->steps,
                   io->lambda_seqs};
    return ref_mesa_forward(d, NULL, &f);
}

static int r_mesa_bwd(const Backend *be, const MnSeqDims *d, const MnSolver *s, const MnMesaBwd *io) {
    MesaBwd64 b = {D64(io->q),    D64(io->k),    D64(io->v),    D64(io->g),     D64(io->beta),  D64(io->lambda),
                   D64(io->h0),   D64(io->g0),   D64(io->x),    D64(io->o),     D64(io->dout),  D64(io->dhT),
                   D64(io->dgT),  W64(io->dq),   W64(io->dk),   W64(io->dv),    W64(io->dg),    W64(io->dbeta),
                   W64(io->dlambda), W64(io->dh0), W64(io->dg0), io->lambda_seqs};
    if (io->steps) memset(io->steps, 0, sizeof(int) * (size_t)d->B * d->T * d->H);
    return ref_mesa_backward(d, NULL, &b);
}

static int r_lin_fwd(const Backend *be, const MnSeqDims *d, const MnLinOpts *o, const MnLinFwd *io) {
    LinFwd64 f = {D64(io->q), D64(io->k), D64(io->v), D64(io->g), D64(io->beta), D64(io->s0), W64(io->o), W64(io->sT)};
    return ref_lin_forward(d, o, &f);
}

static int r_lin_bwd(const Backend *be, const MnSeqDims *d, const MnLinOpts *o, const MnLinBwd *io) {
    LinBwd64 b = {D64(io->q),  D64(io->k),  D64(io->v),  D64(io->g),  D64(io->beta),  D64(io->s0),  D64(io->dout),
                  D64(io->dsT), W64(io->dq), W64(io->dk), W64(io->dv), W64(io->dg), W64(io->dbeta), W64(io->ds0)};
    return ref_lin_backward(d, o, &b);
}

static int r_adamw(const Backend *be, const AdamwOpts *o, const AdamwIo *io) {
    double *stats = io->stats, norm = sqrt(stats[0]);
    stats[1] = !isfinite(norm);
    if (stats[1]) return MN_OK;
    double gs = o->clip > 0 && norm > o->clip ? (float)(o->clip / norm) : 1.0f;  // float, as the fast backends'
    const double *sched = io->sched, *g = io->g;
    double *p = io->p, *m = io->m, *v = io->v;
    double lr = sched[0], b1 = o->beta1, b2 = o->beta2, c1 = 1 - pow(b1, sched[1]), c2 = 1 - pow(b2, sched[1]);
    for (size_t i = 0; i < io->n; i++) {
        double gi = gs * g[i], wd = adamw_decays(io->decay, i) ? o->wd : 0;
        m[i] = b1 * m[i] + (1 - b1) * gi;
        v[i] = b2 * v[i] + (1 - b2) * gi * gi;
        p[i] -= lr * (m[i] / c1 / (sqrt(v[i] / c2) + o->eps) + wd * p[i]);
    }
    return MN_OK;
}

static int r_sum_f32(const Backend *be, void *sum, const void *x_, size_t n) {
    const double *x = x_;
    double s = 0;
    for (size_t i = 0; i < n; i++) s += x[i];
    *(double *)sum += s;
    return MN_OK;
}

// Exact GELU: x Phi(x), Phi the standard normal CDF; gelu'(x) = Phi(x) + x phi(x).
static int r_gelu_fwd(const Backend *be, void *y_, const void *x_, size_t n) {
    double *y = y_;
    const double *x = x_;
    for (size_t i = 0; i < n; i++) y[i] = 0.5 * x[i] * (1 + erf(x[i] / sqrt(2.0)));
    return MN_OK;
}

static int r_gelu_bwd(const Backend *be, void *dx_, const void *dy_, const void *x_, size_t n) {
    double *dx = dx_;
    const double *dy = dy_, *x = x_;
    for (size_t i = 0; i < n; i++) {
        double cdf = 0.5 * (1 + erf(x[i] / sqrt(2.0))), pdf = exp(-0.5 * x[i] * x[i]) / sqrt(2 * M_PI);
        dx[i] = dy[i] * (cdf + x[i] * pdf);
    }
    return MN_OK;
}

// h = gelu(g) u; dg = dh u gelu'(g), du = dh gelu(g).
static int r_geglu_fwd(const Backend *be, void *h_, const void *g_, const void *u_, size_t n) {
    double *h = h_;
    const double *g = g_, *u = u_;
    for (size_t i = 0; i < n; i++) h[i] = 0.5 * g[i] * (1 + erf(g[i] / sqrt(2.0))) * u[i];
    return MN_OK;
}

static int r_geglu_bwd(const Backend *be, void *dg_, void *du_, const void *dh_, const void *g_, const void *u_,
                       size_t n) {
    double *dg = dg_, *du = du_;
    const double *dh = dh_, *g = g_, *u = u_;
    for (size_t i = 0; i < n; i++) {
        double cdf = 0.5 * (1 + erf(g[i] / sqrt(2.0))), pdf = exp(-0.5 * g[i] * g[i]) / sqrt(2 * M_PI);
        dg[i] = dh[i] * u[i] * (cdf + g[i] * pdf);
        du[i] = dh[i] * g[i] * cdf;
    }
    return MN_OK;
}

// GELU's tanh approximation: gelu_tanh(x) = x (1 + tanh(z)) / 2, z = k (x + c x^3), k = sqrt(2 / pi),
// c = 0.044715; gelu_tanh'(x) = (1 + t) / 2 + x (1 - t^2) k (1 + 3 c x^2) / 2, t = tanh(z).
static double gelu_tanh(double x) { return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }
static double gelu_tanh_grad(double x) {
    double k = sqrt(2 / M_PI), t = tanh(k * (x + 0.044715 * x * x * x));
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
}

static int r_gelu_tanh_fwd(const Backend *be, void *y_, const void *x_, size_t n) {
    double *y = y_;
    const double *x = x_;
    for (size_t i = 0; i < n; i++) y[i] = gelu_tanh(x[i]);
    return MN_OK;
}

static int r_gelu_tanh_bwd(const Backend *be, void *dx_, const void *dy_, const void *x_, size_t n) {
    double *dx = dx_;
    const double *dy = dy_, *x = x_;
    for (size_t i = 0; i < n; i++) dx[i] = dy[i] * gelu_tanh_grad(x[i]);
    return MN_OK;
}

static int r_geglu_tanh_fwd(const Backend *be, void *h_, const void *g_, const void *u_, size_t n) {
    double *h = h_;
    const double *g = g_, *u = u_;
    for (size_t i = 0; i < n; i++) h[i] = gelu_tanh(g[i]) * u[i];
    return MN_OK;
}

static int r_geglu_tanh_bwd(const Backend *be, void *dg_, void *du_, const void *dh_, const void *g_, const void *u_,
                            size_t n) {
    double *dg = dg_, *du = du_;
    const double *dh = dh_, *g = g_, *u = u_;
    for (size_t i = 0; i < n; i++) {
        dg[i] = dh[i] * u[i] * gelu_tanh_grad(g[i]);
        du[i] = dh[i] * gelu_tanh(g[i]);
    }
    return MN_OK;
}

static int r_pool_last_fwd(const Backend *be, void *z_, const void *x_, int B, int T, int D) {
    double *z = z_;
    const double *x = x_;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int i = 0; i < D; i++)
                z[((size_t)b * T + t) * D + i] = x[((size_t)b * T + T - 1) * D + i] + mn_posemb(t, i, D);
    return MN_OK;
}

static int r_pool_last_bwd(const Backend *be, void *dx_, const void *dz_, int B, int T, int D) {
    double *dx = dx_;
    const double *dz = dz_;
    memset(dx, 0, sizeof(double) * (size_t)B * T * D);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int i = 0; i < D; i++) dx[((size_t)b * T + T - 1) * D + i] += dz[((size_t)b * T + t) * D + i];
    return MN_OK;
}

static int r_sumsq(const Backend *be, void *out, const void *x_, size_t n) {
    const double *x = x_;
    double s = 0;
    for (size_t i = 0; i < n; i++) s += x[i] * x[i];
    *(double *)out = s;
    return MN_OK;
}

// The sequence-mixer families, all of them (every shape).
static const MesaOps ref_mesa = {.fwd = r_mesa_fwd, .bwd = r_mesa_bwd, .softplus_fwd = r_softplus_fwd,
                                 .softplus_bwd = r_softplus_bwd};
static const LinOps ref_lin = {.fwd = r_lin_fwd, .bwd = r_lin_bwd, .gdn_gate_fwd = r_gdn_gate_fwd,
                               .gdn_gate_bwd = r_gdn_gate_bwd,
                               .longhorn_eps_fwd = r_longhorn_eps_fwd, .longhorn_eps_bwd = r_longhorn_eps_bwd};
static const AttnOps ref_attn = {.fwd = ref_attn_fwd, .bwd = ref_attn_bwd, .decode = ref_attn_decode, .rope = ref_rope};

static const Backend ref_backend = {
    .name = "ref",
    .elem_size = r_elem_size, .alloc = r_alloc, .free = r_free, .zero = r_zero, .copy = r_copy, .copy_rows = r_copy_rows,
    .upload = r_upload, .download = r_download, .upload_f32 = r_upload_f32, .download_f32 = r_download_f32,
    .upload_i32 = host_upload_i32, .download_i32 = host_download_i32, .tally_i32 = host_tally_i32,
    .sync = r_sync, .mem_available = host_mem_available_op,
    .linear_fwd = r_linear_fwd, .linear_bwd = r_linear_bwd,
    .rmsnorm_fwd = r_rmsnorm_fwd, .rmsnorm_bwd = r_rmsnorm_bwd,
    .layernorm_fwd = r_layernorm_fwd, .layernorm_bwd = r_layernorm_bwd,
    .l2norm_fwd = r_l2norm_fwd, .l2norm_bwd = r_l2norm_bwd,
    .silu_fwd = r_silu_fwd, .silu_bwd = r_silu_bwd, .swiglu_fwd = r_swiglu_fwd, .swiglu_bwd = r_swiglu_bwd,
    .sigmoid_gate_fwd = r_sigmoid_gate_fwd, .sigmoid_gate_bwd = r_sigmoid_gate_bwd,
    .softcap = r_softcap, .gelu_fwd = r_gelu_fwd, .gelu_bwd = r_gelu_bwd,
    .geglu_fwd = r_geglu_fwd, .geglu_bwd = r_geglu_bwd,
    .gelu_tanh_fwd = r_gelu_tanh_fwd, .gelu_tanh_bwd = r_gelu_tanh_bwd,
    .geglu_tanh_fwd = r_geglu_tanh_fwd, .geglu_tanh_bwd = r_geglu_tanh_bwd,
    .bias_fwd = r_bias_fwd, .bias_bwd = r_bias_bwd,
    .pool_last_fwd = r_pool_last_fwd, .pool_last_bwd = r_pool_last_bwd,
    .headwise_fwd = r_headwise_fwd, .headwise_bwd = r_headwise_bwd,
    .scale_add_fwd = r_scale_add_fwd, .scale_add_bwd = r_scale_add_bwd,
    .add = r_add, .conv_fwd = r_conv_fwd, .conv_bwd = r_conv_bwd,
    .embed_fwd = r_embed_fwd, .embed_bwd = r_embed_bwd, .xent = r_xent,
    .gates_fwd = r_gates_fwd, .gates_bwd = r_gates_bwd, .scale_f32 = r_scale_f32,
    .mesa = &ref_mesa, .lin = &ref_lin, .attn = &ref_attn, .mlstm = &ref_mlstm,
    .slstm = &ref_slstm, .scan = &ref_scan,
    .sum_f32 = r_sum_f32, .sumsq = r_sumsq, .adamw = r_adamw,
};

const Backend *backend_ref(void) { return &ref_backend; }
