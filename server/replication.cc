#include "server/replication.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/wire.h"

namespace ps::replication {
namespace {


enum class Payload { kNone, kFloats, kDoubles };

Payload PayloadOf(ReplicaKind kind) {
  switch (kind) {
    case REPLICA_APPLY:
    case REPLICA_BUFFER:
    case REPLICA_ROWS:
    case REPLICA_BLOCKS:
      return Payload::kFloats;
    case REPLICA_STEP_BUFFER:
      return Payload::kDoubles;
    default:
      return Payload::kNone;
  }
}

}  // namespace

// ------------------------------------------------------------- SeqWindow

bool SeqWindow::Has(uint64_t seq) const {
  if (bits_.empty()) return false;
  const uint64_t bit = seq % kWindow;
  return (bits_[bit / 64] >> (bit % 64)) & 1;
}

SeqWindow::Check SeqWindow::Test(uint64_t seq) const {
  if (seq > top_) return Check::kNew;
  if (top_ - seq >= kWindow) return Check::kTooOld;
  return Has(seq) ? Check::kDuplicate : Check::kNew;
}

void SeqWindow::Record(uint64_t seq) {
  if (bits_.empty()) bits_.assign(kWords, 0);
  if (seq > top_) {
    // Clear the bits of the sequence numbers the window slides over.
    if (seq - top_ >= kWindow) {
      std::fill(bits_.begin(), bits_.end(), 0);
    } else {
      for (uint64_t q = top_ + 1; q < seq; ++q) {
        const uint64_t b = q % kWindow;
        bits_[b / 64] &= ~(uint64_t{1} << (b % 64));
      }
    }
    top_ = seq;
  }
  const uint64_t bit = seq % kWindow;
  bits_[bit / 64] |= uint64_t{1} << (bit % 64);
}

void SeqWindow::Merge(const SeqWindow& other) {
  if (other.bits_.empty()) return;
  if (bits_.empty()) {
    *this = other;
    return;
  }
  // Slide up to the larger top first (Record of the top does that and
  // records it; the other window holds its top anyway when it is larger).
  if (other.top_ > top_) Record(other.top_);
  for (size_t w = 0; w < kWords; ++w) {
    uint64_t word = other.bits_[w];
    while (word != 0) {
      const int b = __builtin_ctzll(word);
      word &= word - 1;
      const uint64_t bit = w * 64 + static_cast<uint64_t>(b);
      // The sequence number of this bit in the other window.
      const uint64_t back = (other.top_ + kWindow - bit % kWindow) % kWindow;
      if (back >= other.top_) continue;  // would be <= 0
      const uint64_t q = other.top_ - back;
      if (top_ - q < kWindow) bits_[w] |= uint64_t{1} << b;
    }
  }
}

std::vector<uint64_t> SeqWindow::Words() const {
  return bits_.empty() ? std::vector<uint64_t>(kWords, 0) : bits_;
}

absl::StatusOr<SeqWindow> SeqWindow::FromWords(uint64_t top,
                                               absl::Span<const uint64_t> words) {
  if (words.size() != kWords) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sequence window has ", words.size(), " words, want ", kWords));
  }
  SeqWindow w;
  w.top_ = top;
  w.bits_.assign(words.begin(), words.end());
  return w;
}

// ----------------------------------------------------------------- codec

bool IsReplica(const std::vector<zmq::message_t>& frames, RequestHeader* header) {
  if (frames.empty()) return false;
  if (!header->ParseFromArray(frames[0].data(), static_cast<int>(frames[0].size()))) {
    return false;
  }
  return header->replica();
}

