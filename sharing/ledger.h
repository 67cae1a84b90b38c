// Ledger: who holds how many chunks of each GPU, who waits, and what the
// daemon should do next. Pure policy: no sockets, no chunks, no clock (time
// is passed in), so the daemon, the simulator and the tests run the same code.
//
// Counting is in chunks (the daemon's chunk size per GPU). Per GPU there is a
// node budget; per (job, GPU) a guaranteed minimum and a maximum.
//
// Rules, applied by pump(), as one design: a budget that is never exceeded,
// a queue served in order with three exceptions, memory that is asked back
// and counted once on its way, and two ways out when jobs hold each other up
// (a deadlock's yield in mid-iteration, or, with turns, a park between
// iterations before it comes to that).
//
// 1. Budget. No grant makes granted exceed the budget. Granted can be above
//    it only after a budget shrink or a reconciliation (a job that
//    reconnects holding chunks); then nothing is granted until it is below,
//    and reclaims bring it down. A grant also leaves enough free budget for
//    every other job to reach its guaranteed minimum (free - chunks >= sum
//    over the others of max(0, min - held)). A request that can never be
//    served is denied (kOutOfMemory) at once: held + chunks > min(max,
//    budget - the other jobs' minimums).
//
// 2. Queue order. Waiting requests of a GPU are served first come, first
//    served: a request that does not fit blocks the ones behind it (so a
//    large request is not starved by small ones). Three exceptions, each a
//    job that will give memory back soon being let through:
//    a. Minimum: a request within the job's guaranteed minimum (held +
//       chunks <= min) is served ahead of the queue whenever the free budget
//       covers it.
//    b. Patience: while the head's job holds no more than its minimum (it
//       arrived, or it yielded and asks for everything again), requests of
//       jobs holding more than theirs that fit go ahead of it, for at most
//       head_patience_ns after the head was queued. Those jobs are in the
//       middle of an iteration and give memory back when it ends; holding
//       them up would deadlock them against the head, and the yield that
//       follows hands everything to the other, whose next request deadlocks
//       again: the two would trade all their memory back and forth. After
//       the patience runs out the head blocks the queue again, so it is
//       never starved.
//    c. Can finish: a request of a job whose claim says its whole remaining
//       need fits in the free budget goes ahead of a head that cannot be
//       served (it finishes its iteration, then gives back).
//
// 3. Claims: deadlock avoidance (the banker's algorithm) for jobs that know
//    their iteration. A claim says the job will hold at most `peak` chunks
//    before its current iteration ends and `settle` after it (set_claim); a
//    job waiting at its iteration gate has none (it needs nothing more and
//    gives nothing back until it starts). A grant beyond the minimums must
//    leave the GPU safe: the jobs with claims could still all finish their
//    iterations one after another with the free budget, each needing peak -
//    held more and then giving back held - settle. Jobs without a claim are
//    left out (nothing is known of them). A peak above what the job can ever
//    hold (its max, the budget less the others' minimums: a job that pages
//    beyond it) counts as that much; otherwise the job could never finish
//    and nothing would ever be safe. A Unified Memory job (set_pageable)
//    counts at most what it holds or its floor: it pages the rest. A
//    request that fits but is not safe waits without blocking the queue. While every claim is true no
//    deadlock arises among the jobs that have one; a job that outgrows its
//    claim, or jobs without claims, can still deadlock, and rule 5 breaks it.
//
// 4. Asking back. Memory on its way back is counted once: what an unanswered
//    reclaim asked of a job, or all that the victim of a yield or a park
//    holds (one victim per GPU at a time). When a request still waits after
//    serving, or granted is above the budget, jobs that are not waiting and
//    hold more than their minimum are asked to give back idle chunks
//    (kReclaim), biggest holders first, at most the shortfall in all, each
//    job at most once per reclaim_retry_ns (from the last ask or reply) and
//    never while memory is on its way back from it. No job is asked below
//    its minimum, and a frozen job is not asked at all. The shortfall is what the head lacks (its chunks plus the
//    others' unmet minimums, less the free budget) or, above the budget, the
//    excess even with no waiter, less what is on its way back.
//    A Unified Memory job (set_pageable) gives back by paging out: its
//    request waits without blocking the queue (it runs on meanwhile), is
//    served in its turn, or in part from whatever room there is while no
//    ordinary job's request waits; it never keeps an ordinary job at its
//    gate for a turn. Once it has paged out for a reclaim its requests go
//    to the back of the queue (what it gave must not come straight back). It is asked even while it waits, down to max(minimum,
//    floor); for another UM job's request only what it holds above an
//    equal share of what ordinary jobs leave (more would trade one job's
//    paging for another's), never for its own. The head is the first
//    ordinary job's request, if one waits. For an ordinary job's request,
//    and above the budget, UM jobs are asked below their floors too, down
//    to their minimum, once what is above the floors is on its way.
//    A UM job that pages at its gate (set_gate_paging) is asked ahead of
//    need: when what the jobs in mid-iteration will still take on the way to
//    their claims' peaks exceeds the free budget (less what is on its way
//    back), or a request waits, or granted is above the budget, jobs
//    resting at their gates (not waiting for memory themselves) are asked for
//    the difference at once, biggest holders first, each at most what it
//    pages at one gate, so that it is out before those peaks come; the
//    reclaims above leave such a job to this rule, and rule 3's banker's
//    check counts what it still pages there as coming back. It pages it
//    back in when it starts.
//
// 5. Deadlock: a request still waits after serving (its head does not fit,
//    or is not safe), nothing is on its way back on the GPU (a reclaim's
//    answer, a yield, returns the daemon has yet to look at), and every job
//    holding more than its minimum of the GPU is waiting on it, or, without
//    turns (rule 6), can give nothing back: asked within the last
//    reclaim_retry_ns, it gave nothing (twice running if it has no claim: a
//    job in its first iteration frees its memory at the end), and its claim,
//    if any, does not settle below what it holds. A job whose answer is older
//    is asked again first (the reclaims of rule 4 follow a shortfall, which
//    a request that fits but is not safe does not have). With turns such a
//    job is left to rule 6's parks. (Chunks within a minimum can never
//    be reclaimed, so an idle job sitting at its minimum must not hide a
//    deadlock among the others, nor may an idle holder whose chunks are all
//    in use; a frozen job gives back only when it goes and is left out.) Only waiters holding more than
//    their minimum can be victims: a victim at its minimum would get its
//    chunks straight back through exception 2a. A UM job is never a victim
//    (it does not wait: it pages); reclaim reaches what it holds above its
//    minimum. Policy kYield: of those, the
//    one holding the most chunks (ties: the youngest) gets kYield, once per
//    request it has waiting on the GPU; its requests leave the queue and it
//    must return everything and ask again (at the back). Policy kFail: the
//    youngest of them has its waiting requests on the GPU denied with
//    kOutOfMemory.
//
// 6. Turns (LedgerOptions::park_between): jobs that cannot run side by side
//    take turns, swapped out between iterations, where they hold least and
//    interrupt nothing. A job at its gate (set_between_iterations with the
//    peak of the iteration it waits to start) *starves* when that peak and
//    what the other jobs keep between their iterations (held at a gate, a
//    claim's settle in mid-iteration, less what a UM job pages out at its
//    gate; rule 3's banker's check counts settles the same way) exceed the
//    budget: it cannot start
//    until one of them is out, and may_start() says no. The job between
//    iterations holding the most that is in its way gets kPark: it gives
//    back everything and waits at its gate, refused by may_start(), until
//    kResume; then it asks for its memory again and has its turn. Also
//    parked, rather than started, is a job at its gate that a waiting
//    request needs memory from, unless what it pages out there would serve
//    that request (the circle may_start() would otherwise
//    break by starting it, a deadlock and a yield in mid-iteration later). A
//    parked job stays out turn_swap_multiple times as long as it took to
//    give back (at most max_turn_ns), so that the swap out and in costs the
//    others a small share of their turn, or until no other job holds or
//    waits for memory. Its turn, after kResume, lasts as long plus twice
//    that swap (back in, and out again at its end): until then it is not
//    parked for a starved job, and it may start beside one. Without turns
//    (zico-umd without --turns), such jobs meet in mid-iteration and rule 5
//    decides, a yield of everything a job holds at its peak, every iteration.
//    A Unified Memory job (set_pageable) takes no turns: it pages instead,
//    so it is never parked and never waits at its gate for one.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "job_id.h"
#include "status.h"

