/*
 * Hugging Face's config.json, read and written: fla's MesaNet, GatedDeltaNet, DeltaNet and
 * Transformer configs, and transformers' Llama and Mistral ones (config_hf.h). Each number is
 * range-checked as it is read, fla's or transformers' defaults taken for absent keys, and what
 * mesanet does not have refused by name; config_validate then checks the whole.
 */
#include "config_hf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/json.h"
#include "mixers/mixer.h"
#include "model/config.h"

enum { BIG = 1 << 30 };  // beyond every valid size (config_validate names the real bound)

// fla's MesaNetForCausalLM: no embedding scale, no soft cap, untied head,
// SwiGLU width int(8/3 D) rounded up to 256, no forget-gate bound, one o_norm
// weight for all heads (its config.json: hidden_ratio 4, norm_eps 1e-6).
void config_fla(ModelConfig *c) {
    strcpy(c->arch, "fla");
    c->embed_scale = 0;
    c->logit_cap = 0;
    c->tie_embeddings = 0;
    c->gate_bound = 0;
    c->shared_onorm = 1;
    c->mlp_hidden = 256 * ((c->dim * 8 / 3 + 255) / 256);
    c->resid_scale = 0;
}

// The member `key` of a Hugging Face config as an int in [min, max] (fallback when absent).
static int hf_int(const Json *j, const char *key, int fallback, int min, int max, const char *where, int *out) {
    const Json *v = json_get(j, key);
    *out = fallback;
    if (!v || v->type == JSON_NULL) return MN_OK;
    MN_TRY(json_int(v, key, where, out));
    if (*out < min || *out > max)
        return mn_error(MN_ERR_FORMAT, "%s:%d: \"%s\" = %d, expected %d to %d", where, v->line, key, *out, min, max);
    return MN_OK;
}

static int hf_float(const Json *j, const char *key, float fallback, const char *where, float *out) {
    const Json *v = json_get(j, key);
    *out = fallback;
    return v && v->type != JSON_NULL ? json_float(v, key, where, out) : MN_OK;
}

static int hf_flag(const Json *j, const char *key, int fallback, const char *where, int *out) {
    const Json *v = json_get(j, key);
    *out = fallback;
    return v && v->type != JSON_NULL ? json_flag(v, key, where, out) : MN_OK;
}

// Hugging Face's hidden_act, absent or SwiGLU's ("swish" in fla's configs, "silu" in transformers';
// `name` is the one the message asks for).
static int hf_swiglu(const Json *j, const char *name, const char *where) {
    const Json *act = json_get(j, "hidden_act");
    if (act && (act->type != JSON_STRING || (strcmp(act->string, "swish") && strcmp(act->string, "silu"))))
        return mn_error(MN_ERR_FORMAT, "%s: hidden_act must be \"%s\" (SwiGLU), got another", where, name);
    return MN_OK;
}

// The backbone of fla's configs (MesaNet's, GatedDeltaNet's, DeltaNet's, Transformer's): fla's
// architecture (config_fla), the MLP width from intermediate_size or else fla's hidden_ratio (2/3 of
// it times hidden_size, rounded up to 256), norm_eps, tie_word_embeddings and the training context
// (max_position_embeddings). hidden_size is read before: the width follows it.
static int hf_fla_backbone(ModelConfig *c, const Json *j, const char *where) {
    config_fla(c);
    const Json *inter = json_get(j, "intermediate_size");
    if (inter && inter->type != JSON_NULL) {
        MN_TRY(hf_int(j, "intermediate_size", 0, -BIG, BIG, where, &c->mlp_hidden));
    } else {
        int ratio;
        MN_TRY(hf_int(j, "hidden_ratio", 4, 1, 64, where, &ratio));
        int h = c->dim * ratio * 2 / 3;  // at most 65536 * 64
        c->mlp_hidden = 256 * ((h + 255) / 256);
    }
    MN_TRY(hf_float(j, "norm_eps", 1e-6f, where, &c->norm_eps));
    MN_TRY(hf_flag(j, "tie_word_embeddings", 0, where, &c->tie_embeddings));
    return hf_int(j, "max_position_embeddings", 2048, -BIG, BIG, where, &c->seq_len);
}

// A config.json written by fla's MesaNetConfig (Hugging Face), without our own "mesanet" block:
// fla's architecture with its sizes.
static int config_from_hf_mesa(ModelConfig *c, const Json *j, const char *where) {
    config_default(c);
    MN_TRY(hf_int(j, "hidden_size", 2048, 1, 65536, where, &c->dim));  // bounded here: config_fla multiplies it
    MN_TRY(hf_int(j, "num_hidden_layers", 24, -BIG, BIG, where, &c->n_layers));
    MN_TRY(hf_int(j, "num_heads", 16, -BIG, BIG, where, &c->n_heads));
    MN_TRY(hf_int(j, "head_dim", 128, -BIG, BIG, where, &c->head_dim));
    MN_TRY(hf_int(j, "vocab_size", 32000, -BIG, BIG, where, &c->vocab_size));
    MN_TRY(hf_fla_backbone(c, j, where));
    MN_TRY(hf_flag(j, "use_output_gate", 0, where, &c->output_gate));
    MN_TRY(hf_int(j, "conv_size", 4, -BIG, BIG, where, &c->conv_size));
    MN_TRY(hf_float(j, "lambda_lower_bound", 0.25f, where, &c->lambda_min));
    MN_TRY(hf_int(j, "max_cg_step_training", 30, -BIG, BIG, where, &c->cg_steps));
    MN_TRY(hf_swiglu(j, "swish", where));
    config_normalize(c);
    return config_validate(c, where);
}

// A number of a Hugging Face config as a double (fallback when absent or null).
static int hf_double(const Json *j, const char *key, double fallback, const char *where, double *out) {
    const Json *v = json_get(j, key);
    *out = fallback;
    if (!v || v->type == JSON_NULL) return MN_OK;
    if (v->type != JSON_NUMBER || !isfinite(v->number) || v->number <= 0 || v->number > 1024)
        return mn_error(MN_ERR_FORMAT, "%s:%d: \"%s\" must be a positive number of at most 1024", where, v->line, key);
    *out = v->number;
    return MN_OK;
}

// A string member that must be absent, null or `want` (what fla's layer computes otherwise, mesanet
// does not).
static int hf_only(const Json *j, const char *key, const char *want, const char *where) {
    const Json *v = json_get(j, key);
    if (!v || v->type == JSON_NULL || (v->type == JSON_STRING && !strcmp(v->string, want))) return MN_OK;
    return mn_error(MN_ERR_FORMAT, "%s:%d: \"%s\" must be \"%s\" (the only kind mesanet has)", where, v->line, key, want);
}

// A member that must be absent or null (a feature of fla's models that mesanet does not have).
static int hf_none(const Json *j, const char *key, const char *what, const char *where) {
    const Json *v = json_get(j, key);
    if (!v || v->type == JSON_NULL) return MN_OK;
    return mn_error(MN_ERR_FORMAT, "%s:%d: \"%s\" is set: %s, which mesanet does not have", where, v->line, key, what);
}

