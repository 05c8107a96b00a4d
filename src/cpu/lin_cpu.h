/*
 * The float32 CPU cores of the gated linear-attention family (GLA / Mamba2,
 * DeltaNet / Gated DeltaNet; include/mesanet.h), in two forms. Each call
 * processes one (sequence, head) pair; lin.c validates the arguments, picks
 * the form and runs the pairs in parallel. `bh` = b * H + h indexes the pair,
 * whose strided view is the Mesa core's SeqPair (mesa_cpu.h).
 */
#ifndef MN_LIN_CPU_H
#define MN_LIN_CPU_H

#include <stddef.h>

#include "mesa_cpu.h"
#include "mesanet.h"

// Floats of per-thread scratch each form needs (C: the chunk size; the
// recurrent backward keeps a state every C tokens and recomputes the rest).
size_t lin_rec_fwd_floats(const MnSeqDims *d);
size_t lin_rec_bwd_floats(const MnSeqDims *d, int C);
void lin_rec_forward(const SeqPair *p, const MnLinOpts *o, const MnLinFwd *io, int bh, float *work);
void lin_rec_backward(const SeqPair *p, const MnLinOpts *o, const MnLinBwd *io, int bh, float *work);

size_t lin_chunk_fwd_floats(const MnSeqDims *d, int C);
size_t lin_chunk_bwd_floats(const MnSeqDims *d, int C);
void lin_chunk_forward(const SeqPair *p, const MnLinOpts *o, const MnLinFwd *io, int bh, float *work);
void lin_chunk_backward(const SeqPair *p, const MnLinOpts *o, const MnLinBwd *io, int bh, float *work);

// The pair's entry state: s0's block, or zero.
static inline void lin_load_state(float *s, const float *s0, int bh, int dk, int dv) {
    size_t ss = (size_t)dk * dv;
    if (s0) memcpy(s, s0 + bh * ss, sizeof(float) * ss); else memset(s, 0, sizeof(float) * ss);
}

#endif
