// `mesanet bench <what>`: dispatches to the benchmarks; and their shared helpers.
#include <math.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "backends/registry.h"
#include "core/common.h"
#include "core/half.h"
#include "cpu/blas.h"
#include "tools/commands.h"

int cmd_bench(int argc, char **argv) {
    static const Command benches[] = {
        {"mesa", bench_mesa, "the Mesa layer core: both forms, fixed steps and tolerance, forward and backward"},
        {"lin", bench_lin, "the gated linear-attention cores (gdn, deltanet, gla, mamba2) on the CPU or the GPU"},
        {"attn", bench_attn, "the softmax-attention core (mha, swa): fwd, fwd+bwd, decode steps, on the CPU or the GPU"},
        {"mesa-gpu", bench_mesa_gpu, "the Mesa core on the GPU at the anchors' shapes (see bench/fla_bench.py)"},
        {"xlstm-gpu", bench_xlstm_gpu, "the xLSTM cores (mLSTM, sLSTM) on the GPU: forward, forward+backward, decode"},
        {"scan", bench_scan, "the diagonal recurrences (RG-LRU, Longhorn) on the GPU against a device copy's rate"},
        {"train", bench_train, "training throughput, memory and time in the Mesa layer of a model config"},
        {"decode", bench_decode, "generation throughput of a model config: eager and recorded (CUDA graph) steps"},
        {"xlstm", bench_xlstm, "the xLSTM cores (mLSTM, sLSTM): fwd, fwd+bwd, errors, on the CPU or the GPU"},
        {"sweep", bench_sweep, "steps/s of a sweep of small models (MAD's): alone, runs at once in one process, processes"},
    };
    size_t n = sizeof benches / sizeof benches[0];
    if (argc >= 2)
        for (size_t i = 0; i < n; i++)
            if (!strcmp(argv[1], benches[i].name)) {
                // The benchmark's messages and usage name the whole command, "bench mesa"; a copy of
                // the arguments, since --gpus runs the tool again with the original ones.
                char name[64], **sub = xcalloc((size_t)argc, sizeof *sub);
                snprintf(name, sizeof name, "bench %s", benches[i].name);
                sub[0] = name;
                for (int a = 2; a < argc; a++) sub[a - 1] = argv[a];
                int rc = benches[i].run(argc - 1, sub);
                free(sub);
                return rc;
            }
    int asked = argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h");
    FILE *f = asked ? stdout : stderr;
    if (!asked) fprintf(f, "mesanet bench: unknown benchmark '%s'\n\n", argv[1]);
    fprintf(f, "usage: mesanet bench <what> [options]\n\n");
    for (size_t i = 0; i < n; i++) fprintf(f, "  %-8s %s\n", benches[i].name, benches[i].help);
    return f == stderr;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_median(double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

double bench_median_time(const Backend *be, int reps, int (*fn)(void *), void *ctx) {
    double t[64];
    if (reps > 64) reps = 64;
    if (fn(ctx) || be->sync(be)) die("%s", mn_last_error());
    for (int r = 0; r < reps; r++) {
        double t0 = mn_now();
        if (fn(ctx) || be->sync(be)) die("%s", mn_last_error());
        t[r] = mn_now() - t0;
    }
    return bench_median(t, reps);
}

double bench_stream_time(const Backend *be, int n, int (*fn)(void *), void *ctx) {
    if (fn(ctx) || be->sync(be)) die("%s", mn_last_error());
    double t0 = mn_now();
    for (int r = 0; r < n; r++)
        if (fn(ctx)) die("%s", mn_last_error());
    if (be->sync(be)) die("%s", mn_last_error());
    return (mn_now() - t0) / n;
}

double bench_sgemm_gflops(int n, int reps) {
    float *a = xcalloc((size_t)n * n, 4), *b = xcalloc((size_t)n * n, 4), *c = xcalloc((size_t)n * n, 4);
    MnRng r;
    mn_rng_seed(&r, 1);
    for (size_t i = 0; i < (size_t)n * n; i++) a[i] = b[i] = (float)mn_rng_uniform(&r) - 0.5f;
    gemm(0, 0, n, n, n, 1, a, n, b, n, 0, c, n);  // warm-up
    double best = 0;
    for (int i = 0; i < reps; i++) {
        double t = mn_now();
        gemm(0, 0, n, n, n, 1, a, n, b, n, 0, c, n);
        t = mn_now() - t;
        best = fmax(best, 2.0 * n * n * (double)n / t / 1e9);
    }
    free(a); free(b); free(c);
    return best;
}

Model *bench_model(const char *config, const char *backend, int vocab, int cg_steps) {
    const Backend *be = backend_by_name(backend);
    ModelConfig c;
    if (!be || config_load(&c, config)) die("%s", mn_last_error());
    if (c.vocab_size == 0) c.vocab_size = vocab;
    if (cg_steps > 0) c.cg_steps = cg_steps;
    Model *m;
    if (model_create(&m, &c, be) || model_init_params(m, 1)) die("%s", mn_last_error());
    return m;
}

int bench_parse_ints(const char *s, int *out, int max) {
    int n = 0;
    while (*s && n < max) {
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || v <= 0 || v > 1 << 24 || errno == ERANGE) return -1;  // sizes, not counters
        out[n++] = (int)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return n;
}

int bench_parse_shapes(const char *s, BenchShape *out, int max) {
    int n = 0;
    while (*s && n < max) {
        BenchShape sh;
        int used = 0;
        if (sscanf(s, "%dx%dx%dx%d%n", &sh.B, &sh.T, &sh.H, &sh.D, &used) != 4 || sh.B <= 0 || sh.T <= 0 || sh.H <= 0 ||
            sh.D <= 0)
            return -1;
        out[n++] = sh;
        s += used;
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return n;
}

static double round_bf16(double x) { return bf16_to_f32(f32_to_bf16((float)x)); }
static double keep(double x) { return x; }

void bench_mesa_inputs(BenchMesaInputs *h, MnSeqDims d, uint64_t seed, double gmean, double lambda, int bf16) {
    double (*rnd)(double) = bf16 ? round_bf16 : keep;
    MnRng r;
    mn_rng_seed(&r, seed);
    h->d = d;
    h->ng = (size_t)d.B * d.T * d.H;
    h->nk = h->ng * d.Dk;
    h->nv = h->ng * d.Dv;
    h->q = xcalloc(h->nk, 8);
    h->k = xcalloc(h->nk, 8);
    h->v = xcalloc(h->nv, 8);
    h->dout = xcalloc(h->nv, 8);
    h->g = xcalloc(h->ng, 8);
    h->beta = xcalloc(h->ng, 8);
    h->lambda = xcalloc((size_t)d.H * d.Dk, 8);
    for (size_t t = 0; t < h->ng; t++) {
        double *rows[2] = {h->q + t * d.Dk, h->k + t * d.Dk};
        for (int m = 0; m < 2; m++) {
            double ss = 0;
            for (int i = 0; i < d.Dk; i++) {
                rows[m][i] = mn_rng_normal(&r);
                ss += rows[m][i] * rows[m][i];
            }
            for (int i = 0; i < d.Dk; i++) rows[m][i] = rnd(rows[m][i] / sqrt(ss));
        }
        for (int i = 0; i < d.Dv; i++) {
            h->v[t * d.Dv + i] = rnd(mn_rng_normal(&r));
            h->dout[t * d.Dv + i] = rnd(mn_rng_normal(&r));
        }
        h->g[t] = -log1p(exp(-(mn_rng_normal(&r) + gmean)));
        h->beta[t] = 1 / (1 + exp(-mn_rng_normal(&r)));
    }
    for (int i = 0; i < d.H * d.Dk; i++) h->lambda[i] = lambda;
}

void bench_mesa_inputs_free(BenchMesaInputs *h) {
    free(h->q); free(h->k); free(h->v); free(h->dout); free(h->g); free(h->beta); free(h->lambda);
}

void *bench_rand_buf(const Backend *be, size_t n, MemKind k, double lo, double hi, int logsig, unsigned seed) {
    size_t np = n < ((size_t)1 << 20) ? n : ((size_t)1 << 20);
    double *p = xcalloc(np, sizeof(double));
    MnRng r;
    mn_rng_seed(&r, seed);
    for (size_t i = 0; i < np; i++) {
        double x = lo + (hi - lo) * mn_rng_uniform(&r);
        p[i] = logsig ? -log1p(exp(-x)) : x;
    }
    void *b = be->alloc(be, n, k);
    if (!b) die("%s", mn_last_error());
    const size_t es = be->elem_size(be, k);
    for (size_t o = 0; o < n; o += np) {
        size_t m = n - o < np ? n - o : np;
        if (be->upload(be, (char *)b + o * es, p, m, k)) die("%s", mn_last_error());
    }
    free(p);
    return b;
}

int bench_all_finite(const Backend *be, const void *p, size_t n, MemKind k) {
    size_t m = n < 100000 ? n : 100000;
    double *h = xcalloc(m, sizeof(double));
    if (be->download(be, h, (const char *)p + (n - m) * be->elem_size(be, k), m, k)) die("%s", mn_last_error());
    int ok = 1;
    for (size_t i = 0; i < m; i++) ok &= isfinite(h[i]) != 0;
    free(h);
    return ok;
}
