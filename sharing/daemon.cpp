#include "daemon.h"

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
#include "metrics.h"
#include "metrics_server.h"
#include "outbox.h"
#include "sizes.h"
#include "state_file.h"
#include "wire.h"

namespace zico::sharing {
namespace {

uint64_t now_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

constexpr uint32_t kFreshChunk = UINT32_MAX;  // last_uid of a chunk no job has used yet
constexpr uint64_t kTickNs = 50'000'000;
constexpr size_t kStatusJobs = 128;
constexpr uint64_t kMinCurvePeriodNs = 100'000;  // 100 µs
constexpr uint64_t kMetricsEveryNs = 1'000'000'000;
constexpr uint64_t kAuditEveryNs = 1'000'000'000;  // how often jobs' real holdings are checked
// Job ids stay below this: they never wrap, and 0 keeps meaning "no job".
constexpr uint64_t kMaxJobId = uint64_t{1} << 63;
// Limits on connections, so that one local user cannot fill the daemon's
// descriptor table or keep it busy: a connection that has not said Hello
// (or asked anything) within kHelloWithinNs, or a zico-umctl connection idle
// for kAdminIdleNs, is closed; a uid other than root has at most
// kConnectionsPerUid at once (jobs and zico-umctl together).
constexpr uint64_t kHelloWithinNs = 5'000'000'000;
constexpr uint64_t kAdminIdleNs = 60'000'000'000;
constexpr size_t kConnectionsPerUid = 128;

int open_pidfd(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  errno = ENOSYS;
  return -1;
#endif
}

int send_signal(int pidfd, int signal) {
#ifdef SYS_pidfd_send_signal
  return static_cast<int>(::syscall(SYS_pidfd_send_signal, pidfd, signal, nullptr, 0));
#else
  (void)pidfd;
  (void)signal;
  errno = ENOSYS;
  return -1;
#endif
}

// Not suspended and not asked to be: a suspension may be asked of it (a
// failed one left it running with its memory).
bool runs(proto::JobRunState state) {
  return state == proto::JobRunState::kRunning || state == proto::JobRunState::kFailed;
}

bool process_exited(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

// Is `uid` a member of `group` (primary or supplementary)?
bool in_group(uid_t uid, gid_t primary, gid_t group) {
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

}  // namespace

// The Impl is its gates' guard (GateGuard, iteration_gates.h): a job starts
// its iteration only if Ledger::may_start agrees on every GPU it opened.
struct Daemon::Impl final : GateGuard {
  struct PoolChunk {
    PhysHandle handle;   // invalid: released; created again when next lent
    uint64_t owner = 0;  // job id, 0 when free
    uint32_t last_uid = kFreshChunk;
  };
  struct Gpu {
    DeviceId device;
    proto::GpuUuid uuid{};
    size_t chunk_bytes = 0;
    std::vector<PoolChunk> chunks;  // id = index + 1
    std::vector<uint32_t> free_ids;
    VaRange scratch;                // where a chunk is mapped to be zeroed
    StreamHandle stream;
    bool has_stream = false;
    uint64_t bytes_moved = 0;       // granted + returned, in bytes
    uint64_t zeroed = 0;            // chunks zeroed for a new owner
    uint64_t live = 0;              // chunks with a handle: the pool's physical memory
    uint64_t total_memory = 0;      // the device's: no budget may exceed it
  };
  struct JobGpu {
    bool open = false;
    std::unordered_set<uint32_t> lent;  // pool ids the job holds
    uint64_t unowned = 0;               // chunks it held when it (re)connected
    uint64_t charged = 0;               // chunks its process holds beyond these (audit), in the ledger too
    // What an admin allows its owner (set_budget): a minimum up to admin_min,
    // a maximum up to admin_max, in chunks.
    uint64_t admin_min = 0;
    uint64_t admin_max = UINT64_MAX;
    proto::Report report;
    // The claim of the iteration it would begin, from its last IterationMark
    // (peak 0: unknown).
    uint64_t gate_peak = 0;
    uint64_t gate_settle = 0;
  };
  struct Job {
    uint64_t id = 0;
    int fd = -1;        // -1: connection gone, waiting for the process to exit
    int pidfd = -1;
    wire::PeerCredentials peer;
    std::string name;
    std::vector<JobGpu> gpus;
    std::unordered_set<uint64_t> requests;  // waiting in the ledger
    proto::JobRunState state = proto::JobRunState::kRunning;
    bool gate_held = false;  // its waiting gate was refused by may_start (logged once)
    // Known only from the predecessor's state file until it reconnects.
    bool expected = false;
    std::vector<bool> expected_reservation_used;  // per GPU: the reservation was reconciled
    bool resumed = false;                          // registered with an id from an earlier daemon
    uint64_t expected_until_ns = 0;
    int state_slot = -1;
    bool audit_denied = false;  // its process may not be looked at (another uid's, daemon not root): said once
  };
  enum class Role : uint8_t { kNew, kJob, kAdmin };
  struct Connection {
    int fd = -1;
    wire::PeerCredentials peer;
    Role role = Role::kNew;
    uint64_t job = 0;
    uint64_t last_message_ns = 0;  // or when it was accepted
  };

  Impl(Driver& d, DaemonOptions o, LedgerOptions lo)
      : driver(d), options(std::move(o)), ledger(lo), gates(options.time_shift, SchedulerOptions{}) {}

  Driver& driver;
  DaemonOptions options;
  Ledger ledger;
  IterationGates gates;
  StateFile state_file;
  std::vector<Gpu> gpus;
  std::unordered_map<uint64_t, Job> jobs;
  std::unordered_map<int, Connection> connections;  // by fd
  std::unordered_map<int, uint64_t> pidfd_jobs;     // pidfd -> job whose connection ended
  // Reservations from the state file whose job did not come back in time:
  // kept (not counted) while its process lives, so that the job, if it does
  // come back, can be believed about what it holds where the driver cannot
  // tell (provable_holding).
  struct Lapsed {
    wire::PeerCredentials peer;
    int pidfd = -1;
    std::vector<uint64_t> held;  // per GPU, chunks
  };
  std::unordered_map<uint64_t, Lapsed> lapsed;
  int listen_fd = -1;
  int epoll_fd = -1;
  int timer_fd = -1;
  int gate_timer_fd = -1;  // fires when the next iteration gate opens
  int signal_fd = -1;
  int stop_fd = -1;  // eventfd-like pipe end for stop()
  int stop_write = -1;
  std::unique_ptr<MetricsServer> metrics;
  uint64_t next_metrics_ns = 0;
  std::unordered_map<int, Outbox> outboxes;  // by connection fd: what waits to be sent
  bool accept_paused = false;                // out of descriptors: the listener rests until the next tick
  uint64_t next_job_id = 1;
  uint64_t next_audit_ns = 0;
  bool audit_supported = true;  // false once the driver said it cannot tell
  uint64_t arrivals = 0;
  uint64_t start_ns = now_ns();
  RateWindow rates;

  // --- setup ------------------------------------------------------------------
  Status setup(std::string* why);
  Status setup_metrics(std::string* why);
  // Renders the metrics for the scrapers when one waits, or a second passed.
  void publish_metrics(const proto::StatusReply& now_status, uint64_t now);
  void watch(int fd) const;
  void unwatch(int fd) const;

  // --- connections ------------------------------------------------------------
  void accept_connections();
  void on_readable(int fd);
  void on_writable(int fd);
  void expire_idle_connections(uint64_t now);
  void set_writable_watch(int fd, bool want);
  void close_connection(int fd, const std::string& reason, bool say_goodbye);
  void on_process_exit(int pidfd);
  void remove_job(uint64_t id, const char* why);
  // A job that cannot answer (its connection is gone, or it has not come
  // back after a restart) holds exactly its limits: never asked to reclaim,
  // never counted as a job that could free memory when deadlocks are looked for.
  void freeze(Job& job, bool frozen);
  bool send(int fd, const proto::Message& message, std::span<const int> fds = {});

  // --- messages ---------------------------------------------------------------
  // Each returns "" or the reason to close the connection.
  std::string on_message(Connection& connection, const proto::Message& message);
  std::string on_hello(Connection& connection, const proto::Hello& hello);
  std::string on_job_message(Job& job, const proto::Message& message);
  std::string on_return(Job& job, const proto::Return& ret);
  proto::StatusReply status() const;
  proto::Result set_budget(const Connection& connection, const proto::SetBudget& request);
  proto::Result control(const Connection& connection, const proto::JobControl& request);

  // --- restarts (state file) ---------------------------------------------------
  // Opens the state file and reserves what the last daemon's live jobs hold;
  // an error (*why) if the file cannot be used safely.
  Status load_state(std::string* why);
  // Writes what the job holds on `gpu` to the state file.
  void record_holding(Job& job, uint32_t gpu);
  void expire_expected();

  // --- time shift ---------------------------------------------------------------
  // Sends kProceed for every gate open by now and arms the gate timer.
  void open_gates();
  // GateGuard: Ledger::may_start (Ledger::turns_allow_start without the
  // start guard) / set_claim with the job's gate claims.
  bool may_start(JobId job) override;
  void starting(JobId job) override;
  uint64_t turn_wait_until_ns(JobId job, uint64_t now) override;
  // The job's gate claim on `gpu`, the peak raised to what it holds now
  // (our books run ahead of what the job counted while grants travel).
  std::pair<uint64_t, uint64_t> gate_claim(const Job& job, uint32_t gpu) const;
  std::string on_curve(Job& job, const proto::Curve& message);

  // --- lending ----------------------------------------------------------------
  void pump();
  void grant(const LedgerAction& action);
  Status take_chunks(Gpu& gpu, uint32_t uid, uint64_t count, std::vector<uint32_t>* ids, std::string* why);
  Status zero(Gpu& gpu, PoolChunk& chunk);
  // Releases the free chunks' physical memory (all of them, or while the
  // pool is larger than the budget): after a grant failed for want of
  // memory or descriptors, and after a budget cut.
  void release_free(uint32_t gpu, bool beyond_budget_only);

  // --- audit ------------------------------------------------------------------
  // Compares each job's process's real holdings with what it was lent (see
  // daemon.h), every kAuditEveryNs.
  void audit(uint64_t now);
  // What a job that comes back without a reservation may count as held of
  // the `claimed` chunks: what its process is seen to hold, or, where the
  // driver cannot tell, what its lapsed reservation said, all of it without
  // a state file (nothing to check against), and none otherwise (a job of
  // the last daemon would have had a reservation).
  [[nodiscard]] uint64_t provable_holding(const Job& job, uint32_t gpu, uint64_t claimed);
  void audit_job(Job& job);
  void settle_excess(Job& job, uint32_t gpu, uint64_t excess_chunks);
  [[nodiscard]] uint64_t lent_chunks(const Job& job, uint32_t gpu) const;
  bool is_admin(const wire::PeerCredentials& peer) const;
  int gpu_of(const proto::GpuUuid& uuid) const;
};

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
    (void)ledger.add_gpu(budget / gpu.chunk_bytes);
    gates.add_gpu(budget / gpu.chunk_bytes * gpu.chunk_bytes);
    gpus.push_back(std::move(gpu));
  }
  listen_fd = wire::listen_unix(options.socket_path, options.socket_mode, options.socket_group, why);
  if (listen_fd < 0) return Status(Errc::kOsError, errno);
  epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
  timer_fd = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  gate_timer_fd = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  int pipe_fds[2];
  if (epoll_fd < 0 || timer_fd < 0 || gate_timer_fd < 0 || ::pipe2(pipe_fds, O_NONBLOCK | O_CLOEXEC) != 0) {
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
  watch(stop_fd);
  ZICO_RETURN_IF_ERROR(load_state(why));
  return setup_metrics(why);
}

Status Daemon::Impl::setup_metrics(std::string* why) {
  if (options.metrics_address.empty()) return Status::ok();
  ZICO_RETURN_IF_ERROR(MetricsServer::create(options.metrics_address, &metrics, why));
  metrics->publish(render_metrics(status(), rates));
  return Status::ok();
}

void Daemon::Impl::publish_metrics(const proto::StatusReply& now_status, uint64_t now) {
  if (metrics == nullptr || (!metrics->wants_snapshot() && now < next_metrics_ns)) return;
  metrics->publish(render_metrics(now_status, rates));
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

// --- connections ------------------------------------------------------------------

bool Daemon::Impl::send(int fd, const proto::Message& message, std::span<const int> fds) {
  std::string why;
  Outbox& outbox = outboxes[fd];
  const bool was_empty = outbox.empty();
  const auto it = connections.find(fd);
  const bool job = it != connections.end() && it->second.role == Role::kJob;
  if (!outbox.send(fd, message, fds, job ? Outbox::kJobLimits : Outbox::kAdminLimits, &why)) {
    ZICO_LOG(kWarn, "sending %s failed: %s", proto::to_string(proto::type_of(message)), why.c_str());
    return false;
  }
  if (was_empty && !outbox.empty()) set_writable_watch(fd, true);
  return true;
}

void Daemon::Impl::set_writable_watch(int fd, bool want) {
  epoll_event event{};
  event.events = EPOLLIN | (want ? EPOLLOUT : 0u);
  event.data.fd = fd;
  (void)::epoll_ctl(epoll_fd, EPOLL_CTL_MOD, fd, &event);
}

void Daemon::Impl::on_writable(int fd) {
  auto it = outboxes.find(fd);
  if (it == outboxes.end()) return;
  std::string why;
  if (!it->second.flush(fd, &why)) {
    close_connection(fd, "sending failed: " + why, false);
    return;
  }
  if (it->second.empty()) set_writable_watch(fd, false);
}

void Daemon::Impl::expire_idle_connections(uint64_t now) {
  if (accept_paused) {
    accept_paused = false;
    watch(listen_fd);
  }
  std::vector<std::pair<int, const char*>> idle;
  for (const auto& [fd, connection] : connections) {
    if (connection.role == Role::kNew && now - connection.last_message_ns > kHelloWithinNs) {
      idle.emplace_back(fd, "said nothing within 5 s");
    } else if (connection.role == Role::kAdmin && now - connection.last_message_ns > kAdminIdleNs) {
      idle.emplace_back(fd, "idle for 60 s");
    }
  }
  for (const auto& [fd, why] : idle) close_connection(fd, why, false);
}

void Daemon::Impl::accept_connections() {
  for (;;) {
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE) {
        // The listener stays readable while we cannot accept: rest it until
        // the next tick instead of spinning on it.
        ZICO_LOG(kWarn, "out of descriptors (%zu connections): not accepting for a moment", connections.size());
        unwatch(listen_fd);
        accept_paused = true;
      }
      return;
    }
    Connection connection;
    connection.fd = fd;
    connection.last_message_ns = now_ns();
    std::string why;
    if (!wire::peer_credentials(fd, &connection.peer, &why)) {
      ZICO_LOG(kWarn, "refusing a connection: %s", why.c_str());
      ::close(fd);
      continue;
    }
    if (connection.peer.uid != 0) {
      const size_t open = static_cast<size_t>(std::count_if(connections.begin(), connections.end(), [&](const auto& entry) {
        return entry.second.peer.uid == connection.peer.uid;
      }));
      if (open >= kConnectionsPerUid) {
        static uint64_t last_said_ns = 0;
        if (connection.last_message_ns - last_said_ns > 1'000'000'000) {
          ZICO_LOG(kWarn, "uid %u has %zu connections open (at most %zu): refusing more", connection.peer.uid, open,
                   kConnectionsPerUid);
          last_said_ns = connection.last_message_ns;
        }
        ::close(fd);
        continue;
      }
    }
    // Room for large grants: each message is small, but a batch is many.
    const int buffer = 4 << 20;
    (void)::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer, sizeof buffer);
    connections[fd] = connection;
    watch(fd);
  }
}

