/*
 * SVG line plots (see plot.h).
 *
 * A plot is built in three steps:
 *   1. the data range over the drawable points (finite, and > 0 on log axes);
 *   2. the axes: limits and tick values, "nice" numbers on linear axes and
 *      powers of ten on log axes, thinned until the labels do not collide;
 *   3. the layout (margins sized to the tick labels, so nothing is clipped)
 *      and the SVG itself, written with fprintf into an atomic file.
 * Text widths are estimated (0.6 em per character), which is close enough
 * for sans-serif digits to keep labels apart and inside the canvas.
 */
#include "plot.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/atomic_file.h"
#include "core/common.h"

#define MAX_TICKS 48
#define MAX_MINOR 512
#define FONT "DejaVu Sans, Helvetica, Arial, sans-serif"
#define TICK_FONT 12.0
#define LABEL_FONT 13.0
#define TITLE_FONT 16.0
#define LEGEND_ROW 18.0
#define CHAR_EM 0.6  // estimated width of a character, in font sizes
#define TITLE_EM 0.66  // the same for bold titles (DejaVu Sans Bold is about a tenth wider)
#define TITLE_MIN 11.0  // a title shrinks to fit down to this size on one line,
#define TITLE_MIN2 8.0  // then to this size on two
#define TITLE_PAD 8.0   // room kept between a title and the canvas' edges
#define SLANT_DEG 35.0  // the slant of category labels too long to stand level side by side

// Tableau 10 (matplotlib's default cycle): distinct, and readable on white.
static const char *const palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                      "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
#define NPALETTE ((int)(sizeof palette / sizeof palette[0]))

typedef struct {
    double v;       // position in data units
    char text[40];  // label
    char sup[12];   // superscript after the label ("10" then "-5"), or ""
} Tick;

typedef struct {
    int log;                   // log10 scale
    double lo, hi;             // limits in data units
    Tick major[MAX_TICKS];     // labelled ticks, with gridlines
    int nmajor;
    double minor[MAX_MINOR];   // unlabelled gridlines (log axes)
    int nminor;
    int slant;                 // category labels drawn slanted (SLANT_DEG), as level ones would collide
} Axis;

typedef struct {
    double W, H;    // canvas
    double x0, x1;  // plot area, left to right
    double y0, y1;  // plot area, top to bottom
} Frame;

// ---------------------------------------------------------------------------
// Text

// Code points, not bytes, so that UTF-8 labels are measured fairly.
static double text_width(const char *s, double size) {
    int n = 0;
    for (; s && *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n * size * CHAR_EM;
}

static double tick_width(const Tick *t) { return text_width(t->text, TICK_FONT) + 0.75 * text_width(t->sup, TICK_FONT); }

// Character data with & < > " ' escaped; control characters, which XML 1.0
// forbids, are dropped.
static void xml_put(FILE *f, const char *s) {
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        switch (c) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&apos;", f); break;
        default:
            if (c >= 0x20 || c == '\t') fputc(c, f);
        }
    }
}

// Every "-" -> U+2212, the typographic minus of plot labels, in place.
static void use_minus_sign(char *s, size_t cap) {
    char *m;
    while ((m = strchr(s, '-')) && strlen(s) + 3 <= cap) {
        memmove(m + 3, m + 1, strlen(m + 1) + 1);
        memcpy(m, "\xe2\x88\x92", 3);
    }
}

// ---------------------------------------------------------------------------
// Axes

static void add_major(Axis *a, double v, const char *text, const char *sup) {
    if (a->nmajor == MAX_TICKS) return;
    Tick *t = &a->major[a->nmajor++];
    t->v = v;
    snprintf(t->text, sizeof t->text, "%s", text);
    snprintf(t->sup, sizeof t->sup, "%s", sup);
    use_minus_sign(t->text, sizeof t->text);
    use_minus_sign(t->sup, sizeof t->sup);
}

// "1.5e-05" -> "1.5e-5", "1e+06" -> "1e6".
static void tidy_exponent(char *s) {
    char *e = strchr(s, 'e');
    if (e) sprintf(e + 1, "%d", atoi(e + 1));
}

// A linear tick label with as many decimals as the step needs; exponent
// notation for very large or very small magnitudes.
static void format_linear(char *buf, size_t cap, double v, double step, double maxabs) {
    if (v == 0) {
        snprintf(buf, cap, "0");
    } else if (maxabs >= 1e6 || maxabs < 1e-3) {
        // The fewest digits that pin the value down to a tiny part of a step: "5e6", "1.5e-5".
        for (int p = 0; p < 17; p++) {
            snprintf(buf, cap, "%.*e", p, v);
            if (fabs(strtod(buf, NULL) - v) <= step * 1e-6) break;
        }
        tidy_exponent(buf);
    } else {
        // Decimals as the step needs, then no trailing zeros: 0, 0.5, 1, 1.5.
        snprintf(buf, cap, "%.*f", mn_max(0, (int)-floor(log10(step) + 1e-9)), v);
        if (strchr(buf, '.')) {
            char *end = buf + strlen(buf) - 1;
            while (*end == '0') *end-- = 0;
            if (*end == '.') *end = 0;
        }
    }
}

