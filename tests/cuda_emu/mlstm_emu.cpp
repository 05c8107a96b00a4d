// src/cuda/mlstm_cuda.cu (with mlstm_chunk.cuh), kernels and host side, on the CPU (xlstm_emu.h)
// against a float64 reference written out below (the recurrent forward; the parallel form's
// backward, xlstm-notes.md 2.4), through the entry points cuda_mlstm_fwd / cuda_mlstm_bwd: built and
// run by scripts/cuda_emulate.sh mlstm. Inputs rounded to bf16 (q, k, v, dh) and float32 (gates)
// before the reference sees them; outputs poisoned with NaN. Prints relative L2 errors; bf16 outputs
// within 2e-2, float32 ones (nq, m, states, dfg, dig) within 2e-2 (the products' bf16 operands:
// scores, P, the state's bf16 copy, each 2^-9 relative). EMU_ONLY=i runs shape i only.
#include "mlstm_emu_kernels.h"
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
static float *to_f(double *x, size_t n) {
    float *y = (float *)malloc(4 * n + 4);
    for (size_t i = 0; i < n; i++) { y[i] = (float)x[i]; x[i] = y[i]; }
    return y;
}
static bf16 *nan_bf(size_t n) { bf16 *y = (bf16 *)aligned_alloc(16, (2 * n + 31) / 16 * 16); for (size_t i = 0; i < n; i++) y[i].b = 0x7fc0; return y; }
static float *nan_f(size_t n) { float *y = (float *)malloc(4 * n + 4); for (size_t i = 0; i < n; i++) y[i] = NAN; return y; }
static double relb(const bf16 *x, const double *r, size_t n) { double *a = dalloc(n); for (size_t i = 0; i < n; i++) a[i] = bf16_to_f32(x[i].b); double e = rel(a, r, n); free(a); return e; }
static double relf(const float *x, const double *r, size_t n) { double *a = dalloc(n); for (size_t i = 0; i < n; i++) a[i] = x[i]; double e = rel(a, r, n); free(a); return e; }
static void check(const char *tag, const char *what, double e, double tol) {
    int bad = !(e <= tol);
    fails += bad;
    printf("%-44s %-5s rel err %.2e%s\n", tag, what, e, bad ? "  FAIL" : "");
}
static double dot(const double *a, const double *b, int n) { double s = 0; for (int i = 0; i < n; i++) s += a[i] * b[i]; return s; }

// The recurrent forward per pair (from c0, n0, m0 or zero).
static void ref_fwd(int B, int T, int H, int Dk, int Dv, double s, double eps, const double *q, const double *k,
                    const double *v, const double *fg, const double *ig, const double *c0, const double *n0,
                    const double *m0, double *h, double *nq, double *mo, double *cT, double *nT, double *mT) {
    size_t ss = (size_t)Dv * Dk;
    double *c = dalloc(ss + Dk), *n = c + ss;
    for (int p = 0; p < B * H; p++) {
        size_t tok0 = (size_t)(p / H) * T * H + p % H;
        double m = m0 ? m0[p] : 0;
        for (size_t i = 0; i < ss; i++) c[i] = c0 ? c0[p * ss + i] : 0;
        for (int j = 0; j < Dk; j++) n[j] = n0 ? n0[(size_t)p * Dk + j] : 0;
        for (int t = 0; t < T; t++) {
            size_t ti = tok0 + (size_t)t * H;
            double f = fg[ti], i = ig[ti], mt = fmax(f + m, i), a = exp(f + m - mt), b = exp(i - mt);
            m = mt;
            for (int r = 0; r < Dv; r++)
                for (int j = 0; j < Dk; j++) c[(size_t)r * Dk + j] = a * c[(size_t)r * Dk + j] + b * v[ti * Dv + r] * k[ti * Dk + j];
            for (int j = 0; j < Dk; j++) n[j] = a * n[j] + b * k[ti * Dk + j];
            double x = s * dot(n, q + ti * Dk, Dk), den = fmax(fabs(x), exp(-m)) + eps;
            for (int r = 0; r < Dv; r++) h[ti * Dv + r] = s * dot(c + (size_t)r * Dk, q + ti * Dk, Dk) / den;
            nq[ti] = x;
            mo[ti] = m;
        }
        if (cT) { memcpy(cT + p * ss, c, 8 * ss); memcpy(nT + (size_t)p * Dk, n, 8 * Dk); mT[p] = m; }
    }
    free(c);
}

