// Backend lookup by name (registry.h).
#include "registry.h"

#include <string.h>

#include "core/common.h"

const Backend *backend_by_name(const char *name) {
    if (!strcmp(name, "cpu")) return backend_cpu();
    if (!strcmp(name, "ref")) return backend_ref();
    if (!strcmp(name, "cuda")) {
#ifdef MN_HAVE_CUDA
        return backend_cuda();
#else
        mn_error(MN_ERR_UNSUPPORTED, "backend 'cuda': this build has no CUDA support (build with nvcc present, CUDA=1)");
        return NULL;
#endif
    }
    mn_error(MN_ERR_ARG, "unknown backend '%s' (cpu, ref, cuda)", name);
    return NULL;
}
