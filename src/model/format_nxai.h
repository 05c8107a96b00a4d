/*
 * NX-AI's xlstm package (`xLSTMLMModel`, the xLSTM paper's models): its checkpoint folder of
 * config.json (dataclasses.asdict of xLSTMLMModelConfig) and model.safetensors (the module's state
 * dict), read as our paper-architecture model of mlstm-block / slstm-block mixers with LayerNorm,
 * and ours written in that form (format_nxai.c; docs/spec/reference/xlstm-formats.md 2).
 *
 * What differs between the two, and is converted both ways:
 *   - NX-AI's LayerNorms and per-head GroupNorms store their weight as an offset (effective weight
 *     1 + stored); ours are the effective weights.
 *   - The mLSTM layer's proj_up [2 Di, D] is our proj_up_x (its first Di rows) and proj_up_z; the
 *     gated feed-forward's proj_up [2 F, D] is our mlp.gate_proj (first F rows) and mlp.up_proj.
 *   - In the sLSTM layer, NX-AI's module "fgate" feeds the input gate and "igate" the forget gate:
 *     their weights are our xlstm.igate and xlstm.fgate (ours are named by the gate they feed).
 *   - The sLSTM's recurrent kernel and biases are stored in the layout of its backend: "vanilla"
 *     _recurrent_kernel_ [H, 4 Dh, Dh] (element [h, g Dh + b, a]) and _bias_ gate-major
 *     [g E + h Dh + d]; "cuda" [H, Dh, 4 Dh] (element [h, a, g Dh + b]) and _bias_ head-major
 *     [h 4 Dh + g Dh + d]. Ours are R [H, Dh, 4, Dh] (R[h, a, g, b]) and bias [4, H, Dh]. The
 *     kernel's shape tells the layouts apart (and, with it, the biases' order).
 *   - Tensor names: xlstm_block_stack.blocks.{i}.* , token_embedding, post_blocks_norm, lm_head.
 * NX-AI's eps is 1e-5 in every norm (ours: norm_eps), its mLSTM's 1e-6 (ours). Its mLSTM forward
 * (the parallel form) starts its stabiliser from -inf where ours starts from 0: the two differ only
 * where eps counts, by at most eps = 1e-6 relative (xlstm-formats.md 2.5). Its forward needs
 * S <= context_length (a causal mask of that size); ours has no such limit.
 */
#ifndef MN_FORMAT_NXAI_H
#define MN_FORMAT_NXAI_H

#include "core/json.h"
#include "core/model_config.h"
#include "core/safetensors.h"
#include "model/weights.h"

// 1 when a parsed config.json is NX-AI's (an object with "mlstm_block", "slstm_block", "slstm_at"
// or "_block_map"), else 0.
int nxai_config_is(const Json *j);

// Reads NX-AI's config into c: the paper architecture, the mixer pattern from slstm_at (or
// _block_map) as runs ("mlstm-block*3,slstm-block,mlstm-block*16,..."; at most 255 characters),
// the widths by NX-AI's rounding, LayerNorm with eps 1e-5, the heads, the convolution, the sLSTM
// blocks' gated MLP width, the vocabulary, a tied or untied head, no embedding scale, no logit
// cap, seq_len = context_length. What mesanet does not compute is refused naming the key and
// the value expected (biases, qkv_proj_blocksize other than 4, no convolution, no final norm,
// another MLP activation, ...); dropout is ignored (inference).
int nxai_config_read(ModelConfig *c, const Json *j, const char *where);

// 1 when a safetensors file holds NX-AI's state dict (tensors named "xlstm_block_stack.*" or
// "token_embedding.weight"), else 0.
int nxai_weights_are(const StFile *f);

// Reads NX-AI's tensors as ours (the model of config c, specs[0..n)), converted as above, handing
// each to sink once. The file's tensors are marked used (weights_read refuses what is left).
int nxai_read(WeightFile *w, const ModelConfig *c, const ParamSpec *specs, int n, WeightSink sink, void *ctx);

// Writes a model of config c (specs[0..n), the weights in vals) into dir as NX-AI's checkpoint
// folder: config.json as dataclasses.asdict writes it (with "backend" `layout`) and
// model.safetensors in that backend's sLSTM layout ("vanilla" or "cuda"). MN_ERR_ARG naming what
// NX-AI's xLSTMLMModel cannot hold (another mixer, RMSNorm, an embedding scale, a logit cap, ...).
int nxai_write(const char *dir, const ModelConfig *c, const ParamSpec *specs, int n, float *const *vals,
               const char *layout);

// MN_ERR_ARG naming what NX-AI's xLSTMLMModel cannot hold, or MN_OK (nxai_write's check).
int nxai_check(const ModelConfig *c);

#endif
