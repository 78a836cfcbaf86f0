// The job's shard protocol for one worker, in one place: the C++ trainer
// (worker/trainer.h) and the Python binding (Session.batches, through
// python/native/ps_c.h) both train the shards a ShardCursor hands out.
//
//   Start ─ a fresh job (start clock 0): prepare() (rank 0 writes initial
//           values), then barrier "ps-start"; a job restored from a
//           checkpoint: barrier "ps-restored-<clock>"; a replacement
//           joining later: nothing
//   Next() ─ the worker's own shard first (if it has one), then claims:
//            WAIT is asked again (paced: never more often than
//            Options::min_ask), ASSIGNED restarts the clock at the
//            scheduler's start clock and is handed out, ALL_DONE ends
//   Ended(at) ─ where the shard handed out ended: done (reported with the
//               next claim) or, stopped mid-shard, the next untrained batch
//   position() ─ what to hand back with Leave(false, ...) once stopped
//
// Nothing the scheduler answers is trusted: a shard number outside the job
// or a start clock at or past kFinishedClock is refused with
// INVALID_ARGUMENT naming the value.
//
// A stop (Job::stop) ends a wait for work or the start barrier: Next()
// then returns nullopt with stopped() set and position() the place to
// resume from. An ended session (Job::ended: dropped, the scheduler gone)
// makes Next() return that status.
//
// Not thread-safe: one thread drives a cursor (the one that trains).
#ifndef PS_WORKER_SHARD_CURSOR_H_
#define PS_WORKER_SHARD_CURSOR_H_

#include <cstdint>
#include <functional>
#include <optional>

#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/status.h"
#include "proto/scheduler.pb.h"

namespace ps {

class ShardCursor {
 public:
  // How the cursor reaches the job (WorkerSession::shards() wires its own).
  // Every member is optional: without `claim` the worker ends after the
  // shards it was given; without `barrier` nobody is waited for.
  struct Job {
    // A barrier of every live worker; an error (other than a stop) fails
    // Start().
    std::function<absl::Status(absl::string_view name)> barrier;
    // Reports `finished` (null: nothing new to report) and asks for a
    // shard: one round of the scheduler's long poll (WorkerSession::Claim).
    // UNAVAILABLE and DEADLINE_EXCEEDED are asked again, with `finished`
    // again, up to Options::max_failures times in a row.
    std::function<absl::StatusOr<ClaimShardResponse>(
        const DataPosition* finished)>
        claim;
    // Resumes the clock at the scheduler's start clock of an assignment.
    std::function<absl::Status(uint64_t clock)> restart;
    // Polled before each claim and after a failed barrier or claim.
    std::function<bool()> stop;
    // Non-OK once the session can do nothing more (dropped, the scheduler
    // gone); Next() returns it.
    std::function<absl::Status()> ended;
  };

  struct Options {
    // The job's shards (cluster.num_workers): shard numbers are below it.
    uint32_t num_shards = 0;
    // The clock the worker started at (0: a fresh job).
    uint64_t start_clock = 0;
    // The worker starts a job restored from a checkpoint at start_clock.
    bool restored_start = false;
    // The worker's own shard and where in it; nullopt: none (it claims).
    std::optional<DataPosition> initial;
    // Time, for pacing WAIT answers and the failures' pauses. Not owned.
    Clock* clock = Clock::Real();
    std::function<void(absl::Duration)> sleep = [](absl::Duration d) {
      absl::SleepFor(d);
    };
    // A WAIT answered sooner than this after asking did not long-poll:
    // the cursor sleeps the rest before asking again, rather than spin.
    absl::Duration min_ask = absl::Milliseconds(100);
    // Failed claims (UNAVAILABLE, DEADLINE_EXCEEDED) in a row that are
    // asked again, `retry_pause` apart, before Next() returns the error.
    int max_failures = 30;
    absl::Duration retry_pause = absl::Seconds(1);
    // How often "waiting for work" is logged while WAIT goes on.
    absl::Duration wait_log_every = absl::Seconds(30);
  };

  ShardCursor(Job job, Options options);
  ShardCursor(const ShardCursor&) = delete;
  ShardCursor& operator=(const ShardCursor&) = delete;

  // Meets the other workers before the first step (see the top of this
  // file); `prepare` (optional) runs first in a fresh job. Later calls do
  // nothing. A stop meanwhile (or a barrier CANCELLED) is not an error:
  // stopped() is then set and position() is the initial position.
  // Errors: prepare's, the barrier's.
  absl::Status Start(const std::function<absl::Status()>& prepare = nullptr);

  // The next shard to train, from the position returned (its clock
  // restarted at the scheduler's start clock when it was claimed); nullopt
  // when there is nothing more: every shard is done (all_done()), or a
  // stop (stopped()). Calls Start() first if nobody did. Call Ended()
  // before asking again. Errors: INVALID_ARGUMENT for a shard outside the
  // job or a nonsensical answer; Job::ended's status; the claim's errors
  // past the retries; restart's.
  absl::StatusOr<std::optional<DataPosition>> Next();

  // The shard from Next() ended at `at`: done (at.done(); the scheduler
  // hears it with the next claim), or stopped before its end at the next
  // untrained batch (the cursor is then stopped).
  void Ended(const DataPosition& at);

  // The worker trains nothing more (training.max_steps reached): shards
  // assigned from now on are reported done where they were given, without
  // restarting the clock, until ALL_DONE.
  void Cap() { capped_ = true; }

  bool stopped() const { return stopped_; }
  bool all_done() const { return all_done_; }
  // A stop was requested, or the session ended (then Next() says why).
  bool stop_requested() const;
  // Where this worker stands: the shard being trained (its start), the
  // place a stop left it, or the final position of the last shard it
  // ended (done). nullopt while it never held a shard.
  const std::optional<DataPosition>& position() const { return position_; }

 private:
  // Asks for work until ASSIGNED (returned), ALL_DONE or a stop (nullopt).
  absl::StatusOr<std::optional<ClaimShardResponse>> Claim();
  // INVALID_ARGUMENT unless `p` names a shard of the job.
  absl::Status CheckShard(const DataPosition& p,
                          absl::string_view source) const;

  const Job job_;
  const Options options_;
  bool started_ = false;
  bool stopped_ = false;
  bool all_done_ = false;
  bool capped_ = false;
  // The initial shard was handed out (or the worker stopped before).
  bool initial_taken_ = false;
  // A shard was handed out and Ended() not called yet.
  bool training_ = false;
  // A done shard the scheduler has not heard of yet.
  std::optional<DataPosition> unreported_;
  std::optional<DataPosition> position_;
};

}  // namespace ps

#endif  // PS_WORKER_SHARD_CURSOR_H_
