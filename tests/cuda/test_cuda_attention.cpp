// The CUDA backend's flash attention (src/backends/cuda/attention.hpp): attention stays whole for the traits (f32,
// and f16/bf16 through casts; f64 decomposes) and runs as our own kernel. Without a GPU: each case is one Native
// kernel that plan_attention takes (never the host), NVRTC compiles its program for sm_90 (ptxas included), and
// the kernel's text (attention_code.inc) runs as host C++ with the planned dimensions, a thread per CUDA thread
// and fewer blocks than the grid (the grid-stride loop), against the float64 reference with fully masked rows and
// a NaN query.
// On a GPU: the cases against the float64 reference through the conformance harness (fresh random inputs into
// NaN-poisoned outputs, twice), then fully masked rows (bool and -inf float masks: NaN, as 0/0 in the reference)
// and NaN queries, and every kernel on the device.
//
// The cases cover causal (Sq = Sk, and top-left aligned with Sq < Sk), additive and bool masks broadcast over
// batch or heads, grouped KV heads (2, 3 and 4 query heads per KV head, decode's single query), head dims 64,
// 128, 256 and odd ones (33, 40 with Dv 24), Dv past 256 (split over blocks), lengths that are no multiple of
// the tiles (64 queries, 32 keys), a given scale, and bf16.
#include <gtest/gtest.h>

#include <barrier>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "backends/cuda/attention.hpp"
#include "conformance/harness.hpp"
#include "rlx/backends/cuda/cuda_backend.hpp"
#include "rlx/compile/pipeline.hpp"
#include "rlx/env.hpp"
#include "rlx/reference/interpreter.hpp"
#include "rlx/runtime/host_kernel.hpp"
#include "rlx/runtime/session.hpp"
#include "support/testing.hpp"

