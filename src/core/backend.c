// Backend lookup by name, and the int32 ops of the backends whose memory is the host's.
#include <string.h>

#include "backend.h"
#include "common.h"

#ifdef MN_HAVE_CUDA
const Backend *backend_cuda(void);
#endif

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

int host_upload_i32(const Backend *be, void *dst, const int32_t *src, size_t n) {
    (void)be;
    memcpy(dst, src, n * sizeof(int32_t));
    return MN_OK;
}

int host_download_i32(const Backend *be, int32_t *dst, const void *src, size_t n) {
    (void)be;
    memcpy(dst, src, n * sizeof(int32_t));
    return MN_OK;
}

int host_tally_i32(const Backend *be, void *sum, void *count, const void *x, size_t n) {
    (void)be;
    int32_t *s = sum, *c = count;
    const int32_t *v = x;
    for (size_t i = 0; i < n; i++) {
        s[i] += v[i];
        c[i] += 1;
    }
    return MN_OK;
}
