/*
 * Token shards (shard.h): writing atomically, reading with every field
 * checked, so that a truncated or foreign file fails loudly with the file and
 * the field named instead of training on garbage.
 *
 * Integers are encoded byte by byte, so the files are the same on every host
 * whatever its endianness.
 */
#include "shard.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/common.h"

// Ids are int32 in memory, so at most 2^31 of them.
#define SHARD_MAX_VOCAB 2147483648u
// Tokens are encoded and decoded through a stack buffer of this many.
#define SHARD_CHUNK 4096

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get_u64(const uint8_t *p) { return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32; }

uint32_t shard_bytes_per_token(uint32_t vocab_size) { return vocab_size <= 65536u ? 2u : 4u; }

// The header fields that both the writer (code MN_ERR_ARG) and the reader
// (MN_ERR_FORMAT) insist on.
static int check_vocab(int code, const char *path, uint32_t vocab_size, uint32_t bos_id) {
    if (vocab_size == 0 || vocab_size > SHARD_MAX_VOCAB)
        return mn_error(code, "%s: vocab_size %" PRIu32 ", expected 1 .. %" PRIu32, path, vocab_size,
                        SHARD_MAX_VOCAB);
    if (bos_id >= vocab_size)
        return mn_error(code, "%s: bos_id %" PRIu32 " is >= vocab_size %" PRIu32, path, bos_id, vocab_size);
    return MN_OK;
}

// ---------------------------------------------------------------------------
// Writing

