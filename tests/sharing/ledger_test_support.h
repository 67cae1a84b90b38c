// What the ledger's tests share: a ledger with one GPU (Books) and ways to
// describe and compare its actions.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ledger.h"

namespace zico::sharing {

using Kind = LedgerAction::Kind;
constexpr uint64_t kMs = 1'000'000;
constexpr uint64_t kRetry = 100 * kMs;  // LedgerOptions' default reclaim_retry_ns

inline std::string describe(const std::vector<LedgerAction>& actions) {
  static const char* const kNames[] = {"grant", "deny", "reclaim", "yield", "park", "resume"};
  std::string text;
  for (const LedgerAction& a : actions) {
    text += std::string(kNames[static_cast<int>(a.kind)]) + "(job " + std::to_string(a.job) + " gpu " +
            std::to_string(a.gpu) + " req " + std::to_string(a.request_id) + " chunks " + std::to_string(a.chunks) +
            ") ";
  }
  return text.empty() ? "no actions" : text;
}

inline bool same(const LedgerAction& a, Kind kind, JobId job, uint64_t request_id, uint64_t chunks) {
  return a.kind == kind && a.job == job && a.request_id == request_id && a.chunks == chunks;
}

inline size_t count(const std::vector<LedgerAction>& actions, Kind kind) {
  size_t n = 0;
  for (const LedgerAction& a : actions) n += a.kind == kind ? 1 : 0;
  return n;
}

// A ledger with one GPU and helpers that fail the test on unexpected errors.
// Job ids double as their arrival order, so a higher id is younger.
struct Books {
  explicit Books(uint64_t budget, LedgerOptions options = {}) : ledger(options) { ledger.add_gpu(budget); }

  void join(JobId job, uint64_t min = 0, uint64_t max = UINT64_MAX, uint64_t held = 0) {
    std::string why;
    EXPECT_TRUE(ledger.add_job(job, 1000, job));
    EXPECT_TRUE(ledger.open(job, 0, held, &why).is_ok()) << why;
    EXPECT_TRUE(ledger.set_job_limits(job, 0, min, max, &why).is_ok()) << why;
  }
  void ask(JobId job, uint64_t id, uint64_t chunks, uint64_t now = 0) {
    std::string why;
    EXPECT_TRUE(ledger.request(job, 0, id, chunks, now, &why).is_ok()) << why;
  }
  void give(JobId job, uint64_t chunks, bool reclaim_reply = false, uint64_t now = 0) {
    std::string why;
    EXPECT_TRUE(ledger.returned(job, 0, chunks, reclaim_reply, now, &why).is_ok()) << why;
  }
  // Puts `chunks` in the job's hands through an ordinary grant.
  void hold(JobId job, uint64_t id, uint64_t chunks) {
    ask(job, id, chunks);
    const std::vector<LedgerAction> actions = ledger.pump(0);
    EXPECT_TRUE(actions.size() == 1 && same(actions[0], Kind::kGrant, job, id, chunks)) << describe(actions);
  }
  Ledger::JobView view(JobId job, uint64_t now = 0) const {
    Ledger::JobView v;
    EXPECT_TRUE(ledger.job(job, 0, now, &v));
    return v;
  }
  uint64_t held(JobId job) const { return view(job).held; }

  Ledger ledger;
};

}  // namespace zico::sharing
