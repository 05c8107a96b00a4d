#include "trainer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/atomic_file.h"
#include "core/common.h"
#include "data/loader.h"
#include "eval/eval.h"
#include "eval/plot.h"
#include "train/checkpoint.h"
#include "train/optim.h"

void train_options_default(TrainOptions *o) {
    memset(o, 0, sizeof *o);
    o->config = "demo";
    o->data = "data/demo";
    o->out = "runs/demo";
    o->backend = "cpu";
    o->batch = 16;
    o->seq = 256;
    o->accum = 1;
    o->steps = 1000;
    o->warmup = 100;
    o->lr = 3e-3f;
    o->lr_final = 0.1f;
    o->weight_decay = 0.1f;
    o->clip = 1.0f;
    o->beta1 = 0.9f;
    o->beta2 = 0.95f;
    o->eval_every = 100;
    o->eval_batches = 20;
    o->save_every = 200;
    o->log_every = 10;
    o->seed = 1;
    o->resume = 1;
}

// One row of the loss curve.
typedef struct {
    double step, loss, lr, grad_norm, tokens, seconds, val_loss;
} Row;

enum { NCOLS = 7 };
static const char *const columns[NCOLS] = {"step", "loss", "lr", "grad_norm", "tokens", "seconds", "val_loss"};

typedef struct {
    Row *rows;
    int n, cap;
} History;

static int history_add(History *h, Row r) {
    if (h->n == h->cap) {
        int nc = h->cap ? 2 * h->cap : 256;
        Row *nr = realloc(h->rows, sizeof(Row) * (size_t)nc);
        if (!nr) return mn_error(MN_ERR_NOMEM, "out of memory");
        h->rows = nr;
        h->cap = nc;
    }
    h->rows[h->n++] = r;
    return MN_OK;
}

// Reads back loss.csv (our own file) up to `step`, for a resumed run.
static int history_load(History *h, const char *path, int step) {
    FILE *f = fopen(path, "r");
    if (!f) return MN_OK;  // no curve yet
    char line[1024];
    int s = MN_OK;
    if (!fgets(line, sizeof line, f)) goto done;  // header
    while (!s && fgets(line, sizeof line, f)) {
        Row r;
        double *v = &r.step;
        char *p = line, *end;
        for (int i = 0; i < NCOLS; i++) {
            v[i] = strtod(p, &end);
            if (end == p && strncmp(p, "nan", 3) && strncmp(p, "NaN", 3)) {
                s = mn_error(MN_ERR_FORMAT, "%s: malformed row '%s'", path, line);
                break;
            }
            p = end + (*end == ',');
        }
        if (!s && r.step <= step) s = history_add(h, r);
    }
done:
    fclose(f);
    return s;
}

static int history_save(const History *h, const char *dir) {
    char path[4096];
    double *cols[NCOLS];
    for (int c = 0; c < NCOLS; c++) {
        cols[c] = malloc(sizeof(double) * (size_t)(h->n ? h->n : 1));
        if (!cols[c]) return mn_error(MN_ERR_NOMEM, "out of memory");
        for (int i = 0; i < h->n; i++) cols[c][i] = (&h->rows[i].step)[c];
    }
    snprintf(path, sizeof path, "%s/loss.csv", dir);
    int s = csv_write(path, columns, NCOLS, (const double *const *)cols, h->n);
    if (!s && h->n > 0) {
        // validation points only where measured
        int nv = 0;
        double *vx = malloc(sizeof(double) * (size_t)h->n), *vy = malloc(sizeof(double) * (size_t)h->n);
        for (int i = 0; i < h->n && vx && vy; i++)
            if (!isnan(h->rows[i].val_loss)) {
                vx[nv] = h->rows[i].step;
                vy[nv++] = h->rows[i].val_loss;
            }
        PlotSeries series[2] = {{"train loss", cols[0], cols[1], h->n}, {"validation loss", vx, vy, nv}};
        PlotOpts po = {"Training loss", "step", "loss (nats per token)", 0, 0, 0, 0};
        snprintf(path, sizeof path, "%s/loss.svg", dir);
        s = plot_svg(path, &po, series, nv > 0 ? 2 : 1);
        free(vx);
        free(vy);
    }
    for (int c = 0; c < NCOLS; c++) free(cols[c]);
    return s;
}

