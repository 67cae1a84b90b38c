#include "sim_driver.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <new>
#include <thread>
#include <unordered_map>
#include <vector>

#include "host_memory.h"
#include "log.h"
#include "sim_device_board.h"
#include "sim_timeline.h"
#include "sizes.h"

namespace zico {
namespace {

constexpr uintptr_t kFirstObjectId = 0x51a0'0000'0000;  // far from 0/1/2 (special CUDA streams)

struct Chunk {
  int fd = -1;  // -1 once released
  size_t bytes = 0;
  DeviceId device{};
  bool imported = false;
  uint32_t map_count = 0;
  uint64_t inode = 0;  // the memfd's: what /proc/PID/maps names it by (process_holds)
};

uint64_t inode_of(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

struct Mapping {
  size_t bytes = 0;
  uint64_t chunk = 0;
  bool accessible = false;
};

struct Reservation {
  size_t bytes = 0;
  DeviceId device{};
};

// One unit of queued stream work, with the device ranges it touches so that
// an unmap racing it can be caught.
struct PendingOp {
  std::function<void()> run;
  std::array<VaRange, 2> touched{};
};

struct SimStream {
  DeviceId device{};
  bool held = false;
  std::deque<PendingOp> queue;
  uint64_t enqueued = 0;
  uint64_t completed = 0;
};

struct SimEvent {
  DeviceId device{};
  uintptr_t stream = 0;
  uint64_t sequence = 0;  // complete once the stream has completed this many ops
};

Status os_error() { return Status(Errc::kOsError, errno); }

// What SimOptions::capturing_stream makes of `stream` (stream_capture_state).
CaptureState sim_capture_state(uintptr_t capturing_stream, uintptr_t stream) {
  if (capturing_stream == 0) return CaptureState::kNone;
  if (stream == capturing_stream) return CaptureState::kCapturing;
  return stream <= 1 ? CaptureState::kBlocked : CaptureState::kNone;
}

// A chunk's memfd is named after its device, so that what a process holds
// of one device can be told from /proc (process_memory).
std::string chunk_name(DeviceId device) { return "zicoum-sim-chunk-" + std::to_string(device.value); }

// The tag the calling thread's kernels carry into fault reports (tag_work):
// the simulated kernels run on the thread that launches them.
thread_local uint64_t t_work_tag = 0;

}  // namespace

struct SimDriver::State {
  std::mutex mutex;
  std::map<uintptr_t, Reservation> reservations;
  std::map<uintptr_t, Mapping> mappings;
  std::unordered_map<uint64_t, Chunk> chunks;
  std::unique_ptr<SimManagedMemory> managed;  // device 0's unified memory
  std::unique_ptr<SimDeviceBoard> board;      // the devices' memory shared with other processes, if any
  SimTimeline timeline;  // the modelled clocks of host threads and streams (unified memory's work)
  std::map<uintptr_t, size_t> pinned;  // host_register()ed ranges
  std::unordered_map<uintptr_t, SimStream> streams;
  std::unordered_map<uintptr_t, SimEvent> events;
  std::vector<size_t> created_bytes;  // per device
  // The host's memory as last read (host_memory.h), less what was created
  // since: read again when that estimate nears the reserve, or 10 ms after
  // the last reading (other processes take memory too, and chunks are
  // written after they are created). A chunk's memory costs the host only
  // once touched, and a reading already counts every touched page, so a
  // reading forgets what was created before it: mapped but untouched memory
  // (an allocator's idle chunks, a replay's) never counts as used. Between
  // readings what is created counts in full, as if touched at once.
  HostMemory host;
  std::chrono::steady_clock::time_point host_read_at;
  bool host_refusal_said = false;

  // Would creating `bytes` more leave the host less than `reserve`
  // (host_reserve(): 5 % of its total, at least 512 MiB, if 0)? The host
  // is read under `root` (host_memory.h; "" for this machine).
  bool host_would_run_low(uint64_t bytes, uint64_t reserve, const std::string& root, HostMemory* seen) {
    const auto now = std::chrono::steady_clock::now();
    if (!host.known || now - host_read_at > std::chrono::milliseconds(10) ||
        host.available_bytes < host_reserve(reserve) + bytes + (uint64_t{256} << 20)) {
      host = read_host_memory(root);
      host_read_at = now;
      if (!host.known) return false;  // unknown: do not guess
    }
    *seen = host;
    if (host.available_bytes < host_reserve(reserve) + bytes) return true;
    host.available_bytes -= bytes;
    return false;
  }
  uint64_t host_reserve(uint64_t reserve) const {
    return reserve != 0 ? reserve : std::max<uint64_t>(host.total_bytes / 20, uint64_t{512} << 20);
  }
  uintptr_t next_id = kFirstObjectId;
  std::array<uint64_t, static_cast<size_t>(SimOp::kCount)> calls{};
  std::array<uint64_t, static_cast<size_t>(SimOp::kCount)> fail_at{};
  std::array<Errc, static_cast<size_t>(SimOp::kCount)> fail_error{};
  SimCounters counters;
  // Fault reports (start_fault_reports): off until started; at most
  // kMaxFaultReports kept between takes, the rest dropped and counted.
  bool reporting_faults = false;
  std::vector<ManagedFault> fault_reports;
  uint64_t dropped_fault_reports = 0;
  std::vector<uintptr_t> faulted_scratch;
  static constexpr size_t kMaxFaultReports = size_t{1} << 20;