// The parallel form's backward from a zero state (its own forward again), m held constant.
static void ref_bwd(int B, int T, int H, int Dk, int Dv, double s, double eps, const double *q, const double *k,
                    const double *v, const double *fg, const double *ig, const double *dh, double *dq, double *dk,
                    double *dv, double *dfg, double *dig) {
    double *cs = dalloc(T), *m = dalloc(T), *E = dalloc((size_t)T * T), *QK = dalloc((size_t)T * T), *den = dalloc(T);
    double *dnq = dalloc(T), *h = dalloc(Dv), *P = dalloc((size_t)T * T), *dcs = dalloc(T);
    for (int p = 0; p < B * H; p++) {
        size_t tok0 = (size_t)(p / H) * T * H + p % H;
#define TK(t) (tok0 + (size_t)(t) * H)
        double acc = 0;
        for (int t = 0; t < T; t++) cs[t] = acc += fg[TK(t)];
        for (int t = 0; t < T; t++) {
            double mt = cs[t];
            for (int j = 0; j <= t; j++) mt = fmax(mt, cs[t] - cs[j] + ig[TK(j)]);
            m[t] = mt;
            for (int j = 0; j <= t; j++) { E[(size_t)t * T + j] = exp(cs[t] - cs[j] + ig[TK(j)] - mt); QK[(size_t)t * T + j] = dot(q + TK(t) * Dk, k + TK(j) * Dk, Dk); }
        }
        for (int t = 0; t < T; t++) {
            double nq = 0;
            for (int r = 0; r < Dv; r++) h[r] = 0;
            for (int j = 0; j <= t; j++) {
                double x = s * E[(size_t)t * T + j] * QK[(size_t)t * T + j];
                nq += x;
                for (int r = 0; r < Dv; r++) h[r] += x * v[TK(j) * Dv + r];
            }
            den[t] = fmax(fabs(nq), exp(-m[t])) + eps;
            double hd = 0;
            for (int r = 0; r < Dv; r++) hd += h[r] / den[t] * dh[TK(t) * Dv + r];
            dnq[t] = fabs(nq) > exp(-m[t]) ? -hd / den[t] * (nq > 0 ? 1 : -1) : 0;
        }
        for (int t = 0; t < T; t++)
            for (int j = 0; j <= t; j++)
                P[(size_t)t * T + j] = s * E[(size_t)t * T + j] * (dot(dh + TK(t) * Dv, v + TK(j) * Dv, Dv) / den[t] + dnq[t]);
        for (int t = 0; t < T; t++) {
            for (int i = 0; i < Dk; i++) { double a = 0; for (int j = 0; j <= t; j++) a += P[(size_t)t * T + j] * k[TK(j) * Dk + i]; dq[TK(t) * Dk + i] = a; }
            for (int i = 0; i < Dk; i++) { double a = 0; for (int u = t; u < T; u++) a += P[(size_t)u * T + t] * q[TK(u) * Dk + i]; dk[TK(t) * Dk + i] = a; }
            for (int r = 0; r < Dv; r++) { double a = 0; for (int u = t; u < T; u++) a += s * E[(size_t)u * T + t] * QK[(size_t)u * T + t] * dh[TK(u) * Dv + r] / den[u]; dv[TK(t) * Dv + r] = a; }
        }
        for (int t = 0; t < T; t++) {
            dig[TK(t)] = dot(k + TK(t) * Dk, dk + TK(t) * Dk, Dk);
            dcs[t] = dot(q + TK(t) * Dk, dq + TK(t) * Dk, Dk) - dig[TK(t)];
        }
        double r = 0;
        for (int t = T - 1; t >= 0; t--) dfg[TK(t)] = r += dcs[t];
        // m's path: dL/dm_t = -(dh_t . h_t) eps / den_t back through m_t = max(f_t + m_{t-1}, i_t)
        double carry = 0;
        for (int t = T - 1; t >= 0; t--) {
            double hd = 0, nq = 0;
            for (int r2 = 0; r2 < Dv; r2++) h[r2] = 0;
            for (int j = 0; j <= t; j++) {
                double x = s * E[(size_t)t * T + j] * QK[(size_t)t * T + j];
                nq += x;
                for (int r2 = 0; r2 < Dv; r2++) h[r2] += x * v[TK(j) * Dv + r2];
            }
            for (int r2 = 0; r2 < Dv; r2++) hd += h[r2] / den[t] * dh[TK(t) * Dv + r2];
            carry += -hd * eps / den[t];
            double mp = t > 0 ? m[t - 1] : 0;
            if (ig[TK(t)] >= fg[TK(t)] + mp) { dig[TK(t)] += carry; carry = 0; }
            else dfg[TK(t)] += carry;
        }
#undef TK
    }
    free(cs); free(m); free(E); free(QK); free(den); free(dnq); free(h); free(P); free(dcs);
}

