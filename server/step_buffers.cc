#include "server/step_buffers.h"

#include <algorithm>

#include "common/hash.h"

namespace ps {
namespace {

bool InSlots(const std::vector<bool>& mask, uint32_t slot) {
  return slot < mask.size() && mask[slot];
}

}  // namespace

double* StepBuffer::Sparse::Row(uint64_t key, uint32_t dim) {
  auto [it, inserted] =
      index.try_emplace(key, static_cast<uint32_t>(keys.size()));
  if (inserted) {
    keys.push_back(key);
    sums.resize(sums.size() + dim, 0.0);
  }
  return &sums[size_t{it->second} * dim];
}

void StepBuffer::Dense::Touch(uint64_t block, uint64_t lo, uint64_t hi) {
  auto [range, inserted] = touched.try_emplace(block, lo, hi);
  if (!inserted) {
    range->second.first = std::min(range->second.first, lo);
    range->second.second = std::max(range->second.second, hi);
  }
}

void StepBuffer::Add(uint64_t node_id, Table* table,
                     absl::Span<const uint64_t> keys, const Segments& segments,
                     absl::Span<const float> grads) {
  pushers.insert(node_id);
  if (SparseTable* sparse_table = table->AsSparse()) {
    Sparse& b = sparse[table->id()];
    const uint32_t dim = sparse_table->dim();
    for (size_t i = 0; i < keys.size(); ++i) {
      double* sum = b.Row(keys[i], dim);
      const float* g = &grads[i * dim];
      for (uint32_t e = 0; e < dim; ++e) sum[e] += g[e];
    }
    return;
  }
  DenseTable* dense_table = table->AsDense();
  Dense& b = dense[table->id()];
  const uint64_t block_size = dense_table->block_size();
  const float* g = grads.data();
  for (const DenseSegment& s : segments) {
    const uint64_t block = s.begin() / block_size;
    std::vector<double>& sums = b.blocks[block];
    if (sums.empty()) {
      sums.assign(
          std::min(block_size, dense_table->size() - block * block_size), 0.0);
    }
    const uint64_t offset = s.begin() - block * block_size;
    for (uint64_t e = 0; e < s.length(); ++e) sums[offset + e] += g[e];
    b.Touch(block, offset, offset + s.length());
    g += s.length();
  }
}

void StepBuffer::MergeSparseSums(uint32_t table_id, uint32_t dim,
                                 absl::Span<const uint64_t> keys,
                                 absl::Span<const double> sums) {
  Sparse& b = sparse[table_id];
  for (size_t i = 0; i < keys.size(); ++i) {
    double* sum = b.Row(keys[i], dim);
    for (uint32_t e = 0; e < dim; ++e) sum[e] += sums[i * dim + e];
  }
}

void StepBuffer::MergeDenseSums(const DenseTable& table,
                                absl::Span<const uint64_t> ranges,
                                absl::Span<const double> sums) {
  Dense& b = dense[table.id()];
  size_t offset = 0;
  for (size_t i = 0; i + 2 < ranges.size(); i += 3) {
    const uint64_t block = ranges[i], lo = ranges[i + 1], hi = ranges[i + 2];
    const size_t len = table.BlockLength(block);
    std::vector<double>& block_sums = b.blocks[block];
    if (block_sums.empty()) block_sums.assign(len, 0.0);
    for (size_t e = 0; e < len; ++e) block_sums[e] += sums[offset + e];
    offset += len;
    b.Touch(block, lo, hi);
  }
}

void StepBuffer::ApplyTo(
    const absl::flat_hash_map<uint32_t, std::unique_ptr<Table>>& tables,
    uint64_t step, uint32_t divisor, uint32_t num_workers) const {
  std::vector<float> grads;
  for (const auto& [id, b] : sparse) {
    grads.resize(b.sums.size());
    for (size_t i = 0; i < grads.size(); ++i) {
      grads[i] = static_cast<float>(b.sums[i] / divisor);
    }
    // Every worker's gradients of the step were read at the step's
    // parameters: no staleness under BSP.
    SparseTable* table = tables.at(id)->AsSparse();
    table->Push(b.keys, grads.data(), table->RateScale(step, 0, num_workers));
  }
  for (const auto& [id, b] : dense) {
    DenseTable* table = tables.at(id)->AsDense();
    for (const auto& [block, sums] : b.blocks) {
      // Only the touched range: elements no worker pushed this step are
      // not updated, as they would not be under ASYNC.
      const auto [lo, hi] = b.touched.at(block);
      Segments seg;
      DenseSegment* s = seg.Add();
      s->set_begin(block * table->block_size() + lo);
      s->set_length(hi - lo);
      grads.resize(hi - lo);
      for (uint64_t e = lo; e < hi; ++e) {
        grads[e - lo] = static_cast<float>(sums[e] / divisor);
      }
      table->Push(seg, grads.data(), table->RateScale(step, 0, num_workers));
    }
  }
}

void StepBuffer::ExtractSlots(
    const std::vector<bool>& mask, uint32_t num_slots,
    const absl::flat_hash_map<uint32_t, uint32_t>& dims, StepBuffer* to) {
  for (auto& [table, b] : sparse) {
    const uint32_t dim = dims.at(table);
    decltype(b.keys) kept_keys;
    decltype(b.sums) kept_sums;
    decltype(b.index) kept_index;
    for (size_t i = 0; i < b.keys.size(); ++i) {
      const uint64_t key = b.keys[i];
      const double* sum = &b.sums[i * dim];
      if (InSlots(mask, SparseSlot(table, key, num_slots))) {
        if (to != nullptr) {
          double* into = to->sparse[table].Row(key, dim);
          for (uint32_t e = 0; e < dim; ++e) into[e] += sum[e];
        }
        continue;
      }
      kept_index.emplace(key, static_cast<uint32_t>(kept_keys.size()));
      kept_keys.push_back(key);
      kept_sums.insert(kept_sums.end(), sum, sum + dim);
    }
    b.keys = std::move(kept_keys);
    b.sums = std::move(kept_sums);
    b.index = std::move(kept_index);
  }
  for (auto& [table, b] : dense) {
    for (auto it = b.blocks.begin(); it != b.blocks.end();) {
      const uint64_t block = it->first;
      if (!InSlots(mask, DenseBlockSlot(table, block, num_slots))) {
        ++it;
        continue;
      }
      const auto range = b.touched[block];
      if (to != nullptr) {
        auto& t = to->dense[table];
        std::vector<double>& sums = t.blocks[block];
        if (sums.empty()) sums.assign(it->second.size(), 0.0);
        for (size_t e = 0; e < sums.size() && e < it->second.size(); ++e) {
          sums[e] += it->second[e];
        }
        t.Touch(block, range.first, range.second);
      }
      b.touched.erase(block);
      b.blocks.erase(it++);
    }
  }
  if (to != nullptr) to->pushers.insert(pushers.begin(), pushers.end());
}

bool StepBuffer::Empty() const {
  for (const auto& [table, s] : sparse) {
    if (!s.keys.empty()) return false;
  }
  for (const auto& [table, d] : dense) {
    if (!d.blocks.empty()) return false;
  }
  return true;
}

}  // namespace ps
