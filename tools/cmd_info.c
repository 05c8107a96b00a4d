// mesanet info: what a config (or a run's config) amounts to.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/common.h"
#include "mixers/mixer.h"
#include "model/model.h"
#include "model/presets.h"
#include "tools/commands.h"

// One line of the table: the matched preset of `mixer` (a mixer's or a hybrid's name) at `size`.
static int matched_row(const char *size, const char *mixer, size_t ref_total) {
    ModelConfig c;
    size_t total, mixers, mlps;
    char name[64];
    snprintf(name, sizeof name, "%s-%s", size, mixer);
    if (config_preset(&c, name) || config_param_count(&c, &total, &mixers, &mlps)) {
        fprintf(stderr, "mesanet info: %s\n", mn_last_error());
        return 1;
    }
    size_t state = model_state_floats(&c) * 4, per_token = 0;  // float32, per sequence
    for (int l = 0; l < c.n_layers; l++)
        if (mixer_at(&c, l)->state_floats_per_token) per_token += mixer_at(&c, l)->state_floats_per_token(&c) * 4;
    char sb[48];
    if (per_token) snprintf(sb, sizeof sb, "%zu+%zu/token", state, per_token);
    else snprintf(sb, sizeof sb, "%zu", state);
    printf("%-16s %-20s %6d %13zu %12zu %12zu %+8.3f%% %14s\n", mixer, name, c.mlp_hidden, total, mixers, mlps,
           100.0 * ((double)total - (double)ref_total) / (double)ref_total, sb);
    return 0;
}

// The parameter-matched presets of one size (presets.h): one line per mixer, Mesa's first, then the
// hybrids'.
static int matched_table(const char *size) {
    ModelConfig ref;
    size_t ref_total;
    if (config_matched(&ref, size, "mesa") || config_param_count(&ref, &ref_total, NULL, NULL)) {
        fprintf(stderr, "mesanet info: %s\n", mn_last_error());
        return 1;
    }
    printf("%s, parameter-matched presets: the %s backbone (D=%d, %d block%s, %d head%s x %d, vocabulary %d%s) with "
           "each mixer, MLP width in steps of %d set to match Mesa's count (within %d parameters: half a step)\n",
           size, size, ref.dim, ref.n_layers, plural_s(ref.n_layers), ref.n_heads, plural_s(ref.n_heads), ref.head_dim, ref.vocab_size ? ref.vocab_size : 4096,
           ref.vocab_size ? "" : " shown; the data sets it", CONFIG_MATCH_STEP,
           3 * ref.dim * ref.n_layers * CONFIG_MATCH_STEP / 2);
    printf("\n%-16s %-20s %6s %13s %12s %12s %9s %14s\n", "mixer", "preset", "MLP", "parameters", "mixers",
           "feed-forward", "vs Mesa", "state bytes");
    for (int i = 0; mixer_all[i]; i++)
        if (matched_row(size, mixer_all[i]->name, ref_total)) return 1;
    for (int i = 0; config_hybrids[i].name; i++)
        if (matched_row(size, config_hybrids[i].name, ref_total)) return 1;
    printf("\nparameters: the whole model (embedding, mixers, feed-forward parts, norms%s); mixers, feed-forward: over all "
           "blocks. state "
           "bytes: the decoding state of one sequence in float32, the same at every length but for the attention "
           "mixers' key/value cache (+bytes/token: mha's grows with the sequence; swa's is its window's).\n",
           ref.tie_embeddings ? "; the head is tied" : ", head");
    return 0;
}

