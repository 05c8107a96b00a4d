/*
 * The mLSTM core's chunkwise walk (mlstm_cuda.cu): one kernel body serves the forward and the three
 * walks of the backward. For a pair (sequence, head), chunks of ML_C = 64 tokens, b the chunk's
 * inclusive cumulative log forget gate, a_y = i_y - b_y and M_x = m_x - b_x (m the stabiliser), every
 * walk computes, for the rows x of a chunk,
 *
 *     out_x = s [ sum_y W_xy Sc_xy rc_y C_y + w_x (ra_x X A_x + ae_x Xe) ]
 *     Sc_xy = ra_x rb_y (A_x . B_y) + ae_x be_y
 *     forward direction (y <= x): W_xy = exp(a_y - M_x), w_x = exp(m_e - M_x), u_y = exp(a_y - M_L)
 *     reverse direction (y >= x): W_xy = exp(a_x - M_y), w_x = exp(a_x - M_L), u_y = exp(m_e - M_y)
 *     X <- exp(m_e - M_L) X + sum_y u_y rb_y rc_y C_y B_y^T      (X [Dc slice, Da], fp32, registers)
 *     Xe <- exp(m_e - M_L) Xe + sum_y u_y rc_y be_y C_y
 *
 * with m_e the stabiliser of the token before the chunk (0 before the first) and L the chunk's last
 * token; every exponent is <= 0. The walks (x, y tokens; dnum_t = dh_t / den_t; rinv = 1 / den):
 *
 *     forward  A = q, B = k, C = v, m computed: M_x = max(m_e, max_{y<=x} a_y); out = h (divided by
 *              den_x = max(|nq_x|, exp(-m_x)) + eps, nq_x = s (sum_y W_xy Sc_xy + w_x n . q_x),
 *              n <- exp(m_e - M_L) n + sum_y u_y k_y)
 *     dq       A = dh (ra = rinv), B = v, C = k, ae = dnq, be = 1: out = dq (Xe is then n)
 *     dk (rev) A = v, B = dh (rb = rinv), C = q, ae = 1, be = dnq: out = dk
 *     dv (rev) A = k, B = q, C = dh (rc = rinv): out = dv
 *
 * (xlstm-notes.md 2.4-2.6; the backward's m is the forward's, kept per token.) A block of 4 warps
 * takes one pair and a slice of DCS columns of C (grid: slices x pairs). Per chunk, warp w takes rows
 * x = 16 w .. 16 w + 15: the scores A B^T (mma.sync, bf16, fp32 sums; the 16-row blocks the causal
 * mask zeroes skipped) and the state term A X^T in one pass over k, the weights, P = W Sc rc into A
 * fragments in registers, then P C. The state update runs with warps over (16-row, DA/WN-column)
 * blocks of X, the scale u rb rc applied to C's fragments. Operands are staged by cp.async (16-byte
 * rows) or through registers, two chunks deep; X goes to shared memory as bf16 for the next chunk's
 * A X^T. Every size is a compile-time constant (DA: the padded contraction size 64, 128 or 256; DCS:
 * 32 or 64); heads are padded with zeros. A wider contraction runs as walks over column slices of A
 * and B (mlstm_cuda.cu's ml_walk2): out, and the forward's n.q, are linear in A B^T and in the state
 * over them, so a first walk stores its float32 partials (part: the sums before the scale and den;
 * pnq: s n.q) and the second adds them before den, the scaling and out's one rounding.
 */
#ifndef MN_MLSTM_CHUNK_CUH
#define MN_MLSTM_CHUNK_CUH

#include "cuda_common.cuh"
#include "mma.cuh"

#define ML_C 64
#define ML_THREADS 128

