// Sampling the next token from logits: greedy, temperature, top-k, top-p.
#ifndef MN_SAMPLE_H
#define MN_SAMPLE_H

#include "core/common.h"

typedef struct {
    float temperature;  // 0: greedy (argmax)
    int top_k;          // keep the k most likely tokens (0: all)
    float top_p;        // keep the smallest set with this much probability (1: all)
    MnRng rng;
} Sampler;

// The next token among ids [0, V) (logits beyond a tokenizer's vocabulary are
// excluded by passing its size). `work` holds 2 V floats of scratch.
int sample_token(Sampler *s, const float *logits, int V, float *work);

#endif
