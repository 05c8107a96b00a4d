/*
 * NX-AI's xLSTMLMModel checkpoints, read and written (format_nxai.h; the format:
 * docs/spec/reference/xlstm-formats.md 2).
 */
#include "format_nxai.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/atomic_file.h"
#include "core/common.h"
#include "mixers/mixer.h"
#include "model/config.h"
#include "model/names.h"

#define NX_BLOCK "xlstm_block_stack.blocks.%d."
#define NX_EMBED "token_embedding.weight"
#define NX_HEAD "lm_head.weight"
#define NX_POST_NORM "xlstm_block_stack.post_blocks_norm.weight"
static const float NX_EPS = 1e-5f;  // every LayerNorm and GroupNorm of NX-AI's package

// ------------------------------------------------------------------------------ config

int nxai_config_is(const Json *j) {
    static const char *const keys[] = {"mlstm_block", "slstm_block", "slstm_at", "_block_map"};
    if (!j || j->type != JSON_OBJECT) return 0;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (json_get(j, keys[i])) return 1;
    return 0;
}

// A member of one of the config's objects, named in messages by its path ("mlstm_block.mlstm.").
typedef struct {
    const Json *obj;
    const char *path;  // "" at the top, else "mlstm_block.mlstm." and so on
    const char *where;
} Obj;

static const Json *member(const Obj *o, const char *key) {
    const Json *v = o->obj ? json_get(o->obj, key) : NULL;
    return v && v->type != JSON_NULL ? v : NULL;
}

static int get_int(const Obj *o, const char *key, int fallback, int min, int max, int *out) {
    const Json *v = member(o, key);
    char name[96];
    snprintf(name, sizeof name, "%s%s", o->path, key);
    *out = fallback;
    if (v) MN_TRY(json_int(v, name, o->where, out));
    if (*out < min || *out > max)
        return mn_error(MN_ERR_FORMAT, "%s: \"%s\" = %d, expected %d to %d", o->where, name, *out, min, max);
    return MN_OK;
}

static int get_flag(const Obj *o, const char *key, int fallback, int *out) {
    const Json *v = member(o, key);
    char name[96];
    snprintf(name, sizeof name, "%s%s", o->path, key);
    *out = fallback;
    return v ? json_flag(v, name, o->where, out) : MN_OK;
}

static int get_double(const Obj *o, const char *key, double fallback, double *out) {
    const Json *v = member(o, key);
    *out = fallback;
    if (!v) return MN_OK;
    if (v->type != JSON_NUMBER || !isfinite(v->number) || !(v->number > 0) || v->number > 1024)
        return mn_error(MN_ERR_FORMAT, "%s:%d: \"%s%s\" must be a positive number of at most 1024", o->where, v->line,
                        o->path, key);
    *out = v->number;
    return MN_OK;
}

// A flag that must be `want` (what mesanet computes): MN_ERR_FORMAT saying why otherwise.
static int want_flag(const Obj *o, const char *key, int fallback, int want, const char *why) {
    int v;
    MN_TRY(get_flag(o, key, fallback, &v));
    if (v != want)
        return mn_error(MN_ERR_FORMAT, "%s: \"%s%s\" = %s, expected %s: %s", o->where, o->path, key, v ? "true" : "false",
                        want ? "true" : "false", why);
    return MN_OK;
}

// A string member that must be one of `allowed` (NULL-terminated; absent: the first).
static int want_string(const Obj *o, const char *key, const char *const *allowed, const char *why, const char **out) {
    const Json *v = member(o, key);
    *out = allowed[0];
    if (!v) return MN_OK;
    for (int i = 0; v->type == JSON_STRING && allowed[i]; i++)
        if (!strcmp(v->string, allowed[i])) {
            *out = allowed[i];
            return MN_OK;
        }
    char list[128] = "";
    for (int i = 0; allowed[i]; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s\"%s\"", i ? " or " : "", allowed[i]);
    return mn_error(MN_ERR_FORMAT, "%s:%d: \"%s%s\" = %s%s%s, expected %s: %s", o->where, v->line, o->path, key,
                    v->type == JSON_STRING ? "\"" : "", v->type == JSON_STRING ? v->string : "(not a string)",
                    v->type == JSON_STRING ? "\"" : "", list, why);
}

// An object member (NULL when absent or null; MN_ERR_FORMAT when something else).
static int get_object(const Obj *o, const char *key, const Json **out) {
    const Json *v = member(o, key);
    *out = NULL;
    if (v && v->type != JSON_OBJECT)
        return mn_error(MN_ERR_FORMAT, "%s:%d: \"%s%s\" must be an object or null", o->where, v->line, o->path, key);
    *out = v;
    return MN_OK;
}

// NX-AI's UpProjConfigMixin._set_proj_up_dim: int(ceil(factor * E / mult) * mult) (floor where
// round_proj_up_dim_up is false), in doubles as Python computes it; -1 when out of range.
static long long proj_up_dim(double factor, int up, int mult, int E) {
    double k = factor * E / mult;
    k = up ? ceil(k) : floor(k);
    return k >= 0 && k * mult < 2147483647.0 ? (long long)k * mult : -1;
}

// The up-projection width of the object at o (mLSTM layer, feed-forward config) for width E.
static int read_proj(const Obj *o, double fallback, int E, int *width) {
    double f;
    int up, mult;
    MN_TRY(get_double(o, "proj_factor", fallback, &f));
    MN_TRY(get_flag(o, "round_proj_up_dim_up", 1, &up));
    MN_TRY(get_int(o, "round_proj_up_to_multiple_of", 64, 1, 1 << 20, &mult));
    long long w = proj_up_dim(f, up, mult, E);
    if (w < 1 || w > (1 << 20))
        return mn_error(MN_ERR_FORMAT, "%s: the width %sproj_factor x embedding_dim = %g x %d rounded to %d is %lld, "
                                       "expected 1 to %d", o->where, o->path, f, E, mult, w, 1 << 20);
    *width = (int)w;
    return MN_OK;
}

