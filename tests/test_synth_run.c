// mesanet synth and src/synth/run.h: a --quick sweep end to end, resuming, refusals, option
// ranges; the library's run on a tiny setting and its published numbers.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/common.h"
#include "synth/run.h"
#include "test.h"
#include "tmpdir.h"
#include "tool_run.h"

static int count_lines(const char *text) {
    int n = 0;
    for (const char *p = text; *p; p++) n += *p == '\n';
    return n;
}

TEST(synth_run_cli_quick_mqar_writes_results) {
    TmpDir td;
    tmp_make(&td);
    char args[512];
    snprintf(args, sizeof args, "synth mqar --mixers gdn,mha --quick --out %s/sweep", td.dir);
    ToolRun r = tool_run(&td, args);
    CHECK(r.rc == 0, "mesanet %s: exit status %d\n%s", args, r.rc, r.err);
    CHECK(strstr(r.out, "[2/2] mqar baseline mha") && strstr(r.out, "ETA"), "no progress lines:\n%s", r.out);
    CHECK(strstr(r.out, "gdn") && strstr(r.out, "mean"), "no table:\n%s", r.out);
    CHECK(strstr(r.out, "published: Zoology"), "no published source for mqar's attention:\n%s", r.out);
    char *csv = read_text(tmp_path(&td, "sweep/results.csv"));
    CHECK(count_lines(csv) == 3, "results.csv: %d lines, expected a header and 2 rows:\n%s", count_lines(csv), csv);
    CHECK(!strncmp(csv, "task,setting,mixer,", 19), "results.csv header: %.60s", csv);
    CHECK(strstr(csv, "mqar,baseline,gdn,quick,") && strstr(csv, "mqar,baseline,mha,quick,"), "rows:\n%s", csv);
    char *json = read_text(tmp_path(&td, "sweep/results.json"));
    CHECK(strstr(json, "\"mixer\": \"mha\"") && strstr(json, "\"metric\": "), "results.json:\n%s", json);
    char *svg = read_text(tmp_path(&td, "sweep/mqar.svg"));
    CHECK(strstr(svg, "<svg"), "mqar.svg is not an SVG");
    free(csv), free(json), free(svg);
    tool_run_free(&r);
    tmp_remove(&td);
}

TEST(synth_run_cli_resumes_without_redoing_runs) {
    TmpDir td;
    tmp_make(&td);
    char args[512];
    snprintf(args, sizeof args, "synth mad-recall --mixers gdn,gla --quick --out %s/sweep --stop-after 1", td.dir);
    ToolRun r = tool_run(&td, args);
    CHECK(r.rc == 0, "mesanet %s: exit status %d\n%s", args, r.rc, r.err);
    CHECK(strstr(r.out, "stopped after 1 new run"), "no word of stopping:\n%s", r.out);
    char *first = read_text(tmp_path(&td, "sweep/results.csv"));
    CHECK(count_lines(first) == 2, "after --stop-after 1: %d lines\n%s", count_lines(first), first);
    tool_run_free(&r);
    // --report: the table of what is recorded, nothing trained, results.csv unchanged
    snprintf(args, sizeof args, "synth mad-recall --mixers gdn,gla --quick --out %s/sweep --report", td.dir);
    r = tool_run(&td, args);
    CHECK(r.rc == 0 && !strstr(r.out, "training") && strstr(r.out, "1 of 2 run(s) recorded, 1 not run yet") &&
              strstr(r.out, "mad-recall (metric"),
          "mesanet %s:\n%s", args, r.out);
    char *reported = read_text(tmp_path(&td, "sweep/results.csv"));
    CHECK(reported && !strcmp(first, reported), "--report changed results.csv");
    free(reported);
    tool_run_free(&r);
    snprintf(args, sizeof args, "synth mad-recall --mixers gdn,gla --quick --out %s/sweep", td.dir);
    r = tool_run(&td, args);
    CHECK(r.rc == 0, "mesanet %s: exit status %d\n%s", args, r.rc, r.err);
    CHECK(strstr(r.out, "[1/2] mad-recall baseline gdn lr 0.003 wd 0: already in results.csv, skipped"),
          "the recorded run is not skipped:\n%s", r.out);
    CHECK(strstr(r.out, "[2/2] mad-recall baseline gla") && strstr(r.out, "1 run(s) were already recorded"),
          "the second run did not run:\n%s", r.out);
    char *second = read_text(tmp_path(&td, "sweep/results.csv"));
    CHECK(count_lines(second) == 3, "after the resume: %d lines\n%s", count_lines(second), second);
    CHECK(!strncmp(first, second, strlen(first)), "the recorded row changed:\n%s\nthen\n%s", first, second);
    free(first), free(second);
    tool_run_free(&r);
    // A third call runs nothing.
    r = tool_run(&td, args);
    CHECK(r.rc == 0 && !strstr(r.out, "training ..."), "a finished sweep ran again:\n%s", r.out);
    tool_run_free(&r);
    tmp_remove(&td);
}

