/*
 * Gates: the Mesa layer's forget gate and beta, softplus (the Mesa layer's lambda), the Gated
 * DeltaNet paper's decay gate, Longhorn's implicit step size.
 */
#include "cuda_ops.cuh"

// -------------------------------------------------------------------- Mesa gates

__device__ __forceinline__ float log_sigmoid(float a) { return a >= 0 ? -log1pf(expf(-a)) : a - log1pf(expf(a)); }

__global__ void gates_fwd_kernel(float *g, float *beta, const bf16 *a, const bf16 *b, size_t n, float hmax) {
    GRID_LOOP(i, n) {
        float bt = 1.0f / (1.0f + expf(-ld(b, i))), gi = log_sigmoid(ld(a, i));
        if (hmax > 0) gi = fminf(gi, log1pf(-bt / hmax));
        beta[i] = bt;
        g[i] = gi;
    }
}

__global__ void gates_bwd_kernel(bf16 *da, bf16 *db, const float *dg, const float *dbeta, const bf16 *a, const bf16 *b,
                                 size_t n, float hmax) {
    GRID_LOOP(i, n) {
        float av = ld(a, i), bt = 1.0f / (1.0f + expf(-ld(b, i))), dbt = dbeta[i];
        int bounded = hmax > 0 && log1pf(-bt / hmax) < log_sigmoid(av);
        st(da, i, bounded ? 0.0f : dg[i] / (1.0f + expf(av)));
        if (bounded) dbt += dg[i] * (-1 / hmax) / (1 - bt / hmax);
        st(db, i, dbt * bt * (1 - bt));
    }
}

int g_gates_fwd(const Backend *be, void *g, void *beta, const void *a, const void *b, size_t n, float hmax) {
    gates_fwd_kernel<<<grid_for(n, 256), 256, 0, cuda_ctx(be)->stream>>>((float *)g, (float *)beta, (const bf16 *)a,
                                                                         (const bf16 *)b, n, hmax);
    LAUNCH_CHECK();
    return MN_OK;
}

int g_gates_bwd(const Backend *be, void *da, void *db, const void *dg, const void *dbeta, const void *a,
                const void *b, size_t n, float hmax) {
    gates_bwd_kernel<<<grid_for(n, 256), 256, 0, cuda_ctx(be)->stream>>>(
        (bf16 *)da, (bf16 *)db, (const float *)dg, (const float *)dbeta, (const bf16 *)a, (const bf16 *)b, n, hmax);
    LAUNCH_CHECK();
    return MN_OK;
}

__global__ void softplus_fwd_kernel(float *y, const float *p, size_t n, float lo) {
    GRID_LOOP(i, n) y[i] = (p[i] > 30 ? p[i] : log1pf(expf(p[i]))) + lo;
}

__global__ void softplus_bwd_kernel(float *dp, const float *dy, const float *p, size_t n) {
    GRID_LOOP(i, n) dp[i] += dy[i] / (1.0f + expf(-p[i]));
}

int g_softplus_fwd(const Backend *be, void *y, const void *p, size_t n, float lo) {
    softplus_fwd_kernel<<<grid_for(n, 256), 256, 0, cuda_ctx(be)->stream>>>((float *)y, (const float *)p, n, lo);
    LAUNCH_CHECK();
    return MN_OK;
}

int g_softplus_bwd(const Backend *be, void *dp, const void *dy, const void *p, size_t n) {
    softplus_bwd_kernel<<<grid_for(n, 256), 256, 0, cuda_ctx(be)->stream>>>((float *)dp, (const float *)dy,
                                                                            (const float *)p, n);
    LAUNCH_CHECK();
    return MN_OK;
}

// ------------------------------------------------------------------------ the Gated DeltaNet paper's gate

__device__ __forceinline__ float softplus_(float z) { return z > 30 ? z : log1pf(expf(z)); }

__global__ void gdn_gate_fwd_kernel(float *g, const bf16 *a, const float *A_log, const float *dt, size_t n, int H) {
    GRID_LOOP(i, n) {
        int h = (int)(i % (size_t)H);
        g[i] = -expf(A_log[h]) * softplus_(ld(a, i) + dt[h]);
    }
}

