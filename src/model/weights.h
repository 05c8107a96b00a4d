/*
 * A model's weights read from a safetensors file in any layout mesanet reads, one tensor at a time
 * on the host (weights.c):
 *   - ours: every tensor under our name (model/names.h and the mixers'), as checkpoint_save writes;
 *   - for the xlstm architecture, transformers' xLSTMForCausalLM in its other spellings: weight_mode
 *     "fused" (qkv_opreact, ifgate_preact and proj_up_gate_z, split on reading) and the older
 *     query / key / value names;
 *   - NX-AI's xLSTMLMModel state dict (names under "xlstm_block_stack.", converted:
 *     model/format_nxai.h);
 *   - the official Longhorn code's LonghornLMHeadModel state dict (names under "backbone.", or
 *     "transformer.backbone.": model/format_longhorn.h).
 * Every tensor of the file must find its place in the model: one that does not is refused by name,
 * as is a missing one, or one of another shape. Values are the file's plus the spec's file_offset.
 */
#ifndef MN_WEIGHTS_H
#define MN_WEIGHTS_H

#include <stdint.h>

#include "core/model_config.h"
#include "core/safetensors.h"

// Receives our tensor i (specs[i].numel floats, valid during the call).
typedef int (*WeightSink)(void *ctx, int i, const float *data);

// Reads every tensor of specs[0..n) (the declaration of a model of config c, model_specs) from the
// safetensors file at path and hands each to sink once.
int weights_read(const char *path, const ModelConfig *c, const ParamSpec *specs, int n, WeightSink sink, void *ctx);

// An opened file whose tensors are marked as they are read, so that those left over can be
// refused (the converters' shared reader).
typedef struct {
    StFile *f;
    const char *path;
    unsigned char *used;  // [st_count]
} WeightFile;

int wf_open(WeightFile *w, const char *path);
void wf_close(WeightFile *w);
int wf_has(const WeightFile *w, const char *name);
// Tensor `name` of exactly this shape into out (as float32), marked used.
int wf_read(WeightFile *w, const char *name, float *out, int ndim, const int64_t *shape);
// Rows [r0, r0 + nrows) of tensor `name`, of shape [rows, cols] (ndim 2) or [rows] (ndim 1, cols 1).
int wf_rows(WeightFile *w, const char *name, int ndim, int64_t rows, int64_t cols, int64_t r0, int64_t nrows, float *out);
// Marks tensor `name` used if the file has it.
void wf_mark(WeightFile *w, const char *name);
// MN_ERR_FORMAT naming the first tensor of the file that nothing read (`why` says what that means).
int wf_check_used(const WeightFile *w, const char *why);

// The index of the spec named `name` in specs[0..n), or -1.
int weights_find(const ParamSpec *specs, int n, const char *name);

// A tensor's values between the model and its file, in place on data [s->numel]: less / plus
// ParamSpec.file_offset (RecurrentGemma's norms hold their gain 1 + w in the model, w in the file),
// each square matrix of the last two dimensions transposed where file_transpose is set (the RG-LRU's
// gates). MN_ERR_ARG where file_transpose is set on a tensor whose last two dimensions differ.
int weights_to_file(const ParamSpec *s, float *data);
int weights_from_file(const ParamSpec *s, float *data);

#endif
