// zico-umd between users who do not trust each other, on SimDriver with real
// processes: a job of another uid is a forked child that drops to `nobody`
// and speaks the protocol itself, so it can do what libzicoum never does
// (keep a chunk mapped after giving it back). Tests that need a second uid
// skip where this process cannot switch users (not root).
//
//   multi_tenant_test ZICO_UMD NODE_JOB ZICO_UMCTL
#include <arpa/inet.h>
#include <grp.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <thread>

#include "node_harness.h"

namespace {

using namespace zico_test;

constexpr uid_t kNobody = 65534;

bool can_switch_users() { return ::geteuid() == 0; }

// Drops this (forked) process to `uid` for good.
bool become(uid_t uid) {
  return ::setgroups(0, nullptr) == 0 && ::setresgid(uid, uid, uid) == 0 && ::setresuid(uid, uid, uid) == 0;
}

// One byte through a pipe, within `limit`; false on timeout or end of file.
bool read_byte(int fd, char* byte, std::chrono::milliseconds limit) {
  pollfd readable{fd, POLLIN, 0};
  return ::poll(&readable, 1, static_cast<int>(limit.count())) == 1 && ::read(fd, byte, 1) == 1;
}

// A job that borrows `chunks` chunks, maps them, fills them with `fill`,
// gives them back by id and closes its descriptors, but keeps the mappings.
// Runs in a forked child; exits with a code, never returns.
class Keeper {
 public:
  // What the child reports on its result pipe, one byte each.
  static constexpr char kKept = 'K';         // gave the chunks back, still maps them
  static constexpr char kUntouched = 'U';    // its mappings still hold its own bytes
  static constexpr char kChanged = 'C';      // someone else's bytes showed up in them
  static constexpr char kDenied = 'D';       // its next request was refused
  static constexpr char kServed = 'S';       // its next request was served

  [[noreturn]] static void run(const std::string& socket_path, uid_t uid, uint32_t chunks, uint8_t fill, int go_fd,
                               int result_fd) {
    if (uid != ::getuid() && !become(uid)) std::_Exit(10);
    std::string why;
    const int fd = zico::wire::connect_unix(socket_path, &why);
    if (fd < 0) std::_Exit(11);
    const auto next = [&](zico::proto::Message* message, std::vector<int>* fds) {
      pollfd readable{fd, POLLIN, 0};
      return ::poll(&readable, 1, 5000) == 1 &&
             zico::wire::receive_message(fd, message, fds, &why) == zico::wire::Received::kMessage;
    };
    zico::proto::Message message;
    std::vector<int> fds;
    if (!zico::wire::send_message(fd, zico::proto::Hello{0, "keeper"}, {}, &why) || !next(&message, &fds)) std::_Exit(12);
    if (!zico::wire::send_message(fd, zico::proto::OpenGpu{sim_gpu_uuid(), 0}, {}, &why) || !next(&message, &fds)) {
      std::_Exit(13);
    }
    const auto* opened = std::get_if<zico::proto::GpuOpened>(&message);
    if (opened == nullptr) std::_Exit(14);
    const uint64_t chunk_bytes = opened->chunk_bytes;
    if (!zico::wire::send_message(fd, zico::proto::Request{1, 0, chunks}, {}, &why)) std::_Exit(15);
    std::vector<uint32_t> ids;
    std::vector<uint8_t*> maps;
    while (ids.size() < chunks) {
      fds.clear();
      if (!next(&message, &fds)) std::_Exit(16);
      const auto* grant = std::get_if<zico::proto::Grant>(&message);
      if (grant == nullptr) continue;
      for (size_t i = 0; i < grant->ids.size(); ++i) {
        void* p = ::mmap(nullptr, chunk_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[i], 0);
        if (p == MAP_FAILED) std::_Exit(17);
        std::memset(p, fill, chunk_bytes);
        maps.push_back(static_cast<uint8_t*>(p));
        ids.push_back(grant->ids[i]);
        ::close(fds[i]);
      }
    }
    zico::proto::Return give_back;
    give_back.gpu = 0;
    give_back.ids = ids;
    if (!zico::wire::send_message(fd, give_back, {}, &why)) std::_Exit(18);
    (void)!::write(result_fd, &kKept, 1);
    char go = 0;
    if (!read_byte(go_fd, &go, 120s)) std::_Exit(19);
    // Whatever the chunks' next borrower wrote must not show here...
    bool changed = false;
    for (uint8_t* p : maps) {
      for (uint64_t i = 0; i < chunk_bytes; ++i) changed |= p[i] != fill;
    }
    (void)!::write(result_fd, changed ? &kChanged : &kUntouched, 1);
    // ...nor what is written here show there.
    for (uint8_t* p : maps) std::memset(p, 0x66, chunk_bytes);
    // And, its excess seen by now, it gets no more.
    if (!zico::wire::send_message(fd, zico::proto::Request{2, 0, 1}, {}, &why)) std::_Exit(20);
    for (;;) {
      fds.clear();
      if (!next(&message, &fds)) std::_Exit(21);
      if (std::holds_alternative<zico::proto::Deny>(message)) {
        (void)!::write(result_fd, &kDenied, 1);
        break;
      }
      if (std::holds_alternative<zico::proto::Grant>(message)) {
        (void)!::write(result_fd, &kServed, 1);
        break;
      }
    }
    (void)read_byte(go_fd, &go, 30s);  // until the test is done with it
    std::_Exit(0);
  }
};

// What SimDriver sees the process hold of GPU 0 (its chunks' memfds).
uint64_t sim_memory_of(pid_t pid) {
  zico::SimDriver sim;
  uint64_t bytes = 0;
  EXPECT_TRUE(sim.process_memory(pid, zico::DeviceId{0}, &bytes).is_ok());
  return bytes;
}

// The physical memory of the simulated GPU 0 that a set of processes maps or
// keeps descriptors of, each chunk counted once however many map it (its
// memfd's inode), sampled every few milliseconds until stopped.
class PhysicalSampler {
 public:
  explicit PhysicalSampler(std::vector<pid_t> pids) : pids_(std::move(pids)) {
    thread_ = std::thread([this] {
      while (!stopping_) {
        sample();
        std::this_thread::sleep_for(5ms);
      }
    });
  }
  ~PhysicalSampler() { stop(); }
  void stop() {
    stopping_ = true;
    if (thread_.joinable()) thread_.join();
  }
  [[nodiscard]] uint64_t max_bytes() const { return max_bytes_; }
  [[nodiscard]] uint64_t samples() const { return samples_; }

