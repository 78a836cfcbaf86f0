// Data-plane benchmark: push and pull through a real KVServer and KVClient
// over loopback TCP, each figure beside a baseline measured in the same run
// on the same machine.
//
//   kv_bench --mode=kv     sparse 10K-key messages, Adagrad applied, with
//                          key-list caching (the default) and without
//                          (*_uncached); then the step figures below
//   kv_bench --mode=dense  dense 4 MB tensors, SGD applied: the zero-copy
//                          forms (push_/pull_bytes_per_s), then the
//                          copying ones (push_/pull_copy_bytes_per_s)
//   kv_bench --mode=step   bytes on the wire per training step (StepBench)
//
// Baselines (the "raw" side): a hand-written toy server on a plain TCP
// socket in this process, with the least a server can do.
//   kv:    the toy server reads [keys][values] messages and applies Adagrad
//          in an open-addressing table (key beside its row);
//          pulls gather from it. The client keeps `window` messages in
//          flight, like the KVClient side.
//   dense: a socket pump: one thread writes 4 MB messages, the toy server
//          reads them and acknowledges; nothing is applied. This is the
//          loopback bandwidth one stream reaches: the ceiling to compare with.
//          Beside it (the *_vs_toy figures), the toy server doing a dense
//          push's work on its one thread (read, check finiteness, apply
//          SGD) and answering a pull straight from its array.
//
// Figures and baselines run in alternating rounds (MeasureInRounds).
//
// Bytes on the wire are measured, not computed: the sum of
// tcp_info.tcpi_bytes_received over every TCP socket of this process (the
// client's and the server's), i.e. TCP payload, ZeroMQ framing and our
// headers included, TCP/IP headers excluded. The baseline is the minimum
// a request can carry: its keys and values.
//
// One JSON line per figure on stdout (see tests/bench.sh); notes on stderr.
#include <arpa/inet.h>
#include <dirent.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/allocator.h"
#include "common/config.h"
#include "common/curve_keys.h"
#include "common/finite.h"
#include "common/hash.h"
#include "common/logging.h"
#include "proto/scheduler.pb.h"
#include "server/server.h"
#include "tests/bench/bench_util.h"
#include "worker/kv_client.h"

ABSL_FLAG(std::string, mode, "kv",
          "kv (sparse), dense, or step (bytes on the wire per step).");
ABSL_FLAG(uint32_t, message_keys, 10000, "kv: keys per message.");
ABSL_FLAG(uint32_t, dim, 1, "kv: floats per row.");
ABSL_FLAG(uint64_t, key_space, 65536,
          "kv: distinct keys the messages draw from.");
ABSL_FLAG(uint64_t, dense_bytes, 4 << 20, "dense: bytes per tensor.");
ABSL_FLAG(int, window, 4, "Messages in flight per client.");
ABSL_FLAG(double, seconds, 2.0, "Time per measurement.");
ABSL_FLAG(int, repeat, 3, "Measurements per figure; the best is reported.");
ABSL_FLAG(
    bool, curve, false,
    "Server and client use CURVE (security.curve) with a fresh job key pair.");
ABSL_FLAG(std::string, dense_forms, "push,pull,push_copy,pull_copy",
          "dense: the forms to measure, comma-separated (fewer: e.g. to "
          "profile one).");
ABSL_FLAG(bool, raw, true,
          "Measure the raw baselines (false: only the parameter server, e.g. "
          "to profile it).");

namespace ps {
namespace {

using SteadyClock = std::chrono::steady_clock;
using bench::ReadFull;
using bench::WriteFull;

double Seconds(SteadyClock::time_point since) {
  return std::chrono::duration<double>(SteadyClock::now() - since).count();
}

void Die(const std::string& what) {
  std::fprintf(stderr, "kv_bench: %s\n", what.c_str());
  std::exit(1);
}

const char* g_bench = "kv";

void Emit(const std::string& metric, double value, const char* unit,
          double baseline) {
  std::printf(
      "{\"bench\":\"%s\",\"metric\":\"%s\",\"value\":%.6g,\"unit\":\"%s\","
      "\"baseline\":%.6g,\"ratio\":%.3f}\n",
      g_bench, metric.c_str(), value, unit, baseline, value / baseline);
  std::fflush(stdout);
}

// TCP payload bytes received by every TCP socket of this process so far.
uint64_t TcpBytesReceived() {
  uint64_t total = 0;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  while (dirent* e = readdir(dir)) {
    const int fd = std::atoi(e->d_name);
    if (fd <= 2) continue;
    tcp_info info{};
    socklen_t len = sizeof(info);
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) == 0 &&
        len >= offsetof(tcp_info, tcpi_bytes_received) +
                   sizeof(info.tcpi_bytes_received)) {
      total += info.tcpi_bytes_received;
    }
  }
  closedir(dir);
  return total;
}

