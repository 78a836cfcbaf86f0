#include "common/node_main.h"

#include <string>

#include "common/config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

using ::testing::HasSubstr;

JobConfig Config(const std::string& cluster) {
  auto config = ParseJobConfig(
      "name: 'sizes' cluster { " + cluster + " } "
      "tables { id: 0 name: 'w' sparse { dim: 1 } optimizer { sgd { learning_rate: 0.1 } } }",
      "test");
  EXPECT_TRUE(config.ok()) << config.status();
  return config.value_or(JobConfig());
}

TEST(OverrideClusterSizeTest, ZeroKeepsTheConfigsSizes) {
  JobConfig config = Config("num_servers: 3 num_workers: 5");
  const uint64_t before = ConfigFingerprint(config);
  ASSERT_TRUE(OverrideClusterSize({}, &config).ok());
  EXPECT_EQ(config.cluster().num_servers(), 3u);
  EXPECT_EQ(config.cluster().num_workers(), 5u);
  EXPECT_EQ(ConfigFingerprint(config), before);
}

TEST(OverrideClusterSizeTest, ReplacesSizesAndChangesTheFingerprint) {
  JobConfig config = Config("num_servers: 3 num_workers: 5");
  const uint64_t before = ConfigFingerprint(config);
  ASSERT_TRUE(OverrideClusterSize({2, 0}, &config).ok());
  EXPECT_EQ(config.cluster().num_servers(), 2u);
  EXPECT_EQ(config.cluster().num_workers(), 5u);
  ASSERT_TRUE(OverrideClusterSize({0, 7}, &config).ok());
  EXPECT_EQ(config.cluster().num_servers(), 2u);
  EXPECT_EQ(config.cluster().num_workers(), 7u);
  EXPECT_NE(ConfigFingerprint(config), before);
}

TEST(OverrideClusterSizeTest, RefusesBadSizes) {
  JobConfig config = Config("num_servers: 2 num_workers: 2 replication: 2");
  absl::Status s = OverrideClusterSize({-1, 0}, &config);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("--num_servers=-1"));
  s = OverrideClusterSize({0, 70000}, &config);
  EXPECT_THAT(std::string(s.message()), HasSubstr("--num_workers=70000"));
  s = OverrideClusterSize({2000, 0}, &config);
  EXPECT_THAT(std::string(s.message()), HasSubstr("--num_servers=2000"));
  // Valid alone, but not with the config's replication.
  s = OverrideClusterSize({1, 0}, &config);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("cluster.replication"));
}

}  // namespace
}  // namespace ps
