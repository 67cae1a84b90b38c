#include "trace_stream.h"

#include <gtest/gtest.h>

#include <string>

#include "trace_reader.h"

namespace zico::page {
namespace {

constexpr const char* kHeader =
    "zicoum-trace 1\nmeta model tiny\nmeta command test\nmeta source meta\nmeta batch 1\n"
    "meta iterations 2\nmeta timing test\n";

trace::Trace parse(const std::string& body) {
  trace::Trace t;
  std::string error;
  EXPECT_TRUE(trace::parse_trace(std::string(kHeader) + body, "tiny", &t, &error).is_ok()) << error;
  return t;
}

TEST(TraceStream, BlocksShareThePagesTheCachingAllocatorGivesThem) {
  // Two small blocks share one 2 MiB segment of the small pool; each
  // iteration's op repeats its execution ID.
  const trace::Trace t = parse(
      "a 0 1000 0 param -1\na 1 1000 0 param -1\n"
      "i 0 0\no 0 0 10 mm 0 1\n"
      "i 1 10\no 1 10 10 mm 0 1\n"
      "end 6\n");
  prefetch::AccessStream s;
  std::string error;
  ASSERT_TRUE(build_access_stream(t, 64 << 10, 0, &s, &error)) << error;
  EXPECT_EQ(prefetch::stream_error(s), "");
  EXPECT_EQ(s.page_count, 32u);  // the 2 MiB segment
  ASSERT_EQ(s.ops.size(), 2u);
  EXPECT_EQ(s.pages(s.ops[0]).size(), 1u);  // both blocks on page 0
  EXPECT_EQ(s.ops[0].exec_id, s.ops[1].exec_id);
  EXPECT_EQ(s.iterations, 2u);
  ASSERT_TRUE(build_access_stream(t, 64 << 10, 1, &s, &error)) << error;
  EXPECT_EQ(s.iterations, 1u);
  EXPECT_EQ(s.ops.size(), 1u);
}

TEST(TraceStream, RefusesATraceWithoutOpsAndABadPageSize) {
  const trace::Trace t = parse("a 0 1000 0 param -1\ni 0 0\ni 1 10\nend 3\n");
  prefetch::AccessStream s;
  std::string error;
  EXPECT_FALSE(build_access_stream(t, 2 << 20, 0, &s, &error));
  EXPECT_NE(error.find("no op records"), std::string::npos) << error;
  EXPECT_FALSE(build_access_stream(t, 3000, 0, &s, &error));
  EXPECT_NE(error.find("page size 3000"), std::string::npos) << error;
}

}  // namespace
}  // namespace zico::page
