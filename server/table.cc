#include "server/table.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <new>
#include <numeric>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/finite.h"
#include "common/hash.h"
#include "common/initializer.h"
#include "server/server_log.h"

namespace ps {

namespace {

// Row chunks of whole 2 MiB multiples are placed on 2 MiB boundaries and
// marked for transparent huge pages: a random row then costs one TLB entry
// per 2 MiB instead of per 4 KiB, which is most of the gap between a naive
// and a prefetched gather over a table far larger than the caches.
// Smaller chunks (small tables) keep 4 KiB pages, so a table does not hold
// a huge page per touched row. Throws std::bad_alloc like new[].
unsigned char* AllocateChunk(size_t bytes) {
  constexpr size_t kHugePage = size_t{2} << 20;
  void* p = nullptr;
  if (bytes % kHugePage == 0) {
    p = std::aligned_alloc(kHugePage, bytes);
    if (p != nullptr) madvise(p, bytes, MADV_HUGEPAGE);
  } else {
    // On a cache line, so that RowSpan can count a row's lines once.
    p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  }
  if (p == nullptr) throw std::bad_alloc();
  return static_cast<unsigned char*>(p);
}

// Table generations (SparseTable::generation) come from one counter, so
// that a memo of one table is never current in another.
std::atomic<uint64_t> g_next_generation{1};
uint64_t NewGeneration() { return g_next_generation.fetch_add(1, std::memory_order_relaxed); }

// Hints the CPU to load `lines` cache lines from `p` on, for writing when
// kForWrite (the hint must be a constant, hence the template). Rows are
// prefetched up to kMaxLinesPrefetched lines: wider ones stream in anyway.
constexpr size_t kMaxLinesPrefetched = 8;
// `lines` >= 1 (a row has at least one). Each line after the first sits
// behind a test of its own rather than in a loop: within one pull or push
// `lines` is the same for every row, so each test goes the same way every
// time and is always predicted, while a loop's exit is predicted only
// through the branch history, which the index probes before it scramble,
// and a mispredicted exit discards the lookups and prefetches issued after
// it. (That is the likely cause; the VMs measured have no counters for
// mispredictions. The loop's form was the only difference measured.)
// With the loop, a 4 GiB table's pull (rows of 4 lines) read 0.53-0.67 of
// the gather limit; with these tests 0.70-0.86, in seven alternating pairs
// of `table_bench --rows=65536 --seconds=0.5` (docs/PERFORMANCE.md).
template <int kForWrite>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void PrefetchLines(const void* p, size_t lines) {
  static_assert(kMaxLinesPrefetched == 8, "one test per line below");
  const char* c = static_cast<const char*>(p);
  // Nested, so that a one-line row (dim-1 tables) pays one test.
  __builtin_prefetch(c, kForWrite);
  if (lines <= 1) return;
  __builtin_prefetch(c + 64, kForWrite);
  if (lines <= 2) return;
  __builtin_prefetch(c + 128, kForWrite);
  if (lines <= 3) return;
  __builtin_prefetch(c + 192, kForWrite);
  if (lines <= 4) return;
  __builtin_prefetch(c + 256, kForWrite);
  if (lines <= 5) return;
  __builtin_prefetch(c + 320, kForWrite);
  if (lines <= 6) return;
  __builtin_prefetch(c + 384, kForWrite);
  if (lines <= 7) return;
  __builtin_prefetch(c + 448, kForWrite);
}

// Hints the CPU to load every line of [p, p + bytes), bytes >= 1, up to
// kMaxLinesPrefetched lines: unlike a count of lines from p, it includes the
// line a row not aligned to one spills into (rows with bookkeeping straddle
// lines).
template <int kForWrite>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void PrefetchSpan(const void* p, size_t bytes) {
  const uintptr_t first = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63};
  const uintptr_t last = (reinterpret_cast<uintptr_t>(p) + bytes - 1) & ~uintptr_t{63};
  PrefetchLines<kForWrite>(reinterpret_cast<const void*>(first),
                           std::min<size_t>(kMaxLinesPrefetched, (last - first) / 64 + 1));
}

// The first `first_bytes` bytes of every row of a table with rows of
// `row_bytes` bytes, for prefetching. Chunks start on a cache line, so when
// rows are whole lines, or evenly divide one, those bytes cover the same
// number of lines in every row, counted here once; otherwise the count
// depends on where the row starts (PrefetchSpan, a few instructions more per
// row).
struct RowSpan {
  RowSpan(size_t row_bytes, size_t first_bytes) : bytes(first_bytes) {
    if (row_bytes % 64 == 0) {
      fixed_lines = std::min<size_t>(kMaxLinesPrefetched, (first_bytes + 63) / 64);
    } else if (64 % row_bytes == 0) {
      fixed_lines = 1;
    }
  }
  size_t bytes;
  size_t fixed_lines = 0;  // 0: counted per row
};

// Prefetches `span` of the row at p.
template <int kForWrite>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void PrefetchRowSpan(const unsigned char* p,
                                                         const RowSpan& span) {
  if (span.fixed_lines != 0) {
    PrefetchLines<kForWrite>(p, span.fixed_lines);
  } else {
    PrefetchSpan<kForWrite>(p, span.bytes);
  }
}

// Prefetches `span` of row r, if r is a row. A function that must be
// inlined, not a lambda: GCC found the memo loops' prefetching lambdas free
// of side effects (a prefetch has none it models) and deleted their calls,
// so rows read through memos were not prefetched at all.
template <int kForWrite, typename Locator>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void PrefetchRow(const Locator& locate, uint32_t r,
                                                     const RowSpan& span) {
  if (r != RowIndex::kNotFound) PrefetchRowSpan<kForWrite>(locate.Bytes(r), span);
}

// Copies a row's `dim` floats to `out` for a pull. One float needs no call
// to memcpy (dim-1 tables are the common sparse case).
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void CopyRow(const float* v, uint32_t dim, float* out) {
  if (dim == 1) {
    *out = *v;
  } else {
    std::memcpy(out, v, dim * sizeof(float));
  }
}

constexpr size_t kMaxSparseChunkBytes = size_t{4} << 20;

// The disk tier of sparse table `config` in its directory under env.
absl::StatusOr<std::unique_ptr<DiskTier>> OpenDiskTier(
    const TableConfig& config, const TableEnv& env, size_t state_floats) {
  static std::atomic<uint64_t> next_own_dir{0};
  const DiskTierConfig& dt = config.sparse().disk_tier();
  DiskTier::Options o;
  o.dir = env.tier_root.empty()
              ? absl::StrCat(dt.dir(), "/table-", config.id(), "-", getpid(),
                             "-", next_own_dir.fetch_add(1))
              : absl::StrCat(env.tier_root, "/table-", config.id());
  o.state_floats = state_floats;
  o.table_id = config.id();
  o.num_slots = env.num_slots;
  o.max_disk_bytes = dt.max_disk_bytes();
  o.memory_bytes = SparseTable::TierMemoryBytes(config.sparse());
  o.buffered_io = dt.buffered_io();
  auto tier = DiskTier::Open(o);
  if (!tier.ok()) {
    return absl::Status(
        tier.status().code(),
        absl::StrCat("table '", config.name(), "': ", tier.status().message()));
  }
  return tier;
}
constexpr int kMaxSparseChunkShift = 14;

}  // namespace

