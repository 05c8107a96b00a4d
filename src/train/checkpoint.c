#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/atomic_file.h"
#include "core/common.h"
#include "core/safetensors.h"
#include "model/format_longhorn.h"
#include "model/format_nxai.h"
#include "model/weights.h"

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
            if (kind == MEM_PARAM && (s = weights_to_file(p, bufs[j]))) break;  // the values as the file holds them
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

// dir/model.safetensors.
static int save_weights(const char *dir, const Model *m, int step) {
    char path[4096], stepstr[32];
    snprintf(stepstr, sizeof stepstr, "%d", step);
    // "format": "pt" is what Hugging Face's loader expects of a PyTorch checkpoint.
    StMeta meta[] = {{"format", "pt"}, {"producer", "mesanet"}, {"arch", m->cfg.arch}, {"step", stepstr}};
    join(path, sizeof path, dir, "model.safetensors");
    const void *slabs[1] = {m->params};
    const char *prefixes[1] = {""};
    return write_slabs(path, m, slabs, prefixes, 1, MEM_PARAM, meta, 4);
}

int checkpoint_save_model(const char *dir, const Model *m, int step) {
    char path[4096];
    join(path, sizeof path, dir, "config.json");
    MN_TRY(config_save(&m->cfg, path));
    return save_weights(dir, m, step);
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

// weights_read's sink: tensor i into the model's parameters.
static int upload_param(void *ctx, int i, const float *data) {
    Model *m = ctx;
    const ParamSpec *p = &m->specs[i];
    return m->be->upload_f32(m->be, (char *)m->params + p->offset * m->be->elem_size(m->be, MEM_PARAM), data, p->numel,
                             MEM_PARAM);
}

int checkpoint_load_weights(const char *path, Model *m) {
    return weights_read(path, &m->cfg, m->specs, m->nparams, upload_param, m);
}

int checkpoint_load_model(const char *run, const Backend *be, Model **out) {
    char path[4096], dir[4096];
    ModelConfig cfg;
    MN_TRY(checkpoint_dir(run, dir, sizeof dir));
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

// weights_read's sink for checkpoint_export: tensor i into a host copy.
static int keep_host(void *ctx, int i, const float *data) {
    void **c = ctx;
    const ParamSpec *specs = c[0];
    float **vals = c[1];
    memcpy(vals[i], data, sizeof(float) * specs[i].numel);
    return MN_OK;
}

// Whether two paths name one directory (out need not exist).
static int same_dir(const char *a, const char *b) {
    char ra[4096], rb[4096];
    return realpath(a, ra) && realpath(b, rb) && !strcmp(ra, rb);
}

int checkpoint_export(const char *run, const char *out, const char *format, const char *layout) {
    int nxai = format && !strcmp(format, "nxai"), longhorn = format && !strcmp(format, "longhorn");
    if (!format || (!nxai && !longhorn && strcmp(format, "hf")))
        return mn_error(MN_ERR_ARG, "export: format \"%s\", expected \"hf\" (our checkpoint folder: Hugging Face's "
                                    "layout for the fla, llama, xlstm and recurrent_gemma architectures), \"nxai\" "
                                    "(NX-AI's xLSTMLMModel) or \"longhorn\" (the official LonghornLMHeadModel)",
                        format ? format : "");
    if (layout && !nxai) return mn_error(MN_ERR_ARG, "export: an sLSTM layout applies to the nxai format only");
    char dir[4096], path[4200];
    MN_TRY(checkpoint_dir(run, dir, sizeof dir));
    if (same_dir(dir, out) || same_dir(run, out))
        return mn_error(MN_ERR_ARG, "export: %s is the checkpoint's own directory; give another", out);
    join(path, sizeof path, dir, "config.json");
    if (access(path, R_OK)) return mn_error(MN_ERR_IO, "%s: missing (not a checkpoint directory?)", path);
    ModelConfig cfg;
    MN_TRY(config_load(&cfg, path));
    if (nxai) MN_TRY(nxai_check(&cfg));
    if (longhorn) MN_TRY(longhorn_check(&cfg));
    ParamSpec *specs;
    int n;
    MN_TRY(model_specs(&cfg, &specs, &n));
    float **vals = calloc((size_t)n, sizeof(float *));
    int s = vals ? MN_OK : mn_error(MN_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n && !s; i++)
        if (!(vals[i] = malloc(sizeof(float) * (specs[i].numel ? specs[i].numel : 1))))
            s = mn_error(MN_ERR_NOMEM, "out of memory for the weights (%s)", specs[i].name);
    void *ctx[2] = {specs, vals};
    join(path, sizeof path, dir, "model.safetensors");
    if (!s) s = weights_read(path, &cfg, specs, n, keep_host, ctx);
    if (!s && nxai) s = nxai_write(out, &cfg, specs, n, vals, layout ? layout : "vanilla");
    if (!s && longhorn) s = longhorn_write(out, &cfg, specs, n, vals);
    if (!s && !nxai && !longhorn) {
        StTensor *t = calloc((size_t)n, sizeof(StTensor));
        StMeta meta[] = {{"format", "pt"}, {"producer", "mesanet"}, {"arch", cfg.arch}};
        s = t ? mn_mkdirs(out) : mn_error(MN_ERR_NOMEM, "out of memory");
        for (int i = 0; i < n && !s; i++) {
            t[i].name = specs[i].name;
            t[i].dtype = ST_F32;
            t[i].ndim = specs[i].ndim;
            for (int d = 0; d < specs[i].ndim; d++) t[i].shape[d] = specs[i].shape[d];
            t[i].data = vals[i];
            s = weights_to_file(&specs[i], vals[i]);
        }
        join(path, sizeof path, out, "config.json");
        if (!s) s = config_save(&cfg, path);
        join(path, sizeof path, out, "model.safetensors");
        if (!s) s = st_write(path, t, n, meta, 3);
        free(t);
    }
    for (int i = 0; vals && i < n; i++) free(vals[i]);
    free(vals);
    free(specs);
    return s;
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

int checkpoint_load_state(const char *run, const Model *m, AdamW *o, TrainState *t) {
    char path[4096], mpath[4096], dir[4096];
    MN_TRY(checkpoint_dir(run, dir, sizeof dir));
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

// ------------------------------------------------------------------- checkpoints as sets

static const char *const set_files[3] = {"config.json", "model.safetensors", "optimizer.safetensors"};

int checkpoint_stop_point(const char *point, int step) {
    const char *v = getenv("MESANET_CHECKPOINT_STOP");
    if (!v || !*v) return MN_OK;
    size_t n = strcspn(v, "@");
    if (strlen(point) != n || strncmp(v, point, n)) return MN_OK;
    if (v[n] == '@' && atoi(v + n + 1) != step) return MN_OK;
    return mn_error(MN_ERR_IO, "the checkpoint of step %d stopped after '%s' (MESANET_CHECKPOINT_STOP=%s)", step, point, v);
}

// "step-" and digits, optionally "-" and digits: the names of step directories (and nothing that
// could leave the checkpoints directory).
static int is_step_name(const char *s, size_t len) {
    if (len < 6 || len > 40 || strncmp(s, "step-", 5)) return 0;
    size_t i = 5, digits = 0;
    while (i < len && s[i] >= '0' && s[i] <= '9') i++, digits++;
    if (!digits) return 0;
    if (i < len && s[i] == '-') {
        size_t more = 0;
        for (i++; i < len && s[i] >= '0' && s[i] <= '9'; i++) more++;
        if (!more) return 0;
    }
    return i == len;
}

// The step directory checkpoints/latest names, in name[cap] (*have = 1), or *have = 0 without one.
static int latest_name(const char *run, char *name, size_t cap, int *have) {
    char path[4096];
    snprintf(path, sizeof path, "%s/checkpoints/latest", run);
    *have = 0;
    if (access(path, F_OK)) {
        if (errno == ENOENT || errno == ENOTDIR) return MN_OK;
        return mn_error(MN_ERR_IO, "%s: %s", path, strerror(errno));
    }
    char *text;
    size_t n;
    MN_TRY(file_read_all(path, 256, &text, &n));
    if (n > 0 && text[n - 1] == '\n') n--;
    int ok = is_step_name(text, n) && n < cap;
    if (ok) {
        memcpy(name, text, n);
        name[n] = 0;
    }
    free(text);
    if (!ok) return mn_error(MN_ERR_FORMAT, "%s: does not name a step directory (step-<number>)", path);
    *have = 1;
    return MN_OK;
}

int checkpoint_dir(const char *dir, char *out, size_t n) {
    char name[64];
    int have;
    MN_TRY(latest_name(dir, name, sizeof name, &have));
    if (have) snprintf(out, n, "%s/checkpoints/%s", dir, name);
    else snprintf(out, n, "%s", dir);
    return MN_OK;
}

static int file_there(const char *dir, const char *file) {
    char path[4096];
    join(path, sizeof path, dir, file);
    return access(path, F_OK) == 0;
}

int checkpoint_find(const char *run, int *found) {
    char dir[4096], name[64];
    int have;
    *found = 0;
    MN_TRY(latest_name(run, name, sizeof name, &have));
    MN_TRY(checkpoint_dir(run, dir, sizeof dir));
    int there[3];
    for (int i = 0; i < 3; i++) there[i] = file_there(dir, set_files[i]);
    if (!have && !there[1] && !there[2]) return MN_OK;  // nothing saved (a config alone is no checkpoint)
    for (int i = 0; i < 3; i++) {
        if (there[i]) continue;
        char path[4096];
        join(path, sizeof path, dir, set_files[i]);
        if (i == 2 && there[1])
            return mn_error(MN_ERR_FORMAT,
                            "%s: missing: the checkpoint in %s holds the model's weights but not the optimizer state, so "
                            "training cannot resume from it (--no-resume starts afresh and replaces it; or give another "
                            "--out)",
                            path, dir);
        return mn_error(MN_ERR_FORMAT, "%s: missing: the checkpoint in %s is incomplete (--no-resume starts afresh and "
                        "replaces it; or give another --out)", path, dir);
    }
    *found = 1;
    return MN_OK;
}

// The step directory a checkpoint of `step` goes to: step-<step>, or, where that is the latest
// already (the same step saved again), step-<step>-1, so that the latest is never written into.
static int step_dir(const char *run, int step, char *name, size_t cap) {
    char latest[64];
    int have;
    MN_TRY(latest_name(run, latest, sizeof latest, &have));
    snprintf(name, cap, "step-%08d", step);
    if (have && !strcmp(name, latest)) snprintf(name, cap, "step-%08d-1", step);
    return MN_OK;
}

// Removes a step directory and the files in it (ours: the set's files and their temporaries).
static void remove_step_dir(const char *path) {
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char file[4096 + 256];
            snprintf(file, sizeof file, "%s/%s", path, e->d_name);
            unlink(file);
        }
        closedir(d);
    }
    rmdir(path);
}

// Removes every step directory but `keep` (NULL: all). Best effort: a directory left behind
// costs disk space, never correctness (only the one `latest` names is ever read).
static void remove_step_dirs(const char *run, const char *keep) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/checkpoints", run);
    DIR *d = opendir(dir);
    if (!d) return;
    char (*names)[64] = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {  // collected first: removing while reading may skip entries
        size_t len = strlen(e->d_name);
        if (!is_step_name(e->d_name, len) || (keep && !strcmp(e->d_name, keep))) continue;
        if (n == cap) {
            size_t nc = cap ? 2 * cap : 16;
            char(*nn)[64] = realloc(names, nc * sizeof *names);
            if (!nn) break;
            names = nn;
            cap = nc;
        }
        snprintf(names[n++], sizeof names[0], "%s", e->d_name);
    }
    closedir(d);
    for (size_t i = 0; i < n; i++) {
        char path[4096 + 64];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        remove_step_dir(path);
    }
    free(names);
}

int checkpoint_save_set(const char *run, const Model *m, const AdamW *o, const TrainState *t) {
    char name[64], dir[4096], path[4096];
    MN_TRY(step_dir(run, t->step, name, sizeof name));
    snprintf(dir, sizeof dir, "%s/checkpoints/%s", run, name);
    remove_step_dir(dir);  // what a save killed earlier left there (never the latest: step_dir)
    MN_TRY(mn_mkdirs(dir));
    join(path, sizeof path, dir, "config.json");
    MN_TRY(config_save(&m->cfg, path));
    MN_TRY(checkpoint_stop_point("config", t->step));
    MN_TRY(save_weights(dir, m, t->step));
    MN_TRY(checkpoint_stop_point("model", t->step));
    MN_TRY(checkpoint_save_state(dir, m, o, t));
    return checkpoint_stop_point("optimizer", t->step);
}

// dst becomes src's file: a hard link renamed over it, or, where the file system has none, a copy
// (each atomic).
static int publish(const char *src, const char *dst) {
    char tmp[4096 + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", dst);
    unlink(tmp);
    if (!link(src, tmp)) {
        if (!rename(tmp, dst)) return MN_OK;
        int e = errno;
        unlink(tmp);
        return mn_error(MN_ERR_IO, "%s: cannot rename %s over it: %s", dst, tmp, strerror(e));
    }
    return af_copy(src, dst);
}

int checkpoint_commit(const char *run, int step) {
    char name[64], dir[4096], path[4096], text[80];
    MN_TRY(step_dir(run, step, name, sizeof name));
    snprintf(dir, sizeof dir, "%s/checkpoints/%s", run, name);
    for (int i = 0; i < 3; i++)
        if (!file_there(dir, set_files[i]))
            return mn_error(MN_ERR_IO, "%s/%s: missing: the checkpoint of step %d was not saved", dir, set_files[i], step);
    // The switch: from here on, loading the run reads this step's set.
    snprintf(path, sizeof path, "%s/checkpoints/latest", run);
    int n = snprintf(text, sizeof text, "%s\n", name);
    AtomicFile af;
    MN_TRY(af_open(&af, path));
    int s = af_write(&af, text, (size_t)n);
    if (s) {
        af_abort(&af);
        return s;
    }
    MN_TRY(af_commit(&af));
    MN_TRY(checkpoint_stop_point("latest", step));
    for (int i = 0; i < 2; i++) {  // config.json, model.safetensors
        char src[4096], dst[4096];
        join(src, sizeof src, dir, set_files[i]);
        join(dst, sizeof dst, run, set_files[i]);
        MN_TRY(publish(src, dst));
    }
    MN_TRY(checkpoint_stop_point("publish", step));
    remove_step_dirs(run, name);
    join(path, sizeof path, run, "optimizer.safetensors");  // an older layout's, now superseded
    unlink(path);
    return MN_OK;
}

int checkpoint_save(const char *run, const Model *m, const AdamW *o, const TrainState *t) {
    MN_TRY(checkpoint_save_set(run, m, o, t));
    return checkpoint_commit(run, t->step);
}

int checkpoint_remove_all(const char *run) {
    char path[4096];
    // The run directory's files, then the pointer, then what it pointed to: a kill on the way
    // leaves the old run's latest checkpoint whole, or none of it that could be resumed.
    for (int i = 0; i < 3; i++) {
        join(path, sizeof path, run, set_files[i]);
        if (unlink(path) && errno != ENOENT && errno != ENOTDIR)
            return mn_error(MN_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
    }
    snprintf(path, sizeof path, "%s/checkpoints/latest", run);
    if (unlink(path) && errno != ENOENT && errno != ENOTDIR)
        return mn_error(MN_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
    remove_step_dirs(run, NULL);
    snprintf(path, sizeof path, "%s/checkpoints", run);
    rmdir(path);  // (where only ours were in it)
    return MN_OK;
}
