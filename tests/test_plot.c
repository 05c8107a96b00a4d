// SVG plots and CSV tables: well-formed XML, the expected elements and tick
// labels, NaN handling, errors, and CSV numbers that round-trip exactly.
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "core/csv.h"
#include "core/plot.h"
#include "test.h"
#include "tmpdir.h"

#define MINUS "\xe2\x88\x92"  // U+2212, the minus sign of tick labels

// ---------------------------------------------------------------------------
// A tiny XML well-formedness checker: balanced, properly nested tags, quoted
// attributes, one root element, and only the predefined or numeric entities.
// Returns NULL if well-formed, else what is wrong.

static const char *check_entity(const char **p) {
    static const char *named[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"};
    for (int i = 0; i < 5; i++)
        if (!strncmp(*p, named[i], strlen(named[i]))) {
            *p += strlen(named[i]);
            return NULL;
        }
    if (!strncmp(*p, "&#", 2)) {
        const char *q = *p + 2;
        if (*q == 'x') q++;
        const char *digits = q;
        while (strchr("0123456789abcdefABCDEF", *q) && *q) q++;
        if (q > digits && *q == ';') {
            *p = q + 1;
            return NULL;
        }
    }
    return "bad entity reference";
}

static const char *xml_wellformed(const char *s) {
    enum { MAX_DEPTH = 64 };
    char stack[MAX_DEPTH][32];
    int depth = 0, roots = 0;
    const char *p = s;
    if (!strncmp(p, "<?xml", 5)) {
        p = strstr(p, "?>");
        if (!p) return "unterminated XML declaration";
        p += 2;
    }
    while (*p) {
        if (*p == '&') {
            const char *e = check_entity(&p);
            if (e) return e;
            continue;
        }
        if (*p == '>') return "stray '>' in text";
        if (*p != '<') {
            if (!depth && !strchr(" \t\r\n", *p)) return "text outside the root element";
            p++;
            continue;
        }
        if (!strncmp(p, "<!--", 4)) {
            p = strstr(p, "-->");
            if (!p) return "unterminated comment";
            p += 3;
            continue;
        }
        int closing = p[1] == '/';
        p += 1 + closing;
        char name[32];
        int n = 0;
        while ((isalnum((unsigned char)*p) || strchr("-_:.", *p)) && *p && n < 31) name[n++] = *p++;
        name[n] = 0;
        if (!n) return "tag without a name";
        if (closing) {
            while (*p == ' ') p++;
            if (*p != '>') return "junk in a closing tag";
            p++;
            if (!depth || strcmp(stack[depth - 1], name)) return "closing tag does not match the open one";
            depth--;
            continue;
        }
        // Attributes: name="value" with no '<' or stray '&' in the value.
        for (;;) {
            while (strchr(" \t\r\n", *p) && *p) p++;
            if (*p == '>' || !strncmp(p, "/>", 2)) break;
            const char *a = p;
            while ((isalnum((unsigned char)*p) || strchr("-_:.", *p)) && *p) p++;
            if (p == a || *p != '=' || (p[1] != '"' && p[1] != '\'')) return "malformed attribute";
            char quote = p[1];
            p += 2;
            while (*p && *p != quote) {
                if (*p == '<') return "'<' inside an attribute value";
                if (*p == '&') {
                    const char *e = check_entity(&p);
                    if (e) return e;
                } else {
                    p++;
                }
            }
            if (!*p) return "unterminated attribute value";
            p++;
        }
        if (!depth) roots++;
        if (*p == '/') {
            p += 2;
            continue;
        }
        p++;
        if (depth == MAX_DEPTH) return "nesting too deep";
        snprintf(stack[depth++], sizeof stack[0], "%s", name);
    }
    if (depth) return "unclosed element at the end";
    if (roots != 1) return "not exactly one root element";
    return NULL;
}

static int count(const char *s, const char *what) {
    int n = 0;
    for (const char *p = s; (p = strstr(p, what)); p += strlen(what)) n++;
    return n;
}

// The texts of the <text class="cls"> elements, "|"-joined: "0|0.2|0.4".
static void tick_texts(const char *svg, const char *cls, char *out, size_t cap) {
    char key[64];
    snprintf(key, sizeof key, "class=\"%s\"", cls);
    out[0] = 0;
    size_t at = 0;
    for (const char *p = svg; (p = strstr(p, key)); p += strlen(key)) {
        const char *t = strchr(p, '>');
        if (!t) break;
        t++;
        size_t n = strcspn(t, "<");
        at += (size_t)snprintf(out + at, at < cap ? cap - at : 0, "%s%.*s", at ? "|" : "", (int)n, t);
        if (at >= cap) break;
    }
}

// Plots, reads back and checks well-formedness; NULL (after a recorded
// failure) if the plot could not be made.
static char *plot_and_read(TmpDir *td, const PlotOpts *o, const PlotSeries *s, int ns) {
    const char *path = tmp_path(td, "plot.svg");
    if (plot_svg(path, o, s, ns)) {
        CHECK(0, "plot_svg: %s", mn_last_error());
        return NULL;
    }
    size_t n;
    char *svg = (char *)read_bytes(path, &n);
    if (!svg) {
        CHECK(0, "cannot read back %s", path);
        return NULL;
    }
    svg[n] = 0;
    const char *bad = xml_wellformed(svg);
    CHECK(!bad, "SVG not well-formed: %s", bad);
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK(access(tmp, F_OK) != 0, "a .tmp file was left behind");
    return svg;
}

// ---------------------------------------------------------------------------

TEST(io_plot_checker_rejects) {
    // The checker itself must be able to fail.
    const char *bad[] = {"<a><b></a></b>", "<a>", "<a x=1/>", "<a>&foo;</a>", "<a/><b/>", "<a x=\"<\"/>", "</a>"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) CHECK(xml_wellformed(bad[i]), "accepted %s", bad[i]);
    CHECK(!xml_wellformed("<?xml version=\"1.0\"?>\n<a x='1'><b/>t &amp; &#8722;<!-- c --></a>\n"), "rejected good XML");
}

TEST(io_plot_linear) {
    TmpDir td;
    tmp_make(&td);
    enum { N = 11 };
    double x[N], y1[N], y2[N];
    for (int i = 0; i < N; i++) x[i] = i, y1[i] = i / 10.0, y2[i] = 1 - i / 10.0;
    PlotSeries s[2] = {{"rising <a&b>", x, y1, N}, {"falling", x, y2, N}};
    PlotOpts o = {"Loss \"curves\" <&> 'q'", "step", "loss", 0, 0, 0, 0};
    char *svg = plot_and_read(&td, &o, s, 2);
    if (svg) {
        CHECK(strstr(svg, "width=\"720\" height=\"440\""), "default size");
        CHECK(strstr(svg, "Loss &quot;curves&quot; &lt;&amp;&gt; &apos;q&apos;"), "escaped title missing");
        CHECK(strstr(svg, ">rising &lt;a&amp;b&gt;</text>") && strstr(svg, ">falling</text>"), "legend names");
        CHECK(strstr(svg, ">step</text>") && strstr(svg, ">loss</text>"), "axis labels");
        CHECK(count(svg, "<path") == 2 && count(svg, "<circle") == 0, "%d paths, %d circles", count(svg, "<path"),
              count(svg, "<circle"));
        CHECK(count(svg, "class=\"legend-name\"") == 2, "legend rows");
        CHECK(!strstr(svg, "class=\"zero\""), "zero line where y does not span 0");
        char ticks[512];
        tick_texts(svg, "ytick", ticks, sizeof ticks);
        CHECK(!strcmp(ticks, "0|0.2|0.4|0.6|0.8|1") || !strcmp(ticks, "0|0.5|1") ||
                  !strcmp(ticks, "0|0.1|0.2|0.3|0.4|0.5|0.6|0.7|0.8|0.9|1"),
              "y ticks %s", ticks);
        tick_texts(svg, "xtick", ticks, sizeof ticks);
        CHECK(!strcmp(ticks, "0|2|4|6|8|10") || !strcmp(ticks, "0|1|2|3|4|5|6|7|8|9|10") || !strcmp(ticks, "0|5|10"),
              "x ticks %s", ticks);
        free(svg);
    }
    tmp_remove(&td);
}

TEST(io_plot_log_axes) {
    TmpDir td;
    tmp_make(&td);
    // Positions 1..1000 on a log x axis; the points at 0 and -1 are skipped.
    double x[6] = {-1, 0, 1, 10, 100, 1000}, y[6] = {5, 5, 4, 3.5, 3, 2.8};
    PlotSeries s = {"nll", x, y, 6};
    PlotOpts o = {"per position", "position", "NLL", 1, 0, 0, 0};
    char *svg = plot_and_read(&td, &o, &s, 1);
    char ticks[512];
    if (svg) {
        tick_texts(svg, "xtick", ticks, sizeof ticks);
        CHECK(!strcmp(ticks, "1|10|100|1000"), "log x ticks %s", ticks);
        CHECK(count(svg, "<path") == 1 && count(svg, " L") == 3, "one path through the 4 positive points");
        free(svg);
    }
    // Six decades on a log y axis: labelled at decades, superscripts beyond 10^4.
    double x2[2] = {1, 2}, y2[2] = {1e-8, 1e-2};
    PlotSeries s2 = {"err", x2, y2, 2};
    PlotOpts o2 = {NULL, NULL, NULL, 0, 1, 0, 0};
    svg = plot_and_read(&td, &o2, &s2, 1);
    if (svg) {
        tick_texts(svg, "ytick", ticks, sizeof ticks);
        CHECK(strstr(ticks, "10|10|10") && strstr(svg, "0.01</text>"), "log y ticks %s", ticks);
        CHECK(strstr(svg, ">" MINUS "8</tspan>") && strstr(svg, ">" MINUS "5</tspan>"), "10^-8 and 10^-5 labels");
        CHECK(!strstr(svg, "class=\"title\""), "no title element without a title");
        free(svg);
    }
    // Within two decades the 2 and 5 multiples are labelled too.
    double y3[2] = {1, 100};
    PlotSeries s3 = {"a", x2, y3, 2};
    svg = plot_and_read(&td, &o2, &s3, 1);
    if (svg) {
        tick_texts(svg, "ytick", ticks, sizeof ticks);
        CHECK(!strcmp(ticks, "1|2|5|10|20|50|100"), "log y ticks %s", ticks);
        free(svg);
    }
    // Within a factor of 10, nice linear values on the log scale (not 9..20).
    double y4[2] = {9.5, 10.5};
    PlotSeries s4 = {"a", x2, y4, 2};
    svg = plot_and_read(&td, &o2, &s4, 1);
    if (svg) {
        tick_texts(svg, "ytick", ticks, sizeof ticks);
        CHECK(strstr(ticks, "|10|") && !strstr(ticks, "20") && count(svg, "class=\"ytick\"") >= 3, "narrow log y ticks %s",
              ticks);
        free(svg);
    }
    tmp_remove(&td);
}

TEST(io_plot_nan_and_markers) {
    TmpDir td;
    tmp_make(&td);
    // A line broken by a NaN, an isolated point between NaNs, a one-point series.
    double x[8] = {0, 1, 2, 3, 4, 5, 6, 7}, y[8] = {1, 2, NAN, 3, INFINITY, 4, 5, 6};
    double px[1] = {3.5}, py[1] = {2.5};
    PlotSeries s[2] = {{"broken", x, y, 8}, {"single", px, py, 1}};
    char *svg = plot_and_read(&td, NULL, s, 2);
    if (svg) {
        CHECK(count(svg, "<path") == 1, "%d paths", count(svg, "<path"));
        const char *d = strstr(svg, " d=\"");
        int moves = 0;
        for (size_t i = 4; d && d[i] && d[i] != '"'; i++) moves += d[i] == 'M';
        CHECK(moves == 2, "%d line pieces, expected 2 (broken at the NaN, the point between NaN and inf a marker)", moves);
        CHECK(count(svg, "class=\"marker\"") == 2, "%d markers (isolated point + single-point series)",
              count(svg, "class=\"marker\""));
        CHECK(!strstr(svg, "nan") && !strstr(svg, "inf"), "non-finite numbers in the SVG");
        free(svg);
    }
    tmp_remove(&td);
}

TEST(io_plot_zero_line) {
    TmpDir td;
    tmp_make(&td);
    double x[3] = {1, 2, 3}, y[3] = {0.3, -0.1, -0.5};
    PlotSeries s = {"delta", x, y, 3};
    PlotOpts o = {"Delta NLL", "position", "delta", 0, 0, 400, 300};
    char *svg = plot_and_read(&td, &o, &s, 1);
    if (svg) {
        CHECK(count(svg, "class=\"zero\"") == 1, "zero line missing");
        CHECK(strstr(svg, ">" MINUS "0.4</text>") || strstr(svg, ">" MINUS "0.5</text>"), "negative labels use U+2212");
        CHECK(strstr(svg, "width=\"400\" height=\"300\""), "size option");
        free(svg);
    }
    tmp_remove(&td);
}

TEST(io_plot_errors) {
    TmpDir td;
    tmp_make(&td);
    const char *path = tmp_path(&td, "err.svg");
    double x[2] = {1, 2}, y[2] = {NAN, INFINITY}, neg[2] = {-1, 0}, ok[2] = {1, 2};
    PlotSeries nanx = {"nan", x, y, 2}, negy = {"neg", x, neg, 2}, good = {"ok", x, ok, 2}, nullx = {"nx", NULL, ok, 2};
    int s = plot_svg(path, NULL, NULL, 0);
    CHECK(s == MN_ERR_ARG && strstr(mn_last_error(), "no series"), "no series: %d %s", s, mn_last_error());
    s = plot_svg(path, NULL, &nanx, 1);
    CHECK(s == MN_ERR_NUMERIC && strstr(mn_last_error(), "no point has finite x and y"), "all NaN: %s", mn_last_error());
    PlotOpts logy = {NULL, NULL, NULL, 0, 1, 0, 0};
    s = plot_svg(path, &logy, &negy, 1);
    CHECK(s == MN_ERR_ARG && strstr(mn_last_error(), "log y axis"), "log y, no positive y: %s", mn_last_error());
    s = plot_svg(path, NULL, &nullx, 1);
    CHECK(s == MN_ERR_ARG && strstr(mn_last_error(), "NULL x or y"), "NULL x: %s", mn_last_error());
    PlotOpts tiny = {NULL, NULL, NULL, 0, 0, 50, 50};
    s = plot_svg(path, &tiny, &good, 1);
    CHECK(s == MN_ERR_ARG && strstr(mn_last_error(), "size"), "tiny size: %s", mn_last_error());
    CHECK(access(path, F_OK) != 0, "a refused plot left a file");
    s = plot_svg(tmp_path(&td, "missing/dir.svg"), NULL, &good, 1);
    CHECK(s == MN_ERR_IO && strstr(mn_last_error(), "missing/dir.svg"), "missing directory: %s", mn_last_error());
    tmp_remove(&td);
}

TEST(io_plot_csv) {
    TmpDir td;
    tmp_make(&td);
    enum { R = 7 };
    double step[R] = {0, 1, 2, 3, 4, 5, 1e6};
    double val[R] = {0.1, 1.0 / 3, 1e-300, -0.0, 123456789.123456789, 2.0 / 3 * 1e-5, 5e-324};
    double odd[R] = {NAN, INFINITY, -INFINITY, 1, 2, 3, 4};
    const char *cols[3] = {"step", "loss, \"val\"", "odd"};
    const double *data[3] = {step, val, odd};
    const char *path = tmp_path(&td, "t.csv");
    CHECK(!csv_write(path, cols, 3, data, R), "csv_write: %s", mn_last_error());
    size_t n;
    char *text = (char *)read_bytes(path, &n);
    if (!text) {
        CHECK(0, "cannot read %s", path);
        tmp_remove(&td);
        return;
    }
    text[n] = 0;
    const char *header = "step,\"loss, \"\"val\"\"\",odd\n";
    CHECK(!strncmp(text, header, strlen(header)), "header: %.40s", text);
    CHECK(strstr(text, "\n0,0.1,nan\n") && strstr(text, "\n1,0.3333333333333333,inf\n") && strstr(text, ",-inf\n"),
          "number format:\n%s", text);
    char *line = strchr(text, '\n');
    int rows = 0;
    for (char *p = line ? line + 1 : NULL; p && *p; rows++) {
        char *end;
        for (int c = 0; c < 3; c++) {
            double v = strtod(p, &end), want = data[c][rows < R ? rows : 0];
            int same = isnan(want) ? isnan(v) : v == want && signbit(v) == signbit(want);
            CHECK(same && end > p, "row %d col %d: read %.17g, wrote %.17g", rows, c, v, want);
            p = end + (*end == ',' || *end == '\n');
        }
    }
    CHECK(rows == R, "%d rows", rows);
    free(text);
    CHECK(csv_write(path, cols, 0, data, R) == MN_ERR_ARG, "no columns accepted");
    CHECK(csv_write(tmp_path(&td, "nodir/t.csv"), cols, 3, data, R) == MN_ERR_IO, "missing directory accepted");
    tmp_remove(&td);
}

// Random data of every magnitude, with NaNs, negatives and log axes: always a
// well-formed SVG with every tick label inside the canvas, or a clean error.
TEST(io_plot_random) {
    TmpDir td;
    tmp_make(&td);
    MnRng r;
    mn_rng_seed(&r, 3);
    enum { N = 40 };
    double x[N], y[N], y2[N];
    int made = 0;
    for (int it = 0; it < 150; it++) {
        double sx = pow(10, (int)(mn_rng_uniform(&r) * 40) - 20), sy = pow(10, (int)(mn_rng_uniform(&r) * 40) - 20);
        double oy = mn_rng_uniform(&r) < 0.3 ? sy * 100 : 0;  // sometimes a narrow range far from 0
        int n = 1 + (int)(mn_rng_uniform(&r) * N);
        for (int i = 0; i < n; i++) {
            x[i] = sx * (i + mn_rng_uniform(&r));
            y[i] = oy + sy * mn_rng_normal(&r);
            y2[i] = mn_rng_uniform(&r) < 0.1 ? NAN : oy + sy * mn_rng_normal(&r);
        }
        PlotSeries s[2] = {{"a", x, y, n}, {"b", x, y2, n}};
        PlotOpts o = {"random", "x", "y", mn_rng_uniform(&r) < 0.3, mn_rng_uniform(&r) < 0.3,
                      mn_rng_uniform(&r) < 0.5 ? 0 : 200 + 600 * mn_rng_uniform(&r), 0};
        if (o.width) o.height = 150 + 400 * mn_rng_uniform(&r);
        const char *path = tmp_path(&td, "r.svg");
        if (plot_svg(path, &o, s, 2)) {
            CHECK(o.log_x || o.log_y, "iteration %d: %s", it, mn_last_error());
            continue;
        }
        made++;
        size_t len;
        char *svg = (char *)read_bytes(path, &len);
        if (!svg) continue;
        svg[len] = 0;
        const char *bad = xml_wellformed(svg);
        CHECK(!bad, "iteration %d: %s", it, bad);
        double w = o.width ? o.width : 720;
        for (const char *p = svg; (p = strstr(p, "class=\"xtick\" x=\"")); p++) {
            double at = strtod(p + 17, NULL);
            CHECK(at > 0 && at < w, "iteration %d: x tick label at %g outside the canvas", it, at);
        }
        CHECK(count(svg, "class=\"xtick\"") >= 2 && count(svg, "class=\"ytick\"") >= 2, "iteration %d: too few ticks", it);
        free(svg);
    }
    CHECK(made > 100, "only %d of 150 random plots were made", made);
    tmp_remove(&td);
}

// Series styles: a colour shared by a pair (a noisy curve, faint, and its smooth mean), markers
// on every point of a series that asks for them.
TEST(io_plot_series_styles) {
    TmpDir td;
    tmp_make(&td);
    double x[4] = {1, 2, 3, 4}, a[4] = {1, 3, 2, 4}, b[4] = {1, 2, 2, 2.5};
    PlotSeries s[3] = {{"noisy", x, a, 4, 1, 1, 0}, {"mean", x, b, 4, 1, 0, 0}, {"dots", x, a, 4, 0, 0, 1}};
    char *svg = plot_and_read(&td, NULL, s, 3);
    if (svg) {
        CHECK(count(svg, "stroke=\"#1f77b4\"") == 4, "the pair does not share the first colour (%d strokes)",
              count(svg, "stroke=\"#1f77b4\""));
        CHECK(count(svg, "stroke-opacity=\"0.4\"") == 2, "faint series: line and legend entry translucent");
        CHECK(count(svg, "class=\"marker\"") == 4 && strstr(svg, "stroke=\"#2ca02c\""),
              "markers: %d, expected one per point of the third series", count(svg, "class=\"marker\""));
        free(svg);
    }
    tmp_remove(&td);
}

// A figure of panels side by side, with a categorical x axis: every category labelled in order.
TEST(io_plot_panels_and_categories) {
    TmpDir td;
    tmp_make(&td);
    const char *cats[9] = {"1", "2", "5", "10", "30", "1e-2", "1e-3", "1e-4", "1e-5"};
    double idx[9] = {0, 1, 2, 3, 4, 5, 6, 7, 8}, nll[9] = {3.2, 3.1, 3.05, 3.04, 3.04, 3.06, 3.045, 3.04, 3.04};
    double steps[9] = {1, 2, 5, 10, 30, 3, 6, 9, 14};
    PlotSeries left[2] = {{"fixed", idx, nll, 5, 1, 0, 1}, {"tolerance", idx + 5, nll + 5, 4, 2, 0, 1}};
    PlotSeries right[2] = {{"fixed", idx, steps, 5, 1, 0, 1}, {"tolerance", idx + 5, steps + 5, 4, 2, 0, 1}};
    PlotPanel p[2] = {{{"NLL", "setting", "nats", 0, 0, 0, 0, cats, 9}, left, 2},
                      {{"steps", "setting", "CG steps", 0, 1, 500, 0, cats, 9}, right, 2}};
    const char *path = tmp_path(&td, "panels.svg");
    CHECK(!plot_svg_panels(path, "Figure <&>", p, 2), "plot_svg_panels: %s", mn_last_error());
    size_t n;
    char *svg = (char *)read_bytes(path, &n);
    if (svg) {
        svg[n] = 0;
        const char *bad = xml_wellformed(svg);
        CHECK(!bad, "SVG not well-formed: %s", bad);
        CHECK(strstr(svg, "width=\"980\" height=\"440\""), "size: two panels 480 + 500 wide, 400 high under a title");
        CHECK(count(svg, "class=\"panel\"") == 2 && strstr(svg, ">Figure &lt;&amp;&gt;</text>"), "panels and title");
        char ticks[512];
        tick_texts(svg, "xtick", ticks, sizeof ticks);
        CHECK(!strcmp(ticks, "1|2|5|10|30|1e" MINUS "2|1e" MINUS "3|1e" MINUS "4|1e" MINUS "5|1|2|5|10|30|1e" MINUS
                             "2|1e" MINUS "3|1e" MINUS "4|1e" MINUS "5"),
              "category labels %s", ticks);
        CHECK(count(svg, "class=\"marker\"") == 18 && count(svg, "class=\"series\"") == 4, "%d markers, %d lines",
              count(svg, "class=\"marker\""), count(svg, "class=\"series\""));
        free(svg);
    }
    // Errors name the panel; a refused figure leaves no file.
    double none[2] = {NAN, NAN};
    PlotSeries empty = {"none", idx, none, 2};
    PlotPanel q[2] = {p[0], {{NULL, NULL, NULL, 0, 0, 0, 0, NULL, 0}, &empty, 1}};
    const char *path2 = tmp_path(&td, "refused.svg");
    int s = plot_svg_panels(path2, NULL, q, 2);
    CHECK(s == MN_ERR_NUMERIC && strstr(mn_last_error(), "panel 2"), "a panel of NaN: %d %s", s, mn_last_error());
    CHECK(access(path2, F_OK) != 0, "a refused figure left a file");
    CHECK(plot_svg_panels(path2, NULL, p, 0) == MN_ERR_ARG, "no panels accepted");
    PlotOpts too_many = {NULL, NULL, NULL, 0, 0, 0, 0, cats, 100};
    CHECK(plot_svg(path2, &too_many, left, 1) == MN_ERR_ARG, "100 categories accepted");
    tmp_remove(&td);
}

// The numbers of attribute `attr` of the elements of class `cls`, in order; returns how many.
static int attr_values(const char *svg, const char *cls, const char *attr, double *v, int max) {
    char key[64], a[64];
    snprintf(key, sizeof key, "class=\"%s\"", cls);
    snprintf(a, sizeof a, " %s=\"", attr);
    int n = 0;
    for (const char *p = svg; (p = strstr(p, key)) && n < max; p += strlen(key)) {
        const char *end = strchr(p, '>'), *q = strstr(p, a);
        if (q && end && q < end) v[n++] = atof(q + strlen(a));
    }
    return n;
}

// Series that tie (four mixers all at 0 at one setting) are drawn side by side with dodge, one
// marker each in series order, so that none hides another; without dodge they share one spot.
TEST(io_plot_dodge_shows_tied_series) {
    TmpDir td;
    tmp_make(&td);
    const char *cats[2] = {"baseline", "vocab=64"};
    double x[2] = {0, 1}, zero[2] = {0, 0}, other[2] = {0, 0.5};
    PlotSeries s[5] = {{"mesa", x, zero, 1, 0, 0, 1}, {"gdn", x, zero, 1, 0, 0, 1}, {"mha", x, zero, 1, 0, 0, 1},
                       {"gdn,swa", x, zero, 1, 0, 0, 1}, {"two", x, other, 2, 0, 0, 1}};
    PlotOpts o = {"tied", "setting", "accuracy", 0, 0, 0, 0, cats, 2};
    o.dodge = 1;
    char *svg = plot_and_read(&td, &o, s, 4);
    if (svg) {
        double cx[8];
        int n = attr_values(svg, "marker", "cx", cx, 8);
        CHECK(n == 4, "%d markers, expected one per series", n);
        for (int i = 1; i < n; i++)
            CHECK(cx[i] - cx[i - 1] >= 7.6, "markers %d and %d overlap: cx %g and %g", i - 1, i, cx[i - 1], cx[i]);
        CHECK(count(svg, "class=\"legend-name\"") == 4, "legend: %d names", count(svg, "class=\"legend-name\""));
        free(svg);
    }
    o.dodge = 0;
    svg = plot_and_read(&td, &o, s, 4);
    if (svg) {
        double cx[8];
        int n = attr_values(svg, "marker", "cx", cx, 8);
        CHECK(n == 4 && cx[0] == cx[3], "without dodge: %d markers, cx %g .. %g", n, cx[0], n ? cx[n - 1] : 0.0);
        free(svg);
    }
    // A series that ties at one setting and not at the next: its line goes through its own marker.
    o.dodge = 1;
    PlotSeries pair[2] = {{"a", x, zero, 2, 0, 0, 1}, {"b", x, other, 2, 0, 0, 1}};
    svg = plot_and_read(&td, &o, pair, 2);
    if (svg) {
        double cx[4];
        int n = attr_values(svg, "marker", "cx", cx, 4);
        CHECK(n == 4 && cx[0] != cx[2] && cx[1] == cx[3] && cx[1] != cx[0], "markers: %d", n);
        // b's line starts at its dodged marker
        const char *b_path = strstr(svg, "class=\"series\"");
        if (b_path) b_path = strstr(b_path + 1, "class=\"series\"");
        char want[64];
        snprintf(want, sizeof want, "M%.2f ", cx[2]);
        CHECK(b_path && strstr(b_path, want), "b's line does not start at its marker %s", want);
        free(svg);
    }
    tmp_remove(&td);
}

// y_lo, y_hi: the axis spans a metric's whole range; values all 0 get 0..1, not -1..1.
TEST(io_plot_y_span) {
    TmpDir td;
    tmp_make(&td);
    double x[3] = {0, 1, 2}, zero[3] = {0, 0, 0};
    PlotSeries s = {"acc", x, zero, 3, 0, 0, 1};
    PlotOpts o = {"span", "x", "accuracy", 0, 0, 0, 0, NULL, 0};
    char ticks[512];
    char *svg = plot_and_read(&td, &o, &s, 1);
    if (svg) {
        tick_texts(svg, "ytick", ticks, sizeof ticks);
        CHECK(strstr(ticks, MINUS "1"), "without a span, all-zero data: %s (the check cannot fail?)", ticks);
        free(svg);
    }
    o.y_lo = 0, o.y_hi = 1;
    svg = plot_and_read(&td, &o, &s, 1);
    if (svg) {
        tick_texts(svg, "ytick", ticks, sizeof ticks);
        CHECK(!strcmp(ticks, "0|0.2|0.4|0.6|0.8|1") || !strcmp(ticks, "0|0.5|1") || !strcmp(ticks, "0|0.1|0.2|0.3|0.4|0.5|0.6|0.7|0.8|0.9|1"),
              "y ticks with the span 0..1: %s", ticks);
        CHECK(!strstr(svg, "class=\"zero\""), "a zero line at the axis' edge");
        free(svg);
    }
    double high[3] = {0.5, 1.5, 0.2};  // data beyond the span widen it
    s.y = high;
    svg = plot_and_read(&td, &o, &s, 1);
    if (svg) {
        tick_texts(svg, "ytick", ticks, sizeof ticks);
        const char *last = strrchr(ticks, '|');
        CHECK(!strncmp(ticks, "0|", 2) && last && atof(last + 1) >= 1.5, "y ticks with data to 1.5: %s", ticks);
        free(svg);
    }
    o.y_lo = 1, o.y_hi = 0;
    CHECK(plot_svg(tmp_path(&td, "bad.svg"), &o, &s, 1) == MN_ERR_ARG && strstr(mn_last_error(), "y range"),
          "a reversed span accepted: %s", mn_last_error());
    o.y_lo = 0, o.y_hi = NAN;
    CHECK(plot_svg(tmp_path(&td, "bad.svg"), &o, &s, 1) == MN_ERR_ARG, "a NaN span accepted");
    o.y_lo = 0, o.y_hi = 1, o.log_y = 1;
    CHECK(plot_svg(tmp_path(&td, "bad.svg"), &o, &s, 1) == MN_ERR_ARG, "a span from 0 on a log axis accepted");
    tmp_remove(&td);
}

// The estimated width of the title lines (bold: 0.66 em a character), each within the canvas.
static void check_titles_fit(const char *svg, const char *cls, double W, int want_lines, const char *what) {
    double size[4], x[4];
    int n = attr_values(svg, cls, "font-size", size, 4);
    attr_values(svg, cls, "x", x, 4);
    char texts[4096];
    tick_texts(svg, cls, texts, sizeof texts);
    CHECK(n == want_lines, "%s: %d title lines, expected %d: %s", what, n, want_lines, texts);
    const char *p = texts;
    for (int i = 0; i < n; i++) {
        size_t len = strcspn(p, "|");
        int chars = 0;
        for (size_t k = 0; k < len; k++) chars += ((unsigned char)p[k] & 0xC0) != 0x80;
        for (const char *e = p; (e = strstr(e, "&")) && e < p + len; e++) chars -= (int)(strchr(e, ';') - e);
        double w = chars * size[i] * 0.66;
        CHECK(x[i] - w / 2 >= 0 && x[i] + w / 2 <= W, "%s: line %d (%d characters at %g px) spans %.0f..%.0f of %g",
              what, i + 1, chars, size[i], x[i] - w / 2, x[i] + w / 2, W);
        p += len + (p[len] == '|');
    }
}

// Titles fit the canvas: a long one (Delta NLL of two long run paths) is set smaller, a longer one
// on two lines, a huge one cut in the middle with an ellipsis; a short one keeps 16 px.
TEST(io_plot_titles_fit) {
    TmpDir td;
    tmp_make(&td);
    double x[2] = {1, 2}, y[2] = {0.1, -0.2};
    PlotSeries s = {"d", x, y, 2, 0, 0, 0};
    PlotOpts o = {"short", "t", "nats", 1, 0, 0, 0};
    char *svg = plot_and_read(&td, &o, &s, 1);
    if (svg) {
        double size[2];
        CHECK(attr_values(svg, "title", "font-size", size, 2) == 1 && size[0] == 16, "a short title's size");
        free(svg);
    }
    const char *delta = "Delta NLL by position: runs/gdn-long-run minus runs/demo-baseline (negative: first is better)";
    o.title = delta;
    svg = plot_and_read(&td, &o, &s, 1);
    if (svg) {
        check_titles_fit(svg, "title", 720, 1, "the Delta NLL title");
        CHECK(strstr(svg, "demo-baseline (negative: first is better)</text>"), "the title lost its end");
        free(svg);
    }
    char longer[400];
    snprintf(longer, sizeof longer, "Delta NLL by position: runs/experiments/gdn-long-run-%s minus %s", "a-b-c-d-e-f",
             "runs/experiments/demo-baseline-with-a-longer-name (negative: first is better)");
    o.title = longer;
    svg = plot_and_read(&td, &o, &s, 1);
    if (svg) {
        check_titles_fit(svg, "title", 720, 2, "a two-line title");
        CHECK(!strstr(svg, "\xe2\x80\xa6") && strstr(svg, "first is better)</text>"), "a title of two lines was cut");
        free(svg);
    }
    static char huge[3000];
    for (int i = 0; i < 2990; i++) huge[i] = i % 11 == 10 ? ' ' : 'a' + i % 26;
    huge[2990] = 0;
    o.title = huge;
    svg = plot_and_read(&td, &o, &s, 1);
    if (svg) {
        check_titles_fit(svg, "title", 720, 2, "a huge title");
        CHECK(count(svg, "\xe2\x80\xa6") == 2, "the huge title is not cut with an ellipsis");
        free(svg);
    }
    // The figure title of panels too.
    PlotPanel p[1] = {{{NULL, "t", "nats", 1, 0, 0, 0}, &s, 1}};
    const char *path = tmp_path(&td, "panels.svg");
    CHECK(!plot_svg_panels(path, delta, p, 1), "plot_svg_panels: %s", mn_last_error());
    size_t n;
    svg = (char *)read_bytes(path, &n);
    if (svg) {
        svg[n] = 0;
        check_titles_fit(svg, "figure-title", 480, 2, "a panel figure's title");
        free(svg);
    }
    tmp_remove(&td);
}

// Category labels too long to stand level side by side are slanted (they once ran into each
// other); short ones stay level.
TEST(io_plot_long_categories_slanted) {
    TmpDir td;
    tmp_make(&td);
    const char *longc[4] = {"baseline", "seq_len=128,num_pairs=8", "seq_len=256,num_pairs=16",
                            "seq_len=512,num_pairs=64"};
    const char *shortc[4] = {"a", "b", "c", "d"};
    double x[4] = {0, 1, 2, 3}, y[4] = {0.1, 0.5, 0.7, 0.9};
    PlotSeries s = {"m", x, y, 4, 0, 0, 1};
    PlotOpts o = {"cats", "setting", "accuracy", 0, 0, 0, 0, longc, 4};
    char *svg = plot_and_read(&td, &o, &s, 1);
    if (svg) {
        CHECK(count(svg, "class=\"xtick\"") == 4 && count(svg, "rotate(-35") == 4, "long labels not slanted");
        double tx[4];
        attr_values(svg, "xtick", "x", tx, 4);
        CHECK(tx[0] - strlen(longc[0]) * 12 * 0.6 * cos(35 * M_PI / 180) >= 0, "the first label leaves the canvas");
        free(svg);
    }
    o.xcats = shortc;
    svg = plot_and_read(&td, &o, &s, 1);
    if (svg) {
        CHECK(count(svg, "class=\"xtick\"") == 4 && !strstr(svg, "rotate(-35"), "short labels slanted");
        free(svg);
    }
    tmp_remove(&td);
}
