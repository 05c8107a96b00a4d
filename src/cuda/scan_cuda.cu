/*
 * The diagonal recurrences on the GPU (core/backend.h's ScanOps: Griffin's RG-LRU, N = 1, and Longhorn's
 * update, N = d_state <= 16). x, r, i, k, q, y, dy and the token gradients are bf16; w, skip, the states
 * and every sum are float32.
 *
 * Layout of the work. The sequence is cut into chunks (RG-LRU: 32 tokens forward, 16 backward; Longhorn:
 * SC_LH_SPC = 4 stages of SC_L = 32 tokens, 128), and a block takes a group of channels of one chunk of
 * one sequence, a thread one or two channels with their N state values in registers: about a million
 * threads at 8 x 2048 x 2048 instead of the B C that would walk whole sequences, enough loads in flight
 * for the memory. Three launches: the chunks' summaries (the walk from the zero state: the chunk's
 * transition A = the product of its a, per slot, and its final state), a short sequential pass per
 * (sequence, slot, channel) combining them in chunk order into each chunk's incoming state
 * (sc_combine_kernel: T / chunk steps, fixed order, so deterministic), then the walk of each chunk from
 * its incoming state, writing y. The inputs are read twice: the price of the parallelism. The RG-LRU
 * reads its rows straight into registers (its section below says why); Longhorn stages a block's
 * inputs in shared memory by cp.async (16-byte pieces; element copies where C or a pointer is not
 * aligned), its chunk walking its stages through a ring SC_ST deep, and converts its k and q (shared by
 * every channel of a sequence) once a stage into float32 k, k^2 and q with kappa = |k|^2, which every
 * thread reads by broadcast.
 *
 * The backward recomputes the forward's states (core/backend.h: they are not stored). The summary pass
 * also sums the adjoint each chunk hands back from zero (cl = sum_t a_t0 .. a_t dy_t (q_t)), and the
 * combine carries those from the last chunk back, so that every chunk's backward starts from its incoming
 * state and its incoming adjoint and the chunks run in parallel. RG-LRU recomputes the chunk's 16 states
 * h_{t-1} into registers and walks back through them; Longhorn first stores every stage's starting state
 * (the forward walk with ckpt set), then keeps 8 states of a stage (every SC_SB = 4 tokens) in shared
 * memory and recomputes 4 tokens at a time into registers. The adjoint dS is carried in registers.
 * Longhorn's dk and dq are sums over channels: a warp reduces its 32 channels' 32 values a token by a
 * transposed butterfly (lane l ends with value l), the block's warps are added in shared memory, and
 * lh_dkq_kernel adds the blocks' partials in a fixed order (with the kappa path, 2 k dkappa):
 * deterministic, no atomics. dw and dskip likewise: a partial per (sequence, chunk), added in a fixed
 * order by sc_param_kernel.
 *
 * A sequence of one chunk (decoding: T = 1 with s0 and sT) is walked from s0 in one launch, no scratch,
 * recordable into a graph; sT may alias s0 (a thread reads its channel's state before it writes it; so
 * does the combine's).
 */
#include <math.h>
#include <string.h>

#include "cuda_common.cuh"
#include "mma.cuh"

extern "C" int cuda_scan_fwd(const Backend *be, const ScanDims *d, const ScanFwd *io);
extern "C" int cuda_scan_bwd(const Backend *be, const ScanDims *d, const ScanBwd *io);
extern "C" int cuda_scan_supports(const Backend *be, const ScanDims *d);

#define SC_CT 64   // Longhorn: channels a block, a thread each
#define SC_L 32    // tokens a stage (and between the backward's checkpoints)
#define SC_ST 3    // stages in the ring: two in flight while one is computed
#define SC_N 16    // Longhorn's state slots in the kernels (N below is padded with zero k, q)
#define SC_SB 4    // Longhorn backward: tokens recomputed into registers at a time
#define SC_NW (SC_CT / 32)
#define SC_RED 33  // Longhorn backward: a token's partial sums over a block's channels (dk, dq, dkappa)
#define SC_LH_SPC 4  // Longhorn: stages a chunk
#define SC_CB 16   // summaries the combine loads at a time
#define SC_MAXGRAD2 1e-6f  // transformers' SqrtBoundDerivative: 4u clipped at 1 / 1000^2

typedef struct {
    const bf16 *x, *r, *i, *dy;  // [B,T,C]
    const bf16 *k, *q;           // [B,T,N]
    const float *w, *skip;       // [C]
    const float *s0;             // [B,C,N] or NULL
    bf16 *y;                     // [B,T,C] or NULL (the checkpoint pass)
    float *sT;                   // [B,C,N] or NULL
    float *ckpt;                 // [B][nst][SC_N][Cp]: Longhorn's state at each stage's start, or NULL
    float *sa, *sh, *sc;         // [B][nch][nsl][Cp]: each chunk's summary (see sc_combine_kernel), or NULL
    bf16 *dx, *dr, *di;          // [B,T,C]
    float *part;                 // [B][2][C]: dw, dskip partials of each sequence
    float *red;                  // [B][T][tiles][SC_RED]: Longhorn's dk, dq, dkappa partials
    int B, T, C, N, Cp, nst, tiles;
    int spc, nch, nsl;  // stages a chunk, chunks, state slots in the summaries (1 or SC_N)
    int am1;            // sa holds A - 1 (RG-LRU: kept exact for slow channels), else A
    int reset;
    int wseq;        // sequences sharing w and skip (ScanDims.w_seqs; 0: all), a group's wstride after the last's
    size_t wstride;
    int vec;     // channel rows by 16-byte cp.async (C % 8 == 0 and aligned pointers)
    int kqvec;   // k, q rows by cp.async (N == 16, aligned)
} ScanK;

// Where sequence b's w and skip begin (its group's: ScanDims.w_seqs).
static __device__ __forceinline__ size_t sc_w(const ScanK *k, int b) {
    return k->wseq > 0 ? (size_t)(b / k->wseq) * k->wstride : 0;
}

// Shared memory of a Longhorn stage: the channel inputs [nin][SC_L][SC_CT] bf16, then k, q
// [2][SC_L][SC_N] bf16, then the checkpoint [ns][SC_CT] float (the backward).
static __host__ __device__ int sc_stage_bytes(int nin, int ns) {
    return nin * SC_L * SC_CT * 2 + 2 * SC_L * SC_N * 2 + ns * SC_CT * 4;
}

