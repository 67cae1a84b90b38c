#include "node_client.h"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <mutex>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "log.h"
#include "protocol.h"
#include "sizes.h"
#include "usage_tracker.h"
#include "wire.h"

namespace zico::sharing {
namespace {

uint64_t now_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

std::string program_name() {
  std::ifstream comm("/proc/self/comm");
  std::string name;
  std::getline(comm, name);
  std::string clean;
  for (char c : name) clean += (c >= 0x20 && c <= 0x7e) ? c : '?';
  return clean.substr(0, proto::kMaxString);
}

// Ids handed to the allocator carry the connection they came from: after a
// reconnection the new daemon knows nothing of the old ids, and an old id
// must never be mistaken for a new chunk with the same number.
uint64_t tag(uint64_t generation, uint32_t id) { return generation << 32 | id; }
uint32_t untag(uint64_t tagged) { return static_cast<uint32_t>(tagged); }

// A reconnection's handshake replies must come promptly; a daemon that hangs
// is treated as gone, and the link tries again later.
constexpr int kHandshakeTimeoutMs = 2000;

// The first registration and the opening of a GPU wait as long as an
// allocation waits for memory: till then the job may not allocate at all.
int wait_timeout_ms(const NodeClientOptions& options) {
  return static_cast<int>(std::min<uint64_t>(options.wait_timeout_ns / 1'000'000, INT32_MAX));
}
// After a timeout, how long to wait for the daemon to confirm the cancel.
constexpr auto kCancelGrace = std::chrono::seconds(5);

// When the current allocation call first waited (AllocationWaitScope).
thread_local std::optional<std::chrono::steady_clock::time_point> t_first_wait;
thread_local bool t_in_scope = false;

}  // namespace

AllocationWaitScope::AllocationWaitScope() noexcept : outermost_(!t_in_scope) { t_in_scope = true; }

AllocationWaitScope::~AllocationWaitScope() {
  if (!outermost_) return;
  t_in_scope = false;
  t_first_wait.reset();
}

class LentChunkSource;

struct NodeClient::Impl {
  Impl(Driver& d, NodeClientOptions o) : driver(d), options(std::move(o)) {}

  struct Gpu {
    DeviceId device;
    proto::GpuUuid uuid{};
    uint32_t index = 0;         // the daemon's number for it
    size_t chunk_bytes = 0;
    bool open_now = false;      // opened on the current connection
    uint64_t held = 0;          // chunks this job holds there, whoever lent them
    uint64_t local_limit = 0;   // while disconnected, held may grow up to this
    std::unordered_set<uint64_t> lent_ids;  // tagged ids lent on the current connection
    uint64_t min_bytes = 0;
    uint64_t max_bytes = 0;
    bool answered = false;      // the daemon answered OpenGpu
    DeviceAllocator* allocator = nullptr;
    std::unique_ptr<LentChunkSource> source;
    // Guarded by pattern_mu, not mu: fed on every allocation.
    UsageTracker tracker;
    uint64_t sent_version = 0;     // tracker curve version last sent...
    uint64_t sent_generation = 0;  // ...on this connection
    bool gate_pending = false;     // detection found a boundary; the next allocation passes the gate
    // The tracker's outlook, for the claims sent with each Request and
    // IterationMark (see claim_for, gate_claims_locked). Written under
    // pattern_mu wherever the tracker is fed, read by obtain() and
    // iteration_gate() under mu alone: pattern_mu comes before mu, and both
    // hold mu. Each is read on its own, so a request may see one a step
    // older than another; a claim is an estimate anyway.
    std::atomic<uint64_t> outlook_peak_bytes{0};  // remaining_peak_bytes(): 0 unknown
    std::atomic<uint64_t> outlook_live_bytes{0};
    std::atomic<uint64_t> outlook_end_bytes{0};   // curve().end_bytes
    std::atomic<uint64_t> outlook_next_peak_bytes{0};  // next_iteration_peak_bytes(): 0 unknown
  };

  struct Pending {
    size_t gpu_slot = 0;
    uint64_t chunks = 0;
    enum class State : uint8_t { kWaiting, kGranted, kDenied, kYield, kLost } state = State::kWaiting;
    std::vector<SourcedChunk> received;
    std::string reason;
  };

  Driver& driver;
  NodeClientOptions options;

  // Guards everything below; sends happen under it too (the daemon never
  // waits on us to read, so holding it across a send cannot deadlock).
  mutable std::mutex mu;
  std::condition_variable cv;
  std::atomic<int> fd{-1};
  uint64_t generation = 0;
  uint64_t job_id = 0;
  bool stopping = false;
  bool said_gone = false;
  int wake_fd = -1;
  std::thread link;
  std::map<uint64_t, Pending> pending;
  uint64_t next_request = 0;
  std::vector<std::unique_ptr<Gpu>> gpus;
  std::deque<size_t> awaiting_open;  // gpu slots whose OpenGpu is unanswered
  std::string last_failure;
  // zico-umctl suspend / resume.
  std::atomic<bool> suspend_requested{false};
  proto::StoreKind suspend_to = proto::StoreKind::kHost;
  bool resume_requested = false;
  bool paused = false;  // evicted and waiting for kResume
  // The daemon is alive but this connection ended (it said Goodbye, or we
  // could not read it): the chunks we gave back may still be counted there,
  // so nothing may be created locally, and reconnecting is tried slowly.
  bool cut_off = false;
  bool got_goodbye = false;
  // The iteration gate: marks sent and the highest go received.
  uint64_t gate_sequence = 0;
  uint64_t gate_open = 0;
  // Guards the trackers (see Gpu); taken before mu when both are needed.
  std::mutex pattern_mu;
  // The trackers' clock: job time less the time spent waiting at gates, so
  // a learned iteration is the job's own work, not the schedule's delays.
  // Guarded by pattern_mu.
  uint64_t stalled_ns = 0;
  uint64_t last_progress_ns = 0;
  uint64_t progress_now_locked() {
    const uint64_t now = now_ns();
    last_progress_ns = std::max(last_progress_ns, now - std::min(now, stalled_ns));
    return last_progress_ns;
  }

