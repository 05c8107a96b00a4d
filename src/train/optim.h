/*
 * AdamW with decoupled weight decay (none on embeddings, norms, gate biases
 * and lambda: the ParamSpec decay flags), global-norm gradient clipping, and
 * the learning-rate schedule of the spec: linear warm-up, cosine decay to a
 * fraction of the peak.
 */
#ifndef MN_OPTIM_H
#define MN_OPTIM_H

#include "model/model.h"

typedef struct {
    float beta1, beta2, eps, weight_decay;  // (0.9, 0.95, 1e-8, 0.1)
    float clip;                             // global gradient-norm clip (1; 0: none)
    int step;                               // updates done
    void *m, *v;                            // [total] MEM_F32 moments, laid out like the parameter slab
} AdamW;

int adamw_init(AdamW *o, const Model *model);
void adamw_free(AdamW *o, const Model *model);
// ||g|| of the accumulated gradients, clipping to o->clip, then one update at lr.
int adamw_step(AdamW *o, Model *model, float lr, double *grad_norm);

typedef struct {
    float peak;      // peak learning rate
    int warmup;      // steps of linear warm-up from peak / warmup
    int total;       // steps in all
    float final;     // the cosine ends at final * peak (0.1)
} LrSchedule;

float lr_at(const LrSchedule *s, int step);  // step counts from 0

#endif
