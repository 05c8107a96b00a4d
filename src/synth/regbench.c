// RegBench generator and metrics (regbench.h).
#include "synth/regbench.h"

#include <math.h>
#include <string.h>

RbConfig rb_config_default(void) {
    RbConfig c = {.min_states = 4, .max_states = 12, .min_alpha = 4, .max_alpha = 18, .min_out = 1,
                  .max_out = 3, .min_strings = 10, .max_strings = 19, .min_len = 1, .max_len = 49};
    return c;
}

static int check_range(const char *what, int lo, int hi, int min, int max) {
    if (lo < min || hi > max || lo > hi)
        return mn_error(MN_ERR_ARG, "regbench: %s range %d..%d is not a non-empty range within %d..%d", what,
                        lo, hi, min, max);
    return MN_OK;
}

int rb_config_check(const RbConfig *c) {
    if (!c) return mn_error(MN_ERR_ARG, "regbench: no config");
    MN_TRY(check_range("states", c->min_states, c->max_states, 2, RB_MAX_STATES));
    MN_TRY(check_range("alphabet", c->min_alpha, c->max_alpha, 1, RB_LETTERS));
    int out_max = mn_min(c->min_states - 1, c->min_alpha);
    if (c->min_out < 1 || c->max_out > out_max || c->min_out > c->max_out)
        return mn_error(MN_ERR_ARG,
                        "regbench: outgoing edges range %d..%d is not a non-empty range within 1..%d (edges go "
                        "to distinct other states on distinct letters: at most min_states - 1 = %d and "
                        "min_alpha = %d)",
                        c->min_out, c->max_out, out_max, c->min_states - 1, c->min_alpha);
    MN_TRY(check_range("strings per example", c->min_strings, c->max_strings, 1, 1 << 20));
    MN_TRY(check_range("string length", c->min_len, c->max_len, 1, 1 << 20));
    if ((int64_t)c->max_strings * (c->max_len + 1) - 1 > (1 << 20))
        return mn_error(MN_ERR_ARG, "regbench: an example of %d strings of %d letters exceeds %d tokens",
                        c->max_strings, c->max_len, 1 << 20);
    return MN_OK;
}

int rb_max_tokens(const RbConfig *c) { return c->max_strings * (c->max_len + 1) - 1; }

// Uniform in lo..hi (inclusive). The modulo bias is below 2^-59 for these ranges.
static int uni(MnRng *r, int lo, int hi) { return lo + (int)(mn_rng_u64(r) % (uint64_t)(hi - lo + 1)); }

// The first m entries of a uniformly shuffled v[0..n-1] (partial Fisher-Yates): m distinct draws.
static void choose(MnRng *r, int *v, int n, int m) {
    for (int i = 0; i < m; i++) {
        int j = uni(r, i, n - 1);
        int t = v[i]; v[i] = v[j]; v[j] = t;
    }
}

int rb_dfa_random_raw(const RbConfig *c, MnRng *rng, RbDfa *out) {
    MN_TRY(rb_config_check(c));
    memset(out, 0, sizeof *out);
    int n = uni(rng, c->min_states, c->max_states);
    int na = uni(rng, c->min_alpha, c->max_alpha);
    int alpha[RB_LETTERS];
    for (int i = 0; i < RB_LETTERS; i++) alpha[i] = i;
    choose(rng, alpha, RB_LETTERS, na);
    out->n = n;
    memset(out->next, -1, sizeof out->next);
    for (int s = 0; s < n; s++) {
        int m = uni(rng, c->min_out, c->max_out);
        int sym[RB_LETTERS], dst[RB_MAX_STATES], nd = 0;
        memcpy(sym, alpha, sizeof sym);
        choose(rng, sym, na, m);
        for (int t = 0; t < n; t++)
            if (t != s) dst[nd++] = t;
        choose(rng, dst, nd, m);
        for (int i = 0; i < m; i++) out->next[s][sym[i]] = (int8_t)dst[i];
    }
    return MN_OK;
}