// The block kinds (0: mLSTM, 1: sLSTM) as NX-AI's xLSTMBlockStackConfig places them: every block
// sLSTM where there is no mlstm_block or slstm_at is "all", those of slstm_at otherwise (a saved
// _block_map where slstm_at is absent).
static int read_block_map(const Obj *top, int L, int have_mlstm, unsigned char *kind) {
    memset(kind, 0, (size_t)L);
    const Json *at = member(top, "slstm_at"), *map = member(top, "_block_map");
    if (!have_mlstm || (at && at->type == JSON_STRING && !strcmp(at->string, "all"))) {
        memset(kind, 1, (size_t)L);
        return MN_OK;
    }
    if (at) {
        if (at->type != JSON_ARRAY)
            return mn_error(MN_ERR_FORMAT, "%s:%d: \"slstm_at\" must be a list of block indices or \"all\"", top->where,
                            at->line);
        for (int i = 0; i < at->count; i++) {
            int b;
            MN_TRY(json_int(&at->items[i], "slstm_at", top->where, &b));
            if (b < 0 || b >= L)
                return mn_error(MN_ERR_FORMAT, "%s:%d: \"slstm_at\" names block %d, expected 0 to %d (num_blocks %d)",
                                top->where, at->line, b, L - 1, L);
            kind[b] = 1;
        }
        return MN_OK;
    }
    if (!map) return MN_OK;
    const char *p = map->type == JSON_STRING ? map->string : "";
    for (int i = 0; i < L; i++) {
        if ((p[0] != '0' && p[0] != '1') || (p[1] != (i + 1 < L ? ',' : 0)))
            return mn_error(MN_ERR_FORMAT, "%s:%d: \"_block_map\" must be %d digits 0 (mLSTM) or 1 (sLSTM) separated by "
                                           "commas", top->where, map->line, L);
        kind[i] = p[0] == '1';
        p += 2;
    }
    return MN_OK;
}

// The smallest period p of the block kinds (kind[i] = kind[i mod p]), among those that divide L
// where `divides`.
static int kind_period(const unsigned char *kind, int L, int divides) {
    for (int p = 1;; p++) {
        int ok = !divides || L % p == 0;
        for (int i = p; i < L && ok; i++) ok = kind[i] == kind[i % p];
        if (ok) return p;
    }
}

// The first p block kinds as mixer runs ("mlstm-block*3,slstm-block,..."), or the length needed.
static size_t kind_runs(const unsigned char *kind, int p, char *buf, size_t cap) {
    size_t len = 0;
    for (int i = 0; i < p;) {
        int k = 1;
        while (i + k < p && kind[i + k] == kind[i]) k++;
        const char *name = kind[i] ? "slstm-block" : "mlstm-block";
        char item[48];
        int w = snprintf(item, sizeof item, k > 1 ? "%s%s*%d" : "%s%s", i ? "," : "", name, k);
        if (len + (size_t)w < cap) memcpy(buf + len, item, (size_t)w + 1);
        len += (size_t)w;
        i += k;
    }
    return len;
}

// The mixer pattern of the block kinds, as runs: the blocks' whole sequence repeated exactly (its
// smallest period that divides the depth: "mlstm-block" for all mLSTM, "mlstm-block*3,slstm-block,
// mlstm-block*16,slstm-block,mlstm-block*3" for the paper's 125M model), or, where that exceeds the
// field, its smallest period (a pattern repeats over the blocks).
static int block_pattern(const unsigned char *kind, int L, char *out, size_t cap, const char *where) {
    size_t len = kind_runs(kind, kind_period(kind, L, 1), out, cap);
    if (len < cap) return MN_OK;
    len = kind_runs(kind, kind_period(kind, L, 0), out, cap);
    if (len < cap) return MN_OK;
    return mn_error(MN_ERR_FORMAT, "%s: the blocks' pattern (slstm_at) is %zu characters as mixer runs; mesanet's mixer "
                                   "field holds %zu", where, len, cap - 1);
}

