// mesanet logits: the logits of a model at every position of a token sequence,
// written as raw float32 [T, V] (for checking checkpoints against other
// implementations, e.g. bench/fla_compat.py).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "core/common.h"
#include "model/model.h"
#include "tools/commands.h"
#include "train/checkpoint.h"

#define MAX_TOKENS 4096

// The ids of --tokens: comma-separated integers in [0, V), at most MAX_TOKENS of them.
static int parse_tokens(const char *s, int V, int32_t *ids) {
    int T = 0;
    for (;;) {
        char *end;
        if (*s < '0' || *s > '9')  // no sign, blank or empty item
            cmd_fail("logits", "--tokens expects comma-separated integers in [0, %d], got '%s'", V - 1, s);
        long long v = strtoll(s, &end, 10);
        if (v >= V || (*end && *end != ','))
            cmd_fail("logits", "--tokens expects comma-separated integers in [0, %d], got '%.*s'", V - 1,
                     (int)strcspn(s, ","), s);
        if (T == MAX_TOKENS) cmd_fail("logits", "--tokens: more than %d tokens", MAX_TOKENS);
        ids[T++] = (int32_t)v;
        if (!*end) return T;
        s = end + 1;
    }
}

int cmd_logits(int argc, char **argv) {
    const char *run = NULL, *tokens = NULL, *out = NULL, *backend = "cpu";
    int steps = 0;
    Option opts[] = {
        {"model", OPT_STRING, &run, "run directory (config.json, model.safetensors)"},
        {"tokens", OPT_STRING, &tokens, "comma-separated token ids"},
        {"out", OPT_STRING, &out, "file for the float32 logits [T, V] (soft cap applied)"},
        {"cg-steps", OPT_INT, &steps, "CG steps (0: the model's)", 0, 10000},
        {"backend", OPT_STRING, &backend, "cpu, ref or cuda"},
    };
    int st = parse_args(argc, argv, "--model DIR --tokens 1,2,3 --out FILE", opts, sizeof opts / sizeof opts[0], NULL,
                        NULL, 0);
    if (st) return st == 2 ? 0 : 1;
    if (!run || !tokens || !out) cmd_fail("logits", "--model, --tokens and --out are required (see --help)");
    const Backend *be = backend_by_name(backend);
    Model *m;
    if (!be || checkpoint_load_model(run, be, &m)) cmd_fail("logits", "%s", mn_last_error());
    if (steps > 0) m->solver.max_steps = steps;
    int32_t ids[MAX_TOKENS];
    int T = parse_tokens(tokens, m->cfg.vocab_size, ids);
    if (model_forward(m, ids, NULL, 1, T, 0, NULL)) cmd_fail("logits", "%s", mn_last_error());
    size_t n = (size_t)T * m->cfg.vocab_size;
    float *l = xcalloc(n, sizeof(float));
    if (be->download_f32(be, l, m->logits, n, MEM_ACT)) cmd_fail("logits", "%s", mn_last_error());
    for (size_t i = 0; i < n && m->cfg.logit_cap > 0; i++) l[i] = m->cfg.logit_cap * tanhf(l[i] / m->cfg.logit_cap);
    FILE *f = fopen(out, "wb");
    if (!f || fwrite(l, sizeof(float), n, f) != n || fclose(f)) cmd_fail("logits", "--out %s: cannot write", out);
    printf("wrote %d x %d logits to %s\n", T, m->cfg.vocab_size, out);
    free(l);
    model_free(m);
    return 0;
}
