// The server's side of checkpoints (server/checkpoint.h): a shard file
// written from tables, a checkpoint restored into tables, and parameter
// digests. The bytes are checkpoint/format.h's; this file matches them
// against live tables.
#include "server/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/format.h"
#include "common/finite.h"
#include "common/hash.h"
#include "common/status.h"
#include "common/optimizer.h"

namespace ps {
namespace {

// The optimizer rules' state sizes, for the format's reader.
absl::StatusOr<int> OptimizerStateSize(const OptimizerConfig& config) {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> optimizer, Optimizer::Create(config));
  return optimizer->state_size();
}

// DATA_LOSS "file: what", as the format's reader reports damage.
absl::Status Corrupt(absl::string_view file, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(file, ": ", what));
}

// Writes the rows of `keys` and `state` (stride floats each) that `keep`
// selects as one record of table `index` (id `id`, named `name`), adding
// them to *rows. Compacts the vectors to the rows kept.
absl::Status WriteRowPage(ShardWriter& out, uint32_t index, uint32_t id,
                          const std::string& name, size_t stride,
                          const RowFilter& keep, std::vector<uint64_t>& keys,
                          std::vector<float>& state, uint64_t* rows) {
  if (keep.sparse) {
    size_t kept = 0;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!keep.sparse(id, keys[i])) continue;
      if (kept != i) {
        keys[kept] = keys[i];
        std::memmove(state.data() + kept * stride, state.data() + i * stride,
                     stride * sizeof(float));
      }
      ++kept;
    }
    keys.resize(kept);
    state.resize(kept * stride);
  }
  if (keys.empty()) return absl::OkStatus();
  if (!AllFinite(state)) {
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!AllFinite(absl::MakeConstSpan(state).subspan(i * stride, stride))) {
        return absl::FailedPreconditionError(absl::StrCat(
            "table '", name, "': the row of key ", keys[i],
            " holds a non-finite value and cannot be checkpointed"));
      }
    }
  }
  PS_RETURN_IF_ERROR(out.Rows(index, keys, state));
  *rows += keys.size();
  return absl::OkStatus();
}

// Writes the rows of `table` that `keep` selects, those in RAM then (with
// `cold`) those on its disk tier, and the table's end.
absl::Status WriteSparse(ShardWriter& out, uint32_t index,
                         const SparseTable& table, const RowFilter& keep,
                         bool cold = true) {
  const uint32_t id = table.id();
  const std::string& name = table.config().name();
  const size_t stride = table.state_floats();
  const size_t page_rows = ShardPageRows(stride);
  std::vector<uint64_t> keys;
  std::vector<float> state;
  keys.reserve(page_rows);
  state.reserve(page_rows * stride);
  uint64_t rows = 0;
  uint64_t cursor = 0;
  do {
    keys.clear();
    state.clear();
    cursor = table.ExportRows(cursor, page_rows, &keys, &state);
    PS_RETURN_IF_ERROR(
        WriteRowPage(out, index, id, name, stride, keep, keys, state, &rows));
  } while (cursor != 0);
  if (cold) {
    // The rows on disk (a disk tier), after those in RAM; a key is in one
    // of the two.
    PS_RETURN_IF_ERROR(table.ExportColdRows(
        page_rows,
        [&](absl::Span<const uint64_t> cold_keys,
            absl::Span<const float> cold_state) -> absl::Status {
          keys.assign(cold_keys.begin(), cold_keys.end());
          state.assign(cold_state.begin(), cold_state.end());
          return WriteRowPage(out, index, id, name, stride, keep, keys, state,
                              &rows);
        }));
  }
  return out.EndTable(index, rows);
}

absl::Status WriteDense(ShardWriter& out, uint32_t index,
                        const DenseTable& table, const RowFilter& keep) {
  const uint32_t id = table.id();
  uint64_t blocks = 0;
  PS_RETURN_IF_ERROR(table.ForEachBlock(
      [&](uint64_t block, absl::Span<const float> values,
          absl::Span<const float> state) -> absl::Status {
        if (keep.dense && !keep.dense(id, block)) return absl::OkStatus();
        if (!AllFinite(values) || !AllFinite(state)) {
          return absl::FailedPreconditionError(absl::StrCat(
              "dense table '", table.config().name(), "': block ", block,
              " holds a non-finite value and cannot be checkpointed"));
        }
        ++blocks;
        return out.Block(index, block, values, state);
      }));
  return out.EndTable(index, blocks);
}

