// Live slot moves between servers (cluster.elastic; proto/scheduler.proto
// SlotMove) with real KVServers on loopback, hand-made views and raw
// clients: the copy to the target, the fence (pushes refused, digests
// compared), the flip at both ends, and abandoned moves. Gradients are
// integers and the tables SGD with learning rate 1 from zero, so every
// value must equal minus the sum of its acknowledged gradients exactly.
#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/config.h"
#include "common/hash.h"
#include "common/protocol.h"
#include "common/wire.h"
#include "gtest/gtest.h"
#include "proto/data_plane.pb.h"
#include "proto/scheduler.pb.h"
#include "server/server.h"
#include "server/testing/raw_client.h"

namespace ps {
namespace {

using raw_client::Frames;
using raw_client::Header;
using raw_client::HeaderFrame;
using raw_client::KeysFrame;
using raw_client::RawClient;
using raw_client::ValuesFrame;

constexpr uint32_t kSlots = 16;
constexpr uint32_t kSparse = 0;  // dim 2
constexpr uint32_t kDense = 1;   // 32 elements in blocks of 4
constexpr uint32_t kDim = 2;
constexpr uint32_t kBlocks = 8;
constexpr uint32_t kBlock = 4;
constexpr uint64_t kWorker[] = {1, 2};  // node ids of worker ranks 0, 1

std::string Config(uint32_t servers, uint32_t replication) {
  return absl::StrCat(
      "cluster { num_servers: ", servers,
      " num_workers: 2 num_slots: 16 replication: ", replication, R"pb(
    elastic { max_servers: 4 } }
            tables { id: 0 name: "emb" sparse { dim: 2 }
             optimizer { sgd { learning_rate: 1 } } init { kind: ZEROS } }
    tables { id: 1 name: "dense" dense { size: 32 block_size: 4 }
             optimizer { sgd { learning_rate: 1 } } init { kind: ZEROS } }
  )pb");
}

// Where the slots are, as a view says it.
struct Layout {
  std::vector<uint32_t> owner;
  std::vector<uint32_t> backup;  // empty: replication 1
  std::vector<SlotMove> moves;
  std::set<uint32_t> live;  // server ranks
  ConsistencyMode mode = ASYNC;
};

// A row of the ledger: a sparse key or a dense element.
struct Cell {
  uint32_t table;
  uint64_t id;
  bool operator<(const Cell& o) const {
    return table != o.table ? table < o.table : id < o.id;
  }
};

class MoveTest : public ::testing::Test {
 protected:
  void Start(uint32_t servers, uint32_t replication,
             size_t drop_positions_per_turn = 16384) {
    auto config = ParseJobConfig(Config(servers, replication), "move_test");
    ASSERT_TRUE(config.ok()) << config.status();
    for (uint32_t r = 0; r < servers; ++r) {
      KVServer::Options o;
      o.config = *config;
      o.drop_positions_per_turn = drop_positions_per_turn;
      o.on_move = [this, r](const ReportMoveRequest& m) {
        absl::MutexLock lock(&mu_);
        reports_[r].push_back(m);
      };
      auto server = KVServer::Start(std::move(o));
      ASSERT_TRUE(server.ok()) << server.status();
      servers_.push_back(std::move(server).value());
      clients_.push_back(
          std::make_unique<RawClient>(servers_.back()->endpoint()));
    }
  }

  void TearDown() override {
    clients_.clear();
    servers_.clear();
  }

  ClusterView View(const Layout& l) {
    ClusterView v;
    v.set_epoch(++epoch_);
    v.set_job_state(RUNNING);
    v.set_num_slots(kSlots);
    for (uint32_t o : l.owner) v.add_slot_owner(o);
    for (uint32_t b : l.backup) v.add_slot_backup(b);
    for (const SlotMove& m : l.moves) *v.add_moves() = m;
    for (uint32_t r : l.live) {
      NodeInfo* n = v.add_nodes();
      n->set_node_id(100 + r);
      n->set_role(SERVER);
      n->set_rank(r);
      n->set_state(ALIVE);
      n->set_data_endpoint(servers_[r]->endpoint());
    }
    for (uint32_t w = 0; w < 2; ++w) {
      NodeInfo* n = v.add_nodes();
      n->set_node_id(kWorker[w]);
      n->set_role(WORKER);
      n->set_rank(w);
      n->set_state(ALIVE);
    }
    v.mutable_consistency()->set_mode(l.mode);
    return v;
  }