namespace zico::sharing {

enum class DeadlockPolicy : uint8_t { kYield, kFail };

struct LedgerAction {
  enum class Kind : uint8_t { kGrant, kDeny, kReclaim, kYield, kPark, kResume };
  Kind kind = Kind::kGrant;
  JobId job = 0;
  uint32_t gpu = 0;
  uint64_t request_id = 0;  // kGrant, kDeny, kYield
  uint64_t chunks = 0;      // kGrant: the whole request; kReclaim: chunks asked back;
                            // kYield, kPark: all the job holds on the GPU; kDeny: the request;
                            // kResume: 0 (the job asks for what it needs)
  Errc errc = Errc::kOk;    // kDeny
  std::string reason;       // kDeny: one line for the job's error message
};

struct LedgerOptions {
  DeadlockPolicy deadlock_policy = DeadlockPolicy::kYield;
  uint64_t reclaim_retry_ns = 100'000'000;
  uint64_t head_patience_ns = 1'000'000'000;
  // Turns (the rules above). Each change of turn leaves the GPU idle about
  // one swap long (one job going out, the other coming in): turns of fifty
  // swaps keep that near 2 % of the time (ten swaps cost up to 14 % against
  // sequential in the simulator). At most ten seconds, so no job waits long.
  bool park_between = true;
  uint64_t turn_swap_multiple = 50;
  uint64_t max_turn_ns = 10'000'000'000;
};

class Ledger {
 public:
  explicit Ledger(LedgerOptions options = {});

