/*
 * Several runs of a sweep trained at once by one process, each on its own thread with its own
 * backend instance (backend_open; cuda: its own stream, cuBLAS handle and scratch, so that the runs'
 * kernels run side by side on the GPU instead of taking turns as separate processes do; several
 * GPUs: the threads spread over them). A run computes exactly what it computes alone: the same
 * kernels in the same order on its own stream (tests/cuda/test_cuda_parallel.c).
 *
 *     SynthJob jobs[6] = {{.task = t, .settings = s, .protocol = &p, .mixer = "gdn", .lr = 1e-3f, ...}, ...};
 *     synth_run_parallel(jobs, 6, 6, "cuda", 1, 2, NULL);   // jobs[i].status, jobs[i].result
 */
#ifndef MN_SYNTH_PARALLEL_H
#define MN_SYNTH_PARALLEL_H

#include "core/common.h"
#include "synth/run.h"

enum { SYNTH_MAX_PARALLEL = 256 };

typedef struct {
    // the run (synth_run's arguments)
    const SynthTask *task;
    SynthSettings settings;
    const SynthProtocol *protocol;
    const char *mixer;
    float lr, wd;
    uint64_t seed;
    SynthResume resume;  // where it saves and resumes, when it stops (state_dir NULL: neither)
    int grid;            // > 1: this run and the grid - 1 after it (the same task, setting, protocol and
                         // mixer) train together as one model of runs (synth_run_grid) on one thread
    void *user;          // the caller's, untouched
    // how it went
    SynthRunResult result;
    int not_started;           // its resume.deadline had passed when a thread was free for it
    int status;                // MN_OK, or the error of synth_run (or of opening the backend)
    char error[MN_ERROR_MAX];  // its message
    int device;                // the device it ran on
} SynthJob;

// Called on the calling thread of synth_run_parallel as each run starts (running: how many run
// now, this one counted) and ends, in the order these happen, while the other runs go on.
typedef struct {
    void (*started)(SynthJob *j, int running, void *arg);
    void (*ended)(SynthJob *j, void *arg);
    void *arg;
} SynthEvents;

// Trains jobs[0..n) (synth_run_resumable, no per-epoch log; a grid's runs synth_run_grid, as one) up to at_once
// at a time on as many threads,
// each with its own instance of the backend named `backend` (thread k on device k mod gpus; gpus
// 0 or 1: device 0) and `threads` OpenMP threads of its own. A run whose deadline has passed when
// its turn comes is not started (not_started; no started event, an ended one). Returns when every
// run has ended; a failed run is reported by its status and the others go on. MN_ERR_NOMEM when no
// thread starts.
int synth_run_parallel(SynthJob *jobs, int n, int at_once, const char *backend, int gpus, int threads,
                       const SynthEvents *ev);

#endif
