// Sparse table benchmark: push (Adagrad apply) and pull of 10K-key messages
// against a server's SparseTable, with and without eviction bookkeeping,
// each beside a raw baseline measured in the same run: a plain
// absl::flat_hash_map index over one contiguous float array running the
// same Adagrad arithmetic, i.e. what the update costs with no table
// features at all.
//
//   bazel run --config=opt //tests/bench:table_bench -- [--rows=N] [--dim=D]
//
// One JSON line per figure: {"bench":"sparse","metric":...,"value":...,
// "unit":"keys/s","baseline":...,"ratio":...}.
#include <sys/mman.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/container/flat_hash_map.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/hash.h"
#include "proto/config.pb.h"
#include "server/table.h"

ABSL_FLAG(uint64_t, rows, 1 << 20, "Distinct keys in the table.");
ABSL_FLAG(uint32_t, dim, 8, "Floats per row.");
ABSL_FLAG(uint32_t, message_keys, 10000, "Keys per push or pull.");
ABSL_FLAG(double, seconds, 1.0, "Time per measurement.");
ABSL_FLAG(double, big_table_gb, 4.0,
          "Size of the dim-64 table for the large-table pull figure; 0 skips it.");
ABSL_FLAG(std::string, count_variant, "",
          "With --count_messages: plain, lru, lfu_half or admit; empty runs all.");
ABSL_FLAG(bool, count_memo, false,
          "With --count_messages: pushes and pulls use row memos (as the server does for "
          "cached key lists), filled by one pull of each message before counting.");
ABSL_FLAG(int, count_messages, 0,
          "If > 0: instead of timing, push then pull this many messages per "
          "variant, each variant's loops in its own function, for instruction "
          "counts under callgrind (see CountMain).");

namespace ps {
namespace {

using Clock = std::chrono::steady_clock;

// The raw baseline: index + contiguous rows, Adagrad inline.
class RawTable {
 public:
  RawTable(uint32_t dim, size_t rows) : dim_(dim) {
    index_.reserve(rows);
    data_.reserve(rows * 2 * dim);
  }
  float* Row(uint64_t key) {
    auto [it, inserted] = index_.try_emplace(key, static_cast<uint32_t>(index_.size()));
    if (inserted) data_.resize(data_.size() + 2 * dim_, 0.0f);
    return &data_[size_t{it->second} * 2 * dim_];
  }
  void Push(const std::vector<uint64_t>& keys, const float* g) {
    for (size_t i = 0; i < keys.size(); ++i) {
      float* w = Row(keys[i]);
      float* acc = w + dim_;
      const float* gi = g + i * dim_;
      for (uint32_t e = 0; e < dim_; ++e) {
        acc[e] += gi[e] * gi[e];
        w[e] -= 0.1f * gi[e] / (std::sqrt(acc[e]) + 1e-8f);
      }
    }
  }
  void Pull(const std::vector<uint64_t>& keys, float* out) {
    for (size_t i = 0; i < keys.size(); ++i) {
      std::memcpy(out + i * dim_, Row(keys[i]), dim_ * sizeof(float));
    }
  }