/*
 * Minimisation. The PFA's next-letter distribution at a state is uniform over the letters with an
 * edge, so it is a function of the DFA state's set of defined letters. Every state is accepting
 * and a missing edge leads to the (implicit) rejecting dead state, so a letter a is defined at s
 * exactly when s accepts the one-letter string a. Hence two DFA-equivalent states (same language
 * from there) have the same defined letters, the same distribution, and DFA-equivalent successors
 * on each letter: by induction they give every string the same probability, and they are equivalent
 * as PFAs. Conversely PFA-equivalent states have the same support, hence the same language. So the
 * PFA's minimal form is the DFA's, and partition refinement on the DFA is all it needs.
 *
 * Moore's refinement: start from one class of all (live, accepting) states; split by the tuple
 * (class, class of the successor on each letter, -1 for none) until the class count is stable.
 * With n <= 16 states the quadratic signature comparison costs nothing.
 */
int rb_dfa_minimize(RbDfa *d) {
    if (!d || d->n < 1 || d->n > RB_MAX_STATES)
        return mn_error(MN_ERR_ARG, "regbench: automaton with %d states (1..%d)", d ? d->n : 0, RB_MAX_STATES);
    int n = d->n;
    for (int s = 0; s < n; s++)
        for (int a = 0; a < RB_LETTERS; a++)
            if (d->next[s][a] < -1 || d->next[s][a] >= n)
                return mn_error(MN_ERR_ARG, "regbench: state %d letter %d goes to %d, not a state of 0..%d or -1",
                                s, a, d->next[s][a], n - 1);
    // Trim: states reachable from the start, in BFS order.
    int order[RB_MAX_STATES], idx[RB_MAX_STATES], nr = 0;
    for (int s = 0; s < n; s++) idx[s] = -1;
    order[nr++] = 0;
    idx[0] = 0;
    for (int h = 0; h < nr; h++)
        for (int a = 0; a < RB_LETTERS; a++) {
            int t = d->next[order[h]][a];
            if (t >= 0 && idx[t] < 0) idx[t] = nr, order[nr++] = t;
        }
    int8_t tr[RB_MAX_STATES][RB_LETTERS];
    for (int i = 0; i < nr; i++)
        for (int a = 0; a < RB_LETTERS; a++) {
            int t = d->next[order[i]][a];
            tr[i][a] = (int8_t)(t < 0 ? -1 : idx[t]);
        }
    // Moore refinement over the nr reachable states.
    int cls[RB_MAX_STATES] = {0}, ncls = 1;
    for (;;) {
        int sig[RB_MAX_STATES][RB_LETTERS + 1], ncl[RB_MAX_STATES], nn = 0;
        for (int i = 0; i < nr; i++) {
            sig[i][0] = cls[i];
            for (int a = 0; a < RB_LETTERS; a++) sig[i][a + 1] = tr[i][a] < 0 ? -1 : cls[tr[i][a]];
            ncl[i] = -1;
            for (int j = 0; j < i; j++)
                if (!memcmp(sig[i], sig[j], sizeof sig[i])) { ncl[i] = ncl[j]; break; }
            if (ncl[i] < 0) ncl[i] = nn++;
        }
        memcpy(cls, ncl, (size_t)nr * sizeof ncl[0]);  // (entries past nr: unused)
        if (nn == ncls) break;  // refinement only splits: equal counts mean a fixed point
        ncls = nn;
    }
    // Quotient, then canonical numbering: BFS from the start's class, letters in order.
    int rep[RB_MAX_STATES];
    for (int i = nr - 1; i >= 0; i--) rep[cls[i]] = i;
    int corder[RB_MAX_STATES], cidx[RB_MAX_STATES], nc = 0;
    for (int k = 0; k < ncls; k++) cidx[k] = -1;
    corder[nc++] = cls[0];
    cidx[cls[0]] = 0;
    for (int h = 0; h < nc; h++)
        for (int a = 0; a < RB_LETTERS; a++) {
            int t = tr[rep[corder[h]]][a];
            if (t >= 0 && cidx[cls[t]] < 0) cidx[cls[t]] = nc, corder[nc++] = cls[t];
        }
    memset(d->next, -1, sizeof d->next);
    d->n = nc;
    for (int i = 0; i < nc; i++)
        for (int a = 0; a < RB_LETTERS; a++) {
            int t = tr[rep[corder[i]]][a];
            d->next[i][a] = (int8_t)(t < 0 ? -1 : cidx[cls[t]]);
        }
    return MN_OK;
}

