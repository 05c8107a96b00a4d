/*
 * The Mesa kernels of mesa_cuda.cu built for head sizes up to 64: tiles half as wide, so the
 * chunk kernels fit 64 registers a thread and run two blocks per multiprocessor, where the
 * head-size-128 build runs one block with half its tile idle. mesa_cuda.cu's entry points hand
 * such problems (more than one token, both head sizes padded to at most 64) to this build's
 * cuda_mesa_fwd_d64 / cuda_mesa_bwd_d64. At 16 x 2048 x 8 x 64 on an H100: forward+backward 4.52
 * -> 3.45 ms (docs/cuda.md).
 */
#define MAXD 64
#define NCG 2
#define MESA_NAME(f) f##_d64
#include "mesa_cuda.cu"
