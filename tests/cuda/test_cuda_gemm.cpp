// The CUDA backend's cuBLASLt mapping (src/backends/cuda/gemm_shape.hpp), checked on the host: each matmul
// is compiled for the backend's traits, its MatMul kernel mapped to one strided GEMM, and that GEMM run on
// the host exactly as the cuBLASLt call would compute it (column-major, our B as cuBLAS's A), against the
// reference interpreter. Needs no GPU; the GPU runs of the parity suite then test cuBLASLt itself.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <random>

#include "backends/cuda/gemm_shape.hpp"
#include "backends/cuda/layout.hpp"
#include "rlx/backends/cuda/cuda_backend.hpp"
#include "rlx/codegen/c.hpp"
#include "rlx/compile/pipeline.hpp"
#include "rlx/ir/text.hpp"
#include "rlx/reference/interpreter.hpp"
#include "support/c_module.hpp"
#include "support/testing.hpp"

namespace rlx::backends::cuda {
namespace {

using Ints = std::vector<std::int64_t>;

ir::Tensor random_tensor(const Ints& shape, std::mt19937_64& rng) {
  ir::Tensor t(ir::DType::F64, shape);
  std::uniform_real_distribution<double> u(-1, 1);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, u(rng));
  return t;
}

// The compiled graph's (last) MatMul kernel, or null.
const compile::Kernel* matmul_kernel(const compile::CompileResult& r) {
  const compile::Kernel* kernel = nullptr;
  for (const auto& k : r.lir.kernels)
    if (k.kind == compile::KernelKind::MatMul) kernel = &k;
  return kernel;
}

struct Case {
  Ints a, b;
  bool maps;  // one strided GEMM (else the generated nest runs it)
};

TEST(CudaGemm, TheCuBlasLtMappingComputesTheProduct) {
  const Case cases[] = {
      {{5, 7}, {7, 3}, true},              // plain
      {{1, 7}, {7, 9}, true},              // one row
      {{4, 5, 7}, {7, 3}, true},           // batched A, one B: a single GEMM of 20 rows
      {{5, 7}, {4, 7, 3}, true},           // one A, batched B: strided, A shared
      {{2, 3, 5, 7}, {2, 3, 7, 4}, true},  // both batched, two batch dims
      {{1, 5, 7}, {1, 7, 3}, true},        // batch dims of one
      // The compiler expands an operand whose batch dims broadcast against the other's, so these map too.
      {{2, 1, 5, 7}, {1, 3, 7, 4}, true},
      {{2, 3, 5, 7}, {3, 7, 4}, true},
  };
  std::mt19937_64 rng(testing::test_seed());
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::PrintToString(c.a) + " x " + ::testing::PrintToString(c.b));
    ir::Graph g("mm");
    g.add_output(g.matmul(g.input("a", ir::Shape(c.a), ir::DType::F64), g.input("b", ir::Shape(c.b), ir::DType::F64)));
    const auto r = compile::compile(g, traits(), {});
    const compile::Kernel* kernel = matmul_kernel(r);
    ASSERT_NE(kernel, nullptr);
    std::string why;
    const auto shape = gemm_shape(*kernel, &why);
    ASSERT_EQ(shape.has_value(), c.maps) << why;
    if (!shape) {
      EXPECT_FALSE(why.empty());
      continue;
    }
    EXPECT_TRUE(shape->f64);
    // The kernel's own operands (the compiler may have expanded one), fed to its body through the reference.
    const ir::Node &an = kernel->body.node(shape->a), &bn = kernel->body.node(shape->b);
    const ir::Tensor a = random_tensor(an.shape.extents(), rng), b = random_tensor(bn.shape.extents(), rng);
    const auto want =
        reference::run(kernel->body, {{an.attrs.get_str("name"), a}, {bn.attrs.get_str("name"), b}}).at(0);
    std::vector<double> got(std::size_t(want.numel()), std::nan(""));  // poisoned: every element must be written
    gemm_on_host(*shape, a.data_as<double>(), b.data_as<double>(), got.data());
    ASSERT_EQ(std::int64_t(got.size()), shape->rows * shape->n * (shape->stride_c ? shape->batches : 1));
    for (std::int64_t i = 0; i < want.numel(); ++i) EXPECT_NEAR(got[std::size_t(i)], want.get(i), 1e-12) << i;
  }
}

