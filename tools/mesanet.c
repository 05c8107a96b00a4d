/*
 * mesanet: the command-line tool. `mesanet <command> --help` describes each
 * command; the commands live in tools/cmd_*.c and bench/.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "cpu/runtime.h"
#include "tools/commands.h"

static const Command commands[] = {
    {"tokenize", cmd_tokenize, "text files to token shards, training a BPE tokenizer or using GPT-2's"},
    {"train", cmd_train, "train a language model (MesaNet by default) on token shards"},
    {"eval", cmd_eval, "perplexity, NLL by token position, CG steps; compare two models"},
    {"generate", cmd_generate, "generate text from a trained model with its recurrent state"},
    {"info", cmd_info, "parameters per component and decoding state of a config or run"},
    {"logits", cmd_logits, "dump a model's logits for given tokens (checks against other implementations)"},
    {"export", cmd_export, "write a checkpoint in another layout: ours / Hugging Face's, or NX-AI's xLSTM package's"},
    {"synth", cmd_synth, "train and score mixers on the synthetic tasks (MQAR, MAD, parity, S-NIAH)"},
    {"bench", cmd_bench, "time the layers against this machine's matrix-product rate"},
};

char **mesanet_argv;

static void usage(FILE *f) {
    fprintf(f, "usage: mesanet <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n`mesanet <command> --help` describes a command's options.\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return argc < 2 ? 1 : 0;
    }
    cpu_runtime_setup(argv);
    mesanet_argv = argv;
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "mesanet: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 1;
}