absl::StatusOr<std::unique_ptr<Table>> Table::Create(const TableConfig& config,
                                                     const TableEnv& env) {
  auto optimizer = Optimizer::Create(config.optimizer());
  if (!optimizer.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table '", config.name(), "': ", optimizer.status().message()));
  }
  switch (config.kind_case()) {
    case TableConfig::kSparse: {
      if (absl::Status valid = ValidateSparseTable(config.sparse());
          !valid.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("table '", config.name(), "': ", valid.message()));
      }
      auto table = std::make_unique<SparseTable>(config, std::move(optimizer).value());
      if (table->max_rows() == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "table '", config.name(), "': sparse.memory_budget_bytes (",
            config.sparse().memory_budget_bytes(), ") cannot hold one row"));
      }
      if (config.sparse().has_disk_tier()) {
        PS_ASSIGN_OR_RETURN(std::unique_ptr<DiskTier> tier,
                            OpenDiskTier(config, env, table->state_floats()));
        table->AttachDiskTier(std::move(tier));
      }
      return std::unique_ptr<Table>(std::move(table));
    }
    case TableConfig::kDense:
      if (config.dense().size() == 0 || config.dense().block_size() == 0 ||
          config.dense().block_size() > (1u << 26)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "table '", config.name(),
            "': dense size must be > 0 and block_size in 1..2^26"));
      }
      return std::unique_ptr<Table>(
          new DenseTable(config, std::move(optimizer).value()));
    case TableConfig::KIND_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("table '", config.name(), "': set sparse or dense"));
}

// ---------------------------------------------------------------- sparse

namespace {

bool Evictable(const SparseTableConfig& c) {
  return c.ttl_steps() > 0 || c.ttl_seconds() > 0 ||
         (c.memory_budget_bytes() > 0 && c.eviction() != EVICT_NONE);
}

int ChunkShift(size_t row_bytes, uint64_t budget) {
  // Under a budget a chunk is at most 1/64 of it, so the partly filled last
  // chunk wastes little of the budget.
  size_t max_chunk = kMaxSparseChunkBytes;
  if (budget > 0) max_chunk = std::min<size_t>(max_chunk, budget / 64);
  int shift = kMaxSparseChunkShift;
  while (shift > 0 && (row_bytes << shift) > max_chunk) --shift;
  return shift;
}

}  // namespace

