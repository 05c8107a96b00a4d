// The parameter-matched presets "SIZE-MIXER" (presets.h): each validates, loads by name and from
// JSON, round-trips through config.json, keeps its size's backbone, and its parameter count is
// the nearest the MLP width's granularity allows to the Mesa model's of that size: within half a
// step, 3 D n_layers CONFIG_MATCH_STEP / 2 parameters (125m: 442,368, 0.34%; demo: 36,864,
// 1.4%; 400m: 1,179,648, 0.31%). Unknown names are refused with the accepted forms.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "mixers/mixer.h"
#include "model/model.h"
#include "model/presets.h"
#include "test.h"
#include "tmpdir.h"
#include "tool_run.h"

static const char *const sizes[] = {"demo", "125m", "400m"};
#define NSIZES (sizeof sizes / sizeof sizes[0])

// Saves c, loads it again and checks that every field came back (as tests/test_robust.c).
static void round_trip(TmpDir *t, const ModelConfig *c, const char *what) {
    const char *path = tmp_path(t, "config.json");
    ModelConfig back;
    memset(&back, 0x5a, sizeof back);
    int s = config_save(c, path);
    CHECK(!s, "%s: save: %s", what, mn_last_error());
    if (s) return;
    s = config_load(&back, path);
    CHECK(!s, "%s: the saved config does not load: %s", what, mn_last_error());
    if (s) return;
    char diff[256];
    CHECK(!config_diff(c, &back, diff, sizeof diff), "%s: a field changed in the round trip: %s", what, diff);
    CHECK(!memcmp(c, &back, sizeof back), "%s: the loaded config differs from the saved one", what);
}

TEST(presets_matched_validate_load_and_round_trip) {
    TmpDir t;
    tmp_make(&t);
    int n = 0;
    for (size_t i = 0; i < NSIZES; i++)
        for (int j = 0; mixer_all[j]; j++) {
            char name[64];
            snprintf(name, sizeof name, "%s-%s", sizes[i], mixer_all[j]->name);
            ModelConfig c, byload, byjson;
            int s = config_preset(&c, name);
            CHECK(!s, "%s: %s", name, mn_last_error());
            if (s) continue;
            CHECK(!config_validate(&c, name), "%s: %s", name, mn_last_error());
            CHECK(!strcmp(c.mixer, mixer_all[j]->name), "%s: mixer '%s'", name, c.mixer);
            // By name through config_load (as --config takes it), and as a JSON file's "preset".
            CHECK(!config_load(&byload, name) && !memcmp(&c, &byload, sizeof c), "%s: config_load: %s", name,
                  mn_last_error());
            char json[128];
            snprintf(json, sizeof json, "{\"preset\": \"%s\"}", name);
            const char *path = tmp_path(&t, "in.json");
            write_bytes(path, json, strlen(json));
            CHECK(!config_load(&byjson, path) && !memcmp(&c, &byjson, sizeof c), "%s: as a JSON preset: %s", name,
                  mn_last_error());
            round_trip(&t, &c, name);
            c.vocab_size = 4096;  // demo's is 0 (from the data): also with a vocabulary set
            round_trip(&t, &c, name);
            n++;
        }
    test_note("%d matched presets (%zu sizes x 7 mixers) validate, load and round-trip", n, NSIZES);
    tmp_remove(&t);
}

