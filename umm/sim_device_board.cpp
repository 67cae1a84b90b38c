#include "sim_device_board.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace zico {

struct SimDeviceBoard::Table {
  struct Device {
    std::atomic<uint64_t> held;     // published by the owner
    std::atomic<uint64_t> unused;   // published by the owner: taken without a copy
    std::atomic<uint64_t> taken;    // added to by takers, cleared by the owner
    std::atomic<uint64_t> managed;  // published by the owner: what may be taken at all
  };
  struct Slot {
    std::atomic<uint64_t> owner;  // pid << 24 | a token of the process; 0: free
    Device devices[kMaxDevices];
  };
  std::atomic<uint64_t> magic;
  Slot slots[kSlots];
};

namespace {

constexpr uint64_t kMagic = 0x5a49434f42524431;  // "ZICOBRD1"
static_assert(std::atomic<uint64_t>::is_always_lock_free, "the board's words are shared between processes");

std::atomic<uint64_t> g_next_token{1};

// Whether /proc says `pid` has exited and awaits its parent (a zombie): its
// memory is gone, though kill(pid, 0) still finds it. False where /proc
// cannot tell.
bool exited(pid_t pid) {
  char path[32];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char text[256];
  const ssize_t n = ::read(fd, text, sizeof text - 1);
  ::close(fd);
  if (n <= 0) return false;
  text[n] = '\0';
  // "pid (comm) S ...": the state follows the last ')' (comm may hold any byte).
  const char* paren = std::strrchr(text, ')');
  return paren != nullptr && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
}

bool alive(uint64_t owner) {
  const auto pid = static_cast<pid_t>(owner >> 24);
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0) return errno != ESRCH;
  return !exited(pid);
}

uint64_t sub_floor(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }

}  // namespace

Status SimDeviceBoard::open(const std::string& path, std::unique_ptr<SimDeviceBoard>* out, std::string* why) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    *why = "cannot open the simulated device board '" + path + "': " + std::strerror(errno);
    return Status(Errc::kConfigError, errno);
  }
  struct stat st {};
  bool ok = ::fstat(fd, &st) == 0;
  // A new board is sized by whoever comes first (the same size either way: zeros).
  if (ok && st.st_size == 0) ok = ::ftruncate(fd, sizeof(Table)) == 0 && ::fstat(fd, &st) == 0;
  if (!ok || static_cast<size_t>(st.st_size) != sizeof(Table)) {
    ::close(fd);
    *why = "'" + path + "' is not a simulated device board (" + std::to_string(st.st_size) + " bytes; a board has " +
           std::to_string(sizeof(Table)) + "): name a new file or one another zicoum process made";
    return Status(Errc::kConfigError);
  }
  void* memory = ::mmap(nullptr, sizeof(Table), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (memory == MAP_FAILED) {
    *why = "cannot map the simulated device board '" + path + "': " + std::strerror(errno);
    return Status(Errc::kConfigError, errno);
  }
  auto* table = static_cast<Table*>(memory);
  uint64_t magic = 0;
  if (!table->magic.compare_exchange_strong(magic, kMagic) && magic != kMagic) {
    ::munmap(memory, sizeof(Table));
    *why = "'" + path + "' is not a simulated device board (its first word is not the board's mark)";
    return Status(Errc::kConfigError);
  }
  const uint64_t mine = static_cast<uint64_t>(::getpid()) << 24 | (g_next_token.fetch_add(1) & 0xffffff);
  for (size_t i = 0; i < kSlots; ++i) {
    Table::Slot& slot = table->slots[i];
    uint64_t owner = slot.owner.load();
    if (owner != 0 && alive(owner)) continue;
    if (!slot.owner.compare_exchange_strong(owner, mine)) continue;
    // A dead process's memory is the driver's again: forget it.
    for (Table::Device& device : slot.devices) {
      device.held.store(0);
      device.unused.store(0);
      device.taken.store(0);
      device.managed.store(0);
    }
    out->reset(new SimDeviceBoard(table, i));
    return Status::ok();
  }
  ::munmap(memory, sizeof(Table));
  *why = "the simulated device board '" + path + "' has no free slot: " + std::to_string(kSlots) +
         " live processes hold one each";
  return Status(Errc::kOutOfMemory);
}

