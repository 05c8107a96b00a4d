/*
 * Model configs: defaults, named presets, JSON files, validation.
 */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/atomic_file.h"
#include "core/common.h"
#include "core/json.h"

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

int config_preset(ModelConfig *c, const char *name) {
    char known[512] = "";
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
            return MN_OK;
        }
        strcat(known, i ? ", " : "");
        strcat(known, p->name);
    }
    return mn_error(MN_ERR_ARG, "unknown config '%s': not a file, nor a preset (%s)", name, known);
}

// Field table: the JSON keys and where they go.
typedef enum { F_INT, F_FLOAT, F_BOOL, F_STR } FieldType;
typedef struct {
    const char *key;
    FieldType type;
    size_t offset;
    size_t size;  // F_STR: buffer size
} Field;

#define FIELD(k, t) {#k, t, offsetof(ModelConfig, k), sizeof(((ModelConfig *)0)->k)}
static const Field fields[] = {
    FIELD(mixer, F_STR),         FIELD(arch, F_STR),          FIELD(vocab_size, F_INT),   FIELD(dim, F_INT),
    FIELD(n_layers, F_INT),      FIELD(n_heads, F_INT),       FIELD(head_dim, F_INT),     FIELD(mlp_hidden, F_INT),
    FIELD(conv_size, F_INT),     FIELD(norm_eps, F_FLOAT),    FIELD(logit_cap, F_FLOAT),  FIELD(embed_scale, F_BOOL),
    FIELD(tie_embeddings, F_BOOL), FIELD(shared_onorm, F_BOOL), FIELD(output_gate, F_BOOL), FIELD(lambda_min, F_FLOAT),
    FIELD(lambda_init, F_FLOAT), FIELD(gate_bound, F_FLOAT),  FIELD(seq_len, F_INT),      FIELD(resid_scale, F_FLOAT),
    FIELD(cg_steps, F_INT),
};
#define NFIELDS (sizeof fields / sizeof fields[0])

static int set_field(ModelConfig *c, const Field *f, const Json *v, const char *path) {
    char *dst = (char *)c + f->offset;
    if (f->type == F_STR) {
        if (v->type != JSON_STRING || v->string_len >= f->size)
            return mn_error(MN_ERR_FORMAT, "%s:%d: \"%s\" must be a string shorter than %zu characters", path, v->line,
                            f->key, f->size);
        strcpy(dst, v->string);
        return MN_OK;
    }
    if (v->type != JSON_NUMBER && v->type != JSON_BOOL)
        return mn_error(MN_ERR_FORMAT, "%s:%d: \"%s\" must be a number", path, v->line, f->key);
    if (f->type == F_FLOAT) {
        *(float *)dst = (float)v->number;
    } else {
        if (v->number != floor(v->number) || fabs(v->number) > 1e9)
            return mn_error(MN_ERR_FORMAT, "%s:%d: \"%s\" must be an integer, got %g", path, v->line, f->key, v->number);
        *(int *)dst = (int)v->number;
    }
    return MN_OK;
}

// Applies the members of a JSON object of our fields (optionally based on a
// "preset") to c; unknown keys are refused.
static int config_from_json(ModelConfig *c, const Json *j, const char *where) {
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
        const Field *fd = NULL;
        for (size_t k = 0; k < NFIELDS; k++)
            if (!strcmp(fields[k].key, v->key)) fd = &fields[k];
        if (!fd) return mn_error(MN_ERR_FORMAT, "%s:%d: unknown key \"%s\"", where, v->line, v->key);
        MN_TRY(set_field(c, fd, v, where));
    }
    return config_validate(c, where);
}

static double hf_number(const Json *j, const char *key, double fallback) {
    const Json *v = json_get(j, key);
    return v && (v->type == JSON_NUMBER || v->type == JSON_BOOL) ? v->number : fallback;
}

