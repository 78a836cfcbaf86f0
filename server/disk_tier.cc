#include "server/disk_tier.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/status.h"
#include "rocksdb/cache.h"
#include "rocksdb/db.h"
#include "rocksdb/filter_policy.h"
#include "rocksdb/iterator.h"
#include "rocksdb/options.h"
#include "rocksdb/perf_context.h"
#include "rocksdb/perf_level.h"
#include "rocksdb/slice.h"
#include "rocksdb/statistics.h"
#include "rocksdb/table.h"
#include "rocksdb/write_batch.h"
#include "rocksdb/write_buffer_manager.h"
#include "server/io_pool.h"
#include "server/server_log.h"

namespace ps {
namespace {

constexpr size_t kKeyBytes = 12;
constexpr size_t kTagBytes = 16;
// A MultiGet is split over the I/O pool once it has this many keys per
// reader: fewer are not worth waking a thread for.
constexpr size_t kKeysPerReader = 8;

void PutBigEndian(uint64_t v, int bytes, char* out) {
  for (int i = bytes - 1; i >= 0; --i) {
    out[i] = static_cast<char>(v & 0xff);
    v >>= 8;
  }
}

// The stored key of `key` in `slot`.
void EncodeKey(uint32_t slot, uint64_t key, char* out) {
  PutBigEndian(slot, 4, out);
  PutBigEndian(key, 8, out + 4);
}

// The stored keys of one slot: [lower, upper). Not copyable: the slices
// point into the object.
struct SlotBounds {
  explicit SlotBounds(uint32_t slot) {
    PutBigEndian(slot, 4, begin);
    PutBigEndian(uint64_t{slot} + 1, 4, end);
  }
  SlotBounds(const SlotBounds&) = delete;
  SlotBounds& operator=(const SlotBounds&) = delete;

  char begin[4];
  char end[4];
  const rocksdb::Slice lower{begin, 4};
  const rocksdb::Slice upper{end, 4};
};

// The tier's writes: no write-ahead log (the tier is a cache).
rocksdb::WriteOptions NoLogWrites() {
  rocksdb::WriteOptions write;
  write.disableWAL = true;
  return write;
}

// Whether the n-th of a kind of event is logged: the first, then the 10th,
// 100th, ... (a failing disk fails every read).
bool FirstOrPowerOfTen(uint64_t n) {
  while (n % 10 == 0) n /= 10;
  return n == 1;
}

absl::Status FromRocks(const rocksdb::Status& s, const std::string& what) {
  const std::string message = absl::StrCat(what, ": ", s.ToString());
  if (s.IsCorruption()) return absl::DataLossError(message);
  if (s.IsInvalidArgument()) return absl::InvalidArgumentError(message);
  if (s.IsNoSpace()) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

// Whether files in `dir` can be opened with O_DIRECT (tmpfs cannot).
absl::Status ProbeDirectIo(const std::string& dir) {
  const std::string probe = dir + "/.direct_io_probe";
  const int fd = open(probe.c_str(), O_CREAT | O_WRONLY | O_DIRECT, 0600);
  if (fd < 0) {
    const int err = errno;
    unlink(probe.c_str());
    return absl::FailedPreconditionError(absl::StrCat(
        "disk tier directory ", dir, " does not allow direct I/O (",
        std::strerror(err),
        "); put it on a disk file system, or set disk_tier.buffered_io"));
  }
  close(fd);
  unlink(probe.c_str());
  return absl::OkStatus();
}

}  // namespace

DiskTier::DiskTier(const Options& options)
    : options_(options),
      value_bytes_(options.state_floats * sizeof(float) + kTagBytes),
      slot_rows_(new std::atomic<uint64_t>[options.num_slots]) {
  for (uint32_t s = 0; s < options.num_slots; ++s) slot_rows_[s] = 0;
}

uint64_t DiskTier::slot_rows(uint32_t slot) const {
  return slot < options_.num_slots
             ? slot_rows_[slot].load(std::memory_order_relaxed)
             : 0;
}

uint32_t DiskTier::SlotOf(uint64_t key) const {
  return SparseSlot(options_.table_id, key, options_.num_slots);
}

DiskTier::~DiskTier() {
  if (db_ != nullptr) {
    const rocksdb::Status closed = db_->Close();
    if (!closed.ok()) {
      ServerLog()->warn("closing {}: {}", options_.dir, closed.ToString());
    }
    db_.reset();
  }
  std::error_code ec;
  std::filesystem::remove_all(options_.dir, ec);
  if (ec) ServerLog()->warn("removing {}: {}", options_.dir, ec.message());
}

absl::StatusOr<std::unique_ptr<DiskTier>> DiskTier::Open(
    const Options& options) {
  if (options.dir.empty()) {
    return absl::InvalidArgumentError("disk tier: no directory");
  }
  if (options.state_floats == 0 || options.num_slots == 0) {
    return absl::InvalidArgumentError(
        "disk tier: state_floats and num_slots must be > 0");
  }
  if (options.memory_bytes < kMinTierMemory) {
    return absl::InvalidArgumentError(
        "disk tier: memory_bytes must be at least 256 KiB");
  }
  std::error_code ec;
  std::filesystem::remove_all(options.dir, ec);
  if (!ec) std::filesystem::create_directories(options.dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("disk tier directory ", options.dir, ": ", ec.message()));
  }
  if (!options.buffered_io) PS_RETURN_IF_ERROR(ProbeDirectIo(options.dir));