// Limits on multiples of a 1, 2 or 5 x 10^k step giving about `target` intervals.
static void axis_linear(Axis *a, double min, double max, int target) {
    memset(a, 0, sizeof *a);
    if (!((max - min) / target >= DBL_MIN)) {  // one value, or a span too small to divide: centre it
        double d = fmax(fabs(min), fabs(max)) * 0.1;
        if (!(d / target >= DBL_MIN)) d = 1;  // 0, or so near it that a tenth of it is no step
        min -= d;
        max += d;
    }
    double raw = (max - min) / target, mag = pow(10, floor(log10(raw))), f = raw / mag;
    double step = (f <= 1 + 1e-9 ? 1 : f <= 2 + 1e-9 ? 2 : f <= 5 + 1e-9 ? 5 : 10) * mag;
    // The epsilons keep 0.6 / 0.2 = 2.9999999999999996 from adding a step.
    a->lo = floor(min / step + 1e-9) * step;
    a->hi = ceil(max / step - 1e-9) * step;
    int n = (int)llround((a->hi - a->lo) / step);
    double maxabs = fmax(fabs(a->lo), fabs(a->hi));
    for (int i = 0; i <= n; i++) {
        double v = a->lo + i * step;
        if (fabs(v) < step * 1e-9) v = 0;  // no "-0" or "5.55e-17"
        char text[40];
        format_linear(text, sizeof text, v, step, maxabs);
        add_major(a, v, text, "");
    }
}

// m x 10^k with m in 1..10, at or below (dir -1) or above (dir +1) v.
static double log_lattice(double v, int dir) {
    double p = pow(10, floor(log10(v)));
    if (v < p) p /= 10;  // log10 rounded up across a power of ten
    double m = dir < 0 ? floor(v / p * (1 + 1e-12)) : ceil(v / p * (1 - 1e-12));
    return fmin(fmax(m, 1), 10) * p;
}

// Plain digits for 0.001 ... 90000; beyond, 10 or m x 10 (U+00D7) with the
// exponent as a superscript.
static void format_log(char *text, size_t cap, char *sup, size_t scap, int m, int k) {
    sup[0] = 0;
    if (k >= -3 && k <= 4) {
        snprintf(text, cap, "%g", m * pow(10, k));
        return;
    }
    if (m == 1) snprintf(text, cap, "10");
    else snprintf(text, cap, "%d\xc3\x97" "10", m);
    snprintf(sup, scap, "%d", k);
}

static int by_value(const void *a, const void *b) {
    double x = ((const Tick *)a)->v, y = ((const Tick *)b)->v;
    return x < y ? -1 : x > y;
}

// Label every stride-th decade, a 1, 2, 5 x 10^j stride leaving at most
// max_labels labels (doubles span about 630 decades).
static int decade_stride(double decades, int max_labels) {
    static const int strides[] = {1, 2, 5, 10, 20, 50, 100, 200, 500};
    for (int i = 0; i < (int)(sizeof strides / sizeof strides[0]); i++)
        if ((decades + 1) / strides[i] <= mn_max(max_labels, 2)) return strides[i];
    return 1000;
}

// Labels the limits (which lie on the lattice) when a short axis was left
// with fewer than two labels, so that the scale can still be read. With one
// label already, only the farther limit, to keep the labels apart.
static void label_limits(Axis *a) {
    double ends[2] = {a->lo, a->hi};
    if (a->nmajor == 1) {
        double v = a->major[0].v;
        ends[0] = log10(v / a->lo) > log10(a->hi / v) ? a->lo : a->hi;
    }
    int need = 2 - a->nmajor;
    for (int e = 0; e < need; e++) {
        int k = (int)floor(log10(ends[e]) + 1e-9), m = (int)lround(ends[e] / pow(10, k));
        char text[40], sup[12];
        format_log(text, sizeof text, sup, sizeof sup, m, k);
        add_major(a, ends[e], text, sup);
    }
    qsort(a->major, (size_t)a->nmajor, sizeof a->major[0], by_value);
}

// Limits on the m x 10^k lattice. Labels: every multiple for one decade,
// 1, 2, 5 within two, otherwise decades (every `stride`-th so that about
// max_labels remain); the other multiples become unlabelled gridlines.
static void log_lattice_ticks(Axis *a, double min, double max, int max_labels) {
    a->lo = log_lattice(min, -1);
    a->hi = log_lattice(max, +1);
    double decades = log10(a->hi) - log10(a->lo);  // not log10(hi / lo): that overflows for 1e-200..1e200
    int level = decades <= 1.001 && max_labels >= 9 ? 0 : decades <= 2.001 && max_labels >= 7 ? 1 : 2;
    // With wide strides the unlabelled decades get gridlines only every fifth of one.
    int stride = decade_stride(decades, max_labels), minor_stride = stride >= 5 ? stride / 5 : 1;
    int k0 = (int)floor(log10(a->lo)) - 1, k1 = (int)ceil(log10(a->hi)) + 1;
    for (int k = k0; k <= k1; k++) {
        for (int m = 1; m <= 9; m++) {
            double v = m * pow(10, k);
            if (v < a->lo * (1 - 1e-9) || v > a->hi * (1 + 1e-9)) continue;
            int labelled = m == 1 ? ((k % stride) + stride) % stride == 0 : level == 0 || (level == 1 && (m == 2 || m == 5));
            if (labelled) {
                char text[40], sup[12];
                format_log(text, sizeof text, sup, sizeof sup, m, k);
                add_major(a, v, text, sup);
            } else if ((decades <= 6 || (m == 1 && k % minor_stride == 0)) && a->nminor < MAX_MINOR) {
                a->minor[a->nminor++] = v;
            }
        }
    }
    if (a->nmajor < 2) label_limits(a);
}

