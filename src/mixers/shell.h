/*
 * The MesaNet paper's shared parameterisation ("paper" mode; docs/spec/mixers.md section 1):
 * the part of a recurrent layer around its core, the same for Mesa, Mamba2, GLA, DeltaNet and
 * Gated DeltaNet, so that only the state update differs between them.
 *
 *   q = L2norm(SiLU(conv(W_q u))),  k = L2norm(SiLU(conv(W_k u))),  v = W_v u    (raw_qk: no L2norm)
 *   beta = s sigmoid(W_b u + b_b)     (s = 1, or 2 for the delta rules' negative eigenvalues)
 *   log gamma = min(logsigmoid(W_a u + b_a), log(1 - beta / h_max))   (h_max = 0: no bound)
 *   o = core(q, k, v, gamma, beta, ...)
 *   y = W_o RMSNorm_h(o)     or   y = W_o (RMSNorm_h(o) (.) SiLU(W_g u))  with the output gate
 *
 * A layer without a forget gate (DeltaNet) has no W_a, b_a; one without an input gate (Mamba2)
 * no W_b, b_b. Parameters are declared in fla's order and names (attn.q_proj.weight, ...,
 * attn.a_proj.*, attn.b_proj.*, the core's own tensors, attn.q_conv1d.weight, attn.k_conv1d.weight,
 * attn.o_norm.weight, attn.o_proj.weight, attn.g_proj.weight last, with the gate only).
 *
 * A mixer keeps a Shell in its private part and calls, in its forward, shell_in_fwd (q, k, v and
 * the gates), its core on them, then shell_out_fwd (from o to y); in its backward shell_out_bwd
 * (dy to d_o), its core's backward (filling d_q, d_k, d_v, d_g, d_beta), then shell_in_bwd (into
 * the parameter gradients and du).
 */
#ifndef MN_MIXERS_SHELL_H
#define MN_MIXERS_SHELL_H

#include "mixer.h"

// The sizes of a layer over N tokens: model width D, heads H, head sizes Dk = Dv, Q = H Dk and
// Vd = H Dv wide projections, convolution width K.
typedef struct {
    int N, D, H, Dk, Dv, Q, Vd, K;
} Sizes;

Sizes shell_sizes(const ModelConfig *c, int N);

// One parameter tensor of a core, declared between the gates and the convolutions (Mesa's lambda).
typedef struct {
    const char *name;  // after the prefix ("attn.lambda_params")
    int ndim;
    int64_t shape[3];
    InitKind init;
    double value;
    int decay;
} ShellParam;

// What a layer has of the shell.
typedef struct {
    int gate;                 // W_a, b_a: the forget gate (0: gamma = 1, the core gets g = NULL)
    int beta;                 // W_b, b_b: the input gate (0: beta = 1, the core gets beta = NULL)
    float beta_scale;         // s of beta = s sigmoid(.): 1, or 2 (the delta rules' negative eigenvalues)
    int bound;                // 1: log gamma bounded with h_max = the config's gate_bound (Mesa); 0: none
    int raw_qk;               // 1: q = SiLU(conv(W_q u)), k likewise, not L2-normalised (longhorn-exact, whose
                              // step size takes the keys' norm into account)
    int mlstm;                // 1: mLSTM's gates (MlstmOps.gates_fwd): g = logsigmoid(W_a u + b_a) and, in
                              // place of beta, the input gate's pre-activation W_b u + b_b (exponentiated by
                              // the core, which stabilises it)
    const ShellParam *core;   // the core's own tensors, and their number
    int n_core;
} ShellKind;

// Parameter slots (indices into the mixer's w and dw), -1 where the layer has no such tensor.
typedef struct {
    int q_proj, k_proj, v_proj, a_w, a_b, b_w, b_b, core, q_conv, k_conv, o_norm, o_proj, g_proj, count;
} ShellSlots;

