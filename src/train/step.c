#include "step.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"

int train_step_init(TrainStep *s, Model *m, AdamW *opt) {
    memset(s, 0, sizeof *s);
    s->m = m;
    s->opt = opt;
    const char *env = getenv("MESANET_TRAIN_GRAPHS");  // "0": eager steps (for comparisons)
    s->record = !(env && !strcmp(env, "0"));
    s->weight = m->be->alloc(m->be, (size_t)m->runs, MEM_F32);
    s->loss = m->be->alloc(m->be, (size_t)m->runs, MEM_F64);
    s->hweight = malloc(sizeof(float) * (size_t)m->runs);
    if (!s->weight || !s->loss || !s->hweight) {
        train_step_free(s);
        return MN_ERR_NOMEM;
    }
    return MN_OK;
}

static void free_batch(TrainStep *s) {
    const Backend *be = s->m->be;
    recorded_reset(&s->rec, be);  // it holds the buffers' addresses
    if (s->tokens) be->free(be, s->tokens);
    if (s->targets) be->free(be, s->targets);
    s->tokens = s->targets = NULL;
    s->B = s->T = s->accum = 0;
}

void train_step_free(TrainStep *s) {
    if (!s->m) return;
    const Backend *be = s->m->be;
    free_batch(s);
    if (s->weight) be->free(be, s->weight);
    if (s->loss) be->free(be, s->loss);
    s->weight = s->loss = NULL;
    free(s->hweight);
    s->hweight = NULL;
}

static int alloc_batch(TrainStep *s, int B, int T, int accum) {
    const Backend *be = s->m->be;
    free_batch(s);
    size_t n = (size_t)B * T * accum;
    s->tokens = be->alloc(be, n, MEM_I32);
    s->targets = be->alloc(be, n, MEM_I32);
    if (!s->tokens || !s->targets) {
        free_batch(s);
        return MN_ERR_NOMEM;
    }
    s->B = B, s->T = T, s->accum = accum;
    return MN_OK;
}

// The step's backend ops, after its uploads: what is recorded.
static int step_ops(void *arg) {
    TrainStep *s = arg;
    Model *m = s->m;
    const Backend *be = m->be;
    size_t N = (size_t)s->B * s->T, e = be->elem_size(be, MEM_I32);
    MN_TRY(model_zero_grad(m));
    be->zero(be, s->loss, (size_t)m->runs, MEM_F64);
    for (int a = 0; a < s->accum; a++)
        MN_TRY(model_train_ops(m, (char *)s->tokens + a * N * e, (char *)s->targets + a * N * e, s->weight, s->loss));
    return adamw_queue(s->opt, m);
}

// The ops eagerly, or through the recording where it may serve.
static int run_step(TrainStep *s) {
    Model *m = s->m;
    const Backend *be = m->be;
    if (!s->record || !be->graph_begin || m->profile || m->grads_done) return step_ops(s);
    if (s->rec_gen != m->act_gen || !model_solver_same(&s->rec_solver, &m->solver)) {
        recorded_reset(&s->rec, be);
        s->rec_gen = m->act_gen;
        s->rec_solver = m->solver;
    }
    if (m->fwd_B != s->B || m->fwd_T != s->T || m->fwd_state) {  // another shape's host values in place
        int st = step_ops(s);
        if (!st && !s->rec.graph) s->rec.warm = 1;  // (it serves as the warm-up)
        return st;
    }
    return recorded_run(&s->rec, be, step_ops, s);
}

// A step's uploads and ops: every run's gradient weight weights[r] and learning rate lrs[r], or (where
// those are NULL) weight and lr for all.
static int queue(TrainStep *s, const int32_t *tokens, const int32_t *targets, int B, int T, int accum,
                 const float *weights, const float *lrs, float weight, float lr) {
    Model *m = s->m;
    const Backend *be = m->be;
    if (s->queued) return mn_error(MN_ERR_ARG, "train step: the last step's results were not read");
    if (accum < 1) return mn_error(MN_ERR_ARG, "train step: %d micro-batches, at least 1", accum);
    if (B <= 0 || T <= 0 || (double)B * T * accum > INT_MAX)
        return mn_error(MN_ERR_ARG, "train step: %d micro-batches of %d x %d tokens, at most %d tokens", accum, B, T,
                        INT_MAX);
    if (B % m->runs)
        return mn_error(MN_ERR_ARG, "train step: %d sequences for %d runs (the same number each)", B, m->runs);
    size_t N = (size_t)B * T;
    for (int a = 0; a < accum; a++) MN_TRY(model_train_begin(m, tokens + a * N, targets + a * N, B, T));
    if (B != s->B || T != s->T || accum != s->accum) MN_TRY(alloc_batch(s, B, T, accum));
    MN_TRY(be->upload_i32(be, s->tokens, tokens, N * accum));
    MN_TRY(be->upload_i32(be, s->targets, targets, N * accum));
    for (int r = 0; r < m->runs; r++) s->hweight[r] = weights ? weights[r] : weight;
    MN_TRY(be->upload_f32(be, s->weight, s->hweight, (size_t)m->runs, MEM_F32));
    MN_TRY(lrs ? adamw_stage_runs(s->opt, m, lrs) : adamw_stage(s->opt, m, lr));
    int st = run_step(s);
    if (st) {
        s->opt->step--;  // not taken
        return st;
    }
    s->queued = 1;
    return MN_OK;
}

int train_step_queue_runs(TrainStep *s, const int32_t *tokens, const int32_t *targets, int B, int T, int accum,
                          const float *weights, const float *lrs) {
    return queue(s, tokens, targets, B, T, accum, weights, lrs, 0, 0);
}

int train_step_queue(TrainStep *s, const int32_t *tokens, const int32_t *targets, int B, int T, int accum, float weight,
                     float lr) {
    return queue(s, tokens, targets, B, T, accum, NULL, NULL, weight, lr);
}

int train_step_result_runs(TrainStep *s, double *loss_sums, double *grad_norms, int *refused) {
    if (!s->queued) return mn_error(MN_ERR_ARG, "train step: no step queued");
    s->queued = 0;
    if (loss_sums) MN_TRY(s->m->be->download(s->m->be, loss_sums, s->loss, (size_t)s->m->runs, MEM_F64));
    return adamw_result_runs(s->opt, s->m, grad_norms, refused);
}

int train_step_result(TrainStep *s, double *loss_sum, double *grad_norm) {
    if (!s->queued) return mn_error(MN_ERR_ARG, "train step: no step queued");
    s->queued = 0;
    double loss;
    MN_TRY(s->m->be->download(s->m->be, &loss, s->loss, 1, MEM_F64));  // (run 0's)
    if (loss_sum) *loss_sum = loss;
    return adamw_result(s->opt, s->m, grad_norm);
}

int train_step(TrainStep *s, const int32_t *tokens, const int32_t *targets, int B, int T, int accum, float weight,
               float lr, double *loss_sum, double *grad_norm) {
    MN_TRY(train_step_queue(s, tokens, targets, B, T, accum, weight, lr));
    return train_step_result(s, loss_sum, grad_norm);
}
