#include "common/curve_keys.h"

#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace ps {
namespace {

class CurveKeysTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(CurveAvailable()) << "Debian's libzmq5 is built with libsodium";
    dir_ = ::testing::TempDir();
  }

  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }

  CurveConfig Config(const std::string& pub, const std::string& sec) {
    CurveConfig c;
    c.set_public_key_file(pub);
    c.set_secret_key_file(sec);
    return c;
  }

  std::string dir_;
};

TEST_F(CurveKeysTest, OffWhenNoFiles) {
  auto keys = LoadCurveKeys(CurveConfig());
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_FALSE(keys->has_value());
}

TEST_F(CurveKeysTest, LoadsAPairWithTrailingNewline) {
  auto pair = GenerateCurveKeys();
  ASSERT_TRUE(pair.ok()) << pair.status();
  auto keys = LoadCurveKeys(Config(Write("a.pub", pair->public_key + "\n"),
                                   Write("a.key", "  " + pair->secret_key + "\n")));
  ASSERT_TRUE(keys.ok()) << keys.status();
  ASSERT_TRUE(keys->has_value());
  EXPECT_EQ((*keys)->public_key, pair->public_key);
  EXPECT_EQ((*keys)->secret_key, pair->secret_key);
}

TEST_F(CurveKeysTest, OnlyOneFileIsAnError) {
  auto keys = LoadCurveKeys(Config(Write("b.pub", "x"), ""));
  EXPECT_EQ(keys.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(keys.status().message().find("both"), std::string::npos) << keys.status();
}

TEST_F(CurveKeysTest, MissingFileIsNamed) {
  auto pair = GenerateCurveKeys();
  ASSERT_TRUE(pair.ok());
  const std::string missing = dir_ + "/does-not-exist.key";
  auto keys = LoadCurveKeys(Config(Write("c.pub", pair->public_key), missing));
  EXPECT_EQ(keys.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(keys.status().message().find(missing), std::string::npos) << keys.status();
}

TEST_F(CurveKeysTest, RejectsBadKeyText) {
  auto pair = GenerateCurveKeys();
  ASSERT_TRUE(pair.ok());
  const std::string sec = Write("d.key", pair->secret_key);
  // Too short, a character outside Z85, empty.
  for (const std::string& text :
       {pair->public_key.substr(0, 39), std::string(39, 'a') + "~", std::string()}) {
    auto keys = LoadCurveKeys(Config(Write("d.pub", text), sec));
    EXPECT_EQ(keys.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_NE(keys.status().message().find("d.pub"), std::string::npos) << keys.status();
  }
  EXPECT_TRUE(ValidateCurveKey(pair->public_key, "k").ok());
}

TEST_F(CurveKeysTest, RejectsKeysThatAreNotAPair) {
  auto a = GenerateCurveKeys();
  auto b = GenerateCurveKeys();
  ASSERT_TRUE(a.ok() && b.ok());
  auto keys = LoadCurveKeys(Config(Write("e.pub", a->public_key), Write("e.key", b->secret_key)));
  EXPECT_EQ(keys.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(keys.status().message().find("not a pair"), std::string::npos) << keys.status();
}

}  // namespace
}  // namespace ps
