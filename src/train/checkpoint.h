/*
 * Checkpoints. One checkpoint is a directory of three files:
 *   config.json          our model config (config.c's fields)
 *   model.safetensors    the weights, named as fla's MesaNet Hugging Face model
 *                        (model.embeddings.weight, model.layers.N.attn.q_proj.weight, ...);
 *                        metadata: "format": "pt", "arch", "step"
 *   optimizer.safetensors  AdamW moments ("m.<name>", "v.<name>") and the training
 *                        state in its metadata (step, data position, seed)
 *
 * A run directory keeps them as a set that a kill at any instant leaves loadable:
 *   checkpoints/step-00000200/   the three files of step 200, each written atomically
 *   checkpoints/latest           "step-00000200": switched (atomically) only once that
 *                                directory is complete; older step directories are removed after
 *   config.json, model.safetensors   hard links to the latest checkpoint's (copies where the file
 *                                system has no hard links), so that the run directory itself
 *                                loads in fla / Hugging Face as it always did
 * Loading a directory follows checkpoints/latest where there is one, and otherwise reads the
 * directory's own files (an older run, or a directory of weights such as fla's, transformers' or
 * NX-AI's xlstm package's: model/weights.h).
 *
 * For tests of the above, MESANET_CHECKPOINT_STOP=<point>[@<step>] makes a save stop with an
 * error at that point (at every save, or at the save of that step), leaving the files as a kill
 * there would: config, model, optimizer (after that file of the step directory), latest (after
 * the switch), publish (after the run directory's links).
 */
#ifndef MN_CHECKPOINT_H
#define MN_CHECKPOINT_H

#include <stddef.h>
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

// Writes the checkpoint of the training state as a set into the run directory (above): its step
// directory, then the switch of checkpoints/latest, the run directory's links and the removal of
// the older checkpoints. The same as checkpoint_save_set followed by checkpoint_commit.
int checkpoint_save(const char *run, const Model *m, const AdamW *o, const TrainState *t);
// The first half: the three files of the step directory (not yet the latest).
int checkpoint_save_set(const char *run, const Model *m, const AdamW *o, const TrainState *t);
// The second half: makes the step directory of t->step just saved the latest, links its config
// and weights into the run directory and removes the older checkpoints.
int checkpoint_commit(const char *run, int step);

// Whether the run directory holds a checkpoint to resume: *found = 0 when it holds none (no
// weights, no optimizer state), 1 for a complete one. A part of one (weights without the
// optimizer state, or a checkpoints/latest that names a missing or incomplete directory) is
// MN_ERR_FORMAT naming the missing file: resuming cannot, and starting afresh would discard it.
int checkpoint_find(const char *run, int *found);
// The directory holding the checkpoint that loading `dir` reads: the one checkpoints/latest names,
// or dir itself.
int checkpoint_dir(const char *dir, char *out, size_t n);
// Removes a run directory's checkpoints (before a fresh run over it): checkpoints/ (only the
// entries it made) and the run directory's config.json, model.safetensors and
// optimizer.safetensors.
int checkpoint_remove_all(const char *run);
// The test hook above: MN_ERR_IO ("stopped ...") when MESANET_CHECKPOINT_STOP names this point
// (and step), otherwise MN_OK.
int checkpoint_stop_point(const char *point, int step);

// Weights (+ config.json) into dir itself; `step` goes into the metadata.
int checkpoint_save_model(const char *dir, const Model *m, int step);
// Loads config.json and model.safetensors of the checkpoint dir resolves to (checkpoint_dir) onto
// backend be. A missing, truncated or mismatched file is refused with a message naming it.
int checkpoint_load_model(const char *dir, const Backend *be, Model **out);
// Loads weights from a safetensors file into an existing model (names and shapes must match; the
// layouts of model/weights.h: ours, transformers' xLSTM spellings, NX-AI's xLSTMLMModel).
int checkpoint_load_weights(const char *path, Model *m);
// Writes the checkpoint `run` resolves to (any layout checkpoint_load_model reads: ours, Hugging
// Face's, NX-AI's) into the directory out, on the host (no backend): format "hf" as our checkpoint
// folder (config.json and model.safetensors by our names: Hugging Face's own layout for the fla,
// llama, xlstm and recurrent_gemma architectures; tensors as their files hold them: weights_to_file),
// "nxai" as NX-AI's xLSTMLMModel folder (model/format_nxai.h) with the sLSTM layout `layout`
// ("vanilla", the default where NULL, or "cuda"), "longhorn" as the official LonghornLMHeadModel
// folder (model/format_longhorn.h).
int checkpoint_export(const char *run, const char *out, const char *format, const char *layout);

// The optimizer state into dir itself.
int checkpoint_save_state(const char *dir, const Model *m, const AdamW *o, const TrainState *t);
// The optimizer state of the checkpoint dir resolves to, refused unless its step is the weights'.
int checkpoint_load_state(const char *dir, const Model *m, AdamW *o, TrainState *t);

#endif