SparseTable::SparseTable(const TableConfig& config,
                         std::unique_ptr<Optimizer> optimizer)
    : Table(config, std::move(optimizer)),
      dim_(config.sparse().dim()),
      stride_(static_cast<size_t>(dim_) * (1 + optimizer_->state_size())),
      evictable_(Evictable(config.sparse())),
      meta_bytes_(evictable_ ? sizeof(RowMeta) : 0),
      // Rounded to 8 bytes with metadata, so every row's RowMeta is aligned.
      row_bytes_(evictable_ ? (meta_bytes_ + stride_ * sizeof(float) + 7) / 8 * 8
                            : stride_ * sizeof(float)),
      chunk_shift_(ChunkShift(row_bytes_, config.sparse().memory_budget_bytes())),
      chunk_rows_(1u << chunk_shift_),
      admit_after_(config.sparse().admit_after_pushes()),
      ttl_steps_(config.sparse().ttl_steps()),
      ttl_seconds_(config.sparse().ttl_seconds()),
      eviction_(config.sparse().eviction()),
      rng_(HashCombine(0x5eed, config.id())),
      generation_(NewGeneration()) {
  if (admit_after_ > 1) {
    const uint32_t width = config.sparse().admission_sketch_width() > 0
                               ? config.sparse().admission_sketch_width()
                               : 262144;
    sketch_ = std::make_unique<AdmissionSketch>(width, HashCombine(0xad, config.id()));
  }
  // Row ids are uint32 with one value reserved.
  max_rows_ = kNil - 1;
  // The disk tier's RAM (its own and its staged reads) comes out of the
  // budget first.
  const uint64_t budget = config.sparse().memory_budget_bytes() -
                          TierMemoryBytes(config.sparse()) -
                          StagingBytes(config.sparse());
  if (budget > 0) {
    // The largest row count whose allocations fit: BytesFor is monotone.
    size_t lo = 0;
    size_t hi = std::min<size_t>(max_rows_, budget / row_bytes_ + 1);
    while (lo < hi) {
      const size_t mid = lo + (hi - lo + 1) / 2;
      if (BytesFor(mid) <= budget) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    max_rows_ = lo;
    index_.set_max_entries(max_rows_);
    chunks_.reserve((max_rows_ + chunk_rows_ - 1) / chunk_rows_);
  }
}

size_t SparseTable::BytesFor(size_t rows) const {
  const size_t chunks = (rows + chunk_rows_ - 1) / chunk_rows_;
  return chunks * (chunk_rows_ * row_bytes_ + sizeof(chunks_[0])) +
         RowIndex::CapacityFor(rows) * RowIndex::kBytesPerSlot +
         (sketch_ != nullptr ? sketch_->MemoryBytes() : 0);
}

uint64_t SparseTable::TierMemoryBytes(const SparseTableConfig& config) {
  if (!config.has_disk_tier()) return 0;
  const uint64_t budget = config.memory_budget_bytes();
  uint64_t bytes = config.disk_tier().memory_bytes();
  if (bytes == 0)
    bytes = std::max<uint64_t>(budget / 8, DiskTier::kMinTierMemory);
  return std::min(bytes, budget / 2);
}

size_t SparseTable::MemoryBytes() const {
  return chunks_.size() * chunk_rows_ * row_bytes_ +
         chunks_.capacity() * sizeof(chunks_[0]) + index_.MemoryBytes() +
         (sketch_ != nullptr ? sketch_->MemoryBytes() : 0) +
         (tier_ != nullptr ? tier_->MemoryBytes() : 0) +
         (reader_ != nullptr ? reader_->MemoryBytes() : 0);
}

TableStats SparseTable::Stats() const {
  TableStats s = BaseStats();
  s.set_sparse(true);
  s.set_rows(num_rows());
  if (tier_ != nullptr) {
    const DiskTierCounters c = tier_->Counters();
    s.set_cold_rows(c.cold_rows);
    s.set_disk_bytes(tier_->DiskBytes());
    s.set_demotions(c.demotions);
    s.set_promotions(c.promotions);
    s.set_cold_reads(c.cold_reads);
    s.set_cold_misses(c.cold_misses);
    s.set_bloom_useful(c.bloom_useful);
    s.set_disk_reads(c.disk_reads);
    s.set_cold_read_micros(c.read_micros);
    s.set_disk_bytes_written(c.bytes_written);
    s.set_cold_rows_dropped(c.cold_rows_dropped);
    s.set_tier_errors(c.errors);
    s.set_tier_memory_bytes(tier_->MemoryBytes());
    if (reader_ != nullptr) {
      s.set_rows_read_ahead(reader_->rows_read());
      s.set_staged_rows(reader_->staged_rows());
    }
  }
  return s;
}

bool SparseTable::Demote(uint32_t r) {
  const RowMeta& m = Meta(r);
  if (reader_ != nullptr) reader_->Invalidate(m.key);
  // A refusal (max_disk_bytes) is counted and logged by the tier.
  const absl::StatusOr<bool> stored = tier_->Put(
      m.key, Values(r), ColdRowTag{m.last_step, m.last_second, m.touches});
  if (!stored.ok()) NoteTierFailure(stored.status());
  return stored.ok() && *stored;
}

void SparseTable::NoteTierFailure(const absl::Status& error) const {
  if (!tier_failure_.ok()) return;
  tier_failure_ = absl::Status(
      error.code(), absl::StrCat("the disk tier of table '", config_.name(),
                                 "' failed: ", error.message()));
  ServerLog()->error("{}; the table can no longer be trusted",
                     tier_failure_.message());
}

bool SparseTable::FetchCold(uint64_t key, ColdRowTag* tag) {
  cold_state_.resize(stride_);
  const float* staged =
      reader_ != nullptr ? reader_->Staged(key, tag) : nullptr;
  if (staged != nullptr) {
    std::memcpy(cold_state_.data(), staged, stride_ * sizeof(float));
  } else {
    const absl::StatusOr<bool> found = tier_->Get(key, cold_state_.data(), tag);
    if (!found.ok()) {
      NoteTierFailure(found.status());
      return false;
    }
    if (!*found) return false;
  }
  if (Expired(tag->last_step, tag->last_second)) {
    DropExpiredCold(key);
    return false;
  }
  return true;
}

void SparseTable::DeleteCold(uint64_t key) {
  if (reader_ != nullptr) reader_->Invalidate(key);
  if (absl::Status s = tier_->Delete(key); !s.ok()) NoteTierFailure(s);
}

void SparseTable::DropExpiredCold(uint64_t key) {
  DeleteCold(key);
  ++counters_.evictions_ttl;
  if (watch_ != nullptr) watch_->RowChanged(id(), true, key);
}

bool SparseTable::ReadColdKeys() {
  const size_t n = cold_keys_.size();
  cold_states_.resize(n * stride_);
  cold_tags_.resize(n);
  // Rows the reader staged are copied; the rest are read in one batch.
  std::vector<size_t> unstaged;
  if (reader_ != nullptr && reader_->staged_rows() > 0) {
    cold_found_.assign(n, false);
    for (size_t i = 0; i < n; ++i) {
      const float* staged = reader_->Staged(cold_keys_[i], &cold_tags_[i]);
      if (staged == nullptr) {
        unstaged.push_back(i);
        continue;
      }
      std::memcpy(&cold_states_[i * stride_], staged, stride_ * sizeof(float));
      cold_found_[i] = true;
    }
    if (unstaged.size() == n)
      unstaged.clear();  // none staged: read all
    else if (unstaged.empty())
      return true;
  }
  if (unstaged.empty()) {
    const absl::Status read = tier_->MultiGet(cold_keys_, cold_states_.data(),
                                              cold_tags_.data(), &cold_found_);
    if (!read.ok()) NoteTierFailure(read);
    return read.ok();
  }
  std::vector<uint64_t> keys(unstaged.size());
  for (size_t j = 0; j < unstaged.size(); ++j)
    keys[j] = cold_keys_[unstaged[j]];
  std::vector<float> states(keys.size() * stride_);
  std::vector<ColdRowTag> tags(keys.size());
  std::vector<bool> found;
  const absl::Status read =
      tier_->MultiGet(keys, states.data(), tags.data(), &found);
  if (!read.ok()) {
    NoteTierFailure(read);
    return false;
  }
  for (size_t j = 0; j < unstaged.size(); ++j) {
    const size_t i = unstaged[j];
    cold_found_[i] = found[j];
    if (!found[j]) continue;
    cold_tags_[i] = tags[j];
    std::memcpy(&cold_states_[i * stride_], &states[j * stride_],
                stride_ * sizeof(float));
  }
  return true;
}

void SparseTable::StartColdReader(std::function<void()> done,
                                  std::function<void()> before_read) {
  if (tier_ == nullptr || reader_ != nullptr) return;
  // A staged row: its floats, its tag and its slots in the maps.
  const size_t row_bytes = stride_ * sizeof(float) + 128;
  const size_t max_rows =
      std::max<size_t>(16, StagingBytes(config_.sparse()) / row_bytes);
  reader_ = std::make_unique<ColdReader>(
      tier_.get(), stride_, max_rows, std::move(done), std::move(before_read));
}

uint64_t SparseTable::ColdWait(absl::Span<const uint64_t> keys, bool promote) {
  if (reader_ == nullptr || (tier_->rows() == 0 && !reader_->busy())) {
    return 0;
  }
  uint64_t wait = 0;
  std::vector<uint64_t> to_read;
  for (uint64_t key : keys) {
    if (index_.Find(key) != RowIndex::kNotFound) continue;
    uint64_t batch = 0;
    switch (reader_->Find(key, &batch)) {
      case ColdReader::Where::kStaged:
        break;
      case ColdReader::Where::kReading:
        wait = std::max(wait, batch);
        break;
      case ColdReader::Where::kNone:
        to_read.push_back(key);
        break;
    }
  }
  // A hint promotes at most half the rows RAM holds: more would evict the
  // rows it promoted itself, or all of those the requests under way use.
  if (promote && max_rows_ != ~size_t{0} && to_read.size() > max_rows_ / 2)
    to_read.resize(max_rows_ / 2);
  if (!to_read.empty())
    wait = std::max(wait, reader_->Submit(to_read, promote));
  return wait;
}

bool SparseTable::InstallColdReads() {
  if (reader_ == nullptr) return false;
  absl::Status error;
  if (!reader_->InstallOne(&error)) return false;
  if (!error.ok()) NoteTierFailure(error);
  if (reader_->last_promote()) {
    // Read ahead of its requests: into RAM now, as their pull would.
    const std::vector<uint64_t> keys = reader_->last_staged();
    for (uint64_t key : keys) {
      if (index_.Find(key) != RowIndex::kNotFound) continue;
      const uint32_t r = Promote(key);
      if (r != kNil && evictable_) Touch(r);
    }
  }
  return true;
}

void SparseTable::ReadColdPulls(float* out) {
  const size_t n = cold_pulls_.size();
  cold_keys_.resize(n);
  for (size_t i = 0; i < n; ++i) cold_keys_[i] = cold_pulls_[i].key;
  if (!ReadColdKeys()) cold_found_.assign(n, false);
  absl::flat_hash_set<uint64_t> expired;  // allocates once one expires
  for (size_t i = 0; i < n; ++i) {
    const uint64_t key = cold_pulls_[i].key;
    float* dst = out + cold_pulls_[i].at * dim_;
    const ColdRowTag& tag = cold_tags_[i];
    if (cold_found_[i] && Expired(tag.last_step, tag.last_second)) {
      // A key pulled twice in the message is deleted (and counted) once.
      if (expired.insert(key).second) DropExpiredCold(key);
      cold_found_[i] = false;
    }
    if (!cold_found_[i]) {
      InitializeValues(config_.init(), config_.id(), key, 0, dim_, dst);
      continue;
    }
    std::memcpy(dst, &cold_states_[i * stride_], dim_ * sizeof(float));
    // Into RAM, as a cache does on a read: the push of the pulled keys
    // usually follows. Every pulled value is copied already, so the rows
    // this evicts are not read any more. A key pulled twice is promoted
    // once.
    if (index_.Find(key) != RowIndex::kNotFound) continue;
    const uint32_t r = PromoteRead(key, &cold_states_[i * stride_], tag);
    if (r != kNil && evictable_) Touch(r);
  }
  cold_pulls_.clear();
}

void SparseTable::PrefetchPushRows() {
  push_prefetched_ = true;
  cold_keys_.clear();
  for (uint64_t key : push_keys_) {
    if (index_.Find(key) == RowIndex::kNotFound) cold_keys_.push_back(key);
  }
  if (!ReadColdKeys()) return;
  for (size_t i = 0; i < cold_keys_.size(); ++i) {
    if (cold_found_[i]) cold_ready_.emplace(cold_keys_[i], i);
  }
}

bool SparseTable::TakeCold(uint64_t key, const float** state, ColdRowTag* tag) {
  if (!push_keys_.empty() && !push_prefetched_) PrefetchPushRows();
  const auto it = cold_ready_.find(key);
  if (it == cold_ready_.end()) {
    // Not read ahead: absent then, or demoted since within this push.
    if (!FetchCold(key, tag)) return false;
    *state = cold_state_.data();
    return true;
  }
  const size_t i = it->second;
  // Once taken it is promoted: a later copy of the key in the push finds
  // it in RAM, or (evicted again meanwhile) reads its newer state from disk.
  cold_ready_.erase(it);
  *tag = cold_tags_[i];
  if (Expired(tag->last_step, tag->last_second)) {
    DropExpiredCold(key);
    return false;
  }
  *state = &cold_states_[i * stride_];
  return true;
}

uint32_t SparseTable::Promote(uint64_t key) {
  ColdRowTag tag;
  const float* state = nullptr;
  if (!TakeCold(key, &state, &tag)) return kNil;
  return PromoteRead(key, state, tag);
}

uint32_t SparseTable::PromoteRead(uint64_t key, const float* state,
                                  const ColdRowTag& tag) {
  const uint32_t r = CreateRow(key, state);
  if (r == kNil) return kNil;  // an evicting table always finds room
  // A cold copy left behind would be exported beside the hot row.
  DeleteCold(key);
  tier_->CountPromotion();
  RowMeta& m = Meta(r);
  m.last_step = tag.last_step;
  m.last_second = tag.last_second;
  m.touches = tag.touches;
  return r;
}

uint32_t SparseTable::RowForPush(uint64_t key) {
  // A cold row comes back as it was, past the admission filter.
  if (tier_ != nullptr) {
    const uint32_t r = Promote(key);
    if (r != kNil) {
      Touch(r);
      return r;
    }
  }
  if (sketch_ != nullptr && sketch_->Add(key) < admit_after_) {
    ++counters_.pushes_filtered;
    return kNil;
  }
  const uint32_t r = CreateRow(key);
  if (r == kNil) {
    ++counters_.keys_dropped;
    return kNil;
  }
  ++counters_.admissions;
  return r;
}

absl::Status SparseTable::ExportColdRows(size_t page_rows,
                                         DiskTier::RowPageFn fn,
                                         const std::vector<bool>* slots) const {
  if (tier_ == nullptr) return absl::OkStatus();
  // fn's errors pass through as they are; only the tier's own are noted.
  absl::Status from_fn;
  const absl::Status read = tier_->ForEachRow(
      page_rows,
      [&](absl::Span<const uint64_t> keys, absl::Span<const float> states) {
        from_fn = fn(keys, states);
        return from_fn;
      },
      slots);
  if (!read.ok() && from_fn.ok()) NoteTierFailure(read);
  return read;
}

void SparseTable::Unlink(uint32_t r) {
  RowMeta& m = Meta(r);
  if (m.prev != kNil) Meta(m.prev).next = m.next; else mru_ = m.next;
  if (m.next != kNil) Meta(m.next).prev = m.prev; else lru_ = m.prev;
}

void SparseTable::PushFront(uint32_t r) {
  RowMeta& m = Meta(r);
  m.prev = kNil;
  m.next = mru_;
  if (mru_ != kNil) Meta(mru_).prev = r; else lru_ = r;
  mru_ = r;
}

void SparseTable::Touch(uint32_t r) {
  if (!evictable_) return;
  RowMeta& m = Meta(r);
  if (mru_ != r) {
    Unlink(r);
    PushFront(r);
  }
  m.last_step = step_;
  m.last_second = now_second_;
  if (m.touches != ~uint32_t{0}) ++m.touches;
}

void SparseTable::Drop(uint32_t r, bool changed) {
  RowMeta& m = Meta(r);
  if (watch_ != nullptr && changed) watch_->RowChanged(id(), true, m.key);
  index_.Erase(m.key);
  Unlink(r);
  m.touches = 0;  // marks a free row for LFU sampling
  m.next = free_head_;
  free_head_ = r;
  // The row's number may be handed to another key: memos of this table
  // stop being current.
  generation_ = NewGeneration();
}

size_t SparseTable::DropRows(absl::FunctionRef<bool(uint64_t key)> drop) {
  std::vector<uint64_t> keys;
  index_.ForEach([&](uint64_t key, uint32_t) {
    if (drop(key)) keys.push_back(key);
  });
  return DropKeys(keys, nullptr);
}

size_t SparseTable::DropRowsFrom(size_t begin, size_t max_positions,
                                 absl::FunctionRef<bool(uint64_t key)> drop,
                                 std::vector<uint64_t>* key_of,
                                 size_t* dropped) {
  std::vector<uint64_t> keys;
  size_t next =
      index_.ForEachFrom(begin, max_positions, [&](uint64_t key, uint32_t) {
        if (drop(key)) keys.push_back(key);
        return true;
      });
  if (next >= index_.capacity()) next = 0;
  *dropped = DropKeys(keys, key_of);
  return next;
}

size_t SparseTable::DropKeys(const std::vector<uint64_t>& keys,
                             std::vector<uint64_t>* key_of) {
  if (keys.empty()) return 0;
  if (evictable_) {
    for (uint64_t key : keys) Drop(index_.Find(key));
    return keys.size();
  }
  // Without bookkeeping rows are numbered densely from 0 and nothing knows
  // a row's key but the index: fill each hole with the last row. Only the
  // last keys.size() rows can move, so only their keys are needed: from
  // the caller's `key_of` (every row's, kept across steps) or a pass.
  const uint32_t base =
      key_of != nullptr ? 0 : high_water_ - static_cast<uint32_t>(keys.size());
  std::vector<uint64_t> tail;
  std::vector<uint64_t>& tail_key = key_of != nullptr ? *key_of : tail;
  if (key_of == nullptr || key_of->size() != high_water_) {
    tail_key.assign(high_water_ - base, 0);
    index_.ForEach([&](uint64_t key, uint32_t row) {
      if (row >= base) tail_key[row - base] = key;
    });
  }
  for (uint64_t key : keys) {
    const uint32_t r = index_.Find(key);
    index_.Erase(key);
    // A row moved into the hole keeps its key and state: not a change.
    if (watch_ != nullptr) watch_->RowChanged(id(), true, key);
    const uint32_t last = --high_water_;
    if (r == last) continue;
    std::memcpy(Values(r), Values(last), stride_ * sizeof(float));
    const uint64_t moved = tail_key[last - base];
    index_.Erase(moved);
    index_.Insert(moved, r);
    if (r >= base) tail_key[r - base] = moved;
  }
  if (key_of != nullptr) key_of->resize(high_water_);
  const size_t chunks_needed =
      (static_cast<size_t>(high_water_) + chunk_rows_ - 1) >> chunk_shift_;
  if (chunks_needed < chunks_.size()) chunks_.resize(chunks_needed);
  generation_ = NewGeneration();
  return keys.size();
}

uint32_t SparseTable::PickVictim() {
  if (eviction_ != EVICT_LFU) return lru_;
  // Sample rows and keep the least used. When the table is full every row
  // below high_water_ is live, so samples rarely miss.
  constexpr int kSamples = 16;
  uint32_t best = kNil;
  for (int tries = 0, found = 0; found < kSamples && tries < 4 * kSamples; ++tries) {
    rng_ = Mix64(rng_);
    const uint32_t r = static_cast<uint32_t>(
        (static_cast<unsigned __int128>(rng_) * high_water_) >> 64);
    const RowMeta& m = Meta(r);
    if (m.touches == 0) continue;
    ++found;
    if (best == kNil) {
      best = r;
      continue;
    }
    const RowMeta& b = Meta(best);
    if (m.touches < b.touches ||
        (m.touches == b.touches &&
         (m.last_step < b.last_step ||
          (m.last_step == b.last_step && m.last_second < b.last_second)))) {
      best = r;
    }
  }
  return best != kNil ? best : lru_;
}

uint32_t SparseTable::CreateRow(uint64_t key, const float* state) {
  if (index_.size() >= max_rows_) {
    if (eviction_ == EVICT_NONE || !evictable_) return kNil;
    const uint32_t victim = PickVictim();
    if (victim == kNil) return kNil;
    const bool demoted = tier_ != nullptr && Demote(victim);
    Drop(victim, /*changed=*/!demoted);
    ++counters_.evictions_budget;
  }
  uint32_t r;
  if (free_head_ != kNil) {
    r = free_head_;
    free_head_ = Meta(r).next;
  } else {
    r = high_water_++;
    if ((r >> chunk_shift_) >= chunks_.size()) {
      chunks_.emplace_back(AllocateChunk(chunk_rows_ * row_bytes_));
    }
  }
  float* values = Values(r);
  if (state != nullptr) {
    std::memcpy(values, state, stride_ * sizeof(float));
  } else {
    InitializeValues(config_.init(), config_.id(), key, 0, dim_, values);
    optimizer_->InitState(values + dim_, dim_);
  }
  index_.Insert(key, r);
  if (evictable_) {
    RowMeta& m = Meta(r);
    m.key = key;
    m.last_step = step_;
    m.last_second = now_second_;
    m.touches = 1;
    PushFront(r);
  }
  return r;
}

void SparseTable::Advance(uint64_t step, absl::Time now) {
  step_ = std::max(step_, step);
  if (!started_) {
    created_ = now;
    started_ = true;
  }
  const int64_t seconds = absl::ToInt64Seconds(now - created_);
  if (seconds > 0) {
    now_second_ = std::max(now_second_, static_cast<uint32_t>(std::min<int64_t>(
                                            seconds, ~uint32_t{0})));
  }
  if (ttl_steps_ == 0 && ttl_seconds_ == 0) return;
  // The recency list is ordered by last touch, so expired rows are at its
  // end: this costs O(1) plus the rows dropped.
  while (lru_ != kNil) {
    const RowMeta& m = Meta(lru_);
    if (!Expired(m.last_step, m.last_second)) break;
    Drop(lru_);
    ++counters_.evictions_ttl;
  }
}

absl::Status SparseTable::CheckPush(absl::Span<const uint64_t> keys,
                                    const RowMemo* memo) const {
  if (max_rows_ >= kNil - 1 || eviction_ != EVICT_NONE) return absl::OkStatus();
  // Without eviction no row is dropped, so a current memo's rows are still
  // there: only the keys it holds as absent need a lookup.
  const uint32_t* known = MemoCurrent(memo, keys.size()) ? memo->rows.data() : nullptr;
  // Distinct keys without a row, with their pushes in this request.
  absl::flat_hash_map<uint64_t, uint32_t> absent;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (known != nullptr && known[i] != RowIndex::kNotFound) continue;
    if (index_.Find(keys[i]) == RowIndex::kNotFound) ++absent[keys[i]];
  }
  size_t needed = 0;
  for (const auto& [key, pushes] : absent) {
    const uint32_t count = sketch_ != nullptr ? sketch_->Estimate(key) + pushes : pushes;
    if (admit_after_ <= 1 || count >= admit_after_) ++needed;
  }
  if (num_rows() + needed <= max_rows_) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "table '", config_.name(), "' is at its memory budget on this server (",
      config_.sparse().memory_budget_bytes(), " bytes: ", num_rows(), " of ",
      max_rows_, " rows held) and eviction is off; the push needs ", needed,
      " new rows and was not applied. Raise sparse.memory_budget_bytes, add "
      "servers, or set sparse.eviction."));
}

