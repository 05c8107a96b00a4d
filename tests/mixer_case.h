// Models and mixers on a backend for the mixer tests: making them, random parameters and tokens,
// float64 gradients against finite differences (the layer alone and the whole model), prefill +
// decode against one forward, a tiny batch that a model learns, the core families a mixer runs on
// and backends without them, a backend that counts the memory it holds, and the conformance
// battery's cases (every registered mixer and patterns of them, in the variants that matter).
#ifndef MN_TEST_MIXER_CASE_H
#define MN_TEST_MIXER_CASE_H

#include <stddef.h>
#include <stdint.h>

#include "core/backend.h"
#include "model/model.h"

// The test models' tiny sizes on c as it is: vocabulary 11, width 12, `layers` blocks of 2 heads
// of 4, MLP 10, sequences of 8; the mixer (or pattern) too where mixer is not NULL.
void mc_tiny_sizes(ModelConfig *c, const char *mixer, int layers);

// model_create, dying on failure (with the mixer's name).
Model *mc_make(const ModelConfig *c, const Backend *be);

// The mean of a tensor's random values (their sd is 0.5); NULL in mc_randomise: 0 for
// normal-initialised tensors, 1 for the others.
typedef double (*McBase)(const ParamSpec *s);
// As NULL, and 0.5 for biases and lambda; fla's A_log -1.2 (A = exp(A_log) near 0.3) and dt_bias 0,
// which keep the Gated DeltaNet paper's decay moderate.
double mc_base_bias_lambda(const ParamSpec *s);

// Random parameters larger than the initialisation, so that every path carries real gradient.
void mc_randomise(Model *m, uint64_t seed, McBase base);
// The parameters of `from` into `to` (same specs), through the host.
void mc_copy_params(Model *to, const Model *from);
// n random tokens below V, and (unless tgt is NULL) targets, every fifth from the fourth -1.
void mc_tokens(int32_t *tok, int32_t *tgt, size_t n, int V, uint64_t seed);

// Block 0's mixer of a float64 model (1 layer) on B = 2, T = 7 random inputs: the input gradient
// (labelled du_what) and the block's parameter gradients against finite differences, to 1e-6.
void mc_check_layer_gradients(Model *m, const char *name, const char *du_what);

// Block `layer`'s mixer on B x T inputs u and output gradient dy (host [B*T*D]): y, du (host, where
// not NULL) and (where grads is not NULL) the whole gradient slab, m->total, the block's parameter
// gradients zeroed first (the others stay zero).
void mc_layer_run(Model *m, int layer, const double *u, const double *dy, int B, int T, double *y, double *du,
                  double *grads);

// Block 0's mixer on B x T random inputs (seed), run token by token through its decoding state
// (reset_state, then T calls of one token each) against one forward over the sequence: the worst
// relative error of the outputs.
double mc_layer_steps_vs_forward(Model *m, int B, int T, uint64_t seed);

// Block 0's mixer of r (reference backend) and of c (the CPU's, the same parameters) on the same
// B x T random inputs (seeds su, sdy): the output of c against r's to 1e-5, the input gradient and
// the block's parameter gradients to tol_bwd (the caller's: its core's backward tolerance), noted
// with the name padded to width.
void mc_check_layer_cpu_vs_ref(Model *r, Model *c, int B, int T, uint64_t su, uint64_t sdy, double tol_bwd,
                               const char *name, int width);

// The whole float64 model's gradients on B = 2, T = 6 tokens (seed 5, some targets -1) against
// finite differences: each tensor to 1e-5 (a failure names it); returns the whole-model rel err,
// and (where not NULL) the worst tensor's and its name.
double mc_model_gradients(Model *m, const char *name, double *worst, const char **worst_name);

// The loss summed over the tokens of one forward and backward (grad_weight 1 / (B T)), the gradient
// slab into grads (m->total, where not NULL) from zero.
double mc_model_run(Model *m, const int32_t *tok, const int32_t *tgt, int B, int T, double *grads);

// The whole model r (reference backend) and c (the CPU's, the same parameters) on B = 3, T = 21
// tokens (seed 11, some targets -1): the loss of c to 1e-5 of r's and its gradients to 1e-4
// (float32 through the blocks), noted with the name padded to width.
void mc_check_model_cpu_vs_ref(Model *r, Model *c, const char *name, int width);

// tok[0..B*T) run through one forward, then decoded as a prefill of T1, single tokens, and (where
// mid_n) a prefill of mid_n at position mid_at: the worst rel err of the decoded logits against
// the forward's at every decoded position. With cap > 0 the forward's logits are capped first
// (cap tanh(x / cap)); argmax_diff (where not NULL) counts the positions whose argmax differs.
double mc_decode_vs_forward(Model *m, const int32_t *tok, int B, int T, int T1, int mid_at, int mid_n, float cap,
                            const char *name, int *argmax_diff);

