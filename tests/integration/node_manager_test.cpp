// The node manager end to end on SimDriver: a real zico-umd process and real
// job processes (node_job) that borrow memory through libzicoum, write
// patterns and verify every byte. A sampler asks the daemon for its status
// every few milliseconds and checks the budget at every sample.
//
// Paths of the programs come from the command line (see CMakeLists.txt):
//   node_manager_test ZICO_UMD NODE_JOB ZICO_UMCTL
#include "node_harness.h"

#include <algorithm>

namespace {

using namespace zico_test;

TEST_F(NodeManager, FourJobsShareABudgetBelowTheSumOfTheirPeaks) {
  const uint64_t budget = 96 * kMiB;
  start_daemon(budget);
  Sampler sampler(socket_);
  for (uint64_t seed = 1; seed <= 4; ++seed) start_job(seed, 12, 48 * kMiB, 8 * kMiB, 2);  // 192 MiB of peaks
  for (Child& job : jobs_) EXPECT_TRUE(job.succeeded()) << job.output();
  sampler.stop();
  EXPECT_GT(sampler.samples(), 20u);
  EXPECT_EQ(sampler.violations(), 0u) << sampler.first_violation();
  EXPECT_LE(sampler.max_granted(), budget);
  EXPECT_GT(sampler.max_waiting(), 0u) << "the jobs never had to wait: the test shows no sharing";
  zico::proto::StatusReply status;
  ASSERT_TRUE(query_status(socket_, &status));
  EXPECT_EQ(status.gpus[0].granted_bytes, 0u);
  EXPECT_TRUE(status.jobs.empty());
}

// A job alone under a budget above its peak never has to yield its memory.
// It gives its activations back at each iteration's gate, and the daemon
// looks at such returns (does the process still map them?) only when a look
// is due, to bound its own CPU; until then they count as held. A request
// that waits for them must not make the ledger see a jam (with thousands of
// small chunks a look is slow, and the next one far off).
TEST_F(NodeManager, ALoneJobNeverYieldsItsMemory) {
  const uint64_t budget = 96 * kMiB;
  start_daemon(budget, {"--schedule", "zico", "--chunk-size", "8192"}, {"ZICO_SIM_GRANULARITY=8192"});
  if (HasFatalFailure()) return;
  Child& job = start_job(1, 12, 48 * kMiB, 8 * kMiB, 20, {"ZICO_SIM_GRANULARITY=8192"});
  ASSERT_TRUE(job.succeeded()) << job.output();
  zico::proto::StatusReply status;
  ASSERT_TRUE(query_status(socket_, &status));
  EXPECT_EQ(status.gpus[0].deadlocks, 0u) << "a lone job yielded its memory to the host";
}

// A job alone on the GPU keeps its idle chunks at its gates: giving them back
// would only bring them back at its next climb, an import per chunk. With a
// second job beside it, the gates give them back again (Zico's reclaim).
TEST_F(NodeManager, ALoneJobKeepsItsIdleChunksAcrossItsGates) {
  const uint64_t budget = 96 * kMiB;
  const uint64_t chunk = 8192;
  start_daemon(budget, {"--schedule", "zico", "--chunk-size", std::to_string(chunk)},
               {"ZICO_SIM_GRANULARITY=8192"});
  if (HasFatalFailure()) return;
  const uint64_t peak = 24 * kMiB;
  Child& alone = start_job(1, 12, peak, 4 * kMiB, 5, {"ZICO_SIM_GRANULARITY=8192"});
  ASSERT_TRUE(alone.succeeded()) << alone.output();
  zico::proto::StatusReply status;
  ASSERT_TRUE(query_status(socket_, &status));
  const uint64_t per_iteration = (peak - 4 * kMiB) / chunk;  // its transient memory, in chunks
  EXPECT_LT(status.gpus[0].grants, 4 * per_iteration)
      << "12 iterations alone should import the transient memory about once, not at each gate";
  const uint64_t before = status.gpus[0].grants;
  // Long enough to overlap for many gates even if one starts late on a loaded machine.
  Child& first = start_job(2, 60, peak, 4 * kMiB, 5, {"ZICO_SIM_GRANULARITY=8192"});
  Child& second = start_job(3, 60, peak, 4 * kMiB, 5, {"ZICO_SIM_GRANULARITY=8192"});
  ASSERT_TRUE(first.succeeded()) << first.output();
  ASSERT_TRUE(second.succeeded()) << second.output();
  ASSERT_TRUE(query_status(socket_, &status));
  EXPECT_GT(status.gpus[0].grants - before, 6 * per_iteration) << "two jobs side by side give their idle chunks back";
}

TEST_F(NodeManager, KilledJobsGiveEverythingBackAtOnce) {
  const uint64_t budget = 64 * kMiB;
  start_daemon(budget);
  Sampler sampler(socket_);
  // Load that runs through the whole loop.
  start_job(1001, 1'000'000, 28 * kMiB, 4 * kMiB, 1);
  start_job(1002, 1'000'000, 28 * kMiB, 4 * kMiB, 1);  // with a victim: 72 MiB of peaks
  std::mt19937 random(7);
  std::vector<double> release_ms;
  const int kKills = 200;
  for (int i = 0; i < kKills; ++i) {
    Child victim = spawn({g_job, "--seed", std::to_string(i + 1), "--iterations", "1000000", "--peak",
                          std::to_string(16 * kMiB), "--persistent", std::to_string(4 * kMiB), "--pause-ms", "1"},
                         {"ZICO_BACKEND=sim", "ZICO_SOCKET=" + socket_}, (dir_ / "victim.log").string());
    // Some die while registering, some while waiting, most while holding memory.
    if (i % 4 != 0) (void)wait_for_job(victim.pid, 4 * kMiB, 2000ms);
    std::this_thread::sleep_for(std::chrono::milliseconds(random() % 10));
    victim.kill(SIGKILL);
    victim.wait();
    const auto killed = Clock::now();
    bool gone = false;
    while (!gone && Clock::now() - killed < 2s) {
      zico::proto::StatusReply status;
      if (query_status(socket_, &status)) {
        gone = std::none_of(status.jobs.begin(), status.jobs.end(),
                            [&](const auto& job) { return static_cast<pid_t>(job.pid) == victim.pid; });
      }
      if (!gone) std::this_thread::sleep_for(1ms);
    }
    ASSERT_TRUE(gone) << "job of killed pid " << victim.pid << " still listed after 2 s";
    release_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - killed).count());
  }
  for (Child& job : jobs_) {
    EXPECT_TRUE(job.running()) << job.output();
    job.kill(SIGKILL);
    job.wait();
  }
  std::sort(release_ms.begin(), release_ms.end());
  std::printf("released after SIGKILL: median %.2f ms, max %.2f ms over %d kills\n", release_ms[release_ms.size() / 2],
              release_ms.back(), kKills);
  EXPECT_LE(release_ms.back(), 100.0);
  // Let the daemon notice the load jobs' ends too, then every chunk must be free.
  zico::proto::StatusReply status;
  for (auto deadline = Clock::now() + 2s; Clock::now() < deadline; std::this_thread::sleep_for(5ms)) {
    if (query_status(socket_, &status) && status.jobs.empty()) break;
  }
  sampler.stop();
  EXPECT_EQ(sampler.violations(), 0u) << sampler.first_violation();
  ASSERT_TRUE(status.jobs.empty());
  EXPECT_EQ(status.gpus[0].granted_bytes, 0u);
  EXPECT_LE(status.gpus[0].pool_bytes, budget);
  // No chunk lost: one job can now map the whole budget, chunk for chunk.
  Child& whole = start_job(1, 2, budget, 0, 0, {"ZICO_WAIT_TIMEOUT=5s"}, {"--block", "2MiB"});
  EXPECT_TRUE(whole.succeeded()) << whole.output();
}

