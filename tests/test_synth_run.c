// mesanet synth and src/synth/run.h: a --quick sweep end to end, resuming, refusals, option
// ranges; the library's run on a tiny setting and its published numbers.
#include <ctype.h>
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backends/registry.h"
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
    // --quick: 40-step runs of tiny models; the papers' full-protocol numbers are left out, said so.
    CHECK(!strstr(r.out, "published") && !strstr(r.out, "Zoology") && strstr(r.out, "the papers' numbers are left out"),
          "--quick shows the papers' numbers as if comparable:\n%s", r.out);
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
    CHECK(r.rc == 0 && !strstr(r.out, "training") && strstr(r.out, "1 of 2 runs recorded, 1 not run yet") &&
              strstr(r.out, "mad-recall (macro-averaged accuracy x 100"),
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
    CHECK(strstr(r.out, "[2/2] mad-recall baseline gla") && strstr(r.out, "1 run was already recorded and skipped, 1 run now"),
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
    CHECK(!strstr(r.out, "49.5") && !strstr(r.out, "published"), "--quick shows the published number:\n%s", r.out);
    tool_run_free(&r);
    // The full protocol's report (nothing trained): the published numbers beside empty cells.
    snprintf(args, sizeof args, "synth mad --mixers mha,mesa --report --out %s/table", td.dir);
    r = tool_run(&td, args);
    CHECK(r.rc == 0 && strstr(r.out, "averages over the five columns") && strstr(r.out, "compress") &&
              strstr(r.out, "avg of five") && strstr(r.out, "- (75.8)") && strstr(r.out, "- (76.1)") &&
              strstr(r.out, "49.5 (compress)") && !strstr(r.out, "compression not run"),
          "mesanet %s: %d\n%s%s", args, r.rc, r.out, r.err);
    tool_run_free(&r);
    snprintf(args, sizeof args,
             "synth mad-recall,mad-noisy-recall,mad-fuzzy-recall,mad-memorization,mad-selective-copy --mixers mha "
             "--report --out %s/table",
             td.dir);
    r = tool_run(&td, args);
    CHECK(r.rc == 0 && strstr(r.out, "compression not run") && strstr(r.out, "avg of four") &&
              strstr(r.out, "- (82.3)"),
          "mesanet %s: %d\n%s%s", args, r.rc, r.out, r.err);
    tool_run_free(&r);
    // --quick: no bracketed published numbers in the Table 1 layout either.
    snprintf(args, sizeof args, "synth mad --mixers mha --quick --report --out %s/comp", td.dir);
    r = tool_run(&td, args);
    CHECK(r.rc == 0 && strstr(r.out, "Table 1") && !strstr(r.out, "(75.8)") && !strstr(r.out, "published in brackets"),
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

// Task names and groups: "niah" stands for S-NIAH 1-3 as "mad" does for MAD's six tasks; "all"
// for every task, RegBench last; an unknown name is refused naming the groups.
TEST(synth_run_library_task_groups) {
    const SynthTask *t[32];
    int n = synth_expand("niah", t, 32);
    CHECK(n == 3 && !strcmp(t[0]->name, "niah-1") && !strcmp(t[1]->name, "niah-2") && !strcmp(t[2]->name, "niah-3"),
          "niah: %d tasks", n);
    n = synth_expand("mad", t, 32);
    CHECK(n == 6, "mad: %d tasks", n);
    for (int i = 0; i < n && i < 32; i++) CHECK(!strncmp(t[i]->name, "mad-", 4), "mad: %s", t[i]->name);
    n = synth_expand("all", t, 32);
    CHECK(n == synth_task_count() + 1 && t[n - 1] == &synth_task_regbench, "all: %d tasks", n);
    CHECK(synth_expand("all", t, 2) == n, "a short buffer changes the count");
    CHECK(synth_expand("regbench", t, 32) == 1 && t[0] == &synth_task_regbench, "regbench");
    CHECK(synth_expand("niah-2", t, 32) == 1 && !strcmp(t[0]->name, "niah-2"), "niah-2");
    CHECK(synth_expand("nosuch", t, 32) < 0 && strstr(mn_last_error(), "'nosuch'") &&
              strstr(mn_last_error(), "groups: mad, niah, all") && strstr(mn_last_error(), "regbench"),
          "nosuch: %s", mn_last_error());
    CHECK(synth_expand("", t, 32) < 0, "an empty name accepted");
    double v[16];
    const char *axis = synth_grid_axis(&synth_task_regbench, v);
    CHECK(axis && !strcmp(axis, "training automata") && v[0] == 1000 && v[5] == 40000, "regbench's axis: %s",
          axis ? axis : "(none)");
    CHECK(!strcmp(synth_metric_name(&synth_task_regbench), "greedy validity accuracy"), "regbench's metric: %s",
          synth_metric_name(&synth_task_regbench));
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

// --parallel 3 trains the sweep's runs on three threads of one process at once (several seeds of
// each setting, --seeds 2) and records the same rows, bit for bit, as one run after another.
TEST(synth_run_cli_parallel_same_rows) {
    TmpDir td;
    tmp_make(&td);
    char args[512];
    snprintf(args, sizeof args, "synth mqar,regbench --mixers gdn,mha --quick --max-steps 8 --seeds 2 --out %s/one",
             td.dir);
    ToolRun r1 = tool_run(&td, args);
    CHECK(r1.rc == 0, "mesanet %s: exit status %d\n%s", args, r1.rc, r1.err);
    snprintf(args, sizeof args,
             "synth mqar,regbench --mixers gdn,mha --quick --max-steps 8 --seeds 2 --parallel 3 --out %s/three", td.dir);
    ToolRun r2 = tool_run(&td, args);
    CHECK(r2.rc == 0, "mesanet %s: exit status %d\n%s", args, r2.rc, r2.err);
    CHECK(strstr(r2.out, "up to 3 runs at once in this process") && strstr(r2.out, "(3 at once)") &&
              strstr(r2.out, "mean of 2 seeds"),
          "no parallel runs or seeds in the progress:\n%s", r2.out);
    char *c1 = read_text(tmp_path(&td, "one/results.csv")), *c2 = read_text(tmp_path(&td, "three/results.csv"));
    static char k1[16][512], k2[16][512];
    int n1 = synth_rows_key(c1, k1, 16), n2 = synth_rows_key(c2, k2, 16);
    CHECK(n1 == 8 && n2 == 8, "rows: %d and %d\n%s\n%s", n1, n2, c1, c2);
    for (int i = 0; i < n1 && i < n2; i++) CHECK(!strcmp(k1[i], k2[i]), "one at a time: %s\nthree at once: %s", k1[i], k2[i]);
    free(c1), free(c2);
    tool_run_free(&r1), tool_run_free(&r2);
    // processes and threads at once: refused, naming both
    snprintf(args, sizeof args, "synth mqar --mixers gdn --quick --jobs 2 --parallel 2 --out %s/both", td.dir);
    ToolRun r3 = tool_run(&td, args);
    CHECK(r3.rc != 0 && strstr(r3.err, "--jobs and --parallel"), "mesanet %s: exit %d\n%s", args, r3.rc, r3.err);
    tool_run_free(&r3);
    tmp_remove(&td);
}

// --stop-at 12: every run saves its state after 12 of its 30 steps and stops, recording nothing; the
// next call goes on from the saved states (one at a time, and three at once) and records the same
// rows, bit for bit, as runs never stopped. --time-limit with --jobs is refused.
TEST(synth_run_cli_stop_at_resumes_same_rows) {
    TmpDir td;
    tmp_make(&td);
    const char *base = "synth mqar,mad-recall --mixers gdn,mha --quick --max-steps 30";
    static char keys[3][8][512];
    const char *dirs[3] = {"whole", "one", "three"};
    for (int w = 0; w < 3; w++) {
        char args[512];
        const char *par = w == 2 ? " --parallel 3" : "";
        if (w > 0) {
            snprintf(args, sizeof args, "%s%s --stop-at 12 --out %s/%s", base, par, td.dir, dirs[w]);
            ToolRun r = tool_run(&td, args);
            CHECK(r.rc == 0 && strstr(r.out, "stopped at step 12") && strstr(r.out, "4 runs stopped part-way"),
                  "mesanet %s: exit %d\n%s%s", args, r.rc, r.out, r.err);
            char *c = read_text(tmp_path(&td, w == 1 ? "one/results.csv" : "three/results.csv"));
            CHECK(!c || !strchr(c, '\n') || !strchr(strchr(c, '\n') + 1, '\n'), "rows recorded by stopped runs:\n%s", c);
            free(c);
            tool_run_free(&r);
        }
        snprintf(args, sizeof args, "%s%s --out %s/%s", base, par, td.dir, dirs[w]);
        ToolRun r = tool_run(&td, args);
        CHECK(r.rc == 0, "mesanet %s: exit %d\n%s", args, r.rc, r.err);
        if (w > 0) CHECK(strstr(r.out, "went on from step 12"), "mesanet %s: no resumed run:\n%s", args, r.out);
        char path[64];
        snprintf(path, sizeof path, "%s/results.csv", dirs[w]);
        char *c = read_text(tmp_path(&td, path));
        int n = synth_rows_key(c, keys[w], 8);
        CHECK(n == 4, "%s: %d rows\n%s", dirs[w], n, c);
        free(c);
        tool_run_free(&r);
    }
    for (int w = 1; w < 3; w++)
        for (int i = 0; i < 4; i++)
            CHECK(!strcmp(keys[0][i], keys[w][i]), "never stopped: %s\nstopped, resumed (%s): %s", keys[0][i], dirs[w],
                  keys[w][i]);
    char args[512];
    snprintf(args, sizeof args, "synth mqar --mixers gdn --quick --jobs 2 --time-limit 5 --out %s/j", td.dir);
    ToolRun r = tool_run(&td, args);
    CHECK(r.rc != 0 && strstr(r.err, "--time-limit and --stop-at") && strstr(r.err, "not --jobs"), "mesanet %s: exit %d\n%s",
          args, r.rc, r.err);
    tool_run_free(&r);
    tmp_remove(&td);
}

// A table cell that comes from part of the (lr, wd) grid (a sweep stopped before its end) is marked
// "*" and the table says why; the same cell once the grid is whole is not.
TEST(synth_run_cli_report_marks_partial_grids) {
    TmpDir td;
    tmp_make(&td);
    char args[512];
    snprintf(args, sizeof args, "synth mqar --mixers gdn --quick --max-steps 4 --seeds 2 --stop-after 1 --out %s/o",
             td.dir);
    ToolRun r1 = tool_run(&td, args);
    CHECK(r1.rc == 0, "mesanet %s: exit status %d\n%s", args, r1.rc, r1.err);
    snprintf(args, sizeof args, "synth mqar --mixers gdn --quick --max-steps 4 --seeds 2 --report --out %s/o", td.dir);
    ToolRun r2 = tool_run(&td, args);
    CHECK(r2.rc == 0 && strstr(r2.out, "*: the best of the runs recorded so far") && strstr(r2.out, "*\n"),
          "mesanet %s: exit %d, no partial mark:\n%s", args, r2.rc, r2.out);
    snprintf(args, sizeof args, "synth mqar --mixers gdn --quick --max-steps 4 --seeds 2 --out %s/o", td.dir);
    ToolRun r3 = tool_run(&td, args);
    CHECK(r3.rc == 0 && !strstr(r3.out, "recorded so far") && !strstr(r3.out, "*\n"),
          "mesanet %s: exit %d, marked though whole:\n%s", args, r3.rc, r3.out);
    tool_run_free(&r1), tool_run_free(&r2), tool_run_free(&r3);
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
        {"--gpus 2 --jobs 1 --backend cuda", "needs --jobs or --parallel 2 or more"},
        {"--gpus 1 --jobs 2 --backend cuda", "this process sees 0 GPU(s)"},
        {"--gpus 2 --parallel 4 --backend cuda", "this process sees 0 GPU(s)"},
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

// Lists are split as the config splits a mixer pattern: an empty name is refused, so is a list
// longer than the limit (it once ran the first 16 mixers without a word) and a mixer named twice.
TEST(synth_run_cli_list_refusals) {
    TmpDir td;
    tmp_make(&td);
    const struct {
        const char *args, *want1, *want2;
    } cases[] = {
        {"synth mqar --mixers gdn, --quick", "--mixers 'gdn,': name 2 of the list is empty", NULL},
        {"synth mqar --mixers ,gdn --quick", "--mixers ',gdn': name 1 of the list is empty", NULL},
        {"synth mqar --mixers gdn,,mha --quick", "name 2 of the list is empty", NULL},
        {"synth mqar, --mixers gdn --quick", "the task list 'mqar,': name 2 of the list is empty", NULL},
        {"synth ,mqar --mixers gdn --quick", "name 1 of the list is empty", NULL},
        {"synth mqar,,parity --mixers gdn --quick", "name 2 of the list is empty", NULL},
        {"synth mqar --mixers gdn,mha,gla,mesa,mamba2,deltanet,gdn-paper,swa,gdn:neg,mesa+mha,gdn+mha,gla+mha,"
         "mamba2+mha,deltanet+mha,swa+mha,gdn+swa,mha+gdn,gla+gdn --quick --report",
         "18 names, at most 16", "--mixers"},
        {"synth mqar --mixers gdn,mha,gdn --quick", "--mixers names 'gdn' twice", NULL},
        {"synth mqar --mixers gdn+swa,gdn+swa --quick", "names 'gdn+swa' twice", NULL},
        {"synth mqar --mixers gdn+ --quick", "unknown or unusable mixer 'gdn,'", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[700];
        snprintf(args, sizeof args, "%s --out %s/x", cases[i].args, td.dir);
        ToolRun r = tool_run(&td, args);
        CHECK(r.rc != 0 && r.rc != -1, "mesanet %s: exit status %d, expected a refusal\n%s", args, r.rc, r.out);
        CHECK(strstr(r.err, cases[i].want1), "mesanet %s: stderr lacks '%s':\n%s", args, cases[i].want1, r.err);
        if (cases[i].want2)
            CHECK(strstr(r.err, cases[i].want2), "mesanet %s: stderr lacks '%s':\n%s", args, cases[i].want2, r.err);
        CHECK(!strstr(r.out, "training"), "mesanet %s: trained before refusing", args);
        tool_run_free(&r);
    }
    tmp_remove(&td);
}

// synth --help lists the tasks and the groups (niah among them), and says how a pattern is
// written (gdn+swa) and how tables name it (gdn,swa); "niah" runs S-NIAH 1-3; counts of one are
// singular.
TEST(synth_run_cli_help_tasks_and_groups) {
    TmpDir td;
    tmp_make(&td);
    ToolRun r = tool_run(&td, "synth --help");
    CHECK(r.rc == 0 && strstr(r.out, "\ntasks") && strstr(r.out, "  mqar ") && strstr(r.out, "  niah-3 ") &&
              strstr(r.out, "  regbench ") && strstr(r.out, "  mad ") && strstr(r.out, "  niah ") &&
              strstr(r.out, "  all "),
          "synth --help does not list the tasks and groups:\n%s", r.out);
    CHECK(strstr(r.out, "gdn+swa") && strstr(r.out, "gdn,swa"), "--mixers' help: pattern syntax and its name:\n%s",
          r.out);
    tool_run_free(&r);
    char args[512];
    snprintf(args, sizeof args, "synth niah,niah-2 --mixers gdn --quick --report --out %s/n", td.dir);
    r = tool_run(&td, args);
    CHECK(r.rc == 0 && strstr(r.out, "synth: 3 tasks x 1 mixer, baseline settings, 3 runs;") &&
              strstr(r.out, "synth: niah-1:") && strstr(r.out, "synth: niah-3:") && strstr(r.out, "2 blocks") &&
              !strstr(r.out, "mixer(s)") && !strstr(r.out, "task(s)"),
          "mesanet %s: %d\n%s%s", args, r.rc, r.out, r.err);
    tool_run_free(&r);
    snprintf(args, sizeof args, "synth mqar --mixers gdn --quick --max-steps 1 --out %s/one", td.dir);
    r = tool_run(&td, args);
    CHECK(r.rc == 0 && strstr(r.out, "1 task x 1 mixer, baseline settings, 1 run;") && strstr(r.out, ", 1 step, ") &&
              strstr(r.out, "best over 1 lr setting)"),
          "mesanet %s: %d\n%s%s", args, r.rc, r.out, r.err);
    tool_run_free(&r);
    tmp_remove(&td);
}

// --report on a folder with no results says so, makes no folder and names no file it did not write;
// without --quick it still shows the published numbers.
TEST(synth_run_cli_report_without_results) {
    TmpDir td;
    tmp_make(&td);
    char args[512];
    snprintf(args, sizeof args, "synth mqar --mixers mesa --quick --report --out %s/none", td.dir);
    ToolRun r = tool_run(&td, args);
    CHECK(r.rc == 0 && strstr(r.out, "no results yet in ") && !strstr(r.out, "results.csv") && !strstr(r.out, "plot:"),
          "mesanet %s: %d\n%s%s", args, r.rc, r.out, r.err);
    CHECK(access(tmp_path(&td, "none"), F_OK) != 0, "--report made the folder");
    tool_run_free(&r);
    snprintf(args, sizeof args, "synth mqar --mixers mha --report --out %s/none", td.dir);
    r = tool_run(&td, args);
    CHECK(r.rc == 0 && strstr(r.out, "no results yet in ") && !strstr(r.out, "results.csv") &&
              strstr(r.out, "100.0 (Zoology"),
          "mesanet %s: %d\n%s%s", args, r.rc, r.out, r.err);
    tool_run_free(&r);
    tmp_remove(&td);
}

static void write_text(const char *path, const char *text) { write_bytes(path, text, strlen(text)); }

// A damaged results.csv is refused, naming the file, the line and what is wrong, and left as it
// is: a metric that is not a number (it once read as 0 and the run was skipped), a row cut short
// (once rewritten with zeros), a file without its header (its first row was lost), a row with a
// field too many, a quote left open, an empty file.
TEST(synth_run_cli_damaged_results_refused) {
    TmpDir td;
    tmp_make(&td);
    char args[512];
    snprintf(args, sizeof args, "synth mqar --mixers gdn --quick --max-steps 2 --out %s/s", td.dir);
    ToolRun r = tool_run(&td, args);
    CHECK(r.rc == 0, "mesanet %s: exit status %d\n%s", args, r.rc, r.err);
    tool_run_free(&r);
    char *good = read_text(tmp_path(&td, "s/results.csv"));
    char *nl = strchr(good, '\n');
    CHECK(nl && count_lines(good) == 2, "results.csv:\n%s", good);
    if (!nl || count_lines(good) != 2) {
        free(good);
        tmp_remove(&td);
        return;
    }
    const char *row = nl + 1, *metric = strrchr(good, ',');  // the row's metric ends at its last comma (tvd empty)
    const char *mstart = metric - 1;
    while (*mstart != ',') mstart--;
    static char damaged[8][1024];
    const char *says[8];
    // 0: the metric "abc"
    snprintf(damaged[0], sizeof damaged[0], "%.*sabc%s", (int)(mstart + 1 - good), good, metric);
    says[0] = "line 2: metric is 'abc', expected a number in [0, 1]";
    // 1: the row cut after six fields
    snprintf(damaged[1], sizeof damaged[1], "%.*smqar,baseline,gdn,quick+steps2,0,0.0\n", (int)(row - good), good);
    says[1] = "line 2 has 6 fields, expected 13";
    // 2: no header: the row is line 1
    snprintf(damaged[2], sizeof damaged[2], "%s", row);
    says[2] = "line 1 is 'mqar,baseline,gdn,";
    // 3: a field too many
    snprintf(damaged[3], sizeof damaged[3], "%.*s,7\n", (int)strlen(good) - 1, good);
    says[3] = "line 2 has more than 13 fields";
    // 4: a quote left open
    snprintf(damaged[4], sizeof damaged[4], "%.*s\"mqar,baseline\n", (int)(row - good), good);
    says[4] = "line 2: field 1 has a quote left open";
    // 5: empty
    damaged[5][0] = 0;
    says[5] = "empty, not even the header";
    // 6: a learning rate with trailing text; 7: an infinite metric
    snprintf(damaged[6], sizeof damaged[6], "%s", good);
    char *lr = strstr(damaged[6] + (row - good), ",0.003,");
    if (lr) memcpy(lr, ",0.00x,", 7);
    says[6] = "line 2: lr is '0.00x'";
    snprintf(damaged[7], sizeof damaged[7], "%.*sinf%s", (int)(mstart + 1 - good), good, metric);
    says[7] = "line 2: metric is 'inf'";
    for (int i = 0; i < 8; i++) {
        write_text(tmp_path(&td, "s/results.csv"), damaged[i]);
        r = tool_run(&td, args);
        CHECK(r.rc == 1 && strstr(r.err, "s/results.csv: ") && strstr(r.err, says[i]),
              "case %d: exit %d, stderr lacks '%s':\n%s\nfile:\n%s", i, r.rc, says[i], r.err, damaged[i]);
        CHECK(!strstr(r.out, "training"), "case %d: trained over a damaged file:\n%s", i, r.out);
        char *after = read_text(tmp_path(&td, "s/results.csv"));
        CHECK(!strcmp(after, damaged[i]), "case %d: the refused file was rewritten:\n%s", i, after);
        free(after);
        tool_run_free(&r);
        // --report reads it the same way
        snprintf(args + strlen(args), sizeof args - strlen(args), " --report");
        r = tool_run(&td, args);
        CHECK(r.rc == 1 && strstr(r.err, says[i]), "case %d --report: exit %d\n%s", i, r.rc, r.err);
        tool_run_free(&r);
        args[strlen(args) - strlen(" --report")] = 0;
    }
    // The good file, with CRLF line ends, is read as it was.
    char crlf[2048];
    size_t at = 0;
    for (const char *p = good; *p && at + 3 < sizeof crlf; p++) {
        if (*p == '\n') crlf[at++] = '\r';
        crlf[at++] = *p;
    }
    crlf[at] = 0;
    write_text(tmp_path(&td, "s/results.csv"), crlf);
    r = tool_run(&td, args);
    CHECK(r.rc == 0 && strstr(r.out, "already in results.csv, skipped"), "the good file: %d\n%s%s", r.rc, r.out, r.err);
    tool_run_free(&r);
    free(good);
    tmp_remove(&td);
}

// ---------------------------------------------------------------------------
// --jobs processes end with the sweep.

// Starts `mesanet synth mqar --mixers gdn,mha,gla --quick --jobs 2 --out OUT <extra>` with its output
// in OUT.log, SIGINT at its default; returns its pid (-1 if it could not start).
static pid_t start_sweep(const char *out, const char *extra) {
    const char *exe = tool_run_path();
    if (!exe) return -1;
    char log[512];
    snprintf(log, sizeof log, "%s.log", out);
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGINT, SIG_DFL);
        if (!freopen(log, "w", stdout) || !freopen(log, "a", stderr)) _exit(127);
        execl(exe, exe, "synth", "mqar", "--mixers", "gdn,mha,gla", "--quick", "--jobs", "2", "--out", out, extra,
              (char *)NULL);
        _exit(127);
    }
    return pid;
}

// The live processes (not zombies) whose command line holds `needle` and "--run-index": the jobs of
// the sweep writing there. Their pids into pids (at most max); returns their number.
static int jobs_of(const char *needle, pid_t *pids, int max) {
    DIR *d = opendir("/proc");
    int n = 0;
    if (!d) return 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (!isdigit((unsigned char)e->d_name[0])) continue;
        char path[300], buf[8192];
        snprintf(path, sizeof path, "/proc/%s/cmdline", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t len = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        int has_dir = 0, has_index = 0;
        for (size_t i = 0; i < len; i += strlen(buf + i) + 1) {
            buf[len] = 0;
            has_dir |= strstr(buf + i, needle) != NULL;
            has_index |= !strcmp(buf + i, "--run-index");
        }
        if (!has_dir || !has_index) continue;
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        f = fopen(path, "r");
        if (!f) continue;
        char state = 'Z';
        if (fscanf(f, "%*d (%*[^)]) %c", &state) != 1) state = 'Z';
        fclose(f);
        if (state != 'Z' && state != 'X' && n < max) pids[n++] = (pid_t)atoi(e->d_name);
    }
    closedir(d);
    return n;
}

// Kills the jobs still alive of the sweep writing to `needle`: a failing test leaves none running.
static void kill_jobs(const char *needle) {
    pid_t p[8];
    int n = jobs_of(needle, p, 8);
    for (int i = 0; i < n; i++) kill(p[i], SIGKILL);
}

// Waits up to `seconds` for the sweep writing to `needle` to have `want` jobs alive (want 0: none).
static int wait_jobs(const char *needle, int want, double seconds) {
    pid_t p[8];
    int n = -1;
    for (double t = 0; t < seconds; t += 0.05) {
        n = jobs_of(needle, p, 8);
        if (want ? n >= want : n == 0) return n;
        usleep(50000);
    }
    return n;
}

// A sweep stopped by SIGINT (Ctrl-C, kill -INT) or by SIGKILL takes its --jobs processes with it
// (they once went on writing into .job-N with ppid 1); a rerun cleans what was left and records
// every run once.
TEST(synth_run_cli_jobs_end_with_the_sweep) {
    TmpDir td;
    tmp_make(&td);
    const int sigs[2] = {SIGINT, SIGKILL};
    for (int k = 0; k < 2; k++) {
        char out[256];
        snprintf(out, sizeof out, "%s/sweep-%d", td.dir, k);
        pid_t sweep = start_sweep(out, "--max-steps=1000000000");
        CHECK(sweep > 0, "cannot start the sweep");
        if (sweep <= 0) break;
        int alive = wait_jobs(out, 2, 60);
        CHECK(alive >= 2, "signal %d: the sweep's 2 jobs did not start (%d seen)", sigs[k], alive);
        kill(sweep, sigs[k]);
        int status = 0;
        waitpid(sweep, &status, 0);
        CHECK(WIFSIGNALED(status) && WTERMSIG(status) == sigs[k], "signal %d: the sweep ended with status %#x",
              sigs[k], status);
        int left = wait_jobs(out, 0, 10);
        CHECK(left == 0, "signal %d: %d job(s) of the sweep still run after it ended", sigs[k], left);
        kill_jobs(out);
        // The rerun, with its own protocol (a step a run): removes the stopped jobs' folders,
        // records the three runs, leaves no .job-N behind.
        ToolRun r;
        char args[512];
        snprintf(args, sizeof args, "synth mqar --mixers gdn,mha,gla --quick --max-steps 1 --jobs 2 --out %s", out);
        r = tool_run(&td, args);
        CHECK(r.rc == 0 && strstr(r.out, "that a stopped sweep left"), "signal %d, rerun: %d\n%s%s", sigs[k], r.rc,
              r.out, r.err);
        tool_run_free(&r);
        char *csv = read_text(strcat(strcpy(args, out), "/results.csv"));
        CHECK(count_lines(csv) == 4, "signal %d, rerun: results.csv:\n%s", sigs[k], csv);
        free(csv);
        for (int j = 1; j <= 3; j++) {
            snprintf(args, sizeof args, "%s/.job-%d", out, j);
            CHECK(access(args, F_OK) != 0, "signal %d: %s is left", sigs[k], args);
        }
    }
    tmp_remove(&td);
}

// A .job-N folder left by a stopped sweep is never taken for a finished run: a row planted in
// .job-1/results.csv (the child process would skip its run as recorded there) does not reach the
// sweep's results.
TEST(synth_run_cli_stale_job_folder_not_reused) {
    TmpDir td;
    tmp_make(&td);
    char args[512];
    snprintf(args, sizeof args, "%s/s/.job-1", td.dir);
    CHECK(!mn_mkdirs(args), "mkdir %s", args);
    write_text(tmp_path(&td, "s/.job-1/results.csv"),
               "task,setting,mixer,protocol,seed,lr,wd,steps,epochs,stopped_early,train_seconds,metric,tvd\n"
               "mqar,baseline,gdn,quick+steps1,0,0.003,0,1,1,0,0.001,0.123456789,\n");
    write_text(tmp_path(&td, "s/.job-1/results.csv.tmp"), "half");
    snprintf(args, sizeof args, "synth mqar --mixers gdn,mha --quick --max-steps 1 --jobs 2 --out %s/s", td.dir);
    ToolRun r = tool_run(&td, args);
    CHECK(r.rc == 0, "mesanet %s: %d\n%s", args, r.rc, r.err);
    char *csv = read_text(tmp_path(&td, "s/results.csv"));
    CHECK(count_lines(csv) == 3 && !strstr(csv, "0.123456789"), "the stale job's row was recorded:\n%s", csv);
    CHECK(access(tmp_path(&td, "s/.job-1"), F_OK) != 0, "the stale .job-1 is left");
    free(csv);
    tool_run_free(&r);
    tmp_remove(&td);
}

// One sweep at a time writes a folder: a second one is refused while the first (or a job of it)
// runs, and goes ahead once it has ended; --report only reads, and is not refused.
TEST(synth_run_cli_one_sweep_a_folder) {
    TmpDir td;
    tmp_make(&td);
    char out[256], args[512];
    snprintf(out, sizeof out, "%s/busy", td.dir);
    pid_t sweep = start_sweep(out, "--max-steps=1000000000");
    CHECK(sweep > 0, "cannot start the sweep");
    if (sweep > 0) {
        CHECK(wait_jobs(out, 2, 60) >= 2, "the sweep's jobs did not start");
        snprintf(args, sizeof args, "synth mqar --mixers gdn --quick --max-steps 1 --out %s", out);
        ToolRun r = tool_run(&td, args);
        if (r.rc != 1) kill_jobs(out);  // the second sweep may have taken its jobs' folders
        CHECK(r.rc == 1 && strstr(r.err, "another synth sweep") && strstr(r.err, "--out"),
              "a second sweep on a busy folder: %d\n%s%s", r.rc, r.out, r.err);
        tool_run_free(&r);
        snprintf(args, sizeof args, "synth mqar --mixers gdn --quick --report --out %s", out);
        r = tool_run(&td, args);
        CHECK(r.rc == 0, "--report on a busy folder: %d\n%s", r.rc, r.err);
        tool_run_free(&r);
        kill(sweep, SIGTERM);
        int status;
        waitpid(sweep, &status, 0);
        CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM, "SIGTERM: status %#x", status);
        CHECK(wait_jobs(out, 0, 10) == 0, "jobs left after SIGTERM");
        kill_jobs(out);
        snprintf(args, sizeof args, "synth mqar --mixers gdn --quick --max-steps 1 --out %s", out);
        r = tool_run(&td, args);
        CHECK(r.rc == 0, "after the first sweep ended: %d\n%s", r.rc, r.err);
        tool_run_free(&r);
    }
    tmp_remove(&td);
}

// The texts of the <text class="cls"> elements of an SVG, "|"-joined.
static void svg_texts(const char *svg, const char *cls, char *out, size_t cap) {
    char key[64];
    snprintf(key, sizeof key, "class=\"%s\"", cls);
    size_t at = 0;
    out[0] = 0;
    for (const char *p = svg; (p = strstr(p, key)); p += strlen(key)) {
        const char *t = strchr(p, '>');
        if (!t) break;
        size_t n = strcspn(++t, "<");
        at += (size_t)snprintf(out + at, at < cap ? cap - at : 0, "%s%.*s", at ? "|" : "", (int)n, t);
        if (at >= cap) break;
    }
}

// A sweep's plots: every mixer visible where they tie (four mixers at 0 on S-NIAH were one dot),
// with a legend; the y axis named by the task's metric on 0..1 (not "metric" on -1..1); RegBench
// at its training automata, with its TVD beside the accuracy.
TEST(synth_run_cli_plots) {
    TmpDir td;
    tmp_make(&td);
    char args[512];
    snprintf(args, sizeof args, "synth niah-1,regbench --mixers mesa,gdn,mha,gdn+swa --quick --max-steps 1 --out %s/p",
             td.dir);
    ToolRun r = tool_run(&td, args);
    CHECK(r.rc == 0, "mesanet %s: exit status %d\n%s", args, r.rc, r.err);
    tool_run_free(&r);
    char *svg = read_text(tmp_path(&td, "p/niah-1.svg"));
    char texts[2048];
    int markers = 0;
    double cx[8];
    for (const char *p = svg; (p = strstr(p, "class=\"marker\" cx=\"")) && markers < 8; p++)
        cx[markers++] = atof(p + strlen("class=\"marker\" cx=\""));
    CHECK(markers == 4, "niah-1.svg: %d markers, expected one per mixer", markers);
    for (int i = 0; i < markers; i++)
        for (int j = i + 1; j < markers; j++)
            CHECK(fabs(cx[i] - cx[j]) >= 7, "niah-1.svg: markers %d and %d at cx %g and %g hide each other", i, j,
                  cx[i], cx[j]);
    svg_texts(svg, "legend-name", texts, sizeof texts);
    CHECK(!strcmp(texts, "mesa|gdn|mha|gdn,swa"), "niah-1.svg legend: %s", texts);
    svg_texts(svg, "ylabel", texts, sizeof texts);
    CHECK(!strcmp(texts, "exact-match accuracy"), "niah-1.svg y label: %s", texts);
    svg_texts(svg, "ytick", texts, sizeof texts);
    CHECK(!strncmp(texts, "0|", 2) && strlen(texts) > 2 && !strcmp(texts + strlen(texts) - 2, "|1"),
          "niah-1.svg y ticks: %s, expected 0 .. 1", texts);
    svg_texts(svg, "xlabel", texts, sizeof texts);
    CHECK(strstr(texts, "context length"), "niah-1.svg x label: %s", texts);
    free(svg);
    svg = read_text(tmp_path(&td, "p/regbench.svg"));
    svg_texts(svg, "xlabel", texts, sizeof texts);
    CHECK(strstr(texts, "training automata") && !strstr(texts, "setting"), "regbench.svg x label: %s", texts);
    svg_texts(svg, "ylabel", texts, sizeof texts);
    CHECK(strstr(texts, "greedy validity accuracy") && strstr(texts, "TVD"), "regbench.svg y labels: %s", texts);
    svg_texts(svg, "xtick", texts, sizeof texts);
    CHECK(strstr(texts, "1000"), "regbench.svg x ticks: %s (the baseline's 1000 automata)", texts);
    CHECK(strstr(svg, "class=\"panel\""), "regbench.svg has no TVD panel");
    free(svg);
    tmp_remove(&td);
}

// --grid: the runs of a task, setting and mixer (here their seeds) as one model of runs, alone and
// two grids a thread at once: the same rows, bit for bit, as the runs one at a time; cut by
// --stop-at and taken up again, the same again. --jobs with --grid is refused.
TEST(synth_run_cli_grid_same_rows) {
    TmpDir td;
    tmp_make(&td);
    char args[512];
    const char *sweep = "synth mqar,mad-memorization --mixers gdn,mesa --quick --max-steps 10 --seeds 3";
    snprintf(args, sizeof args, "%s --out %s/one", sweep, td.dir);
    ToolRun r1 = tool_run(&td, args);
    CHECK(r1.rc == 0, "mesanet %s: exit status %d\n%s", args, r1.rc, r1.err);
    const char *ways[] = {"--grid 3", "--grid 2 --parallel 2", "--grid 3 --stop-at 4"};
    char *c1 = read_text(tmp_path(&td, "one/results.csv"));
    static char k1[16][512], k2[16][512];
    int n1 = synth_rows_key(c1, k1, 16);
    CHECK(n1 == 12, "rows alone: %d\n%s", n1, c1);
    for (int w = 0; w < 3; w++) {
        snprintf(args, sizeof args, "%s %s --out %s/way%d", sweep, ways[w], td.dir, w);
        ToolRun r2 = tool_run(&td, args);
        CHECK(r2.rc == 0, "mesanet %s: exit status %d\n%s", args, r2.rc, r2.err);
        CHECK(strstr(r2.out, "train in grids of up to"), "no grids in the progress:\n%s", r2.out);
        if (w == 2) {  // cut at step 4: nothing recorded; again without --stop-at goes on from the states
            CHECK(strstr(r2.out, "12 runs stopped part-way"), "not cut:\n%s", r2.out);
            tool_run_free(&r2);
            snprintf(args, sizeof args, "%s --grid 3 --out %s/way%d", sweep, td.dir, w);
            r2 = tool_run(&td, args);
            CHECK(r2.rc == 0, "mesanet %s: exit status %d\n%s", args, r2.rc, r2.err);
        }
        char path[64];
        snprintf(path, sizeof path, "way%d/results.csv", w);
        char *c2 = read_text(tmp_path(&td, path));
        int n2 = synth_rows_key(c2, k2, 16);
        CHECK(n2 == n1, "%s: %d rows, %d alone\n%s", ways[w], n2, n1, c2);
        for (int i = 0; i < n1 && i < n2; i++) CHECK(!strcmp(k1[i], k2[i]), "alone: %s\n%s: %s", k1[i], ways[w], k2[i]);
        free(c2);
        tool_run_free(&r2);
    }
    free(c1);
    tool_run_free(&r1);
    snprintf(args, sizeof args, "synth mqar --mixers gdn --quick --jobs 2 --grid 2 --out %s/both", td.dir);
    ToolRun r3 = tool_run(&td, args);
    CHECK(r3.rc != 0 && strstr(r3.err, "--jobs and --grid"), "mesanet %s: exit %d\n%s", args, r3.rc, r3.err);
    tool_run_free(&r3);
    tmp_remove(&td);
}