typedef struct {
    const bf16 *a, *b, *c;      // [B,T,H,Da], [B,T,H,Da], [B,T,H,Dc]
    const float *fg, *ig, *m;   // [B,T,H]; m: the forward's stabiliser (NULL in the forward: computed)
    const float *rs, *ex;       // per-token scale and extra term (NULL: none)
    int rs_side, ex_side;       // rs: 1 A (ra), 2 B (rb), 3 C (rc); ex: 1 ae = ex, be = 1; 2 ae = 1, be = ex
    const float *c0, *n0, *m0;  // forward: the initial state [pairs,Dc,lda], [pairs,lda], [pairs] (NULL: zero): its
                                // columns 0 .. Da - 1 (rows lda apart; the pointers offset to the slice's first)
    bf16 *out;                  // [B,T,H,Dc]
    float *nq, *mo;             // forward: s n.q and m per token (NULL: not kept)
    float *cT, *nT, *mT;        // forward: the final state (NULL: not kept), columns as c0's, n0's
    const bf16 *dotw;           // [B,T,H,Dc]: out . dotw per token and slice into dotp (NULL: none)
    float *dotp;                // [slices][B*T*H]
    int B, T, H, Da, Dc;
    int lda;                    // the row stride of a and b (0: Da); Da may be a column slice of wider rows
    float *part;                // [B,T,H,Dc] float32 partial outputs (NULL: none): with part_out, out's values
    int part_out;               // are stored there (nothing else written); without, added to out's first
    float *pnq;                 // forward with part: [B,T,H] the partial s n.q (with part_out stored, else added
                                // before den); part holds the sums before the scale s and the division by den
    int vec_ab, vec_c;          // rows of a, b (c) can be copied 16 bytes at a time
    float scale, eps;
} MlWalk;

// A bf16 pair (a 32-bit word, low half first) as floats, and back.
static __device__ __forceinline__ float ml_lo(uint32_t u) { return __uint_as_float(u << 16); }
static __device__ __forceinline__ float ml_hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }
static __device__ __forceinline__ uint32_t ml_scale2(uint32_t u, float s0, float s1) {
    return pack_bf16(ml_lo(u) * s0, ml_hi(u) * s1);
}

// Rows 0..63 (tokens t0 ..) and columns c0 .. c0 + W - 1 of src [B,T,H,D] (rows ld_src apart) into dst (row stride lds),
// zero past T and past D: 16-byte cp.async copies where vec (D % 8 == 0 and src 16-byte aligned),
// else through registers.
static __device__ __forceinline__ void ml_load(bf16 *dst, int lds, const bf16 *src, int ld_src, int D, int c0, const int W,
                                               size_t tok0, int H, int t0, int T, int vec) {
    if (vec) {
        const int n8 = W / 8;
        for (int e = threadIdx.x; e < ML_C * n8; e += ML_THREADS) {
            const int y = e / n8, j = 8 * (e - y * n8), col = c0 + j, ok = t0 + y < T && col < D;
            const bf16 *p = ok ? src + (tok0 + (size_t)(t0 + y) * H) * ld_src + col : src;
            cp_async16(dst + y * lds + j, p, ok ? 16 : 0);
        }
    } else {
        for (int e = threadIdx.x; e < ML_C * W; e += ML_THREADS) {
            const int y = e / W, j = e - y * W, col = c0 + j;
            float v = t0 + y < T && col < D ? ld(src, (tok0 + (size_t)(t0 + y) * H) * ld_src + col) : 0.0f;
            st(dst, (size_t)y * lds + j, v);
        }
    }
}

// The per-token scalars of a chunk as warp 0 holds them: lane l has tokens 2 l, 2 l + 1.
typedef struct {
    float f[2], i[2], m[2], rs[2], ex[2], me;
} MlTok;

static __device__ __forceinline__ void ml_tok_load(MlTok *s, const MlWalk &k, size_t tok0, int t0, const int FWD) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const int t = t0 + 2 * lane + j, ok = t < k.T;
        const size_t ti = tok0 + (size_t)(ok ? t : 0) * k.H;
        s->f[j] = ok ? k.fg[ti] : 0.0f;
        s->i[j] = ok ? k.ig[ti] : -INFINITY;
        s->m[j] = !FWD && ok ? k.m[ti] : 0.0f;
        s->rs[j] = k.rs && ok ? k.rs[ti] : 1.0f;
        s->ex[j] = k.ex && ok ? k.ex[ti] : 0.0f;
    }
    s->me = !FWD && t0 > 0 ? k.m[tok0 + (size_t)(t0 - 1) * k.H] : 0.0f;
}