static void fmt_duration(char *buf, size_t n, double s) {
    if (s < 60) snprintf(buf, n, "%.0fs", s);
    else if (s < 3600) snprintf(buf, n, "%dm%02ds", (int)s / 60, (int)s % 60);
    else snprintf(buf, n, "%dh%02dm", (int)s / 3600, ((int)s % 3600) / 60);
}

// Copies src to dst atomically; MN_ERR_IO (without a message) when src is absent.
static int copy_file(const char *src, const char *dst) {
    FILE *in = fopen(src, "rb");
    if (!in) return MN_ERR_IO;  // optional: the caller decides
    AtomicFile af;
    int s = af_open(&af, dst);
    if (s) {
        fclose(in);
        return s;
    }
    char buf[1 << 16];
    size_t n;
    while (!s && (n = fread(buf, 1, sizeof buf, in)) > 0) s = af_write(&af, buf, n);
    if (!s && ferror(in)) s = mn_error(MN_ERR_IO, "%s: read failed", src);
    fclose(in);
    if (s) {
        af_abort(&af);
        return s;
    }
    return af_commit(&af);
}

static int make_dir(const char *path) {
    struct stat st;
    if (!mkdir(path, 0755) || (!stat(path, &st) && S_ISDIR(st.st_mode))) return MN_OK;
    return mn_error(MN_ERR_IO, "%s: cannot create the directory", path);
}

// Mean validation loss over the first eval_batches batches of the split, each rank scoring its
// rows of every batch.
static int validate(Model *m, Group *g, DataLoader *valid, int batches, double *loss, double *cg) {
    MN_TRY(loader_set_position(valid, 0, 0));
    EvalResult r;
    int rows = valid->B / g->size;
    MN_TRY(eval_run_rows(m, valid, batches, g->rank * rows, rows, &r));
    int s = group_sum_eval(g, &r);
    *loss = r.count > 0 ? r.nll_sum / r.count : NAN;
    *cg = r.cg_steps;
    eval_free(&r);
    return s;
}

static int check_options(const TrainOptions *o) {
    if (o->batch <= 0 || o->seq <= 0 || o->accum <= 0 || o->steps <= 0)
        return mn_error(MN_ERR_ARG, "train: batch, seq, accum and steps must be > 0");
    if (o->warmup < 0 || o->warmup > o->steps) return mn_error(MN_ERR_ARG, "train: warmup must be in [0, steps]");
    if (!(o->lr > 0)) return mn_error(MN_ERR_ARG, "train: lr must be > 0");
    if (o->eval_every < 0 || o->save_every < 0 || o->log_every <= 0)
        return mn_error(MN_ERR_ARG, "train: eval_every and save_every must be >= 0, log_every > 0");
    return MN_OK;
}

