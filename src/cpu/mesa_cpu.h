/*
 * The float32 CPU Mesa core, in its two forms. Both process one (sequence,
 * head) pair per call; mesa.c validates arguments, picks the form and runs the
 * pairs in parallel. `bh` = b * H + h indexes the pair.
 */
#ifndef MN_MESA_CPU_H
#define MN_MESA_CPU_H

#include <stddef.h>
#include <string.h>

#include "mesanet.h"
#include "pairs.h"


// The states entering the sequence of pair bh: the given ones, or zero.
static inline void mesa_load_states(float *h, float *g, const float *h0, const float *g0, int bh, int dk, int dv) {
    size_t hh = (size_t)dk * dk, gg = (size_t)dv * dk;
    if (h0) memcpy(h, h0 + bh * hh, sizeof(float) * hh); else memset(h, 0, sizeof(float) * hh);
    if (g0) memcpy(g, g0 + bh * gg, sizeof(float) * gg); else memset(g, 0, sizeof(float) * gg);
}

// Jacobi preconditioning or a Jacobi initial guess needs diag(H_t + Lambda).
static inline int mesa_needs_diagonal(const MnSolver *s) {
    return s->precond == MN_PRECOND_JACOBI || s->init == MN_CG_INIT_JACOBI;
}

size_t mesa_chunk_fwd_floats(const MnSeqDims *d, int C);
size_t mesa_chunk_bwd_floats(const MnSeqDims *d, int C);
void mesa_chunk_forward(const SeqPair *p, const MnSolver *s, const MnMesaFwd *io, int bh, float *work);
void mesa_chunk_backward(const SeqPair *p, const MnSolver *s, const MnMesaBwd *io, int bh, float *work,
                         float *dlambda_part);

size_t mesa_rec_fwd_floats(const MnSeqDims *d);
size_t mesa_rec_bwd_floats(const MnSeqDims *d, int C);
void mesa_rec_forward(const SeqPair *p, const MnSolver *s, const MnMesaFwd *io, int bh, float *work);
void mesa_rec_backward(const SeqPair *p, const MnSolver *s, const MnMesaBwd *io, int bh, float *work,
                       float *dlambda_part);

#endif
