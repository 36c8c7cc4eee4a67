#pragma once
// Resource limits that every reader and builder enforces, in one place. Input
// from users, IR text and model files is hostile until checked: a limit turns
// what would be an overflow, a bad_alloc, a stack overflow or an hour-long
// parse into an rlx::Error that names the limit. The limits sit far beyond any
// real model (the largest LLM tensors hold ~2^32 elements) so they never bind
// on real work.
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace rlx::ir::limits {

// Dims per shape (numpy allows 64).
inline constexpr std::size_t kMaxRank = 64;
// Elements per tensor: 2^48. With it, numel * 16 bytes and any index
// arithmetic inside a kernel (offsets, strides times extents) fit in int64.
inline constexpr std::int64_t kMaxElements = std::int64_t(1) << 48;
// Graphs nested inside control-flow bodies (JAX programs rarely pass 10).
// Every recursive walk over bodies (parser, verifier, printer, inliner,
// lowering, autodiff, evaluators) is bounded by it.
inline constexpr std::size_t kMaxNestingDepth = 64;
// Nodes in one graph (2^22): far past real models, but it stops a hostile
// input whose lowering would grow without bound (nested unrolled loops).
inline constexpr std::size_t kMaxNodes = std::size_t(1) << 22;
// Bytes in one string of IR text or a model file (names, attributes).
inline constexpr std::size_t kMaxStringBytes = std::size_t(1) << 20;
// Items an error message lists before it says "... and N more".
inline constexpr std::size_t kMaxListedItems = 8;

// a * b and a + b for element counts and extents; throw rlx::Error naming
// `what` when the result leaves int64 (no wrap-around ever reaches a size).
std::int64_t checked_mul(std::int64_t a, std::int64_t b, std::string_view what);
std::int64_t checked_add(std::int64_t a, std::int64_t b, std::string_view what);

// Throws rlx::Error when `bytes` cannot be a host allocation on this machine
// (more than its physical memory), before anything is allocated or touched,
// so a huge but valid shape gives a clear error instead of bad_alloc or the
// OOM killer. `what` names the buffer ("constant %3", "the arena").
void check_allocation(std::int64_t bytes, std::string_view what);

// Physical memory of this machine in bytes (cached).
std::int64_t physical_memory_bytes();

}  // namespace rlx::ir::limits
