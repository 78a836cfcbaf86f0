// Damage done to a disk tier's files on purpose, to show that a tier whose
// files were corrupted behind its back is detected, never read.
#ifndef PS_SERVER_TESTING_TIER_DAMAGE_H_
#define PS_SERVER_TESTING_TIER_DAMAGE_H_

#include <string>

namespace ps::testing {

// Overwrites 32 bytes every 4 KiB (from byte 64) of every RocksDB table
// file (*.sst) under `dir`, recursively, in place. Returns how many files
// it damaged; 0 when there were none (the caller's rows were all still in
// memtables). A compaction running meanwhile may have read a file before
// the damage and replace it with a whole one: callers damage again until
// a read fails.
int CorruptTierFiles(const std::string& dir);

}  // namespace ps::testing

#endif  // PS_SERVER_TESTING_TIER_DAMAGE_H_
