/*
 * The float32 CPU backend: matrix products through BLAS, everything else as
 * loops that the compiler vectorises, spread over OpenMP threads when there is
 * enough work. Buffers are float arrays (int32 for MEM_I32).
 */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "attn_cpu.h"
#include "blas.h"
#include "core/backend.h"
#include "core/common.h"
#include "mlstm_cpu.h"
#include "scan_cpu.h"
#include "slstm_cpu.h"
#include "vec.h"
#include "vmath.h"

// Parallelise a loop only when it has this many elements of work: below that,
// waking the threads costs more than it saves.
#define PAR_MIN 32768
// Flat elementwise loops run in fixed chunks of PAR_CHUNK elements (a multiple of every vector
// width). Which elements the vector body computes and which the scalar remainder then depends on
// n alone, not on how many threads share the loop: libmvec's vector expf and the scalar one differ
// in the last bit for about half of all inputs, so a split at n / threads would change the results
// with the thread count.
#define PAR_CHUNK 4096

static size_t elem(MemKind k) { return k == MEM_I32 ? sizeof(int32_t) : k == MEM_F64 ? sizeof(double) : sizeof(float); }

static size_t c_elem_size(const Backend *be, MemKind k) { return elem(k); }
static void *c_alloc(const Backend *be, size_t n, MemKind k) { return mn_calloc(n ? n : 1, elem(k)); }
static void c_free(const Backend *be, void *p) { mn_free(p); }
static void c_zero(const Backend *be, void *p, size_t n, MemKind k) { memset(p, 0, n * elem(k)); }
static void c_copy(const Backend *be, void *dst, const void *src, size_t n, MemKind k) { memmove(dst, src, n * elem(k)); }
static void c_copy_rows(const Backend *be, void *dst, size_t ds, const void *src, size_t ss, size_t rows, size_t n,
                        MemKind k) {
    size_t e = elem(k);
    for (size_t r = 0; r < rows; r++) memmove((char *)dst + r * ds * e, (const char *)src + r * ss * e, n * e);
}

static int c_upload(const Backend *be, void *dst, const double *src, size_t n, MemKind k) {
    if (k == MEM_F64) {
        memcpy(dst, src, n * sizeof(double));
        return MN_OK;
    }
    float *d = dst;
    for (size_t i = 0; i < n; i++) d[i] = (float)src[i];
    return MN_OK;
}
static int c_download(const Backend *be, double *dst, const void *src, size_t n, MemKind k) {
    if (k == MEM_F64) {
        memcpy(dst, src, n * sizeof(double));
        return MN_OK;
    }
    const float *s = src;
    for (size_t i = 0; i < n; i++) dst[i] = s[i];
    return MN_OK;
}
static int c_upload_f32(const Backend *be, void *dst, const float *src, size_t n, MemKind k) {
    if (k == MEM_F64) {
        for (size_t i = 0; i < n; i++) ((double *)dst)[i] = src[i];
        return MN_OK;
    }
    memcpy(dst, src, n * sizeof(float));
    return MN_OK;
}
static int c_download_f32(const Backend *be, float *dst, const void *src, size_t n, MemKind k) {
    if (k == MEM_F64) {
        for (size_t i = 0; i < n; i++) dst[i] = (float)((const double *)src)[i];
        return MN_OK;
    }
    memcpy(dst, src, n * sizeof(float));
    return MN_OK;
}
static int c_sync(const Backend *be) { return MN_OK; }

static int c_linear_fwd(const Backend *be, void *y_, const void *x_, const void *w_, const void *b_, int N, int nin, int nout) {
    float *y = y_;
    const float *b = b_;
    gemm(0, 1, N, nout, nin, 1, x_, nin, w_, nin, 0, y, nout);
    if (b)
#pragma omp parallel for if ((size_t)N * nout > PAR_MIN)
        for (int n = 0; n < N; n++)
            for (int o = 0; o < nout; o++) y[(size_t)n * nout + o] += b[o];
    return MN_OK;
}

static int c_linear_bwd(const Backend *be, void *dx, void *dw, void *db_, const void *dy_, const void *x,
                        const void *w, int N, int nin, int nout, int accum) {
    const float *dy = dy_;
    float *db = db_;
    if (dx) gemm(0, 0, N, nin, nout, 1, dy, nout, w, nin, accum ? 1 : 0, dx, nin);
    if (dw) gemm(1, 0, nout, nin, N, 1, dy, nout, x, nin, 1, dw, nin);
    if (db)
        for (int n = 0; n < N; n++)
            for (int o = 0; o < nout; o++) db[o] += dy[(size_t)n * nout + o];
    return MN_OK;
}

// R products of one shape (Backend.linear_runs_*): a product a run, in order (OpenBLAS 0.3.21 has no
// batched sgemm), so each run's numbers are those of linear_fwd / linear_bwd alone.
static int c_linear_runs_fwd(const Backend *be, void *y, const void *x, const void *w, const void *b, int R, int n,
                             int nin, int nout, size_t ws) {
    for (int r = 0; r < R; r++)
        MN_TRY(c_linear_fwd(be, (float *)y + (size_t)r * n * nout, (const float *)x + (size_t)r * n * nin,
                            (const float *)w + r * ws, b ? (const float *)b + r * ws : NULL, n, nin, nout));
    return MN_OK;
}

static int c_linear_runs_bwd(const Backend *be, void *dx, void *dw, void *db, const void *dy, const void *x,
                             const void *w, int R, int n, int nin, int nout, size_t ws, int accum) {
    for (int r = 0; r < R; r++)
        MN_TRY(c_linear_bwd(be, dx ? (float *)dx + (size_t)r * n * nin : NULL, dw ? (float *)dw + r * ws : NULL,
                            db ? (float *)db + r * ws : NULL, (const float *)dy + (size_t)r * n * nout,
                            (const float *)x + (size_t)r * n * nin, (const float *)w + r * ws, n, nin, nout, accum));
    return MN_OK;
}

static int c_rmsnorm_fwd(const Backend *be, void *y_, void *rstd_, const void *x_, const void *w_, int N, int D,
                         int group, int wlen, float eps) {
    float *y = y_, *rstd = rstd_;
    const float *x = x_, *w = w_;
    long rows = (long)N * (D / group);
#pragma omp parallel for if ((size_t)N * D > PAR_MIN)
    for (long r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * group, *wr = w + (wlen == group ? 0 : (size_t)(r % (D / group)) * group);
        float rs = 1.0f / sqrtf(vdot(xr, xr, group) / group + eps);
        rstd[r] = rs;
        for (int i = 0; i < group; i++) y[(size_t)r * group + i] = xr[i] * rs * wr[i];
    }
    return MN_OK;
}