// ------------------------------------------------------ restore and digest

// Why a table of a checkpoint cannot be restored into `table`; OK if it can.
absl::Status CheckCompatible(const TableConfig& saved, const TableLayout& layout,
                             const Table& table) {
  const TableConfig& live = table.config();
  auto mismatch = [&](absl::string_view what, auto saved_value, auto live_value) {
    return absl::FailedPreconditionError(absl::StrCat(
        "table '", live.name(), "' (id ", live.id(), "): the checkpoint's ", what,
        " is ", saved_value, ", the job's ", live_value));
  };
  if (layout.sparse != (table.AsSparse() != nullptr)) {
    return mismatch("kind", layout.sparse ? "sparse" : "dense",
                    layout.sparse ? "dense" : "sparse");
  }
  if (saved.optimizer().kind_case() != live.optimizer().kind_case()) {
    return mismatch("optimizer rule (field number)",
                    static_cast<int>(saved.optimizer().kind_case()),
                    static_cast<int>(live.optimizer().kind_case()));
  }
  if (layout.state_size != table.state_size()) {
    return mismatch("optimizer state size", layout.state_size, table.state_size());
  }
  if (const SparseTable* sparse = table.AsSparse(); sparse != nullptr) {
    if (layout.dim != sparse->dim()) return mismatch("dim", layout.dim, sparse->dim());
  } else {
    const DenseTable& dense = *table.AsDense();
    if (layout.size != dense.size()) return mismatch("size", layout.size, dense.size());
    if (layout.block_size != dense.block_size()) {
      return mismatch("block_size", layout.block_size, dense.block_size());
    }
  }
  return absl::OkStatus();
}

// Maps each table of a shard header to the job's table of that id; every
// table on either side must be on the other. FAILED_PRECONDITION otherwise.
absl::StatusOr<std::vector<Table*>> MatchTables(
    const ShardReader& reader,
    const absl::flat_hash_map<uint32_t, Table*>& tables) {
  std::vector<Table*> targets;
  for (size_t i = 0; i < reader.layouts().size(); ++i) {
    const TableConfig& saved = reader.header().tables(static_cast<int>(i));
    auto it = tables.find(saved.id());
    if (it == tables.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the checkpoint has table '", saved.name(), "' (id ", saved.id(),
          "), which the job does not"));
    }
    PS_RETURN_IF_ERROR(CheckCompatible(saved, reader.layouts()[i], *it->second));
    targets.push_back(it->second);
  }
  if (targets.size() != tables.size()) {
    for (const auto& [id, table] : tables) {
      if (std::find(targets.begin(), targets.end(), table) == targets.end()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "the job has table '", table->config().name(), "' (id ", id,
            "), which the checkpoint does not"));
      }
    }
  }
  return targets;
}

class ImportVisitor : public ShardVisitor {
 public:
  ImportVisitor(absl::string_view file, const std::vector<Table*>& targets,
                const std::vector<TableLayout>& layouts, const RowFilter& keep,
                RestoreStats* stats)
      : file_(file), targets_(targets), layouts_(layouts), keep_(keep), stats_(stats) {}

  absl::Status Rows(size_t t, absl::Span<const uint64_t> keys,
                    absl::Span<const float> state) override {
    SparseTable& table = *targets_[t]->AsSparse();
    const uint32_t id = table.id();
    const size_t stride = layouts_[t].stride;
    stats_->rows_read += keys.size();
    for (size_t i = 0; i < keys.size(); ++i) {
      if (keep_.sparse && !keep_.sparse(id, keys[i])) continue;
      PS_RETURN_IF_ERROR(Imported(table.ImportRow(keys[i], state.subspan(i * stride, stride))));
      ++stats_->rows_restored;
    }
    return absl::OkStatus();
  }

