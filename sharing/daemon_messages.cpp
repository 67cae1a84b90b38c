// zico-umd: what each message does; the status reply, budgets, job control.
#include "daemon_impl.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <unordered_set>

#include "log.h"
#include "sizes.h"

namespace zico::sharing {

// --- messages -------------------------------------------------------------------------

std::string Daemon::Impl::on_message(Connection& connection, const proto::Message& message) {
  if (connection.role == Role::kNew) {
    if (const auto* hello = std::get_if<proto::Hello>(&message)) return on_hello(connection, *hello);
    connection.role = Role::kAdmin;  // anything else makes it a zico-umctl connection
  }
  if (connection.role == Role::kJob) {
    auto it = jobs.find(connection.job);
    if (it == jobs.end()) return "job is gone";
    return on_job_message(it->second, message);
  }
  if (std::holds_alternative<proto::StatusQuery>(message)) {
    return send(connection.fd, status()) ? "" : "cannot send the status";
  }
  if (const auto* request = std::get_if<proto::SetBudget>(&message)) {
    return send(connection.fd, set_budget(connection, *request)) ? "" : "cannot send the result";
  }
  if (const auto* request = std::get_if<proto::JobControl>(&message)) {
    return send(connection.fd, control(connection, *request)) ? "" : "cannot send the result";
  }
  return std::string(proto::to_string(proto::type_of(message))) + " is not a zico-umctl request";
}

std::string Daemon::Impl::on_hello(Connection& connection, const proto::Hello& hello) {
  uint64_t id = 0;
  // The same process (its pidfd has not fired, so the pid was not reused);
  // any other process asking for this id is a new job.
  if (auto it = jobs.find(hello.resume_job_id); it != jobs.end() && it->second.expected &&
                                                 it->second.peer.uid == connection.peer.uid &&
                                                 it->second.peer.pid == connection.peer.pid) {
    // Back after a restart: its reservation becomes the job again.
    Job& job = it->second;
    job.expected = false;
    freeze(job, false);
    job.fd = connection.fd;
    job.peer = connection.peer;
    job.name = hello.name;
    connection.role = Role::kJob;
    connection.job = job.id;
    ZICO_LOG(kInfo, "job %llu is back: pid %d '%s'", static_cast<unsigned long long>(job.id), connection.peer.pid,
             hello.name.c_str());
    return send(connection.fd, proto::Welcome{job.id}) ? "" : "cannot send Welcome";
  }
  if (hello.resume_job_id != 0 && jobs.contains(hello.resume_job_id)) {
    // Its earlier connection ended while its process lived: what it holds
    // stays counted under the old record until it exits.
    return "job " + std::to_string(hello.resume_job_id) + " is still registered; it keeps what it holds";
  }
  if (hello.resume_job_id >= kMaxJobId) {
    return "job id " + std::to_string(hello.resume_job_id) + " is out of range (ids are below 2^63)";
  }
  if (hello.resume_job_id != 0) {
    // Not reserved for it (no state file, or it came back too late): what it
    // says it holds is weighed against what its process holds (OpenGpu). Its
    // id is only a name it chose: it does not move the ids of new jobs.
    id = hello.resume_job_id;
  } else {
    while (jobs.contains(next_job_id) || ledger.has_job(next_job_id)) ++next_job_id;
    if (next_job_id >= kMaxJobId) return "no job ids left; restart zico-umd";
    id = next_job_id++;
  }
  Job job;
  job.id = id;
  job.resumed = hello.resume_job_id != 0;
  job.expected_reservation_used.assign(gpus.size(), true);
  job.fd = connection.fd;
  job.peer = connection.peer;
  job.name = hello.name;
  job.gpus.resize(gpus.size());
  job.pidfd = connection.peer.pid > 0 ? open_pidfd(connection.peer.pid) : -1;
  if (job.pidfd < 0) {
    // Without it the daemon could not tell when the job's process is gone,
    // and could lend chunks the process still maps: refuse, the job runs standalone.
    return "cannot watch pid " + std::to_string(connection.peer.pid) + " (pidfd_open: " + std::strerror(errno) +
           "); zico-umd needs Linux 5.3+ and the jobs' pid namespace";
  }
  if (!ledger.add_job(id, connection.peer.uid, ++arrivals)) return "job id " + std::to_string(id) + " is in use";
  job.state_slot = state_file.claim(id, connection.peer.pid, connection.peer.uid);
  if (job.state_slot < 0 && state_file.is_open()) {
    ZICO_LOG(kWarn, "state file full: a restart would not know what job %llu holds", static_cast<unsigned long long>(id));
  }
  jobs[id] = std::move(job);
  connection.role = Role::kJob;
  connection.job = id;
  ZICO_LOG(kInfo, "job %llu registered: pid %d uid %u '%s'%s", static_cast<unsigned long long>(id),
           connection.peer.pid, connection.peer.uid, hello.name.c_str(), hello.resume_job_id != 0 ? " (resumed)" : "");
  return send(connection.fd, proto::Welcome{id}) ? "" : "cannot send Welcome";
}

std::string Daemon::Impl::on_job_message(Job& job, const proto::Message& message) {
  const uint64_t now = now_ns();
  std::string why;
  if (const auto* open = std::get_if<proto::OpenGpu>(&message)) {
    const int g = gpu_of(open->uuid);
    if (g < 0) {
      // Not ours: chunk size 0 tells the job to run that device standalone.
      ZICO_LOG(kInfo, "job %llu uses GPU %s, which is not managed here", static_cast<unsigned long long>(job.id),
               proto::to_hex(open->uuid).c_str());
      return send(job.fd, proto::GpuOpened{}) ? "" : "cannot send GpuOpened";
    }
    const auto gpu = static_cast<uint32_t>(g);
    const uint64_t budget = ledger.gpu(gpu).budget;
    if (open->held_chunks > budget) {
      return "OpenGpu claims " + std::to_string(open->held_chunks) + " chunks held; the budget is " +
             std::to_string(budget);
    }
    const bool reserved = job.gpus[gpu].open && !job.expected_reservation_used[gpu] &&
                          job.gpus[gpu].lent.empty() && job.gpus[gpu].unowned >= open->held_chunks;
    if (reserved) {
      job.expected_reservation_used[gpu] = true;
      // Reserved from the state file: keep what it really holds, free the rest.
      const uint64_t surplus = job.gpus[gpu].unowned - open->held_chunks;
      if (!ledger.returned(job.id, gpu, surplus, false, now, &why).is_ok()) return why;
    } else if (job.gpus[gpu].open) {
      return "OpenGpu for GPU " + std::to_string(gpu) + ", which the job has opened already";
    } else if (open->held_chunks != 0 && !job.resumed) {
      return "a new job claims to hold " + std::to_string(open->held_chunks) + " chunks";
    }
    uint64_t held = open->held_chunks;
    if (held != 0 && !reserved) {
      // A UM job's grants are pages it may keep on the device, which no
      // look at its process can prove (they are its own managed memory), and
      // which it can page out at any time: it is booked no more than the
      // budget has free, and told to page the rest out. Any other job is
      // believed as far as its process can be shown to hold the chunks.
      const uint64_t granted = ledger.gpu(gpu).granted;
      held = open->pageable ? std::min(held, budget - std::min(budget, granted)) : provable_holding(job, gpu, held);
      if (held < open->held_chunks) {
        ZICO_LOG(kWarn, "job %llu (pid %d) says it holds %llu chunks of GPU %u; %llu are all it %s",
                 static_cast<unsigned long long>(job.id), job.peer.pid,
                 static_cast<unsigned long long>(open->held_chunks), gpu, static_cast<unsigned long long>(held),
                 open->pageable ? "may keep on the device (the budget's free share)" : "can be shown to hold");
      }
    }
    if (!job.gpus[gpu].open && !ledger.open(job.id, gpu, held, &why).is_ok()) return why;
    job.gpus[gpu].open = true;
    job.gpus[gpu].unowned = held;
    // Its floor is one chunk until its Reports say more.
    job.gpus[gpu].pageable = open->pageable;
    (void)ledger.set_pageable(job.id, gpu, open->pageable ? 1 : 0);
    gates.open(job.id, gpu);
    record_holding(job, gpu);
    Ledger::JobView view;
    (void)ledger.job(job.id, gpu, now, &view);
    const uint64_t chunk = gpus[gpu].chunk_bytes;
    const uint64_t max_bytes = view.max > UINT64_MAX / chunk ? UINT64_MAX : view.max * chunk;
    if (!send(job.fd, proto::GpuOpened{gpu, chunk, view.min * chunk, max_bytes, ledger.gpu(gpu).budget * chunk})) {
      return "cannot send GpuOpened";
    }
    // A UM job booked below what it says it holds pages the difference out.
    if (open->pageable && held < open->held_chunks && !send(job.fd, proto::Reclaim{gpu, open->held_chunks - held})) {
      return "cannot send Reclaim";
    }
    return "";
  }
  if (const auto* request = std::get_if<proto::Request>(&message)) {
    if (request->gpu >= gpus.size() || !job.gpus[request->gpu].open) {
      return "Request for GPU " + std::to_string(request->gpu) + ", which the job has not opened";
    }
    if (const uint64_t charged = job.gpus[request->gpu].charged; charged != 0 && options.overuse != OveruseAction::kWarn) {
      const std::string reason = "this process holds " + format_size(charged * gpus[request->gpu].chunk_bytes) +
                                 " of GPU " + std::to_string(request->gpu) +
                                 " beyond what it was lent (memory it gave back and kept); it gets no more until it "
                                 "lets go";
      ++events.gpus[request->gpu].denials;
      return send(job.fd, proto::Deny{request->request_id, static_cast<uint32_t>(Errc::kOutOfMemory), reason})
                 ? ""
                 : "cannot send a denial";
    }
    // The claim first, so that the pump after this message judges the
    // request against it. The peak covers at least what the job will hold
    // once this request is served: the job counted from what it had
    // received, which lags behind our books while grants are on their way.
    // Peak 0 withdraws an earlier claim: the job does not know its iteration.
    uint64_t peak = 0;
    uint64_t settle = 0;
    if (request->claim_peak_chunks != 0) {
      Ledger::JobView view;
      (void)ledger.job(job.id, request->gpu, now, &view);
      peak = std::max<uint64_t>(request->claim_peak_chunks, view.held + request->chunks);
      settle = request->claim_settle_chunks;
    }
    (void)ledger.set_claim(job.id, request->gpu, peak, settle);
    // What it gave back and was not looked at yet may be what it needs.
    look_at_returns(job, request->gpu, {}, now);
    if (!ledger.request(job.id, request->gpu, request->request_id, request->chunks, now, &why).is_ok()) return why;
    job.requests.emplace(request->request_id, Job::Waiting{request->gpu, now});
    return "";
  }
  if (const auto* cancel = std::get_if<proto::Cancel>(&message)) {
    if (ledger.cancel(job.id, cancel->request_id, now)) {
      // A job withdraws a request only when its wait ran out (ZICO_WAIT_TIMEOUT).
      if (auto waiting = job.requests.find(cancel->request_id); waiting != job.requests.end()) {
        ++events.gpus[waiting->second.gpu].timeouts;
        job.requests.erase(waiting);
      }
      (void)send(job.fd, proto::Deny{cancel->request_id, static_cast<uint32_t>(Errc::kOutOfMemory), "cancelled"});
    }
    return "";
  }
  if (const auto* ret = std::get_if<proto::Return>(&message)) return on_return(job, *ret);
  if (const auto* report = std::get_if<proto::Report>(&message)) {
    if (report->gpu >= gpus.size() || !job.gpus[report->gpu].open) return "Report for a GPU the job has not opened";
    JobGpu& use = job.gpus[report->gpu];
    use.report = *report;
    const uint64_t chunk = gpus[report->gpu].chunk_bytes;
    if (use.pageable) {
      // A UM job's blocks may exceed what it keeps on the GPU (they page);
      // its floor, never above the budget, is what the ledger lets it shrink to.
      const uint64_t floor = report->floor_bytes / chunk + (report->floor_bytes % chunk != 0 ? 1 : 0);
      use.floor_chunks = std::max<uint64_t>(1, std::min(floor, ledger.gpu(report->gpu).budget));
      (void)ledger.set_pageable(job.id, report->gpu, use.floor_chunks);
      use.report.persistent_bytes = std::min(use.report.persistent_bytes, use.report.allocated_bytes);
      apply_gate_paging(job, report->gpu);
      return "";
    }
    // A job's word about its usage is bounded by what it holds.
    const uint64_t held_bytes = lent_chunks(job, report->gpu) * chunk;
    proto::Report& stored = use.report;
    stored.allocated_bytes = std::min(stored.allocated_bytes, held_bytes);
    stored.persistent_bytes = std::min(stored.persistent_bytes, stored.allocated_bytes);
    stored.floor_bytes = 0;
    stored.link_bytes_per_second = 0;
    return "";
  }
  if (const auto* mark = std::get_if<proto::IterationMark>(&message)) {
    for (const proto::GateClaim& claim : mark->claims) {
      if (claim.gpu >= gpus.size() || !job.gpus[claim.gpu].open) {
        return "IterationMark claims GPU " + std::to_string(claim.gpu) + ", which the job has not opened";
      }
    }
    // At its gate the job needs nothing more than it holds: its claims go,
    // which can make a waiting request safe to grant (the pump after every
    // message sees to it). The claims it sent are for the iteration it would
    // begin: may_start() weighs them when its gate's time comes.
    for (size_t g = 0; g < job.gpus.size(); ++g) {
      if (!job.gpus[g].open) continue;
      (void)ledger.set_between_iterations(job.id, static_cast<uint32_t>(g));
      job.gpus[g].gate_peak = 0;
      job.gpus[g].gate_settle = 0;
      job.gpus[g].told_wanted = false;
    }
    for (const proto::GateClaim& claim : mark->claims) {
      job.gpus[claim.gpu].gate_peak = claim.peak_chunks;
      job.gpus[claim.gpu].gate_settle = claim.settle_chunks;
    }
    job.gate_held = false;
    gates.arrive(job.id, mark->sequence, now);
    open_gates();
    return "";
  }
  if (const auto* curve = std::get_if<proto::Curve>(&message)) return on_curve(job, *curve);
  if (const auto* reported = std::get_if<proto::JobState>(&message)) {
    using State = proto::JobRunState;
    // Running may be said again and failed at any time (after a restart a
    // job cannot know what the new daemon heard); suspended only when asked.
    const bool expected = reported->state != State::kSuspended || job.state == State::kSuspendRequested;
    if (!expected) return "JobState " + std::to_string(static_cast<int>(reported->state)) + " was not asked for";
    if (reported->state == State::kFailed) {
      ZICO_LOG(kWarn, "job %llu %s (its log says why)", static_cast<unsigned long long>(job.id),
               job.state == State::kSuspended ? "could not restore its memory; it runs on without it"
                                              : "could not suspend; it runs on with what it holds");
      job.state = State::kFailed;
      // A turn's park that could not happen must not hold the others up.
      ledger.release_victim(job.id);
      return "";
    }
    if (reported->state == State::kRunning && job.state == State::kRunning) return "";
    if (reported->state == State::kSuspended) ++events.suspends;
    if (reported->state == State::kRunning && job.state == State::kSuspended) ++events.resumes;
    job.state = reported->state;
    if (job.state == proto::JobRunState::kSuspended) {
      // It gave everything back and needs nothing until it resumes (its
      // requests then claim again): not in mid-iteration, so neither its
      // claims nor its unknown iteration hold others' grants and starts back.
      for (size_t g = 0; g < job.gpus.size(); ++g) {
        if (job.gpus[g].open) (void)ledger.set_between_iterations(job.id, static_cast<uint32_t>(g));
      }
    }
    ZICO_LOG(kInfo, "job %llu %s", static_cast<unsigned long long>(job.id),
             reported->state == proto::JobRunState::kSuspended ? "suspended" : "runs again");
    return "";
  }
  return std::string(proto::to_string(proto::type_of(message))) + " is not a job request";
}

std::string Daemon::Impl::on_return(Job& job, const proto::Return& ret) {
  if (ret.gpu >= gpus.size() || !job.gpus[ret.gpu].open) return "Return for a GPU the job has not opened";
  JobGpu& held = job.gpus[ret.gpu];
  if (ret.unowned > held.unowned) {
    return "Return of " + std::to_string(ret.unowned) + " unowned chunks; the job has " + std::to_string(held.unowned);
  }
  // Everything is checked before anything changes: a chunk freed twice
  // would be lent to two jobs at once.
  std::unordered_set<uint32_t> seen;
  for (uint32_t id : ret.ids) {
    if (!held.lent.contains(id)) return "Return of chunk " + std::to_string(id) + ", which the job does not hold";
    if (!seen.insert(id).second) return "Return names chunk " + std::to_string(id) + " twice";
  }
  const uint64_t count = ret.ids.size() + ret.unowned;
  std::string why;
  if (!ledger.returned(job.id, ret.gpu, count, ret.reclaim_reply, now_ns(), &why).is_ok()) return why;
  Gpu& gpu = gpus[ret.gpu];
  for (uint32_t id : ret.ids) held.lent.erase(id);
  held.unowned -= ret.unowned;
  gpu.bytes_moved += count * gpu.chunk_bytes;
  // Looked at before anything is lent again: the audit would see a chunk
  // the process still maps only after another job had it.
  look_at_returns(job, ret.gpu, ret.ids, now_ns());
  record_holding(job, ret.gpu);
  return "";
}

proto::StatusReply Daemon::Impl::status() const {
  proto::StatusReply reply;
  const uint64_t now = now_ns();
  reply.daemon_pid = static_cast<uint64_t>(::getpid());
  reply.uptime_ns = now - start_ns;
  for (size_t g = 0; g < gpus.size() && g < proto::kMaxStatusGpus; ++g) {
    const Gpu& gpu = gpus[g];
    const Ledger::GpuView view = ledger.gpu(static_cast<uint32_t>(g));
    proto::GpuStatus s;
    s.index = static_cast<uint32_t>(g);
    s.uuid = gpu.uuid;
    s.chunk_bytes = gpu.chunk_bytes;
    s.budget_bytes = view.budget * gpu.chunk_bytes;
    s.granted_bytes = view.granted * gpu.chunk_bytes;
    s.pool_bytes = gpu.live * gpu.chunk_bytes;
    s.waiting_bytes = view.waiting * gpu.chunk_bytes;
    s.grants = view.grants;
    s.reclaims = view.returns;
    s.deadlocks = view.deadlocks;
    size_t device_free = 0;
    size_t device_total = 0;
    if (driver.memory_info(gpu.device, &device_free, &device_total).is_ok() && device_free <= device_total) {
      s.device_total_bytes = device_total;
      s.device_used_bytes = device_total - device_free;
    }
    if (g < events.gpus.size()) {
      s.parks = events.gpus[g].parks;
      s.denials = events.gpus[g].denials;
      s.timeouts = events.gpus[g].timeouts;
    }
    reply.gpus.push_back(s);
  }
  std::vector<const Job*> ordered;
  for (const auto& [id, job] : jobs) ordered.push_back(&job);
  reply.job_count = ordered.size();
  std::sort(ordered.begin(), ordered.end(), [](const Job* a, const Job* b) { return a->id < b->id; });
  for (const Job* job : ordered) {
    for (size_t g = 0; g < job->gpus.size(); ++g) {
      Ledger::JobView view;
      if (!job->gpus[g].open || !ledger.job(job->id, static_cast<uint32_t>(g), now, &view)) continue;
      ++reply.job_rows;
      // 128 jobs with the longest names still fit in one message.
      if (reply.jobs.size() == kStatusJobs) continue;
      const uint64_t chunk = gpus[g].chunk_bytes;
      proto::JobStatus s;
      s.id = job->id;
      s.pid = static_cast<uint32_t>(job->peer.pid);
      s.uid = job->peer.uid;
      s.gpu = static_cast<uint32_t>(g);
      s.name = job->name;
      s.granted_bytes = (view.held + view.charged) * chunk;
      s.min_bytes = view.min * chunk;
      s.max_bytes = view.max > UINT64_MAX / chunk ? UINT64_MAX : view.max * chunk;
      s.allocated_bytes = job->gpus[g].report.allocated_bytes;
      s.persistent_bytes = job->gpus[g].report.persistent_bytes;
      s.waiting_bytes = view.waiting * chunk;
      s.wait_ns = view.wait_ns;
      s.iterations = job->gpus[g].report.iterations;
      s.state = job->state;
      s.pageable = job->gpus[g].pageable;
      reply.jobs.push_back(s);
    }
  }
  return reply;
}

proto::Result Daemon::Impl::set_budget(const Connection& connection, const proto::SetBudget& request) {
  const auto refuse = [](Errc errc, std::string message) {
    return proto::Result{static_cast<uint32_t>(errc), std::move(message)};
  };
  if (request.gpu >= gpus.size()) {
    return refuse(Errc::kNotFound, "no GPU " + std::to_string(request.gpu) + " (this node has " +
                                       std::to_string(gpus.size()) + ")");
  }
  Gpu& gpu = gpus[request.gpu];
  const uint64_t chunks = request.bytes / gpu.chunk_bytes;
  const uint64_t now = now_ns();
  std::string why;
  if (request.target == proto::BudgetTarget::kNode) {
    if (!is_admin(connection.peer)) {
      return refuse(Errc::kInvalidArgument, "permission denied: changing a node budget needs root or the admin group");
    }
    if (chunks == 0) return refuse(Errc::kInvalidArgument, "a budget must hold at least one chunk (" + format_size(gpu.chunk_bytes) + ")");
    if (request.bytes > gpu.total_memory) {
      return refuse(Errc::kInvalidArgument, "budget " + format_size(request.bytes) + " is more than GPU " +
                                                std::to_string(request.gpu) + "'s " + format_size(gpu.total_memory) +
                                                " of memory");
    }
    uint64_t persistent = 0;
    for (const auto& [id, job] : jobs) persistent += must_stay(job.gpus[request.gpu]);
    if (request.bytes < persistent) {
      return refuse(Errc::kInvalidArgument, "budget " + format_size(request.bytes) + " is below the jobs' persistent memory (" +
                                                format_size(persistent) + ") on GPU " + std::to_string(request.gpu));
    }
    if (!ledger.set_budget(request.gpu, chunks, &why).is_ok()) return refuse(Errc::kInvalidArgument, why);
    ZICO_LOG(kInfo, "GPU %u budget set to %s by uid %u", request.gpu, format_size(chunks * gpu.chunk_bytes).c_str(),
             connection.peer.uid);
    // A shrink: the ledger asks idle memory back at once; the gates re-plan,
    // so iterations that no longer fit wait. A growth releases them.
    plan_gates_within_budget(request.gpu);
    // Every job that opened the GPU learns the budget (what cudaMemGetInfo reports).
    for (const auto& [id, other] : jobs) {
      Ledger::JobView limits;
      if (other.fd < 0 || !other.gpus[request.gpu].open || !ledger.job(id, request.gpu, now, &limits)) continue;
      const uint64_t limit_bytes = limits.max > UINT64_MAX / gpu.chunk_bytes ? UINT64_MAX : limits.max * gpu.chunk_bytes;
      (void)send(other.fd, proto::Limits{request.gpu, limits.min * gpu.chunk_bytes, limit_bytes, chunks * gpu.chunk_bytes});
    }
    pump();
    release_free(request.gpu, true);
    open_gates();
    return refuse(Errc::kOk, "GPU " + std::to_string(request.gpu) + " budget is now " +
                                 format_size(chunks * gpu.chunk_bytes));
  }
  auto it = jobs.find(request.job_id);
  Ledger::JobView view;
  if (it == jobs.end() || !ledger.job(request.job_id, request.gpu, now, &view)) {
    return refuse(Errc::kNotFound, "no job " + std::to_string(request.job_id) + " on GPU " + std::to_string(request.gpu) +
                                       " (zico-umctl jobs lists them)");
  }
  Job& job = it->second;
  if (!is_admin(connection.peer) && connection.peer.uid != job.peer.uid) {
    return refuse(Errc::kInvalidArgument, "permission denied: job " + std::to_string(job.id) + " belongs to uid " +
                                              std::to_string(job.peer.uid));
  }
  const uint64_t persistent = must_stay(job.gpus[request.gpu]);
  JobGpu& allowed = job.gpus[request.gpu];
  const bool admin = is_admin(connection.peer);
  const auto bytes_text = [&](uint64_t limit) {
    return limit == UINT64_MAX ? std::string("unlimited") : format_size(limit * gpu.chunk_bytes);
  };
  uint64_t min = view.min;
  uint64_t max = view.max;
  if (request.target == proto::BudgetTarget::kJobMin) {
    min = request.bytes / gpu.chunk_bytes + (request.bytes % gpu.chunk_bytes != 0 ? 1 : 0);
    // A minimum is memory other users' jobs cannot have: its owner may only
    // lower it, to what an admin allowed at most.
    if (!admin && min > allowed.admin_min) {
      return refuse(Errc::kInvalidArgument, "permission denied: job " + std::to_string(job.id) +
                                                "'s owner may set its minimum up to " + bytes_text(allowed.admin_min) +
                                                " (what an admin allows); more needs root or the admin group");
    }
  } else {
    if (request.bytes < persistent) {
      return refuse(Errc::kInvalidArgument, "maximum " + format_size(request.bytes) + " is below job " +
                                                std::to_string(job.id) + "'s persistent memory (" + format_size(persistent) + ")");
    }
    max = request.bytes == UINT64_MAX ? UINT64_MAX : chunks;  // UINT64_MAX: unlimited
    if (!admin && max > allowed.admin_max) {
      return refuse(Errc::kInvalidArgument, "permission denied: an admin capped job " + std::to_string(job.id) +
                                                " at " + bytes_text(allowed.admin_max) +
                                                "; its owner may only set a lower maximum");
    }
  }
  if (!ledger.set_job_limits(job.id, request.gpu, min, max, &why).is_ok()) return refuse(Errc::kInvalidArgument, why);
  if (admin) {
    if (request.target == proto::BudgetTarget::kJobMin) {
      allowed.admin_min = min;
    } else {
      allowed.admin_max = max;
    }
  }
  const uint64_t max_bytes = max > UINT64_MAX / gpu.chunk_bytes ? UINT64_MAX : max * gpu.chunk_bytes;
  if (job.fd >= 0) {
    (void)send(job.fd, proto::Limits{request.gpu, min * gpu.chunk_bytes, max_bytes,
                                     ledger.gpu(request.gpu).budget * gpu.chunk_bytes});
    // Above its new maximum: ask for the excess back (idle memory; live blocks stay).
    if (view.held > max) (void)send(job.fd, proto::Reclaim{request.gpu, view.held - max});
  }
  pump();
  return refuse(Errc::kOk, "job " + std::to_string(job.id) + " on GPU " + std::to_string(request.gpu) + ": min " +
                               format_size(min * gpu.chunk_bytes) + ", max " +
                               (max == UINT64_MAX ? std::string("unlimited") : format_size(max_bytes)));
}

proto::Result Daemon::Impl::control(const Connection& connection, const proto::JobControl& request) {
  const auto answer = [](Errc errc, std::string message) {
    return proto::Result{static_cast<uint32_t>(errc), std::move(message)};
  };
  auto it = jobs.find(request.job_id);
  if (it == jobs.end()) {
    return answer(Errc::kNotFound, "no job " + std::to_string(request.job_id) + " (zico-umctl jobs lists them)");
  }
  Job& job = it->second;
  if (!is_admin(connection.peer) && connection.peer.uid != job.peer.uid) {
    return answer(Errc::kInvalidArgument, "permission denied: job " + std::to_string(job.id) + " belongs to uid " +
                                              std::to_string(job.peer.uid));
  }
  if (job.fd < 0) return answer(Errc::kNotFound, "job " + std::to_string(job.id) + " is not connected");
  const std::string name = "job " + std::to_string(job.id);
  const bool running = runs(job.state);
  if (request.action == proto::JobAction::kSuspend) {
    if (!running) {
      return answer(Errc::kInvalidArgument, name + " is already suspended (or about to be)");
    }
    if (!send(job.fd, proto::Suspend{request.to})) return answer(Errc::kOsError, "cannot reach " + name);
    job.state = proto::JobRunState::kSuspendRequested;
    ZICO_LOG(kInfo, "%s asked to suspend to %s by uid %u", name.c_str(),
             request.to == proto::StoreKind::kNvme ? "nvme" : "host", connection.peer.uid);
    return answer(Errc::kOk, name + " suspends at its next allocation or iteration mark");
  }
  if (running) return answer(Errc::kInvalidArgument, name + " is not suspended");
  if (!send(job.fd, proto::Resume{})) return answer(Errc::kOsError, "cannot reach " + name);
  ZICO_LOG(kInfo, "%s asked to resume by uid %u", name.c_str(), connection.peer.uid);
  return answer(Errc::kOk, name + " resumes");
}

}  // namespace zico::sharing
