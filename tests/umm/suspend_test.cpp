// Host store, chunk eviction and allocator suspend/resume on SimDriver.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>

#include <cstring>
#include <random>

#include "chunk_map.h"
#include "device_allocator.h"
#include "driver_contract_test.h"
#include "host_store.h"
#include "nvme_store.h"
#include "sim_driver.h"

namespace zico::testing {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

// A store that fails its Nth save or load (counting from 1), for the failure contract.
class FailingStore final : public BackingStore {
 public:
  explicit FailingStore(BackingStore& inner) : inner_(inner) {}
  int fail_save_at = 0, fail_load_at = 0;
  Residency residency() const override { return inner_.residency(); }
  size_t chunk_bytes() const override { return inner_.chunk_bytes(); }
  Status reserve_slot(uint32_t* slot) override { return inner_.reserve_slot(slot); }
  void release_slot(uint32_t slot) override { inner_.release_slot(slot); }
  Status save(std::span<const ChunkTransfer> chunks, StreamHandle stream) override {
    if (++saves_ == fail_save_at) return Status(Errc::kOsError, EIO);
    return inner_.save(chunks, stream);
  }
  Status load(std::span<const ChunkTransfer> chunks, StreamHandle stream) override {
    if (++loads_ == fail_load_at) return Status(Errc::kOsError, EIO);
    return inner_.load(chunks, stream);
  }

 private:
  BackingStore& inner_;
  int saves_ = 0, loads_ = 0;
};

TEST(HostStore, ReusesSlotsGrowsAndShrinks) {
  SimDriver driver;
  std::unique_ptr<HostStore> store;
  std::string why;
  ASSERT_TRUE(HostStore::create(driver, DeviceId{0}, 2 * kMiB, HostStoreOptions{4}, &store, &why).is_ok()) << why;
  std::vector<uint32_t> slots(6);
  for (uint32_t& s : slots) ZICO_ASSERT_OK(store->reserve_slot(&s));
  EXPECT_EQ(store->slots_in_use(), 6u);
  EXPECT_EQ(store->reserved_bytes(), 8 * 2 * kMiB) << "two blocks of four slots";
  for (uint32_t s : slots) std::memset(store->slot_data(s), static_cast<int>(s), 2 * kMiB);  // every slot writable
  for (uint32_t s : slots) store->release_slot(s);
  uint32_t again = 0;
  ZICO_ASSERT_OK(store->reserve_slot(&again));
  EXPECT_LT(again, 8u) << "a released slot is reused";
  store->release_slot(again);
  store->shrink();
  EXPECT_EQ(store->reserved_bytes(), 0u);
}

class SuspendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SimOptions sim;
    sim.capacity = 256 * kMiB;
    driver_ = std::make_unique<SimDriver>(sim);
    AllocatorOptions options;
    options.budget_bytes = 128 * kMiB;
    std::string why;
    ASSERT_TRUE(DeviceAllocator::create(*driver_, DeviceId{0}, options, &allocator_, &why).is_ok()) << why;
    ASSERT_TRUE(HostStore::create(*driver_, DeviceId{0}, allocator_->chunk_bytes(), {}, &store_, &why).is_ok()) << why;
  }
  void TearDown() override {
    allocator_.reset();
    store_.reset();
  }
  struct Block {
    uint8_t* p;
    size_t bytes;
    uint8_t seed;
  };
  std::vector<Block> fill_blocks() {
    std::vector<Block> blocks;
    std::mt19937 rng(5);
    for (size_t bytes : {size_t{700}, size_t{40000}, 3 * kMiB, size_t{100}, 9 * kMiB, 20 * kMiB}) {
      void* p = nullptr;
      EXPECT_TRUE(allocator_->allocate(bytes, StreamHandle{}, &p).is_ok());
      Block b{static_cast<uint8_t*>(p), bytes, static_cast<uint8_t>(rng())};
      for (size_t i = 0; i < bytes; ++i) b.p[i] = static_cast<uint8_t>(b.seed + i * 7);
      blocks.push_back(b);
    }
    return blocks;
  }
  static bool intact(const Block& b) {
    for (size_t i = 0; i < b.bytes; ++i) {
      if (b.p[i] != static_cast<uint8_t>(b.seed + i * 7)) return false;
    }
    return true;
  }
  std::unique_ptr<SimDriver> driver_;
  std::unique_ptr<DeviceAllocator> allocator_;
  std::unique_ptr<HostStore> store_;
};

