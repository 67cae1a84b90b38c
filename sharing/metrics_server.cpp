#include "metrics_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace zico::sharing {
namespace {

uint64_t now_ms() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

// One scraper's connection, from its request to the end of our answer.
struct Scrape {
  int fd = -1;
  uint64_t deadline_ms = 0;
  std::string request;
  bool metrics = false;       // asked for /metrics (or /)
  bool has_request = false;   // its first line is in
  uint64_t asked_version = 0; // the rendering that was current when it asked
  uint64_t asked_ms = 0;
  std::string response;       // once built: what is left to send
  size_t sent = 0;
};

std::string http_response(bool metrics, const std::string& body) {
  const std::string text = metrics ? body : "not found; try /metrics\n";
  return std::string(metrics ? "HTTP/1.0 200 OK\r\n" : "HTTP/1.0 404 Not Found\r\n") +
         "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: " + std::to_string(text.size()) +
         "\r\nConnection: close\r\n\r\n" + text;
}

}  // namespace

Status MetricsServer::create(const std::string& address, std::unique_ptr<MetricsServer>* out, std::string* why) {
  const size_t colon = address.rfind(':');
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  const std::string host = colon == std::string::npos ? "" : address.substr(0, colon);
  const std::string port = colon == std::string::npos ? "" : address.substr(colon + 1);
  char* end = nullptr;
  const unsigned long port_number = std::strtoul(port.c_str(), &end, 10);
  if (host.empty() || port.empty() || *end != '\0' || port_number > 65535 ||
      ::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    *why = "--metrics '" + address + "' is not valid; expected IPV4:PORT, e.g. 127.0.0.1:9464";
    return Status(Errc::kInvalidArgument);
  }
  addr.sin_port = htons(static_cast<uint16_t>(port_number));
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  const int one = 1;
  if (fd >= 0) (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, 64) != 0) {
    const int error = errno;
    *why = "metrics on " + address + ": " + std::strerror(error);
    if (fd >= 0) ::close(fd);
    return Status(Errc::kOsError, error);
  }
  socklen_t length = sizeof addr;
  (void)::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length);
  int wake[2];
  if (::pipe2(wake, O_NONBLOCK | O_CLOEXEC) != 0) {
    const int error = errno;
    *why = std::string("metrics: pipe: ") + std::strerror(error);
    ::close(fd);
    return Status(Errc::kOsError, error);
  }
  out->reset(new MetricsServer(fd, wake[0], wake[1], ntohs(addr.sin_port)));
  return Status::ok();
}

MetricsServer::MetricsServer(int listen_fd, int wake_read, int wake_write, uint16_t port)
    : listen_fd_(listen_fd), wake_read_(wake_read), wake_write_(wake_write), port_(port) {
  thread_ = std::thread([this] { run(); });
}

MetricsServer::~MetricsServer() {
  stopping_.store(true);
  const char byte = 1;
  (void)!::write(wake_write_, &byte, 1);
  if (thread_.joinable()) thread_.join();
  for (int fd : {listen_fd_, wake_read_, wake_write_}) ::close(fd);
}

void MetricsServer::publish(std::string body) {
  {
    std::lock_guard lock(mutex_);
    body_ = std::move(body);
    ++version_;
    wanted_.store(false, std::memory_order_relaxed);  // under the lock: a request flagged after this waits for the next
  }
  const char byte = 1;
  (void)!::write(wake_write_, &byte, 1);
}

void MetricsServer::run() {
  std::vector<Scrape> scrapes;
  std::vector<pollfd> polls;
  while (!stopping_.load()) {
    const uint64_t now = now_ms();
    uint64_t version = 0;
    {
      std::lock_guard lock(mutex_);
      version = version_;
    }
    // Answer the requests whose rendering has come, or waited long enough.
    for (Scrape& scrape : scrapes) {
      if (!scrape.has_request || !scrape.response.empty()) continue;
      if (scrape.metrics && version == scrape.asked_version && now < scrape.asked_ms + kFreshnessMs) continue;
      std::lock_guard lock(mutex_);
      scrape.response = http_response(scrape.metrics, body_);
    }
    // Drop what is done, failed or late.
    std::erase_if(scrapes, [&](const Scrape& scrape) {
      const bool done = !scrape.response.empty() && scrape.sent == scrape.response.size();
      if (done || scrape.fd < 0 || now >= scrape.deadline_ms) {
        if (scrape.fd >= 0) ::close(scrape.fd);
        return true;
      }
      return false;
    });
    polls.clear();
    polls.push_back({wake_read_, POLLIN, 0});
    polls.push_back({listen_fd_, POLLIN, 0});
    uint64_t wake_at = now + 1000;
    for (const Scrape& scrape : scrapes) {
      const bool writing = !scrape.response.empty();
      polls.push_back({scrape.fd, static_cast<short>(writing ? POLLOUT : (scrape.has_request ? 0 : POLLIN)), 0});
      wake_at = std::min(wake_at, scrape.deadline_ms);
      if (scrape.has_request && !writing) wake_at = std::min(wake_at, scrape.asked_ms + kFreshnessMs);
    }
    (void)::poll(polls.data(), polls.size(), static_cast<int>(wake_at > now ? wake_at - now : 0) + 1);
    if ((polls[0].revents & POLLIN) != 0) {
      char drain[64];
      while (::read(wake_read_, drain, sizeof drain) > 0) {
      }
    }
    for (size_t i = 0; i < scrapes.size(); ++i) {
      Scrape& scrape = scrapes[i];
      const short revents = polls[i + 2].revents;
      if (revents == 0) continue;
      if (!scrape.response.empty()) {
        const ssize_t n = ::send(scrape.fd, scrape.response.data() + scrape.sent, scrape.response.size() - scrape.sent,
                                 MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
          scrape.sent += static_cast<size_t>(n);
        } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
          ::close(scrape.fd);
          scrape.fd = -1;
        }
        continue;
      }
      char buffer[1024];
      const ssize_t n = ::recv(scrape.fd, buffer, sizeof buffer, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        ::close(scrape.fd);
        scrape.fd = -1;
        continue;
      }
      if (n > 0) scrape.request.append(buffer, static_cast<size_t>(n));
      // Only the request line matters; a scraper that sends more than a
      // request's worth before it gets to one is not a scraper.
      if (scrape.request.find('\n') != std::string::npos || scrape.request.size() >= 4096) {
        scrape.has_request = true;
        scrape.metrics = scrape.request.starts_with("GET /metrics ") || scrape.request.starts_with("GET / ");
        scrape.asked_ms = now_ms();
        std::lock_guard lock(mutex_);
        scrape.asked_version = version_;  // a rendering published from now on is newer than the request
        if (scrape.metrics) wanted_.store(true, std::memory_order_relaxed);
      }
    }
    if ((polls[1].revents & POLLIN) != 0) {
      for (;;) {
        const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        if (scrapes.size() >= kMaxConnections) {
          ::close(scrapes.front().fd);
          scrapes.erase(scrapes.begin());
        }
        Scrape scrape;
        scrape.fd = fd;
        scrape.deadline_ms = now_ms() + kDeadlineMs;
        scrapes.push_back(std::move(scrape));
      }
    }
  }
  for (const Scrape& scrape : scrapes) {
    if (scrape.fd >= 0) ::close(scrape.fd);
  }
}

}  // namespace zico::sharing
