// The synthetic task table, settings, grids, the example loop and the metrics.
#include "synth/synth.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const SynthTask *const TASKS[] = {
    &synth_task_mqar,
    &synth_task_mad_recall,
    &synth_task_mad_noisy_recall,
    &synth_task_mad_fuzzy_recall,
    &synth_task_mad_selective_copy,
    &synth_task_mad_compression,
    &synth_task_mad_memorization,
    &synth_task_parity,
    &synth_task_niah1,
    &synth_task_niah2,
    &synth_task_niah3,
};
#define N_TASKS ((int)(sizeof TASKS / sizeof TASKS[0]))

int synth_task_count(void) { return N_TASKS; }

const SynthTask *synth_task(int i) { return i >= 0 && i < N_TASKS ? TASKS[i] : NULL; }

const SynthTask *synth_find(const char *name) {
    char names[512] = "";
    for (int i = 0; i < N_TASKS; i++) {
        if (name && strcmp(TASKS[i]->name, name) == 0) return TASKS[i];
        if (i) strncat(names, ", ", sizeof names - strlen(names) - 1);
        strncat(names, TASKS[i]->name, sizeof names - strlen(names) - 1);
    }
    mn_error(MN_ERR_ARG, "unknown synthetic task '%s' (tasks: %s)", name ? name : "(null)", names);
    return NULL;
}

// ---------------------------------------------------------------------------
// Fields by name.

typedef enum { F_INT, F_I64, F_DBL } FieldType;
typedef struct {
    const char *name;
    size_t offset;
    FieldType type;
} Field;

#define FLD(n, t) {#n, offsetof(SynthSettings, n), t}
static const Field FIELDS[] = {
    FLD(vocab, F_INT),       FLD(seq_len, F_INT),      FLD(num_pairs, F_INT),    FLD(power_a, F_DBL),
    FLD(random_non_queries, F_INT), FLD(noise_vocab, F_INT), FLD(frac_noise, F_DBL), FLD(multi_query, F_INT),
    FLD(k_motif, F_INT),     FLD(v_motif, F_INT),      FLD(num_copy, F_INT),     FLD(min_len, F_INT),
    FLD(test_min_len, F_INT), FLD(test_len, F_INT),    FLD(final_only, F_INT),   FLD(key_len, F_INT),
    FLD(value_len, F_INT),   FLD(depth, F_DBL),        FLD(n_train, F_I64),      FLD(n_test, F_I64),
};
#undef FLD
#define N_FIELDS ((int)(sizeof FIELDS / sizeof FIELDS[0]))

const char *const *synth_field_names(void) {
    static const char *names[N_FIELDS + 1];
    for (int i = 0; i < N_FIELDS; i++) names[i] = FIELDS[i].name;
    names[N_FIELDS] = NULL;
    return names;
}

static const Field *field_find(const char *name) {
    for (int i = 0; i < N_FIELDS; i++)
        if (name && strcmp(FIELDS[i].name, name) == 0) return &FIELDS[i];
    return NULL;
}

static int field_put(SynthSettings *s, const Field *f, double v) {
    char *p = (char *)s + f->offset;
    if (f->type == F_DBL) {
        *(double *)p = v;
        return MN_OK;
    }
    if (v != floor(v) || fabs(v) > (f->type == F_INT ? 2147483647.0 : 9.0e18))
        return mn_error(MN_ERR_ARG, "synthetic setting '%s': %g is not a whole number in range", f->name, v);
    if (f->type == F_INT)
        *(int *)p = (int)v;
    else
        *(int64_t *)p = (int64_t)v;
    return MN_OK;
}

int synth_set(SynthSettings *s, const char *field, const char *value) {
    const Field *f = field_find(field);
    if (!f) return mn_error(MN_ERR_ARG, "unknown synthetic setting '%s'", field ? field : "(null)");
    if (!value || !*value) return mn_error(MN_ERR_ARG, "synthetic setting '%s': no value", f->name);
    char *end;
    errno = 0;
    double v = strtod(value, &end);
    if (*end || errno || !isfinite(v))
        return mn_error(MN_ERR_ARG, "synthetic setting '%s': '%s' is not a number", f->name, value);
    return field_put(s, f, v);
}

// ---------------------------------------------------------------------------
// Grids.

int synth_grid_count(const SynthTask *t) {
    int n = 1;
    for (int i = 0; i < t->n_vary; i++) n += t->vary[i].n;
    return n;
}