TEST_F(SuspendTest, ReleasesAllDeviceMemoryAndRestoresDataAtTheSameAddresses) {
  const std::vector<Block> blocks = fill_blocks();
  void* freed = nullptr;
  ZICO_ASSERT_OK(allocator_->allocate(6 * kMiB, StreamHandle{}, &freed));
  ZICO_ASSERT_OK(allocator_->deallocate(freed, StreamHandle{}));  // cached memory needs no saving

  ZICO_ASSERT_OK(allocator_->suspend(*store_));
  EXPECT_TRUE(allocator_->suspended());
  EXPECT_EQ(allocator_->stats().mapped_bytes, 0u);
  EXPECT_EQ(driver_->counters().live_chunks, 0u) << "every physical chunk went back to the driver";
  EXPECT_GT(store_->slots_in_use(), 0u);
  void* p = nullptr;
  EXPECT_EQ(allocator_->allocate(4096, StreamHandle{}, &p).code(), Errc::kSuspended);

  ZICO_ASSERT_OK(allocator_->resume());
  EXPECT_FALSE(allocator_->suspended());
  EXPECT_EQ(store_->slots_in_use(), 0u);
  for (const Block& b : blocks) EXPECT_TRUE(intact(b)) << b.bytes << "-byte block";
  ZICO_ASSERT_OK(allocator_->allocate(4096, StreamHandle{}, &p));
}

TEST_F(SuspendTest, SuspendsToTheNvmeStoreAndBack) {
  const std::vector<Block> blocks = fill_blocks();
  NvmeStoreOptions options;
  options.directory = ::testing::TempDir() + "/zicoum-suspend-nvme";
  std::filesystem::create_directories(options.directory);
  std::unique_ptr<NvmeStore> nvme;
  std::string why;
  ASSERT_TRUE(NvmeStore::create(*driver_, DeviceId{0}, allocator_->chunk_bytes(), options, &nvme, &why).is_ok()) << why;
  ZICO_ASSERT_OK(allocator_->suspend(*nvme));
  EXPECT_EQ(driver_->counters().live_chunks, 0u);
  ZICO_ASSERT_OK(allocator_->resume());
  for (const Block& b : blocks) EXPECT_TRUE(intact(b));
}

// A job killed while it evicts: its device memory dies with the process (the
// driver frees it), and the swap file it leaves is removed by a later store
// that opens in that directory, once the dead process's io_uring has been torn
// down. That is the whole guarantee: a suspend is the job's own act, so there
// is no one left who could need the data.
TEST_F(SuspendTest, AJobKilledMidEvictionLeavesOnlyAFileTheNextStoreRemoves) {
  const std::string dir = ::testing::TempDir() + "/zicoum-killed";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    (void)fill_blocks();
    NvmeStoreOptions options;
    options.directory = dir;
    std::unique_ptr<NvmeStore> nvme;
    std::string why;
    if (!NvmeStore::create(*driver_, DeviceId{0}, allocator_->chunk_bytes(), options, &nvme, &why).is_ok()) _exit(2);
    // Die inside the second batch of the eviction.
    class KillingStore final : public BackingStore {
     public:
      explicit KillingStore(BackingStore& inner) : inner_(inner) {}
      Residency residency() const override { return inner_.residency(); }
      size_t chunk_bytes() const override { return inner_.chunk_bytes(); }
      Status reserve_slot(uint32_t* slot) override { return inner_.reserve_slot(slot); }
      void release_slot(uint32_t slot) override { inner_.release_slot(slot); }
      Status save(std::span<const ChunkTransfer> chunks, StreamHandle stream) override {
        const Status status = inner_.save(chunks.subspan(0, chunks.size() / 2), stream);
        if (status.is_ok()) raise(SIGKILL);
        return status;
      }
      Status load(std::span<const ChunkTransfer> chunks, StreamHandle stream) override { return inner_.load(chunks, stream); }

     private:
      BackingStore& inner_;
    } killing(*nvme);
    (void)allocator_->suspend(killing);
    _exit(3);  // not reached
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "the child was to die mid-eviction";
  auto swap_files = [&] {
    size_t n = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) n += entry.path().extension() == ".swap";
    return n;
  };
  EXPECT_EQ(swap_files(), 1u) << "the killed job's swap file is left behind";
  // The kernel tears a dead process's io_uring down asynchronously, and its
  // registered file keeps the swap file's lock until then: cleanup retries.
  for (int attempt = 0; attempt < 200 && swap_files() > 0; ++attempt) {
    (void)NvmeStore::clean_stale_files(dir);
    usleep(10'000);
  }
  EXPECT_EQ(swap_files(), 0u) << "the stale file was removed once its lock was gone";
  NvmeStoreOptions options;
  options.directory = dir;
  std::unique_ptr<NvmeStore> next;
  std::string why;
  ASSERT_TRUE(NvmeStore::create(*driver_, DeviceId{0}, allocator_->chunk_bytes(), options, &next, &why).is_ok()) << why;
  EXPECT_EQ(swap_files(), 1u) << "only the new store's own file";
}

