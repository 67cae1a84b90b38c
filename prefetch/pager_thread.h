// PagerThread: runs a pager's driver calls in the order they are posted, on
// a thread of its own, so that a call that blocks holds up that thread and
// not the one that launches kernels. (A move to the host is such a call: the
// UVM driver returns only after the copy and the CPU's page tables.)
//
// Or inline: each call runs at once on the thread that posts it. The
// simulated backend runs so, which keeps its modelled clock deterministic;
// either way the driver is told whose host time the calls take
// (Driver::charge_host_time_to), so the simulated backend charges them to
// the pager thread's timeline and not to the launching thread's.
//
// Calls must not throw; they run without the pager's lock nor this class's
// (a call may wait for another PagerThread's calls, and those for this
// one's), and whatever they share with the poster is theirs (atomics, or
// handles copied in).
//
// Thread-safe, with one poster at a time (the pager posts under its lock).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <new>
#include <thread>

#include "driver.h"

namespace zico::prefetch {

class PagerThread {
 public:
  // `timeline`: nonzero, the driver's name for this thread's host time.
  PagerThread(Driver& driver, uint32_t timeline, bool threaded);
  // Runs what was posted, then ends the thread.
  ~PagerThread();
  PagerThread(const PagerThread&) = delete;
  PagerThread& operator=(const PagerThread&) = delete;

  // Queues `call` and returns its ticket (1, 2, ...); inline, or where no
  // memory is left to queue it, runs it first.
  uint64_t post(std::function<void()> call) noexcept;
  // post(), or where no memory is left even for the call itself, runs it
  // here once every call posted before it has run.
  template <typename Call>
  uint64_t post_or_run(const Call& call) noexcept {
    try {
      return post(std::function<void()>(call));
    } catch (const std::bad_alloc&) {
      return run_in_order([](const void* c) { (*static_cast<const Call*>(c))(); }, &call);
    }
  }
  // Returns once the call of `ticket` (and every one before it) has run.
  void wait_for(uint64_t ticket) noexcept;
  // Returns once every call posted so far has run.
  void drain() noexcept;
  // Runs what was posted, ends the thread; later calls run inline. For
  // process exit: nothing of the pager's runs on its own beside the
  // driver's teardown.
  void go_inline() noexcept;
  // Whether calls run on a thread of their own.
  [[nodiscard]] bool threaded() const noexcept { return thread_.joinable(); }

 private:
  uint64_t run_in_order(void (*call)(const void*), const void* context) noexcept;
  void run_one(const std::function<void()>& call) noexcept;
  void loop() noexcept;

  Driver& driver_;
  const uint32_t timeline_;
  std::mutex mutex_;
  std::condition_variable posted_;
  std::condition_variable ran_;
  std::deque<std::function<void()>> calls_;
  uint64_t tickets_ = 0;  // calls posted
  uint64_t done_ = 0;     // calls run
  bool stopping_ = false;
  std::thread thread_;    // not joinable when inline
};

}  // namespace zico::prefetch
