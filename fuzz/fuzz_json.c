/*
 * Fuzzes the JSON reader (src/core/json.h): configs, safetensors headers and
 * tokenizer vocabularies all go through json_parse.
 *
 * Input: any bytes, parsed as one JSON document. A parsed tree is walked
 * whole (every member looked up again by its key, numbers flattened), so that
 * a node left half-built or a string without its terminator shows up under
 * AddressSanitizer. Seeds: the JSON files the tool writes (fuzz/seeds.c) and
 * the edge cases in fuzz/edge/json/.
 *
 *     make fuzz FUZZ_TARGETS=json FUZZ_TIME=60
 */
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "fuzz.h"

static size_t walk(const Json *j, int depth) {
    size_t n = 1;
    if (j->type == JSON_STRING && (!j->string || strlen(j->string) > j->string_len)) abort();
    for (int i = 0; i < j->count; i++) {
        const Json *c = &j->items[i];
        if (j->type == JSON_OBJECT) {
            if (!c->key) abort();
            // the first member of that name (duplicates are kept, in order)
            const Json *g = json_get(j, c->key);
            if (!g || strcmp(g->key, c->key)) abort();
        }
        n += walk(c, depth + 1);
    }
    return n;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_init();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Json *j = NULL;
    if (json_parse((const char *)data, size, "fuzz", &j)) return 0;
    walk(j, 0);
    double nums[8];
    json_numbers(j, nums, 8, "fuzz");
    json_get(j, "model_type");
    json_free(j);
    return 0;
}
