// The ONNX importer on small checked-in models (tests/onnx/make_models.py writes them, with the outputs of
// ONNX's reference evaluator): symbolic dims bound at import, a folded shape subgraph, initializers as
// params, external data; and one malformed file per error the importer must report (tests/malformed/onnx).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "rlx/error.hpp"
#include "rlx/ir/text.hpp"
#include "rlx/onnx/onnx.hpp"
#include "rlx/reference/interpreter.hpp"
#include "rlx/runtime/session.hpp"
#include "support/testing.hpp"

namespace fs = std::filesystem;

namespace {

const fs::path kModels = fs::path(RLX_SOURCE_DIR) / "tests/onnx/models";
const fs::path kBad = fs::path(RLX_SOURCE_DIR) / "tests/malformed/onnx";

using rlx::testing::read_bytes;

rlx::ir::Tensor read_tensor(const fs::path& p) { return rlx::onnx::read_tensor_proto(read_bytes(p)).second; }

rlx::ir::Tensor run_cpu(const rlx::onnx::Model& m, const std::string& input, const rlx::ir::Tensor& x) {
  auto cg = rlx::runtime::Session(rlx::runtime::Device::Cpu).compile(m.graph);
  for (const auto& [name, value] : m.params) cg.set_param(name, value);
  return cg.run({{input, x}}).at(0);
}

void expect_close(const rlx::ir::Tensor& have, const rlx::ir::Tensor& want, double tol) {
  ASSERT_EQ(have.shape(), want.shape());
  for (std::int64_t i = 0; i < want.numel(); ++i) EXPECT_NEAR(have.get(i), want.get(i), tol) << "element " << i;
}

// The error's message, or "" when there was none.
std::string error_of(const fs::path& p, rlx::onnx::ImportOptions o = {}) {
  try {
    rlx::onnx::import(p, std::move(o));
  } catch (const rlx::Error& e) {
    return e.what();
  }
  return "";
}

// Imports <stem>.onnx, runs it on <data>_in_<i>.pb (data defaults to stem) and compares every output with
// <data>_out_<i>.pb (ONNX's reference evaluator's, written by make_models.py): integers exactly, floats
// within `tol`.
rlx::onnx::Model check_against_reference(const std::string& stem, std::string data = "",
                                         const rlx::compile::CompileOptions& options = {}, double tol = 1e-5) {
  if (data.empty()) data = stem;
  auto m = rlx::onnx::import(kModels / (stem + ".onnx"));
  auto cg = rlx::runtime::Session(rlx::runtime::Device::Cpu).compile(m.graph, options);
  for (const auto& [name, value] : m.params) cg.set_param(name, value);
  std::map<std::string, rlx::ir::Tensor, std::less<>> inputs;
  for (int i = 0; fs::exists(kModels / fmt::format("{}_in_{}.pb", data, i)); ++i)
    inputs.insert(rlx::onnx::read_tensor_proto(read_bytes(kModels / fmt::format("{}_in_{}.pb", data, i))));
  const auto outs = cg.run(inputs);
  EXPECT_FALSE(fs::exists(kModels / fmt::format("{}_out_{}.pb", data, outs.size()))) << data << ": too few outputs";
  for (std::size_t i = 0; i < outs.size(); ++i) {
    const auto want = read_tensor(kModels / fmt::format("{}_out_{}.pb", data, i));
    EXPECT_EQ(outs[i].dtype(), want.dtype()) << data << " output " << i;
    expect_close(outs[i], want, rlx::ir::is_float(want.dtype()) ? tol : 0.0);
  }
  return m;
}

std::size_t count_ops(const rlx::ir::Graph& g, rlx::ir::OpKind op) {
  return std::size_t(std::count_if(g.nodes().begin(), g.nodes().end(), [&](const auto& n) { return n.op == op; }));
}

}  // namespace

TEST(OnnxImport, QuantizeDequantizePerAxisAndBlocked) {
  // Ties round to even, values past the type's range saturate; blocked scales repeat over a short last block.
  check_against_reference("qdq");
}

