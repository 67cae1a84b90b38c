#include "trace_reader.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdio>
#include <string>

namespace zico::trace {
namespace {

const std::string kHeader =
    "zicoum-trace 1\n"
    "meta model tiny\n"
    "meta command python3 capture.py --model tiny\n"
    "meta source meta\n"
    "meta batch 2\n"
    "meta iterations 2\n"
    "meta timing roofline\n";

// Two iterations: a persistent weight, then per iteration an input, an op
// writing an activation, and the frees.
const std::string kBody =
    "a 1 4096 0 param -1\n"
    "i 0 0\n"
    "a 2 1024 0 input -1\n"
    "a 3 8192 0 act 0\n"
    "o 0 0 100 aten::mm 1,2 3\n"
    "f 2 100\n"
    "f 3 150\n"
    "i 1 200\n"
    "a 4 1024 200 input -1\n"
    "o 1 200 50 aten::relu 4 -\n"
    "f 4 250\n";

std::string valid_trace() { return kHeader + kBody + "end 11\n"; }

Status parse(const std::string& text, Trace* trace, std::string* error) {
  return parse_trace(text, "t.ztrace", trace, error);
}

TEST(TraceReader, LoadsAValidTrace) {
  Trace trace;
  std::string error;
  ASSERT_TRUE(parse(valid_trace(), &trace, &error).is_ok()) << error;
  EXPECT_EQ(trace.meta.at("model"), "tiny");
  EXPECT_EQ(trace.meta.at("command"), "python3 capture.py --model tiny");
  ASSERT_EQ(trace.blocks.size(), 4u);
  EXPECT_TRUE(trace.blocks[0].persistent()) << "never freed";
  EXPECT_FALSE(trace.blocks[2].persistent());
  EXPECT_EQ(trace.blocks[2].category, Category::kActivation);
  EXPECT_EQ(trace.blocks[2].op, 0);
  EXPECT_EQ(trace.blocks[3].alloc_iteration, 1u);
  ASSERT_EQ(trace.ops.size(), 2u);
  EXPECT_EQ(trace.op_names[trace.ops[0].name], "aten::mm");
  EXPECT_EQ(trace.ops[0].reads, (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(trace.ops[0].writes, (std::vector<uint32_t>{2}));
  EXPECT_TRUE(trace.ops[1].writes.empty());
  EXPECT_EQ(trace.iteration_starts.size(), 2u);
  EXPECT_EQ(trace.events.size(), 11u);
}

struct BadCase {
  const char* what;
  std::string text;
  const char* message;
};

std::string replace(std::string text, const std::string& from, const std::string& to) {
  text.replace(text.find(from), from.size(), to);
  return text;
}

TEST(TraceReader, RejectsEveryMalformedInputWithFileLineAndReason) {
  const std::string v = valid_trace();
  const std::vector<BadCase> cases = {
      {"bad magic", replace(v, "zicoum-trace 1", "zicoum-trace"), "first line"},
      {"unknown version", replace(v, "zicoum-trace 1", "zicoum-trace 2"), "unsupported version"},
      {"unknown record", replace(v, "f 3 150", "x 3 150"), "unknown record type 'x'"},
      {"field count", replace(v, "f 3 150", "f 3"), "fields"},
      {"bad integer", replace(v, "a 2 1024 0", "a 2 10x4 0"), "'10x4'"},
      {"negative size", replace(v, "a 2 1024 0", "a 2 -1024 0"), "'-1024'"},
      {"zero size", replace(v, "a 2 1024 0", "a 2 0 0"), "size 0"},
      {"unknown category", replace(v, "8192 0 act", "8192 0 weights"), "unknown category 'weights'"},
      {"time backwards", replace(v, "f 3 150", "f 3 50"), "time goes backwards"},
      {"double allocation", replace(v, "a 4 1024 200", "a 1 1024 200"), "allocated twice"},
      {"free of unknown id", replace(v, "f 3 150", "f 9 150"), "unknown id 9"},
      {"double free", replace(v, "f 4 250", "f 3 250"), "already freed"},
      {"op out of sequence", replace(v, "o 1 200", "o 2 200"), "out of sequence"},
      {"read of a dead block", replace(v, "aten::relu 4 -", "aten::relu 2 -"), "already freed"},
      {"write of an unknown id", replace(v, "aten::mm 1,2 3", "aten::mm 1,2 7"), "unknown id 7"},
      {"iteration out of sequence", replace(v, "i 1 200", "i 2 200"), "iteration 2 out of sequence"},
      {"allocation names a past op", replace(v, "a 3 8192 0 act 0", "a 3 8192 0 act 5"), "next op is 0"},
      {"meta after events", replace(v, "i 1 200", "meta late 1"), "'meta' after the first event"},
      {"missing meta", replace(v, "meta timing roofline\n", ""), "'meta timing' is missing"},
      {"truncated", kHeader + kBody, "truncated"},
      {"wrong count", kHeader + kBody + "end 10\n", "says 10 records"},
      {"content after end", valid_trace() + "f 1 300\n", "after the 'end'"},
      {"empty line", replace(v, "f 3 150\n", "f 3 150\n\n"), "empty line"},
      {"empty input", "", "first line"},
  };
  for (const BadCase& c : cases) {
    Trace trace;
    std::string error;
    const Status status = parse(c.text, &trace, &error);
    EXPECT_EQ(status.code(), Errc::kInvalidArgument) << c.what;
    EXPECT_NE(error.find("t.ztrace:"), std::string::npos) << c.what << ": " << error;
    EXPECT_NE(error.find(c.message), std::string::npos) << c.what << ": " << error;
    EXPECT_TRUE(trace.blocks.empty() && trace.events.empty()) << c.what << ": nothing half-loaded";
  }
}

TEST(TraceReader, ReportsTheLineNumber) {
  Trace trace;
  std::string error;
  ASSERT_FALSE(parse(replace(valid_trace(), "f 3 150", "f 3 50"), &trace, &error).is_ok());
  EXPECT_NE(error.find("t.ztrace:14:"), std::string::npos) << error;
}

std::string write_gzip(const std::string& text, size_t keep_bytes = SIZE_MAX) {
  const std::string path = ::testing::TempDir() + "/zico_trace_test.ztrace.gz";
  gzFile file = gzopen(path.c_str(), "wb");
  gzwrite(file, text.data(), static_cast<unsigned>(text.size()));
  gzclose(file);
  if (keep_bytes != SIZE_MAX) {
    std::FILE* f = std::fopen(path.c_str(), "r+");
    std::fseek(f, 0, SEEK_END);
    const long size = std::ftell(f);
    std::fclose(f);
    EXPECT_GT(size, static_cast<long>(keep_bytes));
    EXPECT_EQ(truncate(path.c_str(), static_cast<off_t>(keep_bytes)), 0);
  }
  return path;
}

TEST(TraceReader, ReadsGzipFilesAndRejectsCorruptOnes) {
  Trace trace;
  std::string error;
  ASSERT_TRUE(read_trace_file(write_gzip(valid_trace()), &trace, &error).is_ok()) << error;
  EXPECT_EQ(trace.name, "zico_trace_test.ztrace.gz");
  EXPECT_EQ(trace.blocks.size(), 4u);

  const Status truncated = read_trace_file(write_gzip(valid_trace(), 60), &trace, &error);
  EXPECT_EQ(truncated.code(), Errc::kInvalidArgument);
  EXPECT_NE(error.find("truncated"), std::string::npos) << error;

  EXPECT_EQ(read_trace_file("/nonexistent/x.ztrace.gz", &trace, &error).code(), Errc::kOsError);
  EXPECT_NE(error.find("/nonexistent/x.ztrace.gz"), std::string::npos) << error;
}

TEST(TraceReader, SaysAFolderIsAFolder) {
  Trace trace;
  std::string error;
  EXPECT_EQ(read_trace_file("/tmp", &trace, &error).code(), Errc::kInvalidArgument);
  EXPECT_NE(error.find("/tmp: is a directory"), std::string::npos) << error;
}

}  // namespace
}  // namespace zico::trace
