/*
 * Regression tests for what the fuzzers (fuzz/), the sanitizer build (make
 * SAN=1) and the review of the parsers around them found: each input is the
 * smallest form of one that failed, with the file and the fault it showed.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <sys/stat.h>

#include "../src/core/common.h"
#include "../src/core/json.h"
#include "../src/data/bpe.h"
#include "../src/train/loss_log.h"
#include "test.h"
#include "tmpdir.h"

// A whole file as a NUL-terminated string (NULL if it cannot be read).
static char *read_text(const char *path) {
    size_t n;
    unsigned char *b = read_bytes(path, &n);
    char *s = b ? malloc(n + 1) : NULL;
    if (s) {
        memcpy(s, b, n);
        s[n] = 0;
    }
    free(b);
    return s;
}

// fuzz_loss_log: a loss.csv whose losses are all infinite was read, and the next save of the
// resumed run failed (loss_log_write: "plot ...: no point has finite x and y"). Training stops at
// a non-finite loss, so such a file is not ours: refused when read, naming the line.
TEST(fuzz_regress_loss_log_infinite_loss) {
    static const char text[] = "step,loss,lr,grad_norm,tokens,seconds,val_loss\n"
                               "1,5.1e3084,8.33333333166666e-05,1.5,1024,25,3331e308\n";
    LossLog log;
    int s = loss_log_parse(text, sizeof text - 1, "loss.csv", &log);
    CHECK(s == MN_ERR_FORMAT && strstr(mn_last_error(), "loss.csv:2:"), "status %d: %s", s, mn_last_error());
    CHECK(log.n == 0 && !log.rows, "a refused log is left empty");
    // a finite loss with an infinite validation loss and gradient norm still reads, and writes
    static const char ok[] = "step,loss,lr,grad_norm,tokens,seconds,val_loss\n1,5.5,0.001,inf,1024,0.5,inf\n";
    CHECK(!loss_log_parse(ok, sizeof ok - 1, "loss.csv", &log) && log.n == 1, "%s", mn_last_error());
    TmpDir t;
    tmp_make(&t);
    CHECK(!loss_log_write(&log, t.dir), "%s", mn_last_error());
    loss_log_free(&log);
    tmp_remove(&t);
}

// fuzz_loss_log: a loss.csv with one subnormal loss (6e-323) was read, and plotting it on the next
// save was undefined behaviour: the axis's span underflowed to 0, and log10 of a zero step went
// into an int (src/core/plot.c, axis_linear). Now a span too small to divide is widened.
TEST(fuzz_regress_loss_log_subnormal_loss_plots) {
    static const char text[] = "step,loss,lr,grad_norm,tokens,seconds,val_loss\n"
                               "1,-061e-324,0.001,.5,1024,0.25,nan\n"
                               "2,5e-324,0.001,.5,2048,0.5,5e-324\n";
    LossLog log;
    CHECK(!loss_log_parse(text, sizeof text - 1, "loss.csv", &log) && log.n == 2, "%s", mn_last_error());
    TmpDir t;
    tmp_make(&t);
    for (int n = 1; n <= 2; n++) {  // one point, then two points a subnormal apart
        log.n = n;
        CHECK(!loss_log_write(&log, t.dir), "%d rows: %s", n, mn_last_error());
        char *svg = read_text(tmp_path(&t, "loss.svg"));
        CHECK(svg && *svg && !strstr(svg, "nan") && !strstr(svg, "inf"), "%d rows: loss.svg is missing or holds NaN", n);
        free(svg);
    }
    loss_log_free(&log);
    tmp_remove(&t);
}

// Review of the file readers: a directory where encoder.json or vocab.bpe should be was measured
// with fseek/ftell, which a directory answers with a huge size, and refused as "cannot read
// 9223372036854775807 bytes" (MN_ERR_NOMEM). json_parse_file and bpe_load now read through
// file_read_all: MN_ERR_IO, "is a directory".
TEST(fuzz_regress_directory_for_a_json_file) {
    TmpDir t;
    tmp_make(&t);
    char enc[300], voc[300];
    snprintf(enc, sizeof enc, "%s", tmp_path(&t, "encoder.json"));
    snprintf(voc, sizeof voc, "%s", tmp_path(&t, "vocab.bpe"));
    CHECK(!mkdir(enc, 0755) && !mkdir(voc, 0755), "mkdir");
    Json *j = NULL;
    int s = json_parse_file(enc, &j);
    CHECK(s == MN_ERR_IO && strstr(mn_last_error(), "is a directory"), "json_parse_file: %d %s", s, mn_last_error());
    Bpe *bpe = NULL;
    s = bpe_load(&bpe, enc, voc);
    CHECK(s == MN_ERR_IO && strstr(mn_last_error(), "is a directory"), "bpe_load: %d %s", s, mn_last_error());
    tmp_remove(&t);
}
