// A model of several runs trained as one batch (model_create_runs, core/runs.h) against the same
// runs trained alone: each run's loss, gradient norm, weights and AdamW moments after a few steps,
// bit for bit, on the CPU for every case of the mixer battery (every mixer and its variants, the
// patterns) and the autoencoder head, and on the reference for a few; the runs differ in seed, data,
// learning rate and weight decay, and their updates are clipped. Then what the runs backend refuses.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "core/common.h"
#include "core/runs.h"
#include "mixer_case.h"
#include "synth/run.h"
#include "tmpdir.h"
#include "model/model.h"
#include "test.h"
#include "train/optim.h"
#include "train/step.h"

enum { R = 3, BR = 2, T = 13, STEPS = 3, ACCUM_MAX = 2 };
static const McSizes sizes = {23, 16, 2, 8, 24, 24};
static const float lrs[R] = {3e-3f, 2e-2f, 8e-3f}, wds[R] = {0, 0.1f, 0.05f};
static const uint64_t seeds[R] = {5, 9, 5};  // two runs from one seed: a grid's usual case

// Step k's micro-batches of run r (host [accum][BR * T]), some targets not scored; their count.
static int batch(int r, int k, int32_t *tok, int32_t *tgt) {
    int accum = k == 1 ? 2 : 1;
    MnRng g;
    mn_rng_seed(&g, 1000 * (uint64_t)r + (uint64_t)k);
    for (int i = 0; i < accum * BR * T; i++) {
        tok[i] = (int32_t)(mn_rng_uniform(&g) * sizes.vocab) % sizes.vocab;
        tgt[i] = (i + r) % 5 == 2 ? -1 : (int32_t)(mn_rng_uniform(&g) * sizes.vocab) % sizes.vocab;
    }
    return accum;
}

static float weight_of(const int32_t *tgt, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += tgt[i] >= 0;
    return (float)(1.0 / s);
}

static AdamW opt(Model *m, float wd, const float *per_run) {
    // a clip that the first steps' norms exceed, so that clipped updates are compared
    AdamW o = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = wd, .wds = per_run, .clip = 0.3f};
    if (adamw_init(&o, m)) die("%s", mn_last_error());
    return o;
}

// Trains R runs alone and together for STEPS steps; 0 where every number agrees bit for bit.
static int compare(const Backend *be, const ModelConfig *c, const char *name, int batched) {
    enum { NB = ACCUM_MAX * BR * T };
    int bad = 0, clipped = 0;
    double loss[STEPS][R], norm[STEPS][R];
    Model *solo[R];
    AdamW os[R];
    for (int r = 0; r < R; r++) {
        solo[r] = mc_make(c, be);
        if (model_init_params(solo[r], seeds[r])) die("%s", mn_last_error());
        os[r] = opt(solo[r], wds[r], NULL);
        TrainStep ts;
        if (train_step_init(&ts, solo[r], &os[r])) die("%s", mn_last_error());
        for (int k = 0; k < STEPS; k++) {
            int32_t tok[NB], tgt[NB];
            int accum = batch(r, k, tok, tgt);
            if (train_step(&ts, tok, tgt, BR, T, accum, weight_of(tgt, accum * BR * T), lrs[r], &loss[k][r], &norm[k][r]))
                die("%s alone, run %d step %d: %s", name, r, k, mn_last_error());
            clipped += norm[k][r] > os[r].clip;
        }
        train_step_free(&ts);
    }
    Model *g = NULL;
    if (model_create_runs(&g, c, be, R) || model_init_params_runs(g, seeds)) die("%s: %s", name, mn_last_error());
    g->rb->batched = batched;  // the projections through Backend.linear_runs_* (where the backend has them)
    AdamW og = opt(g, 0, wds);
    TrainStep ts;
    if (train_step_init(&ts, g, &og)) die("%s", mn_last_error());
    for (int k = 0; k < STEPS; k++) {
        int32_t tok[R][NB], tgt[R][NB], all_tok[R * NB], all_tgt[R * NB];
        float w[R];
        int accum = 1;
        for (int r = 0; r < R; r++) accum = batch(r, k, tok[r], tgt[r]), w[r] = weight_of(tgt[r], accum * BR * T);
        for (int a = 0; a < accum; a++)  // micro-batch a: each run's a-th, run after run
            for (int r = 0; r < R; r++) {
                size_t at = ((size_t)a * R + r) * BR * T, from = (size_t)a * BR * T;
                memcpy(all_tok + at, tok[r] + from, sizeof(int32_t) * BR * T);
                memcpy(all_tgt + at, tgt[r] + from, sizeof(int32_t) * BR * T);
            }
        double l[R], n[R];
        int refused[R];
        if (train_step_queue_runs(&ts, all_tok, all_tgt, R * BR, T, accum, w, lrs) ||
            train_step_result_runs(&ts, l, n, refused))
            die("%s together, step %d: %s", name, k, mn_last_error());
        for (int r = 0; r < R; r++)
            if (l[r] != loss[k][r] || n[r] != norm[k][r] || refused[r]) {
                bad++;
                test_fail(__FILE__, __LINE__, "%s %s step %d run %d: loss %.17g vs %.17g alone, norm %.17g vs %.17g%s",
                          be->name, name, k, r, l[r], loss[k][r], n[r], norm[k][r], refused[r] ? ", refused" : "");
            }
    }
    size_t e = be->elem_size(be, MEM_F32), bytes = g->total * e;
    for (int r = 0; r < R; r++) {
        int same = !memcmp((char *)g->params + r * bytes, solo[r]->params, bytes) &&
                   !memcmp((char *)og.m + r * bytes, os[r].m, bytes) && !memcmp((char *)og.v + r * bytes, os[r].v, bytes);
        if (!same) bad++, test_fail(__FILE__, __LINE__, "%s %s run %d: weights or moments differ from the run alone", be->name, name, r);
    }
    if (!clipped) bad++, test_fail(__FILE__, __LINE__, "%s %s: no update was clipped (the test means to compare clipped ones)", be->name, name);
    train_step_free(&ts);
    adamw_free(&og, g);
    model_free(g);
    for (int r = 0; r < R; r++) adamw_free(&os[r], solo[r]), model_free(solo[r]);
    return bad;
}

