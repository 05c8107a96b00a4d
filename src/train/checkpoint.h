/*
 * Checkpoints: a run directory with
 *   config.json          our model config (config.c's fields)
 *   model.safetensors    the weights, named as fla's MesaNet Hugging Face model
 *                        (model.embeddings.weight, model.layers.N.attn.q_proj.weight, ...);
 *                        metadata: "format": "mesanet", "arch", "step"
 *   optimizer.safetensors  AdamW moments ("m.<name>", "v.<name>") and the training
 *                        state in its metadata (step, data position, seed)
 * Every file is written atomically (temporary file + rename), the model last
 * but one and the optimizer state last, each stamped with the step: a crash
 * leaves the previous complete checkpoint readable, and a mismatch between the
 * two files' steps is refused on resume.
 */
#ifndef MN_CHECKPOINT_H
#define MN_CHECKPOINT_H

#include <stdint.h>

#include "model/model.h"
#include "train/optim.h"

typedef struct {
    int step;                 // optimizer updates done
    uint64_t epoch, index;    // the training loader's position
    uint64_t seed;            // data order and initialisation seed
    double tokens;            // training tokens seen
    double elapsed;           // seconds of training so far
} TrainState;

// Weights (+ config.json); `step` goes into the metadata.
int checkpoint_save_model(const char *dir, const Model *m, int step);
// Loads config.json and model.safetensors from dir onto backend be. A missing,
// truncated or mismatched file is refused with a message naming it.
int checkpoint_load_model(const char *dir, const Backend *be, Model **out);
// Loads weights from a safetensors file into an existing model (names and shapes must match).
int checkpoint_load_weights(const char *path, Model *m);

int checkpoint_save_state(const char *dir, const Model *m, const AdamW *o, const TrainState *t);
int checkpoint_load_state(const char *dir, const Model *m, AdamW *o, TrainState *t);
// 1 if dir holds a complete checkpoint (model and optimizer files).
int checkpoint_exists(const char *dir);

#endif
