// NvmeStore on SimDriver: "device" chunks are host-addressable memfd
// mappings, the swap file is real (O_DIRECT through io_uring in a temporary
// directory), and faults are injected through NvmeStore::inject_fault or by
// writing into the file behind the store's back.
#include "nvme_store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <liburing.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "log.h"
#include "sim_driver.h"

namespace zico::testing {
namespace {

namespace fs = std::filesystem;

#define ZICO_ASSERT_OK(expr)                                            \
  do {                                                                  \
    const ::zico::Status zico_s_ = (expr);                              \
    ASSERT_TRUE(zico_s_.is_ok()) << #expr << ": " << zico_s_.message(); \
  } while (0)

constexpr size_t kMiB = size_t{1} << 20;

// A deterministic pattern per (seed, byte): cheap to write and to check.
void fill(void* p, size_t bytes, uint64_t seed) {
  auto* words = static_cast<uint64_t*>(p);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < bytes / 8; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    words[i] = x;
  }
}

bool matches(const void* p, size_t bytes, uint64_t seed) {
  std::vector<uint64_t> expected(bytes / 8);
  fill(expected.data(), bytes, seed);
  return std::memcmp(p, expected.data(), bytes) == 0;
}

NvmeStoreOptions in_dir(const std::string& dir) {
  NvmeStoreOptions options;
  options.directory = dir;
  return options;
}

class NvmeStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fresh_dir("store");
    // What the store needs from the machine; a container's seccomp profile
    // often refuses io_uring (EPERM/ENOSYS), and some file systems O_DIRECT.
    io_uring ring{};
    if (const int rc = io_uring_queue_init(4, &ring, 0); rc < 0) {
      GTEST_SKIP() << "io_uring is unavailable here: " << strerror(-rc);
    }
    io_uring_queue_exit(&ring);
    const std::string probe = dir_ + "/probe";
    const int fd = open(probe.c_str(), O_CREAT | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
    if (fd < 0) GTEST_SKIP() << ::testing::TempDir() << " does not support O_DIRECT: " << strerror(errno);
    close(fd);
    unlink(probe.c_str());
  }

  void TearDown() override {
    store_.reset();
    for (const std::string& mount : mounts_) umount2(mount.c_str(), MNT_DETACH);
    std::error_code ignored;
    fs::remove_all(root_, ignored);
  }

  std::string fresh_dir(const std::string& name) {
    if (root_.empty()) {
      const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
      root_ = ::testing::TempDir() + "zicoum-nvme-" + std::to_string(getpid()) + "-" + test->name();
      fs::remove_all(root_);
      fs::create_directories(root_);
    }
    const std::string dir = root_ + "/" + name;
    fs::create_directories(dir);
    return dir;
  }

  // A SimDriver with `chunk`-sized granularity and `count` mapped, accessible chunks.
  void make_device(size_t chunk, size_t count) {
    SimOptions sim;
    sim.granularity = chunk;
    sim.capacity = chunk * (count + 4);
    driver_ = std::make_unique<SimDriver>(sim);
    chunk_ = chunk;
    VaRange reservation;
    ASSERT_TRUE(driver_->reserve(DeviceId{0}, chunk * count, 0, &reservation).is_ok());
    for (size_t i = 0; i < count; ++i) {
      PhysHandle handle;
      const VaRange range{reservation.base + i * chunk, chunk};
      ASSERT_TRUE(driver_->create(DeviceId{0}, chunk, &handle).is_ok());
      ASSERT_TRUE(driver_->map(range, handle).is_ok());
      ASSERT_TRUE(driver_->set_access(DeviceId{0}, range).is_ok());
      ASSERT_TRUE(driver_->release(handle).is_ok());
      device_.push_back(range.ptr());
    }
    ASSERT_TRUE(driver_->stream_create(DeviceId{0}, &stream_).is_ok());
  }

  Status open_store(NvmeStoreOptions options = {}, const std::string& dir = {}) {
    options.directory = dir.empty() ? dir_ : dir;
    Status status = NvmeStore::create(*driver_, DeviceId{0}, chunk_, options, &store_, &why_);
    EXPECT_TRUE(status.is_ok() || !why_.empty());
    return status;
  }

  std::vector<uint32_t> reserve(size_t n) {
    std::vector<uint32_t> slots(n);
    for (uint32_t& slot : slots) EXPECT_TRUE(store_->reserve_slot(&slot).is_ok());
    return slots;
  }

  std::vector<ChunkTransfer> transfers(const std::vector<uint32_t>& slots, size_t first_chunk = 0) {
    std::vector<ChunkTransfer> out;
    for (size_t i = 0; i < slots.size(); ++i) out.push_back({slots[i], device_[first_chunk + i]});
    return out;
  }