typedef struct {
    ShellKind kind;
    ShellSlots at;
    int cap;                 // tokens the activation buffers hold
    const void *u;           // [N,D] block input of the last forward (the model's buffer)
    int B, T;                // sizes of the last forward
    void *qp, *kp, *v;       // [N,Q], [N,Q], [N,Vd] projections
    void *qc, *kc;           // [N,Q] convolution outputs
    void *qs, *ks;           // [N,Q] after SiLU (forward temporaries: in the shared scratch)
    void *q, *k;             // [N,Q] L2-normalised queries and keys
    void *qinv, *kinv;       // [N*H] f32: 1/||SiLU(conv(.))||
    void *a, *b;             // [N,H] gate projections
    void *g, *beta;          // [N,H] f32: log forget gate, input gate
    void *o;                 // [N,Vd] the core's output
    void *on, *onrstd;       // [N,Vd] normalised output (in the shared scratch: the backward recomputes
                             // it), [N*H] f32 its 1/rms
    void *z, *gated;         // [N,Vd] output-gate projection, gated output (in the shared scratch:
                             // the backward recomputes it)
    // backward temporaries; the [N, .] ones in the shared scratch
    void *d_gated, *d_z, *d_on, *d_o, *d_v;  // [N,Vd]
    void *d_q, *d_k, *d_tmp;                 // [N,Q]
    void *d_a, *d_b;                         // [N,H]
    void *d_g, *d_beta;                      // [N*H] f32: the core's gradients of the gates
    // decoding
    int state_B;             // sequences of the recurrent state (0: none)
    void *qtail, *ktail;     // [B,K-1,Q] the convolutions' last inputs
} Shell;

// The slots of a kind's tensors for config c.
ShellSlots shell_slots(const ModelConfig *c, const ShellKind *k);
// Appends the layer's parameter specs (names prefixed by `prefix`, e.g. "model.layers.3.").
int shell_declare(const ModelConfig *c, const ShellKind *k, const char *prefix, ParamSpec *out, int *n, int max);
// Sets up a shell of this kind (no buffers yet).
void shell_init(Shell *s, const ModelConfig *c, const ShellKind *k);

// Frees the activation buffers (cap = 0); allocates them for N tokens and reserves the shared
// scratch (shell_scratch_elems). The caller checks the capacity (it has buffers of its own).
void shell_free_buffers(const Backend *be, Shell *s);
int shell_alloc_buffers(Mixer *m, Shell *s, int N);
// Bytes of the shell's activation buffers per token, and its MEM_ACT elements per token of the
// shared scratch (MixerOps.activation_bytes, scratch_elems).
size_t shell_activation_bytes(const ModelConfig *c, const Backend *be);
size_t shell_scratch_elems(const ModelConfig *c);

// Forward: the projections, convolutions (carrying their last inputs with use_state), q, k and
// the gates of B x T tokens into s->q, s->k, s->v, s->g, s->beta; then y from s->o.
int shell_in_fwd(Mixer *m, Shell *s, const void *u, int B, int T, int use_state);
int shell_out_fwd(Mixer *m, Shell *s, void *y);
// Backward: s->d_o from dy (for the last forward without state); then, from the core's d_q,
// d_k, d_v (and d_g, d_beta where the layer has the gates), the parameter gradients (+=) and du (=).
int shell_out_bwd(Mixer *m, Shell *s, const void *dy);
int shell_in_bwd(Mixer *m, Shell *s, void *du);

// The core's dims (Dk = Dv per head) of B sequences of T tokens.
MnSeqDims shell_dims(const Shell *s, const ModelConfig *c, int B, int T);

// Zeroes the recurrent state of B sequences: the convolutions' tails and the core's n states
// (MEM_F32, states[i] of counts[i] floats per sequence), reallocated when B changes.
int shell_reset_state(Mixer *m, Shell *s, int B, void **states, const size_t *counts, int n);
// Checks the decoding call's B against the state's.
int shell_check_state(const Mixer *m, const Shell *s, int B);
// Floats of the convolutions' tails per sequence.
size_t shell_state_floats(const ModelConfig *c);
// Frees the buffers and the tails (not the core's states).
void shell_destroy(const Backend *be, Shell *s);

#endif
