// The ledger's internals (not an interface), shared by its two files:
//   ledger.cpp        the books: jobs, GPUs, requests, returns, limits, views,
//                     and the consistency check
//   ledger_rules.cpp  the rules of ledger.h, applied by pump()
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ledger.h"

namespace zico::sharing {

struct Ledger::Impl {
  // held + chunks may overflow when a request asks for an absurd count; such a
  // request must read as "too big", never wrap around to "fits".
  static uint64_t add_sat(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }
  static uint64_t sub_floor(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }
  static uint64_t mul_sat(uint64_t a, uint64_t b) { return b != 0 && a > UINT64_MAX / b ? UINT64_MAX : a * b; }

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
    uint64_t returning = 0;  // of charged: given back, not yet looked at (set_returning)
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
    // Its reclaim replies in a row that gave nothing back, since it was last
    // granted memory (giving() trusts the last one for a retry interval).
    uint32_t empty_replies = 0;
    // Turns (ledger.h): parked from kPark to kResume, then its turn.
    uint64_t gate_peak = 0;  // between: the peak of the iteration it waits to start (0: unknown)
    bool parked = false;
    uint64_t parked_ns = 0;           // when it was told kPark
    uint64_t swap_ns = 0;             // how long it took to give everything back
    uint64_t turn_ns = 0;             // how long it stays parked, and how long its turn lasts
    uint64_t resume_ns = UINT64_MAX;  // kResume is due (UINT64_MAX: still giving back)
    uint64_t turn_until_ns = 0;
    uint64_t last_settle = 0;  // its latest claim's (kept_between)
    // A Unified Memory job (set_pageable): it can run holding this much.
    uint64_t page_floor = 0;
    // set_gate_paging: the most it pages out at its gate, and what it was
    // asked for at this one (reset when it claims or comes to a gate).
    uint64_t gate_paging = 0;
    uint64_t paged_at_gate = 0;
  };

  struct Gpu {
    uint64_t budget = 0;
    uint64_t chunk_bytes = 0;  // for what users read (amount()); 0: unknown
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

  LedgerOptions options;
  std::vector<Gpu> gpus;
  std::map<JobId, Job> jobs;

  // a is younger than b: a later arrival, job id as the tie-break so the
  // choice never depends on map iteration details.
  bool younger(JobId a, JobId b) const;

  static uint64_t free_of(const Gpu& gpu) { return sub_floor(gpu.budget, gpu.granted); }

  static uint64_t sum_mins(const Gpu& gpu);

  // What the other jobs still lack to reach their guaranteed minimums.
  static uint64_t others_unmet(const Gpu& gpu, JobId job);

  // The most `job` can ever hold: its max, and what the budget leaves once
  // every other job has its minimum.
  static uint64_t ceiling(const Gpu& gpu, JobId job);

  // A claim's peak as the safety check counts it: no more than the job can
  // ever hold. A job whose iteration needs more than that (it pages beyond
  // the budget, or will be refused) would otherwise never be able to finish
  // in the check, and no grant to anyone, itself included, would be safe.
  static uint64_t counted_peak(const Gpu& gpu, JobId job, uint64_t claim_peak);

  static bool possible(const Gpu& gpu, const Request& r);

  // Granting keeps granted <= budget (free is 0 above it) and leaves room for
  // the others' minimums. The max is covered by possible(), checked first.
  static bool fits(const Gpu& gpu, const Request& r);

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

  bool safe(const Gpu& gpu, JobId job, uint64_t chunks, const Claim* starting = nullptr) const;

  // The job's claim says its whole remaining need fits in the free budget:
  // it can finish its iteration, and then gives back.
  static bool can_finish(const Gpu& gpu, JobId job, const Use& use);

  // Chunks on their way back to the pool, not to be counted on twice: what
  // an outstanding reclaim asked of the job, or all it holds when it is the
  // victim of a yield or a park (at most one per GPU at a time). The two
  // never overlap: neither a deadlock nor a park picks a job with a reclaim
  // outstanding, and a victim is not asked to reclaim.
  static uint64_t incoming(const Gpu& gpu, JobId id, const Use& use);

  // Is a request queued that cannot be served unless `job` gives back: it
  // would not fit even if every other job but the asker came down to its
  // claim's settle (jobs without a claim counted at what they hold)?
  static bool waits_for_job(const Gpu& gpu, JobId job, uint64_t it_pages_out = 0);

  // Takes queue[index] out of the queue and books its wait.
  static Request finish(Gpu& gpu, size_t index, uint64_t now_ns);

