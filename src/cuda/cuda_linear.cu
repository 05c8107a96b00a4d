/*
 * Dense layers (cuBLAS, bf16 operands, float32 accumulation) and the column sums that give the
 * gradients of biases and norm weights.
 */
#include "cuda_ops.cuh"

// ------------------------------------------------------------------------ column sums

__global__ void colsum_kernel(float *parts, const bf16 *dy, const bf16 *x, const float *mean, const float *rstd,
                              long rows, int L, int group, long per_strip, int vec) {
    __shared__ float part[COLSUM_WARPS][256];
    int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, width = vec ? 8 : 1, tile = 32 * width;
    int c0 = blockIdx.x * tile + lane * width;
    long r0 = blockIdx.y * per_strip, r1 = min(rows, r0 + per_strip);
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (c0 < L)
        for (long r = r0 + wp; r < r1; r += COLSUM_WARPS) {
            size_t e = (size_t)r * L + c0;
            float a[8], b[8];
            piece_load(dy + e, vec, a);
            if (x) {
                piece_load(x + e, vec, b);
                float mu = mean ? mean[e / group] : 0.0f, rs = rstd ? rstd[e / group] : 1.0f;
#pragma unroll
                for (int k = 0; k < 8; k++)
                    if (k < width) a[k] *= (b[k] - mu) * rs;
            }
#pragma unroll
            for (int k = 0; k < 8; k++)
                if (k < width) acc[k] += a[k];
        }
    colsum_flush(part, acc, width, L, parts + (size_t)blockIdx.y * L, 1);
}

// out[i] += the strips' partial sums of column i, in a fixed order: a block takes 32 columns, its 32
// warps every 32nd strip each, then the warps' sums in warp order. (A thread a column walking every
// strip left a narrow layer's sums on one block: 28 us for 128 columns of 256 strips.)
#define COLSUM_FW 32
__global__ void __launch_bounds__(32 * COLSUM_FW) colsum_finish_kernel(float *out, const float *parts, long strips,
                                                                       size_t n) {
    __shared__ float acc[COLSUM_FW][32];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (size_t c0 = blockIdx.x * (size_t)32; c0 < n; c0 += (size_t)gridDim.x * 32) {
        const size_t i = c0 + lane;
        float s = 0;
        if (i < n)
#pragma unroll 4
            for (long k = w; k < strips; k += COLSUM_FW) s += parts[(size_t)k * n + i];
        acc[w][lane] = s;
        __syncthreads();
        if (w == 0 && i < n) {
            for (int j = 1; j < COLSUM_FW; j++) s += acc[j][lane];
            out[i] += s;
        }
        __syncthreads();
    }
}

int colsum_finish(const Backend *be, float *out, const float *parts, long strips, size_t n) {
    colsum_finish_kernel<<<grid_for(n, 32), 32 * COLSUM_FW, 0, cuda_ctx(be)->stream>>>(out, parts, strips, n);
    LAUNCH_CHECK();
    return MN_OK;
}

// The grid of a column-sum kernel: tiles of 32 pieces of columns by strips of rows (about 1024
// blocks, 64 rows a strip at least). Returns the rows per strip.
long strip_rows(long rows, int cols, int vec, int *tiles, long *strips) {
    int tile = vec ? 256 : 32;
    if (rows < 1) rows = 1;  // (no rows: one empty strip, whose blocks add zeros)
    *tiles = (cols + tile - 1) / tile;
    long n = (rows + 63) / 64, cap = 1024 / *tiles > 1 ? 1024 / *tiles : 1;
    if (n > cap) n = cap;
    long per = (rows + n - 1) / n;
    *strips = (rows + per - 1) / per;
    return per;
}

int colsum_centred(const Backend *be, float *out, const bf16 *dy, const bf16 *x, const float *mean, const float *rstd,
                   long rows, int L, int group) {
    int vec = L % 8 == 0 && rows_vec(group, dy, x, x, x), tiles;
    long strips, per = strip_rows(rows, L, vec, &tiles, &strips);
    float *parts = (float *)cuda_scratch(be, sizeof(float) * (size_t)strips * L);
    if (!parts) return MN_ERR_NOMEM;
    colsum_kernel<<<dim3((unsigned)tiles, (unsigned)strips), 32 * COLSUM_WARPS, 0, cuda_ctx(be)->stream>>>(
        parts, dy, x, mean, rstd, rows, L, group, per, vec);
    LAUNCH_CHECK();
    return colsum_finish(be, out, parts, strips, (size_t)L);
}

int colsum(const Backend *be, float *out, const bf16 *dy, const bf16 *x, const float *rstd, long rows, int L,
           int group) {
    return colsum_centred(be, out, dy, x, NULL, rstd, rows, L, group);
}

// ---------------------------------------------------------------------- dense layers

__global__ void add_bias_kernel(bf16 *y, const float *b, int N, int O) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)N * O; i += (size_t)gridDim.x * blockDim.x)
        st(y, i, ld(y, i) + b[i % O]);
}

int g_bias_fwd(const Backend *be, void *y, const void *b, int N, int C) {
    add_bias_kernel<<<grid_for((size_t)N * C, 256), 256, 0, cuda_ctx(be)->stream>>>((bf16 *)y, (const float *)b, N, C);
    LAUNCH_CHECK();
    return MN_OK;
}

int g_bias_bwd(const Backend *be, void *db, const void *dy, int N, int C) {
    return colsum(be, (float *)db, (const bf16 *)dy, NULL, NULL, N, C, 1);
}