  void fill_device(size_t first, size_t n, uint64_t seed) {
    for (size_t i = first; i < first + n; ++i) fill(device_[i], chunk_, seed + i);
  }
  void scribble_device(size_t first, size_t n) {
    for (size_t i = first; i < first + n; ++i) std::memset(device_[i], 0xEE, chunk_);
  }
  size_t mismatches(size_t first, size_t n, uint64_t seed) {
    size_t bad = 0;
    for (size_t i = first; i < first + n; ++i) bad += matches(device_[i], chunk_, seed + i) ? 0 : 1;
    return bad;
  }

  // Overwrites 4 KiB in the middle of `slot` behind the store's back.
  void corrupt(uint32_t slot) {
    const int fd = open(store_->path().c_str(), O_WRONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0) << strerror(errno);
    std::vector<char> garbage(4096, 0x5A);
    ASSERT_EQ(pwrite(fd, garbage.data(), garbage.size(), static_cast<off_t>(store_->slot_offset(slot) + chunk_ / 2)),
              4096);
    close(fd);
  }

  std::string root_, dir_, why_;
  std::vector<std::string> mounts_;
  std::unique_ptr<SimDriver> driver_;  // outlives store_
  std::unique_ptr<NvmeStore> store_;
  std::vector<void*> device_;
  size_t chunk_ = 0;
  StreamHandle stream_{};
};

TEST_F(NvmeStoreTest, RoundTripsManyChunksAndReusesSlots) {
  make_device(2 * kMiB, 24);
  ZICO_ASSERT_OK(open_store());
  EXPECT_EQ(store_->residency(), Residency::kNvme);
  // Without CAP_IPC_LOCK, RLIMIT_MEMLOCK may refuse the registration; the store then uses plain I/O.
  if (geteuid() == 0) {
    EXPECT_TRUE(store_->fixed_buffers());
  }
  std::vector<uint32_t> slots = reserve(24);
  fill_device(0, 24, 100);
  // Batches of uneven sizes: one chunk, fewer than the staging buffers, many more.
  ZICO_ASSERT_OK(store_->save(transfers({slots.begin(), slots.begin() + 1}, 0), stream_));
  ZICO_ASSERT_OK(store_->save(transfers({slots.begin() + 1, slots.begin() + 4}, 1), stream_));
  ZICO_ASSERT_OK(store_->save(transfers({slots.begin() + 4, slots.end()}, 4), stream_));
  scribble_device(0, 24);
  ZICO_ASSERT_OK(store_->load(transfers(slots), stream_));
  EXPECT_EQ(mismatches(0, 24, 100), 0u);
  EXPECT_EQ(store_->file_bytes(), 24 * chunk_);
  EXPECT_EQ(store_->counters().bytes_written, 24 * chunk_);
  EXPECT_EQ(store_->counters().bytes_read, 24 * chunk_);

  // Loading again gives the same data: a load leaves the slot saved.
  scribble_device(0, 2);
  ZICO_ASSERT_OK(store_->load(transfers({slots[0], slots[1]}), stream_));
  EXPECT_EQ(mismatches(0, 2, 100), 0u);

  // Released slots come back without growing the file, and hold new data.
  for (size_t i = 0; i < 12; ++i) store_->release_slot(slots[i]);
  EXPECT_EQ(store_->slots_in_use(), 12u);
  std::vector<uint32_t> again = reserve(12);
  for (uint32_t slot : again) EXPECT_LT(slot, 24u);
  EXPECT_EQ(store_->file_bytes(), 24 * chunk_);
  fill_device(0, 12, 7000);
  ZICO_ASSERT_OK(store_->save(transfers(again), stream_));
  scribble_device(0, 24);
  ZICO_ASSERT_OK(store_->load(transfers(again), stream_));
  ZICO_ASSERT_OK(store_->load(transfers({slots.begin() + 12, slots.end()}, 12), stream_));
  EXPECT_EQ(mismatches(0, 12, 7000), 0u);
  EXPECT_EQ(mismatches(12, 12, 100), 0u);
}

// Few buffers, small requests and a shallow queue: requests wait for slots
// in the ring, and every chunk is many requests.
TEST_F(NvmeStoreTest, RoundTripsWithShallowQueueAndSmallRequests) {
  make_device(2 * kMiB, 10);
  NvmeStoreOptions options;
  options.queue_depth = 3;
  options.staging_buffers = 2;
  options.io_bytes = 64 << 10;
  ZICO_ASSERT_OK(open_store(options));
  std::vector<uint32_t> slots = reserve(10);
  fill_device(0, 10, 5);
  ZICO_ASSERT_OK(store_->save(transfers(slots), stream_));
  EXPECT_EQ(store_->counters().write_requests, 10u * 32);
  scribble_device(0, 10);
  ZICO_ASSERT_OK(store_->load(transfers(slots), stream_));
  EXPECT_EQ(mismatches(0, 10, 5), 0u);
}

