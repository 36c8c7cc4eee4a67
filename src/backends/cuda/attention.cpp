// The CUDA backend's flash attention (attention.hpp): the kernel's text and the launch of each Native kernel.
#include "backends/cuda/attention.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string_view>

#include "rlx/codegen/c.hpp"
#include "rlx/ir/tensor.hpp"

namespace rlx::backends::cuda {

namespace {

// Keys per tile; threads are (block_q / 4) x 8, each with 4 query rows and 4 keys (8 apart) of a tile's scores.
constexpr std::int64_t kBlockK = 32;
// Output columns a block holds in registers (4 rows x columns / 8 per thread); wider outputs are split into
// chunks of kChunk over blocks.
constexpr std::int64_t kMaxColumns = 256, kChunk = 128;
// Threads a block of the combine.
constexpr std::int64_t kCombineThreads = 256;

// The device meanings of attention_code.inc's macros; the dimensions come before them (plan_attention).
constexpr std::string_view kHead = R"(
#define RLX_NEG_INF __int_as_float(0xff800000)
#define RLX_ENTRY extern "C" __global__ void __launch_bounds__(RLX_NT)
#define RLX_COMBINE_ENTRY extern "C" __global__ void __launch_bounds__(RLX_CNT)
#define RLX_SHARED(name) extern __shared__ rlx_f4 name[]
#define RLX_SYNC() __syncthreads()
#define RLX_GRID_WAIT() rlx_grid_dependency_wait()
#define RLX_SYNC_OR(p) __syncthreads_or(p)
#define RLX_SHFL(v, o) __shfl_xor_sync(0xffffffffu, (v), (o))
#define RLX_UNROLL _Pragma("unroll")
#define RLX_UNROLL4 _Pragma("unroll 4")
struct alignas(16) rlx_f4 { float x, y, z, w; };
)";

// attention_code.inc as text: the kernel and the combine of key splits.
#define RLX_CUDA_ATTENTION_CODE(...) constexpr std::string_view kKernel = #__VA_ARGS__;
#define RLX_CUDA_ATTENTION_COMBINE_CODE(...) constexpr std::string_view kCombine = #__VA_ARGS__;
#include "backends/cuda/attention_code.inc"
#undef RLX_CUDA_ATTENTION_CODE
#undef RLX_CUDA_ATTENTION_COMBINE_CODE

std::int64_t shared_floats(std::int64_t bq, std::int64_t d, std::int64_t vs) {
  const std::int64_t qs = bq + 4, ks = kBlockK + 1;
  return d * qs + d * ks + kBlockK * vs + bq * ks;
}

}  // namespace

