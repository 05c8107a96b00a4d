// Training, checkpoints and resume; refusal of bad inputs.
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backends/registry.h"
#include "core/common.h"
#include "data/shard.h"
#include "eval/sample.h"
#include "mixer_case.h"
#include "model/model.h"
#include "model/presets.h"
#include "test.h"
#include "tmpdir.h"
#include "toy.h"
#include "train/checkpoint.h"
#include "train/optim.h"
#include "train/trainer.h"

static ModelConfig small_config(void) {
    ModelConfig c;
    if (config_preset(&c, "tiny")) die("%s", mn_last_error());
    c.vocab_size = 64;
    return c;
}

TEST(train_resume_reproduces_losses) {
    TmpDir t;
    tmp_make(&t);
    char data[256], a[256], b[256];
    snprintf(data, sizeof data, "%s/data", t.dir);
    snprintf(a, sizeof a, "%s/a", t.dir);
    snprintf(b, sizeof b, "%s/b", t.dir);
    write_toy_shards(data);
    FILE *devnull = fopen("/dev/null", "w");
    TrainOptions oa = toy_train_options(data, a), ob = toy_train_options(data, b);
    CHECK(!train_run(&oa, devnull), "uninterrupted run: %s", mn_last_error());
    ob.stop_at = 5;  // interrupted after step 5 ...
    CHECK(!train_run(&ob, devnull), "first half: %s", mn_last_error());
    ob.stop_at = 0;  // ... and resumed from its checkpoint
    CHECK(!train_run(&ob, devnull), "resumed half: %s", mn_last_error());
    fclose(devnull);
    double la[64], lb[64];
    int na = read_losses(a, la, 64), nb = read_losses(b, lb, 64);
    CHECK(na == 12 && nb == 12, "loss rows: %d and %d, expected 12", na, nb);
    int same = 1;
    for (int i = 0; i < na && i < nb; i++) same &= la[i] == lb[i];
    test_note("losses: step 1 %.6f, step 12 %.6f (uninterrupted) vs %.6f (resumed at 5)", la[0], la[na - 1], lb[nb - 1]);
    CHECK(same, "the resumed run's losses differ from the uninterrupted run's");
    CHECK(la[na - 1] < la[0] - 0.15, "training did not reduce the loss (%.3f -> %.3f)", la[0], la[na - 1]);
    // the final weights are identical too
    Model *ma = NULL, *mb = NULL;
    CHECK(!checkpoint_load_model(a, backend_cpu(), &ma) && !checkpoint_load_model(b, backend_cpu(), &mb), "%s",
          mn_last_error());
    CHECK(!memcmp(ma->params, mb->params, ma->total * sizeof(float)), "final weights differ");
    model_free(ma);
    model_free(mb);
    tmp_remove(&t);
}

// --eval-every 0 validates once, at the end: of the schedule, or where the run stops early (the
// end of this process's share, which resuming continues).
TEST(train_eval_every_zero_validates_at_the_end) {
    TmpDir t;
    tmp_make(&t);
    char data[256], out[256], logpath[256];
    snprintf(data, sizeof data, "%s/data", t.dir);
    snprintf(out, sizeof out, "%s/run", t.dir);
    snprintf(logpath, sizeof logpath, "%s/log.txt", t.dir);
    write_toy_shards(data);
    TrainOptions o = toy_train_options(data, out);
    o.eval_every = 0;
    const int stops[2] = {5, 0};  // stopped after step 5, then resumed to the end (step 12)
    const char *want[2] = {"step      5 | validation loss ", "step     12 | validation loss "};
    for (int i = 0; i < 2; i++) {
        o.stop_at = stops[i];
        FILE *log = fopen(logpath, "w");
        if (!log) die("cannot write %s", logpath);
        CHECK(!train_run(&o, log), "%s", mn_last_error());
        fclose(log);
        size_t n;
        char *text = (char *)read_bytes(logpath, &n);
        if (text) text[n] = 0;
        int lines = 0;
        for (const char *p = text; p && (p = strstr(p, "validation loss")); p++) lines++;
        CHECK(text && lines == 1 && strstr(text, want[i]), "%d validation lines, expected one, '%s...':\n%s", lines,
              want[i], text ? text : "");
        free(text);
    }
    tmp_remove(&t);
}

