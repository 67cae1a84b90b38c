#include "state_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace zico::sharing {
namespace {

constexpr uint64_t kMagic = 0x5441545343495A31;  // "1ZICSTAT"
constexpr uint64_t kVersion = 1;

struct Header {
  uint64_t magic;
  uint64_t version;
  uint64_t gpu_count;
  uint8_t uuids[StateFile::kMaxGpus][16];
};

}  // namespace

struct StateFile::Slot {
  uint64_t job;  // 0: free; written last when claimed, first when released
  uint32_t pid;
  uint32_t uid;
  uint64_t held[kMaxGpus];
};

namespace {
constexpr size_t kFileBytes = sizeof(Header) + StateFile::kMaxJobs * sizeof(uint64_t) * (2 + StateFile::kMaxGpus);
}  // namespace

StateFile::Slot* StateFile::slot(size_t index) const {
  return reinterpret_cast<Slot*>(static_cast<char*>(base_) + sizeof(Header)) + index;
}

StateFile::~StateFile() {
  if (base_ != nullptr) ::munmap(base_, bytes_);
}

bool StateFile::open(const std::string& path, std::span<const proto::GpuUuid> gpus, std::vector<Entry>* previous,
                     std::string* why) {
  static_assert(sizeof(Slot) == sizeof(uint64_t) * (2 + kMaxGpus));
  if (gpus.size() > kMaxGpus) {
    *why = "the state file covers at most " + std::to_string(kMaxGpus) + " GPUs";
    return false;
  }
  // The daemon writes this file as root, often beside its socket: a link
  // that another user planted there must not make it write elsewhere.
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    *why = "state file " + path + ": " + (errno == ELOOP ? std::string("is a symbolic link") : std::strerror(errno));
    return false;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid() || st.st_nlink != 1 ||
      (st.st_mode & 022) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    *why = "state file " + path + " is not safe to write: it must be a regular file of uid " +
           std::to_string(::geteuid()) + ", with one link, that no one else may write (it has uid " +
           std::to_string(st.st_uid) + ", mode " + mode + ", " + std::to_string(st.st_nlink) + " link(s))";
    ::close(fd);
    return false;
  }
  if (::ftruncate(fd, static_cast<off_t>(kFileBytes)) != 0) {
    *why = "state file " + path + ": " + std::strerror(errno);
    ::close(fd);
    return false;
  }
  void* base = ::mmap(nullptr, kFileBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) {
    *why = "state file " + path + ": mmap: " + std::strerror(errno);
    return false;
  }
  base_ = base;
  bytes_ = kFileBytes;
  used_.assign(kMaxJobs, false);
  auto* header = static_cast<Header*>(base_);
  // What the predecessor left: only a file in our format, GPUs matched by UUID.
  if (header->magic == kMagic && header->version == kVersion && header->gpu_count <= kMaxGpus) {
    std::vector<int> index_of(header->gpu_count, -1);
    for (size_t old = 0; old < header->gpu_count; ++old) {
      for (size_t now = 0; now < gpus.size(); ++now) {
        if (std::memcmp(header->uuids[old], gpus[now].data(), 16) == 0) index_of[old] = static_cast<int>(now);
      }
    }
    for (size_t i = 0; i < kMaxJobs; ++i) {
      const Slot* s = slot(i);
      if (s->job == 0) continue;
      Entry entry{s->job, static_cast<pid_t>(s->pid), static_cast<uid_t>(s->uid), std::vector<uint64_t>(gpus.size(), 0)};
      for (size_t old = 0; old < header->gpu_count; ++old) {
        if (index_of[old] >= 0) entry.held[static_cast<size_t>(index_of[old])] = s->held[old];
      }
      previous->push_back(std::move(entry));
    }
  }
  std::memset(base_, 0, bytes_);
  header->version = kVersion;
  header->gpu_count = gpus.size();
  for (size_t g = 0; g < gpus.size(); ++g) std::memcpy(header->uuids[g], gpus[g].data(), 16);
  std::atomic_thread_fence(std::memory_order_release);
  header->magic = kMagic;
  return true;
}

int StateFile::claim(uint64_t job, pid_t pid, uid_t uid) {
  if (base_ == nullptr) return -1;
  for (size_t i = 0; i < kMaxJobs; ++i) {
    if (used_[i]) continue;
    used_[i] = true;
    Slot* s = slot(i);
    s->pid = static_cast<uint32_t>(pid);
    s->uid = static_cast<uint32_t>(uid);
    std::memset(s->held, 0, sizeof s->held);
    std::atomic_ref<uint64_t>(s->job).store(job, std::memory_order_release);
    return static_cast<int>(i);
  }
  return -1;
}

void StateFile::set_held(int index, size_t gpu, uint64_t chunks) {
  if (base_ == nullptr || index < 0 || gpu >= kMaxGpus) return;
  std::atomic_ref<uint64_t>(slot(static_cast<size_t>(index))->held[gpu]).store(chunks, std::memory_order_release);
}

void StateFile::release(int index) {
  if (base_ == nullptr || index < 0) return;
  std::atomic_ref<uint64_t>(slot(static_cast<size_t>(index))->job).store(0, std::memory_order_release);
  used_[static_cast<size_t>(index)] = false;
}

}  // namespace zico::sharing
