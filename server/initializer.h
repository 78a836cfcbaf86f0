// Deterministic parameter initialisation: the initial value of element e of
// key k in table t depends only on (init config, t, k, e), so every run and
// every server (also after a row migrates) agree without coordination.
#ifndef PS_SERVER_INITIALIZER_H_
#define PS_SERVER_INITIALIZER_H_

#include <cstddef>
#include <cstdint>

#include "proto/config.pb.h"

namespace ps {

// Writes n initial values for elements first_element.. of key `key`.
void InitializeValues(const InitializerConfig& init, uint32_t table_id,
                      uint64_t key, uint64_t first_element, size_t n,
                      float* out);

}  // namespace ps

#endif  // PS_SERVER_INITIALIZER_H_