  absl::Status Block(size_t t, uint64_t block, absl::Span<const float> values,
                     absl::Span<const float> state) override {
    DenseTable& table = *targets_[t]->AsDense();
    ++stats_->blocks_read;
    if (keep_.dense && !keep_.dense(table.id(), block)) return absl::OkStatus();
    PS_RETURN_IF_ERROR(Imported(table.ImportBlock(block, values, state)));
    ++stats_->blocks_restored;
    return absl::OkStatus();
  }

 private:
  // The tables accept every row a well-formed file holds (the configs
  // match, sizes were checked) but one with non-finite values, which only a
  // damaged file has (WriteShard refuses them).
  absl::Status Imported(const absl::Status& status) const {
    if (status.ok()) return status;
    if (absl::IsInvalidArgument(status)) return Corrupt(file_, status.message());
    return Annotate(status, file_);
  }

  const std::string file_;
  const std::vector<Table*>& targets_;
  const std::vector<TableLayout>& layouts_;
  const RowFilter& keep_;
  RestoreStats* stats_;
};

uint64_t RowDigest(uint32_t table_id, uint64_t key, absl::Span<const float> state) {
  return Checksum64(state.data(), state.size() * sizeof(float),
                    HashCombine(table_id, key));
}

uint64_t BlockDigest(uint32_t table_id, uint64_t block,
                     absl::Span<const float> values, absl::Span<const float> state) {
  return Checksum64Pieces({{values.data(), values.size() * sizeof(float)},
                           {state.data(), state.size() * sizeof(float)}},
                          HashCombine(0x8000000000000000ULL | table_id, block));
}

class DigestVisitor : public ShardVisitor {
 public:
  DigestVisitor(const std::vector<TableLayout>& layouts, ParameterDigest* digest)
      : layouts_(layouts), digest_(digest) {}

  absl::Status Rows(size_t t, absl::Span<const uint64_t> keys,
                    absl::Span<const float> state) override {
    const size_t stride = layouts_[t].stride;
    for (size_t i = 0; i < keys.size(); ++i) {
      digest_->digest +=
          RowDigest(layouts_[t].id, keys[i], state.subspan(i * stride, stride));
    }
    digest_->sparse_rows += keys.size();
    return absl::OkStatus();
  }

  absl::Status Block(size_t t, uint64_t block, absl::Span<const float> values,
                     absl::Span<const float> state) override {
    digest_->digest += BlockDigest(layouts_[t].id, block, values, state);
    ++digest_->dense_blocks;
    return absl::OkStatus();
  }

 private:
  const std::vector<TableLayout>& layouts_;
  ParameterDigest* digest_;
};

}  // namespace

// ------------------------------------------------------------- public API

RowFilter OwnedSlotsFilter(absl::Span<const uint32_t> slot_owner, uint32_t rank) {
  auto owner = std::make_shared<const std::vector<uint32_t>>(slot_owner.begin(),
                                                             slot_owner.end());
  const uint32_t num_slots = static_cast<uint32_t>(owner->size());
  RowFilter filter;
  if (num_slots == 0) {
    filter.sparse = [](uint32_t, uint64_t) { return false; };
    filter.dense = [](uint32_t, uint64_t) { return false; };
    return filter;
  }
  filter.sparse = [owner, num_slots, rank](uint32_t table_id, uint64_t key) {
    return (*owner)[SparseSlot(table_id, key, num_slots)] == rank;
  };
  filter.dense = [owner, num_slots, rank](uint32_t table_id, uint64_t block) {
    return (*owner)[DenseBlockSlot(table_id, block, num_slots)] == rank;
  };
  return filter;
}

namespace {

// The header of a shard of `tables`; INVALID_ARGUMENT for a null table or
// a repeated id.
absl::StatusOr<ShardHeader> MakeHeader(uint32_t rank, uint64_t clock,
                                       uint32_t num_slots,
                                       absl::Span<const Table* const> tables) {
  ShardHeader header;
  header.set_clock(clock);
  header.set_rank(rank);
  header.set_num_slots(num_slots);
  absl::flat_hash_set<uint32_t> ids;
  for (const Table* table : tables) {
    if (table == nullptr) return absl::InvalidArgumentError("null table");
    if (!ids.insert(table->id()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("table id ", table->id(), " is given twice"));
    }
    *header.add_tables() = table->config();
  }
  return header;
}

}  // namespace

