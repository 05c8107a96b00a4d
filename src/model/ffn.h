/*
 * The second half of a block: x' = u + FFN(RMSNorm(u)), the feed-forward part the block's mixer
 * declares (MixerOps.block):
 *
 *   FFN_SWIGLU  W_down (SiLU(W_gate v) (.) W_up v)
 *   FFN_GEGLU   W_down (GELU(W_gate v + b_gate) (.) (W_up v + b_up)) + b_down   (biases with ffn_bias)
 *   FFN_GEGLU_TANH  the same with GELU's tanh approximation (gelu_pytorch_tanh: RecurrentGemma's MLP)
 *   FFN_NONE    nothing: x' = u
 *
 * Tensors (prefix "model.layers.N."): mlp_norm.weight [D] (Llama's post_attention_layernorm),
 * mlp.gate_proj.weight [F, D], mlp.up_proj.weight [F, D], mlp.down_proj.weight [D, F], and with
 * biases mlp.{gate,up,down}_proj.bias.
 */
#ifndef MN_MODEL_FFN_H
#define MN_MODEL_FFN_H

#include "core/backend.h"
#include "mixers/mixer.h"
#include "model/norm.h"

typedef struct {
    FfnKind kind;
    int bias;                                       // biases on the projections
    NormKind norm_kind;                             // its norm's (the config's)
    int F;                                          // hidden width
    int norm, gate, up, down, gate_b, up_b, down_b; // tensor indices into the model's specs (-1: none)
} Ffn;

// One block's activations kept from the forward: [N, F] MEM_ACT each, [N] MEM_F32.
typedef struct {
    void *gate, *up, *act;  // the projections and their gated product
    void *rstd;             // [NORM_STATS N] the norm's statistics
} FfnActs;

// Temporaries shared by the blocks: [N, D] MEM_ACT the normalised input and its gradient, [N, F]
// MEM_ACT (F the largest of the blocks') the gradients of act, gate and up.
typedef struct {
    void *v, *dv;
    void *dact, *dgate, *dup;
} FfnShared;

// Declares the block's feed-forward tensors after its mixer's (none with FFN_NONE); names as
// fla's, or Llama's norm under the llama architecture.
int ffn_declare(const ModelConfig *c, const BlockShape *b, const char *prefix, ParamSpec *s, int *n, int max, Ffn *f);

// The hidden width of a block of shape b: 0 without a feed-forward part.
int ffn_width(const ModelConfig *c, const BlockShape *b);

// out[N, D] = u + FFN(RMSNorm(u)) with the block's parameters p (the model's per-tensor views).
int ffn_forward(const Backend *be, const Ffn *f, void *const *p, const FfnActs *a, const FfnShared *s, const void *u,
                void *out, int N, int D, float eps);
// From dx, the gradient of out, to the gradient of u (dx += through the FFN, in place); the
// parameter gradients g accumulate.
int ffn_backward(const Backend *be, const Ffn *f, void *const *p, void *const *g, const FfnActs *a, const FfnShared *s,
                 const void *u, void *dx, int N, int D, float eps);

#endif
