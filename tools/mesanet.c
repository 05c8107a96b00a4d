// mesanet: the command-line tool.
#include <stdio.h>
#include <string.h>

#include "core/common.h"

int main(int argc, char **argv) {
    printf("usage: mesanet <command> [options]\n");
    return argc > 1 && strcmp(argv[1], "--help") ? 1 : 0;
}