// Copies Longhorn's stage s (tokens s SC_L ..) into stage buffer `buf`: the nin channel arrays a0 ..,
// k and q, the checkpoint where ns. Channels past C and slots past N are zero; tokens past T are not
// copied.
static __device__ void sc_issue(const ScanK *k, unsigned char *buf, const bf16 *a0, const bf16 *a1, const bf16 *a2,
                                int nin, int ns, int s) {
    const int b = blockIdx.z, c0 = blockIdx.x * SC_CT, t0 = s * SC_L;
    const int n = k->T - t0 < SC_L ? k->T - t0 : SC_L;
    const int tid = threadIdx.x;
    // channel rows: SC_CT / 8 pieces a token
#pragma unroll
    for (int a = 0; a < 3; a++) {
        if (a >= nin) break;
        const bf16 *src = a == 0 ? a0 : a == 1 ? a1 : a2;
        for (int p = tid; p < n * (SC_CT / 8); p += SC_CT) {
            const int tt = p / (SC_CT / 8), g = p % (SC_CT / 8);
            bf16 *dst = (bf16 *)buf + ((size_t)a * SC_L + tt) * SC_CT + 8 * g;
            const size_t row = ((size_t)b * k->T + t0 + tt) * k->C;
            const int c = c0 + 8 * g;
            if (k->vec && c + 8 <= k->C) {
                cp_async16(dst, src + row + c, 16);
            } else {
                for (int e = 0; e < 8; e++) {
                    if (c + e < k->C) dst[e] = src[row + c + e];
                    else st(dst, e, 0.0f);
                }
            }
        }
    }
    unsigned char *after = buf + nin * SC_L * SC_CT * 2;
    bf16 *kb = (bf16 *)after;
    for (int p = tid; p < 2 * n * 2; p += SC_CT) {  // (k or q, token, half of the 16 slots)
        const int which = p / (2 * n), tt = p / 2 % n, h = p % 2;
        const bf16 *src = (which ? k->q : k->k) + ((size_t)b * k->T + t0 + tt) * k->N;
        bf16 *dst = kb + ((size_t)which * SC_L + tt) * SC_N + 8 * h;
        if (k->kqvec) {
            cp_async16(dst, src + 8 * h, 16);
        } else {
            for (int e = 0; e < 8; e++) {
                if (8 * h + e < k->N) dst[e] = src[8 * h + e];
                else st(dst, e, 0.0f);
            }
        }
    }
    after += 2 * SC_L * SC_N * 2;
    if (ns) {  // the checkpoint: ns rows of SC_CT floats, always aligned (our scratch, Cp a multiple of SC_CT)
        const float *src = k->ckpt + ((size_t)b * k->nst + s) * ns * k->Cp + c0;
        for (int p = tid; p < ns * (SC_CT / 4); p += SC_CT) {
            const int j = p / (SC_CT / 4), g = p % (SC_CT / 4);
            cp_async16(after + ((size_t)j * SC_CT + 4 * g) * 4, src + (size_t)j * k->Cp + 4 * g, 16);
        }
    }
}

// ------------------------------------------------------------------------------ RG-LRU
//
// The RG-LRU's walks read their inputs straight from global memory into registers, 4 tokens at a time
// (RG_G: 12 or 16 independent loads in flight a thread before the walk needs the first), a thread taking
// RG_V = 2 adjacent channels where C is even and the arrays 4-byte aligned (one 32-bit load a token and
// array: a warp's row is one 128-byte line), else one. No shared memory and no barriers: the
// multiprocessor's warps overlap one another's loads and walks. The gate arithmetic uses the special
// function unit (__expf, __fdividef, rsqrtf: a few ulp) instead of IEEE division and square root, whose
// instruction sequences cost more than the walk's bytes. The backward's chunks are RG_LB = 16 tokens, so
// that the recomputed states h_{t-1} fit in registers (32 a thread), and its walk back reads the chunk's
// inputs again (from L1 or L2: they were read a moment before).
#define RG_T 128   // threads a block
#define RG_MINB 8  // blocks a multiprocessor: 64 registers a thread, half the threads it can hold
#define RG_G 4     // tokens loaded at a time
#define RG_LF 32   // tokens a chunk, forward
#define RG_LB 16   // tokens a chunk, backward

// The gates of one token: a - 1 (exact where a is within float32's rounding of 1, so that a slow
// channel keeps its memory: a = 1 - 1e-8 would round to 1) and the input's multiplier m = sqrt(1 - a^2)
// = sqrt(-(a - 1)(a + 1)); at a reset a = 0 and m = 1.
// e^x - 1 for x <= 0: a cubic where |x| < 1/64 (truncation x^4 / 24: 2.4e-9 relative there), __expf
// less 1 elsewhere (absolute error about 1e-7, float32's own at a < 1 - 1/64); both computed and one
// chosen (no branch in the walk); expm1f's general path costs three times the instructions.
static __device__ __forceinline__ float expm1_neg(float x) {
    const float cubic = x * fmaf(x, fmaf(x, 1.0f / 6.0f, 0.5f), 1.0f), e = __expf(x) - 1.0f;
    return x > -0.015625f ? cubic : e;
}
static __device__ __forceinline__ float sigm_fast(float x) { return __fdividef(1.0f, 1.0f + __expf(-x)); }
static __device__ __forceinline__ float sqrt_fast(float u) { return u > 0.0f ? u * rsqrtf(u) : 0.0f; }
static __device__ __forceinline__ float softplusf_(float w) { return w > 20.0f ? w : log1pf(__expf(w)); }

static __device__ __forceinline__ void rg_gates(float rt, float coef, int first, float *am1, float *m) {
    const float e = expm1_neg(coef * sigm_fast(rt));
    *am1 = first ? -1.0f : e;
    *m = first ? 1.0f : sqrt_fast(-e * (2.0f + e));
}

// V channels of one token from a bf16 row (V = 2: one aligned 32-bit load).
template <int V>
static __device__ __forceinline__ void rg_ld(const bf16 *p, float v[V]) {
    if (V == 2) {
        const unsigned w = __ldg((const unsigned *)p);
        v[0] = __uint_as_float(w << 16);
        v[V - 1] = __uint_as_float(w & 0xffff0000u);
    } else {
        v[0] = ld(p, 0);
    }
}
template <int V>
static __device__ __forceinline__ void rg_st(bf16 *p, const float v[V]) {
    if (V == 2) *(__nv_bfloat162 *)p = __floats2bfloat162_rn(v[0], v[V - 1]);
    else st(p, 0, v[0]);
}

// The rows of tokens [g0, g0 + RG_G) (those before n) of x, r, i and, where with_dy, dy, from row0
// (rows C apart).
template <int V>
static __device__ __forceinline__ void rg_ld_group(const ScanK *k, size_t row0, size_t C, int g0, int n, bool with_dy,
                                                   float xv[RG_G][V], float rv[RG_G][V], float iv[RG_G][V],
                                                   float dv[RG_G][V]) {
#pragma unroll
    for (int u = 0; u < RG_G; u++) {
        if (g0 + u < n) {
            const size_t o = row0 + (size_t)(g0 + u) * C;
            rg_ld<V>(k->x + o, xv[u]);
            rg_ld<V>(k->r + o, rv[u]);
            rg_ld<V>(k->i + o, iv[u]);
            if (with_dy) rg_ld<V>(k->dy + o, dv[u]);
        }
    }
}

// A thread's place: sequence b, chunk s of L tokens [t0, t0 + n), channels [c, c + V); 0 where off C.
template <int V>
static __device__ __forceinline__ int rg_place(const ScanK *k, int L, int *b, int *s, int *c, int *t0, int *n) {
    *b = blockIdx.z, *s = blockIdx.y, *c = (blockIdx.x * RG_T + threadIdx.x) * V;
    *t0 = *s * L;
    *n = k->T - *t0 < L ? k->T - *t0 : L;
    return *c < k->C;
}