// attention_code.inc as host C++: the dimensions are the planned program's #defines, read at run time (g_dims),
// except the O columns a thread holds (RLX_NJ), an array extent, compiled in for each value the cases use. Every
// thread reaches the barriers and the shuffles at the same points, so a shuffle is an exchange through memory
// between two barriers of the block.
namespace rlx::backends::cuda::host_attention {
struct Dims {
  int BQ = 0, NT = 0, BK = 0, D = 0, DV = 0, DVC = 0, VS = 0, QS = 0, KS = 0, SQ = 0, SK = 0, GROUP = 0, ROWS = 0;
  int HKV = 0, QBLOCKS = 0, CHUNKS = 0, CAUSAL = 0, MASK = 0, NJ = 0, SPLITS = 0, KPS = 0, CNT = 0;
  long long ITEMS = 0, MS0 = 0, MS1 = 0, MS2 = 0, MS3 = 0, PW = 0, ZS = 0;
  long long QSB = 0, QSH = 0, QSS = 0, KSB = 0, KSH = 0, KSS = 0, VSB = 0, VSH = 0, VSS = 0, OSB = 0, OSH = 0, OSS = 0;
  float SCALE = 0;
};
inline Dims g_dims;
struct Index {
  unsigned x = 0;
};
inline thread_local Index threadIdx, blockIdx;
inline Index gridDim;
struct alignas(16) rlx_f4 {
  float x, y, z, w;
};
inline std::barrier<>* g_barrier = nullptr;
inline std::vector<float> g_exchange;
inline std::vector<rlx_f4> g_shared;
inline std::vector<int> g_votes;
// __syncthreads_or: a barrier, and whether any thread of the block passed a non-zero value.
inline int sync_or(int p) {
  g_votes[threadIdx.x] = p;
  g_barrier->arrive_and_wait();
  int any = 0;
  for (int v : g_votes) any |= v != 0;
  g_barrier->arrive_and_wait();
  return any;
}
inline float shuffle(float v, int o) {
  g_exchange[threadIdx.x] = v;
  g_barrier->arrive_and_wait();
  const float r = g_exchange[threadIdx.x ^ unsigned(o)];
  g_barrier->arrive_and_wait();
  return r;
}
using std::min;
#define RLX_NEG_INF (-std::numeric_limits<float>::infinity())
#define RLX_ENTRY inline void
#define RLX_COMBINE_ENTRY inline void
#define RLX_SHARED(name) rlx_f4* name = g_shared.data()
#define RLX_SYNC() g_barrier->arrive_and_wait()
#define RLX_GRID_WAIT() (void)0
#define RLX_SYNC_OR(p) sync_or(p)
#define RLX_SHFL(v, o) shuffle((v), (o))
#define RLX_UNROLL
#define RLX_UNROLL4
#define RLX_BQ g_dims.BQ
#define RLX_NT g_dims.NT
#define RLX_BK g_dims.BK
#define RLX_D g_dims.D
#define RLX_DV g_dims.DV
#define RLX_DVC g_dims.DVC
#define RLX_VS g_dims.VS
#define RLX_QS g_dims.QS
#define RLX_KS g_dims.KS
#define RLX_SQ g_dims.SQ
#define RLX_SK g_dims.SK
#define RLX_GROUP g_dims.GROUP
#define RLX_ROWS g_dims.ROWS
#define RLX_HKV g_dims.HKV
#define RLX_QBLOCKS g_dims.QBLOCKS
#define RLX_CHUNKS g_dims.CHUNKS
#define RLX_ITEMS g_dims.ITEMS
#define RLX_SCALE g_dims.SCALE
#define RLX_CAUSAL g_dims.CAUSAL
#define RLX_MASK g_dims.MASK
#define RLX_MS0 g_dims.MS0
#define RLX_MS1 g_dims.MS1
#define RLX_MS2 g_dims.MS2
#define RLX_MS3 g_dims.MS3
#define RLX_SPLITS g_dims.SPLITS
#define RLX_KPS g_dims.KPS
#define RLX_PW g_dims.PW
#define RLX_ZS g_dims.ZS
#define RLX_CNT g_dims.CNT
#define RLX_QSB g_dims.QSB
#define RLX_QSH g_dims.QSH
#define RLX_QSS g_dims.QSS
#define RLX_KSB g_dims.KSB
#define RLX_KSH g_dims.KSH
#define RLX_KSS g_dims.KSS
#define RLX_VSB g_dims.VSB
#define RLX_VSH g_dims.VSH
#define RLX_VSS g_dims.VSS
#define RLX_OSB g_dims.OSB
#define RLX_OSH g_dims.OSH
#define RLX_OSS g_dims.OSS
#define RLX_CUDA_ATTENTION_CODE(...) __VA_ARGS__
#define RLX_CUDA_ATTENTION_COMBINE_CODE(...) __VA_ARGS__
#define RLX_NJ 3
namespace nj3 {
#include "backends/cuda/attention_code.inc"
}
#undef RLX_NJ
#define RLX_NJ 5
namespace nj5 {
#include "backends/cuda/attention_code.inc"
}
#undef RLX_NJ
#define RLX_NJ 8
namespace nj8 {
#include "backends/cuda/attention_code.inc"
}
#undef RLX_NJ
#define RLX_NJ 16
namespace nj16 {
#include "backends/cuda/attention_code.inc"
}
#undef RLX_NJ
#define RLX_NJ 32
namespace nj32 {
#include "backends/cuda/attention_code.inc"
}
#undef RLX_NJ
#undef RLX_CUDA_ATTENTION_CODE
#undef RLX_CUDA_ATTENTION_COMBINE_CODE

using Kernel = void (*)(const float*, const float*, const float*, const void*, float*);
inline Kernel kernel_for(int nj) {
  switch (nj) {
    case 3: return nj3::rlx_flash_attention;
    case 5: return nj5::rlx_flash_attention;
    case 8: return nj8::rlx_flash_attention;
    case 16: return nj16::rlx_flash_attention;
    case 32: return nj32::rlx_flash_attention;
    default: return nullptr;
  }
}
// The combine does not depend on RLX_NJ.
inline void combine(const float* part, float* out) { nj8::rlx_flash_attention_combine(part, out); }

// The #define lines of a planned program.
inline Dims dims_of(const std::string& source) {
  std::map<std::string, std::string> v;
  std::istringstream in(source);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("#define RLX_", 0) == 0) {
      std::istringstream l(line.substr(8));
      std::string name, value;
      l >> name >> value;
      v[name] = value;
    }
  Dims d;
  auto i = [&](const char* n) { return std::stoll(v.at(n)); };
  d.BQ = int(i("RLX_BQ")), d.NT = int(i("RLX_NT")), d.BK = int(i("RLX_BK")), d.D = int(i("RLX_D"));
  d.DV = int(i("RLX_DV")), d.DVC = int(i("RLX_DVC")), d.VS = int(i("RLX_VS")), d.QS = int(i("RLX_QS"));
  d.KS = int(i("RLX_KS")), d.SQ = int(i("RLX_SQ")), d.SK = int(i("RLX_SK")), d.GROUP = int(i("RLX_GROUP"));
  d.ROWS = int(i("RLX_ROWS")), d.HKV = int(i("RLX_HKV")), d.QBLOCKS = int(i("RLX_QBLOCKS"));
  d.CHUNKS = int(i("RLX_CHUNKS")), d.CAUSAL = int(i("RLX_CAUSAL")), d.MASK = int(i("RLX_MASK"));
  d.NJ = int(i("RLX_NJ")), d.ITEMS = i("RLX_ITEMS"), d.MS0 = i("RLX_MS0"), d.MS1 = i("RLX_MS1");
  d.MS2 = i("RLX_MS2"), d.MS3 = i("RLX_MS3"), d.SCALE = std::stof(v.at("RLX_SCALE"));
  d.SPLITS = int(i("RLX_SPLITS")), d.KPS = int(i("RLX_KPS")), d.PW = i("RLX_PW"), d.ZS = i("RLX_ZS");
  d.CNT = int(i("RLX_CNT"));
  d.QSB = i("RLX_QSB"), d.QSH = i("RLX_QSH"), d.QSS = i("RLX_QSS"), d.KSB = i("RLX_KSB"), d.KSH = i("RLX_KSH");
  d.KSS = i("RLX_KSS"), d.VSB = i("RLX_VSB"), d.VSH = i("RLX_VSH"), d.VSS = i("RLX_VSS"), d.OSB = i("RLX_OSB");
  d.OSH = i("RLX_OSH"), d.OSS = i("RLX_OSS");
  return d;
}