// A log axis. Data within a factor of 10 gets linear nice ticks drawn on the
// log scale: the lattice is too coarse there (9.5..10.5 would get 9..20).
static void axis_log(Axis *a, double min, double max, int max_labels) {
    if (max == min) {
        min /= 2;
        max *= 2;
    }
    if (max / min < 10) {
        axis_linear(a, min, max, mn_max(max_labels / 2, 2));
        a->log = 1;
        if (a->lo > 0) return;  // else a nice limit fell on 0: use the lattice
    }
    memset(a, 0, sizeof *a);
    a->log = 1;
    log_lattice_ticks(a, min, max, max_labels);
}

static double axis_t(const Axis *a, double v) { return a->log ? log10(v) : v; }

// Pixel position of v on an axis drawn from p0 (at lo) to p1 (at hi).
static double axis_px(const Axis *a, double v, double p0, double p1) {
    double t0 = axis_t(a, a->lo), t1 = axis_t(a, a->hi);
    return p0 + (axis_t(a, v) - t0) / (t1 - t0) * (p1 - p0);
}

// A categorical axis: category i at i, labelled with its name, half a step of room at the ends.
static void axis_categories(Axis *a, const PlotOpts *o) {
    memset(a, 0, sizeof *a);
    a->lo = -0.5;
    a->hi = o->ncats - 0.5;
    for (int i = 0; i < o->ncats; i++) add_major(a, i, o->xcats[i] ? o->xcats[i] : "", "");
}

static void build_axis(Axis *a, int log, double min, double max, int target) {
    if (log) axis_log(a, min, max, 2 * target);  // denser to start with: labels_fit thins it
    else axis_linear(a, min, max, target);
}

// Whether neighbouring labels keep apart on an axis `len` pixels long.
static int labels_fit(const Axis *a, double len, int horizontal) {
    for (int i = 1; i < a->nmajor; i++) {
        double gap = fabs(axis_px(a, a->major[i].v, 0, len) - axis_px(a, a->major[i - 1].v, 0, len));
        double need = horizontal ? (tick_width(&a->major[i]) + tick_width(&a->major[i - 1])) / 2 + 12 : TICK_FONT * 1.6;
        if (gap < need) return 0;
    }
    return 1;
}

// The densest ticks (about one per `spacing` pixels at most) whose labels fit.
static void fit_axis(Axis *a, int log, double min, double max, double len, double spacing, int horizontal) {
    for (int target = mn_max(2, mn_min(10, (int)(len / spacing))); target >= 1; target--) {
        build_axis(a, log, min, max, target);
        if (labels_fit(a, len, horizontal)) return;
    }
}

// ---------------------------------------------------------------------------
// Data

typedef struct {
    double xmin, xmax, ymin, ymax;
    long n;       // drawable points
    long finite;  // points with finite x and y, drawable or not
} Range;

static int drawable(const PlotOpts *o, double x, double y) {
    return isfinite(x) && isfinite(y) && (!o->log_x || x > 0) && (!o->log_y || y > 0);
}

static int point_at(const PlotOpts *o, const PlotSeries *s, int i) { return i >= 0 && i < s->n && drawable(o, s->x[i], s->y[i]); }

static void data_range(const PlotOpts *o, const PlotSeries *series, int ns, Range *r) {
    *r = (Range){INFINITY, -INFINITY, INFINITY, -INFINITY, 0, 0};
    for (int s = 0; s < ns; s++)
        for (int i = 0; i < series[s].n; i++) {
            double x = series[s].x[i], y = series[s].y[i];
            r->finite += isfinite(x) && isfinite(y);
            if (!drawable(o, x, y)) continue;
            r->n++;
            r->xmin = fmin(r->xmin, x), r->xmax = fmax(r->xmax, x);
            r->ymin = fmin(r->ymin, y), r->ymax = fmax(r->ymax, y);
        }
}

