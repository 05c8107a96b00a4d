/*
 * The Mesa core on the GPU: the chunkwise algorithm of src/cpu/mesa_chunk.c
 * (spec sections 3-4) as fused CUDA kernels, every product and all CG
 * arithmetic in float32 (inputs arrive in bf16; states H, G stay float32).
 *
 * One thread block per (chunk, sequence, head) solves the chunk's C = 64
 * systems at once: the chunk-entry state, the keys (and their transpose), the
 * CG direction and the intra-chunk scores live in shared memory; each thread
 * owns a 4-row tile of x, r and p in registers (products are register-tiled:
 * see t_row0). The sequential parts (chunk-entry states; the adjoints in
 * reverse) are separate kernels, one block per (sequence, head).
 *
 * Kernels, forward: states -> cg_forward. Backward: states -> cg_backward (the
 * second solve, per-token terms) -> adjoints (reverse over chunks) -> grads
 * (per chunk) -> dg_scan (reverse cumulative sum of dL/db).
 */
#include <math.h>
#include <stdlib.h>

#include "cuda_common.cuh"

extern "C" {
#include "core/mesa_args.h"
}

#define CH 64                 // chunk size on the GPU
#define NT 256                // threads per block: 16 row groups of 4 rows x 16 column lanes
#define MAXD 128              // largest head size the fused kernels take
#define RPT 4                 // rows per thread
#define MAXC (MAXD / 16)      // columns per thread, at most
#define LDT (CH + 4)          // row stride of k-major (transposed) blocks: 16-byte aligned, padded
#define RESIDUAL_FLOOR (4.0f / 16777216.0f)  // as on the CPU (src/cpu/cg.c)

static int pad16(int d) { return (d + 15) & ~15; }

// Sizes of one problem, passed to every kernel.
typedef struct {
    int B, T, H, Dk, Dv, Dp, Dvp, nchunks;
    int max_steps, precond, init;
    float tol2;  // squared stopping tolerance (at least the rounding floor)
} Geo;

__device__ __forceinline__ size_t tok_index(const Geo *g, int pair, int t) {
    int b = pair / g->H, h = pair % g->H;
    return ((size_t)b * g->T + t) * g->H + h;
}

// Thread layout of a chunk block (C rows x D columns): thread (rg, cl) owns
// rows 4 rg .. 4 rg + 3 and columns cl, cl + 16, cl + 32, ... Each product
// step loads 4 rows of the left operand as one 16-byte word and one value per
// owned column of the right operand: about 8 multiply-adds per shared-memory
// load, where one row per thread gave one.
__device__ __forceinline__ int t_row0() { return (threadIdx.x >> 4) * RPT; }
__device__ __forceinline__ int t_col() { return threadIdx.x & 15; }

typedef struct {
    float v[RPT][MAXC];
} Tile;

__device__ __forceinline__ void tile_zero(Tile *t) {
#pragma unroll
    for (int i = 0; i < RPT; i++)
#pragma unroll
        for (int j = 0; j < MAXC; j++) t->v[i][j] = 0;
}

// Sum over the 16 threads of a row group (a half-warp); all 16 always call it.
__device__ __forceinline__ float group_sum(float v) {
    unsigned mask = 0xFFFFu << (threadIdx.x & 16);
    for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(mask, v, o);
    return v;
}

// out[i] = a_row . b_row for each of the thread's rows.
__device__ __forceinline__ void tile_dot(float out[RPT], const Tile *a, const Tile *b, int nc) {
#pragma unroll
    for (int i = 0; i < RPT; i++) {
        float s = 0;
#pragma unroll
        for (int j = 0; j < MAXC; j++)
            if (j < nc) s += a->v[i][j] * b->v[i][j];
        out[i] = group_sum(s);
    }
}

// ------------------------------------------------------------------ chunk loading

// Rows t0 .. t0+C of one (sequence, head) of a [B,T,H,d] bf16 tensor into
// smem, row-major with stride `stride`; zero past T and past d (up to dpad).
__device__ void load_rows(float *dst, int stride, const bf16 *src, const Geo *g, int pair, int t0, int d, int dpad) {
    for (int e = threadIdx.x; e < CH * dpad; e += NT) {
        int r = e / dpad, c = e % dpad, t = t0 + r;
        dst[r * stride + c] = (t < g->T && c < d) ? ld(src, tok_index(g, pair, t) * d + c) : 0.0f;
    }
}

// The same rows k-major: dst[c * LDT + r].
__device__ void load_rows_t(float *dst, const bf16 *src, const Geo *g, int pair, int t0, int d, int dpad) {
    for (int e = threadIdx.x; e < CH * dpad; e += NT) {
        int r = e % CH, c = e / CH, t = t0 + r;
        dst[c * LDT + r] = (t < g->T && c < d) ? ld(src, tok_index(g, pair, t) * d + c) : 0.0f;
    }
}

// Float rows t0 .. t0+C of a [B,T,H,d] float tensor (the backward's Y), row-major or k-major.
__device__ void load_rows_f(float *dst, int stride, int kmajor, const float *src, const Geo *g, int pair, int t0, int d,
                            int dpad) {
    for (int e = threadIdx.x; e < CH * dpad; e += NT) {
        int r = kmajor ? e % CH : e / dpad, c = kmajor ? e / CH : e % dpad, t = t0 + r;
        float v = (t < g->T && c < d) ? src[tok_index(g, pair, t) * d + c] : 0.0f;
        if (kmajor) dst[c * LDT + r] = v;
        else dst[r * stride + c] = v;
    }
}

// A (rows x cols) float matrix from global (row stride cols) into smem, zero-padded to rpad x cpad.
__device__ void load_mat(float *dst, int stride, const float *src, int rows, int cols, int rpad, int cpad, int transpose) {
    for (int e = threadIdx.x; e < rpad * cpad; e += NT) {
        int r = e / cpad, c = e % cpad;
        float v = (r < rows && c < cols) ? src[(size_t)r * cols + c] : 0.0f;
        if (transpose) dst[c * stride + r] = v;
        else dst[r * stride + c] = v;
    }
}

