#pragma once
// LIR: what a backend runs. An ordered list of kernels, each a small MIR
// subgraph (its `body`) reading and writing buffers, plus one memory plan that
// places every intermediate buffer at an offset in a single arena. The same
// module feeds the CPU backend (which interprets/JITs bodies) and GPU backends
// (which generate one shader per kernel and bind the arena as one buffer).
#include <cstdint>
#include <string>
#include <vector>

#include "rlx/ir/graph.hpp"

namespace rlx::compile {

using BufferId = std::int32_t;

enum class BufferRole : std::uint8_t {
  Input,     // bound per run from the caller's memory (zero copy)
  Param,     // lives in the executable's parameter store; set_param writes it
  Constant,  // baked at compile time
  Arena,     // intermediate or output: an offset in the arena
};

struct Buffer {
  BufferId id = 0;
  BufferRole role = BufferRole::Arena;
  ir::DType dtype = ir::DType::F32;
  std::vector<std::int64_t> shape;
  std::string name;                  // input/param name, or a debug name
  std::int32_t external_index = -1;  // index into LirModule::inputs / params / constants
  // Views: a buffer may alias another one (reshape, contiguous slice) at a
  // byte offset; `root` is the buffer that owns the storage (itself if none).
  BufferId root = -1;
  std::int64_t view_offset = 0;    // bytes from root's start
  std::int64_t arena_offset = -1;  // bytes from arena start (Arena roots only)

  std::int64_t numel() const;
  std::int64_t nbytes() const;
};

enum class KernelKind : std::uint8_t {
  Elementwise,  // a fused chain of elementwise ops (plus broadcasts)
  Reduce,       // a reduction with elementwise prologue/epilogue
  MatMul,       // matmul with an elementwise epilogue (bias, activation)
  Movement,     // copy-like: permute, slice with steps, concat, pad, gather...
  Native,       // one op a backend runs natively (softmax, layer_norm, conv2d, attention...)
  Leaf,         // fills a buffer: iota, random
  ControlFlow,  // scan / if / while run as a host loop: the sibling nodes of one op (rlx/ir/control_flow.hpp)
};
std::string_view kernel_kind_name(KernelKind k);

struct Kernel {
  KernelKind kind = KernelKind::Elementwise;
  std::string name;  // "fused_elementwise_3: mul+add+relu"
  // The body: Input nodes i = inputs[i] (declared with the buffer's dtype and
  // shape), outputs j = outputs[j]. Bodies are MIR, except that a Native
  // kernel's body holds the one composite op it runs.
  ir::Graph body;
  std::vector<BufferId> inputs;
  std::vector<BufferId> outputs;
  std::vector<ir::NodeId> source_nodes;  // MIR node ids fused into this kernel (for reports)

  // The buffer behind body Input node `input` (named "in<i>": inputs[i]).
  BufferId input_buffer(const ir::Node& input) const;
};

struct MemoryPlan {
  std::int64_t arena_bytes = 0;  // peak: the arena's size
  std::int64_t naive_bytes = 0;  // sum of all arena buffers with no reuse
  std::int64_t view_count = 0;   // buffers served as views (no copy)
  std::int64_t alignment = 64;
};

struct LirModule {
  std::string name;
  std::vector<Buffer> buffers;
  std::vector<Kernel> kernels;
  std::vector<BufferId> inputs;  // graph inputs, in graph order
  std::vector<BufferId> params;
  std::vector<BufferId> constants;
  std::vector<ir::Tensor> constant_values;  // parallel to `constants`
  std::vector<BufferId> outputs;            // graph outputs, in graph order
  std::vector<std::string> output_names;
  MemoryPlan memory;

  const Buffer& buffer(BufferId id) const { return buffers.at(static_cast<std::size_t>(id)); }
  std::string to_text() const;  // human-readable dump (RLX_DUMP=lir)
};

// A Native attention kernel's q, k, v and result as the kernel addresses them: each a buffer and the element
// strides of the attention's [B, H, S, D] dims in it (the head dim's 1). Alone, the operands are body inputs and
// the result the kernel's output, all contiguous; with layout views (BackendTraits::attention_layout_views) any
// of q, k and v may be a permute of a body input and the output a permute of the attention, each keeping the
// head dim last.
struct StridedOperand {
  BufferId buffer = -1;
  std::vector<std::int64_t> shape;         // the attention's view: [B, H, S, D]
  std::int64_t strides[4] = {0, 0, 0, 1};  // elements per step of each of its dims in `buffer`
};
struct AttentionViews {
  const ir::Node* op = nullptr;  // the attention, in the kernel's body
  StridedOperand q, k, v, out;
  BufferId mask = -1;  // the mask's buffer (contiguous, broadcast to the scores), or -1
};
// A rank-4 permute that keeps the last (head) dim last: the layout view an attention reads or writes in place of
// a copy ([B, S, H, D] <-> [B, H, S, D]).
bool is_head_layout_permute(const ir::Node& n);
// The kernel's attention and its operands' views; false with the reason in *why when the body is anything else.
bool attention_views(const LirModule& lir, const Kernel& k, AttentionViews* out, std::string* why);

}  // namespace rlx::compile
