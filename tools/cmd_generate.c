// mesanet generate: text from a trained model, one token at a time with the
// recurrent state (memory stays constant however long the text grows).
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "core/common.h"
#include "data/bpe.h"
#include "eval/sample.h"
#include "mixers/mixer.h"
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

// The whole of a file, NUL-terminated, its length in *n; fails naming the file.
static char *read_prompt_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) cmd_fail("generate", "--prompt-file %s: cannot open (%s)", path, strerror(errno));
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (size_t got = 1; got;) {
        if (cap - len < 4096) {
            char *more = realloc(buf, cap = cap ? 2 * cap : 65536);
            if (!more) cmd_fail("generate", "--prompt-file %s: out of memory", path);
            buf = more;
        }
        len += got = fread(buf + len, 1, cap - len - 1, f);
    }
    if (ferror(f)) cmd_fail("generate", "--prompt-file %s: cannot read (%s)", path, strerror(errno));
    fclose(f);
    buf[len] = 0;
    *n = len;
    return buf;
}

// Attention with RoPE sees relative distances up to its reach: the whole past (mha), or the last
// `window` tokens (swa). Where that reach exceeds the training context, distances no training
// batch had are extrapolated, and a prompt longer than the context uses them: a notice on stderr.
// The recurrent mixers have no positions.
static void note_extrapolation(const ModelConfig *c, size_t prompt_tokens) {
    if (prompt_tokens <= (size_t)c->seq_len) return;
    for (int l = 0; l < c->n_layers; l++) {
        const MixerOps *ops = mixer_at(c, l);
        if (ops == &mixer_mha || (ops == &mixer_swa && c->window > c->seq_len)) {
            fprintf(stderr,
                    "mesanet generate: note: the prompt is %zu tokens, beyond the %d-token context this model was "
                    "trained at; its attention (%s) extrapolates to positions it was not trained on\n",
                    prompt_tokens, c->seq_len, ops->name);
            return;
        }
    }
}

