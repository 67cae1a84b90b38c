#include "transfer_model.h"

#include <gtest/gtest.h>

namespace zico::prefetch {
namespace {

TEST(TransferModel, LargeCopiesRunAtTheLinkRateAndSmallOnesSlower) {
  const TransferModel m;
  // 2 MiB at 55 GB/s is 38.1 us; its efficiency is 0.996.
  EXPECT_NEAR(static_cast<double>(m.h2d_ns(2 << 20, false)), 2097152 / 55e9 * 1e9 / 0.9958, 50);
  EXPECT_NEAR(m.efficiency(13700), 0.5, 1e-3);
  EXPECT_NEAR(m.efficiency(64 << 10), 0.87, 0.01);
  EXPECT_GT(m.d2h_ns(1 << 20, true), m.d2h_ns(1 << 20, false));  // sharing the link with the other direction
  EXPECT_EQ(m.fault_transfer_ns(20'000'000'000), 1'000'000'000u);
  TransferModel flat = m;
  flat.size_knee_bytes = 0;
  EXPECT_EQ(flat.efficiency(1), 1.0);
}

TEST(TransferModel, NamesTheFirstUnusableField) {
  TransferModel m;
  EXPECT_EQ(m.invalid_field(), "");
  m.duplex_factor = 1.5;
  EXPECT_NE(m.invalid_field().find("duplex_factor"), std::string::npos);
  m = TransferModel{};
  m.h2d_bytes_per_s = 0;
  EXPECT_NE(m.invalid_field().find("h2d_bytes_per_s"), std::string::npos);
  m = TransferModel{};
  m.fault_batch_pages = 0;
  EXPECT_NE(m.invalid_field().find("fault_batch_pages"), std::string::npos);
}

}  // namespace
}  // namespace zico::prefetch