  // GPUs are numbered 0, 1, ... in the order added. `chunk_bytes`, if
  // known, only makes the reasons given to users speak bytes, not chunks.
  uint32_t add_gpu(uint64_t budget_chunks, uint64_t chunk_bytes = 0);
  [[nodiscard]] size_t gpu_count() const;

  // `order` ranks jobs by arrival (higher = younger). False if `job` exists.
  [[nodiscard]] bool add_job(JobId job, uint32_t uid, uint64_t order);
  // Everything the job held is free again and its requests vanish.
  void remove_job(JobId job);
  [[nodiscard]] bool has_job(JobId job) const;
  // A frozen job cannot answer (the daemon lost its connection while its
  // process lives, or it has not reconnected after a restart): it is never
  // asked to reclaim, and it does not count when deadlocks are looked for
  // (its chunks come back only when it goes).
  void set_frozen(JobId job, bool frozen);
  // The job cannot give back what a yield or a park asked of it (its
  // suspension failed): the next yield may go ahead, and it is not parked.
  void release_victim(JobId job);

  // The job starts using `gpu` (min 0, max unlimited), already holding `held`
  // chunks (a job that reconnects after a daemon restart; 0 otherwise).
  // Errors (kInvalidArgument, *why set): unknown job or GPU, already open.
  [[nodiscard]] Status open(JobId job, uint32_t gpu, uint64_t held, std::string* why);

  // Queues a request (chunks >= 1). Errors: unknown job, GPU not opened,
  // request_id 0 or already waiting.
  [[nodiscard]] Status request(JobId job, uint32_t gpu, uint64_t request_id, uint64_t chunks, uint64_t now_ns,
                               std::string* why);
  // True if the request was still waiting and is now withdrawn (the caller
  // tells the job); false if it is not waiting (granted or denied already).
  bool cancel(JobId job, uint64_t request_id, uint64_t now_ns);
  // The job gave back `chunks` (fenced). reclaim_reply clears its outstanding
  // reclaim. Error if it holds fewer than `chunks` or the GPU is not open.
  [[nodiscard]] Status returned(JobId job, uint32_t gpu, uint64_t chunks, bool reclaim_reply, uint64_t now_ns,
                                std::string* why);

