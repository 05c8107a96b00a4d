/*
 * The diagonal recurrences' float32 CPU core (scan.c; core/backend.h's ScanOps: the RG-LRU and
 * Longhorn kinds): tasks of one sequence and a block of channels over the threads, vectorised
 * over the block's channels; the backward recomputes the states from chunk-boundary copies.
 */
#ifndef MN_SCAN_CPU_H
#define MN_SCAN_CPU_H

#include "core/backend.h"

extern const ScanOps cpu_scan;  // supports NULL: every shape

#endif