// Decays of a chunk: b (cumulative log decay; rows past the end repeat the
// last), beta (0 past the end). Returns n, the chunk's real length.
__device__ int load_decays(float *b, float *beta, const float *g_log, const float *g_beta, const Geo *g, int pair,
                           int t0) {
    int n = min(CH, g->T - t0);
    if (threadIdx.x == 0) {
        float acc = 0;
        for (int r = 0; r < CH; r++) {
            if (r < n) acc += g_log[tok_index(g, pair, t0 + r)];
            b[r] = acc;
        }
    }
    for (int r = threadIdx.x; r < CH; r += NT) beta[r] = r < n ? g_beta[tok_index(g, pair, t0 + r)] : 0.0f;
    __syncthreads();
    return n;
}

// The thread's tile of rows t0 .. t0+C of a [B,T,H,d] bf16 tensor (zero past T and d).
__device__ void tile_load(Tile *t, const bf16 *src, const Geo *g, int pair, int t0, int d, int nc) {
    int r0 = t_row0(), cl = t_col();
#pragma unroll
    for (int i = 0; i < RPT; i++)
#pragma unroll
        for (int j = 0; j < MAXC; j++) {
            int tt = t0 + r0 + i, c = cl + 16 * j;
            t->v[i][j] = (j < nc && tt < g->T && c < d) ? ld(src, tok_index(g, pair, tt) * d + c) : 0.0f;
        }
}

__device__ void tile_store(bf16 *dst, const Tile *t, const Geo *g, int pair, int t0, int d, int nc) {
    int r0 = t_row0(), cl = t_col();
#pragma unroll
    for (int i = 0; i < RPT; i++)
#pragma unroll
        for (int j = 0; j < MAXC; j++) {
            int tt = t0 + r0 + i, c = cl + 16 * j;
            if (j < nc && tt < g->T && c < d) st(dst, tok_index(g, pair, tt) * d + c, t->v[i][j]);
        }
}

// Writes the tile k-major into smem: Mt[c * LDT + r] (the left operand of the next products).
__device__ __forceinline__ void tile_store_t(float *Mt, const Tile *t, int nc) {
    int r0 = t_row0(), cl = t_col();
#pragma unroll
    for (int j = 0; j < MAXC; j++)
        if (j < nc)
            *(float4 *)(Mt + (cl + 16 * j) * LDT + r0) = make_float4(t->v[0][j], t->v[1][j], t->v[2][j], t->v[3][j]);
}

// -------------------------------------------------------------- the GLA forms

// acc[i][j] += a_i b for the thread's 4 rows (a: 4 rows of the left operand).
__device__ __forceinline__ void fma_rows(Tile *acc, int j, float4 a, float b) {
    acc->v[0][j] += a.x * b;
    acc->v[1][j] += a.y * b;
    acc->v[2][j] += a.z * b;
    acc->v[3][j] += a.w * b;
}

// acc = scale (.) A S for the thread's tile: A k-major in smem (At[k][row]),
// S row-major [dk][lds]. Overwrites acc.
__device__ __forceinline__ void tile_state(Tile *acc, const float *At, const float *S, int lds, int dk, int nc,
                                           const float scale[RPT]) {
    int r0 = t_row0(), cl = t_col();
    tile_zero(acc);
    for (int k = 0; k < dk; k++) {
        float4 a = *(const float4 *)(At + k * LDT + r0);
        const float *srow = S + k * lds + cl;
#pragma unroll
        for (int j = 0; j < MAXC; j++)
            if (j < nc) fma_rows(acc, j, a, srow[16 * j]);
    }
#pragma unroll
    for (int i = 0; i < RPT; i++)
#pragma unroll
        for (int j = 0; j < MAXC; j++) acc->v[i][j] *= scale[i];
}

// St[s][row] = mask(row, s) A[row] . B[s] over the chunk: A and B k-major
// (At[k][row], Bt[k][s]). Forward mask (dir 0): exp(b_row - b_s) beta_s for
// s <= row; backward (dir 1): exp(b_s - b_row) for s >= row.
__device__ __forceinline__ void tile_scores(float *St, const float *At, const float *Bt, int dk, const float *b,
                                            const float *beta, int dir) {
    int r0 = t_row0(), cl = t_col();
    float acc[RPT][CH / 16];
#pragma unroll
    for (int i = 0; i < RPT; i++)
#pragma unroll
        for (int u = 0; u < CH / 16; u++) acc[i][u] = 0;
    for (int k = 0; k < dk; k++) {
        float4 a = *(const float4 *)(At + k * LDT + r0);
        const float *brow = Bt + k * LDT + cl;
#pragma unroll
        for (int u = 0; u < CH / 16; u++) {
            float bb = brow[16 * u];
            acc[0][u] += a.x * bb;
            acc[1][u] += a.y * bb;
            acc[2][u] += a.z * bb;
            acc[3][u] += a.w * bb;
        }
    }
#pragma unroll
    for (int u = 0; u < CH / 16; u++) {
        int s = cl + 16 * u;
        float m[RPT];
#pragma unroll
        for (int i = 0; i < RPT; i++) {
            int r = r0 + i;
            if (dir == 0) m[i] = s <= r ? __expf(b[r] - b[s]) * beta[s] : 0.0f;
            else m[i] = s >= r ? __expf(b[s] - b[r]) : 0.0f;
        }
        *(float4 *)(St + s * LDT + r0) = make_float4(acc[0][u] * m[0], acc[1][u] * m[1], acc[2][u] * m[2], acc[3][u] * m[3]);
    }
}

// acc += scores . Bm (Bm row-major [CH][ldb]), over the causal range only (the
// scores are zero elsewhere).
__device__ __forceinline__ void tile_scores_times(Tile *acc, const float *St, const float *Bm, int ldb, int nc, int dir) {
    int r0 = t_row0(), cl = t_col();
    int s0 = dir == 0 ? 0 : r0, s1 = dir == 0 ? r0 + RPT : CH;
    for (int s = s0; s < s1; s++) {
        float4 a = *(const float4 *)(St + s * LDT + r0);
        const float *brow = Bm + s * ldb + cl;
#pragma unroll
        for (int j = 0; j < MAXC; j++)
            if (j < nc) fma_rows(acc, j, a, brow[16 * j]);
    }
}