int synth_grid(const SynthTask *t, int i, SynthSettings *s, char *label, size_t label_size) {
    int total = synth_grid_count(t);
    if (i < 0 || i >= total)
        return mn_error(MN_ERR_ARG, "task %s: setting %d out of range (it has %d)", t->name, i, total);
    *s = t->base;
    if (i == 0) {
        if (label) snprintf(label, label_size, "baseline");
        return MN_OK;
    }
    i--;
    for (int v = 0; v < t->n_vary; v++) {
        if (i < t->vary[v].n) {
            const Field *f = field_find(t->vary[v].field);
            if (!f) return mn_error(MN_ERR_ARG, "task %s: unknown grid field '%s'", t->name, t->vary[v].field);
            MN_TRY(field_put(s, f, t->vary[v].values[i]));
            if (label) snprintf(label, label_size, "%s=%g", f->name, t->vary[v].values[i]);
            if (t->vary[v].field2) {
                const Field *f2 = field_find(t->vary[v].field2);
                if (!f2) return mn_error(MN_ERR_ARG, "task %s: unknown grid field '%s'", t->name, t->vary[v].field2);
                MN_TRY(field_put(s, f2, t->vary[v].values2[i]));
                if (label) {
                    size_t used = strlen(label);
                    snprintf(label + used, label_size - used, ",%s=%g", f2->name, t->vary[v].values2[i]);
                }
            }
            return MN_OK;
        }
        i -= t->vary[v].n;
    }
    return mn_error(MN_ERR_ARG, "task %s: setting out of range", t->name);
}

static double field_get(const SynthSettings *s, const Field *f) {
    const char *p = (const char *)s + f->offset;
    return f->type == F_DBL ? *(const double *)p : f->type == F_INT ? *(const int *)p : (double)*(const int64_t *)p;
}

const char *synth_grid_axis(const SynthTask *t, double *values) {
    if (t->n_vary != 1 || t->vary[0].field2 || !t->vary[0].axis) return NULL;
    const Field *f = field_find(t->vary[0].field);
    if (!f) return NULL;
    values[0] = field_get(&t->base, f);
    for (int i = 0; i < t->vary[0].n; i++) values[i + 1] = t->vary[0].values[i];
    return t->vary[0].axis;
}

const char *synth_metric_name(const SynthTask *t) {
    if (!strcmp(t->family, "regbench")) return "greedy validity accuracy";
    switch (t->metric) {
    case SYNTH_METRIC_POSITION: return "per-position accuracy";
    case SYNTH_METRIC_EXAMPLE: return "per-example accuracy";
    case SYNTH_METRIC_MACRO: return "macro-averaged accuracy";
    case SYNTH_METRIC_EXACT: return "exact-match accuracy";
    }
    return "accuracy";
}

// ---------------------------------------------------------------------------
// Examples.

int synth_check(const SynthTask *t, const SynthSettings *s) {
    if (!t || !s) return mn_error(MN_ERR_ARG, "synth_check: NULL task or settings");
    if (s->n_train < 0) return mn_error(MN_ERR_ARG, "%s: n_train must be >= 0, got %lld", t->name, (long long)s->n_train);
    if (s->n_test < 0) return mn_error(MN_ERR_ARG, "%s: n_test must be >= 0, got %lld", t->name, (long long)s->n_test);
    return t->check(s);
}

int synth_shape(const SynthTask *t, const SynthSettings *s, int split, int *vocab, int *T) {
    MN_TRY(synth_check(t, s));
    if (split != SYNTH_TRAIN && split != SYNTH_TEST)
        return mn_error(MN_ERR_ARG, "%s: split must be 0 (train) or 1 (test), got %d", t->name, split);
    int V = 0, L = 0;
    t->shape(s, split, &V, &L);
    if (vocab) *vocab = V;
    if (T) *T = L;
    return MN_OK;
}

int64_t synth_split_size(const SynthSettings *s, int split) { return split == SYNTH_TEST ? s->n_test : s->n_train; }

