// Finiteness checks over float arrays: what every pushed or loaded value
// must pass (a NaN or infinity in a parameter spreads to every later step).
// Dependency-free so that the wire, the tables and the checkpoint reader
// share one implementation, vectorised by hand (see AllFinite).
#ifndef PS_COMMON_FINITE_H_
#define PS_COMMON_FINITE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "absl/types/span.h"

namespace ps {

#if defined(__SSE2__)
namespace finite_internal {
// The lanes of `v` whose exponent bits are all ones (NaN or infinity).
inline __m128i NonFinite(__m128i v) {
  const __m128i exponent = _mm_set1_epi32(0x7f800000);
  return _mm_cmpeq_epi32(_mm_and_si128(v, exponent), exponent);
}
// Whether any of the 16 floats from `src` is NaN or infinite, copying them
// to `dst` when kCopy. Runs of these are ORed into four independent
// accumulators (the callers' loops): with one or two the loop was bound by
// its dependency chain, about 30 GB/s on the 2-vCPU EPYC of
// docs/PERFORMANCE.md, where four reach about 55 GB/s from L2/L3. Written
// out lane by lane: with an array of accumulators GCC -O2 kept them on the
// stack again.
template <bool kCopy>
inline void NonFinite16(const float* src, float* dst, __m128i& a0, __m128i& a1, __m128i& a2,
                        __m128i& a3) {
  const __m128i v0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
  const __m128i v1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 4));
  const __m128i v2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 8));
  const __m128i v3 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 12));
  if (kCopy) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), v0);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 4), v1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 8), v2);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 12), v3);
  }
  a0 = _mm_or_si128(a0, NonFinite(v0));
  a1 = _mm_or_si128(a1, NonFinite(v1));
  a2 = _mm_or_si128(a2, NonFinite(v2));
  a3 = _mm_or_si128(a3, NonFinite(v3));
}
inline uint32_t AnySet(__m128i a0, __m128i a1, __m128i a2, __m128i a3) {
  return static_cast<uint32_t>(
      _mm_movemask_epi8(_mm_or_si128(_mm_or_si128(a0, a1), _mm_or_si128(a2, a3))));
}
}  // namespace finite_internal
#endif

// True when no value is NaN or infinite: what pushed values must be. A
// float is not finite exactly when its exponent bits are all ones. The test
// is an OR over SIMD lanes with no branch: a 4 MB dense push is checked on
// both sides of the wire, and the server's check sits on its one serving
// thread, so it must run at memory speed. Written with SSE2 intrinsics
// (every x86-64 CPU has them) because GCC at -O2 kept a portable
// eight-lane version's accumulators on the stack, a store-to-load
// dependency per iteration that made the server's check cost as much as the
// SGD apply it guards (perf, kv_bench --mode=dense).
inline bool AllFinite(absl::Span<const float> values) {
  constexpr uint32_t kExponent = 0x7f800000u;
  const float* data = values.data();
  const size_t n = values.size();
  size_t i = 0;
  uint32_t bad = 0;
#if defined(__SSE2__)
  __m128i a0 = _mm_setzero_si128(), a1 = a0, a2 = a0, a3 = a0;
  for (; i + 16 <= n; i += 16) {
    finite_internal::NonFinite16<false>(data + i, nullptr, a0, a1, a2, a3);
  }
  bad = finite_internal::AnySet(a0, a1, a2, a3);
#endif
  for (; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, data + i, sizeof(bits));
    bad |= (bits & kExponent) == kExponent ? 1u : 0u;
  }
  return bad == 0;
}

// Copies n floats from `src` to `dst` and returns whether all were finite
// (AllFinite in the same pass): a sender checks a large tensor while it
// copies it into a frame. The ranges must not overlap.
inline bool CopyFinite(const float* src, size_t n, float* dst) {
  constexpr uint32_t kExponent = 0x7f800000u;
  size_t i = 0;
  uint32_t bad = 0;
#if defined(__SSE2__)
  __m128i a0 = _mm_setzero_si128(), a1 = a0, a2 = a0, a3 = a0;
  for (; i + 16 <= n; i += 16) finite_internal::NonFinite16<true>(src + i, dst + i, a0, a1, a2, a3);
  bad = finite_internal::AnySet(a0, a1, a2, a3);
#endif
  for (; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, src + i, sizeof(bits));
    std::memcpy(dst + i, &bits, sizeof(bits));
    bad |= (bits & kExponent) == kExponent ? 1u : 0u;
  }
  return bad == 0;
}

}  // namespace ps

#endif  // PS_COMMON_FINITE_H_
