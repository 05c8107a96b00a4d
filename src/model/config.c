/*
 * Model configs: defaults, named presets, JSON files, validation.
 */
#include "config.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/atomic_file.h"
#include "core/common.h"
#include "core/json.h"
#include "mixers/mixer.h"
#include "model/model.h"

void config_default(ModelConfig *c) {
    memset(c, 0, sizeof *c);
    strcpy(c->mixer, "mesa");
    strcpy(c->arch, "paper");
    c->conv_size = 4;
    c->norm_eps = 1e-6f;
    c->logit_cap = 30;
    c->embed_scale = 1;
    c->tie_embeddings = 1;
    c->shared_onorm = 0;
    c->lambda_min = 0.25f;
    c->lambda_init = 1.0f;
    c->seq_len = 2048;
    c->gate_bound = 2048;  // h_max = the training context length
    c->resid_scale = 1;
    c->cg_steps = 30;
    c->rope_theta = 10000;
    c->window = 1024;
    strcpy(c->head, "lm");
}

// fla's MesaNetForCausalLM: no embedding scale, no soft cap, untied head,
// SwiGLU width int(8/3 D) rounded up to 256, no forget-gate bound, one o_norm
// weight for all heads (its config.json: hidden_ratio 4, norm_eps 1e-6).
static void config_fla(ModelConfig *c) {
    strcpy(c->arch, "fla");
    c->embed_scale = 0;
    c->logit_cap = 0;
    c->tie_embeddings = 0;
    c->gate_bound = 0;
    c->shared_onorm = 1;
    c->mlp_hidden = 256 * ((c->dim * 8 / 3 + 255) / 256);
    c->resid_scale = 0;
}

typedef struct {
    const char *name;
    int vocab, dim, layers, heads, head_dim, seq_len, fla;
    const char *about;
} Preset;

static const Preset presets[] = {
    {"tiny", 0, 32, 2, 2, 16, 64, 0, "2 blocks, D=32: for tests"},
    {"demo", 0, 192, 4, 3, 64, 256, 0, "~3M parameters with a 4096-token BPE: the CPU demo"},
    {"125m", 50304, 768, 12, 6, 128, 2048, 0, "~131M, the paper's small size class (GPT-2 vocabulary)"},
    {"400m", 50304, 1024, 24, 8, 128, 2048, 0, "~378M, the paper's medium size class"},
    {"1b", 50304, 2048, 16, 16, 128, 2048, 0, "~975M, the paper's large size class"},
    {"fla-162m", 50304, 768, 12, 6, 128, 2048, 1, "fla's MesaNetForCausalLM, hidden 768, 12 layers (162M)"},
    {"fla-412m", 50304, 1024, 24, 8, 128, 2048, 1, "fla's MesaNetForCausalLM, hidden 1024, 24 layers (412M)"},
};

// The sizes that have parameter-matched presets "SIZE-MIXER" (config.h).
const char *const config_matched_sizes[] = {"demo", "125m", "400m", NULL};

int config_param_count(const ModelConfig *c, size_t *total, size_t *mixers, size_t *mlps) {
    ModelConfig k = *c;
    if (k.vocab_size == 0) k.vocab_size = 4096;  // from the data: counted with the demo's BPE
    ParamSpec *specs;
    int n;
    MN_TRY(model_specs(&k, &specs, &n));
    size_t t = 0, mx = 0, ml = 0;
    for (int i = 0; i < n; i++) {
        t += specs[i].numel;
        if (specs[i].role == ROLE_MIXER) mx += specs[i].numel;
        if (specs[i].role == ROLE_FFN) ml += specs[i].numel;
    }
    free(specs);
    if (total) *total = t;
    if (mixers) *mixers = mx;
    if (mlps) *mlps = ml;
    return MN_OK;
}

