/*
 * CSV tables (see csv.h).
 */
#include "csv.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "atomic_file.h"
#include "common.h"

// The fewest of 15, 16, 17 significant digits that strtod reads back exactly
// (17 always does); this keeps 0.1 as "0.1" rather than 0.10000000000000001.
static void format_double(char *buf, size_t cap, double v) {
    if (isnan(v)) snprintf(buf, cap, "nan");
    else if (isinf(v)) snprintf(buf, cap, v > 0 ? "inf" : "-inf");
    else
        for (int p = 15; p <= 17; p++) {
            snprintf(buf, cap, "%.*g", p, v);
            if (strtod(buf, NULL) == v) break;
        }
}

static void csv_name(FILE *f, const char *s) {
    if (!strpbrk(s, ",\"\r\n")) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);  // RFC 4180 doubles quotes inside quotes
        fputc(*s, f);
    }
    fputc('"', f);
}

int csv_write(const char *path, const char *const *columns, int ncol, const double *const *data, int nrow) {
    if (!path || !columns || !data || ncol <= 0 || nrow < 0)
        return mn_error(MN_ERR_ARG, "csv %s: need a path, at least one column and nrow >= 0 (ncol=%d, nrow=%d)",
                        path ? path : "(null)", ncol, nrow);
    for (int c = 0; c < ncol; c++)
        if (!columns[c] || (nrow > 0 && !data[c]))
            return mn_error(MN_ERR_ARG, "csv %s: column %d has no name or no data", path, c);
    AtomicFile af;
    MN_TRY(af_open(&af, path));
    for (int c = 0; c < ncol; c++) {
        if (c) fputc(',', af.f);
        csv_name(af.f, columns[c]);
    }
    fputc('\n', af.f);
    char num[40];
    for (int r = 0; r < nrow; r++)
        for (int c = 0; c < ncol; c++) {
            format_double(num, sizeof num, data[c][r]);
            fputs(num, af.f);
            fputc(c + 1 < ncol ? ',' : '\n', af.f);
        }
    return af_commit(&af);
}