// Python's int(a * b) for positive a, b (truncation), or -1 beyond the int range.
static int py_int_mul(double a, double b) {
    double x = a * b;
    return x >= 0 && x < 2147483647.0 ? (int)x : -1;
}

// A config.json of fla's GatedDeltaNetForCausalLM (model_type "gated_deltanet", gated) or
// DeltaNetForCausalLM ("delta_net"), without our "mesanet" block: the `fla` architecture with the
// mixer gdn-paper or deltanet-paper, and fla's defaults for absent keys (configuration_*.py).
static int config_from_hf_delta(ModelConfig *c, const Json *j, const char *where, int gated) {
    config_default(c);
    strcpy(c->mixer, gated ? "gdn-paper" : "deltanet-paper");
    MN_TRY(hf_int(j, "hidden_size", 2048, 1, 65536, where, &c->dim));
    MN_TRY(hf_int(j, "num_hidden_layers", gated ? 21 : 24, -BIG, BIG, where, &c->n_layers));
    MN_TRY(hf_int(j, "vocab_size", 32000, -BIG, BIG, where, &c->vocab_size));
    MN_TRY(hf_int(j, "num_heads", gated ? 6 : 16, 1, 65536, where, &c->n_heads));
    double expand_v;
    MN_TRY(hf_double(j, "expand_v", gated ? 2.0 : 1.0, where, &expand_v));
    if (gated) {
        MN_TRY(hf_int(j, "head_dim", 256, 1, 65536, where, &c->head_dim));
        int hv = py_int_mul(c->head_dim, expand_v);  // fla: head_v_dim = int(head_dim * expand_v), checked isclose
        if (hv < 1 || fabs(c->head_dim * expand_v - hv) > 1e-5 * fabs(c->head_dim * expand_v))
            return mn_error(MN_ERR_FORMAT, "%s: expand_v = %g times head_dim = %d is not a whole value head width", where,
                            expand_v, c->head_dim);
        c->head_v_dim = hv;
        int nv = c->n_heads;
        MN_TRY(hf_int(j, "num_v_heads", c->n_heads, 1, 65536, where, &nv));
        if (nv != c->n_heads)
            return mn_error(MN_ERR_FORMAT, "%s: num_v_heads = %d differs from num_heads = %d (grouped value heads), "
                                           "which mesanet does not have", where, nv, c->n_heads);
    } else {
        double expand_k;
        MN_TRY(hf_double(j, "expand_k", 1.0, where, &expand_k));
        // fla: key_dim = int(hidden * expand_k), value_dim = int(hidden * expand_v), divided by num_heads
        int kd = py_int_mul(c->dim, expand_k), vd = py_int_mul(c->dim, expand_v);
        if (kd < 1 || vd < 1 || kd % c->n_heads || vd % c->n_heads)
            return mn_error(MN_ERR_FORMAT, "%s: key_dim %d and value_dim %d (hidden_size %d times expand_k, expand_v) must "
                                           "be positive multiples of num_heads = %d", where, kd, vd, c->dim, c->n_heads);
        c->head_dim = kd / c->n_heads;
        c->head_v_dim = vd / c->n_heads;
        int flag;
        MN_TRY(hf_flag(j, "use_beta", 1, where, &flag));
        if (!flag) return mn_error(MN_ERR_FORMAT, "%s: use_beta = false (beta = 1), which mesanet does not have", where);
        MN_TRY(hf_only(j, "qk_norm", "l2", where));
        MN_TRY(hf_only(j, "qk_activation", "silu", where));
    }
    if (c->head_v_dim == c->head_dim) c->head_v_dim = 0;
    MN_TRY(hf_fla_backbone(c, j, where));
    MN_TRY(hf_flag(j, "use_gate", gated, where, &c->output_gate));
    MN_TRY(hf_flag(j, "allow_neg_eigval", 0, where, &c->neg_eigen));
    MN_TRY(hf_int(j, "conv_size", 4, -BIG, BIG, where, &c->conv_size));
    int conv;
    MN_TRY(hf_flag(j, "use_short_conv", 1, where, &conv));
    if (!conv) return mn_error(MN_ERR_FORMAT, "%s: use_short_conv = false, which mesanet does not have", where);
    MN_TRY(hf_none(j, "attn", "attention in some layers (a hybrid)", where));
    MN_TRY(hf_none(j, "attnres_block_size", "attention residuals", where));
    MN_TRY(hf_swiglu(j, "swish", where));
    config_normalize(c);
    return config_validate(c, where);
}

// A config.json of fla's TransformerForCausalLM (model_type "transformer"; fla/layers/attn.py's
// Attention: head_dim = hidden_size / num_heads, RoPE, flash attention's window (window_size - 1,
// 0), i.e. the last window_size tokens), without our "mesanet" block: the `fla` architecture with
// the mixer mha, or swa where window_size is set. Its tensor names are ours (attn.q_proj, ...).
static int config_from_hf_transformer(ModelConfig *c, const Json *j, const char *where) {
    config_default(c);
    MN_TRY(hf_int(j, "hidden_size", 2048, 1, 65536, where, &c->dim));
    MN_TRY(hf_int(j, "num_hidden_layers", 24, -BIG, BIG, where, &c->n_layers));
    MN_TRY(hf_int(j, "vocab_size", 32000, -BIG, BIG, where, &c->vocab_size));
    MN_TRY(hf_int(j, "num_heads", 32, 1, 65536, where, &c->n_heads));
    if (c->dim % c->n_heads)
        return mn_error(MN_ERR_FORMAT, "%s: hidden_size = %d is not a multiple of num_heads = %d (fla's head_dim = "
                                       "hidden_size // num_heads would drop features)", where, c->dim, c->n_heads);
    c->head_dim = c->dim / c->n_heads;
    MN_TRY(hf_int(j, "num_kv_heads", 0, 1, 65536, where, &c->n_kv_heads));
    if (c->n_kv_heads == c->n_heads) c->n_kv_heads = 0;
    const Json *w = json_get(j, "window_size");
    if (w && w->type != JSON_NULL) {
        MN_TRY(hf_int(j, "window_size", 0, 1, 1 << 24, where, &c->window));
        strcpy(c->mixer, "swa");
    } else {
        strcpy(c->mixer, "mha");
    }
    const Json *theta = json_get(j, "rope_theta");
    if (theta && theta->type == JSON_NULL)
        return mn_error(MN_ERR_FORMAT, "%s: rope_theta = null (no rotary embedding), which mesanet does not have", where);
    MN_TRY(hf_float(j, "rope_theta", 10000, where, &c->rope_theta));
    int flag;
    MN_TRY(hf_flag(j, "qkv_bias", 0, where, &flag));
    if (flag) return mn_error(MN_ERR_FORMAT, "%s: qkv_bias = true, which mesanet does not have", where);
    MN_TRY(hf_flag(j, "qk_norm", 0, where, &flag));
    if (flag) return mn_error(MN_ERR_FORMAT, "%s: qk_norm = true, which mesanet does not have", where);
    MN_TRY(hf_flag(j, "elementwise_affine", 1, where, &flag));
    if (!flag) return mn_error(MN_ERR_FORMAT, "%s: elementwise_affine = false, which mesanet does not have", where);
    MN_TRY(hf_fla_backbone(c, j, where));
    MN_TRY(hf_none(j, "attnres_block_size", "attention residuals", where));
    MN_TRY(hf_swiglu(j, "swish", where));
    config_normalize(c);
    return config_validate(c, where);
}

