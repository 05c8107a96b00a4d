/*
 * The sequence-mixer interface. A mixer maps the block input u [B*T, D]
 * (already RMS-normalised) to y [B*T, D]. It declares its parameters, runs
 * forward (saving what its backward needs), backward (accumulating its
 * parameter gradients) and, for generation, keeps a fixed-size recurrent state
 * per sequence. Mixers are written against the backend op table, so one file
 * serves every backend. A config's blocks may mix mixers (mixer_at: a pattern
 * such as "gdn,mesa" repeated over the blocks).
 *
 * The block around a mixer is data, not code: MixerOps.block says what follows
 * the mixer (model/ffn.h: a SwiGLU or GELU-gated MLP, or nothing, as in the
 * blocks that up-project inside the mixer), and the model runs
 *     u = x + Mixer(RMSNorm(x));   x' = u + FFN(RMSNorm(u))   (x' = u without FFN)
 *
 * Adding a mixer:
 *   1. src/mixers/NAME.c: its MixerOps (declare, create, forward, backward, decoding state,
 *      `fields` it reads from the config, `validate`, `activation_bytes`, the block shape);
 *      a layer of the MesaNet paper's shared parameterisation builds on shell.h.
 *   2. Its core ops, where it needs new ones: a family sub-table of the backend op table
 *      (core/backend.h), with the float64 reference in src/ref/, the CPU in src/cpu/ and,
 *      optionally, CUDA in src/cuda/; a backend without them refuses the mixer by name.
 *   3. One line in mixer_all (mixer.c) and its `extern` below.
 *   4. Registered, it is a case of the conformance battery (tests/test_conformance.c; on the GPU
 *      tests/cuda/test_cuda_conformance.c), which puts it through the checks every mixer passes;
 *      rows in the battery's table (tests/mixer_case.c) for the variants of its settings that
 *      matter, and, for a new family of cores, that family in mc_families there. Its own tests
 *      only for what is specific to it.
 */
#ifndef MN_MIXER_H
#define MN_MIXER_H

#include "core/backend.h"
#include "core/model_config.h"

typedef struct Mixer Mixer;

// Buffers the model's mixers share: temporaries of one forward or backward call. A layer's are
// dead once its call returns and layers run one at a time, so the model holds one set, not one
// per layer (for fla-162m at 8 x 2048 tokens, 250 MB a layer).
typedef struct {
    void *p;
    size_t n;  // MEM_ACT elements
} MixerScratch;

// The config fields a mixer reads beyond the backbone's (MixerOps.fields, a mask): a field that
// no block's mixer reads must keep its default (config.c: refused when given, reset otherwise).
enum {
    CF_CONV = 1 << 0,         // conv_size: the short convolutions
    CF_OUTPUT_GATE = 1 << 1,  // output_gate
    CF_ONORM = 1 << 2,        // shared_onorm: the output norm's weight shared by the heads
    CF_HEAD_V_DIM = 1 << 3,   // head_v_dim: value heads wider than the key heads
    CF_RIDGE = 1 << 4,        // lambda_min, lambda_init, cg_steps: Mesa's regulariser and solver
    CF_GATE_BOUND = 1 << 5,   // gate_bound: the forget-gate bound
    CF_NEG_EIGEN = 1 << 6,    // neg_eigen: a delta rule's beta in (0, 2)
    CF_ROPE = 1 << 7,         // rope_theta, rope_dim
    CF_WINDOW = 1 << 8,       // window: sliding-window attention
    CF_KV_HEADS = 1 << 9,     // n_kv_heads: grouped key/value heads
    CF_FFN = 1 << 10,         // mlp_hidden: set for a mixer whose block's feed-forward part takes that width
    CF_SLSTM = 1 << 11,       // slstm_heads
    CF_GATE_CAP = 1 << 12,    // gate_cap: mlstm-large's soft cap of its gates
    CF_D_STATE = 1 << 13,     // d_state: a selective scan's state slots per channel (longhorn)
    CF_EXPAND = 1 << 14,      // expand: a Mamba-style block's inner width over dim (longhorn)
    CF_LRU = 1 << 15,         // lru_width: hawk's recurrence width
    CF_O_BIAS = 1 << 16,      // o_bias: the attention output projection's bias (RecurrentGemma's)
};

// What follows the mixer in its block (model/ffn.c).
typedef enum {
    FFN_SWIGLU,  // W_down (SiLU(W_gate v) (.) W_up v): the default (0)
    FFN_GEGLU,   // W_down (GELU(W_gate v + b_gate) (.) (W_up v + b_up)) + b_down (biases with ffn_bias)
    FFN_GEGLU_TANH,  // the same with GELU's tanh approximation (Griffin's, RecurrentGemma's MLP)
    FFN_NONE,    // nothing: the block is the mixer and its residual
} FfnKind;

