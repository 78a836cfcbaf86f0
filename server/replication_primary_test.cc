// ReplicationPrimary on its own: fake backups (ROUTER sockets on loopback)
// take its replica messages and answer them as the test says, and the
// answers to workers it sends are recorded.
#include "server/replication_primary.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/hash.h"
#include "common/protocol.h"
#include "common/wire.h"
#include "gtest/gtest.h"
#include "proto/data_plane.pb.h"
#include "server/replication.h"
#include "server/server_view.h"
#include "server/table.h"
#include "server/table_rows.h"
#include "zmq.hpp"
#include "zmq_addon.hpp"

namespace ps {
namespace {

constexpr uint32_t kSlots = 4;

// A backup server's data socket: receives replica messages, answers them.
class FakeBackup {
 public:
  explicit FakeBackup(zmq::context_t& context)
      : socket_(context, zmq::socket_type::router) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.set(zmq::sockopt::rcvtimeo, 5000);
    socket_.bind("tcp://127.0.0.1:*");
    endpoint_ = socket_.get(zmq::sockopt::last_endpoint);
  }
  const std::string& endpoint() const { return endpoint_; }

  // The next replica message's header (fails the test after 5 s).
  RequestHeader Receive() {
    std::vector<zmq::message_t> frames;
    RequestHeader h;
    if (!zmq::recv_multipart(socket_, std::back_inserter(frames))) {
      ADD_FAILURE() << "no replica message within 5 s";
      return h;
    }
    identity_ = std::move(frames[0]);
    EXPECT_TRUE(
        h.ParseFromArray(frames[1].data(), static_cast<int>(frames[1].size())));
    return h;
  }
  // The next replica message within `wait` (header, then its key and
  // value frames in *frames); false if none came.
  bool TryReceive(absl::Duration wait, RequestHeader* h,
                  std::vector<zmq::message_t>* frames) {
    zmq::pollitem_t item = {socket_.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1,
              std::chrono::milliseconds(absl::ToInt64Milliseconds(wait)));
    if ((item.revents & ZMQ_POLLIN) == 0) return false;
    frames->clear();
    if (!zmq::recv_multipart(socket_, std::back_inserter(*frames)))
      return false;
    identity_ = std::move((*frames)[0]);
    EXPECT_TRUE(h->ParseFromArray((*frames)[1].data(),
                                  static_cast<int>((*frames)[1].size())));
    frames->erase(frames->begin(), frames->begin() + 2);
    return true;
  }
  // Answers replica message `id`: OK, or `code` with `message`.
  void Answer(uint64_t id, int code = 0, const std::string& message = "") {
    ResponseHeader rh;
    rh.set_request_id(id);
    rh.set_code(code);
    rh.set_message(message);
    zmq::message_t identity;
    identity.copy(identity_);
    socket_.send(identity, zmq::send_flags::sndmore);
    socket_.send(SerializeToFrame(rh), zmq::send_flags::none);
  }

 private:
  zmq::socket_t socket_;
  std::string endpoint_;
  zmq::message_t identity_;
};

class ReplicationPrimaryTest : public ::testing::Test {
 protected:
  // Server node ids by rank: this server (rank 0) and backups 1 and 2.
  static constexpr uint64_t kNode[] = {100, 101, 102};

  // The table of a 3-server, 4-slot job: sparse "t", dim 1, SGD at rate 1.
  static absl::StatusOr<std::unique_ptr<Table>> SgdTable() {
    auto config =
        ParseJobConfig(R"pb(
                         cluster { num_servers: 3 num_workers: 1 num_slots: 4 }
                         tables {
                           id: 0
                           name: "t"
                           sparse { dim: 1 }
                           optimizer { sgd { learning_rate: 1 } }
                         }
                       )pb",
                       "test");
    if (!config.ok()) return config.status();
    return Table::Create(config->tables(0));
  }

  ReplicationPrimaryTest() {
    ReplicationPrimary::Deps deps;
    deps.context = &context_;
    deps.clock = &clock_;
    deps.tables = &tables_;
    deps.seqs = &seqs_;
    deps.buffers = &buffers_;
    deps.forwards = &forwards_;
    deps.unreplicated_pushes = &unreplicated_;
    deps.catchups_sent = &catchups_;
    deps.rows_copied = &rows_copied_;
    deps.send = [this](zmq::message_t&, const ResponseHeader& rh,
                       zmq::message_t&,
                       zmq::message_t&) { sent_.push_back(rh); };
    deps.first_promoted_served = [] {};
    deps.on_move = [this](const ReportMoveRequest& r) {
      reports_.push_back(r);
    };
    primary_ = std::make_unique<ReplicationPrimary>(std::move(deps));
  }

