/*
 * The language model (docs/spec/backbone-and-training.md): token embedding (scaled
 * by sqrt(D) in the paper's architecture), N pre-norm blocks
 *     u = x + Mixer(RMSNorm(x));   x' = u + FFN(RMSNorm(u))
 * whose feed-forward part the block's mixer declares (model/ffn.h: SwiGLU by default), a final
 * RMSNorm, logits E h (tied) or W_head h, soft-capped c tanh(z / c).
 *
 * One slab holds every parameter and one every gradient (names, shapes and
 * offsets in `specs`); activations are allocated for the largest B*T seen.
 */
#ifndef MN_MODEL_H
#define MN_MODEL_H

#include "core/backend.h"
#include "core/runs.h"
#include "mixers/mixer.h"
#include "model/config.h"
#include "model/ffn.h"

// Room for the tensors of every valid config: the backbone's 3, and per block the mixer's norm,
// its tensors (at most MODEL_MIXER_MAX_PARAMS; Mesa declares 12, or 13 with the output gate; the
// linear-attention mixers 9 to 11, or one more with the gate) and the feed-forward part's 7.
enum { MODEL_MAX_PARAMS = 8192, MODEL_MIXER_MAX_PARAMS = 16 };
_Static_assert(3 + CONFIG_MAX_LAYERS * (1 + MODEL_MIXER_MAX_PARAMS + 7) <= MODEL_MAX_PARAMS,
               "config validation admits more blocks than the model's tensor table holds");

// Per-block parameter indices into specs.
typedef struct {
    int attn_norm;     // the mixer's input norm
    int first, count;  // the mixer's tensors: specs[first .. first+count)
    Ffn ffn;           // the feed-forward half (ffn.kind FFN_NONE: none)
    size_t ffn_off;    // where its activations start in gate, up, act: elements per token before it
} BlockParams;

// The autoencoder head (cfg.head "autoencoder"; model/autoencoder.c): its tensors' indices into
// specs and its activations, [N, D] MEM_ACT and [N] MEM_F32, for up to `cap` tokens.
typedef struct {
    int on;
    int norm0, w1, b1, norm1, w2, b2, norm2, wout, bout;
    void *z, *r0, *a1, *g1, *r1, *a2, *g2, *r2;  // pooled + pe, then the decoder's steps in order
    void *s0, *s1, *s2;                          // the three norms' 1/rms
    void *d;                                     // backward scratch
} AeHead;

