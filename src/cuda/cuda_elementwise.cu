/*
 * Element-wise ops: soft cap, SiLU, SwiGLU, GELU (exact and tanh), the GELU-gated products, the sigmoid gate, add, float32 scaling, and the autoencoder
 * head's pooling.
 */
#include "cuda_ops.cuh"

__global__ void softcap_kernel(bf16 *x, size_t n, float cap) {
    GRID_LOOP(i, n) st(x, i, cap * tanhf(ld(x, i) / cap));
}

int g_softcap(const Backend *be, void *x, size_t n, float cap) {
    softcap_kernel<<<grid_for(n, 256), 256, 0, cuda_ctx(be)->stream>>>((bf16 *)x, n, cap);
    LAUNCH_CHECK();
    return MN_OK;
}

// Element-wise kernels: a thread takes 8 elements at a time, one 16-byte load or store per
// operand where the pointers allow it (vec), else (and at the tail) element by element.
#define PIECE_LOOP(i, n) \
    for (size_t i = 8 * (blockIdx.x * (size_t)blockDim.x + threadIdx.x); i < (n); i += 8 * (size_t)gridDim.x * blockDim.x)

__device__ __forceinline__ int piece_get(const bf16 *p, size_t i, size_t n, int vec, float v[8]) {
    int m = n - i < 8 ? (int)(n - i) : 8;
    if (vec && m == 8) return piece_load(p + i, 1, v);
#pragma unroll
    for (int k = 0; k < 8; k++) v[k] = k < m ? __bfloat162float(p[i + k]) : 0.0f;
    return m;
}

__device__ __forceinline__ void piece_put(bf16 *p, size_t i, int m, int vec, const float v[8]) {
    if (vec && m == 8) {
        piece_store(p + i, 1, v);
        return;
    }
    for (int k = 0; k < m; k++) p[i + k] = __float2bfloat16(v[k]);
}

static unsigned piece_grid(size_t n) { return grid_for((n + 7) / 8, 256); }

__global__ void silu_fwd_kernel(bf16 *y, const bf16 *x, size_t n, int vec) {
    PIECE_LOOP(i, n) {
        float v[8];
        int m = piece_get(x, i, n, vec, v);
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] *= sigmoidf_(v[k]);
        piece_put(y, i, m, vec, v);
    }
}

// Exact GELU (erff, as torch's nn.GELU()) and its derivative Phi(x) + x phi(x).
__device__ __forceinline__ float gelu_(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }
__device__ __forceinline__ float gelu_grad_(float x) {
    return 0.5f * (1.0f + erff(x * 0.70710678118654752f)) + x * expf(-0.5f * x * x) * 0.39894228040143268f;
}

// GELU's tanh approximation (torch's gelu(approximate='tanh')) and its derivative, as the CPU's.
__device__ __forceinline__ float gelu_tanh_(float x) {
    return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
}
__device__ __forceinline__ float gelu_tanh_grad_(float x) {
    float t = tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * 0.79788456080286536f * (1.0f + 3.0f * 0.044715f * x * x);
}

// The two-input element-wise ops: out = f(a, b).
enum { BIN_ADD, BIN_SILU_BWD, BIN_SWIGLU, BIN_GEGLU, BIN_GEGLU_TANH, BIN_SIGMOID_GATE };

__device__ __forceinline__ float binary_op(int op, float a, float b) {
    if (op == BIN_ADD) return a + b;
    if (op == BIN_SWIGLU) return a * sigmoidf_(a) * b;  // a = g, b = u
    if (op == BIN_GEGLU) return gelu_(a) * b;           // a = g, b = u
    if (op == BIN_GEGLU_TANH) return gelu_tanh_(a) * b; // a = g, b = u
    if (op == BIN_SIGMOID_GATE) return sigmoidf_(a) * b; // a = g, b = u
    float s = sigmoidf_(b);                              // SiLU's backward: a = dy, b = x
    return a * s * (1 + b * (1 - s));
}

__global__ void binary_kernel(bf16 *out, const bf16 *a, const bf16 *b, size_t n, int vec, int op) {
    PIECE_LOOP(i, n) {
        float u[8], w[8];
        int m = piece_get(a, i, n, vec, u);
        piece_get(b, i, n, vec, w);
#pragma unroll
        for (int k = 0; k < 8; k++) u[k] = binary_op(op, u[k], w[k]);
        piece_put(out, i, m, vec, u);
    }
}