TEST(OnnxImport, EinsumScatterReductionsAndPoolIndices) {
  // Einsum with ellipses of different ranks, an implicit output, a trace and a batched diagonal; ScatterElements
  // with max/min (int32) and mul over repeated indices; MaxPool's Indices output with padding and ties.
  check_against_reference("misc_ops");
}

TEST(OnnxImport, IfOnARunTimeConditionBecomesAnRlxIf) {
  // The then branch reads a run-time value of the enclosing graph (an operand of the if) and an initializer.
  const auto m = check_against_reference("if_runtime");
  check_against_reference("if_runtime", "if_runtime_else");
  EXPECT_EQ(count_ops(m.graph, rlx::ir::OpKind::If), 1u);
}

TEST(OnnxImport, LoopOnRunTimeValuesBecomesAnRlxWhile) {
  // One loop with a run-time trip count, one with a known one; both stop early on a condition the body
  // computes from a run-time input of the enclosing graph, and the body holds an If on a run-time condition.
  const auto m = check_against_reference("loop_runtime");
  check_against_reference("loop_runtime", "loop_runtime_trips");  // the trip count ends the first loop
  EXPECT_EQ(count_ops(m.graph, rlx::ir::OpKind::While), 2u);      // each loop's one used result
  const auto report = rlx::onnx::report_text(m.report);
  EXPECT_NE(report.find("Loop"), std::string::npos) << report;
  // Known at import but past 4096 iterations: a while with max_trip_count 5000, not an unrolling.
  const auto long_loop = check_against_reference("loop_long");
  EXPECT_EQ(count_ops(long_loop.graph, rlx::ir::OpKind::While), 1u);
  ASSERT_FALSE(long_loop.report.empty());
  EXPECT_EQ(long_loop.report.back().detail, "while (at most 5000 iterations)");
}

TEST(OnnxImport, ScanBecomesAnRlxScan) {
  // Along axis 1, reversed, its output stacked along axis 1 and reversed; the body reads a 40x40 weight of
  // the enclosing graph, which stays a param and enters the scan as an operand.
  const auto m = check_against_reference("scan_axes");
  EXPECT_EQ(count_ops(m.graph, rlx::ir::OpKind::Scan), 2u);  // the final state and the stacked outputs
  // Compiled as the CPU's host loop instead of unrolled.
  check_against_reference("scan_axes", "", {.scan_unroll_max_length = 0, .scan_unroll_budget = 0});
  ASSERT_EQ(m.params.size(), 1u);
  EXPECT_EQ(m.params[0].first, "sw");
}

TEST(OnnxImport, MlpWithSymbolicBatchMatchesOnnxReference) {
  auto m = rlx::onnx::import(kModels / "mlp.onnx", {.dims = {{"batch", 3}}});
  EXPECT_EQ(m.opsets.at("ai.onnx"), 20);
  EXPECT_EQ(m.producer, "rlx-tests");
  // The shape subgraph folded: no node of the graph reads the input's shape at run time.
  std::size_t folded = 0;
  for (const auto& r : m.report) folded += r.fate == rlx::onnx::NodeReport::Fate::Folded;
  EXPECT_EQ(folded, 3u);  // Shape, Gather, Concat
  // w1 (128 elements) and the rest are under the promote threshold: constants, no params.
  EXPECT_TRUE(m.params.empty());
  expect_close(run_cpu(m, "x", read_tensor(kModels / "mlp_x.pb")), read_tensor(kModels / "mlp_y.pb"), 1e-5);
}

TEST(OnnxImport, LargeInitializersBecomeParams) {
  auto m = rlx::onnx::import(kModels / "mlp.onnx", {.dims = {{"batch", 3}}, .max_constant_elements = 64});
  ASSERT_EQ(m.params.size(), 1u);
  EXPECT_EQ(m.params[0].first, "w1");
  EXPECT_EQ(m.graph.param_ids().size(), 1u);
  expect_close(run_cpu(m, "x", read_tensor(kModels / "mlp_x.pb")), read_tensor(kModels / "mlp_y.pb"), 1e-5);
  // The IR text round-trips.
  EXPECT_EQ(rlx::ir::to_text(rlx::ir::parse_text(rlx::ir::to_text(m.graph))), rlx::ir::to_text(m.graph));
}