void Daemon::Impl::on_readable(int fd) {
  // Drain what is queued, a bounded number per wake-up so one chatty peer
  // cannot starve the others.
  for (int n = 0; n < 64; ++n) {
    auto it = connections.find(fd);
    if (it == connections.end()) return;
    proto::Message message;
    std::vector<int> fds;
    std::string why;
    const wire::Received got = wire::receive_message(fd, &message, &fds, &why);
    for (int f : fds) ::close(f);  // only grants carry descriptors, and we send those
    switch (got) {
      case wire::Received::kWouldBlock:
        return;
      case wire::Received::kClosed:
        close_connection(fd, "closed by the peer", false);
        return;
      case wire::Received::kError:
        close_connection(fd, why, false);
        return;
      case wire::Received::kMalformed:
        close_connection(fd, "malformed message: " + why, true);
        return;
      case wire::Received::kMessage:
        break;
    }
    if (!fds.empty()) {
      close_connection(fd, "descriptors attached to a " + std::string(proto::to_string(proto::type_of(message))), true);
      return;
    }
    it->second.last_message_ns = now_ns();
    const std::string problem = on_message(it->second, message);
    if (!problem.empty()) {
      close_connection(fd, problem, true);
      return;
    }
    pump();
    // Whatever changed the books may let a gate that may_start held back go.
    if (gates.any_blocked()) open_gates();
  }
}