  static void grant(Gpu& gpu, uint32_t g, size_t index, uint64_t now_ns, std::vector<LedgerAction>* out);

  static void deny(Gpu& gpu, uint32_t g, size_t index, uint64_t now_ns, std::string reason,
                   std::vector<LedgerAction>* out);

  // Denies every queued request that no amount of waiting can serve. Returns
  // whether it denied any.
  static bool deny_impossible(Gpu& gpu, uint32_t g, uint64_t now_ns, std::vector<LedgerAction>* out);

  // One grant or denial at a time, re-evaluated from scratch: every grant
  // changes free, the grantee's held and the others' unmet minimums.
  bool serve_one(Gpu& gpu, uint32_t g, uint64_t now_ns, std::vector<LedgerAction>* out) const;

  // The head is blocked (or granted > budget). Jobs that neither wait nor sit
  // at their minimum could give chunks back; when none could, and none is
  // already giving back, the waiters hold each other up and only the policy
  // can break it.
  bool break_deadlock(Gpu& gpu, uint32_t g, uint64_t now_ns, std::vector<LedgerAction>* out);

  // Resumed from a park, its turn has not ended: it is not parked again for
  // a job starved beside it.
  static bool in_turn(const Use& use, uint64_t now_ns) { return !use.parked && now_ns < use.turn_until_ns; }

  // What a job keeps between its iterations: what it holds at its gate, its
  // claim's settle in mid-iteration (its last claim's while it has none).
  static uint64_t kept_between(const Use& use);
  // What a job that does not wait may free for those that do (rule 5).
  enum class Giving : uint8_t {
    kMay,       // a reclaim, a park or its iteration's end will reach it: no jam
    kNothing,   // asked lately, it gave nothing, and keeps all it holds
    kAskAgain,  // its answer is old or not yet conclusive: ask it first
  };
  [[nodiscard]] Giving giving(const Use& use, uint64_t now_ns) const;
  // `chunks` as users read them: a size where the chunk is known.
  static std::string amount(const Gpu& gpu, uint64_t chunks);
  // amount(), with the decimals that tell it apart from `other` chunks.
  static std::string amount_apart(const Gpu& gpu, uint64_t chunks, uint64_t other);
  // At its gate with something left to page out there (set_gate_paging).
  static bool pages_here(const Use& use);
  // The request reclaims serve (the first ordinary one, else the first),
  // and what it and the budget lack beyond what is on its way back.
  static const Request* reclaim_head(const Gpu& gpu);
  static uint64_t reclaim_shortfall(const Gpu& gpu, const Request* head);
  void biggest_holders_first(const Gpu& gpu, std::vector<JobId>* jobs_to_ask) const;
  static uint64_t gate_pageable(const Use& use, uint64_t kept);

  // An iteration of `job` peaking at peak_chunks cannot fit beside what the
  // other jobs keep between theirs: it can run only once one of them is out.
  static bool starves(const Gpu& gpu, JobId job, uint64_t peak_chunks);

  // A job other than `except` that waits at its gate for such an iteration
  // (the first in id order; 0 if none).
  JobId starved_at_gate(const Gpu& gpu, JobId except = 0) const;

  // Parks the job between iterations whose memory is in the way, the one
  // holding the most: a request waits for it (waits_for_job), or a job at its
  // gate starves beside it and its turn is over.
  void park(Gpu& gpu, uint32_t g, uint64_t now_ns, std::vector<LedgerAction>* out);

  // A parked job that has given everything back resumes when its time is up,
  // or at once when no other job holds more than its minimum or waits (none
  // is in the way any more). Its turn starts: long enough to bring its
  // memory back, run as long as it was parked and go out again.
  static void resume(Gpu& gpu, uint32_t g, uint64_t now_ns, std::vector<LedgerAction>* out);

  void reclaim(Gpu& gpu, uint32_t g, uint64_t now_ns, std::vector<LedgerAction>* out);
  // kReclaim of `chunks` (counted as on its way back until it answers); returns chunks.
  static uint64_t ask_back(uint32_t g, JobId id, Use& use, uint64_t chunks, uint64_t now_ns,
                           std::vector<LedgerAction>* out);
  void page_out_gates(Gpu& gpu, uint32_t g, uint64_t now_ns, std::vector<LedgerAction>* out);

  void pump_gpu(uint32_t g, uint64_t now_ns, std::vector<LedgerAction>* out);

  Use* find_use(JobId job, uint32_t g);
};

}  // namespace zico::sharing