// ---------------------------------------------------------------------------
// The toy server and its client.

enum RawOp : uint32_t {
  kRawPush = 1,
  kRawPull = 2,
  kRawPump = 3,
  kRawPullDense = 4,
  kRawPushSgd = 5,  // a dense push, checked for finiteness and applied with SGD
};
struct RawHeader {
  uint32_t op;
  uint32_t n;  // keys, or bytes for the pump
};

// Adagrad rows in an open-addressing table (linear probing, each key
// stored beside its weights and accumulators, so a lookup usually touches
// one cache line): the update with no table features, about as fast as a
// hand-written server can make it.
class RawTable {
 public:
  RawTable(uint32_t dim, size_t max_keys) : dim_(dim), stride_(2 + 2 * dim) {
    size_t capacity = 16;
    while (capacity < 2 * max_keys) capacity *= 2;
    mask_ = capacity - 1;
    // Each slot: the key (two float-sized words), then dim weights and dim
    // accumulators.
    slots_.assign(capacity * stride_, 0.0f);
    for (size_t i = 0; i < capacity; ++i) SetKey(i, kEmpty);
  }
  float* Row(uint64_t key) {
    size_t i = (key * 0x9E3779B97F4A7C15ull) >> 40 & mask_;
    while (true) {
      const uint64_t k = Key(i);
      if (k == key) break;
      if (k == kEmpty) {
        SetKey(i, key);
        break;
      }
      i = (i + 1) & mask_;
    }
    return &slots_[i * stride_ + 2];
  }
  void Push(const uint64_t* keys, size_t n, const float* g) {
    for (size_t i = 0; i < n; ++i) {
      float* w = Row(keys[i]);
      float* acc = w + dim_;
      const float* gi = g + i * dim_;
      for (uint32_t e = 0; e < dim_; ++e) {
        acc[e] += gi[e] * gi[e];
        w[e] -= 0.1f * gi[e] / (std::sqrt(acc[e]) + 1e-8f);
      }
    }
  }
  void Pull(const uint64_t* keys, size_t n, float* out) {
    for (size_t i = 0; i < n; ++i) {
      const float* w = Row(keys[i]);
      for (uint32_t e = 0; e < dim_; ++e) out[i * dim_ + e] = w[e];
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  uint64_t Key(size_t i) const {
    uint64_t k;
    std::memcpy(&k, &slots_[i * stride_], sizeof(k));
    return k;
  }
  void SetKey(size_t i, uint64_t k) {
    std::memcpy(&slots_[i * stride_], &k, sizeof(k));
  }

  const uint32_t dim_;
  const size_t stride_;  // floats per slot
  size_t mask_ = 0;
  std::vector<float> slots_;
};

class RawServer {
 public:
  RawServer(uint32_t dim, size_t max_keys) : table_(dim, max_keys), dim_(dim) {
    listen_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (bind(listen_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
        listen(listen_, 4) != 0 ||
        getsockname(listen_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      Die("raw server: cannot listen on loopback");
    }
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~RawServer() {
    thread_.join();
    close(listen_);
  }
  int port() const { return port_; }

 private:
  void Serve() {
    const int fd = accept(listen_, nullptr, nullptr);
    if (fd < 0) return;
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::vector<uint64_t> keys;
    std::vector<float> values;
    std::vector<char> bytes;
    std::vector<float> dense_in, weights;
    RawHeader h;
    uint64_t ack = 0;
    while (ReadFull(fd, &h, sizeof(h))) {
      if (h.op == kRawPush || h.op == kRawPull) {
        keys.resize(h.n);
        values.resize(size_t{h.n} * dim_);
        if (!ReadFull(fd, keys.data(), keys.size() * 8)) break;
        if (h.op == kRawPush) {
          if (!ReadFull(fd, values.data(), values.size() * 4)) break;
          table_.Push(keys.data(), keys.size(), values.data());
          if (!WriteFull(fd, &++ack, sizeof(ack))) break;
        } else {
          table_.Pull(keys.data(), keys.size(), values.data());
          if (!WriteFull(fd, values.data(), values.size() * 4)) break;
        }
      } else if (h.op == kRawPushSgd) {
        // What the parameter server does with a dense push, and nothing
        // more: check every value (rejecting changes nothing), then apply.
        dense_in.resize(h.n / 4);
        if (!ReadFull(fd, dense_in.data(), dense_in.size() * 4)) break;
        weights.resize(dense_in.size());
        if (AllFinite(dense_in)) {
          for (size_t i = 0; i < weights.size(); ++i)
            weights[i] -= 0.1f * dense_in[i];
        }
        if (!WriteFull(fd, &++ack, sizeof(ack))) break;
      } else if (h.op == kRawPump || h.op == kRawPullDense) {
        bytes.resize(h.n);
        if (h.op == kRawPump) {
          if (!ReadFull(fd, bytes.data(), bytes.size())) break;
          if (!WriteFull(fd, &++ack, sizeof(ack))) break;
        } else if (!WriteFull(fd, bytes.data(), bytes.size())) {
          break;
        }
      } else {
        break;
      }
    }
    close(fd);
  }

  RawTable table_;
  const uint32_t dim_;
  int listen_ = -1;
  int port_ = 0;
  std::thread thread_;
};

// Runs `count` requests with at most `window` in flight: send(i) writes
// request i (on this thread), recv(i) reads its answer (on a second
// thread). Returns the seconds from the first send to the last answer.
template <typename Send, typename Recv>
double Pipelined(size_t count, int window, Send send, Recv recv) {
  absl::Mutex mu;
  size_t answered = 0;
  const auto start = SteadyClock::now();
  std::thread reader([&] {
    for (size_t i = 0; i < count; ++i) {
      recv(i);
      absl::MutexLock lock(&mu);
      ++answered;
    }
  });
  for (size_t i = 0; i < count; ++i) {
    {
      absl::MutexLock lock(&mu);
      auto room = [&] { return i - answered < static_cast<size_t>(window); };
      mu.Await(absl::Condition(&room));
    }
    send(i);
  }
  reader.join();
  return Seconds(start);
}

int ConnectRaw(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    Die("raw client: cannot connect");
  }
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

// A toy server and the client's connection to it. Closing the connection
// first (in the destructor's body) ends the server's thread, which the
// server's destructor then joins.
struct RawConnection {
  RawConnection(uint32_t dim, size_t max_keys)
      : server(dim, max_keys), fd(ConnectRaw(server.port())) {}
  ~RawConnection() { close(fd); }
  RawServer server;
  const int fd;
};

// ---------------------------------------------------------------------------
// The parameter server side: one KVServer (one serving thread, owning every
// slot of a 64-slot map) and one KVClient, in this process.

struct Ps {
  std::unique_ptr<KVServer> server;
  std::unique_ptr<KVClient> client;
};

// `data_plane`: the job's DataPlaneConfig, as textproto fields.
Ps StartPs(uint32_t dim, uint64_t dense_floats,
           const std::string& data_plane = "") {
  const std::string text =
      absl::StrFormat(R"pb(
                        data_plane { %s }
                        cluster {
                          num_servers: 1
                          num_workers: 1
                          num_slots: 64
                          request_timeout_ms: 600000
                        }
                        tables {
                          id: 1
                          name: "emb"
                          sparse { dim: %u }
                          optimizer { adagrad { learning_rate: 0.1 } }
                        }
                        tables {
                          id: 2
                          name: "dense"
                          dense { size: %u }
                          optimizer { sgd { learning_rate: 0.1 } }
                        }
                      )pb",
                      data_plane, dim, dense_floats);
  auto config = ParseJobConfig(text, "kv_bench");
  if (!config.ok()) Die(config.status().ToString());
  Ps ps;
  KVServer::Options so;
  so.config = *config;
  std::optional<CurveKeys> curve;
  if (absl::GetFlag(FLAGS_curve)) {
    auto keys = GenerateCurveKeys();
    if (!keys.ok()) Die(keys.status().ToString());
    curve = *keys;
  }
  so.curve = curve;
  auto server = KVServer::Start(so);
  if (!server.ok()) Die(server.status().ToString());
  ps.server = std::move(*server);

  // A cluster view, as the scheduler would send it, rather than a
  // standalone server: the server then checks every key's owner, as it
  // does in a job.
  ClusterView view;
  view.set_epoch(1);
  view.set_job_state(RUNNING);
  view.set_num_slots(config->cluster().num_slots());
  for (uint32_t s = 0; s < config->cluster().num_slots(); ++s)
    view.add_slot_owner(0);
  NodeInfo* node = view.add_nodes();
  node->set_role(SERVER);
  node->set_state(ALIVE);
  node->set_rank(0);
  node->set_node_id(1);
  node->set_data_endpoint(ps.server->endpoint());
  NodeInfo* worker = view.add_nodes();
  worker->set_role(WORKER);
  worker->set_state(ALIVE);
  worker->set_rank(0);
  worker->set_node_id(2);
  ps.server->UpdateView(view, 0);
  KVClient::Options co;
  co.config = *config;
  co.rank = 0;
  co.node_id = 2;
  co.curve = curve;
  auto client = KVClient::Create(co, view);
  if (!client.ok()) Die(client.status().ToString());
  ps.client = std::move(*client);
  return ps;
}

// Issues `count` requests with at most `window` in flight; returns seconds.
template <typename Issue>
double PsPipelined(size_t count, int window, Issue issue) {
  std::deque<Completion> inflight;
  const auto start = SteadyClock::now();
  for (size_t i = 0; i < count; ++i) {
    if (inflight.size() >= static_cast<size_t>(window)) {
      absl::Status s = inflight.front().Wait();
      if (!s.ok()) Die(s.ToString());
      inflight.pop_front();
    }
    inflight.push_back(issue(i));
  }
  for (auto& c : inflight) {
    absl::Status s = c.Wait();
    if (!s.ok()) Die(s.ToString());
  }
  return Seconds(start);
}

// One figure to measure: run(count) performs `count` calls and returns the
// seconds they took; each call moves `items_per_call` items.
struct Figure {
  std::function<double(size_t)> run;
  double items_per_call = 1;
  double rate = 0;            // best items/s
  double bytes_per_item = 0;  // TCP payload bytes per item in the best run
  size_t count = 16;
};

// Measures every figure `repeat` times and keeps each one's best rate. The
// runs go in rounds, each round running every figure once, so a figure and
// the baseline it is divided by sample the same moments of a noisy machine
// (on 2 vCPUs back-to-back runs of one figure varied by a third; a baseline
// measured seconds before its figure moved the ratio as much). Each
// figure's count is sized from a first probe so that a run takes about
// `seconds`.
void MeasureInRounds(const std::vector<Figure*>& figures) {
  const double seconds = absl::GetFlag(FLAGS_seconds);
  for (Figure* f : figures) {
    const double probe = f->run(f->count);
    f->count = std::max<size_t>(
        16, static_cast<size_t>(f->count * seconds / std::max(probe, 1e-6)));
  }
  for (int r = 0; r < absl::GetFlag(FLAGS_repeat); ++r) {
    for (Figure* f : figures) {
      const uint64_t before = TcpBytesReceived();
      const double elapsed = f->run(f->count);
      const uint64_t after = TcpBytesReceived();
      const double rate = f->count * f->items_per_call / elapsed;
      if (rate > f->rate) {
        f->rate = rate;
        f->bytes_per_item = static_cast<double>(after - before) /
                            (f->count * f->items_per_call);
      }
    }
  }
}

// ---------------------------------------------------------------------------

int SparseBench() {
  g_bench = "kv";
  const uint32_t n = absl::GetFlag(FLAGS_message_keys);
  const uint32_t dim = absl::GetFlag(FLAGS_dim);
  const uint64_t space = absl::GetFlag(FLAGS_key_space);
  const int window = absl::GetFlag(FLAGS_window);
  // 64 messages of random keys from the key space, used round-robin.
  constexpr size_t kMessages = 64;
  std::vector<std::vector<uint64_t>> messages(kMessages,
                                              std::vector<uint64_t>(n));
  uint64_t s = 1;
  for (auto& m : messages) {
    for (auto& k : m) {
      s = Mix64(s);
      k = Mix64(s % space);
    }
  }
  std::vector<float> grads(size_t{n} * dim, 0.01f);
  std::vector<uint64_t> all(space);
  for (uint64_t k = 0; k < space; ++k) all[k] = Mix64(k);
  std::vector<float> all_grads(all.size() * dim, 0.01f);
  const double min_push = 8.0 + 4.0 * dim;  // a key and its values
  const double min_pull = 8.0 + 4.0 * dim;

  // The raw toy server and the parameter server are both up, so their runs
  // can alternate (MeasureInRounds).
  const bool raw_wanted = absl::GetFlag(FLAGS_raw);
  std::optional<RawConnection> raw;
  int fd = -1;
  Figure raw_push_fig, raw_pull_fig, push_fig, pull_fig, push_uncached_fig,
      pull_uncached_fig;
  std::vector<Figure*> figures;
  uint64_t ack;
  std::vector<float> raw_out(size_t{n} * dim);
  auto raw_push_message = [&](const std::vector<uint64_t>& keys,
                              const float* g) {
    RawHeader h{kRawPush, static_cast<uint32_t>(keys.size())};
    if (!WriteFull(fd, &h, sizeof(h)) ||
        !WriteFull(fd, keys.data(), keys.size() * 8) ||
        !WriteFull(fd, g, keys.size() * dim * 4)) {
      Die("raw push: write failed");
    }
  };
  if (raw_wanted) {
    fd = raw.emplace(dim, space).fd;
    // Create every row first: the figures are for updates of existing rows.
    raw_push_message(all, all_grads.data());
    if (!ReadFull(fd, &ack, 8)) Die("raw: read failed");
    raw_push_fig.items_per_call = n;
    raw_push_fig.run = [&](size_t count) {
      return Pipelined(
          count, window,
          [&](size_t i) {
            raw_push_message(messages[i % kMessages], grads.data());
          },
          [&](size_t) {
            if (!ReadFull(fd, &ack, 8)) Die("raw: read failed");
          });
    };
    raw_pull_fig.items_per_call = n;
    raw_pull_fig.run = [&](size_t count) {
      return Pipelined(
          count, window,
          [&](size_t i) {
            const auto& keys = messages[i % kMessages];
            RawHeader h{kRawPull, static_cast<uint32_t>(keys.size())};
            if (!WriteFull(fd, &h, sizeof(h)) ||
                !WriteFull(fd, keys.data(), keys.size() * 8)) {
              Die("raw pull: write failed");
            }
          },
          [&](size_t) {
            if (!ReadFull(fd, raw_out.data(), raw_out.size() * 4))
              Die("raw: read failed");
          });
    };
  }

  // The parameter server as a job runs it (key-list caching on: a repeated
  // list travels as a digest, and the server reuses the rows it found for
  // it), and with caching off, where every request carries its keys and
  // the server looks each one up, as the toy does.
  Ps ps = StartPs(dim, 1);
  Ps uncached = StartPs(dim, 1, "key_cache_bytes: -1");
  // One output buffer per message in flight.
  std::vector<std::vector<float>> outs(window,
                                       std::vector<float>(size_t{n} * dim));
  auto measure = [&](KVClient& client, Figure* push, Figure* pull) {
    if (absl::Status st = client.Push(1, all, all_grads).Wait(); !st.ok())
      Die(st.ToString());
    push->items_per_call = n;
    // The runs outlive this call: they hold the client by pointer.
    push->run = [&, c = &client](size_t count) {
      return PsPipelined(count, window, [&](size_t i) {
        return c->Push(1, messages[i % kMessages], grads);
      });
    };
    pull->items_per_call = n;
    pull->run = [&, c = &client](size_t count) {
      return PsPipelined(count, window, [&](size_t i) {
        return c->Pull(1, messages[i % kMessages], outs[i % window].data());
      });
    };
  };
  measure(*ps.client, &push_fig, &pull_fig);
  measure(*uncached.client, &push_uncached_fig, &pull_uncached_fig);
  if (raw_wanted) figures.push_back(&raw_push_fig);
  figures.push_back(&push_fig);
  figures.push_back(&push_uncached_fig);
  if (raw_wanted) figures.push_back(&raw_pull_fig);
  figures.push_back(&pull_fig);
  figures.push_back(&pull_uncached_fig);
  MeasureInRounds(figures);
  raw.reset();
  const double raw_push = raw_push_fig.rate, raw_pull = raw_pull_fig.rate;
  const double push = push_fig.rate, pull = pull_fig.rate;
  const double push_uncached = push_uncached_fig.rate,
               pull_uncached = pull_uncached_fig.rate;
  const double push_bytes = push_fig.bytes_per_item,
               pull_bytes = pull_fig.bytes_per_item;
  Emit("push_adagrad_keys_per_s", push, "keys/s", raw_push);
  Emit("pull_keys_per_s", pull, "keys/s", raw_pull);
  Emit("push_adagrad_keys_per_s_uncached", push_uncached, "keys/s", raw_push);
  Emit("pull_keys_per_s_uncached", pull_uncached, "keys/s", raw_pull);
  Emit("push_wire_bytes_per_key", push_bytes, "bytes", min_push);
  Emit("pull_wire_bytes_per_key", pull_bytes, "bytes", min_pull);
  Emit("push_wire_bytes_per_key_uncached", push_uncached_fig.bytes_per_item,
       "bytes", min_push);
  Emit("pull_wire_bytes_per_key_uncached", pull_uncached_fig.bytes_per_item,
       "bytes", min_pull);
  std::fprintf(stderr,
               "# kv: %u-key messages, dim %u, %llu distinct keys, window %d; "
               "raw toy server "
               "push %.3g keys/s, pull %.3g keys/s\n",
               n, dim, static_cast<unsigned long long>(space), window, raw_push,
               raw_pull);
  std::printf(
      "{\"bench\":\"kv\",\"summary\":{\"push_keys_per_s\":%.4g,\"push_ratio\":%"
      ".3f,"
      "\"pull_keys_per_s\":%.4g,\"pull_ratio\":%.3f,\"push_uncached_ratio\":%."
      "3f,"
      "\"pull_uncached_ratio\":%.3f,\"push_wire_ratio\":%.4f,\"pull_wire_"
      "ratio\":%.4f}}\n",
      push, push / raw_push, pull, pull / raw_pull, push_uncached / raw_push,
      pull_uncached / raw_pull, push_bytes / min_push, pull_bytes / min_pull);
  return 0;
}

// Bytes on the wire per training step, against the minimum a step must
// move: the step's keys and values in each direction. A step is what
// worker/trainer.cc sends: pull the batch's unique keys (8192 keys of
// dimension 16 from 1M ids) and a 64K-float dense tensor, then push their
// gradients and advance the clock. Measured with key-list caching on (the
// default) and off, and with FLOAT16 values.
int StepBench() {
  g_bench = "kv";
  constexpr uint32_t kDim = 16;
  constexpr size_t kKeys = 8192;
  constexpr uint64_t kDense = 65536;
  constexpr int kSteps = 200;
  constexpr size_t kLists = 8;
  std::vector<std::vector<uint64_t>> lists(kLists,
                                           std::vector<uint64_t>(kKeys));
  uint64_t s = 3;
  for (auto& l : lists) {
    for (auto& k : l) {
      s = Mix64(s);
      k = Mix64(s % 1000000);
    }
  }
  std::vector<float> grads(kKeys * kDim, 0.01f), out(kKeys * kDim);
  std::vector<float> dense_grads(kDense, 0.01f), dense_out(kDense);
  // keys and values of the sparse pull and push, the dense tensor both ways
  const double minimum =
      2.0 * (kKeys * 8.0 + kKeys * kDim * 4.0) + 2.0 * kDense * 4.0;
  struct Variant {
    const char* metric;
    const char* data_plane;
    const char* note;
  };
  for (const Variant& v :
       {Variant{"step_wire_bytes_uncached", "key_cache_bytes: -1",
                "no key-list caching"},
        Variant{"step_wire_bytes", "", "key-list caching (the default)"},
        Variant{"step_wire_bytes_fp16",
                "push_values: FLOAT16 pull_values: FLOAT16",
                "key-list caching, FLOAT16 values both ways"}}) {
    Ps ps = StartPs(kDim, kDense, v.data_plane);
    KVClient& c = *ps.client;
    auto step = [&](int i) {
      const auto& keys = lists[i % kLists];
      absl::Status st = c.Pull(1, keys, out.data()).Wait();
      if (st.ok()) st = c.PullDense(2, 0, kDense, dense_out.data()).Wait();
      if (st.ok()) st = c.Push(1, keys, grads).Wait();
      if (st.ok()) st = c.PushDense(2, 0, dense_grads).Wait();
      if (st.ok()) st = c.AdvanceClock().Wait();
      if (!st.ok()) Die(st.ToString());
    };
    for (int i = 0; i < static_cast<int>(kLists); ++i)
      step(i);  // warm-up: lists sent once
    const uint64_t before = TcpBytesReceived();
    for (int i = 0; i < kSteps; ++i) step(i);
    const double per_step =
        static_cast<double>(TcpBytesReceived() - before) / kSteps;
    Emit(v.metric, per_step, "bytes", minimum);
    std::fprintf(stderr, "# %s: %.0f bytes per step, minimum %.0f (%s)\n",
                 v.metric, per_step, minimum, v.note);
  }
  return 0;
}

int DenseBench() {
  g_bench = "dense";
  const uint64_t bytes = absl::GetFlag(FLAGS_dense_bytes) / 4 * 4;
  const uint64_t floats = bytes / 4;
  const int window = absl::GetFlag(FLAGS_window);
  std::vector<float> grads(floats, 0.001f);

  const std::vector<std::string> forms =
      absl::StrSplit(absl::GetFlag(FLAGS_dense_forms), ',');
  auto wants = [&](const char* form) {
    return std::find(forms.begin(), forms.end(), form) != forms.end();
  };
  // The toy server and the parameter server are both up, so their runs can
  // alternate (MeasureInRounds).
  const bool raw_wanted = absl::GetFlag(FLAGS_raw);
  std::optional<RawConnection> raw;
  int fd = -1;
  const double items = static_cast<double>(bytes);
  Figure pump_fig{{}, items}, raw_sgd_fig{{}, items}, raw_pull_fig{{}, items},
      push_fig{{}, items}, pull_fig{{}, items}, push_copy_fig{{}, items},
      pull_copy_fig{{}, items};
  std::vector<Figure*> figures;
  uint64_t ack;
  std::vector<char> in(bytes);
  if (raw_wanted) {
    fd = raw.emplace(1, 16).fd;
    // The pump and the toy push: the tensor goes out, an ack comes back.
    auto send_tensors = [&](RawOp op) {
      return [&, op](size_t count) {
        return Pipelined(
            count, window,
            [&](size_t) {
              RawHeader h{op, static_cast<uint32_t>(bytes)};
              if (!WriteFull(fd, &h, sizeof(h)) ||
                  !WriteFull(fd, grads.data(), bytes)) {
                Die("raw: write failed");
              }
            },
            [&](size_t) {
              if (!ReadFull(fd, &ack, 8)) Die("raw: read failed");
            });
      };
    };
    pump_fig.run = send_tensors(kRawPump);
    raw_sgd_fig.run = send_tensors(kRawPushSgd);
    raw_pull_fig.run = [&](size_t count) {
      return Pipelined(
          count, window,
          [&](size_t) {
            RawHeader h{kRawPullDense, static_cast<uint32_t>(bytes)};
            if (!WriteFull(fd, &h, sizeof(h))) Die("raw pull: write failed");
          },
          [&](size_t) {
            if (!ReadFull(fd, in.data(), in.size())) Die("raw: read failed");
          });
    };
    figures.push_back(&pump_fig);
    figures.push_back(&raw_sgd_fig);
    figures.push_back(&raw_pull_fig);
  }

  Ps ps = StartPs(1, floats);
  KVClient& client = *ps.client;
  // The zero-copy forms (what a large-tensor user calls): frames point into
  // the shared gradients, pulls keep the answer's frame.
  auto shared = std::make_shared<const std::vector<float>>(grads);
  push_fig.run = [&](size_t count) {
    return PsPipelined(count, window,
                       [&](size_t) { return client.PushDense(2, 0, shared); });
  };
  std::vector<DenseValues> pulled(window);
  pull_fig.run = [&](size_t count) {
    return PsPipelined(count, window, [&](size_t i) {
      return client.PullDense(2, 0, floats, &pulled[i % window]);
    });
  };
  // The copying forms: values copied into frames, answers into the caller's
  // arrays.
  push_copy_fig.run = [&](size_t count) {
    return PsPipelined(count, window,
                       [&](size_t) { return client.PushDense(2, 0, grads); });
  };
  std::vector<std::vector<float>> outs(window, std::vector<float>(floats));
  pull_copy_fig.run = [&](size_t count) {
    return PsPipelined(count, window, [&](size_t i) {
      return client.PullDense(2, 0, floats, outs[i % window].data());
    });
  };
  if (wants("push")) figures.push_back(&push_fig);
  if (wants("pull")) figures.push_back(&pull_fig);
  if (wants("push_copy")) figures.push_back(&push_copy_fig);
  if (wants("pull_copy")) figures.push_back(&pull_copy_fig);
  MeasureInRounds(figures);
  raw.reset();
  const double pump = pump_fig.rate, raw_sgd = raw_sgd_fig.rate,
               raw_pull = raw_pull_fig.rate;
  const double push = push_fig.rate, pull = pull_fig.rate;
  const double push_copy = push_copy_fig.rate, pull_copy = pull_copy_fig.rate;
  const double push_bytes = push_fig.bytes_per_item,
               pull_bytes = pull_fig.bytes_per_item;
  const double gb = 1e9;
  if (wants("push")) Emit("push_bytes_per_s", push / gb, "GB/s", pump / gb);
  if (wants("pull")) Emit("pull_bytes_per_s", pull / gb, "GB/s", pump / gb);
  if (wants("push_copy"))
    Emit("push_copy_bytes_per_s", push_copy / gb, "GB/s", pump / gb);
  if (wants("pull_copy"))
    Emit("pull_copy_bytes_per_s", pull_copy / gb, "GB/s", pump / gb);
  // The same figures against a toy server doing the same work (as the kv
  // bench's baseline applies Adagrad): checking and applying a push, and
  // answering a pull straight from its array.
  if (wants("push"))
    Emit("push_bytes_per_s_vs_toy", push / gb, "GB/s", raw_sgd / gb);
  if (wants("pull"))
    Emit("pull_bytes_per_s_vs_toy", pull / gb, "GB/s", raw_pull / gb);
  if (wants("push"))
    Emit("push_wire_bytes_per_value_byte", push_bytes, "bytes", 1.0);
  if (wants("pull"))
    Emit("pull_wire_bytes_per_value_byte", pull_bytes, "bytes", 1.0);
  std::fprintf(stderr,
               "# dense: %llu-byte tensors, window %d; raw socket pump %.3g "
               "GB/s, toy push "
               "(check + SGD) %.3g GB/s, toy pull %.3g GB/s\n",
               static_cast<unsigned long long>(bytes), window, pump / gb,
               raw_sgd / gb, raw_pull / gb);
  std::printf(
      "{\"bench\":\"dense\",\"summary\":{\"push_gb_per_s\":%.4g,\"push_ratio\":"
      "%.3f,"
      "\"pull_gb_per_s\":%.4g,\"pull_ratio\":%.3f,\"push_copy_ratio\":%.3f,"
      "\"pull_copy_ratio\":%.3f,\"pump_gb_per_s\":%.4g,\"push_vs_toy_ratio\":%."
      "3f,"
      "\"pull_vs_toy_ratio\":%.3f}}\n",
      push / gb, push / pump, pull / gb, pull / pump, push_copy / pump,
      pull_copy / pump, pump / gb, push / raw_sgd, pull / raw_pull);
  return 0;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // As every node's main() does (common/node_main.cc).
  ps::KeepLargeBuffers();
  (void)ps::SetLogLevel("warn");
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode == "kv") return ps::SparseBench() != 0 ? 1 : ps::StepBench();
  if (mode == "dense") return ps::DenseBench();
  if (mode == "step") return ps::StepBench();
  std::fprintf(stderr, "kv_bench: --mode must be kv, dense or step, not '%s'\n",
               mode.c_str());
  return 2;
}
