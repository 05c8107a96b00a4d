/*
 * `mesanet bench mesa`: the Mesa layer core on this CPU, both forms, fixed
 * steps and tolerance mode, forward and forward+backward, beside the sgemm
 * rate measured in the same run.
 *
 * Efficiency = minimal flops / time / sgemm rate, where the minimal flops per
 * token and head are those of the recurrent form with the steps actually used:
 *   forward:  2 Dk^2 per CG step + 2 Dk^2 + 2 Dv Dk (state updates) + 2 Dv Dk (read-out)
 *   backward: 2 Dk^2 per CG step of the second solve + 2 Dk^2 + 2 Dv Dk (state
 *             recompute) + 2 Dv Dk (G^T delta) + 2 Dk^2 (H x) + 2 Dk^2 + 2 Dv Dk
 *             (adjoint updates) + 4 Dv Dk + 4 Dk^2 (the four adjoint products)
 * Timing is the median of --reps runs after one warm-up.
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "core/common.h"
#include "tools/commands.h"

// Layer-like random inputs (spec section 7).
typedef struct {
    MnSeqDims d;
    float *q, *k, *v, *g, *beta, *lambda, *o, *x, *dout, *dq, *dk, *dv, *dg, *dbeta, *dlambda;
    int *steps_f, *steps_b;
} Inputs;

static float *to_float(const double *x, size_t n) {
    float *y = xcalloc(n, 4);
    for (size_t i = 0; i < n; i++) y[i] = (float)x[i];
    return y;
}

static void inputs_init(Inputs *in, MnSeqDims d, float lambda, float gmean) {
    BenchMesaInputs h;
    bench_mesa_inputs(&h, d, 42, gmean, lambda, 0);
    size_t ntok = h.ng, nk = h.nk, nv = h.nv;
    in->d = d;
    in->q = to_float(h.q, nk);
    in->k = to_float(h.k, nk);
    in->v = to_float(h.v, nv);
    in->g = to_float(h.g, ntok);
    in->beta = to_float(h.beta, ntok);
    in->lambda = to_float(h.lambda, (size_t)d.H * d.Dk);
    in->dout = to_float(h.dout, nv);
    bench_mesa_inputs_free(&h);
    in->o = xcalloc(nv, 4);
    in->x = xcalloc(nk, 4);
    in->dq = xcalloc(nk, 4);
    in->dk = xcalloc(nk, 4);
    in->dv = xcalloc(nv, 4);
    in->dg = xcalloc(ntok, 4);
    in->dbeta = xcalloc(ntok, 4);
    in->dlambda = xcalloc((size_t)d.H * d.Dk, 4);
    in->steps_f = xcalloc(ntok, sizeof(int));
    in->steps_b = xcalloc(ntok, sizeof(int));
}

static void inputs_free(Inputs *in) {
    float *p[] = {in->q, in->k, in->v, in->g, in->beta, in->lambda, in->o, in->x, in->dout,
                  in->dq, in->dk, in->dv, in->dg, in->dbeta, in->dlambda};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
    free(in->steps_f);
    free(in->steps_b);
}

static void run_forward(Inputs *in, const MnSolver *s) {
    MnMesaFwd f = {.q = in->q, .k = in->k, .v = in->v, .g = in->g, .beta = in->beta, .lambda = in->lambda,
                   .o = in->o, .x = in->x, .steps = in->steps_f};
    if (mn_mesa_forward(&in->d, s, &f)) die("%s", mn_last_error());
}

static void run_backward(Inputs *in, const MnSolver *s) {
    MnMesaBwd b = {.q = in->q, .k = in->k, .v = in->v, .g = in->g, .beta = in->beta, .lambda = in->lambda,
                   .x = in->x, .o = in->o, .dout = in->dout, .dq = in->dq, .dk = in->dk, .dv = in->dv,
                   .dg = in->dg, .dbeta = in->dbeta, .dlambda = in->dlambda, .steps = in->steps_b};
    if (mn_mesa_backward(&in->d, s, &b)) die("%s", mn_last_error());
}

static double mean_steps(const int *steps, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += steps[i];
    return s / (double)n;
}

typedef struct {
    double fwd_s, fwdbwd_s, steps_f, steps_b, flops_f, flops_b;
} Timing;

static Timing time_case(Inputs *in, const MnSolver *s, int reps) {
    double tf[reps], tb[reps];
    run_forward(in, s);  // warm-up
    for (int i = 0; i < reps; i++) {
        double t = mn_now();
        run_forward(in, s);
        tf[i] = mn_now() - t;
        t = mn_now();
        run_backward(in, s);
        tb[i] = tf[i] + mn_now() - t;
    }
    const MnSeqDims *d = &in->d;
    size_t ntok = (size_t)d->B * d->T * d->H;
    double kk = (double)d->Dk * d->Dk, vk = (double)d->Dv * d->Dk;
    Timing r = {bench_median(tf, reps), bench_median(tb, reps), mean_steps(in->steps_f, ntok),
                mean_steps(in->steps_b, ntok), 0, 0};
    r.flops_f = (double)ntok * (2 * kk * r.steps_f + 2 * kk + 4 * vk);
    r.flops_b = (double)ntok * (2 * kk * r.steps_b + 6 * kk + 10 * vk) + 4 * kk * (double)ntok;
    return r;
}

int bench_mesa(int argc, char **argv) {
    int B = 4, T = 1024, H = 4, steps = 30, reps = 3;
    float tol = 1e-4f, lambda = 1.0f, gmean = 3.0f;
    const char *dims = "64,128", *chunks = "16,32,64", *forms = "chunk,recurrent", *out = NULL;
    Option opts[] = {
        {"B", OPT_INT, &B, "sequences", 1, 4096},
        {"T", OPT_INT, &T, "tokens per sequence", 1, 1 << 20},
        {"H", OPT_INT, &H, "heads", 1, 1024},
        {"D", OPT_STRING, &dims, "head sizes to run (Dk = Dv), comma-separated"},
        {"chunks", OPT_STRING, &chunks, "chunk sizes of the chunkwise form, comma-separated"},
        {"forms", OPT_STRING, &forms, "forms to run: chunk, recurrent or both"},
        {"steps", OPT_INT, &steps, "CG steps (fixed mode; the cap in tolerance mode)", 1, 10000},
        {"tol", OPT_FLOAT, &tol, "tolerance of the tolerance mode", 0, 1},
        {"reps", OPT_INT, &reps, "timed repetitions (median reported)", 1, 10000},
        {"lambda", OPT_FLOAT, &lambda, "ridge lambda of every channel (1: the initial value; 0.25: its lower bound)", 0.01, 100},
        {"gmean", OPT_FLOAT, &gmean, "forget gates are sigmoid(N(gmean, 1)): larger is longer memory", -20, 20},
        {"out", OPT_STRING, &out, "also write the results as JSON to this file"},
    };
    int st = parse_args(argc, argv, "[options]", opts, sizeof opts / sizeof opts[0], NULL, NULL, 0);
    if (st) return st == 2 ? 0 : 1;
    int dlist[8], clist[8];
    int nd = bench_parse_ints(dims, dlist, 8), nc = bench_parse_ints(chunks, clist, 8);
    if (nd <= 0 || nc <= 0 || reps < 1) {
        fprintf(stderr, "mesanet bench mesa: --D and --chunks take comma-separated positive integers, --reps >= 1\n");
        return 1;
    }
    double sgemm = bench_sgemm_gflops(2048, 5);
    printf("Mesa core on the CPU: B=%d T=%d H=%d, lambda %g, gates sigmoid(N(%g,1)), %d threads; sgemm (2048^3, same "
           "threads): %.1f GFLOP/s\n", B, T, H, (double)lambda, (double)gmean, omp_get_max_threads(), sgemm);
    printf("efficiency = minimal flops / time / sgemm rate (see bench/bench_mesa.c)\n\n");
    printf("%4s %-10s %3s %-10s | %9s %6s %6s | %9s %6s %6s\n", "D", "form", "C", "mode", "fwd ms", "steps", "eff",
           "f+b ms", "steps", "eff");
    FILE *js = NULL;
    if (out) {
        js = fopen(out, "w");
        if (!js) die("%s: cannot open for writing", out);
        fprintf(js, "{\"B\": %d, \"T\": %d, \"H\": %d, \"threads\": %d, \"sgemm_gflops\": %.2f, \"results\": [\n", B, T,
                H, omp_get_max_threads(), sgemm);
    }
    int first = 1;
    for (int di = 0; di < nd; di++) {
        Inputs in;
        inputs_init(&in, (MnSeqDims){B, T, H, dlist[di], dlist[di]}, lambda, gmean);
        for (int form = MN_FORM_CHUNK; form <= MN_FORM_RECURRENT; form++) {
            if (!strstr(forms, form == MN_FORM_CHUNK ? "chunk" : "recurrent")) continue;
            for (int ci = 0; ci < (form == MN_FORM_CHUNK ? nc : 1); ci++)
                for (int mode = 0; mode < 2; mode++) {
                    MnSolver s = mn_solver_default();
                    s.form = (MnForm)form;
                    s.chunk = form == MN_FORM_CHUNK ? clist[ci] : 64;
                    s.max_steps = steps;
                    s.tol = mode ? tol : 0;
                    Timing t = time_case(&in, &s, reps);
                    double ef = t.flops_f / t.fwd_s / 1e9 / sgemm, eb = (t.flops_f + t.flops_b) / t.fwdbwd_s / 1e9 / sgemm;
                    char modename[32];
                    if (mode)
                        snprintf(modename, sizeof modename, "tol %.0e", (double)tol);
                    else
                        snprintf(modename, sizeof modename, "%d steps", steps);
                    char cs[16] = "-";
                    if (form == MN_FORM_CHUNK) snprintf(cs, sizeof cs, "%d", s.chunk);
                    printf("%4d %-10s %3s %-10s | %9.1f %6.1f %5.1f%% | %9.1f %6.1f %5.1f%%\n", dlist[di],
                           form == MN_FORM_CHUNK ? "chunk" : "recurrent", cs, modename, 1e3 * t.fwd_s, t.steps_f,
                           100 * ef, 1e3 * t.fwdbwd_s, t.steps_b, 100 * eb);
                    fflush(stdout);
                    if (js) {
                        fprintf(js, "%s  {\"D\": %d, \"form\": \"%s\", \"chunk\": %d, \"tol\": %g, \"max_steps\": %d, "
                                    "\"fwd_ms\": %.3f, \"fwd_steps\": %.2f, \"fwd_eff\": %.4f, \"fwdbwd_ms\": %.3f, "
                                    "\"bwd_steps\": %.2f, \"fwdbwd_eff\": %.4f}",
                                first ? "" : ",\n", dlist[di], form == MN_FORM_CHUNK ? "chunk" : "recurrent", s.chunk,
                                (double)s.tol, steps, 1e3 * t.fwd_s, t.steps_f, ef, 1e3 * t.fwdbwd_s, t.steps_b, eb);
                        first = 0;
                    }
                }
        }
        inputs_free(&in);
    }
    if (js) {
        fprintf(js, "\n]}\n");
        if (fclose(js)) die("%s: write failed", out);
    }
    return 0;
}
