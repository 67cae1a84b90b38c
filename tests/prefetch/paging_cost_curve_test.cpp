#include "paging_cost_curve.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "access_stream.h"
#include "trace_reader.h"
#include "trace_stream.h"

namespace zico::page {
namespace {

TEST(PagingCostCurve, MeasuresACommittedTraceFromItsFloorToItsPeak) {
  trace::Trace trace;
  std::string error;
  ASSERT_TRUE(trace::read_trace_file(std::string(ZICO_SOURCE_DIR) + "/tools/traces/resnet110.ztrace.gz", &trace, &error)
                  .is_ok())
      << error;
  PagingCostOptions options;
  sharing::PagingCost cost;
  ASSERT_TRUE(measure_paging_cost(trace, options, &cost, &error)) << error;
  EXPECT_EQ(cost.invalid(), "");
  ASSERT_GE(cost.points.size(), 2u);
  // The floor is the largest op's pages; the last point every page the job
  // touches, where nothing pages.
  prefetch::AccessStream stream;
  ASSERT_TRUE(build_access_stream(trace, options.page_bytes, 0, &stream, &error)) << error;
  const prefetch::StreamFacts facts = prefetch::stream_facts(stream);
  EXPECT_EQ(cost.floor_bytes, uint64_t{facts.max_op_pages} * options.page_bytes);
  EXPECT_EQ(cost.points.front().cap_bytes, cost.floor_bytes);
  EXPECT_EQ(cost.points.back().cap_bytes, uint64_t{stream.page_count} * options.page_bytes);
  EXPECT_DOUBLE_EQ(cost.points.back().stretch, 1.0);
  EXPECT_TRUE(std::any_of(cost.points.begin(), cost.points.end(), [&](const auto& point) {
    return point.cap_bytes >= facts.peak_live_bytes && point.cap_bytes < cost.points.back().cap_bytes;
  })) << "the peak of live bytes is measured too";
  // Paging costs something well below the peak: the floor is slower.
  EXPECT_GT(cost.points.front().stretch, 1.5);
  // Most points lie in the upper half, where the scheduler caps.
  size_t upper = 0;
  for (const auto& point : cost.points) {
    upper += point.cap_bytes * 2 >= cost.floor_bytes + cost.points.back().cap_bytes ? 1 : 0;
  }
  EXPECT_GT(upper * 2, cost.points.size());
}

TEST(PagingCostCurve, RefusesATraceWithoutOps) {
  trace::Trace trace;
  std::string error;
  ASSERT_TRUE(trace::parse_trace(
                  "zicoum-trace 1\nmeta model tiny\nmeta command test\nmeta source meta\nmeta batch 1\n"
                  "meta iterations 2\nmeta timing test\na 0 1000 0 param -1\ni 0 0\ni 1 10\nend 3\n",
                  "tiny", &trace, &error)
                  .is_ok())
      << error;
  sharing::PagingCost cost;
  EXPECT_FALSE(measure_paging_cost(trace, PagingCostOptions{}, &cost, &error));
  EXPECT_NE(error.find("no op records"), std::string::npos) << error;
}

}  // namespace
}  // namespace zico::page
