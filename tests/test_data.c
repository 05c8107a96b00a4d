// Token shards and the data loader: round trips, every kind of bad file, and
// the loader's packing, masking, shuffling, determinism and resume.
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/common.h"
#include "data/loader.h"
#include "data/shard.h"
#include "data/tokenizer_id.h"
#include "test.h"
#include "tmpdir.h"

// ---------------------------------------------------------------------------
// Helpers: a scratch directory per test, and raw file surgery.

typedef struct {
    char dir[64];     // mkdtemp'ed directory
    char file[128];   // dir + "/shard.bin"
} Scratch;

static void scratch_open(Scratch *s) {
    snprintf(s->dir, sizeof s->dir, "/tmp/mn_test_data_XXXXXX");
    if (!mkdtemp(s->dir)) die("mkdtemp failed");
    snprintf(s->file, sizeof s->file, "%s/shard.bin", s->dir);
}

// Removes the shard and its temp twin; CHECKs that the directory is then
// empty, i.e. that nothing else (a stray temp file) was left behind.
static void scratch_close(Scratch *s) {
    char tmp[160];
    snprintf(tmp, sizeof tmp, "%s.tmp", s->file);
    remove(s->file);
    remove(tmp);
    CHECK(rmdir(s->dir) == 0, "%s: not empty after the test", s->dir);
}

static int file_exists(const char *path) { return access(path, F_OK) == 0; }

static long file_size(const char *path) {
    struct stat st;
    return stat(path, &st) ? -1 : (long)st.st_size;
}

// Overwrites n bytes at offset of an existing file.
static void patch_file(const char *path, long offset, const void *bytes, size_t n) {
    FILE *f = fopen(path, "r+b");
    if (!f || fseek(f, offset, SEEK_SET) || fwrite(bytes, 1, n, f) != n || fclose(f)) die("cannot patch %s", path);
}

static void patch_u32(const char *path, long offset, uint32_t v) {
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    patch_file(path, offset, b, 4);
}

static void cut_file(const char *path, long size) {
    if (truncate(path, size)) die("cannot truncate %s", path);
}

// Expects shard_read to fail with `code` and a message naming the file and
// containing `what`, and to leave the output empty.
static void expect_read_fails(const char *path, int code, const char *what) {
    TokenShard sh;
    int s = shard_read(path, &sh);
    const char *msg = mn_last_error();
    CHECK(s == code, "expected status %d (%s), got %d: %s", code, what, s, msg);
    CHECK(strstr(msg, path) && strstr(msg, what), "message \"%s\" lacks the path or \"%s\"", msg, what);
    CHECK(sh.tokens == NULL && sh.n_tokens == 0, "output not emptied after a failed read");
    if (s == code) test_note("refused: %s", msg);
}

// ---------------------------------------------------------------------------
// Shards

// Writes n random ids below vocab (the largest included), reads them back and
// checks the header, the file size and that no temp file is left.
static void roundtrip(uint32_t vocab, uint64_t n, uint32_t want_bpt) {
    Scratch sc;
    scratch_open(&sc);
    int32_t *tok = xcalloc(n + 1, sizeof(int32_t));
    MnRng rng;
    mn_rng_seed(&rng, vocab);
    for (uint64_t i = 0; i < n; i++) tok[i] = (int32_t)(mn_rng_u64(&rng) % vocab);
    if (n > 0) tok[n - 1] = (int32_t)(vocab - 1);
    uint32_t bos = vocab / 2;
    CHECK(shard_bytes_per_token(vocab) == want_bpt, "vocab %u: %u bytes per token, want %u", vocab,
          shard_bytes_per_token(vocab), want_bpt);
    CHECK(shard_write(sc.file, tok, n, vocab, bos) == MN_OK, "write: %s", mn_last_error());
    char tmp[160];
    snprintf(tmp, sizeof tmp, "%s.tmp", sc.file);
    CHECK(!file_exists(tmp), "%s left behind", tmp);
    CHECK(file_size(sc.file) == (long)(SHARD_HEADER_BYTES + n * want_bpt), "vocab %u, n %lu: file is %ld bytes",
          vocab, (unsigned long)n, file_size(sc.file));
    TokenShard sh;
    CHECK(shard_read(sc.file, &sh) == MN_OK, "read: %s", mn_last_error());
    CHECK(sh.vocab_size == vocab && sh.bos_id == bos && sh.n_tokens == n, "header: vocab %u bos %u n %lu",
          sh.vocab_size, sh.bos_id, (unsigned long)sh.n_tokens);
    if (sh.n_tokens == n)
        for (uint64_t i = 0; i < n; i++)
            if (sh.tokens[i] != tok[i]) {
                CHECK(0, "token %lu: read %d, wrote %d", (unsigned long)i, sh.tokens[i], tok[i]);
                break;
            }
    shard_free(&sh);
    free(tok);
    scratch_close(&sc);
}

