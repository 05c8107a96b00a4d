/*
 * The token embedding: rows of the table gathered, scaled; its gradient summed for each token in
 * the order of the positions where it occurs, so that a run repeated gives the same bits.
 */
#include <cub/device/device_radix_sort.cuh>

#include "cuda_ops.cuh"

__global__ void embed_fwd_kernel(bf16 *x, const int32_t *tok, const float *e, int N, int D, float scale) {
    GRID_LOOP(i, (size_t)N * D) st(x, i, scale * e[(size_t)tok[i / D] * D + i % D]);
}

int g_embed_fwd(const Backend *be, void *x, const void *tok, const void *e, int N, int D, float scale) {
    embed_fwd_kernel<<<grid_for((size_t)N * D, 256), 256, 0, cuda_ctx(be)->stream>>>(
        (bf16 *)x, (const int32_t *)tok, (const float *)e, N, D, scale);
    LAUNCH_CHECK();
    return MN_OK;
}

__global__ void iota_kernel(int32_t *p, int N) { GRID_LOOP(i, (size_t)N) p[i] = (int32_t)i; }

// One block per run of equal tokens in the sorted order (its first position; the others return):
// de[token] += scale * the sum of dx over the token's positions. The run's end by binary search (the
// tokens are sorted). Its positions are cut into G groups by their place in the run (j = g, g + G, ..),
// G = 8 for runs of 8 or more, fewer for shorter ones, each group summing its own in order and the
// groups then added in order: fixed by the run's length, so a run repeated gives the same bits. (A
// block walking all of a run's positions left a small vocabulary's long runs as one chain of loads:
// 236 us at the MAD model's 16K tokens of a few dozen kinds.)
#define EMB_T 256
__global__ void __launch_bounds__(EMB_T) embed_bwd_kernel(float *de, const bf16 *dx, const int32_t *tok,
                                                          const int32_t *pos, int N, int D, float scale) {
    __shared__ float acc[EMB_T];
    const int i = blockIdx.x;
    if (i > 0 && tok[i] == tok[i - 1]) return;
    int lo = i + 1, hi = N;  // the first position past the run
    while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if (tok[mid] == tok[i]) lo = mid + 1;
        else hi = mid;
    }
    const int L = lo - i, G = L >= 8 ? 8 : L >= 4 ? 4 : L >= 2 ? 2 : 1, W = EMB_T / G;
    const int g = threadIdx.x / W, lane = threadIdx.x % W;
    float *row = de + (size_t)tok[i] * D;
    for (int c0 = 0; c0 < D; c0 += W) {
        const int c = c0 + lane;
        float s = 0;
        if (c < D)
#pragma unroll 4
            for (int j = i + g; j < lo; j += G) s += ld(dx, (size_t)pos[j] * D + c);
        acc[threadIdx.x] = s;
        __syncthreads();
        if (g == 0 && c < D) {
            for (int q = 1; q < G; q++) s += acc[q * W + lane];
            row[c] += scale * s;
        }
        __syncthreads();
    }
}

// The gradient sorts the positions by token (cub's stable radix sort) and sums each token's rows in
// one block; scattering with atomics would add them in whatever order the threads ran.
int g_embed_bwd(const Backend *be, void *de, const void *dx, const void *tok, int N, int D, float scale) {
    if (N <= 0) return MN_OK;
    cudaStream_t s = cuda_ctx(be)->stream;
    size_t sort_bytes = 0;
    CU_TRY(cub::DeviceRadixSort::SortPairs(NULL, sort_bytes, (const int32_t *)NULL, (int32_t *)NULL,
                                           (const int32_t *)NULL, (int32_t *)NULL, N, 0, 32, s));
    size_t ints = (size_t)N * sizeof(int32_t), align = 256, off = (3 * ints + align - 1) / align * align;
    char *ws = (char *)cuda_scratch(be, off + sort_bytes);
    if (!ws) return MN_ERR_NOMEM;
    int32_t *tok_sorted = (int32_t *)ws, *pos = tok_sorted + N, *pos_sorted = pos + N;
    iota_kernel<<<grid_for((size_t)N, 256), 256, 0, s>>>(pos, N);
    LAUNCH_CHECK();
    CU_TRY(cub::DeviceRadixSort::SortPairs(ws + off, sort_bytes, (const int32_t *)tok, tok_sorted, pos, pos_sorted, N, 0,
                                           32, s));
    embed_bwd_kernel<<<(unsigned)N, EMB_T, 0, s>>>((float *)de, (const bf16 *)dx, tok_sorted, pos_sorted, N, D, scale);
    LAUNCH_CHECK();
    return MN_OK;
}