static void run(int idx, int B, int T, int H, int Dk, int Dv, int hard, int state, int sms, double eps_, unsigned long long seed) {
    emu_ctx.sm_count = sms;
    size_t nt = (size_t)B * T * H, nq = nt * Dk, nv = nt * Dv, pairs = (size_t)B * H, ns = pairs * Dv * Dk;
    double *q = dalloc(nq), *k = dalloc(nq), *v = dalloc(nv), *dh = dalloc(nv), *fg = dalloc(nt), *ig = dalloc(nt);
    for (size_t i = 0; i < nq; i++) { q[i] = rnd(&seed); k[i] = rnd(&seed); }
    for (size_t i = 0; i < nv; i++) { v[i] = rnd(&seed); dh[i] = rnd(&seed); }
    for (size_t i = 0; i < nt; i++) {
        double f = hard ? 6 + 2 * rnd(&seed) : 2 + 2 * rnd(&seed);  // forget gates near 1 when hard
        fg[i] = -log1p(exp(-f));
        ig[i] = hard ? 20 * rnd(&seed) : 2 * rnd(&seed);
    }
    double *c0 = NULL, *n0 = NULL, *m0 = NULL;
    if (state) {
        c0 = dalloc(ns); n0 = dalloc(pairs * Dk); m0 = dalloc(pairs);
        for (size_t i = 0; i < ns; i++) c0[i] = rnd(&seed);
        for (size_t i = 0; i < pairs * Dk; i++) n0[i] = rnd(&seed);
        for (size_t i = 0; i < pairs; i++) m0[i] = 3 * rnd(&seed);
    }
    bf16 *bq = to_bf(q, nq), *bk = to_bf(k, nq), *bv = to_bf(v, nv), *bdh = to_bf(dh, nv);
    float *ffg = to_f(fg, nt), *fig = to_f(ig, nt), *fc0 = state ? to_f(c0, ns) : NULL, *fn0 = state ? to_f(n0, pairs * Dk) : NULL,
          *fm0 = state ? to_f(m0, pairs) : NULL;
    double s = 1 / sqrt((double)Dk), eps = eps_;
    double *h = dalloc(nv), *rnq = dalloc(nt), *rm = dalloc(nt), *cT = dalloc(ns), *nT = dalloc(pairs * Dk), *mT = dalloc(pairs);
    ref_fwd(B, T, H, Dk, Dv, s, eps, q, k, v, fg, ig, c0, n0, m0, h, rnq, rm, cT, nT, mT);
    MnSeqDims d = {B, T, H, Dk, Dv};
    char tag[128];
    for (int form = 1; form <= 2; form++) {
        MlstmOpts o = {(float)s, (float)eps, form == 1 ? MN_FORM_CHUNK : MN_FORM_RECURRENT, 0};
        bf16 *gh = nan_bf(nv);
        float *gnq = nan_f(nt), *gm = nan_f(nt), *gcT = nan_f(ns), *gnT = nan_f(pairs * Dk), *gmT = nan_f(pairs);
        MlstmFwd io = {bq, bk, bv, ffg, fig, fc0, fn0, fm0, gh, gnq, gm, gcT, gnT, gmT};
        if (cuda_mlstm_fwd(NULL, &d, &o, &io)) { printf("fwd failed: %s\n", mn_last_error()); exit(1); }
        snprintf(tag, sizeof tag, "%d %s B%d T%d H%d Dk%d Dv%d%s%s eps %g", idx, form == 1 ? "chunk" : "rec  ", B, T, H, Dk,
                 Dv, hard ? " hard" : "", state ? " s0" : "", eps);
        check(tag, "h", relb(gh, h, nv), 2e-2);
        check(tag, "nq", relf(gnq, rnq, nt), 2e-2);
        check(tag, "m", relf(gm, rm, nt), 1e-5);
        check(tag, "cT", relf(gcT, cT, ns), 2e-2);
        check(tag, "nT", relf(gnT, nT, pairs * Dk), 2e-2);
        check(tag, "mT", relf(gmT, mT, pairs), 1e-5);
        if (form == 1 && !state) {  // the backward, from the GPU's own forward outputs
            double *dq = dalloc(nq), *dk = dalloc(nq), *dv = dalloc(nv), *dfg = dalloc(nt), *dig = dalloc(nt);
            ref_bwd(B, T, H, Dk, Dv, s, eps, q, k, v, fg, ig, dh, dq, dk, dv, dfg, dig);
            bf16 *gdq = nan_bf(nq), *gdk = nan_bf(nq), *gdv = nan_bf(nv);
            float *gdfg = nan_f(nt), *gdig = nan_f(nt);
            MlstmBwd bw = {bq, bk, bv, ffg, fig, gh, gnq, gm, bdh, gdq, gdk, gdv, gdfg, gdig};
            if (cuda_mlstm_bwd(NULL, &d, &o, &bw)) { printf("bwd failed: %s\n", mn_last_error()); exit(1); }
            check(tag, "dq", relb(gdq, dq, nq), 2e-2);
            check(tag, "dk", relb(gdk, dk, nq), 2e-2);
            check(tag, "dv", relb(gdv, dv, nv), 2e-2);
            check(tag, "dfg", relf(gdfg, dfg, nt), 2e-2);
            check(tag, "dig", relf(gdig, dig, nt), 2e-2);
            free(dq); free(dk); free(dv); free(dfg); free(dig); free(gdq); free(gdk); free(gdv); free(gdfg); free(gdig);
        }
        free(gh); free(gnq); free(gm); free(gcT); free(gnT); free(gmT);
    }
    free(q); free(k); free(v); free(dh); free(fg); free(ig); free(c0); free(n0); free(m0);
    free(bq); free(bk); free(bv); free(bdh); free(ffg); free(fig); free(fc0); free(fn0); free(fm0);
    free(h); free(rnq); free(rm); free(cT); free(nT); free(mT);
}

