// The node protocol's socket layer: messages and descriptors cross a Unix
// socket without being lost or leaked; listening sockets are made safely.
#include "protocol.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "protocol_test_support.h"
#include "wire.h"

namespace zico::testing {
namespace {

// --- the socket layer ------------------------------------------------------------------

size_t open_fd_count() {
  size_t count = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) ++count;
  return count;
}

int make_memfd(const char* name, size_t bytes) {
  const int fd = memfd_create(name, MFD_CLOEXEC);
  EXPECT_GE(fd, 0) << strerror(errno);
  EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
  return fd;
}

// Sends raw bytes with `fds` attached, bypassing the encoder.
void send_raw(int socket, const std::vector<uint8_t>& bytes, const std::vector<int>& fds) {
  iovec iov{const_cast<uint8_t*>(bytes.data()), bytes.size()};
  msghdr header{};
  header.msg_iov = &iov;
  header.msg_iovlen = 1;
  std::vector<unsigned char> control(CMSG_SPACE(sizeof(int) * fds.size()));
  if (!fds.empty()) {
    header.msg_control = control.data();
    header.msg_controllen = control.size();
    cmsghdr* cmsg = CMSG_FIRSTHDR(&header);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(cmsg), fds.data(), sizeof(int) * fds.size());
  }
  ASSERT_EQ(sendmsg(socket, &header, MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size())) << strerror(errno);
}

class WireTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair_), 0) << strerror(errno);
    const int flags = fcntl(pair_[0], F_GETFL);
    ASSERT_EQ(fcntl(pair_[0], F_SETFL, flags | O_NONBLOCK), 0);
  }
  void TearDown() override {
    for (int& fd : pair_) {
      if (fd >= 0) close(fd);
      fd = -1;
    }
  }

  // Receives on the non-blocking end; the message must be there already.
  wire::Received receive(Message* out, std::vector<int>* fds, std::string* why) {
    return wire::receive_message(pair_[0], out, fds, why);
  }

  int pair_[2] = {-1, -1};  // [0]: non-blocking receiver, [1]: blocking sender
};

