/*
 * mesanet synth: train and score models on the synthetic tasks (src/synth/synth.h) by each
 * task's protocol (src/synth/run.h): every mixer x grid setting x (lr, wd) of the protocol's grid,
 * best over the grid per setting; a table beside the published numbers, DIR/results.csv,
 * DIR/results.json and an SVG per task. Every finished run is recorded at once, so a sweep that
 * stops resumes where it was (runs already in results.csv are skipped). --jobs N runs up to N runs at
 * once, each a child process of the tool (its share of the cores) that ends with it; the parent alone
 * writes results.csv, and one sweep at a time writes a folder (DIR/.synth.lock).
 */
#include <ctype.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/registry.h"
#include "core/common.h"
#include "core/plot.h"
#include "synth/parallel.h"
#include "synth/run.h"
#include "tools/commands.h"
#include "tools/synth_jobs.h"
#include "tools/synth_results.h"

#define CMD "synth"

// Splits a comma list in place into names (at most max), as the config splits a mixer pattern:
// an empty name (a leading, trailing or doubled comma) and more than max names are refused,
// naming the option (what) and the list.
static int split_names(const char *what, const char *list, char *s, char **items, int max) {
    int n = 0;
    for (char *p = s;; n++) {
        char *comma = strchr(p, ',');
        if (comma) *comma = 0;
        if (!*p) cmd_fail(CMD, "%s '%s': name %d of the list is empty (a comma too many?)", what, list, n + 1);
        if (n == max) {
            int total = n + 1;
            for (; comma; comma = strchr(comma + 1, ',')) total++;
            cmd_fail(CMD, "%s '%s': %d names, at most %d", what, list, total, max);
        }
        items[n] = p;
        if (!comma) return n + 1;
        p = comma + 1;
    }
}

// A metric x 100 with one decimal, or "-" where no run is recorded yet (NaN). buf: 32 bytes.
static const char *pct(char *buf, double v) {
    if (isnan(v)) snprintf(buf, 32, "-");
    else snprintf(buf, 32, "%.1f", 100 * v);
    return buf;
}

static void fmt_time(char *buf, size_t cap, double s) {
    if (!isfinite(s) || s < 0) snprintf(buf, cap, "?");
    else if (s < 60) snprintf(buf, cap, "%.0fs", s);
    else if (s < 3600) snprintf(buf, cap, "%dm%02ds", (int)s / 60, (int)s % 60);
    else snprintf(buf, cap, "%dh%02dm", (int)s / 3600, ((int)s % 3600) / 60);
}

enum { MAX_TASKS = 16, MAX_MIXERS = 16, MAX_SETTINGS = 32 };

// The progress line of a finished run; eta: seconds left (NAN: none to show).
static void print_done(const Row *r, int index, int total, double eta) {
    char took[32], eta_text[48] = "", tvd_text[32] = "";
    fmt_time(took, sizeof took, r->seconds);
    if (!isnan(eta)) {
        char t[32];
        fmt_time(t, sizeof t, eta);
        snprintf(eta_text, sizeof eta_text, " | ETA %s", t);
    }
    if (isfinite(r->tvd)) snprintf(tvd_text, sizeof tvd_text, ", tvd %.4f", r->tvd);
    printf("[%d/%d] %s %s %s lr %g wd %g: metric %.4f%s, %d step%s%s, %s%s\n", index, total, r->task, r->setting,
           r->mixer, r->lr, r->wd, r->metric, tvd_text, r->steps, plural_s(r->steps), r->early ? " (stopped early)" : "",
           took, eta_text);
    fflush(stdout);
}

// ", seed N" where a sweep runs several seeds (--seeds), else nothing.
static const char *seed_text(const Row *r, int seeds) {
    static _Thread_local char buf[48];
    if (seeds > 1) snprintf(buf, sizeof buf, ", seed %lld", r->seed);
    else buf[0] = 0;
    return buf;
}

// A run of the sweep as results.csv records it, its number in the sweep (1-based) and the folder
// of its saved state while it is part-way.
typedef struct {
    Row row;
    int index;
    char state[1024];
} PlanRow;

// DIR/.state/ and a name of the run: its fields made safe for a file name (at most 160 characters),
// then a hash of them all (FNV-1a), so that two runs never share a folder.
static void state_dir_of(const char *out, const Row *r, char *buf, size_t cap) {
    char key[512], name[161];
    snprintf(key, sizeof key, "%s|%s|%s|%s|%.9g|%.9g|%lld", r->task, r->setting, r->mixer, r->protocol, r->lr, r->wd,
             r->seed);
    uint64_t h = 1469598103934665603ull;
    size_t n = 0;
    for (const char *c = key; *c; c++) {
        h = (h ^ (unsigned char)*c) * 1099511628211ull;
        if (n < sizeof name - 1) name[n++] = (isalnum((unsigned char)*c) || *c == '.') ? *c : '-';
    }
    name[n] = 0;
    snprintf(buf, cap, "%s/.state/%s-%016llx", out, name, (unsigned long long)h);
}