 private:
  void sample() {
    static const std::string kName = "/memfd:zicoum-sim-chunk-0 ";
    std::map<uint64_t, uint64_t> chunks;  // inode -> bytes
    for (pid_t pid : pids_) {
      const std::string proc = "/proc/" + std::to_string(pid);
      std::ifstream maps(proc + "/maps");
      for (std::string line; std::getline(maps, line);) {
        unsigned long long start = 0, end = 0, inode = 0;
        int path_at = 0;
        if (std::sscanf(line.c_str(), "%llx-%llx %*s %*s %*s %llu %n", &start, &end, &inode, &path_at) < 3) continue;
        if (line.compare(static_cast<size_t>(path_at), kName.size(), kName) != 0) continue;
        chunks[inode] = std::max<uint64_t>(chunks[inode], end - start);
      }
      std::error_code error;
      for (const auto& entry : std::filesystem::directory_iterator(proc + "/fd", error)) {
        std::error_code link_error;
        const std::string target = std::filesystem::read_symlink(entry.path(), link_error).string();
        struct stat st {};
        if (link_error || target.rfind(kName, 0) != 0 || ::stat(entry.path().c_str(), &st) != 0) continue;
        chunks[st.st_ino] = std::max<uint64_t>(chunks[st.st_ino], static_cast<uint64_t>(st.st_size));
      }
    }
    uint64_t bytes = 0;
    for (const auto& [inode, size] : chunks) bytes += size;
    max_bytes_ = std::max<uint64_t>(max_bytes_, bytes);
    ++samples_;
  }

  std::vector<pid_t> pids_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> max_bytes_{0};
  std::atomic<uint64_t> samples_{0};
};

class MultiTenant : public NodeManager {
 protected:
  // Forks a child that runs `body` (it must not return) with its ends of
  // two pipes: one it reads for the test's go, one it writes its results to;
  // *go and *result are the test's ends.
  pid_t start_child(const std::function<void(int go_fd, int result_fd)>& body, int* go, int* result) {
    int go_pipe[2];
    int result_pipe[2];
    EXPECT_EQ(::pipe(go_pipe), 0);
    EXPECT_EQ(::pipe(result_pipe), 0);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(go_pipe[1]);
      ::close(result_pipe[0]);
      body(go_pipe[0], result_pipe[1]);
      std::_Exit(0);
    }
    ::close(go_pipe[0]);
    ::close(result_pipe[1]);
    *go = go_pipe[1];
    *result = result_pipe[0];
    keepers_.push_back(pid);
    return pid;
  }

  // Forks a Keeper.
  pid_t start_keeper(uid_t uid, uint32_t chunks, uint8_t fill, int* go, int* result) {
    return start_child([&](int go_fd, int result_fd) { Keeper::run(socket_, uid, chunks, fill, go_fd, result_fd); },
                       go, result);
  }

  // Forks a job that registers, opens GPU 0 and holds `bytes` of memory it
  // made itself, named like the daemon's chunks; it writes 'R' on its result
  // pipe once it holds them, then waits for a byte on *go.
  pid_t start_look_alike(uint64_t bytes, int* go, int* result) {
    return start_child([&](int go_fd, int result_fd) {
      const int memory = ::memfd_create("zicoum-sim-chunk-0", MFD_CLOEXEC);
      if (memory < 0 || ::ftruncate(memory, static_cast<off_t>(bytes)) != 0) std::_Exit(10);
      void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memory, 0);
      if (p == MAP_FAILED) std::_Exit(11);
      std::memset(p, 0x5a, bytes);
      std::string why;
      const int fd = zico::wire::connect_unix(socket_, &why);
      zico::proto::Message message;
      std::vector<int> fds;
      const auto next = [&] {
        pollfd readable{fd, POLLIN, 0};
        return ::poll(&readable, 1, 5000) == 1 &&
               zico::wire::receive_message(fd, &message, &fds, &why) == zico::wire::Received::kMessage;
      };
      if (fd < 0 || !zico::wire::send_message(fd, zico::proto::Hello{0, "look-alike"}, {}, &why) || !next() ||
          !zico::wire::send_message(fd, zico::proto::OpenGpu{sim_gpu_uuid(), 0}, {}, &why) || !next()) {
        std::_Exit(12);
      }
      (void)!::write(result_fd, "R", 1);
      char byte = 0;
      (void)read_byte(go_fd, &byte, 60s);
    }, go, result);
  }

  // What the daemon says job `pid` holds (granted plus charged), or -1.
  int64_t held_by(pid_t pid) {
    zico::proto::StatusReply status;
    if (!query_status(socket_, &status)) return -1;
    for (const auto& job : status.jobs) {
      if (static_cast<pid_t>(job.pid) == pid) return static_cast<int64_t>(job.granted_bytes);
    }
    return -1;
  }

  void TearDown() override {
    for (pid_t pid : keepers_) {
      ::kill(pid, SIGKILL);
      (void)::waitpid(pid, nullptr, 0);
    }
    NodeManager::TearDown();
  }

  std::vector<pid_t> keepers_;
};

