#include "memory_plot.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

namespace zico::replay {
namespace {

using trace::Block;
using trace::Category;
using trace::Event;
using trace::Trace;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;

// Builds a trace the way the reader fills one: dense block ids, events in
// file order, iteration_starts pointing at the `i` events.
class TraceBuilder {
 public:
  TraceBuilder() { trace_.meta["model"] = "toy"; }

  uint32_t alloc(uint64_t bytes, uint64_t time, Category category) {
    Block block;
    block.bytes = bytes;
    block.alloc_time = time;
    block.alloc_iteration = iteration();
    block.category = category;
    const auto id = static_cast<uint32_t>(trace_.blocks.size());
    trace_.blocks.push_back(block);
    trace_.events.push_back({Event::Kind::kAllocate, id, time});
    return id;
  }
  void free(uint32_t id, uint64_t time) {
    trace_.blocks[id].free_time = time;
    trace_.blocks[id].free_iteration = iteration();
    trace_.events.push_back({Event::Kind::kFree, id, time});
  }
  void iteration_start(uint64_t time) {
    const auto n = static_cast<uint32_t>(trace_.iteration_starts.size());
    trace_.iteration_starts.push_back(trace_.events.size());
    trace_.events.push_back({Event::Kind::kIteration, n, time});
  }
  Trace& trace() { return trace_; }

 private:
  uint32_t iteration() const {
    return trace_.iteration_starts.empty() ? 0 : static_cast<uint32_t>(trace_.iteration_starts.size() - 1);
  }
  Trace trace_;
};

// Two iterations of a toy step: weights live throughout, activations and a
// temporary come and go; peak 3 GiB + 512 MiB + 256 MiB in iteration 1.
Trace toy_trace() {
  TraceBuilder b;
  const uint32_t weights = b.alloc(2 * kGiB, 0, Category::kParam);
  for (uint32_t i = 0; i < 2; ++i) {
    const uint64_t t = 1'000'000 + i * 10'000'000;  // ns
    b.iteration_start(t);
    const uint32_t act = b.alloc(512 * kMiB * (i + 1), t + 1'000'000, Category::kActivation);
    const uint32_t tmp = b.alloc(256 * kMiB, t + 2'000'000, Category::kTemp);
    b.free(tmp, t + 3'000'000);
    b.free(act, t + 6'000'000);
  }
  (void)weights;
  return b.trace();
}

size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size())) ++n;
  return n;
}

// The numbers inside <text class="y-tick" ...>N</text>.
std::vector<double> y_ticks(const std::string& svg) {
  std::vector<double> ticks;
  for (size_t at = svg.find("class=\"y-tick\""); at != std::string::npos; at = svg.find("class=\"y-tick\"", at + 1)) {
    const size_t open = svg.find('>', at);
    ticks.push_back(std::strtod(svg.c_str() + open + 1, nullptr));
  }
  return ticks;
}

// The points attribute of the polygon with this id.
std::string polygon_points(const std::string& svg, const std::string& id) {
  const size_t at = svg.find("id=\"" + id + "\"");
  if (at == std::string::npos) return {};
  const size_t start = svg.find("points=\"", at) + 8;
  return svg.substr(start, svg.find('"', start) - start);
}

