// mesanet generate: text from a trained model, one token at a time with the
// recurrent state (memory stays constant however long the text grows).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "data/bpe.h"
#include "eval/sample.h"
#include "model/model.h"
#include "tools/commands.h"
#include "train/checkpoint.h"

// Prints a token's bytes as they come (a UTF-8 character may span tokens: the
// terminal puts it together).
static void emit(const Bpe *bpe, int32_t id) {
    const unsigned char *b;
    size_t n;
    if (!bpe_token_bytes(bpe, id, &b, &n)) fwrite(b, 1, n, stdout);
    fflush(stdout);
}

int cmd_generate(int argc, char **argv) {
    const char *run = "runs/demo", *prompt = "", *backend = "cpu";
    int ntokens = 200, seed = 1, top_k = 0, cg_steps = 0, quiet = 0;
    float temperature = 0.8f, top_p = 0.95f, cg_tol = 0;
    Option opts[] = {
        {"model", OPT_STRING, &run, "run directory (config.json, model.safetensors, encoder.json, vocab.bpe)"},
        {"prompt", OPT_STRING, &prompt, "text to continue"},
        {"tokens", OPT_INT, &ntokens, "tokens to generate"},
        {"temperature", OPT_FLOAT, &temperature, "sampling temperature (0: greedy)"},
        {"top-k", OPT_INT, &top_k, "sample among the k most likely tokens (0: all)"},
        {"top-p", OPT_FLOAT, &top_p, "sample among the most likely tokens holding this probability"},
        {"seed", OPT_INT, &seed, "sampling seed"},
        {"cg-steps", OPT_INT, &cg_steps, "CG steps per token at most (0: the model's training setting)"},
        {"cg-tol", OPT_FLOAT, &cg_tol, "stop CG at this relative residual (0: always the full steps)"},
        {"backend", OPT_STRING, &backend, "cpu or cuda"},
        {"quiet", OPT_FLAG, &quiet, "print only the text (no statistics)"},
    };
    int st = parse_args(argc, argv, "[options]", opts, sizeof opts / sizeof opts[0], NULL, NULL, 0);
    if (st) return st == 2 ? 0 : 1;
    const Backend *be = backend_by_name(backend);
    if (!be) die("%s", mn_last_error());
    Model *m;
    if (checkpoint_load_model(run, be, &m)) die("%s", mn_last_error());
    char enc[4096], merges[4096];
    snprintf(enc, sizeof enc, "%s/encoder.json", run);
    snprintf(merges, sizeof merges, "%s/vocab.bpe", run);
    Bpe *bpe;
    if (bpe_load(&bpe, enc, merges)) die("%s (the run directory needs its tokenizer)", mn_last_error());
    if (cg_steps > 0) m->solver.max_steps = cg_steps;
    m->solver.tol = cg_tol;

    // BOS, then the prompt
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    int32_t bos = bpe_eot(bpe);
    int32_t *seq = malloc(sizeof(int32_t) * (strlen(prompt) + 2));
    seq[0] = bos;
    size_t plen = 1;
    if (bpe_encode(bpe, (const unsigned char *)prompt, strlen(prompt), &ids, &n, &cap)) die("%s", mn_last_error());
    for (size_t i = 0; i < n; i++) seq[plen++] = ids[i];
    int V = m->cfg.vocab_size, Vtok = bpe_vocab_size(bpe) < V ? bpe_vocab_size(bpe) : V;
    float *logits = malloc(sizeof(float) * (size_t)V), *work = malloc(sizeof(float) * 2 * (size_t)V);
    if (!logits || !work || !seq) die("out of memory");
    Sampler sampler = {temperature, top_k, top_p, {{0}}};
    mn_rng_seed(&sampler.rng, (uint64_t)seed);

    if (model_reset_state(m, 1)) die("%s", mn_last_error());
    fputs(prompt, stdout);
    double t0 = mn_now();
    if (model_decode(m, seq, 1, (int)plen, logits)) die("%s", mn_last_error());
    double prefill_steps, gen_steps = 0, t_prefill = mn_now() - t0;
    if (model_take_cg_steps(m, &prefill_steps)) die("%s", mn_last_error());
    t0 = mn_now();
    int made = 0;
    for (; made < ntokens; made++) {
        int32_t next = sample_token(&sampler, logits, Vtok, work);
        if (next == bos) break;  // the end of a document
        emit(bpe, next);
        if (model_decode(m, &next, 1, 1, logits)) die("%s", mn_last_error());
    }
    double dt = mn_now() - t0;
    if (model_take_cg_steps(m, &gen_steps)) die("%s", mn_last_error());  // the mean over the generated tokens
    printf("\n");
    if (!quiet) {
        const MixerOps *ops = mixer_find(m->cfg.mixer);
        fprintf(stderr,
                "[prompt: %zu tokens in %.2f s, CG steps %.1f | generated %d tokens, %.1f tokens/s, mean CG steps per "
                "token and head %.1f (max %d%s) | state %.2f MB, constant]\n",
                plen, t_prefill, prefill_steps, made, made / (dt > 0 ? dt : 1), gen_steps,
                m->solver.max_steps, cg_tol > 0 ? ", tolerance" : "",
                (double)ops->state_floats(&m->cfg) * m->cfg.n_layers * 4 / 1e6);
    }
    free(ids);
    free(seq);
    free(logits);
    free(work);
    bpe_free(bpe);
    model_free(m);
    return 0;
}
