// The ledger under a random daemon that carries out every action: the books,
// the rules and liveness checked after each step.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "ledger.h"
#include "ledger_test_support.h"

namespace zico::sharing {
namespace {

// --- randomized: a daemon that carries out every action -------------------

constexpr uint32_t kGpus = 2;

struct SimJob {
  std::array<bool, kGpus> open{};
  std::array<uint64_t, kGpus> held{};
  std::array<uint64_t, kGpus> asked{};  // outstanding reclaim, 0 if none
  std::map<uint64_t, std::pair<uint32_t, uint64_t>> waiting;  // request id -> (GPU, chunks)
  uint64_t next_request = 1;
  std::array<bool, kGpus> parked{};
  bool frozen = false;
  bool pageable = false;  // a UM job (Iterations::kUmJobs): set_pageable on each GPU it opens
};

// What the random daemon's jobs do besides asking and giving back: with
// claims, they also claim, wait at their gates (and ask may_start), get
// frozen and thawed; parks (turns) then happen and are carried out. With UM
// jobs, besides, a third of the jobs page (set_pageable, a random floor):
// their requests may be cut or served in part, they may be asked while they
// wait, and they are never parked nor made to yield; and half of all jobs
// page at their gates (set_gate_paging, a random amount).
enum class Iterations : uint8_t { kNone, kClaimsAndTurns, kUmJobs };

class Daemon {
 public:
  Daemon(DeadlockPolicy policy, uint64_t seed, Iterations iterations = Iterations::kNone)
      : ledger_(options(policy)), policy_(policy), iterations_(iterations), rng_(seed) {
    for (uint32_t g = 0; g < kGpus; ++g) ledger_.add_gpu(pick(8, 32));
    for (int i = 0; i < 6; ++i) add_job();
  }

  void run(int operations) {
    for (int op = 0; op < operations; ++op) {
      now_ += pick(0, 30 * kMs);
      step();
      pump();
      verify();
      if (::testing::Test::HasFatalFailure() || ::testing::Test::HasNonfatalFailure()) {
        ADD_FAILURE() << "after operation " << op;
        return;
      }
      if (op % 2500 == 2499) {
        drain(op % 5000 == 2499);
        if (::testing::Test::HasFailure()) return;
      }
    }
  }

 private:
  static LedgerOptions options(DeadlockPolicy policy) {
    LedgerOptions o;
    o.deadlock_policy = policy;
    o.reclaim_retry_ns = kRetry;
    return o;
  }

  uint64_t pick(uint64_t lo, uint64_t hi) { return std::uniform_int_distribution<uint64_t>(lo, hi)(rng_); }
  JobId any_job() {
    auto it = jobs_.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(pick(0, jobs_.size() - 1)));
    return it->first;
  }
  uint32_t any_gpu() { return static_cast<uint32_t>(pick(0, kGpus - 1)); }

  Ledger::JobView view(JobId job, uint32_t gpu) {
    Ledger::JobView v;
    EXPECT_TRUE(ledger_.job(job, gpu, now_, &v));
    return v;
  }
  uint64_t sum_mins(uint32_t gpu) {
    uint64_t sum = 0;
    for (auto& [id, job] : jobs_) {
      if (job.open[gpu]) sum += view(id, gpu).min;
    }
    return sum;
  }

  void open(JobId id, uint32_t gpu, uint64_t held) {
    std::string why;
    ASSERT_TRUE(ledger_.open(id, gpu, held, &why).is_ok()) << why;
    jobs_[id].open[gpu] = true;
    jobs_[id].held[gpu] = held;
    if (jobs_[id].pageable) {
      EXPECT_TRUE(ledger_.set_pageable(id, gpu, pick(1, std::max<uint64_t>(1, ledger_.gpu(gpu).budget / 4))));
    }
    // Half the jobs of a UM run page at their gates, pageable or not.
    if (iterations_ == Iterations::kUmJobs && pick(0, 1) == 0) {
      EXPECT_TRUE(ledger_.set_gate_paging(id, gpu, pick(1, std::max<uint64_t>(1, ledger_.gpu(gpu).budget / 2))));
    }
  }

