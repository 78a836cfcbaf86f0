// DenseTable (server/table.h): a dense vector in blocks that are created,
// and initialised, on first touch. Apart from the sparse core (table.cc):
// the two share nothing but the Table base.
#include "server/table.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/finite.h"
#include "common/initializer.h"

namespace ps {

TableStats DenseTable::Stats() const {
  TableStats s = BaseStats();
  uint64_t elements = 0;
  for (const auto& [id, block] : blocks_) elements += block->values.size();
  s.set_rows(elements);
  return s;
}

DenseTable::DenseTable(const TableConfig& config,
                       std::unique_ptr<Optimizer> optimizer)
    : Table(config, std::move(optimizer)),
      size_(config.dense().size()),
      block_size_(config.dense().block_size()) {}

size_t DenseTable::MemoryBytes() const {
  size_t bytes = 0;
  for (const auto& [id, block] : blocks_) {
    bytes += (block->values.size() + block->state.size()) * sizeof(float);
  }
  return bytes;
}

absl::Status DenseTable::ValidateSegments(
    const Segments& segments) const {
  for (int i = 0; i < static_cast<int>(segments.size()); ++i) {
    const DenseSegment& s = segments.Get(i);
    // Checked in an order that cannot overflow: begin < size_ first.
    if (s.length() == 0 || s.begin() >= size_ || s.length() > size_ - s.begin()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "segment ", i, " [", s.begin(), ", +", s.length(),
          ") is empty or outside dense table '", config_.name(), "' of size ",
          size_));
    }
    if (s.begin() / block_size_ != (s.begin() + s.length() - 1) / block_size_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "segment ", i, " [", s.begin(), ", +", s.length(),
          ") crosses a block boundary (block_size ", block_size_, ")"));
    }
  }
  return absl::OkStatus();
}

DenseTable::Block& DenseTable::GetBlock(uint64_t block) {
  // Every push, assign and pull goes through here: a pull may create the
  // block, the others change it right after.
  if (watch_ != nullptr) watch_->RowChanged(id(), false, block);
  std::unique_ptr<Block>& b = blocks_[block];
  if (b == nullptr) {
    b = std::make_unique<Block>();
    const uint64_t first = block * block_size_;
    const size_t n = static_cast<size_t>(std::min(block_size_, size_ - first));
    b->values.resize(n);
    // Dense tables use key 0 with the element index, so a block's values do
    // not depend on the block size.
    InitializeValues(config_.init(), config_.id(), 0, first, n,
                     b->values.data());
    b->state.resize(n * optimizer_->state_size());
    optimizer_->InitState(b->state.data(), n);
  }
  return *b;
}

size_t DenseTable::BlockLength(uint64_t block) const {
  return static_cast<size_t>(std::min(block_size_, size_ - block * block_size_));
}

absl::Status DenseTable::ForEachBlock(
    absl::FunctionRef<absl::Status(uint64_t, absl::Span<const float>,
                                   absl::Span<const float>)>
        fn) const {
  // Sorted, so that the same table always yields the same sequence (and a
  // checkpoint the same bytes); the map's own order depends on its history.
  std::vector<uint64_t> ids;
  ids.reserve(blocks_.size());
  for (const auto& [id, block] : blocks_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (uint64_t id : ids) {
    const Block& b = *blocks_.at(id);
    absl::Status status = fn(id, b.values, b.state);
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

size_t DenseTable::DropBlocks(absl::FunctionRef<bool(uint64_t block)> drop) {
  size_t dropped = 0;
  for (auto it = blocks_.begin(); it != blocks_.end();) {
    if (drop(it->first)) {
      if (watch_ != nullptr) watch_->RowChanged(id(), false, it->first);
      blocks_.erase(it++);
      ++dropped;
    } else {
      ++it;
    }
  }
  return dropped;
}

absl::Status DenseTable::ImportBlock(uint64_t block,
                                     absl::Span<const float> values,
                                     absl::Span<const float> state) {
  if (block >= num_blocks()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dense table '", config_.name(), "' has ", num_blocks(),
        " blocks; cannot import block ", block));
  }
  const size_t n = BlockLength(block);
  const size_t state_n = n * static_cast<size_t>(optimizer_->state_size());
  if (values.size() != n || state.size() != state_n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dense table '", config_.name(), "': block ", block, " has ",
        values.size(), " values and ", state.size(),
        " floats of state, want ", n, " and ", state_n));
  }
  if (!AllFinite(values) || !AllFinite(state)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dense table '", config_.name(), "': block ", block,
        " holds a non-finite value"));
  }
  std::unique_ptr<Block>& b = blocks_[block];
  if (b == nullptr) b = std::make_unique<Block>();
  b->values.assign(values.begin(), values.end());
  b->state.assign(state.begin(), state.end());
  if (watch_ != nullptr) watch_->RowChanged(id(), false, block);
  return absl::OkStatus();
}

bool DenseTable::FindBlock(uint64_t block, absl::Span<const float>* values,
                           absl::Span<const float>* state) const {
  auto it = blocks_.find(block);
  if (it == blocks_.end()) return false;
  *values = it->second->values;
  *state = it->second->state;
  return true;
}

void DenseTable::Pull(const Segments& segments, float* out) {
  for (const DenseSegment& s : segments) {
    Block& b = GetBlock(s.begin() / block_size_);
    const size_t offset = s.begin() % block_size_;
    std::memcpy(out, b.values.data() + offset, s.length() * sizeof(float));
    out += s.length();
    counters_.keys_pulled += s.length();
  }
}

void DenseTable::Assign(const Segments& segments, const float* values) {
  for (const DenseSegment& s : segments) {
    Block& b = GetBlock(s.begin() / block_size_);
    const size_t offset = s.begin() % block_size_;
    std::memcpy(b.values.data() + offset, values, s.length() * sizeof(float));
    values += s.length();
  }
}

void DenseTable::Push(const Segments& segments, const float* grads,
                      float lr_scale) {
  const size_t state_size = optimizer_->state_size();
  for (const DenseSegment& s : segments) {
    Block& b = GetBlock(s.begin() / block_size_);
    const size_t offset = s.begin() % block_size_;
    optimizer_->Apply(b.values.data() + offset,
                      b.state.data() + offset * state_size, grads, s.length(),
                      lr_scale);
    grads += s.length();
    counters_.keys_pushed += s.length();
  }
}

}  // namespace ps
