// S-NIAH, single needle in a haystack (RULER's S-NIAH-1/2/3 as the Gated
// DeltaNet paper uses them), at the token level: one key-value needle hidden at
// a depth of a haystack, and at the end a query for the key whose answer is
// the value. The spec gives only "a key and a value hidden in filler text,
// asked for at the end; accuracy by context length (1K-8K)"; the three
// variants follow RULER:
//   niah-1 (pass-key retrieval): the haystack is one noise "sentence" repeated
//          (RULER: "The grass is green. The sky is blue. ..."); the value a
//          7-digit number; the needle sits at a sentence boundary.
//   niah-2 (number in a haystack): the haystack is random filler tokens (an
//          essay's stand-in); the value a 7-digit number.
//   niah-3 (UUID in a haystack): as niah-2 with a 32-hex-digit value.
// Tokens: 0 pad (unused), 1 NEEDLE, 2 IS, 3 QUERY, 4 SEP (ends a sentence and
// the needle), 5..14 the digits 0-9, 15..20 the hex digits a-f, 21..52 key
// words (32), 53..V-1 filler. The text is
//   haystack[:p] NEEDLE key IS value SEP haystack[p:] QUERY key IS value
// of T + 1 tokens, inputs its first T, the targets the value's tokens at the
// positions that precede them (teacher forcing; every position right is the
// same as a greedy answer being exactly right, hence the exact-match metric).
// The key has key_len tokens, the value value_len. depth in [0, 1] puts the
// needle at that fraction of the haystack; < 0 draws it uniformly per example.
// Assumed: 10k training and 500 test examples per length; the grid is the
// context length T in {1K, 2K, 4K, 8K}.
#include <math.h>

#include "synth/synth.h"

enum { NEEDLE = 1, IS = 2, QUERY = 3, SEP = 4, DIGIT0 = 5, KEY0 = 21, NKEYS = 32, FILLER0 = 53 };
#define PERIOD 16  // niah-1's noise sentence: 15 filler tokens and SEP

static int niah_check(const SynthSettings *s) {
    if (s->vocab < FILLER0 + PERIOD)
        return mn_error(MN_ERR_ARG, "niah: vocab must be >= %d (specials, digits, keys, filler), got %d",
                        FILLER0 + PERIOD, s->vocab);
    if (s->key_len < 1 || s->key_len > 64)
        return mn_error(MN_ERR_ARG, "niah: key_len must be in [1, 64], got %d", s->key_len);
    if (s->value_len < 1 || s->value_len > 256)
        return mn_error(MN_ERR_ARG, "niah: value_len must be in [1, 256], got %d", s->value_len);
    int need = 2 * (s->key_len + s->value_len) + 5 + PERIOD;
    if (s->seq_len < need)
        return mn_error(MN_ERR_ARG, "niah: seq_len must be >= %d (needle, query, answer and a haystack), got %d", need,
                        s->seq_len);
    if (!(s->depth <= 1) || isnan(s->depth))
        return mn_error(MN_ERR_ARG, "niah: depth must be in [0, 1] (or < 0: uniform), got %g", s->depth);
    return MN_OK;
}

static void niah_shape(const SynthSettings *s, int split, int *vocab, int *T) {
    *vocab = s->vocab;
    *T = s->seq_len;
}

static void niah_gen(int variant, const SynthSettings *s, MnRng *r, int32_t *in, int32_t *tgt) {
    int T = s->seq_len, kl = s->key_len, d = s->value_len, V = s->vocab;
    int H = T + 1 - (kl + d + 3) - (kl + 2) - d;  // haystack tokens
    int32_t key[kl], val[d];
    for (int j = 0; j < kl; j++) key[j] = KEY0 + synth_below(r, NKEYS);
    for (int j = 0; j < d; j++) val[j] = DIGIT0 + synth_below(r, variant == 3 ? 16 : 10);
    int p = s->depth < 0 ? synth_below(r, H + 1) : (int)lround(s->depth * H);
    if (variant == 1) p -= p % PERIOD;  // at a sentence boundary
    int n = 0;
#define PUT(x) (n < T ? (void)(in[n] = (x)) : (void)0, n++)
    for (int h = 0; h <= H; h++) {
        if (h == p) {
            PUT(NEEDLE);
            for (int j = 0; j < kl; j++) PUT(key[j]);
            PUT(IS);
            for (int j = 0; j < d; j++) PUT(val[j]);
            PUT(SEP);
        }
        if (h == H) break;
        if (variant == 1)
            PUT(h % PERIOD == PERIOD - 1 ? SEP : FILLER0 + h % PERIOD);
        else
            PUT(FILLER0 + synth_below(r, V - FILLER0));
    }
    PUT(QUERY);
    for (int j = 0; j < kl; j++) PUT(key[j]);
    PUT(IS);
    for (int j = 0; j < d; j++) {
        tgt[n - 1] = val[j];
        PUT(val[j]);
    }
#undef PUT
}

static void niah1_gen(const SynthSettings *s, int split, MnRng *r, const void *c, int32_t *in, int32_t *tgt) {
    niah_gen(1, s, r, in, tgt);
}
static void niah2_gen(const SynthSettings *s, int split, MnRng *r, const void *c, int32_t *in, int32_t *tgt) {
    niah_gen(2, s, r, in, tgt);
}
static void niah3_gen(const SynthSettings *s, int split, MnRng *r, const void *c, int32_t *in, int32_t *tgt) {
    niah_gen(3, s, r, in, tgt);
}

static const SynthVary NIAH_VARY[] = {{"seq_len", 3, {2048, 4096, 8192}, NULL, {0}, "context length in tokens"}};

#define NIAH_TASK(id, sum, vlen)                                                                          \
    {                                                                                                     \
        .name = "niah-" #id, .family = "niah", .summary = sum, .metric = SYNTH_METRIC_EXACT,              \
        .base = {.vocab = 256, .seq_len = 1024, .key_len = 2, .value_len = vlen, .depth = -1,             \
                 .n_train = 10000, .n_test = 500},                                                        \
        .vary = NIAH_VARY, .n_vary = 1, .check = niah_check, .shape = niah_shape, .gen = niah##id##_gen, \
    }

const SynthTask synth_task_niah1 = NIAH_TASK(1, "S-NIAH-1: pass-key (a number) in a repeated noise sentence", 7);
const SynthTask synth_task_niah2 = NIAH_TASK(2, "S-NIAH-2: a number in random filler", 7);
const SynthTask synth_task_niah3 = NIAH_TASK(3, "S-NIAH-3: a 32-hex-digit UUID in random filler", 32);
