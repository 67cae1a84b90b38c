// The node protocol: messages between zico-umd, job processes (libzicoum) and
// zico-umctl. docs/protocol.md is the normative description; this header is
// its C++ form.
//
// Transport: a Unix SOCK_SEQPACKET socket, so every message is one datagram
// and file descriptors (SCM_RIGHTS) travel with the message they belong to.
// Every datagram is a 16-byte header followed by the payload:
//
//   u32 magic 'ZICO' (0x4F43495A)  u16 version (4)  u16 type
//   u32 payload_bytes (== datagram size - 16, <= kMaxPayload)  u32 reserved (0)
//
// All integers are little-endian and fixed width; strings are u16 length +
// bytes (printable ASCII, at most kMaxString). A payload must be consumed
// exactly: trailing bytes are an error. Only kGrant carries descriptors, one
// per chunk id, in order; any other message with descriptors is malformed.
//
// Pure code: encoding and decoding know nothing of sockets (see wire.h), so
// the decoder can be fuzzed directly.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "demand_curve.h"

namespace zico::proto {

inline constexpr uint32_t kMagic = 0x4F43495A;  // "ZICO" little-endian
// 2: the time-shift messages (IterationMark, Curve, Proceed). 3: claims on Request.
// 4: claims on IterationMark (the iteration the job would begin).
// 7: Unified Memory jobs (OpenGpu.pageable, Report.floor_bytes, ResidentGrant,
//    JobStatus.pageable); GpuStatus.parks, denials and timeouts.
// 9: GpuStatus.device_total_bytes and device_used_bytes; Proceed.sharers.
// 10: MemoryWanted.
inline constexpr uint16_t kVersion = 10;
inline constexpr size_t kHeaderBytes = 16;
inline constexpr size_t kMaxPayload = 60 * 1024;
inline constexpr size_t kMaxString = 255;
// Chunk ids (and descriptors) per kGrant / kReturn message; below SCM_MAX_FD (253).
// Only kGrant carries descriptors.
inline constexpr size_t kMaxChunksPerMessage = 128;
// GPUs one message may list: a node's GPUs in a kStatus reply, a job's in
// an IterationMark's claims.
inline constexpr size_t kMaxGpus = 64;
// Entries in a kStatus reply.
inline constexpr size_t kMaxStatusGpus = kMaxGpus;
inline constexpr size_t kMaxStatusJobs = 256;

enum class Type : uint16_t {
  // job -> daemon
  kHello = 1,
  kOpenGpu = 2,
  kRequest = 3,
  kCancel = 4,
  kReturn = 5,
  kReport = 6,
  kJobState = 7,
  kIterationMark = 8,
  kCurve = 9,
  // daemon -> job
  kWelcome = 32,
  kGpuOpened = 33,
  kGrant = 34,
  kDeny = 35,
  kReclaim = 36,
  kYield = 37,
  kLimits = 38,
  kSuspend = 39,
  kResume = 40,
  kProceed = 41,
  kResidentGrant = 42,
  kMemoryWanted = 43,
  // zico-umctl <-> daemon
  kStatusQuery = 64,
  kStatus = 65,
  kSetBudget = 66,
  kResult = 67,
  kJobControl = 68,
  // daemon -> anyone, just before it closes a connection it cannot serve
  kGoodbye = 96,
};

// Identifies a GPU across processes whatever CUDA_VISIBLE_DEVICES says.
using GpuUuid = std::array<uint8_t, 16>;
// Its 32 lowercase hex digits, for logs and zico-umctl.
[[nodiscard]] std::string to_hex(const GpuUuid& uuid);

// --- job -> daemon -----------------------------------------------------------

// First message of a job connection. resume_job_id != 0: this job was
// registered with a daemon that went away and asks to keep its id.
struct Hello {
  uint64_t resume_job_id = 0;
  std::string name;  // e.g. the program name; informational
};

// The job starts using a GPU. held_chunks: chunks it already holds on it
// (after a daemon restart; 0 otherwise). They are counted as granted and
// have no id ("unowned"): returning one just lowers the count.
// pageable: a Unified Memory job (ZICO_MODE=um). Its memory is managed and
// pages; what the daemon lends it is how much may be on the GPU, counted in
// chunks that carry no memory: its requests are answered by kResidentGrant
// (no descriptors), and it gives back with kReturn's unowned count.
struct OpenGpu {
  GpuUuid uuid{};
  uint64_t held_chunks = 0;
  bool pageable = false;
};

// Asks for `chunks` more chunks of the GPU (the daemon's index).
// The claim (deadlock avoidance, see sharing/ledger.h): the most chunks the
// job expects to hold on the GPU before its current iteration ends, this
// request included, and what it expects to hold after it. 0 / 0: no claim
// (the job does not know its iteration yet). settle <= peak, and no settle
// without a peak.
struct Request {
  uint64_t request_id = 0;  // chosen by the job, unique per connection, != 0
  uint32_t gpu = 0;
  uint32_t chunks = 0;      // >= 1
  uint32_t claim_peak_chunks = 0;
  uint32_t claim_settle_chunks = 0;  // <= claim_peak_chunks
};

// Withdraws a waiting request (the job timed out). Answered by kDeny, or by
// the kGrant(s) already on their way.
struct Cancel {
  uint64_t request_id = 0;
};

// Gives chunks back, fenced (no GPU work of the job touches them any more).
// ids: daemon chunk ids; unowned: chunks without an id (see OpenGpu).
// reclaim_reply: this answers a kReclaim (possibly with nothing).
struct Return {
  uint32_t gpu = 0;
  bool reclaim_reply = false;
  uint32_t unowned = 0;
  std::vector<uint32_t> ids;  // at most kMaxChunksPerMessage, each != 0
};

// Periodic usage, for the scheduler, zico-umctl top and the metrics.
struct Report {
  uint32_t gpu = 0;
  uint64_t allocated_bytes = 0;   // live blocks
  uint64_t persistent_bytes = 0;  // live across the last iteration (low-water mark)
  uint64_t iterations = 0;        // iteration marks so far
  // A pageable GPU: the least it can run with on the GPU (its largest
  // kernel's working set so far; 0 before its first kernel). 0 otherwise.
  uint64_t floor_bytes = 0;
  // A pageable GPU: its pager's link to the host, bytes per second, for
  // what it pages out at its gate (gate_paging_bytes); 0: unknown, or not
  // pageable. At most kMaxLinkBytesPerSecond.
  uint64_t link_bytes_per_second = 0;
};
inline constexpr uint64_t kMaxLinkBytesPerSecond = uint64_t{10} * 1000 * 1000 * 1000 * 1000;  // 10 TB/s

// kFailed: the job could not do what it was asked and runs on: after a
// failed suspension with all its memory (it could not save it: a full or
// unwritable swap folder), after a failed resumption without the memory it
// could not restore (a corrupt swap file; allocations on that GPU fail).
// Its log says why.
enum class JobRunState : uint8_t { kRunning = 0, kSuspendRequested = 1, kSuspended = 2, kFailed = 3 };

// The job paused itself after a kSuspend (kSuspended: every chunk given
// back), runs again after a kResume (kRunning), or could not (kFailed).
struct JobState {
  JobRunState state = JobRunState::kRunning;
};

// The claim of the iteration a job would begin (deadlock avoidance, see
// sharing/ledger.h): the most chunks it expects to hold on the GPU before
// that iteration ends, and what it expects to hold after. Peak 0: unknown.
// settle <= peak, and no settle without a peak.
struct GateClaim {
  uint32_t gpu = 0;
  uint32_t peak_chunks = 0;
  uint32_t settle_chunks = 0;
};

// The job is at an iteration boundary (zico_mark_iteration, or one the
// allocator detected) and waits for kProceed with the same sequence number
// before it starts the iteration: the time-shift scheduler's gate. With
// zico-umd --start-guard on, the daemon also waits until starting that
// iteration, with these claims, leaves every job in mid-iteration able to
// finish (at most Ledger::kMaxGateBlockNs: a claim can be wrong).
struct IterationMark {
  uint64_t sequence = 0;          // increases by one per mark, from 1
  std::vector<GateClaim> claims{};  // at most kMaxGpus, no GPU twice; a GPU left out: unknown
};
// The job's learned memory pattern on a GPU (sharing/demand_curve.h), sent
// when it changes materially. period_ns 0: the job no longer has a pattern.
// Limits: period_ns <= kMaxCurvePeriodNs; bytes are clamped by the daemon to
// what the job may hold.
struct Curve {
  uint32_t gpu = 0;
  sharing::DemandCurve curve;
};
inline constexpr uint64_t kMaxCurvePeriodNs = 3'600'000'000'000;  // an hour

// --- daemon -> job -----------------------------------------------------------

struct Welcome {
  uint64_t job_id = 0;
};

// Answer to OpenGpu: the daemon's index for the GPU, the chunk size every
// request is counted in, the job's limits there and the GPU's budget (the
// most the job could hold, its maximum aside: what cudaMemGetInfo reports).
struct GpuOpened {
  uint32_t gpu = 0;
  uint64_t chunk_bytes = 0;
  uint64_t min_bytes = 0;
  uint64_t max_bytes = 0;
  uint64_t node_budget_bytes = 0;
};

// Chunks for a request, with one descriptor each. A request for more than
// kMaxChunksPerMessage chunks is answered by several grants; `last` marks
// the final one.
struct Grant {
  uint64_t request_id = 0;
  uint32_t gpu = 0;
  bool last = true;
  std::vector<uint32_t> ids;  // 1..kMaxChunksPerMessage, each != 0
};

// A pageable GPU's answer to a request (OpenGpu.pageable): the job may now
// keep `chunks` more chunks' worth of its pages on the GPU.
struct ResidentGrant {
  uint64_t request_id = 0;
  uint32_t gpu = 0;
  uint64_t chunks = 0;  // >= 1
};

// A request that will not be served. errc: zico::Errc value (kOutOfMemory
// for a deadlock victim or a request beyond every limit).
struct Deny {
  uint64_t request_id = 0;
  uint32_t errc = 0;
  std::string reason;
};

// Please give back up to `chunks` chunks of the GPU (idle ones); answer with
// kReturn{reclaim_reply = true}, even if empty.
struct Reclaim {
  uint32_t gpu = 0;
  uint64_t chunks = 0;
};

// A request waits for memory on the GPU (another job's, or this one's):
// until its next IterationMark the job gives back, as its iteration frees
// them, the idle chunks the rest of that iteration will not use (instead of
// keeping them to its gate). Sent at most once per iteration of the job.
struct MemoryWanted {
  uint32_t gpu = 0;
};

// Deadlock: the waiting request is withdrawn; the job must evict and return
// every chunk it holds on the GPU, then ask again for all it needs.
struct Yield {
  uint64_t request_id = 0;
  uint32_t gpu = 0;
};

// The job's limits on the GPU, or the GPU's budget, changed (zico-umctl
// budget set): sent to the job, or to every job that opened the GPU.
struct Limits {
  uint32_t gpu = 0;
  uint64_t min_bytes = 0;
  uint64_t max_bytes = 0;
  uint64_t node_budget_bytes = 0;
};

enum class StoreKind : uint8_t { kHost = 0, kNvme = 1 };

// zico-umctl suspend: at its next allocator call or iteration mark, the job
// fences its streams, evicts its memory to `to`, gives every chunk back,
// reports kJobState{kSuspended} and waits for kResume.
struct Suspend {
  StoreKind to = StoreKind::kHost;
};

// Restore (same addresses) and continue.
struct Resume {};
// The iteration announced by kIterationMark{sequence} may start now.
struct Proceed {
  uint64_t sequence = 0;
  // Other jobs on the GPUs this job opened, when its gate opened: with none,
  // the job keeps its idle chunks at its next gate (no one to give them to;
  // a reclaim still reaches them if a job comes).
  uint32_t sharers = 0;
};

// --- zico-umctl <-> daemon ---------------------------------------------------

struct StatusQuery {};

struct GpuStatus {
  uint32_t index = 0;
  GpuUuid uuid{};
  uint64_t chunk_bytes = 0;
  uint64_t budget_bytes = 0;
  uint64_t granted_bytes = 0;
  uint64_t pool_bytes = 0;      // chunks the daemon has created (granted or free)
  uint64_t waiting_bytes = 0;   // requested and not yet granted
  uint64_t grants = 0;          // chunks granted since start
  uint64_t reclaims = 0;        // chunks given back since start
  uint64_t deadlocks = 0;       // deadlocks broken since start
  uint64_t parks = 0;           // jobs parked in host memory for another's iteration (--turns)
  uint64_t denials = 0;         // requests refused
  uint64_t timeouts = 0;        // requests a job withdrew after its wait timeout
  // What the device itself reports (cuMemGetInfo from the daemon: every
  // process's memory and the contexts' own); 0 when it cannot tell. Unified
  // memory jobs may make it exceed the budget: the UVM driver keeps an
  // evicted page's memory until another allocation needs it.
  uint64_t device_total_bytes = 0;
  uint64_t device_used_bytes = 0;
};

struct JobStatus {
  uint64_t id = 0;
  uint32_t pid = 0;
  uint32_t uid = 0;
  uint32_t gpu = 0;
  std::string name;
  uint64_t granted_bytes = 0;
  uint64_t min_bytes = 0;
  uint64_t max_bytes = 0;
  uint64_t allocated_bytes = 0;
  uint64_t persistent_bytes = 0;
  uint64_t waiting_bytes = 0;
  uint64_t wait_ns = 0;         // total time spent waiting for chunks
  uint64_t iterations = 0;
  JobRunState state = JobRunState::kRunning;
  bool pageable = false;        // a UM job: it is lent resident bytes (OpenGpu.pageable)
};

// One JobStatus per (job, GPU) the job opened.
struct StatusReply {
  uint64_t daemon_pid = 0;
  uint64_t uptime_ns = 0;
  std::vector<GpuStatus> gpus;  // at most kMaxStatusGpus
  std::vector<JobStatus> jobs;  // at most kMaxStatusJobs
  uint64_t job_count = 0;       // jobs the daemon serves, listed or not
  uint64_t job_rows = 0;        // (job, GPU) rows it has: more than jobs.size() when the list was cut
};

enum class BudgetTarget : uint8_t { kNode = 0, kJobMin = 1, kJobMax = 2 };

struct SetBudget {
  BudgetTarget target = BudgetTarget::kNode;
  uint32_t gpu = 0;
  uint64_t job_id = 0;  // 0 for kNode
  uint64_t bytes = 0;
};

enum class JobAction : uint8_t { kSuspend = 0, kResume = 1 };

// zico-umctl suspend / resume. Answered by kResult once the job has been
// told (the state in kStatus shows when it has paused).
struct JobControl {
  JobAction action = JobAction::kSuspend;
  uint64_t job_id = 0;
  StoreKind to = StoreKind::kHost;  // kSuspend only
};

// Answer to kSetBudget and kJobControl: errc 0 on success, else a zico::Errc and why.
struct Result {
  uint32_t errc = 0;
  std::string message;
};

struct Goodbye {
  std::string reason;
};

using Message = std::variant<Hello, OpenGpu, Request, Cancel, Return, Report, Welcome, GpuOpened, Grant,
                             Deny, Reclaim, Yield, Limits, StatusQuery, StatusReply, SetBudget, Result,
                             Goodbye, JobState, Suspend, Resume, JobControl, IterationMark, Curve, Proceed,
                             ResidentGrant, MemoryWanted>;

[[nodiscard]] Type type_of(const Message& message);
[[nodiscard]] const char* to_string(Type type);

// Appends header + payload to *out. The message must satisfy the limits above
// (the encoder checks them too and returns false with *why set otherwise).
[[nodiscard]] bool encode(const Message& message, std::vector<uint8_t>* out, std::string* why);

// Decodes one whole datagram. `fd_count`: descriptors that came with it.
// On failure returns false and *why names the offending field and value.
[[nodiscard]] bool decode(std::span<const uint8_t> datagram, size_t fd_count, Message* out,
                          std::string* why);

}  // namespace zico::proto