static int c_rmsnorm_bwd(const Backend *be, void *dx_, void *dw_, const void *dy_, const void *x_, const void *w_,
                         const void *rstd_, int N, int D, int group, int wlen, int accum) {
    float *dx = dx_, *dw = dw_;
    const float *dy = dy_, *x = x_, *w = w_, *rstd = rstd_;
    long rows = (long)N * (D / group);
#pragma omp parallel for if ((size_t)N * D > PAR_MIN)
    for (long r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * group, *dyr = dy + (size_t)r * group;
        const float *wr = w + (wlen == group ? 0 : (size_t)(r % (D / group)) * group);
        float rs = rstd[r], dot = 0;
        for (int i = 0; i < group; i++) dot += dyr[i] * wr[i] * xr[i];
        float c = rs * rs * dot / group;
        float *dxr = dx + (size_t)r * group;
        for (int i = 0; i < group; i++) dxr[i] = (accum ? dxr[i] : 0) + rs * (dyr[i] * wr[i] - xr[i] * c);
    }
    // dw sums over all tokens: partial sums over fixed blocks of tokens, added
    // in order, so the result does not depend on the number of threads.
    if (dw) {
        enum { BLOCK = 256 };
        int nblocks = (N + BLOCK - 1) / BLOCK;
        double *part = mn_calloc((size_t)nblocks * wlen, sizeof(double));
        if (!part) return MN_ERR_NOMEM;
#pragma omp parallel for if ((size_t)N * D > PAR_MIN)
        for (int blk = 0; blk < nblocks; blk++) {
            double *pb = part + (size_t)blk * wlen;
            for (int n = blk * BLOCK; n < mn_min(N, (blk + 1) * BLOCK); n++)
                for (int c = 0; c < D; c++) {
                    size_t i = (size_t)n * D + c;
                    pb[wlen == D ? c : c % group] += (double)dy[i] * x[i] * rstd[i / group];
                }
        }
        for (int blk = 0; blk < nblocks; blk++)
            for (int i = 0; i < wlen; i++) dw[i] += (float)part[(size_t)blk * wlen + i];
        mn_free(part);
    }
    return MN_OK;
}

// The sum of a row with 16 partial sums (vdot's reason: they vectorise where one running sum
// cannot), a fixed order for a given n.
static inline float vsum(const float *restrict a, int n) {
    float acc[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) acc[j] += a[i + j];
    float s = 0;
    for (; i < n; i++) s += a[i];
    for (int j = 0; j < 8; j++) acc[j] += acc[j + 8];
    for (int j = 0; j < 4; j++) acc[j] += acc[j + 4];
    return s + (acc[0] + acc[2]) + (acc[1] + acc[3]);
}

// LayerNorm without bias: the row centred into y, its variance from the centred values (two
// passes: no cancellation where the mean is large beside the spread), then scaled in place.
static int c_layernorm_fwd(const Backend *be, void *y_, void *mean_, void *rstd_, const void *x_, const void *w_, int N,
                           int D, int group, int wlen, float eps) {
    float *y = y_, *mean = mean_, *rstd = rstd_;
    const float *x = x_, *w = w_;
    long rows = (long)N * (D / group);
#pragma omp parallel for if ((size_t)N * D > PAR_MIN)
    for (long r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * group, *wr = w + (wlen == group ? 0 : (size_t)(r % (D / group)) * group);
        float *yr = y + (size_t)r * group, mu = vsum(xr, group) / group;
        for (int i = 0; i < group; i++) yr[i] = xr[i] - mu;
        float rs = 1.0f / sqrtf(vdot(yr, yr, group) / group + eps);
        mean[r] = mu;
        rstd[r] = rs;
        for (int i = 0; i < group; i++) yr[i] *= rs * wr[i];
    }
    return MN_OK;
}

// With xh = (x - mean) rstd and g = dy w: dx = rstd (g - mean(g) - xh mean(g xh));  dw += sum dy xh.
static int c_layernorm_bwd(const Backend *be, void *dx_, void *dw_, const void *dy_, const void *x_, const void *w_,
                           const void *mean_, const void *rstd_, int N, int D, int group, int wlen, int accum) {
    float *dx = dx_, *dw = dw_;
    const float *dy = dy_, *x = x_, *w = w_, *mean = mean_, *rstd = rstd_;
    long rows = (long)N * (D / group);
#pragma omp parallel for if ((size_t)N * D > PAR_MIN)
    for (long r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * group, *dyr = dy + (size_t)r * group;
        const float *wr = w + (wlen == group ? 0 : (size_t)(r % (D / group)) * group);
        float mu = mean[r], rs = rstd[r], sg[16] = {0}, sgx[16] = {0};  // partial sums (vdot's reason)
        int i = 0;
        for (; i + 16 <= group; i += 16)
            for (int j = 0; j < 16; j++) {
                float g = dyr[i + j] * wr[i + j];
                sg[j] += g;
                sgx[j] += g * (xr[i + j] - mu);
            }
        for (; i < group; i++) {
            float g = dyr[i] * wr[i];
            sg[0] += g;
            sgx[0] += g * (xr[i] - mu);
        }
        float a = 0, b = 0;
        for (int j = 0; j < 16; j++) a += sg[j], b += sgx[j];
        float c1 = a / group, c2 = b * rs * rs / group;  // mean(g), mean(g xh) / rstd
        float *dxr = dx + (size_t)r * group;
        for (i = 0; i < group; i++) dxr[i] = (accum ? dxr[i] : 0) + rs * (dyr[i] * wr[i] - c1 - (xr[i] - mu) * c2);
    }
    // dw: partial sums over fixed blocks of tokens, added in order (as rmsnorm's)
    if (dw) {
        enum { BLOCK = 256 };
        int nblocks = (N + BLOCK - 1) / BLOCK;
        double *part = mn_calloc((size_t)nblocks * wlen, sizeof(double));
        if (!part) return MN_ERR_NOMEM;
#pragma omp parallel for if ((size_t)N * D > PAR_MIN)
        for (int blk = 0; blk < nblocks; blk++) {
            double *pb = part + (size_t)blk * wlen;
            for (int n = blk * BLOCK; n < mn_min(N, (blk + 1) * BLOCK); n++)
                for (int c = 0; c < D; c++) {
                    size_t i = (size_t)n * D + c, r = i / group;
                    pb[wlen == D ? c : c % group] += (double)dy[i] * ((x[i] - mean[r]) * rstd[r]);
                }
        }
        for (int blk = 0; blk < nblocks; blk++)
            for (int i = 0; i < wlen; i++) dw[i] += (float)part[(size_t)blk * wlen + i];
        mn_free(part);
    }
    return MN_OK;
}

