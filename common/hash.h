// Hashing used for key routing and deterministic initialisation. These
// functions define where keys live, so they must never change between
// versions that share a checkpoint or a running job.
#ifndef PS_COMMON_HASH_H_
#define PS_COMMON_HASH_H_

#include <cstdint>

namespace ps {

// SplitMix64 finaliser: a fast bijective mix of 64 bits.
inline uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

inline uint64_t HashCombine(uint64_t a, uint64_t b) {
  return Mix64(a ^ Mix64(b));
}

// Maps a uniform 64-bit hash onto [0, n) by multiplying and keeping the
// high word: unbiased enough for slots, and a multiply instead of a 64-bit
// division, which costs more than the hashing on a per-key path (clients
// route every key, servers check every key's owner).
inline uint32_t HashToRange(uint64_t h, uint32_t n) {
  return static_cast<uint32_t>((static_cast<unsigned __int128>(h) * n) >> 64);
}

// Slot of a sparse key. Mixing in the table id spreads tables that share
// keys over different servers. One Mix64 per key: the table's salt is
// loop-invariant wherever keys are routed in bulk.
inline uint32_t SparseSlot(uint32_t table_id, uint64_t key, uint32_t num_slots) {
  return HashToRange(Mix64(key ^ Mix64(table_id)), num_slots);
}

// Slot of block `block` of a dense table.
inline uint32_t DenseBlockSlot(uint32_t table_id, uint64_t block,
                               uint32_t num_slots) {
  return HashToRange(Mix64(block ^ Mix64(0x8000000000000000ULL | table_id)), num_slots);
}

// Uniform double in [0, 1) from a 64-bit hash.
inline double HashToUnit(uint64_t h) {
  return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0);
}

}  // namespace ps

#endif  // PS_COMMON_HASH_H_
