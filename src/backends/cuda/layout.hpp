#pragma once
#include <cstdint>

namespace rlx::backends::cuda {
// Every buffer of the arena and the weights starts on this (cudaMalloc's alignment, and what cuBLASLt
// wants of its operands).
inline constexpr std::uint64_t kArenaAlignment = 256;
}  // namespace rlx::backends::cuda
