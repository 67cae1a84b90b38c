#include "nvme_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <liburing.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <random>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <new>

#include "log.h"
#include "sizes.h"

namespace zico {
namespace {

constexpr size_t kDirectAlign = 4096;        // O_DIRECT offset, length and address alignment
constexpr size_t kMaxChunkBytes = size_t{1} << 30;  // request offsets within a chunk are 32-bit
constexpr uint32_t kNone = UINT32_MAX;

Status errno_status(int error) {
  return error == ENOSPC || error == EDQUOT ? Status(Errc::kOutOfMemory, error) : Status(Errc::kOsError, error);
}

bool valid_tag(const std::string& tag) {
  if (tag.empty() || tag.size() > 64) return false;
  for (char c : tag) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

// "zicoum-<pid>-<tag>.swap" -> pid; 0 when the name is not a swap file.
pid_t swap_file_pid(const char* name) {
  constexpr std::string_view kPrefix = "zicoum-", kSuffix = ".swap";
  const std::string_view n(name);
  if (n.size() <= kPrefix.size() + kSuffix.size() || !n.starts_with(kPrefix) || !n.ends_with(kSuffix)) return 0;
  long pid = 0;
  size_t i = kPrefix.size();
  for (; i < n.size() && n[i] >= '0' && n[i] <= '9'; ++i) {
    pid = pid * 10 + (n[i] - '0');
    if (pid > 1L << 30) return 0;
  }
  if (i == kPrefix.size() || n[i] != '-' || i + 1 + kSuffix.size() >= n.size()) return 0;  // pid, '-', a tag
  return static_cast<pid_t>(pid);
}

// What to do about a folder entry owned by `owner` that is in the way.
std::string remove_it(uid_t owner) {
  return owner == geteuid() ? "remove it" : "ask uid " + std::to_string(owner) + " or root to remove it";
}

// Why a swap folder may not be used ("" when it may), from its fstat; see
// "The folder" in nvme_store.h. `own`: it must be the user's alone (the
// default folder, or one create() just made).
std::string folder_fault(const struct stat& st, bool own) {
  const uid_t me = geteuid();
  if (st.st_uid != me && (own || st.st_uid != 0)) {
    return "is owned by uid " + std::to_string(st.st_uid) + ", not by you (uid " + std::to_string(me) +
           (own || me == 0 ? ")" : ") or root") + ": its owner could lock you out of it or remove your swap files; " +
           remove_it(st.st_uid);
  }
  char mode[8];
  snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
  if (own && (st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return std::string("is writable by others (mode ") + mode +
           "): they could remove your swap files; run chmod go-w on it";
  }
  if ((st.st_mode & S_IWOTH) != 0 && (st.st_mode & S_ISVTX) == 0) {
    return std::string("is writable by every user (mode ") + mode +
           ") without the sticky bit: anyone could remove your swap files; run chmod o-w or chmod +t on it";
  }
  return {};
}

// Opens the swap folder `dir`, making it (mode 0700) when it is missing, and
// checks it through the descriptor, so that what is checked is what is used.
Status open_swap_folder(const std::string& dir, bool is_default, int* out, std::string* why) {
  bool made = false;
  if (mkdir(dir.c_str(), 0700) == 0) {
    made = true;
  } else if (errno != EEXIST) {
    const int error = errno;
    *why = "nvme store: cannot create swap folder " + dir + ": " + strerror(error);
    return Status(Errc::kOsError, error);
  }
  const std::string fix = is_default ? ", or set ZICO_SWAP_DIR to a folder of your own"
                                     : ", or set ZICO_SWAP_DIR to another folder";
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    struct stat st{};
    if (lstat(dir.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
      *why = "nvme store: swap folder " + dir +
             " is a symbolic link, which its maker could point anywhere; " + remove_it(st.st_uid) +
             (is_default ? fix : ", or set ZICO_SWAP_DIR to the folder it points to");
      return Status(Errc::kOsError, ELOOP);
    }
    *why = "nvme store: cannot open swap folder " + dir + ": " + strerror(error);
    return Status(Errc::kOsError, error);
  }
  struct stat st{};
  if (fstat(fd, &st) != 0) {
    const int error = errno;
    close(fd);
    *why = "nvme store: cannot check swap folder " + dir + ": " + strerror(error);
    return Status(Errc::kOsError, error);
  }
  if (const std::string fault = folder_fault(st, is_default || made); !fault.empty()) {
    close(fd);
    *why = "nvme store: swap folder " + dir + " " + fault + fix;
    return Status(Errc::kOsError, EPERM);
  }
  *out = fd;
  return Status::ok();
}

// Removes stale swap files in the folder open at `dir_fd` (see
// NvmeStore::clean_stale_files); `directory` names it in the log.
size_t clean_stale_files_in(int dir_fd, const std::string& directory) {
  const int listing = openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (listing < 0) return 0;
  DIR* dir = fdopendir(listing);
  if (dir == nullptr) {
    close(listing);
    return 0;
  }
  size_t removed = 0;
  while (const dirent* entry = readdir(dir)) {
    const pid_t pid = swap_file_pid(entry->d_name);
    if (pid <= 0) continue;
    // Our own pid: a file left by an earlier process that had it (not one of
    // our stores: those hold their lock).
    if (pid != getpid() && (kill(pid, 0) == 0 || errno != ESRCH)) continue;
    const int fd = openat(dir_fd, entry->d_name, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) continue;
    if (flock(fd, LOCK_EX | LOCK_NB) == 0 && unlinkat(dir_fd, entry->d_name, 0) == 0) {
      ++removed;
      ZICO_LOG(kInfo, "nvme store: removed stale swap file %s/%s (process %d is gone)", directory.c_str(),
               entry->d_name, static_cast<int>(pid));
    }
    close(fd);
  }
  closedir(dir);
  return removed;
}

// Staging memory: page-aligned, as O_DIRECT needs. Not madvise(MADV_HUGEPAGE):
// measured on a virtio disk, huge-page buffers cut write throughput by ~20 %.
char* map_staging(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<char*>(p);
}

enum class BufferState : uint8_t { kIdle, kCopying, kIo };

struct Buffer {
  char* data = nullptr;
  EventHandle event{};
  BufferState state = BufferState::kIdle;
  uint32_t chunk = 0;          // index in the batch
  uint32_t next_request = 0;   // the chunk's first request not yet submitted
  uint32_t requests_left = 0;  // the chunk's requests not yet complete (or abandoned)
};

struct Request {
  uint32_t buffer = kNone;  // kNone: free
  uint32_t offset = 0;      // within the chunk
  uint32_t length = 0;
  uint32_t done = 0;        // bytes already transferred (short transfers)
  int injected = 0;         // errno reported instead of the kernel's result
};

// A FIFO of buffer indices with room for every buffer.
class BufferQueue {
 public:
  void init(size_t capacity) { items_.assign(capacity, 0); }
  [[nodiscard]] bool empty() const { return size_ == 0; }
  [[nodiscard]] uint32_t front() const { return items_[head_]; }
  void push(uint32_t b) {
    items_[(head_ + size_) % items_.size()] = b;
    ++size_;
  }
  void pop() {
    head_ = (head_ + 1) % items_.size();
    --size_;
  }

 private:
  std::vector<uint32_t> items_;
  size_t head_ = 0, size_ = 0;
};

}  // namespace

// The I/O engine. Invariants between batches: every buffer idle, no request
// in flight, both queues empty. During a batch, a request is in flight from
// prepare() until its completion is finished (resubmissions keep it).
struct NvmeStore::Engine {
  explicit Engine(NvmeStore& owner) : store(owner) {}

  NvmeStore& store;
  io_uring ring{};
  bool ring_ready = false;
  bool fixed_file = false;
  bool broken = false;  // the ring failed; requests may be in flight forever
  char* staging = nullptr;
  size_t staging_bytes = 0;
  bool pinned = false;
  size_t io_bytes = 0;
  uint32_t requests_per_chunk = 0;
  std::vector<Buffer> buffers;
  std::vector<Request> requests;
  std::vector<uint32_t> free_requests;
  BufferQueue to_submit;  // kIo buffers with requests not yet submitted, in order
  BufferQueue copying;    // kCopying buffers, oldest first
  uint32_t in_flight = 0;
  bool unsubmitted = false;
  // The current batch.
  std::span<const ChunkTransfer> batch;
  bool writing = false;
  int batch_errno = 0;  // first failure of a request; stops the batch

  bool idle_buffer(uint32_t* out) const {
    for (uint32_t b = 0; b < buffers.size(); ++b) {
      if (buffers[b].state == BufferState::kIdle) {
        *out = b;
        return true;
      }
    }
    return false;
  }

  void start_io(uint32_t b) {
    Buffer& buf = buffers[b];
    buf.state = BufferState::kIo;
    buf.next_request = 0;
    buf.requests_left = requests_per_chunk;
    to_submit.push(b);
  }

  [[nodiscard]] bool io_finished(uint32_t b) const {
    return buffers[b].state == BufferState::kIo && buffers[b].requests_left == 0;
  }

  void prepare(uint32_t r) {
    Request& req = requests[r];
    const Buffer& buf = buffers[req.buffer];
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    if (sqe == nullptr) {  // cannot happen while in_flight <= entries; be safe anyway
      (void)io_uring_submit(&ring);
      sqe = io_uring_get_sqe(&ring);
      if (sqe == nullptr) {
        fail_request(req, EBUSY);
        finish(r);
        return;
      }
    }
    char* addr = buf.data + req.offset + req.done;
    unsigned length = req.length - req.done;
    const uint64_t offset = store.slot_offset(batch[buf.chunk].slot) + req.offset + req.done;
    const int fault = store.take_fault(writing ? NvmeOp::kWrite : NvmeOp::kRead);
    if (fault > 0) {
      io_uring_prep_nop(sqe);
      req.injected = fault;
    } else {
      if (fault == 0 && length > kDirectAlign) length = static_cast<unsigned>(length / 2 / kDirectAlign * kDirectAlign);
      const int file = fixed_file ? 0 : store.fd_;
      const int index = static_cast<int>(req.buffer);
      if (writing && store.fixed_buffers_) {
        io_uring_prep_write_fixed(sqe, file, addr, length, offset, index);
      } else if (writing) {
        io_uring_prep_write(sqe, file, addr, length, offset);
      } else if (store.fixed_buffers_) {
        io_uring_prep_read_fixed(sqe, file, addr, length, offset, index);
      } else {
        io_uring_prep_read(sqe, file, addr, length, offset);
      }
      if (fixed_file) sqe->flags |= IOSQE_FIXED_FILE;
    }
    io_uring_sqe_set_data64(sqe, r);
    ++(writing ? store.counters_.write_requests : store.counters_.read_requests);
    unsubmitted = true;
  }

  // Prepares requests for staged chunks while request slots last; once the
  // batch has failed, abandons the requests not yet submitted instead.
  void submit(bool abandon) {
    while (!to_submit.empty()) {
      Buffer& buf = buffers[to_submit.front()];
      if (abandon || batch_errno != 0) {
        buf.requests_left -= requests_per_chunk - buf.next_request;
        buf.next_request = requests_per_chunk;
      } else {
        if (free_requests.empty()) break;
        const uint32_t r = free_requests.back();
        free_requests.pop_back();
        const size_t offset = size_t{buf.next_request} * io_bytes;
        requests[r] = Request{to_submit.front(), static_cast<uint32_t>(offset),
                              static_cast<uint32_t>(std::min(io_bytes, store.chunk_bytes_ - offset)), 0, 0};
        ++buf.next_request;
        ++in_flight;
        prepare(r);
      }
      if (buf.next_request == requests_per_chunk) to_submit.pop();
    }
    flush();
  }

  void flush() {
    if (!unsubmitted) return;
    (void)io_uring_submit(&ring);  // what the kernel did not take stays queued for the next wait
    unsubmitted = io_uring_sq_ready(&ring) > 0;
  }

  void finish(uint32_t r) {
    Request& req = requests[r];
    --buffers[req.buffer].requests_left;
    req.buffer = kNone;
    free_requests.push_back(r);
    --in_flight;
  }

  void fail_request(const Request& req, int error) {
    if (batch_errno != 0) return;
    batch_errno = error;
    const uint32_t slot = batch[buffers[req.buffer].chunk].slot;
    store.fail("%s of slot %u at offset %llu (+%u) in %s failed: %s", writing ? "write" : "read", slot,
               static_cast<unsigned long long>(store.slot_offset(slot)), req.offset + req.done,
               store.path_.c_str(), strerror(error));
  }

  void complete(const io_uring_cqe* cqe) {
    const auto r = static_cast<uint32_t>(io_uring_cqe_get_data64(cqe));
    Request& req = requests[r];
    const int result = req.injected != 0 ? -req.injected : cqe->res;
    req.injected = 0;
    if (batch_errno != 0) {
      finish(r);
    } else if (result == -EAGAIN || result == -EINTR) {
      prepare(r);
    } else if (result < 0) {
      fail_request(req, -result);
      finish(r);
    } else if (result == 0) {  // end of file or a device that accepts nothing: never loop on it
      fail_request(req, EIO);
      finish(r);
    } else {
      req.done += static_cast<uint32_t>(result);
      (writing ? store.counters_.bytes_written : store.counters_.bytes_read) += static_cast<uint64_t>(result);
      if (req.done < req.length) {
        ++store.counters_.short_transfers;
        prepare(r);
      } else {
        finish(r);
      }
    }
  }

  // Handles every completion already posted; with `wait`, first waits for one.
  Status reap(bool wait) {
    if (wait) {
      for (;;) {
        const int rc = io_uring_submit_and_wait(&ring, 1);
        unsubmitted = io_uring_sq_ready(&ring) > 0;
        if (rc >= 0) break;
        if (rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
          broken = true;
          store.fail("io_uring wait on %s failed: %s; the store is unusable", store.path_.c_str(), strerror(-rc));
          return Status(Errc::kOsError, -rc);
        }
      }
    }
    io_uring_cqe* cqe = nullptr;
    while (io_uring_peek_cqe(&ring, &cqe) == 0) {
      complete(cqe);
      io_uring_cqe_seen(&ring, cqe);
    }
    flush();  // resubmissions
    return Status::ok();
  }

  void begin_batch(std::span<const ChunkTransfer> chunks, bool write) {
    batch = chunks;
    writing = write;
    batch_errno = 0;
  }

  [[nodiscard]] bool all_idle() const {
    return std::all_of(buffers.begin(), buffers.end(), [](const Buffer& b) { return b.state == BufferState::kIdle; });
  }
  // A batch must never end with work unfinished; if it does, it failed.
  Status unfinished_batch() {
    store.fail("internal error: a batch on %s ended with staging buffers still busy", store.path_.c_str());
    return Status(Errc::kOsError, EIO);
  }

  // Waits for the oldest copy; on an event failure, for the whole stream.
  Status finish_copy(uint32_t b, StreamHandle stream) {
    Status status = store.driver_.event_synchronize(buffers[b].event);
    if (!status.is_ok()) (void)store.driver_.stream_synchronize(stream);
    return status;
  }

  [[nodiscard]] bool copy_done(uint32_t b) const {
    bool done = false;
    return store.driver_.event_query(buffers[b].event, &done).is_ok() && done;
  }
};

Status NvmeStore::create(Driver& driver, DeviceId device, size_t chunk_bytes, const NvmeStoreOptions& options,
                         std::unique_ptr<NvmeStore>* out, std::string* why) noexcept {
  try {
    if (chunk_bytes == 0 || chunk_bytes % kDirectAlign != 0 || chunk_bytes > kMaxChunkBytes) {
      *why = "nvme store: chunk size " + std::to_string(chunk_bytes) + " is not a multiple of 4 KiB up to 1 GiB";
      return Status(Errc::kInvalidArgument);
    }
    if (options.queue_depth == 0 || options.queue_depth > 4096 || options.staging_buffers < 2 ||
        options.staging_buffers > 1024 || options.io_bytes == 0 || options.io_bytes % kDirectAlign != 0) {
      *why = "nvme store: queue depth must be 1-4096, staging buffers 2-1024, I/O size a multiple of 4 KiB";
      return Status(Errc::kInvalidArgument);
    }
    // A random part keeps names apart across PID namespaces sharing the directory.
    const std::string tag = options.job_tag.empty()
                                ? "dev" + std::to_string(device.value) + "-" + std::to_string(std::random_device{}() & 0xffffff)
                                : options.job_tag;
    if (!valid_tag(tag)) {
      *why = "nvme store: job tag '" + tag + "' must be 1-64 characters of [A-Za-z0-9._-]";
      return Status(Errc::kInvalidArgument);
    }
    const bool default_dir = options.directory.empty();
    const std::string dir = default_dir ? default_directory() : options.directory;
    int dir_fd = -1;
    ZICO_RETURN_IF_ERROR(open_swap_folder(dir, default_dir, &dir_fd, why));
    (void)clean_stale_files_in(dir_fd, dir);

    std::unique_ptr<NvmeStore> store(new NvmeStore(driver, chunk_bytes));
    const std::string name = "zicoum-" + std::to_string(getpid()) + "-" + tag + ".swap";
    const std::string path = dir + "/" + name;
    store->fd_ = openat(dir_fd, name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
    const int open_errno = errno;
    close(dir_fd);
    if (store->fd_ < 0) {
      const int error = open_errno;
      if (error == EINVAL) {
        *why = "nvme store: the file system of " + dir + " does not support O_DIRECT (creating " + path + ")";
        return Status(Errc::kNotSupported, error);
      }
      *why = "nvme store: cannot create swap file " + path + ": " + strerror(error) +
             (error == EEXIST ? " (another store in this process uses job tag '" + tag + "'?)" : "");
      return errno_status(error);
    }
    store->path_ = path;  // from here on the destructor removes the file
    (void)flock(store->fd_, LOCK_EX | LOCK_NB);  // tells clean_stale_files in other pid namespaces we live

    auto engine = std::make_unique<Engine>(*store);
    Engine& e = *engine;
    store->engine_ = std::move(engine);
    if (int rc = io_uring_queue_init(options.queue_depth, &e.ring, 0); rc < 0) {
      *why = std::string("nvme store: io_uring is unavailable (") + strerror(-rc) +
             "; kernel too old, or disabled by seccomp or kernel.io_uring_disabled)";
      return Status(Errc::kNotSupported, -rc);
    }
    e.ring_ready = true;
    e.io_bytes = std::min(options.io_bytes, chunk_bytes);
    e.requests_per_chunk = static_cast<uint32_t>((chunk_bytes + e.io_bytes - 1) / e.io_bytes);

    e.staging_bytes = size_t{options.staging_buffers} * chunk_bytes;
    e.staging = map_staging(e.staging_bytes);
    if (e.staging == nullptr) {
      *why = "nvme store: cannot allocate " + format_size(e.staging_bytes) + " of staging buffers";
      return Status(Errc::kOutOfMemory, errno);
    }
    e.pinned = driver.host_register(e.staging, e.staging_bytes).is_ok();
    if (!e.pinned) {
      ZICO_LOG(kWarn, "nvme store: pinning %s of staging buffers failed; copies will be slower",
               format_size(e.staging_bytes).c_str());
    }
    e.buffers.resize(options.staging_buffers);
    std::vector<iovec> iovecs(options.staging_buffers);
    for (uint32_t b = 0; b < options.staging_buffers; ++b) {
      e.buffers[b].data = e.staging + size_t{b} * chunk_bytes;
      iovecs[b] = iovec{e.buffers[b].data, chunk_bytes};
      if (Status status = driver.event_create(device, &e.buffers[b].event); !status.is_ok()) {
        *why = "nvme store: cannot create copy events: " + status.message();
        return status;
      }
    }
    store->fixed_buffers_ = io_uring_register_buffers(&e.ring, iovecs.data(), options.staging_buffers) == 0;
    if (!store->fixed_buffers_) {
      ZICO_LOG(kInfo, "nvme store: io_uring refused to register %s of buffers (RLIMIT_MEMLOCK?); using plain I/O",
               format_size(e.staging_bytes).c_str());
    }
    e.fixed_file = io_uring_register_files(&e.ring, &store->fd_, 1) == 0;
    e.requests.resize(options.queue_depth);
    for (uint32_t r = options.queue_depth; r-- > 0;) e.free_requests.push_back(r);
    e.to_submit.init(options.staging_buffers);
    e.copying.init(options.staging_buffers);

    ZICO_LOG(kInfo, "nvme store %s: %s chunks, %u staging buffers, %s requests, queue depth %u", path.c_str(),
             format_size(chunk_bytes).c_str(), options.staging_buffers, format_size(e.io_bytes).c_str(),
             options.queue_depth);
    *out = std::move(store);
    return Status::ok();
  } catch (const std::bad_alloc&) {
    *why = "nvme store: out of host memory";
    return Status(Errc::kOutOfMemory);
  }
}

NvmeStore::NvmeStore(Driver& driver, size_t chunk_bytes) noexcept
    : driver_(driver), chunk_bytes_(chunk_bytes), owner_(getpid()) {}

NvmeStore::~NvmeStore() {
  if (engine_ != nullptr) {
    Engine& e = *engine_;
    for (Buffer& buf : e.buffers) {
      if (buf.event.valid()) (void)driver_.event_destroy(buf.event);
    }
    if (e.ring_ready) io_uring_queue_exit(&e.ring);
    if (e.pinned) (void)driver_.host_unregister(e.staging);
    if (e.staging != nullptr) munmap(e.staging, e.staging_bytes);
  }
  // Unlink before close: the flock guards the name until it is gone. A forked
  // child that runs exit handlers must not remove its parent's file.
  if (!path_.empty() && getpid() == owner_) unlink(path_.c_str());
  if (fd_ >= 0) close(fd_);
}

// The ring broke mid-batch: no copy may still run into a staging buffer or
// onto the device once the caller sees the error.
Status NvmeStore::abandon_batch(Status status, StreamHandle stream) noexcept {
  (void)driver_.stream_synchronize(stream);
  return status;
}

void NvmeStore::remove_file() noexcept {
  if (!path_.empty() && getpid() == owner_) unlink(path_.c_str());
  path_.clear();
}

std::string NvmeStore::default_directory() { return "/var/tmp/zicoum-" + std::to_string(geteuid()); }

size_t NvmeStore::clean_stale_files(const std::string& directory) noexcept {
  const int dir_fd = open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dir_fd < 0) return 0;
  const size_t removed = clean_stale_files_in(dir_fd, directory);
  close(dir_fd);
  return removed;
}

void NvmeStore::fail(const char* format, ...) noexcept {
  char line[512];
  va_list args;
  va_start(args, format);
  vsnprintf(line, sizeof line, format, args);
  va_end(args);
  try {
    last_error_ = line;
  } catch (const std::bad_alloc&) {
    last_error_.clear();
  }
  ZICO_LOG(kWarn, "nvme store: %s", line);
}

void NvmeStore::inject_fault(NvmeOp op, uint64_t nth, int error) noexcept {
  const auto i = static_cast<size_t>(op);
  fault_at_[i] = nth == 0 ? 0 : op_calls_[i] + nth;
  fault_errno_[i] = error;
}

int NvmeStore::take_fault(NvmeOp op) noexcept {
  const auto i = static_cast<size_t>(op);
  if (++op_calls_[i] != fault_at_[i]) return -1;
  fault_at_[i] = 0;
  return fault_errno_[i];
}

Status NvmeStore::grow_file(uint64_t bytes) noexcept {
  const int fault = take_fault(NvmeOp::kGrow);
  int error = fault >= 0 ? (fault == 0 ? ENOSPC : fault) : 0;
  while (error == 0 && fallocate_works_ &&
         fallocate(fd_, 0, static_cast<off_t>(file_bytes_), static_cast<off_t>(bytes - file_bytes_)) != 0) {
    if (errno == EOPNOTSUPP) {
      fallocate_works_ = false;  // the file system cannot reserve: a write reports ENOSPC instead
    } else if (errno != EINTR) {
      error = errno;
    }
  }
  if (error == 0 && !fallocate_works_ && ftruncate(fd_, static_cast<off_t>(bytes)) != 0) error = errno;
  if (error != 0) {
    fail("cannot grow %s to %s: %s; no slot handed out", path_.c_str(), format_size(bytes).c_str(), strerror(error));
    return errno_status(error);
  }
  file_bytes_ = bytes;
  return Status::ok();
}

Status NvmeStore::reserve_slot(uint32_t* slot) noexcept {
  if (free_slots_.empty()) {
    if (slots_.size() >= UINT32_MAX) return Status(Errc::kOutOfMemory);
    const uint64_t needed = (slots_.size() + 1) * uint64_t{chunk_bytes_};
    if (needed > file_bytes_) ZICO_RETURN_IF_ERROR(grow_file(needed));
    try {
      free_slots_.reserve(slots_.size() + 1);  // release_slot must not allocate
      slots_.emplace_back();
    } catch (const std::bad_alloc&) {
      return Status(Errc::kOutOfMemory);
    }
    free_slots_.push_back(static_cast<uint32_t>(slots_.size() - 1));
  }
  *slot = free_slots_.back();
  free_slots_.pop_back();
  slots_[*slot].state = SlotState::kReserved;
  ++in_use_;
  return Status::ok();
}

void NvmeStore::release_slot(uint32_t slot) noexcept {
  if (slot >= slots_.size() || slots_[slot].state == SlotState::kFree) return;
  slots_[slot].state = SlotState::kFree;
  --in_use_;
  free_slots_.push_back(slot);
}

Status NvmeStore::validate_batch(std::span<const ChunkTransfer> chunks, bool need_saved) noexcept {
  if (engine_->broken) return Status(Errc::kOsError, EIO);
  if (++batch_serial_ == 0) {
    for (Slot& s : slots_) s.batch_mark = 0;
    batch_serial_ = 1;
  }
  for (const ChunkTransfer& c : chunks) {
    if (c.slot >= slots_.size() || c.device == nullptr) return Status(Errc::kInvalidArgument);
    Slot& s = slots_[c.slot];
    if (s.state == SlotState::kFree || (need_saved && s.state != SlotState::kSaved) || s.batch_mark == batch_serial_) {
      return Status(Errc::kInvalidArgument);
    }
    s.batch_mark = batch_serial_;
  }
  return Status::ok();
}

// save: idle -> kCopying (D2H) -> checksum -> kIo (writes) -> idle.
Status NvmeStore::save(std::span<const ChunkTransfer> chunks, StreamHandle stream) noexcept {
  ZICO_RETURN_IF_ERROR(validate_batch(chunks, false));
  for (const ChunkTransfer& c : chunks) slots_[c.slot].state = SlotState::kReserved;  // empty until all is written
  Engine& e = *engine_;
  e.begin_batch(chunks, /*write=*/true);
  Status error;
  auto failed = [&] { return !error.is_ok() || e.batch_errno != 0; };
  size_t next = 0;
  for (;;) {
    bool progress = false;
    uint32_t b = 0;
    while (!failed() && next < chunks.size() && e.idle_buffer(&b)) {
      Buffer& buf = e.buffers[b];
      Status status = driver_.copy_async(buf.data, chunks[next].device, chunk_bytes_, CopyKind::kDeviceToHost, stream);
      if (status.is_ok()) status = driver_.event_record(buf.event, stream);
      if (!status.is_ok()) {
        (void)driver_.stream_synchronize(stream);  // nothing may still be writing into a staging buffer
        fail("copying slot %u's chunk to staging failed: %s", chunks[next].slot, status.message().c_str());
        error = status;
        break;
      }
      buf.state = BufferState::kCopying;
      buf.chunk = static_cast<uint32_t>(next++);
      e.copying.push(b);
      progress = true;
    }
    // Staged chunks go to disk in order; block on a copy only while the disk is idle.
    while (!e.copying.empty()) {
      b = e.copying.front();
      if (e.in_flight > 0 && !e.copy_done(b)) break;
      e.copying.pop();
      Status status = e.finish_copy(b, stream);
      if (!status.is_ok() && error.is_ok()) error = status;
      progress = true;
      if (failed()) {
        e.buffers[b].state = BufferState::kIdle;
        continue;
      }
      // The disk starts on the chunk first; the write and the checksum only read the buffer.
      e.start_io(b);
      e.submit(false);
      slots_[chunks[e.buffers[b].chunk].slot].checksum = XXH3_64bits(e.buffers[b].data, chunk_bytes_);
    }
    e.submit(failed());
    if (Status status = e.reap(false); !status.is_ok()) return abandon_batch(status, stream);
    for (b = 0; b < e.buffers.size(); ++b) {
      if (!e.io_finished(b)) continue;
      e.buffers[b].state = BufferState::kIdle;
      progress = true;
    }
    if (progress) continue;
    if (e.in_flight > 0) {
      if (Status status = e.reap(true); !status.is_ok()) return abandon_batch(status, stream);
      continue;
    }
    // Nothing in flight: done only if nothing is queued or copying either
    // (a chunk needs more requests than the queue holds) and no chunk is left.
    if (!e.to_submit.empty() || !e.copying.empty() || (!failed() && next < chunks.size())) continue;
    break;
  }
  if (error.is_ok() && e.batch_errno != 0) error = errno_status(e.batch_errno);
  if (error.is_ok() && !e.all_idle()) error = e.unfinished_batch();
  if (!error.is_ok()) return error;
  for (const ChunkTransfer& c : chunks) slots_[c.slot].state = SlotState::kSaved;
  return Status::ok();
}

// load: idle -> kIo (reads) -> checksum verified -> kCopying (H2D) -> idle.
Status NvmeStore::load(std::span<const ChunkTransfer> chunks, StreamHandle stream) noexcept {
  ZICO_RETURN_IF_ERROR(validate_batch(chunks, true));
  Engine& e = *engine_;
  e.begin_batch(chunks, /*write=*/false);
  Status error;
  auto failed = [&] { return !error.is_ok() || e.batch_errno != 0; };
  size_t next = 0;
  for (;;) {
    bool progress = false;
    while (!e.copying.empty() && e.copy_done(e.copying.front())) {
      e.buffers[e.copying.front()].state = BufferState::kIdle;
      e.copying.pop();
      progress = true;
    }
    uint32_t b = 0;
    while (!failed() && next < chunks.size() && e.idle_buffer(&b)) {
      e.buffers[b].chunk = static_cast<uint32_t>(next++);
      e.start_io(b);
      progress = true;
    }
    e.submit(failed());
    if (Status status = e.reap(false); !status.is_ok()) return abandon_batch(status, stream);
    for (b = 0; b < e.buffers.size(); ++b) {
      if (!e.io_finished(b)) continue;
      Buffer& buf = e.buffers[b];
      buf.state = BufferState::kIdle;
      progress = true;
      if (failed()) continue;
      const ChunkTransfer& c = chunks[buf.chunk];
      const uint64_t sum = XXH3_64bits(buf.data, chunk_bytes_);
      if (sum != slots_[c.slot].checksum) {
        ++counters_.checksum_failures;
        fail("checksum mismatch in slot %u at offset %llu of %s (stored %016llx, read %016llx)", c.slot,
             static_cast<unsigned long long>(slot_offset(c.slot)), path_.c_str(),
             static_cast<unsigned long long>(slots_[c.slot].checksum), static_cast<unsigned long long>(sum));
        error = Status(Errc::kOsError, EIO);
        continue;
      }
      Status status = driver_.copy_async(c.device, buf.data, chunk_bytes_, CopyKind::kHostToDevice, stream);
      if (status.is_ok()) status = driver_.event_record(buf.event, stream);
      if (!status.is_ok()) {
        (void)driver_.stream_synchronize(stream);
        fail("copying slot %u from staging to the device failed: %s", c.slot, status.message().c_str());
        error = status;
        continue;
      }
      buf.state = BufferState::kCopying;
      e.copying.push(b);
    }
    if (progress) continue;
    if (e.in_flight > 0) {
      if (Status status = e.reap(true); !status.is_ok()) return abandon_batch(status, stream);
      continue;
    }
    // Nothing in flight. Queued requests: the next round submits them. A copy
    // still running: wait for the oldest, which frees its buffer. Chunks not
    // yet started: the next round starts them. Otherwise the batch is done.
    if (!e.to_submit.empty()) continue;
    if (!e.copying.empty()) {
      b = e.copying.front();
      e.copying.pop();
      if (Status status = e.finish_copy(b, stream); !status.is_ok() && error.is_ok()) error = status;
      e.buffers[b].state = BufferState::kIdle;
      continue;
    }
    if (!failed() && next < chunks.size()) continue;
    break;
  }
  if (error.is_ok() && e.batch_errno != 0) error = errno_status(e.batch_errno);
  if (error.is_ok() && !e.all_idle()) error = e.unfinished_batch();
  return error;
}

}  // namespace zico
