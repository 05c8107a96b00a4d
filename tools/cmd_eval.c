// mesanet eval: perplexity, NLL by token position (and against another model),
// length extrapolation and the CG steps / accuracy trade-off (paper J.1, L).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/common.h"
#include "eval/eval.h"
#include "eval/plot.h"
#include "model/model.h"
#include "tools/commands.h"
#include "train/checkpoint.h"

typedef struct {
    const char *shard;
    int batch, batches;  // sequences a rank scores of each batch; batches (of batch x ranks sequences)
    const Backend *be;
    Group *g;            // the ranks (one process: size 1)
} EvalSetup;

// Evaluates `m` at sequence length T with the given CG settings: each rank scores its rows of
// every batch, and all get the sums.
static int evaluate(Model *m, const EvalSetup *e, int T, int steps, float tol, EvalResult *r) {
    DataLoader dl;
    MN_TRY(loader_open(&dl, e->shard, e->batch * e->g->size, T, 0, 0));
    m->solver.max_steps = steps;
    m->solver.tol = tol;
    int s = eval_run_rows(m, &dl, e->batches, e->g->rank * e->batch, e->batch, r);
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

static int parse_ints(const char *s, int *out, int max) {
    int n = 0;
    while (*s && n < max) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v <= 0 || (*end && *end != ',')) return -1;
        out[n++] = (int)v;
        s = *end ? end + 1 : end;
    }
    return n;
}

