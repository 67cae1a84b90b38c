// NvmeStore: evicted chunks in one swap file per job on a local NVMe drive.
//
// The file is `<dir>/zicoum-<pid>-<tag>.swap`, opened O_DIRECT (the page cache
// would only double-buffer data that is already cold) and driven through
// io_uring with the file and the staging buffers registered, so a request
// costs neither an fd lookup nor a page pin. Slot i lives at byte
// i * chunk_bytes; freed slots are reused and the file grows one chunk at a
// time with fallocate, so "disk full" is reported by reserve_slot() (as
// kOutOfMemory, no slot handed out) rather than by a later write. The file is
// removed by the destructor; a job that crashed leaves its file behind, and
// the next create() in the same directory removes it (clean_stale_files).
//
// The folder. By default each user has one of their own, /var/tmp/zicoum-<euid>,
// rather than one folder shared by all (which its first maker would own: able
// to lock everyone else out of it, or to remove their files) or per-user
// folders under a shared parent (which, unless root made it, a user would
// own in the same way). /var/tmp is root's and sticky, so only the user and
// root can remove or rename their folder; someone else may still make it first,
// and create() then refuses it, saying so, rather than use it. The folder
// must be a directory, not a symbolic link to one (its maker could point it
// anywhere), opened with O_NOFOLLOW and checked through its descriptor, which
// the cleaning and the swap file's creation then go through:
//   - the default folder, and any folder create() makes (mode 0700), must be
//     the user's alone: owned by the effective uid, writable by no one else;
//   - a folder ZICO_SWAP_DIR names that already exists must be owned by the
//     user or root, and not writable by every user unless sticky (as /var/tmp
//     is); a group the owner gave write access is the owner's choice.
// A refusal names the folder, what is wrong and the fix.
//
// Data path. Device memory is never handed to the kernel: every chunk passes
// through one of `staging_buffers` pinned, chunk-sized host buffers.
//   save: D2H copy (driver copy on the caller's stream, one event per buffer)
//         -> WRITE_FIXED requests, and XXH3-64 of the staged chunk while
//         they run (both only read the buffer)
//   load: READ_FIXED requests -> checksum verified -> H2D copy
// With several buffers the two links overlap: while chunk k is on its way to
// or from the disk, chunk k+1 is on the PCIe link. A chunk is written or read
// whole, in requests of `io_bytes` each (at most `queue_depth` in flight).
// The stream should be a copy stream of the caller's (the allocator's): the
// store waits only for its own copies, through its events, and returns once
// every copy and request of the batch has finished.
//
// Sizes, and why. A staging buffer holds a whole chunk because the checksum
// covers a whole chunk and must be checked before a byte reaches the device.
// Copies are one chunk (2 MiB by default): a pinned copy of 2 MiB already runs
// at the link's peak (its 10-50 us fixed cost is under 5 % at 25-55 GB/s).
// Disk requests default to 512 KiB: NVMe drives reach their sequential peak at
// 128 KiB-1 MiB with several requests queued, and 4 buffers x 4 requests keep
// 12-16 requests (6-8 MiB) in flight while one buffer is on the PCIe link;
// fio gets no more from 32 in flight on the disks we measured
// (docs/benchmarks.md, tests/bench/nvme_vs_fio.sh). Pinned memory:
// staging_buffers x chunk_bytes (8 MiB by default).
//
// Slot states: free -> reserved (reserve_slot) -> saved (save succeeded)
// -> reserved (a failed save: the slot is empty again) -> free (release_slot).
// load() needs a saved slot and leaves it saved, whatever the outcome.
//
// Errors. A failed or short request is retried where that makes sense (a
// short transfer resubmits the rest; EAGAIN/EINTR resubmit) and otherwise
// fails the batch: save() waits for what is in flight, marks every slot of
// the batch empty and returns the error (the device copies were only read);
// load() does the same and the slots keep their data. ENOSPC and EDQUOT come
// back as kOutOfMemory, other errnos as kOsError with the errno as detail; a
// checksum mismatch is kOsError/EIO, logged with the slot and its offset.
//
// Thread-safety: one caller at a time (the owning allocator's lock), as for
// every BackingStore. Everything here is noexcept.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backing_store.h"

namespace zico {

struct NvmeStoreOptions {
  std::string directory;          // "": NvmeStore::default_directory() (ZICO_SWAP_DIR)
  uint32_t queue_depth = 32;      // io_uring entries = most requests in flight (ZICO_NVME_QUEUE_DEPTH)
  uint32_t staging_buffers = 4;   // pinned chunk-sized buffers, >= 2 (ZICO_NVME_STAGING_BUFFERS)
  size_t io_bytes = 512 << 10;    // request size, a multiple of 4 KiB; clamped to the chunk (ZICO_NVME_IO_SIZE)
  std::string job_tag;            // [A-Za-z0-9._-]+; "": "dev<device>-<random>"
};

// Operations whose Nth occurrence a test can make fail.
enum class NvmeOp : uint8_t { kWrite, kRead, kGrow, kCount };

// What the store has done so far; tests and benchmarks read these.
struct NvmeStoreCounters {
  uint64_t write_requests = 0;  // submitted, resubmissions included
  uint64_t read_requests = 0;
  uint64_t short_transfers = 0;  // requests that moved less than asked and were resubmitted
  uint64_t checksum_failures = 0;
  uint64_t bytes_written = 0;
  uint64_t bytes_read = 0;
};

class NvmeStore final : public BackingStore {
 public:
  // /var/tmp/zicoum-<effective uid>: the user's own (see "The folder" above).
  [[nodiscard]] static std::string default_directory();

