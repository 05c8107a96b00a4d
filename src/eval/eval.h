/*
 * Evaluation over a token shard: mean NLL (perplexity = exp of it), the NLL by
 * token position within the sequence (the paper's per-position analysis), and
 * the mean CG steps the Mesa layers used.
 */
#ifndef MN_EVAL_H
#define MN_EVAL_H

#include "data/loader.h"
#include "model/model.h"

typedef struct {
    int T;                 // sequence length
    double nll_sum, count; // over all scored targets
    double *pos_sum;       // [T] NLL summed at each position
    double *pos_count;     // [T] scored targets at each position
    double cg_steps;       // mean CG steps per system
    int batches;
} EvalResult;

// Scores `batches` batches from the loader's current position (0: one pass
// over the whole split). r is allocated here; free with eval_free.
int eval_run(Model *m, DataLoader *dl, int batches, EvalResult *r);
// The same over rows row0 .. row0 + B - 1 of each of the loader's batches (one rank's part).
int eval_run_rows(Model *m, DataLoader *dl, int batches, int row0, int B, EvalResult *r);

// Called after every batch with the batches done and to do, and the tokens this
// process scored in `seconds` so far: for a progress line.
typedef void (*EvalProgress)(void *ctx, int done, int total, double tokens, double seconds);
// eval_run_rows, telling `progress` (if not NULL) after every batch.
int eval_run_rows_progress(Model *m, DataLoader *dl, int batches, int row0, int B, EvalResult *r, EvalProgress progress,
                           void *ctx);
void eval_free(EvalResult *r);

#endif
