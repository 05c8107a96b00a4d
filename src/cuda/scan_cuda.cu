/*
 * The diagonal recurrences on the GPU (core/backend.h's ScanOps: Griffin's RG-LRU, N = 1, and Longhorn's
 * update, N = d_state <= 16). x, r, i, k, q, y, dy and the token gradients are bf16; w, skip, the states
 * and every sum are float32.
 *
 * Layout of the work. The sequence is cut into chunks (RG-LRU: a stage of SC_L = 32 tokens; Longhorn:
 * SC_LH_SPC = 4 stages, 128 tokens), and a block takes SC_CT channels of one chunk of one sequence, a thread a
 * channel with its N state values in registers: B T C / SC_L threads (about a million at 8 x 2048 x 2048)
 * instead of B C walking the whole sequence, enough loads in flight for the memory. Three launches:
 * the chunks' summaries (the walk from the zero state: the chunk's transition A = the product of its a,
 * per slot, and its final state), a short sequential pass per (sequence, slot, channel) combining them
 * in chunk order into each chunk's incoming state (sc_combine_kernel: T / chunk steps, fixed order, so
 * deterministic), then the walk of each chunk from its incoming state, writing y. The inputs are read
 * twice: the price of the parallelism. A stage's inputs arrive by cp.async (16-byte pieces; element
 * copies where C or a pointer is not aligned); Longhorn's chunk walks its stages through a ring SC_ST
 * deep. Longhorn's k and q (shared by every channel of a sequence) are converted once a stage into
 * float32 k, k^2 and q with kappa = |k|^2, which every thread reads by broadcast.
 *
 * The backward recomputes the forward's states (core/backend.h: they are not stored). The summary pass
 * also sums the adjoint each chunk hands back from zero (cl = sum_t a_t0 .. a_t dy_t (q_t)), and the
 * combine carries those from the last chunk back, so that every chunk's backward starts from its incoming
 * state and its incoming adjoint and the chunks run in parallel. RG-LRU recomputes the chunk's 32 states
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

#define SC_CT 64   // channels a block, a thread each
#define SC_L 32    // tokens a stage (and between the backward's checkpoints)
#define SC_ST 3    // stages in the ring: two in flight while one is computed
#define SC_N 16    // Longhorn's state slots in the kernels (N below is padded with zero k, q)
#define SC_SB 4    // Longhorn backward: tokens recomputed into registers at a time
#define SC_NW (SC_CT / 32)
#define SC_RED 33  // Longhorn backward: a token's partial sums over a block's channels (dk, dq, dkappa)
#define SC_LH_SPC 4  // Longhorn: stages a chunk (RG-LRU's chunk is a stage)
#define SC_MAXGRAD2 1e-6f  // transformers' SqrtBoundDerivative: 4u clipped at 1 / 1000^2

// RG-LRU: a chain of chunks (rg_fwd_kernel's states forward, rg_bwd_kernel's adjoints backward). Each
// chunk publishes its aggregate (the value it hands on from a zero one: A - 1 and end) under SC_AGG,
// then its inclusive value (what it hands on: inc = A v + end, v what it was handed) under SC_INC.
#define SC_AGG 1
#define SC_INC 2
typedef struct {
    float *am1, *end, *inc;  // [B][nch][Cp]
    int *flag;               // [B][nch][tiles]: 0, SC_AGG, SC_INC; zeroed before the launch
    int *ticket;             // the blocks' order of start; zeroed before the launch
} ScChain;

typedef struct {
    const bf16 *x, *r, *i, *dy;  // [B,T,C]
    const bf16 *k, *q;           // [B,T,N]
    const float *w, *skip;       // [C]
    const float *s0;             // [B,C,N] or NULL
    bf16 *y;                     // [B,T,C] or NULL (the checkpoint pass)
    float *sT;                   // [B,C,N] or NULL
    float *ckpt;                 // [B][nst][SC_N][Cp]: Longhorn's state at each stage's start, or NULL
    float *sa, *sh, *sc;         // Longhorn: [B][nch][SC_N][Cp]: each chunk's summary (see sc_combine_kernel), or NULL
    ScChain fc, bc;              // RG-LRU where nch > 1: the forward and backward chains
    bf16 *dx, *dr, *di;          // [B,T,C]
    float *part;                 // [B][2][C]: dw, dskip partials of each sequence
    float *red;                  // [B][T][tiles][SC_RED]: Longhorn's dk, dq, dkappa partials
    int B, T, C, N, Cp, nst, tiles;
    int spc, nch;       // stages a chunk, chunks
    int reset;
    int vec;     // channel rows by 16-byte cp.async (C % 8 == 0 and aligned pointers)
    int ovec;    // RG-LRU's outputs (y; dx, dr, di) by 16-byte stores likewise
    int kqvec;   // k, q rows by cp.async (N == 16, aligned)
} ScanK;

// Shared memory of a stage: the channel inputs [nin][SC_L][SC_CT] bf16, then k, q [2][SC_L][SC_N] bf16
// (Longhorn), then the checkpoint [ns][SC_CT] float (the backward).
static __host__ __device__ int sc_stage_bytes(int nin, int kq, int ns) {
    return nin * SC_L * SC_CT * 2 + (kq ? 2 * SC_L * SC_N * 2 : 0) + ns * SC_CT * 4;
}

// Copies stage s (tokens s SC_L ..) into stage buffer `buf`: the nin channel arrays a0 .., k and q where kq,
// the checkpoint where ns. Channels past C and slots past N are zero; tokens past T are not copied.
static __device__ void sc_issue(const ScanK *k, unsigned char *buf, const bf16 *a0, const bf16 *a1, const bf16 *a2,
                                const bf16 *a3, int nin, int kq, int ns, int s, int b, int tile) {
    const int c0 = tile * SC_CT, t0 = s * SC_L;
    const int n = k->T - t0 < SC_L ? k->T - t0 : SC_L;
    const int tid = threadIdx.x;
    // channel rows: SC_CT / 8 pieces a token
#pragma unroll
    for (int a = 0; a < 4; a++) {
        if (a >= nin) break;
        const bf16 *src = a == 0 ? a0 : a == 1 ? a1 : a == 2 ? a2 : a3;
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
    if (kq) {
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
    }
    if (ns) {  // the checkpoint: ns rows of SC_CT floats, always aligned (our scratch, Cp a multiple of SC_CT)
        const float *src = k->ckpt + ((size_t)b * k->nst + s) * ns * k->Cp + c0;
        for (int p = tid; p < ns * (SC_CT / 4); p += SC_CT) {
            const int j = p / (SC_CT / 4), g = p % (SC_CT / 4);
            cp_async16(after + ((size_t)j * SC_CT + 4 * g) * 4, src + (size_t)j * k->Cp + 4 * g, 16);
        }
    }
}

// ------------------------------------------------------------------------------ RG-LRU

// The gates of one token: a - 1 (exact where a is within float32's rounding of 1, so that a slow
// channel keeps its memory: a = 1 - 1e-8 would round to 1) and the input's multiplier m = sqrt(1 - a^2)
// = sqrt(-(a - 1)(a + 1)); at a reset a = 0 and m = 1.
// e^x - 1 for x <= 0: a cubic where |x| < 1/64 (truncation x^4 / 24: 2.4e-9 relative there), __expf
// less 1 elsewhere (absolute error about 1e-7, float32's own at a < 1 - 1/64); expm1f's general
// path costs three times the instructions in the walk.
static __device__ __forceinline__ float expm1_neg(float x) {
    return x > -0.015625f ? x * fmaf(x, fmaf(x, 1.0f / 6.0f, 0.5f), 1.0f) : __expf(x) - 1.0f;
}

static __device__ __forceinline__ void rg_gates(float rt, float coef, int first, float *am1, float *m) {
    if (first) {
        *am1 = -1.0f;
        *m = 1.0f;
    } else {
        const float e = expm1_neg(coef * sigmoidf_(rt));
        *am1 = e;
        *m = sqrtf(fmaxf(-e * (2.0f + e), 0.0f));
    }
}

static __device__ __forceinline__ float softplusf_(float w) { return w > 20.0f ? w : log1pf(__expf(w)); }

// A block's chunk (RG-LRU: one stage, s) of sequence b, channels tile SC_CT .. into shared memory: the nin
// arrays x, r, i, dy.
static __device__ void rg_load(const ScanK *k, unsigned char *smem, int nin, int s, int b, int tile) {
    sc_issue(k, smem, k->x, k->r, k->i, k->dy, nin, 0, 0, s, b, tile);
    cp_async_commit();
    cp_async_wait0();
    __syncthreads();
}

// Rows [0, n) of a chunk's array in shared memory (bf16 [SC_L][SC_CT]) out to dst's tokens t0 .. of sequence b:
// 16-byte stores where the outputs allow (ovec), else element by element.
static __device__ void rg_store(const ScanK *k, bf16 *dst, const bf16 *src, int b, int tile, int t0, int n) {
    const int c0 = tile * SC_CT;
    for (int p = threadIdx.x; p < n * (SC_CT / 8); p += SC_CT) {
        const int tt = p / (SC_CT / 8), g = p % (SC_CT / 8), c = c0 + 8 * g;
        const size_t row = ((size_t)b * k->T + t0 + tt) * k->C;
        const bf16 *s = src + tt * SC_CT + 8 * g;
        if (k->ovec && c + 8 <= k->C) {
            *(uint4 *)(dst + row + c) = *(const uint4 *)s;
        } else {
            for (int e = 0; e < 8 && c + e < k->C; e++) dst[row + c + e] = s[e];
        }
    }
}

// The chain of a sequence's chunks (ScChain), one per tile of channels. A block takes a ticket when it
// starts and its (sequence, chunk, tile) from it, in chain order: every chunk it waits for has started,
// so the chain moves on whatever order the blocks are scheduled in.
static __device__ int sc_ticket(const ScChain *q) {
    __shared__ int id;
    if (threadIdx.x == 0) id = atomicAdd(q->ticket, 1);
    __syncthreads();
    return id;
}

// Makes the block's stores of a chunk's values visible, then raises its flag to v.
static __device__ void sc_publish(const ScChain *q, size_t f, int v) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) atomicExch(q->flag + f, v);
}

// The inclusive value of chunk ch - dir (dir 1: the forward chain, -1: the backward's) for channel c of
// tile `tile`. Warp 0 reads the flags of the 32 chunks before this one at once (one round trip, not
// one a chunk): the nearest with its inclusive value out, every one between with at least its
// aggregate, else it reads them again (a window of aggregates only: the 32 before it). The aggregates
// between are folded in, in chain order. Whichever chunk it stops at, the result is the same
// operations on the same values as the chain's own (v <- (A - 1) v + v + end, from the chain's first
// chunk), so deterministic.
static __device__ float sc_look_back(const ScanK *k, const ScChain *q, int b, int tile, int c, int ch, int dir) {
    __shared__ int from;
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        int base = ch;  // the window: chunks base - dir (1 + lane)
        for (;;) {
            const int p = base - dir * (1 + lane), in = p >= 0 && p < k->nch;
            // (past the chain's first chunk, which publishes SC_INC at once: nothing, counted as SC_INC)
            const int f = in ? *(volatile int *)(q->flag + ((size_t)b * k->nch + p) * k->tiles + tile) : SC_INC;
            const unsigned inc = __ballot_sync(0xffffffffu, f == SC_INC), none = __ballot_sync(0xffffffffu, f == 0);
            if (inc) {
                const int li = __ffs(inc) - 1;
                if (!(none & ((1u << li) - 1u))) {
                    if (lane == 0) from = base - dir * (1 + li);
                    break;
                }
            } else if (!none) {
                base -= 32 * dir;
            }
        }
        __threadfence();
    }
    __syncthreads();
    const int p0 = from;
    const size_t e0 = (size_t)b * k->nch * k->Cp + c;
    float v = __ldcg(q->inc + e0 + (size_t)p0 * k->Cp);
#pragma unroll 8
    for (int p = p0 + dir; p != ch; p += dir) {
        const float A = __ldcg(q->am1 + e0 + (size_t)p * k->Cp), l = __ldcg(q->end + e0 + (size_t)p * k->Cp);
        v = fmaf(A, v, v + l);
    }
    return v;
}

// The block's (sequence, chunk, tile): from its ticket where the sequence is chained, in chain order
// (rev: the last chunk first), else from blockIdx.
static __device__ void sc_place(const ScanK *k, const ScChain *q, int rev, int *b, int *ch, int *tile) {
    const int id = k->nch > 1 ? sc_ticket(q) : (int)blockIdx.x;
    *tile = id % k->tiles;
    *ch = id / k->tiles % k->nch;
    *b = id / (k->tiles * k->nch);
    if (rev) *ch = k->nch - 1 - *ch;
}

// Forward, one pass: the chunk's gates (a - 1 and b = sqrt(1 - a^2) sigmoid(i) x a token) into registers
// and its aggregate from the zero state (A - 1, A the product of its a, kept exact where a is within
// rounding of 1; hl its end state) published; its incoming state from the chain (s0 or zero for the
// first chunk), its end state published; then y by the walk from the incoming state. With y NULL (the
// backward's first pass) only the chain: the last chunk, whose end nobody reads, does nothing.
static __global__ void __launch_bounds__(SC_CT) rg_fwd_kernel(const ScanK k) {
    extern __shared__ __align__(16) unsigned char sc_smem[];
    grid_wait();
    int b, ch, tile;
    sc_place(&k, &k.fc, 0, &b, &ch, &tile);
    if (!k.y && ch == k.nch - 1) return;  // (uniform over the block)
    const int c = tile * SC_CT + threadIdx.x, on = c < k.C;
    const float coef = on ? -8.0f * softplusf_(k.w[c]) : 0.0f;
    float hin = 0.0f;
    if (ch == 0 && on && k.s0 && !k.reset) hin = k.s0[(size_t)b * k.C + c];
    rg_load(&k, sc_smem, 3, ch, b, tile);
    bf16 *xs = (bf16 *)sc_smem;
    const bf16 *rs = xs + SC_L * SC_CT, *is = rs + SC_L * SC_CT;
    const int t0 = ch * SC_L, n = k.T - t0 < SC_L ? k.T - t0 : SC_L;
    float am1v[SC_L], bv[SC_L], hl = 0.0f, Am1 = 0.0f;
#pragma unroll
    for (int tt = 0; tt < SC_L; tt++) {
        am1v[tt] = 0.0f, bv[tt] = 0.0f;
        if (tt < n) {
            const int o = tt * SC_CT + threadIdx.x;
            const int first = k.reset && t0 + tt == 0;
            rg_gates(ld(rs, o), coef, first, &am1v[tt], &bv[tt]);
            bv[tt] *= sigmoidf_(ld(is, o)) * ld(xs, o);
            hl = first ? bv[tt] : fmaf(am1v[tt], hl, hl + bv[tt]);
            Am1 = first ? -1.0f : fmaf(Am1, am1v[tt], Am1 + am1v[tt]);  // (1 + A')(1 + a') - 1
        }
    }
    if (k.nch > 1) {
        const size_t e = ((size_t)b * k.nch + ch) * k.Cp + c, f = ((size_t)b * k.nch + ch) * k.tiles + tile;
        if (ch > 0) {
            k.fc.am1[e] = Am1;
            k.fc.end[e] = hl;
            sc_publish(&k.fc, f, SC_AGG);
            hin = sc_look_back(&k, &k.fc, b, tile, c, ch, 1);
        }
        if (ch < k.nch - 1) {
            k.fc.inc[e] = fmaf(Am1, hin, hin + hl);
            sc_publish(&k.fc, f, SC_INC);
        }
    }
    if (!k.y) return;
    float h = hin;
#pragma unroll
    for (int tt = 0; tt < SC_L; tt++) {
        if (tt < n) {
            const int first = k.reset && t0 + tt == 0;
            h = first ? bv[tt] : fmaf(am1v[tt], h, h + bv[tt]);  // a h + b
            st(xs, tt * SC_CT + threadIdx.x, h);  // (over this thread's own x)
        }
    }
    if (k.sT && on && ch == k.nch - 1) k.sT[(size_t)b * k.C + c] = h;
    __syncthreads();
    rg_store(&k, k.y, xs, b, tile, t0, n);
}

// Backward, one pass after rg_fwd_kernel's chain (fc.inc: each chunk's end state), the chunks taken from
// the last: the chunk's states h_{t-1} recomputed from its incoming state into registers with its a - 1;
// the adjoint it hands back from a zero incoming one (cl = sum_t a_t0 .. a_t dy_t) published with A - 1;
// the adjoint carried in from the chunks after it from the backward chain (zero for the last), and
// the adjoint it hands back published; then the walk back, the gradients written over x, r, i in
// shared memory and stored from there.
static __global__ void __launch_bounds__(SC_CT) rg_bwd_kernel(const ScanK k) {
    extern __shared__ __align__(16) unsigned char sc_smem[];
    grid_wait();
    int b, ch, tile;
    sc_place(&k, &k.bc, 1, &b, &ch, &tile);
    const int c = tile * SC_CT + threadIdx.x, on = c < k.C;
    const float wc = on ? k.w[c] : 0.0f, sp = softplusf_(wc), coef = -8.0f * sp, sw = sigmoidf_(wc);
    float h = ch > 0 ? k.fc.inc[((size_t)b * k.nch + ch - 1) * k.Cp + c] : 0.0f;
    rg_load(&k, sc_smem, 4, ch, b, tile);
    bf16 *xs = (bf16 *)sc_smem, *rs = xs + SC_L * SC_CT, *is = rs + SC_L * SC_CT;
    const bf16 *dys = is + SC_L * SC_CT;
    const int t0 = ch * SC_L, n = k.T - t0 < SC_L ? k.T - t0 : SC_L;
    float hp[SC_L], am1v[SC_L], Am1 = 0.0f;  // h_{t-1} and a_t - 1 of the chunk's tokens
#pragma unroll
    for (int tt = 0; tt < SC_L; tt++) {
        hp[tt] = h, am1v[tt] = 0.0f;
        if (tt < n) {
            const int o = tt * SC_CT + threadIdx.x;
            const int first = k.reset && t0 + tt == 0;
            float m;
            rg_gates(ld(rs, o), coef, first, &am1v[tt], &m);
            const float bt = m * sigmoidf_(ld(is, o)) * ld(xs, o);
            h = first ? bt : fmaf(am1v[tt], h, h + bt);
            Am1 = first ? -1.0f : fmaf(Am1, am1v[tt], Am1 + am1v[tt]);
        }
    }
    float dhc = 0.0f;  // a_{t+1} dh_{t+1}: from the chunks after this one
    if (k.nch > 1) {
        float cl = 0.0f;
#pragma unroll
        for (int tt = SC_L - 1; tt >= 0; tt--) {
            if (tt < n) {
                const float dh = ld(dys, tt * SC_CT + threadIdx.x) + cl;
                cl = fmaf(am1v[tt], dh, dh);
            }
        }
        const size_t e = ((size_t)b * k.nch + ch) * k.Cp + c, f = ((size_t)b * k.nch + ch) * k.tiles + tile;
        if (ch < k.nch - 1) {
            k.bc.am1[e] = Am1;
            k.bc.end[e] = cl;
            sc_publish(&k.bc, f, SC_AGG);
            dhc = sc_look_back(&k, &k.bc, b, tile, c, ch, -1);
        }
        if (ch > 0) {
            k.bc.inc[e] = fmaf(Am1, dhc, dhc + cl);
            sc_publish(&k.bc, f, SC_INC);
        }
    }
    float dw = 0.0f;  // the chunk's part of dw
#pragma unroll
    for (int tt = SC_L - 1; tt >= 0; tt--) {
        if (tt < n) {
            const int o = tt * SC_CT + threadIdx.x;
            const int first = k.reset && t0 + tt == 0;
            const float x = ld(xs, o), ig = sigmoidf_(ld(is, o)), dh = ld(dys, o) + dhc;
            const float am1 = am1v[tt];
            float dr = 0.0f, m = 1.0f;
            if (!first) {
                const float rg = sigmoidf_(ld(rs, o));
                const float a = 1.0f + am1, u = fmaxf(-am1 * (2.0f + am1), 0.0f);
                m = sqrtf(u);
                const float dm = dh * ig * x;
                const float du = dm * rsqrtf(fmaxf(4.0f * u, SC_MAXGRAD2));
                const float dla = a * (dh * hp[tt] - 2.0f * a * du);  // d/dla of a h_{t-1} + sqrt(1 - a^2) i x
                dr = dla * coef * rg * (1.0f - rg);
                dw += dla * -8.0f * rg * sw;
            }
            st(xs, o, dh * m * ig);  // dx, di, dr over this thread's own x, i, r
            st(is, o, dh * m * x * ig * (1.0f - ig));
            st(rs, o, dr);
            dhc = fmaf(am1, dh, dh);  // a dh
        }
    }
    if (on) k.part[((size_t)b * k.nch + ch) * 2 * k.C + c] = dw;
    __syncthreads();
    rg_store(&k, k.dx, xs, b, tile, t0, n);
    rg_store(&k, k.di, is, b, tile, t0, n);
    rg_store(&k, k.dr, rs, b, tile, t0, n);
}

// The chunks' incoming states from their summaries, in chunk order from s0 (or zero), sT the last
// chunk's end; where sc is given, likewise the adjoints carried into each chunk from its end, in
// reverse order from zero. In place: sh[j] becomes chunk j's incoming state, sc[j] its incoming
// adjoint. A thread a (sequence, slot, channel): T / chunk steps, in a fixed order.
static __global__ void sc_combine_kernel(const ScanK k) {
    grid_wait();
    const size_t total = (size_t)k.B * SC_N * k.C;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        const int c = (int)(e % k.C), j = (int)(e / k.C % SC_N), b = (int)(e / ((size_t)k.C * SC_N));
        const size_t step = (size_t)SC_N * k.Cp, e0 = ((size_t)b * k.nch * SC_N + j) * k.Cp + c;
        float h = k.s0 && j < k.N ? k.s0[((size_t)b * k.C + c) * k.N + j] : 0.0f;
#pragma unroll 4
        for (int ch = 0; ch < k.nch; ch++) {
            const size_t i = e0 + ch * step;
            const float A = k.sa[i], hl = k.sh[i];
            k.sh[i] = h;
            h = fmaf(A, h, hl);
        }
        if (k.sT && j < k.N) k.sT[((size_t)b * k.C + c) * k.N + j] = h;
        if (k.sc) {
            float g = 0.0f;
#pragma unroll 4
            for (int ch = k.nch - 1; ch >= 0; ch--) {
                const size_t i = e0 + ch * step;
                const float A = k.sa[i], cl = k.sc[i];
                k.sc[i] = g;
                g = fmaf(A, g, cl);
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
    const int nin = k.dy ? 3 : 2, sb = sc_stage_bytes(nin, 1, 0);
    LhKq *f = (LhKq *)(sc_smem + SC_ST * sb);
    const float wb = on ? k.w[c] : 0.0f;
    int s0;
    const int ns = lh_chunk(&k, &s0);
    float S[SC_N], A[SC_N], cl[SC_N];
#pragma unroll
    for (int j = 0; j < SC_N; j++) S[j] = 0.0f, A[j] = 1.0f, cl[j] = 0.0f;
    for (int i = 0; i < SC_ST - 1; i++) {
        if (i < ns) sc_issue(&k, sc_smem + i * sb, k.x, k.r, k.dy, NULL, nin, 1, 0, s0 + i, b, blockIdx.x);
        cp_async_commit();
    }
    for (int i = 0; i < ns; i++) {
        cp_async_wait1();
        __syncthreads();
        if (i + SC_ST - 1 < ns)
            sc_issue(&k, sc_smem + (i + SC_ST - 1) % SC_ST * sb, k.x, k.r, k.dy, NULL, nin, 1, 0, s0 + i + SC_ST - 1, b, blockIdx.x);
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
    const int sb = sc_stage_bytes(2, 1, 0);
    LhKq *f = (LhKq *)(sc_smem + SC_ST * sb);
    const float wb = on ? k.w[c] : 0.0f, skip = on ? k.skip[c] : 0.0f;
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
        if (i < ns) sc_issue(&k, sc_smem + i * sb, k.x, k.r, NULL, NULL, 2, 1, 0, s0 + i, b, blockIdx.x);
        cp_async_commit();
    }
    for (int i = 0; i < ns; i++) {
        const int s = s0 + i;
        cp_async_wait1();
        __syncthreads();
        if (i + SC_ST - 1 < ns)
            sc_issue(&k, sc_smem + (i + SC_ST - 1) % SC_ST * sb, k.x, k.r, NULL, NULL, 2, 1, 0, s + SC_ST - 1, b, blockIdx.x);
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
    const int sb = sc_stage_bytes(3, 1, SC_N);
    LhKq *f = (LhKq *)(sc_smem + SC_ST * sb);
    float *sub = (float *)(f + 1);             // [SC_L / SC_SB][SC_N][SC_CT]: the states every SC_SB tokens
    float *red = sub + SC_L / SC_SB * SC_N * SC_CT;  // [SC_NW][SC_L][SC_RED]: the warps' sums over channels
    const float wb = on ? k.w[c] : 0.0f, skip = on ? k.skip[c] : 0.0f;
    int s0;
    const int ns = lh_chunk(&k, &s0), se = s0 + ns;  // the chunk's stages, walked from the last
    float dSc[SC_N];  // a_{t+1} dS_{t+1}, from the chunks after this one (sc; zero where NULL)
#pragma unroll
    for (int j = 0; j < SC_N; j++)
        dSc[j] = on && k.sc ? k.sc[(((size_t)b * k.nch + blockIdx.y) * SC_N + j) * k.Cp + c] : 0.0f;
    float dw = 0.0f, dskip = 0.0f;
    for (int i = 0; i < SC_ST - 1; i++) {
        if (i < ns) sc_issue(&k, sc_smem + i * sb, k.x, k.r, k.dy, NULL, 3, 1, SC_N, se - 1 - i, b, blockIdx.x);
        cp_async_commit();
    }
    for (int i = 0; i < ns; i++) {
        const int s = se - 1 - i;
        cp_async_wait1();
        __syncthreads();
        if (i + SC_ST - 1 < ns)
            sc_issue(&k, sc_smem + (i + SC_ST - 1) % SC_ST * sb, k.x, k.r, k.dy, NULL, 3, 1, SC_N, s - (SC_ST - 1), b, blockIdx.x);
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
// block takes 32 channels, its 8 warps every 8th row each, then the warps' sums in warp order.
#define SC_PR 8
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
                s += part[(size_t)r * 2 * C + C + c];
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
    k.reset = d->kind == SCAN_RGLRU && d->reset;
    k.vec = d->C % 8 == 0 && aligned16(x) && aligned16(r) && (!i || aligned16(i)) && (!dy || aligned16(dy));
    k.kqvec = d->N == SC_N && (!kk || aligned16(kk)) && (!q || aligned16(q));
    return k;
}

typedef void (*ScKernel)(const ScanK);

// Launches a chunk walk: a block per (tile, chunk, sequence), its dynamic shared memory raised past 48 KB once.
static int sc_launch(CudaCtx *c, ScKernel kern, const ScanK *k, size_t smem, int *raised) {
    if (smem > 48 * 1024 && !*raised) {
        CU_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        *raised = 1;
    }
    Launch l;
    CU_TRY(cudaLaunchKernelEx(
        launch_after(&l, c, dim3((unsigned)k->tiles, (unsigned)k->nch, (unsigned)k->B), SC_CT, smem, c->stream), kern,
        *k));
    return MN_OK;
}

static int sc_combine(CudaCtx *c, const ScanK *k) {
    Launch l;
    CU_TRY(cudaLaunchKernelEx(
        launch_after(&l, c, dim3(grid_for((size_t)k->B * SC_N * k->C, 128)), 128, 0, c->stream),
        sc_combine_kernel, *k));
    return MN_OK;
}

static size_t rg_smem(int nin) { return (size_t)sc_stage_bytes(nin, 0, 0); }
static size_t lh_sum_smem(int nin) { return (size_t)SC_ST * sc_stage_bytes(nin, 1, 0) + sizeof(LhKq); }
static size_t lh_bwd_smem(void) {
    return (size_t)SC_ST * sc_stage_bytes(3, 1, SC_N) + sizeof(LhKq) + sizeof(float) * SC_L / SC_SB * SC_N * SC_CT +
           sizeof(float) * SC_NW * SC_L * SC_RED;
}
static int lh_sum_raised, lh_fwd_raised, lh_bwd_raised;

// Longhorn: the chunks' summaries (with the adjoint's where k->dy is set), then their incoming states (and
// adjoints) in place: sa, sh (sc) set.
static int lh_chunk_states(CudaCtx *c, ScanK *k) {
    MN_TRY(sc_launch(c, lh_sum_kernel, k, lh_sum_smem(k->dy ? 3 : 2), &lh_sum_raised));
    return sc_combine(c, k);
}

// Longhorn's walk from the chunks' incoming states: y (and sT where there is one chunk), or the
// checkpoints (k->ckpt, y NULL).
static int lh_walk(CudaCtx *c, const ScanK *k) { return sc_launch(c, lh_fwd_kernel, k, lh_sum_smem(2), &lh_fwd_raised); }

// RG-LRU: a block per (tile, chunk, sequence) on a 1-D grid (the kernels place themselves: sc_place).
static int rg_launch(CudaCtx *c, ScKernel kern, const ScanK *k, int nin) {
    Launch l;
    CU_TRY(cudaLaunchKernelEx(
        launch_after(&l, c, dim3((unsigned)((size_t)k->tiles * k->nch * k->B)), SC_CT, rg_smem(nin), c->stream),
        kern, *k));
    return MN_OK;
}

// The floats of scratch a chain takes (its flags and ticket as as many 4-byte words).
static size_t rg_chain_words(const ScanK *k) {
    return 3 * (size_t)k->B * k->nch * k->Cp + (size_t)k->B * k->nch * k->tiles + 1;
}

// A chain in scratch at p, its flags and ticket zeroed.
static int rg_chain(CudaCtx *c, const ScanK *k, float *p, ScChain *q) {
    const size_t n = (size_t)k->B * k->nch * k->Cp, nf = (size_t)k->B * k->nch * k->tiles;
    q->am1 = p, q->end = p + n, q->inc = p + 2 * n;
    q->flag = (int *)(p + 3 * n);
    q->ticket = q->flag + nf;
    CU_TRY(cudaMemsetAsync(q->flag, 0, sizeof(int) * (nf + 1), c->stream));
    return MN_OK;
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
    k.y = (bf16 *)io->y;
    if (!lh) {  // one pass, the chunks chained (one chunk, decoding among them: no scratch)
        k.ovec = d->C % 8 == 0 && aligned16(io->y);
        if (k.nch > 1) {
            float *ws = (float *)cuda_scratch(be, sizeof(float) * rg_chain_words(&k));
            if (!ws) return MN_ERR_NOMEM;
            MN_TRY(rg_chain(c, &k, ws, &k.fc));
        }
        return rg_launch(c, rg_fwd_kernel, &k, 3);
    }
    if (k.nch > 1) {  // (one chunk, decoding among them: one launch from s0, no scratch)
        const size_t nsum = (size_t)d->B * k.nch * SC_N * k.Cp;
        float *ws = (float *)cuda_scratch(be, sizeof(float) * 2 * nsum);
        if (!ws) return MN_ERR_NOMEM;
        k.sa = ws, k.sh = ws + nsum;
        MN_TRY(lh_chunk_states(c, &k));
        k.sT = NULL;
    }
    return lh_walk(c, &k);
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
    const size_t npart = (size_t)d->B * k.nch * 2 * d->C;
    k.dx = (bf16 *)io->dx, k.dr = (bf16 *)io->dr, k.di = (bf16 *)io->di;
    if (!lh) {  // the states' chain (rg_fwd_kernel, y not written), then the backward with the adjoints' chain
        const size_t nq = k.nch > 1 ? rg_chain_words(&k) : 0;
        float *ws = (float *)cuda_scratch(be, sizeof(float) * (2 * nq + npart));
        if (!ws) return MN_ERR_NOMEM;
        k.part = ws + 2 * nq;
        k.ovec = d->C % 8 == 0 && aligned16(io->dx) && aligned16(io->dr) && aligned16(io->di);
        if (nq) {
            MN_TRY(rg_chain(c, &k, ws, &k.fc));
            MN_TRY(rg_chain(c, &k, ws + nq, &k.bc));
            MN_TRY(rg_launch(c, rg_fwd_kernel, &k, 3));
        }
        MN_TRY(rg_launch(c, rg_bwd_kernel, &k, 4));
    } else {
        const size_t nck = (size_t)d->B * k.nst * SC_N * k.Cp;
        const size_t nsum = k.nch > 1 ? (size_t)d->B * k.nch * SC_N * k.Cp : 0;
        const size_t nred = (size_t)d->B * d->T * k.tiles * SC_RED;
        float *ws = (float *)cuda_scratch(be, sizeof(float) * (nck + 3 * nsum + npart + nred) + 16);
        if (!ws) return MN_ERR_NOMEM;
        k.ckpt = ws;
        k.part = ws + nck + 3 * nsum;
        k.red = k.part + npart;
        if (nsum) {  // each chunk's incoming state and adjoint
            k.sa = ws + nck, k.sh = k.sa + nsum, k.sc = k.sh + nsum;
            MN_TRY(lh_chunk_states(c, &k));
        }
        ScanK f = k;  // the states at the stages' starts, y not written
        f.dy = NULL;
        MN_TRY(lh_walk(c, &f));
        MN_TRY(sc_launch(c, lh_bwd_kernel, &k, lh_bwd_smem(), &lh_bwd_raised));
        const size_t ntok = (size_t)d->B * d->T;
        Launch l;
        CU_TRY(cudaLaunchKernelEx(launch_after(&l, c, dim3(grid_for(ntok * d->N, 256)), 256, 0, c->stream),
                                  lh_dkq_kernel, (const bf16 *)io->k, (const float *)k.red, (bf16 *)io->dk,
                                  (bf16 *)io->dq, ntok, d->N, k.tiles));
    }
    Launch l;
    CU_TRY(cudaLaunchKernelEx(
        launch_after(&l, c, dim3((unsigned)((d->C + 31) / 32)), 32 * SC_PR, 0, c->stream), sc_param_kernel,
        (const float *)k.part, (float *)io->dw, lh ? (float *)io->dskip : (float *)NULL, d->B * k.nch, d->C));
    return MN_OK;
}