// Scalar arrays of a chunk in shared memory: sc[ML_SC_*][64], by token (x as a row, y as a column):
// the weights' exponents and every per-token factor of the products, so that the products' epilogues
// read them without testing which walk they are in.
#define ML_SC_RE 0  // row exponent: M_x (forward direction) or a_x (reverse)
#define ML_SC_CE 1  // column exponent: a_y or M_y; W_xy = exp(CE_y - RE_x) (forward), exp(RE_x - CE_y) (reverse)
#define ML_SC_W 2   // w_x, the state term's weight
#define ML_SC_U 3   // u_y, the update's weight (times rb_y rc_y: the scale of C's rows in the update)
#define ML_SC_RA 4  // ra_x (1 where the walk has none)
#define ML_SC_RB 5  // rb_y
#define ML_SC_RC 6  // rc_y
#define ML_SC_EA 7  // ae_x (0 where there is no extra term)
#define ML_SC_EB 8  // be_y
#define ML_SC_MX 9  // m_x (forward)
#define ML_SC_XE 10 // u_y rc_y be_y: the extra row's update weight
#define ML_SC_N 12

// Warp 0: the chunk's gate scalars into sc (and exp(m_e - M_L) into *dec); the forward's m_e (the
// stabiliser before the chunk) in, the chunk's last m out.
static __device__ __forceinline__ float ml_gates(const MlTok &s, float me, int t0, int T, int rs_side, int ex_side,
                                                 float *sc, float *dec, const int REV, const int FWD) {
    const int lane = threadIdx.x & 31;
    if (!FWD) me = s.me;
    float x = s.f[0] + s.f[1], inc = x;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        float v = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += v;
    }
    float b[2], a[2], M[2];
    b[0] = inc - x + s.f[0];
    b[1] = b[0] + s.f[1];
#pragma unroll
    for (int j = 0; j < 2; j++) a[j] = t0 + 2 * lane + j < T ? s.i[j] - b[j] : -INFINITY;
    if (FWD) {
        float pm = fmaxf(a[0], a[1]);
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            float v = __shfl_up_sync(0xffffffffu, pm, o);
            if (lane >= o) pm = fmaxf(pm, v);
        }
        float ex = __shfl_up_sync(0xffffffffu, pm, 1);
        if (lane == 0) ex = -INFINITY;
        M[0] = fmaxf(me, fmaxf(ex, a[0]));
        M[1] = fmaxf(M[0], a[1]);
    } else {
#pragma unroll
        for (int j = 0; j < 2; j++) M[j] = t0 + 2 * lane + j < T ? s.m[j] - b[j] : INFINITY;
    }
    const int L = min(ML_C - 1, T - 1 - t0);
    const float ML = __shfl_sync(0xffffffffu, (L & 1) ? M[1] : M[0], L >> 1);
    const float bL = __shfl_sync(0xffffffffu, (L & 1) ? b[1] : b[0], L >> 1);
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const int y = 2 * lane + j;
        const float rb = rs_side == 2 ? s.rs[j] : 1.0f, rc = rs_side == 3 ? s.rs[j] : 1.0f;
        const float be = ex_side == 2 ? s.ex[j] : ex_side == 1 ? 1.0f : 0.0f;
        const float u = REV ? expf(me - M[j]) : expf(a[j] - ML);
        sc[ML_SC_RE * ML_C + y] = REV ? a[j] : M[j];
        sc[ML_SC_CE * ML_C + y] = REV ? M[j] : a[j];
        sc[ML_SC_W * ML_C + y] = REV ? expf(a[j] - ML) : expf(me - M[j]);
        sc[ML_SC_U * ML_C + y] = u * rb * rc;
        sc[ML_SC_RA * ML_C + y] = rs_side == 1 ? s.rs[j] : 1.0f;
        sc[ML_SC_RB * ML_C + y] = rb;
        sc[ML_SC_RC * ML_C + y] = rc;
        sc[ML_SC_EA * ML_C + y] = ex_side == 1 ? s.ex[j] : ex_side == 2 ? 1.0f : 0.0f;
        sc[ML_SC_EB * ML_C + y] = be;
        sc[ML_SC_MX * ML_C + y] = b[j] + M[j];
        sc[ML_SC_XE * ML_C + y] = u * rc * be;
    }
    if (lane == 0) *dec = expf(me - ML);
    return bL + ML;
}

