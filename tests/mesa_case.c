#include "mesa_case.h"

#include <math.h>
#include <stdlib.h>

#include "core/common.h"

static double *normal(MnRng *r, size_t n, double scale) {
    double *x = xcalloc(n, sizeof(double));
    for (size_t i = 0; i < n; i++) x[i] = scale * mn_rng_normal(r);
    return x;
}

static void l2norm_rows(double *x, size_t rows, size_t dim) {
    for (size_t i = 0; i < rows; i++) {
        double s = 0;
        for (size_t j = 0; j < dim; j++) s += x[i * dim + j] * x[i * dim + j];
        s = 1.0 / sqrt(s);
        for (size_t j = 0; j < dim; j++) x[i * dim + j] *= s;
    }
}

void mesa_case_init(MesaCase *c, MnSeqDims d, uint64_t seed, int with_states, double gmean) {
    MnRng r;
    mn_rng_seed(&r, seed);
    c->d = d;
    size_t ntok = (size_t)d.B * d.T * d.H;
    c->nq = ntok * d.Dk;
    c->nv = ntok * d.Dv;
    c->ng = ntok;
    c->nl = (size_t)d.H * d.Dk;
    c->nh = (size_t)d.B * d.H * d.Dk * d.Dk;
    c->ngs = (size_t)d.B * d.H * d.Dv * d.Dk;
    c->q = normal(&r, c->nq, 1);
    c->k = normal(&r, c->nq, 1);
    l2norm_rows(c->q, ntok, d.Dk);
    l2norm_rows(c->k, ntok, d.Dk);
    c->v = normal(&r, c->nv, 1);
    c->g = normal(&r, c->ng, 1);
    c->beta = normal(&r, c->ng, 1);
    for (size_t i = 0; i < ntok; i++) {
        c->g[i] = -log1p(exp(-(c->g[i] + gmean)));  // log sigmoid(N(gmean, 1))
        c->beta[i] = 1 / (1 + exp(-c->beta[i]));
    }
    c->lambda = xcalloc(c->nl, sizeof(double));
    for (size_t i = 0; i < c->nl; i++) c->lambda[i] = 0.25 + mn_rng_uniform(&r);
    c->dout = normal(&r, c->nv, 1);
    c->h0 = c->g0 = c->dhT = c->dgT = NULL;
    if (with_states) {
        int dk = d.Dk;
        c->h0 = xcalloc(c->nh, sizeof(double));
        for (int bh = 0; bh < d.B * d.H; bh++)
            for (int rep = 0; rep < 3; rep++) {  // a sum of outer products: symmetric PSD
                double kk[dk];
                for (int i = 0; i < dk; i++) kk[i] = mn_rng_normal(&r);
                for (int i = 0; i < dk; i++)
                    for (int j = 0; j < dk; j++) c->h0[(size_t)bh * dk * dk + i * dk + j] += 0.5 * kk[i] * kk[j];
            }
        c->g0 = normal(&r, c->ngs, 1);
        c->dhT = normal(&r, c->nh, 0.1);
        c->dgT = normal(&r, c->ngs, 0.1);
    }
}

void mesa_case_free(MesaCase *c) {
    free(c->q); free(c->k); free(c->v); free(c->g); free(c->beta); free(c->lambda);
    free(c->h0); free(c->g0); free(c->dout); free(c->dhT); free(c->dgT);
}

float *to_f32(const double *x, size_t n) {
    if (!x) return NULL;
    float *y = xcalloc(n, sizeof(float));
    for (size_t i = 0; i < n; i++) y[i] = (float)x[i];
    return y;
}

double *to_f64(const float *x, size_t n) {
    if (!x) return NULL;
    double *y = xcalloc(n, sizeof(double));
    for (size_t i = 0; i < n; i++) y[i] = x[i];
    return y;
}