// The walk of a chunk forward from h (y written where MODE == RG_Y); MODE == RG_SUM: from zero, giving
// the chunk's A - 1 and final state (and with dy, the adjoint it hands back from zero, cl = sum_t a_t0 ..
// a_t dy_t: then h_end = A h_in + hl, a_t0 dh_t0 = A c_in + cl); MODE == RG_KEEP: h_{t-1} of each token
// into hp (the backward's recomputation).
enum { RG_SUM, RG_Y, RG_KEEP };
template <int V, int MODE, int L>
static __device__ __forceinline__ void rg_walk(const ScanK *k, int b, int c, int t0, int n, const float coef[V],
                                               float h[V], float Am1[V], float cl[V], float hp[L][V]) {
    const size_t C = (size_t)k->C, row0 = ((size_t)b * k->T + t0) * C + c;
    const bool with_dy = MODE == RG_SUM && k->dy;
#pragma unroll
    for (int g0 = 0; g0 < L; g0 += RG_G) {
        if (g0 >= n) break;
        float xv[RG_G][V], rv[RG_G][V], iv[RG_G][V], dv[RG_G][V];
        rg_ld_group<V>(k, row0, C, g0, n, with_dy, xv, rv, iv, dv);
#pragma unroll
        for (int u = 0; u < RG_G; u++) {
            const int tt = g0 + u;
            if (tt < n) {
                const int first = k->reset && t0 + tt == 0;
                float yv[V];
#pragma unroll
                for (int j = 0; j < V; j++) {
                    if (MODE == RG_KEEP) hp[tt][j] = h[j];
                    float am1, m;
                    rg_gates(rv[u][j], coef[j], first, &am1, &m);
                    const float bt = m * sigm_fast(iv[u][j]) * xv[u][j];
                    h[j] = first ? bt : fmaf(am1, h[j], h[j] + bt);  // a h + b
                    yv[j] = h[j];
                    if (MODE == RG_SUM) {
                        Am1[j] = first ? -1.0f : fmaf(Am1[j], am1, Am1[j] + am1);  // (1 + A')(1 + a') - 1
                        if (with_dy) cl[j] = fmaf(1.0f + Am1[j], dv[u][j], cl[j]);
                    }
                }
                if (MODE == RG_Y) rg_st<V>(k->y + row0 + (size_t)tt * C, yv);
            }
        }
    }
}

// The chunks' summaries (see rg_walk), chunks of L tokens.
template <int V, int L>
static __global__ void __launch_bounds__(RG_T, RG_MINB) rg_sum_kernel(const ScanK k) {
    grid_wait();
    int b, s, c, t0, n;
    if (!rg_place<V>(&k, L, &b, &s, &c, &t0, &n)) return;
    float coef[V], h[V], Am1[V], cl[V];
#pragma unroll
    for (int j = 0; j < V; j++) coef[j] = -8.0f * softplusf_(k.w[sc_w(&k, b) + c + j]), h[j] = Am1[j] = cl[j] = 0.0f;
    rg_walk<V, RG_SUM, L>(&k, b, c, t0, n, coef, h, Am1, cl, NULL);
    const size_t e = ((size_t)b * k.nch + s) * k.Cp + c;
#pragma unroll
    for (int j = 0; j < V; j++) {
        k.sa[e + j] = Am1[j];
        k.sh[e + j] = h[j];
        if (k.dy) k.sc[e + j] = cl[j];
    }
}

// Forward (y): the chunk from its incoming state (sh, from sc_combine_kernel; s0 or zero where the
// sequence is one chunk, then sT written here).
template <int V>
static __global__ void __launch_bounds__(RG_T, RG_MINB) rg_fwd_kernel(const ScanK k) {
    grid_wait();
    int b, s, c, t0, n;
    if (!rg_place<V>(&k, RG_LF, &b, &s, &c, &t0, &n)) return;
    float coef[V], h[V];
#pragma unroll
    for (int j = 0; j < V; j++) {
        coef[j] = -8.0f * softplusf_(k.w[sc_w(&k, b) + c + j]);
        h[j] = k.sh ? k.sh[((size_t)b * k.nch + s) * k.Cp + c + j] : k.s0 ? k.s0[(size_t)b * k.C + c + j] : 0.0f;
    }
    rg_walk<V, RG_Y, RG_LF>(&k, b, c, t0, n, coef, h, NULL, NULL, NULL);
    if (k.sT)
#pragma unroll
        for (int j = 0; j < V; j++) k.sT[(size_t)b * k.C + c + j] = h[j];
}

// Backward: the chunk's states h_{t-1} recomputed from its incoming state into registers, then walked
// back with the adjoint carried in from the chunks after it (sc; zero where NULL), the inputs read again.
template <int V>
static __global__ void __launch_bounds__(RG_T, RG_MINB) rg_bwd_kernel(const ScanK k) {
    grid_wait();
    int b, s, c, t0, n;
    if (!rg_place<V>(&k, RG_LB, &b, &s, &c, &t0, &n)) return;
    const size_t e0 = ((size_t)b * k.nch + s) * k.Cp + c, C = (size_t)k.C, row0 = ((size_t)b * k.T + t0) * C + c;
    float coef[V], sw[V], h[V], dhc[V], dw[V], hp[RG_LB][V];
#pragma unroll
    for (int j = 0; j < V; j++) {
        const float wc = k.w[sc_w(&k, b) + c + j];
        coef[j] = -8.0f * softplusf_(wc), sw[j] = sigm_fast(wc);
        h[j] = k.sh ? k.sh[e0 + j] : 0.0f;
        dhc[j] = k.sc ? k.sc[e0 + j] : 0.0f;  // a_{t+1} dh_{t+1}
        dw[j] = 0.0f;                          // the chunk's part of dw
    }
    rg_walk<V, RG_KEEP, RG_LB>(&k, b, c, t0, n, coef, h, NULL, NULL, hp);
#pragma unroll
    for (int g0 = RG_LB - RG_G; g0 >= 0; g0 -= RG_G) {
        if (g0 >= n) continue;
        float xv[RG_G][V], rv[RG_G][V], iv[RG_G][V], dv[RG_G][V];
        rg_ld_group<V>(&k, row0, C, g0, n, true, xv, rv, iv, dv);
#pragma unroll
        for (int u = RG_G - 1; u >= 0; u--) {
            const int tt = g0 + u;
            if (tt < n) {
                const int first = k.reset && t0 + tt == 0;
                float dxv[V], drv[V], div[V];
#pragma unroll
                for (int j = 0; j < V; j++) {
                    const float x = xv[u][j], ig = sigm_fast(iv[u][j]), dh = dv[u][j] + dhc[j];
                    const float rg = sigm_fast(rv[u][j]), e = expm1_neg(coef[j] * rg);
                    const float am1 = first ? -1.0f : e, a = 1.0f + e, uu = fmaxf(-e * (2.0f + e), 0.0f);
                    const float m = first ? 1.0f : sqrt_fast(uu);
                    const float du = dh * ig * x * rsqrtf(fmaxf(4.0f * uu, SC_MAXGRAD2));
                    const float dla = a * (dh * hp[tt][j] - 2.0f * a * du);  // d/dla of a h_{t-1} + sqrt(1 - a^2) i x
                    drv[j] = first ? 0.0f : dla * coef[j] * rg * (1.0f - rg);
                    if (!first) dw[j] = fmaf(dla * -8.0f * rg, sw[j], dw[j]);
                    dxv[j] = dh * m * ig;
                    div[j] = dh * m * x * ig * (1.0f - ig);
                    dhc[j] = fmaf(am1, dh, dh);  // a dh
                }
                const size_t o = row0 + (size_t)tt * C;
                rg_st<V>(k.dx + o, dxv);
                rg_st<V>(k.di + o, div);
                rg_st<V>(k.dr + o, drv);
            }
        }
    }
#pragma unroll
    for (int j = 0; j < V; j++) k.part[((size_t)b * k.nch + s) * 2 * k.C + c + j] = dw[j];
}

