/*
 * Named presets ("tiny", "demo", "125m", ...) and the parameter-matched presets "SIZE-MIXER",
 * which count a model's parameters (model_specs) to size its MLP: the part of the configs that
 * needs the model itself.
 */
#ifndef MN_PRESETS_H
#define MN_PRESETS_H

#include <stddef.h>

#include "core/model_config.h"

// A named preset ("tiny", "demo", "125m", "400m", "1b", "fla-162m", "fla-412m", and the xLSTM
// paper's "xlstm-125m", "xlstm10-125m", "xlstm-350m", and Hugging Face's "xlstm-7b-160m"), a parameter-matched
// preset "SIZE-MIXER" (below), or MN_ERR_ARG listing the accepted forms.
int config_preset(ModelConfig *c, const char *name);

// Parameter-matched presets, for comparisons one to one at equal size as the MesaNet paper's:
// "SIZE-MIXER" with SIZE one of config_matched_sizes (demo, 125m, 400m) and MIXER one mixer name
// (mesa, mamba2, gla, deltanet, gdn, gdn-paper, deltanet-paper, mha, swa, mlstm, mlstm-block,
// slstm-block, hawk, ...) or a hybrid's (config_hybrids: hawk-mesa, griffin), e.g. "125m-gdn", "demo-gla",
// "400m-gdn-paper"; usable wherever a preset is (--config 125m-gdn, {"preset": "125m-gdn"}).
// It is the SIZE preset's backbone (width, depth, heads, vocabulary, norms) with every block's mixer
// replaced (gdn-paper with its own output gate, output_gate = 1, as fla's GatedDeltaNet), and one
// knob moved: mlp_hidden, in steps of CONFIG_MATCH_STEP, to the value whose total parameter count
// is nearest that of the Mesa model of that size (SIZE itself; "SIZE-mesa" is SIZE). The count
// is affine in mlp_hidden (3 D n_layers parameters per unit: SwiGLU's gate, up and down), so the
// matched count is within half a step, 3 D n_layers CONFIG_MATCH_STEP / 2 parameters, of Mesa's
// (125m: 442,368, 0.34%). A block without such a part (mlstm-block) moves the depth instead, to the
// number of blocks whose count is nearest (the xLSTM paper's 24 blocks against Llama's 12); the
// xLSTM blocks' presets (MixerOps.preset) also set their heads, LayerNorm and widths. Counts
// with vocab_size 0 (demo: from the data) use 4096, as `info` shows.
enum { CONFIG_MATCH_STEP = 32 };
extern const char *const config_matched_sizes[];  // NULL-terminated
// Hybrids with matched presets "SIZE-NAME" too: a name for a pattern of mixers (each mixer's preset
// hook applied once), e.g. "125m-griffin" (hawk,hawk,swa over the blocks).
typedef struct {
    const char *name;     // "hawk-mesa"
    const char *pattern;  // "hawk,mesa"
    const char *about;
} ConfigHybrid;
extern const ConfigHybrid config_hybrids[];  // ended by a NULL name
// The matched preset of `mixer` (a mixer's or a hybrid's name) at `size` into c, or MN_ERR_ARG (an
// unknown size or mixer).
int config_matched(ModelConfig *c, const char *size, const char *mixer);
// Parameters of a valid config: all, in the mixers, in the feed-forward parts (by the tensors'
// roles); any may be NULL. vocab_size 0 is counted as 4096.
int config_param_count(const ModelConfig *c, size_t *total, size_t *mixers, size_t *mlps);
// The accepted config names, for --help texts.
#define CONFIG_NAMES_HELP                                                                          \
    "a preset (tiny, demo, 125m, 400m, 1b, fla-162m, fla-412m, xlstm-125m, xlstm10-125m, xlstm-350m, xlstm-7b-160m), a parameter-matched preset SIZE-MIXER " \
    "(SIZE demo, 125m or 400m; MIXER mesa, mamba2, gla, deltanet, gdn, gdn-paper, deltanet-paper, mha, swa, mlstm, mlstm-block, slstm-block, mlstm-large, hawk, or a hybrid: hawk-mesa, griffin; "   \
    "e.g. 125m-gdn: SIZE's backbone with that mixer, MLP width set to match Mesa's parameter count), "  \
    "or a JSON file"

#endif