absl::StatusOr<ShardFile> WriteShard(const std::string& checkpoint_dir,
                                     uint32_t rank, uint64_t clock,
                                     uint32_t num_slots,
                                     absl::Span<const Table* const> tables,
                                     const RowFilter& keep) {
  PS_ASSIGN_OR_RETURN(const ShardHeader header,
                      MakeHeader(rank, clock, num_slots, tables));
  return WriteShardFile(checkpoint_dir, header, [&](ShardWriter& out) -> absl::Status {
    for (size_t i = 0; i < tables.size(); ++i) {
      const uint32_t index = static_cast<uint32_t>(i);
      if (const SparseTable* sparse = tables[i]->AsSparse()) {
        PS_RETURN_IF_ERROR(WriteSparse(out, index, *sparse, keep));
      } else {
        PS_RETURN_IF_ERROR(WriteDense(out, index, *tables[i]->AsDense(), keep));
      }
    }
    return absl::OkStatus();
  });
}

// What Finish needs of a tiered table: nothing of the table itself, which
// may change or go (only its tier stays).
struct ShardWriteInParts::Cold {
  uint32_t id = 0;
  std::string name;
  size_t stride = 0;
  const DiskTier* tier = nullptr;
  std::unique_ptr<DiskTier::Snapshot> snapshot;
};

absl::StatusOr<std::unique_ptr<ShardWriteInParts>> ShardWriteInParts::Begin(
    const std::string& checkpoint_dir, const std::string& spill_dir,
    uint32_t rank, uint64_t clock, uint32_t num_slots,
    absl::Span<const Table* const> tables, const RowFilter& keep) {
  std::unique_ptr<ShardWriteInParts> w(new ShardWriteInParts());
  PS_ASSIGN_OR_RETURN(w->header_, MakeHeader(rank, clock, num_slots, tables));
  w->checkpoint_dir_ = checkpoint_dir;
  w->spill_dir_ = spill_dir;
  w->keep_ = keep;
  w->cold_.resize(tables.size());
  // The snapshots at the same moment as the rows in RAM: nothing changes
  // the tables until Begin returns.
  for (size_t i = 0; i < tables.size(); ++i) {
    const SparseTable* sparse = tables[i]->AsSparse();
    if (sparse == nullptr || sparse->disk_tier() == nullptr) continue;
    auto cold = std::make_unique<Cold>();
    cold->id = sparse->id();
    cold->name = sparse->config().name();
    cold->stride = sparse->state_floats();
    cold->tier = sparse->disk_tier();
    cold->snapshot = cold->tier->TakeSnapshot();
    w->cold_[i] = std::move(cold);
  }
  uint64_t spilled = 0;
  auto spill = WriteShardFile(
      spill_dir, w->header_, [&](ShardWriter& out) -> absl::Status {
        for (size_t i = 0; i < tables.size(); ++i) {
          const uint32_t index = static_cast<uint32_t>(i);
          if (const SparseTable* sparse = tables[i]->AsSparse()) {
            spilled += sparse->num_rows();
            PS_RETURN_IF_ERROR(
                WriteSparse(out, index, *sparse, keep, /*cold=*/false));
          } else {
            PS_RETURN_IF_ERROR(
                WriteDense(out, index, *tables[i]->AsDense(), keep));
          }
        }
        return absl::OkStatus();
      });
  if (!spill.ok()) {
    return Annotate(spill.status(),
                    absl::StrCat("the checkpoint's spill in ", spill_dir));
  }
  w->spill_ = *std::move(spill);
  w->spilled_rows_ = spilled;
  return w;
}

ShardWriteInParts::~ShardWriteInParts() {
  if (!spill_.file().empty()) {
    std::remove(absl::StrCat(spill_dir_, "/", spill_.file()).c_str());
  }
}

