// The conformance battery: every registered mixer (mixer_all, walked, so that a mixer is covered the
// day it is registered) in the variants of its settings that matter, and patterns of them
// (mixer_case.c: mc_rows), through the checks every mixer passes: those of
// docs/spec/mixers.md section 8, and more:
//   conformance_forms            recurrent (token by token) == chunkwise / parallel
//   conformance_layer_gradients  the layer's backward == finite differences (float64)
//   conformance_model_gradients  the whole model's backward == finite differences (float64)
//   conformance_decode           prefill + decode == one forward (float64 and float32)
//   conformance_state            a fixed-size decoding state, state_floats as allocated
//   conformance_cpu_vs_ref       float32 CPU == float64 reference on awkward sizes
//   conformance_trains           a tiny model learns a batch
//   conformance_refused          a backend without the mixer's core family refuses it by name
// Each test walks all the cases, so `run_tests conformance_decode` runs one check for every mixer,
// and a failure names the case (mixer and variant). The families' own tests keep what is
// specific to them; tests/cuda/test_cuda_conformance.c walks the same cases on the GPU.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "core/backend.h"
#include "core/common.h"
#include "fd.h"
#include "mixer_case.h"
#include "model/model.h"
#include "test.h"

enum { MAXCASES = 64, W = 50 };  // W: the width of the case names in the notes

static McCase cases[MAXCASES];
static int ncases;

static void load_cases(void) {
    if (!ncases) ncases = mc_cases(cases, MAXCASES);
}

static const char *name_of(int i, char *buf, size_t n) { return mc_case_name(&cases[i], buf, n); }
static int is_pattern(const McCase *k) { return strchr(k->mixer, ',') != NULL; }

// Case i's offset of the seeds of its random draws: its index among the registry's mixers' cases;
// the patterns' (which follow those) count from PATTERN_KEY, where they began when the table was
// written, so that a mixer registered since, which moves them down the table, leaves their draws
// as they were.
enum { PATTERN_KEY = 22 };
static uint64_t key(int i) {
    int first = 0;
    while (first < ncases && !is_pattern(&cases[first])) first++;
    return (uint64_t)(i < first ? i : PATTERN_KEY + (i - first));
}

// The sizes of the checks beside the tiny ones of the gradients (mc_tiny): three heads of 8, width
// 24 and a vocabulary of 37 for the CPU against the reference and the forms; four heads of 8 for
// decoding; the tiny preset's width (32, two heads of 16) and a vocabulary of 64 for training.
static const McSizes wide = {37, 24, 3, 8, 40, 8};
static const McSizes dec = {50, 32, 4, 8, 48, 8};
static const McSizes trn = {64, 32, 2, 16, 64, 64};

// The cap of the paper's architecture (30, the default) where the case has one: decoding caps its
// logits with the backend's softcap, and training starts from log 64; the cases' 2.5, which the
// gradient checks keep, would squash the logits being compared or learnt.
static void paper_cap(ModelConfig *c) {
    if (c->logit_cap > 0) c->logit_cap = 30;
}

// The float32 layer's backward against the float64 one: its core's own tolerance (test_mesa_cpu.c's
// for Mesa, 2e-5: its backward composes two CG solves; test_lin.c's 1e-5 for the others). The
// forward's is 1e-5 for all.
static double bwd_tol(unsigned fam) { return fam & MC_FAM_MESA ? 2e-5 : 1e-5; }

// ------------------------------------------------------------------- the table

