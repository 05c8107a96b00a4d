// The mesanet tool's handling of what users type: numbers parsed whole, finite and within each
// option's range (never wrapped), checks named in the options' own terms, eval's lengths, data
// directory, output directory, progress and plots, generate's --prompt-file, and usage lines.
// Most tests run the built tool (beside this test binary) as a subprocess; the option parser is
// also compiled in here, to test it directly.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/common.h"
#include "test.h"
#include "tmpdir.h"
#include "tool_run.h"

// The parser lives with the tool, not in the library: its source is compiled into this test.
#include "../tools/args.c"

char **mesanet_argv;  // args.c's ranks_begin refers to the tool's arguments; unused here

// ---------------------------------------------------------------------------
// The tool as a subprocess (tool_run.h)

static int count(const char *s, const char *what);

// Runs args and checks a non-zero exit with every `want` (up to 3, NULL-ended) in stderr.
static void expect_refusal(TmpDir *td, const char *args, const char *want1, const char *want2, const char *want3) {
    ToolRun r = tool_run(td, args);
    const char *want[3] = {want1, want2, want3};
    CHECK(r.rc != 0 && r.rc != -1, "mesanet %s: exit status %d, expected a refusal", args, r.rc);
    for (int i = 0; i < 3; i++)
        if (want[i]) CHECK(strstr(r.err, want[i]), "mesanet %s: stderr lacks '%s':\n%s", args, want[i], r.err);
    CHECK(!strstr(r.err, "gate_bound") && !strstr(r.err, "lambda"), "mesanet %s: names an internal field:\n%s", args,
          r.err);
    tool_run_free(&r);
}

// ---------------------------------------------------------------------------
// The parser itself

// parse_args over "test <args...>", its stderr caught into err.
static int parse_caught(const Option *opts, int nopts, const char *a1, const char *a2, char *err, size_t cap) {
    char *argv[3] = {"test", (char *)a1, (char *)a2};
    int argc = a2 ? 3 : a1 ? 2 : 1;
    fflush(stderr);
    FILE *tmp = tmpfile();
    int saved = dup(2);
    if (!tmp || saved < 0) die("cannot redirect stderr");
    dup2(fileno(tmp), 2);
    int rc = parse_args(argc, argv, "[options]", opts, nopts, NULL, NULL, 0);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(tmp);
    size_t n = fread(err, 1, cap - 1, tmp);
    err[n] = 0;
    fclose(tmp);
    return rc;
}

TEST(cli_parser_reads_numbers_whole_and_in_range) {
    int n = 7;
    float x = 0.5f;
    Option opts[] = {{"n", OPT_INT, &n, "an integer", 0, 100}, {"x", OPT_FLOAT, &x, "a number", 0, 1}};
    char err[512];
    // Accepted: both bounds, "--name=value", exponents for numbers.
    const struct {
        const char *a1, *a2;
        int n;
        float x;
    } good[] = {{"--n", "0", 0, 0.5f}, {"--n", "100", 100, 0.5f}, {"--n=42", NULL, 42, 0.5f}, {"--n", "+3", 3, 0.5f},
                {"--x", "1", 7, 1.0f}, {"--x", "0", 7, 0.0f},    {"--x=2.5e-1", NULL, 7, 0.25f}};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        n = 7, x = 0.5f;
        int rc = parse_caught(opts, 2, good[i].a1, good[i].a2, err, sizeof err);
        CHECK(rc == 0 && n == good[i].n && x == good[i].x, "%s %s: rc %d, n %d, x %g (%s)", good[i].a1,
              good[i].a2 ? good[i].a2 : "", rc, n, (double)x, err);
    }
    // Refused, the value left alone: out of range, wrapping, partial, blank, not finite.
    const char *bad_n[] = {"101", "-1", "4294967301", "99999999999999999999", "5x", "", " 5", "5 ", "0x10", "5.0", "1e2"};
    for (size_t i = 0; i < sizeof bad_n / sizeof bad_n[0]; i++) {
        n = 7;
        int rc = parse_caught(opts, 2, "--n", bad_n[i], err, sizeof err);
        char want[256];
        snprintf(want, sizeof want, "mesanet test: --n expects an integer in [0, 100], got '%s'\n", bad_n[i]);
        CHECK(rc == 1 && n == 7 && !strcmp(err, want), "--n '%s': rc %d, n %d, message: %s", bad_n[i], rc, n, err);
    }
    const char *bad_x[] = {"nan", "NaN", "inf", "-inf", "1e400", "1.0001", "-0.1", "0.5.", "", "1,5"};
    for (size_t i = 0; i < sizeof bad_x / sizeof bad_x[0]; i++) {
        x = 0.5f;
        int rc = parse_caught(opts, 2, "--x", bad_x[i], err, sizeof err);
        char want[256];
        snprintf(want, sizeof want, "mesanet test: --x expects a number in [0, 1], got '%s'\n", bad_x[i]);
        CHECK(rc == 1 && x == 0.5f && !strcmp(err, want), "--x '%s': rc %d, x %g, message: %s", bad_x[i], rc, (double)x,
              err);
    }
    CHECK(parse_caught(opts, 2, "--n", NULL, err, sizeof err) == 1 && strstr(err, "--n needs a value"), "%s", err);
}

