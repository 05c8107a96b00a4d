/*
 * Fuzzes model config loading (src/model/config.h): our config.json (a
 * "mesanet" block or bare fields, optionally on a "preset") and Hugging Face
 * config.json files of fla's MesaNet (model_type "mesa_net").
 *
 * Input: the bytes of a config file. A config that config_load accepts must
 * pass config_validate, and must survive config_save + config_load unchanged
 * (a checkpoint written from it has to load again). Seeds: config_save's files
 * for the presets, a Hugging Face config (fuzz/seeds.c) and fuzz/edge/config/.
 *
 *     make fuzz FUZZ_TARGETS=config FUZZ_TIME=60
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "fuzz.h"
#include "model/config.h"

// The config with the bytes after each string's terminator zeroed: a name set twice in one file
// ("mixer": "abcdef", then "mixer": "mesa") leaves the longer one's tail behind the NUL.
static ModelConfig normalized(const ModelConfig *c) {
    ModelConfig n = *c;
    size_t k = strlen(n.mixer);
    memset(n.mixer + k, 0, sizeof n.mixer - k);
    k = strlen(n.arch);
    memset(n.arch + k, 0, sizeof n.arch - k);
    return n;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_init();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[512], path2[512];
    fuzz_write(path, sizeof path, "config.json", data, size);
    ModelConfig c, d;
    memset(&c, 0, sizeof c);
    if (config_load(&c, path)) return 0;
    if (config_validate(&c, "fuzz")) {
        fprintf(stderr, "config_load accepted a config that config_validate refuses: %s\n", mn_last_error());
        abort();
    }
    fuzz_path(path2, sizeof path2, "saved.json");
    if (config_save(&c, path2)) abort();
    memset(&d, 0, sizeof d);
    if (config_load(&d, path2)) {
        fprintf(stderr, "a loaded config, saved, does not load again: %s\n", mn_last_error());
        abort();
    }
    ModelConfig a = normalized(&c), b = normalized(&d);
    if (memcmp(&a, &b, sizeof a)) {
        fprintf(stderr, "a loaded config, saved and loaded again, differs\n");
        abort();
    }
    return 0;
}
