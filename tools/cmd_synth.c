/*
 * mesanet synth: train and score models on the synthetic tasks (src/synth/synth.h) by each
 * task's protocol (src/synth/run.h): every mixer x grid setting x (lr, wd) of the protocol's grid,
 * best over the grid per setting; a table beside the published numbers, DIR/results.csv,
 * DIR/results.json and an SVG per task. Every finished run is recorded at once, so a sweep that
 * stops resumes where it was (runs already in results.csv are skipped). --jobs N runs up to N runs at
 * once, each a child process of the tool (its share of the cores); the parent alone writes results.csv.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/atomic_file.h"
#include "core/common.h"
#include "eval/plot.h"
#include "synth/run.h"
#include "train/dist.h"
#include "tools/commands.h"

#define CMD "synth"

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

static void rows_add(Rows *r, const Row *x) {
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 64;
        r->v = realloc(r->v, sizeof(Row) * (size_t)r->cap);
        if (!r->v) cmd_fail(CMD, "out of memory");
    }
    r->v[r->n++] = *x;
}

static int same_run(const Row *a, const Row *b) {
    return !strcmp(a->task, b->task) && !strcmp(a->setting, b->setting) && !strcmp(a->mixer, b->mixer) &&
           !strcmp(a->protocol, b->protocol) && a->seed == b->seed && (float)a->lr == (float)b->lr &&
           (float)a->wd == (float)b->wd;
}

static const char *const csv_header = "task,setting,mixer,protocol,seed,lr,wd,steps,epochs,stopped_early,train_seconds,metric,tvd";

// One CSV field (RFC 4180 quoting) into out; returns the position after it and its separator.
static const char *csv_field(const char *p, char *out, size_t cap) {
    size_t n = 0;
    if (*p == '"') {
        for (p++; *p; p++) {
            if (*p == '"' && p[1] == '"') p++;
            else if (*p == '"') {
                p++;
                break;
            }
            if (n + 1 < cap) out[n++] = *p;
        }
    } else
        for (; *p && *p != ',' && *p != '\n' && *p != '\r'; p++)
            if (n + 1 < cap) out[n++] = *p;
    out[n] = 0;
    if (*p == ',') p++;
    return p;
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

static void load_rows(const char *path, Rows *rows) {
    char *text;
    size_t n;
    FILE *probe = fopen(path, "r");
    if (!probe) return;  // a new sweep
    fclose(probe);
    if (file_read_all(path, (size_t)1 << 30, &text, &n)) cmd_fail(CMD, "%s", mn_last_error());
    int line = 0;
    for (char *p = text; *p; line++) {
        char *end = strchr(p, '\n');
        if (end) *end = 0;
        if (line > 0 && *p) {
            char f[13][128];
            const char *q = p;
            for (int i = 0; i < 13; i++) q = csv_field(q, f[i], sizeof f[i]);  // tvd: empty in older files
            Row r = {0};
            snprintf(r.task, sizeof r.task, "%s", f[0]);
            snprintf(r.setting, sizeof r.setting, "%s", f[1]);
            snprintf(r.mixer, sizeof r.mixer, "%s", f[2]);
            snprintf(r.protocol, sizeof r.protocol, "%s", f[3]);
            r.seed = atoll(f[4]), r.lr = atof(f[5]), r.wd = atof(f[6]), r.steps = atoi(f[7]), r.epochs = atoi(f[8]);
            r.early = atoi(f[9]), r.seconds = atof(f[10]), r.metric = atof(f[11]);
            r.tvd = f[12][0] ? atof(f[12]) : NAN;
            if (!r.task[0] || !r.mixer[0]) cmd_fail(CMD, "%s: line %d is not a result row", path, line + 1);
            rows_add(rows, &r);
        }
        if (!end) break;
        p = end + 1;
    }
    free(text);
}

static void save_rows(const char *dir, const Rows *rows) {
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

// Splits a comma list in place (at most max items).
static int split_list(char *s, char **items, int max) {
    int n = 0;
    for (char *tok = strtok(s, ","); tok && n < max; tok = strtok(NULL, ",")) items[n++] = tok;
    return n;
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

// The best metric over the (lr, wd) grid of (task, setting, mixer) among the rows; NAN if none.
// *tvd (may be NULL): the TVD of that best run (NAN if none).
static double best_of(const Rows *rows, const char *task, const char *setting, const char *mixer, const char *proto,
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

enum { MAX_TASKS = 16, MAX_MIXERS = 16, MAX_SETTINGS = 32, MAX_JOBS = 64 };

// --jobs: one run in a child process, the tool itself with the same options restricted to that run
// (--run-index) and writing to its own directory; the parent alone writes DIR/results.csv.
typedef struct {
    pid_t pid;
    int index;  // the run's number in the sweep (1-based)
    int gpu;    // which of --gpus it runs on (-1: the devices the tool sees)
    char dir[4096];
} Job;

// --gpus: job k of the first round goes to GPU k mod gpus, and each later job to the GPU of the
// job whose end made room for it, so that every GPU runs jobs / gpus of them at all times.
static void job_start(Job *j, int argc, char **argv, const char *out, int index, int threads, int gpu) {
    char dev[64] = "";
    if (gpu >= 0 && dist_visible_device(gpu, dev, sizeof dev)) cmd_fail(CMD, "--gpus: %s", mn_last_error());
    char idx[32];
    snprintf(idx, sizeof idx, "%d", index);
    snprintf(j->dir, sizeof j->dir, "%s/.job-%d", out, index);
    if (mn_mkdirs(j->dir)) cmd_fail(CMD, "%s: %s", j->dir, mn_last_error());
    char **cargv = calloc((size_t)argc + 8, sizeof(char *));
    if (!cargv) cmd_fail(CMD, "out of memory");
    int n = 0;
    cargv[n++] = "mesanet";
    for (int i = 0; i < argc; i++) cargv[n++] = argv[i];
    cargv[n++] = "--run-index", cargv[n++] = idx, cargv[n++] = "--out", cargv[n++] = j->dir;
    cargv[n++] = "--jobs", cargv[n++] = "1", cargv[n] = NULL;
    fflush(stdout), fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) cmd_fail(CMD, "fork: cannot start a job");
    if (pid == 0) {
        char th[32];
        snprintf(th, sizeof th, "%d", threads);
        setenv("OMP_NUM_THREADS", th, 1);
        if (gpu >= 0) setenv("CUDA_VISIBLE_DEVICES", dev, 1);
        if (!freopen("/dev/null", "w", stdout)) _exit(127);
        execv("/proc/self/exe", cargv);
        _exit(127);
    }
    free(cargv);
    j->pid = pid, j->index = index, j->gpu = gpu;
}

// Waits for one of the n jobs to end; its row into *r (MN_OK), or an error naming why not. The
// job is removed from the list (the last one takes its place); *gpu gets the GPU it leaves free.
static int job_wait(Job *jobs, int *n, Row *r, int *index, int *gpu) {
    int status;
    pid_t pid;
    do pid = waitpid(-1, &status, 0);
    while (pid < 0 && errno == EINTR);
    if (pid < 0) return mn_error(MN_ERR_IO, "waitpid failed");
    int k = 0;
    while (k < *n && jobs[k].pid != pid) k++;
    if (k == *n) return job_wait(jobs, n, r, index, gpu);  // not ours
    Job j = jobs[k];
    jobs[k] = jobs[--*n];
    *index = j.index;
    *gpu = j.gpu;
    if (!WIFEXITED(status) || WEXITSTATUS(status))
        return mn_error(MN_ERR_ARG, "run %d (a --jobs process) failed (status %d)", j.index,
                        WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    char path[4200];
    Rows one = {0};
    snprintf(path, sizeof path, "%s/results.csv", j.dir);
    load_rows(path, &one);
    int st = one.n == 1 ? MN_OK : mn_error(MN_ERR_IO, "run %d: %s holds %d rows, not 1", j.index, path, one.n);
    if (!st) *r = one.v[0];
    free(one.v);
    remove(path);
    snprintf(path, sizeof path, "%s/results.json", j.dir);
    remove(path);
    rmdir(j.dir);
    return st;
}

#ifdef MN_HAVE_CUDA
int cuda_device_count(void);
#endif

// --gpus N spreads the --jobs processes over N GPUs: the cuda backend, at least one job a GPU, and
// N devices that this process sees.
static void check_gpus(int gpus, int jobs, const char *backend) {
    if (!gpus) return;
    if (strcmp(backend, "cuda")) cmd_fail(CMD, "--gpus %d: GPUs are for --backend cuda, not %s", gpus, backend);
    if (jobs < gpus) cmd_fail(CMD, "--gpus %d: needs --jobs %d or more (at least one run at a time on each GPU), not %d", gpus, gpus, jobs);
#ifdef MN_HAVE_CUDA
    int n = cuda_device_count();
#else
    int n = 0;  // a build without CUDA
#endif
    if (n < gpus) cmd_fail(CMD, "--gpus %d: this process sees %d GPU(s)", gpus, n);
}

int cmd_synth(int argc, char **argv) {
    const char *mixers_arg = NULL, *settings = "baseline", *backend = "cpu", *out = "runs/synth";
    int quick = 0, report = 0, seed = 0, stop_after = 0, dim = 0, epochs = 0, max_steps = 0, batch = 0, jobs = 1, run_index = 0;
    int gpus = 0;
    Option opts[] = {
        {"mixers", OPT_STRING, &mixers_arg, "comma list of mixers (mesa, gdn, mha, gla, mamba2, deltanet, gdn-paper, "
                                            "swa, ...) or patterns of blocks written with + (gdn+mha: gdn, then mha); NAME:neg "
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
        {"gpus", OPT_INT, &gpus, "GPUs the --jobs share out (cuda; 0: every job on the devices the tool sees)", 0,
         MAX_JOBS},
        {"run-index", OPT_INT, &run_index, "internal (--jobs): run only the sweep's run of this number", 0,
         1000000000},
    };
    char *pos[1];
    int npos = 0;
    int st = parse_args(argc, argv, "TASK[,TASK...] --mixers M1,M2,... [options]", opts, sizeof opts / sizeof opts[0],
                        pos, &npos, 1);
    if (st) return st == 2 ? 0 : 1;
    if (npos < 1) {
        fprintf(stderr, "mesanet synth: a task is required; the tasks:\n");
        for (int i = 0; i < synth_task_count(); i++)
            fprintf(stderr, "  %-20s %s\n", synth_task(i)->name, synth_task(i)->summary);
        fprintf(stderr, "  %-20s %s\n", synth_task_regbench.name, synth_task_regbench.summary);
        fprintf(stderr, "  %-20s the six MAD tasks (mad-compression with the autoencoder head)\n", "mad");
        fprintf(stderr, "  %-20s every task the causal model runs\n", "all");
        return 1;
    }
    if (!mixers_arg || !*mixers_arg) cmd_fail(CMD, "--mixers is required (e.g. --mixers mesa,gdn,mha)");
    if (strcmp(settings, "baseline") && strcmp(settings, "full"))
        cmd_fail(CMD, "--settings must be baseline or full, got '%s'", settings);
    if (!run_index) check_gpus(gpus, jobs, backend);  // (a job sees its one GPU, and --jobs 1)
    const Backend *be = backend_by_name(backend);
    if (!be) cmd_fail(CMD, "--backend: %s", mn_last_error());

    // Tasks.
    const SynthTask *tasks[MAX_TASKS];
    int ntasks = 0;
    char task_list[512], *titems[MAX_TASKS];
    snprintf(task_list, sizeof task_list, "%s", pos[0]);
    int nt = split_list(task_list, titems, MAX_TASKS);
    for (int i = 0; i < nt; i++) {
        if (!strcmp(titems[i], "mad") || !strcmp(titems[i], "all")) {
            for (int k = 0; k < synth_task_count() && ntasks < MAX_TASKS; k++) {
                const SynthTask *t = synth_task(k);
                if ((!strcmp(titems[i], "all") || !strcmp(t->family, "mad")) && !synth_task_supported(t))
                    tasks[ntasks++] = t;
            }
            if (!strcmp(titems[i], "all") && ntasks < MAX_TASKS) tasks[ntasks++] = &synth_task_regbench;
            continue;
        }
        const SynthTask *t = synth_find_any(titems[i]);
        if (!t) cmd_fail(CMD, "unknown task '%s': %s (or regbench, mad, all)", titems[i], mn_last_error());
        if (synth_task_supported(t)) cmd_fail(CMD, "%s", mn_last_error());
        if (ntasks < MAX_TASKS) tasks[ntasks++] = t;
    }
    if (ntasks == 0) cmd_fail(CMD, "no task in '%s'", pos[0]);

    // Mixers: a pattern of blocks is written with '+' (the list's own separator is ',').
    char mixer_list[1024], *mitems[MAX_MIXERS];
    snprintf(mixer_list, sizeof mixer_list, "%s", mixers_arg);
    int nmix = split_list(mixer_list, mitems, MAX_MIXERS);
    if (nmix == 0) cmd_fail(CMD, "--mixers names no mixer");
    char mixers[MAX_MIXERS][64];
    for (int i = 0; i < nmix; i++) {
        snprintf(mixers[i], sizeof mixers[i], "%s", mitems[i]);
        for (char *c = mixers[i]; *c; c++)
            if (*c == '+') *c = ',';
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
        total += ngrid[i] * nmix * prot[i].nlr;
    }
    if (mn_mkdirs(out)) cmd_fail(CMD, "--out %s: %s", out, mn_last_error());
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
    int threads = ncpu > jobs ? (int)(ncpu / jobs) : 1;
    printf("synth: %d task(s) x %d mixer(s), %s settings, %d runs; %s backend; results in %s\n", ntasks, nmix, settings,
           total, be->name, out);
    if (jobs > 1 && gpus) printf("synth: up to %d runs at once over %d GPUs, %d thread(s) each\n", jobs, gpus, threads);
    else if (jobs > 1) printf("synth: up to %d runs at once, %d thread(s) each\n", jobs, threads);
    for (int i = 0; i < ntasks; i++)
        printf("synth: %s: %s; width %d, %d blocks, batch %d\n", tasks[i]->name, prot[i].source, prot[i].dim,
               prot[i].n_layers, prot[i].batch);
    if (quick) printf("synth: --quick shrinks every setting (labels name the grid's settings, not the sizes run)\n");
    fflush(stdout);

    int done = 0, ran = 0, skipped = 0, finished = 0, njob = 0, missing = 0, free_gpu = -1;
    double spent = 0;
    Job job[MAX_JOBS];
    for (int i = 0; i < ntasks && (!stop_after || ran < stop_after); i++) {
        const SynthTask *t = tasks[i];
        for (int g = 0; g < ngrid[i] && (!stop_after || ran < stop_after); g++) {
            SynthSettings s;
            char label[96];
            if (synth_grid(t, g, &s, label, sizeof label)) cmd_fail(CMD, "%s", mn_last_error());
            if (quick) synth_quick_settings(t, &s);
            for (int k = 0; k < nmix && (!stop_after || ran < stop_after); k++)
                for (int l = 0; l < prot[i].nlr && (!stop_after || ran < stop_after); l++) {
                    Row r = {0};
                    r.tvd = NAN;
                    snprintf(r.task, sizeof r.task, "%s", t->name);
                    snprintf(r.setting, sizeof r.setting, "%s", label);
                    snprintf(r.mixer, sizeof r.mixer, "%s", mixers[k]);
                    snprintf(r.protocol, sizeof r.protocol, "%s", proto);
                    r.seed = seed, r.lr = prot[i].lrs[l], r.wd = prot[i].wds[l];
                    done++;
                    int have = 0;
                    for (int j = 0; j < rows.n && !have; j++) have = same_run(&rows.v[j], &r);
                    if (have) {
                        skipped++;
                        if (!report)
                            printf("[%d/%d] %s %s %s lr %g wd %g: already in results.csv, skipped\n", done, total,
                               r.task, r.setting, r.mixer, r.lr, r.wd);
                        fflush(stdout);
                        continue;
                    }
                    if (run_index && done != run_index) continue;
                    if (report) {  // not run yet: its cells stay empty
                        missing++;
                        continue;
                    }
                    if (jobs > 1) {
                        while (njob >= jobs) {  // a slot: wait for a run to end, record it
                            Row got;
                            int gi;
                            if (job_wait(job, &njob, &got, &gi, &free_gpu)) cmd_fail(CMD, "%s", mn_last_error());
                            rows_add(&rows, &got);
                            save_rows(out, &rows);
                            finished++, spent += got.seconds;
                            char took[32], eta[32], tvd_text[32] = "";
                            fmt_time(took, sizeof took, got.seconds);
                            fmt_time(eta, sizeof eta, spent / finished * (total - done + njob + 1) / jobs);
                            if (isfinite(got.tvd)) snprintf(tvd_text, sizeof tvd_text, ", tvd %.4f", got.tvd);
                            printf("[%d/%d] %s %s %s lr %g wd %g: metric %.4f%s, %d steps%s, %s | ETA %s\n", gi, total,
                                   got.task, got.setting, got.mixer, got.lr, got.wd, got.metric, tvd_text, got.steps,
                                   got.early ? " (stopped early)" : "", took, eta);
                            fflush(stdout);
                        }
                        int gpu = !gpus ? -1 : free_gpu >= 0 ? free_gpu : njob % gpus;
                        free_gpu = -1;
                        job_start(&job[njob++], argc, argv, out, done, threads, gpu);
                        ran++;
                        printf("[%d/%d] %s %s %s lr %g wd %g: training (%d at once) ...\n", done, total, r.task,
                               r.setting, r.mixer, r.lr, r.wd, njob);
                        fflush(stdout);
                        continue;
                    }
                    printf("[%d/%d] %s %s %s lr %g wd %g: training ...\n", done, total, r.task, r.setting, r.mixer,
                           r.lr, r.wd);
                    fflush(stdout);
                    SynthRunResult res;
                    if (synth_run(t, &s, &prot[i], mixers[k], (float)r.lr, (float)r.wd, (uint64_t)seed, be,
                                  quick ? NULL : stdout, &res))
                        cmd_fail(CMD, "%s %s %s: %s", r.task, r.setting, r.mixer, mn_last_error());
                    r.steps = res.steps, r.epochs = res.epochs, r.early = res.stopped_early;
                    r.seconds = res.seconds, r.metric = res.metric, r.tvd = res.tvd;
                    rows_add(&rows, &r);
                    save_rows(out, &rows);
                    ran++;
                    spent += res.seconds;
                    char took[32], eta[32];
                    fmt_time(took, sizeof took, res.seconds);
                    fmt_time(eta, sizeof eta, spent / ran * (total - done));
                    char tvd_text[32] = "";
                    if (isfinite(r.tvd)) snprintf(tvd_text, sizeof tvd_text, ", tvd %.4f", r.tvd);
                    printf("[%d/%d] %s %s %s lr %g wd %g: metric %.4f%s, %d steps%s, %s | ETA %s\n", done, total,
                           r.task, r.setting, r.mixer, r.lr, r.wd, r.metric, tvd_text, r.steps,
                           r.early ? " (stopped early)" : "", took, eta);
                    fflush(stdout);
                }
        }
    }
    while (njob > 0) {  // the last runs of --jobs
        Row got;
        int gi;
        if (job_wait(job, &njob, &got, &gi, &free_gpu)) cmd_fail(CMD, "%s", mn_last_error());
        rows_add(&rows, &got);
        save_rows(out, &rows);
        finished++, spent += got.seconds;
        char took[32], tvd_text[32] = "";
        fmt_time(took, sizeof took, got.seconds);
        if (isfinite(got.tvd)) snprintf(tvd_text, sizeof tvd_text, ", tvd %.4f", got.tvd);
        printf("[%d/%d] %s %s %s lr %g wd %g: metric %.4f%s, %d steps%s, %s\n", gi, total, got.task, got.setting,
               got.mixer, got.lr, got.wd, got.metric, tvd_text, got.steps, got.early ? " (stopped early)" : "", took);
        fflush(stdout);
    }
    if (run_index) {  // a --jobs child: its row is in its own results.csv
        free(rows.v);
        return 0;
    }
    if (stop_after && ran >= stop_after && done < total) {
        printf("synth: stopped after %d new run(s) (--stop-after); %d of %d not run yet: run again to go on\n", ran,
               total - done, total);
        free(rows.v);
        return 0;
    }
    if (report)
        printf("synth: --report: %d of %d run(s) recorded, %d not run yet (their cells: -)\n", skipped, total, missing);
    else if (skipped)
        printf("synth: %d run(s) were already recorded and skipped, %d run now\n", skipped, ran);

    // Tables: per task, rows mixers, columns the settings (best over the lr grid) and their mean.
    double task_mean[MAX_TASKS][MAX_MIXERS];
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
        for (int k = 0; k < nmix; k++) has_pub |= synth_published(t->name, mixers[k], &pv, NULL);
        int rb = t == &synth_task_regbench;
        printf("\n%s (metric x 100, best over %d lr setting(s)%s)\n%-16s", t->name, prot[i].nlr,
               rb ? "; tvd: mean TVD of those best runs, 0..1, lower is better" : "", "mixer");
        for (int g = 0; g < ngrid[i]; g++) printf(" %14.14s", labels[g]);
        printf(" %8s%s%s\n", "mean", rb ? "      tvd" : "", has_pub ? "  published" : "");
        double ys[MAX_MIXERS][MAX_SETTINGS], xs[MAX_SETTINGS];
        PlotSeries series[MAX_MIXERS];
        int any_point = 0;
        for (int k = 0; k < nmix; k++) {
            printf("%-16s", mixers[k]);
            double sum = 0, tsum = 0;
            int n = 0, tn = 0;
            for (int g = 0; g < ngrid[i]; g++) {
                double tv;
                double b = best_of(&rows, t->name, labels[g], mixers[k], proto, seed, &tv);
                if (isfinite(tv)) tsum += tv, tn++;
                ys[k][g] = b, xs[g] = g;
                if (isnan(b)) printf(" %14s", "-");
                else printf(" %14.1f", 100 * b), sum += b, n++;
            }
            task_mean[i][k] = n ? sum / n : NAN;
            any_point |= n > 0;
            if (n) printf(" %8.1f", 100 * task_mean[i][k]);
            else printf(" %8s", "-");
            if (rb && tn) printf(" %8.4f", tsum / tn);
            else if (rb) printf(" %8s", "-");
            const char *col;
            if (synth_published(t->name, mixers[k], &pv, &col)) printf("  %.1f (%s)", pv, col);
            printf("\n");
            series[k] = (PlotSeries){.name = mixers[k], .x = xs, .y = ys[k], .n = ngrid[i], .markers = 1};
        }
        if (has_pub && synth_published_source_of(t->name))
            printf("published: %s\n", synth_published_source_of(t->name));
        char svg[4096], title[128];
        snprintf(svg, sizeof svg, "%s/%s.svg", out, t->name);
        snprintf(title, sizeof title, "%s: test metric by setting (best over the lr grid)", t->name);
        PlotOpts po = {.title = title, .xlabel = "setting", .ylabel = "metric", .xcats = cats, .ncats = ngrid[i]};
        if (!any_point) continue;  // --report before any run of the task: no plot
        if (plot_svg(svg, &po, series, nmix)) fprintf(stderr, "mesanet synth: %s: %s\n", svg, mn_last_error());
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
            for (int i = 0; i < ntasks; i++) printf(" %12s", pct(cell, task_mean[i][k])), sum += task_mean[i][k];
            printf(" %8s\n", pct(cell, sum / ntasks));
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
        printf("\nMAD as the MesaNet paper's Table 1 (x 100; %s; published in brackets)\n%-16s %18s %14s %10s %15s",
               ncols == 5 ? "averages over the five columns" : "compression not run: averages over the other four columns",
               "mixer", "IC & noisy recall", "fuzzy recall", "memorize", "selective copy");
        if (ncols == 5) printf(" %12s %16s\n", "compress", "avg of five");
        else printf(" %16s\n", "avg of four");
        for (int k = 0; k < nmix; k++) {
            printf("%-16s", mixers[k]);
            double sum = 0, psum = 0;
            int npub = 0;
            const int width[5] = {18, 14, 10, 15, 12};
            for (int c = 0; c < ncols; c++) {
                double v = col_task[c][1] >= 0 ? 0.5 * (task_mean[col_task[c][0]][k] + task_mean[col_task[c][1]][k])
                                               : task_mean[col_task[c][0]][k];
                double pv;
                char cell[48], val[32];
                if (synth_published(paper_cols[c][0], mixers[k], &pv, NULL))
                    snprintf(cell, sizeof cell, "%s (%.1f)", pct(val, v), pv), psum += pv, npub++;
                else snprintf(cell, sizeof cell, "%s", pct(val, v));
                printf(" %*s", width[c], cell);
                sum += v;
            }
            char val[32];
            if (npub == ncols) printf(" %9s (%.1f)\n", pct(val, sum / ncols), psum / ncols);
            else printf(" %16s\n", pct(val, sum / ncols));
        }
        printf("published: %s\n", synth_published_source);
    }
    printf("\nresults: %s/results.csv, %s/results.json\n", out, out);
    free(rows.v);
    return 0;
}
