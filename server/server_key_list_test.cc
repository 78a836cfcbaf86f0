// KVServer over a real socket: cached key lists (also of held requests)
// and half-width value encodings.
#include "server/server_test_fixture.h"

namespace ps {
namespace {

// ---------------------------------------------------- key-list caching

// A request of worker node `node` naming key-list slot `slot` with `digest`
// (RequestHeader.key_list_slot and key_list_digest).
RequestHeader ListHeader(Op op, uint32_t table, uint64_t num_keys,
                         uint32_t slot, uint64_t digest, uint64_t node = 1) {
  RequestHeader h = Header(op, table, num_keys);
  h.set_key_list_slot(slot);
  h.set_key_list_digest(digest);
  h.set_sender_node_id(node);
  return h;
}

uint64_t DigestOf(const std::vector<uint64_t>& keys) {
  return KeyListDigest(keys);
}

// `values` in a 2-byte encoding, as a values frame.
zmq::message_t HalfFrame(ValueEncoding encoding,
                         const std::vector<float>& values) {
  std::string bytes(values.size() * 2, '\0');
  EncodeValues(encoding, values.data(), values.size(), bytes.data());
  return BytesFrame(bytes);
}

// What `values` become after a trip through `encoding`.
std::vector<float> RoundTrip(ValueEncoding encoding,
                             const std::vector<float>& values) {
  std::string bytes(values.size() * EncodedValueBytes(encoding), '\0');
  EncodeValues(encoding, values.data(), values.size(), bytes.data());
  std::vector<float> out(values.size());
  DecodeValues(encoding, bytes.data(), out.size(), out.data());
  return out;
}

std::vector<float> Scaled(float factor, const std::vector<float>& values) {
  std::vector<float> out;
  for (float v : values) out.push_back(factor * v);
  return out;
}

TEST_F(ServerTest, KeyListStoredByAPullServesLaterRequestsWithoutKeys) {
  const std::vector<uint64_t> keys = {42, 7, 99};
  const uint64_t digest = DigestOf(keys);
  Response r = SendValid(ListHeader(PULL, kSparse, 3, 5, digest),
                         Frames(KeysFrame(keys)));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, std::vector<float>(6, 0.0f));
  EXPECT_FALSE(r.header.key_list_unknown());

  // A push with an empty keys frame (num_keys set) applies to exactly the
  // stored keys, in their stored order; key 5 is untouched.
  r = SendValid(ListHeader(PUSH, kSparse, 3, 5, digest),
                Frames(KeysFrame({}), ValuesFrame({1, 2, 3, 4, 5, 6})));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  r = Pull(kSparse, {7, 42, 99, 5});
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, (std::vector<float>{-1.5, -2, -0.5, -1, -2.5, -3, 0, 0}));

  // PUSH_PULL and PULL through the list answer in the list's order.
  r = SendValid(ListHeader(PUSH_PULL, kSparse, 3, 5, digest),
                Frames(KeysFrame({}), ValuesFrame({2, 2, 2, 2, 2, 2})));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, (std::vector<float>{-1.5, -2, -2.5, -3, -3.5, -4}));
  r = SendValid(ListHeader(PULL, kSparse, 3, 5, digest), Frames(KeysFrame({})));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, (std::vector<float>{-1.5, -2, -2.5, -3, -3.5, -4}));
  // Keys taken from the cache count like keys sent.
  EXPECT_EQ(server_->stats().keys_pushed, 6u);
  EXPECT_EQ(server_->stats().keys_pulled, 3u + 4u + 3u + 3u);
  EXPECT_EQ(server_->stats().errors, 0u);

  // Slots belong to their sender: node 2's slot 5 holds nothing.
  r = SendValid(ListHeader(PULL, kSparse, 3, 5, digest, /*node=*/2),
                Frames(KeysFrame({})));
  EXPECT_EQ(r.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(r.header.key_list_unknown());

  // A push stores its list too, here in the last slot, for node 2; node
  // 1's slot 5 is unaffected.
  const std::vector<uint64_t> other = {1000, 1001};
  r = SendValid(ListHeader(PUSH, kSparse, 2, kKeyListSlots, DigestOf(other), 2),
                Frames(KeysFrame(other), ValuesFrame({1, 1, 1, 1})));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  r = SendValid(
      ListHeader(PUSH_PULL, kSparse, 2, kKeyListSlots, DigestOf(other), 2),
      Frames(KeysFrame({}), ValuesFrame({1, 1, 1, 1})));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, std::vector<float>(4, -1.0f));
  r = SendValid(ListHeader(PULL, kSparse, 3, 5, digest), Frames(KeysFrame({})));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, (std::vector<float>{-1.5, -2, -2.5, -3, -3.5, -4}));

  // Storing another list in a slot replaces the old one.
  const std::vector<uint64_t> third = {7};
  r = SendValid(ListHeader(PULL, kSparse, 1, 5, DigestOf(third)),
                Frames(KeysFrame(third)));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  r = SendValid(ListHeader(PULL, kSparse, 3, 5, digest), Frames(KeysFrame({})));
  EXPECT_EQ(r.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(r.header.key_list_unknown());
  r = SendValid(ListHeader(PULL, kSparse, 1, 5, DigestOf(third)),
                Frames(KeysFrame({})));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, (std::vector<float>{-2.5, -3}));
}