int rb_dfa_random(const RbConfig *c, MnRng *rng, RbDfa *out) {
    MN_TRY(rb_dfa_random_raw(c, rng, out));
    return rb_dfa_minimize(out);
}

int rb_dfa_equal(const RbDfa *a, const RbDfa *b) {
    return a->n == b->n && !memcmp(a->next, b->next, (size_t)a->n * RB_LETTERS);
}

uint64_t rb_dfa_hash(const RbDfa *d) {
    uint64_t h = 1469598103934665603ull;
    h = (h ^ (uint64_t)d->n) * 1099511628211ull;
    const int8_t *p = &d->next[0][0];
    for (int i = 0; i < d->n * RB_LETTERS; i++) h = (h ^ (uint8_t)p[i]) * 1099511628211ull;
    return h;
}

uint32_t rb_dfa_out_mask(const RbDfa *d, int s) {
    uint32_t m = 0;
    for (int a = 0; a < RB_LETTERS; a++)
        if (d->next[s][a] >= 0) m |= 1u << a;
    return m;
}

int rb_dfa_out_count(const RbDfa *d, int s) { return __builtin_popcount(rb_dfa_out_mask(d, s)); }

// ---------------------------------------------------------------------------
// Deduplicated sets: an open-addressing table of indices into the automata drawn so far.

typedef struct {
    const RbDfa *items;
    int32_t *slot;  // index + 1, 0 empty
    uint64_t mask;
} RbTable;

static int table_init(RbTable *t, const RbDfa *items, int cap) {
    uint64_t n = 16;
    while (n < 2 * (uint64_t)cap + 2) n <<= 1;
    t->items = items;
    t->mask = n - 1;
    t->slot = mn_calloc(n, sizeof *t->slot);
    return t->slot ? MN_OK : MN_ERR_NOMEM;
}

// Whether d is in the table; if not and `add` >= 0, records it as item `add`.
static int table_has(RbTable *t, const RbDfa *d, int add) {
    for (uint64_t i = rb_dfa_hash(d) & t->mask;; i = (i + 1) & t->mask) {
        if (!t->slot[i]) {
            if (add >= 0) t->slot[i] = add + 1;
            return 0;
        }
        if (rb_dfa_equal(&t->items[t->slot[i] - 1], d)) return 1;
    }
}

// n distinct automata from rng into out, none in `exclude` (may be NULL).
static int draw_set(const RbConfig *c, MnRng *rng, int n, RbTable *exclude, RbDfa *out, const char *split) {
    RbTable t;
    MN_TRY(table_init(&t, out, n));
    int64_t max_draws = 10 * (int64_t)n + 1000, draws = 0;
    int got = 0, st = MN_OK;
    while (got < n && draws < max_draws) {
        draws++;
        if ((st = rb_dfa_random(c, rng, &out[got]))) break;
        if (exclude && table_has(exclude, &out[got], -1)) continue;
        if (!table_has(&t, &out[got], got)) got++;
    }
    mn_free(t.slot);
    if (st) return st;
    if (got < n)
        return mn_error(MN_ERR_ARG,
                        "regbench: only %d distinct %s automata of the %d asked for after %lld draws: these settings "
                        "(states %d..%d, alphabet %d..%d, edges %d..%d) allow too few distinct languages",
                        got, split, n, (long long)draws, c->min_states, c->max_states, c->min_alpha, c->max_alpha,
                        c->min_out, c->max_out);
    return MN_OK;
}

