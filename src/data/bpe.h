/*
 * Byte-level BPE tokenizer in GPT-2's format (encoder.json + vocab.bpe), with
 * GPT-2's pre-tokenizer written out by hand, and a trainer that writes the same
 * two files.
 *
 * Encoding has two stages, as in OpenAI's encoder.py:
 * 1. The text is split into pre-tokens by GPT-2's regex
 *      's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *    with JavaScript's semantics (`u` flag, JavaScript's \s), on UTF-8. A byte
 *    that does not belong to a valid UTF-8 sequence counts as one character that
 *    is neither letter, number nor space, so ANY byte string can be encoded and
 *    decode(encode(x)) == x.
 * 2. Each pre-token's bytes start as single-byte tokens and the adjacent pair
 *    with the lowest merge rank (line order in vocab.bpe) is merged, all its
 *    occurrences left to right, until no pair has a rank.
 * Plain text never yields a special token: "<|endoftext|>" in the text is
 * encoded as the ordinary characters it is made of; callers add EOT ids.
 *
 * A Bpe is read-only after loading: one can be shared by threads that encode
 * and decode at the same time.
 */
#ifndef MN_BPE_H
#define MN_BPE_H

#include <stddef.h>
#include <stdint.h>

typedef struct Bpe Bpe;  // opaque byte-level BPE tokenizer (GPT-2 style)

// Loads the standard GPT-2 files: encoder.json (token string -> id, in GPT-2's
// byte-to-unicode alphabet) and vocab.bpe (merges in rank order, first line a
// "#version" comment). Ids must be 0..n-1; every merge must name tokens of
// encoder.json that exist by then (single bytes, or made by an earlier merge)
// and make a token of encoder.json that no other merge makes.
int bpe_load(Bpe **out, const char *encoder_json_path, const char *vocab_bpe_path);
void bpe_free(Bpe *bpe);
int bpe_vocab_size(const Bpe *bpe);  // 50257 for GPT-2
int bpe_eot(const Bpe *bpe);         // id of "<|endoftext|>" (50256 for GPT-2); -1 if absent

// Appends the ids of text[0..len) to *ids, a malloc'ed growable array with *n
// used and *cap capacity (may be NULL/0/0 initially; free it with free()).
// A single pre-token (a run of one character class) over 512 MB is refused
// with MN_ERR_UNSUPPORTED.
int bpe_encode(const Bpe *bpe, const unsigned char *text, size_t len, int32_t **ids, size_t *n, size_t *cap);
// The raw bytes of one token (for streaming decode); MN_ERR_ARG for an id out of range.
int bpe_token_bytes(const Bpe *bpe, int32_t id, const unsigned char **bytes, size_t *len);
// Decodes ids into a malloc'ed byte buffer (*out, *out_len; free with free()).
// Special tokens decode to their text ("<|endoftext|>").
int bpe_decode(const Bpe *bpe, const int32_t *ids, size_t n, unsigned char **out, size_t *out_len);

// Trains a byte-level BPE of vocab_size tokens (256 byte tokens + merges +
// "<|endoftext|>" as the last id) on text with the same pre-tokenizer, and
// writes encoder.json and vocab.bpe in exactly GPT-2's format into out_dir
// (created if missing; files written atomically), so that bpe_load reads them.
int bpe_train(const unsigned char *text, size_t len, int vocab_size, const char *out_dir);

// ---------------------------------------------------------------------------
// Building blocks, public for tests and tools

// Writes the tokenizer as out_dir/encoder.json and out_dir/vocab.bpe, byte for
// byte as OpenAI's files are written (json.dumps; "#version: 0.2" + merges):
// saving the loaded GPT-2 files reproduces them exactly.
int bpe_save(const Bpe *bpe, const char *out_dir);

// The end of the pre-token (GPT-2 regex match) that starts at text[pos]; len if pos >= len.
size_t bpe_pretoken_end(const unsigned char *text, size_t len, size_t pos);

#endif
