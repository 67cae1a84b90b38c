// What the node-manager tests share: child processes with their output in a
// file, the daemon's status, raw protocol clients, and a fixture that starts
// zico-umd and node_job processes in a private folder.
#pragma once

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "protocol.h"
#include "sim_driver.h"
#include "wire.h"

namespace zico_test {

// The programs under test, from the command line.
inline std::string g_umd;
inline std::string g_job;
inline std::string g_umctl;

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr uint64_t kMiB = uint64_t{1} << 20;

// A child process with its output in a file.
struct Child {
  pid_t pid = -1;
  std::string log;
  int status = -1;

  bool running() const { return pid > 0 && status == -1; }
  // Whether it has ended, without waiting (its status kept if so).
  bool exited() {
    if (pid > 0 && status == -1) {
      int raw = 0;
      if (::waitpid(pid, &raw, WNOHANG) == pid) status = raw;
    }
    return status != -1;
  }
  // Waits for it; true when it exited with code 0.
  int wait() {
    if (pid > 0 && status == -1) {
      int raw = 0;
      (void)::waitpid(pid, &raw, 0);
      status = raw;
    }
    return status;
  }
  bool succeeded() { return WIFEXITED(wait()) && WEXITSTATUS(status) == 0; }
  std::string output() const {
    std::ifstream in(log);
    std::stringstream text;
    text << in.rdbuf();
    if (status != -1 && WIFSIGNALED(status)) text << "[killed by signal " << WTERMSIG(status) << "]\n";
    if (status != -1 && WIFEXITED(status)) text << "[exit status " << WEXITSTATUS(status) << "]\n";
    return text.str();
  }
  void kill(int signal) const {
    if (pid > 0 && status == -1) ::kill(pid, signal);
  }
};

// As user `uid` when it is not -1 (the caller must be root).
inline Child spawn(const std::vector<std::string>& args, const std::vector<std::string>& env, const std::string& log,
                   uid_t uid = static_cast<uid_t>(-1)) {
  Child child;
  child.log = log;
  child.pid = ::fork();
  if (child.pid == 0) {
    const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    ::dup2(out, 1);
    ::dup2(out, 2);
    if (uid != static_cast<uid_t>(-1) &&
        (::setgroups(0, nullptr) != 0 || ::setresgid(uid, uid, uid) != 0 || ::setresuid(uid, uid, uid) != 0)) {
      std::_Exit(126);
    }
    for (const std::string& e : env) ::putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    std::_Exit(127);
  }
  return child;
}

inline bool query_status(const std::string& socket_path, zico::proto::StatusReply* out) {
  std::string why;
  const int fd = zico::wire::connect_unix(socket_path, &why);
  if (fd < 0) return false;
  bool ok = zico::wire::send_message(fd, zico::proto::StatusQuery{}, {}, &why);
  zico::proto::Message reply;
  std::vector<int> fds;
  ok = ok && zico::wire::receive_message(fd, &reply, &fds, &why) == zico::wire::Received::kMessage;
  ::close(fd);
  if (!ok || !std::holds_alternative<zico::proto::StatusReply>(reply)) return false;
  *out = std::get<zico::proto::StatusReply>(reply);
  return true;
}

// Samples the daemon's status until stopped: every sample must keep granted
// within the budget.
class Sampler {
 public:
  explicit Sampler(std::string socket_path) : socket_(std::move(socket_path)) {
    thread_ = std::thread([this] { run(); });
  }
  ~Sampler() { stop(); }
  void stop() {
    stopping_ = true;
    if (thread_.joinable()) thread_.join();
  }
  uint64_t samples() const { return samples_; }
  uint64_t violations() const { return violations_; }
  uint64_t max_granted() const { return max_granted_; }
  uint64_t max_waiting() const { return max_waiting_; }
  std::string first_violation() const {
    std::lock_guard lock(mutex_);
    return first_violation_;
  }

