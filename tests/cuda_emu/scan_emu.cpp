// src/cuda/scan_cuda.cu, kernels and host side, on the CPU (xlstm_emu.h) against a float64 reference
// written out below (the RG-LRU and Longhorn recurrences and their backward, core/backend.h's ScanOps),
// through the entry points cuda_scan_fwd / cuda_scan_bwd: built and run by scripts/cuda_emulate.sh scan.
// The reference backward is itself checked against central finite differences of the reference forward
// on a small case first. Inputs rounded to bf16 (x, r, i, k, q, dy) and float32 (w, skip, s0) before the
// reference sees them; outputs poisoned with NaN (dw, dskip start at a known value: they accumulate).
// Prints relative L2 errors. bf16 outputs within 4e-3 (their own rounding, 2^-9 an element, is about
// 1.1e-3 in L2; the float32 walks add 1e-6 .. 1e-5), float32 ones (sT, dw, dskip) within 1e-4 (float32
// sums over T and B of terms carrying float32 gate arithmetic). EMU_ONLY=i runs case i only.
#include "scan_emu_kernels.h"
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
    float *y = (float *)aligned_alloc(16, (4 * n + 31) / 16 * 16);
    for (size_t i = 0; i < n; i++) { y[i] = (float)x[i]; x[i] = y[i]; }
    return y;
}
static bf16 *nan_bf(size_t n) { bf16 *y = (bf16 *)aligned_alloc(16, (2 * n + 31) / 16 * 16); for (size_t i = 0; i < n; i++) y[i].b = 0x7fc0; return y; }
static float *nan_f(size_t n) { float *y = (float *)aligned_alloc(16, (4 * n + 31) / 16 * 16); for (size_t i = 0; i < n; i++) y[i] = NAN; return y; }
static double relb(const bf16 *x, const double *r, size_t n) { double *a = dalloc(n); for (size_t i = 0; i < n; i++) a[i] = bf16_to_f32(x[i].b); double e = rel(a, r, n); free(a); return e; }
static double relf(const float *x, const double *r, size_t n) { double *a = dalloc(n); for (size_t i = 0; i < n; i++) a[i] = x[i]; double e = rel(a, r, n); free(a); return e; }
static void check(const char *tag, const char *what, double e, double tol) {
    int bad = !(e <= tol);
    fails += bad;
    printf("%-40s %-5s rel err %.2e%s\n", tag, what, e, bad ? "  FAIL" : "");
}
static double sig(double x) { return 1 / (1 + exp(-x)); }
static double softplus(double x) { return x > 30 ? x : log1p(exp(x)); }

// A problem in float64: inputs (already rounded as the GPU holds them) and the outputs.
typedef struct {
    ScanDims d;
    double *x, *r, *i, *k, *q, *w, *skip, *s0, *dy;
    double *y, *sT;                                   // forward (from s0)
    double *dx, *dr, *di, *dk, *dq, *dw, *dskip;      // backward (from the zero state)
} Prob;

// The forward: y and the final state from s0 (or zero).
static void ref_fwd(const Prob *p, const double *s0, double *y, double *sT) {
    const ScanDims *d = &p->d;
    const int N = d->N;
    double *S = dalloc(N);
    for (int b = 0; b < d->B; b++)
        for (int c = 0; c < d->C; c++) {
            for (int j = 0; j < N; j++) S[j] = s0 ? s0[((size_t)b * d->C + c) * N + j] : 0;
            for (int t = 0; t < d->T; t++) {
                size_t e = ((size_t)b * d->T + t) * d->C + c;
                if (d->kind == SCAN_RGLRU) {
                    double a = 0, m = 1;
                    if (!(d->reset && t == 0)) {
                        a = exp(-8 * sig(p->r[e]) * softplus(p->w[c]));
                        m = sqrt(1 - a * a);
                    }
                    S[0] = a * S[0] + m * sig(p->i[e]) * p->x[e];
                    y[e] = S[0];
                } else {
                    const double *kt = p->k + ((size_t)b * d->T + t) * N, *qt = p->q + ((size_t)b * d->T + t) * N;
                    double kap = 0, yy = p->skip[c] * p->x[e];
                    for (int j = 0; j < N; j++) kap += kt[j] * kt[j];
                    double be = sig(p->r[e] + p->w[c]), dl = be / (1 + be * kap);
                    for (int j = 0; j < N; j++) {
                        S[j] = (1 - dl * kt[j] * kt[j]) * S[j] + dl * p->x[e] * kt[j];
                        yy += S[j] * qt[j];
                    }
                    y[e] = yy;
                }
            }
            if (sT) for (int j = 0; j < N; j++) sT[((size_t)b * d->C + c) * N + j] = S[j];
        }
    free(S);
}

