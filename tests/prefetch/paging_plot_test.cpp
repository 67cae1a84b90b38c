#include "paging_plot.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
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
  EXPECT_EQ(count(svg, "class=\"budget\""), 4u);  // a budget line per panel
  // Merged copies: at most about one rectangle per pixel column per strip.
  EXPECT_LT(count(svg, "<rect"), 4 * 2 * 1100u);
  EXPECT_LT(svg.size(), 200u << 10) << copies << " copies";
}

// The number after `key="` at or after `from`.
double number_after(const std::string& svg, const std::string& key, size_t from) {
  const size_t at = svg.find(key + "=\"", from);
  return at == std::string::npos ? -1 : std::stod(svg.substr(at + key.size() + 2));
}

// Every panel reads its policy's time against the in-memory time and the
// lower bound, drawn where they fall on its time axis; the axis's name sits
// below the transfer strips, not over them.
TEST(PagingPlot, DrawsTheReferenceTimesAndNamesTheAxisBelowTheStrips) {
  constexpr uint64_t kPage = 64 << 10, kAct = 16 << 20;
  prefetch::testing::StreamBuilder b(kPage);
  for (int it = 0; it < 3; ++it) {
    b.mark();
    std::vector<uint32_t> acts;
    for (uint32_t l = 0; l < 6; ++l) {
      acts.push_back(b.allocate_at(l * kAct, kAct));
      b.op({acts.back()}, 100'000, l);
    }
    for (uint32_t l = 6; l-- > 0;) {
      b.op({acts[l]}, 200'000, 100 + l);
      b.free(acts[l]);
    }
  }
  const prefetch::AccessStream stream = b.finish();
  PagingStudy study;
  std::string error;
  ASSERT_TRUE(study_paging(stream, 3 * kAct, prefetch::TransferModel{}, {"um", "zico"}, true, &study, &error)) << error;
  ASSERT_GT(study.lower_bound_iteration_ns, study.in_memory_iteration_ns) << "the two lines would coincide";
  const std::string svg = render_paging_plot(study);

  uint64_t span = 0;
  for (const PolicySummary& p : study.policies) span = std::max(span, p.iteration_ns);
  // The frame spans x 70 to 1080 (1100 wide, margins 70 and 20) over the longest steady iteration.
  const auto x_of = [&](uint64_t ns) { return 70 + 1010 * static_cast<double>(ns) / static_cast<double>(span); };
  for (const auto& [id, ns] : {std::pair{"in-memory", study.in_memory_iteration_ns},
                               std::pair{"bound", study.lower_bound_iteration_ns}}) {
    const std::string line = std::string("class=\"") + id + "\"";
    EXPECT_EQ(count(svg, line), 2u) << id << ": one line per panel";
    for (size_t at = svg.find(line); at != std::string::npos; at = svg.find(line, at + 1)) {
      const size_t tag = svg.rfind("<line", at);
      EXPECT_NEAR(number_after(svg, "x1", tag), x_of(ns), 0.1) << id;
      EXPECT_EQ(number_after(svg, "x1", tag), number_after(svg, "x2", tag)) << id << " is not vertical";
    }
    EXPECT_EQ(count(svg, std::string("class=\"") + id + "-label\""), 2u) << id;
  }

  // Each panel's axis name lies below every transfer strip drawn above it (12 px text, 9 px strips).
  const size_t label = svg.find("class=\"x-label\"");
  ASSERT_NE(label, std::string::npos);
  const double label_y = number_after(svg, "y", svg.rfind("<text", label));
  size_t strips = 0;
  for (size_t at = svg.find("height=\"9.0\""); at != std::string::npos; at = svg.find("height=\"9.0\"", at + 1)) {
    const double y = number_after(svg, "y", svg.rfind("<rect", at));
    if (y > label_y) continue;  // a panel below
    ++strips;
    EXPECT_LE(y + 9, label_y - 12) << "the axis name overlaps a strip at y " << y;
  }
  EXPECT_GT(strips, 0u) << "no strip above the first axis name";
}

}  // namespace
}  // namespace zico::page
