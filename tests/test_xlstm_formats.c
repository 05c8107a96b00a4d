// xLSTM checkpoints in other libraries' layouts (docs/spec/reference/xlstm-formats.md), CPU only:
// transformers' xLSTMForCausalLM config.json read, written and read again, its refusals, and an
// xlstm-architecture model saved and reloaded (also in weight_mode "fused" and the older
// query / key / value names); NX-AI's xLSTMLMModel folders (config.json as dataclasses.asdict
// writes it, model.safetensors as its state dict, both sLSTM layouts, tied heads) written by this
// test from weights it knows and loaded to those weights and the same logits, exported back and
// reloaded, and NX-AI's configs that mesanet cannot compute refused by name. The checks against
// the Python implementations themselves are bench/xlstm_check.py's (not part of this suite).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "core/common.h"
#include "core/safetensors.h"
#include "mixers/mixer.h"
#include "model/config.h"
#include "model/model.h"
#include "model/presets.h"
#include "test.h"
#include "tmpdir.h"
#include "tool_run.h"
#include "train/checkpoint.h"

// ------------------------------------------------------------------------------ helpers

// Every tensor of m random: norm weights and the learnable skip in [0.5, 2) (where 1 + (w - 1) is
// w again in float: NX-AI's offsets round-trip exactly), the rest N(0, 1) / sqrt(fan-in) (biases
// N(0, 1)), so that no gate sits at its default and every layout error shows in the logits.
static void fill_random(Model *m, uint64_t seed) {
    MnRng r;
    mn_rng_seed(&r, seed);
    for (int i = 0; i < m->nparams; i++) {
        const ParamSpec *s = &m->specs[i];
        float *v = xcalloc(s->numel, sizeof(float));
        int unit = strstr(s->name, "norm") || strstr(s->name, "learnable_skip");
        double scale = s->ndim > 1 ? 1 / sqrt((double)s->shape[s->ndim - 1]) : 1;
        for (size_t k = 0; k < s->numel; k++)
            v[k] = (float)(unit ? 0.5 + 1.5 * mn_rng_uniform(&r) : scale * mn_rng_normal(&r));
        if (m->be->upload_f32(m->be, m->p[i], v, s->numel, MEM_PARAM)) die("%s", mn_last_error());
        free(v);
    }
}

static float *param_values(Model *m, int i) {
    float *v = xcalloc(m->specs[i].numel, sizeof(float));
    if (m->be->download_f32(m->be, v, m->p[i], m->specs[i].numel, MEM_PARAM)) die("%s", mn_last_error());
    return v;
}

// The value of our tensor `name` (owned by the caller).
static float *named(Model *m, const char *name) {
    int i = model_find_param(m, name);
    if (i < 0) die("no tensor %s", name);
    return param_values(m, i);
}

enum { T = 70 };  // past transformers' chunk of 64, and NX-AI's context of 64 is not ours to keep

static float *logits_of(Model *m) {
    int32_t tok[T];
    for (int t = 0; t < T; t++) tok[t] = (int32_t)((7 * t + 3) % m->cfg.vocab_size);
    if (model_forward(m, tok, NULL, 1, T, 0, NULL)) die("%s", mn_last_error());
    size_t n = (size_t)T * m->cfg.vocab_size;
    float *l = xcalloc(n, sizeof(float));
    m->be->download_f32(m->be, l, m->logits, n, MEM_ACT);
    return l;
}

// The same logits bit for bit, all finite.
static void check_same_logits(const char *what, Model *a, Model *b) {
    float *la = logits_of(a), *lb = logits_of(b);
    size_t n = (size_t)T * a->cfg.vocab_size, finite = 0;
    for (size_t k = 0; k < n; k++) finite += isfinite(la[k]) != 0;
    CHECK(finite == n, "%s: %zu of %zu logits are not finite", what, n - finite, n);
    CHECK(a->cfg.vocab_size == b->cfg.vocab_size && !memcmp(la, lb, sizeof(float) * n),
          "%s: logits differ (rel err %.3g)", what, rel_err_ff(lb, la, n));
    free(la);
    free(lb);
}

// Every tensor of b equals a's of the same name (and b has no other).
static void check_same_tensors(const char *what, Model *a, Model *b) {
    CHECK(a->nparams == b->nparams, "%s: %d tensors vs %d", what, a->nparams, b->nparams);
    for (int i = 0; i < b->nparams; i++) {
        int j = model_find_param(a, b->specs[i].name);
        if (j < 0) {
            test_fail(__FILE__, __LINE__, "%s: no tensor %s in the first model", what, b->specs[i].name);
            continue;
        }
        float *va = param_values(a, j), *vb = param_values(b, i);
        CHECK(!memcmp(va, vb, sizeof(float) * b->specs[i].numel), "%s: tensor %s differs", what, b->specs[i].name);
        free(va);
        free(vb);
    }
}

static Model *load(const char *dir) {
    Model *m = NULL;
    if (checkpoint_load_model(dir, backend_cpu(), &m)) die("loading %s: %s", dir, mn_last_error());
    return m;
}

static void write_text(const char *path, const char *text) { write_bytes(path, text, strlen(text)); }

// Expects config_load of `text` (written to dir/config.json) to fail naming every one of want[].
static void expect_refused(TmpDir *td, const char *what, const char *text, const char *const *want, int nwant) {
    ModelConfig c;
    const char *path = tmp_path(td, "refused.json");
    write_text(path, text);
    int st = config_load(&c, path);
    CHECK(st != MN_OK, "%s: accepted", what);
    for (int i = 0; st && i < nwant; i++)
        CHECK(strstr(mn_last_error(), want[i]), "%s: the message does not name '%s': %s", what, want[i], mn_last_error());
}

// ------------------------------------------------------------------------------ transformers' xLSTM

// A config.json as transformers 5's xLSTMConfig.save_pretrained writes it (keys sorted), with
// members replaced (value NULL: left out) or added.
typedef struct {
    const char *key, *value;
} Kv;

