/*
 * The causal depthwise convolution (the lin family's short convolutions), forward, input gradient
 * and weight gradient, with a carried state of the last K - 1 inputs.
 */
#include "cuda_ops.cuh"

// The causal depthwise convolution reads channels in pieces of 8 (one 16-byte load) where C and
// the pointers allow it (vec), else one by one. Its input at t < 0 is the state (or zero).
__device__ __forceinline__ float conv_in(const bf16 *x, const bf16 *state, int b, int t, int c, int T, int C, int K) {
    if (t >= 0) return ld(x, ((size_t)b * T + t) * C + c);
    return state ? ld(state, ((size_t)b * (K - 1) + (t + K - 1)) * C + c) : 0.0f;
}

// The piece of x at (b, t, c): the state before t = 0 (or zero), zero from t = T on.
__device__ __forceinline__ void conv_piece(float v[8], const bf16 *x, const bf16 *state, int b, int t, int c, int T,
                                           int C, int K, int vec) {
    if (t >= 0 && t < T) {
        piece_load(x + ((size_t)b * T + t) * C + c, vec, v);
    } else if (t < 0 && state) {
        piece_load(state + ((size_t)b * (K - 1) + (t + K - 1)) * C + c, vec, v);
    } else {
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = 0;
    }
}

// A window of the last `taps` pieces (a constant), win[taps - 1] the newest. conv_window_fill
// sets it as before a shift at t: win[q] = the piece at t + dir (q - taps) for q >= 1 (zero where
// the taps of a width-K kernel never read it); conv_window_push shifts in the piece at t.
__device__ __forceinline__ void conv_window_fill(float (*win)[8], const bf16 *x, const bf16 *state, int b, int t, int dir,
                                                 int c, int T, int C, int K, int vec, const int taps) {
#pragma unroll
    for (int q = 1; q < taps; q++) {
        if (q >= taps + 1 - K) conv_piece(win[q], x, state, b, t + dir * (q - taps), c, T, C, K, vec);
        else
#pragma unroll
            for (int k = 0; k < 8; k++) win[q][k] = 0;
    }
}

__device__ __forceinline__ void conv_window_push(float (*win)[8], const bf16 *x, const bf16 *state, int b, int t, int c,
                                                 int T, int C, int K, int vec, const int taps) {
#pragma unroll
    for (int q = 0; q < taps - 1; q++)
#pragma unroll
        for (int k = 0; k < 8; k++) win[q][k] = win[q + 1][k];
    conv_piece(win[taps - 1], x, state, b, t, c, T, C, K, vec);
}

// A thread takes a piece of channels over CONV_TT time steps: it reads its weights once and
// keeps a window of its last `taps` input pieces in registers, so every input is read once (a
// thread per output piece would read the K inputs and 8 K scattered weights each time). Window and
// weights are `taps` wide (a constant: 4, or 8 for K > 4, since 8 everywhere costs registers),
// right-aligned, zero beyond K, so that registers are indexed by constants.
#define CONV_TT 16

// One step at t: the window shifts in the piece at t, the output piece goes out.
__device__ __forceinline__ void conv_step(bf16 *out, const bf16 *in, const bf16 *sin, const float (*wt)[8], float (*win)[8],
                                          int b, int t, int c, int T, int C, int K, int vec, const int taps) {
    conv_window_push(win, in, sin, b, t, c, T, C, K, vec, taps);
    float y[8];
#pragma unroll
    for (int k = 0; k < 8; k++) {
        y[k] = 0;
#pragma unroll
        for (int q = 0; q < taps; q++) y[k] += wt[q][k] * win[q][k];
    }
    piece_store(out + ((size_t)b * T + t) * C + c, vec, y);
}

