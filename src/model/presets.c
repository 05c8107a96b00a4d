/*
 * Named presets and the parameter-matched presets (presets.h): the part of the configs that counts
 * a model's parameters, so the one that needs the model (model_specs).
 */
#include "presets.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "mixers/mixer.h"
#include "model/config.h"
#include "model/config_hf.h"
#include "model/model.h"

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

// The sizes that have parameter-matched presets "SIZE-MIXER" (presets.h).
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

// For blocks without a feed-forward part of mlp_hidden's width (mlstm-block): the number of blocks
// whose total parameter count is nearest to target (the xLSTM paper's way: 24 mLSTM blocks where
// Llama has 12). The count is affine in the depth.
static int match_depth(ModelConfig *c, size_t target) {
    size_t p0, p1;
    MN_TRY(config_param_count(c, &p0, NULL, NULL));
    c->n_layers++;
    MN_TRY(config_param_count(c, &p1, NULL, NULL));
    c->n_layers--;
    double per = (double)(p1 - p0), add = floor(((double)target - (double)p0) / per + 0.5);
    int layers = c->n_layers + (int)add;
    c->n_layers = layers < 1 ? 1 : layers > CONFIG_MAX_LAYERS ? CONFIG_MAX_LAYERS : layers;
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
    if (p1 == p0) return match_depth(c, target);  // no feed-forward part of mlp_hidden's width
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
