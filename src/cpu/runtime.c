// The OpenMP and BLAS settings a process starts with (runtime.h).
#include "runtime.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// OpenBLAS 0.3.21 does not recognise AMD Zen 4/5 and runs its AVX2 (Haswell) kernels there, at
// half the speed of its AVX-512 (SkylakeX) ones: 1 when OPENBLAS_CORETYPE should be set.
static int wants_avx512_blas(void) {
#ifdef OPENBLAS_VERSION
    if (getenv("OPENBLAS_CORETYPE")) return 0;
    const char *core = openblas_get_corename();
    if (!core || (strcmp(core, "Haswell") != 0 && strcmp(core, "haswell") != 0)) return 0;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
    return 0;
#endif
}

void cpu_runtime_setup(char **argv) {
    int changed = 0;
    // libgomp's threads spin at every barrier for a while before they sleep (its default): the
    // spinning takes the cores from any other process on the machine, and a sweep beside one
    // training ran 10-20x slower instead of about 2x. Passive threads sleep at once.
    if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT")) {
        setenv("OMP_WAIT_POLICY", "passive", 1);
        changed = 1;
    }
    if (wants_avx512_blas()) {
        setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);
        changed = 1;
    }
    if (changed) execv("/proc/self/exe", argv);  // returns only on failure: then carry on as we are
}