  // Runs a kernel on device 0's unified memory, reporting what it faulted in under `tag`.
  // Host memory for the reports running out drops them (counted), never
  // the kernel: this runs inside noexcept calls (a copy's stream work).
  Status run_managed(std::span<const VaRange> ranges, uint64_t duration_ns, uint64_t limit, uint64_t tag,
                     uint64_t start_ns) {
    sync_board();
    faulted_scratch.clear();
    if (reporting_faults) {
      try {
        faulted_scratch.reserve(faulted_scratch.size() + page_count(ranges));
      } catch (const std::bad_alloc&) {
        ++dropped_fault_reports;
      }
    }
    const bool report = reporting_faults && faulted_scratch.capacity() >= page_count(ranges);
    Status status = managed->run_kernel(ranges, duration_ns, limit, start_ns, report ? &faulted_scratch : nullptr);
    for (const uintptr_t address : faulted_scratch) {
      if (fault_reports.size() >= kMaxFaultReports) {
        ++dropped_fault_reports;
        continue;
      }
      try {
        fault_reports.push_back(ManagedFault{tag, address});
      } catch (const std::bad_alloc&) {
        ++dropped_fault_reports;
      }
    }
    sync_board();
    return status;
  }
  // An upper bound on the pages `ranges` span.
  size_t page_count(std::span<const VaRange> ranges) const {
    size_t pages = 0;
    for (const VaRange& range : ranges) pages += range.bytes / managed->page_bytes() + 2;
    return pages;
  }

  Status take_fault(SimOp op) {
    const auto i = static_cast<size_t>(op);
    ++calls[i];
    if (fail_at[i] != 0 && calls[i] == fail_at[i]) {
      fail_at[i] = 0;
      return Status(fail_error[i]);
    }
    return Status::ok();
  }

  void free_if_unused(uint64_t id) {
    auto it = chunks.find(id);
    if (it == chunks.end() || it->second.fd >= 0 || it->second.map_count != 0) return;
    if (!it->second.imported) {
      created_bytes[static_cast<size_t>(it->second.device.value)] -= it->second.bytes;
      counters.created_bytes -= it->second.bytes;
    }
    --counters.live_chunks;
    chunks.erase(it);
    sync_board();
  }

  // True when `range` lies inside one managed allocation.
  bool in_managed(VaRange range) const { return managed->contains(range); }

  // What device 0 may hold of managed pages: its capacity less its chunks
  // and what other processes on the board hold.
  uint64_t managed_limit(size_t capacity) const {
    if (created_bytes.empty()) return 0;
    const uint64_t taken = created_bytes[0] + others_held(0);
    return capacity > taken ? capacity - taken : 0;
  }

  // What the other processes on the board hold of `device` (0 without one).
  uint64_t others_held(size_t device) const { return board ? board->others_held(static_cast<int>(device)) : 0; }

  // Gives up what other processes took of the managed pages' memory, then
  // publishes what this driver holds on each device.
  void sync_board() {
    if (!board) return;
    if (const uint64_t taken = board->taken_from_me(0); taken != 0) managed->give_up(taken);
    for (size_t d = 0; d < created_bytes.size(); ++d) {
      const uint64_t managed_bytes = d == 0 ? managed->chunk_bytes() : 0;
      const uint64_t unused = d == 0 ? managed->chunk_bytes() - managed->resident_bytes() : 0;
      board->publish(static_cast<int>(d), created_bytes[d] + managed_bytes, managed_bytes, unused);
    }
  }

  // Device work on managed memory brings it to the device first, as a
  // kernel's access would (no compute time of its own).
  Status touch_managed(std::array<VaRange, 2> ranges, size_t capacity) {
    std::array<VaRange, 2> used{};
    size_t n = 0;
    for (const VaRange& range : ranges) {
      if (range.bytes != 0 && in_managed(range)) used[n++] = range;
    }
    if (n == 0) return Status::ok();
    // A copy is no tagged op: what it brings in is reported untagged.
    return run_managed(std::span<const VaRange>(used.data(), n), 0, managed_limit(capacity), 0, 0);
  }

  // The device whose reservation holds `addr`; -1 where none does.
  int reserved_on(uintptr_t addr) const {
    auto it = reservations.upper_bound(addr);
    if (it == reservations.begin()) return -1;
    --it;
    return addr - it->first < it->second.bytes ? it->second.device.value : -1;
  }

  // True when [addr, addr+bytes) is managed memory or fully covered by
  // contiguous, accessible mappings.
  bool device_range_ok(uintptr_t addr, size_t bytes) const {
    if (bytes == 0) return true;
    if (in_managed(VaRange{addr, bytes})) return true;
    auto it = mappings.upper_bound(addr);
    if (it == mappings.begin()) return false;
    --it;
    uintptr_t cursor = addr;
    const uintptr_t end = addr + bytes;
    while (it != mappings.end() && it->first <= cursor && cursor < it->first + it->second.bytes) {
      if (!it->second.accessible) return false;
      cursor = it->first + it->second.bytes;
      if (cursor >= end) return true;
      ++it;
    }
    return false;
  }

  bool pending_work_touches(VaRange range) const {
    for (const auto& [id, stream] : streams) {
      for (const PendingOp& op : stream.queue) {
        for (const VaRange& touched : op.touched) {
          if (touched.bytes != 0 && touched.overlaps(range)) return true;
        }
      }
    }
    return false;
  }

  void drain(SimStream& stream, uint64_t up_to) {
    while (stream.completed < up_to && !stream.queue.empty()) {
      stream.queue.front().run();
      stream.queue.pop_front();
      ++stream.completed;
    }
  }

  // Runs `op` now unless its stream is held; returns true if it ran.
  bool enqueue(StreamHandle stream, PendingOp op) {
    auto it = streams.find(stream.value);
    if (it == streams.end()) {
      op.run();
      return true;
    }
    ++it->second.enqueued;
    if (it->second.held) {
      it->second.queue.push_back(std::move(op));
      return false;
    }
    op.run();
    ++it->second.completed;
    return true;
  }
};

SimDriver::SimDriver(const SimOptions& options) : state_(std::make_unique<State>()), options_(options) {
  state_->managed = std::make_unique<SimManagedMemory>(
      options.managed_page_bytes != 0 ? options.managed_page_bytes : options.granularity, options.managed_costs);
  state_->created_bytes.assign(static_cast<size_t>(std::max(options.device_count, 0)), 0);
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &limit);
  }
}

SimDriver::~SimDriver() {
  for (auto& [id, chunk] : state_->chunks) {
    if (chunk.fd >= 0) close(chunk.fd);
  }
  for (auto& [base, reservation] : state_->reservations) munmap(reinterpret_cast<void*>(base), reservation.bytes);
}

