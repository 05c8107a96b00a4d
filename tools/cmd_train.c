// mesanet train: train a language model on token shards.
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "core/common.h"
#include "model/config.h"
#include "model/presets.h"
#include "tools/commands.h"
#include "train/trainer.h"

// What the options say together, in their own names, before the trainer would refuse it
// in its field names.
static int option_given(int argc, char **argv, const char *name) {
    size_t n = strlen(name);
    for (int i = 1; i < argc; i++)
        if (!strncmp(argv[i], "--", 2) && !strncmp(argv[i] + 2, name, n) && (!argv[i][2 + n] || argv[i][2 + n] == '='))
            return 1;
    return 0;
}

static void check_combinations(const TrainOptions *o, int gpus) {
    if (o->warmup > o->steps) cmd_fail("train", "--warmup (%d) must not exceed --steps (%d)", o->warmup, o->steps);
    long long tokens = (long long)o->batch * gpus * o->seq;  // the loader's batch of all ranks, an int
    if (tokens > INT_MAX)
        cmd_fail("train", "--batch %d x --gpus %d x --seq %d = %lld tokens per micro-batch, at most %d", o->batch, gpus,
                 o->seq, tokens, INT_MAX);
}

int cmd_train(int argc, char **argv) {
    TrainOptions o;
    train_options_default(&o);
    int seed = 1, no_resume = 0, gpus = 1;
    const char *precision = "auto";
    Option opts[] = {
        {"config", OPT_STRING, &o.config, "model: " CONFIG_NAMES_HELP},
        {"data", OPT_STRING, &o.data, "directory with train.bin and valid.bin (from mesanet tokenize)"},
        {"out", OPT_STRING, &o.out, "run directory: checkpoints, loss.csv, loss.svg"},
        {"backend", OPT_STRING, &o.backend, "cpu, cuda or ref (float64, for checks)"},
        {"batch", OPT_INT, &o.batch, "sequences per micro-batch", 1, 65536},
        // at least 2: the forget-gate bound follows the context and must exceed 1 (config.c)
        {"seq", OPT_INT, &o.seq, "tokens per sequence (the training context)", 2, 1 << 24},
        {"accum", OPT_INT, &o.accum, "micro-batches per optimizer step", 1, 65536},
        {"steps", OPT_INT, &o.steps, "optimizer steps", 1, 1e9},
        {"warmup", OPT_INT, &o.warmup,
         "linear warm-up steps, at most --steps; unset, a run of fewer --steps than this default warms up for a tenth "
         "of them",
         0, 1e9},
        {"lr", OPT_FLOAT, &o.lr, "peak learning rate", 1e-9, 10},
        {"lr-final", OPT_FLOAT, &o.lr_final, "the cosine decays to this fraction of the peak", 0, 1},
        {"wd", OPT_FLOAT, &o.weight_decay, "weight decay (not on embeddings, norms, gate biases, lambda)", 0, 1},
        {"clip", OPT_FLOAT, &o.clip, "global gradient-norm clip (0: none)", 0, 1e6},
        {"eval-every", OPT_INT, &o.eval_every, "validate every this many steps (0: only at the end)", 0, 1e9},
        {"eval-batches", OPT_INT, &o.eval_batches, "validation batches (0: the whole split)", 0, 1e6},
        {"save-every", OPT_INT, &o.save_every, "checkpoint every this many steps (0: only at the end)", 0, 1e9},
        {"log-every", OPT_INT, &o.log_every, "progress line every this many steps", 1, 1e9},
        {"seed", OPT_INT, &seed, "initialisation and data-order seed", 0, INT_MAX},
        {"cg-steps", OPT_INT, &o.cg_steps, "CG steps of the Mesa layers in training (0: the config's, 30)", 0, 10000},
        {"time-limit", OPT_FLOAT, &o.time_limit, "stop and save after this many minutes (0: none)", 0, 1e7},
        {"stop-at", OPT_INT, &o.stop_at, "stop (and save) after this step; resume later with the same command (0: none)", 0, 1e9},
        {"lin-precision", OPT_STRING, &precision, LIN_PRECISION_HELP},
        {"no-resume", OPT_FLAG, &no_resume, "start afresh even if --out holds a checkpoint"},
        {"gpus", OPT_INT, &gpus,
         "data-parallel over this many GPUs, one process each with --batch sequences (cpu, ref: processes sharing the cores)",
         1, 256},
    };
    int st = parse_args(argc, argv, "[options]", opts, sizeof opts / sizeof opts[0], NULL, NULL, 0);
    if (st) return st == 2 ? 0 : 1;
    // The default warm-up suits long runs; a short one without --warmup warms up for a tenth of it.
    if (!option_given(argc, argv, "warmup") && o.warmup > o.steps) o.warmup = o.steps / 10;
    check_combinations(&o, gpus);
    o.lin_precision = lin_precision_arg("train", precision);
    o.seed = (uint64_t)seed;
    o.resume = !no_resume;
    Group g;
    int code;
    if (!ranks_begin("train", gpus, &g, &code)) return code;
    o.group = &g;
    int s = train_run(&o, stdout);
    if (s && g.size > 1) fprintf(stderr, "mesanet train (rank %d): %s\n", g.rank, mn_last_error());
    else if (s) fprintf(stderr, "mesanet train: %s\n", mn_last_error());
    group_close(&g);
    return s ? 1 : 0;
}
