/*
 * Model configs: defaults, the field table, our JSON, validation, comparison, and config.json's
 * "mesanet" block (the Hugging Face part: config_hf.c; presets: presets.c).
 */
#include "config.h"

#include <errno.h>
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
#include "model/config_hf.h"
#include "model/ffn.h"
#include "model/format_longhorn.h"
#include "model/format_nxai.h"
#include "model/presets.h"

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
    c->slstm_heads = 4;
    c->d_state = 16;
    c->expand = 2;
    strcpy(c->head, "lm");
    strcpy(c->norm, "rmsnorm");
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
    MIXER_FIELD(rope_dim, F_INT, 0, 1024, "the features of each head RoPE rotates (0: all)", CF_ROPE),
    MIXER_FIELD(o_bias, F_BOOL, 0, 1, "the attention output bias flag", CF_O_BIAS),
    MIXER_FIELD(window, F_INT, 0, 1 << 24, "swa's window", CF_WINDOW),
    MIXER_FIELD(n_kv_heads, F_INT, 0, 1024, "the key/value heads (0: n_heads)", CF_KV_HEADS),
    MIXER_FIELD(slstm_heads, F_INT, 1, 1024, "slstm-block's heads", CF_SLSTM),
    MIXER_FIELD(gate_cap, F_FLOAT, 0, 1e6, "mlstm-large's gate soft cap (0: none)", CF_GATE_CAP),
    MIXER_FIELD(lru_width, F_INT, 0, 1 << 20, "hawk's recurrence width (0: dim)", CF_LRU),
    MIXER_FIELD(d_state, F_INT, 1, 256, "the scan's state slots per channel", CF_D_STATE),
    MIXER_FIELD(expand, F_INT, 1, 16, "the block's inner width over dim", CF_EXPAND),
    FIELD(head, F_STR, 0, 0, "the output head"),
    FIELD(norm, F_STR, 0, 0, "the backbone's norm"),
};
#define NFIELDS (sizeof fields / sizeof fields[0])

// The mixer fields (CF_*) the config's blocks read: their mixers' own, and CF_FFN where a block's
// feed-forward part takes its width from mlp_hidden. 0 for an invalid pattern.
static unsigned used_fields(const ModelConfig *c) {
    int n = mixer_pattern_check(c->mixer, 0);
    unsigned used = 0;
    for (int l = 0; l < n; l++) {
        const MixerOps *ops = mixer_at(c, l);
        const BlockShape *b = ffn_block_shape(c, ops);
        used |= ops->fields;
        if (b->ffn != FFN_NONE && !b->ffn_hidden) used |= CF_FFN;
    }
    return used;
}

// Whether field f is read by a model whose blocks read the mixer fields `used` (used_fields).
static int applies(unsigned used, const Field *f) { return !f->uses || (f->uses & used); }

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
    unsigned used = used_fields(c);
    for (size_t k = 0; k < NFIELDS; k++)
        if (!applies(used, &fields[k])) memcpy((char *)c + fields[k].offset, (const char *)&d + fields[k].offset, fields[k].size);
}

static void field_text(const ModelConfig *c, const Field *f, char *buf, size_t n);

