/*
 * The fused path of lin_chunk_fused*.cu built with one bf16 product for every product (LF_SPLIT 0:
 * fla's precision, the lo tiles neither written nor read), for heads up to 128. lin_chunk.cu hands it
 * the calls when MESANET_LIN=bf16; the split products (the default) keep about float32's accuracy in
 * the state's hand-off, this build bf16's (docs/cuda.md: the errors and times of both).
 */
#define LF_SPLIT 0
#define lf_use lf_use_bf16
#define lf_forward lf_forward_bf16
#define lf_backward_gla lf_backward_gla_bf16
#define lf_backward_delta lf_backward_delta_bf16
#define lf_walk lf_walk_bf16
#define lf_dqk_kernel lf_dqk_kernel_bf16
#define lf_dqk_delta_kernel lf_dqk_delta_kernel_bf16
#define lf_utb_kernel lf_utb_kernel_bf16
#define lf_gates_bwd_kernel lf_gates_bwd_kernel_bf16
#include "lin_chunk_fused.cu"
#include "lin_chunk_fused_walk.cu"
#include "lin_chunk_fused_bwd.cu"

const size_t lf_walk_smem_bf16 = LF_WALK_SMEM, lf_bwd_delta_smem_bf16 = LF_BWD_DELTA_SMEM;
