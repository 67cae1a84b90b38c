// The job's client: the link thread, which reads the daemon's messages
// (grants, denials, reclaims, yields, suspensions, gates) and sends reports.
#include "node_client_impl.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace zico::sharing {

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
  if (const auto* wanted = std::get_if<proto::MemoryWanted>(&message)) {
    std::lock_guard lock(mu);
    if (Gpu* gpu = gpu_by_index(wanted->gpu)) gpu->memory_wanted = true;
    return;
  }
  if (const auto* reclaim = std::get_if<proto::Reclaim>(&message)) {
    on_reclaim(*reclaim);
    return;
  }
  if (const auto* resident = std::get_if<proto::ResidentGrant>(&message)) {
    on_resident_grant(*resident);
    return;
  }
  std::lock_guard lock(mu);
  if (const auto* deny = std::get_if<proto::Deny>(&message)) {
    auto it = pending.find(deny->request_id);
    if (it != pending.end() && it->second.wish) {
      // A UM job's wish for more: it runs on with what it holds, and asks
      // again only after a while (a refusal now is likely a refusal then).
      if (it->second.gpu_slot < gpus.size()) {
        gpus[it->second.gpu_slot]->wish = 0;
        gpus[it->second.gpu_slot]->no_wish_before_ns = now_ns() + options.reconnect_interval_ns;
      }
      pending.erase(it);
    } else if (it != pending.end() && it->second.state == Pending::State::kWaiting) {
      it->second.state = Pending::State::kDenied;
      it->second.reason = deny->reason;
      cv.notify_all();
    }
  } else if (const auto* yield = std::get_if<proto::Yield>(&message)) {
    auto it = pending.find(yield->request_id);
    if (Gpu* gpu = gpu_by_index(yield->gpu); gpu != nullptr && gpu->pageable) {
      // The daemon never asks a UM job to yield (it pages instead); should
      // one come, every page leaves and the job asks again as it runs.
      ZICO_LOG(kWarn, "zico-umd asked a UM job to yield on GPU %u; it pages everything out", yield->gpu);
      if (it != pending.end() && it->second.wish) {
        gpu->wish = 0;
        pending.erase(it);
        it = pending.end();
      }
      (void)shrink_locked(*gpu, 0, false);
    }
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
      gpu.node_budget_bytes = opened->node_budget_bytes;
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
    alone = proceed->sharers == 0;
    cv.notify_all();
  } else if (const auto* limits = std::get_if<proto::Limits>(&message)) {
    if (Gpu* gpu = gpu_by_index(limits->gpu)) {
      gpu->min_bytes = limits->min_bytes;
      gpu->max_bytes = limits->max_bytes;
      gpu->node_budget_bytes = limits->node_budget_bytes;
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
      if (gpu->pageable) {
        // Paged out at once: a UM job's answer never waits. The daemon
        // asks below its floor (Report.floor_bytes) only to bring the GPU
        // back within a budget that was cut.
        (void)shrink_locked(*gpu, gpu->held - std::min(reclaim.chunks, gpu->held), true);
        return;
      }
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
    const bool pages = gpu->pageable && gpu->pages != nullptr;
    const uint64_t floor = pages ? gpu->pages->floor_bytes() : 0;
    const uint64_t link_rate = pages ? std::min(gpu->pages->link_bytes_per_second(), proto::kMaxLinkBytesPerSecond) : 0;
    (void)send_locked(proto::Report{gpu->index, stats.allocated_bytes, stats.last_iteration_low_bytes,
                                    stats.iterations, floor, link_rate});
  }
}

}  // namespace zico::sharing