SimDeviceBoard::~SimDeviceBoard() {
  Table::Slot& slot = table_->slots[slot_];
  for (Table::Device& device : slot.devices) {
    device.held.store(0);
    device.unused.store(0);
    device.managed.store(0);
  }
  slot.owner.store(0);
  ::munmap(table_, sizeof(Table));
}

void SimDeviceBoard::publish(int device, uint64_t held_bytes, uint64_t managed_bytes, uint64_t unused_bytes) {
  if (device < 0 || device >= kMaxDevices) return;
  Table::Device& d = table_->slots[slot_].devices[device];
  const uint64_t gross = given_up_[device];
  d.unused.store(unused_bytes + gross);
  d.managed.store(managed_bytes + gross);
  d.held.store(held_bytes + gross);
}

uint64_t SimDeviceBoard::published(size_t slot, int device, Field field) const {
  const Table::Device& d = table_->slots[slot].devices[device];
  switch (field) {
    case Field::kHeld: return d.held.load();
    case Field::kUnused: return d.unused.load();
    case Field::kManaged: return d.managed.load();
  }
  return 0;
}

uint64_t SimDeviceBoard::others(int device, Field field) const {
  if (device < 0 || device >= kMaxDevices) return 0;
  uint64_t sum = 0;
  for (size_t i = 0; i < kSlots; ++i) {
    const Table::Slot& slot = table_->slots[i];
    const uint64_t owner = slot.owner.load();
    if (i == slot_ || owner == 0) continue;
    const uint64_t left = sub_floor(published(i, device, field), slot.devices[device].taken.load());
    if (left != 0 && alive(owner)) sum += left;
  }
  return sum;
}

uint64_t SimDeviceBoard::take(int device, Field field, uint64_t bytes) {
  if (device < 0 || device >= kMaxDevices) return 0;
  uint64_t left = bytes;
  for (size_t i = 0; i < kSlots && left != 0; ++i) {
    Table::Slot& slot = table_->slots[i];
    const uint64_t owner = slot.owner.load();
    if (i == slot_ || owner == 0) continue;
    Table::Device& d = slot.devices[device];
    const uint64_t value = published(i, device, field);
    uint64_t taken = d.taken.load();
    if (sub_floor(value, taken) == 0 || !alive(owner)) continue;  // the look at the process only where it counts
    uint64_t take = 0;
    // Another taker may take from the same slot at once: what is left is
    // judged against `taken` as it is when this one adds to it.
    do {
      take = std::min(left, sub_floor(value, taken));
    } while (take != 0 && !d.taken.compare_exchange_weak(taken, taken + take));
    if (take == 0) continue;
    // Counted as this slot's at once (its next publish says what it really
    // holds): until then the memory is counted twice, never as free.
    table_->slots[slot_].devices[device].held.fetch_add(take);
    left -= take;
  }
  return bytes - left;
}

uint64_t SimDeviceBoard::others_held(int device) const { return others(device, Field::kHeld); }
uint64_t SimDeviceBoard::others_unused(int device) const { return others(device, Field::kUnused); }
uint64_t SimDeviceBoard::others_managed(int device) const { return others(device, Field::kManaged); }
uint64_t SimDeviceBoard::take_unused(int device, uint64_t bytes) { return take(device, Field::kUnused, bytes); }
uint64_t SimDeviceBoard::take_managed(int device, uint64_t bytes) { return take(device, Field::kManaged, bytes); }

uint64_t SimDeviceBoard::taken_from_me(int device) {
  if (device < 0 || device >= kMaxDevices) return 0;
  const uint64_t taken = table_->slots[slot_].devices[device].taken.load();
  // Below what was given up: the slot was claimed anew (its figures zeroed)
  // by a process that took this one for dead; start again from there.
  const uint64_t fresh = taken >= given_up_[device] ? taken - given_up_[device] : 0;
  given_up_[device] = taken;
  return fresh;
}

}  // namespace zico
