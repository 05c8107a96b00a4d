#include "sample.h"

#include <math.h>
#include <stdlib.h>

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static int by_prob_desc(const void *a, const void *b) {
    float x = ((const float *)a)[0], y = ((const float *)b)[0];
    return (x < y) - (x > y);
}

int sample_token(Sampler *s, const float *logits, int V, float *work) {
    if (s->temperature <= 0) return argmax(logits, V);
    // probabilities at the temperature, as (p, id) pairs
    float mx = logits[argmax(logits, V)];
    double sum = 0;
    for (int i = 0; i < V; i++) {
        float p = expf((logits[i] - mx) / s->temperature);
        work[2 * i] = p;
        work[2 * i + 1] = (float)i;  // ids up to 2^24 are exact in a float
        sum += p;
    }
    int keep = V;
    if ((s->top_k > 0 && s->top_k < V) || s->top_p < 1) {
        qsort(work, (size_t)V, 2 * sizeof(float), by_prob_desc);
        if (s->top_k > 0 && s->top_k < keep) keep = s->top_k;
        if (s->top_p < 1) {
            double acc = 0;
            for (int i = 0; i < keep; i++) {
                acc += work[2 * i] / sum;
                if (acc >= s->top_p) {
                    keep = i + 1;
                    break;
                }
            }
        }
        sum = 0;
        for (int i = 0; i < keep; i++) sum += work[2 * i];
    }
    double u = mn_rng_uniform(&s->rng) * sum, acc = 0;
    for (int i = 0; i < keep; i++) {
        acc += work[2 * i];
        if (u < acc) return (int)work[2 * i + 1];
    }
    return (int)work[2 * (keep - 1) + 1];
}