TEST(OnnxImport, InputShapesOverrideTheFile) {
  auto m = rlx::onnx::import(kModels / "mlp.onnx", {.input_shapes = {{"x", {3, 8}}}});
  EXPECT_EQ(m.graph.node(m.graph.find_input("x")).shape, (rlx::ir::Shape{3, 8}));
}

// A dim_param not given in ImportOptions::dims stays a symbolic dim; a compile without binding it names it.
TEST(OnnxImport, UnboundSymbolicDimStaysSymbolic) {
  auto m = rlx::onnx::import(kModels / "mlp.onnx");
  EXPECT_EQ(m.graph.node(m.graph.input_ids().at(0)).shape.str(), "[batch,8]");
  try {
    rlx::runtime::Session(rlx::runtime::Device::Cpu).compile(m.graph);
    ADD_FAILURE() << "compiled with an unbound dim";
  } catch (const rlx::Error& e) {
    EXPECT_NE(std::string(e.what()).find("unbound symbolic dims batch"), std::string::npos) << e.what();
  }
}

// dynamic_shapes.onnx (make_models.py): x [batch, seq, 4] through a shape subgraph (Shape, Gather, Mul, Concat,
// Slice, Squeeze, Range, ConstantOfShape, Expand, Reshape with 0 and -1). Imported once, compiled at several
// bindings, each run on fresh random inputs into poisoned outputs and compared with the float64 reference
// interpreter; the same import bound at import gives the same graph as binding at compile time.
TEST(OnnxImport, SymbolicDimsImportedOnceCompileAtEachBinding) {
  const auto m = rlx::onnx::import(kModels / "dynamic_shapes.onnx");
  EXPECT_EQ(m.graph.node(m.graph.outputs().at(0).node).shape.str(), "[batch,3*seq]");
  m.graph.verify();  // before any binding
  std::mt19937_64 rng(rlx::testing::test_seed());
  for (const auto& [b, sq] : std::vector<std::pair<std::int64_t, std::int64_t>>{{1, 5}, {3, 2}, {2, 7}, {4, 1}}) {
    SCOPED_TRACE(fmt::format("batch={} seq={}", b, sq));
    rlx::compile::CompileOptions o;
    o.bind = {{"batch", b}, {"seq", sq}};
    auto cg = rlx::runtime::Session(rlx::runtime::Device::Cpu).compile(m.graph, o);
    rlx::reference::TensorMap params;
    for (const auto& [name, value] : m.params) {
      cg.set_param(name, value);
      params.emplace(name, value);
    }
    const auto x = rlx::testing::random_tensor(rlx::ir::DType::F32, {b, sq, 4}, rng);
    std::vector<rlx::ir::Tensor> outs{rlx::ir::Tensor(rlx::ir::DType::F32, {b, 3 * sq})};
    for (std::int64_t i = 0; i < outs[0].numel(); ++i) outs[0].set(i, std::nan(""));  // poisoned
    const std::vector<rlx::runtime::NamedTensor> feeds{{"x", rlx::ir::view(x)}};
    cg.run_into(feeds, outs);
    const auto want = rlx::reference::run(m.graph, {{"x", x}}, params).at(0);
    EXPECT_TRUE(rlx::testing::tensors_close(outs[0], want));
    // Binding at import gives the graph that binding the symbolic import gives.
    auto bound = rlx::onnx::import(kModels / "dynamic_shapes.onnx", {.dims = {{"batch", b}, {"seq", sq}}});
    EXPECT_TRUE(bound.graph.node(bound.graph.outputs().at(0).node).shape.is_static());
    auto cg2 = rlx::runtime::Session(rlx::runtime::Device::Cpu).compile(bound.graph);
    for (const auto& [name, value] : bound.params) cg2.set_param(name, value);
    EXPECT_TRUE(rlx::testing::tensors_close(cg2.run({{"x", x}}).at(0), outs[0]));
  }
}

