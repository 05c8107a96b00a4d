// src/cuda/slstm_cuda.cu, kernels and host side, on the CPU (xlstm_emu.h: cuBLAS's products as
// loops) against a float64 reference written out below (the same loops as src/ref/slstm_ref.c),
// through cuda_slstm_fwd / cuda_slstm_bwd: built and run by scripts/cuda_emulate.sh slstm. x, dh
// rounded to bf16 and R to float32 before the reference sees them (the GPU's products take R and
// h_{t-1} in bf16: relative 2^-9 on each term of r). Outputs poisoned with NaN. EMU_ONLY=i runs
// shape i only.
#include "slstm_emu_kernels.h"
#include <stdio.h>

static int fails;
static double rnd(unsigned long long *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(*s >> 11) / 9007199254740992.0 * 2 - 1;
}
static double rel(const double *a, const double *b, size_t n) {
    double e = 0, r = 0;
    for (size_t i = 0; i < n; i++) { e += (a[i] - b[i]) * (a[i] - b[i]); r += b[i] * b[i]; }
    return r > 0 ? sqrt(e / r) : sqrt(e);
}
static double *dalloc(size_t n) { return (double *)calloc(n ? n : 1, 8); }
static bf16 *to_bf(double *x, size_t n) {
    bf16 *y = (bf16 *)aligned_alloc(16, (2 * n + 31) / 16 * 16);
    for (size_t i = 0; i < n; i++) { y[i].b = f32_to_bf16((float)x[i]); x[i] = bf16_to_f32(y[i].b); }
    return y;
}
static float *to_f(double *x, size_t n) { float *y = (float *)malloc(4 * n + 4); for (size_t i = 0; i < n; i++) { y[i] = (float)x[i]; x[i] = y[i]; } return y; }
static bf16 *nan_bf(size_t n) { bf16 *y = (bf16 *)aligned_alloc(16, (2 * n + 31) / 16 * 16); for (size_t i = 0; i < n; i++) y[i].b = 0x7fc0; return y; }
static float *nan_f(size_t n) { float *y = (float *)malloc(4 * n + 4); for (size_t i = 0; i < n; i++) y[i] = NAN; return y; }
static double relb(const bf16 *x, const double *r, size_t n) { double *a = dalloc(n); for (size_t i = 0; i < n; i++) a[i] = bf16_to_f32(x[i].b); double e = rel(a, r, n); free(a); return e; }
static double relf(const float *x, const double *r, size_t n) { double *a = dalloc(n); for (size_t i = 0; i < n; i++) a[i] = x[i]; double e = rel(a, r, n); free(a); return e; }
static void check(const char *tag, const char *what, double e, double tol) {
    int bad = !(e <= tol);
    fails += bad;
    printf("%-40s %-6s rel err %.2e%s\n", tag, what, e, bad ? "  FAIL" : "");
}
static double sig(double x) { return 1 / (1 + exp(-x)); }
static double lsig(double x) { return fmin(x, 0) - log1p(exp(-fabs(x))); }

static void preact(int H, int Dh, const double *x, const double *R, const double *hp, double *r) {
    int D = H * Dh;
    for (int h = 0; h < H; h++)
        for (int g = 0; g < 4; g++)
            for (int j = 0; j < Dh; j++) {
                double s = x[(size_t)g * D + h * Dh + j];
                for (int i = 0; i < Dh; i++) s += hp[h * Dh + i] * R[(((size_t)h * Dh + i) * 4 + g) * Dh + j];
                r[(size_t)g * D + h * Dh + j] = s;
            }
}

