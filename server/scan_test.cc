// The SCAN op: SparseTable::Scan paging, and a server answering SCAN
// requests over a real socket (validation, paging, consistency holds).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/config.h"
#include "common/hash.h"
#include "common/status.h"
#include "common/wire.h"
#include "gtest/gtest.h"
#include "proto/data_plane.pb.h"
#include "proto/scheduler.pb.h"
#include "server/server_test_fixture.h"
#include "server/table.h"
#include "zmq.hpp"

namespace ps {
namespace {

// --------------------------------------------------------- SparseTable

TableConfig SparseConfig(uint32_t dim) {
  TableConfig c;
  c.set_id(5);
  c.set_name("emb");
  c.mutable_sparse()->set_dim(dim);
  // Adagrad keeps per-element state, which a scan must leave out.
  AdagradConfig* adagrad = c.mutable_optimizer()->mutable_adagrad();
  adagrad->set_learning_rate(0.1f);
  adagrad->set_initial_accumulator(0.1f);
  adagrad->set_epsilon(1e-8f);
  c.mutable_init()->set_kind(InitializerConfig::UNIFORM);
  c.mutable_init()->set_scale(1.0f);
  return c;
}

std::unique_ptr<Table> MustCreate(const TableConfig& config) {
  auto table = Table::Create(config);
  EXPECT_TRUE(table.ok()) << table.status();
  return table.ok() ? std::move(table).value() : nullptr;
}

// Every row as key -> weights, read by paging with the given sizes.
std::map<uint64_t, std::vector<float>> ScanAll(const SparseTable& t,
                                               size_t max_rows,
                                               size_t max_slots,
                                               int* pages = nullptr) {
  std::map<uint64_t, std::vector<float>> rows;
  uint64_t cursor = 0;
  int n = 0;
  do {
    std::vector<uint64_t> keys;
    std::vector<float> values;
    const uint64_t next = t.Scan(cursor, max_rows, max_slots, &keys, &values);
    EXPECT_LE(keys.size(), max_rows);
    EXPECT_EQ(values.size(), keys.size() * t.dim());
    if (next != 0) {
      EXPECT_GT(next, cursor);
    }
    for (size_t i = 0; i < keys.size(); ++i) {
      const bool inserted =
          rows.emplace(keys[i],
                       std::vector<float>(values.begin() + i * t.dim(),
                                          values.begin() + (i + 1) * t.dim()))
              .second;
      EXPECT_TRUE(inserted) << "key " << keys[i] << " scanned twice";
    }
    cursor = next;
    ++n;
  } while (cursor != 0 && n < 1000000);
  if (pages != nullptr) *pages = n;
  return rows;
}

// The rows Pull answers for `keys`.
std::map<uint64_t, std::vector<float>> PullAll(
    SparseTable& t, const std::vector<uint64_t>& keys) {
  std::vector<float> out(keys.size() * t.dim());
  t.Pull(keys, out.data());
  std::map<uint64_t, std::vector<float>> rows;
  for (size_t i = 0; i < keys.size(); ++i) {
    rows[keys[i]].assign(out.begin() + i * t.dim(),
                         out.begin() + (i + 1) * t.dim());
  }
  return rows;
}

TEST(SparseTableScanTest, PagesVisitEveryRowOnceWithItsWeights) {
  auto table = MustCreate(SparseConfig(3));
  SparseTable& t = *table->AsSparse();
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 1000; ++k)
    keys.push_back(k * 7919 + (k % 3) * (1ULL << 40));
  std::vector<float> grads(keys.size() * 3);
  for (size_t i = 0; i < grads.size(); ++i)
    grads[i] = 0.01f * static_cast<float>(i % 17);
  t.Push(keys, grads.data());
  const auto want = PullAll(t, keys);
  ASSERT_EQ(want.size(), 1000u);