// Every row names registered mixers, every registered mixer is a case, and every case makes a
// model on the reference and the CPU.
TEST(conformance_cases) {
    load_cases();
    int nr;
    const McCase *r = mc_rows(&nr);
    for (int j = 0; j < nr; j++)
        CHECK(mixer_pattern_check(r[j].mixer, 0) > 0, "row %d: %s", j, mn_last_error());
    int nm = 0;
    for (int i = 0; mixer_all[i]; i++, nm++) {
        int found = 0;
        for (int k = 0; k < ncases; k++) found |= !strcmp(cases[k].mixer, mixer_all[i]->name);
        CHECK(found, "mixer %s is not among the cases", mixer_all[i]->name);
    }
    for (int i = 0; i < ncases; i++) {
        char name[128];
        name_of(i, name, sizeof name);
        ModelConfig c = mc_case_config(&cases[i], &mc_tiny, 1);
        Model *m = NULL;
        CHECK(!config_validate(&c, name), "%s", mn_last_error());
        CHECK(!model_create(&m, &c, backend_ref()), "%s on ref: %s", name, mn_last_error());
        model_free(m);
        m = NULL;
        CHECK(!model_create(&m, &c, backend_cpu()), "%s on cpu: %s", name, mn_last_error());
        model_free(m);
        test_note("%s", name);
    }
    test_note("%d cases: %d rows and the registry's %d mixers", ncases, nr, nm);
}

// ------------------------------------------------------------------- the forms

// The worst rel err over a block's parameter gradients of a against b (slabs of m's layout).
static double block_grads_err(const Model *m, int layer, const double *a, const double *b, const char **worst) {
    double w = 0;
    for (int t = m->blocks[layer].first; t < m->blocks[layer].first + m->blocks[layer].count; t++) {
        double e = rel_err64(a + m->specs[t].offset, b + m->specs[t].offset, m->specs[t].numel);
        if (!(e <= w)) w = e, *worst = m->specs[t].name;
    }
    return w;
}

// One layer: the float64 reference token by token through the decoding state against one forward
// over the sequence (the reference has one form of each core, the recurrent one, and attention's
// masked parallel one beside its cache's decoding step: so in float64 this checks the hand-off of
// the state, the convolutions' tails, positions and cache slots, to rounding: measured 0 to 2e-16;
// 1e-10 leaves a wide margin, and a lost piece of state is off by 1e-2 and more); the CPU alike
// (float32: its whole-sequence forward runs the chunkwise form, or attention's parallel one, the
// steps the recurrent form, or the cache's step: measured 1.5e-7 to 4e-7, 1e-5); and, where the
// core has both forms (the Mesa and linear-attention families: MnSolver.form), forward and
// backward in the recurrent and the chunkwise form with chunks of 8 over 21 tokens (two whole
// chunks and a part): two float32 computations, each within the layer's tolerance of the float64
// one (conformance_cpu_vs_ref: 1e-5 forward, bwd_tol backward), so within twice it of each other
// (measured 1.3e-7 to 7e-6; a wrong term of either form is 1e-2 and more).
static void forms_layer(const McCase *k, int i, const char *name) {
    ModelConfig cfg = mc_case_config(k, &wide, 1);
    unsigned fam = mc_families(&cfg, NULL);
    int B = 3, T = 21;
    Model *r = mc_make(&cfg, backend_ref()), *c = mc_make(&cfg, backend_cpu());
    mc_randomise(r, 31 + key(i), mc_base_bias_lambda);
    mc_copy_params(c, r);
    double er = mc_layer_steps_vs_forward(r, B, T, 40 + key(i)), ec = mc_layer_steps_vs_forward(c, B, T, 40 + key(i));
    CHECK(er <= 1e-10, "%s: ref token by token vs one forward: rel err %.3g", name, er);
    CHECK(ec <= 1e-5, "%s: cpu token by token vs one forward: rel err %.3g", name, ec);
    if (!(fam & (MC_FAM_MESA | MC_FAM_LIN))) {
        test_note("%-*s steps vs forward: ref %.2e, cpu %.2e (one form: the parallel one and the cache's steps)", W,
                  name, er, ec);
    } else {
        size_t nd = (size_t)B * T * cfg.dim;
        double *u = rand_doubles(50 + key(i), nd, -1, 1), *dy = rand_doubles(60 + key(i), nd, -1, 1);
        double *y[2], *du[2], *g[2];
        const MnForm forms[2] = {MN_FORM_RECURRENT, MN_FORM_CHUNK};
        for (int f = 0; f < 2; f++) {
            y[f] = xcalloc(nd, 8), du[f] = xcalloc(nd, 8), g[f] = xcalloc(c->total, 8);
            c->mixers[0].solver.form = forms[f];
            c->mixers[0].solver.chunk = 8;
            mc_layer_run(c, 0, u, dy, B, T, y[f], du[f], g[f]);
        }
        const char *wn = "";
        double ey = rel_err64(y[1], y[0], nd), edu = rel_err64(du[1], du[0], nd), eg = block_grads_err(c, 0, g[1], g[0], &wn);
        test_note("%-*s steps vs forward: ref %.2e, cpu %.2e; cpu chunk vs recurrent: y %.2e, du %.2e, grads %.2e", W,
                  name, er, ec, ey, edu, eg);
        double tb = 2 * bwd_tol(fam);
        CHECK(ey <= 2e-5 && edu <= tb, "%s: cpu chunkwise vs recurrent form: y %.3g, du %.3g", name, ey, edu);
        CHECK(eg <= tb, "%s: cpu chunkwise vs recurrent form: %s rel err %.3g > %.3g", name, wn, eg, tb);
        for (int f = 0; f < 2; f++) free(y[f]), free(du[f]), free(g[f]);
        free(u), free(dy);
    }
    model_free(r);
    model_free(c);
}

