/*
 * The Mesa core on the GPU: the chunkwise algorithm of src/cpu/mesa_chunk.c
 * (spec sections 3-4) as fused CUDA kernels, every product and all CG
 * arithmetic in float32 (inputs arrive in bf16; states H, G stay float32).
 *
 * One thread block per (chunk, sequence, head) solves the chunk's C = 64
 * systems at once: the chunk-entry state, the keys (and their transpose), the
 * CG direction and the intra-chunk scores live in shared memory; every thread
 * owns one row and a quarter of the columns of x, r and p in registers. The
 * sequential parts (chunk-entry states; the adjoints in reverse) are separate
 * kernels, one block per (sequence, head).
 *
 * Kernels, forward: states -> cg_forward. Backward: states -> cg_backward (the
 * second solve, H x, per-token terms) -> adjoints (reverse over chunks) ->
 * grads (per chunk) -> dg_scan (reverse cumulative sum of dL/db).
 */
#include <math.h>
#include <stdlib.h>

#include "cuda_common.cuh"

extern "C" {
#include "core/mesa_args.h"
}

#define CH 64           // chunk size on the GPU
#define NT 256          // threads per block: 64 rows x 4 column groups
#define MAXD 128        // largest head size the fused kernels take
#define MAXJ (MAXD / 16)  // float4 column chunks per thread, at most
#define RESIDUAL_FLOOR (4.0f / 16777216.0f)  // as on the CPU (src/cpu/cg.c)

static int pad16(int d) { return (d + 15) & ~15; }

// Sizes of one problem, passed to every kernel.
typedef struct {
    int B, T, H, Dk, Dv, Dp, Dvp, nchunks;
    int max_steps, precond, init;
    float tol2;  // squared stopping tolerance (at least the rounding floor)
} Geo;

// Per (sequence, head) offsets.
__device__ __forceinline__ size_t tok_index(const Geo *g, int pair, int t) {
    int b = pair / g->H, h = pair % g->H;
    return ((size_t)b * g->T + t) * g->H + h;
}

__device__ __forceinline__ float4 f4(float a) { return make_float4(a, a, a, a); }
__device__ __forceinline__ void fma4(float4 *acc, float s, float4 v) {
    acc->x += s * v.x;
    acc->y += s * v.y;
    acc->z += s * v.z;
    acc->w += s * v.w;
}
__device__ __forceinline__ float dot4(float4 a, float4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }

// Sum over the 4 threads of a row (consecutive lanes). The mask names only
// those 4: rows that stopped iterating skip this, and a full-warp mask would
// then wait for them forever.
__device__ __forceinline__ float row_sum(float v) {
    unsigned mask = 0xFu << (threadIdx.x & 28);
    v += __shfl_xor_sync(mask, v, 1);
    v += __shfl_xor_sync(mask, v, 2);
    return v;
}

// ------------------------------------------------------------------ chunk loading

// Rows t0..t0+C of one (sequence, head) from a [B,T,H,d] bf16 tensor into
// smem as float, row stride ld; rows past T and columns past d are zero.
__device__ void load_rows(float *dst, int stride, const bf16 *src, const Geo *g, int pair, int t0, int d, int dpad) {
    for (int e = threadIdx.x; e < CH * dpad; e += NT) {
        int r = e / dpad, c = e % dpad, t = t0 + r;
        dst[r * stride + c] = (t < g->T && c < d) ? ld(src, tok_index(g, pair, t) * d + c) : 0.0f;
    }
}

// The same rows transposed: dst[c * ld + r].
__device__ void load_rows_t(float *dst, int stride, const bf16 *src, const Geo *g, int pair, int t0, int d, int dpad) {
    for (int e = threadIdx.x; e < CH * dpad; e += NT) {
        int r = e % CH, c = e / CH, t = t0 + r;
        dst[c * stride + r] = (t < g->T && c < d) ? ld(src, tok_index(g, pair, t) * d + c) : 0.0f;
    }
}