inline void SparseTable::StartLookUps(const RowIndex::View& index,
                                      absl::Span<const uint64_t> keys,
                                      uint64_t* hashes) const {
  for (size_t i = 0; i < keys.size() && i < kLookupBlock; ++i) {
    hashes[i] = RowIndex::Hash(keys.data()[i]);
    index.PrefetchHashed(hashes[i]);
  }
}

inline void SparseTable::LookUpBlock(const RowIndex::View& index, const RowLocator& locate,
                                     absl::Span<const uint64_t> keys, size_t begin,
                                     size_t end, size_t value_bytes, bool for_write,
                                     uint64_t* hashes, uint32_t* rows,
                                     float** values) const {
  static_assert((kHashRing & (kHashRing - 1)) == 0 && kHashRing >= 2 * kLookupBlock,
                "the ring holds two blocks of hashes");
  // The bookkeeping in front of the floats too: Touch writes it.
  const RowSpan touched(locate.row_bytes, locate.meta_bytes + value_bytes);
  const uint64_t* k = keys.data();
  const size_t n = keys.size();
  for (size_t i = begin; i < end; ++i) {
    const size_t ahead = i + kLookupBlock;
    if (ahead < n) {
      const uint64_t h = RowIndex::Hash(k[ahead]);
      hashes[ahead % kHashRing] = h;
      index.PrefetchHashed(h);
    }
    const uint32_t r = index.FindHashed(k[i], hashes[i % kHashRing]);
    rows[i - begin] = r;
    if (r == RowIndex::kNotFound) {
      values[i - begin] = nullptr;
      continue;
    }
    float* const v = locate.Values(r);
    values[i - begin] = v;
    if (for_write) {
      PrefetchRowSpan<1>(locate.Bytes(r), touched);
    } else {
      PrefetchRowSpan<0>(locate.Bytes(r), touched);
    }
  }
}