TEST(runs_train_as_they_do_alone_cpu) {
    McCase cases[256];
    int n = mc_cases(cases, 256), failed = 0;
    for (int i = 0; i < n; i++) {
        char name[160];
        mc_case_name(&cases[i], name, sizeof name);
        ModelConfig c = mc_case_config(&cases[i], &sizes, 2);
        for (int batched = 0; batched < 2; batched++) failed += compare(backend_cpu(), &c, name, batched) > 0;
    }
    ModelConfig ae = mc_case_config(&cases[0], &sizes, 2);  // the autoencoder head (MAD's compression)
    snprintf(ae.mixer, sizeof ae.mixer, "gdn,mha");
    snprintf(ae.head, sizeof ae.head, "autoencoder");
    ae.tie_embeddings = 0, ae.logit_cap = 0, ae.gate_bound = 0;
    for (int batched = 0; batched < 2; batched++) failed += compare(backend_cpu(), &ae, "autoencoder gdn,mha", batched) > 0;
    test_note("%d cases and the autoencoder head, projections a run at a time and batched (linear_runs_*): %d runs x %d "
              "steps together as alone, %d differ", n, R, STEPS, failed);
}

TEST(runs_train_as_they_do_alone_ref) {
    McCase cases[256];
    int n = mc_cases(cases, 256), done = 0;
    const char *want[] = {"mesa", "gdn", "hawk", "mlstm", "slstm-block", "mha"};
    for (size_t w = 0; w < sizeof want / sizeof want[0]; w++)
        for (int i = 0; i < n; i++)
            if (!strcmp(cases[i].mixer, want[w])) {  // the first case of each
                ModelConfig c = mc_case_config(&cases[i], &sizes, 2);
                compare(backend_ref(), &c, want[w], 1);  // (the reference has no linear_runs_*: a run at a time)
                done++;
                break;
            }
    CHECK(done == (int)(sizeof want / sizeof want[0]), "%d of the mixers found in the battery", done);
}