// A tiny batch of 2 x 32 tokens below 64 (seed 9) whose targets are the next token (but for each
// row's last, random): a pattern a model can learn.
void mc_tiny_batch(int32_t tok[64], int32_t tgt[64]);
// `steps` AdamW steps (lr 1e-2, clip 1) on that batch: the mean loss of the first and the last.
void mc_train_tiny(Model *m, const char *name, int steps, double *first, double *last);
// 20 steps, noted (name padded to width) and checked: the loss falls by more than 1 nat.
void mc_check_tiny_trains(Model *m, const char *name, int width);

// ------------------------------------------------------------------- core families

// The families of sequence-mixer cores in the backend op table (core/backend.h); a backend without
// one refuses the mixers that run on it.
enum { MC_FAM_MESA = 1, MC_FAM_LIN = 2, MC_FAM_ATTN = 4, MC_FAM_MLSTM = 8, MC_FAM_SLSTM = 16, MC_FAM_SCAN = 32, MC_FAMS = 6 };
extern const unsigned mc_fam[MC_FAMS];         // the families, one bit each
extern const char *const mc_fam_name[MC_FAMS];  // "mesa_fwd/mesa_bwd", ...

// The families whose cores the config's model calls, each block's (the pattern's first n) into
// per_block (where not NULL): each block's mixer run forward once on the CPU with those cores
// wrapped to note the calls. Their union is returned.
unsigned mc_families(const ModelConfig *c, unsigned *per_block);
// be with the cores of the families `fams` taken away (NULL), and named `name`.
Backend mc_without(const Backend *be, unsigned fams, const char *name);
// The families whose cores be lacks (any of their ops NULL).
unsigned mc_lacking(const Backend *be);

// ------------------------------------------------------------------- memory held

// The CPU backend counting the bytes it holds (one count for the process: one such backend in use
// at a time); mc_counted_bytes: those allocated and not yet freed since mc_counted_cpu.
Backend mc_counted_cpu(void);
size_t mc_counted_bytes(void);

// ------------------------------------------------------------------- the conformance cases

// A row of the conformance battery: a mixer (or a pattern) in one variant of its settings. A
// registered mixer without a row is a case of its own, with what its preset sets (MixerOps.preset).
typedef struct {
    const char *mixer;  // a registered name, or a pattern of them ("gdn,mesa")
    int gate;           // output_gate
    int onorm;          // shared_onorm: one o_norm weight shared by the heads (fla's)
    int neg;            // neg_eigen: the delta rules' beta in (0, 2)
    double expand_v;    // head_v_dim = expand_v head_dim (0: head_dim; gdn-paper, deltanet-paper)
    int kv;             // n_kv_heads (0: n_heads)
    int window;         // swa's window (0: its preset's, half the context)
    float bound;        // gate_bound, Mesa's forget-gate bound (0: none)
    int fla;            // fla's architecture: untied head, no embedding scale, no logit cap
    int defaults;       // a registered mixer with no row: its preset's settings alone
} McCase;

// The table's rows (n of them), and the cases: for every mixer of mixer_all in the registry's
// order, its rows (or one case of defaults), then the patterns' rows. Returns the count (at most max).
const McCase *mc_rows(int *n);
int mc_cases(McCase *out, int max);
// "gdn +gate +shared norm +neg_eigen", "swa kv=1 window=5", "deltanet-paper Dv=2Dk fla", ...
const char *mc_case_name(const McCase *k, char *buf, size_t n);

// The model's sizes in a case's config.
typedef struct {
    int vocab, dim, heads, head_dim, mlp, seq_len;
} McSizes;
extern const McSizes mc_tiny;  // mc_tiny_sizes': V 11, D 12, 2 heads of 4, MLP 10, context 8

// The config of case k at sizes s with at least `layers` blocks (a pattern gets one block per name
// at least): the paper's architecture (or fla's) with a logit cap of 2.5, small enough to bend
// the logits noticeably, RoPE base 100, whose rotations differ visibly across a few positions, the
// presets' settings of the pattern's mixers, then the row's.
ModelConfig mc_case_config(const McCase *k, const McSizes *s, int layers);
// The number of blocks of a pattern (1 for a name).
int mc_pattern_len(const char *mixer);
// The i-th name of a pattern, into buf.
const char *mc_pattern_name(const char *mixer, int i, char *buf, size_t n);

#endif