static int c_l2norm_fwd(const Backend *be, void *y_, void *inv_, const void *x_, int N, int D, int group, float eps) {
    float *y = y_, *inv = inv_;
    const float *x = x_;
    long rows = (long)N * (D / group);
#pragma omp parallel for if ((size_t)N * D > PAR_MIN)
    for (long r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * group;
        float iv = 1.0f / sqrtf(vdot(xr, xr, group) + eps);
        inv[r] = iv;
        for (int i = 0; i < group; i++) y[(size_t)r * group + i] = xr[i] * iv;
    }
    return MN_OK;
}

static int c_l2norm_bwd(const Backend *be, void *dx_, const void *dy_, const void *y_, const void *inv_, int N, int D,
                        int group) {
    float *dx = dx_;
    const float *dy = dy_, *y = y_, *inv = inv_;
    long rows = (long)N * (D / group);
#pragma omp parallel for if ((size_t)N * D > PAR_MIN)
    for (long r = 0; r < rows; r++) {
        const float *dyr = dy + (size_t)r * group, *yr = y + (size_t)r * group;
        float dot = vdot(dyr, yr, group);
        for (int i = 0; i < group; i++) dx[(size_t)r * group + i] = inv[r] * (dyr[i] - yr[i] * dot);
    }
    return MN_OK;
}

static inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float silu_grad(float x) {
    float s = sigmoidf(x);
    return s * (1 + x * (1 - s));
}

static int c_softcap(const Backend *be, void *x_, size_t n, float cap) {
    float *x = x_;
#pragma omp parallel for schedule(static, PAR_CHUNK) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) x[i] = cap * tanhf(x[i] / cap);
    return MN_OK;
}

static int c_silu_fwd(const Backend *be, void *y_, const void *x_, size_t n) {
    float *y = y_;
    const float *x = x_;
#pragma omp parallel for schedule(static, PAR_CHUNK) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) y[i] = x[i] * sigmoidf(x[i]);
    return MN_OK;
}

static int c_silu_bwd(const Backend *be, void *dx_, const void *dy_, const void *x_, size_t n) {
    float *dx = dx_;
    const float *dy = dy_, *x = x_;
#pragma omp parallel for schedule(static, PAR_CHUNK) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) dx[i] = dy[i] * silu_grad(x[i]);
    return MN_OK;
}

// Exact GELU in float (erff), as torch's nn.GELU(); gelu'(x) = Phi(x) + x phi(x).
static int c_gelu_fwd(const Backend *be, void *y_, const void *x_, size_t n) {
    float *y = y_;
    const float *x = x_;
#pragma omp parallel for schedule(static, PAR_CHUNK) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) y[i] = 0.5f * x[i] * (1 + erff(x[i] * 0.70710678118654752f));
    return MN_OK;
}

static int c_gelu_bwd(const Backend *be, void *dx_, const void *dy_, const void *x_, size_t n) {
    float *dx = dx_;
    const float *dy = dy_, *x = x_;
#pragma omp parallel for schedule(static, PAR_CHUNK) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        float v = x[i], cdf = 0.5f * (1 + erff(v * 0.70710678118654752f));
        float pdf = expf(-0.5f * v * v) * 0.39894228040143268f;
        dx[i] = dy[i] * (cdf + v * pdf);
    }
    return MN_OK;
}

// h = gelu(g) u (exact GELU, as gelu_fwd); dg = dh u gelu'(g), du = dh gelu(g).
static int c_geglu_fwd(const Backend *be, void *h_, const void *g_, const void *u_, size_t n) {
    float *h = h_;
    const float *g = g_, *u = u_;
#pragma omp parallel for schedule(static, PAR_CHUNK) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) h[i] = 0.5f * g[i] * (1 + erff(g[i] * 0.70710678118654752f)) * u[i];
    return MN_OK;
}

static int c_geglu_bwd(const Backend *be, void *dg_, void *du_, const void *dh_, const void *g_, const void *u_,
                       size_t n) {
    float *dg = dg_, *du = du_;
    const float *dh = dh_, *g = g_, *u = u_;
#pragma omp parallel for schedule(static, PAR_CHUNK) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        float v = g[i], cdf = 0.5f * (1 + erff(v * 0.70710678118654752f));
        float pdf = expf(-0.5f * v * v) * 0.39894228040143268f;
        dg[i] = dh[i] * u[i] * (cdf + v * pdf);
        du[i] = dh[i] * v * cdf;
    }
    return MN_OK;
}

// GELU's tanh approximation in float, as torch's gelu(approximate='tanh') (ref_backend.c has the formulas).
#define GELU_K 0.79788456080286536f  // sqrt(2 / pi)
static inline float gelu_tanhf(float x) { return 0.5f * x * (1 + tanhf(GELU_K * (x + 0.044715f * x * x * x))); }
static inline float gelu_tanh_gradf(float x) {
    float t = tanhf(GELU_K * (x + 0.044715f * x * x * x));
    return 0.5f * (1 + t) + 0.5f * x * (1 - t * t) * GELU_K * (1 + 3 * 0.044715f * x * x);
}

static int c_gelu_tanh_fwd(const Backend *be, void *y_, const void *x_, size_t n) {
    float *y = y_;
    const float *x = x_;
#pragma omp parallel for schedule(static, PAR_CHUNK) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) y[i] = gelu_tanhf(x[i]);
    return MN_OK;
}

static int c_gelu_tanh_bwd(const Backend *be, void *dx_, const void *dy_, const void *x_, size_t n) {
    float *dx = dx_;
    const float *dy = dy_, *x = x_;
#pragma omp parallel for schedule(static, PAR_CHUNK) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) dx[i] = dy[i] * gelu_tanh_gradf(x[i]);
    return MN_OK;
}

