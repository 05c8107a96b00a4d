/*
 * A model's architecture (ModelConfig) and the declaration of its parameter
 * tensors (ParamSpec): the types the mixers and the model both read. They sit
 * here, below both, so that the mixers see the config without the model; the
 * functions that fill, read, write and check configs are model/config.h's.
 *
 * The architecture families: "paper", the MesaNet paper's backbone (embedding
 * scaled by sqrt(D), tied head, logits soft cap 30, forget-gate bound); "fla",
 * which matches fla's MesaNetForCausalLM exactly so that checkpoints move
 * between the two (no scale, no cap, untied head, SwiGLU width 8/3 D rounded up
 * to 256, no bound, one o_norm weight shared by all heads); "llama", Hugging
 * Face's LlamaForCausalLM (or MistralForCausalLM) with its tensor names; "xlstm",
 * its xLSTMForCausalLM; "recurrent_gemma", its RecurrentGemmaForCausalLM (Griffin).
 */
#ifndef MN_MODEL_CONFIG_H
#define MN_MODEL_CONFIG_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    char mixer[256];      // the blocks' sequence mixers: a name ("mesa", "mamba2", "gla", "deltanet", "gdn", "mha",
                          // "swa", "mlstm", ...) or a pattern repeated over the blocks ("gdn,mesa": block i gets
                          // the (i mod 2)-th; "name*N" stands for N of them: "mlstm-block*7,slstm-block")
    char arch[16];        // "paper", "fla", "llama", "xlstm" or "recurrent_gemma" (the tensor names and config.json
                          // of model/names.h)
    int vocab_size;       // V
    int dim;              // D, the residual stream width
    int n_layers;         // blocks
    int n_heads;          // H
    int head_dim;         // Dk = Dv per head
    int head_v_dim;       // Dv per head where it differs from Dk (fla's expand_v; gdn-paper, deltanet-paper only);
                          // 0: head_dim
    int mlp_hidden;       // SwiGLU hidden width F
    int conv_size;        // short convolution width on q and k (4)
    float norm_eps;       // RMSNorm epsilon
    float logit_cap;      // soft cap c of the logits, c tanh(z / c); 0: none
    int embed_scale;      // 1: the embedding output is multiplied by sqrt(D)
    int tie_embeddings;   // 1: the output head is the embedding matrix
    int shared_onorm;     // 1: one o_norm weight [Dk] for all heads (fla); 0: one per head
    int output_gate;      // 1: y = W_o (RMSNorm(o) (.) SiLU(W_g u))
    float lambda_min;     // lower bound of lambda = softplus(p) + lambda_min
    float lambda_init;    // initial lambda
    float gate_bound;     // h_max of the forget-gate bound (0: none)
    int seq_len;          // training context length (at least 2; the forget-gate bound follows it)
    float resid_scale;    // the variance of W_o and W_down is divided by n_layers^resid_scale
    int cg_steps;         // CG steps in training (30)
    int neg_eigen;        // 1: beta = 2 sigmoid(.) in (0, 2) in the delta rules (deltanet, gdn): negative
                          // eigenvalues of the state transition, for state tracking
    float rope_theta;     // the attention mixers' (mha, swa) RoPE base (10000)
    int rope_dim;         // the features of each attention head that RoPE rotates, its first (0: all head_dim;
                          // head_dim / 2: RecurrentGemma's partial rotary)
    int o_bias;           // 1: the attention mixers' output projection has a bias (RecurrentGemma's o_proj)
    int window;           // swa's window: each token attends to the last `window` tokens, itself included (1024)
    int n_kv_heads;       // the attention mixers' key/value heads (grouped-query attention); 0: n_heads
    int slstm_heads;      // slstm-block's heads (4): dim / slstm_heads cells each
    float gate_cap;       // mlstm-large's soft cap of its gates' pre-activations, c tanh(x / c) (0: none)
    int lru_width;        // hawk's recurrence width (transformers' RecurrentGemma lru_width), n_heads blocks of its
                          // gates; 0: dim
    int d_state;          // longhorn's state slots per channel (16)
    int expand;           // longhorn's inner width over dim (2)
    char norm[12];        // the backbone's norms: "rmsnorm" (RMSNorm with a weight) or "layernorm" (LayerNorm with a
                          // weight, no bias: the xLSTM paper's blocks)
    char head[16];        // "lm" (the language model's logits at every position; "" reads as "lm") or
                          // "autoencoder" (MAD's AutoEncoder: every position decoded from the last position's
                          // state, model/autoencoder.c; untied, no logit cap, dim >= 4)
} ModelConfig;