// A (rows x cols) float matrix from global (row stride cols) into smem, zero-padded.
__device__ void load_mat(float *dst, int stride, const float *src, int rows, int cols, int rpad, int cpad, int transpose) {
    for (int e = threadIdx.x; e < rpad * cpad; e += NT) {
        int r = e / cpad, c = e % cpad;
        float v = (r < rows && c < cols) ? src[(size_t)r * cols + c] : 0.0f;
        if (transpose) dst[c * stride + r] = v;
        else dst[r * stride + c] = v;
    }
}

// Decays of a chunk: b (cumulative log decay, rows past the end repeat the
// last), beta (0 past the end), and n, the chunk's real length.
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

// -------------------------------------------------------------- the GLA forms
//
// Thread (row = tid / 4, cg = tid % 4) owns the float4 column chunks cg + 4 jj
// of its row (interleaved so that the four threads of a row read neighbouring
// 16-byte words: no bank conflicts, and the 8 rows of a warp share them).

// acc += scale * A[row, :dk] . S[:dk, cols]
__device__ __forceinline__ void form_state(float4 acc[MAXJ], const float *A, int lda, const float *S, int lds, int dk,
                                           int nj, int row, int cg, float scale) {
    float4 part[MAXJ];
#pragma unroll
    for (int j = 0; j < MAXJ; j++) part[j] = f4(0);
    for (int k = 0; k < dk; k++) {
        float a = A[row * lda + k];
        const float4 *s4 = (const float4 *)(S + k * lds);
#pragma unroll
        for (int j = 0; j < MAXJ; j++)
            if (j < nj) fma4(&part[j], a, s4[cg + 4 * j]);
    }
#pragma unroll
    for (int j = 0; j < MAXJ; j++)
        if (j < nj) fma4(&acc[j], scale, part[j]);
}

// Scores[row, s] = mask(row, s) * A[row, :dk] . Bt[:dk, s] for this thread's s
// chunks (cg + 4 i, i < 4). Forward mask (dir 0): exp(b_row - b_s) beta_s for
// s <= row; backward (dir 1): exp(b_s - b_row) for s >= row.
__device__ __forceinline__ void scores(float *Ss, const float *A, int lda, const float *Bt, int ldb, int dk, const float *b,
                                       const float *beta, int dir, int row, int cg) {
    float4 acc[4];
#pragma unroll
    for (int i = 0; i < 4; i++) acc[i] = f4(0);
    for (int k = 0; k < dk; k++) {
        float a = A[row * lda + k];
        const float4 *b4 = (const float4 *)(Bt + k * ldb);
#pragma unroll
        for (int i = 0; i < 4; i++) fma4(&acc[i], a, b4[cg + 4 * i]);
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float v[4] = {acc[i].x, acc[i].y, acc[i].z, acc[i].w};
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int s = 4 * (cg + 4 * i) + e;
            float m;
            if (dir == 0) m = s <= row ? __expf(b[row] - b[s]) * beta[s] : 0.0f;
            else m = s >= row ? __expf(b[s] - b[row]) : 0.0f;
            v[e] *= m;
        }
        ((float4 *)(Ss + row * (CH + 4)))[cg + 4 * i] = make_float4(v[0], v[1], v[2], v[3]);
    }
}

// acc += Scores[row, :] . Bm[:, cols]  (only the causal half is non-zero)
__device__ __forceinline__ void form_scores(float4 acc[MAXJ], const float *Ss, const float *Bm, int ldb, int nj, int row,
                                            int cg, int dir) {
    int s0 = dir == 0 ? 0 : row, s1 = dir == 0 ? row + 1 : CH;
    for (int s = s0; s < s1; s++) {
        float a = Ss[row * (CH + 4) + s];
        const float4 *b4 = (const float4 *)(Bm + s * ldb);
#pragma unroll
        for (int j = 0; j < MAXJ; j++)
            if (j < nj) fma4(&acc[j], a, b4[cg + 4 * j]);
    }
}

// Writes this thread's chunks of a row vector into smem row `row` (stride ld).
__device__ __forceinline__ void put_row(float *M, int ld, const float4 v[MAXJ], int nj, int row, int cg) {
#pragma unroll
    for (int j = 0; j < MAXJ; j++)
        if (j < nj) ((float4 *)(M + row * ld))[cg + 4 * j] = v[j];
}

