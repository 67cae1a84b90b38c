// The daemon's internals, shared by its files (not part of any interface):
//   daemon.cpp              setup, the event loop, the public Daemon
//   daemon_connections.cpp  accepting, reading, writing and closing connections
//   daemon_messages.cpp     what each message does; status, budgets, job control
//   daemon_holdings.cpp     what jobs hold: restarts (state file) and the audit
//   daemon_lending.cpp      the chunk pool: the ledger's actions carried out
//   daemon_time_shift.cpp   iteration gates, curves, turns
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "daemon.h"
#include "metrics.h"
#include "metrics_server.h"
#include "outbox.h"
#include "state_file.h"
#include "wire.h"

namespace zico::sharing {

// The Impl is its gates' guard (GateGuard, iteration_gates.h): a job starts
// its iteration only if Ledger::may_start agrees on every GPU it opened.
struct Daemon::Impl final : GateGuard {
  // --- constants and system helpers (daemon.cpp) ---------------------------
  static constexpr uint32_t kFreshChunk = UINT32_MAX;  // last_uid of a chunk no job has used yet
  static constexpr uint64_t kTickNs = 50'000'000;
  static constexpr size_t kStatusJobs = 128;
  static constexpr uint64_t kMinCurvePeriodNs = 100'000;  // 100 µs
  static constexpr uint64_t kMetricsEveryNs = 1'000'000'000;
  static constexpr uint64_t kAuditEveryNs = 1'000'000'000;  // how often jobs' real holdings are checked
  // Job ids stay below this: they never wrap, and 0 keeps meaning "no job".
  static constexpr uint64_t kMaxJobId = uint64_t{1} << 63;
  // Limits on connections, so that one local user cannot fill the daemon's
  // descriptor table or keep it busy: a connection that has not said Hello
  // (or asked anything) within kHelloWithinNs, or a zico-umctl connection idle
  // for kAdminIdleNs, is closed; a uid other than root has at most
  // kConnectionsPerUid at once (jobs and zico-umctl together).
  static constexpr uint64_t kHelloWithinNs = 5'000'000'000;
  static constexpr uint64_t kAdminIdleNs = 60'000'000'000;
  static constexpr size_t kConnectionsPerUid = 128;
  [[nodiscard]] static uint64_t now_ns() {
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
            .count());
  }
  // Not suspended and not asked to be: a suspension may be asked of it (a
  // failed one left it running with its memory).
  [[nodiscard]] static bool runs(proto::JobRunState state) {
    return state == proto::JobRunState::kRunning || state == proto::JobRunState::kFailed;
  }
  static int open_pidfd(pid_t pid);
  // Arms the timerfd `timer_fd` (CLOCK_MONOTONIC, steady_clock's clock) to
  // fire at `at_ns`, or disarms it for UINT64_MAX.
  static void arm_timer(int timer_fd, uint64_t at_ns);
  static int send_signal(int pidfd, int signal);
  [[nodiscard]] static bool process_exited(int pidfd);
  // Is `uid` a member of `group` (primary or supplementary)?
  [[nodiscard]] static bool in_group(uid_t uid, gid_t primary, gid_t group);

