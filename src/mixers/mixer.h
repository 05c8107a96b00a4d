/*
 * The sequence-mixer interface. A mixer maps the block input u [B*T, D]
 * (already RMS-normalised) to y [B*T, D]. It declares its parameters, runs
 * forward (saving what its backward needs), backward (accumulating its
 * parameter gradients) and, for generation, keeps a fixed-size recurrent state
 * per sequence. Mixers are written against the backend op table, so one file
 * serves every backend. Adding a mixer: one file here plus a line in mixer.c
 * (a recurrent layer of the MesaNet paper's shared parameterisation builds on
 * shell.h: only its core is its own). A config's blocks may mix mixers
 * (mixer_at: a pattern such as "gdn,mesa" repeated over the blocks).
 */
#ifndef MN_MIXER_H
#define MN_MIXER_H

#include "core/backend.h"
#include "model/config.h"

typedef struct Mixer Mixer;

// Buffers the model's mixers share: temporaries of one forward or backward call. A layer's are
// dead once its call returns and layers run one at a time, so the model holds one set, not one
// per layer (for fla-162m at 8 x 2048 tokens, 250 MB a layer).
typedef struct {
    void *p;
    size_t n;  // MEM_ACT elements
} MixerScratch;

typedef struct {
    const char *name;
    const char *about;        // one line: what the layer computes
    const char *state_about;  // one line: what its decoding state holds
    int neg_eigen;            // 1: a delta rule, to which the config's neg_eigen applies (beta in (0, 2))
    int no_graph;             // 1: its decoding step passes host values (positions, cache slot and length)
                              // to the backend, which a recorded step (graph_begin) would freeze
    int uses_cg;              // 1: solves with CG (the solver's options and step counts concern it)
    // Appends this layer's parameter specs, names prefixed by `prefix` (e.g. "model.layers.3.").
    int (*declare)(const ModelConfig *c, const char *prefix, ParamSpec *out, int *n, int max);
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

// Grows the shared scratch to at least n MEM_ACT elements (its contents are lost). Call it only
// where activations are (re)allocated: a recorded decode step holds the scratch's address.
int mixer_scratch_reserve(Mixer *m, size_t n);

// The mixer named `name`, or NULL with an error listing the known ones.
const MixerOps *mixer_find(const char *name);

// A config's `mixer` field is one name or a pattern of names separated by commas, repeated over
// the blocks: block i gets the (i mod n)-th of n ("gdn,mesa": GDN, Mesa, GDN, Mesa, ...).
// mixer_pattern_check: the number of names, or -1 with an error (an unknown or empty name, more
// names than n_layers blocks; n_layers <= 0: not checked).
int mixer_pattern_check(const char *pattern, int n_layers);
// The mixer of block `layer`, or NULL with an error (an invalid pattern).
const MixerOps *mixer_at(const ModelConfig *c, int layer);
// Every known mixer, in the registry's order (NULL-terminated).
extern const MixerOps *const mixer_all[];

extern const MixerOps mixer_mesa;
// The gated linear-attention family in the paper's parameterisation (linear.c).
extern const MixerOps mixer_mamba2, mixer_gla, mixer_deltanet, mixer_gdn;
// The Gated DeltaNet paper's and DeltaNet's own layers as fla has them (gdn_paper.c).
extern const MixerOps mixer_gdn_paper, mixer_deltanet_paper;
// Softmax attention with RoPE, full causal and sliding-window (attn.c).
extern const MixerOps mixer_mha, mixer_swa;

#endif