  // Gives every live server the layout's view and waits until each
  // answers under it.
  void Install(const Layout& l) {
    layout_ = l;
    const ClusterView v = View(l);
    for (uint32_t r : l.live) servers_[r]->UpdateView(v, r);
    for (uint32_t r : l.live) {
      const absl::Time deadline = absl::Now() + absl::Seconds(10);
      while (StatsOf(r).epoch() != v.epoch() && absl::Now() < deadline) {
        absl::SleepFor(absl::Milliseconds(1));
      }
      ASSERT_EQ(StatsOf(r).epoch(), v.epoch()) << "server " << r;
    }
  }

  ResponseHeader StatsOf(uint32_t rank) {
    RequestHeader h = Header(STATS, 0, 0);
    h.set_request_id(++request_id_);
    std::vector<zmq::message_t> reply =
        clients_[rank]->RoundTrip(Frames(HeaderFrame(h), KeysFrame({})));
    ResponseHeader rh;
    if (!reply.empty()) rh.ParseFromArray(reply[0].data(), reply[0].size());
    return rh;
  }

  // Rows and blocks server `rank` holds of `table` (own and copies).
  uint64_t RowsHeld(uint32_t rank, uint32_t table) {
    const ResponseHeader rh = StatsOf(rank);
    for (const TableStats& t : rh.table_stats()) {
      if (t.table_id() == table) return t.rows() + t.backup_rows();
    }
    ADD_FAILURE() << "no stats of table " << table;
    return 0;
  }

  // Sends a push of worker `w` to server `rank` and returns its answer.
  ResponseHeader PushTo(uint32_t rank, uint32_t table,
                        const std::vector<uint64_t>& keys,
                        const std::vector<float>& grads, uint32_t w = 0,
                        uint64_t clock = 0) {
    RequestHeader h = table == kSparse ? Header(PUSH, kSparse, keys.size())
                                       : Header(PUSH, kDense, 0,
                                                {{keys[0] * kBlock, kBlock}});
    h.set_request_id(++request_id_);
    h.set_sender_node_id(kWorker[w]);
    h.set_seq(++seq_[w]);
    h.set_clock(clock);
    std::vector<zmq::message_t> reply = clients_[rank]->RoundTrip(
        Frames(HeaderFrame(h),
               KeysFrame(table == kSparse ? keys : std::vector<uint64_t>{}),
               ValuesFrame(grads)));
    ResponseHeader rh;
    if (!reply.empty()) rh.ParseFromArray(reply[0].data(), reply[0].size());
    return rh;
  }

  uint32_t SlotOf(uint32_t table, uint64_t id) const {
    return table == kSparse ? SparseSlot(kSparse, id, kSlots)
                            : DenseBlockSlot(kDense, id, kSlots);
  }

  // Pushes `g` (and g + 1 ... for the other elements) to sparse key or
  // dense block `id` at its owner, which must acknowledge it; notes it in
  // the ledger.
  void PushAcked(uint32_t table, uint64_t id, float g) {
    const uint32_t n = table == kSparse ? kDim : kBlock;
    std::vector<float> grads;
    for (uint32_t i = 0; i < n; ++i) grads.push_back(g + i);
    const uint32_t owner = layout_.owner[SlotOf(table, id)];
    const ResponseHeader rh = PushTo(owner, table, {id}, grads);
    ASSERT_EQ(rh.code(), 0)
        << "push to server " << owner << ": " << rh.message();
    for (uint32_t i = 0; i < n; ++i) {
      ledger_[{table, table == kSparse ? id * kDim + i : id * kBlock + i}] +=
          grads[i];
    }
  }