// A run of a model without CG (gdn) resumes with its config named again, as demo.sh's second run
// does: the config the options make is compared with the run's, CG steps left out of it.
TEST(train_resume_without_cg_with_the_config_given) {
    TmpDir t;
    tmp_make(&t);
    char data[256], out[256], cfg[256];
    snprintf(data, sizeof data, "%s/data", t.dir);
    snprintf(out, sizeof out, "%s/run", t.dir);
    snprintf(cfg, sizeof cfg, "%s/gdn.json", t.dir);
    write_toy_shards(data);
    FILE *f = fopen(cfg, "w");
    CHECK(f != NULL, "cannot write %s", cfg);
    if (!f) return;
    fputs("{\"preset\": \"tiny\", \"mixer\": \"gdn\"}", f);
    fclose(f);
    FILE *devnull = fopen("/dev/null", "w");
    TrainOptions o = toy_train_options(data, out);
    o.config = cfg;
    o.cg_steps = 0;
    o.stop_at = 4;
    CHECK(!train_run(&o, devnull), "first part: %s", mn_last_error());
    o.stop_at = 0;
    CHECK(!train_run(&o, devnull), "resumed with --config: %s", mn_last_error());
    fclose(devnull);
    double l[64];
    CHECK(read_losses(out, l, 64) == 12, "the resumed run did not reach step 12");
    tmp_remove(&t);
}

TEST(train_checkpoint_round_trip_is_exact) {
    TmpDir t;
    tmp_make(&t);
    ModelConfig c = small_config();
    c.output_gate = 1;
    Model *m;
    CHECK(!model_create(&m, &c, backend_cpu()), "%s", mn_last_error());
    model_init_params(m, 5);
    AdamW o = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .clip = 1};
    adamw_init(&o, m);
    // one real step so that the moments are not zero
    int32_t tok[64], tgt[64];
    for (int i = 0; i < 64; i++) tok[i] = tgt[i] = i % 60;
    model_zero_grad(m);
    model_forward(m, tok, tgt, 2, 32, 1.0f / 64, NULL);
    model_backward(m);
    adamw_step(&o, m, 1e-3f, NULL);
    TrainState st = {7, 3, 11, 42, 1234, 5.5}, st2;
    CHECK(!checkpoint_save_model(t.dir, m, 7) && !checkpoint_save_state(t.dir, m, &o, &st), "%s", mn_last_error());
    Model *m2;
    AdamW o2 = o;
    CHECK(!checkpoint_load_model(t.dir, backend_cpu(), &m2), "%s", mn_last_error());
    adamw_init(&o2, m2);
    CHECK(!checkpoint_load_state(t.dir, m2, &o2, &st2), "%s", mn_last_error());
    CHECK(!memcmp(&m->cfg, &m2->cfg, sizeof c), "config differs after the round trip");
    CHECK(!memcmp(m->params, m2->params, m->total * 4), "weights differ after the round trip");
    CHECK(!memcmp(o.m, o2.m, m->total * 4) && !memcmp(o.v, o2.v, m->total * 4), "optimizer moments differ");
    CHECK(st2.step == 7 && st2.epoch == 3 && st2.index == 11 && st2.seed == 42 && st2.tokens == 1234 && o2.step == 7,
          "training state differs");
    adamw_free(&o, m);
    adamw_free(&o2, m2);
    model_free(m);
    model_free(m2);
    tmp_remove(&t);
}

// A tiny model memorises one batch: the loss falls from ~log V to near zero.
TEST(train_overfits_a_tiny_batch) {
    ModelConfig c = small_config();
    Model *m;
    CHECK(!model_create(&m, &c, backend_cpu()), "%s", mn_last_error());
    model_init_params(m, 3);
    double first, last;
    mc_train_tiny(m, "overfit", 200, &first, &last);
    test_note("loss %.3f -> %.4f after 200 steps on one batch", first, last);
    CHECK(last < 0.05, "did not memorise the batch: loss %.4f", last);
    model_free(m);
}

