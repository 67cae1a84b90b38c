#include "ledger_impl.h"

#include <algorithm>
#include <cstddef>
#include <map>
#include <utility>

namespace zico::sharing {
namespace {

Status invalid(std::string* why, std::string text) {
  if (why != nullptr) *why = std::move(text);
  return Status(Errc::kInvalidArgument);
}

}  // namespace

void Ledger::ImplDeleter::operator()(Impl* impl) const { delete impl; }

Ledger::Ledger(LedgerOptions options) : impl_(new Impl) { impl_->options = options; }

uint32_t Ledger::add_gpu(uint64_t budget_chunks, uint64_t chunk_bytes) {
  impl_->gpus.emplace_back();
  impl_->gpus.back().budget = budget_chunks;
  impl_->gpus.back().chunk_bytes = chunk_bytes;
  return static_cast<uint32_t>(impl_->gpus.size() - 1);
}

size_t Ledger::gpu_count() const { return impl_->gpus.size(); }

bool Ledger::add_job(JobId job, uint32_t uid, uint64_t order) {
  return impl_->jobs.emplace(job, Impl::Job{uid, order}).second;
}

void Ledger::remove_job(JobId job) {
  if (impl_->jobs.erase(job) == 0) return;
  for (Impl::Gpu& gpu : impl_->gpus) {
    auto it = gpu.users.find(job);
    if (it == gpu.users.end()) continue;
    gpu.granted -= it->second.held + it->second.charged;
    gpu.returns += it->second.held;
    gpu.between_users -= it->second.between ? 1 : 0;
    gpu.parked_users -= it->second.parked ? 1 : 0;
    gpu.users.erase(it);
    std::erase_if(gpu.queue, [job](const Impl::Request& r) { return r.job == job; });
    if (gpu.yielding && gpu.yield_victim == job) gpu.yielding = false;
  }
}

bool Ledger::has_job(JobId job) const { return impl_->jobs.count(job) != 0; }

void Ledger::set_frozen(JobId job, bool frozen) {
  auto it = impl_->jobs.find(job);
  if (it == impl_->jobs.end()) return;
  it->second.frozen = frozen;
  if (frozen) release_victim(job);
}

void Ledger::release_victim(JobId job) {
  // A victim that can no longer give back must not hold up the next yield,
  // nor wait for a kResume when it is back.
  for (auto& gpu : impl_->gpus) {
    if (gpu.yielding && gpu.yield_victim == job) gpu.yielding = false;
    auto use = gpu.users.find(job);
    if (use != gpu.users.end() && use->second.parked) {
      use->second.parked = false;
      gpu.parked_users -= 1;
    }
  }
}

Status Ledger::open(JobId job, uint32_t gpu, uint64_t held, std::string* why) {
  if (!has_job(job)) return invalid(why, "unknown job " + std::to_string(job));
  if (gpu >= impl_->gpus.size()) return invalid(why, "unknown GPU " + std::to_string(gpu));
  Impl::Gpu& g = impl_->gpus[gpu];
  if (g.users.count(job) != 0) {
    return invalid(why, "job " + std::to_string(job) + " already opened GPU " + std::to_string(gpu));
  }
  // A reconnecting job keeps what it holds even past the budget: taking it
  // away would break the job; reclaims bring granted down instead.
  g.users[job].held = held;
  g.granted += held;
  return Status::ok();
}

Status Ledger::request(JobId job, uint32_t gpu, uint64_t request_id, uint64_t chunks, uint64_t now_ns,
                       std::string* why) {
  if (!has_job(job)) return invalid(why, "unknown job " + std::to_string(job));
  Impl::Use* use = impl_->find_use(job, gpu);
  if (use == nullptr) {
    return invalid(why, "job " + std::to_string(job) + " has not opened GPU " + std::to_string(gpu));
  }
  if (request_id == 0) return invalid(why, "request id 0 is reserved");
  if (chunks == 0) return invalid(why, "a request asks for at least one chunk");
  // Ids are per job, across GPUs, because cancel() names no GPU.
  for (const Impl::Gpu& g : impl_->gpus) {
    for (const Impl::Request& r : g.queue) {
      if (r.job == job && r.id == request_id) {
        return invalid(why, "request " + std::to_string(request_id) + " of job " + std::to_string(job) +
                                " is already waiting");
      }
    }
  }
  impl_->gpus[gpu].queue.push_back({job, request_id, chunks, now_ns});
  use->waiting_chunks += chunks;
  use->waiting_requests += 1;
  return Status::ok();
}

bool Ledger::cancel(JobId job, uint64_t request_id, uint64_t now_ns) {
  for (Impl::Gpu& gpu : impl_->gpus) {
    for (size_t i = 0; i < gpu.queue.size(); ++i) {
      if (gpu.queue[i].job == job && gpu.queue[i].id == request_id) {
        Impl::finish(gpu, i, now_ns);
        return true;
      }
    }
  }
  return false;
}

Status Ledger::charge(JobId job, uint32_t gpu, uint64_t chunks, std::string* why) {
  Impl::Use* use = impl_->find_use(job, gpu);
  if (use == nullptr) {
    return invalid(why, "job " + std::to_string(job) + " has not opened GPU " + std::to_string(gpu));
  }
  use->charged += chunks;
  impl_->gpus[gpu].granted += chunks;
  return Status::ok();
}

bool Ledger::set_returning(JobId job, uint32_t gpu, uint64_t chunks) {
  Impl::Use* use = impl_->find_use(job, gpu);
  if (use == nullptr) return false;
  use->returning = chunks;
  return true;
}

Status Ledger::uncharge(JobId job, uint32_t gpu, uint64_t chunks, std::string* why) {
  Impl::Use* use = impl_->find_use(job, gpu);
  if (use == nullptr) {
    return invalid(why, "job " + std::to_string(job) + " has not opened GPU " + std::to_string(gpu));
  }
  if (chunks > use->charged) {
    return invalid(why, "job " + std::to_string(job) + " is uncharged " + std::to_string(chunks) +
                            " chunks of GPU " + std::to_string(gpu) + " but was charged " +
                            std::to_string(use->charged));
  }
  use->charged -= chunks;
  impl_->gpus[gpu].granted -= chunks;
  return Status::ok();
}

Status Ledger::returned(JobId job, uint32_t gpu, uint64_t chunks, bool reclaim_reply, uint64_t now_ns,
                        std::string* why) {
  Impl::Use* use = impl_->find_use(job, gpu);
  if (use == nullptr) {
    return invalid(why, "job " + std::to_string(job) + " has not opened GPU " + std::to_string(gpu));
  }
  if (chunks > use->held) {
    return invalid(why, "job " + std::to_string(job) + " returns " + std::to_string(chunks) + " chunks of GPU " +
                            std::to_string(gpu) + " but holds " + std::to_string(use->held));
  }
  Impl::Gpu& g = impl_->gpus[gpu];
  use->held -= chunks;
  g.granted -= chunks;
  g.returns += chunks;
  if (reclaim_reply) {
    use->empty_replies = chunks == 0 ? use->empty_replies + 1 : 0;
    use->reclaim_outstanding = false;
    use->reclaim_asked = 0;
    use->ever_asked = true;
    use->last_asked_ns = now_ns;
    // A UM job that paged out for others: its own waiting requests go to the
    // back, behind those it paged out for (not straight back to it).
    if (use->page_floor != 0 && chunks != 0) {
      std::stable_partition(g.queue.begin(), g.queue.end(), [job](const Impl::Request& r) { return r.job != job; });
    }
  }
  if (g.yielding && g.yield_victim == job && use->held == 0) {
    g.yielding = false;
    if (use->parked) {
      // Parked for its swap's worth many times over, so that the swap out and
      // back in costs the others a small share of the time they gain.
      const LedgerOptions& o = impl_->options;
      use->swap_ns = Impl::sub_floor(now_ns, use->parked_ns);
      use->turn_ns = std::min(o.max_turn_ns, Impl::mul_sat(use->swap_ns, o.turn_swap_multiple));
      use->resume_ns = Impl::add_sat(now_ns, use->turn_ns);
    }
  }
  return Status::ok();
}

Status Ledger::set_budget(uint32_t gpu, uint64_t chunks, std::string* why) {
  if (gpu >= impl_->gpus.size()) return invalid(why, "unknown GPU " + std::to_string(gpu));
  Impl::Gpu& g = impl_->gpus[gpu];
  const uint64_t mins = Impl::sum_mins(g);
  if (chunks < mins) {
    return invalid(why, "budget " + Impl::amount(g, chunks) + " for GPU " + std::to_string(gpu) +
                            " is below the jobs' guaranteed minimums, " + Impl::amount(g, mins) + " in all");
  }
  g.budget = chunks;
  return Status::ok();
}

bool Ledger::set_claim(JobId job, uint32_t gpu, uint64_t peak_chunks, uint64_t settle_chunks) {
  Impl::Use* use = impl_->find_use(job, gpu);
  if (use == nullptr) return false;
  use->claim_peak = peak_chunks;
  use->claim_settle = peak_chunks == 0 ? 0 : std::min(settle_chunks, peak_chunks);
  use->paged_at_gate = 0;  // in mid-iteration: all of it for its next gate
  if (use->between) impl_->gpus[gpu].between_users -= 1;
  use->between = false;
  use->gate_peak = 0;
  if (peak_chunks != 0) use->last_settle = use->claim_settle;
  return true;
}

bool Ledger::set_pageable(JobId job, uint32_t gpu, uint64_t floor_chunks) {
  Impl::Use* use = impl_->find_use(job, gpu);
  if (use == nullptr) return false;
  use->page_floor = floor_chunks;
  return true;
}

bool Ledger::set_gate_paging(JobId job, uint32_t gpu, uint64_t chunks) {
  Impl::Use* use = impl_->find_use(job, gpu);
  if (use == nullptr) return false;
  use->gate_paging = chunks;
  return true;
}

bool Ledger::may_start(JobId job, uint32_t gpu, uint64_t peak_chunks, uint64_t settle_chunks,
                       uint64_t now_ns) const {
  if (gpu >= impl_->gpus.size()) return true;
  const Impl::Gpu& g = impl_->gpus[gpu];
  if (g.users.count(job) == 0) return true;
  const Impl::Use& self = g.users.at(job);
  if (!turns_allow_start(job, gpu, peak_chunks, now_ns)) return false;
  bool others_mid_iteration = false;
  bool unknown_mid_iteration = false;
  for (const auto& [id, use] : g.users) {
    // A UM job finishes its iteration with what it holds (it pages): never in danger.
    if (id == job || use.between || impl_->jobs.at(id).frozen || use.page_floor != 0) continue;
    const bool unknown = use.claim_peak == 0;
    if (unknown || use.waiting_requests > 0 || use.claim_peak > use.held) others_mid_iteration = true;
    if (unknown) unknown_mid_iteration = true;
  }
  if (!others_mid_iteration) return true;
  // Waiting at the gate helps the others only if they can get what they
  // wait for while this job keeps what it holds. A request that would not
  // fit even once every other job came down to its settle waits for this
  // job's memory: holding the job at its gate would close the circle.
  // (With turns it is parked instead, if it holds more than its minimum.)
  // A UM job is never parked: it starts (and pages).
  if (impl_->waits_for_job(g, job)) {
    return !impl_->options.park_between || self.page_floor != 0 || self.held <= self.min;
  }
  // A job without a claim runs its iterations alone, and none starts
  // against one: nothing would protect either from the other.
  if (peak_chunks == 0 || unknown_mid_iteration) return false;
  const Impl::Claim starting{peak_chunks, std::min(settle_chunks, peak_chunks)};
  return impl_->safe(g, job, 0, &starting);
}

bool Ledger::turns_allow_start(JobId job, uint32_t gpu, uint64_t peak_chunks, uint64_t now_ns) const {
  if (gpu >= impl_->gpus.size()) return true;
  const Impl::Gpu& g = impl_->gpus[gpu];
  auto it = g.users.find(job);
  if (it == g.users.end()) return true;
  const Impl::Use& self = it->second;
  if (self.parked) return false;
  // UM jobs do not take turns: they start capped and page.
  if (!impl_->options.park_between || self.page_floor != 0) return true;
  // Its iteration cannot fit beside what the others keep: it waits for one
  // of them to be parked. Or this job's memory is in the way of another's
  // iteration and its turn is over: it is parked instead.
  if (peak_chunks != 0 && Impl::starves(g, job, peak_chunks)) return false;
  return Impl::in_turn(self, now_ns) || impl_->starved_at_gate(g, job) == 0;
}

uint64_t Ledger::next_due_ns(uint64_t now_ns) const {
  uint64_t due = UINT64_MAX;
  for (const Impl::Gpu& g : impl_->gpus) {
    for (const auto& [id, use] : g.users) {
      if (use.parked) due = std::min(due, use.resume_ns);
      if (use.turn_until_ns > now_ns) due = std::min(due, use.turn_until_ns);
    }
  }
  return due;
}

uint64_t Ledger::turn_wait_until_ns(uint32_t gpu, uint64_t now_ns) const {
  uint64_t until = 0;
  if (gpu >= impl_->gpus.size()) return until;
  const Impl::Gpu& g = impl_->gpus[gpu];
  if (g.yielding) {
    // Still giving back: waited for, but only a second from the park on, so
    // that a job that never gives back cannot hold the gates for ever.
    const Impl::Use& victim = g.users.at(g.yield_victim);
    if (victim.parked) until = std::min(now_ns, Impl::add_sat(victim.parked_ns, kMaxGateBlockNs));
  }
  for (const auto& [id, use] : g.users) {
    if (use.turn_until_ns > now_ns) until = std::max(until, use.turn_until_ns);
  }
  return until;
}

bool Ledger::set_between_iterations(JobId job, uint32_t gpu, uint64_t next_peak_chunks) {
  Impl::Use* use = impl_->find_use(job, gpu);
  if (use == nullptr) return false;
  use->claim_peak = 0;
  use->claim_settle = 0;
  if (!use->between) {
    impl_->gpus[gpu].between_users += 1;
    use->paged_at_gate = 0;  // a new gate
  }
  use->between = true;
  use->gate_peak = next_peak_chunks;
  return true;
}

Status Ledger::set_job_limits(JobId job, uint32_t gpu, uint64_t min_chunks, uint64_t max_chunks,
                              std::string* why) {
  Impl::Use* use = impl_->find_use(job, gpu);
  if (use == nullptr) {
    return invalid(why, "job " + std::to_string(job) + " has not opened GPU " + std::to_string(gpu));
  }
  const Impl::Gpu& g = impl_->gpus[gpu];
  if (min_chunks > max_chunks) {
    return invalid(why, "minimum " + Impl::amount(g, min_chunks) + " exceeds maximum " + Impl::amount(g, max_chunks));
  }
  const uint64_t mins = Impl::sum_mins(g) - use->min + min_chunks;
  if (mins > g.budget) {
    return invalid(why, "minimums would total " + Impl::amount(g, mins) + " on GPU " + std::to_string(gpu) +
                            ", above its budget " + Impl::amount(g, g.budget));
  }
  use->min = min_chunks;
  use->max = max_chunks;
  return Status::ok();
}

std::vector<LedgerAction> Ledger::pump(uint64_t now_ns) {
  std::vector<LedgerAction> actions;
  for (uint32_t g = 0; g < impl_->gpus.size(); ++g) impl_->pump_gpu(g, now_ns, &actions);
  return actions;
}

Ledger::GpuView Ledger::gpu(uint32_t gpu) const {
  GpuView view;
  if (gpu >= impl_->gpus.size()) return view;
  const Impl::Gpu& g = impl_->gpus[gpu];
  view.budget = g.budget;
  view.granted = g.granted;
  for (const Impl::Request& r : g.queue) view.waiting += r.chunks;
  view.grants = g.grants;
  view.returns = g.returns;
  view.deadlocks = g.deadlocks;
  view.parks = g.parks;
  return view;
}

bool Ledger::job(JobId job, uint32_t gpu, uint64_t now_ns, JobView* out) const {
  auto job_it = impl_->jobs.find(job);
  if (job_it == impl_->jobs.end() || gpu >= impl_->gpus.size()) return false;
  const Impl::Gpu& g = impl_->gpus[gpu];
  auto it = g.users.find(job);
  if (it == g.users.end()) return false;
  const Impl::Use& use = it->second;
  out->uid = job_it->second.uid;
  out->order = job_it->second.order;
  out->held = use.held;
  out->charged = use.charged;
  out->min = use.min;
  out->max = use.max;
  out->waiting = use.waiting_chunks;
  out->wait_ns = use.waited_ns;
  out->parked = use.parked;
  for (const Impl::Request& r : g.queue) {
    if (r.job == job) out->wait_ns += Impl::sub_floor(now_ns, r.enqueued_ns);
  }
  return true;
}

std::vector<JobId> Ledger::jobs() const {
  std::vector<JobId> ids;
  ids.reserve(impl_->jobs.size());
  for (const auto& [id, job] : impl_->jobs) ids.push_back(id);
  return ids;
}

std::string Ledger::check() const {
  for (uint32_t g = 0; g < impl_->gpus.size(); ++g) {
    const Impl::Gpu& gpu = impl_->gpus[g];
    const std::string where = "GPU " + std::to_string(g) + ": ";
    uint64_t held = 0;
    uint64_t mins = 0;
    for (const auto& [id, use] : gpu.users) {
      const std::string who = where + "job " + std::to_string(id) + " ";
      if (impl_->jobs.count(id) == 0) return who + "opened the GPU but does not exist";
      if (use.min > use.max) return who + "has min above max";
      if (use.reclaim_outstanding && use.reclaim_asked == 0) return who + "has an outstanding reclaim of 0 chunks";
      uint64_t chunks = 0;
      uint64_t requests = 0;
      for (const Impl::Request& r : gpu.queue) {
        if (r.job == id) {
          chunks += r.chunks;
          requests += 1;
        }
      }
      if (chunks != use.waiting_chunks || requests != use.waiting_requests) {
        return who + "waits for " + std::to_string(chunks) + " chunks in " + std::to_string(requests) +
               " requests, but its counters say " + std::to_string(use.waiting_chunks) + " in " +
               std::to_string(use.waiting_requests);
      }
      held += use.held + use.charged;
      mins += use.min;
    }
    uint64_t between = 0;
    uint64_t parked = 0;
    for (const auto& [id, use] : gpu.users) {
      between += use.between ? 1 : 0;
      parked += use.parked ? 1 : 0;
    }
    if (between != gpu.between_users || parked != gpu.parked_users) {
      return where + std::to_string(between) + " jobs between iterations and " + std::to_string(parked) +
             " parked, but the counters say " + std::to_string(gpu.between_users) + " and " +
             std::to_string(gpu.parked_users);
    }
    if (held != gpu.granted) {
      return where + "granted " + std::to_string(gpu.granted) + " but jobs hold " + std::to_string(held);
    }
    if (mins > gpu.budget) {
      return where + "minimums " + std::to_string(mins) + " exceed the budget " + std::to_string(gpu.budget);
    }
    for (const Impl::Request& r : gpu.queue) {
      if (gpu.users.count(r.job) == 0) {
        return where + "request " + std::to_string(r.id) + " of job " + std::to_string(r.job) +
               " waits but the job did not open the GPU";
      }
      if (r.id == 0 || r.chunks == 0) return where + "a queued request has id 0 or 0 chunks";
    }
    if (gpu.yielding) {
      auto it = gpu.users.find(gpu.yield_victim);
      if (it == gpu.users.end() || it->second.held == 0) return where + "a yield is in progress without a victim";
    }
  }
  // Request ids are unique per job across GPUs (cancel names no GPU).
  std::map<std::pair<JobId, uint64_t>, int> ids;
  for (const Impl::Gpu& gpu : impl_->gpus) {
    for (const Impl::Request& r : gpu.queue) {
      if (++ids[{r.job, r.id}] > 1) {
        return "request " + std::to_string(r.id) + " of job " + std::to_string(r.job) + " waits twice";
      }
    }
  }
  return "";
}

}  // namespace zico::sharing