// Regression: with fewer requests in flight than a chunk needs, a batch could
// reap everything in flight and stop with requests still queued, reporting
// success for chunks never fully written or read. Queue depth 1 makes every
// chunk go through that point dozens of times.
TEST_F(NvmeStoreTest, FinishesEveryRequestWhenTheQueueIsShallowerThanAChunk) {
  make_device(2 * kMiB, 8);
  NvmeStoreOptions options;
  options.queue_depth = 1;
  options.staging_buffers = 2;
  options.io_bytes = 64 << 10;
  ZICO_ASSERT_OK(open_store(options));
  std::vector<uint32_t> slots = reserve(8);
  for (int round = 0; round < 5; ++round) {
    fill_device(0, 8, static_cast<uint8_t>(40 + round));
    ZICO_ASSERT_OK(store_->save(transfers(slots), stream_));
    scribble_device(0, 8);
    ZICO_ASSERT_OK(store_->load(transfers(slots), stream_));
    ASSERT_EQ(mismatches(0, 8, static_cast<uint8_t>(40 + round)), 0u) << "round " << round;
  }
  EXPECT_EQ(store_->counters().write_requests, 5u * 8 * 32);
  EXPECT_EQ(store_->counters().checksum_failures, 0u);
}

// The caller's stream still has work queued (a busy GPU): save must wait for
// its copies through the events, not read stale staging buffers.
TEST_F(NvmeStoreTest, WaitsForCopiesOnABusyStream) {
  make_device(2 * kMiB, 6);
  ZICO_ASSERT_OK(open_store());
  std::vector<uint32_t> slots = reserve(6);
  fill_device(0, 6, 31);
  driver_->hold_stream(stream_);
  ZICO_ASSERT_OK(store_->save(transfers(slots), stream_));
  scribble_device(0, 6);
  driver_->hold_stream(stream_);
  ZICO_ASSERT_OK(store_->load(transfers(slots), stream_));
  ZICO_ASSERT_OK(driver_->release_stream(stream_));
  EXPECT_EQ(mismatches(0, 6, 31), 0u);
}

TEST_F(NvmeStoreTest, DetectsACorruptSlot) {
  make_device(2 * kMiB, 4);
  ZICO_ASSERT_OK(open_store());
  std::vector<uint32_t> slots = reserve(4);
  fill_device(0, 4, 9);
  ZICO_ASSERT_OK(store_->save(transfers(slots), stream_));
  corrupt(slots[2]);
  scribble_device(0, 4);
  const Status status = store_->load(transfers(slots), stream_);
  EXPECT_EQ(status.code(), Errc::kOsError);
  EXPECT_EQ(status.detail(), EIO);
  EXPECT_EQ(store_->counters().checksum_failures, 1u);
  EXPECT_NE(store_->last_error().find("checksum mismatch in slot " + std::to_string(slots[2])), std::string::npos)
      << store_->last_error();
  EXPECT_NE(store_->last_error().find(store_->path()), std::string::npos);
  // Never wrong data: the corrupt chunk did not reach the device.
  for (size_t i = 0; i < chunk_; i += 4096) ASSERT_EQ(static_cast<unsigned char*>(device_[2])[i], 0xEE);
  // The other slots are fine and load alone.
  ZICO_ASSERT_OK(store_->load(transfers({slots[0], slots[1]}), stream_));
  EXPECT_EQ(mismatches(0, 2, 9), 0u);
}

TEST_F(NvmeStoreTest, WriteErrorFailsTheBatchAndLeavesTheDeviceIntact) {
  make_device(2 * kMiB, 8);
  ZICO_ASSERT_OK(open_store());
  std::vector<uint32_t> slots = reserve(8);
  fill_device(0, 8, 77);
  store_->inject_fault(NvmeOp::kWrite, 9, EIO);  // a request of the third chunk
  const Status status = store_->save(transfers(slots), stream_);
  EXPECT_EQ(status.code(), Errc::kOsError);
  EXPECT_EQ(status.detail(), EIO);
  EXPECT_NE(store_->last_error().find("write of slot"), std::string::npos) << store_->last_error();
  EXPECT_EQ(mismatches(0, 8, 77), 0u) << "save must only read the device";
  // Every slot of the failed batch is empty: loading any of them is refused.
  for (uint32_t slot : slots) {
    std::vector<ChunkTransfer> one{{slot, device_[0]}};
    EXPECT_EQ(store_->load(one, stream_).code(), Errc::kInvalidArgument);
  }
  // The store is still usable.
  ZICO_ASSERT_OK(store_->save(transfers(slots), stream_));
  scribble_device(0, 8);
  ZICO_ASSERT_OK(store_->load(transfers(slots), stream_));
  EXPECT_EQ(mismatches(0, 8, 77), 0u);
}