// A linear layer's [out, in] weight: B = transpose(w) joins the matmul kernel (BackendTraits::matmul_transposed_b)
// and the GEMM reads w with op T, so no transpose kernel runs; with a bias the epilogue still maps. The generated
// nest (the fallback) reads it transposed too, and NVRTC compiles it.
TEST(CudaGemm, ATransposedBIsReadWithOpT) {
  const Case cases[] = {{{5, 7}, {3, 7}, true}, {{2, 5, 7}, {2, 3, 7}, true}, {{4, 5, 7}, {3, 7}, true}};
  std::mt19937_64 rng(testing::test_seed() + 2);
  for (const Case& c : cases)
    for (bool bias : {false, true}) {
      SCOPED_TRACE(::testing::PrintToString(c.a) + " x " + ::testing::PrintToString(c.b) + "^T" +
                   (bias ? " + bias" : ""));
      ir::Graph g("linear");
      auto y = g.matmul(g.input("x", ir::Shape(c.a), ir::DType::F32),
                        g.transpose(g.input("w", ir::Shape(c.b), ir::DType::F32)));
      if (bias) y = g.add(y, g.input("bias", ir::Shape{c.b[c.b.size() - 2]}, ir::DType::F32));
      g.add_output(y);
      const auto r = compile::compile(g, traits(), {});
      for (const auto& k : r.lir.kernels) EXPECT_NE(k.kind, compile::KernelKind::Movement) << k.name;
      const compile::Kernel* kernel = matmul_kernel(r);
      ASSERT_NE(kernel, nullptr);
      std::string why;
      const auto shape = gemm_shape(*kernel, &why);
      ASSERT_TRUE(shape.has_value()) << why;
      EXPECT_TRUE(shape->trans_b);
      EXPECT_EQ(shape->epilogue.has_value(), bias && shape->batches == 1);
      const auto m = emit(r.lir);
      for (std::size_t i = 0; i < r.lir.kernels.size(); ++i) EXPECT_EQ(m.kernels[i].why, "") << r.lir.kernels[i].name;
      if (nvrtc_unavailable_reason().empty()) EXPECT_GT(compile_for_arch(m.source, "compute_90"), 0u);
      if (testing::have_c_compiler()) {  // the same nest in C on the host: B read through its transposed strides
        std::mt19937_64 feed(testing::test_seed());
        reference::TensorMap in;
        for (auto id : g.input_ids()) {
          const auto& n = g.node(id);
          in[n.attrs.get_str("name")] = testing::random_tensor(n.dtype, n.shape.extents(), feed);
        }
        testing::CModule c_module(codegen::c::emit(r.lir));
        ASSERT_TRUE(c_module.error().empty()) << c_module.error();
        EXPECT_TRUE(testing::tensors_close(c_module.run(in, {}).at(0), reference::run(g, in, {}).at(0)));
      }
      // The GEMM on the host, in double, against the kernel's body through the reference.
      reference::TensorMap ins;
      std::map<ir::NodeId, std::vector<double>> wide;
      for (const auto& n : kernel->body.nodes())
        if (n.op == ir::OpKind::Input) {
          const ir::Tensor t64 = random_tensor(n.shape.extents(), rng);
          ir::Tensor t32(ir::DType::F32, n.shape.extents());
          for (std::int64_t i = 0; i < t64.numel(); ++i) t32.set(i, double(float(t64.get(i))));
          wide[n.id].resize(std::size_t(t32.numel()));
          for (std::int64_t i = 0; i < t32.numel(); ++i) wide[n.id][std::size_t(i)] = t32.get(i);
          ins[n.attrs.get_str("name")] = std::move(t32);
        }
      const auto want = reference::run(kernel->body, ins).at(0);
      std::vector<double> got(std::size_t(want.numel()), std::nan(""));
      const auto& e = shape->epilogue;
      gemm_on_host(*shape, wide[shape->a].data(), wide[shape->b].data(), got.data(),
                   e && e->bias ? wide[*e->bias].data() : nullptr,
                   e && e->residual ? wide[*e->residual].data() : nullptr);
      if (bias && !e) continue;  // the bias runs in the generated epilogue: the product alone is not the output
      for (std::int64_t i = 0; i < want.numel(); ++i) EXPECT_NEAR(got[std::size_t(i)], want.get(i), 1e-5) << i;
    }
}

