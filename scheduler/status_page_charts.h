// The live parts of the scheduler's /status page (RenderStatusPage in
// scheduler/monitoring.h): HTML placeholders that scheduler/web/status.js
// fills from /status.json every 2 s, drawing the curves with uPlot. The
// scripts and style sheets come from the binary itself
// (scheduler/web_assets.h, /static/...), so the page makes no request
// beyond its own scheduler. Without JavaScript the placeholders say so and
// the page reloads itself every 2 s instead.
//
// Element ids the script and tests rely on:
//   #progress          the job's progress bar (#progress-fill,
//                      #progress-percent), #progress-text (ETA, elapsed,
//                      steps, examples/s, newest evaluation) and #shards,
//                      the per-shard table
//   #charts-since      "curves since <time>" (StatusReport.series_since)
//   #chart-<name>      one chart per family of StatusReport.series (kCharts);
//                      once drawn it carries data-series (the names drawn,
//                      comma separated) and data-points (points drawn)
//   #tables            the server-rendered tables (RenderStatusPage wraps
//                      them), replaced from a fresh /status every 2 s
#ifndef PS_SCHEDULER_STATUS_PAGE_CHARTS_H_
#define PS_SCHEDULER_STATUS_PAGE_CHARTS_H_

#include <string>

namespace ps {

// One chart of the page: the series of /status.json it draws.
struct StatusChart {
  // The container's id, "chart-<id>".
  const char* id;
  const char* title;
  // Series drawn: the name itself, or every name starting with it when it
  // ends in '/' ("loss/worker/" draws loss/worker/0, loss/worker/1, ...).
  const char* family;
  // How status.js formats values: "" (plain numbers), "bytes" (B, kB,
  // MB, ...) or "fraction" (0..1 shown as a percentage, y axis fixed to
  // 0..1).
  const char* unit;
};

// Every chart, in page order: loss, examples, wait, keys, bytes, metrics,
// progress.
extern const StatusChart kCharts[7];

// For <head>: the reload for browsers without JavaScript (inside
// <noscript>), uPlot's and the page's style sheets and scripts (deferred,
// from /static/).
std::string StatusPageHeadLinks();

// The job's progress: bar, text line and per-shard table, empty until
// status.js fills them.
std::string RenderProgressSection();

// The "Curves" section: the "curves since" line and one empty container
// per kCharts entry.
std::string RenderChartsSection();

}  // namespace ps

#endif  // PS_SCHEDULER_STATUS_PAGE_CHARTS_H_