  void add_job() {
    const JobId id = next_job_++;
    ASSERT_TRUE(ledger_.add_job(id, 1000, id));
    jobs_[id].pageable = iterations_ == Iterations::kUmJobs && pick(0, 2) == 0;
    for (uint32_t g = 0; g < kGpus; ++g) {
      if (pick(0, 1) == 0) continue;
      // Now and then a job "reconnects" holding chunks, even past the budget.
      open(id, g, pick(0, 9) == 0 ? pick(1, ledger_.gpu(g).budget / 2) : 0);
    }
  }

  void ask(JobId id, uint32_t gpu, uint64_t chunks) {
    SimJob& job = jobs_[id];
    if (!job.open[gpu]) open(id, gpu, 0);
    const uint64_t request_id = job.next_request++;
    std::string why;
    ASSERT_TRUE(ledger_.request(id, gpu, request_id, chunks, now_, &why).is_ok()) << why;
    job.waiting[request_id] = {gpu, chunks};
  }

  void give(JobId id, uint32_t gpu, uint64_t chunks, bool reclaim_reply) {
    SimJob& job = jobs_[id];
    std::string why;
    ASSERT_TRUE(ledger_.returned(id, gpu, chunks, reclaim_reply, now_, &why).is_ok()) << why;
    job.held[gpu] -= chunks;
    if (reclaim_reply) job.asked[gpu] = 0;
  }

  // A job's iteration: a claim, a wait at its gate (asking may_start), or
  // its connection lost and found (frozen).
  void iterate(JobId id, uint32_t gpu, uint64_t budget) {
    SimJob& job = jobs_[id];
    if (!job.open[gpu]) return;
    const uint64_t dice = pick(0, 9);
    if (dice < 4) {
      const uint64_t peak = pick(0, 4) == 0 ? 0 : pick(1, budget + 2);
      EXPECT_TRUE(ledger_.set_claim(id, gpu, peak, pick(0, peak)));
    } else if (dice < 8) {
      const uint64_t next_peak = pick(0, 1) == 0 ? 0 : pick(1, budget + 2);
      EXPECT_TRUE(ledger_.set_between_iterations(id, gpu, next_peak));
      const bool may = ledger_.may_start(id, gpu, next_peak, pick(0, next_peak), now_);
      EXPECT_TRUE(!may || !job.parked[gpu]) << "a parked job may not start";
    } else {
      job.frozen = !job.frozen;
      ledger_.set_frozen(id, job.frozen);
      if (job.frozen) job.parked.fill(false);  // a frozen job cannot be a victim
    }
  }