void SparseTable::Pull(absl::Span<const uint64_t> keys, float* out, RowMemo* memo) {
  if (memo == nullptr) {
    PullLookingUp(keys, out, nullptr);
  } else if (MemoCurrent(memo, keys.size())) {
    PullRemembered(keys, out, memo);
  } else {
    // A pull drops no row, but with a disk tier its promotions may evict:
    // then what it found may not stay current.
    const uint64_t generation = generation_;
    memo->rows.resize(keys.size());
    PullLookingUp(keys, out, memo->rows.data());
    memo->generation = generation_ == generation ? generation_ : 0;
  }
  counters_.keys_pulled += keys.size();
}

void SparseTable::PullLookingUp(absl::Span<const uint64_t> keys, float* out, uint32_t* found) {
  // Three stages, a block apart: while block b's rows are copied, block
  // b + 1 has been looked up and its rows prefetched, and block b + 2's
  // index slots prefetched (LookUpBlock of block b + 1 does both). So a row
  // is requested a whole block before it is copied, not just before its own
  // block's copies. A pull creates and drops no row until its cold keys are
  // read at the end (ReadColdPulls), so the row numbers found stay valid
  // across blocks, and the index and chunks do not move.
  const size_t n = keys.size();
  const uint64_t* k = keys.data();
  const RowIndex::View index = index_.view();
  const RowLocator locate = Locator();
  const uint32_t dim = dim_;
  uint64_t hashes[kHashRing];
  uint32_t rows[2][kLookupBlock];
  float* values[2][kLookupBlock];
  StartLookUps(index, keys, hashes);
  if (n > 0) {
    LookUpBlock(index, locate, keys, 0, std::min(n, kLookupBlock), dim * sizeof(float),
                /*for_write=*/false, hashes, rows[0], values[0]);
  }
  for (size_t begin = 0, b = 0; begin < n; begin += kLookupBlock, b ^= 1) {
    const size_t end = std::min(n, begin + kLookupBlock);
    if (end < n) {
      LookUpBlock(index, locate, keys, end, std::min(n, end + kLookupBlock), dim * sizeof(float),
                  /*for_write=*/false, hashes, rows[b ^ 1], values[b ^ 1]);
    }
    const uint32_t* block_rows = rows[b];
    float* const* block_values = values[b];
    if (found != nullptr) std::memcpy(found + begin, block_rows, (end - begin) * sizeof(uint32_t));
    for (size_t i = begin; i < end; ++i) {
      const uint32_t r = block_rows[i - begin];
      if (r != RowIndex::kNotFound) {
        CopyRow(block_values[i - begin], dim, out + i * dim);
        if (evictable_) Touch(r);
      } else if (tier_ != nullptr) {
        cold_pulls_.push_back({k[i], i});
      } else {
        InitializeValues(config_.init(), config_.id(), k[i], 0, dim, out + i * dim);
      }
    }
  }
  if (!cold_pulls_.empty()) ReadColdPulls(out);
}

