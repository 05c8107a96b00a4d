/*
 * config.json as Hugging Face reads and writes it: the configs of fla's MesaNet, GatedDeltaNet,
 * DeltaNet and Transformer and of transformers' Llama, Mistral and xLSTM, read into a ModelConfig, and
 * the head of our config.json written as the matching one of them (config_hf.c). config.c reads
 * and writes our own "mesanet" block, which takes precedence.
 */
#ifndef MN_CONFIG_HF_H
#define MN_CONFIG_HF_H

#include <stdio.h>

#include "core/json.h"
#include "core/model_config.h"

// fla's MesaNetForCausalLM backbone on c's sizes: no embedding scale, no soft cap, untied head,
// SwiGLU width int(8/3 D) rounded up to 256, no forget-gate bound, one o_norm weight for all heads
// (its config.json: hidden_ratio 4, norm_eps 1e-6). The fla presets and the readers start from it.
void config_fla(ModelConfig *c);

// A Hugging Face config.json without our "mesanet" block, by its model_type: "mesa_net" (fla's
// MesaNet), "gated_deltanet" / "delta_net" (the fla architecture with gdn-paper / deltanet-paper),
// "transformer" (fla's, mha or swa), "llama" / "mistral" (the llama architecture, mha or swa), "xlstm"
// (transformers' xLSTMForCausalLM: the xlstm architecture, mlstm-large in every block). Each
// number is range-checked as it is read; config_validate then checks the whole. MN_ERR_FORMAT
// naming `where` and the key otherwise.
int config_from_hf(ModelConfig *c, const Json *j, const char *where);

// Writes the Hugging Face part of a valid config's config.json: from its opening brace to the
// token ids, each member followed by a comma (our "mesanet" block follows). fla's GatedDeltaNet's
// or DeltaNet's for the fla architecture with every block gdn-paper or deltanet-paper, Llama's or
// Mistral's for the llama architecture, transformers' xLSTM's for the xlstm architecture (every key
// transformers reads: hidden_size and embedding_dim, num_hidden_layers and num_blocks), fla's
// Transformer's for the fla architecture with every block mha or swa (head_dim * n_heads = dim),
// fla's MesaNet's for the fla architecture with every block Mesa, and otherwise a model_type of our
// own ("mesanet").
void config_to_hf(FILE *f, const ModelConfig *c);

#endif
