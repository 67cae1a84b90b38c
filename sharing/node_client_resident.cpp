// The job's client for a UM job's GPUs (ZICO_MODE=um): resident grants for
// its pager, asked for as its live blocks grow, given back at iteration
// boundaries and when the daemon reclaims (by paging out as much as it asks).
#include "node_client_impl.h"

#include <algorithm>
#include <chrono>
#include <string>

namespace zico::sharing {

namespace {

// How long a kernel larger than the job's share waits for the rest
// (need_resident), at most; after it did not come, the job's kernels run on
// what is lent, the driver paging beyond it, for this long before it asks
// again: a job whose share was cut below its kernels must not stall on
// every launch.
constexpr auto kKernelRoomWait = std::chrono::nanoseconds(std::chrono::seconds(1));
constexpr auto kKernelRoomBackoff = std::chrono::nanoseconds(std::chrono::seconds(10));

}  // namespace

uint64_t NodeClient::Impl::floor_chunks(const Gpu& gpu) {
  const uint64_t floor = gpu.pages != nullptr ? gpu.pages->floor_bytes() : 0;
  return std::max<uint64_t>(1, chunks_for(floor, gpu.chunk_bytes));
}

void NodeClient::Impl::on_resident_grant(const proto::ResidentGrant& grant) {
  std::lock_guard lock(mu);
  Gpu* gpu = gpu_by_index(grant.gpu);
  auto it = pending.find(grant.request_id);
  // A wish may be served in part (what room there was); a waiter's ask in full.
  const bool as_asked = it != pending.end() && (it->second.wish ? grant.chunks <= it->second.chunks
                                                                : grant.chunks == it->second.chunks);
  const bool late = gpu != nullptr && gpu->paged_out && it != pending.end() && it->second.wish;
  if (gpu == nullptr || !gpu->pageable || !as_asked || late || it->second.state != Pending::State::kWaiting) {
    // Not asked for like this (a confused daemon, or a waiter that gave up):
    // the daemon counts it as ours, so it goes straight back.
    if (gpu != nullptr && gpu->pageable) {
      for (uint64_t left = grant.chunks; left > 0;) {
        const auto count = static_cast<uint32_t>(std::min<uint64_t>(left, UINT32_MAX));
        (void)send_locked(proto::Return{gpu->index, false, count, {}});
        left -= count;
      }
    }
    if (it != pending.end() && it->second.state == Pending::State::kWaiting) {
      it->second.state = Pending::State::kDenied;
      it->second.reason = late ? "suspended meanwhile" : "zico-umd granted a different amount than asked";
      if (it->second.wish) {
        if (gpu != nullptr) gpu->wish = 0;
        pending.erase(it);
      }
      cv.notify_all();
    }
    return;
  }
  gpu->held += grant.chunks;
  if (gpu->pages != nullptr) (void)gpu->pages->limit_to(gpu->held * gpu->chunk_bytes);
  if (it->second.wish) {
    gpu->wish = 0;
    pending.erase(it);
  } else {
    it->second.state = Pending::State::kGranted;
    cv.notify_all();
  }
}

uint64_t NodeClient::Impl::shrink_locked(Gpu& gpu, uint64_t keep, bool reclaim_reply) {
  uint64_t kept = gpu.held;
  if (keep < gpu.held && gpu.open_now) {
    const uint64_t may = gpu.pages != nullptr ? gpu.pages->limit_to(keep * gpu.chunk_bytes) : 0;
    kept = std::min(gpu.held, std::max(keep, chunks_for(may, gpu.chunk_bytes)));
  }
  const uint64_t given = gpu.held - kept;
  gpu.held = kept;
  if (!gpu.open_now) return 0;
  uint64_t left = given;
  do {
    const auto count = static_cast<uint32_t>(std::min<uint64_t>(left, UINT32_MAX));
    if (count == 0 && !reclaim_reply) break;
    (void)send_locked(proto::Return{gpu.index, reclaim_reply, count, {}});
    reclaim_reply = false;
    left -= count;
  } while (left > 0);
  return given;
}

void NodeClient::Impl::wish_locked(Gpu& gpu, uint64_t live_bytes) {
  if (!gpu.pageable || !gpu.open_now || gpu.paged_out || gpu.wish != 0 || gpu.pages == nullptr || fd.load() < 0 ||
      stopping || now_ns() < gpu.no_wish_before_ns) {
    return;
  }
  const uint64_t share = gpu.node_budget_bytes == 0 ? gpu.max_bytes : std::min(gpu.node_budget_bytes, gpu.max_bytes);
  const uint64_t cap = std::min(gpu.most_bytes, share) / gpu.chunk_bytes;
  const uint64_t want = std::min(chunks_for(live_bytes, gpu.chunk_bytes), cap);
  if (want <= gpu.held) return;
  const uint64_t count = std::min<uint64_t>(want - gpu.held, UINT32_MAX);
  for (size_t slot = 0; slot < gpus.size(); ++slot) {
    if (gpus[slot].get() == &gpu) gpu.wish = ask_locked(slot, count, true);
  }
}

void NodeClient::Impl::settle_pageable_locked(Gpu& gpu) {
  if (!gpu.pageable || !gpu.open_now) return;
  const uint64_t live = chunks_for(gpu.outlook_live_bytes.load(std::memory_order_relaxed), gpu.chunk_bytes);
  const uint64_t keep = std::max(floor_chunks(gpu), live);
  if (keep < gpu.held) (void)shrink_locked(gpu, keep, false);
}

Status NodeClient::open_pageable_gpu(DeviceId device, size_t* chunk_bytes, uint64_t* lent, std::string* why) {
  try {
    size_t slot = 0;
    ZICO_RETURN_IF_ERROR(impl_->open(device, true, &slot, why));
    ZICO_RETURN_IF_ERROR(page_in(device, why));
    std::lock_guard lock(impl_->mu);
    *chunk_bytes = impl_->gpus[slot]->chunk_bytes;
    *lent = impl_->gpus[slot]->held * impl_->gpus[slot]->chunk_bytes;
    return Status::ok();
  } catch (const std::bad_alloc&) {
    return Status(Errc::kOutOfMemory);
  }
}

Status NodeClient::need_resident(DeviceId device, uint64_t bytes, std::string* why) {
  Impl& impl = *impl_;
  std::unique_lock lock(impl.mu);
  size_t slot = SIZE_MAX;
  for (size_t i = 0; i < impl.gpus.size(); ++i) {
    if (impl.gpus[i]->device == device && impl.gpus[i]->pageable) slot = i;
  }
  if (slot == SIZE_MAX) return Status::ok();
  Impl::Gpu& gpu = *impl.gpus[slot];
  if (!gpu.open_now || gpu.paged_out || gpu.chunk_bytes == 0 || impl.fd.load() < 0 || impl.stopping ||
      impl.suspend_requested.load() || Impl::now_ns() < gpu.no_room_ask_before_ns) {
    return Status::ok();
  }
  // More than the job may ever hold is not worth a wait: the driver pages
  // such a kernel whatever is lent (the pager says so once).
  const uint64_t share = gpu.node_budget_bytes == 0 ? gpu.max_bytes : std::min(gpu.node_budget_bytes, gpu.max_bytes);
  const uint64_t want = chunks_for(bytes, gpu.chunk_bytes);
  if (want <= gpu.held || want > std::min(gpu.most_bytes, share) / gpu.chunk_bytes) return Status::ok();
  const uint64_t id = impl.ask_locked(slot, want - gpu.held, false);
  if (id == 0) return Status::ok();
  // The launching thread waits here, so not for long, and never through a
  // suspension (which it would otherwise hold up until its next allocation).
  const auto asked_at = std::chrono::steady_clock::now();
  const auto deadline = asked_at + std::min(std::chrono::nanoseconds(impl.options.wait_timeout_ns), kKernelRoomWait);
  const auto answered = [&] { return impl.stopping || impl.pending[id].state != Impl::Pending::State::kWaiting; };
  if (!impl.cv.wait_until(lock, deadline, [&] { return answered() || impl.suspend_requested.load(); }) ||
      !answered()) {
    // Withdrawn; a grant already on its way goes straight back (on_resident_grant).
    (void)impl.send_locked(proto::Cancel{id});
  }
  const Impl::Pending request = std::move(impl.pending[id]);
  impl.pending.erase(id);
  if (request.state == Impl::Pending::State::kGranted) return Status::ok();  // held and the pager's budget are raised
  // A suspension asked: the job pauses at its next allocation, and asks afresh once resumed.
  if (request.state == Impl::Pending::State::kWaiting && impl.suspend_requested.load()) return Status::ok();
  gpu.no_room_ask_before_ns = Impl::now_ns() + static_cast<uint64_t>(kKernelRoomBackoff.count());
  const auto waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - asked_at).count();
  *why = request.state == Impl::Pending::State::kDenied ? "zico-umd denied it: " + request.reason
                                                         : "none came in " + std::to_string(waited) + " s";
  return Status(Errc::kOutOfMemory);
}