// Shared-memory layout of the chunk kernels (floats).
typedef struct {
    float *Hs;   // [Dm][Dm]  the state term's matrix (H, G or its transpose, an adjoint)
    float *At;   // [Dm][LDT] the left operand, k-major (CG direction, X, K, V, Delta)
    float *Bt;   // [Dm][LDT] the scores' right operand, k-major (K, V, X, Y, Delta)
    float *Bm;   // [CH][Dm]  the matrix the scores multiply, row-major (K, V, Delta, Y, X)
    float *St;   // [CH][LDT] masked scores, transposed
    float *Dg;   // [CH][Dm]  the Jacobi diagonal
    float *b, *beta, *lam, *red;  // [CH], [CH], [Dm], [Dm]
} Smem;

static size_t smem_floats(int Dp, int Dvp) {
    size_t dm = Dp > Dvp ? Dp : Dvp;
    return dm * dm + 2 * dm * LDT + 2 * CH * dm + (size_t)CH * LDT + 2 * CH + 2 * dm;
}

__device__ Smem carve(float *base, const Geo *g) {
    int dm = max(g->Dp, g->Dvp);
    Smem s;
    s.Hs = base;
    s.At = s.Hs + dm * dm;
    s.Bt = s.At + dm * LDT;
    s.Bm = s.Bt + dm * LDT;
    s.St = s.Bm + CH * dm;
    s.Dg = s.St + CH * LDT;
    s.b = s.Dg + CH * dm;
    s.beta = s.b + CH;
    s.lam = s.beta + CH;
    s.red = s.lam + dm;
    return s;
}

__device__ __forceinline__ void row_decays(float out[RPT], const float *b, float base, int sign) {
    int r0 = t_row0();
#pragma unroll
    for (int i = 0; i < RPT; i++) out[i] = __expf(sign > 0 ? b[r0 + i] : base - b[r0 + i]);
}

// A(P) for the tile's rows: e^b (.) P Hc + ((P K^T) (.) M) K + lambda (.) P,
// with Hs = Hc, Bt = K^T, Bm = K in smem. Rows that stopped pass p = 0.
__device__ void apply_operator(Tile *ap, const Tile *p, const Smem *s, const Geo *g, int with_lambda) {
    int nc = g->Dp / 16, cl = t_col();
    __syncthreads();  // the previous readers of At and St are done
    tile_store_t(s->At, p, nc);
    __syncthreads();
    tile_scores(s->St, s->At, s->Bt, g->Dp, s->b, s->beta, 0);
    float eb[RPT];
    row_decays(eb, s->b, 0, 1);
    tile_state(ap, s->At, s->Hs, g->Dp, g->Dp, nc, eb);
    __syncthreads();  // the scores are complete
    tile_scores_times(ap, s->St, s->Bm, g->Dp, nc, 0);
    if (with_lambda)
#pragma unroll
        for (int j = 0; j < MAXC; j++)
            if (j < nc) {
                float l = s->lam[cl + 16 * j];
#pragma unroll
                for (int i = 0; i < RPT; i++) ap->v[i][j] += l * p->v[i][j];
            }
}

// The Jacobi diagonal of each row's A_t into Dg: e^{b_t} diag(Hc) + sum_{s<=t} e^{b_t-b_s} beta_s k_s^2 + lambda.
__device__ void jacobi_diagonal(const Smem *s, const Geo *g) {
    int nc = g->Dp / 16, r0 = t_row0(), cl = t_col(), dm = max(g->Dp, g->Dvp);
#pragma unroll
    for (int i = 0; i < RPT; i++) {
        int r = r0 + i;
        float eb = __expf(s->b[r]);
        for (int j = 0; j < nc; j++) {
            int c = cl + 16 * j;
            float acc = eb * s->Hs[c * g->Dp + c] + s->lam[c];
            for (int t = 0; t <= r; t++) {
                float kv = s->Bm[t * g->Dp + c];
                acc += __expf(s->b[r] - s->b[t]) * s->beta[t] * kv * kv;
            }
            s->Dg[r * dm + c] = acc;
        }
    }
    __syncthreads();
}

// z = r / diag (Jacobi) or r.
__device__ __forceinline__ void precondition(Tile *z, const Tile *r, const Smem *s, const Geo *g, int use) {
    int nc = g->Dp / 16, r0 = t_row0(), cl = t_col(), dm = max(g->Dp, g->Dvp);
#pragma unroll
    for (int i = 0; i < RPT; i++)
#pragma unroll
        for (int j = 0; j < MAXC; j++)
            z->v[i][j] = (use && j < nc) ? r->v[i][j] / s->Dg[(r0 + i) * dm + cl + 16 * j] : r->v[i][j];
}

// Conjugate gradient for the chunk's rows (spec section 2): q in, x out,
// steps per row. A row stops at its tolerance (or the floor); the block stops
// when all rows have, or after max_steps. Shuffles are always made by all 16
// threads of a row group (stopped rows carry p = 0), never in divergent code.
__device__ void cg_solve(Tile *x, const Tile *q, const Smem *s, const Geo *g, int steps[RPT], const Tile *x0,
                         int use_given) {
    int nc = g->Dp / 16, jac = g->precond || g->init == MN_CG_INIT_JACOBI;
    Tile r, p, ap;
    if (jac) jacobi_diagonal(s, g);
    if (use_given) {
        *x = *x0;
    } else if (g->init == MN_CG_INIT_JACOBI) {
        precondition(x, q, s, g, 1);
    } else {
        tile_zero(x);
    }
    if (use_given || g->init == MN_CG_INIT_JACOBI) {
        apply_operator(&ap, x, s, g, 1);
#pragma unroll
        for (int i = 0; i < RPT; i++)
#pragma unroll
            for (int j = 0; j < MAXC; j++) r.v[i][j] = q->v[i][j] - ap.v[i][j];
    } else {
        r = *q;
    }
    float qq[RPT], rr[RPT], rz[RPT], thresh[RPT];
    int active[RPT];
    tile_dot(qq, q, q, nc);
    tile_dot(rr, &r, &r, nc);
    precondition(&p, &r, s, g, g->precond);
    tile_dot(rz, &r, &p, nc);
#pragma unroll
    for (int i = 0; i < RPT; i++) {
        thresh[i] = g->tol2 * qq[i];
        active[i] = rr[i] > thresh[i];
        steps[i] = 0;
        if (!active[i])
#pragma unroll
            for (int j = 0; j < MAXC; j++) p.v[i][j] = 0;
    }
    for (int step = 1; step <= g->max_steps; step++) {
        if (!__syncthreads_or(active[0] | active[1] | active[2] | active[3])) break;
        apply_operator(&ap, &p, s, g, 1);
        float pap[RPT];
        tile_dot(pap, &p, &ap, nc);
#pragma unroll
        for (int i = 0; i < RPT; i++) {
            if (!active[i]) continue;
            if (!(pap[i] > 0) || !(rz[i] > 0)) {  // converged exactly, or non-finite input
                active[i] = 0;
                continue;
            }
            float alpha = rz[i] / pap[i];
#pragma unroll
            for (int j = 0; j < MAXC; j++) {
                x->v[i][j] += alpha * p.v[i][j];
                r.v[i][j] -= alpha * ap.v[i][j];
            }
            steps[i] = step;
        }
        tile_dot(rr, &r, &r, nc);
#pragma unroll
        for (int i = 0; i < RPT; i++)
            if (active[i] && !(rr[i] > thresh[i])) active[i] = 0;
        precondition(&ap, &r, s, g, g->precond);  // z, in the space of ap
        float rzn[RPT];
        tile_dot(rzn, &r, &ap, nc);
#pragma unroll
        for (int i = 0; i < RPT; i++) {
            float beta = active[i] ? rzn[i] / rz[i] : 0.0f;
#pragma unroll
            for (int j = 0; j < MAXC; j++) p.v[i][j] = active[i] ? ap.v[i][j] + beta * p.v[i][j] : 0.0f;
            if (active[i]) rz[i] = rzn[i];
        }
    }
}

