#include "scheduler/status_page_charts.h"

#include "absl/strings/str_cat.h"

namespace ps {

const StatusChart kCharts[7] = {
    {"loss", "Training loss (smoothed, per worker)", "loss/worker/", ""},
    {"examples", "Examples per second (job)", "examples_per_s", ""},
    {"wait", "Pull wait per worker (s waited per s trained: BSP/SSP wait)",
     "wait/worker/", ""},
    {"keys", "Keys pushed and pulled per second, per server",
     "keys_per_s/server/", ""},
    {"bytes", "Bytes held, per server", "bytes/server/", "bytes"},
    {"metrics", "Evaluation metrics", "metric/", ""},
    {"progress", "Job progress", "progress", "fraction"},
};

std::string StatusPageHeadLinks() {
  // The scripts are deferred: they run once the page is parsed, so the
  // tables show at once and a failing script leaves them be.
  return "<noscript><meta http-equiv=\"refresh\" content=\"2\"></noscript>\n"
         "<link rel=\"stylesheet\" href=\"/static/uplot.min.css\">\n"
         "<link rel=\"stylesheet\" href=\"/static/status.css\">\n"
         "<script defer src=\"/static/uplot.iife.min.js\"></script>\n"
         "<script defer src=\"/static/status.js\"></script>\n";
}

std::string RenderProgressSection() {
  return "<section id=\"progress\" class=\"progress\">\n"
         "<div class=\"progress-bar\" role=\"progressbar\" "
         "aria-valuemin=\"0\" aria-valuemax=\"100\">"
         "<div id=\"progress-fill\" class=\"progress-fill\"></div>"
         "<span id=\"progress-percent\" class=\"progress-percent\"></span>"
         "</div>\n"
         "<div id=\"progress-text\" class=\"progress-text\">"
         "<noscript>The progress bar and the curves need JavaScript; "
         "<a href=\"/status.json\">/status.json</a> has their numbers."
         "</noscript></div>\n"
         "<table id=\"shards\" class=\"nodes shards\"></table>\n"
         "</section>\n";
}

std::string RenderChartsSection() {
  std::string html =
      "<section id=\"charts\" class=\"charts-section\">\n<h2>Curves</h2>\n"
      "<p id=\"charts-since\" class=\"since\"></p>\n"
      "<div class=\"charts\">\n";
  for (const StatusChart& c : kCharts) {
    // Titles and families are constants of this file, not input: no
    // escaping needed.
    absl::StrAppend(&html, "<div class=\"chart-box\"><h3>", c.title,
                    "</h3><div class=\"chart\" id=\"chart-", c.id,
                    "\" data-family=\"", c.family, "\" data-unit=\"", c.unit,
                    "\"></div></div>\n");
  }
  absl::StrAppend(&html, "</div>\n</section>\n");
  return html;
}

}  // namespace ps
