#include "scheduler/ring_registry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "scheduler/scheduler_log.h"

namespace ps {
namespace {

constexpr absl::Duration kMaxWait = absl::Seconds(30);
// Liveness changes happen outside this registry's lock, so a formation that
// waits for a member to be declared dead looks again this often.
constexpr absl::Duration kLivenessPoll = absl::Milliseconds(100);

}  // namespace

RingRegistry::RingRegistry(std::function<bool(uint64_t)> is_live_worker,
                           std::function<size_t()> live_workers,
                           uint64_t first_generation)
    : is_live_worker_(std::move(is_live_worker)),
      live_workers_(std::move(live_workers)),
      generation_(first_generation) {}

void RingRegistry::StartFormingLocked() {
  if (forming_) return;
  forming_ = true;
  expected_.clear();
  waiting_.clear();
  min_members_ = 0;
  for (uint64_t m : members_) {
    if (is_live_worker_(m)) expected_.insert(m);
  }
}

void RingRegistry::TryFormLocked() {
  if (!forming_) return;
  absl::erase_if(expected_, [&](uint64_t n) { return !is_live_worker_(n); });
  absl::erase_if(waiting_, [&](uint64_t n) { return !is_live_worker_(n); });
  for (uint64_t n : expected_) {
    if (!waiting_.contains(n)) return;
  }
  if (waiting_.size() < std::min<size_t>(min_members_, live_workers_())) return;
  ++generation_;
  members_.assign(waiting_.begin(), waiting_.end());
  std::sort(members_.begin(), members_.end());
  forming_ = false;
  expected_.clear();
  waiting_.clear();
  store_.clear();
  store_bytes_ = 0;
  SchedulerLog()->info("dense ring generation {} formed: {} members (nodes {})",
                       generation_, members_.size(),
                       absl::StrJoin(members_, ","));
}

JoinRingResponse RingRegistry::FormedLocked(uint64_t node_id) const {
  JoinRingResponse response;
  auto it = std::find(members_.begin(), members_.end(), node_id);
  response.set_formed(true);
  response.set_generation(generation_);
  response.set_rank(static_cast<uint32_t>(it - members_.begin()));
  response.set_size(static_cast<uint32_t>(members_.size()));
  for (uint64_t m : members_) response.add_members(m);
  return response;
}

absl::StatusOr<JoinRingResponse> RingRegistry::Join(uint64_t node_id,
                                                    uint32_t min_members,
                                                    uint64_t after_generation,
                                                    absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  if (!is_live_worker_(node_id)) {
    return absl::NotFoundError(
        absl::StrCat("node ", node_id, " is not a live worker"));
  }
  const bool member =
      std::find(members_.begin(), members_.end(), node_id) != members_.end();
  if (member && after_generation != 0 && generation_ > after_generation) {
    return FormedLocked(node_id);  // formed between the caller's asks
  }
  StartFormingLocked();
  expected_.insert(node_id);
  waiting_.insert(node_id);
  min_members_ = std::max(min_members_, min_members);
  const uint64_t target = generation_ + 1;
  const absl::Time deadline = absl::Now() + std::min(timeout, kMaxWait);
  auto formed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || generation_ >= target;
  };
  TryFormLocked();
  while (!formed() && absl::Now() < deadline) {
    mu_.AwaitWithTimeout(absl::Condition(&formed),
                         std::min(kLivenessPoll, deadline - absl::Now()));
    TryFormLocked();
  }
  if (closed_) return absl::UnavailableError("the scheduler is shutting down");
  if (generation_ < target ||
      std::find(members_.begin(), members_.end(), node_id) == members_.end()) {
    // Not formed yet, or formed without this node (it was declared dead
    // meanwhile): the caller asks again, and is expected then.
    JoinRingResponse response;
    response.set_generation(generation_);
    std::vector<uint64_t> missing;
    for (uint64_t n : expected_) {
      if (!waiting_.contains(n)) missing.push_back(n);
    }
    std::sort(missing.begin(), missing.end());
    for (uint64_t n : missing) response.add_waiting_for(n);
    return response;
  }
  return FormedLocked(node_id);
}

