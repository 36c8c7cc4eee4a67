#pragma once
// Shared by the reader and the writer; not installed.
#include <cstdint>
#include <span>
#include <string>

#include "rlx/gguf/types.hpp"

namespace rlx::gguf::detail {

// The bytes of a tensor of this type and these dims, or 0 with `why` set to the reason there is no such size
// (a negative dim, dim 0 not a multiple of the block, an element count or byte size past 64 bits).
std::uint64_t nbytes_or(GgmlType type, std::span<const std::int64_t> dims, std::string& why);

}  // namespace rlx::gguf::detail
