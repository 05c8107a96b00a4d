#include "trainer.h"

#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/registry.h"
#include "core/atomic_file.h"
#include "core/common.h"
#include "data/loader.h"
#include "data/tokenizer_id.h"
#include "eval/eval.h"
#include "train/checkpoint.h"
#include "train/loss_log.h"
#include "train/optim.h"
#include "train/run_info.h"
#include "train/step.h"

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

static void fmt_duration(char *buf, size_t n, double s) {
    if (s < 60) snprintf(buf, n, "%.0fs", s);
    else if (s < 3600) snprintf(buf, n, "%dm%02ds", (int)s / 60, (int)s % 60);
    else snprintf(buf, n, "%dh%02dm", (int)s / 3600, ((int)s % 3600) / 60);
}

void train_eta(char *buf, size_t n, int steps_left, int timed, double seconds) {
    if (timed < 2 || !(seconds > 0)) snprintf(buf, n, "--");
    else fmt_duration(buf, n, steps_left * (seconds / timed));
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
    if (o->batch < 0 || o->seq < 0 || o->accum < 0 || o->steps <= 0)
        return mn_error(MN_ERR_ARG, "train: batch, seq and accum must be > 0 (or 0: unset), steps > 0");
    if (o->warmup < 0 || o->warmup > o->steps) return mn_error(MN_ERR_ARG, "train: warmup must be in [0, steps]");
    if (!(o->lr > 0)) return mn_error(MN_ERR_ARG, "train: lr must be > 0");
    if (o->eval_every < 0 || o->save_every < 0 || o->log_every <= 0)
        return mn_error(MN_ERR_ARG, "train: eval_every and save_every must be >= 0, log_every > 0");
    if (!o->out || !o->out[0]) return mn_error(MN_ERR_ARG, "train: no run directory (out)");
    return MN_OK;
}

// What a run trains with: the options, the unset ones filled from the resumed run or the defaults.
typedef struct {
    const char *config, *data;
    int batch, seq, accum;  // batch: this rank's sequences per micro-batch
} Settings;

// The config of a fresh run: the named one, with the vocabulary of the data where it leaves it
// open (vocab, 0: not known here), the training context and the CG steps of the options.
static int run_config(const TrainOptions *o, const Settings *set, int vocab, ModelConfig *cfg) {
    MN_TRY(config_load(cfg, set->config));
    if (cfg->vocab_size == 0) cfg->vocab_size = vocab;  // the preset leaves it to the data
    if (o->cg_steps > 0 && !model_uses_cg(cfg))
        return mn_error(MN_ERR_ARG, "--cg-steps %d: no block of mixer \"%s\" solves with CG (only Mesa layers do)",
                        o->cg_steps, cfg->mixer);
    if (o->cg_steps > 0) cfg->cg_steps = o->cg_steps;
    // The config records the training context; the forget-gate bound follows it unless set apart.
    if (cfg->gate_bound == (float)cfg->seq_len) cfg->gate_bound = (float)set->seq;
    cfg->seq_len = set->seq;
    config_normalize(cfg);  // (the bound stays at its default where no mixer reads it)
    return config_validate(cfg, "train");
}

// Refuses an option that differs from the resumed run's setting.
static int refuse_change(const char *out, const char *option, const char *given, const char *run_value, const char *more) {
    return mn_error(MN_ERR_ARG,
                    "%s %s differs from the run's %s%s in %s: resuming would %s; resume with the run's settings, or "
                    "start afresh with --no-resume (which replaces its checkpoint) or another --out",
                    option, given, run_value, more, out,
                    !strcmp(option, "--config") || !strcmp(option, "--cg-steps") ? "continue with the run's own model"
                                                                                 : "change what its data position and steps mean");
}

static int refuse_int_change(const char *out, const char *option, int given, int run_value) {
    char g[32], r[32];
    snprintf(g, sizeof g, "%d", given);
    snprintf(r, sizeof r, "%d", run_value);
    return refuse_change(out, option, g, r, "");
}