TEST(data_shard_roundtrip_2byte) {
    roundtrip(50257, 10000, 2);
    roundtrip(65536, 5000, 2);  // the largest 2-byte vocabulary: id 65535 must survive
    roundtrip(1, 3, 2);
    roundtrip(1000, 0, 2);      // an empty shard is valid
}

TEST(data_shard_roundtrip_4byte) {
    roundtrip(65537, 5000, 4);  // id 65536 needs the 4-byte form
    roundtrip(2147483648u, 5000, 4);
}

// The magic reads "HSNM" on disk (0x4d4e5348 little-endian) and the fields
// sit where docs/data.md says.
TEST(data_shard_header_layout) {
    Scratch sc;
    scratch_open(&sc);
    int32_t tok[3] = {7, 0, 9};
    CHECK(shard_write(sc.file, tok, 3, 70000, 7) == MN_OK, "write: %s", mn_last_error());
    uint8_t h[SHARD_HEADER_BYTES + 12];
    FILE *f = fopen(sc.file, "rb");
    size_t got = f ? fread(h, 1, sizeof h, f) : 0;
    if (f) fclose(f);
    CHECK(got == sizeof h, "read %zu bytes of %zu", got, sizeof h);
    uint8_t want[32] = {'H', 'S', 'N', 'M', 1, 0, 0, 0, 0x70, 0x11, 1, 0, 4, 0, 0, 0,
                        3,   0,   0,   0,   0, 0, 0, 0, 7,    0,    0, 0, 0, 0, 0, 0};
    CHECK(memcmp(h, want, sizeof want) == 0, "header bytes differ from the documented layout");
    CHECK(h[64] == 7 && h[68] == 0 && h[72] == 9 && h[73] == 0, "tokens not little-endian after the header");
    scratch_close(&sc);
}

TEST(data_shard_write_refuses_bad_input) {
    Scratch sc;
    scratch_open(&sc);
    int32_t tok[4] = {1, 2, 1000, 3};
    CHECK(shard_write(sc.file, tok, 4, 1000, 0) == MN_ERR_ARG, "id 1000 >= vocab 1000 accepted");
    CHECK(strstr(mn_last_error(), "index 2"), "message lacks the index: %s", mn_last_error());
    test_note("refused: %s", mn_last_error());
    tok[2] = -1;
    CHECK(shard_write(sc.file, tok, 4, 1000, 0) == MN_ERR_ARG, "negative id accepted");
    tok[2] = 5;
    CHECK(shard_write(sc.file, tok, 4, 1000, 1000) == MN_ERR_ARG, "bos_id 1000 >= vocab 1000 accepted");
    CHECK(shard_write(sc.file, tok, 4, 0, 0) == MN_ERR_ARG, "vocab 0 accepted");
    CHECK(!file_exists(sc.file), "a refused write left %s", sc.file);
    CHECK(shard_write("/nonexistent-dir/x.bin", tok, 4, 1000, 0) == MN_ERR_IO, "write into a missing directory");
    CHECK(strstr(mn_last_error(), "/nonexistent-dir/x.bin.tmp"), "message: %s", mn_last_error());
    // An existing shard is replaced whole.
    CHECK(shard_write(sc.file, tok, 4, 1000, 0) == MN_OK, "write: %s", mn_last_error());
    CHECK(shard_write(sc.file, tok, 2, 1000, 0) == MN_OK, "rewrite: %s", mn_last_error());
    CHECK(file_size(sc.file) == SHARD_HEADER_BYTES + 4, "rewritten file is %ld bytes", file_size(sc.file));
    scratch_close(&sc);
}

