// The subcommands of the mesanet tool, and the option parser they share.
#ifndef MN_COMMANDS_H
#define MN_COMMANDS_H

#include "mesanet.h"
#include "train/dist.h"

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);  // argv[0] is the command's name
    const char *help;
} Command;

// The tool's own arguments (argv of main), for commands that run it again (train --gpus).
extern char **mesanet_argv;

// For commands with --gpus: in a rank that dist_launch started, joins its group and returns 1
// (go on as rank g); in the command as the user ran it, with gpus > 1, runs the ranks, waits for
// them and returns 0 with *exit_code set; alone (gpus 1), returns 1 with g of size 1.
int ranks_begin(const char *cmd, int gpus, Group *g, int *exit_code);

int cmd_bench(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_synth(int argc, char **argv);

typedef enum { OPT_INT, OPT_FLOAT, OPT_STRING, OPT_FLAG } OptType;

typedef struct {
    const char *name;  // without the leading "--"
    OptType type;
    void *dst;         // int*, float*, const char**, int* (flag: set to 1)
    const char *help;  // shown by --help, with the default value and the range
    double lo, hi;     // OPT_INT, OPT_FLOAT: the accepted values, both included. Every numeric option
                       // needs them (lo < hi): a table without is refused before any parsing
} Option;

// Parses "--name value" / "--name=value" options and up to max_pos positional
// arguments. A numeric value must be wholly a number (an integer for OPT_INT),
// finite and within [lo, hi]. Returns 0 on success; prints help and returns 2
// for --help, or an error naming the option and its range and returns 1.
// argv[0] is the command as the user names it ("train", "bench mesa").
int parse_args(int argc, char **argv, const char *usage, const Option *opts, int nopts, char **pos, int *npos,
               int max_pos);

// Checks an option table: every numeric option has a range lo < hi (integers
// within int for OPT_INT) holding its default. Returns 0, or prints what is
// wrong as `mesanet cmd: ...` and returns 1. parse_args runs it first.
int options_check(const char *cmd, const Option *opts, int nopts);

// Prints `mesanet cmd: message` to stderr and exits with status 1.
void cmd_fail(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));

// --lin-precision: the lin family's GPU products (MnPrecision), from "auto", "split" or "bf16";
// anything else fails the command naming the option and what it takes.
#define LIN_PRECISION_HELP                                                                                         \
    "products of the gla/mamba2/deltanet/gdn GPU kernels: auto (bf16 for gla and mamba2, split for the delta rule), " \
    "split (about float32's accuracy) or bf16 (fla's; faster)"
MnPrecision lin_precision_arg(const char *cmd, const char *s);

#endif
