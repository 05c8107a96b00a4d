/*
 * The official Longhorn checkpoints (LonghornLMHeadModel), read and written (format_longhorn.h).
 */
#include "format_longhorn.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/atomic_file.h"
#include "core/common.h"
#include "model/config.h"
#include "model/names.h"

#define LH_EMBED "backbone.embedding.weight"
#define LH_NORM_F "backbone.norm_f.weight"
#define LH_HEAD "lm_head.weight"
#define LH_BLOCK "backbone.layers.%d."

// ------------------------------------------------------------------------------ config

int longhorn_config_is(const Json *j) {
    return j && j->type == JSON_OBJECT && json_get(j, "d_model") && json_get(j, "n_layer") && json_get(j, "ssm_cfg");
}

// A member that is absent or null reads as NULL.
static const Json *member(const Json *obj, const char *key) {
    const Json *v = json_get(obj, key);
    return v && v->type != JSON_NULL ? v : NULL;
}

// An int member within [min, max] (fallback where absent).
static int get_int(const Json *obj, const char *path, const char *key, int fallback, int min, int max,
                   const char *where, int *out) {
    const Json *v = member(obj, key);
    char name[64];
    snprintf(name, sizeof name, "%s%s", path, key);
    *out = fallback;
    if (v) MN_TRY(json_int(v, name, where, out));
    if (*out < min || *out > max)
        return mn_error(MN_ERR_FORMAT, "%s: \"%s\" = %d, expected %d to %d", where, name, *out, min, max);
    return MN_OK;
}

// A flag member that must be `want` where present (what mesanet computes).
static int want_flag(const Json *obj, const char *path, const char *key, int want, const char *why, const char *where) {
    const Json *v = member(obj, key);
    char name[64];
    snprintf(name, sizeof name, "%s%s", path, key);
    int f = want;
    if (v) MN_TRY(json_flag(v, name, where, &f));
    if (f != want)
        return mn_error(MN_ERR_FORMAT, "%s:%d: \"%s\" = %s, expected %s: %s", where, v->line, name, f ? "true" : "false",
                        want ? "true" : "false", why);
    return MN_OK;
}

// Every member of obj is one of `known` (NULL-terminated).
static int known_keys(const Json *obj, const char *path, const char *const *known, const char *where) {
    for (int i = 0; i < obj->count; i++) {
        int found = 0;
        for (int k = 0; known[k] && !found; k++) found = !strcmp(obj->items[i].key, known[k]);
        if (!found)
            return mn_error(MN_ERR_FORMAT, "%s:%d: unknown key \"%s%s\" (not a field of LonghornConfig that mesanet reads)",
                            where, obj->items[i].line, path, obj->items[i].key);
    }
    return MN_OK;
}

// ssm_cfg: the Longhorn layer's keyword arguments (models/longhorn.py, Longhorn.__init__). The dt_*
// settings concern an initialisation the official code does not use; use_fast_path is a kernel's.
static int read_ssm_cfg(ModelConfig *c, const Json *ssm, int d_state_top, const char *where) {
    static const char *const known[] = {"d_state", "d_conv",        "expand",    "dt_rank",       "dt_min",
                                        "dt_max",  "dt_init",       "dt_scale",  "dt_init_floor", "conv_bias",
                                        "bias",    "use_fast_path", "layer_idx", NULL};
    MN_TRY(known_keys(ssm, "ssm_cfg.", known, where));
    MN_TRY(get_int(ssm, "ssm_cfg.", "d_state", d_state_top, 1, 256, where, &c->d_state));
    MN_TRY(get_int(ssm, "ssm_cfg.", "d_conv", 4, 1, 8, where, &c->conv_size));
    const Json *e = member(ssm, "expand");
    c->expand = 2;
    if (e && (e->type != JSON_NUMBER || e->number != floor(e->number) || e->number < 1 || e->number > 16))
        return mn_error(MN_ERR_FORMAT, "%s:%d: \"ssm_cfg.expand\" must be a whole number from 1 to 16 (the inner width "
                                       "expand x d_model)", where, e->line);
    if (e) c->expand = (int)e->number;
    const Json *r = member(ssm, "dt_rank");
    int rank = (c->dim + 15) / 16;
    if (r && !(r->type == JSON_STRING && !strcmp(r->string, "auto")) && !(r->type == JSON_NUMBER && r->number == rank))
        return mn_error(MN_ERR_FORMAT, "%s:%d: \"ssm_cfg.dt_rank\" must be \"auto\" or ceil(d_model / 16) = %d (the rank "
                                       "mesanet's longhorn block computes)", where, r->line, rank);
    MN_TRY(want_flag(ssm, "ssm_cfg.", "conv_bias", 1, "mesanet's longhorn block has the convolution's bias", where));
    MN_TRY(want_flag(ssm, "ssm_cfg.", "bias", 0, "mesanet's longhorn block has no in_proj or out_proj bias", where));
    return MN_OK;
}

