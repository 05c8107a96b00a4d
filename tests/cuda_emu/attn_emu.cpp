// src/cuda/attn_cuda.cu's kernels on the CPU (emu.h, mma_emu.h: ldmatrix and mma.sync with the PTX
// fragment layouts) against the float64 reference src/ref/attn_ref.c, launched as cuda_attn_fwd,
// cuda_attn_bwd, cuda_attn_decode and cuda_rope launch them (the host side is mirrored below):
// built and run by scripts/cuda_emulate.sh attn. Shared memory is filled with NaN before every
// block and the outputs with NaN, so that a read of an element never loaded, or an output never
// written, shows. Inputs are rounded to bf16 before the reference sees them. Tolerances as
// tests/cuda/test_cuda_attn.c's (the reasons there).
#include "emu.h"
thread_local dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
pthread_barrier_t emu_block_bar, emu_warp_bar[32];
float emu_xch[32][32];
pthread_mutex_t emu_atomic = PTHREAD_MUTEX_INITIALIZER;
uint32_t emu_mx[32][32][6];
const void *emu_px[32][32];
#define SMEM_ELEMS 60000
#include "attn_emu_kernels.h"
alignas(16) bf16 attn_smem[SMEM_ELEMS];

template <typename A> struct Job { void (*k)(const A); A a; unsigned tid; dim3 blk; };
template <typename A> static void *run_thread(void *p) {
    Job<A> *j = (Job<A> *)p;
    threadIdx = dim3(j->tid);
    blockIdx = j->blk;
    j->k(j->a);
    return NULL;
}
template <typename A> static void launch(void (*k)(const A), dim3 grid, unsigned threads, size_t smem, A a) {
    if (smem > sizeof attn_smem) { printf("smem %zu > %zu\n", smem, sizeof attn_smem); exit(1); }
    gridDim = grid;
    blockDim = dim3(threads);
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                for (size_t i = 0; i < SMEM_ELEMS; i++) attn_smem[i].b = 0x7fc0;  // NaN
                pthread_barrier_init(&emu_block_bar, NULL, threads);
                for (unsigned w = 0; w < threads / 32; w++) pthread_barrier_init(&emu_warp_bar[w], NULL, 32);
                Job<A> *jobs = new Job<A>[threads];
                pthread_t *th = new pthread_t[threads];
                for (unsigned t = 0; t < threads; t++) {
                    jobs[t] = Job<A>{k, a, t, dim3(bx, by, bz)};
                    pthread_create(&th[t], NULL, run_thread<A>, &jobs[t]);
                }
                for (unsigned t = 0; t < threads; t++) pthread_join(th[t], NULL);
                delete[] jobs; delete[] th;
                pthread_barrier_destroy(&emu_block_bar);
                for (unsigned w = 0; w < threads / 32; w++) pthread_barrier_destroy(&emu_warp_bar[w]);
            }
}

static double rnd(unsigned long long *s) { *s = *s * 6364136223846793005ULL + 1442695040888963407ULL; return ((*s >> 11) * (1.0 / 9007199254740992.0)) * 2 - 1; }
// x (random in [-a, a]) rounded to bf16: the bf16 copy, and x replaced by its value
static bf16 *to_bf(double *x, size_t n, double a, unsigned long long *seed) {
    bf16 *y = (bf16 *)aligned_alloc(16, (2 * n + 31) / 16 * 16);
    for (size_t i = 0; i < n; i++) { y[i].b = f32_to_bf16((float)(a * rnd(seed))); x[i] = bf16_to_f32(y[i].b); }
    return y;
}
static bf16 *nan_bf(size_t n) { bf16 *y = (bf16 *)aligned_alloc(16, (2 * n + 31) / 16 * 16); for (size_t i = 0; i < n; i++) y[i].b = 0x7fc0; return y; }
// relative L2 error; the reference's norm floored at an RMS of 1e-3, so that a gradient that is 0 in
// exact arithmetic (window 1: dS = P (dP - Delta) = 0) is held to an absolute RMS error of 1e-5
static double relb(const bf16 *a, const double *b, size_t n) { double num = 0, den = 0; for (size_t i = 0; i < n; i++) { double d = bf16_to_f32(a[i].b) - b[i]; if (!isfinite(d)) return INFINITY; num += d * d; den += b[i] * b[i]; } return sqrt(num) / fmax(sqrt(den), 1e-3 * sqrt((double)n)); }
static double absf(const float *a, const double *b, size_t n) { double m = 0; for (size_t i = 0; i < n; i++) { double d = fabs(a[i] - b[i]); if (!isfinite(d)) return INFINITY; if (d > m) m = d; } return m; }