// MAD compression end to end (the autoencoder head), and the MesaNet paper's Table 1 with its fifth
// column (compress) when compression is among the tasks, four columns and their average otherwise.
TEST(synth_run_cli_mad_compression_and_table) {
    TmpDir td;
    tmp_make(&td);
    char args[512];
    snprintf(args, sizeof args, "synth mad-compression --mixers mha --quick --out %s/comp", td.dir);
    ToolRun r = tool_run(&td, args);
    CHECK(r.rc == 0, "mesanet %s: exit status %d\n%s", args, r.rc, r.err);
    CHECK(strstr(r.out, "[1/1] mad-compression baseline mha lr 0.003 wd 0: metric "), "no run:\n%s", r.out);
    CHECK(strstr(r.out, "49.5 (compress)"), "no published compression number:\n%s", r.out);
    tool_run_free(&r);
    snprintf(args, sizeof args, "synth mad --mixers mha,mesa --quick --report --out %s/table", td.dir);
    r = tool_run(&td, args);
    CHECK(r.rc == 0 && strstr(r.out, "averages over the five columns") && strstr(r.out, "compress") &&
              strstr(r.out, "avg of five") && strstr(r.out, "- (75.8)") && strstr(r.out, "- (76.1)") &&
              !strstr(r.out, "compression not run"),
          "mesanet %s: %d\n%s%s", args, r.rc, r.out, r.err);
    tool_run_free(&r);
    snprintf(args, sizeof args,
             "synth mad-recall,mad-noisy-recall,mad-fuzzy-recall,mad-memorization,mad-selective-copy --mixers mha "
             "--quick --report --out %s/table",
             td.dir);
    r = tool_run(&td, args);
    CHECK(r.rc == 0 && strstr(r.out, "compression not run") && strstr(r.out, "avg of four") &&
              strstr(r.out, "- (82.3)"),
          "mesanet %s: %d\n%s%s", args, r.rc, r.out, r.err);
    tool_run_free(&r);
    tmp_remove(&td);
}

