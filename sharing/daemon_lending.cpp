// zico-umd: the chunk pool: chunks taken, zeroed, granted and released as the ledger decides.
#include "daemon_impl.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "log.h"
#include "sizes.h"

namespace zico::sharing {

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

uint64_t Daemon::Impl::resident_chunks(uint32_t gpu) const {
  uint64_t chunks = 0;
  for (const auto& [id, job] : jobs) {
    if (gpu < job.gpus.size() && job.gpus[gpu].pageable) chunks += job.gpus[gpu].unowned;
  }
  return chunks;
}

void Daemon::Impl::release_free(uint32_t g, bool beyond_budget_only) {
  Gpu& gpu = gpus[g];
  // UM jobs' pages take their share of the device: the pool keeps the rest.
  const uint64_t budget = ledger.gpu(g).budget;
  const uint64_t resident = resident_chunks(g);
  const uint64_t keep = beyond_budget_only ? budget - std::min(budget, resident) : 0;
  for (uint32_t id : gpu.free_ids) {
    if (gpu.live <= keep) break;
    PoolChunk& chunk = gpu.chunks[id - 1];
    if (!chunk.handle.valid()) continue;
    (void)driver.release(chunk.handle);
    chunk.handle = PhysHandle{};
    --gpu.live;
  }
}

bool Daemon::Impl::grant_resident(Job& job, const LedgerAction& action) {
  job.gpus[action.gpu].unowned += action.chunks;
  record_holding(job, action.gpu);  // before the job can use it
  gpus[action.gpu].bytes_moved += action.chunks * gpus[action.gpu].chunk_bytes;
  release_free(action.gpu, true);  // idle pool chunks must not crowd out its pages
  if (job.fd >= 0 && !send(job.fd, proto::ResidentGrant{action.request_id, action.gpu, action.chunks})) {
    close_connection(job.fd, "cannot send a resident grant", true);
  }
  return true;  // granted in the books all the same
}

bool Daemon::Impl::grant(const LedgerAction& action) {
  auto it = jobs.find(action.job);
  if (it == jobs.end()) return false;
  Job& job = it->second;
  if (job.gpus[action.gpu].pageable) return grant_resident(job, action);
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
    return false;
  }
  for (uint32_t id : ids) {
    gpu.chunks[id - 1].owner = job.id;
    job.gpus[action.gpu].lent.insert(id);
  }
  record_holding(job, action.gpu);  // before the job can have them
  gpu.bytes_moved += ids.size() * gpu.chunk_bytes;
  if (job.fd < 0) return true;  // gone meanwhile: the chunks return when its process exits
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
      return true;  // granted in the books all the same
    }
  }
  return true;
}

void Daemon::Impl::pump() {
  sync_gate_paging();
  look_for_waiters(now_ns());
  // Carrying out actions can change the books (a failed grant, a closed
  // connection), so ask again until nothing is left to do.
  for (int round = 0; round < 16; ++round) {
    const std::vector<LedgerAction> actions = ledger.pump(now_ns());
    if (actions.empty()) break;
    for (const LedgerAction& action : actions) {
      auto it = jobs.find(action.job);
      if (it == jobs.end()) continue;
      const int fd = it->second.fd;
      uint64_t asked_ns = 0;
      if (action.kind != LedgerAction::Kind::kReclaim) {
        if (auto waiting = it->second.requests.find(action.request_id); waiting != it->second.requests.end()) {
          asked_ns = waiting->second.asked_ns;
          it->second.requests.erase(waiting);
        }
      }
      EventCounts::Gpu& counts = events.gpus[action.gpu];
      switch (action.kind) {
        case LedgerAction::Kind::kGrant:
          if (grant(action)) {
            ++counts.grants;
            const uint64_t now = now_ns();
            counts.grant_wait.observe(asked_ns != 0 && now > asked_ns ? now - asked_ns : 0);
          } else {
            ++counts.denials;
          }
          break;
        case LedgerAction::Kind::kDeny:
          ++counts.denials;
          if (fd >= 0) (void)send(fd, proto::Deny{action.request_id, static_cast<uint32_t>(action.errc), action.reason});
          break;
        case LedgerAction::Kind::kReclaim:
          if (fd >= 0 && send(fd, proto::Reclaim{action.gpu, action.chunks})) {
            ++counts.reclaims;
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
          ++counts.parks;
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
  tell_memory_wanted();
}

void Daemon::Impl::tell_memory_wanted() {
  for (uint32_t g = 0; g < gpus.size(); ++g) {
    if (ledger.gpu(g).waiting == 0) continue;
    for (auto& [id, job] : jobs) {
      if (g >= job.gpus.size() || job.fd < 0) continue;
      JobGpu& use = job.gpus[g];
      if (!use.open || use.pageable || use.told_wanted) continue;
      // The waiter too: what it frees later in this iteration may be
      // what the next request waits for.
      if (send(job.fd, proto::MemoryWanted{g})) use.told_wanted = true;
    }
  }
}

}  // namespace zico::sharing