  // Rank 0 owns every slot; slot s is backed by backup[s].
  ServerView View(uint64_t epoch, std::vector<uint32_t> backup) {
    ServerView v;
    v.has_view = true;
    v.replicated = true;
    v.rank = 0;
    v.epoch = epoch;
    v.node_id = kNode[0];
    v.slot_owner.assign(kSlots, 0);
    v.slot_backup = std::move(backup);
    v.server_node.assign(std::begin(kNode), std::end(kNode));
    v.server_endpoint = {"tcp://127.0.0.1:1", backup1_.endpoint(),
                         backup2_.endpoint()};
    return v;
  }

  // Reads the backups' answers until `done` holds (fails the test after
  // 5 s).
  void ReadUntil(const std::function<bool()>& done) {
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (!done()) {
      ASSERT_LT(absl::Now(), deadline) << "the backups' answers did not come";
      std::vector<zmq::pollitem_t> items;
      std::vector<uint64_t> nodes;
      primary_->AddPollItems(&items, &nodes);
      zmq::poll(items.data(), items.size(), std::chrono::milliseconds(50));
      for (size_t i = 0; i < nodes.size(); ++i) {
        if (items[i].revents & ZMQ_POLLIN) primary_->ReadAnswers(nodes[i]);
      }
    }
  }
  // Until everything sent to the backup of `slot` is answered (a duplicate
  // of the slot then waits for nothing).
  void ReadUntilAcked(const ServerView& own, uint32_t slot) {
    ReadUntil([&] {
      std::vector<ReplicationPrimary::Need> needs;
      return primary_->NeedsForDuplicate(own, {slot}, &needs).ok() &&
             needs.empty();
    });
  }

  // Answers to a worker's request `request_id` through Answer.
  void AnswerRequest(const ServerView& own, uint64_t request_id,
                     std::vector<ReplicationPrimary::Need> needs) {
    ResponseHeader rh;
    rh.set_request_id(request_id);
    zmq::message_t identity, values, keys;
    primary_->Answer(&own, identity, rh, values, keys, std::move(needs), false);
  }

  zmq::context_t context_{1};
  FakeClock clock_;
  ReplicationPrimary::Tables tables_;
  ReplicationPrimary::SeqRecords seqs_;
  ReplicationPrimary::StepBuffers buffers_;
  std::atomic<uint64_t> forwards_{0}, unreplicated_{0}, catchups_{0},
      rows_copied_{0};
  std::vector<ResponseHeader> sent_;
  std::vector<ReportMoveRequest> reports_;
  FakeBackup backup1_{context_};
  FakeBackup backup2_{context_};
  // Declared last: its sockets close before the context.
  std::unique_ptr<ReplicationPrimary> primary_;
};

// A new backup is sent a catch-up of the slots it backs (begin, end: the
// tables are empty), and an answer that depends on two backups goes out
// only once both have acknowledged.
TEST_F(ReplicationPrimaryTest, AnswerWaitsUntilEveryBackupAcknowledges) {
  const ServerView own = View(1, {1, 1, 2, 2});
  primary_->SyncBackups(own);
  EXPECT_EQ(primary_->links(), 2u);
  EXPECT_EQ(catchups_.load(), 2u);
  for (FakeBackup* b : {&backup1_, &backup2_}) {
    const RequestHeader begin = b->Receive();
    EXPECT_TRUE(begin.replica());
    EXPECT_EQ(begin.replica_info().kind(), REPLICA_SNAPSHOT_BEGIN);
    EXPECT_EQ(begin.replica_info().primary_node_id(), kNode[0]);
    EXPECT_EQ(begin.replica_info().slots_size(), 2);
    EXPECT_EQ(b->Receive().replica_info().kind(), REPLICA_SNAPSHOT_END);
  }
  std::vector<ReplicationPrimary::Need> needs;
  ASSERT_TRUE(primary_->NeedsForDuplicate(own, {0, 2}, &needs).ok());
  ASSERT_EQ(needs.size(), 2u);
  AnswerRequest(own, 7, needs);
  EXPECT_TRUE(sent_.empty());
  EXPECT_EQ(primary_->waiting(), 1u);

  backup1_.Answer(1);
  backup1_.Answer(2);
  ReadUntilAcked(own, 0);
  EXPECT_TRUE(sent_.empty()) << "answered before backup 2 acknowledged";

  backup2_.Answer(1);
  backup2_.Answer(2);
  ReadUntilAcked(own, 2);
  ASSERT_EQ(sent_.size(), 1u);
  EXPECT_EQ(sent_[0].request_id(), 7u);
  EXPECT_EQ(sent_[0].code(), 0);
  EXPECT_EQ(primary_->waiting(), 0u);
}