  struct PoolChunk {
    PhysHandle handle;   // invalid: released; created again when next lent
    uint64_t owner = 0;  // job id, 0 when free
    uint32_t last_uid = kFreshChunk;
  };
  struct Gpu {
    DeviceId device;
    proto::GpuUuid uuid{};
    size_t chunk_bytes = 0;
    std::vector<PoolChunk> chunks;  // id = index + 1
    std::vector<uint32_t> free_ids;
    VaRange scratch;                // where a chunk is mapped to be zeroed
    StreamHandle stream;
    bool has_stream = false;
    uint64_t bytes_moved = 0;       // granted + returned, in bytes
    uint64_t zeroed = 0;            // chunks zeroed for a new owner
    uint64_t live = 0;              // chunks with a handle: the pool's physical memory
    uint64_t total_memory = 0;      // the device's: no budget may exceed it
  };
  struct JobGpu {
    bool open = false;
    std::unordered_set<uint32_t> lent;  // pool ids the job holds
    uint64_t unowned = 0;               // chunks it held when it (re)connected
    uint64_t charged = 0;               // chunks its process holds beyond these (audit), in the ledger too
    // Pool ids it gave back while its process still mapped them or kept a
    // descriptor (Driver::process_holds): out of the pool and charged to it
    // until the audit sees it let go, so that nobody is lent memory another
    // process can still reach, and the budget counts every chunk mapped.
    std::unordered_set<uint32_t> kept;
    // Pool ids it gave back that its process was not looked at for yet (a
    // look was not due: look_at_returns): out of the pool, charged in the
    // ledger (not as overuse) until it is, at most a tick later.
    std::vector<uint32_t> unchecked;
    // What an admin allows its owner (set_budget): a minimum up to admin_min,
    // a maximum up to admin_max, in chunks.
    uint64_t admin_min = 0;
    uint64_t admin_max = UINT64_MAX;
    proto::Report report;
    // The claim of the iteration it would begin, from its last IterationMark
    // (peak 0: unknown).
    uint64_t gate_peak = 0;
    uint64_t gate_settle = 0;
    // Told MemoryWanted since its last IterationMark (once per iteration).
    bool told_wanted = false;
    // A UM job's GPU (OpenGpu.pageable): its chunks are resident grants,
    // counted in `unowned`; no pool chunk is lent to it.
    bool pageable = false;
    uint64_t floor_chunks = 0;  // a UM job's floor, from its reports (the audit's tolerance)
    uint64_t period_ns = 0;     // its curve's (0: none yet)
  };
  // What a job's GPU cannot do without: its persistent memory, none for a
  // UM job (it pages). No budget or maximum goes below it.
  [[nodiscard]] static uint64_t must_stay(const JobGpu& gpu) {
    return gpu.pageable ? 0 : gpu.report.persistent_bytes;
  }
  struct Job {
    uint64_t id = 0;
    int fd = -1;        // -1: connection gone, waiting for the process to exit
    int pidfd = -1;
    wire::PeerCredentials peer;
    std::string name;
    std::vector<JobGpu> gpus;
    struct Waiting {
      uint32_t gpu = 0;
      uint64_t asked_ns = 0;  // when it arrived: the start of its grant wait (metrics)
    };
    std::unordered_map<uint64_t, Waiting> requests;  // waiting in the ledger, by request id
    proto::JobRunState state = proto::JobRunState::kRunning;
    bool gate_held = false;  // its waiting gate was refused by may_start (logged once)
    // Known only from the predecessor's state file until it reconnects.
    bool expected = false;
    std::vector<bool> expected_reservation_used;  // per GPU: the reservation was reconciled
    bool resumed = false;                          // registered with an id from an earlier daemon
    uint64_t expected_until_ns = 0;
    int state_slot = -1;
    bool audit_denied = false;  // its process may not be looked at (another uid's, daemon not root): said once
    // When its process may next be looked at for the chunks it gave back. A
    // look reads its /proc mappings and descriptors, which costs the daemon
    // time in proportion to them: a process is looked at for at most a
    // twentieth of the daemon's time, whatever it keeps open.
    uint64_t look_due_ns = 0;
    // The last look at its returns: when it ended, and the daemon's CPU time
    // it took (look_for_waiters spaces the looks it forces by it).
    uint64_t looked_at_ns = 0;
    uint64_t look_cost_ns = 0;
  };
  enum class Role : uint8_t { kNew, kJob, kAdmin };
  struct Connection {
    int fd = -1;
    wire::PeerCredentials peer;
    Role role = Role::kNew;
    uint64_t job = 0;
    uint64_t last_message_ns = 0;  // or when it was accepted
  };

  Impl(Driver& d, DaemonOptions o, LedgerOptions lo)
      : driver(d), options(std::move(o)), ledger(lo), gates(options.time_shift, SchedulerOptions{}) {}

