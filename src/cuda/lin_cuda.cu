/*
 * The gated linear-attention family on the GPU (include/mesanet.h: MnLinRule),
 * recurrent form: the state S (Dv x Dk, float32) one token at a time, as
 * src/cpu/lin_recurrent.c and the float64 reference src/ref/lin_ref.c:
 *
 *     GLA:    S_t = gamma_t S_{t-1} + beta_t v_t k_t^T
 *     DELTA:  P = gamma_t S_{t-1};  u_t = beta_t (v_t - P k_t);  S_t = P + u_t k_t^T
 *     o_t = scale S_t q_t
 *
 * Buffers: q, k, v, o, dout, dq, dk, dv bf16 (MEM_ACT); g, beta, s0, sT, dsT,
 * dg, dbeta, ds0 float32 (MEM_F32). Every sum runs in float32. Head sizes up
 * to 256 (larger: MN_ERR_UNSUPPORTED). Form: MN_FORM_RECURRENT runs these
 * kernels; MN_FORM_CHUNK the chunkwise form on the tensor cores
 * (lin_chunk*.cu, chunks of at most 64); MN_FORM_AUTO the chunkwise one
 * from T >= 64 tokens (see use_chunk), these kernels below that and for
 * decoding (T = 1, recordable into a CUDA graph).
 *
 * Every row i of S evolves on its own in both rules ((S k)_i = S_i . k), and
 * so does every row of the adjoint dS; what couples the rows are the sums over
 * them (o is per row, but dq, dk, dbeta and dg sum over all Dv rows). A warp
 * owns RW = 4 rows of one (sequence, head) pair; lane l holds the columns
 * l, l + 32, .. of them (NC = 1, 2, 4 or 8 per row: Dk up to 256) in
 * registers, so row dot products are warp-shuffle sums and column sums over a
 * warp's rows are in-lane. Columns past Dk and rows past Dv are carried as
 * zeros (k = q = 0 there, v = dout = 0), which keeps them zero without
 * branches; nothing is written for them.
 *
 * Forward (lin_fwd_kernel_NC): grid (B*H, ceil(Dv / 16)), 128 threads (4 warps
 * x 4 rows). No shared memory, no workspace: it can be recorded into a CUDA
 * graph (decoding, T = 1, with s0 / sT, sT may alias s0: each thread reads its
 * own elements of s0 before it writes the same ones of sT). The next token's
 * inputs are loaded while the current one is computed.
 *
 * Backward (lin_bwd_kernel_NC): grid (B*H, ceil(Dv / RB)), RB = 4 x NW rows,
 * NW = min(8, ceil(Dv / 4)) warps. Each thread keeps its own state elements at
 * every C-th token (C = ceil(sqrt(T))) in a workspace (cuda_scratch) while it
 * runs the forward again, then walks the stretches in reverse: it recomputes a
 * stretch's states S_{t-1} into the workspace and goes back through them with
 * the adjoint dS in registers. Memory per pair: (T/C + C) Dv Dk floats. The
 * workspace is private to each thread (written and read back by it alone), so
 * it needs no synchronisation. The sums over rows: dq, dk per lane over a
 * warp's rows, then over the block's warps with shared-memory atomics in
 * windows of W = 8 tokens, flushed to dq / dk directly (one slice: the block
 * holds every row) or added into float32 temporaries (several slices) that a
 * last kernel rounds to bf16; dbeta, dg over the block in shared memory, then
 * added into the (zeroed) outputs.
 *
 * The adjoints (those of lin_ref.c). With dS the adjoint of S_t, after the
 * read-out's term dS += scale dout_t q_t^T, and dq_t = scale S_t^T dout_t:
 *
 *     GLA:    du = dS k,  dv = beta du,  dk = beta dS^T v,  dbeta = v . du,  dP = dS
 *     DELTA:  p = S_{t-1} k,  r = v - gamma p,  u = beta r,  du = dS k,
 *             dv = beta du,  dk = dS^T u - beta gamma S_{t-1}^T du,
 *             dbeta = r . du,  dP = dS - beta du k^T
 *     dg_t = gamma <dP, S_{t-1}>  (g = log gamma),  dS_{t-1} = gamma dP
 *
 * (DELTA, from S_t = gamma S_{t-1} + beta (v - gamma S_{t-1} k) k^T: the
 * k-dependence is through u k^T (dS^T u) and through u's S_{t-1} k
 * (-beta gamma S_{t-1}^T du); dL/dgamma = <dS, S_{t-1}> - beta <du, S_{t-1} k>
 * = <dP, S_{t-1}>.) dg is 0 where g is NULL, dbeta 0 where beta is NULL.
 */