TEST_F(MultiTenant, MemoryKeptAfterGivingItBackNeverSeesAnotherUsersData) {
  if (!can_switch_users()) GTEST_SKIP() << "needs root to run a job as another user";
  start_daemon(16 * kMiB, {"--mode", "0666"});
  int go = -1;
  int result = -1;
  const pid_t keeper = start_keeper(kNobody, 4, 0xEE, &go, &result);
  char byte = 0;
  ASSERT_TRUE(read_byte(result, &byte, 10s)) << daemon_.output();
  ASSERT_EQ(byte, Keeper::kKept);
  // The daemon sees that the keeper still holds what it gave back, and
  // counts it: its 8 MiB stay charged to it.
  bool charged = false;
  for (auto deadline = Clock::now() + 5s; !charged && Clock::now() < deadline; std::this_thread::sleep_for(20ms)) {
    charged = held_by(keeper) == static_cast<int64_t>(8 * kMiB);
  }
  EXPECT_TRUE(charged) << "held " << held_by(keeper) << "\n" << daemon_.output();
  // Root's job takes the other 8 MiB and keeps verifying its data while the
  // keeper reads and scribbles over what it kept.
  Child& victim = start_job(1, 30, 8 * kMiB, 0, 20, {}, {"--block", "2MiB"});
  ASSERT_TRUE(wait_for_job(victim.pid, 8 * kMiB, 5000ms)) << victim.output();
  ASSERT_EQ(::write(go, "g", 1), 1);
  ASSERT_TRUE(read_byte(result, &byte, 10s));
  EXPECT_EQ(byte, Keeper::kUntouched) << "another user's bytes showed up in memory the keeper gave back";
  ASSERT_TRUE(read_byte(result, &byte, 10s));
  EXPECT_EQ(byte, Keeper::kDenied) << "a job holding more than it was lent got more";
  EXPECT_TRUE(victim.succeeded()) << victim.output();
  ASSERT_EQ(::write(go, "g", 1), 1);
  const std::string log = daemon_.output();
  EXPECT_NE(log.find("beyond the 0 B it was lent"), std::string::npos) << log;
  ::close(go);
  ::close(result);
}

TEST_F(MultiTenant, BlindToKeptMemoryStillNoUserSeesAnothersData) {
  if (!can_switch_users()) GTEST_SKIP() << "needs root to run a job as another user";
  // As on CUDA: the daemon cannot see which chunks a process still maps, so
  // what the keeper gives back goes to the pool at once; lent to another
  // uid, it must be other memory.
  start_daemon(16 * kMiB, {"--mode", "0666"}, {"ZICO_SIM_PROCESS_MEMORY=off"});
  if (HasFatalFailure()) return;
  int go = -1;
  int result = -1;
  start_keeper(kNobody, 4, 0xEE, &go, &result);
  char byte = 0;
  ASSERT_TRUE(read_byte(result, &byte, 10s)) << daemon_.output();
  ASSERT_EQ(byte, Keeper::kKept);
  Child& victim = start_job(1, 10, 8 * kMiB, 0, 20, {}, {"--block", "2MiB"});
  ASSERT_TRUE(wait_for_job(victim.pid, 8 * kMiB, 5000ms)) << victim.output();
  ASSERT_EQ(::write(go, "g", 1), 1);
  ASSERT_TRUE(read_byte(result, &byte, 10s));
  EXPECT_EQ(byte, Keeper::kUntouched) << "another user's bytes showed up in memory the keeper gave back";
  EXPECT_TRUE(victim.succeeded()) << victim.output();
  ::close(go);  // the keeper may be gone by now (its next request found no room): no write
  ::close(result);
}

TEST_F(MultiTenant, LookAlikeMemoryIsChargedNoMoreThanTheJobsMaximumAllows) {
  start_daemon(16 * kMiB);
  int go = -1;
  int result = -1;
  // 8 MiB of memory the process made itself, named like the daemon's chunks:
  // the audit cannot tell it from chunks kept after a return.
  const pid_t faker = start_look_alike(8 * kMiB, &go, &result);
  char byte = 0;
  ASSERT_TRUE(read_byte(result, &byte, 10s)) << daemon_.output();
  ASSERT_EQ(byte, 'R');
  const auto held_becomes = [&](uint64_t bytes) {
    for (auto deadline = Clock::now() + 5s; Clock::now() < deadline; std::this_thread::sleep_for(20ms)) {
      if (held_by(faker) == static_cast<int64_t>(bytes)) return true;
    }
    return false;
  };
  ASSERT_TRUE(held_becomes(8 * kMiB)) << "held " << held_by(faker) << "\n" << daemon_.output();
  // Capped at 4 MiB, it could never have asked for more: the rest of what it
  // holds is not the budget's to count.
  zico::proto::StatusReply status;
  ASSERT_TRUE(query_status(socket_, &status));
  const auto job = std::find_if(status.jobs.begin(), status.jobs.end(),
                                [&](const auto& entry) { return static_cast<pid_t>(entry.pid) == faker; });
  ASSERT_NE(job, status.jobs.end());
  Child cap = spawn({g_umctl, "budget", "set", "--job", std::to_string(job->id), "--max", "4MiB", "--socket", socket_},
                    {}, (dir_ / "cap.log").string());
  ASSERT_TRUE(cap.succeeded()) << cap.output();
  EXPECT_TRUE(held_becomes(4 * kMiB)) << "held " << held_by(faker) << "\n" << daemon_.output();
  ::close(go);
  ::close(result);
}

