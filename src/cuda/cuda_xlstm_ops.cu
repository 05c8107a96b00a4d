/*
 * The xLSTM blocks' ops (their LayerNorm is in cuda_norm.cu): the block-diagonal projection
 * (headwise), the learnable skip (scale_add), and the mLSTM gates from their pre-activations.
 */
#include "cuda_ops.cuh"

// ------------------------------------------------------------ the block-diagonal projection

// x [N,nb,bin], w [nb,bout,bin], y [N,nb,bout]: y[n,b,o] = sum_i w[b,o,i] x[n,b,i]. Both paths
// multiply the weights' bf16 copy, as every product does (cuda_backend.cu), and sum in float32.
// Blocks of up to HW_SMALL weights (xLSTM's 4 x 4 q/k/v: nb up to ~1000) are plain kernels, a
// thread an output; larger ones (the sLSTM's gate projections: 4 blocks of up to 512 x 512) one
// strided-batched cuBLAS product for all blocks.
#define HW_SMALL 256

static int hw_small(int bin, int bout) { return (long)bin * bout <= HW_SMALL; }

__global__ void headwise_fwd_kernel(bf16 *y, const bf16 *x, const bf16 *w, size_t n, int nb, int bin, int bout) {
    GRID_LOOP(e, n) {
        size_t row = e / bout;  // n nb + b
        int o = (int)(e % bout), b = (int)(row % nb);
        const bf16 *wo = w + ((size_t)b * bout + o) * bin, *xr = x + row * bin;
        float s = 0;
        for (int i = 0; i < bin; i++) s += ld(wo, i) * ld(xr, i);
        st(y, e, s);
    }
}

// dx[n,b,i] (= or +=) = sum_o dy[n,b,o] w[b,o,i]
__global__ void headwise_dx_kernel(bf16 *dx, const bf16 *dy, const bf16 *w, size_t n, int nb, int bin, int bout,
                                   int accum) {
    GRID_LOOP(e, n) {
        size_t row = e / bin;
        int i = (int)(e % bin), b = (int)(row % nb);
        const bf16 *wi = w + (size_t)b * bout * bin + i, *dyr = dy + row * bout;
        float s = 0;
        for (int o = 0; o < bout; o++) s += ld(dyr, o) * ld(wi, (size_t)o * bin);
        st(dx, e, accum ? ld(dx, e) + s : s);
    }
}

// dw[b,o,i] = sum_n dy[n,b,o] x[n,b,i]: column sums (colsum_kernel's scheme, cuda_ops.cuh) over N
// rows of the nb bout bin products: a lane takes 8 consecutive weights, the block 256, a strip of
// rows; colsum_finish adds the strips' sums in their order (deterministic).
__global__ void headwise_dw_kernel(float *parts, const bf16 *dy, const bf16 *x, long N, int nb, int bin, int bout,
                                   long per_strip) {
    __shared__ float part[COLSUM_WARPS][256];
    int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, L = nb * bout * bin, wb = bout * bin;
    int c0 = blockIdx.x * 256 + lane * 8, ody[8], ox[8];
#pragma unroll
    for (int k = 0; k < 8; k++) {
        int c = min(c0 + k, L - 1), b = c / wb, o = c % wb / bin, i = c % bin;
        ody[k] = b * bout + o;
        ox[k] = b * bin + i;
    }
    long r0 = blockIdx.y * per_strip, r1 = min(N, r0 + per_strip);
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (c0 < L)
        for (long r = r0 + wp; r < r1; r += COLSUM_WARPS) {
            const bf16 *dyr = dy + (size_t)r * nb * bout, *xr = x + (size_t)r * nb * bin;
#pragma unroll
            for (int k = 0; k < 8; k++) acc[k] += ld(dyr, ody[k]) * ld(xr, ox[k]);
        }
    colsum_flush(part, acc, 8, L, parts + (size_t)blockIdx.y * L, 1);  // (columns past L: not written)
}

