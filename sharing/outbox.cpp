#include "outbox.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "wire.h"

namespace zico::sharing {

Outbox::~Outbox() { clear(); }

Outbox::Outbox(Outbox&& other) noexcept
    : queue_(std::move(other.queue_)), queued_bytes_(std::exchange(other.queued_bytes_, 0)) {
  other.queue_.clear();
}

Outbox& Outbox::operator=(Outbox&& other) noexcept {
  if (this != &other) {
    clear();
    queue_ = std::move(other.queue_);
    queued_bytes_ = std::exchange(other.queued_bytes_, 0);
    other.queue_.clear();
  }
  return *this;
}

void Outbox::clear() {
  for (Datagram& datagram : queue_) {
    for (int fd : datagram.fds) ::close(fd);
  }
  queue_.clear();
  queued_bytes_ = 0;
}

bool Outbox::send(int socket, const proto::Message& message, std::span<const int> fds, Limits limits,
                  std::string* why) {
  Datagram datagram;
  if (!wire::encode_message(message, fds, &datagram.bytes, why)) return false;
  if (queue_.empty()) {
    if (wire::send_encoded(socket, datagram.bytes, fds, why)) return true;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return false;
  }
  if (queue_.size() >= limits.messages || queued_bytes_ + datagram.bytes.size() > limits.bytes) {
    *why = "the peer does not read what it is sent (" + std::to_string(queue_.size()) + " messages wait)";
    return false;
  }
  for (int fd : fds) {
    const int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (copy < 0) {
      for (int taken : datagram.fds) ::close(taken);
      *why = std::string("cannot keep a descriptor to send later: ") + std::strerror(errno);
      return false;
    }
    datagram.fds.push_back(copy);
  }
  queued_bytes_ += datagram.bytes.size();
  queue_.push_back(std::move(datagram));
  return true;
}

bool Outbox::flush(int socket, std::string* why) {
  while (!queue_.empty()) {
    Datagram& next = queue_.front();
    if (!wire::send_encoded(socket, next.bytes, next.fds, why)) return errno == EAGAIN || errno == EWOULDBLOCK;
    for (int fd : next.fds) ::close(fd);
    queued_bytes_ -= next.bytes.size();
    queue_.pop_front();
  }
  return true;
}

}  // namespace zico::sharing
