// The scheduler with control-plane TLS (security.tls): nodes of the job
// register; a node without the job's certificate, or with one of another
// CA, is refused and its error says why.
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/config.pb.h"
#include "scheduler/client.h"
#include "scheduler/scheduler.h"

namespace ps {
namespace {

using ::testing::HasSubstr;

TlsConfig MakeKeys(const std::string& name) {
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  const std::string cmd = absl::StrCat(
      std::getenv("TEST_SRCDIR"), "/", std::getenv("TEST_WORKSPACE"),
      "/deploy/security/make_job_keys --tls_only ", dir, " >/dev/null");
  // Made once per test binary (the script never overwrites keys).
  if (access((dir + "/ca.pem").c_str(), F_OK) != 0) {
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  TlsConfig tls;
  tls.set_ca_cert_file(dir + "/ca.pem");
  tls.set_cert_file(dir + "/job.pem");
  tls.set_key_file(dir + "/job.key");
  return tls;
}

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_.mutable_cluster()->set_num_servers(1);
    config_.mutable_cluster()->set_num_workers(1);
    config_.mutable_cluster()->set_num_slots(16);
    config_.mutable_cluster()->set_heartbeat_interval_ms(100);
    config_.mutable_cluster()->set_heartbeat_timeout_ms(5000);
    *config_.mutable_security()->mutable_tls() = MakeKeys("job");
    SchedulerServer::Options options;
    options.config = config_;
    auto scheduler = SchedulerServer::Start(options);
    ASSERT_TRUE(scheduler.ok()) << scheduler.status();
    scheduler_ = *std::move(scheduler);
  }

  SchedulerClient::Options Client(const TlsConfig& tls) {
    SchedulerClient::Options o =
        SchedulerClient::Options::ForJob(config_, scheduler_->address(), SERVER);
    o.data_endpoint = "tcp://127.0.0.1:1";
    o.tls = tls;
    o.connect_timeout = absl::Seconds(2);
    o.rpc_timeout = absl::Seconds(1);
    return o;
  }

  JobConfig config_;
  std::unique_ptr<SchedulerServer> scheduler_;
};

TEST_F(TlsTest, JobNodeRegisters) {
  SchedulerClient::Options o =
      SchedulerClient::Options::ForJob(config_, scheduler_->address(), SERVER);
  EXPECT_EQ(o.tls.cert_file(), config_.security().tls().cert_file());
  o.data_endpoint = "tcp://127.0.0.1:1";
  auto client = SchedulerClient::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
}

TEST_F(TlsTest, PlaintextNodeIsRefusedWithAReason) {
  auto client = SchedulerClient::Connect(Client(TlsConfig()));
  ASSERT_FALSE(client.ok());
  EXPECT_THAT(client.status().message(), HasSubstr("the channel's last error"));
  EXPECT_THAT(client.status().message(), HasSubstr("if the job uses TLS"));
}

TEST_F(TlsTest, OtherCaNodeIsRefusedWithAReason) {
  auto client = SchedulerClient::Connect(Client(MakeKeys("other")));
  ASSERT_FALSE(client.ok());
  EXPECT_THAT(client.status().message(), HasSubstr("certificate verify failed"));
  EXPECT_THAT(client.status().message(), HasSubstr("same job CA"));
}

TEST_F(TlsTest, UnusableFilesFailAtConnect) {
  TlsConfig tls = config_.security().tls();
  tls.set_key_file("/nonexistent/job.key");
  auto client = SchedulerClient::Connect(Client(tls));
  ASSERT_FALSE(client.ok());
  EXPECT_THAT(client.status().message(), HasSubstr("tls.key_file '/nonexistent/job.key'"));
}

}  // namespace
}  // namespace ps
