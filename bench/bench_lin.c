/*
 * `mesanet bench lin`: the gated linear-attention cores (include/mesanet.h:
 * MnLinRule) in the variants the mixers use (src/mixers/linear.c):
 *
 *     gdn       delta rule, gates g and beta      (Gated DeltaNet)
 *     deltanet  delta rule, beta, no g            (DeltaNet)
 *     gla       GLA rule, gates g and beta
 *     mamba2    GLA rule, g, no beta              (Mamba2 / fla's simple GLA)
 *
 * --backend cpu (the default): forward and forward+backward of the chunkwise
 * and the recurrent forms at B x T x H x D (--B --T --H --D), the median of
 * --reps runs after one warm-up, beside the sgemm rate measured in the same
 * run, as `bench mesa` does.
 *
 * --backend cuda: forward and forward+backward at the --shapes, bf16 q, k, v
 * and dout (what the model holds), float32 g and beta; the relative L2 error of
 * o, dq, dk and dv against the float64 reference (src/ref/lin_ref.c) on the
 * first sequence and first two heads, whole length; the device memory in use;
 * and a decode step (one token for B sequences with their states, H = 16,
 * D = 128, after a 512-token prefill), tokens/s. Timing as `bench mesa-gpu`
 * (bench/bench_mesa_gpu.c): host time from launch to completion after a sync,
 * median of --reps; "f+b strm" and the decode step: calls launched back to
 * back, one sync at the end. bench/fla_lin_bench.py measures fla's Triton
 * kernels on the same shapes and prints the same table. --form picks the
 * form of the timed calls: auto (what the mixers run: the chunkwise form
 * from T = 64 on, src/cuda/lin_cuda.cu), chunk or recurrent. --paths picks the
 * chunkwise form's paths, a row each (MESANET_LIN set around the calls):
 * split (the fused kernels with split products: the delta rule's default),
 * bf16 (the fused kernels with one bf16 product for each: the GLA rule's), cublas.
 *
 * Inputs as the layer's (bench_mesa_inputs): unit-norm q and k rows, v and
 * dout ~ N(0, 1), g = log sigmoid(N(gmean, 1)), beta = sigmoid(N(0, 1)); scale 1.
 *
 * Efficiency (cpu) and TFLOP/s (cuda) count the minimal flops of the chunkwise
 * form with chunk C (C = 64 for the recurrent form and on cuda), per token and
 * head, causal halves counted once (a C x C causal product is C^2 D, not 2 C^2 D):
 *   GLA forward:    4 Dk Dv (state update V^T K and the read-out Q S^T)
 *                   + C Dk (Q K^T) + C Dv (the masked scores times V)
 *   DELTA forward:  the GLA's + 2 Dk Dv (W S^T, the state's prediction) + C Dk (K K^T)
 *                   + C Dk + C Dv (the UT transform's T K and T V) + C^2 / 3 (its inverse)
 *   backward:       twice the forward (both operands' gradients of every product),
 *                   so forward+backward = 3x the forward.
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
#include "ref/ref.h"
#include "tools/commands.h"

typedef struct {
    const char *name;
    MnLinRule rule;
    int gated, beta;  // g and beta given (else NULL)
} Variant;

static const Variant VARIANTS[] = {
    {"gdn", MN_LIN_DELTA, 1, 1},
    {"deltanet", MN_LIN_DELTA, 0, 1},
    {"gla", MN_LIN_GLA, 1, 1},
    {"mamba2", MN_LIN_GLA, 1, 0},
};
enum { NVARIANTS = sizeof VARIANTS / sizeof VARIANTS[0] };

// The variants named in "a,b,c" (in VARIANTS' order); -1 if one is unknown.
static int parse_variants(const char *s, const Variant **out) {
    int n = 0, want[NVARIANTS] = {0};
    const char *p = s;
    while (*p) {
        size_t len = strcspn(p, ",");
        int found = 0;
        for (int i = 0; i < NVARIANTS; i++)
            if (strlen(VARIANTS[i].name) == len && !strncmp(p, VARIANTS[i].name, len)) want[i] = found = 1;
        if (!found) return -1;
        p += len;
        if (*p == ',') p++;
    }
    for (int i = 0; i < NVARIANTS; i++)
        if (want[i]) out[n++] = &VARIANTS[i];
    return n;
}

// Minimal flops of the chunkwise forward per token and head (see the top of the file).
static double fwd_flops_per_token(MnLinRule rule, int C, int Dk, int Dv) {
    double kv = (double)Dk * Dv, f = 4 * kv + (double)C * (Dk + Dv);
    if (rule == MN_LIN_DELTA) f += 2 * kv + (double)C * Dk + (double)C * (Dk + Dv) + (double)C * C / 3;
    return f;
}

// --- CPU --------------------------------------------------------------------------------------

typedef struct {
    MnSeqDims d;
    float *q, *k, *v, *g, *beta, *o, *dout, *dq, *dk, *dv, *dg, *dbeta;
} CpuInputs;

static float *to_float(const double *x, size_t n) {
    float *y = xcalloc(n, 4);
    for (size_t i = 0; i < n; i++) y[i] = (float)x[i];
    return y;
}

static void cpu_inputs_init(CpuInputs *in, MnSeqDims d, float gmean) {
    BenchMesaInputs h;
    bench_mesa_inputs(&h, d, 42, gmean, 1, 0);
    in->d = d;
    in->q = to_float(h.q, h.nk);
    in->k = to_float(h.k, h.nk);
    in->v = to_float(h.v, h.nv);
    in->g = to_float(h.g, h.ng);
    in->beta = to_float(h.beta, h.ng);
    in->dout = to_float(h.dout, h.nv);
    in->o = xcalloc(h.nv, 4);
    in->dq = xcalloc(h.nk, 4);
    in->dk = xcalloc(h.nk, 4);
    in->dv = xcalloc(h.nv, 4);
    in->dg = xcalloc(h.ng, 4);
    in->dbeta = xcalloc(h.ng, 4);
    bench_mesa_inputs_free(&h);
}

static void cpu_inputs_free(CpuInputs *in) {
    float *p[] = {in->q, in->k, in->v, in->g, in->beta, in->o, in->dout, in->dq, in->dk, in->dv, in->dg, in->dbeta};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
}

static void cpu_forward(CpuInputs *in, const Variant *var, const MnLinOpts *o) {
    MnLinFwd f = {in->q, in->k, in->v, var->gated ? in->g : NULL, var->beta ? in->beta : NULL, NULL, in->o, NULL};
    if (mn_lin_forward(&in->d, o, &f)) die("%s", mn_last_error());
}

static void cpu_backward(CpuInputs *in, const Variant *var, const MnLinOpts *o) {
    MnLinBwd b = {in->q, in->k, in->v, var->gated ? in->g : NULL, var->beta ? in->beta : NULL, NULL, in->dout, NULL,
                  in->dq, in->dk, in->dv, var->gated ? in->dg : NULL, var->beta ? in->dbeta : NULL, NULL};
    if (mn_lin_backward(&in->d, o, &b)) die("%s", mn_last_error());
}

static int bench_lin_cpu(int B, int T, int H, const char *dims, const char *chunks, const char *forms,
                         const Variant **vars, int nv, int reps, float gmean) {
    int dlist[8], clist[8];
    int nd = bench_parse_ints(dims, dlist, 8), nc = bench_parse_ints(chunks, clist, 8);
    if (nd <= 0 || nc <= 0) {
        fprintf(stderr, "mesanet bench lin: --D and --chunks take comma-separated positive integers\n");
        return 1;
    }
    int want_chunk = strstr(forms, "chunk") != NULL, want_rec = strstr(forms, "recurrent") != NULL;
    if (!want_chunk && !want_rec) {
        fprintf(stderr, "mesanet bench lin: --forms: expected chunk, recurrent or both, got '%s'\n", forms);
        return 1;
    }
    double sgemm = bench_sgemm_gflops(2048, 5);
    printf("gated linear-attention cores on the CPU: B=%d T=%d H=%d, g = log sigmoid(N(%g,1)), %d threads; sgemm "
           "(2048^3, same threads): %.1f GFLOP/s\n", B, T, H, (double)gmean, omp_get_max_threads(), sgemm);
    printf("efficiency = minimal flops of the chunkwise form / time / sgemm rate (see bench/bench_lin.c); median of "
           "%d\n\n", reps);
    printf("%4s %-9s %-10s %3s | %9s %6s | %9s %6s\n", "D", "variant", "form", "C", "fwd ms", "eff", "f+b ms", "eff");
    for (int di = 0; di < nd; di++) {
        CpuInputs in;
        cpu_inputs_init(&in, (MnSeqDims){B, T, H, dlist[di], dlist[di]}, gmean);
        size_t ntok = (size_t)B * T * H;
        for (int vi = 0; vi < nv; vi++)
            for (int form = MN_FORM_CHUNK; form <= MN_FORM_RECURRENT; form++) {
                if (!(form == MN_FORM_CHUNK ? want_chunk : want_rec)) continue;
                for (int ci = 0; ci < (form == MN_FORM_CHUNK ? nc : 1); ci++) {
                    MnLinOpts o = mn_lin_opts_default(vars[vi]->rule);
                    o.form = (MnForm)form;
                    o.chunk = form == MN_FORM_CHUNK ? clist[ci] : 0;
                    double tf[reps], tb[reps];
                    cpu_forward(&in, vars[vi], &o);  // warm-up
                    cpu_backward(&in, vars[vi], &o);
                    for (int r = 0; r < reps; r++) {
                        double t = mn_now();
                        cpu_forward(&in, vars[vi], &o);
                        tf[r] = mn_now() - t;
                        t = mn_now();
                        cpu_backward(&in, vars[vi], &o);
                        tb[r] = tf[r] + mn_now() - t;
                    }
                    double f = bench_median(tf, reps), fb = bench_median(tb, reps);
                    int C = form == MN_FORM_CHUNK ? clist[ci] : 64;
                    double flops = (double)ntok * fwd_flops_per_token(vars[vi]->rule, C, dlist[di], dlist[di]);
                    char cs[16] = "-";
                    if (form == MN_FORM_CHUNK) snprintf(cs, sizeof cs, "%d", C);
                    printf("%4d %-9s %-10s %3s | %9.2f %5.1f%% | %9.2f %5.1f%%\n", dlist[di], vars[vi]->name,
                           form == MN_FORM_CHUNK ? "chunk" : "recurrent", cs, 1e3 * f, 100 * flops / f / 1e9 / sgemm,
                           1e3 * fb, 100 * 3 * flops / fb / 1e9 / sgemm);
                    fflush(stdout);
                }
            }
        cpu_inputs_free(&in);
    }
    return 0;
}

// --- CUDA ---------------------------------------------------------------------------------------

static void *up(const Backend *be, const double *x, size_t n, MemKind k) {
    void *p = be->alloc(be, n, k);
    if (!p || be->upload(be, p, x, n, k)) die("%s", mn_last_error());
    return p;
}

static void *alloc_or_die(const Backend *be, size_t n, MemKind k) {
    void *p = be->alloc(be, n, k);
    if (!p) die("%s", mn_last_error());
    return p;
}

// The first sequence's first H2 heads of a [B,T,H,D] array: [T][H2][D].
static double *slice_first(const double *x, int T, int H, int H2, int D) {
    double *y = xcalloc((size_t)T * H2 * D, 8);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H2; h++) memcpy(y + ((size_t)t * H2 + h) * D, x + ((size_t)t * H + h) * D, sizeof(double) * D);
    return y;
}

static double *slice_first1(const double *x, int T, int H, int H2) { return slice_first(x, T, H, H2, 1); }

// Relative L2 error of the device's [B,T,H,D] buffer (MEM_ACT) against `exact` [T][H2][D] on b = 0, h < H2.
static double rel_error_first_k(const Backend *be, const void *dev, size_t n, const double *exact, int T, int H,
                                int H2, int D, MemKind kind) {
    double *all = xcalloc(n, 8), num = 0, den = 0;
    if (be->download(be, all, dev, n, kind)) die("%s", mn_last_error());
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H2; h++)
            for (int i = 0; i < D; i++) {
                double a = all[((size_t)t * H + h) * D + i], e = exact[((size_t)t * H2 + h) * D + i];
                num += (a - e) * (a - e);
                den += e * e;
            }
    free(all);
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static double rel_error_first(const Backend *be, const void *dev, size_t n, const double *exact, int T, int H, int H2,
                              int D) {
    return rel_error_first_k(be, dev, n, exact, T, H, H2, D, MEM_ACT);
}

// The float64 reference on b = 0, h < H2 of the inputs (whole length): o and, with want_grads, dq,
// dk, dv ([T][H2][D] each); from the state s0 ([H2][D][D]) or zero; the final state into sT if given.
typedef struct {
    double *o, *dq, *dk, *dv, *dg, *dbeta;  // (dg, dbeta: [T][H2], where the variant has g, beta)
} Exact;

static Exact exact_first(const BenchMesaInputs *h, const Variant *var, int H2, const double *s0, double *sT,
                         int want_grads) {
    MnSeqDims d = h->d, s = {1, d.T, H2, d.Dk, d.Dv};
    size_t nk = (size_t)d.T * H2 * d.Dk, nv = (size_t)d.T * H2 * d.Dv, ng = (size_t)d.T * H2;
    double *q = slice_first(h->q, d.T, d.H, H2, d.Dk), *k = slice_first(h->k, d.T, d.H, H2, d.Dk);
    double *v = slice_first(h->v, d.T, d.H, H2, d.Dv), *dout = slice_first(h->dout, d.T, d.H, H2, d.Dv);
    double *g = var->gated ? slice_first1(h->g, d.T, d.H, H2) : NULL;
    double *b = var->beta ? slice_first1(h->beta, d.T, d.H, H2) : NULL;
    MnLinOpts o = mn_lin_opts_default(var->rule);
    Exact e = {xcalloc(nv, 8), NULL, NULL, NULL};
    LinFwd64 f = {q, k, v, g, b, s0, e.o, sT};
    if (ref_lin_forward(&s, &o, &f)) die("%s", mn_last_error());
    if (want_grads) {
        e.dq = xcalloc(nk, 8);
        e.dk = xcalloc(nk, 8);
        e.dv = xcalloc(nv, 8);
        e.dg = g ? xcalloc(ng, 8) : NULL;
        e.dbeta = b ? xcalloc(ng, 8) : NULL;
        LinBwd64 bw = {q, k, v, g, b, s0, dout, NULL, e.dq, e.dk, e.dv, e.dg, e.dbeta, NULL};
        if (ref_lin_backward(&s, &o, &bw)) die("%s", mn_last_error());
    }
    free(q); free(k); free(v); free(dout); free(g); free(b);
    return e;
}

static void exact_free(Exact *e) {
    free(e->o); free(e->dq); free(e->dk); free(e->dv); free(e->dg); free(e->dbeta);
}

typedef struct {
    const Backend *be;
    MnSeqDims d;
    MnLinOpts o;
    MnLinFwd f;
    MnLinBwd b;
} Run;

static int run_fwd(void *p) {
    Run *r = p;
    return r->be->lin->fwd(r->be, &r->d, &r->o, &r->f);
}

static int run_fwd_bwd(void *p) {
    Run *r = p;
    MN_TRY(r->be->lin->fwd(r->be, &r->d, &r->o, &r->f));
    return r->be->lin->bwd(r->be, &r->d, &r->o, &r->b);
}

// One problem's inputs on the device and its outputs' buffers (bf16 q, k, v, dout, o, dq, dk, dv;
// float32 g, beta, dg, dbeta).
typedef struct {
    void *q, *k, *v, *g, *b, *dout, *o, *dq, *dk, *dv, *dg, *db;
} DevLin;

static DevLin dev_lin_up(const Backend *be, const BenchMesaInputs *h) {
    DevLin x = {up(be, h->q, h->nk, MEM_ACT),        up(be, h->k, h->nk, MEM_ACT),  up(be, h->v, h->nv, MEM_ACT),
                up(be, h->g, h->ng, MEM_F32),        up(be, h->beta, h->ng, MEM_F32), up(be, h->dout, h->nv, MEM_ACT),
                alloc_or_die(be, h->nv, MEM_ACT),    alloc_or_die(be, h->nk, MEM_ACT), alloc_or_die(be, h->nk, MEM_ACT),
                alloc_or_die(be, h->nv, MEM_ACT),    alloc_or_die(be, h->ng, MEM_F32), alloc_or_die(be, h->ng, MEM_F32)};
    return x;
}

static void dev_lin_free(const Backend *be, DevLin *x) {
    void *bufs[] = {x->q, x->k, x->v, x->g, x->b, x->dout, x->o, x->dq, x->dk, x->dv, x->dg, x->db};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(be, bufs[i]);
}

// The forward and backward calls of a variant on x, in the given form (g, beta where it has them).
static Run lin_run(const Backend *be, MnSeqDims d, const Variant *var, MnForm form, const DevLin *x) {
    Run r = {be, d, mn_lin_opts_default(var->rule)};
    r.o.form = form;
    void *g = var->gated ? x->g : NULL, *b = var->beta ? x->b : NULL;
    MnLinFwd f = {x->q, x->k, x->v, g, b, NULL, x->o, NULL};
    MnLinBwd bw = {x->q, x->k, x->v, g, b, NULL, x->dout, NULL, x->dq, x->dk, x->dv, var->gated ? x->dg : NULL,
                   var->beta ? x->db : NULL, NULL};
    r.f = f;
    r.b = bw;
    return r;
}

static double mem_gb(const Backend *be) { return be->device_mem_used ? be->device_mem_used(be) / 1e9 : NAN; }

// The chunkwise form's paths on the GPU, as MESANET_LIN selects them (src/cuda/lin_chunk.cu): the fused
// kernels with split products, the fused kernels with single bf16 products, the cuBLAS path. (The
// mixers' default, precision AUTO: bf16 for the GLA rule, split for the delta rule.)
static const struct {
    const char *name, *env;
} LIN_PATHS[] = {{"split", "split"}, {"bf16", "bf16"}, {"cublas", "cublas"}};
#define NPATHS (int)(sizeof LIN_PATHS / sizeof LIN_PATHS[0])

// The paths named in "a,b" into idx (at most NPATHS); their number, or -1 if one is unknown.
static int parse_paths(const char *s, int idx[NPATHS]) {
    int n = 0;
    char buf[128];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int i = 0;
        while (i < NPATHS && strcmp(t, LIN_PATHS[i].name)) i++;
        if (i == NPATHS || n == NPATHS) return -1;
        idx[n++] = i;
    }
    return n;
}

static void set_path(int i) { setenv("MESANET_LIN", LIN_PATHS[i].env, 1); }

static int bench_lin_cuda(const char *shapes_s, const char *decode_s, const Variant **vars, int nv, int reps,
                          float gmean, MnForm form, const int *paths, int np) {
    BenchShape shapes[8];
    int ns = bench_parse_shapes(shapes_s, shapes, 8);
    if (ns <= 0) die("--shapes: expected BxTxHxD[,BxTxHxD...]");
    int bs[8], nb = *decode_s ? bench_parse_ints(decode_s, bs, 8) : 0;
    if (nb < 0) die("--decode: expected comma-separated positive batch sizes, or \"\"");
    const Backend *be = backend_by_name("cuda");
    if (!be) die("%s", mn_last_error());
    if (!be->lin->fwd || !be->lin->bwd) die("the cuda backend has no gated linear-attention cores");
    double ceiling = bench_gemm_tflops(be, 8192);
    printf("gated linear-attention cores on the GPU (cuda backend), bf16 q k v, form %s; bf16 matrix product 8192^3 in "
           "the same run: %.0f TFLOP/s\n", form == MN_FORM_CHUNK ? "chunk" : form == MN_FORM_RECURRENT ? "recurrent" : "auto",
           ceiling);
    printf("TFLOP/s: minimal flops of the chunkwise form (C = 64; bench/bench_lin.c) / fwd time; rel err: o, dq, dk, dv "
           "against float64 on b = 0, h < 2, all tokens;\nf+b strm: calls back to back, one sync at the end (as "
           "triton.testing.do_bench); mem: device memory in use after the f+b\n");
    printf("%-16s %-9s %-6s | %9s %8s | %9s %9s | %9s %9s %9s %9s | %7s\n", "B x T x H x D", "variant", "path",
           "fwd ms", "TFLOP/s", "f+b ms", "f+b strm", "err o", "err dq", "err dk", "err dv", "mem GB");
    for (int si = 0; si < ns; si++) {
        BenchShape sh = shapes[si];
        MnSeqDims d = {sh.B, sh.T, sh.H, sh.D, sh.D};
        BenchMesaInputs h;
        bench_mesa_inputs(&h, d, 11 + si, gmean, 1, 1);
        int H2 = sh.H < 2 ? sh.H : 2;
        DevLin x = dev_lin_up(be, &h);
        for (int vi = 0; vi < nv * np; vi++) {
            const Variant *var = vars[vi / np];
            set_path(paths[vi % np]);
            Run r = lin_run(be, d, var, form, &x);
            double tf = bench_median_time(be, reps, run_fwd, &r), tb = bench_median_time(be, reps, run_fwd_bwd, &r);
            double tbs = bench_stream_time(be, reps, run_fwd_bwd, &r), mem = mem_gb(be);
            // o, dq, dk, dv of the last f+b (the same inputs every call) against float64
            Exact e = exact_first(&h, var, H2, NULL, NULL, 1);
            double eo = rel_error_first(be, x.o, h.nv, e.o, sh.T, sh.H, H2, sh.D);
            double eq = rel_error_first(be, x.dq, h.nk, e.dq, sh.T, sh.H, H2, sh.D);
            double ek = rel_error_first(be, x.dk, h.nk, e.dk, sh.T, sh.H, H2, sh.D);
            double ev = rel_error_first(be, x.dv, h.nv, e.dv, sh.T, sh.H, H2, sh.D);
            exact_free(&e);
            double flops = (double)h.ng * fwd_flops_per_token(var->rule, 64, sh.D, sh.D);
            char name[40];
            snprintf(name, sizeof name, "%dx%dx%dx%d", sh.B, sh.T, sh.H, sh.D);
            printf("%-16s %-9s %-6s | %9.3f %8.1f | %9.3f %9.3f | %9.2e %9.2e %9.2e %9.2e | %7.2f\n", name, var->name,
                   LIN_PATHS[paths[vi % np]].name, 1e3 * tf, flops / tf / 1e12, 1e3 * tb, 1e3 * tbs, eo, eq, ek, ev, mem);
            fflush(stdout);
        }
        dev_lin_free(be, &x);
        bench_mesa_inputs_free(&h);
    }

    // Decode: one token for B sequences, H = 16, D = 128, with their states after a 512-token prefill.
    if (nb)
        printf("\ndecode step (H=16, D=128, state after a 512-token prefill; rel err of o of the first step, b = 0, "
               "h < 2):\n%6s %-9s | %10s %12s | %9s\n", "B", "variant", "ms/token", "tokens/s", "rel err");
    for (int bi = 0; bi < nb; bi++) {
        int B = bs[bi], H = 16, D = 128, T0 = 512, H2 = 2;
        BenchMesaInputs pre, one;
        bench_mesa_inputs(&pre, (MnSeqDims){B, T0, H, D, D}, 5, gmean, 1, 1);
        bench_mesa_inputs(&one, (MnSeqDims){B, 1, H, D, D}, 6, gmean, 1, 1);
        size_t nstate = (size_t)B * H * D * D;
        void *q = up(be, pre.q, pre.nk, MEM_ACT), *k = up(be, pre.k, pre.nk, MEM_ACT), *v = up(be, pre.v, pre.nv, MEM_ACT);
        void *g = up(be, pre.g, pre.ng, MEM_F32), *b = up(be, pre.beta, pre.ng, MEM_F32);
        void *o = alloc_or_die(be, pre.nv, MEM_ACT), *s = alloc_or_die(be, nstate, MEM_F32);
        void *q1 = up(be, one.q, one.nk, MEM_ACT), *k1 = up(be, one.k, one.nk, MEM_ACT), *v1 = up(be, one.v, one.nv, MEM_ACT);
        void *g1 = up(be, one.g, one.ng, MEM_F32), *b1 = up(be, one.beta, one.ng, MEM_F32);
        void *o1 = alloc_or_die(be, one.nv, MEM_ACT);
        for (int vi = 0; vi < nv; vi++) {
            const Variant *var = vars[vi];
            MnLinOpts lo = mn_lin_opts_default(var->rule);
            MnLinFwd f = {q, k, v, var->gated ? g : NULL, var->beta ? b : NULL, NULL, o, s};
            Run r = {be, one.d, lo};
            MnLinFwd f1 = {q1, k1, v1, var->gated ? g1 : NULL, var->beta ? b1 : NULL, s, o1, s};
            r.f = f1;
            // the state after the prefill, one step untimed for the accuracy, then the timed steps
            if (be->lin->fwd(be, &pre.d, &lo, &f) || run_fwd(&r)) die("%s", mn_last_error());
            double *sT = xcalloc((size_t)H2 * D * D, 8);
            Exact e0 = exact_first(&pre, var, H2, NULL, sT, 0);
            Exact e1 = exact_first(&one, var, H2, sT, NULL, 0);
            double err = rel_error_first(be, o1, one.nv, e1.o, 1, H, H2, D);
            exact_free(&e0);
            exact_free(&e1);
            free(sT);
            double t = bench_stream_time(be, 10 * reps, run_fwd, &r);
            printf("%6d %-9s | %10.4f %12.0f | %9.2e\n", B, var->name, 1e3 * t, B / t, err);
            fflush(stdout);
        }
        void *bufs[] = {q, k, v, g, b, o, s, q1, k1, v1, g1, b1, o1};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(be, bufs[i]);
        bench_mesa_inputs_free(&pre);
        bench_mesa_inputs_free(&one);
    }
    return 0;
}

// The hard inputs of tests/test_lin.c at (1, T, 2, 64): no decay over 1000 tokens (g = 0), one key
// for every token, beta in [1.9, 2) (negative eigenvalues), and both of the last two; each variant
// that has the gate the kind changes, on each path; the relative L2 errors of o, dq, dk, dv, dg,
// dbeta against float64 (every token and head). bench/fla_lin_bench.py --hard prints fla's.
static void bench_lin_hard(const char *backend, const Variant **vars, int nv, const int *paths, int np) {
    const Backend *be = backend_by_name(backend);
    const int cpu = !strcmp(backend, "cpu");  // (one path: its float32 chunkwise form)
    if (cpu) np = 1;
    if (!be) die("%s", mn_last_error());
    static const char *const kinds[] = {"g = 0, T = 1000", "one key", "beta in [1.9, 2)", "beta ~2, one key"};
    printf("hard inputs (B 1, H 2, D 64; T 500, or 1000 where g = 0): rel err against float64, every token and head\n");
    printf("%-18s %-9s %-6s | %9s %9s %9s %9s %9s %9s\n", "inputs", "variant", "path", "err o", "err dq", "err dk",
           "err dv", "err dg", "err dbeta");
    for (int kind = 0; kind < 4; kind++)
        for (int vi = 0; vi < nv; vi++) {
            const Variant *var = vars[vi];
            if ((kind == 0 && !var->gated) || (kind >= 2 && !(var->beta && var->rule == MN_LIN_DELTA))) continue;
            MnSeqDims d = {1, kind == 0 ? 1000 : 500, 2, 64, 64};
            BenchMesaInputs h;
            bench_mesa_inputs(&h, d, 31 + kind, 3.0, 1, 1);
            if (kind == 0)
                for (size_t i = 0; i < h.ng; i++) h.g[i] = 0;
            if (kind == 1 || kind == 3)
                for (size_t t = 1; t < h.ng; t++) memcpy(h.k + t * d.Dk, h.k, sizeof(double) * d.Dk);
            if (kind >= 2) {
                MnRng r;
                mn_rng_seed(&r, 77 + kind);
                for (size_t i = 0; i < h.ng; i++) h.beta[i] = (double)(float)(1.9 + 0.1 * mn_rng_uniform(&r));
            }
            for (size_t i = 0; i < h.ng; i++) h.g[i] = (double)(float)h.g[i];
            Exact e = exact_first(&h, var, d.H, NULL, NULL, 1);
            DevLin x = dev_lin_up(be, &h);
            for (int pi = 0; pi < np; pi++) {
                if (!cpu) set_path(paths[pi]);
                Run r = lin_run(be, d, var, MN_FORM_CHUNK, &x);
                if (run_fwd_bwd(&r) || be->sync(be)) die("%s", mn_last_error());
                double eg = var->gated ? rel_error_first_k(be, x.dg, h.ng, e.dg, d.T, d.H, d.H, 1, MEM_F32) : NAN;
                double eb = var->beta ? rel_error_first_k(be, x.db, h.ng, e.dbeta, d.T, d.H, d.H, 1, MEM_F32) : NAN;
                printf("%-18s %-9s %-6s | %9.2e %9.2e %9.2e %9.2e %9.2e %9.2e\n", kinds[kind], var->name,
                       cpu ? "cpu" : LIN_PATHS[paths[pi]].name, rel_error_first(be, x.o, h.nv, e.o, d.T, d.H, d.H, d.Dv),
                       rel_error_first(be, x.dq, h.nk, e.dq, d.T, d.H, d.H, d.Dk),
                       rel_error_first(be, x.dk, h.nk, e.dk, d.T, d.H, d.H, d.Dk),
                       rel_error_first(be, x.dv, h.nv, e.dv, d.T, d.H, d.H, d.Dv), eg, eb);
                fflush(stdout);
            }
            dev_lin_free(be, &x);
            exact_free(&e);
            bench_mesa_inputs_free(&h);
        }
}

int bench_lin(int argc, char **argv) {
    int B = 4, T = 1024, H = 4, reps = 0;
    float gmean = 3.0f;
    const char *backend = "cpu", *dims = "64,128", *chunks = "64", *forms = "chunk,recurrent";
    const char *variants = "gdn,deltanet,gla,mamba2", *shapes = "8x2048x16x128,16x2048x8x64", *decode = "1,16,128";
    const char *form = "auto", *paths_s = "split,bf16";
    int hard = 0;
    Option opts[] = {
        {"backend", OPT_STRING, &backend, "cpu, or cuda (the GPU: --shapes, --decode)"},
        {"variants", OPT_STRING, &variants, "comma-separated of gdn (delta rule, g and beta), deltanet (delta rule, "
                                            "beta), gla (GLA rule, g and beta), mamba2 (GLA rule, g)"},
        {"B", OPT_INT, &B, "sequences (cpu)", 1, 4096},
        {"T", OPT_INT, &T, "tokens per sequence (cpu)", 1, 1 << 20},
        {"H", OPT_INT, &H, "heads (cpu)", 1, 1024},
        {"D", OPT_STRING, &dims, "head sizes to run (Dk = Dv), comma-separated (cpu)"},
        {"chunks", OPT_STRING, &chunks, "chunk sizes of the chunkwise form, comma-separated (cpu)"},
        {"forms", OPT_STRING, &forms, "forms to run: chunk, recurrent or both (cpu)"},
        {"form", OPT_STRING, &form, "form of the timed calls: auto (chunk from T = 64 on), chunk or recurrent (cuda)"},
        {"shapes", OPT_STRING, &shapes, "BxTxHxD shapes, comma-separated (cuda)"},
        {"decode", OPT_STRING, &decode, "batch sizes of the decode step (H=16, D=128), or \"\" (cuda)"},
        {"hard", OPT_FLAG, &hard, "the hard inputs' errors instead of the timings: no decay, one key, beta near 2"},
        {"paths", OPT_STRING, &paths_s, "chunkwise paths, comma-separated: split (fused, split products: the default), "
                                        "bf16 (fused, single bf16 products), cublas (cuda)"},
        {"reps", OPT_INT, &reps, "timed repetitions, median reported (0: 3 on cpu, 10 on cuda; cuda: at most 64)", 0, 10000},
        {"gmean", OPT_FLOAT, &gmean, "forget gates are sigmoid(N(gmean, 1)): larger is longer memory", -20, 20},
    };
    int st = parse_args(argc, argv, "[options]", opts, sizeof opts / sizeof opts[0], NULL, NULL, 0);
    if (st) return st == 2 ? 0 : 1;
    const Variant *vars[NVARIANTS];
    int nv = parse_variants(variants, vars);
    if (nv <= 0) {
        fprintf(stderr, "mesanet bench lin: --variants: expected a comma-separated list of gdn, deltanet, gla, mamba2; "
                        "got '%s'\n", variants);
        return 1;
    }
    if (!reps) reps = strcmp(backend, "cuda") ? 3 : 10;
    int paths[NPATHS], np = parse_paths(paths_s, paths);
    if (np <= 0) {
        fprintf(stderr, "mesanet bench lin: --paths: expected a comma-separated list of split, bf16, cublas; got '%s'\n",
                paths_s);
        return 1;
    }
    MnForm f = !strcmp(form, "auto") ? MN_FORM_AUTO : !strcmp(form, "chunk") ? MN_FORM_CHUNK
                 : !strcmp(form, "recurrent") ? MN_FORM_RECURRENT : (MnForm)-1;
    if ((int)f < 0) {
        fprintf(stderr, "mesanet bench lin: --form: expected auto, chunk or recurrent, got '%s'\n", form);
        return 1;
    }
    if (strcmp(backend, "cpu") && strcmp(backend, "cuda")) {
        fprintf(stderr, "mesanet bench lin: --backend: expected cpu or cuda, got '%s'\n", backend);
        return 1;
    }
    if (!hard && !strcmp(backend, "cpu")) return bench_lin_cpu(B, T, H, dims, chunks, forms, vars, nv, reps, gmean);
    const char *env = getenv("MESANET_LIN");  // (set row by row for the paths; the caller's put back after)
    char *saved = env ? strdup(env) : NULL;
    if (hard) bench_lin_hard(backend, vars, nv, paths, np);
    else st = bench_lin_cuda(shapes, decode, vars, nv, reps, gmean, f, paths, np);
    if (saved) setenv("MESANET_LIN", saved, 1);
    else unsetenv("MESANET_LIN");
    free(saved);
    return st;
}