// Runs the planned kernel on `blocks` blocks (a grid-stride loop over the launch's items), shared memory poisoned;
// with key splits, into NaN-poisoned partials, then the combine on `blocks` blocks.
inline void run(const std::string& source, unsigned shared, unsigned blocks, const float* q, const float* k,
                const float* v, const void* mask, float* out) {
  g_dims = dims_of(source);
  std::vector<float> partials;
  float* const final_out = out;
  if (g_dims.SPLITS > 1) {
    partials.assign(std::size_t(g_dims.ITEMS * g_dims.PW), NAN);
    out = partials.data();
  }
  const Kernel f = kernel_for(g_dims.NJ);
  if (!f) throw std::runtime_error("no host expansion for RLX_NJ " + std::to_string(g_dims.NJ));
  g_shared.assign(shared / sizeof(rlx_f4), {NAN, NAN, NAN, NAN});
  g_exchange.assign(std::size_t(g_dims.NT), 0.0f);
  g_votes.assign(std::size_t(g_dims.NT), 0);
  gridDim.x = blocks;
  for (unsigned b = 0; b < blocks; ++b) {
    std::barrier<> barrier(g_dims.NT);
    g_barrier = &barrier;
    std::vector<std::thread> threads;
    for (int t = 0; t < g_dims.NT; ++t)
      threads.emplace_back([&, t, b] {
        threadIdx.x = unsigned(t);
        blockIdx.x = b;
        f(q, k, v, mask, out);
      });
    for (auto& t : threads) t.join();
  }
  if (g_dims.SPLITS <= 1) return;
  for (unsigned b = 0; b < blocks; ++b)  // no barriers: a thread per output element, one after another
    for (int t = 0; t < g_dims.CNT; ++t) {
      threadIdx.x = unsigned(t);
      blockIdx.x = b;
      combine(out, final_out);
    }
}
}  // namespace rlx::backends::cuda::host_attention