absl::Status DecodeReplica(std::vector<zmq::message_t>& frames,
                           ReplicaMessage* out) {
  if (frames.size() < 2 || frames.size() > 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "replica message has ", frames.size(), " frames; expected header, keys "
        "and maybe a payload"));
  }
  if (!out->header.ParseFromArray(frames[0].data(), static_cast<int>(frames[0].size()))) {
    return absl::InvalidArgumentError("replica header is not a valid RequestHeader");
  }
  const RequestHeader& h = out->header;
  if (!h.replica()) return absl::InvalidArgumentError("not a replica message");
  const ReplicaKind kind = h.replica_info().kind();
  if (!ReplicaKind_IsValid(kind) || kind == REPLICA_KIND_UNSPECIFIED) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown replica kind ", static_cast<int>(kind)));
  }
  if (kind == REPLICA_APPLY && h.op() != PUSH && h.op() != ASSIGN) {
    return absl::InvalidArgumentError("REPLICA_APPLY must carry a PUSH or an ASSIGN");
  }
  if (kind == REPLICA_BUFFER && h.op() != PUSH) {
    return absl::InvalidArgumentError("REPLICA_BUFFER must carry a PUSH");
  }
  const Payload payload = PayloadOf(kind);
  if ((payload != Payload::kNone) != (frames.size() == 3)) {
    return absl::InvalidArgumentError(absl::StrCat(
        ReplicaKind_Name(kind), " must ", payload != Payload::kNone ? "carry" : "not carry",
        " a payload frame"));
  }
  absl::Status s = ViewFrame(frames[1], "replica keys", &out->keys, &out->key_copy);
  if (!s.ok()) return s;
  if (out->keys.size() != h.num_keys()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "replica header says ", h.num_keys(), " keys but the keys frame holds ",
        out->keys.size()));
  }
  out->floats = {};
  out->doubles = {};
  if (payload == Payload::kFloats) {
    s = ViewFrame(frames[2], "replica payload", &out->floats, &out->float_copy);
  } else if (payload == Payload::kDoubles) {
    s = ViewFrame(frames[2], "replica payload", &out->doubles, &out->double_copy);
  }
  return s;
}

// ------------------------------------------------------------ BackupLink

absl::StatusOr<std::unique_ptr<BackupLink>> BackupLink::Connect(
    zmq::context_t& context, uint64_t node_id, const std::string& endpoint,
    const CurveKeys* curve) {
  try {
    zmq::socket_t socket(context, zmq::socket_type::dealer);
    if (curve != nullptr) {
      absl::Status s = ApplyCurveClient(socket, *curve);
      if (!s.ok()) return s;
    }
    socket.set(zmq::sockopt::linger, 0);
    // Nothing may be dropped: a lost message would be a lost update.
    socket.set(zmq::sockopt::sndhwm, 0);
    socket.set(zmq::sockopt::rcvhwm, 0);
    socket.set(zmq::sockopt::maxmsgsize, kMaxMessageBytes);
    socket.connect(endpoint);
    return std::unique_ptr<BackupLink>(
        new BackupLink(std::move(socket), node_id, endpoint));
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot connect to backup ", endpoint, ": ", e.what()));
  }
}

uint64_t BackupLink::Send(RequestHeader& header, zmq::message_t keys,
                          zmq::message_t payload, bool has_payload) {
  const uint64_t id = next_id_++;
  header.set_request_id(id);
  zmq::message_t head = SerializeToFrame(header);
  const uint64_t bytes =
      head.size() + keys.size() + (has_payload ? payload.size() : 0);
  unacked_.emplace_back(id, bytes);
  bytes_in_flight_ += bytes;
  socket_.send(head, zmq::send_flags::sndmore);
  socket_.send(keys, has_payload ? zmq::send_flags::sndmore : zmq::send_flags::none);
  if (has_payload) socket_.send(payload, zmq::send_flags::none);
  return id;
}

void BackupLink::set_acked(uint64_t id) {
  acked_ = std::max(acked_, id);
  while (!unacked_.empty() && unacked_.front().first <= acked_) {
    bytes_in_flight_ -= unacked_.front().second;
    unacked_.pop_front();
  }
}

}  // namespace ps::replication