void SimDriver::inject_failure(SimOp op, uint64_t nth, Errc error) {
  std::lock_guard lock(state_->mutex);
  const auto i = static_cast<size_t>(op);
  state_->fail_at[i] = nth == 0 ? 0 : state_->calls[i] + nth;
  state_->fail_error[i] = error;
}

void SimDriver::hold_stream(StreamHandle stream) {
  std::lock_guard lock(state_->mutex);
  auto it = state_->streams.find(stream.value);
  if (it != state_->streams.end()) it->second.held = true;
}

Status SimDriver::release_stream(StreamHandle stream) {
  std::lock_guard lock(state_->mutex);
  auto it = state_->streams.find(stream.value);
  if (it == state_->streams.end()) return Status(Errc::kInvalidArgument);
  it->second.held = false;
  state_->drain(it->second, it->second.enqueued);
  return Status::ok();
}

SimCounters SimDriver::counters() const {
  std::lock_guard lock(state_->mutex);
  return state_->counters;
}

Status SimDriver::device_count(int* count) noexcept {
  *count = options_.device_count;
  return Status::ok();
}

Status SimDriver::current_device(DeviceId* out) noexcept {
  *out = DeviceId{0};
  return Status::ok();
}

#define ZICO_SIM_CHECK_DEVICE(device)                                           \
  do {                                                                          \
    if ((device).value < 0 || (device).value >= options_.device_count)          \
      return Status(Errc::kNoDevice, (device).value);                           \
  } while (0)

Status SimDriver::capabilities(DeviceId device, Capabilities* caps) noexcept {
  ZICO_SIM_CHECK_DEVICE(device);
  caps->virtual_memory = true;
  caps->granularity = options_.granularity;
  caps->total_memory = options_.capacity;
  caps->posix_fd_export = options_.posix_fd_export;
  caps->managed_memory = true;
  caps->concurrent_managed_access = options_.concurrent_managed_access;
  caps->discard = options_.discard;
  caps->discard_releases_device_pages = options_.discard;  // as the UVM driver's (sim_managed.h)
  static constexpr char kName[] = "zicoum-sim-gpu";
  caps->uuid.fill(0);
  std::memcpy(caps->uuid.data(), kName, sizeof kName - 1);
  caps->uuid[15] = static_cast<uint8_t>(device.value);
  return Status::ok();
}

Status SimDriver::memory_info(DeviceId device, size_t* free_bytes, size_t* total_bytes) noexcept {
  ZICO_SIM_CHECK_DEVICE(device);
  std::lock_guard lock(state_->mutex);
  *total_bytes = options_.capacity;
  // Managed pages' chunks count whether in use or not, as the UVM driver's
  // kept root chunks do in cudaMemGetInfo.
  state_->sync_board();
  const auto d = static_cast<size_t>(device.value);
  const uint64_t used = state_->created_bytes[d] + (d == 0 ? state_->managed->chunk_bytes() : 0) + state_->others_held(d);
  *free_bytes = options_.capacity > used ? options_.capacity - used : 0;
  return Status::ok();
}

