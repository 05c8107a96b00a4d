#include "checkpoint.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "core/safetensors.h"

static void join(char *out, size_t n, const char *dir, const char *file) { snprintf(out, n, "%s/%s", dir, file); }

// Downloads tensor i of a slab (parameters, or an optimizer moment) as float32.
static float *download(const Model *m, const void *slab, const ParamSpec *s, MemKind kind) {
    float *buf = malloc(sizeof(float) * (s->numel ? s->numel : 1));
    if (!buf) {
        mn_error(MN_ERR_NOMEM, "out of memory");
        return NULL;
    }
    const void *src = (const char *)slab + s->offset * m->be->elem_size(m->be, kind);
    if (m->be->download_f32(m->be, buf, src, s->numel, kind)) {
        free(buf);
        return NULL;
    }
    return buf;
}

// Writes the tensors of one or more slabs under name prefixes, with metadata.
static int write_slabs(const char *path, const Model *m, const void *const *slabs, const char *const *prefixes,
                       int nslabs, MemKind kind, const StMeta *meta, int nmeta) {
    int n = m->nparams * nslabs;
    StTensor *t = calloc((size_t)n, sizeof(StTensor));
    char (*names)[112] = calloc((size_t)n, sizeof *names);
    float **bufs = calloc((size_t)n, sizeof(float *));
    int s = (!t || !names || !bufs) ? mn_error(MN_ERR_NOMEM, "out of memory") : MN_OK;
    for (int k = 0; k < nslabs && !s; k++)
        for (int i = 0; i < m->nparams && !s; i++) {
            int j = k * m->nparams + i;
            const ParamSpec *p = &m->specs[i];
            snprintf(names[j], sizeof names[j], "%s%s", prefixes[k], p->name);
            if (!(bufs[j] = download(m, slabs[k], p, kind))) {
                s = MN_ERR_NOMEM;
                break;
            }
            t[j].name = names[j];
            t[j].dtype = ST_F32;
            t[j].ndim = p->ndim;
            for (int d = 0; d < p->ndim; d++) t[j].shape[d] = p->shape[d];
            t[j].data = bufs[j];
        }
    if (!s) s = st_write(path, t, n, meta, nmeta);
    for (int j = 0; j < n && bufs; j++) free(bufs[j]);
    free(bufs);
    free(names);
    free(t);
    return s;
}

int checkpoint_save_model(const char *dir, const Model *m, int step) {
    char path[4096], stepstr[32];
    join(path, sizeof path, dir, "config.json");
    MN_TRY(config_save(&m->cfg, path));
    snprintf(stepstr, sizeof stepstr, "%d", step);
    // "format": "pt" is what Hugging Face's loader expects of a PyTorch checkpoint.
    StMeta meta[] = {{"format", "pt"}, {"producer", "mesanet"}, {"arch", m->cfg.arch}, {"step", stepstr}};
    join(path, sizeof path, dir, "model.safetensors");
    const void *slabs[1] = {m->params};
    const char *prefixes[1] = {""};
    return write_slabs(path, m, slabs, prefixes, 1, MEM_PARAM, meta, 4);
}

// Reads every tensor of `m` (shapes checked) from f, named prefix + name, into
// the slab; tensors in the file that the model lacks are refused.
static int read_slab(StFile *f, const char *path, const Model *m, void *slab, const char *prefix, MemKind kind) {
    size_t most = 1;
    for (int i = 0; i < m->nparams; i++)
        if (m->specs[i].numel > most) most = m->specs[i].numel;
    float *buf = malloc(sizeof(float) * most);
    if (!buf) return mn_error(MN_ERR_NOMEM, "out of memory");
    int s = MN_OK;
    for (int i = 0; i < m->nparams && !s; i++) {
        const ParamSpec *p = &m->specs[i];
        char name[112];
        snprintf(name, sizeof name, "%s%s", prefix, p->name);
        s = st_read_f32(f, name, buf, (int64_t)p->numel, p->ndim, p->shape);
        if (!s) s = m->be->upload_f32(m->be, (char *)slab + p->offset * m->be->elem_size(m->be, kind), buf, p->numel, kind);
    }
    free(buf);
    if (s) return s;
    size_t plen = strlen(prefix);
    for (int i = 0; i < st_count(f); i++) {
        const char *name;
        st_info(f, i, &name, NULL, NULL, NULL);
        if (strncmp(name, prefix, plen)) continue;
        if (model_find_param(m, name + plen) < 0)
            return mn_error(MN_ERR_FORMAT, "%s: tensor \"%s\" does not belong to this model (config and weights differ)",
                            path, name);
    }
    return MN_OK;
}

