/*
 * `mesanet bench mesa-gpu`: the Mesa core on the GPU (the cuda backend) at the
 * shapes of the performance anchors: forward and forward+backward time, mean
 * CG steps, TFLOP/s against the bf16 matrix-product ceiling measured in the
 * same run, the relative error of o against the exact float64 solve (first
 * sequence, first two heads, first 512 tokens), and a decode step.
 * bench/fla_bench.py measures fla's Triton kernels on the same shapes.
 *
 * Flops per CG step, chunk (C = 64) and head, as in the anchors: 4 C^2 D + 2 C D^2.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "backends/registry.h"
#include "core/backend.h"
#include "core/common.h"
#include "ref/ref.h"
#include "tools/commands.h"

static void *up(const Backend *be, const double *x, size_t n, MemKind k) {
    void *p = be->alloc(be, n, k);
    if (!p || be->upload(be, p, x, n, k)) die("%s", mn_last_error());
    return p;
}

// The exact float64 forward on (b = 0, h < 2, t < 512) of the inputs, from
// the given initial states (or zero): o [t][h][Dv] and the final states.
static void exact_first(const BenchMesaInputs *h, const double *h0, const double *g0, double *o, double *hT, double *gT) {
    MnSeqDims d = h->d;
    int T = d.T < 512 ? d.T : 512, H = d.H < 2 ? d.H : 2;
    MnSeqDims s = {1, T, H, d.Dk, d.Dv};
    size_t nk = (size_t)T * H * d.Dk, nv = (size_t)T * H * d.Dv, ng = (size_t)T * H;
    double *q = xcalloc(nk, 8), *k = xcalloc(nk, 8), *v = xcalloc(nv, 8), *g = xcalloc(ng, 8), *b = xcalloc(ng, 8);
    double *x = xcalloc(nk, 8);
    for (int t = 0; t < T; t++)
        for (int hh = 0; hh < H; hh++) {
            size_t src = (size_t)t * d.H + hh, dst = (size_t)t * H + hh;
            memcpy(q + dst * d.Dk, h->q + src * d.Dk, sizeof(double) * d.Dk);
            memcpy(k + dst * d.Dk, h->k + src * d.Dk, sizeof(double) * d.Dk);
            memcpy(v + dst * d.Dv, h->v + src * d.Dv, sizeof(double) * d.Dv);
            g[dst] = h->g[src];
            b[dst] = h->beta[src];
        }
    MesaFwd64 fw = {q, k, v, g, b, h->lambda, h0, g0, NULL, o, x, hT, gT, NULL};
    if (ref_mesa_forward(&s, NULL, &fw)) die("%s", mn_last_error());
    free(q); free(k); free(v); free(g); free(b); free(x);
}

// Relative L2 error of the GPU's o [B,T,H,Dv] against `exact` [t][h][Dv] on (b = 0, h < 2, t < 512).
static double rel_error_first(const Backend *be, const BenchMesaInputs *h, const void *go, const double *exact) {
    MnSeqDims d = h->d;
    int T = d.T < 512 ? d.T : 512, H = d.H < 2 ? d.H : 2;
    double *all = xcalloc(h->nv, 8), num = 0, den = 0;
    if (be->download(be, all, go, h->nv, MEM_ACT)) die("%s", mn_last_error());
    for (int t = 0; t < T; t++)
        for (int hh = 0; hh < H; hh++)
            for (int i = 0; i < d.Dv; i++) {
                double a = all[((size_t)t * d.H + hh) * d.Dv + i], e = exact[((size_t)t * H + hh) * d.Dv + i];
                num += (a - e) * (a - e);
                den += e * e;
            }
    free(all);
    return sqrt(num / den);
}

// Relative L2 error of o against the exact solve, on (b = 0, h < 2, t < 512).
static double accuracy(const Backend *be, const BenchMesaInputs *h, const void *go) {
    double *o = xcalloc(h->nv, 8);
    exact_first(h, NULL, NULL, o, NULL, NULL);
    double e = rel_error_first(be, h, go, o);
    free(o);
    return e;
}

// The same for a decode step: `one` (T = 1) after the prefill `pre`.
static double decode_accuracy(const Backend *be, const BenchMesaInputs *pre, const BenchMesaInputs *one, const void *go) {
    MnSeqDims d = pre->d;
    size_t ns = (size_t)2 * d.Dk * d.Dk;
    double *o = xcalloc(pre->nv, 8), *hs = xcalloc(ns, 8), *gs = xcalloc(ns, 8);
    exact_first(pre, NULL, NULL, o, hs, gs);
    exact_first(one, hs, gs, o, NULL, NULL);
    double e = rel_error_first(be, one, go, o);
    free(o); free(hs); free(gs);
    return e;
}

// bf16 matrix-product ceiling: an n x n x n product through the backend's linear op.
double bench_gemm_tflops(const Backend *be, int n) {
    void *a = be->alloc(be, (size_t)n * n, MEM_ACT), *w = be->alloc(be, (size_t)n * n, MEM_PARAM);
    void *c = be->alloc(be, (size_t)n * n, MEM_ACT);
    double *h = xcalloc((size_t)n * n, 8);
    for (size_t i = 0; i < (size_t)n * n; i++) h[i] = (double)((i * 2654435761u) % 1000) / 1000.0 - 0.5;
    be->upload(be, a, h, (size_t)n * n, MEM_ACT);
    be->upload(be, w, h, (size_t)n * n, MEM_PARAM);
    be->linear_fwd(be, c, a, w, NULL, n, n, n);
    be->sync(be);
    double best = 1e30;
    for (int r = 0; r < 10; r++) {
        double t = mn_now();
        be->linear_fwd(be, c, a, w, NULL, n, n, n);
        be->sync(be);
        best = fmin(best, mn_now() - t);
    }
    be->free(be, a);
    be->free(be, w);
    be->free(be, c);
    free(h);
    return 2.0 * n * n * (double)n / best / 1e12;
}

typedef struct {
    const Backend *be;
    MnSeqDims d;
    MnSolver s;
    MnMesaFwd f;
    MnMesaBwd b;
} Run;

static int run_fwd(void *p) {
    Run *r = p;
    return r->be->mesa->fwd(r->be, &r->d, &r->s, &r->f);
}

static int run_fwd_bwd(void *p) {
    Run *r = p;
    MN_TRY(r->be->mesa->fwd(r->be, &r->d, &r->s, &r->f));
    return r->be->mesa->bwd(r->be, &r->d, &r->s, &r->b);
}

int bench_mesa_gpu(int argc, char **argv) {
    const char *shapes_s = "8x2048x16x128,4x4096x16x128,16x2048x8x64", *decode_s = "1,16,128";
    const char *init_s = "zero", *precond_s = "none";
    int steps = 30, reps = 10;
    float tol = 1e-4f;
    Option opts[] = {
        {"shapes", OPT_STRING, &shapes_s, "BxTxHxD shapes, comma-separated"},
        {"steps", OPT_INT, &steps, "CG steps (the cap in tolerance mode)", 1, 10000},
        {"tol", OPT_FLOAT, &tol, "tolerance of the tolerance mode", 0, 1},
        {"reps", OPT_INT, &reps, "timed repetitions (median reported)", 1, 10000},
        {"decode", OPT_STRING, &decode_s, "batch sizes of the decode step (H=16, D=128), or \"\""},
        {"init", OPT_STRING, &init_s, "CG's initial guess: zero or jacobi (q / diag A)"},
        {"precond", OPT_STRING, &precond_s, "CG's preconditioner: none or jacobi"},
    };
    int st = parse_args(argc, argv, "[options]", opts, sizeof opts / sizeof opts[0], NULL, NULL, 0);
    if (st) return st == 2 ? 0 : 1;
    MnSolver solver = mn_solver_default();
    if (!strcmp(init_s, "jacobi")) solver.init = MN_CG_INIT_JACOBI;
    else if (strcmp(init_s, "zero")) die("--init: expected zero or jacobi, got '%s'", init_s);
    if (!strcmp(precond_s, "jacobi")) solver.precond = MN_PRECOND_JACOBI;
    else if (strcmp(precond_s, "none")) die("--precond: expected none or jacobi, got '%s'", precond_s);
    BenchShape shapes[8];
    int ns = bench_parse_shapes(shapes_s, shapes, 8);
    if (ns <= 0) die("--shapes: expected BxTxHxD[,BxTxHxD...]");
    const Backend *be = backend_by_name("cuda");
    if (!be) die("%s", mn_last_error());
    double ceiling = bench_gemm_tflops(be, 8192);
    printf("Mesa core on the GPU (cuda backend); bf16 matrix product 8192^3 in the same run: %.0f TFLOP/s\n", ceiling);
    // f+b ms: the median of single calls, each timed on the host from its launch to its completion;
    // f+b strm: the mean over calls launched back to back, one synchronization at the end, which
    // leaves out the launch and the wait as triton.testing.do_bench's events leave them out of fla's
    printf("%-16s %-9s | %9s %6s %8s | %9s %6s | %9s | %9s\n", "B x T x H x D", "CG", "fwd ms", "steps", "TFLOP/s",
           "f+b ms", "steps", "rel err", "f+b strm");
    for (int si = 0; si < ns; si++) {
        BenchShape sh = shapes[si];
        MnSeqDims d = {sh.B, sh.T, sh.H, sh.D, sh.D};
        BenchMesaInputs h;
        bench_mesa_inputs(&h, d, 11 + si, 3, 1, 1);
        void *q = up(be, h.q, h.nk, MEM_ACT), *k = up(be, h.k, h.nk, MEM_ACT), *v = up(be, h.v, h.nv, MEM_ACT);
        void *g = up(be, h.g, h.ng, MEM_F32), *b = up(be, h.beta, h.ng, MEM_F32);
        void *lam = up(be, h.lambda, (size_t)sh.H * sh.D, MEM_F32), *dout = up(be, h.dout, h.nv, MEM_ACT);
        void *o = be->alloc(be, h.nv, MEM_ACT), *x = be->alloc(be, h.nk, MEM_ACT);
        void *dq = be->alloc(be, h.nk, MEM_ACT), *dk = be->alloc(be, h.nk, MEM_ACT), *dv = be->alloc(be, h.nv, MEM_ACT);
        void *dg = be->alloc(be, h.ng, MEM_F32), *db = be->alloc(be, h.ng, MEM_F32);
        void *dl = be->alloc(be, (size_t)sh.H * sh.D, MEM_F32);
        void *steps_f = be->alloc(be, h.ng, MEM_I32), *steps_b = be->alloc(be, h.ng, MEM_I32);  // on the device
        int32_t *hs_f = xcalloc(h.ng, sizeof(int32_t)), *hs_b = xcalloc(h.ng, sizeof(int32_t));
        for (int mode = 0; mode < 2; mode++) {
            Run r = {be, d, solver};
            r.s.max_steps = steps;
            r.s.tol = mode ? tol : 0;
            MnMesaFwd f = {q, k, v, g, b, lam, NULL, NULL, NULL, o, x, NULL, NULL, steps_f};
            MnMesaBwd bw = {q, k, v, g, b, lam, NULL, NULL, x, o, dout, NULL, NULL, dq, dk, dv, dg, db, dl, NULL, NULL, steps_b};
            r.f = f;
            r.b = bw;
            double tf = bench_median_time(be, reps, run_fwd, &r), tb = bench_median_time(be, reps, run_fwd_bwd, &r);
            double tbs = bench_stream_time(be, reps, run_fwd_bwd, &r);
            double sf = 0, sb = 0;
            if (be->download_i32(be, hs_f, steps_f, h.ng) || be->download_i32(be, hs_b, steps_b, h.ng))
                die("%s", mn_last_error());
            for (size_t i = 0; i < h.ng; i++) {
                sf += hs_f[i] / (double)h.ng;
                sb += hs_b[i] / (double)h.ng;
            }
            double C = 64, flops = sf * (4 * C * C * sh.D + 2 * C * sh.D * sh.D) * ((double)h.ng / C);
            double err = accuracy(be, &h, o);
            char cg[32], name[40];
            if (mode) snprintf(cg, sizeof cg, "tol %.0e", (double)tol);
            else snprintf(cg, sizeof cg, "%d steps", steps);
            snprintf(name, sizeof name, "%dx%dx%dx%d", sh.B, sh.T, sh.H, sh.D);
            printf("%-16s %-9s | %9.3f %6.1f %8.1f | %9.3f %6.1f | %9.2e | %9.3f\n", name, cg, 1e3 * tf, sf,
                   flops / tf / 1e12, 1e3 * tb, sb, err, 1e3 * tbs);
            fflush(stdout);
        }
        void *bufs[] = {q, k, v, g, b, lam, dout, o, x, dq, dk, dv, dg, db, dl, steps_f, steps_b};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(be, bufs[i]);
        free(hs_f);
        free(hs_b);
        bench_mesa_inputs_free(&h);
    }

    // Decode: one token for B sequences, H = 16, D = 128, after a 512-token prefill.
    int bs[8], nb = *decode_s ? bench_parse_ints(decode_s, bs, 8) : 0;
    if (nb < 0) die("--decode: expected comma-separated positive batch sizes, or \"\"");
    if (nb) printf("\ndecode step (H=16, D=128, after a 512-token prefill; rel err of the first step):\n%6s %-9s | %10s %12s %6s | %9s\n", "B", "CG",
                   "ms/token", "tokens/s", "steps", "rel err");
    for (int bi = 0; bi < nb; bi++) {
        int B = bs[bi], H = 16, D = 128, T0 = 512;
        BenchMesaInputs pre, one;
        bench_mesa_inputs(&pre, (MnSeqDims){B, T0, H, D, D}, 5, 3, 1, 1);
        bench_mesa_inputs(&one, (MnSeqDims){B, 1, H, D, D}, 6, 3, 1, 1);
        size_t ns_h = (size_t)B * H * D * D;
        void *q = up(be, pre.q, pre.nk, MEM_ACT), *k = up(be, pre.k, pre.nk, MEM_ACT), *v = up(be, pre.v, pre.nv, MEM_ACT);
        void *g = up(be, pre.g, pre.ng, MEM_F32), *b = up(be, pre.beta, pre.ng, MEM_F32), *lam = up(be, pre.lambda, (size_t)H * D, MEM_F32);
        void *o = be->alloc(be, pre.nv, MEM_ACT), *x = be->alloc(be, pre.nk, MEM_ACT);
        void *hs = be->alloc(be, ns_h, MEM_F32), *gs = be->alloc(be, ns_h, MEM_F32);
        MnSolver s = mn_solver_default();
        MnMesaFwd f = {q, k, v, g, b, lam, NULL, NULL, NULL, o, x, hs, gs, NULL};
        if (be->mesa->fwd(be, &pre.d, &s, &f)) die("%s", mn_last_error());
        void *q1 = up(be, one.q, one.nk, MEM_ACT), *k1 = up(be, one.k, one.nk, MEM_ACT), *v1 = up(be, one.v, one.nv, MEM_ACT);
        void *g1 = up(be, one.g, one.ng, MEM_F32), *b1 = up(be, one.beta, one.ng, MEM_F32);
        void *o1 = be->alloc(be, one.nv, MEM_ACT), *x1 = be->alloc(be, one.nk, MEM_ACT);
        void *st1 = be->alloc(be, one.ng, MEM_I32);
        int32_t *hst1 = xcalloc(one.ng, sizeof(int32_t));
        for (int mode = 0; mode < 2; mode++) {
            Run r = {be, one.d, mn_solver_default()};
            r.s.max_steps = 30;
            r.s.tol = mode ? tol : 0;
            MnMesaFwd f1 = {q1, k1, v1, g1, b1, lam, hs, gs, NULL, o1, x1, hs, gs, st1};
            r.f = f1;
            // the states after the prefill again (the timed steps of the last mode moved them on), then
            // the CG steps and the accuracy of one step, untimed
            if (be->mesa->fwd(be, &pre.d, &s, &f) || run_fwd(&r)) die("%s", mn_last_error());
            double err = decode_accuracy(be, &pre, &one, o1);
            if (be->download_i32(be, hst1, st1, one.ng)) die("%s", mn_last_error());
            r.f.steps = NULL;  // timed as a stream of steps, as fla's do_bench times its decode step
            double t = bench_stream_time(be, 10 * reps, run_fwd, &r), sm = 0;
            for (size_t i = 0; i < one.ng; i++) sm += hst1[i] / (double)one.ng;
            char cg[32];
            if (mode) snprintf(cg, sizeof cg, "tol %.0e", (double)tol);
            else snprintf(cg, sizeof cg, "30 steps");
            printf("%6d %-9s | %10.3f %12.0f %6.1f | %9.2e\n", B, cg, 1e3 * t, B / t, sm, err);
        }
        void *bufs[] = {q, k, v, g, b, lam, o, x, hs, gs, q1, k1, v1, g1, b1, o1, x1, st1};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(be, bufs[i]);
        free(hst1);
        bench_mesa_inputs_free(&pre);
        bench_mesa_inputs_free(&one);
    }
    return 0;
}
