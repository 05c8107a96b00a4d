// RegBench (src/synth/regbench.h): fixed-seed outputs, sampled strings in their languages, minimal
// and pairwise distinct automata across the splits, metrics on a hand-made automaton, refusals.
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "synth/regbench.h"
#include "test.h"

#define N_TRAIN 300
#define N_TEST 60
#define SEED 1234

// Whether states p of a and q of b accept the same language: explore the pairs reachable on common
// letters; they differ when some reached pair has different sets of defined letters (every state
// accepts, a missing edge rejects). Exact, independent of the minimiser.
static int same_language(const RbDfa *a, int p, const RbDfa *b, int q) {
    int seen[RB_MAX_STATES][RB_MAX_STATES] = {{0}};
    int qa[RB_MAX_STATES * RB_MAX_STATES], qb[RB_MAX_STATES * RB_MAX_STATES], n = 0;
    qa[n] = p, qb[n] = q, n++;
    seen[p][q] = 1;
    for (int h = 0; h < n; h++) {
        if (rb_dfa_out_mask(a, qa[h]) != rb_dfa_out_mask(b, qb[h])) return 0;
        for (int c = 0; c < RB_LETTERS; c++) {
            int x = a->next[qa[h]][c], y = b->next[qb[h]][c];
            if (x >= 0 && !seen[x][y]) seen[x][y] = 1, qa[n] = x, qb[n] = y, n++;
        }
    }
    return 1;
}

static int all_reachable(const RbDfa *d) {
    int seen[RB_MAX_STATES] = {0}, q[RB_MAX_STATES], n = 0;
    q[n++] = 0, seen[0] = 1;
    for (int h = 0; h < n; h++)
        for (int c = 0; c < RB_LETTERS; c++) {
            int t = d->next[q[h]][c];
            if (t >= 0 && !seen[t]) seen[t] = 1, q[n++] = t;
        }
    return n == d->n;
}

static uint64_t mix(uint64_t h, uint64_t v) { return (h ^ v) * 1099511628211ull; }

static uint64_t splits_hash(const RbConfig *c, uint64_t seed, int ntr, int nte) {
    RbDfa *tr, *te;
    if (rb_make_splits(c, seed, ntr, nte, &tr, &te)) return 0;
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < nte; i++) h = mix(h, rb_dfa_hash(&te[i]));
    for (int i = 0; i < ntr; i++) h = mix(h, rb_dfa_hash(&tr[i]));
    int cap = rb_max_tokens(c), len;
    int32_t *tok = xcalloc((size_t)cap, sizeof *tok);
    for (int i = 0; i < 5; i++) {
        if (rb_make_example(c, seed, RB_SPLIT_TRAIN, i, &tr[i], tok, cap, &len)) return 0;
        for (int t = 0; t < len; t++) h = mix(h, (uint64_t)tok[t]);
    }
    free(tok);
    mn_free(tr);
    mn_free(te);
    return h;
}

TEST(regbench_fixed_seed_stable) {
    RbConfig c = rb_config_default();
    uint64_t h1 = splits_hash(&c, SEED, N_TRAIN, N_TEST), h2 = splits_hash(&c, SEED, N_TRAIN, N_TEST);
    CHECK(h1 && h1 == h2, "two runs differ: %016llx %016llx", (unsigned long long)h1, (unsigned long long)h2);
    const uint64_t recorded = 0xb080e1a2199a3097ull;
    CHECK(h1 == recorded, "hash %016llx, recorded %016llx", (unsigned long long)h1, (unsigned long long)recorded);
    CHECK(splits_hash(&c, SEED + 1, N_TRAIN, N_TEST) != h1, "another seed gives the same sets");
}