static const Kv hf_base[] = {
    {"add_out_norm", "true"}, {"architectures", "[\"xLSTMForCausalLM\"]"}, {"autocast_kernel_dtype", "\"bfloat16\""},
    {"bos_token_id", "0"}, {"chunk_size", "64"}, {"chunkwise_kernel", "\"chunkwise--native_autograd\""},
    {"dtype", "\"float32\""}, {"embedding_dim", "64"}, {"eos_token_id", "2"}, {"eps", "1e-06"},
    {"ffn_proj_factor", "2.667"}, {"ffn_round_up_to_multiple_of", "64"}, {"gate_soft_cap", "15.0"},
    {"hidden_size", "64"}, {"inference_state_dtype", "\"float32\""}, {"max_inference_chunksize", "16384"},
    {"mode", "\"inference\""}, {"model_type", "\"xlstm\""}, {"norm_eps", "1e-06"},
    {"norm_reduction_force_float32", "true"}, {"num_blocks", "2"}, {"num_heads", "2"}, {"num_hidden_layers", "2"},
    {"output_logit_soft_cap", "30.0"}, {"pad_token_id", "1"}, {"qk_dim_factor", "0.5"}, {"return_last_states", "true"},
    {"sequence_kernel", "\"native_sequence__native\""}, {"step_kernel", "\"native\""}, {"tie_word_embeddings", "false"},
    {"transformers_version", "\"5.17.0\""}, {"use_bias", "false"}, {"use_cache", "true"}, {"v_dim_factor", "1.0"},
    {"vocab_size", "50"}, {"weight_mode", "\"single\""},
};
enum { HF_BASE = sizeof hf_base / sizeof hf_base[0] };

static char *hf_config(const Kv *over, int nover) {
    size_t cap = 8192, len = 0;
    char *s = xcalloc(cap, 1);
    len += (size_t)snprintf(s, cap, "{");
    int first = 1;
    for (int i = 0; i < HF_BASE + nover; i++) {
        const Kv *kv = i < HF_BASE ? &hf_base[i] : &over[i - HF_BASE];
        int skip = 0;  // a base member replaced (the replacement comes after the base's)
        for (int k = 0; k < nover && i < HF_BASE; k++)
            if (!strcmp(over[k].key, kv->key)) skip = 1;
        if (skip || !kv->value) continue;
        len += (size_t)snprintf(s + len, cap - len, "%s\n  \"%s\": %s", first ? "" : ",", kv->key, kv->value);
        first = 0;
    }
    snprintf(s + len, cap - len, "\n}\n");
    return s;
}

static int load_hf(TmpDir *td, const Kv *over, int nover, ModelConfig *c) {
    char *text = hf_config(over, nover);
    const char *path = tmp_path(td, "hf.json");
    write_text(path, text);
    free(text);
    return config_load(c, path);
}

TEST(xlstm_hf_config_reads_transformers_widths) {
    TmpDir td;
    tmp_make(&td);
    ModelConfig c;
    CHECK(!load_hf(&td, NULL, 0, &c), "%s", mn_last_error());
    // q, k: int(64 * 0.5) = 32 over 2 heads; v: 64; SwiGLU: (64 * 2.667 + 63) // 64 * 64 = 192
    CHECK(!strcmp(c.arch, "xlstm") && !strcmp(c.mixer, "mlstm-large") && c.dim == 64 && c.n_layers == 2 &&
              c.n_heads == 2 && c.head_dim == 16 && c.head_v_dim == 32 && c.mlp_hidden == 192 && c.vocab_size == 50 &&
              c.gate_cap == 15 && c.logit_cap == 30 && c.norm_eps == 1e-6f && !c.tie_embeddings && !c.embed_scale,
          "read: arch %s mixer %s D %d L %d H %d Dk %d Dv %d F %d V %d caps %g %g", c.arch, c.mixer, c.dim, c.n_layers,
          c.n_heads, c.head_dim, c.head_v_dim, c.mlp_hidden, c.vocab_size, (double)c.gate_cap, (double)c.logit_cap);
    // xLSTM-7B's: 4096 * 2.667 = 10924.032 rounds up to 10944; q, k 2048 over 8 heads, v 4096
    Kv big[] = {{"hidden_size", "4096"}, {"embedding_dim", "4096"}, {"num_heads", "8"}, {"num_blocks", "32"},
                {"num_hidden_layers", "32"}, {"vocab_size", "50304"}};
    CHECK(!load_hf(&td, big, 6, &c) && c.mlp_hidden == 10944 && c.head_dim == 256 && c.head_v_dim == 512,
          "xLSTM-7B's widths: F %d, Dk %d, Dv %d: %s", c.mlp_hidden, c.head_dim, c.head_v_dim, mn_last_error());
    // transformers' own defaults hide embedding_dim behind hidden_size = 4096; a config that gives only
    // embedding_dim (and only num_blocks) means those: read so
    Kv only[] = {{"hidden_size", NULL}, {"embedding_dim", "96"}, {"num_hidden_layers", NULL}, {"num_blocks", "3"}};
    CHECK(!load_hf(&td, only, 4, &c) && c.dim == 96 && c.n_layers == 3, "embedding_dim alone: D %d L %d: %s", c.dim,
          c.n_layers, mn_last_error());
    // null caps: none; fused weights read (split on loading)
    Kv nocap[] = {{"gate_soft_cap", "null"}, {"output_logit_soft_cap", "null"}, {"weight_mode", "\"fused\""}};
    CHECK(!load_hf(&td, nocap, 3, &c) && c.gate_cap == 0 && c.logit_cap == 0, "null caps: %g %g: %s", (double)c.gate_cap,
          (double)c.logit_cap, mn_last_error());
    tmp_remove(&td);
}

