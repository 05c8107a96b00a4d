// Scratch directories and whole-file helpers for the tests (see tmpdir.h).
#define _XOPEN_SOURCE 700  // nftw
#include "tmpdir.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../src/core/common.h"

void tmp_make(TmpDir *t) {
    snprintf(t->dir, sizeof t->dir, "/tmp/mesanet-test-XXXXXX");
    if (!mkdtemp(t->dir)) die("cannot create a scratch directory under /tmp");
    t->path[0] = 0;
}

const char *tmp_path(TmpDir *t, const char *name) {
    int n = snprintf(t->path, sizeof t->path, "%s/%s", t->dir, name);
    if (n < 0 || (size_t)n >= sizeof t->path) die("scratch path too long: %s/%s", t->dir, name);
    return t->path;
}

// nftw's callback: removes each entry, the directories after their contents (FTW_DEPTH).
static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw) {
    (void)st, (void)type, (void)ftw;
    return remove(path) ? -1 : 0;
}

void tmp_remove(TmpDir *t) { nftw(t->dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f)) die("cannot write %s", path);
}

unsigned char *read_bytes(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    rewind(f);
    unsigned char *buf = len >= 0 ? malloc((size_t)len + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)len, f) != (size_t)len) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *n = buf ? (size_t)len : 0;
    return buf;
}
