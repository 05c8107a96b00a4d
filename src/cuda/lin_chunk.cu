/*
 * The chunkwise form's entry points (lin_chunk.cuh): the call's shape in chunks, the choice of
 * path (the fused kernels where they take the call, the cuBLAS path otherwise) and the gates that
 * both paths compute first.
 */
#include <string.h>

#include "lin_chunk_fused.cuh"

extern "C" int cuda_lin_chunk_fwd(const Backend *be, const MnSeqDims *d, const MnLinOpts *o, const MnLinFwd *io);
extern "C" int cuda_lin_chunk_bwd(const Backend *be, const MnSeqDims *d, const MnLinOpts *o, const MnLinBwd *io);

// Gates of every chunk: one thread per chunk (C sequential steps of the cumulative sum).
__global__ void lc_gates_kernel(const LcDims d, const float *g, const float *beta, const LcGates gt) {
    for (size_t ch = blockIdx.x * (size_t)blockDim.x + threadIdx.x; ch < d.nch; ch += (size_t)gridDim.x * blockDim.x) {
        int p = (int)(ch / d.N), t0 = (int)(ch % d.N) * d.C, n = min(d.C, d.T - t0);
        size_t r = ch * d.C;
        float acc = 0.0f;
        for (int t = 0; t < d.C; t++) {
            size_t ti = t < n ? lc_tok(d, p, t0 + t) : 0;
            acc += g && t < n ? g[ti] : 0.0f;
            gt.b[r + t] = acc;
            gt.gam[r + t] = expf(acc);
            gt.beta[r + t] = t < n ? (beta ? beta[ti] : 1.0f) : 0.0f;
            gt.bg[r + t] = gt.beta[r + t] * gt.gam[r + t];
        }
        gt.dec[ch] = expf(acc);
        for (int t = 0; t < d.C; t++) gt.lam[r + t] = expf(acc - gt.b[r + t]);
    }
}

static int lc_dims(LcDims *ld_, const MnSeqDims *d, const MnLinOpts *o, const char *fn) {
    int C = o->chunk ? o->chunk : LC_CMAX;
    memset(ld_, 0, sizeof *ld_);
    if (C > LC_CMAX)
        return mn_error(MN_ERR_UNSUPPORTED, "%s: chunk = %d: the CUDA chunkwise form takes chunks of at most %d", fn, C,
                        LC_CMAX);
    ld_->T = d->T;
    ld_->H = d->H;
    ld_->Dk = d->Dk;
    ld_->Dv = d->Dv;
    ld_->C = C;
    ld_->P = d->B * d->H;
    ld_->N = (d->T + C - 1) / C;
    ld_->nch = (size_t)ld_->P * ld_->N;
    ld_->ss = (size_t)d->Dv * d->Dk;
    return MN_OK;
}

int cuda_lin_chunk_fwd(const Backend *be, const MnSeqDims *dm, const MnLinOpts *o, const MnLinFwd *io) {
    CudaCtx *c = cuda_ctx(be);
    LcDims d;
    MN_TRY(lc_dims(&d, dm, o, "cuda lin forward (chunk)"));
    int delta = o->rule == MN_LIN_DELTA;
    if (lf_use(c, &d, LF_WALK_SMEM)) return lf_forward(be, c, &d, delta, o->scale, io);
    return lc_forward(be, c, &d, delta, o->scale, io);
}

int cuda_lin_chunk_bwd(const Backend *be, const MnSeqDims *dm, const MnLinOpts *o, const MnLinBwd *io) {
    CudaCtx *c = cuda_ctx(be);
    LcDims d;
    MN_TRY(lc_dims(&d, dm, o, "cuda lin backward (chunk)"));
    int delta = o->rule == MN_LIN_DELTA;
    if (lf_use(c, &d, delta ? LF_UTB_SMEM : LF_WALK_SMEM)) return delta ? lf_backward_delta(be, c, &d, o->scale, io) : lf_backward_gla(be, c, &d, o->scale, io);
    return lc_backward(be, c, &d, delta, o->scale, io);
}
