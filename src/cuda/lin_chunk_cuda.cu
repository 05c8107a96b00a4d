/*
 * The gated linear-attention family on the GPU, chunkwise form: the algorithm of
 * src/cpu/lin_chunk.c (read its header for the formulas, forward and backward). Two paths:
 * the fused tensor-core kernels (mma.sync on bf16, fp32 sums; the default where they take the
 * shape) and the cuBLAS path (strided-batched TF32 products over float32 chunk-major copies;
 * every shape; MESANET_LIN=cublas, read at each call, forces it). H100, (B,T,H,D) =
 * (8,2048,16,128) (bench/results/gpu-lin-h100.txt): forward+backward gdn 10.7 ms fused against
 * 13.5 on the cuBLAS path, gla 6.2 against 6.8; at (16,2048,8,64) gdn 5.1 against 8.5.
 *
 * A sequence of T tokens is cut into N = ceil(T / C) chunks of C tokens (C = 64 by
 * default, at most 64); a short last chunk is padded with zero q, k, v and g = 0,
 * beta = 0, which leaves every formula exact (the padded rows add nothing and the
 * decay across the chunk is that of its real tokens). Chunk ch = p N + c of (sequence, head)
 * pair p = b H + h. Gates per chunk (lc_gates_kernel, both paths): b (cumulative log decay),
 * gamma = e^b, lambda = e^{b_n - b}, beta, beta gamma, [nch][C] float32, and e^{b_n} [nch].
 *
 * ---- The fused path: chunks of 64, Dk and Dv multiples of 16 up to 128, on a device that gives a
 * block the shared memory of its kernels (lf_use: 95 KiB; the delta rule's backward 157 KiB, which
 * Hopper and A100 give and the sm_86 / sm_89 parts do not); other shapes and devices take the
 * cuBLAS path silently.
 *
 * Forward, 4 launches (delta) or 3 (GLA), reading q, k, v bf16 [B,T,H,D] and g, beta float32
 * [B,T,H] as the call gives them (no gathered copies):
 *   lc_gates_kernel   the gates.
 *   lf_prep_kernel    (delta) one block of 4 warps per chunk: K K^T on the tensor cores (warp w:
 *                     rows 16 w .. +15, the tiles on or below the diagonal), A = strictLower(
 *                     diag(beta) (Gamma (.) K K^T)) into shared memory, Tt = (I + A)^{-1} by forward
 *                     substitution in fp32 (thread j owns column j, which only reads its own column:
 *                     no barrier between rows), then W = (Tt diag(beta gamma)) K and
 *                     U = (Tt diag(beta)) V on the tensor cores (Tt's lower-triangular tiles only),
 *                     the scaled Tt split into bf16 hi + lo (K, V are exact in bf16), out as
 *                     float32 [nch][C][D] (the backward: Tt too, float32 [nch][C][C]).
 *                     Shared memory 52 KiB (dynamic), 128 registers.
 *   lf_walk_kernel    the state pass, one block of 4 warps per (pair, slice of 32 rows of Dv),
 *                     grid (Dv / 32, P), walking the N chunks with its slice X [32][Dk] of the state
 *                     in registers (fp32, mma accumulator layout: warp w holds the 8-column tiles
 *                     w, w + 4, ...): per chunk Y = Y0 + sa A X^T (V' = U - W S^T), then
 *                     X <- e^{b_n} X + sb (diag(lambda) Y)^T K
 *                     (S <- gamma_n S + V'^T diag(lambda) K); GLA: no first product,
 *                     Y = diag(beta) V. The entry state of every chunk goes out as float32
 *                     [nch][Dv][Dk], V' over U in place, the last state to sT. The
 *                     operands are staged in shared memory as bf16 hi + lo (X, Y from the
 *                     registers, A from global memory; K, exact in bf16, as is) and each product
 *                     is three mma (hi hi + hi lo + lo hi; two against K): ~2^-16 relative, so
 *                     that the state does not compound bf16's 2^-9 from chunk to chunk. Shared
 *                     memory 95 KiB (dynamic: two blocks a Hopper multiprocessor), 168 registers.
 *                     (lf_walk2_kernel: the same with a second increment X += sb2 (diag(rb2) Y2)^T B2,
 *                     B2 exact, restaged into the B and Y tiles after the first: the delta rule's
 *                     adjoint walk; an instance of its own, 164 registers, so that the
 *                     forward's keeps its registers.)
 *   lf_out_kernel     one block of 4 warps (16 rows each) per (chunk, slice of 64 columns of Dv),
 *                     grid (nch, Dv / 64): O = diag(gamma) Qs S^T + ((Qs K^T) (.) Gamma) V', Qs S^T
 *                     first (S read once; its hi tile then takes K). Qs K^T from the exact bf16
 *                     q, k (the tiles on or below the diagonal), masked and
 *                     scaled in fp32 in registers and turned into A fragments hi + lo without
 *                     shared memory (FlashAttention's P V); S and V' split hi + lo in shared
 *                     memory (two products for Qs S^T, three for P V'); O to bf16 [B,T,H,Dv].
 *                     Shared memory 70 KiB (dynamic), 102 registers.
 * Scratch (float32): the gates, W and U (delta: nch C (Dk + Dv)) and one state per chunk
 * (nch Dv Dk): ~0.55 GB at (B,T,H,D) = (8,2048,16,128), against ~3.5 GB on the cuBLAS path.
 *
 * Backward, GLA rule, fused whole: 6 launches reading q, k, v, dO bf16 and g, beta float32 as the
 * call gives them (no float32 copies of the inputs):
 *   lc_gates_kernel      the gates.
 *   lf_walk_kernel       the forward's walk again: the entry states S_c (float32 [nch][Dv][Dk]) and the
 *                        final state (scratch).
 *   lf_walk_kernel       reverse, the end states' adjoints: X = dS (init dsT, out dS_c of every chunk
 *                        and ds0), no A, Y = dO (bf16 as given), B = q, gamma and scale on Y's rows:
 *                        dS <- gamma_n dS + dO^T diag(gamma) Qs.
 *   lf_dv_kernel         lf_out_kernel's body with the roles swapped (BWD = 1), grid
 *                        (nch, Dv / 64): dV' = diag(lambda) K dS^T + ((K Qs^T) (.) Gamma^T) dO, the
 *                        scores' upper triangle in registers (hi + lo A fragments), dS split hi + lo;
 *                        out dv = diag(beta) dV' (bf16) and each slice's share of v . dV' per token
 *                        (float32 [nch][C][Dv / 64], summed in shared memory across the 4 lanes of a
 *                        row). Shared memory 70 KiB, 96 registers (8 bytes spilled on sm_90a).
 *   lf_dqk_kernel        one block of 4 warps (16 rows each) per (chunk, slice of 64 columns of Dk),
 *                        grid (nch, Dk / 64): dQs = diag(gamma) dO S + P1 K with P1 = (dO V^T) (.)
 *                        Gamma diag(beta), and dK = diag(lambda beta) V dS + P1^T Qs with P1^T =
 *                        diag(beta) (V dO^T) (.) Gamma^T, both score blocks in registers (fp32, then hi +
 *                        lo A fragments; dO, V, q, k exact bf16 tiles), S's and then dS's column slice
 *                        [Dv][64] split hi + lo in the same shared memory; out dq = scale dQs, dk (bf16)
 *                        and the slice's share of q . dq per token. Shared memory 89 KiB, 128
 *                        registers (sm_80: 24 bytes spilled).
 *   lf_gates_bwd_kernel  one block per chunk: dbeta = v . dV', dg_t = <dS_end, S_end> (float32 states,
 *                        double sums) + the reverse cumulative sum of q . dq - beta v . dV' in the chunk
 *                        (lin_chunk.c's identity). 40 registers.
 * Scratch (float32): the gates, two states per chunk (S_c, dS_c), the final state and the shares,
 * ~0.55 GB at (8,2048,16,128) (GLA's cuBLAS backward: ~2.6 GB).
 *
 * Backward, delta rule, fused whole: 8 launches, the inputs read as the call gives them:
 *   lc_gates_kernel      the gates.
 *   lf_prep_kernel       the forward's W, U and, for the backward, Tt itself (float32 [nch][C][C]).
 *   lf_walk_kernel       the forward's walk again: S_c of every chunk, V' = U - W S^T in place of U.
 *   lf_dvi_kernel        the intra-chunk dV' = ((K Qs^T) (.) Gamma^T) dO (lf_out_kernel's body
 *                        with BWD = 2: no state term; out float32 [nch][C][Dv]). 70 KiB, 85 registers.
 *   lf_walk2_kernel      reverse (X = dS, init dsT; out dS_c and ds0): Y = dV' = Y0 + diag(lambda) K dS^T
 *                        (A = k as given, into the dV' buffer), X <- gamma_n X - Y^T W + scale (diag(gamma)
 *                        dO)^T q (the second increment from dO and q as given: no increments buffer).
 *   lf_dqk_delta_kernel  dQs and dK's first terms (lf_dqk_kernel's body with DELTA = 1: V' the
 *                        float32 buffer split hi + lo into one more tile, three products where it
 *                        enters, no beta in the scores, lambda alone on V' dS); out unscaled dQs and dK,
 *                        float32 [nch][C][Dk]. 106 KiB, 121 registers (sm_80: 128, 24 bytes spilled).
 *   lf_utb_kernel        the UT transform's adjoint, one block of 4 warps per chunk: dW = -dV' S (S's
 *                        column slices of 64, hi + lo, in shared memory; dW hi + lo kept there), Tt^T dW
 *                        (dK += diag(beta gamma) Tt^T dW), Tt^T dU (out, float32), dTt = dU (diag(beta)
 *                        V)^T + dW (diag(beta gamma) K)^T (score-like blocks in registers), Tt^T dTt,
 *                        dA = -(Tt^T dTt) Tt^T, D = diag(beta) dA (.) Gamma with D and D^T staged hi + lo
 *                        in shared memory, dK += D K + D^T K, and dbeta's three row sums (v . Tt^T dU,
 *                        gamma k . Tt^T dW, (dA (.) Gamma (.) K K^T) 1). Every product on the tensor cores,
 *                        rounded operands split (three products), k and v exact. Shared memory
 *                        157 KiB (dynamic: S's slices, later dTt / Tt^T dTt / D / D^T, share a region),
 *                        126 registers (sm_80: 121).
 *   lc_bwd_out_kernel    the cuBLAS path's token-gradient kernel, q and v read as bf16 (dq, dk, dv,
 *                        dbeta, dg from the float32 dQs, dK, Tt^T dU, dbeta).
 * Scratch (float32): the gates, W, V', Tt, dV', Tt^T dU, dQs, dK, two states per chunk: ~1.4 GB at
 * (8,2048,16,128) (the delta rule's cuBLAS backward: ~3.5 GB). lf_utb_kernel's 157 KiB leave one
 * block a multiprocessor (Hopper and Ampere).
 * Forward + backward, fused path: 9 launches (GLA) or 12 (delta), none per chunk. Where the time
 * goes (H100, gdn at (8,2048,16,128); ncu on the build of 11.4 ms before the last changes, 10.7 ms
 * now; bench/results/lin-kernels-h100.txt): the forward walk 1.16 ms (twice: the backward
 * recomputes it), the adjoint walk 2.28, lf_utb_kernel 2.23, lc_bwd_out_kernel 1.36 (before its
 * rows went a warp each), lf_dqk_delta_kernel 1.09, lf_out_kernel 0.61, lf_prep_kernel 0.45 (twice).
 * The walks are chains of dependent loads, products and barriers at two blocks a multiprocessor;
 * every product is two or three mma (the hi + lo split); the delta rule's float32 dQs, dK, Tt^T dU
 * round trip into lc_bwd_out_kernel (which lf_utb_kernel could absorb). docs/cuda.md lists what
 * would close the gap to fla's 2.9 ms.
 *
 * Precision of the fused path: the inputs q, k, v are exact bf16 operands; every rounded operand
 * (states, V', W, U, Tt, the masked scores) is split hi + lo, so the outputs carry about their own
 * bf16 rounding (o: 1.6e-3 .. 1.8e-3 relative in L2 in the emulation, as the cuBLAS path's) and sT
 * is near float32 (1e-8 .. 1e-5). The backward's bf16 outputs carry about their own rounding too
 * (dq, dk, dv: 1.6e-3 .. 1.9e-3 in the emulation), and its float32 outputs, with no TF32 operand
 * left, are near float32: dg, dbeta, ds0 up to ~4e-5 for both rules, against 1e-3 .. 5e-3 on the
 * cuBLAS path (tests/cuda/test_cuda_lin.c states the tolerances).
 *
 * ---- The cuBLAS path (every shape; chunks of at most 64).
 *
 * Everything is laid out chunk major in float32: row buffers [nch][C][D],
 * square ones [nch][C][C], gates [nch][C].
 *
 * What does not depend on the running state is computed for all chunks of all pairs
 * at once: small kernels (gates and decays, gathers with row scalings, the decay
 * masks, the UT transform's forward substitution Tt = (I + A)^{-1} one block per
 * chunk, the backward's per-token sums) and cuBLAS strided-batched products over the
 * nch chunks. Only the state's hand-off from chunk to chunk is sequential:
 *
 *     forward   V'_c = U_c - W_c S_c^T (delta);  S_{c+1} = gamma_n S_c + V'_c^T diag(lambda) K_c
 *     backward  dV'_c += diag(lambda) K_c dS_c^T;
 *               dS_{c-1} = gamma_n dS_c + dO_c^T diag(gamma) Qs_c - dV'_c^T W_c (delta)
 *
 * (dS_c: the adjoint of the state at the end of chunk c.) The GLA rule's V' does not
 * depend on the state (nor its dS on dV'): the increments V'^T diag(lambda) K (and
 * dO^T diag(gamma) Qs) of all chunks are one batched product, and the hand-off a
 * scan, one thread per state element walking the chunks (lc_scan_kernel). The delta
 * rule's is a loop over the N chunks of products batched over the P pairs, each
 * step a decay kernel and two products (in the backward too, the dO^T diag(gamma) Qs
 * terms being batched before). The entry states
 * S_c (and the adjoints dS_c) of every chunk are kept, so that the products that
 * read them (O = diag(gamma) Qs S^T + ..., dQs, dK, dW) run batched over all chunks
 * afterwards.
 *
 * Launches (kernels, products and copies), with N chunks per sequence: forward
 * 12 (GLA) or 15 + 3 N (delta); backward 21 (GLA) or 33 + 6 N (delta), the
 * forward's state pass included (the backward recomputes it). Memory (one
 * scratch): float32 chunk-major copies of the [B,T,H,D] tensors, 6 of them in the
 * forward (9 for the delta rule) and 12 (18) in the backward, plus the C x C
 * blocks and one state per chunk (three in the backward; GLA's forward: two):
 * ~3.5 GB at
 * (B,T,H,D) = (8,2048,16,128). No CUDA-graph recording: decoding (T = 1) runs the
 * recurrent kernels of lin_cuda.cu.
 *
 * Where the time goes, by count (measured on an H100 before the fused path: gdn forward+backward
 * 13.4 ms, gla 7.7 ms at that shape): the delta rule's forward+backward is ~150 GFLOP of TF32
 * products (~0.4 ms at the tensor cores' rate), while the float32 chunk-major buffers move ~10 GB
 * through memory (~3 ms at 3 TB/s: every product reads and writes whole [nch][C][D] float32
 * buffers), and each of the delta rule's 3-6 launches per chunk of the sequential pass (N = 32:
 * ~100 in the forward, ~290 in the forward+backward) costs its launch latency.
 *
 * Precision: float32 storage and sums; the products round their operands to TF32
 * (10-bit mantissa, 2^-11 relative), which the tests' tolerances account for.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"
#include "mma.cuh"

extern "C" int cuda_lin_chunk_fwd(const Backend *be, const MnMesaDims *d, const MnLinOpts *o, const MnLinFwd *io);
extern "C" int cuda_lin_chunk_bwd(const Backend *be, const MnMesaDims *d, const MnLinOpts *o, const MnLinBwd *io);

#define LC_CMAX 64      // the chunk size at most, and the default: Tt's block sits in shared memory
#define LC_THREADS 256  // elementwise kernels
#define LC_OUT_THREADS 128
#define LC_ALIGN 32     // floats: every buffer starts on 128 bytes (the tensor-core products' fast paths)

// A call's shape in chunks.
typedef struct {
    int T, H, Dk, Dv, C;
    int P, N;   // pairs B*H, chunks per pair ceil(T / C)
    size_t nch; // P*N chunks
    size_t ss;  // Dv*Dk: one state
} LcDims;

// Per-chunk gates, [nch][C] (dec: [nch]); padded tokens have g = 0, beta = 0.
typedef struct {
    float *b;     // chunk-local cumulative log decay
    float *gam;   // e^b
    float *lam;   // e^{b_n - b}
    float *beta;  // beta (1 where the call has none)
    float *bg;    // beta gamma (the delta rule's W = Tt diag(beta gamma) K)
    float *dec;   // [nch] e^{b_n}
} LcGates;

// The buffers of a call (one cuda_scratch), float32, chunk major. Row buffers [nch][C][Dk] (k) or
// [nch][C][Dv] (v); square ones [nch][C][C]; states [nch][Dv][Dk] (+ finals [P][Dv][Dk]).
typedef struct {
    LcGates gt;
    float *qs, *qg, *k, *kl, *kb, *w;             // k: scale q, gamma Qs, K, lambda K, beta gamma K, W
    float *v, *vb, *vp, *o;                       // v: V, beta V, V' (GLA: = vb), O
    float *kk, *tt, *sq1, *sq2;                   // square: K K^T, Tt, two temporaries
    float *st, *sfin;                             // entry states of the chunks, final states
    float *dqs, *dk, *dw, *tdw;                   // backward, k: dQs, dK, dW, Tt^T dW
    float *dout, *dog, *dvp, *vl, *tdu;           // backward, v: dO, gamma dO, dV', lambda V', Tt^T dU
    float *dst;                                   // [nch][Dv][Dk] adjoint of each chunk's end state
    float *inc;  // [nch][Dv][Dk] each chunk's increment of the state (GLA) or of its adjoint (backward)
    float *dbt;                                   // [nch][C] delta rule's dbeta
} LcWork;

__device__ __forceinline__ size_t lc_tok(const LcDims d, int p, int t) {
    return ((size_t)(p / d.H) * d.T + t) * d.H + (size_t)(p % d.H);
}

// ------------------------------------------------------------------------------- kernels

// Gates of every chunk: one thread per chunk (C sequential steps of the cumulative sum).
static __global__ void lc_gates_kernel(const LcDims d, const float *g, const float *beta, const LcGates gt) {
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

// x [B,T,H,D] bf16 into chunk-major float32: y1 = scale x, y2 = rs2 y1, y3 = rs3 y1 (row scales
// [nch][C]; any output may be NULL). Zero past the sequence's end.
static __global__ void lc_gather_kernel(const LcDims d, const bf16 *x, int D, float scale, float *y1, const float *rs2,
                                        float *y2, const float *rs3, float *y3) {
    size_t n = d.nch * d.C * D;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t row = e / D, ch = row / d.C;
        int j = (int)(e - row * D), t = (int)(row - ch * d.C) + (int)(ch % d.N) * d.C, p = (int)(ch / d.N);
        float a = t < d.T ? scale * ld(x, lc_tok(d, p, t) * D + j) : 0.0f;
        if (y1) y1[e] = a;
        if (y2) y2[e] = rs2[row] * a;
        if (y3) y3[e] = rs3[row] * a;
    }
}

// Chunk-major rows back to [B,T,H,D] bf16 (the real tokens only).
static __global__ void lc_scatter_kernel(const LcDims d, bf16 *y, const float *x, int D, float scale) {
    size_t n = d.nch * d.C * D;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t row = e / D, ch = row / d.C;
        int j = (int)(e - row * D), t = (int)(row - ch * d.C) + (int)(ch % d.N) * d.C, p = (int)(ch / d.N);
        if (t < d.T) st(y, lc_tok(d, p, t) * D + j, scale * x[e]);
    }
}

// m[ch] (.)= Gamma: m_ij e^{b_i - b_j} for j <= i, 0 above the diagonal.
static __global__ void lc_mask_kernel(const LcDims d, float *m, const float *b) {
    size_t n = d.nch * d.C * d.C, cc = (size_t)d.C * d.C;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t ch = e / cc;
        int i = (int)((e - ch * cc) / d.C), j = (int)(e - ch * cc - (size_t)i * d.C);
        const float *bc = b + ch * d.C;
        m[e] = j <= i ? m[e] * expf(bc[i] - bc[j]) : 0.0f;
    }
}

// y = rs x, rows of D (rs [rows]).
static __global__ void lc_rowscale_kernel(float *y, const float *x, const float *rs, size_t rows, int D) {
    size_t n = rows * D;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x)
        y[e] = rs[e / D] * x[e];
}

// The decay step of the state hand-off: y[p] = dec[p * dstride] x[p] (+ add[p], if given) for the P
// pairs' states (strides in floats between pairs; add's is xstride).
static __global__ void lc_decay_state_kernel(float *y, size_t ystride, const float *x, size_t xstride,
                                             const float *dec, size_t dstride, const float *add, int P, size_t ss) {
    size_t n = (size_t)P * ss;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t p = e / ss, i = e - p * ss;
        float a = dec[p * dstride] * x[p * xstride + i];
        y[p * ystride + i] = add ? a + add[p * xstride + i] : a;
    }
}

// The GLA rule's hand-off as a scan over the chunks, each thread one element i of one pair's state:
// X_c = the running value on entering chunk c (into out[ch]), X <- dec_ch X + inc[ch], from init
// (or 0) to fin (if given). Forward: c = 0 .. N-1 (states); reverse: c = N-1 .. 0 (adjoints).
static __global__ void lc_scan_kernel(const LcDims d, float *out, const float *inc, const float *dec,
                                      const float *init, float *fin, int reverse) {
    size_t n = (size_t)d.P * d.ss;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t p = e / d.ss, i = e - p * d.ss;
        float x = init ? init[e] : 0.0f;
        for (int k = 0; k < d.N; k++) {
            size_t ch = p * d.N + (reverse ? d.N - 1 - k : k), o = ch * d.ss + i;
            out[o] = x;
            x = fmaf(dec[ch], x, inc[o]);
        }
        if (fin) fin[e] = x;
    }
}

// The UT transform's inverse, one block of C threads per chunk: Tt = (I + A)^{-1} with
// A = strictLower(diag(beta) (Gamma (.) K K^T)), by forward substitution (lin_chunk.c values()):
// row i of Tt = e_i + sum_{m < i} N_im (row m), N = -A; thread j owns column j.
static __global__ void __launch_bounds__(LC_CMAX) lc_tinv_kernel(const LcDims d, const float *kk, const float *b,
                                                                 const float *beta, float *tt) {
    __shared__ float sn[LC_CMAX][LC_CMAX + 1], st_[LC_CMAX][LC_CMAX + 1];
    int C = d.C, j = threadIdx.x;
    size_t ch = blockIdx.x, cc = (size_t)C * C;
    const float *bc = b + ch * C, *bt = beta + ch * C, *kc = kk + ch * cc;
    for (int e = threadIdx.x; e < C * C; e += blockDim.x) {
        int i = e / C, m = e - i * C;
        sn[i][m] = m < i ? -bt[i] * expf(bc[i] - bc[m]) * kc[e] : 0.0f;
        st_[i][m] = i == m ? 1.0f : 0.0f;
    }
    __syncthreads();
    for (int i = 1; i < C; i++) {
        if (j < i) {
            float a = 0.0f;
            for (int m = j; m < i; m++) a = fmaf(sn[i][m], st_[m][j], a);
            st_[i][j] = a;
        }
        __syncthreads();
    }
    for (int e = threadIdx.x; e < C * C; e += blockDim.x) tt[ch * cc + e] = st_[e / C][e % C];
}

// The delta rule's backward per chunk (lin_chunk.c, the DELTA branch), one thread per row t:
//   dbeta_t = tdu_t . v_t + gamma_t tdw_t . k_t + sum_{j<t} dA_tj Gamma_tj (K K^T)_tj,
//   dA <- D = diag(beta) dA (.) Gamma (strictly lower),  dK_t += beta_t gamma_t tdw_t.
typedef struct {
    const float *tdu, *tdw, *v, *k, *kk;
    float *da, *dk, *dbt;
} LcComb;

static __global__ void lc_delta_comb_kernel(const LcDims d, const LcGates gt, const LcComb a) {
    int C = d.C, Dk = d.Dk, Dv = d.Dv, t = threadIdx.x;
    size_t ch = blockIdx.x, r = ch * C;
    const float *bc = gt.b + r;
    if (t < C) {
        size_t row = r + t;
        const float *tdu = a.tdu + row * Dv, *vt = a.v + row * Dv, *tdw = a.tdw + row * Dk, *kt = a.k + row * Dk;
        float x = 0.0f, y = 0.0f;
        for (int j = 0; j < Dv; j++) x = fmaf(tdu[j], vt[j], x);
        for (int j = 0; j < Dk; j++) y = fmaf(tdw[j], kt[j], y);
        x = fmaf(gt.gam[row], y, x);
        float *da = a.da + (ch * C + t) * C;
        const float *kk = a.kk + (ch * C + t) * C;
        for (int j = 0; j < C; j++) {
            float m = j < t ? da[j] * expf(bc[t] - bc[j]) : 0.0f;
            x = fmaf(m, kk[j], x);
            da[j] = gt.beta[row] * m;
        }
        a.dbt[row] = x;
    }
    for (size_t e = threadIdx.x; e < (size_t)C * Dk; e += blockDim.x) {
        size_t i = r * Dk + e;
        a.dk[i] = fmaf(gt.bg[r + e / Dk], a.tdw[i], a.dk[i]);
    }
}

// The token gradients out of chunk-major float32, one block per chunk (lin_chunk.c's last loop):
// dq = scale dQs, dk, dv (GLA: beta dV'; delta: beta Tt^T dU), dbeta (GLA: v . dV'), and
// dg_t = <dS_end, S_end> + sum_{t' >= t} (qs . dqs - v . dv)_t' (in double: the terms cancel).
// (qs, v NULL: q and v read as the call gives them, qb, vb: the fused delta backward.)
typedef struct {
    const float *qs, *dqs, *v, *dvp, *tdu, *dk, *dbt, *st, *sfin, *dst;
    bf16 *dq, *dko, *dv;
    float *dg, *dbeta;
    int has_g, has_beta;
    float scale;
    const bf16 *qb, *vb;
} LcOut;

static __global__ void __launch_bounds__(LC_OUT_THREADS) lc_bwd_out_kernel(const LcDims d, const LcGates gt,
                                                                           const LcOut a) {
    __shared__ double dG[LC_CMAX], red[LC_OUT_THREADS];
    __shared__ float dbs[LC_CMAX];
    int C = d.C, Dk = d.Dk, Dv = d.Dv, tid = threadIdx.x;
    size_t ch = blockIdx.x, r = ch * C;
    int p = (int)(ch / d.N), c = (int)(ch % d.N), t0 = c * C, n = min(C, d.T - t0);
    const float *dvsrc = a.tdu ? a.tdu : a.dvp;  // dv = beta dvsrc
    // The rows' dot products, a warp a row (lanes along the row: coalesced; with a thread a row, each
    // warp's loads touched 32 rows at once and the kernel took 1.36 ms at (8, 2048, 16, 128), H100).
    for (int t = tid >> 5, lane = tid & 31; t < n; t += blockDim.x >> 5) {
        size_t row = r + t;
        const float *dqs = a.dqs + row * Dk, *dvs = dvsrc + row * Dv, *dvp = a.dvp + row * Dv;
        const size_t tk = lc_tok(d, p, t0 + t);
        float qd = 0.0f, vd = 0.0f, vp = 0.0f;
        for (int j = lane; j < Dk; j += 32)
            qd = fmaf(a.qs ? a.qs[row * Dk + j] : a.scale * ld(a.qb, tk * Dk + j), dqs[j], qd);
        for (int j = lane; j < Dv; j += 32) {
            float vt = a.v ? a.v[row * Dv + j] : ld(a.vb, tk * Dv + j);
            vd = fmaf(vt, dvs[j], vd);
            vp = fmaf(vt, dvp[j], vp);
        }
        qd = warp_sum(qd);
        vd = warp_sum(vd);
        vp = warp_sum(vp);
        if (lane == 0) {
            dG[t] = (double)qd - (double)gt.beta[row] * vd;
            dbs[t] = a.tdu ? a.dbt[row] : vp;
        }
    }
    if (a.dg && a.has_g) {  // <dS_end, S_end>
        const float *se = c + 1 < d.N ? a.st + (ch + 1) * d.ss : a.sfin + (size_t)p * d.ss, *dse = a.dst + ch * d.ss;
        double s = 0;
        for (size_t e = tid; e < d.ss; e += blockDim.x) s += (double)se[e] * dse[e];
        red[tid] = s;
    }
    __syncthreads();
    if (tid == 0 && a.dg) {
        double acc = 0;
        if (a.has_g)
            for (int i = 0; i < (int)blockDim.x; i++) acc += red[i];
        for (int t = n - 1; t >= 0; t--) {
            acc += dG[t];
            a.dg[lc_tok(d, p, t0 + t)] = a.has_g ? (float)acc : 0.0f;
        }
    }
    if (a.dbeta && tid < n) a.dbeta[lc_tok(d, p, t0 + tid)] = a.has_beta ? dbs[tid] : 0.0f;
    for (int e = tid; e < n * Dk; e += blockDim.x) {
        int t = e / Dk, j = e - t * Dk;
        size_t o = lc_tok(d, p, t0 + t) * Dk + j;
        st(a.dq, o, a.scale * a.dqs[r * Dk + e]);
        st(a.dko, o, a.dk[r * Dk + e]);
    }
    for (int e = tid; e < n * Dv; e += blockDim.x) {
        int t = e / Dv, j = e - t * Dv;
        st(a.dv, lc_tok(d, p, t0 + t) * Dv + j, gt.beta[r + t] * dvsrc[r * Dv + e]);
    }
}

// ------------------------------------------------------------------------- fused kernels
// (The fused path: chunks of LF_C = 64, Dk and Dv multiples of 16 up to 128; header comment.)

#define LF_C 64      // the chunk size of the fused path
#define LF_KMAX 128  // Dk, Dv at most
#define LF_LDK 136   // row stride (elements) of the [64][Dk] tiles: 16 bytes of padding (ldmatrix banks)
#define LF_R 32      // state rows (of Dv) a walk block holds
#define LF_LDR 40    // row stride of the walk's [64][32] Y tile
#define LF_RO 64     // output columns (of Dv) an output block computes
#define LF_LDO 72    // row stride of the output kernel's [64][64] V' tile and of the prep's Tt
#define LF_THREADS 128

// Where a chunk's [C][D] operand is read: bf16 [B,T,H,D] as the call gives it (tok) or a float32
// chunk-major [nch][C][D] buffer; times a row scale [nch][C] (NULL: none). Zero past T and past D.
typedef struct {
    const void *p;
    const float *rs;
    int tok, D;
} LfSrc;

// A bf16 [B,T,H,D] input as an LfSrc (no row scale).
// c[0..1] += a b for a 16 x 16 block of columns: b the four registers of a transposed ldmatrix x4
// (two n8 tiles), a the A fragment: the pair of mma every product of this file issues.
static __device__ __forceinline__ void mma_bf16_x2(float c[][4], const uint32_t a[4], const uint32_t b[4]) {
    mma_bf16(c[0], a, b[0], b[1]);
    mma_bf16(c[1], a, b[2], b[3]);
}

static __device__ __forceinline__ LfSrc lf_src_d(const bf16 *p, int D) {
    LfSrc s = {p, NULL, 1, D};
    return s;
}

static __device__ __forceinline__ float lf_at(const LcDims d, const LfSrc s, size_t ch, int t, int col) {
    if (col >= s.D) return 0.0f;
    float x;
    if (s.tok) {
        int tt = (int)(ch % d.N) * d.C + t;
        if (tt >= d.T) return 0.0f;
        x = ld((const bf16 *)s.p, lc_tok(d, (int)(ch / d.N), tt) * s.D + col);
    } else {
        x = ((const float *)s.p)[(ch * d.C + t) * s.D + col];
    }
    return s.rs ? x * s.rs[ch * d.C + t] : x;
}

// A bf16 (the high half of a 32-bit word; the low half zero) as a float.
static __device__ __forceinline__ float lf_bf(uint32_t w) {
    float f;
    memcpy(&f, &w, 4);
    return f;
}

// Four consecutive elements (col a multiple of 4; D is one of 16) of row t of s, as lf_at: one
// 8-byte (bf16) or 16-byte (float32) load where the address allows (the float32 buffers are
// scratch, 128-byte aligned, rows of a multiple of 16 floats; a bf16 input may start anywhere).
static __device__ __forceinline__ void lf_at4(const LcDims d, const LfSrc s, size_t ch, int t, int col, float v[4]) {
    v[0] = v[1] = v[2] = v[3] = 0.0f;
    if (col >= s.D) return;
    if (s.tok) {
        int tt = (int)(ch % d.N) * d.C + t;
        if (tt >= d.T) return;
        const bf16 *x = (const bf16 *)s.p + lc_tok(d, (int)(ch / d.N), tt) * s.D + col;
        if ((uintptr_t)x % 8 == 0) {
            const uint32_t *u = (const uint32_t *)x;
            uint32_t u0 = u[0], u1 = u[1];
            v[0] = lf_bf(u0 << 16);
            v[1] = lf_bf(u0 & 0xffff0000u);
            v[2] = lf_bf(u1 << 16);
            v[3] = lf_bf(u1 & 0xffff0000u);
        } else {
            for (int i = 0; i < 4; i++) v[i] = ld(x, i);
        }
    } else {
        float4 f = *(const float4 *)((const float *)s.p + (ch * d.C + t) * s.D + col);
        v[0] = f.x;
        v[1] = f.y;
        v[2] = f.z;
        v[3] = f.w;
    }
    if (s.rs) {
        float r = s.rs[ch * d.C + t];
        for (int i = 0; i < 4; i++) v[i] *= r;
    }
}

// The chunk's rows 0..63, columns c0 .. c0 + ncols - 1 of s into a bf16 tile (row stride lds; c0,
// ncols, lds multiples of 4), four elements a thread at a time, LF_UNR such loads issued before the
// first is used (a thread's loads in flight together: the tiles come from L2 or memory).
#define LF_UNR 4
#define LF_UNR_WALK 2  // (the state walk, whose registers hold the state: 4 would spill)
// UNR (at most LF_UNR) loads a thread issues before it uses them: a constant at every call, which the
// inlining folds (as a template parameter would; the kernels are C-style CUDA).
//
// A bf16 input as the call gives it, unscaled, whose rows are 16-byte aligned, is copied as it is:
// cp.async, every row of the tile in flight at once without registers (lf_sync completes it before
// the barrier that publishes the tile). Through registers, a block had 4 to 8 KiB in flight, and
// each kernel spent most of its time waiting on its loads (H100: the fused kernels ran at a third
// to a quarter of their memory rate).
static __device__ __forceinline__ int lf_async_ok(const LfSrc s, int c0, int ncols) {
    return s.tok && !s.rs && s.D % 8 == 0 && c0 % 8 == 0 && ncols % 8 == 0 && c0 + ncols <= s.D &&
           (uintptr_t)s.p % 16 == 0;
}
static __device__ __forceinline__ void lf_load_async(const LcDims d, const LfSrc s, size_t ch, int c0, int ncols,
                                                     bf16 *dst, int lds) {
    const int n8 = ncols / 8, total = LF_C * n8, p = (int)(ch / d.N), tb = (int)(ch % d.N) * LF_C;
    for (int e = threadIdx.x; e < total; e += blockDim.x) {
        const int t = e / n8, j = 8 * (e - t * n8), ok = tb + t < d.T;
        const bf16 *src = (const bf16 *)s.p + (ok ? lc_tok(d, p, tb + t) * s.D + c0 + j : 0);
        cp_async16(dst + (size_t)t * lds + j, src, ok ? 16 : 0);
    }
    cp_async_commit();
}

// Completes the thread's cp.async copies, then the block's barrier: every barrier of the fused
// kernels, so that no tile is read before its copies land.
static __device__ __forceinline__ void lf_sync(void) {
    cp_async_wait0();
    __syncthreads();
}

// x as a bf16 pair hi + lo (hi = bf16(x), lo = bf16(x - hi): 16 bits of mantissa between them).
static __device__ __forceinline__ float lf_hi(float x) {
    bf16 h;
    st(&h, 0, x);
    return ld(&h, 0);
}

// a, b as bf16 pairs hi + lo into hi[0..1], lo[0..1] (4-byte aligned).
static __device__ __forceinline__ void lf_st2s(bf16 *hi, bf16 *lo, float a, float b) {
    float ha = lf_hi(a), hb = lf_hi(b);
    *(uint32_t *)hi = pack_bf16(ha, hb);
    *(uint32_t *)lo = pack_bf16(a - ha, b - hb);
}

// The chunk's rows through registers into a bf16 tile (lo NULL) or split into a hi and a lo tile.
static __device__ __forceinline__ void lf_load2(const LcDims d, const LfSrc s, size_t ch, int c0, int ncols, bf16 *hi,
                                                bf16 *lo, int lds, const int UNR) {
    const int n4 = ncols / 4, total = LF_C * n4;
    for (int e0 = threadIdx.x; e0 < total; e0 += UNR * blockDim.x) {
        float v[LF_UNR][4];
#pragma unroll
        for (int u = 0; u < UNR; u++) {
            int e = e0 + u * blockDim.x, t = e / n4;
            if (e < total) lf_at4(d, s, ch, t, c0 + 4 * (e - t * n4), v[u]);
        }
#pragma unroll
        for (int u = 0; u < UNR; u++) {
            int e = e0 + u * blockDim.x, t = e / n4;
            if (e >= total) continue;
            size_t o = (size_t)t * lds + 4 * (e - t * n4);
            if (lo) {
                lf_st2s(hi + o, lo + o, v[u][0], v[u][1]);
                lf_st2s(hi + o + 2, lo + o + 2, v[u][2], v[u][3]);
            } else {
                uint32_t *w = (uint32_t *)(hi + o);
                w[0] = pack_bf16(v[u][0], v[u][1]);
                w[1] = pack_bf16(v[u][2], v[u][3]);
            }
        }
    }
}

static __device__ __forceinline__ void lf_load(const LcDims d, const LfSrc s, size_t ch, int c0, int ncols, bf16 *dst,
                                               int lds, const int UNR) {
    if (lf_async_ok(s, c0, ncols)) lf_load_async(d, s, ch, c0, ncols, dst, lds);
    else lf_load2(d, s, ch, c0, ncols, dst, NULL, lds, UNR);
}



// c += a b in three products of split operands (a_hi b_hi + a_hi b_lo + a_lo b_hi): float32-like
// accuracy (~2^-16 relative per product) where bf16 alone (2^-9) would compound from chunk to chunk.
static __device__ __forceinline__ void mma3(float c[4], const uint32_t ah[4], const uint32_t al[4], uint32_t bh0,
                                            uint32_t bh1, uint32_t bl0, uint32_t bl1) {
    mma_bf16(c, al, bh0, bh1);
    mma_bf16(c, ah, bl0, bl1);
    mma_bf16(c, ah, bh0, bh1);
}

// The state walk of one (pair, slice of LF_R rows of Dv), chunk after chunk (reverse: last first),
// with the slice X [LF_R][Dk] of the running state in registers (fp32, mma accumulator layout):
//     Y = Y0 + sa diag(ra) A X^T                (Y: [C][LF_R]; no A: Y = Y0; ra, rb [nch][C] or NULL)
//     X <- dec X (+ inc) + sb (diag(rb) Y)^T B
// forward (delta):  A = W, Y0 = U, B = K, rb = lambda, sa = -1, sb = 1  (Y = V', X = S)
// forward (GLA):    no A, Y0 = diag(beta) V, B = K, rb = lambda, sb = 1
// backward (delta): A = K, ra = lambda, Y0 = the intra-chunk dV', B = W, sa = 1, sb = -1,
//                   inc = dO^T diag(gamma) Qs  (Y = dV', X = dS, reverse)
// X on entering each chunk goes to xs (float32 [nch][Dv][Dk]), Y to y (float32 [nch][C][Dv], in
// place over Y0 allowed: each element is read and written by the same thread), the last X to xfin.
// Every operand is split (lf_load2, mma3), except an A or B exact in bf16 (a_exact, b_exact: K, the
// row scales lambda being applied to the products' rows instead): its lo tile is not loaded and its
// products are two. Dynamic shared memory: LF_WALK_SMEM bytes.
typedef struct {
    LfSrc a, y0, b;
    const float *ra, *rb;
    int a_exact, b_exact;
    float sa, sb;
    const float *dec, *inc, *init;
    float *xs, *y, *xfin;
    int reverse;
    LfSrc y2, b2;  // (y2.p: a second increment X += sb2 (diag(rb2) Y2)^T B2, B2 exact in bf16)
    const float *rb2;
    float sb2;
} LfWalk;

#define LF_TK (LF_C * LF_LDK)  // elements of a [64][Dk] tile
#define LF_TX (LF_R * LF_LDK)
#define LF_TY (LF_C * LF_LDR)
#define LF_WALK_SMEM ((4 * LF_TK + 2 * LF_TX + 2 * LF_TY) * 2)

// att = the warp's 16 rows of A B^T (A, B [64][LF_LDK] bf16, D / 16 steps of k; exact, or one of them
// split, its lo tile Al or Bl: one more product), the 16 x 16 column blocks np outside [nmin, nmax]
// left zero.
static __device__ __forceinline__ void lf_abt(float att[8][4], const bf16 *A, const bf16 *Al, const bf16 *B,
                                              const bf16 *Bl, int D, int nmin, int nmax) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) att[n][e] = 0.0f;
    for (int s = 0; s < D / 16; s++) {
        uint32_t af[4], al[4], bb[4], bl[4];
        ldsm_x4(af, A + (16 * w + (lane & 15)) * LF_LDK + s * 16 + (lane >> 4) * 8);
        if (Al) ldsm_x4(al, Al + (16 * w + (lane & 15)) * LF_LDK + s * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int np = 0; np < 4; np++) {
            if (np < nmin || np > nmax) continue;
            const int bo = (np * 16 + (lane & 7) + (lane >> 4) * 8) * LF_LDK + s * 16 + ((lane >> 3) & 1) * 8;
            ldsm_x4(bb, B + bo);
            if (Al) {
                mma_bf16_x2(&att[2 * np], al, bb);
            }
            if (Bl) {
                ldsm_x4(bl, Bl + bo);
                mma_bf16_x2(&att[2 * np], af, bl);
            }
            mma_bf16_x2(&att[2 * np], af, bb);
        }
    }
}

// Asks the L2 for rows 0..63, columns c0 .. c0 + ncols - 1 of chunk ch of s (and its row scales):
// the state walk's next chunk, fetched while it works on this one (its loads then wait on the L2,
// not on DRAM: the walk is a chain of dependent loads and products with nothing else to run).
static __device__ __forceinline__ void lf_prefetch(const LcDims d, const LfSrc s, size_t ch, int c0, int ncols) {
    if (!s.p) return;
    if (c0 + ncols > s.D) ncols = s.D - c0;
    if (ncols <= 0) return;
    const int es = s.tok ? 2 : 4, bytes = ncols * es, lines = (bytes + 127) / 128 + 1;  // +1: an unaligned row's tail
    const int p = (int)(ch / d.N), tb = (int)(ch % d.N) * LF_C;
    for (int e = threadIdx.x; e < LF_C * lines; e += blockDim.x) {
        const int t = e / lines, off = min(128 * (e - t * lines), bytes - 1);
        if (tb + t >= d.T) continue;
        const size_t el = s.tok ? lc_tok(d, p, tb + t) * s.D + c0 : (ch * LF_C + t) * s.D + c0;
        prefetch_l2((const char *)s.p + el * es + off);
    }
    if (s.rs && threadIdx.x < 2) prefetch_l2(s.rs + ch * LF_C + 32 * threadIdx.x);
}

// INC2 (0 or 1, a constant at each call, folded by the inlining) selects the adjoint walk's own
// increments (lf_walk2_kernel).
static __device__ __forceinline__ void lf_walk_body(const LcDims d, const LfWalk k, const int INC2) {
    extern __shared__ __align__(16) unsigned char lf_dsmem[];
    bf16 *Ah = (bf16 *)lf_dsmem, *Al = Ah + LF_TK, *Bh = Al + LF_TK, *Bl = Bh + LF_TK, *Xh = Bl + LF_TK,
         *Xl = Xh + LF_TX, *Yh = Xl + LF_TX, *Yl = Yh + LF_TY;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, Dk = d.Dk, Dv = d.Dv, NT = Dk / 8;
    const int p = blockIdx.y, r0 = blockIdx.x * LF_R, lr = lane >> 2, lc = 2 * (lane & 3);
    float x[2][4][4];  // [m tile: rows r0 + 16 mt][slot s: columns 8 (w + 4 s)][fragment]
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int s = 0; s < 4; s++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = r0 + 16 * mt + lr + 8 * (e >> 1), col = 8 * (w + 4 * s) + lc + (e & 1);
                x[mt][s][e] = k.init && r < Dv && w + 4 * s < NT ? k.init[((size_t)p * Dv + r) * Dk + col] : 0.0f;
            }
    for (int it = 0; it < d.N; it++) {
        const size_t ch = (size_t)p * d.N + (k.reverse ? d.N - 1 - it : it);
        if (it + 1 < d.N) {
            const size_t nx = k.reverse ? ch - 1 : ch + 1;
            lf_prefetch(d, k.a, nx, 0, Dk);
            lf_prefetch(d, k.b, nx, 0, Dk);
            lf_prefetch(d, k.y0, nx, r0, LF_R);
            if (INC2) {
                lf_prefetch(d, k.y2, nx, r0, LF_R);
                lf_prefetch(d, k.b2, nx, 0, Dk);
            }
            if (threadIdx.x < 2) {
                if (k.ra) prefetch_l2(k.ra + nx * LF_C + 32 * threadIdx.x);
                if (k.rb) prefetch_l2(k.rb + nx * LF_C + 32 * threadIdx.x);
            }
            if (k.inc)
                for (int e = threadIdx.x; e < LF_R * Dk / 32; e += blockDim.x)
                    if (r0 + e / (Dk / 32) < Dv) prefetch_l2(k.inc + (nx * Dv + r0) * Dk + 32 * e);
        }
        if (k.a.p && k.a_exact) lf_load(d, k.a, ch, 0, Dk, Ah, LF_LDK, LF_UNR_WALK);
        else if (k.a.p) lf_load2(d, k.a, ch, 0, Dk, Ah, Al, LF_LDK, LF_UNR_WALK);
        if (k.b_exact) lf_load(d, k.b, ch, 0, Dk, Bh, LF_LDK, LF_UNR_WALK);
        else lf_load2(d, k.b, ch, 0, Dk, Bh, Bl, LF_LDK, LF_UNR_WALK);
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int s = 0; s < 4; s++) {
                int nt = w + 4 * s;
                if (nt >= NT) continue;
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    int rl = 16 * mt + lr + 8 * h, col = 8 * nt + lc;
                    lf_st2s(Xh + rl * LF_LDK + col, Xl + rl * LF_LDK + col, x[mt][s][2 * h], x[mt][s][2 * h + 1]);
                    if (k.xs && r0 + rl < Dv) {
                        float *o = k.xs + (ch * Dv + r0 + rl) * Dk + col;
                        o[0] = x[mt][s][2 * h];
                        o[1] = x[mt][s][2 * h + 1];
                    }
                }
            }
        lf_sync();
        // Y rows 16 w .. 16 w + 15, all LF_R columns
        float y[4][4];
#pragma unroll
        for (int n = 0; n < 4; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) y[n][e] = 0.0f;
        if (k.a.p) {
            for (int ks = 0; ks < Dk / 16; ks++) {
                uint32_t ah[4], al[4], bh[4], bl[4];
                const int ao = (16 * w + (lane & 15)) * LF_LDK + ks * 16 + (lane >> 4) * 8;
                ldsm_x4(ah, Ah + ao);
                if (!k.a_exact) ldsm_x4(al, Al + ao);
#pragma unroll
                for (int np = 0; np < 2; np++) {
                    const int bo = (np * 16 + (lane & 7) + (lane >> 4) * 8) * LF_LDK + ks * 16 + ((lane >> 3) & 1) * 8;
                    ldsm_x4(bh, Xh + bo);
                    ldsm_x4(bl, Xl + bo);
                    if (k.a_exact) {
                        mma_bf16_x2(&y[2 * np], ah, bl);
                        mma_bf16_x2(&y[2 * np], ah, bh);
                    } else {
                        mma3(y[2 * np], ah, al, bh[0], bh[1], bl[0], bl[1]);
                        mma3(y[2 * np + 1], ah, al, bh[2], bh[3], bl[2], bl[3]);
                    }
                }
            }
        }
#pragma unroll
        for (int n = 0; n < 4; n++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int t = 16 * w + lr + 8 * h, j = 8 * n + lc;
                float sa = k.ra ? k.sa * k.ra[ch * LF_C + t] : k.sa, sb = k.rb ? k.sb * k.rb[ch * LF_C + t] : k.sb;
                float v0 = lf_at(d, k.y0, ch, t, r0 + j) + sa * y[n][2 * h];
                float v1 = lf_at(d, k.y0, ch, t, r0 + j + 1) + sa * y[n][2 * h + 1];
                if (k.y) {
                    float *o = k.y + (ch * LF_C + t) * Dv + r0 + j;
                    if (r0 + j < Dv) o[0] = v0;
                    if (r0 + j + 1 < Dv) o[1] = v1;
                }
                lf_st2s(Yh + t * LF_LDR + j, Yl + t * LF_LDR + j, sb * v0, sb * v1);
            }
        lf_sync();
        const float dec = k.dec[ch];
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int s = 0; s < 4; s++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int r = r0 + 16 * mt + lr + 8 * (e >> 1), col = 8 * (w + 4 * s) + lc + (e & 1);
                    float a = dec * x[mt][s][e];
                    if (k.inc && r < Dv && w + 4 * s < NT) a += k.inc[(ch * Dv + r) * Dk + col];
                    x[mt][s][e] = a;
                }
#pragma unroll
        for (int pass = 0; pass < (INC2 ? 2 : 1); pass++) {
            const int bex = pass ? 1 : k.b_exact;
            if (pass) {  // the second increment: B2 into B's hi tile, sb2 diag(rb2) Y2 into Y's tiles
                lf_sync();
                lf_load(d, k.b2, ch, 0, Dk, Bh, LF_LDK, LF_UNR_WALK);
                for (int e = threadIdx.x; e < LF_C * LF_R / 2; e += blockDim.x) {
                    int t = e / (LF_R / 2), j = 2 * (e - t * (LF_R / 2));
                    float sc = k.rb2 ? k.sb2 * k.rb2[ch * LF_C + t] : k.sb2;
                    lf_st2s(Yh + t * LF_LDR + j, Yl + t * LF_LDR + j, sc * lf_at(d, k.y2, ch, t, r0 + j),
                            sc * lf_at(d, k.y2, ch, t, r0 + j + 1));
                }
                lf_sync();
            }
            for (int kt = 0; kt < LF_C / 16; kt++) {
                uint32_t ah[2][4], al[2][4];
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    const int ao = (kt * 16 + (lane & 7) + (lane >> 4) * 8) * LF_LDR + mt * 16 + ((lane >> 3) & 1) * 8;
                    ldsm_x4_t(ah[mt], Yh + ao);
                    ldsm_x4_t(al[mt], Yl + ao);
                }
#pragma unroll
                for (int sp = 0; sp < 2; sp++) {  // slots 2 sp, 2 sp + 1 (a slot past Dk reads a valid tile, unused)
                    int n0 = w + 8 * sp, n1 = n0 + 4 < NT ? n0 + 4 : n0;
                    if (n0 >= NT) continue;
                    const int bo = (kt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LF_LDK + ((lane >> 4) ? n1 : n0) * 8;
                    uint32_t bh[4], bl[4];
                    ldsm_x4_t(bh, Bh + bo);
                    if (bex) {
#pragma unroll
                        for (int mt = 0; mt < 2; mt++) {
                            mma_bf16(x[mt][2 * sp], al[mt], bh[0], bh[1]);
                            mma_bf16(x[mt][2 * sp], ah[mt], bh[0], bh[1]);
                            if (n0 + 4 < NT) {
                                mma_bf16(x[mt][2 * sp + 1], al[mt], bh[2], bh[3]);
                                mma_bf16(x[mt][2 * sp + 1], ah[mt], bh[2], bh[3]);
                            }
                        }
                        continue;
                    }
                    ldsm_x4_t(bl, Bl + bo);
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) {
                        mma3(x[mt][2 * sp], ah[mt], al[mt], bh[0], bh[1], bl[0], bl[1]);
                        if (n0 + 4 < NT) mma3(x[mt][2 * sp + 1], ah[mt], al[mt], bh[2], bh[3], bl[2], bl[3]);
                    }
                }
            }
        }
        lf_sync();
    }
    if (k.xfin)
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int s = 0; s < 4; s++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int r = r0 + 16 * mt + lr + 8 * (e >> 1), col = 8 * (w + 4 * s) + lc + (e & 1);
                    if (r < Dv && w + 4 * s < NT) k.xfin[((size_t)p * Dv + r) * Dk + col] = x[mt][s][e];
                }
}

// INC2 = 0 (lf_walk_kernel, the forward's and GLA's walks) or 1 (lf_walk2_kernel, the delta rule's
// adjoint walk with its second increment), two kernels so that the first keeps its registers.
// (Minimum blocks 1: without it ptxas held lf_walk2_kernel to 128 registers and spilled 124 bytes
// in the chunk loop; with it, 171 registers and no spill. Shared memory allows two blocks either way.)
static __global__ void __launch_bounds__(LF_THREADS, 1) lf_walk_kernel(const LcDims d, const LfWalk k) {
    lf_walk_body(d, k, 0);
}
static __global__ void __launch_bounds__(LF_THREADS, 1) lf_walk2_kernel(const LcDims d, const LfWalk k) {
    lf_walk_body(d, k, 1);
}

// One launch of lf_walk_kernel (its shared memory above the 48 KiB default allowed at every call, as
// attn_cuda.cu does: the attribute is the current device's).
static int lf_walk(CudaCtx *c, const LcDims *d, const LfWalk *wk) {
    const dim3 grid((unsigned)((d->Dv + LF_R - 1) / LF_R), (unsigned)d->P);
    if (wk->y2.p) {
        CU_TRY(cudaFuncSetAttribute(lf_walk2_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, LF_WALK_SMEM));
        lf_walk2_kernel<<<grid, LF_THREADS, LF_WALK_SMEM, c->stream>>>(*d, *wk);
    } else {
        CU_TRY(cudaFuncSetAttribute(lf_walk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, LF_WALK_SMEM));
        lf_walk_kernel<<<grid, LF_THREADS, LF_WALK_SMEM, c->stream>>>(*d, *wk);
    }
    LAUNCH_CHECK();
    return MN_OK;
}

// The delta rule's UT transform of one chunk (one block, 4 warps of 16 rows), for the fused
// forward: A = strictLower(diag(beta) (Gamma (.) K K^T)) (K K^T on the tensor cores), Tt = (I + A)^{-1}
// by forward substitution in fp32 (thread j < C owns column j: Tt_ij = -sum_{j <= m < i} A_im Tt_mj
// only reads its own column, so no barrier between rows), then W = Tt diag(beta gamma) K and
// U = Tt diag(beta) V on the tensor cores: the row scales folded into Tt's columns (fp32), which is
// split hi + lo (two products against the exact bf16 K or V), float32 chunk major [nch][C][D].
// tn holds -A transposed in its upper triangle (tn[m][i] = -A_im, m < i) and Tt in its lower one.
// Dynamic shared memory: LF_PREP_SMEM bytes.
#define LF_TT (LF_C * LF_LDO)
#define LF_PREP_SMEM ((LF_TK + 2 * LF_TT) * 2 + LF_C * (LF_C + 1) * 4)
static __global__ void __launch_bounds__(LF_THREADS) lf_prep_kernel(const LcDims d, const LcGates gt, const bf16 *kin,
                                                                   const bf16 *vin, float *wout, float *uout,
                                                                   float *ttout) {
    extern __shared__ __align__(16) unsigned char lf_dsmem[];
    bf16 *Ks = (bf16 *)lf_dsmem, *Th = Ks + LF_TK, *Tl = Th + LF_TT;
    float(*tn)[LF_C + 1] = (float(*)[LF_C + 1])(Tl + LF_TT);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, Dk = d.Dk, Dv = d.Dv, lr = lane >> 2, lc = 2 * (lane & 3);
    const size_t ch = blockIdx.x;
    const float *b = gt.b + ch * LF_C, *beta = gt.beta + ch * LF_C;
    LfSrc ks = {kin, NULL, 1, Dk};
    lf_load(d, ks, ch, 0, Dk, Ks, LF_LDK, LF_UNR);
    lf_sync();
    {
        float kk[8][4];
        lf_abt(kk, Ks, NULL, Ks, NULL, Dk, 0, w);  // columns past the warp's rows (above the diagonal) left zero
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int i = 16 * w + lr + 8 * (e >> 1), j = 8 * n + lc + (e & 1);
                if (j < i) tn[j][i] = -beta[i] * expf(b[i] - b[j]) * kk[n][e];
            }
    }
    lf_sync();
    const int j = threadIdx.x;
    if (j < LF_C)
        for (int i = j + 1; i < LF_C; i++) {
            float a = tn[j][i];
            for (int m = j + 1; m < i; m++) a = fmaf(tn[m][i], tn[m][j], a);
            tn[i][j] = a;
        }
    lf_sync();
    if (ttout)  // Tt itself (the fused delta backward's lf_utb_kernel)
        for (int e = threadIdx.x; e < LF_C * LF_C; e += blockDim.x) {
            int i = e / LF_C, m = e - i * LF_C;
            ttout[ch * LF_C * LF_C + e] = m < i ? tn[i][m] : m == i ? 1.0f : 0.0f;
        }
    for (int pass = 0; pass < 2; pass++) {  // W, then U
        const int D = pass ? Dv : Dk;
        const float *sc = (pass ? gt.beta : gt.bg) + ch * LF_C;
        for (int e = threadIdx.x; e < LF_C * LF_C; e += blockDim.x) {
            int i = e / LF_C, m = e - i * LF_C;
            float x = m < i ? tn[i][m] * sc[m] : m == i ? sc[i] : 0.0f, h = lf_hi(x);
            st(Th, (size_t)i * LF_LDO + m, h);
            st(Tl, (size_t)i * LF_LDO + m, x - h);
        }
        LfSrc src = {pass ? (const void *)vin : (const void *)kin, NULL, 1, D};
        lf_load(d, src, ch, 0, D, Ks, LF_LDK, LF_UNR);
        lf_sync();
        float acc[16][4];
#pragma unroll
        for (int n = 0; n < 16; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[n][e] = 0.0f;
        for (int kt = 0; kt <= w; kt++) {  // Tt is lower triangular
            uint32_t ah[4], al[4];
            ldsm_x4(ah, Th + (16 * w + (lane & 15)) * LF_LDO + kt * 16 + (lane >> 4) * 8);
            ldsm_x4(al, Tl + (16 * w + (lane & 15)) * LF_LDO + kt * 16 + (lane >> 4) * 8);
#pragma unroll
            for (int dp = 0; dp < 8; dp++) {
                if (dp * 16 >= D) continue;
                uint32_t bb[4];
                ldsm_x4_t(bb, Ks + (kt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LF_LDK + dp * 16 + (lane >> 4) * 8);
                mma_bf16_x2(&acc[2 * dp], al, bb);
                mma_bf16_x2(&acc[2 * dp], ah, bb);
            }
        }
        float *out = pass ? uout : wout;
#pragma unroll
        for (int n = 0; n < 16; n++) {
            if (n * 8 >= D) continue;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int t = 16 * w + lr + 8 * h;
                float *o = out + (ch * LF_C + t) * D + 8 * n + lc;
                o[0] = acc[n][2 * h];
                o[1] = acc[n][2 * h + 1];
            }
        }
        lf_sync();
    }
}

// Rows c0 .. c0 + 63 of the chunk's state (float32 [Dv][Dk]; zero past Dv) into two bf16 tiles of
// row stride LF_LDK, hi + lo.
static __device__ __forceinline__ void lf_load_state(const LcDims d, const float *states, size_t ch, int c0, bf16 *hi,
                                                     bf16 *lo) {
    const int n4 = d.Dk / 4, total = LF_RO * n4;
    for (int e0 = threadIdx.x; e0 < total; e0 += LF_UNR * blockDim.x) {
        float4 f[LF_UNR];
#pragma unroll
        for (int u = 0; u < LF_UNR; u++) {
            int e = e0 + u * blockDim.x, r = e / n4;
            f[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (e < total && c0 + r < d.Dv) f[u] = *(const float4 *)(states + (ch * d.Dv + c0 + r) * d.Dk + 4 * (e - r * n4));
        }
#pragma unroll
        for (int u = 0; u < LF_UNR; u++) {
            int e = e0 + u * blockDim.x, r = e / n4;
            if (e >= total) continue;
            size_t o = (size_t)r * LF_LDK + 4 * (e - r * n4);
            lf_st2s(hi + o, lo + o, f[u].x, f[u].y);
            lf_st2s(hi + o + 2, lo + o + 2, f[u].z, f[u].w);
        }
    }
}

// The output of one (chunk, slice of LF_RO columns of Dv), both rules, 4 warps of 16 rows:
//     O = diag(gamma) Qs S^T + ((Qs K^T) (.) Gamma) V'
// q, k bf16 as given (exact operands); S the chunk's entry state (float32 [nch][Dv][Dk]); V' from vp
// (LfSrc: the delta rule's float32 V', or GLA's diag(beta) V read from v). Qs K^T masked and scaled
// in fp32 in registers, then split into bf16 A fragments hi + lo for the second product
// (FlashAttention's P V); S and V' split too (two products for Q S^T, three for P V'), so that O
// carries about its own bf16 rounding only. Dynamic shared memory: LF_OUT_SMEM bytes.
//
// BWD = 1: the same kernel gives the backward's dV' (GLA), the roles swapped:
//     dV' = diag(lambda) K dS^T + ((K Qs^T) (.) Gamma^T) dO
// with qin = k (the rows' operand), kin = q, states = the adjoints dS, vp = dO (exact bf16), the
// scores' upper triangle (j >= i, scale e^{b_j - b_i}); out gets dv = diag(beta) dV' (bf16) and
// part[(ch C + t) gridDim.y + blockIdx.y] the slice's share of v_t . dV'_t (vin = v).
// BWD = 2 (the delta rule's backward): the intra-chunk part ((K Qs^T) (.) Gamma^T) dO only (no
// states), out float32 chunk major [nch][C][Dv] (fout, every row), read by the reverse walk as Y0.
#define LF_TO (LF_C * LF_LDO)
#define LF_OUT_SMEM ((3 * LF_TK + 2 * LF_TO) * 2 + LF_C * 4 * 4)

// BWD (0, 1 or 2, a constant at each call, folded by the inlining): which of the three kernels.
static __device__ __forceinline__ void lf_out_body(const LcDims d, const LcGates gt, const bf16 *qin, const bf16 *kin,
                                                   const float *states, const LfSrc vp, float scale, bf16 *out,
                                                   const bf16 *vin, float *part, float *fout, const int BWD) {
    extern __shared__ __align__(16) unsigned char lf_dsmem[];
    bf16 *Qs = (bf16 *)lf_dsmem, *KS = Qs + LF_TK, *Sl = KS + LF_TK, *Vh = Sl + LF_TK, *Vl = Vh + LF_TO;
    float *red = (float *)(Vl + LF_TO);  // [64][4] (BWD): the row sums' shares of the lanes
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, Dk = d.Dk, Dv = d.Dv, lr = lane >> 2, lc = 2 * (lane & 3);
    const size_t ch = blockIdx.x;
    const int c0 = blockIdx.y * LF_RO, p = (int)(ch / d.N), t0 = (int)(ch % d.N) * LF_C;
    const float *b = gt.b + ch * LF_C;
    LfSrc qsrc = {qin, NULL, 1, Dk}, ksrc = {kin, NULL, 1, Dk};
    lf_load(d, qsrc, ch, 0, Dk, Qs, LF_LDK, LF_UNR);
    if (BWD != 2) lf_load_state(d, states, ch, c0, KS, Sl);  // S now (hi + lo), K in S's hi tile after it
    lf_load2(d, vp, ch, c0, LF_RO, Vh, Vl, LF_LDO, LF_UNR);
    lf_sync();
    float o[8][4];
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[n][e] = 0.0f;
    for (int s = 0; s < (BWD == 2 ? 0 : Dk / 16); s++) {
        uint32_t af[4], bh[4], bl[4];
        ldsm_x4(af, Qs + (16 * w + (lane & 15)) * LF_LDK + s * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int np = 0; np < 4; np++) {
            if (c0 + np * 16 >= Dv) continue;
            const int bo = (np * 16 + (lane & 7) + (lane >> 4) * 8) * LF_LDK + s * 16 + ((lane >> 3) & 1) * 8;
            ldsm_x4(bh, KS + bo);
            ldsm_x4(bl, Sl + bo);
            mma_bf16_x2(&o[2 * np], af, bl);
            mma_bf16_x2(&o[2 * np], af, bh);
        }
    }
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const size_t r = ch * LF_C + 16 * w + lr + 8 * (e >> 1);
            o[n][e] *= BWD ? gt.lam[r] : scale * gt.gam[r];
        }
    lf_sync();  // S's hi tile read: it takes K
    lf_load(d, ksrc, ch, 0, Dk, KS, LF_LDK, LF_UNR);
    lf_sync();
    float att[8][4];
    lf_abt(att, Qs, NULL, KS, NULL, Dk, BWD ? w : 0, BWD ? 3 : w);  // keys after the warp's last row (BWD: before its first) left zero
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int i = 16 * w + lr + 8 * (e >> 1), j = 8 * n + lc + (e & 1);
            if (BWD) att[n][e] = j >= i ? scale * expf(b[j] - b[i]) * att[n][e] : 0.0f;
            else att[n][e] = j <= i ? scale * expf(b[i] - b[j]) * att[n][e] : 0.0f;
        }
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        if (BWD ? kk < w : kk > w) continue;
        float hv[8];
#pragma unroll
        for (int e = 0; e < 8; e++) hv[e] = lf_hi(att[2 * kk + (e >> 2)][e & 3]);
        uint32_t ph[4] = {pack_bf16(hv[0], hv[1]), pack_bf16(hv[2], hv[3]), pack_bf16(hv[4], hv[5]),
                          pack_bf16(hv[6], hv[7])};
        uint32_t pl[4] = {pack_bf16(att[2 * kk][0] - hv[0], att[2 * kk][1] - hv[1]),
                          pack_bf16(att[2 * kk][2] - hv[2], att[2 * kk][3] - hv[3]),
                          pack_bf16(att[2 * kk + 1][0] - hv[4], att[2 * kk + 1][1] - hv[5]),
                          pack_bf16(att[2 * kk + 1][2] - hv[6], att[2 * kk + 1][3] - hv[7])};
#pragma unroll
        for (int dp = 0; dp < 4; dp++) {
            if (c0 + dp * 16 >= Dv) continue;
            const int bo = (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LF_LDO + dp * 16 + (lane >> 4) * 8;
            uint32_t bh[4], bl[4];
            ldsm_x4_t(bh, Vh + bo);
            ldsm_x4_t(bl, Vl + bo);
            mma3(o[2 * dp], ph, pl, bh[0], bh[1], bl[0], bl[1]);
            mma3(o[2 * dp + 1], ph, pl, bh[2], bh[3], bl[2], bl[3]);
        }
    }
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int i = 16 * w + lr + 8 * (e >> 1), col = c0 + 8 * n + lc + (e & 1);
            if (!BWD && t0 + i < d.T && col < Dv) st(out, lc_tok(d, p, t0 + i) * Dv + col, o[n][e]);
        }
    if (BWD == 2)
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int i = 16 * w + lr + 8 * (e >> 1), col = c0 + 8 * n + lc + (e & 1);
                if (col < Dv) fout[(ch * LF_C + i) * Dv + col] = o[n][e];
            }
    if (BWD != 1) return;
    float rs[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int i = 16 * w + lr + 8 * (e >> 1), col = c0 + 8 * n + lc + (e & 1);
            if (t0 + i >= d.T || col >= Dv) continue;
            size_t o_ = lc_tok(d, p, t0 + i) * Dv + col;
            rs[e >> 1] = fmaf(ld(vin, o_), o[n][e], rs[e >> 1]);
            st(out, o_, gt.beta[ch * LF_C + i] * o[n][e]);
        }
    red[(16 * w + lr) * 4 + (lane & 3)] = rs[0];
    red[(16 * w + lr + 8) * 4 + (lane & 3)] = rs[1];
    lf_sync();
    if (threadIdx.x < LF_C) {
        const float *rr = red + threadIdx.x * 4;
        part[(ch * LF_C + threadIdx.x) * gridDim.y + blockIdx.y] = (rr[0] + rr[1]) + (rr[2] + rr[3]);
    }
}

static __global__ void __launch_bounds__(LF_THREADS) lf_out_kernel(const LcDims d, const LcGates gt, const bf16 *qin,
                                                                  const bf16 *kin, const float *states, const LfSrc vp,
                                                                  float scale, bf16 *out) {
    lf_out_body(d, gt, qin, kin, states, vp, scale, out, NULL, NULL, NULL, 0);
}

static __global__ void __launch_bounds__(LF_THREADS) lf_dv_kernel(const LcDims d, const LcGates gt, const bf16 *kin,
                                                                 const bf16 *qin, const float *dst, const LfSrc dout,
                                                                 float scale, bf16 *dv, const bf16 *vin, float *part) {
    lf_out_body(d, gt, kin, qin, dst, dout, scale, dv, vin, part, NULL, 1);
}

static __global__ void __launch_bounds__(LF_THREADS) lf_dvi_kernel(const LcDims d, const LcGates gt, const bf16 *kin,
                                                                  const bf16 *qin, const LfSrc dout, float scale,
                                                                  float *dvp) {
    lf_out_body(d, gt, kin, qin, NULL, dout, scale, NULL, NULL, NULL, dvp, 2);
}

// Columns c0 .. c0 + 63 of the chunk's state (float32 [Dv][Dk]; zero past Dk), all Dv rows, into two
// bf16 tiles [Dv][LF_LDO], hi + lo (the B operand [k = Dv][n = columns] of dO S and V' dS).
static __device__ __forceinline__ void lf_load_state_cols(const LcDims d, const float *states, size_t ch, int c0,
                                                          bf16 *hi, bf16 *lo) {
    const int n4 = LF_RO / 4, total = d.Dv * n4;
    for (int e0 = threadIdx.x; e0 < total; e0 += LF_UNR * blockDim.x) {
        float4 f[LF_UNR];
#pragma unroll
        for (int u = 0; u < LF_UNR; u++) {
            int e = e0 + u * blockDim.x, r = e / n4, col = c0 + 4 * (e - r * n4);
            f[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (e < total && col < d.Dk) f[u] = *(const float4 *)(states + (ch * d.Dv + r) * d.Dk + col);
        }
#pragma unroll
        for (int u = 0; u < LF_UNR; u++) {
            int e = e0 + u * blockDim.x, r = e / n4;
            if (e >= total) continue;
            size_t o = (size_t)r * LF_LDO + 4 * (e - r * n4);
            lf_st2s(hi + o, lo + o, f[u].x, f[u].y);
            lf_st2s(hi + o + 2, lo + o + 2, f[u].z, f[u].w);
        }
    }
}

// acc (16 rows of the warp x 64 columns: 8 n-tiles) += P X, P the warp's masked scores (fp32, 8 tiles
// of 16 x 8 over the chunk's 64 columns, tiles kk < kmin or kk > kmax zero and skipped) split into A
// fragments hi + lo, X [64][LF_LDO] exact bf16 in shared memory; columns c0 + 16 dp past D skipped.
static __device__ __forceinline__ void lf_pv(float acc[8][4], const float att[8][4], const bf16 *X, int kmin, int kmax,
                                             int c0, int D) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        if (kk < kmin || kk > kmax) continue;
        float hv[8];
#pragma unroll
        for (int e = 0; e < 8; e++) hv[e] = lf_hi(att[2 * kk + (e >> 2)][e & 3]);
        uint32_t ph[4] = {pack_bf16(hv[0], hv[1]), pack_bf16(hv[2], hv[3]), pack_bf16(hv[4], hv[5]),
                          pack_bf16(hv[6], hv[7])};
        uint32_t pl[4] = {pack_bf16(att[2 * kk][0] - hv[0], att[2 * kk][1] - hv[1]),
                          pack_bf16(att[2 * kk][2] - hv[2], att[2 * kk][3] - hv[3]),
                          pack_bf16(att[2 * kk + 1][0] - hv[4], att[2 * kk + 1][1] - hv[5]),
                          pack_bf16(att[2 * kk + 1][2] - hv[6], att[2 * kk + 1][3] - hv[7])};
#pragma unroll
        for (int dp = 0; dp < 4; dp++) {
            if (c0 + dp * 16 >= D) continue;
            uint32_t bb[4];
            ldsm_x4_t(bb, X + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LF_LDO + dp * 16 + (lane >> 4) * 8);
            mma_bf16_x2(&acc[2 * dp], pl, bb);
            mma_bf16_x2(&acc[2 * dp], ph, bb);
        }
    }
}

// acc += A X with A the warp's 16 rows of a [64][LF_LDK] bf16 tile over nk = D / 16 steps of k
// (exact, or hi A + lo Al) and X [D][LF_LDO] a state slice hi + lo (two products, three with Al);
// columns c0 + 16 dp past Dc skipped.
static __device__ __forceinline__ void lf_as(float acc[8][4], const bf16 *A, const bf16 *Al, const bf16 *Xh,
                                             const bf16 *Xl, int D, int c0, int Dc) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int s = 0; s < D / 16; s++) {
        uint32_t af[4], al[4];
        ldsm_x4(af, A + (16 * w + (lane & 15)) * LF_LDK + s * 16 + (lane >> 4) * 8);
        if (Al) ldsm_x4(al, Al + (16 * w + (lane & 15)) * LF_LDK + s * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int dp = 0; dp < 4; dp++) {
            if (c0 + dp * 16 >= Dc) continue;
            const int bo = (s * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LF_LDO + dp * 16 + (lane >> 4) * 8;
            uint32_t bh[4], bl[4];
            ldsm_x4_t(bh, Xh + bo);
            ldsm_x4_t(bl, Xl + bo);
            if (Al) {
                mma_bf16_x2(&acc[2 * dp], al, bh);
            }
            mma_bf16_x2(&acc[2 * dp], af, bl);
            mma_bf16_x2(&acc[2 * dp], af, bh);
        }
    }
}

// The backward's dQs and dK of one (chunk, slice of LF_RO columns of Dk), GLA (V' = diag(beta) V), 4
// warps of 16 rows:
//     dQs = diag(gamma) dO S + P1 K,         P1 = (dO V'^T) (.) Gamma
//     dK  = diag(lambda) V' dS + P1^T Qs,    P1^T = (V' dO^T) (.) Gamma^T
// dO, V, q, k bf16 as given (exact operands; beta and the decays applied to the scores in fp32), S
// (the chunk's entry state) and dS (the adjoint of its end state) float32 [nch][Dv][Dk], their
// column slices split hi + lo in shared memory (S first, then dS in its place); the masked scores
// in registers, split into A fragments hi + lo (lf_pv). Out: dq = scale dQs, dk (bf16 [B,T,H,Dk]),
// part[(ch C + t) gridDim.y + blockIdx.y] the slice's share of q_t . dq_t. Dynamic shared memory
// LF_DQK_SMEM bytes.
#define LF_TSV (LF_KMAX * LF_LDO)  // a state slice [Dv][64]
//
// DELTA = 1: V' is the delta rule's (vp: float32 [nch][C][Dv], split hi + lo into one more tile: three
// products where it enters), no beta in the scores, lambda alone on V' dS; out: dQs (unscaled) and
// dK before the UT transform's terms, float32 chunk major [nch][C][Dk] (fdq, fdk; every row), no
// shares. Dynamic shared memory LF_DQK_SMEM + (DELTA) LF_TK * 2 bytes.
#define LF_DQK_SMEM ((2 * LF_TK + 2 * LF_TSV + 2 * LF_TO) * 2 + LF_C * 4 * 4)
// DELTA (0 or 1, a constant at each call, folded by the inlining): the delta rule's variant.
static __device__ __forceinline__ void lf_dqk_body(const LcDims d, const LcGates gt, const bf16 *qin, const bf16 *kin,
                                                   const bf16 *vin, const float *vp, const bf16 *doin,
                                                   const float *sts, const float *dst, float scale, bf16 *dq,
                                                   bf16 *dk, float *part, float *fdq, float *fdk, const int DELTA) {
    extern __shared__ __align__(16) unsigned char lf_dsmem[];
    bf16 *Do = (bf16 *)lf_dsmem, *Vt = Do + LF_TK, *Sh = Vt + LF_TK, *Sl = Sh + LF_TSV, *Kc = Sl + LF_TSV,
         *Qc = Kc + LF_TO;
    float *red = (float *)(Qc + LF_TO);
    bf16 *Vl = DELTA ? (bf16 *)(red + LF_C * 4) : NULL;  // V' lo
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, Dk = d.Dk, Dv = d.Dv, lr = lane >> 2, lc = 2 * (lane & 3);
    const size_t ch = blockIdx.x;
    const int c0 = blockIdx.y * LF_RO, p = (int)(ch / d.N), t0 = (int)(ch % d.N) * LF_C;
    const float *b = gt.b + ch * LF_C, *beta = gt.beta + ch * LF_C;
    lf_load(d, lf_src_d(doin, Dv), ch, 0, Dv, Do, LF_LDK, LF_UNR);
    const LfSrc vps = {vp, NULL, 0, Dv};
    if (DELTA) lf_load2(d, vps, ch, 0, Dv, Vt, Vl, LF_LDK, LF_UNR);
    else lf_load(d, lf_src_d(vin, Dv), ch, 0, Dv, Vt, LF_LDK, LF_UNR);
    lf_load(d, lf_src_d(kin, Dk), ch, c0, LF_RO, Kc, LF_LDO, LF_UNR);
    lf_load(d, lf_src_d(qin, Dk), ch, c0, LF_RO, Qc, LF_LDO, LF_UNR);
    lf_load_state_cols(d, sts, ch, c0, Sh, Sl);
    lf_sync();
    float acc[8][4], att[8][4];
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[n][e] = 0.0f;
    lf_as(acc, Do, NULL, Sh, Sl, Dv, c0, Dk);  // dO S
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[n][e] *= gt.gam[ch * LF_C + 16 * w + lr + 8 * (e >> 1)];
    lf_abt(att, Do, NULL, Vt, Vl, Dv, 0, w);  // dO V^T, then (.) Gamma, beta on the columns (DELTA: dO V'^T)
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int i = 16 * w + lr + 8 * (e >> 1), j = 8 * n + lc + (e & 1);
            att[n][e] = j <= i ? (DELTA ? 1.0f : beta[j]) * expf(b[i] - b[j]) * att[n][e] : 0.0f;
        }
    lf_pv(acc, att, Kc, 0, w, c0, Dk);  // + P1 K
    if (DELTA) {
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int i = 16 * w + lr + 8 * (e >> 1), col = c0 + 8 * n + lc + (e & 1);
                if (col < Dk) fdq[(ch * LF_C + i) * Dk + col] = acc[n][e];
            }
    }
    float rs[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int i = 16 * w + lr + 8 * (e >> 1), cl = 8 * n + lc + (e & 1), col = c0 + cl;
            if (DELTA || t0 + i >= d.T || col >= Dk) continue;
            float x = scale * acc[n][e];
            rs[e >> 1] = fmaf(ld(Qc, (size_t)i * LF_LDO + cl), x, rs[e >> 1]);
            st(dq, lc_tok(d, p, t0 + i) * Dk + col, x);
        }
    red[(16 * w + lr) * 4 + (lane & 3)] = rs[0];
    red[(16 * w + lr + 8) * 4 + (lane & 3)] = rs[1];
    lf_sync();  // S read: dS takes its tiles
    if (!DELTA && threadIdx.x < LF_C) {
        const float *rr = red + threadIdx.x * 4;
        part[(ch * LF_C + threadIdx.x) * gridDim.y + blockIdx.y] = (rr[0] + rr[1]) + (rr[2] + rr[3]);
    }
    lf_load_state_cols(d, dst, ch, c0, Sh, Sl);
    lf_sync();
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[n][e] = 0.0f;
    lf_as(acc, Vt, Vl, Sh, Sl, Dv, c0, Dk);  // V dS, then diag(lambda beta) (DELTA: V' dS, lambda)
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const size_t r = ch * LF_C + 16 * w + lr + 8 * (e >> 1);
            acc[n][e] *= DELTA ? gt.lam[r] : gt.lam[r] * gt.beta[r];
        }
    lf_abt(att, Vt, Vl, Do, NULL, Dv, w, 3);  // V dO^T, then (.) Gamma^T, beta on the rows, scale (Qs = scale q)
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int i = 16 * w + lr + 8 * (e >> 1), j = 8 * n + lc + (e & 1);
            att[n][e] = j >= i ? scale * (DELTA ? 1.0f : beta[i]) * expf(b[j] - b[i]) * att[n][e] : 0.0f;
        }
    lf_pv(acc, att, Qc, w, 3, c0, Dk);  // + P1^T Qs
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int i = 16 * w + lr + 8 * (e >> 1), col = c0 + 8 * n + lc + (e & 1);
            if (DELTA && col < Dk) fdk[(ch * LF_C + i) * Dk + col] = acc[n][e];
            if (!DELTA && t0 + i < d.T && col < Dk) st(dk, lc_tok(d, p, t0 + i) * Dk + col, acc[n][e]);
        }
}

static __global__ void __launch_bounds__(LF_THREADS) lf_dqk_kernel(const LcDims d, const LcGates gt, const bf16 *qin,
                                                                  const bf16 *kin, const bf16 *vin, const bf16 *doin,
                                                                  const float *sts, const float *dst, float scale,
                                                                  bf16 *dq, bf16 *dk, float *part) {
    lf_dqk_body(d, gt, qin, kin, vin, NULL, doin, sts, dst, scale, dq, dk, part, NULL, NULL, 0);
}

static __global__ void __launch_bounds__(LF_THREADS) lf_dqk_delta_kernel(const LcDims d, const LcGates gt,
                                                                        const bf16 *qin, const bf16 *kin,
                                                                        const float *vp, const bf16 *doin,
                                                                        const float *sts, const float *dst, float scale,
                                                                        float *fdq, float *fdk) {
    lf_dqk_body(d, gt, qin, kin, NULL, vp, doin, sts, dst, scale, NULL, NULL, NULL, fdq, fdk, 1);
}

// acc (the warp's 16 rows x 64 columns) += A X: A [64][lda] bf16 (hi, and lo Al or NULL), rows 16 w..,
// K / 16 steps of k; X [K][ldx] (hi, and lo Xl or NULL) read transposed (row-major [k][n]), columns 0
// .. ncol - 1 of the 64 (16 at a time). Products: Ah Xh (+ Al Xh) (+ Ah Xl).
static __device__ __forceinline__ void lf_mm(float acc[8][4], const bf16 *Ah, const bf16 *Al, int lda, const bf16 *Xh,
                                             const bf16 *Xl, int ldx, int K, int ncol) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int s = 0; s < K / 16; s++) {
        uint32_t ah[4], al[4];
        const int ao = (16 * w + (lane & 15)) * lda + s * 16 + (lane >> 4) * 8;
        ldsm_x4(ah, Ah + ao);
        if (Al) ldsm_x4(al, Al + ao);
#pragma unroll
        for (int dp = 0; dp < 4; dp++) {
            if (dp * 16 >= ncol) continue;
            const int bo = (s * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * ldx + dp * 16 + (lane >> 4) * 8;
            uint32_t bh[4], bl[4];
            ldsm_x4_t(bh, Xh + bo);
            if (Xl) {
                ldsm_x4_t(bl, Xl + bo);
                mma_bf16_x2(&acc[2 * dp], ah, bl);
            }
            if (Al) {
                mma_bf16_x2(&acc[2 * dp], al, bh);
            }
            mma_bf16_x2(&acc[2 * dp], ah, bh);
        }
    }
}

static __device__ __forceinline__ void lf_zero(float a[8][4]) {
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) a[n][e] = 0.0f;
}

// The warp's fragment a (16 rows x 64 columns, mma accumulator layout) times s into hi + lo tiles
// (row stride ld; columns past ncol skipped); transposed (element (i, j) to [j][i]) where tr.
static __device__ __forceinline__ void lf_st_frag(const float a[8][4], float s, bf16 *hi, bf16 *lo, int ld, int ncol,
                                                  int tr) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, lr = lane >> 2, lc = 2 * (lane & 3);
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int i = 16 * w + lr + 8 * h, j = 8 * n + lc;
            if (j >= ncol) continue;
            if (!tr) {
                lf_st2s(hi + i * ld + j, lo + i * ld + j, s * a[n][2 * h], s * a[n][2 * h + 1]);
            } else {
#pragma unroll
                for (int u = 0; u < 2; u++) {
                    float x = s * a[n][2 * h + u], xh = lf_hi(x);
                    st(hi, (size_t)(j + u) * ld + i, xh);
                    st(lo, (size_t)(j + u) * ld + i, x - xh);
                }
            }
        }
}

// The delta rule's UT-transform adjoint of one chunk (one block of 4 warps, 16 rows each), for the
// fused backward (lin_chunk.c's DELTA terms), from dU = dV' (float32 [nch][C][Dv], split hi + lo), S
// (the entry state, float32, column slices split hi + lo), Tt (float32 [nch][C][C], transposed and
// split), k and v bf16 as given:
//     dW = -dV' S (shared memory, hi + lo),  Tt^T dW: dK += diag(beta gamma) Tt^T dW,
//     Tt^T dU (out tdu, float32 [nch][C][Dv]),  dTt = dU (diag(beta) V)^T + dW (diag(beta gamma) K)^T,
//     dA = -Tt^T dTt Tt^T (strictly lower),  D = diag(beta) dA (.) Gamma,  dK += D K + D^T K,
//     dbeta = rowsum(Tt^T dU (.) V) + gamma rowsum(Tt^T dW (.) K) + rowsum(dA (.) Gamma (.) K K^T)
// (dbt, float32 [nch][C]); dK (float32 [nch][C][Dk], every row) read, added to and written. Dynamic
// shared memory LF_UTB_SMEM bytes: dV', dW hi + lo and V, K ([64][LF_LDK] each), Tt^T hi + lo, and
// a region that holds S's column slice, then dTt / Tt^T dTt / D and D^T (hi + lo, [64][LF_LDO]).
#define LF_UTB_SMEM ((6 * LF_TK + 2 * LF_TSV + 2 * LF_TO) * 2 + LF_C * 4 * 4)
static __global__ void __launch_bounds__(LF_THREADS) lf_utb_kernel(const LcDims d, const LcGates gt, const bf16 *kin,
                                                                  const bf16 *vin, const float *dvp, const float *sts,
                                                                  const float *tt, float *tdu, float *dk, float *dbt) {
    extern __shared__ __align__(16) unsigned char lf_dsmem[];
    bf16 *Uh = (bf16 *)lf_dsmem, *Ul = Uh + LF_TK, *Wh = Ul + LF_TK, *Wl = Wh + LF_TK, *Vt = Wl + LF_TK,
         *Kt = Vt + LF_TK, *Sh = Kt + LF_TK, *Sl = Sh + LF_TSV, *Th = Sl + LF_TSV, *Tl = Th + LF_TO;
    bf16 *Mh = Sh, *Ml = Mh + LF_TO, *Nh = Ml + LF_TO, *Nl = Nh + LF_TO;  // (in S's place, after dW)
    float *red = (float *)(Tl + LF_TO);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, Dk = d.Dk, Dv = d.Dv, lr = lane >> 2, lc = 2 * (lane & 3);
    const size_t ch = blockIdx.x, r = ch * LF_C;
    const float *b = gt.b + r;
    const LfSrc us = {dvp, NULL, 0, Dv};
    lf_load(d, lf_src_d(vin, Dv), ch, 0, Dv, Vt, LF_LDK, LF_UNR);  // (copies in flight during lf_load2)
    lf_load(d, lf_src_d(kin, Dk), ch, 0, Dk, Kt, LF_LDK, LF_UNR);
    lf_load2(d, us, ch, 0, Dv, Uh, Ul, LF_LDK, LF_UNR);
    for (int e = threadIdx.x; e < LF_C * LF_C; e += blockDim.x) {  // Th[i][m] = Tt[m][i]
        int m = e / LF_C, i = e - m * LF_C;
        float x = tt[(r + m) * LF_C + i], h = lf_hi(x);
        st(Th, (size_t)i * LF_LDO + m, h);
        st(Tl, (size_t)i * LF_LDO + m, x - h);
    }
    float acc[8][4], att[8][4], rs[2] = {0.0f, 0.0f};
    for (int c0 = 0; c0 < Dk; c0 += LF_RO) {  // dW = -dV' S, a slice of 64 columns at a time
        lf_sync();
        lf_load_state_cols(d, sts, ch, c0, Sh, Sl);
        lf_sync();
        lf_zero(acc);
        lf_mm(acc, Uh, Ul, LF_LDK, Sh, Sl, LF_LDO, Dv, Dk - c0);
        lf_st_frag(acc, -1.0f, Wh + c0, Wl + c0, LF_LDK, Dk - c0, 0);
    }
    lf_sync();
    for (int c0 = 0; c0 < Dk; c0 += LF_RO) {  // Tt^T dW: dK += diag(beta gamma) Tt^T dW; dbeta's second term
        lf_zero(acc);
        lf_mm(acc, Th, Tl, LF_LDO, Wh + c0, Wl + c0, LF_LDK, LF_C, Dk - c0);
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int i = 16 * w + lr + 8 * (e >> 1), col = c0 + 8 * n + lc + (e & 1);
                if (col >= Dk) continue;
                rs[e >> 1] = fmaf(gt.gam[r + i] * ld(Kt, (size_t)i * LF_LDK + col), acc[n][e], rs[e >> 1]);
                float *o = dk + (r + i) * Dk + col;
                *o = fmaf(gt.bg[r + i], acc[n][e], *o);
            }
    }
    for (int c0 = 0; c0 < Dv; c0 += LF_RO) {  // Tt^T dU out; dbeta's first term
        lf_zero(acc);
        lf_mm(acc, Th, Tl, LF_LDO, Uh + c0, Ul + c0, LF_LDK, LF_C, Dv - c0);
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int i = 16 * w + lr + 8 * (e >> 1), col = c0 + 8 * n + lc + (e & 1);
                if (col >= Dv) continue;
                rs[e >> 1] = fmaf(ld(Vt, (size_t)i * LF_LDK + col), acc[n][e], rs[e >> 1]);
                tdu[(r + i) * Dv + col] = acc[n][e];
            }
    }
    // dTt = (dU V^T) diag(beta) + (dW K^T) diag(beta gamma)
    lf_abt(att, Uh, Ul, Vt, NULL, Dv, 0, 3);
    lf_abt(acc, Wh, Wl, Kt, NULL, Dk, 0, 3);
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int j = 8 * n + lc + (e & 1);
            att[n][e] = gt.beta[r + j] * att[n][e] + gt.bg[r + j] * acc[n][e];
        }
    lf_st_frag(att, 1.0f, Mh, Ml, LF_LDO, LF_C, 0);
    lf_sync();
    lf_zero(acc);
    lf_mm(acc, Th, Tl, LF_LDO, Mh, Ml, LF_LDO, LF_C, LF_C);  // Tt^T dTt
    lf_sync();
    lf_st_frag(acc, 1.0f, Mh, Ml, LF_LDO, LF_C, 0);
    lf_sync();
    lf_zero(acc);
    lf_mm(acc, Mh, Ml, LF_LDO, Th, Tl, LF_LDO, LF_C, LF_C);  // (Tt^T dTt) Tt^T = -dA
    lf_abt(att, Kt, NULL, Kt, NULL, Dk, 0, w);                // K K^T
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int i = 16 * w + lr + 8 * (e >> 1), j = 8 * n + lc + (e & 1);
            float x = j < i ? -acc[n][e] * expf(b[i] - b[j]) : 0.0f;  // dA (.) Gamma
            rs[e >> 1] = fmaf(x, att[n][e], rs[e >> 1]);
            acc[n][e] = gt.beta[r + i] * x;  // D
        }
    lf_sync();  // Tt^T dTt read: D and D^T take the region
    lf_st_frag(acc, 1.0f, Mh, Ml, LF_LDO, LF_C, 0);
    lf_st_frag(acc, 1.0f, Nh, Nl, LF_LDO, LF_C, 1);
    red[(16 * w + lr) * 4 + (lane & 3)] = rs[0];
    red[(16 * w + lr + 8) * 4 + (lane & 3)] = rs[1];
    lf_sync();
    if (threadIdx.x < LF_C) {
        const float *rr = red + threadIdx.x * 4;
        dbt[r + threadIdx.x] = (rr[0] + rr[1]) + (rr[2] + rr[3]);
    }
    for (int c0 = 0; c0 < Dk; c0 += LF_RO) {  // dK += D K + D^T K
        lf_zero(acc);
        lf_mm(acc, Mh, Ml, LF_LDO, Kt + c0, NULL, LF_LDK, LF_C, Dk - c0);
        lf_mm(acc, Nh, Nl, LF_LDO, Kt + c0, NULL, LF_LDK, LF_C, Dk - c0);
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int i = 16 * w + lr + 8 * (e >> 1), col = c0 + 8 * n + lc + (e & 1);
                if (col < Dk) dk[(r + i) * Dk + col] += acc[n][e];
            }
    }
}

// The backward's per-token gate gradients of one chunk (one block of LC_OUT_THREADS), fused path:
// from the slices' shares pq (q . dq, nq of them a token) and pv (v . dV', nv), dbeta = v . dV' and
// dg_t = <dS_end, S_end> + sum_{t' >= t} (q . dq - beta v . dV')_t' (in double: the terms cancel).
static __global__ void __launch_bounds__(LC_OUT_THREADS) lf_gates_bwd_kernel(const LcDims d, const LcGates gt,
                                                                             const float *pq, int nq, const float *pv,
                                                                             int nv, const float *st, const float *sfin,
                                                                             const float *dst, float *dg, float *dbeta,
                                                                             int has_g, int has_beta) {
    __shared__ double dG[LC_CMAX], red[LC_OUT_THREADS];
    __shared__ float dbs[LC_CMAX];
    const int tid = threadIdx.x;
    const size_t ch = blockIdx.x, r = ch * LF_C;
    const int p = (int)(ch / d.N), c = (int)(ch % d.N), t0 = c * LF_C, n = min(LF_C, d.T - t0);
    if (tid < n) {
        float qd = 0.0f, vd = 0.0f;
        for (int i = 0; i < nq; i++) qd += pq[(r + tid) * nq + i];
        for (int i = 0; i < nv; i++) vd += pv[(r + tid) * nv + i];
        dG[tid] = (double)qd - (double)gt.beta[r + tid] * vd;
        dbs[tid] = vd;
    }
    if (dg && has_g) {  // <dS_end, S_end>
        const float *se = c + 1 < d.N ? st + (ch + 1) * d.ss : sfin + (size_t)p * d.ss, *dse = dst + ch * d.ss;
        double s = 0;
        for (size_t e = tid; e < d.ss; e += blockDim.x) s += (double)se[e] * dse[e];
        red[tid] = s;
    }
    lf_sync();
    if (tid == 0 && dg) {
        double acc = 0;
        if (has_g)
            for (int i = 0; i < (int)blockDim.x; i++) acc += red[i];
        for (int t = n - 1; t >= 0; t--) {
            acc += dG[t];
            dg[lc_tok(d, p, t0 + t)] = has_g ? (float)acc : 0.0f;
        }
    }
    if (dbeta && tid < n) dbeta[lc_tok(d, p, t0 + tid)] = has_beta ? dbs[tid] : 0.0f;
}

// ------------------------------------------------------------------------------ host side

// Row-major strided-batched product on the tensor cores (TF32):
//   C_i = alpha op(A_i) op(B_i) + beta C_i,  op(A): m x k, op(B): k x n, C: m x n, i < batch,
// as cuBLAS's column-major C^T = op(B)^T op(A)^T. Batches over 65535 go in pieces.
static int bgemm(CudaCtx *c, int ta, int tb, int m, int n, int k, float alpha, const float *A, int lda, size_t sA,
                 const float *B, int ldb, size_t sB, float beta, float *Cm, int ldc, size_t sC, size_t batch) {
    for (size_t b0 = 0; b0 < batch; b0 += 65535) {
        int nb = (int)(batch - b0 < 65535 ? batch - b0 : 65535);
        CUBLAS_TRY(cublasGemmStridedBatchedEx(c->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, n,
                                              m, k, &alpha, B + b0 * sB, CUDA_R_32F, ldb, (long long)sB, A + b0 * sA,
                                              CUDA_R_32F, lda, (long long)sA, &beta, Cm + b0 * sC, CUDA_R_32F, ldc,
                                              (long long)sC, nb, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT));
    }
    return MN_OK;
}

static int lc_dims(LcDims *ld_, const MnMesaDims *d, const MnLinOpts *o, const char *fn) {
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

// Carves the buffers from one scratch allocation (bwd: the backward's too). (Products also read at
// chunk offsets c C D floats, 16-byte aligned where C D is a multiple of 4: C = 64 always.)
static int lc_alloc(const Backend *be, const LcDims *d, int delta, int bwd, LcWork *w) {
    size_t rk = d->nch * d->C * d->Dk, rv = d->nch * d->C * d->Dv, cc = d->nch * d->C * d->C, rg = d->nch * d->C;
    size_t states = d->nch * d->ss, fins = (size_t)d->P * d->ss;
    size_t nk = 4 + (delta ? 2 : 0) + (bwd ? 2 + (delta ? 2 : 0) : 0);
    size_t nv = (bwd ? 1 : 0) + 1 + (delta ? 1 : 0) + (bwd ? 4 + (delta ? 1 : 0) : 1);
    size_t nsq = (delta ? 2 : 0) + 1 + (bwd ? 1 : 0);
    size_t total = 6 * rg + d->nch + nk * rk + nv * rv + nsq * cc + states + fins + (bwd ? states + rg : 0) +
                   (!delta || bwd ? states : 0) + 40 * LC_ALIGN;  // (at most 40 buffers, each rounded up)
    float *m = (float *)cuda_scratch(be, sizeof(float) * total);
    if (!m) return MN_ERR_NOMEM;
    memset(w, 0, sizeof *w);
#define TAKE(ptr, n) (ptr = m, m += ((n) + LC_ALIGN - 1) / LC_ALIGN * LC_ALIGN)
    TAKE(w->gt.b, rg); TAKE(w->gt.gam, rg); TAKE(w->gt.lam, rg); TAKE(w->gt.beta, rg); TAKE(w->gt.bg, rg);
    TAKE(w->gt.dec, d->nch);
    TAKE(w->qs, rk); TAKE(w->qg, rk); TAKE(w->k, rk); TAKE(w->kl, rk);
    if (delta) { TAKE(w->kb, rk); TAKE(w->w, rk); }
    if (bwd) {
        TAKE(w->dqs, rk); TAKE(w->dk, rk);
        if (delta) { TAKE(w->dw, rk); TAKE(w->tdw, rk); }
        TAKE(w->v, rv);
    }
    TAKE(w->vb, rv);
    if (delta) TAKE(w->vp, rv); else w->vp = w->vb;
    if (bwd) {
        TAKE(w->dout, rv); TAKE(w->dog, rv); TAKE(w->dvp, rv); TAKE(w->vl, rv);
        if (delta) TAKE(w->tdu, rv);
    } else {
        TAKE(w->o, rv);
    }
    if (delta) { TAKE(w->kk, cc); TAKE(w->tt, cc); }
    TAKE(w->sq1, cc);
    if (bwd) TAKE(w->sq2, cc);
    TAKE(w->st, states); TAKE(w->sfin, fins);
    if (!delta || bwd) TAKE(w->inc, states);
    if (bwd) { TAKE(w->dst, states); TAKE(w->dbt, rg); }
#undef TAKE
    return MN_OK;
}

static LfSrc lf_src(const void *p, const float *rs, int tok, int D) {
    LfSrc s = {p, rs, tok, D};
    return s;
}

// Gates, the gathered inputs and (delta rule) K K^T, Tt, U (into V'), W: all chunks at once.
static int lc_prepare(CudaCtx *c, const LcDims *d, int delta, float scale, const bf16 *q, const bf16 *k,
                      const bf16 *v, const float *g, const float *beta, LcWork *w) {
    int C = d->C, Dk = d->Dk, Dv = d->Dv;
    size_t ck = (size_t)C * Dk, cv = (size_t)C * Dv, cc = (size_t)C * C;
    lc_gates_kernel<<<grid_for(d->nch, 128), 128, 0, c->stream>>>(*d, g, beta, w->gt);
    LAUNCH_CHECK();
    unsigned gk = grid_for(d->nch * ck, LC_THREADS), gv = grid_for(d->nch * cv, LC_THREADS);
    lc_gather_kernel<<<gk, LC_THREADS, 0, c->stream>>>(*d, q, Dk, scale, w->qs, w->gt.gam, w->qg, NULL, NULL);
    LAUNCH_CHECK();
    lc_gather_kernel<<<gk, LC_THREADS, 0, c->stream>>>(*d, k, Dk, 1.0f, w->k, w->gt.lam, w->kl, w->gt.bg, w->kb);
    LAUNCH_CHECK();
    lc_gather_kernel<<<gv, LC_THREADS, 0, c->stream>>>(*d, v, Dv, 1.0f, w->v, w->gt.beta, w->vb, NULL, NULL);
    LAUNCH_CHECK();
    if (!delta) return MN_OK;  // V' = diag(beta) V
    MN_TRY(bgemm(c, 0, 1, C, C, Dk, 1, w->k, Dk, ck, w->k, Dk, ck, 0, w->kk, C, cc, d->nch));  // K K^T
    lc_tinv_kernel<<<(unsigned)d->nch, C, 0, c->stream>>>(*d, w->kk, w->gt.b, w->gt.beta, w->tt);
    LAUNCH_CHECK();
    MN_TRY(bgemm(c, 0, 0, C, Dv, C, 1, w->tt, C, cc, w->vb, Dv, cv, 0, w->vp, Dv, cv, d->nch));  // U = Tt beta V
    MN_TRY(bgemm(c, 0, 0, C, Dk, C, 1, w->tt, C, cc, w->kb, Dk, ck, 0, w->w, Dk, ck, d->nch));   // W
    return MN_OK;
}

// The states entering every chunk (w->st) and the final ones (w->sfin), from s0 (or zero);
// for the delta rule V' = U - W S^T of every chunk on the way (in place in w->vp). The GLA rule's
// V' does not depend on the state: every chunk's increment V'^T diag(lambda) K is one product over
// all chunks, and the hand-off a scan (two launches); the delta rule's goes chunk by chunk.
static int lc_states(CudaCtx *c, const LcDims *d, int delta, const float *s0, LcWork *w) {
    int C = d->C, Dk = d->Dk, Dv = d->Dv, N = d->N, P = d->P;
    size_t ck = (size_t)C * Dk, cv = (size_t)C * Dv, ss = d->ss, sb = sizeof(float) * ss;
    if (!delta) {
        MN_TRY(bgemm(c, 1, 0, Dv, Dk, C, 1, w->vp, Dv, cv, w->kl, Dk, ck, 0, w->inc, Dk, ss, d->nch));
        lc_scan_kernel<<<grid_for((size_t)P * ss, LC_THREADS), LC_THREADS, 0, c->stream>>>(*d, w->st, w->inc, w->gt.dec, s0, w->sfin, 0);
        LAUNCH_CHECK();
        return MN_OK;
    }
    if (s0)
        CU_TRY(cudaMemcpy2DAsync(w->st, N * sb, s0, sb, sb, P, cudaMemcpyDeviceToDevice, c->stream));
    else
        CU_TRY(cudaMemset2DAsync(w->st, N * sb, 0, sb, P, c->stream));
    for (int ci = 0; ci < N; ci++) {
        float *cur = w->st + ci * ss, *next = ci + 1 < N ? cur + ss : w->sfin;
        size_t ns = ci + 1 < N ? N * ss : ss;
        MN_TRY(bgemm(c, 0, 1, C, Dv, Dk, -1, w->w + ci * ck, Dk, N * ck, cur, Dk, N * ss, 1, w->vp + ci * cv, Dv,
                     N * cv, P));  // V' = U - W S^T
        lc_decay_state_kernel<<<grid_for((size_t)P * ss, LC_THREADS), LC_THREADS, 0, c->stream>>>(next, ns, cur, N * ss, w->gt.dec + ci, N, NULL, P, ss);
        LAUNCH_CHECK();
        MN_TRY(bgemm(c, 1, 0, Dv, Dk, C, 1, w->vp + ci * cv, Dv, N * cv, w->kl + ci * ck, Dk, N * ck, 1, next, Dk, ns,
                     P));
    }
    return MN_OK;
}

// The fused path takes the call where it takes the shape (chunks of 64, Dk and Dv multiples of 16 up
// to 128) and the device allows its kernels' shared memory (smem bytes: the forward and GLA's
// backward 95 KiB, the delta rule's backward 157 KiB), unless MESANET_LIN=cublas (read at every
// call) asks for the cuBLAS path; the cuBLAS path otherwise.
static int lf_use(const CudaCtx *c, const LcDims *d, size_t smem) {
    const char *e = getenv("MESANET_LIN");
    if (e && !strcmp(e, "cublas")) return 0;
    return smem <= c->smem_optin && d->C == LF_C && d->Dk % 16 == 0 && d->Dk <= LF_KMAX && d->Dv % 16 == 0 && d->Dv <= LF_KMAX;
}

// The fused forward: gates (lc_gates_kernel), the delta rule's UT transform (lf_prep_kernel), the
// state walk (lf_walk_kernel) and the output (lf_out_kernel): 3 launches (GLA) or 4 (delta).
static int lf_forward(const Backend *be, CudaCtx *c, const LcDims *d, int delta, float scale, const MnLinFwd *io) {
    int Dk = d->Dk, Dv = d->Dv;
    size_t rg = d->nch * LF_C, rk = rg * Dk, rv = rg * Dv, states = d->nch * d->ss;
    size_t total = 6 * rg + d->nch + (delta ? rk + rv : 0) + states + 10 * LC_ALIGN;
    float *m = (float *)cuda_scratch(be, sizeof(float) * total);
    if (!m) return MN_ERR_NOMEM;
    LcGates gt;
    float *wb = NULL, *ub = NULL, *st_;
#define TAKE(ptr, n) (ptr = m, m += ((n) + LC_ALIGN - 1) / LC_ALIGN * LC_ALIGN)
    TAKE(gt.b, rg); TAKE(gt.gam, rg); TAKE(gt.lam, rg); TAKE(gt.beta, rg); TAKE(gt.bg, rg);
    TAKE(gt.dec, d->nch);
    if (delta) { TAKE(wb, rk); TAKE(ub, rv); }
    TAKE(st_, states);
#undef TAKE
    const bf16 *q = (const bf16 *)io->q, *k = (const bf16 *)io->k, *v = (const bf16 *)io->v;
    lc_gates_kernel<<<grid_for(d->nch, 128), 128, 0, c->stream>>>(*d, io->g, io->beta, gt);
    LAUNCH_CHECK();
    if (delta) {
        CU_TRY(cudaFuncSetAttribute(lf_prep_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, LF_PREP_SMEM));
        lf_prep_kernel<<<(unsigned)d->nch, LF_THREADS, LF_PREP_SMEM, c->stream>>>(*d, gt, k, v, wb, ub, (float *)NULL);
        LAUNCH_CHECK();
    }
    LfWalk wk;
    memset(&wk, 0, sizeof wk);
    if (delta) {
        wk.a = lf_src(wb, NULL, 0, Dk);
        wk.y0 = lf_src(ub, NULL, 0, Dv);
        wk.sa = -1.0f;
        wk.y = ub;  // V' in place of U
    } else {
        wk.y0 = lf_src(v, gt.beta, 1, Dv);
    }
    wk.b = lf_src(k, NULL, 1, Dk);  // K (exact in bf16), lambda on Y's rows
    wk.rb = gt.lam;
    wk.b_exact = 1;
    wk.sb = 1.0f;
    wk.dec = gt.dec;
    wk.init = io->s0;
    wk.xs = st_;
    wk.xfin = io->sT;
    MN_TRY(lf_walk(c, d, &wk));
    LfSrc vp = delta ? lf_src(ub, NULL, 0, Dv) : lf_src(v, gt.beta, 1, Dv);
    CU_TRY(cudaFuncSetAttribute(lf_out_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, LF_OUT_SMEM));
    lf_out_kernel<<<dim3((unsigned)d->nch, (unsigned)((Dv + LF_RO - 1) / LF_RO)), LF_THREADS, LF_OUT_SMEM, c->stream>>>(*d, gt, q, k, st_, vp, scale, (bf16 *)io->o);
    LAUNCH_CHECK();
    return MN_OK;
}

int cuda_lin_chunk_fwd(const Backend *be, const MnMesaDims *dm, const MnLinOpts *o, const MnLinFwd *io) {
    CudaCtx *c = cuda_ctx(be);
    LcDims d;
    MN_TRY(lc_dims(&d, dm, o, "cuda lin forward (chunk)"));
    int delta = o->rule == MN_LIN_DELTA, C = d.C, Dk = d.Dk, Dv = d.Dv;
    size_t ck = (size_t)C * Dk, cv = (size_t)C * Dv, cc = (size_t)C * C;
    if (lf_use(c, &d, LF_WALK_SMEM)) return lf_forward(be, c, &d, delta, o->scale, io);
    LcWork w;
    MN_TRY(lc_alloc(be, &d, delta, 0, &w));
    MN_TRY(lc_prepare(c, &d, delta, o->scale, (const bf16 *)io->q, (const bf16 *)io->k, (const bf16 *)io->v, io->g,
                      io->beta, &w));
    MN_TRY(lc_states(c, &d, delta, io->s0, &w));
    // O = diag(gamma) Qs S^T + ((Qs K^T) (.) Gamma) V'
    MN_TRY(bgemm(c, 0, 1, C, Dv, Dk, 1, w.qg, Dk, ck, w.st, Dk, d.ss, 0, w.o, Dv, cv, d.nch));
    MN_TRY(bgemm(c, 0, 1, C, C, Dk, 1, w.qs, Dk, ck, w.k, Dk, ck, 0, w.sq1, C, cc, d.nch));
    lc_mask_kernel<<<grid_for(d.nch * cc, LC_THREADS), LC_THREADS, 0, c->stream>>>(d, w.sq1, w.gt.b);
    LAUNCH_CHECK();
    MN_TRY(bgemm(c, 0, 0, C, Dv, C, 1, w.sq1, C, cc, w.vp, Dv, cv, 1, w.o, Dv, cv, d.nch));
    lc_scatter_kernel<<<grid_for(d.nch * cv, LC_THREADS), LC_THREADS, 0, c->stream>>>(d, (bf16 *)io->o, w.o, Dv, 1.0f);
    LAUNCH_CHECK();
    if (io->sT) CU_TRY(cudaMemcpyAsync(io->sT, w.sfin, sizeof(float) * d.P * d.ss, cudaMemcpyDeviceToDevice, c->stream));
    return MN_OK;
}

// The fused backward of the GLA rule: gates (lc_gates_kernel), the chunks' entry states again and
// the end states' adjoints (lf_walk_kernel twice: forward, then reverse with X = dS, Y = dO, B = Qs,
// gamma on Y's rows), dV' (lf_dv_kernel), dQs and dK (lf_dqk_kernel), dg and dbeta
// (lf_gates_bwd_kernel): 6 launches, reading the inputs as the call gives them.
static int lf_backward_gla(const Backend *be, CudaCtx *c, const LcDims *d, float scale, const MnLinBwd *io) {
    const int Dk = d->Dk, Dv = d->Dv, nyk = (Dk + LF_RO - 1) / LF_RO, nyv = (Dv + LF_RO - 1) / LF_RO;
    size_t rg = d->nch * LF_C, states = d->nch * d->ss, fins = (size_t)d->P * d->ss;
    size_t total = 5 * rg + d->nch + 2 * states + fins + rg * (nyk + nyv) + 11 * LC_ALIGN;
    float *m = (float *)cuda_scratch(be, sizeof(float) * total);
    if (!m) return MN_ERR_NOMEM;
    LcGates gt;
    float *st_, *dst, *sfin, *pq, *pv;
#define TAKE(ptr, n) (ptr = m, m += ((n) + LC_ALIGN - 1) / LC_ALIGN * LC_ALIGN)
    TAKE(gt.b, rg); TAKE(gt.gam, rg); TAKE(gt.lam, rg); TAKE(gt.beta, rg); TAKE(gt.bg, rg);
    TAKE(gt.dec, d->nch);
    TAKE(st_, states); TAKE(dst, states); TAKE(sfin, fins);
    TAKE(pq, rg * nyk); TAKE(pv, rg * nyv);
#undef TAKE
    const bf16 *q = (const bf16 *)io->q, *k = (const bf16 *)io->k, *v = (const bf16 *)io->v,
               *dout = (const bf16 *)io->dout;
    lc_gates_kernel<<<grid_for(d->nch, 128), 128, 0, c->stream>>>(*d, io->g, io->beta, gt);
    LAUNCH_CHECK();
    LfWalk wk;
    memset(&wk, 0, sizeof wk);  // S_c = the states entering the chunks
    wk.y0 = lf_src(v, gt.beta, 1, Dv);
    wk.b = lf_src(k, NULL, 1, Dk);
    wk.rb = gt.lam;
    wk.b_exact = 1;
    wk.sb = 1.0f;
    wk.dec = gt.dec;
    wk.init = io->s0;
    wk.xs = st_;
    wk.xfin = sfin;
    MN_TRY(lf_walk(c, d, &wk));
    memset(&wk, 0, sizeof wk);  // dS_c, last chunk first: dS <- gamma_n dS + dO^T diag(gamma) Qs
    wk.y0 = lf_src(dout, NULL, 1, Dv);
    wk.b = lf_src(q, NULL, 1, Dk);
    wk.rb = gt.gam;
    wk.b_exact = 1;
    wk.sb = scale;
    wk.dec = gt.dec;
    wk.init = io->dsT;
    wk.xs = dst;
    wk.xfin = io->ds0;
    wk.reverse = 1;
    MN_TRY(lf_walk(c, d, &wk));
    const LfSrc dos = lf_src(dout, NULL, 1, Dv);
    CU_TRY(cudaFuncSetAttribute(lf_dv_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, LF_OUT_SMEM));
    lf_dv_kernel<<<dim3((unsigned)d->nch, (unsigned)nyv), LF_THREADS, LF_OUT_SMEM, c->stream>>>(*d, gt, k, q, dst, dos, scale, (bf16 *)io->dv, v, pv);
    LAUNCH_CHECK();
    CU_TRY(cudaFuncSetAttribute(lf_dqk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, LF_DQK_SMEM));
    lf_dqk_kernel<<<dim3((unsigned)d->nch, (unsigned)nyk), LF_THREADS, LF_DQK_SMEM, c->stream>>>(*d, gt, q, k, v, dout, st_, dst, scale, (bf16 *)io->dq, (bf16 *)io->dk, pq);
    LAUNCH_CHECK();
    lf_gates_bwd_kernel<<<(unsigned)d->nch, LC_OUT_THREADS, 0, c->stream>>>(*d, gt, pq, nyk, pv, nyv, st_, sfin, dst, io->dg, io->dbeta, io->g != NULL, io->beta != NULL);
    LAUNCH_CHECK();
    return MN_OK;
}

// The fused backward of the delta rule: 8 launches reading the inputs as the call gives them (no
// float32 copies of them): gates; W, U and Tt (lf_prep_kernel); the entry states and V' (lf_walk_kernel);
// the intra-chunk dV' (lf_dvi_kernel); dV' and the adjoints dS (lf_walk2_kernel, reverse); dQs and dK's
// first terms (lf_dqk_delta_kernel); the UT transform's adjoint (lf_utb_kernel); the token gradients
// (lc_bwd_out_kernel, q and v read as bf16).
static int lf_backward_delta(const Backend *be, CudaCtx *c, const LcDims *d, float scale, const MnLinBwd *io) {
    const int Dk = d->Dk, Dv = d->Dv;
    size_t rg = d->nch * LF_C, rk = rg * Dk, rv = rg * Dv, cc = rg * LF_C, states = d->nch * d->ss;
    size_t fins = (size_t)d->P * d->ss;
    size_t total = 7 * rg + d->nch + 3 * rk + 3 * rv + cc + 2 * states + fins + 20 * LC_ALIGN;
    float *m = (float *)cuda_scratch(be, sizeof(float) * total);
    if (!m) return MN_ERR_NOMEM;
    LcWork w;
    memset(&w, 0, sizeof w);
#define TAKE(ptr, n) (ptr = m, m += ((n) + LC_ALIGN - 1) / LC_ALIGN * LC_ALIGN)
    TAKE(w.gt.b, rg); TAKE(w.gt.gam, rg); TAKE(w.gt.lam, rg); TAKE(w.gt.beta, rg); TAKE(w.gt.bg, rg);
    TAKE(w.gt.dec, d->nch);
    TAKE(w.w, rk); TAKE(w.vp, rv); TAKE(w.tt, cc); TAKE(w.st, states); TAKE(w.sfin, fins);
    TAKE(w.dvp, rv); TAKE(w.dst, states); TAKE(w.dqs, rk); TAKE(w.dk, rk); TAKE(w.tdu, rv); TAKE(w.dbt, rg);
#undef TAKE
    const bf16 *q = (const bf16 *)io->q, *k = (const bf16 *)io->k, *v = (const bf16 *)io->v,
               *dout = (const bf16 *)io->dout;
    lc_gates_kernel<<<grid_for(d->nch, 128), 128, 0, c->stream>>>(*d, io->g, io->beta, w.gt);
    LAUNCH_CHECK();
    CU_TRY(cudaFuncSetAttribute(lf_prep_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, LF_PREP_SMEM));
    lf_prep_kernel<<<(unsigned)d->nch, LF_THREADS, LF_PREP_SMEM, c->stream>>>(*d, w.gt, k, v, w.w, w.vp, w.tt);
    LAUNCH_CHECK();
    LfWalk wk;
    memset(&wk, 0, sizeof wk);  // S_c, and V' = U - W S^T in place of U
    wk.a = lf_src(w.w, NULL, 0, Dk);
    wk.y0 = lf_src(w.vp, NULL, 0, Dv);
    wk.b = lf_src(k, NULL, 1, Dk);
    wk.rb = w.gt.lam;
    wk.b_exact = 1;
    wk.sa = -1.0f;
    wk.sb = 1.0f;
    wk.dec = w.gt.dec;
    wk.init = io->s0;
    wk.xs = w.st;
    wk.y = w.vp;
    wk.xfin = w.sfin;
    MN_TRY(lf_walk(c, d, &wk));
    CU_TRY(cudaFuncSetAttribute(lf_dvi_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, LF_OUT_SMEM));
    lf_dvi_kernel<<<dim3((unsigned)d->nch, (unsigned)((Dv + LF_RO - 1) / LF_RO)), LF_THREADS, LF_OUT_SMEM, c->stream>>>(*d, w.gt, k, q, lf_src(dout, NULL, 1, Dv), scale, w.dvp);
    LAUNCH_CHECK();
    memset(&wk, 0, sizeof wk);  // dS_c and dV', last chunk first
    wk.a = lf_src(k, NULL, 1, Dk);
    wk.ra = w.gt.lam;
    wk.a_exact = 1;
    wk.y0 = lf_src(w.dvp, NULL, 0, Dv);
    wk.b = lf_src(w.w, NULL, 0, Dk);
    wk.sa = 1.0f;
    wk.sb = -1.0f;
    wk.dec = w.gt.dec;
    wk.y2 = lf_src(dout, NULL, 1, Dv);
    wk.b2 = lf_src(q, NULL, 1, Dk);
    wk.rb2 = w.gt.gam;
    wk.sb2 = scale;
    wk.init = io->dsT;
    wk.xs = w.dst;
    wk.y = w.dvp;
    wk.xfin = io->ds0;
    wk.reverse = 1;
    MN_TRY(lf_walk(c, d, &wk));
    const unsigned nyk = (unsigned)((Dk + LF_RO - 1) / LF_RO);
    const int smem = LF_DQK_SMEM + LF_TK * 2;
    CU_TRY(cudaFuncSetAttribute(lf_dqk_delta_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    lf_dqk_delta_kernel<<<dim3((unsigned)d->nch, nyk), LF_THREADS, smem, c->stream>>>(*d, w.gt, q, k, w.vp, dout, w.st, w.dst, scale, w.dqs, w.dk);
    LAUNCH_CHECK();
    CU_TRY(cudaFuncSetAttribute(lf_utb_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, LF_UTB_SMEM));
    lf_utb_kernel<<<(unsigned)d->nch, LF_THREADS, LF_UTB_SMEM, c->stream>>>(*d, w.gt, k, v, w.dvp, w.st, w.tt, w.tdu, w.dk, w.dbt);
    LAUNCH_CHECK();
    LcOut a = {NULL, w.dqs, NULL, w.dvp, w.tdu, w.dk, w.dbt, w.st, w.sfin, w.dst,
               (bf16 *)io->dq, (bf16 *)io->dk, (bf16 *)io->dv, io->dg, io->dbeta, io->g != NULL, io->beta != NULL,
               scale, q, v};
    lc_bwd_out_kernel<<<(unsigned)d->nch, LC_OUT_THREADS, 0, c->stream>>>(*d, w.gt, a);
    LAUNCH_CHECK();
    return MN_OK;
}

int cuda_lin_chunk_bwd(const Backend *be, const MnMesaDims *dm, const MnLinOpts *o, const MnLinBwd *io) {
    CudaCtx *c = cuda_ctx(be);
    LcDims d;
    MN_TRY(lc_dims(&d, dm, o, "cuda lin backward (chunk)"));
    int delta = o->rule == MN_LIN_DELTA, C = d.C, Dk = d.Dk, Dv = d.Dv, N = d.N, P = d.P;
    size_t ck = (size_t)C * Dk, cv = (size_t)C * Dv, cc = (size_t)C * C, ss = d.ss, sb = sizeof(float) * ss;
    if (lf_use(c, &d, delta ? LF_UTB_SMEM : LF_WALK_SMEM)) return delta ? lf_backward_delta(be, c, &d, o->scale, io) : lf_backward_gla(be, c, &d, o->scale, io);
    LcWork w;
    MN_TRY(lc_alloc(be, &d, delta, 1, &w));
    MN_TRY(lc_prepare(c, &d, delta, o->scale, (const bf16 *)io->q, (const bf16 *)io->k, (const bf16 *)io->v, io->g,
                      io->beta, &w));
    MN_TRY(lc_states(c, &d, delta, io->s0, &w));
    lc_gather_kernel<<<grid_for(d.nch * cv, LC_THREADS), LC_THREADS, 0, c->stream>>>(d, (const bf16 *)io->dout, Dv, 1.0f, w.dout, w.gt.gam, w.dog, NULL, NULL);
    LAUNCH_CHECK();
    // dV' = ((K Qs^T) (.) Gamma^T) dO for all chunks; the state term is added in the pass below
    MN_TRY(bgemm(c, 0, 1, C, C, Dk, 1, w.qs, Dk, ck, w.k, Dk, ck, 0, w.sq1, C, cc, d.nch));
    lc_mask_kernel<<<grid_for(d.nch * cc, LC_THREADS), LC_THREADS, 0, c->stream>>>(d, w.sq1, w.gt.b);
    LAUNCH_CHECK();
    MN_TRY(bgemm(c, 1, 0, C, Dv, C, 1, w.sq1, C, cc, w.dout, Dv, cv, 0, w.dvp, Dv, cv, d.nch));
    // the adjoints dS_c of the chunks' end states, last chunk first:
    //     dS_{c-1} = gamma_n dS_c + dO_c^T diag(gamma) Qs_c - dV'_c^T W_c (delta),  dV'_c += diag(lambda) K_c dS_c^T
    // The increments dO^T diag(gamma) Qs of all chunks in one product; then GLA (no W term): a scan,
    // and dV' of all chunks in one product; the delta rule chunk by chunk (dV'_c enters dS_{c-1}).
    MN_TRY(bgemm(c, 1, 0, Dv, Dk, C, 1, w.dout, Dv, cv, w.qg, Dk, ck, 0, w.inc, Dk, ss, d.nch));
    if (!delta) {
        lc_scan_kernel<<<grid_for((size_t)P * ss, LC_THREADS), LC_THREADS, 0, c->stream>>>(d, w.dst, w.inc, w.gt.dec, io->dsT, io->ds0, 1);
        LAUNCH_CHECK();
        MN_TRY(bgemm(c, 0, 1, C, Dv, Dk, 1, w.kl, Dk, ck, w.dst, Dk, ss, 1, w.dvp, Dv, cv, d.nch));
    } else {
        float *last = w.dst + (size_t)(N - 1) * ss;
        if (io->dsT)
            CU_TRY(cudaMemcpy2DAsync(last, N * sb, io->dsT, sb, sb, P, cudaMemcpyDeviceToDevice, c->stream));
        else
            CU_TRY(cudaMemset2DAsync(last, N * sb, 0, sb, P, c->stream));
        for (int ci = N - 1; ci >= 0; ci--) {
            float *cur = w.dst + ci * ss, *prev = ci > 0 ? cur - ss : io->ds0;
            size_t ps = ci > 0 ? N * ss : ss;
            MN_TRY(bgemm(c, 0, 1, C, Dv, Dk, 1, w.kl + ci * ck, Dk, N * ck, cur, Dk, N * ss, 1, w.dvp + ci * cv, Dv,
                         N * cv, P));  // dV' += diag(lambda) K dS^T
            if (!prev) break;  // (no ds0 wanted)
            lc_decay_state_kernel<<<grid_for((size_t)P * ss, LC_THREADS), LC_THREADS, 0, c->stream>>>(prev, ps, cur, N * ss, w.gt.dec + ci, N, w.inc + ci * ss, P, ss);  // gamma_n dS + dO^T diag(gamma) Qs
            LAUNCH_CHECK();
            MN_TRY(bgemm(c, 1, 0, Dv, Dk, C, -1, w.dvp + ci * cv, Dv, N * cv, w.w + ci * ck, Dk, N * ck, 1, prev, Dk,
                         ps, P));  // - dV'^T W
        }
    }
    // P1 = (dO V'^T) (.) Gamma;  dQs = diag(gamma) dO S + P1 K;  dK = diag(lambda) V' dS + P1^T Qs
    MN_TRY(bgemm(c, 0, 1, C, C, Dv, 1, w.dout, Dv, cv, w.vp, Dv, cv, 0, w.sq1, C, cc, d.nch));
    lc_mask_kernel<<<grid_for(d.nch * cc, LC_THREADS), LC_THREADS, 0, c->stream>>>(d, w.sq1, w.gt.b);
    LAUNCH_CHECK();
    MN_TRY(bgemm(c, 0, 0, C, Dk, Dv, 1, w.dog, Dv, cv, w.st, Dk, ss, 0, w.dqs, Dk, ck, d.nch));
    MN_TRY(bgemm(c, 0, 0, C, Dk, C, 1, w.sq1, C, cc, w.k, Dk, ck, 1, w.dqs, Dk, ck, d.nch));
    lc_rowscale_kernel<<<grid_for(d.nch * cv, LC_THREADS), LC_THREADS, 0, c->stream>>>(w.vl, w.vp, w.gt.lam, d.nch * C, Dv);
    LAUNCH_CHECK();
    MN_TRY(bgemm(c, 0, 0, C, Dk, Dv, 1, w.vl, Dv, cv, w.dst, Dk, ss, 0, w.dk, Dk, ck, d.nch));
    MN_TRY(bgemm(c, 1, 0, C, Dk, C, 1, w.sq1, C, cc, w.qs, Dk, ck, 1, w.dk, Dk, ck, d.nch));
    if (delta) {
        MN_TRY(bgemm(c, 0, 0, C, Dk, Dv, -1, w.dvp, Dv, cv, w.st, Dk, ss, 0, w.dw, Dk, ck, d.nch));    // dW = -dV' S
        MN_TRY(bgemm(c, 1, 0, C, Dv, C, 1, w.tt, C, cc, w.dvp, Dv, cv, 0, w.tdu, Dv, cv, d.nch));      // Tt^T dU
        MN_TRY(bgemm(c, 1, 0, C, Dk, C, 1, w.tt, C, cc, w.dw, Dk, ck, 0, w.tdw, Dk, ck, d.nch));       // Tt^T dW
        MN_TRY(bgemm(c, 0, 1, C, C, Dv, 1, w.dvp, Dv, cv, w.vb, Dv, cv, 0, w.sq2, C, cc, d.nch));      // dTt
        MN_TRY(bgemm(c, 0, 1, C, C, Dk, 1, w.dw, Dk, ck, w.kb, Dk, ck, 1, w.sq2, C, cc, d.nch));
        MN_TRY(bgemm(c, 1, 0, C, C, C, 1, w.tt, C, cc, w.sq2, C, cc, 0, w.sq1, C, cc, d.nch));         // Tt^T dTt
        MN_TRY(bgemm(c, 0, 1, C, C, C, -1, w.sq1, C, cc, w.tt, C, cc, 0, w.sq2, C, cc, d.nch));        // dA
        LcComb cb = {w.tdu, w.tdw, w.v, w.k, w.kk, w.sq2, w.dk, w.dbt};
        lc_delta_comb_kernel<<<(unsigned)d.nch, LC_CMAX, 0, c->stream>>>(d, w.gt, cb);
        LAUNCH_CHECK();
        MN_TRY(bgemm(c, 0, 0, C, Dk, C, 1, w.sq2, C, cc, w.k, Dk, ck, 1, w.dk, Dk, ck, d.nch));        // dK += D K
        MN_TRY(bgemm(c, 1, 0, C, Dk, C, 1, w.sq2, C, cc, w.k, Dk, ck, 1, w.dk, Dk, ck, d.nch));        // dK += D^T K
    }
    LcOut a = {w.qs, w.dqs, w.v, w.dvp, delta ? w.tdu : NULL, w.dk, w.dbt, w.st, w.sfin, w.dst,
               (bf16 *)io->dq, (bf16 *)io->dk, (bf16 *)io->dv, io->dg, io->dbeta, io->g != NULL, io->beta != NULL,
               o->scale, NULL, NULL};
    lc_bwd_out_kernel<<<(unsigned)d.nch, LC_OUT_THREADS, 0, c->stream>>>(d, w.gt, a);
    LAUNCH_CHECK();
    return MN_OK;
}
