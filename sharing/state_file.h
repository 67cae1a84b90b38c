// StateFile: what each live job holds, kept where a restarted zico-umd finds it.
//
// A new daemon cannot see what jobs hold until they reconnect, and must not
// lend that memory meanwhile. So the daemon keeps, in a shared mapping of a
// small file, one slot per job: its id, pid, uid and the chunks it holds on
// each GPU. Holdings are updated with one aligned 8-byte store before each
// grant is sent and after each return, so the file is exact at every
// instant, costs no system call, and a daemon killed at any point leaves it
// consistent (the kernel keeps the pages of a shared file mapping). A slot is
// claimed by writing its id last.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "protocol.h"

namespace zico::sharing {

class StateFile {
 public:
  static constexpr size_t kMaxGpus = 16;
  static constexpr size_t kMaxJobs = 4096;

  struct Entry {
    uint64_t job = 0;
    pid_t pid = 0;
    uid_t uid = 0;
    std::vector<uint64_t> held;  // per current GPU index
  };

  StateFile() = default;
  ~StateFile();
  StateFile(const StateFile&) = delete;
  StateFile& operator=(const StateFile&) = delete;

  // Opens (creating) the file, reads what a predecessor left (*previous: its
  // jobs, GPUs matched by UUID onto `gpus` indices), then starts afresh.
  [[nodiscard]] bool open(const std::string& path, std::span<const proto::GpuUuid> gpus, std::vector<Entry>* previous,
                          std::string* why);
  [[nodiscard]] bool is_open() const { return base_ != nullptr; }

  // A slot for the job, or -1 when the file is full (the job is then not
  // protected across a restart; logged by the caller).
  [[nodiscard]] int claim(uint64_t job, pid_t pid, uid_t uid);
  void set_held(int slot, size_t gpu, uint64_t chunks);
  void release(int slot);

 private:
  struct Slot;
  Slot* slot(size_t index) const;
  void* base_ = nullptr;
  size_t bytes_ = 0;
  std::vector<bool> used_;
};

}  // namespace zico::sharing