// Kernels as a backend may be handed them, with operands the compiler did not expand: one A for every batch
// of B (stride 0), and batch dims that broadcast partially, which must not map.
TEST(CudaGemm, SharedOperandsMapAndPartialBroadcastsDoNot) {
  std::mt19937_64 rng(testing::test_seed() + 1);
  const Case cases[] = {{{5, 7}, {4, 7, 3}, true},
                        {{1, 1, 5, 7}, {2, 3, 7, 4}, true},
                        {{2, 1, 5, 7}, {1, 3, 7, 4}, false},
                        {{2, 3, 5, 7}, {3, 7, 4}, false}};
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::PrintToString(c.a) + " x " + ::testing::PrintToString(c.b));
    compile::Kernel k;
    k.kind = compile::KernelKind::MatMul;
    auto a = k.body.input("in0", ir::Shape(c.a), ir::DType::F64),
         b = k.body.input("in1", ir::Shape(c.b), ir::DType::F64);
    k.body.add_output(k.body.matmul(a, b));
    std::string why;
    const auto shape = gemm_shape(k, &why);
    ASSERT_EQ(shape.has_value(), c.maps) << why;
    if (!shape) {
      EXPECT_EQ(why, "batch dims broadcast partially");
      continue;
    }
    const ir::Tensor av = random_tensor(c.a, rng), bv = random_tensor(c.b, rng);
    const auto want = reference::run(k.body, {{"in0", av}, {"in1", bv}}).at(0);
    std::vector<double> got(std::size_t(want.numel()), std::nan(""));
    gemm_on_host(*shape, av.data_as<double>(), bv.data_as<double>(), got.data());
    for (std::int64_t i = 0; i < want.numel(); ++i) EXPECT_NEAR(got[std::size_t(i)], want.get(i), 1e-12) << i;
  }
}

// bf16 and f16 matmuls: the compiler computes them in f32 (casts around), the lowering puts the widening casts
// in the matmul kernel, and the GEMM reads the operands as stored; a product whose one use is the cast back is
// written in the narrow type by the GEMM itself, any other epilogue reads an f32 product.
TEST(CudaGemm, NarrowOperandsAreReadAsStored) {
  for (ir::DType t : {ir::DType::BF16, ir::DType::F16}) {
    for (bool bias : {false, true}) {
      SCOPED_TRACE(std::string(ir::dtype_name(t)) + (bias ? " with a bias" : ""));
      ir::Graph g("mm");
      auto y = g.matmul(g.param("a", {64, 32}, t), g.param("b", {32, 48}, t));
      if (bias) y = g.add(y, g.param("c", {48}, t));
      g.add_output(y);
      const auto r = compile::compile(g, traits(), {});
      std::size_t matmuls = 0;
      for (const auto& k : r.lir.kernels) {
        if (k.kind != compile::KernelKind::MatMul) continue;
        ++matmuls;
        std::string why;
        const auto shape = gemm_shape(k, &why);
        ASSERT_TRUE(shape) << why;
        EXPECT_EQ(shape->operands, t);
        EXPECT_EQ(k.body.node(shape->a).dtype, t);
        EXPECT_EQ(k.body.node(shape->b).dtype, t);
        EXPECT_EQ(shape->cast_output, !bias);
        EXPECT_EQ(shape->result, bias ? ir::DType::F32 : t);
        EXPECT_EQ(shape->rows, 64);
        EXPECT_EQ(shape->n, 48);
        EXPECT_EQ(shape->k, 32);
      }
      EXPECT_EQ(matmuls, 1u) << "the casts fuse into one matmul kernel";
    }
  }
  // Operands of two types (a kernel a backend may be handed, widened from bf16 and f16) are not one GEMM.
  compile::Kernel k;
  k.kind = compile::KernelKind::MatMul;
  auto a = k.body.cast(k.body.input("in0", {8, 8}, ir::DType::BF16), ir::DType::F32);
  auto b = k.body.cast(k.body.input("in1", {8, 8}, ir::DType::F16), ir::DType::F32);
  k.body.add_output(k.body.matmul(a, b));
  std::string why;
  EXPECT_FALSE(gemm_shape(k, &why));
  EXPECT_EQ(why, "operands of two types");
}