static int check_args(const char *path, const PlotOpts *o, const PlotSeries *series, int ns) {
    if (!path) return mn_error(MN_ERR_ARG, "plot: path is NULL");
    if (!series || ns <= 0) return mn_error(MN_ERR_ARG, "plot %s: no series to draw", path);
    if (!(o->width >= 160 && o->width <= 20000 && o->height >= 120 && o->height <= 20000))
        return mn_error(MN_ERR_ARG, "plot %s: size %gx%g outside [160, 20000] x [120, 20000]", path, o->width, o->height);
    if ((o->y_lo != 0 || o->y_hi != 0) && !(isfinite(o->y_lo) && isfinite(o->y_hi) && o->y_hi > o->y_lo &&
                                             (!o->log_y || o->y_lo > 0)))
        return mn_error(MN_ERR_ARG, "plot %s: y range [%g, %g] is not finite with y_lo < y_hi%s", path, o->y_lo,
                        o->y_hi, o->log_y ? " and y_lo > 0 (log y)" : "");
    if (o->ncats < 0 || o->ncats > MAX_TICKS || (o->ncats > 0 && !o->xcats))
        return mn_error(MN_ERR_ARG, "plot %s: %d categories (at most %d, with their names)", path, o->ncats, MAX_TICKS);
    for (int s = 0; s < ns; s++) {
        if (series[s].n < 0) return mn_error(MN_ERR_ARG, "plot %s: series %d has n = %d", path, s, series[s].n);
        if (series[s].n > 0 && (!series[s].x || !series[s].y))
            return mn_error(MN_ERR_ARG, "plot %s: series %d ('%s') has NULL x or y", path, s,
                            series[s].name ? series[s].name : "");
    }
    return MN_OK;
}

// ---------------------------------------------------------------------------
// Layout

static double max_tick_width(const Axis *a) {
    double w = 0;
    for (int i = 0; i < a->nmajor; i++) w = fmax(w, tick_width(&a->major[i]));
    return w;
}

// Margins sized to the labels; the y axis is fitted first because the left
// margin depends on its labels and the x axis on the width left over.
static void layout(const PlotOpts *o, const Range *r, Axis *ax, Axis *ay, Frame *fr) {
    fr->W = o->width;
    fr->H = o->height;
    fr->y0 = o->title && o->title[0] ? 46 : 18;
    fr->y1 = fr->H - (8 + 4 + TICK_FONT + 12 + (o->xlabel && o->xlabel[0] ? LABEL_FONT + 10 : 0));
    fit_axis(ay, o->log_y, r->ymin, r->ymax, fr->y1 - fr->y0, 45, 0);
    fr->x0 = 12 + (o->ylabel && o->ylabel[0] ? LABEL_FONT + 12 : 0) + max_tick_width(ay) + 10;
    fr->x1 = fr->W - 24;
    if (o->ncats > 0) {
        axis_categories(ax, o);  // every category keeps its label: slanted where level ones collide
        if (!labels_fit(ax, fr->x1 - fr->x0, 1)) {
            double a = SLANT_DEG * M_PI / 180, w = max_tick_width(ax);
            ax->slant = 1;
            // The labels reach down by their slanted width: the plot gets shorter by that, and its
            // y axis is fitted again to the new height.
            fr->y1 = fmax(fr->y0 + 40, fr->y1 - (w * sin(a) + TICK_FONT * cos(a) - TICK_FONT));
            fit_axis(ay, o->log_y, r->ymin, r->ymax, fr->y1 - fr->y0, 45, 0);
            fr->x0 = 12 + (o->ylabel && o->ylabel[0] ? LABEL_FONT + 12 : 0) + max_tick_width(ay) + 10;
            // The first label reaches left of its category by its slanted width: keep it on the canvas.
            double first = tick_width(&ax->major[0]) * cos(a) + 6, step = (fr->x1 - fr->x0) / o->ncats;
            if (first - step / 2 > fr->x0) fr->x0 = fmin(first - step / 2, fr->x1 - 40);
            return;
        }
    } else
        fit_axis(ax, o->log_x, r->xmin, r->xmax, fr->x1 - fr->x0, 70, 1);
    // The last x label is centred on the right edge: keep it on the canvas.
    if (ax->nmajor) fr->x1 = fmin(fr->x1, fr->W - 6 - tick_width(&ax->major[ax->nmajor - 1]) / 2);
}

// ---------------------------------------------------------------------------
// Drawing

// slant: degrees the label turns (anticlockwise) about its anchor point; 0: level.
static void draw_tick_label(FILE *f, const char *cls, const Tick *t, double x, double y, const char *anchor,
                            double slant) {
    fprintf(f, "<text class=\"%s\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\"", cls, x, y, anchor);
    if (slant) fprintf(f, " transform=\"rotate(%.0f %.1f %.1f)\"", -slant, x, y);
    fputc('>', f);
    xml_put(f, t->text);
    if (t->sup[0]) {
        fprintf(f, "<tspan dy=\"-0.45em\" font-size=\"%.0f\">", TICK_FONT * 0.75);
        xml_put(f, t->sup);
        fputs("</tspan>", f);
    }
    fputs("</text>\n", f);
}

