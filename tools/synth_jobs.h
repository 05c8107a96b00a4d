/*
 * synth --jobs: runs of a sweep as child processes of the tool, each with its share of the cores
 * (and of --gpus), stopped with the sweep; and the lock that keeps one sweep at a time in a folder.
 */
#ifndef MN_SYNTH_JOBS_H
#define MN_SYNTH_JOBS_H

#include <sys/types.h>

#include "synth_results.h"

enum { MAX_JOBS = 64 };

// --jobs: one run in a child process, the tool itself with the same options restricted to that run
// (--run-index) and writing to its own directory; the parent alone writes DIR/results.csv.
typedef struct {
    pid_t pid;
    int index;  // the run's number in the sweep (1-based)
    int gpu;    // which of --gpus it runs on (-1: the devices the tool sees)
    char dir[4096];
} Job;

// Installs the handler that stops the jobs with the sweep (SIGINT, SIGTERM, SIGHUP: the jobs get
// SIGTERM and are reaped, then the tool dies of the signal) for the signals the tool does not ignore (a sweep started with SIGINT ignored,
// as `cmd &` in a script is, keeps ignoring it).
void jobs_catch_signals(void);
// One sweep at a time writes an --out folder: it holds an flock on DIR/.synth.lock. The lock's file
// descriptor is inherited by the --jobs processes (no close-on-exec), so the folder stays locked
// until the sweep and every job of it have ended. Kept open until the tool exits.
void lock_out(const char *out);
// Removes the .job-N folders that a sweep stopped before collecting them left in out (their files,
// then the folder). Run under lock_out: no job of another sweep can be writing them.
void remove_stale_jobs(const char *out);
// Starts run `index` of the sweep as a --jobs process: the tool itself (argv: the command's), its
// options restricted to that run, on `threads` threads and GPU `gpu` (-1: the devices the tool
// sees), writing to out/.job-INDEX. --gpus: job k of the first round goes to GPU k mod gpus, and each later job to the GPU of the
// job whose end made room for it, so that every GPU runs jobs / gpus of them at all times.
void job_start(Job *j, int argc, char **argv, const char *out, int index, int threads, int gpu);
// Waits for one of the n jobs to end; its row into *r (MN_OK), or an error naming why not. The
// job is removed from the list (the last one takes its place); *gpu gets the GPU it leaves free.
int job_wait(Job *jobs, int *n, Row *r, int *index, int *gpu);
// --gpus N spreads the runs at once (at_once: --jobs processes or --parallel threads) over N GPUs:
// the cuda backend, at least one run a GPU, and N devices that this process sees.
void check_gpus(int gpus, int at_once, const char *backend);

#endif
