/*
 * The sLSTM core's CUDA files share this: slstm_cuda.cu (the host side, the single-block kernels
 * for GPUs before Hopper, the backward's products) and slstm_cluster.cu (the Hopper kernels, a head
 * over a cluster of blocks).
 */
#ifndef MN_SLSTM_CUDA_CUH
#define MN_SLSTM_CUDA_CUH

#include "cuda_common.cuh"
#include "mma.cuh"

#define SL_NB 8  // sequences a block (the products' N)

static __device__ __forceinline__ float sl_logsigmoid(float x) { return fminf(x, 0.0f) - __logf(1.0f + __expf(-fabsf(x))); }

typedef struct {
    const bf16 *x;
    const uint4 *frag;
    const float *s0;
    bf16 *h;
    float *cache, *sT;
    int B, T, H, Dh;
} SlcFwd;

typedef struct {
    const float *G, *cache;  // G [B,T,H,4,Dh]: the gate pre-activations, x included
    const uint4 *frag;
    const bf16 *dh;
    bf16 *dx, *dG;           // dx [B,T,4,D]; dG [B,T,H,4,Dh]
    int B, T, H, Dh;
    float clip;
} SlcBwd;

// The Hopper path (slstm_cluster.cu): fragments of R a call needs (uint4 elements of scratch), the
// forward (fragments made into frag, then the walk), and the backward's walk (from G, the cache and
// dh: dx and dG).
size_t slc_frag_count(int H, int Dh);
int slc_forward(CudaCtx *c, uint4 *frag, const SlstmDims *d, const SlstmFwd *io);
int slc_backward_walk(CudaCtx *c, uint4 *frag, const SlstmDims *d, const float *R, const float *G, const float *cache,
                      const bf16 *dh, bf16 *dx, bf16 *dG);

#endif