TEST_F(NvmeStoreTest, EnospcOnWriteIsOutOfMemory) {
  make_device(2 * kMiB, 3);
  ZICO_ASSERT_OK(open_store());
  std::vector<uint32_t> slots = reserve(3);
  fill_device(0, 3, 1);
  store_->inject_fault(NvmeOp::kWrite, 1, ENOSPC);
  const Status status = store_->save(transfers(slots), stream_);
  EXPECT_EQ(status.code(), Errc::kOutOfMemory);
  EXPECT_EQ(status.detail(), ENOSPC);
  EXPECT_EQ(mismatches(0, 3, 1), 0u);
}

TEST_F(NvmeStoreTest, ReadErrorKeepsTheSlots) {
  make_device(2 * kMiB, 5);
  ZICO_ASSERT_OK(open_store());
  std::vector<uint32_t> slots = reserve(5);
  fill_device(0, 5, 3);
  ZICO_ASSERT_OK(store_->save(transfers(slots), stream_));
  scribble_device(0, 5);
  store_->inject_fault(NvmeOp::kRead, 6, EIO);
  const Status status = store_->load(transfers(slots), stream_);
  EXPECT_EQ(status.code(), Errc::kOsError);
  EXPECT_EQ(status.detail(), EIO);
  ZICO_ASSERT_OK(store_->load(transfers(slots), stream_));
  EXPECT_EQ(mismatches(0, 5, 3), 0u);
}

TEST_F(NvmeStoreTest, ShortTransfersAreCompleted) {
  make_device(2 * kMiB, 6);
  ZICO_ASSERT_OK(open_store());
  std::vector<uint32_t> slots = reserve(6);
  fill_device(0, 6, 42);
  store_->inject_fault(NvmeOp::kWrite, 2, 0);
  ZICO_ASSERT_OK(store_->save(transfers(slots), stream_));
  EXPECT_EQ(store_->counters().short_transfers, 1u);
  scribble_device(0, 6);
  store_->inject_fault(NvmeOp::kRead, 7, 0);
  ZICO_ASSERT_OK(store_->load(transfers(slots), stream_));
  EXPECT_EQ(store_->counters().short_transfers, 2u);
  EXPECT_EQ(mismatches(0, 6, 42), 0u);
}

TEST_F(NvmeStoreTest, CopyFailuresReachTheCaller) {
  make_device(2 * kMiB, 2);
  ZICO_ASSERT_OK(open_store());
  std::vector<uint32_t> slots = reserve(2);
  fill_device(0, 2, 8);
  ZICO_ASSERT_OK(store_->save(transfers(slots), stream_));
  // A device address that is reserved but not mapped: the H2D copy fails.
  VaRange hole;
  ZICO_ASSERT_OK(driver_->reserve(DeviceId{0}, chunk_, 0, &hole));
  std::vector<ChunkTransfer> bad{{slots[0], device_[0]}, {slots[1], hole.ptr()}};
  EXPECT_FALSE(store_->load(bad, stream_).is_ok());
  scribble_device(0, 2);
  ZICO_ASSERT_OK(store_->load(transfers(slots), stream_));
  EXPECT_EQ(mismatches(0, 2, 8), 0u);
  // And the D2H copy: the batch fails and its slots are empty.
  EXPECT_FALSE(store_->save(bad, stream_).is_ok());
  std::vector<ChunkTransfer> first{{slots[0], device_[0]}};
  EXPECT_EQ(store_->load(first, stream_).code(), Errc::kInvalidArgument);
  ZICO_ASSERT_OK(driver_->unreserve(hole));
}

TEST_F(NvmeStoreTest, RejectsBadBatches) {
  make_device(2 * kMiB, 2);
  ZICO_ASSERT_OK(open_store());
  std::vector<uint32_t> slots = reserve(2);
  std::vector<ChunkTransfer> twice{{slots[0], device_[0]}, {slots[0], device_[1]}};
  EXPECT_EQ(store_->save(twice, stream_).code(), Errc::kInvalidArgument);
  std::vector<ChunkTransfer> unknown{{99, device_[0]}};
  EXPECT_EQ(store_->save(unknown, stream_).code(), Errc::kInvalidArgument);
  std::vector<ChunkTransfer> never_saved{{slots[1], device_[1]}};
  EXPECT_EQ(store_->load(never_saved, stream_).code(), Errc::kInvalidArgument);
  store_->release_slot(slots[1]);
  EXPECT_EQ(store_->save(never_saved, stream_).code(), Errc::kInvalidArgument) << "a released slot";
  ZICO_ASSERT_OK(store_->save({}, stream_));
}

TEST_F(NvmeStoreTest, GrowFailureHandsOutNoSlot) {
  make_device(2 * kMiB, 1);
  ZICO_ASSERT_OK(open_store());
  std::vector<uint32_t> slots = reserve(2);
  store_->inject_fault(NvmeOp::kGrow, 1, ENOSPC);
  uint32_t slot = 12345;
  const Status status = store_->reserve_slot(&slot);
  EXPECT_EQ(status.code(), Errc::kOutOfMemory);
  EXPECT_EQ(slot, 12345u);
  EXPECT_EQ(store_->slots_in_use(), 2u);
  EXPECT_NE(store_->last_error().find(store_->path()), std::string::npos) << store_->last_error();
  ZICO_ASSERT_OK(store_->reserve_slot(&slot));
  EXPECT_EQ(slot, 2u);
}