TEST_F(MultiTenant, ChunksAJobStillMapsAreNeverLentAgainWhileItMapsThem) {
  if (!can_switch_users()) GTEST_SKIP() << "needs root to run a job as another user";
  start_daemon(16 * kMiB, {"--mode", "0666"});
  // Two jobs whose peaks take the whole budget between them, one of them
  // waiting for memory at most times; then another user's job borrows 8 MiB
  // (taken back from theirs), gives it back at once and keeps mapping it. Had
  // those chunks gone back to the pool, the waiting job would be lent them
  // (as new chunks: another uid) at once: 24 MiB of a 16 MiB GPU mapped
  // until the next audit. With 8 MiB kept, a job may wait out the whole run
  // for its peak: its wait outlasts the run.
  const std::vector<std::string> patient = {"ZICO_WAIT_TIMEOUT=300s"};
  Child& first = start_job(1, 1'000'000, 8 * kMiB, 2 * kMiB, 2, patient);
  Child& second = start_job(2, 1'000'000, 8 * kMiB, 2 * kMiB, 2, patient);
  ASSERT_TRUE(wait_for_job(first.pid, 2 * kMiB, 5000ms)) << first.output();
  ASSERT_TRUE(wait_for_job(second.pid, 2 * kMiB, 5000ms)) << second.output();
  int go = -1;
  int result = -1;
  const pid_t keeper = start_keeper(kNobody, 4, 0xEE, &go, &result);
  PhysicalSampler physical({keeper, first.pid, second.pid});
  Sampler books(socket_);
  char byte = 0;
  ASSERT_TRUE(read_byte(result, &byte, 20s)) << daemon_.output();
  ASSERT_EQ(byte, Keeper::kKept);
  constexpr auto kRun = 60s;
  for (auto until = Clock::now() + kRun; Clock::now() < until && !first.exited() && !second.exited();) {
    std::this_thread::sleep_for(100ms);
  }
  physical.stop();
  books.stop();
  EXPECT_FALSE(first.exited() || second.exited()) << first.output() << second.output() << daemon_.output();
  EXPECT_LE(physical.max_bytes(), 16 * kMiB) << "the jobs mapped more physical memory than the budget at once\n"
                                             << daemon_.output();
  EXPECT_GT(physical.samples(), 100u);
  EXPECT_EQ(books.violations(), 0u) << books.first_violation();
  // The keeper was charged for what it kept from the moment it gave it back.
  EXPECT_EQ(held_by(keeper), static_cast<int64_t>(8 * kMiB));
  ASSERT_EQ(::write(go, "g", 1), 1);
  ASSERT_TRUE(read_byte(result, &byte, 10s));
  EXPECT_EQ(byte, Keeper::kUntouched) << "another user's bytes showed up in memory the keeper gave back";
  ASSERT_TRUE(read_byte(result, &byte, 10s));
  EXPECT_EQ(byte, Keeper::kDenied) << "a job holding more than it was lent got more";
  ASSERT_EQ(::write(go, "g", 1), 1);
  ::close(go);
  ::close(result);
}

TEST_F(MultiTenant, AForgedUmRegistrationBooksNoMoreThanTheBudgetHasFree) {
  start_daemon(64 * kMiB);
  Child& job = start_job(1, 1'000'000, 32 * kMiB, 32 * kMiB, 5);
  ASSERT_TRUE(wait_for_job(job.pid, 32 * kMiB, 5000ms)) << job.output();
  // It says it is UM job 777 of an earlier daemon with 32 chunks (64 MiB) on
  // the GPU; nobody reserved that id, and its pages cannot be looked at.
  RawJob forger(socket_);
  ASSERT_TRUE(forger.send(zico::proto::Hello{777, "forger"}));
  ASSERT_TRUE(forger.await<zico::proto::Welcome>(2000ms));
  ASSERT_TRUE(forger.send(zico::proto::OpenGpu{sim_gpu_uuid(), 32, true}));
  ASSERT_TRUE(forger.await<zico::proto::GpuOpened>(2000ms));
  // Booked what the budget has free, and told to page the rest out.
  const auto reclaim = forger.await<zico::proto::Reclaim>(2000ms);
  ASSERT_TRUE(reclaim.has_value()) << daemon_.output();
  EXPECT_EQ(reclaim->chunks, 16u);
  zico::proto::StatusReply status;
  ASSERT_TRUE(query_status(socket_, &status));
  EXPECT_LE(status.gpus.at(0).granted_bytes, status.gpus.at(0).budget_bytes) << "the books went past the budget";
  for (const auto& entry : status.jobs) {
    if (entry.id == 777) {
      EXPECT_EQ(entry.granted_bytes, 32 * kMiB) << "the forger's claim was booked past what was free";
    }
  }
  EXPECT_FALSE(job.exited()) << job.output();
}

TEST_F(MultiTenant, AKeeperIsKilledWhenThePolicySaysKill) {
  start_daemon(16 * kMiB, {"--on-overuse", "kill"});
  int go = -1;
  int result = -1;
  const pid_t keeper = start_keeper(::getuid(), 2, 0xEE, &go, &result);
  // On a loaded machine the audit can kill it before it reports what it
  // kept (the pipe then closes empty); either way it must end killed.
  char byte = 0;
  if (read_byte(result, &byte, 10s)) {
    EXPECT_EQ(byte, Keeper::kKept);
  }
  int status = 0;
  pid_t waited = 0;
  for (auto deadline = Clock::now() + 5s; waited == 0 && Clock::now() < deadline; std::this_thread::sleep_for(20ms)) {
    waited = ::waitpid(keeper, &status, WNOHANG);
  }
  keepers_.clear();
  ASSERT_EQ(waited, keeper) << "the keeper still runs\n" << daemon_.output();
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  // Gone, nothing of it stays counted.
  zico::proto::StatusReply after;
  for (auto deadline = Clock::now() + 2s; Clock::now() < deadline; std::this_thread::sleep_for(10ms)) {
    if (query_status(socket_, &after) && after.jobs.empty()) break;
  }
  EXPECT_TRUE(after.jobs.empty());
  EXPECT_EQ(after.gpus.at(0).granted_bytes, 0u);
  ::close(go);
  ::close(result);
}

