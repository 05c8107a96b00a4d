/*
 * Synthetic benchmarks: deterministic, seeded generators of token sequences
 * with per-position targets (docs/spec/benchmarks.md and
 * docs/spec/reference/benchmarks-notes.md): MQAR (Zoology), MAD's six tasks, parity,
 * S-NIAH.
 *
 * An example is `inputs[T]` (int32 ids in [0, vocab)) and `targets[T]`
 * (int32 ids, -1 where no loss is taken: the model's cross-entropy ignores
 * targets < 0). A task is one row of a table (synth_task): name, baseline
 * settings, the one-variable variations that make its settings grid, a
 * generator and a metric, so that a command can train and score every task
 * without task-specific code:
 *
 *     const SynthTask *t = synth_find("mad-recall");
 *     for (int g = 0; g < synth_grid_count(t); g++) {
 *         SynthSettings s; char label[64];
 *         synth_grid(t, g, &s, label, sizeof label);
 *         int V, T; synth_shape(t, &s, SYNTH_TRAIN, &V, &T);
 *         synth_make(t, &s, SYNTH_TRAIN, seed, first, n, inputs, targets);   // n x T each
 *         ... model ... predictions (argmax ids, n x T) ...
 *         SynthMeter m = {0}; synth_meter_add(t, &m, pred, targets, n, T, V);
 *         double score = synth_meter_value(&m);
 *     }
 *
 * Determinism: example `i` of split `split` is drawn from its own generator,
 * seeded from (seed, split, i), so a data set is the same whatever the batch
 * size or order in which it is made, and train and test are separate streams.
 * Fixed objects of a task (MAD memorization's key -> value map) come from the
 * seed alone and are shared by both splits, as in MAD.
 */
#ifndef MN_SYNTH_H
#define MN_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#include "core/common.h"

enum { SYNTH_TRAIN = 0, SYNTH_TEST = 1 };

// How a task is scored (synth_meter_add).
typedef enum {
    SYNTH_METRIC_POSITION = 0,  // accuracy over all target positions (micro)
    SYNTH_METRIC_EXAMPLE = 1,   // per example: mean over its target positions; then mean over examples (Zoology MQAR)
    SYNTH_METRIC_MACRO = 2,     // MAD: per batch, recall per class averaged over classes present; mean over batches
    SYNTH_METRIC_EXACT = 3,     // per example: 1 if every target position is right (S-NIAH); mean over examples
} SynthMetric;

// Every task's knobs in one struct; a task reads the fields it uses and
// ignores the others (synth_set names them; the grid varies them).
typedef struct {
    int vocab;              // vocabulary size V
    int seq_len;            // the task's length L (see each task; the model's T comes from synth_shape)
    int num_pairs;          // MQAR: K key-value pairs
    double power_a;         // MQAR: gap distribution p_i ~ i^(a-1)
    int random_non_queries; // MQAR: fill the query region's zeros with random tokens (Zoology default; Fig. 2 uses 0)
    int noise_vocab;        // MAD noisy recall: the number of noise tokens (last of the non-special vocab)
    double frac_noise;      // MAD noisy recall: probability that a slot is noise
    int multi_query;        // MAD recall: 1 (the benchmark's setting; 0 is not implemented)
    int k_motif, v_motif;   // MAD fuzzy recall: largest key / value length in tokens
    int num_copy;           // MAD selective copying: tokens to copy
    int min_len;            // parity: shortest training string
    int test_min_len;       // parity: shortest test string
    int test_len;           // parity: longest test string (the test's T)
    int final_only;         // parity: 1 = only the final parity is a target (else the running parity)
    int key_len;            // S-NIAH: tokens of the needle's key
    int value_len;          // S-NIAH: tokens of the needle's value
    double depth;           // S-NIAH: needle depth in [0, 1] (fraction of the haystack), or < 0: uniform per example
    int64_t n_train;        // examples of the training set
    int64_t n_test;         // examples of the test set
} SynthSettings;

typedef struct SynthTask SynthTask;

// One variable of a settings grid and the values that replace its baseline
// value, one at a time (MAD's "changes"; they never combine). With field2, the
// i-th change also sets field2 to values2[i] (MQAR's (L, K) pairs).
typedef struct {
    const char *field;  // a synth_set name
    int n;
    double values[8];
    const char *field2; // NULL: none
    double values2[8];
    const char *axis;   // plots: the quantity the grid varies, named for an axis ("training automata"),
                        // where the settings are better drawn at their values than as categories; NULL: none
} SynthVary;

