/*
 * Softmax attention through cuDNN's fused flash attention (attn_cudnn.cu), in front of the
 * backend's own kernels (attn_cuda.cu). C declarations, for the backend and the GPU tests.
 */
#ifndef MN_ATTN_CUDNN_H
#define MN_ATTN_CUDNN_H

#include "core/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

// What cuda_attn_fwd_cudnn / cuda_attn_bwd_cudnn return when the caller is to run its own kernel
// (no cuDNN in this build, MESANET_ATTN=own, or cuDNN refused the shape); otherwise MN_OK (cuDNN
// ran the op) or an error status with its message.
#define ATTN_CUDNN_DECLINED (-1)

int cuda_attn_fwd_cudnn(const Backend *be, const AttnDims *d, const AttnFwd *io);
int cuda_attn_bwd_cudnn(const Backend *be, const AttnDims *d, const AttnBwd *io);

// "cudnn" or "own": the path the calling thread's last attn_fwd / attn_bwd took ("none" before any).
const char *cuda_attn_path(void);
// cudnnGetVersion() of the library loaded (e.g. 91900 for 9.19.0); 0 in builds without cuDNN.
int cuda_attn_cudnn_version(void);

#ifdef __cplusplus
}
#endif

#endif