// A config.json written by fla's MesaNetConfig (Hugging Face), without our own
// "mesanet" block: fla's architecture with its sizes.
static int config_from_hf(ModelConfig *c, const Json *j, const char *where) {
    const Json *type = json_get(j, "model_type");
    if (!type || type->type != JSON_STRING || strcmp(type->string, "mesa_net"))
        return mn_error(MN_ERR_FORMAT, "%s: neither a mesanet config nor a Hugging Face config with model_type \"mesa_net\"",
                        where);
    config_default(c);
    c->dim = (int)hf_number(j, "hidden_size", 2048);
    c->n_layers = (int)hf_number(j, "num_hidden_layers", 24);
    c->n_heads = (int)hf_number(j, "num_heads", 16);
    c->head_dim = (int)hf_number(j, "head_dim", 128);
    c->vocab_size = (int)hf_number(j, "vocab_size", 32000);
    config_fla(c);
    const Json *inter = json_get(j, "intermediate_size");
    if (inter && inter->type == JSON_NUMBER) {
        c->mlp_hidden = (int)inter->number;
    } else {
        int ratio = (int)hf_number(j, "hidden_ratio", 4), h = c->dim * ratio * 2 / 3;
        c->mlp_hidden = 256 * ((h + 255) / 256);
    }
    c->norm_eps = (float)hf_number(j, "norm_eps", 1e-6);
    c->tie_embeddings = (int)hf_number(j, "tie_word_embeddings", 0);
    c->output_gate = (int)hf_number(j, "use_output_gate", 0);
    c->conv_size = (int)hf_number(j, "conv_size", 4);
    c->lambda_min = (float)hf_number(j, "lambda_lower_bound", 0.25);
    c->cg_steps = (int)hf_number(j, "max_cg_step_training", 30);
    c->seq_len = (int)hf_number(j, "max_position_embeddings", 2048);
    const Json *act = json_get(j, "hidden_act");
    if (act && (act->type != JSON_STRING || (strcmp(act->string, "swish") && strcmp(act->string, "silu"))))
        return mn_error(MN_ERR_FORMAT, "%s: hidden_act must be \"swish\" (SwiGLU), got another", where);
    return config_validate(c, where);
}

int config_load(ModelConfig *c, const char *spec) {
    FILE *f = fopen(spec, "rb");
    if (!f) return config_preset(c, spec);
    fclose(f);
    Json *j;
    MN_TRY(json_parse_file(spec, &j));
    const Json *ours = json_get(j, "mesanet");
    int st = ours ? config_from_json(c, ours, spec)
                  : json_get(j, "model_type") ? config_from_hf(c, j, spec) : config_from_json(c, j, spec);
    json_free(j);
    return st;
}

