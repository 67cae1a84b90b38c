#include "daemon_impl.h"

#include <arpa/inet.h>
#include <grp.h>
#include <netinet/in.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <fcntl.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "log.h"
#include "sizes.h"

namespace zico::sharing {

void Daemon::Impl::arm_timer(int timer_fd, uint64_t at_ns) {
  itimerspec when{};  // all zero: disarmed
  if (at_ns != UINT64_MAX) {
    const uint64_t at = std::max<uint64_t>(at_ns, 1);  // an absolute 0 would disarm
    when.it_value.tv_sec = static_cast<time_t>(at / 1'000'000'000);
    when.it_value.tv_nsec = static_cast<long>(at % 1'000'000'000);
  }
  (void)::timerfd_settime(timer_fd, TFD_TIMER_ABSTIME, &when, nullptr);
}

int Daemon::Impl::open_pidfd(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  errno = ENOSYS;
  return -1;
#endif
}

int Daemon::Impl::send_signal(int pidfd, int signal) {
#ifdef SYS_pidfd_send_signal
  return static_cast<int>(::syscall(SYS_pidfd_send_signal, pidfd, signal, nullptr, 0));
#else
  (void)pidfd;
  (void)signal;
  errno = ENOSYS;
  return -1;
#endif
}

bool Daemon::Impl::process_exited(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

bool Daemon::Impl::in_group(uid_t uid, gid_t primary, gid_t group) {
  if (group == static_cast<gid_t>(-1)) return false;
  if (primary == group) return true;
  passwd pw{};
  passwd* found = nullptr;
  std::vector<char> buffer(16384);
  if (::getpwuid_r(uid, &pw, buffer.data(), buffer.size(), &found) != 0 || found == nullptr) return false;
  int count = 64;
  std::vector<gid_t> groups(static_cast<size_t>(count));
  if (::getgrouplist(pw.pw_name, primary, groups.data(), &count) < 0) {
    groups.resize(static_cast<size_t>(count));
    if (::getgrouplist(pw.pw_name, primary, groups.data(), &count) < 0) return false;
  }
  groups.resize(static_cast<size_t>(count));
  return std::find(groups.begin(), groups.end(), group) != groups.end();
}

// --- setup ----------------------------------------------------------------------

void Daemon::Impl::watch(int fd) const {
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.fd = fd;
  (void)::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &event);
}

void Daemon::Impl::unwatch(int fd) const { (void)::epoll_ctl(epoll_fd, EPOLL_CTL_DEL, fd, nullptr); }

Status Daemon::Impl::setup(std::string* why) {
  if (options.gpus.empty()) {
    *why = "no GPU to manage";
    return Status(Errc::kInvalidArgument);
  }
  for (const DaemonGpuConfig& config : options.gpus) {
    Capabilities caps;
    if (Status status = driver.capabilities(config.device, &caps); !status.is_ok()) {
      *why = "GPU " + std::to_string(config.device.value) + ": " + status.message();
      return status;
    }
    if (!caps.virtual_memory) {
      *why = "GPU " + std::to_string(config.device.value) +
             " does not support CUDA virtual memory management (some vGPU and MIG setups), which lending chunks needs";
      return Status(Errc::kNotSupported);
    }
    if (!caps.posix_fd_export) {
      *why = "GPU " + std::to_string(config.device.value) +
             " cannot export memory as POSIX file descriptors, which lending chunks to processes needs";
      return Status(Errc::kNotSupported);
    }
    Gpu gpu;
    gpu.device = config.device;
    gpu.uuid = caps.uuid;
    gpu.chunk_bytes = options.chunk_bytes != 0 ? options.chunk_bytes : caps.granularity;
    if (gpu.chunk_bytes % caps.granularity != 0 || !std::has_single_bit(gpu.chunk_bytes)) {
      *why = "chunk size " + format_size(gpu.chunk_bytes) + " must be a power of two and a multiple of GPU " +
             std::to_string(config.device.value) + "'s granularity " + format_size(caps.granularity);
      return Status(Errc::kInvalidArgument);
    }
    const uint64_t budget = config.budget_bytes != 0 ? config.budget_bytes : caps.total_memory;
    gpu.total_memory = caps.total_memory;
    if (budget > caps.total_memory) {
      *why = "budget " + format_size(budget) + " of GPU " + std::to_string(config.device.value) + " is more than its " +
             format_size(caps.total_memory) + " of memory";
      return Status(Errc::kInvalidArgument);
    }
    if (budget < gpu.chunk_bytes) {
      *why = "budget " + format_size(budget) + " of GPU " + std::to_string(config.device.value) +
             " is less than one chunk (" + format_size(gpu.chunk_bytes) + ")";
      return Status(Errc::kInvalidArgument);
    }
    if (Status status = driver.reserve(gpu.device, gpu.chunk_bytes, 0, &gpu.scratch); !status.is_ok()) {
      *why = "reserving addresses on GPU " + std::to_string(config.device.value) + ": " + status.message();
      return status;
    }
    (void)ledger.add_gpu(budget / gpu.chunk_bytes, gpu.chunk_bytes);
    gates.add_gpu(budget / gpu.chunk_bytes * gpu.chunk_bytes);
    gpus.push_back(std::move(gpu));
    events.gpus.emplace_back();
  }
  listen_fd = wire::listen_unix(options.socket_path, options.socket_mode, options.socket_group, why);
  if (listen_fd < 0) return Status(Errc::kOsError, errno);
  epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
  timer_fd = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  gate_timer_fd = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  look_timer_fd = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  int pipe_fds[2];
  if (epoll_fd < 0 || timer_fd < 0 || gate_timer_fd < 0 || look_timer_fd < 0 ||
      ::pipe2(pipe_fds, O_NONBLOCK | O_CLOEXEC) != 0) {
    *why = std::string("epoll/timerfd/pipe: ") + std::strerror(errno);
    return Status(Errc::kOsError, errno);
  }
  stop_fd = pipe_fds[0];
  stop_write = pipe_fds[1];
  itimerspec tick{};
  tick.it_interval.tv_nsec = static_cast<long>(kTickNs);
  tick.it_value.tv_nsec = static_cast<long>(kTickNs);
  (void)::timerfd_settime(timer_fd, 0, &tick, nullptr);
  watch(listen_fd);
  watch(timer_fd);
  watch(gate_timer_fd);
  watch(look_timer_fd);
  watch(stop_fd);
  ZICO_RETURN_IF_ERROR(load_state(why));
  return setup_metrics(why);
}

Status Daemon::Impl::setup_metrics(std::string* why) {
  if (options.metrics_address.empty()) return Status::ok();
  ZICO_RETURN_IF_ERROR(MetricsServer::create(options.metrics_address, &metrics, why));
  metrics->publish(render_metrics(status(), events));
  return Status::ok();
}

void Daemon::Impl::publish_metrics(const proto::StatusReply& now_status, uint64_t now) {
  if (metrics == nullptr || (!metrics->wants_snapshot() && now < next_metrics_ns)) return;
  metrics->publish(render_metrics(now_status, events));
  next_metrics_ns = now + kMetricsEveryNs;
}

int Daemon::Impl::gpu_of(const proto::GpuUuid& uuid) const {
  for (size_t i = 0; i < gpus.size(); ++i) {
    if (gpus[i].uuid == uuid) return static_cast<int>(i);
  }
  return -1;
}

bool Daemon::Impl::is_admin(const wire::PeerCredentials& peer) const {
  return peer.uid == 0 || peer.uid == ::getuid() || in_group(peer.uid, peer.gid, options.admin_group);
}

// --- Daemon ---------------------------------------------------------------------------------

Daemon::Daemon(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Status Daemon::create(Driver& driver, const DaemonOptions& options, std::unique_ptr<Daemon>* out, std::string* why) {
  try {
    LedgerOptions ledger_options;
    ledger_options.deadlock_policy = options.deadlock_policy;
    // Turns only with --turns: off, jobs that cannot run side by side meet
    // in mid-iteration and the deadlock rule decides.
    ledger_options.park_between = options.time_shift && options.turns;
    auto impl = std::make_unique<Impl>(driver, options, ledger_options);
    std::unique_ptr<Daemon> daemon(new Daemon(std::move(impl)));
    ZICO_RETURN_IF_ERROR(daemon->impl_->setup(why));
    *out = std::move(daemon);
    return Status::ok();
  } catch (const std::bad_alloc&) {
    *why = "out of host memory";
    return Status(Errc::kOutOfMemory);
  }
}

Daemon::~Daemon() {
  Impl& d = *impl_;
  for (auto& [fd, connection] : d.connections) ::close(fd);
  for (auto& [id, job] : d.jobs) {
    if (job.pidfd >= 0) ::close(job.pidfd);
  }
  for (auto& [id, entry] : d.lapsed) ::close(entry.pidfd);
  // Chunks lent to live jobs stay alive in their mappings; our handles go.
  for (Impl::Gpu& gpu : d.gpus) {
    for (const Impl::PoolChunk& chunk : gpu.chunks) {
      if (chunk.handle.valid()) (void)d.driver.release(chunk.handle);
    }
    if (gpu.has_stream) (void)d.driver.stream_destroy(gpu.stream);
    (void)d.driver.unreserve(gpu.scratch);
  }
  for (int fd : {d.listen_fd, d.epoll_fd, d.timer_fd, d.gate_timer_fd, d.look_timer_fd, d.signal_fd, d.stop_fd,
                 d.stop_write,
                 }) {
    if (fd >= 0) ::close(fd);
  }
  if (d.listen_fd >= 0) ::unlink(d.options.socket_path.c_str());
}

void Daemon::stop() {
  const char byte = 1;
  (void)!::write(impl_->stop_write, &byte, 1);
}

uint16_t Daemon::metrics_port() const { return impl_->metrics == nullptr ? 0 : impl_->metrics->port(); }

Status Daemon::run(bool handle_signals) {
  Impl& d = *impl_;
  if (handle_signals) {
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    (void)::pthread_sigmask(SIG_BLOCK, &mask, nullptr);
    d.signal_fd = ::signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    if (d.signal_fd >= 0) d.watch(d.signal_fd);
  }
  (void)::signal(SIGPIPE, SIG_IGN);
  ZICO_LOG(kInfo, "zico-umd serving %zu GPU(s) on %s", d.gpus.size(), d.options.socket_path.c_str());
  epoll_event events[64];
  for (;;) {
    const int ready = ::epoll_wait(d.epoll_fd, events, 64, -1);
    if (ready < 0) {
      if (errno == EINTR) continue;
      return Status(Errc::kOsError, errno);
    }
    for (int i = 0; i < ready; ++i) {
      const int fd = events[i].data.fd;
      if (fd == d.stop_fd || fd == d.signal_fd) {
        ZICO_LOG(kInfo, "zico-umd stopping; jobs keep what they hold");
        return Status::ok();
      }
      if (fd == d.listen_fd) {
        d.accept_connections();
      } else if (fd == d.timer_fd) {
        uint64_t expirations = 0;
        (void)!::read(d.timer_fd, &expirations, sizeof expirations);
        const uint64_t now = Impl::now_ns();
        const proto::StatusReply now_status = d.status();
        d.publish_metrics(now_status, now);
        d.expire_idle_connections(now);
        d.expire_expected();
        d.audit(Impl::now_ns());
        d.look_at_unchecked_returns(Impl::now_ns());
        d.pump();
        d.open_gates();
      } else if (fd == d.look_timer_fd) {
        uint64_t expirations = 0;
        (void)!::read(d.look_timer_fd, &expirations, sizeof expirations);
        d.look_at_unchecked_returns(Impl::now_ns());
        d.pump();
      } else if (fd == d.gate_timer_fd) {
        uint64_t expirations = 0;
        (void)!::read(d.gate_timer_fd, &expirations, sizeof expirations);
        d.open_gates();
      } else if (d.pidfd_jobs.contains(fd)) {
        d.on_process_exit(fd);
      } else {
        try {
          if ((events[i].events & EPOLLOUT) != 0) d.on_writable(fd);
          if ((events[i].events & ~static_cast<uint32_t>(EPOLLOUT)) != 0) d.on_readable(fd);
        } catch (const std::bad_alloc&) {
          // One job's message must not take the node down with it.
          d.close_connection(fd, "out of memory serving it", true);
        }
      }
    }
  }
}

}  // namespace zico::sharing
