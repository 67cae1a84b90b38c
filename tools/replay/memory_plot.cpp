#include "memory_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string_view>

#include "sizes.h"
#include "svg_plot.h"

namespace zico::replay {
namespace {

using plot::escape_xml;
using plot::fixed;
using plot::Frame;
using plot::kBytesPerGiB;
using plot::line;
using plot::nice_step;
using plot::text;
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

// Layout, in pixels.
constexpr int kMarginLeft = 80;
constexpr int kMarginRight = 130;  // the legend
constexpr int kMarginTop = 60;     // title, subtitle, iteration labels
constexpr int kMarginBottom = 48;  // tick labels and the axis name
constexpr double kMinLabelGap = 44;

bool changes_memory(const Trace& trace, const Event& event) {
  return (event.kind == Event::Kind::kAllocate || event.kind == Event::Kind::kFree) &&
         event.index < trace.blocks.size();
}

void apply(const Trace& trace, const Event& event, LiveSample* state) {
  const trace::Block& block = trace.blocks[event.index];
  uint64_t& live = state->bytes[std::min(static_cast<size_t>(block.category), kCategoryCount - 1)];
  live = event.kind == Event::Kind::kAllocate ? live + block.bytes : live - std::min(live, block.bytes);
}

void draw_areas(std::string* svg, const Frame& f, const std::vector<LiveSample>& series,
                const std::array<bool, kCategoryCount>& present) {
  std::vector<uint64_t> times;
  times.reserve(series.size());
  for (const LiveSample& sample : series) times.push_back(sample.time);
  std::vector<plot::Layer> layers;
  for (size_t c = 0; c < kCategoryCount; ++c) {
    if (!present[c]) continue;
    plot::Layer layer{std::string("area-") + trace::to_string(static_cast<Category>(c)), kCategoryColours[c], "0.9", {}};
    layer.bytes.reserve(series.size());
    for (const LiveSample& sample : series) layer.bytes.push_back(sample.bytes[c]);
    layers.push_back(std::move(layer));
  }
  plot::draw_stacked_steps(svg, f, times, layers);
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
  f.y_top_gib = plot::y_top_for(top_gib);

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

  plot::draw_axes(&svg, f, 0, kNsPerMs, "time (ms)", "live memory (GiB)");
  const std::vector<LiveSample> series = live_bytes_series(trace, options.max_points);
  if (!series.empty()) draw_areas(&svg, f, series, present);
  draw_iterations(&svg, f, trace);
  if (options.budget_bytes > 0) {
    const double y = f.y(static_cast<double>(options.budget_bytes));
    line(&svg, f.x0, y, f.x1, y, "id=\"budget\" stroke=\"#000\" stroke-width=\"1.5\"");
    text(&svg, f.x1 - 4, y - 4, "text-anchor=\"end\" font-size=\"11\"", "budget " + format_size(options.budget_bytes));
  }
  // The trace format's short category names, spelled out for a reader.
  static constexpr std::array<const char*, kCategoryCount> kLegendNames = {
      "parameters", "gradients", "optimizer state", "activations", "temporaries", "inputs", "other"};
  std::vector<plot::LegendEntry> legend;
  for (size_t c = 0; c < kCategoryCount; ++c) {
    if (present[c]) legend.push_back({kLegendNames[c], kCategoryColours[c]});
  }
  plot::draw_legend(&svg, f, legend, options.budget_bytes > 0);
  svg += "</svg>\n";
  return svg;
}

}  // namespace zico::replay
