#include "step_recorder.h"

#include <algorithm>

namespace zico::simulate {
namespace {

constexpr size_t kTime = 0;
constexpr size_t kTotal = 1;
constexpr size_t kValues = 2;

bool same_values(const uint64_t* a, const uint64_t* b, size_t series) {
  return std::equal(a + kValues, a + kValues + series, b + kValues);
}

}  // namespace

StackRecorder::StackRecorder(size_t series, size_t max_points)
    : series_(series),
      stride_(kValues + series),
      max_points_(std::max<size_t>(max_points, 16)),
      state_(stride_, 0),
      best_(stride_, 0),
      last_(stride_, 0) {}

void StackRecorder::record(uint64_t t, size_t series, uint64_t value) {
  if (series >= series_) return;
  if (pending_ && t != state_[kTime]) commit();
  state_[kTime] = t;
  uint64_t& slot = state_[kValues + series];
  state_[kTotal] = state_[kTotal] - slot + value;
  slot = value;
  pending_ = true;
}

void StackRecorder::commit() {
  if (!pending_) return;
  pending_ = false;
  if (width_ == 0) {
    push(state_.data());
  } else {
    add_bucketed(state_.data());
  }
  if (count() > max_points_) coarsen();
}

// Appends a moment unless it changes nothing.
void StackRecorder::push(const uint64_t* moment) {
  if (count() > 0 && same_values(row(count() - 1), moment, series_)) return;
  rows_.insert(rows_.end(), moment, moment + stride_);
}

void StackRecorder::add_bucketed(const uint64_t* moment) {
  const uint64_t b = moment[kTime] / width_;
  if (has_bucket_ && b == bucket_) {
    if (moment[kTotal] > best_[kTotal]) std::copy(moment, moment + stride_, best_.begin());
  } else {
    if (has_bucket_) close_bucket();
    bucket_ = b;
    has_bucket_ = true;
    std::copy(moment, moment + stride_, best_.begin());
  }
  std::copy(moment, moment + stride_, last_.begin());
}

// The bucket's moment of largest total, then the one it ended on.
void StackRecorder::close_bucket() {
  push(best_.data());
  if (last_[kTime] > best_[kTime]) push(last_.data());
  has_bucket_ = false;
}

void StackRecorder::coarsen() {
  if (has_bucket_) close_bucket();
  std::vector<uint64_t> old;
  old.swap(rows_);
  const size_t n = old.size() / stride_;
  const uint64_t span = n < 2 ? 1 : old[(n - 1) * stride_ + kTime] - old[kTime];
  width_ = std::max<uint64_t>({1, width_ * 2, span / (max_points_ / 4)});
  for (size_t i = 0; i < n; ++i) add_bucketed(old.data() + i * stride_);
}

std::vector<StackRecorder::Steps> StackRecorder::finish() {
  commit();
  if (has_bucket_) close_bucket();
  std::vector<Steps> out(series_);
  std::vector<uint64_t> previous(series_, 0);
  for (size_t i = 0; i < count(); ++i) {
    const uint64_t* m = row(i);
    for (size_t s = 0; s < series_; ++s) {
      if (m[kValues + s] == previous[s]) continue;
      previous[s] = m[kValues + s];
      out[s].emplace_back(m[kTime], m[kValues + s]);
    }
  }
  rows_.clear();
  std::fill(state_.begin(), state_.end(), 0);
  width_ = 0;
  return out;
}

}  // namespace zico::simulate
