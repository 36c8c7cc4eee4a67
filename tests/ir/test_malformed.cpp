// The malformed-input corpus: every hostile input gives an rlx::Error whose
// message names the problem, never a crash, another exception or a silent
// wrong answer. Three sources: IR text (tests/malformed/ir_text.txt, shared
// with the Python and CLI tests), graphs built in code, and wrong run-time
// inputs to a compiled graph.
#include <gtest/gtest.h>

#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "rlx/error.hpp"
#include "rlx/ir/control_flow.hpp"
#include "rlx/ir/custom_op.hpp"
#include "rlx/ir/limits.hpp"
#include "rlx/ir/text.hpp"
#include "rlx/reference/interpreter.hpp"
#include "rlx/runtime/session.hpp"
#include "support/testing.hpp"

namespace rlx {
namespace {

using ir::DType;
using ir::Graph;
using ir::NodeId;
using ir::Shape;
using testing::expect_error;

constexpr std::int64_t kBig = std::int64_t(1) << 32;

struct TextCase {
  std::string words;  // what the message must contain
  std::string text;
};

std::vector<TextCase> read_corpus() {
  std::ifstream in(std::string(RLX_SOURCE_DIR) + "/tests/malformed/ir_text.txt", std::ios::binary);
  std::vector<TextCase> cases;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("=== ", 0) == 0)
      cases.push_back({line.substr(4), ""});
    else if (!cases.empty())
      cases.back().text += line + "\n";
  }
  return cases;
}

TEST(Malformed, IrTextCorpusGivesClearErrors) {
  const auto cases = read_corpus();
  ASSERT_GE(cases.size(), 90u);
  for (const auto& c : cases) {
    SCOPED_TRACE("case: " + c.words);
    expect_error([&] { ir::parse_text(c.text); }, {c.words});
  }
}

// The cases too large for the corpus file.
TEST(Malformed, HugeTextInputsGiveClearErrors) {
  std::string deep = "graph g {\n";
  for (int i = 0; i < 30000; ++i) deep += "body @b = graph n {\n";
  expect_error([&] { ir::parse_text(deep); }, {"bodies nest more than 64 levels deep"});

  const std::string long_name = "graph g { %x = input \"" + std::string((1 << 20) + 1, 'a') + "\" : f32[2] }";
  expect_error([&] { ir::parse_text(long_name); }, {"a string is longer than 1048576 bytes"});

  // Dim expressions as long as the text allows: each is refused early, not after quadratic work or a
  // recursion per token.
  std::string product = "B";
  for (int i = 0; i < 100000; ++i) product += "*B";
  for (const auto& [dims, words] : std::vector<std::pair<std::string, std::string>>{
           {std::string(100000, '-') + "B", "nested more than 64 levels"},
           {std::string(100000, '(') + "B" + std::string(100000, ')'), "nested more than 64 levels"},
           {product, "a product of more than 64 factors"}}) {
    SCOPED_TRACE(words);
    expect_error([&] { ir::parse_text("graph g {\n  %x = input \"x\" : f32[" + dims + "]\n}"); }, {words});
  }

  std::string concat = "graph g {\n  %x = input \"x\" : f32[1]\n  %1 = concat %x";
  for (int i = 1; i < 20000; ++i) concat += ", %x";
  concat += " {axis=0} : f32[20000]\n}\n";
  expect_error([&] { ir::parse_text(concat); }, {"concat takes 1 to 64 operands, got 20000"});
}

// An error about a node with 20,000 inputs lists a few and counts the rest.
TEST(Malformed, ErrorMessagesCapTheirLists) {
  Graph g;
  auto x = g.input("x", {1});
  try {
    g.concat(std::vector<NodeId>(20000, x), 0);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("expects 1 to 64 inputs, got 20000"), std::string::npos) << msg.substr(0, 600);
    EXPECT_NE(msg.find("and 19992 more"), std::string::npos) << msg.substr(0, 600);
    EXPECT_LT(msg.size(), 1000u) << "lists in messages are capped";
  }
}

// ---- graphs built in code ---------------------------------------------------

class ForeignLowering final : public ir::OpExtension {
 public:
  explicit ForeignLowering(NodeId foreign) : foreign_(foreign) {}
  std::string_view name() const override { return "test_foreign_lowering"; }
  int num_inputs() const override { return 1; }
  ir::TypeInfo infer(std::span<const ir::TypeInfo> in, const ir::Attrs&) const override { return in[0]; }
  std::optional<NodeId> lower(Graph&, std::span<const NodeId>, const ir::Attrs&) const override { return foreign_; }

 private:
  NodeId foreign_;
};