static int c_geglu_tanh_fwd(const Backend *be, void *h_, const void *g_, const void *u_, size_t n) {
    float *h = h_;
    const float *g = g_, *u = u_;
#pragma omp parallel for schedule(static, PAR_CHUNK) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) h[i] = gelu_tanhf(g[i]) * u[i];
    return MN_OK;
}

static int c_geglu_tanh_bwd(const Backend *be, void *dg_, void *du_, const void *dh_, const void *g_, const void *u_,
                            size_t n) {
    float *dg = dg_, *du = du_;
    const float *dh = dh_, *g = g_, *u = u_;
#pragma omp parallel for schedule(static, PAR_CHUNK) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        float v = g[i];
        dg[i] = dh[i] * u[i] * gelu_tanh_gradf(v);
        du[i] = dh[i] * gelu_tanhf(v);
    }
    return MN_OK;
}

static int c_pool_last_fwd(const Backend *be, void *z_, const void *x_, int B, int T, int D) {
    float *z = z_;
    const float *x = x_;
#pragma omp parallel for collapse(2) if ((size_t)B * T * D > PAR_MIN)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int i = 0; i < D; i++)
                z[((size_t)b * T + t) * D + i] = x[((size_t)b * T + T - 1) * D + i] + (float)mn_posemb(t, i, D);
    return MN_OK;
}

static int c_pool_last_bwd(const Backend *be, void *dx_, const void *dz_, int B, int T, int D) {
    float *dx = dx_;
    const float *dz = dz_;
#pragma omp parallel for if ((size_t)B * T * D > PAR_MIN)
    for (int b = 0; b < B; b++) {
        memset(dx + (size_t)b * T * D, 0, sizeof(float) * (size_t)(T - 1) * D);
        for (int i = 0; i < D; i++) {
            double s = 0;  // (a sum over up to T positions)
            for (int t = 0; t < T; t++) s += dz[((size_t)b * T + t) * D + i];
            dx[((size_t)b * T + T - 1) * D + i] = (float)s;
        }
    }
    return MN_OK;
}

static int c_swiglu_fwd(const Backend *be, void *h_, const void *g_, const void *u_, size_t n) {
    float *h = h_;
    const float *g = g_, *u = u_;
#pragma omp parallel for schedule(static, PAR_CHUNK) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) h[i] = g[i] * sigmoidf(g[i]) * u[i];
    return MN_OK;
}

static int c_swiglu_bwd(const Backend *be, void *dg_, void *du_, const void *dh_, const void *g_, const void *u_,
                        size_t n) {
    float *dg = dg_, *du = du_;
    const float *dh = dh_, *g = g_, *u = u_;
#pragma omp parallel for schedule(static, PAR_CHUNK) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        float s = sigmoidf(g[i]);
        dg[i] = dh[i] * u[i] * s * (1 + g[i] * (1 - s));
        du[i] = dh[i] * g[i] * s;
    }
    return MN_OK;
}

static int c_sigmoid_gate_fwd(const Backend *be, void *h_, const void *g_, const void *u_, size_t n) {
    float *h = h_;
    const float *g = g_, *u = u_;
#pragma omp parallel for schedule(static, PAR_CHUNK) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) h[i] = sigmoidf(g[i]) * u[i];
    return MN_OK;
}

static int c_sigmoid_gate_bwd(const Backend *be, void *dg_, void *du_, const void *dh_, const void *g_, const void *u_,
                              size_t n) {
    float *dg = dg_, *du = du_;
    const float *dh = dh_, *g = g_, *u = u_;
#pragma omp parallel for schedule(static, PAR_CHUNK) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        float s = sigmoidf(g[i]);
        dg[i] = dh[i] * u[i] * s * (1 - s);
        du[i] = dh[i] * s;
    }
    return MN_OK;
}

// The block-diagonal projection. Blocks of up to HW_SMALL weights (xLSTM's 4 x 4 q/k/v) as loops
// over the tokens, each output a fixed sequence of multiply-adds; larger ones (the sLSTM's gate
// projections) as one product a block, through gemm (blas.h: the same bits for any thread count).
#define HW_SMALL 256

// One token's row of nb blocks: y_b = W_b x_b. Inlined with constant sizes for 4 x 4 blocks, so
// that the inner loops unroll.
static inline __attribute__((always_inline)) void hw_row(float *restrict y, const float *restrict x,
                                                         const float *restrict w, int nb, const int bin,
                                                         const int bout) {
    for (int b = 0; b < nb; b++)
        for (int o = 0; o < bout; o++) {
            const float *wo = w + ((size_t)b * bout + o) * bin, *xb = x + (size_t)b * bin;
            float s = 0;
            for (int i = 0; i < bin; i++) s += wo[i] * xb[i];
            y[(size_t)b * bout + o] = s;
        }
}

// dx_b = W_b^T dy_b (= or +=) for one token's row.
static inline __attribute__((always_inline)) void hw_row_t(float *restrict dx, const float *restrict dy,
                                                           const float *restrict w, int nb, const int bin,
                                                           const int bout, int accum) {
    for (int b = 0; b < nb; b++)
        for (int i = 0; i < bin; i++) {
            const float *wb = w + (size_t)b * bout * bin + i, *dyb = dy + (size_t)b * bout;
            float s = 0;
            for (int o = 0; o < bout; o++) s += dyb[o] * wb[(size_t)o * bin];
            float *d = dx + (size_t)b * bin + i;
            *d = accum ? *d + s : s;
        }
}

static int c_headwise_fwd(const Backend *be, void *y_, const void *x_, const void *w_, int N, int nb, int bin,
                          int bout) {
    float *y = y_;
    const float *x = x_, *w = w_;
    if ((long)bin * bout > HW_SMALL) {
        for (int b = 0; b < nb; b++)  // y_b [N, bout] = x_b [N, bin] W_b^T
            gemm(0, 1, N, bout, bin, 1, x + (size_t)b * bin, nb * bin, w + (size_t)b * bout * bin, bin, 0,
                 y + (size_t)b * bout, nb * bout);
        return MN_OK;
    }
#pragma omp parallel for if ((size_t)N * nb * bin * bout > PAR_MIN)
    for (long n = 0; n < N; n++) {
        float *yr = y + (size_t)n * nb * bout;
        const float *xr = x + (size_t)n * nb * bin;
        if (bin == 4 && bout == 4) hw_row(yr, xr, w, nb, 4, 4);
        else hw_row(yr, xr, w, nb, bin, bout);
    }
    return MN_OK;
}

