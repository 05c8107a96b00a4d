/*
 * A synth sweep's results (cmd_synth.c): one row a finished run, kept in DIR/results.csv (read
 * back to resume a sweep and to report) and DIR/results.json.
 */
#ifndef MN_SYNTH_RESULTS_H
#define MN_SYNTH_RESULTS_H

typedef struct {
    char task[32], setting[96], mixer[64], protocol[64];
    double lr, wd;
    long long seed;
    int steps, epochs, early;
    double seconds, metric;
    double tvd;  // RegBench's TVD; NAN for the other tasks (an empty field)
} Row;

typedef struct {
    Row *v;
    int n, cap;
} Rows;

// Appends a row (fails the command when out of memory).
void rows_add(Rows *r, const Row *x);
// 1 when two rows record the same run: task, setting, mixer, protocol, seed, and lr and wd as floats.
int same_run(const Row *a, const Row *b);
// Reads a results.csv (ours, or a --jobs process's) into rows; a file that does not exist is a new
// sweep. Refused, naming the file and the line: a first line that is not the header (a row there
// would be lost), a row with a field missing or too many, a field that is not what its column holds.
// Files written before the tvd column (12 columns) are read too.
void load_rows(const char *path, Rows *rows);
// Writes dir/results.csv and dir/results.json (atomically) from the rows.
void save_rows(const char *dir, const Rows *rows);
// The best metric over the (lr, wd) grid of (task, setting, mixer) among the rows; NAN if none.
// *tvd (may be NULL): the TVD of that best run (NAN if none).
double best_of(const Rows *rows, const char *task, const char *setting, const char *mixer, const char *proto,
               long long seed, double *tvd);

#endif