int config_matched(ModelConfig *c, const char *size, const char *mixer) {
    int known = 0;
    for (int i = 0; config_matched_sizes[i]; i++) known |= !strcmp(config_matched_sizes[i], size);
    if (!known) return mn_error(MN_ERR_ARG, "no parameter-matched presets at size '%s' (sizes: demo, 125m, 400m)", size);
    const MixerOps *ops = mixer_find(mixer);  // one name, not a pattern (the error lists the known ones)
    if (!ops) return MN_ERR_ARG;
    ModelConfig ref;
    MN_TRY(config_preset(&ref, size));
    *c = ref;
    snprintf(c->mixer, sizeof c->mixer, "%s", ops->name);
    if (!strcmp(ops->name, ref.mixer)) return MN_OK;  // the reference: the preset itself
    // the size preset's fields with the mixer's own settings, and nothing it does not read
    if (ops->preset) ops->preset(c);
    config_normalize(c);
    // The count is affine in mlp_hidden: the nearest multiple of the step to the reference's count.
    size_t target, p0, p1;
    MN_TRY(config_param_count(&ref, &target, NULL, NULL));
    MN_TRY(config_param_count(c, &p0, NULL, NULL));
    c->mlp_hidden += CONFIG_MATCH_STEP;
    MN_TRY(config_param_count(c, &p1, NULL, NULL));
    c->mlp_hidden -= CONFIG_MATCH_STEP;
    double slope = (double)(p1 - p0), steps = floor(((double)target - (double)p0) / slope + 0.5);
    if (c->mlp_hidden + steps * CONFIG_MATCH_STEP < CONFIG_MATCH_STEP)
        return mn_error(MN_ERR_ARG, "%s-%s: the mixer's parameters exceed the reference's by more than its MLPs hold",
                        size, ops->name);
    c->mlp_hidden += (int)steps * CONFIG_MATCH_STEP;
    return MN_OK;
}

int config_preset(ModelConfig *c, const char *name) {
    char known[256] = "";
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        const Preset *p = &presets[i];
        if (!strcmp(p->name, name)) {
            config_default(c);
            c->vocab_size = p->vocab;
            c->dim = p->dim;
            c->n_layers = p->layers;
            c->n_heads = p->heads;
            c->head_dim = p->head_dim;
            c->mlp_hidden = 3 * p->dim;  // Griffin's expansion (our default; spec: the paper lost the number)
            c->seq_len = p->seq_len;
            c->gate_bound = (float)p->seq_len;
            if (p->fla) config_fla(c);
            config_normalize(c);
            return MN_OK;
        }
        strcat(known, i ? ", " : "");
        strcat(known, p->name);
    }
    char mixers[192] = "";
    for (int i = 0; mixer_all[i]; i++) {
        strcat(mixers, i ? ", " : "");
        strcat(mixers, mixer_all[i]->name);
    }
    for (int i = 0; config_matched_sizes[i]; i++) {
        size_t n = strlen(config_matched_sizes[i]);
        if (strncmp(name, config_matched_sizes[i], n) || name[n] != '-') continue;
        char size[16];
        snprintf(size, sizeof size, "%s", config_matched_sizes[i]);
        if (!config_matched(c, size, name + n + 1)) return MN_OK;
        return mn_error(MN_ERR_ARG,
                        "unknown config '%.64s': '%.64s' is not a mixer; a parameter-matched preset is SIZE-MIXER with "
                        "SIZE one of demo, 125m, 400m and MIXER one of %s",
                        name, name + n + 1, mixers);
    }
    return mn_error(MN_ERR_ARG,
                    "unknown config '%.128s': not a file, nor a preset (%s), nor a parameter-matched preset SIZE-MIXER "
                    "(SIZE: demo, 125m, 400m; MIXER: %s; e.g. 125m-gdn)",
                    name, known, mixers);
}

// Field table: the JSON keys, where they go, and the values a model can be built with (checked
// by config_validate). The bounds keep every product the model forms from the sizes inside the
// types that hold it, and every float finite through the initialisation: lambda_init -
// lambda_min goes through log(expm1(.)), which overflows a double near 710.
typedef enum { F_INT, F_FLOAT, F_BOOL, F_STR } FieldType;
typedef struct {
    const char *key;
    FieldType type;
    size_t offset;
    size_t size;       // F_STR: buffer size
    double min, max;   // F_INT, F_FLOAT: the valid range (inclusive; see config_validate for the open ends)
    const char *what;  // for messages: what the number is
    unsigned uses;     // the mixers' fields mask (CF_*) of those that read it; 0: the backbone's
} Field;

