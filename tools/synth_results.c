// A synth sweep's results.csv and results.json (synth_results.h).
#include "synth_results.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/atomic_file.h"
#include "core/common.h"
#include "tools/commands.h"

#define CMD "synth"

void rows_add(Rows *r, const Row *x) {
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 64;
        r->v = realloc(r->v, sizeof(Row) * (size_t)r->cap);
        if (!r->v) cmd_fail(CMD, "out of memory");
    }
    r->v[r->n++] = *x;
}

int same_run(const Row *a, const Row *b) {
    return !strcmp(a->task, b->task) && !strcmp(a->setting, b->setting) && !strcmp(a->mixer, b->mixer) &&
           !strcmp(a->protocol, b->protocol) && a->seed == b->seed && (float)a->lr == (float)b->lr &&
           (float)a->wd == (float)b->wd;
}

static const char *const csv_header = "task,setting,mixer,protocol,seed,lr,wd,steps,epochs,stopped_early,train_seconds,metric,tvd";

// One CSV field (RFC 4180 quoting) of a line into out (cap bytes); returns the position after it
// and its separator, *last set where the line ends with it; NULL for a quote left open or a field
// longer than cap - 1 bytes.
static const char *csv_field(const char *p, char *out, size_t cap, int *last) {
    size_t n = 0;
    int quoted = *p == '"';
    if (quoted) {
        for (p++;; p++) {
            if (!*p) return NULL;
            if (*p == '"' && p[1] == '"') p++;
            else if (*p == '"') {
                p++;
                break;
            }
            if (n + 1 >= cap) return NULL;
            out[n++] = *p;
        }
        if (*p && *p != ',') return NULL;  // text after the closing quote
    } else
        for (; *p && *p != ','; p++) {
            if (n + 1 >= cap) return NULL;
            out[n++] = *p;
        }
    out[n] = 0;
    *last = *p != ',';
    return *p == ',' ? p + 1 : p;
}