  void step() {
    const uint64_t dice = pick(0, 99);
    const JobId id = any_job();
    SimJob& job = jobs_[id];
    const uint32_t gpu = any_gpu();
    const uint64_t budget = ledger_.gpu(gpu).budget;
    std::string why;
    if (iterations_ != Iterations::kNone && pick(0, 3) == 0) {
      iterate(id, gpu, budget);
    } else if (dice < 30) {
      // Mostly modest asks; sometimes more than can ever be had.
      ask(id, gpu, pick(0, 9) == 0 ? pick(1, budget + 8) : pick(1, std::max<uint64_t>(1, budget / 3)));
    } else if (dice < 38) {
      if (job.waiting.empty()) {
        EXPECT_FALSE(ledger_.cancel(id, job.next_request + 5, now_));
        return;
      }
      auto it = job.waiting.begin();
      std::advance(it, static_cast<std::ptrdiff_t>(pick(0, job.waiting.size() - 1)));
      EXPECT_TRUE(ledger_.cancel(id, it->first, now_));
      job.waiting.erase(it);
    } else if (dice < 58) {
      if (job.open[gpu] && job.held[gpu] > 0) give(id, gpu, pick(1, job.held[gpu]), false);
    } else if (dice < 73) {
      if (job.asked[gpu] > 0) give(id, gpu, pick(0, job.held[gpu]), true);
    } else if (dice < 78) {
      if (jobs_.size() > 4) {
        ledger_.remove_job(id);
        jobs_.erase(id);
      }
    } else if (dice < 85) {
      if (jobs_.size() < 8) add_job();
    } else if (dice < 90) {
      const uint64_t mins = sum_mins(gpu);
      const uint64_t target = pick(mins > 2 ? mins - 2 : 0, 40);
      const Status status = ledger_.set_budget(gpu, target, &why);
      EXPECT_EQ(status.is_ok(), target >= mins) << why;
    } else if (dice < 95) {
      if (!job.open[gpu]) return;
      const uint64_t min = pick(0, budget / 3);
      const uint64_t max = pick(0, 3) == 0 ? UINT64_MAX : pick(min > 0 ? min - 1 : 0, budget);
      const uint64_t mins = sum_mins(gpu) - view(id, gpu).min + min;
      const Status status = ledger_.set_job_limits(id, gpu, min, max, &why);
      EXPECT_EQ(status.is_ok(), min <= max && mins <= budget) << why;
    } else {
      if (!job.open[gpu]) return;
      EXPECT_EQ(ledger_.returned(id, gpu, job.held[gpu] + 1, false, now_, &why).code(), Errc::kInvalidArgument);
    }
  }