static int binary(const Backend *be, void *out, const void *a, const void *b, size_t n, int op) {
    binary_kernel<<<piece_grid(n), 256, 0, cuda_ctx(be)->stream>>>((bf16 *)out, (const bf16 *)a, (const bf16 *)b, n,
                                                                   aligned16(out, a, b, b), op);
    LAUNCH_CHECK();
    return MN_OK;
}

// The gated products' backward, h = act(g) u: dg = dh u act'(g), du = dh act(g); act SiLU, GELU
// (exact or tanh) or the sigmoid (GATE_*).
enum { GATE_SILU, GATE_GELU, GATE_GELU_TANH, GATE_SIGMOID };

__global__ void gated_bwd_kernel(bf16 *dg, bf16 *du, const bf16 *dh, const bf16 *g, const bf16 *u, size_t n, int vec,
                                 int act) {
    PIECE_LOOP(i, n) {
        float d[8], v[8], w[8], a[8], b[8];
        int m = piece_get(dh, i, n, vec, d);
        piece_get(g, i, n, vec, v);
        piece_get(u, i, n, vec, w);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            if (act == GATE_GELU) {
                a[k] = d[k] * w[k] * gelu_grad_(v[k]);
                b[k] = d[k] * gelu_(v[k]);
            } else if (act == GATE_GELU_TANH) {
                a[k] = d[k] * w[k] * gelu_tanh_grad_(v[k]);
                b[k] = d[k] * gelu_tanh_(v[k]);
            } else if (act == GATE_SIGMOID) {
                float s = sigmoidf_(v[k]);
                a[k] = d[k] * w[k] * s * (1 - s);
                b[k] = d[k] * s;
            } else {
                float s = sigmoidf_(v[k]);
                a[k] = d[k] * w[k] * s * (1 + v[k] * (1 - s));
                b[k] = d[k] * v[k] * s;
            }
        }
        piece_put(dg, i, m, vec, a);
        piece_put(du, i, m, vec, b);
    }
}

// GELU (approx 0: exact; 1: tanh), forward or (dy given) backward.
__global__ void gelu_kernel(bf16 *y, const bf16 *x, const bf16 *dy, size_t n, int vec, int approx) {
    PIECE_LOOP(i, n) {
        float v[8], d[8] = {0};
        int m = piece_get(x, i, n, vec, v);
        if (dy) piece_get(dy, i, n, vec, d);
#pragma unroll
        for (int k = 0; k < 8; k++)
            v[k] = approx ? (dy ? d[k] * gelu_tanh_grad_(v[k]) : gelu_tanh_(v[k]))
                          : (dy ? d[k] * gelu_grad_(v[k]) : gelu_(v[k]));
        piece_put(y, i, m, vec, v);
    }
}

static int gelu(const Backend *be, void *y, const void *x, const void *dy, size_t n, int approx) {
    gelu_kernel<<<piece_grid(n), 256, 0, cuda_ctx(be)->stream>>>((bf16 *)y, (const bf16 *)x, (const bf16 *)dy, n,
                                                                  aligned16(y, x, dy ? dy : x, x), approx);
    LAUNCH_CHECK();
    return MN_OK;
}
int g_gelu_fwd(const Backend *be, void *y, const void *x, size_t n) { return gelu(be, y, x, NULL, n, 0); }
int g_gelu_bwd(const Backend *be, void *dx, const void *dy, const void *x, size_t n) { return gelu(be, dx, x, dy, n, 0); }
int g_gelu_tanh_fwd(const Backend *be, void *y, const void *x, size_t n) { return gelu(be, y, x, NULL, n, 1); }
int g_gelu_tanh_bwd(const Backend *be, void *dx, const void *dy, const void *x, size_t n) {
    return gelu(be, dx, x, dy, n, 1);
}

// The autoencoder head's pooling (backend.h): z[b,t,:] = x[b,T-1,:] + pe[t,:] (pe in double, as mn_posemb),
// and its backward, a thread per element of dx (those at t = T-1 sum their column of dz in float).
__global__ void pool_last_fwd_kernel(bf16 *z, const bf16 *x, int B, int T, int D) {
    size_t n = (size_t)B * T * D;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(e % D), t = (int)(e / D % T);
        size_t b = e / ((size_t)D * T);
        int h = D / 2, j = i < h ? i : i - h;
        double a = (double)t * exp(-(double)j * log(10000.0) / (double)(h - 1));
        double pe = i >= 2 * h ? 0.0 : i < h ? sin(a) : cos(a);
        z[e] = __float2bfloat16(ld(x, (b * T + T - 1) * D + i) + (float)pe);
    }
}