  std::unique_ptr<DiskTier> tier(new DiskTier(options));
  // A quarter of the memory for memtables (charged to the cache, so the
  // cache's capacity bounds both), the rest for index, filter and data
  // blocks, index and filters first (the high-priority pool, up to 90%).
  tier->pool_ = std::make_unique<IoPool>(options.read_threads);
  tier->cache_ = rocksdb::NewLRUCache(options.memory_bytes, -1, false, 0.9);
  tier->statistics_ = rocksdb::CreateDBStatistics();
  tier->statistics_->set_stats_level(rocksdb::StatsLevel::kExceptTimers);

  rocksdb::BlockBasedTableOptions table;
  table.block_cache = tier->cache_;
  table.block_size = 4096;
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  table.whole_key_filtering = true;
  // Index and filter blocks are charged to the cache at high priority, and
  // the high-priority pool may take nearly all of it: data blocks then
  // never push them out, so a lookup reads at most its data block from
  // disk while they fit (with half the cache for them, a lookup read 4.4
  // blocks on average). They take about 2.2 bytes per cold row (10 bits of
  // filter, an index entry per 4 KiB block). They are not pinned: pinned
  // blocks would grow past memory_bytes with the cold rows.
  table.cache_index_and_filter_blocks = true;
  table.cache_index_and_filter_blocks_with_high_priority = true;
  // Partitioned: a file's index and filter are 4 KiB partitions under a
  // small top level (pinned), so a lookup loads the partitions it needs,
  // never a whole file's filter. Universal compaction makes files of
  // hundreds of MiB, whose single filter block took megabytes: read again
  // whenever another pushed it out, it had the load phase of the bench
  // reading 1.4 GB/s.
  table.index_type = rocksdb::BlockBasedTableOptions::kTwoLevelIndexSearch;
  table.partition_filters = true;
  table.metadata_block_size = 4096;
  table.pin_top_level_index_and_filter = true;