// Writes a good 100-token shard (vocab 1000) at sc->file.
static void write_good(const Scratch *sc) {
    int32_t tok[100];
    for (int i = 0; i < 100; i++) tok[i] = i * 7;
    if (shard_write(sc->file, tok, 100, 1000, 0)) die("%s", mn_last_error());
}

TEST(data_shard_read_rejects_bad_files) {
    Scratch sc;
    scratch_open(&sc);
    expect_read_fails(sc.file, MN_ERR_IO, "cannot open");

    write_good(&sc);
    patch_u32(sc.file, 0, 0x1234);
    expect_read_fails(sc.file, MN_ERR_FORMAT, "bad magic 0x00001234, expected 0x4d4e5348");

    write_good(&sc);
    patch_u32(sc.file, 4, 2);
    expect_read_fails(sc.file, MN_ERR_FORMAT, "version 2, expected 1");

    write_good(&sc);
    patch_u32(sc.file, 12, 4);
    expect_read_fails(sc.file, MN_ERR_FORMAT, "bytes_per_token 4, expected 2");

    write_good(&sc);
    patch_u32(sc.file, 24, 1000);
    expect_read_fails(sc.file, MN_ERR_FORMAT, "bos_id 1000 is >= vocab_size 1000");

    write_good(&sc);
    patch_u32(sc.file, 40, 1);
    expect_read_fails(sc.file, MN_ERR_FORMAT, "reserved header byte 40");

    write_good(&sc);
    cut_file(sc.file, 30);
    expect_read_fails(sc.file, MN_ERR_FORMAT, "truncated header: the file has 30 bytes");

    write_good(&sc);
    cut_file(sc.file, SHARD_HEADER_BYTES + 150);
    expect_read_fails(sc.file, MN_ERR_FORMAT, "truncated: header says 100 tokens (200 bytes) but only 150 bytes follow");

    write_good(&sc);
    cut_file(sc.file, SHARD_HEADER_BYTES + 201);
    expect_read_fails(sc.file, MN_ERR_FORMAT, "201 bytes follow the header");

    write_good(&sc);
    uint8_t big[2] = {0xe8, 0x03};  // 1000 at token 57
    patch_file(sc.file, SHARD_HEADER_BYTES + 2 * 57, big, 2);
    expect_read_fails(sc.file, MN_ERR_FORMAT, "token 1000 at index 57 is >= vocab_size 1000");

    // A header claiming 2^61 tokens must fail as truncated, not overflow.
    write_good(&sc);
    uint8_t huge[8] = {0, 0, 0, 0, 0, 0, 0, 0x20};
    patch_file(sc.file, 16, huge, 8);
    expect_read_fails(sc.file, MN_ERR_FORMAT, "truncated: header says 2305843009213693952 tokens");
    scratch_close(&sc);
}

// ---------------------------------------------------------------------------
// The loader, on a synthetic stream where every non-BOS token is its own
// position (so a target says exactly which stream token it is) and BOS = 0
// starts documents of 1..40 tokens.

enum { LT = 16, LSEQ = 37, LN = LSEQ * LT + 1 + 7 };  // 7 tokens of a final partial window

typedef struct {
    Scratch sc;
    int32_t stream[LN];
} Stream;

static void stream_make(Stream *st) {
    scratch_open(&st->sc);
    MnRng rng;
    mn_rng_seed(&rng, 42);
    int left = 0;  // tokens left in the current document
    for (int i = 0; i < LN; i++) {
        if (left == 0) {
            st->stream[i] = 0;
            left = 1 + (int)(mn_rng_u64(&rng) % 40);
        } else {
            st->stream[i] = i;
            left--;
        }
    }
    if (shard_write(st->sc.file, st->stream, LN, LN, 0)) die("%s", mn_last_error());
}

