/*
 * The data loader: turns a token shard into batches of training sequences,
 * following the MesaNet paper's recipe (docs/data.md):
 *
 * - The shard is one stream of documents, each preceded by BOS; sequences are
 *   packed across document boundaries, so no tokens are wasted on padding.
 * - Sequence s is the window stream[s*T .. s*T + T] (T+1 tokens): inputs are
 *   its first T tokens, targets its last T. With stride T every token of the
 *   stream is a target exactly once per epoch, except the first and those of
 *   the final partial window.
 * - A target equal to BOS becomes -1 (no loss): the start of a document cannot
 *   be predicted from the end of the previous, unrelated one.
 * - Training walks the sequences in a fresh random order each epoch (a
 *   Fisher-Yates permutation from an MnRng seeded by (seed, epoch));
 *   validation walks them in order. A batch's rows are drawn one after the
 *   other, so a batch can straddle two epochs; every epoch still sees every
 *   sequence exactly once.
 * - The position (epoch, index) determines everything that follows, so a
 *   resumed run sees the same batches as an uninterrupted one.
 */
#ifndef MN_LOADER_H
#define MN_LOADER_H

#include <stdint.h>

#include "data/shard.h"

typedef struct {
    char *path;        // the shard's path, for messages
    TokenShard shard;  // the whole token stream, in memory
    int B, T;          // sequences per batch, tokens per sequence
    uint64_t n_seq;    // sequences per epoch: (n_tokens - 1) / T
    int shuffle;       // nonzero: a new random order each epoch; zero: in order
    uint64_t *perm;    // [n_seq] the current epoch's order (shuffle only, else NULL)
    uint64_t seed;     // shuffling seed
    uint64_t epoch;    // current epoch
    uint64_t index;    // next sequence within the epoch's order, < n_seq
} DataLoader;

// Reads the shard and prepares epoch 0. Fails if the shard holds fewer than
// T+1 tokens. On failure dl is left closed (loader_close is harmless).
int loader_open(DataLoader *dl, const char *shard_path, int B, int T, uint64_t seed, int shuffle);

// Fills inputs[B*T] and targets[B*T] (row-major, one sequence per row) and
// advances by B sequences, moving to the next epoch (and its permutation)
// whenever the current one runs out. Targets equal to the BOS id are -1.
int loader_next(DataLoader *dl, int32_t *inputs, int32_t *targets);

// Resume support: setting a position saved by loader_get_position makes the
// next loader_next return what it returned after the save.
void loader_get_position(const DataLoader *dl, uint64_t *epoch, uint64_t *index);
int loader_set_position(DataLoader *dl, uint64_t epoch, uint64_t index);

uint64_t loader_num_sequences(const DataLoader *dl);

void loader_close(DataLoader *dl);

#endif