  for (size_t page : {1, 7, 999, 1000, 5000}) {
    SCOPED_TRACE(absl::StrCat("page of ", page));
    int pages = 0;
    EXPECT_EQ(ScanAll(t, page, kU64Max, &pages), want);
    if (page == 1) {
      EXPECT_GE(pages, 1000);
    }
  }
  // Few slots per page: pages may come back short or empty, and paging
  // still reaches every row.
  int pages = 0;
  EXPECT_EQ(ScanAll(t, 1000, 3, &pages), want);
  EXPECT_GT(pages, 300);
}

TEST(SparseTableScanTest, AnyCursorIsSafeAndOnePastTheEndEnds) {
  auto table = MustCreate(SparseConfig(2));
  SparseTable& t = *table->AsSparse();
  std::vector<uint64_t> keys;
  std::vector<uint64_t> got;
  std::vector<float> values;
  // Empty table: nothing, done.
  EXPECT_EQ(t.Scan(0, 10, 100, &got, &values), 0u);
  EXPECT_TRUE(got.empty());

  for (uint64_t k = 0; k < 50; ++k) keys.push_back(k);
  std::vector<float> grads(keys.size() * 2, 0.5f);
  t.Push(keys, grads.data());
  for (uint64_t cursor : {uint64_t{1} << 20, uint64_t{1} << 32,
                          uint64_t{1} << 63, kU64Max - 1, kU64Max}) {
    SCOPED_TRACE(cursor);
    got.clear();
    values.clear();
    EXPECT_EQ(t.Scan(cursor, 10, 100, &got, &values), 0u);
    EXPECT_TRUE(got.empty());
    EXPECT_TRUE(values.empty());
  }
  // Every cursor below the end gives a page without crashing, and paging on
  // from any of them ends.
  for (uint64_t cursor = 0; cursor < 200; ++cursor) {
    uint64_t c = cursor;
    int pages = 0;
    do {
      got.clear();
      values.clear();
      const uint64_t next = t.Scan(c, 4, 16, &got, &values);
      EXPECT_EQ(values.size(), got.size() * 2);
      if (next != 0) {
        ASSERT_GT(next, c);
      }
      c = next;
    } while (c != 0 && ++pages < 1000);
    EXPECT_EQ(c, 0u);
  }
  // Zero rows or slots per page: nothing, done (the server never asks).
  got.clear();
  EXPECT_EQ(t.Scan(0, 0, 100, &got, &values), 0u);
  EXPECT_EQ(t.Scan(0, 10, 0, &got, &values), 0u);
  EXPECT_TRUE(got.empty());
}

TEST(SparseTableScanTest, DroppedRowsAreNotScannedAndScanTouchesNothing) {
  TableConfig c = SparseConfig(2);
  c.mutable_sparse()->set_ttl_steps(2);
  auto table = MustCreate(c);
  SparseTable& t = *table->AsSparse();
  t.Advance(0, absl::UnixEpoch());
  std::vector<uint64_t> old_keys = {1, 2, 3, 4, 5};
  std::vector<float> grads(old_keys.size() * 2, 1.0f);
  t.Push(old_keys, grads.data());
  t.Advance(2, absl::UnixEpoch());
  std::vector<uint64_t> new_keys = {10, 11, 12};
  t.Push(new_keys, grads.data());
  // A scan before the old rows expire must not refresh them.
  EXPECT_EQ(ScanAll(t, 100, kU64Max).size(), 8u);
  const uint64_t pulled = t.counters().keys_pulled;
  t.Advance(3, absl::UnixEpoch());
  ASSERT_EQ(t.num_rows(), 3u);
  EXPECT_EQ(t.counters().keys_pulled, pulled);
  // Freed rows (kept for reuse) are not returned.
  EXPECT_EQ(ScanAll(t, 2, kU64Max), PullAll(t, new_keys));
}

// --------------------------------------------------------------- server

// Table 0: sparse, dim 3, Adagrad (state the scan must leave out), random
// init. Table 1: dense. The ids match the fixture's kSparse and kDense.
constexpr char kScanConfig[] = R"pb(
  cluster { num_servers: 2 num_workers: 1 num_slots: 16 }
  tables {
    id: 0
    name: "emb"
    sparse { dim: 3 }
    optimizer { adagrad { learning_rate: 0.1 } }
    init { kind: UNIFORM scale: 1 }
  }
  tables {
    id: 1
    name: "dense"
    dense { size: 10 block_size: 4 }
    optimizer { sgd { learning_rate: 0.5 } }
  }
)pb";