__device__ __forceinline__ void get_row(float4 v[MAXJ], const float *M, int ld, int nj, int row, int cg) {
#pragma unroll
    for (int j = 0; j < MAXJ; j++) v[j] = j < nj ? ((const float4 *)(M + row * ld))[cg + 4 * j] : f4(0);
}

__device__ __forceinline__ float row_dot(const float4 a[MAXJ], const float4 b[MAXJ], int nj) {
    float s = 0;
#pragma unroll
    for (int j = 0; j < MAXJ; j++)
        if (j < nj) s += dot4(a[j], b[j]);
    return row_sum(s);
}

// Shared-memory layout of the chunk kernels (floats).
typedef struct {
    float *Hs;   // [Dp][Dp]: chunk-entry H (also G or its transpose, state adjoints)
    float *Ks;   // [CH][Dp]: keys
    float *Kt;   // [Dp][CH]: keys transposed (or another transposed operand)
    float *Ps;   // [CH][ldp]: the operand of the current product (CG direction, X, Delta, ...)
    float *Ss;   // [CH][CH+4]: masked scores
    float *Vs;   // [CH][Dvp]: values (or another operand; the Jacobi diagonal during CG)
    float *b, *beta, *lam, *red;  // [CH], [CH], [Dp], [Dp] scratch for column sums
    int ldp;
} Smem;

static size_t smem_floats(int Dp, int Dvp) {
    int dm = Dp > Dvp ? Dp : Dvp;
    return (size_t)dm * dm + (size_t)CH * dm + (size_t)dm * CH + (size_t)CH * (dm + 4) + (size_t)CH * (CH + 4) +
           (size_t)CH * dm + 2 * CH + 2 * dm;
}

__device__ Smem carve(float *base, const Geo *g) {
    int dm = max(g->Dp, g->Dvp);
    Smem s;
    s.Hs = base;
    s.Ks = s.Hs + dm * dm;
    s.Kt = s.Ks + CH * dm;
    s.Ps = s.Kt + dm * CH;
    s.ldp = dm + 4;
    s.Ss = s.Ps + CH * s.ldp;
    s.Vs = s.Ss + CH * (CH + 4);
    s.b = s.Vs + CH * dm;
    s.beta = s.b + CH;
    s.lam = s.beta + CH;
    s.red = s.lam + dm;
    return s;
}

// A(P) for every row: eb * P Hc + ((P K^T) (.) M) K + lambda (.) P, P taken
// from registers (written to Ps). Rows that have stopped pass p = 0.
__device__ void apply_operator(float4 ap[MAXJ], const float4 p[MAXJ], const Smem *s, const Geo *g, int row, int cg,
                               int with_lambda) {
    int nj = g->Dp / 16;
    __syncthreads();  // everyone is done reading Ps and Ss from the previous use
    put_row(s->Ps, s->ldp, p, nj, row, cg);
    __syncthreads();
    scores(s->Ss, s->Ps, s->ldp, s->Kt, CH, g->Dp, s->b, s->beta, 0, row, cg);
#pragma unroll
    for (int j = 0; j < MAXJ; j++) ap[j] = f4(0);
    form_state(ap, s->Ps, s->ldp, s->Hs, g->Dp, g->Dp, nj, row, cg, __expf(s->b[row]));
    __syncthreads();  // the scores are complete
    form_scores(ap, s->Ss, s->Ks, g->Dp, nj, row, cg, 0);
    if (with_lambda)
#pragma unroll
        for (int j = 0; j < MAXJ; j++)
            if (j < nj) {
                float4 l = ((const float4 *)s->lam)[cg + 4 * j];
                ap[j].x += l.x * p[j].x;
                ap[j].y += l.y * p[j].y;
                ap[j].z += l.z * p[j].z;
                ap[j].w += l.w * p[j].w;
            }
}

