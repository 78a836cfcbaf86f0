// A small Prometheus metrics registry: counters, gauges (set, or computed
// by a callback at scrape time), histograms with fixed buckets, each
// either plain or as a family of children told apart by label values, and
// the text exposition format 0.0.4 that Prometheus scrapes
// (common/http_endpoint.h serves it at /metrics).
//
// Naming (the project's convention): every name starts with "ps_", carries
// its unit ("_seconds", "_bytes"), and counters end in "_total".
//
// Hot paths: look a labelled child up once (Family::With), keep the
// pointer, and update it with relaxed atomic operations: Counter::Add is
// one atomic add, Histogram::Observe a short bucket search and two atomic
// adds. Nothing allocates or locks after the look-up.
//
// Thread safety: everything is thread-safe. Metric and child pointers stay
// valid as long as the registry; nothing is ever removed. Callbacks run on
// the thread that calls Expose() (an HTTP handler thread), without any
// registry lock held, so they may take their own locks; they must not
// block for long.
//
// Misuse never aborts: an invalid metric or label name has its invalid
// characters replaced by '_'; registering a name a second time with the
// same kind and labels returns the first registration's metric, with a
// different kind or labels a working metric that is left out of the
// exposition (and a warning is logged); a child looked up with too few
// label values has the missing ones empty, extra values are ignored.
#ifndef PS_COMMON_METRICS_H_
#define PS_COMMON_METRICS_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace ps::metrics {

// A monotonically increasing count of events or units (bytes).
class Counter {
 public:
  void Add(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

// A value that goes up and down.
class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double d);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Observations counted into fixed buckets, with their sum and count.
// Bucket i counts observations <= bounds[i]; one more bucket (+Inf) takes
// the rest. Exposed cumulatively, as Prometheus expects.
class Histogram {
 public:
  // `bounds`: upper bounds, sorted ascending (they are sorted and made
  // unique if not); +Inf is implied and must not be listed.
  explicit Histogram(std::vector<double> bounds);

  // NaN is ignored.
  void Observe(double v);

  const std::vector<double>& bounds() const { return bounds_; }
  // Per-bucket (not cumulative) counts, bounds().size() + 1 of them, the
  // last for +Inf; and the sum of all observations. Read one at a time,
  // so a snapshot taken during updates may be off by the updates in
  // flight.
  std::vector<uint64_t> BucketCounts() const;
  double sum() const { return sum_.load(std::memory_order_relaxed); }
  uint64_t count() const;

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;
  std::atomic<double> sum_{0};
};

// Bucket bounds start, start*factor, ... (count of them). Empty unless
// start > 0, factor > 1 and count > 0.
std::vector<double> ExponentialBuckets(double start, double factor, int count);
// Latencies from 50 microseconds to 10 seconds, about 2.5x apart.
std::vector<double> LatencyBuckets();

enum class Type { kCounter, kGauge, kHistogram };

// One labelled sample a callback family produces at scrape time.
struct Sample {
  std::vector<std::string> label_values;
  double value = 0;
};

// Children of one metric, one per distinct tuple of label values.
template <typename T>
class Family {
 public:
  // The child for `label_values` (in the order of the label names), created
  // on first use. Takes a lock: look children up once, not per event.
  T* With(const std::vector<std::string>& label_values);

 private:
  friend class Registry;
  Family(size_t num_labels, std::function<std::unique_ptr<T>()> make)
      : num_labels_(num_labels), make_(std::move(make)) {}
  // Copies of the children's pointers, in label order.
  std::vector<std::pair<std::vector<std::string>, const T*>> Children() const;

  const size_t num_labels_;
  const std::function<std::unique_ptr<T>()> make_;
  mutable absl::Mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<T>> children_
      ABSL_GUARDED_BY(mu_);
};

using CounterFamily = Family<Counter>;
using GaugeFamily = Family<Gauge>;
using HistogramFamily = Family<Histogram>;

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // `help` is one line describing the metric (escaped on output).
  Counter* AddCounter(absl::string_view name, absl::string_view help);
  Gauge* AddGauge(absl::string_view name, absl::string_view help);
  Histogram* AddHistogram(absl::string_view name, absl::string_view help,
                          std::vector<double> bounds);

  CounterFamily* AddCounterFamily(absl::string_view name, absl::string_view help,
                                  std::vector<std::string> label_names);
  GaugeFamily* AddGaugeFamily(absl::string_view name, absl::string_view help,
                              std::vector<std::string> label_names);
  // A label named "le" (the bucket's label) is renamed "le_".
  HistogramFamily* AddHistogramFamily(absl::string_view name,
                                      absl::string_view help,
                                      std::vector<std::string> label_names,
                                      std::vector<double> bounds);

  // A counter or gauge whose value `fn` computes at every scrape (e.g. from
  // a component's own statistics). `type` kHistogram is taken as kGauge.
  void AddCallback(absl::string_view name, absl::string_view help, Type type,
                   std::function<double()> fn);
  // As AddCallback, with any number of labelled samples per scrape.
  void AddCallbackFamily(absl::string_view name, absl::string_view help,
                         Type type, std::vector<std::string> label_names,
                         std::function<std::vector<Sample>()> fn);

  // Every metric in registration order, children in label order, in the
  // text exposition format 0.0.4 (# HELP and # TYPE lines included).
  std::string Expose() const;

  // Content-Type of Expose()'s output.
  static constexpr const char* kContentType =
      "text/plain; version=0.0.4; charset=utf-8";

 private:
  struct Entry;
  // Registers `entry`, or returns the existing one of that name when it
  // matches (same kind, labels and buckets). On a conflict, keeps `entry`
  // out of the exposition and returns it anyway.
  Entry* Insert(std::unique_ptr<Entry> entry);

  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Entry>> entries_ ABSL_GUARDED_BY(mu_);
  // Entries that lost a name conflict: alive, never exposed.
  std::vector<std::unique_ptr<Entry>> detached_ ABSL_GUARDED_BY(mu_);
};

// Adds the process's own metrics, read at scrape time:
// ps_process_start_time_seconds (Unix time of this call, which main()
// makes at start), ps_process_cpu_seconds_total (user + system) and
// ps_process_resident_memory_bytes.
void AddProcessMetrics(Registry* registry);

// Text format helpers, exposed for tests and the status page.
// A label value with backslash, double quote and line feed escaped.
std::string EscapeLabelValue(absl::string_view v);
// A sample value: integers without a fraction, +Inf, -Inf, NaN, otherwise
// the shortest form that reads back to the same double.
std::string FormatValue(double v);
// `name` with characters outside [a-zA-Z0-9_:] (and a leading digit)
// replaced by '_'; labels additionally lose ':'.
std::string SanitizeName(absl::string_view name, bool label);

// ---- implementation of the template ----

template <typename T>
T* Family<T>::With(const std::vector<std::string>& label_values) {
  std::vector<std::string> key(label_values.begin(),
                               label_values.begin() +
                                   std::min(label_values.size(), num_labels_));
  key.resize(num_labels_);
  absl::MutexLock lock(&mu_);
  std::unique_ptr<T>& child = children_[key];
  if (child == nullptr) child = make_();
  return child.get();
}

template <typename T>
std::vector<std::pair<std::vector<std::string>, const T*>> Family<T>::Children()
    const {
  std::vector<std::pair<std::vector<std::string>, const T*>> out;
  absl::MutexLock lock(&mu_);
  out.reserve(children_.size());
  for (const auto& [labels, child] : children_) out.emplace_back(labels, child.get());
  return out;
}

}  // namespace ps::metrics

#endif  // PS_COMMON_METRICS_H_
