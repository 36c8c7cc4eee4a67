#pragma once
// Counter-based RNG shared by the reference interpreter and every backend:
// element i of a random op with seed s is a pure function of (s, i), so the
// results do not depend on threading, tiling or the device.
#include <cmath>
#include <cstdint>

namespace rlx::ir {

inline std::uint64_t rng_mix(std::uint64_t seed, std::uint64_t index) {
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ull + index * 0xD1B54A32D192ED03ull + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
// Uniform in [0, 1) with 24 random bits, exactly representable in f32.
inline float rng_uniform01(std::uint64_t seed, std::uint64_t index) {
  return float(rng_mix(seed, index) >> 40) * (1.0f / 16777216.0f);
}
// Standard normal by Box-Muller on two uniforms; computed in double so every
// backend that follows this formula agrees to f32 rounding.
inline double rng_normal(std::uint64_t seed, std::uint64_t index) {
  double u1 = (double(rng_mix(seed, 2 * index) >> 40) + 1.0) * (1.0 / 16777216.0);  // (0, 1]
  double u2 = double(rng_mix(seed, 2 * index + 1) >> 40) * (1.0 / 16777216.0);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace rlx::ir