// A config.json of Hugging Face's LlamaForCausalLM (model_type "llama") or MistralForCausalLM
// ("mistral"), without our "mesanet" block: the `llama` architecture (tensors named as Llama's, which
// Mistral shares: model.embed_tokens, input_layernorm, self_attn.q_proj, post_attention_layernorm,
// mlp, model.norm, lm_head) with mha in every block, or swa where Mistral's sliding_window is set
// (transformers' window holds the last sliding_window tokens, the current one included: our
// `window`); transformers' defaults for absent keys. Biases and RoPE scaling are refused.
static int config_from_hf_llama(ModelConfig *c, const Json *j, const char *where) {
    config_default(c);
    strcpy(c->mixer, "mha");
    MN_TRY(hf_int(j, "hidden_size", 4096, 1, 65536, where, &c->dim));
    MN_TRY(hf_int(j, "intermediate_size", 11008, -BIG, BIG, where, &c->mlp_hidden));
    MN_TRY(hf_int(j, "num_hidden_layers", 32, -BIG, BIG, where, &c->n_layers));
    MN_TRY(hf_int(j, "num_attention_heads", 32, 1, 65536, where, &c->n_heads));
    MN_TRY(hf_int(j, "num_key_value_heads", c->n_heads, 1, 65536, where, &c->n_kv_heads));
    if (c->n_kv_heads == c->n_heads) c->n_kv_heads = 0;
    if (c->dim % c->n_heads && !json_get(j, "head_dim"))
        return mn_error(MN_ERR_FORMAT, "%s: hidden_size = %d is not a multiple of num_attention_heads = %d and no head_dim "
                                       "is given", where, c->dim, c->n_heads);
    MN_TRY(hf_int(j, "head_dim", c->dim / c->n_heads, 1, 65536, where, &c->head_dim));
    MN_TRY(hf_int(j, "vocab_size", 32000, -BIG, BIG, where, &c->vocab_size));
    const Json *theta = json_get(j, "rope_theta");
    if (theta && theta->type == JSON_NULL)
        return mn_error(MN_ERR_FORMAT, "%s: rope_theta = null, expected a number", where);
    MN_TRY(hf_float(j, "rope_theta", 10000, where, &c->rope_theta));
    MN_TRY(hf_none(j, "rope_scaling", "RoPE scaling", where));
    // transformers 5 writes RoPE as "rope_parameters": {"rope_type": "default", "rope_theta": ...}
    const Json *rope = json_get(j, "rope_parameters");
    if (rope && rope->type != JSON_NULL) {
        if (rope->type != JSON_OBJECT)
            return mn_error(MN_ERR_FORMAT, "%s:%d: \"rope_parameters\" must be an object", where, rope->line);
        const Json *rt = json_get(rope, "rope_type");
        if (rt && (rt->type != JSON_STRING || strcmp(rt->string, "default")))
            return mn_error(MN_ERR_FORMAT, "%s:%d: rope_parameters.rope_type is not \"default\": RoPE scaling, which "
                                           "mesanet does not have",
                            where, rt->line);
        MN_TRY(hf_float(rope, "rope_theta", c->rope_theta, where, &c->rope_theta));
    }
    int flag;
    MN_TRY(hf_flag(j, "attention_bias", 0, where, &flag));
    if (flag) return mn_error(MN_ERR_FORMAT, "%s: attention_bias = true, which mesanet does not have", where);
    MN_TRY(hf_flag(j, "mlp_bias", 0, where, &flag));
    if (flag) return mn_error(MN_ERR_FORMAT, "%s: mlp_bias = true, which mesanet does not have", where);
    config_fla(c);
    strcpy(c->arch, "llama");
    MN_TRY(hf_int(j, "intermediate_size", 11008, -BIG, BIG, where, &c->mlp_hidden));  // (config_fla set its own)
    MN_TRY(hf_float(j, "rms_norm_eps", 1e-6f, where, &c->norm_eps));
    MN_TRY(hf_flag(j, "tie_word_embeddings", 0, where, &c->tie_embeddings));
    MN_TRY(hf_int(j, "max_position_embeddings", 2048, -BIG, BIG, where, &c->seq_len));
    const Json *type = json_get(j, "model_type");
    if (!strcmp(type->string, "mistral")) {  // MistralConfig's default sliding_window is 4096
        const Json *w = json_get(j, "sliding_window");
        if (!w || w->type != JSON_NULL) {
            MN_TRY(hf_int(j, "sliding_window", 4096, 1, BIG, where, &c->window));
            strcpy(c->mixer, "swa");
        }
    }
    MN_TRY(hf_swiglu(j, "silu", where));
    config_normalize(c);
    return config_validate(c, where);
}

// Python's float floor division a // b (CPython's float_floor_div, step by step), for the widths
// transformers rounds in floats.
static double py_floordiv(double a, double b) {
    double mod = fmod(a, b), div = (a - mod) / b;
    if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1.0;
    if (div == 0) return copysign(0.0, a / b);
    double q = floor(div);
    return div - q > 0.5 ? q + 1.0 : q;
}

// transformers' round_up_to_next_multiple_of(x, m) = int(((x + m - 1) // m) * m) on a Python float x,
// or -1 beyond the int range.
static int py_round_up(double x, int m) {
    double r = py_floordiv(x + m - 1, (double)m) * m;
    return r >= 0 && r < 2147483647.0 ? (int)r : -1;
}

// A soft cap of transformers' xLSTM config: null (none, 0) or a positive number.
static int hf_cap(const Json *j, const char *key, float fallback, const char *where, float *out) {
    const Json *v = json_get(j, key);
    *out = fallback;
    if (v && v->type == JSON_NULL) *out = 0;
    if (!v || v->type == JSON_NULL) return MN_OK;
    MN_TRY(json_float(v, key, where, out));
    if (!(*out > 0) || *out > 1e6f)
        return mn_error(MN_ERR_FORMAT, "%s:%d: \"%s\" = %g, expected null (no cap) or a positive number of at most 1e6",
                        where, v->line, key, (double)*out);
    return MN_OK;
}