TEST_F(NvmeStoreTest, RealEnospcOnASmallFileSystem) {
  if (geteuid() != 0) GTEST_SKIP() << "mounting a loop device needs root";
  if (std::system("command -v mkfs.ext4 >/dev/null 2>&1") != 0) GTEST_SKIP() << "mkfs.ext4 is not installed";
  const std::string image = root_ + "/fs.img", mount_point = fresh_dir("mnt");
  const std::string make = "truncate -s 16M " + image + " && mkfs.ext4 -q -F -O ^has_journal " + image +
                           " >/dev/null 2>&1";
  ASSERT_EQ(std::system(make.c_str()), 0);
  const std::string mount_cmd = "mount -o loop " + image + " " + mount_point + " >/dev/null 2>&1";
  if (std::system(mount_cmd.c_str()) != 0) GTEST_SKIP() << "mount -o loop failed (no loop devices here?)";
  mounts_.push_back(mount_point);

  make_device(2 * kMiB, 16);
  ZICO_ASSERT_OK(open_store({}, mount_point));
  std::vector<uint32_t> slots;
  Status status;
  for (int i = 0; i < 16 && status.is_ok(); ++i) {
    uint32_t slot = 0;
    status = store_->reserve_slot(&slot);
    if (status.is_ok()) slots.push_back(slot);
  }
  ASSERT_FALSE(status.is_ok()) << "16 MiB of ext4 held 32 MiB?";
  EXPECT_EQ(status.code(), Errc::kOutOfMemory);
  EXPECT_EQ(status.detail(), ENOSPC);
  EXPECT_NE(store_->last_error().find("No space left"), std::string::npos) << store_->last_error();
  ASSERT_GE(slots.size(), 2u);
  EXPECT_EQ(store_->slots_in_use(), slots.size());
  // Nothing lost: every slot handed out holds its chunk.
  fill_device(0, slots.size(), 600);
  ZICO_ASSERT_OK(store_->save(transfers(slots), stream_));
  scribble_device(0, slots.size());
  ZICO_ASSERT_OK(store_->load(transfers(slots), stream_));
  EXPECT_EQ(mismatches(0, slots.size(), 600), 0u);
  // Space comes back through the free list.
  store_->release_slot(slots.back());
  uint32_t slot = 0;
  ZICO_ASSERT_OK(store_->reserve_slot(&slot));
  EXPECT_EQ(slot, slots.back());
}

TEST_F(NvmeStoreTest, RemovesItsFileAndStaleFilesOfDeadJobs) {
  make_device(2 * kMiB, 1);
  // A pid that is certainly gone: a child that has exited and been reaped.
  const pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  auto touch = [&](const std::string& name) {
    const std::string path = dir_ + "/" + name;
    const int fd = open(path.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    close(fd);
    return path;
  };
  const std::string dead = touch("zicoum-" + std::to_string(child) + "-dev0.swap");
  const std::string recycled = touch("zicoum-" + std::to_string(getpid()) + "-old.swap");  // an earlier us
  const std::string alive = touch("zicoum-1-dev0.swap");                                   // init lives
  const std::string unrelated = touch("zicoum-notapid.swap");
  const std::string no_tag = touch("zicoum-" + std::to_string(child) + "-.swap");

  ZICO_ASSERT_OK(open_store());
  const std::string path = store_->path();
  const std::string prefix = dir_ + "/zicoum-" + std::to_string(getpid()) + "-dev0-";
  EXPECT_TRUE(path.starts_with(prefix) && path.ends_with(".swap")) << path;
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_FALSE(fs::exists(recycled));
  EXPECT_TRUE(fs::exists(alive));
  EXPECT_TRUE(fs::exists(unrelated));
  EXPECT_TRUE(fs::exists(no_tag));
  // A live store's file survives cleaning, even under our own pid: it is locked.
  EXPECT_EQ(NvmeStore::clean_stale_files(dir_), 0u);
  EXPECT_TRUE(fs::exists(path));
  // A second store of this process gets a name of its own (the random part);
  // an explicit tag that is already taken is refused with the path.
  std::unique_ptr<NvmeStore> second;
  std::string why;
  ZICO_ASSERT_OK(NvmeStore::create(*driver_, DeviceId{0}, chunk_, in_dir(dir_), &second, &why));
  EXPECT_NE(second->path(), path);
  second.reset();
  NvmeStoreOptions tagged = in_dir(dir_);
  tagged.job_tag = "job-17.b";
  ZICO_ASSERT_OK(NvmeStore::create(*driver_, DeviceId{0}, chunk_, tagged, &second, &why));
  EXPECT_TRUE(fs::exists(dir_ + "/zicoum-" + std::to_string(getpid()) + "-job-17.b.swap"));
  std::unique_ptr<NvmeStore> clash;
  EXPECT_FALSE(NvmeStore::create(*driver_, DeviceId{0}, chunk_, tagged, &clash, &why).is_ok());
  EXPECT_NE(why.find("job-17.b"), std::string::npos) << why;
  second.reset();
  store_.reset();
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(dir_ + "/zicoum-" + std::to_string(getpid()) + "-job-17.b.swap"));
}