// ---------------------------------------------------------------- the kernels

// States entering every chunk (and the final ones) of one (sequence, head):
// states[pair][c] = (H [Dk*Dk], G [Dv*Dk]) for c = 0 .. nchunks.
__global__ void states_kernel(float *states, const bf16 *k, const bf16 *v, const float *glog, const float *gbeta,
                              const float *h0, const float *g0, Geo g) {
    extern __shared__ float sm[];
    int pair = blockIdx.x, dk = g.Dk, dv = g.Dv;
    size_t hh = (size_t)dk * dk, hg = hh + (size_t)dv * dk;
    float *Ks = sm, *Vs = Ks + CH * dk, *b = Vs + CH * dv, *beta = b + CH, *w = beta + CH;
    float *cur = states + (size_t)pair * (g.nchunks + 1) * hg;
    for (size_t e = threadIdx.x; e < hg; e += NT)
        cur[e] = e < hh ? (h0 ? h0[(size_t)pair * hh + e] : 0.0f) : (g0 ? g0[(size_t)pair * (hg - hh) + e - hh] : 0.0f);
    for (int c = 0; c < g.nchunks; c++) {
        int t0 = c * CH;
        __syncthreads();
        int n = load_decays(b, beta, glog, gbeta, &g, pair, t0);
        for (int e = threadIdx.x; e < CH * dk; e += NT) {
            int r = e / dk, t = t0 + r;
            Ks[e] = t < g.T ? ld(k, tok_index(&g, pair, t) * dk + e % dk) : 0.0f;
        }
        for (int e = threadIdx.x; e < CH * dv; e += NT) {
            int r = e / dv, t = t0 + r;
            Vs[e] = t < g.T ? ld(v, tok_index(&g, pair, t) * dv + e % dv) : 0.0f;
        }
        for (int r = threadIdx.x; r < CH; r += NT) w[r] = r < n ? __expf(b[n - 1] - b[r]) * beta[r] : 0.0f;
        __syncthreads();
        float decay = __expf(b[n - 1]);
        float *next = cur + hg;
        for (size_t e = threadIdx.x; e < hg; e += NT) {
            int i, j;
            const float *L;
            if (e < hh) {
                i = (int)(e / dk);
                j = (int)(e % dk);
                L = Ks;  // H[i][j] += sum_s k_s[i] w_s k_s[j]
            } else {
                i = (int)((e - hh) / dk);
                j = (int)((e - hh) % dk);
                L = Vs;  // G[i][j] += sum_s v_s[i] w_s k_s[j]
            }
            int ld_ = e < hh ? dk : dv;
            float acc = 0;
            for (int s = 0; s < n; s++) acc += L[s * ld_ + i] * w[s] * Ks[s * dk + j];
            next[e] = decay * cur[e] + acc;
        }
        cur = next;
    }
}

// Forward per chunk: CG for the chunk's systems, then the output
// O = e^b (.) X G^T + ((X K^T) (.) M) V.
__global__ void __launch_bounds__(NT, 1) cg_forward_kernel(bf16 *o, bf16 *x_out, int *steps_out, const bf16 *q,
                                                           const bf16 *k, const bf16 *v, const float *glog,
                                                           const float *gbeta, const float *lambda, const float *states,
                                                           const bf16 *x0, Geo g) {
    extern __shared__ float sm[];
    Smem s = carve(sm, &g);
    int c = blockIdx.x, pair = blockIdx.y, t0 = c * CH, h = pair % g.H, nc = g.Dp / 16, ncv = g.Dvp / 16;
    size_t hh = (size_t)g.Dk * g.Dk, hg = hh + (size_t)g.Dv * g.Dk;
    const float *st_in = states + ((size_t)pair * (g.nchunks + 1) + c) * hg;
    load_decays(s.b, s.beta, glog, gbeta, &g, pair, t0);
    load_mat(s.Hs, g.Dp, st_in, g.Dk, g.Dk, g.Dp, g.Dp, 0);
    load_rows(s.Bm, g.Dp, k, &g, pair, t0, g.Dk, g.Dp);
    load_rows_t(s.Bt, k, &g, pair, t0, g.Dk, g.Dp);
    for (int i = threadIdx.x; i < g.Dp; i += NT) s.lam[i] = i < g.Dk ? lambda[(size_t)h * g.Dk + i] : 1.0f;
    __syncthreads();
    Tile qt, xt, x0t;
    tile_load(&qt, q, &g, pair, t0, g.Dk, nc);
    if (x0) tile_load(&x0t, x0, &g, pair, t0, g.Dk, nc);
    int steps[RPT];
    cg_solve(&xt, &qt, &s, &g, steps, &x0t, x0 != NULL);
    tile_store(x_out, &xt, &g, pair, t0, g.Dk, nc);
    if (steps_out && t_col() == 0)
        for (int i = 0; i < RPT; i++) {
            int t = t0 + t_row0() + i;
            if (t < g.T) steps_out[tok_index(&g, pair, t)] = steps[i];
        }
    __syncthreads();
    tile_store_t(s.At, &xt, nc);
    load_mat(s.Hs, g.Dvp, st_in + hh, g.Dv, g.Dk, g.Dvp, g.Dp, 1);  // G^T: [Dk][Dv]
    load_rows(s.Bm, g.Dvp, v, &g, pair, t0, g.Dv, g.Dvp);
    __syncthreads();
    tile_scores(s.St, s.At, s.Bt, g.Dp, s.b, s.beta, 0);
    float eb[RPT];
    row_decays(eb, s.b, 0, 1);
    Tile out;
    tile_state(&out, s.At, s.Hs, g.Dvp, g.Dp, ncv, eb);
    __syncthreads();
    tile_scores_times(&out, s.St, s.Bm, g.Dvp, ncv, 0);
    tile_store(o, &out, &g, pair, t0, g.Dv, ncv);
}