TEST(train_greedy_sampling_is_argmax) {
    Sampler s = {0, 0, 1, {{0}}};
    float logits[5] = {0.1f, 2.0f, -1.0f, 1.99f, 0.0f}, work[10];
    CHECK(sample_token(&s, logits, 5, work) == 1, "greedy picked the wrong token");
    Sampler k1 = {1.0f, 1, 1, {{0}}};
    mn_rng_seed(&k1.rng, 1);
    for (int i = 0; i < 20; i++) CHECK(sample_token(&k1, logits, 5, work) == 1, "top-k 1 is not argmax");
    // top-p: with p small only the best token survives
    Sampler p = {1.0f, 0, 0.01f, {{0}}};
    mn_rng_seed(&p.rng, 2);
    for (int i = 0; i < 20; i++) CHECK(sample_token(&p, logits, 5, work) == 1, "top-p 0.01 is not argmax");
    // temperature sampling follows the distribution
    Sampler full = {1.0f, 0, 1, {{0}}};
    mn_rng_seed(&full.rng, 3);
    int counts[5] = {0};
    for (int i = 0; i < 20000; i++) counts[sample_token(&full, logits, 5, work)]++;
    double z = 0;
    for (int i = 0; i < 5; i++) z += exp(logits[i]);
    for (int i = 0; i < 5; i++) {
        double want = exp(logits[i]) / z, got = counts[i] / 20000.0;
        CHECK(fabs(got - want) < 0.015, "token %d sampled with frequency %.3f, probability %.3f", i, got, want);
    }
}