// The backbone is the size's: only the mixer, the MLP width (and gdn-paper's own output gate) differ;
// SIZE-mesa is SIZE itself.
TEST(presets_matched_keep_the_backbone) {
    for (size_t i = 0; i < NSIZES; i++) {
        ModelConfig ref, mesa;
        CHECK(!config_preset(&ref, sizes[i]), "%s", mn_last_error());
        char name[64];
        snprintf(name, sizeof name, "%s-mesa", sizes[i]);
        CHECK(!config_preset(&mesa, name) && !memcmp(&ref, &mesa, sizeof ref), "%s differs from %s", name, sizes[i]);
        for (int j = 0; mixer_all[j]; j++) {
            ModelConfig c;
            snprintf(name, sizeof name, "%s-%s", sizes[i], mixer_all[j]->name);
            if (config_preset(&c, name)) continue;  // (the test above reports it)
            CHECK(c.mlp_hidden % CONFIG_MATCH_STEP == 0, "%s: MLP %d not a multiple of %d", name, c.mlp_hidden,
                  CONFIG_MATCH_STEP);
            CHECK(c.output_gate == (mixer_all[j] == &mixer_gdn_paper), "%s: output_gate %d", name, c.output_gate);
            CHECK(mixer_all[j] != &mixer_swa || (c.window >= 1 && c.window < c.seq_len), "%s: window %d for a context of %d",
                  name, c.window, c.seq_len);
            // the size preset with the mixer swapped (what it does not read reset), its own settings
            // (the preset hook) and the matched width (or depth, for a block without an MLP): nothing
            // else moved
            ModelConfig r = ref;
            strcpy(r.mixer, c.mixer);
            if (mixer_all[j]->preset) mixer_all[j]->preset(&r);
            config_normalize(&r);
            r.mlp_hidden = c.mlp_hidden;
            if (mixer_all[j]->block.ffn == FFN_NONE) r.n_layers = c.n_layers;
            char diff[256];
            CHECK(!config_diff(&r, &c, diff, sizeof diff) && !memcmp(&r, &c, sizeof r), "%s: the backbone changed: %s",
                  name, diff);
        }
    }
}

static size_t count(const ModelConfig *c) {
    size_t total = 0;
    CHECK(!config_param_count(c, &total, NULL, NULL), "%s", mn_last_error());
    return total;
}

// Within half a step of the MLP width of Mesa's count, and no other multiple of the step nearer.
TEST(presets_matched_parameter_counts) {
    for (size_t i = 0; i < NSIZES; i++) {
        ModelConfig ref;
        CHECK(!config_preset(&ref, sizes[i]), "%s", mn_last_error());
        size_t target = count(&ref);
        double tol = 3.0 * ref.dim * ref.n_layers * CONFIG_MATCH_STEP / 2;  // half a step of the MLP width
        for (int j = 0; mixer_all[j]; j++) {
            ModelConfig c;
            char name[64];
            snprintf(name, sizeof name, "%s-%s", sizes[i], mixer_all[j]->name);
            if (config_preset(&c, name)) continue;
            double d = (double)count(&c) - (double)target;
            if (mixer_all[j]->block.ffn == FFN_NONE) {  // matched by depth: no other depth nearer
                for (int s = -1; s <= 1; s += 2) {
                    ModelConfig o = c;
                    o.n_layers += s;
                    double e = (double)count(&o) - (double)target;
                    CHECK(e * e >= d * d, "%s: %d blocks (%+.0f) are nearer than %d (%+.0f)", name, o.n_layers, e,
                          c.n_layers, d);
                }
                test_note("%-20s %2d blocks %11zu parameters  %+.3f%% of Mesa's (by depth)", name, c.n_layers, count(&c),
                          100 * d / (double)target);
                continue;
            }
            CHECK(d >= -tol && d <= tol, "%s: %+.0f parameters from Mesa's %zu, tolerance %.0f", name, d, target, tol);
            for (int s = -1; s <= 1; s += 2) {
                ModelConfig o = c;
                o.mlp_hidden += s * CONFIG_MATCH_STEP;
                double e = (double)count(&o) - (double)target;
                CHECK(e * e >= d * d, "%s: MLP %d (%+.0f) is nearer than %d (%+.0f)", name, o.mlp_hidden, e,
                      c.mlp_hidden, d);
            }
            test_note("%-20s MLP %5d  %11zu parameters  %+.3f%% of Mesa's (tolerance %.2f%%)", name, c.mlp_hidden,
                      count(&c), 100 * d / (double)target, 100 * tol / (double)target);
        }
    }
}

