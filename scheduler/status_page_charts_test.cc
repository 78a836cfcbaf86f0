#include "scheduler/status_page_charts.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/web_assets.h"

namespace ps {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(StatusPageChartsTest, HeadLinksOnlyLocalAssetsThatAreEmbedded) {
  const std::string head = StatusPageHeadLinks();
  EXPECT_THAT(head, HasSubstr("<noscript><meta http-equiv=\"refresh\" "
                              "content=\"2\"></noscript>"));
  EXPECT_THAT(head, Not(HasSubstr("//")));  // no scheme, no other host
  int links = 0;
  for (const WebAsset& a : WebAssets()) {
    if (a.content_type.find("text/plain") == 0) continue;
    EXPECT_THAT(head, HasSubstr("\"" + std::string(a.path) + "\"")) << a.path;
    ++links;
  }
  EXPECT_EQ(links, 4);
}

TEST(StatusPageChartsTest, ProgressPlaceholders) {
  const std::string html = RenderProgressSection();
  for (const char* id : {"progress", "progress-fill", "progress-percent",
                         "progress-text", "shards"}) {
    EXPECT_THAT(html, HasSubstr("id=\"" + std::string(id) + "\"")) << id;
  }
  EXPECT_THAT(html, HasSubstr("href=\"/status.json\""));
}

TEST(StatusPageChartsTest, OneContainerPerChartWithItsFamily) {
  const std::string html = RenderChartsSection();
  EXPECT_THAT(html, HasSubstr("id=\"charts-since\""));
  for (const char* id :
       {"loss", "examples", "wait", "keys", "bytes", "metrics", "progress"}) {
    EXPECT_THAT(html, HasSubstr("id=\"chart-" + std::string(id) + "\""));
  }
  EXPECT_THAT(html,
              HasSubstr("id=\"chart-loss\" data-family=\"loss/worker/\""));
  EXPECT_THAT(html, HasSubstr("id=\"chart-progress\" data-family=\"progress\" "
                              "data-unit=\"fraction\""));
  EXPECT_THAT(html, HasSubstr("data-family=\"metric/\""));
}

}  // namespace
}  // namespace ps
