/*
 * One training step with no host round trip between its ops: the batch and the step's scalars
 * (the gradient's weight, the learning rate) are uploaded without waiting, then the gradients are
 * zeroed, each micro-batch runs forward, loss and backward, and the clipped AdamW update follows
 * (optim.h), all on the backend; the loss sum, the gradient norm and whether the update was
 * refused stay there until train_step_result reads them (the one wait of a step).
 *
 * Where the backend records (graph ops: cuda), the ops after the uploads are recorded once per
 * batch shape (B, T, micro-batches), buffers and solver settings, and replayed (recorded_run in
 * core/backend.h: an eager step first, so that every buffer and workspace has grown). The steps
 * run eagerly while the model profiles, and when a gradient hook is set (data parallelism: the
 * trainer then keeps its own sequence), and a step right after a forward of another shape (an
 * evaluation, a decode) runs eagerly once, since mixers write host values per shape (attention's
 * positions) in their forward, which a replay does not.
 */
#ifndef MN_STEP_H
#define MN_STEP_H

#include "train/optim.h"

typedef struct {
    Model *m;
    AdamW *opt;
    int record;               // record the steps where the backend can (train_step_init: 1, or 0 where
                              // the environment sets MESANET_TRAIN_GRAPHS=0)
    int B, T, accum;          // the shape the batch buffers hold (0: none yet)
    void *tokens, *targets;   // [accum, B*T] MEM_I32: the step's micro-batches
    void *weight;             // [runs] MEM_F32: the gradient's weight (1 / the step's scored tokens), a run's
    void *loss;               // [runs] MEM_F64: the step's loss sum, a run's
    float *hweight;           // host [runs]: the weights on their way to `weight`
    Recorded rec;             // the recorded step (core/backend.h)
    unsigned rec_gen;         // the model's activation buffers (Model.act_gen) and solver it holds
    MnSolver rec_solver;
    int queued;               // a step is queued whose results have not been read
} TrainStep;

int train_step_init(TrainStep *s, Model *m, AdamW *opt);
void train_step_free(TrainStep *s);
// Queues one step over `accum` micro-batches of B sequences of T tokens (tokens, targets: host
// [accum][B*T]; targets < 0 are not scored): the gradient of weight * (the sum of their losses),
// and one update at lr. Returns without waiting for the backend.
int train_step_queue(TrainStep *s, const int32_t *tokens, const int32_t *targets, int B, int T, int accum, float weight,
                     float lr);
// Waits for the queued step: its loss sum and gradient norm (either may be NULL). A non-finite
// norm (the update was skipped) is MN_ERR_NUMERIC naming the step.
int train_step_result(TrainStep *s, double *loss_sum, double *grad_norm);
// A model of several runs (model_create_runs): B counts every run's sequences (B / runs each, the
// runs' batches one after the other in each micro-batch), and each run has its own gradient weight
// and learning rate (weights, lrs [runs]); the results are each run's loss sum and gradient norm
// (either may be NULL) and whether its update was refused (refused [runs]: the run's to stop).
int train_step_queue_runs(TrainStep *s, const int32_t *tokens, const int32_t *targets, int B, int T, int accum,
                          const float *weights, const float *lrs);
int train_step_result_runs(TrainStep *s, double *loss_sums, double *grad_norms, int *refused);
// Both.
int train_step(TrainStep *s, const int32_t *tokens, const int32_t *targets, int B, int T, int accum, float weight,
               float lr, double *loss_sum, double *grad_norm);

#endif