void SparseTable::PullRemembered(absl::Span<const uint64_t> keys, float* out, RowMemo* memo) {
  // No hashing and no probing: the row numbers are read in order, and the
  // row kLookupBlock keys ahead is prefetched (with its bookkeeping, which
  // Touch writes, when rows carry it).
  const size_t n = keys.size();
  const uint64_t* k = keys.data();
  uint32_t* rows = memo->rows.data();
  const RowLocator locate = Locator();
  const uint32_t dim = dim_;
  const RowSpan touched(row_bytes_, meta_bytes_ + dim * sizeof(float));
  const bool evictable = evictable_;
  for (size_t i = 0; i < n && i < kLookupBlock; ++i) PrefetchRow<0>(locate, rows[i], touched);
  for (size_t i = 0; i < n; ++i) {
    if (i + kLookupBlock < n) PrefetchRow<0>(locate, rows[i + kLookupBlock], touched);
    uint32_t r = rows[i];
    if (r == RowIndex::kNotFound) {
      // Absent when the memo was made; a push may have created it since.
      r = index_.Find(k[i]);
      if (r == RowIndex::kNotFound) {
        if (tier_ != nullptr) {
          cold_pulls_.push_back({k[i], i});
        } else {
          InitializeValues(config_.init(), config_.id(), k[i], 0, dim,
                           out + i * dim);
        }
        continue;
      }
      rows[i] = r;
    }
    CopyRow(locate.Values(r), dim, out + i * dim);
    if (evictable) Touch(r);
  }
  if (!cold_pulls_.empty()) ReadColdPulls(out);
}

void SparseTable::Push(absl::Span<const uint64_t> keys, const float* grads, float lr_scale,
                       RowMemo* memo) {
  // With a tier, the push's first promotion reads every cold key of the
  // push at once (PrefetchPushRows); a push whose keys are all in RAM reads
  // nothing.
  if (tier_ != nullptr) {
    push_keys_ = keys;
    push_prefetched_ = false;
  }
  PushRows(keys, grads, lr_scale, memo);
  if (tier_ != nullptr) {
    push_keys_ = {};
    cold_ready_.clear();
  }
  counters_.keys_pushed += keys.size();
  if (watch_ != nullptr) {
    for (uint64_t key : keys) watch_->RowChanged(id(), true, key);
  }
}

