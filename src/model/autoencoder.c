/*
 * The autoencoder head (ModelConfig.head = "autoencoder"): MAD's AutoEncoder
 * (mad/model/auto_encoder.py, global_pool "last"), for MAD's compression task
 * (docs/spec/reference/benchmarks-notes.md 1.3). The blocks run as in the
 * language model; the residual stream leaving the last block at the last
 * position (MAD's encoding, x[:, -1]: no final norm there, the decoder opens
 * with one) is given to every position t of the sequence plus MAD's fixed
 * sin-cos embedding pe[t], then decoded position by position:
 *
 *     z[b,t]  = x_L[b,T-1] + pe[t]                          [N, D]   pool_last_fwd
 *     r0 = RMSNorm(z; decoder.0)                            [N, D]
 *     a1 = r0 W1^T + b1;  g1 = GELU(a1)                     [N, D]   decoder.1, GELU
 *     r1 = RMSNorm(g1; decoder.3)                           [N, D]
 *     a2 = r1 W2^T + b2;  g2 = GELU(a2)                     [N, D]   decoder.4, GELU
 *     r2 = RMSNorm(g2; unembed.0)                           [N, D]
 *     logits = r2 Wout^T + bout                             [N, V]   unembed.1
 *
 * (N = B T.) Every Linear has a bias (torch's default; MAD initialises weights
 * N(0, 0.02^2) and biases 0); tensor names are MAD's module paths. The loss is
 * the model's cross-entropy over every position with a target; the backward
 * runs the same steps in reverse into the gradient of x_L, from which the
 * blocks' backward goes on as the language model's.
 */
#include <stdio.h>
#include <string.h>

#include "core/common.h"
#include "model/model.h"

int ae_declare(const ModelConfig *c, ParamSpec *s, int *n, int max, AeHead *ae) {
    int64_t D = c->dim, V = c->vocab_size, dd[2] = {D, D}, d1[1] = {D}, vd[2] = {V, D}, v1[1] = {V};
    const double sd = 0.02;  // MAD's _init_weights
    ae->norm0 = param_add(s, n, max, "decoder.0.weight", 1, d1, INIT_CONST, 1, 0);
    ae->w1 = param_add(s, n, max, "decoder.1.weight", 2, dd, INIT_NORMAL, sd, 1);
    ae->b1 = param_add(s, n, max, "decoder.1.bias", 1, d1, INIT_CONST, 0, 0);
    ae->norm1 = param_add(s, n, max, "decoder.3.weight", 1, d1, INIT_CONST, 1, 0);
    ae->w2 = param_add(s, n, max, "decoder.4.weight", 2, dd, INIT_NORMAL, sd, 1);
    ae->b2 = param_add(s, n, max, "decoder.4.bias", 1, d1, INIT_CONST, 0, 0);
    ae->norm2 = param_add(s, n, max, "unembed.0.weight", 1, d1, INIT_CONST, 1, 0);
    ae->wout = param_add(s, n, max, "unembed.1.weight", 2, vd, INIT_NORMAL, sd, 1);
    ae->bout = param_add(s, n, max, "unembed.1.bias", 1, v1, INIT_CONST, 0, 0);
    if (ae->bout < 0) return mn_error(MN_ERR_ARG, "too many parameter tensors");
    ae->on = 1;
    return MN_OK;
}

size_t ae_activation_bytes_per_token(const ModelConfig *c, const Backend *be) {
    if (strcmp(c->head, "autoencoder")) return 0;
    return 9 * (size_t)c->dim * be->elem_size(be, MEM_ACT) + 3 * be->elem_size(be, MEM_F32);
}

static void **ae_act_bufs(AeHead *a, int i) {
    void **p[] = {&a->z, &a->r0, &a->a1, &a->g1, &a->r1, &a->a2, &a->g2, &a->r2, &a->d};
    return i < 9 ? p[i] : NULL;
}