absl::Status RingRegistry::Leave(uint64_t node_id) {
  absl::MutexLock lock(&mu_);
  auto it = std::find(members_.begin(), members_.end(), node_id);
  const bool member = it != members_.end();
  if (member) members_.erase(it);
  expected_.erase(node_id);
  waiting_.erase(node_id);
  // The others' collectives with it fail or would wait for it: they form
  // a generation without it.
  if (member && !members_.empty()) StartFormingLocked();
  TryFormLocked();
  return absl::OkStatus();
}

absl::StatusOr<bool> RingRegistry::Watch(uint64_t node_id, uint64_t generation,
                                         absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto rejoin = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || forming_ || generation != generation_ ||
           std::find(members_.begin(), members_.end(), node_id) ==
               members_.end();
  };
  mu_.AwaitWithTimeout(absl::Condition(&rejoin), std::min(timeout, kMaxWait));
  if (closed_) return absl::UnavailableError("the scheduler is shutting down");
  return rejoin();
}

absl::StatusOr<uint64_t> RingRegistry::KeyGeneration(
    const std::string& key) const {
  const size_t slash = key.find('/');
  uint64_t generation = 0;
  if (slash == std::string::npos ||
      !absl::SimpleAtoi(key.substr(0, slash), &generation)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring store key '", key.substr(0, kMaxKeyBytes),
                     "' does not start with '<generation>/'"));
  }
  if (generation != generation_) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring store key '", key, "' is of generation ", generation,
                     ", not the current ", generation_));
  }
  return generation;
}

absl::StatusOr<RingStoreResponse> RingRegistry::Store(
    const RingStoreRequest& request, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  if (!is_live_worker_(request.node_id())) {
    return absl::NotFoundError(
        absl::StrCat("node ", request.node_id(), " is not a live worker"));
  }
  if (request.get_keys_size() > 4096) {
    return absl::InvalidArgumentError("at most 4096 keys per request");
  }
  for (const std::string& key : request.get_keys()) {
    if (key.size() > kMaxKeyBytes) {
      return absl::InvalidArgumentError("ring store key too long");
    }
    PS_RETURN_IF_ERROR(KeyGeneration(key).status());
  }
  if (!request.set_key().empty()) {
    const std::string& key = request.set_key();
    if (key.size() > kMaxKeyBytes ||
        request.set_value().size() > kMaxValueBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("ring store key over ", kMaxKeyBytes,
                       " bytes or value over ", kMaxValueBytes, " bytes"));
    }
    PS_RETURN_IF_ERROR(KeyGeneration(key).status());
    auto old = store_.find(key);
    const size_t before =
        old == store_.end() ? 0 : key.size() + old->second.size();
    const size_t after = key.size() + request.set_value().size();
    if (store_bytes_ - before + after > kMaxStoreBytes) {
      return absl::ResourceExhaustedError("the ring store is full");
    }
    store_bytes_ = store_bytes_ - before + after;
    store_[key] = request.set_value();
  }
  const uint64_t generation = generation_;
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (closed_ || generation_ != generation) return true;
    for (const std::string& key : request.get_keys()) {
      if (!store_.contains(key)) return false;
    }
    return true;
  };
  mu_.AwaitWithTimeout(absl::Condition(&ready), std::min(timeout, kMaxWait));
  if (closed_) return absl::UnavailableError("the scheduler is shutting down");
  if (generation_ != generation) {
    return absl::AbortedError(absl::StrCat("dense ring generation ", generation,
                                           " was replaced by ", generation_));
  }
  RingStoreResponse response;
  for (const std::string& key : request.get_keys()) {
    auto it = store_.find(key);
    if (it == store_.end()) {
      return absl::DeadlineExceededError(
          absl::StrCat("ring store key '", key, "' was not set in time"));
    }
    response.add_values(it->second);
  }
  return response;
}

void RingRegistry::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

uint64_t RingRegistry::generation() const {
  absl::MutexLock lock(&mu_);
  return generation_;
}

std::vector<uint64_t> RingRegistry::members() const {
  absl::MutexLock lock(&mu_);
  return members_;
}

}  // namespace ps
