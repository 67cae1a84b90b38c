// NodeClient's iteration gate, against a scripted daemon: what the job tells
// zico-umd at an iteration mark, and in what order. The daemon plans the gate
// with the curve it has when the mark arrives and weighs the claim the mark
// carries, so both must come from the iteration that just ended.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include <gtest/gtest.h>

#include "node_client.h"
#include "protocol.h"
#include "sim_driver.h"
#include "wire.h"

namespace zico::sharing {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kChunk = 2 * kMiB;

// Listens at `path` and serves one job: welcomes it, opens its GPU as GPU 0
// with 2 MiB chunks, opens every iteration gate at once, and keeps every
// message the job sent after the handshake, in order. The gate of mark
// `suspend_at` (0: none) is answered as zico-umd --turns answers a job in
// another's way: Suspend, Resume once it reports itself suspended, and
// Proceed once it runs again.
class ScriptedDaemon {
 public:
  explicit ScriptedDaemon(const std::string& path, uint64_t suspend_at = 0) : suspend_at_(suspend_at) {
    std::string why;
    listener_ = wire::listen_unix(path, 0600, static_cast<gid_t>(-1), &why);
    EXPECT_GE(listener_, 0) << why;
    if (listener_ >= 0) serving_ = std::thread([this] { serve(); });
  }
  ~ScriptedDaemon() {
    stop_ = true;
    if (serving_.joinable()) serving_.join();
    if (listener_ >= 0) ::close(listener_);
  }
  ScriptedDaemon(const ScriptedDaemon&) = delete;
  ScriptedDaemon& operator=(const ScriptedDaemon&) = delete;

  std::vector<proto::Message> received() const {
    std::lock_guard lock(mu_);
    return received_;
  }

 private:
  // Waits up to 50 ms for `fd` to be readable (false: not yet, or stopping).
  bool readable(int fd) const {
    pollfd p{fd, POLLIN, 0};
    return !stop_ && ::poll(&p, 1, 50) == 1;
  }

  void serve() {
    int job = -1;
    while (job < 0 && !stop_) {
      if (readable(listener_)) job = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    }
    while (job >= 0 && !stop_) {
      if (!readable(job)) continue;
      proto::Message message;
      std::vector<int> fds;
      std::string why;
      if (wire::receive_message(job, &message, &fds, &why) != wire::Received::kMessage) break;
      for (int fd : fds) ::close(fd);
      bool sent = true;
      if (std::holds_alternative<proto::Hello>(message)) {
        sent = wire::send_message(job, proto::Welcome{7}, {}, &why);
      } else if (std::holds_alternative<proto::OpenGpu>(message)) {
        sent = wire::send_message(job, proto::GpuOpened{0, kChunk, 0, UINT64_MAX}, {}, &why);
      } else {
        const auto* mark = std::get_if<proto::IterationMark>(&message);
        uint64_t sequence = mark != nullptr ? mark->sequence : 0;
        const auto* state = std::get_if<proto::JobState>(&message);
        const bool suspended = state != nullptr && state->state == proto::JobRunState::kSuspended;
        const bool running = state != nullptr && state->state == proto::JobRunState::kRunning;
        {
          // Kept before the gate opens: the job reads them once it has.
          std::lock_guard lock(mu_);
          received_.push_back(std::move(message));
        }
        if (sequence != 0 && sequence == suspend_at_) {
          sent = wire::send_message(job, proto::Suspend{proto::StoreKind::kHost}, {}, &why);
          sequence = 0;
        }
        if (suspended) sent = wire::send_message(job, proto::Resume{}, {}, &why);
        if (running) sequence = suspend_at_;
        if (sequence != 0) sent = wire::send_message(job, proto::Proceed{sequence}, {}, &why);
      }
      EXPECT_TRUE(sent) << why;
    }
    if (job >= 0) ::close(job);
  }

  int listener_ = -1;
  uint64_t suspend_at_ = 0;
  std::atomic<bool> stop_{false};
  std::thread serving_;
  mutable std::mutex mu_;
  std::vector<proto::Message> received_;
};

class NodeClientGateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "zico-gate-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    dir_ = pattern;
    daemon_ = std::make_unique<ScriptedDaemon>(dir_ + "/umd.sock", suspend_at());
    NodeClientOptions options;
    options.socket_path = dir_ + "/umd.sock";
    options.wait_timeout_ns = 5'000'000'000;
    std::string why;
    ASSERT_TRUE(NodeClient::connect(driver_, options, &client_, &why).is_ok()) << why;
    size_t chunk = 0;
    ChunkSource* source = nullptr;
    ASSERT_TRUE(client_->open_gpu(kDevice, &chunk, &source, &why).is_ok()) << why;
    ASSERT_EQ(chunk, kChunk);
  }
  virtual uint64_t suspend_at() const { return 0; }
  void TearDown() override {
    client_.reset();
    daemon_.reset();
    std::filesystem::remove_all(dir_);
  }

  // One iteration's blocks, allocated in order and freed in reverse; the
  // blocks' ids are never reused.
  void iteration(std::initializer_list<uint64_t> sizes_mib) {
    std::vector<const void*> blocks;
    for (const uint64_t mib : sizes_mib) {
      blocks.push_back(reinterpret_cast<const void*>(next_block_++ * kChunk));
      (void)client_->on_allocated(kDevice, blocks.back(), mib * kMiB);
    }
    for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) client_->on_freed(kDevice, *it);
  }

  static constexpr DeviceId kDevice{0};
  std::string dir_;
  SimDriver driver_;
  std::unique_ptr<ScriptedDaemon> daemon_;
  std::unique_ptr<NodeClient> client_;
  uintptr_t next_block_ = 1;
};

