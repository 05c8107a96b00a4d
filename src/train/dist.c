#define _GNU_SOURCE  // memfd_create
#include "train/dist.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/common.h"

extern char **environ;

enum { SLOT = 1 << 18 };  // doubles per rank in the exchange area (2 MiB): sums go in pieces of this
static const uint64_t SHARED_MAGIC = 0x6d65736167727031ull;  // "mesagrp1"

struct DistShared {
    uint64_t magic;
    int size;
    pthread_barrier_t barrier;             // process-shared, for `size` ranks
    unsigned char id[MN_GROUP_ID_BYTES];   // the backend's group identifier, made by rank 0
    double slots[];                        // [size][SLOT] the exchange area
};

static size_t shared_bytes(int size) { return sizeof(DistShared) + (size_t)size * SLOT * sizeof(double); }

// ------------------------------------------------------------------- launching

// "NAME=value" in a fresh string (the children's environments are built before forking).
static char *env_entry(const char *name, const char *value) {
    size_t n = strlen(name) + strlen(value) + 2;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s=%s", name, value);
    return s;
}

static int env_is(const char *entry, const char *name) {
    size_t n = strlen(name);
    return !strncmp(entry, name, n) && entry[n] == '=';
}

int dist_visible_device(int r, char *out, size_t cap) {
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    if (!vis) {
        snprintf(out, cap, "%d", r);
        return MN_OK;
    }
    const char *p = vis;
    for (int i = 0; i < r && p; i++)
        if ((p = strchr(p, ','))) p++;
    size_t len = p ? strcspn(p, ",") : 0;
    if (len == 0 || len >= cap)
        return mn_error(MN_ERR_ARG, "CUDA_VISIBLE_DEVICES=%s: expected a device for each of the GPUs, found none for GPU %d",
                        vis, r);
    memcpy(out, p, len);
    out[len] = 0;
    return MN_OK;
}

// The environment of rank r: ours without the variables the launcher sets, then those.
static char **rank_environment(int r, int size, int fd) {
    static const char *const ours[] = {"MESANET_RANK", "MESANET_RANKS", "MESANET_GROUP_FD", "CUDA_VISIBLE_DEVICES"};
    enum { NOURS = sizeof ours / sizeof ours[0] };
    size_t n = 0;
    while (environ[n]) n++;
    char **env = calloc(n + NOURS + 2, sizeof(char *));
    if (!env) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        int skip = 0;
        for (int j = 0; j < NOURS; j++) skip |= env_is(environ[i], ours[j]);
        if (!skip) env[k++] = environ[i];
    }
    char num[32], dev[64];
    if (dist_visible_device(r, dev, sizeof dev)) {
        free(env);
        return NULL;
    }
    int failed = 0;
    snprintf(num, sizeof num, "%d", r);
    failed |= !(env[k++] = env_entry("MESANET_RANK", num));
    snprintf(num, sizeof num, "%d", size);
    failed |= !(env[k++] = env_entry("MESANET_RANKS", num));
    snprintf(num, sizeof num, "%d", fd);
    failed |= !(env[k++] = env_entry("MESANET_GROUP_FD", num));
    failed |= !(env[k++] = env_entry("CUDA_VISIBLE_DEVICES", dev));
    // The ranks share the cores (the GPUs do the work on cuda; on the CPU each rank takes its part).
    if (!getenv("OMP_NUM_THREADS")) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        snprintf(num, sizeof num, "%ld", cores / size > 1 ? cores / size : 1);
        failed |= !(env[k++] = env_entry("OMP_NUM_THREADS", num));
    }
    if (failed) {
        mn_error(MN_ERR_NOMEM, "out of memory");
        free(env);  // (the few strings made so far are lost: the launch fails anyway)
        return NULL;
    }
    return env;
}

// Frees a rank's environment: the array and the strings made for it (the others are environ's).
static void free_environment(char **env) {
    if (!env) return;
    for (size_t i = 0; env[i]; i++) {
        size_t j = 0;
        while (environ[j] && environ[j] != env[i]) j++;
        if (!environ[j]) free(env[i]);
    }
    free(env);
}

