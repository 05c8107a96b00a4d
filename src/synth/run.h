/*
 * Training and scoring a model on a synthetic task (synth.h), by the task's
 * protocol (docs/spec/benchmarks.md, docs/spec/reference/benchmarks-notes.md):
 * model size, batch, epochs, learning-rate grid, early stop. One run is one
 * (task, setting, mixer, learning rate, weight decay); `mesanet synth` sweeps
 * them and keeps the best per setting.
 *
 *     SynthProtocol p; synth_protocol(t, quick, &p);
 *     SynthSettings s; synth_grid(t, 0, &s, label, sizeof label);
 *     if (quick) synth_quick_settings(t, &s);
 *     SynthRunResult r;
 *     synth_run(t, &s, &p, "gdn", p.lrs[0], p.wds[0], seed, backend_by_name("cpu"), stderr, &r);
 */
#ifndef MN_SYNTH_RUN_H
#define MN_SYNTH_RUN_H

#include <stdio.h>

#include "core/backend.h"
#include "model/config.h"
#include "synth/synth.h"

enum { SYNTH_MAX_LRS = 8 };

typedef struct {
    int dim, n_layers, n_heads, head_dim, mlp_hidden;  // the model (width, blocks, heads; SwiGLU width)
    int batch;            // training sequences per step
    int epochs;           // passes over the training set at most
    int max_steps;        // > 0: at most this many steps whatever the epochs
    float warmup_frac;    // fraction of the steps of linear warm-up (then cosine to lr_final * lr)
    float lr_final;
    float stop_acc;       // > 0: stop as soon as the test metric reaches it (checked once per epoch)
    float clip;           // global gradient-norm clip
    int nlr;              // the (lr, wd) grid: nlr pairs
    float lrs[SYNTH_MAX_LRS], wds[SYNTH_MAX_LRS];
    const char *source;   // where the protocol comes from, for reports
} SynthProtocol;

// The protocol of a task's family (mqar: Zoology Fig. 2; mad: MAD; parity, niah: ours, as noted);
// quick: a tiny one (width 32, 40 steps, one learning rate) that runs in seconds on a CPU.
void synth_protocol(const SynthTask *t, int quick, SynthProtocol *p);

// Shrinks a setting for --quick (short sequences, small vocabulary, 256 training and 64 test
// examples), keeping each change only where the task accepts it (synth_check).
void synth_quick_settings(const SynthTask *t, SynthSettings *s);

// The model config for a task setting and a mixer (a name or a pattern: "gdn", "gdn,mha"):
// the "tiny" preset's backbone sized by the protocol. MN_ERR_ARG naming the mixer when the
// config does not accept it.
int synth_model_config(const SynthTask *t, const SynthSettings *s, const SynthProtocol *p, const char *mixer,
                       ModelConfig *c);

// Whether the task can be run here (MN_ERR_ARG saying why not): every task can now, MAD
// compression with the autoencoder head (synth_model_config sets head "autoencoder" for it).
int synth_task_supported(const SynthTask *t);

typedef struct {
    double metric;      // the task's metric on the test split (synth_meter_value)
    int steps;          // optimizer steps taken
    int epochs;         // epochs begun
    double seconds;     // training and scoring time
    int stopped_early;  // the test metric reached stop_acc
    double final_loss;  // mean training loss of the last step
    double tvd;         // RegBench: mean total variation distance (textbook, halved) between the softmax of
                        // the logits and the automaton's next-symbol distribution (rb_metrics_tvd) over the
                        // scored test positions; NAN for the other tasks
    int cut_short;      // stopped part-way (SynthResume), its state saved: no metric yet; run again to go on
    int resumed_at;     // the step it went on from (a saved state), 0 for a fresh run
} SynthRunResult;

// Trains a fresh model (seeded by seed) on the setting's training split with AdamW, warm-up and
// cosine, stopping early by the protocol, and scores the test split (greedy argmax at the scored
// positions; RegBench also the TVD of the softmax, r->tvd). `log` (may be NULL) gets a line per epoch.
int synth_run(const SynthTask *t, const SynthSettings *s, const SynthProtocol *p, const char *mixer, float lr,
              float wd, uint64_t seed, const Backend *be, FILE *log, SynthRunResult *r);