int nxai_config_read(ModelConfig *c, const Json *j, const char *where) {
    if (!j || j->type != JSON_OBJECT) return mn_error(MN_ERR_FORMAT, "%s: NX-AI's config must be a JSON object", where);
    Obj top = {j, "", where};
    int E, L, V, ctx, tie;
    MN_TRY(get_int(&top, "embedding_dim", 128, 1, 65536, &E));
    MN_TRY(get_int(&top, "num_blocks", 1, 1, CONFIG_MAX_LAYERS, &L));
    MN_TRY(get_int(&top, "vocab_size", -1, 1, 1 << 24, &V));
    MN_TRY(get_int(&top, "context_length", -1, -1, 1 << 24, &ctx));
    MN_TRY(get_flag(&top, "tie_weights", 0, &tie));
    MN_TRY(want_flag(&top, "add_post_blocks_norm", 1, 1, "mesanet's models end with a norm before the head"));
    MN_TRY(want_flag(&top, "bias", 0, 0, "biases on the mLSTM layers' projections, which mesanet does not have"));
    const Json *mb, *sb;
    MN_TRY(get_object(&top, "mlstm_block", &mb));
    MN_TRY(get_object(&top, "slstm_block", &sb));
    unsigned char kind[CONFIG_MAX_LAYERS];
    MN_TRY(read_block_map(&top, L, mb != NULL, kind));
    int any_m = 0, any_s = 0;
    for (int i = 0; i < L; i++) any_m |= !kind[i], any_s |= kind[i];
    if (any_s && !sb)
        return mn_error(MN_ERR_FORMAT, "%s: slstm_at places sLSTM blocks but \"slstm_block\" is null", where);

    config_default(c);
    strcpy(c->arch, "paper");
    c->dim = E;
    c->n_layers = L;
    c->vocab_size = V;
    snprintf(c->norm, sizeof c->norm, "layernorm");
    c->norm_eps = NX_EPS;
    c->embed_scale = 0;
    c->logit_cap = 0;
    c->tie_embeddings = tie;
    if (ctx >= 2) c->seq_len = ctx;  // NX-AI's forward needs S <= context_length; ours has no limit
    int conv = 0;
    if (any_m) {
        const Json *m;
        Obj ob = {mb, "mlstm_block.", where};
        MN_TRY(get_object(&ob, "mlstm", &m));
        if (!m) return mn_error(MN_ERR_FORMAT, "%s: \"mlstm_block.mlstm\" is missing", where);
        Obj o = {m, "mlstm_block.mlstm.", where};
        int I, heads, bs;
        MN_TRY(read_proj(&o, 2.0, E, &I));
        MN_TRY(get_int(&o, "conv1d_kernel_size", 4, 0, 1 << 20, &conv));
        if (conv < 1 || conv > 8)
            return mn_error(MN_ERR_FORMAT, "%s: \"mlstm_block.mlstm.conv1d_kernel_size\" = %d, expected 1 to 8 (mesanet's "
                                           "convolutions; NX-AI's mLSTM layer cannot be made without one)", where, conv);
        MN_TRY(get_int(&o, "qkv_proj_blocksize", 4, 1, 1 << 20, &bs));
        if (bs != 4)
            return mn_error(MN_ERR_FORMAT, "%s: \"mlstm_block.mlstm.qkv_proj_blocksize\" = %d, expected 4 (mesanet's "
                                           "q, k, v projections have blocks of 4)", where, bs);
        MN_TRY(get_int(&o, "num_heads", 4, 1, 1024, &heads));
        if (I % heads || I % 4)
            return mn_error(MN_ERR_FORMAT, "%s: the mLSTM inner width %d must be a multiple of num_heads = %d and of 4",
                            where, I, heads);
        c->n_heads = heads;
        c->head_dim = I / heads;
    }
    if (any_s) {
        const Json *s, *ff;
        Obj ob = {sb, "slstm_block.", where};
        MN_TRY(get_object(&ob, "slstm", &s));
        MN_TRY(get_object(&ob, "feedforward", &ff));
        if (!s) return mn_error(MN_ERR_FORMAT, "%s: \"slstm_block.slstm\" is missing", where);
        if (!ff)
            return mn_error(MN_ERR_FORMAT, "%s: \"slstm_block.feedforward\" is null: an sLSTM block without its "
                                           "feed-forward part, which mesanet does not have", where);
        Obj o = {s, "slstm_block.slstm.", where}, f = {ff, "slstm_block.feedforward.", where};
        int heads, ks, F, gates;
        const char *str;
        static const char *const fn[] = {"slstm", NULL}, *const backends[] = {"cuda", "vanilla", NULL};
        static const char *const act[] = {"gelu", NULL}, *const fft[] = {"ffn_gated", NULL};
        MN_TRY(get_int(&o, "num_heads", 4, 1, 1024, &heads));
        MN_TRY(want_string(&o, "function", fn, "mesanet's cell is the sLSTM", &str));
        MN_TRY(want_string(&o, "backend", backends, "NX-AI's two sLSTM backends", &str));
        MN_TRY(get_int(&o, "num_gates", 4, 4, 4, &gates));
        const Json *clip = member(&o, "gradient_recurrent_clipval");
        if (clip)
            return mn_error(MN_ERR_FORMAT, "%s:%d: \"slstm_block.slstm.gradient_recurrent_clipval\" is set: NX-AI's CUDA "
                                           "sLSTM also clips its forward outputs with it, which mesanet does not do; "
                                           "expected null", where, clip->line);
        MN_TRY(get_int(&o, "conv1d_kernel_size", 4, 0, 1 << 20, &ks));
        if (ks < 1 || ks > 8)
            return mn_error(MN_ERR_FORMAT, "%s: \"slstm_block.slstm.conv1d_kernel_size\" = %d, expected 1 to 8: %s", where,
                            ks, ks ? "mesanet's convolutions" : "an sLSTM layer without its convolution, which mesanet "
                                                                "does not have");
        if (conv && ks != conv)
            return mn_error(MN_ERR_FORMAT, "%s: the sLSTM convolution (slstm_block.slstm.conv1d_kernel_size %d) differs "
                                           "from the mLSTM one (%d); mesanet's blocks share one conv_size", where, ks, conv);
        conv = ks;
        if (E % heads)
            return mn_error(MN_ERR_FORMAT, "%s: \"slstm_block.slstm.num_heads\" = %d does not divide embedding_dim = %d",
                            where, heads, E);
        MN_TRY(want_string(&f, "act_fn", act, "mesanet's sLSTM blocks have a GELU-gated feed-forward part", &str));
        MN_TRY(want_string(&f, "ff_type", fft, "mesanet's sLSTM blocks have a gated feed-forward part", &str));
        MN_TRY(want_flag(&f, "bias", 0, 0, "biases on the feed-forward part, which mesanet's sLSTM blocks do not have"));
        MN_TRY(read_proj(&f, 1.3, E, &F));
        c->slstm_heads = heads;
        c->mlp_hidden = F;
        if (!any_m) {  // (the backbone's head fields, which no sLSTM block reads)
            c->n_heads = heads;
            c->head_dim = E / heads > 1024 ? 1024 : E / heads;
        }
    }
    c->conv_size = conv;
    MN_TRY(block_pattern(kind, L, c->mixer, sizeof c->mixer, where));
    config_normalize(c);
    return config_validate(c, where);
}