  // One push to every key and block.
  void PushAll(float g) {
    for (uint64_t k = 0; k < kKeys; ++k) PushAcked(kSparse, k, g + k);
    for (uint64_t b = 0; b < kBlocks; ++b) PushAcked(kDense, b, g + b);
  }

  // Every key and block, read from its owner, equals minus the sum of its
  // acknowledged gradients.
  void ExpectLedger() {
    for (uint64_t k = 0; k < kKeys; ++k) {
      const std::vector<float> v =
          PullFrom(layout_.owner[SlotOf(kSparse, k)], kSparse, k);
      ASSERT_EQ(v.size(), kDim);
      for (uint32_t i = 0; i < kDim; ++i) {
        const float want = -ledger_[Cell{kSparse, k * kDim + i}];
        EXPECT_EQ(v[i], want) << "key " << k;
      }
    }
    for (uint64_t b = 0; b < kBlocks; ++b) {
      const std::vector<float> v =
          PullFrom(layout_.owner[SlotOf(kDense, b)], kDense, b);
      ASSERT_EQ(v.size(), kBlock);
      for (uint32_t i = 0; i < kBlock; ++i) {
        const float want = -ledger_[Cell{kDense, b * kBlock + i}];
        EXPECT_EQ(v[i], want) << "block " << b;
      }
    }
  }

  std::vector<float> PullFrom(uint32_t rank, uint32_t table, uint64_t id,
                              uint64_t clock = 0) {
    RequestHeader h = table == kSparse
                          ? Header(PULL, kSparse, 1)
                          : Header(PULL, kDense, 0, {{id * kBlock, kBlock}});
    h.set_request_id(++request_id_);
    h.set_sender_node_id(kWorker[0]);
    h.set_clock(clock);
    std::vector<zmq::message_t> reply = clients_[rank]->RoundTrip(Frames(
        HeaderFrame(h), KeysFrame(table == kSparse ? std::vector<uint64_t>{id}
                                                   : std::vector<uint64_t>{})));
    std::vector<float> values;
    ResponseHeader rh;
    if (reply.empty()) return values;
    rh.ParseFromArray(reply[0].data(), reply[0].size());
    EXPECT_EQ(rh.code(), 0) << rh.message();
    if (reply.size() == 2) {
      values.resize(reply[1].size() / sizeof(float));
      std::memcpy(values.data(), reply[1].data(), reply[1].size());
    }
    return values;
  }

