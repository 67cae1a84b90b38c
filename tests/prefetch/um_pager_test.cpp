// The live pager (prefetch/um_pager.h) on SimDriver's unified memory: it keeps
// the job's pages on the GPU within the budget (the device never has to evict
// on its own), its view of what faults matches the device's, and it runs the
// policies about as fast as the paging simulator says they run.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <initializer_list>
#include <random>
#include <vector>
#include <string>
#include <thread>
#include <utility>

#include "config.h"
#include "paging_simulator.h"
#include "sim_driver.h"
#include "swap_arena_driver.h"
#include "paging_streams.h"
#include "trace_reader.h"
#include "trace_stream.h"
#include "um_replay.h"

namespace zico::prefetch::testing {
namespace {

constexpr uint64_t kPage = uint64_t{2} << 20;

// A pager over the first `pages` pages of `arena` (managed memory of
// `driver`), or null with a test failure that says why. Its moves run
// inline, so that a test sees each one made when the pager returns (the
// threaded pager: RunsItsMovesOnItsOwnThreadsWithinTheBudget).
std::unique_ptr<UmPager> pager_over(Driver& driver, void* arena, uint64_t pages, UmPagerOptions options) {
  options.pager_threads = false;
  std::unique_ptr<UmPager> pager;
  std::string why;
  EXPECT_TRUE(UmPager::create(driver, DeviceId{0}, VaRange{reinterpret_cast<uintptr_t>(arena), pages * kPage}, kPage,
                              options, &pager, &why)
                  .is_ok())
      << why;
  return pager;
}

TEST(UmPager, ZicoPagingPolicyAcceptsExactlyThePolicies) {
  for (const std::string_view policy : kPolicyNames) {
    Config config;
    std::string error;
    const auto lookup = [&](const char* name) {
      return std::string_view(name) == "ZICO_PAGING_POLICY" ? policy.data() : nullptr;
    };
    EXPECT_TRUE(load_config(lookup, &config, &error).is_ok())
        << policy << ": " << error;
    EXPECT_EQ(config.paging_policy, policy);
  }
}

TEST(UmPager, RefusesWhatCannotWork) {
  SimDriver driver;
  void* arena = nullptr;
  ASSERT_TRUE(driver.managed_allocate(16 * kPage, &arena).is_ok());
  const VaRange range{reinterpret_cast<uintptr_t>(arena), 16 * kPage};
  std::unique_ptr<UmPager> pager;
  std::string why;
  UmPagerOptions options;
  options.budget_bytes = 4 * kPage;
  options.policy = "lru";
  EXPECT_EQ(UmPager::create(driver, DeviceId{0}, range, kPage, options, &pager, &why).code(), Errc::kInvalidArgument);
  EXPECT_NE(why.find("'lru'"), std::string::npos) << why;
  options.policy = "zico";
  options.budget_bytes = kPage / 2;
  EXPECT_EQ(UmPager::create(driver, DeviceId{0}, range, kPage, options, &pager, &why).code(), Errc::kInvalidArgument);
  EXPECT_NE(why.find("holds no"), std::string::npos) << why;
  options.budget_bytes = 4 * kPage;
  EXPECT_EQ(UmPager::create(driver, DeviceId{0}, VaRange{range.base + 4096, kPage}, kPage, options, &pager, &why).code(),
            Errc::kInvalidArgument);
  ASSERT_TRUE(UmPager::create(driver, DeviceId{0}, range, kPage, options, &pager, &why).is_ok()) << why;
  pager.reset();
  ASSERT_TRUE(driver.managed_free(arena).is_ok());

  SimOptions no_faults;
  no_faults.concurrent_managed_access = false;
  SimDriver old_gpu(no_faults);
  ASSERT_TRUE(old_gpu.managed_allocate(16 * kPage, &arena).is_ok());
  EXPECT_EQ(UmPager::create(old_gpu, DeviceId{0}, VaRange{reinterpret_cast<uintptr_t>(arena), 16 * kPage}, kPage,
                            options, &pager, &why)
                .code(),
            Errc::kNotSupported);
  EXPECT_NE(why.find("no concurrent managed access"), std::string::npos) << why;
  ASSERT_TRUE(old_gpu.managed_free(arena).is_ok());
}

// The zico pager over 8 pages of SimDriver's unified memory with a budget
// of 4, and a stream of the application's for work that may still read
// freed blocks.
class PagerDiscards : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(driver_.managed_allocate(8 * kPage, &arena_).is_ok());
    base_ = static_cast<std::byte*>(arena_);
    make_pager("zico");
    ASSERT_TRUE(driver_.stream_create(DeviceId{0}, &busy_).is_ok());
  }
  void make_pager(const char* policy) {
    pager_.reset();
    UmPagerOptions options;
    options.policy = policy;
    options.budget_bytes = 4 * kPage;
    pager_ = pager_over(driver_, arena_, 8, options);
    ASSERT_NE(pager_, nullptr);
  }
  void TearDown() override {
    ASSERT_TRUE(driver_.stream_destroy(busy_).is_ok());
    pager_.reset();
    ASSERT_TRUE(driver_.managed_free(arena_).is_ok());
  }
  // A kernel that uses page `page` (and lets the pager look at its deferred discards).
  void use(size_t page) {
    const VaRange range{reinterpret_cast<uintptr_t>(base_ + page * kPage), kPage};
    pager_->before_kernel(page, std::span<const VaRange>(&range, 1), 1000);
    ASSERT_TRUE(driver_.run_kernel(std::span<const VaRange>(&range, 1), 1000).is_ok());
    pager_->after_kernel();
  }

  SimDriver driver_;
  void* arena_ = nullptr;
  std::byte* base_ = nullptr;
  std::unique_ptr<UmPager> pager_;
  StreamHandle busy_;
};

TEST_F(PagerDiscards, AStreamCreatedWithADestroyedOnesHandleWaitsForItsOwnKernelsPages) {
  // A stream that waited for a page's fetch is not made to wait again; a
  // new stream that happens to get its handle after it is destroyed has not
  // waited for anything, so its kernel waits for the page's fetch.
  pager_->on_allocate(base_, kPage);
  std::memset(base_, 0x21, kPage);
  const VaRange page{reinterpret_cast<uintptr_t>(base_), kPage};
  const auto kernel = [&] {
    pager_->before_kernel(1, std::span<const VaRange>(&page, 1), 1000, nullptr, busy_);
    pager_->after_kernel();
    return pager_->stats().kernel_waits;
  };
  const uint64_t first = kernel();
  EXPECT_GE(first, 1u) << "the first kernel did not wait for its page's fetch";
  EXPECT_EQ(kernel(), first) << "a stream waited twice for one fetch";
  pager_->forget_stream(busy_);
  EXPECT_EQ(kernel(), first + 1) << "a new stream with a destroyed one's handle did not wait for the fetch";
}