static void ref_fwd(int B, int T, int H, int Dh, const double *x, const double *R, const double *s0, double *hout,
                    double *cache, double *sT) {
    int D = H * Dh;
    double *st = dalloc(12 * (size_t)D), *nx = st + 4 * D, *r = nx + 4 * D;
    for (int b = 0; b < B; b++) {
        for (int i = 0; i < 4 * D; i++) st[i] = s0 ? s0[(size_t)b * 4 * D + i] : 0;
        for (int t = 0; t < T; t++) {
            size_t bt = (size_t)b * T + t;
            preact(H, Dh, x + bt * 4 * D, R, st, r);
            for (int k = 0; k < D; k++) {
                double lf = lsig(r[D + k]) + st[3 * D + k], m = st[2 * D + k] == 0 ? r[k] : fmax(lf, r[k]);
                double ip = fmin(1, exp(r[k] - m)), fp = fmin(1, exp(lf - m)), z = tanh(r[2 * D + k]), o = sig(r[3 * D + k]);
                double c = fp * st[D + k] + ip * z, n = fp * st[2 * D + k] + ip;
                nx[k] = o * c / n, nx[D + k] = c, nx[2 * D + k] = n, nx[3 * D + k] = m;
            }
            memcpy(st, nx, 8 * 4 * (size_t)D);
            memcpy(hout + bt * D, st, 8 * (size_t)D);
            memcpy(cache + bt * 4 * D, st, 8 * 4 * (size_t)D);
        }
        memcpy(sT + (size_t)b * 4 * D, st, 8 * 4 * (size_t)D);
    }
    free(st);
}

static void ref_bwd(int B, int T, int H, int Dh, double clip, const double *x, const double *R, const double *cache,
                    const double *dh, double *dx, double *dR) {
    int D = H * Dh;
    double *zero = dalloc(12 * (size_t)D), *r = zero + 4 * D, *dhr = r + 4 * D, *dc = dhr + D, *dn = dc + D;
    for (int b = 0; b < B; b++) {
        memset(dhr, 0, 8 * 3 * (size_t)D);
        for (int t = T - 1; t >= 0; t--) {
            size_t bt = (size_t)b * T + t;
            const double *sp = t > 0 ? cache + (bt - 1) * 4 * D : zero, *s = cache + bt * 4 * D;
            double *dg = dx + bt * 4 * D;
            preact(H, Dh, x + bt * 4 * D, R, sp, r);
            for (int k = 0; k < D; k++) {
                double m = s[3 * D + k], ip = fmin(1, exp(r[k] - m)), fp = fmin(1, exp(lsig(r[D + k]) + sp[3 * D + k] - m));
                double z = tanh(r[2 * D + k]), o = sig(r[3 * D + k]), h = s[k], n = s[2 * D + k], dy = dh[bt * D + k] + dhr[k];
                dc[k] += dy * o / n;
                dn[k] -= dy * h / n;
                dg[k] = ip * (z * dc[k] + dn[k]);
                dg[D + k] = fp * (dc[k] * sp[D + k] + dn[k] * sp[2 * D + k]) * sig(-r[D + k]);
                dg[2 * D + k] = dc[k] * ip * (1 - z * z);
                dg[3 * D + k] = (1 - o) * h * dy;
                dc[k] *= fp;
                dn[k] *= fp;
            }
            for (int hd = 0; hd < H; hd++)
                for (int i = 0; i < Dh; i++) {
                    double hpi = sp[hd * Dh + i], a = 0;
                    for (int g = 0; g < 4; g++)
                        for (int j = 0; j < Dh; j++) {
                            size_t ri = (((size_t)hd * Dh + i) * 4 + g) * Dh + j;
                            double dgj = dg[(size_t)g * D + hd * Dh + j];
                            dR[ri] += hpi * dgj;
                            a += R[ri] * dgj;
                        }
                    dhr[hd * Dh + i] = clip > 0 ? fmin(fmax(a, -clip), clip) : a;
                }
        }
    }
    free(zero);
}

