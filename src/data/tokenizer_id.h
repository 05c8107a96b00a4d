/*
 * A tokenizer's identity: the files that define it (encoder.json, the vocabulary, and
 * vocab.bpe, the merges) compared byte for byte between two directories. A data directory
 * holds the tokenizer its shards were made with (tokenize.h), and a run directory a copy of
 * its training data's (the trainer copies it), so that eval can refuse to score a model on
 * token ids from another tokenizer: two BPEs of the same size give ids of the same range, and
 * nothing else would tell them apart.
 */
#ifndef MN_TOKENIZER_ID_H
#define MN_TOKENIZER_ID_H

#include <stddef.h>

enum { TOKENIZER_NFILES = 2 };
extern const char *const tokenizer_files[TOKENIZER_NFILES];  // "encoder.json", "vocab.bpe"

// 1 when dir holds any of the tokenizer's files.
int tokenizer_recorded(const char *dir);

// Compares the tokenizer files of directories a and b: *same = 1 when each file is in both with
// the same bytes (or in neither); otherwise 0 and `why` names the first difference
// ("encoder.json differs", "vocab.bpe is missing from B"). Fails (MN_ERR_IO, naming the file)
// only when a file is there but cannot be read.
int tokenizer_compare(const char *a, const char *b, int *same, char *why, size_t cap);

#endif