 private:
  void run() {
    while (!stopping_) {
      zico::proto::StatusReply status;
      if (query_status(socket_, &status) && !status.gpus.empty()) {
        ++samples_;
        const auto& gpu = status.gpus[0];
        uint64_t held = 0;
        for (const auto& job : status.jobs) held += job.granted_bytes;
        max_granted_ = std::max<uint64_t>(max_granted_, gpu.granted_bytes);
        max_waiting_ = std::max<uint64_t>(max_waiting_, gpu.waiting_bytes);
        if (gpu.granted_bytes > gpu.budget_bytes || held != gpu.granted_bytes) {
          ++violations_;
          std::lock_guard lock(mutex_);
          if (first_violation_.empty()) {
            first_violation_ = "granted " + std::to_string(gpu.granted_bytes) + " budget " +
                               std::to_string(gpu.budget_bytes) + " sum of jobs " + std::to_string(held);
          }
        }
      }
      std::this_thread::sleep_for(2ms);
    }
  }

  std::string socket_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> samples_{0};
  std::atomic<uint64_t> violations_{0};
  std::atomic<uint64_t> max_granted_{0};
  std::atomic<uint64_t> max_waiting_{0};
  mutable std::mutex mutex_;
  std::string first_violation_;
};

class NodeManager : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("zicoum-node-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    socket_ = (dir_ / "umd.sock").string();
  }
  void TearDown() override {
    for (Child& job : jobs_) {
      job.kill(SIGKILL);
      job.wait();
    }
    daemon_.kill(SIGTERM);
    daemon_.wait();
    if (!HasFailure()) std::filesystem::remove_all(dir_);
  }

  void start_daemon(uint64_t budget, const std::vector<std::string>& extra = {},
                    const std::vector<std::string>& env = {}) {
    std::vector<std::string> args = {g_umd, "--socket", socket_, "--budget", std::to_string(budget)};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<std::string> environment = {"ZICO_BACKEND=sim"};
    environment.insert(environment.end(), env.begin(), env.end());
    daemon_ = spawn(args, environment, (dir_ / "umd.log").string());
    for (auto deadline = Clock::now() + 5s; Clock::now() < deadline; std::this_thread::sleep_for(5ms)) {
      zico::proto::StatusReply status;
      if (query_status(socket_, &status)) return;
    }
    FAIL() << "zico-umd did not come up:\n" << daemon_.output();
  }

  Child& start_job(uint64_t seed, long iterations, uint64_t peak, uint64_t persistent, long pause_ms,
                   const std::vector<std::string>& env = {}, const std::vector<std::string>& extra_args = {},
                   uid_t uid = static_cast<uid_t>(-1)) {
    std::vector<std::string> environment = {"ZICO_BACKEND=sim", "ZICO_SOCKET=" + socket_, "ZICO_WAIT_TIMEOUT=60s",
                                            "ZICO_SWAP_DIR=" + (dir_ / "swap").string()};
    environment.insert(environment.end(), env.begin(), env.end());
    std::vector<std::string> args = {g_job, "--seed", std::to_string(seed), "--iterations", std::to_string(iterations),
                                     "--peak", std::to_string(peak), "--persistent", std::to_string(persistent),
                                     "--pause-ms", std::to_string(pause_ms)};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    jobs_.push_back(spawn(args, environment, (dir_ / ("job" + std::to_string(seed) + ".log")).string(), uid));
    return jobs_.back();
  }

  // Waits until the daemon lists the job of `pid` (registered and holding memory).
  bool wait_for_job(pid_t pid, uint64_t min_granted, std::chrono::milliseconds limit) {
    for (auto deadline = Clock::now() + limit; Clock::now() < deadline; std::this_thread::sleep_for(2ms)) {
      zico::proto::StatusReply status;
      if (!query_status(socket_, &status)) continue;
      for (const auto& job : status.jobs) {
        if (static_cast<pid_t>(job.pid) == pid && job.granted_bytes >= min_granted) return true;
      }
    }
    return false;
  }

  std::filesystem::path dir_;
  std::string socket_;
  Child daemon_;
  std::deque<Child> jobs_;  // references stay valid as jobs are added
};