TEST_F(WireTest, GrantCarriesItsDescriptors) {
  const size_t before = open_fd_count();
  std::vector<int> sent;
  for (int i = 0; i < 3; ++i) sent.push_back(make_memfd("zico-grant", 4096 * static_cast<size_t>(i + 1)));
  std::string why;
  ASSERT_TRUE(wire::send_message(pair_[1], Grant{9, 1, true, {101, 102, 103}}, sent, &why)) << why;

  Message message;
  std::vector<int> received = {-5};  // stale content is replaced
  ASSERT_EQ(receive(&message, &received, &why), wire::Received::kMessage) << why;
  const auto* grant = std::get_if<Grant>(&message);
  ASSERT_NE(grant, nullptr);
  EXPECT_EQ(grant->ids, (std::vector<uint32_t>{101, 102, 103}));
  ASSERT_EQ(received.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    struct stat a;
    struct stat b;
    ASSERT_EQ(fstat(sent[i], &a), 0);
    ASSERT_EQ(fstat(received[i], &b), 0);
    EXPECT_NE(sent[i], received[i]);
    EXPECT_EQ(a.st_ino, b.st_ino);
    EXPECT_EQ(a.st_dev, b.st_dev);
    EXPECT_EQ(b.st_size, static_cast<off_t>(4096 * (i + 1)));
    EXPECT_EQ(fcntl(received[i], F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  }
  for (int fd : sent) close(fd);
  for (int fd : received) close(fd);
  EXPECT_EQ(open_fd_count(), before);
}

TEST_F(WireTest, EveryMessageCrossesTheSocket) {
  for (const Message& original : samples()) {
    SCOPED_TRACE(to_string(type_of(original)));
    std::vector<int> fds;
    for (size_t i = 0; i < fds_for(original); ++i) fds.push_back(make_memfd("zico-sample", 0));
    std::string why;
    ASSERT_TRUE(wire::send_message(pair_[1], original, fds, &why)) << why;
    Message message;
    std::vector<int> received;
    ASSERT_EQ(receive(&message, &received, &why), wire::Received::kMessage) << why;
    EXPECT_TRUE(message == original);
    EXPECT_EQ(received.size(), fds.size());
    for (int fd : fds) close(fd);
    for (int fd : received) close(fd);
  }
}

TEST_F(WireTest, SendRefusesDescriptorsTheDecoderWould) {
  const int fd = make_memfd("zico-extra", 0);
  const int fds[2] = {fd, fd};
  std::string why;
  EXPECT_FALSE(wire::send_message(pair_[1], Hello{1, "x"}, std::span<const int>(fds, 1), &why));
  EXPECT_EQ(why, "Hello: 1 descriptors attached (only Grant carries descriptors)");
  EXPECT_FALSE(wire::send_message(pair_[1], Grant{1, 0, true, {1}}, fds, &why));
  EXPECT_EQ(why, "Grant: 2 descriptors for 1 chunk ids");
  EXPECT_FALSE(wire::send_message(pair_[1], Request{0, 0, 1}, {}, &why));
  EXPECT_EQ(why, "Request.request_id is 0 (must be != 0)");
  close(fd);
  Message message;
  std::vector<int> received;
  EXPECT_EQ(receive(&message, &received, &why), wire::Received::kWouldBlock);  // nothing went out
}

TEST_F(WireTest, ClosedPeer) {
  close(pair_[1]);
  pair_[1] = -1;
  Message message;
  std::vector<int> fds;
  std::string why;
  EXPECT_EQ(receive(&message, &fds, &why), wire::Received::kClosed);
  EXPECT_TRUE(fds.empty());
}

TEST_F(WireTest, NothingQueued) {
  Message message;
  std::vector<int> fds;
  std::string why;
  EXPECT_EQ(receive(&message, &fds, &why), wire::Received::kWouldBlock);
}

TEST_F(WireTest, BadFileDescriptorIsAnError) {
  Message message;
  std::vector<int> fds;
  std::string why;
  EXPECT_EQ(wire::receive_message(-1, &message, &fds, &why), wire::Received::kError);
  EXPECT_NE(why.find("recvmsg"), std::string::npos);
  EXPECT_FALSE(wire::send_message(-1, Welcome{1}, {}, &why));
}

TEST_F(WireTest, GarbageIsMalformedAndLeaksNothing) {
  const size_t before = open_fd_count();
  const int memfd = make_memfd("zico-garbage", 0);
  send_raw(pair_[1], {'g', 'a', 'r', 'b', 'a', 'g', 'e'}, {memfd, memfd});
  close(memfd);
  Message message;
  std::vector<int> fds;
  std::string why;
  EXPECT_EQ(receive(&message, &fds, &why), wire::Received::kMalformed);
  EXPECT_EQ(why, "datagram of 7 bytes is shorter than the 16-byte header");
  EXPECT_TRUE(fds.empty());
  EXPECT_EQ(open_fd_count(), before);
}

TEST_F(WireTest, DescriptorsOnTheWrongMessageAreClosed) {
  const size_t before = open_fd_count();
  const int memfd = make_memfd("zico-wrong", 0);
  send_raw(pair_[1], encoded(Welcome{3}), {memfd});
  send_raw(pair_[1], encoded(Grant{1, 0, true, {1, 2}}), {memfd});
  close(memfd);
  Message message;
  std::vector<int> fds;
  std::string why;
  EXPECT_EQ(receive(&message, &fds, &why), wire::Received::kMalformed);
  EXPECT_EQ(why, "Welcome: 1 descriptors attached (only Grant carries descriptors)");
  EXPECT_EQ(receive(&message, &fds, &why), wire::Received::kMalformed);
  EXPECT_EQ(why, "Grant: 1 descriptors for 2 chunk ids");
  EXPECT_TRUE(fds.empty());
  EXPECT_EQ(open_fd_count(), before);
}

TEST_F(WireTest, TooManyDescriptorsAreTruncatedAndClosed) {
  const size_t before = open_fd_count();
  const int memfd = make_memfd("zico-many", 0);
  send_raw(pair_[1], encoded(Grant{1, 0, true, {1}}), std::vector<int>(kMaxChunksPerMessage + 10, memfd));
  close(memfd);
  Message message;
  std::vector<int> fds;
  std::string why;
  EXPECT_EQ(receive(&message, &fds, &why), wire::Received::kMalformed);
  EXPECT_NE(why.find("control data truncated"), std::string::npos) << why;
  EXPECT_TRUE(fds.empty());
  EXPECT_EQ(open_fd_count(), before);
}

TEST_F(WireTest, OversizeDatagramIsTruncatedAndRefused) {
  std::vector<uint8_t> bytes = encoded(Goodbye{"x"});
  bytes.resize(kHeaderBytes + kMaxPayload + 100);
  fix_length(&bytes);
  send_raw(pair_[1], bytes, {});
  Message message;
  std::vector<int> fds;
  std::string why;
  EXPECT_EQ(receive(&message, &fds, &why), wire::Received::kMalformed);
  EXPECT_NE(why.find("datagram larger than"), std::string::npos) << why;
}

TEST_F(WireTest, PeerCredentialsOfSocketPair) {
  wire::PeerCredentials peer;
  std::string why;
  ASSERT_TRUE(wire::peer_credentials(pair_[0], &peer, &why)) << why;
  EXPECT_EQ(peer.pid, getpid());
  EXPECT_EQ(peer.uid, getuid());
  EXPECT_EQ(peer.gid, getgid());
  EXPECT_FALSE(wire::peer_credentials(-1, &peer, &why));
  EXPECT_NE(why.find("SO_PEERCRED"), std::string::npos);
}

// --- listening sockets ---------------------------------------------------------------------

class ListenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "zico-listen-XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr) << strerror(errno);
    dir_ = pattern;
    path_ = dir_ + "/umd.sock";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string dir_;
  std::string path_;
};

TEST_F(ListenTest, ServesConnectionsWithModeAndGroup) {
  std::string why;
  const int listener = wire::listen_unix(path_, 0660, getgid(), &why);
  ASSERT_GE(listener, 0) << why;
  struct stat st;
  ASSERT_EQ(stat(path_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0660u);
  EXPECT_EQ(st.st_gid, getgid());
  EXPECT_EQ(fcntl(listener, F_GETFL) & O_NONBLOCK, O_NONBLOCK);

  const int client = wire::connect_unix(path_, &why);
  ASSERT_GE(client, 0) << why;
  EXPECT_EQ(fcntl(client, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  const int server = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  ASSERT_GE(server, 0) << strerror(errno);

  wire::PeerCredentials peer;
  ASSERT_TRUE(wire::peer_credentials(server, &peer, &why)) << why;
  EXPECT_EQ(peer.pid, getpid());
  EXPECT_EQ(peer.uid, getuid());

  ASSERT_TRUE(wire::send_message(client, Hello{0, "listen-test"}, {}, &why)) << why;
  Message message;
  std::vector<int> fds;
  ASSERT_EQ(wire::receive_message(server, &message, &fds, &why), wire::Received::kMessage) << why;
  ASSERT_TRUE(std::holds_alternative<Hello>(message));
  EXPECT_EQ(std::get<Hello>(message).name, "listen-test");

  close(server);
  close(client);
  close(listener);
}

TEST_F(ListenTest, RefusesLiveSocketAndReplacesStaleOne) {
  std::string why;
  const int first = wire::listen_unix(path_, 0600, static_cast<gid_t>(-1), &why);
  ASSERT_GE(first, 0) << why;
  EXPECT_EQ(wire::listen_unix(path_, 0600, static_cast<gid_t>(-1), &why), -1);
  EXPECT_EQ(why, "another zico-umd is listening on " + path_);

  close(first);  // the file stays behind, with nobody listening
  ASSERT_TRUE(std::filesystem::exists(path_));
  const int second = wire::listen_unix(path_, 0600, static_cast<gid_t>(-1), &why);
  ASSERT_GE(second, 0) << why;
  const int client = wire::connect_unix(path_, &why);
  EXPECT_GE(client, 0) << why;
  if (client >= 0) close(client);
  close(second);
}

TEST_F(ListenTest, NeverReplacesARegularFile) {
  const int file = open(path_.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
  ASSERT_GE(file, 0);
  close(file);
  std::string why;
  EXPECT_EQ(wire::listen_unix(path_, 0600, static_cast<gid_t>(-1), &why), -1);
  EXPECT_EQ(why, path_ + " exists and is not a socket; refusing to replace it");
  EXPECT_TRUE(std::filesystem::is_regular_file(path_));
}

TEST_F(ListenTest, PathTooLong) {
  const std::string path = dir_ + "/" + std::string(sizeof(sockaddr_un::sun_path), 'p');
  std::string why;
  EXPECT_EQ(wire::listen_unix(path, 0600, static_cast<gid_t>(-1), &why), -1);
  EXPECT_NE(why.find(path), std::string::npos) << why;
  EXPECT_NE(why.find("(at most 107)"), std::string::npos) << why;
  EXPECT_EQ(wire::connect_unix(path, &why), -1);
  EXPECT_NE(why.find("(at most 107)"), std::string::npos) << why;
}

TEST_F(ListenTest, ConnectWithoutDaemonKeepsErrno) {
  std::string why;
  errno = 0;
  EXPECT_EQ(wire::connect_unix(path_, &why), -1);
  EXPECT_EQ(errno, ENOENT);
  EXPECT_NE(why.find(path_), std::string::npos) << why;

  // A stale socket file: the connection is refused.
  const int first = wire::listen_unix(path_, 0600, static_cast<gid_t>(-1), &why);
  ASSERT_GE(first, 0) << why;
  close(first);
  errno = 0;
  EXPECT_EQ(wire::connect_unix(path_, &why), -1);
  EXPECT_EQ(errno, ECONNREFUSED);
}

}  // namespace
}  // namespace zico::testing
