/*
 * The training loop: batches from the data loader, gradient accumulation,
 * AdamW with warm-up and cosine decay, a progress line, periodic validation,
 * atomic checkpoints, exact resume, and the loss curve as CSV and SVG; on
 * one device or data-parallel over several (train/dist.h).
 */
#ifndef MN_TRAINER_H
#define MN_TRAINER_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "mesanet.h"
#include "train/dist.h"

// A run resumed from its checkpoint keeps what its checkpoint means: config, data, seq, batch (of
// all ranks together) and accum must be the run's own (recorded in its run.json, run_info.h) or
// unset (NULL, 0: the run's own), and anything else is refused naming the option; a fresh run
// takes the defaults of train_options_default for the unset ones.
typedef struct {
    const char *config;     // preset name or JSON file
    const char *data;       // directory with train.bin and valid.bin (and the tokenizer files)
    const char *out;        // run directory: checkpoints, run.json, loss.csv, loss.svg (made with its parents)
    const char *backend;    // "cpu", "cuda" or "ref"
    int batch, seq, accum;  // sequences per micro-batch, tokens per sequence, micro-batches per step
    int steps, warmup;      // optimizer steps in all, warm-up steps
    float lr, lr_final;     // peak learning rate; the cosine ends at lr_final * lr
    float weight_decay, clip, beta1, beta2;
    int eval_every, eval_batches;  // validation every this many steps (0: at the end only), over this many batches
    int save_every;         // checkpoint every this many steps (and at the end)
    int log_every;          // progress line every this many steps
    uint64_t seed;
    int cg_steps;           // CG steps in training (0: the config's)
    MnPrecision lin_precision;  // the lin family's GPU products (AUTO: the backend's choice)
    float time_limit;       // minutes; > 0: stop (and save) when reached
    int stop_at;            // > 0: stop (and save) after this step, as if interrupted
    int resume;             // continue from `out` when it holds a checkpoint (0: start afresh, removing it)
    Group *group;           // data-parallel ranks (train/dist.h), each with `batch` sequences of every
                            // micro-batch; rank 0 logs, validates and saves. NULL: this process alone
} TrainOptions;

void train_options_default(TrainOptions *o);
int train_run(const TrainOptions *o, FILE *log);

// The ETA of the progress line: "--" until `timed` (>= 2) steps after this process's first have
// taken `seconds` (the first carries the start-up: allocations, first touches of memory, code
// loading, and measured alone it overestimates the rest many times); then their mean times the
// steps left.
void train_eta(char *buf, size_t n, int steps_left, int timed, double seconds);

#endif
