#pragma once
// Compiles the elementwise part of a kernel body into a register Program
// (isa.hpp) evaluated block by block: every node is evaluated as if broadcast
// to the iteration shape, loads convert the storage dtype to the compute type
// and stores convert back.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/isa.hpp"
#include "rlx/ir/graph.hpp"

namespace rlx::backends::cpu {

CT compute_type(ir::DType t);
// The storage dtype whose values are exactly one compute type's (F32, F64, I32, I64).
ir::DType storage_of(CT t);

// A program and everything its raw pointers point into.
struct CompiledProgram {
  std::vector<Instr> init, code;
  std::vector<LoadSpec> loads;
  std::vector<StoreSpec> stores;
  std::vector<std::int32_t> direct;
  std::vector<Micro> micros;
  std::vector<std::shared_ptr<const ir::Tensor>> constants;  // keeps `fixed` data alive
  Program view;
  std::size_t scratch_bytes = 0;  // per thread
  // A cost estimate: a fused run counts its steps.
  std::size_t instructions() const { return init.size() + code.size() + micros.size(); }
};

// Where a node's value is read from when it is not computed.
struct Source {
  std::int32_t buffer = 0;  // >= 0: pointer table index; < 0: aux[-1 - buffer]
  ir::DType dtype = ir::DType::F32;
  std::vector<std::int64_t> shape;
};

class ProgramBuilder {
 public:
  // Nodes are evaluated broadcast to `iter`; `order` (a permutation of
  // iter's axes, empty for identity) is the order the flat iteration index runs in.
  ProgramBuilder(const ir::Graph& body, std::vector<std::int64_t> iter, std::vector<int> order = {});
  // Reads `node` from memory instead of computing it (body inputs, pseudo sources).
  void bind(ir::NodeId node, Source src);
  void store(ir::NodeId node, std::int32_t buffer, ir::DType dtype, bool stream);
  void result(ir::NodeId node);
  // Throws rlx::Error (prefixed by `what`) for a node it cannot evaluate.
  std::unique_ptr<CompiledProgram> build(const std::string& what);

 private:
  const ir::Graph& body_;
  std::vector<std::int64_t> iter_;
  std::vector<int> order_;
  std::map<ir::NodeId, Source> sources_;
  struct PendingStore {
    ir::NodeId node;
    StoreSpec spec;
  };
  std::vector<PendingStore> stores_;
  ir::NodeId result_ = ~ir::NodeId(0);
};

// Binds every body Input node i to kernel input buffer `inputs[i]` of the given
// dtypes/shapes (body input index parsed from its "in<i>" name).
int body_input_index(const ir::Node& n, int ordinal);
// Whether the elementwise programs have an instruction of their own for `op`;
// an op with a formula and none is decomposed into its formula instead.
bool has_instruction(ir::OpKind op);

}  // namespace rlx::backends::cpu