TEST_F(ServerTest, UnknownKeyListIsRefusedAsKeyListUnknownAndChangesNothing) {
  ASSERT_EQ(Push(kSparse, {7, 42}, {1, 2, 3, 4}).code(), absl::StatusCode::kOk);
  ASSERT_EQ(DensePush({{0, 4}, {4, 4}, {8, 2}}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10})
                .code(),
            absl::StatusCode::kOk);
  const std::vector<float> baseline = Snapshot();
  const std::vector<uint64_t> keys = {7, 42};
  const uint64_t digest = DigestOf(keys);
  Response r = SendValid(ListHeader(PULL, kSparse, 2, 3, digest),
                         Frames(KeysFrame(keys)));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();

  struct Case {
    const char* name;
    RequestHeader header;
    std::vector<float> values;  // empty: no values frame (a PULL)
  };
  const std::vector<float> two_keys = {8, 8, 8, 8};
  const Case cases[] = {
      {"slot never stored", ListHeader(PUSH, kSparse, 2, 4, digest), two_keys},
      {"slot of another sender", ListHeader(PUSH, kSparse, 2, 3, digest, 2),
       two_keys},
      {"digest of another list",
       ListHeader(PUSH, kSparse, 2, 3, DigestOf({7, 43})), two_keys},
      {"digest of the keys reordered",
       ListHeader(PUSH, kSparse, 2, 3, DigestOf({42, 7})), two_keys},
      {"digest 0", ListHeader(PUSH, kSparse, 2, 3, 0), two_keys},
      {"more keys than stored", ListHeader(PUSH, kSparse, 3, 3, digest),
       std::vector<float>(6, 8)},
      {"fewer keys than stored",
       ListHeader(PUSH, kSparse, 1, 3, digest),
       {8, 8}},
      {"push-pull", ListHeader(PUSH_PULL, kSparse, 2, 4, digest), two_keys},
      {"pull", ListHeader(PULL, kSparse, 2, 4, digest), {}},
      {"pull with a wrong count", ListHeader(PULL, kSparse, 1, 3, digest), {}},
      {"slot 64 never stored",
       ListHeader(PULL, kSparse, 2, kKeyListSlots, digest),
       {}},
  };
  uint64_t errors = server_->stats().errors;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<zmq::message_t> rest = Frames(KeysFrame({}));
    if (!c.values.empty()) rest.push_back(ValuesFrame(c.values));
    r = SendValid(c.header, std::move(rest));
    ASSERT_NO_FATAL_FAILURE(ExpectRefusedWithoutEffect(
        r, absl::StatusCode::kFailedPrecondition, &errors, baseline));
    EXPECT_TRUE(r.header.key_list_unknown());
  }
  // The failed look-ups left the stored list in place.
  r = SendValid(ListHeader(PUSH_PULL, kSparse, 2, 3, digest),
                Frames(KeysFrame({}), ValuesFrame({2, 2, 2, 2})));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_FALSE(r.header.key_list_unknown());
  EXPECT_EQ(r.values, (std::vector<float>{-1.5, -2, -2.5, -3}));
}

