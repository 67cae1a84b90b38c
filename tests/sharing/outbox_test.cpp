// The daemon's outboxes: what a socket cannot take now waits, in order, up
// to the limits of the connection's kind, and then the connection is of no
// more use.
#include "outbox.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <variant>
#include <vector>

#include "wire.h"

namespace zico::sharing {
namespace {

// A connected pair whose sending end (first) the peer (second) never reads
// until told: filled, every further message must wait in an outbox.
struct FullSocket {
  FullSocket() {
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds), 0) << std::strerror(errno);
    std::string why;
    while (wire::send_message(fds[0], proto::Welcome{0}, {}, &why)) ++filler;
    EXPECT_TRUE(errno == EAGAIN || errno == EWOULDBLOCK) << why;
    EXPECT_GT(filler, 0u);
  }
  ~FullSocket() {
    ::close(fds[0]);
    ::close(fds[1]);
  }
  FullSocket(const FullSocket&) = delete;
  FullSocket& operator=(const FullSocket&) = delete;

  int sender() const { return fds[0]; }
  // Reads the next message on the peer's end; false when none is there.
  bool receive(proto::Message* message, std::vector<int>* received) const {
    std::string why;
    return wire::receive_message(fds[1], message, received, &why) == wire::Received::kMessage;
  }

  int fds[2] = {-1, -1};
  size_t filler = 0;  // messages the socket took before it was full
};

TEST(Outbox, AZicoUmctlConnectionThatLeavesSixteenAnswersUnreadIsOfNoMoreUse) {
  FullSocket socket;
  Outbox outbox;
  std::string why;
  for (uint64_t i = 1; i <= Outbox::kAdminLimits.messages; ++i) {
    ASSERT_TRUE(outbox.send(socket.sender(), proto::Welcome{i}, {}, Outbox::kAdminLimits, &why)) << i << ": " << why;
  }
  ASSERT_EQ(Outbox::kAdminLimits.messages, 16u);
  EXPECT_FALSE(outbox.send(socket.sender(), proto::Welcome{17}, {}, Outbox::kAdminLimits, &why))
      << "a 17th answer waited for a zico-umctl that does not read";
  EXPECT_NE(why.find("does not read what it is sent (16 messages wait)"), std::string::npos) << why;
}

TEST(Outbox, AJobsGrantsMayWaitByTheThousand) {
  // A whole GPU's worth of chunks leaves in thousands of Grants, which a job
  // busy with its kernels reads later.
  FullSocket socket;
  Outbox outbox;
  std::string why;
  constexpr uint64_t kWaiting = 1000;
  static_assert(kWaiting < Outbox::kJobLimits.messages);
  for (uint64_t i = 1; i <= kWaiting; ++i) {
    ASSERT_TRUE(outbox.send(socket.sender(), proto::Welcome{i}, {}, Outbox::kJobLimits, &why)) << i << ": " << why;
  }
  EXPECT_FALSE(outbox.empty());
}

TEST(Outbox, WaitingMessagesLeaveInOrderWithTheirDescriptorsOnceThePeerReads) {
  FullSocket socket;
  Outbox outbox;
  std::string why;
  // The chunk's descriptor is the caller's: it closes its own right after.
  const int chunk = ::memfd_create("outbox_test", MFD_CLOEXEC);
  ASSERT_GE(chunk, 0) << std::strerror(errno);
  ASSERT_EQ(::write(chunk, "chunk", 5), 5);
  proto::Grant grant;
  grant.request_id = 7;
  grant.ids = {1};
  ASSERT_TRUE(outbox.send(socket.sender(), proto::Welcome{1}, {}, Outbox::kJobLimits, &why)) << why;
  ASSERT_TRUE(outbox.send(socket.sender(), grant, std::vector<int>{chunk}, Outbox::kJobLimits, &why)) << why;
  ASSERT_TRUE(outbox.send(socket.sender(), proto::Welcome{3}, {}, Outbox::kJobLimits, &why)) << why;
  ::close(chunk);
  // The socket is still full: nothing leaves, nothing is lost.
  ASSERT_TRUE(outbox.flush(socket.sender(), &why)) << why;
  EXPECT_FALSE(outbox.empty());
  proto::Message message;
  std::vector<int> received;
  for (size_t i = 0; i < socket.filler; ++i) ASSERT_TRUE(socket.receive(&message, &received)) << i;
  ASSERT_TRUE(outbox.flush(socket.sender(), &why)) << why;
  EXPECT_TRUE(outbox.empty());
  ASSERT_TRUE(socket.receive(&message, &received));
  ASSERT_TRUE(std::holds_alternative<proto::Welcome>(message));
  EXPECT_EQ(std::get<proto::Welcome>(message).job_id, 1u);
  ASSERT_TRUE(socket.receive(&message, &received));
  ASSERT_TRUE(std::holds_alternative<proto::Grant>(message));
  EXPECT_EQ(std::get<proto::Grant>(message).request_id, 7u);
  ASSERT_EQ(received.size(), 1u);
  char bytes[5] = {};
  EXPECT_EQ(::pread(received[0], bytes, sizeof bytes, 0), 5);
  EXPECT_EQ(std::string(bytes, sizeof bytes), "chunk");
  ::close(received[0]);
  ASSERT_TRUE(socket.receive(&message, &received));
  ASSERT_TRUE(std::holds_alternative<proto::Welcome>(message));
  EXPECT_EQ(std::get<proto::Welcome>(message).job_id, 3u);
  EXPECT_FALSE(socket.receive(&message, &received));
}

}  // namespace
}  // namespace zico::sharing