// ------------------------------------------------------------------------------ tensors

// How one of our tensors comes from NX-AI's (and goes back).
typedef enum {
    T_COPY,    // the same values
    T_OFFSET,  // a norm's weight: ours = 1 + NX-AI's
    T_HALF0,   // the first half of the rows of NX-AI's tensor (proj_up: ours x, and the MLP's gate)
    T_HALF1,   // the second half
    T_KERNEL,  // the sLSTM's recurrent kernel (layout by backend)
    T_BIAS,    // the sLSTM's biases (order by backend)
} Conv;

// Our name: a mixer's own (after the block's prefix), or one of the block's by the architecture.
enum { N_LIT, N_MIXER_NORM, N_FFN_NORM, N_FFN_GATE, N_FFN_UP, N_FFN_DOWN };

typedef struct {
    int which;           // N_*: where our name comes from
    const char *ours;    // N_LIT: our name after the block's prefix
    const char *theirs;  // NX-AI's after "xlstm_block_stack.blocks.{i}."
    Conv how;
} Map;

static const Map mlstm_map[] = {
    {N_MIXER_NORM, NULL, "xlstm_norm.weight", T_OFFSET},
    {N_LIT, "xlstm.proj_up_x.weight", "xlstm.proj_up.weight", T_HALF0},
    {N_LIT, "xlstm.proj_up_z.weight", "xlstm.proj_up.weight", T_HALF1},
    {N_LIT, "xlstm.conv1d.weight", "xlstm.conv1d.conv.weight", T_COPY},
    {N_LIT, "xlstm.conv1d.bias", "xlstm.conv1d.conv.bias", T_COPY},
    {N_LIT, "xlstm.q_proj.weight", "xlstm.q_proj.weight", T_COPY},
    {N_LIT, "xlstm.k_proj.weight", "xlstm.k_proj.weight", T_COPY},
    {N_LIT, "xlstm.v_proj.weight", "xlstm.v_proj.weight", T_COPY},
    {N_LIT, "xlstm.igate.weight", "xlstm.mlstm_cell.igate.weight", T_COPY},
    {N_LIT, "xlstm.igate.bias", "xlstm.mlstm_cell.igate.bias", T_COPY},
    {N_LIT, "xlstm.fgate.weight", "xlstm.mlstm_cell.fgate.weight", T_COPY},
    {N_LIT, "xlstm.fgate.bias", "xlstm.mlstm_cell.fgate.bias", T_COPY},
    {N_LIT, "xlstm.outnorm.weight", "xlstm.mlstm_cell.outnorm.weight", T_OFFSET},
    {N_LIT, "xlstm.learnable_skip", "xlstm.learnable_skip", T_COPY},
    {N_LIT, "xlstm.proj_down.weight", "xlstm.proj_down.weight", T_COPY},
};

static const Map slstm_map[] = {
    {N_MIXER_NORM, NULL, "xlstm_norm.weight", T_OFFSET},
    {N_LIT, "xlstm.conv1d.weight", "xlstm.conv1d.conv.weight", T_COPY},
    {N_LIT, "xlstm.conv1d.bias", "xlstm.conv1d.conv.bias", T_COPY},
    // NX-AI's module "fgate" feeds the input gate and "igate" the forget gate (its sLSTMLayer.forward)
    {N_LIT, "xlstm.igate.weight", "xlstm.fgate.weight", T_COPY},
    {N_LIT, "xlstm.fgate.weight", "xlstm.igate.weight", T_COPY},
    {N_LIT, "xlstm.zgate.weight", "xlstm.zgate.weight", T_COPY},
    {N_LIT, "xlstm.ogate.weight", "xlstm.ogate.weight", T_COPY},
    {N_LIT, "xlstm.slstm_cell.recurrent_kernel", "xlstm.slstm_cell._recurrent_kernel_", T_KERNEL},
    {N_LIT, "xlstm.slstm_cell.bias", "xlstm.slstm_cell._bias_", T_BIAS},
    {N_LIT, "xlstm.group_norm.weight", "xlstm.group_norm.weight", T_OFFSET},
    {N_FFN_NORM, NULL, "ffn_norm.weight", T_OFFSET},
    {N_FFN_GATE, NULL, "ffn.proj_up.weight", T_HALF0},
    {N_FFN_UP, NULL, "ffn.proj_up.weight", T_HALF1},
    {N_FFN_DOWN, NULL, "ffn.proj_down.weight", T_COPY},
};

#define NMAP(m) ((int)(sizeof m / sizeof m[0]))

// Our name of a map entry, after the block's prefix.
static void our_suffix(const ModelConfig *c, const Map *e, char *out, size_t n) {
    const ArchNames *an = arch_names(c);
    switch (e->which) {
    case N_MIXER_NORM: snprintf(out, n, "%s.weight", an->mixer_norm); break;
    case N_FFN_NORM: snprintf(out, n, "%s.weight", an->ffn_norm); break;
    case N_FFN_GATE: snprintf(out, n, "%s.weight", an->ffn_gate); break;
    case N_FFN_UP: snprintf(out, n, "%s.weight", an->ffn_up); break;
    case N_FFN_DOWN: snprintf(out, n, "%s.weight", an->ffn_down); break;
    default: snprintf(out, n, "%s", e->ours); break;
    }
}

// The block's map by its mixer (NULL with an error for another mixer).
static const Map *block_map(const ModelConfig *c, int l, int *count) {
    const MixerOps *ops = mixer_at(c, l);
    if (ops && !strcmp(ops->name, "mlstm-block")) {
        *count = NMAP(mlstm_map);
        return mlstm_map;
    }
    if (ops && !strcmp(ops->name, "slstm-block")) {
        *count = NMAP(slstm_map);
        return slstm_map;
    }
    mn_error(MN_ERR_ARG, "block %d has mixer \"%s\": NX-AI's xLSTMLMModel has only mLSTM and sLSTM blocks (mlstm-block, "
                         "slstm-block)", l, ops ? ops->name : "?");
    return NULL;
}

