// Scratch directories for tests that write files: one fresh directory under
// /tmp per test, removed with everything in it at the end.
#ifndef MN_TEST_TMPDIR_H
#define MN_TEST_TMPDIR_H

#include <stddef.h>

typedef struct {
    char dir[64];    // "/tmp/mesanet-test-XXXXXX"
    char path[256];  // the last path tmp_path built
} TmpDir;

// Creates the directory (dies if it cannot: the test could not run at all).
void tmp_make(TmpDir *t);
// "<dir>/<name>" in t->path; valid until the next call.
const char *tmp_path(TmpDir *t, const char *name);
// Removes the directory with everything in it.
void tmp_remove(TmpDir *t);

// Writes n bytes to path (dies on failure); reads a whole file into a new
// buffer (NULL if it cannot), its size in *n.
void write_bytes(const char *path, const void *data, size_t n);
unsigned char *read_bytes(const char *path, size_t *n);

#endif
