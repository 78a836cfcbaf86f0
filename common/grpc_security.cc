#include "common/grpc_security.h"

#include <sys/stat.h>

#include <fstream>
#include <mutex>
#include <sstream>
#include <utility>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "grpc/grpc_security_constants.h"
#include "grpc/support/log.h"
#include "grpcpp/security/auth_context.h"
#include "grpcpp/security/auth_metadata_processor.h"

namespace ps {
namespace {

std::shared_ptr<spdlog::logger> Log() {
  static auto* const logger = new std::shared_ptr<spdlog::logger>(GetLogger("security"));
  return *logger;
}

absl::Status FileError(absl::string_view field, const std::string& path,
                       absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("tls.", field, " '", path, "': ", what));
}

absl::StatusOr<std::string> ReadFile(absl::string_view field,
                                     const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return FileError(field, path, "cannot be read (missing or no permission)");
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return FileError(field, path, "read error");
  return buffer.str();
}

// The most recent OpenSSL error as text, clearing the queue.
std::string OpenSslError() {
  std::string text;
  unsigned long code;  // NOLINT(runtime/int): OpenSSL's type
  while ((code = ERR_get_error()) != 0) {
    char buf[256];
    ERR_error_string_n(code, buf, sizeof(buf));
    text = buf;
  }
  return text.empty() ? "not valid PEM" : text;
}

struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};

std::unique_ptr<BIO, BioDeleter> MemBio(const std::string& pem) {
  return std::unique_ptr<BIO, BioDeleter>(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The PEM texts of the three files, checked.
struct TlsFiles {
  std::string ca;
  std::string cert;
  std::string key;
};

absl::StatusOr<TlsFiles> ReadTlsFiles(const TlsConfig& tls) {
  PS_RETURN_IF_ERROR(CheckTlsFiles(tls));
  TlsFiles files;
  PS_ASSIGN_OR_RETURN(files.ca, ReadFile("ca_cert_file", tls.ca_cert_file()));
  PS_ASSIGN_OR_RETURN(files.cert, ReadFile("cert_file", tls.cert_file()));
  PS_ASSIGN_OR_RETURN(files.key, ReadFile("key_file", tls.key_file()));
  return files;
}

// Refuses calls that arrive without a verified client certificate. With
// GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY the handshake
// already refuses such peers; this is the check in our own code (and log)
// that holds even if the transport were configured more loosely.
class RequireVerifiedPeer : public grpc::AuthMetadataProcessor {
 public:
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata&, grpc::AuthContext* context,
                       OutputMetadata*, OutputMetadata*) override {
    if (context != nullptr && context->IsPeerAuthenticated()) {
      return grpc::Status::OK;
    }
    Log()->warn("refused unauthenticated peer: a call without a verified client "
                "certificate");
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "a client certificate signed by the job CA is required");
  }
};

spdlog::level::level_enum ToSpdlogLevel(gpr_log_severity severity) {
  switch (severity) {
    case GPR_LOG_SEVERITY_DEBUG:
      return spdlog::level::debug;
    case GPR_LOG_SEVERITY_INFO:
      return spdlog::level::info;
    case GPR_LOG_SEVERITY_ERROR:
      break;
  }
  return spdlog::level::err;
}

void ForwardGrpcLog(gpr_log_func_args* args) {
  // gRPC core reports every failed TLS handshake (no certificate, another
  // CA, plaintext) with this message on the refusing side.
  if (args->severity == GPR_LOG_SEVERITY_ERROR &&
      absl::StrContains(args->message, "Handshake failed")) {
    Log()->warn("TLS handshake failed, peer refused: {}", args->message);
    return;
  }
  static auto* const logger = new std::shared_ptr<spdlog::logger>(GetLogger("grpc"));
  (*logger)->log(ToSpdlogLevel(args->severity), "{}:{}: {}", args->file,
                 args->line, args->message);
}

}  // namespace