// Regression: suspend must wait for running work even when there is no idle
// memory to trim; otherwise it saves stale data and unmaps under a kernel.
TEST_F(SuspendTest, WaitsForRunningWorkBeforeSavingIt) {
  StreamHandle busy;
  ZICO_ASSERT_OK(driver_->stream_create(DeviceId{0}, &busy));
  void* p = nullptr;
  ZICO_ASSERT_OK(allocator_->allocate(2 * kMiB, busy, &p));  // fills its chunk: nothing idle to trim
  driver_->hold_stream(busy);
  ZICO_ASSERT_OK(driver_->memset_async(p, 0x6B, 2 * kMiB, busy));  // a kernel still writing
  ZICO_ASSERT_OK(allocator_->suspend(*store_));
  EXPECT_EQ(allocator_->stats().mapped_bytes, 0u);
  ZICO_ASSERT_OK(allocator_->resume());
  EXPECT_EQ(static_cast<uint8_t*>(p)[0], 0x6B) << "the kernel's writes were saved";
  EXPECT_EQ(static_cast<uint8_t*>(p)[2 * kMiB - 1], 0x6B);
}

TEST_F(SuspendTest, DestroyingASuspendedAllocatorGivesTheSlotsBack) {
  (void)fill_blocks();
  ZICO_ASSERT_OK(allocator_->suspend(*store_));
  EXPECT_GT(store_->slots_in_use(), 0u);
  allocator_.reset();
  EXPECT_EQ(store_->slots_in_use(), 0u);
}

TEST_F(SuspendTest, AFailedSuspendChangesNothing) {
  const std::vector<Block> blocks = fill_blocks();
  FailingStore failing(*store_);
  failing.fail_save_at = 1;
  EXPECT_FALSE(allocator_->suspend(failing).is_ok());
  EXPECT_FALSE(allocator_->suspended());
  EXPECT_EQ(store_->slots_in_use(), 0u) << "slots of the failed batch were given back";
  for (const Block& b : blocks) EXPECT_TRUE(intact(b));
  void* p = nullptr;
  ZICO_ASSERT_OK(allocator_->allocate(4096, StreamHandle{}, &p));
}

TEST_F(SuspendTest, AFailedResumeKeepsTheDataAndCanBeRetried) {
  const std::vector<Block> blocks = fill_blocks();
  FailingStore failing(*store_);
  failing.fail_load_at = 1;
  ZICO_ASSERT_OK(allocator_->suspend(failing));
  EXPECT_FALSE(allocator_->resume().is_ok());
  EXPECT_TRUE(allocator_->suspended());
  EXPECT_EQ(allocator_->stats().mapped_bytes, 0u) << "the half-made mappings were removed";
  driver_->inject_failure(SimOp::kCreate, 2);  // and a driver failure on the next try
  EXPECT_FALSE(allocator_->resume().is_ok());
  ZICO_ASSERT_OK(allocator_->resume());
  for (const Block& b : blocks) EXPECT_TRUE(intact(b));
}