// A forked child that runs its exit handlers (and so destroys its copy of the
// store) must leave the parent's swap file alone.
TEST_F(NvmeStoreTest, AForkedChildDoesNotRemoveTheFile) {
  make_device(2 * kMiB, 2);
  ZICO_ASSERT_OK(open_store());
  std::vector<uint32_t> slots = reserve(2);
  fill_device(0, 2, 12);
  ZICO_ASSERT_OK(store_->save(transfers(slots), stream_));
  const pid_t child = fork();
  if (child == 0) {
    store_.reset();
    _exit(0);
  }
  ASSERT_GT(child, 0);
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0);
  EXPECT_TRUE(fs::exists(store_->path()));
  scribble_device(0, 2);
  ZICO_ASSERT_OK(store_->load(transfers(slots), stream_));
  EXPECT_EQ(mismatches(0, 2, 12), 0u);
}

TEST_F(NvmeStoreTest, ErrorsNameThePath) {
  make_device(2 * kMiB, 1);
  const std::string missing = root_ + "/no/such/dir";
  const Status status = open_store({}, missing);
  EXPECT_FALSE(status.is_ok());
  EXPECT_NE(why_.find(missing), std::string::npos) << why_;
  EXPECT_EQ(store_, nullptr);

  const std::string file = root_ + "/plain-file";
  close(open(file.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600));
  EXPECT_FALSE(open_store({}, file).is_ok());
  EXPECT_NE(why_.find(file), std::string::npos) << why_;

  // The last component is created when missing.
  ZICO_ASSERT_OK(open_store({}, root_ + "/new"));

  NvmeStoreOptions bad_tag;
  bad_tag.job_tag = "../escape";
  std::unique_ptr<NvmeStore> other;
  bad_tag.directory = dir_;
  EXPECT_EQ(NvmeStore::create(*driver_, DeviceId{0}, chunk_, bad_tag, &other, &why_).code(), Errc::kInvalidArgument);
  EXPECT_EQ(NvmeStore::create(*driver_, DeviceId{0}, 1000, in_dir(dir_), &other, &why_).code(),
            Errc::kInvalidArgument);
}

TEST_F(NvmeStoreTest, UnwritableDirectoryNamesThePath) {
  if (geteuid() == 0) GTEST_SKIP() << "root writes anywhere; run as a user to check EACCES";
  make_device(2 * kMiB, 1);
  const std::string locked = fresh_dir("locked");
  fs::permissions(locked, fs::perms::owner_read | fs::perms::owner_exec);
  EXPECT_FALSE(open_store({}, locked).is_ok());
  EXPECT_NE(why_.find(locked), std::string::npos) << why_;
}

// A refused swap folder: the sentence names it, what is wrong and the fix,
// and no swap file was made in it.
void expect_refused(const Status& status, const std::string& why, const std::string& folder, const std::string& fault) {
  EXPECT_FALSE(status.is_ok()) << folder << " was used";
  EXPECT_NE(why.find("swap folder " + folder + " "), std::string::npos) << why;
  EXPECT_NE(why.find(fault), std::string::npos) << why;
  EXPECT_NE(why.find("ZICO_SWAP_DIR"), std::string::npos) << "no fix given: " << why;
  if (fs::is_directory(folder)) {
    EXPECT_TRUE(fs::is_empty(folder)) << folder;
  }
}

TEST_F(NvmeStoreTest, RefusesASwapFolderAnotherUserOwns) {
  if (geteuid() != 0) GTEST_SKIP() << "giving a folder to another uid needs root";
  make_device(2 * kMiB, 1);
  const std::string theirs = fresh_dir("theirs");
  ASSERT_EQ(chown(theirs.c_str(), 65534, 65534), 0) << strerror(errno);
  // Root could write there; the owner could still lock every job out or remove its files.
  expect_refused(open_store({}, theirs), why_, theirs, "is owned by uid 65534");
  EXPECT_NE(why_.find("ask uid 65534 or root to remove it"), std::string::npos) << why_;
  // Root's folders are trusted.
  ASSERT_EQ(chown(theirs.c_str(), 0, 0), 0) << strerror(errno);
  ZICO_ASSERT_OK(open_store({}, theirs));
}

