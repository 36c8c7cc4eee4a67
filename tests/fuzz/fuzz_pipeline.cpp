// Fuzz target: the whole pipeline, from IR text to a run on the CPU backend.
// Parsing, binding, every compile pass, lowering, memory planning and the run
// must end in results or an rlx::Error. Sizes are bounded so that each input
// runs in milliseconds: graphs past the bounds are skipped, not errors.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include "rlx/error.hpp"
#include "rlx/ir/text.hpp"
#include "rlx/runtime/session.hpp"
#include "support/test_ops.hpp"

namespace {

constexpr std::size_t kMaxNodes = 256;
constexpr std::int64_t kMaxNodeElements = std::int64_t(1) << 16;

// Also bounds loops: a while needs a small max_trip_count (an unbounded one
// may legitimately run forever), and so a scan's length.
bool small_enough(const rlx::ir::Graph& g) {
  if (g.size() > kMaxNodes || g.nesting_depth() > 4) return false;
  for (const auto& n : g.nodes()) {
    if (n.shape.is_static() && n.shape.numel() > kMaxNodeElements) return false;
    if (n.op == rlx::ir::OpKind::While && (!n.attrs.has("max_trip_count") || n.attrs.get_int("max_trip_count") > 64))
      return false;
    for (const auto& [key, value] : n.attrs.items())
      if (const auto* body = std::get_if<rlx::ir::GraphRef>(&value); body && *body && !small_enough(**body))
        return false;
  }
  return true;
}

// Inputs and params get deterministic bytes: small integers for integer
// dtypes (valid indices stay likely), a pattern for floats.
rlx::ir::Tensor fill(rlx::ir::DType dtype, const std::vector<std::int64_t>& shape) {
  rlx::ir::Tensor t(dtype, shape);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, double(i % 3) - (rlx::ir::is_float(dtype) ? 0.5 : 0.0));
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace rlx;
  testing::register_test_ops();  // custom ops in inputs resolve, so their paths are fuzzed too
  try {
    ir::Graph g = ir::parse_text(std::string_view(reinterpret_cast<const char*>(data), size));
    if (!small_enough(g)) return 0;
    static Session session(Device::Cpu);
    compile::CompileOptions options;
    options.num_threads = 1;
    auto compiled = session.compile(g, options);
    for (const auto& p : compiled.param_specs()) compiled.set_param(p.name, fill(p.dtype, p.shape));
    std::vector<ir::Tensor> storage;
    std::vector<runtime::NamedTensor> inputs;
    for (const auto& s : compiled.input_specs()) storage.push_back(fill(s.dtype, s.shape));
    for (std::size_t i = 0; i < storage.size(); ++i)
      inputs.push_back({compiled.input_specs()[i].name, ir::view(storage[i])});
    compiled.run(inputs);
  } catch (const Error&) {
    return 0;
  }
  return 0;
}
