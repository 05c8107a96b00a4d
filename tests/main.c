// Runs every registered test whose name contains argv[1] (all without one); --list prints the
// names instead. A filter that matches no test is an error, so a misspelt name never passes.
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "../src/core/common.h"
#include "../src/cpu/runtime.h"
#include "test.h"

#define MAX_TESTS 1024
static struct {
    const char *name;
    TestFn fn;
} tests[MAX_TESTS];
static int ntests;
static int current_failed;

void test_register(const char *name, TestFn fn) {
    if (ntests == MAX_TESTS) die("too many tests");
    tests[ntests].name = name;
    tests[ntests].fn = fn;
    ntests++;
}

void test_fail(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("    FAILED at %s:%d: ", file, line);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    current_failed = 1;
}

void test_note(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("    ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
}

double rel_err64(const double *a, const double *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = a[i] - b[i];
        if (!isfinite(a[i])) return INFINITY;
        num += d * d;
        den += b[i] * b[i];
    }
    return sqrt(num) / fmax(sqrt(den), 1e-300);
}

double rel_err32(const float *a, const double *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        if (!isfinite(a[i])) return INFINITY;
        num += d * d;
        den += b[i] * b[i];
    }
    return sqrt(num) / fmax(sqrt(den), 1e-300);
}

double rel_err_ff(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        if (!isfinite(a[i])) return INFINITY;
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return sqrt(num) / fmax(sqrt(den), 1e-300);
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void usage(FILE *f) {
    fprintf(f, "usage: run_tests [--list] [SUBSTRING]\n"
               "  runs every test whose name contains SUBSTRING (all without one), in name order;\n"
               "  ends with \"N passed, M failed\"; --list prints the names that would run\n");
}

int main(int argc, char **argv) {
    cpu_runtime_setup(argv);
    int list = 0;
    const char *filter = "";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--list")) {
            list = 1;
        } else if (!strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (argv[i][0] == '-' || *filter) {
            usage(stderr);
            return 2;
        } else {
            filter = argv[i];
        }
    }
    qsort(tests, (size_t)ntests, sizeof tests[0], by_name);
    int matched = 0;
    for (int i = 0; i < ntests; i++) matched += strstr(tests[i].name, filter) != NULL;
    if (!matched) {
        fprintf(stderr, "run_tests: no test name contains \"%s\" (run_tests --list names them all)\n", filter);
        return 2;
    }
    if (list) {
        for (int i = 0; i < ntests; i++)
            if (strstr(tests[i].name, filter)) printf("%s\n", tests[i].name);
        return 0;
    }
    int passed = 0, failed = 0;
    double t_all = mn_now();
    for (int i = 0; i < ntests; i++) {
        if (!strstr(tests[i].name, filter)) continue;
        printf("%s\n", tests[i].name);
        fflush(stdout);
        current_failed = 0;
        double t = mn_now();
        tests[i].fn();
        printf("  %s %s (%.2f s)\n", current_failed ? "FAIL" : "ok", tests[i].name, mn_now() - t);
        fflush(stdout);
        if (current_failed)
            failed++;
        else
            passed++;
    }
    printf("\n%d passed, %d failed (%.1f s)\n", passed, failed, mn_now() - t_all);
    return failed ? 1 : 0;
}