int longhorn_config_read(ModelConfig *c, const Json *j, const char *where) {
    static const char *const known[] = {"d_model",   "d_intermediate", "n_layer",       "vocab_size",
                                        "ssm_cfg",   "attn_layer_idx", "attn_cfg",      "rms_norm",
                                        "residual_in_fp32", "fused_add_norm", "pad_vocab_size_multiple",
                                        "tie_embeddings", "d_state", NULL};
    config_default(c);
    MN_TRY(known_keys(j, "", known, where));
    snprintf(c->mixer, sizeof c->mixer, "longhorn");
    snprintf(c->arch, sizeof c->arch, "paper");
    snprintf(c->norm, sizeof c->norm, "rmsnorm");
    c->norm_eps = 1e-5f;  // the official norm_epsilon (a create_block argument, not in the config)
    c->embed_scale = 0;
    c->logit_cap = 0;
    c->seq_len = 1024;    // the paper's OpenWebText context (the config holds none)
    MN_TRY(get_int(j, "", "d_model", 0, 1, 65536, where, &c->dim));
    MN_TRY(get_int(j, "", "n_layer", 0, 1, CONFIG_MAX_LAYERS, where, &c->n_layers));
    int vocab, pad, inter, d_state;
    MN_TRY(get_int(j, "", "vocab_size", 0, 1, 1 << 24, where, &vocab));
    MN_TRY(get_int(j, "", "pad_vocab_size_multiple", 8, 1, 1 << 16, where, &pad));
    c->vocab_size = vocab % pad ? vocab + pad - vocab % pad : vocab;  // LonghornLMHeadModel's padding
    MN_TRY(get_int(j, "", "d_intermediate", 0, 0, 0, where, &inter));  // (an MLP after each block: none)
    MN_TRY(get_int(j, "", "d_state", 16, 1, 256, where, &d_state));   // nanoGPT's train.py sets it here
    const Json *al = member(j, "attn_layer_idx");
    if (al && (al->type != JSON_ARRAY || al->count))
        return mn_error(MN_ERR_FORMAT, "%s:%d: \"attn_layer_idx\" must be empty: the official LonghornLMHeadModel builds "
                                       "longhorn blocks only", where, al->line);
    MN_TRY(want_flag(j, "", "rms_norm", 1, "mesanet's norms there are RMSNorm (LayerNorm with a bias is not)", where));
    c->tie_embeddings = 1;
    const Json *t = member(j, "tie_embeddings");
    if (t) MN_TRY(json_flag(t, "tie_embeddings", where, &c->tie_embeddings));
    const Json *ssm = member(j, "ssm_cfg");
    if (ssm && ssm->type != JSON_OBJECT)
        return mn_error(MN_ERR_FORMAT, "%s:%d: \"ssm_cfg\" must be an object", where, ssm->line);
    static const Json empty = {.type = JSON_OBJECT};
    MN_TRY(read_ssm_cfg(c, ssm ? ssm : &empty, d_state, where));
    // backbone fields that longhorn blocks do not read, at values the validation accepts
    c->n_heads = 1;
    c->head_dim = c->d_state;
    config_normalize(c);
    return config_validate(c, where);
}

// ------------------------------------------------------------------------------ weights