// How a run may stop part-way and be taken up again (synth_run_resumable): its state (weights, AdamW's
// moments, the step, the data order's position, the time spent) kept as a checkpoint set in state_dir
// (train/checkpoint.h: a kill at any instant leaves the last one whole).
typedef struct {
    const char *state_dir;  // the run's folder (NULL: the run neither saves nor resumes)
    double deadline;        // mn_now() at which the run saves and stops (0: none)
    int stop_at;            // > 0: save and stop after this many steps (a deterministic cut, for tests)
    double save_every;      // > 0: save also every this many seconds, so that a kill loses at most that
} SynthResume;

// synth_run that goes on from the state in rs->state_dir where there is one (r->resumed_at), saves
// it as rs says, and stops part-way at the deadline or stop_at (r->cut_short, no metric); a run that
// ends removes its state. A run stopped and resumed computes the same numbers as one never stopped
// (bit for bit on the CPU). rs may be NULL: synth_run.
int synth_run_resumable(const SynthTask *t, const SynthSettings *s, const SynthProtocol *p, const char *mixer,
                        float lr, float wd, uint64_t seed, const Backend *be, FILE *log, const SynthResume *rs,
                        SynthRunResult *r);

// One run of a grid (synth_run_grid): what it trains with, and how it went.
typedef struct {
    float lr, wd;
    uint64_t seed;             // its data and initialisation
    SynthResume resume;        // where it saves and resumes (state_dir NULL: neither); the grid stops at
                               // the first run's deadline or stop_at
    SynthRunResult result;
    int status;                // MN_OK, or its error (a non-finite loss or gradient): the others go on
    char error[MN_ERROR_MAX];  // its message
} SynthGridRun;

// n runs of one task, setting, protocol and mixer (a learning-rate and weight-decay grid, seeds)
// trained together as one model of n runs (model_create_runs): each with its own data, schedule,
// early stop, saved state and result, the same numbers as synth_run_resumable gives it alone (bit
// for bit on the CPU; tests/test_synth_run.c). A run that stops early idles (learning rate 0) while
// the others go on; its seconds are the grid's until then. Runs saved part-way at different steps
// cannot share the step count: they are trained one after the other instead. Returns an error only
// when the grid cannot be made (then every run has it as its status).
int synth_run_grid(const SynthTask *t, const SynthSettings *s, const SynthProtocol *p, const char *mixer,
                   SynthGridRun *runs, int n, const Backend *be);

// RegBench (src/synth/regbench.h) as a task of the table's form: "regbench", seq_len the longest
// string, n_train / n_test the automata (grid: n_train 1K .. 40K), scored by greedy validity
// accuracy (rb_metrics_greedy). synth_run alone makes its examples (synth_make cannot).
extern const SynthTask synth_task_regbench;
// synth_find, and "regbench".
const SynthTask *synth_find_any(const char *name);

// Names that stand for several tasks: a family ("mad", "niah") or "all".
typedef struct {
    const char *name, *summary;
} SynthGroup;
extern const SynthGroup synth_groups[];
int synth_group_count(void);

// The tasks a name stands for, in the table's order: one task ("mqar", "niah-2", "regbench") or a
// group (synth_groups: "mad", "niah", "all", RegBench last). Writes at most max of them into out and
// returns how many the name stands for; -1 (MN_ERR_ARG listing the tasks and groups) for an unknown name.
int synth_expand(const char *name, const SynthTask **out, int max);

// Published numbers: the MesaNet paper's Table 1 (MAD) per column; MQAR: attention only, read
// from Zoology's Fig. 2 (about 1.0 at every width and length; the other models of that figure are
// not mixers here, and the notes' other MQAR numbers are plot readings under another protocol).
// RegBench: none (its papers publish plots, not values: docs/spec/reference/benchmarks-notes.md
// 2.5). For a task and a mixer, *value (percent) and *column when listed, else 0 returned.
int synth_published(const char *task, const char *mixer, double *value, const char **column);
// The source of the published numbers (MAD's), for reports.
extern const char *const synth_published_source;
// The source of a task's published numbers (NULL where synth_published lists none for it).
const char *synth_published_source_of(const char *task);

#endif