// The chunks' incoming states from their summaries, in chunk order from s0 (or zero), sT the last
// chunk's end; where sc is given, likewise the adjoints carried into each chunk from its end, in
// reverse order from zero. In place: sh[j] becomes chunk j's incoming state, sc[j] its incoming
// adjoint. A thread a (sequence, slot, channel): T / chunk steps, in a fixed order.
static __global__ void sc_combine_kernel(const ScanK k) {
    grid_wait();
    const size_t total = (size_t)k.B * k.nsl * k.C;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        const int c = (int)(e % k.C), j = (int)(e / k.C % k.nsl), b = (int)(e / ((size_t)k.C * k.nsl));
        const size_t step = (size_t)k.nsl * k.Cp, e0 = ((size_t)b * k.nch * k.nsl + j) * k.Cp + c;
        float h = k.s0 && j < k.N ? k.s0[((size_t)b * k.C + c) * k.N + j] : 0.0f;
        // SC_CB summaries loaded before any is overwritten: the chain then waits for memory once a batch
        // rather than once a chunk (the compiler cannot move a load above the store before it)
        for (int c0 = 0; c0 < k.nch; c0 += SC_CB) {
            float A[SC_CB], v[SC_CB];
#pragma unroll
            for (int u = 0; u < SC_CB; u++)
                if (c0 + u < k.nch) A[u] = k.sa[e0 + (c0 + u) * step], v[u] = k.sh[e0 + (c0 + u) * step];
#pragma unroll
            for (int u = 0; u < SC_CB; u++) {
                if (c0 + u < k.nch) {
                    k.sh[e0 + (c0 + u) * step] = h;
                    h = k.am1 ? fmaf(A[u], h, h + v[u]) : fmaf(A[u], h, v[u]);
                }
            }
        }
        if (k.sT && j < k.N) k.sT[((size_t)b * k.C + c) * k.N + j] = h;
        if (k.sc) {
            float g = 0.0f;
            for (int c1 = k.nch; c1 > 0; c1 -= SC_CB) {  // chunks [c1 - SC_CB, c1), last first
                float A[SC_CB], v[SC_CB];
#pragma unroll
                for (int u = 0; u < SC_CB; u++)
                    if (c1 - 1 - u >= 0) A[u] = k.sa[e0 + (c1 - 1 - u) * step], v[u] = k.sc[e0 + (c1 - 1 - u) * step];
#pragma unroll
                for (int u = 0; u < SC_CB; u++) {
                    if (c1 - 1 - u >= 0) {
                        k.sc[e0 + (c1 - 1 - u) * step] = g;
                        g = k.am1 ? fmaf(A[u], g, g + v[u]) : fmaf(A[u], g, v[u]);
                    }
                }
            }
        }
    }
}

// ------------------------------------------------------------------------------ Longhorn

// A stage's k, q in float32 for every thread: k, k^2, q [SC_L][SC_N] and kappa [SC_L].
typedef struct {
    float k[SC_L][SC_N], k2[SC_L][SC_N], q[SC_L][SC_N], kap[SC_L];
} LhKq;

static __device__ void lh_convert(LhKq *f, const bf16 *kb, int n) {
    const bf16 *qb = kb + SC_L * SC_N;
    for (int e = threadIdx.x; e < n * SC_N; e += SC_CT) {
        const float kv = ld(kb, e);
        f->k[e / SC_N][e % SC_N] = kv;
        f->k2[e / SC_N][e % SC_N] = kv * kv;
        f->q[e / SC_N][e % SC_N] = ld(qb, e);
    }
    for (int tt = threadIdx.x; tt < n; tt += SC_CT) {
        float s = 0.0f;
        for (int j = 0; j < SC_N; j++) s = fmaf(ld(kb, tt * SC_N + j), ld(kb, tt * SC_N + j), s);
        f->kap[tt] = s;
    }
}

// beta and Delta of a token: Delta = beta / (1 + beta kappa); den = 1 + beta kappa.
static __device__ __forceinline__ float lh_delta(float rt, float wb, float kap, float *beta, float *den) {
    *beta = sigmoidf_(rt + wb);
    *den = fmaf(*beta, kap, 1.0f);
    return *beta / *den;
}

// S <- (1 - Delta k^2) S + Delta x k over the 16 slots; returns S q.
static __device__ __forceinline__ float lh_step(float S[SC_N], const LhKq *f, int tt, float dl, float u) {
    float y = 0.0f;
#pragma unroll
    for (int j = 0; j < SC_N; j++) {
        S[j] = fmaf(fmaf(-dl, f->k2[tt][j], 1.0f), S[j], u * f->k[tt][j]);
        y = fmaf(S[j], f->q[tt][j], y);
    }
    return y;
}

// A block's chunk: stages [*s0, *s0 + return) of chunk blockIdx.y.
static __device__ __forceinline__ int lh_chunk(const ScanK *k, int *s0) {
    *s0 = blockIdx.y * k->spc;
    return k->nst - *s0 < k->spc ? k->nst - *s0 : k->spc;
}