int fails = 0;
static void check(const char *tag, const char *what, double e, double tol) {
    if (!(e <= tol)) { printf("FAIL %s %s: %.3g (tol %.1e)\n", tag, what, e, tol); fails++; }
    else printf("  %s %-6s %.2e\n", tag, what, e);
}

static int dpad(int D) { return D <= 64 ? 64 : 128; }

static void run_attn(int B, int T, int H, int Hkv, int D, int W, double mult, unsigned long long seed) {
    size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * Hkv * D, rows = (size_t)B * T * H;
    double *q = (double *)calloc(nq, 8), *k = (double *)calloc(nk, 8), *v = (double *)calloc(nk, 8), *dout = (double *)calloc(nq, 8);
    bf16 *bq = to_bf(q, nq, 1, &seed), *bk = to_bf(k, nk, 1, &seed), *bv = to_bf(v, nk, 1, &seed), *bdo = to_bf(dout, nq, 1, &seed);
    AttnDims d = {B, T, H, Hkv, D, W, (float)(mult / sqrt((double)D))};
    double *o = (double *)calloc(nq, 8), *lse = (double *)calloc(rows, 8), *dq = (double *)calloc(nq, 8), *dk = (double *)calloc(nk, 8), *dv = (double *)calloc(nk, 8);
    AttnFwd rf = {q, k, v, o, lse};
    if (ref_attn_fwd(NULL, &d, &rf)) { printf("ref failed\n"); exit(1); }
    // the reference backward from the GPU's o (rounded to bf16), as the model would feed it
    bf16 *go = nan_bf(nq);
    float *glse = (float *)calloc(rows, 4);
    for (size_t i = 0; i < rows; i++) glse[i] = NAN;
    int DP = dpad(D);
    FwdArgs fa = {bq, bk, bv, go, glse, T, H, Hkv, D, W, d.scale * LOG2E};
    launch(DP == 64 ? attn_fwd_kernel_64 : attn_fwd_kernel_128, dim3((T + ATTN_BQ - 1) / ATTN_BQ, H, B), FWD_WARPS * 32,
           (size_t)(ATTN_BQ + 4 * ATTN_BK) * (DP + 8) * 2, fa);
    char tag[128];
    snprintf(tag, sizeof tag, "B%d T%d H%d Hkv%d D%d W%d x%g", B, T, H, Hkv, D, W, mult);
    check(tag, "o", relb(go, o, nq), 1e-2);
    check(tag, "lse", absf(glse, lse, rows), 2e-3 * mult);
    double *o2 = (double *)calloc(nq, 8);
    for (size_t i = 0; i < nq; i++) o2[i] = bf16_to_f32(go[i].b);
    AttnBwd rb = {q, k, v, o2, NULL, dout, dq, dk, dv};
    if (ref_attn_bwd(NULL, &d, &rb)) { printf("ref bwd failed\n"); exit(1); }
    float *delta = (float *)calloc(rows, 4), *dqacc = (float *)aligned_alloc(16, (nq * 4 + 15) / 16 * 16);
    memset(dqacc, 0, nq * 4);
    DeltaArgs da = {go, bdo, delta, (int)rows, D};
    launch(attn_delta_kernel, dim3((unsigned)((rows + 7) / 8)), 256, 0, da);
    bf16 *gdq = nan_bf(nq), *gdk = nan_bf(nk), *gdv = nan_bf(nk);
    BwdArgs ba = {bq, bk, bv, bdo, glse, delta, gdq, gdk, gdv, dqacc, T, H, Hkv, D, W, d.scale, d.scale * LOG2E};
    launch(DP == 64 ? attn_dkdv_kernel_64 : attn_dkdv_kernel_128, dim3((T + ATTN_BKB - 1) / ATTN_BKB, Hkv, B), 128,
           (size_t)(2 * ATTN_BKB + 4 * ATTN_BQB) * (DP + 8) * 2 + 4 * ATTN_BQB * 4 + (size_t)ATTN_BKB * DS_LD * 2, ba);
    DqArgs qa = {dqacc, gdq, nq, d.scale};
    launch(attn_dq_convert_kernel, dim3(3), 256, 0, qa);  // few blocks: the grid-stride loop exercised
    check(tag, "dq", relb(gdq, dq, nq), 1.5e-2);
    check(tag, "dk", relb(gdk, dk, nk), 1.5e-2);
    check(tag, "dv", relb(gdv, dv, nk), 1.5e-2);
    free(q); free(k); free(v); free(dout); free(o); free(o2); free(lse); free(dq); free(dk); free(dv);
    free(bq); free(bk); free(bv); free(bdo); free(go); free(glse); free(delta); free(gdq); free(gdk); free(gdv); free(dqacc);
}

