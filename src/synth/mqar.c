// MQAR, multi-query associative recall (Zoology, zoology/data/multiquery_ar.py;
// benchmarks-notes.md section 3.1).
//
// V tokens; keys from [1, V/2) (0 is the query region's filler), values from
// [V/2, V); K distinct keys and K distinct values per example. The context is
// k1 v1 ... kK vK, then a query region of L - 2K tokens in which key j reappears
// at offset 2*gap_j, the gaps K distinct draws from {0 .. (L-2K)/2 - 1} with
// p_i ~ i^(a-1) (sequential weighted sampling without replacement, as numpy's
// choice(replace=False, p)). The target at that position is v_j; nowhere else.
// T = L. The grid is Zoology Fig. 2's: (L, K) in {(64,4), (128,8), (256,16),
// (512,64)}, V = 8192, 100k train / 3k test, random_non_queries = 0.
#include <math.h>

#include "synth/synth.h"

static int mqar_check(const SynthSettings *s) {
    if (s->seq_len < 4 || s->seq_len % 2)
        return mn_error(MN_ERR_ARG, "mqar: seq_len must be even and >= 4, got %d", s->seq_len);
    if (s->vocab <= s->seq_len)
        return mn_error(MN_ERR_ARG, "mqar: vocab must be > seq_len (%d), got %d", s->seq_len, s->vocab);
    if (s->num_pairs < 1 || 4 * s->num_pairs > s->seq_len)
        return mn_error(MN_ERR_ARG, "mqar: num_pairs must be in [1, seq_len/4 = %d], got %d", s->seq_len / 4,
                        s->num_pairs);
    if (s->num_pairs > s->vocab / 2 - 1)
        return mn_error(MN_ERR_ARG, "mqar: num_pairs (%d) exceeds the %d keys of vocab %d", s->num_pairs,
                        s->vocab / 2 - 1, s->vocab);
    if (!(s->power_a > 0) || !(s->power_a <= 1))
        return mn_error(MN_ERR_ARG, "mqar: power_a must be in (0, 1], got %g", s->power_a);
    return MN_OK;
}

static void mqar_shape(const SynthSettings *s, int split, int *vocab, int *T) {
    *vocab = s->vocab;
    *T = s->seq_len;
}

// K distinct integers from [lo, hi) (rejection; K is far below hi - lo here).
static void distinct(MnRng *r, int lo, int hi, int K, int *out) {
    for (int j = 0; j < K; j++) {
        int x, dup;
        do {
            x = lo + synth_below(r, hi - lo);
            dup = 0;
            for (int i = 0; i < j; i++) dup |= out[i] == x;
        } while (dup);
        out[j] = x;
    }
}

static void mqar_gen(const SynthSettings *s, int split, MnRng *r, const void *ctx, int32_t *in, int32_t *tgt) {
    int L = s->seq_len, K = s->num_pairs, V = s->vocab;
    int space = (L - 2 * K) / 2;
    int keys[K], vals[K], gaps[K];
    double w[space];
    distinct(r, 1, V / 2, K, keys);
    distinct(r, V / 2, V, K, vals);
    double total = 0;
    for (int i = 0; i < space; i++) total += w[i] = pow(i + 1, s->power_a - 1);
    for (int j = 0; j < K; j++) {  // weighted draws without replacement
        double u = mn_rng_uniform(r) * total, acc = 0;
        int pick = -1, last = -1;
        for (int i = 0; i < space; i++) {
            if (w[i] == 0) continue;
            last = i;
            acc += w[i];
            if (u < acc) {
                pick = i;
                break;
            }
        }
        if (pick < 0) pick = last;  // rounding at the top end
        gaps[j] = pick;
        total -= w[pick];
        w[pick] = 0;
    }
    for (int j = 0; j < K; j++) in[2 * j] = keys[j], in[2 * j + 1] = vals[j];
    for (int t = 2 * K; t < L; t++) in[t] = 0;
    for (int j = 0; j < K; j++) {
        int p = 2 * K + 2 * gaps[j];
        in[p] = keys[j];
        tgt[p] = vals[j];
    }
    if (s->random_non_queries)
        for (int t = 0; t < L; t++)
            if (in[t] == 0) in[t] = synth_below(r, V);
}

static const SynthVary MQAR_VARY[] = {
    {"seq_len", 3, {128, 256, 512}, "num_pairs", {8, 16, 64}},
};

const SynthTask synth_task_mqar = {
    .name = "mqar",
    .family = "mqar",
    .summary = "multi-query associative recall (Zoology): K key-value pairs, then the keys again; predict the values",
    .metric = SYNTH_METRIC_EXAMPLE,
    .base = {.vocab = 8192, .seq_len = 64, .num_pairs = 4, .power_a = 0.01, .random_non_queries = 0,
             .n_train = 100000, .n_test = 3000},
    .vary = MQAR_VARY,
    .n_vary = 1,
    .check = mqar_check,
    .shape = mqar_shape,
    .gen = mqar_gen,
};
