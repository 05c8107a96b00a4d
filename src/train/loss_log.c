/*
 * The loss curve: rows in memory, loss.csv and loss.svg on disk (loss_log.h).
 */
#include "loss_log.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/atomic_file.h"
#include "core/common.h"
#include "core/csv.h"
#include "core/plot.h"

static const char *const columns[LOSS_LOG_COLUMNS] = {"step", "loss", "lr", "grad_norm", "tokens", "seconds", "val_loss"};
static const char header[] = "step,loss,lr,grad_norm,tokens,seconds,val_loss\n";

int loss_log_add(LossLog *log, LossRow row) {
    if (log->n == log->cap) {
        if (log->cap > (1 << 29)) return mn_error(MN_ERR_NOMEM, "loss log: too many rows");
        int nc = log->cap ? 2 * log->cap : 256;
        LossRow *nr = realloc(log->rows, sizeof(LossRow) * (size_t)nc);
        if (!nr) return mn_error(MN_ERR_NOMEM, "out of memory");
        log->rows = nr;
        log->cap = nc;
    }
    log->rows[log->n++] = row;
    return MN_OK;
}

void loss_log_free(LossLog *log) {
    free(log->rows);
    memset(log, 0, sizeof *log);
}

// One field of a row: the characters up to the next ',' or '\n' of the line [p, end), parsed as a
// whole number by strtod. *p moves past the field and its separator, which goes to *sep.
static int parse_field(const char **p, const char *end, double *out, char *sep) {
    char buf[64];
    size_t n = 0;
    const char *q = *p;
    while (q < end && *q != ',' && *q != '\n') {
        if (n + 1 >= sizeof buf) return 0;
        buf[n++] = *q++;
    }
    if (q == end || n == 0) return 0;
    buf[n] = 0;
    char *stop;
    *out = strtod(buf, &stop);
    if (*stop || memchr(buf, 0, n)) return 0;  // trailing characters, or a NUL byte inside
    *sep = *q;
    *p = q + 1;
    return 1;
}

// Row `row` (1-based, the file's line row + 1) from the line starting at *p; *p moves to the next.
static int parse_row(const char **p, const char *end, const char *name, int row, LossRow *r) {
    double *v = &r->step;
    int line = row + 1;
    for (int i = 0; i < LOSS_LOG_COLUMNS; i++) {
        char sep;
        if (!parse_field(p, end, &v[i], &sep))
            return mn_error(MN_ERR_FORMAT, "%s:%d: column %d (%s) is not a number ended by '%s'", name, line, i + 1,
                            columns[i], i + 1 < LOSS_LOG_COLUMNS ? "," : "a line end");
        if (sep != (i + 1 < LOSS_LOG_COLUMNS ? ',' : '\n'))
            return mn_error(MN_ERR_FORMAT, "%s:%d: expected %d columns", name, line, LOSS_LOG_COLUMNS);
    }
    if (r->step != row)
        return mn_error(MN_ERR_FORMAT, "%s:%d: step %g where step %d was expected (one row per step from 1 on)", name, line,
                        r->step, row);
    // Training stops at a loss that is not finite, so no log of ours holds one (and the plot of
    // a log without a finite loss could not be drawn on the next save).
    if (!isfinite(r->loss)) return mn_error(MN_ERR_FORMAT, "%s:%d: the loss is %g, not a finite number", name, line, r->loss);
    return MN_OK;
}

int loss_log_parse(const char *text, size_t len, const char *name, LossLog *log) {
    memset(log, 0, sizeof *log);
    size_t hl = sizeof header - 1;
    if (len < hl || memcmp(text, header, hl))
        return mn_error(MN_ERR_FORMAT, "%s:1: not a loss log (expected the header %.*s)", name, (int)hl - 1, header);
    const char *p = text + hl, *end = text + len;
    int s = MN_OK;
    for (int row = 1; p < end && !s; row++) {
        LossRow r;
        if (row == (1 << 30)) s = mn_error(MN_ERR_FORMAT, "%s: too many rows", name);
        if (!s) s = parse_row(&p, end, name, row, &r);
        if (!s) s = loss_log_add(log, r);
    }
    if (s) loss_log_free(log);
    return s;
}

int loss_log_read(const char *path, LossLog *log) {
    memset(log, 0, sizeof *log);
    char *text;
    size_t n;
    MN_TRY(file_read_all(path, (size_t)1 << 31, &text, &n));
    int s = loss_log_parse(text, n, path, log);
    free(text);
    return s;
}

int loss_log_write(const LossLog *log, const char *dir) {
    char path[4096];
    double *cols[LOSS_LOG_COLUMNS] = {0};
    size_t rows = (size_t)(log->n ? log->n : 1);
    int s = MN_OK;
    for (int c = 0; c < LOSS_LOG_COLUMNS && !s; c++) {
        if (!(cols[c] = malloc(sizeof(double) * rows))) s = mn_error(MN_ERR_NOMEM, "out of memory");
        for (int i = 0; i < log->n && !s; i++) cols[c][i] = (&log->rows[i].step)[c];
    }
    snprintf(path, sizeof path, "%s/loss.csv", dir);
    if (!s) s = csv_write(path, columns, LOSS_LOG_COLUMNS, (const double *const *)cols, log->n);
    double *vx = NULL, *vy = NULL;
    if (!s && log->n > 0) {
        // validation points only where measured
        int nv = 0;
        vx = malloc(sizeof(double) * rows);
        vy = malloc(sizeof(double) * rows);
        if (!vx || !vy) s = mn_error(MN_ERR_NOMEM, "out of memory");
        for (int i = 0; i < log->n && !s; i++)
            if (!isnan(log->rows[i].val_loss)) {
                vx[nv] = log->rows[i].step;
                vy[nv++] = log->rows[i].val_loss;
            }
        PlotSeries series[2] = {{"train loss", cols[0], cols[1], log->n}, {"validation loss", vx, vy, nv}};
        PlotOpts po = {"Training loss", "step", "loss (nats per token)", 0, 0, 0, 0};
        snprintf(path, sizeof path, "%s/loss.svg", dir);
        if (!s) s = plot_svg(path, &po, series, nv > 0 ? 2 : 1);
    }
    free(vx);
    free(vy);
    for (int c = 0; c < LOSS_LOG_COLUMNS; c++) free(cols[c]);
    return s;
}