// read -> write (config_save) -> read: the same config; the written head holds every key
// transformers reads, both names of the width and of the depth, and reads alone (without our block)
// as the same config too.
TEST(xlstm_hf_config_round_trip) {
    TmpDir td;
    tmp_make(&td);
    Kv sets[][5] = {
        {{"ffn_proj_factor", "2.667"}},
        {{"hidden_size", "100"}, {"embedding_dim", "100"}, {"qk_dim_factor", "0.3"}, {"v_dim_factor", "0.6"},
         {"ffn_round_up_to_multiple_of", "8"}},
        {{"hidden_size", "4096"}, {"embedding_dim", "4096"}, {"num_heads", "8"}, {"gate_soft_cap", "null"},
         {"norm_eps", "1e-05"}},
    };
    int nsets[] = {1, 5, 5};
    for (int s = 0; s < 3; s++) {
        ModelConfig a, b, h;
        if (load_hf(&td, sets[s], nsets[s], &a)) {
            test_fail(__FILE__, __LINE__, "set %d: %s", s, mn_last_error());
            continue;
        }
        const char *saved = tmp_path(&td, "saved.json");
        CHECK(!config_save(&a, saved), "%s", mn_last_error());
        char *text = read_text(saved);
        static const char *const keys[] = {"\"model_type\": \"xlstm\"", "\"architectures\": [\"xLSTMForCausalLM\"]",
                                           "\"hidden_size\": ", "\"embedding_dim\": ", "\"num_hidden_layers\": ",
                                           "\"num_blocks\": ", "\"qk_dim_factor\": ", "\"v_dim_factor\": ",
                                           "\"ffn_proj_factor\": ", "\"ffn_round_up_to_multiple_of\": ",
                                           "\"weight_mode\": \"single\"", "\"use_bias\": false", "\"eps\": 1e-06",
                                           "\"tie_word_embeddings\": false", "\"add_out_norm\": true"};
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
            CHECK(strstr(text, keys[k]), "set %d: the saved config lacks %s:\n%s", s, keys[k], text);
        CHECK(!config_load(&b, saved), "set %d: %s", s, mn_last_error());
        char diff[256];
        CHECK(!config_diff(&a, &b, diff, sizeof diff), "set %d: the round trip changed %s", s, diff);
        char *block = strstr(text, ",\n  \"mesanet\"");
        if (block) {
            strcpy(block, "\n}\n");
            const char *hf = tmp_path(&td, "hf-only.json");
            write_text(hf, text);
            CHECK(!config_load(&h, hf), "set %d: %s", s, mn_last_error());
            CHECK(!config_diff(&a, &h, diff, sizeof diff), "set %d: transformers' keys alone give another config: %s", s,
                  diff);
        }
        CHECK(block != NULL, "set %d: no mesanet block", s);
        free(text);
    }
    tmp_remove(&td);
}

TEST(xlstm_hf_config_refusals_name_the_key) {
    TmpDir td;
    tmp_make(&td);
    struct {
        Kv kv[2];
        int n;
        const char *want[2];
    } bad[] = {
        {{{"use_bias", "true"}}, 1, {"use_bias", "expected false"}},
        {{{"tie_word_embeddings", "true"}}, 1, {"tie_word_embeddings", "expected false"}},
        {{{"add_out_norm", "false"}}, 1, {"add_out_norm", "expected true"}},
        {{{"eps", "1e-05"}}, 1, {"\"eps\"", "expected 1e-06"}},
        {{{"weight_mode", "\"stacked\""}}, 1, {"weight_mode", "\"fused\""}},
        {{{"embedding_dim", "32"}}, 1, {"embedding_dim", "hidden_size"}},
        {{{"num_blocks", "3"}}, 1, {"num_hidden_layers", "num_blocks"}},
        {{{"qk_dim_factor", "0.3"}}, 1, {"qk_dim_factor", "num_heads"}},
        {{{"gate_soft_cap", "0"}}, 1, {"gate_soft_cap", "null"}},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *text = hf_config(bad[i].kv, bad[i].n);
        char what[64];
        snprintf(what, sizeof what, "%s = %s", bad[i].kv[0].key, bad[i].kv[0].value);
        expect_refused(&td, what, text, bad[i].want, 2);
        free(text);
    }
    tmp_remove(&td);
}

// A random xlstm-architecture model saved by mesanet loads again to the same tensors and logits;
// the same weights written as transformers' weight_mode "fused" (qkv_opreact = q | k | v | o,
// ifgate_preact = i | f, proj_up_gate_z = gate | up, concatenated along the rows) and under the
// older query / key / value names load to the same model.
TEST(xlstm_arch_checkpoints_save_and_reload) {
    TmpDir td;
    tmp_make(&td);
    ModelConfig c;
    if (load_hf(&td, NULL, 0, &c)) die("%s", mn_last_error());
    Model *m;
    if (model_create(&m, &c, backend_cpu()) || model_init_params(m, 1)) die("%s", mn_last_error());
    fill_random(m, 11);
    char ours[320], fused[320], renamed[320], path[400];
    snprintf(ours, sizeof ours, "%s/ours", td.dir);
    snprintf(fused, sizeof fused, "%s/fused", td.dir);
    snprintf(renamed, sizeof renamed, "%s/renamed", td.dir);
    CHECK(!mn_mkdirs(ours) && !checkpoint_save_model(ours, m, 0), "%s", mn_last_error());
    Model *m2 = load(ours);
    check_same_tensors("saved and reloaded", m, m2);
    check_same_logits("saved and reloaded", m, m2);
    model_free(m2);

    for (int variant = 0; variant < 2; variant++) {
        const char *dir = variant ? renamed : fused;
        if (mn_mkdirs(dir)) die("%s", mn_last_error());
        Kv mode = {"weight_mode", variant ? "\"single\"" : "\"fused\""};
        char *text = hf_config(&mode, 1);
        snprintf(path, sizeof path, "%s/config.json", dir);
        write_text(path, text);
        free(text);
        StTensor t[64];
        char names[64][96];
        float *data[64];
        int n = 0;
        const char *embed[] = {"backbone.embeddings.weight", "backbone.out_norm.weight", "lm_head.weight"};
        for (int i = 0; i < 3; i++) {
            int k = model_find_param(m, embed[i]);
            snprintf(names[n], 96, "%s", embed[i]);
            data[n] = param_values(m, k);
            t[n] = (StTensor){names[n], ST_F32, m->specs[k].ndim, {m->specs[k].shape[0], m->specs[k].shape[1]}, data[n]};
            n++;
        }
        for (int l = 0; l < c.n_layers; l++) {
            // the tensors kept as they are, under their names (or the older spelling)
            static const char *const same[] = {"norm_mlstm.weight", "mlstm_layer.multihead_norm.weight",
                                               "mlstm_layer.out_proj.weight", "norm_ffn.weight", "ffn.proj_down.weight"};
            static const char *const single[] = {"mlstm_layer.q.weight", "mlstm_layer.k.weight", "mlstm_layer.v.weight",
                                                 "mlstm_layer.ogate_preact.weight", "mlstm_layer.igate_preact.weight",
                                                 "mlstm_layer.igate_preact.bias", "mlstm_layer.fgate_preact.weight",
                                                 "mlstm_layer.fgate_preact.bias", "ffn.proj_up_gate.weight",
                                                 "ffn.proj_up.weight"};
            static const char *const older[] = {"mlstm_layer.query.weight", "mlstm_layer.key.weight",
                                                "mlstm_layer.value.weight"};
            int nkeep = variant ? 15 : 5;
            for (int i = 0; i < nkeep; i++) {
                const char *suffix = i < 5 ? same[i] : single[i - 5];
                char ourname[96];
                snprintf(ourname, sizeof ourname, "backbone.blocks.%d.%s", l, suffix);
                int k = model_find_param(m, ourname);
                snprintf(names[n], 96, "backbone.blocks.%d.%s", l, i >= 5 && i < 8 ? older[i - 5] : suffix);
                data[n] = param_values(m, k);
                t[n] = (StTensor){names[n], ST_F32, m->specs[k].ndim, {m->specs[k].shape[0], m->specs[k].shape[1]}, data[n]};
                n++;
            }
            if (variant) continue;
            // fused: the single tensors concatenated along the rows
            struct {
                const char *name;
                int parts[4], nparts;
            } cat[] = {{"mlstm_layer.qkv_opreact.weight", {0, 1, 2, 3}, 4},
                       {"mlstm_layer.ifgate_preact.weight", {4, 6}, 2},
                       {"mlstm_layer.ifgate_preact.bias", {5, 7}, 2},
                       {"ffn.proj_up_gate_z.weight", {8, 9}, 2}};
            for (int f = 0; f < 4; f++) {
                int64_t rows = 0, cols = 1, ndim = 1;
                float *parts[4];
                size_t sizes[4];
                for (int p = 0; p < cat[f].nparts; p++) {
                    char ourname[96];
                    snprintf(ourname, sizeof ourname, "backbone.blocks.%d.%s", l, single[cat[f].parts[p]]);
                    int k = model_find_param(m, ourname);
                    parts[p] = param_values(m, k);
                    sizes[p] = m->specs[k].numel;
                    rows += m->specs[k].shape[0];
                    ndim = m->specs[k].ndim;
                    cols = ndim > 1 ? m->specs[k].shape[1] : 1;
                }
                data[n] = xcalloc((size_t)(rows * cols), sizeof(float));
                for (int p = 0, at = 0; p < cat[f].nparts; p++) {
                    memcpy(data[n] + at, parts[p], sizes[p] * sizeof(float));
                    at += (int)sizes[p];
                    free(parts[p]);
                }
                snprintf(names[n], 96, "backbone.blocks.%d.%s", l, cat[f].name);
                t[n] = (StTensor){names[n], ST_F32, (int)ndim, {rows, cols}, data[n]};
                n++;
            }
        }
        StMeta meta[] = {{"format", "pt"}};
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        if (st_write(path, t, n, meta, 1)) die("%s", mn_last_error());
        for (int i = 0; i < n; i++) free(data[i]);
        Model *m3 = load(dir);
        check_same_tensors(variant ? "query/key/value names" : "weight_mode fused", m, m3);
        check_same_logits(variant ? "query/key/value names" : "weight_mode fused", m, m3);
        // exported as ours: transformers' single layout and names again
        char out[400];
        snprintf(out, sizeof out, "%s-as-ours", dir);
        CHECK(!checkpoint_export(dir, out, "hf", NULL), "%s", mn_last_error());
        Model *m4 = load(out);
        check_same_logits("fused, exported as ours", m, m4);
        snprintf(path, sizeof path, "%s/model.safetensors", out);
        StFile *sf;
        CHECK(!st_open(path, &sf) && st_find(sf, "backbone.blocks.1.mlstm_layer.q.weight") >= 0 &&
                  st_find(sf, "backbone.blocks.1.mlstm_layer.qkv_opreact.weight") < 0,
              "the export is not in the single layout");
        st_close(sf);
        model_free(m4);
        model_free(m3);
    }
    model_free(m);
    tmp_remove(&td);
}

