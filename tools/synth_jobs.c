// synth --jobs: the runs of a sweep as child processes (synth_jobs.h).
#include "synth_jobs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "core/common.h"
#include "tools/commands.h"
#include "train/dist.h"

#define CMD "synth"

// The pids of the --jobs processes alive, for on_stop: signals that stop the sweep stop its jobs.
// Changed with those signals blocked (jobs_block), so the handler never sees a table half-written.
static volatile pid_t live_jobs[MAX_JOBS];
static const int stop_signals[3] = {SIGINT, SIGTERM, SIGHUP};

static void jobs_block(int block, sigset_t *old) {
    sigset_t set;
    sigemptyset(&set);
    for (int i = 0; i < 3; i++) sigaddset(&set, stop_signals[i]);
    sigprocmask(block ? SIG_BLOCK : SIG_SETMASK, block ? &set : old, block ? old : NULL);
}

static void live_jobs_set(pid_t old_pid, pid_t new_pid) {
    for (int i = 0; i < MAX_JOBS; i++)
        if (live_jobs[i] == old_pid) {
            live_jobs[i] = new_pid;
            return;
        }
}

// SIGINT, SIGTERM or SIGHUP of the sweep: its jobs get SIGTERM and are reaped, then the tool dies
// of the signal as it would have without the handler (exit status 128 + the signal). Only
// async-signal-safe calls. (A SIGKILL cannot be caught: the jobs' PR_SET_PDEATHSIG covers it.)
static void on_stop(int sig) {
    for (int i = 0; i < MAX_JOBS; i++)
        if (live_jobs[i] > 0) kill(live_jobs[i], SIGTERM);
    for (int i = 0; i < MAX_JOBS; i++)
        if (live_jobs[i] > 0)
            while (waitpid(live_jobs[i], NULL, 0) < 0 && errno == EINTR) {
            }
    signal(sig, SIG_DFL);
    raise(sig);  // delivered when the handler returns
}

void jobs_catch_signals(void) {
    for (int i = 0; i < 3; i++) {
        struct sigaction sa, was;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_stop;
        sigemptyset(&sa.sa_mask);
        for (int k = 0; k < 3; k++) sigaddset(&sa.sa_mask, stop_signals[k]);
        if (sigaction(stop_signals[i], NULL, &was) == 0 && was.sa_handler != SIG_IGN) sigaction(stop_signals[i], &sa, NULL);
    }
}

void lock_out(const char *out) {
    char path[4200];
    snprintf(path, sizeof path, "%s/.synth.lock", out);
    int fd = open(path, O_RDWR | O_CREAT, 0644);
    if (fd < 0) cmd_fail(CMD, "--out %s: cannot open %s: %s", out, path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB)) {
        if (errno == EWOULDBLOCK)
            cmd_fail(CMD, "--out %s: another synth sweep (or a job of one) is writing there; wait for it to end, "
                          "or use another --out", out);
        cmd_fail(CMD, "--out %s: cannot lock %s: %s", out, path, strerror(errno));
    }
}

void remove_stale_jobs(const char *out) {
    DIR *d = opendir(out);
    if (!d) cmd_fail(CMD, "--out %s: cannot list it: %s", out, strerror(errno));
    int removed = 0;
    for (struct dirent *e; (e = readdir(d));) {
        const char *n = e->d_name;
        if (strncmp(n, ".job-", 5) || !n[5] || strspn(n + 5, "0123456789") != strlen(n + 5)) continue;
        char dir[4200];
        snprintf(dir, sizeof dir, "%s/%s", out, n);
        DIR *j = opendir(dir);
        if (!j) continue;  // not a folder: not ours
        for (struct dirent *f; (f = readdir(j));) {
            if (!strcmp(f->d_name, ".") || !strcmp(f->d_name, "..")) continue;
            char file[8400];
            snprintf(file, sizeof file, "%s/%s", dir, f->d_name);
            if (unlink(file)) cmd_fail(CMD, "%s: cannot remove a stopped job's file: %s", file, strerror(errno));
        }
        closedir(j);
        if (rmdir(dir)) cmd_fail(CMD, "%s: cannot remove a stopped job's folder: %s", dir, strerror(errno));
        removed++;
    }
    closedir(d);
    if (removed)
        printf("synth: removed %d job folder%s (.job-N) that a stopped sweep left\n", removed, plural_s(removed));
}