// The forward, y[b, t, c] = sum_j w[c, j] x[b, t - K + 1 + j, c], walks t upwards with the window
// holding x at t - taps + 1 .. t. With rev, the input gradient dx[b, t, c] = sum_j w[c, j] dy[b, t +
// K - 1 - j, c] is the same sum walked downwards (the window holds dy at t + taps - 1 .. t, zero
// past T).
__device__ __forceinline__ void conv_run(bf16 *out, const bf16 *in, const float *w, int B, int T, int C, int K,
                                         const bf16 *sin, int vec, int rev, const int taps) {
    int width = vec ? 8 : 1, cp = C / width, tb = (T + CONV_TT - 1) / CONV_TT, dir = rev ? -1 : 1;
    GRID_LOOP(i, (size_t)B * tb * cp) {
        size_t r = i / cp;
        int c = (int)(i % cp) * width, t0 = (int)(r % tb) * CONV_TT, b = (int)(r / tb), t1 = min(T, t0 + CONV_TT);
        int ts = rev ? t1 - 1 : t0, n = t1 - t0;  // the first step, and the steps
        float wt[8][8], win[8][8];  // [taps][8] used
#pragma unroll
        for (int q = 0; q < taps; q++)  // wt[q][k] = w[c + k, q - (taps - K)], zero for q < taps - K
#pragma unroll
            for (int k = 0; k < 8; k++) {
                int j = q - (taps - K);
                wt[q][k] = k < width && j >= 0 ? w[(c + k) * K + j] : 0.0f;
            }
        conv_window_fill(win, in, sin, b, ts, dir, c, T, C, K, vec, taps);
        if (n == CONV_TT) {  // unrolled, so that the loads of all steps are in flight together
#pragma unroll
            for (int s = 0; s < CONV_TT; s++) conv_step(out, in, sin, wt, win, b, ts + dir * s, c, T, C, K, vec, taps);
        } else {
            for (int s = 0; s < n; s++) conv_step(out, in, sin, wt, win, b, ts + dir * s, c, T, C, K, vec, taps);
        }
    }
}

__global__ void conv_kernel4(bf16 *out, const bf16 *in, const float *w, int B, int T, int C, int K, const bf16 *sin,
                             int vec, int rev) {
    conv_run(out, in, w, B, T, C, K, sin, vec, rev, 4);
}

__global__ void conv_kernel8(bf16 *out, const bf16 *in, const float *w, int B, int T, int C, int K, const bf16 *sin,
                             int vec, int rev) {
    conv_run(out, in, w, B, T, C, K, sin, vec, rev, 8);
}

// conv_run over [B, T, C] with K <= 8 taps (forward, or with rev the input gradient).
static int conv_launch(cudaStream_t st, bf16 *out, const bf16 *in, const float *w, int B, int T, int C, int K,
                       const bf16 *sin, int vec, int rev) {
    unsigned grid = grid_for((size_t)B * ((T + CONV_TT - 1) / CONV_TT) * (C / (vec ? 8 : 1)), 256);
    if (K <= 4) conv_kernel4<<<grid, 256, 0, st>>>(out, in, w, B, T, C, K, sin, vec, rev);
    else conv_kernel8<<<grid, 256, 0, st>>>(out, in, w, B, T, C, K, sin, vec, rev);
    LAUNCH_CHECK();
    return MN_OK;
}

__global__ void conv_state_kernel(bf16 *tmp, const bf16 *x, int B, int T, int C, int K, const bf16 *sin) {
    GRID_LOOP(i, (size_t)B * (K - 1) * C) {
        int c = (int)(i % C), j = (int)((i / C) % (K - 1)), b = (int)(i / ((size_t)C * (K - 1)));
        st(tmp, i, conv_in(x, sin, b, T - (K - 1) + j, c, T, C, K));
    }
}


int g_conv_fwd(const Backend *be, void *y, const void *x, const void *w, int B, int T, int C, int K,
               const void *sin, void *sout) {
    CudaCtx *cx = cuda_ctx(be);
    if (K > 8) return mn_error(MN_ERR_ARG, "cuda conv: kernel width %d, at most 8", K);
    int vec = rows_vec(C, y, x, sin, sin);
    MN_TRY(conv_launch(cx->stream, (bf16 *)y, (const bf16 *)x, (const float *)w, B, T, C, K, (const bf16 *)sin, vec, 0));
    if (sout && K > 1) {  // via scratch: state_out may alias state_in
        size_t ns = (size_t)B * (K - 1) * C;
        bf16 *tmp = (bf16 *)cuda_scratch(be, ns * sizeof(bf16));
        if (!tmp) return MN_ERR_NOMEM;
        conv_state_kernel<<<grid_for(ns, 256), 256, 0, cx->stream>>>(tmp, (const bf16 *)x, B, T, C, K, (const bf16 *)sin);
        LAUNCH_CHECK();
        CU_TRY(cudaMemcpyAsync(sout, tmp, ns * sizeof(bf16), cudaMemcpyDeviceToDevice, cx->stream));
    }
    return MN_OK;
}