static int c_headwise_bwd(const Backend *be, void *dx_, void *dw_, const void *dy_, const void *x_, const void *w_,
                          int N, int nb, int bin, int bout, int accum) {
    float *dx = dx_, *dw = dw_;
    const float *dy = dy_, *x = x_, *w = w_;
    if ((long)bin * bout > HW_SMALL) {
        for (int b = 0; b < nb; b++) {
            const float *dyb = dy + (size_t)b * bout, *xb = x + (size_t)b * bin;
            if (dx)  // dx_b [N, bin] = dy_b [N, bout] W_b
                gemm(0, 0, N, bin, bout, 1, dyb, nb * bout, w + (size_t)b * bout * bin, bin, accum ? 1 : 0,
                     dx + (size_t)b * bin, nb * bin);
            if (dw)  // dW_b [bout, bin] += dy_b^T x_b
                gemm(1, 0, bout, bin, N, 1, dyb, nb * bout, xb, nb * bin, 1, dw + (size_t)b * bout * bin, bin);
        }
        return MN_OK;
    }
    if (dx)
#pragma omp parallel for if ((size_t)N * nb * bin * bout > PAR_MIN)
        for (long n = 0; n < N; n++) {
            float *dxr = dx + (size_t)n * nb * bin;
            const float *dyr = dy + (size_t)n * nb * bout;
            if (bin == 4 && bout == 4) hw_row_t(dxr, dyr, w, nb, 4, 4, accum);
            else hw_row_t(dxr, dyr, w, nb, bin, bout, accum);
        }
    // dw: the blocks in runs of up to 1024 weights, a run's sums over all tokens in order, in double
    // (N terms each), whatever thread takes the run.
    if (dw) {
        int wb = bin * bout, per = wb >= 1024 ? 1 : 1024 / wb, runs = (nb + per - 1) / per;
#pragma omp parallel for if ((size_t)N * nb * wb > PAR_MIN)
        for (int run = 0; run < runs; run++) {
            int b0 = run * per, b1 = mn_min(nb, b0 + per);
            double acc[1024];
            for (int j = 0; j < (b1 - b0) * wb; j++) acc[j] = 0;
            for (size_t n = 0; n < (size_t)N; n++)
                for (int b = b0; b < b1; b++) {
                    const float *dyb = dy + (n * nb + b) * bout, *xb = x + (n * nb + b) * bin;
                    double *ab = acc + (size_t)(b - b0) * wb;
                    for (int o = 0; o < bout; o++)
                        for (int i = 0; i < bin; i++) ab[o * bin + i] += (double)dyb[o] * xb[i];
                }
            for (int j = 0; j < (b1 - b0) * wb; j++) dw[(size_t)b0 * wb + j] += (float)acc[j];
        }
    }
    return MN_OK;
}

static int c_bias_fwd(const Backend *be, void *y_, const void *b_, int N, int C) {
    float *y = y_;
    const float *b = b_;
#pragma omp parallel for if ((size_t)N * C > PAR_MIN)
    for (long n = 0; n < N; n++)
        for (int c = 0; c < C; c++) y[(size_t)n * C + c] += b[c];
    return MN_OK;
}

// Partial sums over fixed blocks of tokens, added in order (as rmsnorm's dw): the same bits for
// any thread count.
static int c_bias_bwd(const Backend *be, void *db_, const void *dy_, int N, int C) {
    enum { BLOCK = 256 };
    float *db = db_;
    const float *dy = dy_;
    int nblocks = (N + BLOCK - 1) / BLOCK;
    double *part = mn_calloc((size_t)(nblocks ? nblocks : 1) * C, sizeof(double));
    if (!part) return MN_ERR_NOMEM;
#pragma omp parallel for if ((size_t)N * C > PAR_MIN)
    for (int blk = 0; blk < nblocks; blk++) {
        double *pb = part + (size_t)blk * C;
        for (int n = blk * BLOCK; n < mn_min(N, (blk + 1) * BLOCK); n++)
            for (int c = 0; c < C; c++) pb[c] += dy[(size_t)n * C + c];
    }
    for (int blk = 0; blk < nblocks; blk++)
        for (int c = 0; c < C; c++) db[c] += (float)part[(size_t)blk * C + c];
    mn_free(part);
    return MN_OK;
}

// The learnable skip y = a + s b (y may alias a: no restrict).
static int c_scale_add_fwd(const Backend *be, void *y_, const void *a_, const void *s_, const void *b_, int N, int C) {
    float *y = y_;
    const float *a = a_, *s = s_, *b = b_;
#pragma omp parallel for if ((size_t)N * C > PAR_MIN)
    for (long n = 0; n < N; n++)
        for (int c = 0; c < C; c++) y[(size_t)n * C + c] = a[(size_t)n * C + c] + s[c] * b[(size_t)n * C + c];
    return MN_OK;
}

// ds first, then db: db may alias dy.
static int c_scale_add_bwd(const Backend *be, void *db_, void *ds_, const void *dy_, const void *b_, const void *s_,
                           int N, int C, int accum) {
    float *db = db_, *ds = ds_;
    const float *dy = dy_, *b = b_, *s = s_;
    if (ds) {  // partial sums over fixed blocks of tokens, added in order (as rmsnorm's dw)
        enum { BLOCK = 256 };
        int nblocks = (N + BLOCK - 1) / BLOCK;
        double *part = mn_calloc((size_t)nblocks * C, sizeof(double));
        if (!part) return MN_ERR_NOMEM;
#pragma omp parallel for if ((size_t)N * C > PAR_MIN)
        for (int blk = 0; blk < nblocks; blk++) {
            double *pb = part + (size_t)blk * C;
            for (int n = blk * BLOCK; n < mn_min(N, (blk + 1) * BLOCK); n++)
                for (int c = 0; c < C; c++) pb[c] += (double)dy[(size_t)n * C + c] * b[(size_t)n * C + c];
        }
        for (int blk = 0; blk < nblocks; blk++)
            for (int c = 0; c < C; c++) ds[c] += (float)part[(size_t)blk * C + c];
        mn_free(part);
    }
#pragma omp parallel for if ((size_t)N * C > PAR_MIN)
    for (long n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            size_t i = (size_t)n * C + c;
            db[i] = (accum ? db[i] : 0) + dy[i] * s[c];
        }
    return MN_OK;
}