TEST_F(PagerDiscards, AKernelAnnouncedWhileAnotherIsInFlightWaitsForItsLaunch) {
  // This thread announces pages 0-3, the whole budget, and launches a little
  // later; another announces pages 4-7 meanwhile. Had its announcement gone
  // ahead, its room would have been this kernel's pages, evicted before it
  // ran (faulted back here; under swapped pages, an illegal address).
  pager_->on_allocate(base_, 4 * kPage);
  pager_->on_allocate(base_ + 4 * kPage, 4 * kPage);
  std::memset(base_, 0x5a, 8 * kPage);  // data on the host: each page must be fetched
  const VaRange mine{reinterpret_cast<uintptr_t>(base_), 4 * kPage};
  const VaRange theirs{reinterpret_cast<uintptr_t>(base_ + 4 * kPage), 4 * kPage};
  std::atomic<bool> announced{false}, theirs_announced{false};
  std::thread other([&] {
    while (!announced.load()) std::this_thread::yield();
    pager_->before_kernel(2, std::span<const VaRange>(&theirs, 1), 1000);
    theirs_announced = true;
    EXPECT_TRUE(driver_.run_kernel(std::span<const VaRange>(&theirs, 1), 1000).is_ok());
    pager_->after_kernel();
  });
  pager_->before_kernel(1, std::span<const VaRange>(&mine, 1), 1000);
  announced = true;
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(theirs_announced.load()) << "another kernel was announced before this one was launched";
  const uint64_t faulted = driver_.managed_stats().faulted_pages;
  ASSERT_TRUE(driver_.run_kernel(std::span<const VaRange>(&mine, 1), 1000).is_ok());
  EXPECT_EQ(driver_.managed_stats().faulted_pages, faulted) << "this kernel's pages left before it ran";
  pager_->after_kernel();
  other.join();
  EXPECT_TRUE(theirs_announced.load());
  EXPECT_LE(pager_->resident_bytes(), 4 * kPage);
}

// A block freed while a stream's queued kernels may still read it: the pages
// it leaves dead are discarded only after that work, and not at all if they
// hold live data again by then.
TEST_F(PagerDiscards, WaitForTheWorkQueuedBeforeTheFree) {
  for (size_t page : {0u, 1u}) {
    pager_->on_allocate(base_ + page * kPage, kPage);
    std::memset(base_ + page * kPage, 0x42, kPage);
    use(page);
  }
  driver_.hold_stream(busy_);  // work still queued on `busy` reads pages 0 and 1
  std::vector<std::byte> seen(2 * kPage);
  ASSERT_TRUE(driver_.copy_async(seen.data(), base_, 2 * kPage, CopyKind::kDeviceToHost, busy_).is_ok());
  pager_->on_free(base_, busy_);
  pager_->on_free(base_ + kPage, busy_);
  EXPECT_EQ(static_cast<int>(base_[0]), 0x42) << "discarded before the queued work ran";
  pager_->on_allocate(base_, kPage / 2);  // page 0 holds live data again; page 1 stays dead
  ASSERT_TRUE(driver_.release_stream(busy_).is_ok());
  EXPECT_EQ(seen[kPage + 1], std::byte{0x42}) << "the queued work read a discarded page";
  use(2);
  EXPECT_EQ(static_cast<int>(base_[0]), 0x42) << "a page live again was discarded";
  EXPECT_EQ(static_cast<int>(base_[kPage]), 0) << "the dead page was never discarded";
  EXPECT_EQ(pager_->stats().discards, 1u);
}

// A block that work on other streams may still read (record_stream) keeps
// its pages: not discarded by its own free, nor by an earlier free's discard
// of the same page that completes later.
TEST_F(PagerDiscards, KeepThePagesOfABlockOtherStreamsUse) {
  StreamHandle reader;
  ASSERT_TRUE(driver_.stream_create(DeviceId{0}, &reader).is_ok());
  pager_->on_allocate(base_, kPage / 2);
  use(0);
  driver_.hold_stream(busy_);  // work queued on `busy` still reads the first block
  std::vector<std::byte> seen(kPage / 2);
  ASSERT_TRUE(driver_.copy_async(seen.data(), base_, kPage / 2, CopyKind::kDeviceToHost, busy_).is_ok());
  pager_->on_free(base_, busy_);  // page 0's discard waits for `busy`
  EXPECT_EQ(pager_->stats().discards, 0u);
  pager_->on_allocate(base_, kPage / 2);
  std::memset(base_, 0x55, kPage / 2);
  use(0);
  driver_.hold_stream(reader);  // another stream still reads the second block
  std::vector<std::byte> read(kPage / 2);
  ASSERT_TRUE(driver_.copy_async(read.data(), base_, kPage / 2, CopyKind::kDeviceToHost, reader).is_ok());
  pager_->on_free(base_, std::nullopt, std::span<const StreamHandle>(&reader, 1));
  EXPECT_EQ(static_cast<int>(base_[0]), 0x55) << "discarded at its free";
  ASSERT_TRUE(driver_.release_stream(busy_).is_ok());
  use(2);
  EXPECT_EQ(static_cast<int>(base_[0]), 0x55) << "the earlier free's discard reached a page another stream reads";
  ASSERT_TRUE(driver_.release_stream(reader).is_ok());
  EXPECT_EQ(read[0], std::byte{0x55});
  use(2);
  EXPECT_EQ(static_cast<int>(base_[0]), 0) << "the dead page was never discarded once every stream was done";
  ASSERT_TRUE(driver_.stream_destroy(reader).is_ok());
}

// Two blocks share a page; the first is freed while another stream still
// reads it (the page stays live: the second block), the second on an idle
// stream: the page, dead now, waits for the first block's reader.
TEST_F(PagerDiscards, HoldAPageSharedWithABlockFreedEarlier) {
  pager_->on_allocate(base_, kPage / 2);
  pager_->on_allocate(base_ + kPage / 2, kPage / 2);
  std::memset(base_, 0x66, kPage);
  use(0);
  driver_.hold_stream(busy_);  // reads the first block
  std::vector<std::byte> read(kPage / 2);
  ASSERT_TRUE(driver_.copy_async(read.data(), base_, kPage / 2, CopyKind::kDeviceToHost, busy_).is_ok());
  pager_->on_free(base_, std::nullopt, std::span<const StreamHandle>(&busy_, 1));
  pager_->on_free(base_ + kPage / 2, std::nullopt);
  EXPECT_EQ(static_cast<int>(base_[0]), 0x66) << "a page another stream reads was discarded";
  ASSERT_TRUE(driver_.release_stream(busy_).is_ok());
  EXPECT_EQ(read[0], std::byte{0x66});
}

// A kernel that needs more pages than the budget holds still runs (the
// driver pages it while it runs), and the pager says so once.
TEST_F(PagerDiscards, AKernelLargerThanTheBudgetIsCounted) {
  pager_->on_allocate(base_, 6 * kPage);
  const VaRange range{reinterpret_cast<uintptr_t>(base_), 6 * kPage};
  for (int i = 0; i < 2; ++i) {
    pager_->before_kernel(7, std::span<const VaRange>(&range, 1), 1000);
    ASSERT_TRUE(driver_.run_kernel(std::span<const VaRange>(&range, 1), 1000).is_ok());
    pager_->after_kernel();
  }
  EXPECT_EQ(pager_->stats().oversized_kernels, 2u);
  use(7);  // a kernel within the budget is not counted
  EXPECT_EQ(pager_->stats().oversized_kernels, 2u);
}

// A node manager lends the job more or asks some back: a smaller budget
// sends the least recently migrated pages to the host at once, never those of
// the kernel running now, and the data comes back intact; a larger one lets
// more pages stay.
TEST_F(PagerDiscards, ABudgetChangeEvictsDownToItAtOnce) {
  for (size_t page = 0; page < 8; ++page) pager_->on_allocate(base_ + page * kPage, kPage);
  for (size_t page = 0; page < 4; ++page) {
    std::memset(base_ + page * kPage, static_cast<int>(0x10 + page), kPage);
    use(page);
  }
  ASSERT_EQ(pager_->resident_bytes(), 4 * kPage);
  EXPECT_EQ(pager_->set_budget(2 * kPage), 2 * kPage);
  EXPECT_EQ(pager_->resident_bytes(), 2 * kPage);
  EXPECT_EQ(driver_.managed_stats().resident_bytes, 2 * kPage) << "the device kept pages the pager gave up";
  EXPECT_EQ(pager_->stats().budget_evictions, 2u);
  // While a kernel runs, its pages stay: the budget shrinks only to them.
  const VaRange running[] = {{reinterpret_cast<uintptr_t>(base_ + 2 * kPage), kPage},
                             {reinterpret_cast<uintptr_t>(base_ + 3 * kPage), kPage}};
  pager_->before_kernel(99, running, 1000);
  EXPECT_EQ(pager_->set_budget(kPage), 2 * kPage) << "the running kernel's pages were evicted";
  EXPECT_EQ(pager_->set_budget(0), 0u) << "a suspension kept the running kernel's pages";
  EXPECT_EQ(driver_.managed_stats().resident_bytes, 0u);
  pager_->after_kernel();
  EXPECT_EQ(pager_->set_budget(kPage), kPage);
  EXPECT_EQ(pager_->set_budget(6 * kPage), 6 * kPage);
  for (size_t page = 0; page < 6; ++page) use(page);
  EXPECT_GT(pager_->resident_bytes(), 4 * kPage) << "the larger budget did not let the pages stay";
  EXPECT_LE(driver_.managed_stats().peak_resident_bytes, 6 * kPage);
  for (size_t page = 0; page < 4; ++page) {
    EXPECT_EQ(static_cast<int>(base_[page * kPage + 7]), 0x10 + static_cast<int>(page)) << "page " << page;
  }
}