TEST_F(NvmeStoreTest, RefusesASwapFolderEveryUserMayWriteWithoutTheStickyBit) {
  make_device(2 * kMiB, 1);
  const std::string open_to_all = fresh_dir("open-to-all");
  ASSERT_EQ(chmod(open_to_all.c_str(), 0777), 0) << strerror(errno);
  expect_refused(open_store({}, open_to_all), why_, open_to_all, "writable by every user (mode 0777)");
  EXPECT_NE(why_.find("chmod"), std::string::npos) << why_;
  // Sticky, as /var/tmp: others may add files, not remove ours.
  ASSERT_EQ(chmod(open_to_all.c_str(), 01777), 0) << strerror(errno);
  ZICO_ASSERT_OK(open_store({}, open_to_all));
  store_.reset();
  // A group its owner lets write is the owner's choice (umask 002 makes such folders).
  ASSERT_EQ(chmod(open_to_all.c_str(), 0775), 0) << strerror(errno);
  ZICO_ASSERT_OK(open_store({}, open_to_all));
}

TEST_F(NvmeStoreTest, RefusesASymbolicLinkInPlaceOfTheSwapFolder) {
  make_device(2 * kMiB, 1);
  const std::string target = fresh_dir("target");
  const std::string link = root_ + "/link";
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0) << strerror(errno);
  expect_refused(open_store({}, link), why_, link, "is a symbolic link");
  EXPECT_NE(why_.find("the folder it points to"), std::string::npos) << why_;
  EXPECT_TRUE(fs::is_empty(target)) << "a swap file went through the link";
  ZICO_ASSERT_OK(open_store({}, target));
}

// A folder the store makes is the user's alone, whatever the umask allows.
TEST_F(NvmeStoreTest, MakesAMissingSwapFolderPrivate) {
  make_device(2 * kMiB, 1);
  const std::string made = root_ + "/made";
  const mode_t old_mask = umask(0);
  const Status status = open_store({}, made);
  umask(old_mask);
  ZICO_ASSERT_OK(status);
  struct stat st{};
  ASSERT_EQ(lstat(made.c_str(), &st), 0) << strerror(errno);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_uid, geteuid());
  EXPECT_EQ(st.st_mode & 07777, 0700u);
}

// No ZICO_SWAP_DIR: the user's own folder in /var/tmp, never one shared by all.
TEST_F(NvmeStoreTest, DefaultSwapFolderIsTheUsersOwn) {
  make_device(2 * kMiB, 1);
  const std::string folder = NvmeStore::default_directory();
  EXPECT_EQ(folder, "/var/tmp/zicoum-" + std::to_string(geteuid()));
  std::unique_ptr<NvmeStore> store;
  std::string why;
  const Status status = NvmeStore::create(*driver_, DeviceId{0}, chunk_, NvmeStoreOptions{}, &store, &why);
  if (status.code() == Errc::kNotSupported) GTEST_SKIP() << why;
  ASSERT_TRUE(status.is_ok()) << why;
  EXPECT_TRUE(store->path().starts_with(folder + "/zicoum-")) << store->path();
  struct stat st{};
  ASSERT_EQ(lstat(folder.c_str(), &st), 0) << strerror(errno);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_uid, geteuid());
  EXPECT_EQ(st.st_mode & 022, 0u) << "mode " << std::oct << (st.st_mode & 07777);
}

TEST_F(NvmeStoreTest, FileSystemWithoutODirectNamesThePath) {
  make_device(2 * kMiB, 1);
  const std::string shm = "/dev/shm/zicoum-nvme-test-" + std::to_string(getpid());
  fs::create_directories(shm);
  const Status status = open_store({}, shm);
  const bool supported = status.is_ok();
  store_.reset();
  fs::remove_all(shm);
  if (supported) GTEST_SKIP() << "tmpfs supports O_DIRECT on this kernel (>= 6.6); no file system to refuse it";
  EXPECT_EQ(status.code(), Errc::kNotSupported);
  EXPECT_NE(why_.find("O_DIRECT"), std::string::npos) << why_;
  EXPECT_NE(why_.find(shm), std::string::npos) << why_;
}

