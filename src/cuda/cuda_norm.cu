/*
 * RMS norm, LayerNorm (without bias) and L2 norm, forward and backward: a row (a group of
 * features) to a power-of-two share of a warp, read in 16-byte pieces.
 */
#include "cuda_ops.cuh"

// The norms take a row (a group of `group` features) with `lanes` lanes of a warp: a power of two
// up to 32, enough for the row's pieces, so that short rows (a head's 128 features are 16 pieces)
// leave no lanes idle; a warp takes 32 / lanes rows. Lane `sub` of its row reads pieces sub, sub +
// lanes, ..; rows past the end (ok = 0) still take part in the shuffles.
typedef struct {
    long r;
    int sub, ok;
} NormRow;

static int norm_lanes(int group, int vec) {
    int pieces = vec ? group / 8 : group, lanes = 1;
    while (lanes < pieces && lanes < 32) lanes *= 2;
    return lanes;
}

static unsigned norm_grid(long rows, int lanes) {  // 256-thread blocks
    long per_block = 8L * (32 / lanes);
    return (unsigned)((rows + per_block - 1) / per_block);
}

__device__ __forceinline__ NormRow norm_row(long rows, int lanes) {
    int lane = threadIdx.x & 31;
    long r = ((long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * (32 / lanes) + lane / lanes;
    NormRow n = {r, lane % lanes, r < rows};
    return n;
}

// The sum over the lanes of each row (all lanes of the warp call it).
__device__ __forceinline__ float row_sum(float v, int lanes) {
    for (int o = lanes / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// RMS norm.
__global__ void rmsnorm_fwd_kernel(bf16 *y, float *rstd, const bf16 *x, const float *w, long rows, int group, int per_row,
                                   int wfull, float eps, int vec, int lanes) {
    NormRow nr = norm_row(rows, lanes);
    long r = nr.ok ? nr.r : 0;
    int width = vec ? 8 : 1, i0 = nr.ok ? nr.sub * width : group, step = lanes * width;
    const bf16 *xr = x + (size_t)r * group;
    const float *wr = w + (wfull ? (size_t)(r % per_row) * group : 0);
    float ss = 0, v[8], wv[8];
    for (int i = i0; i < group; i += step) {
        int n = piece_load(xr + i, vec, v);
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (k < n) ss += v[k] * v[k];
    }
    float rs = rsqrtf(row_sum(ss, lanes) / group + eps);
    if (nr.ok && nr.sub == 0) rstd[r] = rs;
    for (int i = i0; i < group; i += step) {
        int n = piece_load(xr + i, vec, v);
        piece_load_f32(wr + i, vec, wv);
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (k < n) v[k] *= rs * wv[k];
        piece_store(y + (size_t)r * group + i, vec, v);
    }
}

int g_rmsnorm_fwd(const Backend *be, void *y, void *rstd, const void *x, const void *w, int N, int D, int group,
                  int wlen, float eps) {
    long rows = (long)N * (D / group);
    int vec = rows_vec(group, x, y, w, w), lanes = norm_lanes(group, vec);
    rmsnorm_fwd_kernel<<<norm_grid(rows, lanes), 256, 0, cuda_ctx(be)->stream>>>(
        (bf16 *)y, (float *)rstd, (const bf16 *)x, (const float *)w, rows, group, D / group, wlen != group, eps, vec, lanes);
    LAUNCH_CHECK();
    return MN_OK;
}

__global__ void rmsnorm_bwd_dx_kernel(bf16 *dx, const bf16 *dy, const bf16 *x, const float *w, const float *rstd,
                                      long rows, int group, int per_row, int wfull, int accum, int vec, int lanes) {
    NormRow nr = norm_row(rows, lanes);
    long r = nr.ok ? nr.r : 0;
    int width = vec ? 8 : 1, i0 = nr.ok ? nr.sub * width : group, step = lanes * width;
    size_t o = (size_t)r * group;
    const float *wr = w + (wfull ? (size_t)(r % per_row) * group : 0);
    float dot = 0, a[8], b[8], d[8], wv[8];
    for (int i = i0; i < group; i += step) {
        int n = piece_load(dy + o + i, vec, a);
        piece_load(x + o + i, vec, b);
        piece_load_f32(wr + i, vec, wv);
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (k < n) dot += a[k] * wv[k] * b[k];
    }
    dot = row_sum(dot, lanes);
    float rs = rstd[r], c = rs * rs * dot / group;
    for (int i = i0; i < group; i += step) {
        int n = piece_load(dy + o + i, vec, a);
        piece_load(x + o + i, vec, b);
        piece_load_f32(wr + i, vec, wv);
        if (accum) piece_load(dx + o + i, vec, d);
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (k < n) a[k] = (accum ? d[k] : 0.0f) + rs * (a[k] * wv[k] - b[k] * c);
        piece_store(dx + o + i, vec, a);
    }
}

// dw: column sums of dy x rstd over rows of wlen (a whole row of D, or one group when the weight is shared).
int g_rmsnorm_bwd(const Backend *be, void *dx, void *dw, const void *dy, const void *x, const void *w,
                  const void *rstd, int N, int D, int group, int wlen, int accum) {
    long rows = (long)N * (D / group);
    int vec = rows_vec(group, dy, x, dx, w), lanes = norm_lanes(group, vec);
    rmsnorm_bwd_dx_kernel<<<norm_grid(rows, lanes), 256, 0, cuda_ctx(be)->stream>>>(
        (bf16 *)dx, (const bf16 *)dy, (const bf16 *)x, (const float *)w, (const float *)rstd, rows, group, D / group,
        wlen != group, accum, vec, lanes);
    LAUNCH_CHECK();
    if (dw)
        return colsum(be, (float *)dw, (const bf16 *)dy, (const bf16 *)x, (const float *)rstd, (long)N * (D / wlen), wlen,
                      group);
    return MN_OK;
}

// LayerNorm without bias (xLSTM's LayerNorm and per-head GroupNorm): the mean, then the biased
// variance about it (a second pass over the row, from L1: no cancellation where the mean is large
// beside the spread), then y = (x - mean) rstd w.
__global__ void layernorm_fwd_kernel(bf16 *y, float *mean, float *rstd, const bf16 *x, const float *w, long rows,
                                     int group, int per_row, int wfull, float eps, int vec, int lanes) {
    NormRow nr = norm_row(rows, lanes);
    long r = nr.ok ? nr.r : 0;
    int width = vec ? 8 : 1, i0 = nr.ok ? nr.sub * width : group, step = lanes * width;
    const bf16 *xr = x + (size_t)r * group;
    const float *wr = w + (wfull ? (size_t)(r % per_row) * group : 0);
    float s = 0, v[8], wv[8];
    for (int i = i0; i < group; i += step) {
        int n = piece_load(xr + i, vec, v);
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (k < n) s += v[k];
    }
    float mu = row_sum(s, lanes) / group, ss = 0;
    for (int i = i0; i < group; i += step) {
        int n = piece_load(xr + i, vec, v);
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (k < n) ss += (v[k] - mu) * (v[k] - mu);
    }
    float rs = rsqrtf(row_sum(ss, lanes) / group + eps);
    if (nr.ok && nr.sub == 0) {
        mean[r] = mu;
        rstd[r] = rs;
    }
    for (int i = i0; i < group; i += step) {
        int n = piece_load(xr + i, vec, v);
        piece_load_f32(wr + i, vec, wv);
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (k < n) v[k] = (v[k] - mu) * rs * wv[k];
        piece_store(y + (size_t)r * group + i, vec, v);
    }
}

int g_layernorm_fwd(const Backend *be, void *y, void *mean, void *rstd, const void *x, const void *w, int N, int D,
                    int group, int wlen, float eps) {
    long rows = (long)N * (D / group);
    int vec = rows_vec(group, x, y, w, w), lanes = norm_lanes(group, vec);
    layernorm_fwd_kernel<<<norm_grid(rows, lanes), 256, 0, cuda_ctx(be)->stream>>>(
        (bf16 *)y, (float *)mean, (float *)rstd, (const bf16 *)x, (const float *)w, rows, group, D / group,
        wlen != group, eps, vec, lanes);
    LAUNCH_CHECK();
    return MN_OK;
}

// With xh = (x - mean) rstd and g = dy w: dx = rstd (g - mean(g) - xh mean(g xh)).
__global__ void layernorm_bwd_dx_kernel(bf16 *dx, const bf16 *dy, const bf16 *x, const float *w, const float *mean,
                                        const float *rstd, long rows, int group, int per_row, int wfull, int accum,
                                        int vec, int lanes) {
    NormRow nr = norm_row(rows, lanes);
    long r = nr.ok ? nr.r : 0;
    int width = vec ? 8 : 1, i0 = nr.ok ? nr.sub * width : group, step = lanes * width;
    size_t o = (size_t)r * group;
    const float *wr = w + (wfull ? (size_t)(r % per_row) * group : 0);
    float mu = mean[r], rs = rstd[r], sg = 0, sgx = 0, a[8], b[8], d[8], wv[8];
    for (int i = i0; i < group; i += step) {
        int n = piece_load(dy + o + i, vec, a);
        piece_load(x + o + i, vec, b);
        piece_load_f32(wr + i, vec, wv);
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (k < n) {
                float g = a[k] * wv[k];
                sg += g;
                sgx += g * (b[k] - mu);
            }
    }
    sg = row_sum(sg, lanes);
    sgx = row_sum(sgx, lanes);
    float c1 = sg / group, c2 = sgx * rs * rs / group;  // mean(g), mean(g xh) / rstd
    for (int i = i0; i < group; i += step) {
        int n = piece_load(dy + o + i, vec, a);
        piece_load(x + o + i, vec, b);
        piece_load_f32(wr + i, vec, wv);
        if (accum) piece_load(dx + o + i, vec, d);
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (k < n) a[k] = (accum ? d[k] : 0.0f) + rs * (a[k] * wv[k] - c1 - (b[k] - mu) * c2);
        piece_store(dx + o + i, vec, a);
    }
}

// dw: column sums of dy (x - mean) rstd over rows of wlen, as rmsnorm's.
int g_layernorm_bwd(const Backend *be, void *dx, void *dw, const void *dy, const void *x, const void *w,
                    const void *mean, const void *rstd, int N, int D, int group, int wlen, int accum) {
    long rows = (long)N * (D / group);
    int vec = rows_vec(group, dy, x, dx, w), lanes = norm_lanes(group, vec);
    layernorm_bwd_dx_kernel<<<norm_grid(rows, lanes), 256, 0, cuda_ctx(be)->stream>>>(
        (bf16 *)dx, (const bf16 *)dy, (const bf16 *)x, (const float *)w, (const float *)mean, (const float *)rstd, rows,
        group, D / group, wlen != group, accum, vec, lanes);
    LAUNCH_CHECK();
    if (dw)
        return colsum_centred(be, (float *)dw, (const bf16 *)dy, (const bf16 *)x, (const float *)mean,
                              (const float *)rstd, (long)N * (D / wlen), wlen, group);
    return MN_OK;
}

__global__ void l2norm_fwd_kernel(bf16 *y, float *inv, const bf16 *x, long rows, int group, float eps, int vec,
                                  int lanes) {
    NormRow nr = norm_row(rows, lanes);
    long r = nr.ok ? nr.r : 0;
    int width = vec ? 8 : 1, i0 = nr.ok ? nr.sub * width : group, step = lanes * width;
    size_t o = (size_t)r * group;
    float ss = 0, v[8];
    for (int i = i0; i < group; i += step) {
        int n = piece_load(x + o + i, vec, v);
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (k < n) ss += v[k] * v[k];
    }
    float iv = rsqrtf(row_sum(ss, lanes) + eps);
    if (nr.ok && nr.sub == 0) inv[r] = iv;
    for (int i = i0; i < group; i += step) {
        int n = piece_load(x + o + i, vec, v);
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (k < n) v[k] *= iv;
        piece_store(y + o + i, vec, v);
    }
}

__global__ void l2norm_bwd_kernel(bf16 *dx, const bf16 *dy, const bf16 *y, const float *inv, long rows, int group,
                                  int vec, int lanes) {
    NormRow nr = norm_row(rows, lanes);
    long r = nr.ok ? nr.r : 0;
    int width = vec ? 8 : 1, i0 = nr.ok ? nr.sub * width : group, step = lanes * width;
    size_t o = (size_t)r * group;
    float dot = 0, a[8], b[8];
    for (int i = i0; i < group; i += step) {
        int n = piece_load(dy + o + i, vec, a);
        piece_load(y + o + i, vec, b);
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (k < n) dot += a[k] * b[k];
    }
    dot = row_sum(dot, lanes);
    for (int i = i0; i < group; i += step) {
        int n = piece_load(dy + o + i, vec, a);
        piece_load(y + o + i, vec, b);
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (k < n) a[k] = inv[r] * (a[k] - b[k] * dot);
        piece_store(dx + o + i, vec, a);
    }
}

int g_l2norm_fwd(const Backend *be, void *y, void *inv, const void *x, int N, int D, int group, float eps) {
    long rows = (long)N * (D / group);
    int vec = rows_vec(group, x, y, y, y), lanes = norm_lanes(group, vec);
    l2norm_fwd_kernel<<<norm_grid(rows, lanes), 256, 0, cuda_ctx(be)->stream>>>((bf16 *)y, (float *)inv, (const bf16 *)x,
                                                                               rows, group, eps, vec, lanes);
    LAUNCH_CHECK();
    return MN_OK;
}

int g_l2norm_bwd(const Backend *be, void *dx, const void *dy, const void *y, const void *inv, int N, int D,
                 int group) {
    long rows = (long)N * (D / group);
    int vec = rows_vec(group, dy, y, dx, dx), lanes = norm_lanes(group, vec);
    l2norm_bwd_kernel<<<norm_grid(rows, lanes), 256, 0, cuda_ctx(be)->stream>>>(
        (bf16 *)dx, (const bf16 *)dy, (const bf16 *)y, (const float *)inv, rows, group, vec, lanes);
    LAUNCH_CHECK();
    return MN_OK;
}