// A flag that must have the value `want` (absent: the default, which is `want`), or MN_ERR_FORMAT
// saying why.
static int hf_flag_is(const Json *j, const char *key, int want, const char *why, const char *where) {
    int v;
    MN_TRY(hf_flag(j, key, want, where, &v));
    if (v != want)
        return mn_error(MN_ERR_FORMAT, "%s: \"%s\" = %s, expected %s: %s", where, key, v ? "true" : "false",
                        want ? "true" : "false", why);
    return MN_OK;
}

// Two keys of the same meaning (transformers' hidden_size / embedding_dim, num_hidden_layers /
// num_blocks): the first where present, else the second, else the default; both present must agree.
static int hf_int_pair(const Json *j, const char *a, const char *b, int fallback, int min, int max, const char *what,
                       const char *where, int *out) {
    int va, vb;
    const Json *ja = json_get(j, a), *jb = json_get(j, b);
    int has_a = ja && ja->type != JSON_NULL, has_b = jb && jb->type != JSON_NULL;
    MN_TRY(hf_int(j, a, fallback, min, max, where, &va));
    MN_TRY(hf_int(j, b, va, min, max, where, &vb));
    if (has_a && has_b && va != vb)
        return mn_error(MN_ERR_FORMAT, "%s: \"%s\" = %d but \"%s\" = %d: %s, which mesanet does not have (it has one "
                                       "value for both)", where, a, va, b, vb, what);
    *out = has_a ? va : vb;
    return MN_OK;
}

// A config.json of transformers' xLSTMForCausalLM (model_type "xlstm", the xLSTM-7B design), without
// our "mesanet" block: the xlstm architecture (mixer mlstm-large in every block), with transformers'
// defaults for absent keys and its own arithmetic for the widths (docs/spec/reference/xlstm-formats.md
// 1.1-1.2): q and k int(hidden_size * qk_dim_factor) wide, v int(hidden_size * v_dim_factor), split
// over num_heads; the SwiGLU width hidden_size * ffn_proj_factor rounded up in Python floats. What
// mesanet computes otherwise is refused by name: biases, a tied head (transformers 5 does not tie
// it), another cell epsilon, no final norm, an embedding of another width. weight_mode "fused"
// reads (its tensors are split on loading: model/weights.c).
static int config_from_hf_xlstm(ModelConfig *c, const Json *j, const char *where) {
    config_default(c);
    strcpy(c->arch, "xlstm");
    strcpy(c->mixer, "mlstm-large");
    c->embed_scale = 0;
    c->tie_embeddings = 0;
    // transformers: hidden_size defaults to 4096 and never falls back to embedding_dim (its default
    // trap); a config that gives only embedding_dim means that width, so it is read so here
    MN_TRY(hf_int_pair(j, "hidden_size", "embedding_dim", 4096, 1, 65536,
                       "an embedding of another width than the blocks", where, &c->dim));
    MN_TRY(hf_int_pair(j, "num_blocks", "num_hidden_layers", 32, -BIG, BIG,
                       "a number of blocks other than the cache's layers", where, &c->n_layers));
    MN_TRY(hf_int(j, "vocab_size", 50304, -BIG, BIG, where, &c->vocab_size));
    MN_TRY(hf_int(j, "num_heads", 8, 1, 65536, where, &c->n_heads));
    double qkf, vf, ffnf;
    MN_TRY(hf_double(j, "qk_dim_factor", 0.5, where, &qkf));
    MN_TRY(hf_double(j, "v_dim_factor", 1.0, where, &vf));
    int qk = py_int_mul(c->dim, qkf), v = py_int_mul(c->dim, vf);  // transformers: int(), no rounding
    if (qk < 1 || v < 1 || qk % c->n_heads || v % c->n_heads)
        return mn_error(MN_ERR_FORMAT, "%s: the q/k width int(hidden_size * qk_dim_factor) = %d and the v width "
                                       "int(hidden_size * v_dim_factor) = %d must be positive multiples of num_heads = %d",
                        where, qk, v, c->n_heads);
    c->head_dim = qk / c->n_heads;
    c->head_v_dim = v / c->n_heads == c->head_dim ? 0 : v / c->n_heads;
    int mult;
    MN_TRY(hf_double(j, "ffn_proj_factor", 2.667, where, &ffnf));
    MN_TRY(hf_int(j, "ffn_round_up_to_multiple_of", 64, 1, 1 << 20, where, &mult));
    c->mlp_hidden = py_round_up((double)c->dim * ffnf, mult);
    if (c->mlp_hidden < 1)
        return mn_error(MN_ERR_FORMAT, "%s: the feed-forward width hidden_size * ffn_proj_factor = %d * %g rounded up to "
                                       "%d is out of range", where, c->dim, ffnf, mult);
    MN_TRY(hf_cap(j, "gate_soft_cap", 15, where, &c->gate_cap));
    MN_TRY(hf_cap(j, "output_logit_soft_cap", 30, where, &c->logit_cap));
    MN_TRY(hf_float(j, "norm_eps", 1e-6f, where, &c->norm_eps));
    const Json *eps = json_get(j, "eps");
    if (eps && eps->type != JSON_NULL) {
        float e;
        MN_TRY(json_float(eps, "eps", where, &e));
        if (e != 1e-6f)
            return mn_error(MN_ERR_FORMAT, "%s:%d: \"eps\" = %g (the mLSTM cell's denominator epsilon), expected 1e-06: "
                                           "mesanet's is fixed", where, eps->line, (double)e);
    }
    MN_TRY(hf_flag_is(j, "use_bias", 0, "biases on the projections and norms, which mesanet does not have", where));
    MN_TRY(hf_flag_is(j, "tie_word_embeddings", 0,
                      "transformers 5 does not tie xLSTM's head (its lm_head stays its own tensor) while 4.x did, so "
                      "the model is ambiguous; untie it (save lm_head.weight) first", where));
    MN_TRY(hf_flag_is(j, "add_out_norm", 1,
                      "transformers ignores it (its out_norm is always there) but NX-AI's xlstm_large honours it, so "
                      "the model is ambiguous; mesanet's has the norm", where));
    const Json *mode = json_get(j, "weight_mode");
    if (mode && mode->type != JSON_NULL &&
        (mode->type != JSON_STRING || (strcmp(mode->string, "single") && strcmp(mode->string, "fused"))))
        return mn_error(MN_ERR_FORMAT, "%s:%d: \"weight_mode\" must be \"single\" or \"fused\"", where, mode->line);
    config_normalize(c);
    return config_validate(c, where);
}

// A number of a Hugging Face config that must be absent, null or `want` (what transformers' model
// computes with any other value, mesanet does not: `why`).
static int hf_number_is(const Json *j, const char *key, double want, const char *why, const char *where) {
    const Json *v = json_get(j, key);
    if (!v || v->type == JSON_NULL || (v->type == JSON_NUMBER && v->number == want)) return MN_OK;
    return mn_error(MN_ERR_FORMAT, "%s:%d: \"%s\" must be %g: %s", where, v->line, key, want, why);
}

