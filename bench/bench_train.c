/*
 * `mesanet bench train`: training throughput of a config on random tokens:
 * tokens/s, peak memory, and the share of time in the mixers (and in their
 * core, the Mesa solve) against the rest of the model, beside the sgemm rate
 * of the same run. Model flops per token: 6 x (parameters outside the
 * embedding lookup) for the dense products; the Mesa solve comes on top.
 * With --gpus N, data-parallel as `mesanet train --gpus N`: every rank runs
 * the batch, the gradients are summed, and the figures are for all ranks
 * (memory and the product rate: per GPU).
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>

#include "bench.h"
#include "core/common.h"
#include "model/model.h"
#include "tools/commands.h"
#include "train/optim.h"

int bench_train(int argc, char **argv) {
    const char *config = "demo", *backend = "cpu", *precision = "auto";
    int batch = 16, seq = 256, steps = 10, vocab = 4096, cg = 0, gpus = 1, serial = 0;
    Option opts[] = {
        {"config", OPT_STRING, &config, "preset or JSON config"},
        {"backend", OPT_STRING, &backend, "cpu or cuda"},
        {"batch", OPT_INT, &batch, "sequences per step", 1, 65536},
        {"seq", OPT_INT, &seq, "tokens per sequence", 1, 1 << 24},
        {"steps", OPT_INT, &steps, "timed steps (after 2 warm-up steps)", 1, 1e6},
        {"vocab", OPT_INT, &vocab, "vocabulary size when the config leaves it to the data", 1, 1 << 24},
        {"cg-steps", OPT_INT, &cg, "CG steps (0: the config's)", 0, 10000},
        {"gpus", OPT_INT, &gpus, "data-parallel over this many GPUs, --batch sequences each", 1, 256},
        {"serial-sums", OPT_FLAG, &serial, "sum the gradients after the backward pass instead of beside it"},
        {"lin-precision", OPT_STRING, &precision, LIN_PRECISION_HELP},
    };
    int st = parse_args(argc, argv, "[options]", opts, sizeof opts / sizeof opts[0], NULL, NULL, 0);
    if (st) return st == 2 ? 0 : 1;
    Group g;
    int code;
    if (!ranks_begin("bench train", gpus, &g, &code)) return code;
    const MnPrecision prec = lin_precision_arg("bench train", precision);
    Model *m = bench_model(config, backend, vocab, cg);
    m->solver.precision = prec;
    const Backend *be = m->be;
    if (group_connect(&g, be)) die("%s", mn_last_error());
    const ModelConfig c = m->cfg;
    AdamW o = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .clip = 1};
    if (adamw_init(&o, m)) die("%s", mn_last_error());
    size_t N = (size_t)batch * seq;
    int32_t *tok = xcalloc(N, 4), *tgt = xcalloc(N, 4);
    MnRng r;
    mn_rng_seed(&r, 7 + (uint64_t)g.rank);
    for (size_t i = 0; i < N; i++) {
        tok[i] = (int32_t)(mn_rng_u64(&r) % (uint64_t)c.vocab_size);
        tgt[i] = (int32_t)(mn_rng_u64(&r) % (uint64_t)c.vocab_size);
    }
    int gpu = be->device_mem_used != NULL;
    // the matrix-product ceiling of the same device: sgemm on the CPU, a bf16 product on the GPU
    double ceiling = gpu ? 1e3 * bench_gemm_tflops(be, 8192) : bench_sgemm_gflops(2048, 3);
    // steps + 2 warm-up steps timed end to end; then 2 profiled steps (each mixer and core call
    // waits for the device, so their shares are true) for the breakdown
    double t_total = 0, t_prof = 0, t_mixer = 0, t_core = 0;
    size_t peak = 0;
    for (int s = 0; s < steps + 4; s++) {
        m->profile = s >= steps + 2;
        m->mixer_seconds = 0;
        for (int l = 0; l < c.n_layers; l++) m->mixers[l].core_seconds = 0;
        double t0 = mn_now();
        if (!serial) group_grads_begin(&g, m);
        if (model_zero_grad(m) || model_forward(m, tok, tgt, batch, seq, 1.0f / (float)N, NULL) || model_backward(m) ||
            group_grads_end(&g, m) || adamw_step(&o, m, 1e-4f, NULL) || be->sync(be))
            die("%s", mn_last_error());
        double dt = mn_now() - t0;
        if (gpu && be->device_mem_used(be) > peak) peak = be->device_mem_used(be);
        if (s < 2) continue;  // warm-up
        if (!m->profile) {
            t_total += dt;
            continue;
        }
        t_prof += dt;
        t_mixer += m->mixer_seconds;
        for (int l = 0; l < c.n_layers; l++) t_core += m->mixers[l].core_seconds;
    }
    double cg_mean;
    if (model_take_cg_steps(m, &cg_mean)) die("%s", mn_last_error());
    N *= (size_t)g.size;  // from here on, the tokens of all ranks
    if (g.rank > 0) goto done;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    size_t embed = (size_t)c.vocab_size * c.dim;
    double dense_flops = 6.0 * (double)(m->count - (c.tie_embeddings ? 0 : embed)) * (double)N * steps;
    printf("training %s (%zu parameters) on %s, %d threads, batch %d x %d tokens", config, m->count, be->name,
           omp_get_max_threads(), batch * g.size, seq);
    if (model_uses_cg(&c)) printf(", CG steps %d (mean used %.1f)", c.cg_steps, cg_mean);
    printf("\n");
    if (g.size > 1)
        printf("  data-parallel: %d ranks of %d sequences, gradients summed %s, %s\n", g.size, batch,
               g.be ? "by NCCL" : "through the host", serial || !g.be ? "after the backward pass" : "beside the backward pass");
    if (gpu)
        printf("  %.0f tokens/s, %.1f ms/step, device memory in use %.2f GB\n", (double)N * steps / t_total,
               1e3 * t_total / steps, (double)peak / 1e9);
    else
        printf("  %.0f tokens/s, %.1f ms/step, peak memory %.0f MB\n", (double)N * steps / t_total, 1e3 * t_total / steps,
               (double)ru.ru_maxrss / 1024);
    printf("  time in the mixers %.1f%% (their core, %s: %.1f%%), rest of the model and optimizer %.1f%%\n",
           100 * t_mixer / t_prof, model_uses_cg(&c) ? "the Mesa solve" : "the sequence mixing", 100 * t_core / t_prof,
           100 * (1 - t_mixer / t_prof));
    printf("  dense products (6 x parameters x tokens): %.1f GFLOP/s = %.1f%% of the %s (%.0f GFLOP/s in this run)\n",
           dense_flops / t_total / 1e9, 100 * dense_flops / t_total / 1e9 / ceiling / g.size,
           gpu ? "bf16 matrix-product rate, i.e. the MFU" : "sgemm rate", ceiling);
done:
    free(tok);
    free(tgt);
    group_close(&g);
    adamw_free(&o, m);
    model_free(m);
    return 0;
}
