// Disk tier benchmark: a server's sparse table (Adagrad, dim 16) with a
// disk tier, each figure beside a baseline measured in the same run:
//
//   hot_fits          every row fits the budget: the tiered table against
//                     the same table without a tier, pull + push keys/s
//                     (the tier should cost nothing when it is not needed);
//   table_4x_budget   a Zipf key stream over a table several times its RAM
//                     budget: the tiered table against a RocksDB-only table
//                     given the whole budget as its memory (every pull a
//                     MultiGet, every push a MultiGet, the optimizer, and a
//                     Put), pull + push keys/s;
//   disk_read_efficiency
//                     the tiered run's disk reads/s as a fraction of this
//                     disk's random 4 KiB read rate, measured in the same
//                     run with O_DIRECT pread loops, as many at once as the
//                     tier reads with (its I/O pool and the caller).
//
//   bazel run --config=opt //tests/bench:tiered_bench -- [--dir=D]
//       [--rows=N] [--budget_mb=M] [--seconds=S]
//
// Direct I/O throughout, so the page cache is no hidden tier: buff/cache
// is reported before and after. The directory is removed at the end.
// One JSON line per figure: {"bench":"tiered","metric":...,"value":...,
// "unit":...,"baseline":...,"ratio":...}, then a summary line.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/hash.h"
#include "proto/config.pb.h"
#include "server/disk_tier.h"
#include "server/table.h"

ABSL_FLAG(std::string, dir, "/var/tmp/ps-tiered-bench",
          "Where the tiers and the read-rate file go (a local disk with "
          "O_DIRECT); removed at the end.");
ABSL_FLAG(uint64_t, rows, 4 << 20,
          "Distinct keys of the large table (table_4x_budget).");
ABSL_FLAG(uint64_t, hot_rows, 1 << 20, "Distinct keys of hot_fits.");
ABSL_FLAG(uint64_t, budget_mb, 128,
          "The large table's memory_budget_bytes, in MiB (the tier's RAM "
          "included); the rows need several times that.");
ABSL_FLAG(double, zipf, 1.05, "Exponent of the Zipf key stream.");
ABSL_FLAG(uint32_t, message_keys, 1000, "Keys per pull and push.");
ABSL_FLAG(double, seconds, 10.0, "Time per measurement.");
ABSL_FLAG(uint64_t, stream_keys, 8 << 20,
          "Keys drawn for table_4x_budget's stream, used once each.");

namespace ps {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kDim = 16;

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::vector<std::string>& SummaryFields() {
  static auto* fields = new std::vector<std::string>;
  return *fields;
}

void Emit(const std::string& metric, double value, const char* unit,
          double baseline) {
  std::printf(
      "{\"bench\":\"tiered\",\"metric\":\"%s\",\"value\":%.4g,\"unit\":\"%s\","
      "\"baseline\":%.4g,\"ratio\":%.3f}\n",
      metric.c_str(), value, unit, baseline, value / baseline);
  std::fflush(stdout);
  SummaryFields().push_back(absl::StrFormat("\"%s\":%.4g,\"%s_ratio\":%.3f",
                                            metric, value, metric,
                                            value / baseline));
}

void Note(const std::string& name, double value) {
  SummaryFields().push_back(absl::StrFormat("\"%s\":%.4g", name, value));
}

// This process's resident memory, in bytes (/proc/self/status VmRSS).
double RssBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0)
      return std::strtod(line.c_str() + 6, nullptr) * 1024;
  }
  return 0;
}

// Buff/cache of the machine, in MiB (/proc/meminfo Buffers + Cached).
double BuffCacheMb() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  double total = 0;
  while (in >> key >> kb >> unit) {
    if (key == "Buffers:" || key == "Cached:") total += kb / 1024.0;
  }
  return total;
}

TableConfig Config(uint64_t budget, const std::string& tier_dir) {
  TableConfig c;
  c.set_id(1);
  c.set_name("bench");
  SparseTableConfig* s = c.mutable_sparse();
  s->set_dim(kDim);
  s->set_admit_after_pushes(1);
  s->set_memory_budget_bytes(budget);
  s->set_eviction(EVICT_LFU);
  if (!tier_dir.empty()) s->mutable_disk_tier()->set_dir(tier_dir);
  AdagradConfig* a = c.mutable_optimizer()->mutable_adagrad();
  a->set_learning_rate(0.1f);
  a->set_initial_accumulator(0.1f);
  a->set_epsilon(1e-8f);
  return c;
}

