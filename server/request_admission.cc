#include "server/request_admission.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/finite.h"
#include "server/server_log.h"

namespace ps {

Admission::Admission(const DataPlaneConfig& data_plane, size_t max_standalone_senders,
                     const Clock* clock, Counters counters)
    : limits_(LimitsWithDefaults(data_plane.limits())),
      gradients_(data_plane.gradients()),
      max_standalone_senders_(max_standalone_senders),
      clock_(clock),
      counters_(counters) {}

uint64_t Admission::FramesBytes(const std::vector<zmq::message_t>& frames) {
  uint64_t bytes = 0;
  for (const zmq::message_t& f : frames) bytes += f.size();
  return bytes;
}

bool Admission::MayHold(uint64_t bytes) const {
  return counters_.held_bytes->load() + bytes <= static_cast<uint64_t>(limits_.max_held_bytes());
}

absl::Status Admission::RoomToHold(const std::vector<zmq::message_t>& frames,
                                   absl::string_view waiting) {
  if (MayHold(FramesBytes(frames))) return absl::OkStatus();
  counters_.limit_refusals->fetch_add(1, std::memory_order_relaxed);
  return absl::UnavailableError(
      absl::StrCat("server busy: ", counters_.held_bytes->load(), " bytes of ", waiting,
                   " (data_plane.limits.max_held_bytes ", limits_.max_held_bytes(), "); retry"));
}

absl::Status Admission::AdmitRequest(uint64_t message_bytes, const RequestHeader& h,
                                     bool standalone, const WorkerRanks& worker_rank,
                                     uint64_t epoch) {
  if (message_bytes > static_cast<uint64_t>(limits_.max_message_bytes())) {
    counters_.limit_refusals->fetch_add(1, std::memory_order_relaxed);
    return absl::ResourceExhaustedError(absl::StrCat(
        "request of ", message_bytes, " bytes exceeds data_plane.limits.max_message_bytes ",
        limits_.max_message_bytes()));
  }
  if (h.num_keys() > limits_.max_keys_per_message()) {
    counters_.limit_refusals->fetch_add(1, std::memory_order_relaxed);
    return absl::ResourceExhaustedError(absl::StrCat(
        "request of ", h.num_keys(), " keys exceeds data_plane.limits.max_keys_per_message ",
        limits_.max_keys_per_message()));
  }
  const uint64_t sender = h.sender_node_id();
  if (sender == 0 || h.op() == STATS) return absl::OkStatus();
  if (standalone) {
    // No view to check senders against: bound how many get state here.
    if (!standalone_senders_.contains(sender)) {
      if (standalone_senders_.size() >= max_standalone_senders_) {
        counters_.limit_refusals->fetch_add(1, std::memory_order_relaxed);
        return absl::ResourceExhaustedError(
            absl::StrCat("this standalone server already keeps state for ", max_standalone_senders_,
                         " senders; node ", sender, " refused"));
      }
      standalone_senders_.insert(sender);
    }
    return absl::OkStatus();
  }
  if (!worker_rank.contains(sender)) {
    counters_.unknown_sender_refusals->fetch_add(1, std::memory_order_relaxed);
    return absl::UnavailableError(
        absl::StrCat("sender node ", sender, " is not a live worker in this server's view (epoch ",
                     epoch, "); retry once the view has it"));
  }
  return absl::OkStatus();
}

absl::Status Admission::PolicePushValues(const RequestHeader& h, bool standalone,
                                         const WorkerRanks& worker_rank, bool assign, float* values,
                                         size_t n) {
  const float clip = gradients_.clip_value();
  if (!AllFinite(absl::MakeConstSpan(values, n))) {
    uint64_t bad = 0;
    size_t first = n;
    for (size_t i = 0; i < n; ++i) {
      if (!std::isfinite(values[i])) {
        if (first == n) first = i;
        ++bad;
      }
    }
    const bool reject = assign || gradients_.nonfinite() != GradientPolicy::CLIP || clip <= 0;
    counters_.nonfinite_values->fetch_add(bad, std::memory_order_relaxed);
    if (reject) counters_.nonfinite_pushes_rejected->fetch_add(1, std::memory_order_relaxed);
    // The rank the view knows for the sender (a header's own claim only on
    // a standalone server); labels stay bounded by the live workers.
    std::string worker = "none";
    if (h.sender_node_id() != 0) {
      auto it = worker_rank.find(h.sender_node_id());
      if (it != worker_rank.end()) {
        worker = absl::StrCat(it->second);
      } else if (standalone && h.sender_rank() < max_standalone_senders_) {
        worker = absl::StrCat(h.sender_rank());
      } else {
        worker = "other";
      }
    }
    const char* action = reject ? "rejected" : "clipped";
    if (nonfinite_family_ != nullptr) nonfinite_family_->With({worker, action})->Add(bad);
    const absl::Time now = clock_->Now();
    if (now - last_nonfinite_log_ >= absl::Seconds(1)) {
      ServerLog()->warn(
          "worker rank {} (node {}) pushed {} non-finite value(s) of {} to "
          "table {} at "
          "step {} (first: element {} = {}); {}{}",
          worker, h.sender_node_id(), bad, n, h.table_id(), h.clock(), first,
          values[first], reject ? "push rejected" : "clipped and applied",
          nonfinite_unlogged_ > 0
              ? absl::StrCat(" (", nonfinite_unlogged_,
                             " such pushes not logged before it)")
              : "");
      last_nonfinite_log_ = now;
      nonfinite_unlogged_ = 0;
    } else {
      ++nonfinite_unlogged_;
    }
    if (reject) {
      return absl::InvalidArgumentError(absl::StrCat(
          assign ? "ASSIGN value " : "gradient ", first, " is not finite (", values[first], "); ",
          bad, " of ", n, " values are not; ", assign ? "assign" : "push", " rejected"));
    }
    for (size_t i = 0; i < n; ++i) {
      if (std::isnan(values[i])) {
        values[i] = 0.0f;
      } else if (std::isinf(values[i])) {
        values[i] = values[i] > 0 ? clip : -clip;
      }
    }
  }
  if (!assign && clip > 0) {
    for (size_t i = 0; i < n; ++i) values[i] = std::clamp(values[i], -clip, clip);
  }
  return absl::OkStatus();
}

}  // namespace ps
