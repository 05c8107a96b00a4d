/*
 * Writing GPT-2's files, encoder.json and vocab.bpe (bpe_internal.h's bpe_write_files), for
 * bpe_save and the trainer (bpe_train.c).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bpe_internal.h"
#include "core/common.h"

typedef struct {  // a growable byte buffer
    char *p;
    size_t n, cap;
    int failed;   // an allocation failed: the content is incomplete
} Buf;

static void buf_put(Buf *b, const void *data, size_t n) {
    if (b->failed) return;
    if (b->n + n > b->cap) {
        size_t c = b->cap ? b->cap : 4096;
        while (c < b->n + n) c *= 2;
        char *p = realloc(b->p, c);
        if (!p) {
            b->failed = 1;
            return;
        }
        b->p = p;
        b->cap = c;
    }
    memcpy(b->p + b->n, data, n);
    b->n += n;
}

static void buf_str(Buf *b, const char *s) { buf_put(b, s, strlen(s)); }

// A token spelled in the byte alphabet: as UTF-8 (vocab.bpe), or as the inside
// of a JSON string the way Python's json.dumps writes it (ensure_ascii: \uXXXX
// in lower-case hex for everything outside ASCII).
static void put_spelled(Buf *b, const unsigned char *tok, size_t n, int json) {
    for (size_t i = 0; i < n; i++) {
        uint32_t cp = bpe_byte_char(tok[i]);
        char u[16];
        if (cp < 128) {  // printable ASCII: the alphabet has no control characters
            if (json && (cp == '"' || cp == '\\')) buf_put(b, "\\", 1);
            u[0] = (char)cp;
            buf_put(b, u, 1);
        } else if (json) {
            snprintf(u, sizeof u, "\\u%04x", cp);
            buf_put(b, u, 6);
        } else {  // cp < 0x800: two bytes of UTF-8
            u[0] = (char)(0xC0 | cp >> 6);
            u[1] = (char)(0x80 | (cp & 0x3F));
            buf_put(b, u, 2);
        }
    }
}

// Writes dir/name through a temporary file and a rename, so that readers see
// the old file or the new one, never a part.
static int write_atomic(const char *dir, const char *name, const Buf *b) {
    if (b->failed) return mn_error(MN_ERR_NOMEM, "%s/%s: out of memory", dir, name);
    char path[4096], tmp[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path ||
        snprintf(tmp, sizeof tmp, "%s/.%s.XXXXXX", dir, name) >= (int)sizeof tmp)
        return mn_error(MN_ERR_ARG, "%s: path too long", dir);
    int fd = mkstemp(tmp);
    if (fd < 0) return mn_error(MN_ERR_IO, "%s: cannot create (%s)", tmp, strerror(errno));
    // mkstemp makes the file 0600; the files we write get the usual 0666 less the umask.
    mode_t mask = umask(0);
    umask(mask);
    if (fchmod(fd, 0666 & ~mask)) {
        int err = errno;
        close(fd);
        unlink(tmp);
        return mn_error(MN_ERR_IO, "%s: cannot set its permissions (%s)", tmp, strerror(err));
    }
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        close(fd);
        unlink(tmp);
        return mn_error(MN_ERR_IO, "%s: cannot open (%s)", tmp, strerror(errno));
    }
    int ok = fwrite(b->p, 1, b->n, f) == b->n && fflush(f) == 0 && fsync(fd) == 0;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path)) {
        int err = errno;
        unlink(tmp);
        return mn_error(MN_ERR_IO, "%s: cannot write (%s)", path, strerror(err));
    }
    return MN_OK;
}

int bpe_write_files(const char *dir, const unsigned char *bytes, const size_t *off, int n, const int32_t *merges,
                    int nmerges) {
    MN_TRY(mn_mkdirs(dir));  // with its parents
    Buf enc = {0}, voc = {0};
    buf_str(&enc, "{");
    for (int i = 0; i < n; i++) {
        char num[32];
        buf_str(&enc, i ? ", \"" : "\"");
        put_spelled(&enc, bytes + off[i], off[i + 1] - off[i], 1);
        snprintf(num, sizeof num, "\": %d", i);
        buf_str(&enc, num);
    }
    buf_str(&enc, "}");
    buf_str(&voc, "#version: 0.2\n");
    for (int r = 0; r < nmerges; r++) {
        int32_t a = merges[2 * r], b = merges[2 * r + 1];
        put_spelled(&voc, bytes + off[a], off[a + 1] - off[a], 0);
        buf_str(&voc, " ");
        put_spelled(&voc, bytes + off[b], off[b + 1] - off[b], 0);
        buf_str(&voc, "\n");
    }
    int s = write_atomic(dir, "encoder.json", &enc);
    if (!s) s = write_atomic(dir, "vocab.bpe", &voc);
    free(enc.p);
    free(voc.p);
    return s;
}