TEST_F(ServerTest, KeyListStoresAndSlotsAreChecked) {
  ASSERT_EQ(Push(kSparse, {7, 42}, {1, 2, 3, 4}).code(), absl::StatusCode::kOk);
  const std::vector<float> baseline = Snapshot();
  const std::vector<uint64_t> keys = {7, 42};
  const uint64_t digest = DigestOf(keys);
  auto with_digest = [](RequestHeader h, uint64_t d) {
    h.set_key_list_digest(d);
    return h;
  };
  RequestHeader assign = Header(ASSIGN, kDense, 0, {{0, 2}});
  assign.set_key_list_slot(1);
  RequestHeader advance = Header(ADVANCE_CLOCK, 0, 0);
  advance.set_key_list_slot(1);
  advance.set_clock(1);
  RequestHeader stats = Header(STATS, 0, 0);
  stats.set_key_list_slot(1);
  struct Case {
    const char* name;
    std::function<std::vector<zmq::message_t>()> frames;
  };
  const Case cases[] = {
      {"store whose digest is another list's",
       [&] {
         return Frames(
             HeaderFrame(ListHeader(PUSH, kSparse, 2, 3, DigestOf({7, 43}))),
             KeysFrame(keys), ValuesFrame({8, 8, 8, 8}));
       }},
      {"store whose digest is of the keys reordered",
       [&] {
         return Frames(HeaderFrame(ListHeader(PUSH_PULL, kSparse, 2, 3,
                                              DigestOf({42, 7}))),
                       KeysFrame(keys), ValuesFrame({8, 8, 8, 8}));
       }},
      {"pull storing with digest 0",
       [&] {
         return Frames(HeaderFrame(ListHeader(PULL, kSparse, 2, 3, 0)),
                       KeysFrame(keys));
       }},
      {"slot 0 with an empty keys frame",
       [&] {
         return Frames(
             HeaderFrame(with_digest(Header(PUSH, kSparse, 2), digest)),
             KeysFrame({}), ValuesFrame({8, 8, 8, 8}));
       }},
      {"slot 0 pull with an empty keys frame",
       [&] {
         return Frames(
             HeaderFrame(with_digest(Header(PULL, kSparse, 2), digest)),
             KeysFrame({}));
       }},
      {"slot 65 with keys",
       [&] {
         return Frames(HeaderFrame(ListHeader(PULL, kSparse, 2,
                                              kKeyListSlots + 1, digest)),
                       KeysFrame(keys));
       }},
      {"slot 65 without keys",
       [&] {
         return Frames(HeaderFrame(ListHeader(PUSH, kSparse, 2,
                                              kKeyListSlots + 1, digest)),
                       KeysFrame({}), ValuesFrame({8, 8, 8, 8}));
       }},
      {"slot 2^32 - 1",
       [&] {
         return Frames(
             HeaderFrame(ListHeader(PULL, kSparse, 2, 0xffffffffu, digest)),
             KeysFrame(keys));
       }},
      {"slot on an ASSIGN",
       [&] {
         return Frames(HeaderFrame(assign), KeysFrame({}), ValuesFrame({8, 8}));
       }},
      {"slot on an ADVANCE_CLOCK",
       [&] { return Frames(HeaderFrame(advance), KeysFrame({})); }},
      {"slot on a STATS",
       [&] { return Frames(HeaderFrame(stats), KeysFrame({})); }},
  };
  uint64_t errors = server_->stats().errors;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Response r = Send(c.frames());
    ASSERT_NO_FATAL_FAILURE(ExpectRefusedWithoutEffect(
        r, absl::StatusCode::kInvalidArgument, &errors, baseline));
    EXPECT_FALSE(r.header.key_list_unknown());
  }
  // The refused stores stored nothing in slot 3.
  for (uint64_t d : {digest, DigestOf({7, 43}), DigestOf({42, 7})}) {
    Response r =
        SendValid(ListHeader(PULL, kSparse, 2, 3, d), Frames(KeysFrame({})));
    EXPECT_EQ(r.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(r.header.key_list_unknown());
  }
  // A refused store drops what the slot held (the sender's record of the
  // slot names the new list).
  Response r = SendValid(ListHeader(PULL, kSparse, 2, 6, digest),
                         Frames(KeysFrame(keys)));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  r = SendValid(ListHeader(PULL, kSparse, 2, 6, DigestOf({1, 2})),
                Frames(KeysFrame(keys)));
  EXPECT_EQ(r.code(), absl::StatusCode::kInvalidArgument);
  r = SendValid(ListHeader(PULL, kSparse, 2, 6, digest), Frames(KeysFrame({})));
  EXPECT_EQ(r.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(r.header.key_list_unknown());
  // Slots 1 and 64 are both usable.
  for (uint32_t slot : {1u, kKeyListSlots}) {
    SCOPED_TRACE(slot);
    r = SendValid(ListHeader(PULL, kSparse, 2, slot, digest),
                  Frames(KeysFrame(keys)));
    ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
    r = SendValid(ListHeader(PULL, kSparse, 2, slot, digest),
                  Frames(KeysFrame({})));
    ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
    EXPECT_EQ(r.values, (std::vector<float>{-0.5, -1, -1.5, -2}));
  }
}

// Two identical tables whose budget holds fewer rows than the keys pushed,
// so pushes evict (LRU): one used through cached key lists, whose rows the
// server remembers (server/row_memo.h), the other with keys in every
// request. Random initial values would differ between them (they depend on
// the table id); each row's gradients make its values its own.
constexpr char kMemoConfig[] = R"pb(
  cluster { num_servers: 1 num_workers: 1 num_slots: 16 }
  tables {
    id: 1
    name: "cached"
    sparse { dim: 128 memory_budget_bytes: 1048576 eviction: EVICT_LRU }
    optimizer { adagrad { learning_rate: 0.1 } }
    init { kind: CONSTANT value: 0.5 }
  }
  tables {
    id: 2
    name: "plain"
    sparse { dim: 128 memory_budget_bytes: 1048576 eviction: EVICT_LRU }
    optimizer { adagrad { learning_rate: 0.1 } }
    init { kind: CONSTANT value: 0.5 }
  }
)pb";

class RowMemoServerTest : public ServerTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(StartServer(true, kMemoConfig));
  }
};

