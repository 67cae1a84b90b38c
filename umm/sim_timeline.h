// SimTimeline: when things happen on SimDriver's modelled clock.
//
// A real GPU overlaps three kinds of time, and a pager is fast or slow by how
// it arranges them: the host threads that call the driver (each call costs
// the caller host time, and some calls make it wait for the GPU), the streams
// (each runs its work in order, and an event wait orders one behind another)
// and the engines (one compute engine, one copy engine each way, shared by
// every stream). SimTimeline keeps the first two: a clock per host thread and
// the time each stream's queued work ends; the engines' clocks are kept by
// the work that uses them (sim_managed.h).
//
// Host threads: a thread's clock never lags the last kernel launch's host
// time. Work a helper thread issues (a pager's) was handed to it by the
// launching thread, so it cannot be issued before the launch that asked for
// it, and a thread that slept (waited for work) resumes at the present.
// A thread may also run such work itself, charged to a timeline of its own
// (use()): the helper thread modelled, deterministically.
//
// Not thread-safe: SimDriver calls it under its own mutex.
#pragma once

#include <cstdint>
#include <thread>
#include <unordered_map>

namespace zico {

class SimTimeline {
 public:
  // Charges the calling thread's calls from now on to virtual timeline
  // `timeline` (nonzero), which is handed the work now: it starts no earlier
  // than the thread's own clock. 0: the thread's own clock again.
  void use(uint32_t timeline);
  // The calling thread's host clock (ns), brought up to the last launch.
  [[nodiscard]] uint64_t host();
  // The calling thread spent `ns` in a driver call.
  void spend(uint64_t ns) { clock() += ns; }
  // The calling thread waited in a call until `ns` (no earlier than now).
  void wait_until(uint64_t ns);
  // A kernel was launched from the calling thread at its clock now.
  void launched() { launch_floor_ = host(); }

  // When the work queued on `stream` so far ends (0: idle from the start).
  [[nodiscard]] uint64_t stream_end(uintptr_t stream) const;
  // Work ending at `ns` was queued on `stream`.
  void extend_stream(uintptr_t stream, uint64_t ns);
  // The earliest the next op on `stream` can start, issued by the calling
  // thread now.
  [[nodiscard]] uint64_t stream_start(uintptr_t stream) {
    const uint64_t issued = host();
    const uint64_t end = stream_end(stream);
    return issued > end ? issued : end;
  }

  // An event recorded on `stream` now completes when the stream's work up
  // to it does; a stream that waits for it starts nothing before that.
  void record(uintptr_t event, uintptr_t stream) { events_[event] = stream_start(stream); }
  [[nodiscard]] uint64_t event_time(uintptr_t event) const;
  void wait(uintptr_t stream, uintptr_t event) { extend_stream(stream, event_time(event)); }
  void forget_event(uintptr_t event) { events_.erase(event); }
  void forget_stream(uintptr_t stream) { streams_.erase(stream); }

 private:
  uint64_t& clock();

  std::unordered_map<std::thread::id, uint64_t> hosts_;
  std::unordered_map<std::thread::id, uint32_t> using_;  // threads charging a virtual timeline
  std::unordered_map<uint32_t, uint64_t> virtual_;
  std::unordered_map<uintptr_t, uint64_t> streams_;
  std::unordered_map<uintptr_t, uint64_t> events_;
  uint64_t launch_floor_ = 0;
};

}  // namespace zico
