// A toy corpus and the command-line tool, for the tests that train.
#ifndef MN_TEST_TOY_H
#define MN_TEST_TOY_H

#include "train/trainer.h"

// train.bin (20,000 tokens) and valid.bin (5,000) in data_dir: documents of a repeating random
// pattern over 60 tokens, each preceded by BOS = 63 (vocabulary 64). Dies on failure.
void write_toy_shards(const char *data_dir);

// Training options for the toy corpus in `data`, the run in `out`: the tiny preset, 12 steps of
// 4 x 32 tokens (3 of warmup, lr 1e-2), evaluation on 2 batches every 4 steps, no saves before
// the end, 20 CG steps.
TrainOptions toy_train_options(const char *data, const char *out);

// Runs `mesanet <args>` (the tool built beside this test binary), its output into the file
// `log`; returns its exit status (-1, and a test failure, where the tool is missing).
int run_tool(const char *args, const char *log);

// The second column of a CSV file with a header line into out (at most max rows); the rows read,
// or -1 where the file cannot be opened.
int read_second_column(const char *path, double *out, int max);

// The "loss" column of the run directory's loss.csv into out (at most max rows); the rows read, or
// -1 where the file cannot be opened.
int read_losses(const char *dir, double *out, int max);

#endif
