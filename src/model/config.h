/*
 * A model's architecture (ModelConfig) and the declaration of its parameter
 * tensors (ParamSpec), shared by the backbone and the mixers.
 *
 * Configs are JSON files or named presets (config.c). Two architecture
 * families: "paper", the MesaNet paper's backbone (embedding scaled by
 * sqrt(D), tied head, logits soft cap 30, forget-gate bound), and "fla", which
 * matches fla's MesaNetForCausalLM exactly so that checkpoints move between the
 * two (no scale, no cap, untied head, SwiGLU width 8/3 D rounded up to 256, no
 * bound, one o_norm weight shared by all heads).
 */
#ifndef MN_CONFIG_H
#define MN_CONFIG_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    char mixer[64];       // the blocks' sequence mixers: a name ("mesa", "mamba2", "gla", "deltanet", "gdn", "mha",
                          // "swa", ...) or a
                          // pattern repeated over the blocks ("gdn,mesa": block i gets the (i mod 2)-th)
    char arch[8];         // "paper" or "fla"
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
    int window;           // swa's window: each token attends to the last `window` tokens, itself included (1024)
    int n_kv_heads;       // the attention mixers' key/value heads (grouped-query attention); 0: n_heads
    char head[16];        // "lm" (the language model's logits at every position; "" reads as "lm") or
                          // "autoencoder" (MAD's AutoEncoder: every position decoded from the last position's
                          // state, model/autoencoder.c; untied, no logit cap, dim >= 4)
} ModelConfig;

// The most blocks a config may have: every tensor of such a model fits the model's table of
// MODEL_MAX_PARAMS (model.h checks it), so validation refuses more up front.
enum { CONFIG_MAX_LAYERS = 200 };

// Fills the defaults of the "paper" architecture for the given sizes.
void config_default(ModelConfig *c);
// A named preset ("tiny", "demo", "125m", "400m", "1b", "fla-162m", "fla-412m"), a parameter-matched
// preset "SIZE-MIXER" (below), or MN_ERR_ARG listing the accepted forms.
int config_preset(ModelConfig *c, const char *name);

// Parameter-matched presets, for comparisons one to one at equal size as the MesaNet paper's:
// "SIZE-MIXER" with SIZE one of config_matched_sizes (demo, 125m, 400m) and MIXER one mixer name
// (mesa, mamba2, gla, deltanet, gdn, gdn-paper, deltanet-paper, mha, swa), e.g. "125m-gdn", "demo-gla",
// "400m-gdn-paper"; usable wherever a preset is (--config 125m-gdn, {"preset": "125m-gdn"}).
// It is the SIZE preset's backbone (width, depth, heads, vocabulary, norms) with every block's mixer
// replaced (gdn-paper with its own output gate, output_gate = 1, as fla's GatedDeltaNet), and one
// knob moved: mlp_hidden, in steps of CONFIG_MATCH_STEP, to the value whose total parameter count
// is nearest that of the Mesa model of that size (SIZE itself; "SIZE-mesa" is SIZE). The count
// is affine in mlp_hidden (3 D n_layers parameters per unit: SwiGLU's gate, up and down), so the
// matched count is within half a step, 3 D n_layers CONFIG_MATCH_STEP / 2 parameters, of Mesa's
// (125m: 442,368, 0.34%). Counts with vocab_size 0 (demo: from the data) use 4096, as `info` shows.
enum { CONFIG_MATCH_STEP = 32 };
extern const char *const config_matched_sizes[];  // NULL-terminated
// The matched preset of `mixer` at `size` into c, or MN_ERR_ARG (an unknown size or mixer).
int config_matched(ModelConfig *c, const char *size, const char *mixer);
// Parameters of a valid config: all, in the mixers, in the feed-forward parts (by the tensors'
// roles); any may be NULL. vocab_size 0 is counted as 4096.
int config_param_count(const ModelConfig *c, size_t *total, size_t *mixers, size_t *mlps);
// The fields beyond the backbone's that the config's mixers read, with their values, for `info`
// ("rope_theta 10000, window 128"; "" when none).
void config_mixer_fields(const ModelConfig *c, char *out, size_t n);
// The accepted config names, for --help texts.
#define CONFIG_NAMES_HELP                                                                          \
    "a preset (tiny, demo, 125m, 400m, 1b, fla-162m, fla-412m), a parameter-matched preset SIZE-MIXER " \
    "(SIZE demo, 125m or 400m; MIXER mesa, mamba2, gla, deltanet, gdn, gdn-paper, deltanet-paper, mha, swa; "   \
    "e.g. 125m-gdn: SIZE's backbone with that mixer, MLP width set to match Mesa's parameter count), "  \
    "or a JSON file"
// Reads a JSON config (ours, or a Hugging Face config.json of fla's MesaNet, GatedDeltaNet or DeltaNet; unknown keys and
// impossible values are refused, naming the file and key, every number range-checked before it
// is converted), or, if nothing exists at `spec`, a preset name. A directory or another kind of
// file is refused saying so.
int config_load(ModelConfig *c, const char *spec);
// Writes config.json atomically; refuses an invalid config, so that every saved config loads
// again with the same value in every field. Its Hugging Face part is fla's MesaNet's, or, for the
// fla architecture with every block gdn-paper (deltanet-paper), fla's GatedDeltaNet's (DeltaNet's).
int config_save(const ModelConfig *c, const char *path);
// Resets the fields that no block's mixer reads (the mixers' MixerOps.fields) to their defaults:
// presets, readers and model_create call it, so that a config holds only what its model reads
// (config_save leaves those fields out; config_validate refuses the switches turned on there:
// neg_eigen, head_v_dim, n_kv_heads, output_gate).
void config_normalize(ModelConfig *c);
// MN_ERR_ARG with a message naming the field, its value and the valid range unless every field is
// in range (floats finite) and the sizes are consistent.
int config_validate(const ModelConfig *c, const char *where);
// 0 when every field of a and b that either model reads is equal; otherwise 1 and, in out, the
// first field that differs with both values ("dim: 32 vs 192").
int config_diff(const ModelConfig *a, const ModelConfig *b, char *out, size_t n);

typedef enum {
    INIT_NORMAL,       // N(0, init_value^2)
    INIT_CONST,        // init_value everywhere
    INIT_FORGET_BIAS,  // per-head forget-gate biases: gamma = sigmoid(bias) spread over heads from 0.9 to 0.999
    INIT_A_LOG,        // fla's (Mamba2's) A_log: log U(0, 16), drawn per element
    INIT_DT_BIAS,      // fla's dt_bias: softplus^-1(dt), dt log-uniform in [1e-3, 1e-1] (floor 1e-4), drawn per element
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
    ParamRole role;  // set by the model as it declares the tensors
    int block;       // the block it belongs to; -1: the backbone's (embedding, final norm, head)
    size_t offset;
} ParamSpec;

// Appends a spec to list (with room for `max`), returning its index or -1 if full.
int param_add(ParamSpec *list, int *n, int max, const char *name, int ndim, const int64_t *shape, InitKind init,
              double value, int decay);

#endif
