/*
 * Text files to token shards: collects documents, splits them into training
 * and validation sets (deterministically, by a hash of each document's name),
 * trains a byte-level BPE on the training documents or loads an existing one
 * (GPT-2's), and writes train.bin and valid.bin (data/shard.h) with every
 * document preceded by the BOS/EOT token, plus encoder.json and vocab.bpe.
 */
#ifndef MN_TOKENIZE_H
#define MN_TOKENIZE_H

#include <stdio.h>

typedef struct {
    const char *out_dir;       // receives train.bin, valid.bin, encoder.json, vocab.bpe
    int vocab;                 // > 0: train a BPE of this many tokens; 0: copy bpe_dir's
    const char *bpe_dir;       // a directory with encoder.json and vocab.bpe (when vocab = 0)
    double valid_frac;         // share of documents held out for validation
    const char *doc_sep;       // a line that separates documents inside a file (NULL: one file, one document)
    const char *const *inputs; // files, or directories searched recursively for *.txt
    int ninputs;
} TokenizeOptions;

int tokenize_run(const TokenizeOptions *o, FILE *log);

#endif
