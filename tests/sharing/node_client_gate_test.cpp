// NodeClient's iteration gate, against a scripted daemon: what the job tells
// zico-umd at an iteration mark, and in what order. The daemon plans the gate
// with the curve it has when the mark arrives and weighs the claim the mark
// carries, so both must come from the iteration that just ended. And what
// the job gives back before its gate when the daemon says memory is wanted.
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

#include "device_allocator.h"
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
  // The job's next request is answered with MemoryWanted before its grant.
  void tell_memory_wanted() { wanted_ = true; }

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
        if (const auto* request = std::get_if<proto::Request>(&message)) {
          // Before the grant: the job knows once its allocation returns.
          if (wanted_.exchange(false)) sent = wire::send_message(job, proto::MemoryWanted{0}, {}, &why);
          sent = sent && grant(job, *request);
        }
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
        // Another job shares the GPU: the job gives its idle chunks back at its gates.
        if (sequence != 0) sent = wire::send_message(job, proto::Proceed{sequence, 1}, {}, &why);
      }
      EXPECT_TRUE(sent) << why;
    }
    if (job >= 0) ::close(job);
  }

  // Every request is granted at once, with chunks of the daemon's own
  // SimDriver, one descriptor each, as zico-umd lends them.
  bool grant(int job, const proto::Request& request) {
    EXPECT_LE(request.chunks, proto::kMaxChunksPerMessage) << "one grant per request here";
    std::vector<uint32_t> ids;
    std::vector<int> fds;
    bool made = true;
    for (uint32_t i = 0; i < request.chunks && made; ++i) {
      PhysHandle handle;
      int fd = -1;
      made = chunks_.create(DeviceId{0}, kChunk, &handle).is_ok() && chunks_.export_fd(handle, &fd).is_ok();
      if (handle.valid()) (void)chunks_.release(handle);  // the descriptor keeps the memory
      if (!made) break;
      ids.push_back(++next_id_);
      fds.push_back(fd);
    }
    std::string why;
    const bool sent = made && wire::send_message(job, proto::Grant{request.request_id, request.gpu, true, ids}, fds, &why);
    for (int fd : fds) ::close(fd);
    EXPECT_TRUE(sent) << "granting " << request.chunks << " chunks: " << why;
    return sent;
  }

  SimDriver chunks_;
  uint32_t next_id_ = 0;
  std::atomic<bool> wanted_{false};
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
    ASSERT_TRUE(client_->open_gpu(kDevice, &chunk, &source_, &why).is_ok()) << why;
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
  ChunkSource* source_ = nullptr;
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

// The job allocates through an allocator that borrows from the daemon, and
// tells its client of each allocation and free as libzicoum does
// (api_calls.cpp): on_allocated after the allocation; on_freed, the free,
// then after_free.
class NodeClientGiveBackTest : public NodeClientGateTest {
 protected:
  void SetUp() override {
    NodeClientGateTest::SetUp();
    if (HasFatalFailure()) return;
    AllocatorOptions options;
    options.source = source_;
    options.chunk_bytes = kChunk;
    options.arena_bytes = 256 * kMiB;
    std::string why;
    ASSERT_TRUE(DeviceAllocator::create(driver_, kDevice, options, &allocator_, &why).is_ok()) << why;
    client_->attach(kDevice, allocator_.get());
  }
  void TearDown() override {
    allocator_.reset();  // gives its chunks back through the client
    NodeClientGateTest::TearDown();
  }

  void* allocate(uint64_t bytes) {
    void* block = nullptr;
    EXPECT_TRUE(allocator_->allocate(bytes, StreamHandle{}, &block).is_ok());
    (void)client_->on_allocated(kDevice, block, bytes);
    return block;
  }
  void free(void* block) {
    client_->on_freed(kDevice, block);
    EXPECT_TRUE(allocator_->deallocate(block, kNoPendingWork).is_ok());
    client_->after_free(kDevice);
  }
  // One iteration from its gate: climbs through 4, 6, 8 and 10 MiB blocks and
  // frees them in reverse. What the allocator maps then, before the next gate.
  uint64_t iteration() {
    client_->iteration_gate(true);
    std::vector<void*> blocks;
    for (const uint64_t mib : {4, 6, 8, 10}) blocks.push_back(allocate(mib * kMiB));
    for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) free(*it);
    return allocator_->stats().mapped_bytes;
  }

  std::unique_ptr<DeviceAllocator> allocator_;
};

TEST_F(NodeClientGiveBackTest, ToldMemoryIsWantedTheIterationGivesBackWhatItFreesBeforeItsGate) {
  void* weights = allocate(2 * kMiB);
  // Until the job's tracker trusts its outlook (the third iteration), it
  // cannot tell what the rest of an iteration will use again.
  for (int i = 0; i < 4; ++i) (void)iteration();
  const uint64_t kept = iteration();
  EXPECT_GE(kept, 30 * kMiB) << "nobody asked: the iteration keeps its chunks to its gate";
  daemon_->tell_memory_wanted();  // answers the next iteration's first request
  const uint64_t given_back = iteration();
  EXPECT_LE(given_back, kept / 2) << "told that memory is wanted, the backward pass still kept what it freed";
  EXPECT_GE(given_back, 2 * kMiB) << "the weights stay";
  const uint64_t next = iteration();
  EXPECT_GE(next, 30 * kMiB) << "told once, for one iteration: the next keeps its chunks again";
  free(weights);
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