// Which of our block tensors spec s is: its map entry and block (NULL with an error for none).
static const Map *find_entry(const ModelConfig *c, const ParamSpec *s, int *block) {
    int count;
    const Map *map = block_map(c, s->block, &count);
    if (!map) return NULL;
    char prefix[64], suffix[160];
    snprintf(prefix, sizeof prefix, arch_names(c)->block, s->block);
    size_t pl = strlen(prefix);
    for (int k = 0; k < count && !strncmp(s->name, prefix, pl); k++) {
        our_suffix(c, &map[k], suffix, sizeof suffix);
        if (!strcmp(s->name + pl, suffix)) {
            *block = s->block;
            return &map[k];
        }
    }
    mn_error(MN_ERR_ARG, "tensor \"%s\" has no counterpart in NX-AI's xLSTMLMModel", s->name);
    return NULL;
}

// The layout of the sLSTM's recurrent kernel `name` (H heads of Dh) in the file: 1 for the CUDA
// backend's [H, Dh, 4 Dh], 0 for the vanilla one's [H, 4 Dh, Dh].
static int kernel_layout(const WeightFile *w, const char *name, int64_t H, int64_t Dh, int *cuda) {
    int i = st_find(w->f, name), nd;
    const int64_t *sh;
    if (i < 0) return mn_error(MN_ERR_FORMAT, "%s: tensor '%s' not found", w->path, name);
    st_info(w->f, i, NULL, NULL, &nd, &sh);
    int vanilla = nd == 3 && sh[0] == H && sh[1] == 4 * Dh && sh[2] == Dh;
    *cuda = nd == 3 && sh[0] == H && sh[1] == Dh && sh[2] == 4 * Dh;
    if (vanilla || *cuda) return MN_OK;
    return mn_error(MN_ERR_FORMAT, "%s: tensor '%s' is not an sLSTM recurrent kernel of %lld heads of %lld: expected "
                                   "[%lld, %lld, %lld] (backend vanilla) or [%lld, %lld, %lld] (cuda)",
                    w->path, name, (long long)H, (long long)Dh, (long long)H, (long long)(4 * Dh), (long long)Dh,
                    (long long)H, (long long)Dh, (long long)(4 * Dh));
}

// Our tensor s (entry e of block l) from NX-AI's, into out.
static int read_block_tensor(WeightFile *w, const ModelConfig *c, const ParamSpec *s, const Map *e, int l, float *out) {
    char theirs[160], kernel[160];
    snprintf(theirs, sizeof theirs, NX_BLOCK "%s", l, e->theirs);
    int64_t n = (int64_t)s->numel;
    switch (e->how) {
    case T_COPY: return wf_read(w, theirs, out, s->ndim, s->shape);
    case T_OFFSET:
        if (!wf_has(w, theirs) && !strcmp(e->theirs, "xlstm.group_norm.weight")) {  // group_norm_weight false
            for (int64_t k = 0; k < n; k++) out[k] = 1;
            return MN_OK;
        }
        MN_TRY(wf_read(w, theirs, out, s->ndim, s->shape));
        for (int64_t k = 0; k < n; k++) out[k] = 1.0f + out[k];
        return MN_OK;
    case T_HALF0:
    case T_HALF1: {
        int64_t R = s->shape[0], C = s->shape[1];
        return wf_rows(w, theirs, 2, 2 * R, C, e->how == T_HALF1 ? R : 0, R, out);
    }
    case T_KERNEL:
    case T_BIAS: {
        int64_t H = c->slstm_heads, Dh = c->dim / c->slstm_heads, E = c->dim;
        int cuda;
        snprintf(kernel, sizeof kernel, NX_BLOCK "xlstm.slstm_cell._recurrent_kernel_", l);
        MN_TRY(kernel_layout(w, kernel, H, Dh, &cuda));
        float *t = malloc(sizeof(float) * (size_t)n);
        if (!t) return mn_error(MN_ERR_NOMEM, "out of memory");
        int64_t shape[3] = {H, cuda ? Dh : 4 * Dh, cuda ? 4 * Dh : Dh}, flat = 4 * E;
        int st = e->how == T_KERNEL ? wf_read(w, theirs, t, 3, shape) : wf_read(w, theirs, t, 1, &flat);
        if (!st && e->how == T_KERNEL)  // ours R[h, a, g, b]: CUDA's [h, a, g Dh + b] as it is; vanilla's [h, g Dh + b, a]
            for (int64_t h = 0; h < H; h++)
                for (int64_t a = 0; a < Dh; a++)
                    for (int64_t g = 0; g < 4; g++)
                        for (int64_t b = 0; b < Dh; b++)
                            out[((h * Dh + a) * 4 + g) * Dh + b] =
                                cuda ? t[((h * Dh + a) * 4 + g) * Dh + b] : t[(h * 4 * Dh + g * Dh + b) * Dh + a];
        if (!st && e->how == T_BIAS)  // ours [g, h, d]: vanilla's [g E + h Dh + d] as it is; CUDA's [h 4 Dh + g Dh + d]
            for (int64_t g = 0; g < 4; g++)
                for (int64_t h = 0; h < H; h++)
                    for (int64_t d = 0; d < Dh; d++)
                        out[(g * H + h) * Dh + d] = cuda ? t[h * 4 * Dh + g * Dh + d] : t[(g * H + h) * Dh + d];
        free(t);
        return st;
    }
    }
    return mn_error(MN_ERR_ARG, "internal: conversion %d", (int)e->how);
}

