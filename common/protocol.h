// Constants of the data-plane protocol shared by workers, servers and the
// scheduler, in a header with no dependencies so every library can use it.
#ifndef PS_COMMON_PROTOCOL_H_
#define PS_COMMON_PROTOCOL_H_

#include <cstdint>
#include <string_view>

namespace ps {

// A worker that has finished training advances its clock to this value, so
// it never holds back synchronous waits; its later pulls (evaluation) are
// answered once every live worker has finished too. Clocks at or above it
// are not counted as steps taken.
inline constexpr uint64_t kFinishedClock = uint64_t{1} << 62;

// ClusterView.slot_backup of a slot without a backup (scheduler.proto). The
// scheduler writes it and servers read it, so both take it from here.
inline constexpr uint32_t kNoBackup = 0xFFFFFFFF;

// The most distinct metric names one worker reports (TrainingReport.metrics).
inline constexpr int kMaxMetricsPerWorker = 32;

// A metric's name as workers report it to the scheduler (MetricPoint.name):
// 1 to 64 characters of [A-Za-z0-9_./-], so it is safe in a page, a JSON
// key and a Prometheus label alike.
inline bool ValidMetricName(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (const char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '_' || c == '.' ||
                    c == '/' || c == '-';
    if (!ok) return false;
  }
  return true;
}

}  // namespace ps

#endif  // PS_COMMON_PROTOCOL_H_
