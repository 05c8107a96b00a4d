// MAD's six tasks (Poli et al. 2024, athms/mad-lab mad/data/instances.py), as
// benchmarks-notes.md section 1.3 describes their generators; the grids are
// section 1.2's (66 settings). Targets use -1 for MAD's ignore index -100.
//
// Assumptions where the notes are silent (or where this port differs):
// - Train and test come from separate streams (MAD draws test after train from
//   one numpy stream; selective copying there even reuses the training data).
// - Only multi_query = 1 (every benchmark setting) is implemented.
// - Recall: if every slot happened to be noise (possible only when the forced
//   slot index is P-1, which MAD's loop never reaches; MAD would fail), the
//   probe key is drawn fresh with a fresh value.
// - Fuzzy recall: a block's key and value sizes are drawn before the noise
//   coin, and a noise block has k_size + v_size tokens; a key drawn equal to
//   the probe key before the probe was placed takes the probe's value and is
//   registered then (so its value is scored if it recurs).
// - Memorization: the key -> value map comes from the seed alone (MAD: its own
//   rng(12345)), shared by the splits.
#include <stdlib.h>
#include <string.h>

#include "synth/synth.h"

#define IGN (-1)
#define MOTIF_MAX 16

static int check_common(const char *task, const SynthSettings *s) {
    if (s->vocab < 4) return mn_error(MN_ERR_ARG, "%s: vocab must be >= 4, got %d", task, s->vocab);
    if (s->seq_len < 4) return mn_error(MN_ERR_ARG, "%s: seq_len must be >= 4, got %d", task, s->seq_len);
    return MN_OK;
}

// ---------------------------------------------------------------------------
// In-context recall and noisy in-context recall.

static int recall_check(const SynthSettings *s) {
    MN_TRY(check_common("mad-recall", s));
    if (s->multi_query != 1)
        return mn_error(MN_ERR_ARG, "mad-recall: multi_query must be 1 (the single-query form is not implemented), got %d",
                        s->multi_query);
    if (s->seq_len % 2) return mn_error(MN_ERR_ARG, "mad-recall: seq_len must be even, got %d", s->seq_len);
    if (s->noise_vocab < 0) return mn_error(MN_ERR_ARG, "mad-recall: noise_vocab must be >= 0, got %d", s->noise_vocab);
    if (s->vocab - s->noise_vocab < 2)
        return mn_error(MN_ERR_ARG, "mad-recall: vocab - noise_vocab must be >= 2 (keys and values), got %d",
                        s->vocab - s->noise_vocab);
    if (!(s->frac_noise >= 0 && s->frac_noise < 1))
        return mn_error(MN_ERR_ARG, "mad-recall: frac_noise must be in [0, 1), got %g", s->frac_noise);
    if (s->frac_noise > 0 && s->noise_vocab < 1)
        return mn_error(MN_ERR_ARG, "mad-recall: frac_noise > 0 needs noise_vocab >= 1");
    return MN_OK;
}

// T = L - 1: the sequence has L tokens and is shifted by one.
static void shape_shift(const SynthSettings *s, int split, int *vocab, int *T) {
    *vocab = s->vocab;
    *T = s->seq_len - 1;
}

static void recall_gen(const SynthSettings *s, int split, MnRng *r, const void *ctx, int32_t *in, int32_t *tgt) {
    int L = s->seq_len, V = s->vocab, Nz = s->noise_vocab;
    int ns = V - Nz, nk = ns / 2, nv = ns - nk;
    int P = L / 2, force = synth_below(r, P);
    int32_t seq[L], lab[L];
    int kv[nk], seen[nk];  // kv[k]: the key's value or -1; seen[k]: it appeared
    for (int k = 0; k < nk; k++) kv[k] = -1, seen[k] = 0;
    int n = 0;
    for (int i = 0; i < P - 1; i++) {
        if (s->frac_noise > 0 && i != force && mn_rng_uniform(r) < s->frac_noise) {
            seq[n] = ns + synth_below(r, Nz), lab[n++] = IGN;
            seq[n] = ns + synth_below(r, Nz), lab[n++] = IGN;
            continue;
        }
        int k = synth_below(r, nk);
        if (kv[k] < 0) kv[k] = nk + synth_below(r, nv);
        seq[n] = k, lab[n++] = IGN;
        seq[n] = kv[k], lab[n++] = seen[k] ? kv[k] : IGN;
        seen[k] = 1;
    }
    int nseen = 0, pick;
    for (int k = 0; k < nk; k++) nseen += seen[k];
    if (nseen) {  // uniform over the distinct keys seen
        int j = synth_below(r, nseen);
        for (pick = 0; pick < nk; pick++)
            if (seen[pick] && j-- == 0) break;
    } else {
        pick = synth_below(r, nk);
        if (kv[pick] < 0) kv[pick] = nk + synth_below(r, nv);
    }
    seq[n] = pick, lab[n++] = IGN;
    seq[n] = kv[pick], lab[n++] = kv[pick];
    for (int t = 0; t < L - 1; t++) {
        in[t] = seq[t];
        tgt[t] = split == SYNTH_TRAIN ? seq[t + 1] : lab[t + 1];
    }
}

