// A model's weights from a safetensors file in the layouts mesanet reads (weights.h).
#include "weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "model/format_longhorn.h"
#include "model/format_nxai.h"
#include "model/names.h"

int wf_open(WeightFile *w, const char *path) {
    memset(w, 0, sizeof *w);
    MN_TRY(st_open(path, &w->f));
    w->path = path;
    w->used = calloc((size_t)st_count(w->f) + 1, 1);
    if (!w->used) {
        st_close(w->f);
        w->f = NULL;
        return mn_error(MN_ERR_NOMEM, "out of memory");
    }
    return MN_OK;
}

void wf_close(WeightFile *w) {
    st_close(w->f);
    free(w->used);
    memset(w, 0, sizeof *w);
}

int wf_has(const WeightFile *w, const char *name) { return st_find(w->f, name) >= 0; }

void wf_mark(WeightFile *w, const char *name) {
    int i = st_find(w->f, name);
    if (i >= 0) w->used[i] = 1;
}

int wf_read(WeightFile *w, const char *name, float *out, int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    MN_TRY(st_read_f32(w->f, name, out, n, ndim, shape));
    wf_mark(w, name);
    return MN_OK;
}

int wf_rows(WeightFile *w, const char *name, int ndim, int64_t rows, int64_t cols, int64_t r0, int64_t nrows, float *out) {
    if (r0 < 0 || nrows < 0 || r0 + nrows > rows)
        return mn_error(MN_ERR_ARG, "%s: rows %lld to %lld of tensor '%s' of %lld rows", w->path, (long long)r0,
                        (long long)(r0 + nrows), name, (long long)rows);
    int64_t shape[2] = {rows, cols};
    size_t numel = (size_t)(rows * cols);
    float *all = malloc(sizeof(float) * (numel ? numel : 1));
    if (!all) return mn_error(MN_ERR_NOMEM, "out of memory");
    int s = wf_read(w, name, all, ndim, shape);
    if (!s) memcpy(out, all + r0 * cols, sizeof(float) * (size_t)(nrows * cols));
    free(all);
    return s;
}

int wf_check_used(const WeightFile *w, const char *why) {
    for (int i = 0; i < st_count(w->f); i++) {
        if (w->used[i]) continue;
        const char *name;
        st_info(w->f, i, &name, NULL, NULL, NULL);
        return mn_error(MN_ERR_FORMAT, "%s: tensor \"%s\" %s", w->path, name, why);
    }
    return MN_OK;
}

int weights_find(const ParamSpec *specs, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(specs[i].name, name)) return i;
    return -1;
}

// A tensor of transformers' xLSTMForCausalLM under another spelling than ours (weight_mode
// "single", q / k / v): the names of weight_mode "fused", whose tensors are ours concatenated along
// their rows (docs/spec/reference/xlstm-formats.md 1.3), and the query / key / value of older
// transformers. `suffix` is our name after the block's prefix; *found = 0 when none applies.
static int xlstm_other_spelling(WeightFile *w, const ModelConfig *c, const char *prefix, const char *suffix,
                                const ParamSpec *s, float *out, int *found) {
    int64_t D = c->dim, H = c->n_heads, QK = H * c->head_dim, V = H * (c->head_v_dim ? c->head_v_dim : c->head_dim);
    int64_t F = c->mlp_hidden;
    static const char *const renamed[3][2] = {{"mlstm_layer.q.weight", "mlstm_layer.query.weight"},
                                              {"mlstm_layer.k.weight", "mlstm_layer.key.weight"},
                                              {"mlstm_layer.v.weight", "mlstm_layer.value.weight"}};
    struct {
        const char *ours, *fused;
        int ndim;
        int64_t rows, cols, r0, nrows;
    } parts[] = {
        {"mlstm_layer.q.weight", "mlstm_layer.qkv_opreact.weight", 2, 2 * QK + 2 * V, D, 0, QK},
        {"mlstm_layer.k.weight", "mlstm_layer.qkv_opreact.weight", 2, 2 * QK + 2 * V, D, QK, QK},
        {"mlstm_layer.v.weight", "mlstm_layer.qkv_opreact.weight", 2, 2 * QK + 2 * V, D, 2 * QK, V},
        {"mlstm_layer.ogate_preact.weight", "mlstm_layer.qkv_opreact.weight", 2, 2 * QK + 2 * V, D, 2 * QK + V, V},
        {"mlstm_layer.igate_preact.weight", "mlstm_layer.ifgate_preact.weight", 2, 2 * H, D, 0, H},
        {"mlstm_layer.fgate_preact.weight", "mlstm_layer.ifgate_preact.weight", 2, 2 * H, D, H, H},
        {"mlstm_layer.igate_preact.bias", "mlstm_layer.ifgate_preact.bias", 1, 2 * H, 1, 0, H},
        {"mlstm_layer.fgate_preact.bias", "mlstm_layer.ifgate_preact.bias", 1, 2 * H, 1, H, H},
        {"ffn.proj_up_gate.weight", "ffn.proj_up_gate_z.weight", 2, 2 * F, D, 0, F},
        {"ffn.proj_up.weight", "ffn.proj_up_gate_z.weight", 2, 2 * F, D, F, F},
    };
    char name[160];
    *found = 0;
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "%s%s", prefix, renamed[i][1]);
        if (strcmp(suffix, renamed[i][0]) || !wf_has(w, name)) continue;
        *found = 1;
        return wf_read(w, name, out, s->ndim, s->shape);
    }
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        snprintf(name, sizeof name, "%s%s", prefix, parts[i].fused);
        if (strcmp(suffix, parts[i].ours) || !wf_has(w, name)) continue;
        *found = 1;
        return wf_rows(w, name, parts[i].ndim, parts[i].rows, parts[i].cols, parts[i].r0, parts[i].nrows, out);
    }
    return MN_OK;
}

