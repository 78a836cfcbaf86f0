#include "worker/shard_cursor.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/protocol.h"

namespace ps {
namespace {

std::shared_ptr<spdlog::logger> Log() {
  static auto* const logger =
      new std::shared_ptr<spdlog::logger>(GetLogger("shards"));
  return *logger;
}

bool Retryable(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable ||
         s.code() == absl::StatusCode::kDeadlineExceeded;
}

}  // namespace

ShardCursor::ShardCursor(Job job, Options options)
    : job_(std::move(job)),
      options_(std::move(options)),
      position_(options_.initial) {}

bool ShardCursor::stop_requested() const {
  if (job_.stop && job_.stop()) return true;
  return job_.ended && !job_.ended().ok();
}

absl::Status ShardCursor::CheckShard(const DataPosition& p,
                                     absl::string_view source) const {
  if (p.shard() < options_.num_shards) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(source, " shard ", p.shard(), " but the job has ",
                   options_.num_shards, " (cluster.num_workers)"));
}

absl::Status ShardCursor::Start(const std::function<absl::Status()>& prepare) {
  if (started_) return absl::OkStatus();
  started_ = true;
  // Before anything is written: a worker sent to a shard that does not
  // exist must not initialise the job.
  if (options_.initial)
    PS_RETURN_IF_ERROR(CheckShard(*options_.initial, "asked to train"));
  // Under BSP a step applied while a worker is still joining would not
  // count it: the first steps of a fresh or restored job wait for everyone.
  std::string barrier;
  absl::Status s;
  if (options_.start_clock == 0) {
    if (prepare) s = prepare();
    barrier = "ps-start";
  } else if (options_.restored_start) {
    barrier = absl::StrCat("ps-restored-", options_.start_clock);
  }
  if (s.ok() && !barrier.empty() && job_.barrier) s = job_.barrier(barrier);
  if (s.ok()) return s;
  if (job_.ended) PS_RETURN_IF_ERROR(job_.ended());
  if (s.code() == absl::StatusCode::kCancelled || (job_.stop && job_.stop())) {
    Log()->info("stop requested before the first step ({})", s.message());
    stopped_ = true;
    return absl::OkStatus();
  }
  return s;
}

absl::StatusOr<std::optional<DataPosition>> ShardCursor::Next() {
  PS_RETURN_IF_ERROR(Start());
  if (training_) {
    return absl::FailedPreconditionError(
        "the shard protocol was asked for the next shard before the one it "
        "handed out "
        "ended");
  }
  if (stopped_ || all_done_) return std::nullopt;
  if (!initial_taken_) {
    initial_taken_ = true;
    if (options_.initial) {
      training_ = true;
      return options_.initial;
    }
  }
  while (true) {
    PS_ASSIGN_OR_RETURN(std::optional<ClaimShardResponse> r, Claim());
    if (!r) return std::nullopt;
    DataPosition given = r->shard();
    position_ = given;
    if (capped_) {
      Log()->warn(
          "training.max_steps reached: reporting shard {} done untrained from "
          "epoch {} batch {}",
          given.shard(), given.epoch(), given.batch());
      given.set_done(true);
      position_ = given;
      unreported_ = given;
      continue;
    }
    Log()->info("took over shard {}; the clock restarts at {}", given.shard(),
                r->start_clock());
    if (job_.restart) PS_RETURN_IF_ERROR(job_.restart(r->start_clock()));
    training_ = true;
    return given;
  }
}

void ShardCursor::Ended(const DataPosition& at) {
  training_ = false;
  position_ = at;
  if (at.done()) {
    unreported_ = at;
  } else {
    stopped_ = true;
  }
}

absl::StatusOr<std::optional<ClaimShardResponse>> ShardCursor::Claim() {
  if (!job_.claim) {  // no scheduler to ask: the shards given were all
    all_done_ = true;
    return std::nullopt;
  }
  int failures = 0;
  absl::Time last_log = absl::InfinitePast();
  while (true) {
    if (job_.ended) PS_RETURN_IF_ERROR(job_.ended());
    if (job_.stop && job_.stop()) {
      Log()->info("stop requested while waiting for work");
      stopped_ = true;
      return std::nullopt;
    }
    const absl::Time asked = options_.clock->Now();
    absl::StatusOr<ClaimShardResponse> r =
        job_.claim(unreported_ ? &*unreported_ : nullptr);
    if (!r.ok()) {
      if (job_.ended) PS_RETURN_IF_ERROR(job_.ended());
      // The session answers a claim cut short by a stop CANCELLED: the
      // check at the top of the loop says so.
      if (job_.stop && job_.stop()) continue;
      if (Retryable(r.status()) && ++failures < options_.max_failures) {
        Log()->warn("asking for work failed (attempt {} of {}): {}", failures,
                    options_.max_failures, r.status().message());
        options_.sleep(options_.retry_pause);
        continue;
      }
      return Annotate(r.status(), "asking the scheduler for work");
    }
    failures = 0;
    unreported_.reset();  // the scheduler has heard it
    switch (r->result()) {
      case ClaimShardResponse::WAIT: {
        const absl::Time now = options_.clock->Now();
        if (now - last_log >= options_.wait_log_every) {
          Log()->info("waiting for work: other workers still train shards");
          last_log = now;
        }
        if (now - asked < options_.min_ask)
          options_.sleep(options_.min_ask - (now - asked));
        continue;
      }
      case ClaimShardResponse::ALL_DONE:
        Log()->info("every shard of the job is done");
        all_done_ = true;
        return std::nullopt;
      case ClaimShardResponse::ASSIGNED:
        PS_RETURN_IF_ERROR(CheckShard(r->shard(), "the scheduler assigned"));
        if (r->start_clock() >= kFinishedClock) {
          return absl::InvalidArgumentError(
              absl::StrCat("the scheduler assigned shard ", r->shard().shard(),
                           " at clock ", r->start_clock(),
                           ", which is not below the finished clock 2^62"));
        }
        return std::optional<ClaimShardResponse>(*std::move(r));
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("the scheduler answered ClaimShard with result ",
                         static_cast<int>(r->result())));
    }
  }
}

}  // namespace ps