// The backward from the zero state (core/backend.h): the adjoints walked back over stored states.
static void ref_bwd(Prob *p) {
    const ScanDims *d = &p->d;
    const int N = d->N, T = d->T;
    double *St = dalloc((size_t)(T + 1) * N), *dS = dalloc(N);
    memset(p->dw, 0, 8 * d->C);
    if (p->dskip) memset(p->dskip, 0, 8 * d->C);
    if (p->dk) { memset(p->dk, 0, 8 * (size_t)d->B * T * N); memset(p->dq, 0, 8 * (size_t)d->B * T * N); }
    for (int b = 0; b < d->B; b++)
        for (int c = 0; c < d->C; c++) {
            for (int j = 0; j < N; j++) St[j] = 0;
            // states S_t at St[(t + 1) N]
            for (int t = 0; t < T; t++) {
                size_t e = ((size_t)b * T + t) * d->C + c;
                const double *Sp = St + (size_t)t * N;
                double *Sn = St + (size_t)(t + 1) * N;
                if (d->kind == SCAN_RGLRU) {
                    double a = 0, m = 1;
                    if (!(d->reset && t == 0)) { a = exp(-8 * sig(p->r[e]) * softplus(p->w[c])); m = sqrt(1 - a * a); }
                    Sn[0] = a * Sp[0] + m * sig(p->i[e]) * p->x[e];
                } else {
                    const double *kt = p->k + ((size_t)b * T + t) * N;
                    double kap = 0;
                    for (int j = 0; j < N; j++) kap += kt[j] * kt[j];
                    double be = sig(p->r[e] + p->w[c]), dl = be / (1 + be * kap);
                    for (int j = 0; j < N; j++) Sn[j] = (1 - dl * kt[j] * kt[j]) * Sp[j] + dl * p->x[e] * kt[j];
                }
            }
            for (int j = 0; j < N; j++) dS[j] = 0;  // a_{t+1} dS_{t+1}
            for (int t = T - 1; t >= 0; t--) {
                size_t e = ((size_t)b * T + t) * d->C + c;
                const double *Sp = St + (size_t)t * N, *Sn = St + (size_t)(t + 1) * N;
                const double x = p->x[e], dy = p->dy[e];
                if (d->kind == SCAN_RGLRU) {
                    const double ig = sig(p->i[e]), dh = dy + dS[0];
                    double a = 0, m = 1, dr = 0;
                    if (!(d->reset && t == 0)) {
                        const double rg = sig(p->r[e]), sp = softplus(p->w[c]), la = -8 * rg * sp;
                        a = exp(la);
                        const double u = 1 - a * a;
                        m = sqrt(u);
                        const double du = dh * ig * x / sqrt(fmax(4 * u, 1e-6));
                        const double dla = a * (dh * Sp[0] - 2 * a * du);
                        dr = dla * -8 * sp * rg * (1 - rg);
                        p->dw[c] += dla * -8 * rg * sig(p->w[c]);
                    }
                    p->dx[e] = dh * m * ig;
                    p->di[e] = dh * m * x * ig * (1 - ig);
                    p->dr[e] = dr;
                    dS[0] = a * dh;
                } else {
                    const double *kt = p->k + ((size_t)b * T + t) * N, *qt = p->q + ((size_t)b * T + t) * N;
                    double *dkt = p->dk + ((size_t)b * T + t) * N, *dqt = p->dq + ((size_t)b * T + t) * N;
                    double kap = 0;
                    for (int j = 0; j < N; j++) kap += kt[j] * kt[j];
                    const double be = sig(p->r[e] + p->w[c]), den = 1 + be * kap, dl = be / den;
                    double ddl = 0, dxs = 0;
                    for (int j = 0; j < N; j++) {
                        const double g = dy * qt[j] + dS[j];
                        dqt[j] += Sn[j] * dy;
                        ddl += g * (x * kt[j] - kt[j] * kt[j] * Sp[j]);
                        dxs += g * kt[j];
                        dkt[j] += g * dl * (x - 2 * kt[j] * Sp[j]);
                        dS[j] = (1 - dl * kt[j] * kt[j]) * g;
                    }
                    const double dkap = -ddl * dl * dl;
                    for (int j = 0; j < N; j++) dkt[j] += 2 * kt[j] * dkap;
                    const double dr = ddl / (den * den) * be * (1 - be);
                    p->dx[e] = dl * dxs + p->skip[c] * dy;
                    p->dr[e] = dr;
                    p->dw[c] += dr;
                    p->dskip[c] += dy * x;
                }
            }
        }
    free(St);
    free(dS);
}