Status SimDriver::reserve(DeviceId device, size_t bytes, size_t alignment, VaRange* out) noexcept {
  ZICO_SIM_CHECK_DEVICE(device);
  const size_t align = alignment == 0 ? options_.granularity : alignment;
  if (bytes == 0 || bytes % options_.granularity != 0 || (align & (align - 1)) != 0 || align < options_.granularity) {
    return Status(Errc::kInvalidArgument);
  }
  std::lock_guard lock(state_->mutex);
  ZICO_RETURN_IF_ERROR(state_->take_fault(SimOp::kReserve));
  // Over-reserve, then trim, so the base is aligned as CUDA would align it.
  void* raw = mmap(nullptr, bytes + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return errno == ENOMEM ? Status(Errc::kOutOfMemory, ENOMEM) : os_error();
  const auto start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t base = (start + align - 1) & ~(uintptr_t{align} - 1);
  if (base > start) munmap(raw, base - start);
  const uintptr_t tail = start + bytes + align - (base + bytes);
  if (tail > 0) munmap(reinterpret_cast<void*>(base + bytes), tail);
  state_->reservations[base] = Reservation{bytes, device};
  *out = VaRange{base, bytes};
  return Status::ok();
}

Status SimDriver::unreserve(VaRange range) noexcept {
  std::lock_guard lock(state_->mutex);
  auto it = state_->reservations.find(range.base);
  if (it == state_->reservations.end() || it->second.bytes != range.bytes) return Status(Errc::kInvalidArgument);
  auto m = state_->mappings.lower_bound(range.base);
  if (m != state_->mappings.end() && m->first < range.end()) return Status(Errc::kInvalidArgument);
  munmap(range.ptr(), range.bytes);
  state_->reservations.erase(it);
  return Status::ok();
}

Status SimDriver::refuse_if_host_runs_low(DeviceId device, size_t bytes) {
  HostMemory host;
  if (!state_->host_would_run_low(bytes, options_.host_reserve_bytes, options_.host_memory_root, &host)) {
    return Status::ok();
  }
  if (!state_->host_refusal_said) {
    state_->host_refusal_said = true;
    ZICO_LOG(kError,
             "sim device %d: refusing %s more of simulated device memory: the host has %s available of %s (its "
             "memory cgroup's limit, if lower), and keeps %s free (simulated memory is host memory; set a budget, "
             "or ZICO_SIM_CAPACITY, below it)",
             device.value, format_size(bytes).c_str(), format_size(host.available_bytes).c_str(),
             format_size(host.total_bytes).c_str(), format_size(state_->host_reserve(options_.host_reserve_bytes)).c_str());
  }
  return Status(Errc::kOutOfMemory, ENOMEM);
}

Status SimDriver::host_room(DeviceId device, size_t bytes) noexcept {
  ZICO_SIM_CHECK_DEVICE(device);
  std::lock_guard lock(state_->mutex);
  return refuse_if_host_runs_low(device, bytes);
}

Status SimDriver::create(DeviceId device, size_t bytes, PhysHandle* out) noexcept {
  ZICO_SIM_CHECK_DEVICE(device);
  if (bytes == 0 || bytes % options_.granularity != 0) return Status(Errc::kInvalidArgument);
  std::lock_guard lock(state_->mutex);
  ZICO_RETURN_IF_ERROR(state_->take_fault(SimOp::kCreate));
  size_t& used = state_->created_bytes[static_cast<size_t>(device.value)];
  ZICO_RETURN_IF_ERROR(refuse_if_host_runs_low(device, bytes));  // before any memory is taken for it
  state_->sync_board();
  const auto d = static_cast<size_t>(device.value);
  // What the device would hold beyond its capacity with the chunk: by this
  // process or (on a board) others, whose figures may run ahead of the
  // capacity for a moment (each publishes after its own call).
  auto beyond = [&]() -> uint64_t {
    const uint64_t held = used + (d == 0 ? state_->managed->chunk_bytes() : 0) + state_->others_held(d) + bytes;
    return held > options_.capacity ? held - options_.capacity : 0;
  };
  if (d == 0 && beyond() != 0) {
    // Managed pages' memory is taken, as the UVM driver's eviction hands its
    // root chunks to another allocation: the unused first (this process's,
    // then others'), then chunks in use, whose pages are evicted (this
    // process's now, others' at their next call). Only when that makes room
    // enough: a refused chunk takes nothing.
    SimManagedMemory& managed = *state_->managed;
    SimDeviceBoard* board = state_->board.get();
    const uint64_t short_by = beyond();
    if (short_by <= managed.chunk_bytes() + (board != nullptr ? board->others_managed(0) : 0)) {
      uint64_t taken = managed.release_unused(short_by);
      if (taken < short_by && board != nullptr) taken += board->take_unused(0, short_by - taken);
      if (taken < short_by) {
        const uint64_t before = managed.chunk_bytes();
        managed.give_up(short_by - taken);
        taken += before - managed.chunk_bytes();
      }
      if (taken < short_by && board != nullptr) (void)board->take_managed(0, short_by - taken);
    }
  }
  // A refusal after memory was taken for the chunk publishes what this
  // process holds now, so that what it gave up is free at once.
  const auto refuse = [&](Status status) {
    state_->sync_board();
    return status;
  };
  if (beyond() != 0) return refuse(Status(Errc::kOutOfMemory));
  const int fd = memfd_create(chunk_name(device).c_str(), MFD_CLOEXEC);
  if (fd < 0) return refuse(errno == EMFILE || errno == ENFILE ? Status(Errc::kOutOfMemory, errno) : os_error());
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const Status status = os_error();
    close(fd);
    return refuse(status);
  }
  const uint64_t id = state_->next_id++;
  state_->chunks[id] = Chunk{fd, bytes, device, false, 0, inode_of(fd)};
  used += bytes;
  ++state_->counters.creates;
  ++state_->counters.live_chunks;
  state_->counters.created_bytes += bytes;
  state_->sync_board();
  state_->timeline.spend(options_.managed_costs.chunk_create_ns);
  *out = PhysHandle{id};
  return Status::ok();
}

Status SimDriver::share_devices(const std::string& board_path, std::string* why) {
  std::unique_ptr<SimDeviceBoard> board;
  ZICO_RETURN_IF_ERROR(SimDeviceBoard::open(board_path, &board, why));
  std::lock_guard lock(state_->mutex);
  state_->board = std::move(board);
  SimDeviceBoard* shared = state_->board.get();
  // Only whole requests: a page takes another's unused memory when there is enough of it.
  state_->managed->set_lender([shared](uint64_t bytes) -> uint64_t {
    return shared->others_unused(0) >= bytes ? shared->take_unused(0, bytes) : 0;
  });
  state_->sync_board();
  return Status::ok();
}

Status SimDriver::release(PhysHandle handle) noexcept {
  std::lock_guard lock(state_->mutex);
  auto it = state_->chunks.find(handle.value);
  if (it == state_->chunks.end() || it->second.fd < 0) return Status(Errc::kInvalidArgument);
  close(it->second.fd);
  it->second.fd = -1;
  ++state_->counters.releases;
  state_->free_if_unused(handle.value);
  state_->timeline.spend(options_.managed_costs.chunk_release_ns);
  return Status::ok();
}

Status SimDriver::map(VaRange range, PhysHandle handle) noexcept {
  if (range.bytes == 0 || range.base % options_.granularity != 0) return Status(Errc::kInvalidArgument);
  std::lock_guard lock(state_->mutex);
  State& s = *state_;
  auto chunk = s.chunks.find(handle.value);
  if (chunk == s.chunks.end() || chunk->second.fd < 0 || chunk->second.bytes != range.bytes) {
    return Status(Errc::kInvalidArgument);
  }
  auto res = s.reservations.upper_bound(range.base);
  if (res == s.reservations.begin()) return Status(Errc::kInvalidArgument);
  --res;
  if (!VaRange{res->first, res->second.bytes}.contains(range)) return Status(Errc::kInvalidArgument);
  auto next = s.mappings.lower_bound(range.base);
  if (next != s.mappings.end() && next->first < range.end()) return Status(Errc::kInvalidArgument);
  if (next != s.mappings.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.bytes > range.base) return Status(Errc::kInvalidArgument);
  }
  ZICO_RETURN_IF_ERROR(s.take_fault(SimOp::kMap));
  void* at = mmap(range.ptr(), range.bytes, PROT_NONE, MAP_SHARED | MAP_FIXED, chunk->second.fd, 0);
  if (at == MAP_FAILED) return os_error();
  s.mappings[range.base] = Mapping{range.bytes, handle.value, false};
  ++chunk->second.map_count;
  ++s.counters.maps;
  s.timeline.spend(options_.managed_costs.chunk_map_ns);
  return Status::ok();
}