// ---------------------------------------------------------------------------
// Fuzzy in-context recall. pad = V-1; ns = V-1-Nz; keys: 1..k_motif distinct
// tokens of [0, ns/2) in order; values: 1..v_motif distinct tokens of [ns/2, ns).

static int fuzzy_check(const SynthSettings *s) {
    MN_TRY(check_common("mad-fuzzy-recall", s));
    if (s->multi_query != 1)
        return mn_error(MN_ERR_ARG, "mad-fuzzy-recall: multi_query must be 1, got %d", s->multi_query);
    if (s->k_motif < 1 || s->v_motif < 1)
        return mn_error(MN_ERR_ARG, "mad-fuzzy-recall: k_motif and v_motif must be >= 1, got %d and %d", s->k_motif,
                        s->v_motif);
    if (s->k_motif > MOTIF_MAX || s->v_motif > MOTIF_MAX)
        return mn_error(MN_ERR_ARG, "mad-fuzzy-recall: k_motif and v_motif must be <= %d", MOTIF_MAX);
    if (s->noise_vocab < 0) return mn_error(MN_ERR_ARG, "mad-fuzzy-recall: noise_vocab must be >= 0");
    int ns = s->vocab - 1 - s->noise_vocab;
    if (ns / 2 < s->k_motif || ns - ns / 2 < s->v_motif)
        return mn_error(MN_ERR_ARG, "mad-fuzzy-recall: vocab %d leaves %d key and %d value tokens, fewer than k_motif %d / v_motif %d",
                        s->vocab, ns / 2, ns - ns / 2, s->k_motif, s->v_motif);
    if (s->seq_len < 4 * (s->k_motif + s->v_motif))
        return mn_error(MN_ERR_ARG, "mad-fuzzy-recall: seq_len must be >= 4 (k_motif + v_motif) = %d, got %d",
                        4 * (s->k_motif + s->v_motif), s->seq_len);
    if (!(s->frac_noise >= 0 && s->frac_noise < 1))
        return mn_error(MN_ERR_ARG, "mad-fuzzy-recall: frac_noise must be in [0, 1), got %g", s->frac_noise);
    if (s->frac_noise > 0 && s->noise_vocab < 1)
        return mn_error(MN_ERR_ARG, "mad-fuzzy-recall: frac_noise > 0 needs noise_vocab >= 1");
    return MN_OK;
}

static void fuzzy_shape(const SynthSettings *s, int split, int *vocab, int *T) {
    *vocab = s->vocab;
    *T = s->seq_len;  // padded to L + 1, then shifted
}

// `len` distinct tokens of [lo, lo + n), in draw order.
static void motif(MnRng *r, int lo, int n, int len, int *out) {
    for (int j = 0; j < len; j++) {
        int x, dup;
        do {
            x = lo + synth_below(r, n);
            dup = 0;
            for (int i = 0; i < j; i++) dup |= out[i] == x;
        } while (dup);
        out[j] = x;
    }
}

typedef struct {
    int klen, k[MOTIF_MAX], vlen, v[MOTIF_MAX];
} Pair;

static int pair_find(const Pair *p, int n, int klen, const int *k) {
    for (int i = 0; i < n; i++)
        if (p[i].klen == klen && memcmp(p[i].k, k, sizeof(int) * klen) == 0) return i;
    return -1;
}