#include <math.h>

#include "cuda_common.cuh"

extern "C" {
#include "core/seq_args.h"
}

extern "C" int cuda_lin_fwd(const Backend *be, const MnSeqDims *d, const MnLinOpts *o, const MnLinFwd *io);
extern "C" int cuda_lin_bwd(const Backend *be, const MnSeqDims *d, const MnLinOpts *o, const MnLinBwd *io);

#define RW 4           // rows of S per warp
#define NCMAX 8        // columns per lane, at most: Dk <= 256
#define LIN_MAXD 256   // the largest Dk and Dv taken
#define FWD_WARPS 4    // forward: warps per block (16 rows)
#define BWD_WARPS 8    // backward: warps per block, at most (32 rows)
#define WIN 8          // backward: tokens per flush of the block's sums

typedef struct {
    const bf16 *q, *k, *v;
    const float *g, *beta, *s0;
    bf16 *o;
    float *sT;
    int T, H, Dk, Dv, delta;
    float scale;
} FwdArgs;

typedef struct {
    const bf16 *q, *k, *v, *dout;
    const float *g, *beta, *s0, *dsT;
    bf16 *dq, *dk, *dv;      // written directly when one block holds all rows (nslices == 1)
    float *dqf, *dkf;        // [B,T,H,Dk] float32 sums when nslices > 1 (zeroed), else NULL
    float *dg, *dbeta, *ds0; // dg, dbeta zeroed before (or NULL)
    float *ws;               // per-thread checkpoints and stretch states
    int T, H, Dk, Dv, delta, C, nseg;
    float scale;
} BwdArgs;

// The four sums over the warp at once (independent shuffles interleave).
__device__ __forceinline__ void warp_sum_rw(float p[RW]) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
        for (int r = 0; r < RW; r++) p[r] += __shfl_xor_sync(0xffffffffu, p[r], o);
    }
}

// Token t of pair bh: its row in [B,T,H,*].
__device__ __forceinline__ size_t tok_of(int bh, int t, int T, int H) {
    return ((size_t)(bh / H) * T + t) * H + (size_t)(bh % H);
}

// One token's inputs as this lane needs them: its columns of q and k, its warp's rows of v (and
// of dout in the backward), the gates.
typedef struct {
    float k[NCMAX], q[NCMAX], v[RW], dout[RW], gamma, beta;
} Tok;

__device__ __forceinline__ void load_tok(Tok *x, const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *dout,
                                         const float *g, const float *beta, size_t ti, int lane, int row0, int Dk,
                                         int Dv, const int NC) {
#pragma unroll
    for (int c = 0; c < NC; c++) {
        int col = c * 32 + lane;
        x->k[c] = col < Dk ? ld(k, ti * Dk + col) : 0.0f;
        x->q[c] = col < Dk ? ld(q, ti * Dk + col) : 0.0f;
    }
#pragma unroll
    for (int r = 0; r < RW; r++) {
        int row = row0 + r;
        x->v[r] = row < Dv ? ld(v, ti * Dv + row) : 0.0f;
        x->dout[r] = dout && row < Dv ? ld(dout, ti * Dv + row) : 0.0f;
    }
    x->gamma = g ? expf(g[ti]) : 1.0f;
    x->beta = beta ? beta[ti] : 1.0f;
}

// S = the next state after token x (rows of this warp). p receives S_{t-1} k (DELTA; else 0)
// and u the rank-one update's row factors.
__device__ __forceinline__ void step_rows(float s[RW][NCMAX], const Tok *x, int delta, float p[RW], float u[RW],
                                          const int NC) {
#pragma unroll
    for (int r = 0; r < RW; r++) {
        float a = 0.0f;
        if (delta) {
#pragma unroll
            for (int c = 0; c < NC; c++) a = fmaf(s[r][c], x->k[c], a);
        }
        p[r] = a;
    }
    if (delta) warp_sum_rw(p);
#pragma unroll
    for (int r = 0; r < RW; r++) {
        u[r] = x->beta * (x->v[r] - x->gamma * p[r]);  // GLA: p = 0
#pragma unroll
        for (int c = 0; c < NC; c++) s[r][c] = fmaf(x->gamma, s[r][c], u[r] * x->k[c]);
    }
}

