/*
 * The Mesa kernels of mesa_cuda.cu built for head sizes up to 64, where the head-size-128 build
 * runs one block per multiprocessor with half its tile idle: two column groups of warps (8 warps a
 * block; four groups, at half the registers a thread, spill) and two blocks per multiprocessor.
 * mesa_cuda.cu's entry points hand such problems (more than one token, both head sizes padded to
 * at most 64) to this build's cuda_mesa_fwd_d64 / cuda_mesa_bwd_d64 (docs/cuda.md: the gain).
 */
#define MAXD 64
#define NCG 2
#define MESA_NAME(f) f##_d64
#include "mesa_cuda.cu"