// RecurrentGemma's block_types (cycled over the layers: transformers' layers_block_type is
// (block_types * 100)[:num_hidden_layers]) as our pattern: "recurrent" a hawk block, "attention" an
// swa one, runs of a name as "name*k"; a list longer than the model is cut to its layers, as there.
static int rgemma_pattern(const Json *bt, int layers, const char *where, char *out, size_t n) {
    if (bt->type != JSON_ARRAY || bt->count < 1)
        return mn_error(MN_ERR_FORMAT, "%s:%d: \"block_types\" must be a non-empty list of \"recurrent\" and "
                                       "\"attention\"", where, bt->line);
    int len = bt->count < layers ? bt->count : layers;
    size_t used = 0;
    out[0] = 0;
    for (int i = 0; i < len;) {
        const Json *v = &bt->items[i];
        if (v->type != JSON_STRING || (strcmp(v->string, "recurrent") && strcmp(v->string, "attention")))
            return mn_error(MN_ERR_FORMAT, "%s:%d: block_types[%d] must be \"recurrent\" or \"attention\" (the "
                                           "blocks RecurrentGemma has)", where, v->line, i);
        int run = 1;
        while (i + run < len && bt->items[i + run].type == JSON_STRING && !strcmp(bt->items[i + run].string, v->string))
            run++;
        const char *name = strcmp(v->string, "recurrent") ? "swa" : "hawk";
        int w = run > 1 ? snprintf(out + used, n - used, "%s%s*%d", used ? "," : "", name, run)
                        : snprintf(out + used, n - used, "%s%s", used ? "," : "", name);
        if (w < 0 || (size_t)w >= n - used)
            return mn_error(MN_ERR_FORMAT, "%s:%d: \"block_types\" makes a pattern of more than %zu characters", where,
                            bt->line, n - 1);
        used += (size_t)w;
        i += run;
    }
    return MN_OK;
}

// RoPE of a RecurrentGemma config: rope_theta and partial_rotary_factor at the top (transformers 4,
// the hub's checkpoints) or in rope_parameters (transformers 5); where both give one they must agree.
// Only the default rotation of the first half of each head is computed (partial_rotary_factor 0.5:
// transformers splits a head in int(1 / factor) chunks and rotates the first over int(head_dim *
// factor) features, which agree at 0.5 alone).
static int rgemma_rope(ModelConfig *c, const Json *j, const char *where) {
    const Json *rope = json_get(j, "rope_parameters");
    if (rope && rope->type == JSON_NULL) rope = NULL;
    if (rope && rope->type != JSON_OBJECT)
        return mn_error(MN_ERR_FORMAT, "%s:%d: \"rope_parameters\" must be an object", where, rope->line);
    MN_TRY(hf_none(j, "rope_scaling", "RoPE scaling", where));
    const Json *src[2] = {j, rope};
    float theta[2] = {10000, 10000};
    int has[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        if (!src[k]) continue;
        const Json *t = json_get(src[k], "rope_theta");
        has[k] = t && t->type != JSON_NULL;
        MN_TRY(hf_float(src[k], "rope_theta", 10000, where, &theta[k]));
        MN_TRY(hf_number_is(src[k], "partial_rotary_factor", 0.5,
                            "RecurrentGemma rotates the first half of each head (other factors split the heads "
                            "inconsistently there); mesanet computes that one", where));
    }
    if (rope) {
        MN_TRY(hf_only(rope, "rope_type", "default", where));
        if (has[0] && has[1] && theta[0] != theta[1])
            return mn_error(MN_ERR_FORMAT, "%s: rope_theta = %g but rope_parameters.rope_theta = %g: two RoPE bases", where,
                            (double)theta[0], (double)theta[1]);
    }
    c->rope_theta = has[1] ? theta[1] : theta[0];
    if (!(c->rope_theta >= 1 && c->rope_theta <= 1e9))
        return mn_error(MN_ERR_FORMAT, "%s: rope_theta = %g, expected 1 to 1e9", where, (double)c->rope_theta);
    return MN_OK;
}

// A config.json of transformers' RecurrentGemmaForCausalLM (model_type "recurrent_gemma"; Griffin),
// without our "mesanet" block: the recurrent_gemma architecture, hawk blocks for "recurrent" and swa for
// "attention" (local attention over attention_window_size tokens, the current one included: the
// window its decoding cache keeps), transformers' defaults for absent keys. transformers' arithmetic:
// head_dim = hidden_size // num_attention_heads, the MLP intermediate_size // 2 wide, lru_width
// hidden_size when absent. What mesanet does not compute is refused by name: biases on q, k, v,
// another activation, other RoPE, dropout, an embedding without its scale.
static int config_from_hf_rgemma(ModelConfig *c, const Json *j, const char *where) {
    config_default(c);
    strcpy(c->arch, "recurrent_gemma");
    MN_TRY(hf_int(j, "hidden_size", 2560, 1, 65536, where, &c->dim));
    MN_TRY(hf_int(j, "num_hidden_layers", 26, 1, CONFIG_MAX_LAYERS, where, &c->n_layers));
    MN_TRY(hf_int(j, "vocab_size", 256000, -BIG, BIG, where, &c->vocab_size));
    int inter;
    MN_TRY(hf_int(j, "intermediate_size", 3 * 2560, 2, BIG, where, &inter));
    c->mlp_hidden = inter / 2;  // RecurrentGemmaMlp: config.intermediate_size // 2
    MN_TRY(hf_int(j, "num_attention_heads", 10, 1, 65536, where, &c->n_heads));
    if (c->dim % c->n_heads)
        return mn_error(MN_ERR_FORMAT, "%s: hidden_size = %d is not a multiple of num_attention_heads = %d (transformers' "
                                       "head_dim = hidden_size // num_attention_heads would not give back the width)",
                        where, c->dim, c->n_heads);
    c->head_dim = c->dim / c->n_heads;
    MN_TRY(hf_number_is(j, "head_dim", c->head_dim, "transformers computes hidden_size // num_attention_heads", where));
    if (c->head_dim % 4)
        return mn_error(MN_ERR_FORMAT, "%s: head_dim = hidden_size / num_attention_heads = %d, but RoPE turns pairs of "
                                       "the first half of each head: expected a multiple of 4", where, c->head_dim);
    c->rope_dim = c->head_dim / 2;
    c->o_bias = 1;
    MN_TRY(hf_int(j, "num_key_value_heads", c->n_heads, 1, c->n_heads, where, &c->n_kv_heads));
    if (c->n_kv_heads == c->n_heads) c->n_kv_heads = 0;
    MN_TRY(hf_int(j, "lru_width", c->dim, 1, 1 << 20, where, &c->lru_width));
    if (c->lru_width == c->dim) c->lru_width = 0;
    MN_TRY(hf_int(j, "attention_window_size", 2048, 1, 1 << 24, where, &c->window));
    MN_TRY(hf_int(j, "conv1d_width", 4, 1, 8, where, &c->conv_size));
    const Json *cap = json_get(j, "logits_soft_cap");
    if (cap && cap->type == JSON_NULL)
        return mn_error(MN_ERR_FORMAT, "%s:%d: \"logits_soft_cap\" = null: transformers' RecurrentGemma always caps "
                                       "(tanh(logits / cap) cap), expected a positive number", where, cap->line);
    MN_TRY(hf_float(j, "logits_soft_cap", 30, where, &c->logit_cap));
    if (!(c->logit_cap > 0))
        return mn_error(MN_ERR_FORMAT, "%s: logits_soft_cap = %g, expected a positive number", where, (double)c->logit_cap);
    MN_TRY(hf_float(j, "rms_norm_eps", 1e-6f, where, &c->norm_eps));
    MN_TRY(hf_only(j, "hidden_activation", "gelu_pytorch_tanh", where));
    MN_TRY(hf_only(j, "hidden_act", "gelu_pytorch_tanh", where));
    MN_TRY(rgemma_rope(c, j, where));
    MN_TRY(hf_flag_is(j, "attention_bias", 0, "biases on q_proj, k_proj and v_proj, which mesanet does not have", where));
    MN_TRY(hf_number_is(j, "attention_dropout", 0, "dropout, which mesanet does not have", where));
    MN_TRY(hf_flag_is(j, "embeddings_scale_by_sqrt_dim", 1,
                      "transformers' RecurrentGemma scales the embedding by sqrt(hidden_size) whatever it says", where));
    MN_TRY(hf_flag(j, "tie_word_embeddings", 1, where, &c->tie_embeddings));
    const Json *bt = json_get(j, "block_types");
    if (bt && bt->type != JSON_NULL) {
        MN_TRY(rgemma_pattern(bt, c->n_layers, where, c->mixer, sizeof c->mixer));
    } else {
        snprintf(c->mixer, sizeof c->mixer, "hawk*2,swa");  // transformers' default (recurrent, recurrent, attention)
        if (c->n_layers < 3) snprintf(c->mixer, sizeof c->mixer, c->n_layers == 1 ? "hawk" : "hawk*2");
    }
    config_normalize(c);
    return config_validate(c, where);
}