static double loss(const Prob *p) {
    size_t n = (size_t)p->d.B * p->d.T * p->d.C;
    double *y = dalloc(n), s = 0;
    ref_fwd(p, NULL, y, NULL);
    for (size_t e = 0; e < n; e++) s += y[e] * p->dy[e];
    free(y);
    return s;
}

static void prob_init(Prob *p, ScanKind kind, int B, int T, int C, int N, int reset, unsigned long long seed) {
    memset(p, 0, sizeof *p);
    p->d.kind = kind, p->d.B = B, p->d.T = T, p->d.C = C, p->d.N = N, p->d.reset = reset;
    const size_t n = (size_t)B * T * C, nk = (size_t)B * T * N, ns = (size_t)B * C * N;
    unsigned long long s = seed;
    p->x = dalloc(n), p->r = dalloc(n), p->dy = dalloc(n), p->w = dalloc(C), p->s0 = dalloc(ns);
    for (size_t e = 0; e < n; e++) { p->x[e] = rnd(&s); p->r[e] = 2 * rnd(&s); p->dy[e] = rnd(&s); }
    for (size_t e = 0; e < ns; e++) p->s0[e] = rnd(&s);
    if (kind == SCAN_RGLRU) {
        p->i = dalloc(n);
        for (size_t e = 0; e < n; e++) p->i[e] = 2 * rnd(&s);
        for (int c = 0; c < C; c++) p->w[c] = 2 * rnd(&s) + (c % 4 == 0 ? -6 : 0);  // some channels near a = 1
    } else {
        p->k = dalloc(nk), p->q = dalloc(nk), p->skip = dalloc(C);
        for (size_t e = 0; e < nk; e++) { p->k[e] = 0.7 * rnd(&s); p->q[e] = rnd(&s); }
        for (int c = 0; c < C; c++) { p->w[c] = rnd(&s); p->skip[c] = rnd(&s); }
    }
    p->y = dalloc(n), p->sT = dalloc(ns), p->dx = dalloc(n), p->dr = dalloc(n), p->dw = dalloc(C);
    if (kind == SCAN_RGLRU) p->di = dalloc(n);
    else p->dk = dalloc(nk), p->dq = dalloc(nk), p->dskip = dalloc(C);
}

