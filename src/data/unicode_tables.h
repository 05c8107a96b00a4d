/*
 * The character classes of GPT-2's pre-tokenizer, as code point ranges
 * generated from JavaScript's regex engine (scripts/gen_unicode_tables.js
 * writes unicode_tables.c).
 */
#ifndef MN_UNICODE_TABLES_H
#define MN_UNICODE_TABLES_H

#include <stdint.h>

typedef struct {
    uint32_t lo, hi;  // inclusive
} UniRange;

extern const UniRange uni_letter[];  // \p{L}
extern const int uni_letter_count;
extern const UniRange uni_number[];  // \p{N}
extern const int uni_number_count;
extern const UniRange uni_space[];   // \s
extern const int uni_space_count;

#endif