// Sends raw bytes as one datagram and reports how the daemon answered: the
// text of its Goodbye, or "" if it only closed the connection.
inline std::string send_raw_and_listen(const std::string& socket_path, const std::vector<std::vector<uint8_t>>& datagrams) {
  std::string why;
  const int fd = zico::wire::connect_unix(socket_path, &why);
  if (fd < 0) return "connect failed: " + why;
  for (const auto& datagram : datagrams) (void)::send(fd, datagram.data(), datagram.size(), MSG_NOSIGNAL);
  std::string answer = "(still open)";
  for (int i = 0; i < 8; ++i) {
    zico::proto::Message message;
    std::vector<int> fds;
    const auto got = zico::wire::receive_message(fd, &message, &fds, &why);
    for (int f : fds) ::close(f);
    if (got == zico::wire::Received::kClosed) {
      if (answer == "(still open)") answer = "";
      break;
    }
    if (got != zico::wire::Received::kMessage) break;
    if (const auto* bye = std::get_if<zico::proto::Goodbye>(&message)) answer = bye->reason;
  }
  ::close(fd);
  return answer;
}

inline std::vector<uint8_t> encoded(const zico::proto::Message& message) {
  std::vector<uint8_t> bytes;
  std::string why;
  EXPECT_TRUE(zico::proto::encode(message, &bytes, &why)) << why;
  return bytes;
}

// A job that speaks the protocol itself, so that the test decides what it
// claims and when it reaches its iteration gate.
class RawJob {
 public:
  explicit RawJob(const std::string& socket_path) {
    std::string why;
    fd_ = zico::wire::connect_unix(socket_path, &why);
    EXPECT_GE(fd_, 0) << why;
  }
  ~RawJob() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawJob(const RawJob&) = delete;
  RawJob& operator=(const RawJob&) = delete;

  bool send(const zico::proto::Message& message) {
    std::string why;
    const bool sent = fd_ >= 0 && zico::wire::send_message(fd_, message, {}, &why);
    EXPECT_TRUE(sent) << zico::proto::to_string(zico::proto::type_of(message)) << ": " << why;
    return sent;
  }
  // The next message of type T within `limit`, skipping the others (their
  // descriptors closed); nullopt on timeout or a closed connection.
  template <class T>
  std::optional<T> await(std::chrono::milliseconds limit) {
    const auto deadline = Clock::now() + limit;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      pollfd readable{fd_, POLLIN, 0};
      if (left < 0 || ::poll(&readable, 1, static_cast<int>(left)) <= 0) return std::nullopt;
      zico::proto::Message message;
      std::vector<int> fds;
      std::string why;
      const auto got = zico::wire::receive_message(fd_, &message, &fds, &why);
      for (int f : fds) ::close(f);
      if (got != zico::wire::Received::kMessage) return std::nullopt;
      if (const auto* wanted = std::get_if<T>(&message)) return *wanted;
    }
  }
  // Registers and opens the GPU; its chunk size, 0 on failure.
  uint64_t open(const zico::proto::GpuUuid& uuid, const std::string& name) {
    if (!send(zico::proto::Hello{0, name}) || !await<zico::proto::Welcome>(2000ms)) return 0;
    if (!send(zico::proto::OpenGpu{uuid, 0})) return 0;
    const auto opened = await<zico::proto::GpuOpened>(2000ms);
    return opened ? opened->chunk_bytes : 0;
  }

 private:
  int fd_ = -1;
};

// The UUID of SimDriver's GPU 0, the one zico-umd serves on the sim backend.
inline zico::proto::GpuUuid sim_gpu_uuid() {
  zico::SimDriver sim;
  zico::Capabilities caps;
  EXPECT_TRUE(sim.capabilities(zico::DeviceId{0}, &caps).is_ok());
  return caps.uuid;
}

// main() of a node-manager test program: PROGRAM ZICO_UMD NODE_JOB ZICO_UMCTL.
inline int run_node_tests(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s ZICO_UMD NODE_JOB ZICO_UMCTL\n", argv[0]);
    return 64;
  }
  g_umd = argv[1];
  g_job = argv[2];
  g_umctl = argv[3];
  return RUN_ALL_TESTS();
}

}  // namespace zico_test