// The requirement: 10,000 random evictions and restorations of single
// chunks, every byte verified, with injected store failures that must reach
// the caller as errors and never as wrong data.
TEST(ChunkEviction, TenThousandRandomEvictionsAndRestoresKeepEveryByte) {
  constexpr size_t kChunk = 64 << 10;
  constexpr size_t kChunks = 32;
  SimOptions sim;
  sim.granularity = kChunk;
  sim.capacity = 4 * kChunks * kChunk;
  SimDriver driver(sim);
  VaRange arena;
  ZICO_ASSERT_OK(driver.reserve(DeviceId{0}, kChunks * kChunk, 0, &arena));
  DriverChunkSource source(driver, DeviceId{0}, kChunk);
  ChunkMap chunks(driver, source, DeviceId{0}, arena, kChunk);
  ZICO_ASSERT_OK(chunks.map_range(arena.base, arena.bytes));
  chunks.ref(arena.base, arena.bytes);
  std::unique_ptr<HostStore> host;
  std::string why;
  ASSERT_TRUE(HostStore::create(driver, DeviceId{0}, kChunk, HostStoreOptions{8}, &host, &why).is_ok()) << why;
  StreamHandle stream;
  ZICO_ASSERT_OK(driver.stream_create(DeviceId{0}, &stream));

  std::mt19937_64 rng(11);
  std::vector<uint64_t> seed(kChunks);
  auto fill = [&](size_t index) {
    seed[index] = rng();
    auto* words = reinterpret_cast<uint64_t*>(chunks.address_of(index));
    for (size_t w = 0; w < kChunk / 8; ++w) words[w] = seed[index] ^ (w * 0x9e3779b97f4a7c15ULL);
  };
  auto verify = [&](size_t index) {
    const auto* words = reinterpret_cast<const uint64_t*>(chunks.address_of(index));
    for (size_t w = 0; w < kChunk / 8; ++w) {
      if (words[w] != (seed[index] ^ (w * 0x9e3779b97f4a7c15ULL))) return false;
    }
    return true;
  };
  for (size_t i = 0; i < kChunks; ++i) fill(i);

  size_t errors_seen = 0;
  for (int op = 0; op < 10000; ++op) {
    const size_t index = rng() % kChunks;
    const bool inject = rng() % 50 == 0;
    if (chunks.residency(index) == Residency::kMapped) {
      const size_t one[] = {index};
      FailingStore once(*host);
      if (inject) once.fail_save_at = 1;
      const Status status = chunks.evict(one, once, stream);
      if (inject) {
        ASSERT_FALSE(status.is_ok());
        ++errors_seen;
        ASSERT_EQ(chunks.residency(index), Residency::kMapped);
        ASSERT_TRUE(verify(index)) << "a failed eviction must leave the data mapped";
      } else {
        ASSERT_TRUE(status.is_ok()) << status.message();
        ASSERT_EQ(chunks.residency(index), Residency::kHost);
      }
    } else {
      const size_t one[] = {index};
      FailingStore once(*host);
      if (inject) once.fail_load_at = 1;
      const Status status = chunks.restore(one, once, stream);
      if (inject) {
        ASSERT_FALSE(status.is_ok());
        ++errors_seen;
        ASSERT_EQ(chunks.residency(index), Residency::kHost) << "a failed restore leaves the data in the store";
      } else {
        ASSERT_TRUE(status.is_ok()) << status.message();
        ASSERT_TRUE(verify(index)) << "mismatch after restoring chunk " << index;
        if (rng() % 4 == 0) fill(index);  // new contents for the next round trip
      }
    }
  }
  EXPECT_GT(errors_seen, 100u);
  for (size_t i = 0; i < kChunks; ++i) {
    if (chunks.residency(i) != Residency::kMapped) {
      const size_t one[] = {i};
      ZICO_ASSERT_OK(chunks.restore(one, *host, stream));
    }
    EXPECT_TRUE(verify(i)) << "chunk " << i;
  }
  EXPECT_EQ(host->slots_in_use(), 0u);
  chunks.unmap_all();
}

}  // namespace
}  // namespace zico::testing
