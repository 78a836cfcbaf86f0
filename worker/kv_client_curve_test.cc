// CURVE on the data plane: a KVServer serving with the job key pair admits
// a KVClient holding it, and refuses (never answers) clients without CURVE,
// with another key pair, or expecting another server key, logging and
// counting each refusal while the legitimate client keeps working.
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/config.h"
#include "common/curve_keys.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "spdlog/sinks/ringbuffer_sink.h"
#include "worker/kv_client.h"

namespace ps {
namespace {

constexpr char kConfig[] = R"pb(
  cluster {
    num_servers: 1
    num_workers: 1
    num_slots: 8
    request_timeout_ms: 600
    failover_timeout_ms: 600
  }
  tables {
    id: 1
    name: "emb"
    sparse { dim: 2 }
    optimizer { sgd { learning_rate: 1 } }
    init { kind: CONSTANT value: 0.5 }
  }
)pb";

class CurveDataPlaneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(CurveAvailable());
    auto config = ParseJobConfig(kConfig, "test");
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
    auto keys = GenerateCurveKeys();
    ASSERT_TRUE(keys.ok()) << keys.status();
    job_keys_ = *keys;
    // Every refusal the server logs lands here too.
    log_ = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(64);
    GetLogger("peer_gate")->sinks().push_back(log_);

    KVServer::Options so;
    so.config = config_;
    so.standalone = true;
    so.curve = job_keys_;
    so.metrics = &registry_;
    auto server = KVServer::Start(so);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(server).value();

    view_.set_epoch(1);
    view_.set_job_state(RUNNING);
    for (int s = 0; s < 8; ++s) view_.add_slot_owner(0);
    NodeInfo* node = view_.add_nodes();
    node->set_role(SERVER);
    node->set_state(ALIVE);
    node->set_rank(0);
    node->set_node_id(1);
    node->set_data_endpoint(server_->endpoint());
  }

  void TearDown() override {
    server_.reset();
    auto& sinks = GetLogger("peer_gate")->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), log_), sinks.end());
  }

  std::unique_ptr<KVClient> Client(std::optional<CurveKeys> curve) {
    KVClient::Options co;
    co.config = config_;
    co.curve = std::move(curve);
    auto client = KVClient::Create(co, view_);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(client).value() : nullptr;
  }

  // Pulls keys {7, 9}; returns the status and the values.
  absl::Status PullBoth(KVClient& client, std::vector<float>* out) {
    const std::vector<uint64_t> keys = {7, 9};
    out->assign(4, 0);
    return client.Pull(1, keys, out->data()).Wait();
  }

  // Waits up to 5 s for the server to count `n` refusals.
  bool WaitForRefusals(uint64_t n) {
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (server_->stats().auth_refusals < n && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    return server_->stats().auth_refusals >= n;
  }

  std::string Logged() const {
    std::string all;
    for (const std::string& line : log_->last_formatted()) all += line;
    return all;
  }

  JobConfig config_;
  CurveKeys job_keys_;
  metrics::Registry registry_;
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> log_;
  std::unique_ptr<KVServer> server_;
  ClusterView view_;
};

TEST_F(CurveDataPlaneTest, JobKeyPairPushesAndPulls) {
  auto client = Client(job_keys_);
  ASSERT_NE(client, nullptr);
  const std::vector<uint64_t> keys = {7, 9};
  const std::vector<float> grads = {1, 2, 3, 4};
  ASSERT_TRUE(client->Push(1, keys, grads).Wait().ok());
  std::vector<float> out;
  ASSERT_TRUE(PullBoth(*client, &out).ok());
  EXPECT_EQ(out, (std::vector<float>{-0.5f, -1.5f, -2.5f, -3.5f}));
  EXPECT_EQ(server_->stats().auth_refusals, 0u);
}