int nxai_weights_are(const StFile *f) {
    for (int i = 0; i < st_count(f); i++) {
        const char *name;
        st_info(f, i, &name, NULL, NULL, NULL);
        if (!strncmp(name, "xlstm_block_stack.", 18) || !strcmp(name, NX_EMBED)) return 1;
    }
    return 0;
}

int nxai_read(WeightFile *w, const ModelConfig *c, const ParamSpec *specs, int n, WeightSink sink, void *ctx) {
    size_t most = 1;
    for (int i = 0; i < n; i++)
        if (specs[i].numel > most) most = specs[i].numel;
    float *buf = malloc(sizeof(float) * most);
    if (!buf) return mn_error(MN_ERR_NOMEM, "out of memory");
    const ArchNames *an = arch_names(c);
    int st = MN_OK;
    for (int i = 0; i < n && !st; i++) {
        const ParamSpec *s = &specs[i];
        if (s->block >= 0) {
            int l;
            const Map *e = find_entry(c, s, &l);
            st = e ? read_block_tensor(w, c, s, e, l, buf) : MN_ERR_ARG;
        } else if (!strcmp(s->name, an->embed)) {  // tied: either of the two names (safetensors keeps one)
            const char *from = !wf_has(w, NX_EMBED) && c->tie_embeddings ? NX_HEAD : NX_EMBED;
            st = wf_read(w, from, buf, s->ndim, s->shape);
            if (c->tie_embeddings) wf_mark(w, NX_HEAD);
        } else if (!strcmp(s->name, an->final_norm)) {
            if (!(st = wf_read(w, NX_POST_NORM, buf, s->ndim, s->shape)))
                for (size_t k = 0; k < s->numel; k++) buf[k] = 1.0f + buf[k];
        } else if (!strcmp(s->name, "lm_head.weight")) {
            st = wf_read(w, NX_HEAD, buf, s->ndim, s->shape);
        } else {
            st = mn_error(MN_ERR_ARG, "tensor \"%s\" has no counterpart in NX-AI's xLSTMLMModel", s->name);
        }
        if (!st) st = sink(ctx, i, buf);
    }
    free(buf);
    return st;
}

// ------------------------------------------------------------------------------ writing

int nxai_check(const ModelConfig *c) {
    if (strcmp(c->head, "lm") || strcmp(c->norm, "layernorm") || c->norm_eps != NX_EPS || c->embed_scale ||
        c->logit_cap != 0)
        return mn_error(MN_ERR_ARG, "NX-AI's xLSTMLMModel has LayerNorm with eps 1e-5, no embedding scale, no logit cap "
                                    "and a language-model head: expected norm \"layernorm\", norm_eps 1e-05, embed_scale "
                                    "0, logit_cap 0, head \"lm\"; got norm \"%s\", norm_eps %g, embed_scale %d, logit_cap "
                                    "%g, head \"%s\"",
                        c->norm, (double)c->norm_eps, c->embed_scale, (double)c->logit_cap, c->head);
    for (int l = 0; l < c->n_layers; l++) {
        int count;
        if (!block_map(c, l, &count)) return MN_ERR_ARG;
    }
    return MN_OK;
}

// The factor, rounding multiple and direction with which NX-AI's _set_proj_up_dim gives back width
// `want` for E: its default (`dflt` and 64, up) where that does, else the nearest double to want / E
// with the largest power of two up to 64 that divides want.
static void proj_factor_for(int want, int E, double dflt, double *f, int *mult) {
    *f = dflt;
    *mult = 64;
    if (proj_up_dim(*f, 1, *mult, E) == want) return;
    while (want % *mult) *mult /= 2;
    *f = (double)want / E;
    for (int i = 0; i < 8 && proj_up_dim(*f, 1, *mult, E) > want; i++) *f = nextafter(*f, 0);
    for (int i = 0; i < 8 && proj_up_dim(*f, 1, *mult, E) < want; i++) *f = nextafter(*f, INFINITY);
}

