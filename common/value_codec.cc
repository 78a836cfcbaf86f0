#include "common/value_codec.h"

#include <cpuid.h>
#include <immintrin.h>

#include <cmath>
#include <cstring>

namespace ps {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

constexpr float kHalfMax = 65504.0f;

// F16C path: 8 values per instruction. The caller saturates first, so the
// hardware conversion never produces an infinity from a finite value.
__attribute__((target("avx,f16c"))) void EncodeHalfF16c(const float* in, size_t n,
                                                      uint16_t* out) {
  size_t i = 0;
  const __m256 hi = _mm256_set1_ps(kHalfMax);
  const __m256 lo = _mm256_set1_ps(-kHalfMax);
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(in + i);
    // Clamped first, so values beyond the half range saturate instead of
    // becoming infinities. Values are finite here (checked before they are
    // encoded).
    v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) out[i] = FloatToHalf(in[i]);
}

__attribute__((target("avx,f16c"))) void DecodeHalfF16c(const uint16_t* in, size_t n,
                                                      float* out) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) out[i] = HalfToFloat(in[i]);
}

bool HasF16c() {
#if defined(__clang__)
  // Clang (the fuzzing build) does not know the "f16c" feature name: read
  // the CPUID bit instead ("avx" also checks that the OS saves YMM state).
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __builtin_cpu_supports("avx") && __get_cpuid(1, &a, &b, &c, &d) &&
           (c & bit_F16C) != 0;
  }();
#else
  static const bool has = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
#endif
  return has;
}

}  // namespace

uint16_t FloatToHalf(float f) {
  if (std::isnan(f)) return 0x7e00;
  if (f > kHalfMax) f = kHalfMax;
  if (f < -kHalfMax) f = -kHalfMax;
  const uint32_t x = Bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t abs = x & 0x7fffffff;
  if (abs < 0x33000000) return sign;  // below half the smallest subnormal: 0
  const int exp = static_cast<int>(abs >> 23) - 127;
  uint32_t mant = (abs & 0x7fffff) | 0x800000;  // with the implicit bit
  if (exp < -14) {
    // Subnormal half: shift the 24-bit significand into 10 bits at 2^-24.
    const int shift = -exp - 14 + 13;
    const uint32_t kept = mant >> shift;
    const uint32_t rest = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    uint32_t r = kept + (rest > half || (rest == half && (kept & 1)));
    return static_cast<uint16_t>(sign | r);
  }
  // Normal: 10 fraction bits, round to nearest even; a carry moves into the
  // exponent, which is what rounding up to the next binade means.
  uint32_t h = (static_cast<uint32_t>(exp + 15) << 10) | ((mant >> 13) & 0x3ff);
  const uint32_t rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t frac = h & 0x3ff;
  if (exp == 0x1f) return FromBits(sign | 0x7f800000 | (frac << 13));
  if (exp == 0) {
    // Zero or subnormal: frac * 2^-24, exact in float.
    const float v = static_cast<float>(frac) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  return FromBits(sign | ((exp + 112) << 23) | (frac << 13));
}

uint16_t FloatToBfloat16(float f) {
  const uint32_t x = Bits(f);
  if ((x & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((x >> 16) | 0x40);
  const uint32_t rounded = x + 0x7fff + ((x >> 16) & 1);
  uint16_t b = static_cast<uint16_t>(rounded >> 16);
  // A finite value that rounded to infinity saturates at the largest
  // finite bfloat16 instead.
  if ((x & 0x7f800000) != 0x7f800000 && (b & 0x7f80) == 0x7f80) {
    b = static_cast<uint16_t>((b & 0x8000) | 0x7f7f);
  }
  return b;
}

float Bfloat16ToFloat(uint16_t b) { return FromBits(static_cast<uint32_t>(b) << 16); }

void EncodeValues(ValueEncoding encoding, const float* in, size_t n, void* out) {
  switch (encoding) {
    case FLOAT16: {
      auto* o = static_cast<uint16_t*>(out);
      if (HasF16c()) {
        EncodeHalfF16c(in, n, o);
      } else {
        for (size_t i = 0; i < n; ++i) o[i] = FloatToHalf(in[i]);
      }
      return;
    }
    case BFLOAT16: {
      auto* o = static_cast<uint16_t*>(out);
      for (size_t i = 0; i < n; ++i) o[i] = FloatToBfloat16(in[i]);
      return;
    }
    default:
      std::memcpy(out, in, n * sizeof(float));
      return;
  }
}

void DecodeValues(ValueEncoding encoding, const void* in, size_t n, float* out) {
  switch (encoding) {
    case FLOAT16: {
      // The frame may sit at an odd address; halves are read with memcpy
      // (the F16C loads are unaligned anyway).
      const auto* bytes = static_cast<const unsigned char*>(in);
      if (HasF16c() && reinterpret_cast<uintptr_t>(in) % 2 == 0) {
        DecodeHalfF16c(static_cast<const uint16_t*>(in), n, out);
      } else {
        for (size_t i = 0; i < n; ++i) {
          uint16_t h;
          std::memcpy(&h, bytes + 2 * i, 2);
          out[i] = HalfToFloat(h);
        }
      }
      return;
    }
    case BFLOAT16: {
      const auto* bytes = static_cast<const unsigned char*>(in);
      for (size_t i = 0; i < n; ++i) {
        uint16_t b;
        std::memcpy(&b, bytes + 2 * i, 2);
        out[i] = Bfloat16ToFloat(b);
      }
      return;
    }
    default:
      std::memcpy(out, in, n * sizeof(float));
      return;
  }
}

}  // namespace ps