// A pattern's model (its blocks' layers are the cases of their names): loss and gradients with
// every block in the recurrent and in the chunkwise form (chunks of 8 over 21 tokens), float32:
// each within 1e-5 (the loss) and 1e-4 (the gradients) of the float64 model's
// (conformance_cpu_vs_ref's model, at its initialisation), so within 2e-5 and 2e-4 of each other
// (measured: loss 3e-9 to 1e-8, gradients 4e-7 to 1e-6).
static void forms_model(const McCase *k, int i, const char *name) {
    ModelConfig cfg = mc_case_config(k, &wide, 2);
    if (!(mc_families(&cfg, NULL) & (MC_FAM_MESA | MC_FAM_LIN))) {
        test_note("%-*s one form (attention): its steps are conformance_decode's", W, name);
        return;
    }
    Model *c = mc_make(&cfg, backend_cpu());
    model_init_params(c, 9 + key(i));  // conformance_cpu_vs_ref's model, which bounds each form's error
    int B = 3, T = 21;
    int32_t tok[63], tgt[63];
    mc_tokens(tok, tgt, 63, cfg.vocab_size, 70 + key(i));
    double *g[2] = {xcalloc(c->total, 8), xcalloc(c->total, 8)}, l[2];
    const MnForm forms[2] = {MN_FORM_RECURRENT, MN_FORM_CHUNK};
    for (int f = 0; f < 2; f++) {
        c->solver.form = forms[f];
        c->solver.chunk = 8;
        l[f] = mc_model_run(c, tok, tgt, B, T, g[f]);
    }
    double e = rel_err64(g[1], g[0], c->total);
    test_note("%-*s model, chunk vs recurrent: loss %.2e, gradients %.2e", W, name, fabs(l[1] - l[0]) / fabs(l[0]), e);
    CHECK(fabs(l[1] - l[0]) <= 2e-5 * fabs(l[0]), "%s: loss %.10g (chunk) vs %.10g (recurrent)", name, l[1], l[0]);
    CHECK(e <= 2e-4, "%s: gradients chunkwise vs recurrent: rel err %.3g", name, e);
    free(g[0]), free(g[1]);
    model_free(c);
}

TEST(conformance_forms) {
    load_cases();
    for (int i = 0; i < ncases; i++) {
        char name[128];
        name_of(i, name, sizeof name);
        if (is_pattern(&cases[i])) forms_model(&cases[i], i, name);
        else forms_layer(&cases[i], i, name);
    }
}

// ------------------------------------------------------------------- gradients (float64)