static int c_add(const Backend *be, void *x_, const void *y_, size_t n) {
    float *x = x_;
    const float *y = y_;
#pragma omp parallel for schedule(static, PAR_CHUNK) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) x[i] += y[i];
    return MN_OK;
}

// Input at time t (t < 0: from the state) of row b, for all C channels.
static inline const float *conv_row(const float *x, const float *state, int b, int t, int T, int C, int K) {
    if (t >= 0) return x + ((size_t)b * T + t) * C;
    return state ? state + ((size_t)b * (K - 1) + (t + K - 1)) * C : NULL;
}

static int c_conv_fwd(const Backend *be, void *y_, const void *x_, const void *w_, int B, int T, int C, int K,
                      const void *sin_, void *sout_) {
    float *y = y_, *sout = sout_;
    const float *x = x_, *w = w_, *sin = sin_;
#pragma omp parallel for collapse(2) if ((size_t)B * T * C > PAR_MIN)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *yr = y + ((size_t)b * T + t) * C;
            for (int c = 0; c < C; c++) yr[c] = 0;
            for (int j = 0; j < K; j++) {
                const float *xr = conv_row(x, sin, b, t - K + 1 + j, T, C, K);
                if (xr)
                    for (int c = 0; c < C; c++) yr[c] += w[(size_t)c * K + j] * xr[c];
            }
        }
    if (sout) {
        size_t n = (size_t)B * (K - 1) * C;
        float *tmp = mn_calloc(n ? n : 1, sizeof(float));  // state_out may alias state_in
        if (!tmp) return MN_ERR_NOMEM;
        for (int b = 0; b < B; b++)
            for (int i = 0; i < K - 1; i++) {
                const float *xr = conv_row(x, sin, b, T - (K - 1) + i, T, C, K);
                if (xr) memcpy(tmp + ((size_t)b * (K - 1) + i) * C, xr, sizeof(float) * C);
            }
        memcpy(sout, tmp, sizeof(float) * n);
        mn_free(tmp);
    }
    return MN_OK;
}

static int c_conv_bwd(const Backend *be, void *dx_, void *dw_, const void *dy_, const void *x_, const void *w_, int B,
                      int T, int C, int K, const void *sin_) {
    float *dx = dx_, *dw = dw_;
    const float *dy = dy_, *x = x_, *w = w_, *sin = sin_;
#pragma omp parallel for collapse(2) if ((size_t)B * T * C > PAR_MIN)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *dxr = dx + ((size_t)b * T + t) * C;
            for (int c = 0; c < C; c++) dxr[c] = 0;
            for (int j = 0; j < K; j++) {
                int to = t + K - 1 - j;  // the output that reads x[t] through tap j
                if (to >= T) continue;
                const float *dyr = dy + ((size_t)b * T + to) * C;
                for (int c = 0; c < C; c++) dxr[c] += w[(size_t)c * K + j] * dyr[c];
            }
        }
    // dw[c, j] = sum over (b, t) of dy[b,t,c] x[b, t-K+1+j, c]: per channel block, fixed order.
#pragma omp parallel for if ((size_t)B * T * C > PAR_MIN)
    for (int c0 = 0; c0 < C; c0 += 64) {
        int c1 = mn_min(C, c0 + 64);
        double acc[64 * 8] = {0};  // K <= 8
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) {
                const float *dyr = dy + ((size_t)b * T + t) * C;
                for (int j = 0; j < K; j++) {
                    const float *xr = conv_row(x, sin, b, t - K + 1 + j, T, C, K);
                    if (xr)
                        for (int c = c0; c < c1; c++) acc[(c - c0) * 8 + j] += (double)dyr[c] * xr[c];
                }
            }
        for (int c = c0; c < c1; c++)
            for (int j = 0; j < K; j++) dw[(size_t)c * K + j] += (float)acc[(c - c0) * 8 + j];
    }
    return MN_OK;
}

static int c_embed_fwd(const Backend *be, void *x_, const void *tok_, const void *e_, int N, int D, float scale) {
    float *x = x_;
    const int32_t *tok = tok_;
    const float *e = e_;
#pragma omp parallel for if ((size_t)N * D > PAR_MIN)
    for (int n = 0; n < N; n++)
        for (int i = 0; i < D; i++) x[(size_t)n * D + i] = scale * e[(size_t)tok[n] * D + i];
    return MN_OK;
}

static int c_embed_bwd(const Backend *be, void *de_, const void *dx_, const void *tok_, int N, int D, float scale) {
    float *de = de_;
    const float *dx = dx_;
    const int32_t *tok = tok_;
    for (int n = 0; n < N; n++)  // sequential over tokens: rows may repeat
        for (int i = 0; i < D; i++) de[(size_t)tok[n] * D + i] += scale * dx[(size_t)n * D + i];
    return MN_OK;
}

static int c_xent(const Backend *be, void *logits_, void *losses_, const void *targets_, int N, int V, float cap,
                  float grad_scale, const void *grad_scale_at) {
    float *logits = logits_, *losses = losses_;
    if (grad_scale_at) grad_scale = *(const float *)grad_scale_at;
    const int32_t *targets = targets_;
#pragma omp parallel for if ((size_t)N * V > PAR_MIN)
    for (int n = 0; n < N; n++) {
        float *z = logits + (size_t)n * V;
        int tgt = targets[n];
        if (tgt < 0) {
            losses[n] = 0;
            if (grad_scale != 0) memset(z, 0, sizeof(float) * V);
            continue;
        }
        if (cap > 0)
            for (int i = 0; i < V; i++) z[i] = cap * tanhf(z[i] / cap);
        float mx = -INFINITY;
        for (int i = 0; i < V; i++) mx = z[i] > mx ? z[i] : mx;
        float part[16] = {0};  // partial sums: the loop vectorises
        int i0 = 0;
        for (; i0 + 16 <= V; i0 += 16)
            for (int j = 0; j < 16; j++) part[j] += expf(z[i0 + j] - mx);
        for (; i0 < V; i0++) part[0] += expf(z[i0] - mx);
        double sum = 0;
        for (int j = 0; j < 16; j++) sum += part[j];
        float lse = mx + (float)log(sum);
        losses[n] = lse - z[tgt];
        if (grad_scale != 0)
            for (int i = 0; i < V; i++) {
                float d = expf(z[i] - lse) - (i == tgt);
                float dcap = cap > 0 ? 1 - (z[i] / cap) * (z[i] / cap) : 1;
                z[i] = grad_scale * d * dcap;
            }
    }
    return MN_OK;
}

