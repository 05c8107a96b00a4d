// src/cuda/lin_cuda.cu's kernels on the CPU (emu.h) against the float64 reference, launched with the
// shapes cuda_lin_fwd / cuda_lin_bwd give them (the host side is mirrored below): built and run by
// scripts/cuda_emulate.sh lin. The shared memory is filled with garbage and dq, dk with NaN first,
// so that a missing zeroing or an element never written shows. Tolerances as
// tests/cuda/test_cuda_lin.c's.
#include "emu.h"
thread_local dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
pthread_barrier_t emu_block_bar, emu_warp_bar[32];
float emu_xch[32][32];
pthread_mutex_t emu_atomic = PTHREAD_MUTEX_INITIALIZER;
float sh_1[1 << 15], sh_2[1 << 15], sh_4[1 << 15], sh_8[1 << 15];
#include "lin_emu_kernels.h"
#include <stdio.h>

template <typename A> struct Job { void (*k)(const A); A a; unsigned tid; dim3 blk; };
template <typename A> static void *run_thread(void *p) {
    Job<A> *j = (Job<A> *)p;
    threadIdx = dim3(j->tid);
    blockIdx = j->blk;
    j->k(j->a);
    return NULL;
}
template <typename A> static void launch(void (*k)(const A), dim3 grid, unsigned threads, A a) {
    gridDim = grid;
    blockDim = dim3(threads);
    for (unsigned by = 0; by < grid.y; by++)
        for (unsigned bx = 0; bx < grid.x; bx++) {
            memset(sh_1, 0x7f, sizeof sh_1); memset(sh_2, 0x7f, sizeof sh_2); memset(sh_4, 0x7f, sizeof sh_4); memset(sh_8, 0x7f, sizeof sh_8);
            pthread_barrier_init(&emu_block_bar, NULL, threads);
            for (unsigned w = 0; w < threads / 32; w++) pthread_barrier_init(&emu_warp_bar[w], NULL, 32);
            Job<A> *jobs = new Job<A>[threads];
            pthread_t *th = new pthread_t[threads];
            for (unsigned t = 0; t < threads; t++) {
                jobs[t] = Job<A>{k, a, t, dim3(bx, by)};
                pthread_create(&th[t], NULL, run_thread<A>, &jobs[t]);
            }
            for (unsigned t = 0; t < threads; t++) pthread_join(th[t], NULL);
            delete[] jobs; delete[] th;
            pthread_barrier_destroy(&emu_block_bar);
            for (unsigned w = 0; w < threads / 32; w++) pthread_barrier_destroy(&emu_warp_bar[w]);
        }
}
static int cols_per_lane(int Dk) { return Dk <= 32 ? 1 : Dk <= 64 ? 2 : Dk <= 128 ? 4 : 8; }
static int stretch_for(int T) { int C = 1; while ((long)C * C < T) C++; return C; }

static double rnd(unsigned long long *s) { *s = *s * 6364136223846793005ULL + 1442695040888963407ULL; return ((*s >> 11) * (1.0 / 9007199254740992.0)) * 2 - 1; }
static bf16 *to_bf(const double *x, size_t n) { bf16 *y = (bf16 *)calloc(n + 1, 2); for (size_t i = 0; i < n; i++) y[i].b = f32_to_bf16((float)x[i]); return y; }
static float *to_f(const double *x, size_t n) { if (!x) return NULL; float *y = (float *)calloc(n + 1, 4); for (size_t i = 0; i < n; i++) y[i] = (float)x[i]; return y; }
static double relb(const bf16 *a, const double *b, size_t n) { double num = 0, den = 0; for (size_t i = 0; i < n; i++) { double d = bf16_to_f32(a[i].b) - b[i]; if (!isfinite(d)) return INFINITY; num += d * d; den += b[i] * b[i]; } return sqrt(num) / fmax(sqrt(den), 1e-300); }
static double relf(const float *a, const double *b, size_t n) { double num = 0, den = 0; for (size_t i = 0; i < n; i++) { double d = a[i] - b[i]; if (!isfinite(d)) return INFINITY; num += d * d; den += b[i] * b[i]; } return sqrt(num) / fmax(sqrt(den), 1e-300); }

int fails = 0;
static void check(const char *tag, const char *what, double e, double tol) {
    if (!(e <= tol)) { printf("FAIL %s %s: %.3g\n", tag, what, e); fails++; }
    else printf("  %s %-6s %.2e\n", tag, what, e);
}

