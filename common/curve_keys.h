// ZeroMQ CURVE keys of the data plane (JobConfig.security.curve): loading
// and checking the job's key pair, and setting up sockets with it.
//
// One key pair per job (proto/config.proto CurveConfig): servers serve with
// it; clients (workers, tools, servers replicating to a backup) present the
// same pair as their client key and expect its public key as the server's.
// The server's ZAP handler (server/peer_gate.h) admits only clients that
// present the job public key, so holding the job secret key is what admits
// a peer.
//
// Keys are kept as their 40-character Z85 text (what libzmq's socket
// options take). Every function is thread-safe; none throws.
#ifndef PS_COMMON_CURVE_KEYS_H_
#define PS_COMMON_CURVE_KEYS_H_

#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "common/status.h"
#include "proto/config.pb.h"
#include "zmq.hpp"

namespace ps {

// Length of a Z85-encoded CURVE key.
inline constexpr size_t kCurveKeyZ85Length = 40;

struct CurveKeys {
  std::string public_key;  // Z85, 40 characters
  std::string secret_key;  // Z85, 40 characters
};

// Whether the linked libzmq was built with CURVE (zmq_has("curve")).
bool CurveAvailable();

// Checks a Z85 key text: exactly 40 characters of the Z85 alphabet that
// decode to 32 bytes. `what` names the key in the error (INVALID_ARGUMENT).
absl::Status ValidateCurveKey(absl::string_view key, absl::string_view what);

// Reads a key file: the first line (surrounding white space ignored) must
// be a valid Z85 key. NOT_FOUND / PERMISSION_DENIED if it cannot be read,
// INVALID_ARGUMENT if it holds no valid key. Errors name the file.
absl::StatusOr<std::string> ReadCurveKeyFile(const std::string& path);

// The job key pair of `config`:
//   both files empty           -> std::nullopt (CURVE off, plaintext);
//   only one set               -> INVALID_ARGUMENT;
//   libzmq without CURVE       -> FAILED_PRECONDITION;
//   a file unreadable or bad   -> ReadCurveKeyFile's error;
//   secret and public key not a pair -> INVALID_ARGUMENT.
absl::StatusOr<std::optional<CurveKeys>> LoadCurveKeys(const CurveConfig& config);

// A fresh key pair (zmq_curve_keypair). FAILED_PRECONDITION without CURVE.
absl::StatusOr<CurveKeys> GenerateCurveKeys();

// Socket set-up, before bind/connect. `socket` is not owned.
// Server: ZMQ_CURVE_SERVER=1 with the job secret key. Client:
// ZMQ_CURVE_SERVERKEY = job public key, and the job pair as its own.
// INTERNAL if libzmq refuses an option.
absl::Status ApplyCurveServer(zmq::socket_t& socket, const CurveKeys& keys);
absl::Status ApplyCurveClient(zmq::socket_t& socket, const CurveKeys& keys);

}  // namespace ps

#endif  // PS_COMMON_CURVE_KEYS_H_