// A backup that refuses a message: the answer that waited for it tells the
// worker to send again, duplicates are refused until the backup is copied
// again, and the next resync sends it a new catch-up of its slots.
TEST_F(ReplicationPrimaryTest, RefusedCopyIsNotAcknowledgedAndCopiedAgain) {
  const ServerView own = View(1, {1, 1, 1, 1});
  primary_->SyncBackups(own);
  backup1_.Receive();
  backup1_.Receive();
  std::vector<ReplicationPrimary::Need> needs;
  ASSERT_TRUE(primary_->NeedsForDuplicate(own, {3}, &needs).ok());
  AnswerRequest(own, 9, needs);

  backup1_.Answer(1);
  backup1_.Answer(2, 8, "no room");
  ReadUntil([&] { return !sent_.empty(); });
  ASSERT_EQ(sent_.size(), 1u);
  EXPECT_EQ(sent_[0].request_id(), 9u);
  EXPECT_EQ(sent_[0].code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_NE(sent_[0].message().find("no room"), std::string::npos)
      << sent_[0].message();
  needs.clear();
  EXPECT_EQ(primary_->NeedsForDuplicate(own, {3}, &needs).code(),
            absl::StatusCode::kUnavailable);

  primary_->MaybeResync(own);
  EXPECT_EQ(catchups_.load(), 2u);
  const RequestHeader begin = backup1_.Receive();
  EXPECT_EQ(begin.replica_info().kind(), REPLICA_SNAPSHOT_BEGIN);
  EXPECT_EQ(begin.replica_info().slots_size(), static_cast<int>(kSlots));
  EXPECT_EQ(backup1_.Receive().replica_info().kind(), REPLICA_SNAPSHOT_END);
  // Refused again at once: copied again only 200 ms after the last copy.
  backup1_.Answer(3, 8, "no room");
  ReadUntil([&] {
    std::vector<ReplicationPrimary::Need> n;
    return !primary_->NeedsForDuplicate(own, {3}, &n).ok();
  });
  primary_->MaybeResync(own);
  EXPECT_EQ(catchups_.load(), 2u);
  clock_.Advance(absl::Milliseconds(200));
  primary_->MaybeResync(own);
  EXPECT_EQ(catchups_.load(), 3u);
}

// A view that moves slots to another backup drops the old link; an answer
// that waited for it waits for the new backup's catch-up instead.
TEST_F(ReplicationPrimaryTest, WaitMovesToTheNewBackupsCatchUp) {
  const ServerView first = View(1, {1, 1, 1, 1});
  primary_->SyncBackups(first);
  std::vector<ReplicationPrimary::Need> needs;
  ASSERT_TRUE(primary_->NeedsForDuplicate(first, {0}, &needs).ok());
  AnswerRequest(first, 11, needs);

  const ServerView second = View(2, {2, 2, 2, 2});
  primary_->SyncBackups(second);
  EXPECT_EQ(primary_->links(), 1u);
  EXPECT_TRUE(sent_.empty());
  EXPECT_EQ(primary_->waiting(), 1u);
  EXPECT_EQ(backup2_.Receive().replica_info().kind(), REPLICA_SNAPSHOT_BEGIN);
  EXPECT_EQ(backup2_.Receive().replica_info().kind(), REPLICA_SNAPSHOT_END);
  backup2_.Answer(1);
  backup2_.Answer(2);
  ReadUntilAcked(second, 0);
  ASSERT_EQ(sent_.size(), 1u);
  EXPECT_EQ(sent_[0].request_id(), 11u);
  EXPECT_EQ(sent_[0].code(), 0);
}

// A slot move's target (a learner) gets a catch-up and every later update
// of its slots, but answers wait for it only once it falls too far behind;
// the catch-up's acknowledgement is reported as COPIED, and the fence goes
// after every update sent before it.
TEST_F(ReplicationPrimaryTest, LearnerJoinsTheAckPathOnlyWhenFarBehind) {
  auto table = SgdTable();
  ASSERT_TRUE(table.ok()) << table.status();
  ServerView own = View(1, {1, 1, 1, 1});
  ServerView::Move move;
  move.source = 0;
  move.target = 2;
  move.slots = {2, 3};
  move.copy_epoch = 1;
  own.moves = {move};
  own.slot_learner = {kNoBackup, kNoBackup, 2, 2};
  own.slot_fenced.assign(kSlots, false);
  primary_->SyncBackups(own);
  // The learner's copy goes in chunks between requests; nothing to copy.
  EXPECT_FALSE(primary_->ContinueCopies(own, 1000));
  EXPECT_EQ(backup1_.Receive().replica_info().kind(), REPLICA_SNAPSHOT_BEGIN);
  EXPECT_EQ(backup1_.Receive().replica_info().kind(), REPLICA_SNAPSHOT_END);
  const RequestHeader begin = backup2_.Receive();
  EXPECT_EQ(begin.replica_info().kind(), REPLICA_SNAPSHOT_BEGIN);
  EXPECT_EQ(begin.replica_info().slots_size(), 2);
  EXPECT_EQ(backup2_.Receive().replica_info().kind(), REPLICA_SNAPSHOT_END);
  EXPECT_TRUE(reports_.empty());
  backup2_.Answer(1);
  backup2_.Answer(2);
  ReadUntil([&] { return !reports_.empty(); });
  EXPECT_EQ(reports_[0].stage(), ReportMoveRequest::COPIED);
  EXPECT_EQ(reports_[0].source(), 0u);
  EXPECT_EQ(reports_[0].target(), 2u);
  EXPECT_EQ(reports_[0].epoch(), 1u);

  // Pushes to slot 2 go to its backup and its learner; only the backup's
  // answer is waited for, until the learner has too much unanswered.
  const uint64_t limit = ReplicationPrimary::kLearnerMaxMessages;
  for (uint64_t i = 1; i <= limit + 1; ++i) {
    RequestHeader h;
    h.set_op(PUSH);
    h.set_table_id(0);
    h.set_num_keys(1);
    std::vector<zmq::message_t> frames;
    frames.emplace_back();
    frames.push_back(FrameFromVector(std::vector<uint64_t>{7}));
    frames.push_back(FrameFromVector(std::vector<float>{1}));
    std::vector<ReplicationPrimary::Need> needs;
    const std::vector<float> value = {1};
    const std::vector<uint64_t> key = {7};
    primary_->Forward(own, h, REPLICA_APPLY, 1, **table, key, value, frames,
                      {2}, &needs);
    bool waits_for_learner = false;
    for (const auto& need : needs) waits_for_learner |= need.first == kNode[2];
    EXPECT_EQ(waits_for_learner, i > limit) << "push " << i;
  }
  EXPECT_EQ(unreplicated_.load(), 0u);

  own.epoch = 2;
  own.moves[0].fencing = true;
  own.moves[0].fence_epoch = 2;
  own.slot_fenced = {false, false, true, true};
  primary_->SyncBackups(own);
  for (uint64_t i = 1; i <= limit + 1; ++i)
    ASSERT_EQ(backup2_.Receive().replica_info().kind(), REPLICA_APPLY);
  const RequestHeader fence = backup2_.Receive();
  ASSERT_EQ(fence.replica_info().kind(), REPLICA_FENCE);
  EXPECT_EQ(fence.replica_info().slots_size(), 2);
  EXPECT_EQ(fence.replica_info().rows(), 0u);
  backup2_.Answer(fence.request_id());
  ReadUntil([&] { return reports_.size() == 2; });
  EXPECT_EQ(reports_[1].stage(), ReportMoveRequest::FENCED);
  EXPECT_EQ(reports_[1].epoch(), 2u);
}

// A move's target that refuses part of its copy: the move is abandoned
// (ABORTED at the copy epoch), never reported copied.
TEST_F(ReplicationPrimaryTest, RefusedCopyAbortsTheMove) {
  ServerView own = View(1, {1, 1, 1, 1});
  ServerView::Move move;
  move.source = 0;
  move.target = 2;
  move.slots = {1};
  move.copy_epoch = 1;
  own.moves = {move};
  own.slot_learner = {kNoBackup, 2, kNoBackup, kNoBackup};
  own.slot_fenced.assign(kSlots, false);
  primary_->SyncBackups(own);
  EXPECT_FALSE(primary_->ContinueCopies(own, 1000));
  EXPECT_EQ(backup2_.Receive().replica_info().kind(), REPLICA_SNAPSHOT_BEGIN);
  EXPECT_EQ(backup2_.Receive().replica_info().kind(), REPLICA_SNAPSHOT_END);
  backup2_.Answer(1);
  backup2_.Answer(2, 8, "no room for the copy");
  ReadUntil([&] { return !reports_.empty(); });
  ASSERT_EQ(reports_.size(), 1u);
  EXPECT_EQ(reports_[0].stage(), ReportMoveRequest::ABORTED);
  EXPECT_EQ(reports_[0].epoch(), 1u);
  EXPECT_NE(reports_[0].error().find("no room"), std::string::npos);
  // Not copied again for an abandoned move.
  clock_.Advance(absl::Milliseconds(200));
  const uint64_t catchups = catchups_.load();
  primary_->MaybeResync(own);
  EXPECT_EQ(catchups_.load(), catchups);
}

// A move's copy goes in chunks between requests: pushes to rows not
// copied yet, and to rows created after the copy started, are forwarded in
// between. A learner that applies the messages in order (imports overwrite
// rows, pushes apply) ends with exactly the source's rows of the slots.
TEST_F(ReplicationPrimaryTest,
       ChunkedCopyWithPushesBetweenEndsEqualToTheSource) {
  auto config =
      ParseJobConfig(R"pb(
                       cluster { num_servers: 3 num_workers: 1 num_slots: 4 }
                       tables {
                         id: 0
                         name: "t"
                         sparse { dim: 2 }
                         optimizer { sgd { learning_rate: 0.5 } }
                         init { kind: UNIFORM scale: 0.1 }
                       }
                     )pb",
                     "test");
  ASSERT_TRUE(config.ok()) << config.status();
  auto source = Table::Create(config->tables(0));
  auto target = Table::Create(config->tables(0));
  ASSERT_TRUE(source.ok() && target.ok());
  SparseTable& src = *(*source)->AsSparse();
  SparseTable& dst = *(*target)->AsSparse();
  std::mt19937_64 rng(11);
  auto push = [&](const ServerView& own, std::vector<uint64_t> keys) {
    std::vector<float> grads(keys.size() * 2);
    for (float& g : grads) g = static_cast<float>(rng() % 100) / 50 - 1;
    src.Push(keys, grads.data());
    std::vector<uint32_t> slots;
    for (uint64_t k : keys) slots.push_back(SparseSlot(0, k, kSlots));
    RequestHeader h;
    h.set_op(PUSH);
    h.set_table_id(0);
    h.set_num_keys(keys.size());
    std::vector<zmq::message_t> frames;
    frames.emplace_back();
    frames.push_back(FrameFromVector(std::vector<uint64_t>(keys)));
    frames.push_back(FrameFromVector(std::vector<float>(grads)));
    std::vector<ReplicationPrimary::Need> needs;
    primary_->Forward(own, h, REPLICA_APPLY, 1, src, keys, grads, frames, slots,
                      &needs);
  };
  std::vector<uint64_t> prefill(200);
  for (uint64_t k = 0; k < prefill.size(); ++k) prefill[k] = k;
  ServerView own = View(1, {1, 1, 1, 1});
  push(own, prefill);
  tables_[0] = std::move(source).value();

  ServerView::Move move;
  move.source = 0;
  move.target = 2;
  move.slots = {2, 3};
  move.copy_epoch = 1;
  own.moves = {move};
  own.slot_learner = {kNoBackup, kNoBackup, 2, 2};
  own.slot_fenced.assign(kSlots, false);
  primary_->SyncBackups(own);
  int chunks = 0;
  while (primary_->ContinueCopies(own, 5)) {
    ++chunks;
    // Keys copied, not copied yet, and new ones (created after the copy
    // started), in every slot.
    push(own, {rng() % 200, rng() % 200, 200 + rng() % 100});
  }
  push(own, {rng() % 300, rng() % 300});
  EXPECT_GT(chunks, 10);

  bool ended = false;
  int rows_messages = 0;
  RequestHeader h;
  std::vector<zmq::message_t> frames;
  while (backup2_.TryReceive(absl::Milliseconds(300), &h, &frames)) {
    const ReplicaKind kind = h.replica_info().kind();
    EXPECT_FALSE(ended && kind == REPLICA_ROWS) << "a row after the copy's end";
    if (kind == REPLICA_SNAPSHOT_END) ended = true;
    if (kind != REPLICA_ROWS && kind != REPLICA_APPLY) continue;
    ASSERT_EQ(frames.size(), 2u);
    // Copied out: a frame's data need not be aligned for its type.
    std::vector<uint64_t> keys(frames[0].size() / sizeof(uint64_t));
    std::vector<float> values(frames[1].size() / sizeof(float));
    std::memcpy(keys.data(), frames[0].data(), keys.size() * sizeof(uint64_t));
    std::memcpy(values.data(), frames[1].data(), values.size() * sizeof(float));
    const size_t n = keys.size();
    if (kind == REPLICA_APPLY) {
      dst.Push(keys, values.data(), h.replica_info().lr_scale());
      continue;
    }
    ++rows_messages;
    const size_t stride = dst.state_floats();
    ASSERT_EQ(frames[1].size(), n * stride * sizeof(float));
    for (size_t i = 0; i < n; ++i) {
      ASSERT_TRUE(
          dst.ImportRow(keys[i],
                        absl::MakeConstSpan(values.data() + i * stride, stride))
              .ok());
    }
  }
  EXPECT_TRUE(ended);
  EXPECT_GT(rows_messages, 10);

  std::map<uint64_t, std::vector<float>> want, got;
  const std::vector<bool> mask = {false, false, true, true};
  auto collect = [&](const Table& t,
                     std::map<uint64_t, std::vector<float>>* rows) {
    ASSERT_TRUE(ForEachTableRow(t, 64,
                                [&](uint64_t key, absl::Span<const float> v,
                                    absl::Span<const float>) {
                                  if (mask[SparseSlot(0, key, kSlots)])
                                    (*rows)[key].assign(v.begin(), v.end());
                                })
                    .ok());
  };
  collect(*tables_[0], &want);
  collect(*(*target), &got);
  EXPECT_GT(want.size(), 100u);
  EXPECT_EQ(got, want);
}