TEST_F(NodeClientGateTest, TheMarkCarriesTheIterationJustEndedAndItsCurveComesFirst) {
  (void)client_->on_allocated(kDevice, reinterpret_cast<const void*>(next_block_++ * kChunk), 2 * kMiB);  // weights
  client_->iteration_gate(true);  // the first mark: iterations begin
  iteration({4, 6});               // the first iteration (never trusted), peak 12 MiB
  client_->iteration_gate(true);
  iteration({4, 6, 8});  // the second, trusted on its own: peak 20 MiB, then 2 MiB
  client_->iteration_gate(true);

  // What was sent since the second mark: the second iteration's curve, then
  // the third mark with its claim (reports may come in between).
  const std::vector<proto::Message> got = daemon_->received();
  size_t second_mark = got.size();
  for (size_t i = 0; i < got.size(); ++i) {
    const auto* mark = std::get_if<proto::IterationMark>(&got[i]);
    if (mark != nullptr && mark->sequence == 2) second_mark = i;
  }
  ASSERT_LT(second_mark, got.size()) << "no second mark";
  const proto::Curve* curve = nullptr;
  const proto::IterationMark* third = nullptr;
  for (size_t i = second_mark + 1; i < got.size() && third == nullptr; ++i) {
    if (const auto* c = std::get_if<proto::Curve>(&got[i])) curve = c;
    if (const auto* mark = std::get_if<proto::IterationMark>(&got[i])) third = mark;
  }
  ASSERT_NE(third, nullptr) << "no third mark";
  EXPECT_EQ(third->sequence, 3u);
  ASSERT_NE(curve, nullptr) << "the changed curve must come before the mark the daemon plans with it";
  EXPECT_EQ(curve->gpu, 0u);
  EXPECT_EQ(curve->curve.peak(), 20 * kMiB) << "the second iteration's curve, not the first's (12 MiB)";
  ASSERT_EQ(third->claims.size(), 1u) << "the claim of the iteration about to begin, from the one just ended";
  EXPECT_EQ(third->claims[0].gpu, 0u);
  EXPECT_EQ(third->claims[0].peak_chunks, 10u);   // 20 MiB
  EXPECT_EQ(third->claims[0].settle_chunks, 1u);  // the 2 MiB of weights
}

// The daemon suspends the job at its second gate (another job's turn).
class NodeClientGateSuspendTest : public NodeClientGateTest {
 protected:
  uint64_t suspend_at() const override { return 2; }
};

TEST_F(NodeClientGateSuspendTest, ASuspensionAskedAtTheGateRunsThereAndTheGateWaitsOn) {
  int pauses = 0;
  // What Runtime::pause_point does, less the allocators' eviction.
  const auto pause = [&] {
    Residency to = Residency::kNvme;
    ASSERT_TRUE(client_->suspend_requested(&to));
    EXPECT_EQ(to, Residency::kHost);
    ++pauses;
    client_->report_suspended(true);
    client_->wait_for_resume();
    client_->report_suspended(false);
  };
  client_->iteration_gate(true, pause);
  EXPECT_EQ(pauses, 0) << "the first gate opens at once";
  const auto asked = std::chrono::steady_clock::now();
  client_->iteration_gate(true, pause);
  EXPECT_LT(std::chrono::steady_clock::now() - asked, std::chrono::seconds(3)) << "the gate did not time out";
  EXPECT_EQ(pauses, 1);
  // The daemon saw the mark, the suspension and the job running again, in
  // that order, and opened the gate after.
  std::vector<proto::JobRunState> states;
  for (const proto::Message& m : daemon_->received()) {
    if (const auto* state = std::get_if<proto::JobState>(&m)) states.push_back(state->state);
  }
  EXPECT_EQ(states, (std::vector<proto::JobRunState>{proto::JobRunState::kSuspended, proto::JobRunState::kRunning}));
  Residency to = Residency::kHost;
  EXPECT_FALSE(client_->suspend_requested(&to)) << "nothing left to do after the resume";
}

}  // namespace
}  // namespace zico::sharing
