/*
 * Data parallelism on the GPU: the backend's group ops on NCCL (train/dist.h
 * launches the ranks and hands NCCL's unique id from rank 0 to the others).
 * Built only where nccl.h is found (MN_HAVE_NCCL); without it the ranks sum
 * through the host.
 */
#ifdef MN_HAVE_NCCL
#include <nccl.h>
#include <string.h>

#include "cuda/cuda_common.cuh"

#define NCCL_TRY(call)                                                                                     \
    do {                                                                                                   \
        ncclResult_t r_ = (call);                                                                          \
        if (r_ != ncclSuccess)                                                                             \
            return mn_error(MN_ERR_UNSUPPORTED, "NCCL error at %s:%d: %s (%s)", __FILE__, __LINE__,        \
                            ncclGetErrorString(r_), ncclGetLastError(NULL));                              \
    } while (0)

static_assert(sizeof(ncclUniqueId) <= MN_GROUP_ID_BYTES, "MN_GROUP_ID_BYTES must hold NCCL's unique id");

int cuda_group_id(const Backend *be, void *id) {
    (void)be;
    ncclUniqueId u;
    NCCL_TRY(ncclGetUniqueId(&u));
    memcpy(id, &u, sizeof u);
    return MN_OK;
}

int cuda_group_join(const Backend *be, const void *id, int rank, int size) {
    CudaCtx *c = cuda_ctx(be);
    if (c->comm) return mn_error(MN_ERR_ARG, "cuda: this process has joined a group already");
    CU_TRY(cudaStreamCreateWithFlags(&c->comm_stream, cudaStreamNonBlocking));
    CU_TRY(cudaEventCreateWithFlags(&c->comm_after, cudaEventDisableTiming));
    CU_TRY(cudaEventCreateWithFlags(&c->comm_done, cudaEventDisableTiming));
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclComm_t comm;
    NCCL_TRY(ncclCommInitRank(&comm, size, u, rank));
    c->comm = comm;
    return MN_OK;
}

// On the group's stream, after the compute stream's work so far (the gradients being summed are
// final there), so that the sum runs beside the compute that follows.
int cuda_allreduce(const Backend *be, void *x, size_t n) {
    CudaCtx *c = cuda_ctx(be);
    if (!c->comm) return mn_error(MN_ERR_ARG, "cuda: allreduce outside a group (group_join first)");
    CU_TRY(cudaEventRecord(c->comm_after, c->stream));
    CU_TRY(cudaStreamWaitEvent(c->comm_stream, c->comm_after, 0));
    NCCL_TRY(ncclAllReduce(x, x, n, ncclFloat32, ncclSum, (ncclComm_t)c->comm, c->comm_stream));
    return MN_OK;
}

int cuda_allreduce_wait(const Backend *be) {
    CudaCtx *c = cuda_ctx(be);
    if (!c->comm) return MN_OK;
    CU_TRY(cudaEventRecord(c->comm_done, c->comm_stream));
    CU_TRY(cudaStreamWaitEvent(c->stream, c->comm_done, 0));
    return MN_OK;
}
#endif