// A kernel queued on a busy stream still uses a page the next kernel's room
// is made from: the eviction waits for it, so the page does not fault back
// behind the pager's count and the device never holds more than the budget.
TEST_F(PagerDiscards, AnEvictionWaitsForTheWorkQueuedOnTheKernelsStream) {
  make_pager("um");  // room is made least recently migrated first, and nothing else moves
  for (size_t page = 0; page < 5; ++page) {
    pager_->on_allocate(base_ + page * kPage, kPage);
    std::memset(base_ + page * kPage, static_cast<int>(0x20 + page), kPage);
  }
  for (size_t page = 0; page < 4; ++page) use(page);
  // A kernel reading page 0 is launched on `busy`, whose work is still
  // queued (its read stands for the kernel's).
  driver_.hold_stream(busy_);
  std::vector<std::byte> seen(kPage);
  const VaRange first{reinterpret_cast<uintptr_t>(base_), kPage};
  pager_->before_kernel(0, std::span<const VaRange>(&first, 1), 1000, nullptr, busy_);
  ASSERT_TRUE(driver_.copy_async(seen.data(), base_, kPage, CopyKind::kDeviceToHost, busy_).is_ok());
  pager_->after_kernel();
  const uint64_t faults_before = driver_.managed_stats().faulted_pages;
  // The next kernel's room is page 0, the least recently migrated: its
  // eviction waits for `busy`'s queued read first.
  const VaRange fifth{reinterpret_cast<uintptr_t>(base_ + 4 * kPage), kPage};
  pager_->before_kernel(4, std::span<const VaRange>(&fifth, 1), 1000, nullptr, busy_);
  EXPECT_EQ(seen[7], std::byte{0x20}) << "the eviction did not wait for the kernel queued before it";
  ASSERT_TRUE(driver_.run_kernel(std::span<const VaRange>(&fifth, 1), 1000).is_ok());
  pager_->after_kernel();
  ASSERT_TRUE(driver_.release_stream(busy_).is_ok());
  EXPECT_EQ(driver_.managed_stats().faulted_pages, faults_before + 1) << "only page 4 should fault in";
  EXPECT_LE(driver_.managed_stats().peak_resident_bytes, 4 * kPage);
  EXPECT_EQ(pager_->resident_bytes(), 4 * kPage);
}

// A kernel waits for the migrations made for it, and for none when none was:
// one wait each way when room is made, nothing when its pages are there
// (the "um" policy, which only makes room, so that no plan migrates).
TEST_F(PagerDiscards, AKernelWaitsForTheMigrationsMadeForItAndOnlyThen) {
  make_pager("um");
  for (size_t page = 0; page < 5; ++page) pager_->on_allocate(base_ + page * kPage, kPage);
  for (size_t page = 0; page < 4; ++page) use(page);
  const uint64_t waits_before = driver_.counters().stream_waits;
  const VaRange fifth{reinterpret_cast<uintptr_t>(base_ + 4 * kPage), kPage};
  pager_->before_kernel(4, std::span<const VaRange>(&fifth, 1), 1000, nullptr, busy_);
  pager_->after_kernel();
  EXPECT_EQ(driver_.counters().stream_waits, waits_before + 2) << "room made: the pager waits, then the kernel";
  const uint64_t waits_after_room = driver_.counters().stream_waits;
  pager_->before_kernel(4, std::span<const VaRange>(&fifth, 1), 1000, nullptr, busy_);
  pager_->after_kernel();
  EXPECT_EQ(driver_.counters().stream_waits, waits_after_room) << "a kernel whose pages are there waited";
  EXPECT_EQ(pager_->stats().fences, 2u);
}

// A kernel waits for the pager's stream only when pages come in for it, not
// for the evictions and prefetches the planner queues for later kernels: in
// the steady iteration of six pages cycling through four slots (a millisecond
// a kernel), no kernel faults, and fewer kernels wait than see migrations.
TEST_F(PagerDiscards, AKernelDoesNotWaitForMigrationsMeantForLaterKernels) {
  for (size_t page = 0; page < 6; ++page) pager_->on_allocate(base_ + page * kPage, kPage);
  uint64_t kernels_with_migrations = 0;
  uint64_t kernels_waiting = 0;
  uint64_t faults = 0;
  for (int iteration = 0; iteration < 6; ++iteration) {
    for (size_t page = 0; page < 6; ++page) {
      const VaRange range{reinterpret_cast<uintptr_t>(base_ + page * kPage), kPage};
      const UmPagerStats before = pager_->stats();
      pager_->before_kernel(page, std::span<const VaRange>(&range, 1), 1'000'000);
      const UmPagerStats after = pager_->stats();
      ASSERT_TRUE(driver_.run_kernel(std::span<const VaRange>(&range, 1), 1'000'000).is_ok());
      pager_->after_kernel();
      if (iteration < 5) continue;
      const bool migrated = after.prefetches + after.evictions + after.room_evictions !=
                            before.prefetches + before.evictions + before.room_evictions;
      kernels_with_migrations += migrated;
      kernels_waiting += after.kernel_waits - before.kernel_waits;
      faults += after.faulted_pages - before.faulted_pages;
    }
    pager_->on_iteration();
  }
  EXPECT_EQ(faults, 0u) << "the plan did not hold";
  EXPECT_LT(kernels_waiting, kernels_with_migrations) << "kernels waited for migrations meant for later ones";
}

// Six one-page blocks used in turn by one kernel each, over four slots, for
// three iterations (marked): the stats at the end.
UmPagerStats cycle_six_pages(SimDriver& driver, UmPager& pager, std::byte* base) {
  for (size_t page = 0; page < 6; ++page) {
    pager.on_allocate(base + page * kPage, kPage);
    std::memset(base + page * kPage, static_cast<int>(0x70 + page), kPage);
  }
  for (int iteration = 0; iteration < 3; ++iteration) {
    for (size_t page = 0; page < 6; ++page) {
      const VaRange range{reinterpret_cast<uintptr_t>(base + page * kPage), kPage};
      pager.before_kernel(page, std::span<const VaRange>(&range, 1), 1'000'000);
      EXPECT_TRUE(driver.run_kernel(std::span<const VaRange>(&range, 1), 1'000'000).is_ok());
      pager.after_kernel();
    }
    pager.on_iteration();
  }
  for (size_t page = 0; page < 6; ++page) {
    EXPECT_EQ(static_cast<int>(base[page * kPage + 5]), static_cast<int>(0x70 + page)) << "page " << page;
  }
  return pager.stats();
}

