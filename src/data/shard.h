/*
 * Token shards: a tokenized corpus in one binary file, the input of the data
 * loader (docs/data.md).
 *
 * Layout, all integers little-endian:
 *   offset  size  field
 *        0     4  magic = 0x4d4e5348 (bytes 'H' 'S' 'N' 'M' on disk)
 *        4     4  version = 1
 *        8     4  vocab_size, 1 .. 2^31 (token ids are int32)
 *       12     4  bytes_per_token: 2 if vocab_size <= 65536, else 4
 *       16     8  n_tokens
 *       24     4  bos_id, < vocab_size
 *       28    36  reserved, zero
 *       64        n_tokens tokens of bytes_per_token bytes each, unsigned
 * The file ends exactly after the last token. The tokenizer writes bos_id
 * before every document, so documents are the runs between BOS tokens.
 */
#ifndef MN_SHARD_H
#define MN_SHARD_H

#include <stdint.h>

#define SHARD_MAGIC 0x4d4e5348u
#define SHARD_VERSION 1u
#define SHARD_HEADER_BYTES 64

typedef struct {
    uint32_t vocab_size;  // token ids are in [0, vocab_size)
    uint32_t bos_id;      // the document separator written before every document
    uint64_t n_tokens;    // length of tokens
    int32_t *tokens;      // [n_tokens], malloc'ed; freed by shard_free
} TokenShard;

// 2 or 4: the smallest width that holds every id below vocab_size.
uint32_t shard_bytes_per_token(uint32_t vocab_size);

// Writes n tokens to `path` atomically: into path.tmp, fsync, then rename, so
// a reader never sees a half-written shard. Refuses (and writes nothing) when
// an id is negative or >= vocab_size, or bos_id >= vocab_size.
int shard_write(const char *path, const int32_t *tokens, uint64_t n, uint32_t vocab_size, uint32_t bos_id);

// Reads and validates a whole shard: magic, version, header fields, the file
// length against n_tokens, and every id < vocab_size. On failure *out is
// left empty (safe to shard_free).
int shard_read(const char *path, TokenShard *out);

void shard_free(TokenShard *s);

#endif