// Dynamic shared memory of a walk block, in bytes.
#define ML_SMEM(DA, DCS) \
    ((2 * (2 * ML_C * ((DA) + 8) + ML_C * ((DCS) + 8)) + (DCS) * ((DA) + 8)) * 2 + (2 * ML_SC_N * ML_C + (DA) + (DCS) + 4) * 4)

static __device__ __forceinline__ void ml_walk(const MlWalk k, const int DA, const int DCS, const int REV,
                                               const int FWD) {
    extern __shared__ __align__(16) unsigned char ml_smem[];
    const int LDA = DA + 8, LDC = DCS + 8, STAGE = 2 * ML_C * LDA + ML_C * LDC;
    bf16 *const stg = (bf16 *)ml_smem, *const Xs = stg + 2 * STAGE;
    float *const scb = (float *)(Xs + DCS * LDA), *const nv = scb + 2 * ML_SC_N * ML_C, *const xe = nv + DA,
                 *const dec = xe + DCS;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, lr = lane >> 2, lc = 2 * (lane & 3);
    const int slice = blockIdx.x, pair = blockIdx.y, c0s = slice * DCS, H = k.H, T = k.T;
    const size_t tok0 = (size_t)(pair / H) * T * H + (size_t)(pair % H);
    const int NCH = (T + ML_C - 1) / ML_C;
    const int WM = DCS / 16, WN = 4 / WM, wm = w % WM, dbase = (w / WM) * (DA / WN), NTX = DA / WN / 8;

    // the state slice: rows c = 16 wm + .., columns d = dbase + 8 nt + ..
    float xacc[16][4];
#pragma unroll
    for (int nt = 0; nt < NTX; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int c = 16 * wm + lr + 8 * (e >> 1), d = dbase + 8 * nt + lc + (e & 1);
            xacc[nt][e] = FWD && k.c0 && c0s + c < k.Dc && d < k.Da ? k.c0[((size_t)pair * k.Dc + c0s + c) * k.lda + d]
                                                                    : 0.0f;
        }
#pragma unroll
    for (int nt = 0; nt < NTX; nt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int c = 16 * wm + lr + 8 * h, d = dbase + 8 * nt + lc;
            *(uint32_t *)(Xs + c * LDA + d) = pack_bf16(xacc[nt][2 * h], xacc[nt][2 * h + 1]);
        }
    for (int d = tid; d < DA; d += ML_THREADS) nv[d] = FWD && k.n0 && d < k.Da ? k.n0[(size_t)pair * k.lda + d] : 0.0f;
    for (int c = tid; c < DCS; c += ML_THREADS) xe[c] = 0.0f;

    float me = FWD && k.m0 ? k.m0[pair] : 0.0f;  // (warp 0) the forward's stabiliser before the chunk
    MlTok tk;
    {
        const int ch = REV ? NCH - 1 : 0;
        ml_load(stg, LDA, k.a, k.lda, k.Da, 0, DA, tok0, H, ch * ML_C, T, k.vec_ab);
        ml_load(stg + ML_C * LDA, LDA, k.b, k.lda, k.Da, 0, DA, tok0, H, ch * ML_C, T, k.vec_ab);
        ml_load(stg + 2 * ML_C * LDA, LDC, k.c, k.Dc, k.Dc, c0s, DCS, tok0, H, ch * ML_C, T, k.vec_c);
        cp_async_commit();
        if (w == 0) {
            ml_tok_load(&tk, k, tok0, ch * ML_C, FWD);
            me = ml_gates(tk, me, ch * ML_C, T, k.rs_side, k.ex_side, scb, dec, REV, FWD);
        }
    }
    for (int it = 0; it < NCH; it++) {
        const int ch = REV ? NCH - 1 - it : it, t0 = ch * ML_C, buf = it & 1, more = it + 1 < NCH;
        const int nch = REV ? ch - 1 : ch + 1;
        if (more) {
            bf16 *s = stg + (buf ^ 1) * STAGE;
            ml_load(s, LDA, k.a, k.lda, k.Da, 0, DA, tok0, H, nch * ML_C, T, k.vec_ab);
            ml_load(s + ML_C * LDA, LDA, k.b, k.lda, k.Da, 0, DA, tok0, H, nch * ML_C, T, k.vec_ab);
            ml_load(s + 2 * ML_C * LDA, LDC, k.c, k.Dc, k.Dc, c0s, DCS, tok0, H, nch * ML_C, T, k.vec_c);
            if (w == 0) ml_tok_load(&tk, k, tok0, nch * ML_C, FWD);
        }
        cp_async_commit();
        cp_async_wait1();
        __syncthreads();
        const bf16 *At = stg + buf * STAGE, *Bt = At + ML_C * LDA, *Ct = Bt + ML_C * LDA;
        const float *sc = scb + buf * ML_SC_N * ML_C;
        // the dot products' other factor (q for dq, k for dk) fetched now, used after the products
        uint32_t dw[8][2];  // (DCS / 8 used)
        const int dwpair = !FWD && k.dotw && (k.Dc & 1) == 0;
        if (dwpair)
#pragma unroll
            for (int ct = 0; ct < DCS / 8; ct++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int x = 16 * w + lr + 8 * h, c = c0s + 8 * ct + lc;
                    dw[ct][h] = t0 + x < T && c < k.Dc
                                    ? *(const uint32_t *)(k.dotw + (tok0 + (size_t)(t0 + x) * H) * k.Dc + c)
                                    : 0u;
                }
        // scores and the state term, one pass over k
        float sacc[8][4], oacc[8][4];
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) sacc[n][e] = oacc[n][e] = 0.0f;
        const int plo = REV ? w : 0, phi = REV ? 3 : w;  // 16-column blocks of the scores the mask keeps
#pragma unroll 2
        for (int ks = 0; ks < DA / 16; ks++) {
            uint32_t af[4], bq[4];
            ldsm_x4(af, At + (16 * w + (lane & 15)) * LDA + 16 * ks + (lane >> 4) * 8);
#pragma unroll
            for (int np = 0; np < 4; np++) {
                if (np < plo || np > phi) continue;
                ldsm_x4(bq, Bt + (16 * np + (lane & 7) + ((lane >> 4) << 3)) * LDA + 16 * ks + ((lane >> 3) & 1) * 8);
                mma_bf16(sacc[2 * np], af, bq[0], bq[1]);
                mma_bf16(sacc[2 * np + 1], af, bq[2], bq[3]);
            }
#pragma unroll
            for (int np = 0; np < DCS / 16; np++) {
                ldsm_x4(bq, Xs + (16 * np + (lane & 7) + ((lane >> 4) << 3)) * LDA + 16 * ks + ((lane >> 3) & 1) * 8);
                mma_bf16(oacc[2 * np], af, bq[0], bq[1]);
                mma_bf16(oacc[2 * np + 1], af, bq[2], bq[3]);
            }
        }
        // the weights: P = W Sc rc (zero outside the mask), and the forward's row sums of W Sc
        float rsum[2] = {0.0f, 0.0f};
        const int xr[2] = {16 * w + lr, 16 * w + lr + 8};
        float re[2], ra[2], ea[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            re[h] = sc[ML_SC_RE * ML_C + xr[h]];
            ra[h] = sc[ML_SC_RA * ML_C + xr[h]];
            ea[h] = sc[ML_SC_EA * ML_C + xr[h]];
        }
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
            if (nt / 2 < plo || nt / 2 > phi) continue;
            const int y0 = 8 * nt + lc;
            const float2 ce = *(const float2 *)(sc + ML_SC_CE * ML_C + y0), rb = *(const float2 *)(sc + ML_SC_RB * ML_C + y0);
            const float2 eb = *(const float2 *)(sc + ML_SC_EB * ML_C + y0), rc = *(const float2 *)(sc + ML_SC_RC * ML_C + y0);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int h = e >> 1, x = xr[h], y = y0 + (e & 1), keep = REV ? y >= x : y <= x;
                const float cy = (e & 1) ? ce.y : ce.x, by = (e & 1) ? rb.y : rb.x, ey = (e & 1) ? eb.y : eb.x;
                const float ry = (e & 1) ? rc.y : rc.x;
                const float W = keep ? __expf(REV ? re[h] - cy : cy - re[h]) : 0.0f;
                const float v = W * fmaf(sacc[nt][e] * ra[h], by, ea[h] * ey);
                if (FWD) rsum[h] += v;
                sacc[nt][e] = v * ry;
            }
        }
        // the state term's row weights, and the extra row
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float wx = sc[ML_SC_W * ML_C + xr[h]];
#pragma unroll
            for (int ct = 0; ct < DCS / 8; ct++)
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    const int c = 8 * ct + lc + j;
                    oacc[ct][2 * h + j] = wx * fmaf(oacc[ct][2 * h + j], ra[h], k.ex_side ? ea[h] * xe[c] : 0.0f);
                }
        }
        // + P C
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            if (kk < plo || kk > phi) continue;
            uint32_t pa[4] = {pack_bf16(sacc[2 * kk][0], sacc[2 * kk][1]), pack_bf16(sacc[2 * kk][2], sacc[2 * kk][3]),
                              pack_bf16(sacc[2 * kk + 1][0], sacc[2 * kk + 1][1]),
                              pack_bf16(sacc[2 * kk + 1][2], sacc[2 * kk + 1][3])};
