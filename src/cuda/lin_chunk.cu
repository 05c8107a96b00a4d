/*
 * The chunkwise form's entry points (lin_chunk.cuh): the call's shape in chunks, the choice of
 * path (the fused kernels where they take the call, the cuBLAS path otherwise) and the gates that
 * both paths compute first.
 */
#include <stdlib.h>
#include <string.h>

#include "lin_chunk_fused.cuh"

extern "C" int cuda_lin_chunk_fwd(const Backend *be, const MnSeqDims *d, const MnLinOpts *o, const MnLinFwd *io);
extern "C" int cuda_lin_chunk_bwd(const Backend *be, const MnSeqDims *d, const MnLinOpts *o, const MnLinBwd *io);

// Gates of every chunk: a block takes LC_GPB chunks, a thread a token; each thread adds its chunk's
// log-gates up to its token in order from the first (the sequential sum's operations, so the same bits
// as one thread walking the chunk), so that the stores are coalesced and a small problem's thousand
// chunks fill the device (one thread a chunk left it mostly idle: 62 us at the MAD model's size).
__global__ void __launch_bounds__(LC_GPB * LC_CMAX) lc_gates_kernel(const LcDims d, const float *g, const float *beta,
                                                                    const LcGates gt) {
    __shared__ float gs[LC_GPB][LC_CMAX], bs[LC_GPB][LC_CMAX];
    const int q = threadIdx.x / LC_CMAX, t = threadIdx.x % LC_CMAX;
    for (size_t c0 = blockIdx.x * (size_t)LC_GPB; c0 < d.nch; c0 += (size_t)gridDim.x * LC_GPB) {  // (block-uniform)
        const size_t ch = c0 + q;
        const int on = ch < d.nch && t < d.C;
        const int p = on ? (int)(ch / d.N) : 0, t0 = on ? (int)(ch % d.N) * d.C : 0, n = on ? min(d.C, d.T - t0) : 0;
        const size_t ti = t < n ? lc_tok(d, p, t0 + t) : 0;
        gs[q][t] = g && t < n ? g[ti] : 0.0f;
        __syncthreads();
        float acc = 0.0f;
        for (int s = 0; s <= t && s < d.C; s++) acc += gs[q][s];
        bs[q][t] = acc;
        __syncthreads();
        if (on) {
            const size_t r = ch * d.C + t;
            const float total = bs[q][d.C - 1], bt = t < n ? (beta ? beta[ti] : 1.0f) : 0.0f, gam = expf(acc);
            gt.b[r] = acc;
            gt.gam[r] = gam;
            gt.beta[r] = bt;
            gt.bg[r] = bt * gam;
            gt.lam[r] = expf(total - acc);
            if (t == 0) gt.dec[ch] = expf(total);
        }
        __syncthreads();  // (gs, bs reused)
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

// Which products take the call: MESANET_LIN (cublas, split or bf16: the tests' and benchmarks' choice,
// read at every call) over the call's precision. AUTO: single bf16 products for the GLA rule, whose
// errors on the benchmark's inputs and on the hard ones (no decay, a repeated key) are at or under
// fla's; the split products for the delta rule, whose single-product errors on a repeated key exceed
// fla's (o, dq, dv by 1.2x; dg reaches 9e-2 where the split build's stays near 1e-4: docs/cuda.md);
// and heads up to 32 to the split build for them (lin_chunk_fused_d32.cu), whose small tiles serve
// small models better. A shape a build does not take goes to the next (d32, then split, then cuBLAS).
typedef enum { LIN_CUBLAS, LIN_SPLIT, LIN_BF16 } LinPath;
static LinPath lin_path(const MnLinOpts *o, const LcDims *d, int delta) {
    const char *e = getenv("MESANET_LIN");
    if (e && !strcmp(e, "cublas")) return LIN_CUBLAS;
    if (e && !strcmp(e, "split")) return LIN_SPLIT;
    if (e && !strcmp(e, "bf16")) return LIN_BF16;
    if (o->precision != MN_PREC_AUTO) return o->precision == MN_PREC_BF16 ? LIN_BF16 : LIN_SPLIT;
    return delta || (d->Dk <= 32 && d->Dv <= 32) ? LIN_SPLIT : LIN_BF16;
}

int cuda_lin_chunk_fwd(const Backend *be, const MnSeqDims *dm, const MnLinOpts *o, const MnLinFwd *io) {
    CudaCtx *c = cuda_ctx(be);
    LcDims d;
    MN_TRY(lc_dims(&d, dm, o, "cuda lin forward (chunk)"));
    const int delta = o->rule == MN_LIN_DELTA;
    const LinPath path = lin_path(o, &d, delta);
    if (path == LIN_CUBLAS) return lc_forward(be, c, &d, delta, o->scale, io);
#ifndef LF_ONE_BUILD
    if (path == LIN_BF16 && lf_use_bf16(c, &d, lf_walk_smem_bf16)) return lf_forward_bf16(be, c, &d, delta, o->scale, io);
    if (lf_use_d32(c, &d, lf_walk_smem_d32)) return lf_forward_d32(be, c, &d, delta, o->scale, io);
#endif
    if (lf_use(c, &d, LF_WALK_SMEM)) return lf_forward(be, c, &d, delta, o->scale, io);
    return lc_forward(be, c, &d, delta, o->scale, io);
}

int cuda_lin_chunk_bwd(const Backend *be, const MnSeqDims *dm, const MnLinOpts *o, const MnLinBwd *io) {
    CudaCtx *c = cuda_ctx(be);
    LcDims d;
    MN_TRY(lc_dims(&d, dm, o, "cuda lin backward (chunk)"));
    const int delta = o->rule == MN_LIN_DELTA;
    const LinPath path = lin_path(o, &d, delta);
    if (path == LIN_CUBLAS) return lc_backward(be, c, &d, delta, o->scale, io);
#ifndef LF_ONE_BUILD
    if (path == LIN_BF16 && lf_use_bf16(c, &d, delta ? lf_bwd_delta_smem_bf16 : lf_walk_smem_bf16))
        return delta ? lf_backward_delta_bf16(be, c, &d, o->scale, io) : lf_backward_gla_bf16(be, c, &d, o->scale, io);
    if (lf_use_d32(c, &d, delta ? lf_bwd_delta_smem_d32 : lf_walk_smem_d32))
        return delta ? lf_backward_delta_d32(be, c, &d, o->scale, io) : lf_backward_gla_d32(be, c, &d, o->scale, io);
#endif
    if (lf_use(c, &d, delta ? LF_BWD_DELTA_SMEM : LF_WALK_SMEM)) return delta ? lf_backward_delta(be, c, &d, o->scale, io) : lf_backward_gla(be, c, &d, o->scale, io);
    return lc_backward(be, c, &d, delta, o->scale, io);
}
