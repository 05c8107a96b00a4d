// The registry of sequence mixers, and the per-block patterns of configs.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/common.h"
#include "core/runs.h"
#include "mixer.h"

const MixerOps *const mixer_all[] = {&mixer_mesa, &mixer_mamba2, &mixer_gla, &mixer_deltanet, &mixer_gdn,
                                    &mixer_gdn_paper, &mixer_deltanet_paper, &mixer_mha, &mixer_swa, &mixer_mlstm,
                                    &mixer_mlstm_block, &mixer_slstm_block, &mixer_mlstm_large, &mixer_hawk,
                                    &mixer_longhorn, &mixer_longhorn_exact, NULL};

static const MixerOps *find(const char *name, size_t len) {
    for (size_t i = 0; mixer_all[i]; i++)
        if (strlen(mixer_all[i]->name) == len && !strncmp(mixer_all[i]->name, name, len)) return mixer_all[i];
    char known[512] = "";
    for (size_t i = 0; mixer_all[i]; i++) {
        strcat(known, i ? ", " : "");
        strcat(known, mixer_all[i]->name);
    }
    mn_error(MN_ERR_ARG, "unknown mixer '%.*s' (known: %s)", (int)(len > 64 ? 64 : len), name, known);
    return NULL;
}

const MixerOps *mixer_find(const char *name) { return find(name, strlen(name)); }

// One item of a pattern at p: a name, or "name*count" (count 1 to CONFIG_MAX_LAYERS); *next is
// the following item's start (NULL after the last). NULL with an error for a bad item.
static const MixerOps *pattern_item(const char *pattern, const char *p, int index, int *count, const char **next) {
    const char *e = strchr(p, ',');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    *next = e ? e + 1 : NULL;
    *count = 1;
    const char *star = memchr(p, '*', len);
    size_t name_len = star ? (size_t)(star - p) : len;
    if (!name_len) {
        mn_error(MN_ERR_ARG, "mixer \"%s\": name %d of the pattern is empty (names are separated by single commas)",
                 pattern, index + 1);
        return NULL;
    }
    if (star) {
        long k = 0;
        const char *d = star + 1;
        for (; d < p + len && *d >= '0' && *d <= '9' && k <= CONFIG_MAX_LAYERS; d++) k = k * 10 + (*d - '0');
        if (d == star + 1 || d != p + len || k < 1 || k > CONFIG_MAX_LAYERS) {
            mn_error(MN_ERR_ARG, "mixer \"%s\": item %d \"%.*s\" repeats a name by \"*N\" with N from 1 to %d "
                                 "(\"mlstm-block*7,slstm-block\")",
                     pattern, index + 1, (int)(len > 64 ? 64 : len), p, CONFIG_MAX_LAYERS);
            return NULL;
        }
        *count = (int)k;
    }
    return find(p, name_len);
}

int mixer_pattern_check(const char *pattern, int n_layers) {
    int n = 0, count;
    const char *next;
    for (const char *p = pattern; p; p = next) {
        if (!pattern_item(pattern, p, n, &count, &next)) return -1;
        n += count;
        if (n > CONFIG_MAX_LAYERS) {
            mn_error(MN_ERR_ARG, "mixer \"%s\": a pattern of more than %d blocks", pattern, CONFIG_MAX_LAYERS);
            return -1;
        }
    }
    if (n_layers > 0 && n > n_layers) {
        mn_error(MN_ERR_ARG, "mixer \"%s\": a pattern of %d mixers for %d blocks (block i gets the (i mod %d)-th; "
                             "a pattern is at most as long as the model is deep)",
                 pattern, n, n_layers, n);
        return -1;
    }
    return n;
}

const MixerOps *mixer_at(const ModelConfig *c, int layer) {
    int n = mixer_pattern_check(c->mixer, 0), count;
    if (n < 0) return NULL;
    int i = layer % n, index = 0;
    const char *next;
    for (const char *p = c->mixer; p; p = next, index++) {
        const MixerOps *ops = pattern_item(c->mixer, p, index, &count, &next);
        if (i < count) return ops;
        i -= count;
    }
    return NULL;  // not reached: the pattern's blocks number n
}

int mixer_declare_table(const char *prefix, const MixerParam *p, int np, ParamSpec *out, int *n, int max) {
    for (int i = 0; i < np; i++) {
        char name[96];
        snprintf(name, sizeof name, "%s%s", prefix, p[i].name);
        if (param_add(out, n, max, name, p[i].ndim, p[i].shape, p[i].init, p[i].value, p[i].decay) < 0)
            return mn_error(MN_ERR_ARG, "too many parameter tensors");
    }
    return MN_OK;
}