// zico fetches the pages a kernel names that are absent, in the first
// (unplanned) iteration too, before the kernel runs: nothing faults. The
// "um" baseline leaves them to the driver's faults.
TEST_F(PagerDiscards, ZicoFetchesWhatAKernelNamesInsteadOfLettingItFault) {
  const UmPagerStats zico = cycle_six_pages(driver_, *pager_, base_);
  EXPECT_EQ(zico.faulted_pages, 0u);
  EXPECT_EQ(driver_.managed_stats().faulted_pages, 0u) << "the device faulted pages in";
  EXPECT_GE(zico.named_fetches, 6u) << "the cold iteration's pages were not fetched";
  EXPECT_LE(driver_.managed_stats().peak_resident_bytes, 4 * kPage);

  TearDown();
  SetUp();
  make_pager("um");
  const UmPagerStats um = cycle_six_pages(driver_, *pager_, base_);
  EXPECT_GE(um.faulted_pages, 6u) << "the baseline stopped faulting";
  EXPECT_EQ(um.named_fetches, 0u);
}

// The dead pages of a free are discarded in one call, adjacent pages as one
// range.
TEST_F(PagerDiscards, DiscardsTheDeadPagesOfAFreeInOneCall) {
  pager_->on_allocate(base_, 4 * kPage);
  std::memset(base_, 0x11, 4 * kPage);
  const VaRange range{reinterpret_cast<uintptr_t>(base_), 4 * kPage};
  pager_->before_kernel(1, std::span<const VaRange>(&range, 1), 1000);
  ASSERT_TRUE(driver_.run_kernel(std::span<const VaRange>(&range, 1), 1000).is_ok());
  pager_->after_kernel();
  pager_->on_free(base_, std::nullopt);
  EXPECT_EQ(pager_->stats().discards, 4u);
  EXPECT_EQ(pager_->stats().discard_calls, 1u);
  EXPECT_EQ(driver_.managed_stats().discarded_pages, 4u);
  EXPECT_EQ(static_cast<int>(base_[3 * kPage]), 0);
}

// The room a kernel's pages need is made in one call, the victims sorted by
// address: four adjacent pages migrated in reverse order leave as one range.
TEST_F(PagerDiscards, RoomForAKernelLeavesInOneCallOfSortedRanges) {
  make_pager("um");
  for (size_t page = 0; page < 4; ++page) pager_->on_allocate(base_ + page * kPage, kPage);
  pager_->on_allocate(base_ + 4 * kPage, 4 * kPage);
  for (size_t page = 4; page-- > 0;) use(page);
  const uint64_t calls = driver_.counters().prefetch_calls;
  const UmPagerStats before = pager_->stats();
  const VaRange big{reinterpret_cast<uintptr_t>(base_ + 4 * kPage), 4 * kPage};
  pager_->before_kernel(9, std::span<const VaRange>(&big, 1), 1000);
  ASSERT_TRUE(driver_.run_kernel(std::span<const VaRange>(&big, 1), 1000).is_ok());
  pager_->after_kernel();
  const UmPagerStats after = pager_->stats();
  EXPECT_EQ(after.room_evictions - before.room_evictions, 4u);
  EXPECT_EQ(driver_.counters().prefetch_calls - calls, 1u) << "room made one call a page";
  EXPECT_EQ(after.migration_ranges - before.migration_ranges, 1u) << "adjacent victims were not one range";
  EXPECT_LE(driver_.managed_stats().peak_resident_bytes, 4 * kPage);
}

// The last kernel's stream captures a CUDA graph now: the pager's fences stay
// out of it (a record there would be a node of the application's graph), and
// its migrations run unordered, as without a fence.
TEST(UmPager, PutsNoFenceOnAStreamCapturingAGraph) {
  SimOptions sim;
  sim.capturing_stream = 0x5000;
  SimDriver driver(sim);
  void* arena = nullptr;
  ASSERT_TRUE(driver.managed_allocate(2 * kPage, &arena).is_ok());
  auto* base = static_cast<std::byte*>(arena);
  UmPagerOptions options;
  options.policy = "um";
  options.budget_bytes = kPage;
  std::unique_ptr<UmPager> pager = pager_over(driver, arena, 2, options);
  ASSERT_NE(pager, nullptr);
  for (size_t page = 0; page < 2; ++page) {
    pager->on_allocate(base + page * kPage, kPage);
    std::memset(base + page * kPage, static_cast<int>(0x30 + page), kPage);
    const VaRange range{reinterpret_cast<uintptr_t>(base + page * kPage), kPage};
    pager->before_kernel(page, std::span<const VaRange>(&range, 1), 1000, nullptr, StreamHandle{0x5000});
    ASSERT_TRUE(driver.run_kernel(std::span<const VaRange>(&range, 1), 1000).is_ok());
    pager->after_kernel();
  }
  EXPECT_EQ(pager->stats().room_evictions, 1u) << "the second kernel's room was not made";
  EXPECT_EQ(pager->stats().fences, 0u);
  EXPECT_EQ(driver.counters().captured_records, 0u) << "an event was recorded into the graph";
  EXPECT_EQ(driver.counters().stream_waits, 0u);
  EXPECT_EQ(static_cast<int>(base[7]), 0x30);
  pager.reset();
  ASSERT_TRUE(driver.managed_free(arena).is_ok());
}

// Five one-page blocks used in turn by five kernels, with a budget of four
// pages; the first kernel also reads a sixth block its parameters do not
// point to (a pointer kept in device memory). Returns the most the device
// held of the job's pages in iterations 3 to 8, the faults it took there
// and those the pager counted, and the pager's stats.
struct UnseenRun {
  uint64_t resident_after_first_mark = 0;  // the device's, once the first reports were read
  uint64_t most_resident_late = 0;
  uint64_t device_faults_late = 0;
  uint64_t pager_faults_late = 0;
  UmPagerStats stats;
};
UnseenRun run_with_an_unseen_use(bool learn_from_faults) {
  UnseenRun run;
  SimDriver driver;
  void* arena = nullptr;
  EXPECT_TRUE(driver.managed_allocate(8 * kPage, &arena).is_ok());
  auto* base = static_cast<std::byte*>(arena);
  UmPagerOptions options;
  options.budget_bytes = 4 * kPage;
  options.learn_from_faults = learn_from_faults;
  std::unique_ptr<UmPager> pager = pager_over(driver, arena, 8, options);
  if (pager == nullptr) return run;
  EXPECT_EQ(pager->learns_from_faults(), learn_from_faults);
  const auto page_of = [&](size_t page) { return VaRange{reinterpret_cast<uintptr_t>(base + page * kPage), kPage}; };
  for (size_t page = 0; page < 6; ++page) {
    pager->on_allocate(base + page * kPage, kPage);
    std::memset(base + page * kPage, static_cast<int>(0x40 + page), kPage);
  }
  const VaRange hidden = page_of(5);
  for (int iteration = 0; iteration < 8; ++iteration) {
    if (iteration == 2) {
      run.device_faults_late = driver.managed_stats().faulted_pages;
      run.pager_faults_late = pager->stats().faulted_pages;
    }
    for (size_t op = 0; op < 5; ++op) {
      const VaRange named = page_of(op);
      pager->before_kernel(100 + op, std::span<const VaRange>(&named, 1), 1'000'000);
      const VaRange used[] = {named, hidden};
      EXPECT_TRUE(driver.run_kernel(std::span<const VaRange>(used, op == 0 ? 2 : 1), 1'000'000).is_ok());
      pager->after_kernel();
      if (iteration >= 2) {
        run.most_resident_late = std::max(run.most_resident_late, driver.managed_stats().resident_bytes);
      }
    }
    pager->on_iteration();
    if (iteration == 0) run.resident_after_first_mark = driver.managed_stats().resident_bytes;
  }
  run.device_faults_late = driver.managed_stats().faulted_pages - run.device_faults_late;
  run.pager_faults_late = pager->stats().faulted_pages - run.pager_faults_late;
  for (size_t page = 0; page < 6; ++page) {
    EXPECT_EQ(static_cast<int>(base[page * kPage + 9]), static_cast<int>(0x40 + page)) << "block " << page;
  }
  run.stats = pager->stats();
  pager.reset();
  EXPECT_TRUE(driver.managed_free(arena).is_ok());
  return run;
}