void Daemon::Impl::close_connection(int fd, const std::string& reason, bool say_goodbye) {
  auto it = connections.find(fd);
  if (it == connections.end()) return;
  const Connection connection = it->second;
  // Said while the connection is still known, so under its own limits; to a
  // peer with messages still queued, none: it would go with them.
  if (say_goodbye && outboxes[fd].empty()) (void)send(fd, proto::Goodbye{reason.substr(0, proto::kMaxString)});
  connections.erase(it);
  outboxes.erase(fd);  // what it did not read goes with it
  unwatch(fd);
  ::close(fd);
  if (connection.role != Role::kJob) {
    if (say_goodbye) ZICO_LOG(kWarn, "closed a connection of pid %d: %s", connection.peer.pid, reason.c_str());
    return;
  }
  auto job_it = jobs.find(connection.job);
  if (job_it == jobs.end()) return;
  Job& job = job_it->second;
  job.fd = -1;
  // Nobody would receive what it asked for, nor answer a reclaim.
  for (uint64_t request : job.requests) (void)ledger.cancel(job.id, request, now_ns());
  job.requests.clear();
  for (size_t g = 0; g < job.gpus.size(); ++g) {
    std::string ignored;
    if (job.gpus[g].open) (void)ledger.returned(job.id, static_cast<uint32_t>(g), 0, true, now_ns(), &ignored);
  }
  if (say_goodbye) {
    ZICO_LOG(kWarn, "job %llu (pid %d) disconnected: %s", static_cast<unsigned long long>(job.id), job.peer.pid,
             reason.c_str());
  } else {
    ZICO_LOG(kInfo, "job %llu (pid %d) disconnected: %s", static_cast<unsigned long long>(job.id), job.peer.pid,
             reason.c_str());
  }
  // The process may still have our chunks mapped: they stay its own until
  // it exits, and so does what it kept of those it gave back.
  audit_job(job);
  const bool holds = std::any_of(job.gpus.begin(), job.gpus.end(),
                                 [](const JobGpu& g) { return !g.lent.empty() || g.unowned != 0 || g.charged != 0; });
  if (holds && job.pidfd >= 0 && !process_exited(job.pidfd)) {
    freeze(job, true);
    gates.detach(job.id);
    open_gates();
    pidfd_jobs[job.pidfd] = job.id;
    watch(job.pidfd);
    return;
  }
  remove_job(job.id, holds ? "its process exited" : "it held nothing");
}

void Daemon::Impl::freeze(Job& job, bool frozen) { ledger.set_frozen(job.id, frozen); }

void Daemon::Impl::on_process_exit(int pidfd) {
  auto it = pidfd_jobs.find(pidfd);
  if (it == pidfd_jobs.end()) return;
  const uint64_t id = it->second;
  pidfd_jobs.erase(it);
  unwatch(pidfd);
  remove_job(id, "its process exited");
}

void Daemon::Impl::remove_job(uint64_t id, const char* why) {
  auto it = jobs.find(id);
  if (it == jobs.end()) return;
  Job& job = it->second;
  uint64_t freed = 0;
  for (size_t g = 0; g < job.gpus.size(); ++g) {
    for (uint32_t chunk_id : job.gpus[g].lent) {
      PoolChunk& chunk = gpus[g].chunks[chunk_id - 1];
      chunk.owner = 0;
      chunk.last_uid = job.peer.uid;
      gpus[g].free_ids.push_back(chunk_id);
      ++freed;
    }
  }
  if (job.pidfd >= 0) {
    pidfd_jobs.erase(job.pidfd);
    ::close(job.pidfd);
  }
  ledger.remove_job(id);
  gates.remove_job(id);
  ZICO_LOG(kInfo, "job %llu (pid %d) removed (%s): %llu chunks back in the pool", static_cast<unsigned long long>(id),
           job.peer.pid, why, static_cast<unsigned long long>(freed));
  state_file.release(job.state_slot);
  jobs.erase(it);
  pump();
  open_gates();
}

// --- messages -------------------------------------------------------------------------

std::string Daemon::Impl::on_message(Connection& connection, const proto::Message& message) {
  if (connection.role == Role::kNew) {
    if (const auto* hello = std::get_if<proto::Hello>(&message)) return on_hello(connection, *hello);
    connection.role = Role::kAdmin;  // anything else makes it a zico-umctl connection
  }
  if (connection.role == Role::kJob) {
    auto it = jobs.find(connection.job);
    if (it == jobs.end()) return "job is gone";
    return on_job_message(it->second, message);
  }
  if (std::holds_alternative<proto::StatusQuery>(message)) {
    return send(connection.fd, status()) ? "" : "cannot send the status";
  }
  if (const auto* request = std::get_if<proto::SetBudget>(&message)) {
    return send(connection.fd, set_budget(connection, *request)) ? "" : "cannot send the result";
  }
  if (const auto* request = std::get_if<proto::JobControl>(&message)) {
    return send(connection.fd, control(connection, *request)) ? "" : "cannot send the result";
  }
  return std::string(proto::to_string(proto::type_of(message))) + " is not a zico-umctl request";
}

std::string Daemon::Impl::on_hello(Connection& connection, const proto::Hello& hello) {
  uint64_t id = 0;
  // The same process (its pidfd has not fired, so the pid was not reused);
  // any other process asking for this id is a new job.
  if (auto it = jobs.find(hello.resume_job_id); it != jobs.end() && it->second.expected &&
                                                 it->second.peer.uid == connection.peer.uid &&
                                                 it->second.peer.pid == connection.peer.pid) {
    // Back after a restart: its reservation becomes the job again.
    Job& job = it->second;
    job.expected = false;
    freeze(job, false);
    job.fd = connection.fd;
    job.peer = connection.peer;
    job.name = hello.name;
    connection.role = Role::kJob;
    connection.job = job.id;
    ZICO_LOG(kInfo, "job %llu is back: pid %d '%s'", static_cast<unsigned long long>(job.id), connection.peer.pid,
             hello.name.c_str());
    return send(connection.fd, proto::Welcome{job.id}) ? "" : "cannot send Welcome";
  }
  if (hello.resume_job_id != 0 && jobs.contains(hello.resume_job_id)) {
    // Its earlier connection ended while its process lived: what it holds
    // stays counted under the old record until it exits.
    return "job " + std::to_string(hello.resume_job_id) + " is still registered; it keeps what it holds";
  }
  if (hello.resume_job_id >= kMaxJobId) {
    return "job id " + std::to_string(hello.resume_job_id) + " is out of range (ids are below 2^63)";
  }
  if (hello.resume_job_id != 0) {
    // Not reserved for it (no state file, or it came back too late): what it
    // says it holds is weighed against what its process holds (OpenGpu). Its
    // id is only a name it chose: it does not move the ids of new jobs.
    id = hello.resume_job_id;
  } else {
    while (jobs.contains(next_job_id) || ledger.has_job(next_job_id)) ++next_job_id;
    if (next_job_id >= kMaxJobId) return "no job ids left; restart zico-umd";
    id = next_job_id++;
  }
  Job job;
  job.id = id;
  job.resumed = hello.resume_job_id != 0;
  job.expected_reservation_used.assign(gpus.size(), true);
  job.fd = connection.fd;
  job.peer = connection.peer;
  job.name = hello.name;
  job.gpus.resize(gpus.size());
  job.pidfd = connection.peer.pid > 0 ? open_pidfd(connection.peer.pid) : -1;
  if (job.pidfd < 0) {
    // Without it the daemon could not tell when the job's process is gone,
    // and could lend chunks the process still maps: refuse, the job runs standalone.
    return "cannot watch pid " + std::to_string(connection.peer.pid) + " (pidfd_open: " + std::strerror(errno) +
           "); zico-umd needs Linux 5.3+ and the jobs' pid namespace";
  }
  if (!ledger.add_job(id, connection.peer.uid, ++arrivals)) return "job id " + std::to_string(id) + " is in use";
  job.state_slot = state_file.claim(id, connection.peer.pid, connection.peer.uid);
  if (job.state_slot < 0 && state_file.is_open()) {
    ZICO_LOG(kWarn, "state file full: a restart would not know what job %llu holds", static_cast<unsigned long long>(id));
  }
  jobs[id] = std::move(job);
  connection.role = Role::kJob;
  connection.job = id;
  ZICO_LOG(kInfo, "job %llu registered: pid %d uid %u '%s'%s", static_cast<unsigned long long>(id),
           connection.peer.pid, connection.peer.uid, hello.name.c_str(), hello.resume_job_id != 0 ? " (resumed)" : "");
  return send(connection.fd, proto::Welcome{id}) ? "" : "cannot send Welcome";
}