int longhorn_weights_are(const StFile *f) {
    return st_find(f, LH_EMBED) >= 0 || st_find(f, "transformer." LH_EMBED) >= 0;
}

// Our block tensor (the name after the block's prefix) as theirs: the name after their block's
// prefix, and which rows of it (part: 0 the whole tensor).
typedef struct {
    const char *ours, *theirs;
    int part;
} Entry;

enum { WHOLE, IN_X, IN_Z, XP_DT, XP_K, XP_Q };
static const Entry entries[] = {
    {"attn_norm.weight", "norm.weight", WHOLE},
    {"mixer.in_proj_x.weight", "mixer.in_proj.weight", IN_X},
    {"mixer.in_proj_z.weight", "mixer.in_proj.weight", IN_Z},
    {"mixer.conv1d.weight", "mixer.conv1d.weight", WHOLE},
    {"mixer.conv1d.bias", "mixer.conv1d.bias", WHOLE},
    {"mixer.x_proj_dt.weight", "mixer.x_proj.weight", XP_DT},
    {"mixer.x_proj_k.weight", "mixer.x_proj.weight", XP_K},
    {"mixer.x_proj_q.weight", "mixer.x_proj.weight", XP_Q},
    {"mixer.dt_head.weight", "mixer.dt_head.weight", WHOLE},
    {"mixer.dt_head.bias", "mixer.dt_head.bias", WHOLE},
    {"mixer.D", "mixer.D", WHOLE},
    {"mixer.out_proj.weight", "mixer.out_proj.weight", WHOLE},
};
#define NENTRIES (sizeof entries / sizeof entries[0])

// The joined tensor of a part [rows, cols] and the part's rows [r0, r0 + nr).
static void part_rows(const ModelConfig *c, int part, int64_t *rows, int64_t *cols, int64_t *r0, int64_t *nr) {
    int64_t D = c->dim, E = (int64_t)c->expand * c->dim, N = c->d_state, R = (c->dim + 15) / 16;
    int in = part == IN_X || part == IN_Z;
    *rows = in ? 2 * E : R + 2 * N;
    *cols = in ? D : E;
    *r0 = part == IN_Z ? E : part == XP_K ? R : part == XP_Q ? R + N : 0;
    *nr = in ? E : part == XP_DT ? R : N;
}

// The entry of our tensor s (a block's) and its block; NULL with an error where it has none.
static const Entry *find_entry(const ModelConfig *c, const ParamSpec *s, int *layer) {
    char prefix[64];
    snprintf(prefix, sizeof prefix, arch_names(c)->block, s->block);
    size_t pl = strlen(prefix);
    *layer = s->block;
    for (size_t i = 0; i < NENTRIES && !strncmp(s->name, prefix, pl); i++)
        if (!strcmp(s->name + pl, entries[i].ours)) return &entries[i];
    mn_error(MN_ERR_ARG, "tensor \"%s\" has no counterpart in the official LonghornLMHeadModel", s->name);
    return NULL;
}

int longhorn_read(WeightFile *w, const ModelConfig *c, const ParamSpec *specs, int n, WeightSink sink, void *ctx) {
    MN_TRY(longhorn_check(c));
    const char *top = wf_has(w, LH_EMBED) ? "" : "transformer.";
    const ArchNames *an = arch_names(c);
    size_t most = 1;
    for (int i = 0; i < n; i++)
        if (specs[i].numel > most) most = specs[i].numel;
    float *buf = malloc(sizeof(float) * most);
    if (!buf) return mn_error(MN_ERR_NOMEM, "out of memory");
    int st = MN_OK;
    char name[160];
    for (int i = 0; i < n && !st; i++) {
        const ParamSpec *s = &specs[i];
        if (s->block < 0) {
            const char *theirs = !strcmp(s->name, an->embed)        ? LH_EMBED
                                 : !strcmp(s->name, an->final_norm) ? LH_NORM_F
                                 : !strcmp(s->name, "lm_head.weight") ? LH_HEAD
                                                                      : NULL;
            if (!theirs) {
                st = mn_error(MN_ERR_ARG, "tensor \"%s\" has no counterpart in the official LonghornLMHeadModel", s->name);
                break;
            }
            snprintf(name, sizeof name, "%s%s", top, theirs);
            st = wf_read(w, name, buf, s->ndim, s->shape);
        } else {
            int l;
            const Entry *e = find_entry(c, s, &l);
            if (!e) {
                st = MN_ERR_ARG;
                break;
            }
            char block[64];
            snprintf(block, sizeof block, LH_BLOCK, l);
            snprintf(name, sizeof name, "%s%s%s", top, block, e->theirs);
            if (e->part == WHOLE) {
                st = wf_read(w, name, buf, s->ndim, s->shape);
            } else {
                int64_t rows, cols, r0, nr;
                part_rows(c, e->part, &rows, &cols, &r0, &nr);
                st = wf_rows(w, name, 2, rows, cols, r0, nr, buf);
            }
        }
        if (!st) st = sink(ctx, i, buf);
    }
    free(buf);
    // a tied head: the module's state dict holds it under both names (the same tensor)
    if (!st && c->tie_embeddings) {
        snprintf(name, sizeof name, "%s%s", top, LH_HEAD);
        wf_mark(w, name);
    }
    return st;
}