// Steps through cached lists (pull, then push of the same list, as a
// worker's step does; sometimes a second push or a PUSH_PULL) answer and
// evict exactly as the same steps with keys do, while other lists' pushes
// evict rows the cached lists' memos name.
TEST_F(RowMemoServerTest, CachedListsAnswerAsKeysDoWhileRowsAreEvicted) {
  constexpr size_t kLists = 4, kKeys = 600, kDim = 128;
  std::vector<std::vector<uint64_t>> lists(kLists,
                                           std::vector<uint64_t>(kKeys));
  uint64_t s = 11;
  for (auto& list : lists) {
    for (size_t i = 0; i < kKeys; ++i) {
      s = Mix64(s);
      list[i] = i % 9 == 8 ? list[i - 1] : s % 4000;
    }
  }
  std::vector<bool> stored(kLists, false);
  for (int round = 0; round < 24; ++round) {
    SCOPED_TRACE(round);
    const size_t l = (round * 3 + round / 5) % kLists;
    const uint32_t slot = static_cast<uint32_t>(l) + 1;
    const uint64_t digest = DigestOf(lists[l]);
    // The first use of a list stores it (keys sent); later ones name it.
    auto keys_or_none = [&] {
      return KeysFrame(stored[l] ? std::vector<uint64_t>{} : lists[l]);
    };
    Response cached = SendValid(ListHeader(PULL, 1, kKeys, slot, digest),
                                Frames(keys_or_none()));
    stored[l] = true;
    Response plain = Pull(2, lists[l]);
    ASSERT_EQ(cached.code(), absl::StatusCode::kOk) << cached.header.message();
    ASSERT_EQ(plain.code(), absl::StatusCode::kOk) << plain.header.message();
    EXPECT_EQ(cached.values, plain.values);
    std::vector<float> grads(kKeys * kDim);
    for (size_t i = 0; i < grads.size(); ++i) {
      grads[i] =
          static_cast<float>(static_cast<int>((i * 7 + round) % 13) - 6) *
          0.01f;
    }
    const Op op = round % 4 == 3 ? PUSH_PULL : PUSH;
    cached = SendValid(ListHeader(op, 1, kKeys, slot, digest),
                       Frames(KeysFrame({}), ValuesFrame(grads)));
    plain = Push(2, lists[l], grads, op);
    ASSERT_EQ(cached.code(), absl::StatusCode::kOk) << cached.header.message();
    ASSERT_EQ(plain.code(), absl::StatusCode::kOk) << plain.header.message();
    EXPECT_EQ(cached.values, plain.values);
  }
  // Both tables evicted, and the same rows.
  Response stats = SendValid(Header(STATS, 0, 0), Frames(KeysFrame({})));
  ASSERT_EQ(stats.code(), absl::StatusCode::kOk) << stats.header.message();
  std::map<uint32_t, TableStats> by_table;
  for (const TableStats& t : stats.header.table_stats())
    by_table[t.table_id()] = t;
  ASSERT_EQ(by_table.size(), 2u);
  EXPECT_GT(by_table[1].evictions_budget(), 0u);
  EXPECT_EQ(by_table[1].evictions_budget(), by_table[2].evictions_budget());
  EXPECT_EQ(by_table[1].rows(), by_table[2].rows());
  std::vector<uint64_t> every(4000);
  for (uint64_t k = 0; k < every.size(); ++k) every[k] = k;
  EXPECT_EQ(Pull(1, every).values, Pull(2, every).values);
  EXPECT_EQ(server_->stats().errors, 0u);
}

