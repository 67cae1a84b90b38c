// What stream_facts() tells of a stream: the bounds every budget meets.
#include <gtest/gtest.h>

#include "access_stream.h"
#include "paging_streams.h"

namespace zico::prefetch {
namespace {

using testing::StreamBuilder;

// Blocks that share a page occupy it once, and it stays occupied while any
// of them lives: the footprint paging moves, above the bytes themselves.
TEST(StreamFacts, CountThePagesHoldingLiveBytes) {
  StreamBuilder b(4096);
  const uint32_t first = b.allocate(100);
  b.allocate(100, /*own_pages=*/false);  // on the first's page
  b.op({first}, 10, 1);
  b.free(first);                         // the page still holds the second
  b.allocate(5000);                      // two pages of its own
  b.mark();
  b.mark();
  const StreamFacts facts = stream_facts(b.finish());
  EXPECT_EQ(facts.peak_live_bytes, 5100u);
  EXPECT_EQ(facts.peak_live_pages, 3u) << "the shared page, and the last block's two";
  EXPECT_EQ(facts.max_op_pages, 1u);
}

TEST(StreamFacts, AFreedPageCountsNoMore) {
  StreamBuilder b(4096);
  const uint32_t big = b.allocate(3 * 4096);
  b.free(big);
  b.allocate(4096);
  b.allocate(4096);
  const StreamFacts facts = stream_facts(b.finish());
  EXPECT_EQ(facts.peak_live_pages, 3u);
  EXPECT_EQ(facts.peak_live_bytes, 3u * 4096);
}

}  // namespace
}  // namespace zico::prefetch
