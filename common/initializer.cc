#include "common/initializer.h"

#include <cmath>

#include "common/hash.h"

namespace ps {

void InitializeValues(const InitializerConfig& init, uint32_t table_id,
                      uint64_t key, uint64_t first_element, size_t n,
                      float* out) {
  switch (init.kind()) {
    case InitializerConfig::CONSTANT:
      for (size_t i = 0; i < n; ++i) out[i] = init.value();
      return;
    case InitializerConfig::UNIFORM:
    case InitializerConfig::NORMAL: {
      const uint64_t base = HashCombine(HashCombine(init.seed(), table_id), key);
      for (size_t i = 0; i < n; ++i) {
        const uint64_t h = HashCombine(base, first_element + i);
        if (init.kind() == InitializerConfig::UNIFORM) {
          out[i] = static_cast<float>((2.0 * HashToUnit(h) - 1.0) * init.scale());
        } else {
          // Box-Muller from two independent uniforms; u1 in (0, 1].
          const double u1 = 1.0 - HashToUnit(h);
          const double u2 = HashToUnit(Mix64(h));
          out[i] = static_cast<float>(init.scale() * std::sqrt(-2.0 * std::log(u1)) *
                                      std::cos(6.283185307179586 * u2));
        }
      }
      return;
    }
    case InitializerConfig::ZEROS:
    default:
      for (size_t i = 0; i < n; ++i) out[i] = 0.0f;
      return;
  }
}

}  // namespace ps