static void csv_put(FILE *f, const char *s) {
    if (!strpbrk(s, ",\"\n")) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

// A field of results.csv as a number: the whole field, finite, within [lo, hi] (an integer where
// integer is set). A damaged field is refused with the file, its line and the column: a metric of
// "abc" must never read as 0.
static double csv_number(const char *path, int line, const char *column, const char *text, double lo, double hi,
                         int integer) {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    int ok = *text && !strchr(" \t", *text) && !*end && !errno && isfinite(v) && v >= lo && v <= hi &&
             (!integer || v == floor(v));
    if (!ok)
        cmd_fail(CMD, "%s: line %d: %s is '%s', expected %s in [%g, %g] (a damaged row: correct or delete the line)",
                 path, line, column, text, integer ? "an integer" : "a number", lo, hi);
    return v;
}

void load_rows(const char *path, Rows *rows) {
    char *text;
    size_t n;
    FILE *probe = fopen(path, "r");
    if (!probe) return;  // a new sweep
    fclose(probe);
    if (file_read_all(path, (size_t)1 << 30, &text, &n)) cmd_fail(CMD, "%s", mn_last_error());
    if (strlen(text) != n) cmd_fail(CMD, "%s: holds a NUL byte: not a results table", path);
    size_t old_len = strlen(csv_header) - strlen(",tvd");
    int ncols = 0, line = 0;
    for (char *p = text; *p;) {
        char *end = strchr(p, '\n');
        if (end) *end = 0;
        line++;
        size_t len = strlen(p);
        if (len && p[len - 1] == '\r') p[--len] = 0;
        if (line == 1) {
            if (!strcmp(p, csv_header)) ncols = 13;
            else if (len == old_len && !strncmp(p, csv_header, old_len)) ncols = 12;
            else
                cmd_fail(CMD, "%s: line 1 is '%.60s', not the header '%s' (results.csv starts with it)", path, p,
                         csv_header);
        } else if (len) {
            char f[13][128];
            const char *q = p;
            int nf = 0, last = 0;
            while (!last) {
                if (nf == 13) {
                    nf++;
                    break;
                }
                q = csv_field(q, f[nf], sizeof f[nf], &last);
                if (!q)
                    cmd_fail(CMD, "%s: line %d: field %d has a quote left open or is longer than %zu characters", path,
                             line, nf + 1, sizeof f[0] - 1);
                nf++;
            }
            if (nf != ncols)
                cmd_fail(CMD, "%s: line %d has %s%d fields, expected %d (%s): a damaged row, correct or delete the line",
                         path, line, nf > 13 ? "more than " : "", nf > 13 ? 13 : nf, ncols, csv_header);
            if (ncols == 12) f[12][0] = 0;
            static const char *const names[4] = {"task", "setting", "mixer", "protocol"};
            const size_t caps[4] = {sizeof((Row *)0)->task, sizeof((Row *)0)->setting, sizeof((Row *)0)->mixer,
                                    sizeof((Row *)0)->protocol};
            for (int i = 0; i < 4; i++)
                if (!f[i][0] || strlen(f[i]) >= caps[i])
                    cmd_fail(CMD, "%s: line %d: %s '%s' is %s", path, line, names[i], f[i],
                             f[i][0] ? "too long" : "empty");
            Row r = {0};
            snprintf(r.task, sizeof r.task, "%s", f[0]);
            snprintf(r.setting, sizeof r.setting, "%s", f[1]);
            snprintf(r.mixer, sizeof r.mixer, "%s", f[2]);
            snprintf(r.protocol, sizeof r.protocol, "%s", f[3]);
            r.seed = (long long)csv_number(path, line, "seed", f[4], 0, 1e15, 1);
            r.lr = csv_number(path, line, "lr", f[5], 0, 1e6, 0);
            r.wd = csv_number(path, line, "wd", f[6], 0, 1e6, 0);
            r.steps = (int)csv_number(path, line, "steps", f[7], 0, INT_MAX, 1);
            r.epochs = (int)csv_number(path, line, "epochs", f[8], 0, INT_MAX, 1);
            r.early = (int)csv_number(path, line, "stopped_early", f[9], 0, 1, 1);
            r.seconds = csv_number(path, line, "train_seconds", f[10], 0, 1e12, 0);
            r.metric = csv_number(path, line, "metric", f[11], 0, 1, 0);
            r.tvd = f[12][0] ? csv_number(path, line, "tvd", f[12], 0, 1, 0) : NAN;
            rows_add(rows, &r);
        }
        if (!end) break;
        p = end + 1;
    }
    if (line == 0) cmd_fail(CMD, "%s: empty, not even the header '%s'", path, csv_header);
    free(text);
}

void save_rows(const char *dir, const Rows *rows) {
    char path[4096];
    AtomicFile af;
    snprintf(path, sizeof path, "%s/results.csv", dir);
    if (af_open(&af, path)) cmd_fail(CMD, "%s", mn_last_error());
    fprintf(af.f, "%s\n", csv_header);
    for (int i = 0; i < rows->n; i++) {
        const Row *r = &rows->v[i];
        csv_put(af.f, r->task), fputc(',', af.f), csv_put(af.f, r->setting), fputc(',', af.f);
        csv_put(af.f, r->mixer), fputc(',', af.f);
        fprintf(af.f, "%s,%lld,%.6g,%.6g,%d,%d,%d,%.3f,%.17g,", r->protocol, r->seed, r->lr, r->wd, r->steps,
                r->epochs, r->early, r->seconds, r->metric);
        if (isfinite(r->tvd)) fprintf(af.f, "%.17g", r->tvd);
        fputc('\n', af.f);
    }
    if (af_commit(&af)) cmd_fail(CMD, "%s", mn_last_error());
    snprintf(path, sizeof path, "%s/results.json", dir);
    if (af_open(&af, path)) cmd_fail(CMD, "%s", mn_last_error());
    fprintf(af.f, "[\n");
    for (int i = 0; i < rows->n; i++) {
        const Row *r = &rows->v[i];
        // Names hold no quotes or backslashes (task names, grid labels, mixer patterns).
        fprintf(af.f,
                "  {\"task\": \"%s\", \"setting\": \"%s\", \"mixer\": \"%s\", \"protocol\": \"%s\", \"seed\": %lld, "
                "\"lr\": %.6g, \"wd\": %.6g, \"steps\": %d, \"epochs\": %d, \"stopped_early\": %s, "
                "\"train_seconds\": %.3f, \"metric\": ",
                r->task, r->setting, r->mixer, r->protocol, r->seed, r->lr, r->wd, r->steps, r->epochs,
                r->early ? "true" : "false", r->seconds);
        if (isfinite(r->metric)) fprintf(af.f, "%.17g", r->metric);
        else fprintf(af.f, "null");
        fprintf(af.f, ", \"tvd\": ");
        if (isfinite(r->tvd)) fprintf(af.f, "%.17g", r->tvd);
        else fprintf(af.f, "null");
        fprintf(af.f, "}%s\n", i + 1 < rows->n ? "," : "");
    }
    fprintf(af.f, "]\n");
    if (af_commit(&af)) cmd_fail(CMD, "%s", mn_last_error());
}

double best_of(const Rows *rows, const char *task, const char *setting, const char *mixer, const char *proto,
                      long long seed, double *tvd) {
    double best = NAN;
    if (tvd) *tvd = NAN;
    for (int i = 0; i < rows->n; i++) {
        const Row *r = &rows->v[i];
        if (strcmp(r->task, task) || strcmp(r->setting, setting) || strcmp(r->mixer, mixer) ||
            strcmp(r->protocol, proto) || r->seed != seed)
            continue;
        if (isnan(best) || r->metric > best) {
            best = r->metric;
            if (tvd) *tvd = r->tvd;
        }
    }
    return best;
}
