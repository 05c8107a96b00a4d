// A toy corpus and the command-line tool, for the tests that train (see toy.h).
#include "toy.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../src/core/common.h"
#include "../src/data/shard.h"
#include "test.h"
#include "tool_run.h"

// A token stream with structure a model can learn: documents of a repeating
// random pattern, each preceded by BOS = 63.
void write_toy_shards(const char *data_dir) {
    MnRng r;
    mn_rng_seed(&r, 2);
    size_t n = 20000;
    int32_t *tok = xcalloc(n, sizeof(int32_t));
    for (size_t i = 0; i < n;) {
        tok[i++] = 63;
        int period = 2 + (int)(mn_rng_u64(&r) % 5), len = 30 + (int)(mn_rng_u64(&r) % 60);
        int32_t pat[8];
        for (int k = 0; k < period; k++) pat[k] = (int32_t)(mn_rng_u64(&r) % 60);
        for (int k = 0; k < len && i < n; k++) tok[i++] = pat[k % period];
    }
    char path[512];
    mkdir(data_dir, 0755);
    snprintf(path, sizeof path, "%s/train.bin", data_dir);
    if (shard_write(path, tok, n, 64, 63)) die("%s", mn_last_error());
    snprintf(path, sizeof path, "%s/valid.bin", data_dir);
    if (shard_write(path, tok + 15000, 5000, 64, 63)) die("%s", mn_last_error());
    free(tok);
}

TrainOptions toy_train_options(const char *data, const char *out) {
    TrainOptions o;
    train_options_default(&o);
    o.config = "tiny";
    o.data = data;
    o.out = out;
    o.batch = 4;
    o.seq = 32;
    o.steps = 12;
    o.warmup = 3;
    o.lr = 1e-2f;
    o.eval_every = 4;
    o.eval_batches = 2;
    o.save_every = 0;
    o.log_every = 100;
    o.cg_steps = 20;
    return o;
}

// `mesanet train` itself (data parallelism runs the tool again as its ranks), from the build
// directory of this test binary; its output goes to `log`. Returns the exit status.
int run_tool(const char *args, const char *log) {
    char cmd[2048];
    const char *exe = tool_run_path();
    if (!exe) {
        test_fail(__FILE__, __LINE__, "mesanet: not built (make all builds it beside this test binary)");
        return -1;
    }
    snprintf(cmd, sizeof cmd, "%s %s >%s 2>&1", exe, args, log);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

int read_second_column(const char *path, double *out, int max) {
    char line[1024];
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int n = 0;
    if (fgets(line, sizeof line, f))
        while (n < max && fgets(line, sizeof line, f)) {
            char *comma = strchr(line, ',');
            out[n++] = comma ? strtod(comma + 1, NULL) : NAN;
        }
    fclose(f);
    return n;
}

int read_losses(const char *dir, double *out, int max) {
    char path[512];
    snprintf(path, sizeof path, "%s/loss.csv", dir);
    return read_second_column(path, out, max);
}
