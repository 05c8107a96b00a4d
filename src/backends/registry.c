// Backend lookup by name (registry.h).
#include "registry.h"

#include <string.h>

#include "core/common.h"
#include "cpu/workspace.h"

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

const Backend *backend_open(const char *name, int device) {
    if (!strcmp(name, "cuda")) {
#ifdef MN_HAVE_CUDA
        return backend_cuda_open(device);
#else
        return backend_by_name(name);  // (the error of a build without CUDA)
#endif
    }
    const Backend *be = backend_by_name(name);
    if (be && device != 0) {
        mn_error(MN_ERR_ARG, "backend '%s': device %d, but it has one (0)", name, device);
        return NULL;
    }
    return be;
}

void backend_close(const Backend *be) {
    if (be && !strcmp(be->name, "cpu")) cpu_workspace_release();  // the calling thread's scratch
#ifdef MN_HAVE_CUDA
    if (be && !strcmp(be->name, "cuda") && be != backend_cuda()) backend_cuda_close((Backend *)be);
#endif
}
