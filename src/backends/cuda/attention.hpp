#pragma once
// The CUDA backend's attention: flash attention as CUDA C of our own (FlashAttention-2's tiling, f32 math), for
// the Native attention kernels the traits keep whole (f32, and f16/bf16 through the casts the traits put around
// it; f64 attention decomposes). The op table's semantics (src/ops/nn.cpp): softmax(q k^T scale [+ mask]) v with
// q [B, H, Sq, D], k [B, Hkv, Sk, D], v [B, Hkv, Sk, Dv], H a multiple of Hkv (grouped-query attention), scale 0
// meaning 1/sqrt(D), a bool mask keeping True or a float mask added to the scores (either broadcast to
// [B, H, Sq, Sk]), causal hiding key j from query i when j > i (top-left aligned), a fully masked row giving
// NaN (0/0) and Sk = 0 giving zeros.
//
// A block of `block_q` query rows (64, or 32 where 64 would leave multiprocessors idle or not fit) of one batch
// entry and KV head: the rows of the KV head's `group` query heads are contiguous in q and in the output, so a
// block takes rows of several heads (decode's single query per head shares each K/V tile between the group).
// The Q tile stays in shared memory (transposed); K and V tiles of 32 keys stream through shared memory. Per K
// tile each thread computes a 4 x 4 block of scores (4 rows, keys 8 apart), applies scale, mask and causality,
// and runs the online softmax on its rows with the 8 threads that share them (shuffles); the probabilities go
// through shared memory into O += P V, each thread holding 4 rows of O in registers (columns 8 apart). Causal
// blocks stop at the last key their rows can see. Where there are fewer blocks than multiprocessors (decode:
// batch x KV heads blocks of one row per query head), the keys are split into ranges, each its own block
// writing its rows' max, sum and unscaled O, and a second kernel merges the ranges (flash-decoding). Output columns
// beyond 256 are split over blocks (chunks of 128) so that O fits in registers. The dimensions are compiled into the
// program (one per shape, NVRTC and the cubin cache as for every program). Needs no GPU: plan_attention is what tests
// compile.
#include <cstdint>
#include <string>
#include <vector>

#include "rlx/compile/lir.hpp"

namespace rlx::backends::cuda {

// What the launch may use of the device.
struct AttentionDevice {
  std::int64_t max_shared_bytes = 48 * 1024;  // dynamic shared memory per block (the opt-in limit)
  std::int64_t multiprocessors = 132;
};

struct AttentionLaunch {
  std::string source;  // the program
  std::string entry = "rlx_flash_attention";
  unsigned grid = 1, block = 1;
  unsigned shared = 0;  // dynamic shared memory bytes
  std::int64_t block_q = 0, chunks = 1;
  // The function's pointer operands: q, k, v, the mask (q again when there is none), the output.
  std::vector<compile::BufferId> buffers;
  // Flash-decoding: with splits > 1 the function writes `partial_bytes` of partials in place of the output, and
  // `combine_entry` of the same program (operands: the partials, the output) merges them into it.
  std::int64_t splits = 1;
  std::uint64_t partial_bytes = 0;
  std::string combine_entry = "rlx_flash_attention_combine";
  unsigned combine_grid = 1, combine_block = 1;
};

// The launch that runs Native kernel `k` when it holds one f32 attention as its output; otherwise false with the
// reason in *why (the kernel then runs on the host).
bool plan_attention(const compile::LirModule& lir, const compile::Kernel& k, const AttentionDevice& device,
                    AttentionLaunch* out, std::string* why);

}  // namespace rlx::backends::cuda
