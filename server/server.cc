#include "server/server.h"

#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/wire.h"
#include "zmq_addon.hpp"

namespace ps {
namespace {

std::shared_ptr<spdlog::logger> Log() {
  static auto* const logger = new std::shared_ptr<spdlog::logger>(GetLogger("server"));
  return *logger;
}

// Poll period of the serving loop; bounds how long Stop() waits.
constexpr std::chrono::milliseconds kPollPeriod{50};

absl::Status CheckFinite(absl::Span<const float> values) {
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gradient ", i, " is not finite (", values[i], "); push rejected"));
    }
  }
  return absl::OkStatus();
}

// A pull answers with n floats; refuse before allocating what no frame may
// carry anyway.
absl::Status CheckResponseSize(uint64_t n) {
  if (n > static_cast<uint64_t>(kMaxMessageBytes) / sizeof(float)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "request addresses ", n, " values; the limit per message is ",
        kMaxMessageBytes / sizeof(float)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<KVServer>> KVServer::Start(Options options) {
  std::unique_ptr<KVServer> server(new KVServer(std::move(options)));
  for (const TableConfig& tc : server->options_.config.tables()) {
    auto table = Table::Create(tc);
    if (!table.ok()) return table.status();
    server->tables_[tc.id()] = std::move(table).value();
  }
  try {
    server->socket_ = zmq::socket_t(server->context_, zmq::socket_type::router);
    server->socket_.set(zmq::sockopt::maxmsgsize, kMaxMessageBytes);
    server->socket_.set(zmq::sockopt::linger, 0);
    server->socket_.bind(server->options_.bind_endpoint);
    server->endpoint_ = server->socket_.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(absl::StrCat(
        "cannot bind ", server->options_.bind_endpoint, ": ", e.what()));
  }
  const size_t colon = server->endpoint_.rfind(':');
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(server->endpoint_.substr(colon + 1), &server->port_)) {
    return absl::InternalError(
        absl::StrCat("cannot parse bound endpoint ", server->endpoint_));
  }
  if (server->options_.standalone) {
    auto own = std::make_shared<Ownership>();
    own->all = true;
    absl::MutexLock lock(&server->view_mu_);
    server->ownership_ = std::move(own);
  }
  server->thread_ = std::thread([s = server.get()] { s->Serve(); });
  Log()->info("serving {} tables on {}", server->tables_.size(),
              server->endpoint_);
  return server;
}

KVServer::KVServer(Options options)
    : options_(std::move(options)), ownership_(std::make_shared<Ownership>()) {}

KVServer::~KVServer() { Stop(); }

void KVServer::Stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void KVServer::UpdateView(const ClusterView& view, uint32_t rank) {
  auto own = std::make_shared<Ownership>();
  own->rank = rank;
  own->epoch = view.epoch();
  if (view.job_state() != STARTING) {
    own->slot_owner.assign(view.slot_owner().begin(), view.slot_owner().end());
  }
  absl::MutexLock lock(&view_mu_);
  if (ownership_->all) return;  // standalone servers ignore views
  ownership_ = std::move(own);
}

KVServer::Stats KVServer::stats() const {
  Stats s;
  s.requests = requests_.load();
  s.errors = errors_.load();
  s.keys_pushed = keys_pushed_.load();
  s.keys_pulled = keys_pulled_.load();
  return s;
}

void KVServer::Serve() {
  std::vector<zmq::message_t> frames;
  while (!stop_.load(std::memory_order_relaxed)) {
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    try {
      if (zmq::poll(&item, 1, kPollPeriod) == 0) continue;
      // Drain everything queued before polling again.
      while (true) {
        frames.clear();
        auto n = zmq::recv_multipart(socket_, std::back_inserter(frames),
                                     zmq::recv_flags::dontwait);
        if (!n) break;
        if (frames.empty()) continue;
        // frames[0] is the peer identity added by the ROUTER socket.
        zmq::message_t identity = std::move(frames[0]);
        frames.erase(frames.begin());
        std::shared_ptr<const Ownership> own;
        {
          absl::MutexLock lock(&view_mu_);
          own = ownership_;
        }
        ResponseHeader rh;
        zmq::message_t values;
        Handle(frames, *own, &rh, &values);
        const bool has_values = values.size() > 0;
        socket_.send(identity, zmq::send_flags::sndmore);
        socket_.send(SerializeToFrame(rh), has_values ? zmq::send_flags::sndmore
                                                      : zmq::send_flags::none);
        if (has_values) socket_.send(values, zmq::send_flags::none);
      }
    } catch (const zmq::error_t& e) {
      // A send to a vanished peer or an interrupted poll must not take the
      // server down; log and keep serving.
      Log()->warn("data plane: {}", e.what());
    }
  }
}

void KVServer::Handle(std::vector<zmq::message_t>& frames,
                      const Ownership& own, ResponseHeader* rh,
                      zmq::message_t* values) {
  requests_.fetch_add(1, std::memory_order_relaxed);
  rh->set_epoch(own.epoch);
  absl::Status status = Process(frames, own, rh, values);
  if (!status.ok()) {
    errors_.fetch_add(1, std::memory_order_relaxed);
    rh->set_code(static_cast<int32_t>(status.code()));
    rh->set_message(std::string(status.message()));
    rh->set_num_values(0);
    *values = zmq::message_t();
    Log()->debug("request {} rejected: {}", rh->request_id(), status.ToString());
  }
}

absl::Status KVServer::Process(std::vector<zmq::message_t>& frames,
                               const Ownership& own, ResponseHeader* rh,
                               zmq::message_t* values) {
  DecodedRequest req;
  absl::Status status = DecodeRequest(frames, &req);
  rh->set_request_id(req.header.request_id());
  if (!status.ok()) return status;
  const RequestHeader& h = req.header;

  auto it = tables_.find(h.table_id());
  if (it == tables_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown table ", h.table_id()));
  }
  if (!own.all && own.slot_owner.empty()) {
    return absl::UnavailableError("server has no cluster view yet");
  }
  const uint32_t num_slots = static_cast<uint32_t>(own.slot_owner.size());
  auto not_owner = [&](uint32_t slot) {
    return absl::FailedPreconditionError(absl::StrCat(
        "slot ", slot, " is owned by server ", own.slot_owner[slot],
        ", not this server (rank ", own.rank, ") in epoch ", own.epoch,
        "; refresh the cluster view"));
  };
  const bool push = h.op() == PUSH || h.op() == PUSH_PULL;
  const bool pull = h.op() == PULL || h.op() == PUSH_PULL;
  Table* table = it->second.get();

  if (SparseTable* sparse = table->AsSparse()) {
    if (h.segments_size() != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table ", h.table_id(), " is sparse; requests carry keys, not segments"));
    }
    const size_t n = req.keys.size() * sparse->dim();
    if (push && req.values.size() != n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "push of ", req.keys.size(), " keys to table ", h.table_id(), " (dim ",
          sparse->dim(), ") needs ", n, " values, got ", req.values.size()));
    }
    PS_RETURN_IF_ERROR(CheckResponseSize(n));
    if (!own.all) {
      for (uint64_t key : req.keys) {
        const uint32_t slot = SparseSlot(h.table_id(), key, num_slots);
        if (own.slot_owner[slot] != own.rank) return not_owner(slot);
      }
    }
    if (push) {
      PS_RETURN_IF_ERROR(CheckFinite(req.values));
      sparse->Push(req.keys, req.values.data());
      keys_pushed_.fetch_add(req.keys.size(), std::memory_order_relaxed);
    }
    if (pull) {
      std::vector<float> out(n);
      sparse->Pull(req.keys, out.data());
      keys_pulled_.fetch_add(req.keys.size(), std::memory_order_relaxed);
      rh->set_num_values(n);
      *values = FrameFromVector(std::move(out));
    }
    return absl::OkStatus();
  }

  DenseTable* dense = table->AsDense();
  if (!req.keys.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table ", h.table_id(), " is dense; requests carry segments, not keys"));
  }
  const Segments& segments = h.segments();
  PS_RETURN_IF_ERROR(dense->ValidateSegments(segments));
  uint64_t n = 0;
  for (const DenseSegment& s : segments) n += s.length();
  PS_RETURN_IF_ERROR(CheckResponseSize(n));
  if (push && req.values.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("dense push addresses ", n, " elements but carries ",
                     req.values.size(), " values"));
  }
  if (!own.all) {
    for (const DenseSegment& s : segments) {
      const uint32_t slot =
          DenseBlockSlot(h.table_id(), s.begin() / dense->block_size(), num_slots);
      if (own.slot_owner[slot] != own.rank) return not_owner(slot);
    }
  }
  if (push) {
    PS_RETURN_IF_ERROR(CheckFinite(req.values));
    dense->Push(segments, req.values.data());
    keys_pushed_.fetch_add(n, std::memory_order_relaxed);
  }
  if (pull) {
    std::vector<float> out(n);
    dense->Pull(segments, out.data());
    keys_pulled_.fetch_add(n, std::memory_order_relaxed);
    rh->set_num_values(n);
    *values = FrameFromVector(std::move(out));
  }
  return absl::OkStatus();
}

}  // namespace ps