  // Memory the job holds beyond what it was lent (a process that kept chunks
  // it gave back, as the daemon measured): part of the GPU's granted, so the
  // books stay true of the GPU, until uncharge(); never asked back (it is
  // not the job's to give), and not what a yield or a park waits for.
  // Errors: the job has not opened the GPU, or (uncharge) was charged fewer
  // than `chunks`.
  [[nodiscard]] Status charge(JobId job, uint32_t gpu, uint64_t chunks, std::string* why);
  [[nodiscard]] Status uncharge(JobId job, uint32_t gpu, uint64_t chunks, std::string* why);
  // Of what is charged to the job, the chunks it gave back that the daemon
  // has not yet looked at (does its process still map them?): memory on its
  // way back, so no deadlock is broken while there is some (the look frees
  // it, or charges it for good). False if the job has not opened the GPU.
  bool set_returning(JobId job, uint32_t gpu, uint64_t chunks);
  // Error (kInvalidArgument) if below the sum of the jobs' minimums.
  [[nodiscard]] Status set_budget(uint32_t gpu, uint64_t chunks, std::string* why);
  // The job's claim on the GPU (the rule above): at most peak_chunks held
  // before its current iteration ends, settle_chunks after it. peak_chunks 0
  // withdraws the claim (unknown). settle is taken as at most peak. False if
  // the job has not opened the GPU.
  bool set_claim(JobId job, uint32_t gpu, uint64_t peak_chunks, uint64_t settle_chunks);
  // A Unified Memory job: it can run holding floor_chunks, paging the rest,
  // so rules 3 and 6 count its claim's peak as no more than what it holds
  // or that floor, whichever is larger (it can finish its iteration with
  // that), and it takes no turns (rule 6). 0: an ordinary job again. False
  // if the job has not opened the GPU.
  bool set_pageable(JobId job, uint32_t gpu, uint64_t floor_chunks);
  // A Unified Memory job that pages out up to `chunks` of what it holds
  // while it waits at its gate, where no kernel of its runs (0: nothing):
  // that much of what it keeps between iterations is not in another job's
  // way, and it is asked for it in advance when the claims of the jobs in
  // mid-iteration need it. It pages it back in when it starts.
  bool set_gate_paging(JobId job, uint32_t gpu, uint64_t chunks);