void NodeClient::attach_pages(DeviceId device, ResidentPages* pages, uint64_t most_bytes) {
  std::lock_guard lock(impl_->mu);
  for (auto& gpu : impl_->gpus) {
    if (gpu->device != device || !gpu->pageable) continue;
    gpu->pages = pages;
    gpu->most_bytes = std::max(most_bytes, gpu->chunk_bytes);
    (void)pages->limit_to(gpu->held * gpu->chunk_bytes);  // what is lent now, whatever came since it was made
  }
}

void NodeClient::page_out(DeviceId device) noexcept {
  std::lock_guard lock(impl_->mu);
  for (auto& gpu : impl_->gpus) {
    if (gpu->device != device || !gpu->pageable) continue;
    gpu->paged_out = true;
    try {
      // A grant for its wish still under way goes straight back (on_resident_grant).
      (void)impl_->shrink_locked(*gpu, 0, false);
    } catch (const std::bad_alloc&) {
      // No memory to tell the daemon: the pages leave all the same.
      if (gpu->pages != nullptr) (void)gpu->pages->limit_to(0);
    }
  }
}

Status NodeClient::page_in(DeviceId device, std::string* why) {
  size_t slot = SIZE_MAX;
  {
    std::lock_guard lock(impl_->mu);
    for (size_t i = 0; i < impl_->gpus.size(); ++i) {
      if (impl_->gpus[i]->device == device && impl_->gpus[i]->pageable) slot = i;
    }
    if (slot == SIZE_MAX) return Status::ok();
    impl_->gpus[slot]->paged_out = false;
    if (impl_->gpus[slot]->held != 0) return Status::ok();
  }
  std::vector<SourcedChunk> none;
  if (Status status = impl_->obtain(slot, 1, Patience::kDefault, &none); !status.is_ok()) {
    *why = take_last_failure();
    return status;
  }
  return Status::ok();
}

}  // namespace zico::sharing
