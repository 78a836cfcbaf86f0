#include "worker/dense_ring_copy.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/logging.h"
#include "common/protocol.h"
#include "common/status.h"

namespace ps {
namespace {

// The ring's logger: these writes are part of its story.
const std::shared_ptr<spdlog::logger>& Log() {
  static const auto* const log =
      new std::shared_ptr<spdlog::logger>(GetLogger("dense_ring"));
  return *log;
}

}  // namespace

absl::StatusOr<DenseRingCopy> DenseRingCopy::Create(
    const JobConfig& config, absl::Span<const TableConfig* const> tables) {
  std::vector<Part> parts;
  uint64_t offset = 0;
  uint32_t state_floats = 0;
  for (const TableConfig* t : tables) {
    Part p;
    p.id = t->id();
    p.offset = offset;
    p.size = t->dense().size();
    state_floats = OptimizerStateFloats(t->optimizer());
    if (state_floats > 0) {
      PS_ASSIGN_OR_RETURN(const TableConfig* state,
                          FindTable(config, AllReduceStateTable(t->name())));
      p.state_id = state->id();
    }
    offset += p.size;
    parts.push_back(p);
  }
  return DenseRingCopy(std::move(parts), state_floats);
}

absl::Status DenseRingCopy::WriteServers(KVClient& kv,
                                         const AllReducedTable& t) const {
  const absl::Span<const float> values = t.values();
  const absl::Span<const float> state = t.state();
  std::vector<Completion> writes;
  for (const Part& p : parts_) {
    writes.push_back(kv.AssignDense(p.id, 0, values.subspan(p.offset, p.size)));
    if (p.state_id) {
      writes.push_back(kv.AssignDense(
          *p.state_id, 0,
          state.subspan(p.offset * state_floats_, p.size * state_floats_)));
    }
  }
  absl::Status status;
  for (const Completion& c : writes) status.Update(c.Wait());
  return status;
}

absl::Status DenseRingCopy::ReadServers(KVClient& kv, AllReducedTable& t,
                                        bool with_state) const {
  std::vector<float> values(t.values().size());
  std::vector<float> state = t.state();
  std::vector<Completion> reads;
  for (const Part& p : parts_) {
    reads.push_back(kv.PullDense(p.id, 0, p.size, values.data() + p.offset));
    if (with_state && p.state_id) {
      reads.push_back(kv.PullDense(*p.state_id, 0, p.size * state_floats_,
                                   state.data() + p.offset * state_floats_));
    }
  }
  absl::Status status;
  for (const Completion& c : reads) status.Update(c.Wait());
  PS_RETURN_IF_ERROR(status);
  return t.Reset(std::move(values), std::move(state), t.step());
}

absl::Status DenseRingCopy::EndStep(KVClient& kv, AllReducedTable& t,
                                    absl::Span<const float> grad,
                                    absl::FunctionRef<void()> end_step) const {
  const uint64_t cut = kv.checkpoint_clock();
  if (cut == 0 || kv.clock() + 1 != cut) {
    end_step();
    return t.Step(grad);
  }
  PS_RETURN_IF_ERROR(t.Step(grad));
  if (t.ring_rank() == 0) {
    PS_RETURN_IF_ERROR(WriteServers(kv, t));
    Log()->info(
        "wrote the dense state for the checkpoint at clock {} at step {} "
        "(digest {:016x})",
        cut, t.step(), t.Digest());
  }
  end_step();
  return absl::OkStatus();
}

absl::Status DenseRingCopy::JoinRunning(
    KVClient& kv, AllReducedTable& t, std::atomic<uint64_t>& paused_clock,
    const std::function<absl::Status(uint64_t)>& restart) {
  const uint64_t clock = kv.clock();
  if (clock >= kFinishedClock) return t.Join(0);
  paused_clock.store(clock);
  PS_RETURN_IF_ERROR(kv.AdvanceClockTo(kFinishedClock).Wait());
  const absl::Status joined = t.Join(0);
  // The clock resumes even when the join failed: the worker goes on (or
  // fails) with the clock it had, not a finished one.
  const uint64_t resume = joined.ok() ? std::max(clock, t.peer_clock()) : clock;
  const absl::Status restarted = restart(resume);
  PS_RETURN_IF_ERROR(joined);
  return restarted;
}

}  // namespace ps
