/*
 * The float32 CPU mLSTM core (mlstm.c; core/backend.h's MlstmOps): a recurrent form for decoding
 * and short inputs, a chunkwise form for the rest, and the gates.
 */
#ifndef MN_MLSTM_CPU_H
#define MN_MLSTM_CPU_H

#include "core/backend.h"

extern const MlstmOps cpu_mlstm;

#endif
