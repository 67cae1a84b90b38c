#include "timeline_plot.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <string_view>

#include "sizes.h"

namespace zico::simulate {
namespace {

// Okabe & Ito's palette without black, which the budget line uses.
constexpr std::array<const char*, 7> kColours = {
    "#0072B2",  // blue
    "#E69F00",  // orange
    "#009E73",  // bluish green
    "#CC79A7",  // reddish purple
    "#D55E00",  // vermillion
    "#56B4E9",  // sky blue
    "#F0E442",  // yellow
};

constexpr double kNsPerSecond = 1e9;
constexpr double kBytesPerGiB = 1073741824.0;

// Layout, in pixels.
constexpr int kMarginLeft = 80;
constexpr int kMarginRight = 170;  // the legend
constexpr int kMarginTop = 60;     // title and subtitle
constexpr int kMarginBottom = 48;  // tick labels and the axis name

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

struct Change {
  uint64_t time;
  size_t series;
  uint64_t bytes;
};

struct Frame {
  double x0, x1, y0, y1;  // plot area: x0 left, y0 top
  uint64_t t0 = 0, span = 1;
  double y_top_gib = 1;

  [[nodiscard]] double x(uint64_t time) const {
    const uint64_t clamped = std::clamp(time, t0, t0 + span);
    return x0 + (x1 - x0) * static_cast<double>(clamped - t0) / static_cast<double>(span);
  }
  [[nodiscard]] double y(double bytes) const { return y1 - (y1 - y0) * (bytes / kBytesPerGiB) / y_top_gib; }
};

struct Point {
  double x, y;
};

bool between(double a, double b, double c) { return (a <= b && b <= c) || (c <= b && b <= a); }

// Drops points on a straight horizontal or vertical run between their kept
// neighbours, which a step function has plenty of; turning points stay.
std::string points_text(const std::vector<Point>& points) {
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
  const double y_step = nice_step(f.y_top_gib / 6);
  const int y_decimals = decimals_for(y_step);
  for (int k = 0; k * y_step <= f.y_top_gib * (1 + 1e-9); ++k) {
    const double gib = k * y_step;
    const double y = f.y(gib * kBytesPerGiB);
    line(svg, f.x0, y, f.x1, y, "stroke=\"#e3e3e3\" stroke-width=\"1\"");
    text(svg, f.x0 - 6, y + 4, "class=\"y-tick\" text-anchor=\"end\" font-size=\"11\"", fixed(gib, y_decimals));
  }
  text(svg, 18, (f.y0 + f.y1) / 2,
       "text-anchor=\"middle\" font-size=\"12\" transform=\"rotate(-90 18 " + fixed((f.y0 + f.y1) / 2, 1) + ")\"",
       "memory held (GiB)");

  const double span_s = static_cast<double>(f.span) / kNsPerSecond;
  const double x_step = nice_step(span_s / 8);
  const int x_decimals = decimals_for(x_step);
  for (int k = 0; k * x_step <= span_s * (1 + 1e-12) + 1e-12; ++k) {
    const double s = k * x_step;
    const double x = f.x0 + (f.x1 - f.x0) * s / span_s;
    line(svg, x, f.y1, x, f.y1 + 4, "stroke=\"#333\" stroke-width=\"1\"");
    text(svg, x, f.y1 + 17, "class=\"x-tick\" text-anchor=\"middle\" font-size=\"11\"", fixed(s, x_decimals));
  }
  text(svg, (f.x0 + f.x1) / 2, f.y1 + 38, "text-anchor=\"middle\" font-size=\"12\"", "time (s)");
  line(svg, f.x0, f.y1, f.x1, f.y1, "stroke=\"#333\" stroke-width=\"1\"");
  line(svg, f.x0, f.y0, f.x0, f.y1, "stroke=\"#333\" stroke-width=\"1\"");
}

void draw_areas(std::string* svg, const Frame& f, const std::vector<StackSample>& samples, size_t series_count) {
  // Step vertices: each sample holds its value until the next one starts.
  std::vector<double> xs;
  std::vector<size_t> sample_of;  // which sample's value each vertex shows
  xs.reserve(samples.size() * 2);
  sample_of.reserve(samples.size() * 2);
  for (size_t i = 0; i < samples.size(); ++i) {
    const double x = f.x(samples[i].time);
    if (i > 0) {
      xs.push_back(x);
      sample_of.push_back(i - 1);
    }
    xs.push_back(x);
    sample_of.push_back(i);
  }
  std::vector<uint64_t> below(samples.size(), 0);
  std::vector<Point> outline;
  for (size_t s = 0; s < series_count; ++s) {
    outline.clear();
    for (size_t v = 0; v < xs.size(); ++v) {
      const size_t i = sample_of[v];
      outline.push_back({xs[v], f.y(static_cast<double>(below[i] + samples[i].bytes[s]))});
    }
    for (size_t v = xs.size(); v-- > 0;) outline.push_back({xs[v], f.y(static_cast<double>(below[sample_of[v]]))});
    for (size_t i = 0; i < samples.size(); ++i) below[i] += samples[i].bytes[s];
    *svg += "<polygon id=\"series-" + std::to_string(s) + "\" fill=\"" + kColours[s % kColours.size()] +
            "\" fill-opacity=\"0.85\" stroke=\"none\" points=\"" + points_text(outline) + "\"/>\n";
  }
}

void draw_budget(std::string* svg, const Frame& f, const TimeSteps& budget) {
  std::vector<Point> points;
  for (size_t i = 0; i < budget.size(); ++i) {
    const double y = f.y(static_cast<double>(budget[i].second));
    const uint64_t until = i + 1 < budget.size() ? budget[i + 1].first : f.t0 + f.span;
    points.push_back({f.x(budget[i].first), y});
    points.push_back({f.x(until), y});
  }
  *svg += "<polyline id=\"budget\" fill=\"none\" stroke=\"#000\" stroke-width=\"1.5\" points=\"" +
          points_text(points) + "\"/>\n";
}

void draw_legend(std::string* svg, const Frame& f, const std::vector<TimelineSeries>& series, bool budget) {
  double y = f.y0 + 4;
  const double x = f.x1 + 16;
  // Top of the stack first, as it reads on the plot.
  for (size_t s = series.size(); s-- > 0;) {
    *svg += "<rect x=\"" + fixed(x, 1) + "\" y=\"" + fixed(y, 1) + "\" width=\"12\" height=\"12\" fill=\"" +
            kColours[s % kColours.size()] + "\"/>\n";
    text(svg, x + 18, y + 10, "class=\"legend\" font-size=\"12\"", series[s].name);
    y += 20;
  }
  if (budget) {
    line(svg, x, y + 6, x + 12, y + 6, "stroke=\"#000\" stroke-width=\"1.5\"");
    text(svg, x + 18, y + 10, "class=\"legend\" font-size=\"12\"", "budget");
  }
}

}  // namespace

uint64_t StackSample::total() const {
  uint64_t sum = 0;
  for (const uint64_t b : bytes) sum += b;
  return sum;
}

std::vector<StackSample> stacked_series(const std::vector<TimelineSeries>& series, size_t max_points) {
  std::vector<Change> changes;
  for (size_t s = 0; s < series.size(); ++s) {
    for (const auto& [time, bytes] : series[s].steps) changes.push_back({time, s, bytes});
  }
  std::vector<StackSample> samples;
  if (changes.empty()) return samples;
  std::stable_sort(changes.begin(), changes.end(), [](const Change& a, const Change& b) { return a.time < b.time; });
  const uint64_t t0 = changes.front().time;
  const uint64_t t1 = changes.back().time;
  const size_t max_samples = std::max<size_t>(max_points, 4) / 2;

  StackSample state;
  state.time = t0;
  state.bytes.assign(series.size(), 0);
  uint64_t total = 0;
  const auto apply = [&](const Change& c) {
    total = total - state.bytes[c.series] + c.bytes;
    state.bytes[c.series] = c.bytes;
  };
  if (changes.size() + 2 <= max_samples || t1 == t0) {
    samples.reserve(changes.size() + 2);
    samples.push_back(state);
    for (size_t i = 0; i < changes.size(); ++i) {
      apply(changes[i]);
      if (i + 1 < changes.size() && changes[i + 1].time == changes[i].time) continue;
      state.time = changes[i].time;
      samples.push_back(state);
    }
  } else {
    // Equal time buckets; each starts with the state carried into it and
    // keeps the state of largest total seen inside it.
    const size_t buckets = max_samples - 1;
    const uint64_t span = t1 - t0;
    const auto bucket_of = [&](uint64_t time) {
      const double share = static_cast<double>(time - t0) / static_cast<double>(span);
      return std::min(buckets - 1, static_cast<size_t>(share * static_cast<double>(buckets)));
    };
    std::vector<uint64_t> totals;
    samples.reserve(buckets + 1);
    for (size_t i = 0; i < changes.size(); ++i) {
      const size_t bucket = bucket_of(changes[i].time);
      while (samples.size() <= bucket) {
        samples.push_back(state);
        totals.push_back(total);
      }
      apply(changes[i]);
      if (i + 1 < changes.size() && changes[i + 1].time == changes[i].time) continue;
      if (total > totals[bucket]) {
        samples[bucket].bytes = state.bytes;
        totals[bucket] = total;
      }
    }
    while (samples.size() < buckets) samples.push_back(state);
    for (size_t b = 0; b < buckets; ++b) {
      samples[b].time = t0 + static_cast<uint64_t>(static_cast<double>(span) * static_cast<double>(b) /
                                                   static_cast<double>(buckets));
    }
  }
  state.time = t1;
  samples.push_back(state);
  return samples;
}

std::string timeline_plot_svg(const std::vector<TimelineSeries>& series, const TimeSteps& budget,
                              const TimelinePlotOptions& options) {
  const int width = std::max(options.width, 480);
  const int height = std::max(options.height, 260);
  const std::vector<StackSample> samples = stacked_series(series, options.max_points);

  // The exact peak of the sum, for the subtitle and the scale.
  uint64_t peak = 0, peak_time = 0;
  {
    const std::vector<StackSample> exact = stacked_series(series, SIZE_MAX);
    for (const StackSample& s : exact) {
      if (s.total() > peak) {
        peak = s.total();
        peak_time = s.time;
      }
    }
  }
  uint64_t t0 = UINT64_MAX, t1 = 0, budget_max = 0, budget_min = UINT64_MAX;
  for (const TimelineSeries& s : series) {
    if (s.steps.empty()) continue;
    t0 = std::min(t0, s.steps.front().first);
    t1 = std::max(t1, s.steps.back().first);
  }
  for (const auto& [time, bytes] : budget) {
    t0 = std::min(t0, time);
    t1 = std::max(t1, time);
    budget_max = std::max(budget_max, bytes);
    budget_min = std::min(budget_min, bytes);
  }
  if (t0 == UINT64_MAX) t0 = t1 = 0;

  Frame f{static_cast<double>(kMarginLeft), static_cast<double>(width - kMarginRight),
          static_cast<double>(kMarginTop), static_cast<double>(height - kMarginBottom)};
  f.t0 = t0;
  f.span = std::max<uint64_t>(1, t1 - t0);
  const double top_gib = static_cast<double>(std::max(peak, budget_max)) / kBytesPerGiB;
  if (top_gib > 0) {
    const double step = nice_step(top_gib / 6);
    f.y_top_gib = std::ceil(top_gib / step - 1e-9) * step;
    if (f.y_top_gib < top_gib) f.y_top_gib += step;
  }

  std::string subtitle = options.subtitle;
  if (subtitle.empty()) {
    subtitle = samples.empty() ? "nothing held"
                               : "peak " + format_size(peak) + " at " +
                                     fixed(static_cast<double>(peak_time - t0) / kNsPerSecond, 3) + " s";
    if (!budget.empty()) {
      subtitle += budget_min == budget_max ? ", budget " + format_size(budget_max)
                                           : ", budget " + format_size(budget_min) + " to " + format_size(budget_max);
    }
  }

  const std::string w = std::to_string(width), h = std::to_string(height);
  std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + w + "\" height=\"" + h +
                    "\" viewBox=\"0 0 " + w + " " + h + "\" font-family=\"sans-serif\">\n";
  svg += "<title>" + escape_xml(options.title) + "</title>\n";
  svg += "<rect width=\"" + w + "\" height=\"" + h + "\" fill=\"#fff\"/>\n";
  text(&svg, f.x0, 22, "font-size=\"16\" font-weight=\"bold\"", options.title);
  text(&svg, f.x0, 40, "class=\"subtitle\" font-size=\"12\" fill=\"#333\"", subtitle);
  draw_axes(&svg, f);
  if (!samples.empty()) draw_areas(&svg, f, samples, series.size());
  if (!budget.empty()) draw_budget(&svg, f, budget);
  draw_legend(&svg, f, series, !budget.empty());
  svg += "</svg>\n";
  return svg;
}

}  // namespace zico::simulate
