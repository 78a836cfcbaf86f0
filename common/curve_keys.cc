#include "common/curve_keys.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace ps {
namespace {

constexpr absl::string_view kZ85Alphabet =
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

}  // namespace

bool CurveAvailable() { return zmq_has("curve") != 0; }

absl::Status ValidateCurveKey(absl::string_view key, absl::string_view what) {
  if (key.size() != kCurveKeyZ85Length) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is ", key.size(), " characters long; a Z85 CURVE key has ",
                     kCurveKeyZ85Length));
  }
  for (size_t i = 0; i < key.size(); ++i) {
    if (kZ85Alphabet.find(key[i]) == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " has a character outside the Z85 alphabet at position ", i + 1));
    }
  }
  const std::string text(key);
  uint8_t bytes[32];
  if (zmq_z85_decode(bytes, text.c_str()) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not valid Z85"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadCurveKeyFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    const int err = errno;
    const std::string why = absl::StrCat("cannot read CURVE key file ", path, ": ",
                                         std::strerror(err));
    return err == EACCES ? absl::PermissionDeniedError(why) : absl::NotFoundError(why);
  }
  std::string line;
  std::getline(in, line);
  const absl::string_view key = absl::StripAsciiWhitespace(line);
  absl::Status s = ValidateCurveKey(key, absl::StrCat("the key in ", path));
  if (!s.ok()) return s;
  return std::string(key);
}

absl::StatusOr<std::optional<CurveKeys>> LoadCurveKeys(const CurveConfig& config) {
  const bool has_public = !config.public_key_file().empty();
  const bool has_secret = !config.secret_key_file().empty();
  if (!has_public && !has_secret) return std::optional<CurveKeys>();
  if (has_public != has_secret) {
    return absl::InvalidArgumentError(
        "security.curve needs both public_key_file and secret_key_file (or neither)");
  }
  if (!CurveAvailable()) {
    return absl::FailedPreconditionError(
        "security.curve is set but this libzmq was built without CURVE "
        "(zmq_has(\"curve\") is false); install a libzmq with libsodium or turn "
        "curve off");
  }
  CurveKeys keys;
  absl::StatusOr<std::string> pub = ReadCurveKeyFile(config.public_key_file());
  if (!pub.ok()) return pub.status();
  absl::StatusOr<std::string> sec = ReadCurveKeyFile(config.secret_key_file());
  if (!sec.ok()) return sec.status();
  char derived[kCurveKeyZ85Length + 1];
  if (zmq_curve_public(derived, sec->c_str()) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot derive a public key from the secret key in ", config.secret_key_file()));
  }
  if (*pub != derived) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the CURVE keys in ", config.public_key_file(), " and ", config.secret_key_file(),
        " are not a pair (the secret key's public key differs)"));
  }
  keys.public_key = *std::move(pub);
  keys.secret_key = *std::move(sec);
  return std::optional<CurveKeys>(std::move(keys));
}

absl::StatusOr<CurveKeys> GenerateCurveKeys() {
  char pub[kCurveKeyZ85Length + 1];
  char sec[kCurveKeyZ85Length + 1];
  if (!CurveAvailable() || zmq_curve_keypair(pub, sec) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("zmq_curve_keypair failed: ", zmq_strerror(zmq_errno())));
  }
  return CurveKeys{pub, sec};
}

absl::Status ApplyCurveServer(zmq::socket_t& socket, const CurveKeys& keys) {
  try {
    socket.set(zmq::sockopt::curve_server, 1);
    socket.set(zmq::sockopt::curve_secretkey, keys.secret_key);
  } catch (const zmq::error_t& e) {
    return absl::InternalError(absl::StrCat("cannot set CURVE server options: ", e.what()));
  }
  return absl::OkStatus();
}

absl::Status ApplyCurveClient(zmq::socket_t& socket, const CurveKeys& keys) {
  try {
    socket.set(zmq::sockopt::curve_serverkey, keys.public_key);
    socket.set(zmq::sockopt::curve_publickey, keys.public_key);
    socket.set(zmq::sockopt::curve_secretkey, keys.secret_key);
  } catch (const zmq::error_t& e) {
    return absl::InternalError(absl::StrCat("cannot set CURVE client options: ", e.what()));
  }
  return absl::OkStatus();
}

}  // namespace ps
