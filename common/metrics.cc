#include "common/metrics.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/logging.h"

namespace ps::metrics {

void Gauge::Add(double d) {
  double cur = value_.load(std::memory_order_relaxed);
  while (!value_.compare_exchange_weak(cur, cur + d, std::memory_order_relaxed)) {
  }
}

namespace {

std::vector<double> SortedBounds(std::vector<double> bounds) {
  std::vector<double> out;
  for (double b : bounds) {
    if (std::isfinite(b)) out.push_back(b);  // +Inf is implied; NaN means nothing
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

void AddDouble(std::atomic<double>& a, double d) {
  double cur = a.load(std::memory_order_relaxed);
  while (!a.compare_exchange_weak(cur, cur + d, std::memory_order_relaxed)) {
  }
}

const char* TypeName(Type t) {
  switch (t) {
    case Type::kCounter:
      return "counter";
    case Type::kGauge:
      return "gauge";
    case Type::kHistogram:
      return "histogram";
  }
  return "untyped";
}

std::string EscapeHelp(absl::string_view help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// `{a="x",b="y"` plus `extra` (already formatted) and `}`; "" without any.
std::string LabelSet(const std::vector<std::string>& names,
                     const std::vector<std::string>& values,
                     const std::string& extra = "") {
  std::vector<std::string> parts;
  for (size_t i = 0; i < names.size(); ++i) {
    parts.push_back(absl::StrCat(names[i], "=\"",
                                 EscapeLabelValue(i < values.size() ? values[i] : ""),
                                 "\""));
  }
  if (!extra.empty()) parts.push_back(extra);
  if (parts.empty()) return "";
  return absl::StrCat("{", absl::StrJoin(parts, ","), "}");
}

void AppendHistogram(const std::string& name, const std::vector<std::string>& label_names,
                     const std::vector<std::string>& values, const Histogram& h,
                     std::string* out) {
  const std::vector<uint64_t> counts = h.BucketCounts();
  uint64_t cumulative = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    cumulative += counts[i];
    const std::string le =
        i < h.bounds().size() ? FormatValue(h.bounds()[i]) : std::string("+Inf");
    absl::StrAppend(out, name, "_bucket",
                    LabelSet(label_names, values, absl::StrCat("le=\"", le, "\"")), " ",
                    cumulative, "\n");
  }
  // The count is the +Inf bucket's, so the two always agree.
  absl::StrAppend(out, name, "_sum", LabelSet(label_names, values), " ",
                  FormatValue(h.sum()), "\n");
  absl::StrAppend(out, name, "_count", LabelSet(label_names, values), " ", cumulative,
                  "\n");
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(SortedBounds(std::move(bounds))),
      counts_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0);
}

void Histogram::Observe(double v) {
  if (std::isnan(v)) return;
  // The first bound >= v; past the end is the +Inf bucket.
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  AddDouble(sum_, v);
}

std::vector<uint64_t> Histogram::BucketCounts() const {
  std::vector<uint64_t> out(bounds_.size() + 1);
  for (size_t i = 0; i < out.size(); ++i) out[i] = counts_[i].load(std::memory_order_relaxed);
  return out;
}

uint64_t Histogram::count() const {
  uint64_t n = 0;
  for (uint64_t c : BucketCounts()) n += c;
  return n;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> out;
  if (!(start > 0) || !(factor > 1)) return out;
  double b = start;
  for (int i = 0; i < count; ++i, b *= factor) out.push_back(b);
  return out;
}

std::vector<double> LatencyBuckets() {
  return {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
          0.025,   0.05,   0.1,     0.25,   0.5,   1,      2.5,   5,     10};
}

std::string EscapeLabelValue(absl::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 9007199254740992.0) {
    return absl::StrCat(static_cast<int64_t>(v));
  }
  char buf[32];
  for (int precision = 15; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

std::string SanitizeName(absl::string_view name, bool label) {
  std::string out(name);
  if (out.empty()) return "_";
  for (size_t i = 0; i < out.size(); ++i) {
    const char c = out[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                    (!label && c == ':') || (i > 0 && c >= '0' && c <= '9');
    if (!ok) out[i] = '_';
  }
  return out;
}

struct Registry::Entry {
  enum class Kind { kPlain, kFamily, kCallback, kCallbackFamily };
  std::string name;
  std::string help;
  Type type = Type::kGauge;
  Kind kind = Kind::kPlain;
  std::vector<std::string> label_names;
  std::vector<double> bounds;  // histograms
  // The one matching type and kind is set.
  std::unique_ptr<Counter> counter;
  std::unique_ptr<Gauge> gauge;
  std::unique_ptr<Histogram> histogram;
  std::unique_ptr<CounterFamily> counters;
  std::unique_ptr<GaugeFamily> gauges;
  std::unique_ptr<HistogramFamily> histograms;
  std::function<double()> callback;
  std::function<std::vector<Sample>()> callback_family;

  bool SameShape(const Entry& o) const {
    return type == o.type && kind == o.kind && label_names == o.label_names &&
           bounds == o.bounds && kind != Kind::kCallback && kind != Kind::kCallbackFamily;
  }

  void Append(std::string* out) const {
    absl::StrAppend(out, "# HELP ", name, " ", EscapeHelp(help), "\n");
    absl::StrAppend(out, "# TYPE ", name, " ", TypeName(type), "\n");
    switch (kind) {
      case Kind::kPlain:
        if (counter) absl::StrAppend(out, name, " ", counter->value(), "\n");
        if (gauge) absl::StrAppend(out, name, " ", FormatValue(gauge->value()), "\n");
        if (histogram) AppendHistogram(name, {}, {}, *histogram, out);
        break;
      case Kind::kFamily:
        if (counters) {
          for (const auto& [values, c] : counters->Children()) {
            absl::StrAppend(out, name, LabelSet(label_names, values), " ", c->value(), "\n");
          }
        }
        if (gauges) {
          for (const auto& [values, g] : gauges->Children()) {
            absl::StrAppend(out, name, LabelSet(label_names, values), " ",
                            FormatValue(g->value()), "\n");
          }
        }
        if (histograms) {
          for (const auto& [values, h] : histograms->Children()) {
            AppendHistogram(name, label_names, values, *h, out);
          }
        }
        break;
      case Kind::kCallback:
        absl::StrAppend(out, name, " ", FormatValue(callback()), "\n");
        break;
      case Kind::kCallbackFamily:
        for (const Sample& s : callback_family()) {
          absl::StrAppend(out, name, LabelSet(label_names, s.label_values), " ",
                          FormatValue(s.value), "\n");
        }
        break;
    }
  }
};

Registry::Registry() = default;
Registry::~Registry() = default;

Registry::Entry* Registry::Insert(std::unique_ptr<Entry> entry) {
  entry->name = SanitizeName(entry->name, /*label=*/false);
  for (std::string& l : entry->label_names) l = SanitizeName(l, /*label=*/true);
  absl::MutexLock lock(&mu_);
  for (const auto& e : entries_) {
    if (e->name != entry->name) continue;
    if (e->SameShape(*entry)) return e.get();
    GetLogger("metrics")->warn(
        "metric {} registered twice with a different kind or labels; the second "
        "registration is not exported",
        entry->name);
    detached_.push_back(std::move(entry));
    return detached_.back().get();
  }
  entries_.push_back(std::move(entry));
  return entries_.back().get();
}

Counter* Registry::AddCounter(absl::string_view name, absl::string_view help) {
  auto e = std::make_unique<Entry>();
  e->name = std::string(name);
  e->help = std::string(help);
  e->type = Type::kCounter;
  e->counter = std::make_unique<Counter>();
  return Insert(std::move(e))->counter.get();
}

Gauge* Registry::AddGauge(absl::string_view name, absl::string_view help) {
  auto e = std::make_unique<Entry>();
  e->name = std::string(name);
  e->help = std::string(help);
  e->type = Type::kGauge;
  e->gauge = std::make_unique<Gauge>();
  return Insert(std::move(e))->gauge.get();
}

Histogram* Registry::AddHistogram(absl::string_view name, absl::string_view help,
                                  std::vector<double> bounds) {
  auto e = std::make_unique<Entry>();
  e->name = std::string(name);
  e->help = std::string(help);
  e->type = Type::kHistogram;
  e->bounds = SortedBounds(std::move(bounds));
  e->histogram = std::make_unique<Histogram>(e->bounds);
  return Insert(std::move(e))->histogram.get();
}

CounterFamily* Registry::AddCounterFamily(absl::string_view name, absl::string_view help,
                                          std::vector<std::string> label_names) {
  auto e = std::make_unique<Entry>();
  e->name = std::string(name);
  e->help = std::string(help);
  e->type = Type::kCounter;
  e->kind = Entry::Kind::kFamily;
  e->label_names = std::move(label_names);
  e->counters.reset(new CounterFamily(e->label_names.size(),
                                      [] { return std::make_unique<Counter>(); }));
  return Insert(std::move(e))->counters.get();
}

GaugeFamily* Registry::AddGaugeFamily(absl::string_view name, absl::string_view help,
                                      std::vector<std::string> label_names) {
  auto e = std::make_unique<Entry>();
  e->name = std::string(name);
  e->help = std::string(help);
  e->type = Type::kGauge;
  e->kind = Entry::Kind::kFamily;
  e->label_names = std::move(label_names);
  e->gauges.reset(
      new GaugeFamily(e->label_names.size(), [] { return std::make_unique<Gauge>(); }));
  return Insert(std::move(e))->gauges.get();
}

HistogramFamily* Registry::AddHistogramFamily(absl::string_view name,
                                              absl::string_view help,
                                              std::vector<std::string> label_names,
                                              std::vector<double> bounds) {
  auto e = std::make_unique<Entry>();
  e->name = std::string(name);
  e->help = std::string(help);
  e->type = Type::kHistogram;
  e->kind = Entry::Kind::kFamily;
  e->label_names = std::move(label_names);
  for (std::string& l : e->label_names) {
    if (l == "le") l = "le_";  // "le" names the bucket
  }
  e->bounds = SortedBounds(std::move(bounds));
  std::vector<double> b = e->bounds;
  e->histograms.reset(new HistogramFamily(
      e->label_names.size(), [b] { return std::make_unique<Histogram>(b); }));
  return Insert(std::move(e))->histograms.get();
}

void Registry::AddCallback(absl::string_view name, absl::string_view help, Type type,
                           std::function<double()> fn) {
  auto e = std::make_unique<Entry>();
  e->name = std::string(name);
  e->help = std::string(help);
  e->type = type == Type::kHistogram ? Type::kGauge : type;
  e->kind = Entry::Kind::kCallback;
  e->callback = std::move(fn);
  if (!e->callback) e->callback = [] { return 0.0; };
  Insert(std::move(e));
}

void Registry::AddCallbackFamily(absl::string_view name, absl::string_view help,
                                 Type type, std::vector<std::string> label_names,
                                 std::function<std::vector<Sample>()> fn) {
  auto e = std::make_unique<Entry>();
  e->name = std::string(name);
  e->help = std::string(help);
  e->type = type == Type::kHistogram ? Type::kGauge : type;
  e->kind = Entry::Kind::kCallbackFamily;
  e->label_names = std::move(label_names);
  e->callback_family = std::move(fn);
  if (!e->callback_family) e->callback_family = [] { return std::vector<Sample>(); };
  Insert(std::move(e));
}

void AddProcessMetrics(Registry* r) {
  const double start = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  r->AddCallback("ps_process_start_time_seconds", "Unix time the process started.",
                 Type::kGauge, [start] { return start; });
  r->AddCallback("ps_process_cpu_seconds_total", "CPU time used (user and system).",
                 Type::kCounter, [] {
                   rusage u{};
                   if (getrusage(RUSAGE_SELF, &u) != 0) return 0.0;
                   return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
                          double(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
                 });
  r->AddCallback("ps_process_resident_memory_bytes", "Resident set size.", Type::kGauge,
                 [] {
                   // statm: size resident shared ... in pages.
                   std::ifstream statm("/proc/self/statm");
                   uint64_t size = 0, resident = 0;
                   if (!(statm >> size >> resident)) return 0.0;
                   return double(resident) * double(sysconf(_SC_PAGESIZE));
                 });
}

std::string Registry::Expose() const {
  // Entries are never removed and their addresses never change, so they
  // are formatted (and callbacks run) without the registry lock.
  std::vector<const Entry*> entries;
  {
    absl::MutexLock lock(&mu_);
    entries.reserve(entries_.size());
    for (const auto& e : entries_) entries.push_back(e.get());
  }
  std::string out;
  for (const Entry* e : entries) e->Append(&out);
  return out;
}

}  // namespace ps::metrics