TEST(train_refuses_bad_inputs) {
    TmpDir t;
    tmp_make(&t);
    ModelConfig c;
    // config: unknown key, impossible sizes, malformed JSON
    const char *bad[][2] = {
        {"{\"preset\": \"tiny\", \"dimm\": 3}", "unknown key \"dimm\""},
        {"{\"preset\": \"tiny\", \"dim\": 0}", "dim = 0"},
        {"{\"preset\": \"tiny\", \"n_heads\": -2}", "n_heads = -2"},
        {"{\"preset\": \"tiny\", \"lambda_min\": 0}", "lambda_min"},
        {"{\"preset\": \"tiny\", \"dim\": 3.5}", "must be an integer"},
        {"{\"preset\": \"nope\"}", "unknown config 'nope'"},
        {"{\"dim\": 12,", "config.json:1: expected a member name"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *path = tmp_path(&t, "config.json");
        write_bytes(path, bad[i][0], strlen(bad[i][0]));
        int s = config_load(&c, path);
        CHECK(s != MN_OK && strstr(mn_last_error(), bad[i][1]), "config %zu: status %d, message '%s' lacks '%s'", i, s,
              mn_last_error(), bad[i][1]);
    }
    // training on a missing data directory names the file
    TrainOptions o = toy_train_options("/nonexistent/data", tmp_path(&t, "run"));
    FILE *devnull = fopen("/dev/null", "w");
    CHECK(train_run(&o, devnull) != MN_OK && strstr(mn_last_error(), "/nonexistent/data/train.bin"),
          "missing data: '%s'", mn_last_error());
    // a checkpoint whose weights are truncated, or belong to another config, is refused
    ModelConfig small = small_config();
    Model *m;
    model_create(&m, &small, backend_cpu());
    model_init_params(m, 1);
    char ck[256];
    snprintf(ck, sizeof ck, "%s/ck", t.dir);
    mkdir(ck, 0755);
    CHECK(!checkpoint_save_model(ck, m, 1), "%s", mn_last_error());
    char wpath[512];
    snprintf(wpath, sizeof wpath, "%s/model.safetensors", ck);
    size_t n;
    unsigned char *bytes = read_bytes(wpath, &n);
    write_bytes(wpath, bytes, n - 100);
    Model *m2;
    CHECK(checkpoint_load_model(ck, backend_cpu(), &m2) != MN_OK && strstr(mn_last_error(), "model.safetensors"),
          "truncated weights: '%s'", mn_last_error());
    write_bytes(wpath, bytes, n);
    ModelConfig wider = small;
    wider.dim = 48;
    wider.mlp_hidden = 144;
    Model *mw;
    model_create(&mw, &wider, backend_cpu());
    CHECK(checkpoint_load_weights(wpath, mw) != MN_OK && strstr(mn_last_error(), "model.embeddings.weight"),
          "weights of another shape: '%s'", mn_last_error());
    model_free(mw);
    free(bytes);
    model_free(m);
    fclose(devnull);
    tmp_remove(&t);
}

// Two ranks of 2 sequences take the steps of one process with 4: the same batches (every rank
// draws the whole batch and trains on its rows), the gradients summed, validation split.
TEST(train_data_parallel_matches_one_process) {
    TmpDir t;
    tmp_make(&t);
    char data[256], a[256], b[256], log[256], args[1024];
    snprintf(data, sizeof data, "%s/data", t.dir);
    snprintf(a, sizeof a, "%s/a", t.dir);
    snprintf(b, sizeof b, "%s/b", t.dir);
    snprintf(log, sizeof log, "%s/log.txt", t.dir);
    write_toy_shards(data);
    const char *common = "--config tiny --seq 32 --steps 8 --warmup 2 --lr 1e-2 --eval-every 4 --eval-batches 2 "
                         "--save-every 0 --cg-steps 20";
    snprintf(args, sizeof args, "train %s --data %s --out %s --batch 4 --no-resume", common, data, a);
    CHECK(run_tool(args, log) == 0, "one process: failed (see %s)", log);
    snprintf(args, sizeof args, "train %s --data %s --out %s --batch 2 --gpus 2 --no-resume", common, data, b);
    CHECK(run_tool(args, log) == 0, "two ranks: failed (see %s)", log);
    double la[16], lb[16];
    int na = read_losses(a, la, 16), nb = read_losses(b, lb, 16);
    CHECK(na == 8 && nb == 8, "loss rows: %d and %d, expected 8", na, nb);
    // Tolerance: the ranks' gradients are float32 sums of half the rows each, added in double;
    // one process sums all rows in another order (about 1e-7 relative a step), and AdamW's steps
    // carry that on. Ranks that trained on the same rows, or did not sum their gradients, are off
    // by 1e-3 or more from the second step on.
    double worst = 0;
    for (int i = 0; i < na && i < nb; i++) worst = fmax(worst, fabs(la[i] - lb[i]) / fabs(la[i]));
    test_note("losses, one process vs two ranks: step 1 %.7f / %.7f, step 8 %.7f / %.7f; largest difference %.2g", la[0],
              lb[0], la[na - 1], lb[nb - 1], worst);
    CHECK(worst <= 1e-5, "two ranks' losses differ from one process's by %.3g (relative) > 1e-5", worst);
    Model *ma = NULL, *mb = NULL;
    CHECK(!checkpoint_load_model(a, backend_cpu(), &ma) && !checkpoint_load_model(b, backend_cpu(), &mb), "%s",
          mn_last_error());
    if (ma && mb) CHECK_REL("final weights, two ranks vs one process", rel_err_ff(mb->params, ma->params, ma->total), 1e-5);
    model_free(ma);
    model_free(mb);
    // A run of two ranks, stopped after step 4 and resumed by one process with 4 sequences, takes
    // the same steps (the checkpoint's data position counts sequences, not ranks).
    char c[256];
    snprintf(c, sizeof c, "%s/c", t.dir);
    snprintf(args, sizeof args, "train %s --data %s --out %s --batch 2 --gpus 2 --stop-at 4 --no-resume", common, data, c);
    CHECK(run_tool(args, log) == 0, "two ranks, first half: failed (see %s)", log);
    snprintf(args, sizeof args, "train %s --data %s --out %s --batch 4", common, data, c);
    CHECK(run_tool(args, log) == 0, "one process, resumed: failed (see %s)", log);
    double lc[16];
    int nc = read_losses(c, lc, 16);
    CHECK(nc == 8, "loss rows of the resumed run: %d, expected 8", nc);
    worst = 0;
    for (int i = 0; i < na && i < nc; i++) worst = fmax(worst, fabs(la[i] - lc[i]) / fabs(la[i]));
    test_note("two ranks to step 4, then one process: step 8 %.7f (one process throughout %.7f)", lc[nc - 1], la[na - 1]);
    CHECK(worst <= 1e-5, "resumed with another number of ranks, the losses differ by %.3g (relative) > 1e-5", worst);
    // A rank that fails stops the group, and the launcher says which one.
    snprintf(args, sizeof args, "train --config no-such-config --data %s --out %s/d --gpus 2 --no-resume", data, t.dir);
    CHECK(run_tool(args, log) == 1, "a failing rank: exit status not 1");
    size_t n;
    unsigned char *text = read_bytes(log, &n);
    CHECK(text && strstr((char *)text, "exited with status 1") && strstr((char *)text, "no-such-config"),
          "the failure message does not name the rank and the cause: %s", text ? (char *)text : "(no output)");
    free(text);
    tmp_remove(&t);
}

// Evaluation split over two ranks (each scoring 2 of every batch's 4 sequences, the sums added
// through the ranks' shared memory) gives one process's NLL by position.
TEST(eval_split_over_ranks_matches_one_process) {
    TmpDir t;
    tmp_make(&t);
    char data[256], run[256], log[256], args[1024], p1[512], p2[512];
    snprintf(data, sizeof data, "%s/data", t.dir);
    snprintf(run, sizeof run, "%s/run", t.dir);
    snprintf(log, sizeof log, "%s/log.txt", t.dir);
    write_toy_shards(data);
    snprintf(args, sizeof args,
             "train --config tiny --seq 32 --steps 3 --warmup 1 --batch 4 --eval-every 0 --save-every 0 --data %s "
             "--out %s --no-resume",
             data, run);
    CHECK(run_tool(args, log) == 0, "training: failed (see %s)", log);
    const char *common = "--seq 32 --batches 3 --cg-steps 20";
    snprintf(args, sizeof args, "eval --model %s --data %s %s --batch 4 --out %s/e1", run, data, common, t.dir);
    CHECK(run_tool(args, log) == 0, "one process: failed (see %s)", log);
    snprintf(args, sizeof args, "eval --model %s --data %s %s --batch 2 --gpus 2 --out %s/e2", run, data, common, t.dir);
    CHECK(run_tool(args, log) == 0, "two ranks: failed (see %s)", log);
    size_t n;
    unsigned char *text = read_bytes(log, &n);
    CHECK(text && strstr((char *)text, "12 sequences of 32 tokens") && strstr((char *)text, "split over 2 ranks"),
          "two ranks' report: %s", text ? (char *)text : "(no output)");
    free(text);
    snprintf(p1, sizeof p1, "%s/e1/nll_by_position.csv", t.dir);
    snprintf(p2, sizeof p2, "%s/e2/nll_by_position.csv", t.dir);
    double a[64], b[64];
    int na = read_second_column(p1, a, 64), nb = read_second_column(p2, b, 64);
    CHECK(na == 32 && nb == 32, "positions: %d and %d, expected 32", na, nb);
    // Tolerance: the same sequences, scored by a forward over 2 rows instead of 4 (float32 products
    // of other shapes: about 1e-7 relative), averaged over 12 sequences; ranks that scored the same
    // rows, or did not add their sums, are off by 0.12 (relative) here.
    double worst = 0;
    for (int i = 0; i < na && i < nb; i++) worst = fmax(worst, fabs(a[i] - b[i]) / fabs(a[i]));
    test_note("NLL by position, one process vs two ranks: position 1 %.7f / %.7f, 32 %.7f / %.7f; largest difference %.2g",
              a[0], b[0], a[31], b[31], worst);
    CHECK(worst <= 1e-5, "two ranks' NLL differs from one process's by %.3g (relative) > 1e-5", worst);
    tmp_remove(&t);
}
