/*
 * AdamW with decoupled weight decay (none on embeddings, norms, gate biases
 * and lambda: the ParamSpec decay flags), global-norm gradient clipping, and
 * the learning-rate schedule of the spec: linear warm-up, cosine decay to a
 * fraction of the peak.
 *
 * The update runs on the backend from start to end (Backend.adamw: the norm, the clip, one pass
 * over the slab, a non-finite norm refused there), its learning rate and step uploaded before it
 * without waiting, so that a training step can be recorded (train/step.h); the host learns the
 * norm, and whether the update was refused, when it reads the results.
 */
#ifndef MN_OPTIM_H
#define MN_OPTIM_H

#include "model/model.h"

typedef struct {
    float beta1, beta2, eps, weight_decay;  // (0.9, 0.95, 1e-8, 0.1)
    float clip;                             // global gradient-norm clip (1; 0: none)
    int step;                               // updates done
    void *m, *v;                            // [total] MEM_F32 moments, laid out like the parameter slab
    void *decay;                            // MEM_I32 mask of the elements that decay (AdamwIo.decay)
    void *sched;                            // [2] MEM_F32: the staged update's learning rate and step
    void *stats;                            // [2] MEM_F64: the last update's gradient sum of squares, refused flag
} AdamW;

int adamw_init(AdamW *o, const Model *model);
void adamw_free(AdamW *o, const Model *model);
// One update in three parts, so that the middle one can be recorded (train/step.h):
// the learning rate and the step number (o->step + 1, counted now) to the backend, queued;
int adamw_stage(AdamW *o, const Model *model, float lr);
// the backend's ops: ||g|| of the accumulated gradients, clipping to o->clip, the update (no wait);
int adamw_queue(const AdamW *o, Model *model);
// the stats read back (one wait): the norm into *grad_norm (may be NULL); a non-finite norm,
// whose update the backend skipped, is MN_ERR_NUMERIC naming the step, and o->step goes back.
int adamw_result(AdamW *o, const Model *model, double *grad_norm);
// The three in a row.
int adamw_step(AdamW *o, Model *model, float lr, double *grad_norm);

typedef struct {
    float peak;      // peak learning rate
    int warmup;      // steps of linear warm-up from peak / warmup
    int total;       // steps in all
    float final;     // the cosine ends at final * peak (0.1)
} LrSchedule;

float lr_at(const LrSchedule *s, int step);  // step counts from 0

#endif
