// Parity (state tracking; MesaNet paper Appendix H, xLSTM's formal languages):
// bit strings, the target at each position the parity of the bits so far (the
// running parity), or only at the last bit with final_only = 1.
//
// Tokens: 0 and 1 are the bits (and the parities), 2 pads a string shorter than
// T on the right (no target there); V = 3. Training strings have U[min_len,
// seq_len] bits (3..40, as xLSTM's formal-language setup) in T = seq_len
// positions; test strings U[test_min_len, test_len] bits (40..256) in
// T = test_len. Assumed (the spec gives none): 100k training and 1k test
// strings.
#include "synth/synth.h"

#define PAD 2

static int parity_check(const SynthSettings *s) {
    if (s->min_len < 1 || s->min_len > s->seq_len)
        return mn_error(MN_ERR_ARG, "parity: min_len must be in [1, seq_len = %d], got %d", s->seq_len, s->min_len);
    if (s->test_min_len < 1 || s->test_min_len > s->test_len)
        return mn_error(MN_ERR_ARG, "parity: test_min_len must be in [1, test_len = %d], got %d", s->test_len,
                        s->test_min_len);
    if (s->final_only != 0 && s->final_only != 1)
        return mn_error(MN_ERR_ARG, "parity: final_only must be 0 or 1, got %d", s->final_only);
    return MN_OK;
}

static void parity_shape(const SynthSettings *s, int split, int *vocab, int *T) {
    *vocab = 3;
    *T = split == SYNTH_TEST ? s->test_len : s->seq_len;
}

static void parity_gen(const SynthSettings *s, int split, MnRng *r, const void *ctx, int32_t *in, int32_t *tgt) {
    int lo = split == SYNTH_TEST ? s->test_min_len : s->min_len;
    int T = split == SYNTH_TEST ? s->test_len : s->seq_len;
    int n = lo + synth_below(r, T - lo + 1), p = 0;
    for (int t = 0; t < T; t++) {
        if (t >= n) {
            in[t] = PAD;
            continue;
        }
        in[t] = (int32_t)(mn_rng_u64(r) >> 63);
        p ^= in[t];
        if (!s->final_only || t == n - 1) tgt[t] = p;
    }
}

static const SynthVary PARITY_VARY[] = {{"final_only", 1, {1}}};

const SynthTask synth_task_parity = {
    .name = "parity",
    .family = "parity",
    .summary = "parity: the running parity of a bit string; train on <= 40 bits, test on 40..256",
    .metric = SYNTH_METRIC_POSITION,
    .base = {.seq_len = 40, .min_len = 3, .test_min_len = 40, .test_len = 256, .n_train = 100000, .n_test = 1000},
    .vary = PARITY_VARY,
    .n_vary = 1,
    .check = parity_check,
    .shape = parity_shape,
    .gen = parity_gen,
};
