/*
 * Fuzzes loading a checkpoint, a run directory (src/train/checkpoint.h):
 * config.json, model.safetensors and optimizer.safetensors, as `mesanet
 * train --resume`, `eval` and `generate` read them.
 *
 * Input: config.json FUZZ_SEP model.safetensors FUZZ_SEP optimizer.safetensors
 * [FUZZ_SEP checkpoints/latest] (fuzz.h), written into a scratch run directory
 * (a missing part is a missing file); with a fourth part, the three files also
 * go into checkpoints/step-00000003/ and the part becomes checkpoints/latest,
 * the pointer that loading follows. Then checkpoint_find, checkpoint_load_model
 * on the CPU backend and, when that works, checkpoint_load_state into fresh
 * AdamW moments. A config that describes a
 * model of more than 2^18 parameters is skipped: allocating a large model that
 * a valid config asks for is not a parser's fault, and would only slow the runs.
 * Seeds: a tiny model's checkpoint that checkpoint_save_model and
 * checkpoint_save_state write (fuzz/seeds.c) and fuzz/edge/checkpoint/.
 *
 *     make fuzz FUZZ_TARGETS=checkpoint FUZZ_TIME=60
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "core/backend.h"
#include "fuzz.h"
#include "model/config.h"
#include "model/model.h"
#include "train/checkpoint.h"
#include "train/optim.h"

#define MAX_PARAMS (1u << 18)

static const char *const NAMES[3] = {"config.json", "model.safetensors", "optimizer.safetensors"};

// 1 if the config in path loads and makes a model small enough to try.
static int small_enough(const char *path) {
    // (the run directory's own config: checkpoints/latest's copy is the same bytes)
    ModelConfig c;
    ParamSpec *specs = NULL;
    int n = 0;
    if (config_load(&c, path) || model_specs(&c, &specs, &n)) return 1;  // refused: let the loader say so
    size_t total = 0;
    for (int i = 0; i < n; i++) total += specs[i].numel;
    free(specs);
    return total <= MAX_PARAMS;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_init();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *part[4];
    size_t len[4];
    int np = fuzz_split(data, size, part, len, 4);
    char path[512], name[128];
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "checkpoints/step-00000003/%s", NAMES[i]);
        if (i < np) {
            fuzz_write(path, sizeof path, NAMES[i], part[i], len[i]);
            if (np == 4) fuzz_write(path, sizeof path, name, part[i], len[i]);
        } else {
            fuzz_unlink(NAMES[i]);
        }
        if (np < 4) fuzz_unlink(name);
    }
    if (np == 4) fuzz_write(path, sizeof path, "checkpoints/latest", part[3], len[3]);
    else fuzz_unlink("checkpoints/latest");
    fuzz_path(path, sizeof path, "config.json");
    if (!small_enough(path)) return 0;
    int found;
    checkpoint_find(fuzz_dir(), &found);
    Model *m = NULL;
    if (checkpoint_load_model(fuzz_dir(), backend_cpu(), &m)) return 0;
    AdamW o;
    if (adamw_init(&o, m)) abort();
    TrainState t;
    memset(&t, 0, sizeof t);
    checkpoint_load_state(fuzz_dir(), m, &o, &t);
    adamw_free(&o, m);
    model_free(m);
    return 0;
}
