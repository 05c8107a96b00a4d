#include "names.h"

#include <string.h>

static const ArchNames fla = {"model.embeddings.weight", "model.layers.%d.", "attn_norm", "mlp_norm",
                              "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "model.norm.weight"};
static const ArchNames llama = {"model.embed_tokens.weight", "model.layers.%d.", "input_layernorm",
                                "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
                                "model.norm.weight"};
static const ArchNames xlstm = {"backbone.embeddings.weight", "backbone.blocks.%d.", "norm_mlstm", "norm_ffn",
                                "ffn.proj_up_gate", "ffn.proj_up", "ffn.proj_down", "backbone.out_norm.weight"};

static const ArchNames rgemma = {"model.embed_tokens.weight", "model.layers.%d.", "temporal_pre_norm",
                                 "channel_pre_norm", "mlp_block.gate_proj", "mlp_block.up_proj", "mlp_block.down_proj",
                                 "model.final_norm.weight"};

const ArchNames *arch_names(const ModelConfig *c) {
    if (!strcmp(c->arch, "llama")) return &llama;
    if (!strcmp(c->arch, "recurrent_gemma")) return &rgemma;
    if (!strcmp(c->arch, "xlstm")) return &xlstm;
    return &fla;
}
