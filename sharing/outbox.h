// Outbox: what zico-umd has yet to send on one connection.
//
// The daemon serves every job from one thread, so it never waits for a peer
// to read. A message that the socket's buffer cannot take now waits here,
// encoded, with duplicates of its descriptors, and leaves in order when the
// socket is writable again (the daemon then watches it for EPOLLOUT). A peer
// that lets more than its Limits pile up (a client that never reads its
// replies) overflows its outbox: the daemon closes that connection, and
// nobody else waits for it; the limits also bound the daemon's memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <vector>

#include "protocol.h"

namespace zico::sharing {

class Outbox {
 public:
  struct Limits {
    size_t messages;
    size_t bytes;
  };
  // A job's largest grant is its budget's chunks at kMaxChunksPerMessage a
  // message: thousands of messages for a whole GPU, each under a kilobyte.
  static constexpr Limits kJobLimits{4096, size_t{4} << 20};
  // zico-umctl reads each answer before it asks again; a status reply is at
  // most a datagram (proto::kMaxPayload).
  static constexpr Limits kAdminLimits{16, size_t{1} << 20};

  Outbox() = default;
  ~Outbox();
  Outbox(Outbox&& other) noexcept;
  Outbox& operator=(Outbox&& other) noexcept;
  Outbox(const Outbox&) = delete;
  Outbox& operator=(const Outbox&) = delete;

  // Sends `message` with `fds` (not taken: the caller closes its own) at
  // once if nothing waits before it and the socket takes it, else queues it.
  // False with *why when it cannot be encoded, the socket failed, or the
  // outbox overflowed: the connection is of no more use.
  [[nodiscard]] bool send(int socket, const proto::Message& message, std::span<const int> fds, Limits limits,
                          std::string* why);
  // Sends what waits, as far as the socket takes it. False on a socket error.
  [[nodiscard]] bool flush(int socket, std::string* why);
  [[nodiscard]] bool empty() const { return queue_.empty(); }

 private:
  struct Datagram {
    std::vector<uint8_t> bytes;
    std::vector<int> fds;  // duplicates, owned
  };
  void clear();

  std::deque<Datagram> queue_;
  size_t queued_bytes_ = 0;
};

}  // namespace zico::sharing
