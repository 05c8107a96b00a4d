#include "chunk.h"

#include <math.h>
#include <stddef.h>

#include "blas.h"

size_t chunk_decay_floats(int C) { return 3 * (size_t)C + 1 + (size_t)C * C; }

void chunk_decay_init(ChunkDecay *cd, float *mem, int C) {
    cd->C = C;
    cd->b = mem;
    cd->head = cd->b + C;
    cd->tail = cd->head + C;
    cd->decay = cd->tail + C;
    cd->mask = cd->decay + 1;
}

void chunk_decay_compute(ChunkDecay *cd, const float *g, int stride, int n) {
    int C = cd->C;
    cd->n = n;
    float acc = 0;
    for (int t = 0; t < n; t++) {
        acc += g ? g[(size_t)t * stride] : 0;
        cd->b[t] = acc;
        cd->head[t] = expf(acc);
    }
    *cd->decay = expf(acc);
    for (int t = 0; t < n; t++) cd->tail[t] = expf(acc - cd->b[t]);
    for (int t = 0; t < n; t++) {
        float *row = cd->mask + (size_t)t * C;
        for (int s = 0; s <= t; s++) row[s] = expf(cd->b[t] - cd->b[s]);
        for (int s = t + 1; s < n; s++) row[s] = 0;
    }
}

void gla_apply(const GlaTerms *t, float *out, float *attn) {
    int m = t->m, n = t->n;
    // out = X op(S), then rows scaled by their decay
    if (t->s) {
        gemm(0, t->s_trans, m, t->dout, t->dx, 1, t->x, t->dx, t->s, t->s_trans ? t->dx : t->dout, 0, out, t->dout);
        for (int r = 0; r < m; r++) {
            float c = t->rowscale[t->rows ? t->rows[r] : r];
            float *o = out + (size_t)r * t->dout;
            for (int j = 0; j < t->dout; j++) o[j] *= c;
        }
    }
    // attn = (X A^T) (.) mask, then out += attn B
    gemm(0, 1, m, n, t->dx, 1, t->x, t->dx, t->a, t->dx, 0, attn, n);
    for (int r = 0; r < m; r++) {
        int i = t->rows ? t->rows[r] : r;
        float *row = attn + (size_t)r * n;
        if (t->mask_trans)
            for (int s = 0; s < n; s++) row[s] *= t->mask[(size_t)s * t->C + i];
        else
            for (int s = 0; s < n; s++) row[s] *= t->mask[(size_t)i * t->C + s];
    }
    gemm(0, 0, m, t->dout, n, 1, attn, n, t->b, t->dout, t->s ? 1 : 0, out, t->dout);
}

void state_advance(float *s, float decay, const float *l, const float *r, int n, int p, int q) {
    gemm(1, 0, p, q, n, 1, l, p, r, q, decay, s, q);
}

void scale_rows(float *out, const float *in, const float *v, int n, int d) {
    for (int t = 0; t < n; t++)
        for (int j = 0; j < d; j++) out[(size_t)t * d + j] = v[t] * in[(size_t)t * d + j];
}
