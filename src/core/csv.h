/*
 * CSV tables of results, beside their plots (plot.h): written atomically (temporary file, fsync,
 * rename; see core/atomic_file.h), so a table refreshed during training is never seen half-written.
 */
#ifndef MN_CSV_H
#define MN_CSV_H

// Writes a CSV table: a header line of the ncol column names, then nrow lines
// with data[c][r] in column c. Names containing , " or a newline are quoted
// (RFC 4180). Numbers use the fewest significant digits (15, 16 or 17) that
// read back as the same double, so 0.1 is written "0.1" and every value
// survives a round trip exactly; NaN and infinities are written nan, inf,
// -inf, which strtod, Python and pandas read.
int csv_write(const char *path, const char *const *columns, int ncol, const double *const *data, int nrow);

#endif
