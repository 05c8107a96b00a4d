// The synthetic task generators (src/synth/): fixed-seed outputs, separate
// train and test streams, each task's structure recomputed from its inputs,
// the settings grids' published counts, the metrics and refused settings.
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "synth/synth.h"
#include "test.h"

typedef struct {
    int V, T, n;
    int32_t *in, *tg;
} Batch;

static Batch make(const SynthTask *t, const SynthSettings *s, int split, uint64_t seed, int64_t first, int n) {
    Batch b = {0};
    int rc = synth_shape(t, s, split, &b.V, &b.T);
    CHECK(rc == 0, "%s: shape: %s", t->name, mn_last_error());
    b.n = n;
    b.in = xcalloc((size_t)n * b.T, sizeof(int32_t));
    b.tg = xcalloc((size_t)n * b.T, sizeof(int32_t));
    rc = synth_make(t, s, split, seed, first, n, b.in, b.tg);
    CHECK(rc == 0, "%s: make: %s", t->name, mn_last_error());
    return b;
}

static void drop(Batch *b) {
    free(b->in);
    free(b->tg);
}

static uint64_t fnv(uint64_t h, const int32_t *x, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)x[i];
        for (int k = 0; k < 4; k++) h = (h ^ ((v >> (8 * k)) & 255)) * 0x100000001B3ull;
    }
    return h;
}

static uint64_t batch_hash(const Batch *b) {
    uint64_t h = 0xCBF29CE484222325ull;
    h = fnv(h, b->in, (size_t)b->n * b->T);
    return fnv(h, b->tg, (size_t)b->n * b->T);
}

static const SynthTask *find(const char *name) {
    const SynthTask *t = synth_find(name);
    if (!t) {
        test_fail(__FILE__, __LINE__, "no task %s", name);
        abort();
    }
    return t;
}

TEST(synth_grid_counts) {
    static const struct {
        const char *name;
        int n;
    } want[] = {{"mad-recall", 11},       {"mad-noisy-recall", 14}, {"mad-fuzzy-recall", 11},
                {"mad-selective-copy", 13}, {"mad-compression", 11},  {"mad-memorization", 6},
                {"mqar", 4}};
    int mad = 0;
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        int n = synth_grid_count(find(want[i].name));
        CHECK(n == want[i].n, "%s: %d settings, want %d", want[i].name, n, want[i].n);
    }
    for (int i = 0; i < synth_task_count(); i++) {
        const SynthTask *t = synth_task(i);
        if (strcmp(t->family, "mad") == 0) mad += synth_grid_count(t);
        for (int g = 0; g < synth_grid_count(t); g++) {
            SynthSettings s;
            char label[64];
            CHECK(synth_grid(t, g, &s, label, sizeof label) == 0, "%s %d: %s", t->name, g, mn_last_error());
            CHECK(synth_check(t, &s) == 0, "%s %s: %s", t->name, label, mn_last_error());
        }
        CHECK(synth_grid(t, synth_grid_count(t), &(SynthSettings){0}, NULL, 0) != 0, "%s: index past the grid", t->name);
    }
    CHECK(mad == 66, "MAD: %d settings, want 66", mad);
    // MQAR's (L, K) pairs, and a MAD change that replaces only its own field.
    static const int LK[4][2] = {{64, 4}, {128, 8}, {256, 16}, {512, 64}};
    for (int g = 0; g < 4; g++) {
        SynthSettings s;
        char label[64];
        synth_grid(find("mqar"), g, &s, label, sizeof label);
        CHECK(s.seq_len == LK[g][0] && s.num_pairs == LK[g][1] && s.vocab == 8192 && s.n_train == 100000 &&
                  s.n_test == 3000,
              "mqar %d (%s): L %d K %d", g, label, s.seq_len, s.num_pairs);
    }
    SynthSettings s;
    char label[64];
    synth_grid(find("mad-noisy-recall"), 13, &s, label, sizeof label);
    CHECK(strcmp(label, "frac_noise=0.8") == 0 && s.frac_noise == 0.8 && s.vocab == 32 && s.noise_vocab == 16 &&
              s.seq_len == 128 && s.n_train == 12800 && s.n_test == 1280,
          "noisy recall's last setting: %s", label);
    synth_grid(find("mad-memorization"), 5, &s, label, sizeof label);
    CHECK(s.vocab == 8192 && s.seq_len == 32 && s.n_train == 256, "memorization's last: %s", label);
    synth_grid(find("mad-selective-copy"), 0, &s, label, sizeof label);
    CHECK(s.vocab == 16 && s.seq_len == 256 && s.num_copy == 16 && strcmp(label, "baseline") == 0, "sc baseline");
}