static int write_bytes(FILE *f, const char *path, const void *p, size_t n) {
    if (fwrite(p, 1, n, f) != n) return mn_error(MN_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    return MN_OK;
}

// Header and tokens into an open file; the ids were checked by the caller.
static int write_body(FILE *f, const char *path, const int32_t *tokens, uint64_t n, uint32_t vocab_size,
                      uint32_t bos_id) {
    uint8_t h[SHARD_HEADER_BYTES] = {0};
    uint32_t bpt = shard_bytes_per_token(vocab_size);
    put_u32(h + 0, SHARD_MAGIC);
    put_u32(h + 4, SHARD_VERSION);
    put_u32(h + 8, vocab_size);
    put_u32(h + 12, bpt);
    put_u64(h + 16, n);
    put_u32(h + 24, bos_id);
    MN_TRY(write_bytes(f, path, h, sizeof h));
    uint8_t buf[SHARD_CHUNK * 4];
    for (uint64_t i = 0; i < n; i += SHARD_CHUNK) {
        size_t m = (size_t)(n - i < SHARD_CHUNK ? n - i : SHARD_CHUNK);
        for (size_t j = 0; j < m; j++) {
            uint32_t v = (uint32_t)tokens[i + j];
            if (bpt == 2) {
                buf[2 * j] = (uint8_t)v;
                buf[2 * j + 1] = (uint8_t)(v >> 8);
            } else {
                put_u32(buf + 4 * j, v);
            }
        }
        MN_TRY(write_bytes(f, path, buf, m * bpt));
    }
    return MN_OK;
}

// Writes into `tmp`, flushed to the disk, then closed; removes it on failure.
static int write_tmp(const char *tmp, const int32_t *tokens, uint64_t n, uint32_t vocab_size, uint32_t bos_id) {
    FILE *f = fopen(tmp, "wb");
    if (!f) return mn_error(MN_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    int s = write_body(f, tmp, tokens, n, vocab_size, bos_id);
    // fflush moves stdio's buffer to the kernel, fsync the kernel's to the disk:
    // without both, a crash after the rename could leave a renamed empty file.
    if (!s && fflush(f)) s = mn_error(MN_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
    if (!s && fsync(fileno(f))) s = mn_error(MN_ERR_IO, "%s: fsync failed: %s", tmp, strerror(errno));
    if (fclose(f) && !s) s = mn_error(MN_ERR_IO, "%s: close failed: %s", tmp, strerror(errno));
    if (s) remove(tmp);
    return s;
}

int shard_write(const char *path, const int32_t *tokens, uint64_t n, uint32_t vocab_size, uint32_t bos_id) {
    if (!path || (!tokens && n > 0)) return mn_error(MN_ERR_ARG, "shard_write: NULL path or tokens");
    MN_TRY(check_vocab(MN_ERR_ARG, path, vocab_size, bos_id));
    // Check every id before creating anything: a refused shard leaves no file.
    for (uint64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= vocab_size)
            return mn_error(MN_ERR_ARG, "%s: token %" PRId32 " at index %" PRIu64 " is outside [0, vocab_size %" PRIu32 ")",
                            path, tokens[i], i, vocab_size);
    size_t len = strlen(path);
    char *tmp = malloc(len + 5);
    if (!tmp) return mn_error(MN_ERR_NOMEM, "%s: out of memory", path);
    memcpy(tmp, path, len);
    memcpy(tmp + len, ".tmp", 5);
    int s = write_tmp(tmp, tokens, n, vocab_size, bos_id);
    if (!s && rename(tmp, path)) {
        s = mn_error(MN_ERR_IO, "%s: cannot rename %s to it: %s", path, tmp, strerror(errno));
        remove(tmp);
    }
    free(tmp);
    return s;
}

// ---------------------------------------------------------------------------
// Reading

typedef struct {
    uint32_t magic, version, vocab_size, bytes_per_token, bos_id;
    uint64_t n_tokens;
} ShardHeader;

// Parses and checks the 64 header bytes; file_bytes is the whole file's length.
static int parse_header(const char *path, const uint8_t *h, uint64_t file_bytes, ShardHeader *hd) {
    hd->magic = get_u32(h);
    hd->version = get_u32(h + 4);
    hd->vocab_size = get_u32(h + 8);
    hd->bytes_per_token = get_u32(h + 12);
    hd->n_tokens = get_u64(h + 16);
    hd->bos_id = get_u32(h + 24);
    if (hd->magic != SHARD_MAGIC)
        return mn_error(MN_ERR_FORMAT, "%s: bad magic 0x%08" PRIx32 ", expected 0x%08x (not a mesanet token shard)",
                        path, hd->magic, SHARD_MAGIC);
    if (hd->version != SHARD_VERSION)
        return mn_error(MN_ERR_FORMAT, "%s: version %" PRIu32 ", expected %u (written by another mesanet version?)",
                        path, hd->version, SHARD_VERSION);
    MN_TRY(check_vocab(MN_ERR_FORMAT, path, hd->vocab_size, hd->bos_id));
    uint32_t bpt = shard_bytes_per_token(hd->vocab_size);
    if (hd->bytes_per_token != bpt)
        return mn_error(MN_ERR_FORMAT, "%s: bytes_per_token %" PRIu32 ", expected %" PRIu32 " for vocab_size %" PRIu32,
                        path, hd->bytes_per_token, bpt, hd->vocab_size);
    for (int i = 28; i < SHARD_HEADER_BYTES; i++)
        if (h[i]) return mn_error(MN_ERR_FORMAT, "%s: reserved header byte %d is 0x%02x, expected 0", path, i, h[i]);
    uint64_t body = file_bytes - SHARD_HEADER_BYTES;
    if (hd->n_tokens > UINT64_MAX / bpt)
        return mn_error(MN_ERR_FORMAT, "%s: truncated: header says %" PRIu64 " tokens, more bytes than any file holds",
                        path, hd->n_tokens);
    if (hd->n_tokens > body / bpt)
        return mn_error(MN_ERR_FORMAT,
                        "%s: truncated: header says %" PRIu64 " tokens (%" PRIu64 " bytes) but only %" PRIu64
                        " bytes follow",
                        path, hd->n_tokens, hd->n_tokens * (uint64_t)bpt, body);
    if (hd->n_tokens * bpt != body)
        return mn_error(MN_ERR_FORMAT,
                        "%s: %" PRIu64 " bytes follow the header but n_tokens %" PRIu64 " needs %" PRIu64
                        " (trailing garbage?)",
                        path, body, hd->n_tokens, hd->n_tokens * bpt);
    if (hd->n_tokens > SIZE_MAX / sizeof(int32_t))
        return mn_error(MN_ERR_NOMEM, "%s: %" PRIu64 " tokens do not fit in memory", path, hd->n_tokens);
    return MN_OK;
}

// Reads n tokens of bpt bytes each and checks every id.
static int read_tokens(FILE *f, const char *path, const ShardHeader *hd, int32_t *out) {
    uint32_t bpt = hd->bytes_per_token;
    uint8_t buf[SHARD_CHUNK * 4];
    for (uint64_t i = 0; i < hd->n_tokens; i += SHARD_CHUNK) {
        size_t m = (size_t)(hd->n_tokens - i < SHARD_CHUNK ? hd->n_tokens - i : SHARD_CHUNK);
        if (fread(buf, bpt, m, f) != m)
            return mn_error(MN_ERR_IO, "%s: read failed at token %" PRIu64 ": %s", path, i,
                            ferror(f) ? strerror(errno) : "unexpected end of file");
        for (size_t j = 0; j < m; j++) {
            uint32_t v = bpt == 2 ? (uint32_t)buf[2 * j] | (uint32_t)buf[2 * j + 1] << 8 : get_u32(buf + 4 * j);
            if (v >= hd->vocab_size)
                return mn_error(MN_ERR_FORMAT, "%s: token %" PRIu32 " at index %" PRIu64 " is >= vocab_size %" PRIu32,
                                path, v, i + j, hd->vocab_size);
            out[i + j] = (int32_t)v;
        }
    }
    return MN_OK;
}

static int read_body(FILE *f, const char *path, TokenShard *out) {
    struct stat st;
    if (fstat(fileno(f), &st)) return mn_error(MN_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    uint64_t file_bytes = (uint64_t)st.st_size;
    if (file_bytes < SHARD_HEADER_BYTES)
        return mn_error(MN_ERR_FORMAT, "%s: truncated header: the file has %" PRIu64 " bytes, a shard header %d",
                        path, file_bytes, SHARD_HEADER_BYTES);
    uint8_t h[SHARD_HEADER_BYTES];
    if (fread(h, 1, sizeof h, f) != sizeof h)
        return mn_error(MN_ERR_IO, "%s: cannot read the header: %s", path,
                        ferror(f) ? strerror(errno) : "unexpected end of file");
    ShardHeader hd;
    MN_TRY(parse_header(path, h, file_bytes, &hd));
    // malloc, not mn_calloc: zeroing a large shard before overwriting it is wasted time.
    out->tokens = malloc(hd.n_tokens ? (size_t)hd.n_tokens * sizeof(int32_t) : 1);
    if (!out->tokens)
        return mn_error(MN_ERR_NOMEM, "%s: out of memory for %" PRIu64 " tokens", path, hd.n_tokens);
    out->vocab_size = hd.vocab_size;
    out->bos_id = hd.bos_id;
    out->n_tokens = hd.n_tokens;
    return read_tokens(f, path, &hd, out->tokens);
}

int shard_read(const char *path, TokenShard *out) {
    if (!path || !out) return mn_error(MN_ERR_ARG, "shard_read: NULL path or output");
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (!f) return mn_error(MN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    int s = read_body(f, path, out);
    if (fclose(f) && !s) s = mn_error(MN_ERR_IO, "%s: close failed: %s", path, strerror(errno));
    if (s) shard_free(out);
    return s;
}

void shard_free(TokenShard *s) {
    if (!s) return;
    free(s->tokens);
    memset(s, 0, sizeof *s);
}
