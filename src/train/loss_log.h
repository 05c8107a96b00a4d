/*
 * A run's loss curve: one row per optimizer step, kept in memory while training and written as
 * loss.csv (and plotted as loss.svg) with every checkpoint. A resumed run reads loss.csv back;
 * the file is our own, so anything but what loss_log_write writes is refused with the line that
 * is wrong, never skipped: a history silently cut short would look like a complete one.
 */
#ifndef MN_LOSS_LOG_H
#define MN_LOSS_LOG_H

#include <stddef.h>

// One step's row; val_loss is NaN where the step was not validated.
typedef struct {
    double step, loss, lr, grad_norm, tokens, seconds, val_loss;
} LossRow;

enum { LOSS_LOG_COLUMNS = 7 };

typedef struct {
    LossRow *rows;
    int n, cap;
} LossLog;

int loss_log_add(LossLog *log, LossRow row);
void loss_log_free(LossLog *log);

// Parses the text of a loss.csv (len bytes, any bytes at all; `name` is used in messages): the
// header, then rows of 7 numbers, one per step from 1 on without gaps, every line ended by a
// newline. On any other input MN_ERR_FORMAT naming the line, and *log is left empty.
int loss_log_parse(const char *text, size_t len, const char *name, LossLog *log);
// loss_log_parse on a file; MN_ERR_IO with the system's reason when it cannot be read.
int loss_log_read(const char *path, LossLog *log);

// loss.csv and loss.svg (the training loss and, where measured, the validation loss) in dir,
// each written atomically.
int loss_log_write(const LossLog *log, const char *dir);

#endif