void ae_free(Model *m) {
    AeHead *a = &m->ae;
    void **f32[] = {&a->s0, &a->s1, &a->s2};
    for (int i = 0; i < 12; i++) {
        void **p = i < 9 ? ae_act_bufs(a, i) : f32[i - 9];
        if (*p) m->be->free(m->be, *p);
        *p = NULL;
    }
}

int ae_alloc(Model *m, size_t N) {
    AeHead *a = &m->ae;
    size_t D = (size_t)m->cfg.dim;
    void **f32[] = {&a->s0, &a->s1, &a->s2};
    for (int i = 0; i < 12; i++) {
        void **p = i < 9 ? ae_act_bufs(a, i) : f32[i - 9];
        *p = m->be->alloc(m->be, i < 9 ? N * D : N, i < 9 ? MEM_ACT : MEM_F32);
        if (!*p) {
            ae_free(m);
            return MN_ERR_NOMEM;
        }
    }
    return MN_OK;
}

int ae_forward(Model *m) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->cfg;
    AeHead *a = &m->ae;
    int B = m->B, T = m->T, D = c->dim, N = B * T;
    float eps = c->norm_eps;
    const void *xl = (const char *)m->x + (size_t)c->n_layers * N * D * be->elem_size(be, MEM_ACT);
    void **p = m->p;
    MN_TRY(be->pool_last_fwd(be, a->z, xl, B, T, D));
    MN_TRY(be->rmsnorm_fwd(be, a->r0, a->s0, a->z, p[a->norm0], N, D, D, D, eps));
    MN_TRY(be->linear_fwd(be, a->a1, a->r0, p[a->w1], p[a->b1], N, D, D));
    MN_TRY(be->gelu_fwd(be, a->g1, a->a1, (size_t)N * D));
    MN_TRY(be->rmsnorm_fwd(be, a->r1, a->s1, a->g1, p[a->norm1], N, D, D, D, eps));
    MN_TRY(be->linear_fwd(be, a->a2, a->r1, p[a->w2], p[a->b2], N, D, D));
    MN_TRY(be->gelu_fwd(be, a->g2, a->a2, (size_t)N * D));
    MN_TRY(be->rmsnorm_fwd(be, a->r2, a->s2, a->g2, p[a->norm2], N, D, D, D, eps));
    return be->linear_fwd(be, m->logits, a->r2, p[a->wout], p[a->bout], N, D, c->vocab_size);
}

int ae_backward(Model *m) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->cfg;
    AeHead *a = &m->ae;
    int B = m->B, T = m->T, D = c->dim, N = B * T;
    void **p = m->p, **g = m->g, *e = m->dn, *d = a->d;  // two [N, D] gradients in turn
    // logits hold dloss/dlogits (model_forward with grad_weight)
    MN_TRY(be->linear_bwd(be, e, g[a->wout], g[a->bout], m->logits, a->r2, p[a->wout], N, D, c->vocab_size, 0));
    MN_TRY(be->rmsnorm_bwd(be, d, g[a->norm2], e, a->g2, p[a->norm2], a->s2, N, D, D, D, 0));
    MN_TRY(be->gelu_bwd(be, d, d, a->a2, (size_t)N * D));
    MN_TRY(be->linear_bwd(be, e, g[a->w2], g[a->b2], d, a->r1, p[a->w2], N, D, D, 0));
    MN_TRY(be->rmsnorm_bwd(be, d, g[a->norm1], e, a->g1, p[a->norm1], a->s1, N, D, D, D, 0));
    MN_TRY(be->gelu_bwd(be, d, d, a->a1, (size_t)N * D));
    MN_TRY(be->linear_bwd(be, e, g[a->w1], g[a->b1], d, a->r0, p[a->w1], N, D, D, 0));
    MN_TRY(be->rmsnorm_bwd(be, d, g[a->norm0], e, a->z, p[a->norm0], a->s0, N, D, D, D, 0));
    return be->pool_last_bwd(be, m->dx, d, B, T, D);  // the gradient of x_L: only at the last positions
}