// One block per head: the token terms, then the head's sums (in a fixed order: deterministic).
__global__ void gdn_gate_bwd_kernel(bf16 *da, float *dA, float *ddt, const float *dg, const bf16 *a, const float *A_log,
                                    const float *dt, int N, int H) {
    __shared__ float red[32];
    int h = blockIdx.x;
    float e = expf(A_log[h]), sa = 0, sd = 0;
    for (int n = threadIdx.x; n < N; n += blockDim.x) {
        size_t i = (size_t)n * H + h;
        float z = ld(a, i) + dt[h], d = dg[i], dz = -d * e / (1.0f + expf(-z));
        st(da, i, dz);
        sa += d * (-e * softplus_(z));
        sd += dz;
    }
    sa = block_sum(sa, red);
    sd = block_sum(sd, red);
    if (threadIdx.x == 0) {
        dA[h] += sa;
        ddt[h] += sd;
    }
}

int g_gdn_gate_fwd(const Backend *be, void *g, const void *a, const void *A_log, const void *dt_bias, int N,
                   int H) {
    size_t n = (size_t)N * H;
    gdn_gate_fwd_kernel<<<grid_for(n, 256), 256, 0, cuda_ctx(be)->stream>>>((float *)g, (const bf16 *)a,
                                                                            (const float *)A_log, (const float *)dt_bias, n, H);
    LAUNCH_CHECK();
    return MN_OK;
}

int g_gdn_gate_bwd(const Backend *be, void *da, void *dA_log, void *ddt_bias, const void *dg, const void *a,
                   const void *A_log, const void *dt_bias, int N, int H) {
    gdn_gate_bwd_kernel<<<(unsigned)H, 256, 0, cuda_ctx(be)->stream>>>((bf16 *)da, (float *)dA_log, (float *)ddt_bias,
                                                                       (const float *)dg, (const bf16 *)a,
                                                                       (const float *)A_log, (const float *)dt_bias, N, H);
    LAUNCH_CHECK();
    return MN_OK;
}

// ------------------------------------------------------------------------ Longhorn's implicit step

// One thread per (token, head): kappa = |k|^2 over the head's Dk keys (read twice in the backward
// rather than kept: Dk is small, and the keys are in cache).
__device__ __forceinline__ float sq_norm(const bf16 *k, size_t i, int Dk) {
    float s = 0;
    for (int j = 0; j < Dk; j++) {
        float x = ld(k, i * Dk + j);
        s = fmaf(x, x, s);
    }
    return s;
}

__global__ void longhorn_eps_fwd_kernel(float *eps, const float *beta, const bf16 *k, size_t n, int Dk) {
    GRID_LOOP(i, n) eps[i] = beta[i] / (1.0f + beta[i] * sq_norm(k, i, Dk));
}

__global__ void longhorn_eps_bwd_kernel(float *dbeta, bf16 *dk, const float *deps, const float *beta, const bf16 *k,
                                        size_t n, int Dk) {
    GRID_LOOP(i, n) {
        float den = 1.0f + beta[i] * sq_norm(k, i, Dk), e = beta[i] / den, d = deps[i], c = 2.0f * d * e * e;
        for (int j = 0; j < Dk; j++) st(dk, i * Dk + j, ld(dk, i * Dk + j) - c * ld(k, i * Dk + j));
        dbeta[i] = d / (den * den);
    }
}

int g_longhorn_eps_fwd(const Backend *be, void *eps, const void *beta, const void *k, int N, int H, int Dk) {
    size_t n = (size_t)N * H;
    longhorn_eps_fwd_kernel<<<grid_for(n, 256), 256, 0, cuda_ctx(be)->stream>>>((float *)eps, (const float *)beta,
                                                                                (const bf16 *)k, n, Dk);
    LAUNCH_CHECK();
    return MN_OK;
}

int g_longhorn_eps_bwd(const Backend *be, void *dbeta, void *dk, const void *deps, const void *beta, const void *k, int N,
                       int H, int Dk) {
    size_t n = (size_t)N * H;
    longhorn_eps_bwd_kernel<<<grid_for(n, 256), 256, 0, cuda_ctx(be)->stream>>>(
        (float *)dbeta, (bf16 *)dk, (const float *)deps, (const float *)beta, (const bf16 *)k, n, Dk);
    LAUNCH_CHECK();
    return MN_OK;
}