int cmd_generate(int argc, char **argv) {
    const char *run = "runs/demo", *prompt = NULL, *prompt_file = NULL, *backend = "cpu";
    int ntokens = 200, seed = 1, top_k = 0, cg_steps = 0, quiet = 0;
    float temperature = 0.8f, top_p = 0.95f, cg_tol = 0;
    Option opts[] = {
        {"model", OPT_STRING, &run, "run directory (config.json, model.safetensors, encoder.json, vocab.bpe)"},
        {"prompt", OPT_STRING, &prompt, "text to continue (default: none, the start of a document)"},
        {"prompt-file", OPT_STRING, &prompt_file, "or the text of this file"},
        {"tokens", OPT_INT, &ntokens, "tokens to generate at most (a document's end stops sooner)", 0, 1e8},
        {"temperature", OPT_FLOAT, &temperature, "sampling temperature (0: greedy)", 0, 100},
        {"top-k", OPT_INT, &top_k, "sample among the k most likely tokens (0: all)", 0, 1 << 24},
        {"top-p", OPT_FLOAT, &top_p, "sample among the most likely tokens holding this probability (1: all)", 0, 1},
        {"seed", OPT_INT, &seed, "sampling seed", 0, INT_MAX},
        {"cg-steps", OPT_INT, &cg_steps, "CG steps per token at most (0: the model's training setting)", 0, 10000},
        {"cg-tol", OPT_FLOAT, &cg_tol, "stop CG at this relative residual (0: always the full steps)", 0, 1},
        {"backend", OPT_STRING, &backend, "cpu, cuda or ref (float64, for checks)"},
        {"quiet", OPT_FLAG, &quiet, "print only the text (no statistics)"},
    };
    int st = parse_args(argc, argv, "[options]", opts, sizeof opts / sizeof opts[0], NULL, NULL, 0);
    if (st) return st == 2 ? 0 : 1;
    if (prompt && prompt_file) cmd_fail("generate", "give --prompt or --prompt-file, not both");
    size_t prompt_len = prompt ? strlen(prompt) : 0;
    char *file_text = prompt_file ? read_prompt_file(prompt_file, &prompt_len) : NULL;
    if (file_text) prompt = file_text;
    if (!prompt) prompt = "";
    const Backend *be = backend_by_name(backend);
    if (!be) cmd_fail("generate", "%s", mn_last_error());
    Model *m;
    if (checkpoint_load_model(run, be, &m)) cmd_fail("generate", "%s", mn_last_error());
    char enc[4096], merges[4096];
    snprintf(enc, sizeof enc, "%s/encoder.json", run);
    snprintf(merges, sizeof merges, "%s/vocab.bpe", run);
    Bpe *bpe;
    if (bpe_load(&bpe, enc, merges)) cmd_fail("generate", "%s (the run directory needs its tokenizer)", mn_last_error());
    if (cg_steps > 0) m->solver.max_steps = cg_steps;
    m->solver.tol = cg_tol;

    // BOS, then the prompt
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    int32_t bos = bpe_eot(bpe);
    if (bpe_encode(bpe, (const unsigned char *)prompt, prompt_len, &ids, &n, &cap))
        cmd_fail("generate", "%s", mn_last_error());
    if (n > INT_MAX - 1) cmd_fail("generate", "the prompt is %zu tokens long, at most %d", n, INT_MAX - 1);
    int32_t *seq = malloc(sizeof(int32_t) * (n + 1));
    int V = m->cfg.vocab_size, Vtok = bpe_vocab_size(bpe) < V ? bpe_vocab_size(bpe) : V;
    float *logits = malloc(sizeof(float) * (size_t)V), *work = malloc(sizeof(float) * 2 * (size_t)V);
    if (!logits || !work || !seq) cmd_fail("generate", "out of memory");
    seq[0] = bos;
    size_t plen = 1;
    for (size_t i = 0; i < n; i++) seq[plen++] = ids[i];
    Sampler sampler = {temperature, top_k, top_p, {{0}}};
    mn_rng_seed(&sampler.rng, (uint64_t)seed);

    note_extrapolation(&m->cfg, plen);  // (with --quiet too: it bears on the text)
    if (model_reset_state(m, 1)) cmd_fail("generate", "%s", mn_last_error());
    fwrite(prompt, 1, prompt_len, stdout);
    double t0 = mn_now();
    if (model_decode(m, seq, 1, (int)plen, logits)) cmd_fail("generate", "%s", mn_last_error());
    double prefill_steps, gen_steps = 0, t_prefill = mn_now() - t0;
    if (model_take_cg_steps(m, &prefill_steps)) cmd_fail("generate", "%s", mn_last_error());
    t0 = mn_now();
    int made = 0;
    for (; made < ntokens; made++) {
        int32_t next = sample_token(&sampler, logits, Vtok, work);
        if (next == bos) break;  // the end of a document
        emit(bpe, next);
        if (model_decode(m, &next, 1, 1, logits)) cmd_fail("generate", "%s", mn_last_error());
    }
    double dt = mn_now() - t0;
    if (model_take_cg_steps(m, &gen_steps)) cmd_fail("generate", "%s", mn_last_error());  // the mean over the generated tokens
    // The text's last line ends before the statistics: stdout is buffered apart from stderr when it is
    // not a terminal, so the newline goes out now, not at exit after them.
    printf("\n");
    fflush(stdout);
    if (!quiet) {
        // The decoding state: constant for the recurrent mixers; attention's key/value cache grows.
        char state[96];
        double fixed_mb = (double)model_state_floats(&m->cfg) * 4 / 1e6;
        size_t per_token = model_state_floats_per_token(&m->cfg) * 4;
        if (per_token)
            snprintf(state, sizeof state, "state %.2f MB + %.1f KB a token (%.2f MB now)", fixed_mb, per_token / 1e3,
                     fixed_mb + (double)per_token * (double)(plen + (size_t)made) / 1e6);
        else
            snprintf(state, sizeof state, "state %.2f MB, constant", fixed_mb);
        if (model_uses_cg(&m->cfg))
            fprintf(stderr,
                    "[prompt: %zu token%s in %.2f s, CG steps %.1f | generated %d token%s, %.1f tokens/s, mean CG steps "
                    "per token and head %.1f (max %d%s) | %s]\n",
                    plen, plural_s((long long)plen), t_prefill, prefill_steps, made, plural_s(made), made / (dt > 0 ? dt : 1), gen_steps, m->solver.max_steps,
                    cg_tol > 0 ? ", tolerance" : "", state);
        else
            fprintf(stderr, "[prompt: %zu token%s in %.2f s | generated %d token%s, %.1f tokens/s | %s]\n", plen,
                    plural_s((long long)plen), t_prefill, made, plural_s(made), made / (dt > 0 ? dt : 1), state);
    }
    free(ids);
    free(seq);
    free(file_text);
    free(logits);
    free(work);
    bpe_free(bpe);
    model_free(m);
    return 0;
}