  // --- connection -------------------------------------------------------------
  // Registers on `socket`, each answer awaited at most timeout_ms.
  Status handshake(int socket, int timeout_ms, std::string* why);
  bool send_locked(const proto::Message& message, std::string* why = nullptr);
  // daemon_alive: we end the connection, not the daemon (see cut_off).
  void disconnect_locked(const std::string& reason, bool daemon_alive);
  bool try_reconnect();

  // --- the link thread --------------------------------------------------------
  void run_link();
  void handle(const proto::Message& message, std::vector<int>& fds);
  void on_grant(const proto::Grant& grant, std::vector<int>& fds);
  void on_reclaim(const proto::Reclaim& reclaim);
  void send_reports();

  // --- claims -------------------------------------------------------------------
  // Copies the tracker's outlook into the atomics (pattern_mu held).
  static void refresh_outlook(Gpu& gpu);
  // Fills in the claim of a request for `count` chunks (mu held).
  static void claim_for(const Gpu& gpu, uint64_t count, proto::Request* request);
  // The claims of the iteration the job would begin, for its IterationMark
  // (mu held): one per open GPU whose next iteration is known.
  std::vector<proto::GateClaim> gate_claims_locked() const;

  // --- chunk source -----------------------------------------------------------
  Status obtain(size_t slot, size_t count, Patience patience, std::vector<SourcedChunk>* out);
  void give_back(size_t slot, std::span<const uint64_t> ids);
  // Tells the daemon (if connected) that these chunks are unmapped.
  void return_ids_locked(Gpu& gpu, std::span<const uint64_t> ids);
  // Releases chunks nobody will map and returns them.
  void return_received_locked(Gpu& gpu, std::vector<SourcedChunk>& chunks);
  Gpu* gpu_by_index(uint32_t index) {
    for (auto& g : gpus) {
      if (g->open_now && g->index == index) return g.get();
    }
    return nullptr;
  }
};

class LentChunkSource final : public ChunkSource {
 public:
  LentChunkSource(NodeClient::Impl& impl, size_t slot) : impl_(impl), slot_(slot) {}
  Status obtain(size_t count, Patience patience, std::vector<SourcedChunk>* out) noexcept override {
    try {
      return impl_.obtain(slot_, count, patience, out);
    } catch (const std::bad_alloc&) {
      return Status(Errc::kOutOfMemory);
    }
  }
  void release_handle(PhysHandle handle) noexcept override { (void)impl_.driver.release(handle); }
  void give_back(std::span<const uint64_t> ids) noexcept override {
    try {
      impl_.give_back(slot_, ids);
    } catch (const std::bad_alloc&) {
      ZICO_LOG(kError, "no host memory to tell zico-umd about %zu returned chunks", ids.size());
    }
  }
  std::string last_failure() const override {
    std::lock_guard lock(impl_.mu);
    return impl_.last_failure;
  }