TEST_F(ServerTest, KeyListStoresStayWithinTheSendersBudget) {
  // 32 bytes: four keys a sender.
  const std::string config =
      std::string(kConfig) + "data_plane { key_cache_bytes: 32 }";
  ASSERT_NO_FATAL_FAILURE(StartServer(/*standalone=*/true, config.c_str()));
  auto store = [&](uint32_t slot, const std::vector<uint64_t>& keys,
                   uint64_t node = 1) {
    return SendValid(
        ListHeader(PUSH, kSparse, keys.size(), slot, DigestOf(keys), node),
        Frames(KeysFrame(keys),
               ValuesFrame(std::vector<float>(2 * keys.size(), 2))));
  };
  auto cached = [&](uint32_t slot, const std::vector<uint64_t>& keys,
                    uint64_t node = 1) {
    return SendValid(
        ListHeader(PULL, kSparse, keys.size(), slot, DigestOf(keys), node),
        Frames(KeysFrame({})));
  };
  ASSERT_EQ(store(1, {1, 2, 3}).code(), absl::StatusCode::kOk);
  // 3 + 2 keys do not fit: refused, nothing applied.
  Response r = store(2, {4, 5});
  EXPECT_EQ(r.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.header.message().find("key_cache_bytes"), std::string::npos)
      << r.header.message();
  EXPECT_EQ(Pull(kSparse, {4, 5}).values, std::vector<float>(4, 0.0f));
  ASSERT_EQ(store(2, {4}).code(), absl::StatusCode::kOk);
  // Another sender has a budget of its own.
  ASSERT_EQ(store(1, {11, 12, 13, 14}, 2).code(), absl::StatusCode::kOk);
  // Replacing a slot's list frees the old one first.
  ASSERT_EQ(store(1, {6, 7, 8}).code(), absl::StatusCode::kOk);
  EXPECT_EQ(store(3, {9, 10}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cached(1, {1, 2, 3}).code(), absl::StatusCode::kFailedPrecondition);
  r = cached(1, {6, 7, 8});
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, std::vector<float>(6, -1.0f));
  r = cached(2, {4});
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  r = cached(1, {11, 12, 13, 14}, 2);
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, std::vector<float>(8, -1.0f));
  // A list larger than the whole budget is refused whatever it replaces.
  EXPECT_EQ(store(1, {21, 22, 23, 24, 25}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Pull(kSparse, {21, 25, 9}).values, std::vector<float>(6, 0.0f));

  // key_cache_bytes -1: every store is refused; requests without a slot
  // are served as usual.
  const std::string off =
      std::string(kConfig) + "data_plane { key_cache_bytes: -1 }";
  ASSERT_NO_FATAL_FAILURE(StartServer(/*standalone=*/true, off.c_str()));
  EXPECT_EQ(store(1, {1}).code(), absl::StatusCode::kInvalidArgument);
  r = cached(1, {1});
  EXPECT_EQ(r.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(r.header.key_list_unknown());
  EXPECT_EQ(Pull(kSparse, {1}).values, std::vector<float>(2, 0.0f));
  ASSERT_EQ(Push(kSparse, {1}, {2, 2}).code(), absl::StatusCode::kOk);
  EXPECT_EQ(Pull(kSparse, {1}).values, std::vector<float>(2, -1.0f));
}

// ------------------------------------------------------ half-width values

TEST_F(ServerTest, HalfWidthPushesAreAppliedAsTheirDecodedFloats) {
  // Not all representable in 16 bits, so the decoded values differ from
  // these; the server computes with what it decoded.
  const std::vector<float> grads = {1.5f, -2.2f, 0.3333f, 1000.7f};
  const std::vector<std::pair<ValueEncoding, std::vector<uint64_t>>> runs = {
      {FLOAT16, {100, 101}}, {BFLOAT16, {200, 201}}};
  for (const auto& [encoding, keys] : runs) {
    SCOPED_TRACE(ValueEncoding_Name(encoding));
    const std::vector<float> sent = RoundTrip(encoding, grads);
    ASSERT_NE(sent, grads);
    RequestHeader h = Header(PUSH, kSparse, keys.size());
    h.set_push_values(encoding);
    Response r =
        SendValid(h, Frames(KeysFrame(keys), HalfFrame(encoding, grads)));
    ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
    r = Pull(kSparse, keys);
    ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
    EXPECT_EQ(r.values, Scaled(-0.5f, sent));
    // The same through a cached key list, as a PUSH_PULL answered in
    // float32.
    RequestHeader store =
        ListHeader(PULL, kSparse, keys.size(), 9, DigestOf(keys));
    ASSERT_EQ(SendValid(store, Frames(KeysFrame(keys))).code(),
              absl::StatusCode::kOk);
    h = ListHeader(PUSH_PULL, kSparse, keys.size(), 9, DigestOf(keys));
    h.set_push_values(encoding);
    r = SendValid(h, Frames(KeysFrame({}), HalfFrame(encoding, grads)));
    ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
    EXPECT_EQ(r.value_bytes.size(), 4 * grads.size());
    EXPECT_EQ(r.values, Scaled(-1.0f, sent));
  }

  // Dense, across two blocks; FLOAT16 saturates at 65504, which arrives
  // as a finite gradient.
  const std::vector<float> dense = {0.1f, 0.2f, 1e6f};
  RequestHeader h = Header(PUSH, kDense, 0, {{2, 2}, {4, 1}});
  h.set_push_values(FLOAT16);
  Response r = SendValid(h, Frames(KeysFrame({}), HalfFrame(FLOAT16, dense)));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  r = DensePull({{2, 2}, {4, 1}});
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  const std::vector<float> sent = RoundTrip(FLOAT16, dense);
  EXPECT_EQ(sent[2], 65504.0f);
  EXPECT_EQ(r.values, Scaled(-0.5f, sent));

  // A PUSH_PULL with FLOAT16 gradients answered in BFLOAT16.
  h = Header(PUSH_PULL, kSparse, 1);
  h.set_push_values(FLOAT16);
  h.set_pull_values(BFLOAT16);
  r = SendValid(h, Frames(KeysFrame({300}), HalfFrame(FLOAT16, {0.7f, -3.1f})));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.header.values_encoding(), BFLOAT16);
  EXPECT_EQ(r.value_bytes.size(), 4u);
  const std::vector<float> w = Pull(kSparse, {300}).values;
  EXPECT_EQ(w, Scaled(-0.5f, RoundTrip(FLOAT16, {0.7f, -3.1f})));
  EXPECT_EQ(r.values, RoundTrip(BFLOAT16, w));
}

TEST_F(ServerTest, PullsAnswerInTheRequestedEncoding) {
  ASSERT_EQ(Push(kSparse, {7, 42}, {0.1f, -3.3f, 700.7f, 1e-3f}).code(),
            absl::StatusCode::kOk);
  // Beyond half's range: answered saturated in FLOAT16, finite.
  ASSERT_EQ(Push(kSparse, {9}, {-2e5f, 2e5f}).code(), absl::StatusCode::kOk);
  ASSERT_EQ(
      DensePush({{0, 4}, {4, 4}, {8, 2}}, {1.1f, 2, 3, 4, 5, 6, 7, 8, 9, 10.3f})
          .code(),
      absl::StatusCode::kOk);
  const std::vector<float> sparse = Pull(kSparse, {7, 42, 9}).values;
  const std::vector<float> dense = DensePull({{0, 4}, {4, 4}, {8, 2}}).values;
  ASSERT_EQ(sparse.size(), 6u);
  ASSERT_EQ(dense.size(), 10u);
  for (ValueEncoding encoding : {FLOAT16, BFLOAT16}) {
    SCOPED_TRACE(ValueEncoding_Name(encoding));
    RequestHeader h = Header(PULL, kSparse, 3);
    h.set_pull_values(encoding);
    Response r = SendValid(h, Frames(KeysFrame({7, 42, 9})));
    ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
    EXPECT_EQ(r.header.values_encoding(), encoding);
    EXPECT_EQ(r.header.num_values(), 6u);
    std::string want(12, '\0');
    EncodeValues(encoding, sparse.data(), sparse.size(), want.data());
    EXPECT_EQ(r.value_bytes, want);
    EXPECT_EQ(r.values, RoundTrip(encoding, sparse));
    for (float v : r.values) EXPECT_TRUE(std::isfinite(v));

    h = Header(PULL, kDense, 0, {{0, 4}, {4, 4}, {8, 2}});
    h.set_pull_values(encoding);
    r = SendValid(h, Frames(KeysFrame({})));
    ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
    EXPECT_EQ(r.header.values_encoding(), encoding);
    EXPECT_EQ(r.value_bytes.size(), 20u);
    EXPECT_EQ(r.values, RoundTrip(encoding, dense));

    // Through a cached key list.
    const std::vector<uint64_t> keys = {7, 42, 9};
    ASSERT_EQ(SendValid(ListHeader(PULL, kSparse, 3, 2, DigestOf(keys)),
                        Frames(KeysFrame(keys)))
                  .code(),
              absl::StatusCode::kOk);
    h = ListHeader(PULL, kSparse, 3, 2, DigestOf(keys));
    h.set_pull_values(encoding);
    r = SendValid(h, Frames(KeysFrame({})));
    ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
    EXPECT_EQ(r.value_bytes, want);
  }
  EXPECT_EQ(RoundTrip(FLOAT16, sparse)[4], 65504.0f);
  EXPECT_EQ(RoundTrip(FLOAT16, sparse)[5], -65504.0f);
  // FLOAT32 asked for explicitly: 4 bytes a value, bit for bit.
  RequestHeader h = Header(PULL, kSparse, 3);
  h.set_pull_values(FLOAT32);
  Response r = SendValid(h, Frames(KeysFrame({7, 42, 9})));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.value_bytes.size(), 24u);
  EXPECT_EQ(r.values, sparse);
}