// A block that up-projects inside its mixer (xLSTM's mLSTM block, Longhorn's Mamba block) has
// FFN_NONE; one with an MLP after its mixer (the sLSTM block: GELU-gated, 4/3 D) names its kind
// and width. Both norms are RMSNorm with a weight w; a block whose norms differ (Griffin's 1 + w)
// adds the kind here, with the op that computes it.
typedef struct {
    FfnKind ffn;
    int ffn_bias;                             // 1: biases on the feed-forward projections
    int (*ffn_hidden)(const ModelConfig *c);  // its width; NULL: the config's mlp_hidden
} BlockShape;

typedef struct {
    const char *name;
    const char *about;        // one line: what the layer computes
    const char *state_about;  // one line: what its decoding state holds
    int no_graph;             // 1: its decoding step passes host values (positions, cache slot and length)
                              // to the backend, which a recorded step (graph_begin) would freeze
    int uses_cg;              // 1: solves with CG (the solver's options and step counts concern it)
    unsigned fields;          // the config fields it reads beyond the backbone's (CF_*)
    BlockShape block;         // what follows it in its block
    // Appends this layer's parameter specs, names prefixed by `prefix` (e.g. "model.layers.3.").
    int (*declare)(const ModelConfig *c, const char *prefix, ParamSpec *out, int *n, int max);
    // MN_ERR_ARG naming the field unless the config's values suit this mixer (after the generic
    // range checks of config_validate, before anything is made). NULL: nothing beyond those.
    int (*validate)(const ModelConfig *c, const char *where);
    // Sets, in a preset made for this mixer (config_matched), what it needs beyond the size's
    // backbone (gdn-paper's output gate, swa's window). NULL: nothing.
    void (*preset)(ModelConfig *c);
    // Bytes of its activation buffers per token (kept from the forward for the backward), and
    // MEM_ACT elements per token of the model's shared scratch it uses: the model's memory
    // estimate adds the first over the blocks and takes the largest of the second.
    size_t (*activation_bytes)(const ModelConfig *c, const Backend *be);
    size_t (*scratch_elems)(const ModelConfig *c);
    // Allocates the mixer's private part (m->priv); buffers come lazily with the first forward.
    int (*create)(Mixer *m);
    // y[B*T, D] = mixer(u). With use_state, starts from the recurrent state and leaves the final
    // one there (prefill and decode); otherwise starts from zero and keeps the activations for backward.
    int (*forward)(Mixer *m, void *y, const void *u, int B, int T, int use_state);
    // du (=) and the parameter gradients (+=) from dy, for the last forward without state. The
    // forward's input u may be read again: the caller makes it hold the same values (the model
    // keeps one buffer of normalised inputs for all blocks and recomputes it before each backward).
    int (*backward)(Mixer *m, void *du, const void *dy);
    // Zeroes (allocating if needed) the recurrent state of B sequences.
    int (*reset_state)(Mixer *m, int B);
    // Floats of recurrent state per sequence (the constant memory of decoding).
    size_t (*state_floats)(const ModelConfig *c);
    // Adds the statistics of the calls since the last collect (CG steps, counted where the
    // backend runs) into cg_steps and cg_systems. NULL: the mixer keeps them current itself.
    int (*collect)(Mixer *m);
    void (*destroy)(Mixer *m);
    // Floats of decoding state per sequence that grow with each token decoded (mha's key/value
    // cache: 2 n_kv_heads head_dim), beside the fixed state_floats. NULL: none.
    size_t (*state_floats_per_token)(const ModelConfig *c);
} MixerOps;

struct Mixer {
    const MixerOps *ops;
    const Backend *be;
    const ModelConfig *cfg;
    MnSolver solver;          // CG settings for the next call (training, evaluation or decoding)
    void **w, **dw;           // this layer's parameters and their gradients, in declare() order
    void *priv;               // the mixer's own buffers
    MixerScratch *scratch;    // the model's, shared by its mixers (grown with mixer_scratch_reserve)
    double cg_steps, cg_systems;  // CG steps and systems solved since the counters were zeroed
    double core_seconds;      // time in the core (e.g. the Mesa solve), for profiles
    int profile;              // nonzero: wait for the backend around timed parts, so that their times are true
};

// The time (mn_now) at a boundary of a timed part: after the backend has finished the work
// queued so far when profiling (otherwise only the launches would be timed on the GPU).
int mixer_clock(const Mixer *m, double *t);

// Runs `call` (an expression giving an MN_ status), adding its time to *seconds (mixer_clock's).
#define MIXER_TIMED(m, seconds, call)           \
    do {                                        \
        double t0_, t1_;                        \
        MN_TRY(mixer_clock((m), &t0_));         \
        MN_TRY(call);                           \
        MN_TRY(mixer_clock((m), &t1_));         \
        *(seconds) += t1_ - t0_;                \
    } while (0)

// Grows the shared scratch to at least n MEM_ACT elements (its contents are lost). Call it only
// where activations are (re)allocated: a recorded decode step holds the scratch's address.
int mixer_scratch_reserve(Mixer *m, size_t n);