TEST(runs_backend_refusals) {
    const Backend *cpu = backend_cpu();
    RunsBackend rb;
    CHECK(runs_backend_init(&rb, cpu, 1) == MN_ERR_ARG && strstr(mn_last_error(), "at least 2"), "one run: %s",
          mn_last_error());
    CHECK(!runs_backend_init(&rb, cpu, 2), "%s", mn_last_error());
    float *p = cpu->alloc(cpu, 8, MEM_PARAM), *gr = cpu->alloc(cpu, 8, MEM_F32), *w = cpu->alloc(cpu, 4, MEM_PARAM);
    float *x = cpu->alloc(cpu, 12, MEM_ACT), *y = cpu->alloc(cpu, 12, MEM_ACT);
    if (!p || !gr || !w || !x || !y) die("out of memory");
    runs_backend_slabs(&rb, p, 4 * sizeof(float), gr, 4 * sizeof(float));
    const Backend *be = &rb.be;
    CHECK(backend_runs(be) == 2 && backend_runs(cpu) == 1, "runs %d, %d", backend_runs(be), backend_runs(cpu));
    // a weight outside the slabs: refused, never shared by the runs
    int st = be->linear_fwd(be, y, x, w, NULL, 6, 2, 2);
    CHECK(st == MN_ERR_UNSUPPORTED && strstr(mn_last_error(), "linear_fwd") && strstr(mn_last_error(), "outside"),
          "a weight outside the slabs: %d %s", st, mn_last_error());
    // rows that do not split evenly over the runs
    st = be->linear_fwd(be, y, x, p, NULL, 3, 2, 2);
    CHECK(st == MN_ERR_ARG && strstr(mn_last_error(), "3 rows") && strstr(mn_last_error(), "2 runs"), "odd rows: %s",
          mn_last_error());
    // a model of runs does not decode
    McCase cases[256];
    mc_cases(cases, 256);
    ModelConfig c = mc_case_config(&cases[0], &sizes, 1);
    Model *m = NULL;
    CHECK(!model_create_runs(&m, &c, cpu, 2), "%s", mn_last_error());
    CHECK(model_reset_state(m, 2) == MN_ERR_ARG && strstr(mn_last_error(), "does not decode"), "decoding: %s",
          mn_last_error());
    CHECK(model_create_runs(&(Model *){NULL}, &c, cpu, 0) == MN_ERR_ARG, "zero runs accepted");
    // the Mesa core's ridge a group of sequences: groups that do not split the batch are refused
    MnSeqDims d = {4, 3, 1, 2, 2};
    float buf[96] = {0}, lam[4] = {1, 1, 1, 1};  // q = k = v, g, beta (zero): [0, 24); o, x: [24, 48), [48, 72)
    MnSolver sv = mn_solver_default();
    MnMesaFwd f = {.q = buf, .k = buf, .v = buf, .g = buf, .beta = buf, .lambda = lam, .o = buf + 24, .x = buf + 48,
                   .lambda_seqs = 3};
    st = mn_mesa_forward(&d, &sv, &f);
    CHECK(st == MN_ERR_ARG && strstr(mn_last_error(), "lambda_seqs = 3"), "lambda_seqs 3 of 4: %d %s", st, mn_last_error());
    f.lambda_seqs = 2;  // two rows of [1, 2]
    CHECK(!mn_mesa_forward(&d, &sv, &f), "lambda_seqs 2 of 4: %s", mn_last_error());
    model_free(m);
    cpu->free(cpu, p), cpu->free(cpu, gr), cpu->free(cpu, w), cpu->free(cpu, x), cpu->free(cpu, y);
}

// ------------------------------------------------------------------ a sweep's grid (synth_run_grid)

// The fields of a result that a grid must reproduce (its seconds are the grid's).
static int same_result(const SynthRunResult *a, const SynthRunResult *b) {
    return a->metric == b->metric && a->steps == b->steps && a->epochs == b->epochs &&
           a->stopped_early == b->stopped_early && a->final_loss == b->final_loss && a->cut_short == b->cut_short &&
           ((isnan(a->tvd) && isnan(b->tvd)) || a->tvd == b->tvd);
}

// n runs of task `name` (quick settings, `steps` steps, early stop at stop_acc) alone, then as a
// grid; with stop_at > 0 the grid is cut there (its states saved) and taken up again.
static void grid_vs_alone(const char *name, const char *mixer, int steps, float stop_acc, int stop_at) {
    enum { NG = 3 };
    const SynthTask *t = synth_find_any(name);
    if (!t) die("no task %s", name);
    SynthProtocol p;
    synth_protocol(t, 1, &p);
    p.max_steps = steps, p.epochs = 1000, p.stop_acc = stop_acc;
    SynthSettings s;
    if (synth_grid(t, 0, &s, NULL, 0)) die("%s", mn_last_error());
    synth_quick_settings(t, &s);
    const Backend *cpu = backend_cpu();
    SynthGridRun g[NG] = {{.lr = 3e-3f, .wd = 0, .seed = 4}, {.lr = 1e-2f, .wd = 0.1f, .seed = 4}, {.lr = 5e-3f, .wd = 0.05f, .seed = 7}};
    SynthRunResult alone[NG];
    for (int r = 0; r < NG; r++)
        if (synth_run(t, &s, &p, mixer, g[r].lr, g[r].wd, g[r].seed, cpu, NULL, &alone[r])) die("%s", mn_last_error());
    TmpDir d;
    tmp_make(&d);
    char dirs[NG][300];
    for (int r = 0; r < NG && stop_at; r++) {
        snprintf(dirs[r], sizeof dirs[r], "%s/run%d", d.dir, r);
        g[r].resume = (SynthResume){.state_dir = dirs[r], .stop_at = stop_at};
    }
    CHECK(!synth_run_grid(t, &s, &p, mixer, g, NG, cpu), "%s", mn_last_error());
    if (stop_at) {
        for (int r = 0; r < NG; r++)
            CHECK(g[r].status || g[r].result.cut_short || g[r].result.stopped_early, "%s %s run %d not cut at step %d", name,
                  mixer, r, stop_at);
        for (int r = 0; r < NG; r++) g[r].resume.stop_at = 0;
        CHECK(!synth_run_grid(t, &s, &p, mixer, g, NG, cpu), "%s", mn_last_error());
    }
    int early = 0;
    for (int r = 0; r < NG; r++) early += alone[r].stopped_early;
    CHECK(!(stop_acc > 0) || early > 0, "%s %s: no run stopped early (the case means to compare early stops)", name, mixer);
    test_note("%s %s: %d runs as a grid%s, %d stopped early (steps %d, %d, %d): the same results as alone", name, mixer,
              NG, stop_at ? " cut and taken up again" : "", early, alone[0].steps, alone[1].steps, alone[2].steps);
    for (int r = 0; r < NG; r++) {
        CHECK(!g[r].status, "%s %s run %d: %s", name, mixer, r, g[r].error);
        SynthRunResult *a = &alone[r], *b = &g[r].result;
        if (stop_at && a->stopped_early && a->steps <= stop_at) continue;  // it ended before the cut: not run again
        CHECK(same_result(b, a), "%s %s run %d: grid metric %.17g steps %d epochs %d early %d loss %.17g; alone %.17g %d %d %d %.17g",
              name, mixer, r, b->metric, b->steps, b->epochs, b->stopped_early, b->final_loss, a->metric, a->steps,
              a->epochs, a->stopped_early, a->final_loss);
    }
    tmp_remove(&d);
}