// The counts against the tensors' shapes written out by hand (shell.h, gdn_paper.c), at 125m:
// D = 768, H = 6, Dk = Dv = 128, Q = V = 768, K = 4, 12 blocks, per-head o_norm (paper).
TEST(presets_matched_mixer_counts_by_hand) {
    const long D = 768, H = 6, Q = 768, K = 4, L = 12;
    long gate = H * D + H;                                   // W_a, b_a (and W_b, b_b)
    long shell = 3 * Q * D + 2 * Q * K + Q + D * Q;         // q, k, v, q/k convs, o_norm, o_proj
    const struct {
        const char *mixer;
        long per_block;
    } want[] = {
        {"mesa", shell + 2 * gate + Q},                      // + lambda [H Dk]
        {"mamba2", shell + gate},                            // no b_proj
        {"gla", shell + 2 * gate},
        {"deltanet", shell + gate},                          // no a_proj
        {"gdn", shell + 2 * gate},
        {"gdn-paper", 3 * Q * D + 2 * H * D + 2 * H + 3 * Q * K + Q * D + Q + D * Q},  // a, b (no biases), A_log,
                                                                                     // dt_bias, v conv, g_proj
        {"deltanet-paper", 3 * Q * D + H * D + 3 * Q * K + Q + D * Q},                 // b, v conv
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        ModelConfig c;
        char name[64];
        snprintf(name, sizeof name, "125m-%s", want[i].mixer);
        size_t mixers = 0, mlps = 0;
        CHECK(!config_preset(&c, name) && !config_param_count(&c, NULL, &mixers, &mlps), "%s: %s", name,
              mn_last_error());
        CHECK((long)mixers == L * want[i].per_block, "%s: mixers %zu, by hand %ld", name, mixers, L * want[i].per_block);
        CHECK((long)mlps == L * 3 * D * c.mlp_hidden, "%s: MLPs %zu, by hand %ld", name, mlps, L * 3 * D * c.mlp_hidden);
    }
}

// The xLSTM paper's models as its Table 5 counts them (xlstm-notes.md 3.6: vocabulary 50304,
// untied): 163.7M (xLSTM[7:1], 125M), 163.8M ([1:0]), 408.4M ([7:1], 350M); and the per-block
// counts at D = 1024 worked out there from NX-AI's code: 6,380,552 (mLSTM) and 6,238,208 (sLSTM).
TEST(presets_xlstm_paper_counts) {
    struct {
        const char *name;
        double millions;
    } want[] = {{"xlstm-125m", 163.7}, {"xlstm10-125m", 163.8}, {"xlstm-350m", 408.4}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        ModelConfig c;
        CHECK(!config_preset(&c, want[i].name), "%s", mn_last_error());
        double m = (double)count(&c) / 1e6;
        CHECK(fabs(m - want[i].millions) < 0.05, "%s: %.2fM parameters, the paper's %.1fM", want[i].name, m,
              want[i].millions);
    }
    ModelConfig c;
    CHECK(!config_preset(&c, "xlstm-350m"), "%s", mn_last_error());
    const char *kinds[2] = {"mlstm-block", "slstm-block"};
    const size_t per_block[2] = {6380552, 6238208};
    for (int k = 0; k < 2; k++) {
        ModelConfig one = c, none = c;
        snprintf(one.mixer, sizeof one.mixer, "%s", kinds[k]);
        one.n_layers = 2;
        snprintf(none.mixer, sizeof none.mixer, "%s", kinds[k]);
        none.n_layers = 1;
        size_t block = count(&one) - count(&none);
        CHECK(block == per_block[k], "%s at D 1024: %zu parameters a block, the paper's %zu", kinds[k], block,
              per_block[k]);
    }
}

TEST(presets_unknown_names_are_refused) {
    const char *const bad[] = {"125m-foo", "1b-gdn", "125m-", "125m-gdn,mesa", "demo-GDN", "nope", "gdn", "125m_gdn",
                               "tiny-gdn", "-gdn"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ModelConfig c;
        int s = config_preset(&c, bad[i]);
        const char *e = mn_last_error();
        CHECK(s == MN_ERR_ARG, "'%s' accepted (%d)", bad[i], s);
        CHECK(strstr(e, bad[i]) && strstr(e, "SIZE-MIXER") && strstr(e, "demo, 125m, 400m") &&
                  strstr(e, "mesa, mamba2, gla, deltanet, gdn, gdn-paper, deltanet-paper"),
              "'%s': the message does not name it and the accepted forms: %s", bad[i], e);
        s = config_load(&c, bad[i]);
        CHECK(s == MN_ERR_ARG && strstr(mn_last_error(), "SIZE-MIXER"), "config_load '%s': %d %s", bad[i], s,
              mn_last_error());
    }
    ModelConfig c;
    CHECK(config_matched(&c, "1b", "gdn") == MN_ERR_ARG && strstr(mn_last_error(), "demo, 125m, 400m"), "1b: %s",
          mn_last_error());
    CHECK(config_matched(&c, "125m", "gdn,mesa") == MN_ERR_ARG && strstr(mn_last_error(), "unknown mixer"), "%s",
          mn_last_error());
}