// Jacobi diagonal of each row's A_t into Vs: eb_t diag(Hc) + sum_{s<=t} e^{b_t-b_s} beta_s k_s^2 + lambda.
__device__ void jacobi_diagonal(const Smem *s, const Geo *g, int row, int cg) {
    int nj = g->Dp / 16;
    float eb = __expf(s->b[row]);
#pragma unroll
    for (int j = 0; j < MAXJ; j++)
        if (j < nj) {
            float d[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int c = 4 * (cg + 4 * j) + e;
                float acc = eb * s->Hs[c * g->Dp + c] + s->lam[c];
                for (int t = 0; t <= row; t++) {
                    float k = s->Ks[t * g->Dp + c];
                    acc += __expf(s->b[row] - s->b[t]) * s->beta[t] * k * k;
                }
                d[e] = acc;
            }
            ((float4 *)(s->Vs + row * g->Dp))[cg + 4 * j] = make_float4(d[0], d[1], d[2], d[3]);
        }
    __syncthreads();
}

// Conjugate gradient for the chunk's rows (spec section 2), rhs in registers;
// x returned in registers, steps per row into *steps. The whole block stops
// when every row has met its tolerance (or the floor), or after max_steps.
__device__ void cg_solve(float4 x[MAXJ], const float4 q[MAXJ], const Smem *s, const Geo *g, int row, int cg, int *steps,
                         int use_given, const float4 x0[MAXJ]) {
    int nj = g->Dp / 16, jac = g->precond || g->init == MN_CG_INIT_JACOBI;
    float4 r[MAXJ], p[MAXJ], ap[MAXJ];
    if (jac) jacobi_diagonal(s, g, row, cg);
    float4 dg[MAXJ];
    if (jac) get_row(dg, s->Vs, g->Dp, nj, row, cg);
    int nonzero_guess = use_given || g->init == MN_CG_INIT_JACOBI;
#pragma unroll
    for (int j = 0; j < MAXJ; j++) {
        if (use_given) x[j] = x0[j];
        else if (g->init == MN_CG_INIT_JACOBI && j < nj)
            x[j] = make_float4(q[j].x / dg[j].x, q[j].y / dg[j].y, q[j].z / dg[j].z, q[j].w / dg[j].w);
        else x[j] = f4(0);
    }
    if (nonzero_guess) {
        apply_operator(ap, x, s, g, row, cg, 1);
#pragma unroll
        for (int j = 0; j < MAXJ; j++)
            r[j] = make_float4(q[j].x - ap[j].x, q[j].y - ap[j].y, q[j].z - ap[j].z, q[j].w - ap[j].w);
    } else {
#pragma unroll
        for (int j = 0; j < MAXJ; j++) r[j] = q[j];
    }
    float thresh = g->tol2 * row_dot(q, q, nj);
    int active = row_dot(r, r, nj) > thresh;
#pragma unroll
    for (int j = 0; j < MAXJ; j++)
        p[j] = g->precond && j < nj ? make_float4(r[j].x / dg[j].x, r[j].y / dg[j].y, r[j].z / dg[j].z, r[j].w / dg[j].w)
                                    : r[j];
    float rz = row_dot(r, p, nj);
    *steps = 0;
    for (int step = 1; step <= g->max_steps; step++) {
        if (!__syncthreads_or(active)) break;
        float4 pin[MAXJ];
#pragma unroll
        for (int j = 0; j < MAXJ; j++) pin[j] = active ? p[j] : f4(0);
        apply_operator(ap, pin, s, g, row, cg, 1);
        float pap = row_dot(pin, ap, nj);
        if (!active) continue;
        if (!(pap > 0) || !(rz > 0)) {  // converged exactly, or non-finite input
            active = 0;
            continue;
        }
        float alpha = rz / pap;
#pragma unroll
        for (int j = 0; j < MAXJ; j++) {
            fma4(&x[j], alpha, p[j]);
            fma4(&r[j], -alpha, ap[j]);
        }
        *steps = step;
        if (!(row_dot(r, r, nj) > thresh)) {
            active = 0;
            continue;
        }
        float4 z[MAXJ];
#pragma unroll
        for (int j = 0; j < MAXJ; j++)
            z[j] = g->precond && j < nj
                       ? make_float4(r[j].x / dg[j].x, r[j].y / dg[j].y, r[j].z / dg[j].z, r[j].w / dg[j].w)
                       : r[j];
        float rz_new = row_dot(r, z, nj), beta = rz_new / rz;
#pragma unroll
        for (int j = 0; j < MAXJ; j++)
            p[j] = make_float4(z[j].x + beta * p[j].x, z[j].y + beta * p[j].y, z[j].z + beta * p[j].z,
                               z[j].w + beta * p[j].w);
        rz = rz_new;
    }
}

