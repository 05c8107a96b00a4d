/*
 * The float32 CPU Mesa core, in its two forms. Both process one (sequence,
 * head) pair per call; mesa.c validates arguments, picks the form and runs the
 * pairs in parallel. `bh` = b * H + h indexes the pair.
 */
#ifndef MN_MESA_CPU_H
#define MN_MESA_CPU_H

#include <stddef.h>

#include "mesanet.h"

// Strided views of one (sequence, head) pair inside [B,T,H,D] tensors.
typedef struct {
    int T, H, Dk, Dv, C;
    size_t tok0;  // index of token 0 of this pair in [B,T,H] units: b*T*H + h
    int h;
} MesaPair;

static inline size_t pair_tok(const MesaPair *p, int t) { return p->tok0 + (size_t)t * p->H; }

size_t mesa_chunk_fwd_floats(const MnMesaDims *d, int C);
size_t mesa_chunk_bwd_floats(const MnMesaDims *d, int C);
void mesa_chunk_forward(const MesaPair *p, const MnSolver *s, const MnMesaFwd *io, int bh, float *work);
void mesa_chunk_backward(const MesaPair *p, const MnSolver *s, const MnMesaBwd *io, int bh, float *work,
                         float *dlambda_part);

size_t mesa_rec_fwd_floats(const MnMesaDims *d);
size_t mesa_rec_bwd_floats(const MnMesaDims *d, int C);
void mesa_rec_forward(const MesaPair *p, const MnSolver *s, const MnMesaFwd *io, int bh, float *work);
void mesa_rec_backward(const MesaPair *p, const MnSolver *s, const MnMesaBwd *io, int bh, float *work,
                       float *dlambda_part);

#endif
