// The shard protocol against a scripted scheduler and a fake clock: start
// barriers, claims (WAIT paced, transient failures retried, answers
// checked), ALL_DONE, stops, and the position handed back.
#include "worker/shard_cursor.h"

#include <deque>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/protocol.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

DataPosition Position(uint32_t shard, uint64_t epoch, uint64_t batch,
                      bool done = false) {
  DataPosition p;
  p.set_shard(shard);
  p.set_epoch(epoch);
  p.set_batch(batch);
  p.set_done(done);
  return p;
}

std::string Str(const std::optional<DataPosition>& p) {
  if (!p) return "none";
  return absl::StrCat(p->shard(), "/", p->epoch(), "/", p->batch(),
                      p->done() ? " done" : "");
}

ClaimShardResponse Answer(ClaimShardResponse::Result result,
                          DataPosition shard = {}, uint64_t start_clock = 0) {
  ClaimShardResponse r;
  r.set_result(result);
  *r.mutable_shard() = shard;
  r.set_start_clock(start_clock);
  return r;
}

// A scheduler that answers claims from a script, each after `latency` of
// fake time, and records what it was told.
struct FakeJob {
  FakeClock clock;
  struct Step {
    absl::StatusOr<ClaimShardResponse> answer;
    absl::Duration latency = absl::ZeroDuration();
  };
  std::deque<Step> script;
  std::vector<std::string> claimed;  // the `finished` of each claim
  std::vector<std::string> barriers;
  std::vector<uint64_t> restarts;
  std::vector<absl::Duration> sleeps;
  absl::Status barrier_status;
  absl::Status ended;
  bool stop = false;
  int stop_after_claims = -1;  // request a stop during that claim

  void Say(absl::StatusOr<ClaimShardResponse> answer,
           absl::Duration latency = absl::ZeroDuration()) {
    script.push_back({std::move(answer), latency});
  }

  ShardCursor::Job Wire() {
    ShardCursor::Job job;
    job.barrier = [this](absl::string_view name) {
      barriers.emplace_back(name);
      return barrier_status;
    };
    job.claim = [this](const DataPosition* finished)
        -> absl::StatusOr<ClaimShardResponse> {
      claimed.push_back(finished ? Str(*finished) : "none");
      if (static_cast<int>(claimed.size()) == stop_after_claims) stop = true;
      if (script.empty()) return absl::InternalError("script exhausted");
      Step step = script.front();
      script.pop_front();
      clock.Advance(step.latency);
      return step.answer;
    };
    job.restart = [this](uint64_t c) {
      restarts.push_back(c);
      return absl::OkStatus();
    };
    job.stop = [this] { return stop; };
    job.ended = [this] { return ended; };
    return job;
  }

  ShardCursor::Options Options(std::optional<DataPosition> initial,
                               uint64_t start_clock = 3) {
    ShardCursor::Options o;
    o.num_shards = 2;
    o.start_clock = start_clock;
    o.initial = std::move(initial);
    o.clock = &clock;
    o.sleep = [this](absl::Duration d) {
      sleeps.push_back(d);
      clock.Advance(d);
    };
    return o;
  }
};

TEST(ShardCursorTest, OwnShardThenClaimedShardsThenAllDone) {
  FakeJob job;
  ShardCursor cursor(job.Wire(), job.Options(Position(1, 0, 4)));
  job.Say(Answer(ClaimShardResponse::ASSIGNED, Position(0, 1, 7), 100));
  job.Say(Answer(ClaimShardResponse::ALL_DONE));

  auto first = cursor.Next();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(Str(*first), "1/0/4");
  EXPECT_TRUE(job.claimed.empty()) << "the worker's own shard needs no claim";
  cursor.Ended(Position(1, 2, 0, true));

  auto second = cursor.Next();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(Str(*second), "0/1/7");
  EXPECT_EQ(job.restarts, std::vector<uint64_t>{100});
  EXPECT_EQ(Str(cursor.position()), "0/1/7");
  cursor.Ended(Position(0, 2, 0, true));

  auto third = cursor.Next();
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_FALSE(third->has_value());
  EXPECT_TRUE(cursor.all_done());
  EXPECT_FALSE(cursor.stopped());
  EXPECT_EQ(job.claimed,
            (std::vector<std::string>{"1/2/0 done", "0/2/0 done"}));
  EXPECT_EQ(Str(cursor.position()), "0/2/0 done");
  // Nothing more is asked once every shard is done.
  ASSERT_TRUE(cursor.Next().ok());
  EXPECT_EQ(job.claimed.size(), 2u);
  EXPECT_TRUE(job.barriers.empty()) << "joined at clock 3: no start barrier";
}