int config_from_hf(ModelConfig *c, const Json *j, const char *where) {
    const Json *type = json_get(j, "model_type");
    if (type && type->type == JSON_STRING && !strcmp(type->string, "gated_deltanet"))
        return config_from_hf_delta(c, j, where, 1);
    if (type && type->type == JSON_STRING && !strcmp(type->string, "delta_net"))
        return config_from_hf_delta(c, j, where, 0);
    if (type && type->type == JSON_STRING && !strcmp(type->string, "transformer"))
        return config_from_hf_transformer(c, j, where);
    if (type && type->type == JSON_STRING && (!strcmp(type->string, "llama") || !strcmp(type->string, "mistral")))
        return config_from_hf_llama(c, j, where);
    if (type && type->type == JSON_STRING && !strcmp(type->string, "xlstm")) return config_from_hf_xlstm(c, j, where);
    if (type && type->type == JSON_STRING && !strcmp(type->string, "recurrent_gemma"))
        return config_from_hf_rgemma(c, j, where);
    if (!type || type->type != JSON_STRING || strcmp(type->string, "mesa_net"))
        return mn_error(MN_ERR_FORMAT,
                        "%s: neither a mesanet config nor a Hugging Face config with model_type \"mesa_net\", "
                        "\"gated_deltanet\", \"delta_net\", \"transformer\", \"llama\", \"mistral\", \"xlstm\" "
                        "or \"recurrent_gemma\"",
                        where);
    return config_from_hf_mesa(c, j, where);
}

// The ratio r = num / den written so that Python's int(base * r) gives back `want` (fla computes its
// widths so): the nearest double, nudged up where the product falls just short.
static double py_ratio(int num, int den, int base, int want) {
    double r = (double)num / den;
    for (int i = 0; i < 4 && py_int_mul(base, r) < want; i++) r = nextafter(r, INFINITY);
    return r;
}

// The head of a config.json as fla's GatedDeltaNetConfig / DeltaNetConfig write it (the fla
// architecture with a model of gdn-paper or deltanet-paper blocks only).
static void save_hf_delta(FILE *f, const ModelConfig *c, int gated) {
    int dv = c->head_v_dim ? c->head_v_dim : c->head_dim, q = c->n_heads * c->head_dim, v = c->n_heads * dv;
    fprintf(f, "{\n  \"model_type\": \"%s\",\n  \"architectures\": [\"%s\"],\n", gated ? "gated_deltanet" : "delta_net",
            gated ? "GatedDeltaNetForCausalLM" : "DeltaNetForCausalLM");
    fprintf(f, "  \"attn_mode\": \"chunk\",\n  \"hidden_size\": %d,\n  \"num_hidden_layers\": %d,\n", c->dim, c->n_layers);
    if (gated)
        fprintf(f, "  \"num_heads\": %d,\n  \"num_v_heads\": null,\n  \"head_dim\": %d,\n  \"expand_v\": %.17g,\n",
                c->n_heads, c->head_dim, py_ratio(dv, c->head_dim, c->head_dim, dv));
    else
        fprintf(f, "  \"num_heads\": %d,\n  \"expand_k\": %.17g,\n  \"expand_v\": %.17g,\n  \"use_beta\": true,\n"
                   "  \"use_output_norm\": true,\n  \"qk_norm\": \"l2\",\n  \"qk_activation\": \"silu\",\n",
                c->n_heads, py_ratio(q, c->dim, c->dim, q), py_ratio(v, c->dim, c->dim, v));
    fprintf(f, "  \"use_gate\": %s,\n  \"use_short_conv\": true,\n  \"conv_size\": %d,\n  \"allow_neg_eigval\": %s,\n",
            c->output_gate ? "true" : "false", c->conv_size, c->neg_eigen ? "true" : "false");
    fprintf(f, "  \"vocab_size\": %d,\n  \"intermediate_size\": %d,\n  \"hidden_ratio\": 4,\n  \"hidden_act\": \"swish\",\n",
            c->vocab_size, c->mlp_hidden);
    fprintf(f, "  \"norm_eps\": %.9g,\n  \"tie_word_embeddings\": %s,\n  \"max_position_embeddings\": %d,\n",
            (double)c->norm_eps, c->tie_embeddings ? "true" : "false", c->seq_len);
    fprintf(f, "  \"attn\": null,\n  \"initializer_range\": 0.02,\n  \"use_cache\": true,\n");
    fprintf(f, "  \"fuse_norm\": true,\n  \"fuse_swiglu\": true,\n  \"fuse_cross_entropy\": true,\n");
}

