// KVServer with a sparse table whose rows mostly live on its disk tier,
// over a real socket: pushes and pulls give what a table without a budget
// gives, STATS reports the tier, and the tier's directory lives and dies
// with the server.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/hash.h"
#include "server/server_test_fixture.h"
#include "server/testing/tier_damage.h"

namespace ps {
namespace {

std::string TierBase() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/server_disk_tier_",
                      getpid());
}

std::string TieredConfig(const std::string& sparse) {
  return absl::StrCat(
      "name: \"tiered\" cluster { num_servers: 1 num_workers: 1 } "
      "tables { id: 5 name: \"emb\" sparse { dim: 16 admit_after_pushes: 1 ",
      sparse,
      " } optimizer { adagrad { learning_rate: 0.1 } } "
      "init { kind: UNIFORM scale: 0.1 } }");
}

// The job with a 1 MiB budget, `eviction` and a disk tier under
// TierBase() (page-cache I/O: the test's directory may refuse O_DIRECT).
std::string TieredJob(const std::string& eviction = "EVICT_LRU") {
  return TieredConfig(absl::StrCat(
      "memory_budget_bytes: 1048576 eviction: ", eviction,
      " disk_tier { dir: \"", TierBase(), "\" buffered_io: true }"));
}

// The job's table without a budget, in this process: the same pushes on it
// give the values the tiered table must hold. Null (a failure recorded)
// when it cannot be made.
std::unique_ptr<Table> PlainTable() {
  auto job = ParseJobConfig(TieredConfig(""), "plain");
  EXPECT_TRUE(job.ok()) << job.status();
  if (!job.ok()) return nullptr;
  auto table = Table::Create(job->tables(0));
  EXPECT_TRUE(table.ok()) << table.status();
  return table.ok() ? *std::move(table) : nullptr;
}

class ServerDiskTierTest : public ServerTest {
 protected:
  void TearDown() override {
    ServerTest::TearDown();
    std::filesystem::remove_all(TierBase());
  }

  // Pushes gradients of 0.02 to table 5's keys Mix64(begin..end-1), 2000
  // to a request (to `reference` too, when given). Call under
  // ASSERT_NO_FATAL_FAILURE.
  void PushMixedKeys(size_t begin, size_t end,
                     SparseTable* reference = nullptr) {
    for (size_t first = begin; first < end; first += kPushPart) {
      std::vector<uint64_t> part;
      for (size_t i = first; i < std::min(end, first + kPushPart); ++i)
        part.push_back(Mix64(i));
      const std::vector<float> grads(part.size() * 16, 0.02f);
      ASSERT_EQ(Push(5, part, grads).code(), absl::StatusCode::kOk);
      if (reference != nullptr) reference->Push(part, grads.data());
    }
  }
  static constexpr size_t kPushPart = 2000;

  // Replaces the fixture's server by one of `job` whose tier reader holds
  // each read while hold_ is set, until release_ is notified; client_
  // speaks to it. Call under ASSERT_NO_FATAL_FAILURE.
  void StartWithHeldReader(const std::string& job) {
    auto config = ParseJobConfig(job, "tiered");
    ASSERT_TRUE(config.ok()) << config.status();
    KVServer::Options options;
    options.config = *config;
    options.before_tier_read = [this] {
      if (!hold_.load()) return;
      held_.fetch_add(1);
      release_.WaitForNotificationWithTimeout(absl::Seconds(30));
    };
    client_.reset();
    server_.reset();
    auto started = KVServer::Start(std::move(options));
    ASSERT_TRUE(started.ok()) << started.status();
    server_ = std::move(started).value();
    client_ = std::make_unique<raw_client::RawClient>(server_->endpoint());
  }