static inline float log_sigmoidf(float a) { return a >= 0 ? -log1pf(expf(-a)) : a - log1pf(expf(a)); }

static int c_gates_fwd(const Backend *be, void *g_, void *beta_, const void *a_, const void *b_, size_t n,
                            float hmax) {
    float *g = g_, *beta = beta_;
    const float *a = a_, *b = b_;
    for (size_t i = 0; i < n; i++) {
        beta[i] = sigmoidf(b[i]);
        g[i] = log_sigmoidf(a[i]);
        if (hmax > 0) g[i] = fminf(g[i], log1pf(-beta[i] / hmax));
    }
    return MN_OK;
}

static int c_gates_bwd(const Backend *be, void *da_, void *db_, const void *dg_, const void *dbeta_,
                            const void *a_, const void *b_, size_t n, float hmax) {
    float *da = da_, *db = db_;
    const float *dg = dg_, *dbeta = dbeta_, *a = a_, *b = b_;
    for (size_t i = 0; i < n; i++) {
        float beta = sigmoidf(b[i]), dbt = dbeta[i];
        int bounded = hmax > 0 && log1pf(-beta / hmax) < log_sigmoidf(a[i]);
        da[i] = bounded ? 0 : dg[i] * sigmoidf(-a[i]);
        if (bounded) dbt += dg[i] * (-1 / hmax) / (1 - beta / hmax);
        db[i] = dbt * beta * (1 - beta);
    }
    return MN_OK;
}

static int c_scale_f32(const Backend *be, void *x_, size_t n, float s) {
    float *x = x_;
    for (size_t i = 0; i < n; i++) x[i] *= s;
    return MN_OK;
}

static int c_softplus_fwd(const Backend *be, void *y_, const void *p_, size_t n, float lo) {
    float *y = y_;
    const float *p = p_;
    for (size_t i = 0; i < n; i++) y[i] = (p[i] > 30 ? p[i] : log1pf(expf(p[i]))) + lo;
    return MN_OK;
}

static int c_softplus_bwd(const Backend *be, void *dp_, const void *dy_, const void *p_, size_t n) {
    float *dp = dp_;
    const float *dy = dy_, *p = p_;
    for (size_t i = 0; i < n; i++) dp[i] += dy[i] * sigmoidf(p[i]);
    return MN_OK;
}

static inline float softplusf_(float z) { return z > 30 ? z : log1pf(expf(z)); }

static int c_gdn_gate_fwd(const Backend *be, void *g_, const void *a_, const void *A_log_, const void *dt_bias_, int N,
                          int H) {
    float *g = g_;
    const float *a = a_, *A_log = A_log_, *dt = dt_bias_;
    for (size_t n = 0; n < (size_t)N; n++)
        for (int h = 0; h < H; h++) g[n * H + h] = -expf(A_log[h]) * softplusf_(a[n * H + h] + dt[h]);
    return MN_OK;
}

// The sums over tokens in double: a head's N terms (N up to batch x length) would lose digits in float.
static int c_gdn_gate_bwd(const Backend *be, void *da_, void *dA_log_, void *ddt_bias_, const void *dg_, const void *a_,
                          const void *A_log_, const void *dt_bias_, int N, int H) {
    float *da = da_, *dA = dA_log_, *ddt = ddt_bias_;
    const float *dg = dg_, *a = a_, *A_log = A_log_, *dt = dt_bias_;
    for (int h = 0; h < H; h++) {
        double sa = 0, sd = 0;
        float e = expf(A_log[h]);
        for (size_t n = 0; n < (size_t)N; n++) {
            float z = a[n * H + h] + dt[h], d = dg[n * H + h];
            da[n * H + h] = -d * e * sigmoidf(z);
            sa += (double)d * (-e * softplusf_(z));
            sd += da[n * H + h];
        }
        dA[h] += (float)sa;
        ddt[h] += (float)sd;
    }
    return MN_OK;
}

// Longhorn's implicit step: eps = beta / (1 + beta kappa), kappa = |k|^2 (the head's Dk squares
// summed in double). Each (token, head) is computed alone: the same numbers for any thread count.
static double sq_norm_f(const float *x, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)x[i] * x[i];
    return s;
}

static int c_longhorn_eps_fwd(const Backend *be, void *eps_, const void *beta_, const void *k_, int N, int H, int Dk) {
    float *eps = eps_;
    const float *beta = beta_, *k = k_;
#pragma omp parallel for schedule(static, PAR_CHUNK) if ((size_t)N * H * Dk > PAR_MIN)
    for (size_t i = 0; i < (size_t)N * H; i++)
        eps[i] = (float)(beta[i] / (1 + beta[i] * sq_norm_f(k + i * Dk, Dk)));
    return MN_OK;
}

static int c_longhorn_eps_bwd(const Backend *be, void *dbeta_, void *dk_, const void *deps_, const void *beta_,
                              const void *k_, int N, int H, int Dk) {
    float *dbeta = dbeta_, *dk = dk_;
    const float *deps = deps_, *beta = beta_, *k = k_;
#pragma omp parallel for schedule(static, PAR_CHUNK) if ((size_t)N * H * Dk > PAR_MIN)
    for (size_t i = 0; i < (size_t)N * H; i++) {
        double den = 1 + beta[i] * sq_norm_f(k + i * Dk, Dk), e = beta[i] / den, d = deps[i];
        float c = (float)(2 * d * e * e);
        for (int j = 0; j < Dk; j++) dk[i * Dk + j] -= c * k[i * Dk + j];
        dbeta[i] = (float)(d / (den * den));
    }
    return MN_OK;
}

static int c_mesa_fwd(const Backend *be, const MnSeqDims *d, const MnSolver *s, const MnMesaFwd *io) {
    return mn_mesa_forward(d, s, io);
}

static int c_mesa_bwd(const Backend *be, const MnSeqDims *d, const MnSolver *s, const MnMesaBwd *io) {
    return mn_mesa_backward(d, s, io);
}

static int c_lin_fwd(const Backend *be, const MnSeqDims *d, const MnLinOpts *o, const MnLinFwd *io) {
    return mn_lin_forward(d, o, io);
}

