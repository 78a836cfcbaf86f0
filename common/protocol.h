// Constants of the data-plane protocol shared by workers, servers and the
// scheduler, in a header with no dependencies so every library can use it.
#ifndef PS_COMMON_PROTOCOL_H_
#define PS_COMMON_PROTOCOL_H_

#include <cstdint>

namespace ps {

// A worker that has finished training advances its clock to this value, so
// it never holds back synchronous waits; its later pulls (evaluation) are
// answered once every live worker has finished too. Clocks at or above it
// are not counted as steps taken.
inline constexpr uint64_t kFinishedClock = uint64_t{1} << 62;

// ClusterView.slot_backup of a slot without a backup (scheduler.proto). The
// scheduler writes it and servers read it, so both take it from here.
inline constexpr uint32_t kNoBackup = 0xFFFFFFFF;

}  // namespace ps

#endif  // PS_COMMON_PROTOCOL_H_