// ------------------------------------------------------------------------------ NX-AI's xLSTMLMModel

// NX-AI's config.json for a tiny model (embedding 16, blocks at slstm_at; mLSTM: proj_factor 2
// rounded to 8 -> 32 inner, 2 heads of 16; sLSTM: 2 heads of 8; feed-forward 1.3 x 16 rounded up
// to 8 -> 24), as json.dump(dataclasses.asdict(config)) writes it.
static char *nxai_config(int L, const char *slstm_at, const char *block_map, const char *backend, int tie,
                         const char *extra_top) {
    char *s = xcalloc(8192, 1);
    snprintf(s, 8192,
             "{\"mlstm_block\": {\"mlstm\": {\"proj_factor\": 2.0, \"round_proj_up_dim_up\": true, "
             "\"round_proj_up_to_multiple_of\": 8, \"_proj_up_dim\": 32, \"conv1d_kernel_size\": 4, "
             "\"qkv_proj_blocksize\": 4, \"num_heads\": 2, \"embedding_dim\": 16, \"bias\": false, \"dropout\": 0.0, "
             "\"context_length\": 64, \"_num_blocks\": %d, \"_inner_embedding_dim\": 32}, \"_num_blocks\": %d, "
             "\"_block_idx\": null}, "
             "\"slstm_block\": {\"slstm\": {\"hidden_size\": 16, \"num_heads\": 2, \"num_states\": 4, \"backend\": \"%s\", "
             "\"function\": \"slstm\", \"bias_init\": \"powerlaw_blockdependent\", \"recurrent_weight_init\": \"zeros\", "
             "\"_block_idx\": null, \"_num_blocks\": %d, \"num_gates\": 4, \"gradient_recurrent_cut\": false, "
             "\"gradient_recurrent_clipval\": null, \"forward_clipval\": null, \"batch_size\": 8, \"input_shape\": "
             "\"BSGNH\", \"internal_input_shape\": \"SBNGH\", \"output_shape\": \"BNSH\", \"constants\": {}, \"dtype\": "
             "\"bfloat16\", \"dtype_b\": \"float32\", \"dtype_r\": \"bfloat16\", \"dtype_w\": \"bfloat16\", \"dtype_g\": "
             "\"bfloat16\", \"dtype_s\": \"bfloat16\", \"dtype_a\": \"float32\", \"enable_automatic_mixed_precision\": "
             "true, \"initial_val\": 0.0, \"embedding_dim\": 16, \"conv1d_kernel_size\": 4, \"group_norm_weight\": true, "
             "\"dropout\": 0.0}, \"feedforward\": {\"proj_factor\": 1.3, \"round_proj_up_dim_up\": true, "
             "\"round_proj_up_to_multiple_of\": 8, \"_proj_up_dim\": 0, \"act_fn\": \"gelu\", \"embedding_dim\": -1, "
             "\"dropout\": 0.0, \"bias\": false, \"ff_type\": \"ffn_gated\", \"_num_blocks\": 1}, \"_num_blocks\": %d, "
             "\"_block_idx\": null}, "
             "\"context_length\": 64, \"num_blocks\": %d, \"embedding_dim\": 16, \"add_post_blocks_norm\": true, "
             "\"bias\": false, \"dropout\": 0.0, \"slstm_at\": %s, \"_block_map\": \"%s\", \"vocab_size\": 20, "
             "\"tie_weights\": %s, \"weight_decay_on_embedding\": false, \"add_embedding_dropout\": false%s}\n",
             L, L, backend, L, L, L, slstm_at, block_map, tie ? "true" : "false", extra_top ? extra_top : "");
    return s;
}