#define RB_STREAM_TEST 0x7265676265746573ull   // "regbetes"
#define RB_STREAM_TRAIN 0x7265676274726e00ull  // "regbtrn"

int rb_make_splits(const RbConfig *c, uint64_t seed, int n_train, int n_test, RbDfa **train, RbDfa **test) {
    if (!train || !test) return mn_error(MN_ERR_ARG, "regbench: no output arrays");
    *train = *test = NULL;
    MN_TRY(rb_config_check(c));
    if (n_train < 0 || n_test < 0 || n_train > (1 << 26) || n_test > (1 << 26))
        return mn_error(MN_ERR_ARG, "regbench: %d train and %d test automata: each must be in 0..%d", n_train, n_test,
                        1 << 26);
    RbDfa *te = n_test ? mn_calloc((size_t)n_test, sizeof *te) : NULL;
    RbDfa *tr = n_train ? mn_calloc((size_t)n_train, sizeof *tr) : NULL;
    if ((n_test && !te) || (n_train && !tr)) {
        mn_free(te); mn_free(tr);
        return MN_ERR_NOMEM;
    }
    MnRng r;
    mn_rng_seed(&r, seed ^ RB_STREAM_TEST);
    int st = draw_set(c, &r, n_test, NULL, te, "test");
    if (!st && n_train) {
        RbTable ex;
        st = table_init(&ex, te, n_test);
        for (int i = 0; !st && i < n_test; i++) table_has(&ex, &te[i], i);
        mn_rng_seed(&r, seed ^ RB_STREAM_TRAIN);
        if (!st) st = draw_set(c, &r, n_train, &ex, tr, "train");
        mn_free(ex.slot);
    }
    if (st) {
        mn_free(te); mn_free(tr);
        return st;
    }
    *train = tr;
    *test = te;
    return MN_OK;
}