std::unique_ptr<SparseTable> MakeTable(const TableConfig& config,
                                       const std::string& root) {
  TableEnv env;
  env.tier_root = root;
  auto t = Table::Create(config, env);
  if (!t.ok()) {
    std::fprintf(stderr, "tiered_bench: %s\n", t.status().ToString().c_str());
    return nullptr;
  }
  return std::unique_ptr<SparseTable>(static_cast<SparseTable*>(t->release()));
}

// Keys of a Zipf(s) stream over `rows` ranks, rank r's key Mix64(r): a CDF
// table and a binary search per draw.
class Zipf {
 public:
  Zipf(uint64_t rows, double s) : cdf_(rows) {
    double sum = 0;
    for (uint64_t r = 0; r < rows; ++r) {
      sum += std::pow(static_cast<double>(r + 1), -s);
      cdf_[r] = sum;
    }
    for (double& c : cdf_) c /= sum;
  }
  uint64_t Next(uint64_t* rng) const {
    *rng = Mix64(*rng + 0x9e3779b97f4a7c15ULL);
    const double u = static_cast<double>(*rng >> 11) * 0x1.0p-53;
    const uint64_t rank =
        std::lower_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin();
    return Mix64(std::min<uint64_t>(rank, cdf_.size() - 1));
  }
  // The share of draws that fall on the `top` most frequent ranks.
  double Mass(uint64_t top) const {
    return top == 0 ? 0 : cdf_[std::min<uint64_t>(top, cdf_.size()) - 1];
  }

 private:
  std::vector<double> cdf_;
};

// One training-like step: pull a message's keys, then push gradients.
struct StepRates {
  double keys_per_s = 0;
  double p50_ms = 0;
  double p99_ms = 0;
};

template <typename StepFn>
StepRates RunSteps(const std::vector<std::vector<uint64_t>>& messages,
                   double seconds, StepFn step, size_t* next = nullptr) {
  std::vector<double> ms;
  size_t keys = 0;
  const Clock::time_point start = Clock::now();
  for (size_t i = next != nullptr ? *next : 0;; ++i) {
    const std::vector<uint64_t>& m = messages[i % messages.size()];
    const Clock::time_point t0 = Clock::now();
    step(m);
    ms.push_back(Since(t0) * 1e3);
    keys += m.size();
    if (Since(start) >= seconds) {
      if (next != nullptr) *next = i + 1;
      break;
    }
  }
  StepRates r;
  r.keys_per_s = keys / Since(start);
  std::sort(ms.begin(), ms.end());
  r.p50_ms = ms[ms.size() / 2];
  r.p99_ms = ms[std::min(ms.size() - 1, ms.size() * 99 / 100)];
  return r;
}

// hot_fits: uniform keys over hot_rows, all in RAM in both tables.
bool HotFits(const std::string& dir, double seconds, uint32_t per) {
  const uint64_t rows = absl::GetFlag(FLAGS_hot_rows);
  std::vector<uint64_t> all(rows);
  for (uint64_t r = 0; r < rows; ++r) all[r] = Mix64(r);
  std::vector<float> all_grads(rows * kDim, 0.01f);
  std::vector<std::vector<uint64_t>> messages(256);
  uint64_t rng = 1;
  for (auto& m : messages) {
    m.resize(per);
    for (uint64_t& k : m) k = all[(rng = Mix64(rng)) % rows];
  }
  // Room for every row twice over; the tiered table gets its tier's RAM on
  // top, so both hold the same rows.
  const uint64_t fits = rows * (kDim * 8 + 64) * 2;
  const TableConfig tiered_config = Config(fits, dir + "/hot");
  const uint64_t tier_ram =
      SparseTable::TierMemoryBytes(tiered_config.sparse());
  TableConfig with_tier = Config(fits + 2 * tier_ram, dir + "/hot");
  std::unique_ptr<SparseTable> plain = MakeTable(Config(fits, ""), "");
  std::unique_ptr<SparseTable> tiered = MakeTable(with_tier, dir + "/hot");
  if (plain == nullptr || tiered == nullptr) return false;
  plain->Push(all, all_grads.data());
  tiered->Push(all, all_grads.data());
  std::vector<float> grads(per * kDim, 0.01f), out(per * kDim);
  auto step_of = [&](SparseTable* t) {
    return [&, t](const std::vector<uint64_t>& m) {
      t->Pull(m, out.data());
      t->Push(m, grads.data());
    };
  };
  // Alternating rounds, best of each: the machine's noise moves both.
  double best_plain = 0, best_tiered = 0;
  for (int round = 0; round < 3; ++round) {
    best_plain = std::max(
        best_plain,
        RunSteps(messages, seconds / 3, step_of(plain.get())).keys_per_s);
    best_tiered = std::max(
        best_tiered,
        RunSteps(messages, seconds / 3, step_of(tiered.get())).keys_per_s);
  }
  std::fprintf(stderr, "# hot_fits: %llu rows, %zu in RAM, %llu cold\n",
               static_cast<unsigned long long>(rows), tiered->num_rows(),
               static_cast<unsigned long long>(tiered->Stats().cold_rows()));
  Emit("hot_fits", best_tiered, "keys/s", best_plain);
  return true;
}

