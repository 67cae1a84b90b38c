// The job's client as the allocator's chunk source: borrowing chunks (with
// the claim of the iteration under way), waiting for them within one
// allocation's timeout, and giving them back.
#include "node_client_impl.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "sizes.h"

namespace zico::sharing {
namespace {

// After a timeout, how long to wait for the daemon to confirm the cancel.
constexpr auto kCancelGrace = std::chrono::seconds(5);

// When the current allocation call first waited (AllocationWaitScope), and
// whether it has said why it failed: an allocation retried after emptying
// its caches fails again at once, and once is enough to say so.
thread_local std::optional<std::chrono::steady_clock::time_point> t_first_wait;
thread_local bool t_in_scope = false;
thread_local bool t_failure_said = false;

}  // namespace

AllocationWaitScope::AllocationWaitScope() noexcept : outermost_(!t_in_scope) { t_in_scope = true; }

AllocationWaitScope::~AllocationWaitScope() {
  if (!outermost_) return;
  t_in_scope = false;
  t_first_wait.reset();
  t_failure_said = false;
}

std::chrono::steady_clock::time_point AllocationWaitScope::wait_began() noexcept {
  if (!t_in_scope) return std::chrono::steady_clock::now();
  if (!t_first_wait) t_first_wait = std::chrono::steady_clock::now();
  return *t_first_wait;
}

std::chrono::steady_clock::time_point AllocationWaitScope::deadline(uint64_t timeout_ns) noexcept {
  const auto began = wait_began();
  const auto most = std::chrono::steady_clock::time_point::max() - began;
  const auto timeout = std::chrono::nanoseconds(std::min<uint64_t>(timeout_ns, INT64_MAX));
  return timeout >= most ? std::chrono::steady_clock::time_point::max() : began + timeout;
}

OutsideAllocationWait::OutsideAllocationWait() noexcept
    : in_scope_(t_in_scope), first_wait_(t_first_wait), failure_said_(t_failure_said) {
  t_in_scope = false;
  t_first_wait.reset();
  t_failure_said = false;
}

OutsideAllocationWait::~OutsideAllocationWait() {
  t_in_scope = in_scope_;
  t_first_wait = first_wait_;
  t_failure_said = failure_said_;
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

uint64_t NodeClient::Impl::ask_locked(size_t slot, uint64_t count, bool wish) {
  const Gpu& gpu = *gpus[slot];
  const uint64_t id = ++next_request;
  Pending& asked = pending[id];
  asked.gpu_slot = slot;
  asked.chunks = count;
  asked.wish = wish;
  proto::Request message{id, gpu.index, static_cast<uint32_t>(count)};
  claim_for(gpu, count, &message);
  if (!send_locked(message)) {
    pending.erase(id);
    return 0;
  }
  return id;
}

Status NodeClient::Impl::obtain(size_t slot, size_t count, Patience patience, std::vector<SourcedChunk>* out) {
  if (count == 0) return Status::ok();
  std::unique_lock lock(mu);
  Gpu& gpu = *gpus[slot];
  const auto start = AllocationWaitScope::wait_began();
  const auto deadline = patience == Patience::kForever ? std::chrono::steady_clock::time_point::max()
                                                       : AllocationWaitScope::deadline(options.wait_timeout_ns);
  const auto fail = [&](std::string reason) {
    last_failure = std::move(reason);
    if (!t_failure_said) ZICO_LOG(kWarn, "%s", last_failure.c_str());
    t_failure_said = t_in_scope;
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
      const uint64_t id = ask_locked(slot, count, false);
      if (id == 0) {
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
    if (gpu.held + count <= gpu.local_limit && gpu.pageable) {
      gpu.held += count;  // its pages are its own: nothing to create
      if (gpu.pages != nullptr) (void)gpu.pages->limit_to(gpu.held * gpu.chunk_bytes);
      return Status::ok();
    }
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

}  // namespace zico::sharing
