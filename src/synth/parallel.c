// Runs of a sweep on threads of one process (parallel.h).
#include "parallel.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "backends/registry.h"

// The shared state: the next run to take, and the queue of runs that have started or ended and
// are not reported yet (the calling thread reports them, so that its output is never interleaved).
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    SynthJob *runs;
    int n, next;  // next: the first run no thread has taken
    int *events;  // run i started: i; ended: -1 - i (n + n slots: each run starts and ends once)
    int nevents, reported;
    const char *backend;
    int gpus, threads;
} Pool;

typedef struct {
    Pool *pool;
    int slot;
} Worker;

static void post(Pool *p, int event) {
    pthread_mutex_lock(&p->mu);
    p->events[p->nevents++] = event;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

// Runs [i, i + g) as one grid (synth_run_grid) on this thread: each started and ended as a run is.
static void run_grid(Pool *p, int i, int g, const Backend *be, int device, const char *open_error) {
    SynthJob *j = &p->runs[i];
    int late = j->resume.deadline > 0 && mn_now() >= j->resume.deadline;
    for (int k = 0; k < g; k++) {
        j[k].device = device, j[k].not_started = late;
        post(p, i + k);
    }
    SynthGridRun *runs = late ? NULL : calloc((size_t)g, sizeof *runs);
    if (!late && (!be || !runs)) {
        for (int k = 0; k < g; k++) {
            j[k].status = !be ? MN_ERR_UNSUPPORTED : MN_ERR_NOMEM;
            snprintf(j[k].error, sizeof j[k].error, "%s", !be ? open_error : "synth: out of memory");
        }
    } else if (!late) {
        for (int k = 0; k < g; k++) runs[k] = (SynthGridRun){.lr = j[k].lr, .wd = j[k].wd, .seed = j[k].seed, .resume = j[k].resume};
        synth_run_grid(j->task, &j->settings, j->protocol, j->mixer, runs, g, be);
        for (int k = 0; k < g; k++) {
            j[k].result = runs[k].result, j[k].status = runs[k].status;
            snprintf(j[k].error, sizeof j[k].error, "%s", runs[k].error);
        }
    }
    free(runs);
    for (int k = 0; k < g; k++) post(p, -1 - (i + k));
}

// A thread of the pool: its backend instance, then runs until none is left.
static void *worker(void *arg) {
    Worker *w = arg;
    Pool *p = w->pool;
#ifdef _OPENMP
    omp_set_num_threads(p->threads);  // this thread's share of the cores (an ICV of the thread)
#endif
    int device = p->gpus > 0 ? w->slot % p->gpus : 0;
    const Backend *be = backend_open(p->backend, device);
    char open_error[MN_ERROR_MAX] = "";
    if (!be) snprintf(open_error, sizeof open_error, "%s", mn_last_error());
    for (;;) {
        pthread_mutex_lock(&p->mu);
        int i = p->next < p->n ? p->next : -1;
        int g = i >= 0 && p->runs[i].grid > 1 ? p->runs[i].grid : 1;
        if (i >= 0) p->next = i + g < p->n ? i + g : p->n;
        pthread_mutex_unlock(&p->mu);
        if (i < 0) break;
        if (g > 1) {
            run_grid(p, i, g < p->n - i ? g : p->n - i, be, device, open_error);
            continue;
        }
        SynthJob *r = &p->runs[i];
        r->device = device;
        r->not_started = r->resume.deadline > 0 && mn_now() >= r->resume.deadline;
        post(p, i);
        if (!r->not_started && !be) {
            r->status = MN_ERR_UNSUPPORTED;
            snprintf(r->error, sizeof r->error, "%s", open_error);
        } else if (!r->not_started) {
            r->status = synth_run_resumable(r->task, &r->settings, r->protocol, r->mixer, r->lr, r->wd, r->seed, be, NULL,
                                            &r->resume, &r->result);
            if (r->status) snprintf(r->error, sizeof r->error, "%s", mn_last_error());
        }
        post(p, -1 - i);
    }
    backend_close(be);
    return NULL;
}

int synth_run_parallel(SynthJob *runs, int n, int at_once, const char *backend, int gpus, int threads, const SynthEvents *ev) {
    if (n <= 0) return MN_OK;
    if (at_once > n) at_once = n;
    Pool p = {.runs = runs, .n = n, .backend = backend, .gpus = gpus, .threads = threads > 0 ? threads : 1};
    p.events = malloc(sizeof(int) * 2 * (size_t)n);
    pthread_t *tid = malloc(sizeof(pthread_t) * (size_t)at_once);
    Worker *w = malloc(sizeof(Worker) * (size_t)at_once);
    if (!p.events || !tid || !w) {
        free(p.events), free(tid), free(w);
        return mn_error(MN_ERR_NOMEM, "synth: out of memory starting the runs");
    }
    pthread_mutex_init(&p.mu, NULL);
    pthread_cond_init(&p.cv, NULL);
    int started = 0, st = MN_OK;
    for (; started < at_once; started++) {
        w[started] = (Worker){&p, started};
        if (pthread_create(&tid[started], NULL, worker, &w[started])) {
            st = mn_error(MN_ERR_NOMEM, "synth: could not start thread %d of %d", started + 1, at_once);
            break;
        }
    }
    if (started == 0) {  // no thread: no run taken, nothing to wait for
        pthread_mutex_destroy(&p.mu), pthread_cond_destroy(&p.cv);
        free(p.events), free(tid), free(w);
        return st;
    }
    // Every run ends (the threads started take them all): report each event as it comes.
    int running = 0;
    pthread_mutex_lock(&p.mu);
    while (p.reported < 2 * n) {
        while (p.reported == p.nevents) pthread_cond_wait(&p.cv, &p.mu);
        int e = p.events[p.reported++];
        pthread_mutex_unlock(&p.mu);
        SynthJob *j = &runs[e >= 0 ? e : -1 - e];
        if (e >= 0 && !j->not_started) {
            running++;
            if (ev && ev->started) ev->started(j, running, ev->arg);
        } else if (e < 0) {
            running -= !j->not_started;
            if (ev && ev->ended) ev->ended(j, ev->arg);
        }
        pthread_mutex_lock(&p.mu);
    }
    pthread_mutex_unlock(&p.mu);
    for (int i = 0; i < started; i++) pthread_join(tid[i], NULL);
    pthread_mutex_destroy(&p.mu), pthread_cond_destroy(&p.cv);
    free(p.events), free(tid), free(w);
    return st;
}