// The layer alone, its input and every parameter, to 1e-6 (mc_check_layer_gradients: central
// differences of step 1e-6 carry ~1e-9 of their own). A pattern's blocks are the layers of its
// names' cases: its whole model is checked below.
TEST(conformance_layer_gradients) {
    load_cases();
    for (int i = 0; i < ncases; i++) {
        if (is_pattern(&cases[i])) continue;
        char name[128];
        name_of(i, name, sizeof name);
        ModelConfig cfg = mc_case_config(&cases[i], &mc_tiny, 1);
        Model *m = mc_make(&cfg, backend_ref());
        mc_randomise(m, 7 + key(i), mc_base_bias_lambda);
        mc_check_layer_gradients(m, name, "mixer du");
        model_free(m);
    }
}

// The whole model of two blocks (a pattern: one of each name at least), every tensor: each to
// 1e-5 (mc_model_gradients) and all together to 1e-6.
TEST(conformance_model_gradients) {
    load_cases();
    for (int i = 0; i < ncases; i++) {
        char name[128];
        name_of(i, name, sizeof name);
        ModelConfig cfg = mc_case_config(&cases[i], &mc_tiny, 2);
        Model *m = mc_make(&cfg, backend_ref());
        mc_randomise(m, 3 + key(i), mc_base_bias_lambda);
        double worst;
        const char *wn;
        double e = mc_model_gradients(m, name, &worst, &wn);
        test_note("%-*s %4zu parameters: gradient rel err %.2e (worst tensor %.2e, %s)", W, name, m->count, e, worst, wn);
        CHECK_REL(name, e, 1e-6);
        model_free(m);
    }
}

// ------------------------------------------------------------------- decoding

// Three blocks (a pattern of three: one each) with randomised weights: 2 sequences of 30 tokens
// decoded as a prefill of 11, single tokens, a prefill of 5 after 15 tokens, and single tokens
// again; the logits at every decoded position against one forward's. A lost or doubled state
// hand-off is off by 1e-2 and more. The reference: float64 inside, the logits compared in float32
// (6e-8): measured 0 to 1.1e-7, 1e-6. The CPU: the forward runs the chunkwise form (or attention's
// parallel one), decoding the recurrent one, both float32, so each carries the float32 rounding of
// the whole model, which depends on the draw of the weights: measured here as e_fwd, the worst row
// of the CPU forward's logits against the reference's (2e-6 to 1.7e-4 over the cases and several
// draws). The decoded logits were within 2.6 e_fwd of the forward's in every draw measured, and
// within 1.5e-5 where e_fwd was below 1e-5: the tolerance is 4 e_fwd, at least 3e-5 and at most
// 1e-3, which a wrong hand-off exceeds. Mesa's CG runs 60 steps: converged.
TEST(conformance_decode) {
    load_cases();
    for (int i = 0; i < ncases; i++) {
        char name[128];
        name_of(i, name, sizeof name);
        ModelConfig cfg = mc_case_config(&cases[i], &dec, 3);
        paper_cap(&cfg);
        int B = 2, T = 30, V = cfg.vocab_size;
        int32_t tok[60];
        mc_tokens(tok, NULL, 60, V, 3 + key(i));
        Model *m[2] = {mc_make(&cfg, backend_ref()), mc_make(&cfg, backend_cpu())};
        float *lg[2];
        for (int b = 0; b < 2; b++) {
            mc_randomise(m[b], 12 + key(i), mc_base_bias_lambda);
            m[b]->solver.max_steps = 60;
            lg[b] = xcalloc((size_t)B * T * V, 4);
            CHECK(!model_forward(m[b], tok, NULL, B, T, 0, NULL), "%s: %s", name, mn_last_error());
            m[b]->be->download_f32(m[b]->be, lg[b], m[b]->logits, (size_t)B * T * V, MEM_ACT);
        }
        double e_fwd = 0;
        for (int r = 0; r < B * T; r++) e_fwd = fmax(e_fwd, rel_err_ff(lg[1] + (size_t)r * V, lg[0] + (size_t)r * V, V));
        double tol[2] = {1e-6, fmin(1e-3, fmax(3e-5, 4 * e_fwd))}, worst[2];
        for (int b = 0; b < 2; b++) {
            worst[b] = mc_decode_vs_forward(m[b], tok, B, T, 11, 15, 5, cfg.logit_cap, name, NULL);
            CHECK(worst[b] <= tol[b], "%s on %s: decoded logits differ by %.3g (tolerance %.3g)", name, m[b]->be->name,
                  worst[b], tol[b]);
            free(lg[b]);
            model_free(m[b]);
        }
        test_note("%-*s decoded logits vs one forward: ref %.2e, cpu %.2e (its forward vs ref %.2e)", W, name, worst[0],
                  worst[1], e_fwd);
    }
}

