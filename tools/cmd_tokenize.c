// mesanet tokenize: text files to token shards and a tokenizer.
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core/common.h"
#include "data/tokenize.h"
#include "tools/commands.h"

// Refuses, before any work, an --out that is not a directory, or one that holds files (a data
// directory that runs and their evaluations read: rewriting it changes what they score) unless
// --force; names a few of the files.
static void check_out_dir(const char *dir, int force) {
    struct stat st;
    if (!dir[0]) cmd_fail("tokenize", "--out is empty: give the output directory");
    if (stat(dir, &st)) {
        if (errno == ENOENT) return;  // made with its parents
        cmd_fail("tokenize", "--out %s: %s", dir, strerror(errno));
    }
    if (!S_ISDIR(st.st_mode)) cmd_fail("tokenize", "--out %s: not a directory", dir);
    if (force) return;
    DIR *d = opendir(dir);
    if (!d) cmd_fail("tokenize", "--out %s: cannot list it (%s)", dir, strerror(errno));
    char names[256] = "";
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (n < 4) {
            size_t len = strlen(names);
            snprintf(names + len, sizeof names - len, "%s%s", n ? ", " : "", e->d_name);
        }
        n++;
    }
    closedir(d);
    if (n)
        cmd_fail("tokenize",
                 "--out %s already holds %d file%s (%s%s): give --force to overwrite its tokenizer and shards, or "
                 "another --out",
                 dir, n, plural_s(n), names, n > 4 ? ", ..." : "");
}

int cmd_tokenize(int argc, char **argv) {
    TokenizeOptions o = {.out_dir = "data/demo", .vocab = 4096, .valid_frac = 0.05};
    float valid = 0.05f;
    const char *bpe = NULL;
    int force = 0;
    Option opts[] = {
        {"out", OPT_STRING, &o.out_dir,
         "output directory (train.bin, valid.bin, encoder.json, vocab.bpe); one that holds files only with --force"},
        {"vocab", OPT_INT, &o.vocab, "train a byte-level BPE of this many tokens on the training documents (256 bytes + EOT at least)",
         257, 1 << 24},
        {"bpe", OPT_STRING, &bpe, "use this directory's encoder.json and vocab.bpe instead (e.g. data/gpt2)"},
        {"valid", OPT_FLOAT, &valid, "share of documents held out for validation", 0, 0.5},
        {"doc-sep", OPT_STRING, &o.doc_sep, "a line that separates documents inside a file"},
        {"force", OPT_FLAG, &force, "write into an --out that already holds files (replacing its tokenizer and shards)"},
    };
    char *inputs[4096];
    int n = 0;
    int st = parse_args(argc, argv, "[options] FILE_OR_DIR...", opts, sizeof opts / sizeof opts[0], inputs, &n, 4096);
    if (st) return st == 2 ? 0 : 1;
    if (n == 0) {
        fprintf(stderr, "mesanet tokenize: give text files or directories (see --help)\n");
        return 1;
    }
    check_out_dir(o.out_dir, force);
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
