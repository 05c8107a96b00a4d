// mesanet eval: perplexity, NLL by token position (and against another model),
// length extrapolation and the CG steps / accuracy trade-off (paper J.1, L).
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/registry.h"
#include "core/common.h"
#include "core/csv.h"
#include "core/plot.h"
#include "data/shard.h"
#include "data/tokenizer_id.h"
#include "eval/eval.h"
#include "model/model.h"
#include "tools/commands.h"
#include "train/checkpoint.h"
#include "train/run_info.h"

#define MAX_FACTOR 4096       // --lengths: the largest multiple of the training length
#define MAX_FACTORS 16        // --lengths: how many
#define MAX_LENGTH (1 << 24)  // the longest sequence a model config takes (config.c's seq_len)
#define FALLBACK_DATA "data/demo"

typedef struct {
    const char *shard;
    int batch, batches;  // sequences a rank scores of each batch; batches (of batch x ranks sequences)
    const Backend *be;
    Group *g;            // the ranks (one process: size 1)
} EvalSetup;

// A progress line on stderr for one evaluation, from rank 0: on a terminal rewritten in place a
// few times a second; in a log a line every LOG_EVERY seconds; in both a last line with the time.
typedef struct {
    const char *what;  // "loss", "length 512", "CG 5 steps"
    int ranks, tty;
    double last;       // when a line was last printed
} Progress;

#define LOG_EVERY 10.0