#define FIELD(k, t, lo, hi, w) {#k, t, offsetof(ModelConfig, k), sizeof(((ModelConfig *)0)->k), lo, hi, w, 0}
#define MIXER_FIELD(k, t, lo, hi, w, u) {#k, t, offsetof(ModelConfig, k), sizeof(((ModelConfig *)0)->k), lo, hi, w, u}
static const Field fields[] = {
    FIELD(mixer, F_STR, 0, 0, "the sequence mixer, or a pattern of them"),
    FIELD(arch, F_STR, 0, 0, "the architecture"),
    FIELD(vocab_size, F_INT, 0, 1 << 24, "the vocabulary size (0: from the data)"),
    FIELD(dim, F_INT, 1, 65536, "the model width"),
    FIELD(n_layers, F_INT, 1, CONFIG_MAX_LAYERS, "the number of blocks"),
    FIELD(n_heads, F_INT, 1, 1024, "the number of heads"),
    FIELD(head_dim, F_INT, 1, 1024, "the head width"),
    MIXER_FIELD(head_v_dim, F_INT, 0, 4096, "the value head width (0: head_dim)", CF_HEAD_V_DIM),
    MIXER_FIELD(mlp_hidden, F_INT, 1, 1 << 20, "the MLP width", CF_FFN),
    MIXER_FIELD(conv_size, F_INT, 1, 8, "the short convolution's width", CF_CONV),
    FIELD(norm_eps, F_FLOAT, 0, 1, "the RMSNorm epsilon"),
    FIELD(logit_cap, F_FLOAT, 0, 1e6, "the logits' soft cap (0: none)"),
    FIELD(embed_scale, F_BOOL, 0, 1, "the embedding scale flag"),
    FIELD(tie_embeddings, F_BOOL, 0, 1, "the tied head flag"),
    MIXER_FIELD(shared_onorm, F_BOOL, 0, 1, "the shared o_norm flag", CF_ONORM),
    MIXER_FIELD(output_gate, F_BOOL, 0, 1, "the output gate flag", CF_OUTPUT_GATE),
    MIXER_FIELD(lambda_min, F_FLOAT, 0, 100, "the lower bound of lambda", CF_RIDGE),
    MIXER_FIELD(lambda_init, F_FLOAT, 0, 100, "the initial lambda", CF_RIDGE),
    MIXER_FIELD(gate_bound, F_FLOAT, 0, 1e9, "the forget-gate bound (0: none)", CF_GATE_BOUND),
    // at least 2: a sequence of one token has no next token to learn from, and the forget-gate
    // bound, which follows the training context, must exceed 1
    FIELD(seq_len, F_INT, 2, 1 << 24, "the training context length"),
    FIELD(resid_scale, F_FLOAT, 0, 10, "the residual init exponent"),
    MIXER_FIELD(cg_steps, F_INT, 0, 10000, "the CG steps in training", CF_RIDGE),
    MIXER_FIELD(neg_eigen, F_BOOL, 0, 1, "the negative-eigenvalue flag", CF_NEG_EIGEN),
    MIXER_FIELD(rope_theta, F_FLOAT, 1, 1e9, "the RoPE base", CF_ROPE),
    MIXER_FIELD(window, F_INT, 0, 1 << 24, "swa's window", CF_WINDOW),
    MIXER_FIELD(n_kv_heads, F_INT, 0, 1024, "the key/value heads (0: n_heads)", CF_KV_HEADS),
    FIELD(head, F_STR, 0, 0, "the output head"),
};
#define NFIELDS (sizeof fields / sizeof fields[0])

// The mixer fields (CF_*) the config's blocks read: their mixers' own, and CF_FFN where a block's
// feed-forward part takes its width from mlp_hidden. 0 for an invalid pattern.
static unsigned used_fields(const ModelConfig *c) {
    int n = mixer_pattern_check(c->mixer, 0);
    unsigned used = 0;
    for (int l = 0; l < n; l++) {
        const MixerOps *ops = mixer_at(c, l);
        used |= ops->fields;
        if (ops->block.ffn != FFN_NONE && !ops->block.ffn_hidden) used |= CF_FFN;
    }
    return used;
}

static int applies(const ModelConfig *c, const Field *f) { return !f->uses || (f->uses & used_fields(c)); }

// The mixers that read field f, for messages ("swa" or "mha, swa").
static void readers(const Field *f, char *out, size_t n) {
    out[0] = 0;
    if (f->uses == CF_FFN) {
        snprintf(out, n, "the blocks with a feed-forward part of mlp_hidden's width");
        return;
    }
    for (int i = 0; mixer_all[i]; i++)
        if (mixer_all[i]->fields & f->uses)
            snprintf(out + strlen(out), n - strlen(out), "%s%s", out[0] ? ", " : "", mixer_all[i]->name);
}

static int same_value(const ModelConfig *a, const ModelConfig *b, const Field *f) {
    const char *pa = (const char *)a + f->offset, *pb = (const char *)b + f->offset;
    return f->type == F_STR ? !strncmp(pa, pb, f->size) : !memcmp(pa, pb, f->size);
}

