/*
 * The data loader (loader.h): packed sequences of a token shard, shuffled per
 * epoch, resumable from (epoch, index).
 *
 * The whole shard is held in memory (a 100 M token corpus is 400 MB as int32);
 * the permutation costs 8 bytes per sequence.
 */
#include "loader.h"

#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"

// The splitmix64 finalizer: spreads (seed, epoch) over all 64 bits, so that
// nearby seeds and epochs give unrelated permutations.
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// perm = the order of the sequences in dl->epoch: Fisher-Yates driven by an
// MnRng seeded from (seed, epoch) alone, so any epoch can be rebuilt directly.
static void build_perm(DataLoader *dl) {
    MnRng rng;
    mn_rng_seed(&rng, mix64(dl->seed ^ mix64(dl->epoch + 0x9e3779b97f4a7c15ull)));
    uint64_t n = dl->n_seq;
    for (uint64_t i = 0; i < n; i++) dl->perm[i] = i;
    for (uint64_t i = n; i > 1; i--) {
        // The modulo's bias is below n / 2^64: irrelevant here.
        uint64_t j = mn_rng_u64(&rng) % i;
        uint64_t t = dl->perm[i - 1];
        dl->perm[i - 1] = dl->perm[j];
        dl->perm[j] = t;
    }
}

static int open_checked(DataLoader *dl, const char *path, int B, int T) {
    if (B <= 0 || T <= 0 || (int64_t)B * T > INT_MAX)
        return mn_error(MN_ERR_ARG, "%s: batch B = %d x T = %d: both must be > 0 and B*T <= %d", path, B, T, INT_MAX);
    size_t len = strlen(path);
    dl->path = malloc(len + 1);
    if (!dl->path) return mn_error(MN_ERR_NOMEM, "%s: out of memory", path);
    memcpy(dl->path, path, len + 1);
    MN_TRY(shard_read(path, &dl->shard));
    if (dl->shard.n_tokens < (uint64_t)T + 1)
        return mn_error(MN_ERR_ARG, "%s: %" PRIu64 " tokens, need at least T+1 = %d for one sequence", path,
                        dl->shard.n_tokens, T + 1);
    dl->n_seq = (dl->shard.n_tokens - 1) / (uint64_t)T;
    if (dl->shuffle) {
        dl->perm = mn_calloc((size_t)dl->n_seq, sizeof(uint64_t));
        if (!dl->perm) return mn_error(MN_ERR_NOMEM, "%s: out of memory for %" PRIu64 " sequences", path, dl->n_seq);
        build_perm(dl);
    }
    return MN_OK;
}

int loader_open(DataLoader *dl, const char *shard_path, int B, int T, uint64_t seed, int shuffle) {
    if (!dl || !shard_path) return mn_error(MN_ERR_ARG, "loader_open: NULL loader or path");
    memset(dl, 0, sizeof *dl);
    dl->B = B;
    dl->T = T;
    dl->seed = seed;
    dl->shuffle = shuffle != 0;
    int s = open_checked(dl, shard_path, B, T);
    if (s) loader_close(dl);
    return s;
}

// One row: the window of sequence `seq`, with BOS targets masked.
static void fill_row(const DataLoader *dl, uint64_t seq, int32_t *inputs, int32_t *targets) {
    const int32_t *w = dl->shard.tokens + seq * (uint64_t)dl->T;
    int32_t bos = (int32_t)dl->shard.bos_id;
    for (int t = 0; t < dl->T; t++) {
        inputs[t] = w[t];
        targets[t] = w[t + 1] == bos ? -1 : w[t + 1];
    }
}

// Moves to the next sequence, and into the next epoch after the last one.
static void advance(DataLoader *dl) {
    if (++dl->index < dl->n_seq) return;
    dl->index = 0;
    dl->epoch++;
    if (dl->shuffle) build_perm(dl);
}

int loader_next(DataLoader *dl, int32_t *inputs, int32_t *targets) {
    if (!dl || !dl->shard.tokens || !inputs || !targets)
        return mn_error(MN_ERR_ARG, "loader_next: NULL or closed loader, or NULL buffers");
    for (int b = 0; b < dl->B; b++) {
        uint64_t seq = dl->shuffle ? dl->perm[dl->index] : dl->index;
        size_t off = (size_t)b * (size_t)dl->T;
        fill_row(dl, seq, inputs + off, targets + off);
        advance(dl);
    }
    return MN_OK;
}

void loader_get_position(const DataLoader *dl, uint64_t *epoch, uint64_t *index) {
    *epoch = dl->epoch;
    *index = dl->index;
}

int loader_set_position(DataLoader *dl, uint64_t epoch, uint64_t index) {
    if (!dl || !dl->shard.tokens) return mn_error(MN_ERR_ARG, "loader_set_position: NULL or closed loader");
    if (index >= dl->n_seq)
        return mn_error(MN_ERR_ARG, "%s: position index %" PRIu64 " out of range: %" PRIu64 " sequences of T = %d",
                        dl->path, index, dl->n_seq, dl->T);
    int new_epoch = epoch != dl->epoch;
    dl->epoch = epoch;
    dl->index = index;
    if (dl->shuffle && new_epoch) build_perm(dl);
    return MN_OK;
}

uint64_t loader_num_sequences(const DataLoader *dl) { return dl->n_seq; }

void loader_close(DataLoader *dl) {
    if (!dl) return;
    free(dl->path);
    shard_free(&dl->shard);
    mn_free(dl->perm);
    memset(dl, 0, sizeof *dl);
}
