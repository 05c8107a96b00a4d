/*
 * Atomic file replacement (see atomic_file.h): temporary file, fsync, rename.
 */
#include "atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"

int af_open(AtomicFile *af, const char *path) {
    memset(af, 0, sizeof *af);
    if (!path || !path[0]) return mn_error(MN_ERR_ARG, "atomic write: empty path");
    size_t n = strlen(path);
    af->tmp = malloc(n + 5);
    if (!af->tmp) return mn_error(MN_ERR_NOMEM, "%s: out of memory", path);
    memcpy(af->tmp, path, n);
    memcpy(af->tmp + n, ".tmp", 5);
    af->path = path;
    af->f = fopen(af->tmp, "wb");
    if (!af->f) {
        int e = errno;
        free(af->tmp);
        af->tmp = NULL;
        return mn_error(MN_ERR_IO, "%s: cannot create the temporary %s.tmp: %s", path, path, strerror(e));
    }
    return MN_OK;
}

int af_write(AtomicFile *af, const void *data, size_t n) {
    if (n && fwrite(data, 1, n, af->f) != n)
        return mn_error(MN_ERR_IO, "%s: write of %zu bytes failed: %s", af->tmp, n, strerror(errno));
    return MN_OK;
}

void af_abort(AtomicFile *af) {
    if (af->f) fclose(af->f);
    if (af->tmp) remove(af->tmp);
    free(af->tmp);
    memset(af, 0, sizeof *af);
}

// fsync of the directory makes the rename itself durable. Some file systems
// refuse fsync on directories; by then the new file is complete and in place,
// so this step is best effort and never turns a finished write into an error.
static void sync_parent_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    if (!dir) return;
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
    free(dir);
}

// Removes the temporary and records "<path>: <what>: <errno text>".
static int commit_failed(AtomicFile *af, const char *what, int e) {
    const char *path = af->path;
    af_abort(af);
    return mn_error(MN_ERR_IO, "%s: %s: %s", path, what, strerror(e));
}

int af_commit(AtomicFile *af) {
    // ferror catches any earlier unchecked fprintf that failed (the flag is sticky).
    if (ferror(af->f)) return commit_failed(af, "an earlier write to the temporary failed", errno);
    if (fflush(af->f)) return commit_failed(af, "fflush of the temporary failed", errno);
    if (fsync(fileno(af->f))) return commit_failed(af, "fsync of the temporary failed", errno);
    int closed = fclose(af->f);
    af->f = NULL;
    if (closed) return commit_failed(af, "fclose of the temporary failed", errno);
    if (rename(af->tmp, af->path)) return commit_failed(af, "cannot rename the temporary over it", errno);
    sync_parent_dir(af->path);
    free(af->tmp);
    memset(af, 0, sizeof *af);
    return MN_OK;
}

int af_copy(const char *src, const char *dst) {
    FILE *in = fopen(src, "rb");
    if (!in) return mn_error(MN_ERR_IO, "%s: cannot open: %s", src, strerror(errno));
    AtomicFile af;
    int s = af_open(&af, dst);
    if (s) {
        fclose(in);
        return s;
    }
    char buf[1 << 16];
    size_t n;
    while (!s && (n = fread(buf, 1, sizeof buf, in)) > 0) s = af_write(&af, buf, n);
    if (!s && ferror(in)) s = mn_error(MN_ERR_IO, "%s: read failed: %s", src, strerror(errno));
    fclose(in);
    if (s) {
        af_abort(&af);
        return s;
    }
    return af_commit(&af);
}

int file_read_all(const char *path, size_t max_bytes, char **text, size_t *n) {
    *text = NULL;
    *n = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return mn_error(MN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) || !S_ISREG(st.st_mode)) {
        int dir = S_ISDIR(st.st_mode);
        fclose(f);
        return mn_error(MN_ERR_IO, "%s: %s", path, dir ? "is a directory" : "not a regular file");
    }
    // Read to the end, whatever the size said (the file may change meanwhile).
    size_t len = 0, cap = 4096;
    char *buf = malloc(cap);
    int s = buf ? MN_OK : mn_error(MN_ERR_NOMEM, "%s: out of memory", path);
    while (!s) {
        if (len + 1 >= cap) {
            char *nb = cap <= max_bytes ? realloc(buf, cap * 2) : NULL;
            if (!nb) {
                s = cap > max_bytes ? mn_error(MN_ERR_IO, "%s: larger than %zu bytes", path, max_bytes)
                                    : mn_error(MN_ERR_NOMEM, "%s: out of memory", path);
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + len, 1, cap - 1 - len, f);
        len += got;
        if (got == 0) break;
    }
    if (!s && ferror(f)) s = mn_error(MN_ERR_IO, "%s: read failed: %s", path, strerror(errno));
    if (!s && len > max_bytes) s = mn_error(MN_ERR_IO, "%s: larger than %zu bytes", path, max_bytes);
    fclose(f);
    if (s) {
        free(buf);
        return s;
    }
    buf[len] = 0;
    *text = buf;
    *n = len;
    return MN_OK;
}