 private:
  const uint32_t dim_;
  absl::flat_hash_map<uint64_t, uint32_t> index_;
  std::vector<float> data_;
};

// Keys per message, drawn from `rows` ids spread over uint64.
std::vector<std::vector<uint64_t>> Messages(size_t rows, size_t per, size_t count,
                                            uint64_t seed) {
  std::vector<std::vector<uint64_t>> out(count);
  uint64_t s = seed;
  for (auto& m : out) {
    m.resize(per);
    for (auto& k : m) {
      s = Mix64(s);
      k = Mix64(s % rows);
    }
  }
  return out;
}

// Runs fn over the messages round-robin for about `seconds`; keys/s.
template <typename Fn>
double Rate(const std::vector<std::vector<uint64_t>>& messages, double seconds, Fn fn) {
  const auto start = Clock::now();
  size_t keys = 0;
  size_t i = 0;
  while (true) {
    fn(messages[i % messages.size()]);
    keys += messages[i % messages.size()].size();
    ++i;
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    if (elapsed >= seconds && i >= messages.size()) return keys / elapsed;
  }
}

// Fields of the closing {"bench":"sparse","summary":{...}} line.
std::vector<std::string>& SummaryFields() {
  static auto* fields = new std::vector<std::string>;
  return *fields;
}

void Emit(const char* metric, double value, double baseline) {
  std::printf(
      "{\"bench\":\"sparse\",\"metric\":\"%s\",\"value\":%.0f,\"unit\":\"keys/s\","
      "\"baseline\":%.0f,\"ratio\":%.3f}\n",
      metric, value, baseline, value / baseline);
  std::fflush(stdout);
  SummaryFields().push_back(
      absl::StrFormat("\"%s\":%.4g,\"%s_ratio\":%.3f", metric, value, metric, value / baseline));
}

TableConfig Config(uint32_t dim, uint64_t budget, EvictionPolicy policy) {
  TableConfig c;
  c.set_id(1);
  c.set_name("bench");
  c.mutable_sparse()->set_dim(dim);
  c.mutable_sparse()->set_memory_budget_bytes(budget);
  c.mutable_sparse()->set_eviction(policy);
  AdagradConfig* a = c.mutable_optimizer()->mutable_adagrad();
  a->set_learning_rate(0.1f);
  a->set_initial_accumulator(0.0f);
  a->set_epsilon(1e-8f);
  return c;
}

// Bytes on transparent huge pages (AnonHugePages) of the mapping that starts
// at `start` (/proc/self/smaps), or of the whole process when `start` is
// null (/proc/self/smaps_rollup, one section); -1 if it cannot be read.
// The gather limit depends on them, and a kernel may grant none (madvise
// mode on a fragmented or virtualised host), so the bench reports them.
int64_t HugeBytes(const void* start) {
  std::ifstream smaps(start == nullptr ? "/proc/self/smaps_rollup" : "/proc/self/smaps");
  // Every section starts with "<from>-<to> perms ...": the one wanted
  // starts with `head` (any, when head is empty).
  const std::string head =
      start == nullptr ? "" : absl::StrFormat("%x-", reinterpret_cast<uintptr_t>(start));
  std::string line;
  bool in = start == nullptr;
  while (std::getline(smaps, line)) {
    if (!line.empty() && std::isxdigit(static_cast<unsigned char>(line[0])) &&
        line.find('-') != std::string::npos && line.find(' ') > line.find('-')) {
      in = absl::StartsWith(line, head);
    } else if (in && absl::StartsWith(line, "AnonHugePages:")) {
      int64_t kb = 0;
      if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(14, line.size() - 17)), &kb)) {
        return -1;
      }
      return kb * 1024;
    }
  }
  return -1;
}

struct BigTableResult {
  double pull = 0;       // rows/s
  double pull_memo = 0;  // rows/s, through row memos (a cached key list)
  double limit = 0;      // rows/s
};

