/*
 * A small JSON reader (configs, golden files, tokenizer vocabularies). The
 * whole document becomes a tree of Json nodes; errors name the line.
 */
#ifndef MN_JSON_H
#define MN_JSON_H

#include <stddef.h>

typedef enum { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } JsonType;

typedef struct Json {
    JsonType type;
    double number;       // JSON_NUMBER, and JSON_BOOL as 0/1
    char *string;        // JSON_STRING: decoded UTF-8, NUL-terminated
    size_t string_len;   // its length in bytes (strings may hold \u0000)
    char *key;           // member name when the node sits in an object
    struct Json *items;  // JSON_ARRAY elements or JSON_OBJECT members
    int count;
    int line;            // line where the value starts, for messages
} Json;

// Parses text[0..len); on failure returns MN_ERR_FORMAT with "<name>:<line>: ..."
int json_parse(const char *text, size_t len, const char *name, Json **out);
int json_parse_file(const char *path, Json **out);
void json_free(Json *j);

// The member `key` of an object, or NULL.
const Json *json_get(const Json *obj, const char *key);
// Flattens a number or nested arrays of numbers into out[0..n); MN_ERR_FORMAT
// naming `what` unless exactly n numbers are found.
int json_numbers(const Json *j, double *out, size_t n, const char *what);

// A member's value v (named `key` in messages) read as an int (a whole number of at most 1e9 in
// size), a float (finite, in the float range) or a flag (true / false, or the numbers 0 and 1);
// otherwise MN_ERR_FORMAT "<where>:<line>: ..." naming the key, and *out untouched.
int json_int(const Json *v, const char *key, const char *where, int *out);
int json_float(const Json *v, const char *key, const char *where, float *out);
int json_flag(const Json *v, const char *key, const char *where, int *out);

// The shortest decimal that reads back as v (as a float where `single`), written as a JSON number
// Python reads as a float ("64.0", not "64": configs checked by type want a float), into buf[n].
void json_float_text(char *buf, size_t n, double v, int single);

#endif