TEST(UmPager, LearnsWhatAKernelUsesBeyondItsParametersFromTheFaultReports) {
  const UnseenRun blind = run_with_an_unseen_use(false);
  EXPECT_GT(blind.most_resident_late, 4 * kPage) << "the unseen page did not push the device past the budget";

  const UnseenRun learnt = run_with_an_unseen_use(true);
  EXPECT_LE(learnt.resident_after_first_mark, 4 * kPage) << "no room was made for the page that arrived unasked";
  EXPECT_LE(learnt.most_resident_late, 4 * kPage) << "the device held more than the budget";
  EXPECT_EQ(learnt.stats.unnamed_faults, 1u) << "the unseen page faulted unnamed after it was learnt";
  EXPECT_EQ(learnt.stats.learnt_pages, 1u);
  EXPECT_EQ(learnt.stats.unasked_arrivals, 1u) << "the unseen page was not counted on the GPU";
  EXPECT_EQ(learnt.device_faults_late, learnt.pager_faults_late) << "the device faulted where the pager did not know";
}

// A model of four identical layers that marks no iterations: 3 launches
// before the layers, 10 in each (the same kernels, at the same launch shapes,
// on the layer's own weights and activations), 3 after, and a stray kernel
// (a metric on one block) after every 2 to 6 launches wherever that falls.
// Announced as libzicoum's launch observer announces them: by kernel alone,
// the pager adding their blocks. Returns the pager's stats at the end.
UmPagerStats run_identical_layers(bool strays) {
  constexpr size_t kLayers = 4;
  constexpr size_t kBlocks = 2 * kLayers + 3;  // weights, activations (one more), the metric's
  SimDriver driver;
  void* arena = nullptr;
  EXPECT_TRUE(driver.managed_allocate(kBlocks * kPage, &arena).is_ok());
  auto* base = static_cast<std::byte*>(arena);
  UmPagerOptions options;
  options.policy = "zico";
  options.budget_bytes = kBlocks * kPage;
  std::unique_ptr<UmPager> pager = pager_over(driver, arena, kBlocks, options);
  if (pager == nullptr) return {};
  for (size_t block = 0; block < kBlocks; ++block) pager->on_allocate(base + block * kPage, kPage);
  const auto block = [&](size_t b) { return VaRange{reinterpret_cast<uintptr_t>(base + b * kPage) + 64, 8}; };
  const auto weights = [&](size_t layer) { return block(layer); };
  const auto activations = [&](size_t layer) { return block(kLayers + layer); };
  const VaRange metric = block(kBlocks - 1);
  std::mt19937 random(11);
  std::uniform_int_distribution<int> gap(2, 6);
  int until_stray = gap(random);
  const auto launch = [&](uint64_t kernel, std::initializer_list<VaRange> used) {
    const std::span<const VaRange> ranges(used.begin(), used.size());
    pager->before_kernel(kernel, ranges, 1000, nullptr, StreamHandle{}, GivenId::kKernel);
    EXPECT_TRUE(driver.run_kernel(ranges, 1000).is_ok());
    pager->after_kernel();
  };
  const auto next = [&](uint64_t kernel, std::initializer_list<VaRange> used) {
    launch(kernel, used);
    if (strays && --until_stray == 0) {
      launch(999, {metric});
      until_stray = gap(random);
    }
  };
  for (int iteration = 0; iteration < 24; ++iteration) {
    for (uint64_t k = 0; k < 3; ++k) next(1 + k, {activations(0)});
    for (size_t layer = 0; layer < kLayers; ++layer) {
      for (uint64_t k = 0; k < 10; ++k) {
        if (k % 3 == 0) {
          next(10 + k, {activations(layer), weights(layer), activations(layer + 1)});
        } else {
          next(10 + k, {activations(layer + 1)});
        }
      }
    }
    for (uint64_t k = 0; k < 3; ++k) next(4 + k, {activations(kLayers), metric});
  }
  const UmPagerStats stats = pager->stats();
  pager.reset();
  EXPECT_TRUE(driver.managed_free(arena).is_ok());
  return stats;
}

TEST(UmPager, FindsTheWholeIterationOfIdenticalLayersWithoutMarks) {
  // One layer's launches repeat four times an iteration: with IDs of the
  // kernels alone the iteration would look 10 launches long.
  EXPECT_EQ(run_identical_layers(false).found_iteration_kernels, 46u);
  const uint64_t found = run_identical_layers(true).found_iteration_kernels;
  EXPECT_GE(found, 46u) << "an iteration among strays was found shorter than its own launches";
  EXPECT_LE(found, 46u + 23u) << "more than an iteration and its strays";
}

TEST(UmPager, KeepsTheBudgetOnTheDeviceOnRandomStreams) {
  for (uint32_t seed = 1; seed <= 40; ++seed) {
    const AccessStream stream = random_training_stream(seed, 4, kPage);
    const StreamFacts facts = stream_facts(stream);
    const uint32_t lo = facts.max_op_pages;
    const uint32_t hi = std::max(lo, stream.page_count);
    for (const uint32_t slots : {lo, (lo + hi) / 2, hi}) {
      for (const std::string_view policy : kPolicyNames) {
        SCOPED_TRACE("seed " + std::to_string(seed) + ", " + std::to_string(slots) + " slots, " + std::string(policy));
        page::UmReplayResult r;
        std::string error;
        ASSERT_TRUE(page::run_um_replay(stream, std::string(policy), uint64_t{slots} * kPage, TransferModel{}, &r,
                                        &error))
            << error;
        EXPECT_LE(r.device_peak_resident_bytes, uint64_t{slots} * kPage) << "the device held more than the budget";
        EXPECT_EQ(r.device_driver_evictions, 0u) << "the driver had to make room itself";
        EXPECT_EQ(r.device_faulted_pages, r.pager.faulted_pages) << "the pager's faults are the device's";
        EXPECT_EQ(r.pager.live_discards, 0u);
        EXPECT_EQ(r.pager.refused_evictions, 0u) << "the policy chose a page in use, or one not there";
        EXPECT_EQ(r.pager.unknown_pointers, 0u);
        EXPECT_EQ(r.pager.driver_errors, 0u);
      }
    }
  }
}

// A committed trace's access stream (3 iterations) and half its peak as the
// budget (at least its largest op), or a test failure.
void committed_trace(const char* name, AccessStream* stream, uint64_t* budget) {
  trace::Trace trace;
  std::string error;
  ASSERT_TRUE(trace::read_trace_file(std::string(ZICO_SOURCE_DIR) + "/tools/traces/" + name + ".ztrace.gz", &trace,
                                     &error)
                  .is_ok())
      << error;
  ASSERT_TRUE(page::build_access_stream(trace, kPage, 3, stream, &error)) << error;
  const StreamFacts facts = stream_facts(*stream);
  *budget = std::max<uint64_t>(facts.peak_live_bytes / 2, uint64_t{facts.max_op_pages} * kPage);
}