namespace rlx::backends::cuda {
namespace {

using ir::DType;
using ir::Graph;
using ir::Shape;

struct Case {
  Graph graph;
  std::optional<DType> mask;  // the mask's dtype, when there is one
  bool views = false;         // q, k, v and the result are [B, S, H, D] permutes the kernel takes in
};

// q [B, H, Sq, D], k [B, Hkv, Sk, D], v [B, Hkv, Sk, Dv]; a mask of `mask_shape` when given.
Case make(const char* name, std::vector<std::int64_t> q, std::vector<std::int64_t> kv, std::int64_t dv,
          bool causal = false, std::optional<DType> mask = std::nullopt, std::vector<std::int64_t> mask_shape = {},
          double scale = 0.0, DType t = DType::F32) {
  Graph g(name);
  auto qn = g.input("q", Shape(q), t);
  auto kn = g.input("k", Shape(kv), t);
  auto vs = kv;
  vs[3] = dv;
  auto vn = g.input("v", Shape(vs), t);
  std::optional<ir::NodeId> m;
  if (mask) m = g.input("mask", Shape(mask_shape), *mask == DType::Bool ? DType::Bool : t);
  g.add_output(g.attention(qn, kn, vn, m, causal, scale), "y");
  return {std::move(g), mask};
}

// As a transformer lays them out: q [B, Sq, H, D], k [B, Sk, Hkv, D] and v [B, Sk, Hkv, Dv] (q as [B, Sq, H D]
// split into heads when `split`), permuted to [B, H, S, D] for the attention, and the result permuted back to
// [B, Sq, H, Dv]. On CUDA the four permutes are the attention kernel's strides, not movement kernels.
Case make_bshd(const char* name, std::vector<std::int64_t> q, std::vector<std::int64_t> kv, std::int64_t dv,
               bool causal = false, std::optional<DType> mask = std::nullopt, std::vector<std::int64_t> mask_shape = {},
               bool split = false) {
  Graph g(name);
  const std::vector<std::int64_t> to_heads{0, 2, 1, 3};
  ir::NodeId qn;
  if (split) {
    qn = g.reshape(g.input("q", Shape{q[0], q[1], q[2] * q[3]}, DType::F32), Shape(q));
  } else {
    qn = g.input("q", Shape(q), DType::F32);
  }
  auto kn = g.input("k", Shape(kv), DType::F32);
  auto vs = kv;
  vs[3] = dv;
  auto vn = g.input("v", Shape(vs), DType::F32);
  std::optional<ir::NodeId> m;
  if (mask) m = g.input("mask", Shape(mask_shape), *mask == DType::Bool ? DType::Bool : DType::F32);
  auto y = g.attention(g.permute(qn, to_heads), g.permute(kn, to_heads), g.permute(vn, to_heads), m, causal);
  g.add_output(g.permute(y, to_heads), "y");
  return {std::move(g), mask, true};
}

std::vector<Case> cases() {
  std::vector<Case> cs;
  cs.push_back(make("causal, d64, 4 query heads per KV head, 77 tokens", {2, 8, 77, 64}, {2, 2, 77, 64}, 64, true));
  cs.push_back(make("float mask over heads, d128, 50 queries over 70 keys", {1, 4, 50, 128}, {1, 4, 70, 128}, 128,
                    false, DType::F32, {1, 1, 50, 70}));
  cs.push_back(
      make("bool mask per batch, d40, dv24", {2, 3, 33, 40}, {2, 3, 45, 40}, 24, false, DType::Bool, {2, 1, 33, 45}));
  cs.push_back(
      make("causal top-left, odd d33, 19 queries over 37 keys, GQA 2", {1, 6, 19, 33}, {1, 3, 37, 33}, 33, true));
  cs.push_back(make("decode: one query, GQA 3, 300 keys, bool mask", {1, 9, 1, 64}, {1, 3, 300, 64}, 64, false,
                    DType::Bool, {1, 1, 1, 300}));
  cs.push_back(make("causal with a float mask, d256, 2D mask", {1, 2, 70, 256}, {1, 2, 70, 256}, 256, true, DType::F32,
                    {70, 70}));
  cs.push_back(make("dv 320 in chunks, scale 0.3", {1, 2, 40, 64}, {1, 2, 50, 64}, 320, false, std::nullopt, {}, 0.3));
  cs.push_back(make("bf16, causal, d64", {1, 4, 65, 64}, {1, 2, 65, 64}, 64, true, std::nullopt, {}, 0.0, DType::BF16));
  cs.push_back(make_bshd("[B, S, H, D] views: causal, GQA 2, heads split from [B, S, H D]", {2, 70, 4, 64},
                         {2, 70, 2, 64}, 64, true, std::nullopt, {}, true));
  cs.push_back(make_bshd("[B, S, H, D] views: decode, GQA 3, 300 keys, bool mask (key splits)", {1, 1, 9, 64},
                         {1, 300, 3, 64}, 64, false, DType::Bool, {1, 1, 1, 300}));
  cs.push_back(make_bshd("[B, S, H, D] views: float mask, dv 40, 33 queries over 45 keys", {2, 33, 3, 40},
                         {2, 45, 3, 40}, 40, false, DType::F32, {2, 1, 33, 45}));
  return cs;
}

const AttentionDevice kH100{227 * 1024, 132};

// Fresh random values for every input of `g`.
reference::TensorMap random_inputs(const Graph& g, std::mt19937_64& rng) {
  reference::TensorMap in;
  for (auto id : g.input_ids()) {
    const auto& n = g.node(id);
    in[n.attrs.get_str("name")] = testing::random_tensor(n.dtype, n.shape.extents(), rng);
  }
  return in;
}

const compile::Kernel* attention_kernel(const compile::LirModule& lir) {
  const compile::Kernel* found = nullptr;
  for (const auto& k : lir.kernels)
    for (const auto& n : k.body.nodes())
      if (n.op == ir::OpKind::Attention) found = &k;
  return found;
}

TEST(CudaAttention, StaysWholeAndIsPlannedAsOurKernel) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.graph.name());
    const auto lir = compile::compile(c.graph, traits(), {}).lir;
    const compile::Kernel* k = attention_kernel(lir);
    ASSERT_NE(k, nullptr) << "attention was decomposed";
    EXPECT_EQ(k->kind, compile::KernelKind::Native);
    AttentionLaunch l;
    std::string why;
    ASSERT_TRUE(plan_attention(lir, *k, kH100, &l, &why)) << why;
    EXPECT_EQ(l.buffers.size(), 5u);
    EXPECT_EQ(l.block, unsigned(2 * l.block_q));
    EXPECT_LE(l.shared, unsigned(kH100.max_shared_bytes));
    EXPECT_NE(l.source.find("rlx_flash_attention"), std::string::npos);
    if (c.views) {  // the permutes are the kernel's (those of size-1 dims are views): it is the graph's only one
      EXPECT_EQ(lir.kernels.size(), 1u);
      EXPECT_NE(k->name.find("permute+attention"), std::string::npos) << k->name;
    }
  }
  // f64 attention decomposes (the kernel is f32).
  Graph g("f64");
  auto q = g.input("q", Shape{1, 2, 5, 8}, DType::F64);
  g.add_output(g.attention(q, q, q));
  EXPECT_EQ(attention_kernel(compile::compile(g, traits(), {}).lir), nullptr);
  // RLX_CUDA_FLASH_ATTENTION=0 decomposes it, as before the kernel.
  env::ScopedOverride off("RLX_CUDA_FLASH_ATTENTION", "0");
  EXPECT_EQ(attention_kernel(compile::compile(cases()[0].graph, traits(), {}).lir), nullptr);
}