// `mesanet info --matched SIZE` prints one line per mixer with its preset's name and count.
TEST(presets_info_matched_table) {
    char cmd[1200], out[8192];
    const char *exe = tool_run_path();
    CHECK(exe != NULL, "the mesanet binary is not built beside this test binary");
    if (!exe) return;
    for (size_t i = 0; i < NSIZES; i++) {
        snprintf(cmd, sizeof cmd, "%s info --matched %s 2>&1", exe, sizes[i]);
        FILE *p = popen(cmd, "r");
        CHECK(p, "cannot run %s", cmd);
        if (!p) continue;
        size_t n = fread(out, 1, sizeof out - 1, p);
        out[n] = 0;
        int rc = pclose(p);
        CHECK(rc == 0, "%s: exit status %d\n%s", cmd, rc, out);
        for (int j = 0; mixer_all[j]; j++) {
            char name[64], line[160];
            ModelConfig c;
            snprintf(name, sizeof name, "%s-%s", sizes[i], mixer_all[j]->name);
            if (config_preset(&c, name)) continue;
            snprintf(line, sizeof line, " %s ", name);
            const char *at = strstr(out, line);
            CHECK(at, "%s: no line for %s:\n%s", cmd, name, out);
            if (!at) continue;
            snprintf(line, sizeof line, " %zu ", count(&c));
            const char *eol = strchr(at, '\n'), *num = strstr(at, line);
            CHECK(num && (!eol || num < eol), "%s: %s's line lacks its count%s", cmd, name, line);
        }
    }
    snprintf(cmd, sizeof cmd, "%s info --matched 1b >/dev/null 2>&1", exe);
    CHECK(system(cmd) != 0, "info --matched 1b accepted");
    snprintf(cmd, sizeof cmd, "%s info 125m-gdn >/dev/null 2>&1", exe);
    CHECK(system(cmd) == 0, "info 125m-gdn refused");
}

// The xLSTM blocks' sizes that cannot be built are refused, naming the field and what it needs.
TEST(presets_xlstm_bad_sizes_are_refused) {
    struct {
        const char *mixer;
        int dim, heads, head_dim, slstm_heads;
        const char *norm;
        const char *msg;
    } bad[] = {
        {"mlstm-block", 64, 3, 5, 4, "layernorm", "inner width n_heads x head_dim = 3 x 5 must be a multiple of 4"},
        {"slstm-block", 66, 4, 16, 4, "layernorm", "slstm-block's heads (slstm_heads = 4) must divide dim = 66"},
        {"mlstm-block*3,slstm-block", 66, 4, 16, 4, "layernorm", "must divide dim = 66"},
        {"mlstm-block", 64, 4, 16, 4, "groupnorm", "norm = \"groupnorm\", expected \"rmsnorm\" or \"layernorm\""},
        {"mlstm-block*0", 64, 4, 16, 4, "layernorm", "repeats a name by \"*N\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ModelConfig c;
        CHECK(!config_preset(&c, "tiny"), "%s", mn_last_error());
        snprintf(c.mixer, sizeof c.mixer, "%s", bad[i].mixer);
        c.dim = bad[i].dim, c.n_heads = bad[i].heads, c.head_dim = bad[i].head_dim, c.slstm_heads = bad[i].slstm_heads;
        c.n_layers = 4;
        snprintf(c.norm, sizeof c.norm, "%s", bad[i].norm);
        int st = config_validate(&c, "cfg");
        CHECK(st == MN_ERR_ARG && strstr(mn_last_error(), bad[i].msg), "%s: status %d, '%s' lacks '%s'", bad[i].mixer, st,
              mn_last_error(), bad[i].msg);
    }
    // the xlstm architecture is transformers' xLSTM: mlstm-large blocks and RMSNorm only
    ModelConfig c;
    CHECK(!config_preset(&c, "xlstm-7b-160m"), "%s", mn_last_error());
    snprintf(c.mixer, sizeof c.mixer, "mlstm-large,mesa");
    CHECK(config_validate(&c, "cfg") == MN_ERR_ARG && strstr(mn_last_error(), "arch \"xlstm\""), "%s", mn_last_error());
}
