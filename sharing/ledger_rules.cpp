// The ledger's rules (ledger.h, "Rules"), applied by pump(): serving the
// queue, the banker's check, reclaims, deadlocks, turns.
#include <algorithm>
#include <cstddef>
#include <utility>

#include "ledger_impl.h"
#include "sizes.h"

namespace zico::sharing {

bool Ledger::Impl::younger(JobId a, JobId b) const {
  const uint64_t oa = jobs.at(a).order;
  const uint64_t ob = jobs.at(b).order;
  return oa != ob ? oa > ob : a > b;
}

void Ledger::Impl::biggest_holders_first(const Gpu& gpu, std::vector<JobId>* jobs_to_ask) const {
  std::sort(jobs_to_ask->begin(), jobs_to_ask->end(), [&](JobId a, JobId b) {
    const uint64_t ha = gpu.users.at(a).held;
    const uint64_t hb = gpu.users.at(b).held;
    return ha != hb ? ha > hb : younger(a, b);
  });
}

uint64_t Ledger::Impl::sum_mins(const Gpu& gpu) {
  uint64_t sum = 0;
  for (const auto& [id, use] : gpu.users) sum += use.min;
  return sum;
}

uint64_t Ledger::Impl::others_unmet(const Gpu& gpu, JobId job) {
  uint64_t sum = 0;
  for (const auto& [id, use] : gpu.users) {
    if (id != job) sum += sub_floor(use.min, use.held);
  }
  return sum;
}

uint64_t Ledger::Impl::ceiling(const Gpu& gpu, JobId job) {
  const Use& use = gpu.users.at(job);
  return std::min(use.max, sub_floor(gpu.budget, sum_mins(gpu) - use.min));
}

uint64_t Ledger::Impl::counted_peak(const Gpu& gpu, JobId job, uint64_t claim_peak) {
  const Use& use = gpu.users.at(job);
  // A UM job finishes with what it holds, or its floor, paging the rest.
  if (use.page_floor != 0) claim_peak = std::min(claim_peak, std::max(use.page_floor, use.held));
  return std::min(claim_peak, ceiling(gpu, job));
}

bool Ledger::Impl::possible(const Gpu& gpu, const Request& r) {
  return add_sat(gpu.users.at(r.job).held, r.chunks) <= ceiling(gpu, r.job);
}

bool Ledger::Impl::fits(const Gpu& gpu, const Request& r) {
  return add_sat(r.chunks, others_unmet(gpu, r.job)) <= free_of(gpu);
}

bool Ledger::Impl::safe(const Gpu& gpu, JobId job, uint64_t chunks, const Claim* starting) const {
  std::vector<Pending>& pending = pending_scratch;
  pending.clear();
  for (const auto& [id, use] : gpu.users) {
    const Claim claim = id == job && starting != nullptr ? *starting : Claim{use.claim_peak, use.claim_settle};
    if (jobs.at(id).frozen) continue;
    if (id != job && pages_here(use)) {
      // At its gate, what it pages out there comes back when asked.
      pending.push_back({0, use.held, use.held - gate_pageable(use, use.held)});
      continue;
    }
    if (claim.peak == 0) continue;  // unknown, or between iterations
    const uint64_t held = id == job ? add_sat(use.held, chunks) : use.held;
    const uint64_t peak = counted_peak(gpu, id, claim.peak);
    // What a UM job pages out at its gate is not kept there.
    uint64_t settle = std::min(claim.settle, peak);
    settle -= gate_pageable(use, settle);
    pending.push_back({sub_floor(peak, held), held, settle});
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

bool Ledger::Impl::can_finish(const Gpu& gpu, JobId job, const Use& use) {
  // Its whole claim even for a UM job, which counted_peak would floor: a job
  // that can page needs no grant to finish, so its growth waits its turn.
  return !use.between && use.claim_peak != 0 &&
         sub_floor(std::min(use.claim_peak, ceiling(gpu, job)), use.held) <= free_of(gpu);
}

uint64_t Ledger::Impl::incoming(const Gpu& gpu, JobId id, const Use& use) {
  if (use.reclaim_outstanding) return use.reclaim_asked;
  return gpu.yielding && gpu.yield_victim == id ? use.held : 0;
}

bool Ledger::Impl::waits_for_job(const Gpu& gpu, JobId job, uint64_t it_pages_out) {
  for (const Request& r : gpu.queue) {
    if (r.job == job || gpu.users.at(r.job).page_floor != 0) continue;  // a UM job runs on meanwhile
    uint64_t could_free = add_sat(free_of(gpu), it_pages_out);
    for (const auto& [id, use] : gpu.users) {
      if (id == job || id == r.job || use.claim_peak == 0) continue;
      could_free = add_sat(could_free, sub_floor(use.held, use.claim_settle));
    }
    if (add_sat(r.chunks, others_unmet(gpu, r.job)) > could_free) return true;
  }
  return false;
}

Ledger::Impl::Request Ledger::Impl::finish(Gpu& gpu, size_t index, uint64_t now_ns) {
  Request r = gpu.queue[index];
  gpu.queue.erase(gpu.queue.begin() + static_cast<std::ptrdiff_t>(index));
  Use& use = gpu.users.at(r.job);
  use.waiting_chunks -= r.chunks;
  use.waiting_requests -= 1;
  use.waited_ns += sub_floor(now_ns, r.enqueued_ns);
  return r;
}

void Ledger::Impl::grant(Gpu& gpu, uint32_t g, size_t index, uint64_t now_ns, std::vector<LedgerAction>* out) {
  const Request r = finish(gpu, index, now_ns);
  gpu.users.at(r.job).held += r.chunks;
  gpu.users.at(r.job).empty_replies = 0;
  gpu.granted += r.chunks;
  gpu.grants += r.chunks;
  out->push_back({LedgerAction::Kind::kGrant, r.job, g, r.id, r.chunks, Errc::kOk, {}});
}

void Ledger::Impl::deny(Gpu& gpu, uint32_t g, size_t index, uint64_t now_ns, std::string reason,
                 std::vector<LedgerAction>* out) {
  const Request r = finish(gpu, index, now_ns);
  out->push_back({LedgerAction::Kind::kDeny, r.job, g, r.id, r.chunks, Errc::kOutOfMemory, std::move(reason)});
}

bool Ledger::Impl::deny_impossible(Gpu& gpu, uint32_t g, uint64_t now_ns, std::vector<LedgerAction>* out) {
  bool denied = false;
  for (size_t i = 0; i < gpu.queue.size();) {
    const Request& r = gpu.queue[i];
    if (possible(gpu, r)) {
      ++i;
      continue;
    }
    Use& use = gpu.users.at(r.job);
    // A UM job's wish beyond what it may ever hold is cut to that (it pages the rest).
    if (const uint64_t most = ceiling(gpu, r.job); use.page_floor != 0 && use.held < most) {
      use.waiting_chunks -= r.chunks - (most - use.held);
      gpu.queue[i].chunks = most - use.held;
      ++i;
      continue;
    }
    const uint64_t most = ceiling(gpu, r.job);
    std::string reason = "GPU " + std::to_string(g) + ": asks for " + amount(gpu, r.chunks) + " while holding " +
                         amount_apart(gpu, use.held, most) + ", but the job can hold at most " +
                         amount_apart(gpu, most, use.held) + " (its max " +
                         (use.max == UINT64_MAX ? std::string("unlimited") : amount(gpu, use.max)) + ", the budget " +
                         amount(gpu, gpu.budget) + " less the other jobs' minimums, " +
                         amount(gpu, sum_mins(gpu) - use.min) + ")";
    deny(gpu, g, i, now_ns, std::move(reason), out);
    denied = true;
  }
  return denied;
}

bool Ledger::Impl::serve_one(Gpu& gpu, uint32_t g, uint64_t now_ns, std::vector<LedgerAction>* out) const {
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
      if (gpu.users.at(r.job).page_floor == 0) {
        blocker = i;
        break;
      }
      // A UM job pages while it waits: it blocks nobody, and what room
      // there is serves part of its request (it asks again for the rest),
      // unless an ordinary job's request waits for that room.
      const uint64_t room = sub_floor(free_of(gpu), others_unmet(gpu, r.job));
      const bool ordinary_waits = std::any_of(gpu.queue.begin(), gpu.queue.end(), [&](const Request& other) {
        return gpu.users.at(other.job).page_floor == 0;
      });
      if (room == 0 || ordinary_waits || !safe(gpu, r.job, room)) continue;
      gpu.users.at(r.job).waiting_chunks -= r.chunks - room;
      gpu.queue[i].chunks = room;
      grant(gpu, g, i, now_ns, out);
      return true;
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

bool Ledger::Impl::break_deadlock(Gpu& gpu, uint32_t g, uint64_t now_ns, std::vector<LedgerAction>* out) {
  if (gpu.queue.empty()) return false;
  JobId victim = 0;
  bool found = false;
  // Without turns, the jobs that do not wait but hold more than their
  // minimum, to ask (again) before the jam is taken for one (giving()).
  std::vector<JobId> ask_again;
  for (const auto& [id, use] : gpu.users) {
    // Memory is on its way back: no jam (yet).
    if (incoming(gpu, id, use) > 0 || use.returning > 0) return false;
    if (use.held <= use.min) continue;  // its chunks are guaranteed, not part of the jam
    if (jobs.at(id).frozen) continue;   // gives back only when it goes; not part of the jam either
    if (use.page_floor != 0) {
      // A UM job runs on while it waits (it pages), and reclaim reaches
      // what it holds above its minimum (below its floor for an ordinary
      // job that needs it): not part of the jam.
      if (use.held > use.min) return false;
      continue;
    }
    if (use.waiting_requests == 0) {
      const Giving gives = giving(use, now_ns);
      if (gives == Giving::kMay) return false;  // reclaim, a park or its iteration's end reaches it
      if (gives == Giving::kAskAgain) ask_again.push_back(id);
      continue;  // kNothing: not part of the jam, and no help out of it
    }
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
  // A holder whose answer is old, or not yet conclusive, is asked first (the
  // reclaims of rule 4 ask only for a shortfall, and a request that fits but
  // is not safe has none); its answer decides at a later pump.
  if (!ask_again.empty()) {
    for (const JobId id : ask_again) {
      Use& use = gpu.users.at(id);
      if (use.ever_asked && now_ns >= use.last_asked_ns && now_ns - use.last_asked_ns < options.reclaim_retry_ns) continue;
      (void)ask_back(g, id, use, use.held - use.min, now_ns, out);
    }
    return false;
  }
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

std::string Ledger::Impl::amount(const Gpu& gpu, uint64_t chunks) {
  if (gpu.chunk_bytes == 0 || chunks > UINT64_MAX / gpu.chunk_bytes) return std::to_string(chunks) + " chunks";
  return format_size(chunks * gpu.chunk_bytes);
}

std::string Ledger::Impl::amount_apart(const Gpu& gpu, uint64_t chunks, uint64_t other) {
  if (gpu.chunk_bytes == 0 || std::max(chunks, other) > UINT64_MAX / gpu.chunk_bytes) return amount(gpu, chunks);
  return format_size_apart(chunks * gpu.chunk_bytes, other * gpu.chunk_bytes);
}

Ledger::Impl::Giving Ledger::Impl::giving(const Use& use, uint64_t now_ns) const {
  // With turns, a job is parked at a gate for the waiters (rule 6).
  if (options.park_between) return Giving::kMay;
  // Its claim says it settles lower at its iteration's end: wait for that.
  if (use.claim_peak != 0 && kept_between(use) < use.held) return Giving::kMay;
  // Asked within the last retry interval, it gave nothing: twice running
  // where nothing says it keeps what it holds (a job in its first iteration
  // frees its memory at the end).
  const bool fresh = use.empty_replies > 0 && now_ns >= use.last_asked_ns &&
                     now_ns - use.last_asked_ns < options.reclaim_retry_ns;
  const bool known_to_keep = use.claim_peak != 0 || use.between;
  if (fresh && (known_to_keep || use.empty_replies >= 2)) return Giving::kNothing;
  return Giving::kAskAgain;
}

uint64_t Ledger::Impl::kept_between(const Use& use) {
  const uint64_t kept = use.between ? use.held : std::min(use.held, use.claim_peak != 0 ? use.claim_settle : use.last_settle);
  return kept - gate_pageable(use, kept);
}

uint64_t Ledger::Impl::gate_pageable(const Use& use, uint64_t kept) {
  // Down to its minimum, at most what it still pages at this gate.
  return std::min(sub_floor(kept, use.min), sub_floor(use.gate_paging, use.paged_at_gate));
}

bool Ledger::Impl::starves(const Gpu& gpu, JobId job, uint64_t peak_chunks) {
  uint64_t kept = 0;
  for (const auto& [id, use] : gpu.users) {
    if (id != job) kept = add_sat(kept, kept_between(use));
  }
  return add_sat(counted_peak(gpu, job, peak_chunks), kept) > gpu.budget;
}

JobId Ledger::Impl::starved_at_gate(const Gpu& gpu, JobId except) const {
  for (const auto& [id, use] : gpu.users) {
    if (id == except || !use.between || use.parked || use.gate_peak == 0 || jobs.at(id).frozen) continue;
    if (starves(gpu, id, use.gate_peak)) return id;
  }
  return 0;
}

void Ledger::Impl::park(Gpu& gpu, uint32_t g, uint64_t now_ns, std::vector<LedgerAction>* out) {
  if (!options.park_between || gpu.yielding || gpu.between_users == 0) return;
  // Starving is weighed once: a second starved job matters only when the
  // candidate is the first one itself.
  const JobId starved = starved_at_gate(gpu);
  if (starved == 0 && gpu.queue.empty()) return;
  JobId victim = 0;
  uint64_t most = 0;
  for (const auto& [id, use] : gpu.users) {
    if (!use.between || use.parked || use.waiting_requests > 0 || use.reclaim_outstanding) continue;
    if (use.page_floor != 0) continue;  // a UM job pages instead
    if (use.held <= use.min || use.held - use.min <= most || jobs.at(id).frozen) continue;
    // Starving counts what a job pages out at its gate as gone already; a
    // request waiting for its memory is in its way only if that is not enough.
    const bool starves_another = starved != 0 && (starved != id || starved_at_gate(gpu, id) != 0);
    const bool in_the_way = waits_for_job(gpu, id, gate_pageable(use, use.held));
    if (!(starves_another && !in_turn(use, now_ns)) && !in_the_way) continue;
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

void Ledger::Impl::resume(Gpu& gpu, uint32_t g, uint64_t now_ns, std::vector<LedgerAction>* out) {
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

const Ledger::Impl::Request* Ledger::Impl::reclaim_head(const Gpu& gpu) {
  const Request* head = gpu.queue.empty() ? nullptr : &gpu.queue.front();
  for (const Request& r : gpu.queue) {
    if (gpu.users.at(r.job).page_floor == 0) return &r;
  }
  return head;
}

uint64_t Ledger::Impl::reclaim_shortfall(const Gpu& gpu, const Request* head) {
  uint64_t needed = gpu.granted;
  if (head != nullptr) needed = add_sat(needed, add_sat(head->chunks, others_unmet(gpu, head->job)));
  uint64_t shortfall = sub_floor(needed, gpu.budget);
  // Chunks already on their way back are not asked for twice.
  for (const auto& [id, use] : gpu.users) shortfall = sub_floor(shortfall, incoming(gpu, id, use));
  return shortfall;
}

bool Ledger::Impl::pages_here(const Use& use) {
  // Not while it waits for memory itself: it is not resting there.
  return use.between && use.waiting_requests == 0 && gate_pageable(use, use.held) != 0;
}

void Ledger::Impl::reclaim(Gpu& gpu, uint32_t g, uint64_t now_ns, std::vector<LedgerAction>* out) {
  // Enough to bring granted to the budget and, if a request waits, to fit
  // the head including the room it must leave for the others' minimums. A
  // UM job's request blocks nobody (serve_one): the head is the first
  // request of an ordinary job, if one waits.
  const Request* head = reclaim_head(gpu);
  uint64_t shortfall = reclaim_shortfall(gpu, head);
  if (shortfall == 0) return;

  // A UM job gives back by paging out (not idle memory): it is asked while
  // it waits too (it runs on), down to its floor; for another UM job's wish
  // only what it holds above an equal share of what ordinary jobs leave
  // (more would only trade one job's paging for another's), and never for
  // its own. Above the budget (a cut), or for an ordinary job's request
  // (which cannot page), UM jobs are then asked below their floors too,
  // down to their minimum, once what is above the floors is on its way:
  // the budget and ordinary jobs come first, a UM job runs on however
  // little it holds (its kernels fault what they need).
  const bool over = gpu.granted > gpu.budget;
  const bool for_um_wish = !over && head != nullptr && gpu.users.at(head->job).page_floor != 0;
  uint64_t um_share = 0;
  if (for_um_wish) {
    uint64_t ordinary = 0;
    uint64_t um_jobs = 0;
    for (const auto& [id, use] : gpu.users) {
      if (use.page_floor == 0) {
        ordinary = add_sat(ordinary, use.held);
      } else {
        ++um_jobs;
      }
    }
    um_share = sub_floor(gpu.budget, ordinary) / um_jobs;
  }
  const bool for_ordinary = head != nullptr && gpu.users.at(head->job).page_floor == 0;
  for (const bool below_floors : {false, true}) {
    if (below_floors && (!(over || for_ordinary) || shortfall == 0)) break;
    const auto keeps = [below_floors, um_share](const Use& use) {
      if (use.page_floor == 0) return use.min;
      return std::max({use.min, below_floors ? uint64_t{0} : use.page_floor, um_share});
    };
    std::vector<JobId> candidates;
    for (const auto& [id, use] : gpu.users) {
      const bool pages = use.page_floor != 0;
      if (below_floors && !pages) continue;
      if (pages && !over && head != nullptr && head->job == id) continue;
      if ((use.waiting_requests > 0 && !pages) || use.held <= keeps(use) || incoming(gpu, id, use) > 0) continue;
      if (jobs.at(id).frozen || pages_here(use)) continue;  // page_out_gates asks it
      if (use.ever_asked && (now_ns < use.last_asked_ns || now_ns - use.last_asked_ns < options.reclaim_retry_ns)) {
        continue;
      }
      candidates.push_back(id);
    }
    // Biggest holders first: they most likely have idle chunks, and fewer
    // jobs are disturbed.
    biggest_holders_first(gpu, &candidates);
    for (JobId id : candidates) {
      if (shortfall == 0) break;
      Use& use = gpu.users.at(id);
      shortfall -= ask_back(g, id, use, std::min(use.held - keeps(use), shortfall), now_ns, out);
    }
  }
}

void Ledger::Impl::pump_gpu(uint32_t g, uint64_t now_ns, std::vector<LedgerAction>* out) {
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
  page_out_gates(gpu, g, now_ns, out);
}

uint64_t Ledger::Impl::ask_back(uint32_t g, JobId id, Use& use, uint64_t chunks, uint64_t now_ns,
                                std::vector<LedgerAction>* out) {
  use.reclaim_outstanding = true;
  use.reclaim_asked = chunks;
  use.ever_asked = true;
  use.last_asked_ns = now_ns;
  out->push_back({LedgerAction::Kind::kReclaim, id, g, 0, chunks, Errc::kOk, {}});
  return chunks;
}

void Ledger::Impl::page_out_gates(Gpu& gpu, uint32_t g, uint64_t now_ns, std::vector<LedgerAction>* out) {
  // What the jobs in mid-iteration will still take on their way to their
  // claims' peaks, beyond the free budget and what is already coming back.
  uint64_t growth = 0;
  for (const auto& [id, use] : gpu.users) {
    if (use.between || use.claim_peak == 0 || jobs.at(id).frozen) continue;
    growth = add_sat(growth, sub_floor(counted_peak(gpu, id, use.claim_peak), use.held));
  }
  uint64_t shortfall = sub_floor(growth, free_of(gpu));
  for (const auto& [id, use] : gpu.users) shortfall = sub_floor(shortfall, incoming(gpu, id, use));
  // And what a waiting request lacks that the other jobs were not asked for.
  shortfall = std::max(shortfall, reclaim_shortfall(gpu, reclaim_head(gpu)));
  if (shortfall == 0) return;
  // UM jobs at their gates hold memory no kernel of theirs touches until
  // they start: it is paged out now, before the others' peaks need it, and
  // back in when they start (a partial park). Biggest holders first.
  std::vector<JobId> candidates;
  for (const auto& [id, use] : gpu.users) {
    if (!pages_here(use) || incoming(gpu, id, use) > 0 || jobs.at(id).frozen) continue;
    candidates.push_back(id);
  }
  biggest_holders_first(gpu, &candidates);
  for (JobId id : candidates) {
    if (shortfall == 0) break;
    Use& use = gpu.users.at(id);
    const uint64_t ask = std::min(gate_pageable(use, use.held), shortfall);
    use.paged_at_gate += ask;
    shortfall -= ask_back(g, id, use, ask, now_ns, out);
  }
}

Ledger::Impl::Use* Ledger::Impl::find_use(JobId job, uint32_t g) {
  if (g >= gpus.size()) return nullptr;
  auto it = gpus[g].users.find(job);
  return it == gpus[g].users.end() ? nullptr : &it->second;
}

}  // namespace zico::sharing