// Only permutes that keep the head dim last and feed nothing but attentions' q, k and v are taken in; the result's
// permute only when it is the attention's one reader.
TEST(CudaAttention, OtherPermutesStayMovementKernels) {
  auto movement = [](const Graph& g) {
    std::size_t n = 0;
    for (const auto& k : compile::compile(g, traits(), {}).lir.kernels) n += k.kind == compile::KernelKind::Movement;
    return n;
  };
  {  // k read as [B, H, D, S] -> no; q's permute also an output -> no
    Graph g("moves the head dim");
    auto x = g.input("x", Shape{1, 8, 2, 16}, DType::F32);
    auto kt = g.permute(g.input("kt", Shape{1, 2, 16, 8}, DType::F32), {0, 1, 3, 2});
    auto q = g.permute(x, {0, 2, 1, 3});
    auto y = g.attention(q, kt, kt);
    g.add_output(y, "y");
    g.add_output(q, "q");
    EXPECT_EQ(movement(g), 2u);
  }
  {  // the result read by its permute and by a second consumer
    Graph g("two readers of the result");
    auto q = g.input("q", Shape{1, 2, 8, 16}, DType::F32);
    auto y = g.attention(q, q, q);
    g.add_output(g.permute(y, {0, 2, 1, 3}), "y");
    g.add_output(g.add(y, y), "y2");
    EXPECT_EQ(movement(g), 1u);
  }
}

