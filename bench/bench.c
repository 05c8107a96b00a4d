// `mesanet bench <what>`: dispatches to the benchmarks.
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "tools/commands.h"

int cmd_bench(int argc, char **argv) {
    static const Command benches[] = {
        {"mesa", bench_mesa, "the Mesa layer core: both forms, fixed steps and tolerance, forward and backward"},
        {"mesa-gpu", bench_mesa_gpu, "the Mesa core on the GPU at the anchors' shapes (see bench/fla_bench.py)"},
        {"train", bench_train, "training throughput, memory and time in the Mesa layer of a model config"},
    };
    size_t n = sizeof benches / sizeof benches[0];
    if (argc >= 2)
        for (size_t i = 0; i < n; i++)
            if (!strcmp(argv[1], benches[i].name)) return benches[i].run(argc - 1, argv + 1);
    FILE *f = argc >= 2 && strcmp(argv[1], "--help") ? stderr : stdout;
    fprintf(f, "usage: mesanet bench <what> [options]\n\n");
    for (size_t i = 0; i < n; i++) fprintf(f, "  %-8s %s\n", benches[i].name, benches[i].help);
    return f == stderr;
}