static void fuzzy_gen(const SynthSettings *s, int split, MnRng *r, const void *ctx, int32_t *in, int32_t *tgt) {
    int L = s->seq_len, V = s->vocab, Nz = s->noise_vocab, km = s->k_motif, vm = s->v_motif;
    int pad = V - 1, ns = V - 1 - Nz, nk = ns / 2, nv = ns - nk;
    int test = split == SYNTH_TEST;
    int32_t seq[L + 1], lab[L + 1];
    Pair *reg = malloc(sizeof(Pair) * (size_t)(L + 1));
    int nreg = 0;
    Pair probe;
    probe.klen = test ? km : 1 + synth_below(r, km);
    probe.vlen = 1 + synth_below(r, vm);
    motif(r, 0, nk, probe.klen, probe.k);
    motif(r, nk, nv, probe.vlen, probe.v);
    int probe_idx = synth_below(r, L - 2 * (probe.klen + probe.vlen));
    int probe_added = 0, n = 0;
    int bound = L - (probe.klen + probe.vlen) - (km + vm);
    while (n < bound) {
        if (n >= probe_idx && !probe_added) {
            for (int j = 0; j < probe.klen; j++) seq[n] = probe.k[j], lab[n++] = IGN;
            for (int j = 0; j < probe.vlen; j++) seq[n] = probe.v[j], lab[n++] = IGN;
            if (pair_find(reg, nreg, probe.klen, probe.k) < 0) reg[nreg++] = probe;
            probe_added = 1;
            continue;
        }
        int ks = test ? km : 1 + synth_below(r, km);
        int vs = 1 + synth_below(r, vm);
        if (s->frac_noise > 0 && mn_rng_uniform(r) < s->frac_noise) {
            for (int j = 0; j < ks + vs; j++) seq[n] = ns + synth_below(r, Nz), lab[n++] = IGN;
            continue;
        }
        Pair p;
        p.klen = ks;
        motif(r, 0, nk, ks, p.k);
        int at = pair_find(reg, nreg, ks, p.k);
        int scored = at >= 0;
        if (at >= 0)
            p = reg[at];
        else if (ks == probe.klen && memcmp(p.k, probe.k, sizeof(int) * ks) == 0)
            p = probe, reg[nreg++] = p;
        else {
            p.vlen = vs;
            motif(r, nk, nv, vs, p.v);
            reg[nreg++] = p;
        }
        for (int j = 0; j < p.klen; j++) seq[n] = p.k[j], lab[n++] = IGN;
        for (int j = 0; j < p.vlen; j++) seq[n] = p.v[j], lab[n++] = scored ? p.v[j] : IGN;
    }
    for (int j = 0; j < probe.klen; j++) seq[n] = probe.k[j], lab[n++] = IGN;
    for (int j = 0; j < probe.vlen; j++) seq[n] = probe.v[j], lab[n++] = probe.v[j];
    free(reg);
    // Left-pad to L + 1, then shift.
    int padn = L + 1 - n;
    memmove(seq + padn, seq, sizeof(int32_t) * n);
    memmove(lab + padn, lab, sizeof(int32_t) * n);
    for (int j = 0; j < padn; j++) seq[j] = pad, lab[j] = IGN;
    for (int t = 0; t < L; t++) {
        in[t] = seq[t];
        tgt[t] = test ? lab[t + 1] : seq[t + 1];
    }
}

// ---------------------------------------------------------------------------
// Selective copying: copy_tok = V-1, blank = V-2, data tokens [0, V-2).

static int sc_check(const SynthSettings *s) {
    MN_TRY(check_common("mad-selective-copy", s));
    if (s->num_copy < 1) return mn_error(MN_ERR_ARG, "mad-selective-copy: num_copy must be >= 1, got %d", s->num_copy);
    if (s->seq_len - 2 * s->num_copy - 1 < 0)
        return mn_error(MN_ERR_ARG, "mad-selective-copy: seq_len must be >= 2 num_copy + 1 = %d, got %d",
                        2 * s->num_copy + 1, s->seq_len);
    return MN_OK;
}