// ------------------------------------------------------------------- the decoding state

// The decoding state of a model of two blocks on the CPU, counted in the bytes the backend holds:
// model_state_floats does not depend on the context length (seq_len: the training context, not the
// decoded length); resetting the state for B sequences allocates B model_state_floats floats,
// exactly; decoding 590 more tokens after 14 holds no more memory, except the caches that grow
// with the tokens (model_state_floats_per_token: mha's): those grow by a whole number of tokens'
// floats, within a factor of 2 of the 590 tokens' (the cache grows in chunks: what it holds runs
// ahead of the tokens by less than one); and model_free gives every byte back.
TEST(conformance_state) {
    load_cases();
    enum { B = 2, STEPS1 = 10, STEPS2 = 590 };
    for (int i = 0; i < ncases; i++) {
        char name[128];
        name_of(i, name, sizeof name);
        ModelConfig cfg = mc_case_config(&cases[i], &dec, 2);
        size_t floats = model_state_floats(&cfg), per_token = model_state_floats_per_token(&cfg);
        const int ctx[3] = {8, 100, 4096};
        for (int j = 0; j < 3; j++) {
            ModelConfig c2 = cfg;
            c2.seq_len = ctx[j];
            CHECK(model_state_floats(&c2) == floats && model_state_floats_per_token(&c2) == per_token,
                  "%s: the state's floats %zu (+%zu a token) at seq_len %d, %zu (+%zu) at %d", name,
                  model_state_floats(&c2), model_state_floats_per_token(&c2), ctx[j], floats, per_token, cfg.seq_len);
        }
        Backend cb = mc_counted_cpu();
        size_t f = cb.elem_size(&cb, MEM_F32);
        CHECK(cb.elem_size(&cb, MEM_ACT) == f, "the CPU's activations and float32 buffers differ in size");
        Model *m = mc_make(&cfg, &cb);
        mc_randomise(m, 5 + key(i), mc_base_bias_lambda);
        size_t b0 = mc_counted_bytes();
        CHECK(!model_reset_state(m, B), "%s: %s", name, mn_last_error());
        size_t b1 = mc_counted_bytes();
        CHECK(b1 - b0 == B * floats * f, "%s: reset_state for %d sequences holds %zu bytes, state_floats says %zu", name,
              B, b1 - b0, B * floats * f);
        int32_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8};
        float logits[2 * 50];
        CHECK(!model_decode(m, tok, B, 4, logits), "%s: %s", name, mn_last_error());
        for (int t = 0; t < STEPS1; t++) CHECK(!model_decode(m, tok + t % 4, B, 1, logits), "%s: %s", name, mn_last_error());
        size_t b2 = mc_counted_bytes();
        for (int t = 0; t < STEPS2; t++) {
            int st = model_decode(m, tok + t % 4, B, 1, logits);
            if (st) {
                test_fail(__FILE__, __LINE__, "%s: step %d: %s", name, t, mn_last_error());
                break;
            }
        }
        size_t b3 = mc_counted_bytes();
        if (!per_token) {
            test_note("%-*s state %zu floats a sequence; bytes after %d and %d tokens: %zu, %zu", W, name, floats,
                      4 + STEPS1, 4 + STEPS1 + STEPS2, b2, b3);
            CHECK(b3 == b2, "%s: decoding memory grew from %zu to %zu bytes", name, b2, b3);
        } else {
            size_t rate = B * per_token * f, grew = b3 - b2;
            test_note("%-*s state %zu floats + %zu a token; grew by %zu bytes in %d tokens (%.0f tokens' worth)", W,
                      name, floats, per_token, grew, STEPS2, (double)grew / (double)rate);
            CHECK(b3 >= b2 && grew % rate == 0 && grew >= rate * STEPS2 / 2 && grew <= 2 * rate * STEPS2,
                  "%s: decoding memory grew by %zu bytes in %d tokens, at %zu bytes a token", name, grew, STEPS2, rate);
        }
        model_free(m);
        CHECK(mc_counted_bytes() == 0, "%s: %zu bytes held after model_free", name, mc_counted_bytes());
    }
}