TEST_F(MultiTenant, HonestJobsOfTwoUsersShareChunksWithoutEverBeingCharged) {
  if (!can_switch_users()) GTEST_SKIP() << "needs root to run a job as another user";
  start_daemon(32 * kMiB, {"--mode", "0666"});
  Sampler sampler(socket_);
  // Two users' jobs whose peaks (24 MiB each) do not fit together: memory
  // moves between them every iteration, afresh each time it changes hands.
  start_job(1, 20, 24 * kMiB, 4 * kMiB, 2);
  start_job(2, 20, 24 * kMiB, 4 * kMiB, 2, {}, {}, kNobody);
  for (Child& job : jobs_) EXPECT_TRUE(job.succeeded()) << job.output();
  sampler.stop();
  EXPECT_EQ(sampler.violations(), 0u) << sampler.first_violation();
  const std::string log = daemon_.output();
  EXPECT_EQ(log.find("beyond the"), std::string::npos) << log;
}

TEST_F(MultiTenant, AJobWaitsForASlowDaemonInsteadOfRunningOutsideTheBudget) {
  start_daemon(16 * kMiB);
  daemon_.kill(SIGSTOP);  // as busy as a daemon zeroing gigabytes, or one whose metrics port is flooded
  Child& job = start_job(1, 5, 8 * kMiB, 4 * kMiB, 1, {"ZICO_WAIT_TIMEOUT=20s"});
  std::this_thread::sleep_for(3s);  // past the 2 s after which a job used to run standalone
  EXPECT_EQ(sim_memory_of(job.pid), 0u) << "the job took memory the daemon never lent\n" << job.output();
  daemon_.kill(SIGCONT);
  EXPECT_TRUE(job.succeeded()) << job.output();
  EXPECT_EQ(job.output().find("standalone"), std::string::npos) << job.output();
  EXPECT_NE(daemon_.output().find("registered"), std::string::npos) << daemon_.output();
}

TEST_F(MultiTenant, AJobTheDaemonDoesNotAnswerGetsNoMemoryAndSaysWhy) {
  start_daemon(16 * kMiB);
  daemon_.kill(SIGSTOP);
  Child& job = start_job(1, 5, 8 * kMiB, 4 * kMiB, 1, {"ZICO_WAIT_TIMEOUT=1s"});
  EXPECT_TRUE(WIFEXITED(job.wait()) && WEXITSTATUS(job.status) == 2) << job.output();  // node_job: 2 = OOM
  const std::string output = job.output();
  EXPECT_NE(output.find("cannot register with zico-umd"), std::string::npos) << output;
  EXPECT_NE(output.find("did not answer"), std::string::npos) << output;
  daemon_.kill(SIGCONT);
}

// One allocation call waits one ZICO_WAIT_TIMEOUT in all: the first one
// registers the job (the runtime's first use), then tries again, then would
// open the GPU and borrow; each used to take a whole timeout of its own.
TEST_F(MultiTenant, AJobTheDaemonDoesNotAnswerWaitsOneTimeoutPerAllocation) {
  start_daemon(16 * kMiB);
  daemon_.kill(SIGSTOP);
  Child& job = start_job(1, 5, 8 * kMiB, 4 * kMiB, 1, {"ZICO_WAIT_TIMEOUT=2s"});
  const bool out_of_memory = WIFEXITED(job.wait()) && WEXITSTATUS(job.status) == 2;
  daemon_.kill(SIGCONT);
  ASSERT_TRUE(out_of_memory) << job.output();  // node_job: 2 = OOM
  const std::string output = job.output();
  const size_t after = output.find(" after ");
  ASSERT_NE(after, std::string::npos) << output;
  const double seconds = std::strtod(output.c_str() + after + 7, nullptr);
  // Wide margins: a loaded machine stretches the wait, never shortens it.
  EXPECT_GE(seconds, 1.9) << output;
  EXPECT_LT(seconds, 3.5) << "the first allocation waited more than one ZICO_WAIT_TIMEOUT (2 s)\n" << output;
}

TEST_F(MultiTenant, OwnersMayLowerTheirLimitsButNotRaiseTheirMinimumOrLiftAnAdminsCap) {
  if (!can_switch_users()) GTEST_SKIP() << "needs root to run a job as another user";
  start_daemon(32 * kMiB, {"--mode", "0666"});
  Child& job = start_job(1, 1'000'000, 8 * kMiB, 4 * kMiB, 5, {}, {}, kNobody);
  ASSERT_TRUE(wait_for_job(job.pid, 4 * kMiB, 5000ms)) << job.output();
  zico::proto::StatusReply status;
  ASSERT_TRUE(query_status(socket_, &status));
  const std::string id = std::to_string(status.jobs.at(0).id);
  const auto umctl = [&](uid_t uid, std::vector<std::string> args) {
    args.insert(args.begin(), {g_umctl, "budget", "set", "--job", id});
    args.insert(args.end(), {"--socket", socket_});
    Child run = spawn(args, {}, (dir_ / ("umctl" + std::to_string(uid) + ".log")).string(), uid);
    const bool ok = run.succeeded();
    return std::pair{ok, run.output()};
  };
  const uid_t root = 0;
  auto [ok, text] = umctl(kNobody, {"--min", "16MiB"});
  EXPECT_FALSE(ok) << "an owner reserved memory for its job: " << text;
  EXPECT_NE(text.find("permission denied"), std::string::npos) << text;
  std::tie(ok, text) = umctl(root, {"--max", "16MiB", "--min", "4MiB"});
  EXPECT_TRUE(ok) << text;
  std::tie(ok, text) = umctl(kNobody, {"--max", "unlimited"});
  EXPECT_FALSE(ok) << "an owner lifted an admin's cap: " << text;
  EXPECT_NE(text.find("capped"), std::string::npos) << text;
  std::tie(ok, text) = umctl(kNobody, {"--max", "12MiB"});
  EXPECT_TRUE(ok) << "an owner could not lower its maximum: " << text;
  std::tie(ok, text) = umctl(kNobody, {"--max", "16MiB"});
  EXPECT_TRUE(ok) << "an owner could not restore the maximum the admin allowed: " << text;
  std::tie(ok, text) = umctl(kNobody, {"--max", "20MiB"});
  EXPECT_FALSE(ok) << "an owner lifted an admin's cap: " << text;
  std::tie(ok, text) = umctl(kNobody, {"--min", "2MiB"});
  EXPECT_TRUE(ok) << "an owner could not lower its minimum: " << text;
  std::tie(ok, text) = umctl(kNobody, {"--min", "4MiB"});
  EXPECT_TRUE(ok) << "an owner could not restore what the admin allowed: " << text;
  std::tie(ok, text) = umctl(kNobody, {"--min", "6MiB"});
  EXPECT_FALSE(ok) << text;
}