std::string Daemon::Impl::on_job_message(Job& job, const proto::Message& message) {
  const uint64_t now = now_ns();
  std::string why;
  if (const auto* open = std::get_if<proto::OpenGpu>(&message)) {
    const int g = gpu_of(open->uuid);
    if (g < 0) {
      // Not ours: chunk size 0 tells the job to run that device standalone.
      ZICO_LOG(kInfo, "job %llu uses GPU %s, which is not managed here", static_cast<unsigned long long>(job.id),
               proto::to_hex(open->uuid).c_str());
      return send(job.fd, proto::GpuOpened{0, 0, 0, 0}) ? "" : "cannot send GpuOpened";
    }
    const auto gpu = static_cast<uint32_t>(g);
    const uint64_t budget = ledger.gpu(gpu).budget;
    if (open->held_chunks > budget) {
      return "OpenGpu claims " + std::to_string(open->held_chunks) + " chunks held; the budget is " +
             std::to_string(budget);
    }
    const bool reserved = job.gpus[gpu].open && !job.expected_reservation_used[gpu] &&
                          job.gpus[gpu].lent.empty() && job.gpus[gpu].unowned >= open->held_chunks;
    if (reserved) {
      job.expected_reservation_used[gpu] = true;
      // Reserved from the state file: keep what it really holds, free the rest.
      const uint64_t surplus = job.gpus[gpu].unowned - open->held_chunks;
      if (!ledger.returned(job.id, gpu, surplus, false, now, &why).is_ok()) return why;
    } else if (job.gpus[gpu].open) {
      return "OpenGpu for GPU " + std::to_string(gpu) + ", which the job has opened already";
    } else if (open->held_chunks != 0 && !job.resumed) {
      return "a new job claims to hold " + std::to_string(open->held_chunks) + " chunks";
    }
    uint64_t held = open->held_chunks;
    if (held != 0 && !reserved) {
      held = provable_holding(job, gpu, held);
      if (held < open->held_chunks) {
        ZICO_LOG(kWarn, "job %llu (pid %d) says it holds %llu chunks of GPU %u; %llu are all it can be shown to hold",
                 static_cast<unsigned long long>(job.id), job.peer.pid,
                 static_cast<unsigned long long>(open->held_chunks), gpu, static_cast<unsigned long long>(held));
      }
    }
    if (!job.gpus[gpu].open && !ledger.open(job.id, gpu, held, &why).is_ok()) return why;
    job.gpus[gpu].open = true;
    job.gpus[gpu].unowned = held;
    gates.open(job.id, gpu);
    record_holding(job, gpu);
    Ledger::JobView view;
    (void)ledger.job(job.id, gpu, now, &view);
    const uint64_t chunk = gpus[gpu].chunk_bytes;
    const uint64_t max_bytes = view.max > UINT64_MAX / chunk ? UINT64_MAX : view.max * chunk;
    return send(job.fd, proto::GpuOpened{gpu, chunk, view.min * chunk, max_bytes}) ? "" : "cannot send GpuOpened";
  }
  if (const auto* request = std::get_if<proto::Request>(&message)) {
    if (request->gpu >= gpus.size() || !job.gpus[request->gpu].open) {
      return "Request for GPU " + std::to_string(request->gpu) + ", which the job has not opened";
    }
    if (const uint64_t charged = job.gpus[request->gpu].charged; charged != 0 && options.overuse != OveruseAction::kWarn) {
      const std::string reason = "this process holds " + format_size(charged * gpus[request->gpu].chunk_bytes) +
                                 " of GPU " + std::to_string(request->gpu) +
                                 " beyond what it was lent (memory it gave back and kept); it gets no more until it "
                                 "lets go";
      return send(job.fd, proto::Deny{request->request_id, static_cast<uint32_t>(Errc::kOutOfMemory), reason})
                 ? ""
                 : "cannot send a denial";
    }
    // The claim first, so that the pump after this message judges the
    // request against it. The peak covers at least what the job will hold
    // once this request is served: the job counted from what it had
    // received, which lags behind our books while grants are on their way.
    // Peak 0 withdraws an earlier claim: the job does not know its iteration.
    uint64_t peak = 0;
    uint64_t settle = 0;
    if (request->claim_peak_chunks != 0) {
      Ledger::JobView view;
      (void)ledger.job(job.id, request->gpu, now, &view);
      peak = std::max<uint64_t>(request->claim_peak_chunks, view.held + request->chunks);
      settle = request->claim_settle_chunks;
    }
    (void)ledger.set_claim(job.id, request->gpu, peak, settle);
    if (!ledger.request(job.id, request->gpu, request->request_id, request->chunks, now, &why).is_ok()) return why;
    job.requests.insert(request->request_id);
    return "";
  }
  if (const auto* cancel = std::get_if<proto::Cancel>(&message)) {
    if (ledger.cancel(job.id, cancel->request_id, now)) {
      job.requests.erase(cancel->request_id);
      (void)send(job.fd, proto::Deny{cancel->request_id, static_cast<uint32_t>(Errc::kOutOfMemory), "cancelled"});
    }
    return "";
  }
  if (const auto* ret = std::get_if<proto::Return>(&message)) return on_return(job, *ret);
  if (const auto* report = std::get_if<proto::Report>(&message)) {
    if (report->gpu >= gpus.size() || !job.gpus[report->gpu].open) return "Report for a GPU the job has not opened";
    job.gpus[report->gpu].report = *report;
    // A job's word about its usage is bounded by what it holds.
    const uint64_t held_bytes = lent_chunks(job, report->gpu) * gpus[report->gpu].chunk_bytes;
    proto::Report& stored = job.gpus[report->gpu].report;
    stored.allocated_bytes = std::min(stored.allocated_bytes, held_bytes);
    stored.persistent_bytes = std::min(stored.persistent_bytes, stored.allocated_bytes);
    return "";
  }
  if (const auto* mark = std::get_if<proto::IterationMark>(&message)) {
    for (const proto::GateClaim& claim : mark->claims) {
      if (claim.gpu >= gpus.size() || !job.gpus[claim.gpu].open) {
        return "IterationMark claims GPU " + std::to_string(claim.gpu) + ", which the job has not opened";
      }
    }
    // At its gate the job needs nothing more than it holds: its claims go,
    // which can make a waiting request safe to grant (the pump after every
    // message sees to it). The claims it sent are for the iteration it would
    // begin: may_start() weighs them when its gate's time comes.
    for (size_t g = 0; g < job.gpus.size(); ++g) {
      if (!job.gpus[g].open) continue;
      (void)ledger.set_between_iterations(job.id, static_cast<uint32_t>(g));
      job.gpus[g].gate_peak = 0;
      job.gpus[g].gate_settle = 0;
    }
    for (const proto::GateClaim& claim : mark->claims) {
      job.gpus[claim.gpu].gate_peak = claim.peak_chunks;
      job.gpus[claim.gpu].gate_settle = claim.settle_chunks;
    }
    job.gate_held = false;
    gates.arrive(job.id, mark->sequence, now);
    open_gates();
    return "";
  }
  if (const auto* curve = std::get_if<proto::Curve>(&message)) return on_curve(job, *curve);
  if (const auto* reported = std::get_if<proto::JobState>(&message)) {
    using State = proto::JobRunState;
    // Running may be said again and failed at any time (after a restart a
    // job cannot know what the new daemon heard); suspended only when asked.
    const bool expected = reported->state != State::kSuspended || job.state == State::kSuspendRequested;
    if (!expected) return "JobState " + std::to_string(static_cast<int>(reported->state)) + " was not asked for";
    if (reported->state == State::kFailed) {
      ZICO_LOG(kWarn, "job %llu %s (its log says why)", static_cast<unsigned long long>(job.id),
               job.state == State::kSuspended ? "could not restore its memory; it runs on without it"
                                              : "could not suspend; it runs on with what it holds");
      job.state = State::kFailed;
      // A turn's park that could not happen must not hold the others up.
      ledger.release_victim(job.id);
      return "";
    }
    if (reported->state == State::kRunning && job.state == State::kRunning) return "";
    job.state = reported->state;
    if (job.state == proto::JobRunState::kSuspended) {
      // It gave everything back and needs nothing until it resumes (its
      // requests then claim again): not in mid-iteration, so neither its
      // claims nor its unknown iteration hold others' grants and starts back.
      for (size_t g = 0; g < job.gpus.size(); ++g) {
        if (job.gpus[g].open) (void)ledger.set_between_iterations(job.id, static_cast<uint32_t>(g));
      }
    }
    ZICO_LOG(kInfo, "job %llu %s", static_cast<unsigned long long>(job.id),
             reported->state == proto::JobRunState::kSuspended ? "suspended" : "runs again");
    return "";
  }
  return std::string(proto::to_string(proto::type_of(message))) + " is not a job request";
}

