#include "ledger.h"

#include <algorithm>
#include <cstddef>
#include <map>
#include <utility>

namespace zico::sharing {
namespace {

// held + chunks may overflow when a request asks for an absurd count; such a
// request must read as "too big", never wrap around to "fits".
uint64_t add_sat(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }
uint64_t sub_floor(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }
uint64_t mul_sat(uint64_t a, uint64_t b) { return b != 0 && a > UINT64_MAX / b ? UINT64_MAX : a * b; }

struct Request {
  JobId job = 0;
  uint64_t id = 0;
  uint64_t chunks = 0;
  uint64_t enqueued_ns = 0;
};

// One job on one GPU.
struct Use {
  uint64_t held = 0;
  // Held beyond its grants (charge()): in the GPU's granted, never asked
  // back, not what a yield or a park waits for the job to give.
  uint64_t charged = 0;
  uint64_t min = 0;
  uint64_t max = UINT64_MAX;
  // Mirrors of this job's entries in the GPU queue, so "is it waiting" is O(1).
  uint64_t waiting_chunks = 0;
  uint64_t waiting_requests = 0;
  uint64_t waited_ns = 0;  // finished waits only; queued requests add theirs on read
  // The claim (set_claim): 0 = none. between: at its iteration gate, it
  // needs nothing more than it holds (set_between_iterations).
  uint64_t claim_peak = 0;
  uint64_t claim_settle = 0;
  bool between = false;
  // An unanswered kReclaim: the job is not asked again until it replies, and
  // what it was asked counts as already on its way back.
  bool reclaim_outstanding = false;
  uint64_t reclaim_asked = 0;
  bool ever_asked = false;
  uint64_t last_asked_ns = 0;  // the last ask or reply, for reclaim_retry_ns
  // Turns (ledger.h): parked from kPark to kResume, then its turn.
  uint64_t gate_peak = 0;  // between: the peak of the iteration it waits to start (0: unknown)
  bool parked = false;
  uint64_t parked_ns = 0;           // when it was told kPark
  uint64_t swap_ns = 0;             // how long it took to give everything back
  uint64_t turn_ns = 0;             // how long it stays parked, and how long its turn lasts
  uint64_t resume_ns = UINT64_MAX;  // kResume is due (UINT64_MAX: still giving back)
  uint64_t turn_until_ns = 0;
  uint64_t last_settle = 0;  // its latest claim's (kept_between)
};

struct Gpu {
  uint64_t budget = 0;
  uint64_t granted = 0;
  uint64_t grants = 0;
  uint64_t returns = 0;
  uint64_t deadlocks = 0;
  uint64_t parks = 0;
  // How many users are between iterations, and parked: when none is, a pump
  // skips the turn rules (a chunk request pays nothing for them).
  uint64_t between_users = 0;
  uint64_t parked_users = 0;
  std::map<JobId, Use> users;  // the jobs that opened this GPU
  std::vector<Request> queue;  // arrival order; the front is the head
  // The kYield or kPark victim until it has returned everything: one victim at a
  // time, or every waiter would be told to yield before the first one's chunks are back.
  bool yielding = false;
  JobId yield_victim = 0;
};

struct Job {
  uint32_t uid = 0;
  uint64_t order = 0;
  bool frozen = false;  // set_frozen(): cannot answer, cannot give back
};

Status invalid(std::string* why, std::string text) {
  if (why != nullptr) *why = std::move(text);
  return Status(Errc::kInvalidArgument);
}

}  // namespace

struct Ledger::Impl {
  LedgerOptions options;
  std::vector<Gpu> gpus;
  std::map<JobId, Job> jobs;

  // a is younger than b: a later arrival, job id as the tie-break so the
  // choice never depends on map iteration details.
  bool younger(JobId a, JobId b) const {
    const uint64_t oa = jobs.at(a).order;
    const uint64_t ob = jobs.at(b).order;
    return oa != ob ? oa > ob : a > b;
  }

  static uint64_t free_of(const Gpu& gpu) { return sub_floor(gpu.budget, gpu.granted); }

  static uint64_t sum_mins(const Gpu& gpu) {
    uint64_t sum = 0;
    for (const auto& [id, use] : gpu.users) sum += use.min;
    return sum;
  }