TEST_F(MultiTenant, AJobThatNoRestartLeftCannotBookMemoryItDoesNotHold) {
  start_daemon(16 * kMiB);
  // It says it is job 777 of an earlier daemon and holds 8 chunks; it holds none.
  RawJob forger(socket_);
  ASSERT_TRUE(forger.send(zico::proto::Hello{777, "forger"}));
  ASSERT_TRUE(forger.await<zico::proto::Welcome>(2000ms));
  ASSERT_TRUE(forger.send(zico::proto::OpenGpu{sim_gpu_uuid(), 8}));
  ASSERT_TRUE(forger.await<zico::proto::GpuOpened>(2000ms));
  zico::proto::StatusReply status;
  ASSERT_TRUE(query_status(socket_, &status));
  ASSERT_EQ(status.jobs.size(), 1u);
  EXPECT_EQ(status.jobs[0].id, 777u);
  EXPECT_EQ(status.gpus.at(0).granted_bytes, 0u) << "the books count chunks nobody holds";
  // And job ids never reach the end of their range, where they would wrap to 0.
  const std::string answer = send_raw_and_listen(socket_, {encoded(zico::proto::Hello{UINT64_MAX - 1, "wrapper"})});
  EXPECT_NE(answer.find("out of range"), std::string::npos) << answer;
  Child& job = start_job(1, 2, 4 * kMiB, 2 * kMiB, 1);
  EXPECT_TRUE(job.succeeded()) << job.output();
}

TEST_F(MultiTenant, TheDaemonRefusesAStateFileSomeoneElsePlanted) {
  // In a shared folder, another user links the state file's name to a file
  // of the daemon's user: the daemon would truncate and overwrite it.
  const std::string precious = (dir_ / "precious").string();
  std::ofstream(precious) << "keep me";
  std::filesystem::create_symlink(precious, socket_ + ".state");
  Child daemon = spawn({g_umd, "--socket", socket_, "--budget", "16MiB"}, {"ZICO_BACKEND=sim"},
                       (dir_ / "refused.log").string());
  EXPECT_TRUE(WIFEXITED(daemon.wait()) && WEXITSTATUS(daemon.status) == 1) << daemon.output();
  EXPECT_NE(daemon.output().find("is a symbolic link"), std::string::npos) << daemon.output();
  std::ifstream in(precious);
  std::string text;
  std::getline(in, text);
  EXPECT_EQ(text, "keep me");
}

TEST_F(MultiTenant, TheDaemonRefusesAStateFileOthersCouldReachOrWrite) {
  // The daemon's own file, but reachable under another name (a hard link
  // someone made in a shared folder), writable by others, or another user's:
  // writing it would change a file it does not own alone.
  const auto refused = [&](const std::string& name, const std::string& expected) {
    const std::string state = (dir_ / name).string();
    Child daemon = spawn({g_umd, "--socket", socket_, "--budget", "16MiB", "--state-file", state},
                         {"ZICO_BACKEND=sim"}, (dir_ / (name + ".log")).string());
    // A daemon that took the file would serve on: it is stopped, and fails the test.
    siginfo_t info{};
    for (auto deadline = Clock::now() + 10s; info.si_pid == 0 && Clock::now() < deadline;
         std::this_thread::sleep_for(10ms)) {
      (void)::waitid(P_PID, static_cast<id_t>(daemon.pid), &info, WEXITED | WNOHANG | WNOWAIT);
    }
    daemon.kill(SIGKILL);
    EXPECT_TRUE(WIFEXITED(daemon.wait()) && WEXITSTATUS(daemon.status) == 1) << name << "\n" << daemon.output();
    EXPECT_NE(daemon.output().find("is not safe to write"), std::string::npos) << daemon.output();
    EXPECT_NE(daemon.output().find(expected), std::string::npos) << daemon.output();
    std::stringstream text;
    text << std::ifstream(state).rdbuf();
    EXPECT_TRUE(text.str() == "keep me") << name << " was overwritten: " << text.str().size() << " bytes";
  };
  const auto keep_me = [&](const std::string& name, std::filesystem::perms mode) {
    const std::filesystem::path path = dir_ / name;
    std::ofstream(path) << "keep me";
    std::filesystem::permissions(path, mode);  // whatever the umask
    return path;
  };
  const auto only_mine = std::filesystem::perms::owner_read | std::filesystem::perms::owner_write;
  std::filesystem::create_hard_link(keep_me("precious", only_mine), dir_ / "linked.state");
  refused("linked.state", "2 link(s)");
  (void)keep_me("open.state", static_cast<std::filesystem::perms>(0666));
  refused("open.state", "mode 0666");
  if (can_switch_users()) {
    ASSERT_EQ(::chown(keep_me("theirs.state", only_mine).c_str(), kNobody, kNobody), 0) << std::strerror(errno);
    refused("theirs.state", "uid 65534");
  }
}