std::string Daemon::Impl::on_return(Job& job, const proto::Return& ret) {
  if (ret.gpu >= gpus.size() || !job.gpus[ret.gpu].open) return "Return for a GPU the job has not opened";
  JobGpu& held = job.gpus[ret.gpu];
  if (ret.unowned > held.unowned) {
    return "Return of " + std::to_string(ret.unowned) + " unowned chunks; the job has " + std::to_string(held.unowned);
  }
  // Everything is checked before anything changes: a chunk freed twice
  // would be lent to two jobs at once.
  std::unordered_set<uint32_t> seen;
  for (uint32_t id : ret.ids) {
    if (!held.lent.contains(id)) return "Return of chunk " + std::to_string(id) + ", which the job does not hold";
    if (!seen.insert(id).second) return "Return names chunk " + std::to_string(id) + " twice";
  }
  const uint64_t count = ret.ids.size() + ret.unowned;
  std::string why;
  if (!ledger.returned(job.id, ret.gpu, count, ret.reclaim_reply, now_ns(), &why).is_ok()) return why;
  Gpu& gpu = gpus[ret.gpu];
  for (uint32_t id : ret.ids) {
    held.lent.erase(id);
    PoolChunk& chunk = gpu.chunks[id - 1];
    chunk.owner = 0;
    chunk.last_uid = job.peer.uid;
    gpu.free_ids.push_back(id);
  }
  held.unowned -= ret.unowned;
  record_holding(job, ret.gpu);
  gpu.bytes_moved += count * gpu.chunk_bytes;
  return "";
}

proto::StatusReply Daemon::Impl::status() const {
  proto::StatusReply reply;
  const uint64_t now = now_ns();
  reply.daemon_pid = static_cast<uint64_t>(::getpid());
  reply.uptime_ns = now - start_ns;
  for (size_t g = 0; g < gpus.size() && g < proto::kMaxStatusGpus; ++g) {
    const Gpu& gpu = gpus[g];
    const Ledger::GpuView view = ledger.gpu(static_cast<uint32_t>(g));
    proto::GpuStatus s;
    s.index = static_cast<uint32_t>(g);
    s.uuid = gpu.uuid;
    s.chunk_bytes = gpu.chunk_bytes;
    s.budget_bytes = view.budget * gpu.chunk_bytes;
    s.granted_bytes = view.granted * gpu.chunk_bytes;
    s.pool_bytes = gpu.live * gpu.chunk_bytes;
    s.waiting_bytes = view.waiting * gpu.chunk_bytes;
    s.grants = view.grants;
    s.reclaims = view.returns;
    s.deadlocks = view.deadlocks;
    reply.gpus.push_back(s);
  }
  std::vector<const Job*> ordered;
  for (const auto& [id, job] : jobs) ordered.push_back(&job);
  reply.job_count = ordered.size();
  std::sort(ordered.begin(), ordered.end(), [](const Job* a, const Job* b) { return a->id < b->id; });
  for (const Job* job : ordered) {
    for (size_t g = 0; g < job->gpus.size(); ++g) {
      Ledger::JobView view;
      if (!job->gpus[g].open || !ledger.job(job->id, static_cast<uint32_t>(g), now, &view)) continue;
      ++reply.job_rows;
      // 128 jobs with the longest names still fit in one message.
      if (reply.jobs.size() == kStatusJobs) continue;
      const uint64_t chunk = gpus[g].chunk_bytes;
      proto::JobStatus s;
      s.id = job->id;
      s.pid = static_cast<uint32_t>(job->peer.pid);
      s.uid = job->peer.uid;
      s.gpu = static_cast<uint32_t>(g);
      s.name = job->name;
      s.granted_bytes = (view.held + view.charged) * chunk;
      s.min_bytes = view.min * chunk;
      s.max_bytes = view.max > UINT64_MAX / chunk ? UINT64_MAX : view.max * chunk;
      s.allocated_bytes = job->gpus[g].report.allocated_bytes;
      s.persistent_bytes = job->gpus[g].report.persistent_bytes;
      s.waiting_bytes = view.waiting * chunk;
      s.wait_ns = view.wait_ns;
      s.iterations = job->gpus[g].report.iterations;
      s.state = job->state;
      reply.jobs.push_back(s);
    }
  }
  return reply;
}

proto::Result Daemon::Impl::set_budget(const Connection& connection, const proto::SetBudget& request) {
  const auto refuse = [](Errc errc, std::string message) {
    return proto::Result{static_cast<uint32_t>(errc), std::move(message)};
  };
  if (request.gpu >= gpus.size()) {
    return refuse(Errc::kNotFound, "no GPU " + std::to_string(request.gpu) + " (this node has " +
                                       std::to_string(gpus.size()) + ")");
  }
  Gpu& gpu = gpus[request.gpu];
  const uint64_t chunks = request.bytes / gpu.chunk_bytes;
  const uint64_t now = now_ns();
  std::string why;
  if (request.target == proto::BudgetTarget::kNode) {
    if (!is_admin(connection.peer)) {
      return refuse(Errc::kInvalidArgument, "permission denied: changing a node budget needs root or the admin group");
    }
    if (chunks == 0) return refuse(Errc::kInvalidArgument, "a budget must hold at least one chunk (" + format_size(gpu.chunk_bytes) + ")");
    if (request.bytes > gpu.total_memory) {
      return refuse(Errc::kInvalidArgument, "budget " + format_size(request.bytes) + " is more than GPU " +
                                                std::to_string(request.gpu) + "'s " + format_size(gpu.total_memory) +
                                                " of memory");
    }
    uint64_t persistent = 0;
    for (const auto& [id, job] : jobs) persistent += job.gpus[request.gpu].report.persistent_bytes;
    if (request.bytes < persistent) {
      return refuse(Errc::kInvalidArgument, "budget " + format_size(request.bytes) + " is below the jobs' persistent memory (" +
                                                format_size(persistent) + ") on GPU " + std::to_string(request.gpu));
    }
    if (!ledger.set_budget(request.gpu, chunks, &why).is_ok()) return refuse(Errc::kInvalidArgument, why);
    ZICO_LOG(kInfo, "GPU %u budget set to %s by uid %u", request.gpu, format_size(chunks * gpu.chunk_bytes).c_str(),
             connection.peer.uid);
    // A shrink: the ledger asks idle memory back at once; the gates re-plan,
    // so iterations that no longer fit wait. A growth releases them.
    gates.set_budget(request.gpu, chunks * gpu.chunk_bytes);
    pump();
    release_free(request.gpu, true);
    open_gates();
    return refuse(Errc::kOk, "GPU " + std::to_string(request.gpu) + " budget is now " +
                                 format_size(chunks * gpu.chunk_bytes));
  }
  auto it = jobs.find(request.job_id);
  Ledger::JobView view;
  if (it == jobs.end() || !ledger.job(request.job_id, request.gpu, now, &view)) {
    return refuse(Errc::kNotFound, "no job " + std::to_string(request.job_id) + " on GPU " + std::to_string(request.gpu) +
                                       " (zico-umctl jobs lists them)");
  }
  Job& job = it->second;
  if (!is_admin(connection.peer) && connection.peer.uid != job.peer.uid) {
    return refuse(Errc::kInvalidArgument, "permission denied: job " + std::to_string(job.id) + " belongs to uid " +
                                              std::to_string(job.peer.uid));
  }
  const uint64_t persistent = job.gpus[request.gpu].report.persistent_bytes;
  JobGpu& allowed = job.gpus[request.gpu];
  const bool admin = is_admin(connection.peer);
  const auto bytes_text = [&](uint64_t limit) {
    return limit == UINT64_MAX ? std::string("unlimited") : format_size(limit * gpu.chunk_bytes);
  };
  uint64_t min = view.min;
  uint64_t max = view.max;
  if (request.target == proto::BudgetTarget::kJobMin) {
    min = request.bytes / gpu.chunk_bytes + (request.bytes % gpu.chunk_bytes != 0 ? 1 : 0);
    // A minimum is memory other users' jobs cannot have: its owner may only
    // lower it, to what an admin allowed at most.
    if (!admin && min > allowed.admin_min) {
      return refuse(Errc::kInvalidArgument, "permission denied: job " + std::to_string(job.id) +
                                                "'s owner may set its minimum up to " + bytes_text(allowed.admin_min) +
                                                " (what an admin allows); more needs root or the admin group");
    }
  } else {
    if (request.bytes < persistent) {
      return refuse(Errc::kInvalidArgument, "maximum " + format_size(request.bytes) + " is below job " +
                                                std::to_string(job.id) + "'s persistent memory (" + format_size(persistent) + ")");
    }
    max = request.bytes == UINT64_MAX ? UINT64_MAX : chunks;  // UINT64_MAX: unlimited
    if (!admin && max > allowed.admin_max) {
      return refuse(Errc::kInvalidArgument, "permission denied: an admin capped job " + std::to_string(job.id) +
                                                " at " + bytes_text(allowed.admin_max) +
                                                "; its owner may only set a lower maximum");
    }
  }
  if (!ledger.set_job_limits(job.id, request.gpu, min, max, &why).is_ok()) return refuse(Errc::kInvalidArgument, why);
  if (admin) {
    if (request.target == proto::BudgetTarget::kJobMin) {
      allowed.admin_min = min;
    } else {
      allowed.admin_max = max;
    }
  }
  const uint64_t max_bytes = max > UINT64_MAX / gpu.chunk_bytes ? UINT64_MAX : max * gpu.chunk_bytes;
  if (job.fd >= 0) {
    (void)send(job.fd, proto::Limits{request.gpu, min * gpu.chunk_bytes, max_bytes});
    // Above its new maximum: ask for the excess back (idle memory; live blocks stay).
    if (view.held > max) (void)send(job.fd, proto::Reclaim{request.gpu, view.held - max});
  }
  pump();
  return refuse(Errc::kOk, "job " + std::to_string(job.id) + " on GPU " + std::to_string(request.gpu) + ": min " +
                               format_size(min * gpu.chunk_bytes) + ", max " +
                               (max == UINT64_MAX ? std::string("unlimited") : format_size(max_bytes)));
}

