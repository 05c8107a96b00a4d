/*
 * Several copies of one model trained side by side as one batch (a sweep's runs that share an
 * architecture: a learning-rate and weight-decay grid, seeds): a backend that stands in front of
 * another and serves R copies of the model at once.
 *
 * The model holds R parameter slabs back to back (and R gradient slabs), and its batch is the
 * runs' batches one after the other: rows [r N/R, (r+1) N/R) of every activation are run r's. Ops
 * without parameters (elementwise, attention, the linear-attention and mLSTM cores) run once over
 * all R N/R rows, so that a kernel sized for a large batch sees one; an op that reads a parameter
 * (a projection, a norm's weight, a convolution, the embedding) or writes its gradient runs once a
 * run, on that run's rows and that run's copy of the tensor, so that every run computes exactly
 * what it computes alone (tests/test_runs.c: bit for bit on the CPU). The per-run sums of a
 * training step (the loss, the gradient's weight) are [R] vectors here where they are [1] alone.
 *
 * A parameter is recognised by its address: a pointer into run 0's slab of parameters or of
 * gradients stands for that tensor in every run. The few buffers derived from parameters alone
 * (Mesa's ridge, softplus of its parameters, and the ridge's gradient) are per run too: the mixer
 * allocates them R times (MixerBuf's fixed elements count per run: Backend.runs) and the ops that
 * write or read them take run r's at r times their size. Any other pointer where an op expects a
 * parameter is refused, naming the op: a new op that reads parameters is wrapped here or refused,
 * never silently shared between runs.
 *
 * Batched (RunsBackend.batched): the projections go to the inner backend's linear_runs_* (one
 * batched product), and the Mesa core and the scans run once over every run's sequences with their
 * parameters a group of sequences (MnMesaFwd.lambda_seqs, ScanDims.w_seqs); the same numbers on the
 * CPU (tested both ways).
 */
#ifndef MN_CORE_RUNS_H
#define MN_CORE_RUNS_H

#include "core/backend.h"

typedef struct {
    Backend be;               // the op table (first, so that an op's `be` is this struct); its ctx is the inner's
    const Backend *in;        // the backend that runs the ops
    int R;                    // runs
    const char *params;       // run 0's parameter slab; run r's starts r * params_run bytes after it
    size_t params_run;
    const char *grads;        // run 0's gradient slab, likewise
    size_t grads_run;
    int batched;              // 1: the projections as one batched product (in->linear_runs_*, where in has it),
                              // the Mesa core and the scans once over every run's sequences (their parameters
                              // a run: lambda_seqs, w_seqs); 0: all once a run. From MESANET_RUNS_BATCHED
                              // ("1"); the tests take both
    MesaOps mesa;             // the sub-tables, with their parameter-reading ops wrapped
    LinOps lin;
    ScanOps scan;
    SlstmOps slstm;
} RunsBackend;

// Makes rb a backend that serves R >= 2 runs over `in` (its name and ctx are in's, so that messages
// and the inner ops' state stay the same). The slabs are set once allocated (runs_backend_slabs).
int runs_backend_init(RunsBackend *rb, const Backend *in, int R);
// Run 0's parameter and gradient slabs and the bytes of one run's slab of each.
void runs_backend_slabs(RunsBackend *rb, const void *params, size_t params_run, const void *grads, size_t grads_run);
// The number of runs a backend serves: R of a RunsBackend, 1 otherwise.
static inline int backend_runs(const Backend *be) { return be->runs > 1 ? be->runs : 1; }

#endif