  // Waits for server `rank`'s next move report.
  std::optional<ReportMoveRequest> NextReport(uint32_t rank) {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !reports_[rank].empty();
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(20)))
      return std::nullopt;
    ReportMoveRequest r = reports_[rank].front();
    reports_[rank].pop_front();
    return r;
  }

  static SlotMove Move(uint32_t source, uint32_t target,
                       std::vector<uint32_t> slots, SlotMove::Phase phase,
                       uint64_t copy_epoch, uint64_t fence_epoch = 0) {
    SlotMove m;
    m.set_source(source);
    m.set_target(target);
    for (uint32_t s : slots) m.add_slots(s);
    m.set_phase(phase);
    m.set_copy_epoch(copy_epoch);
    m.set_fence_epoch(fence_epoch);
    return m;
  }

  // A key and a dense block in each of `slots` and one outside, if any.
  std::pair<uint64_t, uint64_t> KeyIn(const std::vector<uint32_t>& slots,
                                      bool inside) {
    auto in = [&](uint32_t s) {
      return std::find(slots.begin(), slots.end(), s) != slots.end();
    };
    uint64_t key = 0, block = 0;
    while (key < kKeys && in(SlotOf(kSparse, key)) != inside) ++key;
    while (block < kBlocks && in(SlotOf(kDense, block)) != inside) ++block;
    return {key, block};
  }

  // Runs a move of `slots` from `a` to `t` through copy, fence and flip
  // with pushes in between; `after_flip` is the layout of the flip view.
  void RunMove(uint32_t a, uint32_t t, const std::vector<uint32_t>& slots,
               const Layout& after_flip) {
    Layout l = layout_;
    const uint64_t copy_epoch = epoch_ + 1;
    l.moves = {Move(a, t, slots, SlotMove::COPYING, copy_epoch)};
    ASSERT_NO_FATAL_FAILURE(Install(l));
    ASSERT_NO_FATAL_FAILURE(PushAll(20));
    std::optional<ReportMoveRequest> copied = NextReport(a);
    ASSERT_TRUE(copied.has_value());
    EXPECT_EQ(copied->stage(), ReportMoveRequest::COPIED);
    EXPECT_EQ(copied->epoch(), copy_epoch);
    EXPECT_EQ(copied->source(), a);
    EXPECT_EQ(copied->target(), t);
    EXPECT_GT(copied->rows_copied(), 0u);
    EXPECT_GT(copied->bytes_copied(), 0u);
    ASSERT_NO_FATAL_FAILURE(PushAll(300));

    const uint64_t fence_epoch = epoch_ + 1;
    l.moves = {Move(a, t, slots, SlotMove::FENCING, copy_epoch, fence_epoch)};
    ASSERT_NO_FATAL_FAILURE(Install(l));
    const auto [key, block] = KeyIn(slots, true);
    ASSERT_LT(key, kKeys);
    const ResponseHeader refused = PushTo(a, kSparse, {key}, {1, 1});
    EXPECT_EQ(refused.code(), static_cast<int>(absl::StatusCode::kUnavailable))
        << refused.message();
    EXPECT_FALSE(refused.wrong_owner());
    // Pulls are still answered, and other slots take pushes.
    EXPECT_EQ(PullFrom(a, kSparse, key).size(), kDim);
    const auto [other, other_block] = KeyIn(slots, false);
    if (other < kKeys && layout_.owner[SlotOf(kSparse, other)] == a) {
      ASSERT_NO_FATAL_FAILURE(PushAcked(kSparse, other, 7));
    }
    std::optional<ReportMoveRequest> fenced = NextReport(a);
    ASSERT_TRUE(fenced.has_value());
    EXPECT_EQ(fenced->stage(), ReportMoveRequest::FENCED) << fenced->error();
    EXPECT_EQ(fenced->epoch(), fence_epoch);
    EXPECT_EQ(servers_[a]->stats().move_fences, 1u);
    EXPECT_GE(servers_[a]->stats().move_fenced_refusals, 1u);

    ASSERT_NO_FATAL_FAILURE(Install(after_flip));
    EXPECT_EQ(servers_[t]->stats().move_slots_in, slots.size());
    EXPECT_EQ(servers_[a]->stats().move_slots_out, slots.size());
    // The old owner refuses them now; the new one takes them.
    const ResponseHeader moved = PushTo(a, kSparse, {key}, {1, 1});
    EXPECT_TRUE(moved.wrong_owner()) << moved.message();
    ASSERT_NO_FATAL_FAILURE(PushAll(4000));
    ASSERT_NO_FATAL_FAILURE(ExpectLedger());
  }

  // Rows (sparse) or elements (dense, as TableStats counts them) of `table`
  // that server `rank` should hold under `l` once every key and block was
  // pushed: those of the slots it owns or backs.
  uint64_t RowsUnder(const Layout& l, uint32_t rank, uint32_t table) const {
    uint64_t n = 0;
    const uint64_t ids = table == kSparse ? kKeys : kBlocks;
    for (uint64_t id = 0; id < ids; ++id) {
      const uint32_t s = SlotOf(table, id);
      n += l.owner[s] == rank || (!l.backup.empty() && l.backup[s] == rank);
    }
    return table == kSparse ? n : n * kBlock;
  }

  // The bytes per slot server `rank` should report under `l`: 16 per key
  // (its key and two floats) and per block (four floats) it owns.
  std::vector<uint64_t> SlotBytesUnder(const Layout& l, uint32_t rank) const {
    std::vector<uint64_t> bytes(kSlots, 0);
    for (uint64_t k = 0; k < kKeys; ++k) {
      if (l.owner[SlotOf(kSparse, k)] == rank) bytes[SlotOf(kSparse, k)] += 16;
    }
    for (uint64_t b = 0; b < kBlocks; ++b) {
      if (l.owner[SlotOf(kDense, b)] == rank) bytes[SlotOf(kDense, b)] += 16;
    }
    return bytes;
  }

  // Waits until server `rank` reports `want` as its bytes per slot.
  void ExpectSlotBytes(uint32_t rank, const std::vector<uint64_t>& want) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (servers_[rank]->slot_bytes() != want && absl::Now() < deadline)
      absl::SleepFor(absl::Milliseconds(1));
    EXPECT_EQ(servers_[rank]->slot_bytes(), want) << "server " << rank;
  }

  static constexpr uint64_t kKeys = 48;

  std::vector<std::unique_ptr<KVServer>> servers_;
  std::vector<std::unique_ptr<RawClient>> clients_;
  Layout layout_;
  uint64_t epoch_ = 0;
  uint64_t request_id_ = 0;
  uint64_t seq_[2] = {0, 0};
  std::map<Cell, float> ledger_;
  absl::Mutex mu_;
  std::map<uint32_t, std::deque<ReportMoveRequest>> reports_
      ABSL_GUARDED_BY(mu_);
};

