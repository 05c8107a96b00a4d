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
    const char *xlstm;  // the xLSTM paper's models: their pattern of blocks (NULL: a Mesa preset); "mlstm-large":
                        // Hugging Face's xLSTMForCausalLM (the xlstm architecture); "recurrent_gemma": Griffin as
                        // Hugging Face's RecurrentGemmaForCausalLM has it
    int longhorn;       // 1: the Longhorn paper's LonghornLM (longhorn blocks, config_longhorn)
} Preset;

static const Preset presets[] = {
    {"tiny", 0, 32, 2, 2, 16, 64, 0, "2 blocks, D=32: for tests"},
    {"demo", 0, 192, 4, 3, 64, 256, 0, "~3M parameters with a 4096-token BPE: the CPU demo"},
    {"125m", 50304, 768, 12, 6, 128, 2048, 0, "~131M, the paper's small size class (GPT-2 vocabulary)"},
    {"400m", 50304, 1024, 24, 8, 128, 2048, 0, "~378M, the paper's medium size class"},
    {"1b", 50304, 2048, 16, 16, 128, 2048, 0, "~975M, the paper's large size class"},
    {"fla-162m", 50304, 768, 12, 6, 128, 2048, 1, "fla's MesaNetForCausalLM, hidden 768, 12 layers (162M)"},
    {"fla-412m", 50304, 1024, 24, 8, 128, 2048, 1, "fla's MesaNetForCausalLM, hidden 1024, 24 layers (412M)"},
    // The xLSTM paper's language models (its Table 5, App. D.2; NX-AI's xLSTMLMModel): mLSTM blocks
    // of 4 heads over 2 D, sLSTM blocks at the paper's positions, LayerNorm, untied, unscaled.
    {"xlstm-125m", 50304, 768, 24, 4, 384, 2048, 0, "xLSTM[7:1] at 125M (163.7M): sLSTM blocks at 3 and 20",
     "mlstm-block*3,slstm-block,mlstm-block*16,slstm-block,mlstm-block*3"},
    {"xlstm10-125m", 50304, 768, 24, 4, 384, 2048, 0, "xLSTM[1:0] at 125M (163.8M): mLSTM blocks only",
     "mlstm-block"},
    {"xlstm-350m", 50304, 1024, 48, 4, 512, 2048, 0, "xLSTM[7:1] at 350M (408.4M): sLSTM at 3, 5, 7, 40, 42, 44",
     "mlstm-block*3,slstm-block,mlstm-block,slstm-block,mlstm-block,slstm-block,mlstm-block*32,slstm-block,"
     "mlstm-block,slstm-block,mlstm-block,slstm-block,mlstm-block*3"},
    // Hugging Face's xLSTMForCausalLM (the xLSTM-7B design) at 160M: 4 heads, q/k half as wide as
    // the model, v as wide; SwiGLU of 2.667 D rounded up to 64 (transformers' defaults)
    {"xlstm-7b-160m", 50304, 768, 12, 4, 96, 2048, 0, "Hugging Face's xLSTMForCausalLM design at 160M", "mlstm-large"},
    // Griffin (De et al. 2024) in Hugging Face's RecurrentGemmaForCausalLM: two recurrent blocks to one of
    // local attention, repeated; multi-query attention of 6 heads of 128
    {"griffin-160m", 50304, 768, 17, 6, 128, 2048, 0, "Griffin as RecurrentGemmaForCausalLM at 160M (hawk, hawk, swa)",
     "recurrent_gemma"},
    // The Longhorn paper's OpenWebText models (its Tables 2, 3; gdn-longhorn-notes.md B.2, B.4): twice
    // the Llama baseline's layers as longhorn blocks (no MLP), tied, context 1024. (Heads: the
    // baseline's, which longhorn blocks do not read.)
    {"longhorn-125m", 50304, 768, 24, 12, 64, 1024, 0, "Longhorn at 125M (128.6M), the paper's OpenWebText model",
     NULL, 1},
    {"longhorn-350m", 50304, 1024, 48, 16, 64, 1024, 0, "Longhorn at 350M (370.0M; the paper prints 369.8)", NULL, 1},
};

// The xLSTM paper's backbone around its blocks (xlstm-notes.md 3.5): LayerNorm (eps 1e-5, no
// bias), untied head, no embedding scale, no logit cap; sLSTM MLPs of 1.3 D rounded up to 64.
static void config_xlstm(ModelConfig *c, const char *pattern) {
    snprintf(c->mixer, sizeof c->mixer, "%s", pattern);
    snprintf(c->norm, sizeof c->norm, "layernorm");
    c->norm_eps = 1e-5f;
    c->embed_scale = 0;
    c->tie_embeddings = 0;
    c->logit_cap = 0;
    c->slstm_heads = 4;
    c->mlp_hidden = (13 * c->dim / 10 + 63) / 64 * 64;
}

// transformers' xLSTMForCausalLM (its config's defaults; docs/spec/reference/xlstm-formats.md):
// RMSNorm (eps 1e-6) before both halves of a block and after the blocks, untied head, logits
// capped at 30, gates at 15, v heads twice as wide as q and k, SwiGLU of 2.667 D "rounded up" to 64
// as transformers does it: (x + 63) // 64 * 64 on a float, so 2048.26 gives 2048.
static void config_xlstm_large(ModelConfig *c) {
    snprintf(c->mixer, sizeof c->mixer, "mlstm-large");
    snprintf(c->arch, sizeof c->arch, "xlstm");
    c->head_v_dim = 2 * c->head_dim;
    c->gate_cap = 15;
    c->norm_eps = 1e-6f;
    c->embed_scale = 0;
    c->tie_embeddings = 0;
    c->logit_cap = 30;
    c->mlp_hidden = (int)floor((2.667 * c->dim + 63) / 64) * 64;  // transformers' round_up_to_next_multiple_of
}

