/*
 * What bpe.c shares with the trainer (bpe_train.c): GPT-2's byte alphabet,
 * the two hash maps, and the file writer (bpe_write.c). Not part of the public
 * interface.
 */
#ifndef MN_BPE_INTERNAL_H
#define MN_BPE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

// ---------------------------------------------------------------------------
// GPT-2's byte-to-unicode alphabet: the files spell every byte as one printable
// character. Bytes that are printable Latin-1 keep their code point; the other
// 68 get 256, 257, ... in byte order. "Rank" is the position in GPT-2's list of
// bytes (printable ones first), which is also the id of the byte's token in
// GPT-2's encoder.json and in trained vocabularies.

uint32_t bpe_byte_char(int byte);  // the code point that spells `byte`
int bpe_char_byte(uint32_t cp);    // the byte spelled by cp, or -1
int bpe_byte_rank(int byte);       // 0..255

// ---------------------------------------------------------------------------
// ByteMap: byte string -> int32, open addressing. Keys are not copied: a key is
// an offset and length into the buffer *base, which may move (realloc) between
// calls as long as the offsets stay valid.

typedef struct {
    uint64_t hash;  // 0: empty slot (bytes_hash never returns 0)
    size_t off, len;
    int32_t value;
} ByteMapSlot;

typedef struct {
    ByteMapSlot *slots;  // [mask + 1]
    size_t mask, count;
    const unsigned char *const *base;
} ByteMap;

uint64_t bytes_hash(const unsigned char *p, size_t n);
int bytemap_init(ByteMap *m, const unsigned char *const *base, size_t expected);
void bytemap_free(ByteMap *m);
// The value of key[0..len) (hash = bytes_hash(key, len)), or -1.
int32_t bytemap_get(const ByteMap *m, const unsigned char *key, size_t len, uint64_t hash);
// Adds (*base)[off..off+len) -> value; the key must be absent.
int bytemap_put(ByteMap *m, size_t off, size_t len, uint64_t hash, int32_t value);

// ---------------------------------------------------------------------------
// PairMap: (left id, right id) -> int32, open addressing.

typedef struct {
    uint64_t *keys;   // [mask + 1] left << 32 | right; PAIR_EMPTY when free
    int32_t *values;  // [mask + 1]
    size_t mask, count;
    int shift;        // 64 - log2(mask + 1), for Fibonacci hashing
} PairMap;

#define PAIR_EMPTY UINT64_MAX
static inline uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t)(uint32_t)a << 32 | (uint32_t)b; }

int pairmap_init(PairMap *m, size_t expected);
void pairmap_free(PairMap *m);
int32_t pairmap_get(const PairMap *m, uint64_t key);  // -1 when absent
// The value slot of key, inserted with value `init` when absent; NULL on no memory.
int32_t *pairmap_slot(PairMap *m, uint64_t key, int32_t init);

// ---------------------------------------------------------------------------
// Writes dir/encoder.json and dir/vocab.bpe (creating dir if missing) for n
// tokens, token i being bytes[off[i] .. off[i+1]), and nmerges merges
// merges[2r], merges[2r+1] (left and right ids) in rank order.
int bpe_write_files(const char *dir, const unsigned char *bytes, const size_t *off, int n, const int32_t *merges,
                    int nmerges);

#endif
