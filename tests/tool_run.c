#include "tool_run.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"

const char *tool_run_path(void) {
    static char exe[1024];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 16);
    if (n <= 0) return NULL;
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (!slash) return NULL;
    strcpy(slash + 1, "mesanet");
    return access(exe, X_OK) ? NULL : exe;
}

char *read_text(const char *path) {
    size_t n;
    char *text = (char *)read_bytes(path, &n);
    if (!text) return strdup("");
    text[n] = 0;
    return text;
}

static ToolRun run_with(TmpDir *td, const char *args, int merged) {
    ToolRun r = {-1, NULL, NULL};
    const char *exe = tool_run_path();
    char out[128], err[128], cmd[8192];
    snprintf(out, sizeof out, "%s/stdout.txt", td->dir);
    snprintf(err, sizeof err, "%s/stderr.txt", td->dir);
    if (!exe) {
        CHECK(0, "the mesanet binary is not built beside this test binary");
    } else {
        if (merged) {
            snprintf(cmd, sizeof cmd, "%s %s </dev/null >%s 2>&1", exe, args, out);
            remove(err);
        } else {
            snprintf(cmd, sizeof cmd, "%s %s </dev/null >%s 2>%s", exe, args, out, err);
        }
        int st = system(cmd);
        r.rc = st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    }
    r.out = read_text(out);
    r.err = read_text(err);
    return r;
}

ToolRun tool_run(TmpDir *td, const char *args) { return run_with(td, args, 0); }

ToolRun tool_run_merged(TmpDir *td, const char *args) { return run_with(td, args, 1); }

void tool_run_free(ToolRun *r) {
    free(r->out);
    free(r->err);
}