// The shared region, in a memory file the ranks inherit across exec.
static int shared_create(int size, int *fd_out, DistShared **out) {
    int fd = memfd_create("mesanet-group", 0);  // no MFD_CLOEXEC: the ranks inherit it
    if (fd < 0) return mn_error(MN_ERR_IO, "memfd_create for the ranks' shared region failed: %s", strerror(errno));
    size_t bytes = shared_bytes(size);
    DistShared *sh = MAP_FAILED;
    if (ftruncate(fd, (off_t)bytes) == 0) sh = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (sh == MAP_FAILED) {
        close(fd);
        return mn_error(MN_ERR_IO, "cannot map %zu bytes shared by the ranks: %s", bytes, strerror(errno));
    }
    pthread_barrierattr_t attr;
    int e = pthread_barrierattr_init(&attr);
    if (!e) e = pthread_barrierattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    if (!e) e = pthread_barrier_init(&sh->barrier, &attr, (unsigned)size);
    if (e) {
        munmap(sh, bytes);
        close(fd);
        return mn_error(MN_ERR_IO, "cannot make a barrier shared by the ranks: %s", strerror(e));
    }
    pthread_barrierattr_destroy(&attr);
    sh->size = size;
    sh->magic = SHARED_MAGIC;
    *fd_out = fd;
    *out = sh;
    return MN_OK;
}

// Describes how a rank ended (for the launcher's message).
static void describe_exit(int status, char *buf, size_t n) {
    if (WIFEXITED(status)) snprintf(buf, n, "exited with status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status)) snprintf(buf, n, "was killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
    else snprintf(buf, n, "ended with wait status %d", status);
}

// Waits for all ranks; at the first that fails, stops the others.
static int wait_ranks(pid_t *pids, int size) {
    int failed = -1;
    char how[128] = "";
    for (int left = size; left > 0;) {
        int status;
        pid_t p = waitpid(-1, &status, 0);
        if (p < 0) {
            if (errno == EINTR) continue;
            break;
        }
        int r = 0;
        while (r < size && pids[r] != p) r++;
        if (r == size) continue;
        pids[r] = 0;
        left--;
        if ((WIFEXITED(status) && WEXITSTATUS(status) == 0) || failed >= 0) continue;
        failed = r;
        describe_exit(status, how, sizeof how);
        for (int q = 0; q < size; q++)
            if (pids[q]) kill(pids[q], SIGTERM);  // they would wait for rank r forever
    }
    if (failed >= 0) return mn_error(MN_ERR_IO, "rank %d of %d %s; the other ranks were stopped", failed, size, how);
    return MN_OK;
}

int dist_launch(int size, char *const argv[]) {
    if (size < 1) return mn_error(MN_ERR_ARG, "the number of ranks must be >= 1, got %d", size);
    int fd = -1;
    DistShared *sh = NULL;
    MN_TRY(shared_create(size, &fd, &sh));
    pid_t *pids = calloc((size_t)size, sizeof(pid_t));
    char ***envs = calloc((size_t)size, sizeof(char **));
    int s = pids && envs ? MN_OK : mn_error(MN_ERR_NOMEM, "out of memory");
    for (int r = 0; r < size && !s; r++)
        if (!(envs[r] = rank_environment(r, size, fd))) s = MN_ERR_ARG;
    pid_t parent = getpid();
    fflush(NULL);  // nothing buffered twice
    int started = 0;
    for (int r = 0; r < size && !s; r++, started++) {
        pid_t p = fork();
        if (p < 0) {
            s = mn_error(MN_ERR_IO, "fork of rank %d failed: %s", r, strerror(errno));
            break;
        }
        if (p == 0) {
            prctl(PR_SET_PDEATHSIG, SIGTERM);  // the launcher gone (killed): so are the ranks
            if (getppid() != parent) _exit(1);
            execve("/proc/self/exe", argv, envs[r]);
            _exit(127);
        }
        pids[r] = p;
    }
    if (s) {
        for (int r = 0; r < started; r++) kill(pids[r], SIGTERM);
        for (int r = 0; r < started; r++) waitpid(pids[r], NULL, 0);
    } else {
        s = wait_ranks(pids, size);
    }
    if (envs)
        for (int r = 0; r < size; r++) free_environment(envs[r]);
    free(envs);
    free(pids);
    munmap(sh, shared_bytes(size));
    close(fd);
    return s;
}

// ------------------------------------------------------------------- in a rank

static int env_int(const char *name, int *out) {
    const char *v = getenv(name);
    char *end;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || !*v || *end || x < 0 || x > 1 << 20) return mn_error(MN_ERR_ARG, "environment: %s='%s', expected a count", name, v ? v : "");
    *out = (int)x;
    return MN_OK;
}