TEST_F(ServerTest, MalformedHalfWidthRequestsAreRejectedWithoutEffect) {
  ASSERT_EQ(Push(kSparse, {7, 42}, {1, 2, 3, 4}).code(), absl::StatusCode::kOk);
  ASSERT_EQ(DensePush({{0, 4}, {4, 4}, {8, 2}}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10})
                .code(),
            absl::StatusCode::kOk);
  const std::vector<float> baseline = Snapshot();
  auto push = [](Op op, uint32_t table, uint64_t num_keys,
                 ValueEncoding encoding, const SegmentList& segs = {}) {
    RequestHeader h = Header(op, table, num_keys, segs);
    h.set_push_values(encoding);
    return HeaderFrame(h);
  };
  auto half_bits = [](std::vector<uint16_t> bits) {
    return BytesFrame(std::string(reinterpret_cast<const char*>(bits.data()),
                                  bits.size() * 2));
  };
  RequestHeader bad_pull = Header(PULL, kSparse, 1);
  bad_pull.set_pull_values(static_cast<ValueEncoding>(9));
  struct Case {
    const char* name;
    std::function<std::vector<zmq::message_t>()> frames;
  };
  const Case cases[] = {
      {"FLOAT16 frame of odd length",
       [&] {
         return Frames(push(PUSH, kSparse, 1, FLOAT16), KeysFrame({7}),
                       BytesFrame(std::string(3, '\0')));
       }},
      {"BFLOAT16 frame of odd length",
       [&] {
         return Frames(push(PUSH_PULL, kSparse, 2, BFLOAT16),
                       KeysFrame({7, 42}), BytesFrame(std::string(7, '\0')));
       }},
      {"FLOAT16 dense frame of odd length",
       [&] {
         return Frames(push(PUSH, kDense, 0, FLOAT16, {{0, 2}}), KeysFrame({}),
                       BytesFrame(std::string(5, '\0')));
       }},
      {"float32 values labelled FLOAT16",
       [&] {
         return Frames(push(PUSH, kSparse, 1, FLOAT16), KeysFrame({7}),
                       ValuesFrame({1, 1}));
       }},
      {"too few halves for dim",
       [&] {
         return Frames(push(PUSH, kSparse, 1, FLOAT16), KeysFrame({7}),
                       HalfFrame(FLOAT16, {1}));
       }},
      {"ASSIGN with FLOAT16 values",
       [&] {
         return Frames(push(ASSIGN, kDense, 0, FLOAT16, {{0, 2}}),
                       KeysFrame({}), HalfFrame(FLOAT16, {1, 1}));
       }},
      {"ASSIGN with float32 values labelled FLOAT16",
       [&] {
         return Frames(push(ASSIGN, kDense, 0, FLOAT16, {{0, 2}}),
                       KeysFrame({}), ValuesFrame({1, 1}));
       }},
      {"ASSIGN with BFLOAT16 values",
       [&] {
         return Frames(push(ASSIGN, kDense, 0, BFLOAT16, {{0, 2}}),
                       KeysFrame({}), HalfFrame(BFLOAT16, {1, 1}));
       }},
      {"push_values out of the enum",
       [&] {
         return Frames(push(PUSH, kSparse, 1, static_cast<ValueEncoding>(9)),
                       KeysFrame({7}), ValuesFrame({1, 1}));
       }},
      {"pull_values out of the enum",
       [&] { return Frames(HeaderFrame(bad_pull), KeysFrame({7})); }},
      {"FLOAT16 infinity",
       [&] {
         return Frames(push(PUSH, kSparse, 2, FLOAT16), KeysFrame({7, 42}),
                       half_bits({0x3c00, 0x3c00, 0x3c00, 0x7c00}));
       }},
      {"FLOAT16 NaN in a dense push",
       [&] {
         return Frames(push(PUSH, kDense, 0, FLOAT16, {{0, 2}}), KeysFrame({}),
                       half_bits({0x7e00, 0x3c00}));
       }},
      {"BFLOAT16 -infinity",
       [&] {
         return Frames(push(PUSH, kSparse, 1, BFLOAT16), KeysFrame({42}),
                       half_bits({0x3f80, 0xff80}));
       }},
  };
  uint64_t errors = server_->stats().errors;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ASSERT_NO_FATAL_FAILURE(ExpectRefusedWithoutEffect(
        Send(c.frames()), absl::StatusCode::kInvalidArgument, &errors,
        baseline));
  }
}