#pragma unroll
            for (int np = 0; np < DCS / 16; np++) {
                uint32_t bv[4];
                ldsm_x4_t(bv, Ct + (16 * kk + (lane & 7) + ((lane >> 3) & 1) * 8) * LDC + 16 * np + (lane >> 4) * 8);
                mma_bf16(oacc[2 * np], pa, bv[0], bv[1]);
                mma_bf16(oacc[2 * np + 1], pa, bv[2], bv[3]);
            }
        }
        // the outputs of rows x (lanes of a quad share a row): (out + part) s (/ den: the forward)
        float rscale[2] = {k.scale, k.scale};
        if (FWD) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int x = xr[h], q4 = lane & 3;
                float na = 0.0f;
                for (int d = q4 * (DA / 4); d < (q4 + 1) * (DA / 4); d += 2) {
                    uint32_t u = *(const uint32_t *)(At + x * LDA + d);
                    na = fmaf(ml_lo(u), nv[d], fmaf(ml_hi(u), nv[d + 1], na));
                }
                float r = rsum[h];
                r += __shfl_xor_sync(0xffffffffu, r, 1);
                r += __shfl_xor_sync(0xffffffffu, r, 2);
                na += __shfl_xor_sync(0xffffffffu, na, 1);
                na += __shfl_xor_sync(0xffffffffu, na, 2);
                float nq = k.scale * (r + sc[ML_SC_W * ML_C + x] * na);
                const float mx = sc[ML_SC_MX * ML_C + x];
                if (k.pnq && t0 + x < T) {
                    float *p = k.pnq + tok0 + (size_t)(t0 + x) * H;
                    if (!k.part_out) nq += *p;
                    else if (slice == 0 && q4 == 0) *p = nq;
                }
                rscale[h] = k.scale / (fmaxf(fabsf(nq), __expf(-mx)) + k.eps);
                if (slice == 0 && q4 == 0 && t0 + x < T) {
                    const size_t ti = tok0 + (size_t)(t0 + x) * H;
                    if (k.nq) k.nq[ti] = nq;
                    if (k.mo) k.mo[ti] = mx;
                }
            }
        }
        float dots[2] = {0.0f, 0.0f};