// A fence view that comes while the move's copy is still going (the
// scheduler waits for COPIED, but nothing here relies on it) finishes the
// copy first: the fence never goes ahead of rows.
TEST_F(ReplicationPrimaryTest, FenceFinishesACopyInProgressFirst) {
  auto table = SgdTable();
  ASSERT_TRUE(table.ok()) << table.status();
  std::vector<uint64_t> keys(100);
  for (uint64_t k = 0; k < keys.size(); ++k) keys[k] = k;
  std::vector<float> grads(keys.size(), 1.0f);
  (*table)->AsSparse()->Push(keys, grads.data());
  tables_[0] = std::move(table).value();
  ServerView own = View(1, {1, 1, 1, 1});
  ServerView::Move move;
  move.source = 0;
  move.target = 2;
  move.slots = {0, 1, 2, 3};
  move.copy_epoch = 1;
  own.moves = {move};
  own.slot_learner = {2, 2, 2, 2};
  own.slot_fenced.assign(kSlots, false);
  primary_->SyncBackups(own);
  EXPECT_TRUE(primary_->ContinueCopies(own, 10));  // 10 of 100 rows
  ServerView fenced = own;
  fenced.epoch = 2;
  fenced.moves[0].fencing = true;
  fenced.moves[0].fence_epoch = 2;
  fenced.slot_fenced.assign(kSlots, true);
  primary_->SyncBackups(fenced);
  EXPECT_FALSE(primary_->copying());
  std::vector<ReplicaKind> kinds;
  uint64_t rows = 0;
  RequestHeader h;
  std::vector<zmq::message_t> frames;
  while (backup2_.TryReceive(absl::Milliseconds(300), &h, &frames)) {
    kinds.push_back(h.replica_info().kind());
    if (kinds.back() == REPLICA_ROWS) rows += h.num_keys();
    if (kinds.back() == REPLICA_FENCE) {
      EXPECT_EQ(h.replica_info().rows(), 100u);
    }
  }
  EXPECT_EQ(rows, 100u);
  ASSERT_GE(kinds.size(), 3u);
  EXPECT_EQ(kinds.front(), REPLICA_SNAPSHOT_BEGIN);
  EXPECT_EQ(kinds[kinds.size() - 2], REPLICA_SNAPSHOT_END);
  EXPECT_EQ(kinds.back(), REPLICA_FENCE);
}

}  // namespace
}  // namespace ps
