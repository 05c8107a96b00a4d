// mesanet train: train a language model on token shards.
#include <stdio.h>

#include "core/common.h"
#include "tools/commands.h"
#include "train/trainer.h"

int cmd_train(int argc, char **argv) {
    TrainOptions o;
    train_options_default(&o);
    int seed = 1, no_resume = 0, gpus = 1;
    Option opts[] = {
        {"config", OPT_STRING, &o.config, "model: a preset (tiny, demo, 125m, 400m, 1b, fla-162m, fla-412m) or a JSON file"},
        {"data", OPT_STRING, &o.data, "directory with train.bin and valid.bin (from mesanet tokenize)"},
        {"out", OPT_STRING, &o.out, "run directory: checkpoints, loss.csv, loss.svg"},
        {"backend", OPT_STRING, &o.backend, "cpu, cuda or ref (float64, for checks)"},
        {"batch", OPT_INT, &o.batch, "sequences per micro-batch"},
        {"seq", OPT_INT, &o.seq, "tokens per sequence (the training context)"},
        {"accum", OPT_INT, &o.accum, "micro-batches per optimizer step"},
        {"steps", OPT_INT, &o.steps, "optimizer steps"},
        {"warmup", OPT_INT, &o.warmup, "linear warm-up steps"},
        {"lr", OPT_FLOAT, &o.lr, "peak learning rate"},
        {"lr-final", OPT_FLOAT, &o.lr_final, "the cosine decays to this fraction of the peak"},
        {"wd", OPT_FLOAT, &o.weight_decay, "weight decay (not on embeddings, norms, gate biases, lambda)"},
        {"clip", OPT_FLOAT, &o.clip, "global gradient-norm clip (0: none)"},
        {"eval-every", OPT_INT, &o.eval_every, "validate every this many steps (0: only at the end)"},
        {"eval-batches", OPT_INT, &o.eval_batches, "validation batches"},
        {"save-every", OPT_INT, &o.save_every, "checkpoint every this many steps"},
        {"log-every", OPT_INT, &o.log_every, "progress line every this many steps"},
        {"seed", OPT_INT, &seed, "initialisation and data-order seed"},
        {"cg-steps", OPT_INT, &o.cg_steps, "CG steps of the Mesa layers in training (0: the config's, 30)"},
        {"time-limit", OPT_FLOAT, &o.time_limit, "stop and save after this many minutes (0: none)"},
        {"stop-at", OPT_INT, &o.stop_at, "stop (and save) after this step; resume later with the same command"},
        {"no-resume", OPT_FLAG, &no_resume, "start afresh even if --out holds a checkpoint"},
        {"gpus", OPT_INT, &gpus,
         "data-parallel over this many GPUs, one process each with --batch sequences (cpu, ref: processes sharing the cores)"},
    };
    int st = parse_args(argc, argv, "[options]", opts, sizeof opts / sizeof opts[0], NULL, NULL, 0);
    if (st) return st == 2 ? 0 : 1;
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