int longhorn_check(const ModelConfig *c) {
    if (strcmp(c->mixer, "longhorn") || strcmp(c->norm, "rmsnorm") || c->embed_scale || c->logit_cap != 0 ||
        strcmp(c->head[0] ? c->head : "lm", "lm") || (strcmp(c->arch, "paper") && strcmp(c->arch, "fla")))
        return mn_error(MN_ERR_ARG, "the official LonghornLMHeadModel has mixer \"longhorn\" in every block, RMSNorm, no "
                                    "embedding scale, no logit cap and a language-model head; got mixer \"%s\", norm "
                                    "\"%s\", embed_scale %d, logit_cap %g, head \"%s\", arch \"%s\"",
                        c->mixer, c->norm, c->embed_scale, (double)c->logit_cap, c->head, c->arch);
    if (c->norm_eps != 1e-5f)
        return mn_error(MN_ERR_ARG, "the official LonghornLMHeadModel's RMSNorm eps is 1e-5 (not in its config); got "
                                    "norm_eps %g", (double)c->norm_eps);
    return MN_OK;
}

// ------------------------------------------------------------------------------ writing

static int write_config(const char *path, const ModelConfig *c) {
    AtomicFile af;
    MN_TRY(af_open(&af, path));
    FILE *f = af.f;
    // padding to 8 as the module does where the vocabulary allows it; none (1) otherwise
    int pad = c->vocab_size % 8 ? 1 : 8;
    fprintf(f, "{\n  \"d_model\": %d,\n  \"d_intermediate\": 0,\n  \"n_layer\": %d,\n  \"vocab_size\": %d,\n", c->dim,
            c->n_layers, c->vocab_size);
    fprintf(f, "  \"ssm_cfg\": {\"d_state\": %d, \"d_conv\": %d, \"expand\": %d},\n", c->d_state, c->conv_size,
            c->expand);
    fprintf(f, "  \"attn_layer_idx\": [],\n  \"attn_cfg\": {},\n  \"rms_norm\": true,\n  \"residual_in_fp32\": true,\n");
    fprintf(f, "  \"fused_add_norm\": true,\n  \"pad_vocab_size_multiple\": %d,\n  \"tie_embeddings\": %s,\n", pad,
            c->tie_embeddings ? "true" : "false");
    fprintf(f, "  \"d_state\": %d\n}\n", c->d_state);
    return af_commit(&af);
}

// One output tensor: its name, shape and data (owned).
typedef struct {
    char name[96];
    int ndim;
    int64_t shape[3];
    float *data;
} Out;