  Driver& driver;
  DaemonOptions options;
  Ledger ledger;
  IterationGates gates;
  StateFile state_file;
  std::vector<Gpu> gpus;
  std::unordered_map<uint64_t, Job> jobs;
  std::unordered_map<int, Connection> connections;  // by fd
  std::unordered_map<int, uint64_t> pidfd_jobs;     // pidfd -> job whose connection ended
  // Reservations from the state file whose job did not come back in time:
  // kept (not counted) while its process lives, so that the job, if it does
  // come back, can be believed about what it holds where the driver cannot
  // tell (provable_holding).
  struct Lapsed {
    wire::PeerCredentials peer;
    int pidfd = -1;
    std::vector<uint64_t> held;  // per GPU, chunks
  };
  std::unordered_map<uint64_t, Lapsed> lapsed;
  int listen_fd = -1;
  int epoll_fd = -1;
  int timer_fd = -1;
  int gate_timer_fd = -1;  // fires when the next iteration gate opens
  int look_timer_fd = -1;  // fires when the next look at a process's returns is due (look_at_returns)
  int signal_fd = -1;
  int stop_fd = -1;  // eventfd-like pipe end for stop()
  int stop_write = -1;
  std::unique_ptr<MetricsServer> metrics;
  uint64_t next_metrics_ns = 0;
  std::unordered_map<int, Outbox> outboxes;  // by connection fd: what waits to be sent
  bool accept_paused = false;                // out of descriptors: the listener rests until the next tick
  uint64_t next_job_id = 1;
  uint64_t next_audit_ns = 0;
  bool audit_supported = true;  // false once the driver said it cannot tell
  uint64_t arrivals = 0;
  uint64_t start_ns = now_ns();
  EventCounts events;  // for the metrics only

  // --- setup ------------------------------------------------------------------
  Status setup(std::string* why);
  Status setup_metrics(std::string* why);
  // Renders the metrics for the scrapers when one waits, or a second passed.
  void publish_metrics(const proto::StatusReply& now_status, uint64_t now);
  void watch(int fd) const;
  void unwatch(int fd) const;

  // --- connections ------------------------------------------------------------
  void accept_connections();
  void on_readable(int fd);
  void on_writable(int fd);
  void expire_idle_connections(uint64_t now);
  void set_writable_watch(int fd, bool want);
  void close_connection(int fd, const std::string& reason, bool say_goodbye);
  void on_process_exit(int pidfd);
  void remove_job(uint64_t id, const char* why);
  // A job that cannot answer (its connection is gone, or it has not come
  // back after a restart) holds exactly its limits: never asked to reclaim,
  // never counted as a job that could free memory when deadlocks are looked for.
  void freeze(Job& job, bool frozen);
  bool send(int fd, const proto::Message& message, std::span<const int> fds = {});

  // --- messages ---------------------------------------------------------------
  // Each returns "" or the reason to close the connection.
  std::string on_message(Connection& connection, const proto::Message& message);
  std::string on_hello(Connection& connection, const proto::Hello& hello);
  std::string on_job_message(Job& job, const proto::Message& message);
  std::string on_return(Job& job, const proto::Return& ret);
  proto::StatusReply status() const;
  proto::Result set_budget(const Connection& connection, const proto::SetBudget& request);
  proto::Result control(const Connection& connection, const proto::JobControl& request);

  // --- restarts (state file) ---------------------------------------------------
  // Opens the state file and reserves what the last daemon's live jobs hold;
  // an error (*why) if the file cannot be used safely.
  Status load_state(std::string* why);
  // Writes what the job holds on `gpu` to the state file.
  void record_holding(Job& job, uint32_t gpu);
  void expire_expected();

  // --- time shift ---------------------------------------------------------------
  // Sends kProceed for every gate open by now and arms the gate timer.
  void open_gates();
  // GateGuard: Ledger::may_start (Ledger::turns_allow_start without the
  // start guard) / set_claim with the job's gate claims.
  bool may_start(JobId job) override;
  void starting(JobId job) override;
  uint64_t turn_wait_until_ns(JobId job, uint64_t now) override;
  // The job's gate claim on `gpu`, the peak raised to what it holds now
  // (our books run ahead of what the job counted while grants travel).
  std::pair<uint64_t, uint64_t> gate_claim(const Job& job, uint32_t gpu) const;
  // The other jobs that opened a GPU this job opened (Proceed.sharers).
  uint32_t sharers(const Job& job) const;
  std::string on_curve(Job& job, const proto::Curve& message);
  // A UM job can page out at its gate what its link moves in one of its
  // periods (gate_paging_bytes), in whole chunks: its gate is told.
  [[nodiscard]] uint64_t gate_paging_offered(const Job& job, uint32_t gpu) const;
  void apply_gate_paging(const Job& job, uint32_t gpu);
  // The ledger learns what each job pages at its gates now: the gates page
  // only where the jobs cannot co-run without it (TimeShiftScheduler::
  // peak_shortfall), which any job's curve, arrival or departure, or the
  // budget can change. Before every ledger decision.
  void sync_gate_paging();