namespace {

// Copies the spill's records into `out`, closing each table with its
// tier's cold rows (`close`) and its end once its records are passed.
class SpillMerger : public ShardVisitor {
 public:
  SpillMerger(
      ShardWriter& out, size_t tables,
      std::function<absl::Status(uint32_t index, uint64_t* count)> close)
      : out_(out), counts_(tables, 0), close_(std::move(close)) {}

  absl::Status Rows(size_t t, absl::Span<const uint64_t> keys,
                    absl::Span<const float> state) override {
    PS_RETURN_IF_ERROR(CloseBefore(t));
    counts_[t] += keys.size();
    return out_.Rows(static_cast<uint32_t>(t), keys, state);
  }
  absl::Status Block(size_t t, uint64_t block, absl::Span<const float> values,
                     absl::Span<const float> state) override {
    PS_RETURN_IF_ERROR(CloseBefore(t));
    ++counts_[t];
    return out_.Block(static_cast<uint32_t>(t), block, values, state);
  }
  // Closes the tables left (after the last record).
  absl::Status Finish() { return CloseBefore(counts_.size()); }

 private:
  absl::Status CloseBefore(size_t t) {
    for (; next_ < t; ++next_) {
      const uint32_t index = static_cast<uint32_t>(next_);
      PS_RETURN_IF_ERROR(close_(index, &counts_[next_]));
      PS_RETURN_IF_ERROR(out_.EndTable(index, counts_[next_]));
    }
    return absl::OkStatus();
  }

  ShardWriter& out_;
  std::vector<uint64_t> counts_;
  std::function<absl::Status(uint32_t, uint64_t*)> close_;
  size_t next_ = 0;
};

}  // namespace

absl::StatusOr<ShardFile> ShardWriteInParts::Finish() {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<ShardReader> spill,
                      ShardReader::Open(spill_dir_, spill_, header_.clock(),
                                        OptimizerStateSize));
  std::vector<uint64_t> keys;
  std::vector<float> state;
  auto shard = WriteShardFile(
      checkpoint_dir_, header_, [&](ShardWriter& out) -> absl::Status {
        // Writes the cold rows of table `index` (a tiered one) after its
        // others.
        auto close = [&](uint32_t index, uint64_t* count) -> absl::Status {
          const Cold* cold = cold_[index].get();
          if (cold == nullptr) return absl::OkStatus();
          absl::Status written;
          const uint64_t before = *count;
          const absl::Status read = cold->tier->ForEachRow(
              ShardPageRows(cold->stride),
              [&](absl::Span<const uint64_t> cold_keys,
                  absl::Span<const float> cold_state) -> absl::Status {
                keys.assign(cold_keys.begin(), cold_keys.end());
                state.assign(cold_state.begin(), cold_state.end());
                written = WriteRowPage(out, index, cold->id, cold->name,
                                       cold->stride, keep_, keys, state, count);
                return written;
              },
              nullptr, cold->snapshot.get());
          if (!read.ok() && written.ok() && tier_error_.ok()) {
            tier_error_ = read;
            tier_error_table_ = cold->id;
          }
          cold_rows_ += *count - before;
          return read;
        };
        SpillMerger merger(out, header_.tables_size(), close);
        PS_RETURN_IF_ERROR(spill->ReadAll(merger));
        return merger.Finish();
      });
  cold_.clear();  // the snapshots go now, not with this object
  return shard;
}