static void open_or_fail(DataLoader *dl, const Stream *st, int B, uint64_t seed, int shuffle) {
    if (loader_open(dl, st->sc.file, B, LT, seed, shuffle)) die("loader_open: %s", mn_last_error());
}

// Checks that a row is sequence s's window (inputs the stream shifted by one
// against targets, BOS targets -1) and returns s, or -1 if it is none.
static int row_sequence(const Stream *st, const int32_t *in, const int32_t *tg) {
    int t0 = 0;
    while (t0 < LT && in[t0] == 0) t0++;
    if (t0 == LT) return -1;
    int start = in[t0] - t0;
    if (start < 0 || start % LT || start / LT >= LSEQ) return -1;
    for (int t = 0; t < LT; t++) {
        int32_t next = st->stream[start + t + 1];
        if (in[t] != st->stream[start + t] || tg[t] != (next == 0 ? -1 : next)) return -1;
        if (t + 1 < LT && in[t + 1] != (tg[t] == -1 ? 0 : tg[t])) return -1;  // shifted by one
    }
    return start / LT;
}

TEST(data_loader_every_target_once_per_epoch) {
    Stream st;
    stream_make(&st);
    enum { B = 4, EPOCHS = 4 };  // 37 batches of 4 = 148 rows = exactly 4 epochs of 37
    DataLoader dl;
    open_or_fail(&dl, &st, B, 1234, 1);
    CHECK(loader_num_sequences(&dl) == LSEQ, "%lu sequences, want %d", (unsigned long)loader_num_sequences(&dl), LSEQ);
    int32_t in[B * LT], tg[B * LT];
    int order[EPOCHS][LSEQ], rows = 0;
    for (int k = 0; k < LSEQ * EPOCHS / B; k++) {
        CHECK(loader_next(&dl, in, tg) == MN_OK, "next: %s", mn_last_error());
        for (int b = 0; b < B; b++, rows++) order[rows / LSEQ][rows % LSEQ] = row_sequence(&st, in + b * LT, tg + b * LT);
    }
    for (int e = 0; e < EPOCHS; e++) {
        // Each sequence once <=> each target position 1 .. LSEQ*T once (BOS ones as -1).
        int seen[LSEQ] = {0}, bad = 0, identity = 1;
        for (int i = 0; i < LSEQ; i++) {
            if (order[e][i] < 0) bad++;
            else seen[order[e][i]]++;
            identity &= order[e][i] == i;
        }
        for (int s = 0; s < LSEQ; s++) CHECK(seen[s] == 1, "epoch %d: sequence %d drawn %d times", e, s, seen[s]);
        CHECK(bad == 0, "epoch %d: %d rows are not a window of the stream with BOS targets masked", e, bad);
        CHECK(!identity, "epoch %d: not shuffled", e);
        if (e > 0) CHECK(memcmp(order[e], order[e - 1], sizeof order[e]), "epochs %d and %d in the same order", e - 1, e);
    }
    uint64_t ep, ix;
    loader_get_position(&dl, &ep, &ix);
    CHECK(ep == EPOCHS && ix == 0, "position after %d epochs: (%lu, %lu)", EPOCHS, (unsigned long)ep, (unsigned long)ix);
    loader_close(&dl);
    scratch_close(&st.sc);
}

// The masking on its own: the number of -1 targets in an epoch is the number
// of BOS tokens among stream positions 1 .. LSEQ*T.
TEST(data_loader_bos_targets_masked) {
    Stream st;
    stream_make(&st);
    int want = 0;
    for (int i = 1; i <= LSEQ * LT; i++) want += st.stream[i] == 0;
    DataLoader dl;
    open_or_fail(&dl, &st, 1, 7, 1);
    int32_t in[LT], tg[LT];
    int masked = 0, zero_targets = 0;
    for (int k = 0; k < LSEQ; k++) {
        if (loader_next(&dl, in, tg)) CHECK(0, "next: %s", mn_last_error());
        for (int t = 0; t < LT; t++) {
            masked += tg[t] == -1;
            zero_targets += tg[t] == 0;
        }
    }
    CHECK(want > 10 && masked == want, "%d targets masked, the stream has %d BOS targets", masked, want);
    CHECK(zero_targets == 0, "%d BOS targets not masked", zero_targets);
    loader_close(&dl);
    scratch_close(&st.sc);
}