// The test's own conversion of our tensors (the model m, of NX-AI's config) into NX-AI's state
// dict, written to path: norm offsets (stored = effective - 1), proj_up = x | z and the MLP's
// proj_up = gate | up along the rows, the sLSTM's gate projections by NX-AI's module names (its
// "fgate" feeds the input gate), its recurrent kernel and biases in the vanilla or CUDA layout.
// tie: 0 both embedding and head, 1 token_embedding only, 2 lm_head only (safetensors keeps one).
static void write_nxai_weights(const char *path, Model *m, int cuda, int tie) {
    const ModelConfig *c = &m->cfg;
    StTensor t[128];
    char names[128][112];
    float *data[128];
    int n = 0;
    // (name, value, shape): adds one
#define ADD(nm, val, nd, s0, s1, s2)                                              \
    do {                                                                        \
        snprintf(names[n], 112, "%s", nm);                                      \
        data[n] = (val);                                                        \
        t[n] = (StTensor){names[n], ST_F32, nd, {s0, s1, s2}, data[n]};          \
        n++;                                                                    \
    } while (0)
    int64_t E = c->dim, I = c->n_heads * c->head_dim, H = c->slstm_heads, Dh = E / H, F = c->mlp_hidden;
    for (int l = 0; l < c->n_layers; l++) {
        char ours[112], theirs[112], o2[112];
        int slstm = !strcmp(mixer_at(c, l)->name, "slstm-block");
#define OURS(suffix) (snprintf(ours, sizeof ours, "model.layers.%d.%s", l, suffix), named(m, ours))
#define THEIRS(suffix) (snprintf(theirs, sizeof theirs, "xlstm_block_stack.blocks.%d.%s", l, suffix), theirs)
        float *v = OURS("attn_norm.weight");
        for (int64_t k = 0; k < E; k++) v[k] -= 1;
        ADD(THEIRS("xlstm_norm.weight"), v, 1, E, 0, 0);
        ADD(THEIRS("xlstm.conv1d.conv.weight"), OURS("xlstm.conv1d.weight"), 3, slstm ? E : I, 1, c->conv_size);
        ADD(THEIRS("xlstm.conv1d.conv.bias"), OURS("xlstm.conv1d.bias"), 1, slstm ? E : I, 0, 0);
        if (!slstm) {
            float *up = xcalloc((size_t)(2 * I * E), sizeof(float)), *x = OURS("xlstm.proj_up_x.weight");
            float *z = OURS("xlstm.proj_up_z.weight");
            memcpy(up, x, sizeof(float) * (size_t)(I * E));
            memcpy(up + I * E, z, sizeof(float) * (size_t)(I * E));
            free(x);
            free(z);
            ADD(THEIRS("xlstm.proj_up.weight"), up, 2, 2 * I, E, 0);
            static const char *const qkv[] = {"xlstm.q_proj.weight", "xlstm.k_proj.weight", "xlstm.v_proj.weight"};
            for (int q = 0; q < 3; q++) ADD(THEIRS(qkv[q]), OURS(qkv[q]), 3, I / 4, 4, 4);
            ADD(THEIRS("xlstm.mlstm_cell.igate.weight"), OURS("xlstm.igate.weight"), 2, c->n_heads, 3 * I, 0);
            ADD(THEIRS("xlstm.mlstm_cell.igate.bias"), OURS("xlstm.igate.bias"), 1, c->n_heads, 0, 0);
            ADD(THEIRS("xlstm.mlstm_cell.fgate.weight"), OURS("xlstm.fgate.weight"), 2, c->n_heads, 3 * I, 0);
            ADD(THEIRS("xlstm.mlstm_cell.fgate.bias"), OURS("xlstm.fgate.bias"), 1, c->n_heads, 0, 0);
            v = OURS("xlstm.outnorm.weight");
            for (int64_t k = 0; k < I; k++) v[k] -= 1;
            ADD(THEIRS("xlstm.mlstm_cell.outnorm.weight"), v, 1, I, 0, 0);
            ADD(THEIRS("xlstm.learnable_skip"), OURS("xlstm.learnable_skip"), 1, I, 0, 0);
            ADD(THEIRS("xlstm.proj_down.weight"), OURS("xlstm.proj_down.weight"), 2, E, I, 0);
            continue;
        }
        ADD(THEIRS("xlstm.fgate.weight"), OURS("xlstm.igate.weight"), 3, H, Dh, Dh);  // NX-AI's fgate: the input gate
        ADD(THEIRS("xlstm.igate.weight"), OURS("xlstm.fgate.weight"), 3, H, Dh, Dh);
        ADD(THEIRS("xlstm.zgate.weight"), OURS("xlstm.zgate.weight"), 3, H, Dh, Dh);
        ADD(THEIRS("xlstm.ogate.weight"), OURS("xlstm.ogate.weight"), 3, H, Dh, Dh);
        float *r = OURS("xlstm.slstm_cell.recurrent_kernel"), *rk = xcalloc((size_t)(H * Dh * 4 * Dh), sizeof(float));
        for (int64_t h = 0; h < H; h++)  // ours R[h][a][g][b]
            for (int64_t a = 0; a < Dh; a++)
                for (int64_t g = 0; g < 4; g++)
                    for (int64_t b = 0; b < Dh; b++) {
                        float x = r[((h * Dh + a) * 4 + g) * Dh + b];
                        if (cuda) rk[h * Dh * 4 * Dh + a * 4 * Dh + g * Dh + b] = x;  // [h][a][g Dh + b]
                        else rk[h * 4 * Dh * Dh + (g * Dh + b) * Dh + a] = x;          // [h][g Dh + b][a]
                    }
        free(r);
        if (cuda) ADD(THEIRS("xlstm.slstm_cell._recurrent_kernel_"), rk, 3, H, Dh, 4 * Dh);
        else ADD(THEIRS("xlstm.slstm_cell._recurrent_kernel_"), rk, 3, H, 4 * Dh, Dh);
        float *bias = OURS("xlstm.slstm_cell.bias"), *bk = xcalloc((size_t)(4 * E), sizeof(float));
        for (int64_t g = 0; g < 4; g++)  // ours [g][h][d]
            for (int64_t h = 0; h < H; h++)
                for (int64_t d = 0; d < Dh; d++)
                    bk[cuda ? (h * 4 + g) * Dh + d : (g * H + h) * Dh + d] = bias[(g * H + h) * Dh + d];
        free(bias);
        ADD(THEIRS("xlstm.slstm_cell._bias_"), bk, 1, 4 * E, 0, 0);
        v = OURS("xlstm.group_norm.weight");
        for (int64_t k = 0; k < E; k++) v[k] -= 1;
        ADD(THEIRS("xlstm.group_norm.weight"), v, 1, E, 0, 0);
        v = OURS("mlp_norm.weight");
        for (int64_t k = 0; k < E; k++) v[k] -= 1;
        ADD(THEIRS("ffn_norm.weight"), v, 1, E, 0, 0);
        float *up = xcalloc((size_t)(2 * F * E), sizeof(float)), *gate = OURS("mlp.gate_proj.weight");
        snprintf(o2, sizeof o2, "model.layers.%d.mlp.up_proj.weight", l);
        float *u = named(m, o2);
        memcpy(up, gate, sizeof(float) * (size_t)(F * E));
        memcpy(up + F * E, u, sizeof(float) * (size_t)(F * E));
        free(gate);
        free(u);
        ADD(THEIRS("ffn.proj_up.weight"), up, 2, 2 * F, E, 0);
        ADD(THEIRS("ffn.proj_down.weight"), OURS("mlp.down_proj.weight"), 2, E, F, 0);
#undef OURS
#undef THEIRS
    }
    float *v = named(m, "model.norm.weight");
    for (int64_t k = 0; k < E; k++) v[k] -= 1;
    ADD("xlstm_block_stack.post_blocks_norm.weight", v, 1, E, 0, 0);
    int64_t V = c->vocab_size;
    if (!c->tie_embeddings || tie != 2) ADD("token_embedding.weight", named(m, "model.embeddings.weight"), 2, V, E, 0);
    if (!c->tie_embeddings) ADD("lm_head.weight", named(m, "lm_head.weight"), 2, V, E, 0);
    else if (tie != 1) ADD("lm_head.weight", named(m, "model.embeddings.weight"), 2, V, E, 0);
#undef ADD
    StMeta meta[] = {{"format", "pt"}};
    if (st_write(path, t, n, meta, 1)) die("%s", mn_last_error());
    for (int i = 0; i < n; i++) free(data[i]);
}