// The head of a config.json as fla's TransformerConfig writes it (the fla architecture with every
// block mha, or every block swa, and head_dim = dim / n_heads as fla's Attention has it).
static void save_hf_transformer(FILE *f, const ModelConfig *c, int swa) {
    fprintf(f, "{\n  \"model_type\": \"transformer\",\n  \"architectures\": [\"TransformerForCausalLM\"],\n");
    fprintf(f, "  \"hidden_size\": %d,\n  \"num_hidden_layers\": %d,\n  \"num_heads\": %d,\n  \"num_kv_heads\": %d,\n",
            c->dim, c->n_layers, c->n_heads, c->n_kv_heads ? c->n_kv_heads : c->n_heads);
    if (swa) fprintf(f, "  \"window_size\": %d,\n", c->window);
    else fprintf(f, "  \"window_size\": null,\n");
    fprintf(f, "  \"qkv_bias\": false,\n  \"qk_norm\": false,\n  \"rope_theta\": %.9g,\n", (double)c->rope_theta);
    fprintf(f, "  \"vocab_size\": %d,\n  \"intermediate_size\": %d,\n  \"hidden_ratio\": 4,\n  \"hidden_act\": \"swish\",\n",
            c->vocab_size, c->mlp_hidden);
    fprintf(f, "  \"norm_eps\": %.9g,\n  \"tie_word_embeddings\": %s,\n  \"max_position_embeddings\": %d,\n",
            (double)c->norm_eps, c->tie_embeddings ? "true" : "false", c->seq_len);
    fprintf(f, "  \"elementwise_affine\": true,\n  \"initializer_range\": 0.02,\n  \"use_cache\": true,\n");
    fprintf(f, "  \"fuse_norm\": true,\n  \"fuse_swiglu\": true,\n  \"fuse_cross_entropy\": true,\n");
}

// The head of a config.json as transformers' LlamaConfig writes it (the llama architecture), or
// MistralConfig's where the blocks attend to a sliding window.
static void save_hf_llama(FILE *f, const ModelConfig *c) {
    if (!strcmp(c->mixer, "swa"))
        fprintf(f, "{\n  \"model_type\": \"mistral\",\n  \"architectures\": [\"MistralForCausalLM\"],\n"
                   "  \"sliding_window\": %d,\n", c->window);
    else
        fprintf(f, "{\n  \"model_type\": \"llama\",\n  \"architectures\": [\"LlamaForCausalLM\"],\n");
    fprintf(f, "  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n  \"num_hidden_layers\": %d,\n", c->dim,
            c->mlp_hidden, c->n_layers);
    fprintf(f, "  \"num_attention_heads\": %d,\n  \"num_key_value_heads\": %d,\n  \"head_dim\": %d,\n", c->n_heads,
            c->n_kv_heads ? c->n_kv_heads : c->n_heads, c->head_dim);
    fprintf(f, "  \"hidden_act\": \"silu\",\n  \"rms_norm_eps\": %.9g,\n  \"rope_theta\": %.9g,\n  \"rope_scaling\": null,\n",
            (double)c->norm_eps, (double)c->rope_theta);
    fprintf(f, "  \"attention_bias\": false,\n  \"mlp_bias\": false,\n  \"attention_dropout\": 0.0,\n");
    fprintf(f, "  \"vocab_size\": %d,\n  \"tie_word_embeddings\": %s,\n  \"max_position_embeddings\": %d,\n",
            c->vocab_size, c->tie_embeddings ? "true" : "false", c->seq_len);
    fprintf(f, "  \"initializer_range\": 0.02,\n  \"use_cache\": true,\n  \"torch_dtype\": \"float32\",\n");
}

// The head of a config.json as fla's MesaNetConfig writes it, or of one that is ours alone.
static void save_hf_mesa(FILE *f, const ModelConfig *c) {
    // fla's MesaNetForCausalLM is exactly the fla architecture with Mesa in every block; any other
    // model is ours alone: a model_type that no other library builds a wrong model from.
    int fla_mesa = !strcmp(c->arch, "fla") && !strcmp(c->mixer, "mesa");
    if (fla_mesa)
        fprintf(f, "{\n  \"model_type\": \"mesa_net\",\n  \"architectures\": [\"MesaNetForCausalLM\"],\n"
                   "  \"attn_mode\": \"chunk\",\n");
    else
        fprintf(f, "{\n  \"model_type\": \"mesanet\",\n  \"architectures\": [\"MesanetForCausalLM\"],\n");
    fprintf(f, "  \"hidden_size\": %d,\n  \"num_hidden_layers\": %d,\n", c->dim, c->n_layers);
    fprintf(f, "  \"num_heads\": %d,\n  \"head_dim\": %d,\n  \"vocab_size\": %d,\n", c->n_heads, c->head_dim, c->vocab_size);
    fprintf(f, "  \"intermediate_size\": %d,\n", c->mlp_hidden);
    fprintf(f, "  \"norm_eps\": %.9g,\n  \"tie_word_embeddings\": %s,\n  \"max_position_embeddings\": %d,\n",
            (double)c->norm_eps, c->tie_embeddings ? "true" : "false", c->seq_len);
    if (fla_mesa) {
        fprintf(f, "  \"hidden_ratio\": 4,\n  \"hidden_act\": \"swish\",\n  \"use_output_gate\": %s,\n",
                c->output_gate ? "true" : "false");
        fprintf(f, "  \"use_short_conv\": true,\n  \"conv_size\": %d,\n  \"lambda_lower_bound\": %.9g,\n", c->conv_size,
                (double)c->lambda_min);
        fprintf(f, "  \"max_cg_step_training\": %d,\n  \"max_cg_step_decoding\": %d,\n", c->cg_steps, c->cg_steps);
        fprintf(f, "  \"fuse_norm\": true,\n  \"fuse_swiglu\": true,\n  \"fuse_cross_entropy\": true,\n");
    }
}

// The factor f (and the multiple m) with which transformers' round_up_to_next_multiple_of(hidden * f,
// m) gives back the width `want`: m the largest power of two up to 64 dividing it, f = want / hidden
// nudged until the Python arithmetic lands on it.
static double py_round_factor(int hidden, int want, int *m) {
    *m = 64;
    while (want % *m) *m /= 2;
    double f = (double)want / hidden;
    for (int i = 0; i < 8 && py_round_up(hidden * f, *m) < want; i++) f = nextafter(f, INFINITY);
    for (int i = 0; i < 8 && py_round_up(hidden * f, *m) > want; i++) f = nextafter(f, 0);
    return f;
}