int cmd_info(int argc, char **argv) {
    char *pos[1];
    int n = 0;
    const char *matched = NULL;
    Option opts[] = {
        {"matched", OPT_STRING, &matched,
         "SIZE (demo, 125m or 400m): instead of a config, the table of that size's parameter-matched presets "
         "SIZE-MIXER, one per mixer: parameters (all, mixers, MLPs), difference from Mesa's count, decoding state"},
    };
    int st = parse_args(argc, argv, "CONFIG | --matched SIZE\n\nCONFIG: " CONFIG_NAMES_HELP "; or a run directory", opts,
                        (int)(sizeof opts / sizeof opts[0]), pos, &n, 1);
    if (st) return st == 2 ? 0 : 1;
    if (matched) {
        if (n) {
            fprintf(stderr, "mesanet info: --matched takes no config (it shows every mixer at size %s)\n", matched);
            return 1;
        }
        return matched_table(matched);
    }
    if (n != 1) {
        fprintf(stderr, "mesanet info: give one config, preset or run directory, or --matched SIZE (see --help)\n");
        return 1;
    }
    char path[4096];
    struct stat sb;
    snprintf(path, sizeof path, "%s", pos[0]);
    if (!stat(pos[0], &sb) && S_ISDIR(sb.st_mode)) snprintf(path, sizeof path, "%s/config.json", pos[0]);
    ModelConfig c;
    if (config_load(&c, path)) {
        fprintf(stderr, "mesanet info: %s\n", mn_last_error());
        return 1;
    }
    int vocab_from_data = c.vocab_size == 0;
    if (vocab_from_data) c.vocab_size = 4096;  // presets leave it to the tokenizer: show the demo's
    ParamSpec *specs;
    int np;
    if (model_specs(&c, &specs, &np)) {
        fprintf(stderr, "mesanet info: %s\n", mn_last_error());
        return 1;
    }
    int pattern = mixer_pattern_check(c.mixer, c.n_layers);  // (valid: config_load checked it)
    printf("%s: %s architecture, %s %s, D=%d, %d block%s, %d head%s x %d, MLP %d, vocabulary %d%s\n", pos[0], c.arch,
           pattern > 1 ? "mixer pattern" : "mixer", c.mixer, c.dim, c.n_layers, plural_s(c.n_layers), c.n_heads,
           plural_s(c.n_heads), c.head_dim, c.mlp_hidden,
           c.vocab_size, vocab_from_data ? " (from the data; 4096 shown)" : "");
    printf("  embedding x sqrt(D): %s, tied head: %s, logit cap: %g, norms: %s (eps %g)\n", c.embed_scale ? "yes" : "no",
           c.tie_embeddings ? "yes" : "no", (double)c.logit_cap, c.norm, (double)c.norm_eps);
    if (!strcmp(c.head, "autoencoder"))
        printf("  head: autoencoder (MAD's: every position decoded from the last position's state; no decoding)\n");
    char mixer_fields[512];
    config_mixer_fields(&c, mixer_fields, sizeof mixer_fields);
    if (mixer_fields[0]) printf("  mixer settings: %s\n", mixer_fields);
    // parameters by role (model.c declares each tensor's), and per mixer kind of the pattern
    const char *names[ROLE_COUNT] = {[ROLE_EMBED] = "embedding", [ROLE_MIXER] = "mixers", [ROLE_FFN] = "feed-forward",
                                     [ROLE_NORM] = "norms", [ROLE_HEAD] = "output head"};
    size_t sums[ROLE_COUNT] = {0}, total = 0;
    enum { KINDS = 16 };
    size_t kind_mixer[KINDS] = {0}, kind_ffn[KINDS] = {0};
    int kind_blocks[KINDS] = {0};
    int nkinds = 0;
    while (mixer_all[nkinds] && nkinds < KINDS) nkinds++;
    int *block_kind = calloc((size_t)c.n_layers, sizeof(int));
    if (!block_kind) {
        fprintf(stderr, "mesanet info: out of memory\n");
        free(specs);
        return 1;
    }
    for (int l = 0; l < c.n_layers; l++) {
        const MixerOps *ops = mixer_at(&c, l);
        for (int k = 0; k < nkinds; k++)
            if (mixer_all[k] == ops) block_kind[l] = k;
        kind_blocks[block_kind[l]]++;
    }
    for (int i = 0; i < np; i++) {
        const ParamSpec *p = &specs[i];
        sums[p->role] += p->numel;
        total += p->numel;
        if (p->block < 0 || p->block >= c.n_layers) continue;
        if (p->role == ROLE_MIXER) kind_mixer[block_kind[p->block]] += p->numel;
        if (p->role == ROLE_FFN) kind_ffn[block_kind[p->block]] += p->numel;
    }
    printf("\nparameters:\n");
    for (int k = 0; k < ROLE_COUNT; k++) {
        if (!sums[k]) continue;
        printf("  %-12s %14zu  (%5.1f%%)\n", names[k], sums[k], 100.0 * (double)sums[k] / (double)total);
        if (k == ROLE_MIXER && pattern > 1)
            for (int j = 0; j < nkinds; j++)
                if (kind_blocks[j])
                    printf("    %-10s %14zu  (%5.1f%%; %d block%s)\n", mixer_all[j]->name, kind_mixer[j],
                           100.0 * (double)kind_mixer[j] / (double)total, kind_blocks[j], plural_s(kind_blocks[j]));
    }
    printf("  %-12s %14zu  (%.1fM; %zu tensors)\n", "total", total, (double)total / 1e6, (size_t)np);
    printf("  per block:");
    for (int j = 0, first = 1; j < nkinds; j++)
        if (kind_blocks[j]) {
            printf("%s %s mixer %zu, feed-forward %zu", first ? "" : ";", mixer_all[j]->name,
                   kind_mixer[j] / (size_t)kind_blocks[j], kind_ffn[j] / (size_t)kind_blocks[j]);
            first = 0;
        }
    printf("\n");
    size_t state = model_state_floats(&c), per_token = 0;
    for (int l = 0; l < c.n_layers; l++) {
        const MixerOps *ops = mixer_at(&c, l);
        if (ops && ops->state_floats_per_token) per_token += ops->state_floats_per_token(&c);
    }
    printf("\ndecoding state per sequence: %zu floats (%zu bytes, %.2f MB in float32), %s: %zu bytes more per token\n",
           state, state * 4, (double)state * 4 / 1e6, per_token ? "growing" : "constant", per_token * 4);
    for (int j = 0; j < nkinds; j++) {
        if (!kind_blocks[j]) continue;
        const MixerOps *ops = mixer_all[j];
        size_t f = ops->state_floats(&c), pt = ops->state_floats_per_token ? ops->state_floats_per_token(&c) : 0;
        printf("  %-10s %zu floats (%zu bytes) a block", ops->name, f, f * 4);
        if (pt) printf(" + %zu floats (%zu bytes) a token", pt, pt * 4);
        printf(", %d block%s: %s\n", kind_blocks[j], plural_s(kind_blocks[j]), ops->state_about);
        printf("  %-10s %s\n", "", ops->about);
    }
    free(block_kind);
    free(specs);
    return 0;
}