__device__ __forceinline__ void load_rows(float s[RW][NCMAX], const float *src, int bh, int lane, int row0, int Dk,
                                          int Dv, const int NC) {
#pragma unroll
    for (int r = 0; r < RW; r++)
#pragma unroll
        for (int c = 0; c < NC; c++) {
            int row = row0 + r, col = c * 32 + lane;
            s[r][c] = src && row < Dv && col < Dk ? src[((size_t)bh * Dv + row) * Dk + col] : 0.0f;
        }
}

__device__ __forceinline__ void store_rows(float *dst, const float s[RW][NCMAX], int bh, int lane, int row0, int Dk,
                                           int Dv, const int NC) {
#pragma unroll
    for (int r = 0; r < RW; r++)
#pragma unroll
        for (int c = 0; c < NC; c++) {
            int row = row0 + r, col = c * 32 + lane;
            if (row < Dv && col < Dk) dst[((size_t)bh * Dv + row) * Dk + col] = s[r][c];
        }
}

// ------------------------------------------------------------------------------- forward

__device__ __forceinline__ void fwd_body(const FwdArgs a, const int NC) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, bh = blockIdx.x;
    int row0 = (blockIdx.y * FWD_WARPS + warp) * RW;
    float s[RW][NCMAX];
    load_rows(s, a.s0, bh, lane, row0, a.Dk, a.Dv, NC);
    Tok cur;
    load_tok(&cur, a.q, a.k, a.v, NULL, a.g, a.beta, tok_of(bh, 0, a.T, a.H), lane, row0, a.Dk, a.Dv, NC);
    Tok nxt = cur;
    for (int t = 0; t < a.T; t++) {
        size_t ti = tok_of(bh, t, a.T, a.H);
        if (t + 1 < a.T)
            load_tok(&nxt, a.q, a.k, a.v, NULL, a.g, a.beta, tok_of(bh, t + 1, a.T, a.H), lane, row0, a.Dk, a.Dv, NC);
        float p[RW], u[RW];
        step_rows(s, &cur, a.delta, p, u, NC);
#pragma unroll
        for (int r = 0; r < RW; r++) {
            float o = 0.0f;
#pragma unroll
            for (int c = 0; c < NC; c++) o = fmaf(s[r][c], cur.q[c], o);
            p[r] = o;
        }
        warp_sum_rw(p);
#pragma unroll
        for (int r = 0; r < RW; r++)
            if (lane == r && row0 + r < a.Dv) st(a.o, ti * a.Dv + row0 + r, a.scale * p[r]);
        cur = nxt;
    }
    if (a.sT) store_rows(a.sT, s, bh, lane, row0, a.Dk, a.Dv, NC);
}

#define FWD_KERNEL(NC) \
    static __global__ void __launch_bounds__(FWD_WARPS * 32) lin_fwd_kernel_##NC(const FwdArgs a) { fwd_body(a, NC); }
FWD_KERNEL(1)
FWD_KERNEL(2)
FWD_KERNEL(4)
FWD_KERNEL(8)

// ------------------------------------------------------------------------------ backward