// MN_ERR_UNSUPPORTED: "mixer NAME is not available on the BACKEND backend yet (why)", for a create
// whose backend lacks the mixer's core family (why: "it has no Mesa core").
int mixer_unsupported(const Mixer *m, const char *why);
// A family's supports() status for this layer's sizes, its message prefixed with the mixer and
// the backend where it refuses them.
int mixer_supports(const Mixer *m, int status);
// The layer's sizes (one sequence of one token; heads and head sizes from the config), for supports().
MnSeqDims mixer_layer_dims(const Mixer *m);

// A table of activation buffers: where each goes, its elements per token (and fixed ones besides:
// derived from parameters alone, so one set a run where the backend serves several, core/runs.h),
// its kind. Allocated for N tokens (all or none: NULL + MN_ERR_NOMEM after freeing the others),
// freed (pointers set to NULL), or counted in bytes per token (the fixed elements left out).
typedef struct {
    void **p;
    size_t per_token, fixed;
    MemKind kind;
} MixerBuf;
int mixer_bufs_alloc(const Backend *be, const MixerBuf *b, int n, size_t N);
void mixer_bufs_free(const Backend *be, const MixerBuf *b, int n);
size_t mixer_bufs_bytes(const Backend *be, const MixerBuf *b, int n);

// One tensor of a mixer's declaration table: its name after the block's prefix, shape,
// initialisation and weight decay (mixer_declare_table appends a table's tensors in order).
typedef struct {
    const char *name;
    int ndim;
    int64_t shape[4];
    InitKind init;
    double value;
    int decay;
} MixerParam;
int mixer_declare_table(const char *prefix, const MixerParam *p, int np, ParamSpec *out, int *n, int max);

// The mLSTM layers' shared core settings: q.k scaled by Dk^-1/2, NX-AI's (and transformers')
// denominator eps 1e-6, the form and chunk of the mixer's solver settings.
MlstmOpts mixer_mlstm_opts(const Mixer *m, int dk);
// MN_ERR_UNSUPPORTED naming the mixer and the backend unless the backend has the whole mLSTM core.
int mixer_need_mlstm(const Mixer *m);
// MN_ERR_ARG unless a decoding call's B matches the B its state was reset for (state_B).
int mixer_check_decode(const Mixer *m, int state_B, int B);

// A decoding state's buffers, for the mixers that hold them themselves: *p, n elements (for all the
// sequences) of one kind. mixer_state_reset (re)allocates them where *state_B != B, then zeroes
// them and sets *state_B = B; on a failed allocation every one is freed, *state_B = 0.
// mixer_state_free frees them (n is not read) and sets *state_B = 0.
typedef struct {
    void **p;
    size_t n;
    MemKind kind;
} MixerStateBuf;
int mixer_state_reset(const Backend *be, const MixerStateBuf *b, int nb, int *state_B, int B);
void mixer_state_free(const Backend *be, const MixerStateBuf *b, int nb, int *state_B);

// The mixer named `name`, or NULL with an error listing the known ones.
const MixerOps *mixer_find(const char *name);

// A config's `mixer` field is one name or a pattern of names separated by commas, repeated over
// the blocks: block i gets the (i mod n)-th of n ("gdn,mesa": GDN, Mesa, GDN, Mesa, ...); "name*k"
// stands for k of that name ("mlstm-block*7,slstm-block": xLSTM[7:1]).
// mixer_pattern_check: the number of blocks the pattern spans, or -1 with an error (an unknown or
// empty name, a bad count, more than n_layers blocks; n_layers <= 0: not checked).
int mixer_pattern_check(const char *pattern, int n_layers);
// The mixer of block `layer`, or NULL with an error (an invalid pattern).
const MixerOps *mixer_at(const ModelConfig *c, int layer);
// Every known mixer, in the registry's order (NULL-terminated).
extern const MixerOps *const mixer_all[];

extern const MixerOps mixer_mesa;
// The gated linear-attention family in the paper's parameterisation (linear.c), and Longhorn's exact
// (matrix) form on the delta rule's core.
extern const MixerOps mixer_mamba2, mixer_gla, mixer_deltanet, mixer_gdn, mixer_longhorn_exact;
// The Gated DeltaNet paper's and DeltaNet's own layers as fla has them (gdn_paper.c).
extern const MixerOps mixer_gdn_paper, mixer_deltanet_paper;
// Softmax attention with RoPE, full causal and sliding-window (attn.c).
extern const MixerOps mixer_mha, mixer_swa;
// mLSTM in the paper's parameterisation (mlstm.c).
extern const MixerOps mixer_mlstm;
// The xLSTM paper's blocks (mlstm_block.c, slstm_block.c).
extern const MixerOps mixer_mlstm_block, mixer_slstm_block;
// xLSTM-7B's mLSTM layer (mlstm_large.c), the xlstm architecture's.
extern const MixerOps mixer_mlstm_large;
// Griffin's recurrent block with the RG-LRU, transformers' RecurrentGemma's (hawk.c).
extern const MixerOps mixer_hawk;
// The Longhorn paper's Mamba-style block on the diagonal scan (longhorn.c).
extern const MixerOps mixer_longhorn;

#endif