TEST(regbench_strings_accepted) {
    RbConfig c = rb_config_default();
    RbDfa *tr, *te;
    CHECK(!rb_make_splits(&c, SEED, N_TRAIN, N_TEST, &tr, &te), "%s", mn_last_error());
    int cap = rb_max_tokens(&c), len, bad = 0, bad_shape = 0, bad_labels = 0;
    int32_t *tok = xcalloc((size_t)cap, sizeof *tok), *lab = xcalloc((size_t)cap, sizeof *lab);
    int *st = xcalloc((size_t)cap, sizeof *st);
    for (int i = 0; i < N_TRAIN + N_TEST; i++) {
        const RbDfa *d = i < N_TRAIN ? &tr[i] : &te[i - N_TRAIN];
        CHECK(!rb_make_example(&c, SEED, i < N_TRAIN ? RB_SPLIT_TRAIN : RB_SPLIT_TEST, i, d, tok, cap, &len), "%s",
              mn_last_error());
        CHECK(!rb_track(d, tok, len, st), "%s", mn_last_error());
        int nstr = 1, run = 0;
        for (int t = 0; t < len; t++) {
            if (st[t] < 0) bad++;
            if (tok[t] == RB_SEP) {
                if (run < c.min_len || run > c.max_len) bad_shape++;
                nstr++, run = 0;
            } else {
                if (tok[t] < 1 || tok[t] > RB_LETTERS) bad_shape++;
                run++;
            }
        }
        if (run < c.min_len || run > c.max_len || nstr < c.min_strings || nstr > c.max_strings) bad_shape++;
        rb_labels(tok, len, lab);
        for (int t = 0; t + 1 < len; t++)
            if (lab[t] != (tok[t + 1] == RB_SEP ? RB_IGNORE : tok[t + 1])) bad_labels++;
        // A perfect model: greedy valid everywhere, TVD 0.
        int32_t *pred = xcalloc((size_t)len, sizeof *pred);
        float *prob = xcalloc((size_t)len * RB_VOCAB, sizeof *prob);
        for (int t = 0; t + 1 < len; t++) {
            int s = st[t], k = rb_dfa_out_count(d, s);
            for (int a = 0; a < RB_LETTERS; a++)
                if (d->next[s][a] >= 0) prob[(size_t)t * RB_VOCAB + a + 1] = 1.0f / k, pred[t] = a + 1;
        }
        RbMetrics m = {0};
        CHECK(!rb_metrics_greedy(&m, d, tok, len, pred) && !rb_metrics_tvd(&m, d, tok, len, prob), "%s",
              mn_last_error());
        CHECK(m.n_greedy > 0 && rb_metrics_accuracy(&m) == 1 && rb_metrics_tvd_mean(&m) < 1e-6,
              "perfect model: accuracy %g tvd %g", rb_metrics_accuracy(&m), rb_metrics_tvd_mean(&m));
        free(pred);
        free(prob);
    }
    CHECK(!bad, "%d positions left the language", bad);
    CHECK(!bad_shape, "%d strings or examples outside the configured shape", bad_shape);
    CHECK(!bad_labels, "%d labels wrong", bad_labels);
    free(tok); free(lab); free(st);
    mn_free(tr); mn_free(te);
}

TEST(regbench_minimal_and_equivalent) {
    RbConfig c = rb_config_default();
    MnRng r;
    mn_rng_seed(&r, 99);
    int not_min = 0, not_equiv = 0, not_reach = 0, fewer = 0, hist[RB_MAX_STATES + 1] = {0};
    for (int i = 0; i < 2000; i++) {
        RbDfa raw, d;
        CHECK(!rb_dfa_random_raw(&c, &r, &raw), "%s", mn_last_error());
        d = raw;
        CHECK(!rb_dfa_minimize(&d), "%s", mn_last_error());
        hist[d.n]++;
        if (d.n < raw.n) fewer++;
        if (!same_language(&raw, 0, &d, 0)) not_equiv++;
        if (!all_reachable(&d)) not_reach++;
        for (int p = 0; p < d.n; p++)
            for (int q = p + 1; q < d.n; q++)
                if (same_language(&d, p, &d, q)) not_min++;
        RbDfa again = d;  // canonical: minimising again changes nothing
        CHECK(!rb_dfa_minimize(&again) && rb_dfa_equal(&again, &d), "minimising twice changed automaton %d", i);
    }
    CHECK(!not_equiv, "%d minimised automata accept another language than their raw form", not_equiv);
    CHECK(!not_reach, "%d with unreachable states", not_reach);
    CHECK(!not_min, "%d pairs of equivalent states", not_min);
    CHECK(fewer > 0, "no automaton lost a state: the minimiser was not exercised");
    test_note("2000 automata, %d smaller after minimisation; states 1..12: %d %d %d %d %d %d %d %d %d %d %d %d", fewer,
              hist[1], hist[2], hist[3], hist[4], hist[5], hist[6], hist[7], hist[8], hist[9], hist[10], hist[11],
              hist[12]);

    // A 4-cycle on one letter is a* : one state.
    RbDfa cyc = {.n = 4};
    memset(cyc.next, -1, sizeof cyc.next);
    for (int s = 0; s < 4; s++) cyc.next[s][0] = (int8_t)((s + 1) % 4);
    CHECK(!rb_dfa_minimize(&cyc) && cyc.n == 1 && cyc.next[0][0] == 0, "4-cycle on 'a' minimised to %d states", cyc.n);
    // Isomorphic automata with other numberings have one canonical form.
    RbDfa x = {.n = 3}, y = {.n = 3};
    memset(x.next, -1, sizeof x.next);
    memset(y.next, -1, sizeof y.next);
    x.next[0][0] = 1, x.next[1][1] = 2, x.next[2][2] = 0;  // 0 -a-> 1 -b-> 2 -c-> 0
    y.next[0][0] = 2, y.next[2][1] = 1, y.next[1][2] = 0;  // the same with states 1 and 2 swapped
    CHECK(!rb_dfa_minimize(&x) && !rb_dfa_minimize(&y) && rb_dfa_equal(&x, &y) && rb_dfa_hash(&x) == rb_dfa_hash(&y),
          "isomorphic automata have different canonical forms");
}

