// How a server's absl::Status goes on the wire: ResponseHeader.code is the
// absl::StatusCode number (0 = OK) and ResponseHeader.message its message,
// which clients turn back into the same absl::Status. The one place the
// server maps a Status to a response. Internal to //server:server.
#ifndef PS_SERVER_RESPONSE_CODE_H_
#define PS_SERVER_RESPONSE_CODE_H_

#include <cstdint>
#include <string>

#include "common/status.h"
#include "proto/data_plane.pb.h"

namespace ps {

// ResponseHeader.code of `status`.
inline int32_t ToResponseCode(const absl::Status& status) {
  return static_cast<int32_t>(status.code());
}

// Sets rh's code and message from `status` (OK clears the message).
inline void SetResponseStatus(const absl::Status& status, ResponseHeader* rh) {
  rh->set_code(ToResponseCode(status));
  rh->set_message(std::string(status.message()));
}

}  // namespace ps

#endif  // PS_SERVER_RESPONSE_CODE_H_