int train_run(const TrainOptions *o, FILE *log) {
    MN_TRY(check_options(o));
    const Backend *be = backend_by_name(o->backend);
    if (!be) return MN_ERR_ARG;
    Group alone = {.rank = 0, .size = 1};
    Group *g = o->group ? o->group : &alone;
    MN_TRY(group_connect(g, be));
    FILE *quiet = NULL;
    if (g->rank > 0 && !(log = quiet = fopen("/dev/null", "w")))  // rank 0 speaks for the group
        return mn_error(MN_ERR_IO, "/dev/null: cannot open");
    int lead = g->rank == 0;
    MN_TRY(make_dir(o->out));
    char train_path[4096], valid_path[4096], path[4096];
    snprintf(train_path, sizeof train_path, "%s/train.bin", o->data);
    snprintf(valid_path, sizeof valid_path, "%s/valid.bin", o->data);

    Model *m = NULL;
    AdamW opt = {.beta1 = o->beta1, .beta2 = o->beta2, .eps = 1e-8f, .weight_decay = o->weight_decay, .clip = o->clip};
    TrainState st = {.seed = o->seed};
    History hist = {0};
    DataLoader train = {0}, valid = {0};
    int32_t *in = NULL, *tg = NULL;
    int s;
    int resumed = o->resume && checkpoint_exists(o->out);
    if (resumed) {
        if ((s = checkpoint_load_model(o->out, be, &m))) goto done;
        if ((s = adamw_init(&opt, m)) || (s = checkpoint_load_state(o->out, m, &opt, &st))) goto done;
        snprintf(path, sizeof path, "%s/loss.csv", o->out);
        if ((s = history_load(&hist, path, st.step))) goto done;
        fprintf(log, "train: resuming %s at step %d (%.0f tokens seen)\n", o->out, st.step, st.tokens);
    } else {
        ModelConfig cfg;
        TokenShard probe;
        if ((s = config_load(&cfg, o->config)) || (s = shard_read(train_path, &probe))) goto done;
        if (cfg.vocab_size == 0) cfg.vocab_size = (int)probe.vocab_size;  // the preset leaves it to the data
        if (probe.vocab_size > (uint32_t)cfg.vocab_size)
            s = mn_error(MN_ERR_ARG, "%s: vocabulary of %u tokens does not fit the model's vocab_size %d", train_path,
                         probe.vocab_size, cfg.vocab_size);
        shard_free(&probe);
        if (s) goto done;
        if (o->cg_steps > 0) cfg.cg_steps = o->cg_steps;
        // The config records the training context; the forget-gate bound follows it unless set apart.
        if (cfg.gate_bound == (float)cfg.seq_len) cfg.gate_bound = (float)o->seq;
        cfg.seq_len = o->seq;
        if ((s = model_create(&m, &cfg, be)) || (s = model_init_params(m, o->seed)) || (s = adamw_init(&opt, m))) goto done;
    }
    // The tokenizer travels with the run, so that generate needs only the run directory.
    const char *tok_files[2] = {"encoder.json", "vocab.bpe"};
    for (int i = 0; i < 2 && lead; i++) {
        char src[4096];
        snprintf(src, sizeof src, "%s/%s", o->data, tok_files[i]);
        snprintf(path, sizeof path, "%s/%s", o->out, tok_files[i]);
        int cs = copy_file(src, path);
        if (cs && cs != MN_ERR_IO) {
            s = cs;
            goto done;
        }
    }
    // Every rank draws the whole step's batch (so that the data order does not depend on the number
    // of ranks) and trains on its own `batch` rows of each micro-batch.
    int ranks = g->size;
    if ((s = loader_open(&train, train_path, o->batch * ranks, o->seq, st.seed, 1))) goto done;
    if ((s = loader_open(&valid, valid_path, o->batch * ranks, o->seq, 0, 0))) goto done;
    if (resumed && (s = loader_set_position(&train, st.epoch, st.index))) goto done;

    size_t N = (size_t)o->batch * o->seq, NR = N * (size_t)ranks;  // tokens of a rank's, of all ranks' micro-batch
    in = malloc(sizeof(int32_t) * NR * (size_t)o->accum);
    tg = malloc(sizeof(int32_t) * NR * (size_t)o->accum);
    if (!in || !tg) {
        s = mn_error(MN_ERR_NOMEM, "out of memory");
        goto done;
    }
    LrSchedule sched = {o->lr, o->warmup, o->steps, o->lr_final};
    fprintf(log, "train: %s model, %zu parameters, %s backend; %d x %d tokens x %d accumulation per step, %d steps\n",
            m->cfg.arch, m->count, be->name, o->batch * ranks, o->seq, o->accum, o->steps);
    if (ranks > 1)
        fprintf(log, "train: data-parallel over %d ranks of %d sequences each, gradients summed %s\n", ranks, o->batch,
                g->be ? "by the backend's collective (NCCL)" : "through the host");
    double t_start = mn_now(), t_last = t_start, elapsed0 = st.elapsed, tok_rate = 0;
    int last_saved = st.step;
    while (st.step < o->steps) {
        float lr = lr_at(&sched, st.step);
        // All micro-batches first: the loss is averaged over every scored token of the step.
        double scored = 0;  // over all ranks' tokens, which every rank has
        for (int a = 0; a < o->accum && !s; a++) s = loader_next(&train, in + (size_t)a * NR, tg + (size_t)a * NR);
        if (s) break;
        for (size_t i = 0; i < NR * (size_t)o->accum; i++) scored += tg[i] >= 0;
        if (scored == 0) {
            s = mn_error(MN_ERR_ARG, "train: step %d has no scored tokens (all targets are document starts)", st.step);
            break;
        }
        if ((s = model_zero_grad(m))) break;
        double loss_sum = 0;
        for (int a = 0; a < o->accum && !s; a++) {
            double l;
            size_t mine = (size_t)a * NR + (size_t)g->rank * N;
            s = model_forward(m, in + mine, tg + mine, o->batch, o->seq, (float)(1.0 / scored), &l);
            if (!s && a == o->accum - 1) group_grads_begin(g, m);  // summed over the ranks as they complete
            if (!s) s = model_backward(m);
            loss_sum += l;
        }
        double gnorm;
        if (s || (s = group_grads_end(g, m)) || (s = adamw_step(&opt, m, lr, &gnorm))) break;
        st.step++;
        st.tokens += (double)NR * o->accum;
        loader_get_position(&train, &st.epoch, &st.index);
        double now = mn_now();
        st.elapsed = elapsed0 + (now - t_start);
        double rate = (double)NR * o->accum / (now - t_last);
        tok_rate = tok_rate == 0 ? rate : 0.9 * tok_rate + 0.1 * rate;
        t_last = now;
        int time_up = (o->time_limit > 0 && st.elapsed - elapsed0 >= 60.0 * o->time_limit) ||
                      (o->stop_at > 0 && st.step >= o->stop_at);
        // The step's loss over all ranks, and rank 0's clock for all: the ranks stop together.
        double shared[2] = {loss_sum, lead ? time_up : 0};
        if ((s = group_sum_host(g, shared, 2))) break;
        time_up = shared[1] > 0;
        Row row = {st.step, shared[0] / scored, lr, gnorm, st.tokens, st.elapsed, NAN};
        if (!isfinite(row.loss)) {
            s = mn_error(MN_ERR_NUMERIC, "train: loss is %g at step %d", row.loss, st.step);
            break;
        }
        int last = st.step == o->steps || time_up;
        if (o->eval_every > 0 && (st.step % o->eval_every == 0 || last)) {
            double cg;
            if ((s = validate(m, g, &valid, o->eval_batches, &row.val_loss, &cg))) break;
            fprintf(log, "step %6d | validation loss %.4f | perplexity %.2f | CG steps %.1f\n", st.step, row.val_loss,
                    exp(row.val_loss), cg);
        }
        if ((s = history_add(&hist, row))) break;
        if (st.step % o->log_every == 0 || st.step == 1 || last) {
            char el[32], eta[32];
            fmt_duration(el, sizeof el, st.elapsed);
            fmt_duration(eta, sizeof eta, (o->steps - st.step) * (double)NR * o->accum / tok_rate);
            fprintf(log, "step %6d/%d | loss %.4f | lr %.2e | grad %.3f | %.0f tok/s | %s | ETA %s\n", st.step, o->steps,
                    row.loss, lr, gnorm, tok_rate, el, eta);
            fflush(log);
        }
        if (lead && ((o->save_every > 0 && st.step % o->save_every == 0) || last)) {
            if ((s = checkpoint_save_model(o->out, m, st.step)) || (s = checkpoint_save_state(o->out, m, &opt, &st)) ||
                (s = history_save(&hist, o->out)))
                break;
            last_saved = st.step;
        }
        if (time_up) {
            fprintf(log, "train: stopping at step %d (time limit or --stop-at); saved, resume with the same command\n",
                    st.step);
            break;
        }
    }
    if (!s && lead && last_saved != st.step) {
        if (!(s = checkpoint_save_model(o->out, m, st.step)) && !(s = checkpoint_save_state(o->out, m, &opt, &st)))
            s = history_save(&hist, o->out);
    }
    if (!s) fprintf(log, "train: done, step %d; checkpoint, loss.csv and loss.svg in %s\n", st.step, o->out);
done:
    if (quiet) fclose(quiet);
    free(in);
    free(tg);
    free(hist.rows);
    loader_close(&train);
    loader_close(&valid);
    if (m) {
        adamw_free(&opt, m);
        model_free(m);
    }
    return s;
}
