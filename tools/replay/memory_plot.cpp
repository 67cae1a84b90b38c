#include "memory_plot.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <string_view>

#include "sizes.h"

namespace zico::replay {
namespace {

using trace::Category;
using trace::Event;
using trace::Trace;

// Okabe & Ito's colour-blind-safe palette, one colour per category in enum order.
constexpr std::array<const char*, kCategoryCount> kCategoryColours = {
    "#0072B2",  // param: blue
    "#E69F00",  // grad: orange
    "#009E73",  // optim: bluish green
    "#CC79A7",  // act: reddish purple
    "#D55E00",  // temp: vermillion
    "#56B4E9",  // input: sky blue
    "#999999",  // other: grey
};

constexpr double kNsPerMs = 1e6;
constexpr double kBytesPerGiB = 1073741824.0;

// Layout, in pixels.
constexpr int kMarginLeft = 80;
constexpr int kMarginRight = 130;  // the legend
constexpr int kMarginTop = 60;     // title, subtitle, iteration labels
constexpr int kMarginBottom = 48;  // tick labels and the axis name
constexpr double kMinLabelGap = 44;

std::string escape_xml(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        // XML 1.0 forbids the other C0 controls even as references.
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\t' || c == '\n' || c == '\r') out += c;
    }
  }
  return out;
}

// Locale-independent fixed-point text for coordinates and labels.
std::string fixed(double value, int decimals) {
  if (std::abs(value) < 0.5 * std::pow(10.0, -decimals)) value = 0;  // no "-0.0"
  char text[64];
  const auto [end, ec] = std::to_chars(text, text + sizeof text, value, std::chars_format::fixed, decimals);
  return ec == std::errc() ? std::string(text, end) : std::string("0");
}

// 1, 2 or 5 times a power of ten, the nearest to `raw` (Heckbert's nice numbers).
double nice_step(double raw) {
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double fraction = raw / magnitude;
  return (fraction < 1.5 ? 1 : fraction < 3 ? 2 : fraction < 7 ? 5 : 10) * magnitude;
}

int decimals_for(double step) { return std::max(0, static_cast<int>(-std::floor(std::log10(step) + 1e-9))); }

bool changes_memory(const Trace& trace, const Event& event) {
  return (event.kind == Event::Kind::kAllocate || event.kind == Event::Kind::kFree) &&
         event.index < trace.blocks.size();
}

void apply(const Trace& trace, const Event& event, LiveSample* state) {
  const trace::Block& block = trace.blocks[event.index];
  uint64_t& live = state->bytes[std::min(static_cast<size_t>(block.category), kCategoryCount - 1)];
  live = event.kind == Event::Kind::kAllocate ? live + block.bytes : live - std::min(live, block.bytes);
}

struct Frame {
  double x0, x1, y0, y1;  // plot area: x0 left, y0 top
  uint64_t t0 = 0, span = 1;
  double y_top_gib = 1;

  [[nodiscard]] double x(uint64_t time) const {
    return x0 + (x1 - x0) * static_cast<double>(time - t0) / static_cast<double>(span);
  }
  [[nodiscard]] double y(double bytes) const { return y1 - (y1 - y0) * (bytes / kBytesPerGiB) / y_top_gib; }
};

struct Point {
  double x, y;
};

bool between(double a, double b, double c) { return (a <= b && b <= c) || (c <= b && b <= a); }

// Drops points that lie on a straight horizontal or vertical run between
// their kept neighbours, which a step function has plenty of; turning points
// stay.
std::string polygon_points(const std::vector<Point>& points) {
  std::vector<Point> kept;
  kept.reserve(points.size());
  for (Point p : points) {
    p = {std::round(p.x * 10) / 10, std::round(p.y * 10) / 10};  // what the text will say
    if (!kept.empty() && kept.back().x == p.x && kept.back().y == p.y) continue;
    while (kept.size() >= 2) {
      const Point& a = kept[kept.size() - 2];
      const Point& b = kept.back();
      if (!(a.y == b.y && b.y == p.y && between(a.x, b.x, p.x)) && !(a.x == b.x && b.x == p.x && between(a.y, b.y, p.y))) {
        break;
      }
      kept.pop_back();
    }
    kept.push_back(p);
  }
  std::string out;
  out.reserve(kept.size() * 12);
  for (const Point& p : kept) {
    if (!out.empty()) out += ' ';
    out += fixed(p.x, 1);
    out += ',';
    out += fixed(p.y, 1);
  }
  return out;
}