constexpr uint32_t kDim = 3;

// A SCAN page as the client decodes it (common/wire.h): the fixture's
// Response (header, the rows' values) and the rows' keys.
struct Page : Response {
  std::vector<uint64_t> keys;
};

// The server of server_test_fixture.h over kScanConfig; SCAN replies carry
// a third frame (the keys), so they are read with ReceivePage.
class ScanServerTest : public ServerTest {
 protected:
  void SetUp() override { StartServer(/*standalone=*/true, kScanConfig); }

  // The next response, decoded as the client does (common/wire.h).
  Page ReceivePage() {
    Page r;
    std::vector<zmq::message_t> frames = ReceiveFrames();
    if (frames.empty()) return r;
    DecodedResponse d;
    const absl::Status s = DecodeResponse(frames, &d);
    EXPECT_TRUE(s.ok()) << s;
    r.received = s.ok();
    r.header = d.header;
    r.values.assign(d.values.begin(), d.values.end());
    r.keys.assign(d.keys.begin(), d.keys.end());
    return r;
  }

  // Sends a SCAN request (with its empty keys frame) without waiting for
  // its page; returns its request id.
  uint64_t SendScan(RequestHeader scan) {
    return SendOnly(std::move(scan), Frames(KeysFrame({})));
  }

  Page Scan(uint32_t table, uint64_t cursor, uint64_t max_rows) {
    const uint64_t id = SendScan(ScanHeader(table, cursor, max_rows));
    Page r = ReceivePage();
    if (r.received) {
      EXPECT_EQ(r.header.request_id(), id);
    }
    return r;
  }

  // A push to table 0 as worker node 1 (servers in a view refuse other
  // senders) at `clock`.
  Response PushAt(const std::vector<uint64_t>& keys,
                  const std::vector<float>& grads, uint64_t clock = 0) {
    RequestHeader h = Header(PUSH, kSparse, keys.size());
    h.set_clock(clock);
    h.set_sender_node_id(1);
    return SendValid(h, Frames(KeysFrame(keys), ValuesFrame(grads)));
  }

  // Pages through table 0 with `max_rows` per page.
  std::map<uint64_t, std::vector<float>> ScanAllRows(uint64_t max_rows,
                                                     int* pages = nullptr) {
    std::map<uint64_t, std::vector<float>> rows;
    uint64_t cursor = 0;
    int n = 0;
    do {
      Page r = Scan(kSparse, cursor, max_rows);
      EXPECT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
      if (r.code() != absl::StatusCode::kOk) break;
      EXPECT_LE(r.keys.size(), max_rows == 0 ? kDefaultScanRows : max_rows);
      EXPECT_EQ(r.values.size(), r.keys.size() * kDim);
      if (r.header.next_cursor() != 0) {
        EXPECT_GT(r.header.next_cursor(), cursor);
      }
      for (size_t i = 0; i < r.keys.size(); ++i) {
        EXPECT_TRUE(
            rows.emplace(r.keys[i],
                         std::vector<float>(r.values.begin() + i * kDim,
                                            r.values.begin() + (i + 1) * kDim))
                .second)
            << "key " << r.keys[i] << " scanned twice";
      }
      cursor = r.header.next_cursor();
      ++n;
    } while (cursor != 0 && n < 100000);
    if (pages != nullptr) *pages = n;
    return rows;
  }