 private:
  NodeClient::Impl& impl_;
  size_t slot_;
};

namespace {
// The forked child of a job must not keep the job's connection alive.
std::atomic<NodeClient::Impl*> g_fork_guard{nullptr};
void lock_before_fork();
void unlock_in_parent();
void close_socket_in_child();
}  // namespace

// --- fork ------------------------------------------------------------------------
// The child must not keep the job's connection, and must not inherit a locked
// mutex (its link thread does not exist there): it gives up on the daemon.

namespace {
void lock_before_fork() {
  if (NodeClient::Impl* impl = g_fork_guard.load()) {
    impl->pattern_mu.lock();
    impl->mu.lock();
  }
}
void unlock_in_parent() {
  if (NodeClient::Impl* impl = g_fork_guard.load()) {
    impl->mu.unlock();
    impl->pattern_mu.unlock();
  }
}
void close_socket_in_child() {
  if (NodeClient::Impl* impl = g_fork_guard.load()) {
    const int fd = impl->fd.exchange(-1);
    if (fd >= 0) ::close(fd);
    impl->stopping = true;  // allocations needing the daemon fail at once
    impl->mu.unlock();
    impl->pattern_mu.unlock();
  }
}
}  // namespace

// --- connection ----------------------------------------------------------------

bool NodeClient::Impl::send_locked(const proto::Message& message, std::string* why) {
  std::string error;
  const int socket = fd.load();
  if (socket < 0) return false;
  if (!wire::send_message(socket, message, {}, &error)) {
    ZICO_LOG(kDebug, "sending %s to zico-umd failed: %s", proto::to_string(proto::type_of(message)), error.c_str());
    if (why != nullptr) *why = error;
    return false;
  }
  return true;
}

// Waits for one message on a blocking socket, at most timeout_ms.
static wire::Received receive_within(int socket, int timeout_ms, proto::Message* out, std::vector<int>* fds,
                                     std::string* why) {
  pollfd p{socket, POLLIN, 0};
  const int ready = ::poll(&p, 1, timeout_ms);
  if (ready == 0) {
    *why = "zico-umd did not answer within " + std::to_string(timeout_ms) + " ms";
    return wire::Received::kError;
  }
  return wire::receive_message(socket, out, fds, why);
}

Status NodeClient::Impl::handshake(int socket, int timeout_ms, std::string* why) {
  // Before anything is said: the chunks it would lend are memory it can read.
  wire::PeerCredentials peer;
  if (!wire::peer_credentials(socket, &peer, why)) return Status(Errc::kOsError);
  if (peer.uid != 0 && peer.uid != options.daemon_uid && peer.uid != ::getuid()) {
    *why = "the process listening on " + options.socket_path + " (pid " + std::to_string(peer.pid) + ") runs as uid " +
           std::to_string(peer.uid) + ", which is not root, this job's user or ZICO_DAEMON_USER: not trusted with "
           "this job's memory";
    return Status(Errc::kInvalidArgument);
  }
  const auto expect = [&](auto* reply) -> Status {
    using Want = std::remove_pointer_t<decltype(reply)>;
    for (;;) {
      proto::Message message;
      std::vector<int> fds;
      const wire::Received got = receive_within(socket, timeout_ms, &message, &fds, why);
      for (int f : fds) ::close(f);
      if (got == wire::Received::kClosed) *why = "zico-umd closed the connection";
      if (got != wire::Received::kMessage) return Status(Errc::kOsError);
      if (auto* bye = std::get_if<proto::Goodbye>(&message)) {
        *why = "zico-umd refused the job: " + bye->reason;
        return Status(Errc::kInvalidArgument);
      }
      if (auto* want = std::get_if<Want>(&message)) {
        *reply = *want;
        return Status::ok();
      }
      if (auto* reclaim = std::get_if<proto::Reclaim>(&message)) {
        // Nothing to give before every GPU is open again; say so.
        proto::Return none;
        none.gpu = reclaim->gpu;
        none.reclaim_reply = true;
        std::string ignored;
        (void)wire::send_message(socket, none, {}, &ignored);
        continue;
      }
      ZICO_LOG(kDebug, "ignoring %s from zico-umd during the handshake", proto::to_string(proto::type_of(message)));
    }
  };
  std::string error;
  if (!wire::send_message(socket, proto::Hello{job_id, options.job_name}, {}, &error)) {
    *why = "registering with zico-umd failed: " + error;
    return Status(Errc::kOsError);
  }
  proto::Welcome welcome;
  ZICO_RETURN_IF_ERROR(expect(&welcome));
  for (auto& gpu : gpus) {
    if (gpu->chunk_bytes == 0) continue;  // never opened
    if (!wire::send_message(socket, proto::OpenGpu{gpu->uuid, gpu->held}, {}, &error)) {
      *why = "reopening GPU " + std::to_string(gpu->device.value) + " with zico-umd failed: " + error;
      return Status(Errc::kOsError);
    }
    proto::GpuOpened opened;
    ZICO_RETURN_IF_ERROR(expect(&opened));
    if (opened.chunk_bytes != gpu->chunk_bytes) {
      *why = "zico-umd now uses " + format_size(opened.chunk_bytes) + " chunks on GPU " +
             std::to_string(gpu->device.value) + ", this job " + format_size(gpu->chunk_bytes) +
             "; it keeps running on what it holds";
      return Status(Errc::kInvalidArgument);
    }
    gpu->index = opened.gpu;
    gpu->min_bytes = opened.min_bytes;
    gpu->max_bytes = opened.max_bytes;
  }
  job_id = welcome.job_id;
  return Status::ok();
}

void NodeClient::Impl::disconnect_locked(const std::string& reason, bool daemon_alive) {
  const int socket = fd.exchange(-1);
  if (socket >= 0) ::close(socket);
  cut_off = daemon_alive || got_goodbye;
  got_goodbye = false;
  for (auto& gpu : gpus) {
    if (gpu->open_now) gpu->local_limit = cut_off ? 0 : gpu->held;
    gpu->open_now = false;
  }
  for (auto& [id, request] : pending) {
    if (request.state == Pending::State::kWaiting) request.state = Pending::State::kLost;
  }
  awaiting_open.clear();
  if (!said_gone) {
    ZICO_LOG(kWarn, "lost zico-umd (%s); running on the memory this job holds until it returns", reason.c_str());
    said_gone = true;
  }
  cv.notify_all();
}

bool NodeClient::Impl::try_reconnect() {
  std::string why;
  const int socket = wire::connect_unix(options.socket_path, &why, kHandshakeTimeoutMs);
  if (socket < 0) return false;
  std::lock_guard lock(mu);
  if (Status status = handshake(socket, kHandshakeTimeoutMs, &why); !status.is_ok()) {
    ZICO_LOG(kDebug, "reconnecting to zico-umd failed: %s", why.c_str());
    ::close(socket);
    return false;
  }
  ++generation;
  for (auto& gpu : gpus) {
    if (gpu->chunk_bytes == 0) continue;
    gpu->open_now = true;
    gpu->lent_ids.clear();  // what we hold is unowned for this daemon
  }
  fd.store(socket);
  said_gone = false;
  cut_off = false;
  // The new daemon knows of no suspension: a paused job resumes, and one
  // that was asked but has not paused yet forgets it.
  resume_requested = true;
  if (!paused) suspend_requested.store(false);
  ZICO_LOG(kInfo, "reconnected to zico-umd as job %llu", static_cast<unsigned long long>(job_id));
  cv.notify_all();
  return true;
}

// --- the link thread -------------------------------------------------------------

void NodeClient::Impl::run_link() {
  uint64_t next_report = now_ns() + options.report_interval_ns;
  uint64_t cut_off_ticks = 0;
  for (;;) {
    {
      std::lock_guard lock(mu);
      if (stopping) return;
    }
    const int socket = fd.load();
    const uint64_t now = now_ns();
    uint64_t wait_ns = next_report > now ? next_report - now : 0;
    if (socket < 0) wait_ns = std::min(wait_ns, options.reconnect_interval_ns);
    bool slow = false;
    {
      std::lock_guard lock(mu);
      slow = cut_off;
    }
    pollfd polls[2] = {{wake_fd, POLLIN, 0}, {socket, POLLIN, 0}};
    const int ready = ::poll(polls, socket >= 0 ? 2 : 1, static_cast<int>(wait_ns / 1'000'000) + 1);
    if (ready < 0 && errno != EINTR) return;
    if ((polls[0].revents & POLLIN) != 0) return;  // stopping
    if (socket < 0) {
      // Cut off by a live daemon: it refuses us until we exit; ask rarely.
      if (!slow || ++cut_off_ticks % 50 == 0) (void)try_reconnect();
    } else if (polls[1].revents != 0) {
      proto::Message message;
      std::vector<int> fds;
      std::string why;
      switch (wire::receive_message(socket, &message, &fds, &why)) {
        case wire::Received::kMessage:
          handle(message, fds);
          break;
        case wire::Received::kWouldBlock:
          break;
        case wire::Received::kClosed: {
          std::lock_guard lock(mu);
          if (fd.load() == socket) disconnect_locked("the daemon closed the connection", false);
          break;
        }
        case wire::Received::kMalformed: {  // we end it: the daemon lives on
          std::lock_guard lock(mu);
          if (fd.load() == socket) disconnect_locked(why, true);
          break;
        }
        case wire::Received::kError: {  // e.g. ECONNRESET: the daemon died
          std::lock_guard lock(mu);
          if (fd.load() == socket) disconnect_locked(why, false);
          break;
        }
      }
      for (int f : fds) ::close(f);
    }
    if (now_ns() >= next_report) {
      send_reports();
      next_report = now_ns() + options.report_interval_ns;
    }
  }
}

void NodeClient::Impl::handle(const proto::Message& message, std::vector<int>& fds) {
  if (const auto* grant = std::get_if<proto::Grant>(&message)) {
    on_grant(*grant, fds);
    return;
  }
  if (const auto* reclaim = std::get_if<proto::Reclaim>(&message)) {
    on_reclaim(*reclaim);
    return;
  }
  std::lock_guard lock(mu);
  if (const auto* deny = std::get_if<proto::Deny>(&message)) {
    auto it = pending.find(deny->request_id);
    if (it != pending.end() && it->second.state == Pending::State::kWaiting) {
      it->second.state = Pending::State::kDenied;
      it->second.reason = deny->reason;
      cv.notify_all();
    }
  } else if (const auto* yield = std::get_if<proto::Yield>(&message)) {
    auto it = pending.find(yield->request_id);
    if (it != pending.end() && it->second.state == Pending::State::kWaiting) {
      it->second.state = Pending::State::kYield;
      cv.notify_all();
    }
  } else if (const auto* opened = std::get_if<proto::GpuOpened>(&message)) {
    if (awaiting_open.empty()) return;
    Gpu& gpu = *gpus[awaiting_open.front()];
    awaiting_open.pop_front();
    gpu.answered = true;
    if (opened->chunk_bytes != 0) {  // 0: the daemon does not manage this GPU
      gpu.index = opened->gpu;
      gpu.chunk_bytes = opened->chunk_bytes;
      gpu.min_bytes = opened->min_bytes;
      gpu.max_bytes = opened->max_bytes;
      gpu.open_now = true;
    }
    cv.notify_all();
  } else if (const auto* suspend = std::get_if<proto::Suspend>(&message)) {
    suspend_to = suspend->to;
    resume_requested = false;
    suspend_requested.store(true);
    cv.notify_all();  // a job waiting at its gate suspends there
  } else if (std::holds_alternative<proto::Resume>(message)) {
    if (paused) {
      resume_requested = true;
      cv.notify_all();
    } else if (suspend_requested.exchange(false)) {
      (void)send_locked(proto::JobState{proto::JobRunState::kRunning});  // it never got to pause
    }
  } else if (const auto* proceed = std::get_if<proto::Proceed>(&message)) {
    gate_open = std::max(gate_open, proceed->sequence);
    cv.notify_all();
  } else if (const auto* limits = std::get_if<proto::Limits>(&message)) {
    if (Gpu* gpu = gpu_by_index(limits->gpu)) {
      gpu->min_bytes = limits->min_bytes;
      gpu->max_bytes = limits->max_bytes;
    }
  } else if (const auto* bye = std::get_if<proto::Goodbye>(&message)) {
    ZICO_LOG(kWarn, "zico-umd says goodbye: %s", bye->reason.c_str());
    got_goodbye = true;
  } else {
    ZICO_LOG(kDebug, "ignoring unexpected %s from zico-umd", proto::to_string(proto::type_of(message)));
  }
}

void NodeClient::Impl::on_grant(const proto::Grant& grant, std::vector<int>& fds) {
  std::lock_guard lock(mu);
  Gpu* gpu = gpu_by_index(grant.gpu);
  std::vector<SourcedChunk> chunks;
  bool import_failed = false;
  for (size_t i = 0; i < grant.ids.size(); ++i) {
    PhysHandle handle;
    if (Status status = driver.import_fd(fds[i], &handle); !status.is_ok()) {
      ZICO_LOG(kError, "importing chunk %u from zico-umd failed: %s", grant.ids[i], status.message().c_str());
      import_failed = true;
      handle = PhysHandle{};
    }
    chunks.push_back(SourcedChunk{handle, tag(generation, grant.ids[i])});
  }
  for (int& f : fds) {
    ::close(f);
    f = -1;
  }
  fds.clear();
  if (gpu == nullptr) {
    // Not a GPU of this connection (a confused daemon): drop what came.
    for (const SourcedChunk& chunk : chunks) {
      if (chunk.handle.valid()) (void)driver.release(chunk.handle);
    }
    return;
  }
  for (const SourcedChunk& chunk : chunks) gpu->lent_ids.insert(chunk.id);
  gpu->held += chunks.size();
  auto it = pending.find(grant.request_id);
  if (it == pending.end() || it->second.state != Pending::State::kWaiting || import_failed) {
    // Nobody waits for these any more (timed out) or they are unusable.
    return_received_locked(*gpu, chunks);
    if (it != pending.end() && it->second.state == Pending::State::kWaiting) {
      return_received_locked(*gpu, it->second.received);
      it->second.state = Pending::State::kDenied;
      it->second.reason = "a chunk from zico-umd could not be imported";
      cv.notify_all();
    }
    return;
  }
  it->second.received.insert(it->second.received.end(), chunks.begin(), chunks.end());
  if (grant.last || it->second.received.size() >= it->second.chunks) {
    if (it->second.received.size() != it->second.chunks || !grant.last) {
      // Not what was asked: give it all back rather than guess.
      return_received_locked(*gpu, it->second.received);
      it->second.state = Pending::State::kDenied;
      it->second.reason = "zico-umd granted a different number of chunks than asked";
    } else {
      it->second.state = Pending::State::kGranted;
    }
    cv.notify_all();
  }
}

void NodeClient::Impl::on_reclaim(const proto::Reclaim& reclaim) {
  DeviceAllocator* allocator = nullptr;
  size_t chunk = 0;
  {
    std::lock_guard lock(mu);
    if (Gpu* gpu = gpu_by_index(reclaim.gpu)) {
      allocator = gpu->allocator;
      chunk = gpu->chunk_bytes;
    }
  }
  size_t freed = 0;
  if (allocator != nullptr) {
    // try_trim never waits for an allocation in progress (which may itself be
    // waiting for the daemon); the daemon asks again later.
    const uint64_t want = reclaim.chunks > SIZE_MAX / chunk ? SIZE_MAX : reclaim.chunks * chunk;
    (void)allocator->try_trim(static_cast<size_t>(want), &freed);  // gives back through give_back()
  }
  std::lock_guard lock(mu);
  proto::Return reply;
  reply.gpu = reclaim.gpu;
  reply.reclaim_reply = true;
  (void)send_locked(reply);
}

void NodeClient::Impl::send_reports() {
  std::vector<std::pair<Gpu*, DeviceAllocator*>> targets;
  {
    std::lock_guard lock(mu);
    for (auto& gpu : gpus) {
      if (gpu->open_now && gpu->allocator != nullptr) targets.emplace_back(gpu.get(), gpu->allocator);
    }
  }
  for (auto [gpu, allocator] : targets) {
    AllocatorStats stats;
    if (!allocator->try_stats(&stats)) continue;  // busy: next time
    std::lock_guard lock(mu);
    if (!gpu->open_now) continue;
    (void)send_locked(proto::Report{gpu->index, stats.allocated_bytes, stats.last_iteration_low_bytes,
                                    stats.iterations});
  }
}

// --- chunk source -------------------------------------------------------------------

void NodeClient::Impl::return_received_locked(Gpu& gpu, std::vector<SourcedChunk>& chunks) {
  std::vector<uint64_t> ids;
  for (const SourcedChunk& chunk : chunks) {
    if (chunk.handle.valid()) (void)driver.release(chunk.handle);
    ids.push_back(chunk.id);
  }
  chunks.clear();
  return_ids_locked(gpu, ids);
}

void NodeClient::Impl::give_back(size_t slot, std::span<const uint64_t> ids) {
  std::lock_guard lock(mu);
  return_ids_locked(*gpus[slot], ids);
}

void NodeClient::Impl::return_ids_locked(Gpu& gpu, std::span<const uint64_t> ids) {
  if (ids.empty()) return;
  gpu.held -= std::min<uint64_t>(gpu.held, ids.size());
  if (!gpu.open_now) return;  // the memory died with the unmap, or the old daemon counts it
  proto::Return message;
  message.gpu = gpu.index;
  for (uint64_t id : ids) {
    if (gpu.lent_ids.erase(id) != 0) {
      message.ids.push_back(untag(id));
    } else {
      ++message.unowned;  // lent by an earlier daemon, or created while it was away
    }
    if (message.ids.size() == proto::kMaxChunksPerMessage) {
      (void)send_locked(message);
      message.ids.clear();
      message.unowned = 0;
    }
  }
  if (!message.ids.empty() || message.unowned != 0) (void)send_locked(message);
}

void NodeClient::Impl::refresh_outlook(Gpu& gpu) {
  gpu.outlook_peak_bytes.store(gpu.tracker.remaining_peak_bytes(), std::memory_order_relaxed);
  gpu.outlook_live_bytes.store(gpu.tracker.live_bytes(), std::memory_order_relaxed);
  gpu.outlook_end_bytes.store(gpu.tracker.curve().end_bytes, std::memory_order_relaxed);
  gpu.outlook_next_peak_bytes.store(gpu.tracker.next_iteration_peak_bytes(), std::memory_order_relaxed);
}

namespace {

uint64_t chunks_for(uint64_t bytes, uint64_t chunk) { return bytes / chunk + (bytes % chunk != 0 ? 1 : 0); }

struct ClaimChunks {
  uint32_t peak = 0;
  uint32_t settle = 0;
};

// A claim in chunks (see claim_for): at least `held_chunks`, what the job
// will surely hold, never below the peak in bytes, at most what the wire
// carries; settle at most the peak.
ClaimChunks claim_chunks(uint64_t held_chunks, uint64_t peak_bytes, uint64_t end_bytes, uint64_t chunk) {
  const uint64_t peak = std::min<uint64_t>(std::max(held_chunks, chunks_for(peak_bytes, chunk)), UINT32_MAX);
  return {static_cast<uint32_t>(peak), static_cast<uint32_t>(std::min(peak, chunks_for(end_bytes, chunk)))};
}

}  // namespace

// The claim tells the daemon's deadlock avoidance (ledger.h, claims) the most
// chunks this job will hold on the GPU before its iteration ends, and what it
// keeps after. The tracker speaks of bytes of live blocks and the daemon of
// chunks, so this is an estimate: what is still to be allocated (the peak
// ahead less what is live now) comes on top of the chunks held now, which
// already carry the allocator's packing waste and its cached free chunks;
// cached chunks may serve part of what is to come (the claim is then too
// high, which only makes the daemon more careful), and new blocks may pack
// worse than the bytes say (too low, which weakens the avoidance; the
// daemon still breaks a deadlock then). Never below the peak in bytes
// alone: after a Yield or a suspension the job holds less than is live.
void NodeClient::Impl::claim_for(const Gpu& gpu, uint64_t count, proto::Request* request) {
  const uint64_t peak_bytes = gpu.outlook_peak_bytes.load(std::memory_order_relaxed);
  const uint64_t chunk = gpu.chunk_bytes;
  if (peak_bytes == 0 || chunk == 0) return;  // unknown: no claim (0 / 0)
  const uint64_t live_bytes = gpu.outlook_live_bytes.load(std::memory_order_relaxed);
  const uint64_t more = std::max(count, chunks_for(peak_bytes > live_bytes ? peak_bytes - live_bytes : 0, chunk));
  const uint64_t held = gpu.held > UINT64_MAX - more ? UINT64_MAX : gpu.held + more;
  const ClaimChunks claim =
      claim_chunks(held, peak_bytes, gpu.outlook_end_bytes.load(std::memory_order_relaxed), chunk);
  request->claim_peak_chunks = claim.peak;
  request->claim_settle_chunks = claim.settle;
}

// At the gate the job holds what it keeps between iterations (its idle
// chunks went back just before the mark); the tracker's peak for the
// iteration it would begin already counts what is live now, so it is the
// claim, in chunks as claim_for rounds them, never below what is held.
// No memory for the list: no claims (unknown), which only makes the daemon
// more careful; iteration_gate() must not throw.
std::vector<proto::GateClaim> NodeClient::Impl::gate_claims_locked() const try {
  std::vector<proto::GateClaim> claims;
  for (const auto& gpu : gpus) {
    const uint64_t peak_bytes = gpu->outlook_next_peak_bytes.load(std::memory_order_relaxed);
    if (!gpu->open_now || gpu->chunk_bytes == 0 || peak_bytes == 0) continue;
    if (claims.size() == proto::kMaxGpus) break;
    const ClaimChunks claim = claim_chunks(gpu->held, peak_bytes,
                                           gpu->outlook_end_bytes.load(std::memory_order_relaxed), gpu->chunk_bytes);
    claims.push_back(proto::GateClaim{gpu->index, claim.peak, claim.settle});
  }
  return claims;
} catch (const std::bad_alloc&) {
  return {};
}

Status NodeClient::Impl::obtain(size_t slot, size_t count, Patience patience, std::vector<SourcedChunk>* out) {
  if (count == 0) return Status::ok();
  std::unique_lock lock(mu);
  Gpu& gpu = *gpus[slot];
  if (!t_first_wait) t_first_wait = std::chrono::steady_clock::now();
  const auto start = *t_first_wait;
  if (!t_in_scope) t_first_wait.reset();  // no scope: each call has its own timeout
  const auto deadline = patience == Patience::kForever
                            ? std::chrono::steady_clock::time_point::max()
                            : start + std::chrono::nanoseconds(options.wait_timeout_ns);
  const auto fail = [&](std::string reason) {
    last_failure = std::move(reason);
    ZICO_LOG(kWarn, "%s", last_failure.c_str());
    return Status(Errc::kOutOfMemory);
  };
  const auto timed_out = [&] {
    return fail("waited " +
                std::to_string(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()) +
                " s for zico-umd to lend " + format_size(count * gpu.chunk_bytes) + " on GPU " +
                std::to_string(gpu.device.value) +
                "; out of memory (raise ZICO_WAIT_TIMEOUT, or the budget with zico-umctl budget)");
  };
  for (;;) {
    if (stopping) return Status(Errc::kOutOfMemory);
    if (fd.load() >= 0 && gpu.open_now) {
      const uint64_t id = ++next_request;
      Pending& queued = pending[id];
      queued.gpu_slot = slot;
      queued.chunks = count;
      proto::Request message{id, gpu.index, static_cast<uint32_t>(count)};
      claim_for(gpu, count, &message);
      if (!send_locked(message)) {
        pending.erase(id);
        cv.wait_for(lock, std::chrono::nanoseconds(options.reconnect_interval_ns));
        continue;
      }
      const auto resolved = [&] { return stopping || pending[id].state != Pending::State::kWaiting; };
      bool cancelled = false;
      if (!cv.wait_until(lock, deadline, resolved)) {
        cancelled = send_locked(proto::Cancel{id});
        cv.wait_for(lock, kCancelGrace, resolved);
      }
      Pending request = std::move(pending[id]);
      pending.erase(id);
      switch (request.state) {
        case Pending::State::kGranted:
          out->insert(out->end(), request.received.begin(), request.received.end());
          return Status::ok();
        case Pending::State::kDenied:
          if (cancelled) return timed_out();
          return fail("zico-umd denied " + format_size(count * gpu.chunk_bytes) + " on GPU " +
                      std::to_string(gpu.device.value) + ": " + request.reason);
        case Pending::State::kYield:
          return_received_locked(gpu, request.received);
          return Status(Errc::kYield);
        case Pending::State::kLost:
          return_received_locked(gpu, request.received);
          continue;  // disconnected: see below
        case Pending::State::kWaiting:
          return_received_locked(gpu, request.received);
          return timed_out();
      }
    }
    // No daemon: keep within what this job held when it left.
    if (gpu.held + count <= gpu.local_limit) {
      const size_t first = out->size();
      for (size_t i = 0; i < count; ++i) {
        PhysHandle handle;
        if (Status status = driver.create(gpu.device, gpu.chunk_bytes, &handle); !status.is_ok()) {
          for (size_t j = first; j < out->size(); ++j) (void)driver.release((*out)[j].handle);
          out->resize(first);
          return status;
        }
        out->push_back(SourcedChunk{handle, 0});
      }
      gpu.held += count;
      return Status::ok();
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return fail("zico-umd is unreachable and this job already holds its last budget (" +
                  format_size(gpu.local_limit * gpu.chunk_bytes) + ") on GPU " + std::to_string(gpu.device.value) +
                  "; out of memory");
    }
    cv.wait_until(lock, std::min(deadline, std::chrono::steady_clock::now() +
                                               std::chrono::nanoseconds(options.reconnect_interval_ns)));
  }
}

// --- NodeClient ------------------------------------------------------------------

NodeClient::NodeClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Status NodeClient::connect(Driver& driver, const NodeClientOptions& options, std::unique_ptr<NodeClient>* out,
                           std::string* why) {
  try {
    auto impl = std::make_unique<Impl>(driver, options);
    if (impl->options.job_name.empty()) impl->options.job_name = program_name();
    // A daemon that is slow to answer (busy zeroing memory, stopped, or
    // flooded) is waited for as long as an allocation would wait for memory.
    NodeClientOptions registration = options;
    if (options.register_timeout_ns != 0) registration.wait_timeout_ns = options.register_timeout_ns;
    const int timeout_ms = wait_timeout_ms(registration);
    const int socket = wire::connect_unix(options.socket_path, why, timeout_ms);
    if (socket < 0) {
      return Status(errno == ENOENT || errno == ECONNREFUSED ? Errc::kNotFound : Errc::kOsError, errno);
    }
    {
      std::lock_guard lock(impl->mu);
      if (Status status = impl->handshake(socket, timeout_ms, why); !status.is_ok()) {
        ::close(socket);
        return status;
      }
      impl->generation = 1;
      impl->fd.store(socket);
    }
    impl->wake_fd = ::eventfd(0, EFD_CLOEXEC);
    if (impl->wake_fd < 0) {
      *why = std::string("eventfd: ") + std::strerror(errno);
      ::close(impl->fd.exchange(-1));
      return Status(Errc::kOsError, errno);
    }
    Impl* raw = impl.get();
    impl->link = std::thread([raw] { raw->run_link(); });
    static std::once_flag fork_handler;
    std::call_once(fork_handler, [] { (void)pthread_atfork(lock_before_fork, unlock_in_parent, close_socket_in_child); });
    g_fork_guard.store(raw);
    out->reset(new NodeClient(std::move(impl)));
    return Status::ok();
  } catch (const std::exception& e) {
    *why = std::string("connecting to zico-umd: ") + e.what();
    return Status(Errc::kOutOfMemory);
  }
}

NodeClient::~NodeClient() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopping = true;
    impl_->cv.notify_all();
  }
  const uint64_t one = 1;
  if (impl_->wake_fd >= 0) (void)!::write(impl_->wake_fd, &one, sizeof one);
  if (impl_->link.joinable()) impl_->link.join();
  if (g_fork_guard.load() == impl_.get()) g_fork_guard.store(nullptr);
  const int socket = impl_->fd.exchange(-1);
  if (socket >= 0) ::close(socket);
  if (impl_->wake_fd >= 0) ::close(impl_->wake_fd);
}