static void format_duration(char *buf, size_t cap, double s) {
    if (s < 60) snprintf(buf, cap, "%.0f s", s);
    else if (s < 3600) snprintf(buf, cap, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
    else snprintf(buf, cap, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
}

static void show_progress(void *ctx, int done, int total, double tokens, double seconds) {
    Progress *p = ctx;
    double now = mn_now(), rate = tokens * p->ranks / (seconds > 0 ? seconds : 1e-9);
    char eta[32];
    if (done == total) {
        fprintf(stderr, "%seval %s: %d batch%s in %.1f s, %.0f tokens/s\n", p->tty ? "\r\033[K" : "", p->what, total,
                total == 1 ? "" : "es", seconds, rate);
        return;
    }
    if (now - p->last < (p->tty ? 0.25 : LOG_EVERY)) return;
    p->last = now;
    format_duration(eta, sizeof eta, seconds / done * (total - done));
    fprintf(stderr, "%seval %s: batch %d/%d, %.0f tokens/s, ETA %s%s", p->tty ? "\r\033[K" : "", p->what, done, total,
            rate, eta, p->tty ? "" : "\n");
}

// Evaluates `m` at sequence length T with the given CG settings: each rank scores its rows of
// every batch, and all get the sums. Rank 0 shows the progress, naming it `what`.
static int evaluate(Model *m, const EvalSetup *e, int T, int steps, float tol, const char *what, EvalResult *r) {
    DataLoader dl;
    MN_TRY(loader_open(&dl, e->shard, e->batch * e->g->size, T, 0, 0));
    m->solver.max_steps = steps;
    m->solver.tol = tol;
    Progress p = {what, e->g->size, isatty(STDERR_FILENO), mn_now()};
    int s = eval_run_rows_progress(m, &dl, e->batches, e->g->rank * e->batch, e->batch, r,
                                   e->g->rank == 0 ? show_progress : NULL, &p);
    loader_close(&dl);
    if (!s && (s = group_sum_eval(e->g, r))) eval_free(r);
    return s;
}

static double mean_nll(const EvalResult *r) { return r->count > 0 ? r->nll_sum / r->count : NAN; }

// NLL at each position and the running mean up to it.
static void per_position(const EvalResult *r, double *nll, double *so_far) {
    double acc = 0, cnt = 0;
    for (int t = 0; t < r->T; t++) {
        nll[t] = r->pos_count[t] > 0 ? r->pos_sum[t] / r->pos_count[t] : NAN;
        acc += r->pos_sum[t];
        cnt += r->pos_count[t];
        so_far[t] = cnt > 0 ? acc / cnt : NAN;
    }
}

// The factors of --lengths: comma-separated integers in [1, MAX_FACTOR], nothing else. The count,
// or -1.
static int parse_factors(const char *s, int *out, int max) {
    int n = 0;
    for (;;) {
        char *end;
        if (*s < '0' || *s > '9' || n == max) return -1;  // no sign, blank or empty item
        long long v = strtoll(s, &end, 10);
        if (v < 1 || v > MAX_FACTOR) return -1;  // also what strtoll clamped on overflow
        out[n++] = (int)v;
        if (!*end) return n;
        if (*end != ',') return -1;
        s = end + 1;
    }
}

// The data directory a run was trained on, as its run.json records it (train/run_info.h). 1 if
// found; 0 for a run without run.json (made before the trainer wrote one); fails on a run.json
// that cannot be read.
static int recorded_data_dir(const char *run, char *out, size_t cap) {
    if (!run_info_exists(run)) return 0;
    RunInfo ri;
    if (run_info_read(run, &ri)) cmd_fail("eval", "%s", mn_last_error());
    snprintf(out, cap, "%s", ri.data);
    return ri.data[0] != 0;
}

// What eval scores: a shard, the directory that holds it (and its tokenizer), and how messages
// name it.
typedef struct {
    char shard[4096];
    char dir[4096];
    char what[4200];  // "--data DIR", "--shard FILE", "RUN's data DIR (from its run.json)"
} DataChoice;

// --shard, else --data's valid.bin, else the valid.bin of the run's own data (data/demo where the
// run does not record it).
static void choose_shard(const char *shard, const char *data, const char *run, DataChoice *d) {
    memset(d, 0, sizeof *d);
    if (shard) {
        const char *slash = strrchr(shard, '/');
        snprintf(d->shard, sizeof d->shard, "%s", shard);
        if (slash) snprintf(d->dir, sizeof d->dir, "%.*s", slash == shard ? 1 : (int)(slash - shard), shard);  // "/x.bin": "/"
        else snprintf(d->dir, sizeof d->dir, ".");
        snprintf(d->what, sizeof d->what, "--shard %s", shard);
        return;
    }
    if (data) {
        snprintf(d->dir, sizeof d->dir, "%s", data);
        snprintf(d->what, sizeof d->what, "--data %s", data);
    } else if (recorded_data_dir(run, d->dir, sizeof d->dir)) {
        snprintf(d->what, sizeof d->what, "%s's data %s (from its run.json)", run, d->dir);
    } else {
        snprintf(d->dir, sizeof d->dir, "%s", FALLBACK_DATA);
        snprintf(d->what, sizeof d->what, "%s (the default data)", FALLBACK_DATA);
        fprintf(stderr, "mesanet eval: %s does not record its data directory; evaluating %s (give --data)\n", run,
                FALLBACK_DATA);
    }
    snprintf(d->shard, sizeof d->shard, "%s/valid.bin", d->dir);
}

// The tokens of a shard (its sequences must fit in them) and its vocabulary.
static uint64_t shard_tokens(const DataChoice *d, uint32_t *vocab) {
    TokenShard s;
    if (shard_read(d->shard, &s)) cmd_fail("eval", "%s: %s", d->what, mn_last_error());
    uint64_t n = s.n_tokens;
    *vocab = s.vocab_size;
    shard_free(&s);
    return n;
}

// Refuses, naming the option, a --model or --compare that cannot be a run directory: empty, not
// there, or a file.
static void check_run_dir(const char *option, const char *dir) {
    struct stat st;
    if (!dir[0]) cmd_fail("eval", "%s is empty: give a run directory (one with config.json and model.safetensors)", option);
    if (stat(dir, &st)) cmd_fail("eval", "%s %s: %s", option, dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        cmd_fail("eval", "%s %s: not a run directory (a file; a run directory holds config.json and model.safetensors)",
                 option, dir);
}

// The config of the run in dir (of its latest checkpoint), read before any model is built, for
// the checks below; refused naming the option.
static void read_run_config(const char *option, const char *dir, ModelConfig *c) {
    char ck[4096], path[4200];
    if (checkpoint_dir(dir, ck, sizeof ck)) cmd_fail("eval", "%s %s: %s", option, dir, mn_last_error());
    snprintf(path, sizeof path, "%s/config.json", ck);
    if (access(path, R_OK))
        cmd_fail("eval", "%s %s: no %s (not a run directory?)", option, dir, path);
    if (config_load(c, path)) cmd_fail("eval", "%s %s: %s", option, dir, mn_last_error());
}

// 1 when directories a and b both hold a tokenizer and it is the same; 0 when either holds none
// (nothing to compare); -1 when they differ, with the difference in why.
static int same_tokenizer(const char *a, const char *b, char *why, size_t cap) {
    if (!tokenizer_recorded(a) || !tokenizer_recorded(b)) return 0;
    int same;
    if (tokenizer_compare(a, b, &same, why, cap)) cmd_fail("eval", "%s", mn_last_error());
    return same ? 1 : -1;
}

// Refuses, before any work, what would score a model on token ids that mean something else than
// they did in its training: a second model with another vocabulary or tokenizer, data made with
// another tokenizer (where both directories hold one: a run holds its training data's), or data
// with ids beyond a model's vocabulary. A run whose tokenizer cannot be checked against the data's
// is noted.
static void check_tokens(const char *run, const ModelConfig *mc, const char *compare, const ModelConfig *oc,
                         const DataChoice *d, uint32_t shard_vocab) {
    char why[4300];
    if (compare) {
        int same = same_tokenizer(compare, run, why, sizeof why);
        // A config may pad the vocabulary of the same tokenizer: the ids then still agree.
        if (oc->vocab_size != mc->vocab_size && same != 1)
            cmd_fail("eval", "--compare %s: vocabulary %d, but %s has %d (another tokenizer%s%s)", compare,
                     oc->vocab_size, run, mc->vocab_size, same < 0 ? ": " : "", same < 0 ? why : "");
        if (same < 0)
            cmd_fail("eval",
                     "--compare %s: its tokenizer differs from %s's (%s): the two models' token ids mean different "
                     "things, so their losses cannot be compared",
                     compare, run, why);
    }
    const char *runs[2] = {run, compare};
    const ModelConfig *cfgs[2] = {mc, oc};
    for (int i = 0; i < 2 && runs[i]; i++) {
        const char *who = runs[i], *opt = i ? "--compare " : "";
        if ((uint32_t)cfgs[i]->vocab_size < shard_vocab)
            cmd_fail("eval", "%s: %s holds ids of a %u-token vocabulary, but %s%s has %d (another tokenizer)", d->what,
                     d->shard, shard_vocab, opt, who, cfgs[i]->vocab_size);
        int same = same_tokenizer(d->dir, who, why, sizeof why);
        if (same < 0)
            cmd_fail("eval", "%s: its tokenizer differs from %s%s's (%s): the model would be scored on another tokenizer's "
                     "ids%s",
                     d->what, opt, who, why,
                     d->what[0] == '-' ? "" : " (was the data tokenized again after the run was trained? give --data)");
        if (!same && i == 0 && tokenizer_recorded(who))
            fprintf(stderr, "mesanet eval: %s holds no tokenizer (%s, %s) to check against %s's\n", d->dir,
                    tokenizer_files[0], tokenizer_files[1], who);
    }
}

// Refuses, before any work, sequences longer than a model takes or than the shard holds, and
// batches beyond the loader's int count of tokens.
static void check_length(const char *what, long long L, int batch, int ranks, const char *shard, uint64_t tokens) {
    if (L > MAX_LENGTH) cmd_fail("eval", "%s: %lld tokens a sequence, at most %d", what, L, MAX_LENGTH);
    if ((uint64_t)L + 1 > tokens)
        cmd_fail("eval", "%s: sequences of %lld tokens need %lld tokens of data, %s holds %llu", what, L, L + 1, shard,
                 (unsigned long long)tokens);
    if ((long long)batch * ranks * L > INT_MAX)
        cmd_fail("eval", "%s: %d x %d sequences of %lld tokens = %lld tokens a batch, at most %d (lower --batch)", what,
                 batch, ranks, L, (long long)batch * ranks * L, INT_MAX);
}

// NLL by position: each model's per-position curve (faint) under its running mean, in one colour.
static void write_position_files(const char *outdir, const char *run, const char *compare, int T, const double *x,
                                 const double *pos, const double *sofar, const double *opos, const double *osofar) {
    char path[4200], names[4][4200];
    const char *cols[6] = {"position", "nll", "mean_so_far", "nll_other", "mean_so_far_other", "delta_nll"};
    double *delta = xcalloc((size_t)T, 8), *delta_mean = xcalloc((size_t)T, 8);
    for (int t = 0; t < T && compare; t++) {
        delta[t] = pos[t] - opos[t];
        delta_mean[t] = sofar[t] - osofar[t];
    }
    const double *data_cols[6] = {x, pos, sofar, opos, osofar, delta};
    snprintf(path, sizeof path, "%s/nll_by_position.csv", outdir);
    if (csv_write(path, cols, compare ? 6 : 3, data_cols, T)) cmd_fail("eval", "%s", mn_last_error());
    snprintf(names[0], sizeof names[0], "%s%sper position", compare ? run : "", compare ? ": " : "");
    snprintf(names[1], sizeof names[1], "%s%srunning mean", compare ? run : "", compare ? ": " : "");
    snprintf(names[2], sizeof names[2], "%s: per position", compare ? compare : "");
    snprintf(names[3], sizeof names[3], "%s: running mean", compare ? compare : "");
    PlotSeries ps[4] = {{names[0], x, pos, T, 1, 1, 0}, {names[1], x, sofar, T, 1, 0, 0},
                        {names[2], x, opos, T, 2, 1, 0}, {names[3], x, osofar, T, 2, 0, 0}};
    PlotOpts po = {"NLL by token position, and its running mean over positions 1..t", "token position t",
                   "NLL (nats per token)", 1, 0, 0, 0};
    snprintf(path, sizeof path, "%s/nll_by_position.svg", outdir);
    if (plot_svg(path, &po, ps, compare ? 4 : 2)) cmd_fail("eval", "%s", mn_last_error());
    printf("  wrote %s/nll_by_position.csv and .svg\n", outdir);
    if (compare) {
        PlotSeries ds[2] = {{"per position", x, delta, T, 1, 1, 0}, {"of the running means", x, delta_mean, T, 1, 0, 0}};
        char title[8600];
        snprintf(title, sizeof title, "Delta NLL by position: %s minus %s (negative: first is better)", run, compare);
        PlotOpts pd = {title, "token position t", "Delta NLL (nats)", 1, 0, 0, 0};
        snprintf(path, sizeof path, "%s/delta_nll.svg", outdir);
        if (plot_svg(path, &pd, ds, 2)) cmd_fail("eval", "%s", mn_last_error());
        printf("  wrote %s/delta_nll.svg\n", outdir);
    }
    free(delta);
    free(delta_mean);
}

// The CG settings of --cg-sweep: fixed steps, then tolerances (at most 100 steps).
static const struct {
    int steps;
    float tol;
    const char *label;
} sweep_settings[] = {{1, 0, "1"},          {2, 0, "2"},          {5, 0, "5"},          {10, 0, "10"},        {30, 0, "30"},
                      {100, 1e-2f, "1e-2"}, {100, 1e-3f, "1e-3"}, {100, 1e-4f, "1e-4"}, {100, 1e-5f, "1e-5"}};
enum { NSWEEP = sizeof sweep_settings / sizeof sweep_settings[0], NFIXED = 5 };

// Two panels over the settings: the validation NLL, and the mean CG steps that bought it.
static void write_sweep_files(const char *outdir, const double *nll, const double *ppl, const double *steps) {
    double idx[NSWEEP], max_steps[NSWEEP], tol[NSWEEP];
    const char *cats[NSWEEP];
    for (int i = 0; i < NSWEEP; i++) {
        idx[i] = i;
        max_steps[i] = sweep_settings[i].steps;
        tol[i] = sweep_settings[i].tol;
        cats[i] = sweep_settings[i].label;
    }
    char path[4200];
    const char *cols[5] = {"max_steps", "tol", "nll", "perplexity", "mean_cg_steps"};
    const double *data[5] = {max_steps, tol, nll, ppl, steps};
    snprintf(path, sizeof path, "%s/cg_sweep.csv", outdir);
    if (csv_write(path, cols, 5, data, NSWEEP)) cmd_fail("eval", "%s", mn_last_error());
    const char *fixed = "fixed steps", *tolerance = "tolerance (at most 100 steps)";
    const char *xlabel = "CG setting: fixed steps | relative tolerance";
    PlotSeries sn[2] = {{fixed, idx, nll, NFIXED, 1, 0, 1}, {tolerance, idx + NFIXED, nll + NFIXED, NSWEEP - NFIXED, 2, 0, 1}};
    PlotSeries ss[2] = {{fixed, idx, steps, NFIXED, 1, 0, 1},
                        {tolerance, idx + NFIXED, steps + NFIXED, NSWEEP - NFIXED, 2, 0, 1}};
    PlotPanel panels[2] = {
        {{"Validation NLL", xlabel, "NLL (nats per token)", 0, 0, 0, 0, cats, NSWEEP}, sn, 2},
        {{"Mean CG steps", xlabel, "CG steps per solve", 0, 1, 0, 0, cats, NSWEEP}, ss, 2},
    };
    snprintf(path, sizeof path, "%s/cg_sweep.svg", outdir);
    if (plot_svg_panels(path, "CG steps and accuracy", panels, 2)) cmd_fail("eval", "%s", mn_last_error());
    printf("  wrote %s/cg_sweep.csv and .svg\n", outdir);
}

int cmd_eval(int argc, char **argv) {
    const char *run = "runs/demo", *data = NULL, *shard = NULL, *compare = NULL, *out = NULL, *backend = "cpu";
    const char *lengths = NULL, *precision = "auto";
    int seq = 0, batch = 8, batches = 0, steps = 0, sweep = 0, gpus = 1;
    float tol = 0;
    Option opts[] = {
        {"model", OPT_STRING, &run, "run directory of the model to evaluate"},
        {"data", OPT_STRING, &data,
         "data directory: evaluates its valid.bin (default: the run's training data, as its run.json records; "
         "else " FALLBACK_DATA ")"},
        {"shard", OPT_STRING, &shard, "or this token shard"},
        {"seq", OPT_INT, &seq, "sequence length (0: the training length)", 0, MAX_LENGTH},
        {"batch", OPT_INT, &batch, "sequences per batch (per GPU with --gpus)", 1, 65536},
        {"batches", OPT_INT, &batches, "batches to score (0: the whole split)", 0, 1e9},
        {"cg-steps", OPT_INT, &steps, "CG steps of the Mesa layers (0: the training setting)", 0, 10000},
        {"cg-tol", OPT_FLOAT, &tol, "stop CG at this relative residual (0: fixed steps)", 0, 1},
        {"cg-sweep", OPT_FLAG, &sweep, "also evaluate fixed steps 1, 2, 5, 10, 30 and tolerances 1e-2 ... 1e-5"},
        {"lengths", OPT_STRING, &lengths, "also evaluate at these multiples of the training length, e.g. 1,2,4,8,16"},
        {"compare", OPT_STRING, &compare, "run directory of a second model: Delta NLL by position"},
        {"out", OPT_STRING, &out, "directory for the CSV and SVG files (default: <model>/eval)"},
        {"backend", OPT_STRING, &backend, "cpu, cuda or ref (float64, for checks)"},
        {"lin-precision", OPT_STRING, &precision, LIN_PRECISION_HELP},
        {"gpus", OPT_INT, &gpus,
         "split every batch over this many GPUs, one process each with --batch sequences (cpu, ref: processes)", 1, 256},
    };
    int st = parse_args(argc, argv, "[options]", opts, sizeof opts / sizeof opts[0], NULL, NULL, 0);
    if (st) return st == 2 ? 0 : 1;
    const MnPrecision prec = lin_precision_arg("eval", precision);
    int mult[MAX_FACTORS], nm = 0;
    if (lengths && (nm = parse_factors(lengths, mult, MAX_FACTORS)) < 0)
        cmd_fail("eval", "--lengths expects up to %d comma-separated integers in [1, %d], got '%s'", MAX_FACTORS,
                 MAX_FACTOR, lengths);
    // Everything that can be refused is, before any model is built or rank started.
    check_run_dir("--model", run);
    if (compare) check_run_dir("--compare", compare);
    ModelConfig mc, oc;
    read_run_config("--model", run, &mc);
    if (compare) read_run_config("--compare", compare, &oc);
    DataChoice d;
    choose_shard(shard, data, run, &d);
    uint32_t shard_vocab;
    uint64_t tokens = shard_tokens(&d, &shard_vocab);
    check_tokens(run, &mc, compare, compare ? &oc : NULL, &d, shard_vocab);
    int T = seq > 0 ? seq : mc.seq_len;
    check_length("--seq", T, batch, gpus, d.shard, tokens);
    for (int i = 0; i < nm; i++) {
        char what[64];
        snprintf(what, sizeof what, "--lengths factor %d", mult[i]);
        check_length(what, (long long)mc.seq_len * mult[i], batch / mult[i] > 0 ? batch / mult[i] : 1, gpus, d.shard,
                     tokens);
    }

    Group g;
    int code;
    if (!ranks_begin("eval", gpus, &g, &code)) return code;
    int lead = g.rank == 0;  // rank 0 speaks and writes for the group
    if (!lead && !freopen("/dev/null", "w", stdout)) cmd_fail("eval", "/dev/null: cannot open");
    EvalSetup e = {d.shard, batch, batches, backend_by_name(backend), &g};
    if (!e.be) cmd_fail("eval", "%s", mn_last_error());
    char outdir[4096];
    Model *m, *other = NULL;
    if (checkpoint_load_model(run, e.be, &m)) cmd_fail("eval", "--model %s: %s", run, mn_last_error());
    if (compare && checkpoint_load_model(compare, e.be, &other))
        cmd_fail("eval", "--compare %s: %s", compare, mn_last_error());
    m->solver.precision = prec;
    if (other) other->solver.precision = prec;
    if (out) snprintf(outdir, sizeof outdir, "%s", out);
    else snprintf(outdir, sizeof outdir, "%s/eval", run);
    if (lead && mn_mkdirs(outdir)) cmd_fail("eval", "--out: %s", mn_last_error());
    int train_steps = m->cfg.cg_steps, use_steps = steps > 0 ? steps : train_steps;

    EvalResult r;
    if (evaluate(m, &e, T, use_steps, tol, "loss", &r)) cmd_fail("eval", "%s", mn_last_error());
    double nll = mean_nll(&r);
    int nseq = r.batches * batch * g.size;
    printf("%s on %s: %d sequence%s of %d tokens, %.0f scored\n", run, e.shard, nseq, plural_s(nseq), T, r.count);
    if (g.size > 1) printf("  split over %d ranks, %d sequence%s of every batch each\n", g.size, batch, plural_s(batch));
    printf("  loss %.4f nats/token, perplexity %.3f", nll, exp(nll));
    if (model_uses_cg(&m->cfg)) printf(", mean CG steps %.2f (max %d%s)", r.cg_steps, use_steps, tol > 0 ? ", tolerance" : "");
    printf("\n");

    // NLL by position, and against the second model
    double *pos = xcalloc((size_t)T, 8), *sofar = xcalloc((size_t)T, 8), *x = xcalloc((size_t)T, 8);
    double *opos = xcalloc((size_t)T, 8), *osofar = xcalloc((size_t)T, 8);
    per_position(&r, pos, sofar);
    for (int t = 0; t < T; t++) x[t] = t + 1;
    if (other) {
        EvalResult ro;
        if (evaluate(other, &e, T, other->cfg.cg_steps, 0, compare, &ro)) cmd_fail("eval", "%s", mn_last_error());
        per_position(&ro, opos, osofar);
        printf("  %s: loss %.4f, perplexity %.3f\n", compare, mean_nll(&ro), exp(mean_nll(&ro)));
        eval_free(&ro);
    }
    if (lead) write_position_files(outdir, run, compare, T, x, pos, sofar, opos, osofar);
    eval_free(&r);

    if (nm) {  // length extrapolation
        int cg = model_uses_cg(&m->cfg);  // a CG column only where a layer solves with CG
        printf("\nlength extrapolation (trained at %d):\n  %8s %10s %12s %10s\n", m->cfg.seq_len, "length", "loss",
               "perplexity", cg ? "CG steps" : "");
        for (int i = 0; i < nm; i++) {
            int L = m->cfg.seq_len * mult[i];  // checked above: at most MAX_LENGTH
            EvalResult rl;
            EvalSetup el = e;
            el.batch = batch / mult[i] > 0 ? batch / mult[i] : 1;  // about the same tokens per batch
            char what[64];
            snprintf(what, sizeof what, "length %d", L);
            if (evaluate(m, &el, L, use_steps, tol, what, &rl)) cmd_fail("eval", "length %d: %s", L, mn_last_error());
            if (cg) printf("  %8d %10.4f %12.3f %10.2f\n", L, mean_nll(&rl), exp(mean_nll(&rl)), rl.cg_steps);
            else printf("  %8d %10.4f %12.3f\n", L, mean_nll(&rl), exp(mean_nll(&rl)));
            eval_free(&rl);
        }
    }

    if (sweep && !model_uses_cg(&m->cfg)) {
        printf("\n--cg-sweep: no layer of this model solves with CG; nothing to sweep\n");
        sweep = 0;
    }
    if (sweep) {  // dynamic test-time compute
        double snll[NSWEEP], sppl[NSWEEP], ssteps[NSWEEP];
        printf("\nCG steps and accuracy:\n  %-14s %10s %12s %12s\n", "setting", "loss", "perplexity", "mean steps");
        for (int i = 0; i < NSWEEP; i++) {
            EvalResult rs;
            char name[32];
            if (sweep_settings[i].tol > 0) snprintf(name, sizeof name, "tol %s", sweep_settings[i].label);
            else snprintf(name, sizeof name, "%d step%s", sweep_settings[i].steps, plural_s(sweep_settings[i].steps));
            if (evaluate(m, &e, T, sweep_settings[i].steps, sweep_settings[i].tol, name, &rs))
                cmd_fail("eval", "%s: %s", name, mn_last_error());
            snll[i] = mean_nll(&rs);
            sppl[i] = exp(snll[i]);
            ssteps[i] = rs.cg_steps;
            printf("  %-14s %10.4f %12.3f %12.2f\n", name, snll[i], sppl[i], ssteps[i]);
            eval_free(&rs);
        }
        if (lead) write_sweep_files(outdir, snll, sppl, ssteps);
    }
    free(pos); free(sofar); free(x); free(opos); free(osofar);
    model_free(m);
    if (other) model_free(other);
    group_close(&g);
    return 0;
}