#pragma unroll
        for (int ct = 0; ct < DCS / 8; ct++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int x = xr[h], c = c0s + 8 * ct + lc;
                if (t0 + x >= T || c >= k.Dc) continue;
                const size_t o = (tok0 + (size_t)(t0 + x) * H) * k.Dc + c;
                float v0 = oacc[ct][2 * h], v1 = oacc[ct][2 * h + 1];
                const int two = c + 1 < k.Dc;
                if (k.part) {
                    if (k.part_out) {
                        k.part[o] = v0;
                        if (two) k.part[o + 1] = v1;
                        continue;
                    }
                    v0 += k.part[o];
                    if (two) v1 += k.part[o + 1];
                }
                v0 *= rscale[h];
                v1 *= rscale[h];
                if (two && (k.Dc & 1) == 0) {
                    *(uint32_t *)(k.out + o) = pack_bf16(v0, v1);
                } else {
                    st(k.out, o, v0);
                    if (two) st(k.out, o + 1, v1);
                }
                if (dwpair) dots[h] += v0 * ml_lo(dw[ct][h]) + v1 * ml_hi(dw[ct][h]);
                else if (k.dotw) dots[h] += v0 * ld(k.dotw, o) + (two ? v1 * ld(k.dotw, o + 1) : 0.0f);
            }
        if (k.dotw) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float r = dots[h];
                r += __shfl_xor_sync(0xffffffffu, r, 1);
                r += __shfl_xor_sync(0xffffffffu, r, 2);
                if ((lane & 3) == 0 && t0 + xr[h] < T)
                    k.dotp[(size_t)slice * ((size_t)k.B * T * H) + tok0 + (size_t)(t0 + xr[h]) * H] = r;
            }
        }
        __syncthreads();
        // the state update: X = dec X + (u rb rc C)^T B
        const float dc = dec[buf];
