// The Mesa mixer and the whole model: float64 gradients against finite
// differences, float32 CPU against the float64 reference, decoding against
// the full forward.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/common.h"
#include "fd.h"
#include "model/model.h"
#include "test.h"

static ModelConfig tiny_config(int gate, int shared_onorm, float bound) {
    ModelConfig c;
    config_default(&c);
    c.vocab_size = 11;
    c.dim = 12;
    c.n_layers = 2;
    c.n_heads = 2;
    c.head_dim = 4;
    c.mlp_hidden = 10;
    c.seq_len = 8;
    c.output_gate = gate;
    c.shared_onorm = shared_onorm;
    c.gate_bound = bound;
    c.logit_cap = 2.5f;  // small, so that the cap bends the logits noticeably
    return c;
}

// Random parameters of a larger scale than the initialisation, so that every
// path (gates, lambda, norms) carries real gradient.
static void randomise(Model *m, uint64_t seed) {
    MnRng r;
    mn_rng_seed(&r, seed);
    double *v = xcalloc(m->total, sizeof(double));
    for (int i = 0; i < m->nparams; i++) {
        const ParamSpec *s = &m->specs[i];
        for (size_t j = 0; j < s->numel; j++) {
            double base = s->init == INIT_NORMAL ? 0 : 1;
            if (strstr(s->name, "bias") || strstr(s->name, "lambda")) base = 0.5;
            v[s->offset + j] = base + 0.5 * mn_rng_normal(&r);
        }
    }
    if (m->be->upload(m->be, m->params, v, m->total, MEM_PARAM)) die("%s", mn_last_error());
    free(v);
}

// --------------------------------------------------------------------- the mixer alone

typedef struct {
    Model *m;  // a 1-layer model provides the mixer's parameters
    Mixer *mx;
    int B, T;
    double *u, *wy, *y;
} MixCtx;

static double mix_loss(void *p) {
    MixCtx *c = p;
    if (c->mx->ops->forward(c->mx, c->y, c->u, c->B, c->T, 0)) die("%s", mn_last_error());
    double s = 0;
    for (size_t i = 0; i < (size_t)c->B * c->T * c->m->cfg.dim; i++) s += c->y[i] * c->wy[i];
    return s;
}

TEST(mixer_mesa_gradients_match_finite_differences) {
    for (int variant = 0; variant < 2; variant++) {
        // variant 0: per-head o_norm, no gate, a tight forget-gate bound; 1: fla's shared o_norm, output gate
        ModelConfig cfg = tiny_config(variant, variant, variant ? 0 : 3.0f);
        cfg.n_layers = 1;
        Model *m;
        CHECK(!model_create(&m, &cfg, backend_ref()), "%s", mn_last_error());
        randomise(m, 7 + variant);
        int B = 2, T = 7, D = cfg.dim;
        size_t N = (size_t)B * T;
        MixCtx c = {m, &m->mixers[0], B, T, rand_doubles(1, N * D, -1, 1), rand_doubles(2, N * D, -1, 1),
                    xcalloc(N * D, 8)};
        mix_loss(&c);
        double *du = xcalloc(N * D, 8);
        model_zero_grad(m);
        CHECK(!c.mx->ops->backward(c.mx, du, c.wy), "%s", mn_last_error());
        fd_check(variant ? "mixer du (gate, shared norm)" : "mixer du (bound)", mix_loss, &c, c.u, du, N * D, 1e-6);
        for (int i = m->blocks[0].first; i < m->blocks[0].first + m->blocks[0].count; i++) {
            double *p = m->p[i], *g = m->g[i];
            fd_check(m->specs[i].name + 15, mix_loss, &c, p, g, m->specs[i].numel, 1e-6);
        }
        free(c.u); free(c.wy); free(c.y); free(du);
        model_free(m);
    }
}

// --------------------------------------------------------------------- the whole model

typedef struct {
    Model *m;
    int B, T;
    int32_t *tok, *tgt;
} ModelCtx;

static double model_loss(void *p) {
    ModelCtx *c = p;
    double loss;
    if (model_forward(c->m, c->tok, c->tgt, c->B, c->T, 0, &loss)) die("%s", mn_last_error());
    return loss;
}