static Out *out_add(Out *o, int *n, const char *name, int ndim, const int64_t *shape) {
    Out *t = &o[(*n)++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    size_t numel = 1;
    for (int d = 0; d < ndim; d++) numel *= (size_t)(t->shape[d] = shape[d]);
    t->data = calloc(numel ? numel : 1, sizeof(float));
    return t->data ? t : NULL;
}

int longhorn_write(const char *dir, const ModelConfig *c, const ParamSpec *specs, int n, float *const *vals) {
    MN_TRY(longhorn_check(c));
    const ArchNames *an = arch_names(c);
    Out *o = calloc((size_t)n + 3, sizeof(Out));
    int no = 0, st = o ? MN_OK : mn_error(MN_ERR_NOMEM, "out of memory"), embed = -1, head = -1, norm = -1;
    Out *joined[CONFIG_MAX_LAYERS][2] = {{NULL}};  // each block's in_proj and x_proj, made at their first part
    for (int i = 0; i < n && !st; i++) {
        const ParamSpec *s = &specs[i];
        if (s->block < 0) {
            if (!strcmp(s->name, an->embed)) embed = i;
            else if (!strcmp(s->name, an->final_norm)) norm = i;
            else if (!strcmp(s->name, "lm_head.weight")) head = i;
            else st = mn_error(MN_ERR_ARG, "tensor \"%s\" has no counterpart in the official LonghornLMHeadModel", s->name);
            continue;
        }
        int l;
        const Entry *e = find_entry(c, s, &l);
        if (!e) {
            st = MN_ERR_ARG;
            break;
        }
        char name[96];
        snprintf(name, sizeof name, LH_BLOCK "%s", l, e->theirs);
        if (e->part == WHOLE) {
            Out *t = out_add(o, &no, name, s->ndim, s->shape);
            if (!t) st = mn_error(MN_ERR_NOMEM, "out of memory");
            else memcpy(t->data, vals[i], sizeof(float) * s->numel);
            continue;
        }
        int64_t rows, cols, r0, nr;
        part_rows(c, e->part, &rows, &cols, &r0, &nr);
        Out **t = &joined[l][e->part == IN_X || e->part == IN_Z ? 0 : 1];
        int64_t shape[2] = {rows, cols};
        if (!*t && !(*t = out_add(o, &no, name, 2, shape))) {
            st = mn_error(MN_ERR_NOMEM, "out of memory");
            break;
        }
        memcpy((*t)->data + r0 * cols, vals[i], sizeof(float) * (size_t)(nr * cols));
    }
    if (!st && (embed < 0 || norm < 0 || (head < 0) != (c->tie_embeddings != 0)))
        st = mn_error(MN_ERR_ARG, "internal: the model's embedding, final norm or head is missing");
    if (!st) {
        const ParamSpec *se = &specs[embed];
        Out *te = out_add(o, &no, LH_EMBED, se->ndim, se->shape);
        Out *tn = te ? out_add(o, &no, LH_NORM_F, specs[norm].ndim, specs[norm].shape) : NULL;
        // tied: both names, as the module's state dict has them (its load_state_dict wants both)
        Out *th = tn ? out_add(o, &no, LH_HEAD, se->ndim, se->shape) : NULL;
        if (!th) {
            st = mn_error(MN_ERR_NOMEM, "out of memory");
        } else {
            memcpy(te->data, vals[embed], sizeof(float) * se->numel);
            memcpy(tn->data, vals[norm], sizeof(float) * specs[norm].numel);
            memcpy(th->data, vals[c->tie_embeddings ? embed : head], sizeof(float) * se->numel);
        }
    }
    char path[4096];
    if (!st) st = mn_mkdirs(dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (!st) st = write_config(path, c);
    StTensor *tt = st ? NULL : calloc((size_t)no, sizeof(StTensor));
    if (!st && !tt) st = mn_error(MN_ERR_NOMEM, "out of memory");
    if (!st) {
        for (int i = 0; i < no; i++) {
            tt[i].name = o[i].name;
            tt[i].dtype = ST_F32;
            tt[i].ndim = o[i].ndim;
            for (int d = 0; d < o[i].ndim; d++) tt[i].shape[d] = o[i].shape[d];
            tt[i].data = o[i].data;
        }
        StMeta meta[] = {{"format", "pt"}, {"producer", "mesanet"}};
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        st = st_write(path, tt, no, meta, 2);
    }
    free(tt);
    for (int i = 0; o && i < no; i++) free(o[i].data);
    free(o);
    return st;
}
