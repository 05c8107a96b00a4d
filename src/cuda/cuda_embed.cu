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
// de[token] += scale * the sum of dx over the token's positions, in the order of the positions
// (the radix sort is stable).
__global__ void embed_bwd_kernel(float *de, const bf16 *dx, const int32_t *tok, const int32_t *pos, int N, int D,
                                 float scale) {
    int i = blockIdx.x;
    if (i > 0 && tok[i] == tok[i - 1]) return;
    int end = i + 1;
    while (end < N && tok[end] == tok[i]) end++;
    float *row = de + (size_t)tok[i] * D;
    for (int c = threadIdx.x; c < D; c += blockDim.x) {
        float s = 0;
        for (int j = i; j < end; j++) s += ld(dx, (size_t)pos[j] * D + c);
        row[c] += scale * s;
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
    embed_bwd_kernel<<<(unsigned)N, 128, 0, s>>>((float *)de, (const bf16 *)dx, tok_sorted, pos_sorted, N, D, scale);
    LAUNCH_CHECK();
    return MN_OK;
}