  rocksdb::Options db;
  db.create_if_missing = true;
  db.error_if_exists = true;
  db.paranoid_checks = true;
  db.compression = rocksdb::kNoCompression;
  db.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  const size_t memtables = options.memory_bytes / 4;
  db.write_buffer_manager =
      std::make_shared<rocksdb::WriteBufferManager>(memtables, tier->cache_);
  db.write_buffer_size = std::max<size_t>(memtables / 2, 256 << 10);
  db.max_write_buffer_number = 2;
  db.compaction_style = rocksdb::kCompactionStyleUniversal;
  db.max_background_jobs = 2;
  db.max_open_files = -1;
  db.use_direct_reads = !options.buffered_io;
  db.use_direct_io_for_flush_and_compaction = !options.buffered_io;
  db.statistics = tier->statistics_;
  db.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
  db.keep_log_file_num = 2;

  rocksdb::DB* raw = nullptr;
  const rocksdb::Status opened = rocksdb::DB::Open(db, options.dir, &raw);
  if (!opened.ok()) {
    return FromRocks(opened, absl::StrCat("disk tier: opening ", options.dir));
  }
  tier->db_.reset(raw);
  return tier;
}

void DiskTier::EncodeStored(uint64_t key, char* out) const {
  EncodeKey(SlotOf(key), key, out);
}

std::string DiskTier::StoredKey(uint64_t key) const {
  std::string out(kKeyBytes, '\0');
  EncodeStored(key, out.data());
  return out;
}

void DiskTier::NoteError(const char* what, const std::string& detail) {
  const uint64_t errors = errors_.fetch_add(1, std::memory_order_relaxed) + 1;
  if (FirstOrPowerOfTen(errors)) {
    ServerLog()->error("{} {}: {} ({} errors so far)", what, options_.dir,
                       detail, errors);
  }
}

absl::StatusOr<bool> DiskTier::Put(uint64_t key, const float* state,
                                   const ColdRowTag& tag) {
  if (options_.max_disk_bytes > 0 &&
      (rows() + 1) * RowBytes() > options_.max_disk_bytes) {
    const uint64_t refused =
        refused_.fetch_add(1, std::memory_order_relaxed) + 1;
    if (FirstOrPowerOfTen(refused)) {
      ServerLog()->warn(
          "disk tier {} is at max_disk_bytes ({} bytes, {} rows): {} demoted "
          "rows dropped so far (they start again from their initial values)",
          options_.dir, options_.max_disk_bytes, rows(), refused);
    }
    return false;
  }
  char stored[kKeyBytes];
  EncodeStored(key, stored);
  std::string value(value_bytes_, '\0');
  const size_t floats = options_.state_floats * sizeof(float);
  std::memcpy(value.data(), state, floats);
  std::memcpy(value.data() + floats, &tag.last_step, 8);
  std::memcpy(value.data() + floats + 8, &tag.last_second, 4);
  std::memcpy(value.data() + floats + 12, &tag.touches, 4);
  const rocksdb::WriteOptions write = NoLogWrites();
  const rocksdb::Status put =
      db_->Put(write, rocksdb::Slice(stored, kKeyBytes), value);
  if (!put.ok()) {
    NoteError("writing a row to", put.ToString());
    return FromRocks(put, "disk tier: writing a row");
  }
  rows_.fetch_add(1, std::memory_order_relaxed);
  slot_rows_[SlotOf(key)].fetch_add(1, std::memory_order_relaxed);
  demotions_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

namespace {

// A stored value into state and tag; DATA_LOSS for the wrong size.
absl::Status DecodeValue(const rocksdb::Slice& value, size_t state_floats,
                         float* state, ColdRowTag* tag) {
  const size_t floats = state_floats * sizeof(float);
  if (value.size() != floats + kTagBytes) {
    return absl::DataLossError(absl::StrCat("disk tier: a stored row has ",
                                            value.size(), " bytes, not ",
                                            floats + kTagBytes));
  }
  std::memcpy(state, value.data(), floats);
  std::memcpy(&tag->last_step, value.data() + floats, 8);
  std::memcpy(&tag->last_second, value.data() + floats + 8, 4);
  std::memcpy(&tag->touches, value.data() + floats + 12, 4);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<bool> DiskTier::Get(uint64_t key, float* state,
                                   ColdRowTag* tag) {
  std::vector<bool> found;
  PS_RETURN_IF_ERROR(
      MultiGet(absl::MakeConstSpan(&key, 1), state, tag, &found));
  return found[0];
}

absl::Status DiskTier::MultiGet(absl::Span<const uint64_t> keys, float* states,
                                ColdRowTag* tags, std::vector<bool>* found) {
  const size_t n = keys.size();
  found->assign(n, false);
  if (n == 0) return absl::OkStatus();
  std::vector<char> stored(n * kKeyBytes);
  std::vector<rocksdb::Slice> slices(n);
  for (size_t i = 0; i < n; ++i) {
    char* k = stored.data() + i * kKeyBytes;
    EncodeStored(keys[i], k);
    slices[i] = rocksdb::Slice(k, kKeyBytes);
  }
  std::vector<rocksdb::PinnableSlice> values(n);
  std::vector<rocksdb::Status> statuses(n);
  const auto start = std::chrono::steady_clock::now();
  // RocksDB reads one block after another within a MultiGet (Debian's is
  // built without io_uring): a large batch is split over the I/O pool so
  // that its reads are in flight together.
  const size_t chunks = std::max<size_t>(
      1, std::min<size_t>(pool_->threads() + 1, n / kKeysPerReader));
  pool_->Run(chunks, [&](size_t c) {
    const size_t begin = n * c / chunks;
    const size_t end = n * (c + 1) / chunks;
    // The blocks this lookup read from files (not those of compactions):
    // counted per thread by RocksDB's perf context.
    rocksdb::SetPerfLevel(rocksdb::PerfLevel::kEnableCount);
    rocksdb::PerfContext* perf = rocksdb::get_perf_context();
    const uint64_t blocks_before = perf->block_read_count;
    db_->MultiGet(rocksdb::ReadOptions(), db_->DefaultColumnFamily(),
                  end - begin, slices.data() + begin, values.data() + begin,
                  statuses.data() + begin);
    disk_reads_.fetch_add(perf->block_read_count - blocks_before,
                          std::memory_order_relaxed);
  });
  const uint64_t micros = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(
          std::chrono::steady_clock::now() - start)
          .count());
  uint64_t hits = 0;
  for (size_t i = 0; i < n; ++i) {
    if (statuses[i].IsNotFound()) continue;
    if (!statuses[i].ok()) {
      NoteError("reading a row from", statuses[i].ToString());
      return FromRocks(statuses[i], "disk tier: reading a row");
    }
    if (absl::Status decoded =
            DecodeValue(values[i], options_.state_floats,
                        states + i * options_.state_floats, &tags[i]);
        !decoded.ok()) {
      NoteError("reading a row from", std::string(decoded.message()));
      return decoded;
    }
    (*found)[i] = true;
    ++hits;
  }
  cold_reads_.fetch_add(hits, std::memory_order_relaxed);
  cold_misses_.fetch_add(n - hits, std::memory_order_relaxed);
  if (hits > 0) read_micros_.fetch_add(micros, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status DiskTier::Delete(uint64_t key) {
  char stored[kKeyBytes];
  EncodeStored(key, stored);
  const rocksdb::WriteOptions write = NoLogWrites();
  const rocksdb::Status deleted =
      db_->Delete(write, rocksdb::Slice(stored, kKeyBytes));
  if (!deleted.ok()) {
    NoteError("deleting a row from", deleted.ToString());
    return FromRocks(deleted, "disk tier: deleting a row");
  }
  rows_.fetch_sub(1, std::memory_order_relaxed);
  slot_rows_[SlotOf(key)].fetch_sub(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> DiskTier::DeleteSlots(const std::vector<bool>& slots) {
  uint64_t removed = 0;
  const rocksdb::WriteOptions write = NoLogWrites();
  for (uint32_t slot = 0; slot < slots.size() && slot < options_.num_slots;
       ++slot) {
    if (!slots[slot]) continue;
    // Counted as they were written: nothing to list.
    const uint64_t in_slot = slot_rows_[slot].load(std::memory_order_relaxed);
    if (in_slot == 0) continue;
    const SlotBounds bounds(slot);
    const rocksdb::Status deleted = db_->DeleteRange(
        write, db_->DefaultColumnFamily(), bounds.lower, bounds.upper);
    if (!deleted.ok()) {
      NoteError("deleting a slot of", deleted.ToString());
      return FromRocks(deleted, "disk tier: deleting a slot");
    }
    rows_.fetch_sub(in_slot, std::memory_order_relaxed);
    slot_rows_[slot].fetch_sub(in_slot, std::memory_order_relaxed);
    removed += in_slot;
  }
  return removed;
}

DiskTier::Snapshot::~Snapshot() { db_->ReleaseSnapshot(snapshot_); }

std::unique_ptr<DiskTier::Snapshot> DiskTier::TakeSnapshot() const {
  return std::unique_ptr<Snapshot>(new Snapshot(db_.get(), db_->GetSnapshot()));
}

absl::Status DiskTier::ForEachRow(size_t page_rows, RowPageFn fn,
                                  const std::vector<bool>* slots,
                                  const Snapshot* at) const {
  page_rows = std::max<size_t>(page_rows, 1);
  // One snapshot for every range, so the slots are read as of one moment.
  std::unique_ptr<Snapshot> own;
  if (at == nullptr) {
    own = TakeSnapshot();
    at = own.get();
  }
  const rocksdb::Snapshot* snapshot = at->snapshot_;
  std::vector<uint64_t> keys;
  std::vector<float> states;
  keys.reserve(page_rows);
  states.reserve(page_rows * options_.state_floats);
  ColdRowTag tag;
  // Reads the rows from `lower` on, below `upper` when not null.
  auto read_range = [&](const rocksdb::Slice* lower,
                        const rocksdb::Slice* upper) -> absl::Status {
    rocksdb::ReadOptions read;
    read.fill_cache = false;
    read.snapshot = snapshot;
    read.iterate_upper_bound = upper;
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(read));
    for (lower != nullptr ? it->Seek(*lower) : it->SeekToFirst(); it->Valid();
         it->Next()) {
      const rocksdb::Slice stored = it->key();
      if (stored.size() != kKeyBytes) {
        return absl::DataLossError(
            absl::StrCat("disk tier ", options_.dir, ": a stored key has ",
                         stored.size(), " bytes, not ", kKeyBytes));
      }
      uint64_t key = 0;
      for (size_t i = 4; i < kKeyBytes; ++i) {
        key = (key << 8) | static_cast<unsigned char>(stored.data()[i]);
      }
      keys.push_back(key);
      states.resize(keys.size() * options_.state_floats);
      PS_RETURN_IF_ERROR(DecodeValue(
          it->value(), options_.state_floats,
          states.data() + (keys.size() - 1) * options_.state_floats, &tag));
      if (keys.size() == page_rows) {
        PS_RETURN_IF_ERROR(fn(keys, states));
        keys.clear();
        states.clear();
      }
    }
    if (!it->status().ok()) {
      return FromRocks(it->status(), absl::StrCat("disk tier ", options_.dir,
                                                  ": reading rows"));
    }
    return absl::OkStatus();
  };
  if (slots == nullptr || slots->size() != options_.num_slots) {
    // Another slot count than the layout's names other slots: every row.
    PS_RETURN_IF_ERROR(read_range(nullptr, nullptr));
  } else {
    for (uint32_t slot = 0; slot < options_.num_slots; ++slot) {
      if (!(*slots)[slot]) continue;
      const SlotBounds bounds(slot);
      PS_RETURN_IF_ERROR(read_range(&bounds.lower, &bounds.upper));
    }
  }
  if (!keys.empty()) PS_RETURN_IF_ERROR(fn(keys, states));
  return absl::OkStatus();
}

size_t DiskTier::MemoryBytes() const {
  uint64_t readers = 0;
  db_->GetIntProperty("rocksdb.estimate-table-readers-mem", &readers);
  // Memtables are charged to the cache (WriteBufferManager), so its usage
  // counts them too.
  return cache_->GetUsage() + readers;
}

uint64_t DiskTier::DiskBytes() const {
  uint64_t bytes = 0;
  db_->GetIntProperty("rocksdb.total-sst-files-size", &bytes);
  return bytes;
}

DiskTierCounters DiskTier::Counters() const {
  DiskTierCounters c;
  c.cold_rows = rows();
  c.demotions = demotions_.load(std::memory_order_relaxed);
  c.promotions = promotions_.load(std::memory_order_relaxed);
  c.cold_reads = cold_reads_.load(std::memory_order_relaxed);
  c.cold_misses = cold_misses_.load(std::memory_order_relaxed);
  c.cold_rows_dropped = refused_.load(std::memory_order_relaxed);
  c.read_micros = read_micros_.load(std::memory_order_relaxed);
  c.errors = errors_.load(std::memory_order_relaxed);
  c.disk_reads = disk_reads_.load(std::memory_order_relaxed);
  c.bloom_useful = statistics_->getTickerCount(rocksdb::BLOOM_FILTER_USEFUL);
  c.bytes_written = statistics_->getTickerCount(rocksdb::FLUSH_WRITE_BYTES) +
                    statistics_->getTickerCount(rocksdb::COMPACT_WRITE_BYTES);
  return c;
}

namespace {

// Whether directory `dir` is a server's tier root that no process holds:
// its owner.lock exists and can be locked. Locks it while it answers.
bool Abandoned(const std::filesystem::path& dir) {
  const std::string lock = (dir / "owner.lock").string();
  const int fd = open(lock.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return false;  // not one of ours, or being created
  const bool free = flock(fd, LOCK_EX | LOCK_NB) == 0;
  close(fd);
  return free;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TierRoot>> TierRoot::Claim(
    const std::string& base, const std::string& job) {
  static std::atomic<uint64_t> next{0};
  const std::filesystem::path job_dir =
      std::filesystem::path(base) / (job.empty() ? std::string("job") : job);
  const std::string path =
      (job_dir / absl::StrCat("server-", getpid(), "-", next.fetch_add(1)))
          .string();
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (!ec) std::filesystem::create_directories(path, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("disk tier directory ", path, ": ", ec.message()));
  }
  // Locked under another name first, then renamed: a sweeping process
  // that finds owner.lock always finds it locked.
  const std::string lock = path + "/owner.lock";
  const std::string unnamed = path + "/owner.lock.new";
  const int fd = open(unnamed.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) != 0 ||
      rename(unnamed.c_str(), lock.c_str()) != 0) {
    const int err = errno;
    if (fd >= 0) close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("disk tier directory ", path,
                     ": cannot lock owner.lock: ", std::strerror(err)));
  }
  std::unique_ptr<TierRoot> root(new TierRoot(path, fd));
  for (const auto& entry : std::filesystem::directory_iterator(job_dir, ec)) {
    if (entry.path().string() == path || !entry.is_directory()) continue;
    if (!Abandoned(entry.path())) continue;
    std::error_code removed;
    const uintmax_t files = std::filesystem::remove_all(entry.path(), removed);
    if (removed) {
      ServerLog()->warn("cannot remove the abandoned disk tier {}: {}",
                        entry.path().string(), removed.message());
    } else {
      ServerLog()->info("removed the abandoned disk tier {} ({} files)",
                        entry.path().string(), files);
    }
  }
  return root;
}

TierRoot::~TierRoot() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
  if (ec) ServerLog()->warn("removing {}: {}", path_, ec.message());
  close(lock_fd_);
}

}  // namespace ps
