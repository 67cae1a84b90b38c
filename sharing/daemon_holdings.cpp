// zico-umd: what jobs hold, known across restarts (the state file) and checked (the audit).
#include "daemon_impl.h"

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "log.h"
#include "sizes.h"

namespace zico::sharing {

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
    // A UM job's kernel may fault in pages beyond what its pager keeps, up
    // to its working set (its floor), for a moment: that much is not held against it.
    const uint64_t tolerated = job.gpus[g].pageable ? job.gpus[g].floor_chunks : 0;
    // Chunks given back and not looked at yet are charged already (look_at_returns).
    const uint64_t lent = lent_chunks(job, gpu) + tolerated + job.gpus[g].unchecked.size();
    const uint64_t holds = bytes / chunk + (bytes % chunk != 0 ? 1 : 0);
    const uint64_t excess = holds > lent ? holds - lent : 0;
    // Never charged beyond what it could have asked for: a process that
    // makes look-alike memory of its own gains nothing it could not have had.
    Ledger::JobView view;
    (void)ledger.job(job.id, gpu, now_ns(), &view);
    const uint64_t most = std::min(view.max, ledger.gpu(gpu).budget);
    // Pool chunks it gave back and still holds are real memory nobody else
    // can be lent: charged in full, whatever the cap.
    pool_what_was_let_go(job, gpu, std::vector<uint32_t>(job.gpus[g].kept.begin(), job.gpus[g].kept.end()));
    const uint64_t kept = job.gpus[g].kept.size();
    settle_excess(job, gpu, std::max<uint64_t>(kept, std::min(excess, most > lent ? most - lent : 0)));
  }
}

void Daemon::Impl::to_pool(Gpu& gpu, uint32_t id, uint32_t uid) {
  PoolChunk& chunk = gpu.chunks[id - 1];
  chunk.owner = 0;
  chunk.last_uid = uid;
  gpu.free_ids.push_back(id);
}

namespace {

uint64_t thread_cpu_ns() {
  timespec ts{};
  (void)::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000 + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace

void Daemon::Impl::look_at_returns(Job& job, uint32_t gpu, std::vector<uint32_t> ids, uint64_t now) {
  JobGpu& held = job.gpus[gpu];
  std::string why;
  if (now < job.look_due_ns) {
    if (ids.empty()) return;
    if (ledger.charge(job.id, gpu, ids.size(), &why).is_ok()) {
      held.unchecked.insert(held.unchecked.end(), ids.begin(), ids.end());
      (void)ledger.set_returning(job.id, gpu, held.unchecked.size());
      arm_look_timer();
      return;
    }
    ZICO_LOG(kError, "job %llu: %s", static_cast<unsigned long long>(job.id), why.c_str());
  } else if (!held.unchecked.empty()) {
    // Due again: what waited is looked at with the rest.
    if (!ledger.uncharge(job.id, gpu, held.unchecked.size(), &why).is_ok()) {
      ZICO_LOG(kError, "job %llu: %s", static_cast<unsigned long long>(job.id), why.c_str());
    }
    ids.insert(ids.end(), held.unchecked.begin(), held.unchecked.end());
    held.unchecked.clear();
    (void)ledger.set_returning(job.id, gpu, 0);
  }
  if (ids.empty()) return;
  const size_t kept_before = held.kept.size();
  // The daemon's own CPU time, not the clock's: on a busy machine the
  // clock also counts the time the daemon waited for a CPU.
  const uint64_t cpu_before = thread_cpu_ns();
  pool_what_was_let_go(job, gpu, ids);
  const uint64_t looked = thread_cpu_ns() - cpu_before;
  job.looked_at_ns = now_ns();
  job.look_cost_ns = looked;
  job.look_due_ns = job.looked_at_ns + std::min<uint64_t>(20 * looked, kAuditEveryNs);
  if (held.kept.size() > kept_before) settle_excess(job, gpu, held.charged + (held.kept.size() - kept_before));
}

void Daemon::Impl::look_at_unchecked_returns(uint64_t now) {
  for (auto& [id, job] : jobs) {
    for (size_t g = 0; g < job.gpus.size(); ++g) {
      if (job.gpus[g].unchecked.empty()) continue;
      look_at_returns(job, static_cast<uint32_t>(g), {}, now);
      record_holding(job, static_cast<uint32_t>(g));
    }
  }
  arm_look_timer();
}

void Daemon::Impl::look_for_waiters(uint64_t now) {
  bool rearm = false;
  for (uint32_t g = 0; g < gpus.size(); ++g) {
    if (ledger.gpu(g).waiting == 0) continue;
    for (auto& [id, job] : jobs) {
      if (g >= job.gpus.size() || job.gpus[g].unchecked.empty()) continue;
      // Forced looks come at most every 3 times a look's cost (a third of
      // the daemon's CPU for a job that churns while others wait; the
      // regular pace is a twentieth).
      const uint64_t spaced = job.looked_at_ns + 3 * job.look_cost_ns;
      if (now < spaced) {
        job.look_due_ns = std::min(job.look_due_ns, spaced);  // the look timer brings it then
        rearm = true;
        continue;
      }
      job.look_due_ns = now;
      look_at_returns(job, g, {}, now);
      record_holding(job, g);
      rearm = true;
    }
  }
  if (rearm) arm_look_timer();
}

void Daemon::Impl::arm_look_timer() {
  // Looked at when due, not a tick later: the job may be waiting for them.
  uint64_t due = UINT64_MAX;
  for (const auto& [id, job] : jobs) {
    const bool waits = std::any_of(job.gpus.begin(), job.gpus.end(), [](const JobGpu& g) { return !g.unchecked.empty(); });
    if (waits) due = std::min(due, job.look_due_ns);
  }
  arm_timer(look_timer_fd, due);
}

void Daemon::Impl::pool_what_was_let_go(Job& job, uint32_t gpu, const std::vector<uint32_t>& ids) {
  if (ids.empty()) return;
  Gpu& pool = gpus[gpu];
  JobGpu& held = job.gpus[gpu];
  std::vector<PhysHandle> handles;
  handles.reserve(ids.size());
  for (uint32_t id : ids) handles.push_back(pool.chunks[id - 1].handle);
  std::vector<bool> still;
  // The daemon's own process (benchmarks, tests) holds every chunk of its pool.
  const Status status = job.peer.pid == ::getpid() || process_exited(job.pidfd)
                            ? Status(Errc::kNotSupported)
                            : driver.process_holds(job.peer.pid, pool.device, handles, &still);
  if (!status.is_ok() && status.code() != Errc::kNotSupported && !job.audit_denied) {
    ZICO_LOG(kWarn, "cannot check which chunks job %llu (pid %d) still maps: %s; they are lent again",
             static_cast<unsigned long long>(job.id), job.peer.pid, status.message().c_str());
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (status.is_ok() && still[i]) {
      held.kept.insert(ids[i]);
      continue;
    }
    held.kept.erase(ids[i]);
    to_pool(pool, ids[i], job.peer.uid);
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
  plan_gates_within_budget(gpu);
}

void Daemon::Impl::plan_gates_within_budget(uint32_t gpu) {
  uint64_t charged = 0;
  for (const auto& [id, job] : jobs) {
    if (gpu < job.gpus.size()) charged += job.gpus[gpu].charged;
  }
  const uint64_t budget = ledger.gpu(gpu).budget;
  gates.set_budget(gpu, (budget - std::min(budget, charged)) * gpus[gpu].chunk_bytes);
  open_gates();  // the plan changed: some may start now, others later
}

}  // namespace zico::sharing
