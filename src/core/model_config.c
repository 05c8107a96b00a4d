// Parameter specs (model_config.h): the mixers and the model declare their tensors with param_add.
#include "model_config.h"

#include <stdio.h>
#include <string.h>

int param_add(ParamSpec *list, int *n, int max, const char *name, int ndim, const int64_t *shape, InitKind init,
              double value, int decay) {
    if (*n >= max) return -1;
    ParamSpec *p = &list[*n];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->block = -1;
    p->ndim = ndim;
    p->numel = 1;
    for (int i = 0; i < ndim; i++) {
        p->shape[i] = shape[i];
        p->numel *= (size_t)shape[i];
    }
    p->init = init;
    p->init_value = value;
    p->decay = decay;
    return (*n)++;
}