// Recorded hashes of the first 3 training examples of each task's baseline
// (seed 1234): a change of any generator's output shows here.
TEST(synth_fixed_seed_hashes) {
    static const struct {
        const char *name;
        uint64_t hash;
    } want[] = {
        {"mqar", 0x21f7caedb34d10a1ull},
        {"mad-recall", 0x8030c682ed603b3bull},
        {"mad-noisy-recall", 0x310d799b83f51407ull},
        {"mad-fuzzy-recall", 0xb13c42d501d7dc02ull},
        {"mad-selective-copy", 0x405a3ce641dba904ull},
        {"mad-compression", 0x8acde3c3010a9045ull},
        {"mad-memorization", 0x11740d69e482afafull},
        {"parity", 0x7e42fd6824dca98dull},
        {"niah-1", 0x2b5a5633c4fb9a64ull},
        {"niah-2", 0xb3ec1d34b9e9599cull},
        {"niah-3", 0x8c2745dc59ec6776ull},
    };
    int found = 0;
    for (int i = 0; i < synth_task_count(); i++) {
        const SynthTask *t = synth_task(i);
        Batch b = make(t, &t->base, SYNTH_TRAIN, 1234, 0, 3);
        uint64_t h = batch_hash(&b);
        drop(&b);
        int here = 0;
        for (size_t j = 0; j < sizeof want / sizeof want[0]; j++)
            if (strcmp(want[j].name, t->name) == 0) {
                found++, here++;
                CHECK(want[j].hash == h, "%s: hash 0x%016llxull, recorded 0x%016llxull", t->name,
                      (unsigned long long)h, (unsigned long long)want[j].hash);
            }
        if (!here) test_note("{\"%s\", 0x%016llxull},", t->name, (unsigned long long)h);
    }
    CHECK(found == synth_task_count(), "%d of %d tasks have a recorded hash", found, synth_task_count());
}

TEST(synth_streams) {
    for (int i = 0; i < synth_task_count(); i++) {
        const SynthTask *t = synth_task(i);
        SynthSettings s = t->base;
        if (strcmp(t->family, "niah") == 0) s.seq_len = 256;  // keep it fast
        Batch a = make(t, &s, SYNTH_TRAIN, 7, 0, 4), a2 = make(t, &s, SYNTH_TRAIN, 7, 0, 4);
        Batch part = make(t, &s, SYNTH_TRAIN, 7, 2, 2), te = make(t, &s, SYNTH_TEST, 7, 0, 4);
        Batch other = make(t, &s, SYNTH_TRAIN, 8, 0, 4);
        size_t n = (size_t)4 * a.T;
        CHECK(memcmp(a.in, a2.in, n * 4) == 0 && memcmp(a.tg, a2.tg, n * 4) == 0, "%s: not deterministic", t->name);
        CHECK(memcmp(a.in + 2 * a.T, part.in, n * 2) == 0 && memcmp(a.tg + 2 * a.T, part.tg, n * 2) == 0,
              "%s: examples 2..3 differ when made alone", t->name);
        int same_test = te.T == a.T && memcmp(a.in, te.in, n * 4) == 0;
        CHECK(!same_test, "%s: train and test streams are the same", t->name);
        CHECK(memcmp(a.in, other.in, n * 4) != 0, "%s: seeds 7 and 8 give the same inputs", t->name);
        for (size_t j = 0; j < n; j++)
            if (a.in[j] < 0 || a.in[j] >= a.V || a.tg[j] >= a.V || a.tg[j] < -1) {
                test_fail(__FILE__, __LINE__, "%s: id out of range at %zu: in %d tg %d (V %d)", t->name, j, a.in[j],
                          a.tg[j], a.V);
                break;
            }
        drop(&a), drop(&a2), drop(&part), drop(&te), drop(&other);
    }
}