// The fields the config's mixers do not read back at their defaults (presets set some of them for
// every mixer: the forget-gate bound follows the context length), so that two configs of the same
// model compare equal and a saved config holds only what the model reads.
void config_normalize(ModelConfig *c) {
    if (mixer_pattern_check(c->mixer, 0) < 0) return;  // (validation names the pattern's fault)
    ModelConfig d;
    config_default(&d);
    for (size_t k = 0; k < NFIELDS; k++)
        if (!applies(c, &fields[k])) memcpy((char *)c + fields[k].offset, (const char *)&d + fields[k].offset, fields[k].size);
}

static void field_text(const ModelConfig *c, const Field *f, char *buf, size_t n);

// The switches that no block's mixer reads off (at their defaults, 0): one turned on there would be
// silently ignored. (The other fields that no mixer reads are reset by config_normalize, and refused
// where a config file gives them: config_from_json.)
static int check_fields_apply(const ModelConfig *c, const char *where) {
    ModelConfig d;
    config_default(&d);
    const unsigned switches = CF_NEG_EIGEN | CF_HEAD_V_DIM | CF_KV_HEADS | CF_OUTPUT_GATE;
    for (size_t k = 0; k < NFIELDS; k++) {
        const Field *f = &fields[k];
        if (!(f->uses & switches) || applies(c, f) || same_value(c, &d, f)) continue;
        char value[96], who[256];
        field_text(c, f, value, sizeof value);
        readers(f, who, sizeof who);
        return mn_error(MN_ERR_ARG, "%s: %s = %s does not apply to mixer \"%s\": only %s read it", where, f->key, value,
                        c->mixer, who);
    }
    return MN_OK;
}

static const Field *find_field(const char *key) {
    for (size_t k = 0; k < NFIELDS; k++)
        if (!strcmp(fields[k].key, key)) return &fields[k];
    return NULL;
}

// A JSON number as an int, or MN_ERR_FORMAT naming the key: checked to be a whole number within
// the int range before the conversion (which is undefined behaviour outside it).
static int json_int(const Json *v, const char *key, const char *where, int *out) {
    if (v->type != JSON_NUMBER && v->type != JSON_BOOL)
        return mn_error(MN_ERR_FORMAT, "%s:%d: \"%s\" must be a number", where, v->line, key);
    double x = v->number;
    if (!(x == floor(x) && fabs(x) <= 1e9))  // (NaN fails the comparison)
        return mn_error(MN_ERR_FORMAT, "%s:%d: \"%s\" must be an integer of at most 1e9 in size, got %g", where, v->line,
                        key, x);
    *out = (int)x;
    return MN_OK;
}

// A JSON number as a float, refused unless finite and within the float range (converting a larger
// double is undefined behaviour, and an infinity would be saved as a config that cannot be read).
static int json_float(const Json *v, const char *key, const char *where, float *out) {
    if (v->type != JSON_NUMBER)
        return mn_error(MN_ERR_FORMAT, "%s:%d: \"%s\" must be a number", where, v->line, key);
    if (!isfinite(v->number) || fabs(v->number) > FLT_MAX)
        return mn_error(MN_ERR_FORMAT, "%s:%d: \"%s\" = %g is not a finite number in the float range", where, v->line, key,
                        v->number);
    *out = (float)v->number;
    return MN_OK;
}

// true / false, or the numbers 0 and 1.
static int json_flag(const Json *v, const char *key, const char *where, int *out) {
    if ((v->type != JSON_BOOL && v->type != JSON_NUMBER) || !(v->number == 0 || v->number == 1))
        return mn_error(MN_ERR_FORMAT, "%s:%d: \"%s\" must be true or false", where, v->line, key);
    *out = v->number == 1;
    return MN_OK;
}

static int set_field(ModelConfig *c, const Field *f, const Json *v, const char *path) {
    char *dst = (char *)c + f->offset;
    switch (f->type) {
    case F_STR:
        if (v->type != JSON_STRING || v->string_len >= f->size || strlen(v->string) != v->string_len)
            return mn_error(MN_ERR_FORMAT, "%s:%d: \"%s\" must be a string shorter than %zu characters", path, v->line,
                            f->key, f->size);
        strcpy(dst, v->string);
        return MN_OK;
    case F_FLOAT: return json_float(v, f->key, path, (float *)dst);
    case F_BOOL: return json_flag(v, f->key, path, (int *)dst);
    case F_INT: return json_int(v, f->key, path, (int *)dst);
    }
    return MN_ERR_ARG;
}