TEST(cli_parser_refuses_numeric_options_without_range) {
    int n = 3, flag = 0;
    float x = 2;
    const char *s = NULL;
    char err[512];
    // A numeric option declared without a range is a programming error, caught before any
    // parsing (--help included); string options and flags need none.
    Option no_range[] = {{"s", OPT_STRING, &s, "a string"}, {"f", OPT_FLAG, &flag, "a flag"}, {"n", OPT_INT, &n, "no range"}};
    CHECK(parse_caught(no_range, 3, "--help", NULL, err, sizeof err) == 1 && strstr(err, "--n") && strstr(err, "no range"),
          "accepted a table with a rangeless option: %s", err);
    CHECK(options_check("test", no_range, 2) == 0, "refused a table of a string and a flag");
    Option bad_default[] = {{"x", OPT_FLOAT, &x, "default outside", 0, 1}};
    CHECK(parse_caught(bad_default, 1, NULL, NULL, err, sizeof err) == 1 && strstr(err, "--x") && strstr(err, "default"),
          "accepted a default outside the range: %s", err);
    Option not_int[] = {{"n", OPT_INT, &n, "range beyond int", 0, 1e10}};
    CHECK(parse_caught(not_int, 1, NULL, NULL, err, sizeof err) == 1 && strstr(err, "--n"),
          "accepted an int range beyond int: %s", err);
    Option reversed[] = {{"n", OPT_INT, &n, "lo > hi", 5, 1}};
    CHECK(parse_caught(reversed, 1, NULL, NULL, err, sizeof err) == 1, "accepted a range with lo > hi");
}

// ---------------------------------------------------------------------------
// Every command, as users run it

static const char *const all_commands[] = {"train",      "eval",           "generate",    "tokenize",
                                           "info",       "logits",         "export",      "bench mesa",
                                           "bench mesa-gpu", "bench train", "bench decode"};

// --help runs the option-table check first, so every command printing its help proves that all
// its numeric options have ranges; the usage line names the whole command.
TEST(cli_every_command_declares_ranges) {
    TmpDir td;
    tmp_make(&td);
    for (size_t i = 0; i < sizeof all_commands / sizeof all_commands[0]; i++) {
        char args[128], usage[128];
        snprintf(args, sizeof args, "%s --help", all_commands[i]);
        ToolRun r = tool_run(&td, args);
        snprintf(usage, sizeof usage, "usage: mesanet %s ", all_commands[i]);
        CHECK(r.rc == 0, "mesanet %s: exit status %d\n%s", args, r.rc, r.err);
        CHECK(!strncmp(r.out, usage, strlen(usage)), "mesanet %s: usage line '%.60s', expected '%s...'", args, r.out,
              usage);
        // Each option line with a numeric default shows its range ("default N, range [lo, hi]").
        int numeric = 0;
        for (const char *p = r.out; (p = strstr(p, ", range [")); p++) numeric++;
        CHECK(numeric > 0 || !strcmp(all_commands[i], "info") || !strcmp(all_commands[i], "export"),
              "mesanet %s: no ranges shown:\n%s", args, r.out);
        tool_run_free(&r);
    }
    tmp_remove(&td);
}

// Each option states one default (the parser adds it: a help text that states its own as well
// says it twice); --backend lists every backend the command takes; an unknown benchmark is named.
TEST(cli_help_texts_state_one_default) {
    TmpDir td;
    tmp_make(&td);
    for (size_t i = 0; i < sizeof all_commands / sizeof all_commands[0]; i++) {
        char args[128];
        snprintf(args, sizeof args, "%s --help", all_commands[i]);
        ToolRun r = tool_run(&td, args);
        for (char *line = strtok(r.out, "\n"); line; line = strtok(NULL, "\n")) {
            CHECK(count(line, "(default") <= 1, "mesanet %s: two defaults in '%s'", args, line);
            if (strstr(line, "--backend") && (!strcmp(all_commands[i], "eval") || !strcmp(all_commands[i], "generate") ||
                                              !strcmp(all_commands[i], "train")))
                CHECK(strstr(line, "ref") && strstr(line, "cuda"), "mesanet %s: '%s' does not list ref", args, line);
        }
        tool_run_free(&r);
    }
    expect_refusal(&td, "bench foo", "unknown benchmark 'foo'", "usage: mesanet bench", NULL);
    tmp_remove(&td);
}

