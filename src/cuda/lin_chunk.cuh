/*
 * The gated linear-attention family on the GPU, chunkwise form (src/cpu/lin_chunk.c's algorithm:
 * its header has the formulas, forward and backward), from T = 64 on. Two paths share the shapes
 * and the gates here:
 *
 *   lc_  the cuBLAS path (lin_chunk_cublas.cu): float32 chunk-major copies, strided-batched TF32
 *        products over all chunks at once, only the state's hand-off from chunk to chunk
 *        sequential. Every shape; MESANET_LIN=cublas forces it.
 *   lf_  the fused path (lin_chunk_fused*.cu, lin_chunk_fused.cuh): tensor-core kernels (mma.sync on
 *        bf16, fp32 sums) that read q, k, v, dO as the call gives them, a fixed number of launches
 *        whatever T. The default, where it takes the shape (chunks of 64, Dk and Dv multiples of 16
 *        up to 128) and the device gives its kernels' shared memory. Built three times: for heads
 *        up to 128 with split products (the default), up to 32 (lin_chunk_fused_d32.cu), and with
 *        one bf16 product each (lin_chunk_fused_bf16.cu, MESANET_LIN=bf16).
 *
 * lin_chunk.cu holds the entry points, which choose the path, and the gates both paths compute
 * first. docs/cuda.md describes the kernels, their costs and what was tried.
 *
 * A sequence of T tokens is cut into N = ceil(T / C) chunks of C tokens (C = 64 by default, at most
 * 64); a short last chunk is padded with zero q, k, v and g = 0, beta = 0, which leaves every
 * formula exact (the padded rows add nothing and the decay across the chunk is that of its real
 * tokens). Chunk ch = p N + c of (sequence, head) pair p = b H + h. Gates per chunk
 * (lc_gates_kernel): b (cumulative log decay), gamma = e^b, lambda = e^{b_n - b}, beta, beta gamma,
 * [nch][C] float32, and e^{b_n} [nch].
 */
#ifndef MN_LIN_CHUNK_CUH
#define MN_LIN_CHUNK_CUH

#include <math.h>

#include "cuda_common.cuh"

#define LC_CMAX 64      // the chunk size at most, and the default: Tt's block sits in shared memory
#define LC_GPB (128 / LC_CMAX)  // lc_gates_kernel: chunks a block, a thread a token
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

// This thread's share of <x, y> over n floats, the block's threads striding (dg's term <dS_end,
// S_end>: two states a chunk, most of the gate kernels' bytes), in double (dg's terms cancel). Where n
// is a multiple of 4 (x, y then 16-byte aligned: states n floats apart in aligned buffers), 16-byte
// loads four at a time: one load after another left a third of the memory's rate.
__device__ __forceinline__ double lc_dot_share(const float *x, const float *y, size_t n) {
    double s[4] = {0, 0, 0, 0};
    if (n % 4 == 0) {
        const float4 *x4 = (const float4 *)x, *y4 = (const float4 *)y;
#pragma unroll 4
        for (size_t e = threadIdx.x; e < n / 4; e += blockDim.x) {
            const float4 a = x4[e], b = y4[e];
            s[0] += (double)a.x * b.x;
            s[1] += (double)a.y * b.y;
            s[2] += (double)a.z * b.z;
            s[3] += (double)a.w * b.w;
        }
    } else {
        for (size_t e = threadIdx.x; e < n; e += blockDim.x) s[0] += (double)x[e] * y[e];
    }
    return (s[0] + s[1]) + (s[2] + s[3]);
}

// The end of both paths' gate kernels (a block a chunk: its n tokens from t0 of sequence-head p),
// after a barrier: dg_t = <dS_end, S_end> + sum_{t' >= t} dG_t' (the dot's shares of the block's
// threads in red, where has_g), summed in double by one thread in a fixed order, and dbeta_t =
// dbs_t; 0 where the forward had no such gate.
__device__ __forceinline__ void lc_gates_store(const LcDims d, int p, int t0, int n, const double *dG, const float *dbs,
                                               const double *red, float *dg, float *dbeta, int has_g, int has_beta) {
    __syncthreads();
    if (threadIdx.x == 0 && dg) {
        double acc = 0;
        if (has_g)
            for (int i = 0; i < (int)blockDim.x; i++) acc += red[i];
        for (int t = n - 1; t >= 0; t--) {
            acc += dG[t];
            dg[lc_tok(d, p, t0 + t)] = has_g ? (float)acc : 0.0f;
        }
    }
    if (dbeta && (int)threadIdx.x < n) dbeta[lc_tok(d, p, t0 + (int)threadIdx.x)] = has_beta ? dbs[threadIdx.x] : 0.0f;
}

// The gates of every chunk (lin_chunk.cu), both paths.
__global__ void lc_gates_kernel(const LcDims d, const float *g, const float *beta, const LcGates gt);

// The cuBLAS path's forward and backward (lin_chunk_cublas.cu).
int lc_forward(const Backend *be, CudaCtx *c, const LcDims *d, int delta, float scale, const MnLinFwd *io);
int lc_backward(const Backend *be, CudaCtx *c, const LcDims *d, int delta, float scale, const MnLinBwd *io);

#endif