  // Creates the directory's last component if missing, checks it (see "The
  // folder" above), cleans stale files, opens the swap file and sets up the
  // ring. On failure *why names the path, the cause and, for a refused
  // folder, the fix. chunk_bytes must be a multiple of 4 KiB.
  [[nodiscard]] static Status create(Driver& driver, DeviceId device, size_t chunk_bytes,
                                     const NvmeStoreOptions& options, std::unique_ptr<NvmeStore>* out,
                                     std::string* why) noexcept;
  // Removes `zicoum-<pid>-*.swap` in `directory` whose pid no longer exists
  // and whose file nobody holds locked (a live store holds an flock, which
  // protects jobs whose pid is in another pid namespace). Returns how many.
  static size_t clean_stale_files(const std::string& directory) noexcept;

  ~NvmeStore() override;
  // Unlinks the swap file now (at process exit), leaving the object usable
  // for nothing but destruction; data still in it is lost with the process.
  void remove_file() noexcept;

 private:
  Status abandon_batch(Status status, StreamHandle stream) noexcept;

 public:
  NvmeStore(const NvmeStore&) = delete;
  NvmeStore& operator=(const NvmeStore&) = delete;

  Residency residency() const noexcept override { return Residency::kNvme; }
  size_t chunk_bytes() const noexcept override { return chunk_bytes_; }
  Status reserve_slot(uint32_t* slot) noexcept override;
  void release_slot(uint32_t slot) noexcept override;
  Status save(std::span<const ChunkTransfer> chunks, StreamHandle stream) noexcept override;
  Status load(std::span<const ChunkTransfer> chunks, StreamHandle stream) noexcept override;

  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  [[nodiscard]] uint64_t slot_offset(uint32_t slot) const noexcept { return uint64_t{slot} * chunk_bytes_; }
  [[nodiscard]] uint64_t file_bytes() const noexcept { return file_bytes_; }
  [[nodiscard]] size_t slots_in_use() const noexcept { return in_use_; }
  // False when the kernel refused to register the staging buffers
  // (RLIMIT_MEMLOCK): requests then use plain READ/WRITE, a little slower.
  [[nodiscard]] bool fixed_buffers() const noexcept { return fixed_buffers_; }
  [[nodiscard]] const NvmeStoreCounters& counters() const noexcept { return counters_; }
  // One line on the last failure (the path, the slot, the errno), for callers
  // that want more than the Status.
  [[nodiscard]] const std::string& last_error() const noexcept { return last_error_; }

  // --- fault injection (tests) --------------------------------------------
  // The nth `op` from now (1 = the next) fails with errno `error`; error 0
  // makes a read or write move only half its bytes instead (a short
  // transfer, which the store must finish by resubmitting). Once.
  void inject_fault(NvmeOp op, uint64_t nth, int error) noexcept;

 private:
  struct Engine;  // the ring, staging buffers and request table (nvme_store.cpp)
  enum class SlotState : uint8_t { kFree, kReserved, kSaved };
  struct Slot {
    uint64_t checksum = 0;    // XXH3-64 of the chunk, valid in kSaved
    uint32_t batch_mark = 0;  // catches a slot named twice in one batch
    SlotState state = SlotState::kFree;
  };

  NvmeStore(Driver& driver, size_t chunk_bytes) noexcept;
  Status validate_batch(std::span<const ChunkTransfer> chunks, bool need_saved) noexcept;
  Status grow_file(uint64_t bytes) noexcept;
  int take_fault(NvmeOp op) noexcept;  // the errno to inject, -1 for none
  void fail(const char* format, ...) noexcept __attribute__((format(printf, 2, 3)));

  Driver& driver_;
  const size_t chunk_bytes_;
  const int owner_;  // the pid that created the file and may remove it
  std::string path_;
  int fd_ = -1;
  uint64_t file_bytes_ = 0;
  bool fallocate_works_ = true;
  bool fixed_buffers_ = false;
  std::unique_ptr<Engine> engine_;
  std::vector<Slot> slots_;  // by slot number; the file covers all of them
  uint32_t batch_serial_ = 0;
  std::vector<uint32_t> free_slots_;
  size_t in_use_ = 0;
  NvmeStoreCounters counters_;
  uint64_t op_calls_[static_cast<size_t>(NvmeOp::kCount)] = {};
  uint64_t fault_at_[static_cast<size_t>(NvmeOp::kCount)] = {};
  int fault_errno_[static_cast<size_t>(NvmeOp::kCount)] = {};
  std::string last_error_;
};

}  // namespace zico