// The settings of a resumed run: each option given must be the run's (from its run.json, ri, where
// it has one; an older run without one is checked for its config and seq only).
static int resume_settings(const TrainOptions *o, int ranks, const Model *m, const RunInfo *ri, Settings *set) {
    int run_seq = ri ? ri->seq : m->cfg.seq_len;
    if (o->seq && o->seq != run_seq) return refuse_int_change(o->out, "--seq", o->seq, run_seq);
    set->seq = run_seq;
    const struct {
        const char *option;
        int given, run, *dst, fallback;
    } sizes[] = {{"--batch", o->batch, ri ? ri->batch : 0, &set->batch, 16}, {"--accum", o->accum, ri ? ri->accum : 0, &set->accum, 1}};
    for (int i = 0; i < 2; i++) {
        int given = sizes[i].given, run = sizes[i].run, per_rank = i == 0;  // the batch is per rank, the run's of all
        long long total = per_rank ? (long long)given * ranks : given;
        if (given && run && total != run) {
            if (!per_rank || ranks == 1) return refuse_int_change(o->out, sizes[i].option, given, run);
            char g[80], r[32];
            snprintf(g, sizeof g, "%d (x %d ranks: %lld sequences)", given, ranks, total);
            snprintf(r, sizeof r, "%d", run);
            return refuse_change(o->out, sizes[i].option, g, r, "");
        }
        if (!given && run && per_rank && run % ranks)
            return mn_error(MN_ERR_ARG, "the run's batch of %d sequences does not split over %d ranks: give --batch", run,
                            ranks);
        *sizes[i].dst = given ? given : run ? (per_rank ? run / ranks : run) : sizes[i].fallback;
    }
    if (o->cg_steps > 0 && o->cg_steps != m->cfg.cg_steps)
        return refuse_int_change(o->out, "--cg-steps", o->cg_steps, m->cfg.cg_steps);
    set->config = o->config ? o->config : ri ? ri->config : "demo";
    set->data = o->data ? o->data : ri ? ri->data : "data/demo";
    if (o->config) {  // the config it names, made as a fresh run would, against the run's
        ModelConfig given;
        char diff[256], more[300], run_name[1100];
        TrainOptions same = *o;
        same.cg_steps = model_uses_cg(&m->cfg) ? m->cfg.cg_steps : 0;  // (refused where no layer uses CG)
        MN_TRY(run_config(&same, set, m->cfg.vocab_size, &given));
        if (config_diff(&given, &m->cfg, diff, sizeof diff)) {
            snprintf(more, sizeof more, " (%s)", diff);
            snprintf(run_name, sizeof run_name, "%s", ri ? ri->config : "config (its config.json)");
            return refuse_change(o->out, "--config", o->config, run_name, more);
        }
    }
    return MN_OK;
}

// The settings of a fresh run: the options, the defaults where unset.
static void fresh_settings(const TrainOptions *o, Settings *set) {
    set->config = o->config ? o->config : "demo";
    set->data = o->data ? o->data : "data/demo";
    set->batch = o->batch ? o->batch : 16;
    set->seq = o->seq ? o->seq : 256;
    set->accum = o->accum ? o->accum : 1;
}

// The run's loss curve up to its checkpoint's step, for a resumed run: a missing or damaged
// loss.csv is refused (resuming would silently lose the history before the checkpoint).
static int load_history(const char *out, int step, LossLog *hist) {
    char path[4096], why[1024];
    snprintf(path, sizeof path, "%s/loss.csv", out);
    int s = loss_log_read(path, hist);
    if (s) {
        snprintf(why, sizeof why, "%s", mn_last_error());
        return mn_error(s, "%s (the run's loss history, which resuming continues; restore it, or start afresh with "
                        "--no-resume)", why);
    }
    if (hist->n < step) {
        s = mn_error(MN_ERR_FORMAT, "%s: its rows end at step %d, but the checkpoint is at step %d", path, hist->n, step);
        loss_log_free(hist);
        return s;
    }
    hist->n = step;  // rows written after the checkpoint, by a save that did not complete
    return MN_OK;
}

// The checkpoint of st->step as a set (checkpoint.h), with the loss curve up to it written before
// the switch to it: a resumed run finds the rows up to its checkpoint's step.
static int save_checkpoint(const char *out, const Model *m, const AdamW *opt, const TrainState *st, const LossLog *hist) {
    MN_TRY(checkpoint_save_set(out, m, opt, st));
    MN_TRY(loss_log_write(hist, out));
    MN_TRY(checkpoint_stop_point("history", st->step));
    return checkpoint_commit(out, st->step);
}

