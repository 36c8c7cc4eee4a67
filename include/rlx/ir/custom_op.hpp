#pragma once
// The open seam beside the closed op set: an OpExtension adds an op by name.
// Nodes are OpKind::Custom with attr "op" = the extension's name plus the
// extension's own typed attributes. The registry routes shape inference,
// lowering (the `inline` pass), the reference interpreter and autodiff.
// Execution routes, cheapest first: `lower` into primitives (runs and fuses on
// every backend); a host kernel (runtime::register_host_kernel); a raw GPU
// kernel (runtime::register_vulkan_kernel / register_cuda_kernel).
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "rlx/ir/graph.hpp"

namespace rlx::ir {

class OpExtension {
 public:
  virtual ~OpExtension() = default;
  virtual std::string_view name() const = 0;
  // Number of inputs; -1 accepts any number.
  virtual int num_inputs() const = 0;
  // The op's attributes (besides "op"), checked by the verifier and used by the text parser.
  virtual std::vector<AttrSpec> attr_schema() const { return {}; }
  // Output dtype and shape; throw rlx::Error for inputs that do not fit.
  virtual TypeInfo infer(std::span<const TypeInfo> inputs, const Attrs& attrs) const = 0;
  // Optional: emit the op as primitives into `g` (inputs are ids in `g`) and
  // return the result. With it the op runs and fuses on every backend.
  virtual std::optional<NodeId> lower(Graph& /*g*/, std::span<const NodeId> /*inputs*/, const Attrs& /*attrs*/) const {
    return std::nullopt;
  }
  // Optional float64 reference, used by the reference interpreter when there
  // is no lowering.
  virtual std::optional<Tensor> reference(std::span<const Tensor> /*inputs*/, const Attrs& /*attrs*/,
                                          const TypeInfo& /*out*/) const {
    return std::nullopt;
  }
  // Optional autodiff rules, emitted into `g`. vjp: one cotangent per input
  // (nullopt = no gradient). jvp: the output tangent from the input tangents
  // (nullopt entries are zero). Without a rule (and without a lowering to
  // differentiate through) autodiff reports the op as non-differentiable.
  virtual std::optional<std::vector<std::optional<NodeId>>> vjp(Graph& /*g*/, std::span<const NodeId> /*inputs*/,
                                                                NodeId /*output*/, NodeId /*cotangent*/,
                                                                const Attrs& /*attrs*/) const {
    return std::nullopt;
  }
  virtual std::optional<NodeId> jvp(Graph& /*g*/, std::span<const NodeId> /*inputs*/,
                                    std::span<const std::optional<NodeId>> /*tangents*/, NodeId /*output*/,
                                    const Attrs& /*attrs*/) const {
    return std::nullopt;
  }
  // Optional batching rule for autodiff::vmap: the op applied to inputs that
  // carry an extra batch axis at `batch_axes[i]` (-1: not batched; vmap passes
  // 0 or -1). Returns the batched result, whose batch axis is 0. Without it
  // vmap batches the op through its lowering.
  virtual std::optional<NodeId> vmap(Graph& /*g*/, std::span<const NodeId> /*inputs*/,
                                     std::span<const std::int64_t> /*batch_axes*/, const Attrs& /*attrs*/) const {
    return std::nullopt;
  }
};

// Registers an extension, replacing one of the same name.
void register_op(std::shared_ptr<const OpExtension> ext);
// Registers an extension; throws rlx::Error if the name is taken.
void register_op_strict(std::shared_ptr<const OpExtension> ext);
bool is_op_registered(std::string_view name);
// The extension for `name`; throws rlx::Error listing the registered names.
std::shared_ptr<const OpExtension> find_op_extension(std::string_view name);
std::vector<std::string> registered_op_names();

// custom_fn: a subgraph body with user-given derivative bodies, registered as
// a custom op named `name`. The body runs through its lowering (it is inlined),
// and autodiff uses the given bodies instead of differentiating the body.
//  - body: Input nodes (the arguments, in order) -> one output; no params.
//  - vjp:  the body's inputs, then the output's cotangent -> one cotangent per input.
//  - jvp:  the body's inputs, then one tangent per input -> the output's tangent.
// Bodies that do not fit these shapes are rejected with rlx::Error.
struct CustomFn {
  std::string name;
  Graph body;
  std::optional<Graph> vjp;
  std::optional<Graph> jvp;
};
void register_custom_fn(CustomFn fn);
// Registers `fn` (replacing one of the same name) and calls it on `args` in `g`.
NodeId call_custom_fn(Graph& g, const CustomFn& fn, std::vector<NodeId> args);

// A node's full attribute schema: the op's, plus the extension's for custom ops.
std::vector<AttrSpec> attr_schema_of(OpKind op, const Attrs& attrs);

}  // namespace rlx::ir