static int c_lin_bwd(const Backend *be, const MnSeqDims *d, const MnLinOpts *o, const MnLinBwd *io) {
    return mn_lin_backward(d, o, io);
}

// AdamW over the slab (backend.h): elementwise, so any split over threads gives the same numbers.
static int c_adamw(const Backend *be, const AdamwOpts *o, const AdamwIo *io) {
    double *stats = io->stats, norm = sqrt(stats[0]);
    stats[1] = !isfinite(norm);
    if (stats[1]) return MN_OK;
    float gs = o->clip > 0 && norm > o->clip ? (float)(o->clip / norm) : 1.0f;
    const float *sched = io->sched, *g = io->g;
    float *p = io->p, *m = io->m, *v = io->v;
    float lr = sched[0], b1 = o->beta1, b2 = o->beta2, eps = o->eps;
    float c1 = 1 - powf(b1, sched[1]), c2 = 1 - powf(b2, sched[1]);
    size_t n = io->n;
#pragma omp parallel for schedule(static, PAR_CHUNK) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        float gi = gs * g[i], wd = adamw_decays(io->decay, i) ? o->wd : 0;
        m[i] = b1 * m[i] + (1 - b1) * gi;
        v[i] = b2 * v[i] + (1 - b2) * gi * gi;
        p[i] -= lr * (m[i] / c1 / (sqrtf(v[i] / c2) + eps) + wd * p[i]);
    }
    return MN_OK;
}

// In order, as the host summed a download of them.
static int c_sum_f32(const Backend *be, void *sum, const void *x_, size_t n) {
    const float *x = x_;
    double s = 0;
    for (size_t i = 0; i < n; i++) s += x[i];
    *(double *)sum += s;
    return MN_OK;
}

static int c_sumsq(const Backend *be, void *out, const void *x_, size_t n) {
    const float *x = x_;
    double s = 0;
    // Fixed blocks summed in order: the same result whatever the thread count.
    size_t nb = (n + 4095) / 4096;
    double *part = mn_calloc(nb ? nb : 1, sizeof(double));
    if (!part) return MN_ERR_NOMEM;
#pragma omp parallel for if (n > PAR_MIN)
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * 4096, hi = lo + 4096 < n ? lo + 4096 : n;
        part[b] = vdot(x + lo, x + lo, (int)(hi - lo));
    }
    for (size_t b = 0; b < nb; b++) s += part[b];
    mn_free(part);
    *(double *)out = s;
    return MN_OK;
}

// The sequence-mixer families, all of them (every shape).
static const MesaOps cpu_mesa = {.fwd = c_mesa_fwd, .bwd = c_mesa_bwd, .softplus_fwd = c_softplus_fwd,
                                 .softplus_bwd = c_softplus_bwd};
static const LinOps cpu_lin = {.fwd = c_lin_fwd, .bwd = c_lin_bwd, .gdn_gate_fwd = c_gdn_gate_fwd,
                               .gdn_gate_bwd = c_gdn_gate_bwd, .longhorn_eps_fwd = c_longhorn_eps_fwd,
                               .longhorn_eps_bwd = c_longhorn_eps_bwd};
static const AttnOps cpu_attn_ops = {.fwd = cpu_attn_fwd, .bwd = cpu_attn_bwd, .decode = cpu_attn_decode,
                                     .rope = cpu_rope};

static const Backend cpu_backend = {
    .name = "cpu",
    .elem_size = c_elem_size, .alloc = c_alloc, .free = c_free, .zero = c_zero, .copy = c_copy, .copy_rows = c_copy_rows,
    .upload = c_upload, .download = c_download, .upload_f32 = c_upload_f32, .download_f32 = c_download_f32,
    .upload_i32 = host_upload_i32, .download_i32 = host_download_i32, .tally_i32 = host_tally_i32,
    .sync = c_sync, .mem_available = host_mem_available_op,
    .linear_fwd = c_linear_fwd, .linear_bwd = c_linear_bwd, .linear_runs_fwd = c_linear_runs_fwd,
    .linear_runs_bwd = c_linear_runs_bwd,
    .rmsnorm_fwd = c_rmsnorm_fwd, .rmsnorm_bwd = c_rmsnorm_bwd,
    .layernorm_fwd = c_layernorm_fwd, .layernorm_bwd = c_layernorm_bwd,
    .l2norm_fwd = c_l2norm_fwd, .l2norm_bwd = c_l2norm_bwd,
    .silu_fwd = c_silu_fwd, .silu_bwd = c_silu_bwd, .swiglu_fwd = c_swiglu_fwd, .swiglu_bwd = c_swiglu_bwd,
    .sigmoid_gate_fwd = c_sigmoid_gate_fwd, .sigmoid_gate_bwd = c_sigmoid_gate_bwd,
    .softcap = c_softcap, .gelu_fwd = c_gelu_fwd, .gelu_bwd = c_gelu_bwd,
    .geglu_fwd = c_geglu_fwd, .geglu_bwd = c_geglu_bwd,
    .gelu_tanh_fwd = c_gelu_tanh_fwd, .gelu_tanh_bwd = c_gelu_tanh_bwd,
    .geglu_tanh_fwd = c_geglu_tanh_fwd, .geglu_tanh_bwd = c_geglu_tanh_bwd,
    .bias_fwd = c_bias_fwd, .bias_bwd = c_bias_bwd,
    .pool_last_fwd = c_pool_last_fwd, .pool_last_bwd = c_pool_last_bwd,
    .headwise_fwd = c_headwise_fwd, .headwise_bwd = c_headwise_bwd,
    .scale_add_fwd = c_scale_add_fwd, .scale_add_bwd = c_scale_add_bwd,
    .add = c_add, .conv_fwd = c_conv_fwd, .conv_bwd = c_conv_bwd,
    .embed_fwd = c_embed_fwd, .embed_bwd = c_embed_bwd, .xent = c_xent,
    .gates_fwd = c_gates_fwd, .gates_bwd = c_gates_bwd, .scale_f32 = c_scale_f32,
    .mesa = &cpu_mesa, .lin = &cpu_lin, .attn = &cpu_attn_ops, .mlstm = &cpu_mlstm,
    .slstm = &cpu_slstm, .scan = &cpu_scan,
    .sum_f32 = c_sum_f32, .sumsq = c_sumsq, .adamw = c_adamw,
};

const Backend *backend_cpu(void) { return &cpu_backend; }
