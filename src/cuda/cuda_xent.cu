/*
 * The cross-entropy loss over the logits, soft cap included, with its gradient written in place.
 */
#include "cuda_ops.cuh"

// (m, s) <- the log-sum-exp pair of the union of two sets, each held as its
// maximum m and sum of e^{v - m} (m = -inf: empty).
__device__ __forceinline__ void lse_merge(float *m, float *s, float m2, float s2) {
    float M = fmaxf(*m, m2);
    if (M == -INFINITY) return;
    *s = *s * expf(*m - M) + s2 * expf(m2 - M);
    *m = M;
}

__device__ __forceinline__ float soft_cap(float v, float cap) { return cap > 0 ? cap * tanhf(v / cap) : v; }

// One block per row: soft cap, log-sum-exp, loss, and the gradient in place, in two passes
// over the row: the log-sum-exp online (a running maximum rescales the running sum), then
// the gradient (the row, 100 KB at GPT-2's vocabulary, is still in L2). Rows are read in
// 16-byte pieces where they allow it.
__global__ void xent_kernel(bf16 *logits, float *losses, const int32_t *targets, int V, float cap, float grad_scale,
                            const float *grad_scale_at, int vec) {
    if (grad_scale_at) grad_scale = *grad_scale_at;
    __shared__ float red_m[32], red_s[32];
    __shared__ float zt;
    int n = blockIdx.x, tgt = targets[n], width = vec ? 8 : 1, lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
    bf16 *z = logits + (size_t)n * V;
    if (tgt < 0) {
        if (threadIdx.x == 0) losses[n] = 0;
        if (grad_scale != 0)
            for (int i = threadIdx.x; i < V; i += blockDim.x) st(z, i, 0);
        return;
    }
    float mx = -INFINITY, sum = 0, v[8];
    for (int i = threadIdx.x * width; i < V; i += blockDim.x * width) {
        int w = piece_load(z + i, vec, v);
        float pm = -INFINITY;
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (k < w) {
                v[k] = soft_cap(v[k], cap);
                pm = fmaxf(pm, v[k]);
                if (i + k == tgt) zt = v[k];
            }
        if (pm > mx) {
            sum *= expf(mx - pm);
            mx = pm;
        }
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (k < w) sum += expf(v[k] - mx);
    }
    for (int o = 16; o > 0; o >>= 1) lse_merge(&mx, &sum, __shfl_xor_sync(0xffffffffu, mx, o), __shfl_xor_sync(0xffffffffu, sum, o));
    if (lane == 0) {
        red_m[wp] = mx;
        red_s[wp] = sum;
    }
    __syncthreads();  // (also publishes zt)
    mx = -INFINITY;
    sum = 0;
    for (int w = 0; w < (int)blockDim.x / 32; w++) lse_merge(&mx, &sum, red_m[w], red_s[w]);
    float lse = mx + logf(sum);
    if (threadIdx.x == 0) losses[n] = lse - zt;
    for (int i = threadIdx.x * width; i < V; i += blockDim.x * width) {
        int w = piece_load(z + i, vec, v);
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (k < w) {
                float c = soft_cap(v[k], cap);
                if (grad_scale != 0) {
                    float d = expf(c - lse) - (i + k == tgt), dcap = cap > 0 ? 1 - (c / cap) * (c / cap) : 1.0f;
                    v[k] = grad_scale * d * dcap;
                } else {
                    v[k] = c;  // leave the capped logits, as the other backends do
                }
            }
        piece_store(z + i, vec, v);
    }
}

int g_xent(const Backend *be, void *logits, void *losses, const void *targets, int N, int V, float cap,
           float grad_scale, const void *grad_scale_at) {
    xent_kernel<<<(unsigned)N, 256, 0, cuda_ctx(be)->stream>>>((bf16 *)logits, (float *)losses, (const int32_t *)targets,
                                                               V, cap, grad_scale, (const float *)grad_scale_at,
                                                               rows_vec(V, logits, logits, logits, logits));
    LAUNCH_CHECK();
    return MN_OK;
}