absl::StatusOr<RestoreStats> RestoreShards(const std::string& checkpoint_dir,
                                           const CheckpointManifest& manifest,
                                           absl::Span<Table* const> tables,
                                           const RowFilter& keep) {
  const std::string context = absl::StrCat("checkpoint ", checkpoint_dir);
  PS_RETURN_IF_ERROR(Annotate(ValidateManifest(manifest), context));
  absl::flat_hash_map<uint32_t, Table*> by_id;
  for (Table* table : tables) {
    if (table == nullptr) return absl::InvalidArgumentError("null table");
    if (!by_id.emplace(table->id(), table).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("table id ", table->id(), " is given twice"));
    }
  }
  // Every header first, so that a checkpoint of another model (or a file
  // damaged in its header) changes nothing.
  for (const ShardFile& entry : manifest.shards()) {
    auto reader = ShardReader::Open(checkpoint_dir, entry, manifest.clock(), OptimizerStateSize);
    if (!reader.ok()) return Annotate(reader.status(), context);
    PS_RETURN_IF_ERROR(Annotate(MatchTables(**reader, by_id).status(), context));
  }
  RestoreStats stats;
  for (const ShardFile& entry : manifest.shards()) {
    auto reader = ShardReader::Open(checkpoint_dir, entry, manifest.clock(), OptimizerStateSize);
    if (!reader.ok()) return Annotate(reader.status(), context);
    auto targets = MatchTables(**reader, by_id);
    if (!targets.ok()) {
      // It matched in the first pass: the file changed under us.
      return absl::DataLossError(absl::StrCat(context, ": ", entry.file(),
                                              " changed while restoring: ",
                                              targets.status().message()));
    }
    ImportVisitor visitor(entry.file(), *targets, (*reader)->layouts(), keep, &stats);
    PS_RETURN_IF_ERROR(Annotate((*reader)->ReadAll(visitor), context));
    ++stats.files;
    stats.bytes += entry.bytes();
  }
  return stats;
}

ParameterDigest& ParameterDigest::operator+=(const ParameterDigest& other) {
  digest += other.digest;
  sparse_rows += other.sparse_rows;
  dense_blocks += other.dense_blocks;
  return *this;
}

bool ParameterDigest::operator==(const ParameterDigest& other) const {
  return digest == other.digest && sparse_rows == other.sparse_rows &&
         dense_blocks == other.dense_blocks;
}

ParameterDigest DigestTables(absl::Span<const Table* const> tables) {
  ParameterDigest result;
  std::vector<uint64_t> keys;
  std::vector<float> state;
  for (const Table* table : tables) {
    const uint32_t id = table->id();
    if (const SparseTable* sparse = table->AsSparse()) {
      const size_t stride = sparse->state_floats();
      const size_t page_rows = ShardPageRows(stride);
      uint64_t cursor = 0;
      do {
        keys.clear();
        state.clear();
        cursor = sparse->ExportRows(cursor, page_rows, &keys, &state);
        for (size_t i = 0; i < keys.size(); ++i) {
          result.digest += RowDigest(
              id, keys[i], absl::MakeConstSpan(state).subspan(i * stride, stride));
        }
        result.sparse_rows += keys.size();
      } while (cursor != 0);
      // A failed read leaves rows out, which the digest's comparison shows.
      sparse
          ->ExportColdRows(page_rows,
                           [&](absl::Span<const uint64_t> cold_keys,
                               absl::Span<const float> cold_state) {
                             for (size_t i = 0; i < cold_keys.size(); ++i) {
                               result.digest += RowDigest(
                                   id, cold_keys[i],
                                   cold_state.subspan(i * stride, stride));
                             }
                             result.sparse_rows += cold_keys.size();
                             return absl::OkStatus();
                           })
          .IgnoreError();
    } else {
      // The callback never fails.
      table->AsDense()
          ->ForEachBlock([&](uint64_t block, absl::Span<const float> values,
                             absl::Span<const float> block_state) {
            result.digest += BlockDigest(id, block, values, block_state);
            ++result.dense_blocks;
            return absl::OkStatus();
          })
          .IgnoreError();
    }
  }
  return result;
}

absl::StatusOr<ParameterDigest> DigestCheckpoint(const std::string& checkpoint_dir) {
  const std::string context = absl::StrCat("checkpoint ", checkpoint_dir);
  absl::StatusOr<CheckpointManifest> manifest = ReadManifest(checkpoint_dir);
  if (!manifest.ok()) return Annotate(manifest.status(), context);
  ParameterDigest result;
  for (const ShardFile& entry : manifest->shards()) {
    auto reader = ShardReader::Open(checkpoint_dir, entry, manifest->clock(), OptimizerStateSize);
    if (!reader.ok()) return Annotate(reader.status(), context);
    DigestVisitor visitor((*reader)->layouts(), &result);
    PS_RETURN_IF_ERROR(Annotate((*reader)->ReadAll(visitor), context));
  }
  return result;
}

}  // namespace ps
