#include "demo_node.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <sstream>
#include <string_view>

#include "protocol.h"
#include "wire.h"

extern char** environ;

namespace zico::demo {
namespace {

using namespace std::chrono_literals;

constexpr auto kSampleInterval = 10ms;
constexpr int kAnswerTimeoutMs = 2000;

// One StatusQuery on `fd`; false when the daemon does not answer properly.
bool ask_status(int fd, proto::StatusReply* out, std::string* why) {
  if (!wire::send_message(fd, proto::StatusQuery{}, {}, why)) return false;
  pollfd ready{fd, POLLIN, 0};
  int rc = 0;
  do {
    rc = ::poll(&ready, 1, kAnswerTimeoutMs);
  } while (rc < 0 && errno == EINTR);
  if (rc <= 0) {
    *why = rc == 0 ? "no answer within 2 s" : std::strerror(errno);
    return false;
  }
  proto::Message reply;
  std::vector<int> fds;
  const wire::Received got = wire::receive_message(fd, &reply, &fds, why);
  for (const int extra : fds) ::close(extra);
  if (got != wire::Received::kMessage) {
    if (got == wire::Received::kClosed) *why = "the daemon closed the connection";
    return false;
  }
  if (auto* status = std::get_if<proto::StatusReply>(&reply)) {
    *out = std::move(*status);
    return true;
  }
  *why = std::string("unexpected answer ") + proto::to_string(proto::type_of(reply));
  return false;
}

void kill_and_reap(ChildProcess* child, int signal) {
  if (child->pid <= 0 || child->exited) return;
  ::kill(child->pid, signal);
  int status = 0;
  while (::waitpid(child->pid, &status, 0) < 0 && errno == EINTR) {
  }
  child->exited = true;
  child->wait_status = status;
  child->ended = Clock::now();
}

}  // namespace

bool ChildProcess::succeeded() const { return exited && WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0; }

std::string ChildProcess::how_it_ended() const {
  if (!exited) return "still running";
  if (WIFEXITED(wait_status)) return "exit status " + std::to_string(WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) return "killed by signal " + std::to_string(WTERMSIG(wait_status));
  return "ended (status " + std::to_string(wait_status) + ")";
}

DemoNode::DemoNode(std::string dir, std::vector<std::string> env)
    : dir_(std::move(dir)), env_(std::move(env)), socket_(dir_ + "/umd.sock") {}

DemoNode::~DemoNode() {
  stop_sampling();
  kill_jobs();
  if (daemon_.pid > 0 && !daemon_.exited) {
    std::string ignored;
    (void)stop_daemon(&ignored);
  }
}

bool DemoNode::spawn(ChildProcess* child, const std::vector<std::string>& args, const std::vector<std::string>& env,
                     std::string* why) {
  // Built before fork: the child only calls async-signal-safe functions.
  // Later entries win: the node's variables over the demo's environment,
  // the job's over the node's.
  std::vector<std::string> overrides = env_;
  overrides.insert(overrides.end(), env.begin(), env.end());
  const auto name_of = [](std::string_view entry) { return entry.substr(0, entry.find('=')); };
  std::vector<std::string> environment;
  for (char** e = environ; *e != nullptr; ++e) environment.emplace_back(*e);
  environment.insert(environment.end(), overrides.begin(), overrides.end());
  for (size_t i = 0; i < environment.size(); ++i) {
    for (size_t later = i + 1; later < environment.size(); ++later) {
      if (name_of(environment[i]) == name_of(environment[later])) {
        environment[i].clear();
        break;
      }
    }
  }
  std::erase_if(environment, [](const std::string& e) { return e.empty(); });
  std::vector<char*> envp;
  for (std::string& e : environment) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_storage = args;
  std::vector<char*> argv;
  for (std::string& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);

  const int out = ::open(child->out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  const int err = ::open(child->err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (out < 0 || err < 0) {
    *why = "cannot create " + child->out_path + ": " + std::strerror(errno);
    if (out >= 0) ::close(out);
    if (err >= 0) ::close(err);
    return false;
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    *why = std::string("fork: ") + std::strerror(errno);
    ::close(out);
    ::close(err);
    return false;
  }
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    // The demo's own signal dispositions must not leak into the children.
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::dup2(out, 1);
    ::dup2(err, 2);
    ::execve(argv[0], argv.data(), envp.data());
    const char message[] = "zico-demo: exec failed\n";
    (void)!::write(2, message, sizeof message - 1);
    ::_exit(127);
  }
  ::close(out);
  ::close(err);
  child->pid = pid;
  child->started = Clock::now();
  return true;
}

bool DemoNode::start_daemon(const std::string& program, const std::vector<std::string>& args, std::string* why) {
  daemon_ = ChildProcess{};
  daemon_.name = "zico-umd";
  daemon_.out_path = dir_ + "/umd.out";
  daemon_.err_path = dir_ + "/umd.log";
  std::vector<std::string> argv = {program, "--socket", socket_, "--state-file", dir_ + "/umd.state"};
  argv.insert(argv.end(), args.begin(), args.end());
  if (!spawn(&daemon_, argv, {}, why)) return false;
  for (const auto deadline = Clock::now() + 10s; Clock::now() < deadline; std::this_thread::sleep_for(5ms)) {
    int status = 0;
    if (::waitpid(daemon_.pid, &status, WNOHANG) == daemon_.pid) {
      daemon_.exited = true;
      daemon_.wait_status = status;
      *why = "zico-umd " + daemon_.how_it_ended() + ":\n" + file_tail(daemon_.err_path, 10);
      return false;
    }
    std::string ignored;
    const int fd = wire::connect_unix(socket_, &ignored);
    if (fd < 0) continue;
    proto::StatusReply reply;
    const bool answered = ask_status(fd, &reply, &ignored);
    ::close(fd);
    if (answered) return true;
  }
  *why = "zico-umd did not answer on " + socket_ + " within 10 s:\n" + file_tail(daemon_.err_path, 10);
  return false;
}

bool DemoNode::stop_daemon(std::string* why) {
  if (daemon_.pid <= 0 || daemon_.exited) return true;
  ::kill(daemon_.pid, SIGTERM);
  for (const auto deadline = Clock::now() + 5s; Clock::now() < deadline; std::this_thread::sleep_for(2ms)) {
    int status = 0;
    if (::waitpid(daemon_.pid, &status, WNOHANG) == daemon_.pid) {
      daemon_.exited = true;
      daemon_.wait_status = status;
      daemon_.ended = Clock::now();
      if (daemon_.succeeded()) return true;
      *why = "zico-umd " + daemon_.how_it_ended() + ":\n" + file_tail(daemon_.err_path, 10);
      return false;
    }
  }
  kill_and_reap(&daemon_, SIGKILL);
  *why = "zico-umd did not stop within 5 s of SIGTERM";
  return false;
}

bool DemoNode::start_job(const std::string& name, const std::vector<std::string>& args,
                         const std::vector<std::string>& env, std::string* why) {
  ChildProcess job;
  job.name = name;
  const std::string base = dir_ + "/job" + std::to_string(jobs_.size()) + "-" + name;
  job.out_path = base + ".out";
  job.err_path = base + ".log";
  std::vector<std::string> environment = {"ZICO_SOCKET=" + socket_};
  environment.insert(environment.end(), env.begin(), env.end());
  if (!spawn(&job, args, environment, why)) return false;
  jobs_.push_back(std::move(job));
  return true;
}

std::vector<size_t> DemoNode::reap_jobs() {
  std::vector<size_t> done;
  for (size_t i = 0; i < jobs_.size(); ++i) {
    ChildProcess& job = jobs_[i];
    if (job.exited) continue;
    int status = 0;
    if (::waitpid(job.pid, &status, WNOHANG) == job.pid) {
      job.exited = true;
      job.wait_status = status;
      job.ended = Clock::now();
      done.push_back(i);
    }
  }
  return done;
}

bool DemoNode::all_jobs_exited() const {
  for (const ChildProcess& job : jobs_) {
    if (!job.exited) return false;
  }
  return true;
}

void DemoNode::kill_jobs() {
  for (ChildProcess& job : jobs_) kill_and_reap(&job, SIGKILL);
}

void DemoNode::start_sampling() {
  stop_sampling();
  samples_.clear();
  epoch_ = Clock::now();
  sampling_ = true;
  sampler_ = std::thread([this] { sample_loop(); });
}

void DemoNode::stop_sampling() {
  sampling_ = false;
  if (sampler_.joinable()) sampler_.join();
}

std::string DemoNode::sampler_error() const {
  std::lock_guard lock(samples_mutex_);
  return sampler_error_;
}

void DemoNode::sample_loop() {
  int fd = -1;
  auto next = Clock::now();
  while (sampling_) {
    std::string why;
    if (fd < 0) fd = wire::connect_unix(socket_, &why);
    proto::StatusReply reply;
    const Clock::time_point asked = Clock::now();
    if (fd >= 0 && ask_status(fd, &reply, &why)) {
      NodeSample sample;
      sample.time_ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(asked - epoch_).count());
      if (!reply.gpus.empty()) {
        sample.budget_bytes = reply.gpus[0].budget_bytes;
        sample.granted_bytes = reply.gpus[0].granted_bytes;
        sample.waiting_bytes = reply.gpus[0].waiting_bytes;
        sample.deadlocks = reply.gpus[0].deadlocks;
      }
      for (const proto::JobStatus& job : reply.jobs) {
        if (job.gpu == 0) sample.held.emplace_back(job.pid, job.granted_bytes);
      }
      std::lock_guard lock(samples_mutex_);
      samples_.push_back(std::move(sample));
    } else {
      if (fd >= 0) ::close(fd);
      fd = -1;
      std::lock_guard lock(samples_mutex_);
      sampler_error_ = why;
    }
    next += kSampleInterval;
    const auto now = Clock::now();
    if (next < now) next = now;
    std::this_thread::sleep_until(next);
  }
  if (fd >= 0) ::close(fd);
}

std::string file_tail(const std::string& path, size_t max_lines) {
  std::ifstream in(path);
  std::deque<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    lines.push_back(line);
    if (lines.size() > max_lines) lines.pop_front();
  }
  std::string text;
  for (const std::string& line : lines) text += "  " + line + "\n";
  return text;
}

}  // namespace zico::demo