// The reference backward against central differences of the reference forward, a few elements each.
static void fd_check(ScanKind kind, int reset) {
    Prob p;
    prob_init(&p, kind, 2, 9, 3, kind == SCAN_RGLRU ? 1 : 5, reset, 99);
    ref_bwd(&p);
    struct { const char *name; double *v, *g; size_t n; } in[] = {
        {"x", p.x, p.dx, (size_t)2 * 9 * 3}, {"r", p.r, p.dr, (size_t)2 * 9 * 3}, {"i", p.i, p.di, (size_t)2 * 9 * 3},
        {"k", p.k, p.dk, (size_t)2 * 9 * 5}, {"q", p.q, p.dq, (size_t)2 * 9 * 5}, {"w", p.w, p.dw, 3},
        {"skip", p.skip, p.dskip, 3}};
    for (auto &a : in) {
        if (!a.v) continue;
        double e = 0, r = 0;
        for (size_t j = 0; j < a.n; j++) {
            const double h = 1e-5, v = a.v[j];
            a.v[j] = v + h;
            double lp = loss(&p);
            a.v[j] = v - h;
            double lm = loss(&p);
            a.v[j] = v;
            double fd = (lp - lm) / (2 * h);
            e = fmax(e, fabs(fd - a.g[j]));
            r = fmax(r, fabs(fd));
        }
        char tag[64];
        snprintf(tag, sizeof tag, "reference vs differences %s%s", kind == SCAN_RGLRU ? "rglru" : "longhorn",
                 reset ? " reset" : "");
        check(tag, a.name, e / fmax(r, 1e-12), 1e-6);
    }
}

static void run_case(ScanKind kind, int B, int T, int C, int N, int reset, int alias) {
    char tag[96];
    snprintf(tag, sizeof tag, "%s B%d T%d C%d N%d%s%s", kind == SCAN_RGLRU ? "rglru" : "longhorn", B, T, C, N,
             reset ? " reset" : "", alias ? " sT=s0" : "");
    Prob p;
    prob_init(&p, kind, B, T, C, N, reset, 1234 + (unsigned long long)T * 7 + C);
    const size_t n = (size_t)B * T * C, nk = (size_t)B * T * N, ns = (size_t)B * C * N;
    const int lh = kind == SCAN_LONGHORN;
    bf16 *x = to_bf(p.x, n), *r = to_bf(p.r, n), *dy = to_bf(p.dy, n);
    bf16 *ib = lh ? NULL : to_bf(p.i, n), *kb = lh ? to_bf(p.k, nk) : NULL, *qb = lh ? to_bf(p.q, nk) : NULL;
    float *w = to_f(p.w, C), *skip = lh ? to_f(p.skip, C) : NULL, *s0 = to_f(p.s0, ns);
    ref_fwd(&p, p.s0, p.y, p.sT);
    ref_bwd(&p);
    bf16 *y = nan_bf(n);
    float *sT = alias ? s0 : nan_f(ns);
    ScanFwd f = {x, r, ib, kb, qb, w, skip, s0, y, sT};
    if (cuda_scan_fwd(NULL, &p.d, &f)) { printf("%s: forward failed: %s\n", tag, mn_last_error()); fails++; return; }
    check(tag, "y", relb(y, p.y, n), 4e-3);
    check(tag, "sT", relf(sT, p.sT, ns), 1e-4);
    bf16 *dx = nan_bf(n), *dr = nan_bf(n), *di = lh ? NULL : nan_bf(n), *dk = lh ? nan_bf(nk) : NULL;
    bf16 *dq = lh ? nan_bf(nk) : NULL;
    float *dw = (float *)malloc(4 * C), *dskip = lh ? (float *)malloc(4 * C) : NULL;
    for (int c = 0; c < C; c++) { dw[c] = 0.5f; if (dskip) dskip[c] = -0.25f; }
    ScanBwd g = {x, r, ib, kb, qb, w, skip, dy, dx, dr, di, dk, dq, dw, dskip};
    if (cuda_scan_bwd(NULL, &p.d, &g)) { printf("%s: backward failed: %s\n", tag, mn_last_error()); fails++; return; }
    check(tag, "dx", relb(dx, p.dx, n), 4e-3);
    check(tag, "dr", relb(dr, p.dr, n), 4e-3);
    if (!lh) check(tag, "di", relb(di, p.di, n), 4e-3);
    if (lh) {
        check(tag, "dk", relb(dk, p.dk, nk), 4e-3);
        check(tag, "dq", relb(dq, p.dq, nk), 4e-3);
    }
    for (int c = 0; c < C; c++) { p.dw[c] += 0.5; if (dskip) p.dskip[c] -= 0.25; }
    check(tag, "dw", relf(dw, p.dw, C), 1e-4);
    if (lh) check(tag, "dskip", relf(dskip, p.dskip, C), 1e-4);
}