// The chunk's summary from the zero state, per slot: A = the product of its a = 1 - Delta k^2, the final
// state hl, and where dy is given cl = sum_t (a_t0 .. a_t) dy_t q_t (the adjoint it hands back from zero).
static __global__ void __launch_bounds__(SC_CT) lh_sum_kernel(const ScanK k) {
    extern __shared__ __align__(16) unsigned char sc_smem[];
    grid_wait();
    const int b = blockIdx.z, c = blockIdx.x * SC_CT + threadIdx.x, on = c < k.C;
    const int nin = k.dy ? 3 : 2, sb = sc_stage_bytes(nin, 0);
    LhKq *f = (LhKq *)(sc_smem + SC_ST * sb);
    const float wb = on ? k.w[sc_w(&k, b) + c] : 0.0f;
    int s0;
    const int ns = lh_chunk(&k, &s0);
    float S[SC_N], A[SC_N], cl[SC_N];
#pragma unroll
    for (int j = 0; j < SC_N; j++) S[j] = 0.0f, A[j] = 1.0f, cl[j] = 0.0f;
    for (int i = 0; i < SC_ST - 1; i++) {
        if (i < ns) sc_issue(&k, sc_smem + i * sb, k.x, k.r, k.dy, nin, 0, s0 + i);
        cp_async_commit();
    }
    for (int i = 0; i < ns; i++) {
        cp_async_wait1();
        __syncthreads();
        if (i + SC_ST - 1 < ns)
            sc_issue(&k, sc_smem + (i + SC_ST - 1) % SC_ST * sb, k.x, k.r, k.dy, nin, 0, s0 + i + SC_ST - 1);
        cp_async_commit();
        const bf16 *xs = (const bf16 *)(sc_smem + i % SC_ST * sb), *rs = xs + SC_L * SC_CT, *dys = rs + SC_L * SC_CT;
        const int t0 = (s0 + i) * SC_L, n = k.T - t0 < SC_L ? k.T - t0 : SC_L;
        lh_convert(f, xs + nin * SC_L * SC_CT, n);
        __syncthreads();
        if (k.dy) {
            for (int tt = 0; tt < n; tt++) {
                const int o = tt * SC_CT + threadIdx.x;
                float beta, den;
                const float dl = lh_delta(ld(rs, o), wb, f->kap[tt], &beta, &den), u = dl * ld(xs, o), dy = ld(dys, o);
#pragma unroll
                for (int j = 0; j < SC_N; j++) {
                    const float a = fmaf(-dl, f->k2[tt][j], 1.0f);
                    A[j] *= a;
                    S[j] = fmaf(a, S[j], u * f->k[tt][j]);
                    cl[j] = fmaf(A[j], dy * f->q[tt][j], cl[j]);
                }
            }
        } else {
#pragma unroll 2
            for (int tt = 0; tt < n; tt++) {
                const int o = tt * SC_CT + threadIdx.x;
                float beta, den;
                const float dl = lh_delta(ld(rs, o), wb, f->kap[tt], &beta, &den), u = dl * ld(xs, o);
#pragma unroll
                for (int j = 0; j < SC_N; j++) {
                    const float a = fmaf(-dl, f->k2[tt][j], 1.0f);
                    A[j] *= a;
                    S[j] = fmaf(a, S[j], u * f->k[tt][j]);
                }
            }
        }
    }
    if (on) {
#pragma unroll
        for (int j = 0; j < SC_N; j++) {
            const size_t e = (((size_t)b * k.nch + blockIdx.y) * SC_N + j) * k.Cp + c;
            k.sa[e] = A[j];
            k.sh[e] = S[j];
            if (k.dy) k.sc[e] = cl[j];
        }
    }
}

// Forward (y), or the backward's checkpoint pass (ckpt: the state at each stage's start, y not
// written): the chunk from its incoming state (sh; s0 or zero where the sequence is one chunk, then
// sT written here).
static __global__ void __launch_bounds__(SC_CT) lh_fwd_kernel(const ScanK k) {
    extern __shared__ __align__(16) unsigned char sc_smem[];
    grid_wait();
    const int b = blockIdx.z, c = blockIdx.x * SC_CT + threadIdx.x, on = c < k.C;
    const int sb = sc_stage_bytes(2, 0);
    LhKq *f = (LhKq *)(sc_smem + SC_ST * sb);
    const float wb = on ? k.w[sc_w(&k, b) + c] : 0.0f, skip = on ? k.skip[sc_w(&k, b) + c] : 0.0f;
    int s0;
    const int ns = lh_chunk(&k, &s0);
    float S[SC_N];
#pragma unroll
    for (int j = 0; j < SC_N; j++) {
        if (!on) S[j] = 0.0f;
        else if (k.sh) S[j] = k.sh[(((size_t)b * k.nch + blockIdx.y) * SC_N + j) * k.Cp + c];
        else S[j] = k.s0 && j < k.N ? k.s0[((size_t)b * k.C + c) * k.N + j] : 0.0f;
    }
    for (int i = 0; i < SC_ST - 1; i++) {
        if (i < ns) sc_issue(&k, sc_smem + i * sb, k.x, k.r, NULL, 2, 0, s0 + i);
        cp_async_commit();
    }
    for (int i = 0; i < ns; i++) {
        const int s = s0 + i;
        cp_async_wait1();
        __syncthreads();
        if (i + SC_ST - 1 < ns)
            sc_issue(&k, sc_smem + (i + SC_ST - 1) % SC_ST * sb, k.x, k.r, NULL, 2, 0, s + SC_ST - 1);
        cp_async_commit();
        const bf16 *xs = (const bf16 *)(sc_smem + i % SC_ST * sb), *rs = xs + SC_L * SC_CT;
        const int t0 = s * SC_L, n = k.T - t0 < SC_L ? k.T - t0 : SC_L;
        lh_convert(f, rs + SC_L * SC_CT, n);
        if (k.ckpt) {
#pragma unroll
            for (int j = 0; j < SC_N; j++) k.ckpt[(((size_t)b * k.nst + s) * SC_N + j) * k.Cp + c] = S[j];
        }
        __syncthreads();
#pragma unroll 2
        for (int tt = 0; tt < n; tt++) {
            const int o = tt * SC_CT + threadIdx.x;
            const float x = ld(xs, o);
            float beta, den;
            const float dl = lh_delta(ld(rs, o), wb, f->kap[tt], &beta, &den);
            const float y = lh_step(S, f, tt, dl, dl * x);
            if (k.y && on) st(k.y, ((size_t)b * k.T + t0 + tt) * k.C + c, fmaf(skip, x, y));
        }
    }
    if (k.sT && on) {
#pragma unroll
        for (int j = 0; j < SC_N; j++)
            if (j < k.N) k.sT[((size_t)b * k.C + c) * k.N + j] = S[j];
    }
}

// Sum over the warp's lanes of 32 values a lane, lane l ending with the total of value l (a transposed
// butterfly: 31 shuffles for 32 sums, against 160 for 32 separate reductions).
#define SC_FOLD(W)                                                                    \
    do {                                                                              \
        const int hi_ = (lane & (W)) != 0;                                            \
        _Pragma("unroll") for (int e = 0; e < (W); e++) {                             \
            const float keep_ = hi_ ? v[e + (W)] : v[e], send_ = hi_ ? v[e] : v[e + (W)]; \
            v[e] = keep_ + __shfl_xor_sync(0xffffffffu, send_, (W));                  \
        }                                                                             \
    } while (0)
static __device__ __forceinline__ float warp_sum32(float v[32]) {
    const int lane = threadIdx.x & 31;
    SC_FOLD(16);
    SC_FOLD(8);
    SC_FOLD(4);
    SC_FOLD(2);
    SC_FOLD(1);
    return v[0];
}