// A folder of NX-AI's for the random model m of config text `config`.
static void make_nxai_folder(const char *dir, const char *config, Model *m, int cuda, int tie) {
    char path[400];
    if (mn_mkdirs(dir)) die("%s", mn_last_error());
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_text(path, config);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_nxai_weights(path, m, cuda, tie);
}

TEST(xlstm_nxai_config_reads_as_the_paper_blocks) {
    TmpDir td;
    tmp_make(&td);
    char *text = nxai_config(3, "[1]", "0,1,0", "cuda", 0, NULL);
    const char *path = tmp_path(&td, "config.json");
    write_text(path, text);
    free(text);
    ModelConfig c;
    CHECK(!config_load(&c, path), "%s", mn_last_error());
    CHECK(!strcmp(c.arch, "paper") && !strcmp(c.mixer, "mlstm-block,slstm-block,mlstm-block") && c.n_layers == 3 && c.dim == 16 &&
              c.n_heads == 2 && c.head_dim == 16 && c.slstm_heads == 2 && c.mlp_hidden == 24 && c.conv_size == 4 &&
              c.vocab_size == 20 && !strcmp(c.norm, "layernorm") && c.norm_eps == 1e-5f && !c.embed_scale &&
              c.logit_cap == 0 && !c.tie_embeddings && c.seq_len == 64,
          "read: arch %s mixer %s L %d D %d H %d Dh %d sH %d F %d K %d V %d norm %s %g", c.arch, c.mixer, c.n_layers,
          c.dim, c.n_heads, c.head_dim, c.slstm_heads, c.mlp_hidden, c.conv_size, c.vocab_size, c.norm,
          (double)c.norm_eps);
    // the xLSTM paper's xLSTM[7:1] at 125M: sLSTM at 3 and 20 of 24 blocks, as runs; an alternation
    // of 48 blocks too long for the field as its period
    struct {
        int L;
        const char *at, *want;
    } pat[] = {
        {24, "[3, 20]", "mlstm-block*3,slstm-block,mlstm-block*16,slstm-block,mlstm-block*3"},
        {48, "[1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31, 33, 35, 37, 39, 41, 43, 45, 47]",
         "mlstm-block,slstm-block"},
        {4, "[]", "mlstm-block"},
        {5, "\"all\"", "slstm-block"},
    };
    for (size_t i = 0; i < sizeof pat / sizeof pat[0]; i++) {
        text = nxai_config(pat[i].L, pat[i].at, "", "vanilla", 0, NULL);  // slstm_at decides, not the map
        write_text(path, text);
        free(text);
        CHECK(!config_load(&c, path) && !strcmp(c.mixer, pat[i].want) && c.n_layers == pat[i].L,
              "slstm_at %s of %d: mixer \"%s\", expected \"%s\": %s", pat[i].at, pat[i].L, c.mixer, pat[i].want,
              mn_last_error());
    }
    tmp_remove(&td);
}

