#pragma once
// Where the CUDA backend puts each LIR buffer in device memory, and what that makes known of each buffer's
// alignment (the facts the generated kernels' 16-byte accesses rest on). Needs no GPU.
#include <cstdint>
#include <string>
#include <vector>

#include "rlx/codegen/c.hpp"
#include "rlx/compile/lir.hpp"

namespace rlx::backends::cuda {

// Every buffer of the arena and the weights starts on this (cudaMalloc's alignment, and what cuBLASLt
// wants of its operands).
inline constexpr std::uint64_t kArenaAlignment = 256;

inline std::uint64_t align_up(std::uint64_t n) { return (n + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment; }

// The device allocations: the arena (the memory plan, then the inputs), the params, the constants, pinned
// host staging, and scratch for matmul products an epilogue reads. Each starts on kArenaAlignment or more
// (cuMemAlloc's alignment). The params have an allocation of their own, so that the graph compiled at other
// extents reads the same one (share_params_from).
enum class Where : std::uint8_t { Arena, Params, Constants, Staging, Product };
struct Loc {
  Where where = Where::Arena;
  std::uint64_t offset = 0;
};

struct Layout {
  std::uint64_t arena_bytes = 0, params_bytes = 0, constants_bytes = 0;
  std::vector<std::uint64_t> input_at;   // per graph input: its offset in the arena
  std::vector<std::uint64_t> param_off;  // per param: in the params
  std::vector<std::uint64_t> const_off;  // per constant: in the constants
  std::vector<Loc> locs;                 // per LIR buffer (a view: its root's place plus the view offset)
};
// Throws rlx::Error for a view of a view.
Layout lay_out(const compile::LirModule& lir);

// The largest power of two, up to kArenaAlignment, that divides `offset` (an offset from an allocation's
// start): how far an address there is known to be aligned.
std::int64_t offset_alignment(std::uint64_t offset);

// The emitter's facts for `layout`: each buffer's alignment, the products' scratch at its allocation's start,
// `vector_bytes` per thread and step, and vector_unroll() grid steps per trip.
codegen::c::CudaOptions cuda_options(const Layout& layout, std::int64_t vector_bytes);

// The one op a kernel computes, for the kernels the backend runs as its own op kernels (attention, the GGUF
// block types): its operands must all be kernel inputs (their buffers go to *ins) and its result the kernel's
// one output. nullptr, with the reason in *why, otherwise.
const ir::Node* sole_op(const compile::Kernel& k, std::vector<compile::BufferId>* ins, std::string* why);

}  // namespace rlx::backends::cuda