// Each [n, n] matrix of the last two dimensions transposed in place (its own inverse).
static int transpose_last2(const ParamSpec *s, float *data) {
    if (s->ndim < 2 || s->shape[s->ndim - 1] != s->shape[s->ndim - 2])
        return mn_error(MN_ERR_ARG, "tensor '%s': stored transposed, but its last two dimensions are not equal", s->name);
    size_t n = (size_t)s->shape[s->ndim - 1];
    for (size_t m = 0; m < s->numel / (n * n); m++) {
        float *a = data + m * n * n;
        for (size_t r = 0; r < n; r++)
            for (size_t c = r + 1; c < n; c++) {
                float t = a[r * n + c];
                a[r * n + c] = a[c * n + r];
                a[c * n + r] = t;
            }
    }
    return MN_OK;
}

int weights_to_file(const ParamSpec *s, float *data) {
    for (size_t i = 0; i < s->numel && s->file_offset != 0; i++) data[i] -= s->file_offset;
    return s->file_transpose ? transpose_last2(s, data) : MN_OK;
}

int weights_from_file(const ParamSpec *s, float *data) {
    for (size_t i = 0; i < s->numel && s->file_offset != 0; i++) data[i] += s->file_offset;
    return s->file_transpose ? transpose_last2(s, data) : MN_OK;
}

// Our tensor s: under its own name, or (the xlstm architecture) under transformers' other spellings.
static int read_ours(WeightFile *w, const ModelConfig *c, const ParamSpec *s, float *out) {
    if (!wf_has(w, s->name) && !strcmp(c->arch, "xlstm") && s->block >= 0) {
        char prefix[64];
        snprintf(prefix, sizeof prefix, arch_names(c)->block, s->block);
        size_t pl = strlen(prefix);
        int found;
        if (!strncmp(s->name, prefix, pl)) {
            MN_TRY(xlstm_other_spelling(w, c, prefix, s->name + pl, s, out, &found));
            if (found) return MN_OK;
        }
    }
    return wf_read(w, s->name, out, s->ndim, s->shape);  // (absent: the error names it)
}

int weights_read(const char *path, const ModelConfig *c, const ParamSpec *specs, int n, WeightSink sink, void *ctx) {
    WeightFile w;
    MN_TRY(wf_open(&w, path));
    int s;
    if (nxai_weights_are(w.f)) {
        s = nxai_read(&w, c, specs, n, sink, ctx);
    } else if (longhorn_weights_are(w.f)) {
        s = longhorn_read(&w, c, specs, n, sink, ctx);
    } else {
        size_t most = 1;
        for (int i = 0; i < n; i++)
            if (specs[i].numel > most) most = specs[i].numel;
        float *buf = malloc(sizeof(float) * most);
        s = buf ? MN_OK : mn_error(MN_ERR_NOMEM, "out of memory");
        for (int i = 0; i < n && !s; i++)
            if (!(s = read_ours(&w, c, &specs[i], buf)) && !(s = weights_from_file(&specs[i], buf))) s = sink(ctx, i, buf);
        free(buf);
    }
    if (!s) s = wf_check_used(&w, "does not belong to this model (config and weights differ)");
    wf_close(&w);
    return s;
}