TEST(synth_run_cli_refusals) {
    TmpDir td;
    tmp_make(&td);
    const struct {
        const char *args, *want1, *want2;
    } cases[] = {
        {"synth nosuch --mixers gdn --quick", "unknown task 'nosuch'", "mqar"},
        {"synth mqar --mixers gdn,bogus --quick", "unknown or unusable mixer 'bogus'", NULL},
        {"synth mqar --quick", "--mixers is required", NULL},
        {"synth mqar --mixers gdn --settings some", "--settings must be baseline or full", NULL},
        {"synth mqar --mixers gdn --backend nope", "--backend", NULL},
        {"synth --mixers gdn", "a task is required", "mad-recall"},
        {"synth mqar --mixers gdn --seed -1", "--seed", "[0, 1000000000]"},
        {"synth mqar --mixers gdn --stop-after -2", "--stop-after", "[0, 1000000000]"},
        {"synth mqar --mixers gdn --dim 70000", "--dim", "[0, 65536]"},
        {"synth mqar --mixers gdn --epochs 1.5", "--epochs", "[0, 1000000]"},
        {"synth mqar --mixers gdn --max-steps nan", "--max-steps", "[0, 1000000000]"},
        {"synth mqar --mixers gdn --batch -1", "--batch", "[0, 65536]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[512];
        snprintf(args, sizeof args, "%s --out %s/x", cases[i].args, td.dir);
        ToolRun r = tool_run(&td, args);
        CHECK(r.rc != 0 && r.rc != -1, "mesanet %s: exit status %d, expected a refusal", args, r.rc);
        CHECK(strstr(r.err, cases[i].want1), "mesanet %s: stderr lacks '%s':\n%s", args, cases[i].want1, r.err);
        if (cases[i].want2)
            CHECK(strstr(r.err, cases[i].want2), "mesanet %s: stderr lacks '%s':\n%s", args, cases[i].want2, r.err);
        CHECK(!strstr(r.out, "training"), "mesanet %s: trained before refusing", args);
        tool_run_free(&r);
    }
    tmp_remove(&td);
}

// Every numeric option of synth --help shows its range.
TEST(synth_run_cli_every_numeric_option_has_a_range) {
    TmpDir td;
    tmp_make(&td);
    ToolRun r = tool_run(&td, "synth --help");
    CHECK(r.rc == 0 && !strncmp(r.out, "usage: mesanet synth ", 21), "synth --help: %d\n%s", r.rc, r.out);
    int numeric = 0;
    for (char *line = strtok(r.out, "\n"); line; line = strtok(NULL, "\n")) {
        char *d = strstr(line, "(default ");
        if (!d || !(d[9] == '-' || (d[9] >= '0' && d[9] <= '9'))) continue;
        numeric++;
        CHECK(strstr(line, ", range ["), "a numeric option without a range: %s", line);
    }
    CHECK(numeric >= 6, "synth --help: %d numeric options, expected 6", numeric);
    tool_run_free(&r);
    tmp_remove(&td);
}

TEST(synth_run_library_trains_and_scores) {
    const SynthTask *t = synth_find("mad-memorization");
    CHECK(t != NULL, "no mad-memorization");
    if (!t) return;
    SynthProtocol p;
    synth_protocol(t, 1, &p);
    CHECK(p.nlr == 1 && p.max_steps > 0 && p.dim == 32, "quick protocol: %d lrs, %d steps, width %d", p.nlr,
          p.max_steps, p.dim);
    SynthSettings s;
    CHECK(!synth_grid(t, 0, &s, NULL, 0), "%s", mn_last_error());
    synth_quick_settings(t, &s);
    CHECK(!synth_check(t, &s) && s.n_train == 256, "quick settings: %s", mn_last_error());
    p.max_steps = 20;
    SynthRunResult r;
    int st = synth_run(t, &s, &p, "gdn", p.lrs[0], p.wds[0], 3, backend_by_name("cpu"), NULL, &r);
    CHECK(!st, "synth_run: %s", mn_last_error());
    CHECK(r.steps == 20 && r.metric >= 0 && r.metric <= 1 && isfinite(r.final_loss), "steps %d metric %g loss %g",
          r.steps, r.metric, r.final_loss);
    SynthRunResult again;
    st = synth_run(t, &s, &p, "gdn", p.lrs[0], p.wds[0], 3, backend_by_name("cpu"), NULL, &again);
    CHECK(!st && again.metric == r.metric && again.final_loss == r.final_loss, "not deterministic: %g %g", r.metric,
          again.metric);
    ModelConfig c;
    CHECK(synth_model_config(t, &s, &p, "nonsense", &c) != 0, "an unknown mixer accepted");
    CHECK(synth_model_config(t, &s, &p, "gdn,mha", &c) == 0 && c.dim == 32 && c.n_layers == 2, "pattern: %s",
          mn_last_error());
    // NAME:neg: negative eigenvalues, on the delta rules only; parity takes every mixer
    CHECK(synth_model_config(t, &s, &p, "gdn:neg", &c) == 0 && c.neg_eigen && !strcmp(c.mixer, "gdn"), "gdn:neg: %s",
          mn_last_error());
    CHECK(synth_model_config(t, &s, &p, "gdn", &c) == 0 && !c.neg_eigen, "gdn has negative eigenvalues");
    CHECK(synth_model_config(t, &s, &p, "mha:neg", &c) != 0 && strstr(mn_last_error(), "neg_eigen"), "mha:neg: %s",
          mn_last_error());
    const SynthTask *par = synth_find("parity");
    SynthSettings ps;
    SynthProtocol pp;
    synth_protocol(par, 1, &pp);
    CHECK(par && !synth_grid(par, 0, &ps, NULL, 0), "parity grid: %s", mn_last_error());
    synth_quick_settings(par, &ps);
    CHECK(synth_model_config(par, &ps, &pp, "mha", &c) == 0 && !c.neg_eigen, "parity with mha: %s", mn_last_error());
    CHECK(synth_model_config(par, &ps, &pp, "deltanet:neg", &c) == 0 && c.neg_eigen, "parity deltanet:neg: %s",
          mn_last_error());
    // MAD compression: supported, with the autoencoder head (untied, uncapped: config_validate's terms)
    const SynthTask *comp = synth_find("mad-compression");
    CHECK(comp && synth_task_supported(comp) == 0, "compression refused: %s", mn_last_error());
    SynthSettings cs;
    synth_protocol(comp, 1, &pp);
    CHECK(!synth_grid(comp, 0, &cs, NULL, 0), "compression grid: %s", mn_last_error());
    synth_quick_settings(comp, &cs);
    CHECK(synth_model_config(comp, &cs, &pp, "gdn", &c) == 0 && !strcmp(c.head, "autoencoder") && !c.tie_embeddings &&
              c.logit_cap == 0,
          "compression's model config: head '%s', tie %d, cap %g (%s)", c.head, c.tie_embeddings, (double)c.logit_cap,
          mn_last_error());
    CHECK(synth_model_config(par, &ps, &pp, "gdn", &c) == 0 && !strcmp(c.head, "lm"), "parity's head: '%s'", c.head);
    double v;
    const char *col;
    CHECK(synth_published("mad-fuzzy-recall", "mesa", &v, &col) && v == 58.5 && !strcmp(col, "fuzzy recall"),
          "published MesaNet fuzzy recall");
    CHECK(synth_published("mad-recall", "mha", &v, NULL) && v == 100, "published Transformer recall");
    CHECK(!synth_published("mqar", "mesa", &v, NULL), "mqar: no published number for mesa");
    CHECK(synth_published("mqar", "mha", &v, &col) && v == 100 && strstr(col, "Zoology"), "mqar: attention");
    CHECK(synth_published_source_of("mqar") && strstr(synth_published_source_of("mqar"), "Zoology"), "mqar source");
    CHECK(!synth_published("regbench", "mha", &v, NULL) && !synth_published_source_of("regbench"),
          "regbench: the notes give no published values");
}

TEST(synth_run_library_regbench) {
    const SynthTask *t = synth_find_any("regbench");
    CHECK(t == &synth_task_regbench && synth_grid_count(t) == 6, "regbench: not found or grid of %d",
          t ? synth_grid_count(t) : 0);
    if (!t) return;
    SynthProtocol p;
    synth_protocol(t, 1, &p);
    SynthSettings s;
    CHECK(!synth_grid(t, 0, &s, NULL, 0) && s.n_train == 1000 && s.n_test == 500, "regbench baseline");
    synth_quick_settings(t, &s);
    s.n_train = 64, s.n_test = 16, p.max_steps = 8;
    SynthRunResult r;
    int st = synth_run(t, &s, &p, "gdn", p.lrs[0], p.wds[0], 1, backend_by_name("cpu"), NULL, &r);
    CHECK(!st, "synth_run regbench: %s", mn_last_error());
    CHECK(r.steps == 8 && r.metric >= 0 && r.metric <= 1, "regbench: steps %d, validity %g", r.steps, r.metric);
    CHECK(r.tvd >= 0 && r.tvd <= 1, "regbench: tvd %g not in [0, 1]", r.tvd);
}

// A quick RegBench sweep records its TVD beside the greedy accuracy: the csv's last field, the
// json's "tvd", the progress line and the table's column; other tasks leave it empty.
TEST(synth_run_cli_regbench_writes_tvd) {
    TmpDir td;
    tmp_make(&td);
    char args[512];
    snprintf(args, sizeof args, "synth regbench,mqar --mixers gdn --quick --max-steps 8 --out %s/sweep", td.dir);
    ToolRun r = tool_run(&td, args);
    CHECK(r.rc == 0, "mesanet %s: exit status %d\n%s", args, r.rc, r.err);
    CHECK(strstr(r.out, ", tvd 0.") || strstr(r.out, ", tvd 1.0"), "no tvd in the progress lines:\n%s", r.out);
    CHECK(strstr(r.out, "      tvd"), "no tvd column in the table:\n%s", r.out);
    char *csv = read_text(tmp_path(&td, "sweep/results.csv"));
    CHECK(strstr(csv, ",metric,tvd\n"), "results.csv header:\n%s", csv);
    const char *rb = strstr(csv, "\nregbench,"), *mq = strstr(csv, "\nmqar,");
    CHECK(rb && mq, "rows:\n%s", csv);
    if (rb && mq) {
        const char *end = strchr(rb + 1, '\n'), *comma = end;
        while (comma > rb && *comma != ',') comma--;
        double tvd = atof(comma + 1);
        CHECK(end && comma + 1 < end && tvd >= 0 && tvd <= 1, "regbench tvd field '%.*s'", (int)(end - comma - 1),
              comma + 1);
        end = strchr(mq + 1, '\n');
        CHECK(end && end[-1] == ',', "mqar's tvd field is not empty:\n%s", csv);
    }
    char *json = read_text(tmp_path(&td, "sweep/results.json"));
    CHECK(strstr(json, "\"tvd\": 0.") || strstr(json, "\"tvd\": 1"), "results.json:\n%s", json);
    CHECK(strstr(json, "\"tvd\": null"), "mqar's tvd is not null:\n%s", json);
    free(csv), free(json);
    tool_run_free(&r);
    tmp_remove(&td);
}

// The rows of a results.csv without train_seconds (field 11), sorted: runs to compare.
static int synth_rows_key(const char *csv, char keys[][512], int max) {
    int n = 0;
    const char *p = strchr(csv, '\n');  // past the header
    while (p && p[1] && n < max) {
        p++;
        const char *end = strchr(p, '\n');
        if (!end) end = p + strlen(p);
        char *k = keys[n];
        int field = 0, len = 0;
        for (const char *q = p; q < end && len < 510; q++) {
            if (*q == ',') field++;
            if (field != 10 || *q == ',') k[len++] = *q;
        }
        k[len] = 0;
        n++;
        p = *end ? end : NULL;
    }
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (strcmp(keys[i], keys[j]) > 0) {
                char t[512];
                strcpy(t, keys[i]), strcpy(keys[i], keys[j]), strcpy(keys[j], t);
            }
    return n;
}

// --jobs 2 runs the sweep's runs as two processes at once and records the same rows as --jobs 1.
TEST(synth_run_cli_jobs_same_rows) {
    TmpDir td;
    tmp_make(&td);
    char args[512];
    snprintf(args, sizeof args, "synth mqar,regbench --mixers gdn --quick --max-steps 8 --out %s/one", td.dir);
    ToolRun r1 = tool_run(&td, args);
    CHECK(r1.rc == 0, "mesanet %s: exit status %d\n%s", args, r1.rc, r1.err);
    snprintf(args, sizeof args, "synth mqar,regbench --mixers gdn --quick --max-steps 8 --jobs 2 --out %s/two",
             td.dir);
    ToolRun r2 = tool_run(&td, args);
    CHECK(r2.rc == 0, "mesanet %s: exit status %d\n%s", args, r2.rc, r2.err);
    CHECK(strstr(r2.out, "up to 2 runs at once") && strstr(r2.out, "(2 at once)"), "no jobs in the progress:\n%s",
          r2.out);
    char *c1 = read_text(tmp_path(&td, "one/results.csv")), *c2 = read_text(tmp_path(&td, "two/results.csv"));
    static char k1[4][512], k2[4][512];
    int n1 = synth_rows_key(c1, k1, 4), n2 = synth_rows_key(c2, k2, 4);
    CHECK(n1 == 2 && n2 == 2, "rows: %d and %d\n%s\n%s", n1, n2, c1, c2);
    for (int i = 0; i < n1 && i < n2; i++) CHECK(!strcmp(k1[i], k2[i]), "--jobs 1: %s\n--jobs 2: %s", k1[i], k2[i]);
    CHECK(!strstr(c2, ".job-"), "results.csv names a job directory");
    free(c1), free(c2);
    tool_run_free(&r1), tool_run_free(&r2);
    tmp_remove(&td);
}

// --gpus spreads --jobs over GPUs: refused, naming the option, without the cuda backend, with
// fewer jobs than GPUs, or with more GPUs than the process sees (CUDA_VISIBLE_DEVICES= hides them
// all, and a CPU-only build sees none).
TEST(synth_run_cli_gpus_refusals) {
    TmpDir td;
    tmp_make(&td);
    static const struct {
        const char *args, *says;
    } cases[] = {
        {"--gpus 2 --jobs 2", "GPUs are for --backend cuda, not cpu"},
        {"--gpus 2 --jobs 1 --backend cuda", "needs --jobs 2 or more"},
        {"--gpus 1 --jobs 2 --backend cuda", "this process sees 0 GPU(s)"},
    };
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[512];
        snprintf(args, sizeof args, "synth mqar --mixers gdn --quick %s --out %s/o", cases[i].args, td.dir);
        ToolRun r = tool_run(&td, args);
        CHECK(r.rc != 0 && strstr(r.err, "--gpus") && strstr(r.err, cases[i].says), "mesanet %s: exit %d\n%s", args,
              r.rc, r.err);
        tool_run_free(&r);
    }
    unsetenv("CUDA_VISIBLE_DEVICES");
    tmp_remove(&td);
}
