#include "pager_thread.h"

#include <new>
#include <system_error>
#include <utility>

namespace zico::prefetch {

PagerThread::PagerThread(Driver& driver, uint32_t timeline, bool threaded) : driver_(driver), timeline_(timeline) {
  if (!threaded) return;
  try {
    thread_ = std::thread([this] { loop(); });
  } catch (const std::system_error&) {
    // No thread to be had: the calls run inline, on the poster's thread.
  }
}

PagerThread::~PagerThread() { go_inline(); }

void PagerThread::go_inline() noexcept {
  if (!thread_.joinable()) return;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  posted_.notify_one();
  thread_.join();
}

void PagerThread::run_one(const std::function<void()>& call) noexcept {
  driver_.charge_host_time_to(timeline_);
  call();
  driver_.charge_host_time_to(0);
}

uint64_t PagerThread::post(std::function<void()> call) noexcept {
  std::unique_lock lock(mutex_);
  const uint64_t ticket = ++tickets_;
  if (thread_.joinable()) {
    try {
      calls_.push_back(std::move(call));
      lock.unlock();
      posted_.notify_one();
      return ticket;
    } catch (const std::bad_alloc&) {
      // Run here, below, once the calls before it have run.
    }
  }
  // Inline: one at a time, in order (a poster on another thread waits),
  // without the lock while it runs.
  ran_.wait(lock, [&] { return done_ + 1 == ticket; });
  lock.unlock();
  run_one(call);
  lock.lock();
  done_ = ticket;
  lock.unlock();
  ran_.notify_all();
  return ticket;
}

void PagerThread::wait_for(uint64_t ticket) noexcept {
  std::unique_lock lock(mutex_);
  ran_.wait(lock, [&] { return done_ >= ticket; });
}

void PagerThread::drain() noexcept {
  std::unique_lock lock(mutex_);
  ran_.wait(lock, [&] { return done_ >= tickets_; });
}

uint64_t PagerThread::run_in_order(void (*call)(const void*), const void* context) noexcept {
  std::unique_lock lock(mutex_);
  const uint64_t ticket = ++tickets_;
  ran_.wait(lock, [&] { return done_ + 1 == ticket; });
  lock.unlock();
  driver_.charge_host_time_to(timeline_);
  call(context);
  driver_.charge_host_time_to(0);
  lock.lock();
  done_ = ticket;
  lock.unlock();
  ran_.notify_all();
  return ticket;
}

void PagerThread::loop() noexcept {
  std::unique_lock lock(mutex_);
  for (;;) {
    posted_.wait(lock, [&] { return stopping_ || !calls_.empty(); });
    if (calls_.empty()) return;  // stopping, everything run
    std::function<void()> call = std::move(calls_.front());
    calls_.pop_front();
    lock.unlock();
    run_one(call);
    lock.lock();
    ++done_;
    ran_.notify_all();
  }
}

}  // namespace zico::prefetch