// ------------------------------------ key lists of held (deferred) requests

// BSP with two workers (nodes 1 and 2) and key lists of 48 bytes (six keys)
// a sender; this server owns every slot.
class BspKeyListServerTest : public ServerTest {
 protected:
  void SetUp() override {
    const std::string config = std::string(kConfig) +
                               "consistency { mode: BSP }\n"
                               "data_plane { key_cache_bytes: 48 }\n";
    ASSERT_NO_FATAL_FAILURE(StartServer(/*standalone=*/false, config.c_str()));
    ASSERT_NO_FATAL_FAILURE(InstallBspView());
  }

  static RequestHeader At(RequestHeader h, uint64_t clock) {
    h.set_clock(clock);
    return h;
  }

  // Waits until `n` pulls have been deferred in all.
  void AwaitDeferred(uint64_t n) {
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (server_->stats().pulls_deferred < n && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(2));
    }
    ASSERT_EQ(server_->stats().pulls_deferred, n);
  }

  // The next `n` responses, by request id.
  std::map<uint64_t, Response> ReceiveAll(int n) {
    std::map<uint64_t, Response> replies;
    for (int i = 0; i < n; ++i) {
      Response r = Receive();
      if (!r.received) break;
      replies[r.header.request_id()] = r;
    }
    return replies;
  }
};

// Requests kept until BSP allows their pulls keep the keys they named
// (the server materializes a cached list when it defers), whatever the
// sender stores in those slots meanwhile.
TEST_F(BspKeyListServerTest, DeferredRequestsKeepTheirKeysWhenTheSlotChanges) {
  const std::vector<uint64_t> a = {7, 42}, b = {99}, c = {5, 6}, d = {8};
  // Node 1 stores A in slot 5 with a pull of step 0 (answered at once),
  // then pushes step 0's gradients through the cached list: buffered until
  // both workers finish step 0.
  Response r = SendValid(At(ListHeader(PULL, kSparse, 2, 5, DigestOf(a)), 0),
                         Frames(KeysFrame(a)));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  r = SendValid(At(ListHeader(PUSH, kSparse, 2, 5, DigestOf(a)), 0),
                Frames(KeysFrame({}), ValuesFrame({2, 4, 6, 8})));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();

  // Two requests of step 1 wait for step 0 (node 2 has not finished it): a
  // pull through cached list A, answered in FLOAT16, and a PUSH_PULL with
  // FLOAT16 gradients storing C in slot 6 (its push is buffered for step 1).
  RequestHeader pull_a = At(ListHeader(PULL, kSparse, 2, 5, DigestOf(a)), 1);
  pull_a.set_pull_values(FLOAT16);
  const uint64_t pull_a_id = SendOnly(pull_a, Frames(KeysFrame({})));
  RequestHeader push_pull_c =
      At(ListHeader(PUSH_PULL, kSparse, 2, 6, DigestOf(c)), 1);
  push_pull_c.set_push_values(FLOAT16);
  const uint64_t push_pull_c_id = SendOnly(
      push_pull_c, Frames(KeysFrame(c), HalfFrame(FLOAT16, {1, 1, 1, 1})));
  ASSERT_NO_FATAL_FAILURE(AwaitDeferred(2));

  // Meanwhile node 1 puts other lists in both slots, with pulls of step 0
  // (answered at once).
  r = SendValid(At(ListHeader(PULL, kSparse, 1, 5, DigestOf(b)), 0),
                Frames(KeysFrame(b)));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  r = SendValid(At(ListHeader(PULL, kSparse, 1, 6, DigestOf(d)), 0),
                Frames(KeysFrame(d)));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();

  // Node 2 finishes step 0: it is applied (the average of one push over two
  // workers) and both pulls are answered, each with its own keys.
  const uint64_t advance_id = Advance(2, 1);
  std::map<uint64_t, Response> replies = ReceiveAll(3);
  ASSERT_EQ(replies.count(advance_id), 1u);
  EXPECT_EQ(replies[advance_id].code(), absl::StatusCode::kOk);
  ASSERT_EQ(replies.count(pull_a_id), 1u);
  const Response& got_a = replies[pull_a_id];
  EXPECT_EQ(got_a.code(), absl::StatusCode::kOk) << got_a.header.message();
  EXPECT_FALSE(got_a.header.key_list_unknown());
  EXPECT_EQ(got_a.header.values_encoding(), FLOAT16);
  EXPECT_EQ(got_a.value_bytes.size(), 8u);
  EXPECT_EQ(got_a.values, (std::vector<float>{-0.5, -1, -1.5, -2}));
  ASSERT_EQ(replies.count(push_pull_c_id), 1u);
  const Response& got_c = replies[push_pull_c_id];
  EXPECT_EQ(got_c.code(), absl::StatusCode::kOk) << got_c.header.message();
  EXPECT_EQ(got_c.values,
            std::vector<float>(4, 0.0f));  // its step 1 is not applied yet

  // The slots hold what node 1 stored last.
  for (const auto& [slot, keys] :
       std::vector<std::pair<uint32_t, std::vector<uint64_t>>>{{5, b},
                                                               {6, d}}) {
    SCOPED_TRACE(slot);
    r = SendValid(
        At(ListHeader(PULL, kSparse, keys.size(), slot, DigestOf(keys)), 1),
        Frames(KeysFrame({})));
    EXPECT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
    EXPECT_EQ(r.values.size(), 2 * keys.size());
  }

  // Step 1, the PUSH_PULL's push on C (decoded FLOAT16 ones), is applied
  // once both workers finish it; a pull of step 2 waits for that.
  Advance(1, 2);
  Advance(2, 2);
  ReceiveAll(2);
  r = SendValid(At(Header(PULL, kSparse, 4), 2),
                Frames(KeysFrame({5, 6, 7, 42})));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, (std::vector<float>{-0.25, -0.25, -0.25, -0.25, -0.5, -1,
                                          -1.5, -2}));
}