// ------------------------------------------------------------------- float32 CPU vs float64

// On awkward sizes: 3 sequences of 21 tokens, 3 heads of 8, width 24, a vocabulary of 37. The
// layer (the CPU's chunkwise form in chunks of 8: two whole and a part), with randomised weights:
// the output to 1e-5, the input and parameter gradients to its core's backward tolerance (bwd_tol:
// 1e-5, Mesa's 2e-5), or to 10 times the layer's own float32 sensitivity where that is larger
// (mc_check_layer_cpu_vs_ref: how far the float64 results move when the inputs and weights move by
// a rounding's worth; 1e-7 to 8e-6 for these layers). float32 rounds each op by 6e-8; through the layer's ~15 ops over 21 tokens the
// errors measured are 1e-7 to 4.5e-6, Mesa's gradients up to 1.05e-5 (built with clang), and any
// wrong term is 1e-2 and more. The whole model of two blocks (a pattern: one of each name) at its
// initialisation, with the backend's own choice of form and chunk: the loss to 1e-5 and the
// gradients to 1e-4 (mc_check_model_cpu_vs_ref; measured 3e-7 to 2.8e-5, the most in fla's
// architecture: a third block takes gdn-paper's and Mesa's there to 7e-5 and 8e-5, float32 rounding
// amplified through the blocks alike in every tensor, where a wrong term is 1e-2). Mesa's CG runs
// 60 steps on the CPU, converged where the reference solves exactly.
TEST(conformance_cpu_vs_ref) {
    load_cases();
    for (int i = 0; i < ncases; i++) {
        char name[128];
        name_of(i, name, sizeof name);
        if (!is_pattern(&cases[i])) {
            ModelConfig cfg = mc_case_config(&cases[i], &wide, 1);
            Model *r = mc_make(&cfg, backend_ref()), *c = mc_make(&cfg, backend_cpu());
            mc_randomise(r, 21 + key(i), mc_base_bias_lambda);
            mc_copy_params(c, r);
            c->mixers[0].solver.max_steps = 60;
            c->mixers[0].solver.chunk = 8;
            mc_check_layer_cpu_vs_ref(r, c, 3, 21, 4 + key(i), 5 + key(i), bwd_tol(mc_families(&cfg, NULL)), name, W);
            model_free(r);
            model_free(c);
        }
        ModelConfig cfg = mc_case_config(&cases[i], &wide, 2);
        Model *r = mc_make(&cfg, backend_ref()), *c = mc_make(&cfg, backend_cpu());
        model_init_params(r, 9 + key(i));
        mc_copy_params(c, r);
        c->solver.max_steps = 60;
        mc_check_model_cpu_vs_ref(r, c, name, W);
        model_free(r);
        model_free(c);
    }
}

// ------------------------------------------------------------------- training

// A tiny model of two blocks (width 32, 2 heads of 16) on the CPU learns one batch whose targets
// are the next token: 20 AdamW steps take the loss from about log 64 = 4.16 down by more than 1.
TEST(conformance_trains) {
    load_cases();
    for (int i = 0; i < ncases; i++) {
        char name[128];
        name_of(i, name, sizeof name);
        ModelConfig cfg = mc_case_config(&cases[i], &trn, 2);
        paper_cap(&cfg);
        Model *m = mc_make(&cfg, backend_cpu());
        model_init_params(m, 3);
        mc_check_tiny_trains(m, name, W);
        model_free(m);
    }
}