// config.json as dataclasses.asdict(xLSTMLMModelConfig) writes it after __post_init__ (fields in
// declaration order; the top-level feed-forward config keeps embedding_dim -1 and _proj_up_dim 0
// as upstream's does; _block_idx null).
static int write_config(const char *path, const ModelConfig *c, const char *layout, const unsigned char *kind) {
    int any_m = 0, any_s = 0, E = c->dim, L = c->n_layers;
    for (int l = 0; l < L; l++) any_m |= !kind[l], any_s |= kind[l];
    AtomicFile af;
    MN_TRY(af_open(&af, path));
    FILE *f = af.f;
    char num[40];
    fprintf(f, "{\n");
    if (any_m) {
        double pf;
        int mult, I = c->n_heads * c->head_dim;
        proj_factor_for(I, E, 2.0, &pf, &mult);
        json_float_text(num, sizeof num, pf, 0);
        fprintf(f, "  \"mlstm_block\": {\n    \"mlstm\": {\n");
        fprintf(f, "      \"proj_factor\": %s,\n      \"round_proj_up_dim_up\": true,\n"
                   "      \"round_proj_up_to_multiple_of\": %d,\n      \"_proj_up_dim\": %d,\n", num, mult, I);
        fprintf(f, "      \"conv1d_kernel_size\": %d,\n      \"qkv_proj_blocksize\": 4,\n      \"num_heads\": %d,\n",
                c->conv_size, c->n_heads);
        fprintf(f, "      \"embedding_dim\": %d,\n      \"bias\": false,\n      \"dropout\": 0.0,\n"
                   "      \"context_length\": %d,\n      \"_num_blocks\": %d,\n      \"_inner_embedding_dim\": %d\n",
                E, c->seq_len, L, I);
        fprintf(f, "    },\n    \"_num_blocks\": %d,\n    \"_block_idx\": null\n  },\n", L);
    } else {
        fprintf(f, "  \"mlstm_block\": null,\n");
    }
    if (any_s) {
        double pf;
        int mult;
        proj_factor_for(c->mlp_hidden, E, 1.3, &pf, &mult);
        fprintf(f, "  \"slstm_block\": {\n    \"slstm\": {\n");
        fprintf(f, "      \"hidden_size\": %d,\n      \"num_heads\": %d,\n      \"num_states\": 4,\n", E, c->slstm_heads);
        fprintf(f, "      \"backend\": \"%s\",\n      \"function\": \"slstm\",\n", layout);
        fprintf(f, "      \"bias_init\": \"powerlaw_blockdependent\",\n      \"recurrent_weight_init\": \"zeros\",\n");
        fprintf(f, "      \"_block_idx\": null,\n      \"_num_blocks\": %d,\n      \"num_gates\": 4,\n", L);
        fprintf(f, "      \"gradient_recurrent_cut\": false,\n      \"gradient_recurrent_clipval\": null,\n"
                   "      \"forward_clipval\": null,\n      \"batch_size\": 8,\n");
        fprintf(f, "      \"input_shape\": \"BSGNH\",\n      \"internal_input_shape\": \"SBNGH\",\n"
                   "      \"output_shape\": \"BNSH\",\n      \"constants\": {},\n");
        fprintf(f, "      \"dtype\": \"bfloat16\",\n      \"dtype_b\": \"float32\",\n      \"dtype_r\": \"bfloat16\",\n"
                   "      \"dtype_w\": \"bfloat16\",\n      \"dtype_g\": \"bfloat16\",\n      \"dtype_s\": \"bfloat16\",\n"
                   "      \"dtype_a\": \"float32\",\n");
        fprintf(f, "      \"enable_automatic_mixed_precision\": true,\n      \"initial_val\": 0.0,\n");
        fprintf(f, "      \"embedding_dim\": %d,\n      \"conv1d_kernel_size\": %d,\n      \"group_norm_weight\": true,\n"
                   "      \"dropout\": 0.0\n    },\n", E, c->conv_size);
        json_float_text(num, sizeof num, pf, 0);
        fprintf(f, "    \"feedforward\": {\n      \"proj_factor\": %s,\n      \"round_proj_up_dim_up\": true,\n", num);
        fprintf(f, "      \"round_proj_up_to_multiple_of\": %d,\n      \"_proj_up_dim\": 0,\n      \"act_fn\": \"gelu\",\n"
                   "      \"embedding_dim\": -1,\n      \"dropout\": 0.0,\n      \"bias\": false,\n"
                   "      \"ff_type\": \"ffn_gated\",\n      \"_num_blocks\": 1\n    },\n", mult);
        fprintf(f, "    \"_num_blocks\": %d,\n    \"_block_idx\": null\n  },\n", L);
    } else {
        fprintf(f, "  \"slstm_block\": null,\n");
    }
    fprintf(f, "  \"context_length\": %d,\n  \"num_blocks\": %d,\n  \"embedding_dim\": %d,\n", c->seq_len, L, E);
    fprintf(f, "  \"add_post_blocks_norm\": true,\n  \"bias\": false,\n  \"dropout\": 0.0,\n  \"slstm_at\": [");
    for (int l = 0, k = 0; l < L; l++)
        if (kind[l]) fprintf(f, "%s%d", k++ ? ", " : "", l);
    fprintf(f, "],\n  \"_block_map\": \"");
    for (int l = 0; l < L; l++) fprintf(f, "%s%d", l ? "," : "", kind[l]);
    fprintf(f, "\",\n  \"vocab_size\": %d,\n  \"tie_weights\": %s,\n", c->vocab_size, c->tie_embeddings ? "true" : "false");
    fprintf(f, "  \"weight_decay_on_embedding\": false,\n  \"add_embedding_dropout\": false\n}\n");
    return af_commit(&af);
}

// NX-AI's tensors as they are built: a name, a shape, float data.
typedef struct {
    char name[128];
    int ndim;
    int64_t shape[3];
    float *data;
} OutTensor;

typedef struct {
    OutTensor *t;
    int n, cap;
} OutList;

// The tensor `name` of the list, added (zeroed, of the given shape) where it is not there yet.
static OutTensor *out_get(OutList *o, const char *name, int ndim, const int64_t *shape) {
    for (int i = 0; i < o->n; i++)
        if (!strcmp(o->t[i].name, name)) return &o->t[i];
    if (o->n == o->cap) {
        mn_error(MN_ERR_ARG, "internal: more NX-AI tensors than counted");
        return NULL;
    }
    OutTensor *t = &o->t[o->n];
    size_t numel = 1;
    for (int d = 0; d < ndim; d++) numel *= (size_t)shape[d];
    if (!(t->data = calloc(numel ? numel : 1, sizeof(float)))) {
        mn_error(MN_ERR_NOMEM, "out of memory");
        return NULL;
    }
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
    o->n++;
    return t;
}