TEST(UmPager, RunsTheCommittedTracesAsFastAsThePagingSimulatorSays) {
  for (const char* name : {"resnet110", "mobilenet_v2", "bert_base"}) {
    AccessStream stream;
    uint64_t budget = 0;
    ASSERT_NO_FATAL_FAILURE(committed_trace(name, &stream, &budget));
    std::string error;
    for (const std::string_view policy : kPolicyNames) {
      page::PagingOptions options;
      options.budget_bytes = budget;
      page::PagingResult simulated;
      ASSERT_TRUE(page::run_paging(stream, std::string(policy), options, &simulated, &error)) << error;
      page::UmReplayResult live;
      ASSERT_TRUE(page::run_um_replay(stream, std::string(policy), budget, TransferModel{}, &live, &error)) << error;
      const double ratio = static_cast<double>(live.iteration_ns.back()) /
                           static_cast<double>(simulated.iterations.back().elapsed_ns());
      SCOPED_TRACE(std::string(name) + ", " + std::string(policy) + ": live " +
                   std::to_string(live.iteration_ns.back()) + " ns, simulated " +
                   std::to_string(simulated.iterations.back().elapsed_ns()) + " ns");
      // zico plans for the executor both share; the others leave faults to
      // the fault path, where the live pager makes room ahead of the kernel
      // (off its critical path) and the simulator evicts inside the fault.
      if (policy == "zico") {
        EXPECT_NEAR(ratio, 1.0, 0.1);
      } else {
        EXPECT_LE(ratio, 1.1);
      }
      EXPECT_EQ(live.device_driver_evictions, 0u);
      EXPECT_EQ(simulated.refused_evictions, 0u);
      EXPECT_EQ(live.pager.refused_evictions, 0u);
      EXPECT_LE(live.device_peak_resident_bytes, budget);
      // Every call reached the device, and the pager's counts are the device's.
      EXPECT_EQ(live.device_prefetch_calls, live.pager.migration_calls);
    }
  }
}

// Two replays' last iterations within 25 % of each other.
void expect_last_iterations_near(const page::UmReplayResult& a, const char* a_name, const page::UmReplayResult& b,
                                 const char* b_name) {
  const double ratio = static_cast<double>(a.iteration_ns.back()) / static_cast<double>(b.iteration_ns.back());
  EXPECT_NEAR(ratio, 1.0, 0.25) << a_name << " " << a.iteration_ns.back() << " ns, " << b_name << " "
                                << b.iteration_ns.back() << " ns";
}

// Each call into the UVM driver costs the launching thread a round trip, so
// a policy's moves for one event go in one call per direction, adjacent
// pages as one range, not one call a page (bert_base at half its peak:
// 47772 pages in 27240 calls).
TEST(UmPager, MovesAPolicysPagesInFewDriverCalls) {
  AccessStream stream;
  uint64_t budget = 0;
  ASSERT_NO_FATAL_FAILURE(committed_trace("bert_base", &stream, &budget));
  std::string error;
  page::UmReplayResult live;
  ASSERT_TRUE(page::run_um_replay(stream, "zico", budget, TransferModel{}, &live, &error)) << error;
  const uint64_t moves = live.pager.prefetches + live.pager.evictions + live.pager.room_evictions;
  SCOPED_TRACE(std::to_string(moves) + " pages moved in " + std::to_string(live.device_prefetch_calls) + " calls");
  ASSERT_GT(moves, 1000u);
  EXPECT_LT(live.device_prefetch_calls * 3, moves * 2);
  // Pages the plan brings back while no block holds them come discarded:
  // nothing of their stale bytes crosses the link.
  EXPECT_GT(live.pager.discarded_prefetches, 0u);
}


// With the moves on the pager's own threads (as on a GPU), every policy
// still keeps the device within the budget, makes no page the driver must
// evict itself, and finishes: no wait of the launching thread, of a pager
// thread or of a stream waits for one that waits for it. The modelled
// iteration time stays that of the inline pager within what the threads'
// order may shift.
TEST(UmPager, RunsItsMovesOnItsOwnThreadsWithinTheBudget) {
  const auto check = [](const AccessStream& stream, uint64_t budget, std::string_view policy) {
    page::UmReplayResult inline_run, threaded;
    std::string error;
    ASSERT_TRUE(page::run_um_replay(stream, std::string(policy), budget, TransferModel{}, &inline_run, &error))
        << error;
    ASSERT_TRUE(page::run_um_replay(stream, std::string(policy), budget, TransferModel{}, &threaded, &error, true))
        << error;
    EXPECT_LE(threaded.device_peak_resident_bytes, budget) << "the device held more than the budget";
    EXPECT_EQ(threaded.device_driver_evictions, 0u) << "the driver had to make room itself";
    EXPECT_EQ(threaded.pager.refused_evictions, 0u);
    EXPECT_EQ(threaded.pager.driver_errors, 0u);
    EXPECT_EQ(threaded.device_prefetch_calls, threaded.pager.migration_calls) << "a move was lost on the way";
    EXPECT_EQ(threaded.pager.migration_calls, inline_run.pager.migration_calls) << "the same decisions, moved";
    expect_last_iterations_near(threaded, "threaded", inline_run, "inline");
  };
  for (uint32_t seed = 1; seed <= 8; ++seed) {
    const AccessStream stream = random_training_stream(seed, 4, kPage);
    const uint32_t slots = stream_facts(stream).max_op_pages;
    for (const std::string_view policy : kPolicyNames) {
      SCOPED_TRACE("seed " + std::to_string(seed) + ", " + std::string(policy));
      check(stream, uint64_t{slots} * kPage, policy);
    }
  }
  AccessStream stream;
  uint64_t budget = 0;
  ASSERT_NO_FATAL_FAILURE(committed_trace("bert_base", &stream, &budget));
  SCOPED_TRACE("bert_base at half its peak, zico");
  check(stream, budget, "zico");
}

// SimDriver's device with a swapped arena of `pages` pages on it, given
// back when it goes (a pager over it must go first: declare it after).
struct SwappedArena {
  explicit SwappedArena(size_t pages, const SimOptions& options = {}) : sim(options), swap(sim) {
    EXPECT_TRUE(swap.reserve(DeviceId{0}, pages * kPage, 0, &arena).is_ok());
  }
  ~SwappedArena() { EXPECT_TRUE(swap.unreserve(arena).is_ok()); }
  SimDriver sim;
  SwapArenaDriver swap;
  VaRange arena{};
};

// The "um" pager (room made least recently migrated first, nothing else
// moves) over 8 swapped pages with a budget of 4, five one-page blocks, and
// a busy stream where a kernel's read of page 0 stays queued (a copy stands
// for it) while other kernels run.
class SwappedPageUnderQueuedWork : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = static_cast<std::byte*>(arena_.ptr());
    UmPagerOptions options;
    options.policy = "um";
    options.budget_bytes = 4 * kPage;
    pager_ = pager_over(swap_, arena_.ptr(), 8, options);
    ASSERT_NE(pager_, nullptr);
    ASSERT_TRUE(sim_.stream_create(DeviceId{0}, &busy_).is_ok());
    for (size_t page = 0; page < 5; ++page) pager_->on_allocate(base_ + page * kPage, kPage);
  }
  void TearDown() override {
    ASSERT_TRUE(sim_.release_stream(busy_).is_ok());
    ASSERT_TRUE(sim_.stream_destroy(busy_).is_ok());
  }
  VaRange page_range(size_t page) const { return VaRange{reinterpret_cast<uintptr_t>(base_ + page * kPage), kPage}; }
  void use(size_t page, StreamHandle stream) {
    const VaRange range = page_range(page);
    pager_->before_kernel(page, std::span<const VaRange>(&range, 1), 1000, nullptr, stream);
    ASSERT_TRUE(sim_.run_kernel(std::span<const VaRange>(&range, 1), 1000, stream).is_ok()) << "page " << page;
    pager_->after_kernel();
  }
  // Page 0 written with 0x5a, then read by a kernel queued on the busy stream (into seen_).
  void queue_a_read_of_page_0() {
    std::memset(base_, 0x5a, kPage);
    sim_.hold_stream(busy_);
    const VaRange first = page_range(0);
    pager_->before_kernel(0, std::span<const VaRange>(&first, 1), 1000, nullptr, busy_);
    ASSERT_TRUE(sim_.copy_async(seen_.data(), base_, kPage, CopyKind::kDeviceToHost, busy_).is_ok());
    pager_->after_kernel();
  }
  // Page 0 left once, after the busy stream's read, with no unmap refused.
  void expect_page_0_left_after_the_read() {
    EXPECT_EQ(seen_[7], std::byte{0x5a}) << "the busy stream's read ran after the page left";
    EXPECT_EQ(pager_->stats().driver_errors, 0u) << "the page was unmapped under queued work";
    EXPECT_EQ(swap_.stats().pages_out, 1u);
    EXPECT_LE(swap_.stats().peak_mapped_bytes, 4 * kPage);
  }

  SwappedArena device_{8};
  SimDriver& sim_ = device_.sim;
  SwapArenaDriver& swap_ = device_.swap;
  const VaRange& arena_ = device_.arena;
  std::byte* base_ = nullptr;
  std::unique_ptr<UmPager> pager_;
  StreamHandle busy_{};
  std::vector<std::byte> seen_ = std::vector<std::byte>(kPage);
};