// Row-major y[N,O] = x[N,I] W[O,I]^T is, in cuBLAS's column-major terms,
// y^T (O x N) = W (O x I, stored as I x O: transposed) times x^T (I x N).
int g_linear_fwd(const Backend *be, void *y, const void *x, const void *w, const void *bias, int N, int nin,
                 int nout) {
    CudaCtx *c = cuda_ctx(be);
    const bf16 *wb = cuda_param_bf16(w);
    if (!wb) return mn_error(MN_ERR_ARG, "cuda linear: the weight is not a parameter allocation");
    float one = 1, zero = 0;
    CUBLAS_TRY(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, nout, N, nin, &one, wb, CUDA_R_16BF, nin, x, CUDA_R_16BF,
                            nin, &zero, y, CUDA_R_16BF, nout, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (bias) {
        add_bias_kernel<<<grid_for((size_t)N * nout, 256), 256, 0, c->stream>>>((bf16 *)y, (const float *)bias, N, nout);
        LAUNCH_CHECK();
    }
    return MN_OK;
}

// y_r[n,O] += b_r (run r's bias ws elements after run 0's), over the runs' rows one after the other.
__global__ void add_bias_runs_kernel(bf16 *y, const float *b, int R, int n, int O, size_t ws) {
    const size_t per = (size_t)n * O;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)R * per; i += (size_t)gridDim.x * blockDim.x)
        st(y, i, ld(y, i) + b[(i / per) * ws + i % O]);
}

// Backend.linear_runs_fwd: the R products of g_linear_fwd as one strided batch (the weights' bf16
// copies follow the masters element for element, so run r's is ws elements after run 0's too).
int g_linear_runs_fwd(const Backend *be, void *y, const void *x, const void *w, const void *bias, int R, int n, int nin,
                      int nout, size_t ws) {
    CudaCtx *c = cuda_ctx(be);
    const bf16 *wb = cuda_param_bf16(w);
    if (!wb) return mn_error(MN_ERR_ARG, "cuda linear: the weight is not a parameter allocation");
    float one = 1, zero = 0;
    CUBLAS_TRY(cublasGemmStridedBatchedEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, nout, n, nin, &one, wb, CUDA_R_16BF, nin,
                                          (long long)ws, x, CUDA_R_16BF, nin, (long long)n * nin, &zero, y, CUDA_R_16BF,
                                          nout, (long long)n * nout, R, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (bias) {
        add_bias_runs_kernel<<<grid_for((size_t)R * n * nout, 256), 256, 0, c->stream>>>((bf16 *)y, (const float *)bias,
                                                                                         R, n, nout, ws);
        LAUNCH_CHECK();
    }
    return MN_OK;
}

// Backend.linear_runs_bwd: g_linear_bwd's products as strided batches; the bias gradients a run at a time.
int g_linear_runs_bwd(const Backend *be, void *dx, void *dw, void *dbias, const void *dy, const void *x, const void *w,
                      int R, int n, int nin, int nout, size_t ws, int accum) {
    CudaCtx *c = cuda_ctx(be);
    const bf16 *wb = cuda_param_bf16(w);
    if (!wb) return mn_error(MN_ERR_ARG, "cuda linear: the weight is not a parameter allocation");
    float one = 1, beta_dx = accum ? 1.0f : 0.0f;
    if (dx)
        CUBLAS_TRY(cublasGemmStridedBatchedEx(c->blas, CUBLAS_OP_N, CUBLAS_OP_N, nin, n, nout, &one, wb, CUDA_R_16BF, nin,
                                              (long long)ws, dy, CUDA_R_16BF, nout, (long long)n * nout, &beta_dx, dx,
                                              CUDA_R_16BF, nin, (long long)n * nin, R, CUBLAS_COMPUTE_32F,
                                              CUBLAS_GEMM_DEFAULT));
    if (dw)
        CUBLAS_TRY(cublasGemmStridedBatchedEx(c->blas, CUBLAS_OP_N, CUBLAS_OP_T, nin, nout, n, &one, x, CUDA_R_16BF, nin,
                                              (long long)n * nin, dy, CUDA_R_16BF, nout, (long long)n * nout, &one, dw,
                                              CUDA_R_32F, nin, (long long)ws, R, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    for (int r = 0; dbias && r < R; r++)
        MN_TRY(colsum(be, (float *)dbias + r * ws, (const bf16 *)dy + (size_t)r * n * nout, NULL, NULL, n, nout, 1));
    return MN_OK;
}

int g_linear_bwd(const Backend *be, void *dx, void *dw, void *dbias, const void *dy, const void *x, const void *w,
                 int N, int nin, int nout, int accum) {
    CudaCtx *c = cuda_ctx(be);
    const bf16 *wb = cuda_param_bf16(w);
    if (!wb) return mn_error(MN_ERR_ARG, "cuda linear: the weight is not a parameter allocation");
    float one = 1, beta_dx = accum ? 1.0f : 0.0f;
    if (dx)  // dx^T (I x N) = W^T (I x O, as stored) dy^T (O x N)
        CUBLAS_TRY(cublasGemmEx(c->blas, CUBLAS_OP_N, CUBLAS_OP_N, nin, N, nout, &one, wb, CUDA_R_16BF, nin, dy,
                                CUDA_R_16BF, nout, &beta_dx, dx, CUDA_R_16BF, nin, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (dw)  // dW^T (I x O) += x^T (I x N) dy (N x O), accumulated in float32
        CUBLAS_TRY(cublasGemmEx(c->blas, CUBLAS_OP_N, CUBLAS_OP_T, nin, nout, N, &one, x, CUDA_R_16BF, nin, dy,
                                CUDA_R_16BF, nout, &one, dw, CUDA_R_32F, nin, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (dbias) return colsum(be, (float *)dbias, (const bf16 *)dy, NULL, NULL, N, nout, 1);
    return MN_OK;
}
