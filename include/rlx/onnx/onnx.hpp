#pragma once
// ONNX import (docs/onnx.md): an ONNX model file becomes an ir::Graph plus the values of its params.
//
//   auto m = rlx::onnx::import("model.onnx");
//   auto cg = rlx::runtime::Session().compile(m.graph, {.bind = {{"batch", 1}, {"sequence", 128}}});
//   for (const auto& [name, value] : m.params) cg.set_param(name, value);
//
// The model's symbolic dims (dim_params) stay RLX symbolic dims, bound when the graph is compiled; shape
// subgraphs on them (Shape, Gather, Concat, Range, ConstantOfShape...) fold to dim expressions (B*S) in the
// graph's shapes. ImportOptions::dims or ::input_shapes bind them at import instead, and every shape is then
// static. A node whose inputs are all constants is evaluated at import by the reference interpreter.
//
// Promote rule: a value known at import (an initializer, a Constant node or a folded result) enters the
// graph as a constant when it has at most ImportOptions::max_constant_elements elements, and as a param
// (named after the ONNX value, its value in Model::params) otherwise. Small values (shape data, axes,
// epsilons, scales) stay visible to the compiler's folding; weights stay out of the IR text.
//
// Every problem is an rlx::Error. Errors about a node name the node, its op, its domain and the opset:
//   onnx: node 'attn/MatMul_3' (MatMul, domain ai.onnx, opset 17): input 1 ...
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "rlx/ir/graph.hpp"
#include "rlx/ir/tensor.hpp"

namespace rlx::onnx {

// The default domain's opsets this importer reads (ai.onnx; "" in a file).
inline constexpr std::int64_t kMinOpset = 1;
inline constexpr std::int64_t kMaxOpset = 28;

struct ImportOptions {
  // Extents for the model's symbolic dims, bound at import, by name ("batch" -> 8); the others stay
  // symbolic. A dim without a name (neither dim_value nor dim_param) can only be set through input_shapes.
  std::map<std::string, std::int64_t, std::less<>> dims;
  // Whole shapes for graph inputs, by input name; they override the file's.
  std::map<std::string, std::vector<std::int64_t>, std::less<>> input_shapes;
  // Values for graph inputs, fixed at import: the inputs become constants and leave the graph's inputs.
  // For models that take shape data (axes, pads, a target shape) as inputs, which must be known at import.
  std::map<std::string, ir::Tensor, std::less<>> constant_inputs;
  // Where external data files are looked up (import() defaults it to the model's folder).
  std::filesystem::path base_dir;
  // The promote rule's threshold (see above).
  std::int64_t max_constant_elements = 1024;
};

// What happened to each ONNX node: mapped onto RLX ops, folded to a constant at import, or (only when
// collecting a report) unsupported.
struct NodeReport {
  std::string name;
  std::string op_type;
  std::string domain;
  enum class Fate : std::uint8_t { Mapped, Folded, Unsupported } fate = Fate::Mapped;
  std::string detail;  // the RLX ops it became, or the error
};

struct Model {
  ir::Graph graph;
  std::vector<std::pair<std::string, ir::Tensor>> params;   // in the graph's param order
  std::map<std::string, std::int64_t, std::less<>> opsets;  // domain ("ai.onnx" for the default) -> version
  std::int64_t ir_version = 0;
  std::string producer;
  std::vector<NodeReport> report;
};

Model import(const std::filesystem::path& path, ImportOptions options = {});
Model import_bytes(std::span<const std::byte> bytes, ImportOptions options = {});

// Imports as far as possible and lists every node's fate instead of stopping at the first unsupported
// op (`rlx import --report`). Errors other than an unsupported op still throw.
std::vector<NodeReport> import_report(const std::filesystem::path& path, ImportOptions options = {});
std::string report_text(const std::vector<NodeReport>& report);

// A serialized TensorProto (the backend tests' input_N.pb / output_N.pb): its name and value.
std::pair<std::string, ir::Tensor> read_tensor_proto(std::span<const std::byte> bytes);

// The ONNX op types of the default domain this importer maps, sorted.
std::vector<std::string> supported_ops();

}  // namespace rlx::onnx
