/*
 * The attention family's float32 CPU cores (core/backend.h's AttnOps: fwd,
 * bwd, decode, rope; attn.c): flash-attention style tiles with
 * an online softmax, O(T) memory per head, key tiles outside a sliding window
 * skipped, tile products through BLAS, OpenMP over (sequence, head, tile).
 */
#ifndef MN_ATTN_CPU_H
#define MN_ATTN_CPU_H

#include "core/backend.h"

int cpu_attn_fwd(const Backend *be, const AttnDims *d, const AttnFwd *io);
int cpu_attn_bwd(const Backend *be, const AttnDims *d, const AttnBwd *io);
int cpu_attn_decode(const Backend *be, const AttnDims *d, int n, int cap, const void *q, const void *kc,
                    const void *vc, void *o);
int cpu_rope(const Backend *be, void *x, const void *pos, int N, int H, int D, int rot, float theta, int inverse);

#endif
