/*
 * safetensors files (the Hugging Face format), for checkpoints and for
 * exchanging weights with PyTorch.
 *
 * Layout: an 8-byte little-endian header length N, N bytes of UTF-8 JSON,
 * then the data section:
 *
 *     {"__metadata__": {"k": "v", ...},
 *      "name": {"dtype": "F32", "shape": [a, b], "data_offsets": [begin, end]}, ...}
 *
 * data_offsets are byte offsets into the data section, end exclusive. The
 * header is padded with spaces to a multiple of 8 bytes so that the data
 * section starts 8-aligned. Numbers are little-endian, row-major.
 *
 * st_open validates everything before handing out a tensor (see the list in
 * safetensors.c), so that a corrupt or truncated checkpoint is refused with a
 * message naming the file and the problem, never read out of bounds.
 */
#ifndef MN_SAFETENSORS_H
#define MN_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define ST_MAX_DIMS 8
// A larger header is taken for corruption rather than allocated.
#define ST_MAX_HEADER (100u * 1000u * 1000u)

typedef enum { ST_F32, ST_F16, ST_BF16, ST_F64, ST_I32, ST_I64 } StDtype;

typedef struct {
    const char *name;              // unique, non-empty, not "__metadata__"
    StDtype dtype;
    int ndim;                      // 0 (a scalar) to ST_MAX_DIMS
    int64_t shape[ST_MAX_DIMS];    // each >= 0; a 0 makes an empty tensor
    const void *data;              // product(shape) elements in dtype's layout:
                                   // F32 float, F64 double, F16/BF16 uint16_t,
                                   // I32 int32_t, I64 int64_t; may be NULL if empty
} StTensor;

typedef struct {
    const char *key, *value;  // stored as JSON strings in "__metadata__"
} StMeta;

// Bytes per element; 0 for a value outside the enum.
size_t st_dtype_size(StDtype dtype);

// Writes the tensors, in the given order and contiguously, and the metadata
// (keys unique and non-empty). Atomic: the file goes to path + ".tmp", is
// fsynced and renamed over path, so a crash never leaves a half-written file
// at path.
int st_write(const char *path, const StTensor *tensors, int n, const StMeta *meta, int nmeta);

// An opened file: header parsed and validated, data section in memory.
typedef struct StFile StFile;

int st_open(const char *path, StFile **out);
void st_close(StFile *f);  // NULL is fine

int st_count(const StFile *f);
// Tensor i in header order (0 <= i < st_count); any output may be NULL.
int st_info(const StFile *f, int i, const char **name, StDtype *dtype, int *ndim, const int64_t **shape);
// The index of tensor `name`, or -1.
int st_find(const StFile *f, const char *name);
// Tensor i's raw bytes in the file's layout (nbytes may be NULL); NULL if i
// is out of range. Not necessarily aligned to the element size.
const void *st_data(const StFile *f, int i, size_t *nbytes);

// The metadata value of `key`, or NULL if absent.
const char *st_meta(const StFile *f, const char *key);
int st_meta_count(const StFile *f);
// Metadata entry i in header order.
int st_meta_at(const StFile *f, int i, const char **key, const char **value);

// Reads tensor `name` as float32 into out[0..n), converting from F32, F16,
// BF16 or F64. Fails with a message naming the file and the tensor if it is
// absent, not a float dtype, if its element count differs from n, or (when
// shape != NULL) if its shape differs from shape[0..ndim).
int st_read_f32(const StFile *f, const char *name, float *out, int64_t n, int ndim, const int64_t *shape);
// The same for integer tensors: I32 or I64 into int64.
int st_read_i64(const StFile *f, const char *name, int64_t *out, int64_t n, int ndim, const int64_t *shape);

#endif
