/*
 * The backbone's tensor names, by architecture, so that a checkpoint's tensors are named as its
 * home implementation names them and load there as they are: fla's ("paper", "fla"), Hugging
 * Face's Llama ("llama"), Hugging Face's xLSTM ("xlstm", transformers' xLSTMForCausalLM) and
 * RecurrentGemma ("recurrent_gemma", transformers' RecurrentGemmaForCausalLM).
 * The mixers name their own tensors under the block's prefix.
 */
#ifndef MN_MODEL_NAMES_H
#define MN_MODEL_NAMES_H

#include "core/model_config.h"

typedef struct {
    const char *embed;       // the token embedding
    const char *block;       // the blocks' prefix, a printf format of the block index ("model.layers.%d.")
    const char *mixer_norm;  // the norm before the mixer, after the prefix (".weight" follows)
    const char *ffn_norm;    // the norm before the feed-forward part
    const char *ffn_gate, *ffn_up, *ffn_down;  // its projections (".weight" / ".bias" follow)
    const char *final_norm;  // the norm after the blocks (full name)
} ArchNames;

const ArchNames *arch_names(const ModelConfig *c);

#endif
