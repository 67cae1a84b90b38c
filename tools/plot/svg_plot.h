// The pieces every zicoum SVG plot is drawn with: XML-safe text, locale-free
// numbers, "nice" tick steps, a plot frame mapping time and bytes to pixels,
// axes, stacked step areas and their legend. Used by the trace plots
// (replay/memory_plot) and the sharing timelines (simulate/timeline_plot);
// each keeps its own layout and data reduction.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace zico::plot {

inline constexpr double kBytesPerGiB = 1073741824.0;

// Okabe and Ito's colour-blind-safe palette, without black.
inline constexpr std::array<const char*, 7> kOkabeIto = {
    "#0072B2",  // blue
    "#E69F00",  // orange
    "#009E73",  // bluish green
    "#CC79A7",  // reddish purple
    "#D55E00",  // vermillion
    "#56B4E9",  // sky blue
    "#F0E442",  // yellow
};

[[nodiscard]] std::string escape_xml(std::string_view text);
// Locale-independent fixed-point text for coordinates and labels; never "-0.0".
[[nodiscard]] std::string fixed(double value, int decimals);
// 1, 2 or 5 times a power of ten, the nearest to `raw` (Heckbert's nice numbers).
[[nodiscard]] double nice_step(double raw);
// Decimals that a tick step needs to print exactly.
[[nodiscard]] int decimals_for(double step);
// The top of a y axis for data (and a budget line) reaching `top_gib`: a
// whole number of nice steps, at least 5 % above it, so that a line at
// `top_gib` never lies on the frame's top edge. 1 when there is no data.
[[nodiscard]] double y_top_for(double top_gib);

// The plot area (x0 left, y0 top) and what it shows: time t0..t0+span in
// ns, bytes 0..y_top_gib GiB.
struct Frame {
  double x0 = 0, x1 = 0, y0 = 0, y1 = 0;
  uint64_t t0 = 0, span = 1;
  double y_top_gib = 1;

  // Times outside the frame are drawn at its edge.
  [[nodiscard]] double x(uint64_t time) const;
  [[nodiscard]] double y(double bytes) const;
};

struct Point {
  double x, y;
};

// The "x,y x,y ..." text of a polygon or polyline, rounded to 0.1 px, without
// the points that lie on a straight horizontal or vertical run between their
// kept neighbours (a step function has plenty); turning points stay.
[[nodiscard]] std::string points_text(const std::vector<Point>& points);

// A label's width, estimated: SVG text does not wrap, and its glyphs are
// measured only where it is drawn; 0.6 em a character is wider than sans-serif
// text (DejaVu's lower case, digits and spaces) runs, so what fits here fits.
[[nodiscard]] double text_width(std::string_view text, double font_px);
// `text` broken at spaces into lines of at most `width_px` (text_width); a
// word longer than that gets a line of its own.
[[nodiscard]] std::vector<std::string> wrap_text(std::string_view text, double width_px, double font_px);

void text(std::string* svg, double x, double y, std::string_view attributes, std::string_view content);
void line(std::string* svg, double x1, double y1, double x2, double y2, std::string_view attributes);

// GiB on y with light grid lines, time on x in units of `ns_per_unit`
// (1e6: ms, 1e9: s) counted from `origin_ns`, both axis lines, and the two
// axis names (an empty x_label: the caller draws it, below what it adds
// under the axis).
void draw_axes(std::string* svg, const Frame& frame, uint64_t origin_ns, double ns_per_unit, std::string_view x_label,
               std::string_view y_label);

// Stacked step areas: sample i holds its values from times[i] until
// times[i + 1]. layers[l][i] is layer l's bytes at sample i; layer 0 is at
// the bottom. One polygon per layer, with the given id and fill.
struct Layer {
  std::string id;
  const char* fill = "#000";
  const char* fill_opacity = "0.85";
  std::vector<uint64_t> bytes;  // one per sample
};
void draw_stacked_steps(std::string* svg, const Frame& frame, const std::vector<uint64_t>& times,
                        const std::vector<Layer>& layers);

// The legend right of the frame: a swatch and a name per entry, the last
// entry at the top (as a stack reads, entries bottom layer first), then the
// budget's line if there is one. Names are text with class "legend".
struct LegendEntry {
  std::string name;
  const char* fill = "#000";
};
void draw_legend(std::string* svg, const Frame& frame, const std::vector<LegendEntry>& entries, bool budget_line);

}  // namespace zico::plot
