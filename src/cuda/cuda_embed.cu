/*
 * The token embedding: rows of the table gathered, scaled; its gradient scattered by atomics.
 */
#include "cuda_ops.cuh"

__global__ void embed_fwd_kernel(bf16 *x, const int32_t *tok, const float *e, int N, int D, float scale) {
    GRID_LOOP(i, (size_t)N * D) st(x, i, scale * e[(size_t)tok[i / D] * D + i % D]);
}

__global__ void embed_bwd_kernel(float *de, const bf16 *dx, const int32_t *tok, int N, int D, float scale) {
    GRID_LOOP(i, (size_t)N * D) atomicAdd(&de[(size_t)tok[i / D] * D + i % D], scale * ld(dx, i));
}

int g_embed_fwd(const Backend *be, void *x, const void *tok, const void *e, int N, int D, float scale) {
    embed_fwd_kernel<<<grid_for((size_t)N * D, 256), 256, 0, cuda_ctx(be)->stream>>>(
        (bf16 *)x, (const int32_t *)tok, (const float *)e, N, D, scale);
    LAUNCH_CHECK();
    return MN_OK;
}

int g_embed_bwd(const Backend *be, void *de, const void *dx, const void *tok, int N, int D, float scale) {
    embed_bwd_kernel<<<grid_for((size_t)N * D, 256), 256, 0, cuda_ctx(be)->stream>>>(
        (float *)de, (const bf16 *)dx, (const int32_t *)tok, N, D, scale);
    LAUNCH_CHECK();
    return MN_OK;
}
