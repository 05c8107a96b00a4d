/*
 * run.json: what a run directory was trained with, written (atomically) when the run starts, so
 * that a resumed run can refuse options that would change what its checkpoint means, and so
 * that other commands can find the run's data:
 *
 *   {"config": "tiny", "data": "/abs/path/data/demo", "data_given": "data/demo",
 *    "seq": 256, "batch": 16, "accum": 1, "train_tokens": 123456}
 *
 * config: the --config given (a preset name or a JSON file's path); data: the data directory as
 * an absolute path (as given where it could not be resolved), data_given: as given; seq: tokens
 * per sequence; batch: sequences per micro-batch over all ranks; accum: micro-batches per step;
 * train_tokens: the tokens of the data's train.bin (a moved copy of the same data still matches).
 */
#ifndef MN_RUN_INFO_H
#define MN_RUN_INFO_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    char config[1024];
    char data[4096];
    char data_given[4096];
    int seq, batch, accum;
    uint64_t train_tokens;
} RunInfo;

// <run_dir>/run.json; MN_ERR_IO (with the system's reason) when it cannot be read, MN_ERR_FORMAT
// naming the file and the field when it is not a run.json.
int run_info_read(const char *run_dir, RunInfo *info);
// Parses the text of a run.json (len bytes, any bytes at all; `name` for messages).
int run_info_parse(const char *text, size_t len, const char *name, RunInfo *info);
int run_info_write(const char *run_dir, const RunInfo *info);
// 1 when <run_dir>/run.json exists.
int run_info_exists(const char *run_dir);

#endif
