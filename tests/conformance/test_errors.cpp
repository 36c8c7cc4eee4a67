// User errors: each must surface as an rlx::Error whose message names the
// problem (node, op, shapes, names), never a crash or another exception type.
#include <string>
#include <string_view>

#include "conformance/harness.hpp"

namespace rlx::conformance {
namespace {

using ir::DType;
using ir::Graph;
using ir::Node;
using ir::NodeId;
using ir::OpKind;
using ir::Shape;

using rlx::testing::expect_error;

Node raw(OpKind op, std::vector<NodeId> inputs, Shape shape, DType dtype = DType::F32) {
  Node n;
  n.op = op;
  n.inputs = std::move(inputs);
  n.shape = std::move(shape);
  n.dtype = dtype;
  return n;
}

// ---- malformed graphs ----------------------------------------------------------

// %1 = neg %2, %2 = neg %1: a cycle, which in SSA order is a forward reference.
Graph cyclic_graph() {
  Graph g("cyclic");
  g.input("x", Shape{2});
  g.add_raw(raw(OpKind::Neg, {2}, Shape{2}));
  g.add_raw(raw(OpKind::Neg, {1}, Shape{2}));
  g.add_output(2);
  return g;
}

Graph dangling_graph() {
  Graph g("dangling");
  auto x = g.input("x", Shape{2});
  g.add_output(g.add_raw(raw(OpKind::Add, {x, 99}, Shape{2})));
  return g;
}

Graph mistyped_graph() {
  Graph g("mistyped");
  auto x = g.input("x", Shape{2, 3});
  g.add_output(g.add_raw(raw(OpKind::Exp, {x}, Shape{3, 2})));  // exp keeps [2,3]
  return g;
}

TEST(MalformedGraph, CycleIsAForwardReference) {
  expect_error([] { cyclic_graph().verify(); }, {"%1", "neg", "%2", "forward reference"});
}

TEST(MalformedGraph, SelfReference) {
  Graph g("self");
  g.input("x", Shape{2});
  g.add_raw(raw(OpKind::Relu, {1}, Shape{2}));
  expect_error([&] { g.verify(); }, {"%1", "relu", "forward reference"});
}

TEST(MalformedGraph, DanglingInput) {
  expect_error([] { dangling_graph().verify(); }, {"%1", "add", "%99", "dangling"});
}

TEST(MalformedGraph, DeclaredTypeDisagreesWithInference) {
  expect_error([] { mistyped_graph().verify(); }, {"%1", "exp", "[3,2]", "[2,3]"});
}

TEST(MalformedGraph, OutputMustExist) {
  Graph g;
  g.input("x", Shape{2});
  expect_error([&] { g.add_output(5); }, {"%5"});
}

class DeviceErrors : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override {
    if (auto why = unavailable_reason(GetParam()); !why.empty()) GTEST_SKIP() << why;
  }
};

// The pipeline verifies what it is given: a malformed graph is an error, not a crash.
TEST_P(DeviceErrors, CompileRejectsMalformedGraphs) {
  Session s(GetParam());
  expect_error([&] { s.compile(cyclic_graph()); }, {"%1", "forward reference"});
  expect_error([&] { s.compile(dangling_graph()); }, {"%99", "dangling"});
  expect_error([&] { s.compile(mistyped_graph()); }, {"exp", "[3,2]", "[2,3]"});
}

// ---- builders ------------------------------------------------------------------

TEST(BuilderShapes, MatMulContractionMismatch) {
  Graph g;
  auto a = g.input("a", Shape{2, 3});
  auto b = g.input("b", Shape{4, 5});
  expect_error([&] { g.matmul(a, b); }, {"matmul", "[2,3]", "[4,5]", "%2"});
}

TEST(BuilderShapes, BroadcastMismatch) {
  Graph g;
  auto a = g.input("a", Shape{2, 3});
  auto b = g.input("b", Shape{4});
  expect_error([&] { g.add(a, b); }, {"add", "[2,3]", "[4]"});
}

TEST(BuilderShapes, DTypeMismatch) {
  Graph g;
  auto a = g.input("a", Shape{2}, DType::F32);
  auto b = g.input("b", Shape{2}, DType::I32);
  expect_error([&] { g.mul(a, b); }, {"mul", "f32", "i32"});
}

TEST(BuilderShapes, ConcatOffAxisMismatch) {
  Graph g;
  auto a = g.input("a", Shape{2, 3});
  auto b = g.input("b", Shape{3, 4});
  expect_error([&] { g.concat({a, b}, 0); }, {"concat", "[2,3]", "[3,4]"});
}

TEST(BuilderShapes, ReshapeChangesElementCount) {
  Graph g;
  auto a = g.input("a", Shape{2, 3});
  expect_error([&] { g.reshape(a, Ints{4}); }, {"reshape", "[2,3]", "[4]"});
}

TEST(BuilderShapes, ConvChannelMismatch) {
  Graph g;
  auto x = g.input("x", Shape{1, 3, 8, 8});
  auto w = g.input("w", Shape{4, 2, 3, 3});
  expect_error([&] { g.conv2d(x, w, std::nullopt); }, {"conv2d", "[1,3,8,8]", "[4,2,3,3]", "channels"});
}

TEST(BuilderShapes, DuplicateInputName) {
  Graph g;
  g.input("x", Shape{2});
  expect_error([&] { g.input("x", Shape{3}); }, {"'x'", "already used"});
}

// ---- run time --------------------------------------------------------------------

// y = x * w with x an input f32[2,3] and w a param f32[3].
CompiledGraph compile_xw(Device d) {
  Graph g("xw");
  auto x = g.input("x", Shape{2, 3});
  auto w = g.param("w", Shape{3});
  g.add_output(g.mul(x, w), "y");
  return Session(d).compile(g);
}

ir::Tensor f32(Ints shape) { return ir::Tensor(DType::F32, std::move(shape)); }

TEST_P(DeviceErrors, UnknownInputName) {
  auto exe = compile_xw(GetParam());
  exe.set_param("w", f32({3}));
  expect_error([&] { exe.run({{"x", f32({2, 3})}, {"z", f32({2, 3})}}); }, {"'z'", "x"});
}

TEST_P(DeviceErrors, MissingInput) {
  auto exe = compile_xw(GetParam());
  exe.set_param("w", f32({3}));
  expect_error([&] { exe.run(std::map<std::string, ir::Tensor, std::less<>>{}); }, {"'x'", "missing"});
}

TEST_P(DeviceErrors, WrongInputShape) {
  auto exe = compile_xw(GetParam());
  exe.set_param("w", f32({3}));
  expect_error([&] { exe.run({{"x", f32({3, 2})}}); }, {"'x'", "[2,3]", "[3,2]"});
}

TEST_P(DeviceErrors, WrongInputDType) {
  auto exe = compile_xw(GetParam());
  exe.set_param("w", f32({3}));
  expect_error([&] { exe.run({{"x", ir::Tensor(DType::I32, {2, 3})}}); }, {"'x'", "f32", "i32"});
}

TEST_P(DeviceErrors, WrongOutputBuffers) {
  auto exe = compile_xw(GetParam());
  exe.set_param("w", f32({3}));
  ir::Tensor x = f32({2, 3});
  std::vector<runtime::NamedTensor> in{{"x", ir::view(x)}};
  std::vector<ir::Tensor> wrong_shape{f32({3, 2})}, too_many{f32({2, 3}), f32({2, 3})};
  expect_error([&] { exe.run_into(in, wrong_shape); }, {"output", "[2,3]", "[3,2]"});
  expect_error([&] { exe.run_into(in, too_many); }, {"1", "2", "outputs"});
}

TEST_P(DeviceErrors, SetParamWrongShapeOrDType) {
  auto exe = compile_xw(GetParam());
  expect_error([&] { exe.set_param("w", f32({4})); }, {"'w'", "[3]", "[4]"});
  expect_error([&] { exe.set_param("w", ir::Tensor(DType::F16, {3})); }, {"'w'", "f32", "f16"});
}

TEST_P(DeviceErrors, SetParamUnknownName) {
  auto exe = compile_xw(GetParam());
  expect_error([&] { exe.set_param("bias", f32({3})); }, {"'bias'", "w"});
}

TEST_P(DeviceErrors, RunBeforeParamIsSet) {
  auto exe = compile_xw(GetParam());
  expect_error([&] { exe.run({{"x", f32({2, 3})}}); }, {"'w'", "set"});
}

INSTANTIATE_TEST_SUITE_P(Conformance, DeviceErrors, ::testing::ValuesIn(backends()),
                         [](const auto& info) { return std::string(runtime::device_label(info.param)); });

// ---- IR text ---------------------------------------------------------------------

TEST(ParseText, MalformedInputs) {
  struct Case {
    std::string_view text;
    std::initializer_list<std::string_view> needles;
  };
  const Case cases[] = {
      {"", {"line 1", "graph"}},
      {"graph g {\n  %0 = input \"x\" : f32[2]\n  %1 = frobnicate %0 : f32[2]\n}", {"line 3", "frobnicate"}},
      {"graph g {\n  %0 = input \"x\" : f33[2]\n}", {"line 2", "f33"}},
      {"graph g {\n  %0 = input \"x\" : f32[2]\n  %1 = neg %7 : f32[2]\n}", {"line 3", "%7"}},
      {"graph g {\n  %0 = input \"x\" : f32[2]\n  %1 = neg %2 : f32[2]\n  %2 = neg %0 : f32[2]\n}",
       {"line 3", "forward reference"}},
      {"graph g {\n  %0 = input \"x\" : f32[2,3]\n  %1 = input \"y\" : f32[4,5]\n  %2 = matmul %0, %1 : f32[2,5]\n}",
       {"line 4", "matmul", "[2,3]", "[4,5]"}},
      {"graph g {\n  %0 = input \"x\" : f32[2]\n  output %0\n", {"end of input"}},
      {"graph g {\n  %0 = input \"x : f32[2]\n}", {"line 2", "unterminated"}},
      {"graph g {\n  %0 = input \"x\" : f32[2]\n  %1 = reduce_sum %0 {axes=[0], bogus=1} : f32[]\n}",
       {"line 3", "bogus"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(c.text));
    expect_error([&] { ir::parse_text(c.text); }, c.needles);
  }
}

// ---- backends and devices ------------------------------------------------------

// A backend that claims a handful of primitives and has no host fallback.
class NarrowBackend : public runtime::Backend {
 public:
  std::string_view name() const override { return "narrow_test"; }
  compile::BackendTraits traits() const override {
    compile::BackendTraits t;
    t.name = "narrow_test";
    t.native_ops = {OpKind::Input, OpKind::Param, OpKind::Constant, OpKind::Add, OpKind::Mul};
    t.host_fallback = false;
    return t;
  }
  std::unique_ptr<runtime::ExecutableGraph> compile_lir(const compile::LirModule&,
                                                        const compile::CompileOptions&) override {
    throw Error("narrow_test: compile_lir reached although the graph uses an unclaimed op");
  }
};

TEST(UnsupportedOp, NamesTheOpAndTheBackend) {
  runtime::register_backend(Device::Tpu, [] { return std::make_unique<NarrowBackend>(); });
  Graph g;
  auto x = g.input("x", Shape{4});
  g.add_output(g.add(g.unary(OpKind::Sin, x), x));
  Session s(Device::Tpu);
  expect_error([&] { s.compile(g); }, {"sin", "narrow_test"});
}

TEST(Devices, UnknownDeviceName) {
  expect_error([] { runtime::parse_device("quantum"); }, {"'quantum'", "cpu"});
  EXPECT_EQ(runtime::parse_device("CPU"), Device::Cpu);
  EXPECT_EQ(runtime::parse_device("nvidia"), Device::Cuda);
}

TEST(Devices, UnavailableDeviceSaysWhy) {
  // No backend is ever built for Metal on this platform's test binary.
  if (runtime::is_available(Device::Metal)) GTEST_SKIP() << "metal is available here";
  expect_error([] { Session s(Device::Metal); }, {"metal", "unavailable"});
}

}  // namespace
}  // namespace rlx::conformance