// Two servers, replication 1: slots 0-7 on server 0, 8-15 on server 1.
Layout TwoServers() {
  Layout l;
  for (uint32_t s = 0; s < kSlots; ++s) l.owner.push_back(s < 8 ? 0 : 1);
  l.live = {0, 1};
  return l;
}

// Three servers, replication 2: slots 0-5 on server 0 (backed by 1),
// 6-10 on 1 (backed by 2), 11-15 on 2 (backed by 0).
Layout ThreeServers() {
  Layout l;
  for (uint32_t s = 0; s < kSlots; ++s) {
    const uint32_t owner = s < 6 ? 0 : s < 11 ? 1 : 2;
    l.owner.push_back(owner);
    l.backup.push_back((owner + 1) % 3);
  }
  l.live = {0, 1, 2};
  return l;
}

const std::vector<uint32_t> kMoving = {0, 1, 2, 3};

TEST_F(MoveTest, ReplicationOneMovesSlotsWithoutLosingAPush) {
  ASSERT_NO_FATAL_FAILURE(Start(2, 1));
  ASSERT_NO_FATAL_FAILURE(Install(TwoServers()));
  ASSERT_NO_FATAL_FAILURE(PushAll(1));
  const uint64_t rows_before = RowsHeld(0, kSparse);
  Layout flipped = TwoServers();
  for (uint32_t s : kMoving) flipped.owner[s] = 1;
  ASSERT_NO_FATAL_FAILURE(RunMove(0, 1, kMoving, flipped));
  // The source dropped its rows of the moved slots.
  uint64_t kept = 0;
  for (uint64_t k = 0; k < kKeys; ++k)
    kept += flipped.owner[SlotOf(kSparse, k)] == 0;
  EXPECT_LT(kept, rows_before);
  EXPECT_EQ(RowsHeld(0, kSparse), kept);
  EXPECT_EQ(RowsHeld(0, kDense), RowsUnder(flipped, 0, kDense));
  // Both measure their bytes per slot again after the flip.
  ASSERT_NO_FATAL_FAILURE(ExpectSlotBytes(0, SlotBytesUnder(flipped, 0)));
  ASSERT_NO_FATAL_FAILURE(ExpectSlotBytes(1, SlotBytesUnder(flipped, 1)));
  EXPECT_GT(servers_[0]->stats().move_rows_out, 0u);
  EXPECT_GT(servers_[1]->stats().move_rows_in, 0u);
  // Without backups nothing counts as unreplicated.
  EXPECT_EQ(servers_[0]->stats().unreplicated_pushes, 0u);
  EXPECT_EQ(servers_[1]->stats().unreplicated_pushes, 0u);
}