class BadInfer final : public ir::OpExtension {
 public:
  std::string_view name() const override { return "test_bad_infer"; }
  int num_inputs() const override { return 1; }
  ir::TypeInfo infer(std::span<const ir::TypeInfo> in, const ir::Attrs&) const override {
    return {in[0].dtype, Shape{-3}};
  }
  std::optional<NodeId> lower(Graph&, std::span<const NodeId> in, const ir::Attrs&) const override { return in[0]; }
};

TEST(Malformed, HostileGraphsBuiltInCodeGiveClearErrors) {
  {
    Graph g;
    expect_error([&] { g.input("x", Shape{kBig, kBig}); }, {"more than 2^48 elements"});
    expect_error([&] { g.input("y", Shape{-1}); }, {"negative"});
    expect_error([&] { g.input("z", Shape(std::vector<std::int64_t>(65, 1))); }, {"rank 65"});
  }
  {
    Graph g;
    auto x = g.input("x", {1});
    expect_error([&] { g.expand(x, Shape{kBig, kBig}); }, {"more than 2^48 elements", "expand"});
    expect_error([&] { g.reshape(x, std::vector<std::int64_t>{kBig, kBig}); }, {"2^48"});
    expect_error([&] { g.iota(Shape{kBig, kBig}, 0); }, {"more than 2^48 elements"});
  }
  {
    Graph g;
    auto x = g.input("x", {1, 1, 4});
    auto w = g.input("w", {1, 1, 3});
    expect_error([&] { g.conv1d(x, w, std::nullopt, 1, 0, std::int64_t(1) << 62); }, {"overflows int64"});
    auto p = g.input("p", {2, 3});
    expect_error([&] { g.pad(p, {0, std::numeric_limits<std::int64_t>::max(), 0, 1}); }, {"overflows int64"});
    expect_error([&] { g.softmax(p, 2); }, {"axis 2 is out of range for rank 2"});
    expect_error([&] { g.permute(p, {1, 1}); }, {"not a permutation"});
    expect_error([&] { g.max_pool2d(g.input("img", {1, 1, 4, 4}), {2, 2}, {0, 0}); }, {"must be >= 1"});
    expect_error([&] { g.clamp(g.input("i", {2}, DType::I32), std::nan(""), 1.0); }, {"NaN bound"});
  }
  {
    // A slice whose step is int64's max: one element per axis, not a wrapped extent.
    Graph g;
    auto x = g.input("x", {5});
    auto s = g.slice(x, {0}, {0}, {5}, {std::numeric_limits<std::int64_t>::max()});
    EXPECT_EQ(g.node(s).shape, Shape{1});
  }
  {
    Graph g;
    auto x = g.input("x", {2});
    expect_error([&] { g.add_declared(ir::OpKind::Neg, {x}, {}, DType::F32, Shape{5}); },
                 {"declared f32[5] but inference gives f32[2]"});
    expect_error([&] { g.add(ir::OpKind::Neg, {x, x}); }, {"expects 1 inputs, got 2"});
    expect_error([&] { g.add(ir::OpKind::Neg, {99}); }, {"does not exist"});
    expect_error([&] { g.add_output(77); }, {"node %77 does not exist"});
  }
  {
    // Control flow nested past the limit, built in code.
    Graph inner("leaf");
    inner.add_output(inner.input("v", {}), "v");
    auto body = ir::body_ref(std::move(inner));
    try {
      for (int depth = 0; depth < 80; ++depth) {
        Graph outer("level" + std::to_string(depth));
        auto v = outer.input("v", {});
        auto flag = outer.constant(ir::Tensor::scalar(DType::Bool, 1));
        outer.add_output(ir::if_else(outer, flag, body, body, {v})[0]);
        body = ir::body_ref(std::move(outer));
      }
      FAIL() << "80 nested ifs were accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("more than the limit of 64"), std::string::npos) << e.what();
    }
  }
  {
    Graph cond("c"), step("b");
    auto c0 = cond.input("v", {});
    cond.add_output(cond.binary(ir::OpKind::Lt, c0, cond.scalar(1.0)));
    step.add_output(step.input("v", {}));
    Graph g;
    auto x = g.input("x", {});
    expect_error([&] { ir::while_loop(g, ir::body_ref(cond), ir::body_ref(step), {x}, {}, -3); },
                 {"max_trip_count is -3"});
  }
  {
    Graph other;
    other.input("a", {2});
    other.input("b", {2});
    auto foreign = other.input("c", {2});  // %2: a node of another graph
    ir::register_op(std::make_shared<ForeignLowering>(foreign));
    Graph g;
    auto x = g.input("x", {2});
    g.add_output(g.custom_op("test_foreign_lowering", {}, {x}));
    Session session(Device::Cpu);
    expect_error([&] { session.compile(g); }, {"test_foreign_lowering", "returned node %"});
  }
  {
    ir::register_op(std::make_shared<BadInfer>());
    Graph g;
    auto x = g.input("x", {2});
    expect_error([&] { g.custom_op("test_bad_infer", {}, {x}); }, {"negative extent -3"});
  }
  {
    Graph g;
    auto x = g.input("x", Shape(std::vector<ir::Dim>{ir::Dim::symbol("B"), ir::Dim(4)}));
    g.add_output(g.relu(x));
    Session session(Device::Cpu);
    compile::CompileOptions unknown;
    unknown.bind = {{"B", 2}, {"Q", 3}};
    expect_error([&] { session.compile(g, unknown); }, {"cannot bind the symbol 'Q'", "the symbols B"});
    compile::CompileOptions negative;
    negative.bind = {{"B", -4}};
    expect_error([&] { session.compile(g, negative); }, {"bound to -4"});
    compile::CompileOptions huge;
    huge.bind = {{"B", std::int64_t(1) << 50}};
    expect_error([&] { session.compile(g, huge); }, {"2^48"});
    compile::CompileOptions dump;
    dump.bind = {{"B", 2}};
    dump.dump = "hir,mirr";
    expect_error([&] { session.compile(g, dump); }, {"unknown level or pass 'mirr'", "known: hir"});
  }
  {
    // Valid shapes, but more memory than the machine has: refused at compile, before any allocation.
    const std::int64_t too_many = ir::limits::physical_memory_bytes() / 4 + 1024;
    Graph g;
    g.add_output(g.relu(g.param("w", Shape{too_many})));
    Session session(Device::Cpu);
    expect_error([&] { session.compile(g); }, {"more than this machine's"});
    expect_error([&] { ir::Tensor(DType::F32, {too_many}); }, {"more than this machine's"});
    Graph leaf;
    leaf.add_output(leaf.iota(Shape{too_many}, 0, DType::F32));
    expect_error([&] { reference::run(leaf, {}, {}); }, {"more than this machine's"});
  }
}