static void tokens(int32_t *tok, int32_t *tgt, size_t n, int V, uint64_t seed) {
    MnRng r;
    mn_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) {
        tok[i] = (int32_t)(mn_rng_u64(&r) % (uint64_t)V);
        tgt[i] = i % 5 == 3 ? -1 : (int32_t)(mn_rng_u64(&r) % (uint64_t)V);  // some positions without loss
    }
}

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
        randomise(m, 3 + a);
        int B = 2, T = 6;
        int32_t tok[12], tgt[12];
        tokens(tok, tgt, 12, cfg.vocab_size, 5);
        ModelCtx c = {m, B, T, tok, tgt};
        model_zero_grad(m);
        double loss;
        CHECK(!model_forward(m, tok, tgt, B, T, 1.0f, &loss), "%s", mn_last_error());
        CHECK(!model_backward(m), "%s", mn_last_error());
        double *num = xcalloc(m->total, 8);
        fd_gradient(model_loss, &c, m->params, m->total, 1e-6, num);
        double e = rel_err64(m->grads, num, m->total);
        test_note("%s architecture: %zu parameters, whole-model gradient rel err %.2e", arch[a], m->count, e);
        CHECK_REL("whole-model gradient", e, 1e-6);
        // and tensor by tensor, so a failure names its tensor
        for (int i = 0; i < m->nparams; i++) {
            double ei = rel_err64((double *)m->g[i], num + m->specs[i].offset, m->specs[i].numel);
            if (!(ei <= 1e-5)) test_fail(__FILE__, __LINE__, "%s: rel err %.3g", m->specs[i].name, ei);
        }
        free(num);
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
    double *v = xcalloc(r->total, 8);
    r->be->download(r->be, v, r->params, r->total, MEM_PARAM);
    c->be->upload(c->be, c->params, v, c->total, MEM_PARAM);
    c->solver.max_steps = 60;  // converged: the reference solves exactly
    int B = 3, T = 21;
    int32_t tok[63], tgt[63];
    tokens(tok, tgt, 63, cfg.vocab_size, 11);
    double lr, lc;
    model_zero_grad(r);
    model_zero_grad(c);
    CHECK(!model_forward(r, tok, tgt, B, T, 1.0f / 63, &lr) && !model_backward(r), "%s", mn_last_error());
    CHECK(!model_forward(c, tok, tgt, B, T, 1.0f / 63, &lc) && !model_backward(c), "%s", mn_last_error());
    test_note("loss: ref %.10f cpu %.10f", lr / 63, lc / 63);
    CHECK(fabs(lr - lc) <= 1e-5 * fabs(lr), "loss %g vs %g", lc, lr);
    double *gr = xcalloc(r->total, 8), *gc = xcalloc(c->total, 8);
    r->be->download(r->be, gr, r->grads, r->total, MEM_F32);
    c->be->download(c->be, gc, c->grads, c->total, MEM_F32);
    double e = rel_err64(gc, gr, r->total);
    test_note("gradients: cpu vs ref rel err %.2e", e);
    CHECK_REL("gradients", e, 1e-4);  // float32 through 2 blocks and two CG solves
    free(v); free(gr); free(gc);
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
    randomise(m, 12);
    int B = 2, T = 40, V = cfg.vocab_size;
    int32_t tok[80], tgt[80];
    tokens(tok, tgt, 80, V, 3);
    m->solver.max_steps = 60;
    CHECK(!model_forward(m, tok, NULL, B, T, 0, NULL), "%s", mn_last_error());
    float *full = xcalloc((size_t)B * T * V, 4);
    m->be->download_f32(m->be, full, m->logits, (size_t)B * T * V, MEM_ACT);
    for (size_t i = 0; i < (size_t)B * T * V; i++) full[i] = cfg.logit_cap * tanhf(full[i] / cfg.logit_cap);
    CHECK(!model_reset_state(m, B), "%s", mn_last_error());
    int T1 = 25;
    int32_t buf[50];
    float *step = xcalloc((size_t)B * V, 4);
    double worst = 0;
    int argmax_diff = 0;
    for (int t0 = 0; t0 < T;) {
        int n = t0 == 0 ? T1 : 1;
        for (int b = 0; b < B; b++) memcpy(buf + b * n, tok + b * T + t0, sizeof(int32_t) * n);
        CHECK(!model_decode(m, buf, B, n, step), "%s", mn_last_error());
        t0 += n;
        for (int b = 0; b < B; b++) {
            const float *want = full + ((size_t)b * T + t0 - 1) * V, *got = step + (size_t)b * V;
            worst = fmax(worst, rel_err_ff(got, want, V));
            int ag = 0, aw = 0;
            for (int i = 1; i < V; i++) {
                if (got[i] > got[ag]) ag = i;
                if (want[i] > want[aw]) aw = i;
            }
            argmax_diff += ag != aw;
        }
    }
    test_note("decoded logits vs full forward: worst rel err %.2e, argmax differs at %d positions", worst, argmax_diff);
    CHECK(worst <= 1e-5, "decoded logits differ by %.3g", worst);
    CHECK(argmax_diff == 0, "argmax differs at %d positions", argmax_diff);
    free(full); free(step);
    model_free(m);
}