Status NodeClient::open_gpu(DeviceId device, size_t* chunk_bytes, ChunkSource** source, std::string* why) {
  try {
    Capabilities caps;
    if (Status status = impl_->driver.capabilities(device, &caps); !status.is_ok()) {
      *why = "cannot query device " + std::to_string(device.value) + ": " + status.message();
      return status;
    }
    // The trackers' side reads the list of GPUs under pattern_mu alone.
    std::unique_lock patterns(impl_->pattern_mu);
    std::unique_lock lock(impl_->mu);
    Impl::Gpu* raw = nullptr;
    size_t slot = impl_->gpus.size();
    // Asked before, and not answered in time: the answer may have come
    // since, or come yet.
    for (size_t i = 0; i < impl_->gpus.size(); ++i) {
      if (impl_->gpus[i]->device != device) continue;
      raw = impl_->gpus[i].get();
      slot = i;
    }
    if (impl_->fd.load() < 0) {
      *why = "zico-umd is unreachable";
      return Status(Errc::kNotFound);
    }
    if (raw == nullptr) {
      auto gpu = std::make_unique<Impl::Gpu>();
      gpu->device = device;
      gpu->uuid = caps.uuid;
      gpu->source = std::make_unique<LentChunkSource>(*impl_, slot);
      raw = gpu.get();
      impl_->gpus.push_back(std::move(gpu));
    }
    // Ask (again, on a new connection, if the last one ended unanswered).
    if (!raw->answered &&
        std::find(impl_->awaiting_open.begin(), impl_->awaiting_open.end(), slot) == impl_->awaiting_open.end()) {
      impl_->awaiting_open.push_back(slot);
      if (!impl_->send_locked(proto::OpenGpu{caps.uuid, 0}, why)) return Status(Errc::kOsError);
    }
    patterns.unlock();
    const bool answered = impl_->cv.wait_for(lock, std::chrono::milliseconds(wait_timeout_ms(impl_->options)),
                                             [&] { return raw->answered || impl_->fd.load() < 0; });
    if (answered && raw->answered && !raw->open_now) {
      *why = "zico-umd does not manage device " + std::to_string(device.value);
      return Status(Errc::kNotFound);
    }
    if (!answered || !raw->open_now) {
      *why = "zico-umd did not open device " + std::to_string(device.value);
      return Status(Errc::kOsError);
    }
    if (raw->chunk_bytes == 0 || raw->chunk_bytes % caps.granularity != 0) {
      *why = "zico-umd uses " + format_size(raw->chunk_bytes) + " chunks, not a multiple of device " +
             std::to_string(device.value) + "'s granularity " + format_size(caps.granularity);
      return Status(Errc::kInvalidArgument);
    }
    *chunk_bytes = raw->chunk_bytes;
    *source = raw->source.get();
    return Status::ok();
  } catch (const std::bad_alloc&) {
    return Status(Errc::kOutOfMemory);
  }
}

