/*
 * The official Longhorn code's language model (Cranial-XIX/Longhorn, models/longhorn.py:
 * LonghornLMHeadModel, and LonghornLM around it): its checkpoint folder of config.json
 * (LonghornConfig's fields, as its save_pretrained writes them) and model.safetensors (the module's
 * state dict, saved with safetensors), read as our paper-architecture model of longhorn blocks, and
 * ours written in that form (format_longhorn.c; docs/spec/reference/gdn-longhorn-notes.md B.2).
 *
 * What differs between the two, and is converted both ways:
 *   - The mixer's in_proj [2E, D] is our in_proj_x (its first E rows) and in_proj_z; its x_proj
 *     [R + 2N, E] our x_proj_dt (first R rows), x_proj_k (N rows) and x_proj_q (N rows).
 *   - Tensor names: backbone.embedding.weight, backbone.layers.{i}.norm.weight,
 *     backbone.layers.{i}.mixer.{in_proj, conv1d, x_proj, dt_head, out_proj, D}, backbone.norm_f.weight,
 *     lm_head.weight (also where tied: the module's state dict holds both names); LonghornLM's
 *     state dict (nanoGPT's train.py) has all of them under "transformer.", which is read too.
 * The block is the same function: theirs adds the residual before the norm (Add -> RMSNorm -> mixer),
 * ours after the mixer, and both norm the sum of the residual stream once more at the end. Their
 * RMSNorm eps is 1e-5 (norm_epsilon, not in the config).
 */
#ifndef MN_FORMAT_LONGHORN_H
#define MN_FORMAT_LONGHORN_H

#include "core/json.h"
#include "core/model_config.h"
#include "core/safetensors.h"
#include "model/weights.h"

// 1 when a parsed config.json is LonghornConfig's (an object with "d_model", "n_layer" and "ssm_cfg"),
// else 0.
int longhorn_config_is(const Json *j);

// Reads LonghornConfig into c: the paper architecture with mixer "longhorn" in every block, RMSNorm
// (eps 1e-5), no embedding scale, no logit cap, a tied or untied head, the vocabulary padded to
// pad_vocab_size_multiple as the module pads it, ssm_cfg's d_state, d_conv and expand (dt_rank
// "auto" or ceil(d_model / 16), biases as the official block has them). What mesanet does not
// compute is refused naming the key and the value expected (an MLP, attention layers, LayerNorm,
// another dt_rank, ...); initialisation settings are ignored; unknown keys are refused.
int longhorn_config_read(ModelConfig *c, const Json *j, const char *where);

// 1 when a safetensors file holds the official model's state dict (a tensor
// "backbone.embedding.weight" or "transformer.backbone.embedding.weight"), else 0.
int longhorn_weights_are(const StFile *f);

// Reads the official tensors as ours (the model of config c, specs[0..n)), handing each to sink
// once; the file's tensors are marked used (weights_read refuses what is left).
int longhorn_read(WeightFile *w, const ModelConfig *c, const ParamSpec *specs, int n, WeightSink sink, void *ctx);

// MN_ERR_ARG naming what LonghornLMHeadModel cannot hold (another mixer, LayerNorm, an embedding
// scale, a logit cap, the autoencoder head, a norm eps other than its 1e-5), or MN_OK.
int longhorn_check(const ModelConfig *c);

// Writes a model of config c (specs[0..n), the weights in vals) into dir as the official checkpoint
// folder: config.json (LonghornConfig's fields) and model.safetensors (float32, the module's names).
int longhorn_write(const char *dir, const ModelConfig *c, const ParamSpec *specs, int n, float *const *vals);

#endif