// Pull of 64-float rows from a table of `gb` gigabytes of weights (SGD,
// no optimizer state), 10K random existing keys per message, against the
// gather limit measured in the same run: a raw loop copying random rows,
// by precomputed row number (no hashing), from one array of the same size
// advised onto transparent huge pages, with software prefetch 16 rows
// ahead. The naive gather (4 KiB pages, no prefetch) is printed as a note.
//
// The limit and the pull are measured in alternating rounds and the best of
// each is kept (as kv_bench's MeasureInRounds): on a virtual machine the
// gather limit was seen to move by 2x from one minute to the next (16 to 40
// M rows/s on a 16-core VM), which a single baseline measured before the
// table was filled turned into the ratio's noise.
BigTableResult BigTable(double gb) {
  constexpr uint32_t kDim = 64;
  constexpr size_t kRowBytes = kDim * sizeof(float);
  constexpr int kRounds = 3;
  const size_t rows = static_cast<size_t>(gb * (1ull << 30)) / kRowBytes;
  const size_t per = absl::GetFlag(FLAGS_message_keys);
  const double seconds = absl::GetFlag(FLAGS_seconds);
  std::vector<float> out(per * kDim);
  // Random row numbers, and the keys of those rows.
  std::vector<std::vector<uint64_t>> picks(16, std::vector<uint64_t>(per));
  uint64_t s = 11;
  for (auto& m : picks) {
    for (auto& r : m) {
      s = Mix64(s);
      r = s % rows;
    }
  }
  const size_t bytes = rows * kRowBytes;
  auto map_rows = [&](bool huge) -> float* {
    void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) return nullptr;
    if (huge) madvise(mem, bytes, MADV_HUGEPAGE);
    auto* data = static_cast<float*>(mem);
    for (size_t i = 0; i < rows * kDim; i += 1024) data[i] = 1.0f;  // touch every page
    return data;
  };
  auto gather_rate = [&](const float* data, bool prefetch) {
    return Rate(picks, seconds, [&](const std::vector<uint64_t>& m) {
      for (size_t i = 0; i < m.size(); ++i) {
        if (prefetch && i + 16 < m.size()) {
          const char* p = reinterpret_cast<const char*>(data + m[i + 16] * kDim);
          for (size_t b = 0; b < kRowBytes; b += 64) __builtin_prefetch(p + b);
        }
        std::memcpy(out.data() + i * kDim, data + m[i] * kDim, kRowBytes);
      }
    });
  };
  BigTableResult result;
  double naive = 0;
  if (float* data = map_rows(false)) {
    naive = gather_rate(data, false);
    munmap(data, bytes);
  }
  float* limit_rows = map_rows(true);
  if (limit_rows == nullptr) {
    std::fprintf(stderr, "table_bench: cannot map %zu bytes for the gather limit\n", bytes);
    return result;
  }

  TableConfig c;
  c.set_id(2);
  c.set_name("big");
  c.mutable_sparse()->set_dim(kDim);
  c.mutable_optimizer()->mutable_sgd()->set_learning_rate(0.1f);
  auto table = Table::Create(c);
  if (!table.ok()) {
    munmap(limit_rows, bytes);
    return result;
  }
  SparseTable* t = (*table)->AsSparse();
  // Rows are created by ImportRow in batches of keys Mix64(row).
  std::vector<float> state(kDim, 0.5f);
  for (size_t r = 0; r < rows; ++r) {
    if (!t->ImportRow(Mix64(r), state).ok()) {
      std::fprintf(stderr, "table_bench: cannot fill the big table\n");
      munmap(limit_rows, bytes);
      return result;
    }
  }
  std::vector<std::vector<uint64_t>> keys = picks;
  for (auto& m : keys) {
    for (auto& k : m) k = Mix64(k);
  }
  // A memo per message, made by an uncounted pull: what the server keeps
  // for a cached key list, so these pulls skip the index.
  std::vector<RowMemo> memos(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) t->Pull(keys[i], out.data(), &memos[i]);
  for (int round = 0; round < kRounds; ++round) {
    result.limit = std::max(result.limit, gather_rate(limit_rows, true));
    result.pull = std::max(result.pull, Rate(keys, seconds, [&](const auto& m) {
                             t->Pull(m, out.data());
                           }));
    // Rate passes each message by reference into `keys`, so its position
    // picks its memo.
    result.pull_memo = std::max(result.pull_memo, Rate(keys, seconds, [&](const auto& m) {
                                  t->Pull(m, out.data(), &memos[&m - keys.data()]);
                                }));
  }
  // Read once the rounds are over, as they ran. What the process holds on
  // huge pages beyond the limit's array is the table's: its row chunks and
  // index are advised likewise.
  const int64_t limit_huge = HugeBytes(limit_rows);
  const int64_t table_huge = HugeBytes(nullptr) - limit_huge;
  munmap(limit_rows, bytes);
  std::printf(
      "{\"bench\":\"sparse\",\"metric\":\"pull_dim64_%.0fgb\",\"value\":%.0f,"
      "\"unit\":\"rows/s\",\"baseline\":%.0f,\"ratio\":%.3f}\n",
      gb, result.pull, result.limit, result.pull / result.limit);
  std::printf(
      "{\"bench\":\"sparse\",\"metric\":\"pull_dim64_%.0fgb_memo\",\"value\":%.0f,"
      "\"unit\":\"rows/s\",\"baseline\":%.0f,\"ratio\":%.3f}\n",
      gb, result.pull_memo, result.limit, result.pull_memo / result.limit);
  std::fflush(stdout);
  std::fprintf(stderr,
               "# big table: %zu rows of %u floats (%.1f GiB of weights, %.2f GiB held); gather "
               "limit (huge pages advised, prefetch) %.3g rows/s with %.2f GiB of its %.2f GiB on "
               "huge pages, naive gather %.3g rows/s; the table has %.2f GiB on huge pages; best of "
               "%d alternating rounds\n",
               rows, kDim, gb, t->MemoryBytes() / double(1ull << 30), result.limit,
               limit_huge / double(1ull << 30), bytes / double(1ull << 30), naive,
               table_huge / double(1ull << 30), kRounds);
  return result;
}

