/*
 * The backends this build has, by function or by name. The registry sits above the backends it
 * lists (src/ref, src/cpu, src/cuda), so that core/backend.h, the op table they implement, knows
 * none of them.
 */
#ifndef MN_REGISTRY_H
#define MN_REGISTRY_H

#include "core/backend.h"

const Backend *backend_ref(void);  // float64 reference: plain loops, the ground truth
const Backend *backend_cpu(void);  // float32 CPU: BLAS + OpenMP
#ifdef MN_HAVE_CUDA
const Backend *backend_cuda(void);  // the GPU (src/cuda): bf16 activations, float32 parameters
// A further instance of the GPU backend on `device`, with its own context (stream, cuBLAS handle,
// scratch, staging); it becomes the calling thread's current device. NULL + mn_error on failure.
Backend *backend_cuda_open(int device);
void backend_cuda_close(Backend *be);
#endif
// The backend named "cpu", "ref" or "cuda"; NULL + mn_error if unknown or not built.
const Backend *backend_by_name(const char *name);

// A backend for one thread of several that each train their own model at once (a sweep's runs):
// cuda: a fresh instance on `device` (its own stream, so that the instances' work runs side by
// side; the device becomes the calling thread's current one: use the instance from that thread);
// cpu, ref: the shared backend (whose state is per thread already), device 0 only. Close it with
// backend_close once its models are freed. NULL + mn_error naming the backend or device.
const Backend *backend_open(const char *name, int device);
void backend_close(const Backend *be);

#endif
