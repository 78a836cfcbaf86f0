#include "scheduler/call_rounds.h"

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr absl::Duration kLong = absl::Seconds(20);

// One round as `decide` saw it.
struct Seen {
  std::vector<int> calls;
  std::vector<bool> fresh;
  bool closing;
};

// Calls are ints; `decide` answers those in `answerable` (or all when
// closing) and keeps the rest.
class CallRoundsTest : public ::testing::Test {
 protected:
  using Rounds = CallRounds<int>;

  CallRoundsTest()
      : rounds_(
            std::make_unique<Rounds>([this](std::vector<Rounds::Queued> round,
                                            absl::Time, bool closing) {
              absl::MutexLock lock(&mu_);
              Seen seen{{}, {}, closing};
              std::vector<Rounds::Queued> still;
              for (const Rounds::Queued& q : round) {
                seen.calls.push_back(q.call);
                seen.fresh.push_back(q.fresh);
                if (closing || answerable_.count(q.call) != 0) {
                  answered_.push_back(q.call);
                } else {
                  still.push_back(q);
                }
              }
              rounds_seen_.push_back(std::move(seen));
              return still;
            })) {}

  // Waits until `n` rounds have been decided; false after kLong.
  bool AwaitRounds(size_t n) {
    absl::MutexLock lock(&mu_);
    auto done = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return rounds_seen_.size() >= n;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&done), kLong);
  }
  // Waits until the rounds have seen `n` calls in all; false after kLong.
  bool AwaitCallsSeen(size_t n) {
    absl::MutexLock lock(&mu_);
    auto done = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      size_t seen = 0;
      for (const Seen& s : rounds_seen_) seen += s.calls.size();
      return seen >= n;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&done), kLong);
  }
  // Waits until `n` calls are answered; false after kLong.
  bool AwaitAnswered(size_t n) {
    absl::MutexLock lock(&mu_);
    auto done = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return answered_.size() >= n;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&done), kLong);
  }
  std::vector<Seen> RoundsSeen() {
    absl::MutexLock lock(&mu_);
    return rounds_seen_;
  }
  std::vector<int> Answered() {
    absl::MutexLock lock(&mu_);
    return answered_;
  }
  // Waits until `n` calls wait (a round in progress counts all of its
  // calls until it ends); false after kLong.
  bool AwaitWaiting(size_t n) {
    const absl::Time give_up = absl::Now() + kLong;
    while (rounds_->waiting() != n) {
      if (absl::Now() > give_up) return false;
      absl::SleepFor(absl::Milliseconds(1));
    }
    return true;
  }
  void MakeAnswerable(int call) {
    absl::MutexLock lock(&mu_);
    answerable_.insert(call);
  }

  absl::Mutex mu_;
  std::set<int> answerable_ ABSL_GUARDED_BY(mu_);
  std::vector<Seen> rounds_seen_ ABSL_GUARDED_BY(mu_);
  std::vector<int> answered_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Rounds> rounds_;  // last: its thread uses the above
};

// A new call is decided at once, as fresh; one still waiting is not
// decided again until a wake-up, and then no longer as fresh.
TEST_F(CallRoundsTest, NewCallsAreDecidedAtOnceAndWaitingOnesOnWake) {
  ASSERT_TRUE(rounds_->Add(1, absl::Now() + kLong));
  ASSERT_TRUE(AwaitRounds(1));
  EXPECT_TRUE(AwaitWaiting(1));
  ASSERT_TRUE(rounds_->Add(2, absl::Now() + kLong));
  ASSERT_TRUE(AwaitRounds(2));
  // The second round holds only the new call.
  EXPECT_THAT(RoundsSeen()[1].calls, ElementsAre(2));
  EXPECT_THAT(RoundsSeen()[1].fresh, ElementsAre(true));
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(RoundsSeen().size(), 2u);  // nothing changed: no round

  MakeAnswerable(1);
  rounds_->Wake();
  ASSERT_TRUE(AwaitRounds(3));
  const Seen woken = RoundsSeen()[2];
  EXPECT_THAT(woken.calls, ::testing::UnorderedElementsAre(1, 2));
  EXPECT_THAT(woken.fresh, ElementsAre(false, false));
  EXPECT_FALSE(woken.closing);
  EXPECT_THAT(Answered(), ElementsAre(1));
  EXPECT_TRUE(AwaitWaiting(1));
}

// A waiting call is decided again when its deadline passes, with `now`
// past it, without any wake-up.
TEST_F(CallRoundsTest, AWaitingCallIsDecidedAgainAtItsDeadline) {
  const absl::Time added = absl::Now();
  ASSERT_TRUE(rounds_->Add(7, added + absl::Milliseconds(300)));
  ASSERT_TRUE(rounds_->Add(8, added + kLong));
  ASSERT_TRUE(AwaitCallsSeen(2));  // both decided once, as fresh
  MakeAnswerable(7);
  ASSERT_TRUE(AwaitAnswered(1));
  EXPECT_GE(absl::Now() - added, absl::Milliseconds(290));
  EXPECT_THAT(RoundsSeen().back().calls, ElementsAre(7));
  EXPECT_THAT(Answered(), ElementsAre(7));
  EXPECT_TRUE(AwaitWaiting(1));
}

// Close hands every waiting call to one last round marked closing, and
// later calls are refused for their caller to answer.
TEST_F(CallRoundsTest, CloseDecidesEveryWaitingCallAndRefusesNewOnes) {
  ASSERT_TRUE(rounds_->Add(1, absl::Now() + kLong));
  ASSERT_TRUE(rounds_->Add(2, absl::Now() + kLong));
  ASSERT_TRUE(AwaitCallsSeen(2));
  rounds_->Close();
  const Seen last = RoundsSeen().back();
  EXPECT_TRUE(last.closing);
  EXPECT_THAT(Answered(), ::testing::UnorderedElementsAre(1, 2));
  EXPECT_EQ(rounds_->waiting(), 0u);
  EXPECT_FALSE(rounds_->Add(3, absl::Now() + kLong));
  rounds_->Close();  // idempotent
  EXPECT_THAT(Answered(), ::testing::UnorderedElementsAre(1, 2));
}

// Nothing queued: Close returns at once and no round is decided.
TEST_F(CallRoundsTest, CloseWithNothingWaiting) {
  rounds_->Close();
  EXPECT_THAT(RoundsSeen(), IsEmpty());
}

// AnswerDecided answers the calls that have an answer, in order, and
// keeps the rest.
TEST(CallRoundsAnswerDecidedTest, AnswersThoseWithAnAnswerAndKeepsTheRest) {
  using Rounds = CallRounds<int>;
  const absl::Time t = absl::Now();
  const std::vector<Rounds::Queued> round = {
      {1, t, false}, {2, t, true}, {3, t, false}};
  std::vector<std::optional<std::string>> answers = {"one", std::nullopt,
                                                     "three"};
  std::vector<std::pair<int, std::string>> answered;
  const std::vector<Rounds::Queued> still =
      Rounds::AnswerDecided(round, answers, [&](int call, std::string answer) {
        answered.emplace_back(call, std::move(answer));
      });
  EXPECT_THAT(answered, ElementsAre(std::make_pair(1, std::string("one")),
                                    std::make_pair(3, std::string("three"))));
  ASSERT_EQ(still.size(), 1u);
  EXPECT_EQ(still[0].call, 2);
  EXPECT_TRUE(still[0].fresh);
}

}  // namespace
}  // namespace ps