  // Whether the server answers a pull from the view of `epoch` within 5 s.
  bool ServingEpoch(uint64_t epoch) {
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (absl::Now() < deadline) {
      Response r = Pull(5, {1});
      if (r.code() == absl::StatusCode::kOk && r.header.epoch() == epoch)
        return true;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return false;
  }

  // The reads the reader holds, once it holds one or after 10 s.
  int HeldReads() {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (held_.load() == 0 && absl::Now() < deadline)
      absl::SleepFor(absl::Milliseconds(1));
    return held_.load();
  }

  std::atomic<bool> hold_{false};
  std::atomic<int> held_{0};
  absl::Notification release_;
};

TEST_F(ServerDiskTierTest, PushesAndPullsMatchATableWithoutABudget) {
  const std::string tiered = TieredJob();
  ASSERT_NO_FATAL_FAILURE(StartServer(/*standalone=*/true, tiered.c_str()));
  // The same pushes on a table without a budget, in this process.
  const std::unique_ptr<Table> reference = PlainTable();
  ASSERT_NE(reference, nullptr);
  SparseTable& want = *reference->AsSparse();

  constexpr size_t kBatch = 2000;
  std::vector<uint64_t> keys(kBatch);
  std::vector<float> grads(kBatch * 16);
  for (int round = 0; round < 16; ++round) {
    for (size_t i = 0; i < kBatch; ++i) {
      // Eight lists of keys in turn: together about four times what RAM
      // holds.
      keys[i] = Mix64((round % 8) * kBatch + i);
      for (int d = 0; d < 16; ++d)
        grads[i * 16 + d] =
            0.01f * static_cast<float>((i + d + round) % 7) - 0.03f;
    }
    ASSERT_EQ(Push(5, keys, grads).code(), absl::StatusCode::kOk);
    want.Push(keys, grads.data());
  }
  std::vector<uint64_t> all;
  for (size_t i = 0; i < 8 * kBatch; ++i) all.push_back(Mix64(i));
  std::vector<float> expected(all.size() * 16);
  want.Pull(all, expected.data());
  for (size_t begin = 0; begin < all.size(); begin += kBatch) {
    const std::vector<uint64_t> part(all.begin() + begin,
                                     all.begin() + begin + kBatch);
    Response r = Pull(5, part);
    ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
    ASSERT_EQ(r.values.size(), kBatch * 16);
    ASSERT_EQ(std::memcmp(r.values.data(), expected.data() + begin * 16,
                          kBatch * 16 * sizeof(float)),
              0)
        << "keys from " << begin;
  }

  Response stats = SendValid(Header(STATS, 0, 0), Frames(KeysFrame({})));
  ASSERT_EQ(stats.code(), absl::StatusCode::kOk);
  ASSERT_EQ(stats.header.table_stats_size(), 1);
  const TableStats& s = stats.header.table_stats(0);
  EXPECT_EQ(s.rows() + s.cold_rows(), want.num_rows());
  EXPECT_GT(s.cold_rows(), s.rows());
  EXPECT_GT(s.demotions(), 0u);
  EXPECT_GT(s.promotions(), 0u);
  EXPECT_GT(s.cold_reads(), 0u);
  EXPECT_GT(s.tier_memory_bytes(), 0u);
  EXPECT_EQ(s.tier_errors(), 0u);
  EXPECT_LE(s.bytes(), s.memory_budget_bytes() * 5 / 4);
}

TEST_F(ServerDiskTierTest,
       ACorruptedTierFencesTheServerAndAnswersNothingWrong) {
  const std::string tiered = TieredJob();
  ASSERT_NO_FATAL_FAILURE(StartServer(/*standalone=*/true, tiered.c_str()));
  const std::unique_ptr<Table> reference = PlainTable();
  ASSERT_NE(reference, nullptr);
  SparseTable& want = *reference->AsSparse();
  constexpr size_t kKeys = 16000;
  std::vector<uint64_t> keys(kKeys);
  for (size_t i = 0; i < kKeys; ++i) keys[i] = Mix64(i);
  const std::vector<float> grads(kKeys * 16, 0.02f);
  ASSERT_NO_FATAL_FAILURE(PushMixedKeys(0, kKeys));
  want.Push(keys, grads.data());
  EXPECT_TRUE(server_->storage_failure().ok());

  // Every answer that comes is right; the first read of a damaged block
  // fences the server, and that request and every later one are refused.
  std::vector<float> expected(kKeys * 16);
  want.Pull(keys, expected.data());
  size_t answered = 0, refused = 0;
  for (int round = 0; round < 5 && refused == 0; ++round) {
    ASSERT_GT(testing::CorruptTierFiles(TierBase()), 0);
    for (size_t begin = 0; begin < kKeys; begin += 100) {
      const std::vector<uint64_t> part(keys.begin() + begin,
                                       keys.begin() + begin + 100);
      Response r = Pull(5, part);
      if (r.code() == absl::StatusCode::kOk) {
        ASSERT_EQ(refused, 0u) << "answered after the fence";
        ASSERT_EQ(r.values.size(), 100u * 16);
        ASSERT_EQ(std::memcmp(r.values.data(), expected.data() + begin * 16,
                              100 * 16 * sizeof(float)),
                  0)
            << "keys from " << begin;
        ++answered;
        continue;
      }
      EXPECT_EQ(r.code(), absl::StatusCode::kUnavailable);
      EXPECT_EQ(r.header.refusal(), NOT_MEMBER);
      EXPECT_TRUE(r.values.empty());
      EXPECT_NE(r.header.message().find("disk tier of table 'emb'"),
                std::string::npos)
          << r.header.message();
      ++refused;
    }
  }
  EXPECT_GT(refused, 0u) << answered << " pulls answered";
  EXPECT_EQ(server_->storage_failure().code(), absl::StatusCode::kDataLoss)
      << server_->storage_failure();
  // A push is refused too: nothing more is acknowledged.
  Response push = Push(5, {keys[0]}, std::vector<float>(16, 0.02f));
  EXPECT_EQ(push.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(push.header.refusal(), NOT_MEMBER);
}

// Whether a reply is waiting on `socket` within `ms` milliseconds.
bool ReplyWaiting(zmq::socket_t& socket, int ms) {
  zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
  return zmq::poll(&item, 1, std::chrono::milliseconds(ms)) > 0;
}

TEST_F(ServerDiskTierTest,
       APushWaitingForDiskKeepsItsSendersClockBehindItWhileOthersGoOn) {
  ASSERT_NO_FATAL_FAILURE(StartWithHeldReader(TieredJob()));
  // Node 1 (worker rank 0) speaks on client_, node 2 (rank 1) on `other`.
  raw_client::RawClient other(server_->endpoint());

  // Asynchronous first: rows pushed early go to disk as later ones come.
  server_->UpdateView(OwnerView(/*epoch=*/1, /*workers=*/2), 0);
  ASSERT_TRUE(ServingEpoch(1));
  constexpr size_t kKeys = 16000, kPart = kPushPart;
  ASSERT_NO_FATAL_FAILURE(PushMixedKeys(0, kKeys));
  std::vector<uint64_t> cold, hot;
  for (size_t i = 0; i < 50; ++i) {
    cold.push_back(Mix64(i));
    hot.push_back(Mix64(kKeys + 4 * kPart - 1 - i));  // pushed last, below
  }
  Response before = Pull(5, cold);
  ASSERT_EQ(before.code(), absl::StatusCode::kOk);
  ASSERT_GT(server_->stats().tier_waits, 0u)
      << "the early rows are not on disk";
  // The pull took them into RAM: pushes of other rows send them back.
  ASSERT_NO_FATAL_FAILURE(PushMixedKeys(kKeys, kKeys + 4 * kPart));
  const uint64_t waits_before = server_->stats().tier_waits;

  // BSP from here, step 0.
  server_->UpdateView(OwnerView(/*epoch=*/2, /*workers=*/2, BSP), 0);
  ASSERT_TRUE(ServingEpoch(2));
  const uint64_t steps = server_->stats().bsp_steps_applied;
  hold_ = true;
  const std::vector<float> grads(cold.size() * 16, 0.5f);
  RequestHeader push = Header(PUSH, 5, cold.size());
  push.set_sender_node_id(1);
  push.set_clock(0);
  const uint64_t push_id =
      SendOnly(push, Frames(KeysFrame(cold), ValuesFrame(grads)));
  const uint64_t advance_id = Advance(1, 1);
  ASSERT_EQ(HeldReads(), 1) << "the push's rows were not read off the thread";

  // Node 2's push of rows in RAM, and its clock, are answered meanwhile.
  RequestHeader other_push = Header(PUSH, 5, hot.size());
  other_push.set_sender_node_id(2);
  other_push.set_clock(0);
  other.SendFrames(
      Numbered(other_push, Frames(KeysFrame(hot), ValuesFrame(grads))));
  EXPECT_EQ(other.ReceiveHeader().code(), 0);
  RequestHeader other_advance = Header(ADVANCE_CLOCK, 0, 0);
  other_advance.set_sender_node_id(2);
  other_advance.set_clock(1);
  other.SendFrames(Numbered(other_advance, Frames(KeysFrame({}))));
  EXPECT_EQ(other.ReceiveHeader().code(), 0);
  // Both workers are at clock 1, but node 1's clock waits behind its push:
  // step 0 is not applied without it.
  EXPECT_FALSE(ReplyWaiting(client_->socket(), 200));
  EXPECT_EQ(server_->stats().bsp_steps_applied, steps);

  release_.Notify();
  Response pushed = Receive();
  EXPECT_EQ(pushed.code(), absl::StatusCode::kOk) << pushed.header.message();
  EXPECT_EQ(pushed.header.request_id(), push_id);
  Response advanced = Receive();
  EXPECT_EQ(advanced.code(), absl::StatusCode::kOk);
  EXPECT_EQ(advanced.header.request_id(), advance_id);
  // Applied right after the clock's answer is sent.
  const absl::Time applied_by = absl::Now() + absl::Seconds(5);
  while (server_->stats().bsp_steps_applied == steps &&
         absl::Now() < applied_by) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(server_->stats().bsp_steps_applied, steps + 1);
  EXPECT_GE(server_->stats().tier_waits, waits_before + 2);
  // The step applied node 1's gradient to the rows that were on disk.
  Response after = Pull(5, cold);
  ASSERT_EQ(after.code(), absl::StatusCode::kOk);
  ASSERT_EQ(after.values.size(), before.values.size());
  for (size_t i = 0; i < after.values.size(); ++i)
    ASSERT_LT(after.values[i], before.values[i]) << i;
}

TEST_F(ServerDiskTierTest,
       APushHeldForACheckpointWhoseRowsWentToDiskWaitsForThemWhenRunAgain) {
  // The checkpoint's cut is reached while the server hands out requests
  // that waited for the disk; writing it runs again a push its gate held,
  // whose rows have gone to disk since, so that push waits for the disk in
  // turn, from inside that hand-out.
  const std::string dir = TierBase() + "/checkpoints";
  ASSERT_NO_FATAL_FAILURE(StartWithHeldReader(
      absl::StrCat(TieredJob(), " checkpoint { dir: \"", dir, "\" }")));
  // Node 1 (worker rank 0) speaks on client_, node 2 (rank 1) on `other`.
  raw_client::RawClient other(server_->endpoint());
  server_->UpdateView(OwnerView(/*epoch=*/1, /*workers=*/2), 0);
  ASSERT_TRUE(ServingEpoch(1));
  constexpr size_t kKeys = 16000;
  ASSERT_NO_FATAL_FAILURE(PushMixedKeys(0, kKeys));
  // `late`: rows in RAM now (pushed last); `cold`: rows on disk.
  std::vector<uint64_t> late, cold;
  for (size_t i = 0; i < 50; ++i) {
    late.push_back(Mix64(kKeys - 1 - i));
    cold.push_back(Mix64(8000 + i));
  }
  Response before = Pull(5, late);
  ASSERT_EQ(before.code(), absl::StatusCode::kOk);

  // A checkpoint at clock 1; node 2 is there, its push of step 1 is held.
  ClusterView view = OwnerView(/*epoch=*/2, /*workers=*/2);
  view.set_checkpoint_clock(1);
  server_->UpdateView(view, 0);
  ASSERT_TRUE(ServingEpoch(2));
  RequestHeader other_advance = Header(ADVANCE_CLOCK, 0, 0);
  other_advance.set_sender_node_id(2);
  other_advance.set_clock(1);
  other.SendFrames(Numbered(other_advance, Frames(KeysFrame({}))));
  ASSERT_EQ(other.ReceiveHeader().code(), 0);
  const std::vector<float> grads(late.size() * 16, 0.5f);
  RequestHeader held_push = Header(PUSH, 5, late.size());
  held_push.set_sender_node_id(2);
  held_push.set_clock(1);
  other.SendFrames(
      Numbered(held_push, Frames(KeysFrame(late), ValuesFrame(grads))));
  EXPECT_FALSE(ReplyWaiting(other.socket(), 200)) << "the push was not held";

  // Reading 8000 rows from disk sends the held push's rows there.
  std::vector<uint64_t> others;
  for (size_t i = 0; i < 8000; ++i) others.push_back(Mix64(i));
  for (size_t first = 0; first < others.size(); first += kPushPart) {
    const std::vector<uint64_t> part(others.begin() + first,
                                     others.begin() + first + kPushPart);
    ASSERT_EQ(Pull(5, part).code(), absl::StatusCode::kOk);
  }

  // Node 1's push of rows on disk waits for the reader, held here, and its
  // clock waits behind it: both are handed out once the rows are read,
  // and the clock reaches the cut.
  const uint64_t waits_before = server_->stats().tier_waits;
  const uint64_t written_before = server_->stats().checkpoints_written;
  hold_ = true;
  RequestHeader push = Header(PUSH, 5, cold.size());
  push.set_sender_node_id(1);
  push.set_clock(0);
  const uint64_t push_id =
      SendOnly(push, Frames(KeysFrame(cold), ValuesFrame(grads)));
  const uint64_t advance_id = Advance(1, 1);
  ASSERT_EQ(HeldReads(), 1) << "the push's rows were not read off the thread";
  hold_ = false;
  release_.Notify();

  Response pushed = Receive();
  EXPECT_EQ(pushed.code(), absl::StatusCode::kOk) << pushed.header.message();
  EXPECT_EQ(pushed.header.request_id(), push_id);
  Response advanced = Receive();
  EXPECT_EQ(advanced.code(), absl::StatusCode::kOk);
  EXPECT_EQ(advanced.header.request_id(), advance_id);
  // The held push ran again, waited for its rows and is answered.
  ResponseHeader answer = other.ReceiveHeader();
  EXPECT_EQ(answer.code(), 0) << answer.message();
  EXPECT_GE(server_->stats().tier_waits, waits_before + 2)
      << "the held push's rows were not on disk when it ran again";
  const absl::Time written_by = absl::Now() + absl::Seconds(10);
  while (server_->stats().checkpoints_written == written_before &&
         absl::Now() < written_by)
    absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(server_->stats().checkpoints_written, written_before + 1);
  // The push was applied after the cut: its rows moved.
  Response after = Pull(5, late);
  ASSERT_EQ(after.code(), absl::StatusCode::kOk);
  ASSERT_EQ(after.values.size(), before.values.size());
  for (size_t i = 0; i < after.values.size(); ++i)
    ASSERT_LT(after.values[i], before.values[i]) << i;
}

TEST_F(ServerDiskTierTest, APrefetchReadsColdRowsAheadSoTheirPullWaitsForNone) {
  const std::string tiered = TieredJob();
  ASSERT_NO_FATAL_FAILURE(StartServer(/*standalone=*/true, tiered.c_str()));
  // The same pushes on a table without a budget, in this process.
  const std::unique_ptr<Table> reference = PlainTable();
  ASSERT_NE(reference, nullptr);
  SparseTable& want = *reference->AsSparse();
  constexpr size_t kKeys = 16000;
  ASSERT_NO_FATAL_FAILURE(PushMixedKeys(0, kKeys, &want));
  std::vector<uint64_t> cold;
  for (size_t i = 0; i < 200; ++i) cold.push_back(Mix64(i));
  auto table_stats = [&] {
    Response r = SendValid(Header(STATS, 0, 0), Frames(KeysFrame({})));
    EXPECT_EQ(r.header.table_stats_size(), 1);
    return r.header.table_stats_size() == 1 ? r.header.table_stats(0)
                                            : TableStats();
  };
  const uint64_t waits = server_->stats().tier_waits;
  const uint64_t promoted = table_stats().promotions();
  Response prefetch =
      SendValid(Header(PREFETCH, 5, cold.size()), Frames(KeysFrame(cold)));
  ASSERT_EQ(prefetch.code(), absl::StatusCode::kOk)
      << prefetch.header.message();
  EXPECT_TRUE(prefetch.values.empty());
  EXPECT_EQ(server_->stats().keys_prefetched, cold.size());
  // The reads finish off the serving thread (STATS answers meanwhile), and
  // the rows come into RAM.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (table_stats().promotions() < promoted + cold.size() &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  const TableStats staged = table_stats();
  ASSERT_EQ(staged.promotions(), promoted + cold.size());
  EXPECT_GE(staged.rows_read_ahead(), cold.size());
  EXPECT_EQ(staged.staged_rows(), 0u);
  // The pull finds every row in RAM: no wait, no disk read, the rows as
  // they were.
  Response pulled = Pull(5, cold);
  ASSERT_EQ(pulled.code(), absl::StatusCode::kOk);
  EXPECT_EQ(server_->stats().tier_waits, waits);
  const TableStats after = table_stats();
  EXPECT_EQ(after.cold_reads(), staged.cold_reads());
  EXPECT_EQ(after.disk_reads(), staged.disk_reads());
  std::vector<float> expected(cold.size() * 16);
  want.Pull(cold, expected.data());
  ASSERT_EQ(pulled.values.size(), expected.size());
  EXPECT_EQ(std::memcmp(pulled.values.data(), expected.data(),
                        expected.size() * sizeof(float)),
            0);
  // A push of them finds them in RAM too.
  ASSERT_EQ(Push(5, cold, std::vector<float>(cold.size() * 16, 0.02f)).code(),
            absl::StatusCode::kOk);
  EXPECT_EQ(server_->stats().tier_waits, waits);
  EXPECT_EQ(table_stats().promotions(), staged.promotions());

  // Malformed hints are refused like any request; unknown tables too.
  uint64_t errors = server_->stats().errors;
  EXPECT_EQ(
      SendValid(Header(PREFETCH, 5, 1),
                Frames(KeysFrame({1}), ValuesFrame(std::vector<float>(16))))
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SendValid(Header(PREFETCH, 9, 1), Frames(KeysFrame({1}))).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(server_->stats().errors, errors + 2);
}

TEST_F(ServerDiskTierTest,
       TheTierDirectoryLivesWithTheServerAndACrashedOnesGoes) {
  // A tier directory left by a crashed server: its lock file, unlocked.
  const std::string stale = TierBase() + "/tiered/server-1-0";
  std::filesystem::create_directories(stale + "/table-5");
  {
    const int fd =
        open((stale + "/owner.lock").c_str(), O_CREAT | O_RDWR, 0600);
    close(fd);
  }
  // One another live process holds: left alone.
  const std::string live = TierBase() + "/tiered/server-2-0";
  std::filesystem::create_directories(live);
  const int live_fd =
      open((live + "/owner.lock").c_str(), O_CREAT | O_RDWR, 0600);
  ASSERT_GE(live_fd, 0);
  // flock locks belong to the open file: a second open of the file (the
  // server's probe) cannot take it while this one holds it.
  ASSERT_EQ(flock(live_fd, LOCK_EX | LOCK_NB), 0);

  const std::string tiered = TieredJob("EVICT_LFU");
  ASSERT_NO_FATAL_FAILURE(StartServer(/*standalone=*/true, tiered.c_str()));
  EXPECT_FALSE(std::filesystem::exists(stale));
  EXPECT_TRUE(std::filesystem::exists(live));
  size_t mine = 0;
  for (const auto& e :
       std::filesystem::directory_iterator(TierBase() + "/tiered")) {
    if (e.path() != live) {
      ++mine;
      EXPECT_TRUE(std::filesystem::exists(e.path() / "table-5")) << e.path();
    }
  }
  EXPECT_EQ(mine, 1u);
  server_.reset();
  size_t left = 0;
  for (const auto& e :
       std::filesystem::directory_iterator(TierBase() + "/tiered")) {
    EXPECT_EQ(e.path(), live);
    ++left;
  }
  EXPECT_EQ(left, 1u);
  close(live_fd);
}

}  // namespace
}  // namespace ps