#pragma unroll
        for (int nt = 0; nt < NTX; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) xacc[nt][e] *= dc;
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            uint32_t af[4];
            ldsm_x4_t(af, Ct + (16 * kk + (lane & 7) + ((lane >> 4) << 3)) * LDC + 16 * wm + ((lane >> 3) & 1) * 8);
            float us[4];
#pragma unroll
            for (int j = 0; j < 4; j++) us[j] = sc[ML_SC_U * ML_C + 16 * kk + lc + (j & 1) + 8 * (j >> 1)];
            af[0] = ml_scale2(af[0], us[0], us[1]);
            af[1] = ml_scale2(af[1], us[0], us[1]);
            af[2] = ml_scale2(af[2], us[2], us[3]);
            af[3] = ml_scale2(af[3], us[2], us[3]);
#pragma unroll
            for (int np = 0; np < NTX / 2; np++) {
                uint32_t bq[4];
                ldsm_x4_t(bq, Bt + (16 * kk + (lane & 7) + ((lane >> 3) & 1) * 8) * LDA + dbase + 16 * np + (lane >> 4) * 8);
                mma_bf16(xacc[2 * np], af, bq[0], bq[1]);
                mma_bf16(xacc[2 * np + 1], af, bq[2], bq[3]);
            }
        }
#pragma unroll
        for (int nt = 0; nt < NTX; nt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int c = 16 * wm + lr + 8 * h, d = dbase + 8 * nt + lc;
                *(uint32_t *)(Xs + c * LDA + d) = pack_bf16(xacc[nt][2 * h], xacc[nt][2 * h + 1]);
            }
        // the extra row (Xe) and the forward's n: column sums over the chunk, four partial sums each
        if (k.ex_side)
            for (int c = tid; c < DCS; c += ML_THREADS) {
                float a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 4
                for (int y = 0; y < ML_C; y++) a[y & 3] = fmaf(sc[ML_SC_XE * ML_C + y], ld(Ct, (size_t)y * LDC + c), a[y & 3]);
                xe[c] = dc * xe[c] + ((a[0] + a[1]) + (a[2] + a[3]));
            }
        if (FWD)
            for (int d = tid; d < DA; d += ML_THREADS) {
                float a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 4
                for (int y = 0; y < ML_C; y++) a[y & 3] = fmaf(sc[ML_SC_U * ML_C + y], ld(Bt, (size_t)y * LDA + d), a[y & 3]);
                nv[d] = dc * nv[d] + ((a[0] + a[1]) + (a[2] + a[3]));
            }
        if (w == 0 && more)
            me = ml_gates(tk, me, nch * ML_C, T, k.rs_side, k.ex_side, scb + (buf ^ 1) * ML_SC_N * ML_C, dec + (buf ^ 1), REV, FWD);
        __syncthreads();
    }
    if (FWD && k.cT) {
        float *const ct = k.cT + ((size_t)pair * k.Dc + c0s) * k.lda;  // the slice's first row
#pragma unroll
        for (int nt = 0; nt < NTX; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int c = 16 * wm + lr + 8 * (e >> 1), d = dbase + 8 * nt + lc + (e & 1);
                if (c0s + c < k.Dc && d < k.Da) ct[(size_t)c * k.lda + d] = xacc[nt][e];
            }
    }
    if (FWD) {
        if (slice == 0 && k.nT)
            for (int d = tid; d < k.Da; d += ML_THREADS) k.nT[(size_t)pair * k.lda + d] = nv[d];
        if (slice == 0 && k.mT && tid == 0) k.mT[pair] = me;
    }
}

#endif