// config.json as Hugging Face and fla read it (model_type "mesa_net"), with
// our complete config in a "mesanet" block that takes precedence on loading.
int config_save(const ModelConfig *c, const char *path) {
    AtomicFile af;
    MN_TRY(af_open(&af, path));
    FILE *f = af.f;
    fprintf(f, "{\n  \"model_type\": \"mesa_net\",\n  \"architectures\": [\"MesaNetForCausalLM\"],\n");
    fprintf(f, "  \"attn_mode\": \"chunk\",\n  \"hidden_size\": %d,\n  \"num_hidden_layers\": %d,\n", c->dim, c->n_layers);
    fprintf(f, "  \"num_heads\": %d,\n  \"head_dim\": %d,\n  \"vocab_size\": %d,\n", c->n_heads, c->head_dim, c->vocab_size);
    fprintf(f, "  \"intermediate_size\": %d,\n  \"hidden_ratio\": 4,\n  \"hidden_act\": \"swish\",\n", c->mlp_hidden);
    fprintf(f, "  \"norm_eps\": %.9g,\n  \"tie_word_embeddings\": %s,\n  \"use_output_gate\": %s,\n", (double)c->norm_eps,
            c->tie_embeddings ? "true" : "false", c->output_gate ? "true" : "false");
    fprintf(f, "  \"use_short_conv\": true,\n  \"conv_size\": %d,\n  \"lambda_lower_bound\": %.9g,\n", c->conv_size,
            (double)c->lambda_min);
    fprintf(f, "  \"max_cg_step_training\": %d,\n  \"max_cg_step_decoding\": %d,\n  \"max_position_embeddings\": %d,\n",
            c->cg_steps, c->cg_steps, c->seq_len);
    fprintf(f, "  \"fuse_norm\": true,\n  \"fuse_swiglu\": true,\n  \"fuse_cross_entropy\": true,\n");
    fprintf(f, "  \"bos_token_id\": %d,\n  \"eos_token_id\": %d,\n", c->vocab_size > 50256 ? 50256 : c->vocab_size - 1,
            c->vocab_size > 50256 ? 50256 : c->vocab_size - 1);
    fprintf(f, "  \"mesanet\": {\n");
    for (size_t k = 0; k < NFIELDS; k++) {
        const char *src = (const char *)c + fields[k].offset;
        fprintf(f, "    \"%s\": ", fields[k].key);
        switch (fields[k].type) {
        case F_STR: fprintf(f, "\"%s\"", src); break;
        case F_INT: fprintf(f, "%d", *(const int *)src); break;
        case F_BOOL: fprintf(f, "%s", *(const int *)src ? "true" : "false"); break;
        case F_FLOAT: fprintf(f, "%.9g", (double)*(const float *)src); break;
        }
        fprintf(f, "%s\n", k + 1 < NFIELDS ? "," : "");
    }
    fprintf(f, "  }\n}\n");
    return af_commit(&af);  // refuses to rename a stream that failed
}

int config_validate(const ModelConfig *c, const char *where) {
    const struct {
        const char *name;
        int value, min, max;
    } ints[] = {
        {"vocab_size", c->vocab_size, 0, 1 << 24},  // 0: taken from the training data
        {"dim", c->dim, 1, 65536},
        {"n_layers", c->n_layers, 1, 1024},
        {"n_heads", c->n_heads, 1, 1024},          {"head_dim", c->head_dim, 1, 1024}, {"mlp_hidden", c->mlp_hidden, 1, 1 << 20},
        {"conv_size", c->conv_size, 1, 8},         {"seq_len", c->seq_len, 1, 1 << 24}, {"cg_steps", c->cg_steps, 0, 10000},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (ints[i].value < ints[i].min || ints[i].value > ints[i].max)
            return mn_error(MN_ERR_ARG, "%s: %s = %d, expected %d to %d", where, ints[i].name, ints[i].value, ints[i].min,
                            ints[i].max);
    if (strcmp(c->arch, "paper") && strcmp(c->arch, "fla"))
        return mn_error(MN_ERR_ARG, "%s: arch = \"%s\", expected \"paper\" or \"fla\"", where, c->arch);
    if (!(c->norm_eps > 0)) return mn_error(MN_ERR_ARG, "%s: norm_eps must be > 0", where);
    if (!(c->logit_cap >= 0)) return mn_error(MN_ERR_ARG, "%s: logit_cap must be >= 0 (0: none)", where);
    if (!(c->lambda_min > 0)) return mn_error(MN_ERR_ARG, "%s: lambda_min must be > 0 (it keeps H + Lambda invertible)", where);
    if (!(c->lambda_init > c->lambda_min))
        return mn_error(MN_ERR_ARG, "%s: lambda_init = %g must exceed lambda_min = %g", where, (double)c->lambda_init,
                        (double)c->lambda_min);
    if (!(c->gate_bound == 0 || c->gate_bound > 1))
        return mn_error(MN_ERR_ARG, "%s: gate_bound must be 0 (none) or > 1, got %g", where, (double)c->gate_bound);
    if (!(c->resid_scale >= 0)) return mn_error(MN_ERR_ARG, "%s: resid_scale must be >= 0", where);
    return MN_OK;
}

int param_add(ParamSpec *list, int *n, int max, const char *name, int ndim, const int64_t *shape, InitKind init,
              double value, int decay) {
    if (*n >= max) return -1;
    ParamSpec *p = &list[*n];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
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