  // What the other jobs still lack to reach their guaranteed minimums.
  static uint64_t others_unmet(const Gpu& gpu, JobId job) {
    uint64_t sum = 0;
    for (const auto& [id, use] : gpu.users) {
      if (id != job) sum += sub_floor(use.min, use.held);
    }
    return sum;
  }

  // The most `job` can ever hold: its max, and what the budget leaves once
  // every other job has its minimum.
  static uint64_t ceiling(const Gpu& gpu, JobId job) {
    const Use& use = gpu.users.at(job);
    return std::min(use.max, sub_floor(gpu.budget, sum_mins(gpu) - use.min));
  }

  // A claim's peak as the safety check counts it: no more than the job can
  // ever hold. A job whose iteration needs more than that (it pages beyond
  // the budget, or will be refused) would otherwise never be able to finish
  // in the check, and no grant to anyone, itself included, would be safe.
  static uint64_t counted_peak(const Gpu& gpu, JobId job, uint64_t claim_peak) {
    return std::min(claim_peak, ceiling(gpu, job));
  }

  static bool possible(const Gpu& gpu, const Request& r) {
    return add_sat(gpu.users.at(r.job).held, r.chunks) <= ceiling(gpu, r.job);
  }

  // Granting keeps granted <= budget (free is 0 above it) and leaves room for
  // the others' minimums. The max is covered by possible(), checked first.
  static bool fits(const Gpu& gpu, const Request& r) {
    return add_sat(r.chunks, others_unmet(gpu, r.job)) <= free_of(gpu);
  }

  // The banker's check: would granting `chunks` to `job` leave every job
  // with a claim able to finish its iteration, one after another? Frozen jobs
  // are left out like jobs without a claim: they cannot move either way.
  // `starting`, if given, is the claim `job` would have instead of its own
  // (an iteration about to start).
  struct Claim {
    uint64_t peak = 0;
    uint64_t settle = 0;
  };
  struct Pending {
    uint64_t need;
    uint64_t held;
    uint64_t settle;
  };
  // safe()'s working list, kept so that a chunk request allocates nothing.
  mutable std::vector<Pending> pending_scratch;

  bool safe(const Gpu& gpu, JobId job, uint64_t chunks, const Claim* starting = nullptr) const {
    std::vector<Pending>& pending = pending_scratch;
    pending.clear();
    for (const auto& [id, use] : gpu.users) {
      const Claim claim = id == job && starting != nullptr ? *starting : Claim{use.claim_peak, use.claim_settle};
      if (claim.peak == 0 || jobs.at(id).frozen) continue;  // unknown, or between iterations
      const uint64_t held = id == job ? add_sat(use.held, chunks) : use.held;
      const uint64_t peak = counted_peak(gpu, id, claim.peak);
      pending.push_back({sub_floor(peak, held), held, std::min(claim.settle, peak)});
    }
    uint64_t free = sub_floor(free_of(gpu), chunks);
    // A job climbs to its peak and comes down to settle: it can go if its
    // need fits in free, and free then changes by held - settle. Jobs that
    // end holding no more than now (settle <= held) only add to free: they
    // go first, the least needy first (if one does not fit, none after it
    // will). The others (settle > held: early in an iteration, after a
    // yield) take settle - held for good; among them the one with the most
    // need beyond its take goes first. Of two, a-then-b needs free >=
    // max(need_a, take_a + need_b), no more than b-then-a needs when need_a -
    // take_a >= need_b - take_b; so that order finishes them all if any
    // order does. (Taking the least needy first whatever the kind, as this
    // check once did, can strand a needier job that had to go first.)
    const auto taken = std::partition(pending.begin(), pending.end(),
                                      [](const Pending& p) { return p.settle <= p.held; });
    std::sort(pending.begin(), taken, [](const Pending& a, const Pending& b) { return a.need < b.need; });
    for (auto it = pending.begin(); it != taken; ++it) {
      if (it->need > free) return false;
      free = add_sat(free, it->held - it->settle);
    }
    std::sort(taken, pending.end(), [](const Pending& a, const Pending& b) {
      return a.need + (b.settle - b.held) > b.need + (a.settle - a.held);  // need - take, descending
    });
    for (auto it = taken; it != pending.end(); ++it) {
      if (it->need > free) return false;
      free -= it->settle - it->held;  // <= need <= free: settle <= peak
    }
    return true;
  }