TEST(data_loader_unshuffled_in_order) {
    Stream st;
    stream_make(&st);
    enum { B = 5 };
    DataLoader dl;
    open_or_fail(&dl, &st, B, 99, 0);
    int32_t in[B * LT], tg[B * LT];
    for (int k = 0, row = 0; k < 20; k++) {
        CHECK(loader_next(&dl, in, tg) == MN_OK, "next: %s", mn_last_error());
        for (int b = 0; b < B; b++, row++) {
            int s = row_sequence(&st, in + b * LT, tg + b * LT);
            CHECK(s == row % LSEQ, "row %d: sequence %d, want %d", row, s, row % LSEQ);
        }
    }
    uint64_t ep, ix;
    loader_get_position(&dl, &ep, &ix);
    CHECK(ep == 100 / LSEQ && ix == 100 % LSEQ, "position after 100 rows: (%lu, %lu)", (unsigned long)ep,
          (unsigned long)ix);
    loader_close(&dl);
    scratch_close(&st.sc);
}

// Draws n batches of B rows into out[n][B*LT] (inputs then targets).
static void draw(DataLoader *dl, int n, int B, int32_t *out) {
    for (int k = 0; k < n; k++) {
        int32_t *in = out + (size_t)k * 2 * B * LT;
        if (loader_next(dl, in, in + B * LT)) die("next: %s", mn_last_error());
    }
}

TEST(data_loader_deterministic) {
    Stream st;
    stream_make(&st);
    enum { B = 3, N = 40, SZ = N * 2 * B * LT };
    int32_t *a = xcalloc(SZ, 4), *b = xcalloc(SZ, 4), *c = xcalloc(SZ, 4);
    DataLoader dl;
    open_or_fail(&dl, &st, B, 5, 1);
    draw(&dl, N, B, a);
    loader_close(&dl);
    open_or_fail(&dl, &st, B, 5, 1);
    draw(&dl, N, B, b);
    loader_close(&dl);
    open_or_fail(&dl, &st, B, 6, 1);
    draw(&dl, N, B, c);
    loader_close(&dl);
    CHECK(memcmp(a, b, SZ * 4) == 0, "same seed, different batches");
    CHECK(memcmp(a, c, 2 * B * LT * 4) != 0, "seeds 5 and 6 give the same first batch");
    free(a); free(b); free(c);
    scratch_close(&st.sc);
}

TEST(data_loader_resume) {
    Stream st;
    stream_make(&st);
    enum { B = 4, N = 60, BATCH = 2 * B * LT };
    int32_t *ref = xcalloc(N * BATCH, 4), got[2 * BATCH];
    DataLoader dl;
    open_or_fail(&dl, &st, B, 77, 1);
    draw(&dl, N, B, ref);
    loader_close(&dl);
    // k = 9: the 10th batch straddles epochs 0 and 1; 37: the first batch of epoch 4.
    int ks[] = {0, 1, 9, 10, 23, 37, 58};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        int k = ks[i];
        uint64_t ep, ix;
        open_or_fail(&dl, &st, B, 77, 1);
        for (int j = 0; j < k; j++) draw(&dl, 1, B, got);  // discarded: only the position matters
        loader_get_position(&dl, &ep, &ix);
        loader_close(&dl);
        open_or_fail(&dl, &st, B, 77, 1);
        CHECK(loader_set_position(&dl, ep, ix) == MN_OK, "set_position: %s", mn_last_error());
        draw(&dl, 2, B, got);
        loader_close(&dl);
        CHECK(memcmp(got, ref + (size_t)k * BATCH, 2 * BATCH * 4) == 0,
              "resumed after %d batches at (%lu, %lu): batches differ from the uninterrupted run", k, (unsigned long)ep,
              (unsigned long)ix);
    }
    open_or_fail(&dl, &st, B, 77, 1);
    CHECK(loader_set_position(&dl, 0, LSEQ) == MN_ERR_ARG, "index %d accepted with %d sequences", LSEQ, LSEQ);
    test_note("refused: %s", mn_last_error());
    loader_close(&dl);
    free(ref);
    scratch_close(&st.sc);
}