// G groups of `per` sequences, each group with its own w and skip ws = C + 3 elements apart
// (ScanDims.w_seqs: the runs of a model of several), against each group alone: the same bits.
static void run_groups(ScanKind kind, int G, int per, int T, int C, int N) {
    char tag[96];
    snprintf(tag, sizeof tag, "%s %d groups of %d, T%d C%d N%d", kind == SCAN_RGLRU ? "rglru" : "longhorn", G, per, T,
             C, N);
    const int B = G * per, lh = kind == SCAN_LONGHORN, ws = C + 3;
    Prob p;
    prob_init(&p, kind, B, T, C, N, !lh, 4321 + (unsigned long long)T);
    const size_t n = (size_t)B * T * C, nk = (size_t)B * T * N, ns = (size_t)B * C * N;
    bf16 *x = to_bf(p.x, n), *r = to_bf(p.r, n), *dy = to_bf(p.dy, n);
    bf16 *ib = lh ? NULL : to_bf(p.i, n), *kb = lh ? to_bf(p.k, nk) : NULL, *qb = lh ? to_bf(p.q, nk) : NULL;
    float *w = (float *)calloc((size_t)G * ws, 4), *skip = (float *)calloc((size_t)G * ws, 4);
    for (int g = 0; g < G; g++)
        for (int c = 0; c < C; c++) w[g * ws + c] = (float)(p.w[c] + 0.3 * g), skip[g * ws + c] = (float)(p.skip ? p.skip[c] - 0.2 * g : 0);
    float *s0 = to_f(p.s0, ns);
    bf16 *y[2] = {nan_bf(n), nan_bf(n)}, *dx[2] = {nan_bf(n), nan_bf(n)}, *dr[2] = {nan_bf(n), nan_bf(n)};
    bf16 *di[2] = {lh ? NULL : nan_bf(n), lh ? NULL : nan_bf(n)}, *dk[2] = {lh ? nan_bf(nk) : NULL, lh ? nan_bf(nk) : NULL};
    bf16 *dq[2] = {lh ? nan_bf(nk) : NULL, lh ? nan_bf(nk) : NULL};
    float *sT[2] = {nan_f(ns), nan_f(ns)}, *dw[2], *dsk[2];
    for (int v = 0; v < 2; v++) {
        dw[v] = (float *)calloc((size_t)G * ws, 4), dsk[v] = (float *)calloc((size_t)G * ws, 4);
    }
    ScanDims all = p.d;
    all.w_seqs = per, all.w_stride = (size_t)ws;
    ScanFwd f = {x, r, ib, kb, qb, w, lh ? skip : NULL, s0, y[0], sT[0]};
    ScanBwd b = {x, r, ib, kb, qb, w, lh ? skip : NULL, dy, dx[0], dr[0], di[0], dk[0], dq[0], dw[0], lh ? dsk[0] : NULL};
    if (cuda_scan_fwd(NULL, &all, &f) || cuda_scan_bwd(NULL, &all, &b)) {
        printf("%s: grouped call failed: %s\n", tag, mn_last_error());
        fails++;
        return;
    }
    ScanDims one = p.d;
    one.B = per;
    for (int g = 0; g < G; g++) {  // each group alone, its rows and its w, skip
        const size_t o = (size_t)g * per * T * C, ok = (size_t)g * per * T * N, os = (size_t)g * per * C * N;
        ScanFwd f1 = {x + o, r + o, ib ? ib + o : NULL, kb ? kb + ok : NULL, qb ? qb + ok : NULL, w + g * ws,
                      lh ? skip + g * ws : NULL, s0 + os, y[1] + o, sT[1] + os};
        ScanBwd b1 = {x + o, r + o, ib ? ib + o : NULL, kb ? kb + ok : NULL, qb ? qb + ok : NULL, w + g * ws,
                      lh ? skip + g * ws : NULL, dy + o, dx[1] + o, dr[1] + o, di[1] ? di[1] + o : NULL,
                      dk[1] ? dk[1] + ok : NULL, dq[1] ? dq[1] + ok : NULL, dw[1] + g * ws, lh ? dsk[1] + g * ws : NULL};
        if (cuda_scan_fwd(NULL, &one, &f1) || cuda_scan_bwd(NULL, &one, &b1)) {
            printf("%s: group %d alone failed: %s\n", tag, g, mn_last_error());
            fails++;
            return;
        }
    }
    int same = !memcmp(y[0], y[1], 2 * n) && !memcmp(sT[0], sT[1], 4 * ns) && !memcmp(dx[0], dx[1], 2 * n) &&
               !memcmp(dr[0], dr[1], 2 * n) && (lh || !memcmp(di[0], di[1], 2 * n)) &&
               (!lh || (!memcmp(dk[0], dk[1], 2 * nk) && !memcmp(dq[0], dq[1], 2 * nk))) &&
               !memcmp(dw[0], dw[1], 4 * (size_t)G * ws) && !memcmp(dsk[0], dsk[1], 4 * (size_t)G * ws);
    fails += !same;
    printf("%-40s grouped as alone: %s\n", tag, same ? "the same bits" : "DIFFERENT  FAIL");
}

