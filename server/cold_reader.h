// Reads a tiered sparse table's cold rows off the serving thread, so a
// request whose keys are on disk waits for its rows while the thread goes
// on with other requests, and so a worker can have the rows of its next
// batch read before it asks for them (PREFETCH).
//
// The serving thread submits batches of keys; one reader thread reads each
// batch with DiskTier::MultiGet (itself split over the tier's IoPool), in
// submission order, and calls `done` after each. The serving thread then
// installs the finished batches: their rows become "staged", copies of
// what the tier holds that the table reads instead of the disk.
//
// A staged copy is only as good as the tier row it copies. The table tells
// the reader of every write and delete it makes to the tier (Invalidate),
// which drops the key's staged copy, and the copy a batch still in flight
// will bring: a read that may have raced the write is never installed.
// Since the tier's rows change only on the serving thread, a staged row is
// always the tier's current row of its key.
//
// What stays staged: a batch's rows until the requests waiting for them
// ran (the caller's Trim after them), except rows pinned by a request kept
// to run again (a pull deferred by the consistency rule, a push buffered
// until its BSP step completes). The table promotes what it uses into RAM
// (pushes and pulls), and a `promote` batch's rows (PREFETCH) as soon as
// they are installed, so RAM under the budget is the cache: staged rows
// are only in transit, bounded by a batch and the pinned rows.
//
// Thread safety: every member but the reader thread's is for the serving
// thread only. `done` runs on the reader thread. The destructor waits for
// the batch being read and drops the others.
#ifndef PS_SERVER_COLD_READER_H_
#define PS_SERVER_COLD_READER_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/status.h"
#include "server/disk_tier.h"

namespace ps {

class ColdReader {
 public:
  // `tier` outlives the reader; rows have `state_floats` floats. `done` is
  // called on the reader thread after each batch (it must be cheap and
  // thread-safe: the server writes an eventfd); `before_read`, when not
  // null, before each (tests hold a read in flight with it).
  ColdReader(DiskTier* tier, size_t state_floats, size_t max_staged_rows,
             std::function<void()> done,
             std::function<void()> before_read = nullptr);
  ~ColdReader();
  ColdReader(const ColdReader&) = delete;
  ColdReader& operator=(const ColdReader&) = delete;

  // Where a key's row is, as far as the reader knows.
  enum class Where { kNone, kStaged, kReading };
  // kReading sets *batch to the batch that reads it.
  Where Find(uint64_t key, uint64_t* batch) const;

  // Starts reading the keys of `keys` neither staged nor being read;
  // returns the batch's number (numbers grow from 1), or 0 when nothing
  // was left to read. `promote`: the table promotes the batch's rows once
  // installed (last_promote()); no request waits for them.
  uint64_t Submit(absl::Span<const uint64_t> keys, bool promote = false);
  // The highest batch number installed: every batch up to it is.
  uint64_t installed() const { return installed_; }
  // Whether a batch was submitted and is not installed yet.
  bool busy() const { return installed_ < submitted_; }
  // Installs the oldest finished batch, if any: true when it did. *error
  // is the batch's read error (OK otherwise); a failed batch stages
  // nothing. Older staged rows are dropped to make room, never the batch's
  // own: until Trim, the rows staged may pass the cap by one batch.
  bool InstallOne(absl::Status* error);
  // Drops the rows of the batches installed since the last call but the
  // pinned ones, then the oldest staged rows past the cap.
  void Trim();
  // The keys the last InstallOne staged, and whether its batch was a
  // `promote` one.
  const std::vector<uint64_t>& last_staged() const { return request_rows_; }
  bool last_promote() const { return last_promote_; }

  // The staged row of `key` (state_floats() floats, valid until the next
  // call that changes the reader) and its tag; null when not staged.
  const float* Staged(uint64_t key, ColdRowTag* tag) const;
  // The tier's row of `key` was written or deleted: its staged copy, and
  // the one a batch in flight brings, are not the tier's row any more.
  void Invalidate(uint64_t key);
  // Invalidate for every key staged or being read that `drop` selects (the
  // tier's rows of some slots were deleted at once).
  void InvalidateIf(absl::FunctionRef<bool(uint64_t key)> drop);
  // Keeps the staged rows of `keys` (those staged now) until as many
  // Unpin calls name them, or they are invalidated: a request kept to run
  // again uses them then. Trim drops no pinned row.
  void Pin(absl::Span<const uint64_t> keys);
  void Unpin(absl::Span<const uint64_t> keys);
  size_t pinned_rows() const { return pinned_.size(); }

  size_t staged_rows() const { return staged_.size(); }
  size_t MemoryBytes() const;

  // Counters: rows read off the serving thread, batches read.
  uint64_t rows_read() const { return rows_read_; }
  uint64_t batches_read() const { return installed_; }

 private:
  struct Batch {
    uint64_t id = 0;
    std::vector<uint64_t> keys;
    std::vector<float> states;
    std::vector<ColdRowTag> tags;
    std::vector<bool> found;
    absl::Status status;
    bool promote = false;
  };
  struct Row {
    std::vector<float> state;
    ColdRowTag tag;
  };

  void Loop();
  bool WorkOrStop() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || !queue_.empty();
  }
  void Stage(uint64_t key, const float* state, const ColdRowTag& tag);

  DiskTier* const tier_;
  const size_t state_floats_;
  const size_t max_staged_rows_;
  const std::function<void()> done_;
  const std::function<void()> before_read_;

  // Serving thread only.
  uint64_t submitted_ = 0;
  uint64_t installed_ = 0;
  uint64_t rows_read_ = 0;
  absl::flat_hash_map<uint64_t, uint64_t> reading_;  // key -> batch
  absl::flat_hash_set<uint64_t> stale_;  // being read, written since
  absl::flat_hash_map<uint64_t, Row> staged_;
  std::deque<uint64_t> staged_order_;  // oldest first; may hold dropped keys
  absl::flat_hash_map<uint64_t, uint32_t> pinned_;  // key -> pins
  // Keys staged since the last Trim, dropped by the next one.
  std::vector<uint64_t> request_rows_;
  bool last_promote_ = false;

  absl::Mutex mu_;
  std::deque<std::unique_ptr<Batch>> queue_ ABSL_GUARDED_BY(mu_);
  std::deque<std::unique_ptr<Batch>> finished_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ps

#endif  // PS_SERVER_COLD_READER_H_