TEST(data_loader_rejects_bad_open) {
    Scratch sc;
    scratch_open(&sc);
    DataLoader dl;
    CHECK(loader_open(&dl, sc.file, 2, 16, 0, 1) == MN_ERR_IO, "missing shard opened");
    CHECK(dl.shard.tokens == NULL && dl.perm == NULL && dl.path == NULL, "failed open left memory behind");
    int32_t tok[100] = {0};
    CHECK(shard_write(sc.file, tok, 100, 50, 0) == MN_OK, "write: %s", mn_last_error());
    CHECK(loader_open(&dl, sc.file, 2, 256, 0, 1) == MN_ERR_ARG, "100 tokens accepted for T = 256");
    CHECK(strstr(mn_last_error(), "100 tokens, need at least T+1 = 257 for one sequence") &&
              strstr(mn_last_error(), sc.file),
          "message: %s", mn_last_error());
    test_note("refused: %s", mn_last_error());
    CHECK(loader_open(&dl, sc.file, 0, 16, 0, 1) == MN_ERR_ARG, "B = 0 accepted");
    CHECK(loader_open(&dl, sc.file, 2, 99, 0, 1) == MN_OK, "T+1 = 100 tokens: %s", mn_last_error());
    CHECK(loader_num_sequences(&dl) == 1, "%lu sequences, want 1", (unsigned long)loader_num_sequences(&dl));
    loader_close(&dl);
    loader_close(&dl);  // twice is harmless
    scratch_close(&sc);
}

// ---------------------------------------------------------------------------
// A tokenizer's identity (data/tokenizer_id.h): its files compared byte for byte.

TEST(data_tokenizer_compare_finds_any_difference) {
    TmpDir t;
    tmp_make(&t);
    char a[200], b[200], why[512];
    snprintf(a, sizeof a, "%s/a", t.dir);
    snprintf(b, sizeof b, "%s/b", t.dir);
    CHECK(!mn_mkdirs(a) && !mn_mkdirs(b), "%s", mn_last_error());
    int same = -1;
    CHECK(!tokenizer_recorded(a), "an empty directory records a tokenizer");
    CHECK(!tokenizer_compare(a, b, &same, why, sizeof why) && same == 1, "two directories without one: same %d", same);
    const char *enc = "{\"a\": 0, \"b\": 1}", *merges = "#version: 0.2\na b\n";
    write_bytes(tmp_path(&t, "a/encoder.json"), enc, strlen(enc));
    CHECK(tokenizer_recorded(a), "encoder.json alone is not seen");
    CHECK(!tokenizer_compare(a, b, &same, why, sizeof why) && !same && strstr(why, "encoder.json is missing from") &&
              strstr(why, "/b"),
          "one side without encoder.json: same %d (%s)", same, why);
    write_bytes(tmp_path(&t, "b/encoder.json"), enc, strlen(enc));
    write_bytes(tmp_path(&t, "a/vocab.bpe"), merges, strlen(merges));
    write_bytes(tmp_path(&t, "b/vocab.bpe"), merges, strlen(merges));
    CHECK(!tokenizer_compare(a, b, &same, why, sizeof why) && same == 1, "the same files: same %d (%s)", same, why);
    // one byte, and a length: the last merge, and a file that is a prefix of the other
    write_bytes(tmp_path(&t, "b/vocab.bpe"), "#version: 0.2\na c\n", strlen(merges));
    CHECK(!tokenizer_compare(a, b, &same, why, sizeof why) && !same && !strcmp(why, "vocab.bpe differs"),
          "a changed merge: same %d (%s)", same, why);
    write_bytes(tmp_path(&t, "b/vocab.bpe"), merges, strlen(merges) - 1);
    CHECK(!tokenizer_compare(a, b, &same, why, sizeof why) && !same && !strcmp(why, "vocab.bpe differs"),
          "a shorter file: same %d (%s)", same, why);
    tmp_remove(&t);
}
