// The CUDA backend's quantized kernels (src/backends/cuda/quant.hpp). Without a GPU: the block formats' parts
// (quant_code.inc, the text the kernels dequantize with) expanded as host code and checked against
// rlx::ir::dequantize bit for bit for every type; the q8 activation rounding against the reference
// interpreter's; NVRTC compiles the program; the Native kernels a GGUF model compiles to are all planned as
// device launches (no host step in a decode graph). On a GPU, quantized_matmul, dequantize and embedding run
// against the reference (the op-parity suite covers every type and shape as well).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backends/cuda/attention.hpp"
#include "backends/cuda/quant.hpp"
#include "rlx/backends/cuda/cuda_backend.hpp"
#include "rlx/compile/pipeline.hpp"
#include "rlx/ir/quants.hpp"
#include "rlx/llm/model.hpp"
#include "rlx/reference/interpreter.hpp"
#include "rlx/runtime/session.hpp"
#include "support/testing.hpp"

// quant_code.inc as host C++, with the device macros' host meanings: plain f32 operations, never contracted
// (the CUDA side uses __fmul_rn and the like), the bit casts, round-half-even.
#pragma GCC optimize("fp-contract=off")
namespace rlx::backends::cuda::host_parts {
inline float rlx_qmul(float a, float b) { return a * b; }
inline float rlx_qadd(float a, float b) { return a + b; }
inline float rlx_qsub(float a, float b) { return a - b; }
inline int rlx_qnearest(float v) {  // ggml's nearest_int (exact in the range the rounding uses)
  const float t = v + 12582912.0f;
  return static_cast<int>(std::bit_cast<unsigned>(t) & 0x007fffffu) - 0x00400000;
}
#define RLX_QD inline
#define RLX_QMUL(a, b) rlx_qmul((a), (b))
#define RLX_QADD(a, b) rlx_qadd((a), (b))
#define RLX_QSUB(a, b) rlx_qsub((a), (b))
#define RLX_QBITS2F(u) std::bit_cast<float>(static_cast<unsigned>(u))
#define RLX_QF2BITS(f) std::bit_cast<unsigned>(f)
#define RLX_QRINT(x) std::nearbyint(x)
#define RLX_QNEAREST(x) rlx_qnearest(x)
#define RLX_CUDA_QUANT_CODE(...) __VA_ARGS__
#include "backends/cuda/quant_code.inc"
#undef RLX_CUDA_QUANT_CODE
}  // namespace rlx::backends::cuda::host_parts

