// Float values on the wire in 32 or 16 bits (config.proto ValueEncoding).
//
// Encoding is total: every finite float maps to a finite 16-bit value
// (FLOAT16 saturates at +/-65504, BFLOAT16 at its largest finite value), so
// a gradient that passed the finiteness check stays finite after the trip.
// Decoding a 16-bit value that is NaN or infinite yields NaN or infinity,
// which the receiver's finiteness checks then refuse. Both directions round
// to nearest even. Conversions use the CPU's F16C instructions when it has
// them (checked once at run time) and exact bit arithmetic otherwise; the
// results are the same. Thread-safe.
#ifndef PS_COMMON_VALUE_CODEC_H_
#define PS_COMMON_VALUE_CODEC_H_

#include <cstddef>
#include <cstdint>

#include "proto/config.pb.h"

namespace ps {

// Bytes a value takes in `encoding` (FLOAT32 for UNSPECIFIED).
inline size_t EncodedValueBytes(ValueEncoding encoding) {
  return encoding == FLOAT16 || encoding == BFLOAT16 ? 2 : 4;
}

// Writes n values of `in` to `out` (n * EncodedValueBytes(encoding) bytes).
void EncodeValues(ValueEncoding encoding, const float* in, size_t n, void* out);

// Reads n values of `encoding` at `in` (any alignment) into `out`.
void DecodeValues(ValueEncoding encoding, const void* in, size_t n, float* out);

// Single values, exposed for tests.
uint16_t FloatToHalf(float f);
float HalfToFloat(uint16_t h);
uint16_t FloatToBfloat16(float f);
float Bfloat16ToFloat(uint16_t b);

}  // namespace ps

#endif  // PS_COMMON_VALUE_CODEC_H_