  // The job's claim says its whole remaining need fits in the free budget:
  // it can finish its iteration, and then gives back.
  static bool can_finish(const Gpu& gpu, JobId job, const Use& use) {
    return !use.between && use.claim_peak != 0 &&
           sub_floor(counted_peak(gpu, job, use.claim_peak), use.held) <= free_of(gpu);
  }

  // Chunks on their way back to the pool, not to be counted on twice: what
  // an outstanding reclaim asked of the job, or all it holds when it is the
  // victim of a yield or a park (at most one per GPU at a time). The two
  // never overlap: neither a deadlock nor a park picks a job with a reclaim
  // outstanding, and a victim is not asked to reclaim.
  static uint64_t incoming(const Gpu& gpu, JobId id, const Use& use) {
    if (use.reclaim_outstanding) return use.reclaim_asked;
    return gpu.yielding && gpu.yield_victim == id ? use.held : 0;
  }

  // Is a request queued that cannot be served unless `job` gives back: it
  // would not fit even if every other job but the asker came down to its
  // claim's settle (jobs without a claim counted at what they hold)?
  static bool waits_for_job(const Gpu& gpu, JobId job) {
    for (const Request& r : gpu.queue) {
      if (r.job == job) continue;
      uint64_t could_free = free_of(gpu);
      for (const auto& [id, use] : gpu.users) {
        if (id == job || id == r.job || use.claim_peak == 0) continue;
        could_free = add_sat(could_free, sub_floor(use.held, use.claim_settle));
      }
      if (add_sat(r.chunks, others_unmet(gpu, r.job)) > could_free) return true;
    }
    return false;
  }

  // Takes queue[index] out of the queue and books its wait.
  static Request finish(Gpu& gpu, size_t index, uint64_t now_ns) {
    Request r = gpu.queue[index];
    gpu.queue.erase(gpu.queue.begin() + static_cast<std::ptrdiff_t>(index));
    Use& use = gpu.users.at(r.job);
    use.waiting_chunks -= r.chunks;
    use.waiting_requests -= 1;
    use.waited_ns += sub_floor(now_ns, r.enqueued_ns);
    return r;
  }

  static void grant(Gpu& gpu, uint32_t g, size_t index, uint64_t now_ns, std::vector<LedgerAction>* out) {
    const Request r = finish(gpu, index, now_ns);
    gpu.users.at(r.job).held += r.chunks;
    gpu.granted += r.chunks;
    gpu.grants += r.chunks;
    out->push_back({LedgerAction::Kind::kGrant, r.job, g, r.id, r.chunks, Errc::kOk, {}});
  }

  static void deny(Gpu& gpu, uint32_t g, size_t index, uint64_t now_ns, std::string reason,
                   std::vector<LedgerAction>* out) {
    const Request r = finish(gpu, index, now_ns);
    out->push_back({LedgerAction::Kind::kDeny, r.job, g, r.id, r.chunks, Errc::kOutOfMemory, std::move(reason)});
  }

  // Denies every queued request that no amount of waiting can serve. Returns
  // whether it denied any.
  static bool deny_impossible(Gpu& gpu, uint32_t g, uint64_t now_ns, std::vector<LedgerAction>* out) {
    bool denied = false;
    for (size_t i = 0; i < gpu.queue.size();) {
      const Request& r = gpu.queue[i];
      if (possible(gpu, r)) {
        ++i;
        continue;
      }
      const Use& use = gpu.users.at(r.job);
      std::string reason = "GPU " + std::to_string(g) + ": asks for " + std::to_string(r.chunks) +
                           " chunks while holding " + std::to_string(use.held) + ", but the job can hold at most " +
                           std::to_string(ceiling(gpu, r.job)) + " (its max " +
                           (use.max == UINT64_MAX ? std::string("unlimited") : std::to_string(use.max)) +
                           ", budget " + std::to_string(gpu.budget) + " less the other jobs' minimums " +
                           std::to_string(sum_mins(gpu) - use.min) + ")";
      deny(gpu, g, i, now_ns, std::move(reason), out);
      denied = true;
    }
    return denied;
  }

