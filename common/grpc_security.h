// Credentials of the gRPC control plane from the job's TlsConfig
// (proto/config.proto): mutual TLS when its three files are set, plaintext
// when none is.
//
// The files are read and checked here (PEM parses, the key matches the
// certificate, the CA bundle holds a certificate), so a bad file fails the
// process at start with a message naming the file instead of as an opaque
// handshake error later. Thread-safe: every function is pure apart from
// reading the named files and, for InstallGrpcLogging, a process-global
// hook.
#ifndef PS_COMMON_GRPC_SECURITY_H_
#define PS_COMMON_GRPC_SECURITY_H_

#include <memory>
#include <string>

#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "common/status.h"
#include "proto/config.pb.h"

namespace ps {

// True when any of the three files is named (validation then requires all).
bool TlsEnabled(const TlsConfig& tls);

// Checks the three files: all or none named, each readable, the key file not
// readable by others, the PEM contents valid and the key matching the
// certificate. OK for an all-empty config. Errors: INVALID_ARGUMENT naming
// the field and the file (e.g. "tls.key_file '/k.pem': no PEM private key").
absl::Status CheckTlsFiles(const TlsConfig& tls);

// Server side: plaintext for an empty config; otherwise TLS that requires a
// client certificate signed by `ca_cert_file` (the handshake refuses any
// other peer), with a processor that refuses, with UNAUTHENTICATED and a
// warning in the "security" log, any call that arrives without a verified
// peer. Errors: those of CheckTlsFiles.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsConfig& tls);

// Client side: plaintext for an empty config; otherwise TLS presenting
// `cert_file` and accepting only a server certificate signed by
// `ca_cert_file`. Errors: those of CheckTlsFiles.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsConfig& tls);

// Sends gRPC core's own log lines (handshake failures among them, e.g. a
// peer without a certificate) to the "grpc" spdlog logger. Idempotent;
// safe to call from any thread.
void InstallGrpcLogging();

}  // namespace ps

#endif  // PS_COMMON_GRPC_SECURITY_H_
