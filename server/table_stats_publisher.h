// The table statistics KVServer::table_stats() returns: gathered by the
// serving thread at most every KVServer::kStatsPeriod, read by any thread.
// Internal to //server:server.
#ifndef PS_SERVER_TABLE_STATS_PUBLISHER_H_
#define PS_SERVER_TABLE_STATS_PUBLISHER_H_

#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/data_plane.pb.h"

namespace ps {

class TableStatsPublisher {
 public:
  explicit TableStatsPublisher(absl::Duration period) : period_(period) {}

  // Serving thread only: whether `period` has passed since the last
  // Publish (true before the first).
  bool Due(absl::Time now) const { return now - last_publish_ >= period_; }
  // Serving thread only: `stats`, gathered at `now`, replace those published.
  void Publish(absl::Time now, std::vector<TableStats> stats) {
    last_publish_ = now;
    absl::MutexLock lock(&mu_);
    stats_ = std::move(stats);
  }
  // Any thread: the statistics published last (empty before the first).
  std::vector<TableStats> Get() const {
    absl::MutexLock lock(&mu_);
    return stats_;
  }

 private:
  const absl::Duration period_;
  absl::Time last_publish_ = absl::InfinitePast();  // serving thread
  mutable absl::Mutex mu_;
  std::vector<TableStats> stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps

#endif  // PS_SERVER_TABLE_STATS_PUBLISHER_H_