TEST_F(MultiTenant, AJobDoesNotTrustADaemonAnotherUserRuns) {
  if (!can_switch_users()) GTEST_SKIP() << "needs root to listen as another user";
  // A world-writable folder, like /tmp: while the real daemon is down,
  // another user binds its own listener at the socket's name.
  const std::filesystem::path shared = dir_ / "shared";
  std::filesystem::create_directories(shared);
  std::filesystem::permissions(shared, std::filesystem::perms::all | std::filesystem::perms::sticky_bit);
  const std::string fake = (shared / "zicoum.sock").string();
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t impostor = ::fork();
  if (impostor == 0) {
    if (!become(kNobody)) std::_Exit(10);
    std::string why;
    const int listener = zico::wire::listen_unix(fake, 0666, static_cast<gid_t>(-1), &why);
    if (listener < 0) std::_Exit(11);
    (void)!::write(ready[1], "r", 1);
    for (;;) {
      pollfd readable{listener, POLLIN, 0};
      if (::poll(&readable, 1, -1) != 1) continue;
      const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) (void)zico::wire::send_message(fd, zico::proto::Welcome{1}, {}, &why);  // then silence
    }
  }
  keepers_.push_back(impostor);
  char byte = 0;
  ASSERT_TRUE(read_byte(ready[0], &byte, 5s));
  Child& job = start_job(1, 2, 4 * kMiB, 2 * kMiB, 1, {"ZICO_SOCKET=" + fake, "ZICO_WAIT_TIMEOUT=1s"});
  EXPECT_TRUE(WIFEXITED(job.wait()) && WEXITSTATUS(job.status) == 2) << job.output();  // node_job: 2 = OOM
  EXPECT_NE(job.output().find("runs as uid 65534, which is not root"), std::string::npos) << job.output();
  ::close(ready[0]);
  ::close(ready[1]);
}

TEST_F(MultiTenant, WhereTheDriverCannotTellALateJobIsBelievedAsFarAsItsLapsedReservation) {
  // As on CUDA today: the daemon cannot see what a process holds.
  const auto start_blind_daemon = [&] { start_daemon(64 * kMiB, {}, {"ZICO_SIM_PROCESS_MEMORY=off"}); };
  start_blind_daemon();
  if (HasFatalFailure()) return;
  Child& job = start_job(1, 1'000'000, 8 * kMiB, 8 * kMiB, 5);
  ASSERT_TRUE(wait_for_job(job.pid, 8 * kMiB, 5000ms)) << job.output();
  job.kill(SIGSTOP);  // away longer than the new daemon keeps its reservation (5 s)
  daemon_.kill(SIGKILL);
  daemon_.wait();
  start_blind_daemon();
  if (HasFatalFailure()) return;
  std::this_thread::sleep_for(5500ms);
  zico::proto::StatusReply status;
  ASSERT_TRUE(query_status(socket_, &status));
  ASSERT_TRUE(status.jobs.empty()) << "the reservation did not lapse";
  // A stranger claiming an id and chunks is believed in nothing.
  RawJob forger(socket_);
  ASSERT_TRUE(forger.send(zico::proto::Hello{4242, "forger"}));
  ASSERT_TRUE(forger.await<zico::proto::Welcome>(2000ms));
  ASSERT_TRUE(forger.send(zico::proto::OpenGpu{sim_gpu_uuid(), 16}));
  ASSERT_TRUE(forger.await<zico::proto::GpuOpened>(2000ms));
  // The job itself comes back late: what its lapsed reservation said counts.
  job.kill(SIGCONT);
  uint64_t held = 0;
  for (auto deadline = Clock::now() + 5s; held < 8 * kMiB && Clock::now() < deadline; std::this_thread::sleep_for(10ms)) {
    if (!query_status(socket_, &status)) continue;
    for (const auto& entry : status.jobs) {
      if (static_cast<pid_t>(entry.pid) == job.pid) held = entry.granted_bytes;
    }
  }
  EXPECT_GE(held, 8 * kMiB) << daemon_.output();
  ASSERT_TRUE(query_status(socket_, &status));
  for (const auto& entry : status.jobs) {
    if (entry.id == 4242) {
      EXPECT_EQ(entry.granted_bytes, 0u) << "the forger's claim was believed";
    }
  }
}