TEST(CudaAttention, TilesAndChunksFollowTheShapeAndTheDevice) {
  const auto lir = compile::compile(cases()[6].graph, traits(), {}).lir;  // dv 320
  AttentionLaunch l;
  std::string why;
  ASSERT_TRUE(plan_attention(lir, *attention_kernel(lir), kH100, &l, &why)) << why;
  EXPECT_EQ(l.chunks, 3);    // 320 columns in chunks of 128
  EXPECT_EQ(l.block_q, 32);  // 6 work items of 64 rows would leave the multiprocessors idle
  const auto big = compile::compile(cases()[0].graph, traits(), {}).lir;
  ASSERT_TRUE(plan_attention(big, *attention_kernel(big), {227 * 1024, 4}, &l, &why)) << why;
  EXPECT_EQ(l.block_q, 64);
  EXPECT_EQ(l.splits, 1);  // its 4 x 2 x 2 items fill the 4 multiprocessors: no key splits
  // Decode (3 blocks of one row per query head on 132 multiprocessors) splits its 300 keys into ranges of one
  // tile, and a second kernel merges them; partials are each item's rows' max, sum and O.
  const auto decode = compile::compile(cases()[4].graph, traits(), {}).lir;
  ASSERT_TRUE(plan_attention(decode, *attention_kernel(decode), kH100, &l, &why)) << why;
  EXPECT_EQ(l.splits, 10);
  EXPECT_EQ(l.grid, 30u);
  EXPECT_EQ(l.partial_bytes, 4u * 30 * 32 * (64 + 2));
  EXPECT_NE(l.source.find(l.combine_entry), std::string::npos);
  EXPECT_EQ(l.combine_block, 256u);
  // d256 does not fit the default 48 KiB: 32 rows do not either, and the kernel is left to the host.
  const auto d256 = compile::compile(cases()[5].graph, traits(), {}).lir;
  EXPECT_FALSE(plan_attention(d256, *attention_kernel(d256), {48 * 1024, 132}, &l, &why));
  EXPECT_NE(why.find("shared memory"), std::string::npos) << why;
}

TEST(CudaAttention, TheProgramsCompile) {
  if (auto why = nvrtc_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.graph.name());
    const auto lir = compile::compile(c.graph, traits(), {}).lir;
    for (const AttentionDevice& dev : {kH100, AttentionDevice{227 * 1024, 1}}) {  // 32 and 64 rows a block
      AttentionLaunch l;
      std::string why;
      ASSERT_TRUE(plan_attention(lir, *attention_kernel(lir), dev, &l, &why)) << why;
      // Both entries (the kernel and the combine of key splits) wait for the previous grid first: the backend
      // launches them programmatically.
      const auto waits = [&](const std::string& entry) {
        const auto at = l.source.find(entry + "(");
        return at != std::string::npos &&
               l.source.find("RLX_GRID_WAIT();", at) < l.source.find(';', l.source.find('{', at));
      };
      EXPECT_TRUE(waits(l.entry));
      EXPECT_TRUE(waits(l.combine_entry));
      EXPECT_GT(compile_for_arch(l.source, "sm_90"), 0u);
    }
  }
}

