// KVServer's checkpoints, the I/O around its CheckpointGate
// (server/checkpoint_gate.h, which decides): reports what the gate made of
// the view's checkpoint clock, writes this server's shard once the cut is
// reached (server/checkpoint.h), runs again what the gate held, and
// restores from the view's checkpoint once. Runs on the serving thread.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/protocol.h"
#include "common/status.h"
#include "server/checkpoint.h"
#include "server/server_impl.h"
#include "server/server_log.h"

namespace ps {

void KVServer::Impl::Restore(const Ownership& own) {
  FinishDrop();
  checkpoint_gate_.MarkRestoreTried();
  if (own.restore.path().empty()) return;
  // With replication a replacement server usually owns nothing (its old
  // slots went to their backups) and copies what it backs from the
  // primaries: reading the whole checkpoint would be for nothing.
  if (own.replicated && std::find(own.slot_owner.begin(), own.slot_owner.end(),
                                  own.rank) == own.slot_owner.end()) {
    return;
  }
  const uint64_t clock = own.restore.clock();
  // RestoreShards checks every record and file checksum as it reads.
  auto manifest = ReadManifest(own.restore.path());
  absl::Status status = manifest.status();
  if (manifest.ok()) {
    std::vector<Table*> tables;
    for (auto& [id, table] : tables_) tables.push_back(table.get());
    const absl::Time start = options_.clock->Now();
    auto restored = RestoreShards(own.restore.path(), *manifest, tables,
                                  OwnedSlotsFilter(own.slot_owner, own.rank));
    status = restored.status();
    if (restored.ok()) {
      counters_.rows_restored.fetch_add(restored->rows_restored,
                                        std::memory_order_relaxed);
      ServerLog()->info(
          "restored {} rows and {} dense blocks of my slots from {} (clock {}, "
          "{} shard files of {} servers, {:.1f} MB read) in {:.2f} s",
          restored->rows_restored, restored->blocks_restored,
          own.restore.path(), clock, restored->files, manifest->num_servers(),
          restored->bytes / 1e6,
          absl::ToDoubleSeconds(options_.clock->Now() - start));
    }
  }
  if (!status.ok()) {
    // Serving half-restored tables would hand workers parameters from no
    // consistent state: start from the initial values instead, loudly.
    ServerLog()->error(
        "cannot restore checkpoint {}: {}; serving initial values",
        own.restore.path(), status.ToString());
    if (absl::Status created = CreateTables(); !created.ok()) {
      ServerLog()->error("cannot create the tables again: {}",
                         created.ToString());
    }
    return;
  }
  server_clock_ = std::max(server_clock_, clock);
  consistency_.SetAppliedClock(clock);
  checkpoint_gate_.NoteRestored(clock);
}

void KVServer::Impl::NoteCheckpointClock(const Ownership& own) {
  const CheckpointGate::TakeUpResult taken = checkpoint_gate_.TakeUp(
      own.checkpoint_clock,
      !options_.config.checkpoint().dir().empty() && !own.all, consistency_);
  switch (taken.kind) {
    case CheckpointGate::TakeUpResult::kAbandoned:
      ServerLog()->warn("checkpoint at clock {} abandoned", taken.clock);
      break;
    case CheckpointGate::TakeUpResult::kTooLate: {
      ReportCheckpointRequest report;
      report.set_clock(taken.clock);
      report.set_ok(false);
      report.set_error(absl::StrCat(
          "server ", own.rank, " already applied pushes of step ",
          taken.applied_step, " >= ", taken.clock, "; retry at a later clock"));
      ServerLog()->info("checkpoint at clock {}: too late here ({})",
                        taken.clock, report.error());
      if (options_.on_checkpoint) options_.on_checkpoint(report);
      break;
    }
    case CheckpointGate::TakeUpResult::kPending:
      ServerLog()->debug("checkpoint at clock {} pending", taken.clock);
      break;
    case CheckpointGate::TakeUpResult::kUnchanged:
    case CheckpointGate::TakeUpResult::kOff:
      break;
  }
}

void KVServer::Impl::MaybeWriteCheckpoint(const Ownership& own) {
  if (!checkpoint_gate_.ReadyToWrite(consistency_)) return;
  FinishDrop();  // no row of a slot moved away is written
  const uint64_t c = checkpoint_gate_.StartWrite();
  const std::string dir = CheckpointPath(options_.config.checkpoint().dir(), c);
  std::vector<const Table*> tables;
  for (const auto& [id, table] : tables_) tables.push_back(table.get());
  const absl::Time start = options_.clock->Now();
  // With replication this server also holds backup copies of other
  // servers' slots; each slot is written by its owner only.
  auto written = WriteShard(
      dir, own.rank, c, static_cast<uint32_t>(own.slot_owner.size()), tables,
      own.replicated ? OwnedSlotsFilter(own.slot_owner, own.rank)
                     : RowFilter{});
  ReportCheckpointRequest report;
  report.set_clock(c);
  report.set_ok(written.ok());
  if (written.ok()) {
    counters_.checkpoints_written.fetch_add(1, std::memory_order_relaxed);
    report.set_file(written->file());
    report.set_bytes(written->bytes());
    report.set_checksum(written->checksum());
    ServerLog()->info(
        "checkpoint at clock {}: wrote {} ({:.1f} MB) in {:.2f} s", c,
        written->file(), written->bytes() / 1e6,
        absl::ToDoubleSeconds(options_.clock->Now() - start));
  } else {
    report.set_error(std::string(written.status().message()));
    ServerLog()->error("checkpoint at clock {}: {}", c,
                       written.status().ToString());
  }
  if (options_.on_checkpoint) options_.on_checkpoint(report);
  if (written.ok() && serving_.stop_after_checkpoint()) {
    ServerLog()->info(
        "stopping after checkpoint at clock {}: {} held request(s) left "
        "for the workers to route again",
        c, checkpoint_gate_.held_count());
    serving_.RequestStop();
    return;
  }
  ReleaseHeld(own);
}

void KVServer::Impl::ReleaseHeld(const Ownership& own) {
  std::deque<CheckpointGate::Held> held = checkpoint_gate_.TakeHeld();
  for (const CheckpointGate::Held& h : held) counters_.held_bytes -= h.bytes;
  for (CheckpointGate::Held& h : held) {
    // Held requests are pushes, never an ADVANCE_CLOCK: no Progress is due
    // (and every caller runs Progress next anyway).
    (void)HandleMessage(std::move(h.identity), std::move(h.frames), own);
  }
}

}  // namespace ps