int main(void) {
    const char *only = getenv("EMU_ONLY");
    int idx = 0;
#define CASE(...) do { if (!only || atoi(only) == idx) __VA_ARGS__; idx++; } while (0)
    CASE(fd_check(SCAN_RGLRU, 0));
    CASE(fd_check(SCAN_RGLRU, 1));
    CASE(fd_check(SCAN_LONGHORN, 0));
    CASE(run_case(SCAN_RGLRU, 2, 75, 70, 1, 1, 0));     // a partial block of channels, partial chunks, reset
    CASE(run_case(SCAN_RGLRU, 2, 67, 128, 1, 0, 0));    // the state handed on across chunks
    CASE(run_case(SCAN_RGLRU, 3, 1, 72, 1, 0, 1));      // decode: T = 1, sT aliasing s0
    CASE(run_case(SCAN_RGLRU, 1, 130, 8, 1, 1, 0));     // five 32-token chunks (nine of the backward's)
    CASE(run_case(SCAN_RGLRU, 2, 41, 301, 1, 1, 0));    // C odd: a channel a thread, three blocks of 128
    CASE(run_case(SCAN_RGLRU, 1, 20, 514, 1, 0, 0));    // two channels a thread, three blocks of 256
    CASE(run_case(SCAN_LONGHORN, 2, 70, 96, 16, 0, 0)); // 16-byte copies, a partial tile and stage
    CASE(run_case(SCAN_LONGHORN, 1, 33, 40, 5, 0, 0));  // N = 5: k, q by elements, padded with zeros
    CASE(run_case(SCAN_LONGHORN, 2, 1, 64, 16, 0, 1));  // decode
    CASE(run_case(SCAN_LONGHORN, 1, 97, 130, 16, 0, 0)); // three tiles, C % 8 != 0
    CASE(run_case(SCAN_LONGHORN, 1, 300, 40, 16, 0, 0)); // chunks of 128 tokens: two and a partial one
    CASE(run_case(SCAN_LONGHORN, 2, 129, 24, 5, 0, 1));  // a chunk and one token; sT aliasing s0
    CASE(run_case(SCAN_RGLRU, 2, 96, 16, 1, 0, 1));      // three 32-token chunks exactly; sT aliasing s0
    CASE(run_groups(SCAN_RGLRU, 3, 2, 70, 72, 1));       // w a group of sequences (the runs of a model)
    CASE(run_groups(SCAN_LONGHORN, 2, 2, 40, 40, 16));   // and skip
    printf(fails ? "FAILED: %d\n" : "all passed\n", fails);
    return fails != 0;
}