TEST_F(NodeManager, DaemonRestartsUnderLoadLoseNoJobAndNoData) {
  const uint64_t budget = 96 * kMiB;
  start_daemon(budget);
  Sampler sampler(socket_);
  for (uint64_t seed = 1; seed <= 4; ++seed) start_job(seed, 80, 40 * kMiB, 8 * kMiB, 3);
  for (int restart = 0; restart < 20; ++restart) {
    std::this_thread::sleep_for(100ms);
    daemon_.kill(restart % 2 == 0 ? SIGKILL : SIGTERM);
    daemon_.wait();
    std::this_thread::sleep_for(20ms);  // jobs run on what they hold meanwhile
    start_daemon(budget);
    if (HasFatalFailure()) return;
  }
  for (Child& job : jobs_) EXPECT_TRUE(job.succeeded()) << job.output();
  sampler.stop();
  EXPECT_EQ(sampler.violations(), 0u) << sampler.first_violation();
}

TEST_F(NodeManager, SuspendedJobsMemoryGoesToOthersAndComesBackIntact) {
  const uint64_t budget = 64 * kMiB;
  start_daemon(budget);
  Child& first = start_job(1, 400, 40 * kMiB, 24 * kMiB, 5);
  ASSERT_TRUE(wait_for_job(first.pid, 24 * kMiB, 5000ms)) << first.output();
  zico::proto::StatusReply status;
  ASSERT_TRUE(query_status(socket_, &status));
  const uint64_t first_id = status.jobs.at(0).id;
  // As an operator would: zico-umctl, which waits until the job has paused.
  Child suspend = spawn({g_umctl, "suspend", std::to_string(first_id), "--to", "host", "--socket", socket_}, {},
                        (dir_ / "umctl.log").string());
  ASSERT_TRUE(suspend.succeeded()) << suspend.output();
  // The second job needs more than the first ever leaves (24 + 48 > 64 MiB):
  // it can only run on the first's memory.
  Child& second = start_job(2, 6, 48 * kMiB, 8 * kMiB, 0);
  EXPECT_TRUE(second.succeeded()) << second.output();
  bool first_was_suspended = false;
  ASSERT_TRUE(query_status(socket_, &status));
  for (const auto& job : status.jobs) {
    if (job.id == first_id) first_was_suspended = job.state == zico::proto::JobRunState::kSuspended && job.granted_bytes == 0;
  }
  EXPECT_TRUE(first_was_suspended);
  EXPECT_EQ(status.gpus[0].deadlocks, 0u) << "memory moved by a deadlock yield, not by the suspension";
  Child resume = spawn({g_umctl, "resume", std::to_string(first_id), "--socket", socket_}, {},
                       (dir_ / "umctl.log").string());
  ASSERT_TRUE(resume.succeeded()) << resume.output();
  EXPECT_TRUE(first.succeeded()) << first.output();
}