  // One grant or denial at a time, re-evaluated from scratch: every grant
  // changes free, the grantee's held and the others' unmet minimums.
  bool serve_one(Gpu& gpu, uint32_t g, uint64_t now_ns, std::vector<LedgerAction>* out) const {
    if (deny_impossible(gpu, g, now_ns, out)) return true;
    for (size_t i = 0; i < gpu.queue.size(); ++i) {
      const Request& r = gpu.queue[i];
      const Use& use = gpu.users.at(r.job);
      if (add_sat(use.held, r.chunks) <= use.min && fits(gpu, r)) {
        grant(gpu, g, i, now_ns, out);
        return true;
      }
    }
    // First come, first served among the requests that fit and are safe: an
    // unsafe one waits without blocking the rest, and the first that does
    // not fit blocks the ones behind it...
    size_t blocker = gpu.queue.size();
    for (size_t i = 0; i < gpu.queue.size(); ++i) {
      const Request& r = gpu.queue[i];
      if (!fits(gpu, r)) {
        blocker = i;
        break;
      }
      if (safe(gpu, r.job, r.chunks)) {
        grant(gpu, g, i, now_ns, out);
        return true;
      }
    }
    if (blocker == gpu.queue.size()) return false;
    // ... except for a job that can finish its iteration with the free
    // budget, and, while the blocker's job holds nothing to give and its
    // patience lasts, for jobs in mid-iteration (the rules in ledger.h).
    const Request& blocking = gpu.queue[blocker];
    const Use& blocking_use = gpu.users.at(blocking.job);
    const bool patient = blocking_use.held <= blocking_use.min &&
                         sub_floor(now_ns, blocking.enqueued_ns) < options.head_patience_ns;
    for (size_t i = blocker + 1; i < gpu.queue.size(); ++i) {
      const Request& r = gpu.queue[i];
      const Use& use = gpu.users.at(r.job);
      if (r.job == blocking.job || !fits(gpu, r) || !safe(gpu, r.job, r.chunks)) continue;
      if (can_finish(gpu, r.job, use) || (patient && use.held > use.min)) {
        grant(gpu, g, i, now_ns, out);
        return true;
      }
    }
    return false;
  }

  // The head is blocked (or granted > budget). Jobs that neither wait nor sit
  // at their minimum could give chunks back; when none could, and none is
  // already giving back, the waiters hold each other up and only the policy
  // can break it.
  bool break_deadlock(Gpu& gpu, uint32_t g, uint64_t now_ns, std::vector<LedgerAction>* out) {
    if (gpu.queue.empty()) return false;
    JobId victim = 0;
    bool found = false;
    for (const auto& [id, use] : gpu.users) {
      if (incoming(gpu, id, use) > 0) return false;  // memory is on its way back: no jam (yet)
      if (use.held <= use.min) continue;  // its chunks are guaranteed, not part of the jam
      if (jobs.at(id).frozen) continue;   // gives back only when it goes; not part of the jam either
      if (use.waiting_requests == 0) return false;  // reclaim can reach it
      if (found) {
        const uint64_t best = gpu.users.at(victim).held;
        const bool better = options.deadlock_policy == DeadlockPolicy::kYield
                                ? use.held > best || (use.held == best && younger(id, victim))
                                : younger(id, victim);
        if (!better) continue;
      }
      victim = id;
      found = true;
    }
    // None found: every job above its minimum is frozen (it gives back only
    // when it goes), so no yield or refusal can help.
    if (!found) return false;
    gpu.deadlocks += 1;
    for (size_t i = 0; i < gpu.queue.size();) {
      if (gpu.queue[i].job != victim) {
        ++i;
        continue;
      }
      if (options.deadlock_policy == DeadlockPolicy::kYield) {
        const Request r = finish(gpu, i, now_ns);
        out->push_back({LedgerAction::Kind::kYield, victim, g, r.id, gpu.users.at(victim).held, Errc::kOk, {}});
      } else {
        deny(gpu, g, i, now_ns,
             "GPU " + std::to_string(g) +
                 ": deadlock, every job holding more than its minimum waits; the youngest is refused",
             out);
      }
    }
    if (options.deadlock_policy == DeadlockPolicy::kYield) {
      gpu.yielding = true;
      gpu.yield_victim = victim;
    }
    return true;
  }

  // Resumed from a park, its turn has not ended: it is not parked again for
  // a job starved beside it.
  static bool in_turn(const Use& use, uint64_t now_ns) { return !use.parked && now_ns < use.turn_until_ns; }

  // What a job keeps between its iterations: what it holds at its gate, its
  // claim's settle in mid-iteration (its last claim's while it has none).
  static uint64_t kept_between(const Use& use) {
    if (use.between) return use.held;
    return std::min(use.held, use.claim_peak != 0 ? use.claim_settle : use.last_settle);
  }

