// The registry of sequence mixers.
#include <string.h>

#include "core/common.h"
#include "mixer.h"

static const MixerOps *const mixers[] = {&mixer_mesa};

const MixerOps *mixer_find(const char *name) {
    char known[256] = "";
    for (size_t i = 0; i < sizeof mixers / sizeof mixers[0]; i++) {
        if (!strcmp(mixers[i]->name, name)) return mixers[i];
        strcat(known, i ? ", " : "");
        strcat(known, mixers[i]->name);
    }
    mn_error(MN_ERR_ARG, "unknown mixer '%s' (known: %s)", name, known);
    return NULL;
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