void job_start(Job *j, int argc, char **argv, const char *out, int index, int threads, int gpu) {
    char dev[64] = "";
    if (gpu >= 0 && dist_visible_device(gpu, dev, sizeof dev)) cmd_fail(CMD, "--gpus: %s", mn_last_error());
    char idx[32];
    snprintf(idx, sizeof idx, "%d", index);
    snprintf(j->dir, sizeof j->dir, "%s/.job-%d", out, index);
    if (mn_mkdirs(j->dir)) cmd_fail(CMD, "%s: %s", j->dir, mn_last_error());
    char **cargv = calloc((size_t)argc + 8, sizeof(char *));
    if (!cargv) cmd_fail(CMD, "out of memory");
    int n = 0;
    cargv[n++] = "mesanet";
    for (int i = 0; i < argc; i++) cargv[n++] = argv[i];
    cargv[n++] = "--run-index", cargv[n++] = idx, cargv[n++] = "--out", cargv[n++] = j->dir;
    cargv[n++] = "--jobs", cargv[n++] = "1", cargv[n] = NULL;
    fflush(stdout), fflush(stderr);
    pid_t parent = getpid();
    sigset_t old;
    jobs_block(1, &old);  // until the job is in live_jobs (parent) or on the default handlers (child)
    pid_t pid = fork();
    if (pid < 0) cmd_fail(CMD, "fork: cannot start a job");
    if (pid == 0) {
#ifdef __linux__
        // The job dies with the sweep, even of a SIGKILL; a sweep that died before this took hold
        // has made the job an orphan already.
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) || getppid() != parent) _exit(127);
#else
        (void)parent;
#endif
        for (int i = 0; i < 3; i++) {
            struct sigaction was;
            if (sigaction(stop_signals[i], NULL, &was) == 0 && was.sa_handler == on_stop) signal(stop_signals[i], SIG_DFL);
        }
        jobs_block(0, &old);
        char th[32];
        snprintf(th, sizeof th, "%d", threads);
        setenv("OMP_NUM_THREADS", th, 1);
        if (gpu >= 0) setenv("CUDA_VISIBLE_DEVICES", dev, 1);
        if (!freopen("/dev/null", "w", stdout)) _exit(127);
        execv("/proc/self/exe", cargv);
        _exit(127);
    }
    live_jobs_set(0, pid);
    jobs_block(0, &old);
    free(cargv);
    j->pid = pid, j->index = index, j->gpu = gpu;
}

int job_wait(Job *jobs, int *n, Row *r, int *index, int *gpu) {
    int status;
    pid_t pid;
    do pid = waitpid(-1, &status, 0);
    while (pid < 0 && errno == EINTR);
    if (pid < 0) return mn_error(MN_ERR_IO, "waitpid failed");
    int k = 0;
    while (k < *n && jobs[k].pid != pid) k++;
    if (k == *n) return job_wait(jobs, n, r, index, gpu);  // not ours
    sigset_t old;
    jobs_block(1, &old);
    live_jobs_set(pid, 0);
    jobs_block(0, &old);
    Job j = jobs[k];
    jobs[k] = jobs[--*n];
    *index = j.index;
    *gpu = j.gpu;
    if (!WIFEXITED(status) || WEXITSTATUS(status))
        return mn_error(MN_ERR_ARG, "run %d (a --jobs process) failed (%s %d)", j.index,
                        WIFEXITED(status) ? "exit status" : "signal",
                        WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? WTERMSIG(status) : -1);
    char path[4200];
    Rows one = {0};
    snprintf(path, sizeof path, "%s/results.csv", j.dir);
    load_rows(path, &one);
    int st = one.n == 1 ? MN_OK : mn_error(MN_ERR_IO, "run %d: %s holds %d rows, not 1", j.index, path, one.n);
    if (!st) *r = one.v[0];
    free(one.v);
    remove(path);
    snprintf(path, sizeof path, "%s/results.json", j.dir);
    remove(path);
    rmdir(j.dir);
    return st;
}

#ifdef MN_HAVE_CUDA
int cuda_device_count(void);
#endif

void check_gpus(int gpus, int at_once, const char *backend) {
    if (!gpus) return;
    if (strcmp(backend, "cuda")) cmd_fail(CMD, "--gpus %d: GPUs are for --backend cuda, not %s", gpus, backend);
    if (at_once < gpus)
        cmd_fail(CMD, "--gpus %d: needs --jobs or --parallel %d or more (at least one run at a time on each GPU), not %d",
                 gpus, gpus, at_once);
#ifdef MN_HAVE_CUDA
    int n = cuda_device_count();
#else
    int n = 0;  // a build without CUDA
#endif
    if (n < gpus) cmd_fail(CMD, "--gpus %d: this process sees %d GPU(s)", gpus, n);
}