static void draw_grid(FILE *f, const Frame *fr, const Axis *ax, const Axis *ay) {
    fputs("<g stroke=\"#ececec\" stroke-width=\"1\" shape-rendering=\"crispEdges\">\n", f);
    for (int i = 0; i < ax->nminor; i++) {
        double x = axis_px(ax, ax->minor[i], fr->x0, fr->x1);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", x, fr->y0, x, fr->y1);
    }
    for (int i = 0; i < ay->nminor; i++) {
        double y = axis_px(ay, ay->minor[i], fr->y1, fr->y0);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", fr->x0, y, fr->x1, y);
    }
    fputs("</g>\n<g stroke=\"#d4d4d4\" stroke-width=\"1\" shape-rendering=\"crispEdges\">\n", f);
    for (int i = 0; i < ax->nmajor; i++) {
        double x = axis_px(ax, ax->major[i].v, fr->x0, fr->x1);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", x, fr->y0, x, fr->y1 + 4);
    }
    for (int i = 0; i < ay->nmajor; i++) {
        double y = axis_px(ay, ay->major[i].v, fr->y1, fr->y0);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", fr->x0 - 4, y, fr->x1, y);
    }
    fputs("</g>\n", f);
    // Delta-NLL plots: where zero lies matters more than any other value.
    if (!ay->log && ay->lo < 0 && ay->hi > 0) {
        double y = axis_px(ay, 0, fr->y1, fr->y0);
        fprintf(f, "<line class=\"zero\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#555\" "
                   "stroke-width=\"1\" shape-rendering=\"crispEdges\"/>\n", fr->x0, y, fr->x1, y);
    }
}

static void draw_axes(FILE *f, const Frame *fr, const Axis *ax, const Axis *ay) {
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#444\" "
               "stroke-width=\"1\" shape-rendering=\"crispEdges\"/>\n", fr->x0, fr->y0, fr->x1 - fr->x0, fr->y1 - fr->y0);
    fprintf(f, "<g font-size=\"%.0f\" fill=\"#333\">\n", TICK_FONT);
    for (int i = 0; i < ax->nmajor; i++) {
        double x = axis_px(ax, ax->major[i].v, fr->x0, fr->x1);
        if (ax->slant) draw_tick_label(f, "xtick", &ax->major[i], x + TICK_FONT * 0.3, fr->y1 + 12, "end", SLANT_DEG);
        else draw_tick_label(f, "xtick", &ax->major[i], x, fr->y1 + 8 + TICK_FONT, "middle", 0);
    }
    for (int i = 0; i < ay->nmajor; i++)
        draw_tick_label(f, "ytick", &ay->major[i], fr->x0 - 8, axis_px(ay, ay->major[i].v, fr->y1, fr->y0) + TICK_FONT * 0.35,
                        "end", 0);
    fputs("</g>\n", f);
}

// Series past the palette are told apart by dashes; a series given its colour keeps a solid line.
static const char *dash_of(const PlotSeries *s, int si) {
    return s->color > 0 || si < NPALETTE ? "" : si < 2 * NPALETTE ? "7 4" : "2 3";
}

static const char *color_of(const PlotSeries *s, int si) { return palette[(s->color > 0 ? s->color - 1 : si) % NPALETTE]; }

// The stroke attributes of a series' line: width, opacity and dashes.
static void stroke_style(FILE *f, const PlotSeries *s, int si, double width) {
    fprintf(f, " stroke=\"%s\" stroke-width=\"%.1f\"", color_of(s, si), s->faint ? width * 0.6 : width);
    if (s->faint) fputs(" stroke-opacity=\"0.4\"", f);
    if (*dash_of(s, si)) fprintf(f, " stroke-dasharray=\"%s\"", dash_of(s, si));
}

#define MARKER_R 3.8  // the radius of the dots of a series with markers

// The sideways shift in pixels of point i of series si (opts.dodge): the points of every series at
// the same x within a marker's width in y share the room, one marker apart, in series order, at
// most 60% of the room between neighbouring x positions so that settings stay apart.
static double dodge_px(const Frame *fr, const Axis *ay, const PlotOpts *o, const PlotSeries *all, int ns, int si,
                       int i) {
    if (!o->dodge) return 0;
    double x = all[si].x[i], py = axis_px(ay, all[si].y[i], fr->y1, fr->y0);
    int m = 0, rank = 0, most = 1;
    for (int j = 0; j < ns; j++) {
        most = mn_max(most, all[j].n);
        for (int k = 0; k < all[j].n; k++)
            if (point_at(o, &all[j], k) && all[j].x[k] == x &&
                fabs(axis_px(ay, all[j].y[k], fr->y1, fr->y0) - py) < 2 * MARKER_R) {
                m++;
                rank += j < si;
                break;  // a series counts once at an x
            }
    }
    if (m < 2) return 0;
    double room = o->ncats > 0 ? (fr->x1 - fr->x0) / o->ncats : (fr->x1 - fr->x0) / most;
    double step = fmin(2 * MARKER_R + 1, 0.6 * room / m);
    return (rank - (m - 1) / 2.0) * step;
}