// ---- wrong run-time inputs --------------------------------------------------

TEST(Malformed, WrongRunTimeInputsGiveClearErrors) {
  Graph g("net");
  auto x = g.input("x", {2, 3});
  auto w = g.param("w", {3, 4});
  g.add_output(g.matmul(x, w), "y");
  Session session(Device::Cpu);
  auto c = session.compile(g);
  const ir::Tensor good_x(DType::F32, {2, 3}), good_w(DType::F32, {3, 4});
  const ir::Tensor wrong_shape(DType::F32, {3, 2}), wrong_dtype(DType::F16, {2, 3}), rank1(DType::F32, {6});

  expect_error([&] { c.run({{"x", good_x}}); }, {"param", "'w'"});  // params unset
  c.set_param("w", good_w);
  expect_error([&] { c.set_param("w", wrong_shape); }, {"'w'", "[3,4]"});
  expect_error([&] { c.set_param("v", good_w); }, {"'v'"});
  expect_error([&] { c.set_param("w", ir::Tensor(DType::I32, {3, 4})); }, {"'w'", "i32"});
  expect_error([&] { c.run(std::map<std::string, ir::Tensor, std::less<>>{}); }, {"'x'"});
  expect_error([&] { c.run({{"x", wrong_shape}}); }, {"'x'", "[2,3]"});
  expect_error([&] { c.run({{"x", wrong_dtype}}); }, {"'x'", "f16"});
  expect_error([&] { c.run({{"x", rank1}}); }, {"'x'"});
  expect_error([&] { c.run({{"x", good_x}, {"typo", good_x}}); }, {"'typo'"});

  std::vector<std::int64_t> shape{2, 3};
  std::vector<runtime::NamedTensor> short_bytes{{"x", ir::TensorView{DType::F32, shape, good_x.data(), 8}}};
  expect_error([&] { c.run(short_bytes); }, {"'x'", "bytes"});
  std::vector<runtime::NamedTensor> null_data{{"x", ir::TensorView{DType::F32, shape, nullptr, 24}}};
  expect_error([&] { c.run(null_data); }, {"'x'", "no data"});

  std::vector<ir::Tensor> wrong_out{ir::Tensor(DType::F32, {4, 2})};
  std::vector<runtime::NamedTensor> ok{{"x", ir::view(good_x)}};
  expect_error([&] { c.run_into(ok, wrong_out); }, {"output"});
  std::vector<ir::Tensor> no_outs;
  expect_error([&] { c.run_into(ok, no_outs); }, {"output"});
  expect_error([&] { c.ir("lirr"); }, {"lirr"});
  // After every refusal the graph still runs.
  EXPECT_EQ(c.run({{"x", good_x}}).size(), 1u);
}

}  // namespace
}  // namespace rlx