// Element e of this thread's copy in workspace slot `slot` (coalesced over the block's threads).
__device__ __forceinline__ size_t ws_at(int slot, int e, const int NC) {
    return ((size_t)slot * (RW * NC) + e) * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ void ws_put(float *w, int slot, const float s[RW][NCMAX], const int NC) {
#pragma unroll
    for (int r = 0; r < RW; r++)
#pragma unroll
        for (int c = 0; c < NC; c++) w[ws_at(slot, r * NC + c, NC)] = s[r][c];
}

__device__ __forceinline__ void ws_get(float s[RW][NCMAX], const float *w, int slot, const int NC) {
#pragma unroll
    for (int r = 0; r < RW; r++)
#pragma unroll
        for (int c = 0; c < NC; c++) s[r][c] = w[ws_at(slot, r * NC + c, NC)];
}

// Floats of workspace per block: (nseg checkpoints + C stretch states) x threads x RW x NC.
__host__ __device__ static inline size_t bwd_ws_per_block(int nseg, int C, int threads, int nc) {
    return ((size_t)nseg + (size_t)C) * (size_t)threads * RW * (size_t)nc;
}

__device__ __forceinline__ void bwd_body(const BwdArgs a, float *sh, const int NC) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, bh = blockIdx.x, nw = blockDim.x >> 5;
    int row0 = (blockIdx.y * nw + warp) * RW, Dk = a.Dk, Dv = a.Dv, T = a.T, H = a.H;
    int one = gridDim.y == 1;  // this block holds every row: dq, dk go out directly
    float *acc_q = sh, *acc_k = acc_q + WIN * Dk, *acc_b = acc_k + WIN * Dk, *acc_g = acc_b + WIN;
    for (int e = threadIdx.x; e < 2 * WIN * Dk + 2 * WIN; e += blockDim.x) sh[e] = 0.0f;
    float *w = a.ws + ((size_t)blockIdx.x * gridDim.y + blockIdx.y) * bwd_ws_per_block(a.nseg, a.C, blockDim.x, NC);
    float s[RW][NCMAX], p[RW], u[RW];
    Tok x, xn;  // (xn: the next token's inputs, loaded while this one is computed)
    // the forward again, keeping the state entering every stretch
    load_rows(s, a.s0, bh, lane, row0, Dk, Dv, NC);
    load_tok(&xn, a.q, a.k, a.v, NULL, a.g, a.beta, tok_of(bh, 0, T, H), lane, row0, Dk, Dv, NC);
    for (int t = 0; t < T; t++) {
        if (t % a.C == 0) ws_put(w, t / a.C, s, NC);
        if (t == T - 1) break;  // (the final state is not needed)
        x = xn;
        if (t + 1 < T - 1)
            load_tok(&xn, a.q, a.k, a.v, NULL, a.g, a.beta, tok_of(bh, t + 1, T, H), lane, row0, Dk, Dv, NC);
        step_rows(s, &x, a.delta, p, u, NC);
    }
    float ds[RW][NCMAX];
    load_rows(ds, a.dsT, bh, lane, row0, Dk, Dv, NC);
    __syncthreads();  // the accumulators are zero
    for (int seg = a.nseg - 1; seg >= 0; seg--) {
        int t0 = seg * a.C, n = min(a.C, T - t0);
        // the stretch's states S_{t0-1} .. S_{t0+n-2} into slots nseg .. nseg + n - 1
        ws_get(s, w, seg, NC);
        load_tok(&xn, a.q, a.k, a.v, NULL, a.g, a.beta, tok_of(bh, t0, T, H), lane, row0, Dk, Dv, NC);
        for (int i = 0; i < n; i++) {
            ws_put(w, a.nseg + i, s, NC);
            if (i == n - 1) break;
            x = xn;
            if (i + 1 < n - 1)
                load_tok(&xn, a.q, a.k, a.v, NULL, a.g, a.beta, tok_of(bh, t0 + i + 1, T, H), lane, row0, Dk, Dv, NC);
            step_rows(s, &x, a.delta, p, u, NC);
        }
        // in reverse: token i's inputs and S_{t-1} (spn) loaded during token i + 1
        float sp[RW][NCMAX], spn[RW][NCMAX];
        load_tok(&xn, a.q, a.k, a.v, a.dout, a.g, a.beta, tok_of(bh, t0 + n - 1, T, H), lane, row0, Dk, Dv, NC);
        ws_get(spn, w, a.nseg + n - 1, NC);
        for (int i = n - 1; i >= 0; i--) {
            size_t ti = tok_of(bh, t0 + i, T, H);
            x = xn;
#pragma unroll
            for (int r = 0; r < RW; r++)
#pragma unroll
                for (int c = 0; c < NC; c++) sp[r][c] = spn[r][c];
            if (i > 0) {
                load_tok(&xn, a.q, a.k, a.v, a.dout, a.g, a.beta, tok_of(bh, t0 + i - 1, T, H), lane, row0, Dk, Dv, NC);
                ws_get(spn, w, a.nseg + i - 1, NC);
            }
#pragma unroll
            for (int r = 0; r < RW; r++)
#pragma unroll
                for (int c = 0; c < NC; c++) s[r][c] = sp[r][c];
            step_rows(s, &x, a.delta, p, u, NC);  // s = S_t; p = S_{t-1} k (DELTA); u = beta r
            float gamma = x.gamma, beta = x.beta;
            // read-out: dq = scale S_t^T dout (this warp's rows), dS += scale dout q^T; du = dS k
            float dqp[NCMAX], dkp[NCMAX], du[RW];
#pragma unroll
            for (int c = 0; c < NC; c++) {
                float aq = 0.0f;
#pragma unroll
                for (int r = 0; r < RW; r++) aq = fmaf(s[r][c], x.dout[r], aq);
                dqp[c] = a.scale * aq;
            }
#pragma unroll
            for (int r = 0; r < RW; r++) {
                float sd = a.scale * x.dout[r], e = 0.0f;
#pragma unroll
                for (int c = 0; c < NC; c++) {
                    ds[r][c] = fmaf(sd, x.q[c], ds[r][c]);
                    e = fmaf(ds[r][c], x.k[c], e);
                }
                du[r] = e;
            }
            warp_sum_rw(du);
            // dk = dS^T u - (DELTA) beta gamma S_{t-1}^T du;  dbeta = r . du  (GLA: r = v)
            float db = 0.0f, bg = a.delta ? beta * gamma : 0.0f;
#pragma unroll
            for (int r = 0; r < RW; r++) db = fmaf(x.v[r] - gamma * p[r], du[r], db);
#pragma unroll
            for (int c = 0; c < NC; c++) {
                float e = 0.0f;
#pragma unroll
                for (int r = 0; r < RW; r++) e = fmaf(ds[r][c], u[r], fmaf(-bg, sp[r][c] * du[r], e));
                dkp[c] = e;
            }
            // dP = dS - beta du k^T (DELTA); dg = gamma <dP, S_{t-1}>; dS_{t-1} = gamma dP
            float gp = 0.0f;
#pragma unroll
            for (int r = 0; r < RW; r++) {
                float bd = a.delta ? beta * du[r] : 0.0f;
#pragma unroll
                for (int c = 0; c < NC; c++) {
                    float dp = fmaf(-bd, x.k[c], ds[r][c]);
                    gp = fmaf(dp, sp[r][c], gp);
                    ds[r][c] = gamma * dp;
                }
            }
            if (a.g) gp = warp_sum(gp);
#pragma unroll
            for (int r = 0; r < RW; r++)
                if (lane == r && row0 + r < Dv) st(a.dv, ti * Dv + row0 + r, beta * du[r]);
            int slot = i % WIN;
#pragma unroll
            for (int c = 0; c < NC; c++) {
                int col = c * 32 + lane;
                if (col < Dk) {
                    atomicAdd(acc_q + slot * Dk + col, dqp[c]);
                    atomicAdd(acc_k + slot * Dk + col, dkp[c]);
                }
            }
            if (lane == 0) {
                if (a.beta) atomicAdd(acc_b + slot, db);
                if (a.g) atomicAdd(acc_g + slot, gamma * gp);
            }
            if (i % WIN == 0) {  // tokens i .. min(i + WIN, n) - 1 are complete in this block: out
                __syncthreads();
                int m = min(WIN, n - i);
                for (int e = threadIdx.x; e < m * Dk; e += blockDim.x) {
                    int j = e / Dk, col = e - j * Dk;  // slot j holds token i + j (i % WIN == 0)
                    size_t o = tok_of(bh, t0 + i + j, T, H) * Dk + col;
                    if (one) {
                        st(a.dq, o, acc_q[e]);
                        st(a.dk, o, acc_k[e]);
                    } else {
                        atomicAdd(a.dqf + o, acc_q[e]);
                        atomicAdd(a.dkf + o, acc_k[e]);
                    }
                    acc_q[e] = 0.0f;
                    acc_k[e] = 0.0f;
                }
                for (int j = threadIdx.x; j < m; j += blockDim.x) {
                    size_t tj = tok_of(bh, t0 + i + j, T, H);
                    if (a.beta) atomicAdd(a.dbeta + tj, acc_b[j]);
                    if (a.g) atomicAdd(a.dg + tj, acc_g[j]);
                    acc_b[j] = 0.0f;
                    acc_g[j] = 0.0f;
                }
                __syncthreads();
            }
        }
    }
    if (a.ds0) store_rows(a.ds0, ds, bh, lane, row0, Dk, Dv, NC);
}