// Issue requirement: 10,000 random evict/restore operations with verification,
// zero mismatches, every injected error reaching the caller as an error.
// Chunks are 64 KiB so the run stays fast.
TEST_F(NvmeStoreTest, TenThousandRandomOperationsWithFaults) {
  constexpr size_t kChunks = 48;
  make_device(64 << 10, kChunks);
  NvmeStoreOptions options;
  options.io_bytes = 16 << 10;  // 4 requests a chunk, so faults can land mid-chunk
  options.queue_depth = 8;
  options.staging_buffers = 3;
  ZICO_ASSERT_OK(open_store(options));
  // Hundreds of injected failures, each logged as a warning: keep the output readable.
  set_log_level(LogLevel::kError);
  struct QuietLog {
    ~QuietLog() { set_log_level(LogLevel::kWarn); }
  } restore_level;

  struct Model {
    uint64_t seed = 0;
    bool evicted = false;
    uint32_t slot = 0;
  };
  std::vector<Model> model(kChunks);
  std::mt19937_64 rng(20261121);
  uint64_t next_seed = 1;
  for (size_t i = 0; i < kChunks; ++i) {
    model[i].seed = next_seed++;
    fill(device_[i], chunk_, model[i].seed);
  }
  size_t injected = 0, caught = 0, lost_to_corruption = 0, evictions = 0, restores = 0;
  for (int op = 0; op < 10000; ++op) {
    const bool evict = rng() % 2 == 0;
    std::vector<size_t> picked;
    const size_t want = 1 + rng() % 6;
    for (size_t tries = 0; tries < 4 * kChunks && picked.size() < want; ++tries) {
      const size_t i = rng() % kChunks;
      if (model[i].evicted != evict && std::find(picked.begin(), picked.end(), i) == picked.end()) picked.push_back(i);
    }
    if (picked.empty()) continue;
    std::vector<ChunkTransfer> batch;
    const size_t requests = picked.size() * 4;
    const int fault = static_cast<int>(rng() % 20);  // 0-1: error, 2: short, 3: corrupt (restore), else none
    if (evict) {
      for (size_t i : picked) {
        uint32_t slot = 0;
        ASSERT_TRUE(store_->reserve_slot(&slot).is_ok());
        batch.push_back({slot, device_[i]});
      }
      if (fault <= 1) store_->inject_fault(NvmeOp::kWrite, 1 + rng() % requests, fault == 0 ? EIO : ENOSPC);
      if (fault == 2) store_->inject_fault(NvmeOp::kWrite, 1 + rng() % requests, 0);
      const Status status = store_->save(batch, stream_);
      injected += fault <= 1;
      if (!status.is_ok()) {
        ASSERT_LE(fault, 1) << "op " << op << ": " << status.message();
        ++caught;
        for (const ChunkTransfer& c : batch) store_->release_slot(c.slot);
        for (size_t i : picked) ASSERT_TRUE(matches(device_[i], chunk_, model[i].seed)) << "op " << op;
        continue;
      }
      ASSERT_GT(fault, 1) << "op " << op << ": an injected write error was swallowed";
      for (size_t k = 0; k < picked.size(); ++k) {
        model[picked[k]].evicted = true;
        model[picked[k]].slot = batch[k].slot;
        std::memset(device_[picked[k]], static_cast<int>(op & 0xFF), chunk_);  // the memory is gone
      }
      ++evictions;
    } else {
      for (size_t i : picked) batch.push_back({model[i].slot, device_[i]});
      size_t corrupted = kChunks;
      if (fault <= 1) store_->inject_fault(NvmeOp::kRead, 1 + rng() % requests, EIO);
      if (fault == 2) store_->inject_fault(NvmeOp::kRead, 1 + rng() % requests, 0);
      if (fault == 3) {
        corrupted = picked[rng() % picked.size()];
        corrupt(model[corrupted].slot);
      }
      const Status status = store_->load(batch, stream_);
      const bool expect_error = fault <= 1 || fault == 3;
      injected += expect_error;
      if (!status.is_ok()) {
        ASSERT_TRUE(expect_error) << "op " << op << ": " << status.message();
        ++caught;
        if (corrupted != kChunks) {  // that chunk's data is gone; the job would see the error
          ++lost_to_corruption;
          store_->release_slot(model[corrupted].slot);
          model[corrupted] = Model{next_seed++, false, 0};
          fill(device_[corrupted], chunk_, model[corrupted].seed);
        }
        continue;  // the other slots keep their data and are restored later
      }
      ASSERT_FALSE(expect_error) << "op " << op << ": an injected read error or corruption was swallowed";
      for (size_t i : picked) {
        ASSERT_TRUE(matches(device_[i], chunk_, model[i].seed)) << "op " << op << " chunk " << i;
        store_->release_slot(model[i].slot);
        model[i].evicted = false;
        // The chunk is written to while resident.
        model[i].seed = next_seed++;
        fill(device_[i], chunk_, model[i].seed);
      }
      ++restores;
    }
  }
  // Bring everything home and check it all.
  for (size_t i = 0; i < kChunks; ++i) {
    if (!model[i].evicted) continue;
    std::vector<ChunkTransfer> one{{model[i].slot, device_[i]}};
    ZICO_ASSERT_OK(store_->load(one, stream_));
  }
  size_t bad = 0;
  for (size_t i = 0; i < kChunks; ++i) bad += matches(device_[i], chunk_, model[i].seed) ? 0 : 1;
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(caught, injected);
  EXPECT_GT(evictions, 2000u);
  EXPECT_GT(restores, 2000u);
  EXPECT_GT(store_->counters().short_transfers, 100u);
  EXPECT_GT(lost_to_corruption, 50u);
  RecordProperty("injected_errors", static_cast<int>(injected));
}

}  // namespace
}  // namespace zico::testing