  // An iteration of `job` peaking at peak_chunks cannot fit beside what the
  // other jobs keep between theirs: it can run only once one of them is out.
  static bool starves(const Gpu& gpu, JobId job, uint64_t peak_chunks) {
    uint64_t kept = 0;
    for (const auto& [id, use] : gpu.users) {
      if (id != job) kept = add_sat(kept, kept_between(use));
    }
    return add_sat(counted_peak(gpu, job, peak_chunks), kept) > gpu.budget;
  }

  // A job other than `except` that waits at its gate for such an iteration
  // (the first in id order; 0 if none).
  JobId starved_at_gate(const Gpu& gpu, JobId except = 0) const {
    for (const auto& [id, use] : gpu.users) {
      if (id == except || !use.between || use.parked || use.gate_peak == 0 || jobs.at(id).frozen) continue;
      if (starves(gpu, id, use.gate_peak)) return id;
    }
    return 0;
  }

  // Parks the job between iterations whose memory is in the way, the one
  // holding the most: a request waits for it (waits_for_job), or a job at its
  // gate starves beside it and its turn is over.
  void park(Gpu& gpu, uint32_t g, uint64_t now_ns, std::vector<LedgerAction>* out) {
    if (!options.park_between || gpu.yielding || gpu.between_users == 0) return;
    // Starving is weighed once: a second starved job matters only when the
    // candidate is the first one itself.
    const JobId starved = starved_at_gate(gpu);
    if (starved == 0 && gpu.queue.empty()) return;
    JobId victim = 0;
    uint64_t most = 0;
    for (const auto& [id, use] : gpu.users) {
      if (!use.between || use.parked || use.waiting_requests > 0 || use.reclaim_outstanding) continue;
      if (use.held <= use.min || use.held - use.min <= most || jobs.at(id).frozen) continue;
      const bool starves_another = starved != 0 && (starved != id || starved_at_gate(gpu, id) != 0);
      if (!(starves_another && !in_turn(use, now_ns)) && !waits_for_job(gpu, id)) continue;
      most = use.held - use.min;
      victim = id;
    }
    if (victim == 0) return;
    Use& use = gpu.users.at(victim);
    use.parked = true;
    gpu.parked_users += 1;
    use.parked_ns = now_ns;
    use.resume_ns = UINT64_MAX;
    gpu.parks += 1;
    gpu.yielding = true;
    gpu.yield_victim = victim;
    out->push_back({LedgerAction::Kind::kPark, victim, g, 0, use.held, Errc::kOk, {}});
  }

  // A parked job that has given everything back resumes when its time is up,
  // or at once when no other job holds more than its minimum or waits (none
  // is in the way any more). Its turn starts: long enough to bring its
  // memory back, run as long as it was parked and go out again.
  static void resume(Gpu& gpu, uint32_t g, uint64_t now_ns, std::vector<LedgerAction>* out) {
    if (gpu.parked_users == 0) return;
    for (auto& [id, use] : gpu.users) {
      if (!use.parked || use.resume_ns == UINT64_MAX) continue;
      // A copy of the binding: clang before 16 does not capture structured bindings.
      const bool others_hold = std::any_of(gpu.users.begin(), gpu.users.end(), [&, self = id](const auto& other) {
        return other.first != self && (other.second.held > other.second.min || other.second.waiting_requests > 0);
      });
      if (others_hold && now_ns < use.resume_ns) continue;
      use.parked = false;
      gpu.parked_users -= 1;
      use.resume_ns = UINT64_MAX;
      use.turn_until_ns = add_sat(now_ns, add_sat(mul_sat(use.swap_ns, 2), use.turn_ns));
      out->push_back({LedgerAction::Kind::kResume, id, g, 0, 0, Errc::kOk, {}});
    }
  }