TEST_F(NodeManager, BadMessagesCloseOnlyTheirOwnConnection) {
  const uint64_t budget = 64 * kMiB;
  start_daemon(budget);
  Sampler sampler(socket_);
  start_job(1, 40, 40 * kMiB, 8 * kMiB, 2);
  start_job(2, 40, 40 * kMiB, 8 * kMiB, 2);
  ASSERT_TRUE(wait_for_job(jobs_[0].pid, 8 * kMiB, 5000ms));
  // Garbage, a lie about the length, an oversized datagram.
  EXPECT_NE(send_raw_and_listen(socket_, {{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}}).find("magic"),
            std::string::npos);
  std::vector<uint8_t> lying = encoded(zico::proto::Hello{0, "liar"});
  lying[8] = 200;  // payload_bytes no longer matches the datagram
  EXPECT_NE(send_raw_and_listen(socket_, {lying}).find("malformed"), std::string::npos);
  EXPECT_NE(send_raw_and_listen(socket_, {std::vector<uint8_t>(100'000, 0x5a)}).find("malformed"), std::string::npos);
  // Out of order: a request before the GPU is opened; a return of a chunk it never had.
  EXPECT_NE(send_raw_and_listen(socket_, {encoded(zico::proto::Hello{0, "rogue"}),
                                          encoded(zico::proto::Request{1, 0, 1})})
                .find("not opened"),
            std::string::npos);
  zico::proto::Return forged;
  forged.ids = {1, 2, 3};
  zico::Capabilities caps;
  zico::SimDriver sim;
  ASSERT_TRUE(sim.capabilities(zico::DeviceId{0}, &caps).is_ok());
  EXPECT_NE(send_raw_and_listen(socket_, {encoded(zico::proto::Hello{0, "forger"}),
                                          encoded(zico::proto::OpenGpu{caps.uuid, 0}), encoded(forged)})
                .find("does not hold"),
            std::string::npos);
  // A new job claiming to hold chunks (it would inflate the books).
  EXPECT_NE(send_raw_and_listen(socket_, {encoded(zico::proto::Hello{0, "inflater"}),
                                          encoded(zico::proto::OpenGpu{caps.uuid, UINT64_MAX - 5})})
                .find("claims"),
            std::string::npos);
  // A return that names one chunk twice would free it twice: lent to two jobs.
  {
    std::string why;
    const int fd = zico::wire::connect_unix(socket_, &why);
    ASSERT_GE(fd, 0) << why;
    zico::proto::Message reply;
    std::vector<int> fds;
    const auto next = [&] {
      for (int f : fds) ::close(f);
      fds.clear();
      return zico::wire::receive_message(fd, &reply, &fds, &why) == zico::wire::Received::kMessage;
    };
    ASSERT_TRUE(zico::wire::send_message(fd, zico::proto::Hello{0, "doubler"}, {}, &why));
    ASSERT_TRUE(next());
    ASSERT_TRUE(zico::wire::send_message(fd, zico::proto::OpenGpu{caps.uuid, 0}, {}, &why));
    ASSERT_TRUE(next());
    ASSERT_TRUE(zico::wire::send_message(fd, zico::proto::Request{1, 0, 2}, {}, &why));
    while (next() && !std::holds_alternative<zico::proto::Grant>(reply)) {
    }
    ASSERT_TRUE(std::holds_alternative<zico::proto::Grant>(reply));
    const uint32_t id = std::get<zico::proto::Grant>(reply).ids.at(0);
    zico::proto::Return twice;
    twice.ids = {id, id};
    ASSERT_TRUE(zico::wire::send_message(fd, twice, {}, &why));
    std::string goodbye;
    while (next()) {
      if (const auto* bye = std::get_if<zico::proto::Goodbye>(&reply)) goodbye = bye->reason;
    }
    for (int f : fds) ::close(f);
    ::close(fd);
    EXPECT_NE(goodbye.find("twice"), std::string::npos) << goodbye;
  }
  // A job's message from a zico-umctl connection.
  EXPECT_NE(send_raw_and_listen(socket_, {encoded(zico::proto::Request{1, 0, 1})}).find("not a zico-umctl request"),
            std::string::npos);
  for (Child& job : jobs_) EXPECT_TRUE(job.succeeded()) << job.output();
  sampler.stop();
  EXPECT_EQ(sampler.violations(), 0u) << sampler.first_violation();
  zico::proto::StatusReply status;
  ASSERT_TRUE(query_status(socket_, &status));
  // The doubler's process (this one) still lives, so its two chunks stay
  // counted to it; nothing else is left.
  EXPECT_EQ(status.gpus[0].granted_bytes, 4 * kMiB);
  ASSERT_EQ(status.jobs.size(), 1u);
  EXPECT_EQ(static_cast<pid_t>(status.jobs[0].pid), ::getpid());
  const std::string log = daemon_.output();
  EXPECT_NE(log.find("malformed message"), std::string::npos) << log;
}

TEST_F(NodeManager, ClaimsHoldBackAnUnsafeGrantUntilTheOtherJobIsAtItsGate) {
  start_daemon(64 * kMiB);
  RawJob a(socket_);
  RawJob b(socket_);
  ASSERT_EQ(a.open(sim_gpu_uuid(), "claims-a"), 2 * kMiB);
  ASSERT_EQ(b.open(sim_gpu_uuid(), "claims-b"), 2 * kMiB);  // 32 chunks in all
  // A climbs to 24 chunks in its iteration and keeps 10.
  ASSERT_TRUE(a.send(zico::proto::Request{1, 0, 10, 24, 10}));
  const auto first = a.await<zico::proto::Grant>(2000ms);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->ids.size(), 10u);
  // B fits (12 of the 22 free chunks) but keeps all 20 it climbs to: after
  // it, 32 - 10 - 20 = 2 chunks would be left for the 14 A still claims.
  // It waits for safety, not for room.
  ASSERT_TRUE(b.send(zico::proto::Request{1, 0, 12, 20, 20}));
  EXPECT_FALSE(b.await<zico::proto::Grant>(300ms).has_value()) << "granted although A could not finish then";
  zico::proto::StatusReply status;
  ASSERT_TRUE(query_status(socket_, &status));
  EXPECT_EQ(status.gpus[0].granted_bytes, 20 * kMiB);
  EXPECT_EQ(status.gpus[0].waiting_bytes, 24 * kMiB);
  // At its gate A needs nothing more than it holds: its claim goes, and the
  // daemon grants B's request without anything given back.
  ASSERT_TRUE(a.send(zico::proto::IterationMark{1}));
  const auto second = b.await<zico::proto::Grant>(2000ms);
  ASSERT_TRUE(second.has_value()) << "the claim A left at its gate still holds B back";
  EXPECT_EQ(second->ids.size(), 12u);
  // A's own start goes by the plan alone (no --start-guard).
  EXPECT_TRUE(a.await<zico::proto::Proceed>(2000ms).has_value());
  ASSERT_TRUE(query_status(socket_, &status));
  EXPECT_EQ(status.gpus[0].granted_bytes, 44 * kMiB);
  EXPECT_EQ(status.gpus[0].deadlocks, 0u);
}

// A request that waits tells the GPU's jobs that memory is wanted, each once
// per iteration of its own (until its next IterationMark): a job keeps what
// its iteration frees until its gate otherwise, and another job's iteration
// could not climb into what this one's backward pass lets go of.
TEST_F(NodeManager, AWaitingRequestTellsTheJobsMemoryIsWantedOncePerIteration) {
  start_daemon(64 * kMiB);
  RawJob a(socket_);
  RawJob b(socket_);
  ASSERT_EQ(a.open(sim_gpu_uuid(), "wanted-a"), 2 * kMiB);
  ASSERT_EQ(b.open(sim_gpu_uuid(), "wanted-b"), 2 * kMiB);  // 32 chunks in all
  ASSERT_TRUE(a.send(zico::proto::Request{1, 0, 30}));
  ASSERT_TRUE(a.await<zico::proto::Grant>(2000ms).has_value());
  EXPECT_FALSE(a.await<zico::proto::MemoryWanted>(200ms).has_value()) << "told while no request waited";
  ASSERT_TRUE(b.send(zico::proto::Request{1, 0, 10}));
  const auto told = a.await<zico::proto::MemoryWanted>(2000ms);
  ASSERT_TRUE(told.has_value()) << "a request waits and the job holding the memory was not told";
  EXPECT_EQ(told->gpu, 0u);
  ASSERT_TRUE(b.send(zico::proto::Request{2, 0, 1}));
  EXPECT_FALSE(a.await<zico::proto::MemoryWanted>(300ms).has_value()) << "told twice in one iteration";
  ASSERT_TRUE(a.send(zico::proto::IterationMark{1}));
  EXPECT_TRUE(a.await<zico::proto::MemoryWanted>(2000ms).has_value())
      << "not told again in its next iteration although the requests still wait";
}

// A UM job's reports carry its pager's link: at its gate the daemon asks it
// to page out as soon as a job in mid-iteration claims its memory, before
// that job has to wait for it. Budget 64 MiB: 32 chunks of 2 MiB.
TEST_F(NodeManager, AUmJobAtItsGatePagesOutAheadOfAnotherJobsClaim) {
  start_daemon(64 * kMiB);
  const zico::proto::GpuUuid uuid = sim_gpu_uuid();
  const auto flat_curve = [](uint64_t level, uint64_t end) {
    zico::sharing::DemandCurve curve;
    curve.period_ns = 1'000'000'000;
    curve.bins.fill(level);
    curve.persistent_bytes = end;
    curve.end_bytes = end;
    return curve;
  };
  RawJob um(socket_);
  ASSERT_TRUE(um.send(zico::proto::Hello{0, "um"}));
  ASSERT_TRUE(um.await<zico::proto::Welcome>(2000ms).has_value());
  ASSERT_TRUE(um.send(zico::proto::OpenGpu{uuid, 0, true}));
  ASSERT_TRUE(um.await<zico::proto::GpuOpened>(2000ms).has_value());
  ASSERT_TRUE(um.send(zico::proto::Request{1, 0, 8}));
  ASSERT_TRUE(um.await<zico::proto::ResidentGrant>(2000ms).has_value());
  // 1 GB/s for 1 s: it pages out up to all it holds at its gate.
  ASSERT_TRUE(um.send(zico::proto::Curve{0, flat_curve(16 * kMiB, 16 * kMiB)}));
  ASSERT_TRUE(um.send(zico::proto::Report{0, 16 * kMiB, 16 * kMiB, 1, 2 * kMiB, 1'000'000'000}));

  RawJob ordinary(socket_);
  ASSERT_EQ(ordinary.open(uuid, "ordinary"), 2 * kMiB);
  ASSERT_TRUE(ordinary.send(zico::proto::Curve{0, flat_curve(56 * kMiB, 8 * kMiB)}));
  ASSERT_TRUE(ordinary.send(zico::proto::IterationMark{1}));
  ASSERT_TRUE(ordinary.await<zico::proto::Proceed>(2000ms).has_value());
  // The UM job's next iteration (16 MiB) does not fit beside the other's
  // 56 MiB: it waits at its gate.
  ASSERT_TRUE(um.send(zico::proto::IterationMark{1}));
  EXPECT_FALSE(um.await<zico::proto::Proceed>(200ms).has_value());
  // 20 chunks fit (24 are free), but the claim of 28 leaves 4 short: the
  // UM job is asked for them now.
  ASSERT_TRUE(ordinary.send(zico::proto::Request{1, 0, 20, 28, 4}));
  ASSERT_TRUE(ordinary.await<zico::proto::Grant>(2000ms).has_value());
  const auto reclaim = um.await<zico::proto::Reclaim>(2000ms);
  ASSERT_TRUE(reclaim.has_value()) << "the UM job at its gate was not asked ahead of the claim";
  EXPECT_EQ(reclaim->chunks, 4u);
}

// With --start-guard on the gates ask Ledger::may_start. Budget 64 MiB in
// 2 MiB chunks: 32.
class GateGuardTest : public NodeManager {
 protected:
  void SetUp() override {
    NodeManager::SetUp();
    start_daemon(64 * kMiB, {"--start-guard", "on"});
    uuid_ = sim_gpu_uuid();
  }
  // A in mid-iteration (4 chunks, no claim) and B, still learning.
  void open_learning_pair(RawJob& a, RawJob& b) {
    ASSERT_EQ(a.open(uuid_, "mid-iteration"), 2 * kMiB);
    ASSERT_EQ(b.open(uuid_, "learning"), 2 * kMiB);
    ASSERT_TRUE(a.send(zico::proto::Request{1, 0, 4}));
    ASSERT_TRUE(a.await<zico::proto::Grant>(2000ms).has_value());
  }
  zico::proto::GpuUuid uuid_{};
};

using Mark = zico::proto::IterationMark;
using Proceed = zico::proto::Proceed;

TEST_F(GateGuardTest, AStartWaitsWhileItsClaimWouldLeaveAJobInMidIterationUnableToFinish) {
  RawJob a(socket_);
  RawJob b(socket_);
  ASSERT_EQ(a.open(uuid_, "mid-iteration"), 2 * kMiB);
  ASSERT_EQ(b.open(uuid_, "at-its-gate"), 2 * kMiB);
  // A is in mid-iteration: it holds 10 chunks, climbs to 24 and keeps 10.
  ASSERT_TRUE(a.send(zico::proto::Request{1, 0, 10, 24, 10}));
  ASSERT_TRUE(a.await<zico::proto::Grant>(2000ms).has_value());
  // An iteration of B that climbs to 8 is safe: A finishes first (14 of the
  // 22 free chunks), then B.
  ASSERT_TRUE(b.send(Mark{1, {{0, 8, 0}}}));
  const auto first = b.await<Proceed>(500ms);
  ASSERT_TRUE(first.has_value()) << "a safe start was held back";
  EXPECT_EQ(first->sequence, 1u);
  // One that climbs to 23 is not: after A, 32 - 10 = 22 chunks are left.
  ASSERT_TRUE(b.send(Mark{2, {{0, 23, 0}}}));
  EXPECT_FALSE(b.await<Proceed>(300ms).has_value()) << "started although A could not finish then";
  // At its gate A needs nothing more: B may start.
  const auto asked = Clock::now();
  ASSERT_TRUE(a.send(Mark{1}));
  const auto second = b.await<Proceed>(2000ms);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->sequence, 2u);
  EXPECT_LT(Clock::now() - asked, 400ms) << "released by the 1 s bound, not by A reaching its gate";
}

TEST_F(GateGuardTest, AStartWithoutAClaimWaitsForTheJobsInMidIteration) {
  RawJob a(socket_);
  RawJob b(socket_);
  // A is in mid-iteration and does not know its iteration (no claim); B
  // does not know the one it would begin. Nothing would protect either from
  // the other: B waits.
  ASSERT_NO_FATAL_FAILURE(open_learning_pair(a, b));
  ASSERT_TRUE(b.send(Mark{1}));
  EXPECT_FALSE(b.await<Proceed>(300ms).has_value()) << "started against a job in mid-iteration without a claim";
  // A learns its iteration: it peaks at 6 chunks, reached with this grant,
  // and only gives back from there. The grant is asked for again at once.
  const auto asked = Clock::now();
  ASSERT_TRUE(a.send(zico::proto::Request{2, 0, 2, 6, 2}));
  ASSERT_TRUE(a.await<zico::proto::Grant>(2000ms).has_value());
  ASSERT_TRUE(b.await<Proceed>(2000ms).has_value());
  EXPECT_LT(Clock::now() - asked, 400ms) << "released by the 1 s bound, not by A's grant";
}

TEST_F(GateGuardTest, AClaimOnAGpuTheJobHasNotOpenedClosesItsConnection) {
  const std::string answer = send_raw_and_listen(
      socket_, {encoded(zico::proto::Hello{0, "stray-claim"}), encoded(zico::proto::OpenGpu{uuid_, 0}),
                encoded(Mark{1, {{0, 4, 2}, {5, 4, 2}}})});
  EXPECT_EQ(answer, "IterationMark claims GPU 5, which the job has not opened");
}

TEST_F(GateGuardTest, AHeldStartGoesAfterOneSecondRegardless) {
  RawJob a(socket_);
  RawJob b(socket_);
  ASSERT_NO_FATAL_FAILURE(open_learning_pair(a, b));
  // A never reaches its gate: a claim (or its absence) can be wrong, so B's
  // wait is bounded (Ledger::kMaxGateBlockNs).
  const auto marked = Clock::now();
  ASSERT_TRUE(b.send(Mark{1}));
  EXPECT_FALSE(b.await<Proceed>(800ms).has_value());
  ASSERT_TRUE(b.await<Proceed>(2000ms).has_value());
  const auto waited = Clock::now() - marked;
  EXPECT_GE(waited, 1000ms);
  EXPECT_LT(waited, 1500ms);
}

// With --turns on, a job whose iteration cannot fit beside another's rest
// gets the GPU while the other waits its turn suspended at its gate.
// Budget 64 MiB in 2 MiB chunks: 32.
TEST_F(NodeManager, TurnsSuspendTheJobInTheWayAtItsGateAndResumeIt) {
  start_daemon(64 * kMiB, {"--turns", "on"});
  RawJob a(socket_);
  RawJob b(socket_);
  ASSERT_EQ(b.open(sim_gpu_uuid(), "in-the-way"), 2 * kMiB);
  ASSERT_EQ(a.open(sim_gpu_uuid(), "starved"), 2 * kMiB);
  // B runs iterations that hold 4 chunks throughout.
  ASSERT_TRUE(b.send(zico::proto::Request{1, 0, 4, 4, 4}));
  const auto b_chunks = b.await<zico::proto::Grant>(2000ms);
  ASSERT_TRUE(b_chunks.has_value());
  ASSERT_TRUE(b.send(Mark{1, {{0, 4, 4}}}));
  ASSERT_TRUE(b.await<Proceed>(2000ms).has_value());
  // A rests at 20 and its next iteration peaks at 30: 30 + B's 4 > 32.
  ASSERT_TRUE(a.send(zico::proto::Request{1, 0, 20, 20, 20}));
  ASSERT_TRUE(a.await<zico::proto::Grant>(2000ms).has_value());
  ASSERT_TRUE(a.send(Mark{1, {{0, 30, 20}}}));
  EXPECT_FALSE(a.await<Proceed>(200ms).has_value()) << "started though it cannot fit beside B's rest";
  // B at its gate is in A's way: it is told to suspend, not to proceed.
  ASSERT_TRUE(b.send(Mark{2, {{0, 4, 4}}}));
  const auto suspend = b.await<zico::proto::Suspend>(2000ms);
  ASSERT_TRUE(suspend.has_value()) << daemon_.output();
  EXPECT_EQ(suspend->to, zico::proto::StoreKind::kHost);
  EXPECT_FALSE(a.await<Proceed>(30ms).has_value()) << "A waits for B's memory";
  // B gives everything back and reports itself suspended: A starts.
  ASSERT_TRUE(b.send(zico::proto::Return{0, false, 0, b_chunks->ids}));
  ASSERT_TRUE(b.send(zico::proto::JobState{zico::proto::JobRunState::kSuspended}));
  const auto started = a.await<Proceed>(2000ms);
  ASSERT_TRUE(started.has_value());
  EXPECT_EQ(started->sequence, 1u);
  // B's turn comes (fifty times as long as it took to give back): it is
  // resumed, and its gate, not opened while it was out, opens in its turn.
  ASSERT_TRUE(b.await<zico::proto::Resume>(10000ms).has_value()) << daemon_.output();
  const auto b_starts = b.await<Proceed>(2000ms);
  ASSERT_TRUE(b_starts.has_value());
  EXPECT_EQ(b_starts->sequence, 2u);
  ASSERT_TRUE(b.send(zico::proto::JobState{zico::proto::JobRunState::kRunning}));
  zico::proto::StatusReply status;
  ASSERT_TRUE(query_status(socket_, &status));
  EXPECT_EQ(status.gpus[0].deadlocks, 0u);
  EXPECT_NE(daemon_.output().find("waits its turn in host memory"), std::string::npos) << daemon_.output();
}

TEST_F(NodeManager, AnotherProcessCannotTakeOverAJobAfterARestart) {
  start_daemon(64 * kMiB);
  Child& job = start_job(1, 1'000'000, 16 * kMiB, 8 * kMiB, 5);
  ASSERT_TRUE(wait_for_job(job.pid, 8 * kMiB, 5000ms)) << job.output();
  zico::proto::StatusReply status;
  ASSERT_TRUE(query_status(socket_, &status));
  const uint64_t id = status.jobs.at(0).id;
  job.kill(SIGSTOP);  // it cannot reconnect before we try
  daemon_.kill(SIGKILL);
  daemon_.wait();
  start_daemon(64 * kMiB);
  const std::string answer = send_raw_and_listen(socket_, {encoded(zico::proto::Hello{id, "impostor"})});
  EXPECT_NE(answer.find("still registered"), std::string::npos) << answer;
  job.kill(SIGCONT);
  job.kill(SIGKILL);
}

}  // namespace

int main(int argc, char** argv) { return zico_test::run_node_tests(argc, argv); }
