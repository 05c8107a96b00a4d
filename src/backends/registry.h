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
#endif
// The backend named "cpu", "ref" or "cuda"; NULL + mn_error if unknown or not built.
const Backend *backend_by_name(const char *name);

#endif
