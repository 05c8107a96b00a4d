// The ops of the backends whose memory is the host's (ref, cpu), and what memory the host has left.
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "backend.h"
#include "common.h"

int host_upload_i32(const Backend *be, void *dst, const int32_t *src, size_t n) {
    (void)be;
    memcpy(dst, src, n * sizeof(int32_t));
    return MN_OK;
}

int host_download_i32(const Backend *be, int32_t *dst, const void *src, size_t n) {
    (void)be;
    memcpy(dst, src, n * sizeof(int32_t));
    return MN_OK;
}

int host_tally_i32(const Backend *be, void *sum, void *count, const void *x, size_t n) {
    (void)be;
    int32_t *s = sum, *c = count;
    const int32_t *v = x;
    for (size_t i = 0; i < n; i++) {
        s[i] += v[i];
        c[i] += 1;
    }
    return MN_OK;
}

// The number after `key` on a line of a /proc or /sys file ("MemAvailable:", "inactive_file"), or
// of the file's first line when key is NULL; 0 when absent or unreadable ("max" reads as absent).
static int read_number(const char *path, const char *key, uint64_t *out) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[256];
    int found = 0;
    size_t klen = key ? strlen(key) : 0;
    while (!found && fgets(line, sizeof line, f)) {
        if (key && strncmp(line, key, klen)) continue;
        found = sscanf(line + klen, "%" SCNu64, out) == 1;
        if (!key) break;
    }
    fclose(f);
    return found;
}

// What a memory cgroup leaves: its limit less its usage (the page cache it could drop not counted
// as used). cgroup v2 (memory.max) or v1 (memory.limit_in_bytes), at the root of the cgroup
// namespace where containers see their own. SIZE_MAX without a limit.
static size_t cgroup_available(void) {
    static const struct {
        const char *limit, *usage, *stat, *cache;
    } kinds[] = {
        {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory.stat", "inactive_file "},
        {"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes",
         "/sys/fs/cgroup/memory/memory.stat", "total_inactive_file "},
    };
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        uint64_t limit, usage, cache = 0;
        if (!read_number(kinds[i].limit, NULL, &limit) || !read_number(kinds[i].usage, NULL, &usage)) continue;
        if (limit >= (uint64_t)1 << 60) continue;  // v1 writes "no limit" as a number near 2^63
        read_number(kinds[i].stat, kinds[i].cache, &cache);
        usage = usage > cache ? usage - cache : 0;
        return limit > usage ? (size_t)(limit - usage) : 0;
    }
    return SIZE_MAX;
}

// What ulimit -v leaves of the address space.
static size_t address_space_available(void) {
    struct rlimit rl;
    uint64_t pages;
    if (getrlimit(RLIMIT_AS, &rl) || rl.rlim_cur == RLIM_INFINITY || !read_number("/proc/self/statm", NULL, &pages))
        return SIZE_MAX;
    uint64_t used = pages * (uint64_t)sysconf(_SC_PAGESIZE);
    return rl.rlim_cur > used ? (size_t)(rl.rlim_cur - used) : 0;
}

size_t host_mem_available(void) {
    uint64_t kb;
    size_t avail = read_number("/proc/meminfo", "MemAvailable:", &kb) ? (size_t)(kb * 1024) : SIZE_MAX;
    size_t cg = cgroup_available(), as = address_space_available();
    if (cg < avail) avail = cg;
    return as < avail ? as : avail;
}

size_t host_mem_available_op(const Backend *be) {
    (void)be;
    return host_mem_available();
}

void recorded_reset(Recorded *r, const Backend *be) {
    if (r->graph) be->graph_free(be, r->graph);
    r->graph = NULL;
    r->warm = 0;
}

int recorded_run(Recorded *r, const Backend *be, int (*ops)(void *arg), void *arg) {
    if (!r->graph) {
        if (!r->warm) {
            r->warm = 1;
            return ops(arg);
        }
        MN_TRY(be->graph_begin(be));
        int st = ops(arg);
        void *g = NULL;
        int st_end = be->graph_end(be, &g);  // ends the recording even after a failed op
        if (st || st_end) {
            if (g) be->graph_free(be, g);
            return st ? st : st_end;
        }
        r->graph = g;
    }
    int st = be->graph_run(be, r->graph);
    if (!st) r->replays++;
    if (st != MN_ERR_ARG) return st;
    recorded_reset(r, be);  // stale: this call eagerly (warm again), the next records again
    r->warm = 1;
    return ops(arg);
}