// One <path> per series (lines broken at skipped points) and a <circle> for
// each isolated point.
static void draw_series(FILE *f, const Frame *fr, const Axis *ax, const Axis *ay, const PlotOpts *o,
                        const PlotSeries *all, int ns, int si) {
    const PlotSeries *s = &all[si];
    const char *color = color_of(s, si);
    int open = 0;
    for (int i = 0; i < s->n; i++) {
        if (!point_at(o, s, i)) continue;
        int prev = point_at(o, s, i - 1), next = point_at(o, s, i + 1);
        if (!prev && !next) continue;  // drawn as a marker below
        if (!open) {
            fputs("<path class=\"series\" fill=\"none\"", f);
            stroke_style(f, s, si, 1.8);
            fputs(" stroke-linejoin=\"round\" stroke-linecap=\"round\" d=\"", f);
            open = 1;
        }
        fprintf(f, "%c%.2f %.2f ", prev ? 'L' : 'M',
                axis_px(ax, s->x[i], fr->x0, fr->x1) + dodge_px(fr, ay, o, all, ns, si, i),
                axis_px(ay, s->y[i], fr->y1, fr->y0));
    }
    if (open) fputs("\"/>\n", f);
    for (int i = 0; i < s->n; i++)
        if (point_at(o, s, i) && (s->markers || (!point_at(o, s, i - 1) && !point_at(o, s, i + 1))))
            fprintf(f, "<circle class=\"marker\" cx=\"%.2f\" cy=\"%.2f\" r=\"%.1f\" fill=\"%s\"/>\n",
                    axis_px(ax, s->x[i], fr->x0, fr->x1) + dodge_px(fr, ay, o, all, ns, si, i),
                    axis_px(ay, s->y[i], fr->y1, fr->y0), s->markers ? MARKER_R : 3.2, color);
}

static int has_name(const PlotSeries *s) { return s->name && s->name[0]; }

// Whether any two neighbouring points are drawable, i.e. the series has a line.
static int has_line(const PlotOpts *o, const PlotSeries *s) {
    for (int i = 0; i + 1 < s->n; i++)
        if (point_at(o, s, i) && point_at(o, s, i + 1)) return 1;
    return 0;
}

// Whether the segment (x0,y0)-(x1,y1) meets the box (Liang-Barsky clipping);
// a point is a segment of length zero.
static int segment_hits_box(double x0, double y0, double x1, double y1, double bx, double by, double bw, double bh) {
    double t0 = 0, t1 = 1, p[4] = {x0 - x1, x1 - x0, y0 - y1, y1 - y0}, q[4] = {x0 - bx, bx + bw - x0, y0 - by, by + bh - y0};
    for (int i = 0; i < 4; i++) {
        if (p[i] == 0) {
            if (q[i] < 0) return 0;  // parallel to this edge and outside it
            continue;
        }
        double r = q[i] / p[i];
        if (p[i] < 0) t0 = fmax(t0, r);
        else t1 = fmin(t1, r);
        if (t0 > t1) return 0;
    }
    return 1;
}

// Line pieces and markers that a box would cover: the legend goes where this
// is smallest.
static long pieces_inside(const Frame *fr, const Axis *ax, const Axis *ay, const PlotOpts *o, const PlotSeries *series,
                          int ns, double bx, double by, double bw, double bh) {
    long n = 0;
    for (int s = 0; s < ns; s++) {
        const PlotSeries *ps = &series[s];
        for (int i = 0; i < ps->n; i++) {
            if (!point_at(o, ps, i)) continue;
            int j = point_at(o, ps, i + 1) ? i + 1 : i;  // the segment to the next point, or the point itself
            if (j == i && point_at(o, ps, i - 1)) continue;  // the end of a line: counted with its segment
            n += segment_hits_box(axis_px(ax, ps->x[i], fr->x0, fr->x1), axis_px(ay, ps->y[i], fr->y1, fr->y0),
                                  axis_px(ax, ps->x[j], fr->x0, fr->x1), axis_px(ay, ps->y[j], fr->y1, fr->y0), bx, by, bw,
                                  bh);
        }
    }
    return n;
}

static void draw_legend(FILE *f, const Frame *fr, const Axis *ax, const Axis *ay, const PlotOpts *o,
                        const PlotSeries *series, int ns) {
    int rows = 0;
    double tw = 0;
    for (int s = 0; s < ns; s++)
        if (has_name(&series[s])) rows++, tw = fmax(tw, text_width(series[s].name, TICK_FONT));
    if (!rows) return;
    double bw = 10 + 24 + 8 + tw + 10, bh = 6 + rows * LEGEND_ROW + 4, inset = 10;
    // Corners in order of preference: top right, top left, bottom right, bottom left.
    double cx[4] = {fr->x1 - inset - bw, fr->x0 + inset, fr->x1 - inset - bw, fr->x0 + inset};
    double cy[4] = {fr->y0 + inset, fr->y0 + inset, fr->y1 - inset - bh, fr->y1 - inset - bh};
    int best = 0;
    long best_n = -1;
    for (int c = 0; c < 4; c++) {
        // A margin around the box: lines passing just outside it count too.
        long n = pieces_inside(fr, ax, ay, o, series, ns, cx[c] - 8, cy[c] - 8, bw + 16, bh + 16);
        if (best_n < 0 || n < best_n) best = c, best_n = n;
    }
    double bx = cx[best], by = cy[best];
    fprintf(f, "<g class=\"legend\" font-size=\"%.0f\">\n", TICK_FONT);
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" rx=\"3\" fill=\"white\" fill-opacity=\"0.9\" "
               "stroke=\"#bbb\" stroke-width=\"1\"/>\n", bx, by, bw, bh);
    int row = 0;
    for (int s = 0; s < ns; s++) {
        if (!has_name(&series[s])) continue;
        double y = by + 6 + (row++ + 0.5) * LEGEND_ROW;
        const char *color = color_of(&series[s], s);
        if (has_line(o, &series[s])) {
            fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"", bx + 10, y, bx + 34, y);
            stroke_style(f, &series[s], s, 2.2);
            fputs("/>\n", f);
        }
        if (!has_line(o, &series[s]) || series[s].markers)  // dots, or only isolated points: shown by the marker
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.2\" fill=\"%s\"/>\n", bx + 22, y, color);
        fprintf(f, "<text class=\"legend-name\" x=\"%.1f\" y=\"%.1f\" fill=\"#222\">", bx + 42, y + TICK_FONT * 0.35);
        xml_put(f, series[s].name);
        fputs("</text>\n", f);
    }
    fputs("</g>\n", f);
}

