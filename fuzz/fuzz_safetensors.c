/*
 * Fuzzes the safetensors reader (src/core/safetensors.h): checkpoints and
 * weights exchanged with PyTorch.
 *
 * Input: the bytes of a .safetensors file. A file that st_open accepts must be
 * safe to use as documented: every tensor is read through st_data (each byte
 * touched), st_read_f32 / st_read_i64 and the metadata accessors, names must
 * be found again by st_find, and writing the tensors back with st_write must
 * give a file that opens to the same names, dtypes, shapes, bytes and
 * metadata. Seeds: files st_write makes (fuzz/seeds.c: every dtype, scalars,
 * empty tensors, metadata, a tiny model's weights) and fuzz/edge/safetensors/.
 *
 *     make fuzz FUZZ_TARGETS=safetensors FUZZ_TIME=60
 */
#include <stdlib.h>
#include <string.h>

#include "core/safetensors.h"
#include "fuzz.h"

static int64_t numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    return n;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_init();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[512], path2[512];
    fuzz_write(path, sizeof path, "in.safetensors", data, size);
    StFile *f = NULL;
    if (st_open(path, &f)) return 0;
    int n = st_count(f), nm = st_meta_count(f);
    StTensor *t = calloc((size_t)n + 1, sizeof *t);
    StMeta *meta = calloc((size_t)nm + 1, sizeof *meta);
    if (!t || !meta) abort();
    unsigned sum = 0;
    for (int i = 0; i < n; i++) {
        const char *name;
        StDtype dt;
        int ndim;
        const int64_t *shape;
        if (st_info(f, i, &name, &dt, &ndim, &shape) || st_find(f, name) != i) abort();
        size_t nb = 0;
        const unsigned char *p = st_data(f, i, &nb);
        int64_t ne = numel(ndim, shape);
        if (nb != (size_t)ne * st_dtype_size(dt)) abort();
        for (size_t k = 0; k < nb; k++) sum += p[k];
        if (dt == ST_I32 || dt == ST_I64) {
            int64_t *out = malloc(sizeof(int64_t) * (size_t)(ne + 1));
            if (!out || st_read_i64(f, name, out, ne, ndim, shape)) abort();
            free(out);
        } else {
            float *out = malloc(sizeof(float) * (size_t)(ne + 1));
            if (!out || st_read_f32(f, name, out, ne, ndim, shape)) abort();
            free(out);
        }
        t[i] = (StTensor){.name = name, .dtype = dt, .ndim = ndim, .data = p};
        memcpy(t[i].shape, shape, sizeof(int64_t) * (size_t)ndim);
    }
    for (int i = 0; i < nm; i++) {
        const char *k, *v;
        if (st_meta_at(f, i, &k, &v) || st_meta(f, k) != v) abort();
        meta[i] = (StMeta){k, v};
    }
    // Written back, the tensors open again unchanged. (Names or values with a NUL inside read
    // back as C strings: the writer may refuse what then looks like an empty key.)
    fuzz_path(path2, sizeof path2, "out.safetensors");
    if (!st_write(path2, t, n, meta, nm)) {
        StFile *g = NULL;
        if (st_open(path2, &g) || st_count(g) != n || st_meta_count(g) != nm) abort();
        for (int i = 0; i < n; i++) {
            const char *name;
            StDtype dt;
            int ndim;
            const int64_t *shape;
            size_t nb;
            if (st_info(g, i, &name, &dt, &ndim, &shape) || strcmp(name, t[i].name) || dt != t[i].dtype ||
                ndim != t[i].ndim || memcmp(shape, t[i].shape, sizeof(int64_t) * (size_t)ndim))
                abort();
            const void *p = st_data(g, i, &nb);
            if (nb && memcmp(p, t[i].data, nb)) abort();
        }
        for (int i = 0; i < nm; i++) {
            const char *v = st_meta(g, meta[i].key);
            if (!v || strcmp(v, meta[i].value)) abort();
        }
        st_close(g);
    }
    st_close(f);
    free(t);
    free(meta);
    return (int)(sum & 0);
}