// The most blocks a config may have: every tensor of such a model fits the model's table of
// MODEL_MAX_PARAMS (model.h checks it), so validation refuses more up front.
enum { CONFIG_MAX_LAYERS = 200 };

typedef enum {
    INIT_NORMAL,       // N(0, init_value^2)
    INIT_CONST,        // init_value everywhere
    INIT_FORGET_BIAS,  // per-head forget-gate biases: gamma = sigmoid(bias) spread over heads from 0.9 to 0.999
    INIT_A_LOG,        // fla's (Mamba2's) A_log: log U(0, 16), drawn per element
    INIT_DT_BIAS,      // fla's dt_bias: softplus^-1(dt), dt log-uniform in [1e-3, 1e-1] (floor 1e-4), drawn per element
    INIT_LINSPACE_3_6, // from 3 to 6 evenly over the elements (xLSTM's mLSTM forget-gate biases)
    INIT_SLSTM_BIAS,   // an sLSTM's biases [4, H, Dh], gates i, f, z, o: 0 but the forget gate's, NX-AI's
                       // "powerlaw_blockdependent": 5 - 12 (j / (Dh - 1))^(0.3 + 1.3 l / (L - 1)) for cell j of
                       // block l of L
    INIT_RGLRU_LAMBDA, // RG-LRU's Lambda (transformers' RecurrentGemma): log(1 / a - 1), a = sqrt(U(0.81, 0.998)),
                       // drawn per element (softplus(Lambda) = -log a: a^8 at r = 1, from 0.43 to 0.99)
} InitKind;

// What a tensor is for, for counting parameters by part (info) and for the matched presets.
typedef enum {
    ROLE_EMBED,  // the token embedding (and a head tied to it)
    ROLE_MIXER,  // a block's sequence mixer
    ROLE_FFN,    // a block's feed-forward projections
    ROLE_NORM,   // the blocks' and the final norms
    ROLE_HEAD,   // the output head (untied), or the autoencoder head's decoder
    ROLE_COUNT
} ParamRole;

// One parameter tensor: its checkpoint name, shape, initialisation and
// whether weight decay applies. `offset` (elements) places it in the model's
// parameter slab.
typedef struct {
    char name[96];
    int ndim;
    int64_t shape[4];
    size_t numel;
    InitKind init;
    double init_value;  // INIT_NORMAL: standard deviation; INIT_CONST: the value
    int decay;
    float file_offset;  // the checkpoint file holds the value minus this (RecurrentGemma's norms store w of their
                        // gain 1 + w: 1; 0 elsewhere), so that the model computes with the gain itself
    int file_transpose; // 1: the file holds each matrix of the last two (equal) dimensions transposed (the RG-LRU's
                        // gate blocks, which transformers multiplies from the right)
    ParamRole role;  // set by the model as it declares the tensors
    int block;       // the block it belongs to; -1: the backbone's (embedding, final norm, head)
    size_t offset;
} ParamSpec;

// Appends a spec to list (with room for `max`), returning its index or -1 if full.
int param_add(ParamSpec *list, int *n, int max, const char *name, int ndim, const int64_t *shape, InitKind init,
              double value, int decay);

#endif
