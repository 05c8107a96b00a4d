// mesanet logits: the logits of a model at every position of a token sequence,
// written as raw float32 [T, V] (for checking checkpoints against other
// implementations, e.g. bench/fla_compat.py).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "model/model.h"
#include "tools/commands.h"
#include "train/checkpoint.h"

int cmd_logits(int argc, char **argv) {
    const char *run = NULL, *tokens = NULL, *out = NULL, *backend = "cpu";
    int steps = 0;
    Option opts[] = {
        {"model", OPT_STRING, &run, "run directory (config.json, model.safetensors)"},
        {"tokens", OPT_STRING, &tokens, "comma-separated token ids"},
        {"out", OPT_STRING, &out, "file for the float32 logits [T, V] (soft cap applied)"},
        {"cg-steps", OPT_INT, &steps, "CG steps (0: the model's)"},
        {"backend", OPT_STRING, &backend, "cpu, ref or cuda"},
    };
    int st = parse_args(argc, argv, "--model DIR --tokens 1,2,3 --out FILE", opts, sizeof opts / sizeof opts[0], NULL,
                        NULL, 0);
    if (st) return st == 2 ? 0 : 1;
    if (!run || !tokens || !out) die("logits: --model, --tokens and --out are required (see --help)");
    const Backend *be = backend_by_name(backend);
    Model *m;
    if (!be || checkpoint_load_model(run, be, &m)) die("%s", mn_last_error());
    if (steps > 0) m->solver.max_steps = steps;
    int32_t ids[4096];
    int T = 0;
    for (const char *p = tokens; *p && T < 4096;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) die("logits: --tokens: expected comma-separated integers at '%s'", p);
        ids[T++] = (int32_t)v;
        p = *end == ',' ? end + 1 : end;
    }
    if (model_forward(m, ids, NULL, 1, T, 0, NULL)) die("%s", mn_last_error());
    size_t n = (size_t)T * m->cfg.vocab_size;
    float *l = xcalloc(n, sizeof(float));
    if (be->download_f32(be, l, m->logits, n, MEM_ACT)) die("%s", mn_last_error());
    for (size_t i = 0; i < n && m->cfg.logit_cap > 0; i++) l[i] = m->cfg.logit_cap * tanhf(l[i] / m->cfg.logit_cap);
    FILE *f = fopen(out, "wb");
    if (!f || fwrite(l, sizeof(float), n, f) != n || fclose(f)) die("%s: cannot write", out);
    printf("wrote %d x %d logits to %s\n", T, m->cfg.vocab_size, out);
    free(l);
    model_free(m);
    return 0;
}
