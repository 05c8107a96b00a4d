// The Mesa mixer and the whole model: float64 gradients against finite
// differences, float32 CPU against the float64 reference, decoding against
// the full forward.
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

static ModelConfig tiny_config(int gate, int shared_onorm, float bound) {
    ModelConfig c;
    config_default(&c);
    mc_tiny_sizes(&c, NULL, 2);
    c.output_gate = gate;
    c.shared_onorm = shared_onorm;
    c.gate_bound = bound;
    c.logit_cap = 2.5f;  // small, so that the cap bends the logits noticeably
    return c;
}

// --------------------------------------------------------------------- the mixer alone

TEST(mixer_mesa_gradients_match_finite_differences) {
    for (int variant = 0; variant < 2; variant++) {
        // variant 0: per-head o_norm, no gate, a tight forget-gate bound; 1: fla's shared o_norm, output gate
        ModelConfig cfg = tiny_config(variant, variant, variant ? 0 : 3.0f);
        cfg.n_layers = 1;
        Model *m;
        CHECK(!model_create(&m, &cfg, backend_ref()), "%s", mn_last_error());
        mc_randomise(m, 7 + variant, mc_base_bias_lambda);
        mc_check_layer_gradients(m, variant ? "gate, shared norm" : "bound",
                                 variant ? "mixer du (gate, shared norm)" : "mixer du (bound)");
        model_free(m);
    }
}

// --------------------------------------------------------------------- the whole model

TEST(model_gradients_match_finite_differences) {
    const char *arch[2] = {"paper", "fla"};
    for (int a = 0; a < 2; a++) {
        ModelConfig cfg = tiny_config(a, a, a ? 0 : 4.0f);
        if (a) {  // fla: untied head, no cap, no embedding scale
            cfg.tie_embeddings = 0;
            cfg.logit_cap = 0;
            cfg.embed_scale = 0;
        }
        Model *m;
        CHECK(!model_create(&m, &cfg, backend_ref()), "%s", mn_last_error());
        mc_randomise(m, 3 + a, mc_base_bias_lambda);
        double e = mc_model_gradients(m, arch[a], NULL, NULL);  // (and tensor by tensor)
        test_note("%s architecture: %zu parameters, whole-model gradient rel err %.2e", arch[a], m->count, e);
        CHECK_REL("whole-model gradient", e, 1e-6);
        model_free(m);
    }
}

// Same parameters on the float32 CPU backend and the float64 reference.
TEST(model_cpu_matches_reference) {
    ModelConfig cfg = tiny_config(1, 0, 6.0f);
    cfg.dim = 24;
    cfg.n_heads = 3;
    cfg.head_dim = 8;
    cfg.mlp_hidden = 40;
    cfg.vocab_size = 37;
    Model *r = NULL, *c = NULL;
    CHECK(!model_create(&r, &cfg, backend_ref()) && !model_create(&c, &cfg, backend_cpu()), "%s", mn_last_error());
    model_init_params(r, 9);
    mc_copy_params(c, r);
    c->solver.max_steps = 60;  // converged: the reference solves exactly
    mc_check_model_cpu_vs_ref(r, c, "gradients", 0);  // float32 through 2 blocks and two CG solves
    model_free(r);
    model_free(c);
}

// Prefill then decode one token at a time: the logits of every position equal
// those of one full forward over the whole sequence.
TEST(model_decode_matches_forward) {
    ModelConfig cfg = tiny_config(0, 0, 0);
    cfg.dim = 32;
    cfg.n_heads = 2;
    cfg.head_dim = 16;
    cfg.vocab_size = 50;
    cfg.mlp_hidden = 48;
    Model *m;
    CHECK(!model_create(&m, &cfg, backend_cpu()), "%s", mn_last_error());
    model_init_params(m, 1);
    mc_randomise(m, 12, mc_base_bias_lambda);
    int B = 2, T = 40, V = cfg.vocab_size;
    int32_t tok[80], tgt[80];
    mc_tokens(tok, tgt, 80, V, 3);
    m->solver.max_steps = 60;
    int argmax_diff;
    double worst = mc_decode_vs_forward(m, tok, B, T, 25, 0, 0, cfg.logit_cap, "decode", &argmax_diff);
    test_note("decoded logits vs full forward: worst rel err %.2e, argmax differs at %d positions", worst, argmax_diff);
    CHECK(worst <= 1e-5, "decoded logits differ by %.3g", worst);
    CHECK(argmax_diff == 0, "argmax differs at %d positions", argmax_diff);
    model_free(m);
}