proto::Result Daemon::Impl::control(const Connection& connection, const proto::JobControl& request) {
  const auto answer = [](Errc errc, std::string message) {
    return proto::Result{static_cast<uint32_t>(errc), std::move(message)};
  };
  auto it = jobs.find(request.job_id);
  if (it == jobs.end()) {
    return answer(Errc::kNotFound, "no job " + std::to_string(request.job_id) + " (zico-umctl jobs lists them)");
  }
  Job& job = it->second;
  if (!is_admin(connection.peer) && connection.peer.uid != job.peer.uid) {
    return answer(Errc::kInvalidArgument, "permission denied: job " + std::to_string(job.id) + " belongs to uid " +
                                              std::to_string(job.peer.uid));
  }
  if (job.fd < 0) return answer(Errc::kNotFound, "job " + std::to_string(job.id) + " is not connected");
  const std::string name = "job " + std::to_string(job.id);
  const bool running = runs(job.state);
  if (request.action == proto::JobAction::kSuspend) {
    if (!running) {
      return answer(Errc::kInvalidArgument, name + " is already suspended (or about to be)");
    }
    if (!send(job.fd, proto::Suspend{request.to})) return answer(Errc::kOsError, "cannot reach " + name);
    job.state = proto::JobRunState::kSuspendRequested;
    ZICO_LOG(kInfo, "%s asked to suspend to %s by uid %u", name.c_str(),
             request.to == proto::StoreKind::kNvme ? "nvme" : "host", connection.peer.uid);
    return answer(Errc::kOk, name + " suspends at its next allocation or iteration mark");
  }
  if (running) return answer(Errc::kInvalidArgument, name + " is not suspended");
  if (!send(job.fd, proto::Resume{})) return answer(Errc::kOsError, "cannot reach " + name);
  ZICO_LOG(kInfo, "%s asked to resume by uid %u", name.c_str(), connection.peer.uid);
  return answer(Errc::kOk, name + " resumes");
}

// --- restarts ----------------------------------------------------------------------------

namespace {
constexpr uint64_t kExpectedForNs = 5'000'000'000;  // how long a reservation waits for its job
}  // namespace

void Daemon::Impl::record_holding(Job& job, uint32_t gpu) {
  const uint64_t held = lent_chunks(job, gpu) + job.gpus[gpu].charged;
  state_file.set_held(job.state_slot, gpu, held);
  gates.set_held(job.id, gpu, held * gpus[gpu].chunk_bytes);
}

Status Daemon::Impl::load_state(std::string* failure) {
  if (options.state_path.empty()) return Status::ok();
  std::vector<proto::GpuUuid> uuids;
  for (const Gpu& gpu : gpus) uuids.push_back(gpu.uuid);
  std::vector<StateFile::Entry> previous;
  std::string why;
  if (!state_file.open(options.state_path, uuids, &previous, &why)) {
    // Without it a restart would lend memory that live jobs still hold.
    *failure = why + " (--state-file names another path)";
    return Status(Errc::kInvalidArgument);
  }
  size_t reserved = 0;
  for (const StateFile::Entry& entry : previous) {
    const int pidfd = open_pidfd(entry.pid);
    if (pidfd < 0) continue;  // gone: nothing to reserve
    if (process_exited(pidfd) || entry.job == 0 || entry.job >= kMaxJobId || jobs.contains(entry.job) ||
        !ledger.add_job(entry.job, entry.uid, ++arrivals)) {
      ::close(pidfd);
      continue;
    }
    Job job;
    job.id = entry.job;
    job.pidfd = pidfd;
    job.peer = wire::PeerCredentials{entry.pid, entry.uid, 0};
    job.name = "(expected back after a restart)";
    job.gpus.resize(gpus.size());
    job.expected = true;
    job.resumed = true;
    job.expected_reservation_used.assign(gpus.size(), false);
    job.expected_until_ns = now_ns() + kExpectedForNs;
    job.state_slot = state_file.claim(job.id, entry.pid, entry.uid);
    for (size_t g = 0; g < gpus.size(); ++g) {
      if (entry.held[g] == 0 || !ledger.open(job.id, static_cast<uint32_t>(g), entry.held[g], &why).is_ok()) continue;
      job.gpus[g].open = true;
      job.gpus[g].unowned = entry.held[g];
      state_file.set_held(job.state_slot, g, entry.held[g]);
    }
    pidfd_jobs[pidfd] = job.id;
    watch(pidfd);
    next_job_id = std::max<uint64_t>(next_job_id, job.id + 1);
    freeze(jobs.emplace(job.id, std::move(job)).first->second, true);
    ++reserved;
  }
  if (reserved > 0) {
    ZICO_LOG(kInfo, "reserving what %zu job(s) of the previous daemon hold until they reconnect", reserved);
  }
  return Status::ok();
}

void Daemon::Impl::expire_expected() {
  const uint64_t now = now_ns();
  std::vector<uint64_t> expired;
  for (const auto& [id, job] : jobs) {
    if (job.expected && now > job.expected_until_ns) expired.push_back(id);
  }
  for (uint64_t id : expired) {
    Job& job = jobs.at(id);
    Lapsed entry{job.peer, ::fcntl(job.pidfd, F_DUPFD_CLOEXEC, 0), {}};
    for (const JobGpu& gpu : job.gpus) entry.held.push_back(gpu.unowned);
    if (entry.pidfd >= 0) lapsed[id] = std::move(entry);
    remove_job(id, "it did not reconnect after the restart");
  }
  std::erase_if(lapsed, [](const auto& item) {
    if (!process_exited(item.second.pidfd)) return false;
    ::close(item.second.pidfd);
    return true;
  });
}

// --- lending ---------------------------------------------------------------------------

Status Daemon::Impl::zero(Gpu& gpu, PoolChunk& chunk) {
  if (!gpu.has_stream) {
    ZICO_RETURN_IF_ERROR(driver.stream_create(gpu.device, &gpu.stream));
    gpu.has_stream = true;
  }
  ZICO_RETURN_IF_ERROR(driver.map(gpu.scratch, chunk.handle));
  Status status = driver.set_access(gpu.device, gpu.scratch);
  if (status.is_ok()) status = driver.memset_async(gpu.scratch.ptr(), 0, gpu.chunk_bytes, gpu.stream);
  if (status.is_ok()) status = driver.stream_synchronize(gpu.stream);
  const Status unmapped = driver.unmap(gpu.scratch);
  ZICO_RETURN_IF_ERROR(status);
  ZICO_RETURN_IF_ERROR(unmapped);
  ++gpu.zeroed;
  return Status::ok();
}

Status Daemon::Impl::take_chunks(Gpu& gpu, uint32_t uid, uint64_t count, std::vector<uint32_t>* ids, std::string* why) {
  while (ids->size() < count) {
    uint32_t id = 0;
    if (!gpu.free_ids.empty()) {
      id = gpu.free_ids.back();
      gpu.free_ids.pop_back();
    } else {
      gpu.chunks.push_back(PoolChunk{});
      id = static_cast<uint32_t>(gpu.chunks.size());
    }
    ids->push_back(id);  // the caller puts it back if this fails
    PoolChunk& chunk = gpu.chunks[id - 1];
    if (chunk.handle.valid() && chunk.last_uid != kFreshChunk && chunk.last_uid != uid) {
      // Its last borrower may still map it (daemon.h): another uid gets other memory.
      (void)driver.release(chunk.handle);
      chunk.handle = PhysHandle{};
      --gpu.live;
    }
    if (!chunk.handle.valid()) {
      if (Status status = driver.create(gpu.device, gpu.chunk_bytes, &chunk.handle); !status.is_ok()) {
        chunk.handle = PhysHandle{};
        *why = "creating a " + format_size(gpu.chunk_bytes) + " chunk failed: " + status.message();
        if (status.detail() == EMFILE || status.detail() == ENFILE) {
          *why += " (zico-umd is out of file descriptors with " + std::to_string(gpu.live) +
                  " chunks in its pool: raise its open-files limit, LimitNOFILE= in its unit)";
        }
        return status;
      }
      ++gpu.live;
      chunk.last_uid = options.zero_new_chunks ? kFreshChunk : uid;
    }
    if (chunk.last_uid != uid) {
      if (Status status = zero(gpu, chunk); !status.is_ok()) {
        *why = "zeroing a chunk for its new owner failed: " + status.message();
        return status;
      }
      chunk.last_uid = uid;
    }
  }
  return Status::ok();
}