TEST(synth_mqar_labels) {
    const SynthTask *t = find("mqar");
    for (int g = 0; g < 4; g++) {
        SynthSettings s;
        synth_grid(t, g, &s, NULL, 0);
        int K = s.num_pairs, V = s.vocab;
        Batch b = make(t, &s, g % 2, 99, 0, 8);
        CHECK(b.T == s.seq_len && b.V == 8192, "mqar shape");
        for (int e = 0; e < b.n; e++) {
            const int32_t *in = b.in + (size_t)e * b.T, *tg = b.tg + (size_t)e * b.T;
            int labels = 0, queried[64] = {0};
            for (int j = 0; j < K; j++) {
                CHECK(in[2 * j] >= 1 && in[2 * j] < V / 2 && in[2 * j + 1] >= V / 2, "key/value ranges");
                for (int i = 0; i < j; i++) CHECK(in[2 * i] != in[2 * j] && in[2 * i + 1] != in[2 * j + 1], "distinct");
            }
            for (int p = 0; p < b.T; p++) {
                if (p < 2 * K) {
                    CHECK(tg[p] == -1, "target in the context");
                    continue;
                }
                if (tg[p] < 0) {
                    CHECK(in[p] == 0, "mqar %d: a non-query position holds %d", g, in[p]);
                    continue;
                }
                labels++;
                CHECK((p - 2 * K) % 2 == 0, "query at an odd offset");
                int j = 0;
                while (j < K && in[2 * j] != in[p]) j++;
                CHECK(j < K && tg[p] == in[2 * j + 1], "mqar %d ex %d pos %d: label %d is not key %d's value", g, e, p,
                      tg[p], in[p]);
                if (j < K) queried[j]++;
            }
            CHECK(labels == K, "mqar %d: %d labels, want %d", g, labels, K);
            for (int j = 0; j < K; j++) CHECK(queried[j] == 1, "key %d queried %d times", j, queried[j]);
        }
        drop(&b);
    }
}

// Recall (and noisy recall): train targets are the next input tokens; test
// targets are values of keys seen before and the final probe's value.
TEST(synth_mad_recall_structure) {
    const char *names[] = {"mad-recall", "mad-noisy-recall"};
    for (int k = 0; k < 2; k++) {
        const SynthTask *t = find(names[k]);
        const SynthSettings *s = &t->base;
        int ns = s->vocab - s->noise_vocab, nk = ns / 2;
        Batch tr = make(t, s, SYNTH_TRAIN, 5, 0, 8), te = make(t, s, SYNTH_TEST, 5, 0, 8);
        CHECK(tr.T == s->seq_len - 1 && te.T == tr.T, "%s: T %d", t->name, tr.T);
        for (int e = 0; e < 8; e++) {
            const int32_t *in = tr.in + (size_t)e * tr.T, *tg = tr.tg + (size_t)e * tr.T;
            for (int p = 0; p + 1 < tr.T; p++) CHECK(tg[p] == in[p + 1], "%s: train target is not the next token", t->name);
            in = te.in + (size_t)e * te.T, tg = te.tg + (size_t)e * te.T;
            int val[64], noise = 0;
            for (int i = 0; i < nk; i++) val[i] = -1;
            CHECK(tg[te.T - 1] >= 0, "%s: the final probe is not scored", t->name);
            for (int p = 0; p < te.T; p += 2) {  // pairs at even positions
                if (in[p] >= ns) {
                    noise++;
                    CHECK(p + 1 >= te.T || (in[p + 1] >= ns && tg[p] < 0), "%s: noise pair", t->name);
                    continue;
                }
                CHECK(in[p] < nk, "%s: key %d out of range", t->name, in[p]);
                int v = p + 1 < te.T ? in[p + 1] : tg[p];  // the probe's value is only a target
                if (val[in[p]] >= 0) {
                    CHECK(tg[p] == val[in[p]], "%s ex %d pos %d: target %d, the key's value %d", t->name, e, p, tg[p],
                          val[in[p]]);
                    CHECK(v == val[in[p]], "%s: a key's value changed", t->name);
                } else {
                    CHECK(tg[p] == -1 && p + 1 < te.T, "%s: first occurrence scored, or a probe never seen", t->name);
                    val[in[p]] = v;
                }
            }
            if (k == 0) CHECK(noise == 0, "recall: noise");
        }
        drop(&tr), drop(&te);
    }
}