namespace rlx::backends::cuda {
namespace {

using ir::DType;
using ir::Graph;
using ir::Shape;

using PartFn = void (*)(const unsigned char*, int, float*, int*);
PartFn part_of(DType t) {
  using namespace host_parts;
  switch (t) {
    case DType::Q4_0: return rlx_q_part_q4_0;
    case DType::Q4_1: return rlx_q_part_q4_1;
    case DType::Q5_0: return rlx_q_part_q5_0;
    case DType::Q5_1: return rlx_q_part_q5_1;
    case DType::Q8_0: return rlx_q_part_q8_0;
    case DType::Q8_1: return rlx_q_part_q8_1;
    case DType::Q2_K: return rlx_q_part_q2_k;
    case DType::Q3_K: return rlx_q_part_q3_k;
    case DType::Q4_K: return rlx_q_part_q4_k;
    case DType::Q5_K: return rlx_q_part_q5_k;
    case DType::Q6_K: return rlx_q_part_q6_k;
    case DType::Q8_K: return rlx_q_part_q8_k;
    default: return nullptr;
  }
}

// Every part of random blocks (any bytes: NaN and subnormal scales too) gives ir::dequantize's bits, and the
// parts of a block cover each of its elements once.
TEST(CudaQuant, PartsDequantizeEveryTypeBitForBit) {
  std::mt19937_64 rng(testing::test_seed());
  for (DType t : ir::kBlockDTypes) {
    SCOPED_TRACE(std::string(ir::dtype_name(t)));
    const PartFn part = part_of(t);
    ASSERT_NE(part, nullptr);
    const std::size_t elems = ir::block_elems(t), bytes = ir::block_bytes(t), blocks = 64;
    std::vector<std::byte> q(blocks * bytes);
    for (auto& b : q) b = std::byte(rng() & 0xff);
    std::vector<float> want(blocks * elems);
    ir::dequantize(t, q, want);
    for (std::size_t b = 0; b < blocks; ++b) {
      std::vector<int> seen(elems, 0);
      for (int p = 0; p < int(elems / 8); ++p) {
        float v[8];
        int e[2] = {-1, -1};
        part(reinterpret_cast<const unsigned char*>(q.data()) + b * bytes, p, v, e);
        for (int j = 0; j < 8; ++j) {
          const int at = e[j >> 2] + (j & 3);
          ASSERT_TRUE(at >= 0 && at < int(elems)) << "part " << p << " element " << at;
          ++seen[std::size_t(at)];
          // Random bytes make some scales inf or NaN: a NaN's sign and payload depend on the instruction that made
          // it (x86's default NaN is negative, a GPU's positive), so NaN only has to stay NaN.
          const float w = want[b * elems + std::size_t(at)];
          if (std::isnan(w) && std::isnan(v[j])) continue;
          EXPECT_EQ(std::bit_cast<std::uint32_t>(v[j]), std::bit_cast<std::uint32_t>(w))
              << "block " << b << " part " << p << " element " << at << ": " << v[j] << " vs "
              << want[b * elems + std::size_t(at)];
        }
      }
      for (std::size_t i = 0; i < elems; ++i) ASSERT_EQ(seen[i], 1) << "element " << i << " of block " << b;
    }
  }
}

// The q8 rounding (what the GEMV applies to each lane's x values once the block's largest magnitude is known)
// against the reference's quantized_matmul{activations="q8"} with an identity weight, which returns the rounded
// activations themselves: Q8_0 blocks with d = 1 and one quant of 1 (the 32-element path) and Q4_K blocks with
// every scale 1 and min 0 (the Q8_K path). Ties, zeros, a constant block and a block holding +-max included.
TEST(CudaQuant, Q8RoundingMatchesTheReference) {
  std::mt19937_64 rng(testing::test_seed());
  for (DType t : {DType::Q8_0, DType::Q4_K}) {
    SCOPED_TRACE(std::string(ir::dtype_name(t)));
    const std::int64_t K = std::int64_t(ir::block_elems(t)) * 4;
    const std::size_t B = ir::block_elems(t);
    // The identity [K, K] in blocks.
    std::vector<std::byte> w(std::size_t(K) * std::size_t(K / std::int64_t(B)) * ir::block_bytes(t), std::byte{0});
    for (std::int64_t n = 0; n < K; ++n) {
      std::byte* blk = w.data() + std::size_t(n / std::int64_t(B) + n * (K / std::int64_t(B))) * ir::block_bytes(t);
      const std::size_t l = std::size_t(n) % B;
      if (t == DType::Q8_0) {
        blk[1] = std::byte{0x3c};  // f16 1.0
        blk[2 + l] = std::byte{1};
      } else {
        blk[1] = std::byte{0x3c};  // d = 1, dmin = 0
        const unsigned char scales[12] = {1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1};
        std::memcpy(blk + 4, scales, 12);
        const std::size_t s = l / 32;
        blk[16 + 32 * (s / 2) + l % 32] = std::byte(1u << (4 * (s % 2)));
      }
    }
    ir::Tensor wt(t, {K, K});
    std::memcpy(wt.data(), w.data(), w.size());
    std::vector<float> x(static_cast<std::size_t>(K));
    std::uniform_real_distribution<float> u(-3, 3);
    for (auto& v : x) v = u(rng);
    for (std::size_t j = 0; j < B; ++j) x[j] = 0;                                         // a zero block
    for (std::size_t j = B; j < 2 * B; ++j) x[j] = 0.75f;                                 // a constant block
    x[2 * B] = -2.54f, x[2 * B + 1] = 2.54f, x[2 * B + 2] = 1.27f, x[2 * B + 3] = 0.01f;  // +-max, a tie at .5
    Graph g("q8");
    auto xi = g.input("x", Shape{1, K});
    g.add_output(g.quantized_matmul(xi, g.param("w", Shape{K, K}, t), "q8"), "y");
    ir::Tensor xt(DType::F32, {1, K});
    std::memcpy(xt.data(), x.data(), x.size() * sizeof(float));
    const ir::Tensor want = reference::run(g, {{"x", xt}}, {{"w", wt}}).at(0);
    for (std::size_t b0 = 0; b0 < std::size_t(K); b0 += B) {
      float amax = 0, max = 0;
      for (std::size_t j = b0; j < b0 + B; ++j)
        if (std::fabs(x[j]) > amax) amax = std::fabs(x[j]), max = x[j];
      for (std::size_t j = b0; j < b0 + B; ++j) {
        const float got = B == 32 ? host_parts::rlx_q8_32(x[j], amax) : host_parts::rlx_q8_k(x[j], max, 0);
        EXPECT_EQ(got, float(want.get(std::int64_t(j)))) << "element " << j << " = " << x[j];
      }
    }
  }
  EXPECT_TRUE(std::isnan(host_parts::rlx_q8_k(1.0f, 2.0f, 1)));
  EXPECT_TRUE(std::isnan(host_parts::rlx_q8_32(NAN, 2.0f)));
}

TEST(CudaQuant, ProgramCompilesWithNvrtc) {
  if (auto why = nvrtc_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  // Every block type's program, for the machine code of the H200's sm_90 (PTX alone would leave ptxas's
  // checks, register limits included, to the first run there).
  for (DType t : ir::kBlockDTypes) {
    SCOPED_TRACE(std::string(ir::dtype_name(t)));
    const std::string& program = quant_program(t);
    for (const char* kind : {"qmm", "deq", "emb"})
      EXPECT_NE(program.find("rlx_" + std::string(kind) + "_" + std::string(ir::dtype_name(t)) + "("),
                std::string::npos)
          << kind;
    EXPECT_GT(compile_for_arch(program, "sm_90"), 0u);
  }
  const std::string& plain = quant_program(DType::F32);
  for (int b : {1, 2, 4, 8}) EXPECT_NE(plain.find("rlx_emb_b" + std::to_string(b) + "("), std::string::npos);
  EXPECT_GT(compile_for_arch(plain, "sm_90"), 0u);
}

// The planned launch of the one Native kernel of `g` compiled for the backend's traits.
QuantLaunch plan_only(const Graph& g) {
  const auto lir = compile::compile(g, traits(), {}).lir;
  QuantLaunch l;
  std::size_t natives = 0;
  for (const auto& k : lir.kernels) {
    if (k.kind != compile::KernelKind::Native) continue;
    ++natives;
    std::string why;
    EXPECT_TRUE(plan_quant(lir, k, &l, &why)) << k.name << ": " << why;
  }
  EXPECT_EQ(natives, 1u) << lir.to_text();
  return l;
}

TEST(CudaQuant, KernelsStayWholeAndArePlanned) {
  for (DType t : ir::kBlockDTypes) {
    SCOPED_TRACE(std::string(ir::dtype_name(t)));
    const std::int64_t K = 2 * std::int64_t(ir::block_elems(t));
    for (const char* act : {"f32", "q8"}) {
      if (std::string_view(act) == "q8" && (t == DType::Q8_1 || t == DType::Q8_K)) continue;
      Graph g("qmm");
      g.add_output(g.quantized_matmul(g.input("x", Shape{2, 9, K}), g.param("w", Shape{7, K}, t), act), "y");
      const QuantLaunch l = plan_only(g);
      EXPECT_EQ(l.entry, "rlx_qmm_" + std::string(ir::dtype_name(t)));
      EXPECT_EQ(l.program, t);
      EXPECT_EQ(l.scalars, (std::vector<std::int64_t>{18, 7, K, std::string_view(act) == "q8" ? 1 : 0}));
      EXPECT_EQ(l.buffers.size(), 3u);
      EXPECT_EQ(l.block % 32, 0u);
    }
    {
      Graph g("deq");
      g.add_output(g.dequantize(g.input("x", Shape{3, K}, t)), "y");
      const QuantLaunch l = plan_only(g);
      EXPECT_EQ(l.entry, "rlx_deq_" + std::string(ir::dtype_name(t)));
      EXPECT_EQ(l.scalars, (std::vector<std::int64_t>{6}));
    }
    {
      Graph g("emb");
      g.add_output(g.embedding(g.param("table", Shape{10, K}, t), g.input("ids", Shape{2, 3}, DType::I64)), "y");
      const QuantLaunch l = plan_only(g);
      EXPECT_EQ(l.entry, "rlx_emb_" + std::string(ir::dtype_name(t)));
      EXPECT_EQ(l.scalars, (std::vector<std::int64_t>{6, 2, 10, 1}));
    }
  }
  Graph g("emb");
  g.add_output(g.embedding(g.param("table", Shape{10, 6}, DType::BF16), g.input("ids", Shape{4}, DType::I32)), "y");
  const QuantLaunch l = plan_only(g);
  EXPECT_EQ(l.entry, "rlx_emb_b2");  // bf16 rows copied as they are: no cast of the table
  EXPECT_EQ(l.scalars, (std::vector<std::int64_t>{4, 6, 10, 0}));
}

// A GGUF Llama (SmolLM2-135M's widths, two layers, Q4_1 layers and a Q8_0 token embedding, as the shipped
// file) compiles for the CUDA backend to kernels that all run on the device: generated code, cuBLASLt, the
// quantized kernels, or the flash attention. A host step would bounce every decode step's activations through the CPU.
TEST(CudaQuant, LlamaDecodeGraphHasNoHostStep) {
  llm::LlamaConfig c;
  c.arch = "llama";
  c.n_layer = 2, c.n_embd = 576, c.n_ff = 1536, c.n_head = 9, c.n_head_kv = 3, c.head_dim = 64, c.rope_dim = 64;
  c.vocab = 1024, c.context = 2048, c.tied_output = true;
  c.weight_dtypes["token_embd.weight"] = DType::Q8_0;
  for (int i = 0; i < 2; ++i)
    for (const char* w : {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"})
      c.weight_dtypes["blk." + std::to_string(i) + "." + w + ".weight"] = DType::Q4_1;
  for (const char* act : {"q8", "f32"}) {
    SCOPED_TRACE(act);
    const auto model = llm::LlamaModel::build_graph(c, 1, 64, act);
    const auto r = compile::compile(model.graph, traits(), {});
    const auto module = emit(r.lir);
    std::size_t quantized = 0, attention = 0;
    for (std::size_t k = 0; k < r.lir.kernels.size(); ++k) {
      if (module.kernels[k].why.empty()) continue;
      QuantLaunch l;
      AttentionLaunch a;
      std::string why, no_attention;
      if (plan_attention(r.lir, r.lir.kernels[k], {}, &a, &no_attention)) {  // the flash attention (attention.hpp)
        ++attention;
        continue;
      }
      EXPECT_TRUE(plan_quant(r.lir, r.lir.kernels[k], &l, &why))
          << r.lir.kernels[k].name << " would run on the host: " << module.kernels[k].why << "; " << why;
      ++quantized;
    }
    EXPECT_EQ(quantized, 1u + 2 * 7 + 1) << "the embedding, 7 linear layers a block and the tied output";
    EXPECT_EQ(attention, 2u) << "a layer's attention";
  }
}

// On a GPU: each kernel against the reference interpreter, with more rows than one GEMV pass takes.
TEST(CudaQuant, KernelsMatchTheReferenceOnTheGpu) {
  if (auto why = unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  std::mt19937_64 rng(testing::test_seed());
  Session session(runtime::Device::Cuda);
  for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::Q4_K, DType::Q6_K}) {
    SCOPED_TRACE(std::string(ir::dtype_name(t)));
    const std::int64_t K = 3 * std::int64_t(ir::block_elems(t));
    for (const char* act : {"f32", "q8"}) {
      Graph g("qmm");
      auto wp = g.param("w", Shape{37, K}, t);
      g.add_output(g.quantized_matmul(g.input("x", Shape{11, K}), wp, act), "y");
      g.add_output(g.dequantize(wp), "d");
      auto exe = session.compile(g);
      const ir::Tensor wf = testing::random_tensor(DType::F32, {37, K}, rng, -1, 1);
      const ir::Tensor w = ir::Tensor::from_f64(t, {37, K}, wf.to_f64());
      exe.set_param("w", w);
      reference::TensorMap in{{"x", testing::random_tensor(DType::F32, {11, K}, rng, -2, 2)}};
      const auto got = exe.run(in);
      const auto want = reference::run(g, in, {{"w", w}});
      EXPECT_TRUE(testing::tensors_close(got[0], want[0], {1e-4, 1e-4})) << act;
      EXPECT_TRUE(testing::tensors_close(got[1], want[1], {0, 0}));
    }
  }
}

}  // namespace
}  // namespace rlx::backends::cuda