static void shape_same(const SynthSettings *s, int split, int *vocab, int *T) {
    *vocab = s->vocab;
    *T = s->seq_len;
}

static void sc_gen(const SynthSettings *s, int split, MnRng *r, const void *ctx, int32_t *in, int32_t *tgt) {
    int L = s->seq_len, V = s->vocab, C = s->num_copy, B = L - 2 * C - 1;
    int copy_tok = V - 1, blank = V - 2;
    int data[C], before[C];
    for (int j = 0; j < C; j++) data[j] = synth_below(r, V - 2), before[j] = 0;
    for (int b = 0; b < B; b++) before[synth_below(r, C)]++;  // a blank before data token j
    int n = 0;
    for (int j = 0; j < C; j++) {
        for (int b = 0; b < before[j]; b++) in[n++] = blank;
        in[n++] = data[j];
    }
    in[n++] = copy_tok;
    for (int j = 0; j < C; j++) tgt[n] = data[j], in[n++] = blank;
}

// ---------------------------------------------------------------------------
// Compression: (L-1) tokens of [0, V-1) then comp_tok = V-1; the target is the input.

static int comp_check(const SynthSettings *s) { return check_common("mad-compression", s); }

static void comp_gen(const SynthSettings *s, int split, MnRng *r, const void *ctx, int32_t *in, int32_t *tgt) {
    int L = s->seq_len;
    for (int t = 0; t < L - 1; t++) in[t] = synth_below(r, s->vocab - 1);
    in[L - 1] = s->vocab - 1;
    for (int t = 0; t < L; t++) tgt[t] = in[t];
}

// ---------------------------------------------------------------------------
// Memorization: insert = V-1; a fixed bijection from keys [0, (V-1)/2) to
// values [(V-1)/2, V-1) (both shuffled, zipped); L/2 pairs [k, insert] with
// the target map[k] at the insert position.

static int mem_check(const SynthSettings *s) {
    MN_TRY(check_common("mad-memorization", s));
    if (s->seq_len % 2) return mn_error(MN_ERR_ARG, "mad-memorization: seq_len must be even, got %d", s->seq_len);
    return MN_OK;
}

static void shuffle(MnRng *r, int *a, int n) {
    for (int i = n - 1; i > 0; i--) {
        int j = synth_below(r, i + 1), t = a[i];
        a[i] = a[j], a[j] = t;
    }
}

static int mem_prepare(const SynthSettings *s, uint64_t seed, void **ctx) {
    int ns = s->vocab - 1, nk = ns / 2;
    int *map = mn_calloc((size_t)ns, sizeof(int));  // keys then values
    if (!map) return MN_ERR_NOMEM;
    int *vals = map + nk;
    for (int k = 0; k < nk; k++) map[k] = k;
    for (int v = 0; v < ns - nk; v++) vals[v] = nk + v;
    MnRng r;
    mn_rng_seed(&r, synth_mix(synth_mix(seed) ^ 0x3E3A0000ull));
    shuffle(&r, map, nk);
    shuffle(&r, vals, ns - nk);
    // map[i] is the i-th shuffled key; make it key -> value in place.
    int *kv = mn_calloc((size_t)nk + 1, sizeof(int));
    if (!kv) {
        mn_free(map);
        return MN_ERR_NOMEM;
    }
    kv[0] = nk;
    for (int i = 0; i < nk; i++) kv[1 + map[i]] = vals[i];
    mn_free(map);
    *ctx = kv;
    return MN_OK;
}

static void mem_release(void *ctx) { mn_free(ctx); }

static void mem_gen(const SynthSettings *s, int split, MnRng *r, const void *ctx, int32_t *in, int32_t *tgt) {
    const int *kv = ctx;
    int nk = kv[0], insert = s->vocab - 1;
    for (int t = 0; t + 1 < s->seq_len; t += 2) {
        int k = synth_below(r, nk);
        in[t] = k;
        in[t + 1] = insert;
        tgt[t + 1] = kv[1 + k];
    }
}

// ---------------------------------------------------------------------------
// The table (section 1.2's grids: 11 + 14 + 11 + 13 + 11 + 6 = 66 settings).

#define N_VARY {"n_train", 4, {6400, 3200, 1600, 800}}