TEST(synth_mad_fuzzy_structure) {
    const SynthTask *t = find("mad-fuzzy-recall");
    const SynthSettings *s = &t->base;
    int pad = s->vocab - 1, nk = (s->vocab - 1) / 2;
    Batch tr = make(t, s, SYNTH_TRAIN, 5, 0, 16), te = make(t, s, SYNTH_TEST, 5, 0, 16);
    CHECK(tr.T == s->seq_len, "fuzzy T %d", tr.T);
    for (int e = 0; e < 16; e++) {
        const int32_t *in = tr.in + (size_t)e * tr.T, *tg = tr.tg + (size_t)e * tr.T;
        for (int p = 0; p + 1 < tr.T; p++) CHECK(tg[p] == in[p + 1], "fuzzy: train target is not the next token");
        CHECK(in[0] == pad, "fuzzy: not left-padded");
        in = te.in + (size_t)e * te.T, tg = te.tg + (size_t)e * te.T;
        int p = 0;
        while (p < te.T && in[p] == pad) p++;
        for (int q = p; q < te.T; q++) CHECK(in[q] != pad, "fuzzy: pad inside the text");
        CHECK(tg[te.T - 1] >= nk && tg[te.T - 1] < pad, "fuzzy: the final value token is not scored");
        for (int q = 0; q < te.T; q++)
            if (tg[q] >= 0) CHECK(tg[q] >= nk && tg[q] < pad, "fuzzy: a scored token %d is not a value", tg[q]);
    }
    drop(&tr), drop(&te);
}

TEST(synth_mad_selective_copy) {
    const SynthTask *t = find("mad-selective-copy");
    SynthSettings s = t->base;
    for (int v = 0; v < 2; v++) {
        if (v) s.num_copy = 64, s.vocab = 64;
        int blank = s.vocab - 2, copy = s.vocab - 1;
        Batch b = make(t, &s, SYNTH_TEST, 3, 0, 6);
        for (int e = 0; e < b.n; e++) {
            const int32_t *in = b.in + (size_t)e * b.T, *tg = b.tg + (size_t)e * b.T;
            int data[128], nd = 0, p = 0;
            for (; p < b.T && in[p] != copy; p++)
                if (in[p] != blank) data[nd++] = in[p];
            CHECK(nd == s.num_copy && p == b.T - s.num_copy - 1, "sc: %d data tokens, copy at %d", nd, p);
            CHECK(in[p - 1] != blank, "sc: a blank after the last data token");
            int nt = 0;
            for (int q = 0; q < b.T; q++)
                if (tg[q] >= 0) {
                    CHECK(q > p && in[q] == blank, "sc: target at %d", q);
                    CHECK(nt < nd && tg[q] == data[nt], "sc: target %d is not data token %d", tg[q], nt);
                    nt++;
                }
            CHECK(nt == nd, "sc: %d targets, %d data tokens", nt, nd);
        }
        drop(&b);
    }
}

TEST(synth_mad_compression_memorization) {
    const SynthTask *t = find("mad-compression");
    CHECK(t->autoencoder == 1, "compression is an autoencoder task");
    Batch b = make(t, &t->base, SYNTH_TRAIN, 3, 0, 4);
    CHECK(memcmp(b.in, b.tg, sizeof(int32_t) * 4 * b.T) == 0, "compression: target != input");
    for (int e = 0; e < 4; e++) {
        CHECK(b.in[(size_t)e * b.T + b.T - 1] == b.V - 1, "compression token");
        for (int p = 0; p + 1 < b.T; p++) CHECK(b.in[(size_t)e * b.T + p] < b.V - 1, "compression data");
    }
    drop(&b);
    t = find("mad-memorization");
    Batch tr = make(t, &t->base, SYNTH_TRAIN, 3, 0, 64), te = make(t, &t->base, SYNTH_TEST, 3, 0, 64);
    int nk = (tr.V - 1) / 2, map[128], hit[256] = {0};
    for (int i = 0; i < nk; i++) map[i] = -1;
    Batch *bs[2] = {&tr, &te};
    for (int k = 0; k < 2; k++)
        for (size_t p = 0; p < (size_t)64 * tr.T; p += 2) {
            int key = bs[k]->in[p], v = bs[k]->tg[p + 1];
            CHECK(bs[k]->in[p + 1] == tr.V - 1 && bs[k]->tg[p] == -1, "memorization: insert token");
            CHECK(key >= 0 && key < nk && v >= nk && v < tr.V - 1, "memorization: key %d value %d", key, v);
            if (key < 0 || key >= nk) continue;
            if (map[key] < 0) map[key] = v, hit[v]++;
            CHECK(map[key] == v, "memorization: key %d -> %d and %d", key, map[key], v);
        }
    for (int v = 0; v < 256; v++) CHECK(hit[v] <= 1, "memorization: value %d of two keys", v);
    drop(&tr), drop(&te);
}