TEST(MemoryPlot, IsAStandaloneSvg) {
  const std::string svg = memory_plot_svg(toy_trace(), {});
  EXPECT_TRUE(svg.starts_with("<svg"));
  EXPECT_TRUE(svg.ends_with("</svg>\n"));
  EXPECT_NE(svg.find("xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
  EXPECT_EQ(svg.find("<script"), std::string::npos);
  EXPECT_EQ(svg.find("@import"), std::string::npos);
  EXPECT_EQ(svg.find("href"), std::string::npos) << "nothing external";
  EXPECT_EQ(count(svg, "<svg"), 1u);
  EXPECT_EQ(count(svg, "<text"), count(svg, "</text>"));
}

TEST(MemoryPlot, DrawsOneAreaPerCategoryPresent) {
  const std::string svg = memory_plot_svg(toy_trace(), {});
  EXPECT_EQ(count(svg, "<polygon"), 3u);
  EXPECT_NE(svg.find("id=\"area-param\""), std::string::npos);
  EXPECT_NE(svg.find("id=\"area-act\""), std::string::npos);
  EXPECT_NE(svg.find("id=\"area-temp\""), std::string::npos);
  EXPECT_EQ(svg.find("id=\"area-grad\""), std::string::npos);
  // The legend names exactly the categories drawn.
  EXPECT_NE(svg.find(">activations</text>"), std::string::npos) << "categories are spelled out";
  EXPECT_EQ(svg.find(">optimizer state</text>"), std::string::npos);
}

TEST(MemoryPlot, BudgetLineOnlyWhenAsked) {
  EXPECT_EQ(memory_plot_svg(toy_trace(), {}).find("id=\"budget\""), std::string::npos);
  PlotOptions options;
  options.budget_bytes = 8 * kGiB;
  const std::string svg = memory_plot_svg(toy_trace(), options);
  EXPECT_NE(svg.find("id=\"budget\""), std::string::npos);
  EXPECT_NE(svg.find("budget 8 GiB"), std::string::npos);
  const std::vector<double> ticks = y_ticks(svg);
  ASSERT_FALSE(ticks.empty());
  EXPECT_GE(*std::max_element(ticks.begin(), ticks.end()), 8.0) << "the budget is on the chart";
}

TEST(MemoryPlot, YAxisReachesThePeak) {
  const std::string svg = memory_plot_svg(toy_trace(), {});
  const double peak_gib = (2.0 * kGiB + 1024.0 * kMiB + 256.0 * kMiB) / kGiB;  // 3.25
  const std::vector<double> ticks = y_ticks(svg);
  ASSERT_GE(ticks.size(), 3u);
  EXPECT_EQ(ticks.front(), 0.0);
  EXPECT_GE(ticks.back(), peak_gib);
  EXPECT_LT(ticks.back(), 2 * peak_gib) << "and does not waste half the chart";
  EXPECT_NE(svg.find("peak 3.25 GiB live at 13.0 ms (iter 1)"), std::string::npos);
}

TEST(MemoryPlot, MarksIterationStarts) {
  const std::string svg = memory_plot_svg(toy_trace(), {});
  EXPECT_EQ(count(svg, "class=\"iteration\""), 2u);
  EXPECT_NE(svg.find(">iter 0</text>"), std::string::npos);
  EXPECT_NE(svg.find(">iter 1</text>"), std::string::npos);
  EXPECT_NE(svg.find("stroke-dasharray"), std::string::npos);
}

TEST(MemoryPlot, TitleDefaultsToTheModelAndIsEscaped) {
  Trace trace = toy_trace();
  EXPECT_NE(memory_plot_svg(trace, {}).find(">toy</text>"), std::string::npos);

  trace.meta["model"] = "gpt<2> & \"friends\"";
  const std::string from_meta = memory_plot_svg(trace, {});
  EXPECT_NE(from_meta.find("gpt&lt;2&gt; &amp; &quot;friends&quot;"), std::string::npos);
  EXPECT_EQ(from_meta.find("gpt<2>"), std::string::npos);

  PlotOptions options;
  options.title = "a<b & c's \x01 run";
  const std::string svg = memory_plot_svg(trace, options);
  EXPECT_NE(svg.find("<title>a&lt;b &amp; c&apos;s  run</title>"), std::string::npos);
  EXPECT_EQ(svg.find("a<b"), std::string::npos);
  EXPECT_EQ(svg.find('\x01'), std::string::npos) << "control characters are not XML";
}

TEST(MemoryPlot, TimeAxisIsInMilliseconds) {
  const std::string svg = memory_plot_svg(toy_trace(), {});
  EXPECT_NE(svg.find("time (ms)"), std::string::npos);
  // The trace spans 0..17 ms: ticks every 2 ms.
  EXPECT_NE(svg.find("class=\"x-tick\" text-anchor=\"middle\" font-size=\"11\">16</text>"), std::string::npos);
  EXPECT_EQ(svg.find(">18</text>"), std::string::npos);
}

TEST(MemoryPlot, SeriesIsExactForShortTraces) {
  const Trace trace = toy_trace();
  const std::vector<LiveSample> series = live_bytes_series(trace, 2000);
  ASSERT_EQ(series.size(), 11u) << "a zero start, nine changes and the end";
  EXPECT_EQ(series.front().total(), 0u);
  EXPECT_EQ(series[1].bytes[static_cast<size_t>(Category::kParam)], 2 * kGiB);
  uint64_t peak = 0;
  for (const LiveSample& s : series) peak = std::max(peak, s.total());
  EXPECT_EQ(peak, 2 * kGiB + 1024 * kMiB + 256 * kMiB);
  EXPECT_EQ(series.back().total(), 2 * kGiB);
  EXPECT_EQ(series.back().time, trace.events.back().time);
}

// A long trace with one short spike: downsampling bounds the vertices and
// keeps the spike.
TEST(MemoryPlot, DownsamplingKeepsThePeak) {
  TraceBuilder b;
  b.iteration_start(0);
  b.alloc(kGiB, 0, Category::kParam);
  uint64_t t = 0;
  for (int i = 0; i < 50000; ++i) {
    const uint32_t id = b.alloc(kMiB, t += 1000, Category::kTemp);
    b.free(id, t += 1000);
  }
  const uint32_t spike = b.alloc(7 * kGiB, t += 10, Category::kActivation);
  b.free(spike, t += 10);
  for (int i = 0; i < 50000; ++i) {
    const uint32_t id = b.alloc(2 * kMiB, t += 1000, Category::kGrad);
    b.free(id, t += 1000);
  }
  const Trace& trace = b.trace();

  const std::vector<LiveSample> series = live_bytes_series(trace, 2000);
  EXPECT_LE(series.size(), 1000u);
  uint64_t peak = 0;
  for (const LiveSample& s : series) peak = std::max(peak, s.total());
  EXPECT_EQ(peak, 8 * kGiB) << "the 20 ns spike survives";
  for (size_t i = 1; i < series.size(); ++i) ASSERT_LE(series[i - 1].time, series[i].time);
  EXPECT_EQ(series.back().time, t);

  const std::string svg = memory_plot_svg(trace, {});
  const std::string act = polygon_points(svg, "area-act");
  ASSERT_FALSE(act.empty());
  EXPECT_LE(count(act, ","), 2 * 2000u) << "vertices bounded";
  const std::vector<double> ticks = y_ticks(svg);
  EXPECT_GE(ticks.back(), 8.0);
  EXPECT_LT(svg.size(), 400'000u);
}

TEST(MemoryPlot, EmptyAndDegenerateTraces) {
  Trace empty;
  empty.name = "empty.ztrace.gz";
  const std::string svg = memory_plot_svg(empty, {});
  EXPECT_TRUE(svg.ends_with("</svg>\n"));
  EXPECT_NE(svg.find("empty.ztrace.gz"), std::string::npos) << "no model: the file name is the title";
  EXPECT_NE(svg.find("no events"), std::string::npos);
  EXPECT_TRUE(live_bytes_series(empty, 2000).empty());

  TraceBuilder b;  // everything at one instant
  const uint32_t a = b.alloc(kMiB, 5, Category::kInput);
  b.free(a, 5);
  const std::string instant = memory_plot_svg(b.trace(), {});
  EXPECT_NE(instant.find("id=\"area-input\""), std::string::npos);
  EXPECT_EQ(instant.find("nan"), std::string::npos);
  EXPECT_EQ(instant.find("inf"), std::string::npos);
}

}  // namespace
}  // namespace zico::replay