void text(std::string* svg, double x, double y, std::string_view attributes, std::string_view content) {
  *svg += "<text x=\"" + fixed(x, 1) + "\" y=\"" + fixed(y, 1) + "\" " + std::string(attributes) + ">" +
          escape_xml(content) + "</text>\n";
}

void line(std::string* svg, double x1, double y1, double x2, double y2, std::string_view attributes) {
  *svg += "<line x1=\"" + fixed(x1, 1) + "\" y1=\"" + fixed(y1, 1) + "\" x2=\"" + fixed(x2, 1) + "\" y2=\"" +
          fixed(y2, 1) + "\" " + std::string(attributes) + "/>\n";
}

void draw_axes(std::string* svg, const Frame& f) {
  // y: GiB, from 0 to the top tick, with light grid lines.
  const double y_step = nice_step(f.y_top_gib / 6);
  const int y_decimals = decimals_for(y_step);
  for (int k = 0; k * y_step <= f.y_top_gib * (1 + 1e-9); ++k) {
    const double gib = k * y_step;
    const double y = f.y(gib * kBytesPerGiB);
    line(svg, f.x0, y, f.x1, y, "stroke=\"#e3e3e3\" stroke-width=\"1\"");
    text(svg, f.x0 - 6, y + 4, "class=\"y-tick\" text-anchor=\"end\" font-size=\"11\"", fixed(gib, y_decimals));
  }
  text(svg, 18, (f.y0 + f.y1) / 2, "text-anchor=\"middle\" font-size=\"12\" transform=\"rotate(-90 18 " +
                                       fixed((f.y0 + f.y1) / 2, 1) + ")\"",
       "live memory (GiB)");

  // x: ms of trace time.
  const double t0_ms = static_cast<double>(f.t0) / kNsPerMs;
  const double t1_ms = static_cast<double>(f.t0 + f.span) / kNsPerMs;
  const double x_step = nice_step((t1_ms - t0_ms) / 8);
  const int x_decimals = decimals_for(x_step);
  for (double k = std::ceil(t0_ms / x_step - 1e-9); k * x_step <= t1_ms * (1 + 1e-12) + 1e-12; ++k) {
    const double ms = k * x_step;
    const double x = f.x0 + (f.x1 - f.x0) * (ms - t0_ms) / (t1_ms - t0_ms);
    line(svg, x, f.y1, x, f.y1 + 4, "stroke=\"#333\" stroke-width=\"1\"");
    text(svg, x, f.y1 + 17, "class=\"x-tick\" text-anchor=\"middle\" font-size=\"11\"", fixed(ms, x_decimals));
  }
  text(svg, (f.x0 + f.x1) / 2, f.y1 + 38, "text-anchor=\"middle\" font-size=\"12\"", "time (ms)");
  line(svg, f.x0, f.y1, f.x1, f.y1, "stroke=\"#333\" stroke-width=\"1\"");
  line(svg, f.x0, f.y0, f.x0, f.y1, "stroke=\"#333\" stroke-width=\"1\"");
}

void draw_areas(std::string* svg, const Frame& f, const std::vector<LiveSample>& series,
                const std::array<bool, kCategoryCount>& present) {
  // Step vertices: each sample holds its value until the next one starts.
  std::vector<double> xs;
  xs.reserve(series.size() * 2);
  std::vector<size_t> sample_of;  // which sample's value each vertex shows
  sample_of.reserve(series.size() * 2);
  for (size_t i = 0; i < series.size(); ++i) {
    const double x = f.x(series[i].time);
    if (i > 0) {
      xs.push_back(x);
      sample_of.push_back(i - 1);
    }
    xs.push_back(x);
    sample_of.push_back(i);
  }
  std::vector<uint64_t> below(series.size(), 0);
  std::vector<Point> outline;
  for (size_t c = 0; c < kCategoryCount; ++c) {
    if (!present[c]) continue;
    outline.clear();
    for (size_t v = 0; v < xs.size(); ++v) {
      const LiveSample& s = series[sample_of[v]];
      outline.push_back({xs[v], f.y(static_cast<double>(below[sample_of[v]] + s.bytes[c]))});
    }
    for (size_t v = xs.size(); v-- > 0;) {
      outline.push_back({xs[v], f.y(static_cast<double>(below[sample_of[v]]))});
    }
    for (size_t i = 0; i < series.size(); ++i) below[i] += series[i].bytes[c];
    const char* name = trace::to_string(static_cast<Category>(c));
    *svg += "<polygon id=\"area-" + std::string(name) + "\" fill=\"" + kCategoryColours[c] +
            "\" fill-opacity=\"0.9\" stroke=\"none\" points=\"" + polygon_points(outline) + "\"/>\n";
  }
}