static const SynthVary CR_VARY[] = {
    {"vocab", 3, {32, 64, 128}}, {"seq_len", 3, {256, 512, 1024}}, N_VARY};
static const SynthVary NR_VARY[] = {
    {"vocab", 3, {48, 80, 144}}, {"seq_len", 3, {256, 512, 1024}}, N_VARY, {"frac_noise", 3, {0.4, 0.6, 0.8}}};
static const SynthVary SC_VARY[] = {
    {"vocab", 3, {32, 64, 128}}, {"seq_len", 2, {512, 1024}}, N_VARY, {"num_copy", 3, {32, 64, 96}}};
static const SynthVary C_VARY[] = {
    {"vocab", 3, {32, 64, 128}}, {"seq_len", 3, {64, 128, 256}}, N_VARY};
static const SynthVary M_VARY[] = {{"vocab", 5, {512, 1024, 2048, 4096, 8192}}};

#define MAD_BASE .n_train = 12800, .n_test = 1280, .multi_query = 1

const SynthTask synth_task_mad_recall = {
    .name = "mad-recall",
    .family = "mad",
    .summary = "MAD in-context recall: key-value pairs, values of repeated keys predicted",
    .metric = SYNTH_METRIC_MACRO,
    .base = {.vocab = 16, .seq_len = 128, MAD_BASE},
    .vary = CR_VARY,
    .n_vary = 3,
    .check = recall_check,
    .shape = shape_shift,
    .gen = recall_gen,
};

const SynthTask synth_task_mad_noisy_recall = {
    .name = "mad-noisy-recall",
    .family = "mad",
    .summary = "MAD noisy in-context recall: recall with noise-token slots between the pairs",
    .metric = SYNTH_METRIC_MACRO,
    .base = {.vocab = 32, .noise_vocab = 16, .frac_noise = 0.2, .seq_len = 128, MAD_BASE},
    .vary = NR_VARY,
    .n_vary = 4,
    .check = recall_check,
    .shape = shape_shift,
    .gen = recall_gen,
};

const SynthTask synth_task_mad_fuzzy_recall = {
    .name = "mad-fuzzy-recall",
    .family = "mad",
    .summary = "MAD fuzzy in-context recall: keys and values of 1-3 tokens",
    .metric = SYNTH_METRIC_MACRO,
    .base = {.vocab = 16, .seq_len = 128, .k_motif = 3, .v_motif = 3, MAD_BASE},
    .vary = CR_VARY,
    .n_vary = 3,
    .check = fuzzy_check,
    .shape = fuzzy_shape,
    .gen = fuzzy_gen,
};

const SynthTask synth_task_mad_selective_copy = {
    .name = "mad-selective-copy",
    .family = "mad",
    .summary = "MAD selective copying: copy the non-blank tokens, in order, after the copy token",
    .metric = SYNTH_METRIC_MACRO,
    .base = {.vocab = 16, .seq_len = 256, .num_copy = 16, MAD_BASE},
    .vary = SC_VARY,
    .n_vary = 4,
    .check = sc_check,
    .shape = shape_same,
    .gen = sc_gen,
};

const SynthTask synth_task_mad_compression = {
    .name = "mad-compression",
    .family = "mad",
    .summary = "MAD compression: rebuild the whole input from the last position's state (autoencoder)",
    .metric = SYNTH_METRIC_MACRO,
    .autoencoder = 1,
    .base = {.vocab = 16, .seq_len = 32, MAD_BASE},
    .vary = C_VARY,
    .n_vary = 3,
    .check = comp_check,
    .shape = shape_same,
    .gen = comp_gen,
};

const SynthTask synth_task_mad_memorization = {
    .name = "mad-memorization",
    .family = "mad",
    .summary = "MAD memorization: a fixed key -> value map, the value never in the input",
    .metric = SYNTH_METRIC_MACRO,
    .base = {.vocab = 256, .seq_len = 32, .n_train = 256, .n_test = 1280, .multi_query = 1},
    .vary = M_VARY,
    .n_vary = 1,
    .check = mem_check,
    .shape = shape_same,
    .prepare = mem_prepare,
    .release = mem_release,
    .gen = mem_gen,
};
