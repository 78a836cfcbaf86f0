// The static files of the scheduler's /status page, compiled into the
// binary (tools/embed_files.cc writes web_assets.cc from them at build
// time), so the page needs no file at run time and nothing from the
// network:
//
//   /static/status.js          scheduler/web/status.js (the live curves)
//   /static/status.css         scheduler/web/status.css
//   /static/uplot.iife.min.js  third_party/uplot/uPlot.iife.min.js
//   /static/uplot.min.css      third_party/uplot/uPlot.min.css
//   /static/uplot.LICENSE      third_party/uplot/LICENSE (text/plain)
#ifndef PS_SCHEDULER_WEB_ASSETS_H_
#define PS_SCHEDULER_WEB_ASSETS_H_

#include <string_view>

#include "absl/types/span.h"

namespace ps {

struct WebAsset {
  // The URL path it is served at, e.g. "/static/status.js".
  std::string_view path;
  // The Content-Type header, e.g. "text/javascript; charset=utf-8".
  std::string_view content_type;
  // The file's bytes, exactly.
  std::string_view body;
};

// Every asset, in the order above. Static storage: the views stay valid for
// the life of the process. Thread-safe.
absl::Span<const WebAsset> WebAssets();

}  // namespace ps

#endif  // PS_SCHEDULER_WEB_ASSETS_H_
