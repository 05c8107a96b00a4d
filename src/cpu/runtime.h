/*
 * Settings the OpenMP runtime and the BLAS read only when they load (before main): a program
 * calls cpu_runtime_setup first thing, and it re-executes the program once with them in its
 * environment where they are missing. A user's own settings are left alone.
 */
#ifndef MN_CPU_RUNTIME_H
#define MN_CPU_RUNTIME_H

void cpu_runtime_setup(char **argv);

#endif