static __global__ void __launch_bounds__(SC_CT) lh_bwd_kernel(const ScanK k) {
    extern __shared__ __align__(16) unsigned char sc_smem[];
    grid_wait();
    const int b = blockIdx.z, c = blockIdx.x * SC_CT + threadIdx.x, on = c < k.C;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int sb = sc_stage_bytes(3, SC_N);
    LhKq *f = (LhKq *)(sc_smem + SC_ST * sb);
    float *sub = (float *)(f + 1);             // [SC_L / SC_SB][SC_N][SC_CT]: the states every SC_SB tokens
    float *red = sub + SC_L / SC_SB * SC_N * SC_CT;  // [SC_NW][SC_L][SC_RED]: the warps' sums over channels
    const float wb = on ? k.w[sc_w(&k, b) + c] : 0.0f, skip = on ? k.skip[sc_w(&k, b) + c] : 0.0f;
    int s0;
    const int ns = lh_chunk(&k, &s0), se = s0 + ns;  // the chunk's stages, walked from the last
    float dSc[SC_N];  // a_{t+1} dS_{t+1}, from the chunks after this one (sc; zero where NULL)
#pragma unroll
    for (int j = 0; j < SC_N; j++)
        dSc[j] = on && k.sc ? k.sc[(((size_t)b * k.nch + blockIdx.y) * SC_N + j) * k.Cp + c] : 0.0f;
    float dw = 0.0f, dskip = 0.0f;
    for (int i = 0; i < SC_ST - 1; i++) {
        if (i < ns) sc_issue(&k, sc_smem + i * sb, k.x, k.r, k.dy, 3, SC_N, se - 1 - i);
        cp_async_commit();
    }
    for (int i = 0; i < ns; i++) {
        const int s = se - 1 - i;
        cp_async_wait1();
        __syncthreads();
        if (i + SC_ST - 1 < ns)
            sc_issue(&k, sc_smem + (i + SC_ST - 1) % SC_ST * sb, k.x, k.r, k.dy, 3, SC_N, s - (SC_ST - 1));
        cp_async_commit();
        const bf16 *xs = (const bf16 *)(sc_smem + i % SC_ST * sb), *rs = xs + SC_L * SC_CT, *dys = rs + SC_L * SC_CT;
        const bf16 *kb = dys + SC_L * SC_CT;
        const float *cks = (const float *)(kb + 2 * SC_L * SC_N);
        const int t0 = s * SC_L, n = k.T - t0 < SC_L ? k.T - t0 : SC_L;
        lh_convert(f, kb, n);
        __syncthreads();
        // the states every SC_SB tokens from the stage's checkpoint (each thread its own column)
        float S[SC_N];
#pragma unroll
        for (int j = 0; j < SC_N; j++) S[j] = cks[j * SC_CT + threadIdx.x];
        for (int tt = 0; tt < n; tt++) {
            if (tt % SC_SB == 0) {
#pragma unroll
                for (int j = 0; j < SC_N; j++) sub[(tt / SC_SB * SC_N + j) * SC_CT + threadIdx.x] = S[j];
            }
            const int o = tt * SC_CT + threadIdx.x;
            float beta, den;
            const float dl = lh_delta(ld(rs, o), wb, f->kap[tt], &beta, &den);
            const float x = ld(xs, o), u = dl * x;
#pragma unroll
            for (int j = 0; j < SC_N; j++) S[j] = fmaf(fmaf(-dl, f->k2[tt][j], 1.0f), S[j], u * f->k[tt][j]);
        }
        // back through the stage, SC_SB tokens at a time
        for (int g = (n - 1) / SC_SB; g >= 0; g--) {
            float Sp[SC_SB + 1][SC_N];  // Sp[e] = the state before token g SC_SB + e; Sp[SC_SB] after the last
#pragma unroll
            for (int j = 0; j < SC_N; j++) Sp[0][j] = sub[(g * SC_N + j) * SC_CT + threadIdx.x];
#pragma unroll
            for (int e = 0; e < SC_SB; e++) {
                const int tt = g * SC_SB + e, o = tt * SC_CT + threadIdx.x;
                if (tt < n) {
                    float beta, den;
                    const float dl = lh_delta(ld(rs, o), wb, f->kap[tt], &beta, &den);
                    const float u = dl * ld(xs, o);
#pragma unroll
                    for (int j = 0; j < SC_N; j++)
                        Sp[e + 1][j] = fmaf(fmaf(-dl, f->k2[tt][j], 1.0f), Sp[e][j], u * f->k[tt][j]);
                } else {
#pragma unroll
                    for (int j = 0; j < SC_N; j++) Sp[e + 1][j] = Sp[e][j];
                }
            }
#pragma unroll
            for (int e = SC_SB - 1; e >= 0; e--) {
                const int tt = g * SC_SB + e, o = tt * SC_CT + threadIdx.x;
                if (tt >= n) continue;  // uniform over the block
                float beta, den;
                const float x = ld(xs, o), dy = ld(dys, o);
                const float dl = lh_delta(ld(rs, o), wb, f->kap[tt], &beta, &den);
                float v[32], ddl = 0.0f, dxs = 0.0f;
#pragma unroll
                for (int j = 0; j < SC_N; j++) {
                    const float kj = f->k[tt][j], sp = Sp[e][j];
                    const float dS = fmaf(dy, f->q[tt][j], dSc[j]);
                    const float ex = fmaf(-kj, sp, x);  // x - k S_{t-1}
                    const float mk = dS * kj;
                    ddl = fmaf(mk, ex, ddl);   // dDelta: dS (x k - k^2 S_{t-1})
                    dxs += mk;
                    v[j] = dS * dl * fmaf(-kj, sp, ex);  // dk through a, b: dS Delta (x - 2 k S_{t-1})
                    v[SC_N + j] = Sp[e + 1][j] * dy;     // dq: S_t dy
                    dSc[j] = fmaf(-dl, f->k2[tt][j], 1.0f) * dS;
                }
                const float dbeta = ddl / (den * den), dr = dbeta * beta * (1.0f - beta);
                float dkap = -ddl * dl * dl;
                if (on) {
                    const size_t el = ((size_t)b * k.T + t0 + tt) * k.C + c;
                    st(k.dx, el, fmaf(dl, dxs, skip * dy));
                    st(k.dr, el, dr);
                    dw += dr;
                    dskip = fmaf(dy, x, dskip);
                } else {
#pragma unroll
                    for (int j = 0; j < 32; j++) v[j] = 0.0f;
                    dkap = 0.0f;
                }
                const float tot = warp_sum32(v);
                dkap = warp_sum(dkap);
                red[(warp * SC_L + tt) * SC_RED + lane] = tot;
                if (lane == 0) red[(warp * SC_L + tt) * SC_RED + 32] = dkap;
            }
        }
        __syncthreads();
        // the block's sums over its warps, for lh_dkq_kernel
        for (int e = threadIdx.x; e < n * SC_RED; e += SC_CT) {
            float sum = 0.0f;
            for (int w = 0; w < SC_NW; w++) sum += red[w * SC_L * SC_RED + e];
            const int tt = e / SC_RED, col = e % SC_RED;
            k.red[(((size_t)b * k.T + t0 + tt) * k.tiles + blockIdx.x) * SC_RED + col] = sum;
        }
    }
    if (on) {
        const size_t e = ((size_t)b * k.nch + blockIdx.y) * 2 * k.C + c;
        k.part[e] = dw;
        k.part[e + k.C] = dskip;
    }
}

// dk = the tiles' dk partials + 2 k dkappa; dq = the tiles' dq partials; in tile order. A thread a (b, t, j).
static __global__ void lh_dkq_kernel(const bf16 *kin, const float *red, bf16 *dk, bf16 *dq, size_t ntok, int N,
                                     int tiles) {
    grid_wait();
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < ntok * N; e += (size_t)gridDim.x * blockDim.x) {
        const size_t t = e / N;
        const int j = (int)(e % N);
        const float *p = red + t * tiles * SC_RED;
        float sk = 0.0f, sq = 0.0f, skap = 0.0f;
        for (int g = 0; g < tiles; g++) {
            sk += p[g * SC_RED + j];
            sq += p[g * SC_RED + SC_N + j];
            skap += p[g * SC_RED + 32];
        }
        st(dk, e, fmaf(2.0f * ld(kin, e), skap, sk));
        st(dq, e, sq);
    }
}

