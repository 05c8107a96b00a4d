// mesanet tokenize: text files to token shards and a tokenizer.
#include <stdio.h>

#include "core/common.h"
#include "data/tokenize.h"
#include "tools/commands.h"

int cmd_tokenize(int argc, char **argv) {
    TokenizeOptions o = {.out_dir = "data/demo", .vocab = 4096, .valid_frac = 0.05};
    float valid = 0.05f;
    const char *bpe = NULL;
    Option opts[] = {
        {"out", OPT_STRING, &o.out_dir, "output directory (train.bin, valid.bin, encoder.json, vocab.bpe)"},
        {"vocab", OPT_INT, &o.vocab, "train a byte-level BPE of this many tokens on the training documents (256 bytes + EOT at least)",
         257, 1 << 24},
        {"bpe", OPT_STRING, &bpe, "use this directory's encoder.json and vocab.bpe instead (e.g. data/gpt2)"},
        {"valid", OPT_FLOAT, &valid, "share of documents held out for validation", 0, 0.5},
        {"doc-sep", OPT_STRING, &o.doc_sep, "a line that separates documents inside a file"},
    };
    char *inputs[4096];
    int n = 0;
    int st = parse_args(argc, argv, "[options] FILE_OR_DIR...", opts, sizeof opts / sizeof opts[0], inputs, &n, 4096);
    if (st) return st == 2 ? 0 : 1;
    if (n == 0) {
        fprintf(stderr, "mesanet tokenize: give text files or directories (see --help)\n");
        return 1;
    }
    if (bpe) {
        o.bpe_dir = bpe;
        o.vocab = 0;
    }
    o.valid_frac = valid;
    o.inputs = (const char *const *)inputs;
    o.ninputs = n;
    if (tokenize_run(&o, stdout)) {
        fprintf(stderr, "mesanet tokenize: %s\n", mn_last_error());
        return 1;
    }
    return 0;
}