  void reclaim(Gpu& gpu, uint32_t g, uint64_t now_ns, std::vector<LedgerAction>* out) {
    // Enough to bring granted to the budget and, if a request waits, to fit
    // the head including the room it must leave for the others' minimums.
    uint64_t needed = gpu.granted;
    if (!gpu.queue.empty()) {
      const Request& head = gpu.queue.front();
      needed = add_sat(needed, add_sat(head.chunks, others_unmet(gpu, head.job)));
    }
    uint64_t shortfall = sub_floor(needed, gpu.budget);
    // Chunks already on their way back are not asked for twice.
    for (const auto& [id, use] : gpu.users) shortfall = sub_floor(shortfall, incoming(gpu, id, use));
    if (shortfall == 0) return;

    std::vector<JobId> candidates;
    for (const auto& [id, use] : gpu.users) {
      if (use.waiting_requests > 0 || use.held <= use.min || incoming(gpu, id, use) > 0) continue;
      if (jobs.at(id).frozen) continue;
      if (use.ever_asked && (now_ns < use.last_asked_ns || now_ns - use.last_asked_ns < options.reclaim_retry_ns)) {
        continue;
      }
      candidates.push_back(id);
    }
    // Biggest holders first: they most likely have idle chunks, and fewer
    // jobs are disturbed.
    std::sort(candidates.begin(), candidates.end(), [&](JobId a, JobId b) {
      const uint64_t ha = gpu.users.at(a).held;
      const uint64_t hb = gpu.users.at(b).held;
      return ha != hb ? ha > hb : younger(a, b);
    });
    for (JobId id : candidates) {
      if (shortfall == 0) break;
      Use& use = gpu.users.at(id);
      const uint64_t ask = std::min(use.held - use.min, shortfall);
      use.reclaim_outstanding = true;
      use.reclaim_asked = ask;
      use.ever_asked = true;
      use.last_asked_ns = now_ns;
      shortfall -= ask;
      out->push_back({LedgerAction::Kind::kReclaim, id, g, 0, ask, Errc::kOk, {}});
    }
  }

  void pump_gpu(uint32_t g, uint64_t now_ns, std::vector<LedgerAction>* out) {
    Gpu& gpu = gpus[g];
    resume(gpu, g, now_ns, out);
    while (serve_one(gpu, g, now_ns, out)) {
    }
    // A park frees nothing now (the job gives back later, in returned()),
    // so nothing more can be served after it.
    park(gpu, g, now_ns, out);
    // Deadlock before reclaim: under kFail the refused job stops waiting and
    // becomes a reclaim candidate in the same pump; either way the victim's
    // requests leave the queue, so a new head may fit already.
    if (break_deadlock(gpu, g, now_ns, out)) {
      while (serve_one(gpu, g, now_ns, out)) {
      }
    }
    if (!gpu.queue.empty() || gpu.granted > gpu.budget) reclaim(gpu, g, now_ns, out);
  }

