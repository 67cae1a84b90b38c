#include "sizes.h"

#include <gtest/gtest.h>

namespace zico {
namespace {

TEST(ParseSize, AcceptsDocumentedForms) {
  EXPECT_EQ(parse_size("4096"), 4096u);
  EXPECT_EQ(parse_size("512MiB"), uint64_t{512} << 20);
  EXPECT_EQ(parse_size("40GiB"), uint64_t{40} << 30);
  EXPECT_EQ(parse_size("40gib"), uint64_t{40} << 30);
  EXPECT_EQ(parse_size("6G"), uint64_t{6} << 30);
  EXPECT_EQ(parse_size("1.5GB"), 1'500'000'000u);
  EXPECT_EQ(parse_size("1.5GiB"), uint64_t{3} << 29);
  EXPECT_EQ(parse_size("2KB"), 2000u);
  EXPECT_EQ(parse_size("0.5k"), 512u);
  EXPECT_EQ(parse_size("64B"), 64u);
  EXPECT_EQ(parse_size("1TiB"), uint64_t{1} << 40);
  EXPECT_EQ(parse_size("0"), 0u) << "zero parses; callers that need > 0 reject it";
}

TEST(ParseSize, AcceptsKubernetesBinaryUnits) {
  EXPECT_EQ(parse_size("512Ki"), uint64_t{512} << 10);
  EXPECT_EQ(parse_size("64Mi"), uint64_t{64} << 20);
  EXPECT_EQ(parse_size("20Gi"), uint64_t{20} << 30);
  EXPECT_EQ(parse_size("1Ti"), uint64_t{1} << 40);
  EXPECT_EQ(parse_size("1.5Gi"), uint64_t{3} << 29);
  EXPECT_EQ(parse_size("64M"), uint64_t{64} << 20) << "M stays binary (Kubernetes reads it as decimal)";
  EXPECT_FALSE(parse_size("64Mii").has_value());
}

TEST(SizeError, NamesTheValueAndTheForm) {
  EXPECT_EQ(size_above_zero_error("--budget", "0"),
            std::string("--budget '0' is not a size above 0; expected ") + kSizeForm);
  EXPECT_EQ(size_above_zero_error("ZICO_BUDGET=", "-5GiB"),
            std::string("ZICO_BUDGET='-5GiB' is not a size above 0; expected ") + kSizeForm);
}

TEST(SizeError, NamesASpaceBetweenNumberAndUnit) {
  EXPECT_EQ(size_above_zero_error("--budget", "6 GB"),
            "--budget '6 GB' is not a size: no space between number and unit (6GB)");
  EXPECT_EQ(size_above_zero_error("ZICO_BUDGET=", "1.5  gib"),
            "ZICO_BUDGET='1.5  gib' is not a size: no space between number and unit (1.5gib)");
  EXPECT_EQ(size_error("--min", "64 Mi"), "--min '64 Mi' is not a size: no space between number and unit (64Mi)");
  // Not a size even without the space: the form, as for any other text.
  EXPECT_EQ(size_above_zero_error("--budget", "6 XB"),
            std::string("--budget '6 XB' is not a size above 0; expected ") + kSizeForm);
  EXPECT_EQ(size_error("--min", "6 "), std::string("--min '6 ' is not a size; expected ") + kSizeForm);
  EXPECT_EQ(size_error("--min", " 6GB"), std::string("--min ' 6GB' is not a size; expected ") + kSizeForm);
}

TEST(ParseSize, RejectsMalformedInput) {
  for (const char* bad : {"", "12XB", "-1", "GiB", "1 GiB", "1.2.3", "0x10", "1GiBs", ".", "+5", "1e9"}) {
    EXPECT_FALSE(parse_size(bad).has_value()) << "'" << bad << "'";
  }
}

TEST(ParseSize, RejectsOverflow) {
  EXPECT_FALSE(parse_size("18446744073709551616").has_value());
  EXPECT_FALSE(parse_size("16777216TiB").has_value());
  EXPECT_EQ(parse_size("18446744073709551615"), UINT64_MAX);
}

TEST(ParseRate, IsASizePerSecondAboveZero) {
  EXPECT_EQ(parse_rate("55GB/s"), 55'000'000'000u);
  EXPECT_EQ(parse_rate("12GiB/s"), uint64_t{12} << 30);
  EXPECT_EQ(parse_rate("25GB"), 25'000'000'000u) << "the /s may be left out";
  for (const char* bad : {"0GB/s", "/s", "fast", "25GB/h", "25 GB/s", ""}) {
    EXPECT_FALSE(parse_rate(bad).has_value()) << "'" << bad << "'";
  }
}

TEST(FormatSize, PicksTheLargestWholeUnit) {
  EXPECT_EQ(format_size(0), "0 B");
  EXPECT_EQ(format_size(512), "512 B");
  EXPECT_EQ(format_size(uint64_t{64} << 20), "64 MiB");
  EXPECT_EQ(format_size(uint64_t{3} << 29), "1.50 GiB");
}

TEST(FormatSize, ApartFromAnotherSizeTakesTheDecimalsThatTellThemApart) {
  const uint64_t budget = uint64_t{5} << 30;
  const uint64_t need = budget + (uint64_t{2} << 20);
  EXPECT_EQ(format_size(need), "5.00 GiB") << "reads as the budget: why the other form exists";
  EXPECT_EQ(format_size_apart(need, budget), "5.002 GiB");
  EXPECT_EQ(format_size_apart(budget, need), "5 GiB") << "whole units stay exact";
  EXPECT_EQ(format_size_apart(budget + 4096, budget + 8192), "5.00000 GiB") << "5.00001 GiB, the other";
  EXPECT_EQ(format_size_apart(need, uint64_t{6} << 30), "5.00 GiB") << "two decimals where they suffice";
  EXPECT_EQ(format_size_apart(need, need), "5.00 GiB");
  EXPECT_EQ(format_size_apart(budget + 1, budget), "5.000000001 GiB");
}

}  // namespace
}  // namespace zico