// dw (+= the partials of every (sequence, chunk) row), dskip likewise where given, in a fixed order: a
// block takes 32 channels, its 32 warps every 32nd row each (a row's load a warp's one line; 32 rows in
// flight a channel, so that the thousand rows of 8 x 2048 tokens in 16-token chunks wait on memory
// about 32 times, not 128), then the warps' sums in warp order.
#define SC_PR 32
static __global__ void __launch_bounds__(32 * SC_PR) sc_param_kernel(const float *part, float *dw, float *dskip,
                                                                     int rows, int C) {
    __shared__ float acc[SC_PR][2][32];
    grid_wait();
    const int lane = threadIdx.x & 31, g = threadIdx.x >> 5;
    for (int c0 = blockIdx.x * 32; c0 < C; c0 += gridDim.x * 32) {
        const int c = c0 + lane;
        float a = 0.0f, s = 0.0f;
        if (c < C) {
#pragma unroll 4
            for (int r = g; r < rows; r += SC_PR) {
                a += part[(size_t)r * 2 * C + c];
                if (dskip) s += part[(size_t)r * 2 * C + C + c];
            }
        }
        acc[g][0][lane] = a;
        acc[g][1][lane] = s;
        __syncthreads();
        if (g == 0 && c < C) {
            for (int w = 1; w < SC_PR; w++) a += acc[w][0][lane], s += acc[w][1][lane];
            dw[c] += a;
            if (dskip) dskip[c] += s;
        }
        __syncthreads();
    }
}

// ------------------------------------------------------------------------------ host side

extern "C" int cuda_scan_supports(const Backend *be, const ScanDims *d) {
    (void)be;
    if (d->kind == SCAN_RGLRU && d->N != 1)
        return mn_error(MN_ERR_UNSUPPORTED, "cuda scan: RG-LRU with N = %d state slots, the kernels take 1", d->N);
    if (d->kind == SCAN_LONGHORN && (d->N < 1 || d->N > SC_N))
        return mn_error(MN_ERR_UNSUPPORTED, "cuda scan: Longhorn with d_state N = %d, the kernels take 1 to %d", d->N,
                        SC_N);
    if (d->B > 65535)
        return mn_error(MN_ERR_UNSUPPORTED, "cuda scan: B = %d sequences, the kernels take at most 65535", d->B);
    return MN_OK;
}

static int sc_check(const char *fn, const ScanDims *d, const void *io) {
    if (!d || !io) return mn_error(MN_ERR_ARG, "%s: dims and io are required", fn);
    if (d->kind != SCAN_RGLRU && d->kind != SCAN_LONGHORN)
        return mn_error(MN_ERR_ARG, "%s: unknown kind %d (SCAN_RGLRU or SCAN_LONGHORN)", fn, (int)d->kind);
    if (d->B < 1 || d->T < 1 || d->C < 1)
        return mn_error(MN_ERR_ARG, "%s: B = %d, T = %d, C = %d: each must be >= 1", fn, d->B, d->T, d->C);
    if (d->reset != 0 && d->reset != 1) return mn_error(MN_ERR_ARG, "%s: reset must be 0 or 1, got %d", fn, d->reset);
    if (d->reset && d->kind != SCAN_RGLRU)
        return mn_error(MN_ERR_ARG, "%s: reset applies to SCAN_RGLRU only (Longhorn starts from s0 or zero)", fn);
    if (d->w_seqs < 0 || (d->w_seqs > 0 && (d->B % d->w_seqs || d->w_stride < (size_t)d->C)))
        return mn_error(MN_ERR_ARG, "%s: w_seqs = %d, w_stride = %zu: 0, or a divisor of the %d sequences with a "
                                    "stride of at least C = %d", fn, d->w_seqs, d->w_stride, d->B, d->C);
    return cuda_scan_supports(NULL, d);
}

static int aligned16(const void *p) { return (uintptr_t)p % 16 == 0; }

// The fields every kernel shares; vec where the channel arrays allow 16-byte copies.
static ScanK sc_args(const ScanDims *d, const void *x, const void *r, const void *i, const void *dy, const void *kk,
                     const void *q, const void *w, const void *skip) {
    ScanK k;
    memset(&k, 0, sizeof k);
    k.x = (const bf16 *)x, k.r = (const bf16 *)r, k.i = (const bf16 *)i, k.dy = (const bf16 *)dy;
    k.k = (const bf16 *)kk, k.q = (const bf16 *)q;
    k.w = (const float *)w, k.skip = (const float *)skip;
    k.B = d->B, k.T = d->T, k.C = d->C, k.N = d->N;
    k.tiles = (d->C + SC_CT - 1) / SC_CT;
    k.Cp = k.tiles * SC_CT;
    k.nst = (d->T + SC_L - 1) / SC_L;
    k.spc = d->kind == SCAN_LONGHORN ? SC_LH_SPC : 1;
    k.nch = (k.nst + k.spc - 1) / k.spc;
    if (d->kind == SCAN_RGLRU) {  // the backward's (dy given) chunks are shorter (rg_bwd_kernel)
        const int L = dy ? RG_LB : RG_LF;
        k.nch = (d->T + L - 1) / L;
    }
    k.nsl = d->kind == SCAN_LONGHORN ? SC_N : 1;
    k.am1 = d->kind == SCAN_RGLRU;
    k.reset = d->kind == SCAN_RGLRU && d->reset;
    k.wseq = d->w_seqs, k.wstride = d->w_stride;
    k.vec = d->C % 8 == 0 && aligned16(x) && aligned16(r) && (!i || aligned16(i)) && (!dy || aligned16(dy));
    k.kqvec = d->N == SC_N && (!kk || aligned16(kk)) && (!q || aligned16(q));
    return k;
}

typedef void (*ScKernel)(const ScanK);

static int aligned4(const void *p) { return (uintptr_t)p % 4 == 0; }

// Launches an RG-LRU walk (kern1 and kern2: the kernel taking 1 and 2 channels a thread): a block per
// (RG_T threads' channels, chunk, sequence), 2 channels a thread where every row allows 32-bit access.
static int rg_launch(CudaCtx *c, ScKernel kern1, ScKernel kern2, const ScanK *k) {
    const int v2 = k->C % 2 == 0 && aligned4(k->x) && aligned4(k->r) && aligned4(k->i) && aligned4(k->dy) &&
                   aligned4(k->y) && aligned4(k->dx) && aligned4(k->dr) && aligned4(k->di);
    const int per = RG_T * (v2 ? 2 : 1);
    Launch l;
    CU_TRY(cudaLaunchKernelEx(
        launch_after(&l, c, dim3((unsigned)((k->C + per - 1) / per), (unsigned)k->nch, (unsigned)k->B), RG_T, 0,
                     c->stream),
        v2 ? kern2 : kern1, *k));
    return MN_OK;
}

// Launches a chunk walk: a block per (tile, chunk, sequence), its dynamic shared memory raised past 48 KB
// at every launch (the limit belongs to the device current at the call, and a process may drive
// several devices, one a thread).
static int sc_launch(CudaCtx *c, ScKernel kern, const ScanK *k, size_t smem) {
    if (smem > 48 * 1024) CU_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    Launch l;
    CU_TRY(cudaLaunchKernelEx(
        launch_after(&l, c, dim3((unsigned)k->tiles, (unsigned)k->nch, (unsigned)k->B), SC_CT, smem, c->stream), kern,
        *k));
    return MN_OK;
}