TEST(synth_parity) {
    const SynthTask *t = find("parity");
    for (int g = 0; g < 2; g++) {
        SynthSettings s;
        synth_grid(t, g, &s, NULL, 0);
        for (int split = 0; split < 2; split++) {
            Batch b = make(t, &s, split, 11, 0, 20);
            CHECK(b.V == 3 && b.T == (split ? 256 : 40), "parity shape %d %d", b.V, b.T);
            for (int e = 0; e < b.n; e++) {
                const int32_t *in = b.in + (size_t)e * b.T, *tg = b.tg + (size_t)e * b.T;
                int n = 0, p = 0;
                while (n < b.T && in[n] != 2) n++;
                CHECK(n >= (split ? 40 : 3), "parity: length %d", n);
                for (int q = 0; q < b.T; q++) {
                    if (q >= n) {
                        CHECK(in[q] == 2 && tg[q] == -1, "parity: padding");
                        continue;
                    }
                    p ^= in[q];
                    int want = (!s.final_only || q == n - 1) ? p : -1;
                    CHECK(tg[q] == want, "parity final_only %d ex %d pos %d: target %d, want %d", s.final_only, e, q,
                          tg[q], want);
                }
            }
            drop(&b);
        }
    }
}

TEST(synth_niah) {
    const char *names[] = {"niah-1", "niah-2", "niah-3"};
    for (int k = 0; k < 3; k++) {
        const SynthTask *t = find(names[k]);
        SynthSettings s = t->base;
        for (int dpt = 0; dpt < 3; dpt++) {
            s.depth = dpt == 0 ? -1 : dpt == 1 ? 0 : 1;
            Batch b = make(t, &s, SYNTH_TEST, 21, 0, 3);
            for (int e = 0; e < b.n; e++) {
                const int32_t *in = b.in + (size_t)e * b.T, *tg = b.tg + (size_t)e * b.T;
                int at = -1, nn = 0;
                for (int p = 0; p < b.T; p++)
                    if (in[p] == 1) at = p, nn++;
                CHECK(nn == 1, "%s: %d needles", t->name, nn);
                if (at < 0) continue;
                if (dpt == 1) CHECK(at == 0, "%s: depth 0 at %d", t->name, at);
                int kl = s.key_len, d = s.value_len, q = b.T - d - kl - 1;  // QUERY's position
                CHECK(in[q - 1] != 3 && in[q - 1 + 0] >= 0 && in[q] == 3, "%s: query marker", t->name);
                int end = q - (kl + d + 3);  // depth 1: right after the haystack (niah-1: its last sentence boundary)
                if (dpt == 2) CHECK(k == 0 ? at <= end && at > end - 16 && at % 16 == 0 : at == end, "%s: depth 1 at %d", t->name, at);
                CHECK(memcmp(in + at + 1, in + q + 1, sizeof(int32_t) * kl) == 0, "%s: query key != needle key", t->name);
                CHECK(in[at + 1 + kl] == 2 && in[at + 2 + kl + d] == 4, "%s: needle form", t->name);
                int nt = 0;
                for (int p = 0; p < b.T; p++)
                    if (tg[p] >= 0) {
                        CHECK(p >= b.T - d && tg[p] == in[at + 2 + kl + (p - (b.T - d))],
                              "%s ex %d pos %d: target %d is not the needle's value", t->name, e, p, tg[p]);
                        nt++;
                    }
                CHECK(nt == d, "%s: %d targets, want %d", t->name, nt, d);
            }
            drop(&b);
        }
    }
}

