/*
 * Shared helpers of the libFuzzer harnesses (fuzz/fuzz_*.c).
 *
 * The parsers under test read files, so a harness writes its input into a
 * scratch directory of its own (under /dev/shm where there is one: fsync and
 * rename cost nothing there) and hands the path over. Inputs that stand for
 * several files (a tokenizer's two, a checkpoint's three) are cut at
 * FUZZ_SEP; a part that is missing means the file is absent.
 *
 * Everything here aborts on its own failures: a scratch file that cannot be
 * written is a broken fuzzing setup, not a finding.
 */
#ifndef MN_FUZZ_H
#define MN_FUZZ_H

#include <stddef.h>
#include <stdint.h>

// Cuts a multi-file input: "part0" FUZZ_SEP "part1" FUZZ_SEP "part2".
#define FUZZ_SEP "\n--mesanet-fuzz-file--\n"

// The harness's scratch directory, made on the first call (with the subdirectories
// checkpoints/step-00000003/ that fuzz_checkpoint.c writes into) and removed at exit.
const char *fuzz_dir(void);
// "<scratch dir>/<name>" into out[cap].
void fuzz_path(char *out, size_t cap, const char *name);
// Writes data[0..n) to <scratch dir>/<name>; returns the path in out.
void fuzz_write(char *out, size_t cap, const char *name, const void *data, size_t n);
// Removes <scratch dir>/<name> if present.
void fuzz_unlink(const char *name);

// Splits data at FUZZ_SEP into at most max parts; returns the count (>= 1).
int fuzz_split(const uint8_t *data, size_t n, const uint8_t **part, size_t *len, int max);

// One-time setup for every harness: one OpenMP / OpenBLAS thread (the
// parsers have no parallel parts, and thread pools only slow the runs down).
void fuzz_init(void);

#endif