void SparseTable::PushRows(absl::Span<const uint64_t> keys, const float* grads,
                           float lr_scale, RowMemo* memo) {
  if (memo == nullptr) {
    PushLookingUp(keys, grads, lr_scale, nullptr);
  } else if (MemoCurrent(memo, keys.size())) {
    PushRemembered(keys, grads, lr_scale, memo);
  } else {
    const uint64_t generation = generation_;
    memo->rows.resize(keys.size());
    PushLookingUp(keys, grads, lr_scale, memo->rows.data());
    // An eviction during the push may have taken a row recorded before it.
    memo->generation = generation_ == generation ? generation_ : 0;
  }
}

void SparseTable::PushLookingUp(absl::Span<const uint64_t> keys, const float* grads,
                                float lr_scale, uint32_t* found) {
  // Blocks of keys as in Pull: look up and prefetch (for writing) a block's
  // rows, then update them, with one ApplyRows call per run of keys that
  // found their rows (`pending`; a key listed twice is listed twice and
  // updated twice, in order). A run ends where a key is filtered, dropped
  // or creates a row, so its gradients are contiguous in the request.
  // Creating a row may evict another and hand its number to the new key, so
  // the pending updates are applied first (the updates then are exactly
  // those of one key at a time, in order), and the block's remaining keys
  // are looked up again (which also finds the row a repeated key of the
  // block just created). Their hashes are still in the ring, and their
  // slots in the cache. Creating a row may also grow the index or add a
  // chunk: the views are then taken again.
  const size_t n = keys.size();
  const uint64_t* k = keys.data();
  RowIndex::View index = index_.view();
  RowLocator locate = Locator();
  const uint32_t dim = dim_;
  uint64_t hashes[kHashRing];
  uint32_t rows[kLookupBlock];
  float* values[kLookupBlock];
  float* pending[kLookupBlock];
  StartLookUps(index, keys, hashes);
  for (size_t begin = 0; begin < n; begin += kLookupBlock) {
    const size_t end = std::min(n, begin + kLookupBlock);
    LookUpBlock(index, locate, keys, begin, end, stride_ * sizeof(float),
                /*for_write=*/true, hashes, rows, values);
    bool created = false;
    size_t run_begin = begin;  // the key of pending[0]
    size_t count = 0;          // pending rows: keys [run_begin, run_begin + count)
    auto flush = [&](size_t next) {
      if (count > 0) {
        optimizer_->ApplyRows(pending, grads + run_begin * dim, count, dim, lr_scale);
      }
      count = 0;
      run_begin = next;
    };
    for (size_t i = begin; i < end; ++i) {
      uint32_t r = rows[i - begin];
      float* row = values[i - begin];
      if (created) {
        r = index.FindHashed(k[i], hashes[i % kHashRing]);
        if (r != RowIndex::kNotFound) row = locate.Values(r);
      }
      if (r == RowIndex::kNotFound) {
        if (found != nullptr) found[i] = RowIndex::kNotFound;
        flush(i);
        r = RowForPush(k[i]);
        if (r == kNil) {
          run_begin = i + 1;
          continue;
        }
        created = true;
        index = index_.view();
        locate = Locator();
        row = locate.Values(r);
      } else if (evictable_) {
        Touch(r);
      }
      if (found != nullptr) found[i] = r;
      pending[count++] = row;
    }
    flush(end);
  }
}

void SparseTable::PushRemembered(absl::Span<const uint64_t> keys, const float* grads,
                                 float lr_scale, RowMemo* memo) {
  // As PushLookingUp, one key at a time in order, with runs of found rows
  // applied by one ApplyRows call; the row numbers come from the memo, and
  // the row kLookupBlock keys ahead is prefetched for writing.
  const size_t n = keys.size();
  const uint64_t* k = keys.data();
  uint32_t* rows = memo->rows.data();
  RowLocator locate = Locator();
  const uint32_t dim = dim_;
  const RowSpan row(row_bytes_, row_bytes_);
  float* pending[kLookupBlock];
  size_t run_begin = 0;  // the key of pending[0]
  size_t count = 0;      // pending rows: keys [run_begin, run_begin + count)
  auto flush = [&](size_t next) {
    if (count > 0) optimizer_->ApplyRows(pending, grads + run_begin * dim, count, dim, lr_scale);
    count = 0;
    run_begin = next;
  };
  for (size_t i = 0; i < n && i < kLookupBlock; ++i) PrefetchRow<1>(locate, rows[i], row);
  for (size_t i = 0; i < n; ++i) {
    if (i + kLookupBlock < n) PrefetchRow<1>(locate, rows[i + kLookupBlock], row);
    uint32_t r = rows[i];
    if (r == RowIndex::kNotFound) r = index_.Find(k[i]);
    if (r != RowIndex::kNotFound) {
      rows[i] = r;
      if (evictable_) Touch(r);
    } else {
      flush(i);
      const uint64_t generation = generation_;
      r = RowForPush(k[i]);
      if (r == kNil) {
        run_begin = i + 1;
        continue;
      }
      locate = Locator();
      if (generation_ != generation) {
        // The new row evicted one, perhaps a row this memo names (or this
        // very number, under another key): apply this key's update, then
        // look the remaining keys up.
        pending[count++] = locate.Values(r);
        flush(i + 1);
        memo->generation = 0;
        if (i + 1 < n) {
          PushLookingUp(keys.subspan(i + 1), grads + (i + 1) * dim, lr_scale, nullptr);
        }
        return;
      }
      rows[i] = r;
    }
    pending[count++] = locate.Values(r);
    if (count == kLookupBlock) flush(i + 1);
  }
  flush(n);
}

uint64_t SparseTable::Scan(uint64_t cursor, size_t max_rows, size_t max_slots,
                           std::vector<uint64_t>* keys,
                           std::vector<float>* values) const {
  // The cursor is an index slot rather than a row id: rows of tables
  // without eviction carry no key, so only the index maps rows to keys.
  if (max_rows == 0 || max_slots == 0 || cursor >= index_.capacity()) return 0;
  size_t taken = 0;
  const size_t next = index_.ForEachFrom(
      static_cast<size_t>(cursor), max_slots, [&](uint64_t key, uint32_t r) {
        keys->push_back(key);
        const float* row = Values(r);
        values->insert(values->end(), row, row + dim_);
        return ++taken < max_rows;
      });
  return next >= index_.capacity() ? 0 : next;
}