// Applies the members of a JSON object of our fields (optionally based on a "preset") to c;
// unknown keys are refused, and with `strict` (a config written by hand) keys that no block's
// mixer reads too. A config.json we wrote (strict 0) may hold such keys from before they were
// left out: they are reset to their defaults.
static int config_from_json(ModelConfig *c, const Json *j, const char *where, int strict) {
    if (j->type != JSON_OBJECT) return mn_error(MN_ERR_FORMAT, "%s: a config must be a JSON object", where);
    const Json *base = json_get(j, "preset");
    if (base) {
        if (base->type != JSON_STRING)
            return mn_error(MN_ERR_FORMAT, "%s:%d: \"preset\" must be a string", where, base->line);
        MN_TRY(config_preset(c, base->string));
    } else {
        config_default(c);
    }
    for (int i = 0; i < j->count; i++) {
        const Json *v = &j->items[i];
        if (!strcmp(v->key, "preset")) continue;
        const Field *fd = find_field(v->key);
        if (!fd) return mn_error(MN_ERR_FORMAT, "%s:%d: unknown key \"%s\"", where, v->line, v->key);
        MN_TRY(set_field(c, fd, v, where));
    }
    for (int i = 0; i < j->count && strict && mixer_pattern_check(c->mixer, 0) > 0; i++) {
        const Field *fd = find_field(j->items[i].key);
        if (!fd || applies(c, fd)) continue;
        char who[256];
        readers(fd, who, sizeof who);
        return mn_error(MN_ERR_FORMAT, "%s:%d: \"%s\" does not apply to mixer \"%s\": only %s read it", where,
                        j->items[i].line, fd->key, c->mixer, who);
    }
    config_normalize(c);
    return config_validate(c, where);
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

static int config_from_hf_delta(ModelConfig *c, const Json *j, const char *where, int gated);
static int config_from_hf_transformer(ModelConfig *c, const Json *j, const char *where);
static int config_from_hf_llama(ModelConfig *c, const Json *j, const char *where);

// A config.json written by fla's MesaNetConfig (Hugging Face), without our own
// "mesanet" block: fla's architecture with its sizes (fla's GatedDeltaNet and DeltaNet configs:
// config_from_hf_delta). Each number is range-checked as it is read; config_validate then checks
// the whole.
static int config_from_hf(ModelConfig *c, const Json *j, const char *where) {
    const Json *type = json_get(j, "model_type");
    if (type && type->type == JSON_STRING && !strcmp(type->string, "gated_deltanet"))
        return config_from_hf_delta(c, j, where, 1);
    if (type && type->type == JSON_STRING && !strcmp(type->string, "delta_net"))
        return config_from_hf_delta(c, j, where, 0);
    if (type && type->type == JSON_STRING && !strcmp(type->string, "transformer"))
        return config_from_hf_transformer(c, j, where);
    if (type && type->type == JSON_STRING && (!strcmp(type->string, "llama") || !strcmp(type->string, "mistral")))
        return config_from_hf_llama(c, j, where);
    if (!type || type->type != JSON_STRING || strcmp(type->string, "mesa_net"))
        return mn_error(MN_ERR_FORMAT,
                        "%s: neither a mesanet config nor a Hugging Face config with model_type \"mesa_net\", "
                        "\"gated_deltanet\", \"delta_net\", \"transformer\", \"llama\" or \"mistral\"",
                        where);
    config_default(c);
    enum { BIG = 1 << 30 };  // beyond every valid size (config_validate names the real bound)
    MN_TRY(hf_int(j, "hidden_size", 2048, 1, 65536, where, &c->dim));  // bounded here: config_fla multiplies it
    MN_TRY(hf_int(j, "num_hidden_layers", 24, -BIG, BIG, where, &c->n_layers));
    MN_TRY(hf_int(j, "num_heads", 16, -BIG, BIG, where, &c->n_heads));
    MN_TRY(hf_int(j, "head_dim", 128, -BIG, BIG, where, &c->head_dim));
    MN_TRY(hf_int(j, "vocab_size", 32000, -BIG, BIG, where, &c->vocab_size));
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
    MN_TRY(hf_flag(j, "use_output_gate", 0, where, &c->output_gate));
    MN_TRY(hf_int(j, "conv_size", 4, -BIG, BIG, where, &c->conv_size));
    MN_TRY(hf_float(j, "lambda_lower_bound", 0.25f, where, &c->lambda_min));
    MN_TRY(hf_int(j, "max_cg_step_training", 30, -BIG, BIG, where, &c->cg_steps));
    MN_TRY(hf_int(j, "max_position_embeddings", 2048, -BIG, BIG, where, &c->seq_len));
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
    enum { BIG = 1 << 30 };
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
    config_fla(c);
    const Json *inter = json_get(j, "intermediate_size");
    if (inter && inter->type != JSON_NULL) {
        MN_TRY(hf_int(j, "intermediate_size", 0, -BIG, BIG, where, &c->mlp_hidden));
    } else {
        int ratio;
        MN_TRY(hf_int(j, "hidden_ratio", 4, 1, 64, where, &ratio));
        int h = c->dim * ratio * 2 / 3;
        c->mlp_hidden = 256 * ((h + 255) / 256);
    }
    MN_TRY(hf_float(j, "norm_eps", 1e-6f, where, &c->norm_eps));
    MN_TRY(hf_flag(j, "tie_word_embeddings", 0, where, &c->tie_embeddings));
    MN_TRY(hf_flag(j, "use_gate", gated, where, &c->output_gate));
    MN_TRY(hf_flag(j, "allow_neg_eigval", 0, where, &c->neg_eigen));
    MN_TRY(hf_int(j, "conv_size", 4, -BIG, BIG, where, &c->conv_size));
    MN_TRY(hf_int(j, "max_position_embeddings", 2048, -BIG, BIG, where, &c->seq_len));
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
    enum { BIG = 1 << 30 };
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
    config_fla(c);
    const Json *inter = json_get(j, "intermediate_size");
    if (inter && inter->type != JSON_NULL) {
        MN_TRY(hf_int(j, "intermediate_size", 0, -BIG, BIG, where, &c->mlp_hidden));
    } else {
        int ratio;
        MN_TRY(hf_int(j, "hidden_ratio", 4, 1, 64, where, &ratio));
        int h = c->dim * ratio * 2 / 3;
        c->mlp_hidden = 256 * ((h + 255) / 256);
    }
    MN_TRY(hf_float(j, "norm_eps", 1e-6f, where, &c->norm_eps));
    MN_TRY(hf_flag(j, "tie_word_embeddings", 0, where, &c->tie_embeddings));
    MN_TRY(hf_int(j, "max_position_embeddings", 2048, -BIG, BIG, where, &c->seq_len));
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
    enum { BIG = 1 << 30 };
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

// Whether `spec` names a config file: 1 for a regular file, 0 for nothing there (then it is a
// preset name), or an error saying what else it is.
static int config_file_kind(const char *spec, int *is_file) {
    struct stat st;
    *is_file = 0;
    if (stat(spec, &st)) {
        if (errno == ENOENT || errno == ENOTDIR) return MN_OK;
        return mn_error(MN_ERR_IO, "%s: cannot read the config: %s", spec, strerror(errno));
    }
    if (S_ISDIR(st.st_mode)) {
        char inner[4096];
        snprintf(inner, sizeof inner, "%s/config.json", spec);
        return mn_error(MN_ERR_IO, "%s: is a directory, not a config file%s%s", spec,
                        access(inner, F_OK) ? "" : "; the run's config is ", access(inner, F_OK) ? "" : inner);
    }
    if (!S_ISREG(st.st_mode)) return mn_error(MN_ERR_IO, "%s: not a regular file (a config is a JSON file)", spec);
    if (access(spec, R_OK)) return mn_error(MN_ERR_IO, "%s: cannot read the config: %s", spec, strerror(errno));
    *is_file = 1;
    return MN_OK;
}

int config_load(ModelConfig *c, const char *spec) {
    if (!spec || !spec[0]) return mn_error(MN_ERR_ARG, "config: empty name (a preset or a JSON file)");
    int is_file, kind = config_file_kind(spec, &is_file);
    if (kind) {  // a preset's name is still that preset where a directory of that name is at hand
        char why[1024];
        snprintf(why, sizeof why, "%s", mn_last_error());
        return config_preset(c, spec) ? mn_error(kind, "%s", why) : MN_OK;
    }
    if (!is_file) return config_preset(c, spec);
    char *text;
    size_t n;
    MN_TRY(file_read_all(spec, (size_t)64 << 20, &text, &n));
    Json *j;
    int parsed = json_parse(text, n, spec, &j);
    free(text);
    MN_TRY(parsed);
    const Json *ours = json_get(j, "mesanet");
    int st = ours ? config_from_json(c, ours, spec, 0)
                  : json_get(j, "model_type") ? config_from_hf(c, j, spec) : config_from_json(c, j, spec, 1);
    json_free(j);
    return st;
}

// A field's value as it is written in a config.json (also for messages).
static void field_text(const ModelConfig *c, const Field *f, char *buf, size_t n) {
    const char *src = (const char *)c + f->offset;
    switch (f->type) {
    case F_STR: snprintf(buf, n, "\"%s\"", src); break;
    case F_INT: snprintf(buf, n, "%d", *(const int *)src); break;
    case F_BOOL: snprintf(buf, n, "%s", *(const int *)src ? "true" : "false"); break;
    case F_FLOAT: snprintf(buf, n, "%.9g", (double)*(const float *)src); break;  // 9 digits: exact for a float
    }
}

// config.json as Hugging Face and fla read it (model_type "mesa_net"), with
// our complete config in a "mesanet" block that takes precedence on loading.
// Only a valid config is written, so that every saved config loads again.
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

int config_save(const ModelConfig *c, const char *path) {
    MN_TRY(config_validate(c, path));
    AtomicFile af;
    MN_TRY(af_open(&af, path));
    FILE *f = af.f;
    int fla = !strcmp(c->arch, "fla"), gdn = !strcmp(c->mixer, "gdn-paper"), delta = !strcmp(c->mixer, "deltanet-paper");
    if (fla && (gdn || delta)) {
        save_hf_delta(f, c, gdn);
        goto ids;
    }
    if (!strcmp(c->arch, "llama")) {
        save_hf_llama(f, c);
        goto ids;
    }
    int mha = !strcmp(c->mixer, "mha"), swa = !strcmp(c->mixer, "swa");
    if (fla && (mha || swa) && c->n_heads * c->head_dim == c->dim) {
        save_hf_transformer(f, c, swa);
        goto ids;
    }
    // fla's MesaNetForCausalLM is exactly the fla architecture with Mesa in every block; any other
    // model is ours alone: a model_type that no other library builds a wrong model from.
    int fla_mesa = fla && !strcmp(c->mixer, "mesa");
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
ids:
    fprintf(f, "  \"bos_token_id\": %d,\n  \"eos_token_id\": %d,\n", c->vocab_size > 50256 ? 50256 : c->vocab_size - 1,
            c->vocab_size > 50256 ? 50256 : c->vocab_size - 1);
    fprintf(f, "  \"mesanet\": {\n");
    size_t last = 0;  // the fields the model reads (config_normalize left the others at their defaults)
    for (size_t k = 0; k < NFIELDS; k++)
        if (applies(c, &fields[k])) last = k;
    for (size_t k = 0; k < NFIELDS; k++) {
        if (!applies(c, &fields[k])) continue;
        char value[96];  // room for the longest string field and its quotes
        field_text(c, &fields[k], value, sizeof value);  // strings: validated names, nothing to escape
        fprintf(f, "    \"%s\": %s%s\n", fields[k].key, value, k < last ? "," : "");
    }
    fprintf(f, "  }\n}\n");
    return af_commit(&af);  // refuses to rename a stream that failed
}

void config_mixer_fields(const ModelConfig *c, char *out, size_t n) {
    size_t len = 0;
    out[0] = 0;
    for (size_t k = 0; k < NFIELDS && len < n; k++) {
        const Field *f = &fields[k];
        if (!f->uses || f->uses == CF_FFN || !applies(c, f)) continue;
        char value[96];
        field_text(c, f, value, sizeof value);
        snprintf(out + len, n - len, "%s%s %s", len ? ", " : "", f->key, value);
        len = strlen(out);
    }
}

int config_diff(const ModelConfig *a, const ModelConfig *b, char *out, size_t n) {
    for (size_t k = 0; k < NFIELDS; k++) {
        const Field *f = &fields[k];
        // a field that neither model reads does not make them differ (mixer, which decides it, is first)
        if (same_value(a, b, f) || (!applies(a, f) && !applies(b, f))) continue;
        char va[96], vb[96];
        field_text(a, f, va, sizeof va);
        field_text(b, f, vb, sizeof vb);
        if (out && n) snprintf(out, n, "%s: %s vs %s", f->key, va, vb);
        return 1;
    }
    if (out && n) out[0] = 0;
    return 0;
}

// The range check of one numeric field: finite and within the table's bounds.
static int check_range(const ModelConfig *c, const Field *f, const char *where) {
    const char *src = (const char *)c + f->offset;
    double x = f->type == F_FLOAT ? (double)*(const float *)src : (double)*(const int *)src;
    if (isfinite(x) && x >= f->min && x <= f->max) return MN_OK;
    if (f->type == F_BOOL) return mn_error(MN_ERR_ARG, "%s: %s = %g, expected 0 or 1 (false or true)", where, f->key, x);
    if (f->type == F_INT)
        return mn_error(MN_ERR_ARG, "%s: %s = %.0f (%s), expected %.0f to %.0f", where, f->key, x, f->what, f->min, f->max);
    return mn_error(MN_ERR_ARG, "%s: %s = %g (%s), expected a finite number from %g to %g", where, f->key, x, f->what,
                    f->min, f->max);
}

int config_validate(const ModelConfig *c, const char *where) {
    for (size_t k = 0; k < NFIELDS; k++)
        if (fields[k].type != F_STR) MN_TRY(check_range(c, &fields[k], where));
    if (!memchr(c->mixer, 0, sizeof c->mixer) || !memchr(c->arch, 0, sizeof c->arch) ||
        !memchr(c->head, 0, sizeof c->head))
        return mn_error(MN_ERR_ARG, "%s: mixer, arch or head is not a terminated string", where);
    if (c->head[0] && strcmp(c->head, "lm") && strcmp(c->head, "autoencoder"))
        return mn_error(MN_ERR_ARG, "%s: head = \"%s\", expected \"lm\" (a language model) or \"autoencoder\" (MAD's "
                                    "compression model)",
                        where, c->head);
    if (!strcmp(c->head, "autoencoder") && (c->tie_embeddings || c->logit_cap != 0 || c->dim < 4))
        return mn_error(MN_ERR_ARG, "%s: head \"autoencoder\" decodes with its own unembedding, uncapped, and its sin-cos "
                                    "position embedding needs dim >= 4: expected tie_embeddings 0, logit_cap 0, dim >= 4; "
                                    "got tie_embeddings %d, logit_cap %g, dim %d",
                        where, c->tie_embeddings, (double)c->logit_cap, c->dim);
    if (mixer_pattern_check(c->mixer, c->n_layers) < 0) {
        char why[512];
        snprintf(why, sizeof why, "%s", mn_last_error());  // (mn_error may not read its own buffer)
        return mn_error(MN_ERR_ARG, "%s: %s", where, why);
    }
    if (strcmp(c->arch, "paper") && strcmp(c->arch, "fla") && strcmp(c->arch, "llama"))
        return mn_error(MN_ERR_ARG, "%s: arch = \"%s\", expected \"paper\", \"fla\" or \"llama\"", where, c->arch);
    if (!strcmp(c->arch, "llama") &&
        ((strcmp(c->mixer, "mha") && strcmp(c->mixer, "swa")) || c->embed_scale || c->logit_cap != 0))
        return mn_error(MN_ERR_ARG, "%s: arch \"llama\" (Hugging Face's LlamaForCausalLM, or MistralForCausalLM) has mixer "
                                    "\"mha\" (Llama) or \"swa\" (Mistral) in every block, no embedding scale and no "
                                    "logit cap (embed_scale 0, logit_cap 0); got mixer "
                                    "\"%s\", embed_scale %d, logit_cap %g",
                        where, c->mixer, c->embed_scale, (double)c->logit_cap);
    MN_TRY(check_fields_apply(c, where));
    // each mixer's own checks, once per mixer of the pattern
    for (int l = 0; l < c->n_layers && l < mixer_pattern_check(c->mixer, 0); l++) {
        const MixerOps *ops = mixer_at(c, l);
        if (ops->validate) MN_TRY(ops->validate(c, where));
    }
    if (!(c->norm_eps > 0)) return mn_error(MN_ERR_ARG, "%s: norm_eps must be > 0", where);
    if (!(c->lambda_min > 0)) return mn_error(MN_ERR_ARG, "%s: lambda_min must be > 0 (it keeps H + Lambda invertible)", where);
    if (!(c->lambda_init > c->lambda_min))
        return mn_error(MN_ERR_ARG, "%s: lambda_init = %g must exceed lambda_min = %g", where, (double)c->lambda_init,
                        (double)c->lambda_min);
    if (!(c->gate_bound == 0 || c->gate_bound > 1))
        return mn_error(MN_ERR_ARG, "%s: gate_bound must be 0 (none) or > 1, got %g", where, (double)c->gate_bound);
    return MN_OK;
}

int param_add(ParamSpec *list, int *n, int max, const char *name, int ndim, const int64_t *shape, InitKind init,
              double value, int decay) {
    if (*n >= max) return -1;
    ParamSpec *p = &list[*n];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->block = -1;
    p->ndim = ndim;
    p->numel = 1;
    for (int i = 0; i < ndim; i++) {
        p->shape[i] = shape[i];
        p->numel *= (size_t)shape[i];
    }
    p->init = init;
    p->init_value = value;
    p->decay = decay;
    return (*n)++;
}