// With the drop of the moved rows left pending (no step between
// requests), STATS still counts none of them: it finishes the drop first.
TEST_F(MoveTest, RowsMovedAwayAreNotSeenWhileTheirDropIsPending) {
  ASSERT_NO_FATAL_FAILURE(Start(2, 1, /*drop_positions_per_turn=*/0));
  ASSERT_NO_FATAL_FAILURE(Install(TwoServers()));
  ASSERT_NO_FATAL_FAILURE(PushAll(1));
  Layout flipped = TwoServers();
  for (uint32_t s : kMoving) flipped.owner[s] = 1;
  ASSERT_NO_FATAL_FAILURE(RunMove(0, 1, kMoving, flipped));
  uint64_t kept = 0;
  for (uint64_t k = 0; k < kKeys; ++k)
    kept += flipped.owner[SlotOf(kSparse, k)] == 0;
  EXPECT_EQ(RowsHeld(0, kSparse), kept);
  EXPECT_EQ(RowsHeld(0, kDense), RowsUnder(flipped, 0, kDense));
}

TEST_F(MoveTest, ReplicationTwoSwapsRolesWithoutACopyBack) {
  ASSERT_NO_FATAL_FAILURE(Start(3, 2));
  ASSERT_NO_FATAL_FAILURE(Install(ThreeServers()));
  ASSERT_NO_FATAL_FAILURE(PushAll(1));
  // Slots 0-3 (server 0, backed by 1) move to server 2.
  Layout flipped = ThreeServers();
  for (uint32_t s : kMoving) {
    flipped.owner[s] = 2;
    flipped.backup[s] = 0;
  }
  const uint64_t catchups_before = servers_[2]->stats().catchups_sent;
  ASSERT_NO_FATAL_FAILURE(RunMove(0, 2, kMoving, flipped));
  // No copy back to the source, which backs the slots now; their old
  // backup dropped its copy.
  EXPECT_EQ(servers_[2]->stats().catchups_sent, catchups_before);
  for (uint32_t rank : {0u, 1u, 2u}) {
    EXPECT_EQ(RowsHeld(rank, kSparse), RowsUnder(flipped, rank, kSparse))
        << "server " << rank;
    EXPECT_EQ(RowsHeld(rank, kDense), RowsUnder(flipped, rank, kDense))
        << "server " << rank;
  }
  EXPECT_EQ(servers_[0]->stats().unreplicated_pushes, 0u);
  EXPECT_EQ(servers_[2]->stats().unreplicated_pushes, 0u);
  ASSERT_NO_FATAL_FAILURE(PushAll(50000));

  // The new owner stops; the source takes its slots back from its copy.
  servers_[2]->Stop();
  Layout back = flipped;
  back.live = {0, 1};
  for (uint32_t s = 0; s < kSlots; ++s) {
    if (back.owner[s] == 2) back.owner[s] = back.backup[s];
    back.backup[s] = back.owner[s] == 0 ? 1 : 0;
  }
  ASSERT_NO_FATAL_FAILURE(Install(back));
  ASSERT_NO_FATAL_FAILURE(ExpectLedger());
  ASSERT_NO_FATAL_FAILURE(PushAll(900000));
  ASSERT_NO_FATAL_FAILURE(ExpectLedger());
}

