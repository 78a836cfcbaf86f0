#include "scheduler/shard_ledger.h"

#include "scheduler/scheduler_log.h"

namespace ps {
namespace {

// The journal stores State as JournalShard::State.
static_assert(static_cast<int>(ShardLedger::State::kUnstarted) == JournalShard::UNSTARTED);
static_assert(static_cast<int>(ShardLedger::State::kActive) == JournalShard::ACTIVE);
static_assert(static_cast<int>(ShardLedger::State::kOrphaned) == JournalShard::ORPHANED);
static_assert(static_cast<int>(ShardLedger::State::kDone) == JournalShard::DONE);

}  // namespace

ShardLedger::ShardLedger(uint32_t num_shards, bool reassign)
    : reassign_(reassign), shards_(num_shards) {
  for (uint32_t s = 0; s < num_shards; ++s) shards_[s].position.set_shard(s);
}

bool ShardLedger::Available(uint32_t s) const {
  const State state = shards_.at(s).state;
  return state == State::kUnstarted || (state == State::kOrphaned && reassign_);
}

void ShardLedger::Set(uint32_t s, State state, uint64_t holder) {
  Shard &shard = shards_[s];
  if (shard.state == State::kOrphaned) orphaned_.erase(s);
  if (shard.state == State::kDone) --done_;
  if (shard.holder != 0) {
    auto it = held_.find(shard.holder);
    if (it != held_.end()) {
      it->second.erase(s);
      if (it->second.empty()) held_.erase(it);
    }
  }
  shard.state = state;
  shard.holder = state == State::kActive ? holder : 0;
  if (state == State::kOrphaned) orphaned_.insert(s);
  if (state == State::kDone) ++done_;
  if (shard.holder != 0) held_[shard.holder].insert(s);
}

int ShardLedger::Orphan() const {
  if (!reassign_ || orphaned_.empty()) return -1;
  return static_cast<int>(*orphaned_.begin());
}

int ShardLedger::HeldBy(uint64_t holder, uint32_t except) const {
  auto it = held_.find(holder);
  if (it == held_.end()) return -1;
  for (uint32_t s : it->second) {
    if (s != except) return static_cast<int>(s);
  }
  return -1;
}

DataPosition ShardLedger::Assign(uint32_t s, uint64_t holder) {
  Shard &shard = shards_.at(s);
  const bool resumed = shard.state == State::kOrphaned;
  Set(s, State::kActive, holder);
  shard.position.set_shard(s);
  shard.position.set_done(false);
  if (resumed || shard.position.epoch() > 0 || shard.position.batch() > 0) {
    SchedulerLog()->info("shard {} goes to node {} from epoch {} batch {}", s,
                         holder, shard.position.epoch(),
                         shard.position.batch());
  }
  return shard.position;
}

void ShardLedger::Report(uint64_t holder, const DataPosition &position) {
  if (position.shard() >= shards_.size()) return;
  Shard &shard = shards_[position.shard()];
  if (shard.state == State::kActive && shard.holder == holder) {
    shard.position = position;
    shard.position.set_done(false);
  }
}

bool ShardLedger::Finish(uint64_t holder, const DataPosition &position) {
  const uint32_t s = position.shard();
  if (s >= shards_.size() || shards_[s].state != State::kActive || shards_[s].holder != holder) {
    return false;
  }
  Set(s, State::kDone, 0);
  shards_[s].position = position;
  shards_[s].position.set_done(true);
  return true;
}

void ShardLedger::Release(uint64_t holder, bool done, const DataPosition *position) {
  auto held = held_.find(holder);
  if (held == held_.end()) return;
  const std::set<uint32_t> shards = held->second;  // Set changes held_
  for (uint32_t s : shards) {
    Shard &shard = shards_[s];
    if (done) {
      Set(s, State::kDone, 0);
      shard.position.set_done(true);
      continue;
    }
    if (position != nullptr && position->shard() == s) {
      shard.position = *position;
    }
    if (shard.position.done()) {
      Set(s, State::kDone, 0);
      continue;
    }
    if (reassign_) {
      Set(s, State::kOrphaned, 0);
      SchedulerLog()->warn(
          "shard {} orphaned at epoch {} batch {}: it goes to the next "
          "worker that asks",
          s, shard.position.epoch(), shard.position.batch());
    } else {
      Set(s, State::kDone, 0);
      SchedulerLog()->warn(
          "shard {} dropped at epoch {} batch {} (on_worker_loss: "
          "SKIP_REST)",
          s, shard.position.epoch(), shard.position.batch());
    }
  }
}

bool ShardLedger::Restore(const google::protobuf::RepeatedPtrField<DataPosition> &positions) {
  if (static_cast<size_t>(positions.size()) != shards_.size()) return false;
  for (const DataPosition &p : positions) {
    if (p.shard() >= shards_.size()) continue;
    Shard &shard = shards_[p.shard()];
    shard.position = p;
    Set(p.shard(), p.done() ? State::kDone : State::kUnstarted, 0);
  }
  return true;
}

void ShardLedger::FillManifest(const std::vector<const DataPosition *> &reported,
                               CheckpointManifest *manifest) const {
  for (uint32_t s = 0; s < shards_.size(); ++s) {
    const bool has_report = s < reported.size() && reported[s] != nullptr;
    DataPosition *p = manifest->add_positions();
    *p = has_report ? *reported[s] : shards_[s].position;
    p->set_shard(s);
    if (shards_[s].state == State::kDone && !has_report) p->set_done(true);
  }
}

void ShardLedger::ToJournal(SchedulerJournal *journal) const {
  for (const Shard &shard : shards_) {
    JournalShard *s = journal->add_shards();
    s->set_state(static_cast<JournalShard::State>(shard.state));
    *s->mutable_position() = shard.position;
    s->set_holder(shard.holder);
  }
}

void ShardLedger::FromJournal(const SchedulerJournal &journal) {
  for (int s = 0; s < journal.shards_size() && s < static_cast<int>(shards_.size()); ++s) {
    Shard &shard = shards_[s];
    const State state = static_cast<State>(journal.shards(s).state());
    Set(static_cast<uint32_t>(s), state, journal.shards(s).holder());
    shard.position = journal.shards(s).position();
  }
}

}  // namespace ps