// Random 4 KiB reads/s of a file of `bytes` in `dir`, O_DIRECT, by
// `readers` threads at once (each one read at a time), for `seconds`; 0
// when it cannot be measured.
double RandomReadRate(const std::string& dir, uint64_t bytes, int readers,
                      double seconds) {
  const std::string path = dir + "/read-rate";
  {
    std::ofstream f(path, std::ios::binary);
    std::vector<char> chunk(1 << 20);
    for (size_t i = 0; i < chunk.size(); ++i)
      chunk[i] = static_cast<char>(Mix64(i));
    for (uint64_t written = 0; written < bytes; written += chunk.size())
      f.write(chunk.data(), chunk.size());
  }
  sync();
  const int fd = open(path.c_str(), O_RDONLY | O_DIRECT);
  if (fd < 0) {
    std::fprintf(stderr, "# %s: no O_DIRECT here (%s)\n", path.c_str(),
                 std::strerror(errno));
    return 0;
  }
  const uint64_t pages = bytes / 4096;
  std::atomic<uint64_t> reads{0};
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < readers; ++t) {
    threads.emplace_back([&, t] {
      void* buffer = nullptr;
      if (posix_memalign(&buffer, 4096, 4096) != 0) return;
      uint64_t rng = 7 + t, mine = 0;
      while (Since(start) < seconds) {
        for (int i = 0; i < 64; ++i) {
          rng = Mix64(rng);
          if (pread(fd, buffer, 4096,
                    static_cast<off_t>((rng % pages) * 4096)) != 4096)
            break;
          ++mine;
        }
      }
      reads += mine;
      free(buffer);
    });
  }
  for (std::thread& t : threads) t.join();
  const double rate = reads / Since(start);
  close(fd);
  std::filesystem::remove(path);
  return rate;
}

// The RocksDB-only baseline: every row in a DiskTier given the whole
// budget as memtables and block cache; the optimizer inline.
class RocksOnlyTable {
 public:
  static std::unique_ptr<RocksOnlyTable> Open(const std::string& dir,
                                              uint64_t memory) {
    DiskTier::Options o;
    o.dir = dir;
    o.state_floats = 2 * kDim;
    o.table_id = 1;
    o.memory_bytes = memory;
    auto tier = DiskTier::Open(o);
    if (!tier.ok()) {
      std::fprintf(stderr, "tiered_bench: %s\n",
                   tier.status().ToString().c_str());
      return nullptr;
    }
    return std::unique_ptr<RocksOnlyTable>(
        new RocksOnlyTable(*std::move(tier)));
  }
  void Load(uint64_t key) {
    std::vector<float> state(2 * kDim, 0.0f);
    for (uint32_t d = 0; d < kDim; ++d) state[kDim + d] = 0.1f;
    tier_->Put(key, state.data(), ColdRowTag{}).IgnoreError();
  }
  void Pull(const std::vector<uint64_t>& keys, float* out) {
    Read(keys);
    for (size_t i = 0; i < keys.size(); ++i)
      std::memcpy(out + i * kDim, &states_[i * 2 * kDim], kDim * sizeof(float));
  }
  void Push(const std::vector<uint64_t>& keys, const float* grads) {
    Read(keys);
    for (size_t i = 0; i < keys.size(); ++i) {
      float* w = &states_[i * 2 * kDim];
      float* acc = w + kDim;
      for (uint32_t d = 0; d < kDim; ++d) {
        const float g = grads[i * kDim + d];
        acc[d] += g * g;
        w[d] -= 0.1f * g / (std::sqrt(acc[d]) + 1e-8f);
      }
      tier_->Put(keys[i], w, tags_[i]).IgnoreError();
    }
  }
  const DiskTier& tier() const { return *tier_; }