struct SynthTask {
    const char *name;       // "mqar", "mad-recall", ..., "parity", "niah-1"
    const char *family;     // "mqar", "mad", "parity", "niah"
    const char *summary;    // one line
    SynthMetric metric;
    int autoencoder;        // 1: MAD compression, whose model reads the input and decodes every
                            // position from the last position's state (not a causal LM)
    SynthSettings base;     // the baseline setting
    const SynthVary *vary;  // the one-variable variations (NULL: none)
    int n_vary;
    // Internal: validation, shape, optional fixed objects, the generator of one example.
    int (*check)(const SynthSettings *s);
    void (*shape)(const SynthSettings *s, int split, int *vocab, int *T);
    int (*prepare)(const SynthSettings *s, uint64_t seed, void **ctx);  // NULL: none
    void (*release)(void *ctx);
    void (*gen)(const SynthSettings *s, int split, MnRng *rng, const void *ctx, int32_t *in, int32_t *tgt);
};

// The task table.
int synth_task_count(void);
const SynthTask *synth_task(int i);
// The task called `name`, or NULL with an mn_error message listing the names.
const SynthTask *synth_find(const char *name);

// The settings grid: the baseline (index 0) then each variation value in order.
int synth_grid_count(const SynthTask *t);
// Fills *s with setting `i` and `label` (if non-NULL) with "baseline" or "field=value".
// MN_ERR_ARG for an index out of range.
int synth_grid(const SynthTask *t, int i, SynthSettings *s, char *label, size_t label_size);

// The quantity a task's settings vary, for a plot's x axis: its name, and the value of each of
// the synth_grid_count(t) settings in values (baseline first). NULL where the grid is not one
// such quantity (several fields, or a variation without an axis name): plot it as categories.
const char *synth_grid_axis(const SynthTask *t, double *values);

// What the task's metric measures, for axis labels and tables ("exact-match accuracy").
// Every metric is a fraction in [0, 1], higher is better.
const char *synth_metric_name(const SynthTask *t);

// Sets the field `field` of *s from the text `value` ("vocab", "32"); MN_ERR_ARG
// naming the field for an unknown field or a value that is not a number.
int synth_set(SynthSettings *s, const char *field, const char *value);
// Field names, for help texts: NULL-terminated.
const char *const *synth_field_names(void);

// MN_ERR_ARG naming the offending field when `s` is not valid for `t`.
int synth_check(const SynthTask *t, const SynthSettings *s);
// The model's vocabulary and sequence length for a split (after synth_check).
int synth_shape(const SynthTask *t, const SynthSettings *s, int split, int *vocab, int *T);
// The number of examples of a split (n_train or n_test).
int64_t synth_split_size(const SynthSettings *s, int split);

// Writes examples first .. first+n-1 of `split` (SYNTH_TRAIN or SYNTH_TEST)
// for `seed`: inputs and targets, n x T each (T from synth_shape).
int synth_make(const SynthTask *t, const SynthSettings *s, int split, uint64_t seed, int64_t first, int n,
               int32_t *inputs, int32_t *targets);

// ---------------------------------------------------------------------------
// Metrics. `pred` are predicted ids (argmax), `tgt` the targets (< 0: not scored).

// Accuracy over the scored positions of n positions; *counted (if non-NULL) gets their number.
// 0 when none is scored.
double synth_accuracy(const int32_t *pred, const int32_t *tgt, size_t n, int64_t *counted);
// Mean over the n examples (of T positions) that have a scored position of their accuracy.
double synth_accuracy_examples(const int32_t *pred, const int32_t *tgt, int n, int T);
// Fraction of the examples with a scored position whose scored positions are all right.
double synth_exact_match(const int32_t *pred, const int32_t *tgt, int n, int T);
// MAD's (torchmetrics MulticlassAccuracy, average="macro"): recall tp/(tp+fn) per class,
// averaged over the classes with tp+fp+fn > 0 among the scored positions (a class only
// predicted counts with recall 0). Ids outside [0, vocab) in pred are wrong predictions.
double synth_accuracy_macro(const int32_t *pred, const int32_t *tgt, size_t n, int vocab);

// A running score over batches, by the task's metric: sum / count, where a
// position, an example or (macro) a batch counts one.
typedef struct {
    double sum;
    int64_t count;
} SynthMeter;
void synth_meter_add(const SynthTask *t, SynthMeter *m, const int32_t *pred, const int32_t *tgt, int n, int T,
                     int vocab);
double synth_meter_value(const SynthMeter *m);

// ---------------------------------------------------------------------------
// For the generators (src/synth/*.c).

// Uniform integer in [0, n), n >= 1.
static inline int synth_below(MnRng *r, int n) {
    int k = (int)(mn_rng_uniform(r) * n);
    return k < n ? k : n - 1;
}
// splitmix64's finaliser: seeds derived from several numbers.
static inline uint64_t synth_mix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

extern const SynthTask synth_task_mqar;
extern const SynthTask synth_task_mad_recall, synth_task_mad_noisy_recall, synth_task_mad_fuzzy_recall,
    synth_task_mad_selective_copy, synth_task_mad_compression, synth_task_mad_memorization;
extern const SynthTask synth_task_parity;
extern const SynthTask synth_task_niah1, synth_task_niah2, synth_task_niah3;

#endif
