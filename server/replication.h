// Internal to the server (server/server.h): the parts of replication
// (cluster.replication 2) that hold no server state: windows of applied
// sequence numbers, the replica message codec (proto/data_plane.proto
// ReplicaInfo) and the socket a primary keeps to each of its backups.
// Thread-compatible.
#ifndef PS_SERVER_REPLICATION_H_
#define PS_SERVER_REPLICATION_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/curve_keys.h"
#include "common/status.h"
#include "proto/data_plane.pb.h"
#include "zmq.hpp"

namespace ps::replication {

// ClusterView.slot_backup of a slot without a backup.
inline constexpr uint32_t kNoBackup = 0xFFFFFFFF;

// Which sequence numbers (RequestHeader.seq) of one sender were applied:
// the highest, and a window of kWindow below it.
class SeqWindow {
 public:
  static constexpr uint64_t kWindow = uint64_t{1} << 16;
  static constexpr size_t kWords = kWindow / 64;
  enum class Check { kNew, kDuplicate, kTooOld };

  Check Test(uint64_t seq) const;
  void Record(uint64_t seq);
  // Records every sequence number `other` records that still lies in the
  // window once its top is the larger of the two tops.
  void Merge(const SeqWindow& other);

  uint64_t top() const { return top_; }
  // kWords words (all zero before the first Record).
  std::vector<uint64_t> Words() const;
  // A window as Words() and top() describe it; INVALID_ARGUMENT unless
  // words has kWords entries.
  static absl::StatusOr<SeqWindow> FromWords(uint64_t top,
                                             absl::Span<const uint64_t> words);

 private:
  bool Has(uint64_t seq) const;
  uint64_t top_ = 0;
  std::vector<uint64_t> bits_;  // kWords words once anything is recorded
};

// A replica message as received (frames: header, keys, [payload]). The
// spans point into the frames, or into the copies when a frame was not
// aligned; `out` must not be moved while they are in use.
struct ReplicaMessage {
  RequestHeader header;
  absl::Span<const uint64_t> keys;
  // The payload frame read as float32 (REPLICA_APPLY, _BUFFER, _ROWS,
  // _BLOCKS) or float64 (REPLICA_STEP_BUFFER); empty otherwise.
  absl::Span<const float> floats;
  absl::Span<const double> doubles;

  std::vector<uint64_t> key_copy;
  std::vector<float> float_copy;
  std::vector<double> double_copy;
};

// Checks the structure (frame count, header, kind, key count, payload a
// whole number of elements; table-specific sizes are the server's
// business). INVALID_ARGUMENT naming what is wrong.
absl::Status DecodeReplica(std::vector<zmq::message_t>& frames,
                           ReplicaMessage* out);

// Whether `frames` start with a RequestHeader that has `replica` set;
// fills *header when it parses.
bool IsReplica(const std::vector<zmq::message_t>& frames, RequestHeader* header);

// A primary's connection to one backup server: a ZeroMQ DEALER to the
// backup's data-plane endpoint, over which replica messages go in order
// and their answers come back in order. Numbers the messages it sends
// (RequestHeader.request_id, from 1) and remembers which are answered.
class BackupLink {
 public:
  // UNAVAILABLE if the socket cannot be set up.
  // `curve`: the job's CURVE key pair (the link is a CURVE client with
  // it), or null for plaintext; not retained.
  static absl::StatusOr<std::unique_ptr<BackupLink>> Connect(
      zmq::context_t& context, uint64_t node_id, const std::string& endpoint,
      const CurveKeys* curve);

  uint64_t node_id() const { return node_id_; }
  const std::string& endpoint() const { return endpoint_; }
  zmq::socket_t& socket() { return socket_; }

  // Sends header (request_id set here), keys and, if has_payload, the
  // payload frame. Returns the request id. Copies of frames share their
  // data, so the caller may pass copies of a received request's frames.
  uint64_t Send(RequestHeader& header, zmq::message_t keys,
                zmq::message_t payload, bool has_payload);

  // The id of the last message sent (0 = none) and the highest answered.
  uint64_t last_sent() const { return next_id_ - 1; }
  uint64_t acked() const { return acked_; }
  void set_acked(uint64_t id);
  bool all_acked() const { return acked_ + 1 >= next_id_; }
  // Messages sent and not answered yet, and their bytes (flow control of a
  // slot move's learner).
  uint64_t messages_in_flight() const { return last_sent() - acked_; }
  uint64_t bytes_in_flight() const { return bytes_in_flight_; }

  // Answers held back until messages of this link are answered: message
  // id -> an id of the server's choosing.
  std::multimap<uint64_t, uint64_t>& waiters() { return waiters_; }

  // The backup refused a message: its copy may lack an update, so every
  // slot it holds of this primary is copied again (see KVServer).
  bool resync = false;
  absl::Time last_resync = absl::InfinitePast();

 private:
  BackupLink(zmq::socket_t socket, uint64_t node_id, std::string endpoint)
      : node_id_(node_id), endpoint_(std::move(endpoint)), socket_(std::move(socket)) {}

  const uint64_t node_id_;
  const std::string endpoint_;
  zmq::socket_t socket_;
  uint64_t next_id_ = 1;
  uint64_t acked_ = 0;
  // (message id, bytes) of the messages not answered yet, oldest first.
  std::deque<std::pair<uint64_t, uint64_t>> unacked_;
  uint64_t bytes_in_flight_ = 0;
  std::multimap<uint64_t, uint64_t> waiters_;
};

}  // namespace ps::replication

#endif  // PS_SERVER_REPLICATION_H_