int g_headwise_fwd(const Backend *be, void *y, const void *x, const void *w, int N, int nb, int bin, int bout) {
    CudaCtx *c = cuda_ctx(be);
    const bf16 *wb = cuda_param_bf16(w);
    if (!wb) return mn_error(MN_ERR_ARG, "cuda headwise: the weight is not a parameter allocation");
    if (hw_small(bin, bout)) {
        size_t n = (size_t)N * nb * bout;
        headwise_fwd_kernel<<<grid_for(n, 256), 256, 0, c->stream>>>((bf16 *)y, (const bf16 *)x, wb, n, nb, bin, bout);
        LAUNCH_CHECK();
        return MN_OK;
    }
    // per block b, column-major: y_b^T (bout x N, ld nb bout) = W_b (stored bin x bout: transposed)
    // times x_b^T (bin x N, ld nb bin)
    float one = 1, zero = 0;
    CUBLAS_TRY(cublasGemmStridedBatchedEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, bout, N, bin, &one, wb, CUDA_R_16BF, bin,
                                          (long long)bout * bin, x, CUDA_R_16BF, nb * bin, bin, &zero, y, CUDA_R_16BF,
                                          nb * bout, bout, nb, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return MN_OK;
}

int g_headwise_bwd(const Backend *be, void *dx, void *dw, const void *dy, const void *x, const void *w, int N, int nb,
                   int bin, int bout, int accum) {
    CudaCtx *c = cuda_ctx(be);
    const bf16 *wb = cuda_param_bf16(w);
    if (!wb) return mn_error(MN_ERR_ARG, "cuda headwise: the weight is not a parameter allocation");
    if (hw_small(bin, bout)) {
        if (dx) {
            size_t n = (size_t)N * nb * bin;
            headwise_dx_kernel<<<grid_for(n, 256), 256, 0, c->stream>>>((bf16 *)dx, (const bf16 *)dy, wb, n, nb, bin,
                                                                        bout, accum);
            LAUNCH_CHECK();
        }
        if (!dw) return MN_OK;
        int L = nb * bout * bin, tiles;
        long strips, per = strip_rows(N, L, 1, &tiles, &strips);
        float *parts = (float *)cuda_scratch(be, sizeof(float) * (size_t)strips * L);
        if (!parts) return MN_ERR_NOMEM;
        headwise_dw_kernel<<<dim3((unsigned)tiles, (unsigned)strips), 32 * COLSUM_WARPS, 0, c->stream>>>(
            parts, (const bf16 *)dy, (const bf16 *)x, N, nb, bin, bout, per);
        LAUNCH_CHECK();
        return colsum_finish(be, (float *)dw, parts, strips, (size_t)L);
    }
    float one = 1, beta_dx = accum ? 1.0f : 0.0f;
    if (dx)  // dx_b^T (bin x N, ld nb bin) = W_b^T (bin x bout, as stored) dy_b^T (bout x N, ld nb bout)
        CUBLAS_TRY(cublasGemmStridedBatchedEx(c->blas, CUBLAS_OP_N, CUBLAS_OP_N, bin, N, bout, &one, wb, CUDA_R_16BF,
                                              bin, (long long)bout * bin, dy, CUDA_R_16BF, nb * bout, bout, &beta_dx,
                                              dx, CUDA_R_16BF, nb * bin, bin, nb, CUBLAS_COMPUTE_32F,
                                              CUBLAS_GEMM_DEFAULT));
    if (dw)  // dW_b^T (bin x bout) += x_b^T (bin x N) dy_b (N x bout), accumulated in float32
        CUBLAS_TRY(cublasGemmStridedBatchedEx(c->blas, CUBLAS_OP_N, CUBLAS_OP_T, bin, bout, N, &one, x, CUDA_R_16BF,
                                              nb * bin, bin, dy, CUDA_R_16BF, nb * bout, bout, &one, dw, CUDA_R_32F,
                                              bin, (long long)bout * bin, nb, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return MN_OK;
}

// ------------------------------------------------------------------- the learnable skip

// out[n,c] = base[n,c] + s[c] v[n,c] (base NULL: 0; out may alias base): the forward (base a, v b)
// and db (base db where it accumulates, v dy). Rows of C (a multiple of 8) in 16-byte pieces where
// the pointers allow (vec), else element by element; s is the float32 master.
__global__ void scale_add_kernel(bf16 *out, const bf16 *base, const float *s, const bf16 *v, size_t n, int C, int vec) {
    if (!vec) {
        GRID_LOOP(i, n) st(out, i, (base ? ld(base, i) : 0.0f) + s[i % C] * ld(v, i));
        return;
    }
    GRID_LOOP(p, n / 8) {
        size_t i = 8 * p;
        float a[8] = {0, 0, 0, 0, 0, 0, 0, 0}, b[8], sv[8];
        if (base) piece_load(base + i, 1, a);
        piece_load(v + i, 1, b);
        piece_load_f32(s + i % C, 1, sv);
#pragma unroll
        for (int k = 0; k < 8; k++) a[k] += sv[k] * b[k];
        piece_store(out + i, 1, a);
    }
}

static int scale_add(const Backend *be, bf16 *out, const bf16 *base, const float *s, const bf16 *v, int N, int C) {
    size_t n = (size_t)N * C;
    int vec = C % 8 == 0 && aligned16(out, base, s, v);
    scale_add_kernel<<<grid_for(vec ? n / 8 : n, 256), 256, 0, cuda_ctx(be)->stream>>>(out, base, s, v, n, C, vec);
    LAUNCH_CHECK();
    return MN_OK;
}

int g_scale_add_fwd(const Backend *be, void *y, const void *a, const void *s, const void *b, int N, int C) {
    return scale_add(be, (bf16 *)y, (const bf16 *)a, (const float *)s, (const bf16 *)b, N, C);
}

// ds first (column sums of dy b, deterministic), then db: db may alias dy.
int g_scale_add_bwd(const Backend *be, void *db, void *ds, const void *dy, const void *b, const void *s, int N, int C,
                    int accum) {
    if (ds) {
        int rc = colsum_centred(be, (float *)ds, (const bf16 *)dy, (const bf16 *)b, NULL, NULL, N, C, C);
        if (rc) return rc;
    }
    return scale_add(be, (bf16 *)db, accum ? (const bf16 *)db : NULL, (const float *)s, (const bf16 *)dy, N, C);
}

// ----------------------------------------------------------------------------- mLSTM gates

// The soft cap c tanh(v / c) (c = 0: none) and its derivative 1 - tanh^2.
__device__ __forceinline__ float soft_cap(float v, float cap) { return cap > 0 ? cap * tanhf(v / cap) : v; }
__device__ __forceinline__ float soft_cap_grad(float v, float cap) {
    if (!(cap > 0)) return 1.0f;
    float t = tanhf(v / cap);
    return 1.0f - t * t;
}
__device__ __forceinline__ float log_sigmoid_(float a) { return a >= 0 ? -log1pf(expf(-a)) : a - log1pf(expf(a)); }

__global__ void mlstm_gates_fwd_kernel(float *fg, float *ig, const bf16 *a, const bf16 *b, size_t n, float cap) {
    GRID_LOOP(i, n) {
        fg[i] = log_sigmoid_(soft_cap(ld(a, i), cap));
        ig[i] = soft_cap(ld(b, i), cap);
    }
}

// d logsigmoid(u) / du = sigmoid(-u) = 1 / (1 + e^u) (0 where e^u overflows, as it should)
__global__ void mlstm_gates_bwd_kernel(bf16 *da, bf16 *db, const float *dfg, const float *dig, const bf16 *a,
                                       const bf16 *b, size_t n, float cap) {
    GRID_LOOP(i, n) {
        float av = ld(a, i);
        st(da, i, dfg[i] / (1.0f + expf(soft_cap(av, cap))) * soft_cap_grad(av, cap));
        st(db, i, dig[i] * soft_cap_grad(ld(b, i), cap));
    }
}

extern "C" int g_mlstm_gates_fwd(const Backend *be, void *fg, void *ig, const void *a, const void *b, size_t n,
                                 float cap) {
    mlstm_gates_fwd_kernel<<<grid_for(n, 256), 256, 0, cuda_ctx(be)->stream>>>(
        (float *)fg, (float *)ig, (const bf16 *)a, (const bf16 *)b, n, cap);
    LAUNCH_CHECK();
    return MN_OK;
}

extern "C" int g_mlstm_gates_bwd(const Backend *be, void *da, void *db, const void *dfg, const void *dig, const void *a,
                                 const void *b, size_t n, float cap) {
    mlstm_gates_bwd_kernel<<<grid_for(n, 256), 256, 0, cuda_ctx(be)->stream>>>(
        (bf16 *)da, (bf16 *)db, (const float *)dfg, (const float *)dig, (const bf16 *)a, (const bf16 *)b, n, cap);
    LAUNCH_CHECK();
    return MN_OK;
}