// The inputs that once became silent garbage (a wrapped step count, NaN sampling, negative
// counts): each refused, naming the option and its range.
TEST(cli_refuses_bad_numbers) {
    TmpDir td;
    tmp_make(&td);
    const struct {
        const char *args, *option, *range;
    } cases[] = {
        {"generate --temperature nan", "--temperature", "[0, 100]"},
        {"generate --top-p 2", "--top-p", "[0, 1]"},
        {"generate --top-k -5", "--top-k", "[0, 16777216]"},
        {"generate --cg-steps -1", "--cg-steps", "[0, 10000]"},
        {"generate --tokens 99999999999", "--tokens", "[0, 100000000]"},
        {"generate --cg-tol inf", "--cg-tol", "[0, 1]"},
        {"eval --seq -5", "--seq", "[0, 16777216]"},
        {"eval --batches -3", "--batches", "[0, 1000000000]"},
        {"eval --batch 0", "--batch", "[1, 65536]"},
        {"train --clip nan", "--clip", "[0, 1e6]"},
        {"train --time-limit -1", "--time-limit", "[0, 1e7]"},
        {"train --steps 4294967298", "--steps", "[1, 1000000000]"},
        {"train --lr-final nan", "--lr-final", "[0, 1]"},
        {"train --lr 0", "--lr", "[1e-9, 10]"},
        {"train --seed -1", "--seed", "[0, 2147483647]"},
        {"train --gpus 0", "--gpus", "[1, 256]"},
        {"train --batch 12abc", "--batch", "[1, 65536]"},
        {"tokenize --vocab 100 x.txt", "--vocab", "[257, 16777216]"},
        {"tokenize --valid 1 x.txt", "--valid", "[0, 0.5]"},
        {"logits --cg-steps -2", "--cg-steps", "[0, 10000]"},
        {"bench mesa --T 0", "--T", "[1, 1048576]"},
        {"bench mesa-gpu --reps 0", "--reps", "[1, 10000]"},
        {"bench train --steps 4294967297", "--steps", "[1, 1000000]"},
        {"bench decode --cg-tol -1", "--cg-tol", "[0, 1]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        // "mesanet generate: --top-p expects ... [0, 1], got '2'" (the value follows the option)
        char cmd[64], got[64];
        const char *opt = strstr(cases[i].args, " --");
        snprintf(cmd, sizeof cmd, "mesanet %.*s: %s expects", (int)(opt - cases[i].args), cases[i].args, cases[i].option);
        const char *value = strchr(opt + 1, ' ') + 1;
        snprintf(got, sizeof got, "got '%.*s'", (int)strcspn(value, " "), value);
        expect_refusal(&td, cases[i].args, cmd, cases[i].range, got);
    }
    tmp_remove(&td);
}

// --lin-precision takes auto, split or bf16, in every command that has it; anything else is refused
// naming the option, the value and what it takes, before a model is built.
TEST(cli_refuses_bad_lin_precision) {
    TmpDir td;
    tmp_make(&td);
    expect_refusal(&td, "train --lin-precision fp8", "mesanet train: --lin-precision: 'fp8'", "auto, split or bf16", NULL);
    expect_refusal(&td, "eval --lin-precision BF16", "mesanet eval: --lin-precision: 'BF16'", "auto, split or bf16", NULL);
    expect_refusal(&td, "bench train --lin-precision x", "--lin-precision: 'x'", "auto, split or bf16", NULL);
    tmp_remove(&td);
}

// Checks made in the options' own names, before the trainer would refuse the values in its fields'.
TEST(cli_train_checks_in_option_terms) {
    TmpDir td;
    tmp_make(&td);
    expect_refusal(&td, "train --seq 1", "--seq", "[2, 16777216]", "got '1'");
    expect_refusal(&td, "train --steps 5 --warmup 100", "--warmup (100) must not exceed --steps (5)", NULL, NULL);
    expect_refusal(&td, "train --batch 65536 --seq 65536", "--batch", "--seq", "tokens per micro-batch");
    tmp_remove(&td);
}

// ---------------------------------------------------------------------------
// A tiny run: a corpus, its tokenizer and shards from `mesanet tokenize`, one training step

// Documents of random words from a small list (another list where `other`: another tokenizer),
// separated by "---" lines.
static void write_corpus_of(const char *path, int other) {
    static const char *words[2][14] = {{"the", "a", "model", "state", "memory", "token", "layer", "solver", "step",
                                        "gate", "value", "key", "query", "sum"},
                                       {"whale", "sea", "ship", "captain", "harpoon", "sail", "deck", "storm", "rope",
                                        "wave", "boat", "oar", "crew", "mast"}};
    MnRng r;
    mn_rng_seed(&r, 5);
    FILE *f = fopen(path, "w");
    if (!f) die("cannot write %s", path);
    for (int d = 0; d < 60; d++) {
        for (int w = 0; w < 60; w++) fprintf(f, "%s%s", w ? " " : "", words[other][mn_rng_u64(&r) % 14]);
        fprintf(f, "\n---\n");
    }
    if (fclose(f)) die("cannot write %s", path);
}

static void write_corpus(const char *path) { write_corpus_of(path, 0); }

// <td>/data (tokenizer of 300 tokens, about 4000 training and 1000 validation tokens) and
// <td>/run (the tiny config, trained at 16 tokens a sequence); 0 on success.
static int make_tiny_run(TmpDir *td) {
    char args[1024];
    write_corpus(tmp_path(td, "corpus.txt"));
    snprintf(args, sizeof args, "tokenize --out %s/data --vocab 300 --valid 0.2 --doc-sep --- %s/corpus.txt", td->dir,
             td->dir);
    ToolRun r = tool_run(td, args);
    CHECK(r.rc == 0, "tokenize: %s", r.err);
    int rc = r.rc;
    tool_run_free(&r);
    if (rc) return rc;
    snprintf(args, sizeof args,
             "train --config tiny --data %s/data --out %s/run --steps 1 --warmup 0 --batch 2 --seq 16 --eval-every 0 "
             "--save-every 0",
             td->dir, td->dir);
    r = tool_run(td, args);
    CHECK(r.rc == 0, "train: %s", r.err);
    rc = r.rc;
    tool_run_free(&r);
    return rc;
}

// tokenize never overwrites a directory that holds files (a data directory runs read) unless
// --force; an empty or new one is written, a file is refused.
TEST(cli_tokenize_refuses_to_overwrite) {
    TmpDir td;
    tmp_make(&td);
    char args[1024], want[512];
    write_corpus(tmp_path(&td, "corpus.txt"));
    write_corpus_of(tmp_path(&td, "other.txt"), 1);
    CHECK(!mn_mkdirs(tmp_path(&td, "data")), "%s", mn_last_error());  // empty: written
    snprintf(args, sizeof args, "tokenize --out %s/data --vocab 300 --doc-sep --- %s/corpus.txt", td.dir, td.dir);
    ToolRun r = tool_run(&td, args);
    CHECK(r.rc == 0, "into an empty directory: exit status %d\n%s", r.rc, r.err);
    tool_run_free(&r);
    size_t n0, n1;
    unsigned char *before = read_bytes(tmp_path(&td, "data/encoder.json"), &n0);
    snprintf(args, sizeof args, "tokenize --out %s/data --vocab 300 --doc-sep --- %s/other.txt", td.dir, td.dir);
    snprintf(want, sizeof want, "--out %s/data already holds 4 files", td.dir);
    expect_refusal(&td, args, want, "encoder.json", "give --force");
    unsigned char *after = read_bytes(tmp_path(&td, "data/encoder.json"), &n1);
    CHECK(before && after && n0 == n1 && !memcmp(before, after, n0), "the refused run changed encoder.json");
    free(after);
    strcat(args, " --force");
    r = tool_run(&td, args);
    after = read_bytes(tmp_path(&td, "data/encoder.json"), &n1);
    CHECK(r.rc == 0 && after && (n0 != n1 || memcmp(before, after, n0)), "--force: exit status %d, tokenizer %s\n%s",
          r.rc, after && n0 == n1 && !memcmp(before, after, n0) ? "unchanged" : "rewritten", r.err);
    tool_run_free(&r);
    free(before);
    free(after);
    snprintf(args, sizeof args, "tokenize --out %s/corpus.txt %s/other.txt", td.dir, td.dir);
    expect_refusal(&td, args, "--out", "corpus.txt: not a directory", NULL);
    tmp_remove(&td);
}

static int count(const char *s, const char *what) {
    int n = 0;
    for (const char *p = s; (p = strstr(p, what)); p += strlen(what)) n++;
    return n;
}

TEST(cli_eval_validates_lengths_and_reports) {
    TmpDir td;
    tmp_make(&td);
    if (make_tiny_run(&td)) {
        tmp_remove(&td);
        return;
    }
    char args[2048], base[1024];
    snprintf(base, sizeof base, "eval --model %s/run --data %s/data --batch 2 --batches 2", td.dir, td.dir);
    // --lengths: each factor a positive integer within range, and the sequences within the data,
    // refused before any evaluation (once: an error inside the table and exit status 0)
    const char *bad[] = {"100000000", "0", "-2", "2,", ",2", "1,,2", "2x", "99999999999999999999", "1 2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(args, sizeof args, "%s --lengths '%s'", base, bad[i]);
        expect_refusal(&td, args, "mesanet eval: --lengths", "[1, 4096]", bad[i]);
    }
    snprintf(args, sizeof args, "%s --lengths 1,4096", base);
    expect_refusal(&td, args, "--lengths factor 4096", "65536 tokens", "valid.bin");
    snprintf(args, sizeof args, "%s --seq 100000", base);
    expect_refusal(&td, args, "--seq", "100000 tokens", "valid.bin");
    // --out that cannot be a directory: refused with the reason, before any work
    write_bytes(tmp_path(&td, "a-file"), "x", 1);
    snprintf(args, sizeof args, "%s --out %s/a-file/eval", base, td.dir);
    expect_refusal(&td, args, "mesanet eval: --out", "a-file", "not a directory");

    // A good evaluation: lengths, the sweep, progress on stderr, the plots.
    snprintf(args, sizeof args, "%s --lengths 1,2 --cg-sweep --out %s/deep/er/eval", base, td.dir);
    ToolRun r = tool_run(&td, args);
    CHECK(r.rc == 0, "mesanet %s: exit status %d\n%s", args, r.rc, r.err);
    CHECK(strstr(r.out, "length extrapolation") && strstr(r.out, "\n        32 ") && strstr(r.out, "tol 1e-5"),
          "report:\n%s", r.out);
    CHECK(strstr(r.err, "eval loss: 2 batches in") && strstr(r.err, "tokens/s") && strstr(r.err, "eval length 32:") &&
              strstr(r.err, "eval tol 1e-5:"),
          "progress on stderr:\n%s", r.err);
    tool_run_free(&r);
    char *svg = read_text(tmp_path(&td, "deep/er/eval/nll_by_position.svg"));
    CHECK(strstr(svg, ">per position<") && strstr(svg, ">running mean<"), "NLL plot lacks the running mean");
    free(svg);
    svg = read_text(tmp_path(&td, "deep/er/eval/cg_sweep.svg"));
    CHECK(count(svg, "class=\"panel\"") == 2, "CG sweep: %d panels, expected 2", count(svg, "class=\"panel\""));
    CHECK(count(svg, "class=\"xtick\"") == 18 && strstr(svg, ">30</text>") && strstr(svg, ">1e\xe2\x88\x92" "5</text>"),
          "CG sweep: the settings are not the labelled x axis of both panels");
    CHECK(count(svg, "class=\"series\"") == 4, "CG sweep: %d lines, expected 2 a panel", count(svg, "class=\"series\""));
    free(svg);
    char *csv = read_text(tmp_path(&td, "deep/er/eval/cg_sweep.csv"));
    CHECK(!strncmp(csv, "max_steps,tol,nll,perplexity,mean_cg_steps\n", 43) && count(csv, "\n") == 10,
          "cg_sweep.csv:\n%s", csv);
    free(csv);
    tmp_remove(&td);
}

// Without --data, eval scores the run's own data as its run.json records it, and says so where
// the run records none (a run made before run.json).
TEST(cli_eval_defaults_to_the_runs_data) {
    TmpDir td;
    tmp_make(&td);
    if (make_tiny_run(&td)) {
        tmp_remove(&td);
        return;
    }
    char args[1024], want[512];
    snprintf(args, sizeof args, "eval --model %s/run --batch 2 --batches 1 --out %s/e", td.dir, td.dir);
    ToolRun r = tool_run(&td, args);
    snprintf(want, sizeof want, " on %s/data/valid.bin:", td.dir);
    CHECK(r.rc == 0 && strstr(r.out, want), "eval without --data: exit status %d, expected '%s' in:\n%s%s", r.rc, want,
          r.out, r.err);
    tool_run_free(&r);
    CHECK(!remove(tmp_path(&td, "run/run.json")), "the trainer wrote no run.json");
    r = tool_run(&td, args);
    CHECK(strstr(r.err, "does not record its data directory") && strstr(r.err, "data/demo"),
          "no note of the fallback:\n%s", r.err);
    tool_run_free(&r);
    tmp_remove(&td);
}

// <td>/<name>-data, tokenized from another corpus (another tokenizer) with `vocab` tokens, and
// <td>/<name>, a tiny model trained on it; 0 on success.
static int make_other_run(TmpDir *td, const char *name, int vocab) {
    char args[1024];
    write_corpus_of(tmp_path(td, "other.txt"), 1);
    snprintf(args, sizeof args, "tokenize --out %s/%s-data --vocab %d --valid 0.2 --doc-sep --- %s/other.txt", td->dir,
             name, vocab, td->dir);
    ToolRun r = tool_run(td, args);
    int rc = r.rc;
    CHECK(rc == 0, "tokenize: %s", r.err);
    tool_run_free(&r);
    if (rc) return rc;
    snprintf(args, sizeof args,
             "train --config tiny --data %s/%s-data --out %s/%s --steps 1 --warmup 0 --batch 2 --seq 16 "
             "--eval-every 0 --eval-batches 1 --save-every 0",
             td->dir, name, td->dir, name);
    r = tool_run(td, args);
    rc = r.rc;
    CHECK(rc == 0, "train: %s", r.err);
    tool_run_free(&r);
    return rc;
}

// Runs an evaluation that must be refused before any work: a non-zero exit, every `want` in stderr,
// and nothing scored (no report on stdout).
static void expect_early_refusal(TmpDir *td, const char *args, const char *want1, const char *want2, const char *want3) {
    expect_refusal(td, args, want1, want2, want3);
    ToolRun r = tool_run(td, args);
    CHECK(!strstr(r.out, "loss") && !strstr(r.err, "eval loss"), "mesanet %s: refused only after scoring:\n%s%s", args,
          r.out, r.err);
    tool_run_free(&r);
}

// A second model, or data, from another tokenizer is refused before any work, naming the option
// and the run: two BPEs of one size give ids of the same range, which would be scored silently.
TEST(cli_eval_refuses_another_tokenizer) {
    TmpDir td;
    tmp_make(&td);
    if (make_tiny_run(&td) || make_other_run(&td, "same-size", 300) || make_other_run(&td, "smaller", 290)) {
        tmp_remove(&td);
        return;
    }
    char args[2048], base[1024], want[1024];
    snprintf(base, sizeof base, "eval --model %s/run --batch 2 --batches 1 --out %s/e", td.dir, td.dir);
    // the same model, the same tokenizer: scored
    snprintf(args, sizeof args, "%s --compare %s/run", base, td.dir);
    ToolRun r = tool_run(&td, args);
    CHECK(r.rc == 0 && strstr(r.out, "perplexity"), "mesanet %s: exit status %d\n%s%s", args, r.rc, r.out, r.err);
    tool_run_free(&r);
    // --compare: another tokenizer of the same size, another vocabulary size, empty, a file
    snprintf(args, sizeof args, "%s --compare %s/same-size", base, td.dir);
    snprintf(want, sizeof want, "--compare %s/same-size: its tokenizer differs from %s/run's", td.dir, td.dir);
    expect_early_refusal(&td, args, want, "encoder.json differs", NULL);
    snprintf(args, sizeof args, "%s --compare %s/smaller", base, td.dir);
    snprintf(want, sizeof want, "--compare %s/smaller: vocabulary 290, but %s/run has 300", td.dir, td.dir);
    expect_early_refusal(&td, args, want, "another tokenizer", NULL);
    snprintf(args, sizeof args, "%s --compare ''", base);
    expect_early_refusal(&td, args, "--compare is empty", "run directory", NULL);
    write_bytes(tmp_path(&td, "c.json"), "{}", 2);
    snprintf(args, sizeof args, "%s --compare %s/c.json", base, td.dir);
    snprintf(want, sizeof want, "--compare %s/c.json: not a run directory", td.dir);
    expect_early_refusal(&td, args, want, NULL, NULL);
    // --data and --shard of another tokenizer; a shard of a larger vocabulary than the model's
    snprintf(args, sizeof args, "%s --data %s/same-size-data", base, td.dir);
    snprintf(want, sizeof want, "--data %s/same-size-data: its tokenizer differs from %s/run's", td.dir, td.dir);
    expect_early_refusal(&td, args, want, "encoder.json differs", NULL);
    snprintf(args, sizeof args, "%s --shard %s/same-size-data/valid.bin", base, td.dir);
    expect_early_refusal(&td, args, "--shard", "its tokenizer differs", NULL);
    snprintf(args, sizeof args, "eval --model %s/smaller --data %s/data --batch 2 --batches 1 --out %s/e", td.dir,
             td.dir, td.dir);
    expect_early_refusal(&td, args, "--data", "300-token vocabulary", "has 290");
    // the run's own data, tokenized again since the run was trained (found through its run.json)
    char *enc = read_text(tmp_path(&td, "same-size-data/encoder.json"));
    write_bytes(tmp_path(&td, "data/encoder.json"), enc, strlen(enc));
    free(enc);
    expect_early_refusal(&td, base, "from its run.json", "its tokenizer differs from", "give --data");
    tmp_remove(&td);
}

TEST(cli_generate_reads_the_prompt_from_a_file) {
    TmpDir td;
    tmp_make(&td);
    if (make_tiny_run(&td)) {
        tmp_remove(&td);
        return;
    }
    char args[1024];
    const char *prompt = "the model state\nand its memory";
    write_bytes(tmp_path(&td, "prompt.txt"), prompt, strlen(prompt));
    snprintf(args, sizeof args, "generate --model %s/run --prompt-file %s/prompt.txt --tokens 3 --quiet", td.dir, td.dir);
    ToolRun r = tool_run(&td, args);
    CHECK(r.rc == 0 && !strncmp(r.out, prompt, strlen(prompt)), "exit status %d; the text does not start with the file's:\n%s%s",
          r.rc, r.out, r.err);
    tool_run_free(&r);
    snprintf(args, sizeof args, "generate --model %s/run --prompt-file %s/no-such-file", td.dir, td.dir);
    expect_refusal(&td, args, "--prompt-file", "no-such-file", "No such file");
    snprintf(args, sizeof args, "generate --model %s/run --prompt-file %s", td.dir, td.dir);
    expect_refusal(&td, args, "--prompt-file", "cannot read", NULL);
    snprintf(args, sizeof args, "generate --model %s/run --prompt hi --prompt-file %s/prompt.txt", td.dir, td.dir);
    expect_refusal(&td, args, "--prompt", "--prompt-file", "not both");
    tmp_remove(&td);
}

// With stdout not a terminal (buffered apart from stderr), the statistics still start on a line of
// their own after the text; a prompt longer than an attention model's training context gets a
// notice, one that recurrent models and short prompts do not get.
TEST(cli_generate_statistics_and_context_notice) {
    TmpDir td;
    tmp_make(&td);
    if (make_tiny_run(&td)) {
        tmp_remove(&td);
        return;
    }
    char args[2048];
    snprintf(args, sizeof args, "generate --model %s/run --prompt 'the model' --tokens 4", td.dir);
    ToolRun r = tool_run_merged(&td, args);
    const char *stats = strstr(r.out, "[prompt: ");
    CHECK(r.rc == 0 && stats && stats > r.out && stats[-1] == '\n' && !strncmp(r.out, "the model", 9),
          "exit status %d; the statistics do not follow the text on a line of their own:\n%s", r.rc, r.out);
    tool_run_free(&r);
    const char *json = "{\"preset\": \"tiny\", \"mixer\": \"mha\"}";
    write_bytes(tmp_path(&td, "mha.json"), json, strlen(json));
    snprintf(args, sizeof args,
             "train --config %s/mha.json --data %s/data --out %s/mha --steps 1 --warmup 0 --batch 2 --seq 16 "
             "--eval-batches 1 --save-every 0",
             td.dir, td.dir, td.dir);
    r = tool_run(&td, args);
    CHECK(r.rc == 0, "train mha: %s", r.err);
    tool_run_free(&r);
    const char *text = "the model state and its memory token layer solver step gate value key query sum the a model";
    write_bytes(tmp_path(&td, "long.txt"), text, strlen(text));
    const struct {
        const char *run;
        int long_prompt, notice;
    } cases[] = {{"mha", 1, 1}, {"mha", 0, 0}, {"run", 1, 0}};  // ("run": Mesa's, recurrent)
    for (int i = 0; i < 3; i++) {
        char prompt[300];
        if (cases[i].long_prompt) snprintf(prompt, sizeof prompt, "--prompt-file %s/long.txt", td.dir);
        else snprintf(prompt, sizeof prompt, "--prompt 'the model'");
        snprintf(args, sizeof args, "generate --model %s/%s %s --tokens 2 --quiet", td.dir, cases[i].run, prompt);
        r = tool_run(&td, args);
        int noted = strstr(r.err, "beyond the 16-token context") && strstr(r.err, "(mha)");
        CHECK(r.rc == 0 && noted == cases[i].notice, "mesanet %s: exit status %d, %s notice:\n%s", args, r.rc,
              noted ? "a" : "no", r.err);
        tool_run_free(&r);
    }
    tmp_remove(&td);
}

// A model of a mixer pattern (no Mesa layer in its first block) trains, evaluates and generates
// through the tool, and reports no CG statistics where no layer solves with CG.
TEST(cli_pattern_model_trains_evaluates_generates) {
    TmpDir td;
    tmp_make(&td);
    if (make_tiny_run(&td)) {
        tmp_remove(&td);
        return;
    }
    char args[2048];
    const char *cfgs[2] = {"{\"preset\": \"tiny\", \"mixer\": \"gdn,mesa\"}", "{\"preset\": \"tiny\", \"mixer\": \"gla\"}"};
    for (int i = 0; i < 2; i++) {
        write_bytes(tmp_path(&td, "cfg.json"), cfgs[i], strlen(cfgs[i]));
        snprintf(args, sizeof args,
                 "train --config %s/cfg.json --data %s/data --out %s/pat%d --steps 2 --warmup 0 --batch 2 --seq 16 "
                 "--eval-every 2 --eval-batches 1 --save-every 0",
                 td.dir, td.dir, td.dir, i);
        ToolRun r = tool_run(&td, args);
        CHECK(r.rc == 0, "mesanet %s: exit status %d\n%s", args, r.rc, r.err);
        CHECK(!strstr(r.out, "CG steps") == (i == 1), "CG statistics of %s:\n%s", cfgs[i], r.out);
        tool_run_free(&r);
        snprintf(args, sizeof args, "eval --model %s/pat%d --batch 2 --batches 1", td.dir, i);
        r = tool_run(&td, args);
        CHECK(r.rc == 0 && strstr(r.out, "perplexity"), "mesanet %s: exit status %d\n%s%s", args, r.rc, r.out, r.err);
        tool_run_free(&r);
        snprintf(args, sizeof args, "generate --model %s/pat%d --prompt the --tokens 4", td.dir, i);
        r = tool_run(&td, args);
        CHECK(r.rc == 0 && strstr(r.err, "generated") && !strstr(r.err, "CG steps") == (i == 1),
              "mesanet %s: exit status %d\n%s%s", args, r.rc, r.out, r.err);
        tool_run_free(&r);
    }
    tmp_remove(&td);
}

// "1 steps" and the like: a count of one anywhere in the text, before a plural noun.
static const char *plural_after_one(const char *text) {
    static const char *nouns[] = {"steps", "blocks", "batches", "files", "documents", "sequences", "tokens", "heads"};
    for (const char *p = text; (p = strstr(p, "1 ")); p++) {
        if (p > text && p[-1] >= '0' && p[-1] <= '9') continue;  // 11, 21, ...
        if (p > text && p[-1] == '.') continue;                   // 0.1
        for (size_t i = 0; i < sizeof nouns / sizeof nouns[0]; i++)
            if (!strncmp(p + 2, nouns[i], strlen(nouns[i]))) return p;
    }
    return NULL;
}

// Counts of one read in the singular: tokenize (1 file), train (1 step), eval (1 batch, 1 step of
// the CG sweep), info (1 block, 1 head), generate (a prompt of 1 token).
TEST(cli_counts_of_one_are_singular) {
    TmpDir td;
    tmp_make(&td);
    write_corpus(tmp_path(&td, "corpus.txt"));
    const char *json = "{\"preset\": \"tiny\", \"n_layers\": 1, \"n_heads\": 1, \"head_dim\": 32}";
    write_bytes(tmp_path(&td, "one.json"), json, strlen(json));
    char cmds[5][1024];
    snprintf(cmds[0], sizeof cmds[0], "tokenize --out %s/data --vocab 300 --valid 0.2 %s/corpus.txt", td.dir, td.dir);
    snprintf(cmds[1], sizeof cmds[1],
             "train --config %s/one.json --data %s/data --out %s/run --steps 1 --warmup 0 --batch 1 --seq 16 "
             "--eval-batches 1",
             td.dir, td.dir, td.dir);
    snprintf(cmds[2], sizeof cmds[2], "eval --model %s/run --batch 1 --batches 1 --cg-sweep", td.dir);
    snprintf(cmds[3], sizeof cmds[3], "info %s/one.json", td.dir);
    snprintf(cmds[4], sizeof cmds[4], "generate --model %s/run --tokens 1 --temperature 0", td.dir);
    for (int i = 0; i < 5; i++) {
        ToolRun r = tool_run(&td, cmds[i]);
        CHECK(r.rc == 0, "mesanet %s: exit status %d\n%s", cmds[i], r.rc, r.err);
        const char *bad = plural_after_one(r.out), *bad_err = plural_after_one(r.err);
        CHECK(!bad && !bad_err, "mesanet %s: '%.20s'", cmds[i], bad ? bad : bad_err);
        if (i == 2) CHECK(strstr(r.err, "eval loss: 1 batch in") && strstr(r.out, "1 step "), "eval:\n%s%s", r.out, r.err);
        tool_run_free(&r);
    }
    tmp_remove(&td);
}

TEST(cli_logits_checks_token_ids) {
    TmpDir td;
    tmp_make(&td);
    if (make_tiny_run(&td)) {
        tmp_remove(&td);
        return;
    }
    char args[1024];
    const char *bad[] = {"1,,2", "1,300", "-1", "1,2,", "", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(args, sizeof args, "logits --model %s/run --tokens '%s' --out %s/l.bin", td.dir, bad[i], td.dir);
        expect_refusal(&td, args, "mesanet logits: --tokens", "[0, 299]", NULL);
    }
    snprintf(args, sizeof args, "logits --model %s/run --tokens 1,2,299 --out %s/l.bin", td.dir, td.dir);
    ToolRun r = tool_run(&td, args);
    size_t n = 0;
    free(read_bytes(tmp_path(&td, "l.bin"), &n));
    CHECK(r.rc == 0 && n == 3 * 300 * sizeof(float), "exit status %d, %zu bytes of logits:\n%s", r.rc, n, r.err);
    tool_run_free(&r);
    tmp_remove(&td);
}

// `bench lin --backend cpu --hard`: every hard input (no decay, one key, beta near 2, both) for each
// variant that has the gate it changes, 11 rows, each error against float64 at float32's size
// (measured 1e-7 .. 1.03e-5: the delta rule's dbeta with one key and beta near 2); a wrong index or
// a missing term would be O(1). "nan" where a variant has no such gate (deltanet's dg, mamba2's
// dbeta). And an unknown --paths entry is refused by name.
TEST(cli_bench_lin_hard_inputs) {
    TmpDir td;
    tmp_make(&td);
    ToolRun r = tool_run(&td, "bench lin --backend cpu --hard");
    CHECK(r.rc == 0, "bench lin --hard: exit status %d\n%s", r.rc, r.err);
    int rows = 0, nans = 0;
    for (const char *line = r.out; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        const char *bar = strstr(line, " cpu    |");
        const char *eol = strchr(line, '\n');
        if (!bar || (eol && bar > eol)) continue;
        rows++;
        const char *p = bar + strlen(" cpu    |");
        for (int i = 0; i < 6; i++) {
            while (*p == ' ') p++;
            if (!strncmp(p, "nan", 3)) {
                nans++;
                p += 3;
                continue;
            }
            char *end;
            double e = strtod(p, &end);
            CHECK(end != p && e >= 0 && e <= 1e-4, "bench lin --hard: error %d of '%.80s' is %g (tolerance 1e-4)", i,
                  line, e);
            p = end;
        }
    }
    CHECK(rows == 11 && nans == 5, "bench lin --hard: %d rows with %d nan, expected 11 and 5:\n%s", rows, nans, r.out);
    tool_run_free(&r);
    r = tool_run(&td, "bench lin --backend cuda --paths split,fast");
    CHECK(r.rc != 0 && strstr(r.err, "--paths") && strstr(r.err, "fast"), "bench lin --paths fast: status %d\n%s", r.rc,
          r.err);
    tool_run_free(&r);
    tmp_remove(&td);
}