TEST_F(CurveDataPlaneTest, ClientWithoutCurveGetsNoAnswerAndIsLogged) {
  auto good = Client(job_keys_);
  auto plain = Client(std::nullopt);
  ASSERT_NE(good, nullptr);
  ASSERT_NE(plain, nullptr);
  std::vector<float> out;
  // The client learns at the handshake: when it sees the server's
  // mechanism, pending requests fail with UNAUTHENTICATED ("mechanism
  // mismatch"); when the server hangs up first, a request that times out
  // says the handshakes fail. (Either may come after the first request's
  // 600 ms deadline on a busy machine, hence two tries.)
  auto says_why = [](const absl::Status& s) {
    return s.message().find("mechanism mismatch") != std::string::npos ||
           s.message().find("handshakes fail") != std::string::npos;
  };
  absl::Status s = PullBoth(*plain, &out);
  EXPECT_FALSE(s.ok());
  if (!says_why(s)) s = PullBoth(*plain, &out);
  EXPECT_TRUE(s.code() == absl::StatusCode::kUnauthenticated ||
              s.code() == absl::StatusCode::kDeadlineExceeded)
      << s;
  EXPECT_TRUE(says_why(s)) << s;
  EXPECT_EQ(server_->stats().requests, 0u);
  ASSERT_TRUE(WaitForRefusals(1));
  // The server logs the mismatch, or (when this client hung up first, on
  // seeing the server's mechanism) the failed handshake.
  EXPECT_TRUE(Logged().find("mechanism mismatch") != std::string::npos ||
              Logged().find("handshake failed") != std::string::npos)
      << Logged();
  EXPECT_NE(registry_.Expose().find(
                "ps_server_auth_refusals_total{reason=\"handshake\"}"),
            std::string::npos);
  // The job's client is not disturbed.
  ASSERT_TRUE(PullBoth(*good, &out).ok());
  EXPECT_EQ(out, (std::vector<float>(4, 0.5f)));
}

TEST_F(CurveDataPlaneTest, OtherKeyPairIsRefusedByZapAndLogged) {
  auto other = GenerateCurveKeys();
  ASSERT_TRUE(other.ok());
  // Knows the server's (job) public key, but presents its own pair: CURVE
  // alone would admit it; the ZAP handler must not.
  auto intruder = std::make_unique<zmq::context_t>(1);
  zmq::socket_t socket(*intruder, zmq::socket_type::dealer);
  socket.set(zmq::sockopt::linger, 0);
  socket.set(zmq::sockopt::curve_serverkey, job_keys_.public_key);
  socket.set(zmq::sockopt::curve_publickey, other->public_key);
  socket.set(zmq::sockopt::curve_secretkey, other->secret_key);
  socket.connect(server_->endpoint());
  // Admitted, this would be answered (with an error) and counted.
  socket.send(zmq::str_buffer("not a request"), zmq::send_flags::dontwait);
  ASSERT_TRUE(WaitForRefusals(1));
  zmq::pollitem_t item = {socket.handle(), 0, ZMQ_POLLIN, 0};
  EXPECT_EQ(zmq::poll(&item, 1, std::chrono::milliseconds(300)), 0);
  const std::string logged = Logged();
  EXPECT_NE(logged.find("127.0.0.1"), std::string::npos) << logged;
  EXPECT_NE(logged.find("mechanism CURVE"), std::string::npos) << logged;
  EXPECT_NE(logged.find(other->public_key), std::string::npos) << logged;
  EXPECT_NE(logged.find("is not the job key"), std::string::npos) << logged;
  EXPECT_NE(registry_.Expose().find(
                "ps_server_auth_refusals_total{reason=\"client_key\"}"),
            std::string::npos);

  // The job's client keeps working meanwhile.
  std::vector<float> out;
  auto good = Client(job_keys_);
  ASSERT_NE(good, nullptr);
  const std::vector<uint64_t> keys = {7, 9};
  const std::vector<float> grads = {1, 1, 1, 1};
  ASSERT_TRUE(good->Push(1, keys, grads).Wait().ok());
  ASSERT_TRUE(PullBoth(*good, &out).ok());
  EXPECT_EQ(out, (std::vector<float>(4, -0.5f)));
  EXPECT_EQ(server_->stats().requests, 2u);
  EXPECT_GE(server_->stats().auth_refusals, 1u);
  socket.close();
}

TEST_F(CurveDataPlaneTest, WrongServerKeyIsRefused) {
  auto other = GenerateCurveKeys();
  ASSERT_TRUE(other.ok());
  // Holds another job's pair and expects that job's server key: the server
  // cannot decrypt its HELLO.
  auto client = Client(*other);
  ASSERT_NE(client, nullptr);
  std::vector<float> out;
  const absl::Status s = PullBoth(*client, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("CURVE"), std::string::npos) << s;
  ASSERT_TRUE(WaitForRefusals(1));
  EXPECT_NE(Logged().find("refused a data-plane connection"), std::string::npos)
      << Logged();
  EXPECT_EQ(server_->stats().requests, 0u);
}

}  // namespace
}  // namespace ps