// cuBLASLt's epilogue, D = relu?(A B + C + bias): the kernels whose rest is only a bias row, a residual (as C)
// and a relu map with it, and computed as the call computes them they match the reference on the kernel's
// body; any other rest keeps the product and the epilogue kernel.
TEST(CudaGemm, BiasResidualAndReluRunInCuBlasLtsEpilogue) {
  using Rest = std::function<ir::NodeId(ir::Graph&, ir::NodeId product)>;
  struct EpilogueCase {
    const char* name;
    Rest rest;
    bool fuses, bias, residual, relu;
  };
  const ir::Shape rows{2, 4, 16};  // a batched A against one weight: one GEMM of 8 rows
  auto bias = [](ir::Graph& g) { return g.param("bias", {16}); };
  auto residual = [&](ir::Graph& g) { return g.input("r", rows); };
  const EpilogueCase cases[] = {
      {"bias", [&](ir::Graph& g, ir::NodeId p) { return g.add(p, bias(g)); }, true, true, false, false},
      {"bias, relu", [&](ir::Graph& g, ir::NodeId p) { return g.relu(g.add(p, bias(g))); }, true, true, false, true},
      {"residual + (bias)", [&](ir::Graph& g, ir::NodeId p) { return g.add(residual(g), g.add(p, bias(g))); }, true,
       true, true, false},
      {"relu(residual then bias)",
       [&](ir::Graph& g, ir::NodeId p) { return g.relu(g.add(g.add(p, residual(g)), bias(g))); }, true, true, true,
       true},
      {"residual", [&](ir::Graph& g, ir::NodeId p) { return g.add(p, residual(g)); }, true, false, true, false},
      {"relu", [&](ir::Graph& g, ir::NodeId p) { return g.relu(p); }, true, false, false, true},
      {"gelu after the bias", [&](ir::Graph& g, ir::NodeId p) { return g.unary(ir::OpKind::Gelu, g.add(p, bias(g))); },
       false},
      {"relu before the bias", [&](ir::Graph& g, ir::NodeId p) { return g.add(g.relu(p), bias(g)); }, false},
      {"two biases", [&](ir::Graph& g, ir::NodeId p) { return g.add(g.add(p, bias(g)), g.param("c", {16})); }, false},
      {"a column, not a row",
       [&](ir::Graph& g, ir::NodeId p) {
         return g.add(p, g.param("col", {4, 1}));
       },
       false},
      {"scaled", [&](ir::Graph& g, ir::NodeId p) { return g.mul(p, g.scalar(2.0)); }, false},
  };
  std::mt19937_64 rng(testing::test_seed() + 2);
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    ir::Graph g("epilogue");
    g.add_output(c.rest(g, g.matmul(g.input("x", {2, 4, 8}), g.param("w", {8, 16}))));
    const auto r = compile::compile(g, traits(), {});
    const compile::Kernel* kernel = matmul_kernel(r);
    ASSERT_NE(kernel, nullptr);
    std::string why;
    const auto shape = gemm_shape(*kernel, &why);
    ASSERT_TRUE(shape) << why;
    ASSERT_EQ(shape->epilogue.has_value(), c.fuses) << ir::to_text(kernel->body);
    if (!c.fuses) continue;
    const auto& e = *shape->epilogue;
    EXPECT_EQ(e.bias.has_value(), c.bias);
    EXPECT_EQ(e.residual.has_value(), c.residual);
    EXPECT_EQ(e.relu, c.relu);
    EXPECT_EQ(shape->rows, 8);
    EXPECT_EQ(shape->batches, 1);
    // Every Input of the body random in f32; the call's operands widened to double.
    reference::TensorMap in;
    std::map<ir::NodeId, std::vector<double>> wide;
    for (const auto& n : kernel->body.nodes()) {
      if (n.op != ir::OpKind::Input) continue;
      const auto t = testing::random_tensor(ir::DType::F32, n.shape.extents(), rng);
      in.emplace(n.attrs.get_str("name"), t);
      auto& w = wide[n.id];
      for (std::int64_t i = 0; i < t.numel(); ++i) w.push_back(t.get(i));
    }
    const auto want = reference::run(kernel->body, in).at(0);
    std::vector<double> got(std::size_t(want.numel()), std::nan(""));
    gemm_on_host(*shape, wide[shape->a].data(), wide[shape->b].data(), got.data(),
                 e.bias ? wide[*e.bias].data() : nullptr, e.residual ? wide[*e.residual].data() : nullptr);
    for (std::int64_t i = 0; i < want.numel(); ++i) EXPECT_NEAR(got[std::size_t(i)], want.get(i), 1e-5) << i;
  }
}

TEST(CudaGemm, OnlyFloatMatmulsMap) {
  ir::Graph g("mm");
  g.add_output(g.matmul(g.input("a", {3, 4}, ir::DType::I32), g.input("b", {4, 2}, ir::DType::I32)));
  const auto r = compile::compile(g, traits(), {});
  for (const auto& k : r.lir.kernels) {
    if (k.kind != compile::KernelKind::MatMul) continue;
    std::string why;
    EXPECT_FALSE(gemm_shape(k, &why));
    EXPECT_EQ(why, "not f32 or f64");
  }
}

}  // namespace
}  // namespace rlx::backends::cuda