void Daemon::Impl::release_free(uint32_t g, bool beyond_budget_only) {
  Gpu& gpu = gpus[g];
  const uint64_t keep = beyond_budget_only ? ledger.gpu(g).budget : 0;
  for (uint32_t id : gpu.free_ids) {
    if (gpu.live <= keep) break;
    PoolChunk& chunk = gpu.chunks[id - 1];
    if (!chunk.handle.valid()) continue;
    (void)driver.release(chunk.handle);
    chunk.handle = PhysHandle{};
    --gpu.live;
  }
}

void Daemon::Impl::grant(const LedgerAction& action) {
  auto it = jobs.find(action.job);
  if (it == jobs.end()) return;
  Job& job = it->second;
  Gpu& gpu = gpus[action.gpu];
  std::vector<uint32_t> ids;
  std::string why;
  if (Status status = take_chunks(gpu, job.peer.uid, action.chunks, &ids, &why); !status.is_ok()) {
    for (uint32_t id : ids) gpu.free_ids.push_back(id);
    // Out of device memory or of descriptors: what the pool keeps idle
    // would only keep the next request from being served.
    release_free(action.gpu, false);
    std::string ignored;
    (void)ledger.returned(job.id, action.gpu, action.chunks, false, now_ns(), &ignored);
    ZICO_LOG(kError, "GPU %u: %s", action.gpu, why.c_str());
    if (job.fd >= 0) (void)send(job.fd, proto::Deny{action.request_id, static_cast<uint32_t>(Errc::kOutOfMemory), why});
    return;
  }
  for (uint32_t id : ids) {
    gpu.chunks[id - 1].owner = job.id;
    job.gpus[action.gpu].lent.insert(id);
  }
  record_holding(job, action.gpu);  // before the job can have them
  gpu.bytes_moved += ids.size() * gpu.chunk_bytes;
  if (job.fd < 0) return;  // gone meanwhile: the chunks return when its process exits
  for (size_t start = 0; start < ids.size(); start += proto::kMaxChunksPerMessage) {
    const size_t count = std::min(proto::kMaxChunksPerMessage, ids.size() - start);
    proto::Grant message;
    message.request_id = action.request_id;
    message.gpu = action.gpu;
    message.last = start + count == ids.size();
    message.ids.assign(ids.begin() + static_cast<ptrdiff_t>(start), ids.begin() + static_cast<ptrdiff_t>(start + count));
    std::vector<int> fds;
    Status status = Status::ok();
    for (uint32_t id : message.ids) {
      int fd = -1;
      status = driver.export_fd(gpu.chunks[id - 1].handle, &fd);
      if (!status.is_ok()) break;
      fds.push_back(fd);
    }
    const bool sent = status.is_ok() && send(job.fd, message, fds);
    for (int fd : fds) ::close(fd);
    if (!sent) {
      // The job's chunks stay counted; they come back when it goes.
      close_connection(job.fd, status.is_ok() ? "cannot send a grant" : "exporting a chunk failed: " + status.message(),
                       true);
      return;
    }
  }
}

// --- audit ----------------------------------------------------------------------------------

uint64_t Daemon::Impl::lent_chunks(const Job& job, uint32_t gpu) const {
  return job.gpus[gpu].lent.size() + job.gpus[gpu].unowned;
}

void Daemon::Impl::audit(uint64_t now) {
  if (!audit_supported || now < next_audit_ns) return;
  next_audit_ns = now + kAuditEveryNs;
  for (auto& [id, job] : jobs) audit_job(job);
}

uint64_t Daemon::Impl::provable_holding(const Job& job, uint32_t gpu, uint64_t claimed) {
  if (job.peer.pid == ::getpid()) return claimed;  // the daemon's own pool would count (audit_job)
  uint64_t bytes = 0;
  const Status status = driver.process_memory(job.peer.pid, gpus[gpu].device, &bytes);
  if (status.is_ok()) return std::min(claimed, bytes / gpus[gpu].chunk_bytes);
  if (status.code() != Errc::kNotSupported) return 0;
  // The same process as a reservation that lapsed: what it held then.
  if (auto it = lapsed.find(job.id); it != lapsed.end() && it->second.peer.pid == job.peer.pid &&
                                     it->second.peer.uid == job.peer.uid && !process_exited(it->second.pidfd)) {
    return std::min(claimed, gpu < it->second.held.size() ? it->second.held[gpu] : 0);
  }
  return state_file.is_open() ? 0 : claimed;
}

void Daemon::Impl::audit_job(Job& job) {
  // A job known only from the state file holds the old daemon's chunks,
  // which its reservation already counts in full.
  // A job in the daemon's own process (benchmarks, tests) would be charged
  // for the pool the daemon keeps.
  if (!audit_supported || job.expected || job.pidfd < 0 ||
      job.peer.pid == ::getpid() || process_exited(job.pidfd)) {
    return;
  }
  for (size_t g = 0; g < job.gpus.size(); ++g) {
    if (!job.gpus[g].open) continue;
    uint64_t bytes = 0;
    const Status status = driver.process_memory(job.peer.pid, gpus[g].device, &bytes);
    if (status.code() == Errc::kNotSupported) {
      audit_supported = false;
      ZICO_LOG(kWarn, "the %s backend cannot tell what a process holds: jobs that keep memory they gave back "
                      "go unseen by the budget (their data still stays their own)", driver.name());
      return;
    }
    if (!status.is_ok()) {
      if (!job.audit_denied) {
        ZICO_LOG(kWarn, "cannot check what job %llu (pid %d) holds: %s", static_cast<unsigned long long>(job.id),
                 job.peer.pid, status.message().c_str());
        job.audit_denied = true;
      }
      return;
    }
    const auto gpu = static_cast<uint32_t>(g);
    const uint64_t chunk = gpus[g].chunk_bytes;
    const uint64_t lent = lent_chunks(job, gpu);
    const uint64_t holds = bytes / chunk + (bytes % chunk != 0 ? 1 : 0);
    const uint64_t excess = holds > lent ? holds - lent : 0;
    // Never charged beyond what it could have asked for: a process that
    // makes look-alike memory of its own gains nothing it could not have had.
    Ledger::JobView view;
    (void)ledger.job(job.id, gpu, now_ns(), &view);
    const uint64_t most = std::min(view.max, ledger.gpu(gpu).budget);
    settle_excess(job, gpu, std::min(excess, most > lent ? most - lent : 0));
  }
}

void Daemon::Impl::settle_excess(Job& job, uint32_t gpu, uint64_t excess) {
  JobGpu& held = job.gpus[gpu];
  if (excess == held.charged) return;
  std::string why;
  const Status status = excess > held.charged ? ledger.charge(job.id, gpu, excess - held.charged, &why)
                                              : ledger.uncharge(job.id, gpu, held.charged - excess, &why);
  if (!status.is_ok()) {
    ZICO_LOG(kError, "job %llu: %s", static_cast<unsigned long long>(job.id), why.c_str());
    return;
  }
  const uint64_t chunk = gpus[gpu].chunk_bytes;
  if (excess > held.charged) {
    static constexpr const char* kActions[] = {"counted against the budget", "its requests are refused until it lets go",
                                               "its process is killed"};
    ZICO_LOG(kWarn, "job %llu (pid %d, uid %u) holds %s of GPU %u beyond the %s it was lent (memory it gave back "
                    "and kept): %s",
             static_cast<unsigned long long>(job.id), job.peer.pid, job.peer.uid,
             format_size(excess * chunk).c_str(), gpu, format_size(lent_chunks(job, gpu) * chunk).c_str(),
             kActions[static_cast<int>(options.overuse)]);
    if (options.overuse == OveruseAction::kKill) (void)send_signal(job.pidfd, SIGKILL);
  } else if (excess == 0) {
    ZICO_LOG(kInfo, "job %llu let go of what it held beyond its grant on GPU %u", static_cast<unsigned long long>(job.id),
             gpu);
  }
  held.charged = excess;
  record_holding(job, gpu);
}