#define BWD_KERNEL(NC)                                                                         \
    static __global__ void __launch_bounds__(BWD_WARPS * 32) lin_bwd_kernel_##NC(const BwdArgs a) { \
        extern __shared__ float sh_##NC[];                                                     \
        bwd_body(a, sh_##NC, NC);                                                              \
    }
BWD_KERNEL(1)
BWD_KERNEL(2)
BWD_KERNEL(4)
BWD_KERNEL(8)

static __global__ void to_bf16_kernel(bf16 *y, const float *x, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        st(y, i, x[i]);
}

// ------------------------------------------------------------------------------ host side

extern "C" int cuda_lin_chunk_fwd(const Backend *be, const MnSeqDims *d, const MnLinOpts *o, const MnLinFwd *io);
extern "C" int cuda_lin_chunk_bwd(const Backend *be, const MnSeqDims *d, const MnLinOpts *o, const MnLinBwd *io);

// AUTO: the chunkwise form from one whole chunk on. Its cost is about fixed, ~15-40 launches plus
// 2-5 per chunk, whatever the chunk's fill; the recurrent form's is T dependent steps, each a few
// microseconds of latency whatever the batch. At T = 64 both cost about the same; past it the chunks win
// (on the tensor cores, T / 64 sequential steps instead of T); below it the recurrent kernels are as
// fast and exact in float32 (no TF32 products), and they alone serve decoding (T = 1, graphs).
static int use_chunk(const MnSeqDims *d, const MnLinOpts *o) {
    if (o->form == MN_FORM_CHUNK) return 1;
    return o->form == MN_FORM_AUTO && d->T >= 64 && o->chunk <= 64;
}

