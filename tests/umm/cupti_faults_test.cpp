// CuptiFaults against a stand-in libcupti (fake_cupti.c): which counters and
// record kinds it asks for, that it flushes the buffers still filling, and
// which unified-memory records become fault reports. Its own executable:
// CuptiFaults is one per process.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cupti_faults.h"

namespace zico::testing {
namespace {

// CUPTI's numbers (cupti_activity.h).
constexpr uint32_t kHostToDevice = 1, kDeviceToHost = 2, kGpuPageFault = 4;
constexpr uint32_t kCauseUser = 1, kCauseCoherence = 2, kCauseDriverPrefetch = 3;
constexpr uint32_t kExternalCustom2 = 5;
constexpr int kKindDriver = 4, kKindRuntime = 5, kKindConcurrentKernel = 10, kKindUnifiedMemoryCounter = 25,
              kKindExternalCorrelation = 39;

struct FakeCupti {
  void (*kernel)(uint32_t, uint64_t, uint64_t);
  void (*unified_memory)(uint32_t, uint64_t, uint64_t, uint32_t);
  void (*tag)(uint32_t, uint64_t, uint32_t);
  int (*counter_enabled)(uint32_t);
  int (*activity_enabled)(int);
  int (*last_flush_flag)();
  void (*set_incomplete)(int);
};

// Loaded by its path before CuptiFaults looks for libcupti.so.13, which then
// finds it by its SONAME among the loaded libraries.
FakeCupti load_fake() {
  void* library = dlopen(ZICO_FAKE_CUPTI, RTLD_NOW | RTLD_GLOBAL);
  if (library == nullptr) ADD_FAILURE() << dlerror();
  const auto get = [library](auto* fn, const char* name) {
    *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(dlsym(library, name));
    if (*fn == nullptr) ADD_FAILURE() << "fake libcupti has no " << name;
  };
  FakeCupti fake{};
  get(&fake.kernel, "fake_cupti_kernel");
  get(&fake.unified_memory, "fake_cupti_unified_memory");
  get(&fake.tag, "fake_cupti_tag");
  get(&fake.counter_enabled, "fake_cupti_counter_enabled");
  get(&fake.activity_enabled, "fake_cupti_activity_enabled");
  get(&fake.last_flush_flag, "fake_cupti_last_flush_flag");
  get(&fake.set_incomplete, "fake_cupti_set_incomplete");
  return fake;
}

TEST(CuptiFaults, FaultsAndTheTransfersFaultsCausedAreReportedUnderTheirKernelsTag) {
  const FakeCupti fake = load_fake();
  ASSERT_NE(fake.kernel, nullptr);
  std::string why;
  CuptiFaults* faults = CuptiFaults::start(0, &why);
  ASSERT_NE(faults, nullptr) << why;

  // Fault records where the platform has them; host-to-device transfers
  // with their cause where it has not (an H100, driver 580).
  EXPECT_EQ(fake.counter_enabled(kGpuPageFault), 1);
  EXPECT_EQ(fake.counter_enabled(kHostToDevice), 1);
  for (int kind : {kKindUnifiedMemoryCounter, kKindConcurrentKernel, kKindExternalCorrelation, kKindDriver,
                   kKindRuntime}) {
    EXPECT_EQ(fake.activity_enabled(kind), 1) << "activity kind " << kind;
  }

  constexpr uintptr_t kBase = 0x7f0000000000;
  constexpr uintptr_t kMiB = uintptr_t{1} << 20;
  fake.kernel(7, 1000, 2000);
  fake.tag(kExternalCustom2, 42, 7);
  fake.unified_memory(kHostToDevice, 1100, kBase + 1 * kMiB, kCauseCoherence);       // a fault's migration
  fake.unified_memory(kHostToDevice, 1200, kBase + 2 * kMiB, kCauseUser);            // a prefetch zicoum asked for
  fake.unified_memory(kHostToDevice, 1300, kBase + 3 * kMiB, kCauseDriverPrefetch);  // the driver's read-ahead
  fake.unified_memory(kGpuPageFault, 1400, kBase + 4 * kMiB, 0);
  fake.unified_memory(kDeviceToHost, 1500, kBase + 5 * kMiB, kCauseCoherence);       // leaving the GPU
  fake.unified_memory(kGpuPageFault, 1600, kBase + 64 * kMiB, 0);                    // outside the range taken

  std::vector<ManagedFault> reports;
  ASSERT_TRUE(faults->take(VaRange{kBase, 16 * kMiB}, &reports).is_ok());
  EXPECT_EQ(fake.last_flush_flag(), 0) << "every record complete: a default flush hands the buffer over";
  ASSERT_EQ(reports.size(), 3u);
  EXPECT_EQ(reports[0].address, kBase + 1 * kMiB);
  EXPECT_EQ(reports[1].address, kBase + 3 * kMiB);
  EXPECT_EQ(reports[2].address, kBase + 4 * kMiB);
  for (const ManagedFault& report : reports) EXPECT_EQ(report.tag, 42u);

  // A buffer with a record still open comes only by a forced flush, after
  // a few takes that got nothing.
  fake.set_incomplete(1);
  fake.kernel(8, 3000, 4000);
  fake.tag(kExternalCustom2, 43, 8);
  fake.unified_memory(kGpuPageFault, 3500, kBase + 6 * kMiB, 0);
  reports.clear();
  int takes = 0;
  while (reports.empty() && takes < 10) {
    ++takes;
    ASSERT_TRUE(faults->take(VaRange{kBase, 16 * kMiB}, &reports).is_ok());
  }
  EXPECT_EQ(takes, 4) << "forced on the fourth take without a buffer";
  EXPECT_EQ(fake.last_flush_flag(), 1);
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].address, kBase + 6 * kMiB);
  EXPECT_EQ(reports[0].tag, 43u);
  fake.set_incomplete(0);
}

}  // namespace
}  // namespace zico::testing
