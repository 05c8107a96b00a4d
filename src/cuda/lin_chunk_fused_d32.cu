/*
 * The fused path of lin_chunk_fused*.cu built for head sizes up to 32 (the MAD model's, a width of
 * 128 in 4 heads): the same kernels with tiles of row stride 40 instead of 136. The build for 128
 * asks for shared memory by the largest head size (lf_utb 160 KB: one block of 4 warps a
 * multiprocessor); this one for 32 (lf_utb 59 KB, lf_dqk 38 KB, the walks 36 KB), so that several
 * blocks, of one run or of runs side by side (synth --parallel), share a multiprocessor.
 * lin_chunk.cu hands it the calls whose Dk and Dv are at most 32.
 */
#define LF_KMAX 32
#define lf_use lf_use_d32
#define lf_forward lf_forward_d32
#define lf_backward_gla lf_backward_gla_d32
#define lf_backward_delta lf_backward_delta_d32
#define lf_walk lf_walk_d32
#define lf_dqk_kernel lf_dqk_kernel_d32
#define lf_dqk_delta_kernel lf_dqk_delta_kernel_d32
#define lf_utb_kernel lf_utb_kernel_d32
#define lf_gates_bwd_kernel lf_gates_bwd_kernel_d32
#include "lin_chunk_fused.cu"
#include "lin_chunk_fused_walk.cu"
#include "lin_chunk_fused_bwd.cu"

const size_t lf_walk_smem_d32 = LF_WALK_SMEM, lf_bwd_delta_smem_d32 = LF_BWD_DELTA_SMEM;