// Columns per lane for a head of Dk: 1, 2, 4 or 8.
static int cols_per_lane(int Dk) { return Dk <= 32 ? 1 : Dk <= 64 ? 2 : Dk <= 128 ? 4 : 8; }

extern "C" int cuda_lin_supports(const Backend *be, const MnSeqDims *d);

static int check_common(const char *fn, const MnSeqDims *d, const MnLinOpts *o, const void *io) {
    MN_TRY(lin_check_args(fn, d, o, io));
    return cuda_lin_supports(NULL, d);
}

// The shapes the kernels take (LinOps.supports): heads up to LIN_MAXD.
extern "C" int cuda_lin_supports(const Backend *be, const MnSeqDims *d) {
    if (d->Dk > LIN_MAXD || d->Dv > LIN_MAXD)
        return mn_error(MN_ERR_UNSUPPORTED, "cuda lin: head sizes Dk = %d, Dv = %d: the CUDA kernels take at most %d",
                        d->Dk, d->Dv, LIN_MAXD);
    if ((size_t)d->B * d->H > 0x7fffffffu) return mn_error(MN_ERR_UNSUPPORTED, "cuda lin: B * H too large");
    return MN_OK;
}

extern "C" int cuda_lin_fwd(const Backend *be, const MnSeqDims *d, const MnLinOpts *o, const MnLinFwd *io) {
    const char *fn = "cuda lin forward";
    MN_TRY(check_common(fn, d, o, io));
    if (!io->q || !io->k || !io->v || !io->o) return mn_error(MN_ERR_ARG, "%s: q, k, v and o are required", fn);
    if (use_chunk(d, o)) return cuda_lin_chunk_fwd(be, d, o, io);
    CudaCtx *c = cuda_ctx(be);
    FwdArgs a = {(const bf16 *)io->q, (const bf16 *)io->k, (const bf16 *)io->v, io->g, io->beta, io->s0,
                 (bf16 *)io->o, io->sT, d->T, d->H, d->Dk, d->Dv, o->rule == MN_LIN_DELTA, o->scale};
    dim3 grid((unsigned)(d->B * d->H), (unsigned)((d->Dv + FWD_WARPS * RW - 1) / (FWD_WARPS * RW)));
    switch (cols_per_lane(d->Dk)) {
    case 1: lin_fwd_kernel_1<<<grid, FWD_WARPS * 32, 0, c->stream>>>(a); break;
    case 2: lin_fwd_kernel_2<<<grid, FWD_WARPS * 32, 0, c->stream>>>(a); break;
    case 4: lin_fwd_kernel_4<<<grid, FWD_WARPS * 32, 0, c->stream>>>(a); break;
    default: lin_fwd_kernel_8<<<grid, FWD_WARPS * 32, 0, c->stream>>>(a); break;
    }
    LAUNCH_CHECK();
    return MN_OK;
}

