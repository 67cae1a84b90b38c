// DemoNode: the node zico-demo runs for one phase. One zico-umd and the job
// processes (trace_job) that borrow memory from it, all children of the demo,
// sharing a private directory (socket, state file, logs), and a sampler
// thread that asks the daemon for its status every 10 ms on one connection,
// so the demo records what each job holds over time without shelling out.
//
// Children get PR_SET_PDEATHSIG, so they die with the demo even if it is
// killed; the destructor kills whatever still runs (jobs with SIGKILL, the
// daemon with SIGTERM then SIGKILL).
//
// Threads: the sampler thread only appends to its own sample vector (under
// samples_mutex_); everything else runs on the caller's thread.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace zico::demo {

using Clock = std::chrono::steady_clock;

struct ChildProcess {
  std::string name;
  pid_t pid = -1;
  std::string out_path;  // stdout
  std::string err_path;  // stderr
  bool exited = false;
  int wait_status = 0;   // from waitpid, once exited
  Clock::time_point started{};
  Clock::time_point ended{};

  [[nodiscard]] bool succeeded() const;
  // "exit status 1" / "killed by signal 9".
  [[nodiscard]] std::string how_it_ended() const;
};

// One status reply, reduced to what the demo plots and checks.
struct NodeSample {
  uint64_t time_ns = 0;  // since the node's epoch
  uint64_t budget_bytes = 0;
  uint64_t granted_bytes = 0;
  uint64_t waiting_bytes = 0;
  uint64_t deadlocks = 0;
  std::vector<std::pair<uint32_t, uint64_t>> held;  // (pid, bytes granted to it)
};

class DemoNode {
 public:
  // `dir`: an existing private directory. `env`: NAME=VALUE added to the
  // environment of the daemon and of every job.
  DemoNode(std::string dir, std::vector<std::string> env);
  ~DemoNode();
  DemoNode(const DemoNode&) = delete;
  DemoNode& operator=(const DemoNode&) = delete;

  [[nodiscard]] const std::string& socket_path() const { return socket_; }
  [[nodiscard]] Clock::time_point epoch() const { return epoch_; }

  // Starts zico-umd with --socket and --state-file in the directory plus
  // `args`, and waits (up to 10 s) until it answers a status query.
  [[nodiscard]] bool start_daemon(const std::string& program, const std::vector<std::string>& args, std::string* why);
  // SIGTERM, then waits up to 5 s (SIGKILL after that). False if it did not
  // exit cleanly (*why says how it ended).
  [[nodiscard]] bool stop_daemon(std::string* why);
  [[nodiscard]] const ChildProcess& daemon() const { return daemon_; }

  // Starts a job with ZICO_SOCKET set to the daemon's socket, and `env` on top.
  [[nodiscard]] bool start_job(const std::string& name, const std::vector<std::string>& args,
                               const std::vector<std::string>& env, std::string* why);
  [[nodiscard]] const std::vector<ChildProcess>& jobs() const { return jobs_; }
  // Reaps the jobs that exited, without blocking; returns their indices.
  std::vector<size_t> reap_jobs();
  [[nodiscard]] bool all_jobs_exited() const;
  void kill_jobs();

  // Samples from now until stop_sampling(); the epoch is reset here.
  void start_sampling();
  void stop_sampling();
  // Valid after stop_sampling().
  [[nodiscard]] const std::vector<NodeSample>& samples() const { return samples_; }
  // The last status query failure, if the sampler could not reach the daemon.
  [[nodiscard]] std::string sampler_error() const;

 private:
  [[nodiscard]] bool spawn(ChildProcess* child, const std::vector<std::string>& args,
                           const std::vector<std::string>& env, std::string* why);
  void sample_loop();

  std::string dir_;
  std::vector<std::string> env_;
  std::string socket_;
  ChildProcess daemon_;
  std::vector<ChildProcess> jobs_;
  Clock::time_point epoch_ = Clock::now();

  std::thread sampler_;
  std::atomic<bool> sampling_{false};
  mutable std::mutex samples_mutex_;
  std::vector<NodeSample> samples_;  // guarded by samples_mutex_ while sampling
  std::string sampler_error_;        // guarded by samples_mutex_
};

// The last `max_lines` lines of a file, for error messages.
[[nodiscard]] std::string file_tail(const std::string& path, size_t max_lines);

}  // namespace zico::demo
