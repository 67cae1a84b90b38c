#include "paging_plot.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "paging_streams.h"
#include "paging_study.h"

namespace zico::page {
namespace {

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(PagingPlot, OnePanelPerPolicyAndASizeThatDoesNotGrowWithThePages) {
  // 64 KiB pages, eight 16 MiB activations made in a forward pass and used
  // again in reverse, under a budget of two ops: thousands of copies.
  constexpr uint64_t kPage = 64 << 10, kAct = 16 << 20;
  prefetch::testing::StreamBuilder b(kPage);
  for (int it = 0; it < 3; ++it) {
    b.mark();
    std::vector<uint32_t> acts;
    for (uint32_t l = 0; l < 8; ++l) {
      acts.push_back(b.allocate_at(l * kAct, kAct));
      b.op({acts.back()}, 100'000, l);
    }
    for (uint32_t l = 8; l-- > 0;) {
      b.op({acts[l]}, 200'000, 100 + l);
      b.free(acts[l]);
    }
  }
  const prefetch::AccessStream stream = b.finish();
  const prefetch::StreamFacts facts = prefetch::stream_facts(stream);
  PagingStudy study;
  std::string error;
  ASSERT_TRUE(study_paging(stream, 2 * uint64_t{facts.max_op_pages} * kPage, prefetch::TransferModel{},
                           {"um", "deepum", "autoswap", "zico"}, true, &study, &error))
      << error;
  uint64_t copies = 0;
  for (const PolicySummary& p : study.policies) copies += p.run.last_iteration_transfers.size();
  ASSERT_GT(copies, 2000u);
  const std::string svg = render_paging_plot(study);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  for (const char* policy : {"um:", "deepum:", "autoswap:", "zico:"}) EXPECT_NE(svg.find(policy), std::string::npos);
  EXPECT_EQ(count(svg, "stroke-dasharray"), 4u);  // a budget line per panel
  // Merged copies: at most about one rectangle per pixel column per strip.
  EXPECT_LT(count(svg, "<rect"), 4 * 2 * 1100u);
  EXPECT_LT(svg.size(), 200u << 10) << copies << " copies";
}

}  // namespace
}  // namespace zico::page