TEST(synth_grid_trains_as_runs_alone) {
    grid_vs_alone("mqar", "gdn", 24, 0, 0);
    grid_vs_alone("mad-memorization", "mesa", 20, 0, 0);
    grid_vs_alone("mad-compression", "mha", 12, 0, 0);  // the autoencoder head
    grid_vs_alone("regbench", "hawk", 10, 0, 0);       // the TVD
    grid_vs_alone("mad-recall", "gla", 60, 0.15f, 0);  // early stops at steps 16, 32 and 48
    grid_vs_alone("mqar", "mlstm", 24, 0, 9);          // cut at step 9, taken up again
    // one run saved part-way alone, the others fresh: steps differ, so the grid trains them one by one
    {
        const SynthTask *tq = synth_find_any("mqar");
        SynthProtocol pq;
        synth_protocol(tq, 1, &pq);
        pq.max_steps = 16;
        SynthSettings sq;
        if (synth_grid(tq, 0, &sq, NULL, 0)) die("%s", mn_last_error());
        synth_quick_settings(tq, &sq);
        TmpDir d;
        tmp_make(&d);
        char dirs[2][300];
        SynthGridRun g2[2] = {{.lr = 3e-3f, .seed = 4}, {.lr = 1e-2f, .seed = 5}};
        SynthRunResult alone[2], cut;
        for (int r = 0; r < 2; r++) {
            snprintf(dirs[r], sizeof dirs[r], "%s/run%d", d.dir, r);
            g2[r].resume.state_dir = dirs[r];
            if (synth_run(tq, &sq, &pq, "gdn", g2[r].lr, 0, g2[r].seed, backend_cpu(), NULL, &alone[r])) die("%s", mn_last_error());
        }
        SynthResume cut_at = {.state_dir = dirs[0], .stop_at = 5};
        CHECK(!synth_run_resumable(tq, &sq, &pq, "gdn", g2[0].lr, 0, g2[0].seed, backend_cpu(), NULL, &cut_at, &cut) &&
                  cut.cut_short,
              "run 0 not cut: %s", mn_last_error());
        CHECK(!synth_run_grid(tq, &sq, &pq, "gdn", g2, 2, backend_cpu()), "%s", mn_last_error());
        for (int r = 0; r < 2; r++)
            CHECK(!g2[r].status && same_result(&g2[r].result, &alone[r]) && g2[r].result.resumed_at == (r ? 0 : 5),
                  "saved at different steps, run %d: %s; metric %g vs %g alone, resumed at %d", r, g2[r].error,
                  g2[r].result.metric, alone[r].metric, g2[r].result.resumed_at);
        tmp_remove(&d);
    }
    // a grid that cannot be made: every run has the error
    const SynthTask *t = synth_find_any("mqar");
    SynthProtocol p;
    synth_protocol(t, 1, &p);
    SynthSettings s;
    if (synth_grid(t, 0, &s, NULL, 0)) die("%s", mn_last_error());
    SynthGridRun g[2] = {{.lr = 1e-3f}, {.lr = 2e-3f}};
    int st = synth_run_grid(t, &s, &p, "nonsense", g, 2, backend_cpu());
    CHECK(st == MN_ERR_ARG && g[0].status == MN_ERR_ARG && g[1].status == MN_ERR_ARG && strstr(g[1].error, "nonsense"),
          "an unknown mixer: %d %d %d '%s'", st, g[0].status, g[1].status, g[1].error);
}
