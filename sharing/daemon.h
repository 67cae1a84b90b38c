// Daemon: the core of zico-umd, one per node, all GPUs.
//
// It owns a pool of physical chunks per GPU (created with the driver as
// POSIX-fd exportable memory, never mapped except to zero one), lends them to
// job processes over a Unix socket (descriptors with SCM_RIGHTS) as the
// Ledger decides, and takes them back. One thread, one epoll loop: the
// listening socket, every connection, the pidfds of jobs whose connection
// ended, a 50 ms timer (reclaim retries), the metrics listener.
//
// Safety rules:
//  - A chunk returns to the free pool only when the job gives it back
//    (fenced on its side) or the job's process has exited: when a job's
//    connection ends while its process lives (it may still have the chunks
//    mapped), its holdings stay counted until its pidfd says it is gone. A
//    chunk given back that the process still maps or keeps a descriptor of
//    (Driver::process_holds, asked before anything more is lent) stays out
//    of the pool, charged to the job, until the audit sees it let go: the
//    jobs never map more physical memory than the budget. Where the driver
//    cannot tell (CUDA), it goes back to the pool at once.
//  - A UM job's grants are pages it may keep on the GPU, which no look at
//    its process can prove: one that registers claiming some is booked no
//    more than the budget has free, and told to page the rest out.
//  - Physical memory never passes from one uid to another. A process can
//    keep a chunk mapped after it said it gave it back, and nothing takes a
//    mapping away; so a returned chunk is lent again only to the same uid,
//    and another uid gets memory created afresh (zeroed) while the old
//    handle is released. A periodic audit (Driver::process_memory) compares
//    what each job's process really holds with what it was lent: the excess
//    is charged to that job in the books, so the budget stays true of the
//    GPU, and the job is refused or killed (DaemonOptions::overuse).
//  - A bad message closes that one connection, with a Goodbye naming why and
//    a log line; nothing else changes.
//  - Every job is watched through a pidfd; a process the daemon cannot
//    watch (no pidfd_open, another pid namespace) is refused, since the
//    daemon could not tell when its chunks are free again.
//  - Restarts: a new daemon cannot see what jobs hold until they reconnect,
//    and must not lend that memory meanwhile. So the daemon keeps each job's
//    exact holdings in the state file (state_file.h), written before a grant
//    is sent and after a return. Its successor reserves them for jobs whose
//    processes live, until each reconnects (then its own report counts),
//    exits, or stays away for 5 s. A job that cannot answer (detached or not
//    back yet) is frozen in the ledger: never asked to reclaim, not part of
//    a deadlock.
//  - Changing a node budget needs root, the daemon's own uid or the admin
//    group; changing a job's limits needs that, or the job's own uid.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "driver.h"
#include "iteration_gates.h"
#include "ledger.h"
#include "protocol.h"
#include "status.h"

namespace zico::sharing {

struct DaemonGpuConfig {
  DeviceId device;
  uint64_t budget_bytes = 0;  // rounded down to whole chunks
};

// What happens to a job whose process holds more of a GPU than it was lent.
// Its excess is charged to it in any case.
enum class OveruseAction : uint8_t {
  kWarn,  // logged
  kDeny,  // logged, and its requests are refused while it lasts
  kKill,  // logged, and its process is killed (SIGKILL)
};

struct DaemonOptions {
  std::string socket_path;
  mode_t socket_mode = 0660;
  gid_t socket_group = static_cast<gid_t>(-1);  // -1: the daemon's group
  gid_t admin_group = static_cast<gid_t>(-1);   // -1: only root and the daemon's uid
  size_t chunk_bytes = 0;                       // 0: each GPU's granularity
  std::vector<DaemonGpuConfig> gpus;            // the GPUs to manage
  DeadlockPolicy deadlock_policy = DeadlockPolicy::kYield;
  // Time-shift scheduling (iteration_gates.h): jobs' iteration starts are
  // delayed so their memory peaks do not coincide, and while a start could
  // leave a job in mid-iteration unable to finish (Ledger::may_start, for at
  // most Ledger::kMaxGateBlockNs). false: every iteration starts at once and
  // chunks are served first come, first served.
  bool time_shift = true;
  // With time shift: a gate whose time has come also waits (at most
  // Ledger::kMaxGateBlockNs) while Ledger::may_start says the iteration
  // could leave a job in mid-iteration unable to finish, as the simulator
  // does. Off by default: in zico-demo it cost throughput and did not lower
  // the deadlocks (docs/benchmarks.md), the live claims being rougher than
  // the simulator's.
  bool start_guard = false;
  // With time shift: turns (ledger.h) for jobs that cannot run side by side,
  // below the fixed-offset bound. A gate refused for want of room tells the
  // ledger the peak it waits for; the job in its way, waiting at its own
  // gate, is suspended to host memory (kPark: Suspend) and resumed when its
  // time is up (kResume: Resume). Without it such jobs meet in mid-iteration
  // and a deadlock yield decides, every iteration.
  bool turns = false;
  bool zero_new_chunks = true;                  // false where fresh chunks are known to be zero (SimDriver)
  OveruseAction overuse = OveruseAction::kDeny;
  std::string metrics_address;                  // "HOST:PORT" or ""
  // Where the daemon keeps, for its successor, an upper bound of what each
  // live job holds (see "Restarts" above); "" keeps nothing.
  std::string state_path;
};

class Daemon {
 public:
  // Binds the socket (and the metrics port) and prepares the GPUs. *why
  // explains a failure (socket in use, bad budget, metrics port taken...).
  [[nodiscard]] static Status create(Driver& driver, const DaemonOptions& options, std::unique_ptr<Daemon>* out,
                                     std::string* why);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Serves until stop() (or SIGINT/SIGTERM when handle_signals is true).
  [[nodiscard]] Status run(bool handle_signals);
  // Thread-safe and async-signal-safe.
  void stop();

  // The port the metrics listener got ("HOST:0" picks one), 0 if none.
  [[nodiscard]] uint16_t metrics_port() const;

  struct Impl;

 private:
  explicit Daemon(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zico::sharing