bool TlsEnabled(const TlsConfig& tls) {
  return !tls.ca_cert_file().empty() || !tls.cert_file().empty() ||
         !tls.key_file().empty();
}

absl::Status CheckTlsFiles(const TlsConfig& tls) {
  if (!TlsEnabled(tls)) return absl::OkStatus();
  if (tls.ca_cert_file().empty() || tls.cert_file().empty() ||
      tls.key_file().empty()) {
    return absl::InvalidArgumentError(
        "tls: ca_cert_file, cert_file and key_file are all required (or none, "
        "for plaintext)");
  }
  struct stat st;
  if (stat(tls.key_file().c_str(), &st) == 0 && (st.st_mode & S_IROTH) != 0) {
    return FileError("key_file", tls.key_file(),
                     "is readable by every user; run chmod o-rwx (0600 or 0400)");
  }
  PS_ASSIGN_OR_RETURN(std::string ca, ReadFile("ca_cert_file", tls.ca_cert_file()));
  PS_ASSIGN_OR_RETURN(std::string cert, ReadFile("cert_file", tls.cert_file()));
  PS_ASSIGN_OR_RETURN(std::string key, ReadFile("key_file", tls.key_file()));

  ERR_clear_error();
  std::unique_ptr<X509, X509Deleter> ca_x509(
      PEM_read_bio_X509(MemBio(ca).get(), nullptr, nullptr, nullptr));
  if (ca_x509 == nullptr) {
    return FileError("ca_cert_file", tls.ca_cert_file(),
                     absl::StrCat("no PEM certificate (", OpenSslError(), ")"));
  }
  std::unique_ptr<X509, X509Deleter> cert_x509(
      PEM_read_bio_X509(MemBio(cert).get(), nullptr, nullptr, nullptr));
  if (cert_x509 == nullptr) {
    return FileError("cert_file", tls.cert_file(),
                     absl::StrCat("no PEM certificate (", OpenSslError(), ")"));
  }
  // An empty passphrase callback result: an encrypted key fails here
  // instead of prompting on a terminal.
  std::unique_ptr<EVP_PKEY, PkeyDeleter> pkey(PEM_read_bio_PrivateKey(
      MemBio(key).get(), nullptr,
      [](char*, int, int, void*) { return 0; }, nullptr));
  if (pkey == nullptr) {
    return FileError("key_file", tls.key_file(),
                     absl::StrCat("no unencrypted PEM private key (", OpenSslError(),
                                  ")"));
  }
  if (X509_check_private_key(cert_x509.get(), pkey.get()) != 1) {
    ERR_clear_error();
    return FileError("key_file", tls.key_file(),
                     absl::StrCat("is not the key of cert_file '", tls.cert_file(),
                                  "'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsConfig& tls) {
  if (!TlsEnabled(tls)) return grpc::InsecureServerCredentials();
  PS_ASSIGN_OR_RETURN(TlsFiles files, ReadTlsFiles(tls));
  grpc::SslServerCredentialsOptions options(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = std::move(files.ca);
  options.pem_key_cert_pairs.push_back({std::move(files.key), std::move(files.cert)});
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::SslServerCredentials(options);
  if (creds == nullptr) {
    return absl::InternalError("gRPC refused the TLS server credentials");
  }
  creds->SetAuthMetadataProcessor(std::make_shared<RequireVerifiedPeer>());
  return creds;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsConfig& tls) {
  if (!TlsEnabled(tls)) return grpc::InsecureChannelCredentials();
  PS_ASSIGN_OR_RETURN(TlsFiles files, ReadTlsFiles(tls));
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = std::move(files.ca);
  options.pem_private_key = std::move(files.key);
  options.pem_cert_chain = std::move(files.cert);
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::SslCredentials(options);
  if (creds == nullptr) {
    return absl::InternalError("gRPC refused the TLS channel credentials");
  }
  return creds;
}

void InstallGrpcLogging() {
  static std::once_flag once;
  std::call_once(once, [] { gpr_set_log_function(&ForwardGrpcLog); });
}

}  // namespace ps