TEST(synth_metrics) {
    const int32_t tg[8] = {-1, 3, 3, -1, 5, 6, -1, 6};
    const int32_t pr[8] = {9, 3, 4, 0, 5, 6, 1, 5};
    int64_t c;
    double a = synth_accuracy(pr, tg, 8, &c);
    CHECK(c == 5 && a == 3.0 / 5, "accuracy %g over %lld", a, (long long)c);
    // Two examples of 4: {3 ok, 3 wrong} -> 0.5; {5 ok, 6 ok, 6 wrong} -> 2/3.
    a = synth_accuracy_examples(pr, tg, 2, 4);
    CHECK(a == (0.5 + 2.0 / 3) / 2, "per example %g", a);
    a = synth_exact_match(pr, tg, 2, 4);
    CHECK(a == 0, "exact %g", a);
    const int32_t pr2[8] = {0, 3, 3, 0, 5, 6, 0, 6};
    CHECK(synth_exact_match(pr2, tg, 2, 4) == 1, "exact, all right");
    // Macro: class 3: tp 1 fn 1 -> 0.5; 5: tp 1 fp 1 -> 1; 6: tp 1 fn 1 -> 0.5;
    // 4: only predicted (fp) -> 0. Mean over 4 classes: 0.5.
    a = synth_accuracy_macro(pr, tg, 8, 10);
    CHECK(a == 0.5, "macro %g, want 0.5", a);
    SynthMeter m = {0};
    synth_meter_add(find("parity"), &m, pr, tg, 2, 4, 10);
    synth_meter_add(find("parity"), &m, pr2, tg, 2, 4, 10);
    CHECK(synth_meter_value(&m) == 8.0 / 10, "position meter %g", synth_meter_value(&m));
    m = (SynthMeter){0};
    synth_meter_add(find("mqar"), &m, pr, tg, 2, 4, 10);
    CHECK(synth_meter_value(&m) == (0.5 + 2.0 / 3) / 2, "example meter");
    m = (SynthMeter){0};
    synth_meter_add(find("niah-1"), &m, pr2, tg, 2, 4, 10);
    synth_meter_add(find("niah-1"), &m, pr, tg, 2, 4, 10);
    CHECK(synth_meter_value(&m) == 0.5, "exact meter %g", synth_meter_value(&m));
    m = (SynthMeter){0};
    synth_meter_add(find("mad-recall"), &m, pr, tg, 2, 4, 10);
    synth_meter_add(find("mad-recall"), &m, pr2, tg, 2, 4, 10);
    CHECK(synth_meter_value(&m) == 0.75, "macro meter %g (batches 0.5 and 1)", synth_meter_value(&m));
}

static void refused(const SynthTask *t, SynthSettings s, const char *field) {
    int rc = synth_check(t, &s);
    CHECK(rc == MN_ERR_ARG, "%s: bad %s accepted", t->name, field);
    CHECK(rc == 0 || strstr(mn_last_error(), field), "%s: message '%s' does not name %s", t->name, mn_last_error(),
          field);
    int32_t x[4];
    CHECK(synth_make(t, &s, SYNTH_TRAIN, 1, 0, 1, x, x) == MN_ERR_ARG, "%s: make with bad %s", t->name, field);
}