static void run_decode(int B, int H, int Hkv, int D, int n, int cap, int sms, unsigned long long seed) {
    size_t nq = (size_t)B * H * D, nc = (size_t)B * cap * Hkv * D;
    double *q = (double *)calloc(nq, 8), *kc = (double *)calloc(nc, 8), *vc = (double *)calloc(nc, 8), *o = (double *)calloc(nq, 8);
    bf16 *bq = to_bf(q, nq, 1, &seed), *bk = to_bf(kc, nc, 1, &seed), *bv = to_bf(vc, nc, 1, &seed), *go = nan_bf(nq);
    AttnDims d = {B, 1, H, Hkv, D, 0, (float)(2 / sqrt((double)D))};
    if (ref_attn_decode(NULL, &d, n, cap, q, kc, vc, o)) { printf("ref decode failed\n"); exit(1); }
    // as cuda_attn_decode, with a GPU of `sms` multiprocessors
    long pairs = (long)B * H, want = (4L * sms + pairs - 1) / pairs;
    int chunk = (int)((n + want - 1) / want);
    if (chunk < 64) chunk = 64;
    int nsplit = (n + chunk - 1) / chunk;
    float *part = (float *)calloc((size_t)pairs * nsplit * (D + 2), 4);
    DecArgs a = {bq, bk, bv, go, part, H, Hkv, D, n, cap, chunk, nsplit, d.scale * LOG2E};
    launch(attn_dec_split_kernel, dim3(nsplit, H, B), DEC_WARPS * 32, 0, a);
    launch(attn_dec_combine_kernel, dim3(H, B), 128, 0, a);
    char tag[128];
    snprintf(tag, sizeof tag, "decode B%d H%d Hkv%d D%d n%d cap%d (%d chunks)", B, H, Hkv, D, n, cap, nsplit);
    check(tag, "o", relb(go, o, nq), 8e-3);
    free(q); free(kc); free(vc); free(o); free(bq); free(bk); free(bv); free(go); free(part);
}

static void run_rope(int N, int H, int D, int rot, int inverse, unsigned long long seed) {
    size_t n = (size_t)N * H * D;
    double *x = (double *)calloc(n, 8);
    bf16 *bx = to_bf(x, n, 1, &seed);
    int32_t *pos = (int32_t *)calloc(N, 4);
    for (int i = 0; i < N; i++) pos[i] = i * 37 + (int)(50000 * (1 + rnd(&seed)));
    if (ref_rope(NULL, x, pos, N, H, D, rot, 10000.0f, inverse)) { printf("ref rope failed\n"); exit(1); }
    RopeArgs a = {bx, pos, N, H, D, rot, inverse, log(10000.0)};
    launch(attn_rope_kernel, dim3((unsigned)((N * (rot / 2) + 255) / 256)), 256, 0, a);
    char tag[128];
    snprintf(tag, sizeof tag, "rope N%d H%d D%d rot %d inverse %d", N, H, D, rot, inverse);
    check(tag, "x", relb(bx, x, n), 6e-3);
    free(x); free(bx); free(pos);
}

int main(int argc, char **argv) {
    // B, T, H, Hkv, D, window, logit multiplier
    double shapes[][7] = {
        {1, 37, 2, 1, 64, 0, 1},    // T < the tile, GQA
        {2, 130, 2, 2, 40, 0, 1},   // T past a 128-row tile, D padded to 64
        {1, 1, 2, 2, 64, 0, 1},     // T = 1
        {1, 100, 4, 2, 64, 1, 1},   // window 1, GQA
        {1, 150, 2, 1, 128, 50, 1}, // window < T, D = 128
        {1, 20, 2, 2, 96, 64, 1},   // window > T, D = 96 padded to 128
        {1, 200, 1, 1, 64, 0, 8},   // large logits
        {1, 300, 2, 1, 64, 20, 4},  // a window narrower than a tile: key tiles skipped, warps skipping tiles
        {2, 257, 4, 1, 40, 64, 1},  // the window a key tile, GQA 4:1, B = 2
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        double *s = shapes[i];
        run_attn((int)s[0], (int)s[1], (int)s[2], (int)s[3], (int)s[4], (int)s[5], s[6], 100 + i);
    }
    run_decode(2, 4, 2, 64, 150, 160, 132, 7);
    run_decode(1, 2, 1, 128, 1, 4, 132, 8);
    run_decode(1, 2, 2, 40, 300, 300, 1, 9);
    run_decode(1, 1, 1, 96, 700, 1024, 132, 10);
    run_rope(5, 3, 40, 40, 0, 11);
    run_rope(7, 2, 128, 128, 1, 12);
    run_rope(6, 3, 40, 20, 0, 13);   // partial rotary: the first half of each head (RecurrentGemma's)
    run_rope(5, 2, 128, 64, 1, 14);
    printf("%d fails\n", fails);
    return fails != 0;
}