  std::map<uint64_t, std::vector<float>> PullRows(
      const std::vector<uint64_t>& keys) {
    Response r = Pull(kSparse, keys);
    EXPECT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
    std::map<uint64_t, std::vector<float>> rows;
    for (size_t i = 0; i < keys.size() && r.values.size() == keys.size() * kDim;
         ++i) {
      rows[keys[i]].assign(r.values.begin() + i * kDim,
                           r.values.begin() + (i + 1) * kDim);
    }
    return rows;
  }

  // Pushes gradients for keys 0, 100, ..., 100 * (n - 1).
  std::vector<uint64_t> PushKeys(int n) {
    std::vector<uint64_t> keys;
    for (int i = 0; i < n; ++i) keys.push_back(uint64_t{100} * i);
    std::vector<float> grads(keys.size() * kDim);
    for (size_t i = 0; i < grads.size(); ++i)
      grads[i] = 0.125f * (i % 5) - 0.25f;
    Response r = PushAt(keys, grads);
    EXPECT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
    return keys;
  }
};

TEST_F(ScanServerTest, SmallPagesReturnExactlyThePushedRowsWithPulledWeights) {
  // An empty table: one empty page, done.
  Page r = Scan(kSparse, 0, 10);
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_TRUE(r.keys.empty());
  EXPECT_EQ(r.header.next_cursor(), 0u);

  const std::vector<uint64_t> keys = PushKeys(500);
  // A pull of a key without a row creates none, so it is not scanned.
  ASSERT_EQ(Pull(kSparse, {7}).code(), absl::StatusCode::kOk);
  const auto want = PullRows(keys);
  ASSERT_EQ(want.size(), 500u);
  int pages = 0;
  EXPECT_EQ(ScanAllRows(7, &pages), want);
  EXPECT_GE(pages, 500 / 7);
  // The default page (0) holds all 500.
  EXPECT_EQ(ScanAllRows(0, &pages), want);
  EXPECT_EQ(pages, 1);
  EXPECT_EQ(ScanAllRows(kMaxScanRows, &pages), want);
  EXPECT_EQ(pages, 1);
  EXPECT_EQ(server_->stats().errors, 0u);
}

TEST_F(ScanServerTest, BadRequestsAreRefusedAndGarbageCursorsEndTheScan) {
  const std::vector<uint64_t> keys = PushKeys(20);
  const auto want = PullRows(keys);
  using Code = absl::StatusCode;

  EXPECT_EQ(Scan(9, 0, 10).code(), Code::kNotFound);
  Page r = Scan(kDense, 0, 10);
  EXPECT_EQ(r.code(), Code::kInvalidArgument);
  EXPECT_NE(r.header.message().find("dense"), std::string::npos)
      << r.header.message();
  for (uint64_t rows : {kMaxScanRows + 1, uint64_t{1} << 40, kU64Max}) {
    r = Scan(kSparse, 0, rows);
    EXPECT_EQ(r.code(), Code::kInvalidArgument) << rows;
    EXPECT_TRUE(r.keys.empty());
  }
  // Keys, segments or a values frame: malformed.
  {
    RequestHeader h = ScanHeader(kSparse, 0, 10);
    h.set_num_keys(1);
    EXPECT_EQ(SendValid(h, Frames(KeysFrame({0}))).code(),
              Code::kInvalidArgument);
  }
  {
    RequestHeader h = ScanHeader(kSparse, 0, 10);
    DenseSegment* s = h.add_segments();
    s->set_begin(0);
    s->set_length(1);
    EXPECT_EQ(SendValid(h, Frames(KeysFrame({}))).code(),
              Code::kInvalidArgument);
  }
  EXPECT_EQ(SendValid(ScanHeader(kSparse, 0, 10),
                      Frames(KeysFrame({}), ValuesFrame({1, 2, 3})))
                .code(),
            Code::kInvalidArgument);
  {
    // Header only, no keys frame: refused before the header is read, so
    // no request id comes back.
    SendOnly(ScanHeader(kSparse, 0, 10), {});
    EXPECT_EQ(Receive().code(), Code::kInvalidArgument);
  }
  EXPECT_EQ(server_->stats().errors, 9u);

  // A cursor past the end (stale, or garbage) ends the scan: OK, empty.
  for (uint64_t cursor : {uint64_t{1} << 20, uint64_t{1} << 40, kU64Max}) {
    r = Scan(kSparse, cursor, 10);
    ASSERT_EQ(r.code(), Code::kOk) << r.header.message();
    EXPECT_TRUE(r.keys.empty());
    EXPECT_TRUE(r.values.empty());
    EXPECT_EQ(r.header.next_cursor(), 0u);
  }
  // Every small cursor answers a page; none crashes the server.
  for (uint64_t cursor = 1; cursor < 64; ++cursor) {
    r = Scan(kSparse, cursor, 3);
    ASSERT_EQ(r.code(), Code::kOk) << r.header.message();
    EXPECT_EQ(r.values.size(), r.keys.size() * kDim);
  }
  // Nothing changed.
  EXPECT_EQ(ScanAllRows(4), want);
  EXPECT_EQ(PullRows(keys), want);
}