  // One pump, every action checked against the rules and carried out.
  void pump() {
    for (int round = 0; round < 8; ++round) {
      std::array<uint64_t, kGpus> granted{};
      std::array<Ledger::GpuView, kGpus> before{};
      for (uint32_t g = 0; g < kGpus; ++g) {
        before[g] = ledger_.gpu(g);
        granted[g] = before[g].granted;
      }
      const std::vector<LedgerAction> actions = ledger_.pump(now_);
      std::vector<LedgerAction> yields;
      std::vector<LedgerAction> parks;
      for (const LedgerAction& a : actions) {
        ASSERT_TRUE(jobs_.count(a.job) == 1) << describe(actions);
        SimJob& job = jobs_[a.job];
        const uint64_t budget = before[a.gpu].budget;
        if (a.kind == Kind::kPark) {
          EXPECT_FALSE(job.pageable) << "parked a UM job: " << describe(actions);
          EXPECT_FALSE(job.frozen) << "parked a frozen job: " << describe(actions);
          EXPECT_FALSE(job.parked[a.gpu]) << "parked twice: " << describe(actions);
          EXPECT_EQ(job.asked[a.gpu], 0u) << "parked a job with a reclaim outstanding: " << describe(actions);
          EXPECT_EQ(a.chunks, job.held[a.gpu]) << describe(actions);
          for (const auto& [rid, w] : job.waiting) {
            EXPECT_NE(w.first, a.gpu) << "parked a waiting job: " << describe(actions);
          }
          job.parked[a.gpu] = true;
          parks.push_back(a);
          continue;
        }
        if (a.kind == Kind::kResume) {
          EXPECT_TRUE(job.parked[a.gpu]) << "resumed a job not parked: " << describe(actions);
          job.parked[a.gpu] = false;
          resumes_ += 1;
          continue;
        }
        if (a.kind == Kind::kReclaim) {
          EXPECT_EQ(job.asked[a.gpu], 0u) << "asked twice: " << describe(actions);
          EXPECT_FALSE(job.frozen) << "asked a frozen job: " << describe(actions);
          EXPECT_FALSE(job.parked[a.gpu] && job.held[a.gpu] > 0) << "asked a park's victim: " << describe(actions);
          const Ledger::JobView v = view(a.job, a.gpu);
          EXPECT_GE(a.chunks, 1u);
          EXPECT_LE(a.chunks + v.min, job.held[a.gpu]) << "asked below its minimum: " << describe(actions);
          for (const auto& [rid, w] : job.waiting) {
            EXPECT_TRUE(w.first != a.gpu || job.pageable) << "asked a waiting job: " << describe(actions);
          }
          job.asked[a.gpu] = a.chunks;
          continue;
        }
        auto it = job.waiting.find(a.request_id);
        ASSERT_TRUE(it != job.waiting.end() && it->second.first == a.gpu) << describe(actions);
        const uint64_t chunks = it->second.second;
        job.waiting.erase(it);
        if (a.kind == Kind::kGrant) {
          // A UM job's request may be cut to its ceiling or served in part.
          if (job.pageable) {
            EXPECT_TRUE(a.chunks >= 1 && a.chunks <= chunks) << describe(actions);
          } else {
            EXPECT_EQ(a.chunks, chunks);
          }
          const uint64_t chunks_granted = a.chunks;
          EXPECT_LE(granted[a.gpu] + chunks_granted, budget) << "a grant broke the budget: " << describe(actions);
          uint64_t unmet = 0;  // the others' minimums must stay reachable
          for (auto& [other_id, other] : jobs_) {
            if (other_id == a.job || !other.open[a.gpu]) continue;
            const uint64_t min = view(other_id, a.gpu).min;
            unmet += min > other.held[a.gpu] ? min - other.held[a.gpu] : 0;
          }
          EXPECT_LE(granted[a.gpu] + chunks_granted + unmet, budget) << "no room left for minimums: " << describe(actions);
          EXPECT_LE(job.held[a.gpu] + chunks_granted, view(a.job, a.gpu).max) << describe(actions);
          granted[a.gpu] += chunks_granted;
          job.held[a.gpu] += chunks_granted;
        } else if (a.kind == Kind::kDeny) {
          EXPECT_EQ(a.errc, Errc::kOutOfMemory);
          const bool deadlock = a.reason.find("deadlock") != std::string::npos;
          EXPECT_TRUE(!deadlock || policy_ == DeadlockPolicy::kFail) << a.reason;
          if (!deadlock) {
            // Denied only if it could never be served (held as it was then).
            const Ledger::JobView v = view(a.job, a.gpu);
            const uint64_t others = sum_mins(a.gpu) - v.min;
            const uint64_t ceiling = std::min(v.max, budget > others ? budget - others : 0);
            EXPECT_GT(job.held[a.gpu] + chunks, ceiling) << "a possible request was denied: " << a.reason;
          }
          denials_ += 1;
        } else {
          EXPECT_EQ(policy_, DeadlockPolicy::kYield);
          EXPECT_FALSE(job.pageable) << "a UM job was made to yield: " << describe(actions);
          EXPECT_EQ(a.chunks, job.held[a.gpu]) << describe(actions);
          yields.push_back(a);
          yield_sizes_[{a.job, a.request_id}] = chunks;
        }
      }
      for (uint32_t g = 0; g < kGpus; ++g) {
        const uint64_t after = ledger_.gpu(g).granted;
        // A pump never pushes granted above the budget (it may already be there).
        if (after > before[g].budget) {
          EXPECT_LE(after, before[g].granted) << "GPU " << g;
        }
        grants_ += ledger_.gpu(g).grants - before[g].grants;
      }
      // A parked job gives back everything (it suspends between iterations).
      for (const LedgerAction& p : parks) {
        if (jobs_[p.job].held[p.gpu] > 0) give(p.job, p.gpu, jobs_[p.job].held[p.gpu], false);
        parks_ += 1;
      }
      if (yields.empty() && parks.empty()) return;
      // The victim gives back everything, then asks again at the back.
      for (const LedgerAction& y : yields) {
        if (jobs_[y.job].held[y.gpu] > 0) give(y.job, y.gpu, jobs_[y.job].held[y.gpu], false);
        ask(y.job, y.gpu, yield_sizes_[{y.job, y.request_id}]);
        yields_ += 1;
      }
    }
  }