int synth_make(const SynthTask *t, const SynthSettings *s, int split, uint64_t seed, int64_t first, int n,
               int32_t *inputs, int32_t *targets) {
    int V = 0, T = 0;
    MN_TRY(synth_shape(t, s, split, &V, &T));
    if (n < 0 || first < 0) return mn_error(MN_ERR_ARG, "%s: first and n must be >= 0", t->name);
    if (n > 0 && (!inputs || !targets)) return mn_error(MN_ERR_ARG, "%s: NULL inputs or targets", t->name);
    void *ctx = NULL;
    if (t->prepare) MN_TRY(t->prepare(s, seed, &ctx));
    // The stream of a split: its seed from (seed, split); an example's from (stream, index).
    uint64_t stream = synth_mix(synth_mix(seed) ^ (0x5EED0000ull + (uint64_t)split));
    for (int i = 0; i < n; i++) {
        MnRng rng;
        mn_rng_seed(&rng, synth_mix(stream ^ synth_mix((uint64_t)(first + i))));
        int32_t *in = inputs + (size_t)i * T, *tg = targets + (size_t)i * T;
        for (int j = 0; j < T; j++) in[j] = 0, tg[j] = -1;
        t->gen(s, split, &rng, ctx, in, tg);
    }
    if (t->release) t->release(ctx);
    return MN_OK;
}

// ---------------------------------------------------------------------------
// Metrics.

double synth_accuracy(const int32_t *pred, const int32_t *tgt, size_t n, int64_t *counted) {
    int64_t c = 0, ok = 0;
    for (size_t i = 0; i < n; i++)
        if (tgt[i] >= 0) c++, ok += pred[i] == tgt[i];
    if (counted) *counted = c;
    return c ? (double)ok / c : 0;
}

double synth_accuracy_examples(const int32_t *pred, const int32_t *tgt, int n, int T) {
    double sum = 0;
    int m = 0;
    for (int e = 0; e < n; e++) {
        int64_t c;
        double a = synth_accuracy(pred + (size_t)e * T, tgt + (size_t)e * T, (size_t)T, &c);
        if (c) sum += a, m++;
    }
    return m ? sum / m : 0;
}

double synth_exact_match(const int32_t *pred, const int32_t *tgt, int n, int T) {
    int m = 0, ok = 0;
    for (int e = 0; e < n; e++) {
        int64_t c;
        double a = synth_accuracy(pred + (size_t)e * T, tgt + (size_t)e * T, (size_t)T, &c);
        if (c) m++, ok += a == 1.0;
    }
    return m ? (double)ok / m : 0;
}

double synth_accuracy_macro(const int32_t *pred, const int32_t *tgt, size_t n, int vocab) {
    if (vocab <= 0) return 0;
    int64_t *tp = calloc((size_t)vocab * 3, sizeof *tp);
    if (!tp) return 0;
    int64_t *fp = tp + vocab, *fn = fp + vocab;
    for (size_t i = 0; i < n; i++) {
        int y = tgt[i], p = pred[i];
        if (y < 0 || y >= vocab) continue;
        if (p == y)
            tp[y]++;
        else {
            fn[y]++;
            if (p >= 0 && p < vocab) fp[p]++;
        }
    }
    double sum = 0;
    int classes = 0;
    for (int c = 0; c < vocab; c++) {
        if (tp[c] + fp[c] + fn[c] == 0) continue;
        classes++;
        if (tp[c] + fn[c]) sum += (double)tp[c] / (double)(tp[c] + fn[c]);
    }
    free(tp);
    return classes ? sum / classes : 0;
}

void synth_meter_add(const SynthTask *t, SynthMeter *m, const int32_t *pred, const int32_t *tgt, int n, int T,
                     int vocab) {
    size_t N = (size_t)n * T;
    int64_t c = 0;
    switch (t->metric) {
    case SYNTH_METRIC_POSITION:
        for (size_t i = 0; i < N; i++)
            if (tgt[i] >= 0) m->count++, m->sum += pred[i] == tgt[i];
        break;
    case SYNTH_METRIC_MACRO:
        synth_accuracy(pred, tgt, N, &c);
        if (c) m->sum += synth_accuracy_macro(pred, tgt, N, vocab), m->count++;
        break;
    case SYNTH_METRIC_EXAMPLE:
    case SYNTH_METRIC_EXACT:
        for (int e = 0; e < n; e++) {
            double a = synth_accuracy(pred + (size_t)e * T, tgt + (size_t)e * T, (size_t)T, &c);
            if (!c) continue;
            m->sum += t->metric == SYNTH_METRIC_EXAMPLE ? a : (a == 1.0);
            m->count++;
        }
        break;
    }
}

double synth_meter_value(const SynthMeter *m) { return m->count ? m->sum / (double)m->count : 0; }