  Use* find_use(JobId job, uint32_t g) {
    if (g >= gpus.size()) return nullptr;
    auto it = gpus[g].users.find(job);
    return it == gpus[g].users.end() ? nullptr : &it->second;
  }
};

void Ledger::ImplDeleter::operator()(Impl* impl) const { delete impl; }

Ledger::Ledger(LedgerOptions options) : impl_(new Impl) { impl_->options = options; }

uint32_t Ledger::add_gpu(uint64_t budget_chunks) {
  impl_->gpus.emplace_back();
  impl_->gpus.back().budget = budget_chunks;
  return static_cast<uint32_t>(impl_->gpus.size() - 1);
}

size_t Ledger::gpu_count() const { return impl_->gpus.size(); }

bool Ledger::add_job(JobId job, uint32_t uid, uint64_t order) {
  return impl_->jobs.emplace(job, Job{uid, order}).second;
}

void Ledger::remove_job(JobId job) {
  if (impl_->jobs.erase(job) == 0) return;
  for (Gpu& gpu : impl_->gpus) {
    auto it = gpu.users.find(job);
    if (it == gpu.users.end()) continue;
    gpu.granted -= it->second.held + it->second.charged;
    gpu.returns += it->second.held;
    gpu.between_users -= it->second.between ? 1 : 0;
    gpu.parked_users -= it->second.parked ? 1 : 0;
    gpu.users.erase(it);
    std::erase_if(gpu.queue, [job](const Request& r) { return r.job == job; });
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
  Gpu& g = impl_->gpus[gpu];
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
  Use* use = impl_->find_use(job, gpu);
  if (use == nullptr) {
    return invalid(why, "job " + std::to_string(job) + " has not opened GPU " + std::to_string(gpu));
  }
  if (request_id == 0) return invalid(why, "request id 0 is reserved");
  if (chunks == 0) return invalid(why, "a request asks for at least one chunk");
  // Ids are per job, across GPUs, because cancel() names no GPU.
  for (const Gpu& g : impl_->gpus) {
    for (const Request& r : g.queue) {
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
  for (Gpu& gpu : impl_->gpus) {
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
  Use* use = impl_->find_use(job, gpu);
  if (use == nullptr) {
    return invalid(why, "job " + std::to_string(job) + " has not opened GPU " + std::to_string(gpu));
  }
  use->charged += chunks;
  impl_->gpus[gpu].granted += chunks;
  return Status::ok();
}

Status Ledger::uncharge(JobId job, uint32_t gpu, uint64_t chunks, std::string* why) {
  Use* use = impl_->find_use(job, gpu);
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
  Use* use = impl_->find_use(job, gpu);
  if (use == nullptr) {
    return invalid(why, "job " + std::to_string(job) + " has not opened GPU " + std::to_string(gpu));
  }
  if (chunks > use->held) {
    return invalid(why, "job " + std::to_string(job) + " returns " + std::to_string(chunks) + " chunks of GPU " +
                            std::to_string(gpu) + " but holds " + std::to_string(use->held));
  }
  Gpu& g = impl_->gpus[gpu];
  use->held -= chunks;
  g.granted -= chunks;
  g.returns += chunks;
  if (reclaim_reply) {
    use->reclaim_outstanding = false;
    use->reclaim_asked = 0;
    use->ever_asked = true;
    use->last_asked_ns = now_ns;
  }
  if (g.yielding && g.yield_victim == job && use->held == 0) {
    g.yielding = false;
    if (use->parked) {
      // Parked for its swap's worth many times over, so that the swap out and
      // back in costs the others a small share of the time they gain.
      const LedgerOptions& o = impl_->options;
      use->swap_ns = sub_floor(now_ns, use->parked_ns);
      use->turn_ns = std::min(o.max_turn_ns, mul_sat(use->swap_ns, o.turn_swap_multiple));
      use->resume_ns = add_sat(now_ns, use->turn_ns);
    }
  }
  return Status::ok();
}

Status Ledger::set_budget(uint32_t gpu, uint64_t chunks, std::string* why) {
  if (gpu >= impl_->gpus.size()) return invalid(why, "unknown GPU " + std::to_string(gpu));
  Gpu& g = impl_->gpus[gpu];
  const uint64_t mins = Impl::sum_mins(g);
  if (chunks < mins) {
    return invalid(why, "budget " + std::to_string(chunks) + " chunks for GPU " + std::to_string(gpu) +
                            " is below the jobs' guaranteed minimums, " + std::to_string(mins) + " in all");
  }
  g.budget = chunks;
  return Status::ok();
}

bool Ledger::set_claim(JobId job, uint32_t gpu, uint64_t peak_chunks, uint64_t settle_chunks) {
  Use* use = impl_->find_use(job, gpu);
  if (use == nullptr) return false;
  use->claim_peak = peak_chunks;
  use->claim_settle = peak_chunks == 0 ? 0 : std::min(settle_chunks, peak_chunks);
  if (use->between) impl_->gpus[gpu].between_users -= 1;
  use->between = false;
  use->gate_peak = 0;
  if (peak_chunks != 0) use->last_settle = use->claim_settle;
  return true;
}

bool Ledger::may_start(JobId job, uint32_t gpu, uint64_t peak_chunks, uint64_t settle_chunks,
                       uint64_t now_ns) const {
  if (gpu >= impl_->gpus.size()) return true;
  const Gpu& g = impl_->gpus[gpu];
  if (g.users.count(job) == 0) return true;
  const Use& self = g.users.at(job);
  if (!turns_allow_start(job, gpu, peak_chunks, now_ns)) return false;
  bool others_mid_iteration = false;
  bool unknown_mid_iteration = false;
  for (const auto& [id, use] : g.users) {
    if (id == job || use.between || impl_->jobs.at(id).frozen) continue;
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
  if (impl_->waits_for_job(g, job)) return !impl_->options.park_between || self.held <= self.min;
  // A job without a claim runs its iterations alone, and none starts
  // against one: nothing would protect either from the other.
  if (peak_chunks == 0 || unknown_mid_iteration) return false;
  const Impl::Claim starting{peak_chunks, std::min(settle_chunks, peak_chunks)};
  return impl_->safe(g, job, 0, &starting);
}

bool Ledger::turns_allow_start(JobId job, uint32_t gpu, uint64_t peak_chunks, uint64_t now_ns) const {
  if (gpu >= impl_->gpus.size()) return true;
  const Gpu& g = impl_->gpus[gpu];
  auto it = g.users.find(job);
  if (it == g.users.end()) return true;
  const Use& self = it->second;
  if (self.parked) return false;
  if (!impl_->options.park_between) return true;
  // Its iteration cannot fit beside what the others keep: it waits for one
  // of them to be parked. Or this job's memory is in the way of another's
  // iteration and its turn is over: it is parked instead.
  if (peak_chunks != 0 && Impl::starves(g, job, peak_chunks)) return false;
  return Impl::in_turn(self, now_ns) || impl_->starved_at_gate(g, job) == 0;
}

uint64_t Ledger::next_due_ns(uint64_t now_ns) const {
  uint64_t due = UINT64_MAX;
  for (const Gpu& g : impl_->gpus) {
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
  const Gpu& g = impl_->gpus[gpu];
  if (g.yielding) {
    // Still giving back: waited for, but only a second from the park on, so
    // that a job that never gives back cannot hold the gates for ever.
    const Use& victim = g.users.at(g.yield_victim);
    if (victim.parked) until = std::min(now_ns, add_sat(victim.parked_ns, kMaxGateBlockNs));
  }
  for (const auto& [id, use] : g.users) {
    if (use.turn_until_ns > now_ns) until = std::max(until, use.turn_until_ns);
  }
  return until;
}

bool Ledger::set_between_iterations(JobId job, uint32_t gpu, uint64_t next_peak_chunks) {
  Use* use = impl_->find_use(job, gpu);
  if (use == nullptr) return false;
  use->claim_peak = 0;
  use->claim_settle = 0;
  if (!use->between) impl_->gpus[gpu].between_users += 1;
  use->between = true;
  use->gate_peak = next_peak_chunks;
  return true;
}

Status Ledger::set_job_limits(JobId job, uint32_t gpu, uint64_t min_chunks, uint64_t max_chunks,
                              std::string* why) {
  Use* use = impl_->find_use(job, gpu);
  if (use == nullptr) {
    return invalid(why, "job " + std::to_string(job) + " has not opened GPU " + std::to_string(gpu));
  }
  if (min_chunks > max_chunks) {
    return invalid(why, "minimum " + std::to_string(min_chunks) + " exceeds maximum " + std::to_string(max_chunks));
  }
  const Gpu& g = impl_->gpus[gpu];
  const uint64_t mins = Impl::sum_mins(g) - use->min + min_chunks;
  if (mins > g.budget) {
    return invalid(why, "minimums would total " + std::to_string(mins) + " chunks on GPU " + std::to_string(gpu) +
                            ", above its budget " + std::to_string(g.budget));
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
  const Gpu& g = impl_->gpus[gpu];
  view.budget = g.budget;
  view.granted = g.granted;
  for (const Request& r : g.queue) view.waiting += r.chunks;
  view.grants = g.grants;
  view.returns = g.returns;
  view.deadlocks = g.deadlocks;
  view.parks = g.parks;
  return view;
}

bool Ledger::job(JobId job, uint32_t gpu, uint64_t now_ns, JobView* out) const {
  auto job_it = impl_->jobs.find(job);
  if (job_it == impl_->jobs.end() || gpu >= impl_->gpus.size()) return false;
  const Gpu& g = impl_->gpus[gpu];
  auto it = g.users.find(job);
  if (it == g.users.end()) return false;
  const Use& use = it->second;
  out->uid = job_it->second.uid;
  out->order = job_it->second.order;
  out->held = use.held;
  out->charged = use.charged;
  out->min = use.min;
  out->max = use.max;
  out->waiting = use.waiting_chunks;
  out->wait_ns = use.waited_ns;
  out->parked = use.parked;
  for (const Request& r : g.queue) {
    if (r.job == job) out->wait_ns += sub_floor(now_ns, r.enqueued_ns);
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
    const Gpu& gpu = impl_->gpus[g];
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
      for (const Request& r : gpu.queue) {
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
    for (const Request& r : gpu.queue) {
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
  for (const Gpu& gpu : impl_->gpus) {
    for (const Request& r : gpu.queue) {
      if (++ids[{r.job, r.id}] > 1) {
        return "request " + std::to_string(r.id) + " of job " + std::to_string(r.job) + " waits twice";
      }
    }
  }
  return "";
}

}  // namespace zico::sharing