typedef struct {
    ModelConfig cfg;
    const Backend *be;       // the backend its ops go to (with runs > 1: rb's, in front of the one given)
    int runs;                // copies trained side by side as one batch (model_create_runs; core/runs.h), >= 1
    RunsBackend *rb;         // with runs > 1: the backend that serves them, else NULL
    ParamSpec *specs;        // [nparams]
    int nparams;
    size_t count;            // number of parameters (of one run)
    size_t total;            // slab length of one run: every tensor starts at a multiple of 8 elements (the
                             // padding stays zero)
    void *params;            // [runs, total] parameters (MEM_PARAM), run r's slab at r total
    void *grads;             // [runs, total] gradients (MEM_F32)
    void **p, **g;           // per-tensor views into run 0's slabs (the others' at r total further)
    int embed, head, norm_f; // indices of the backbone tensors (head = embed when tied)
    BlockParams *blocks;     // [n_layers]
    Mixer *mixers;           // [n_layers]
    MixerScratch scratch;    // the mixers' shared temporaries
    MnSolver solver;         // CG settings for the mixers (training default: cfg.cg_steps fixed steps)

    // activations for up to `cap` tokens (N = B*T), from the last forward
    int cap, B, T;
    void *tokens, *targets;  // [N] int32
    void *x;                 // [(L+1), N, D] the residual stream entering each block, and leaving the last
    void *mid;               // [L, N, D] after the mixer's residual add
    void *n1, *n2;           // [N, D] normalised inputs of the mixer and of the FFN, of the block last
                             // computed (the backward recomputes each block's)
    void *r1, *r2;           // [L, N] f32 their 1/rms
    void *gate, *up, *act;   // [N, sum F] FFN activations, block l's from ffn_off N on
    size_t ffn_sum, ffn_max; // the blocks' FFN widths: their sum and the largest
    void *xf, *rf;           // [N, D] final norm, [N] its 1/rms
    void *logits;            // [N, V] logits (capped), or their gradient after a training forward
    void *losses;            // [N] f32 per-token losses
    void *dx, *dn, *dact, *dgate, *dup;  // backward scratch: [N,D], [N,D], [N,ffn_max] x3
    AeHead ae;               // the autoencoder head (ae.on: in place of the final norm and the logits' head)
    int state_B;             // sequences of the decoding state (0: none)
    int grad_ready;          // the last forward left dloss/dlogits for model_backward
    // Called by model_backward as gradients become final: the `n` slab elements from `grads` hold
    // this backward's last contribution (so that summing them over data-parallel ranks can run
    // while the backward goes on: train/dist.h). NULL: not called.
    int (*grads_done)(void *arg, void *grads, size_t n);
    void *grads_done_arg;
    double mixer_seconds;    // time in the mixers (forward and backward), for profiles
    int profile;             // nonzero: timed parts wait for the backend (true times, a little slower)

    // Single-token decode steps recorded once and replayed (backends with graph ops): the
    // recording holds buffer addresses and solver settings, so it is dropped when they change.
    int use_graphs;          // record decode steps where the backend can (model_create sets it)
    Recorded graph;          // the recording (core/backend.h)
    int graph_B;             // the number of sequences and the solver settings of the recording
    MnSolver graph_solver;   //   (or of the eager step that comes before it)
    // What a recorded training step (train/step.h) depends on besides its inputs: the activation
    // buffers, whose reallocations act_gen counts, and the host values the mixers write per shape
    // outside the recorded ops (attention's positions), which hold the last forward's shape.
    unsigned act_gen;
    int fwd_B, fwd_T, fwd_state;  // the last forward's sequences, tokens, and whether it decoded
} Model;

int model_create(Model **out, const ModelConfig *cfg, const Backend *be);
// `runs` copies of the model trained side by side as one batch (a sweep's runs of one architecture):
// a batch of B sequences holds the runs' B / runs each, run after run, and every run computes what
// it computes alone (core/runs.h). The optimizer and the training step take per-run learning rates,
// decays, gradient weights and sums (optim.h, step.h). runs = 1: model_create. Such a model trains
// and scores; it does not decode (model_reset_state refuses it).
int model_create_runs(Model **out, const ModelConfig *cfg, const Backend *be, int runs);
// The autoencoder head (model/autoencoder.c), for model.c: its tensors, declared after the blocks
// (ae->on set from the config); its activations for N tokens (ae_free: none); the forward from the
// residual stream leaving the last block to m->logits [N, V]; the backward from dloss/dlogits (in
// m->logits) to its gradient in m->dx [N, D]; activation bytes per token.
int ae_declare(const ModelConfig *c, ParamSpec *s, int *n, int max, AeHead *ae);
int ae_alloc(Model *m, size_t N);
void ae_free(Model *m);
int ae_forward(Model *m);
int ae_backward(Model *m);
size_t ae_activation_bytes_per_token(const ModelConfig *c, const Backend *be);
// The parameter specs of a config, without allocating the model (free(*specs) after).
int model_specs(const ModelConfig *c, ParamSpec **specs, int *n);
// Floats of decoding state per sequence, over every block's mixer (a valid config's).
size_t model_state_floats(const ModelConfig *c);
// Whether any block solves with CG (a Mesa layer): CG statistics are reported only then.
int model_uses_cg(const ModelConfig *c);
// Floats of decoding state that grow with every token (attention's key/value cache), per sequence.
size_t model_state_floats_per_token(const ModelConfig *c);
void model_free(Model *m);
// Run r of a model of several runs seen as a model of one, for what reads or writes one run's weights
// (checkpoints; a copy into a model of one): its slabs and the backend behind the runs'. Its other
// parts are the whole model's: neither train nor free it.
Model model_run_view(const Model *m, int r);
// Random initialisation of the spec (backbone-and-training.md), from a seed (every run from the same).
int model_init_params(Model *m, uint64_t seed);
// Run r from seeds[r], r < m->runs: what model_init_params(seeds[r]) gives a model of one run.
int model_init_params_runs(Model *m, const uint64_t *seeds);
// The index of the tensor named `name`, or -1.
int model_find_param(const Model *m, const char *name);

