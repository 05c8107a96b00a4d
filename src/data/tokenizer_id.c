#include "tokenizer_id.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"

const char *const tokenizer_files[TOKENIZER_NFILES] = {"encoder.json", "vocab.bpe"};

int tokenizer_recorded(const char *dir) {
    for (int i = 0; i < TOKENIZER_NFILES; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, tokenizer_files[i]);
        if (!access(path, F_OK)) return 1;
    }
    return 0;
}

// Opens path for reading: the file, or NULL with *missing = 1 where nothing is there; fails
// naming the file for any other reason (a directory, no permission).
static int open_if_there(const char *path, FILE **f, int *missing) {
    *missing = 0;
    *f = fopen(path, "rb");
    if (*f) return MN_OK;
    if (errno == ENOENT) {
        *missing = 1;
        return MN_OK;
    }
    return mn_error(MN_ERR_IO, "%s: cannot open (%s)", path, strerror(errno));
}

// *same = 1 when both streams hold the same bytes.
static int same_bytes(FILE *a, FILE *b, const char *pa, const char *pb, int *same) {
    unsigned char ba[16384], bb[16384];
    for (;;) {
        size_t na = fread(ba, 1, sizeof ba, a), nb = fread(bb, 1, sizeof bb, b);
        if (ferror(a)) return mn_error(MN_ERR_IO, "%s: cannot read", pa);
        if (ferror(b)) return mn_error(MN_ERR_IO, "%s: cannot read", pb);
        if (na != nb || memcmp(ba, bb, na)) {
            *same = 0;
            return MN_OK;
        }
        if (na < sizeof ba) {  // both ended at the same byte
            *same = 1;
            return MN_OK;
        }
    }
}

int tokenizer_compare(const char *a, const char *b, int *same, char *why, size_t cap) {
    *same = 1;
    if (cap) why[0] = 0;
    for (int i = 0; i < TOKENIZER_NFILES && *same; i++) {
        char pa[4096], pb[4096];
        snprintf(pa, sizeof pa, "%s/%s", a, tokenizer_files[i]);
        snprintf(pb, sizeof pb, "%s/%s", b, tokenizer_files[i]);
        FILE *fa, *fb;
        int missing_a, missing_b, s = open_if_there(pa, &fa, &missing_a);
        if (s) return s;
        if ((s = open_if_there(pb, &fb, &missing_b))) {
            if (fa) fclose(fa);
            return s;
        }
        if (missing_a != missing_b) {
            *same = 0;
            snprintf(why, cap, "%s is missing from %s", tokenizer_files[i], missing_a ? a : b);
        } else if (!missing_a) {
            s = same_bytes(fa, fb, pa, pb, same);
            if (!s && !*same) snprintf(why, cap, "%s differs", tokenizer_files[i]);
        }
        if (fa) fclose(fa);
        if (fb) fclose(fb);
        if (s) return s;
    }
    return MN_OK;
}