// The code points of s[0 .. n), and the byte length of its first k code points.
static int code_points(const char *s, size_t n) {
    int c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}
static size_t bytes_of(const char *s, int k) {
    size_t i = 0;
    for (int c = 0; s[i]; i++) {
        if (((unsigned char)s[i] & 0xC0) != 0x80 && c++ == k) break;
    }
    return i;
}

// One line of a title centred on cx, moved inwards where it would cross the canvas' edges.
static void title_line(FILE *f, const char *cls, const char *s, size_t n, double cx, double W, double y, double size) {
    double w = code_points(s, n) * size * TITLE_EM;
    cx = fmin(fmax(cx, TITLE_PAD + w / 2), W - TITLE_PAD - w / 2);
    fprintf(f, "<text class=\"%s\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"%.1f\" "
               "font-weight=\"bold\" fill=\"#222\">", cls, cx, y, size);
    char *line = malloc(n + 1);
    if (line) {
        memcpy(line, s, n);
        line[n] = 0;
        xml_put(f, line);
        free(line);
    }
    fputs("</text>\n", f);
}

// A title within the canvas width W (long run paths make long titles): one line at `size`, or
// smaller down to TITLE_MIN; else two lines broken at the space nearest the middle, each down to
// TITLE_MIN2; else those lines cut in the middle with an ellipsis. baseline: one line's baseline;
// two lines sit about it, within the band above the plot.
static void draw_title(FILE *f, const char *cls, const char *title, double cx, double W, double baseline, double size) {
    double avail = W - 2 * TITLE_PAD;
    int n = code_points(title, strlen(title));
    double fit = avail / (n * TITLE_EM);
    if (fit >= TITLE_MIN) {
        title_line(f, cls, title, strlen(title), cx, W, baseline, fmin(size, fit));
        return;
    }
    // Two lines: the break nearest the middle (by code points); a title without a space is one line.
    size_t len = strlen(title), cut = 0;
    int best = -1;
    for (size_t i = 0; i < len; i++)
        if (title[i] == ' ') {
            int d = abs(2 * code_points(title, i) - n);
            if (best < 0 || d < best) best = d, cut = i;
        }
    const char *part[2] = {title, best >= 0 ? title + cut + 1 : NULL};
    size_t plen[2] = {best >= 0 ? cut : len, best >= 0 ? len - cut - 1 : 0};
    int nlines = best >= 0 ? 2 : 1, most = 0;
    for (int l = 0; l < nlines; l++) most = mn_max(most, code_points(part[l], plen[l]));
    double s2 = fmin(size * 0.85, fmax(TITLE_MIN2, avail / (most * TITLE_EM)));
    int keep = (int)floor(avail / (s2 * TITLE_EM)) - 1;  // code points a line holds, less the ellipsis
    for (int l = 0; l < nlines; l++) {
        double y = nlines == 1 ? baseline : baseline - 0.62 * s2 + l * 1.18 * s2;
        int c = code_points(part[l], plen[l]);
        if (c <= keep + 1) {
            title_line(f, cls, part[l], plen[l], cx, W, y, s2);
            continue;
        }
        // Cut in the middle: the start and the end (a path's last part) stay.
        size_t head = bytes_of(part[l], keep / 2), tail_from = bytes_of(part[l], c - (keep - keep / 2));
        size_t tail = plen[l] - tail_from;
        char *t = malloc(head + 3 + tail + 1);
        if (!t) return;
        memcpy(t, part[l], head);
        memcpy(t + head, "\xe2\x80\xa6", 3);
        memcpy(t + head + 3, part[l] + tail_from, tail);
        t[head + 3 + tail] = 0;
        title_line(f, cls, t, head + 3 + tail, cx, W, y, s2);
        free(t);
    }
}

static void draw_labels(FILE *f, const Frame *fr, const PlotOpts *o) {
    double mid_x = (fr->x0 + fr->x1) / 2, mid_y = (fr->y0 + fr->y1) / 2;
    if (o->title && o->title[0]) draw_title(f, "title", o->title, mid_x, fr->W, 28, TITLE_FONT);
    if (o->xlabel && o->xlabel[0]) {
        fprintf(f, "<text class=\"xlabel\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"%.0f\" fill=\"#222\">",
                mid_x, fr->H - 12, LABEL_FONT);
        xml_put(f, o->xlabel);
        fputs("</text>\n", f);
    }
    if (o->ylabel && o->ylabel[0]) {
        fprintf(f, "<text class=\"ylabel\" transform=\"translate(%.1f %.1f) rotate(-90)\" text-anchor=\"middle\" "
                   "font-size=\"%.0f\" fill=\"#222\">", 12 + LABEL_FONT, mid_y, LABEL_FONT);
        xml_put(f, o->ylabel);
        fputs("</text>\n", f);
    }
}

