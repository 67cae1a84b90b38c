// StackRecorder: several step functions over one time axis (what each job
// holds), kept to a bounded number of moments, for timelines of runs of any
// length that are drawn stacked.
//
// A moment is a time and every series' value from then on. Records at one
// time count as one change: the moment is the state after all of them (the
// order of changes made at one virtual time is not a state anyone was in).
//
// Exact until it holds `max_points` moments. Then time is cut into buckets,
// each kept as at most two moments, both states the series really were in,
// at their own times: the one of largest total within the bucket, and the
// one it ended on (when later and different). So the stack never shows a
// total, or a split of it, that did not happen (reducing each series on its
// own would stack maxima of different moments: spikes above the budget that
// never existed), and the total's peak survives. A single series' own peak
// may fall between the moments kept; keep it separately. Each time the
// moments fill up again the bucket width at least doubles and the kept
// moments are folded into the wider buckets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace zico::simulate {

class StackRecorder {
 public:
  using Steps = std::vector<std::pair<uint64_t, uint64_t>>;

  // `series` step functions, each 0 until its first record.
  StackRecorder(size_t series, size_t max_points);

  // Times must not decrease.
  void record(uint64_t t, size_t series, uint64_t value);
  // Per series, its steps (time, value from then on): the moments at which
  // its value changed, starting at its first non-zero value. The recorder is
  // empty afterwards.
  [[nodiscard]] std::vector<Steps> finish();

  // Moments kept so far (the pending one aside).
  [[nodiscard]] size_t moments() const { return count(); }

 private:
  // A moment: a time, the total and every series' value, as one row of
  // `stride_` numbers in `rows_`.
  [[nodiscard]] size_t count() const { return rows_.size() / stride_; }
  [[nodiscard]] const uint64_t* row(size_t i) const { return rows_.data() + i * stride_; }
  void commit();  // the pending state becomes a moment
  void push(const uint64_t* moment);
  void add_bucketed(const uint64_t* moment);
  void close_bucket();
  void coarsen();

  size_t series_;
  size_t stride_;  // 2 + series_
  size_t max_points_;
  std::vector<uint64_t> state_;  // a row: time, total, values
  bool pending_ = false;
  std::vector<uint64_t> rows_;
  uint64_t width_ = 0;  // 0: exact
  bool has_bucket_ = false;
  uint64_t bucket_ = 0;
  std::vector<uint64_t> best_;  // rows, of the open bucket
  std::vector<uint64_t> last_;
};

}  // namespace zico::simulate
