// Benchmarks behind `mesanet bench`, and their shared helpers.
#ifndef MN_BENCH_H
#define MN_BENCH_H

#include "core/backend.h"
#include "model/model.h"

int bench_mesa(int argc, char **argv);
int bench_train(int argc, char **argv);
int bench_mesa_gpu(int argc, char **argv);
int bench_xlstm_gpu(int argc, char **argv);
int bench_scan(int argc, char **argv);
int bench_lin(int argc, char **argv);
int bench_attn(int argc, char **argv);
int bench_decode(int argc, char **argv);
int bench_xlstm(int argc, char **argv);
int bench_sweep(int argc, char **argv);

// Layer-like random inputs of the Mesa core (spec section 7), in float64 on
// the host: unit-norm q and k rows, v and dout ~ N(0, 1), forget gates
// sigmoid(N(gmean, 1)) as log values g, input gates sigmoid(N(0, 1)), every
// lambda the same; q, k, v and dout rounded to bf16 when bf16 is set (what a
// GPU holds), so that an exact solve of them is the right reference.
typedef struct {
    MnSeqDims d;
    size_t nk, nv, ng;  // B*T*H*Dk, B*T*H*Dv, B*T*H
    double *q, *k, *v, *g, *beta, *lambda, *dout;
} BenchMesaInputs;

void bench_mesa_inputs(BenchMesaInputs *h, MnSeqDims d, uint64_t seed, double gmean, double lambda, int bf16);
void bench_mesa_inputs_free(BenchMesaInputs *h);

// A model of a config (preset or JSON) on a backend, with random weights: the vocabulary size
// `vocab` where the config leaves it to the data, `cg_steps` CG steps if > 0. Dies on error.
Model *bench_model(const char *config, const char *backend, int vocab, int cg_steps);

// Parses "a,b,c" positive integers into out (at most max); -1 on bad input.
int bench_parse_ints(const char *s, int *out, int max);
// Shapes "BxTxHxD[,BxTxHxD...]" into out (at most max): their count, or -1 where one is malformed
// or not positive.
typedef struct {
    int B, T, H, D;
} BenchShape;
int bench_parse_shapes(const char *s, BenchShape *out, int max);
double bench_median(double *t, int n);
// Seconds per call of fn(ctx) on backend be, after one warm-up call: the median of reps calls each
// waited for (at most 64), and the mean over n calls launched back to back with one wait at the end
// (what a stream of steps costs, launch overheads included, host waits not). Errors are fatal.
double bench_median_time(const Backend *be, int reps, int (*fn)(void *), void *ctx);
// n values of kind k uniform in [lo, hi), then log sigmoid(x) where logsig is set (forget gates): a
// random pattern of 1 Mi values repeated (enough for timing). Dies on a failed allocation or upload.
void *bench_rand_buf(const Backend *be, size_t n, MemKind k, double lo, double hi, int logsig, unsigned seed);
// 1 where the last (up to) 100,000 values of p are all finite.
int bench_all_finite(const Backend *be, const void *p, size_t n, MemKind k);
double bench_stream_time(const Backend *be, int n, int (*fn)(void *), void *ctx);
// Best-of-reps rate of an n x n x n sgemm with the current threads.
double bench_sgemm_gflops(int n, int reps);
// Best-of-10 rate of an n x n x n bf16 product through a backend's linear op (TFLOP/s).
double bench_gemm_tflops(const Backend *be, int n);

#endif
