#include "sim_timeline.h"

#include <algorithm>

namespace zico {

uint64_t& SimTimeline::clock() {
  const std::thread::id self = std::this_thread::get_id();
  auto used = using_.find(self);
  uint64_t& clock = used == using_.end() ? hosts_[self] : virtual_[used->second];
  clock = std::max(clock, launch_floor_);
  return clock;
}

void SimTimeline::use(uint32_t timeline) {
  const std::thread::id self = std::this_thread::get_id();
  using_.erase(self);
  if (timeline == 0) return;
  const uint64_t now = clock();
  using_[self] = timeline;
  uint64_t& handed = virtual_[timeline];
  handed = std::max(handed, now);
}

uint64_t SimTimeline::host() { return clock(); }

void SimTimeline::wait_until(uint64_t ns) {
  uint64_t& now = clock();
  now = std::max(now, ns);
}

uint64_t SimTimeline::stream_end(uintptr_t stream) const {
  auto it = streams_.find(stream);
  return it == streams_.end() ? 0 : it->second;
}

void SimTimeline::extend_stream(uintptr_t stream, uint64_t ns) {
  uint64_t& end = streams_[stream];
  end = std::max(end, ns);
}

uint64_t SimTimeline::event_time(uintptr_t event) const {
  auto it = events_.find(event);
  return it == events_.end() ? 0 : it->second;
}

}  // namespace zico