void draw_iterations(std::string* svg, const Frame& f, const Trace& trace) {
  double last_label = -1e9;
  for (const size_t index : trace.iteration_starts) {
    if (index >= trace.events.size()) continue;
    const Event& event = trace.events[index];
    const double x = f.x(event.time);
    line(svg, x, f.y0, x, f.y1, "class=\"iteration\" stroke=\"#555\" stroke-width=\"0.8\" stroke-dasharray=\"4 3\"");
    if (x - last_label >= kMinLabelGap) {
      text(svg, x + 2, f.y0 - 4, "font-size=\"10\" fill=\"#555\"", "iter " + std::to_string(event.index));
      last_label = x;
    }
  }
}

void draw_legend(std::string* svg, const Frame& f, const std::array<bool, kCategoryCount>& present,
                 uint64_t budget_bytes) {
  double y = f.y0 + 4;
  const double x = f.x1 + 16;
  // Top of the stack first, as it reads on the plot.
  for (size_t c = kCategoryCount; c-- > 0;) {
    if (!present[c]) continue;
    *svg += "<rect x=\"" + fixed(x, 1) + "\" y=\"" + fixed(y, 1) + "\" width=\"12\" height=\"12\" fill=\"" +
            kCategoryColours[c] + "\"/>\n";
    text(svg, x + 18, y + 10, "font-size=\"12\"", trace::to_string(static_cast<Category>(c)));
    y += 20;
  }
  if (budget_bytes > 0) {
    line(svg, x, y + 6, x + 12, y + 6, "stroke=\"#000\" stroke-width=\"1.5\"");
    text(svg, x + 18, y + 10, "font-size=\"12\"", "budget");
  }
}

}  // namespace

uint64_t LiveSample::total() const {
  uint64_t sum = 0;
  for (const uint64_t b : bytes) sum += b;
  return sum;
}

std::vector<LiveSample> live_bytes_series(const Trace& trace, size_t max_points) {
  std::vector<LiveSample> series;
  if (trace.events.empty()) return series;
  const uint64_t t0 = trace.events.front().time;
  const uint64_t t1 = trace.events.back().time;
  const size_t max_samples = std::max<size_t>(max_points, 4) / 2;
  size_t changes = 0;
  for (const Event& event : trace.events) changes += changes_memory(trace, event) ? 1 : 0;

  LiveSample state;
  state.time = t0;
  if (changes + 2 <= max_samples || t1 == t0) {
    series.reserve(changes + 2);
    series.push_back(state);
    for (const Event& event : trace.events) {
      if (!changes_memory(trace, event)) continue;
      apply(trace, event, &state);
      state.time = event.time;
      series.push_back(state);
    }
  } else {
    // Equal time buckets; each starts with the state carried into it and
    // keeps the state of largest total seen inside it.
    const size_t buckets = max_samples - 1;
    const uint64_t span = t1 - t0;
    auto bucket_of = [&](uint64_t time) {
      const double share = static_cast<double>(time - t0) / static_cast<double>(span);
      return std::min(buckets - 1, static_cast<size_t>(share * static_cast<double>(buckets)));
    };
    series.reserve(buckets + 1);
    for (const Event& event : trace.events) {
      if (!changes_memory(trace, event)) continue;
      const size_t bucket = bucket_of(event.time);
      while (series.size() <= bucket) series.push_back(state);
      apply(trace, event, &state);
      if (state.total() > series[bucket].total()) series[bucket].bytes = state.bytes;
    }
    while (series.size() < buckets) series.push_back(state);
    for (size_t b = 0; b < buckets; ++b) {
      series[b].time = t0 + static_cast<uint64_t>(static_cast<double>(span) * static_cast<double>(b) /
                                                  static_cast<double>(buckets));
    }
  }
  state.time = t1;
  series.push_back(state);
  return series;
}

