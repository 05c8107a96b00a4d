// mesanet export: a checkpoint written in another library's layout (train/checkpoint.h's
// checkpoint_export): our own folder, which is Hugging Face's for the fla, llama, xlstm and
// recurrent_gemma architectures ("hf"), NX-AI's xLSTMLMModel folder ("nxai", the xLSTM paper's models),
// or the official Longhorn code's LonghornLMHeadModel folder ("longhorn").
#include <stdio.h>

#include "core/common.h"
#include "tools/commands.h"
#include "train/checkpoint.h"

int cmd_export(int argc, char **argv) {
    char *pos[2];
    int n = 0;
    const char *format = "hf", *layout = NULL;
    Option opts[] = {
        {"format", OPT_STRING, &format,
         "hf: our checkpoint folder (config.json, model.safetensors by our names: Hugging Face's layout for the fla, "
         "llama, xlstm and recurrent_gemma architectures; converts an NX-AI folder or transformers' fused xLSTM to "
         "ours); nxai: NX-AI's xLSTMLMModel folder (models of mlstm-block and slstm-block mixers with LayerNorm); "
         "longhorn: the official Longhorn code's LonghornLMHeadModel folder (config.json, model.safetensors; models "
         "of longhorn blocks)"},
        {"slstm-layout", OPT_STRING, &layout,
         "nxai: the sLSTM backend whose kernel layout the weights take and config.json names: vanilla (default) or cuda"},
    };
    int st = parse_args(argc, argv, "RUN OUT [--format hf|nxai|longhorn]\n\nRUN: a run or checkpoint directory (ours, "
                                    "Hugging Face's, NX-AI's or the official Longhorn's); OUT: the directory to write",
                        opts, (int)(sizeof opts / sizeof opts[0]), pos, &n, 2);
    if (st) return st == 2 ? 0 : 1;
    if (n != 2) cmd_fail("export", "give the checkpoint to read and the directory to write (see --help)");
    if (checkpoint_export(pos[0], pos[1], format, layout)) cmd_fail("export", "%s", mn_last_error());
    printf("wrote %s (%s format) from %s\n", pos[1], format, pos[0]);
    return 0;
}
