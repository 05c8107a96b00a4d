/*
 * RegBench: in-context language learning with random probabilistic finite automata (Akyurek et
 * al., ICML 2024, code berlino/seq_icl src/dataloaders/dfa.py; the MesaNet paper uses it). Each
 * example is one random automaton; several strings sampled from it, joined by '|', form one
 * sequence, and a model must infer the language in context. Spec: docs/spec/benchmarks.md
 * (RegBench) and docs/spec/reference/benchmarks-notes.md section 2.
 *
 * Vocabulary (20 tokens, sorted character order as seq_icl): '.' (pad) = 0, letters 'a'..'r' =
 * 1..18, '|' (separator) = 19. An automaton's letters are 0..17 (token = letter + 1).
 *
 * An automaton: 4-12 states, an alphabet of 4-18 of the 18 letters, each state 1-3 outgoing
 * edges on distinct letters to distinct other states (no self-loops), start state 0, every state
 * accepting (a prefix-closed language); a string is a random walk from the start that picks
 * uniformly among the current state's outgoing letters. Automata are trimmed (reachable states
 * only), minimised and held in a canonical numbering, so two are the same exactly when their
 * tables are equal; sets are deduplicated on that, and train and test sets are disjoint.
 *
 * Everything is deterministic in the seed (MnRng, the same on every platform); it does not
 * reproduce numpy's streams of seq_icl, only its distributions. Where this differs from seq_icl, or
 * the notes are silent:
 * - Deduplication is on the canonical minimal form (BFS numbering from the start): equal forms
 *   exactly when the languages, hence the PFAs, are equal. seq_icl hashes a sorted transition
 *   table, which can miss isomorphic copies numbered differently; letters of an automaton's
 *   alphabet that no edge uses do not count (they change neither the language nor the PFA).
 * - seq_icl draws one deduplicated pool, shuffles and splits it. Here the test set comes from its
 *   own stream first and the train set from another, skipping any test automaton, so the test set
 *   is the same for every train size. The draw limit (10 n + 1000) mirrors seq_icl's 10 n.
 * - Metric probabilities are rows over the whole 20-token vocabulary: mass on '.' or '|' counts
 *   against the model. TVD is reported in the textbook form (halved); seq_icl's is twice it.
 */
#ifndef MN_SYNTH_REGBENCH_H
#define MN_SYNTH_REGBENCH_H

#include <stdint.h>

#include "core/common.h"

#define RB_VOCAB 20
#define RB_PAD 0
#define RB_SEP 19
#define RB_LETTERS 18     // letters 'a'..'r'; letter i is token i + 1
#define RB_MAX_STATES 16  // the most a config may ask for (seq_icl: 12)
#define RB_IGNORE (-100)  // label of a position that is not trained or scored

typedef struct {
    int min_states, max_states;    // states per automaton, before minimisation (4..12)
    int min_alpha, max_alpha;      // letters per automaton's alphabet (4..18)
    int min_out, max_out;          // outgoing edges per state (1..3)
    int min_strings, max_strings;  // strings per example (10..19)
    int min_len, max_len;          // letters per string (1..49)
} RbConfig;

// seq_icl's defaults (the ranges above, inclusive).
RbConfig rb_config_default(void);
// MN_OK, or MN_ERR_ARG naming the bad field and its allowed range: every range must be non-empty;
// states 2..RB_MAX_STATES, alphabet 1..RB_LETTERS, out >= 1 and max_out <= min_states - 1 (distinct
// other states) and <= min_alpha (distinct letters), strings >= 1, lengths >= 1, and an example
// (rb_max_tokens) at most 1<<20 tokens.
int rb_config_check(const RbConfig *c);
// The longest example: max_strings * (max_len + 1) - 1 tokens.
int rb_max_tokens(const RbConfig *c);

// A deterministic automaton: next[s][a] = the state reached from s on letter a, or -1 (no edge:
// the string leaves the language). Start state 0; every state accepting.
typedef struct {
    int n;  // states, 1..RB_MAX_STATES
    int8_t next[RB_MAX_STATES][RB_LETTERS];
} RbDfa;

