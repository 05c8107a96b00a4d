/*
 * Fuzzes reading a run's loss.csv (src/train/loss_log.h), which a resumed run
 * reads back before it goes on.
 *
 * Input: the bytes of a loss.csv. A log that loss_log_parse accepts must hold
 * one row per step from 1 on; written again with loss_log_write (loss.csv and
 * its plot loss.svg, whatever the numbers: NaN, infinities, huge) it must read
 * back to the same numbers (or be refused as too wide a range to plot, the
 * one refusal allowed: losses of 1e308 and -1e308). Seeds: logs that loss_log_write makes
 * (fuzz/seeds.c) and fuzz/edge/loss_log/.
 *
 *     make fuzz FUZZ_TARGETS=loss_log FUZZ_TIME=60
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "fuzz.h"
#include "train/loss_log.h"

static int same(double a, double b) { return (isnan(a) && isnan(b)) || a == b; }

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_init();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    LossLog log, again;
    if (loss_log_parse((const char *)data, size, "fuzz", &log)) {
        if (log.rows || log.n) abort();  // documented: left empty on failure
        return 0;
    }
    for (int i = 0; i < log.n; i++)
        if (log.rows[i].step != i + 1) abort();
    char path[512];
    if (loss_log_write(&log, fuzz_dir())) {
        // The one refusal allowed: losses spread wider than a double holds (1e308 and -1e308),
        // which the plot cannot scale; training never writes such a log.
        if (strstr(mn_last_error(), "data range too wide to draw")) {
            loss_log_free(&log);
            return 0;
        }
        fprintf(stderr, "loss_log_write refused a parsed log: %s\n", mn_last_error());
        abort();
    }
    fuzz_path(path, sizeof path, "loss.csv");
    if (loss_log_read(path, &again) || again.n != log.n) {
        fprintf(stderr, "a parsed log, written, does not read back: %s\n", mn_last_error());
        abort();
    }
    for (int i = 0; i < log.n; i++) {
        const double *a = &log.rows[i].step, *b = &again.rows[i].step;
        for (int c = 0; c < LOSS_LOG_COLUMNS; c++)
            if (!same(a[c], b[c])) {
                fprintf(stderr, "row %d column %d: %.17g written, %.17g read back\n", i + 1, c + 1, a[c], b[c]);
                abort();
            }
    }
    loss_log_free(&again);
    loss_log_free(&log);
    return 0;
}