 private:
  explicit RocksOnlyTable(std::unique_ptr<DiskTier> tier)
      : tier_(std::move(tier)) {}
  void Read(const std::vector<uint64_t>& keys) {
    states_.assign(keys.size() * 2 * kDim, 0.0f);
    tags_.assign(keys.size(), ColdRowTag{});
    tier_->MultiGet(keys, states_.data(), tags_.data(), &found_).IgnoreError();
  }
  std::unique_ptr<DiskTier> tier_;
  std::vector<float> states_;
  std::vector<ColdRowTag> tags_;
  std::vector<bool> found_;
};

// table_4x_budget and disk_read_efficiency.
bool LargeTable(const std::string& dir, double seconds, uint32_t per) {
  const uint64_t rows = absl::GetFlag(FLAGS_rows);
  const uint64_t budget = absl::GetFlag(FLAGS_budget_mb) << 20;
  const Zipf zipf(rows, absl::GetFlag(FLAGS_zipf));
  // A stream longer than either run gets through, so that no run sees the
  // same draws twice (a short cycle of messages would soon be all in RAM).
  std::vector<std::vector<uint64_t>> messages(
      std::max<uint64_t>(1, absl::GetFlag(FLAGS_stream_keys) / per));
  uint64_t rng = 3;
  for (auto& m : messages) {
    m.resize(per);
    for (uint64_t& k : m) k = zipf.Next(&rng);
  }
  std::vector<float> grads(per * kDim, 0.01f), out(per * kDim);

  const TableConfig config = Config(budget, dir + "/large");
  const double rss_before = RssBytes();
  std::unique_ptr<SparseTable> tiered = MakeTable(config, dir + "/large");
  if (tiered == nullptr) return false;
  // Load every row, in rank order from the coldest, so that the rows the
  // stream wants most are the last written (and in RAM at the start).
  Clock::time_point start = Clock::now();
  std::vector<uint64_t> batch;
  std::vector<float> load_grads(4096 * kDim, 0.01f);
  for (uint64_t r = rows; r > 0;) {
    batch.clear();
    for (; r > 0 && batch.size() < 4096; --r) batch.push_back(Mix64(r - 1));
    tiered->Push(batch, load_grads.data());
  }
  const double load_s = Since(start);
  const TableStats loaded = tiered->Stats();
  const double table_bytes =
      static_cast<double>(rows) * (tiered->state_floats() * 4 + 32);
  std::fprintf(stderr,
               "# table_4x_budget: %llu rows (about %.0f MiB of rows, %.1fx "
               "the %llu MiB budget), %llu in RAM, %llu on disk (%.0f MiB); "
               "loaded in %.1f s; Zipf %.2f puts %.2f of the draws on the "
               "rows RAM holds\n",
               static_cast<unsigned long long>(rows), table_bytes / (1 << 20),
               table_bytes / budget,
               static_cast<unsigned long long>(budget >> 20),
               static_cast<unsigned long long>(loaded.rows()),
               static_cast<unsigned long long>(loaded.cold_rows()),
               loaded.disk_bytes() / double(1 << 20), load_s,
               absl::GetFlag(FLAGS_zipf), zipf.Mass(loaded.rows()));

  // Warm both (LFU counts, block caches), then measure.
  auto tiered_step = [&](const std::vector<uint64_t>& m) {
    tiered->Pull(m, out.data());
    tiered->Push(m, grads.data());
  };
  // Both tables see the same stream: warmed by its start, measured on
  // what follows.
  size_t next = 0;
  RunSteps(messages, seconds / 4, tiered_step, &next);
  const size_t measure_from = next;
  const TableStats before = tiered->Stats();
  const uint64_t written_before = before.disk_bytes_written();
  start = Clock::now();
  const StepRates t = RunSteps(messages, seconds, tiered_step, &next);
  const double t_s = Since(start);
  const TableStats after = tiered->Stats();
  const double disk_reads_per_s =
      (after.disk_reads() - before.disk_reads()) / t_s;
  const double promotions = after.promotions() - before.promotions();
  const double cold_reads = after.cold_reads() - before.cold_reads();
  const double hit_rate = 1 - promotions / (t.keys_per_s * t_s);
  const double written_mb_s =
      (after.disk_bytes_written() - written_before) / t_s / (1 << 20);
  // What the table (rows, index, tier) added to the process, against its
  // budget: the budget is meant to bound it.
  const double rss_growth = RssBytes() - rss_before;
  std::fprintf(stderr,
               "# tiered: the process grew %.1f MiB with the table (budget "
               "%llu MiB; the table counts %.1f MiB)\n",
               rss_growth / (1 << 20),
               static_cast<unsigned long long>(budget >> 20),
               after.bytes() / double(1 << 20));
  tiered.reset();
  std::filesystem::remove_all(dir + "/large");

  std::unique_ptr<RocksOnlyTable> rocks =
      RocksOnlyTable::Open(dir + "/rocks", budget);
  if (rocks == nullptr) return false;
  for (uint64_t r = rows; r > 0; --r) rocks->Load(Mix64(r - 1));
  auto rocks_step = [&](const std::vector<uint64_t>& m) {
    rocks->Pull(m, out.data());
    rocks->Push(m, grads.data());
  };
  next = 0;
  RunSteps(messages, seconds / 4, rocks_step, &next);
  next = std::max(next, measure_from);
  const StepRates b = RunSteps(messages, seconds, rocks_step, &next);
  if (next > messages.size()) {
    std::fprintf(stderr,
                 "# the stream of %zu messages wrapped: raise --stream_keys\n",
                 messages.size());
  }
  rocks.reset();
  std::filesystem::remove_all(dir + "/rocks");

  // The tier reads with its I/O pool's threads and the caller's at once.
  const int readers = DiskTier::Options().read_threads + 1;
  const double read_rate =
      RandomReadRate(dir, uint64_t{2} << 30, readers, std::min(seconds, 5.0));
  const double read_rate_1 =
      RandomReadRate(dir, uint64_t{2} << 30, 1, std::min(seconds, 5.0));
  std::fprintf(stderr,
               "# tiered: p50 %.2f ms p99 %.2f ms a step of %u keys (pull + "
               "push); hit rate %.4f; %.0f promotions/s, %.0f cold reads/s, "
               "%.0f disk reads/s, %.1f MiB/s written\n"
               "# RocksDB only: p50 %.2f ms p99 %.2f ms\n"
               "# this disk: %.0f random 4 KiB reads/s (O_DIRECT, %d "
               "readers, each one read at a time), %.0f with one reader\n",
               t.p50_ms, t.p99_ms, per, hit_rate, promotions / t_s,
               cold_reads / t_s, disk_reads_per_s, written_mb_s, b.p50_ms,
               b.p99_ms, read_rate, readers, read_rate_1);
  Emit("table_4x_budget", t.keys_per_s, "keys/s", b.keys_per_s);
  Emit("rss_growth_of_budget", rss_growth, "bytes",
       static_cast<double>(budget));
  if (read_rate > 0)
    Emit("disk_read_efficiency", disk_reads_per_s, "reads/s", read_rate);
  Note("hit_rate", hit_rate);
  Note("p50_ms", t.p50_ms);
  Note("p99_ms", t.p99_ms);
  Note("baseline_p50_ms", b.p50_ms);
  Note("baseline_p99_ms", b.p99_ms);
  Note("written_mb_per_s", written_mb_s);
  Note("load_s", load_s);
  return true;
}

int Main() {
  const std::string dir = absl::GetFlag(FLAGS_dir);
  const double seconds = absl::GetFlag(FLAGS_seconds);
  const uint32_t per = absl::GetFlag(FLAGS_message_keys);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    std::fprintf(stderr, "tiered_bench: %s: %s\n", dir.c_str(),
                 ec.message().c_str());
    return 1;
  }
  const Clock::time_point start = Clock::now();
  const double cache_before = BuffCacheMb();
  const bool ok = HotFits(dir, seconds, per) && LargeTable(dir, seconds, per);
  const double cache_after = BuffCacheMb();
  std::filesystem::remove_all(dir, ec);
  if (!ok) return 1;
  std::fprintf(stderr,
               "# buff/cache %.0f MiB before, %.0f MiB after; the run took "
               "%.0f s and left nothing in %s\n",
               cache_before, cache_after, Since(start), dir.c_str());
  Note("buff_cache_mb_before", cache_before);
  Note("buff_cache_mb_after", cache_after);
  Note("run_s", Since(start));
  std::printf("{\"bench\":\"tiered\",\"summary\":{%s}}\n",
              absl::StrJoin(SummaryFields(), ",").c_str());
  return 0;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ps::Main();
}
