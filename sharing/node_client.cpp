#include "node_client_impl.h"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>

#include "sizes.h"

namespace zico::sharing {
namespace {

// What a job is called when ZICO_JOB_NAME does not say: its program and first
// argument ("python train.py"), from /proc/self/cmdline, whole (comm would
// cut the program's name at 15 characters).
std::string program_name() {
  std::ifstream cmdline("/proc/self/cmdline", std::ios::binary);
  std::string program;
  std::string first;
  std::getline(cmdline, program, '\0');
  std::getline(cmdline, first, '\0');
  if (const size_t slash = program.rfind('/'); slash != std::string::npos) program.erase(0, slash + 1);
  std::string name = first.empty() ? program : program + " " + first;
  if (name.empty()) name = "job";
  for (char& c : name) c = (c >= 0x20 && c <= 0x7e) ? c : '?';
  return name.substr(0, proto::kMaxString);
}

// A reconnection's handshake replies must come promptly; a daemon that hangs
// is treated as gone, and the link tries again later.
constexpr int kHandshakeTimeoutMs = 2000;

// The first registration waits as long as an allocation waits for memory:
// till then the job may not allocate at all.
int wait_timeout_ms(const NodeClientOptions& options) {
  return static_cast<int>(std::min<uint64_t>(options.wait_timeout_ns / 1'000'000, INT32_MAX));
}

// What is left of `timeout_ms` since `start`, at least 1 ms (0 would not wait at all).
int left_ms(std::chrono::steady_clock::time_point start, int timeout_ms) {
  const auto spent = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  return static_cast<int>(std::max<int64_t>(timeout_ms - spent.count(), 1));
}

}  // namespace

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
    if (!wire::send_message(socket, proto::OpenGpu{gpu->uuid, gpu->held, gpu->pageable}, {}, &error)) {
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
  // A UM job's wishes end with the connection (nobody waits for them).
  std::erase_if(pending, [](const auto& entry) { return entry.second.wish; });
  for (auto& gpu : gpus) gpu->wish = 0;
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
  alone = false;  // until the new daemon says so
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
    const auto start = std::chrono::steady_clock::now();
    const int socket = wire::connect_unix(options.socket_path, why, timeout_ms);
    if (socket < 0) {
      return Status(errno == ENOENT || errno == ECONNREFUSED ? Errc::kNotFound : Errc::kOsError, errno);
    }
    {
      std::lock_guard lock(impl->mu);
      // One timeout for the connection (a full queue) and the answer together.
      if (Status status = impl->handshake(socket, left_ms(start, timeout_ms), why); !status.is_ok()) {
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

Status NodeClient::Impl::open(DeviceId device, bool pageable, size_t* slot_out, std::string* why) {
  Capabilities caps;
  if (Status status = driver.capabilities(device, &caps); !status.is_ok()) {
    *why = "cannot query device " + std::to_string(device.value) + ": " + status.message();
    return status;
  }
  // The trackers' side reads the list of GPUs under pattern_mu alone.
  std::unique_lock patterns(pattern_mu);
  std::unique_lock lock(mu);
  Gpu* raw = nullptr;
  size_t slot = gpus.size();
  // Asked before, and not answered in time: the answer may have come
  // since, or come yet.
  for (size_t i = 0; i < gpus.size(); ++i) {
    if (gpus[i]->device != device) continue;
    raw = gpus[i].get();
    slot = i;
  }
  if (fd.load() < 0) {
    *why = "zico-umd is unreachable";
    return Status(Errc::kNotFound);
  }
  if (raw == nullptr) {
    auto gpu = std::make_unique<Gpu>();
    gpu->device = device;
    gpu->uuid = caps.uuid;
    gpu->pageable = pageable;
    gpu->source = std::make_unique<LentChunkSource>(*this, slot);
    raw = gpu.get();
    gpus.push_back(std::move(gpu));
  }
  // Ask (again, on a new connection, if the last one ended unanswered).
  if (!raw->answered && std::find(awaiting_open.begin(), awaiting_open.end(), slot) == awaiting_open.end()) {
    awaiting_open.push_back(slot);
    if (!send_locked(proto::OpenGpu{caps.uuid, 0, raw->pageable}, why)) return Status(Errc::kOsError);
  }
  patterns.unlock();
  // Part of the allocation call that opens it, whose timeout it shares.
  const bool answered = cv.wait_until(lock, AllocationWaitScope::deadline(options.wait_timeout_ns),
                                      [&] { return raw->answered || fd.load() < 0; });
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
  *slot_out = slot;
  return Status::ok();
}

Status NodeClient::open_gpu(DeviceId device, size_t* chunk_bytes, ChunkSource** source, std::string* why) {
  try {
    size_t slot = 0;
    ZICO_RETURN_IF_ERROR(impl_->open(device, false, &slot, why));
    std::lock_guard lock(impl_->mu);
    *chunk_bytes = impl_->gpus[slot]->chunk_bytes;
    *source = impl_->gpus[slot]->source.get();
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

uint64_t NodeClient::share_bytes(DeviceId device) const {
  std::lock_guard lock(impl_->mu);
  for (const auto& gpu : impl_->gpus) {
    if (gpu->device == device && gpu->answered && gpu->chunk_bytes != 0) {
      return gpu->node_budget_bytes == 0 ? gpu->max_bytes : std::min(gpu->node_budget_bytes, gpu->max_bytes);
    }
  }
  return 0;
}

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
    if (gpu->pageable) {
      std::lock_guard books(impl_->mu);
      // What the iteration will need at its peak, once the tracker knows:
      // asked for once, early. No memory to ask with: it runs on as it is.
      try {
        impl_->wish_locked(*gpu,
                           std::max(tracker.live_bytes(), gpu->outlook_peak_bytes.load(std::memory_order_relaxed)));
      } catch (const std::bad_alloc&) {
      }
    }
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

void NodeClient::after_free(DeviceId device) noexcept {
  Impl& impl = *impl_;
  DeviceAllocator* allocator = nullptr;
  uint64_t keep_idle = 0;
  {
    std::lock_guard patterns(impl.pattern_mu);  // the list of GPUs, as on_freed reads it
    std::unique_lock lock(impl.mu, std::defer_lock);
    for (auto& gpu : impl.gpus) {
      if (gpu->device != device) continue;
      if (!gpu->memory_wanted.load(std::memory_order_relaxed)) return;
      lock.lock();
      // Unknown (0): the job's tracker is still learning, and nothing but
      // its gate says what it will not use again.
      const uint64_t rest = gpu->outlook_peak_bytes.load(std::memory_order_relaxed);
      if (!gpu->memory_wanted || !gpu->open_now || gpu->pageable || gpu->allocator == nullptr || rest == 0) return;
      // At most one try per step down of what the rest of the iteration
      // needs, a sixteenth of what is held (at least four chunks): a try
      // fences the allocator's caches and waits for them, and one that
      // finds only partly used chunks would find them again at the next
      // free.
      const uint64_t step = std::max<uint64_t>(4, gpu->held / 16) * gpu->chunk_bytes;
      if (rest >= gpu->trimmed_at_rest_bytes) {  // climbing, or a new iteration
        gpu->trimmed_at_rest_bytes = rest;
        return;
      }
      if (gpu->trimmed_at_rest_bytes - rest < step) return;
      gpu->trimmed_at_rest_bytes = rest;
      // Idle chunks stay for what is still to be allocated above the live
      // blocks, and a step more.
      const uint64_t live = gpu->outlook_live_bytes.load(std::memory_order_relaxed);
      keep_idle = (rest > live ? rest - live : 0) + step;
      allocator = gpu->allocator;
      break;
    }
  }
  if (allocator == nullptr) return;
  size_t freed = 0;
  (void)allocator->try_trim(SIZE_MAX, &freed, static_cast<size_t>(std::min<uint64_t>(keep_idle, SIZE_MAX)));
}

void NodeClient::iteration_gate(bool explicit_mark, const std::function<void()>& pause) noexcept {
  Impl& impl = *impl_;
  // The iteration's transient memory is free now: give the idle chunks back
  // so that other jobs' iterations can use them while this one waits or
  // climbs again (Zico's reclaim after the GPU is done with the memory).
  // Alone on its GPUs at its last gate, it keeps them: each would come back
  // at its next climb, a round trip and an import per chunk for nothing (a
  // job that comes meanwhile gets them through a reclaim).
  std::vector<DeviceAllocator*> allocators;
  {
    std::lock_guard lock(impl.mu);
    try {
      for (auto& gpu : impl.gpus) {
        gpu->memory_wanted = false;  // until the daemon says so again in the next iteration
        if (gpu->open_now && gpu->allocator != nullptr && !gpu->pageable && !impl.alone) {
          allocators.push_back(gpu->allocator);
        }
        impl.settle_pageable_locked(*gpu);  // a UM job's pages above its live blocks
      }
    } catch (const std::bad_alloc&) {
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
  const uint64_t asked = Impl::now_ns();
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
  impl.stalled_ns += Impl::now_ns() - asked;
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
