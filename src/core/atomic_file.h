/*
 * Atomic file replacement: write everything to "<path>.tmp", flush it to the
 * disk, then rename it over <path>. rename() within one directory is atomic on
 * POSIX file systems, so a reader (or a run that crashes half-way through a
 * checkpoint) sees either the old file or the complete new one, never a
 * truncated mix.
 *
 *     AtomicFile af;
 *     MN_TRY(af_open(&af, path));
 *     fprintf(af.f, ...);                 // or fwrite
 *     return af_commit(&af);              // or af_abort(&af) on an error
 *
 * Individual fprintf calls need not be checked: a stdio stream's error flag is
 * sticky, and af_commit refuses to rename a stream that ever failed.
 */
#ifndef MN_ATOMIC_FILE_H
#define MN_ATOMIC_FILE_H

#include <stdio.h>

typedef struct {
    FILE *f;           // the temporary file; write here
    char *tmp;         // "<path>.tmp"
    const char *path;  // the destination (borrowed: must outlive the AtomicFile)
} AtomicFile;

// Opens "<path>.tmp" for writing; MN_ERR_IO naming it if that fails.
int af_open(AtomicFile *af, const char *path);
// Writes n bytes; MN_ERR_IO naming the file if fewer were written.
int af_write(AtomicFile *af, const void *data, size_t n);
// Flushes, fsyncs and closes the temporary, then renames it over path. On any
// failure the temporary is removed and path is left as it was.
int af_commit(AtomicFile *af);
// Closes and removes the temporary (after an error); path is untouched.
void af_abort(AtomicFile *af);

// Copies the file src to dst through an AtomicFile (dst is the old file or the whole copy).
// MN_ERR_IO naming the file and the system's reason on failure.
int af_copy(const char *src, const char *dst);

// Reads the whole regular file `path` into a new buffer (*text, NUL-terminated after its *n
// bytes; free it). MN_ERR_IO with the system's reason when it cannot be read, saying so when it
// is a directory or not a regular file; files larger than max_bytes are refused.
int file_read_all(const char *path, size_t max_bytes, char **text, size_t *n);

#endif
