/*
 * `mesanet bench xlstm`: the xLSTM cores of core/backend.h on the CPU or the GPU:
 *
 *   mLSTM  MlstmOps fwd (keeping nq and m, as training does) and fwd + bwd at --mlstm shapes
 *          B x T x H x Dk [x Dv] (Dv = Dk when left out), scale Dk^-1/2, eps 1e-6, --form
 *   sLSTM  SlstmOps fwd (keeping the cache) and fwd + bwd at --slstm shapes B x T x H x Dh
 *          (D = H Dh cells), no gradient clipping
 *
 * Timing as `bench lin` (bench/bench_lin.c): "fwd ms" and "f+b ms" are the median of --reps calls,
 * each timed on the host from launch to completion after a synchronisation; "f+b strm" is the mean
 * of --reps calls launched back to back with one synchronisation at the end (what
 * triton.testing.do_bench measures). tok/s = B T / time. TFLOP/s (cuda; GFLOP/s on the CPU): the
 * mLSTM's minimal chunkwise flops (C = 64) per token and head, 4 Dk Dv + C (Dk + Dv), over the
 * forward's time. bench/xlstm_kernels_bench.py times NX-AI's kernels (mlstm_kernels' TFLA Triton
 * kernels, the xlstm package's sLSTM CUDA kernel, FlashRNN) at the same shapes and prints the same
 * tables; bench/xlstm_peers.sh runs both, and the whole models' comparisons, in one go on a GPU.
 *
 * Inputs, in the ranges the layers see (one seed a shape): q and k rows of unit L2 norm, v and the
 * output gradient dh ~ N(0, 1), log forget gates f = logsigmoid(N(--gmean, 1)), input gates
 * i ~ N(0, 1); sLSTM pre-activations x ~ N(0, 1) for the gates i, z, o and N(--gmean, 1) for f,
 * R ~ N(0, 1/Dh). Each value is rounded to what the backend holds (bf16 activations and R on cuda,
 * float32 on the CPU; float32 gates) before the reference sees it, so that the reference is exact
 * for the same inputs.
 *
 * Errors: the relative L2 error of the forward output and of the gradients (mLSTM h, dq, dk, dv,
 * dfg, dig; sLSTM h, dx, dR) against the float64 reference backend (src/ref) on a slice: the first
 * sequence, the first --err-heads heads, the first --err-T tokens. They come from one more fwd + bwd
 * of the timed shape, on the same inputs but with dh zero outside the slice (past its tokens; for the
 * sLSTM also in the other sequences), so that the slice's gradients are exactly the reference's of
 * the sliced problem (causality; the sLSTM's dR then sums the first sequence alone).
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "backends/registry.h"
#include "core/backend.h"
#include "core/common.h"
#include "core/half.h"
#include "ref/ref.h"
#include "tools/commands.h"

typedef double (*Round)(double);
static double round_bf16(double x) { return bf16_to_f32(f32_to_bf16((float)x)); }
static double round_f32(double x) { return (double)(float)x; }

static double logsigmoid(double x) { return x >= 0 ? -log1p(exp(-x)) : x - log1p(exp(x)); }

typedef struct {
    int B, T, H, Dk, Dv;
} Shape;

// "BxTxHxD[xDv][,...]" (Dv only where allow_dv; else exactly four sizes): the count, or -1.
static int parse_shapes(const char *s, Shape *out, int max, int allow_dv) {
    int n = 0;
    while (*s) {
        int v[5], k = 0;
        while (k < 5) {
            char *end;
            long x = strtol(s, &end, 10);
            if (end == s || x <= 0 || x > 1 << 24) return -1;
            v[k++] = (int)x;
            s = end;
            if (*s != 'x') break;
            s++;
        }
        if (k < 4 || (k == 5 && !allow_dv) || n == max) return -1;
        out[n++] = (Shape){v[0], v[1], v[2], v[3], k == 5 ? v[4] : v[3]};
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return n;
}

// --- host arrays -------------------------------------------------------------------------------

// x [rows][len] -> [rows][keep] (the first keep of each row).
static double *slice_rows(const double *x, size_t rows, size_t len, size_t keep) {
    double *y = xcalloc(rows * keep, 8);
    for (size_t r = 0; r < rows; r++) memcpy(y + r * keep, x + r * len, keep * sizeof(double));
    return y;
}

static double rel_err(const double *a, const double *e, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += (a[i] - e[i]) * (a[i] - e[i]);
        den += e[i] * e[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

// mLSTM inputs [B,T,H,Dk], [B,T,H,Dv], gates [B,T,H].
typedef struct {
    MnSeqDims d;
    size_t nk, nv, ng;
    double *q, *k, *v, *fg, *ig, *dh;
} MIn;

static void m_inputs(MIn *x, MnSeqDims d, uint64_t seed, double gmean, Round act) {
    MnRng r;
    mn_rng_seed(&r, seed);
    x->d = d;
    x->ng = (size_t)d.B * d.T * d.H;
    x->nk = x->ng * d.Dk;
    x->nv = x->ng * d.Dv;
    x->q = xcalloc(x->nk, 8);
    x->k = xcalloc(x->nk, 8);
    x->v = xcalloc(x->nv, 8);
    x->dh = xcalloc(x->nv, 8);
    x->fg = xcalloc(x->ng, 8);
    x->ig = xcalloc(x->ng, 8);
    for (size_t t = 0; t < x->ng; t++) {
        double *rows[2] = {x->q + t * d.Dk, x->k + t * d.Dk};
        for (int m = 0; m < 2; m++) {
            double ss = 0;
            for (int i = 0; i < d.Dk; i++) {
                rows[m][i] = mn_rng_normal(&r);
                ss += rows[m][i] * rows[m][i];
            }
            for (int i = 0; i < d.Dk; i++) rows[m][i] = act(rows[m][i] / sqrt(ss));
        }
        for (int i = 0; i < d.Dv; i++) {
            x->v[t * d.Dv + i] = act(mn_rng_normal(&r));
            x->dh[t * d.Dv + i] = act(mn_rng_normal(&r));
        }
        x->fg[t] = round_f32(logsigmoid(mn_rng_normal(&r) + gmean));
        x->ig[t] = round_f32(mn_rng_normal(&r));
    }
}

static void m_inputs_free(MIn *x) {
    free(x->q); free(x->k); free(x->v); free(x->fg); free(x->ig); free(x->dh);
}

// sLSTM inputs: x [B,T,4,D], R [H,Dh,4,Dh], dh [B,T,D].
typedef struct {
    SlstmDims d;
    size_t nx, nh, nr;
    double *x, *r, *dh;
} SIn;

static void s_inputs(SIn *s, SlstmDims d, uint64_t seed, double gmean, Round act) {
    MnRng r;
    mn_rng_seed(&r, seed);
    size_t D = (size_t)d.H * d.Dh;
    s->d = d;
    s->nh = (size_t)d.B * d.T * D;
    s->nx = 4 * s->nh;
    s->nr = (size_t)d.H * d.Dh * 4 * d.Dh;
    s->x = xcalloc(s->nx, 8);
    s->r = xcalloc(s->nr, 8);
    s->dh = xcalloc(s->nh, 8);
    for (size_t i = 0; i < s->nx; i++) s->x[i] = act(mn_rng_normal(&r) + ((i / D) % 4 == 1 ? gmean : 0));
    for (size_t i = 0; i < s->nr; i++) s->r[i] = act(mn_rng_normal(&r) / sqrt((double)d.Dh));
    for (size_t i = 0; i < s->nh; i++) s->dh[i] = act(mn_rng_normal(&r));
}

static void s_inputs_free(SIn *s) {
    free(s->x); free(s->r); free(s->dh);
}

// --- device buffers ------------------------------------------------------------------------------

static void *up(const Backend *be, const double *x, size_t n, MemKind k) {
    void *p = be->alloc(be, n, k);
    if (!p || (x && be->upload(be, p, x, n, k))) die("%s", mn_last_error());
    return p;
}

static double *down(const Backend *be, const void *p, size_t n, MemKind k) {
    double *x = xcalloc(n, 8);
    if (be->download(be, x, p, n, k)) die("%s", mn_last_error());
    return x;
}

// Relative error of a device buffer's slice (slice_rows' rows, len, keep) against exact.
static double dev_err(const Backend *be, const void *p, size_t n, MemKind k, size_t rows, size_t len, size_t keep,
                      const double *exact) {
    double *all = down(be, p, n, k), *s = slice_rows(all, rows, len, keep);
    double e = rel_err(s, exact, rows * keep);
    free(all);
    free(s);
    return e;
}

static double mem_gb(const Backend *be) { return be->device_mem_used ? be->device_mem_used(be) / 1e9 : NAN; }

// --- mLSTM ---------------------------------------------------------------------------------------

typedef struct {
    const Backend *be;
    MnSeqDims d;
    MlstmOpts o;
    MlstmFwd f;
    MlstmBwd b;
} MRun;

static int m_fwd(void *p) {
    MRun *r = p;
    return r->be->mlstm->fwd(r->be, &r->d, &r->o, &r->f);
}

static int m_fwd_bwd(void *p) {
    MRun *r = p;
    MN_TRY(r->be->mlstm->fwd(r->be, &r->d, &r->o, &r->f));
    return r->be->mlstm->bwd(r->be, &r->d, &r->o, &r->b);
}

// Minimal flops of the chunkwise forward per token and head (the top of the file).
static double m_flops_per_token(int Dk, int Dv) { return 4.0 * Dk * Dv + 64.0 * (Dk + Dv); }

typedef struct {
    int heads, T;  // the error slice: first sequence, heads h < heads, tokens t < T
} Slice;

// The slice's tokens in words (err-T 0: all).
static const char *tokens_of(int err_T) {
    static char s[64];
    if (err_T > 0) snprintf(s, sizeof s, "the first min(T, %d) tokens", err_T);
    else snprintf(s, sizeof s, "all tokens");
    return s;
}

static Slice slice_of(int H, int T, int err_heads, int err_T) {
    Slice s = {err_heads < H ? err_heads : H, err_T > 0 && err_T < T ? err_T : T};
    return s;
}

// The float64 reference on the slice of x: h and the gradients of the loss sum(h dh) [T2][H2][.].
typedef struct {
    double *h, *dq, *dk, *dv, *dfg, *dig;
} MExact;

static MExact m_exact(const MIn *x, Slice sl, const MlstmOpts *o) {
    MnSeqDims d = x->d, s = {1, sl.T, sl.heads, d.Dk, d.Dv};
    size_t rows = (size_t)sl.T, kk = (size_t)sl.heads * d.Dk, kv = (size_t)sl.heads * d.Dv, kg = (size_t)sl.heads;
    double *q = slice_rows(x->q, rows, (size_t)d.H * d.Dk, kk), *k = slice_rows(x->k, rows, (size_t)d.H * d.Dk, kk);
    double *v = slice_rows(x->v, rows, (size_t)d.H * d.Dv, kv), *dh = slice_rows(x->dh, rows, (size_t)d.H * d.Dv, kv);
    double *fg = slice_rows(x->fg, rows, (size_t)d.H, kg), *ig = slice_rows(x->ig, rows, (size_t)d.H, kg);
    MExact e = {xcalloc(rows * kv, 8), xcalloc(rows * kk, 8), xcalloc(rows * kk, 8), xcalloc(rows * kv, 8),
                xcalloc(rows * kg, 8), xcalloc(rows * kg, 8)};
    MlstmFwd64 f = {.q = q, .k = k, .v = v, .fg = fg, .ig = ig, .h = e.h};
    MlstmBwd64 b = {q, k, v, fg, ig, dh, e.dq, e.dk, e.dv, e.dfg, e.dig};
    if (ref_mlstm_forward(&s, o, &f) || ref_mlstm_backward(&s, o, &b)) die("%s", mn_last_error());
    free(q); free(k); free(v); free(dh); free(fg); free(ig);
    return e;
}

static void m_exact_free(MExact *e) {
    free(e->h); free(e->dq); free(e->dk); free(e->dv); free(e->dfg); free(e->dig);
}

static void bench_mlstm(const Backend *be, const Shape *shapes, int ns, MlstmOpts base, int reps, double gmean,
                        int err_heads, int err_T, Round act) {
    int gpu = be->device_mem_used != NULL;
    printf("\nmLSTM core (MlstmOps) on %s: %s q k v h, float32 gates; scale Dk^-1/2, eps %g, form %s, chunk %d "
           "(0: the backend's)\n", be->name, gpu ? "bf16" : "float32", (double)base.eps,
           base.form == MN_FORM_CHUNK ? "chunk" : base.form == MN_FORM_RECURRENT ? "recurrent" : "auto", base.chunk);
    if (err_heads > 0)
        printf("rel err of h, dq, dk, dv, dfg, dig against the float64 reference backend on a slice: b = 0, the first "
               "%d heads, %s (dh zero outside it)\n", err_heads, tokens_of(err_T));
    printf("%-20s | %9s %11s %8s | %9s %9s %11s | %8s %8s %8s %8s %8s %8s | %6s\n", "B x T x H x Dk x Dv", "fwd ms",
           "fwd tok/s", gpu ? "TFLOP/s" : "GFLOP/s", "f+b ms", "f+b strm", "f+b tok/s", "err h", "err dq", "err dk",
           "err dv", "err dfg", "err dig", "mem GB");
    for (int si = 0; si < ns; si++) {
        Shape sh = shapes[si];
        char name[48];
        snprintf(name, sizeof name, "%dx%dx%dx%dx%d", sh.B, sh.T, sh.H, sh.Dk, sh.Dv);
        MnSeqDims d = {sh.B, sh.T, sh.H, sh.Dk, sh.Dv};
        if (be->mlstm->supports && be->mlstm->supports(be, &d)) {
            printf("%-20s | unsupported: %s\n", name, mn_last_error());
            continue;
        }
        MIn x;
        m_inputs(&x, d, 101 + (uint64_t)si, gmean, act);
        void *q = up(be, x.q, x.nk, MEM_ACT), *k = up(be, x.k, x.nk, MEM_ACT), *v = up(be, x.v, x.nv, MEM_ACT);
        void *fg = up(be, x.fg, x.ng, MEM_F32), *ig = up(be, x.ig, x.ng, MEM_F32), *dh = up(be, x.dh, x.nv, MEM_ACT);
        void *h = up(be, NULL, x.nv, MEM_ACT), *nq = up(be, NULL, x.ng, MEM_F32), *m = up(be, NULL, x.ng, MEM_F32);
        void *dq = up(be, NULL, x.nk, MEM_ACT), *dk = up(be, NULL, x.nk, MEM_ACT), *dv = up(be, NULL, x.nv, MEM_ACT);
        void *dfg = up(be, NULL, x.ng, MEM_F32), *dig = up(be, NULL, x.ng, MEM_F32);
        MRun r = {be, d, base};
        r.o.scale = (float)(1 / sqrt((double)sh.Dk));
        MlstmFwd f = {q, k, v, fg, ig, NULL, NULL, NULL, h, nq, m, NULL, NULL, NULL};
        MlstmBwd b = {q, k, v, fg, ig, h, nq, m, dh, dq, dk, dv, dfg, dig};
        r.f = f;
        r.b = b;
        if (m_fwd_bwd(&r) || be->sync(be)) {
            printf("%-20s | failed: %s\n", name, mn_last_error());
        } else {
            double tf = bench_median_time(be, reps, m_fwd, &r), tb = bench_median_time(be, reps, m_fwd_bwd, &r);
            double tbs = bench_stream_time(be, reps, m_fwd_bwd, &r), mem = mem_gb(be), ntok = (double)sh.B * sh.T;
            double rate = (double)x.ng * m_flops_per_token(sh.Dk, sh.Dv) / tf / (gpu ? 1e12 : 1e9);
            printf("%-20s | %9.3f %11.0f %8.1f | %9.3f %9.3f %11.0f |", name, 1e3 * tf, ntok / tf, rate, 1e3 * tb,
                   1e3 * tbs, ntok / tb);
            fflush(stdout);
            if (err_heads > 0) {
                // one more fwd + bwd with dh zero past the slice's tokens, against the reference on the slice
                Slice sl = slice_of(sh.H, sh.T, err_heads, err_T);
                double *dhz = xcalloc(x.nv, 8);
                for (int bb = 0; bb < sh.B; bb++)
                    memcpy(dhz + (size_t)bb * sh.T * sh.H * sh.Dv, x.dh + (size_t)bb * sh.T * sh.H * sh.Dv,
                           sizeof(double) * sl.T * sh.H * sh.Dv);
                if (be->upload(be, dh, dhz, x.nv, MEM_ACT) || m_fwd_bwd(&r) || be->sync(be)) die("%s", mn_last_error());
                free(dhz);
                MExact e = m_exact(&x, sl, &r.o);
                size_t rows = (size_t)sl.T, H = (size_t)sh.H, H2 = (size_t)sl.heads;
                printf(" %8.2e %8.2e %8.2e %8.2e %8.2e %8.2e |",
                       dev_err(be, h, x.nv, MEM_ACT, rows, H * sh.Dv, H2 * sh.Dv, e.h),
                       dev_err(be, dq, x.nk, MEM_ACT, rows, H * sh.Dk, H2 * sh.Dk, e.dq),
                       dev_err(be, dk, x.nk, MEM_ACT, rows, H * sh.Dk, H2 * sh.Dk, e.dk),
                       dev_err(be, dv, x.nv, MEM_ACT, rows, H * sh.Dv, H2 * sh.Dv, e.dv),
                       dev_err(be, dfg, x.ng, MEM_F32, rows, H, H2, e.dfg), dev_err(be, dig, x.ng, MEM_F32, rows, H, H2, e.dig));
                m_exact_free(&e);
            } else {
                printf(" %8s %8s %8s %8s %8s %8s |", "-", "-", "-", "-", "-", "-");
            }
            if (gpu) printf(" %6.2f\n", mem);
            else printf(" %6s\n", "-");
        }
        fflush(stdout);
        void *bufs[] = {q, k, v, fg, ig, dh, h, nq, m, dq, dk, dv, dfg, dig};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(be, bufs[i]);
        m_inputs_free(&x);
    }
}

// --- sLSTM ---------------------------------------------------------------------------------------

typedef struct {
    const Backend *be;
    SlstmDims d;
    SlstmFwd f;
    SlstmBwd b;
} SRun;

static int s_fwd(void *p) {
    SRun *r = p;
    return r->be->slstm->fwd(r->be, &r->d, &r->f);
}

static int s_fwd_bwd(void *p) {
    SRun *r = p;
    MN_TRY(r->be->slstm->fwd(r->be, &r->d, &r->f));
    return r->be->slstm->bwd(r->be, &r->d, &r->b);  // dR accumulates over the calls: harmless for the timing
}

// The float64 reference on the slice: h [T2][H2 Dh], dx [T2][4][H2 Dh], dR [H2][Dh][4][Dh].
typedef struct {
    double *h, *dx, *dr;
} SExact;

static SExact s_exact(const SIn *s, Slice sl) {
    const Backend *ref = backend_ref();
    SlstmDims d = s->d, d2 = {1, sl.T, sl.heads, d.Dh, d.clip};
    size_t D = (size_t)d.H * d.Dh, D2 = (size_t)sl.heads * d.Dh, T2 = (size_t)sl.T, nr2 = D2 * 4 * d.Dh;
    double *x = slice_rows(s->x, 4 * T2, D, D2), *dh = slice_rows(s->dh, T2, D, D2);
    double *cache = xcalloc(4 * T2 * D2, 8);
    SExact e = {xcalloc(T2 * D2, 8), xcalloc(4 * T2 * D2, 8), xcalloc(nr2, 8)};
    SlstmFwd f = {x, s->r, NULL, e.h, cache, NULL};  // R's first H2 heads are its first nr2 values
    SlstmBwd b = {x, s->r, cache, dh, e.dx, e.dr};
    if (ref->slstm->fwd(ref, &d2, &f) || ref->slstm->bwd(ref, &d2, &b)) die("%s", mn_last_error());
    free(x); free(dh); free(cache);
    return e;
}

static void bench_slstm(const Backend *be, const Shape *shapes, int ns, int reps, double gmean, int err_heads,
                        int err_T, Round act) {
    int gpu = be->device_mem_used != NULL;
    printf("\nsLSTM core (SlstmOps) on %s: %s x h dh dx, R %s (the values the kernels multiply with), float32 "
           "states and cache; no gradient clipping\n", be->name, gpu ? "bf16" : "float32", gpu ? "bf16" : "float32");
    if (err_heads > 0)
        printf("rel err of h, dx, dR against the float64 reference backend on a slice: b = 0, the first %d heads, %s "
               "(dh zero outside it)\n", err_heads, tokens_of(err_T));
    printf("%-20s | %9s %11s | %9s %9s %11s | %8s %8s %8s | %6s\n", "B x T x H x Dh", "fwd ms", "fwd tok/s", "f+b ms",
           "f+b strm", "f+b tok/s", "err h", "err dx", "err dR", "mem GB");
    for (int si = 0; si < ns; si++) {
        Shape sh = shapes[si];
        char name[48];
        snprintf(name, sizeof name, "%dx%dx%dx%d", sh.B, sh.T, sh.H, sh.Dk);
        SlstmDims d = {sh.B, sh.T, sh.H, sh.Dk, 0};
        if (be->slstm->supports && be->slstm->supports(be, &d)) {
            printf("%-20s | unsupported: %s\n", name, mn_last_error());
            continue;
        }
        SIn s;
        s_inputs(&s, d, 201 + (uint64_t)si, gmean, act);
        void *x = up(be, s.x, s.nx, MEM_ACT), *r = up(be, s.r, s.nr, MEM_PARAM), *dh = up(be, s.dh, s.nh, MEM_ACT);
        void *h = up(be, NULL, s.nh, MEM_ACT), *cache = up(be, NULL, s.nx, MEM_F32);
        void *dx = up(be, NULL, s.nx, MEM_ACT), *dr = up(be, NULL, s.nr, MEM_F32);
        SRun run = {be, d, {x, r, NULL, h, cache, NULL}, {x, r, cache, dh, dx, dr}};
        if (s_fwd_bwd(&run) || be->sync(be)) {
            printf("%-20s | failed: %s\n", name, mn_last_error());
        } else {
            double tf = bench_median_time(be, reps, s_fwd, &run), tb = bench_median_time(be, reps, s_fwd_bwd, &run);
            double tbs = bench_stream_time(be, reps, s_fwd_bwd, &run), mem = mem_gb(be), ntok = (double)sh.B * sh.T;
            printf("%-20s | %9.3f %11.0f | %9.3f %9.3f %11.0f |", name, 1e3 * tf, ntok / tf, 1e3 * tb, 1e3 * tbs,
                   ntok / tb);
            fflush(stdout);
            if (err_heads > 0) {
                Slice sl = slice_of(sh.H, sh.T, err_heads, err_T);
                size_t D = (size_t)sh.H * sh.Dk, D2 = (size_t)sl.heads * sh.Dk, T2 = (size_t)sl.T;
                double *dhz = xcalloc(s.nh, 8);  // the first sequence's first T2 tokens
                memcpy(dhz, s.dh, sizeof(double) * T2 * D);
                be->zero(be, dr, s.nr, MEM_F32);
                if (be->upload(be, dh, dhz, s.nh, MEM_ACT) || s_fwd_bwd(&run) || be->sync(be))
                    die("%s", mn_last_error());
                free(dhz);
                SExact e = s_exact(&s, sl);
                printf(" %8.2e %8.2e %8.2e |", dev_err(be, h, s.nh, MEM_ACT, T2, D, D2, e.h),
                       dev_err(be, dx, s.nx, MEM_ACT, 4 * T2, D, D2, e.dx),
                       dev_err(be, dr, s.nr, MEM_F32, 1, s.nr, D2 * 4 * sh.Dk, e.dr));
                free(e.h); free(e.dx); free(e.dr);
            } else {
                printf(" %8s %8s %8s |", "-", "-", "-");
            }
            if (gpu) printf(" %6.2f\n", mem);
            else printf(" %6s\n", "-");
        }
        fflush(stdout);
        void *bufs[] = {x, r, dh, h, cache, dx, dr};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(be, bufs[i]);
        s_inputs_free(&s);
    }
}

int bench_xlstm(int argc, char **argv) {
    const char *backend = "cpu", *mlstm = "8x2048x16x128,16x2048x8x64", *slstm = "16x1024x4x192", *form = "auto";
    int reps = 0, chunk = 0, err_heads = 2, err_T = 2048;
    float gmean = 3.0f;
    Option opts[] = {
        {"backend", OPT_STRING, &backend, "cpu or cuda"},
        {"mlstm", OPT_STRING, &mlstm, "mLSTM shapes BxTxHxDk[xDv], comma-separated (Dv = Dk if left out), or \"\""},
        {"slstm", OPT_STRING, &slstm, "sLSTM shapes BxTxHxDh (D = H Dh cells), comma-separated, or \"\""},
        {"form", OPT_STRING, &form, "mLSTM form: auto (the backend's choice), chunk or recurrent"},
        {"chunk", OPT_INT, &chunk, "mLSTM chunk size of the chunkwise form (0: the backend's)", 0, 1 << 16},
        {"reps", OPT_INT, &reps, "timed repetitions, median reported (0: 3 on cpu, 10 on cuda; at most 64)", 0, 64},
        {"gmean", OPT_FLOAT, &gmean, "forget-gate pre-activations ~ N(gmean, 1): larger is longer memory", -20, 20},
        {"err-heads", OPT_INT, &err_heads, "heads of the error slice (first sequence; 0: no errors)", 0, 1 << 16},
        {"err-T", OPT_INT, &err_T, "tokens of the error slice (0: all)", 0, 1 << 24},
    };
    int st = parse_args(argc, argv, "[options]", opts, sizeof opts / sizeof opts[0], NULL, NULL, 0);
    if (st) return st == 2 ? 0 : 1;
    Shape ms[8], ss[8];
    int nm = parse_shapes(mlstm, ms, 8, 1), nsl = parse_shapes(slstm, ss, 8, 0);
    if (nm < 0) die("--mlstm: expected BxTxHxDk[xDv][,...] (at most 8), positive sizes, or \"\"; got '%s'", mlstm);
    if (nsl < 0) die("--slstm: expected BxTxHxDh[,...] (at most 8), positive sizes, or \"\"; got '%s'", slstm);
    MnForm f = !strcmp(form, "auto") ? MN_FORM_AUTO : !strcmp(form, "chunk") ? MN_FORM_CHUNK
               : !strcmp(form, "recurrent") ? MN_FORM_RECURRENT : (MnForm)-1;
    if ((int)f < 0) die("--form: expected auto, chunk or recurrent, got '%s'", form);
    if (strcmp(backend, "cpu") && strcmp(backend, "cuda")) die("--backend: expected cpu or cuda, got '%s'", backend);
    const Backend *be = backend_by_name(backend);
    if (!be) die("%s", mn_last_error());
    int gpu = !strcmp(backend, "cuda");
    if (!reps) reps = gpu ? 10 : 3;
    if (gpu)
        printf("xLSTM cores on the GPU (cuda backend); bf16 matrix product 8192^3 in the same run: %.0f TFLOP/s\n",
               bench_gemm_tflops(be, 8192));
    else
        printf("xLSTM cores on the CPU, %d threads; sgemm 2048^3 in the same run: %.1f GFLOP/s\n", omp_get_max_threads(),
               bench_sgemm_gflops(2048, 3));
    printf("fwd ms, f+b ms: median of %d single calls, each waited for; f+b strm: %d calls back to back, one wait "
           "(as triton.testing.do_bench); tok/s = B T / time\n", reps, reps);
    printf("inputs: unit-norm q, k rows; v, dh ~ N(0,1); f = logsigmoid(N(%g,1)), i ~ N(0,1); sLSTM x ~ N(0,1) "
           "(f: N(%g,1)), R ~ N(0,1/Dh)\n", (double)gmean, (double)gmean);
    Round act = gpu ? round_bf16 : round_f32;
    if (nm > 0) {
        if (!be->mlstm || !be->mlstm->fwd || !be->mlstm->bwd)
            printf("\nmLSTM core: the %s backend of this build has none\n", be->name);
        else
            bench_mlstm(be, ms, nm, (MlstmOpts){0, 1e-6f, f, chunk}, reps, gmean, err_heads, err_T, act);
    }
    if (nsl > 0) {
        if (!be->slstm || !be->slstm->fwd || !be->slstm->bwd)
            printf("\nsLSTM core: the %s backend of this build has none\n", be->name);
        else
            bench_slstm(be, ss, nsl, reps, gmean, err_heads, err_T, act);
    }
    return 0;
}
