// The SPANK plugin's rules (tools/slurm/slurm_share.h), without Slurm.
#include "slurm_share.h"

#include <gtest/gtest.h>

namespace zico::slurm {
namespace {

TEST(SlurmShare, PluginArgsDefaultsAndOverrides) {
  std::string why;
  const auto defaults = parse_plugin_args({}, &why);
  ASSERT_TRUE(defaults);
  EXPECT_EQ(defaults->socket, "/run/zicoum/zicoum.sock");
  EXPECT_EQ(defaults->library, "");
  EXPECT_EQ(defaults->gres, "gpumem");
  const auto set = parse_plugin_args({"socket=/tmp/s.sock", "library=/usr/lib/libzicoum.so", "gres=vram"}, &why);
  ASSERT_TRUE(set);
  EXPECT_EQ(set->socket, "/tmp/s.sock");
  EXPECT_EQ(set->library, "/usr/lib/libzicoum.so");
  EXPECT_EQ(set->gres, "vram");
}

TEST(SlurmShare, BadPluginArgsNameTheArgumentAndTheForm) {
  for (const char* bad : {"socket=relative.sock", "library=/a b/libzicoum.so", "library=/a:/b", "gres=", "gres=a/b",
                          "budget=1G", "socket"}) {
    std::string why;
    EXPECT_FALSE(parse_plugin_args({bad}, &why)) << bad;
    EXPECT_NE(why.find(std::string("'") + bad + "'"), std::string::npos) << why;
    EXPECT_NE(why.find("expected socket=/ABSOLUTE/PATH"), std::string::npos) << why;
  }
}

TEST(SlurmShare, BudgetOptionParsesAsZicoBudget) {
  std::string why;
  EXPECT_EQ(parse_budget_option("20GiB", &why), 20ull << 30);
  EXPECT_EQ(parse_budget_option("512M", &why), 512ull << 20);
  EXPECT_EQ(parse_budget_option("1.5GB", &why), 1'500'000'000ull);
  EXPECT_EQ(parse_budget_option("4096", &why), 4096ull);
  for (const char* bad : {"", "0", "12XB", "-1G", "lots"}) {
    EXPECT_FALSE(parse_budget_option(bad, &why)) << bad;
    EXPECT_NE(why.find(std::string("--zico-budget='") + bad + "'"), std::string::npos) << why;
    EXPECT_NE(why.find("e.g. 512MiB"), std::string::npos) << why;
  }
}

TEST(SlurmShare, GresBytesReadsSlurmCounts) {
  EXPECT_EQ(gres_bytes("gres:gpumem:20M", "gpumem"), 20ull << 20);
  EXPECT_EQ(gres_bytes("gres:gpu:a100:2,gres:gpumem:40G", "gpumem"), 40ull << 30);
  EXPECT_EQ(gres_bytes("gres:gpumem:a100:1T", "gpumem"), 1ull << 40);
  EXPECT_EQ(gres_bytes("gres/gpumem=3k", "gpumem"), 3ull << 10);
  EXPECT_EQ(gres_bytes("gres:gpumem:123", "gpumem"), 123ull);
  EXPECT_EQ(gres_bytes("gres:gpu:2;gres:gpumem:1G", "gpumem"), 1ull << 30);
  EXPECT_FALSE(gres_bytes("gres:gpu:2", "gpumem"));
  EXPECT_FALSE(gres_bytes("gres:gpumemx:2G", "gpumem"));
  EXPECT_FALSE(gres_bytes("gres:gpumem", "gpumem"));
  EXPECT_FALSE(gres_bytes("gres:gpumem:1.5G", "gpumem"));
  EXPECT_FALSE(gres_bytes("gres:gpumem:99999999999T", "gpumem"));
  EXPECT_FALSE(gres_bytes("", "gpumem"));
}

TEST(SlurmShare, JobNamesFollowSacct) {
  EXPECT_EQ(job_name(42, 0), "slurm-42.0");
  EXPECT_EQ(job_name(42, 0xfffffffb), "slurm-42.batch");
  EXPECT_EQ(job_name(7, 0xfffffffa), "slurm-7.interactive");
}

TEST(SlurmShare, TaskBudgetSplitsTheNodeShare) {
  EXPECT_EQ(task_budget(std::nullopt, 40ull << 30, 1), 40ull << 30);
  EXPECT_EQ(task_budget(std::nullopt, 40ull << 30, 4), 10ull << 30);
  EXPECT_EQ(task_budget(6ull << 30, 40ull << 30, 4), 6ull << 30);  // the option wins
  EXPECT_FALSE(task_budget(std::nullopt, std::nullopt, 1));
  EXPECT_FALSE(task_budget(std::nullopt, 3, 4));
}

TEST(SlurmShare, PreloadGoesFirst) {
  EXPECT_EQ(preload_value("/l/libzicoum.so", ""), "/l/libzicoum.so");
  EXPECT_EQ(preload_value("/l/libzicoum.so", "/x/a.so"), "/l/libzicoum.so:/x/a.so");
}

}  // namespace
}  // namespace zico::slurm