bool plan_attention(const compile::LirModule& lir, const compile::Kernel& k, const AttentionDevice& device,
                    AttentionLaunch* out, std::string* why) {
  compile::AttentionViews views;
  if (!compile::attention_views(lir, k, &views, why)) return false;
  const ir::Node* op = views.op;
  const compile::StridedOperand& res = views.out;
  const auto& qb = lir.buffer(views.q.buffer);
  const auto& kb = lir.buffer(views.k.buffer);
  const auto& vb = lir.buffer(views.v.buffer);
  const auto& ob = lir.buffer(res.buffer);
  for (const auto* b : {&qb, &kb, &vb, &ob})
    if (b->dtype != ir::DType::F32) return *why = "attention in f32 only (f16 and bf16 get casts to f32)", false;
  const auto& qd = views.q.shape;
  const auto& kd = views.k.shape;
  const auto& vd = views.v.shape;
  if (qd.size() != 4 || kd.size() != 4 || vd.size() != 4 || res.shape.size() != 4)
    return *why = "q, k and v are not [B, H, S, D]", false;
  const std::int64_t B = qd[0], H = qd[1], Sq = qd[2], D = qd[3];
  const std::int64_t Hkv = kd[1], Sk = kd[2], Dv = vd[3];
  if (kd[0] != B || vd[0] != B || vd[1] != Hkv || vd[2] != Sk || kd[3] != D || Hkv < 1 || H % Hkv != 0)
    return *why = "q, k and v disagree (batch, heads, lengths or head dims)", false;
  if (ob.numel() == 0) return *why = "an empty output", false;
  if (D < 1) return *why = "a zero head dim", false;
  double scale = op->attrs.float_or("scale", 0.0);
  if (scale == 0) scale = 1 / std::sqrt(double(D));
  if (!std::isfinite(scale)) return *why = "a scale that is not finite", false;
  const bool causal = op->attrs.bool_or("causal", false);

  // The mask's element strides over the scores [B, H, Sq, Sk] (0 along a broadcast dim).
  int mask = 0;
  std::int64_t ms[4] = {0, 0, 0, 0};
  if (views.mask >= 0) {
    const auto& mb = lir.buffer(views.mask);
    if (mb.dtype == ir::DType::Bool)
      mask = 1;
    else if (mb.dtype == ir::DType::F32)
      mask = 2;
    else
      return *why = "a mask that is neither bool nor f32", false;
    const std::int64_t full[4] = {B, H, Sq, Sk};
    if (mb.shape.size() > 4) return *why = "a mask of rank > 4", false;
    const auto strides = ir::contiguous_strides(mb.shape);
    const std::size_t lead = 4 - mb.shape.size();
    for (std::size_t d = 0; d < mb.shape.size(); ++d) {
      if (mb.shape[d] != 1 && mb.shape[d] != full[lead + d])
        return *why = "a mask that does not broadcast to the scores", false;
      ms[lead + d] = mb.shape[d] == 1 ? 0 : strides[d];
    }
  }

  const std::int64_t group = H / Hkv, rows = group * Sq;
  const std::int64_t chunks = Dv <= kMaxColumns ? 1 : (Dv + kChunk - 1) / kChunk;
  const std::int64_t dvc = chunks == 1 ? Dv : kChunk, nj = (dvc + 7) / 8, vs = nj * 8;
  auto items = [&](std::int64_t bq) { return B * Hkv * ((rows + bq - 1) / bq) * chunks; };
  auto fits = [&](std::int64_t bq) { return 4 * shared_floats(bq, D, vs) <= device.max_shared_bytes; };
  std::int64_t bq = 64;
  if (!fits(64) || items(64) < device.multiprocessors) bq = 32;
  if (!fits(bq))
    return *why = fmt::format("head dim {} needs {} bytes of shared memory, more than the {} a block may have", D,
                              4 * shared_floats(bq, D, vs), device.max_shared_bytes),
           false;
  if (items(bq) > std::numeric_limits<std::int64_t>::max() / 2 || rows > std::numeric_limits<std::int32_t>::max() / 2 ||
      Sk > std::numeric_limits<std::int32_t>::max() / 2)
    return *why = "more rows or keys than 32-bit indices reach", false;

  const std::int64_t qblocks = (rows + bq - 1) / bq;
  // Flash-decoding: with fewer items than multiprocessors (decode's batch x KV heads), each item's keys are split
  // into ranges of whole tiles, for about two blocks a multiprocessor, and a second kernel merges the partials.
  const std::int64_t tiles = (Sk + kBlockK - 1) / kBlockK;
  std::int64_t splits = 1, kps = std::max<std::int64_t>(Sk, 1);
  if (items(bq) < device.multiprocessors && tiles > 1) {
    const std::int64_t want = std::min(tiles, (2 * device.multiprocessors + items(bq) - 1) / items(bq));
    kps = (tiles + want - 1) / want * kBlockK;
    splits = (Sk + kps - 1) / kps;
  }
  const std::int64_t pw = bq * (dvc + 2), zs = B * Hkv;
  if (splits > 1 && items(bq) * splits * pw > std::numeric_limits<std::int64_t>::max() / 8)
    return *why = "more partials than 64-bit offsets reach", false;
  std::string defs = fmt::format(
      "// rlx: the CUDA backend's flash attention (src/backends/cuda/attention.cpp). Do not edit.\n"
      "#define RLX_BQ {}\n#define RLX_NT {}\n#define RLX_BK {}\n#define RLX_D {}\n#define RLX_DV {}\n"
      "#define RLX_DVC {}\n#define RLX_NJ {}\n#define RLX_VS {}\n#define RLX_QS {}\n#define RLX_KS {}\n"
      "#define RLX_SQ {}\n#define RLX_SK {}\n#define RLX_GROUP {}\n#define RLX_ROWS {}\n#define RLX_HKV {}\n"
      "#define RLX_QBLOCKS {}\n#define RLX_CHUNKS {}\n#define RLX_ITEMS {}LL\n#define RLX_SCALE {:.9g}f\n"
      "#define RLX_CAUSAL {}\n#define RLX_MASK {}\n#define RLX_MS0 {}LL\n#define RLX_MS1 {}LL\n#define RLX_MS2 {}LL\n"
      "#define RLX_MS3 {}LL\n#define RLX_SPLITS {}\n#define RLX_KPS {}\n#define RLX_PW {}LL\n#define RLX_ZS {}LL\n"
      "#define RLX_CNT {}\n",
      bq, 2 * bq, kBlockK, D, Dv, dvc, nj, vs, bq + 4, kBlockK + 1, Sq, Sk, group, rows, Hkv, qblocks, chunks,
      items(bq) * splits, scale, causal ? 1 : 0, mask, ms[0], ms[1], ms[2], ms[3], splits, kps, pw, zs,
      kCombineThreads);
  // The operands' and the output's element strides over batch, head and position (the head dim's is 1).
  const std::pair<const char*, const compile::StridedOperand*> strided[] = {
      {"Q", &views.q}, {"K", &views.k}, {"V", &views.v}, {"O", &res}};
  for (const auto& [name, s] : strided)
    defs += fmt::format("#define RLX_{0}SB {1}LL\n#define RLX_{0}SH {2}LL\n#define RLX_{0}SS {3}LL\n", name,
                        s->strides[0], s->strides[1], s->strides[2]);
  AttentionLaunch l;
  l.source = defs + std::string(kHead) + std::string(codegen::c::kCudaGridDependencyWait) + std::string(kKernel) +
             "\n" + std::string(kCombine) + "\n";
  l.block = unsigned(2 * bq);
  l.grid = unsigned(std::min<std::int64_t>(items(bq) * splits, std::numeric_limits<std::int32_t>::max()));
  l.shared = unsigned(4 * shared_floats(bq, D, vs));
  l.block_q = bq;
  l.chunks = chunks;
  l.buffers = {views.q.buffer, views.k.buffer, views.v.buffer, mask ? views.mask : views.q.buffer, res.buffer};
  l.splits = splits;
  if (splits > 1) {
    l.partial_bytes = std::uint64_t(4 * items(bq) * splits * pw);
    l.combine_block = unsigned(kCombineThreads);
    const std::int64_t outputs = zs * rows * Dv;
    l.combine_grid = unsigned(
        std::clamp<std::int64_t>((outputs + kCombineThreads - 1) / kCombineThreads, 1, 8 * device.multiprocessors));
  }
  *out = std::move(l);
  return true;
}

}  // namespace rlx::backends::cuda
