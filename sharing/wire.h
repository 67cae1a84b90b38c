// The node protocol on a Unix SOCK_SEQPACKET socket: one message per
// datagram, descriptors attached with SCM_RIGHTS (never pidfd_getfd, which
// containers refuse), peers identified with SO_PEERCRED.
#pragma once

#include <sys/types.h>

#include <span>
#include <string>
#include <vector>

#include "protocol.h"

namespace zico::wire {

// Creates, binds and listens on `path` (SOCK_SEQPACKET, non-blocking,
// close-on-exec). A stale socket file nobody listens on is replaced; a live
// one is an error ("another zico-umd is listening on PATH"). The file gets
// `mode`, and group `gid` unless gid is (gid_t)-1. Returns the fd or -1.
[[nodiscard]] int listen_unix(const std::string& path, mode_t mode, gid_t gid, std::string* why);

// Connects (close-on-exec; the socket is blocking once connected). While the
// listener's queue is full it tries again for up to timeout_ms (-1: without
// end), then fails with ETIMEDOUT. Returns the fd or -1 with *why set; errno
// is kept (ENOENT / ECONNREFUSED: no daemon).
[[nodiscard]] int connect_unix(const std::string& path, std::string* why, int timeout_ms = -1);

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};
[[nodiscard]] bool peer_credentials(int socket, PeerCredentials* out, std::string* why);

// Encodes and sends one message with `fds` attached (MSG_NOSIGNAL; blocks on
// a blocking socket, and on a non-blocking one fails with EAGAIN rather than
// sending part of it). False with *why on failure.
[[nodiscard]] bool send_message(int socket, const proto::Message& message, std::span<const int> fds,
                                std::string* why);

// The two halves of send_message, for a sender that may have to queue a
// message (zico-umd's Outbox): the checks and the encoding, then one
// sendmsg() of the bytes with `fds` attached (errno kept on failure).
[[nodiscard]] bool encode_message(const proto::Message& message, std::span<const int> fds, std::vector<uint8_t>* bytes,
                                  std::string* why);
[[nodiscard]] bool send_encoded(int socket, std::span<const uint8_t> bytes, std::span<const int> fds, std::string* why);

enum class Received {
  kMessage,     // *out holds a message, *fds the descriptors that came with it (caller owns them)
  kWouldBlock,  // non-blocking socket, nothing queued
  kClosed,      // the peer closed the connection
  kMalformed,   // bad framing or payload, too many descriptors...: *why says which; fds closed
  kError,       // recvmsg failed: *why has errno's text
};

// Receives one datagram (MSG_CMSG_CLOEXEC; truncation of data or control
// data is kMalformed).
[[nodiscard]] Received receive_message(int socket, proto::Message* out, std::vector<int>* fds, std::string* why);

}  // namespace zico::wire