// Backward, per chunk: R = G_t^T delta, Y = A^{-1} R (the second solve);
// writes dq = Y, Y (float) for the adjoints, the per-token term y.(lambda (.) x)
// of dL/db (src/cpu/mesa_chunk.c says why this form), and adds -sum_t y (.) x
// to dlambda.
__global__ void __launch_bounds__(NT, 1) cg_backward_kernel(bf16 *dq, float *y_out, float *tok_terms, float *dlambda,
                                                            int *steps_out, const bf16 *k, const bf16 *v, const bf16 *x,
                                                            const bf16 *dout, const float *glog, const float *gbeta,
                                                            const float *lambda, const float *states, Geo g) {
    extern __shared__ float sm[];
    Smem s = carve(sm, &g);
    int c = blockIdx.x, pair = blockIdx.y, t0 = c * CH, h = pair % g.H, nc = g.Dp / 16;
    int r0 = t_row0(), cl = t_col();
    size_t hh = (size_t)g.Dk * g.Dk, hg = hh + (size_t)g.Dv * g.Dk;
    const float *st_in = states + ((size_t)pair * (g.nchunks + 1) + c) * hg;
    load_decays(s.b, s.beta, glog, gbeta, &g, pair, t0);
    // R = e^b (.) Delta G + ((Delta V^T) (.) M) K
    load_rows_t(s.At, dout, &g, pair, t0, g.Dv, g.Dvp);            // Delta, k-major
    load_mat(s.Hs, g.Dp, st_in + hh, g.Dv, g.Dk, g.Dvp, g.Dp, 0);  // G: [Dv][Dk]
    load_rows_t(s.Bt, v, &g, pair, t0, g.Dv, g.Dvp);               // V, k-major
    load_rows(s.Bm, g.Dp, k, &g, pair, t0, g.Dk, g.Dp);            // K
    for (int i = threadIdx.x; i < g.Dp; i += NT) s.lam[i] = i < g.Dk ? lambda[(size_t)h * g.Dk + i] : 1.0f;
    __syncthreads();
    tile_scores(s.St, s.At, s.Bt, g.Dvp, s.b, s.beta, 0);
    float eb[RPT];
    row_decays(eb, s.b, 0, 1);
    Tile rhs;
    tile_state(&rhs, s.At, s.Hs, g.Dp, g.Dvp, nc, eb);
    __syncthreads();
    tile_scores_times(&rhs, s.St, s.Bm, g.Dp, nc, 0);
    // the second solve, with the forward's operator
    __syncthreads();
    load_mat(s.Hs, g.Dp, st_in, g.Dk, g.Dk, g.Dp, g.Dp, 0);
    load_rows_t(s.Bt, k, &g, pair, t0, g.Dk, g.Dp);
    __syncthreads();
    Tile y, xt;
    int steps[RPT];
    cg_solve(&y, &rhs, &s, &g, steps, &y, 0);
    tile_load(&xt, x, &g, pair, t0, g.Dk, nc);
    // y.(lambda (.) x) per token, and -sum over the chunk's rows of y (.) x for dlambda
    Tile lx;
#pragma unroll
    for (int j = 0; j < MAXC; j++) {
        float l = j < nc ? s.lam[cl + 16 * j] : 0.0f;
#pragma unroll
        for (int i = 0; i < RPT; i++) lx.v[i][j] = l * xt.v[i][j];
    }
    float ylx[RPT];
    tile_dot(ylx, &y, &lx, nc);
    tile_store(dq, &y, &g, pair, t0, g.Dk, nc);
#pragma unroll
    for (int i = 0; i < RPT; i++) {
        int t = t0 + r0 + i;
        if (t >= g.T) continue;
        size_t ti = tok_index(&g, pair, t);
#pragma unroll
        for (int j = 0; j < MAXC; j++) {
            int cc = cl + 16 * j;
            if (j < nc && cc < g.Dk) y_out[ti * g.Dk + cc] = y.v[i][j];
        }
        if (cl == 0) {
            tok_terms[ti] = ylx[i];
            if (steps_out) steps_out[ti] = steps[i];
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < g.Dp; i += NT) s.red[i] = 0;
    __syncthreads();
#pragma unroll
    for (int j = 0; j < MAXC; j++) {
        if (j >= nc) continue;
        float acc = 0;
#pragma unroll
        for (int i = 0; i < RPT; i++)
            if (t0 + r0 + i < g.T) acc -= y.v[i][j] * xt.v[i][j];
        atomicAdd(&s.red[cl + 16 * j], acc);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < g.Dk; i += NT) atomicAdd(&dlambda[(size_t)h * g.Dk + i], s.red[i]);
}

// The state adjoints at the end of every chunk, in reverse (spec section 4):
// Gbar_{c-1} = e^{b_n} Gbar_c + Delta^T diag(e^b) X;  Hn_{c-1} = e^{b_n} Hn_c + Y^T diag(e^b) X
// (Hn = -Hbar). adj[pair][c] = (Gbar [Dv*Dk], Hn [Dk*Dk]) at the end of chunk c;
// also dg0 = Gbar_{-1}, dh0 = -Hn_{-1}, and db_final = <dhT, H_T> + <dgT, G_T>.
__global__ void adjoints_kernel(float *adj, float *dh0, float *dg0, float *db_final, const bf16 *x, const bf16 *dout,
                                const float *y, const float *glog, const float *gbeta, const float *states,
                                const float *dhT, const float *dgT, Geo g) {
    extern __shared__ float sm[];
    int pair = blockIdx.x, dk = g.Dk, dv = g.Dv;
    size_t gg = (size_t)dv * dk, hh = (size_t)dk * dk, ag = gg + hh;
    float *Xs = sm, *Ds = Xs + CH * dk, *Ys = Ds + CH * dv, *b = Ys + CH * dk, *beta = b + CH, *red = beta + CH;
    float *adj_p = adj + (size_t)pair * g.nchunks * ag;
    // the last chunk's exit adjoints are the final states' gradients
    float *cur = adj_p + (size_t)(g.nchunks - 1) * ag;
    for (size_t e = threadIdx.x; e < ag; e += NT)
        cur[e] = e < gg ? (dgT ? dgT[(size_t)pair * gg + e] : 0.0f) : (dhT ? -dhT[(size_t)pair * hh + e - gg] : 0.0f);
    const float *fin = states + ((size_t)pair * (g.nchunks + 1) + g.nchunks) * (hh + gg);
    float acc = 0;
    for (size_t e = threadIdx.x; e < hh + gg; e += NT)
        acc += e < hh ? (dhT ? dhT[(size_t)pair * hh + e] * fin[e] : 0.0f) : (dgT ? dgT[(size_t)pair * gg + e - hh] * fin[e] : 0.0f);
    acc = block_sum(acc, red);
    if (threadIdx.x == 0) db_final[pair] = acc;
    for (int c = g.nchunks - 1; c >= 0; c--) {
        int t0 = c * CH;
        __syncthreads();
        int n = load_decays(b, beta, glog, gbeta, &g, pair, t0);
        for (int e = threadIdx.x; e < CH * dk; e += NT) {
            int r = e / dk, t = t0 + r;
            float eb = __expf(b[r]);
            Xs[e] = t < g.T ? eb * ld(x, tok_index(&g, pair, t) * dk + e % dk) : 0.0f;  // rows scaled by e^{b_t}
            Ys[e] = t < g.T ? y[tok_index(&g, pair, t) * dk + e % dk] : 0.0f;
        }
        for (int e = threadIdx.x; e < CH * dv; e += NT) {
            int r = e / dv, t = t0 + r;
            Ds[e] = t < g.T ? ld(dout, tok_index(&g, pair, t) * dv + e % dv) : 0.0f;
        }
        __syncthreads();
        float decay = __expf(b[n - 1]);
        float *prev = c > 0 ? adj_p + (size_t)(c - 1) * ag : NULL;
        for (size_t e = threadIdx.x; e < ag; e += NT) {
            int i, j;
            const float *L;
            int ldl;
            if (e < gg) {
                i = (int)(e / dk);
                j = (int)(e % dk);
                L = Ds;
                ldl = dv;
            } else {
                i = (int)((e - gg) / dk);
                j = (int)((e - gg) % dk);
                L = Ys;
                ldl = dk;
            }
            float s = 0;
            for (int r = 0; r < n; r++) s += L[r * ldl + i] * Xs[r * dk + j];
            float val = decay * cur[e] + s;
            if (prev) prev[e] = val;
            else if (e < gg) {
                if (dg0) dg0[(size_t)pair * gg + e] = val;
            } else if (dh0) {
                dh0[(size_t)pair * hh + e - gg] = -val;
            }
        }
        if (prev) cur = prev;
    }
}

// Backward, per chunk, with the adjoints at the chunk's end:
//   P  = ((K X^T) (.) D^T) Delta + diag(u) K Gbar^T      Qv = ((V Delta^T) (.) D^T) X + diag(u) V Gbar
//   R1 = ((K X^T) (.) D^T) Y + diag(u) K Hn^T            R2 = ((K Y^T) (.) D^T) X + diag(u) K Hn
//   dv = beta P, dk = beta (Qv - R1 - R2), dbeta = v.P - k.R1, db = y.(lambda (.) x) - beta dbeta
// (Hn = -Hbar; u = e^{b_n - b_t}, the decay from a token to the chunk's end.)
__global__ void __launch_bounds__(NT, 1) grads_kernel(bf16 *dk_out, bf16 *dv_out, float *dbeta_out, float *db_out,
                                                      const bf16 *k, const bf16 *v, const bf16 *x, const bf16 *dout,
                                                      const float *y, const float *tok_terms, const float *glog,
                                                      const float *gbeta, const float *adj, Geo g) {
    extern __shared__ float sm[];
    Smem s = carve(sm, &g);
    int c = blockIdx.x, pair = blockIdx.y, t0 = c * CH, nc = g.Dp / 16, ncv = g.Dvp / 16;
    size_t gg = (size_t)g.Dv * g.Dk, hh = (size_t)g.Dk * g.Dk;
    const float *gbar = adj + ((size_t)pair * g.nchunks + c) * (gg + hh), *hn = gbar + gg;
    int n = load_decays(s.b, s.beta, glog, gbeta, &g, pair, t0);
    float u[RPT];
    row_decays(u, s.b, s.b[n - 1], -1);
    Tile P, Qv, R1, R2;
    // P: scores K X^T, times Delta; state Gbar^T [Dk][Dv]
    load_rows_t(s.At, k, &g, pair, t0, g.Dk, g.Dp);
    load_rows_t(s.Bt, x, &g, pair, t0, g.Dk, g.Dp);
    load_rows(s.Bm, g.Dvp, dout, &g, pair, t0, g.Dv, g.Dvp);
    load_mat(s.Hs, g.Dvp, gbar, g.Dv, g.Dk, g.Dvp, g.Dp, 1);
    __syncthreads();
    tile_scores(s.St, s.At, s.Bt, g.Dp, s.b, s.beta, 1);
    tile_state(&P, s.At, s.Hs, g.Dvp, g.Dp, ncv, u);
    __syncthreads();
    tile_scores_times(&P, s.St, s.Bm, g.Dvp, ncv, 1);
    // R1: the same scores, times Y; state Hn^T
    __syncthreads();
    load_rows_f(s.Bm, g.Dp, 0, y, &g, pair, t0, g.Dk, g.Dp);
    load_mat(s.Hs, g.Dp, hn, g.Dk, g.Dk, g.Dp, g.Dp, 1);
    __syncthreads();
    tile_state(&R1, s.At, s.Hs, g.Dp, g.Dp, nc, u);
    tile_scores_times(&R1, s.St, s.Bm, g.Dp, nc, 1);
    // R2: scores K Y^T, times X; state Hn
    __syncthreads();
    load_rows_f(s.Bt, 0, 1, y, &g, pair, t0, g.Dk, g.Dp);
    load_rows(s.Bm, g.Dp, x, &g, pair, t0, g.Dk, g.Dp);
    load_mat(s.Hs, g.Dp, hn, g.Dk, g.Dk, g.Dp, g.Dp, 0);
    __syncthreads();
    tile_scores(s.St, s.At, s.Bt, g.Dp, s.b, s.beta, 1);
    tile_state(&R2, s.At, s.Hs, g.Dp, g.Dp, nc, u);
    __syncthreads();
    tile_scores_times(&R2, s.St, s.Bm, g.Dp, nc, 1);
    // Qv: scores V Delta^T, times X (still in Bm); state Gbar [Dv][Dk]
    __syncthreads();
    load_rows_t(s.At, v, &g, pair, t0, g.Dv, g.Dvp);
    load_rows_t(s.Bt, dout, &g, pair, t0, g.Dv, g.Dvp);
    load_mat(s.Hs, g.Dp, gbar, g.Dv, g.Dk, g.Dvp, g.Dp, 0);
    __syncthreads();
    tile_scores(s.St, s.At, s.Bt, g.Dvp, s.b, s.beta, 1);
    tile_state(&Qv, s.At, s.Hs, g.Dp, g.Dvp, nc, u);
    __syncthreads();
    tile_scores_times(&Qv, s.St, s.Bm, g.Dp, nc, 1);
    // per-token results
    Tile kt, vt;
    tile_load(&kt, k, &g, pair, t0, g.Dk, nc);
    tile_load(&vt, v, &g, pair, t0, g.Dv, ncv);
    float vp[RPT], kr[RPT];
    tile_dot(vp, &vt, &P, ncv);
    tile_dot(kr, &kt, &R1, nc);
    Tile dkt, dvt;
#pragma unroll
    for (int i = 0; i < RPT; i++) {
        float beta = s.beta[t_row0() + i];
#pragma unroll
        for (int j = 0; j < MAXC; j++) {
            dvt.v[i][j] = beta * P.v[i][j];
            dkt.v[i][j] = beta * (Qv.v[i][j] - R1.v[i][j] - R2.v[i][j]);
        }
    }
    tile_store(dv_out, &dvt, &g, pair, t0, g.Dv, ncv);
    tile_store(dk_out, &dkt, &g, pair, t0, g.Dk, nc);
    if (t_col() == 0)
        for (int i = 0; i < RPT; i++) {
            int t = t0 + t_row0() + i;
            if (t >= g.T) continue;
            size_t ti = tok_index(&g, pair, t);
            float dbeta = vp[i] - kr[i];
            dbeta_out[ti] = dbeta;
            db_out[ti] = tok_terms[ti] - s.beta[t_row0() + i] * dbeta;
        }
}

// dg_t = sum_{u >= t} db_u (the final states' term joins the last token), one thread per pair.
__global__ void dg_scan_kernel(float *dg, const float *db, const float *db_final, Geo g) {
    int pair = blockIdx.x * blockDim.x + threadIdx.x;
    if (pair >= g.B * g.H) return;
    float acc = db_final[pair];
    for (int t = g.T - 1; t >= 0; t--) {
        size_t ti = tok_index(&g, pair, t);
        acc += db[ti];
        dg[ti] = acc;
    }
}

// ------------------------------------------------------------------------ the host side

static int make_geo(Geo *g, const MnMesaDims *d, const MnSolver *s) {
    if (d->Dk > MAXD || d->Dv > MAXD)
        return mn_error(MN_ERR_UNSUPPORTED, "cuda mesa: head sizes up to %d (got Dk=%d, Dv=%d)", MAXD, d->Dk, d->Dv);
    g->B = d->B;
    g->T = d->T;
    g->H = d->H;
    g->Dk = d->Dk;
    g->Dv = d->Dv;
    g->Dp = pad16(d->Dk);
    g->Dvp = pad16(d->Dv);
    g->nchunks = (d->T + CH - 1) / CH;
    g->max_steps = s->max_steps;
    g->precond = s->precond == MN_PRECOND_JACOBI;
    g->init = s->init;
    float tol = s->tol > RESIDUAL_FLOOR ? s->tol : RESIDUAL_FLOOR;
    g->tol2 = tol * tol;
    return MN_OK;
}

static int set_smem(const void *kernel, size_t bytes, const CudaCtx *c) {
    if (bytes > c->smem_optin)
        return mn_error(MN_ERR_UNSUPPORTED, "cuda mesa: needs %zu bytes of shared memory, the device allows %zu", bytes,
                        c->smem_optin);
    CU_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    return MN_OK;
}

static size_t states_floats(const Geo *g) {
    return (size_t)g->B * g->H * (g->nchunks + 1) * ((size_t)g->Dk * g->Dk + (size_t)g->Dv * g->Dk);
}

static int run_states(const Backend *be, float *states, const bf16 *k, const bf16 *v, const float *glog,
                      const float *beta, const float *h0, const float *g0, const Geo *g) {
    CudaCtx *c = cuda_ctx(be);
    size_t smem = sizeof(float) * ((size_t)CH * (g->Dk + g->Dv) + 3 * CH);
    MN_TRY(set_smem((const void *)states_kernel, smem, c));
    states_kernel<<<g->B * g->H, NT, smem, c->stream>>>(states, k, v, glog, beta, h0, g0, *g);
    LAUNCH_CHECK();
    return MN_OK;
}

// Copies the final states (the last entry of the states workspace) out.
__global__ void final_states_kernel(float *hT, float *gT, const float *states, Geo g) {
    size_t hh = (size_t)g.Dk * g.Dk, hg = hh + (size_t)g.Dv * g.Dk;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < (size_t)g.B * g.H * hg; e += (size_t)gridDim.x * blockDim.x) {
        size_t pair = e / hg, i = e % hg;
        float val = states[(pair * (g.nchunks + 1) + g.nchunks) * hg + i];
        if (i < hh) {
            if (hT) hT[pair * hh + i] = val;
        } else if (gT) {
            gT[pair * (hg - hh) + i - hh] = val;
        }
    }
}

