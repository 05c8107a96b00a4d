#include "eval.h"

#include <stdlib.h>
#include <string.h>

#include "core/common.h"

int eval_run(Model *m, DataLoader *dl, int batches, EvalResult *r) { return eval_run_rows(m, dl, batches, 0, dl->B, r); }

int eval_run_rows(Model *m, DataLoader *dl, int batches, int row0, int B, EvalResult *r) {
    return eval_run_rows_progress(m, dl, batches, row0, B, r, NULL, NULL);
}

int eval_run_rows_progress(Model *m, DataLoader *dl, int batches, int row0, int B, EvalResult *r, EvalProgress progress,
                           void *ctx) {
    int T = dl->T;
    size_t N = (size_t)B * T, all = (size_t)dl->B * T;
    if (row0 < 0 || B < 1 || row0 + B > dl->B)
        return mn_error(MN_ERR_ARG, "eval: rows %d..%d are not within the loader's batch of %d", row0, row0 + B - 1, dl->B);
    memset(r, 0, sizeof *r);
    r->T = T;
    if (batches <= 0) batches = (int)((loader_num_sequences(dl) + (uint64_t)dl->B - 1) / (uint64_t)dl->B);
    r->pos_sum = calloc((size_t)T, sizeof(double));
    r->pos_count = calloc((size_t)T, sizeof(double));
    int32_t *in_all = malloc(sizeof(int32_t) * all), *tg_all = malloc(sizeof(int32_t) * all);
    int32_t *in = in_all ? in_all + (size_t)row0 * T : NULL, *tg = tg_all ? tg_all + (size_t)row0 * T : NULL;
    float *losses = malloc(sizeof(float) * N);
    int s = (!r->pos_sum || !r->pos_count || !in || !tg || !losses) ? mn_error(MN_ERR_NOMEM, "out of memory") : MN_OK;
    double cg_before;
    if (!s) s = model_take_cg_steps(m, &cg_before);  // zeroes the counters
    double t0 = mn_now();
    for (int b = 0; b < batches && !s; b++) {
        if ((s = loader_next(dl, in_all, tg_all))) break;
        if ((s = model_forward(m, in, tg, B, T, 0, NULL))) break;
        if ((s = model_losses(m, losses))) break;
        for (size_t i = 0; i < N; i++) {
            if (tg[i] < 0) continue;
            r->nll_sum += losses[i];
            r->count += 1;
            r->pos_sum[i % (size_t)T] += losses[i];
            r->pos_count[i % (size_t)T] += 1;
        }
        r->batches++;
        if (progress) progress(ctx, r->batches, batches, (double)r->batches * (double)N, mn_now() - t0);
    }
    if (!s) s = model_take_cg_steps(m, &r->cg_steps);
    free(in_all);
    free(tg_all);
    free(losses);
    if (s) eval_free(r);
    return s;
}

void eval_free(EvalResult *r) {
    free(r->pos_sum);
    free(r->pos_count);
    r->pos_sum = r->pos_count = NULL;
}