TEST(synth_bad_settings) {
    SynthSettings s = find("mqar")->base;
    s.seq_len = 63;
    refused(find("mqar"), s, "seq_len");
    s = find("mqar")->base, s.num_pairs = 17;
    refused(find("mqar"), s, "num_pairs");
    s = find("mqar")->base, s.vocab = 64;
    refused(find("mqar"), s, "vocab");
    s = find("mad-noisy-recall")->base, s.frac_noise = 1.5;
    refused(find("mad-noisy-recall"), s, "frac_noise");
    s = find("mad-recall")->base, s.multi_query = 0;
    refused(find("mad-recall"), s, "multi_query");
    s = find("mad-selective-copy")->base, s.num_copy = 200;
    refused(find("mad-selective-copy"), s, "seq_len");
    s = find("mad-fuzzy-recall")->base, s.vocab = 6;
    refused(find("mad-fuzzy-recall"), s, "vocab");
    s = find("parity")->base, s.min_len = 0;
    refused(find("parity"), s, "min_len");
    s = find("niah-1")->base, s.depth = 2;
    refused(find("niah-1"), s, "depth");
    s = find("niah-3")->base, s.seq_len = 40;
    refused(find("niah-3"), s, "seq_len");
    s = find("parity")->base, s.n_train = -1;
    refused(find("parity"), s, "n_train");
    // synth_set: names, numbers, whole numbers.
    s = find("mqar")->base;
    CHECK(synth_set(&s, "vocab", "4096") == 0 && s.vocab == 4096, "set vocab");
    CHECK(synth_set(&s, "frac_noise", "0.25") == 0 && s.frac_noise == 0.25, "set frac_noise");
    CHECK(synth_set(&s, "n_train", "5000000000") == 0 && s.n_train == 5000000000LL, "set n_train");
    CHECK(synth_set(&s, "vocabulary", "3") == MN_ERR_ARG && strstr(mn_last_error(), "vocabulary"), "unknown field");
    CHECK(synth_set(&s, "vocab", "3x") == MN_ERR_ARG && strstr(mn_last_error(), "vocab"), "not a number: %s",
          mn_last_error());
    CHECK(synth_set(&s, "num_pairs", "2.5") == MN_ERR_ARG && strstr(mn_last_error(), "num_pairs"), "not whole");
    CHECK(synth_find("nope") == NULL && strstr(mn_last_error(), "mad-recall"), "unknown task lists the tasks: %s",
          mn_last_error());
    int V, T;
    CHECK(synth_shape(find("mqar"), &find("mqar")->base, 2, &V, &T) == MN_ERR_ARG && strstr(mn_last_error(), "split"),
          "bad split");
}

// Every setting of every grid, both splits: two examples each, ids in range,
// at least one target per example.
TEST(synth_every_setting) {
    for (int i = 0; i < synth_task_count(); i++) {
        const SynthTask *t = synth_task(i);
        for (int g = 0; g < synth_grid_count(t); g++) {
            SynthSettings s;
            char label[64];
            synth_grid(t, g, &s, label, sizeof label);
            for (int split = 0; split < 2; split++) {
                Batch b = make(t, &s, split, 77, 1000, 2);
                for (int e = 0; e < b.n; e++) {
                    int nt = 0, bad = 0;
                    for (int p = 0; p < b.T; p++) {
                        int32_t x = b.in[(size_t)e * b.T + p], y = b.tg[(size_t)e * b.T + p];
                        bad |= x < 0 || x >= b.V || y < -1 || y >= b.V;
                        nt += y >= 0;
                    }
                    CHECK(!bad && nt > 0, "%s %s split %d: ids out of range or no target (%d)", t->name, label, split,
                          nt);
                }
                drop(&b);
            }
        }
    }
}

// What each task's metric is called (plot axes and table titles), and the grids that plots draw at
// their values: RegBench by its training automata, S-NIAH by context length; MQAR's (L, K) pairs
// and MAD's mixed variations stay categories.
TEST(synth_metric_names_and_grid_axes) {
    for (int i = 0; i < synth_task_count(); i++) {
        const char *m = synth_metric_name(synth_task(i));
        CHECK(m && strstr(m, "accuracy"), "%s: metric name '%s'", synth_task(i)->name, m ? m : "(null)");
    }
    CHECK(!strcmp(synth_metric_name(find("niah-1")), "exact-match accuracy"), "niah-1: %s",
          synth_metric_name(find("niah-1")));
    CHECK(!strcmp(synth_metric_name(find("mqar")), "per-example accuracy"), "mqar: %s", synth_metric_name(find("mqar")));
    CHECK(!strcmp(synth_metric_name(find("mad-recall")), "macro-averaged accuracy"), "mad-recall: %s",
          synth_metric_name(find("mad-recall")));
    double v[16];
    const SynthTask *niah = find("niah-2");
    const char *axis = synth_grid_axis(niah, v);
    CHECK(axis && strstr(axis, "context length"), "niah-2's axis: %s", axis ? axis : "(none)");
    CHECK(synth_grid_count(niah) == 4 && v[0] == 1024 && v[1] == 2048 && v[2] == 4096 && v[3] == 8192,
          "niah-2's values: %g %g %g %g", v[0], v[1], v[2], v[3]);
    CHECK(!synth_grid_axis(find("mqar"), v), "mqar's (L, K) pairs drawn as one quantity");
    CHECK(!synth_grid_axis(find("mad-noisy-recall"), v), "MAD's mixed variations drawn as one quantity");
    CHECK(!synth_grid_axis(find("parity"), v), "parity's final_only drawn as a quantity");
}