TEST_F(MoveTest, OpenBspStepIsAppliedOnceAtTheTarget) {
  ASSERT_NO_FATAL_FAILURE(Start(2, 1));
  Layout l = TwoServers();
  l.mode = BSP;
  ASSERT_NO_FATAL_FAILURE(Install(l));
  const auto [key, block] = KeyIn(kMoving, true);
  ASSERT_LT(key, kKeys);
  // Worker 0 pushes step 0 before the move, worker 1 during the copy.
  ASSERT_EQ(PushTo(0, kSparse, {key}, {2, 4}, 0, 0).code(), 0);
  const uint64_t copy_epoch = epoch_ + 1;
  l.moves = {Move(0, 1, kMoving, SlotMove::COPYING, copy_epoch)};
  ASSERT_NO_FATAL_FAILURE(Install(l));
  ASSERT_EQ(PushTo(0, kSparse, {key}, {6, 8}, 1, 0).code(), 0);
  std::optional<ReportMoveRequest> copied = NextReport(0);
  ASSERT_TRUE(copied.has_value());
  ASSERT_EQ(copied->stage(), ReportMoveRequest::COPIED);
  l.moves = {Move(0, 1, kMoving, SlotMove::FENCING, copy_epoch, epoch_ + 1)};
  ASSERT_NO_FATAL_FAILURE(Install(l));
  std::optional<ReportMoveRequest> fenced = NextReport(0);
  ASSERT_TRUE(fenced.has_value());
  ASSERT_EQ(fenced->stage(), ReportMoveRequest::FENCED) << fenced->error();
  l.moves.clear();
  for (uint32_t s : kMoving) l.owner[s] = 1;
  ASSERT_NO_FATAL_FAILURE(Install(l));
  // Both workers finish step 0 everywhere: the step is applied at the new
  // owner, averaged over the two.
  for (uint32_t rank : {0u, 1u}) {
    for (uint32_t w : {0u, 1u}) {
      RequestHeader h = Header(ADVANCE_CLOCK, 0, 0);
      h.set_request_id(++request_id_);
      h.set_sender_node_id(kWorker[w]);
      h.set_clock(1);
      ASSERT_FALSE(clients_[rank]
                       ->RoundTrip(Frames(HeaderFrame(h), KeysFrame({})))
                       .empty());
    }
  }
  const std::vector<float> v = PullFrom(1, kSparse, key, /*clock=*/1);
  ASSERT_EQ(v.size(), kDim);
  EXPECT_EQ(v[0], -(2.0f + 6.0f) / 2);
  EXPECT_EQ(v[1], -(4.0f + 8.0f) / 2);
  // Not applied at the source as well: it holds no row of the key.
  EXPECT_EQ(RowsHeld(0, kSparse), 0u);
}

// Sends server `rank`, as if from the node of server `from`, a replica
// update of `key` that the source never applied.
void CorruptCopy(const std::string& endpoint, uint64_t from_node,
                 uint64_t epoch, uint64_t key) {
  RequestHeader h = Header(PUSH, kSparse, 1);
  h.set_replica(true);
  h.set_epoch(epoch);
  h.set_request_id(1);
  h.set_sender_node_id(kWorker[0]);
  ReplicaInfo* info = h.mutable_replica_info();
  info->set_kind(REPLICA_APPLY);
  info->set_primary_node_id(from_node);
  info->set_lr_scale(1);
  RawClient fake(endpoint);
  const std::vector<zmq::message_t> reply = fake.RoundTrip(
      Frames(HeaderFrame(h), KeysFrame({key}), ValuesFrame({5, 5})));
  ASSERT_FALSE(reply.empty());
  ResponseHeader rh;
  rh.ParseFromArray(reply[0].data(), reply[0].size());
  ASSERT_EQ(rh.code(), 0) << rh.message();
}