// A kept (deferred) request that carried its keys under a slot keeps them
// as its own (MakeSelfContained strips the slot): answering it later
// (Progress -> Process) does not store its list in that slot again, which
// would overwrite what the sender stored there since and could put the
// sender over key_cache_bytes. Held pushes (checkpoints) take the same path.
TEST_F(BspKeyListServerTest, AKeptRequestDoesNotStoreItsListAgain) {
  const std::vector<uint64_t> e = {11, 12}, f = {13}, g = {14, 15, 16},
                              h = {17, 18};
  // A float32 pull of step 1 storing E in slot 7 waits for step 0.
  const uint64_t pull_e_id =
      SendOnly(At(ListHeader(PULL, kSparse, 2, 7, DigestOf(e)), 1),
               Frames(KeysFrame(e)));
  ASSERT_NO_FATAL_FAILURE(AwaitDeferred(1));
  // Node 1 then stores F in slot 7, and fills its 6-key budget (1 + 3 + 2).
  for (const auto& [slot, keys] :
       std::vector<std::pair<uint32_t, std::vector<uint64_t>>>{
           {7, f}, {8, g}, {9, h}}) {
    SCOPED_TRACE(slot);
    Response r = SendValid(
        At(ListHeader(PULL, kSparse, keys.size(), slot, DigestOf(keys)), 0),
        Frames(KeysFrame(keys)));
    ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  }
  const uint64_t advance_id = Advance(2, 1);
  std::map<uint64_t, Response> replies = ReceiveAll(2);
  ASSERT_EQ(replies.count(advance_id), 1u);
  ASSERT_EQ(replies.count(pull_e_id), 1u);
  const Response& got_e = replies[pull_e_id];
  EXPECT_EQ(got_e.code(), absl::StatusCode::kOk) << got_e.header.message();
  EXPECT_EQ(got_e.values, std::vector<float>(4, 0.0f));
  // The slots hold what node 1 stored last.
  for (const auto& [slot, keys] :
       std::vector<std::pair<uint32_t, std::vector<uint64_t>>>{
           {7, f}, {8, g}, {9, h}}) {
    SCOPED_TRACE(slot);
    Response r = SendValid(
        At(ListHeader(PULL, kSparse, keys.size(), slot, DigestOf(keys)), 1),
        Frames(KeysFrame({})));
    EXPECT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
    EXPECT_FALSE(r.header.key_list_unknown());
  }
}

// "A rejected request changes nothing" includes the record of applied
// sequence numbers: a push refused as too far ahead of the applied BSP step
// must not be remembered as applied, or the worker's next push with that
// sequence number (a valid one) would be answered as a duplicate and lost.
TEST_F(BspKeyListServerTest,
       APushRefusedAsTooFarAheadIsNotRememberedAsApplied) {
  const uint64_t too_far = ConsistencyController::kMaxStepsAhead + 1;
  RequestHeader far =
      At(SeqHeader(PUSH, kSparse, 1, /*node=*/1, /*seq=*/5), too_far);
  Response r = SendValid(far, Frames(KeysFrame({7}), ValuesFrame({2, 4})));
  ASSERT_EQ(r.code(), absl::StatusCode::kInvalidArgument) << r.header.message();
  EXPECT_FALSE(r.header.duplicate());

  // The same sequence number on a valid push of step 0: new, buffered.
  r = SendValid(At(SeqHeader(PUSH, kSparse, 1, 1, 5), 0),
                Frames(KeysFrame({7}), ValuesFrame({2, 4})));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_FALSE(r.header.duplicate());
  EXPECT_EQ(server_->stats().duplicate_pushes, 0u);

  // Node 2 finishes step 0: the push is applied, averaged over both workers.
  const uint64_t advance_id = Advance(2, 1);
  std::map<uint64_t, Response> replies = ReceiveAll(1);
  ASSERT_EQ(replies.count(advance_id), 1u);
  r = SendValid(At(Header(PULL, kSparse, 1), 1), Frames(KeysFrame({7})));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, (std::vector<float>{-0.5f, -1.0f}));
}

}  // namespace
}  // namespace ps