// transformers' RecurrentGemmaForCausalLM (recurrentgemma-2b's design): blocks recurrent, recurrent,
// attention in turn; RG-LRU as wide as the model; one key/value head; local attention over 1024 tokens
// (half the training context, as the Griffin paper's models); RoPE on the first half of each head; a
// bias on o_proj; the gated MLP 3 D wide (intermediate_size 6 D); the embedding scaled by sqrt(D) in
// bf16 and tied to the head; logits capped at 30; RMSNorm of gain 1 + w, eps 1e-6.
static void config_rgemma(ModelConfig *c) {
    snprintf(c->mixer, sizeof c->mixer, "hawk*2,swa");
    snprintf(c->arch, sizeof c->arch, "recurrent_gemma");
    c->n_kv_heads = 1;
    c->window = c->seq_len / 2;
    c->rope_dim = c->head_dim / 2;
    c->o_bias = 1;
    c->conv_size = 4;
    c->norm_eps = 1e-6f;
    c->embed_scale = 1;
    c->tie_embeddings = 1;
    c->logit_cap = 30;
    c->mlp_hidden = 3 * c->dim;
}

// The official LonghornLM (models/longhorn.py): RMSNorm with eps 1e-5 before every block and after
// them, the head tied to the embedding, no embedding scale, no logit cap.
static void config_longhorn(ModelConfig *c) {
    snprintf(c->mixer, sizeof c->mixer, "longhorn");
    c->norm_eps = 1e-5f;
    c->embed_scale = 0;
    c->tie_embeddings = 1;
    c->logit_cap = 0;
}

// The sizes that have parameter-matched presets "SIZE-MIXER" (presets.h).
const char *const config_matched_sizes[] = {"demo", "125m", "400m", NULL};

const ConfigHybrid config_hybrids[] = {
    {"hawk-mesa", "hawk,mesa", "Hawk-MesaNet (the MesaNet paper's hybrid): Hawk and Mesa blocks alternating"},
    {"griffin", "hawk,hawk,swa", "Griffin: two Hawk blocks, then sliding-window attention, repeated"},
    {NULL, NULL, NULL},
};

// The pattern of a hybrid's name, or NULL.
static const char *hybrid_pattern(const char *name) {
    for (int i = 0; config_hybrids[i].name; i++)
        if (!strcmp(config_hybrids[i].name, name)) return config_hybrids[i].pattern;
    return NULL;
}

// Each distinct mixer's preset hook, in the pattern's order (swa's window, the xLSTM blocks' heads).
static void pattern_presets(ModelConfig *c) {
    const MixerOps *done[CONFIG_MAX_LAYERS];
    int n = mixer_pattern_check(c->mixer, 0), nd = 0;
    for (int l = 0; l < n; l++) {
        const MixerOps *ops = mixer_at(c, l);
        int seen = 0;
        for (int k = 0; k < nd; k++) seen |= done[k] == ops;
        if (seen) continue;
        done[nd++] = ops;
        if (ops->preset) ops->preset(c);
    }
}

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
    // one name or a hybrid's, not a pattern (the error lists the known mixers)
    const char *pattern = hybrid_pattern(mixer);
    const MixerOps *ops = pattern ? NULL : mixer_find(mixer);
    if (!pattern && !ops) return MN_ERR_ARG;
    ModelConfig ref;
    MN_TRY(config_preset(&ref, size));
    *c = ref;
    snprintf(c->mixer, sizeof c->mixer, "%s", pattern ? pattern : ops->name);
    if (!strcmp(c->mixer, ref.mixer)) return MN_OK;  // the reference: the preset itself
    // the size preset's fields with the mixers' own settings, and nothing they do not read
    pattern_presets(c);
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
                        size, mixer);
    c->mlp_hidden += (int)steps * CONFIG_MATCH_STEP;
    return MN_OK;
}

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
            if (p->xlstm && !strcmp(p->xlstm, "mlstm-large")) config_xlstm_large(c);
            else if (p->xlstm && !strcmp(p->xlstm, "recurrent_gemma")) config_rgemma(c);
            else if (p->xlstm) config_xlstm(c, p->xlstm);
            if (p->longhorn) config_longhorn(c);
            config_normalize(c);
            return MN_OK;
        }
        strcat(known, i ? ", " : "");
        strcat(known, p->name);
    }
    char mixers[512] = "";
    for (int i = 0; mixer_all[i]; i++) {
        strcat(mixers, i ? ", " : "");
        strcat(mixers, mixer_all[i]->name);
    }
    for (int i = 0; config_hybrids[i].name; i++) {
        strcat(mixers, ", ");
        strcat(mixers, config_hybrids[i].name);
    }
    for (int i = 0; config_matched_sizes[i]; i++) {
        size_t n = strlen(config_matched_sizes[i]);
        if (strncmp(name, config_matched_sizes[i], n) || name[n] != '-') continue;
        char size[16];
        snprintf(size, sizeof size, "%s", config_matched_sizes[i]);
        if (!config_matched(c, size, name + n + 1)) return MN_OK;
        return mn_error(MN_ERR_ARG,
                        "unknown config '%.64s': '%.64s' is not a mixer nor a hybrid; a parameter-matched preset is SIZE-MIXER with "
                        "SIZE one of demo, 125m, 400m and MIXER one of %s",
                        name, name + n + 1, mixers);
    }
    return mn_error(MN_ERR_ARG,
                    "unknown config '%.128s': not a file, nor a preset (%s), nor a parameter-matched preset SIZE-MIXER "
                    "(SIZE: demo, 125m, 400m; MIXER: %s; e.g. 125m-gdn)",
                    name, known, mixers);
}
