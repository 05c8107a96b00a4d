/*
 * The optimiser: AdamW over the float32 parameter slab (its bf16 copy refreshed) in one launch,
 * and the training step's sums (the losses', the gradient's squares) into float64 scalars on the
 * device, so that a step needs no host transfer between its ops and can be recorded in a graph.
 * Every sum runs in a fixed order (fixed blocks, then their partials in order): the same bits on
 * every run.
 */
#include "cuda_ops.cuh"

// The per-step values come from device memory (sched: lr, t; stats[0]: the gradient's sum of
// squares), so that a recording replays with the step's own. Each thread derives the clip scale
// and the bias corrections itself (a handful of flops against its elements' memory traffic).
__global__ void adamw_kernel(float *p, bf16 *shadow, const float *g, float *m, float *v, size_t n,
                             const int32_t *decay, const float *sched, double *stats, float b1, float b2, float eps,
                             float wd, float clip) {
    double norm = sqrt(stats[0]);
    if (!isfinite(norm)) {  // refused: nothing changes, the host is told
        if (blockIdx.x == 0 && threadIdx.x == 0) stats[1] = 1;
        return;
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) stats[1] = 0;
    float gs = clip > 0 && norm > clip ? (float)(clip / norm) : 1.0f;
    float lr = sched[0], c1 = 1 - powf(b1, sched[1]), c2 = 1 - powf(b2, sched[1]);
    GRID_LOOP(i, n) {
        float w = ((uint32_t)decay[i >> 8] >> ((i >> 3) & 31)) & 1u ? wd : 0.0f;
        float gi = gs * g[i], mi = b1 * m[i] + (1 - b1) * gi, vi = b2 * v[i] + (1 - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float pi = p[i] - lr * (mi / c1 / (sqrtf(vi / c2) + eps) + w * p[i]);
        p[i] = pi;
        if (shadow) shadow[i] = __float2bfloat16(pi);
    }
}

int g_adamw(const Backend *be, const AdamwOpts *o, const AdamwIo *io) {
    size_t n = io->n;
    adamw_kernel<<<grid_for(n ? n : 1, 256), 256, 0, cuda_ctx(be)->stream>>>(
        (float *)io->p, (bf16 *)cuda_param_bf16(io->p), (const float *)io->g, (float *)io->m, (float *)io->v, n,
        (const int32_t *)io->decay, (const float *)io->sched, (double *)io->stats, o->beta1, o->beta2, o->eps, o->wd,
        o->clip);
    LAUNCH_CHECK();
    return MN_OK;
}

// Per-block partial sums (of squares) over fixed blocks of per_block elements, in double.
__global__ void part_sum_kernel(double *part, const float *x, size_t n, size_t per_block, int squares) {
    __shared__ double red[256];
    size_t lo = blockIdx.x * per_block, hi = lo + per_block < n ? lo + per_block : n;
    double s = 0;
    for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x) s += squares ? (double)x[i] * x[i] : (double)x[i];
    red[threadIdx.x] = s;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {  // a fixed tree: the same order every run
        if ((int)threadIdx.x < w) red[threadIdx.x] += red[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) part[blockIdx.x] = red[0];
}

// out[0] = (accum ? out[0] : 0) + the partials summed in order (one thread: there are few).
__global__ void part_total_kernel(double *out, const double *part, size_t nb, int accum) {
    double s = 0;
    for (size_t i = 0; i < nb; i++) s += part[i];
    out[0] = accum ? out[0] + s : s;
}

// Blocks of n / 1024 elements (rounded up to 2048 .. 65536, fixed by n): a small model's 400K
// parameters in 196 blocks rather than 7, a 1B-parameter slab in 16K, a step's losses in a few.
static int fixed_sum(const Backend *be, double *out, const float *x, size_t n, int squares, int accum) {
    CudaCtx *c = cuda_ctx(be);
    size_t per = (n / 1024 + 2047) / 2048 * 2048;
    if (per < 2048) per = 2048;
    if (per > (1 << 16)) per = 1 << 16;
    size_t nb = n ? (n + per - 1) / per : 1;
    double *part = (double *)cuda_scratch(be, nb * sizeof(double));
    if (!part) return MN_ERR_NOMEM;
    part_sum_kernel<<<(unsigned)nb, 256, 0, c->stream>>>(part, x, n, per, squares);
    LAUNCH_CHECK();
    part_total_kernel<<<1, 1, 0, c->stream>>>(out, part, nb, accum);
    LAUNCH_CHECK();
    return MN_OK;
}

int g_sum_f32(const Backend *be, void *sum, const void *x, size_t n) {
    return fixed_sum(be, (double *)sum, (const float *)x, n, 0, 1);
}

int g_sumsq(const Backend *be, void *out, const void *x, size_t n) {
    return fixed_sum(be, (double *)out, (const float *)x, n, 1, 0);
}