// A swapped page leaves only after every kernel that may still use it: the
// last that named it, and the last on another stream before that one, which
// may run later. Here, after the busy stream's read, a kernel on the default
// stream names page 0 too; when page 0 goes out for room, its copy out waits
// for the busy stream's read (else SimDriver refuses to unmap a range queued
// work touches, and the pager counts a driver error).
TEST_F(SwappedPageUnderQueuedWork, LeavesAfterTheKernelsOfEveryStreamThatUsedIt) {
  use(0, StreamHandle{});
  queue_a_read_of_page_0();
  use(0, StreamHandle{});
  for (size_t page = 1; page < 5; ++page) use(page, StreamHandle{});  // page 4 takes page 0's room
  expect_page_0_left_after_the_read();
}

// The same with two other streams naming page 0 after the busy one: every
// stream's last use is waited for, not only the last two.
TEST_F(SwappedPageUnderQueuedWork, LeavesAfterTheKernelsOfThreeStreamsThatUsedIt) {
  use(0, StreamHandle{});
  queue_a_read_of_page_0();
  use(0, StreamHandle{0x6000});
  use(0, StreamHandle{0x7000});
  for (size_t page = 1; page < 5; ++page) use(page, StreamHandle{0x7000});  // page 4 takes page 0's room
  expect_page_0_left_after_the_read();
}

// A kernel's launch mark is kept for the last 256 launches; a swapped page
// last used by one launched earlier may still be in use when the GPU lags
// behind the launching thread. Here, after the busy stream's read, 300
// kernels on another stream use other pages, then page 0 goes out for room:
// with no later launch on the busy stream to wait for, the device drains
// first.
TEST_F(SwappedPageUnderQueuedWork, WhoseLastKernelsMarkIsGoneLeavesAfterTheDeviceDrains) {
  const StreamHandle other{0x6000};
  use(0, other);
  queue_a_read_of_page_0();
  for (size_t launch = 0; launch < 300; ++launch) use(1 + launch % 3, other);
  use(4, other);  // room: page 0, the least recently migrated
  expect_page_0_left_after_the_read();
}

// A kernel that reads blocks through a pointer table in device memory
// names only the table; once the pager knows what the table holds (a copy
// from the host wrote it: on_pointer_table), it names those blocks too, so
// a swapped one is mapped when the kernel reaches it. Data written beside
// the table leaves it, data written over it ends it, and a freed target is
// not named. The room a kernel asks for (working_set_bytes) counts them.
TEST(UmPager, BlocksAPointerTableReachesAreNamedForTheKernelsThatNameTheTable) {
  SwappedArena device(8);
  SimDriver& sim = device.sim;
  const VaRange arena = device.arena;
  UmPagerOptions options;
  options.budget_bytes = 8 * kPage;
  std::unique_ptr<UmPager> pager = pager_over(device.swap, arena.ptr(), 8, options);
  ASSERT_NE(pager, nullptr);
  const VaRange table{arena.base, kPage};
  const VaRange target{arena.base + 2 * kPage, 2 * kPage};
  pager->on_allocate(table.ptr(), table.bytes);
  pager->on_allocate(target.ptr(), target.bytes);
  const std::array<VaRange, 2> reached{table, target};  // what the kernel touches
  const auto kernel = [&] {
    std::vector<VaRange> blocks;
    pager->before_kernel(1, std::span<const VaRange>(&table, 1), 1000, &blocks);
    const Status ran = sim.run_kernel(reached, 1000);
    pager->after_kernel();
    return std::make_pair(ran, blocks.size());
  };
  EXPECT_EQ(kernel().first.code(), Errc::kInvalidArgument) << "the table's target was mapped before the pager knew";
  const std::array<uintptr_t, 2> addresses{target.base + 64, target.base + kPage + 8};
  const VaRange written{table.base + 16, 16};
  EXPECT_EQ(pager->working_set_bytes(std::span<const VaRange>(&table, 1)), kPage);
  pager->on_pointer_table(written, addresses);
  EXPECT_EQ(pager->working_set_bytes(std::span<const VaRange>(&table, 1)), 3 * kPage)
      << "the room a kernel asks for leaves out what its table reaches";
  const auto [ran, blocks] = kernel();
  EXPECT_TRUE(ran.is_ok()) << "a block the table reaches was not there";
  EXPECT_EQ(blocks, 2u) << "the op's blocks include what the table reaches, once";
  EXPECT_EQ(pager->stats().table_named_blocks, 1u);
  // Data written beside the table (a caching allocator's small tensors share
  // a block) leaves it; data written over it ends it.
  pager->on_pointer_table(VaRange{table.base + 4096, 8}, {});
  pager->set_budget(0);  // everything off the GPU
  pager->set_budget(8 * kPage);
  EXPECT_TRUE(kernel().first.is_ok()) << "data written beside the table ended it";
  pager->on_pointer_table(VaRange{table.base, 64}, {});
  pager->set_budget(0);
  pager->set_budget(8 * kPage);
  EXPECT_EQ(kernel().second, 1u) << "a table written over with data still named its old target";
  pager->on_pointer_table(written, addresses);
  pager->on_free(target.ptr(), std::nullopt);
  EXPECT_EQ(kernel().second, 1u) << "a freed target was named";
}

// Under a node manager a smaller budget means memory for another job at
// once: with its moves on its own threads, the pager returns from
// set_budget only once the swapped pages it sent out have given their
// device memory back.
TEST(UmPager, ASwappedJobsSmallerBudgetIsFreeOnTheDeviceWhenSetBudgetReturns) {
  SwappedArena device(8);
  SimDriver& sim = device.sim;
  SwapArenaDriver& swap = device.swap;
  const VaRange arena = device.arena;
  UmPagerOptions options;
  options.budget_bytes = 8 * kPage;
  std::unique_ptr<UmPager> pager;
  std::string why;
  ASSERT_TRUE(UmPager::create(swap, DeviceId{0}, arena, kPage, options, &pager, &why).is_ok()) << why;
  for (size_t page = 0; page < 8; ++page) {
    const VaRange range{arena.base + page * kPage, kPage};
    pager->on_allocate(range.ptr(), kPage);
    pager->before_kernel(page, std::span<const VaRange>(&range, 1), 1000);
    ASSERT_TRUE(sim.run_kernel(std::span<const VaRange>(&range, 1), 1000).is_ok()) << "page " << page;
    pager->after_kernel();
  }
  EXPECT_EQ(pager->set_budget(2 * kPage), 2 * kPage);
  EXPECT_EQ(swap.stats().mapped_bytes, 2 * kPage) << "set_budget returned before the device had the memory back";
  size_t free_bytes = 0, total = 0;
  ASSERT_TRUE(sim.memory_info(DeviceId{0}, &free_bytes, &total).is_ok());
  EXPECT_EQ(total - free_bytes, 2 * kPage);
}