void NodeClient::attach(DeviceId device, DeviceAllocator* allocator) {
  std::lock_guard lock(impl_->mu);
  for (auto& gpu : impl_->gpus) {
    if (gpu->device == device) gpu->allocator = allocator;
  }
}

bool NodeClient::connected() const { return impl_->fd.load() >= 0; }

std::string NodeClient::take_last_failure() {
  std::lock_guard lock(impl_->mu);
  return std::exchange(impl_->last_failure, std::string());
}

bool NodeClient::suspend_requested(Residency* to) const {
  if (!impl_->suspend_requested.load(std::memory_order_relaxed)) return false;
  std::lock_guard lock(impl_->mu);
  *to = impl_->suspend_to == proto::StoreKind::kNvme ? Residency::kNvme : Residency::kHost;
  return impl_->suspend_requested.load();
}

bool NodeClient::on_allocated(DeviceId device, const void* ptr, size_t bytes) noexcept {
  std::lock_guard lock(impl_->pattern_mu);
  for (auto& gpu : impl_->gpus) {
    if (gpu->device != device) continue;
    UsageTracker& tracker = gpu->tracker;
    const uint64_t before = tracker.iterations();
    try {
      tracker.on_allocate(reinterpret_cast<uintptr_t>(ptr), bytes, impl_->progress_now_locked());
    } catch (const std::bad_alloc&) {
      return false;  // the pattern is a hint; the allocation itself succeeded
    }
    Impl::refresh_outlook(*gpu);
    const bool at_boundary = gpu->gate_pending || (!tracker.explicit_marks() && tracker.iterations() != before);
    gpu->gate_pending = false;
    return at_boundary;
  }
  return false;
}