int main(void) {
    struct { int B, T, H, Dk, Dv, hard, state, sms; double eps; } shapes[] = {
        {1, 130, 2, 64, 64, 0, 0, 132, 1e-6},   // 3 chunks, the last short; DCS 32
        {2, 67, 1, 17, 24, 1, 0, 132, 1e-6},    // odd Dk (loads through registers), hard gates
        {1, 70, 1, 128, 128, 0, 1, 1, 1e-6},    // DCS 64, an initial state
        {1, 40, 1, 256, 40, 0, 0, 132, 1e-6},   // DA 256 (forward, dv), Dv 40
        {1, 129, 3, 32, 48, 1, 0, 1, 1e-6},     // H 3, DCS 64 at 48 columns
        {1, 64, 1, 128, 64, 0, 1, 132, 1e-6},   // one whole chunk, a state, Dk != Dv
        {1, 130, 2, 32, 32, 1, 0, 132, 0.5},    // a large eps: m's path in the backward
        {2, 75, 2, 320, 448, 0, 0, 132, 1e-6},  // heads above 256: every walk in two slices of its contraction
        {1, 70, 1, 384, 384, 0, 0, 132, 1e-6},  // the 125M model's heads
        {1, 67, 1, 512, 512, 1, 0, 1, 1e-6},    // the 350M model's heads, hard gates
        {1, 40, 1, 512, 384, 0, 1, 132, 1e-6},  // a state in and out at 512 x 384
        {1, 70, 1, 64, 384, 1, 0, 1, 0.5},      // Dk 64 (the chunkwise forward), Dv 384 (dq, dk split); m's path
    };
    const char *only = getenv("EMU_ONLY");
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        if (only && (size_t)atoi(only) != i) continue;
        const auto &s = shapes[i];
        run((int)i, s.B, s.T, s.H, s.Dk, s.Dv, s.hard, s.state, s.sms, s.eps, 1000 + 7 * i);
    }
    printf("%d fails\n", fails);
    return fails != 0;
}
