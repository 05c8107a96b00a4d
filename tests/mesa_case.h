// Random Mesa core inputs drawn as the layer produces them (spec section 7),
// in float64, with loss weights for gradient checks.
#ifndef MN_TEST_MESA_CASE_H
#define MN_TEST_MESA_CASE_H

#include <stddef.h>
#include <stdint.h>

#include "mesanet.h"

typedef struct {
    MnSeqDims d;
    size_t nq, nv, ng, nl, nh, ngs;        // element counts: q/k, v, g/beta, lambda, H states, G states
    double *q, *k, *v, *g, *beta, *lambda;  // inputs
    double *h0, *g0;                        // initial states (NULL unless requested)
    double *dout, *dhT, *dgT;               // L = sum(o dout) + sum(hT dhT) + sum(gT dgT)
} MesaCase;

// gamma = sigmoid(N(gmean, 1)), beta = sigmoid(N(0,1)), lambda in [0.25, 1.25),
// q and k L2-normalised, v ~ N(0,1). With states: symmetric PSD h0, random g0.
void mesa_case_init(MesaCase *c, MnSeqDims d, uint64_t seed, int with_states, double gmean);
void mesa_case_free(MesaCase *c);

float *to_f32(const double *x, size_t n);   // NULL in, NULL out
double *to_f64(const float *x, size_t n);

#endif
