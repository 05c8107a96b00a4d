/*
 * Memory on the GPU (the table's memory ops): allocation by kind, copies, host transfers, the
 * step counters' tally. A MEM_PARAM allocation holds n float32 master weights followed by their
 * bf16 copy (cuda_param_bf16), which every write refreshes.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_ops.cuh"

// The parameter allocations of every model of the process (on any device, from any thread: a
// sweep trains several at once), under param_lock.
enum { MAX_PARAM_ALLOCS = 1024 };
static pthread_mutex_t param_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    char *base;  // the float32 masters; the bf16 copy follows at base + shadow_offset(n)
    size_t n;
} param_allocs[MAX_PARAM_ALLOCS];
static int param_slots;  // slots ever used: the lookups scan these, not the whole table

static size_t shadow_offset(size_t n) { return (n * sizeof(float) + 255) & ~(size_t)255; }

const bf16 *cuda_param_bf16(const void *p) {
    const char *c = (const char *)p;
    const bf16 *found = NULL;
    pthread_mutex_lock(&param_lock);
    for (int i = 0; i < param_slots && !found; i++) {
        char *b = param_allocs[i].base;
        if (b && c >= b && c < b + param_allocs[i].n * sizeof(float))
            found = (const bf16 *)(b + shadow_offset(param_allocs[i].n)) + (c - b) / sizeof(float);
    }
    pthread_mutex_unlock(&param_lock);
    return found;
}

static size_t elem(MemKind k) { return k == MEM_ACT ? 2 : k == MEM_F64 ? 8 : 4; }

size_t g_elem_size(const Backend *be, MemKind k) { return elem(k); }

void *g_alloc(const Backend *be, size_t n, MemKind k) {
    size_t bytes = k == MEM_PARAM ? shadow_offset(n) + n * sizeof(bf16) : n * elem(k);
    void *p = NULL;
    cudaError_t e = cuda_malloc(&p, bytes ? bytes : 256);
    if (e != cudaSuccess) {
        mn_error(MN_ERR_NOMEM, "cudaMalloc of %zu bytes failed: %s", bytes, cudaGetErrorString(e));
        return NULL;
    }
    cudaMemsetAsync(p, 0, bytes ? bytes : 256, cuda_ctx(be)->stream);
    if (k == MEM_PARAM) {
        int slot = -1;
        pthread_mutex_lock(&param_lock);
        for (int i = 0; i < MAX_PARAM_ALLOCS && slot < 0; i++)
            if (!param_allocs[i].base) slot = i;
        if (slot >= 0) param_allocs[slot].base = (char *)p, param_allocs[slot].n = n;
        if (slot >= param_slots) param_slots = slot + 1;
        pthread_mutex_unlock(&param_lock);
        if (slot < 0) {
            cuda_free(p);
            mn_error(MN_ERR_NOMEM, "more than %d parameter allocations", MAX_PARAM_ALLOCS);
            return NULL;
        }
    }
    return p;
}

void g_free(const Backend *be, void *p) {
    pthread_mutex_lock(&param_lock);
    for (int i = 0; i < param_slots; i++)
        if (param_allocs[i].base == p) param_allocs[i].base = NULL;
    pthread_mutex_unlock(&param_lock);
    cudaStreamSynchronize(cuda_ctx(be)->stream);
    cuda_free(p);
}

__global__ void f32_to_bf16_kernel(bf16 *dst, const float *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16(src[i]);
}

// Refreshes the bf16 copy of n parameters starting at p.
static int refresh_shadow(const Backend *be, const void *p, size_t n) {
    const bf16 *sh = cuda_param_bf16(p);
    if (!sh || !n) return MN_OK;
    f32_to_bf16_kernel<<<grid_for(n, 256), 256, 0, cuda_ctx(be)->stream>>>((bf16 *)sh, (const float *)p, n);
    LAUNCH_CHECK();
    return MN_OK;
}

void g_zero(const Backend *be, void *p, size_t n, MemKind k) {
    cudaMemsetAsync(p, 0, n * elem(k), cuda_ctx(be)->stream);
    if (k == MEM_PARAM) refresh_shadow(be, p, n);
}

void g_copy(const Backend *be, void *dst, const void *src, size_t n, MemKind k) {
    cudaMemcpyAsync(dst, src, n * elem(k), cudaMemcpyDeviceToDevice, cuda_ctx(be)->stream);
    if (k == MEM_PARAM) refresh_shadow(be, dst, n);
}
// One 2D copy for all rows (parameters, whose bf16 shadow follows each copy, row by row).
void g_copy_rows(const Backend *be, void *dst, size_t ds, const void *src, size_t ss, size_t rows, size_t n,
                 MemKind k) {
    size_t e = elem(k);
    if (k == MEM_PARAM) {
        for (size_t r = 0; r < rows; r++) g_copy(be, (char *)dst + r * ds * e, (const char *)src + r * ss * e, n, k);
        return;
    }
    if (rows && n)
        cudaMemcpy2DAsync(dst, ds * e, src, ss * e, n * e, rows, cudaMemcpyDeviceToDevice, cuda_ctx(be)->stream);
}

// Uploads of at most this many bytes go through the staging ring (cuda_common.cuh); larger ones
// (weights) copy synchronously and keep no page-locked memory.
enum { STAGE_MAX = 4 << 20, STAGE_SLOTS = sizeof(((CudaCtx *)0)->stage) / sizeof(((CudaCtx *)0)->stage[0]) };

// The next staging slot of at least `bytes`, once the copy last queued from it has run; NULL +
// mn_error on failure. Refused while the stream is being recorded: a recorded copy would read the
// slot when replayed, long after it was reused.
static void *stage_slot(const Backend *be, size_t bytes, int *slot) {
    CudaCtx *c = cuda_ctx(be);
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(c->stream, &cap) != cudaSuccess || cap != cudaStreamCaptureStatusNone) {
        mn_error(MN_ERR_ARG, "cuda: an upload inside a recorded region (the recording would replay a stale host copy)");
        return NULL;
    }
    int i = c->stage_next;
    c->stage_next = (i + 1) % STAGE_SLOTS;
    cudaError_t e = cudaSuccess;
    if (c->stage[i].queued) e = cudaEventSynchronize(c->stage[i].done);
    c->stage[i].queued = 0;
    if (e == cudaSuccess && !c->stage[i].done) e = cudaEventCreateWithFlags(&c->stage[i].done, cudaEventDisableTiming);
    if (e == cudaSuccess && bytes > c->stage[i].bytes) {
        if (c->stage[i].p) cuda_free_host(c->stage[i].p);
        c->stage[i].p = NULL;
        c->stage[i].bytes = 0;
        e = cuda_malloc_host(&c->stage[i].p, bytes);
        if (e == cudaSuccess) c->stage[i].bytes = bytes;
    }
    if (e != cudaSuccess) {
        mn_error(MN_ERR_UNSUPPORTED, "cuda: upload staging: %s", cudaGetErrorString(e));
        return NULL;
    }
    *slot = i;
    return c->stage[i].p;
}

// Queues the copy of a filled slot to dst (no wait).
static int stage_send(const Backend *be, int slot, void *dst, size_t bytes) {
    CudaCtx *c = cuda_ctx(be);
    CU_TRY(cudaMemcpyAsync(dst, c->stage[slot].p, bytes, cudaMemcpyHostToDevice, c->stream));
    CU_TRY(cudaEventRecord(c->stage[slot].done, c->stream));
    c->stage[slot].queued = 1;
    return MN_OK;
}

// A copy between pageable host memory and the device, done when it returns: on the context's own
// stream, never the legacy default stream, which would wait for every stream of the device (the
// other runs a sweep trains beside this one, other threads' work).
static int copy_now(const Backend *be, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    cudaStream_t s = cuda_ctx(be)->stream;
    CU_TRY(cudaMemcpyAsync(dst, src, bytes, kind, s));
    CU_TRY(cudaStreamSynchronize(s));
    return MN_OK;
}

// A small upload of bytes as they are, queued; a large one synchronously.
static int upload_bytes(const Backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes > STAGE_MAX) return copy_now(be, dst, src, bytes, cudaMemcpyHostToDevice);
    int slot;
    void *h = stage_slot(be, bytes, &slot);
    if (!h) return MN_ERR_ARG;
    memcpy(h, src, bytes);
    return stage_send(be, slot, dst, bytes);
}

// Host <-> device with conversion through a host staging buffer.
int g_upload(const Backend *be, void *dst, const double *src, size_t n, MemKind k) {
    if (k == MEM_F64) return upload_bytes(be, dst, src, n * sizeof(double));
    size_t bytes = n * elem(k);
    void *h = malloc(bytes ? bytes : 1);
    if (!h) return mn_error(MN_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        if (k == MEM_ACT) ((bf16 *)h)[i] = __float2bfloat16((float)src[i]);
        else ((float *)h)[i] = (float)src[i];
    }
    int st = copy_now(be, dst, h, bytes, cudaMemcpyHostToDevice);
    free(h);
    MN_TRY(st);
    return k == MEM_PARAM ? refresh_shadow(be, dst, n) : MN_OK;
}

int g_upload_f32(const Backend *be, void *dst, const float *src, size_t n, MemKind k) {
    if (k == MEM_F64) {
        double *d = (double *)malloc(n * sizeof(double) + 1);
        if (!d) return mn_error(MN_ERR_NOMEM, "out of memory");
        for (size_t i = 0; i < n; i++) d[i] = src[i];
        int st = upload_bytes(be, dst, d, n * sizeof(double));
        free(d);
        return st;
    }
    if (k != MEM_ACT) {
        MN_TRY(upload_bytes(be, dst, src, n * sizeof(float)));
        return k == MEM_PARAM ? refresh_shadow(be, dst, n) : MN_OK;
    }
    if (n * sizeof(bf16) <= STAGE_MAX) {  // converted straight into the staging slot
        int slot;
        bf16 *s = (bf16 *)stage_slot(be, n * sizeof(bf16), &slot);
        if (!s) return MN_ERR_ARG;
        for (size_t i = 0; i < n; i++) s[i] = __float2bfloat16(src[i]);
        return stage_send(be, slot, dst, n * sizeof(bf16));
    }
    bf16 *h = (bf16 *)malloc(n * sizeof(bf16) + 1);
    if (!h) return mn_error(MN_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) h[i] = __float2bfloat16(src[i]);
    int st = copy_now(be, dst, h, n * sizeof(bf16), cudaMemcpyHostToDevice);
    free(h);
    return st;
}

int g_download_f32(const Backend *be, float *dst, const void *src, size_t n, MemKind k) {
    if (k == MEM_F64) {
        double *d = (double *)malloc(n * sizeof(double) + 1);
        if (!d) return mn_error(MN_ERR_NOMEM, "out of memory");
        int st = g_download(be, d, src, n, k);
        for (size_t i = 0; i < n && !st; i++) dst[i] = (float)d[i];
        free(d);
        return st;
    }
    if (k != MEM_ACT) return copy_now(be, dst, src, n * sizeof(float), cudaMemcpyDeviceToHost);
    // through page-locked staging: a pageable copy goes through the driver's own staging at a
    // fraction of the speed, which showed when decoding many sequences (their logits every step)
    CudaCtx *c = cuda_ctx(be);
    size_t bytes = n * sizeof(bf16);
    if (bytes > c->pinned_bytes) {
        if (c->pinned) cuda_free_host(c->pinned);
        c->pinned_bytes = 0;
        CU_TRY(cuda_malloc_host(&c->pinned, bytes));
        c->pinned_bytes = bytes;
    }
    CU_TRY(cudaMemcpyAsync(c->pinned, src, bytes, cudaMemcpyDeviceToHost, c->stream));
    CU_TRY(cudaStreamSynchronize(c->stream));
    // bf16 is the top half of a float: a shift, over all cores (a step's logits for 128
    // sequences are 6.4M values, memory-bound on one core)
    const uint16_t *h = (const uint16_t *)c->pinned;
#pragma omp parallel for if (n > (1u << 16))
    for (long i = 0; i < (long)n; i++) {
        uint32_t b = (uint32_t)h[i] << 16;
        memcpy(&dst[i], &b, sizeof b);
    }
    return MN_OK;
}

int g_download(const Backend *be, double *dst, const void *src, size_t n, MemKind k) {
    if (k == MEM_F64) return copy_now(be, dst, src, n * sizeof(double), cudaMemcpyDeviceToHost);
    float *h = (float *)malloc(n * sizeof(float) + 1);
    if (!h) return mn_error(MN_ERR_NOMEM, "out of memory");
    int s = g_download_f32(be, h, src, n, k);
    for (size_t i = 0; i < n && !s; i++) dst[i] = h[i];
    free(h);
    return s;
}

int g_upload_i32(const Backend *be, void *dst, const int32_t *src, size_t n) {
    return upload_bytes(be, dst, src, n * sizeof(int32_t));  // (src is the caller's again on return)
}

int g_download_i32(const Backend *be, int32_t *dst, const void *src, size_t n) {
    CU_TRY(cudaMemcpyAsync(dst, src, n * sizeof(int32_t), cudaMemcpyDeviceToHost, cuda_ctx(be)->stream));
    CU_TRY(cudaStreamSynchronize(cuda_ctx(be)->stream));
    return MN_OK;
}

__global__ void tally_i32_kernel(int32_t *sum, int32_t *count, const int32_t *x, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        sum[i] += x[i];
        count[i] += 1;
    }
}

int g_tally_i32(const Backend *be, void *sum, void *count, const void *x, size_t n) {
    tally_i32_kernel<<<grid_for(n, 256), 256, 0, cuda_ctx(be)->stream>>>((int32_t *)sum, (int32_t *)count,
                                                                        (const int32_t *)x, n);
    LAUNCH_CHECK();
    return MN_OK;
}

size_t g_mem_used(const Backend *be) {
    size_t free_b = 0, total = 0;
    if (cudaMemGetInfo(&free_b, &total) != cudaSuccess) return 0;
    return total - free_b;
}

// The device's free memory (cudaMemGetInfo); SIZE_MAX when it cannot be read.
size_t g_mem_available(const Backend *be) {
    size_t free_b = 0, total = 0;
    if (cudaMemGetInfo(&free_b, &total) != cudaSuccess) return SIZE_MAX;
    return free_b;
}

int g_sync(const Backend *be) {
    CU_TRY(cudaStreamSynchronize(cuda_ctx(be)->stream));
    if (cuda_ctx(be)->comm_stream) CU_TRY(cudaStreamSynchronize(cuda_ctx(be)->comm_stream));  // a group's sums
    CU_TRY(cudaGetLastError());
    return MN_OK;
}
