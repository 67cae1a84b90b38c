// Memory plots: live bytes of a trace over time, by category, as an SVG.
//
// The plot is a stacked area of the bytes each category holds live (param at
// the bottom, then grad, optim, act, temp, input, other), against trace time
// in milliseconds, with iteration starts as dashed lines and an optional
// budget line. Colours are Okabe and Ito's colour-blind-safe palette. The SVG
// stands alone: no scripts, no external fonts, stylesheets or links, so it can
// be attached to a report or opened from disk; all text is XML-escaped.
//
// Long traces are reduced to at most `max_points` x positions per area
// boundary: time is cut into equal buckets and each bucket is drawn as the
// moment of its largest total, with that moment's split by category. The peak
// survives the reduction, and every stack drawn is a state the trace had.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "trace.h"

namespace zico::replay {

inline constexpr size_t kCategoryCount = static_cast<size_t>(trace::Category::kCount);

struct PlotOptions {
  std::string title;          // empty: meta "model", else the trace's file name
  uint64_t budget_bytes = 0;  // a horizontal line at this many bytes; 0: none
  int width = 1200;           // pixels, the whole image
  int height = 600;
  size_t max_points = 2000;   // x positions per area boundary at most (at least 4)
};

// Live bytes by category from `time` on, until the next sample.
struct LiveSample {
  uint64_t time = 0;  // ns, as in the trace
  std::array<uint64_t, kCategoryCount> bytes{};
  [[nodiscard]] uint64_t total() const;
};

// The step function the plot draws, at most max(max_points, 4) / 2 samples
// (each is drawn as two vertices): nothing live at the first event's time,
// then the state after every allocation and free; or, for longer traces, one
// sample per equal time bucket, the bucket's largest total held over it. Ends
// with the final state at the last event's time. Empty for a trace without
// events; one whose events all share a time is never bucketed.
[[nodiscard]] std::vector<LiveSample> live_bytes_series(const trace::Trace& trace, size_t max_points);

[[nodiscard]] std::string memory_plot_svg(const trace::Trace& trace, const PlotOptions& options);

}  // namespace zico::replay
