/*
 * `mesanet bench sweep`: how fast a sweep of small models trains, in steps per second over all its
 * runs, by the three ways `mesanet synth` can run them, one command each, timed from outside:
 *
 *   alone       one run (the grid's first setting): `synth TASK --mixers M --max-steps S`; its
 *               step time is the marginal one, (wall(2S steps) - wall(S steps)) / S, which leaves
 *               out what a run spends once (start-up, model set-up, the final test)
 *   processes   P runs as P processes (`--jobs P`): the path that shares the GPU by time slices
 *   parallel N  N runs in one process, each on its own thread and CUDA stream (`--parallel N`)
 *   grid N      N runs as one model of N runs (`--grid N`, core/runs.h): one batch, one stream
 *
 * N runs are the first N of the task's (lr, wd) grid (MAD's: 6 settings) times as many seeds as it
 * takes (--seeds, --stop-after N).
 *
 * Each is the tool itself run as a child (its output in DIR/M-WAY/log.txt); steps are read back from
 * the sweep's results.csv, so every way counts the same things: start-up, set-up, the steps, the final
 * test. "cores": the processor time of the sweep (its processes' user + system) over its wall time,
 * how many cores it kept busy. Output: a table, DIR/sweep.csv and DIR/sweep.svg.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "core/common.h"
#include "core/plot.h"
#include "synth/parallel.h"
#include "synth/run.h"
#include "tools/commands.h"
#include "tools/synth_results.h"

#define CMD "bench sweep"

enum { MAX_MIXERS = 16, MAX_WAYS = 12 };

// Runs `mesanet synth ARGS...` (a NULL-ended list) with its output into log; the wall time, *cpu
// the processor time it and its children took (user + system).
static double run_synth(char *const *args, const char *log, double *cpu) {
    double t0 = mn_now();
    fflush(stdout), fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) cmd_fail(CMD, "fork failed");
    if (pid == 0) {
        if (!freopen(log, "w", stdout) || dup2(fileno(stdout), 2) < 0) _exit(127);
        execv("/proc/self/exe", args);
        _exit(127);
    }
    int status;
    if (waitpid(pid, &status, 0) != pid) cmd_fail(CMD, "waitpid failed");
    double wall = mn_now() - t0;
    // the times of every child waited for so far (the sweep, and its --jobs processes it waited
    // for), less those before this one
    struct rusage all;
    static double before;
    getrusage(RUSAGE_CHILDREN, &all);
    double total = (double)all.ru_utime.tv_sec + 1e-6 * all.ru_utime.tv_usec + (double)all.ru_stime.tv_sec +
                   1e-6 * all.ru_stime.tv_usec;
    *cpu = total - before;
    before = total;
    if (!WIFEXITED(status) || WEXITSTATUS(status)) {
        fprintf(stderr, "mesanet bench sweep: synth failed (status %d); its output, %s:\n", status, log);
        FILE *f = fopen(log, "r");
        char line[1024];
        while (f && fgets(line, sizeof line, f)) fputs(line, stderr);
        if (f) fclose(f);
        exit(1);
    }
    return wall;
}

// Steps of every run in dir/results.csv.
static long long steps_in(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/results.csv", dir);
    Rows rows = {0};
    load_rows(path, &rows);
    long long n = 0;
    for (int i = 0; i < rows.n; i++) n += rows.v[i].steps;
    free(rows.v);
    return n;
}

typedef struct {
    const char *name;  // in the table: alone, processes, parallel, grid
    int runs;          // runs in the sweep
    int jobs, parallel, seeds, grid;
} Way;

// One sweep of a mixer: the wall time, *nsteps its runs' steps (steps: per run).
static const char *backend = "cuda";
static int quick;

static double sweep(const char *task, const char *mixer, const Way *w, int steps, const char *dir, long long *nsteps,
                    double *cpu) {
    char out[4096], log[4200], st[32], jobs[32], par[32], seeds[32], grid[32];
    snprintf(out, sizeof out, "%s/%s-%s%d-%d", dir, mixer, w->name, w->runs, steps);
    if (mn_mkdirs(out)) cmd_fail(CMD, "%s: %s", out, mn_last_error());
    snprintf(log, sizeof log, "%s/log.txt", out);
    char path[4300];
    snprintf(path, sizeof path, "%s/results.csv", out);
    remove(path);  // a fresh sweep, never a resumed one
    snprintf(st, sizeof st, "%d", steps);
    snprintf(jobs, sizeof jobs, "%d", w->jobs);
    snprintf(par, sizeof par, "%d", w->parallel);
    snprintf(seeds, sizeof seeds, "%d", w->seeds);
    snprintf(grid, sizeof grid, "%d", w->grid > 1 ? w->grid : 1);
    char *args[32] = {"mesanet", "synth", (char *)task, "--mixers", (char *)mixer, "--backend", (char *)backend,
                      "--max-steps", st, "--out", out, "--jobs", jobs, "--parallel", par, "--seeds", seeds, "--grid", grid};
    char runs[32];
    snprintf(runs, sizeof runs, "%d", w->runs);
    int n = 19;
    if (quick) args[n++] = "--quick";
    args[n++] = "--stop-after", args[n++] = runs;
    args[n] = NULL;
    double wall = run_synth(args, log, cpu);
    *nsteps = steps_in(out);
    if (*nsteps <= 0) cmd_fail(CMD, "%s: no steps recorded in %s/results.csv", mixer, out);
    return wall;
}

int bench_sweep(int argc, char **argv) {
    const char *mixers_arg = "mesa,gdn,deltanet,gla,mamba2,mha,swa,hawk,mlstm,longhorn", *task = "mad-fuzzy-recall";
    const char *out = "runs/bench-sweep", *ways_arg = "1,6,36", *grids_arg = "6,36";
    int steps = 300, processes = 6;
    Option opts[] = {
        {"mixers", OPT_STRING, &mixers_arg, "comma list of mixers (as synth --mixers takes them)"},
        {"task", OPT_STRING, &task, "the synthetic task whose baseline setting and protocol the runs train"},
        {"steps", OPT_INT, &steps, "steps a run (alone: also twice this, for the marginal step time)", 10, 1000000},
        {"parallel", OPT_STRING, &ways_arg, "comma list of runs at once in one process (1: alone)"},
        {"grids", OPT_STRING, &grids_arg, "comma list of runs trained as one model of runs (--grid; \"\": none)"},
        {"processes", OPT_INT, &processes, "runs as processes at once (0: none)", 0, 64},
        {"out", OPT_STRING, &out, "directory of the sweeps' folders, sweep.csv and sweep.svg"},
        {"backend", OPT_STRING, &backend, "cuda (or cpu, to try the benchmark itself)"},
        {"quick", OPT_FLAG, &quick, "synth --quick: tiny settings and model (to try the benchmark itself)"},
    };
    if (parse_args(argc, argv, "[options]", opts, sizeof opts / sizeof opts[0], NULL, NULL, 0)) return 1;
    int counts[MAX_WAYS - 2];
    int ncounts = bench_parse_ints(ways_arg, counts, MAX_WAYS - 2);
    if (ncounts < 1) cmd_fail(CMD, "--parallel '%s': expected a comma list of positive integers", ways_arg);
    const SynthTask *t = synth_find_any(task);
    if (!t) cmd_fail(CMD, "--task '%s': %s", task, mn_last_error());
    SynthProtocol prot;
    synth_protocol(t, quick, &prot);
    Way ways[MAX_WAYS];
    int nways = 0;
    for (int i = 0; i < ncounts; i++) {
        int seeds = (counts[i] + prot.nlr - 1) / prot.nlr;
        if (counts[i] > SYNTH_MAX_PARALLEL) cmd_fail(CMD, "--parallel: %d runs, at most %d", counts[i], SYNTH_MAX_PARALLEL);
        ways[nways++] = (Way){counts[i] == 1 ? "alone" : "parallel", counts[i], 1, counts[i], seeds};
    }
    int grids[MAX_WAYS - 2], ngrids = *grids_arg ? bench_parse_ints(grids_arg, grids, MAX_WAYS - 2) : 0;
    if (ngrids < 0 || ngrids + ncounts > MAX_WAYS - 1)
        cmd_fail(CMD, "--grids '%s': expected a comma list of at most %d positive integers", grids_arg, MAX_WAYS - 1 - ncounts);
    for (int i = 0; i < ngrids; i++) {
        if (grids[i] > SYNTH_MAX_PARALLEL) cmd_fail(CMD, "--grids: %d runs, at most %d", grids[i], SYNTH_MAX_PARALLEL);
        ways[nways++] = (Way){"grid", grids[i], 1, 1, (grids[i] + prot.nlr - 1) / prot.nlr, grids[i]};
    }
    if (processes) ways[nways++] = (Way){"processes", processes, processes, 1, (processes + prot.nlr - 1) / prot.nlr};
    char list[1024], *mixers[MAX_MIXERS];
    if (strlen(mixers_arg) >= sizeof list) cmd_fail(CMD, "--mixers: too long");
    snprintf(list, sizeof list, "%s", mixers_arg);
    int nmix = 0;
    for (char *p = strtok(list, ","); p; p = strtok(NULL, ","))
        if (nmix < MAX_MIXERS) mixers[nmix++] = p;
        else cmd_fail(CMD, "--mixers: at most %d", MAX_MIXERS);
    if (mn_mkdirs(out)) cmd_fail(CMD, "--out %s: %s", out, mn_last_error());

    printf("bench sweep: %s, %d steps a run, the task's %s setting and model, %s backend; wall times of whole sweeps\n",
           task, steps, quick ? "--quick" : "baseline", backend);
    printf("%-10s %-10s %5s %9s %9s %10s %9s %6s\n", "mixer", "way", "runs", "steps", "wall s", "steps/s", "ms/step",
           "cores");
    char csv[4096];
    snprintf(csv, sizeof csv, "%s/sweep.csv", out);
    FILE *f = fopen(csv, "w");
    if (!f) cmd_fail(CMD, "%s: cannot write", csv);
    fprintf(f, "mixer,way,runs,steps,wall_seconds,steps_per_second,ms_per_step,cpu_cores_busy\n");
    static double rate[MAX_WAYS][MAX_MIXERS], xs[MAX_MIXERS];
    for (int k = 0; k < nmix; k++) {
        xs[k] = k;
        for (int w = 0; w < nways; w++) {
            long long n;
            double cpu, wall = sweep(task, mixers[k], &ways[w], steps, out, &n, &cpu), ms = NAN;
            if (ways[w].runs == 1) {  // the marginal step: twice the steps, the difference
                long long n2;
                double cpu2, wall2 = sweep(task, mixers[k], &ways[w], 2 * steps, out, &n2, &cpu2);
                if (n2 > n) ms = 1e3 * (wall2 - wall) / (double)(n2 - n);
            }
            rate[w][k] = (double)n / wall;
            char mst[32] = "-";
            if (!isnan(ms)) snprintf(mst, sizeof mst, "%.3f", ms);
            printf("%-10s %-10s %5d %9lld %9.2f %10.1f %9s %6.1f\n", mixers[k], ways[w].name, ways[w].runs, n, wall,
                   rate[w][k], mst, cpu / wall);
            fprintf(f, "%s,%s,%d,%lld,%.4f,%.2f,%s,%.2f\n", mixers[k], ways[w].name, ways[w].runs, n, wall, rate[w][k],
                    isnan(ms) ? "" : mst, cpu / wall);
            fflush(stdout), fflush(f);
        }
    }
    if (fclose(f)) cmd_fail(CMD, "%s: write failed", csv);
    // aggregate: per way, the mean over the mixers; the parallel ways against the processes'
    printf("\nmean steps/s over the mixers:");
    double mean[MAX_WAYS];
    for (int w = 0; w < nways; w++) {
        mean[w] = 0;
        for (int k = 0; k < nmix; k++) mean[w] += rate[w][k] / nmix;
        printf(" %s %d: %.1f%s", ways[w].name, ways[w].runs, mean[w], w + 1 < nways ? ";" : "\n");
    }
    if (processes)
        for (int w = 0; w < nways - 1; w++)
            printf("%s %d / processes %d: %.2fx\n", ways[w].name, ways[w].runs, processes, mean[w] / mean[nways - 1]);
    PlotSeries series[MAX_WAYS];
    char names[MAX_WAYS][48];
    for (int w = 0; w < nways; w++) {
        snprintf(names[w], sizeof names[w], "%s, %d run%s", ways[w].name, ways[w].runs, plural_s(ways[w].runs));
        series[w] = (PlotSeries){.name = names[w], .x = xs, .y = rate[w], .n = nmix, .markers = 1};
    }
    char svg[4096], title[160];
    snprintf(svg, sizeof svg, "%s/sweep.svg", out);
    snprintf(title, sizeof title, "%s, %d steps a run: steps per second over all runs", task, steps);
    PlotOpts po = {.title = title, .xlabel = "mixer", .ylabel = "steps/s (all runs)", .log_y = 1,
                   .xcats = (const char *const *)mixers, .ncats = nmix, .dodge = 1};
    if (plot_svg(svg, &po, series, nways)) fprintf(stderr, "mesanet bench sweep: %s: %s\n", svg, mn_last_error());
    printf("table: %s; plot: %s\n", csv, svg);
    return 0;
}