// The planned kernels run as host C++ (host_attention above) on inputs with a fully masked first row (where the
// mask has more than one row) and a NaN query, into poisoned outputs: as the reference, NaN rows included.
TEST(CudaAttention, TheKernelRunOnTheHostMatchesTheReference) {
  std::mt19937_64 rng(testing::test_seed());
  for (const Case& c : cases()) {
    if (c.graph.node(c.graph.input_ids()[0]).dtype != DType::F32) continue;  // the kernel sees f32 after casts
    SCOPED_TRACE(c.graph.name());
    const auto lir = compile::compile(c.graph, traits(), {}).lir;
    for (const AttentionDevice& dev : {kH100, AttentionDevice{227 * 1024, 1}}) {  // 32 and 64 rows a block
      AttentionLaunch l;
      std::string why;
      ASSERT_TRUE(plan_attention(lir, *attention_kernel(lir), dev, &l, &why)) << why;
      reference::TensorMap in = random_inputs(c.graph, rng);
      if (auto m = in.find("mask"); m != in.end() && m->second.numel() > m->second.shape().back())
        for (std::int64_t j = 0; j < m->second.shape().back(); ++j)
          m->second.set(j, c.mask == DType::Bool ? 0.0 : -std::numeric_limits<double>::infinity());
      in.at("q").set(in.at("q").numel() - 1, std::nan(""));
      const auto want = reference::run(c.graph, in, {});
      ir::Tensor got = conformance::poisoned(DType::F32, want[0].shape());
      const void* mask = in.contains("mask") ? in.at("mask").data() : in.at("q").data();
      auto f32 = [&](const char* name) { return reinterpret_cast<const float*>(in.at(name).data()); };
      host_attention::run(l.source, l.shared, std::min(l.grid, 3u), f32("q"), f32("k"), f32("v"), mask,
                          reinterpret_cast<float*>(got.data()));
      EXPECT_TRUE(testing::tensors_close(got, want[0])) << "block_q " << l.block_q;
    }
  }
}

// Key tiles a bool mask hides from every row of a block are skipped, as decode's cache rows past the position:
// values there poisoned with NaN (which 0 x NaN would spread) leave the result the reference gives with them
// zeroed, with and without key splits.
TEST(CudaAttention, TilesABoolMaskHidesAreSkipped) {
  std::mt19937_64 rng(testing::test_seed());
  const Case c = make("decode over a 40-row prefix of 300", {1, 9, 1, 64}, {1, 3, 300, 64}, 64, false, DType::Bool,
                      {1, 1, 1, 300});
  const auto lir = compile::compile(c.graph, traits(), {}).lir;
  for (const AttentionDevice& dev : {kH100, AttentionDevice{227 * 1024, 1}}) {
    AttentionLaunch l;
    std::string why;
    ASSERT_TRUE(plan_attention(lir, *attention_kernel(lir), dev, &l, &why)) << why;
    reference::TensorMap in = random_inputs(c.graph, rng);
    ir::Tensor& mask = in.at("mask");
    for (std::int64_t j = 0; j < 300; ++j) mask.set(j, j < 40 ? 1.0 : 0.0);
    ir::Tensor& v = in.at("v");
    for (std::int64_t i = 0; i < v.numel(); ++i)  // rows 64.. of each head: tiles no row sees
      if (i / 64 % 300 >= 64) v.set(i, 0.0);
    const auto want = reference::run(c.graph, in, {});
    for (std::int64_t i = 0; i < v.numel(); ++i)
      if (i / 64 % 300 >= 64) v.set(i, std::nan(""));
    ir::Tensor got = conformance::poisoned(DType::F32, want[0].shape());
    auto f32 = [&](const char* name) { return reinterpret_cast<const float*>(in.at(name).data()); };
    host_attention::run(l.source, l.shared, std::min(l.grid, 3u), f32("q"), f32("k"), f32("v"), mask.data(),
                        reinterpret_cast<float*>(got.data()));
    EXPECT_TRUE(testing::tensors_close(got, want[0])) << "splits " << l.splits;
  }
}

// Where the device cannot run it, the kernel with layout views falls to the host as it is: the CPU's attention
// reads the same views (compile::attention_views), and matches the reference too.
TEST(CudaAttention, LayoutViewsRunOnTheHostToo) {
  std::mt19937_64 rng(testing::test_seed());
  for (const Case& c : cases()) {
    if (!c.views) continue;
    SCOPED_TRACE(c.graph.name());
    const auto lir = compile::compile(c.graph, traits(), {}).lir;
    ASSERT_EQ(lir.kernels.size(), 1u);
    const auto staged = runtime::compile_host_kernel(lir, 0, {});
    reference::TensorMap in = random_inputs(c.graph, rng);
    const auto want = reference::run(c.graph, in, {});
    std::vector<const void*> ins;
    for (auto b : lir.kernels[0].inputs) {
      const auto& buf = lir.buffer(b);
      ins.push_back(in.at(lir.buffer(buf.root).name).data());
    }
    ir::Tensor got = conformance::poisoned(DType::F32, want[0].shape());
    std::vector<void*> outs{got.data()};
    staged.run(ins, outs);
    EXPECT_TRUE(testing::tensors_close(got, want[0]));
  }
}