TEST(regbench_distinct_across_splits) {
    RbConfig c = rb_config_default();
    RbDfa *tr, *te, *tr2, *te2;
    CHECK(!rb_make_splits(&c, SEED, N_TRAIN, N_TEST, &tr, &te), "%s", mn_last_error());
    int n = N_TRAIN + N_TEST, same = 0;
    RbDfa *all = xcalloc((size_t)n, sizeof *all);
    memcpy(all, tr, N_TRAIN * sizeof *all);
    memcpy(all + N_TRAIN, te, N_TEST * sizeof *all);
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (rb_dfa_equal(&all[i], &all[j]) || same_language(&all[i], 0, &all[j], 0)) same++;
    CHECK(!same, "%d pairs of equal automata among train and test", same);
    // The test set does not depend on the train size; a smaller train set is a prefix of a larger.
    CHECK(!rb_make_splits(&c, SEED, 100, N_TEST, &tr2, &te2), "%s", mn_last_error());
    CHECK(!memcmp(te, te2, N_TEST * sizeof *te), "test set changed with the train size");
    CHECK(!memcmp(tr, tr2, 100 * sizeof *tr), "train set of 100 is not the prefix of the train set of %d", N_TRAIN);
    mn_free(tr2); mn_free(te2);
    CHECK(!rb_make_splits(&c, SEED, 0, 0, &tr2, &te2) && !tr2 && !te2, "empty splits: %s", mn_last_error());
    free(all);
    mn_free(tr); mn_free(te);
}

// States 0 -a,b-> 1 -c-> 0. Example "ac|bca": tokens a c | b c a.
TEST(regbench_metrics_hand) {
    RbDfa d = {.n = 2};
    memset(d.next, -1, sizeof d.next);
    d.next[0][0] = 1, d.next[0][1] = 1, d.next[1][2] = 0;
    const int32_t tok[] = {1, 3, RB_SEP, 2, 3, 1};
    int st[6], want[6] = {1, 0, 0, 1, 0, 1};
    CHECK(!rb_track(&d, tok, 6, st), "%s", mn_last_error());
    CHECK(!memcmp(st, want, sizeof st), "states %d %d %d %d %d %d", st[0], st[1], st[2], st[3], st[4], st[5]);
    // Scored: t = 0 (state 1), 2 (state 0), 3 (state 1), 4 (state 0); t = 1 precedes '|'.
    const int32_t good[] = {3, 7, 2, 3, 1}, badp[] = {1, 3, 3, 1, RB_SEP}, half[] = {3, 1, 3, 3, 1};
    RbMetrics m = {0};
    CHECK(!rb_metrics_greedy(&m, &d, tok, 6, good), "%s", mn_last_error());
    CHECK(m.n_greedy == 4 && m.n_valid == 4 && rb_metrics_accuracy(&m) == 1, "valid: %lld of %lld",
          (long long)m.n_valid, (long long)m.n_greedy);
    m = (RbMetrics){0};
    CHECK(!rb_metrics_greedy(&m, &d, tok, 6, badp), "%s", mn_last_error());
    CHECK(m.n_greedy == 4 && m.n_valid == 0, "invalid: %lld of %lld", (long long)m.n_valid, (long long)m.n_greedy);
    m = (RbMetrics){0};
    CHECK(!rb_metrics_greedy(&m, &d, tok, 6, half), "%s", mn_last_error());
    CHECK(rb_metrics_accuracy(&m) == 0.75, "mixed: accuracy %g, want 0.75", rb_metrics_accuracy(&m));

    float truth[5 * RB_VOCAB] = {0}, unif[5 * RB_VOCAB];
    truth[0 * RB_VOCAB + 3] = 1;
    truth[1 * RB_VOCAB + RB_PAD] = 1;  // position 1 is not scored: anything goes
    truth[2 * RB_VOCAB + 1] = truth[2 * RB_VOCAB + 2] = 0.5f;
    truth[3 * RB_VOCAB + 3] = 1;
    truth[4 * RB_VOCAB + 1] = truth[4 * RB_VOCAB + 2] = 0.5f;
    for (int i = 0; i < 5 * RB_VOCAB; i++) unif[i] = 1.0f / RB_VOCAB;
    m = (RbMetrics){0};
    CHECK(!rb_metrics_tvd(&m, &d, tok, 6, truth), "%s", mn_last_error());
    CHECK(m.n_tvd == 4 && rb_metrics_tvd_mean(&m) < 1e-9, "true distribution: tvd %g", rb_metrics_tvd_mean(&m));
    // Uniform over 20: at a 1-edge state 1/2 (0.95 + 19/20) = 0.95, at a 2-edge one 1/2 (0.9 + 18/20) = 0.9.
    m = (RbMetrics){0};
    CHECK(!rb_metrics_tvd(&m, &d, tok, 6, unif), "%s", mn_last_error());
    double tv = rb_metrics_tvd_mean(&m);
    CHECK(tv > 0.925 - 1e-6 && tv < 0.925 + 1e-6, "uniform: tvd %.9f, want 0.925", tv);
    CHECK(rb_tvd_row(&d, 1, unif) > 0.95 - 1e-6 && rb_tvd_row(&d, 1, unif) < 0.95 + 1e-6, "row tvd %g",
          rb_tvd_row(&d, 1, unif));
    // A prefix outside the language: its state is -1 and nothing predicted there is valid.
    const int32_t off[] = {3, 1};
    int st2[2];
    CHECK(!rb_track(&d, off, 2, st2) && st2[0] == -1 && st2[1] == -1, "off-language states %d %d", st2[0], st2[1]);
}