static int copy_steps(const Backend *be, int *host, const int *dev, size_t n) {
    if (!host) return MN_OK;
    CudaCtx *c = cuda_ctx(be);
    CU_TRY(cudaMemcpyAsync(host, dev, n * sizeof(int), cudaMemcpyDeviceToHost, c->stream));
    CU_TRY(cudaStreamSynchronize(c->stream));
    return MN_OK;
}

extern "C" int cuda_mesa_fwd(const Backend *be, const MnMesaDims *d, const MnSolver *s, const MnMesaFwd *io) {
    MN_TRY(mesa_check_dims(d));
    MN_TRY(mesa_check_solver(s));
    if (!io || !io->q || !io->k || !io->v || !io->g || !io->beta || !io->lambda || !io->o || !io->x)
        return mn_error(MN_ERR_ARG, "cuda mesa forward: a required tensor is NULL");
    Geo g = {0};
    MN_TRY(make_geo(&g, d, s));
    CudaCtx *c = cuda_ctx(be);
    size_t nst = states_floats(&g), ntok = (size_t)d->B * d->T * d->H;
    char *ws = (char *)cuda_scratch(be, nst * sizeof(float) + ntok * sizeof(int));
    if (!ws) return MN_ERR_NOMEM;
    float *states = (float *)ws;
    int *steps = (int *)(ws + nst * sizeof(float));
    MN_TRY(run_states(be, states, (const bf16 *)io->k, (const bf16 *)io->v, io->g, io->beta, io->h0, io->g0, &g));
    size_t smem = sizeof(float) * smem_floats(g.Dp, g.Dvp);
    MN_TRY(set_smem((const void *)cg_forward_kernel, smem, c));
    dim3 grid((unsigned)g.nchunks, (unsigned)(d->B * d->H));
    cg_forward_kernel<<<grid, NT, smem, c->stream>>>((bf16 *)io->o, (bf16 *)io->x, steps, (const bf16 *)io->q,
                                                     (const bf16 *)io->k, (const bf16 *)io->v, io->g, io->beta,
                                                     io->lambda, states, s->init == MN_CG_INIT_GIVEN ? (const bf16 *)io->x0 : NULL, g);
    LAUNCH_CHECK();
    if (io->hT || io->gT) {
        final_states_kernel<<<grid_for((size_t)d->B * d->H * 1024, 256), 256, 0, c->stream>>>(io->hT, io->gT, states, g);
        LAUNCH_CHECK();
    }
    return copy_steps(be, io->steps, steps, ntok);
}

