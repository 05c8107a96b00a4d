#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "core/common.h"

static void print_help(const char *cmd, const char *usage, const Option *opts, int nopts) {
    printf("usage: mesanet %s %s\n\noptions:\n", cmd, usage);
    for (int i = 0; i < nopts; i++) {
        char def[64] = "";
        const Option *o = &opts[i];
        if (o->type == OPT_INT) snprintf(def, sizeof def, " (default %d)", *(int *)o->dst);
        if (o->type == OPT_FLOAT) snprintf(def, sizeof def, " (default %g)", (double)*(float *)o->dst);
        if (o->type == OPT_STRING && *(const char **)o->dst) snprintf(def, sizeof def, " (default %s)", *(const char **)o->dst);
        printf("  --%-16s %s%s\n", o->name, o->help, def);
    }
}

static int set_value(const char *cmd, const Option *o, const char *v) {
    char *end;
    switch (o->type) {
    case OPT_INT: {
        long x = strtol(v, &end, 10);
        if (*v == 0 || *end) {
            fprintf(stderr, "mesanet %s: --%s expects an integer, got '%s'\n", cmd, o->name, v);
            return 1;
        }
        *(int *)o->dst = (int)x;
        return 0;
    }
    case OPT_FLOAT: {
        double x = strtod(v, &end);
        if (*v == 0 || *end) {
            fprintf(stderr, "mesanet %s: --%s expects a number, got '%s'\n", cmd, o->name, v);
            return 1;
        }
        *(float *)o->dst = (float)x;
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
