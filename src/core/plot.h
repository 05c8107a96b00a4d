/*
 * Result files for people: SVG line plots (loss curves, per-position NLL
 * curves), written by hand with no dependency; their tables are csv.h's.
 *
 * The writers are atomic (temporary file, fsync, rename; see
 * core/atomic_file.h), so a plot refreshed during training is never seen
 * half-written.
 */
#ifndef MN_PLOT_H
#define MN_PLOT_H

typedef struct {
    const char *name;      // legend entry; NULL or "" leaves the series out of the legend
    const double *x, *y;   // n points; non-finite ones are skipped, breaking the line
    int n;
    int color;             // 0: the series' place in the palette; k > 0: palette colour k - 1 (to pair
                           // series, e.g. a noisy curve and its running mean in one colour)
    int faint;             // a thin, translucent line: the noisy curve behind a smooth one
    int markers;           // a dot on every point (few points, e.g. one per setting)
} PlotSeries;

typedef struct {
    const char *title, *xlabel, *ylabel;  // any may be NULL; XML characters are escaped
    int log_x, log_y;                     // log10 axes; points <= 0 on them are skipped
    double width, height;                 // pixels; 0 -> 720 x 440
    const char *const *xcats;             // ncats > 0: a categorical x axis, x = 0 .. ncats - 1
    int ncats;                            // labelled xcats[0 .. ncats - 1] (log_x is ignored)
    double y_lo, y_hi;                    // y_hi > y_lo: the y axis spans at least [y_lo, y_hi], a metric's
                                          // whole range (0..1 for an accuracy, so that all-zero values do
                                          // not get an axis of -1..1); data beyond it widen it
    int dodge;                            // points of several series that would hide each other (the same
                                          // x, within a marker of each other in y) are drawn side by side,
                                          // in series order, their lines through them
} PlotOpts;

// One plot of a figure of several side by side.
typedef struct {
    PlotOpts opts;  // its size: 0 -> 480 x 400
    const PlotSeries *series;
    int nseries;
} PlotPanel;

// Draws the series as lines in one plot: "nice" ticks (1, 2, 5 x 10^k) on
// linear axes, decades on log axes (with 2 and 5, or every integer multiple,
// when few decades are shown; nice linear values within a factor of 10),
// gridlines, a legend box in the emptiest
// corner, a fixed palette of 10 colours (dashed after that), a line at y = 0
// when the y range spans 0. A title too wide for the canvas is set smaller,
// then on two lines, so that it is never cut. Isolated points (a single-point series, or a point
// between two skipped ones) are drawn as markers. opts may be NULL.
// Errors: no series, nothing finite to draw (MN_ERR_NUMERIC), nothing
// positive on a log axis, bad sizes.
int plot_svg(const char *path, const PlotOpts *opts, const PlotSeries *series, int nseries);

// Draws the panels side by side in one SVG (each as plot_svg would draw it),
// under a common title (may be NULL). Errors: as plot_svg's, naming the panel.
int plot_svg_panels(const char *path, const char *title, const PlotPanel *panels, int npanels);

#endif
