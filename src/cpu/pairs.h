/*
 * The CPU cores run one (sequence, head) pair at a time: a pair's view into the [B,T,H,D]
 * tensors, and the loop that spreads the pairs over the threads, each thread with workspace of
 * its own. A pair's results do not depend on which thread ran it, nor on how many there are.
 */
#ifndef MN_CPU_PAIRS_H
#define MN_CPU_PAIRS_H

#include <stddef.h>

#include "mesanet.h"

// Strided views of one (sequence, head) pair inside [B,T,H,D] tensors.
typedef struct {
    int T, H, Dk, Dv, C;
    size_t tok0;  // index of token 0 of this pair in [B,T,H] units: b*T*H + h
    int h;
} SeqPair;

static inline size_t pair_tok(const SeqPair *p, int t) { return p->tok0 + (size_t)t * p->H; }

// One pair's work: pair bh = b H + h, `work` the running thread's floats.
typedef void (*PairFn)(void *ctx, const SeqPair *p, int bh, float *work);

// Runs fn over every pair of d (chunk size C), on up to B H threads, each with `per` floats of
// workspace; `extra` floats more follow the threads' (*extra_out, zeroed, where not NULL).
// MN_ERR_NOMEM where the workspace cannot be had.
int cpu_for_pairs(const MnSeqDims *d, int C, size_t per, size_t extra, float **extra_out, PairFn fn, void *ctx);

#endif
