#include "timeline_plot.h"

#include <gtest/gtest.h>

#include "svg_plot.h"

#include <algorithm>
#include <string>
#include <vector>

namespace zico::simulate {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kMs = 1'000'000;

std::vector<TimelineSeries> two_jobs() {
  return {
      {"bert", {{0, 2 * kGiB}, {100 * kMs, 6 * kGiB}, {300 * kMs, 2 * kGiB}, {1000 * kMs, 0}}},
      {"a <&> b", {{0, 1 * kGiB}, {400 * kMs, 5 * kGiB}, {600 * kMs, 1 * kGiB}, {900 * kMs, 0}}},
  };
}

size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

TEST(TimelinePlot, IsAStandaloneSvgWithEscapedNamesAndABudgetLine) {
  TimelinePlotOptions options;
  options.title = "zico <budget> & co";
  const TimeSteps budget = {{0, 8 * kGiB}, {500 * kMs, 5 * kGiB}};
  const std::string svg = timeline_plot_svg(two_jobs(), budget, options);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_TRUE(svg.ends_with("</svg>\n"));
  EXPECT_NE(svg.find("a &lt;&amp;&gt; b"), std::string::npos);
  EXPECT_EQ(svg.find("a <&> b"), std::string::npos);
  EXPECT_NE(svg.find("zico &lt;budget&gt; &amp; co"), std::string::npos);
  EXPECT_NE(svg.find("id=\"budget\""), std::string::npos);
  EXPECT_EQ(count(svg, "<polygon"), 2u) << "one area per job";
  EXPECT_NE(svg.find("#0072B2"), std::string::npos);
  EXPECT_NE(svg.find("#E69F00"), std::string::npos);
  EXPECT_EQ(svg.find("<script"), std::string::npos);
  EXPECT_EQ(svg.find("href"), std::string::npos);
  EXPECT_NE(svg.find("time (s)"), std::string::npos);
  EXPECT_NE(svg.find("GiB"), std::string::npos);
  EXPECT_NE(svg.find("budget 5 GiB to 8 GiB"), std::string::npos) << "the default subtitle names the range";
  EXPECT_EQ(count(svg, "<text"), count(svg, "</text>"));
  // The legend reads as the stack does: the top job first, then the budget.
  const size_t top = svg.find("class=\"legend\" font-size=\"12\">a &lt;&amp;&gt; b</text>");
  const size_t bottom = svg.find("class=\"legend\" font-size=\"12\">bert</text>");
  const size_t budget_entry = svg.find("class=\"legend\" font-size=\"12\">budget</text>");
  ASSERT_NE(top, std::string::npos);
  ASSERT_NE(bottom, std::string::npos);
  ASSERT_NE(budget_entry, std::string::npos);
  EXPECT_LT(top, bottom);
  EXPECT_LT(bottom, budget_entry);
}

// The number after `key="` at or after `from`.
double number_after(const std::string& svg, const std::string& key, size_t from) {
  const size_t at = svg.find(key + "=\"", from);
  return at == std::string::npos ? -1 : std::stod(svg.substr(at + key.size() + 2));
}

// The top of the frame (the y axis: the vertical line from the frame's top to
// its bottom), and where the budget line starts, in pixels from the top.
double frame_top(const std::string& svg) {
  double top = 1e9;
  for (size_t at = svg.find("<line "); at != std::string::npos; at = svg.find("<line ", at + 1)) {
    if (number_after(svg, "x1", at) == number_after(svg, "x2", at)) top = std::min(top, number_after(svg, "y1", at));
  }
  return top;
}
double budget_line_y(const std::string& svg) {
  const size_t points = svg.find("points=\"", svg.find("id=\"budget\""));
  return std::stod(svg.substr(svg.find(',', points) + 1));
}

TEST(TimelinePlot, ABudgetAtThePeakLiesBelowTheTopEdge) {
  // The demo's case: the jobs fill the 20 GiB budget exactly.
  const std::vector<TimelineSeries> full = {{"bert", {{0, 8 * kGiB}, {100 * kMs, 20 * kGiB}, {200 * kMs, 0}}}};
  const std::string svg = timeline_plot_svg(full, {{0, 20 * kGiB}}, TimelinePlotOptions{});
  EXPECT_GE(budget_line_y(svg), frame_top(svg) + 10) << "the budget line lies on the frame's top edge";
  EXPECT_LE(budget_line_y(svg), frame_top(svg) + 100) << "too much headroom";
}

// SVG text does not wrap: a subtitle longer than the image is broken into
// lines that fit (zico-demo's ran off its 1200 px), and the plot moves down.
TEST(TimelinePlot, ALongSubtitleWrapsAboveThePlot) {
  TimelinePlotOptions options;
  options.title = "zico-demo, zico: every job at once under time shift";
  options.subtitle =
      "memory each job holds from zico-umd (sampled every 10 ms), in model bytes (x 64); time in seconds of the "
      "replay, 10x slower than the model; peak 17.85 GiB, budget 20.00 GiB; makespan 11.8 s";
  const std::string svg = timeline_plot_svg(two_jobs(), {{0, 8 * kGiB}}, options);
  std::string joined;
  double last_baseline = 0;
  for (size_t at = svg.find("class=\"subtitle\""); at != std::string::npos;
       at = svg.find("class=\"subtitle\"", at + 1)) {
    const size_t tag = svg.rfind("<text", at);
    const double x = number_after(svg, "x", tag);
    last_baseline = number_after(svg, "y", tag);
    const size_t begin = svg.find('>', at) + 1;
    const std::string line = svg.substr(begin, svg.find("</text>", begin) - begin);
    EXPECT_LE(x + plot::text_width(line, 12), options.width) << "runs off the image: " << line;
    if (joined.empty()) {
      EXPECT_TRUE(line.ends_with("model;")) << "not broken between clauses: " << line;
    }
    joined += (joined.empty() ? "" : " ") + line;
  }
  EXPECT_EQ(joined, options.subtitle) << "every word, once, in order";
  EXPECT_EQ(count(svg, "class=\"subtitle\""), 2u);
  EXPECT_GE(frame_top(svg), last_baseline + 12) << "the plot overlaps the subtitle";
  // A short one stays on one line, where it always was.
  options.subtitle = "peak 6 GiB";
  const std::string short_one = timeline_plot_svg(two_jobs(), {{0, 8 * kGiB}}, options);
  EXPECT_EQ(count(short_one, "class=\"subtitle\""), 1u);
  EXPECT_EQ(frame_top(short_one), 60);
}

TEST(TimelinePlot, WithoutBudgetThereIsNoBudgetLine) {
  const std::string svg = timeline_plot_svg(two_jobs(), {}, TimelinePlotOptions{});
  EXPECT_EQ(svg.find("id=\"budget\""), std::string::npos);
  EXPECT_TRUE(svg.ends_with("</svg>\n"));
  const std::string empty = timeline_plot_svg({}, {}, TimelinePlotOptions{});
  EXPECT_TRUE(empty.ends_with("</svg>\n"));
}

TEST(TimelinePlot, StacksExactlyWhenShort) {
  const std::vector<StackSample> samples = stacked_series(two_jobs(), 2000);
  ASSERT_FALSE(samples.empty());
  uint64_t most = 0;
  for (const StackSample& s : samples) {
    ASSERT_EQ(s.bytes.size(), 2u);
    most = std::max(most, s.total());
  }
  EXPECT_EQ(most, 6 * kGiB + 1 * kGiB);
  EXPECT_EQ(samples.back().time, 1000 * kMs);
  EXPECT_EQ(samples.back().total(), 0u);
}

TEST(TimelinePlot, ReductionKeepsThePeakAndABoundedSize) {
  // 100,000 steps each, with one narrow spike in the middle of the first.
  // Names assigned from a std::string: assigning a literal here trips GCC 12's
  // -Wrestrict false positive at -O3 (GCC bug 105329).
  std::vector<TimelineSeries> series(2);
  series[0].name = std::string(1, 'a');
  series[1].name = std::string(1, 'b');
  for (uint64_t k = 0; k < 100000; ++k) {
    series[0].steps.emplace_back(k * 1000, (k % 2 == 0 ? 1 : 2) * kGiB);
    series[1].steps.emplace_back(k * 1000 + 500, (k % 3) * kGiB);
  }
  series[0].steps[50001].second = 9 * kGiB;
  uint64_t true_peak = 0;
  {
    const std::vector<StackSample> exact = stacked_series(series, SIZE_MAX);
    for (const StackSample& s : exact) true_peak = std::max(true_peak, s.total());
  }
  const std::vector<StackSample> reduced = stacked_series(series, 2000);
  EXPECT_LE(reduced.size(), 1000u);
  uint64_t most = 0;
  for (const StackSample& s : reduced) most = std::max(most, s.total());
  EXPECT_EQ(most, true_peak);
  const std::string svg = timeline_plot_svg(series, {{0, 16 * kGiB}}, TimelinePlotOptions{});
  EXPECT_LT(svg.size(), 200000u);
}

TEST(TimelinePlot, ChangesAtOneTimeInDifferentSeriesCountAsOne) {
  // At each hand-over time the second series frees X and the first (stacked
  // first, so its change sorts first) grabs it: the real total stays at
  // 8 GiB. Applying the grab before the free would show 8 + X.
  constexpr uint64_t kX = 3 * kGiB;
  for (const size_t handovers : {size_t{3}, size_t{20000}}) {
    std::vector<TimelineSeries> series(2);
    series[0].name = "grabs";
    series[1].name = "frees";
    series[0].steps.emplace_back(0, 1 * kGiB);
    series[1].steps.emplace_back(0, 1 * kGiB + kX + 3 * kGiB);
    for (uint64_t k = 1; k <= handovers; ++k) {
      const bool to_first = k % 2 == 1;
      // Irregular spacing, so bucket edges fall anywhere.
      const uint64_t t = k * 1000 * kMs / handovers + (k * 7919) % 13;
      series[0].steps.emplace_back(t, (to_first ? 1 * kGiB + kX : 1 * kGiB));
      series[1].steps.emplace_back(t, (to_first ? 1 * kGiB + 3 * kGiB : 1 * kGiB + kX + 3 * kGiB));
    }
    const uint64_t real_total = 1 * kGiB + 1 * kGiB + kX + 3 * kGiB;
    for (const size_t max_points : {SIZE_MAX, size_t{2000}, size_t{64}, size_t{4}}) {
      const std::vector<StackSample> samples = stacked_series(series, max_points);
      ASSERT_FALSE(samples.empty());
      const bool bucketed = samples.size() < 2 * handovers;
      for (const StackSample& sample : samples) {
        const uint64_t total = sample.total();
        // The state before the first step is empty; every other is the real one.
        EXPECT_TRUE(total == real_total || (total == 0 && sample.time == 0))
            << "handovers " << handovers << " max_points " << max_points << " (bucketed " << bucketed
            << ") at " << sample.time << ": " << total;
      }
      EXPECT_EQ(samples.back().total(), real_total);
    }
    const std::string svg = timeline_plot_svg(series, {{0, real_total}}, TimelinePlotOptions{});
    EXPECT_NE(svg.find("peak 8 GiB"), std::string::npos) << "handovers " << handovers;
  }
}

}  // namespace
}  // namespace zico::simulate
