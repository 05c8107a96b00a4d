#include "workspace.h"

#include "core/common.h"

static _Thread_local float *buf;
static _Thread_local size_t cap;

float *cpu_workspace(size_t floats) {
    if (floats <= cap) return buf;
    size_t n = floats + floats / 4;  // some headroom: sizes vary a little between calls
    float *nb = mn_calloc(n, sizeof(float));
    if (!nb) return NULL;
    mn_free(buf);
    buf = nb;
    cap = n;
    return buf;
}

static void release_own(void) {
    mn_free(buf);
    buf = NULL;
    cap = 0;
}

void cpu_workspace_release(void) {
#pragma omp parallel
    release_own();  // (the calling thread is the team's first)
    release_own();
}