static int sc_combine(CudaCtx *c, const ScanK *k) {
    Launch l;
    CU_TRY(cudaLaunchKernelEx(
        launch_after(&l, c, dim3(grid_for((size_t)k->B * k->nsl * k->C, 128)), 128, 0, c->stream),
        sc_combine_kernel, *k));
    return MN_OK;
}

static size_t lh_sum_smem(int nin) { return (size_t)SC_ST * sc_stage_bytes(nin, 0) + sizeof(LhKq); }
static size_t lh_bwd_smem(void) {
    return (size_t)SC_ST * sc_stage_bytes(3, SC_N) + sizeof(LhKq) + sizeof(float) * SC_L / SC_SB * SC_N * SC_CT +
           sizeof(float) * SC_NW * SC_L * SC_RED;
}

// The chunks' summaries (with the adjoint's where k->dy is set), then their incoming states (and
// adjoints) in place: sa, sh (sc) set.
static int sc_chunk_states(CudaCtx *c, const ScanDims *d, ScanK *k) {
    const int nin = k->dy ? 3 : 2;  // Longhorn's arrays
    if (d->kind == SCAN_RGLRU && k->dy) MN_TRY(rg_launch(c, rg_sum_kernel<1, RG_LB>, rg_sum_kernel<2, RG_LB>, k));
    else if (d->kind == SCAN_RGLRU) MN_TRY(rg_launch(c, rg_sum_kernel<1, RG_LF>, rg_sum_kernel<2, RG_LF>, k));
    else MN_TRY(sc_launch(c, lh_sum_kernel, k, lh_sum_smem(nin)));
    return sc_combine(c, k);
}

// The walk from the chunks' incoming states: y (and sT where there is one chunk), or Longhorn's
// checkpoints (k->ckpt, y NULL).
static int sc_walk(CudaCtx *c, const ScanDims *d, const ScanK *k) {
    if (d->kind == SCAN_RGLRU) return rg_launch(c, rg_fwd_kernel<1>, rg_fwd_kernel<2>, k);
    return sc_launch(c, lh_fwd_kernel, k, lh_sum_smem(2));
}

extern "C" int cuda_scan_fwd(const Backend *be, const ScanDims *d, const ScanFwd *io) {
    const char *fn = "cuda scan forward";
    MN_TRY(sc_check(fn, d, io));
    const int lh = d->kind == SCAN_LONGHORN;
    if (!io->x || !io->r || !io->w || !io->y || (lh ? !io->k || !io->q || !io->skip : !io->i))
        return mn_error(MN_ERR_ARG, "%s: x, r, w, y and %s are required", fn, lh ? "k, q, skip" : "i");
    CudaCtx *c = cuda_ctx(be);
    ScanK k = sc_args(d, io->x, io->r, io->i, NULL, io->k, io->q, io->w, io->skip);
    k.s0 = (const float *)io->s0;
    k.sT = (float *)io->sT;
    if (k.nch > 1) {  // (one chunk, decoding among them: one launch from s0, no scratch)
        const size_t nsum = (size_t)d->B * k.nch * k.nsl * k.Cp;
        float *ws = (float *)cuda_scratch(be, sizeof(float) * 2 * nsum);
        if (!ws) return MN_ERR_NOMEM;
        k.sa = ws, k.sh = ws + nsum;
        MN_TRY(sc_chunk_states(c, d, &k));
        k.sT = NULL;
    }
    k.y = (bf16 *)io->y;
    return sc_walk(c, d, &k);
}

extern "C" int cuda_scan_bwd(const Backend *be, const ScanDims *d, const ScanBwd *io) {
    const char *fn = "cuda scan backward";
    MN_TRY(sc_check(fn, d, io));
    const int lh = d->kind == SCAN_LONGHORN;
    if (!io->x || !io->r || !io->w || !io->dy || !io->dx || !io->dr || !io->dw ||
        (lh ? !io->k || !io->q || !io->skip || !io->dk || !io->dq || !io->dskip : !io->i || !io->di))
        return mn_error(MN_ERR_ARG, "%s: x, r, w, dy, dx, dr, dw and %s are required", fn,
                        lh ? "k, q, skip, dk, dq, dskip" : "i, di");
    CudaCtx *c = cuda_ctx(be);
    ScanK k = sc_args(d, io->x, io->r, io->i, io->dy, io->k, io->q, io->w, io->skip);
    const size_t nck = lh ? (size_t)d->B * k.nst * SC_N * k.Cp : 0;
    const size_t nsum = k.nch > 1 ? (size_t)d->B * k.nch * k.nsl * k.Cp : 0;
    const size_t npart = (size_t)d->B * k.nch * 2 * d->C;
    const size_t nred = lh ? (size_t)d->B * d->T * k.tiles * SC_RED : 0;
    float *ws = (float *)cuda_scratch(be, sizeof(float) * (nck + 3 * nsum + npart + nred) + 16);
    if (!ws) return MN_ERR_NOMEM;
    k.ckpt = nck ? ws : NULL;
    k.part = ws + nck + 3 * nsum;
    k.red = nred ? k.part + npart : NULL;
    if (nsum) {  // each chunk's incoming state and adjoint
        k.sa = ws + nck, k.sh = k.sa + nsum, k.sc = k.sh + nsum;
        MN_TRY(sc_chunk_states(c, d, &k));
    }
    if (lh) {  // the states at the stages' starts, y not written
        ScanK f = k;
        f.dy = NULL;
        MN_TRY(sc_walk(c, d, &f));
    }
    k.dx = (bf16 *)io->dx, k.dr = (bf16 *)io->dr, k.di = (bf16 *)io->di;
    if (!lh) {
        MN_TRY(rg_launch(c, rg_bwd_kernel<1>, rg_bwd_kernel<2>, &k));
    } else {
        MN_TRY(sc_launch(c, lh_bwd_kernel, &k, lh_bwd_smem()));
        const size_t ntok = (size_t)d->B * d->T;
        Launch l;
        CU_TRY(cudaLaunchKernelEx(launch_after(&l, c, dim3(grid_for(ntok * d->N, 256)), 256, 0, c->stream),
                                  lh_dkq_kernel, (const bf16 *)io->k, (const float *)k.red, (bf16 *)io->dk,
                                  (bf16 *)io->dq, ntok, d->N, k.tiles));
    }
    const int per = d->w_seqs > 0 ? d->w_seqs : d->B;  // the partials of a group's sequences into its dw, dskip
    for (int b0 = 0; b0 < d->B; b0 += per) {
        const size_t wo = scan_w_at(d, b0);
        Launch l;
        CU_TRY(cudaLaunchKernelEx(
            launch_after(&l, c, dim3((unsigned)((d->C + 31) / 32)), 32 * SC_PR, 0, c->stream), sc_param_kernel,
            (const float *)k.part + (size_t)b0 * k.nch * 2 * d->C, (float *)io->dw + wo,
            lh ? (float *)io->dskip + wo : (float *)NULL, per * k.nch, d->C));
    }
    return MN_OK;
}
