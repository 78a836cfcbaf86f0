// KVServer's checkpoints, the I/O around its CheckpointGate
// (server/checkpoint_gate.h, which decides): reports what the gate made of
// the view's checkpoint clock, writes this server's shard once the cut is
// reached (server/checkpoint.h), runs again what the gate held, and
// restores from the view's checkpoint once. Runs on the serving thread.
#include <algorithm>
#include <optional>
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
  FinishCheckpointWrite(/*wait=*/true);  // it reads the tables' tiers
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
  FinishCheckpointWrite(/*wait=*/true);  // one shard write at a time
  const uint64_t c = checkpoint_gate_.StartWrite();
  const std::string dir = CheckpointPath(options_.config.checkpoint().dir(), c);
  std::vector<const Table*> tables;
  for (const auto& [id, table] : tables_) tables.push_back(table.get());
  const absl::Time start = options_.clock->Now();
  // With replication this server also holds backup copies of other
  // servers' slots; each slot is written by its owner only.
  const RowFilter keep =
      own.replicated ? OwnedSlotsFilter(own.slot_owner, own.rank) : RowFilter{};
  const uint32_t num_slots = static_cast<uint32_t>(own.slot_owner.size());
  // A server that stops after this checkpoint (preemption) writes it
  // whole here: nothing may be applied after the cut before it leaves.
  if (!tiered_.empty() && !serving_.stop_after_checkpoint()) {
    auto begun = ShardWriteInParts::Begin(
        dir, absl::StrCat(tier_roots_.begin()->second->path(), "/spill"),
        own.rank, c, num_slots, tables, keep);
    if (!begun.ok()) {
      ReportCheckpoint(c, begun.status(), start);
    } else {
      // The cut is on the spill and the tiers' snapshots: the requests
      // held for it may run, while the cold rows are written.
      const absl::Duration paused = options_.clock->Now() - start;
      ServerLog()->info(
          "checkpoint at clock {}: {} rows in RAM spilled in {:.1f} ms; "
          "writing the cold rows while serving",
          c, (*begun)->spilled_rows(), absl::ToDoubleMilliseconds(paused));
      const WakeFd* wake = &tier_waits_.wake;
      shard_write_.Start(c, start, paused, *std::move(begun),
                         [wake] { wake->Wake(); });
    }
    ReleaseHeld(own);
    return;
  }
  auto written = WriteShard(dir, own.rank, c, num_slots, tables, keep);
  ReportCheckpoint(c, written, start);
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

void KVServer::Impl::FinishCheckpointWrite(bool wait) {
  if (!shard_write_.busy() || (!wait && !shard_write_.done())) return;
  std::optional<ShardWriteThread::Ended> ended = shard_write_.Take();
  const ShardWriteInParts& write = *ended->write;
  if (!write.tier_error().ok()) {
    // Its tier cannot be trusted: the server is fenced (StorageFailed).
    auto it = tables_.find(write.tier_error_table());
    if (it != tables_.end() && it->second->AsSparse() != nullptr)
      it->second->AsSparse()->NoteTierFailure(write.tier_error());
  }
  if (ended->result.ok()) {
    ServerLog()->info(
        "checkpoint at clock {}: {} cold rows written while serving (it "
        "paused {:.1f} ms for the rows in RAM)",
        ended->clock, write.cold_rows(),
        absl::ToDoubleMilliseconds(ended->paused));
  }
  ReportCheckpoint(ended->clock, ended->result, ended->start);
}

void KVServer::Impl::ReportCheckpoint(uint64_t c,
                                      const absl::StatusOr<ShardFile>& written,
                                      absl::Time start) {
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
