// Argument checks shared by every implementation of the sequence-mixer cores (include/mesanet.h).
#ifndef MN_SEQ_ARGS_H
#define MN_SEQ_ARGS_H

#include "mesanet.h"

// MN_ERR_ARG with a message naming the field unless all sizes are positive
// and the products fit the index type.
int seq_check_dims(const MnSeqDims *d);
int seq_check_solver(const MnSolver *s);
// MN_ERR_ARG naming `what` unless groups of n sequences split B evenly (n = 0: one group of all).
int seq_check_groups(const MnSeqDims *d, int n, const char *what);
// The linear-attention cores' options and io: MN_ERR_ARG naming fn and what is wrong.
int lin_check_args(const char *fn, const MnSeqDims *d, const MnLinOpts *o, const void *io);

#endif