// dw[c, j] = sum over (b, t) of dy[b, t, c] x[b, t - K + 1 + j, c]: column sums (colsum_kernel's
// strips and tiles) of K products per row. Each warp walks its own run of consecutive rows with a
// window of the last `taps` x pieces (as conv_run), so that a row costs one new x piece, not K;
// the window is refilled where a run or a sequence starts. acc[q] gathers tap q - (taps - K).
__device__ __forceinline__ void conv_dw_run(float *dw, const bf16 *dy, const bf16 *x, int B, int T, int C, int K,
                                            const bf16 *sin, long per_strip, int vec, const int taps) {
    __shared__ float part[COLSUM_WARPS][256];
    int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, width = vec ? 8 : 1, tile = 32 * width;
    int c0 = blockIdx.x * tile + lane * width;
    long r0 = blockIdx.y * per_strip, r1 = min((long)B * T, r0 + per_strip);
    long span = (per_strip + COLSUM_WARPS - 1) / COLSUM_WARPS, w0 = r0 + wp * span, w1 = min(r1, w0 + span);
    float acc[8][8], win[8][8];  // [taps][8] used
#pragma unroll
    for (int q = 0; q < taps; q++)
#pragma unroll
        for (int k = 0; k < 8; k++) acc[q][k] = 0;
    if (c0 < C)
        for (long r = w0; r < w1; r++) {
            int b = (int)(r / T), t = (int)(r % T);
            if (r == w0 || t == 0) conv_window_fill(win, x, sin, b, t, 1, c0, T, C, K, vec, taps);
            conv_window_push(win, x, sin, b, t, c0, T, C, K, vec, taps);
            float g[8];
            piece_load(dy + (size_t)r * C + c0, vec, g);
#pragma unroll
            for (int q = 0; q < taps; q++)
#pragma unroll
                for (int k = 0; k < 8; k++) acc[q][k] += g[k] * win[q][k];
        }
#pragma unroll
    for (int q = 0; q < taps; q++) {
        int j = q - (taps - K);
        if (j < 0) continue;
        colsum_flush(part, acc[q], width, C, dw + (size_t)blockIdx.y * C * K + j, K);  // dw: the strips' sums
        __syncthreads();  // part is reused
    }
}

__global__ void conv_bwd_dw_kernel4(float *dw, const bf16 *dy, const bf16 *x, int B, int T, int C, int K, const bf16 *sin,
                                    long per_strip, int vec) {
    conv_dw_run(dw, dy, x, B, T, C, K, sin, per_strip, vec, 4);
}

__global__ void conv_bwd_dw_kernel8(float *dw, const bf16 *dy, const bf16 *x, int B, int T, int C, int K, const bf16 *sin,
                                    long per_strip, int vec) {
    conv_dw_run(dw, dy, x, B, T, C, K, sin, per_strip, vec, 8);
}

int g_conv_bwd(const Backend *be, void *dx, void *dw, const void *dy, const void *x, const void *w, int B, int T,
               int C, int K, const void *sin) {
    if (K > 8) return mn_error(MN_ERR_ARG, "cuda conv: kernel width %d, at most 8", K);
    cudaStream_t s = cuda_ctx(be)->stream;
    int vec = rows_vec(C, dx, dy, x, sin);
    MN_TRY(conv_launch(s, (bf16 *)dx, (const bf16 *)dy, (const float *)w, B, T, C, K, NULL, vec, 1));
    int tiles;
    long strips, per = strip_rows((long)B * T, C, vec, &tiles, &strips);
    dim3 grid((unsigned)tiles, (unsigned)strips);
    float *parts = (float *)cuda_scratch(be, sizeof(float) * (size_t)strips * C * K);
    if (!parts) return MN_ERR_NOMEM;
    if (K <= 4)
        conv_bwd_dw_kernel4<<<grid, 32 * COLSUM_WARPS, 0, s>>>(parts, (const bf16 *)dy, (const bf16 *)x, B, T, C, K,
                                                               (const bf16 *)sin, per, vec);
    else
        conv_bwd_dw_kernel8<<<grid, 32 * COLSUM_WARPS, 0, s>>>(parts, (const bf16 *)dy, (const bf16 *)x, B, T, C, K,
                                                               (const bf16 *)sin, per, vec);
    LAUNCH_CHECK();
    return colsum_finish(be, (float *)dw, parts, strips, (size_t)C * K);
}
