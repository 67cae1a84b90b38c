#include "sim_timeline.h"

#include <algorithm>

namespace zico {

uint64_t& SimTimeline::clock() {
  uint64_t& clock = hosts_[std::this_thread::get_id()];
  clock = std::max(clock, launch_floor_);
  return clock;
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
