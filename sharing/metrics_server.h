// MetricsServer: zico-umd's Prometheus endpoint (metrics.h) on a thread of
// its own, so that no scraper, slow, silent or hostile, ever delays a grant.
//
// The daemon's thread renders its state and publish()es it: every second, and
// on its next 50 ms tick once a scrape asked (wants_snapshot()). A request
// is answered with the first rendering published after it arrived, or after
// kFreshnessMs with the newest one there is. Each connection has kDeadlineMs
// to send its request and take the answer, and at most kMaxConnections are
// open at once (the oldest is dropped for a new one): a flood costs only the
// scrapes.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "status.h"

namespace zico::sharing {

class MetricsServer {
 public:
  static constexpr int kDeadlineMs = 2000;
  static constexpr int kFreshnessMs = 200;
  static constexpr size_t kMaxConnections = 64;

  // Listens on "IPV4:PORT" (port 0 picks one). *why says what is wrong.
  [[nodiscard]] static Status create(const std::string& address, std::unique_ptr<MetricsServer>* out,
                                     std::string* why);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  [[nodiscard]] uint16_t port() const { return port_; }
  // True when a request waits for a rendering newer than the last one.
  [[nodiscard]] bool wants_snapshot() const { return wanted_.load(std::memory_order_relaxed); }
  // The metrics as they are now (thread-safe).
  void publish(std::string body);

 private:
  MetricsServer(int listen_fd, int wake_read, int wake_write, uint16_t port);
  void run();

  const int listen_fd_;
  const int wake_read_;
  const int wake_write_;
  const uint16_t port_;
  std::atomic<bool> wanted_{false};
  std::atomic<bool> stopping_{false};
  std::mutex mutex_;       // guards the two below
  std::string body_;
  uint64_t version_ = 0;   // publications so far
  std::thread thread_;
};

}  // namespace zico::sharing
