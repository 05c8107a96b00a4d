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
