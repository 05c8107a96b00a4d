// Data parallelism on GPUs: `mesanet train --backend cuda --gpus 2` (and `eval --gpus 2`) against one GPU.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../test.h"
#include "../tmpdir.h"
#include "../toy.h"

int cuda_device_count(void);

// Two GPUs with 2 sequences each take the steps of one GPU with 4 (NCCL sums the gradients), and
// score its sequences alike.
TEST(cuda_data_parallel_matches_one_gpu) {
    int devices = cuda_device_count();
    if (devices < 2) {
        test_note("not run: this machine has %d GPU(s), the test needs 2", devices);
        return;
    }
    TmpDir t;
    tmp_make(&t);
    char data[256], args[1024], log[256];
    snprintf(data, sizeof data, "%s/data", t.dir);
    snprintf(log, sizeof log, "%s/log.txt", t.dir);
    write_toy_shards(data);
    const char *common = "--backend cuda --config tiny --seq 64 --steps 8 --warmup 2 --lr 1e-2 --eval-every 4 "
                         "--eval-batches 2 --save-every 0 --cg-steps 20 --no-resume";
    snprintf(args, sizeof args, "train %s --data %s --out %s/a --batch 4", common, data, t.dir);
    CHECK(run_tool(args, log) == 0, "one GPU: failed (see %s)", log);
    snprintf(args, sizeof args, "train %s --data %s --out %s/b --batch 2 --gpus 2", common, data, t.dir);
    CHECK(run_tool(args, log) == 0, "two GPUs: failed (see %s)", log);
    size_t n;
    unsigned char *text = read_bytes(log, &n);
    CHECK(text && strstr((char *)text, "NCCL"), "the two-GPU run did not sum through NCCL: %s", text ? (char *)text : "");
    free(text);
    double la[16], lb[16];
    char dir[256];
    snprintf(dir, sizeof dir, "%s/a", t.dir);
    int na = read_losses(dir, la, 16);
    snprintf(dir, sizeof dir, "%s/b", t.dir);
    int nb = read_losses(dir, lb, 16);
    CHECK(na == 8 && nb == 8, "loss rows: %d and %d, expected 8", na, nb);
    // Tolerance: a product over 64 rows and one over 128 may accumulate in another order, and a
    // bf16 activation then rounds the other way now and then (2^-8 relative); the mean loss moves
    // by far less than that. Ranks that trained on the same rows, or did not sum, are off by 1e-2.
    double worst = 0;
    for (int i = 0; i < na && i < nb; i++) worst = fmax(worst, fabs(la[i] - lb[i]) / fabs(la[i]));
    test_note("losses, one GPU vs two: step 1 %.6f / %.6f, step 8 %.6f / %.6f; largest difference %.2g", la[0], lb[0],
              la[na - 1], lb[nb - 1], worst);
    CHECK(worst <= 2e-3, "two GPUs' losses differ from one GPU's by %.3g (relative) > 2e-3", worst);
    // Evaluation of the trained model split over the two GPUs (2 of every 4 sequences each) against
    // one GPU: the NLL by position, within the same bf16 tolerance.
    const char *ev = "--backend cuda --seq 64 --batches 3 --cg-steps 20";
    snprintf(args, sizeof args, "eval --model %s/a --data %s %s --batch 4 --out %s/e1", t.dir, data, ev, t.dir);
    CHECK(run_tool(args, log) == 0, "eval, one GPU: failed (see %s)", log);
    snprintf(args, sizeof args, "eval --model %s/a --data %s %s --batch 2 --gpus 2 --out %s/e2", t.dir, data, ev, t.dir);
    CHECK(run_tool(args, log) == 0, "eval, two GPUs: failed (see %s)", log);
    double pa[64], pb[64];
    char p1[512], p2[512];
    snprintf(p1, sizeof p1, "%s/e1/nll_by_position.csv", t.dir);
    snprintf(p2, sizeof p2, "%s/e2/nll_by_position.csv", t.dir);
    int ma = read_second_column(p1, pa, 64), mb = read_second_column(p2, pb, 64);
    CHECK(ma == 64 && mb == 64, "eval positions: %d and %d, expected 64", ma, mb);
    worst = 0;
    for (int i = 0; i < ma && i < mb; i++) worst = fmax(worst, fabs(pa[i] - pb[i]) / fabs(pa[i]));
    test_note("eval NLL by position, one GPU vs two: largest difference %.2g", worst);
    CHECK(worst <= 2e-3, "two GPUs' NLL by position differs from one GPU's by %.3g (relative) > 2e-3", worst);
    tmp_remove(&t);
}

// On a machine without a GPU or its driver, --backend cuda says so plainly (CUDA's own text, which
// asks for a driver update, only as the detail), before any work.
TEST(cuda_backend_absent_says_so) {
    int devices = cuda_device_count();
    if (devices > 0) {
        test_note("not run: this machine has %d GPU(s); the test is for one without", devices);
        return;
    }
    TmpDir t;
    tmp_make(&t);
    char data[256], args[1024], log[256];
    snprintf(data, sizeof data, "%s/data", t.dir);
    snprintf(log, sizeof log, "%s/log.txt", t.dir);
    write_toy_shards(data);
    snprintf(args, sizeof args, "train --backend cuda --config tiny --data %s --out %s/run --steps 1", data, t.dir);
    CHECK(run_tool(args, log) == 1, "train --backend cuda without a GPU: not refused (see %s)", log);
    size_t n;
    char *text = (char *)read_bytes(log, &n);
    if (text) text[n] = 0;
    CHECK(text && strstr(text, "backend 'cuda': no CUDA GPU or driver found on this machine (CUDA: "),
          "the refusal does not say plainly that there is no GPU:\n%s", text ? text : "");
    free(text);
    tmp_remove(&t);
}
