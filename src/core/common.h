/*
 * Common helpers of the library: status codes and error messages, checked
 * allocation, timing, a small random number generator.
 *
 * Library functions never exit: they return a status (0 = MN_OK) and leave a
 * message for mn_last_error(). Tools print that message and exit non-zero.
 */
#ifndef MN_COMMON_H
#define MN_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "mesanet.h"

// Records a formatted message for mn_last_error() and returns `code`, so that
// `return mn_error(MN_ERR_ARG, "T must be > 0, got %d", T);` reads naturally.
int mn_error(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// The message's room, and a copy of it to put back: a caller that handles a failure (and then
// succeeds another way) restores the message from before, so that the handled failure's does
// not read as the last error.
enum { MN_ERROR_MAX = 1024 };
void mn_error_save(char saved[MN_ERROR_MAX]);
void mn_error_restore(const char saved[MN_ERROR_MAX]);

// Propagates a non-zero status to the caller.
#define MN_TRY(expr)            \
    do {                        \
        int mn_try_s_ = (expr); \
        if (mn_try_s_) return mn_try_s_; \
    } while (0)

// Zeroed, 64-byte aligned memory (cache lines and AVX-512 registers); NULL and
// an error message on failure. Free with mn_free.
void *mn_calloc(size_t count, size_t size);
void mn_free(void *p);

// Allocates or dies: for tools and tests only, never for library code.
void *xcalloc(size_t count, size_t size);
// Prints "mesanet: <msg>" to stderr and exits with status 1.
void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

// Monotonic wall clock in seconds.
double mn_now(void);

// Creates the directory `path` and every missing parent (as `mkdir -p`, mode 0777 less the
// umask). An existing directory is success; otherwise MN_ERR_IO naming the component that
// could not be made and the system's reason (strerror).
int mn_mkdirs(const char *path);
// Creates the parent directories of the file `path` (nothing for a bare file name).
int mn_mkdirs_parent(const char *path);

// ---------------------------------------------------------------------------
// Random numbers: splitmix64 seeding + xoshiro256** (fast, good quality,
// reproducible on every platform, unlike rand()).

typedef struct {
    uint64_t s[4];
} MnRng;

void mn_rng_seed(MnRng *r, uint64_t seed);
uint64_t mn_rng_u64(MnRng *r);
double mn_rng_uniform(MnRng *r);  // in [0, 1)
double mn_rng_normal(MnRng *r);   // N(0, 1), Box-Muller

// "s" unless n is 1, for counts in messages: "%d step%s", n, plural_s(n).
static inline const char *plural_s(long long n) { return n == 1 ? "" : "s"; }
static inline int mn_min(int a, int b) { return a < b ? a : b; }
static inline int mn_max(int a, int b) { return a > b ? a : b; }

#endif