// One random automaton as seq_icl draws it, before trimming and minimisation.
int rb_dfa_random_raw(const RbConfig *c, MnRng *rng, RbDfa *out);
// Trims (keeps states reachable from the start), minimises (Moore partition refinement) and
// renumbers canonically (BFS from the start, letters in order), in place. MN_ERR_ARG on a malformed
// table (n out of range, a target out of range).
int rb_dfa_minimize(RbDfa *d);
// rb_dfa_random_raw then rb_dfa_minimize.
int rb_dfa_random(const RbConfig *c, MnRng *rng, RbDfa *out);
// Of canonical (minimised) automata: equal exactly when their languages (hence their PFAs) are.
int rb_dfa_equal(const RbDfa *a, const RbDfa *b);
uint64_t rb_dfa_hash(const RbDfa *d);  // FNV-1a over n and the n used rows
// Letters with an edge from state s, as a bit mask; and their count.
uint32_t rb_dfa_out_mask(const RbDfa *d, int s);
int rb_dfa_out_count(const RbDfa *d, int s);

// The benchmark's automata: n_test distinct ones from the test stream (seed), then n_train
// distinct ones from the train stream (seed) that are none of the test ones. The test set does not
// depend on n_train, and a smaller n_train is a prefix of a larger one, so the training sizes
// {1K ... 40K} share one test set. *train and *test are mn_calloc'ed (mn_free them); either count
// may be 0 (its array then NULL). MN_ERR_ARG when the settings cannot give that many distinct
// automata within 10 n + 1000 draws.
int rb_make_splits(const RbConfig *c, uint64_t seed, int n_train, int n_test, RbDfa **train,
                   RbDfa **test);

enum { RB_SPLIT_TRAIN = 0, RB_SPLIT_TEST = 1 };
// The generator seed of the example of automaton `index` of a split, so each example can be made
// on its own (seq_icl makes one fixed text per automaton).
uint64_t rb_example_seed(uint64_t seed, int split, int64_t index);

// One example: w1 '|' w2 '|' ... '|' wn, n = U{min_strings..max_strings}, |wi| =
// U{min_len..max_len}, each a uniform random walk from the start. Writes *len tokens to tok
// (cap >= rb_max_tokens(c), else MN_ERR_ARG).
int rb_sample_example(const RbConfig *c, const RbDfa *d, MnRng *rng, int32_t *tok, int cap, int *len);
// rb_sample_example with the generator of rb_example_seed(seed, split, index): the fixed example of
// that automaton.
int rb_make_example(const RbConfig *c, uint64_t seed, int split, int64_t index, const RbDfa *d, int32_t *tok,
                    int cap, int *len);
// Training labels as seq_icl: inputs = tok[0 .. len-2], labels[t] = tok[t+1], RB_IGNORE where that
// is '|' (the separator is never trained). Writes len - 1 labels.
void rb_labels(const int32_t *tok, int len, int32_t *labels);

// The automaton's state after the current string's prefix through tok[t] (the characters since the
// last '|'; the start state right after a '|'), for t = 0..len-1; -1 where the prefix has left the
// language (never for sampled examples). MN_ERR_ARG on a token out of 1..19.
int rb_track(const RbDfa *d, const int32_t *tok, int len, int *state);

// Metrics over the scored positions: position t (0..len-2, whose input is tok[t]) is scored when
// tok[t+1] is a letter (a string's end is never scored, its length being random). Accumulate over
// a test set with rb_metrics_* and read the means.
typedef struct {
    int64_t n_greedy, n_valid;  // scored greedy predictions, valid ones among them
    int64_t n_tvd;              // scored distributions
    double tvd_sum;             // sum of textbook TVD, 1/2 sum_v |p_v - q_v|
} RbMetrics;

// Greedy validity: pred[t] (len - 1 entries, the argmax for tok[t+1]) is valid when it is a
// letter with an edge from the state after the prefix through tok[t].
int rb_metrics_greedy(RbMetrics *m, const RbDfa *d, const int32_t *tok, int len, const int32_t *pred);
// TVD: probs holds len - 1 rows of RB_VOCAB probabilities (row t for tok[t+1], a softmax over the
// whole vocabulary); the true row is uniform over the letters with an edge from the state (0 on
// pad and '|'). Rows must be finite, >= 0 and sum to 1 within 1e-3 (else MN_ERR_ARG).
int rb_metrics_tvd(RbMetrics *m, const RbDfa *d, const int32_t *tok, int len, const float *probs);
// One position's TVD against state s's true distribution (s = -1, a prefix outside the language,
// has no next letter: the TVD is then half the row's mass, i.e. 1/2).
double rb_tvd_row(const RbDfa *d, int s, const float *row);
double rb_metrics_accuracy(const RbMetrics *m);  // n_valid / n_greedy (0 when none)
// Mean textbook TVD. seq_icl's eval.py reports sum_v |p - q| without the 1/2: twice this.
double rb_metrics_tvd_mean(const RbMetrics *m);

#endif
