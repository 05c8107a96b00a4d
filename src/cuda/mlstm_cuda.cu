/*
 * The mLSTM core on the GPU (core/backend.h's MlstmOps; docs/spec/mixers.md section 4,
 * docs/spec/reference/xlstm-notes.md 2.2-2.6). q, k, v, h, dh and their gradients are bf16, the gates,
 * nq, m and the states float32; every sum runs in float32.
 *
 * Forms. The chunkwise one (mlstm_chunk.cuh: chunks of 64, the carried state (C, n, m) in float32,
 * the products on the tensor cores) runs the forward in one launch (two where Dk > 256: ml_walk2), at
 * any head size, and is what AUTO takes from T = 16 on; the recurrent one (mlstm_rec_kernel, a token
 * at a time, float32 throughout) serves decoding (T < 16 with MN_FORM_AUTO: one launch, no scratch
 * but the initial n, m copied, recordable into a graph) and MN_FORM_RECURRENT. MlstmOpts.chunk
 * is a hint: the kernels' chunk is 64 (the forms agree to rounding whatever the chunk). Both forms
 * compute the recurrence's m exactly, so they agree where eps matters too.
 *
 * The backward (one form: the chunkwise algorithm is exact for any T) is the exact gradient, m's path
 * included (core/backend.h), with the forward's h, nq and m: mlstm_prep_kernel (rinv = 1 / den, dnq and
 * dL/dm per token), the three walks of mlstm_chunk.cuh (m held at the forward's; dq;
 * dk and dv in reverse, from the forward's inputs again: no chunk states are kept), and
 * mlstm_gates_kernel (dig = k . dk, dfg = the reverse cumulative sum of q . dq - k . dk, from the walks'
 * float32 per-slice dot products, plus m's path carried back through m_t's max to the winning gate; a
 * block per pair: deterministic, no atomics).
 *
 * Heads: Dk, Dv from 1 to 512. The walks' contraction (Da) is padded with zeros to the kernels' 64,
 * 128 or 256; a Da over 256 runs as two walks over its column slices (ml_walk2, the forward's and the
 * backward's); rows of a multiple of 8 elements (16-byte aligned) are copied by cp.async, others
 * through registers (slower).
 */
#include <math.h>

#include "mlstm_chunk.cuh"

extern "C" {
#include "core/seq_args.h"
}

extern "C" int cuda_mlstm_fwd(const Backend *be, const MnSeqDims *d, const MlstmOpts *o, const MlstmFwd *io);
extern "C" int cuda_mlstm_bwd(const Backend *be, const MnSeqDims *d, const MlstmOpts *o, const MlstmBwd *io);
extern "C" int cuda_mlstm_supports(const Backend *be, const MnSeqDims *d);

#define ML_MAXD 512  // the walks' contraction takes 256 at once; above, two column slices (ml_walk2)
#define ML_WALKD 256

// ------------------------------------------------------------------------------ the walks

#define ML_KERNELS(DA, DCS, MINB)                                                                                \
    static __global__ void __launch_bounds__(ML_THREADS, MINB) ml_fwd_##DA##_##DCS(const MlWalk k) {             \
        ml_walk(k, DA, DCS, 0, 1);                                                                               \
    }                                                                                                            \
    static __global__ void __launch_bounds__(ML_THREADS, MINB) ml_dq_##DA##_##DCS(const MlWalk k) {              \
        ml_walk(k, DA, DCS, 0, 0);                                                                               \
    }                                                                                                            \
    static __global__ void __launch_bounds__(ML_THREADS, MINB) ml_rev_##DA##_##DCS(const MlWalk k) {             \
        ml_walk(k, DA, DCS, 1, 0);                                                                               \
    }
ML_KERNELS(64, 32, 3)
ML_KERNELS(64, 64, 3)
ML_KERNELS(128, 32, 2)
ML_KERNELS(128, 64, 2)
ML_KERNELS(256, 32, 1)

typedef void (*MlKernel)(const MlWalk);

// The padded contraction size of a head of Da: 64, 128 or 256.
static int ml_da(int Da) { return Da <= 64 ? 64 : Da <= 128 ? 128 : 256; }