void NodeClient::on_freed(DeviceId device, const void* ptr) noexcept {
  std::lock_guard lock(impl_->pattern_mu);
  for (auto& gpu : impl_->gpus) {
    if (gpu->device != device) continue;
    UsageTracker& tracker = gpu->tracker;
    const uint64_t before = tracker.iterations();
    try {
      tracker.on_free(reinterpret_cast<uintptr_t>(ptr), impl_->progress_now_locked());
    } catch (const std::bad_alloc&) {
    }
    Impl::refresh_outlook(*gpu);
    // A detected iteration usually begins at its trough, on a free; the job
    // passes the gate at its next allocation, where it would start to climb.
    if (!tracker.explicit_marks() && tracker.iterations() != before) gpu->gate_pending = true;
    return;
  }
}

void NodeClient::iteration_gate(bool explicit_mark, const std::function<void()>& pause) noexcept {
  Impl& impl = *impl_;
  // The iteration's transient memory is free now: give the idle chunks back
  // so that other jobs' iterations can use them while this one waits or
  // climbs again (Zico's reclaim after the GPU is done with the memory).
  std::vector<DeviceAllocator*> allocators;
  {
    std::lock_guard lock(impl.mu);
    for (auto& gpu : impl.gpus) {
      if (gpu->open_now && gpu->allocator != nullptr) allocators.push_back(gpu->allocator);
    }
  }
  for (DeviceAllocator* allocator : allocators) {
    size_t freed = 0;
    (void)allocator->try_trim(SIZE_MAX, &freed);
  }
  // The tracker closes the iteration that just ended before the gate is
  // asked, so the daemon plans the gate with that iteration's curve (sent
  // first) and weighs the claim the mark carries, which comes from it too.
  // The wait at the gate is a stall the progress clock leaves out: the mark
  // has the same progress time before the wait as after it.
  try {
    std::lock_guard patterns(impl.pattern_mu);
    const uint64_t now = impl.progress_now_locked();
    std::lock_guard lock(impl.mu);
    for (auto& gpu : impl.gpus) {
      if (explicit_mark) gpu->tracker.on_iteration(now);
      Impl::refresh_outlook(*gpu);  // a new iteration: a new outlook
      const uint64_t version = gpu->tracker.curve_version();
      if (!gpu->open_now || version == 0) continue;
      if (version == gpu->sent_version && gpu->sent_generation == impl.generation) continue;
      proto::Curve curve{gpu->index, gpu->tracker.curve()};
      // Longer than the protocol carries: no pattern the daemon could use.
      if (curve.curve.period_ns > proto::kMaxCurvePeriodNs) curve.curve = DemandCurve{};
      if (!impl.send_locked(curve)) continue;  // sent again after the next boundary
      gpu->sent_version = version;
      gpu->sent_generation = impl.generation;
    }
  } catch (const std::bad_alloc&) {
  }
  const uint64_t asked = now_ns();
  {
    std::unique_lock lock(impl.mu);
    const uint64_t connection = impl.generation;
    const uint64_t sequence = ++impl.gate_sequence;
    if (impl.fd.load() >= 0 && !impl.stopping &&
        impl.send_locked(proto::IterationMark{sequence, impl.gate_claims_locked()})) {
      // A lost connection ends the wait: a new daemon knows nothing of it.
      const auto timeout = std::chrono::nanoseconds(std::min<uint64_t>(impl.options.wait_timeout_ns, INT64_MAX));
      const auto ended = [&] {
        return impl.gate_open >= sequence || impl.generation != connection || impl.fd.load() < 0 || impl.stopping;
      };
      const auto suspend_asked = [&] { return pause && impl.suspend_requested.load(); };
      for (;;) {
        const bool woken = impl.cv.wait_for(lock, timeout, [&] { return ended() || suspend_asked(); });
        if (!ended() && suspend_asked()) {
          // Another job's turn (or zico-umctl suspend): the job gives its
          // memory back here, at its gate, and waits on from where it was.
          lock.unlock();
          pause();
          lock.lock();
          continue;
        }
        if (!woken) {
          ZICO_LOG(kWarn, "zico-umd did not open iteration gate %llu in time; going on",
                   static_cast<unsigned long long>(sequence));
        }
        break;
      }
    }
  }
  std::lock_guard patterns(impl.pattern_mu);
  impl.stalled_ns += now_ns() - asked;
}

void NodeClient::report_suspended(bool suspended) {
  std::lock_guard lock(impl_->mu);
  impl_->paused = suspended;
  (void)impl_->send_locked(
      proto::JobState{suspended ? proto::JobRunState::kSuspended : proto::JobRunState::kRunning});
}

void NodeClient::report_failed() {
  std::lock_guard lock(impl_->mu);
  impl_->paused = false;
  impl_->resume_requested = false;
  impl_->suspend_requested.store(false);
  (void)impl_->send_locked(proto::JobState{proto::JobRunState::kFailed});
}

void NodeClient::wait_for_resume() {
  std::unique_lock lock(impl_->mu);
  impl_->cv.wait(lock, [&] { return impl_->resume_requested || impl_->stopping; });
  impl_->resume_requested = false;
  impl_->suspend_requested.store(false);
}

uint64_t NodeClient::job_id() const {
  std::lock_guard lock(impl_->mu);
  return impl_->job_id;
}

}  // namespace zico::sharing
