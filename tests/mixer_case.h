// Models and mixers on a backend for the mixer tests: making them, random parameters and tokens,
// float64 gradients against finite differences (the layer alone and the whole model), prefill +
// decode against one forward, and a tiny batch that a model learns.
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
// As NULL, and 0.5 for biases and lambda.
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

// Block 0's mixer of r (reference backend) and of c (the CPU's, the same parameters) on the same
// B x T random inputs (seeds su, sdy): the output, the input gradient and the block's parameter
// gradients of c against r's, each to 1e-5 (float32 rounding through a layer: 1e-7 to 1e-6),
// noted with the name padded to width.
void mc_check_layer_cpu_vs_ref(Model *r, Model *c, int B, int T, uint64_t su, uint64_t sdy, const char *name,
                               int width);

// The whole float64 model's gradients on B = 2, T = 6 tokens (seed 5, some targets -1) against
// finite differences: each tensor to 1e-5 (a failure names it); returns the whole-model rel err,
// and (where not NULL) the worst tensor's and its name.
double mc_model_gradients(Model *m, const char *name, double *worst, const char **worst_name);

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

#endif