  // --- lending ----------------------------------------------------------------
  void pump();
  // After serving: where a request still waits, the GPU's jobs are told
  // (MemoryWanted), each once per iteration, so that they give back what
  // their iterations free instead of keeping it to their gates.
  void tell_memory_wanted();
  // False if the chunks could not be made (the job is refused instead).
  bool grant(const LedgerAction& action);
  Status take_chunks(Gpu& gpu, uint32_t uid, uint64_t count, std::vector<uint32_t>* ids, std::string* why);
  Status zero(Gpu& gpu, PoolChunk& chunk);
  // Releases the free chunks' physical memory (all of them, or while the
  // pool is larger than the budget less what UM jobs may keep resident):
  // after a grant failed for want of memory or descriptors, after a budget
  // cut, and after a resident grant.
  void release_free(uint32_t gpu, bool beyond_budget_only);
  // A UM job's grant: no chunk, a share of the GPU for its pages.
  bool grant_resident(Job& job, const LedgerAction& action);
  // What UM jobs may keep resident on the GPU, in chunks.
  [[nodiscard]] uint64_t resident_chunks(uint32_t gpu) const;

  // --- audit ------------------------------------------------------------------
  // Compares each job's process's real holdings with what it was lent (see
  // daemon.h), every kAuditEveryNs.
  void audit(uint64_t now);
  // What a job that comes back without a reservation may count as held of
  // the `claimed` chunks: what its process is seen to hold, or, where the
  // driver cannot tell, what its lapsed reservation said, all of it without
  // a state file (nothing to check against), and none otherwise (a job of
  // the last daemon would have had a reservation).
  [[nodiscard]] uint64_t provable_holding(const Job& job, uint32_t gpu, uint64_t claimed);
  void audit_job(Job& job);
  void settle_excess(Job& job, uint32_t gpu, uint64_t excess_chunks);
  // Of `ids` (chunks `job` just gave back, or kept earlier), those its
  // process no longer holds go back to the pool; the rest stay in its
  // `kept`. All go back where the driver cannot tell chunk by chunk.
  void pool_what_was_let_go(Job& job, uint32_t gpu, const std::vector<uint32_t>& ids);
  // Chunks `job` gave back (maybe none): looked at now, with those that
  // waited, if a look at its process is due (those it still holds are
  // charged to it); otherwise held in its `unchecked`, charged in the
  // ledger, until its next request, return or tick after the look is due.
  void look_at_returns(Job& job, uint32_t gpu, std::vector<uint32_t> ids, uint64_t now);
  // Every tick, and when look_timer_fd fires: the unchecked returns whose
  // look is due.
  void look_at_unchecked_returns(uint64_t now);
  // Before the ledger serves: on a GPU where a request waits, every job's
  // unchecked returns are looked at now, due or not (a job's forced looks
  // spaced by three times a look's cost). They may be all the request waits
  // for, and while they count as held the ledger sees a jam and has a job
  // yield its memory to the host (a lone job did, at each iteration).
  void look_for_waiters(uint64_t now);
  // look_timer_fd at the earliest look due of a job with unchecked returns.
  void arm_look_timer();
  // A chunk back in the pool, last used by `uid`.
  void to_pool(Gpu& gpu, uint32_t id, uint32_t uid);
  // Tells the time-shift gates what the jobs' iterations may use of `gpu`:
  // its budget less what processes are charged for (memory kept beyond what
  // they were lent), which no schedule can move.
  void plan_gates_within_budget(uint32_t gpu);
  [[nodiscard]] uint64_t lent_chunks(const Job& job, uint32_t gpu) const;
  bool is_admin(const wire::PeerCredentials& peer) const;
  int gpu_of(const proto::GpuUuid& uuid) const;
};

}  // namespace zico::sharing