extern "C" int cuda_mesa_bwd(const Backend *be, const MnMesaDims *d, const MnSolver *s, const MnMesaBwd *io) {
    MN_TRY(mesa_check_dims(d));
    MN_TRY(mesa_check_solver(s));
    if (!io || !io->q || !io->k || !io->v || !io->g || !io->beta || !io->lambda || !io->x || !io->o || !io->dout ||
        !io->dq || !io->dk || !io->dv || !io->dg || !io->dbeta || !io->dlambda)
        return mn_error(MN_ERR_ARG, "cuda mesa backward: a required tensor is NULL");
    Geo g = {0};
    MN_TRY(make_geo(&g, d, s));
    if (g.init == MN_CG_INIT_GIVEN) g.init = MN_CG_INIT_ZERO;  // the given guesses were for the forward
    CudaCtx *c = cuda_ctx(be);
    size_t pairs = (size_t)d->B * d->H, ntok = (size_t)d->B * d->T * d->H;
    size_t nst = states_floats(&g), nadj = pairs * g.nchunks * ((size_t)g.Dv * g.Dk + (size_t)g.Dk * g.Dk);
    size_t ny = ntok * g.Dk, bytes = sizeof(float) * (nst + nadj + ny + ntok + ntok + pairs) + sizeof(int) * ntok;
    char *ws = (char *)cuda_scratch(be, bytes);
    if (!ws) return MN_ERR_NOMEM;
    float *states = (float *)ws, *adj = states + nst, *y = adj + nadj, *terms = y + ny, *db = terms + ntok;
    float *db_final = db + ntok;
    int *steps = (int *)(db_final + pairs);
    CU_TRY(cudaMemsetAsync(io->dlambda, 0, sizeof(float) * (size_t)d->H * d->Dk, c->stream));
    MN_TRY(run_states(be, states, (const bf16 *)io->k, (const bf16 *)io->v, io->g, io->beta, io->h0, io->g0, &g));
    size_t smem = sizeof(float) * smem_floats(g.Dp, g.Dvp);
    dim3 grid((unsigned)g.nchunks, (unsigned)pairs);
    MN_TRY(set_smem((const void *)cg_backward_kernel, smem, c));
    cg_backward_kernel<<<grid, NT, smem, c->stream>>>((bf16 *)io->dq, y, terms, io->dlambda, steps, (const bf16 *)io->k,
                                                      (const bf16 *)io->v, (const bf16 *)io->x, (const bf16 *)io->dout, io->g, io->beta, io->lambda, states, g);
    LAUNCH_CHECK();
    size_t asmem = sizeof(float) * ((size_t)CH * (2 * g.Dk + g.Dv) + 2 * CH + 32);
    MN_TRY(set_smem((const void *)adjoints_kernel, asmem, c));
    adjoints_kernel<<<(unsigned)pairs, NT, asmem, c->stream>>>(adj, io->dh0, io->dg0, db_final, (const bf16 *)io->x,
                                                               (const bf16 *)io->dout, y, io->g, io->beta, states,
                                                               io->dhT, io->dgT, g);
    LAUNCH_CHECK();
    MN_TRY(set_smem((const void *)grads_kernel, smem, c));
    grads_kernel<<<grid, NT, smem, c->stream>>>((bf16 *)io->dk, (bf16 *)io->dv, io->dbeta, db, (const bf16 *)io->k,
                                                (const bf16 *)io->v, (const bf16 *)io->x, (const bf16 *)io->dout, y, terms,
                                                io->g, io->beta, adj, g);
    LAUNCH_CHECK();
    dg_scan_kernel<<<(unsigned)((pairs + 127) / 128), 128, 0, c->stream>>>(io->dg, db, db_final, g);
    LAUNCH_CHECK();
    return copy_steps(be, io->steps, steps, ntok);
}
