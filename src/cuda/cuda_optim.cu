/*
 * The optimiser: AdamW over float32 parameters (their bf16 copies refreshed), and the sum of
 * squares behind the gradient norm.
 */
#include "cuda_ops.cuh"

__global__ void adamw_kernel(float *p, bf16 *shadow, const float *g, float *m, float *v, size_t n, float gs, float lr,
                             float b1, float b2, float eps, float wd, float c1, float c2) {
    GRID_LOOP(i, n) {
        float gi = gs * g[i], mi = b1 * m[i] + (1 - b1) * gi, vi = b2 * v[i] + (1 - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float pi = p[i] - lr * (mi / c1 / (sqrtf(vi / c2) + eps) + wd * p[i]);
        p[i] = pi;
        if (shadow) shadow[i] = __float2bfloat16(pi);
    }
}

int g_adamw(const Backend *be, void *p, const void *g, void *m, void *v, size_t n, float gs, float lr, float b1,
            float b2, float eps, float wd, int t) {
    float c1 = 1 - powf(b1, (float)t), c2 = 1 - powf(b2, (float)t);
    adamw_kernel<<<grid_for(n, 256), 256, 0, cuda_ctx(be)->stream>>>((float *)p, (bf16 *)cuda_param_bf16(p),
                                                                     (const float *)g, (float *)m, (float *)v, n, gs, lr,
                                                                     b1, b2, eps, wd, c1, c2);
    LAUNCH_CHECK();
    return MN_OK;
}

// Per-block partial sums of squares (fixed blocks, summed in order on the host: deterministic).
__global__ void sumsq_kernel(double *part, const float *x, size_t n, size_t per_block) {
    __shared__ float red[32];
    size_t lo = blockIdx.x * per_block, hi = lo + per_block < n ? lo + per_block : n;
    float s = 0;
    for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x) s += x[i] * x[i];
    s = block_sum(s, red);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

int g_sumsq(const Backend *be, const void *x, size_t n, double *out) {
    CudaCtx *c = cuda_ctx(be);
    size_t per = 1 << 16, nb = (n + per - 1) / per;
    double *part = (double *)cuda_scratch(be, (nb ? nb : 1) * sizeof(double));
    if (!part) return MN_ERR_NOMEM;
    sumsq_kernel<<<(unsigned)(nb ? nb : 1), 256, 0, c->stream>>>(part, (const float *)x, n, per);
    LAUNCH_CHECK();
    double *h = (double *)malloc((nb ? nb : 1) * sizeof(double));
    if (!h) return mn_error(MN_ERR_NOMEM, "out of memory");
    cudaError_t e = cudaMemcpyAsync(h, part, nb * sizeof(double), cudaMemcpyDeviceToHost, c->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    double s = 0;
    for (size_t i = 0; i < nb; i++) s += h[i];
    free(h);
    CU_TRY(e);
    *out = s;
    return MN_OK;
}