TEST_F(MoveTest, DigestMismatchAbortsAndTheTargetDropsItsCopy) {
  ASSERT_NO_FATAL_FAILURE(Start(2, 1));
  ASSERT_NO_FATAL_FAILURE(Install(TwoServers()));
  ASSERT_NO_FATAL_FAILURE(PushAll(1));
  const uint64_t target_rows = RowsHeld(1, kSparse);
  Layout l = TwoServers();
  const uint64_t copy_epoch = epoch_ + 1;
  l.moves = {Move(0, 1, kMoving, SlotMove::COPYING, copy_epoch)};
  ASSERT_NO_FATAL_FAILURE(Install(l));
  std::optional<ReportMoveRequest> copied = NextReport(0);
  ASSERT_TRUE(copied.has_value());
  ASSERT_EQ(copied->stage(), ReportMoveRequest::COPIED);
  EXPECT_GT(RowsHeld(1, kSparse), target_rows);
  const auto [key, block] = KeyIn(kMoving, true);
  ASSERT_NO_FATAL_FAILURE(
      CorruptCopy(servers_[1]->endpoint(), 100, epoch_, key));

  const uint64_t fence_epoch = epoch_ + 1;
  l.moves = {Move(0, 1, kMoving, SlotMove::FENCING, copy_epoch, fence_epoch)};
  ASSERT_NO_FATAL_FAILURE(Install(l));
  std::optional<ReportMoveRequest> aborted = NextReport(0);
  ASSERT_TRUE(aborted.has_value());
  EXPECT_EQ(aborted->stage(), ReportMoveRequest::ABORTED);
  EXPECT_EQ(aborted->epoch(), fence_epoch);
  EXPECT_NE(aborted->error().find("differs"), std::string::npos)
      << aborted->error();
  EXPECT_NE(aborted->error().find("digest"), std::string::npos);
  EXPECT_EQ(servers_[0]->stats().move_aborts, 1u);

  // The scheduler drops the move: the source serves on, the target
  // forgets its copy.
  l.moves.clear();
  ASSERT_NO_FATAL_FAILURE(Install(l));
  EXPECT_EQ(RowsHeld(1, kSparse), target_rows);
  ASSERT_NO_FATAL_FAILURE(PushAll(60));
  ASSERT_NO_FATAL_FAILURE(ExpectLedger());
}

TEST_F(MoveTest, MoveAbandonedWhileCopyingDropsTheCopy) {
  ASSERT_NO_FATAL_FAILURE(Start(2, 1));
  ASSERT_NO_FATAL_FAILURE(Install(TwoServers()));
  ASSERT_NO_FATAL_FAILURE(PushAll(1));
  const uint64_t target_rows = RowsHeld(1, kSparse);
  const uint64_t target_blocks = RowsHeld(1, kDense);
  Layout l = TwoServers();
  l.moves = {Move(0, 1, kMoving, SlotMove::COPYING, epoch_ + 1)};
  ASSERT_NO_FATAL_FAILURE(Install(l));
  ASSERT_NO_FATAL_FAILURE(PushAll(2));
  std::optional<ReportMoveRequest> copied = NextReport(0);
  ASSERT_TRUE(copied.has_value());
  ASSERT_EQ(copied->stage(), ReportMoveRequest::COPIED);
  EXPECT_GT(RowsHeld(1, kSparse), target_rows);
  l.moves.clear();
  ASSERT_NO_FATAL_FAILURE(Install(l));
  EXPECT_EQ(RowsHeld(1, kSparse), target_rows);
  EXPECT_EQ(RowsHeld(1, kDense), target_blocks);
  ASSERT_NO_FATAL_FAILURE(PushAll(3));
  ASSERT_NO_FATAL_FAILURE(ExpectLedger());
}

TEST_F(MoveTest, MovesThatContradictTheViewAreIgnored) {
  ASSERT_NO_FATAL_FAILURE(Start(2, 1));
  Layout l = TwoServers();
  // Slot 9 is server 1's, slot 99 does not exist, rank 7 is beyond the
  // job's ranks: none of these moves starts, and the server serves on.
  l.moves = {Move(0, 1, {0, 9}, SlotMove::COPYING, 1),
             Move(1, 0, {99}, SlotMove::COPYING, 1),
             Move(0, 7, {1}, SlotMove::FENCING, 1, 1)};
  ASSERT_NO_FATAL_FAILURE(Install(l));
  ASSERT_NO_FATAL_FAILURE(PushAll(1));
  ASSERT_NO_FATAL_FAILURE(ExpectLedger());
  EXPECT_EQ(servers_[0]->stats().catchups_sent, 0u);
  EXPECT_EQ(servers_[1]->stats().catchups_sent, 0u);
}

}  // namespace
}  // namespace ps