  void verify() {
    ASSERT_EQ(ledger_.check(), "");
    ASSERT_EQ(ledger_.jobs().size(), jobs_.size());
    std::array<uint64_t, kGpus> waiting{};
    for (auto& [id, job] : jobs_) {
      std::array<uint64_t, kGpus> chunks{};
      for (const auto& [rid, w] : job.waiting) chunks[w.first] += w.second;
      for (uint32_t g = 0; g < kGpus; ++g) {
        Ledger::JobView v;
        ASSERT_EQ(ledger_.job(id, g, now_, &v), job.open[g]);
        if (!job.open[g]) continue;
        ASSERT_EQ(v.held, job.held[g]) << "job " << id << " GPU " << g;
        // A UM job's requests may have been cut to its ceiling meanwhile.
        if (job.pageable) {
          ASSERT_LE(v.waiting, chunks[g]) << "job " << id << " GPU " << g;
          ASSERT_EQ(v.waiting == 0, chunks[g] == 0) << "job " << id << " GPU " << g;
        } else {
          ASSERT_EQ(v.waiting, chunks[g]) << "job " << id << " GPU " << g;
        }
        waiting[g] += v.waiting;
      }
    }
    for (uint32_t g = 0; g < kGpus; ++g) ASSERT_EQ(ledger_.gpu(g).waiting, waiting[g]);
  }

  // Liveness: jobs stop asking and answer reclaims in full, keeping what
  // they are granted; then every ordinary job's waiting request ends, and (checked in pump)
  // only impossible ones, or kFail victims, end denied. Every other time the
  // jobs first give back everything; otherwise waiters start out holding
  // chunks, which is where deadlocks come from.
  void drain(bool give_back_first) {
    // Jobs answer again and say nothing of their iterations: claims can be
    // wrong and a frozen job gives back only when it goes, so neither is
    // promised to end every wait.
    for (auto& [id, job] : jobs_) {
      if (job.frozen) ledger_.set_frozen(id, false);
      job.frozen = false;
      for (uint32_t g = 0; g < kGpus; ++g) {
        if (job.open[g]) {
          EXPECT_TRUE(ledger_.set_claim(id, g, 0, 0));
        }
      }
    }
    for (auto& [id, job] : jobs_) {
      for (uint32_t g = 0; g < kGpus; ++g) {
        if (job.open[g] && give_back_first) give(id, g, job.held[g], job.asked[g] > 0);
      }
    }
    for (int i = 0; i < 1000; ++i) {
      now_ += kRetry;
      pump();
      verify();
      if (::testing::Test::HasFailure()) return;
      for (auto& [id, job] : jobs_) {
        for (uint32_t g = 0; g < kGpus; ++g) {
          if (job.asked[g] > 0) give(id, g, std::min(job.asked[g], job.held[g]), true);
        }
      }
      // A UM job's request may wait for ever (it runs on, paging): only
      // ordinary jobs' requests must end. Then the UM jobs withdraw theirs.
      uint64_t ordinary_waiting = 0;
      for (const auto& [id, job] : jobs_) {
        if (!job.pageable) ordinary_waiting += job.waiting.size();
      }
      if (ordinary_waiting == 0) {
        for (auto& [id, job] : jobs_) {
          for (const auto& [rid, w] : job.waiting) EXPECT_TRUE(ledger_.cancel(id, rid, now_));
          job.waiting.clear();
        }
        EXPECT_EQ(ledger_.gpu(0).waiting + ledger_.gpu(1).waiting, 0u);
        drains_ += 1;
        return;
      }
    }
    std::string state;
    for (auto& [id, job] : jobs_) {
      for (uint32_t g = 0; g < kGpus; ++g) {
        if (!job.open[g]) continue;
        const Ledger::JobView v = view(id, g);
        state += " [job " + std::to_string(id) + " gpu " + std::to_string(g) + (job.pageable ? " um" : "") +
                 " held " + std::to_string(v.held) + " min " + std::to_string(v.min) + " max " +
                 (v.max == UINT64_MAX ? std::string("-") : std::to_string(v.max)) + " waiting " +
                 std::to_string(v.waiting) + (job.frozen ? " frozen" : "") + " asked " + std::to_string(job.asked[g]) + "]";
      }
    }
    ADD_FAILURE() << "requests still wait: GPU 0 " << ledger_.gpu(0).waiting << ", GPU 1 " << ledger_.gpu(1).waiting
                  << " (budgets " << ledger_.gpu(0).budget << ", " << ledger_.gpu(1).budget << ", granted "
                  << ledger_.gpu(0).granted << ", " << ledger_.gpu(1).granted << "):" << state;
  }