// Rows of slots this server no longer owns are still exported.
TEST_F(ScanServerTest, RowsOfSlotsNoLongerOwnedAreScanned) {
  ASSERT_NO_FATAL_FAILURE(StartServer(/*standalone=*/false, kScanConfig));
  ClusterView view = OwnerView(/*epoch=*/1, /*workers=*/1);
  ASSERT_NO_FATAL_FAILURE(InstallView(view));
  const std::vector<uint64_t> keys = PushKeys(50);
  const auto want = PullRows(keys);

  // Now server 1 owns every slot: pulls are refused, the scan is not.
  view.set_epoch(2);
  for (int s = 0; s < 16; ++s) view.set_slot_owner(s, 1);
  server_->UpdateView(view, 0);
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (Pull(kSparse, {0}).code() == absl::StatusCode::kOk &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(Pull(kSparse, {0}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ScanAllRows(16), want);
}

// Under BSP a scan is held like a pull until the steps before its clock
// are applied, so it sees them.
TEST_F(ScanServerTest, ScanWaitsForBufferedStepsUnderBsp) {
  const std::string bsp =
      absl::StrCat(kScanConfig, "consistency { mode: BSP }");
  ASSERT_NO_FATAL_FAILURE(StartServer(/*standalone=*/false, bsp.c_str()));
  ASSERT_NO_FATAL_FAILURE(
      InstallView(OwnerView(/*epoch=*/1, /*workers=*/1, BSP)));
  // Step 0's push is buffered until worker 1 finishes step 0.
  const std::vector<uint64_t> keys = {11, 12};
  ASSERT_EQ(
      PushAt(keys, std::vector<float>(2 * kDim, 1.0f), /*clock=*/0).code(),
      absl::StatusCode::kOk);
  RequestHeader scan = ScanHeader(kSparse, 0, 0);
  scan.set_clock(1);
  const uint64_t scan_id = SendScan(scan);
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(server_->stats().pulls_deferred, 1u);

  Advance(/*node=*/1, /*clock=*/1);
  Page replies[2] = {ReceivePage(), ReceivePage()};
  const Page& scanned =
      replies[0].header.request_id() == scan_id ? replies[0] : replies[1];
  ASSERT_EQ(scanned.header.request_id(), scan_id);
  ASSERT_EQ(scanned.code(), absl::StatusCode::kOk) << scanned.header.message();
  std::vector<uint64_t> got = scanned.keys;
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, keys);
  EXPECT_EQ(scanned.header.next_cursor(), 0u);
}

}  // namespace
}  // namespace ps