// run.json for a run (re)started with these settings.
static int write_run_info(const char *out, const Settings *set, int ranks, uint64_t train_tokens) {
    RunInfo ri;
    memset(&ri, 0, sizeof ri);
    char resolved[PATH_MAX];
    snprintf(ri.config, sizeof ri.config, "%s", set->config);
    snprintf(ri.data, sizeof ri.data, "%s", realpath(set->data, resolved) ? resolved : set->data);
    snprintf(ri.data_given, sizeof ri.data_given, "%s", set->data);
    ri.seq = set->seq;
    ri.batch = set->batch * ranks;
    ri.accum = set->accum;
    ri.train_tokens = train_tokens;
    return run_info_write(out, &ri);
}

// A resumed run given its data at another place (the same tokens: checked before) records the new
// one, where eval looks for it.
static int note_moved_data(const char *out, const RunInfo *ri, const char *data) {
    char resolved[PATH_MAX];
    if (!realpath(data, resolved) || !strcmp(resolved, ri->data)) return MN_OK;
    RunInfo moved = *ri;
    snprintf(moved.data, sizeof moved.data, "%s", resolved);
    snprintf(moved.data_given, sizeof moved.data_given, "%s", data);
    return run_info_write(out, &moved);
}

// The tokenizer travels with the run, so that generate needs only the run directory and eval can
// check that data was made with it (data/tokenizer_id.h).
static int copy_tokenizer(const char *data, const char *out) {
    for (int i = 0; i < TOKENIZER_NFILES; i++) {
        char src[4096], dst[4096];
        snprintf(src, sizeof src, "%s/%s", data, tokenizer_files[i]);
        snprintf(dst, sizeof dst, "%s/%s", out, tokenizer_files[i]);
        if (!access(src, F_OK)) MN_TRY(af_copy(src, dst));  // (data without a tokenizer: none to copy)
    }
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
    int lead = g->rank == 0, ranks = g->size;
    char train_path[4096], valid_path[4096];

    Model *m = NULL;
    AdamW opt = {.beta1 = o->beta1, .beta2 = o->beta2, .eps = 1e-8f, .weight_decay = o->weight_decay, .clip = o->clip};
    TrainState st = {.seed = o->seed};
    LossLog hist = {0};
    DataLoader train = {0}, valid = {0};
    int32_t *in = NULL, *tg = NULL;
    TrainStep ts = {0};
    RunInfo ri;
    Settings set = {0};
    int found = 0, have_ri = 0, s = mn_mkdirs(o->out);  // with its parents
    if (!s && o->resume) s = checkpoint_find(o->out, &found);
    if (!s && found && run_info_exists(o->out)) have_ri = !(s = run_info_read(o->out, &ri));
    int resumed = found;
    if (s) goto done;
    if (resumed) {
        if ((s = checkpoint_load_model(o->out, be, &m))) goto done;
        if ((s = resume_settings(o, ranks, m, have_ri ? &ri : NULL, &set))) goto done;
        if ((s = adamw_init(&opt, m)) || (s = checkpoint_load_state(o->out, m, &opt, &st))) goto done;
        if ((s = load_history(o->out, st.step, &hist))) goto done;
        fprintf(log, "train: resuming %s at step %d (%.0f tokens seen)\n", o->out, st.step, st.tokens);
    } else {
        if (lead && !o->resume && (s = checkpoint_remove_all(o->out))) goto done;  // afresh: the old run goes
        fresh_settings(o, &set);
        ModelConfig cfg;
        TokenShard probe;
        snprintf(train_path, sizeof train_path, "%s/train.bin", set.data);
        if ((s = config_load(&cfg, set.config)) || (s = shard_read(train_path, &probe))) goto done;
        s = run_config(o, &set, (int)probe.vocab_size, &cfg);
        if (!s && probe.vocab_size > (uint32_t)cfg.vocab_size)
            s = mn_error(MN_ERR_ARG, "%s: vocabulary of %u tokens does not fit the model's vocab_size %d", train_path,
                         probe.vocab_size, cfg.vocab_size);
        shard_free(&probe);
        if (s) goto done;
        if ((s = model_create(&m, &cfg, be)) || (s = model_init_params(m, o->seed)) || (s = adamw_init(&opt, m))) goto done;
    }
    m->solver.precision = o->lin_precision;
    snprintf(train_path, sizeof train_path, "%s/train.bin", set.data);
    snprintf(valid_path, sizeof valid_path, "%s/valid.bin", set.data);
    // Every rank draws the whole step's batch (so that the data order does not depend on the number
    // of ranks) and trains on its own `batch` rows of each micro-batch.
    if ((long long)set.batch * ranks * set.seq > INT_MAX) {
        s = mn_error(MN_ERR_ARG, "train: %d sequences x %d ranks x %d tokens = %lld tokens per micro-batch, at most %d",
                     set.batch, ranks, set.seq, (long long)set.batch * ranks * set.seq, INT_MAX);
        goto done;
    }
    size_t N = (size_t)set.batch * set.seq, NR = N * (size_t)ranks;  // tokens of a rank's, of all ranks' micro-batch
    // Before the batch's buffers: a batch that cannot fit is refused now, naming one that does.
    MemNeeds needs = {"train", 2 * sizeof(int32_t) * (size_t)set.seq * (size_t)ranks * (size_t)set.accum,
                      2 * m->total * be->elem_size(be, MEM_F32), ranks};
    if ((s = model_check_batch(m, set.batch, set.seq, &needs))) goto done;
    if ((s = loader_open(&train, train_path, set.batch * ranks, set.seq, st.seed, 1))) goto done;
    if ((s = loader_open(&valid, valid_path, set.batch * ranks, set.seq, 0, 0))) goto done;
    if (resumed && have_ri && train.shard.n_tokens != ri.train_tokens) {
        s = mn_error(MN_ERR_ARG,
                     "--data %s holds %" PRIu64 " training tokens, but the run in %s was trained on %s with %" PRIu64
                     ": resuming would change what its data position means; resume with the run's data, or start afresh "
                     "with --no-resume or another --out",
                     set.data, train.shard.n_tokens, o->out, ri.data, ri.train_tokens);
        goto done;
    }
    if (resumed && (s = loader_set_position(&train, st.epoch, st.index))) goto done;
    if (lead && (!resumed || !have_ri) && (s = write_run_info(o->out, &set, ranks, train.shard.n_tokens))) goto done;
    if (lead && resumed && have_ri && (s = note_moved_data(o->out, &ri, set.data))) goto done;
    if (lead && (s = copy_tokenizer(set.data, o->out))) goto done;

    in = malloc(sizeof(int32_t) * NR * (size_t)set.accum);
    tg = malloc(sizeof(int32_t) * NR * (size_t)set.accum);
    if (!in || !tg) {
        s = mn_error(MN_ERR_NOMEM, "out of memory");
        goto done;
    }
    LrSchedule sched = {o->lr, o->warmup, o->steps, o->lr_final};
    if (ranks == 1 && (s = train_step_init(&ts, m, &opt))) goto done;
    fprintf(log, "train: %s model, %zu parameters, %s backend; %d x %d tokens x %d accumulation per step, %d step%s\n",
            m->cfg.arch, m->count, be->name, set.batch * ranks, set.seq, set.accum, o->steps, plural_s(o->steps));
    if (ranks > 1)
        fprintf(log, "train: data-parallel over %d ranks of %d sequence%s each, gradients summed %s\n", ranks, set.batch,
                plural_s(set.batch),
                g->be ? "by the backend's collective (NCCL)" : "through the host");
    double t_start = mn_now(), t_last = t_start, t_first = 0, elapsed0 = st.elapsed, tok_rate = 0;
    int last_saved = st.step, done_here = 0;
    while (st.step < o->steps) {
        float lr = lr_at(&sched, st.step);
        // All micro-batches first: the loss is averaged over every scored token of the step.
        double scored = 0;  // over all ranks' tokens, which every rank has
        for (int a = 0; a < set.accum && !s; a++) s = loader_next(&train, in + (size_t)a * NR, tg + (size_t)a * NR);
        if (s) break;
        for (size_t i = 0; i < NR * (size_t)set.accum; i++) scored += tg[i] >= 0;
        if (scored == 0) {
            s = mn_error(MN_ERR_ARG, "train: step %d has no scored tokens (all targets are document starts)", st.step);
            break;
        }
        double loss_sum = 0, gnorm;
        if (ranks == 1) {  // the whole step on the backend (train/step.h), recorded where it can be
            if ((s = train_step(&ts, in, tg, set.batch, set.seq, set.accum, (float)(1.0 / scored), lr, &loss_sum, &gnorm)))
                break;
        } else {  // the gradients summed over the ranks as the backward completes them
            if ((s = model_zero_grad(m))) break;
            for (int a = 0; a < set.accum && !s; a++) {
                double l;
                size_t mine = (size_t)a * NR + (size_t)g->rank * N;
                s = model_forward(m, in + mine, tg + mine, set.batch, set.seq, (float)(1.0 / scored), &l);
                if (!s && a == set.accum - 1) group_grads_begin(g, m);
                if (!s) s = model_backward(m);
                loss_sum += l;
            }
            if (s || (s = group_grads_end(g, m)) || (s = adamw_step(&opt, m, lr, &gnorm))) break;
        }
        st.step++;
        st.tokens += (double)NR * set.accum;
        loader_get_position(&train, &st.epoch, &st.index);
        double now = mn_now();
        st.elapsed = elapsed0 + (now - t_start);
        double rate = (double)NR * set.accum / (now - t_last);
        // The rate of this process's first step includes its start-up: the average starts after it.
        tok_rate = done_here <= 1 ? rate : 0.9 * tok_rate + 0.1 * rate;
        t_last = now;
        if (++done_here == 1) t_first = now;
        int time_up = (o->time_limit > 0 && st.elapsed - elapsed0 >= 60.0 * o->time_limit) ||
                      (o->stop_at > 0 && st.step >= o->stop_at);
        // The step's loss over all ranks, and rank 0's clock for all: the ranks stop together.
        double shared[2] = {loss_sum, lead ? time_up : 0};
        if ((s = group_sum_host(g, shared, 2))) break;
        time_up = shared[1] > 0;
        LossRow row = {st.step, shared[0] / scored, lr, gnorm, st.tokens, st.elapsed, NAN};
        if (!isfinite(row.loss)) {
            s = mn_error(MN_ERR_NUMERIC, "train: loss is %g at step %d", row.loss, st.step);
            break;
        }
        int last = st.step == o->steps || time_up;
        // eval_every 0: at the end only (of the schedule, or of this process's share of it).
        if ((o->eval_every > 0 && st.step % o->eval_every == 0) || last) {
            double cg;
            if ((s = validate(m, g, &valid, o->eval_batches, &row.val_loss, &cg))) break;
            fprintf(log, "step %6d | validation loss %.4f | perplexity %.2f", st.step, row.val_loss, exp(row.val_loss));
            if (model_uses_cg(&m->cfg)) fprintf(log, " | CG steps %.1f", cg);
            fprintf(log, "\n");
        }
        if ((s = loss_log_add(&hist, row))) break;
        if (st.step % o->log_every == 0 || st.step == 1 || last) {
            char el[32], eta[32];
            fmt_duration(el, sizeof el, st.elapsed);
            train_eta(eta, sizeof eta, o->steps - st.step, done_here - 1, now - t_first);
            fprintf(log, "step %6d/%d | loss %.4f | lr %.2e | grad %.3f | %.0f tok/s | %s | ETA %s\n", st.step, o->steps,
                    row.loss, lr, gnorm, tok_rate, el, eta);
            fflush(log);
        }
        if (lead && ((o->save_every > 0 && st.step % o->save_every == 0) || last)) {
            if ((s = save_checkpoint(o->out, m, &opt, &st, &hist))) break;
            last_saved = st.step;
        }
        if (time_up) break;
    }
    if (!s && lead && last_saved != st.step) s = save_checkpoint(o->out, m, &opt, &st, &hist);
    if (!s && st.step < o->steps)
        fprintf(log, "train: stopped at step %d of %d (%s), unfinished; saved in %s: run the same command again to go "
                     "on from step %d\n",
                st.step, o->steps, o->stop_at > 0 && st.step >= o->stop_at ? "--stop-at" : "--time-limit", o->out,
                st.step + 1);
    else if (!s)
        fprintf(log, "train: done, step %d; checkpoint, loss.csv and loss.svg in %s\n", st.step, o->out);
done:
    if (quiet) fclose(quiet);
    free(in);
    free(tg);
    loss_log_free(&hist);
    loader_close(&train);
    loader_close(&valid);
    if (m) {
        train_step_free(&ts);
        adamw_free(&opt, m);
        model_free(m);
    }
    return s;
}