 public:
  uint64_t grants_ = 0;
  uint64_t denials_ = 0;
  uint64_t yields_ = 0;
  uint64_t parks_ = 0;
  uint64_t resumes_ = 0;
  uint64_t drains_ = 0;

 private:
  Ledger ledger_;
  DeadlockPolicy policy_;
  Iterations iterations_;
  std::mt19937_64 rng_;
  std::map<JobId, SimJob> jobs_;
  std::map<std::pair<JobId, uint64_t>, uint64_t> yield_sizes_;
  JobId next_job_ = 1;
  uint64_t now_ = 0;
};

TEST(LedgerProperty, RandomDaemonWithYieldKeepsBooksAndLiveness) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Daemon daemon(DeadlockPolicy::kYield, seed);
    daemon.run(20'000);
    EXPECT_GT(daemon.grants_, 0u);
    EXPECT_GT(daemon.denials_, 0u);
    EXPECT_GT(daemon.yields_, 0u) << "the run should reach deadlocks";
    EXPECT_EQ(daemon.drains_, 8u);
  }
}

// The same daemon whose jobs also claim, wait at their gates and get frozen:
// the banker's check, turns and frozen jobs join the rules under test.
TEST(LedgerProperty, RandomDaemonWithClaimsTurnsAndFrozenJobsKeepsBooksAndLiveness) {
  for (uint64_t seed : {6u, 7u, 8u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Daemon daemon(DeadlockPolicy::kYield, seed, Iterations::kClaimsAndTurns);
    daemon.run(20'000);
    EXPECT_GT(daemon.grants_, 0u);
    EXPECT_GT(daemon.yields_, 0u);
    EXPECT_GT(daemon.parks_, 0u) << "the run should reach turns";
    EXPECT_GT(daemon.resumes_, 0u);
    EXPECT_EQ(daemon.drains_, 8u);
  }
}

// The same with UM jobs among the others.
TEST(LedgerProperty, RandomDaemonWithUmJobsKeepsBooksAndLiveness) {
  for (uint64_t seed : {9u, 10u, 11u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Daemon daemon(DeadlockPolicy::kYield, seed, Iterations::kUmJobs);
    daemon.run(20'000);
    EXPECT_GT(daemon.grants_, 0u);
    EXPECT_GT(daemon.yields_, 0u);
    EXPECT_EQ(daemon.drains_, 8u);
  }
}

TEST(LedgerProperty, RandomDaemonWithFailKeepsBooksAndLiveness) {
  for (uint64_t seed : {4u, 5u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Daemon daemon(DeadlockPolicy::kFail, seed);
    daemon.run(20'000);
    EXPECT_GT(daemon.grants_, 0u);
    EXPECT_EQ(daemon.yields_, 0u);
    EXPECT_EQ(daemon.drains_, 8u);
  }
}

}  // namespace
}  // namespace zico::sharing