TEST(OnnxImport, ExternalData) {
  auto m = rlx::onnx::import(kModels / "external.onnx", {.max_constant_elements = 0});
  ASSERT_EQ(m.params.size(), 1u);
  expect_close(run_cpu(m, "x", read_tensor(kModels / "external_x.pb")), read_tensor(kModels / "external_y.pb"), 1e-5);
  const auto e = error_of(kModels / "external_bad_offset.onnx");
  EXPECT_NE(e.find("runs past the end"), std::string::npos) << e;
  EXPECT_NE(e.find("'w1'"), std::string::npos) << e;
  // Bytes alone have no folder to find the data in.
  try {
    rlx::onnx::import_bytes(read_bytes(kModels / "external.onnx"));
    ADD_FAILURE() << "no error";
  } catch (const rlx::Error& err) {
    EXPECT_NE(std::string(err.what()).find("base_dir"), std::string::npos) << err.what();
  }
}

TEST(OnnxImport, MalformedFilesGiveClearErrors) {
  const std::pair<const char*, std::vector<const char*>> cases[] = {
      {"truncated.onnx", {"truncated or malformed protobuf"}},
      {"missing_initializer.onnx", {"'mm'", "w_missing", "no input, initializer or node defines"}},
      {"cycle.onnx", {"cycle", "node '"}},
      {"mismatched_shapes.onnx", {"node 'add'", "Add", "[2,3]", "[4,5]"}},
      {"declared_shape.onnx", {"mismatched shapes", "output 'c'"}},
      {"unknown_opset.onnx", {"unknown opset 99", "ai.onnx"}},
      {"dequantize_scale_extent.onnx", {"node 'dq'", "DequantizeLinear", "per-axis scale", "2 entries"}},
      {"loop_runtime_scan_outputs.onnx", {"node 'loop'", "(Loop", "scan outputs", "known at import"}},
      {"if_branch_shapes.onnx", {"node 'branch'", "(If", "then body gives f32[2]", "else body f32[4]"}},
      {"loop_carried_shape.onnx", {"node 'loop'", "(Loop", "loop-carried value 0 ('v0')", "f32[4]", "f32[2]"}},
      {"unsupported_op.onnx", {"node 'nms'", "NonMaxSuppression", "domain ai.onnx", "opset 17", "unsupported op"}},
      {"float8_exp.onnx", {"node 'exp8'", "(Exp", "f8e4m3fn", "storage-only"}},
      {"int4_packed_size.onnx", {"'w4'", "5 bytes of raw data", "needs 3"}},
  };
  for (const auto& [file, needles] : cases) {
    const auto e = error_of(kBad / file);
    ASSERT_FALSE(e.empty()) << file << " imported without an error";
    for (const char* n : needles) EXPECT_NE(e.find(n), std::string::npos) << file << ": " << e;
  }
}

TEST(OnnxImport, ReportListsUnsupportedOpsWithoutStopping) {
  const auto report = rlx::onnx::import_report(kBad / "unsupported_op.onnx");
  ASSERT_EQ(report.size(), 1u);
  EXPECT_EQ(report[0].fate, rlx::onnx::NodeReport::Fate::Unsupported);
  const auto text = rlx::onnx::report_text(report);
  EXPECT_NE(text.find("NonMaxSuppression"), std::string::npos) << text;
}

TEST(OnnxImport, ClaimsTheCommonOps) {
  const auto ops = rlx::onnx::supported_ops();
  for (const char* op : {"MatMul", "Gemm", "Conv", "Softmax", "LayerNormalization", "Reshape", "Gather", "Where"})
    EXPECT_NE(std::find(ops.begin(), ops.end(), op), ops.end()) << op;
}
