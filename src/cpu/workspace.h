// Scratch memory of the CPU kernels, kept between calls: large blocks from
// malloc come fresh from the kernel every time, and zeroing their pages cost
// 7% of a training step before this buffer existed.
#ifndef MN_WORKSPACE_H
#define MN_WORKSPACE_H

#include <stddef.h>

// A buffer of at least `floats` floats, owned by the calling thread and valid
// until its next call (contents undefined). NULL and an error if out of memory.
float *cpu_workspace(size_t floats);
// Frees the buffers of the calling thread and of the OpenMP threads of its team: for a thread that
// ends before the process does (synth --parallel's, through backend_close), whose buffers would
// otherwise be lost with it.
void cpu_workspace_release(void);

#endif
