#include "common.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <errno.h>
#include <sys/stat.h>

static _Thread_local char last_error[MN_ERROR_MAX];

int mn_error(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return code;
}

const char *mn_last_error(void) { return last_error[0] ? last_error : "no error"; }

void mn_error_save(char saved[MN_ERROR_MAX]) { memcpy(saved, last_error, MN_ERROR_MAX); }

void mn_error_restore(const char saved[MN_ERROR_MAX]) { memcpy(last_error, saved, MN_ERROR_MAX); }

void *mn_calloc(size_t count, size_t size) {
    if (count != 0 && size > SIZE_MAX / count) {
        mn_error(MN_ERR_NOMEM, "allocation of %zu x %zu bytes overflows", count, size);
        return NULL;
    }
    size_t bytes = count * size;
    bytes = (bytes + 63) & ~(size_t)63;  // aligned_alloc wants a multiple of the alignment
    if (bytes == 0) bytes = 64;
    void *p = aligned_alloc(64, bytes);
    if (!p) {
        mn_error(MN_ERR_NOMEM, "out of memory allocating %zu bytes", bytes);
        return NULL;
    }
    memset(p, 0, bytes);
    return p;
}

void mn_free(void *p) { free(p); }

void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "mesanet: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

void *xcalloc(size_t count, size_t size) {
    void *p = mn_calloc(count, size);
    if (!p) die("%s", mn_last_error());
    return p;
}

double mn_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void mn_rng_seed(MnRng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t mn_rng_u64(MnRng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double mn_rng_uniform(MnRng *r) { return (double)(mn_rng_u64(r) >> 11) * 0x1.0p-53; }

double mn_rng_normal(MnRng *r) {
    double u1 = mn_rng_uniform(r), u2 = mn_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

int mn_mkdirs(const char *path) {
    size_t n = strlen(path);
    if (n == 0) return mn_error(MN_ERR_ARG, "empty directory name");
    char *p = malloc(n + 1);
    if (!p) return mn_error(MN_ERR_NOMEM, "out of memory creating %s", path);
    memcpy(p, path, n + 1);
    int s = MN_OK;
    // Each prefix ending before a '/', then the whole path.
    for (size_t i = 1; i <= n && !s; i++) {
        if (i < n && p[i] != '/') continue;
        char c = p[i];
        p[i] = 0;
        struct stat st;
        if (mkdir(p, 0777) && errno != EEXIST)
            s = mn_error(MN_ERR_IO, "%s: cannot create the directory (%s)", p, strerror(errno));
        else if (stat(p, &st) || !S_ISDIR(st.st_mode))
            s = mn_error(MN_ERR_IO, "%s: exists and is not a directory", p);
        p[i] = c;
    }
    free(p);
    return s;
}

int mn_mkdirs_parent(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash || slash == path) return MN_OK;
    size_t n = (size_t)(slash - path);
    char *dir = malloc(n + 1);
    if (!dir) return mn_error(MN_ERR_NOMEM, "out of memory creating the parent of %s", path);
    memcpy(dir, path, n);
    dir[n] = 0;
    int s = mn_mkdirs(dir);
    free(dir);
    return s;
}