  // The job waits at its iteration gate and needs nothing more than it
  // holds: its claim goes, and it is not in mid-iteration for may_start().
  // next_peak_chunks: the peak of the iteration it waits to start, once
  // may_start() said no (0: not known), for turns. The next set_claim() (its
  // iteration started, or it asks for chunks) ends this. False if the job
  // has not opened the GPU.
  bool set_between_iterations(JobId job, uint32_t gpu, uint64_t next_peak_chunks = 0);
  // May the job, at its iteration gate, start an iteration that claims
  // peak_chunks and settle_chunks (peak 0: unknown)? Yes when no other job
  // is in mid-iteration (waiting for chunks, without a claim, or holding less
  // than its claim's peak): nothing would change by waiting. Otherwise no
  // for a job without a claim, and no against a job in mid-iteration
  // without one (they would have nothing to protect them from each other:
  // jobs still learning run their iterations one at a time), else yes if
  // the GPU stays safe with this claim, so that no job in mid-iteration is
  // left unable to finish. But yes, whatever the claims, when a waiting
  // request could not be served even once every other job came down to its
  // settle: it waits for this job's memory, and holding the job at its gate
  // would only close the circle (a budget below one job's peak plus the
  // others' rest); the ledger's rules then decide who goes on. A job told
  // no waits at its gate and asks again after the others give back (a
  // caller bounds that wait: a claim can be wrong). Also yes for an unknown
  // job or GPU. A UM job in mid-iteration is never in danger (it finishes
  // with what it holds), and its waiting request needs nobody's memory: it
  // counts for neither. With turns (above), no for a parked job, for a job that
  // starves beside the others' rest, and, outside its turn, for a job in the
  // way of one that starves; and a waiting request that needs this job's
  // memory parks it rather than lets it start.
  [[nodiscard]] bool may_start(JobId job, uint32_t gpu, uint64_t peak_chunks, uint64_t settle_chunks,
                               uint64_t now_ns) const;
  // The turn rules alone (above): no for a parked job, for a job whose
  // iteration (peak_chunks, 0: unknown) starves beside the others' rest, and,
  // outside its turn, for a job in the way of one that starves; yes
  // otherwise, and always without turns. may_start() asks this first; a
  // gate that does not weigh claims (zico-umd without its start guard) asks
  // only this.
  [[nodiscard]] bool turns_allow_start(JobId job, uint32_t gpu, uint64_t peak_chunks, uint64_t now_ns) const;
  // When pump() next has something to do without any change (a parked job's
  // time is up, a turn ends); UINT64_MAX if never.
  [[nodiscard]] uint64_t next_due_ns(uint64_t now_ns) const;
  // Until when a job refused at its gate waits for turns rather than for a
  // claim: the latest end of a turn in progress, now_ns while a parked job
  // is still giving back (for at most kMaxGateBlockNs from its park), 0 if
  // neither. The caller's kMaxGateBlockNs bound
  // counts from there (a turn is a promise the ledger keeps; the bound is for
  // claims, which can be wrong).
  [[nodiscard]] uint64_t turn_wait_until_ns(uint32_t gpu, uint64_t now_ns) const;
  // The longest a job waits at its gate because may_start() says no (the
  // daemon's IterationGates and the simulator both bound it so): a claim can
  // be wrong, too low for the others or too high for this job, and a wait
  // for it could then last forever. Past it the job starts anyway and the
  // hard budget and the deadlock rule govern. The head's patience, for the
  // same reason: past a second, waiting is likely waiting for a wrong claim.
  static constexpr uint64_t kMaxGateBlockNs = 1'000'000'000;

  // Error if min > max, or the minimums would exceed the budget, or the job
  // has not opened the GPU.
  [[nodiscard]] Status set_job_limits(JobId job, uint32_t gpu, uint64_t min_chunks, uint64_t max_chunks,
                                      std::string* why);

  // Decides what follows from the current state (rules above). Call after
  // every change and periodically while requests wait (reclaim retries).
  [[nodiscard]] std::vector<LedgerAction> pump(uint64_t now_ns);

  struct GpuView {
    uint64_t budget = 0;
    uint64_t granted = 0;
    uint64_t waiting = 0;    // chunks requested and not granted
    uint64_t grants = 0;     // chunks granted, ever
    uint64_t returns = 0;    // chunks given back, ever
    uint64_t deadlocks = 0;  // deadlocks broken, ever
    uint64_t parks = 0;      // jobs parked, ever
  };
  struct JobView {
    uint32_t uid = 0;
    uint64_t order = 0;
    uint64_t held = 0;     // lent (or held since it reconnected)
    uint64_t charged = 0;  // held beyond that (charge())
    uint64_t min = 0;
    uint64_t max = UINT64_MAX;
    uint64_t waiting = 0;  // chunks in its waiting requests
    uint64_t wait_ns = 0;  // total time its requests waited, the current wait included
    bool parked = false;   // turns: from kPark to kResume
  };
  [[nodiscard]] GpuView gpu(uint32_t gpu) const;
  // False if the job does not exist or has not opened the GPU.
  [[nodiscard]] bool job(JobId job, uint32_t gpu, uint64_t now_ns, JobView* out) const;
  [[nodiscard]] std::vector<JobId> jobs() const;

  // "" if the books balance (granted == sum of holdings on every GPU, no
  // waiting request of a missing job, ...), else what is wrong. For tests.
  [[nodiscard]] std::string check() const;

 private:
  struct Impl;
  struct ImplDeleter {
    void operator()(Impl* impl) const;
  };
  std::unique_ptr<Impl, ImplDeleter> impl_;
};

}  // namespace zico::sharing