// Columns of C a block takes: 64 where the pairs x slices fill the GPU at 64 (and DA <= 128), else 32.
static int ml_dcs(const CudaCtx *c, int DA, int pairs, int Dc) {
    if (DA == 256) return 32;
    return (long)pairs * ((Dc + 63) / 64) >= c->sm_count ? 64 : 32;
}

// kind 0: forward, 1: forward-direction walk with the kept m (dq), 2: reverse walk (dk, dv).
static MlKernel ml_kernel(int kind, int DA, int DCS) {
#define ML_PICK(DA_, DCS_) \
    if (DA == DA_ && DCS == DCS_) return kind == 0 ? ml_fwd_##DA_##_##DCS_ : kind == 1 ? ml_dq_##DA_##_##DCS_ : ml_rev_##DA_##_##DCS_;
    ML_PICK(64, 32)
    ML_PICK(64, 64)
    ML_PICK(128, 32)
    ML_PICK(128, 64)
    ML_PICK(256, 32)
#undef ML_PICK
    return NULL;
}

static int ml_vec(int D, const void *p) { return D % 8 == 0 && (uintptr_t)p % 16 == 0; }

// One walk: k's operands, dims and outputs set; grid (slices of Dc, pairs).
static int ml_launch(CudaCtx *c, int kind, MlWalk *k) {
    const int DA = ml_da(k->Da), pairs = k->B * k->H, DCS = ml_dcs(c, DA, pairs, k->Dc);
    MlKernel f = ml_kernel(kind, DA, DCS);
    if (!f) return mn_error(MN_ERR_UNSUPPORTED, "cuda mlstm: no walk kernel for %d x %d", DA, DCS);
    if (!k->lda) k->lda = k->Da;
    k->vec_ab = ml_vec(k->lda, k->a) && ml_vec(k->lda, k->b);
    k->vec_c = ml_vec(k->Dc, k->c);
    const size_t smem = ML_SMEM(DA, DCS);
    if (smem > c->smem_optin)
        return mn_error(MN_ERR_UNSUPPORTED, "cuda mlstm: %zu bytes of shared memory a block, the GPU allows %zu", smem,
                        c->smem_optin);
    CU_TRY(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    dim3 grid((unsigned)((k->Dc + DCS - 1) / DCS), (unsigned)pairs);
    f<<<grid, ML_THREADS, smem, c->stream>>>(*k);
    LAUNCH_CHECK();
    return MN_OK;
}

// The contraction size of the last slice ml_walk2 runs (the one that writes out and dotp).
static int ml_da_last(int Da) { return Da <= ML_WALKD ? Da : Da - ML_WALKD; }

static const float *ml_off(const float *p, int o) { return p ? p + o : NULL; }
static float *ml_off(float *p, int o) { return p ? p + o : NULL; }

// A walk whose contraction Da may exceed 256: out (and the forward's n.q) is linear in the products
// A B^T and in the state over Da, so columns 0..255 of A and B (and of the forward's state) run first
// into float32 partial outputs (no extra term: ex dropped, be or ae then 0; the forward's partial
// s n.q into pnq, nothing else written but its columns of the final state), the rest second with the
// extra term, adding the partials before the forward's den, out's one rounding to bf16 and the dot
// products (dotp) of the sum. part: [B,T,H,Dc], pnq: [B,T,H] (the forward's) float32 scratch.
static int ml_walk2(CudaCtx *c, float *part, float *pnq, int kind, MlWalk *k) {
    if (k->Da <= ML_WALKD) return ml_launch(c, kind, k);
    MlWalk p = *k;
    p.lda = k->Da, p.Da = ML_WALKD, p.ex = NULL, p.dotw = NULL, p.dotp = NULL, p.part = part, p.part_out = 1;
    p.pnq = pnq, p.nq = NULL, p.mo = NULL, p.mT = NULL;
    MN_TRY(ml_launch(c, kind, &p));
    MlWalk r = *k;
    r.lda = k->Da, r.Da = k->Da - ML_WALKD, r.a = k->a + ML_WALKD, r.b = k->b + ML_WALKD, r.part = part, r.part_out = 0;
    r.pnq = pnq, r.c0 = ml_off(k->c0, ML_WALKD), r.n0 = ml_off(k->n0, ML_WALKD);
    r.cT = ml_off(k->cT, ML_WALKD), r.nT = ml_off(k->nT, ML_WALKD);
    return ml_launch(c, kind, &r);
}

// -------------------------------------------------------------------------- the recurrent form

// A block per (pair, 16 rows of Dv): warp w holds rows 4 w .. 4 w + 3 of C, lane l the columns l,
// l + 32, .. (NC of them), and n's columns likewise; m and nq are worked out by every warp.
#define MR_RW 4
#define MR_WARPS 4
#define MR_NC 16

typedef struct {
    const bf16 *q, *k, *v;
    const float *fg, *ig, *c0, *n0, *m0;
    bf16 *h;
    float *nq, *mo, *cT, *nT, *mT;
    int T, H, Dk, Dv;
    float scale, eps;
} MlRec;

static __device__ __forceinline__ void mr_body(const MlRec a, const int NC) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, pair = blockIdx.x;
    const int row0 = (blockIdx.y * MR_WARPS + w) * MR_RW;
    const size_t tok0 = (size_t)(pair / a.H) * a.T * a.H + (size_t)(pair % a.H);
    float C[MR_RW][MR_NC], n[MR_NC];
#pragma unroll
    for (int c = 0; c < NC; c++) {
        const int col = 32 * c + lane;
        n[c] = a.n0 && col < a.Dk ? a.n0[(size_t)pair * a.Dk + col] : 0.0f;
#pragma unroll
        for (int r = 0; r < MR_RW; r++)
            C[r][c] = a.c0 && col < a.Dk && row0 + r < a.Dv ? a.c0[((size_t)pair * a.Dv + row0 + r) * a.Dk + col] : 0.0f;
    }
    float m = a.m0 ? a.m0[pair] : 0.0f;
    for (int t = 0; t < a.T; t++) {
        const size_t ti = tok0 + (size_t)t * a.H;
        float q[MR_NC], kk[MR_NC], v[MR_RW];
#pragma unroll
        for (int c = 0; c < NC; c++) {
            const int col = 32 * c + lane;
            q[c] = col < a.Dk ? ld(a.q, ti * a.Dk + col) : 0.0f;
            kk[c] = col < a.Dk ? ld(a.k, ti * a.Dk + col) : 0.0f;
        }
#pragma unroll
        for (int r = 0; r < MR_RW; r++) v[r] = row0 + r < a.Dv ? ld(a.v, ti * a.Dv + row0 + r) : 0.0f;
        const float f = a.fg[ti], i = a.ig[ti], mt = fmaxf(f + m, i), fa = expf(f + m - mt), ib = expf(i - mt);
        m = mt;
        float p[MR_RW + 1];
        p[MR_RW] = 0.0f;
#pragma unroll
        for (int c = 0; c < NC; c++) {
            n[c] = fmaf(fa, n[c], ib * kk[c]);
            p[MR_RW] = fmaf(n[c], q[c], p[MR_RW]);
        }
#pragma unroll
        for (int r = 0; r < MR_RW; r++) {
            p[r] = 0.0f;
#pragma unroll
            for (int c = 0; c < NC; c++) {
                C[r][c] = fmaf(fa, C[r][c], ib * v[r] * kk[c]);
                p[r] = fmaf(C[r][c], q[c], p[r]);
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
#pragma unroll
            for (int r = 0; r <= MR_RW; r++) p[r] += __shfl_xor_sync(0xffffffffu, p[r], o);
        const float nq = a.scale * p[MR_RW], den = fmaxf(fabsf(nq), expf(-m)) + a.eps;
#pragma unroll
        for (int r = 0; r < MR_RW; r++)
            if (lane == r && row0 + r < a.Dv) st(a.h, ti * a.Dv + row0 + r, a.scale * p[r] / den);
        if (blockIdx.y == 0 && w == 0 && lane == 0) {
            if (a.nq) a.nq[ti] = nq;
            if (a.mo) a.mo[ti] = m;
        }
    }
#pragma unroll
    for (int c = 0; c < NC; c++) {
        const int col = 32 * c + lane;
        if (col >= a.Dk) continue;
#pragma unroll
        for (int r = 0; r < MR_RW; r++)
            if (a.cT && row0 + r < a.Dv) a.cT[((size_t)pair * a.Dv + row0 + r) * a.Dk + col] = C[r][c];
        if (a.nT && blockIdx.y == 0 && w == 0) a.nT[(size_t)pair * a.Dk + col] = n[c];
    }
    if (a.mT && blockIdx.y == 0 && w == 0 && lane == 0) a.mT[pair] = m;
}

#define MR_KERNEL(NC) \
    static __global__ void __launch_bounds__(MR_WARPS * 32) mlstm_rec_kernel_##NC(const MlRec a) { mr_body(a, NC); }
MR_KERNEL(1)
MR_KERNEL(2)
MR_KERNEL(4)
MR_KERNEL(8)
MR_KERNEL(16)

// ------------------------------------------------------------------------------ the backward

// A warp per token: rinv = 1 / den, dnq = -(dh . h) / den sign(nq) [|nq| > exp(-m)], and m's path
// dm = dL/dm_t = -(dh . h) eps / den (h depends on m_t through eps alone).
static __global__ void mlstm_prep_kernel(const bf16 *h, const bf16 *dh, const float *nq, const float *m, float *rinv,
                                         float *dnq, float *dm, size_t ntok, int Dv, float eps) {
    const int lane = threadIdx.x & 31;
    const size_t warps = (size_t)gridDim.x * (blockDim.x >> 5);
    for (size_t t = blockIdx.x * (size_t)(blockDim.x >> 5) + (threadIdx.x >> 5); t < ntok; t += warps) {
        float s = 0.0f;
        for (int i = lane; i < Dv; i += 32) s = fmaf(ld(h, t * Dv + i), ld(dh, t * Dv + i), s);
        s = warp_sum(s);
        if (lane == 0) {
            const float a = nq[t], fl = expf(-m[t]), den = fmaxf(fabsf(a), fl) + eps;
            rinv[t] = 1.0f / den;
            dnq[t] = fabsf(a) > fl ? -s / den * (a > 0 ? 1.0f : -1.0f) : 0.0f;
            dm[t] = -s * eps / den;
        }
    }
}

// A block of ML_GT threads per pair, each a run of ceil(T / ML_GT) consecutive tokens: dig = the
// slices' sum of k . dk; dfg = the reverse cumulative sum of q . dq - k . dk (the runs' totals summed
// from the last run by a block scan, then each run walked backwards). Then m's path: g_t = dm_t + what
// m_{t+1} passed down; where i_t won m_t = max(f_t + m_{t-1}, i_t) (i_t >= f_t + m_{t-1}, m_{-1} = 0,
// the CPU's rule) dig_t += g_t and nothing passes on, else dfg_t += g_t and g_t passes on: per run an
// affine map of what enters it from the right, the maps composed from the last run by thread 0.
// Deterministic: a fixed order.
#define ML_GT 256
static __device__ __forceinline__ int ml_i_won(const float *fg, const float *ig, const float *m, size_t tok0, int t,
                                               int H) {
    const size_t ti = tok0 + (size_t)t * H;
    const double mp = t > 0 ? (double)m[ti - H] : 0.0;
    return (double)ig[ti] >= (double)fg[ti] + mp;
}

static __global__ void __launch_bounds__(ML_GT) mlstm_gates_kernel(const float *pq, const float *pk, int sq, int sk,
                                                                   const float *dm, const float *fg, const float *ig,
                                                                   const float *m, float *dfg, float *dig, int B,
                                                                   int T, int H) {
    __shared__ float wsum[ML_GT / 32], ma[ML_GT], mb[ML_GT], pin[ML_GT];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, R = (T + ML_GT - 1) / ML_GT;
    const size_t pair = blockIdx.x, ntok = (size_t)B * T * H, tok0 = (pair / H) * T * H + pair % H;
    const int t0 = threadIdx.x * R, t1 = min(T, t0 + R);
    float loc = 0.0f, A = 0.0f, Bm = 1.0f;  // m's path through the run: passed out = A + Bm (passed in)
    for (int t = t1 - 1; t >= t0; t--) {
        const size_t ti = tok0 + (size_t)t * H;
        float a = 0.0f, b = 0.0f;
        for (int s = 0; s < sq; s++) a += pq[s * ntok + ti];
        for (int s = 0; s < sk; s++) b += pk[s * ntok + ti];
        dig[ti] = b;
        loc += a - b;
        const int f = !ml_i_won(fg, ig, m, tok0, t, H);
        A = f ? dm[ti] + A : 0.0f;
        Bm = f ? Bm : 0.0f;
    }
    float v = loc;  // the sum of this lane's run and the warp's later ones
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const float u = __shfl_down_sync(0xffffffffu, v, o);
        if (lane + o < 32) v += u;
    }
    if (lane == 0) wsum[warp] = v;
    ma[threadIdx.x] = A;
    mb[threadIdx.x] = Bm;
    __syncthreads();
    if (threadIdx.x == 0) {
        float p = 0.0f;
        for (int j = ML_GT - 1; j >= 0; j--) {
            pin[j] = p;
            p = ma[j] + mb[j] * p;
        }
    }
    float acc = v - loc;
    for (int w2 = warp + 1; w2 < ML_GT / 32; w2++) acc += wsum[w2];
    __syncthreads();
    float p = pin[threadIdx.x];
    for (int t = t1 - 1; t >= t0; t--) {
        const size_t ti = tok0 + (size_t)t * H;
        float a = 0.0f;
        for (int s = 0; s < sq; s++) a += pq[s * ntok + ti];
        const float di = dig[ti], g = dm[ti] + p;
        acc += a - di;
        if (ml_i_won(fg, ig, m, tok0, t, H)) {
            dig[ti] = di + g;
            dfg[ti] = acc;
            p = 0.0f;
        } else {
            dfg[ti] = acc + g;
            p = g;
        }
    }
}

// ------------------------------------------------------------------------------ host side

extern "C" int cuda_mlstm_supports(const Backend *be, const MnSeqDims *d) {
    if (d->Dk > ML_MAXD || d->Dv > ML_MAXD)
        return mn_error(MN_ERR_UNSUPPORTED, "cuda mlstm: head sizes Dk = %d, Dv = %d: the CUDA kernels take at most %d",
                        d->Dk, d->Dv, ML_MAXD);
    if ((size_t)d->B * d->H > 65535u)
        return mn_error(MN_ERR_UNSUPPORTED, "cuda mlstm: B * H = %zu pairs, the kernels take at most 65535",
                        (size_t)d->B * d->H);
    return MN_OK;
}

static int ml_check(const char *fn, const MnSeqDims *d, const MlstmOpts *o, const void *io) {
    MN_TRY(seq_check_dims(d));
    if (!o || !io) return mn_error(MN_ERR_ARG, "%s: opts and io are required", fn);
    if (!isfinite(o->scale) || !(o->eps >= 0) || !isfinite(o->eps))
        return mn_error(MN_ERR_ARG, "%s: scale %g and eps %g must be finite, eps >= 0", fn, (double)o->scale,
                        (double)o->eps);
    if (o->form != MN_FORM_AUTO && o->form != MN_FORM_CHUNK && o->form != MN_FORM_RECURRENT)
        return mn_error(MN_ERR_ARG, "%s: unknown form %d", fn, (int)o->form);
    if (o->chunk < 0) return mn_error(MN_ERR_ARG, "%s: chunk = %d, must be >= 0", fn, o->chunk);
    return cuda_mlstm_supports(NULL, d);
}

extern "C" int cuda_mlstm_fwd(const Backend *be, const MnSeqDims *d, const MlstmOpts *o, const MlstmFwd *io) {
    const char *fn = "cuda mlstm forward";
    MN_TRY(ml_check(fn, d, o, io));
    if (!io->q || !io->k || !io->v || !io->fg || !io->ig || !io->h)
        return mn_error(MN_ERR_ARG, "%s: q, k, v, fg, ig and h are required", fn);
    const int s0 = !!io->c0 + !!io->n0 + !!io->m0, sT = !!io->cT + !!io->nT + !!io->mT;
    if ((s0 && s0 < 3) || (sT && sT < 3)) return mn_error(MN_ERR_ARG, "%s: a state given or asked for in part", fn);
    CudaCtx *c = cuda_ctx(be);
    const size_t pairs = (size_t)d->B * d->H, ntok = pairs * d->T;
    const int rec = o->form == MN_FORM_RECURRENT || (o->form == MN_FORM_AUTO && d->T < 16);
    // scratch: the copies of n0, m0 (s0); ml_walk2's partials (the chunkwise form with Dk > 256)
    const size_t ncp = s0 ? pairs * (d->Dk + 1) : 0, npart = !rec && d->Dk > ML_WALKD ? ntok * (d->Dv + 1) : 0;
    float *ws = NULL;
    if (ncp + npart) {
        ws = (float *)cuda_scratch(be, sizeof(float) * (ncp + npart));
        if (!ws) return MN_ERR_NOMEM;
    }
    float *part = npart ? ws + ncp : NULL, *pnq = npart ? part + ntok * d->Dv : NULL;
    // n0 and m0 are read by every block and written (nT, mT, which may alias them) by one: copied first
    const float *n0 = (const float *)io->n0, *m0 = (const float *)io->m0;
    if (s0) {
        CU_TRY(cudaMemcpyAsync(ws, io->n0, sizeof(float) * pairs * d->Dk, cudaMemcpyDeviceToDevice, c->stream));
        CU_TRY(cudaMemcpyAsync(ws + pairs * d->Dk, io->m0, sizeof(float) * pairs, cudaMemcpyDeviceToDevice, c->stream));
        n0 = ws;
        m0 = ws + pairs * d->Dk;
    }
    if (rec) {
        MlRec a = {(const bf16 *)io->q, (const bf16 *)io->k, (const bf16 *)io->v, (const float *)io->fg,
                   (const float *)io->ig, (const float *)io->c0, n0, m0, (bf16 *)io->h, (float *)io->nq,
                   (float *)io->m, (float *)io->cT, (float *)io->nT, (float *)io->mT, d->T, d->H, d->Dk, d->Dv,
                   o->scale, o->eps};
        dim3 grid((unsigned)pairs, (unsigned)((d->Dv + MR_WARPS * MR_RW - 1) / (MR_WARPS * MR_RW)));
        if (d->Dk <= 32) mlstm_rec_kernel_1<<<grid, MR_WARPS * 32, 0, c->stream>>>(a);
        else if (d->Dk <= 64) mlstm_rec_kernel_2<<<grid, MR_WARPS * 32, 0, c->stream>>>(a);
        else if (d->Dk <= 128) mlstm_rec_kernel_4<<<grid, MR_WARPS * 32, 0, c->stream>>>(a);
        else if (d->Dk <= 256) mlstm_rec_kernel_8<<<grid, MR_WARPS * 32, 0, c->stream>>>(a);
        else mlstm_rec_kernel_16<<<grid, MR_WARPS * 32, 0, c->stream>>>(a);
        LAUNCH_CHECK();
        return MN_OK;
    }
    MlWalk k = {};
    k.a = (const bf16 *)io->q;
    k.b = (const bf16 *)io->k;
    k.c = (const bf16 *)io->v;
    k.fg = (const float *)io->fg;
    k.ig = (const float *)io->ig;
    k.c0 = (const float *)io->c0;
    k.n0 = n0;
    k.m0 = m0;
    k.out = (bf16 *)io->h;
    k.nq = (float *)io->nq;
    k.mo = (float *)io->m;
    k.cT = (float *)io->cT;
    k.nT = (float *)io->nT;
    k.mT = (float *)io->mT;
    k.B = d->B, k.T = d->T, k.H = d->H, k.Da = d->Dk, k.Dc = d->Dv;
    k.scale = o->scale, k.eps = o->eps;
    return ml_walk2(c, part, pnq, 0, &k);
}

extern "C" int cuda_mlstm_bwd(const Backend *be, const MnSeqDims *d, const MlstmOpts *o, const MlstmBwd *io) {
    const char *fn = "cuda mlstm backward";
    MN_TRY(ml_check(fn, d, o, io));
    if (!io->q || !io->k || !io->v || !io->fg || !io->ig || !io->h || !io->nq || !io->m || !io->dh || !io->dq ||
        !io->dk || !io->dv || !io->dfg || !io->dig)
        return mn_error(MN_ERR_ARG, "%s: every input and output is required", fn);
    CudaCtx *c = cuda_ctx(be);
    const size_t ntok = (size_t)d->B * d->T * d->H;
    const int pairs = d->B * d->H;
    const int dcs_k = ml_dcs(c, ml_da(ml_da_last(d->Dv)), pairs, d->Dk), sk = (d->Dk + dcs_k - 1) / dcs_k;
    const size_t np = d->Dk > ML_WALKD || d->Dv > ML_WALKD ? (size_t)(d->Dk > d->Dv ? d->Dk : d->Dv) : 0;
    float *ws = (float *)cuda_scratch(be, sizeof(float) * ntok * (3 + 2 * (size_t)sk + np));
    if (!ws) return MN_ERR_NOMEM;
    float *rinv = ws, *dnq = ws + ntok, *dm = dnq + ntok, *pq = dm + ntok, *pk = pq + (size_t)sk * ntok;
    float *part = pk + (size_t)sk * ntok;  // ml_walk2's partial outputs where a contraction exceeds 256
    const bf16 *h = (const bf16 *)io->h, *dh = (const bf16 *)io->dh;
    const float *nq = (const float *)io->nq, *m = (const float *)io->m;
    mlstm_prep_kernel<<<grid_for(ntok, 8), 256, 0, c->stream>>>(h, dh, nq, m, rinv, dnq, dm, ntok, d->Dv, o->eps);
    LAUNCH_CHECK();
    MlWalk k = {};
    k.fg = (const float *)io->fg;
    k.ig = (const float *)io->ig;
    k.m = (const float *)io->m;
    k.B = d->B, k.T = d->T, k.H = d->H;
    k.scale = o->scale, k.eps = o->eps;
    // dq: A = dh (rinv), B = v, C = k; ae = dnq
    MlWalk q = k;
    q.a = (const bf16 *)io->dh, q.b = (const bf16 *)io->v, q.c = (const bf16 *)io->k;
    q.Da = d->Dv, q.Dc = d->Dk;
    q.rs = rinv, q.rs_side = 1, q.ex = dnq, q.ex_side = 1;
    q.out = (bf16 *)io->dq, q.dotw = (const bf16 *)io->q, q.dotp = pq;
    MN_TRY(ml_walk2(c, part, NULL, 1, &q));
    // dk: A = v, B = dh (rinv), C = q; be = dnq
    MlWalk kw = k;
    kw.a = (const bf16 *)io->v, kw.b = (const bf16 *)io->dh, kw.c = (const bf16 *)io->q;
    kw.Da = d->Dv, kw.Dc = d->Dk;
    kw.rs = rinv, kw.rs_side = 2, kw.ex = dnq, kw.ex_side = 2;
    kw.out = (bf16 *)io->dk, kw.dotw = (const bf16 *)io->k, kw.dotp = pk;
    MN_TRY(ml_walk2(c, part, NULL, 2, &kw));
    // dv: A = k, B = q, C = dh (rinv)
    MlWalk v = k;
    v.a = (const bf16 *)io->k, v.b = (const bf16 *)io->q, v.c = (const bf16 *)io->dh;
    v.Da = d->Dk, v.Dc = d->Dv;
    v.rs = rinv, v.rs_side = 3;
    v.out = (bf16 *)io->dv;
    MN_TRY(ml_walk2(c, part, NULL, 2, &v));
    float *dfg = (float *)io->dfg, *dig = (float *)io->dig;
    const float *fg = (const float *)io->fg, *ig = (const float *)io->ig;
    mlstm_gates_kernel<<<(unsigned)pairs, ML_GT, 0, c->stream>>>(pq, pk, sk, sk, dm, fg, ig, m, dfg, dig, d->B, d->T, d->H);
    LAUNCH_CHECK();
    return MN_OK;
}
