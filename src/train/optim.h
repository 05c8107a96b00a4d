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
    const float *wds;                       // a model of several runs: [runs] each run's weight decay (NULL:
                                            // weight_decay for all); read when an update is queued
    float clip;                             // global gradient-norm clip (1; 0: none), each run's own norm
    int step;                               // updates done
    void *m, *v;                            // [runs, total] MEM_F32 moments, laid out like the parameter slab
    void *decay;                            // MEM_I32 mask of the elements that decay (AdamwIo.decay; one
                                            // run's slab, the same for every run)
    void *sched;                            // [runs, 2] MEM_F32: the staged update's learning rate and step
    void *stats;                            // [runs, 2] MEM_F64: the last update's gradient sum of squares,
                                            // refused flag
    float *hsched;                          // host [runs, 2] and [runs, 2]: sched and stats on their way to
    double *hstats;                         //   and from the backend (adamw_init allocates them)
} AdamW;

int adamw_init(AdamW *o, const Model *model);
void adamw_free(AdamW *o, const Model *model);
// One update in three parts, so that the middle one can be recorded (train/step.h):
// the learning rate and the step number (o->step + 1, counted now) to the backend, queued (every
// run at lr; adamw_stage_runs: run r at lrs[r]);
int adamw_stage(AdamW *o, const Model *model, float lr);
int adamw_stage_runs(AdamW *o, const Model *model, const float *lrs);
// the backend's ops: ||g|| of the accumulated gradients, clipping to o->clip, the update (no wait),
// each run's of its own slab;
int adamw_queue(const AdamW *o, Model *model);
// the stats read back (one wait): the norm into *grad_norm (may be NULL); a non-finite norm,
// whose update the backend skipped, is MN_ERR_NUMERIC naming the step, and o->step goes back.
// (A model of several runs: run 0's norm, and any run's refusal is the error.)
int adamw_result(AdamW *o, const Model *model, double *grad_norm);
// A model of several runs: each run's norm (norms [runs], may be NULL) and whether its update was
// refused (refused [runs]); the others' updates were made, so o->step stays (a refused run is the
// caller's to stop).
int adamw_result_runs(AdamW *o, const Model *model, double *norms, int *refused);
// Run r's moments of a model of several runs, as an optimizer of one (for its checkpoints; neither
// step nor free it).
AdamW adamw_run_view(const AdamW *o, const Model *model, int r);
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