// --grid: consecutive runs of one task, setting and mixer (the plan's order: their lr, wd and seeds
// follow each other) in grids of at most `most` (SynthJob.grid set on each grid's first run).
static void set_grids(SynthJob *todo, int n, int most) {
    for (int i = 0; i < n;) {
        const Row *a = &((const PlanRow *)todo[i].user)->row;
        int g = 1;
        while (i + g < n && g < most) {
            const Row *b = &((const PlanRow *)todo[i + g].user)->row;
            if (strcmp(a->task, b->task) || strcmp(a->setting, b->setting) || strcmp(a->mixer, b->mixer)) break;
            g++;
        }
        todo[i].grid = g;
        i += g;
    }
}

// --parallel's progress and records, on the tool's own thread as runs start and end.
typedef struct {
    Rows *rows;
    const char *out;
    int total, todo, seeds, gpus;
    int ended, failed, cut, not_started;
    double t0;
    char first_error[MN_ERROR_MAX + 160];
} ParSweep;

// Records a run that ended: its row from the result into rows and DIR/results.csv, and its progress
// line (eta: seconds left, NAN: none to show).
static void record_run(Rows *rows, const char *out, Row *r, const SynthRunResult *res, int index, int total, double eta) {
    if (res->resumed_at) printf("[%d/%d] went on from step %d (saved before)\n", index, total, res->resumed_at);
    r->steps = res->steps, r->epochs = res->epochs, r->early = res->stopped_early;
    r->seconds = res->seconds, r->metric = res->metric, r->tvd = res->tvd;
    rows_add(rows, r);
    save_rows(out, rows);
    print_done(r, index, total, eta);
}

// Waits for one of the --jobs runs to end and records its row (its number in *index).
static Row collect_job(Job *job, int *njob, int *free_gpu, Rows *rows, const char *out, int *index) {
    Row got;
    if (job_wait(job, njob, &got, index, free_gpu)) cmd_fail(CMD, "%s", mn_last_error());
    rows_add(rows, &got);
    save_rows(out, rows);
    return got;
}

// The progress line of a run stopped part-way, its state saved.
static void print_cut(const Row *r, const PlanRow *p, int total, const SynthRunResult *res) {
    printf("[%d/%d] %s %s %s lr %g wd %g: stopped at step %d, saved in %s: run again to go on\n", p->index, total,
           r->task, r->setting, r->mixer, r->lr, r->wd, res->steps, p->state);
    fflush(stdout);
}

static void par_started(SynthJob *j, int running, void *arg) {
    ParSweep *ps = arg;
    const PlanRow *p = j->user;
    const Row *r = &p->row;
    char dev[32] = "";
    if (ps->gpus > 1) snprintf(dev, sizeof dev, ", GPU %d", j->device);
    printf("[%d/%d] %s %s %s lr %g wd %g%s: training (%d at once%s) ...\n", p->index, ps->total, r->task, r->setting,
           r->mixer, r->lr, r->wd, seed_text(r, ps->seeds), running, dev);
    fflush(stdout);
}

static void par_ended(SynthJob *j, void *arg) {
    ParSweep *ps = arg;
    PlanRow *p = j->user;
    Row *r = &p->row;
    ps->ended++;
    if (j->status) {
        if (!ps->failed++)
            snprintf(ps->first_error, sizeof ps->first_error, "%s %s %s lr %g wd %g: %s", r->task, r->setting, r->mixer,
                     r->lr, r->wd, j->error);
        fprintf(stderr, "mesanet synth: [%d/%d] %s %s %s lr %g wd %g: %s\n", p->index, ps->total, r->task, r->setting,
                r->mixer, r->lr, r->wd, j->error);
        fflush(stderr);
        return;
    }
    if (j->not_started) {
        ps->not_started++;
        return;
    }
    const SynthRunResult *res = &j->result;
    if (res->cut_short) {
        ps->cut++;
        print_cut(r, p, ps->total, res);
        return;
    }
    // the wall time so far over the runs ended, for those left (the threads share it)
    double eta = (mn_now() - ps->t0) / ps->ended * (ps->todo - ps->ended);
    record_run(ps->rows, ps->out, r, res, p->index, ps->total, ps->ended < ps->todo ? eta : NAN);
}

// The best metric over the lr grid, averaged over the seeds that have one (NAN: none yet); *tvd
// likewise over the seeds with a TVD.
static double best_mean(const Rows *rows, const char *task, const char *setting, const char *mixer, const char *proto,
                        long long seed, int seeds, double *tvd) {
    double sum = 0, tsum = 0;
    int n = 0, tn = 0;
    for (int e = 0; e < seeds; e++) {
        double tv, b = best_of(rows, task, setting, mixer, proto, seed + e, &tv);
        if (!isnan(b)) sum += b, n++;
        if (isfinite(tv)) tsum += tv, tn++;
    }
    *tvd = tn ? tsum / tn : NAN;
    return n ? sum / n : NAN;
}

// How many runs of the (lr, wd) grid of (task, setting, mixer) the rows hold, over the seeds.
static int grid_recorded(const Rows *rows, const char *task, const char *setting, const char *mixer, const char *proto,
                         long long seed, int seeds) {
    int n = 0;
    for (int i = 0; i < rows->n; i++) {
        const Row *r = &rows->v[i];
        n += !strcmp(r->task, task) && !strcmp(r->setting, setting) && !strcmp(r->mixer, mixer) &&
             !strcmp(r->protocol, proto) && r->seed >= seed && r->seed < seed + seeds;
    }
    return n;
}