MlstmOpts mixer_mlstm_opts(const Mixer *m, int dk) {
    MlstmOpts o = {.scale = 1 / sqrtf((float)dk), .eps = 1e-6f, .form = m->solver.form, .chunk = m->solver.chunk};
    return o;
}

int mixer_need_mlstm(const Mixer *m) {
    const MlstmOps *o = m->be->mlstm;
    if (!o || !o->fwd || !o->bwd || !o->gates_fwd || !o->gates_bwd) return mixer_unsupported(m, "it has no mLSTM core");
    return MN_OK;
}

int mixer_check_decode(const Mixer *m, int state_B, int B) {
    if (state_B == B) return MN_OK;
    return mn_error(MN_ERR_ARG, "%s: decoding %d sequences, but the state was reset for %d", m->ops->name, B, state_B);
}

void mixer_state_free(const Backend *be, const MixerStateBuf *b, int nb, int *state_B) {
    for (int i = 0; i < nb; i++) {
        if (*b[i].p) be->free(be, *b[i].p);
        *b[i].p = NULL;
    }
    *state_B = 0;
}

int mixer_state_reset(const Backend *be, const MixerStateBuf *b, int nb, int *state_B, int B) {
    if (*state_B != B) {
        mixer_state_free(be, b, nb, state_B);
        for (int i = 0; i < nb; i++)
            if (!(*b[i].p = be->alloc(be, b[i].n ? b[i].n : 1, b[i].kind))) {  // (a width-1 conv's tail is empty)
                mixer_state_free(be, b, nb, state_B);
                return MN_ERR_NOMEM;
            }
        *state_B = B;
    }
    for (int i = 0; i < nb; i++)
        if (b[i].n) be->zero(be, *b[i].p, b[i].n, b[i].kind);
    return MN_OK;
}

int mixer_scratch_reserve(Mixer *m, size_t n) {
    MixerScratch *s = m->scratch;
    if (!s) return mn_error(MN_ERR_ARG, "mixer: no shared scratch (mixers are made by model_create)");
    if (n <= s->n) return MN_OK;
    if (s->p) m->be->free(m->be, s->p);
    s->n = 0;
    if (!(s->p = m->be->alloc(m->be, n, MEM_ACT))) return MN_ERR_NOMEM;
    s->n = n;
    return MN_OK;
}

int mixer_clock(const Mixer *m, double *t) {
    if (m->profile) MN_TRY(m->be->sync(m->be));
    *t = mn_now();
    return MN_OK;
}

void mixer_bufs_free(const Backend *be, const MixerBuf *b, int n) {
    for (int i = 0; i < n; i++) {
        if (*b[i].p) be->free(be, *b[i].p);
        *b[i].p = NULL;
    }
}

int mixer_bufs_alloc(const Backend *be, const MixerBuf *b, int n, size_t N) {
    for (int i = 0; i < n; i++) {
        size_t count = b[i].per_token * N + b[i].fixed * (size_t)backend_runs(be);  // (fixed: a run's, core/runs.h)
        if (!(*b[i].p = be->alloc(be, count ? count : 1, b[i].kind))) {
            mixer_bufs_free(be, b, n);
            return MN_ERR_NOMEM;
        }
    }
    return MN_OK;
}

size_t mixer_bufs_bytes(const Backend *be, const MixerBuf *b, int n) {
    size_t bytes = 0;
    for (int i = 0; i < n; i++)
        bytes += b[i].per_token * be->elem_size(be, b[i].kind);
    return bytes;
}

int mixer_unsupported(const Mixer *m, const char *why) {
    return mn_error(MN_ERR_UNSUPPORTED, "mixer %s is not available on the %s backend yet (%s)", m->ops->name, m->be->name,
                    why);
}

int mixer_supports(const Mixer *m, int status) {
    if (!status) return MN_OK;
    char why[512];
    snprintf(why, sizeof why, "%s", mn_last_error());  // (mn_error may not read its own buffer)
    return mn_error(status, "mixer %s on the %s backend: %s", m->ops->name, m->be->name, why);
}

MnSeqDims mixer_layer_dims(const Mixer *m) {
    const ModelConfig *c = m->cfg;
    MnSeqDims d = {1, 1, c->n_heads, c->head_dim, c->head_v_dim ? c->head_v_dim : c->head_dim};
    return d;
}