uint64_t rb_example_seed(uint64_t seed, int split, int64_t index) {
    // splitmix64's finaliser over the three, so neighbouring indices give unrelated streams.
    uint64_t z = seed ^ ((uint64_t)(split + 1) * 0xD1B54A32D192ED03ull) ^ ((uint64_t)index * 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

int rb_sample_example(const RbConfig *c, const RbDfa *d, MnRng *rng, int32_t *tok, int cap, int *len) {
    MN_TRY(rb_config_check(c));
    if (!d || d->n < 1 || d->n > RB_MAX_STATES)
        return mn_error(MN_ERR_ARG, "regbench: automaton with %d states (1..%d)", d ? d->n : 0, RB_MAX_STATES);
    if (cap < rb_max_tokens(c))
        return mn_error(MN_ERR_ARG, "regbench: example buffer of %d tokens, these settings need %d", cap,
                        rb_max_tokens(c));
    int ns = uni(rng, c->min_strings, c->max_strings), L = 0;
    for (int i = 0; i < ns; i++) {
        if (i) tok[L++] = RB_SEP;
        int m = uni(rng, c->min_len, c->max_len), s = 0;
        for (int k = 0; k < m; k++) {
            int8_t const *row = d->next[s];
            int cnt = 0, opts[RB_LETTERS];
            for (int a = 0; a < RB_LETTERS; a++)
                if (row[a] >= 0) opts[cnt++] = a;
            if (!cnt) break;  // a state without edges (never in generated automata): the string ends
            int a = opts[uni(rng, 0, cnt - 1)];
            tok[L++] = a + 1;
            s = row[a];
        }
    }
    *len = L;
    return MN_OK;
}

int rb_make_example(const RbConfig *c, uint64_t seed, int split, int64_t index, const RbDfa *d, int32_t *tok,
                    int cap, int *len) {
    if (split != RB_SPLIT_TRAIN && split != RB_SPLIT_TEST)
        return mn_error(MN_ERR_ARG, "regbench: split %d is neither train (%d) nor test (%d)", split, RB_SPLIT_TRAIN,
                        RB_SPLIT_TEST);
    MnRng r;
    mn_rng_seed(&r, rb_example_seed(seed, split, index));
    return rb_sample_example(c, d, &r, tok, cap, len);
}

void rb_labels(const int32_t *tok, int len, int32_t *labels) {
    for (int t = 0; t + 1 < len; t++) labels[t] = tok[t + 1] == RB_SEP ? RB_IGNORE : tok[t + 1];
}

int rb_track(const RbDfa *d, const int32_t *tok, int len, int *state) {
    int s = 0;
    for (int t = 0; t < len; t++) {
        int v = tok[t];
        if (v == RB_SEP) s = 0;
        else if (v >= 1 && v <= RB_LETTERS) s = s < 0 ? -1 : d->next[s][v - 1];
        else return mn_error(MN_ERR_ARG, "regbench: token %d at position %d is neither a letter (1..18) nor '|' (19)", v, t);
        state[t] = s;
    }
    return MN_OK;
}

// States along tok (len <= the longest example a config allows, 1<<20); heap, as examples may be long.
static int track_alloc(const RbDfa *d, const int32_t *tok, int len, int **state) {
    if (!d || !tok || len < 0) return mn_error(MN_ERR_ARG, "regbench: no automaton or tokens");
    *state = mn_calloc((size_t)mn_max(len, 1), sizeof **state);
    if (!*state) return MN_ERR_NOMEM;
    int st = rb_track(d, tok, len, *state);
    if (st) mn_free(*state);
    return st;
}

int rb_metrics_greedy(RbMetrics *m, const RbDfa *d, const int32_t *tok, int len, const int32_t *pred) {
    int *state = NULL;
    MN_TRY(track_alloc(d, tok, len, &state));
    for (int t = 0; t + 1 < len; t++) {
        if (tok[t + 1] == RB_SEP) continue;
        int s = state[t], p = pred[t];
        m->n_greedy++;
        if (s >= 0 && p >= 1 && p <= RB_LETTERS && d->next[s][p - 1] >= 0) m->n_valid++;
    }
    mn_free(state);
    return MN_OK;
}

double rb_tvd_row(const RbDfa *d, int s, const float *row) {
    int cnt = s >= 0 ? rb_dfa_out_count(d, s) : 0;
    double sum = 0;
    for (int v = 0; v < RB_VOCAB; v++) {
        double q = (cnt && v >= 1 && v <= RB_LETTERS && d->next[s][v - 1] >= 0) ? 1.0 / cnt : 0.0;
        sum += fabs((double)row[v] - q);
    }
    return 0.5 * sum;
}

int rb_metrics_tvd(RbMetrics *m, const RbDfa *d, const int32_t *tok, int len, const float *probs) {
    for (int t = 0; t + 1 < len; t++) {
        if (tok[t + 1] == RB_SEP) continue;
        const float *row = probs + (size_t)t * RB_VOCAB;
        double sum = 0;
        for (int v = 0; v < RB_VOCAB; v++) {
            if (!isfinite(row[v]) || row[v] < 0)
                return mn_error(MN_ERR_ARG, "regbench: probability %g at position %d token %d is not finite and >= 0",
                                (double)row[v], t, v);
            sum += row[v];
        }
        if (fabs(sum - 1) > 1e-3)
            return mn_error(MN_ERR_ARG, "regbench: probabilities at position %d sum to %.6g, not 1", t, sum);
    }
    int *state = NULL;
    MN_TRY(track_alloc(d, tok, len, &state));
    for (int t = 0; t + 1 < len; t++) {
        if (tok[t + 1] == RB_SEP) continue;
        m->n_tvd++;
        m->tvd_sum += rb_tvd_row(d, state[t], probs + (size_t)t * RB_VOCAB);
    }
    mn_free(state);
    return MN_OK;
}

double rb_metrics_accuracy(const RbMetrics *m) { return m->n_greedy ? (double)m->n_valid / m->n_greedy : 0; }
double rb_metrics_tvd_mean(const RbMetrics *m) { return m->n_tvd ? m->tvd_sum / m->n_tvd : 0; }
