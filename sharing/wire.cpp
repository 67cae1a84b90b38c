// The node protocol on Unix SOCK_SEQPACKET sockets (wire.h).
//
// SEQPACKET keeps message boundaries and is connection-oriented: one
// sendmsg() is one whole message with its descriptors, a peer that goes away
// is seen as end-of-file, and SO_PEERCRED names who is on the other end.
// Descriptors are the scarce resource here (a leaked chunk fd pins GPU
// memory), so every path out of receive_message() either hands them to the
// caller or closes them.
#include "wire.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

namespace zico::wire {
namespace {

constexpr int kBacklog = 128;
// Room for the most descriptors a message may carry; more is MSG_CTRUNC.
constexpr size_t kControlBytes = CMSG_SPACE(sizeof(int) * proto::kMaxChunksPerMessage);

bool fail(std::string* why, std::string reason) {
  if (why != nullptr) *why = std::move(reason);
  return false;
}

std::string errno_text(int error) { return std::strerror(error); }

// Closes `fd` without disturbing errno, which callers report afterwards.
void close_keep_errno(int fd) {
  const int saved = errno;
  ::close(fd);
  errno = saved;
}

void close_all(std::vector<int>* fds) {
  for (int fd : *fds) ::close(fd);
  fds->clear();
}

bool make_address(const std::string& path, sockaddr_un* address, std::string* why) {
  *address = {};
  address->sun_family = AF_UNIX;
  // Filesystem sockets only, NUL-terminated: the path must leave room for the NUL.
  if (path.empty()) return fail(why, "socket path is empty");
  if (path.size() >= sizeof(address->sun_path)) {
    return fail(why, "socket path " + path + " is " + std::to_string(path.size()) + " bytes long (at most " +
                         std::to_string(sizeof(address->sun_path) - 1) + ")");
  }
  if (path.find('\0') != std::string::npos) return fail(why, "socket path " + path + " contains a NUL byte");
  std::memcpy(address->sun_path, path.data(), path.size());
  return true;
}

int connect_to(int fd, const sockaddr_un& address) {
  int rc;
  do {
    rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address));
  } while (rc != 0 && errno == EINTR);
  return rc;
}

// Whether a daemon is accepting on `address`. A socket file whose listener
// died refuses the connection (ECONNREFUSED): that one may be replaced. The
// probe is non-blocking so a listener with a full backlog (EAGAIN) counts as
// alive instead of blocking us.
enum class Probe { kLive, kStale, kError };
Probe probe(const sockaddr_un& address, int* error) {
  const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *error = errno;
    return Probe::kError;
  }
  const int rc = connect_to(fd, address);
  const int saved = errno;
  ::close(fd);
  if (rc == 0 || saved == EAGAIN || saved == EINPROGRESS) return Probe::kLive;
  if (saved == ECONNREFUSED) return Probe::kStale;
  *error = saved;
  return Probe::kError;
}

}  // namespace

int listen_unix(const std::string& path, mode_t mode, gid_t gid, std::string* why) {
  sockaddr_un address;
  if (!make_address(path, &address, why)) return -1;

  struct stat existing;
  if (::lstat(path.c_str(), &existing) == 0) {
    // Never unlink something that is not a socket: a typo in the path must
    // not delete a user's file.
    if (!S_ISSOCK(existing.st_mode)) {
      fail(why, path + " exists and is not a socket; refusing to replace it");
      return -1;
    }
    int error = 0;
    switch (probe(address, &error)) {
      case Probe::kLive:
        fail(why, "another zico-umd is listening on " + path);
        return -1;
      case Probe::kError:
        fail(why, "cannot probe existing socket " + path + ": " + errno_text(error));
        return -1;
      case Probe::kStale:
        if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
          fail(why, "cannot remove stale socket " + path + ": " + errno_text(errno));
          return -1;
        }
        break;
    }
  }

  const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    fail(why, "socket(AF_UNIX, SOCK_SEQPACKET): " + errno_text(errno));
    return -1;
  }
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    fail(why, "cannot bind " + path + ": " + errno_text(errno));
    close_keep_errno(fd);
    return -1;
  }
  // From here on the file is ours: remove it again if we cannot finish.
  auto give_up = [&](const std::string& reason) {
    fail(why, reason + ": " + errno_text(errno));
    close_keep_errno(fd);
    const int saved = errno;
    ::unlink(path.c_str());
    errno = saved;
    return -1;
  };
  if (::chmod(path.c_str(), mode) != 0) return give_up("cannot chmod " + path);
  if (gid != static_cast<gid_t>(-1) && ::chown(path.c_str(), static_cast<uid_t>(-1), gid) != 0) {
    return give_up("cannot chown " + path + " to group " + std::to_string(gid));
  }
  if (::listen(fd, kBacklog) != 0) return give_up("cannot listen on " + path);
  return fd;
}