// The head of a config.json as transformers' xLSTMConfig writes it (the xlstm architecture), with
// both names of the width and of the depth (transformers defaults hidden_size and num_hidden_layers
// to 4096 and 32, never to embedding_dim and num_blocks) and factors that give back our widths in
// its arithmetic. A soft cap of 0 (none) is written null, which transformers' forward reads as no
// cap; transformers 5.17's strict config types both caps float and refuses null, so such a model
// loads there only with caps (bench/results/xlstm-checkpoints-h200.txt).
static void save_hf_xlstm(FILE *f, const ModelConfig *c) {
    int dv = c->head_v_dim ? c->head_v_dim : c->head_dim, qk = c->n_heads * c->head_dim, v = c->n_heads * dv, m;
    char qkf[40], vf[40], ff[40], eps[40], gcap[40] = "null", lcap[40] = "null";
    json_float_text(qkf, sizeof qkf, py_ratio(qk, c->dim, c->dim, qk), 0);
    json_float_text(vf, sizeof vf, py_ratio(v, c->dim, c->dim, v), 0);
    json_float_text(ff, sizeof ff, py_round_factor(c->dim, c->mlp_hidden, &m), 0);
    json_float_text(eps, sizeof eps, (double)c->norm_eps, 1);
    if (c->gate_cap > 0) json_float_text(gcap, sizeof gcap, (double)c->gate_cap, 1);
    if (c->logit_cap > 0) json_float_text(lcap, sizeof lcap, (double)c->logit_cap, 1);
    fprintf(f, "{\n  \"model_type\": \"xlstm\",\n  \"architectures\": [\"xLSTMForCausalLM\"],\n");
    fprintf(f, "  \"vocab_size\": %d,\n  \"hidden_size\": %d,\n  \"embedding_dim\": %d,\n", c->vocab_size, c->dim, c->dim);
    fprintf(f, "  \"num_hidden_layers\": %d,\n  \"num_blocks\": %d,\n  \"num_heads\": %d,\n", c->n_layers, c->n_layers,
            c->n_heads);
    fprintf(f, "  \"qk_dim_factor\": %s,\n  \"v_dim_factor\": %s,\n", qkf, vf);
    fprintf(f, "  \"ffn_proj_factor\": %s,\n  \"ffn_round_up_to_multiple_of\": %d,\n", ff, m);
    fprintf(f, "  \"gate_soft_cap\": %s,\n  \"output_logit_soft_cap\": %s,\n", gcap, lcap);
    fprintf(f, "  \"norm_eps\": %s,\n  \"eps\": 1e-06,\n  \"use_bias\": false,\n  \"add_out_norm\": true,\n", eps);
    fprintf(f, "  \"norm_reduction_force_float32\": true,\n  \"tie_word_embeddings\": false,\n"
               "  \"weight_mode\": \"single\",\n");
    fprintf(f, "  \"mode\": \"inference\",\n  \"chunk_size\": 64,\n  \"chunkwise_kernel\": \"chunkwise--native_autograd\",\n"
               "  \"sequence_kernel\": \"native_sequence__native\",\n  \"step_kernel\": \"native\",\n");
    fprintf(f, "  \"return_last_states\": true,\n  \"autocast_kernel_dtype\": \"bfloat16\",\n"
               "  \"inference_state_dtype\": \"float32\",\n  \"max_inference_chunksize\": 16384,\n");
    fprintf(f, "  \"use_cache\": true,\n  \"torch_dtype\": \"float32\",\n");
}

// The head of a config.json as transformers' RecurrentGemmaConfig writes it (the recurrent_gemma
// architecture), RoPE both as the hub's checkpoints give it (rope_theta and partial_rotary_factor at
// the top: transformers 4) and as transformers 5 keeps it (rope_parameters), the same values;
// block_types one entry a block of the pattern (transformers cycles them over the layers as our
// pattern is), intermediate_size twice the MLP's width.
static void save_hf_rgemma(FILE *f, const ModelConfig *c) {
    char eps[40], cap[40], theta[40];
    json_float_text(eps, sizeof eps, (double)c->norm_eps, 1);
    json_float_text(cap, sizeof cap, (double)c->logit_cap, 1);
    json_float_text(theta, sizeof theta, (double)c->rope_theta, 1);
    fprintf(f, "{\n  \"model_type\": \"recurrent_gemma\",\n  \"architectures\": [\"RecurrentGemmaForCausalLM\"],\n");
    fprintf(f, "  \"vocab_size\": %d,\n  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n", c->vocab_size, c->dim,
            2 * c->mlp_hidden);
    fprintf(f, "  \"num_hidden_layers\": %d,\n  \"num_attention_heads\": %d,\n  \"num_key_value_heads\": %d,\n",
            c->n_layers, c->n_heads, c->n_kv_heads ? c->n_kv_heads : c->n_heads);
    fprintf(f, "  \"head_dim\": %d,\n  \"lru_width\": %d,\n  \"attention_window_size\": %d,\n  \"conv1d_width\": %d,\n",
            c->head_dim, c->lru_width ? c->lru_width : c->dim, c->window, c->conv_size);
    fprintf(f, "  \"block_types\": [");
    int n = mixer_pattern_check(c->mixer, 0);
    for (int i = 0; i < n; i++)
        fprintf(f, "%s\"%s\"", i ? ", " : "", strcmp(mixer_at(c, i)->name, "swa") ? "recurrent" : "attention");
    fprintf(f, "],\n  \"logits_soft_cap\": %s,\n  \"rms_norm_eps\": %s,\n", cap, eps);
    fprintf(f, "  \"hidden_activation\": \"gelu_pytorch_tanh\",\n  \"partial_rotary_factor\": 0.5,\n"
               "  \"rope_theta\": %s,\n  \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": %s, "
               "\"partial_rotary_factor\": 0.5},\n", theta, theta);
    fprintf(f, "  \"attention_bias\": false,\n  \"attention_dropout\": 0.0,\n  \"embeddings_scale_by_sqrt_dim\": true,\n");
    fprintf(f, "  \"w_init_variance_scale\": 0.01,\n  \"tie_word_embeddings\": %s,\n  \"use_cache\": true,\n"
               "  \"torch_dtype\": \"float32\",\n  \"pad_token_id\": 0,\n", c->tie_embeddings ? "true" : "false");
}

void config_to_hf(FILE *f, const ModelConfig *c) {
    int fla = !strcmp(c->arch, "fla"), gdn = !strcmp(c->mixer, "gdn-paper"), delta = !strcmp(c->mixer, "deltanet-paper");
    int mha = !strcmp(c->mixer, "mha"), swa = !strcmp(c->mixer, "swa");
    if (fla && (gdn || delta)) save_hf_delta(f, c, gdn);
    else if (!strcmp(c->arch, "llama")) save_hf_llama(f, c);
    else if (!strcmp(c->arch, "xlstm")) save_hf_xlstm(f, c);
    else if (!strcmp(c->arch, "recurrent_gemma")) save_hf_rgemma(f, c);
    else if (fla && (mha || swa) && c->n_heads * c->head_dim == c->dim && !c->rope_dim && !c->o_bias)
        save_hf_transformer(f, c, swa);
    else save_hf_mesa(f, c);
    fprintf(f, "  \"bos_token_id\": %d,\n  \"eos_token_id\": %d,\n", c->vocab_size > 50256 ? 50256 : c->vocab_size - 1,
            c->vocab_size > 50256 ? 50256 : c->vocab_size - 1);
}