// Instruction-count mode (--count_messages=N). Timings on a shared machine
// are noisy; instruction counts are not. The measured pushes and pulls run
// in functions of their own, so that
//   valgrind --tool=callgrind --toggle-collect='ps::*Counted*'
//     table_bench --count_messages=32 --rows=65536 --dim=1 --count_variant=plain
//   callgrind_annotate --inclusive=yes callgrind.out.* | grep Counted
// gives the instructions of N pushes and N pulls, the filling excluded.
// Variants (--count_variant, default all in one run): plain (no
// eviction); lru (a budget that fits every row); lfu_half (a budget for
// half of the ids: pushes evict and create rows); admit (an admission
// filter admitting at the second push, starting empty). --count_memo:
// every message has a RowMemo, filled by an uncounted pull (a step's pull
// before its push), and the counted calls use it.
ABSL_ATTRIBUTE_NOINLINE void CountedPushes(
    SparseTable* t, const std::vector<std::vector<uint64_t>>& messages, int count,
    const float* grads, std::vector<RowMemo>* memos) {
  for (int i = 0; i < count; ++i) {
    const size_t m = i % messages.size();
    t->Push(messages[m], grads, 1.0f, memos != nullptr ? &(*memos)[m] : nullptr);
  }
}
ABSL_ATTRIBUTE_NOINLINE void CountedPulls(
    SparseTable* t, const std::vector<std::vector<uint64_t>>& messages, int count, float* out,
    std::vector<RowMemo>* memos) {
  for (int i = 0; i < count; ++i) {
    const size_t m = i % messages.size();
    t->Pull(messages[m], out, memos != nullptr ? &(*memos)[m] : nullptr);
  }
}
int CountMain() {
  const size_t rows = absl::GetFlag(FLAGS_rows);
  const uint32_t dim = absl::GetFlag(FLAGS_dim);
  const size_t per = absl::GetFlag(FLAGS_message_keys);
  const int count = absl::GetFlag(FLAGS_count_messages);
  const auto messages = Messages(rows, per, 64, 1);
  std::vector<float> grads(per * dim, 0.01f), out(per * dim);
  std::vector<uint64_t> all(rows);
  for (size_t r = 0; r < rows; ++r) all[r] = Mix64(r);
  std::vector<float> all_grads(rows * dim, 0.01f);
  const uint64_t fits_all = uint64_t{rows} * (dim * 8 + 64) * 2;
  const uint64_t half = uint64_t{rows / 2} * (dim * 8 + 32 + 16);
  double checksum = 0;
  const std::string only = absl::GetFlag(FLAGS_count_variant);
  const char* names[] = {"plain", "lru", "lfu_half", "admit"};
  for (int v = 0; v < 4; ++v) {
    if (!only.empty() && only != names[v]) continue;
    TableConfig c = v == 0   ? Config(dim, 0, EVICT_NONE)
                    : v == 1 ? Config(dim, fits_all, EVICT_LRU)
                    : v == 2 ? Config(dim, half, EVICT_LFU)
                             : Config(dim, 0, EVICT_NONE);
    if (v == 3) c.mutable_sparse()->set_admit_after_pushes(2);
    auto table = Table::Create(c);
    if (!table.ok()) {
      std::fprintf(stderr, "table_bench: %s\n", table.status().ToString().c_str());
      return 1;
    }
    SparseTable* t = (*table)->AsSparse();
    // The admission variant starts empty: its pushes admit keys as they go.
    if (v != 3) t->Push(all, all_grads.data());
    std::vector<RowMemo> memos(messages.size());
    std::vector<RowMemo>* use_memos = nullptr;
    if (absl::GetFlag(FLAGS_count_memo)) {
      use_memos = &memos;
      for (size_t m = 0; m < messages.size(); ++m) t->Pull(messages[m], out.data(), &memos[m]);
    }
    const auto start = Clock::now();
    CountedPushes(t, messages, count, grads.data(), use_memos);
    const auto pushed = Clock::now();
    CountedPulls(t, messages, count, out.data(), use_memos);
    const double push_s = std::chrono::duration<double>(pushed - start).count();
    const double pull_s = std::chrono::duration<double>(Clock::now() - pushed).count();
    // Wall-clock too, as a check: on a loaded machine only the counts repeat.
    std::fprintf(stderr, "# %s: push %.3g keys/s, pull %.3g keys/s\n", names[v],
                 count * per / push_s, count * per / pull_s);
    for (float x : out) checksum += x;
    std::fprintf(stderr, "# %s: %zu rows, %llu evictions, %llu admissions\n", names[v],
                 t->num_rows(),
                 static_cast<unsigned long long>(t->counters().evictions_budget),
                 static_cast<unsigned long long>(t->counters().admissions));
  }
  std::printf("checksum %.6g\n", checksum);
  return 0;
}