int dist_join(Group *g, int size) {
    memset(g, 0, sizeof *g);
    g->size = 1;
    if (!getenv("MESANET_RANK")) return MN_OK;
    int rank = 0, ranks = 0, fd = -1;
    MN_TRY(env_int("MESANET_RANK", &rank));
    MN_TRY(env_int("MESANET_RANKS", &ranks));
    MN_TRY(env_int("MESANET_GROUP_FD", &fd));
    if (ranks != size || rank >= ranks)
        return mn_error(MN_ERR_ARG, "environment: rank %d of %d (MESANET_RANK, MESANET_RANKS), but %d ranks were asked for", rank,
                        ranks, size);
    DistShared *sh = mmap(NULL, shared_bytes(size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (sh == MAP_FAILED) return mn_error(MN_ERR_IO, "rank %d: cannot map the ranks' shared region (fd %d): %s", rank, fd, strerror(errno));
    if (sh->magic != SHARED_MAGIC || sh->size != size) {
        munmap(sh, shared_bytes(size));
        return mn_error(MN_ERR_FORMAT, "rank %d: fd %d is not a shared region for %d ranks", rank, fd, size);
    }
    close(fd);  // the mapping stays
    g->rank = rank;
    g->size = size;
    g->shared = sh;
    return MN_OK;
}

void group_barrier(Group *g) {
    if (g->size > 1) pthread_barrier_wait(&g->shared->barrier);
}

int group_connect(Group *g, const Backend *be) {
    g->be = NULL;
    if (g->size == 1 || !be->group_join) return MN_OK;  // alone, or summing through the host
    if (g->rank == 0) MN_TRY(be->group_id(be, g->shared->id));
    group_barrier(g);
    MN_TRY(be->group_join(be, g->shared->id, g->rank, g->size));
    g->be = be;
    return MN_OK;
}

int group_sum_host(Group *g, double *x, size_t n) {
    if (g->size == 1) return MN_OK;
    DistShared *sh = g->shared;
    for (size_t off = 0; off < n; off += SLOT) {
        size_t m = n - off < SLOT ? n - off : SLOT;
        memcpy(sh->slots + (size_t)g->rank * SLOT, x + off, m * sizeof(double));
        group_barrier(g);
        // every rank adds in rank order, so that all get the same bits
        for (size_t i = 0; i < m; i++) {
            double s = 0;
            for (int r = 0; r < g->size; r++) s += sh->slots[(size_t)r * SLOT + i];
            x[off + i] = s;
        }
        group_barrier(g);  // all have read the slots before the next piece overwrites them
    }
    return MN_OK;
}

int group_sum(Group *g, const Backend *be, void *x, size_t n) {
    if (g->size == 1) return MN_OK;
    if (g->be == be) {
        MN_TRY(be->allreduce(be, x, n));
        return be->allreduce_wait(be);
    }
    if (n > g->host_n) {  // (the gradients' size: grown once, then every step reuses it)
        free(g->host);
        g->host_n = 0;
        g->host = malloc(n * sizeof(double));
        if (!g->host) return mn_error(MN_ERR_NOMEM, "out of memory (%zu numbers to sum over the ranks)", n);
        g->host_n = n;
    }
    MN_TRY(be->download(be, g->host, x, n, MEM_F32));
    MN_TRY(group_sum_host(g, g->host, n));
    return be->upload(be, x, g->host, n, MEM_F32);
}

int group_sum_eval(Group *g, EvalResult *r) {
    if (g->size == 1) return MN_OK;
    size_t n = 3 + 2 * (size_t)r->T;
    double *v = malloc(n * sizeof(double));
    if (!v) return mn_error(MN_ERR_NOMEM, "out of memory");
    v[0] = r->nll_sum;
    v[1] = r->count;
    v[2] = r->cg_steps / g->size;
    memcpy(v + 3, r->pos_sum, r->T * sizeof(double));
    memcpy(v + 3 + r->T, r->pos_count, r->T * sizeof(double));
    int s = group_sum_host(g, v, n);
    r->nll_sum = v[0];
    r->count = v[1];
    r->cg_steps = v[2];
    memcpy(r->pos_sum, v + 3, r->T * sizeof(double));
    memcpy(r->pos_count, v + 3 + r->T, r->T * sizeof(double));
    free(v);
    return s;
}

static int sum_block(void *arg, void *grads, size_t n) {
    const Backend *be = ((Group *)arg)->be;
    return be->allreduce(be, grads, n);
}

void group_grads_begin(Group *g, Model *m) {
    if (g->size > 1 && g->be == m->be) {
        m->grads_done = sum_block;
        m->grads_done_arg = g;
    }
}

int group_grads_end(Group *g, Model *m) {
    if (g->size == 1) return MN_OK;
    if (m->grads_done == sum_block) {
        m->grads_done = NULL;
        return m->be->allreduce_wait(m->be);
    }
    return group_sum(g, m->be, m->grads, m->total);
}

void group_close(Group *g) {
    if (g->shared) munmap(g->shared, shared_bytes(g->size));
    free(g->host);
    g->shared = NULL;
    g->be = NULL;
    g->host = NULL;
    g->host_n = 0;
}