std::string memory_plot_svg(const Trace& trace, const PlotOptions& options) {
  const int width = std::max(options.width, 480);
  const int height = std::max(options.height, 260);
  std::string title = options.title;
  if (title.empty()) {
    const auto model = trace.meta.find("model");
    title = model != trace.meta.end() ? model->second : trace.name;
  }

  // The exact peak, for the subtitle; the series keeps it too, but only
  // bucket-accurate in time.
  std::array<bool, kCategoryCount> present{};
  for (const trace::Block& block : trace.blocks) {
    present[std::min(static_cast<size_t>(block.category), kCategoryCount - 1)] = true;
  }
  LiveSample state;
  uint64_t peak = 0, peak_time = 0;
  uint32_t iteration = 0, peak_iteration = 0;
  for (const Event& event : trace.events) {
    if (event.kind == Event::Kind::kIteration) iteration = event.index;
    if (!changes_memory(trace, event)) continue;
    apply(trace, event, &state);
    if (state.total() > peak) {
      peak = state.total();
      peak_time = event.time;
      peak_iteration = iteration;
    }
  }

  Frame f{static_cast<double>(kMarginLeft), static_cast<double>(width - kMarginRight),
          static_cast<double>(kMarginTop), static_cast<double>(height - kMarginBottom)};
  if (!trace.events.empty()) {
    f.t0 = trace.events.front().time;
    f.span = std::max<uint64_t>(1, trace.events.back().time - f.t0);
  }
  const double top_gib = static_cast<double>(std::max(peak, options.budget_bytes)) / kBytesPerGiB;
  if (top_gib > 0) {
    const double step = nice_step(top_gib / 6);
    f.y_top_gib = std::ceil(top_gib / step - 1e-9) * step;
    if (f.y_top_gib < top_gib) f.y_top_gib += step;
  }

  const std::string w = std::to_string(width), h = std::to_string(height);
  std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + w + "\" height=\"" + h +
                    "\" viewBox=\"0 0 " + w + " " + h + "\" font-family=\"sans-serif\">\n";
  svg += "<title>" + escape_xml(title) + "</title>\n";
  svg += "<rect width=\"" + w + "\" height=\"" + h + "\" fill=\"#fff\"/>\n";
  text(&svg, f.x0, 22, "font-size=\"16\" font-weight=\"bold\"", title);

  std::string subtitle;
  if (trace.events.empty()) {
    subtitle = "no events";
  } else {
    subtitle = "peak " + format_size(peak) + " live at " + fixed(static_cast<double>(peak_time) / kNsPerMs, 1) +
               " ms";
    if (!trace.iteration_starts.empty()) subtitle += " (iter " + std::to_string(peak_iteration) + ")";
  }
  if (options.budget_bytes > 0) subtitle += ", budget " + format_size(options.budget_bytes);
  text(&svg, f.x0, 40, "class=\"subtitle\" font-size=\"12\" fill=\"#333\"", subtitle);

  draw_axes(&svg, f);
  const std::vector<LiveSample> series = live_bytes_series(trace, options.max_points);
  if (!series.empty()) draw_areas(&svg, f, series, present);
  draw_iterations(&svg, f, trace);
  if (options.budget_bytes > 0) {
    const double y = f.y(static_cast<double>(options.budget_bytes));
    line(&svg, f.x0, y, f.x1, y, "id=\"budget\" stroke=\"#000\" stroke-width=\"1.5\"");
    text(&svg, f.x1 - 4, y - 4, "text-anchor=\"end\" font-size=\"11\"", "budget " + format_size(options.budget_bytes));
  }
  draw_legend(&svg, f, present, options.budget_bytes);
  svg += "</svg>\n";
  return svg;
}

}  // namespace zico::replay
