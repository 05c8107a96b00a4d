/*
 * Writes the fuzzers' seed corpora: valid files as the library itself writes
 * them, so that every run starts from inputs that get past the first checks.
 *
 *     fuzz_seeds OUT_DIR     -> OUT_DIR/<target>/<seed files>
 *
 * Run by scripts/fuzz.sh before fuzzing; nothing it writes is committed (the
 * hand-made edge cases are, in fuzz/edge/<target>/). Multi-file inputs are
 * joined with FUZZ_SEP (fuzz.h).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backends/registry.h"
#include "core/backend.h"
#include "core/common.h"
#include "core/safetensors.h"
#include "data/bpe.h"
#include "data/shard.h"
#include "fuzz.h"
#include "model/config.h"
#include "model/model.h"
#include "model/presets.h"
#include "train/checkpoint.h"
#include "train/loss_log.h"
#include "train/optim.h"

static const char *out_dir;

static void check(int status, const char *what) {
    if (status) die("fuzz_seeds: %s: %s", what, mn_last_error());
}

static char *path_of(const char *target, const char *name) {
    static char p[1024];
    snprintf(p, sizeof p, "%s/%s", out_dir, target);
    check(mn_mkdirs(p), p);
    snprintf(p, sizeof p, "%s/%s/%s", out_dir, target, name);
    return p;
}

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) die("fuzz_seeds: cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    rewind(f);
    unsigned char *b = xcalloc((size_t)len + 1, 1);
    if (fread(b, 1, (size_t)len, f) != (size_t)len) die("fuzz_seeds: cannot read %s", path);
    fclose(f);
    *n = (size_t)len;
    return b;
}

static void put(const char *target, const char *name, const void *data, size_t n) {
    const char *p = path_of(target, name);
    FILE *f = fopen(p, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f)) die("fuzz_seeds: cannot write %s", p);
}

static void put_str(const char *target, const char *name, const char *s) { put(target, name, s, strlen(s)); }

// Joins the files (NULL: left out, ending the list) with FUZZ_SEP into one seed.
static void put_joined(const char *target, const char *name, const char *const *files, int n) {
    size_t cap = 0, len = 0;
    unsigned char *all = NULL;
    for (int i = 0; i < n && files[i]; i++) {
        size_t k;
        unsigned char *b = slurp(files[i], &k);
        size_t sep = i ? sizeof FUZZ_SEP - 1 : 0;
        if (len + sep + k > cap) {
            cap = 2 * (len + sep + k);
            all = realloc(all, cap);
            if (!all) die("fuzz_seeds: out of memory");
        }
        memcpy(all + len, FUZZ_SEP, sep);
        memcpy(all + len + sep, b, k);
        len += sep + k;
        free(b);
    }
    put(target, name, all, len);
    free(all);
}

// ---------------------------------------------------------------------------

static void seed_safetensors(const char *scratch) {
    float f32[6] = {1, -2, 3.5f, 0, 1e-30f, -1e30f};
    uint16_t f16[4] = {0x3c00, 0xbc00, 0x7c00, 0x0001}, bf16[4] = {0x3f80, 0xbf80, 0x7f80, 0x0001};
    double f64 = 3.25;
    int32_t i32[3] = {-1, 0, 2147483647};
    int64_t i64[2] = {-5, 1ll << 40};
    StTensor t[] = {
        {"weight", ST_F32, 2, {2, 3}, f32},  {"half", ST_F16, 1, {4}, f16},  {"brain", ST_BF16, 2, {2, 2}, bf16},
        {"scalar", ST_F64, 0, {0}, &f64},    {"ints", ST_I32, 1, {3}, i32},  {"longs", ST_I64, 1, {2}, i64},
        {"empty", ST_F32, 2, {0, 5}, NULL},
    };
    StMeta meta[] = {{"format", "pt"}, {"note", "a \"quoted\"\n value \xc3\xa9"}};
    char p[1024];
    snprintf(p, sizeof p, "%s/all.safetensors", scratch);
    check(st_write(p, t, 7, meta, 2), "st_write");
    size_t n;
    unsigned char *b = slurp(p, &n);
    put("safetensors", "all_dtypes", b, n);
    // the header alone, as a JSON seed
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | b[i];
    put("json", "safetensors_header", b + 8, (size_t)hlen);
    free(b);
    check(st_write(p, t, 1, NULL, 0), "st_write");
    b = slurp(p, &n);
    put("safetensors", "one_tensor", b, n);
    free(b);
    check(st_write(p, NULL, 0, meta, 1), "st_write");
    b = slurp(p, &n);
    put("safetensors", "metadata_only", b, n);
    free(b);
}

static void seed_configs(const char *scratch) {
    const char *presets[] = {"tiny", "demo", "125m", "fla-162m"};
    char p[1024];
    snprintf(p, sizeof p, "%s/config.json", scratch);
    for (int i = 0; i < 4; i++) {
        ModelConfig c;
        check(config_preset(&c, presets[i]), "config_preset");
        if (!c.vocab_size) c.vocab_size = 4096;
        check(config_save(&c, p), "config_save");
        size_t n;
        unsigned char *b = slurp(p, &n);
        put("config", presets[i], b, n);
        if (i == 0) put("json", "config", b, n);
        free(b);
    }
    put_str("config", "bare_fields", "{\"preset\": \"tiny\", \"vocab_size\": 300, \"dim\": 48, \"norm_eps\": 1e-5,\n"
                                     " \"tie_embeddings\": false, \"arch\": \"paper\", \"mixer\": \"mesa\"}\n");
    put_str("config", "hugging_face",
            "{\"model_type\": \"mesa_net\", \"hidden_size\": 256, \"num_hidden_layers\": 2, \"num_heads\": 4,\n"
            " \"head_dim\": 64, \"vocab_size\": 1000, \"hidden_ratio\": 4, \"hidden_act\": \"swish\",\n"
            " \"norm_eps\": 1e-06, \"tie_word_embeddings\": false, \"use_output_gate\": true, \"conv_size\": 4,\n"
            " \"lambda_lower_bound\": 0.25, \"max_cg_step_training\": 30, \"max_position_embeddings\": 2048}\n");
}

static void seed_json(void) {
    put_str("json", "values", "{\"a\": [1, -2.5e3, 0.0, 1E+2, true, false, null], \"s\": \"x\\u00e9\\ud83d\\ude00\\n\\\"\",\n"
                              " \"nested\": {\"b\": [[[]]], \"c\": {}}}");
    put_str("json", "numbers", "[0, -0, 1e308, -1e-308, 123456789012345678901234567890, 9007199254740993]");
}

static void seed_shards(const char *scratch) {
    int32_t tok[40];
    for (int i = 0; i < 40; i++) tok[i] = i % 7 == 0 ? 63 : (i * 13) % 63;
    char p[1024];
    snprintf(p, sizeof p, "%s/shard.bin", scratch);
    struct {
        const char *name;
        uint64_t n;
        uint32_t vocab, bos;
    } cases[] = {{"two_byte", 40, 64, 63}, {"four_byte", 40, 70000, 63}, {"empty", 0, 64, 0}, {"short", 3, 64, 63}};
    for (int i = 0; i < 4; i++) {
        check(shard_write(p, tok, cases[i].n, cases[i].vocab, cases[i].bos), "shard_write");
        size_t n;
        unsigned char *b = slurp(p, &n);
        put("shard", cases[i].name, b, n);
        free(b);
    }
}

static void seed_bpe(const char *scratch) {
    const char *para = "The quick brown fox jumps over the lazy dog. It's 2024, and they'll say we've done 12 tests!\n"
                       "  Indented  text\twith tabs; \xc3\xa9t\xc3\xa9, na\xc3\xafve caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 "
                       "\xf0\x9f\x98\x80 <|endoftext|>\n";
    size_t pl = strlen(para), reps = 20;
    unsigned char *text = xcalloc(pl * reps + 1, 1);
    for (size_t i = 0; i < reps; i++) memcpy(text + i * pl, para, pl);
    char dir[1024], enc[1100], voc[1100];
    snprintf(dir, sizeof dir, "%s/bpe", scratch);
    check(bpe_train(text, pl * reps, 300, dir), "bpe_train");
    free(text);
    snprintf(enc, sizeof enc, "%s/encoder.json", dir);
    snprintf(voc, sizeof voc, "%s/vocab.bpe", dir);
    const char *files[] = {enc, voc};
    put_joined("bpe", "trained_300", files, 2);
    size_t n;
    unsigned char *b = slurp(enc, &n);
    put("json", "encoder", b, n);
    free(b);
}

static void seed_checkpoints(const char *scratch) {
    for (int fla = 0; fla < 2; fla++) {
        ModelConfig c;
        config_default(&c);
        c.vocab_size = 16;
        c.dim = 8;
        c.n_layers = 1;
        c.n_heads = 1;
        c.head_dim = 8;
        c.mlp_hidden = 16;
        c.seq_len = 16;
        if (fla) {
            strcpy(c.arch, "fla");
            c.embed_scale = 0;
            c.logit_cap = 0;
            c.tie_embeddings = 0;
            c.gate_bound = 0;
            c.shared_onorm = 1;
            c.resid_scale = 0;
            c.output_gate = 1;
        }
        Model *m;
        check(model_create(&m, &c, backend_cpu()), "model_create");
        check(model_init_params(m, 1), "model_init_params");
        AdamW o;
        check(adamw_init(&o, m), "adamw_init");
        TrainState t = {.step = 3, .epoch = 1, .index = 2, .seed = 5, .tokens = 96, .elapsed = 0.5};
        char dir[1024], files[3][1100];
        snprintf(dir, sizeof dir, "%s/run%d", scratch, fla);
        check(mn_mkdirs(dir), dir);
        check(checkpoint_save_model(dir, m, 3), "checkpoint_save_model");
        check(checkpoint_save_state(dir, m, &o, &t), "checkpoint_save_state");
        snprintf(files[0], sizeof files[0], "%s/config.json", dir);
        snprintf(files[1], sizeof files[1], "%s/model.safetensors", dir);
        snprintf(files[2], sizeof files[2], "%s/optimizer.safetensors", dir);
        const char *f[3] = {files[0], files[1], files[2]};
        put_joined("checkpoint", fla ? "tiny_fla" : "tiny_paper", f, 3);
        put_joined("checkpoint", fla ? "tiny_fla_model_only" : "tiny_paper_model_only", f, 2);
        // the same set as checkpoints/step-00000003, named by checkpoints/latest
        char latest[1100];
        snprintf(latest, sizeof latest, "%s/latest", dir);
        FILE *lf = fopen(latest, "wb");
        if (!lf || fputs("step-00000003\n", lf) < 0 || fclose(lf)) die("fuzz_seeds: cannot write %s", latest);
        const char *g[4] = {files[0], files[1], files[2], latest};
        put_joined("checkpoint", fla ? "tiny_fla_latest" : "tiny_paper_latest", g, 4);
        if (!fla) {
            size_t n;
            unsigned char *b = slurp(files[1], &n);
            put("safetensors", "tiny_model", b, n);
            free(b);
        }
        adamw_free(&o, m);
        model_free(m);
    }
}

static void seed_loss_logs(const char *scratch) {
    for (int k = 0; k < 2; k++) {
        LossLog log = {0};
        int n = k ? 12 : 1;
        for (int i = 1; i <= n; i++) {
            LossRow r = {i, 5.5 - 0.1 * i, 1e-3 * i / n, 0.5 + i, 1024.0 * i, 0.25 * i, i % 4 == 0 ? 5.0 - 0.05 * i : NAN};
            check(loss_log_add(&log, r), "loss_log_add");
        }
        char dir[1024], p[1100];
        snprintf(dir, sizeof dir, "%s/loss%d", scratch, k);
        check(mn_mkdirs(dir), dir);
        check(loss_log_write(&log, dir), "loss_log_write");
        snprintf(p, sizeof p, "%s/loss.csv", dir);
        size_t len;
        unsigned char *b = slurp(p, &len);
        put("loss_log", k ? "twelve_steps" : "one_step", b, len);
        free(b);
        loss_log_free(&log);
    }
    put_str("loss_log", "header_only", "step,loss,lr,grad_norm,tokens,seconds,val_loss\n");
}

int main(int argc, char **argv) {
    if (argc != 2) die("usage: fuzz_seeds OUT_DIR");
    out_dir = argv[1];
    char scratch[1024];
    snprintf(scratch, sizeof scratch, "%s/.scratch", out_dir);
    check(mn_mkdirs(scratch), scratch);
    seed_safetensors(scratch);
    seed_configs(scratch);
    seed_json();
    seed_shards(scratch);
    seed_bpe(scratch);
    seed_checkpoints(scratch);
    seed_loss_logs(scratch);
    return 0;
}
