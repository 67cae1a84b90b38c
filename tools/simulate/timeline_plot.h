// Timeline plots: the memory several jobs hold over time, stacked, against a
// budget that may change, as a standalone SVG. The simulator plots its
// virtual jobs with it; the demo plots real processes.
//
// Each series is a step function of (time ns, bytes held from then on),
// starting from 0 before its first step; the series stack in the order given
// (the first at the bottom), one colour each from Okabe and Ito's
// colour-blind-safe palette (repeating after seven). The budget is a black
// step line. Axes are seconds (from the earliest time given) and GiB. As in
// memory_plot.h: no scripts or external references, all text XML-escaped,
// and long timelines reduced to at most `max_points` x positions: time is cut
// into equal buckets, each drawn as the moment of its largest total with
// that moment's split, so the peak survives and every stack drawn is a state
// the jobs were in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace zico::simulate {

using TimeSteps = std::vector<std::pair<uint64_t /*ns*/, uint64_t /*bytes*/>>;

struct TimelineSeries {
  std::string name;
  TimeSteps steps;  // times not decreasing
};

struct TimelinePlotOptions {
  std::string title;
  std::string subtitle;  // empty: the peak, when, and the budget's range
  int width = 1200;      // pixels, the whole image
  int height = 600;
  size_t max_points = 2000;  // x positions per area boundary at most (at least 4)
};

// Every series' bytes from `time` on, until the next sample.
struct StackSample {
  uint64_t time = 0;
  std::vector<uint64_t> bytes;  // one per series
  [[nodiscard]] uint64_t total() const;
};

// The stacked step function the plot draws, at most max(max_points, 4) / 2
// samples (each is drawn as two vertices): the state at the earliest time,
// then after every change; or, for longer timelines, one sample per equal
// time bucket, the bucket's largest total held over it. Changes of several
// series at one time count as one: the order between them is not known, so
// no state between them is shown (a free and the grant it made possible
// would otherwise add up). Ends with the final state at the latest time.
// Empty when no series has a step.
[[nodiscard]] std::vector<StackSample> stacked_series(const std::vector<TimelineSeries>& series, size_t max_points);

[[nodiscard]] std::string timeline_plot_svg(const std::vector<TimelineSeries>& series, const TimeSteps& budget,
                                            const TimelinePlotOptions& options);

}  // namespace zico::simulate