static void run(int B, int T, int H, int Dk, int Dv, int rule, int wg, int wb, int ws0, int wdsT, unsigned long long seed) {
    size_t ntok = (size_t)B * T * H, nq = ntok * Dk, nv = ntok * Dv, ns = (size_t)B * H * Dv * Dk;
    double *q = (double *)calloc(nq, 8), *k = (double *)calloc(nq, 8), *v = (double *)calloc(nv, 8), *dout = (double *)calloc(nv, 8);
    double *g = wg ? (double *)calloc(ntok, 8) : NULL, *beta = wb ? (double *)calloc(ntok, 8) : NULL;
    double *s0 = ws0 ? (double *)calloc(ns, 8) : NULL, *dsT = wdsT ? (double *)calloc(ns, 8) : NULL;
    for (size_t i = 0; i < nq; i++) { q[i] = rnd(&seed); k[i] = rnd(&seed); }
    for (size_t t = 0; t < ntok; t++) { double a = 0, b = 0; for (int j = 0; j < Dk; j++) { a += q[t*Dk+j]*q[t*Dk+j]; b += k[t*Dk+j]*k[t*Dk+j]; } for (int j = 0; j < Dk; j++) { q[t*Dk+j] /= sqrt(a); k[t*Dk+j] /= sqrt(b); } }
    for (size_t i = 0; i < nv; i++) { v[i] = rnd(&seed); dout[i] = rnd(&seed); }
    for (size_t i = 0; i < ntok; i++) { if (g) g[i] = -0.255 + 0.245 * rnd(&seed); if (beta) beta[i] = 0.55 + 0.45 * rnd(&seed); }
    for (size_t i = 0; i < ns; i++) { if (s0) s0[i] = 0.5 * rnd(&seed); if (dsT) dsT[i] = rnd(&seed); }
    bf16 *bq = to_bf(q, nq), *bk = to_bf(k, nq), *bv = to_bf(v, nv), *bdo = to_bf(dout, nv);
    for (size_t i = 0; i < nq; i++) { q[i] = bf16_to_f32(bq[i].b); k[i] = bf16_to_f32(bk[i].b); }
    for (size_t i = 0; i < nv; i++) { v[i] = bf16_to_f32(bv[i].b); dout[i] = bf16_to_f32(bdo[i].b); }
    float *fg = to_f(g, ntok), *fb = to_f(beta, ntok), *fs0 = to_f(s0, ns), *fdsT = to_f(dsT, ns);
    if (g) for (size_t i = 0; i < ntok; i++) g[i] = fg[i];
    if (beta) for (size_t i = 0; i < ntok; i++) beta[i] = fb[i];
    if (s0) for (size_t i = 0; i < ns; i++) s0[i] = fs0[i];
    if (dsT) for (size_t i = 0; i < ns; i++) dsT[i] = fdsT[i];
    MnSeqDims d = {B, T, H, Dk, Dv};
    MnLinOpts o = {(MnLinRule)rule, (float)(1 / sqrt((double)Dk)), MN_FORM_RECURRENT, 0};
    double *o_ = (double *)calloc(nv, 8), *sT = (double *)calloc(ns, 8), *dq = (double *)calloc(nq, 8), *dk = (double *)calloc(nq, 8), *dv = (double *)calloc(nv, 8);
    double *dg = (double *)calloc(ntok, 8), *db = (double *)calloc(ntok, 8), *ds0 = (double *)calloc(ns, 8);
    LinFwd64 rf = {q, k, v, g, beta, s0, o_, sT};
    LinBwd64 rb = {q, k, v, g, beta, s0, dout, dsT, dq, dk, dv, dg, db, ds0};
    if (ref_lin_forward(&d, &o, &rf) || ref_lin_backward(&d, &o, &rb)) { printf("ref failed\n"); exit(1); }
    // forward, as cuda_lin_fwd launches it
    bf16 *go = (bf16 *)calloc(nv, 2); float *gsT = (float *)calloc(ns, 4);
    FwdArgs fa = {bq, bk, bv, fg, fb, fs0, go, gsT, T, H, Dk, Dv, rule == MN_LIN_DELTA, o.scale};
    dim3 grid((unsigned)(B * H), (unsigned)((Dv + FWD_WARPS * RW - 1) / (FWD_WARPS * RW)));
    switch (cols_per_lane(Dk)) {
    case 1: launch(lin_fwd_kernel_1, grid, FWD_WARPS * 32, fa); break;
    case 2: launch(lin_fwd_kernel_2, grid, FWD_WARPS * 32, fa); break;
    case 4: launch(lin_fwd_kernel_4, grid, FWD_WARPS * 32, fa); break;
    default: launch(lin_fwd_kernel_8, grid, FWD_WARPS * 32, fa); break;
    }
    // backward, as cuda_lin_bwd
    int nc = cols_per_lane(Dk), nw = mn_min(BWD_WARPS, (Dv + RW - 1) / RW), threads = nw * 32;
    int nslices = (Dv + nw * RW - 1) / (nw * RW), C = stretch_for(T), nseg = (T + C - 1) / C;
    size_t per = bwd_ws_per_block(nseg, C, threads, nc), nws = per * B * H * nslices, ntmp = nslices > 1 ? 2 * nq : 0;
    float *ws = (float *)malloc(4 * (nws + ntmp + 1));
    for (size_t i = 0; i < nws; i++) ws[i] = NAN;
    float *dqf = ntmp ? ws + nws : NULL, *dkf = ntmp ? dqf + nq : NULL;
    if (ntmp) memset(dqf, 0, 4 * ntmp);
    bf16 *gdq = (bf16 *)calloc(nq, 2), *gdk = (bf16 *)calloc(nq, 2), *gdv = (bf16 *)calloc(nv, 2);
    for (size_t i = 0; i < nq; i++) gdq[i].b = gdk[i].b = 0x7fc0;  // NaN: every element must be written
    float *gdg = (float *)calloc(ntok, 4), *gdb = (float *)calloc(ntok, 4), *gds0 = (float *)calloc(ns, 4);
    BwdArgs ba = {bq, bk, bv, bdo, fg, fb, fs0, fdsT, gdq, gdk, gdv, dqf, dkf, fg ? gdg : NULL, fb ? gdb : NULL, gds0, ws,
                  T, H, Dk, Dv, rule == MN_LIN_DELTA, C, nseg, o.scale};
    dim3 bgrid((unsigned)(B * H), (unsigned)nslices);
    switch (nc) {
    case 1: launch(lin_bwd_kernel_1, bgrid, threads, ba); break;
    case 2: launch(lin_bwd_kernel_2, bgrid, threads, ba); break;
    case 4: launch(lin_bwd_kernel_4, bgrid, threads, ba); break;
    default: launch(lin_bwd_kernel_8, bgrid, threads, ba); break;
    }
    if (ntmp) for (size_t i = 0; i < nq; i++) { gdq[i].b = f32_to_bf16(dqf[i]); gdk[i].b = f32_to_bf16(dkf[i]); }
    char tag[128];
    snprintf(tag, sizeof tag, "%s B%d T%d H%d Dk%d Dv%d g%d b%d s0%d dsT%d (nslices %d, C %d)", rule ? "delta" : "gla", B, T, H, Dk, Dv, wg, wb, ws0, wdsT, nslices, C);
    check(tag, "o", relb(go, o_, nv), 8e-3);
    check(tag, "sT", relf(gsT, sT, ns), 5e-4);
    check(tag, "dq", relb(gdq, dq, nq), 8e-3);
    check(tag, "dk", relb(gdk, dk, nq), 8e-3);
    check(tag, "dv", relb(gdv, dv, nv), 8e-3);
    check(tag, "dg", relf(gdg, dg, ntok), 5e-4);
    check(tag, "dbeta", relf(gdb, db, ntok), 5e-4);
    check(tag, "ds0", relf(gds0, ds0, ns), 5e-4);
}

int main(int argc, char **argv) {
    int shapes[][9] = {
        {1, 37, 3, 24, 40, 1, 1, 1, 1}, {2, 20, 1, 33, 7, 1, 1, 0, 0}, {1, 12, 1, 256, 20, 0, 1, 0, 1},
        {1, 9, 2, 64, 70, 1, 0, 1, 1}, {3, 1, 1, 64, 64, 1, 1, 1, 1}, {1, 30, 1, 100, 36, 0, 0, 1, 0},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int rule = 0; rule < 2; rule++) {
            int *s = shapes[i];
            run(s[0], s[1], s[2], s[3], s[4], rule, s[5], s[6], s[7], s[8], 1000 + i * 7 + rule);
        }
    printf("%d fails\n", fails);
    return fails != 0;
}