// A zico pager over 8 swapped pages of SimDriver (a device of `capacity`
// bytes), in blocks of `block_pages`, under a budget of `budget_pages`.
class SwappedPager {
 public:
  SwappedPager(size_t capacity, uint64_t budget_pages, size_t block_pages)
      : driver_(sim_options(capacity)), swap_(driver_) {
    EXPECT_TRUE(swap_.reserve(DeviceId{0}, 8 * kPage, 0, &arena_).is_ok());
    UmPagerOptions options;
    options.policy = "zico";
    options.budget_bytes = budget_pages * kPage;
    pager_ = pager_over(swap_, arena_.ptr(), 8, options);
    for (size_t page = 0; page < 8; page += block_pages) {
      pager_->on_allocate(static_cast<std::byte*>(arena_.ptr()) + page * kPage, block_pages * kPage);
    }
  }
  ~SwappedPager() {
    pager_.reset();
    EXPECT_TRUE(swap_.unreserve(arena_).is_ok());
  }
  SimDriver& driver() { return driver_; }
  SwapArenaDriver& swap() { return swap_; }
  UmPager& pager() { return *pager_; }
  // A kernel on `pages` pages from `first`: (whether the pager refused it,
  // whether the device ran it: no page unmapped).
  std::pair<bool, bool> kernel(uint64_t id, size_t first, size_t pages) {
    const VaRange range{arena_.base + first * kPage, pages * kPage};
    pager_->before_kernel(id, std::span<const VaRange>(&range, 1), 1000);
    const bool refused = pager_->kernel_refused();
    const bool ran = driver_.run_kernel(std::span<const VaRange>(&range, 1), 1000).is_ok();
    pager_->after_kernel();
    return {refused, ran};
  }

 private:
  static SimOptions sim_options(size_t capacity) {
    SimOptions options;
    options.capacity = capacity;
    options.granularity = kPage;
    return options;
  }
  SimDriver driver_;
  SwapArenaDriver swap_;
  VaRange arena_{};
  std::unique_ptr<UmPager> pager_;
};

// Swapped pages on a device another process has filled: a fetch the driver
// refuses leaves pages unmapped that the pager counts as there. The kernel
// that uses them must not run on them (an illegal address): they are asked
// for again first and, refused again, the kernel is refused; once the
// memory is back, the next kernel that uses them gets them.
TEST(UmPager, ASwappedPageTheDeviceWillNotTakeBackRefusesItsKernelUntilItComesBack) {
  SwappedPager swapped(4 * kPage, 4, 2);
  EXPECT_EQ(swapped.kernel(1, 0, 2), std::pair(false, true));
  PhysHandle taken{};  // another process's: the device's last two pages
  ASSERT_TRUE(swapped.driver().create(DeviceId{0}, 2 * kPage, &taken).is_ok());
  EXPECT_EQ(swapped.kernel(2, 2, 2), std::pair(true, false)) << "(refused, ran): a kernel was let run on unmapped pages";
  EXPECT_EQ(swapped.pager().stats().refused_kernels, 1u);
  ASSERT_TRUE(swapped.driver().release(taken).is_ok());
  EXPECT_EQ(swapped.kernel(3, 2, 2), std::pair(false, true)) << "(refused, ran): the pages did not come back";
  EXPECT_GE(swapped.pager().stats().refetched_pages, 4u);  // twice each
}

// Swapped pages whose copy to the host fails stay on the GPU while the pager
// counts them gone: before the kernel runs they are sent out again, so that
// the device holds the budget (left alone, it would hold three pages).
TEST(UmPager, ASwappedPageThatFailedToLeaveIsSentOutAgainBeforeTheNextKernel) {
  SwappedPager swapped(SimOptions{}.capacity, 2, 1);
  EXPECT_EQ(swapped.kernel(0, 0, 1), std::pair(false, true));
  EXPECT_EQ(swapped.kernel(1, 1, 1), std::pair(false, true));
  swapped.driver().inject_failure(SimOp::kCopy, 1);  // the next copy: page 0 or 1 leaving for page 2's room
  EXPECT_EQ(swapped.kernel(2, 2, 1), std::pair(false, true));
  EXPECT_EQ(swapped.pager().stats().driver_errors, 1u) << "no eviction failed";
  EXPECT_EQ(swapped.pager().stats().resent_pages, 1u);
  EXPECT_EQ(swapped.pager().stats().stayed_pages, 0u);
  EXPECT_LE(swapped.swap().stats().mapped_bytes, 2 * kPage) << "the page that failed to leave is still on the GPU";
  EXPECT_EQ(swapped.pager().resident_bytes(), 2 * kPage);
  EXPECT_EQ(swapped.kernel(3, 3, 1), std::pair(false, true));
  EXPECT_LE(swapped.swap().stats().mapped_bytes, 2 * kPage);
}

// Swapped (ZICO_UM_MEMORY=swap), nothing faults: every page a kernel uses
// is mapped before it runs (else SimDriver refuses it as an illegal address
// and the replay fails), under every policy, "um" too, on its own threads
// as inline; the device memory the arena holds never exceeds the budget
// once the budget covers the largest kernel, and a kernel larger than the
// budget still runs. Swapped pages move by copies on the copy engines, so
// an iteration takes about what the managed one takes.
TEST(UmPager, SwappedPagesAreAllThereBeforeTheirKernelAndTheDeviceHoldsTheBudget) {
  const auto check = [](const AccessStream& stream, uint64_t budget, std::string_view policy, bool threads) {
    page::UmReplayResult managed, swapped;
    std::string error;
    ASSERT_TRUE(page::run_um_replay(stream, std::string(policy), budget, TransferModel{}, &managed, &error)) << error;
    ASSERT_TRUE(page::run_um_replay(stream, std::string(policy), budget, TransferModel{}, &swapped, &error, threads,
                                    page::UmArena::kSwapped))
        << error;
    EXPECT_EQ(swapped.device_faulted_pages, 0u);
    EXPECT_EQ(swapped.pager.faulted_pages, 0u);
    EXPECT_EQ(swapped.pager.driver_errors, 0u);
    EXPECT_EQ(swapped.pager.refused_evictions, 0u);
    const uint64_t largest = uint64_t{stream_facts(stream).max_op_pages} * kPage;
    EXPECT_LE(swapped.device_peak_resident_bytes, std::max(budget, largest)) << "the device held more than the budget";
    EXPECT_EQ(swapped.device_prefetch_calls, swapped.pager.migration_calls) << "a move was lost on the way";
    if (!threads && policy == "zico") expect_last_iterations_near(swapped, "swapped", managed, "managed");
  };
  // Each swapped page is a memfd mapped and copied for real: a few streams.
  for (uint32_t seed = 1; seed <= 3; ++seed) {
    const AccessStream stream = random_training_stream(seed, 4, kPage);
    const uint32_t slots = stream_facts(stream).max_op_pages;
    for (const std::string_view policy : kPolicyNames) {
      for (const uint32_t budget : {slots > 1 ? slots - 1 : 1, slots + 2}) {
        for (const bool threads : {false, true}) {
          SCOPED_TRACE("seed " + std::to_string(seed) + ", " + std::to_string(budget) + " slots, " +
                       std::string(policy) + (threads ? ", threaded" : ", inline"));
          check(stream, uint64_t{budget} * kPage, policy, threads);
        }
      }
    }
  }
  AccessStream stream;
  uint64_t budget = 0;
  ASSERT_NO_FATAL_FAILURE(committed_trace("resnet110", &stream, &budget));
  SCOPED_TRACE("resnet110 at half its peak, zico");
  check(stream, budget, "zico", false);
}

}  // namespace
}  // namespace zico::prefetch::testing