// Bool masks keep at least one key of every row here (fully masked rows are the next test's); float masks are
// finite.
conformance::Check check_for(const Case& c) {
  conformance::Check check;
  check.seed = testing::test_seed();
  check.label = c.graph.name();
  check.gens["mask"] = [](DType t, const conformance::Ints& s, std::mt19937_64& rng) {
    ir::Tensor m = t == DType::Bool ? conformance::bools(0.6)(t, s, rng) : conformance::uniform(-1, 1)(t, s, rng);
    if (t == DType::Bool)
      for (std::int64_t i = 0; i < m.numel(); i += s.back()) m.set(i, 1.0);
    return m;
  };
  if (c.graph.node(c.graph.input_ids()[0]).dtype == DType::BF16) check.tol = testing::tolerance_for(DType::BF16);
  return check;
}

TEST(CudaAttention, MatchesTheReferenceIntoPoisonedOutputs) {
  if (auto why = unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.graph.name());
    EXPECT_TRUE(conformance::matches_reference(runtime::Device::Cuda, c.graph, check_for(c)));
  }
}

// A bool mask with rows that keep nothing and a float mask with rows of -inf give NaN rows (0/0), as the
// reference; a NaN query gives its row NaN. Every other element is close and none is left poisoned.
TEST(CudaAttention, FullyMaskedRowsAreNaNAsTheReference) {
  if (auto why = unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  std::mt19937_64 rng(testing::test_seed());
  for (const Case& c : cases()) {
    if (!c.mask) continue;
    SCOPED_TRACE(c.graph.name());
    const Graph& g = c.graph;
    const auto mask_gen = check_for(c).gens.at("mask");
    reference::TensorMap inputs;
    for (auto id : g.input_ids()) {
      const auto& n = g.node(id);
      const std::string& name = n.attrs.get_str("name");
      inputs[name] = name == "mask" ? mask_gen(n.dtype, n.shape.extents(), rng)
                                    : testing::random_tensor(n.dtype, n.shape.extents(), rng);
    }
    ir::Tensor& m = inputs.at("mask");
    const std::int64_t sk = m.shape().back();
    if (m.numel() == sk) continue;  // one mask row for every query: nothing would be left to compare
    const double off = *c.mask == DType::Bool ? 0.0 : -std::numeric_limits<double>::infinity();
    for (std::int64_t j = 0; j < sk; ++j) m.set(j, off);  // the first row of the mask hides every key
    ir::Tensor& q = inputs.at("q");
    q.set(q.numel() - 1, std::nan(""));  // the last query row of the last head
    const auto want = reference::run(g, inputs, {});
    auto exe = runtime::Session(runtime::Device::Cuda).compile(g);
    std::vector<ir::Tensor> got{conformance::poisoned(want[0].dtype(), want[0].shape())};
    std::vector<runtime::NamedTensor> named;
    for (const auto& [name, t] : inputs) named.push_back({name, ir::view(t)});
    exe.run_into(named, got);
    EXPECT_TRUE(testing::tensors_close(got[0], want[0]));
    std::int64_t nan = 0;
    for (std::int64_t i = 0; i < want[0].numel(); ++i) nan += std::isnan(want[0].get(i));
    EXPECT_GT(nan, 0) << "the special rows reach the output";
    EXPECT_LT(nan, want[0].numel()) << "and not all of it";
  }
}

TEST(CudaAttention, RunsOnTheDevice) {
  if (auto why = unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  std::mt19937_64 rng(testing::test_seed());
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.graph.name());
    auto exe = runtime::Session(runtime::Device::Cuda).compile(c.graph);
    reference::TensorMap inputs = random_inputs(c.graph, rng);
    exe.set_profiling(true);
    exe.run(inputs);
    for (const auto& k : exe.kernel_times()) EXPECT_FALSE(k.host) << k.kernel;
  }
}

}  // namespace
}  // namespace rlx::backends::cuda
