// The mesanet tool run as a subprocess, for the tests of its commands (test_cli.c, test_synth_run.c).
#ifndef MN_TESTS_TOOL_RUN_H
#define MN_TESTS_TOOL_RUN_H

#include "tmpdir.h"

typedef struct {
    int rc;           // exit status (-1: did not run or did not exit)
    char *out, *err;  // stdout and stderr, NUL-terminated (never NULL)
} ToolRun;

// Runs `mesanet <args>` (args go through the shell) with stdin from /dev/null, its output caught
// in td's directory; the binary is the one beside this test binary (the Makefile builds both into
// one directory). A missing binary fails the current test.
ToolRun tool_run(TmpDir *td, const char *args);
// The same with stderr into stdout, in the order written, as a terminal or `2>&1 | less` shows
// them (r.err is empty).
ToolRun tool_run_merged(TmpDir *td, const char *args);
void tool_run_free(ToolRun *r);
// The mesanet binary beside this test binary, or NULL where it is not built.
const char *tool_run_path(void);
// A file's whole text, NUL-terminated; an empty string where it cannot be read (free it).
char *read_text(const char *path);

#endif