// Reads this thread's part of a row from a [B,T,H,d] bf16 tensor (zero past the end).
__device__ void row_from_global(float4 v[MAXJ], const bf16 *src, const Geo *g, int pair, int t, int d, int nj, int cg) {
#pragma unroll
    for (int j = 0; j < MAXJ; j++) {
        float e[4] = {0, 0, 0, 0};
        if (j < nj && t < g->T)
            for (int i = 0; i < 4; i++) {
                int c = 4 * (cg + 4 * j) + i;
                if (c < d) e[i] = ld(src, tok_index(g, pair, t) * d + c);
            }
        v[j] = make_float4(e[0], e[1], e[2], e[3]);
    }
}

__device__ void row_to_global(bf16 *dst, const float4 v[MAXJ], const Geo *g, int pair, int t, int d, int nj, int cg) {
    if (t >= g->T) return;
#pragma unroll
    for (int j = 0; j < MAXJ; j++)
        if (j < nj) {
            float e[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
            for (int i = 0; i < 4; i++) {
                int c = 4 * (cg + 4 * j) + i;
                if (c < d) st(dst, tok_index(g, pair, t) * d + c, e[i]);
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

// Forward per chunk: CG for the chunk's systems, then the output.
__global__ void __launch_bounds__(NT, 1) cg_forward_kernel(bf16 *o, bf16 *x_out, int *steps_out, const bf16 *q,
                                                           const bf16 *k, const bf16 *v, const float *glog,
                                                           const float *gbeta, const float *lambda, const float *states,
                                                           const bf16 *x0, Geo g) {
    extern __shared__ float sm[];
    Smem s = carve(sm, &g);
    int c = blockIdx.x, pair = blockIdx.y, t0 = c * CH, row = threadIdx.x >> 2, cg = threadIdx.x & 3;
    int h = pair % g.H, nj = g.Dp / 16, njv = g.Dvp / 16;
    size_t hh = (size_t)g.Dk * g.Dk, hg = hh + (size_t)g.Dv * g.Dk;
    const float *st_in = states + ((size_t)pair * (g.nchunks + 1) + c) * hg;
    load_decays(s.b, s.beta, glog, gbeta, &g, pair, t0);
    load_mat(s.Hs, g.Dp, st_in, g.Dk, g.Dk, g.Dp, g.Dp, 0);
    load_rows(s.Ks, g.Dp, k, &g, pair, t0, g.Dk, g.Dp);
    load_rows_t(s.Kt, CH, k, &g, pair, t0, g.Dk, g.Dp);
    for (int i = threadIdx.x; i < g.Dp; i += NT) s.lam[i] = i < g.Dk ? lambda[(size_t)h * g.Dk + i] : 1.0f;
    __syncthreads();
    float4 qv[MAXJ], xs[MAXJ], xg[MAXJ];
    row_from_global(qv, q, &g, pair, t0 + row, g.Dk, nj, cg);
    if (x0) row_from_global(xg, x0, &g, pair, t0 + row, g.Dk, nj, cg);
    int steps;
    cg_solve(xs, qv, &s, &g, row, cg, &steps, x0 != NULL, xg);
    row_to_global(x_out, xs, &g, pair, t0 + row, g.Dk, nj, cg);
    if (steps_out && t0 + row < g.T && cg == 0) steps_out[tok_index(&g, pair, t0 + row)] = steps;
    // O = eb (.) X G^T + ((X K^T) (.) M) V
    __syncthreads();
    put_row(s.Ps, s.ldp, xs, nj, row, cg);
    load_mat(s.Hs, g.Dvp, st_in + hh, g.Dv, g.Dk, g.Dvp, g.Dp, 1);  // G^T: [Dk][Dv]
    load_rows(s.Vs, g.Dvp, v, &g, pair, t0, g.Dv, g.Dvp);
    __syncthreads();
    scores(s.Ss, s.Ps, s.ldp, s.Kt, CH, g.Dp, s.b, s.beta, 0, row, cg);
    float4 out[MAXJ];
#pragma unroll
    for (int j = 0; j < MAXJ; j++) out[j] = f4(0);
    form_state(out, s.Ps, s.ldp, s.Hs, g.Dvp, g.Dp, njv, row, cg, __expf(s.b[row]));
    __syncthreads();
    form_scores(out, s.Ss, s.Vs, g.Dvp, njv, row, cg, 0);
    row_to_global(o, out, &g, pair, t0 + row, g.Dv, njv, cg);
}

// Backward, per chunk: R = G_t^T delta, Y = A^{-1} R (the second solve);
// writes dq = Y, Y (float) for the adjoints, the per-token term y.(lambda (.) x)
// of dL/db (src/cpu/mesa_chunk.c says why this form), and adds -sum_t y (.) x
// to dlambda.
__global__ void __launch_bounds__(NT, 1) cg_backward_kernel(bf16 *dq, float *y_out, float *tok_terms, float *dlambda,
                                                            int *steps_out, const bf16 *k, const bf16 *v, const bf16 *x,
                                                            const bf16 *dout, const float *glog,
                                                            const float *gbeta, const float *lambda,
                                                            const float *states, Geo g) {
    extern __shared__ float sm[];
    Smem s = carve(sm, &g);
    int c = blockIdx.x, pair = blockIdx.y, t0 = c * CH, row = threadIdx.x >> 2, cg = threadIdx.x & 3;
    int h = pair % g.H, nj = g.Dp / 16, njv = g.Dvp / 16;
    size_t hh = (size_t)g.Dk * g.Dk, hg = hh + (size_t)g.Dv * g.Dk;
    const float *st_in = states + ((size_t)pair * (g.nchunks + 1) + c) * hg;
    load_decays(s.b, s.beta, glog, gbeta, &g, pair, t0);
    // R = eb (.) Delta G + ((Delta V^T) (.) M) K
    float4 dv_row[MAXJ];
    row_from_global(dv_row, dout, &g, pair, t0 + row, g.Dv, njv, cg);
    put_row(s.Ps, s.ldp, dv_row, njv, row, cg);
    load_mat(s.Hs, g.Dp, st_in + hh, g.Dv, g.Dk, g.Dvp, g.Dp, 0);  // G: [Dv][Dk]
    load_rows_t(s.Kt, CH, v, &g, pair, t0, g.Dv, g.Dvp);          // V^T
    load_rows(s.Ks, g.Dp, k, &g, pair, t0, g.Dk, g.Dp);
    for (int i = threadIdx.x; i < g.Dp; i += NT) s.lam[i] = i < g.Dk ? lambda[(size_t)h * g.Dk + i] : 1.0f;
    __syncthreads();
    scores(s.Ss, s.Ps, s.ldp, s.Kt, CH, g.Dvp, s.b, s.beta, 0, row, cg);
    float4 rhs[MAXJ];
#pragma unroll
    for (int j = 0; j < MAXJ; j++) rhs[j] = f4(0);
    form_state(rhs, s.Ps, s.ldp, s.Hs, g.Dp, g.Dvp, nj, row, cg, __expf(s.b[row]));
    __syncthreads();
    form_scores(rhs, s.Ss, s.Ks, g.Dp, nj, row, cg, 0);
    // the second solve, with the forward's operator
    __syncthreads();
    load_mat(s.Hs, g.Dp, st_in, g.Dk, g.Dk, g.Dp, g.Dp, 0);
    load_rows_t(s.Kt, CH, k, &g, pair, t0, g.Dk, g.Dp);
    __syncthreads();
    float4 y[MAXJ], none[MAXJ];
    int steps;
    cg_solve(y, rhs, &s, &g, row, cg, &steps, 0, none);
    if (steps_out && t0 + row < g.T && cg == 0) steps_out[tok_index(&g, pair, t0 + row)] = steps;
    float4 xr[MAXJ], ylx[MAXJ];
    row_from_global(xr, x, &g, pair, t0 + row, g.Dk, nj, cg);
#pragma unroll
    for (int j = 0; j < MAXJ; j++) {
        float4 l = j < nj ? ((const float4 *)s.lam)[cg + 4 * j] : f4(0);
        ylx[j] = make_float4(l.x * xr[j].x, l.y * xr[j].y, l.z * xr[j].z, l.w * xr[j].w);
    }
    float y_lx = row_dot(y, ylx, nj);
    int t = t0 + row;
    if (t < g.T) {
        row_to_global(dq, y, &g, pair, t, g.Dk, nj, cg);
#pragma unroll
        for (int j = 0; j < MAXJ; j++)
            if (j < nj) {
                float e[4] = {y[j].x, y[j].y, y[j].z, y[j].w};
                for (int i = 0; i < 4; i++) {
                    int cc = 4 * (cg + 4 * j) + i;
                    if (cc < g.Dk) y_out[tok_index(&g, pair, t) * g.Dk + cc] = e[i];
                }
            }
        if (cg == 0) tok_terms[tok_index(&g, pair, t)] = y_lx;
    }
    // dlambda -= sum over the chunk's rows of y (.) x, reduced in shared memory first
    __syncthreads();
    for (int i = threadIdx.x; i < g.Dp; i += NT) s.red[i] = 0;
    __syncthreads();
    if (t < g.T)
#pragma unroll
        for (int j = 0; j < MAXJ; j++)
            if (j < nj) {
                int cc = 4 * (cg + 4 * j);
                atomicAdd(&s.red[cc], -y[j].x * xr[j].x);
                atomicAdd(&s.red[cc + 1], -y[j].y * xr[j].y);
                atomicAdd(&s.red[cc + 2], -y[j].z * xr[j].z);
                atomicAdd(&s.red[cc + 3], -y[j].w * xr[j].w);
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
__global__ void __launch_bounds__(NT, 1) grads_kernel(bf16 *dk_out, bf16 *dv_out, float *dbeta_out, float *db_out,
                                                      const bf16 *k, const bf16 *v, const bf16 *x, const bf16 *dout,
                                                      const float *y, const float *tok_terms, const float *glog,
                                                      const float *gbeta, const float *adj, Geo g) {
    extern __shared__ float sm[];
    Smem s = carve(sm, &g);
    int c = blockIdx.x, pair = blockIdx.y, t0 = c * CH, row = threadIdx.x >> 2, cg = threadIdx.x & 3;
    int nj = g.Dp / 16, njv = g.Dvp / 16, t = t0 + row;
    size_t gg = (size_t)g.Dv * g.Dk, hh = (size_t)g.Dk * g.Dk;
    const float *gbar = adj + ((size_t)pair * g.nchunks + c) * (gg + hh), *hn = gbar + gg;
    int n = load_decays(s.b, s.beta, glog, gbeta, &g, pair, t0);
    float u = __expf(s.b[n - 1] - s.b[row]);  // decay from the token to the chunk's end
    float4 P[MAXJ], Qv[MAXJ], R1[MAXJ], R2[MAXJ];
#pragma unroll
    for (int j = 0; j < MAXJ; j++) P[j] = Qv[j] = R1[j] = R2[j] = f4(0);
    // Shared operand layout per product: Ps = the rows A, Kt = the transposed second operand of the
    // scores, Vs = the matrix the scores multiply, Hs = the state term's matrix.
    // P (Dv wide): A = K, scores with X, times Delta; state Gbar^T [Dk][Dv]
    load_rows(s.Ps, s.ldp, k, &g, pair, t0, g.Dk, g.Dp);
    load_rows_t(s.Kt, CH, x, &g, pair, t0, g.Dk, g.Dp);
    load_rows(s.Vs, g.Dvp, dout, &g, pair, t0, g.Dv, g.Dvp);
    load_mat(s.Hs, g.Dvp, gbar, g.Dv, g.Dk, g.Dvp, g.Dp, 1);
    __syncthreads();
    scores(s.Ss, s.Ps, s.ldp, s.Kt, CH, g.Dp, s.b, s.beta, 1, row, cg);
    form_state(P, s.Ps, s.ldp, s.Hs, g.Dvp, g.Dp, njv, row, cg, u);
    __syncthreads();
    form_scores(P, s.Ss, s.Vs, g.Dvp, njv, row, cg, 1);
    // R1 (Dk wide): same scores (K X^T), times Y; state Hn^T
    __syncthreads();
    for (int e = threadIdx.x; e < CH * g.Dp; e += NT) {
        int r = e / g.Dp, cc = e % g.Dp, tt = t0 + r;
        s.Vs[r * g.Dp + cc] = (tt < g.T && cc < g.Dk) ? y[tok_index(&g, pair, tt) * g.Dk + cc] : 0.0f;
    }
    load_mat(s.Hs, g.Dp, hn, g.Dk, g.Dk, g.Dp, g.Dp, 1);
    __syncthreads();
    form_state(R1, s.Ps, s.ldp, s.Hs, g.Dp, g.Dp, nj, row, cg, u);
    form_scores(R1, s.Ss, s.Vs, g.Dp, nj, row, cg, 1);
    // R2: scores K Y^T, times X; state Hn
    __syncthreads();
    for (int e = threadIdx.x; e < CH * g.Dp; e += NT) {
        int r = e % CH, cc = e / CH, tt = t0 + r;
        s.Kt[cc * CH + r] = (tt < g.T && cc < g.Dk) ? y[tok_index(&g, pair, tt) * g.Dk + cc] : 0.0f;
    }
    load_rows(s.Vs, g.Dp, x, &g, pair, t0, g.Dk, g.Dp);
    load_mat(s.Hs, g.Dp, hn, g.Dk, g.Dk, g.Dp, g.Dp, 0);
    __syncthreads();
    scores(s.Ss, s.Ps, s.ldp, s.Kt, CH, g.Dp, s.b, s.beta, 1, row, cg);
    form_state(R2, s.Ps, s.ldp, s.Hs, g.Dp, g.Dp, nj, row, cg, u);
    __syncthreads();
    form_scores(R2, s.Ss, s.Vs, g.Dp, nj, row, cg, 1);
    // Qv: A = V, scores with Delta, times X (still in Vs); state Gbar [Dv][Dk]
    __syncthreads();
    load_rows(s.Ps, s.ldp, v, &g, pair, t0, g.Dv, g.Dvp);
    load_rows_t(s.Kt, CH, dout, &g, pair, t0, g.Dv, g.Dvp);
    load_mat(s.Hs, g.Dp, gbar, g.Dv, g.Dk, g.Dvp, g.Dp, 0);
    __syncthreads();
    scores(s.Ss, s.Ps, s.ldp, s.Kt, CH, g.Dvp, s.b, s.beta, 1, row, cg);
    form_state(Qv, s.Ps, s.ldp, s.Hs, g.Dp, g.Dvp, nj, row, cg, u);
    __syncthreads();
    form_scores(Qv, s.Ss, s.Vs, g.Dp, nj, row, cg, 1);
    // per-token results
    float4 kr[MAXJ], vr[MAXJ];
    row_from_global(kr, k, &g, pair, t, g.Dk, nj, cg);
    row_from_global(vr, v, &g, pair, t, g.Dv, njv, cg);
    float beta = s.beta[row];
    float dbeta = row_dot(vr, P, njv) - row_dot(kr, R1, nj);
    if (t >= g.T) return;
    float4 dkr[MAXJ], dvr[MAXJ];
#pragma unroll
    for (int j = 0; j < MAXJ; j++) {
        dvr[j] = make_float4(beta * P[j].x, beta * P[j].y, beta * P[j].z, beta * P[j].w);
        dkr[j] = make_float4(beta * (Qv[j].x - R1[j].x - R2[j].x), beta * (Qv[j].y - R1[j].y - R2[j].y),
                             beta * (Qv[j].z - R1[j].z - R2[j].z), beta * (Qv[j].w - R1[j].w - R2[j].w));
    }
    row_to_global(dv_out, dvr, &g, pair, t, g.Dv, njv, cg);
    row_to_global(dk_out, dkr, &g, pair, t, g.Dk, nj, cg);
    if (cg == 0) {
        size_t ti = tok_index(&g, pair, t);
        dbeta_out[ti] = dbeta;
        db_out[ti] = tok_terms[ti] - beta * dbeta;
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