// The switches that no block's mixer reads off (at their defaults, 0): one turned on there would be
// silently ignored. (The other fields that no mixer reads are reset by config_normalize, and refused
// where a config file gives them: config_from_json.)
static int check_fields_apply(const ModelConfig *c, const char *where) {
    ModelConfig d;
    config_default(&d);
    const unsigned switches = CF_NEG_EIGEN | CF_HEAD_V_DIM | CF_KV_HEADS | CF_OUTPUT_GATE | CF_O_BIAS,
                   used = used_fields(c);
    for (size_t k = 0; k < NFIELDS; k++) {
        const Field *f = &fields[k];
        if (!(f->uses & switches) || applies(used, f) || same_value(c, &d, f)) continue;
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
        if (!fd || applies(used_fields(c), fd)) continue;
        char who[256];
        readers(fd, who, sizeof who);
        return mn_error(MN_ERR_FORMAT, "%s:%d: \"%s\" does not apply to mixer \"%s\": only %s read it", where,
                        j->items[i].line, fd->key, c->mixer, who);
    }
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
    int st = ours                         ? config_from_json(c, ours, spec, 0)
             : json_get(j, "model_type") ? config_from_hf(c, j, spec)
             : nxai_config_is(j)         ? nxai_config_read(c, j, spec)
             : longhorn_config_is(j)     ? longhorn_config_read(c, j, spec)
                                         : config_from_json(c, j, spec, 1);
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

// config.json as Hugging Face and fla read it (config_to_hf), with our complete config in a
// "mesanet" block that takes precedence on loading. Only a valid config is written, so that every
// saved config loads again.
int config_save(const ModelConfig *c, const char *path) {
    MN_TRY(config_validate(c, path));
    AtomicFile af;
    MN_TRY(af_open(&af, path));
    FILE *f = af.f;
    config_to_hf(f, c);  // what Hugging Face and fla read; our complete config follows
    fprintf(f, "  \"mesanet\": {\n");
    unsigned used = used_fields(c);
    size_t last = 0;  // the fields the model reads (config_normalize left the others at their defaults)
    for (size_t k = 0; k < NFIELDS; k++)
        if (applies(used, &fields[k])) last = k;
    for (size_t k = 0; k < NFIELDS; k++) {
        if (!applies(used, &fields[k])) continue;
        char value[96];  // room for the longest string field and its quotes
        field_text(c, &fields[k], value, sizeof value);  // strings: validated names, nothing to escape
        fprintf(f, "    \"%s\": %s%s\n", fields[k].key, value, k < last ? "," : "");
    }
    fprintf(f, "  }\n}\n");
    return af_commit(&af);  // refuses to rename a stream that failed
}

void config_mixer_fields(const ModelConfig *c, char *out, size_t n) {
    size_t len = 0;
    unsigned used = used_fields(c);
    out[0] = 0;
    for (size_t k = 0; k < NFIELDS && len < n; k++) {
        const Field *f = &fields[k];
        if (!f->uses || f->uses == CF_FFN || !applies(used, f)) continue;
        char value[96];
        field_text(c, f, value, sizeof value);
        snprintf(out + len, n - len, "%s%s %s", len ? ", " : "", f->key, value);
        len = strlen(out);
    }
}

int config_diff(const ModelConfig *a, const ModelConfig *b, char *out, size_t n) {
    unsigned ua = used_fields(a), ub = used_fields(b);
    for (size_t k = 0; k < NFIELDS; k++) {
        const Field *f = &fields[k];
        // a field that neither model reads does not make them differ (mixer, which decides it, is first)
        if (same_value(a, b, f) || (!applies(ua, f) && !applies(ub, f))) continue;
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

// The recurrent_gemma architecture is transformers' RecurrentGemmaForCausalLM: its blocks are hawk
// ("recurrent") or swa ("attention": local, within attention_window_size), its heads split the width
// (head_dim = hidden_size / num_attention_heads), RoPE turns the first half of each head, o_proj has a
// bias, the embedding is scaled by sqrt(D) (rounded to bf16), the logits are soft-capped, the norms are
// RMSNorm (of gain 1 + w), the head is a language model's. (The MLP is the architecture's:
// ffn_block_shape.)
static int check_rgemma(const ModelConfig *c, const char *where) {
    int n = mixer_pattern_check(c->mixer, 0);
    for (int i = 0; i < n; i++) {
        const MixerOps *ops = mixer_at(c, i);
        if (strcmp(ops->name, "hawk") && strcmp(ops->name, "swa"))
            return mn_error(MN_ERR_ARG, "%s: arch \"recurrent_gemma\" (Hugging Face's RecurrentGemmaForCausalLM) has "
                                        "blocks of mixer \"hawk\" (its \"recurrent\" blocks) and \"swa\" (its local "
                                        "\"attention\"); mixer \"%s\" has \"%s\"", where, c->mixer, ops->name);
    }
    if (!c->embed_scale || c->logit_cap <= 0 || strcmp(c->norm, "rmsnorm") || strcmp(c->head, "lm"))
        return mn_error(MN_ERR_ARG, "%s: arch \"recurrent_gemma\" scales the embedding by sqrt(D), soft-caps the logits, "
                                    "has RMSNorm and a language-model head: expected embed_scale true, logit_cap > 0, "
                                    "norm \"rmsnorm\", head \"lm\"; got embed_scale %d, logit_cap %g, norm \"%s\", head "
                                    "\"%s\"", where, c->embed_scale, (double)c->logit_cap, c->norm, c->head);
    if (c->n_heads * c->head_dim != c->dim)
        return mn_error(MN_ERR_ARG, "%s: arch \"recurrent_gemma\" splits the width over the heads (head_dim = "
                                    "hidden_size / num_attention_heads): n_heads %d x head_dim %d != dim %d",
                        where, c->n_heads, c->head_dim, c->dim);
    int attn = 0;
    for (int i = 0; i < n; i++) attn |= !strcmp(mixer_at(c, i)->name, "swa");
    if (attn && (c->rope_dim * 2 != c->head_dim || c->rope_dim % 2 || !c->o_bias))
        return mn_error(MN_ERR_ARG, "%s: arch \"recurrent_gemma\"'s attention rotates the first half of each head "
                                    "(partial_rotary_factor 0.5, in pairs) and has a bias on o_proj: expected rope_dim = "
                                    "head_dim / 2 = %d (head_dim a multiple of 4) and o_bias true; got rope_dim %d, "
                                    "o_bias %d", where, c->head_dim / 2, c->rope_dim, c->o_bias);
    return MN_OK;
}

int config_validate(const ModelConfig *c, const char *where) {
    // every field's range, but a field no block reads may keep its default outside it (mlp_hidden's
    // 0 where no block has a feed-forward part of its width)
    unsigned used = mixer_pattern_check(c->mixer, 0) > 0 ? used_fields(c) : ~0u;
    ModelConfig d;
    config_default(&d);
    for (size_t k = 0; k < NFIELDS; k++)
        if (fields[k].type != F_STR && (applies(used, &fields[k]) || !same_value(c, &d, &fields[k])))
            MN_TRY(check_range(c, &fields[k], where));
    if (!memchr(c->mixer, 0, sizeof c->mixer) || !memchr(c->arch, 0, sizeof c->arch) ||
        !memchr(c->head, 0, sizeof c->head) || !memchr(c->norm, 0, sizeof c->norm))
        return mn_error(MN_ERR_ARG, "%s: mixer, arch, head or norm is not a terminated string", where);
    if (strcmp(c->norm, "rmsnorm") && strcmp(c->norm, "layernorm"))
        return mn_error(MN_ERR_ARG, "%s: norm = \"%s\", expected \"rmsnorm\" or \"layernorm\" (with a weight, no bias)",
                        where, c->norm);
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
    if (strcmp(c->arch, "paper") && strcmp(c->arch, "fla") && strcmp(c->arch, "llama") && strcmp(c->arch, "xlstm") &&
        strcmp(c->arch, "recurrent_gemma"))
        return mn_error(MN_ERR_ARG, "%s: arch = \"%s\", expected \"paper\", \"fla\", \"llama\", \"xlstm\" or "
                                    "\"recurrent_gemma\"", where, c->arch);
    if (!strcmp(c->arch, "recurrent_gemma")) MN_TRY(check_rgemma(c, where));
    if (!strcmp(c->arch, "xlstm") && (strcmp(c->mixer, "mlstm-large") || c->embed_scale || c->tie_embeddings ||
                                      strcmp(c->norm, "rmsnorm") || strcmp(c->head, "lm")))
        return mn_error(MN_ERR_ARG, "%s: arch \"xlstm\" (Hugging Face's xLSTMForCausalLM) has mixer \"mlstm-large\" in "
                                    "every block, RMSNorm, no embedding scale, an untied head (transformers 5 never "
                                    "ties it) and a language-model head; got mixer \"%s\", norm \"%s\", embed_scale %d, "
                                    "tie_embeddings %d, head \"%s\"",
                        where, c->mixer, c->norm, c->embed_scale, c->tie_embeddings, c->head);
    if (!strcmp(c->arch, "llama") && (c->rope_dim || c->o_bias))
        return mn_error(MN_ERR_ARG, "%s: arch \"llama\" rotates whole heads and has no bias on o_proj (Llama's, "
                                    "Mistral's): expected rope_dim 0 and o_bias false; got rope_dim %d, o_bias %d",
                        where, c->rope_dim, c->o_bias);
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
