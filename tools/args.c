// The option parser shared by the mesanet commands, and their common helpers (commands.h).
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "core/common.h"

void cmd_fail(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "mesanet %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

MnPrecision lin_precision_arg(const char *cmd, const char *s) {
    if (!strcmp(s, "auto")) return MN_PREC_AUTO;
    if (!strcmp(s, "split")) return MN_PREC_SPLIT;
    if (!strcmp(s, "bf16")) return MN_PREC_BF16;
    cmd_fail(cmd, "--lin-precision: '%s': expected auto, split or bf16", s);
}

static int is_numeric(const Option *o) { return o->type == OPT_INT || o->type == OPT_FLOAT; }

// A bound as a user would type it: "1000000000", "0.5", "1e-9" (not %g's "1e-09").
static void format_bound(char *buf, size_t cap, double v, int integer) {
    if (integer) {
        snprintf(buf, cap, "%.0f", v);
        return;
    }
    snprintf(buf, cap, "%g", v);
    char *e = strchr(buf, 'e');
    if (e) snprintf(e + 1, cap - (size_t)(e + 1 - buf), "%d", atoi(e + 1));
}

// "[1, 1000000000]" or "[0, 0.5]": what --help shows and what a refusal quotes.
static void format_range(const Option *o, char *buf, size_t cap) {
    char lo[32], hi[32];
    format_bound(lo, sizeof lo, o->lo, o->type == OPT_INT);
    format_bound(hi, sizeof hi, o->hi, o->type == OPT_INT);
    snprintf(buf, cap, "[%s, %s]", lo, hi);
}

static double default_value(const Option *o) {
    return o->type == OPT_INT ? (double)*(const int *)o->dst : (double)*(const float *)o->dst;
}

int options_check(const char *cmd, const Option *opts, int nopts) {
    for (int i = 0; i < nopts; i++) {
        const Option *o = &opts[i];
        if (!is_numeric(o)) continue;
        const char *bad = NULL;
        if (!(isfinite(o->lo) && isfinite(o->hi) && o->lo < o->hi)) bad = "has no range (lo < hi)";
        else if (o->type == OPT_INT && (o->lo != floor(o->lo) || o->hi != floor(o->hi) || o->lo < INT_MIN || o->hi > INT_MAX))
            bad = "has a range that is not of integers within int";
        else if (!(default_value(o) >= o->lo && default_value(o) <= o->hi)) bad = "has a default outside its range";
        if (bad) {
            fprintf(stderr, "mesanet %s: internal error: numeric option --%s %s\n", cmd, o->name, bad);
            return 1;
        }
    }
    return 0;
}

static void print_help(const char *cmd, const char *usage, const Option *opts, int nopts) {
    printf("usage: mesanet %s %s\n\noptions:\n", cmd, usage);
    for (int i = 0; i < nopts; i++) {
        char def[160] = "", range[64];
        const Option *o = &opts[i];
        if (is_numeric(o)) format_range(o, range, sizeof range);
        if (o->type == OPT_INT) snprintf(def, sizeof def, " (default %d, range %s)", *(int *)o->dst, range);
        if (o->type == OPT_FLOAT) snprintf(def, sizeof def, " (default %g, range %s)", (double)*(float *)o->dst, range);
        if (o->type == OPT_STRING && *(const char **)o->dst) snprintf(def, sizeof def, " (default %s)", *(const char **)o->dst);
        printf("  --%-16s %s%s\n", o->name, o->help, def);
    }
}

// The whole of v as an integer or a finite number, refusing blanks, trailing
// characters and values out of range of the type (strtoll's ERANGE).
static int parse_number(const Option *o, const char *v, double *out) {
    char *end;
    if (!*v || strchr(" \t\n\v\f\r", *v)) return 0;
    errno = 0;
    if (o->type == OPT_INT) {
        long long x = strtoll(v, &end, 10);
        if (*end || errno == ERANGE || x < o->lo || x > o->hi) return 0;
        *out = (double)x;
        return 1;
    }
    double x = strtod(v, &end);
    if (*end || !isfinite(x) || x < o->lo || x > o->hi) return 0;
    *out = x;
    return 1;
}

static int set_value(const char *cmd, const Option *o, const char *v) {
    double x;
    switch (o->type) {
    case OPT_INT:
    case OPT_FLOAT: {
        if (!parse_number(o, v, &x)) {
            char range[64];
            format_range(o, range, sizeof range);
            fprintf(stderr, "mesanet %s: --%s expects %s in %s, got '%s'\n", cmd, o->name,
                    o->type == OPT_INT ? "an integer" : "a number", range, v);
            return 1;
        }
        // In range, so narrowing is exact for integers (the range lies within int).
        if (o->type == OPT_INT) *(int *)o->dst = (int)x;
        else *(float *)o->dst = (float)x;
        return 0;
    }
    case OPT_STRING: *(const char **)o->dst = v; return 0;
    case OPT_FLAG: *(int *)o->dst = 1; return 0;
    }
    return 1;
}

int parse_args(int argc, char **argv, const char *usage, const Option *opts, int nopts, char **pos, int *npos,
               int max_pos) {
    const char *cmd = argv[0];
    if (npos) *npos = 0;
    if (options_check(cmd, opts, nopts)) return 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            print_help(cmd, usage, opts, nopts);
            return 2;
        }
        if (strncmp(a, "--", 2) != 0) {
            if (!npos || *npos >= max_pos) {
                fprintf(stderr, "mesanet %s: unexpected argument '%s' (see --help)\n", cmd, a);
                return 1;
            }
            pos[(*npos)++] = argv[i];
            continue;
        }
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const Option *o = NULL;
        for (int j = 0; j < nopts; j++)
            if (strlen(opts[j].name) == len && !strncmp(opts[j].name, name, len)) o = &opts[j];
        if (!o) {
            fprintf(stderr, "mesanet %s: unknown option '%s' (see --help)\n", cmd, a);
            return 1;
        }
        const char *v = eq ? eq + 1 : NULL;
        if (o->type == OPT_FLAG) {
            if (v) {
                fprintf(stderr, "mesanet %s: --%s takes no value\n", cmd, o->name);
                return 1;
            }
            v = "1";
        } else if (!v) {
            if (i + 1 >= argc) {
                fprintf(stderr, "mesanet %s: --%s needs a value\n", cmd, o->name);
                return 1;
            }
            v = argv[++i];
        }
        if (set_value(cmd, o, v)) return 1;
    }
    return 0;
}

int ranks_begin(const char *cmd, int gpus, Group *g, int *exit_code) {
    *exit_code = 1;
    if (gpus < 1) {
        fprintf(stderr, "mesanet %s: --gpus must be >= 1, got %d\n", cmd, gpus);
        return 0;
    }
    if (dist_join(g, gpus)) {
        fprintf(stderr, "mesanet %s: %s\n", cmd, mn_last_error());
        return 0;
    }
    if (gpus == 1 || g->size > 1) return 1;
    if (dist_launch(gpus, mesanet_argv)) {  // the ranks are this command again
        fprintf(stderr, "mesanet %s: %s\n", cmd, mn_last_error());
        return 0;
    }
    *exit_code = 0;
    return 0;
}
