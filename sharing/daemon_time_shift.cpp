// zico-umd: time shift: iteration gates, the jobs' curves, turns.
#include "daemon_impl.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "log.h"

namespace zico::sharing {

// --- time shift ----------------------------------------------------------------------------

void Daemon::Impl::open_gates() {
  sync_gate_paging();  // the guard asks the ledger
  GateGuard* guard = options.start_guard || options.turns ? this : nullptr;
  for (const IterationGates::Opened& opened : gates.due(now_ns(), guard)) {
    events.gate_delay.observe(opened.waited_ns);
    // Its gate open, it is in mid-iteration (the guard says so itself).
    if (guard == nullptr) starting(opened.job);
    auto it = jobs.find(opened.job);
    if (it != jobs.end() && it->second.fd >= 0) {
      (void)send(it->second.fd, proto::Proceed{opened.sequence, sharers(it->second)});
    }
  }
  arm_timer(gate_timer_fd, gates.next_due_ns());
}

uint32_t Daemon::Impl::sharers(const Job& job) const {
  uint32_t count = 0;
  for (const auto& [id, other] : jobs) {
    if (id == job.id) continue;
    for (size_t g = 0; g < job.gpus.size() && g < other.gpus.size(); ++g) {
      if (job.gpus[g].open && other.gpus[g].open) {
        ++count;
        break;
      }
    }
  }
  return count;
}

std::pair<uint64_t, uint64_t> Daemon::Impl::gate_claim(const Job& job, uint32_t gpu) const {
  const JobGpu& state = job.gpus[gpu];
  if (state.gate_peak == 0) return {0, 0};
  Ledger::JobView view;
  (void)ledger.job(job.id, gpu, now_ns(), &view);
  return {std::max(state.gate_peak, view.held), state.gate_settle};
}

bool Daemon::Impl::may_start(JobId id) {
  auto it = jobs.find(id);
  if (it == jobs.end()) return true;
  Job& job = it->second;
  for (size_t g = 0; g < job.gpus.size(); ++g) {
    if (!job.gpus[g].open) continue;
    const auto gpu = static_cast<uint32_t>(g);
    const auto [peak, settle] = gate_claim(job, gpu);
    const uint64_t now = now_ns();
    if (options.start_guard ? ledger.may_start(job.id, gpu, peak, settle, now)
                            : ledger.turns_allow_start(job.id, gpu, peak, now)) {
      continue;
    }
    // Turns: the ledger learns the peak it waits for, and the next pump
    // parks the job in its way.
    if (options.turns) (void)ledger.set_between_iterations(job.id, gpu, peak);
    if (!job.gate_held) {
      job.gate_held = true;
      ZICO_LOG(kDebug,
               "job %llu held at its gate: on GPU %u its iteration (claim %llu/%llu chunks, 0: unknown) "
               "is not safe beside the jobs in mid-iteration, or waits for its turn",
               static_cast<unsigned long long>(job.id), gpu, static_cast<unsigned long long>(peak),
               static_cast<unsigned long long>(settle));
    }
    return false;
  }
  return true;
}

uint64_t Daemon::Impl::turn_wait_until_ns(JobId id, uint64_t now) {
  auto it = jobs.find(id);
  if (it == jobs.end()) return 0;
  uint64_t until = 0;
  for (size_t g = 0; g < it->second.gpus.size(); ++g) {
    if (!it->second.gpus[g].open) continue;
    const auto gpu = static_cast<uint32_t>(g);
    // Parked, it waits for its kResume, which the ledger sends when its time
    // is up: its gate opening before would only make it claim while suspended.
    Ledger::JobView view;
    if (ledger.job(id, gpu, now, &view) && view.parked) return now;
    until = std::max(until, ledger.turn_wait_until_ns(gpu, now));
  }
  return until;
}

// Peak 0 ends "between iterations" without a claim: a job whose iteration is
// unknown counts as in mid-iteration, so that others' starts wait for it.
void Daemon::Impl::starting(JobId id) {
  auto it = jobs.find(id);
  if (it == jobs.end()) return;
  Job& job = it->second;
  if (job.gate_held) {
    ZICO_LOG(kDebug, "job %llu starts its held iteration", static_cast<unsigned long long>(job.id));
    job.gate_held = false;
  }
  for (size_t g = 0; g < job.gpus.size(); ++g) {
    if (!job.gpus[g].open) continue;
    const auto gpu = static_cast<uint32_t>(g);
    const auto [peak, settle] = gate_claim(job, gpu);
    (void)ledger.set_claim(job.id, gpu, peak, settle);
  }
}

std::string Daemon::Impl::on_curve(Job& job, const proto::Curve& message) {
  if (message.gpu >= gpus.size() || !job.gpus[message.gpu].open) {
    return "Curve for GPU " + std::to_string(message.gpu) + ", which the job has not opened";
  }
  // A job's word about its demand is bounded by what it may ever hold, and
  // a gate delays by at most two of the asking job's own periods, so a wrong
  // curve costs others time, never the budget.
  DemandCurve curve = message.curve;
  // Shorter than this is not a training iteration (two marks back to back):
  // planning on it would only slice the others' time finely.
  if (curve.period_ns < kMinCurvePeriodNs) curve = DemandCurve{};
  Ledger::JobView view;
  (void)ledger.job(job.id, message.gpu, now_ns(), &view);
  const uint64_t chunk = gpus[message.gpu].chunk_bytes;
  const uint64_t limit = std::min(ledger.gpu(message.gpu).budget, view.max);
  const uint64_t bound = limit > UINT64_MAX / chunk ? UINT64_MAX : limit * chunk;
  for (uint64_t& bin : curve.bins) bin = std::min(bin, bound);
  curve.end_bytes = std::min(curve.end_bytes, bound);
  gates.set_curve(job.id, message.gpu, curve);
  job.gpus[message.gpu].period_ns = curve.period_ns;
  apply_gate_paging(job, message.gpu);
  open_gates();
  return "";
}

uint64_t Daemon::Impl::gate_paging_offered(const Job& job, uint32_t gpu) const {
  const JobGpu& use = job.gpus[gpu];
  const uint64_t chunk = gpus[gpu].chunk_bytes;
  const double link = static_cast<double>(use.report.link_bytes_per_second);
  const uint64_t bytes = use.pageable ? gate_paging_bytes(link, use.period_ns) : 0;
  return bytes / chunk * chunk;
}

void Daemon::Impl::apply_gate_paging(const Job& job, uint32_t gpu) {
  gates.set_gate_paging(job.id, gpu, gate_paging_offered(job, gpu));
  sync_gate_paging();
}

void Daemon::Impl::sync_gate_paging() {
  for (const auto& [id, job] : jobs) {
    for (size_t g = 0; g < job.gpus.size(); ++g) {
      if (!job.gpus[g].open) continue;
      const auto gpu = static_cast<uint32_t>(g);
      // Without time shift nothing co-runs the jobs: a UM job pages at its
      // gate whenever the ledger asks. A job that cannot be told anything
      // pages nothing.
      uint64_t bytes = gates.time_shift() ? gates.gate_paging(id, gpu) : gate_paging_offered(job, gpu);
      if (job.fd < 0) bytes = 0;
      (void)ledger.set_gate_paging(id, gpu, bytes / gpus[g].chunk_bytes);
    }
  }
}

}  // namespace zico::sharing
