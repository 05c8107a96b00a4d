// Shared helpers of the fuzz harnesses (fuzz.h).
#define _XOPEN_SOURCE 700  // nftw
#include "fuzz.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char scratch[256];

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw) {
    (void)st, (void)type, (void)ftw;
    return remove(path) ? -1 : 0;
}

static void remove_scratch(void) {
    if (scratch[0]) nftw(scratch, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

const char *fuzz_dir(void) {
    if (!scratch[0]) {
        const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        snprintf(scratch, sizeof scratch, "%s/mesanet-fuzz-XXXXXX", base);
        if (!mkdtemp(scratch)) {
            perror("fuzz: mkdtemp");
            abort();
        }
        atexit(remove_scratch);
        char sub[320];
        snprintf(sub, sizeof sub, "%s/checkpoints", scratch);
        if (mkdir(sub, 0777)) abort();
        snprintf(sub, sizeof sub, "%s/checkpoints/step-00000003", scratch);
        if (mkdir(sub, 0777)) abort();
    }
    return scratch;
}

void fuzz_path(char *out, size_t cap, const char *name) {
    int n = snprintf(out, cap, "%s/%s", fuzz_dir(), name);
    if (n < 0 || (size_t)n >= cap) abort();
}

void fuzz_write(char *out, size_t cap, const char *name, const void *data, size_t n) {
    fuzz_path(out, cap, name);
    FILE *f = fopen(out, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f)) {
        perror(out);
        abort();
    }
}

void fuzz_unlink(const char *name) {
    char p[512];
    fuzz_path(p, sizeof p, name);
    unlink(p);
}

int fuzz_split(const uint8_t *data, size_t n, const uint8_t **part, size_t *len, int max) {
    const size_t sl = sizeof FUZZ_SEP - 1;
    int k = 0;
    size_t start = 0;
    for (size_t i = 0; k < max - 1 && i + sl <= n; i++)
        if (!memcmp(data + i, FUZZ_SEP, sl)) {
            part[k] = data + start;
            len[k++] = i - start;
            start = i + sl;
            i = start - 1;
        }
    part[k] = data + start;
    len[k++] = n - start;
    return k;
}

void fuzz_init(void) {
    setenv("OMP_NUM_THREADS", "1", 0);
    setenv("OPENBLAS_NUM_THREADS", "1", 0);
}