// --- time shift ----------------------------------------------------------------------------

void Daemon::Impl::open_gates() {
  GateGuard* guard = options.start_guard || options.turns ? this : nullptr;
  for (const IterationGates::Opened& opened : gates.due(now_ns(), guard)) {
    auto it = jobs.find(opened.job);
    if (it != jobs.end() && it->second.fd >= 0) (void)send(it->second.fd, proto::Proceed{opened.sequence});
  }
  itimerspec when{};  // all zero: disarmed
  if (const uint64_t next = gates.next_due_ns(); next != UINT64_MAX) {
    // CLOCK_MONOTONIC is steady_clock's clock; an absolute 0 would disarm.
    const uint64_t at = std::max<uint64_t>(next, 1);
    when.it_value.tv_sec = static_cast<time_t>(at / 1'000'000'000);
    when.it_value.tv_nsec = static_cast<long>(at % 1'000'000'000);
  }
  (void)::timerfd_settime(gate_timer_fd, TFD_TIMER_ABSTIME, &when, nullptr);
}

std::pair<uint64_t, uint64_t> Daemon::Impl::gate_claim(const Job& job, uint32_t gpu) const {
  const JobGpu& state = job.gpus[gpu];
  if (state.gate_peak == 0) return {0, 0};
  Ledger::JobView view;
  (void)ledger.job(job.id, gpu, now_ns(), &view);
  return {std::max(state.gate_peak, view.held), state.gate_settle};
}

bool Daemon::Impl::may_start(JobId id) {
  auto it = jobs.find(id);
  if (it == jobs.end()) return true;
  Job& job = it->second;
  for (size_t g = 0; g < job.gpus.size(); ++g) {
    if (!job.gpus[g].open) continue;
    const auto gpu = static_cast<uint32_t>(g);
    const auto [peak, settle] = gate_claim(job, gpu);
    const uint64_t now = now_ns();
    if (options.start_guard ? ledger.may_start(job.id, gpu, peak, settle, now)
                            : ledger.turns_allow_start(job.id, gpu, peak, now)) {
      continue;
    }
    // Turns: the ledger learns the peak it waits for, and the next pump
    // parks the job in its way.
    if (options.turns) (void)ledger.set_between_iterations(job.id, gpu, peak);
    if (!job.gate_held) {
      job.gate_held = true;
      ZICO_LOG(kDebug,
               "job %llu held at its gate: on GPU %u its iteration (claim %llu/%llu chunks, 0: unknown) "
               "is not safe beside the jobs in mid-iteration, or waits for its turn",
               static_cast<unsigned long long>(job.id), gpu, static_cast<unsigned long long>(peak),
               static_cast<unsigned long long>(settle));
    }
    return false;
  }
  return true;
}

uint64_t Daemon::Impl::turn_wait_until_ns(JobId id, uint64_t now) {
  auto it = jobs.find(id);
  if (it == jobs.end()) return 0;
  uint64_t until = 0;
  for (size_t g = 0; g < it->second.gpus.size(); ++g) {
    if (!it->second.gpus[g].open) continue;
    const auto gpu = static_cast<uint32_t>(g);
    // Parked, it waits for its kResume, which the ledger sends when its time
    // is up: its gate opening before would only make it claim while suspended.
    Ledger::JobView view;
    if (ledger.job(id, gpu, now, &view) && view.parked) return now;
    until = std::max(until, ledger.turn_wait_until_ns(gpu, now));
  }
  return until;
}

// Peak 0 ends "between iterations" without a claim: a job whose iteration is
// unknown counts as in mid-iteration, so that others' starts wait for it.
void Daemon::Impl::starting(JobId id) {
  auto it = jobs.find(id);
  if (it == jobs.end()) return;
  Job& job = it->second;
  if (job.gate_held) {
    ZICO_LOG(kDebug, "job %llu starts its held iteration", static_cast<unsigned long long>(job.id));
    job.gate_held = false;
  }
  for (size_t g = 0; g < job.gpus.size(); ++g) {
    if (!job.gpus[g].open) continue;
    const auto gpu = static_cast<uint32_t>(g);
    const auto [peak, settle] = gate_claim(job, gpu);
    (void)ledger.set_claim(job.id, gpu, peak, settle);
  }
}

std::string Daemon::Impl::on_curve(Job& job, const proto::Curve& message) {
  if (message.gpu >= gpus.size() || !job.gpus[message.gpu].open) {
    return "Curve for GPU " + std::to_string(message.gpu) + ", which the job has not opened";
  }
  // A job's word about its demand is bounded by what it may ever hold, and
  // a gate delays by at most two of the asking job's own periods, so a wrong
  // curve costs others time, never the budget.
  DemandCurve curve = message.curve;
  // Shorter than this is not a training iteration (two marks back to back):
  // planning on it would only slice the others' time finely.
  if (curve.period_ns < kMinCurvePeriodNs) curve = DemandCurve{};
  Ledger::JobView view;
  (void)ledger.job(job.id, message.gpu, now_ns(), &view);
  const uint64_t chunk = gpus[message.gpu].chunk_bytes;
  const uint64_t limit = std::min(ledger.gpu(message.gpu).budget, view.max);
  const uint64_t bound = limit > UINT64_MAX / chunk ? UINT64_MAX : limit * chunk;
  for (uint64_t& bin : curve.bins) bin = std::min(bin, bound);
  curve.end_bytes = std::min(curve.end_bytes, bound);
  gates.set_curve(job.id, message.gpu, curve);
  open_gates();
  return "";
}

void Daemon::Impl::pump() {
  // Carrying out actions can change the books (a failed grant, a closed
  // connection), so ask again until nothing is left to do.
  for (int round = 0; round < 16; ++round) {
    const std::vector<LedgerAction> actions = ledger.pump(now_ns());
    if (actions.empty()) return;
    for (const LedgerAction& action : actions) {
      auto it = jobs.find(action.job);
      if (it == jobs.end()) continue;
      const int fd = it->second.fd;
      if (action.kind != LedgerAction::Kind::kReclaim) it->second.requests.erase(action.request_id);
      switch (action.kind) {
        case LedgerAction::Kind::kGrant:
          grant(action);
          break;
        case LedgerAction::Kind::kDeny:
          if (fd >= 0) (void)send(fd, proto::Deny{action.request_id, static_cast<uint32_t>(action.errc), action.reason});
          break;
        case LedgerAction::Kind::kReclaim:
          if (fd >= 0 && send(fd, proto::Reclaim{action.gpu, action.chunks})) {
            // asked
          } else {
            // Not connected (its process still maps what it holds, or it has not
            // reconnected after a restart): nothing can come back yet; say so for it.
            std::string ignored;
            (void)ledger.returned(action.job, action.gpu, 0, true, now_ns(), &ignored);
          }
          break;
        case LedgerAction::Kind::kYield:
          ZICO_LOG(kInfo, "GPU %u: deadlock; job %llu yields its memory", action.gpu,
                   static_cast<unsigned long long>(action.job));
          if (fd >= 0 && !send(fd, proto::Yield{action.request_id, action.gpu})) {
            close_connection(fd, "cannot send a yield", true);
          }
          break;
        case LedgerAction::Kind::kPark:
          // It waits at its gate: suspended there, it gives everything back
          // and reports kSuspended, as for zico-umctl suspend.
          ZICO_LOG(kInfo, "GPU %u: job %llu is in the way of another's iteration; it waits its turn in host memory",
                   action.gpu, static_cast<unsigned long long>(action.job));
          if (fd >= 0 && send(fd, proto::Suspend{proto::StoreKind::kHost})) {
            if (runs(it->second.state)) {
              it->second.state = proto::JobRunState::kSuspendRequested;
            }
          } else if (fd >= 0) {
            close_connection(fd, "cannot send a suspension", true);
          }
          break;
        case LedgerAction::Kind::kResume:  // only ever for a job it parked
          ZICO_LOG(kInfo, "GPU %u: job %llu has its turn", action.gpu, static_cast<unsigned long long>(action.job));
          if (fd >= 0 && !send(fd, proto::Resume{})) close_connection(fd, "cannot send a resumption", true);
          break;
      }
    }
  }
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
  for (int fd : {d.listen_fd, d.epoll_fd, d.timer_fd, d.gate_timer_fd, d.signal_fd, d.stop_fd, d.stop_write,
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
        const uint64_t now = now_ns();
        const proto::StatusReply now_status = d.status();
        d.rates.sample(now, now_status);
        d.publish_metrics(now_status, now);
        d.expire_idle_connections(now);
        d.expire_expected();
        d.audit(now_ns());
        d.pump();
        d.open_gates();
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
