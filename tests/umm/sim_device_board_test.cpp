// Simulated devices shared by several drivers (processes) through a board
// file: each sees what the others hold, and an allocation on a full device
// takes the others' unused managed memory, as on a GPU under the UVM driver.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "sim_device_board.h"
#include "sim_driver.h"

namespace zico::testing {
namespace {

constexpr size_t kPage = size_t{2} << 20;
constexpr DeviceId kDevice{0};

SimOptions eight_pages() {
  SimOptions o;
  o.capacity = 8 * kPage;
  return o;
}

class SimDeviceBoardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = ::testing::TempDir() + "zico_board_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::remove(path_.c_str());
  }
  void TearDown() override { std::remove(path_.c_str()); }

  void share(SimDriver& driver) {
    std::string why;
    ASSERT_TRUE(driver.share_devices(path_, &why).is_ok()) << why;
  }
  static size_t free_of(SimDriver& driver) {
    size_t free_bytes = 0, total = 0;
    EXPECT_TRUE(driver.memory_info(kDevice, &free_bytes, &total).is_ok());
    return free_bytes;
  }
  // A kernel that touches `pages` pages of `base` (each page then holds device memory).
  static void touch(SimDriver& driver, void* base, size_t pages) {
    const VaRange range{reinterpret_cast<uintptr_t>(base), pages * kPage};
    ASSERT_TRUE(driver.run_kernel(std::span<const VaRange>(&range, 1), 0).is_ok());
  }
  // In a forked child: a driver of its own on the board takes 6 pages;
  // whether it could. It is never destroyed (the child _exits), so its slot
  // stays behind, as after a crash.
  bool child_takes_six_pages() const {
    auto* dying = new SimDriver(eight_pages());
    std::string why;
    PhysHandle chunk;
    return dying->share_devices(path_, &why).is_ok() && dying->create(kDevice, 6 * kPage, &chunk).is_ok();
  }
  static void to_host(SimDriver& driver, void* base, size_t pages) {
    ASSERT_TRUE(driver.managed_prefetch(base, pages * kPage, PrefetchTarget{true, kDevice}, StreamHandle{}).is_ok());
  }

  std::string path_;
};

TEST_F(SimDeviceBoardTest, EachDriverSeesWhatTheOthersHold) {
  SimDriver a(eight_pages());
  SimDriver b(eight_pages());
  share(a);
  share(b);
  PhysHandle chunk;
  ASSERT_TRUE(a.create(kDevice, 2 * kPage, &chunk).is_ok());
  EXPECT_EQ(free_of(b), 6 * kPage);
  void* managed = nullptr;
  ASSERT_TRUE(b.managed_allocate(4 * kPage, &managed).is_ok());
  touch(b, managed, 3);
  EXPECT_EQ(free_of(a), 3 * kPage);
  PhysHandle too_big;
  EXPECT_EQ(a.create(kDevice, 8 * kPage, &too_big).code(), Errc::kOutOfMemory)
      << "a's own chunk is no managed memory to take";
  PhysHandle more;
  ASSERT_TRUE(a.create(kDevice, 4 * kPage, &more).is_ok()) << "b's pages in use are evicted for it";
  EXPECT_EQ(free_of(b), 0u);  // b's next call: it gives up a page
  EXPECT_EQ(b.managed_stats().resident_bytes, 2 * kPage);
  EXPECT_EQ(b.managed_stats().driver_evictions, 1u);
  ASSERT_TRUE(a.release(more).is_ok());
  ASSERT_TRUE(a.release(chunk).is_ok());
  EXPECT_EQ(free_of(b), 6 * kPage);
  ASSERT_TRUE(b.managed_free(managed).is_ok());
}

// What the H100 showed: the pages a unified-memory job sent to the host keep
// their device memory, so another process sees it used; an allocation that
// needs it gets it (the UVM driver hands unused chunks over), and the owner
// gives it up at its next call, its pages in use untouched while unused
// memory covers the allocation.
TEST_F(SimDeviceBoardTest, AnAllocationOnAFullDeviceTakesAnotherProcesssUnusedManagedMemory) {
  SimDriver um(eight_pages());
  SimDriver vmm(eight_pages());
  share(um);
  share(vmm);
  void* managed = nullptr;
  ASSERT_TRUE(um.managed_allocate(8 * kPage, &managed).is_ok());
  touch(um, managed, 8);
  to_host(um, managed, 5);
  EXPECT_EQ(um.managed_stats().resident_bytes, 3 * kPage);
  EXPECT_EQ(free_of(vmm), 0u) << "the evicted pages' memory still counts as used";
  PhysHandle chunk;
  ASSERT_TRUE(vmm.create(kDevice, 4 * kPage, &chunk).is_ok());
  EXPECT_EQ(free_of(vmm), 0u);
  EXPECT_EQ(free_of(um), 0u);
  const SimManagedStats s = um.managed_stats();
  EXPECT_EQ(s.chunk_bytes, 4 * kPage) << "gave up four unused chunks";
  EXPECT_EQ(s.resident_bytes, 3 * kPage) << "no page in use left";
  EXPECT_EQ(s.driver_evictions, 0u);
  // Pages that lost their memory come back with new memory within what the
  // device has left for them (four pages): the owner's remaining unused chunk
  // goes first, then its own pages in use make room.
  touch(um, managed, 3);
  EXPECT_EQ(um.managed_stats().chunk_bytes, 4 * kPage);
  EXPECT_EQ(um.managed_stats().driver_evictions, 2u);
  // More than the unused memory: pages in use are evicted for it, the owner
  // copying them out at its next call.
  PhysHandle more;
  ASSERT_TRUE(vmm.create(kDevice, 2 * kPage, &more).is_ok());
  EXPECT_EQ(free_of(um), 0u);
  EXPECT_EQ(um.managed_stats().chunk_bytes, 2 * kPage);
  EXPECT_EQ(um.managed_stats().driver_evictions, 4u);
  ASSERT_TRUE(vmm.release(more).is_ok());
  ASSERT_TRUE(vmm.release(chunk).is_ok());
  ASSERT_TRUE(um.managed_free(managed).is_ok());
  EXPECT_EQ(free_of(vmm), 8 * kPage);
}

