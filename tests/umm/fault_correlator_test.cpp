// FaultCorrelator: CUPTI's fault records matched to the tagged kernel whose
// run on the GPU covers them, whatever order the records come in.
#include <gtest/gtest.h>

#include <vector>

#include "fault_correlator.h"

namespace zico::testing {
namespace {

std::vector<ManagedFault> resolved(FaultCorrelator& correlator) {
  std::vector<ManagedFault> out;
  correlator.resolve(&out);
  return out;
}

TEST(FaultCorrelator, AFaultCarriesTheTagOfTheKernelRunningThen) {
  FaultCorrelator c;
  c.add_kernel(1, 100, 200);
  c.add_kernel(2, 200, 300);
  c.add_kernel(3, 400, 500);  // launched outside any op: no tag
  c.add_tag(1, 11);
  c.add_tag(2, 22);
  c.add_fault(250, 0x2000);
  c.add_fault(150, 0x1000);
  c.add_fault(450, 0x3000);
  c.add_fault(350, 0x4000);  // between kernels
  const std::vector<ManagedFault> out = resolved(c);
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0].tag, 11u);  // oldest first
  EXPECT_EQ(out[0].address, 0x1000u);
  EXPECT_EQ(out[1].tag, 22u);
  EXPECT_EQ(out[2].tag, 0u);
  EXPECT_EQ(out[2].address, 0x4000u);
  EXPECT_EQ(out[3].tag, 0u);
  EXPECT_EQ(out[3].address, 0x3000u);
  EXPECT_EQ(c.waiting(), 0u);
}

TEST(FaultCorrelator, OverlappingKernelsGiveTheFaultToTheLatestStarted) {
  FaultCorrelator c;
  c.add_kernel(1, 100, 1000);  // a long kernel on one stream
  c.add_kernel(2, 300, 400);   // a short one on another
  c.add_tag(1, 11);
  c.add_tag(2, 22);
  c.add_fault(350, 0x1000);
  c.add_fault(600, 0x2000);
  const std::vector<ManagedFault> out = resolved(c);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].tag, 22u);
  EXPECT_EQ(out[1].tag, 11u);
}

TEST(FaultCorrelator, AFaultLaterThanEveryKernelWaitsOnceForItsKernelsRecord) {
  FaultCorrelator c;
  c.add_tag(5, 55);
  c.add_kernel(4, 100, 200);
  c.add_fault(250, 0x1000);  // its kernel's record is in a buffer not yet handed over
  EXPECT_TRUE(resolved(c).empty());
  EXPECT_EQ(c.waiting(), 1u);
  c.add_kernel(5, 220, 300);  // its tag came with the previous buffer
  std::vector<ManagedFault> out = resolved(c);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].tag, 55u);

  c.add_fault(900, 0x2000);  // no kernel ever covers it
  EXPECT_TRUE(resolved(c).empty());
  out = resolved(c);
  ASSERT_EQ(out.size(), 1u) << "a fault waited more than once";
  EXPECT_EQ(out[0].tag, 0u);
  EXPECT_EQ(out[0].address, 0x2000u);
}

TEST(FaultCorrelator, KernelsAndTagsAreKeptForOneResolveOnly) {
  FaultCorrelator c;
  c.add_kernel(1, 100, 200);
  c.add_tag(1, 11);
  EXPECT_TRUE(resolved(c).empty());
  c.add_fault(150, 0x1000);  // reported one buffer late
  std::vector<ManagedFault> out = resolved(c);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].tag, 11u);
  c.add_fault(160, 0x2000);  // two buffers late: the kernel is forgotten
  c.add_kernel(2, 300, 400);
  out = resolved(c);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].tag, 0u);
}

TEST(FaultCorrelator, RecordsBeyondItsBoundBetweenResolvesAreDroppedAndCounted) {
  FaultCorrelator c;
  for (size_t i = 0; i <= FaultCorrelator::kMaxRecords; ++i) c.add_fault(100, 0x1000);
  EXPECT_EQ(c.dropped(), 1u);
  EXPECT_EQ(c.waiting(), FaultCorrelator::kMaxRecords);
}

}  // namespace
}  // namespace zico::testing