// The stretch length of the backward's checkpoints: ceil(sqrt(T)), which makes T/C + C least.
static int stretch_for(int T) {
    int C = 1;
    while ((long)C * C < T) C++;
    return C;
}

extern "C" int cuda_lin_bwd(const Backend *be, const MnSeqDims *d, const MnLinOpts *o, const MnLinBwd *io) {
    const char *fn = "cuda lin backward";
    MN_TRY(check_common(fn, d, o, io));
    if (!io->q || !io->k || !io->v) return mn_error(MN_ERR_ARG, "%s: q, k and v are required", fn);
    if (!io->dout || !io->dq || !io->dk || !io->dv) return mn_error(MN_ERR_ARG, "%s: dout, dq, dk and dv are required", fn);
    if (io->g && !io->dg) return mn_error(MN_ERR_ARG, "%s: dg is NULL while g is given", fn);
    if (io->beta && !io->dbeta) return mn_error(MN_ERR_ARG, "%s: dbeta is NULL while beta is given", fn);
    if (use_chunk(d, o)) return cuda_lin_chunk_bwd(be, d, o, io);
    CudaCtx *c = cuda_ctx(be);
    int nc = cols_per_lane(d->Dk), nw = mn_min(BWD_WARPS, (d->Dv + RW - 1) / RW), threads = nw * 32;
    int nslices = (d->Dv + nw * RW - 1) / (nw * RW), C = stretch_for(d->T), nseg = (d->T + C - 1) / C;
    size_t pairs = (size_t)d->B * d->H, ntok = pairs * d->T, nq = ntok * d->Dk;
    size_t per = bwd_ws_per_block(nseg, C, threads, nc), nws = per * pairs * nslices;
    size_t ntmp = nslices > 1 ? 2 * nq : 0;
    float *ws = (float *)cuda_scratch(be, sizeof(float) * (nws + ntmp));
    if (!ws) return MN_ERR_NOMEM;
    float *dqf = ntmp ? ws + nws : NULL, *dkf = ntmp ? dqf + nq : NULL;
    if (ntmp) CU_TRY(cudaMemsetAsync(dqf, 0, sizeof(float) * ntmp, c->stream));
    if (io->dg) CU_TRY(cudaMemsetAsync(io->dg, 0, sizeof(float) * ntok, c->stream));
    if (io->dbeta) CU_TRY(cudaMemsetAsync(io->dbeta, 0, sizeof(float) * ntok, c->stream));
    BwdArgs a = {(const bf16 *)io->q, (const bf16 *)io->k, (const bf16 *)io->v, (const bf16 *)io->dout,
                 io->g, io->beta, io->s0, io->dsT,
                 (bf16 *)io->dq, (bf16 *)io->dk, (bf16 *)io->dv, dqf, dkf,
                 io->g ? io->dg : NULL, io->beta ? io->dbeta : NULL, io->ds0, ws,
                 d->T, d->H, d->Dk, d->Dv, o->rule == MN_LIN_DELTA, C, nseg, o->scale};
    dim3 grid((unsigned)pairs, (unsigned)nslices);
    size_t smem = sizeof(float) * (2 * WIN * (size_t)d->Dk + 2 * WIN);  // at most 16.4 KB: no opt-in
    switch (nc) {
    case 1: lin_bwd_kernel_1<<<grid, threads, smem, c->stream>>>(a); break;
    case 2: lin_bwd_kernel_2<<<grid, threads, smem, c->stream>>>(a); break;
    case 4: lin_bwd_kernel_4<<<grid, threads, smem, c->stream>>>(a); break;
    default: lin_bwd_kernel_8<<<grid, threads, smem, c->stream>>>(a); break;
    }
    LAUNCH_CHECK();
    if (ntmp) {
        to_bf16_kernel<<<grid_for(nq, 256), 256, 0, c->stream>>>((bf16 *)io->dq, dqf, nq);
        LAUNCH_CHECK();
        to_bf16_kernel<<<grid_for(nq, 256), 256, 0, c->stream>>>((bf16 *)io->dk, dkf, nq);
        LAUNCH_CHECK();
    }
    return MN_OK;
}
