/*
 * The sLSTM core's float32 CPU form (core/backend.h's SlstmOps; slstm.c): sequential over
 * time, the heads in parallel, each step's recurrent product one BLAS call per head.
 */
#ifndef MN_SLSTM_CPU_H
#define MN_SLSTM_CPU_H

#include "core/backend.h"

int cpu_slstm_fwd(const Backend *be, const SlstmDims *d, const SlstmFwd *io);
int cpu_slstm_bwd(const Backend *be, const SlstmDims *d, const SlstmBwd *io);
extern const SlstmOps cpu_slstm;  // supports NULL: every shape

#endif