int checkpoint_load_weights(const char *path, Model *m) {
    StFile *f;
    MN_TRY(st_open(path, &f));
    int s = read_slab(f, path, m, m->params, "", MEM_PARAM);
    st_close(f);
    return s;
}

int checkpoint_load_model(const char *dir, const Backend *be, Model **out) {
    char path[4096];
    ModelConfig cfg;
    join(path, sizeof path, dir, "config.json");
    if (access(path, R_OK)) return mn_error(MN_ERR_IO, "%s: missing (not a checkpoint directory?)", path);
    MN_TRY(config_load(&cfg, path));
    Model *m;
    MN_TRY(model_create(&m, &cfg, be));
    join(path, sizeof path, dir, "model.safetensors");
    int s = checkpoint_load_weights(path, m);
    if (s) {
        model_free(m);
        return s;
    }
    *out = m;
    return MN_OK;
}

int checkpoint_save_state(const char *dir, const Model *m, const AdamW *o, const TrainState *t) {
    char path[4096], v[6][32];
    snprintf(v[0], 32, "%d", t->step);
    snprintf(v[1], 32, "%" PRIu64, t->epoch);
    snprintf(v[2], 32, "%" PRIu64, t->index);
    snprintf(v[3], 32, "%" PRIu64, t->seed);
    snprintf(v[4], 32, "%.17g", t->tokens);
    snprintf(v[5], 32, "%.17g", t->elapsed);
    StMeta meta[] = {{"format", "pt"}, {"producer", "mesanet"}, {"step", v[0]}, {"epoch", v[1]},
                     {"index", v[2]},  {"seed", v[3]},           {"tokens", v[4]}, {"elapsed", v[5]}};
    join(path, sizeof path, dir, "optimizer.safetensors");
    const void *slabs[2] = {o->m, o->v};
    const char *prefixes[2] = {"m.", "v."};
    return write_slabs(path, m, slabs, prefixes, 2, MEM_F32, meta, 8);
}

static int meta_u64(const StFile *f, const char *path, const char *key, uint64_t *out) {
    const char *v = st_meta(f, key);
    char *end;
    if (!v || !*v) return mn_error(MN_ERR_FORMAT, "%s: metadata \"%s\" is missing", path, key);
    *out = strtoull(v, &end, 10);
    if (*end) return mn_error(MN_ERR_FORMAT, "%s: metadata \"%s\" = \"%s\" is not a number", path, key, v);
    return MN_OK;
}

int checkpoint_load_state(const char *dir, const Model *m, AdamW *o, TrainState *t) {
    char path[4096], mpath[4096];
    join(path, sizeof path, dir, "optimizer.safetensors");
    join(mpath, sizeof mpath, dir, "model.safetensors");
    StFile *f, *mf;
    MN_TRY(st_open(path, &f));
    uint64_t step = 0, model_step = 0;
    int s = meta_u64(f, path, "step", &step);
    if (!s && !(s = st_open(mpath, &mf))) {
        s = meta_u64(mf, mpath, "step", &model_step);
        st_close(mf);
        if (!s && model_step != step)
            s = mn_error(MN_ERR_FORMAT, "%s is at step %" PRIu64 " but %s at step %" PRIu64 ": an interrupted save?", mpath,
                         model_step, path, step);
    }
    if (!s) s = meta_u64(f, path, "epoch", &t->epoch);
    if (!s) s = meta_u64(f, path, "index", &t->index);
    if (!s) s = meta_u64(f, path, "seed", &t->seed);
    if (!s) {
        const char *tok = st_meta(f, "tokens"), *el = st_meta(f, "elapsed");
        t->tokens = tok ? strtod(tok, NULL) : 0;
        t->elapsed = el ? strtod(el, NULL) : 0;
        t->step = (int)step;
        o->step = (int)step;
    }
    if (!s) s = read_slab(f, path, m, o->m, "m.", MEM_F32);
    if (!s) s = read_slab(f, path, m, o->v, "v.", MEM_F32);
    st_close(f);
    return s;
}

int checkpoint_exists(const char *dir) {
    char a[4096], b[4096], c[4096];
    join(a, sizeof a, dir, "config.json");
    join(b, sizeof b, dir, "model.safetensors");
    join(c, sizeof c, dir, "optimizer.safetensors");
    return !access(a, R_OK) && !access(b, R_OK) && !access(c, R_OK);
}
