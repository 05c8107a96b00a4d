/*
 * Data parallelism: one process per GPU (a "rank"), each with a whole copy of
 * the model and its own slice of every batch; after each backward pass the
 * ranks sum their gradients, so that every copy takes the same optimizer step
 * and stays identical to the others.
 *
 * dist_launch runs the calling program `size` times as ranks 0..size-1 (a
 * fresh exec of /proc/self/exe with the same arguments, never a bare fork: a
 * forked child cannot use CUDA or GNU OpenMP once its parent has), gives rank r
 * the r-th visible GPU, and waits; when one rank fails it stops the others,
 * which would otherwise wait forever for the failed rank's gradients. The
 * ranks find each other through a small shared-memory region whose file
 * descriptor they inherit: a barrier, the backend's group identifier (NCCL's
 * unique id) and, for backends without a collective of their own (cpu, ref,
 * or cuda built without NCCL), an exchange area through which the host sums.
 */
#ifndef MN_DIST_H
#define MN_DIST_H

#include <stddef.h>

#include "core/backend.h"
#include "eval/eval.h"
#include "model/model.h"

typedef struct DistShared DistShared;

typedef struct {
    int rank, size;      // this process's rank, of size (size 1: alone, every call a no-op)
    DistShared *shared;  // the region the ranks share (NULL when alone)
    const Backend *be;   // the backend whose collective sums the buffers (NULL: through the host)
    double *host;        // [host_n] group_sum's copy of a backend buffer, kept between steps
    size_t host_n;
} Group;

// Runs this program as `size` ranks with the arguments argv (argv[0] is only a name: the
// program is /proc/self/exe) and waits for them; MN_OK when every rank exits with 0.
int dist_launch(int size, char *const argv[]);

// The device name (into out) that the r-th of several GPUs is: the r-th entry of
// CUDA_VISIBLE_DEVICES where it is set, else r; an error where the list has no r-th entry.
int dist_visible_device(int r, char *out, size_t cap);

// In a process started by dist_launch: g gets its rank (and checks that the launch was for
// `size` ranks); in any other process: rank 0 of 1.
int dist_join(Group *g, int size);

// Connects the group through be's own collective where it has one (NCCL on cuda); must
// come before the backend's buffers are summed, in every rank at the same point.
int group_connect(Group *g, const Backend *be);

// x[n] (a buffer of be, MEM_F32) = its sum over the ranks, the same on every rank.
int group_sum(Group *g, const Backend *be, void *x, size_t n);
// The model's gradients summed over the ranks. group_grads_begin (before the backward pass of a
// step's last micro-batch) has model_backward hand each block's gradients to the backend's
// collective as soon as they are final, so that the sums run beside the rest of the backward;
// group_grads_end (after it) orders later work after them, or, where the group sums through the
// host, sums all gradients then.
void group_grads_begin(Group *g, Model *m);
int group_grads_end(Group *g, Model *m);
// The same for host numbers (losses, flags): x[n] = the sum over the ranks, in rank order.
int group_sum_host(Group *g, double *x, size_t n);
// An evaluation's sums over the ranks, each rank having scored its own rows (eval_run_rows):
// every rank then holds the totals (the NLL, overall and by position), and as cg_steps the mean
// of the ranks' means.
int group_sum_eval(Group *g, EvalResult *r);
// Waits until every rank has called it.
void group_barrier(Group *g);

void group_close(Group *g);

#endif
