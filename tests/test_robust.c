// What users run into: output directories and their parents, file permissions, configs that do
// not load again or convert out of range, resumes with other settings, damaged run files, a
// kill in the middle of a checkpoint, batches that cannot fit in memory, the first ETA, leaks.
#define _GNU_SOURCE  // mallinfo2
#include <fcntl.h>
#include <malloc.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/registry.h"
#include "core/atomic_file.h"
#include "core/common.h"
#include "data/bpe.h"
#include "data/shard.h"
#include "model/model.h"
#include "model/presets.h"
#include "test.h"
#include "tmpdir.h"
#include "toy.h"
#include "train/checkpoint.h"
#include "train/dist.h"
#include "train/loss_log.h"
#include "train/run_info.h"
#include "train/trainer.h"

// The call fails with `code` and a message holding `fragment`.
#define CHECK_FAILS(call, code, fragment)                                                             \
    do {                                                                                              \
        int s_ = (call);                                                                              \
        CHECK(s_ == (code), "%s: status %d, expected %d (%s)", #call, s_, (code), mn_last_error());  \
        CHECK(strstr(mn_last_error(), (fragment)), "%s: message \"%s\" lacks \"%s\"", #call,        \
              mn_last_error(), (fragment));                                                          \
    } while (0)

// The toy run, saving every 4 steps.
static TrainOptions toy_options(const char *data, const char *out) {
    TrainOptions o = toy_train_options(data, out);
    o.save_every = 4;
    return o;
}

static FILE *devnull(void) {
    FILE *f = fopen("/dev/null", "w");
    if (!f) die("/dev/null: cannot open");
    return f;
}

static int file_mode(const char *path) {
    struct stat st;
    return stat(path, &st) ? -1 : (int)(st.st_mode & 0777);
}

// ---------------------------------------------------------------------------
// Output directories and permissions

TEST(robust_output_directories_are_made_with_their_parents) {
    TmpDir t;
    tmp_make(&t);
    char data[256], out[256];
    snprintf(data, sizeof data, "%s/data", t.dir);
    snprintf(out, sizeof out, "%s/runs/deep/demo", t.dir);
    write_toy_shards(data);
    FILE *dn = devnull();
    TrainOptions o = toy_options(data, out);
    o.steps = 2;
    o.warmup = 1;
    o.save_every = 0;
    CHECK(!train_run(&o, dn), "train into a directory whose parents do not exist: %s", mn_last_error());
    CHECK(!access(tmp_path(&t, "runs/deep/demo/model.safetensors"), F_OK), "no weights in the new run directory");
    // A parent that is a file: refused, naming it and why.
    write_bytes(tmp_path(&t, "file"), "x", 1);
    snprintf(out, sizeof out, "%s/file/run", t.dir);
    o.out = out;
    CHECK_FAILS(train_run(&o, dn), MN_ERR_IO, "/file: exists and is not a directory");
    // A directory the system will not make: its reason (strerror) is in the message.
    o.out = "/proc/mesanet-no-such-dir/run";
    CHECK_FAILS(train_run(&o, dn), MN_ERR_IO, "No such file or directory");
    // The tokenizer's output directory, with its parents.
    const char *text = "one two three four five six seven\nan other line of text for the tokenizer to learn\n";
    char corpus[256], tokdir[256];
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", t.dir);
    write_bytes(corpus, text, strlen(text));
    snprintf(tokdir, sizeof tokdir, "%s/data/deep/tok", t.dir);
    CHECK(!bpe_train((const unsigned char *)text, strlen(text), 260, tokdir), "bpe_train into new parents: %s",
          mn_last_error());
    CHECK(!access(tmp_path(&t, "data/deep/tok/encoder.json"), F_OK), "no encoder.json");
    fclose(dn);
    tmp_remove(&t);
}

TEST(robust_written_files_get_the_usual_permissions) {
    TmpDir t;
    tmp_make(&t);
    mode_t old = umask(022);
    const char *text = "some text for a small vocabulary\nand a second line\n";
    char dir[256];
    snprintf(dir, sizeof dir, "%s/tok", t.dir);
    CHECK(!bpe_train((const unsigned char *)text, strlen(text), 258, dir), "%s", mn_last_error());
    CHECK(file_mode(tmp_path(&t, "tok/encoder.json")) == 0644, "encoder.json mode %o, expected 644 (umask 022)",
          file_mode(tmp_path(&t, "tok/encoder.json")));
    CHECK(file_mode(tmp_path(&t, "tok/vocab.bpe")) == 0644, "vocab.bpe mode %o, expected 644",
          file_mode(tmp_path(&t, "tok/vocab.bpe")));
    const char *path = tmp_path(&t, "atomic.txt");
    AtomicFile af;
    CHECK(!af_open(&af, path) && !af_write(&af, "x", 1) && !af_commit(&af), "%s", mn_last_error());
    CHECK(file_mode(path) == 0644, "atomic file mode %o, expected 644", file_mode(path));
    umask(027);
    CHECK(!af_open(&af, path) && !af_write(&af, "y", 1) && !af_commit(&af), "%s", mn_last_error());
    CHECK(file_mode(path) == 0640, "atomic file mode %o, expected 640 (umask 027)", file_mode(path));
    umask(old);
    tmp_remove(&t);
}

// ---------------------------------------------------------------------------
// Configs

static const char *const presets[] = {"tiny", "demo", "125m", "400m", "1b", "fla-162m", "fla-412m"};

// Saves c, loads it again and checks that every field came back.
static void check_round_trip(TmpDir *t, const ModelConfig *c, const char *what) {
    const char *path = tmp_path(t, "config.json");
    ModelConfig back;
    memset(&back, 0x5a, sizeof back);
    int s = config_save(c, path);
    CHECK(!s, "%s: save: %s", what, mn_last_error());
    if (s) return;
    s = config_load(&back, path);
    CHECK(!s, "%s: the saved config does not load: %s", what, mn_last_error());
    if (s) return;
    char diff[256];
    CHECK(!config_diff(c, &back, diff, sizeof diff), "%s: a field changed in the round trip: %s", what, diff);
    CHECK(!memcmp(c, &back, sizeof back), "%s: the loaded config differs from the saved one", what);
}

// A random valid config: every field drawn within its range, floats over many magnitudes.
static ModelConfig random_config(MnRng *r) {
    ModelConfig c;
    config_default(&c);
    int pick = (int)(mn_rng_u64(r) % 2);
    strcpy(c.arch, pick ? "fla" : "paper");
#define RANGE(lo, hi) ((lo) + (int)(mn_rng_u64(r) % (uint64_t)((hi) - (lo) + 1)))
    c.vocab_size = RANGE(0, 1 << 24);
    c.dim = RANGE(1, 65536);
    c.n_layers = RANGE(1, CONFIG_MAX_LAYERS);
    c.n_heads = RANGE(1, 1024);
    c.head_dim = RANGE(1, 1024);
    c.mlp_hidden = RANGE(1, 1 << 20);
    c.conv_size = RANGE(1, 8);
    c.seq_len = RANGE(2, 1 << 24);
    c.cg_steps = RANGE(0, 10000);
    c.embed_scale = RANGE(0, 1);
    c.tie_embeddings = RANGE(0, 1);
    c.shared_onorm = RANGE(0, 1);
    c.output_gate = RANGE(0, 1);
#undef RANGE
    // Floats with random mantissas over the decades of their range (and the ends of it).
    double u = mn_rng_uniform(r);
    c.norm_eps = (float)pow(10, -30 * u);
    c.logit_cap = u < 0.1 ? 0 : (float)(1e6 * mn_rng_uniform(r));
    c.lambda_min = (float)(pow(10, -20 * mn_rng_uniform(r)) * 50);
    c.lambda_init = c.lambda_min + (float)(mn_rng_uniform(r) * 49 + 1e-3);
    c.gate_bound = u < 0.2 ? 0 : (float)(1.0001 + 1e9 * pow(mn_rng_uniform(r), 4));
    if (c.gate_bound > 1e9f) c.gate_bound = 1e9f;
    c.resid_scale = (float)(10 * mn_rng_uniform(r));
    return c;
}

TEST(robust_config_round_trip_keeps_every_field) {
    TmpDir t;
    tmp_make(&t);
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        ModelConfig c;
        CHECK(!config_preset(&c, presets[i]), "%s", mn_last_error());
        check_round_trip(&t, &c, presets[i]);
        c.vocab_size = 4096;
        c.output_gate = 1;
        check_round_trip(&t, &c, presets[i]);
    }
    MnRng r;
    mn_rng_seed(&r, 17);
    int valid = 0;
    for (int i = 0; i < 500; i++) {
        ModelConfig c = random_config(&r);
        if (config_validate(&c, "random")) {
            CHECK(0, "random config %d is not valid: %s", i, mn_last_error());
            continue;
        }
        char what[32];
        snprintf(what, sizeof what, "random config %d", i);
        check_round_trip(&t, &c, what);
        valid++;
    }
    test_note("%zu presets and %d random configs saved and loaded back", sizeof presets / sizeof presets[0], valid);
    // config_diff names the first field that differs, with both values.
    ModelConfig a, b;
    config_preset(&a, "tiny");
    b = a;
    b.gate_bound = 3.5f;
    char diff[128];
    CHECK(config_diff(&a, &b, diff, sizeof diff) && strstr(diff, "gate_bound: 64 vs 3.5"), "diff: '%s'", diff);
    tmp_remove(&t);
}