// A plot ready to draw: its options with the defaults filled in, axes and frame.
typedef struct {
    PlotOpts o;
    Axis ax, ay;
    Frame fr;
} Prepared;

static int prepare(const char *name, const PlotOpts *opts, double width, double height, const PlotSeries *series,
                   int nseries, Prepared *p) {
    p->o = opts ? *opts : (PlotOpts){0};
    if (p->o.width == 0) p->o.width = width;
    if (p->o.height == 0) p->o.height = height;
    if (p->o.ncats > 0) p->o.log_x = 0;
    MN_TRY(check_args(name, &p->o, series, nseries));
    Range r;
    data_range(&p->o, series, nseries, &r);
    if (r.finite == 0) return mn_error(MN_ERR_NUMERIC, "plot %s: no point has finite x and y", name);
    if (r.n == 0)
        return mn_error(MN_ERR_ARG, "plot %s: no point is positive on the log %s axis", name,
                        p->o.log_x && p->o.log_y ? "x and y" : p->o.log_x ? "x" : "y");
    if (p->o.y_hi > p->o.y_lo) r.ymin = fmin(r.ymin, p->o.y_lo), r.ymax = fmax(r.ymax, p->o.y_hi);
    if (!isfinite(r.xmax - r.xmin) || !isfinite(r.ymax - r.ymin))
        return mn_error(MN_ERR_ARG, "plot %s: data range too wide to draw", name);
    layout(&p->o, &r, &p->ax, &p->ay, &p->fr);
    return MN_OK;
}

static void draw_plot(FILE *f, const Prepared *p, const PlotSeries *series, int nseries) {
    draw_grid(f, &p->fr, &p->ax, &p->ay);
    for (int i = 0; i < nseries; i++) draw_series(f, &p->fr, &p->ax, &p->ay, &p->o, series, nseries, i);
    draw_axes(f, &p->fr, &p->ax, &p->ay);
    draw_legend(f, &p->fr, &p->ax, &p->ay, &p->o, series, nseries);
    draw_labels(f, &p->fr, &p->o);
}

static void svg_begin(FILE *f, double W, double H) {
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
               "font-family=\"%s\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            W, H, W, H, FONT);
}

int plot_svg(const char *path, const PlotOpts *opts, const PlotSeries *series, int nseries) {
    if (!path) return mn_error(MN_ERR_ARG, "plot: path is NULL");
    Prepared *p = calloc(1, sizeof *p);
    if (!p) return mn_error(MN_ERR_NOMEM, "plot %s: out of memory", path);
    AtomicFile af;
    int s = prepare(path, opts, 720, 440, series, nseries, p);
    if (!s) s = af_open(&af, path);
    if (!s) {
        svg_begin(af.f, p->fr.W, p->fr.H);
        draw_plot(af.f, p, series, nseries);
        fputs("</svg>\n", af.f);
        s = af_commit(&af);
    }
    free(p);
    return s;
}

#define PANEL_TITLE_BAND 40.0  // room above the panels for the figure's title

int plot_svg_panels(const char *path, const char *title, const PlotPanel *panels, int npanels) {
    if (!path) return mn_error(MN_ERR_ARG, "plot: path is NULL");
    if (!panels || npanels <= 0 || npanels > 16)
        return mn_error(MN_ERR_ARG, "plot %s: %d panels, expected 1 to 16", path, npanels);
    Prepared *p = calloc((size_t)npanels, sizeof *p);
    if (!p) return mn_error(MN_ERR_NOMEM, "plot %s: out of memory", path);
    int s = MN_OK;
    double W = 0, H = 0, top = title && title[0] ? PANEL_TITLE_BAND : 0;
    for (int i = 0; i < npanels && !s; i++) {
        char name[4200];
        snprintf(name, sizeof name, "%s (panel %d)", path, i + 1);
        s = prepare(name, &panels[i].opts, 480, 400, panels[i].series, panels[i].nseries, &p[i]);
        W += p[i].fr.W;
        H = fmax(H, p[i].fr.H);
    }
    AtomicFile af;
    if (!s) s = af_open(&af, path);
    if (!s) {
        FILE *f = af.f;
        svg_begin(f, W, H + top);
        if (top) draw_title(f, "figure-title", title, W / 2, W, 26, TITLE_FONT + 1);
        double x = 0;
        for (int i = 0; i < npanels; i++) {
            fprintf(f, "<g class=\"panel\" transform=\"translate(%.1f %.1f)\">\n", x, top);
            draw_plot(f, &p[i], panels[i].series, panels[i].nseries);
            fputs("</g>\n", f);
            x += p[i].fr.W;
        }
        fputs("</svg>\n", f);
        s = af_commit(&af);
    }
    free(p);
    return s;
}
