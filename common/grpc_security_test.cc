#include "common/grpc_security.h"

#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "proto/config.pb.h"

namespace ps {
namespace {

using ::testing::HasSubstr;

std::string TmpDir() { return std::getenv("TEST_TMPDIR"); }

// Makes a job's keys with the real script into TEST_TMPDIR/name.
TlsConfig MakeKeys(const std::string& name) {
  const std::string dir = absl::StrCat(TmpDir(), "/", name);
  const std::string script = absl::StrCat(std::getenv("TEST_SRCDIR"), "/",
                                          std::getenv("TEST_WORKSPACE"),
                                          "/deploy/security/make_job_keys");
  const std::string cmd =
      absl::StrCat(script, " --tls_only ", dir, " >/dev/null");
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  TlsConfig tls;
  tls.set_ca_cert_file(dir + "/ca.pem");
  tls.set_cert_file(dir + "/job.pem");
  tls.set_key_file(dir + "/job.key");
  return tls;
}

void WriteFile(const std::string& path, const std::string& text, mode_t mode) {
  std::ofstream(path) << text;
  chmod(path.c_str(), mode);
}

class GrpcSecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    job_ = new TlsConfig(MakeKeys("job"));
    other_ = new TlsConfig(MakeKeys("other"));
  }
  static TlsConfig* job_;
  static TlsConfig* other_;
};
TlsConfig* GrpcSecurityTest::job_ = nullptr;
TlsConfig* GrpcSecurityTest::other_ = nullptr;

TEST_F(GrpcSecurityTest, EmptyConfigIsPlaintext) {
  TlsConfig none;
  EXPECT_FALSE(TlsEnabled(none));
  EXPECT_TRUE(CheckTlsFiles(none).ok());
  EXPECT_TRUE(MakeServerCredentials(none).ok());
  EXPECT_TRUE(MakeChannelCredentials(none).ok());
}

TEST_F(GrpcSecurityTest, GoodFilesPass) {
  EXPECT_TRUE(TlsEnabled(*job_));
  EXPECT_TRUE(CheckTlsFiles(*job_).ok()) << CheckTlsFiles(*job_);
}

TEST_F(GrpcSecurityTest, AllOrNothing) {
  TlsConfig tls = *job_;
  tls.clear_key_file();
  absl::Status s = CheckTlsFiles(tls);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("all required"));
  EXPECT_FALSE(MakeChannelCredentials(tls).ok());
  EXPECT_FALSE(MakeServerCredentials(tls).ok());
}

TEST_F(GrpcSecurityTest, MissingFileIsNamed) {
  TlsConfig tls = *job_;
  tls.set_cert_file(TmpDir() + "/no-such.pem");
  absl::Status s = MakeServerCredentials(tls).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("tls.cert_file"));
  EXPECT_THAT(s.message(), HasSubstr("no-such.pem"));
  EXPECT_THAT(s.message(), HasSubstr("cannot be read"));
}

TEST_F(GrpcSecurityTest, BadPemIsRefused) {
  TlsConfig tls = *job_;
  const std::string bad = TmpDir() + "/bad.pem";
  WriteFile(bad, "-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n",
            0600);
  tls.set_ca_cert_file(bad);
  absl::Status s = MakeChannelCredentials(tls).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("tls.ca_cert_file"));
  EXPECT_THAT(s.message(), HasSubstr("no PEM certificate"));

  tls = *job_;
  const std::string bad_key = TmpDir() + "/bad.key";
  WriteFile(bad_key, "hello\n", 0600);
  tls.set_key_file(bad_key);
  s = MakeChannelCredentials(tls).status();
  EXPECT_THAT(s.message(), HasSubstr("tls.key_file"));
  EXPECT_THAT(s.message(), HasSubstr("no unencrypted PEM private key"));
}

TEST_F(GrpcSecurityTest, KeyOfAnotherCertificateIsRefused) {
  TlsConfig tls = *job_;
  tls.set_key_file(other_->key_file());
  absl::Status s = CheckTlsFiles(tls);
  EXPECT_THAT(s.message(), HasSubstr("is not the key of cert_file"));
}

TEST_F(GrpcSecurityTest, WorldReadableKeyIsRefused) {
  const std::string key = TmpDir() + "/open.key";
  std::ifstream in(job_->key_file());
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  WriteFile(key, text, 0644);
  TlsConfig tls = *job_;
  tls.set_key_file(key);
  absl::Status s = CheckTlsFiles(tls);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("readable by every user"));
  chmod(key.c_str(), 0640);
  EXPECT_TRUE(CheckTlsFiles(tls).ok()) << CheckTlsFiles(tls);
}

// A real TLS server: a client of the same job connects; one without a
// certificate, one from another CA, and a plaintext one do not.
TEST_F(GrpcSecurityTest, HandshakeAdmitsOnlyTheJobsPeers) {
  auto server_creds = MakeServerCredentials(*job_);
  ASSERT_TRUE(server_creds.ok()) << server_creds.status();
  grpc::ServerBuilder builder;
  grpc::CallbackGenericService service;  // answers UNIMPLEMENTED
  builder.RegisterCallbackGenericService(&service);
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", *server_creds, &port);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ASSERT_NE(port, 0);
  const std::string address = absl::StrCat("127.0.0.1:", port);

  auto connects = [&](std::shared_ptr<grpc::ChannelCredentials> creds) {
    auto channel = grpc::CreateChannel(address, creds);
    return channel->WaitForConnected(std::chrono::system_clock::now() +
                                     std::chrono::seconds(3));
  };
  EXPECT_TRUE(connects(*MakeChannelCredentials(*job_)));
  EXPECT_FALSE(connects(*MakeChannelCredentials(*other_)));
  EXPECT_FALSE(connects(grpc::InsecureChannelCredentials()));
  grpc::SslCredentialsOptions no_cert;  // trusts the CA, presents nothing
  std::ifstream in(job_->ca_cert_file());
  no_cert.pem_root_certs.assign(std::istreambuf_iterator<char>(in),
                                std::istreambuf_iterator<char>());
  EXPECT_FALSE(connects(grpc::SslCredentials(no_cert)));
  server->Shutdown();
}

}  // namespace
}  // namespace ps