TEST(xlstm_nxai_config_refusals_name_the_key) {
    TmpDir td;
    tmp_make(&td);
    struct {
        const char *from, *to, *want[2];
    } bad[] = {
        {"\"add_post_blocks_norm\": true", "\"add_post_blocks_norm\": false", {"add_post_blocks_norm", "expected true"}},
        {"\"dropout\": 0.0, \"slstm_at\"", "\"dropout\": 0.0, \"slstm_at\"", {NULL, NULL}},  // (accepted: ignored)
        {"\"bias\": false, \"dropout\": 0.0, \"slstm_at\"", "\"bias\": true, \"dropout\": 0.0, \"slstm_at\"",
         {"\"bias\"", "expected false"}},
        {"\"qkv_proj_blocksize\": 4", "\"qkv_proj_blocksize\": 8", {"mlstm_block.mlstm.qkv_proj_blocksize", "expected 4"}},
        {"\"embedding_dim\": 16, \"conv1d_kernel_size\": 4", "\"embedding_dim\": 16, \"conv1d_kernel_size\": 0",
         {"slstm_block.slstm.conv1d_kernel_size", "without its convolution"}},
        {"\"embedding_dim\": 16, \"conv1d_kernel_size\": 4", "\"embedding_dim\": 16, \"conv1d_kernel_size\": 3",
         {"differs", "conv_size"}},
        {"\"act_fn\": \"gelu\"", "\"act_fn\": \"swish\"", {"slstm_block.feedforward.act_fn", "\"gelu\""}},
        {"\"gradient_recurrent_clipval\": null", "\"gradient_recurrent_clipval\": 1.0",
         {"gradient_recurrent_clipval", "expected null"}},
        {"\"backend\": \"cuda\"", "\"backend\": \"triton\"", {"slstm_block.slstm.backend", "\"vanilla\""}},
        {"\"slstm_at\": [1]", "\"slstm_at\": [3]", {"slstm_at", "expected 0 to 2"}},
        {"\"function\": \"slstm\"", "\"function\": \"lstm\"", {"slstm_block.slstm.function", "\"slstm\""}},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *text = nxai_config(3, "[1]", "0,1,0", "cuda", 0, NULL);
        char *at = strstr(text, bad[i].from);
        if (!at) die("fixture: no '%s'", bad[i].from);
        char *rest = xcalloc(strlen(text) + 64, 1);
        sprintf(rest, "%.*s%s%s", (int)(at - text), text, bad[i].to, at + strlen(bad[i].from));
        if (bad[i].want[0]) {
            expect_refused(&td, bad[i].to, rest, bad[i].want, 2);
        } else {
            ModelConfig c;
            const char *path = tmp_path(&td, "ok.json");
            write_text(path, rest);
            CHECK(!config_load(&c, path), "%s: %s", bad[i].to, mn_last_error());
        }
        free(rest);
        free(text);
    }
    // no feed-forward part in the sLSTM blocks
    char *text = nxai_config(3, "[1]", "0,1,0", "cuda", 0, NULL);
    char *ff = strstr(text, "\"feedforward\": {");
    char *end = ff ? strstr(ff, "}, \"_num_blocks\"") : NULL;
    if (!end) die("fixture: no feedforward");
    char *cut = xcalloc(strlen(text) + 1, 1);
    sprintf(cut, "%.*s\"feedforward\": null%s", (int)(ff - text), text, end + 1);
    const char *want[] = {"slstm_block.feedforward", "null"};
    expect_refused(&td, "feedforward null", cut, want, 2);
    free(cut);
    free(text);
    tmp_remove(&td);
}

// An NX-AI folder (written by the test from a random model's weights, converted by its own code)
// loads to exactly those weights and the same logits, in both sLSTM layouts and with a tied head
// saved under either name or both.
TEST(xlstm_nxai_folders_load_to_the_weights_written) {
    TmpDir td;
    tmp_make(&td);
    struct {
        int tie, cuda, tie_kept;
        const char *backend;
    } cases[] = {{0, 0, 0, "vanilla"}, {0, 1, 0, "cuda"}, {1, 1, 1, "cuda"}, {1, 0, 2, "vanilla"}, {1, 0, 0, "vanilla"}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char *text = nxai_config(3, "[1]", "0,1,0", cases[k].backend, cases[k].tie, NULL);
        const char *cpath = tmp_path(&td, "reference.json");
        write_text(cpath, text);
        ModelConfig c;
        if (config_load(&c, cpath)) die("%s", mn_last_error());
        Model *m;
        if (model_create(&m, &c, backend_cpu()) || model_init_params(m, 1)) die("%s", mn_last_error());
        fill_random(m, 100 + k);
        char dir[320], what[96];
        snprintf(dir, sizeof dir, "%s/nxai-%zu", td.dir, k);
        snprintf(what, sizeof what, "%s layout, %s", cases[k].backend,
                 !cases[k].tie ? "untied" : cases[k].tie_kept == 1 ? "tied (token_embedding only)"
                                          : cases[k].tie_kept == 2 ? "tied (lm_head only)" : "tied (both names)");
        make_nxai_folder(dir, text, m, cases[k].cuda, cases[k].tie_kept);
        free(text);
        Model *got = load(dir);
        check_same_tensors(what, m, got);
        check_same_logits(what, m, got);
        model_free(got);
        model_free(m);
    }
    tmp_remove(&td);
}

