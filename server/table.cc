#include "server/table.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/initializer.h"

namespace ps {

absl::StatusOr<std::unique_ptr<Table>> Table::Create(
    const TableConfig& config) {
  auto optimizer = Optimizer::Create(config.optimizer());
  if (!optimizer.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table '", config.name(), "': ", optimizer.status().message()));
  }
  switch (config.kind_case()) {
    case TableConfig::kSparse:
      if (config.sparse().dim() == 0 || config.sparse().dim() > 65536) {
        return absl::InvalidArgumentError(absl::StrCat(
            "table '", config.name(), "': sparse.dim must be in 1..65536"));
      }
      return std::unique_ptr<Table>(
          new SparseTable(config, std::move(optimizer).value()));
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

SparseTable::SparseTable(const TableConfig& config,
                         std::unique_ptr<Optimizer> optimizer)
    : Table(config, std::move(optimizer)),
      dim_(config.sparse().dim()),
      stride_(static_cast<size_t>(dim_) * (1 + optimizer_->state_size())),
      chunk_shift_([this] {
        int shift = kMaxChunkShift;
        while (shift > 0 && (stride_ * sizeof(float) << shift) > kMaxChunkBytes) --shift;
        return shift;
      }()),
      chunk_rows_(1u << chunk_shift_) {}

size_t SparseTable::MemoryBytes() const {
  return chunks_.size() * chunk_rows_ * stride_ * sizeof(float) +
         index_.capacity() * (sizeof(uint64_t) + sizeof(uint32_t) + 1);
}

float* SparseTable::Row(uint64_t key) {
  auto [it, inserted] = index_.try_emplace(key, 0);
  if (!inserted) {
    const uint32_t r = it->second;
    return chunks_[r >> chunk_shift_].get() + (r & (chunk_rows_ - 1)) * stride_;
  }
  const uint32_t r = static_cast<uint32_t>(index_.size() - 1);
  it->second = r;
  if ((r >> chunk_shift_) >= chunks_.size()) {
    chunks_.emplace_back(new float[chunk_rows_ * stride_]);
  }
  float* row = chunks_[r >> chunk_shift_].get() + (r & (chunk_rows_ - 1)) * stride_;
  InitializeValues(config_.init(), config_.id(), key, 0, dim_, row);
  optimizer_->InitState(row + dim_, dim_);
  return row;
}

void SparseTable::Pull(absl::Span<const uint64_t> keys, float* out) {
  for (size_t i = 0; i < keys.size(); ++i) {
    std::memcpy(out + i * dim_, Row(keys[i]), dim_ * sizeof(float));
  }
}

void SparseTable::Push(absl::Span<const uint64_t> keys, const float* grads) {
  for (size_t i = 0; i < keys.size(); ++i) {
    float* row = Row(keys[i]);
    optimizer_->Apply(row, row + dim_, grads + i * dim_, dim_, 1.0f);
  }
}

// ----------------------------------------------------------------- dense

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

void DenseTable::Pull(const Segments& segments, float* out) {
  for (const DenseSegment& s : segments) {
    Block& b = GetBlock(s.begin() / block_size_);
    const size_t offset = s.begin() % block_size_;
    std::memcpy(out, b.values.data() + offset, s.length() * sizeof(float));
    out += s.length();
  }
}

void DenseTable::Push(const Segments& segments,
                      const float* grads) {
  const size_t state_size = optimizer_->state_size();
  for (const DenseSegment& s : segments) {
    Block& b = GetBlock(s.begin() / block_size_);
    const size_t offset = s.begin() % block_size_;
    optimizer_->Apply(b.values.data() + offset,
                      b.state.data() + offset * state_size, grads, s.length(), 1.0f);
    grads += s.length();
  }
}

}  // namespace ps