// Forward over B sequences of T tokens (host arrays). With targets (< 0: no
// loss) the per-token losses are kept and *loss (if not NULL) is their sum.
// grad_weight != 0 prepares model_backward for the gradient of
// grad_weight * sum(losses).
int model_forward(Model *m, const int32_t *tokens, const int32_t *targets, int B, int T, float grad_weight,
                  double *loss);
// Accumulates (+=) the parameter gradients of the last forward.
int model_backward(Model *m);
// A training micro-batch whose tokens are already on the backend (train/step.h), in two parts:
// model_train_begin checks the host tokens and targets of B sequences of T tokens and sizes the
// buffers for them; model_train_ops then copies tokens and targets [B*T] (MEM_I32 on the backend)
// in, runs the forward, the loss and the backward of weight[0] * sum(losses) (weight: MEM_F32 [1])
// and adds sum(losses) to loss[0] (MEM_F64): backend ops only, no host transfer or wait, so that
// they can be recorded.
int model_train_begin(Model *m, const int32_t *tokens, const int32_t *targets, int B, int T);
int model_train_ops(Model *m, const void *tokens, const void *targets, const void *weight, void *loss);
// Whether two solver settings are the same (a recording made with one serves the other).
int model_solver_same(const MnSolver *a, const MnSolver *b);
int model_zero_grad(Model *m);
// Per-token losses of the last forward, host [B*T].
int model_losses(const Model *m, float *out);

// Decoding with the recurrent state: reset for B sequences, then feed tokens
// [B*T] (T >= 1: a prefill or one step); the logits of each sequence's last
// token go to host logits [B*V].
int model_reset_state(Model *m, int B);
// A prompt too long for the activations' buffers (model_check_batch refuses B x T tokens) is
// prefilled in pieces of the longest length, halved from T, that fits; MN_ERR_NOMEM (the whole
// prompt's message) if not even one token a sequence fits.
int model_decode(Model *m, const int32_t *tokens, int B, int T, float *logits);
// model_decode's prefill in pieces of `piece` tokens (>= 1; the last may be shorter), each
// gathered from tokens [B][T] and fed through the decode path in order; logits as model_decode's.
int model_prefill_pieces(Model *m, const int32_t *tokens, int B, int T, int piece, float *logits);

// Memory: the bytes a batch needs, checked against what the backend can still give before the
// buffers are allocated, so that a batch that cannot fit is refused at once with a batch that
// does (instead of the kernel killing the process minutes later, or the device failing).
typedef struct {
    const char *what;       // who asks, for the message ("train")
    size_t host_per_seq;    // the caller's own host buffers per sequence (bytes)
    size_t held;            // bytes the caller holds besides the model (optimizer state), for the message
    int sharers;            // processes sharing the host's memory (data-parallel ranks on the CPU); 0 or 1: alone
} MemNeeds;

// Bytes of the activation buffers (the model's and its mixers') for N tokens.
size_t model_activation_bytes(const ModelConfig *c, const Backend *be, size_t N);
// MN_ERR_NOMEM unless B sequences of T tokens fit: activations on the backend, plus (needs, may be
// NULL) the caller's host buffers; the message names the estimated bytes, the available bytes and
// the largest batch that fits. model_forward and model_decode check every batch larger than the
// last before allocating for it, so eval and generate pass here too.
int model_check_batch(const Model *m, int B, int T, const MemNeeds *needs);

// Mean CG steps per system since the last call (the mixers' counters, read back from the
// backend), and resets them.
int model_take_cg_steps(Model *m, double *mean);

#endif