// Ours exported as NX-AI's (both layouts) and NX-AI's exported as ours load again to the same
// weights and logits; the written config.json is asdict's (the keys NX-AI's dacite reading wants,
// the block map, the backend); what NX-AI's model cannot hold is refused by name.
TEST(xlstm_nxai_export_round_trips) {
    TmpDir td;
    tmp_make(&td);
    char *text = nxai_config(3, "[1]", "0,1,0", "vanilla", 0, NULL);
    char src[320], path[400];
    snprintf(src, sizeof src, "%s/src", td.dir);
    const char *cpath = tmp_path(&td, "reference.json");
    write_text(cpath, text);
    ModelConfig c;
    if (config_load(&c, cpath)) die("%s", mn_last_error());
    Model *m;
    if (model_create(&m, &c, backend_cpu()) || model_init_params(m, 1)) die("%s", mn_last_error());
    fill_random(m, 7);
    make_nxai_folder(src, text, m, 0, 0);
    free(text);
    static const char *const layouts[] = {"vanilla", "cuda"};
    for (int k = 0; k < 2; k++) {
        char out[400], ours[400];
        snprintf(out, sizeof out, "%s/out-%s", td.dir, layouts[k]);
        snprintf(ours, sizeof ours, "%s/ours-%s", td.dir, layouts[k]);
        CHECK(!checkpoint_export(src, ours, "hf", NULL), "%s", mn_last_error());
        CHECK(!checkpoint_export(ours, out, "nxai", layouts[k]), "%s", mn_last_error());
        Model *a = load(ours), *b = load(out);
        check_same_tensors("NX-AI exported as ours", m, a);
        check_same_logits("NX-AI exported as ours", m, a);
        check_same_tensors("ours exported as NX-AI", m, b);
        check_same_logits("ours exported as NX-AI", m, b);
        model_free(a);
        model_free(b);
        snprintf(path, sizeof path, "%s/config.json", out);
        char *cfg = read_text(path);
        char backend[64];
        snprintf(backend, sizeof backend, "\"backend\": \"%s\"", layouts[k]);
        static const char *const keys[] = {"\"_block_map\": \"0,1,0\"", "\"slstm_at\": [1]", "\"num_blocks\": 3",
                                           "\"embedding_dim\": 16", "\"_inner_embedding_dim\": 32",
                                           "\"qkv_proj_blocksize\": 4", "\"tie_weights\": false", "\"vocab_size\": 20",
                                           "\"act_fn\": \"gelu\"", "\"context_length\": 64"};
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
            CHECK(strstr(cfg, keys[i]), "%s: config.json lacks %s:\n%s", layouts[k], keys[i], cfg);
        CHECK(strstr(cfg, backend), "%s: config.json lacks %s", layouts[k], backend);
        free(cfg);
        snprintf(path, sizeof path, "%s/model.safetensors", out);
        StFile *f;
        int64_t want[3] = {2, k ? 8 : 32, k ? 32 : 8};
        const int64_t *shape = NULL;
        int nd = 0, i = -1;
        if (!st_open(path, &f) && (i = st_find(f, "xlstm_block_stack.blocks.1.xlstm.slstm_cell._recurrent_kernel_")) >= 0)
            st_info(f, i, NULL, NULL, &nd, &shape);
        CHECK(i >= 0 && nd == 3 && !memcmp(shape, want, sizeof want), "%s: the recurrent kernel's shape", layouts[k]);
        CHECK(i < 0 || (st_find(f, "xlstm_block_stack.blocks.0.xlstm.proj_up.weight") >= 0 &&
                        st_find(f, "token_embedding.weight") >= 0 && st_find(f, "lm_head.weight") >= 0 &&
                        st_find(f, "model.embeddings.weight") < 0),
              "%s: NX-AI's names", layouts[k]);
        st_close(f);
    }
    // through the command line, and what NX-AI cannot hold refused by name
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "export %s %s/cli --format nxai --slstm-layout cuda", src, td.dir);
    ToolRun r = tool_run(&td, cmd);
    CHECK(r.rc == 0 && strstr(r.out, "nxai format"), "mesanet %s: %d\n%s%s", cmd, r.rc, r.out, r.err);
    tool_run_free(&r);
    snprintf(cmd, sizeof cmd, "export %s %s/cli2 --format onnx", src, td.dir);
    r = tool_run(&td, cmd);
    CHECK(r.rc != 0 && strstr(r.err, "\"onnx\"") && strstr(r.err, "\"nxai\""), "mesanet %s: %d\n%s", cmd, r.rc, r.err);
    tool_run_free(&r);
    ModelConfig x;
    if (config_preset(&x, "tiny")) die("%s", mn_last_error());
    x.vocab_size = 20;
    Model *mx;
    char xdir[320], xout[400];
    snprintf(xdir, sizeof xdir, "%s/mesa", td.dir);
    snprintf(xout, sizeof xout, "%s/mesa-nxai", td.dir);
    if (model_create(&mx, &x, backend_cpu()) || model_init_params(mx, 1) || mn_mkdirs(xdir) ||
        checkpoint_save_model(xdir, mx, 0))
        die("%s", mn_last_error());
    model_free(mx);
    CHECK(checkpoint_export(xdir, xout, "nxai", NULL) && strstr(mn_last_error(), "layernorm"),
          "a Mesa model exported as NX-AI's: %s", mn_last_error());
    CHECK(checkpoint_export(src, src, "hf", NULL) && strstr(mn_last_error(), "own directory"),
          "export over its source: %s", mn_last_error());
    model_free(m);
    tmp_remove(&td);
}

// A tensor NX-AI's model does not have, or one of another shape, is refused naming it.
TEST(xlstm_nxai_weights_refused_by_name) {
    TmpDir td;
    tmp_make(&td);
    char *text = nxai_config(3, "[1]", "0,1,0", "vanilla", 0, NULL);
    const char *cpath = tmp_path(&td, "reference.json");
    write_text(cpath, text);
    ModelConfig c;
    if (config_load(&c, cpath)) die("%s", mn_last_error());
    Model *m;
    if (model_create(&m, &c, backend_cpu()) || model_init_params(m, 1)) die("%s", mn_last_error());
    fill_random(m, 3);
    char dir[320], path[400];
    snprintf(dir, sizeof dir, "%s/nxai", td.dir);
    make_nxai_folder(dir, text, m, 0, 0);
    free(text);
    // the state dict again, with an extra tensor, then with a recurrent kernel of neither layout
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    StFile *f;
    if (st_open(path, &f)) die("%s", mn_last_error());
    int n = st_count(f);
    StTensor *t = xcalloc((size_t)n + 1, sizeof(StTensor));
    float **vals = xcalloc((size_t)n + 1, sizeof(float *));
    for (int i = 0; i < n; i++) {
        const char *name;
        const int64_t *shape;
        StDtype dt;
        st_info(f, i, &name, &dt, &t[i].ndim, &shape);
        int64_t numel = 1;
        for (int d = 0; d < t[i].ndim; d++) numel *= (t[i].shape[d] = shape[d]);
        vals[i] = xcalloc((size_t)numel, sizeof(float));
        if (st_read_f32(f, name, vals[i], numel, t[i].ndim, shape)) die("%s", mn_last_error());
        t[i].name = strdup(name);
        t[i].dtype = ST_F32;
        t[i].data = vals[i];
    }
    st_close(f);
    float extra[4] = {0};
    t[n] = (StTensor){"xlstm_block_stack.blocks.0.xlstm.proj_up.bias", ST_F32, 1, {4}, extra};
    StMeta meta[] = {{"format", "pt"}};
    if (st_write(path, t, n + 1, meta, 1)) die("%s", mn_last_error());
    Model *got = NULL;
    CHECK(checkpoint_load_model(dir, backend_cpu(), &got) && strstr(mn_last_error(), "proj_up.bias") &&
              strstr(mn_last_error(), "does not belong"),
          "an extra tensor: %s", mn_last_error());
    for (int i = 0; i < n; i++)
        if (strstr(t[i].name, "_recurrent_kernel_")) {  // 2 x 16 x 16: neither layout
            t[i].shape[1] = 16;
            t[i].shape[2] = 16;
        }
    if (st_write(path, t, n, meta, 1)) die("%s", mn_last_error());
    CHECK(checkpoint_load_model(dir, backend_cpu(), &got) && strstr(mn_last_error(), "_recurrent_kernel_") &&
              strstr(mn_last_error(), "vanilla") && strstr(mn_last_error(), "cuda"),
          "a kernel of neither layout: %s", mn_last_error());
    for (int i = 0; i < n; i++) {
        free((char *)t[i].name);
        free(vals[i]);
    }
    free(t);
    free(vals);
    model_free(m);
    tmp_remove(&td);
}