int connect_unix(const std::string& path, std::string* why, int timeout_ms) {
  sockaddr_un address;
  if (!make_address(path, &address, why)) {
    errno = EINVAL;
    return -1;
  }
  // Non-blocking while connecting: a listener whose backlog is full answers
  // EAGAIN at once instead of holding us in connect() for as long as it lasts.
  const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    fail(why, "socket(AF_UNIX, SOCK_SEQPACKET): " + errno_text(errno));
    return -1;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (connect_to(fd, address) != 0) {
    int error = errno;
    if (error == EAGAIN && (timeout_ms < 0 || std::chrono::steady_clock::now() < deadline)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    // The caller tells "no daemon" (ENOENT, ECONNREFUSED) from real failures by errno.
    if (error == EAGAIN) {
      error = ETIMEDOUT;
      fail(why, "cannot connect to " + path + ": its queue of connections stayed full for " +
                    std::to_string(timeout_ms) + " ms");
    } else {
      fail(why, "cannot connect to " + path + ": " + errno_text(error));
    }
    ::close(fd);
    errno = error;
    return -1;
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    fail(why, "fcntl on the socket to " + path + ": " + errno_text(errno));
    close_keep_errno(fd);
    return -1;
  }
  return fd;
}

bool peer_credentials(int socket, PeerCredentials* out, std::string* why) {
  ucred credentials{};
  socklen_t length = sizeof(credentials);
  if (::getsockopt(socket, SOL_SOCKET, SO_PEERCRED, &credentials, &length) != 0) {
    return fail(why, "getsockopt(SO_PEERCRED) on fd " + std::to_string(socket) + ": " + errno_text(errno));
  }
  if (length != sizeof(credentials)) {
    return fail(why, "getsockopt(SO_PEERCRED) returned " + std::to_string(length) + " bytes (expected " +
                         std::to_string(sizeof(credentials)) + ")");
  }
  out->pid = credentials.pid;
  out->uid = credentials.uid;
  out->gid = credentials.gid;
  return true;
}

bool encode_message(const proto::Message& message, std::span<const int> fds, std::vector<uint8_t>* bytes,
                    std::string* why) {
  const proto::Type type = proto::type_of(message);
  // Refuse here what the peer's decoder would refuse: only a Grant carries
  // descriptors, one per chunk id.
  const auto* grant = std::get_if<proto::Grant>(&message);
  const size_t expected = grant != nullptr ? grant->ids.size() : 0;
  if (fds.size() > proto::kMaxChunksPerMessage) {
    return fail(why, std::string(proto::to_string(type)) + ": " + std::to_string(fds.size()) +
                         " descriptors (at most " + std::to_string(proto::kMaxChunksPerMessage) + ")");
  }
  if (grant != nullptr && fds.size() != expected) {
    return fail(why, "Grant: " + std::to_string(fds.size()) + " descriptors for " + std::to_string(expected) +
                         " chunk ids");
  }
  if (grant == nullptr && !fds.empty()) {
    return fail(why, std::string(proto::to_string(type)) + ": " + std::to_string(fds.size()) +
                         " descriptors attached (only Grant carries descriptors)");
  }
  return proto::encode(message, bytes, why);
}

bool send_encoded(int socket, std::span<const uint8_t> bytes, std::span<const int> fds, std::string* why) {
  iovec iov{const_cast<uint8_t*>(bytes.data()), bytes.size()};
  msghdr header{};
  header.msg_iov = &iov;
  header.msg_iovlen = 1;
  alignas(cmsghdr) unsigned char control[kControlBytes];
  if (fds.size() > proto::kMaxChunksPerMessage) {
    errno = EINVAL;
    return fail(why, std::to_string(fds.size()) + " descriptors in one message (at most " +
                         std::to_string(proto::kMaxChunksPerMessage) + ")");
  }
  if (!fds.empty()) {
    const size_t fd_bytes = sizeof(int) * fds.size();
    std::memset(control, 0, sizeof(control));
    header.msg_control = control;
    header.msg_controllen = CMSG_SPACE(fd_bytes);
    cmsghdr* cmsg = CMSG_FIRSTHDR(&header);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(fd_bytes);
    std::memcpy(CMSG_DATA(cmsg), fds.data(), fd_bytes);
  }
  ssize_t sent;
  do {
    sent = ::sendmsg(socket, &header, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  if (sent < 0) return fail(why, errno_text(errno));
  // SEQPACKET sends all or nothing; a short count would mean a kernel we do not understand.
  if (static_cast<size_t>(sent) != bytes.size()) {
    errno = EIO;
    return fail(why, "sent " + std::to_string(sent) + " of " + std::to_string(bytes.size()) + " bytes");
  }
  return true;
}

bool send_message(int socket, const proto::Message& message, std::span<const int> fds, std::string* why) {
  std::vector<uint8_t> bytes;
  if (!encode_message(message, fds, &bytes, why)) return false;
  if (send_encoded(socket, bytes, fds, why)) return true;
  const int error = errno;
  if (why != nullptr) *why = std::string("sending ") + proto::to_string(proto::type_of(message)) + ": " + *why;
  errno = error;
  return false;
}

Received receive_message(int socket, proto::Message* out, std::vector<int>* fds, std::string* why) {
  fds->clear();
  constexpr size_t kBufferBytes = proto::kHeaderBytes + proto::kMaxPayload;
  // On the heap: 60 KiB is too much for the stack of an arbitrary caller thread.
  const auto buffer = std::make_unique_for_overwrite<uint8_t[]>(kBufferBytes);
  alignas(cmsghdr) unsigned char control[kControlBytes];

  iovec iov{buffer.get(), kBufferBytes};
  msghdr header{};
  ssize_t received;
  do {
    header = {};
    header.msg_iov = &iov;
    header.msg_iovlen = 1;
    header.msg_control = control;
    header.msg_controllen = sizeof(control);
    received = ::recvmsg(socket, &header, MSG_CMSG_CLOEXEC);
  } while (received < 0 && errno == EINTR);
  if (received < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return Received::kWouldBlock;
    fail(why, "recvmsg on fd " + std::to_string(socket) + ": " + errno_text(errno));
    return Received::kError;
  }

  // Take every descriptor first, whatever else is wrong, so none can leak.
  for (cmsghdr* cmsg = CMSG_FIRSTHDR(&header); cmsg != nullptr; cmsg = CMSG_NXTHDR(&header, cmsg)) {
    if (cmsg->cmsg_level != SOL_SOCKET || cmsg->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (cmsg->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    const unsigned char* data = CMSG_DATA(cmsg);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, data + i * sizeof(int), sizeof(int));
      fds->push_back(fd);
    }
  }

  if (received == 0) {
    // End of file (our peers never send empty datagrams).
    close_all(fds);
    return Received::kClosed;
  }
  if ((header.msg_flags & MSG_TRUNC) != 0) {
    close_all(fds);
    fail(why, "datagram larger than " + std::to_string(kBufferBytes) + " bytes (header + kMaxPayload)");
    return Received::kMalformed;
  }
  if ((header.msg_flags & MSG_CTRUNC) != 0) {
    close_all(fds);
    fail(why, "more than " + std::to_string(proto::kMaxChunksPerMessage) +
                  " descriptors (or other control data) attached; control data truncated");
    return Received::kMalformed;
  }
  const std::span<const uint8_t> datagram(buffer.get(), static_cast<size_t>(received));
  if (!proto::decode(datagram, fds->size(), out, why)) {
    close_all(fds);
    return Received::kMalformed;
  }
  return Received::kMessage;
}

}  // namespace zico::wire
