/*
 * `mesanet bench decode`: generation throughput of a model config with
 * random weights: after a short prefill, single-token steps for B sequences,
 * each step ending with the logits on the host (what sampling needs), as in
 * `mesanet generate`. On a backend with recorded launches (CUDA graphs) the
 * same steps run both ways, eagerly and replayed, so the ratio comes from one
 * run. bench/fla_model_bench.py --decode times fla's model the same way.
 */
#include <stdio.h>
#include <stdlib.h>

#include "bench.h"
#include "core/common.h"
#include "model/model.h"
#include "tools/commands.h"

typedef struct {
    double ms_per_step, steps_mean, download_ms;
} DecodeTiming;

// Median over `reps` runs of `tokens` steps, after a prefill of `prompt` tokens and 3 untimed
// steps (the first eager one loads the kernels, the second records the graph).
static DecodeTiming time_decode(Model *m, int B, int prompt, int tokens, int reps, float *logits) {
    int32_t *tok = xcalloc((size_t)B * prompt, sizeof(int32_t));
    MnRng r;
    mn_rng_seed(&r, 3);
    double *t = xcalloc((size_t)reps, sizeof(double)), steps_mean = 0;
    for (int rep = 0; rep < reps; rep++) {
        for (int i = 0; i < B * prompt; i++) tok[i] = (int32_t)(mn_rng_u64(&r) % (uint64_t)m->cfg.vocab_size);
        if (model_reset_state(m, B) || model_decode(m, tok, B, prompt, logits)) die("%s", mn_last_error());
        for (int s = 0; s < 3; s++)
            if (model_decode(m, tok, B, 1, logits)) die("%s", mn_last_error());
        double discard;
        if (model_take_cg_steps(m, &discard)) die("%s", mn_last_error());
        double t0 = mn_now();
        for (int s = 0; s < tokens; s++) {
            // the next tokens: any valid ids serve (the work does not depend on them)
            for (int b = 0; b < B; b++) tok[b] = (int32_t)((tok[b] + 7 * s + 1) % m->cfg.vocab_size);
            if (model_decode(m, tok, B, 1, logits)) die("%s", mn_last_error());
        }
        t[rep] = (mn_now() - t0) / tokens;
        if (model_take_cg_steps(m, &steps_mean)) die("%s", mn_last_error());
    }
    // the share of a step that is the logits' way to the host
    double d[5];
    for (int i = 0; i < 5; i++) {
        double t0 = mn_now();
        if (m->be->download_f32(m->be, logits, m->logits, (size_t)B * m->cfg.vocab_size, MEM_ACT))
            die("%s", mn_last_error());
        d[i] = mn_now() - t0;
    }
    DecodeTiming out = {1e3 * bench_median(t, reps), steps_mean, 1e3 * bench_median(d, 5)};
    free(t);
    free(tok);
    return out;
}

int bench_decode(int argc, char **argv) {
    const char *config = "125m", *backend = "cpu", *batches = "1,16,128";
    int tokens = 64, prompt = 16, reps = 3, vocab = 50304, cg = 0, eager_only = 0;
    float tol = 1e-4f;
    Option opts[] = {
        {"config", OPT_STRING, &config, "preset or JSON config"},
        {"backend", OPT_STRING, &backend, "cpu or cuda"},
        {"batch", OPT_STRING, &batches, "sequences decoded together, a comma-separated list"},
        {"tokens", OPT_INT, &tokens, "timed steps per run", 1, 1e6},
        {"prompt", OPT_INT, &prompt, "prefill tokens before them", 1, 1e6},
        {"reps", OPT_INT, &reps, "runs (the median is reported)", 1, 10000},
        {"vocab", OPT_INT, &vocab, "vocabulary size when the config leaves it to the data", 1, 1 << 24},
        {"cg-steps", OPT_INT, &cg, "CG steps at most (0: the config's)", 0, 10000},
        {"cg-tol", OPT_FLOAT, &tol, "CG tolerance (0: always the full steps)", 0, 1},
        {"eager", OPT_FLAG, &eager_only, "eager steps only (no recording; e.g. under a profiler)"},
    };
    int st = parse_args(argc, argv, "[options]", opts, sizeof opts / sizeof opts[0], NULL, NULL, 0);
    if (st) return st == 2 ? 0 : 1;
    int bs[16], nb = bench_parse_ints(batches, bs, 16);
    if (nb <= 0) die("--batch: expected positive integers separated by commas, got '%s'", batches);
    if (tokens <= 0 || prompt <= 0 || reps <= 0) die("--tokens, --prompt and --reps must be > 0");
    Model *m = bench_model(config, backend, vocab, cg);
    const Backend *be = m->be;
    const ModelConfig c = m->cfg;
    m->solver.tol = tol;
    // model_create allows recording where the backend can and no mixer's decoding step refuses it
    // (attention's passes host values that change every step: MixerOps.no_graph)
    int graphs = m->use_graphs && !eager_only;
    printf("decoding %s (%zu parameters) on %s: %d-token prompt, then %d steps per run (median of %d), "
           "logits to the host every step; CG at most %d steps, tolerance %.0e\n",
           config, m->count, be->name, prompt, tokens, reps, m->solver.max_steps, (double)tol);
    printf("%6s | %12s %12s | %12s %12s | %7s | %8s | %s\n", "B", "eager ms", "tokens/s", graphs ? "graph ms" : "-",
           graphs ? "tokens/s" : "-", graphs ? "speedup" : "-", "CG steps", "of a step: logits to host ms");
    for (int i = 0; i < nb; i++) {
        float *logits = xcalloc((size_t)bs[i] * c.vocab_size, sizeof(float));
        m->use_graphs = 0;
        DecodeTiming e = time_decode(m, bs[i], prompt, tokens, reps, logits), g = {0, 0};
        if (graphs) {
            m->use_graphs = 1;
            g = time_decode(m, bs[i], prompt, tokens, reps, logits);
            printf("%6d | %12.3f %12.0f | %12.3f %12.0f | %6.2fx | %8.1f | %.3f\n", bs[i], e.ms_per_step,
                   1e3 * bs[i] / e.ms_per_step, g.ms_per_step, 1e3 * bs[i] / g.ms_per_step, e.ms_per_step / g.ms_per_step,
                   g.steps_mean, g.download_ms);
        } else {
            printf("%6d | %12.3f %12.0f | %12s %12s | %7s | %8.1f | %.3f\n", bs[i], e.ms_per_step,
                   1e3 * bs[i] / e.ms_per_step, "-", "-", "-", e.steps_mean, e.download_ms);
        }
        fflush(stdout);
        free(logits);
    }
    model_free(m);
    return 0;
}