TEST_F(MultiTenant, AStatusClientThatDoesNotReadIsCutOffOnceSixteenAnswersWait) {
  // zico-umctl reads each answer before it asks again, so the daemon keeps
  // few for it; a job's thousands of waiting grants would let any local user
  // pin megabytes of the daemon's memory per connection.
  start_daemon(16 * kMiB);
  std::string why;
  const int fd = zico::wire::connect_unix(socket_, &why);
  ASSERT_GE(fd, 0) << why;
  // Asks until it is cut off: first the socket fills (the daemon gives each
  // connection a large buffer), then answers wait in the daemon.
  constexpr int kQueries = 100'000;
  int sent = 0;
  while (sent < kQueries) {
    if (zico::wire::send_message(fd, zico::proto::StatusQuery{}, {}, &why)) {
      ++sent;
      continue;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK) break;  // cut off
    pollfd writable{fd, POLLOUT, 0};
    if (::poll(&writable, 1, 10'000) != 1) break;
  }
  // What the socket took before the daemon gave up comes first, then the end.
  int answers = 0;
  bool closed = false;
  for (;;) {
    pollfd readable{fd, POLLIN, 0};
    if (::poll(&readable, 1, 10'000) != 1) break;
    zico::proto::Message message;
    std::vector<int> fds;
    const auto got = zico::wire::receive_message(fd, &message, &fds, &why);
    // Closed with our queries still unread, the connection may end in a
    // reset rather than an end of file: either way the daemon cut it off.
    if (got != zico::wire::Received::kMessage) {
      closed = true;
      break;
    }
    ++answers;
  }
  ::close(fd);
  EXPECT_TRUE(closed) << sent << " queries sent, " << answers << " answers read\n" << daemon_.output();
  EXPECT_LT(answers, sent);
  const std::string log = daemon_.output();
  EXPECT_NE(log.find("does not read what it is sent (16 messages wait)"), std::string::npos)
      << sent << " queries sent, " << answers << " answers read\n" << log;
}

// Grant latency as a job sees it: ask for one chunk, take it, give it back.
struct Latency {
  double median_ms = 0;
  double max_ms = 0;
  int grants = 0;
};

Latency measure_grants(const std::string& socket_path, int rounds) {
  RawJob job(socket_path);
  Latency result;
  if (job.open(sim_gpu_uuid(), "probe") == 0) return result;
  std::vector<double> samples;
  for (int i = 1; i <= rounds; ++i) {
    const auto start = Clock::now();
    if (!job.send(zico::proto::Request{static_cast<uint64_t>(i), 0, 1})) break;
    const auto grant = job.await<zico::proto::Grant>(30s);
    if (!grant) break;
    samples.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    zico::proto::Return back;
    back.ids = grant->ids;
    if (!job.send(back)) break;
  }
  std::sort(samples.begin(), samples.end());
  result.grants = static_cast<int>(samples.size());
  if (!samples.empty()) {
    result.median_ms = samples[samples.size() / 2];
    result.max_ms = samples.back();
  }
  return result;
}

// A free TCP port on the loopback, for the daemon's metrics.
uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof addr;
  (void)::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  (void)::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// Grant latency with no attack, then under each attack, from one daemon. The
// figures go to docs/benchmarks.md; the bound asserted here is loose (the
// attacks used to stall grants for seconds) since this machine is shared.
TEST_F(MultiTenant, NoLocalUserDelaysAnotherUsersGrants) {
  if (!can_switch_users()) GTEST_SKIP() << "needs root to attack as another user";
  const uint16_t port = free_port();
  start_daemon(64 * kMiB, {"--mode", "0666", "--metrics", "127.0.0.1:" + std::to_string(port)});
  constexpr int kRounds = 300;
  const Latency quiet = measure_grants(socket_, kRounds);
  ASSERT_EQ(quiet.grants, kRounds);
  std::printf("grant latency, no attack: median %.3f ms, max %.3f ms\n", quiet.median_ms, quiet.max_ms);
  const auto report = [&](const char* attack, const Latency& under) {
    std::printf("grant latency, %s: median %.3f ms (%.2fx), max %.3f ms\n", attack, under.median_ms,
                under.median_ms / quiet.median_ms, under.max_ms);
    EXPECT_EQ(under.grants, kRounds) << attack;
    EXPECT_LT(under.max_ms, 500.0) << attack;
  };
  // 1. Silent connections to the metrics port: anyone on the host can open them.
  {
    std::vector<int> silent;
    for (int i = 0; i < 32; ++i) {
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(port);
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) silent.push_back(fd);
    }
    EXPECT_EQ(silent.size(), 32u);
    report("32 silent metrics connections", measure_grants(socket_, kRounds));
    for (int fd : silent) ::close(fd);
  }
  // 2. Clients of another user that ask for the status and never read the answers.
  {
    const pid_t pid = ::fork();
    if (pid == 0) {
      if (!become(kNobody)) std::_Exit(10);
      std::vector<int> fds;
      std::string why;
      for (int i = 0; i < 4; ++i) fds.push_back(zico::wire::connect_unix(socket_, &why, 1000));
      for (;;) {
        for (int& fd : fds) {
          // Cut off, it comes back for more.
          if (fd < 0 || !zico::wire::send_message(fd, zico::proto::StatusQuery{}, {}, &why)) {
            if (fd >= 0) ::close(fd);
            fd = zico::wire::connect_unix(socket_, &why, 1000);
          }
        }
      }
    }
    keepers_.push_back(pid);
    // Once the daemon has given up on one of them (they keep coming back).
    for (auto deadline = Clock::now() + 10s; Clock::now() < deadline; std::this_thread::sleep_for(50ms)) {
      if (daemon_.output().find("does not read what it is sent") != std::string::npos) break;
    }
    report("4 clients that never read", measure_grants(socket_, kRounds));
  }
  // 3. Another user opens thousands of connections and says nothing; a new
  //    job still registers, runs and ends.
  {
    const pid_t pid = ::fork();
    if (pid == 0) {
      if (!become(kNobody)) std::_Exit(10);
      std::vector<int> fds;
      std::string why;
      for (int i = 0; i < 3000; ++i) {
        const int fd = zico::wire::connect_unix(socket_, &why, 100);
        if (fd >= 0) fds.push_back(fd);
      }
      for (;;) std::this_thread::sleep_for(1s);
    }
    keepers_.push_back(pid);
    std::this_thread::sleep_for(500ms);
    report("3000 idle connections of one user", measure_grants(socket_, kRounds));
    Child& job = start_job(1, 3, 8 * kMiB, 4 * kMiB, 1, {"ZICO_WAIT_TIMEOUT=5s"});
    EXPECT_TRUE(job.succeeded()) << job.output();
  }
  const std::string log = daemon_.output();
  EXPECT_NE(log.find("does not read what it is sent"), std::string::npos) << log;
  EXPECT_NE(log.find("uid 65534 has 128 connections open"), std::string::npos) << log;
}

}  // namespace

int main(int argc, char** argv) { return zico_test::run_node_tests(argc, argv); }
