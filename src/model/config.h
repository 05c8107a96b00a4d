/*
 * Model configs (core/model_config.h's ModelConfig): defaults, JSON files (ours, or a Hugging Face
 * config.json: config_hf.h), saving, validation and comparison. Named and parameter-matched
 * presets are presets.h's.
 */
#ifndef MN_CONFIG_H
#define MN_CONFIG_H

#include <stddef.h>

#include "core/model_config.h"

// Fills the defaults of the "paper" architecture for the given sizes.
void config_default(ModelConfig *c);
// The fields beyond the backbone's that the config's mixers read, with their values, for `info`
// ("rope_theta 10000, window 128"; "" when none).
void config_mixer_fields(const ModelConfig *c, char *out, size_t n);
// Reads a JSON config (ours, a Hugging Face config.json that config_hf.h reads, or NX-AI's
// xLSTMLMModel config.json that format_nxai.h reads; unknown keys and impossible values are
// refused, naming the file and key, every number range-checked before it is converted), or, if
// nothing exists at `spec`, a preset name. A directory or another kind of file is refused saying so.
int config_load(ModelConfig *c, const char *spec);
// Writes config.json atomically; refuses an invalid config, so that every saved config loads
// again with the same value in every field. Its Hugging Face part is config_to_hf's (config_hf.h).
int config_save(const ModelConfig *c, const char *path);
// Resets the fields that no block's mixer reads (the mixers' MixerOps.fields) to their defaults:
// presets, readers and model_create call it, so that a config holds only what its model reads
// (config_save leaves those fields out; config_validate refuses the switches turned on there:
// neg_eigen, head_v_dim, n_kv_heads, output_gate, o_bias).
void config_normalize(ModelConfig *c);
// MN_ERR_ARG with a message naming the field, its value and the valid range unless every field is
// in range (floats finite) and the sizes are consistent.
int config_validate(const ModelConfig *c, const char *where);
// 0 when every field of a and b that either model reads is equal; otherwise 1 and, in out, the
// first field that differs with both values ("dim: 32 vs 192").
int config_diff(const ModelConfig *a, const ModelConfig *b, char *out, size_t n);

#endif