uint64_t SparseTable::ExportRows(uint64_t cursor, size_t max_rows,
                                 std::vector<uint64_t>* keys,
                                 std::vector<float>* state) const {
  // Index order is hash order, and inserting keys in the hash order of a
  // larger index into a smaller, growing one (what restoring an export
  // does) piles them into a few long probe runs: quadratic time. So the
  // export visits groups of kExportRun index slots in a golden-ratio
  // permutation, whose every prefix spreads evenly over the hash range, and
  // the slots of a group in order (cache-friendly). The cursor is the
  // position in that visiting order: group * kExportRun + offset.
  constexpr size_t kExportRun = 16;
  const size_t capacity = index_.capacity();
  const size_t groups = (capacity + kExportRun - 1) / kExportRun;
  if (max_rows == 0 || cursor >= static_cast<uint64_t>(groups) * kExportRun) return 0;
  size_t step = std::max<size_t>(1, static_cast<size_t>(groups * 0.6180339887498949));
  while (std::gcd(step, groups) != 1) ++step;
  size_t g = static_cast<size_t>(cursor / kExportRun);
  size_t offset = static_cast<size_t>(cursor % kExportRun);
  size_t taken = 0;
  while (g < groups && taken < max_rows) {
    const size_t begin =
        static_cast<size_t>((static_cast<unsigned __int128>(g) * step) % groups) * kExportRun;
    const size_t length = std::min(kExportRun, capacity - begin);
    const size_t next = index_.ForEachFrom(
        begin + offset, length > offset ? length - offset : 0,
        [&](uint64_t key, uint32_t r) {
          keys->push_back(key);
          const float* row = Values(r);
          state->insert(state->end(), row, row + stride_);
          return ++taken < max_rows;
        });
    offset = next - begin;
    if (offset >= length) {
      ++g;
      offset = 0;
    }
  }
  return g >= groups ? 0 : static_cast<uint64_t>(g) * kExportRun + offset;
}

absl::Status SparseTable::ImportRow(uint64_t key,
                                    absl::Span<const float> state) {
  if (state.size() != stride_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table '", config_.name(), "': row of key ", key, " has ",
        state.size(), " floats of state, want ", stride_));
  }
  if (!AllFinite(state)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table '", config_.name(), "': row of key ", key,
        " holds a non-finite value"));
  }
  if (!tier_failure_.ok()) return tier_failure_;
  const uint32_t existing = index_.Find(key);
  if (existing != RowIndex::kNotFound) {
    std::memcpy(Values(existing), state.data(), stride_ * sizeof(float));
    if (watch_ != nullptr) watch_->RowChanged(id(), true, key);
    return absl::OkStatus();
  }
  // A key is in RAM or on disk, never both: the imported state replaces a
  // cold row.
  ColdRowTag tag;
  if (tier_ != nullptr && FetchCold(key, &tag)) DeleteCold(key);
  if (!tier_failure_.ok()) return tier_failure_;
  if (CreateRow(key, state.data()) == kNil) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "table '", config_.name(), "' is at its memory budget on this server (",
        config_.sparse().memory_budget_bytes(), " bytes: ", num_rows(), " of ",
        max_rows_, " rows held) and eviction is off; cannot import key ", key));
  }
  if (watch_ != nullptr) watch_->RowChanged(id(), true, key);
  return absl::OkStatus();
}

uint64_t SparseTable::DropColdSlots(const std::vector<bool>& slots) {
  if (tier_ == nullptr || slots.empty()) return 0;
  const uint32_t num_slots = static_cast<uint32_t>(slots.size());
  if (reader_ != nullptr) {
    reader_->InvalidateIf(
        [&](uint64_t key) { return slots[SparseSlot(id(), key, num_slots)]; });
  }
  if (tier_->num_slots() != num_slots) {
    // Another slot count than the layout's: the rows one by one.
    std::vector<uint64_t> keys;
    absl::Status read = tier_->ForEachRow(
        4096, [&](absl::Span<const uint64_t> page, absl::Span<const float>) {
          for (uint64_t key : page)
            if (slots[SparseSlot(id(), key, num_slots)]) keys.push_back(key);
          return absl::OkStatus();
        });
    for (size_t i = 0; i < keys.size() && read.ok(); ++i)
      read = tier_->Delete(keys[i]);
    if (!read.ok()) NoteTierFailure(read);
    return read.ok() ? keys.size() : 0;
  }
  const absl::StatusOr<uint64_t> deleted = tier_->DeleteSlots(slots);
  if (!deleted.ok()) {
    NoteTierFailure(deleted.status());
    return 0;
  }
  return *deleted;
}

void SparseTable::ReadColdRows(absl::Span<const uint64_t> keys,
                               std::vector<float>* states,
                               std::vector<bool>* found) const {
  found->assign(keys.size(), false);
  states->resize(keys.size() * stride_);
  if (tier_ == nullptr || keys.empty()) return;
  std::vector<ColdRowTag> tags(keys.size());
  std::vector<bool> on_disk;
  const absl::Status read =
      tier_->MultiGet(keys, states->data(), tags.data(), &on_disk);
  if (!read.ok()) {
    NoteTierFailure(read);
    return;
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    (*found)[i] = on_disk[i] && index_.Find(keys[i]) == RowIndex::kNotFound &&
                  !Expired(tags[i].last_step, tags[i].last_second);
  }
}

absl::Span<const float> SparseTable::RowState(uint64_t key) const {
  const uint32_t r = index_.Find(key);
  if (r == RowIndex::kNotFound) return {};
  return absl::Span<const float>(Values(r), stride_);
}

absl::Status SparseTable::CheckImport(absl::Span<const uint64_t> keys) const {
  if (eviction_ != EVICT_NONE && evictable_) return absl::OkStatus();
  absl::flat_hash_set<uint64_t> absent;
  for (uint64_t key : keys) {
    if (index_.Find(key) == RowIndex::kNotFound) absent.insert(key);
  }
  if (num_rows() + absent.size() <= max_rows_) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "table '", config_.name(), "' is at its memory budget on this server (",
      config_.sparse().memory_budget_bytes(), " bytes: ", num_rows(), " of ", max_rows_,
      " rows held) and eviction is off; cannot import ", absent.size(), " new rows"));
}

// ------------------------------------------------------------------ both
// (DenseTable itself is in dense_table.cc.)

TableStats Table::BaseStats() const {
  TableStats s;
  s.set_table_id(config_.id());
  s.set_name(config_.name());
  s.set_bytes(MemoryBytes());
  s.set_keys_pushed(counters_.keys_pushed);
  s.set_keys_pulled(counters_.keys_pulled);
  s.set_admissions(counters_.admissions);
  s.set_pushes_filtered(counters_.pushes_filtered);
  s.set_evictions_ttl(counters_.evictions_ttl);
  s.set_evictions_budget(counters_.evictions_budget);
  s.set_pushes_refused(counters_.pushes_refused);
  s.set_keys_dropped(counters_.keys_dropped);
  if (config_.has_sparse()) {
    s.set_memory_budget_bytes(config_.sparse().memory_budget_bytes());
  }
  return s;
}

}  // namespace ps