Status SimDriver::set_access(DeviceId device, VaRange range) noexcept {
  ZICO_SIM_CHECK_DEVICE(device);
  std::lock_guard lock(state_->mutex);
  State& s = *state_;
  auto it = s.mappings.find(range.base);
  uintptr_t cursor = range.base;
  for (; it != s.mappings.end() && it->first == cursor && cursor < range.end(); ++it) {
    cursor += it->second.bytes;
  }
  if (cursor != range.end()) return Status(Errc::kInvalidArgument);
  if (mprotect(range.ptr(), range.bytes, PROT_READ | PROT_WRITE) != 0) return os_error();
  uint64_t covered = 0;
  for (it = s.mappings.find(range.base); it != s.mappings.end() && it->first < range.end(); ++it) {
    it->second.accessible = true;
    ++covered;
  }
  ++s.counters.set_accesses;
  s.timeline.spend(options_.managed_costs.chunk_access_ns * covered);
  return Status::ok();
}

Status SimDriver::unmap(VaRange range) noexcept {
  std::lock_guard lock(state_->mutex);
  State& s = *state_;
  std::vector<std::map<uintptr_t, Mapping>::iterator> covered;
  uintptr_t cursor = range.base;
  for (auto it = s.mappings.find(range.base); it != s.mappings.end() && it->first == cursor && cursor < range.end();
       ++it) {
    covered.push_back(it);
    cursor += it->second.bytes;
  }
  if (covered.empty() || cursor != range.end()) return Status(Errc::kInvalidArgument);
  if (options_.require_fence_before_unmap && s.pending_work_touches(range)) return Status(Errc::kFenceViolation);
  // Put the reservation back in place of the mapping.
  void* at = mmap(range.ptr(), range.bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  if (at == MAP_FAILED) return os_error();
  for (auto it : covered) {
    const uint64_t chunk = it->second.chunk;
    s.mappings.erase(it);
    --s.chunks[chunk].map_count;
    ++s.counters.unmaps;
    s.free_if_unused(chunk);
  }
  s.timeline.spend(options_.managed_costs.chunk_unmap_ns * covered.size());
  return Status::ok();
}

Status SimDriver::export_fd(PhysHandle handle, int* fd) noexcept {
  if (!options_.posix_fd_export) return Status(Errc::kNotSupported);
  std::lock_guard lock(state_->mutex);
  auto it = state_->chunks.find(handle.value);
  if (it == state_->chunks.end() || it->second.fd < 0) return Status(Errc::kInvalidArgument);
  const int copy = fcntl(it->second.fd, F_DUPFD_CLOEXEC, 0);
  if (copy < 0) return os_error();
  *fd = copy;
  return Status::ok();
}

Status SimDriver::import_fd(int fd, PhysHandle* out) noexcept {
  if (!options_.posix_fd_export) return Status(Errc::kNotSupported);
  std::lock_guard lock(state_->mutex);
  ZICO_RETURN_IF_ERROR(state_->take_fault(SimOp::kImport));
  struct stat st {};
  if (fstat(fd, &st) != 0) return Status(Errc::kInvalidArgument, errno);
  const auto bytes = static_cast<size_t>(st.st_size);
  if (bytes == 0 || bytes % options_.granularity != 0) return Status(Errc::kInvalidArgument);
  const int copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (copy < 0) return os_error();
  const uint64_t id = state_->next_id++;
  state_->chunks[id] = Chunk{copy, bytes, DeviceId{0}, true, 0, static_cast<uint64_t>(st.st_ino)};
  ++state_->counters.imports;
  ++state_->counters.live_chunks;
  *out = PhysHandle{id};
  return Status::ok();
}

Status SimDriver::stream_create(DeviceId device, StreamHandle* out) noexcept {
  ZICO_SIM_CHECK_DEVICE(device);
  std::lock_guard lock(state_->mutex);
  const uintptr_t id = state_->next_id++;
  state_->streams[id] = SimStream{device, false, {}, 0, 0};
  *out = StreamHandle{id};
  return Status::ok();
}

Status SimDriver::stream_destroy(StreamHandle stream) noexcept {
  std::lock_guard lock(state_->mutex);
  auto it = state_->streams.find(stream.value);
  if (it == state_->streams.end()) return Status(Errc::kInvalidArgument);
  state_->drain(it->second, it->second.enqueued);  // as on CUDA, queued work still completes
  state_->streams.erase(it);
  state_->timeline.forget_stream(stream.value);
  return Status::ok();
}

Status SimDriver::stream_synchronize(StreamHandle stream) noexcept {
  std::lock_guard lock(state_->mutex);
  auto it = state_->streams.find(stream.value);
  if (it != state_->streams.end()) state_->drain(it->second, it->second.enqueued);
  state_->timeline.wait_until(state_->timeline.stream_end(stream.value));
  return Status::ok();
}

Status SimDriver::event_create(DeviceId device, EventHandle* out) noexcept {
  ZICO_SIM_CHECK_DEVICE(device);
  std::lock_guard lock(state_->mutex);
  const uintptr_t id = state_->next_id++;
  state_->events[id] = SimEvent{device, 0, 0};
  *out = EventHandle{id};
  return Status::ok();
}

Status SimDriver::event_destroy(EventHandle event) noexcept {
  std::lock_guard lock(state_->mutex);
  state_->timeline.forget_event(event.value);
  return state_->events.erase(event.value) == 1 ? Status::ok() : Status(Errc::kInvalidArgument);
}

Status SimDriver::event_record(EventHandle event, StreamHandle stream) noexcept {
  std::lock_guard lock(state_->mutex);
  auto ev = state_->events.find(event.value);
  if (ev == state_->events.end()) return Status(Errc::kInvalidArgument);
  auto st = state_->streams.find(stream.value);
  if (sim_capture_state(options_.capturing_stream, stream.value) != CaptureState::kNone) {
    ++state_->counters.captured_records;
  }
  ev->second.stream = stream.value;
  ev->second.sequence = st == state_->streams.end() ? 0 : st->second.enqueued;
  state_->timeline.record(event.value, stream.value);
  return Status::ok();
}

// The simulated device runs a stream's queued work when something waits for
// it: running what the event captured now is one order the GPU could take.
Status SimDriver::stream_wait_event(StreamHandle stream, EventHandle event) noexcept {
  std::lock_guard lock(state_->mutex);
  auto ev = state_->events.find(event.value);
  if (ev == state_->events.end()) return Status(Errc::kInvalidArgument);
  auto st = state_->streams.find(ev->second.stream);
  if (st != state_->streams.end()) state_->drain(st->second, ev->second.sequence);
  state_->timeline.wait(stream.value, event.value);
  ++state_->counters.stream_waits;
  return Status::ok();
}

Status SimDriver::event_query(EventHandle event, bool* done) noexcept {
  std::lock_guard lock(state_->mutex);
  auto ev = state_->events.find(event.value);
  if (ev == state_->events.end()) return Status(Errc::kInvalidArgument);
  auto st = state_->streams.find(ev->second.stream);
  *done = st == state_->streams.end() || st->second.completed >= ev->second.sequence;
  return Status::ok();
}

Status SimDriver::event_synchronize(EventHandle event) noexcept {
  std::lock_guard lock(state_->mutex);
  auto ev = state_->events.find(event.value);
  if (ev == state_->events.end()) return Status(Errc::kInvalidArgument);
  auto st = state_->streams.find(ev->second.stream);
  if (st != state_->streams.end()) state_->drain(st->second, ev->second.sequence);
  state_->timeline.wait_until(state_->timeline.event_time(event.value));
  return Status::ok();
}

Status SimDriver::device_synchronize(DeviceId device) noexcept {
  ZICO_SIM_CHECK_DEVICE(device);
  std::lock_guard lock(state_->mutex);
  for (auto& [id, stream] : state_->streams) {
    if (stream.device == device) state_->drain(stream, stream.enqueued);
    state_->timeline.wait_until(state_->timeline.stream_end(id));
  }
  if (device.value == 0) state_->timeline.wait_until(state_->managed->stats().now_ns);
  ++state_->counters.device_syncs;
  return Status::ok();
}

Status SimDriver::copy_async(void* dst, const void* src, size_t bytes, CopyKind kind, StreamHandle stream) noexcept {
  if (bytes == 0) return Status::ok();
  if (dst == nullptr || src == nullptr) return Status(Errc::kInvalidArgument);
  const auto d = reinterpret_cast<uintptr_t>(dst);
  const auto s = reinterpret_cast<uintptr_t>(src);
  const bool dst_on_device = kind != CopyKind::kDeviceToHost;
  const bool src_on_device = kind != CopyKind::kHostToDevice;
  {
    std::lock_guard lock(state_->mutex);
    if ((dst_on_device && !state_->device_range_ok(d, bytes)) ||
        (src_on_device && !state_->device_range_ok(s, bytes))) {
      return Status(Errc::kInvalidArgument);
    }
    ZICO_RETURN_IF_ERROR(state_->take_fault(SimOp::kCopy));
    State* state = state_.get();
    const size_t capacity = options_.capacity;
    const std::array<VaRange, 2> device_ranges{dst_on_device ? VaRange{d, bytes} : VaRange{},
                                               src_on_device ? VaRange{s, bytes} : VaRange{}};
    PendingOp op{[dst, src, bytes, state, capacity, device_ranges] {
                   (void)state->touch_managed(device_ranges, capacity);
                   std::memmove(dst, src, bytes);
                 },
                 {dst_on_device ? VaRange{d, bytes} : VaRange{}, src_on_device ? VaRange{s, bytes} : VaRange{}}};
    ++state_->counters.copies;
    // Between the host and mapped chunks of device 0 the copy takes its
    // direction's copy engine on the modelled clock, in its stream's order
    // (a managed end is charged as the faults it causes instead).
    const uintptr_t device_end = kind == CopyKind::kHostToDevice ? d : s;
    if (kind != CopyKind::kDeviceToDevice && !state_->in_managed(VaRange{device_end, bytes}) &&
        state_->reserved_on(device_end) == 0) {
      SimTimeline& timeline = state_->timeline;
      timeline.extend_stream(stream.value, state_->managed->copy(kind == CopyKind::kHostToDevice, bytes,
                                                                 timeline.stream_start(stream.value)));
    }
    if (!state_->enqueue(stream, std::move(op))) return Status::ok();
  }
  // The copy ran on the caller's thread; charge its modelled duration there.
  if (options_.copy_bandwidth_bytes_per_s > 0 || options_.copy_latency_s > 0) {
    double seconds = options_.copy_latency_s;
    if (options_.copy_bandwidth_bytes_per_s > 0) seconds += static_cast<double>(bytes) / options_.copy_bandwidth_bytes_per_s;
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  }
  return Status::ok();
}

Status SimDriver::memset_async(void* dst, uint8_t value, size_t bytes, StreamHandle stream) noexcept {
  if (bytes == 0) return Status::ok();
  const auto d = reinterpret_cast<uintptr_t>(dst);
  std::lock_guard lock(state_->mutex);
  if (!state_->device_range_ok(d, bytes)) return Status(Errc::kInvalidArgument);
  State* state = state_.get();
  const size_t capacity = options_.capacity;
  (void)state_->enqueue(stream, PendingOp{[dst, value, bytes, state, capacity, d] {
                                            (void)state->touch_managed({VaRange{d, bytes}, VaRange{}}, capacity);
                                            std::memset(dst, value, bytes);
                                          },
                                          {VaRange{d, bytes}, VaRange{}}});
  return Status::ok();
}

Status SimDriver::host_register(void* ptr, size_t bytes) noexcept {
  if (ptr == nullptr || bytes == 0) return Status(Errc::kInvalidArgument);
  std::lock_guard lock(state_->mutex);
  return state_->pinned.emplace(reinterpret_cast<uintptr_t>(ptr), bytes).second ? Status::ok()
                                                                                : Status(Errc::kInvalidArgument);
}

Status SimDriver::host_unregister(void* ptr) noexcept {
  std::lock_guard lock(state_->mutex);
  return state_->pinned.erase(reinterpret_cast<uintptr_t>(ptr)) == 1 ? Status::ok() : Status(Errc::kInvalidArgument);
}

Status SimDriver::managed_allocate(size_t bytes, void** out) noexcept {
  std::lock_guard lock(state_->mutex);
  return state_->managed->allocate(bytes, out);
}

Status SimDriver::managed_free(void* ptr) noexcept {
  std::lock_guard lock(state_->mutex);
  const Status status = state_->managed->free(ptr, nullptr);
  state_->sync_board();
  return status;
}

Status SimDriver::managed_advise(void* ptr, size_t bytes, ManagedAdvice advice, DeviceId device) noexcept {
  ZICO_SIM_CHECK_DEVICE(device);
  std::lock_guard lock(state_->mutex);
  const VaRange range{reinterpret_cast<uintptr_t>(ptr), bytes};
  if (!state_->in_managed(range)) return Status(Errc::kInvalidArgument);
  // Pages go where they are used, except where the device maps them on the host.
  switch (advice) {
    case ManagedAdvice::kSetAccessedBy: state_->managed->set_accessed_by(range, true); break;
    case ManagedAdvice::kUnsetAccessedBy: state_->managed->set_accessed_by(range, false); break;
    case ManagedAdvice::kSetPreferredLocationDevice: state_->managed->set_preferred_on_device(range, true); break;
    case ManagedAdvice::kSetPreferredLocationHost:
    case ManagedAdvice::kUnsetPreferredLocation: state_->managed->set_preferred_on_device(range, false); break;
    case ManagedAdvice::kSetReadMostly:
    case ManagedAdvice::kUnsetReadMostly: break;  // not modelled: read-only copies
  }
  return Status::ok();
}

Status SimDriver::managed_prefetch(void* ptr, size_t bytes, PrefetchTarget target, StreamHandle stream) noexcept {
  const VaRange range{reinterpret_cast<uintptr_t>(ptr), bytes};
  return managed_prefetch_batch(std::span<const VaRange>(&range, 1), target, stream);
}

Status SimDriver::managed_prefetch_batch(std::span<const VaRange> ranges, PrefetchTarget target,
                                         StreamHandle stream) noexcept {
  return migrate_managed(ranges, target, stream, false);
}

Status SimDriver::managed_discard_and_prefetch_batch(std::span<const VaRange> ranges, PrefetchTarget target,
                                                     StreamHandle stream) noexcept {
  if (!options_.discard) return Status(Errc::kNotSupported);
  return migrate_managed(ranges, target, stream, true);
}

Status SimDriver::migrate_managed(std::span<const VaRange> ranges, PrefetchTarget target, StreamHandle stream,
                                  bool discard_first) noexcept {
  if (!target.to_host) {
    ZICO_SIM_CHECK_DEVICE(target.device);
    if (target.device.value != 0) return Status(Errc::kNotSupported);  // unified memory lives on device 0 here
  }
  std::lock_guard lock(state_->mutex);
  ++state_->counters.prefetch_calls;
  for (const VaRange& range : ranges) {
    if (!state_->in_managed(range)) return Status(Errc::kInvalidArgument);
  }
  // Each range is one migration, in stream order on the modelled clock: it
  // starts once the caller has issued it and the stream's earlier work is
  // done, on its direction's copy engine; the caller pays the driver's host
  // time and, where the model says so, waits (sim_managed.h's costs).
  const SimManagedCosts& costs = options_.managed_costs;
  SimTimeline& timeline = state_->timeline;
  SimManagedMemory& managed = *state_->managed;
  state_->sync_board();
  timeline.spend(costs.call_ns);
  if (costs.ordered_call_waits) timeline.wait_until(timeline.stream_end(stream.value));
  for (const VaRange& range : ranges) {
    timeline.spend(costs.range_ns);
    // Discarded with the move, at once (managed_discard alone waits for the
    // stream's queued work): the pages move with nothing to copy.
    if (discard_first) managed.discard(range);
    const uint64_t moved_before = target.to_host ? managed.stats().evicted_pages : managed.stats().prefetched_pages;
    uint64_t done = 0;
    const Status status = target.to_host
                              ? managed.prefetch_to_host(range, timeline.stream_start(stream.value), &done)
                              : managed.prefetch_to_device(range, state_->managed_limit(options_.capacity),
                                                           timeline.stream_start(stream.value), &done);
    timeline.extend_stream(stream.value, done);
    const uint64_t moved = (target.to_host ? managed.stats().evicted_pages : managed.stats().prefetched_pages) - moved_before;
    timeline.spend(moved * costs.block_ns);
    if (target.to_host && costs.to_host_sync) {
      timeline.wait_until(done);
      timeline.spend(moved * costs.cpu_map_block_ns);
    }
    (void)state_->enqueue(stream, PendingOp{[] {}, {range, VaRange{}}});
    if (!status.is_ok()) {
      state_->sync_board();
      return status;
    }
  }
  state_->sync_board();
  return Status::ok();
}

Status SimDriver::managed_discard(void* ptr, size_t bytes, StreamHandle stream) noexcept {
  if (!options_.discard) return Status(Errc::kNotSupported);
  std::lock_guard lock(state_->mutex);
  const VaRange range{reinterpret_cast<uintptr_t>(ptr), bytes};
  if (!state_->in_managed(range)) return Status(Errc::kInvalidArgument);
  State* state = state_.get();
  state_->timeline.spend(options_.managed_costs.discard_call_ns);
  (void)state_->enqueue(stream, PendingOp{[state, range] {
                                            state->managed->discard(range);
                                            state->sync_board();
                                          },
                                          {range, VaRange{}}});
  return Status::ok();
}

Status SimDriver::run_kernel(std::span<const VaRange> ranges, uint64_t duration_ns, StreamHandle stream) {
  std::lock_guard lock(state_->mutex);
  for (const VaRange& range : ranges) {
    if (!state_->device_range_ok(range.base, range.bytes)) return Status(Errc::kInvalidArgument);
  }
  SimTimeline& timeline = state_->timeline;
  timeline.spend(options_.managed_costs.launch_ns);
  timeline.launched();
  const Status status = state_->run_managed(ranges, duration_ns, state_->managed_limit(options_.capacity), t_work_tag,
                                            timeline.stream_start(stream.value));
  timeline.extend_stream(stream.value, state_->managed->stats().now_ns);
  return status;
}

Status SimDriver::start_fault_reports(DeviceId device, std::string* why) noexcept {
  if (device.value != 0) {
    if (why != nullptr) *why = "the simulated device " + std::to_string(device.value) + " has no unified memory";
    return Status(Errc::kNotSupported);
  }
  std::lock_guard lock(state_->mutex);
  state_->reporting_faults = true;
  return Status::ok();
}

void SimDriver::tag_work(uint64_t tag) noexcept { t_work_tag = tag; }

void SimDriver::untag_work() noexcept { t_work_tag = 0; }

void SimDriver::charge_host_time_to(uint32_t timeline) noexcept {
  std::lock_guard lock(state_->mutex);
  try {
    state_->timeline.use(timeline);
  } catch (const std::bad_alloc&) {
    // Not modelled apart: charged to the calling thread.
  }
}

Status SimDriver::take_fault_reports(VaRange range, std::vector<ManagedFault>* out) noexcept {
  if (out == nullptr) return Status(Errc::kInvalidArgument);
  std::lock_guard lock(state_->mutex);
  try {
    take_reports_in(range, &state_->fault_reports, out);
  } catch (const std::bad_alloc&) {
    return Status(Errc::kOutOfMemory);
  }
  return Status::ok();
}

uint64_t SimDriver::dropped_fault_reports() const {
  std::lock_guard lock(state_->mutex);
  return state_->dropped_fault_reports;
}

SimManagedStats SimDriver::managed_stats() const {
  std::lock_guard lock(state_->mutex);
  return state_->managed->stats();
}

Status SimDriver::stream_capture_state(StreamHandle stream, CaptureState* state) noexcept {
  *state = sim_capture_state(options_.capturing_stream, stream.value);
  return Status::ok();
}

namespace {

// The chunks of `device` (memfds named chunk_name) that process `pid` maps or
// keeps a descriptor of, by inode, with the largest size seen of each.
Status chunks_held_by(int pid, DeviceId device, std::unordered_map<uint64_t, uint64_t>* sizes) {
  // Both places name the memfd "/memfd:NAME (deleted)".
  const std::string name = "/memfd:" + chunk_name(device) + " ";
  const std::string proc = "/proc/" + std::to_string(pid);
  FILE* maps = std::fopen((proc + "/maps").c_str(), "re");
  if (maps == nullptr) return Status(Errc::kOsError, errno);
  char line[4096];
  while (std::fgets(line, sizeof line, maps) != nullptr) {
    unsigned long long start = 0, end = 0, inode = 0;
    int path_at = 0;
    if (std::sscanf(line, "%llx-%llx %*s %*s %*s %llu %n", &start, &end, &inode, &path_at) < 3) continue;
    if (std::strncmp(line + path_at, name.c_str(), name.size()) != 0) continue;
    uint64_t& size = (*sizes)[inode];
    size = std::max<uint64_t>(size, end - start);
  }
  std::fclose(maps);
  DIR* fds = ::opendir((proc + "/fd").c_str());
  if (fds == nullptr) return Status(Errc::kOsError, errno);
  // Mappings are bounded by vm.max_map_count; descriptors only by the
  // process's limit: look at this many, so that a process with a million
  // cannot make every look slow (what it keeps beyond goes uncounted).
  constexpr int kMostDescriptors = 1 << 16;
  int looked = 0;
  while (const dirent* entry = ::readdir(fds)) {
    if (++looked > kMostDescriptors) break;
    const std::string path = proc + "/fd/" + entry->d_name;
    char target[256];
    const ssize_t length = ::readlink(path.c_str(), target, sizeof target - 1);
    if (length <= 0) continue;
    target[length] = '\0';
    struct stat st {};
    if (std::strncmp(target, name.c_str(), name.size()) != 0 || ::stat(path.c_str(), &st) != 0) continue;
    uint64_t& size = (*sizes)[st.st_ino];
    size = std::max<uint64_t>(size, static_cast<uint64_t>(st.st_size));
  }
  ::closedir(fds);
  return Status::ok();
}

}  // namespace

Status SimDriver::process_memory(int pid, DeviceId device, uint64_t* bytes) noexcept {
  ZICO_SIM_CHECK_DEVICE(device);
  if (!options_.process_memory) return Status(Errc::kNotSupported);
  try {
    std::unordered_map<uint64_t, uint64_t> sizes;  // inode -> bytes
    ZICO_RETURN_IF_ERROR(chunks_held_by(pid, device, &sizes));
    uint64_t total = 0;
    for (const auto& [inode, size] : sizes) total = size > UINT64_MAX - total ? UINT64_MAX : total + size;
    *bytes = total;
    return Status::ok();
  } catch (const std::bad_alloc&) {
    return Status(Errc::kOutOfMemory);
  }
}

Status SimDriver::process_holds(int pid, DeviceId device, std::span<const PhysHandle> chunks,
                                std::vector<bool>* held) noexcept {
  ZICO_SIM_CHECK_DEVICE(device);
  if (!options_.process_memory) return Status(Errc::kNotSupported);
  try {
    std::unordered_map<uint64_t, uint64_t> sizes;
    ZICO_RETURN_IF_ERROR(chunks_held_by(pid, device, &sizes));
    held->assign(chunks.size(), false);
    std::lock_guard lock(state_->mutex);
    for (size_t i = 0; i < chunks.size(); ++i) {
      auto it = state_->chunks.find(chunks[i].value);
      if (it == state_->chunks.end() || it->second.fd < 0) return Status(Errc::kInvalidArgument);
      uint64_t inode = it->second.inode;
      if (inode == 0) {  // not known when it was made: asked now
        struct stat st {};
        if (::fstat(it->second.fd, &st) != 0) return os_error();
        inode = st.st_ino;
      }
      (*held)[i] = sizes.contains(inode);
    }
    return Status::ok();
  } catch (const std::bad_alloc&) {
    return Status(Errc::kOutOfMemory);
  }
}

}  // namespace zico