// ------------------------------------------------------------------- memory estimate

// The memory estimate (model_activation_bytes) comes from the blocks' declarations (the model's
// buffers, each mixer's activation_bytes and scratch_elems, the feed-forward part's): the bytes a
// training step holds for each token more, measured on a backend that counts its allocations, are
// the estimate's exactly. (Measured between two batch sizes: the fixed buffers, which the estimate
// leaves out, cancel.)
TEST(conformance_memory_estimate) {
    load_cases();
    Backend counted = mc_counted_cpu();
    for (int i = 0; i < ncases; i++) {
        char name[128];
        name_of(i, name, sizeof name);
        ModelConfig cfg = mc_case_config(&cases[i], &trn, 2);
        size_t held[2];
        const int T[2] = {16, 24};
        for (int r = 0; r < 2; r++) {
            size_t before = mc_counted_bytes();
            Model *m = mc_make(&cfg, &counted);
            model_init_params(m, 3);
            size_t n = (size_t)2 * T[r];
            int32_t *tok = xcalloc(n, sizeof(int32_t)), *tgt = xcalloc(n, sizeof(int32_t));
            mc_tokens(tok, tgt, n, cfg.vocab_size, 5);
            double loss;
            CHECK(!model_forward(m, tok, tgt, 2, T[r], 1.0f, &loss) && !model_backward(m), "%s: %s", name, mn_last_error());
            held[r] = mc_counted_bytes() - before;
            free(tok);
            free(tgt);
            model_free(m);
        }
        double per = (double)(held[1] - held[0]) / (2.0 * (T[1] - T[0]));
        size_t want = model_activation_bytes(&cfg, &counted, 1);
        test_note("%-*s %.0f bytes a token held, %zu estimated", W, name, per, want);
        CHECK(per == (double)want, "%s: a token holds %.1f bytes, the estimate says %zu", name, per, want);
    }
}

// ------------------------------------------------------------------- refusals

// The CPU backend without one family of cores (renamed "bare"): a model with a block on that family
// is refused when it is made, MN_ERR_UNSUPPORTED naming the first such block's mixer and the
// backend; a model with none builds. Which family a block runs on is observed (mc_families), not
// declared, so a new mixer's claim is checked too.
TEST(conformance_refused) {
    load_cases();
    for (int i = 0; i < ncases; i++) {
        char name[128];
        name_of(i, name, sizeof name);
        ModelConfig cfg = mc_case_config(&cases[i], &mc_tiny, 1);
        int n = mc_pattern_len(cfg.mixer);
        unsigned per[64] = {0}, fams = mc_families(&cfg, per);
        CHECK(fams, "%s: runs none of the core families the battery knows (mc_families): teach it the new one", name);
        char used[128] = "";
        for (int f = 0; f < MC_FAMS; f++) {
            Backend bare = mc_without(backend_cpu(), mc_fam[f], "bare");
            Model *m = NULL;
            int st = model_create(&m, &cfg, &bare);
            int l = 0;
            while (l < n && !(per[l] & mc_fam[f])) l++;
            if (l == n) {
                CHECK(st == MN_OK, "%s without %s (which it does not run on): %s", name, mc_fam_name[f], mn_last_error());
                model_free(m);
                continue;
            }
            char mixer[64], want[96];
            snprintf(want, sizeof want, "mixer %s ", mc_pattern_name(cfg.mixer, l, mixer, sizeof mixer));
            CHECK(st == MN_ERR_UNSUPPORTED && !m && strstr(mn_last_error(), want) && strstr(mn_last_error(), "the bare backend"),
                  "%s without %s: status %d, '%s' (wanted '%s' and the backend's name)", name, mc_fam_name[f], st,
                  mn_last_error(), want);
            model_free(m);
            snprintf(used + strlen(used), sizeof used - strlen(used), "%s%s", *used ? ", " : "", mc_fam_name[f]);
        }
        test_note("%-*s refused without %s", W, name, used);
    }
}