TEST(robust_config_numbers_are_checked_before_conversion) {
    TmpDir t;
    tmp_make(&t);
    ModelConfig c;
    const char *bad[][2] = {
        // Hugging Face style: out of the int range, not whole, not numbers
        {"{\"model_type\": \"mesa_net\", \"vocab_size\": 1e10}", "\"vocab_size\" must be an integer"},
        {"{\"model_type\": \"mesa_net\", \"hidden_size\": 1e20}", "\"hidden_size\" must be an integer"},
        {"{\"model_type\": \"mesa_net\", \"hidden_size\": 100000}", "\"hidden_size\" = 100000, expected 1 to 65536"},
        {"{\"model_type\": \"mesa_net\", \"num_heads\": 2.5}", "\"num_heads\" must be an integer"},
        {"{\"model_type\": \"mesa_net\", \"hidden_ratio\": 1e300}", "\"hidden_ratio\" must be an integer"},
        {"{\"model_type\": \"mesa_net\", \"norm_eps\": 1e39}", "\"norm_eps\" = 1e+39 is not a finite number"},
        {"{\"model_type\": \"mesa_net\", \"tie_word_embeddings\": 7}", "\"tie_word_embeddings\" must be true or false"},
        {"{\"model_type\": \"mesa_net\", \"num_hidden_layers\": 1024}", "n_layers = 1024"},
        // ours: floats finite and in range, flags 0 or 1, layers within what the model holds
        {"{\"preset\": \"tiny\", \"gate_bound\": 1e39}", "\"gate_bound\" = 1e+39 is not a finite number"},
        {"{\"preset\": \"tiny\", \"gate_bound\": 1e30}", "gate_bound = 1e+30"},
        {"{\"preset\": \"tiny\", \"lambda_init\": 1e6}", "lambda_init = 1e+06"},
        {"{\"preset\": \"tiny\", \"norm_eps\": -1}", "norm_eps = -1"},
        {"{\"preset\": \"tiny\", \"output_gate\": 2}", "\"output_gate\" must be true or false"},
        {"{\"preset\": \"tiny\", \"n_layers\": 1024}", "n_layers = 1024 (the number of blocks), expected 1 to 200"},
        {"{\"preset\": \"tiny\", \"seq_len\": 1}", "seq_len = 1 (the training context length), expected 2"},
        {"{\"preset\": \"tiny\", \"mixer\": \"nope\"}", "unknown mixer 'nope'"},
        {"{\"preset\": \"tiny\", \"dim\": 1e300}", "\"dim\" must be an integer"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *path = tmp_path(&t, "config.json");
        write_bytes(path, bad[i][0], strlen(bad[i][0]));
        int s = config_load(&c, path);
        CHECK(s != MN_OK && strstr(mn_last_error(), bad[i][1]), "config %zu (%s): status %d, message '%s' lacks '%s'", i,
              bad[i][0], s, mn_last_error(), bad[i][1]);
    }
    // The most layers validation admits build a model's tensor table (with the output gate, the
    // most tensors a block has).
    config_preset(&c, "tiny");
    c.vocab_size = 16;
    c.output_gate = 1;
    c.n_layers = CONFIG_MAX_LAYERS;
    ParamSpec *specs = NULL;
    int n = 0;
    CHECK(!model_specs(&c, &specs, &n), "%d layers: %s", CONFIG_MAX_LAYERS, mn_last_error());
    free(specs);
    c.n_layers = CONFIG_MAX_LAYERS + 1;
    CHECK_FAILS(config_validate(&c, "x"), MN_ERR_ARG, "expected 1 to 200");
    // An invalid config is never saved (it could not be loaded again).
    config_preset(&c, "tiny");
    c.gate_bound = INFINITY;
    const char *path = tmp_path(&t, "saved.json");
    CHECK_FAILS(config_save(&c, path), MN_ERR_ARG, "gate_bound = inf");
    CHECK(access(path, F_OK), "an invalid config was written");
    // A directory, or a file that cannot be read: said so, not "cannot read 9223372036854775807 bytes".
    mkdir(tmp_path(&t, "run"), 0755);
    write_bytes(tmp_path(&t, "run/config.json"), "{}", 2);
    CHECK_FAILS(config_load(&c, tmp_path(&t, "run")), MN_ERR_IO, "is a directory, not a config file; the run's config is");
    CHECK_FAILS(config_load(&c, "/dev/null"), MN_ERR_IO, "not a regular file");
    // A preset's name stays the preset beside a directory of that name.
    char cwd[4096];
    if (getcwd(cwd, sizeof cwd) && !chdir(t.dir)) {
        mkdir("tiny", 0755);
        CHECK(!config_load(&c, "tiny") && c.dim == 32, "preset tiny beside a directory 'tiny': %s", mn_last_error());
        CHECK(!chdir(cwd), "cannot return to %s", cwd);
    }
    tmp_remove(&t);
}

TEST(robust_train_names_the_sequence_length) {
    TmpDir t;
    tmp_make(&t);
    char data[256];
    snprintf(data, sizeof data, "%s/data", t.dir);
    write_toy_shards(data);
    char run[256], inf[256];
    snprintf(run, sizeof run, "%s", tmp_path(&t, "run"));
    snprintf(inf, sizeof inf, "%s", tmp_path(&t, "inf.json"));
    TrainOptions o = toy_options(data, run);
    o.seq = 1;
    FILE *dn = devnull();
    CHECK_FAILS(train_run(&o, dn), MN_ERR_ARG, "seq_len = 1 (the training context length), expected 2");
    // A config whose gate_bound overflows a float never trains (its config.json could not load).
    const char *text = "{\"preset\":\"tiny\",\"gate_bound\":1e39}";
    write_bytes(inf, text, strlen(text));
    o.seq = 32;
    o.config = inf;
    CHECK_FAILS(train_run(&o, dn), MN_ERR_FORMAT, "gate_bound");
    fclose(dn);
    tmp_remove(&t);
}

// ---------------------------------------------------------------------------
// Resume: the run's settings, its files

TEST(robust_resume_refuses_other_settings) {
    TmpDir t;
    tmp_make(&t);
    char data[256], run[256], other[256];
    snprintf(data, sizeof data, "%s/data", t.dir);
    snprintf(run, sizeof run, "%s/run", t.dir);
    snprintf(other, sizeof other, "%s/other", t.dir);
    write_toy_shards(data);
    FILE *dn = devnull();
    TrainOptions o = toy_options(data, run);
    o.stop_at = 4;
    CHECK(!train_run(&o, dn), "first part: %s", mn_last_error());
    // run.json records the settings, the data as an absolute path
    RunInfo ri;
    CHECK(!run_info_read(run, &ri), "%s", mn_last_error());
    CHECK(!strcmp(ri.config, "tiny") && ri.data[0] == '/' && strstr(ri.data, "/data") && !strcmp(ri.data_given, data) &&
              ri.seq == 32 && ri.batch == 4 && ri.accum == 1 && ri.train_tokens == 20000,
          "run.json: config %s, data %s (%s), seq %d, batch %d, accum %d, tokens %llu", ri.config, ri.data, ri.data_given,
          ri.seq, ri.batch, ri.accum, (unsigned long long)ri.train_tokens);
    TrainOptions c = o;
    c.seq = 16;
    CHECK_FAILS(train_run(&c, dn), MN_ERR_ARG, "--seq 16 differs from the run's 32");
    c = o;
    c.batch = 8;
    CHECK_FAILS(train_run(&c, dn), MN_ERR_ARG, "--batch 8 differs from the run's 4");
    c = o;
    c.accum = 2;
    CHECK_FAILS(train_run(&c, dn), MN_ERR_ARG, "--accum 2 differs from the run's 1");
    c = o;
    c.config = "demo";
    CHECK_FAILS(train_run(&c, dn), MN_ERR_ARG, "--config demo differs from the run's tiny (dim: 192 vs 32)");
    c = o;
    c.cg_steps = 5;
    CHECK_FAILS(train_run(&c, dn), MN_ERR_ARG, "--cg-steps 5 differs from the run's 20");
    CHECK(strstr(mn_last_error(), "--no-resume") && strstr(mn_last_error(), "another --out"),
          "the message does not say how to start afresh: %s", mn_last_error());
    // other data: another token count
    snprintf(other, sizeof other, "%s/other", t.dir);
    mkdir(other, 0755);
    int32_t tok[3000];
    for (int i = 0; i < 3000; i++) tok[i] = i % 64;
    char path[512];
    snprintf(path, sizeof path, "%s/train.bin", other);
    shard_write(path, tok, 3000, 64, 63);
    snprintf(path, sizeof path, "%s/valid.bin", other);
    shard_write(path, tok, 3000, 64, 63);
    c = o;
    c.data = other;
    CHECK_FAILS(train_run(&c, dn), MN_ERR_ARG, "holds 3000 training tokens, but the run");
    // The same data at another place: resumes, and run.json records where it is now.
    char moved[256];
    snprintf(moved, sizeof moved, "%s/moved", t.dir);
    CHECK(!rename(data, moved), "cannot move the data");
    c = o;
    c.data = moved;
    c.stop_at = 6;
    CHECK(!train_run(&c, dn), "resumed with the data moved: %s", mn_last_error());
    CHECK(!run_info_read(run, &ri) && strstr(ri.data, "/moved") && !strcmp(ri.data_given, moved) && ri.seq == 32,
          "run.json after the move: data %s (%s)", ri.data, ri.data_given);
    CHECK(!rename(moved, data), "cannot move the data back");
    // Nothing given: the run's own settings (the data where run.json says: moved back, so given);
    // the same settings given: resumes too.
    c = o;
    c.config = NULL;
    c.seq = c.batch = c.accum = c.cg_steps = 0;
    c.stop_at = 8;
    CHECK(!train_run(&c, dn), "resumed with the run's settings: %s", mn_last_error());
    o.stop_at = 0;
    o.data = NULL;  // where run.json says (back at its place: the run before noted it)
    CHECK(!train_run(&o, dn), "resumed with the same settings: %s", mn_last_error());
    double l[32];
    CHECK(read_losses(run, l, 32) == 12, "loss rows after the resumes");
    fclose(dn);
    tmp_remove(&t);
}

TEST(robust_damaged_loss_log_is_refused) {
    TmpDir t;
    tmp_make(&t);
    char data[256], run[256], csv[512];
    snprintf(data, sizeof data, "%s/data", t.dir);
    snprintf(run, sizeof run, "%s/run", t.dir);
    snprintf(csv, sizeof csv, "%s/loss.csv", run);
    write_toy_shards(data);
    FILE *dn = devnull();
    TrainOptions o = toy_options(data, run);
    o.stop_at = 4;
    CHECK(!train_run(&o, dn), "%s", mn_last_error());
    o.stop_at = 0;
    size_t n;
    char *good = (char *)read_bytes(csv, &n);
    CHECK(good && n > 0, "no loss.csv");
    if (!good) return;
    // a damaged row: refused naming the file and the line
    char *bad = malloc(n + 1);
    memcpy(bad, good, n);
    bad[n] = 0;
    char *third = strchr(strchr(strchr(bad, '\n') + 1, '\n') + 1, ',');  // line 3, after the step
    third[1] = 'x';
    write_bytes(csv, bad, n);
    CHECK_FAILS(train_run(&o, dn), MN_ERR_FORMAT, "loss.csv:3: column 2 (loss)");
    // cut short (a row missing before the checkpoint's step), and missing altogether
    char *last = bad + n - 2;
    while (*last != '\n') last--;
    write_bytes(csv, good, (size_t)(last - bad + 1));
    CHECK_FAILS(train_run(&o, dn), MN_ERR_FORMAT, "rows end at step 3, but the checkpoint is at step 4");
    unlink(csv);
    CHECK_FAILS(train_run(&o, dn), MN_ERR_IO, "loss.csv: cannot open: No such file or directory");
    write_bytes(csv, good, n);
    CHECK(!train_run(&o, dn), "the restored loss.csv: %s", mn_last_error());
    free(bad);
    free(good);
    fclose(dn);
    tmp_remove(&t);
}

// The parser takes any bytes: every prefix and random damage of a valid file either parses or
// fails with a message, and the valid file reads back as written.
TEST(robust_loss_log_parser_takes_any_bytes) {
    LossLog log = {0};
    for (int i = 1; i <= 5; i++) {
        LossRow r = {i, 3.0 / i, 1e-3, 0.5, 128.0 * i, 0.25 * i, i % 2 ? NAN : 2.5};
        loss_log_add(&log, r);
    }
    TmpDir t;
    tmp_make(&t);
    CHECK(!loss_log_write(&log, t.dir), "%s", mn_last_error());
    size_t n;
    char *text = (char *)read_bytes(tmp_path(&t, "loss.csv"), &n);
    LossLog back;
    CHECK(text && !loss_log_parse(text, n, "loss.csv", &back) && back.n == 5, "the written log: %s", mn_last_error());
    for (int i = 0; i < back.n && i < 5; i++)
        CHECK(back.rows[i].loss == log.rows[i].loss && back.rows[i].tokens == log.rows[i].tokens &&
                  isnan(back.rows[i].val_loss) == isnan(log.rows[i].val_loss),
              "row %d differs", i + 1);
    loss_log_free(&back);
    int refused = 0;
    for (size_t len = 0; len < n; len++) {  // every prefix: complete rows only
        LossLog p;
        int s = loss_log_parse(text, len, "prefix", &p);
        refused += s != 0;
        if (!s) CHECK(text[len - 1] == '\n', "a prefix of %zu bytes ending inside a row parsed", len);
        loss_log_free(&p);
    }
    MnRng r;
    mn_rng_seed(&r, 5);
    char *buf = malloc(n);
    for (int i = 0; i < 3000; i++) {
        memcpy(buf, text, n);
        int edits = 1 + (int)(mn_rng_u64(&r) % 4);
        for (int e = 0; e < edits; e++) buf[mn_rng_u64(&r) % n] = (char)(mn_rng_u64(&r) % 256);
        LossLog p;
        if (!loss_log_parse(buf, n, "damaged", &p)) CHECK(p.n <= 5, "rows out of nothing");
        loss_log_free(&p);
    }
    test_note("%d of %zu prefixes refused; 3000 damaged copies parsed without a crash", refused, n);
    free(buf);
    free(text);
    loss_log_free(&log);
    // run.json's parser likewise
    const char *seq_too_big = "{\"config\":\"a\",\"data\":\"b\",\"data_given\":\"c\",\"seq\":1e300,"
                              "\"batch\":1,\"accum\":1,\"train_tokens\":0}";
    const char *bad_runs[] = {"", "[]", "{\"config\": 1}", seq_too_big};
    for (size_t i = 0; i < sizeof bad_runs / sizeof bad_runs[0]; i++) {
        RunInfo ri;
        CHECK(run_info_parse(bad_runs[i], strlen(bad_runs[i]), "run.json", &ri) == MN_ERR_FORMAT, "run.json %zu parsed", i);
    }
    tmp_remove(&t);
}

// ---------------------------------------------------------------------------
// Checkpoints as sets

// Trains toy_options to 12 steps in `dir`, the save of step 8 stopped at `point` (as a kill there
// would leave it), then resumes; the losses and weights must be those of `ref`.
static void stop_and_resume(TmpDir *t, const char *data, const char *ref, const char *point) {
    char run[256], env[64];
    snprintf(run, sizeof run, "%s/stop-%s", t->dir, point);
    snprintf(env, sizeof env, "%s@8", point);
    FILE *dn = devnull();
    TrainOptions o = toy_options(data, run);
    setenv("MESANET_CHECKPOINT_STOP", env, 1);
    int s = train_run(&o, dn);
    unsetenv("MESANET_CHECKPOINT_STOP");
    CHECK(s == MN_ERR_IO && strstr(mn_last_error(), "stopped after"), "%s: the save did not stop: %d %s", point, s,
          mn_last_error());
    // What a kill there leaves loads (eval, generate) and resumes.
    int found = 0;
    CHECK(!checkpoint_find(run, &found) && found, "%s: no complete checkpoint left: %s", point, mn_last_error());
    Model *m = NULL;
    CHECK(!checkpoint_load_model(run, backend_cpu(), &m), "%s: the run does not load: %s", point, mn_last_error());
    model_free(m);
    s = train_run(&o, dn);
    CHECK(!s, "%s: resume: %s", point, mn_last_error());
    double la[32], lb[32];
    int na = read_losses(ref, la, 32), nb = read_losses(run, lb, 32);
    int same = na == 12 && nb == 12;
    for (int i = 0; i < na && i < nb; i++) same &= la[i] == lb[i];
    CHECK(same, "%s: losses after the resume differ (%d and %d rows)", point, na, nb);
    Model *ma = NULL, *mb = NULL;
    if (!checkpoint_load_model(ref, backend_cpu(), &ma) && !checkpoint_load_model(run, backend_cpu(), &mb))
        CHECK(!memcmp(ma->params, mb->params, ma->total * sizeof(float)), "%s: final weights differ", point);
    else
        CHECK(0, "%s: %s", point, mn_last_error());
    model_free(ma);
    model_free(mb);
    // Only the latest checkpoint is kept, and the run directory's weights are its weights.
    char path[512];
    snprintf(path, sizeof path, "%s/checkpoints/step-00000008", run);
    CHECK(access(path, F_OK), "%s: an older checkpoint was left behind", point);
    snprintf(path, sizeof path, "%s/model.safetensors", run);
    char latest[512];
    snprintf(latest, sizeof latest, "%s/checkpoints/step-00000012/model.safetensors", run);
    size_t n1, n2;
    unsigned char *b1 = read_bytes(path, &n1), *b2 = read_bytes(latest, &n2);
    CHECK(b1 && b2 && n1 == n2 && !memcmp(b1, b2, n1), "%s: the run directory's weights are not the latest", point);
    free(b1);
    free(b2);
    fclose(dn);
}

TEST(robust_checkpoint_killed_mid_save_resumes) {
    TmpDir t;
    tmp_make(&t);
    char data[256], ref[256];
    snprintf(data, sizeof data, "%s/data", t.dir);
    snprintf(ref, sizeof ref, "%s/ref", t.dir);
    write_toy_shards(data);
    FILE *dn = devnull();
    TrainOptions o = toy_options(data, ref);
    CHECK(!train_run(&o, dn), "uninterrupted: %s", mn_last_error());
    const char *points[] = {"config", "model", "optimizer", "history", "latest", "publish"};
    for (size_t i = 0; i < sizeof points / sizeof points[0]; i++) stop_and_resume(&t, data, ref, points[i]);
    fclose(dn);
    tmp_remove(&t);
}

TEST(robust_missing_optimizer_state_is_refused) {
    TmpDir t;
    tmp_make(&t);
    char data[256], run[256], path[512];
    snprintf(data, sizeof data, "%s/data", t.dir);
    snprintf(run, sizeof run, "%s/run", t.dir);
    write_toy_shards(data);
    FILE *dn = devnull();
    TrainOptions o = toy_options(data, run);
    o.stop_at = 4;
    CHECK(!train_run(&o, dn), "%s", mn_last_error());
    snprintf(path, sizeof path, "%s/checkpoints/step-00000004/optimizer.safetensors", run);
    CHECK(!unlink(path), "no optimizer state at %s", path);
    size_t n1, n2;
    snprintf(path, sizeof path, "%s/model.safetensors", run);
    unsigned char *before = read_bytes(path, &n1);
    o.stop_at = 0;
    CHECK_FAILS(train_run(&o, dn), MN_ERR_FORMAT, "holds the model's weights but not the optimizer state");
    unsigned char *after = read_bytes(path, &n2);
    CHECK(before && after && n1 == n2 && !memcmp(before, after, n1), "the saved weights were changed");
    free(before);
    free(after);
    // The older layout: weights and no optimizer state in the directory itself.
    char old[256];
    snprintf(old, sizeof old, "%s/old", t.dir);
    mkdir(old, 0755);
    Model *m = NULL;
    CHECK(!checkpoint_load_model(run, backend_cpu(), &m), "%s", mn_last_error());
    if (m) CHECK(!checkpoint_save_model(old, m, 4), "%s", mn_last_error());
    model_free(m);
    o.out = old;
    CHECK_FAILS(train_run(&o, dn), MN_ERR_FORMAT, "optimizer.safetensors: missing");
    // Starting afresh replaces it.
    o.resume = 0;
    o.steps = 2;
    o.warmup = 1;
    CHECK(!train_run(&o, dn), "--no-resume over it: %s", mn_last_error());
    fclose(dn);
    tmp_remove(&t);
}

// ---------------------------------------------------------------------------
// Memory

TEST(robust_batch_that_cannot_fit_is_refused_before_allocating) {
    ModelConfig c;
    config_preset(&c, "tiny");
    c.vocab_size = 64;
    Model *m = NULL;
    CHECK(!model_create(&m, &c, backend_cpu()), "%s", mn_last_error());
    if (!m) return;
    double t0 = mn_now();
    CHECK_FAILS(model_check_batch(m, 100000000, 16, NULL), MN_ERR_NOMEM, "sequences of 16 tokens fits");
    CHECK(strstr(mn_last_error(), "bytes") && strstr(mn_last_error(), "available"), "message: %s", mn_last_error());
    test_note("%s", mn_last_error());
    CHECK(!model_check_batch(m, 4, 32, NULL), "a small batch: %s", mn_last_error());
    // The batch it names fits.
    const char *at = strstr(mn_last_error(), "at most ");
    CHECK(model_check_batch(m, 100000000, 16, NULL) && (at = strstr(mn_last_error(), "at most ")), "no batch named");
    if (at) CHECK(!model_check_batch(m, atoi(at + 8), 16, NULL), "the batch named does not fit: %s", mn_last_error());
    model_free(m);
    // train refuses it at once, before the loader or the batch buffers
    TmpDir t;
    tmp_make(&t);
    char data[256];
    snprintf(data, sizeof data, "%s/data", t.dir);
    write_toy_shards(data);
    char run[256];
    snprintf(run, sizeof run, "%s", tmp_path(&t, "run"));
    TrainOptions o = toy_options(data, run);
    o.batch = 100000000;
    o.seq = 16;
    FILE *dn = devnull();
    CHECK_FAILS(train_run(&o, dn), MN_ERR_NOMEM, "train: a batch of 100000000 sequences of 16 tokens needs about");
    double dt = mn_now() - t0;
    CHECK(dt < 5, "the refusals took %.1f s", dt);
    fclose(dn);
    tmp_remove(&t);
}

// ---------------------------------------------------------------------------
// Progress line

TEST(robust_first_eta_is_not_from_the_first_step) {
    char buf[32];
    train_eta(buf, sizeof buf, 1000, 0, 0);
    CHECK(!strcmp(buf, "--"), "no step timed: '%s'", buf);
    train_eta(buf, sizeof buf, 1000, 1, 0.1);
    CHECK(!strcmp(buf, "--"), "one step timed: '%s'", buf);
    train_eta(buf, sizeof buf, 1000, 4, 2.0);
    CHECK(!strcmp(buf, "8m20s"), "4 steps in 2 s, 1000 left: '%s'", buf);
    TmpDir t;
    tmp_make(&t);
    char data[256];
    snprintf(data, sizeof data, "%s/data", t.dir);
    write_toy_shards(data);
    char run[256], logpath[256];
    snprintf(run, sizeof run, "%s", tmp_path(&t, "run"));
    snprintf(logpath, sizeof logpath, "%s", tmp_path(&t, "log.txt"));
    TrainOptions o = toy_options(data, run);
    o.steps = 4;
    o.warmup = 1;
    o.log_every = 1;
    FILE *log = fopen(logpath, "w");
    CHECK(!train_run(&o, log), "%s", mn_last_error());
    fclose(log);
    size_t n;
    char *text = (char *)read_bytes(logpath, &n);
    const char *first = text ? strstr(text, "step      1/4") : NULL;
    CHECK(first && strstr(first, "ETA --\n") == strchr(first, '\n') - 6, "the first progress line: %s", first ? first : "(none)");
    free(text);
    tmp_remove(&t);
}

// ---------------------------------------------------------------------------
// Leaks

// dist_launch frees the ranks' environments, strings and all: the heap in use is the same after
// a launch as before it. The ranks are this test binary listing this test's name (and running none).
// Freed small blocks stay in glibc's per-thread cache, which mallinfo counts as in use, until the
// cache holds its fill of each size: the first launches fill it (by 352 to 928 bytes each, then
// 0 from the fifth on), so the heap is compared only after 8 of them. Without the fix every
// launch keeps 320 bytes more.
TEST(robust_rank_launch_frees_its_environments) {
    char *argv[] = {"run_tests", "--list", "robust_rank_launch_frees_its_environments", NULL};
    fflush(stdout);
    int saved = dup(1), null = open("/dev/null", O_WRONLY);  // for the ranks' lists
    CHECK(saved >= 0 && null >= 0 && dup2(null, 1) == 1, "cannot send the ranks' output to /dev/null");
    close(null);
    int s = MN_OK;
    for (int i = 0; i < 8 && !s; i++) s = dist_launch(2, argv);
    size_t before = mallinfo2().uordblks;
    for (int i = 0; i < 3 && !s; i++) s = dist_launch(2, argv);
    size_t after = mallinfo2().uordblks;
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    CHECK(!s, "launch: %s", mn_last_error());
    CHECK(after == before, "the heap grew by %zd bytes over 3 launches of 2 ranks", (ssize_t)(after - before));
}
