// Every mixer's model trains to the same numbers as it did before its block became data (the
// mixer declares what follows it; model/ffn.c runs it): the float64 reference's losses of a few
// steps of each architecture, compared with tests/data/blocks_golden.txt, which the model code as
// it was before that change wrote (MN_GOLDEN_WRITE=FILE writes the file instead of checking it).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "test.h"
#include "tmpdir.h"
#include "toy.h"
#include "train/trainer.h"

// The float64 reference is plain loops and libm in double, with no threads: on the machine that
// wrote the file the same bits; on another CPU the compiler's vector code (-march=native) and the
// contraction of products into FMAs round a few operations otherwise (measured 2.6e-15 relative on an
// Intel Xeon with AVX-512), far below what any change to a model's computation moves (1e-4 and up).
#define GOLDEN_TOL 1e-12

enum { STEPS = 3 };

static const char *const cases[][2] = {
    {"mesa", "{\"preset\":\"tiny\",\"mixer\":\"mesa\"}"},
    {"mesa-fla", "{\"preset\":\"tiny\",\"mixer\":\"mesa\",\"arch\":\"fla\",\"shared_onorm\":true,\"embed_scale\":false,"
                 "\"logit_cap\":0,\"tie_embeddings\":false}"},
    {"mamba2", "{\"preset\":\"tiny\",\"mixer\":\"mamba2\"}"},
    {"gla", "{\"preset\":\"tiny\",\"mixer\":\"gla\",\"output_gate\":true}"},
    {"deltanet", "{\"preset\":\"tiny\",\"mixer\":\"deltanet\",\"neg_eigen\":true}"},
    {"gdn", "{\"preset\":\"tiny\",\"mixer\":\"gdn\"}"},
    {"gdn-paper", "{\"preset\":\"tiny\",\"mixer\":\"gdn-paper\",\"output_gate\":true}"},
    {"deltanet-paper", "{\"preset\":\"tiny\",\"mixer\":\"deltanet-paper\"}"},
    {"mha", "{\"preset\":\"tiny\",\"mixer\":\"mha\",\"n_kv_heads\":1}"},
    {"swa", "{\"preset\":\"tiny\",\"mixer\":\"swa\",\"window\":8}"},
    {"gdn,mha,mesa", "{\"preset\":\"tiny\",\"mixer\":\"gdn,mha,mesa\",\"n_layers\":3}"},
    {"llama", "{\"preset\":\"tiny\",\"mixer\":\"mha\",\"arch\":\"llama\",\"embed_scale\":false,\"logit_cap\":0}"},
    {"autoencoder", "{\"preset\":\"tiny\",\"mixer\":\"gdn\",\"head\":\"autoencoder\",\"tie_embeddings\":false,"
                    "\"logit_cap\":0}"},
};
enum { NCASES = sizeof cases / sizeof cases[0] };

// The losses of STEPS steps of the case on the reference backend, into loss; 0 on success.
static int run_case(const char *dir, const char *data, int i, double *loss) {
    char cfg[512], out[512];
    snprintf(cfg, sizeof cfg, "%s/case%d.json", dir, i);
    snprintf(out, sizeof out, "%s/run%d", dir, i);
    FILE *f = fopen(cfg, "w");
    if (!f) return -1;
    fputs(cases[i][1], f);
    fclose(f);
    TrainOptions o = toy_train_options(data, out);
    o.config = cfg;
    o.backend = "ref";
    o.steps = STEPS;
    o.warmup = 1;
    o.eval_every = 100;  // (validation at the end only: not part of the losses compared)
    o.cg_steps = 0;      // the config's (30) where a block solves with CG
    FILE *devnull = fopen("/dev/null", "w");
    int st = train_run(&o, devnull);
    fclose(devnull);
    if (st) return st;
    return read_losses(out, loss, STEPS) == STEPS ? 0 : -1;
}

TEST(golden_blocks_train_as_before) {
    TmpDir t;
    tmp_make(&t);
    char data[300];
    snprintf(data, sizeof data, "%s/data", t.dir);
    write_toy_shards(data);
    const char *write = getenv("MN_GOLDEN_WRITE");
    FILE *golden = fopen(write ? write : "tests/data/blocks_golden.txt", write ? "w" : "r");
    CHECK(golden != NULL, "cannot open %s (run the suite from the repository's root)",
          write ? write : "tests/data/blocks_golden.txt");
    if (!golden) {
        tmp_remove(&t);
        return;
    }
    if (write) fprintf(golden, "# case, then the float64 reference's loss at steps 1..%d (C99 hex floats)\n", STEPS);
    char line[512];
    if (!write && !fgets(line, sizeof line, golden)) line[0] = 0;  // (the header)
    double worst = 0;
    for (int i = 0; i < NCASES; i++) {
        double loss[STEPS];
        if (run_case(t.dir, data, i, loss)) {
            CHECK(0, "%s: %s", cases[i][0], mn_last_error());
            continue;
        }
        if (write) {
            fprintf(golden, "%s", cases[i][0]);
            for (int s = 0; s < STEPS; s++) fprintf(golden, " %a", loss[s]);
            fprintf(golden, "\n");
            continue;
        }
        char name[64];
        double want[STEPS];
        int got = fgets(line, sizeof line, golden) ? sscanf(line, "%63s %la %la %la", name, &want[0], &want[1], &want[2]) : 0;
        if (got != 1 + STEPS || strcmp(name, cases[i][0])) {
            CHECK(0, "tests/data/blocks_golden.txt: line %d is not case %s's", i + 2, cases[i][0]);
            continue;
        }
        for (int s = 0; s < STEPS; s++) {
            double e = fabs(loss[s] - want[s]) / fabs(want[s]);
            worst = e > worst ? e : worst;
            CHECK(e <= GOLDEN_TOL, "%s: step %d loss %.17g, before %.17g (rel %.3g)", cases[i][0], s + 1, loss[s], want[s],
                  e);
        }
    }
    if (!write) test_note("%d architectures, %d steps each: largest relative difference %.3g (tolerance %g)", NCASES,
                          STEPS, worst, GOLDEN_TOL);
    fclose(golden);
    tmp_remove(&t);
}