__global__ void pool_last_bwd_kernel(bf16 *dx, const bf16 *dz, int B, int T, int D) {
    size_t n = (size_t)B * T * D;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(e % D), t = (int)(e / D % T);
        size_t b = e / ((size_t)D * T);
        float s = 0;
        if (t == T - 1)
            for (int u = 0; u < T; u++) s += ld(dz, (b * T + u) * D + i);
        dx[e] = __float2bfloat16(s);
    }
}

int g_pool_last_fwd(const Backend *be, void *z, const void *x, int B, int T, int D) {
    pool_last_fwd_kernel<<<grid_for((size_t)B * T * D, 256), 256, 0, cuda_ctx(be)->stream>>>((bf16 *)z, (const bf16 *)x,
                                                                                            B, T, D);
    LAUNCH_CHECK();
    return MN_OK;
}
int g_pool_last_bwd(const Backend *be, void *dx, const void *dz, int B, int T, int D) {
    pool_last_bwd_kernel<<<grid_for((size_t)B * T * D, 256), 256, 0, cuda_ctx(be)->stream>>>((bf16 *)dx,
                                                                                            (const bf16 *)dz, B, T, D);
    LAUNCH_CHECK();
    return MN_OK;
}

int g_silu_fwd(const Backend *be, void *y, const void *x, size_t n) {
    silu_fwd_kernel<<<piece_grid(n), 256, 0, cuda_ctx(be)->stream>>>((bf16 *)y, (const bf16 *)x, n, aligned16(y, x, x, x));
    LAUNCH_CHECK();
    return MN_OK;
}
int g_silu_bwd(const Backend *be, void *dx, const void *dy, const void *x, size_t n) {
    return binary(be, dx, dy, x, n, BIN_SILU_BWD);
}
int g_swiglu_fwd(const Backend *be, void *h, const void *g, const void *u, size_t n) {
    return binary(be, h, g, u, n, BIN_SWIGLU);
}
static int gated_bwd(const Backend *be, void *dg, void *du, const void *dh, const void *g, const void *u, size_t n,
                     int act) {
    gated_bwd_kernel<<<piece_grid(n), 256, 0, cuda_ctx(be)->stream>>>(
        (bf16 *)dg, (bf16 *)du, (const bf16 *)dh, (const bf16 *)g, (const bf16 *)u, n,
        aligned16(dg, du, dh, g) && aligned16(u, u, u, u), act);
    LAUNCH_CHECK();
    return MN_OK;
}
int g_swiglu_bwd(const Backend *be, void *dg, void *du, const void *dh, const void *g, const void *u, size_t n) {
    return gated_bwd(be, dg, du, dh, g, u, n, GATE_SILU);
}
int g_sigmoid_gate_fwd(const Backend *be, void *h, const void *g, const void *u, size_t n) {
    return binary(be, h, g, u, n, BIN_SIGMOID_GATE);
}
int g_sigmoid_gate_bwd(const Backend *be, void *dg, void *du, const void *dh, const void *g, const void *u, size_t n) {
    return gated_bwd(be, dg, du, dh, g, u, n, GATE_SIGMOID);
}
int g_geglu_fwd(const Backend *be, void *h, const void *g, const void *u, size_t n) {
    return binary(be, h, g, u, n, BIN_GEGLU);
}
int g_geglu_bwd(const Backend *be, void *dg, void *du, const void *dh, const void *g, const void *u, size_t n) {
    return gated_bwd(be, dg, du, dh, g, u, n, GATE_GELU);
}
int g_geglu_tanh_fwd(const Backend *be, void *h, const void *g, const void *u, size_t n) {
    return binary(be, h, g, u, n, BIN_GEGLU_TANH);
}
int g_geglu_tanh_bwd(const Backend *be, void *dg, void *du, const void *dh, const void *g, const void *u, size_t n) {
    return gated_bwd(be, dg, du, dh, g, u, n, GATE_GELU_TANH);
}
int g_add(const Backend *be, void *x, const void *y, size_t n) { return binary(be, x, x, y, n, BIN_ADD); }

__global__ void scale_f32_kernel(float *x, size_t n, float s) {
    GRID_LOOP(i, n) x[i] *= s;
}

int g_scale_f32(const Backend *be, void *x, size_t n, float s) {
    scale_f32_kernel<<<grid_for(n, 256), 256, 0, cuda_ctx(be)->stream>>>((float *)x, n, s);
    LAUNCH_CHECK();
    return MN_OK;
}