// A WAIT that came back at once is asked again only after min_ask; one that
// long-polled is asked again at once. The finished shard is reported once.
TEST(ShardCursorTest, WaitAnswersArePaced) {
  FakeJob job;
  ShardCursor cursor(job.Wire(), job.Options(std::nullopt));
  job.Say(Answer(ClaimShardResponse::WAIT));
  job.Say(Answer(ClaimShardResponse::WAIT), absl::Milliseconds(30));
  job.Say(Answer(ClaimShardResponse::WAIT), absl::Seconds(2));
  job.Say(Answer(ClaimShardResponse::ASSIGNED, Position(1, 0, 0), 9));
  auto next = cursor.Next();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(Str(*next), "1/0/0");
  EXPECT_EQ(job.sleeps, (std::vector<absl::Duration>{absl::Milliseconds(100),
                                                     absl::Milliseconds(70)}));
  EXPECT_EQ(job.claimed,
            (std::vector<std::string>{"none", "none", "none", "none"}));
  EXPECT_EQ(job.restarts, std::vector<uint64_t>{9});
}

// Whatever the scheduler answers, a shard outside the job is refused with
// an error naming it, before the clock restarts.
TEST(ShardCursorTest, RefusesAShardOutsideTheJob) {
  FakeJob job;
  ShardCursor cursor(job.Wire(), job.Options(std::nullopt));
  job.Say(Answer(ClaimShardResponse::ASSIGNED, Position(7, 0, 0), 5));
  auto next = cursor.Next();
  ASSERT_EQ(next.status().code(), absl::StatusCode::kInvalidArgument)
      << next.status();
  EXPECT_EQ(
      next.status().message(),
      "the scheduler assigned shard 7 but the job has 2 (cluster.num_workers)");
  EXPECT_TRUE(job.restarts.empty());

  FakeJob late;
  ShardCursor at_end(late.Wire(), late.Options(std::nullopt));
  late.Say(
      Answer(ClaimShardResponse::ASSIGNED, Position(1, 0, 0), kFinishedClock));
  EXPECT_EQ(at_end.Next().status().code(), absl::StatusCode::kInvalidArgument);

  FakeJob odd;
  ShardCursor nonsense(odd.Wire(), odd.Options(std::nullopt));
  odd.Say(Answer(static_cast<ClaimShardResponse::Result>(42)));
  EXPECT_EQ(nonsense.Next().status().code(),
            absl::StatusCode::kInvalidArgument);

  // Its own shard too, before anything is written in a fresh job.
  FakeJob own;
  bool prepared = false;
  ShardCursor wrong(own.Wire(),
                    own.Options(Position(2, 0, 0), /*start_clock=*/0));
  EXPECT_EQ(wrong
                .Start([&] {
                  prepared = true;
                  return absl::OkStatus();
                })
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(prepared);
}

// UNAVAILABLE is asked again (with the finished shard again) a bounded
// number of times; other errors end at once.
TEST(ShardCursorTest, RetriesTransientFailures) {
  FakeJob job;
  ShardCursor cursor(job.Wire(), job.Options(Position(0, 0, 0)));
  ASSERT_TRUE(cursor.Next().ok());
  cursor.Ended(Position(0, 1, 0, true));
  job.Say(absl::UnavailableError("scheduler restarting"));
  job.Say(absl::DeadlineExceededError("slow"));
  job.Say(Answer(ClaimShardResponse::ALL_DONE));
  auto next = cursor.Next();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_TRUE(cursor.all_done());
  EXPECT_EQ(job.claimed, (std::vector<std::string>{"0/1/0 done", "0/1/0 done",
                                                   "0/1/0 done"}));
  EXPECT_EQ(job.sleeps,
            (std::vector<absl::Duration>{absl::Seconds(1), absl::Seconds(1)}));

  FakeJob failing;
  ShardCursor::Options o = failing.Options(std::nullopt);
  o.max_failures = 3;
  ShardCursor gives_up(failing.Wire(), o);
  for (int i = 0; i < 3; ++i) failing.Say(absl::UnavailableError("away"));
  EXPECT_EQ(gives_up.Next().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(failing.claimed.size(), 3u);

  FakeJob refused;
  ShardCursor denied(refused.Wire(), refused.Options(std::nullopt));
  refused.Say(absl::PermissionDeniedError("no"));
  EXPECT_EQ(denied.Next().status().code(), absl::StatusCode::kPermissionDenied);
}

// A stop while waiting for work ends the wait; the worker stands at the
// final position of the shard it ended.
TEST(ShardCursorTest, StopWhileWaitingForWork) {
  FakeJob job;
  job.stop_after_claims = 2;
  ShardCursor cursor(job.Wire(), job.Options(Position(1, 0, 0)));
  ASSERT_TRUE(cursor.Next().ok());
  cursor.Ended(Position(1, 1, 0, true));
  job.Say(Answer(ClaimShardResponse::WAIT));
  job.Say(absl::CancelledError("claim: stop requested"));
  auto next = cursor.Next();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_FALSE(next->has_value());
  EXPECT_TRUE(cursor.stopped());
  EXPECT_FALSE(cursor.all_done());
  EXPECT_EQ(job.claimed, (std::vector<std::string>{"1/1/0 done", "none"}));
  EXPECT_EQ(Str(cursor.position()), "1/1/0 done");
}

// Stopped mid-shard: nothing more is claimed, and the position is the next
// untrained batch.
TEST(ShardCursorTest, StopMidShardKeepsTheExactPosition) {
  FakeJob job;
  ShardCursor cursor(job.Wire(), job.Options(Position(0, 0, 0)));
  ASSERT_TRUE(cursor.Next().ok());
  cursor.Ended(Position(0, 1, 2));
  auto next = cursor.Next();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_FALSE(next->has_value());
  EXPECT_TRUE(cursor.stopped());
  EXPECT_TRUE(job.claimed.empty());
  EXPECT_EQ(Str(cursor.position()), "0/1/2");
}

// A fresh job prepares (rank 0 writes initial values) and then meets at
// "ps-start"; a restored one at "ps-restored-<clock>". A stop at the
// barrier hands the initial position back.
TEST(ShardCursorTest, StartBarriers) {
  FakeJob fresh;
  std::vector<std::string> order;
  ShardCursor::Job wired = fresh.Wire();
  auto barrier = wired.barrier;
  wired.barrier = [&](absl::string_view name) {
    order.push_back("barrier");
    return barrier(name);
  };
  ShardCursor first(std::move(wired), fresh.Options(Position(0, 0, 0), 0));
  ASSERT_TRUE(first
                  .Start([&] {
                    order.push_back("prepare");
                    return absl::OkStatus();
                  })
                  .ok());
  ASSERT_TRUE(first.Next().ok());  // starts once
  EXPECT_EQ(order, (std::vector<std::string>{"prepare", "barrier"}));
  EXPECT_EQ(fresh.barriers, std::vector<std::string>{"ps-start"});

  FakeJob restored;
  ShardCursor::Options o = restored.Options(Position(1, 0, 3), 7);
  o.restored_start = true;
  restored.barrier_status = absl::CancelledError("barrier: stop requested");
  ShardCursor second(restored.Wire(), o);
  auto next = second.Next();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_FALSE(next->has_value());
  EXPECT_TRUE(second.stopped());
  EXPECT_EQ(Str(second.position()), "1/0/3");
  EXPECT_EQ(restored.barriers, std::vector<std::string>{"ps-restored-7"});

  FakeJob failed;
  failed.barrier_status = absl::DeadlineExceededError("missing ranks 1");
  ShardCursor third(failed.Wire(), failed.Options(std::nullopt, 0));
  EXPECT_EQ(third.Next().status().code(), absl::StatusCode::kDeadlineExceeded);
}

// A session the scheduler dropped: Next says so rather than claiming.
TEST(ShardCursorTest, EndedSessionIsAnError) {
  FakeJob job;
  job.ended = absl::AbortedError("dropped by the scheduler: declared dead");
  ShardCursor cursor(job.Wire(), job.Options(std::nullopt));
  EXPECT_EQ(cursor.Next().status().code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(job.claimed.empty());
  EXPECT_TRUE(cursor.stop_requested());
}

// Capped (training.max_steps): later assignments are reported done where
// given, without restarting the clock.
TEST(ShardCursorTest, CappedReportsAssignmentsDone) {
  FakeJob job;
  ShardCursor cursor(job.Wire(), job.Options(Position(1, 0, 0)));
  ASSERT_TRUE(cursor.Next().ok());
  cursor.Ended(Position(1, 0, 3, true));
  cursor.Cap();
  job.Say(Answer(ClaimShardResponse::ASSIGNED, Position(0, 0, 2), 3));
  job.Say(Answer(ClaimShardResponse::ALL_DONE));
  auto next = cursor.Next();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_FALSE(next->has_value());
  EXPECT_EQ(job.claimed,
            (std::vector<std::string>{"1/0/3 done", "0/0/2 done"}));
  EXPECT_TRUE(job.restarts.empty());
}

TEST(ShardCursorTest, NextBeforeEndedIsRefused) {
  FakeJob job;
  ShardCursor cursor(job.Wire(), job.Options(Position(1, 0, 0)));
  ASSERT_TRUE(cursor.Next().ok());
  EXPECT_EQ(cursor.Next().status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace ps
