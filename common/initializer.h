// Deterministic parameter initialisation: the initial value of element e of
// key k in table t depends only on (init config, t, k, e), so every run and
// every server (also after a row migrates) agree without coordination.
// A protocol-level contract, not a server detail: the servers' tables, the
// offline predictor (worker/predict.cc) and the Python binding all compute
// the values of rows nobody has trained from it, and must agree.
//
// Thread safety: a pure function; safe from any thread.
#ifndef PS_COMMON_INITIALIZER_H_
#define PS_COMMON_INITIALIZER_H_

#include <cstddef>
#include <cstdint>

#include "proto/config.pb.h"

namespace ps {

// Writes n initial values for elements first_element.. of key `key` to
// out[0..n). Dense tables pass key 0 and the element's index, so a dense
// value does not depend on the block size. Unknown kinds write zeros.
void InitializeValues(const InitializerConfig& init, uint32_t table_id,
                      uint64_t key, uint64_t first_element, size_t n,
                      float* out);

}  // namespace ps

#endif  // PS_COMMON_INITIALIZER_H_