int Main() {
  if (absl::GetFlag(FLAGS_count_messages) > 0) return CountMain();
  const size_t rows = absl::GetFlag(FLAGS_rows);
  const uint32_t dim = absl::GetFlag(FLAGS_dim);
  const size_t per = absl::GetFlag(FLAGS_message_keys);
  const double seconds = absl::GetFlag(FLAGS_seconds);
  const auto messages = Messages(rows, per, 64, 1);
  std::vector<float> grads(per * dim, 0.01f), out(per * dim);

  // Fill every structure with all rows first, so the figures are for
  // updates of existing rows, not growth.
  std::vector<uint64_t> all(rows);
  for (size_t r = 0; r < rows; ++r) all[r] = Mix64(r);
  std::vector<float> all_grads(rows * dim, 0.01f);

  RawTable raw(dim, rows);
  raw.Push(all, all_grads.data());
  const double raw_push = Rate(messages, seconds, [&](const auto& m) { raw.Push(m, grads.data()); });
  const double raw_pull = Rate(messages, seconds, [&](const auto& m) { raw.Pull(m, out.data()); });

  struct Variant {
    const char* name;
    uint64_t budget;
    EvictionPolicy policy;
  };
  // A budget large enough for every row measures the bookkeeping alone.
  const uint64_t fits_all = uint64_t{rows} * (dim * 8 + 64) * 2;
  for (const Variant& v : {Variant{"plain", 0, EVICT_NONE},
                           Variant{"lru", fits_all, EVICT_LRU},
                           Variant{"lfu", fits_all, EVICT_LFU}}) {
    auto table = Table::Create(Config(dim, v.budget, v.policy));
    if (!table.ok()) {
      std::fprintf(stderr, "table_bench: %s\n", table.status().ToString().c_str());
      return 1;
    }
    SparseTable* t = (*table)->AsSparse();
    t->Push(all, all_grads.data());
    const double push = Rate(messages, seconds, [&](const auto& m) { t->Push(m, grads.data()); });
    const double pull = Rate(messages, seconds, [&](const auto& m) { t->Pull(m, out.data()); });
    Emit(absl::StrCat("push_adagrad_", v.name).c_str(), push, raw_push);
    Emit(absl::StrCat("pull_", v.name).c_str(), pull, raw_pull);
  }
  // Under pressure: the budget holds half of the ids, so pushes of absent
  // keys evict (LFU sampling) and re-create rows.
  const uint64_t half = uint64_t{rows / 2} * (dim * 8 + 32 + 16);
  auto table = Table::Create(Config(dim, half, EVICT_LFU));
  if (!table.ok()) return 1;
  SparseTable* t = (*table)->AsSparse();
  t->Push(all, all_grads.data());
  const double churn = Rate(messages, seconds, [&](const auto& m) { t->Push(m, grads.data()); });
  Emit("push_adagrad_lfu_half_budget", churn, raw_push);
  std::fprintf(stderr, "# rows %zu dim %u, budget for half: %zu rows held, %.3f of budget used, "
               "%llu evictions\n", rows, dim, t->num_rows(),
               static_cast<double>(t->MemoryBytes()) / half,
               static_cast<unsigned long long>(t->counters().evictions_budget));
  table->reset();
  if (const double gb = absl::GetFlag(FLAGS_big_table_gb); gb > 0) {
    const BigTableResult big = BigTable(gb);
    if (big.limit <= 0) return 1;
    SummaryFields().push_back(absl::StrFormat(
        "\"pull_dim64_%.0fgb\":%.4g,\"pull_dim64_%.0fgb_ratio\":%.3f,"
        "\"pull_dim64_%.0fgb_memo_ratio\":%.3f",
        gb, big.pull, gb, big.pull / big.limit, gb, big.pull_memo / big.limit));
  }
  std::printf("{\"bench\":\"sparse\",\"summary\":{%s}}\n",
              absl::StrJoin(SummaryFields(), ",").c_str());
  return 0;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ps::Main();
}
