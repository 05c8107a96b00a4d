/*
 * A minimal test harness: TEST(name) { ... } registers a test; CHECK and the
 * rel_err helpers record failures with the measured numbers, so a failing run
 * says by how much it failed. `build/run_tests [substring]` runs them and ends
 * with "N passed, M failed".
 */
#ifndef MN_TEST_H
#define MN_TEST_H

#include <stddef.h>
#include <stdio.h>

typedef void (*TestFn)(void);
void test_register(const char *name, TestFn fn);

#define TEST(name)                                                                 \
    static void name(void);                                                        \
    __attribute__((constructor)) static void register_##name(void) { test_register(#name, name); } \
    static void name(void)

// Records a failure of the running test (the test goes on, to report all).
void test_fail(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
// Prints an informational line under the running test.
void test_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define CHECK(cond, ...)                                       \
    do {                                                       \
        if (!(cond)) test_fail(__FILE__, __LINE__, __VA_ARGS__); \
    } while (0)

// ||a - b|| / max(||b||, tiny) over n numbers (L2 norms), and the same for
// float against double.
double rel_err64(const double *a, const double *b, size_t n);
double rel_err32(const float *a, const double *b, size_t n);
double rel_err_ff(const float *a, const float *b, size_t n);

// Checks rel_err <= tol and notes the measured value.
#define CHECK_REL(what, err, tol)                                                         \
    do {                                                                                  \
        double e_ = (err);                                                                \
        if (!(e_ <= (tol))) test_fail(__FILE__, __LINE__, "%s: rel err %.3g > %.3g", what, e_, (double)(tol)); \
    } while (0)

#endif