int cmd_eval(int argc, char **argv) {
    const char *run = "runs/demo", *data = NULL, *shard = NULL, *compare = NULL, *out = NULL, *backend = "cpu";
    const char *lengths = NULL;
    int seq = 0, batch = 8, batches = 0, steps = 0, sweep = 0, gpus = 1;
    float tol = 0;
    Option opts[] = {
        {"model", OPT_STRING, &run, "run directory of the model to evaluate"},
        {"data", OPT_STRING, &data, "data directory: evaluates its valid.bin (default: the run's training data)"},
        {"shard", OPT_STRING, &shard, "or this token shard"},
        {"seq", OPT_INT, &seq, "sequence length (0: the training length)"},
        {"batch", OPT_INT, &batch, "sequences per batch (per GPU with --gpus)"},
        {"batches", OPT_INT, &batches, "batches to score (0: the whole split)"},
        {"cg-steps", OPT_INT, &steps, "CG steps of the Mesa layers (0: the training setting)"},
        {"cg-tol", OPT_FLOAT, &tol, "stop CG at this relative residual (0: fixed steps)"},
        {"cg-sweep", OPT_FLAG, &sweep, "also evaluate fixed steps 1, 2, 5, 10, 30 and tolerances 1e-2 ... 1e-5"},
        {"lengths", OPT_STRING, &lengths, "also evaluate at these multiples of the length, e.g. 1,2,4,8,16"},
        {"compare", OPT_STRING, &compare, "run directory of a second model: Delta NLL by position"},
        {"out", OPT_STRING, &out, "directory for the CSV and SVG files (default: <model>/eval)"},
        {"backend", OPT_STRING, &backend, "cpu or cuda"},
        {"gpus", OPT_INT, &gpus,
         "split every batch over this many GPUs, one process each with --batch sequences (cpu, ref: processes)"},
    };
    int st = parse_args(argc, argv, "[options]", opts, sizeof opts / sizeof opts[0], NULL, NULL, 0);
    if (st) return st == 2 ? 0 : 1;
    if (batch < 1) die("--batch must be >= 1, got %d", batch);
    Group g;
    int code;
    if (!ranks_begin("eval", gpus, &g, &code)) return code;
    int lead = g.rank == 0;  // rank 0 speaks and writes for the group
    if (!lead && !freopen("/dev/null", "w", stdout)) die("/dev/null: cannot open");
    EvalSetup e = {NULL, batch, batches, backend_by_name(backend), &g};
    if (!e.be) die("%s", mn_last_error());
    char path[4096], outdir[4096], shard_path[4096];
    Model *m, *other = NULL;
    if (checkpoint_load_model(run, e.be, &m)) die("%s", mn_last_error());
    if (compare && checkpoint_load_model(compare, e.be, &other)) die("%s", mn_last_error());
    if (!shard) {
        snprintf(shard_path, sizeof shard_path, "%s/valid.bin", data ? data : "data/demo");
        shard = shard_path;
    }
    e.shard = shard;
    snprintf(outdir, sizeof outdir, "%s", out ? out : run);
    if (!out) snprintf(outdir, sizeof outdir, "%s/eval", run);
    if (lead) mkdir(outdir, 0755);
    int T = seq > 0 ? seq : m->cfg.seq_len;
    int train_steps = m->cfg.cg_steps, use_steps = steps > 0 ? steps : train_steps;

    EvalResult r;
    if (evaluate(m, &e, T, use_steps, tol, &r)) die("%s", mn_last_error());
    double nll = mean_nll(&r);
    printf("%s on %s: %d sequences of %d tokens, %.0f scored\n", run, shard, r.batches * batch * g.size, T, r.count);
    if (g.size > 1) printf("  split over %d ranks, %d sequences of every batch each\n", g.size, batch);
    printf("  loss %.4f nats/token, perplexity %.3f, mean CG steps %.2f (max %d%s)\n", nll, exp(nll), r.cg_steps,
           use_steps, tol > 0 ? ", tolerance" : "");

    // NLL by position, and against the second model
    double *pos = xcalloc((size_t)T, 8), *sofar = xcalloc((size_t)T, 8), *x = xcalloc((size_t)T, 8);
    double *opos = xcalloc((size_t)T, 8), *osofar = xcalloc((size_t)T, 8), *delta = xcalloc((size_t)T, 8);
    per_position(&r, pos, sofar);
    for (int t = 0; t < T; t++) x[t] = t + 1;
    if (other) {
        EvalResult ro;
        if (evaluate(other, &e, T, other->cfg.cg_steps, 0, &ro)) die("%s", mn_last_error());
        per_position(&ro, opos, osofar);
        printf("  %s: loss %.4f, perplexity %.3f\n", compare, mean_nll(&ro), exp(mean_nll(&ro)));
        for (int t = 0; t < T; t++) delta[t] = pos[t] - opos[t];
        eval_free(&ro);
    }
    const char *cols[6] = {"position", "nll", "mean_so_far", "nll_other", "mean_so_far_other", "delta_nll"};
    const double *data_cols[6] = {x, pos, sofar, opos, osofar, delta};
    snprintf(path, sizeof path, "%s/nll_by_position.csv", outdir);
    if (lead && csv_write(path, cols, other ? 6 : 3, data_cols, T)) die("%s", mn_last_error());
    PlotSeries ps[2] = {{run, x, pos, T}, {compare, x, opos, T}};
    PlotOpts po = {"NLL by token position", "token position", "NLL (nats)", 1, 0, 0, 0};
    snprintf(path, sizeof path, "%s/nll_by_position.svg", outdir);
    if (lead && plot_svg(path, &po, ps, other ? 2 : 1)) die("%s", mn_last_error());
    printf("  wrote %s/nll_by_position.csv and .svg\n", outdir);
    if (other) {
        PlotSeries ds = {"Delta NLL", x, delta, T};
        char title[256];
        snprintf(title, sizeof title, "Delta NLL by position: %s minus %s (negative: first is better)", run, compare);
        PlotOpts pd = {title, "token position", "Delta NLL (nats)", 1, 0, 0, 0};
        snprintf(path, sizeof path, "%s/delta_nll.svg", outdir);
        if (lead && plot_svg(path, &pd, &ds, 1)) die("%s", mn_last_error());
        printf("  wrote %s/delta_nll.svg\n", outdir);
    }
    eval_free(&r);

    if (lengths) {  // length extrapolation
        int mult[16];
        int nm = parse_ints(lengths, mult, 16);
        if (nm <= 0) die("--lengths takes comma-separated positive integers");
        printf("\nlength extrapolation (trained at %d):\n  %8s %10s %12s %10s\n", m->cfg.seq_len, "length", "loss",
               "perplexity", "CG steps");
        for (int i = 0; i < nm; i++) {
            int L = m->cfg.seq_len * mult[i];
            EvalResult rl;
            EvalSetup el = e;
            el.batch = batch / mult[i] > 0 ? batch / mult[i] : 1;  // about the same tokens per batch
            if (evaluate(m, &el, L, use_steps, tol, &rl)) {
                printf("  %8d %s\n", L, mn_last_error());
                continue;
            }
            printf("  %8d %10.4f %12.3f %10.2f\n", L, mean_nll(&rl), exp(mean_nll(&rl)), rl.cg_steps);
            eval_free(&rl);
        }
    }

    if (sweep) {  // dynamic test-time compute
        const struct {
            int steps;
            float tol;
        } settings[] = {{1, 0}, {2, 0}, {5, 0}, {10, 0}, {30, 0}, {100, 1e-2f}, {100, 1e-3f}, {100, 1e-4f}, {100, 1e-5f}};
        int ns = (int)(sizeof settings / sizeof settings[0]);
        double *curves[9];
        char *names[9];
        printf("\nCG steps and accuracy:\n  %-14s %10s %12s %12s\n", "setting", "loss", "perplexity", "mean steps");
        for (int i = 0; i < ns; i++) {
            EvalResult rs;
            if (evaluate(m, &e, T, settings[i].steps, settings[i].tol, &rs)) die("%s", mn_last_error());
            names[i] = malloc(32);
            if (settings[i].tol > 0) snprintf(names[i], 32, "tol %.0e", (double)settings[i].tol);
            else snprintf(names[i], 32, "%d steps", settings[i].steps);
            printf("  %-14s %10.4f %12.3f %12.2f\n", names[i], mean_nll(&rs), exp(mean_nll(&rs)), rs.cg_steps);
            curves[i] = xcalloc((size_t)T, 8);
            double *tmp = xcalloc((size_t)T, 8);
            per_position(&rs, curves[i], tmp);
            free(tmp);
            eval_free(&rs);
        }
        PlotSeries sp[9];
        for (int i = 0; i < ns; i++) sp[i] = (PlotSeries){names[i], x, curves[i], T};
        PlotOpts pc = {"NLL by position for CG budgets", "token position", "NLL (nats)", 1, 0, 0, 0};
        snprintf(path, sizeof path, "%s/cg_sweep.svg", outdir);
        if (lead && plot_svg(path, &pc, sp, ns)) die("%s", mn_last_error());
        const char *ccols[10];
        const double *cdata[10];
        ccols[0] = "position";
        cdata[0] = x;
        for (int i = 0; i < ns; i++) {
            ccols[i + 1] = names[i];
            cdata[i + 1] = curves[i];
        }
        snprintf(path, sizeof path, "%s/cg_sweep.csv", outdir);
        if (lead && csv_write(path, ccols, ns + 1, cdata, T)) die("%s", mn_last_error());
        printf("  wrote %s/cg_sweep.csv and .svg\n", outdir);
        for (int i = 0; i < ns; i++) {
            free(curves[i]);
            free(names[i]);
        }
    }
    free(pos); free(sofar); free(x); free(opos); free(osofar); free(delta);
    model_free(m);
    if (other) model_free(other);
    group_close(&g);
    return 0;
}