// Two unified-memory jobs: pages the second needs on a full device take the
// first's unused memory before the second evicts any page of its own.
TEST_F(SimDeviceBoardTest, AManagedPageOnAFullDeviceTakesAnotherProcesssUnusedMemoryFirst) {
  SimDriver first(eight_pages());
  SimDriver second(eight_pages());
  share(first);
  share(second);
  void* a = nullptr;
  void* b = nullptr;
  ASSERT_TRUE(first.managed_allocate(6 * kPage, &a).is_ok());
  ASSERT_TRUE(second.managed_allocate(4 * kPage, &b).is_ok());
  touch(first, a, 6);
  to_host(first, a, 4);  // four unused chunks kept
  touch(second, b, 2);   // the two free pages
  const VaRange more{reinterpret_cast<uintptr_t>(b) + 2 * kPage, 2 * kPage};
  ASSERT_TRUE(second.run_kernel(std::span<const VaRange>(&more, 1), 0).is_ok());
  EXPECT_EQ(second.managed_stats().driver_evictions, 0u) << "the other's unused memory went first";
  EXPECT_EQ(second.managed_stats().chunk_bytes, 4 * kPage);
  EXPECT_EQ(free_of(first), 0u);  // its next call: it gives up what was taken
  EXPECT_EQ(first.managed_stats().chunk_bytes, 4 * kPage) << "gave up two unused chunks";
  EXPECT_EQ(first.managed_stats().resident_bytes, 2 * kPage);
  ASSERT_TRUE(first.managed_free(a).is_ok());
  ASSERT_TRUE(second.managed_free(b).is_ok());
}

// Takers racing for one process's unused memory never take more than it has.
TEST_F(SimDeviceBoardTest, TakersAtOnceNeverTakeMoreThanThereIs) {
  std::string why;
  std::unique_ptr<SimDeviceBoard> owner;
  ASSERT_TRUE(SimDeviceBoard::open(path_, &owner, &why).is_ok()) << why;
  constexpr uint64_t kUnused = 4000;
  owner->publish(0, kUnused, kUnused, kUnused);
  std::vector<std::unique_ptr<SimDeviceBoard>> takers(4);
  for (auto& taker : takers) ASSERT_TRUE(SimDeviceBoard::open(path_, &taker, &why).is_ok()) << why;
  std::vector<uint64_t> took(takers.size(), 0);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < takers.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) took[t] += takers[t]->take_unused(0, 1);
    });
  }
  for (std::thread& thread : threads) thread.join();
  uint64_t total = 0;
  for (const uint64_t n : took) total += n;
  EXPECT_EQ(total, kUnused);
  EXPECT_EQ(owner->taken_from_me(0), kUnused);
}

TEST_F(SimDeviceBoardTest, ADeadProcesssMemoryIsForgotten) {
  SimDriver alive(eight_pages());
  share(alive);
  const pid_t child = ::fork();
  if (child == 0) ::_exit(child_takes_six_pages() ? 0 : 1);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(free_of(alive), 8 * kPage);
  SimDriver next(eight_pages());
  share(next);  // takes a slot, maybe the dead one's
  EXPECT_EQ(free_of(next), 8 * kPage);
}

// A process that has exited but is not yet reaped (a zombie) still answers
// kill(pid, 0), yet its memory is gone: it is forgotten as soon as it exits.
TEST_F(SimDeviceBoardTest, AnExitedProcessNotYetReapedIsForgotten) {
  SimDriver alive(eight_pages());
  share(alive);
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    const char byte = child_takes_six_pages() ? 1 : 0;
    (void)::write(ready[1], &byte, 1);
    ::_exit(0);
  }
  ::close(ready[1]);
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  ::close(ready[0]);
  ASSERT_EQ(byte, 1) << "the child could not take its memory";
  // Until it has exited its memory counts; then, unreaped, it no longer does.
  bool forgotten = false;
  for (int tries = 0; tries < 500 && !forgotten; ++tries) {
    forgotten = free_of(alive) == 8 * kPage;
    if (!forgotten) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_TRUE(forgotten) << "an exited process's memory still counted";
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
}

TEST_F(SimDeviceBoardTest, AFileThatIsNoBoardIsRefusedByName) {
  std::ofstream(path_) << "not a board";
  SimDriver driver(eight_pages());
  std::string why;
  EXPECT_EQ(driver.share_devices(path_, &why).code(), Errc::kConfigError);
  EXPECT_NE(why.find(path_), std::string::npos) << why;
  EXPECT_NE(why.find("not a simulated device board"), std::string::npos) << why;
}

}  // namespace
}  // namespace zico::testing