// Our tensor s (entry e of block l, values v) into NX-AI's, in the sLSTM layout `cuda`.
static int write_block_tensor(OutList *o, const ModelConfig *c, const ParamSpec *s, const Map *e, int l, const float *v,
                              int cuda) {
    char theirs[160];
    snprintf(theirs, sizeof theirs, NX_BLOCK "%s", l, e->theirs);
    int64_t n = (int64_t)s->numel, H = c->slstm_heads, Dh = c->dim / c->slstm_heads, E = c->dim;
    OutTensor *t;
    switch (e->how) {
    case T_COPY:
    case T_OFFSET:
        if (!(t = out_get(o, theirs, s->ndim, s->shape))) return MN_ERR_NOMEM;
        for (int64_t k = 0; k < n; k++) t->data[k] = e->how == T_OFFSET ? v[k] - 1.0f : v[k];
        return MN_OK;
    case T_HALF0:
    case T_HALF1: {
        int64_t shape[2] = {2 * s->shape[0], s->shape[1]};
        if (!(t = out_get(o, theirs, 2, shape))) return MN_ERR_NOMEM;
        memcpy(t->data + (e->how == T_HALF1 ? n : 0), v, sizeof(float) * (size_t)n);
        return MN_OK;
    }
    case T_KERNEL: {
        int64_t shape[3] = {H, cuda ? Dh : 4 * Dh, cuda ? 4 * Dh : Dh};
        if (!(t = out_get(o, theirs, 3, shape))) return MN_ERR_NOMEM;
        for (int64_t h = 0; h < H; h++)
            for (int64_t a = 0; a < Dh; a++)
                for (int64_t g = 0; g < 4; g++)
                    for (int64_t b = 0; b < Dh; b++)
                        t->data[cuda ? ((h * Dh + a) * 4 + g) * Dh + b : (h * 4 * Dh + g * Dh + b) * Dh + a] =
                            v[((h * Dh + a) * 4 + g) * Dh + b];
        return MN_OK;
    }
    case T_BIAS: {
        int64_t flat = 4 * E;
        if (!(t = out_get(o, theirs, 1, &flat))) return MN_ERR_NOMEM;
        for (int64_t g = 0; g < 4; g++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t d = 0; d < Dh; d++)
                    t->data[cuda ? h * 4 * Dh + g * Dh + d : (g * H + h) * Dh + d] = v[(g * H + h) * Dh + d];
        return MN_OK;
    }
    }
    return mn_error(MN_ERR_ARG, "internal: conversion %d", (int)e->how);
}

int nxai_write(const char *dir, const ModelConfig *c, const ParamSpec *specs, int n, float *const *vals,
               const char *layout) {
    if (strcmp(layout, "vanilla") && strcmp(layout, "cuda"))
        return mn_error(MN_ERR_ARG, "NX-AI's sLSTM layout \"%s\": expected \"vanilla\" or \"cuda\"", layout);
    MN_TRY(nxai_check(c));
    int cuda = !strcmp(layout, "cuda");
    unsigned char kind[CONFIG_MAX_LAYERS];
    for (int l = 0; l < c->n_layers; l++) kind[l] = !strcmp(mixer_at(c, l)->name, "slstm-block");
    const ArchNames *an = arch_names(c);
    OutList o = {calloc((size_t)n + 2, sizeof(OutTensor)), 0, n + 2};
    int st = o.t ? MN_OK : mn_error(MN_ERR_NOMEM, "out of memory"), embed = -1, norm = -1, head = -1;
    for (int i = 0; i < n && !st; i++) {  // the blocks first, as NX-AI's state dict has them
        const ParamSpec *s = &specs[i];
        if (s->block < 0) {
            if (!strcmp(s->name, an->embed)) embed = i;
            else if (!strcmp(s->name, an->final_norm)) norm = i;
            else if (!strcmp(s->name, "lm_head.weight")) head = i;
            else st = mn_error(MN_ERR_ARG, "tensor \"%s\" has no counterpart in NX-AI's xLSTMLMModel", s->name);
            continue;
        }
        int l;
        const Map *e = find_entry(c, s, &l);
        st = e ? write_block_tensor(&o, c, s, e, l, vals[i], cuda) : MN_ERR_ARG;
    }
    if (!st && (embed < 0 || norm < 0 || (head < 0) != (c->tie_embeddings != 0)))
        st = mn_error(MN_ERR_ARG, "internal: the model's embedding, final norm or head is missing");
    if (!st) {
        const ParamSpec *se = &specs[embed];
        OutTensor *t = out_get(&o, NX_POST_NORM, specs[norm].ndim, specs[norm].shape);
        for (size_t k = 0; t && k < specs[norm].numel; k++) t->data[k] = vals[norm][k] - 1.0f;
        OutTensor *te = t ? out_get(&o, NX_EMBED, se->ndim, se->shape) : NULL;
        if (te) memcpy(te->data, vals[embed], sizeof(float) * se->numel);
        // tied: both names, as the module's state dict has them (load_state_dict wants both)
        const float *hv = c->tie_embeddings ? vals[embed] : head >= 0 ? vals[head] : NULL;
        OutTensor *th = te && hv ? out_get(&o, NX_HEAD, se->ndim, se->shape) : NULL;
        if (th) memcpy(th->data, hv, sizeof(float) * se->numel);
        if (!t || !te || !th) st = MN_ERR_NOMEM;
    }
    if (!st) {
        struct stat sb;
        if (stat(dir, &sb) && (st = mn_mkdirs(dir))) goto done;
        char path[4096];
        snprintf(path, sizeof path, "%s/config.json", dir);
        if ((st = write_config(path, c, layout, kind))) goto done;
        StTensor *tt = calloc((size_t)o.n, sizeof(StTensor));
        if (!tt) {
            st = mn_error(MN_ERR_NOMEM, "out of memory");
            goto done;
        }
        for (int i = 0; i < o.n; i++) {
            tt[i].name = o.t[i].name;
            tt[i].dtype = ST_F32;
            tt[i].ndim = o.t[i].ndim;
            for (int d = 0; d < o.t[i].ndim; d++) tt[i].shape[d] = o.t[i].shape[d];
            tt[i].data = o.t[i].data;
        }
        StMeta meta[] = {{"format", "pt"}, {"producer", "mesanet"}};
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        st = st_write(path, tt, o.n, meta, 2);
        free(tt);
    }
done:
    for (int i = 0; i < o.n; i++) free(o.t[i].data);
    free(o.t);
    return st;
}
