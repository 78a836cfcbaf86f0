#include "scheduler/web_assets.h"

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

#include "gtest/gtest.h"

namespace ps {
namespace {

// A file of the workspace from the test's runfiles (Bazel `data`).
std::string ReadRunfile(const std::string& rel) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  EXPECT_NE(srcdir, nullptr);
  EXPECT_NE(workspace, nullptr);
  if (srcdir == nullptr || workspace == nullptr) return "";
  std::ifstream in(std::string(srcdir) + "/" + workspace + "/" + rel,
                   std::ios::binary);
  EXPECT_TRUE(in) << rel;
  return std::string(std::istreambuf_iterator<char>(in),
                     std::istreambuf_iterator<char>());
}

const WebAsset* Find(std::string_view path) {
  for (const WebAsset& a : WebAssets()) {
    if (a.path == path) return &a;
  }
  return nullptr;
}

struct Expected {
  const char* path;
  const char* content_type;
  const char* source;
};

constexpr Expected kExpected[] = {
    {"/static/status.js", "text/javascript; charset=utf-8",
     "scheduler/web/status.js"},
    {"/static/status.css", "text/css; charset=utf-8",
     "scheduler/web/status.css"},
    {"/static/uplot.iife.min.js", "text/javascript; charset=utf-8",
     "third_party/uplot/uPlot.iife.min.js"},
    {"/static/uplot.min.css", "text/css; charset=utf-8",
     "third_party/uplot/uPlot.min.css"},
    {"/static/uplot.LICENSE", "text/plain; charset=utf-8",
     "third_party/uplot/LICENSE"},
};

TEST(WebAssetsTest, EveryAssetIsItsSourceFileByteForByte) {
  ASSERT_EQ(WebAssets().size(), std::size(kExpected));
  for (const Expected& e : kExpected) {
    const WebAsset* a = Find(e.path);
    ASSERT_NE(a, nullptr) << e.path;
    EXPECT_EQ(a->content_type, e.content_type) << e.path;
    const std::string source = ReadRunfile(e.source);
    ASSERT_FALSE(source.empty()) << e.source;
    EXPECT_EQ(a->body.size(), source.size()) << e.path;
    EXPECT_TRUE(a->body == source) << e.path << " differs from " << e.source;
  }
}

TEST(WebAssetsTest, PathsAreUniqueAndUnderStatic) {
  std::set<std::string_view> paths;
  for (const WebAsset& a : WebAssets()) {
    EXPECT_EQ(a.path.substr(0, 8), "/static/") << a.path;
    EXPECT_TRUE(paths.insert(a.path).second) << "duplicate " << a.path;
  }
}

TEST(WebAssetsTest, UplotIsTheVendoredReleaseWithItsLicense) {
  const WebAsset* js = Find("/static/uplot.iife.min.js");
  ASSERT_NE(js, nullptr);
  EXPECT_EQ(js->body.substr(0, 43),
            "/*! https://github.com/leeoniya/uPlot (v1.6");
  EXPECT_NE(js->body.find("var uPlot="), std::string_view::npos);
  const WebAsset* license = Find("/static/uplot.LICENSE");
  ASSERT_NE(license, nullptr);
  EXPECT_NE(license->body.find("MIT License"), std::string_view::npos);
  EXPECT_NE(license->body.find("Leon Sorokin"), std::string_view::npos);
}

}  // namespace
}  // namespace ps
