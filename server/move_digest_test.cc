// MoveDigests against DigestSlots, the pass over every row it stands in
// for: after any interleaving of pushes, pulls, imports, drops, TTL
// evictions and bounded folds, a tracked move's digest equals the pass.
#include "server/move_digest.h"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include "absl/time/time.h"
#include "common/hash.h"
#include "gtest/gtest.h"
#include "proto/config.pb.h"
#include "server/slot_digest.h"
#include "server/table.h"

namespace ps {
namespace {

constexpr uint32_t kSlots = 16;
constexpr uint32_t kPlain = 0;     // sparse, dim 3
constexpr uint32_t kExpiring = 1;  // sparse, TTL 3 steps, admission after 2
constexpr uint32_t kDense = 2;     // 100 elements in blocks of 8
constexpr uint32_t kDim = 3;

TableMap MakeTables() {
  TableMap tables;
  auto add = [&](TableConfig c) {
    AdagradConfig* adagrad = c.mutable_optimizer()->mutable_adagrad();
    adagrad->set_learning_rate(0.1f);
    adagrad->set_initial_accumulator(0.1f);
    adagrad->set_epsilon(1e-8f);
    c.mutable_init()->set_kind(InitializerConfig::UNIFORM);
    c.mutable_init()->set_scale(0.1f);
    auto t = Table::Create(c);
    EXPECT_TRUE(t.ok()) << t.status();
    tables[c.id()] = std::move(t).value();
  };
  TableConfig plain;
  plain.set_id(kPlain);
  plain.set_name("plain");
  plain.mutable_sparse()->set_dim(kDim);
  add(plain);
  TableConfig expiring = plain;
  expiring.set_id(kExpiring);
  expiring.set_name("expiring");
  expiring.mutable_sparse()->set_ttl_steps(3);
  expiring.mutable_sparse()->set_admit_after_pushes(2);
  add(expiring);
  TableConfig dense;
  dense.set_id(kDense);
  dense.set_name("dense");
  dense.mutable_dense()->set_size(100);
  dense.mutable_dense()->set_block_size(8);
  add(dense);
  return tables;
}

std::vector<bool> Mask(const std::vector<uint32_t>& slots) {
  std::vector<bool> mask(kSlots, false);
  for (uint32_t s : slots) mask[s] = true;
  return mask;
}

size_t plain_state_floats(TableMap& tables) {
  return tables[kPlain]->AsSparse()->state_floats();
}

// Keys 0..n-1.
std::vector<uint64_t> FirstKeys(size_t n) {
  std::vector<uint64_t> keys(n);
  for (uint64_t k = 0; k < n; ++k) keys[k] = k;
  return keys;
}

// Pushes gradient `g` to every element of `keys`' rows of a table of
// dim kDim.
void PushKeys(SparseTable& table, absl::Span<const uint64_t> keys,
              float g = 0.25f) {
  const std::vector<float> grads(keys.size() * kDim, g);
  table.Push(keys, grads.data());
}

const std::vector<uint32_t> kAllSlots = {0, 1, 2,  3,  4,  5,  6,  7,
                                         8, 9, 10, 11, 12, 13, 14, 15};

void ExpectSame(MoveDigests& digests, const TableMap& tables,
                const std::vector<uint32_t>& slots) {
  const std::optional<SlotDigest> tracked = digests.Digest(slots);
  ASSERT_TRUE(tracked.has_value());
  const SlotDigest full = DigestSlots(tables, Mask(slots));
  EXPECT_EQ(tracked->digest, full.digest);
  EXPECT_EQ(tracked->rows, full.rows);
  EXPECT_EQ(tracked->bytes, full.bytes);
}

// One random change of the tables: what a server's requests, replica
// messages, TTL and flips do to rows.
void RandomChange(std::mt19937_64& rng, TableMap& tables, uint64_t* step) {
  std::uniform_int_distribution<uint64_t> key(0, 199);
  std::uniform_real_distribution<float> grad(-1.0f, 1.0f);
  SparseTable& plain = *tables[kPlain]->AsSparse();
  SparseTable& expiring = *tables[kExpiring]->AsSparse();
  DenseTable& dense = *tables[kDense]->AsDense();
  const int op = static_cast<int>(rng() % 9);
  std::vector<uint64_t> keys(1 + rng() % 8);
  for (uint64_t& k : keys) k = key(rng);
  // Enough for a sparse push and for a dense segment (at most a block).
  std::vector<float> values(8 * plain.state_floats());
  for (float& v : values) v = grad(rng);
  Segments segments;
  DenseSegment* s = segments.Add();
  s->set_begin(rng() % 100);
  s->set_length(1 + rng() % (8 - s->begin() % 8));
  if (s->begin() + s->length() > 100) s->set_length(100 - s->begin());
  switch (op) {
    case 0:
    case 1:
      plain.Push(keys, values.data());
      break;
    case 2:
      expiring.Push(keys, values.data());
      break;
    case 3:  // a snapshot row or a copy's overwrite
      ASSERT_TRUE(plain
                      .ImportRow(keys[0], absl::MakeSpan(values).subspan(
                                              0, plain.state_floats()))
                      .ok());
      break;
    case 4:  // TTL evicts rows of the expiring table
      *step += 1 + rng() % 2;
      expiring.Advance(*step, absl::UnixEpoch());
      break;
    case 5: {  // a flip or an abandoned copy drops some slots
      std::vector<bool> drop(kSlots, false);
      drop[rng() % kSlots] = true;
      DropSlots(tables, drop);
      break;
    }
    case 6: {  // a pull creates the dense block
      std::vector<float> out(s->length());
      dense.Pull(segments, out.data());
      break;
    }
    case 7:
      dense.Push(segments, values.data());
      break;
    default: {
      const uint64_t block = rng() % dense.num_blocks();
      const size_t n = dense.BlockLength(block);
      std::vector<float> v(n, grad(rng)), st(n * dense.state_size(), 0.5f);
      ASSERT_TRUE(dense.ImportBlock(block, v, st).ok());
    }
  }
}

TEST(MoveDigestsTest, EqualsAPassOverEveryRowAfterRandomChanges) {
  TableMap tables = MakeTables();
  std::mt19937_64 rng(7);
  uint64_t step = 0;
  // Rows held before the move starts count too.
  for (int i = 0; i < 100; ++i) RandomChange(rng, tables, &step);
  MoveDigests digests(&tables);
  const std::vector<uint32_t> out = {1, 4, 9, 15}, in = {2, 3};
  digests.Sync(kSlots, {{{0, 1, 5}, out}, {{2, 0, 5}, in}});
  EXPECT_GT(digests.pending(), 0u);
  ExpectSame(digests, tables, out);
  for (int round = 0; round < 300; ++round) {
    const int changes = 1 + static_cast<int>(rng() % 20);
    for (int i = 0; i < changes; ++i) RandomChange(rng, tables, &step);
    // Bounded folds between requests.
    const size_t rows = rng() % 8;
    digests.FoldInitial(rows);
    digests.FoldChanged(rows);
    if (round % 10 == 0) {
      ExpectSame(digests, tables, out);
      ExpectSame(digests, tables, in);
    }
  }
  ExpectSame(digests, tables, out);
  ExpectSame(digests, tables, in);
  EXPECT_GT(DigestSlots(tables, Mask(out)).rows, 0u);
}

TEST(MoveDigestsTest, FoldIsBoundedAndAFenceReadsOnlyWhatIsLeft) {
  TableMap tables = MakeTables();
  SparseTable& plain = *tables[kPlain]->AsSparse();
  const std::vector<uint64_t> keys = FirstKeys(1000);
  PushKeys(plain, keys);
  MoveDigests digests(&tables);
  digests.Sync(kSlots, {{{0, 1, 1}, kAllSlots}});
  EXPECT_EQ(digests.pending(), 1000u);
  EXPECT_EQ(digests.FoldInitial(300), 700u);
  EXPECT_EQ(digests.FoldInitial(1000), 0u);
  EXPECT_EQ(digests.pending(), 0u);
  // Pushes since the last fold are all a fence has to read.
  PushKeys(plain, absl::MakeConstSpan(keys).subspan(0, 10));
  EXPECT_EQ(digests.pending(), 10u);
  ExpectSame(digests, tables, kAllSlots);
}

TEST(MoveDigestsTest, ChangedRowsFoldApartFromTheRowsHeldAtTheStart) {
  TableMap tables = MakeTables();
  SparseTable& plain = *tables[kPlain]->AsSparse();
  const std::vector<uint64_t> keys = FirstKeys(1000);
  PushKeys(plain, keys);
  MoveDigests digests(&tables);
  digests.Sync(kSlots, {{{0, 1, 1}, kAllSlots}});
  // Rows pushed (and new rows created) while the start is still hashed.
  const std::vector<uint64_t> touched = {3, 5, 2000, 2001};
  PushKeys(plain, touched);
  EXPECT_EQ(digests.pending_initial(), 1000u);
  EXPECT_EQ(digests.pending_changed(), touched.size());
  // The changed rows alone: the start is left for the paced part.
  EXPECT_EQ(digests.FoldChanged(1000), 0u);
  EXPECT_EQ(digests.pending_initial(), 1000u);
  // Interleaved, bounded, with more changes between: still exact.
  std::mt19937_64 rng(3);
  while (digests.pending() > 0) {
    const size_t before = digests.pending_initial();
    EXPECT_EQ(digests.FoldInitial(100), before - std::min<size_t>(before, 100));
    PushKeys(plain, {rng() % 3000});
    digests.FoldChanged(rng() % 3);
  }
  ExpectSame(digests, tables, kAllSlots);
}

// A table too large to list when tracking starts is listed in steps by
// FoldInitial, while rows are created (growing the index) and dropped: the
// digest still equals a pass over every row.
TEST(MoveDigestsTest, ALargeTableIsListedInStepsThroughGrowthAndDrops) {
  TableMap tables = MakeTables();
  SparseTable& plain = *tables[kPlain]->AsSparse();
  const std::vector<uint64_t> keys = FirstKeys(40000);
  PushKeys(plain, keys);
  MoveDigests digests(&tables);
  const std::vector<uint32_t> slots = {1, 5, 6, 12};
  digests.Sync(kSlots, {{{0, 1, 1}, slots}});
  EXPECT_EQ(digests.pending_initial(), 1u) << "listed at once";
  std::mt19937_64 rng(9);
  int turns = 0;
  for (; digests.pending_initial() > 0; ++turns) {
    digests.FoldInitial(256);
    std::vector<uint64_t> fresh;
    for (int i = 0; i < 300; ++i) fresh.push_back(50000 + rng() % 200000);
    PushKeys(plain, fresh);
    const uint64_t victim = rng() % keys.size();
    plain.DropRows([&](uint64_t key) { return key == victim; });
    digests.FoldChanged(rng() % 64);
  }
  EXPECT_GT(turns, 5);
  ExpectSame(digests, tables, slots);
}

TEST(MoveDigestsTest, OnlyTrackedMovesAndTheirSlotsAreKept) {
  TableMap tables = MakeTables();
  MoveDigests digests(&tables);
  const std::vector<uint64_t> keys = FirstKeys(64);
  digests.Sync(kSlots, {{{0, 1, 1}, {3}}});
  PushKeys(*tables[kPlain]->AsSparse(), keys, 1.0f);
  uint64_t in_slot = 0;
  for (uint64_t k : keys) in_slot += SparseSlot(kPlain, k, kSlots) == 3;
  EXPECT_EQ(digests.pending(), in_slot);
  EXPECT_FALSE(digests.Digest({4}).has_value());
  ExpectSame(digests, tables, {3});
  // Replaced by a move with a new copy epoch: starts afresh, same result.
  digests.Sync(kSlots, {{{0, 1, 2}, {3}}});
  EXPECT_EQ(digests.pending(), in_slot);
  ExpectSame(digests, tables, {3});
  // Untracked: the tables stop reporting to it.
  digests.Sync(kSlots, {});
  EXPECT_EQ(digests.moves(), 0u);
  PushKeys(*tables[kPlain]->AsSparse(), keys, 1.0f);
  EXPECT_EQ(digests.pending(), 0u);
  EXPECT_FALSE(digests.Digest({3}).has_value());
}

// SlotBytes in small steps (what the serving loop does) counts what one
// pass counts when nothing changes in between.
TEST(SlotBytesScanTest, StepsAddUpToOnePass) {
  TableMap tables = MakeTables();
  std::mt19937_64 rng(3);
  uint64_t step = 0;
  for (int i = 0; i < 300; ++i) RandomChange(rng, tables, &step);
  const std::vector<uint64_t> whole = SlotBytes(tables, kSlots);
  SlotBytesScan scan(tables, kSlots);
  int steps = 1;
  while (!scan.Step(tables, 16)) ++steps;
  EXPECT_GT(steps, 10);
  EXPECT_EQ(scan.TakeBytes(), whole);
  uint64_t total = 0;
  for (uint64_t b : whole) total += b;
  EXPECT_GT(total, 0u);
}

// A stepwise listing interleaved with index growth and row drops: every
// row of the slots held from start to end is listed exactly once, and
// nothing outside the slots or never held is.
TEST(SlotKeyWalkTest, ListsEveryRowHeldThroughoutOnceDespiteGrowthAndDrops) {
  TableMap tables = MakeTables();
  SparseTable& plain = *tables[kPlain]->AsSparse();
  std::mt19937_64 rng(5);
  const std::vector<uint64_t> start = FirstKeys(3000);
  PushKeys(plain, start, 0.5f);
  std::vector<bool> mask(kSlots, false);
  mask[2] = mask[7] = mask[11] = true;
  std::set<uint64_t> dropped, created;
  SlotKeyWalk walk(tables, mask);
  int steps = 0;
  for (; !walk.Step(tables, 64); ++steps) {
    if (steps % 7 == 3) {  // new rows; now and then the index grows
      std::vector<uint64_t> fresh;
      for (int i = 0; i < 200; ++i) fresh.push_back(100000 + rng() % 100000);
      PushKeys(plain, fresh, 0.5f);
      created.insert(fresh.begin(), fresh.end());
    }
    if (steps % 29 == 11) {  // drops shift rows backward
      const uint64_t victim = rng() % start.size();
      dropped.insert(victim);
      plain.DropRows([&](uint64_t key) { return key == victim; });
    }
  }
  EXPECT_GT(steps, 20);
  EXPECT_GT(walk.restarts(), 0);
  std::vector<uint64_t> listed;
  for (const SlotKeyWalk::Keys& k : walk.keys()) {
    if (k.table == kPlain) listed = k.keys;
    if (k.table == kExpiring) {
      EXPECT_TRUE(k.keys.empty());
    }
  }
  std::set<uint64_t> unique(listed.begin(), listed.end());
  EXPECT_EQ(unique.size(), listed.size()) << "a row listed twice";
  size_t kept = 0;
  for (uint64_t k : start) {
    if (!mask[SparseSlot(kPlain, k, kSlots)] || dropped.count(k) > 0)
      continue;
    ++kept;
    EXPECT_EQ(unique.count(k), 1u) << "row " << k << " was not listed";
  }
  EXPECT_GT(kept, 100u);
  for (uint64_t k : listed) {
    EXPECT_TRUE(mask[SparseSlot(kPlain, k, kSlots)]) << k;
    EXPECT_TRUE(k < start.size() || created.count(k) > 0) << k;
  }
}

// A stepwise drop interleaved with pushes of other slots (growing the
// plain table's index several times) and TTL evictions: once done, no row
// of the dropped slots is left and every other row is what a drop in one
// pass before the same changes leaves.
TEST(SlotDropTest, StepsInterleavedWithGrowthDropEveryRowAndNoOther) {
  TableMap tables = MakeTables();
  TableMap reference = MakeTables();
  const std::vector<bool> mask = Mask({1, 4, 5, 9, 12});
  std::mt19937_64 rng(5);
  std::vector<float> values(plain_state_floats(tables));
  auto push = [&](TableMap& t, uint64_t key, float v) {
    std::fill(values.begin(), values.end(), v);
    for (uint32_t id : {kPlain, kExpiring})
      t[id]->AsSparse()->Push({key}, values.data());
  };
  for (uint64_t key = 0; key < 3000; ++key) {
    const float v = static_cast<float>(key % 7) * 0.1f;
    push(tables, key, v);
    push(reference, key, v);
  }
  DropSlots(reference, mask);
  const size_t capacity = tables[kPlain]->AsSparse()->index_capacity();
  SlotDrop drop(tables, mask);
  uint64_t next = 1000000, step = 0;
  int steps = 0;
  while (!drop.Step(tables, 8)) {
    ++steps;
    for (int i = 0; i < 2; ++i) {  // rows of slots still owned
      uint64_t key = next++;
      while (mask[SparseSlot(kPlain, key, kSlots)] ||
             mask[SparseSlot(kExpiring, key, kSlots)])
        key = next++;
      push(tables, key, 0.5f);
      push(reference, key, 0.5f);
    }
    if (rng() % 8 == 0) {
      ++step;
      for (TableMap* t : {&tables, &reference})
        (*t)[kExpiring]->AsSparse()->Advance(step, absl::UnixEpoch());
    }
  }
  EXPECT_GT(steps, 100);
  EXPECT_GT(tables[kPlain]->AsSparse()->index_capacity(), capacity);
  EXPECT_EQ(DigestSlots(tables, mask).rows, 0u);
  std::vector<bool> others(kSlots);
  for (uint32_t s = 0; s < kSlots; ++s) others[s] = !mask[s];
  const SlotDigest got = DigestSlots(tables, others);
  const SlotDigest want = DigestSlots(reference, others);
  EXPECT_EQ(got.rows, want.rows);
  EXPECT_EQ(got.digest, want.digest);
}

// A step of no positions looks at nothing: it does not end a table.
TEST(SlotDropTest, StepOfNoPositionsLeavesEveryTableToDo) {
  TableMap tables = MakeTables();
  std::vector<float> values(plain_state_floats(tables), 0.25f);
  for (uint64_t key = 0; key < 500; ++key)
    tables[kPlain]->AsSparse()->Push({key}, values.data());
  SlotDrop drop(tables, Mask({2}));
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(drop.Step(tables, 0));
  while (!drop.Step(tables, 32)) {
  }
  EXPECT_EQ(DigestSlots(tables, Mask({2})).rows, 0u);
}

// Slots added to a drop in progress are dropped from the tables already
// done as well.
TEST(SlotDropTest, AddedSlotsAreDroppedFromEveryTable) {
  TableMap tables = MakeTables();
  std::vector<float> values(plain_state_floats(tables), 0.25f);
  for (uint64_t key = 0; key < 500; ++key)
    tables[kPlain]->AsSparse()->Push({key}, values.data());
  SlotDrop drop(tables, Mask({2}));
  EXPECT_FALSE(drop.Step(tables, 0));                   // looks at nothing
  for (int i = 0; i < 200; ++i) drop.Step(tables, 32);  // plain done
  drop.Add(tables, Mask({3}));
  drop.Finish(tables);
  EXPECT_TRUE(drop.Done());
  EXPECT_EQ(DigestSlots(tables, Mask({2, 3})).rows, 0u);
  EXPECT_GT(DigestSlots(tables, Mask({0, 1})).rows, 0u);
}

}  // namespace
}  // namespace ps
