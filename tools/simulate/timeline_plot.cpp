#include "timeline_plot.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <string_view>

#include "sizes.h"
#include "svg_plot.h"

namespace zico::simulate {
namespace {

using plot::escape_xml;
using plot::fixed;
using plot::Frame;
using plot::kBytesPerGiB;
using plot::nice_step;
using plot::Point;
using plot::points_text;
using plot::text;
// The budget line is black, which the palette leaves out.
constexpr const auto& kColours = plot::kOkabeIto;

constexpr double kNsPerSecond = 1e9;

// Layout, in pixels.
constexpr int kMarginLeft = 80;
constexpr int kMarginRight = 170;  // the legend
constexpr int kMarginTop = 60;     // title and subtitle, one line each
constexpr double kTitlePx = 16;
constexpr double kSubtitlePx = 12;
constexpr double kLineGap = 4;      // between lines of a wrapped title or subtitle
constexpr int kMarginBottom = 48;  // tick labels and the axis name

struct Change {
  uint64_t time;
  size_t series;
  uint64_t bytes;
};

void draw_areas(std::string* svg, const Frame& f, const std::vector<StackSample>& samples, size_t series_count) {
  std::vector<uint64_t> times;
  times.reserve(samples.size());
  for (const StackSample& sample : samples) times.push_back(sample.time);
  std::vector<plot::Layer> layers(series_count);
  for (size_t s = 0; s < series_count; ++s) {
    layers[s].id = "series-" + std::to_string(s);
    layers[s].fill = kColours[s % kColours.size()];
    layers[s].bytes.reserve(samples.size());
    for (const StackSample& sample : samples) layers[s].bytes.push_back(sample.bytes[s]);
  }
  plot::draw_stacked_steps(svg, f, times, layers);
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

  // SVG text runs on past the image's edge: long titles and subtitles wrap,
  // and the plot moves down by their extra lines.
  const double text_room = width - kMarginLeft - 10;
  const std::vector<std::string> title_lines = plot::wrap_text(options.title, text_room, kTitlePx);
  const std::vector<std::string> subtitle_lines = plot::wrap_text(subtitle, text_room, kSubtitlePx);
  const double extra = static_cast<double>(title_lines.size() - 1) * (kTitlePx + kLineGap) +
                       static_cast<double>(subtitle_lines.size() - 1) * (kSubtitlePx + kLineGap);
  Frame f{static_cast<double>(kMarginLeft), static_cast<double>(width - kMarginRight),
          kMarginTop + extra, static_cast<double>(height - kMarginBottom)};
  f.t0 = t0;
  f.span = std::max<uint64_t>(1, t1 - t0);
  const double top_gib = static_cast<double>(std::max(peak, budget_max)) / kBytesPerGiB;
  f.y_top_gib = plot::y_top_for(top_gib);

  const std::string w = std::to_string(width), h = std::to_string(height);
  std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + w + "\" height=\"" + h +
                    "\" viewBox=\"0 0 " + w + " " + h + "\" font-family=\"sans-serif\">\n";
  svg += "<title>" + escape_xml(options.title) + "</title>\n";
  svg += "<rect width=\"" + w + "\" height=\"" + h + "\" fill=\"#fff\"/>\n";
  double y = 22;
  for (const std::string& line : title_lines) {
    text(&svg, f.x0, y, "class=\"title\" font-size=\"16\" font-weight=\"bold\"", line);
    y += kTitlePx + kLineGap;
  }
  y += 18 - (kTitlePx + kLineGap);  // the subtitle's first baseline: 40 under a one-line title
  for (const std::string& line : subtitle_lines) {
    text(&svg, f.x0, y, "class=\"subtitle\" font-size=\"12\" fill=\"#333\"", line);
    y += kSubtitlePx + kLineGap;
  }
  plot::draw_axes(&svg, f, f.t0, kNsPerSecond, "time (s)", "memory held (GiB)");
  if (!samples.empty()) draw_areas(&svg, f, samples, series.size());
  if (!budget.empty()) draw_budget(&svg, f, budget);
  std::vector<plot::LegendEntry> legend;
  for (size_t s = 0; s < series.size(); ++s) legend.push_back({series[s].name, kColours[s % kColours.size()]});
  plot::draw_legend(&svg, f, legend, !budget.empty());
  svg += "</svg>\n";
  return svg;
}

}  // namespace zico::simulate
