// The job's client's internals, shared by its files (not an interface):
//   node_client.cpp          connecting, reconnecting, forks, the public NodeClient
//   node_client_link.cpp     the link thread: the daemon's messages, usage reports
//   node_client_chunks.cpp   the chunk source: borrowing, claims, giving back
//   node_client_resident.cpp a UM job's GPUs: resident grants for its pager
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "log.h"
#include "node_client.h"
#include "protocol.h"
#include "usage_tracker.h"
#include "wire.h"

namespace zico::sharing {

class LentChunkSource;

[[nodiscard]] inline uint64_t chunks_for(uint64_t bytes, uint64_t chunk) {
  return bytes / chunk + (bytes % chunk != 0 ? 1 : 0);
}

struct NodeClient::Impl {
  [[nodiscard]] static uint64_t now_ns() {
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
            .count());
  }
  // Ids handed to the allocator carry the connection they came from: after a
  // reconnection the new daemon knows nothing of the old ids, and an old id
  // must never be mistaken for a new chunk with the same number.
  [[nodiscard]] static uint64_t tag(uint64_t generation, uint32_t id) { return generation << 32 | id; }
  [[nodiscard]] static uint32_t untag(uint64_t tagged) { return static_cast<uint32_t>(tagged); }

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
    uint64_t node_budget_bytes = 0;  // the GPU's budget: 0 unknown
    bool answered = false;      // the daemon answered OpenGpu
    DeviceAllocator* allocator = nullptr;
    std::unique_ptr<LentChunkSource> source;
    // A UM job's GPU (open_pageable_gpu): `held` counts resident grants,
    // which `pages` must stay within; one wish for more at a time.
    bool pageable = false;
    ResidentPages* pages = nullptr;
    uint64_t most_bytes = UINT64_MAX;
    uint64_t wish = 0;  // the request id of the wish under way, 0: none
    bool paged_out = false;  // suspended (page_out): no wishes, a late grant goes back
    uint64_t no_wish_before_ns = 0;  // after a refused wish, the next waits a while
    uint64_t no_room_ask_before_ns = 0;  // after a kernel's room did not come (need_resident), the same
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
    // Giving back in mid-iteration (after_free): the daemon said a request
    // waits (MemoryWanted) since the last gate, written under mu and read
    // first under pattern_mu alone (every free looks); and what the rest of
    // the iteration needed at the last try, guarded by mu.
    std::atomic<bool> memory_wanted{false};
    uint64_t trimmed_at_rest_bytes = 0;
  };

  struct Pending {
    size_t gpu_slot = 0;
    uint64_t chunks = 0;
    enum class State : uint8_t { kWaiting, kGranted, kDenied, kYield, kLost } state = State::kWaiting;
    bool wish = false;  // a UM job's ask for more that nobody waits for
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
  // The last Proceed said no other job shares this job's GPUs: its next gate
  // keeps the idle chunks (giving them back would only bring them back).
  bool alone = false;
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

  // --- a UM job's GPUs (node_client_resident.cpp) -------------------------------
  void on_resident_grant(const proto::ResidentGrant& grant);
  // Pages out down to `keep` chunks (at least what a running kernel holds)
  // and returns the rest; the number returned.
  uint64_t shrink_locked(Gpu& gpu, uint64_t keep, bool reclaim_reply);
  // Asks for what `live_bytes` of blocks would need on the GPU, within its
  // caps, unless a wish is under way.
  void wish_locked(Gpu& gpu, uint64_t live_bytes);
  // The chunks a pageable GPU must keep: its floor, at least one.
  [[nodiscard]] static uint64_t floor_chunks(const Gpu& gpu);
  // A pageable GPU's share of an iteration boundary: what is above its live
  // blocks (and its floor) goes back.
  void settle_pageable_locked(Gpu& gpu);
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
  // Sends a Request for `count` chunks of the GPU in `slot`, with its claim,
  // and records it as pending; its id, or 0 if it could not be sent.
  uint64_t ask_locked(size_t slot, uint64_t count, bool wish);
  Status open(DeviceId device, bool pageable, size_t* slot, std::string* why);
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

}  // namespace zico::sharing
