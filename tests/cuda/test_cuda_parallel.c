// Runs of a sweep trained at once on threads of one process (synth/parallel.h), each with its own
// backend instance and stream (on two GPUs where the process sees two or more), against the same
// runs trained alone on the default instance: the same final loss and test metric bit for bit.
// The mixers are those whose kernels sum in a fixed order (docs/cuda.md, determinism); Mesa's
// regulariser gradient is summed by atomics, so that two lone runs of it differ already, and 24
// steps of training amplify such differences unpredictably: no bound would be a fair test.
#include <math.h>
#include <string.h>

#include "backends/registry.h"
#include "core/common.h"
#include "synth/parallel.h"
#include "synth/run.h"
#include "../test.h"

int cuda_device_count(void);

enum { NRUN = 8 };

// MAD fuzzy recall at its baseline shape (128 tokens: the lin family's chunked kernels, whose
// sums have a fixed order) with the MAD model, 24 steps, a small training and test split.
static void setup_runs(const SynthTask **t, SynthSettings *s, SynthProtocol *p) {
    *t = synth_find("mad-fuzzy-recall");
    synth_grid(*t, 0, s, NULL, 0);
    s->n_train = 512, s->n_test = 128;
    synth_protocol(*t, 0, p);
    p->max_steps = 24, p->stop_acc = 0;
}

TEST(cuda_parallel_runs_match_alone) {
    const Backend *G = backend_cuda();
    if (!G) {
        test_fail(__FILE__, __LINE__, "no CUDA backend: %s", mn_last_error());
        return;
    }
    const SynthTask *t;
    SynthSettings s;
    SynthProtocol p;
    setup_runs(&t, &s, &p);
    static const char *mixers[NRUN / 2] = {"gdn", "mha", "hawk", "swa"};
    SynthJob jobs[NRUN];
    memset(jobs, 0, sizeof jobs);
    for (int i = 0; i < NRUN; i++) {
        jobs[i].task = t, jobs[i].settings = s, jobs[i].protocol = &p, jobs[i].mixer = mixers[i / 2];
        jobs[i].lr = i % 2 ? 1e-3f : 5e-4f, jobs[i].wd = 0.1f, jobs[i].seed = 3 + (uint64_t)i % 2;
    }
    SynthRunResult alone[2][NRUN];
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < NRUN; i++) {
            const SynthJob *j = &jobs[i];
            int st = synth_run(j->task, &j->settings, j->protocol, j->mixer, j->lr, j->wd, j->seed, G, NULL, &alone[k][i]);
            CHECK(!st, "%s alone: %s", j->mixer, mn_last_error());
            if (st) return;
        }
    int gpus = cuda_device_count() >= 2 ? 2 : 1, on[2] = {0, 0};
    CHECK(!synth_run_parallel(jobs, NRUN, NRUN, "cuda", gpus, 1, NULL), "%s", mn_last_error());
    for (int i = 0; i < NRUN; i++) {
        const SynthJob *j = &jobs[i];
        CHECK(!j->status, "%s at once: %s", j->mixer, j->error);
        if (j->status) continue;
        CHECK(j->device >= 0 && j->device < gpus, "run %d on device %d of %d", i, j->device, gpus);
        if (j->device >= 0 && j->device < 2) on[j->device]++;
        const SynthRunResult *a = &alone[0][i], *b = &alone[1][i], *r = &j->result;
        CHECK(r->steps == a->steps && r->steps == p.max_steps, "%s: %d steps at once, %d alone", j->mixer, r->steps,
              a->steps);
        double spread = fabs(a->final_loss - b->final_loss), d = fabs(r->final_loss - a->final_loss);
        double mspread = fabs(a->metric - b->metric), md = fabs(r->metric - a->metric);
        test_note("%-5s lr %g: loss %.9f alone, %.9f at once (device %d); alone twice differ by %.2g", j->mixer, j->lr,
                  a->final_loss, r->final_loss, j->device, spread);
        CHECK(spread == 0 && mspread == 0, "%s lr %g: two lone runs differ (loss by %.3g): not deterministic", j->mixer,
              j->lr, spread);
        CHECK(d == 0 && md == 0, "%s lr %g: at once loss %.17g metric %.17g, alone %.17g %.17g", j->mixer, j->lr,
              r->final_loss, r->metric, a->final_loss, a->metric);
    }
    // eight threads, one run each: thread k on device k mod gpus
    CHECK(on[0] == NRUN / gpus && (gpus == 1 || on[1] == NRUN / 2), "runs on device 0: %d, on device 1: %d", on[0], on[1]);
}
