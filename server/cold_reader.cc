#include "server/cold_reader.h"

#include <algorithm>
#include <utility>

namespace ps {

ColdReader::ColdReader(DiskTier* tier, size_t state_floats,
                       size_t max_staged_rows, std::function<void()> done,
                       std::function<void()> before_read)
    : tier_(tier),
      state_floats_(state_floats),
      max_staged_rows_(std::max<size_t>(max_staged_rows, 1)),
      done_(std::move(done)),
      before_read_(std::move(before_read)) {
  thread_ = std::thread([this] { Loop(); });
}

ColdReader::~ColdReader() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void ColdReader::Loop() {
  while (true) {
    std::unique_ptr<Batch> batch;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &ColdReader::WorkOrStop));
      if (stop_) return;
      batch = std::move(queue_.front());
      queue_.pop_front();
    }
    if (before_read_) before_read_();
    const size_t n = batch->keys.size();
    batch->states.resize(n * state_floats_);
    batch->tags.resize(n);
    batch->status = tier_->MultiGet(batch->keys, batch->states.data(),
                                    batch->tags.data(), &batch->found);
    {
      absl::MutexLock lock(&mu_);
      finished_.push_back(std::move(batch));
    }
    if (done_) done_();
  }
}

ColdReader::Where ColdReader::Find(uint64_t key, uint64_t* batch) const {
  if (staged_.contains(key)) return Where::kStaged;
  const auto it = reading_.find(key);
  if (it == reading_.end()) return Where::kNone;
  *batch = it->second;
  return Where::kReading;
}

uint64_t ColdReader::Submit(absl::Span<const uint64_t> keys, bool promote) {
  auto batch = std::make_unique<Batch>();
  batch->promote = promote;
  const uint64_t id = submitted_ + 1;
  for (uint64_t key : keys) {
    if (staged_.contains(key)) continue;
    if (!reading_.try_emplace(key, id).second) continue;
    batch->keys.push_back(key);
  }
  if (batch->keys.empty()) return 0;
  batch->id = id;
  submitted_ = id;
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(batch));
  return id;
}

bool ColdReader::InstallOne(absl::Status* error) {
  std::unique_ptr<Batch> batch;
  {
    absl::MutexLock lock(&mu_);
    if (finished_.empty()) return false;
    batch = std::move(finished_.front());
    finished_.pop_front();
  }
  *error = batch->status;
  // The previous batch's rows go first; this one's stay until its
  // requests used them (the caller trims after).
  Trim();
  size_t staged = 0;
  for (size_t i = 0; i < batch->keys.size(); ++i) {
    const uint64_t key = batch->keys[i];
    reading_.erase(key);
    const bool stale = stale_.erase(key) > 0;
    if (!batch->status.ok() || stale || !batch->found[i]) continue;
    Stage(key, &batch->states[i * state_floats_], batch->tags[i]);
    request_rows_.push_back(key);
    ++staged;
  }
  rows_read_ += staged;
  last_promote_ = batch->promote;
  installed_ = batch->id;
  return true;
}

void ColdReader::Stage(uint64_t key, const float* state,
                       const ColdRowTag& tag) {
  Row& row = staged_[key];
  row.state.assign(state, state + state_floats_);
  row.tag = tag;
  staged_order_.push_back(key);
}

void ColdReader::Trim() {
  for (uint64_t key : request_rows_) {
    if (!pinned_.contains(key)) staged_.erase(key);
  }
  request_rows_.clear();
  // Pinned rows are kept besides the cap.
  const size_t cap = max_staged_rows_ + pinned_.size();
  while (staged_.size() > cap && !staged_order_.empty()) {
    const uint64_t key = staged_order_.front();
    staged_order_.pop_front();
    if (pinned_.contains(key)) {
      staged_order_.push_back(key);
    } else {
      staged_.erase(key);
    }
  }
  // A large batch grew the maps; give their memory back once it is used.
  if (staged_.capacity() > 4 * cap + 64) staged_.rehash(0);
  if (reading_.empty() && reading_.capacity() > 4 * cap + 64) {
    reading_ = {};
    stale_ = {};
  }
  // Keys staged again or dropped leave old entries behind; rebuild before
  // they outgrow the rows.
  if (staged_order_.size() > 2 * staged_.size() + 64) {
    staged_order_.clear();
    for (const auto& [k, unused] : staged_) staged_order_.push_back(k);
  }
}

const float* ColdReader::Staged(uint64_t key, ColdRowTag* tag) const {
  const auto it = staged_.find(key);
  if (it == staged_.end()) return nullptr;
  *tag = it->second.tag;
  return it->second.state.data();
}

void ColdReader::Pin(absl::Span<const uint64_t> keys) {
  for (uint64_t key : keys) {
    if (staged_.contains(key)) ++pinned_[key];
  }
}

void ColdReader::Unpin(absl::Span<const uint64_t> keys) {
  for (uint64_t key : keys) {
    const auto it = pinned_.find(key);
    if (it != pinned_.end() && --it->second == 0) pinned_.erase(it);
  }
}

void ColdReader::Invalidate(uint64_t key) {
  staged_.erase(key);
  pinned_.erase(key);
  if (reading_.contains(key)) stale_.insert(key);
}

void ColdReader::InvalidateIf(absl::FunctionRef<bool(uint64_t key)> drop) {
  std::vector<uint64_t> keys;
  for (const auto& [key, row] : staged_)
    if (drop(key)) keys.push_back(key);
  for (const auto& [key, batch] : reading_)
    if (drop(key)) keys.push_back(key);
  for (uint64_t key : keys) Invalidate(key);
}

size_t ColdReader::MemoryBytes() const {
  // Rows with their vectors' heap blocks, and the maps' slots.
  return staged_.size() * (state_floats_ * sizeof(float) + 16) +
         staged_.capacity() * (sizeof(uint64_t) + sizeof(Row) + 1) +
         staged_order_.size() * sizeof(uint64_t) +
         pinned_.capacity() * (sizeof(uint64_t) + sizeof(uint32_t) + 1) +
         reading_.capacity() * (2 * sizeof(uint64_t) + 1);
}

}  // namespace ps