static void run(int idx, int B, int T, int H, int Dh, int state, double clip, double rscale, size_t smem, unsigned long long seed) {
    emu_ctx.smem_optin = smem;
    const char *path = getenv("MESANET_SLSTM") ? "single " : "cluster";
    int D = H * Dh;
    size_t nx = (size_t)B * T * 4 * D, nh = (size_t)B * T * D, nr = (size_t)H * Dh * 4 * Dh, ns = (size_t)B * 4 * D;
    double *x = dalloc(nx), *R = dalloc(nr), *dh = dalloc(nh), *s0 = state ? dalloc(ns) : NULL;
    for (size_t i = 0; i < nx; i++) x[i] = 2 * rnd(&seed) + ((i / D) % 4 == 1 ? 2.0 : 0.0);  // forget gates mostly open
    for (size_t i = 0; i < nr; i++) R[i] = rscale * rnd(&seed) / sqrt((double)Dh);
    for (size_t i = 0; i < nh; i++) dh[i] = rnd(&seed);
    if (state)
        for (int b = 0; b < B; b++)
            for (int k = 0; k < D; k++) {
                double *s = s0 + (size_t)b * 4 * D;
                s[k] = 0.5 * rnd(&seed), s[D + k] = rnd(&seed), s[2 * D + k] = 1 + 0.5 * rnd(&seed), s[3 * D + k] = rnd(&seed);
            }
    bf16 *bx = to_bf(x, nx), *bdh = to_bf(dh, nh);
    float *fR = to_f(R, nr), *fs0 = state ? to_f(s0, ns) : NULL;
    double *h = dalloc(nh), *cache = dalloc(4 * nh), *sT = dalloc(ns);
    ref_fwd(B, T, H, Dh, x, R, s0, h, cache, sT);
    SlstmDims d = {B, T, H, Dh, (float)clip};
    bf16 *gh = nan_bf(nh);
    float *gc = nan_f(4 * nh), *gsT = nan_f(ns);
    SlstmFwd io = {bx, fR, fs0, gh, gc, gsT};
    if (cuda_slstm_fwd(NULL, &d, &io)) { printf("fwd failed: %s\n", mn_last_error()); exit(1); }
    char tag[128];
    snprintf(tag, sizeof tag, "%s %d B%d T%d H%d Dh%d%s clip %g smem %zuK", path, idx, B, T, H, Dh, state ? " s0" : "", clip, smem / 1024);
    check(tag, "h", relb(gh, h, nh), 2e-2);
    check(tag, "cache", relf(gc, cache, 4 * nh), 2e-2);
    check(tag, "sT", relf(gsT, sT, ns), 2e-2);
    if (!state) {  // the backward from the GPU's cache (a zero initial state)
        double *gcache = dalloc(4 * nh), *dx = dalloc(nx), *dR = dalloc(nr);
        for (size_t i = 0; i < 4 * nh; i++) gcache[i] = gc[i];
        ref_bwd(B, T, H, Dh, clip, x, R, gcache, dh, dx, dR);
        bf16 *gdx = nan_bf(nx);
        float *gdR = (float *)calloc(nr, 4);
        SlstmBwd bw = {bx, fR, gc, bdh, gdx, gdR};
        if (cuda_slstm_bwd(NULL, &d, &bw)) { printf("bwd failed: %s\n", mn_last_error()); exit(1); }
        check(tag, "dx", relb(gdx, dx, nx), 2e-2);
        check(tag, "dR", relf(gdR, dR, nr), 2e-2);
        free(gcache); free(dx); free(dR); free(gdx); free(gdR);
    }
    free(x); free(R); free(dh); free(s0); free(bx); free(bdh); free(fR); free(fs0); free(h); free(cache); free(sT);
    free(gh); free(gc); free(gsT);
}

int main(void) {
    struct { int B, T, H, Dh, state; double clip, rscale; size_t smem; } shapes[] = {
        {3, 7, 2, 5, 0, 0, 1, 227 << 10},     // Dh 5: one tile of cells, padded
        {9, 12, 1, 17, 0, 0.5, 2, 227 << 10}, // two batch slices, the recurrent gradient clipped
        {2, 6, 1, 64, 1, 0, 1, 227 << 10},    // an initial state
        {2, 6, 1, 64, 0, 0, 1, 227 << 10},
        {1, 4, 1, 192, 0, 0, 1, 227 << 10},   // fragments in registers and shared memory
        {1, 3, 2, 200, 0, 0, 1, 64 << 10},    // most fragments from global memory (single-block kernels)
        {3, 5, 1, 100, 0, 0, 1, 227 << 10},   // a cluster of 2
    };
    const char *only = getenv("EMU_ONLY");
    for (int pass = 0; pass < 2; pass++) {  // the cluster kernels (Hopper), then the single-block ones
        if (pass) setenv("MESANET_SLSTM", "single", 1);
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            if (only && (size_t)atoi(only) != i) continue;
            const auto &s = shapes[i];
            run((int)i, s.B, s.T, s.H, s.Dh, s.state, s.clip, s.rscale, s.smem, 2000 + 11 * i);
        }
    }
    printf("%d fails\n", fails);
    return fails != 0;
}