static void expect_refusal(int st, const char *needle) {
    CHECK(st == MN_ERR_ARG && strstr(mn_last_error(), needle), "want MN_ERR_ARG mentioning '%s', got %d: %s", needle,
          st, mn_last_error());
}

TEST(regbench_refusals) {
    RbConfig c;
    RbDfa *tr, *te, d;
    MnRng r;
    mn_rng_seed(&r, 1);
#define BAD(field, value, needle)                         \
    c = rb_config_default();                               \
    c.field = value;                                       \
    expect_refusal(rb_config_check(&c), needle);           \
    expect_refusal(rb_make_splits(&c, 1, 1, 1, &tr, &te), needle);
    BAD(max_states, RB_MAX_STATES + 1, "states");
    BAD(min_states, 1, "states");
    BAD(min_states, 13, "states");
    BAD(max_alpha, 19, "alphabet");
    BAD(min_out, 0, "outgoing");
    BAD(max_out, 4, "outgoing");  // min_states 4: at most 3 other states
    BAD(min_strings, 0, "strings");
    BAD(max_len, 0, "length");
    BAD(max_len, 1 << 20, "exceeds");
#undef BAD
    c = rb_config_default();
    c.min_alpha = 2;
    expect_refusal(rb_config_check(&c), "min_alpha = 2");
    c = rb_config_default();
    expect_refusal(rb_make_splits(&c, 1, -1, 1, &tr, &te), "train");
    // Settings with 18 languages only (x* for one letter x): 1 test + 17 train fit, 18 train do not.
    c = (RbConfig){.min_states = 2, .max_states = 2, .min_alpha = 1, .max_alpha = 1, .min_out = 1, .max_out = 1,
                   .min_strings = 1, .max_strings = 2, .min_len = 1, .max_len = 3};
    CHECK(!rb_make_splits(&c, 1, 17, 1, &tr, &te), "17 + 1 of the 18 x* automata: %s", mn_last_error());
    mn_free(tr);
    mn_free(te);
    expect_refusal(rb_make_splits(&c, 1, 18, 1, &tr, &te), "too few");
    CHECK(!tr && !te, "outputs set on failure");
    // Buffers, tokens, probabilities, malformed tables.
    c = rb_config_default();
    CHECK(!rb_dfa_random(&c, &r, &d), "%s", mn_last_error());
    int32_t tok[8], len;
    expect_refusal(rb_sample_example(&c, &d, &r, tok, 8, &len), "buffer");
    expect_refusal(rb_make_example(&c, 1, 2, 0, &d, tok, 8, &len), "split 2");
    const int32_t badtok[] = {1, 20};
    int st[2];
    expect_refusal(rb_track(&d, badtok, 2, st), "token 20");
    RbMetrics m = {0};
    expect_refusal(rb_metrics_greedy(&m, &d, badtok, 2, (const int32_t[]){1, 1}), "token 20");
    int a = 0;
    while (d.next[0][a] < 0) a++;
    const int32_t ok[] = {RB_SEP, a + 1};
    float row[2 * RB_VOCAB] = {0};
    row[0] = -0.5f, row[1] = 1.5f;
    expect_refusal(rb_metrics_tvd(&m, &d, ok, 2, row), "not finite and >= 0");
    row[0] = 0, row[1] = 0.5f;
    expect_refusal(rb_metrics_tvd(&m, &d, ok, 2, row), "sum to");
    RbDfa broken = d;
    broken.next[0][0] = (int8_t)broken.n;
    expect_refusal(rb_dfa_minimize(&broken), "goes to");
    broken.n = 0;
    expect_refusal(rb_dfa_minimize(&broken), "0 states");
}