// pct, with "*" after a value that comes from part of the grid only (the protocol cut short).
static const char *pct_mark(char *buf, double v, int partial) {
    pct(buf, v);
    if (partial && !isnan(v)) strcat(buf, "*");
    return buf;
}

// The tasks and the groups, one a line: for --help and for a missing task.
static void print_tasks(FILE *f) {
    for (int i = 0; i < synth_task_count(); i++) fprintf(f, "  %-20s %s\n", synth_task(i)->name, synth_task(i)->summary);
    fprintf(f, "  %-20s %s\n", synth_task_regbench.name, synth_task_regbench.summary);
    for (int i = 0; i < synth_group_count(); i++) fprintf(f, "  %-20s %s\n", synth_groups[i].name, synth_groups[i].summary);
}

int cmd_synth(int argc, char **argv) {
    const char *mixers_arg = NULL, *settings = "baseline", *backend = "cpu", *out = "runs/synth";
    int quick = 0, report = 0, seed = 0, stop_after = 0, dim = 0, epochs = 0, max_steps = 0, batch = 0, jobs = 1, run_index = 0;
    int gpus = 0, parallel = 1, seeds = 1, stop_at = 0, grid = 1;
    float time_limit = 0;
    double t_start = mn_now();
    Option opts[] = {
        {"mixers", OPT_STRING, &mixers_arg, "comma list of mixers (mesa, gdn, mha, gla, mamba2, deltanet, gdn-paper, "
                                            "swa, ...) and patterns of blocks joined with + (gdn+swa: gdn, then swa; "
                                            "tables and results.csv name it as the config does, gdn,swa); NAME:neg "
                                            "adds the delta rules' negative eigenvalues (beta in (0, 2); e.g. gdn:neg)"},
        {"settings", OPT_STRING, &settings, "baseline (each task's baseline setting) or full (its whole grid)"},
        {"quick", OPT_FLAG, &quick, "tiny settings and model, one learning rate, 40 steps: seconds on a CPU"},
        {"report", OPT_FLAG, &report, "train nothing: the tables and plots of the runs results.csv holds so far"},
        {"backend", OPT_STRING, &backend, "cpu or cuda"},
        {"out", OPT_STRING, &out, "directory of results.csv, results.json and the plots"},
        {"seed", OPT_INT, &seed, "seed of the data and the models", 0, 1000000000},
        {"stop-after", OPT_INT, &stop_after, "stop after this many new runs (0: all; the rest on the next call)", 0,
         1000000000},
        {"dim", OPT_INT, &dim, "model width (0: the protocol's)", 0, 65536},
        {"epochs", OPT_INT, &epochs, "epochs at most (0: the protocol's)", 0, 1000000},
        {"max-steps", OPT_INT, &max_steps, "steps at most per run (0: the protocol's)", 0, 1000000000},
        {"batch", OPT_INT, &batch, "training sequences per step (0: the protocol's)", 0, 65536},
        {"jobs", OPT_INT, &jobs, "runs at once, each a process with its share of the cores (OMP_NUM_THREADS)", 1,
         MAX_JOBS},
        {"parallel", OPT_INT, &parallel, "runs at once in this process, each on its own thread (cuda: its own stream, "
                                         "so that the runs' kernels run side by side)", 1, SYNTH_MAX_PARALLEL},
        {"grid", OPT_INT, &grid, "runs of one task, setting and mixer (their learning rates, decays, seeds) trained "
                                 "together as one model of that many runs at most, each as it trains alone (1: each "
                                 "alone; with --parallel, a grid a thread)", 1, SYNTH_MAX_PARALLEL},
        {"gpus", OPT_INT, &gpus, "GPUs the --jobs or --parallel runs share out (cuda; 0: all on the first device the "
                                 "tool sees)", 0, SYNTH_MAX_PARALLEL},
        {"seeds", OPT_INT, &seeds, "seeds per setting (seed, seed+1, ...): tables average the best run of each", 1, 1000},
        {"time-limit", OPT_FLOAT, &time_limit, "minutes: then each run in progress saves its state and stops, and no "
                                               "other starts (run again to go on; not with --jobs)", 0, 1e7},
        {"stop-at", OPT_INT, &stop_at, "each run saves its state and stops after this many steps (run again to go on; "
                                       "not with --jobs)", 0, 1000000000},
        {"run-index", OPT_INT, &run_index, "internal (--jobs): run only the sweep's run of this number", 0,
         1000000000},
    };
    char *pos[1];
    int npos = 0;
    int st = parse_args(argc, argv, "TASK[,TASK...] --mixers M1,M2,... [options]", opts, sizeof opts / sizeof opts[0],
                        pos, &npos, 1);
    if (st == 2) {  // --help: the options, then what TASK may be
        printf("\ntasks (TASK: one of them, a group, or a comma list of both):\n");
        print_tasks(stdout);
        return 0;
    }
    if (st) return 1;
    if (npos < 1) {
        fprintf(stderr, "mesanet synth: a task is required; the tasks:\n");
        print_tasks(stderr);
        return 1;
    }
    if (!mixers_arg || !*mixers_arg) cmd_fail(CMD, "--mixers is required (e.g. --mixers mesa,gdn,mha)");
    if (strcmp(settings, "baseline") && strcmp(settings, "full"))
        cmd_fail(CMD, "--settings must be baseline or full, got '%s'", settings);
    if (jobs > 1 && parallel > 1) cmd_fail(CMD, "--jobs and --parallel: one or the other (processes or threads)");
    if (jobs > 1 && grid > 1) cmd_fail(CMD, "--jobs and --grid: a grid trains in this process (use --parallel)");
    int pooled = parallel > 1 || grid > 1;  // the runs go to synth_run_parallel
    if (jobs > 1 && (time_limit > 0 || stop_at > 0))
        cmd_fail(CMD, "--time-limit and --stop-at stop runs part-way in this process: with --parallel or one run at a "
                      "time, not --jobs");
    // Runs side by side each have their own streams: CUDA gives a process 8 hardware queues unless
    // told more, and streams beyond them wait on each other's work. (Read when CUDA starts: before
    // any CUDA call.)
    if (parallel > 1) setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
    if (!run_index) check_gpus(gpus, jobs > 1 ? jobs : parallel, backend);  // (a job sees its one GPU, and --jobs 1)
    const Backend *be = backend_by_name(backend);
    if (!be) cmd_fail(CMD, "--backend: %s", mn_last_error());

    // Tasks: names and groups (synth_groups); a task named twice (mad,mad-recall) runs once.
    const SynthTask *tasks[MAX_TASKS];
    int ntasks = 0;
    char task_list[512], *titems[MAX_TASKS];
    if (strlen(pos[0]) >= sizeof task_list) cmd_fail(CMD, "the task list is longer than %zu characters", sizeof task_list - 1);
    snprintf(task_list, sizeof task_list, "%s", pos[0]);
    int nt = split_names("the task list", pos[0], task_list, titems, MAX_TASKS);
    for (int i = 0; i < nt; i++) {
        const SynthTask *got[MAX_TASKS + 1];
        int n = synth_expand(titems[i], got, MAX_TASKS + 1);
        if (n < 0) cmd_fail(CMD, "unknown task '%s': %s", titems[i], mn_last_error());
        for (int k = 0; k < n && k <= MAX_TASKS; k++) {
            int dup = 0;
            for (int j = 0; j < ntasks; j++) dup |= tasks[j] == got[k];
            if (dup) continue;
            if (ntasks == MAX_TASKS) cmd_fail(CMD, "'%s' names more than %d tasks", pos[0], MAX_TASKS);
            if (synth_task_supported(got[k])) cmd_fail(CMD, "%s", mn_last_error());
            tasks[ntasks++] = got[k];
        }
    }

    // Mixers: a pattern of blocks is written with '+' (the list's own separator is ','), then
    // named as the config writes it (gdn+swa -> "gdn,swa") in the tables and results.
    char mixer_list[1024], *mitems[MAX_MIXERS];
    if (strlen(mixers_arg) >= sizeof mixer_list) cmd_fail(CMD, "--mixers: longer than %zu characters", sizeof mixer_list - 1);
    snprintf(mixer_list, sizeof mixer_list, "%s", mixers_arg);
    int nmix = split_names("--mixers", mixers_arg, mixer_list, mitems, MAX_MIXERS);
    char mixers[MAX_MIXERS][64];
    for (int i = 0; i < nmix; i++) {
        if (strlen(mitems[i]) >= sizeof mixers[i])
            cmd_fail(CMD, "--mixers: '%.40s...' is longer than %zu characters", mitems[i], sizeof mixers[i] - 1);
        snprintf(mixers[i], sizeof mixers[i], "%s", mitems[i]);
        for (char *c = mixers[i]; *c; c++)
            if (*c == '+') *c = ',';
        for (int j = 0; j < i; j++)
            if (!strcmp(mixers[i], mixers[j])) cmd_fail(CMD, "--mixers names '%s' twice", mitems[i]);
    }

    // Protocols, and every mixer checked against every task before anything runs.
    SynthProtocol prot[MAX_TASKS];
    int total = 0, ngrid[MAX_TASKS];
    for (int i = 0; i < ntasks; i++) {
        synth_protocol(tasks[i], quick, &prot[i]);
        if (dim) prot[i].dim = dim, prot[i].n_heads = dim >= 64 ? dim / 32 : 2, prot[i].head_dim = dim / prot[i].n_heads;
        if (epochs) prot[i].epochs = epochs;
        if (max_steps) prot[i].max_steps = max_steps;
        if (batch) prot[i].batch = batch;
        ngrid[i] = strcmp(settings, "full") ? 1 : synth_grid_count(tasks[i]);
        if (ngrid[i] > MAX_SETTINGS) ngrid[i] = MAX_SETTINGS;
        SynthSettings s;
        synth_grid(tasks[i], 0, &s, NULL, 0);
        if (quick) synth_quick_settings(tasks[i], &s);
        for (int k = 0; k < nmix; k++) {
            ModelConfig c;
            if (synth_model_config(tasks[i], &s, &prot[i], mixers[k], &c))
                cmd_fail(CMD, "unknown or unusable mixer '%s' (--mixers): %s", mixers[k], mn_last_error());
        }
        total += ngrid[i] * nmix * prot[i].nlr * seeds;
    }
    // --report only reads: it makes no folder and takes no lock. A sweep locks its folder, so that
    // no other sweep writes there, and removes what a stopped one left (see lock_out).
    if (!report) {
        if (mn_mkdirs(out)) cmd_fail(CMD, "--out %s: %s", out, mn_last_error());
        if (!run_index) {
            lock_out(out);
            remove_stale_jobs(out);
        }
    }
    char csv_path[4096];
    snprintf(csv_path, sizeof csv_path, "%s/results.csv", out);
    Rows rows = {0};
    load_rows(csv_path, &rows);
    // The protocol's name, with what the options changed: runs are the same only under the same one.
    char proto[64];
    snprintf(proto, sizeof proto, "%s", quick ? "quick" : "full");
    const struct {
        const char *key;
        int v;
    } over[4] = {{"dim", dim}, {"epochs", epochs}, {"steps", max_steps}, {"batch", batch}};
    for (int i = 0; i < 4; i++)
        if (over[i].v) {
            size_t n = strlen(proto);
            snprintf(proto + n, sizeof proto - n, "+%s%d", over[i].key, over[i].v);
        }
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int at_once = jobs > parallel ? jobs : parallel;
    int threads = ncpu > at_once ? (int)(ncpu / at_once) : 1;
    char what[4200];  // a report trains nothing: the backend is not the one the runs were trained on
    if (report) snprintf(what, sizeof what, "the report of the runs recorded in %s", out);
    else snprintf(what, sizeof what, "%s backend; results in %s", be->name, out);
    printf("synth: %d task%s x %d mixer%s, %s settings, %d run%s; %s\n", ntasks, plural_s(ntasks), nmix, plural_s(nmix),
           settings, total, plural_s(total), what);
    if (jobs > 1 && gpus)
        printf("synth: up to %d runs at once over %d GPU%s, %d thread%s each\n", jobs, gpus, plural_s(gpus), threads,
               plural_s(threads));
    else if (jobs > 1) printf("synth: up to %d runs at once, %d thread%s each\n", jobs, threads, plural_s(threads));
    else if (parallel > 1 && gpus > 1)
        printf("synth: up to %d runs at once in this process over %d GPUs, %d thread%s each\n", parallel, gpus, threads,
               plural_s(threads));
    else if (parallel > 1)
        printf("synth: up to %d runs at once in this process, %d thread%s each\n", parallel, threads, plural_s(threads));
    for (int i = 0; i < ntasks; i++)
        printf("synth: %s: %s; width %d, %d block%s, batch %d\n", tasks[i]->name, prot[i].source, prot[i].dim,
               prot[i].n_layers, plural_s(prot[i].n_layers), prot[i].batch);
    if (grid > 1)
        printf("synth: the runs of a task, setting and mixer train in grids of up to %d, each grid one model of runs\n",
               grid);
    if (quick) printf("synth: --quick shrinks every setting (labels name the grid's settings, not the sizes run)\n");
    fflush(stdout);
    if (jobs > 1 && !run_index && !report) jobs_catch_signals();

    // The sweep's runs in order (task, setting, mixer, the (lr, wd) grid, seed), numbered from 1:
    // each a job (what synth_run takes) and its row (what results.csv records); job.user: the row.
    SynthJob *plan = xcalloc((size_t)total, sizeof *plan), *todo = NULL;
    PlanRow *prow = xcalloc((size_t)total, sizeof *prow);
    int nplan = 0, ntodo = 0;
    for (int i = 0; i < ntasks; i++)
        for (int g = 0; g < ngrid[i]; g++) {
            SynthSettings s;
            char label[96];
            if (synth_grid(tasks[i], g, &s, label, sizeof label)) cmd_fail(CMD, "%s", mn_last_error());
            if (quick) synth_quick_settings(tasks[i], &s);
            for (int k = 0; k < nmix; k++)
                for (int l = 0; l < prot[i].nlr; l++)
                    for (int e = 0; e < seeds; e++) {
                        SynthJob *q = &plan[nplan];
                        q->task = tasks[i], q->settings = s, q->protocol = &prot[i], q->mixer = mixers[k];
                        q->lr = prot[i].lrs[l], q->wd = prot[i].wds[l], q->seed = (uint64_t)seed + (uint64_t)e;
                        q->user = &prow[nplan];
                        prow[nplan].index = nplan + 1;
                        Row *r = &prow[nplan].row;
                        r->tvd = NAN;
                        snprintf(r->task, sizeof r->task, "%s", tasks[i]->name);
                        snprintf(r->setting, sizeof r->setting, "%s", label);
                        snprintf(r->mixer, sizeof r->mixer, "%s", mixers[k]);
                        snprintf(r->protocol, sizeof r->protocol, "%s", proto);
                        r->seed = seed + e, r->lr = q->lr, r->wd = q->wd;
                        state_dir_of(out, r, prow[nplan].state, sizeof prow[nplan].state);
                        q->resume = (SynthResume){.state_dir = prow[nplan].state, .stop_at = stop_at,
                                                  .deadline = time_limit > 0 ? t_start + 60.0 * time_limit : 0,
                                                  .save_every = 60};
                        nplan++;
                    }
        }
    if (pooled) todo = xcalloc((size_t)total, sizeof *todo);

    int done = 0, ran = 0, skipped = 0, finished = 0, njob = 0, missing = 0, free_gpu = -1, cut = 0, unstarted = 0;
    double spent = 0;
    Job job[MAX_JOBS];
    for (int q = 0; q < nplan && (!stop_after || ran < stop_after); q++) {
        Row r = prow[q].row;
        done = prow[q].index;
        int have = 0;
        for (int j = 0; j < rows.n && !have; j++) have = same_run(&rows.v[j], &r);
        if (have) {
            skipped++;
            if (!report)
                printf("[%d/%d] %s %s %s lr %g wd %g%s: already in results.csv, skipped\n", done, total, r.task,
                       r.setting, r.mixer, r.lr, r.wd, seed_text(&r, seeds));
            fflush(stdout);
            continue;
        }
        if (run_index && done != run_index) continue;
        if (report) {  // not run yet: its cells stay empty
            missing++;
            continue;
        }
        if (time_limit > 0 && !report && mn_now() >= t_start + 60.0 * time_limit && !pooled) {
            unstarted++;  // --time-limit: no run starts after it
            continue;
        }
        ran++;
        if (pooled) {  // trained below, all at once
            todo[ntodo++] = plan[q];
            continue;
        }
        if (jobs > 1) {
            while (njob >= jobs) {  // a slot: wait for a run to end, record it
                int gi;
                Row got = collect_job(job, &njob, &free_gpu, &rows, out, &gi);
                finished++, spent += got.seconds;
                print_done(&got, gi, total, spent / finished * (total - done + njob + 1) / jobs);
            }
            int gpu = !gpus ? -1 : free_gpu >= 0 ? free_gpu : njob % gpus;
            free_gpu = -1;
            job_start(&job[njob++], argc, argv, out, done, threads, gpu);
            printf("[%d/%d] %s %s %s lr %g wd %g%s: training (%d at once) ...\n", done, total, r.task, r.setting,
                   r.mixer, r.lr, r.wd, seed_text(&r, seeds), njob);
            fflush(stdout);
            continue;
        }
        printf("[%d/%d] %s %s %s lr %g wd %g%s: training ...\n", done, total, r.task, r.setting, r.mixer, r.lr, r.wd,
               seed_text(&r, seeds));
        fflush(stdout);
        SynthRunResult res;
        if (synth_run_resumable(plan[q].task, &plan[q].settings, plan[q].protocol, plan[q].mixer, plan[q].lr, plan[q].wd,
                                plan[q].seed, be, quick ? NULL : stdout, &plan[q].resume, &res))
            cmd_fail(CMD, "%s %s %s: %s", r.task, r.setting, r.mixer, mn_last_error());
        if (res.cut_short) {
            cut++;
            print_cut(&r, &prow[q], total, &res);
            continue;
        }
        spent += res.seconds;
        record_run(&rows, out, &r, &res, done, total, spent / ran * (total - done));
    }
    while (njob > 0) {  // the last runs of --jobs
        int gi;
        Row got = collect_job(job, &njob, &free_gpu, &rows, out, &gi);
        finished++, spent += got.seconds;
        print_done(&got, gi, total, NAN);
    }
    if (ntodo && grid > 1) set_grids(todo, ntodo, grid);
    if (ntodo) {  // --parallel, --grid: every run left at once, recorded as each ends
        ParSweep ps = {.rows = &rows, .out = out, .total = total, .todo = ntodo, .seeds = seeds, .gpus = gpus,
                       .t0 = mn_now()};
        SynthEvents ev = {par_started, par_ended, &ps};
        if (synth_run_parallel(todo, ntodo, parallel, backend, gpus, threads, &ev)) cmd_fail(CMD, "%s", mn_last_error());
        if (ps.failed)
            cmd_fail(CMD, "%d of %d run%s failed (the first: %s); the others are recorded in %s/results.csv", ps.failed,
                     ntodo, plural_s(ntodo), ps.first_error, out);
        cut += ps.cut, unstarted += ps.not_started, ran -= ps.not_started;
    }
    free(plan), free(todo), free(prow);
    if (cut || unstarted)
        printf("synth: %s: %d run%s stopped part-way (saved in %s/.state), %d not started; run again to go on\n",
               stop_at > 0 ? "--stop-at" : "--time-limit", cut, plural_s(cut), out, unstarted);
    if (run_index) {  // a --jobs child: its row is in its own results.csv
        free(rows.v);
        return 0;
    }
    if (stop_after && ran >= stop_after && done < total) {
        printf("synth: stopped after %d new run%s (--stop-after); %d of %d not run yet: run again to go on\n", ran,
               plural_s(ran), total - done, total);
        free(rows.v);
        return 0;
    }
    if (report && !rows.n && quick) {  // nothing to show: no run, and no published numbers under --quick
        printf("synth: no results yet in %s (run without --report to train)\n", out);
        free(rows.v);
        return 0;
    }
    if (report)
        printf("synth: --report: %d of %d run%s recorded, %d not run yet (their cells: -)\n", skipped, total,
               plural_s(total), missing);
    else if (skipped)
        printf("synth: %d run%s %s already recorded and skipped, %d run now\n", skipped, plural_s(skipped),
               skipped == 1 ? "was" : "were", ran);
    if (quick)
        printf("synth: --quick: the papers' numbers are left out; they come from full protocols, which 40-step runs "
               "of tiny models are not comparable to\n");

    // Tables: per task, rows mixers, columns the settings (best over the lr grid) and their mean.
    double task_mean[MAX_TASKS][MAX_MIXERS];
    int task_partial[MAX_TASKS][MAX_MIXERS] = {{0}}, any_partial = 0;  // a cell of it from part of its grid
    for (int i = 0; i < ntasks; i++) {
        const SynthTask *t = tasks[i];
        char labels[MAX_SETTINGS][96];
        const char *cats[MAX_SETTINGS];
        for (int g = 0; g < ngrid[i]; g++) {
            SynthSettings s;
            synth_grid(t, g, &s, labels[g], sizeof labels[g]);
            cats[g] = labels[g];
        }
        int has_pub = 0;
        double pv;
        for (int k = 0; k < nmix && !quick; k++) has_pub |= synth_published(t->name, mixers[k], &pv, NULL);
        int rb = t == &synth_task_regbench;
        char of_seeds[48] = "";
        if (seeds > 1) snprintf(of_seeds, sizeof of_seeds, ", the mean of %d seeds' best", seeds);
        printf("\n%s (%s x 100, best over %d lr setting%s%s%s)\n%-16s", t->name, synth_metric_name(t), prot[i].nlr,
               plural_s(prot[i].nlr), of_seeds, rb ? "; tvd: mean TVD of those best runs, 0..1, lower is better" : "",
               "mixer");
        for (int g = 0; g < ngrid[i]; g++) printf(" %14.14s", labels[g]);
        printf(" %8s%s%s\n", "mean", rb ? "      tvd" : "", has_pub ? "  published" : "");
        double ys[MAX_MIXERS][MAX_SETTINGS], tvds[MAX_MIXERS][MAX_SETTINGS], xs[MAX_SETTINGS];
        PlotSeries series[MAX_MIXERS], tvd_series[MAX_MIXERS];
        int any_point = 0, any_tvd = 0;
        double grid_x[16];
        const char *axis = synth_grid_axis(t, grid_x);
        int log_x = axis != NULL;
        for (int g = 0; g < ngrid[i]; g++) {
            xs[g] = axis ? grid_x[g] : g;
            log_x &= xs[g] > 0;
        }
        if (log_x && ngrid[i] > 1 && xs[ngrid[i] - 1] / xs[0] < 8) log_x = 0;  // a narrow range reads better linear
        for (int k = 0; k < nmix; k++) {
            printf("%-16s", mixers[k]);
            double sum = 0, tsum = 0;
            int n = 0, tn = 0;
            for (int g = 0; g < ngrid[i]; g++) {
                double tv;
                double b = best_mean(&rows, t->name, labels[g], mixers[k], proto, seed, seeds, &tv);
                int part = !isnan(b) && grid_recorded(&rows, t->name, labels[g], mixers[k], proto, seed, seeds) <
                                            prot[i].nlr * seeds;
                task_partial[i][k] |= part;
                if (isfinite(tv)) tsum += tv, tn++;
                ys[k][g] = b, tvds[k][g] = tv;
                char cell[32];
                printf(" %14s", pct_mark(cell, b, part));
                if (!isnan(b)) sum += b, n++;
            }
            task_mean[i][k] = n ? sum / n : NAN;
            any_partial |= task_partial[i][k];
            any_point |= n > 0, any_tvd |= tn > 0;
            char cell[32];
            printf(" %8s", pct_mark(cell, task_mean[i][k], task_partial[i][k]));
            if (rb && tn) printf(" %8.4f", tsum / tn);
            else if (rb) printf(" %8s", "-");
            const char *col;
            if (!quick && synth_published(t->name, mixers[k], &pv, &col)) printf("  %.1f (%s)", pv, col);
            printf("\n");
            series[k] = (PlotSeries){.name = mixers[k], .x = xs, .y = ys[k], .n = ngrid[i], .markers = 1};
            tvd_series[k] = (PlotSeries){.name = mixers[k], .x = xs, .y = tvds[k], .n = ngrid[i], .markers = 1};
        }
        if (has_pub && synth_published_source_of(t->name))
            printf("published: %s\n", synth_published_source_of(t->name));
        if (!any_point) continue;  // --report before any run of the task: no plot
        // The plot: the metric (a fraction, on its whole range 0..1) by setting, at the settings' values
        // where the grid varies one quantity (RegBench: the training automata; S-NIAH: the context
        // length); every mixer visible where they tie (dodge).
        char svg[4096], title[160], xlabel[160];
        snprintf(svg, sizeof svg, "%s/%s.svg", out, t->name);
        snprintf(title, sizeof title, "%s: best run over the lr grid%s", t->name, quick ? " (--quick)" : "");
        snprintf(xlabel, sizeof xlabel, "%s%s", axis ? axis : "setting",
                 quick ? " (the grid's values; --quick ran smaller ones)" : "");
        PlotOpts po = {.title = title, .xlabel = xlabel, .ylabel = synth_metric_name(t), .log_x = log_x,
                       .xcats = axis ? NULL : cats, .ncats = axis ? 0 : ngrid[i], .y_lo = 0, .y_hi = 1, .dodge = 1};
        int bad;
        if (rb && any_tvd) {  // RegBench's two metrics side by side
            PlotPanel panels[2] = {{po, series, nmix}, {po, tvd_series, nmix}};
            panels[0].opts.title = "validity of the greedy next symbol";
            panels[1].opts.title = "TVD to the automaton's next-symbol law";
            panels[1].opts.ylabel = "TVD (lower is better)";
            bad = plot_svg_panels(svg, title, panels, 2);
        } else
            bad = plot_svg(svg, &po, series, nmix);
        if (bad) fprintf(stderr, "mesanet synth: %s: %s\n", svg, mn_last_error());
        else printf("plot: %s\n", svg);
    }
    if (ntasks > 1) {
        printf("\nmeans over each task's settings (x 100)\n%-16s", "mixer");
        for (int i = 0; i < ntasks; i++) printf(" %12.12s", tasks[i]->name + (strncmp(tasks[i]->name, "mad-", 4) ? 0 : 4));
        printf(" %8s\n", "avg");
        for (int k = 0; k < nmix; k++) {
            printf("%-16s", mixers[k]);
            double sum = 0;
            char cell[32];
            int part = 0;
            for (int i = 0; i < ntasks; i++)
                printf(" %12s", pct_mark(cell, task_mean[i][k], task_partial[i][k])), sum += task_mean[i][k],
                    part |= task_partial[i][k];
            printf(" %8s\n", pct_mark(cell, sum / ntasks, part));
        }
    }
    // MAD as the MesaNet paper's Table 1 reports it: in-context and noisy recall merged in one
    // column, then fuzzy recall, memorize, selective copy and compress. Without a compression run
    // that column is left out and the average is over the four others, the published one too.
    static const char *const paper_cols[5][2] = {{"mad-recall", "mad-noisy-recall"},
                                                  {"mad-fuzzy-recall", NULL},
                                                  {"mad-memorization", NULL},
                                                  {"mad-selective-copy", NULL},
                                                  {"mad-compression", NULL}};
    int col_task[5][2], have_cols = 1, ncols = 5;
    for (int c = 0; c < 5; c++)
        for (int h = 0; h < 2; h++) {
            col_task[c][h] = -1;
            for (int i = 0; i < ntasks && paper_cols[c][h]; i++)
                if (!strcmp(tasks[i]->name, paper_cols[c][h])) col_task[c][h] = i;
            if (paper_cols[c][h] && col_task[c][h] < 0) {
                if (c == 4) ncols = 4;
                else have_cols = 0;
            }
        }
    if (have_cols) {
        printf("\nMAD as the MesaNet paper's Table 1 (x 100; %s%s)\n%-16s %18s %14s %10s %15s",
               ncols == 5 ? "averages over the five columns" : "compression not run: averages over the other four columns",
               quick ? "" : "; published in brackets", "mixer", "IC & noisy recall", "fuzzy recall", "memorize",
               "selective copy");
        if (ncols == 5) printf(" %12s %16s\n", "compress", "avg of five");
        else printf(" %16s\n", "avg of four");
        for (int k = 0; k < nmix; k++) {
            printf("%-16s", mixers[k]);
            double sum = 0, psum = 0;
            int npub = 0, any = 0;
            const int width[5] = {18, 14, 10, 15, 12};
            for (int c = 0; c < ncols; c++) {
                int a = col_task[c][0], b = col_task[c][1];
                double v = b >= 0 ? 0.5 * (task_mean[a][k] + task_mean[b][k]) : task_mean[a][k];
                int part = task_partial[a][k] || (b >= 0 && task_partial[b][k]);
                any |= part;
                double pv;
                char cell[48], val[32];
                if (!quick && synth_published(paper_cols[c][0], mixers[k], &pv, NULL))
                    snprintf(cell, sizeof cell, "%s (%.1f)", pct_mark(val, v, part), pv), psum += pv, npub++;
                else snprintf(cell, sizeof cell, "%s", pct_mark(val, v, part));
                printf(" %*s", width[c], cell);
                sum += v;
            }
            char val[32];
            if (npub == ncols) printf(" %9s (%.1f)\n", pct_mark(val, sum / ncols, any), psum / ncols);
            else printf(" %16s\n", pct_mark(val, sum / ncols, any));
        }
        if (!quick) printf("published: %s\n", synth_published_source);
    }
    if (any_partial)
        printf("\n*: the best of the runs recorded so far, fewer than the protocol's (lr, wd) grid: the protocol cut "
               "short (run again to go on)\n");
    if (rows.n) printf("\nresults: %s/results.csv, %s/results.json\n", out, out);
    else printf("\nsynth: no results yet in %s (run without --report to train)\n", out);
    free(rows.v);
    return 0;
}
