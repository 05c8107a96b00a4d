/*
 * The CUDA backend's op groups, one a file, as the op table (cuda_backend.cu) takes them, and what
 * they share: rows read in 16-byte pieces, the grid-stride loop, column sums.
 */
#ifndef MN_CUDA_OPS_CUH
#define MN_CUDA_OPS_CUH

#include "cuda_common.cuh"

// ------------------------------------------------------------------------ pieces of rows

// Pieces of rows: a lane takes 8 contiguous bf16 at a time (one 16-byte load) where rows allow
// it (vec: a multiple of 8 long, 16-byte aligned), else 1: with 2-byte loads a lane's loads form
// a chain, and a decode step's norms (one row per sequence) were latency-bound on it.
__device__ __forceinline__ int piece_load(const bf16 *p, int vec, float v[8]) {
    if (!vec) {
        v[0] = __bfloat162float(*p);
        return 1;
    }
    uint4 u = *(const uint4 *)p;
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float2 f = __bfloat1622float2(h[k]);
        v[2 * k] = f.x;
        v[2 * k + 1] = f.y;
    }
    return 8;
}

// The float piece (a norm's weights) beside a bf16 piece: two 16-byte loads where vec (float rows
// of a multiple of 8, 16-byte aligned, as the parameter slab keeps them), else one value.
__device__ __forceinline__ void piece_load_f32(const float *p, int vec, float v[8]) {
    if (!vec) {
        v[0] = *p;
        return;
    }
    float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

__device__ __forceinline__ void piece_store(bf16 *p, int vec, const float v[8]) {
    if (!vec) {
        *p = __float2bfloat16(v[0]);
        return;
    }
    uint4 u;
    __nv_bfloat162 *h = (__nv_bfloat162 *)&u;
#pragma unroll
    for (int k = 0; k < 4; k++) h[k] = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
    *(uint4 *)p = u;
}

// Whether these addresses are 16-byte aligned (NULL is).
static inline int aligned16(const void *a, const void *b, const void *c, const void *d) {
    return (((uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d) % 16) == 0;
}

// Whether rows of n bf16 at these addresses can be read 8 at a time.
static inline int rows_vec(int n, const void *a, const void *b, const void *c, const void *d) {
    return n % 8 == 0 && aligned16(a, b, c, d);
}

// A grid-stride loop: i over 0 .. n-1, the grid's threads striding.
#define GRID_LOOP(i, n) for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

// ------------------------------------------------------------------------- column sums

// Column sums over many rows, added to out[L] (the gradients of biases and norm weights):
// out[c] += sum_r dy[r L + c] (times x[r L + c] rstd[(r L + c) / group] when x is given). A block
// takes a strip of rows and 32 pieces of columns (256 columns, or 32 without 16-byte pieces):
// lane l of warp w reads piece l of rows w, w + 8, .. (coalesced across the warp), the warps'
// sums meet in smem, and the block writes its strip's sums; a second pass (colsum_finish) adds
// the strips' sums in their order, so that a run repeated gives the same bits (atomics would add
// them in whatever order the blocks finish). (A thread per column walking all rows, with one load
// in flight, was bound by the loads' latency.)
#define COLSUM_WARPS 8

// The block's column sums out of the warps' partial sums acc (width columns a lane) through
// part: out[c stride] = the block's sum of column c, for the block's columns below L (out: this
// strip's row of the sums).
__device__ __forceinline__ void colsum_flush(float part[COLSUM_WARPS][256], const float acc[8], int width, int L,
                                             float *out, int stride) {
    int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, tile = 32 * width;
#pragma unroll
    for (int k = 0; k < 8; k++)
        if (k < width) part[wp][lane * width + k] = acc[k];
    __syncthreads();
    for (int i = threadIdx.x; i < tile; i += blockDim.x) {
        int c = blockIdx.x * tile + i;
        if (c >= L) continue;
        float sum = 0;
        for (int w = 0; w < COLSUM_WARPS; w++) sum += part[w][i];
        out[(size_t)c * stride] = sum;
    }
}

// out[i] += sum over the strips s, in order, of parts[s n + i], for i < n (cuda_linear.cu).
int colsum_finish(const Backend *be, float *out, const float *parts, long strips, size_t n);
// The grid of a column-sum kernel (cuda_linear.cu). Returns the rows per strip.
long strip_rows(long rows, int cols, int vec, int *tiles, long *strips);
// out[c] += the column sums of dy (times x rstd where x is given) over `rows` rows of L columns.
int colsum(const Backend *be, float *out, const bf16 *dy, const bf16 *x, const float *rstd, long rows, int L,
           int group);
// The same with x centred: dy (x - mean) rstd, mean and rstd per group of x (either NULL: 0, 1).
// LayerNorm's weight gradient; dy x alone (both NULL) the learnable skip's.
int colsum_centred(const Backend *be, float *out, const bf16 *dy, const bf16 *x, const float *mean, const float *rstd,
                   long rows, int L, int group);

// ------------------------------------------------------------ the ops of the table, by file

// memory (cuda_mem.cu)
size_t g_elem_size(const Backend *be, MemKind k);
void *g_alloc(const Backend *be, size_t n, MemKind k);
void g_free(const Backend *be, void *p);
void g_zero(const Backend *be, void *p, size_t n, MemKind k);
void g_copy(const Backend *be, void *dst, const void *src, size_t n, MemKind k);
void g_copy_rows(const Backend *be, void *dst, size_t ds, const void *src, size_t ss, size_t rows, size_t n, MemKind k);
int g_upload(const Backend *be, void *dst, const double *src, size_t n, MemKind k);
int g_upload_f32(const Backend *be, void *dst, const float *src, size_t n, MemKind k);
int g_download_f32(const Backend *be, float *dst, const void *src, size_t n, MemKind k);
int g_download(const Backend *be, double *dst, const void *src, size_t n, MemKind k);
int g_upload_i32(const Backend *be, void *dst, const int32_t *src, size_t n);
int g_download_i32(const Backend *be, int32_t *dst, const void *src, size_t n);
int g_tally_i32(const Backend *be, void *sum, void *count, const void *x, size_t n);
size_t g_mem_used(const Backend *be);
size_t g_mem_available(const Backend *be);
int g_sync(const Backend *be);

// dense layers (cuda_linear.cu)
int g_linear_fwd(const Backend *be, void *y, const void *x, const void *w, const void *bias, int N, int nin, int nout);
int g_linear_runs_fwd(const Backend *be, void *y, const void *x, const void *w, const void *bias, int R, int n, int nin,
                      int nout, size_t ws);
int g_linear_runs_bwd(const Backend *be, void *dx, void *dw, void *dbias, const void *dy, const void *x, const void *w,
                      int R, int n, int nin, int nout, size_t ws, int accum);
int g_linear_bwd(const Backend *be, void *dx, void *dw, void *dbias, const void *dy, const void *x, const void *w,
                 int N, int nin, int nout, int accum);
int g_bias_fwd(const Backend *be, void *y, const void *b, int N, int C);
int g_bias_bwd(const Backend *be, void *db, const void *dy, int N, int C);

// norms (cuda_norm.cu)
int g_rmsnorm_fwd(const Backend *be, void *y, void *rstd, const void *x, const void *w, int N, int D, int group,
                  int wlen, float eps);
int g_rmsnorm_bwd(const Backend *be, void *dx, void *dw, const void *dy, const void *x, const void *w,
                  const void *rstd, int N, int D, int group, int wlen, int accum);
int g_l2norm_fwd(const Backend *be, void *y, void *inv, const void *x, int N, int D, int group, float eps);
int g_l2norm_bwd(const Backend *be, void *dx, const void *dy, const void *y, const void *inv, int N, int D, int group);
int g_layernorm_fwd(const Backend *be, void *y, void *mean, void *rstd, const void *x, const void *w, int N, int D,
                    int group, int wlen, float eps);
int g_layernorm_bwd(const Backend *be, void *dx, void *dw, const void *dy, const void *x, const void *w,
                    const void *mean, const void *rstd, int N, int D, int group, int wlen, int accum);

// element-wise (cuda_elementwise.cu)
int g_softcap(const Backend *be, void *x, size_t n, float cap);
int g_gelu_fwd(const Backend *be, void *y, const void *x, size_t n);
int g_gelu_bwd(const Backend *be, void *dx, const void *dy, const void *x, size_t n);
int g_pool_last_fwd(const Backend *be, void *z, const void *x, int B, int T, int D);
int g_pool_last_bwd(const Backend *be, void *dx, const void *dz, int B, int T, int D);
int g_silu_fwd(const Backend *be, void *y, const void *x, size_t n);
int g_silu_bwd(const Backend *be, void *dx, const void *dy, const void *x, size_t n);
int g_swiglu_fwd(const Backend *be, void *h, const void *g, const void *u, size_t n);
int g_swiglu_bwd(const Backend *be, void *dg, void *du, const void *dh, const void *g, const void *u, size_t n);
int g_sigmoid_gate_fwd(const Backend *be, void *h, const void *g, const void *u, size_t n);
int g_sigmoid_gate_bwd(const Backend *be, void *dg, void *du, const void *dh, const void *g, const void *u, size_t n);
int g_geglu_fwd(const Backend *be, void *h, const void *g, const void *u, size_t n);
int g_geglu_bwd(const Backend *be, void *dg, void *du, const void *dh, const void *g, const void *u, size_t n);
int g_gelu_tanh_fwd(const Backend *be, void *y, const void *x, size_t n);
int g_gelu_tanh_bwd(const Backend *be, void *dx, const void *dy, const void *x, size_t n);
int g_geglu_tanh_fwd(const Backend *be, void *h, const void *g, const void *u, size_t n);
int g_geglu_tanh_bwd(const Backend *be, void *dg, void *du, const void *dh, const void *g, const void *u, size_t n);
int g_add(const Backend *be, void *x, const void *y, size_t n);
int g_scale_f32(const Backend *be, void *x, size_t n, float s);

// the causal convolution (cuda_conv.cu)
int g_conv_fwd(const Backend *be, void *y, const void *x, const void *w, int B, int T, int C, int K, const void *sin,
               void *sout);
int g_conv_bwd(const Backend *be, void *dx, void *dw, const void *dy, const void *x, const void *w, int B, int T,
               int C, int K, const void *sin);

// the embedding (cuda_embed.cu)
int g_embed_fwd(const Backend *be, void *x, const void *tok, const void *e, int N, int D, float scale);
int g_embed_bwd(const Backend *be, void *de, const void *dx, const void *tok, int N, int D, float scale);

// cross-entropy (cuda_xent.cu)
int g_xent(const Backend *be, void *logits, void *losses, const void *targets, int N, int V, float cap,
           float grad_scale, const void *grad_scale_at);

// gates (cuda_gates.cu)
int g_gates_fwd(const Backend *be, void *g, void *beta, const void *a, const void *b, size_t n, float hmax);
int g_gates_bwd(const Backend *be, void *da, void *db, const void *dg, const void *dbeta, const void *a,
                const void *b, size_t n, float hmax);
int g_softplus_fwd(const Backend *be, void *y, const void *p, size_t n, float lo);
int g_softplus_bwd(const Backend *be, void *dp, const void *dy, const void *p, size_t n);
int g_gdn_gate_fwd(const Backend *be, void *g, const void *a, const void *A_log, const void *dt_bias, int N, int H);
int g_gdn_gate_bwd(const Backend *be, void *da, void *dA_log, void *ddt_bias, const void *dg, const void *a,
                   const void *A_log, const void *dt_bias, int N, int H);
int g_longhorn_eps_fwd(const Backend *be, void *eps, const void *beta, const void *k, int N, int H, int Dk);
int g_longhorn_eps_bwd(const Backend *be, void *dbeta, void *dk, const void *deps, const void *beta, const void *k, int N,
                       int H, int Dk);

// the xLSTM blocks' ops (cuda_xlstm_ops.cu): the block-diagonal projection, the learnable skip
int g_headwise_fwd(const Backend *be, void *y, const void *x, const void *w, int N, int nb, int bin, int bout);
int g_headwise_bwd(const Backend *be, void *dx, void *dw, const void *dy, const void *x, const void *w, int N, int nb,
                   int bin, int bout, int accum);
int g_scale_add_fwd(const Backend *be, void *y, const void *a, const void *s, const void *b, int N, int C);
int g_scale_add_bwd(const Backend *be, void *db, void *ds, const void *dy, const void *b, const void *s, int N, int C,
                    int accum);
// and the mLSTM gates (the slots MlstmOps.gates_fwd / gates_bwd): fg = logsigmoid(cap tanh(a / cap)),
// ig = cap tanh(b / cap) (cap = 0: fg = logsigmoid(a), ig = b); a, b, da, db MEM_ACT, fg, ig, dfg,
// dig MEM_F32. C linkage: tests/cuda/ calls them directly.
extern "C" int g_mlstm_gates_fwd(const Backend *be, void *fg, void *ig, const void *a, const void *b, size_t n,
                                 float cap);
extern "C" int g_mlstm_gates_bwd(const Backend *be, void *da, void *db, const void *dfg, const void *dig, const void *a,
                                 const void *b, size_t n, float cap);

// the optimiser (cuda_optim.cu)
int g_sum_f32(const Backend *be, void *sum, const void *x, size_t n);
int g_sumsq(const Backend *be, void *out, const void *x, size_t n);
int g_adamw(const Backend *be, const AdamwOpts *o, const AdamwIo *io);

#endif
