// The scheduler's journal file: one SchedulerJournal (proto/journal.proto)
// in <dir>/scheduler.journal, replaced atomically (written to a temporary
// file, then renamed), so a reader sees the previous state or the new one,
// never a mix.
//
// Durability: Write(sync=false) survives the scheduler process being
// killed (the data is in the kernel's page cache once rename returns);
// Write(sync=true) also fsyncs the file and the directory, surviving a
// machine crash. The scheduler writes unsynced before answering each
// request that changed the state and synced once a second (why: an fsync
// per membership change would put disk latency on every heartbeat behind
// the state lock, and a scheduler moved to another machine reads the
// journal only from shared storage, where the once-a-second sync bounds
// what a crash loses).
//
// Format: "PSJOURNAL1\n", the payload's length (8 bytes, little-endian),
// its FNV-1a 64 checksum (8 bytes, little-endian), the serialized proto.
// A file that is short, has a bad checksum or does not parse reads as
// DATA_LOSS: never trusted.
//
// Not thread-safe: the caller serializes calls (ClusterState holds its
// mutex).
#ifndef PS_SCHEDULER_JOURNAL_H_
#define PS_SCHEDULER_JOURNAL_H_

#include <string>

#include "common/status.h"
#include "proto/journal.pb.h"

namespace ps {

class JournalFile {
 public:
  // The journal in directory `dir`, which is created (with parents) on the
  // first Write if missing.
  explicit JournalFile(std::string dir);

  const std::string& path() const { return path_; }

  // NOT_FOUND when there is no journal; DATA_LOSS (naming the file and
  // what is wrong) when it is damaged; other errors from the file system.
  absl::StatusOr<SchedulerJournal> Read() const;

  // Replaces the journal with `journal`. On error the previous journal is
  // left as it was.
  absl::Status Write(const SchedulerJournal& journal, bool sync);

  // Renames the journal to <path>.<suffix> (kept for an operator to look
  // at); OK when there is none.
  absl::Status SetAside(const std::string& suffix);

 private:
  const std::string dir_;
  const std::string path_;
};

}  // namespace ps

#endif  // PS_SCHEDULER_JOURNAL_H_
