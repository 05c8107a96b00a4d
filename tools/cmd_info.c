// mesanet info: what a config (or a run's config) amounts to.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/common.h"
#include "mixers/mixer.h"
#include "model/model.h"
#include "tools/commands.h"

// The component a tensor belongs to, from its name.
static const char *component(const char *name) {
    if (strstr(name, "embeddings")) return "embedding";
    if (strstr(name, "lm_head")) return "output head";
    if (strstr(name, ".attn.")) return "mixers";
    if (strstr(name, ".mlp.")) return "MLPs";
    return "norms";
}

int cmd_info(int argc, char **argv) {
    char *pos[1];
    int n = 0;
    int st = parse_args(argc, argv, "CONFIG (a preset, a JSON file, or a run directory)", NULL, 0, pos, &n, 1);
    if (st) return st == 2 ? 0 : 1;
    if (n != 1) {
        fprintf(stderr, "mesanet info: give one config, preset or run directory (see --help)\n");
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
    printf("%s: %s architecture, %s mixer, D=%d, %d blocks, %d heads x %d, MLP %d, vocabulary %d%s\n", pos[0], c.arch,
           c.mixer, c.dim, c.n_layers, c.n_heads, c.head_dim, c.mlp_hidden, c.vocab_size,
           vocab_from_data ? " (from the data; 4096 shown)" : "");
    printf("  embedding x sqrt(D): %s, tied head: %s, logit cap: %g, forget-gate bound: %g, output gate: %s\n",
           c.embed_scale ? "yes" : "no", c.tie_embeddings ? "yes" : "no", (double)c.logit_cap, (double)c.gate_bound,
           c.output_gate ? "yes" : "no");
    const char *names[5] = {"embedding", "mixers", "MLPs", "norms", "output head"};
    size_t sums[5] = {0}, total = 0;
    for (int i = 0; i < np; i++) {
        for (int k = 0; k < 5; k++)
            if (!strcmp(component(specs[i].name), names[k])) sums[k] += specs[i].numel;
        total += specs[i].numel;
    }
    printf("\nparameters:\n");
    for (int k = 0; k < 5; k++)
        if (sums[k]) printf("  %-12s %14zu  (%5.1f%%)\n", names[k], sums[k], 100.0 * (double)sums[k] / (double)total);
    printf("  %-12s %14zu  (%.1fM; %zu tensors)\n", "total", total, (double)total / 1e6, (size_t)np);
    printf("  per block: mixer %zu, MLP %zu\n", sums[1] / (size_t)c.n_layers, sums[2] / (size_t)c.n_layers);
    const MixerOps *ops = mixer_find(c.mixer);
    size_t state = ops->state_floats(&c) * (size_t)c.n_layers;
    printf("\ndecoding state per sequence: %zu floats (%.2f MB in float32), whatever the length\n", state,
           (double)state * 4 / 1e6);
    printf("  per layer: %zu floats (H and G of %d heads: %d x %d and %d x %d each, plus the convolutions' last inputs)\n",
           ops->state_floats(&c), c.n_heads, c.head_dim, c.head_dim, c.head_dim, c.head_dim);
    free(specs);
    return 0;
}
