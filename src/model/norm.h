/*
 * The backbone's norms (the blocks' two and the final one), of the kind the config's `norm`
 * names: RMSNorm (the default: MesaNet, fla, Llama) or LayerNorm without bias (the xLSTM
 * paper's blocks, as NX-AI's xLSTMLMModel has them). One pair of calls for both, so that the
 * model and the feed-forward part do not branch on the kind.
 */
#ifndef MN_MODEL_NORM_H
#define MN_MODEL_NORM_H

#include "core/backend.h"
#include "core/model_config.h"

typedef enum { NORM_RMS, NORM_LAYER } NormKind;

// The kind a config names (config_validate has checked the name).
NormKind norm_kind(const ModelConfig *c);

// The norms' weights as their checkpoint holds them: RecurrentGemma's RMSNorm computes
// x / rms(x) (1 + w) in float32 and stores w; the model holds the gain g = 1 + w (rounded to float32,
// the factor transformers multiplies by), so that the same op serves every architecture, and its
// files hold g - 1 (ParamSpec.file_offset 1; exact back to g: Sterbenz). 0 elsewhere.
float norm_file_offset(const ModelConfig *c);

// MEM_F32 statistics per row a norm keeps for its backward: 1/rms, or 1/std and the mean.
enum { NORM_STATS = 2 };

// y[N,D] = norm(x) w; stats [NORM_STATS * N] MEM_F32 (1/rms or 1/std in the first N, the mean after).
int norm_fwd(const Backend *be, NormKind k, void *y, void *stats, const void *x, const void *w, int N, int D,
             float eps);
// dx (=, or += with accum) and dw (+=) from dy, with the forward's stats.
int norm_bwd(const Backend *be, NormKind k, void *dx, void *dw, const void *dy, const void *x, const void *w,
             const void *stats, int N, int D, int accum);

#endif
