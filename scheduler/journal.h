// The scheduler's journal file: one SchedulerJournal (proto/journal.proto)
// in <dir>/scheduler.journal, replaced atomically (written to a temporary
// file, then renamed), so a reader sees the previous state or the new one,
// never a mix.
//
// Durability (common/durable_file.h): Write(sync=false) survives the
// scheduler process being killed (the data is in the kernel's page cache
// once rename returns); Write(sync=true) also fsyncs the file and the
// directory, surviving a machine crash, and fails if either fsync does. The
// scheduler writes unsynced before answering each request that changed the
// state and synced once a second (why: an fsync per membership change would put
// disk latency on every heartbeat behind the state lock, and a scheduler moved
// to another machine reads the journal only from shared storage, where the
// once-a-second sync bounds what a crash loses).
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

#include "common/durable_file.h"
#include "common/status.h"
#include "proto/journal.pb.h"

namespace ps {

class JournalFile {
 public:
  // The journal in directory `dir`, which is created (with parents) on the
  // first Write if missing. Writes go through `env` (not owned; tests
  // inject failures there).
  explicit JournalFile(std::string dir, FileEnv* env = FileEnv::Default());
  ~JournalFile();
  JournalFile(const JournalFile&) = delete;
  JournalFile& operator=(const JournalFile&) = delete;

  // Takes the directory's lock (<dir>/scheduler.lock, flock(2)), creating
  // the directory if missing; held until this object is destroyed or its
  // process ends (also when killed), so a scheduler restarted after a crash
  // gets it. FAILED_PRECONDITION naming the holder's pid when another
  // scheduler holds it.
  absl::Status Lock();

  const std::string& path() const { return path_; }

  // NOT_FOUND when there is no journal; DATA_LOSS (naming the file and
  // what is wrong) when it is damaged; other errors from the file system.
  absl::StatusOr<SchedulerJournal> Read() const;

  // Replaces the journal with `journal`. On error the previous journal is
  // left as it was, except a failed directory fsync (sync true), which
  // comes after the new journal is in place but may not survive a crash.
  absl::Status Write(const SchedulerJournal& journal, bool sync);

  // Renames the journal to <path>.<suffix> (kept for an operator to look
  // at); OK when there is none.
  absl::Status SetAside(const std::string& suffix);

 private:
  const std::string dir_;
  const std::string path_;
  FileEnv* const env_;
  int lock_fd_ = -1;
};

}  // namespace ps

#endif  // PS_SCHEDULER_JOURNAL_H_
