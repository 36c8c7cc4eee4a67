// The CUDA backend's quantized kernels (quant.hpp): the program's text and the launch of each Native kernel.
#include "backends/cuda/quant.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <string_view>

#include "backends/cuda/layout.hpp"
#include "rlx/codegen/c.hpp"
#include "rlx/ir/dtype.hpp"

namespace rlx::backends::cuda {

namespace {

// quant_code.inc as text: the block formats' parts, shared with the host test.
#define RLX_CUDA_QUANT_CODE(...) constexpr std::string_view kPartsCode = #__VA_ARGS__;
#include "backends/cuda/quant_code.inc"
#undef RLX_CUDA_QUANT_CODE

// What quant_code.inc needs on the device: f32 operations that are never contracted (__fmul_rn and the like),
// the bit casts, round-half-even. NVRTC's -minimal carries no headers, so the integer types are spelled out.
constexpr std::string_view kHead =
    R"(// rlx: the CUDA backend's quantized kernels (src/backends/cuda/quant.cpp). Do not edit.
#define RLX_QD static __device__ __forceinline__
#define RLX_QMUL(a, b) __fmul_rn((a), (b))
#define RLX_QADD(a, b) __fadd_rn((a), (b))
#define RLX_QSUB(a, b) __fsub_rn((a), (b))
#define RLX_QBITS2F(u) __uint_as_float(u)
#define RLX_QF2BITS(f) __float_as_uint(f)
#define RLX_QRINT(x) rlx_q_rint(x)
#define RLX_QNEAREST(x) __float2int_rn(x)
// rintf without the math headers: round half to even in f32, NaN and infinities kept (|x| >= 2^23 is whole).
static __device__ __forceinline__ float rlx_q_rint(float x) {
  float r;
  asm("cvt.rni.f32.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
)";

// The kernels over the parts, one template per block type (its id, the index in ir::kBlockDTypes).
constexpr std::string_view kKernels = R"(
template <int T> struct rlx_qt;
static __device__ __forceinline__ float rlx_q_shfl(float v, int o) { return __shfl_xor_sync(0xffffffffu, v, o); }

// Lane-local values of x for one part, rounded as quantized_matmul{activations="q8"} does when q8 is set.
template <int ELEMS>
static __device__ __forceinline__ void rlx_q8_round(float* xv, int p, long long q8) {
  if (!q8) return;
  if (ELEMS == 32) {  // the 4 lanes of one block (lanes 4g .. 4g + 3): Q8_0's quants, f32 scale
    float a = 0.0f;
    for (int j = 0; j < 8; ++j) a = fabsf(xv[j]) > a ? fabsf(xv[j]) : a;
    a = fmaxf(a, rlx_q_shfl(a, 1));
    a = fmaxf(a, rlx_q_shfl(a, 2));
    for (int j = 0; j < 8; ++j) xv[j] = rlx_q8_32(xv[j], a);
  } else {  // the warp's one 256-element block: ggml's Q8_K, the first of the largest magnitudes
    float amax = 0.0f, mx = 0.0f;
    int at = 1 << 30, bad = 0;
    for (int j = 0; j < 8; ++j) {
      const float ax = fabsf(xv[j]);
      bad |= !(xv[j] - xv[j] == 0.0f);
      if (ax > amax) { amax = ax; mx = xv[j]; at = 8 * p + j; }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float a2 = rlx_q_shfl(amax, o), m2 = rlx_q_shfl(mx, o);
      const int at2 = __shfl_xor_sync(0xffffffffu, at, o);
      if (a2 > amax || (a2 == amax && at2 < at)) { amax = a2; mx = m2; at = at2; }
    }
    bad = __any_sync(0xffffffffu, bad);
    for (int j = 0; j < 8; ++j) xv[j] = rlx_q8_k(xv[j], amax == 0.0f ? 0.0f : mx, bad);
  }
}

// y [M, N] = x [M, K] w^T, w [N, K] in blocks: a warp per n, up to 8 rows of x per pass over w's row n.
template <int T>
static __device__ __forceinline__ void rlx_qmm(const float* __restrict__ x, const unsigned char* __restrict__ w,
                                               float* __restrict__ y, long long M, long long N, long long K,
                                               long long q8) {
  rlx_grid_dependency_wait();  // first: a programmatic dependent launch is safe (codegen/c.hpp)
  typedef rlx_qt<T> Q;
  const int lane = threadIdx.x & 31;
  const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
  const long long nb = K / Q::elems, items = nb * Q::parts;
  for (long long n = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); n < N; n += warps) {
    const unsigned char* wr = w + n * nb * Q::bytes;
    for (long long m0 = 0; m0 < M; m0 += 8) {
      const int mc = M - m0 < 8 ? (int)(M - m0) : 8;
      float acc[8];
#pragma unroll
      for (int m = 0; m < 8; ++m) acc[m] = 0.0f;
      for (long long base = 0; base < items; base += 32) {  // the same trips on every lane: shuffles inside
        const long long i = base + lane;
        const bool on = i < items;
        const long long blk = on ? i / Q::parts : 0;
        const int p = on ? (int)(i % Q::parts) : 0;
        float v[8];
        int e[2];
        Q::part(wr + blk * Q::bytes, p, v, e);
        const float* xb = x + m0 * K + blk * Q::elems;
#pragma unroll
        for (int m = 0; m < 8; ++m) {
          if (m < mc) {
            const float* xr = xb + m * K;
            float xv[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) xv[j] = on ? __ldg(xr + e[j >> 2] + (j & 3)) : 0.0f;
            rlx_q8_round<Q::elems>(xv, p, q8);
            float s = 0.0f;
#pragma unroll
            for (int j = 0; j < 8; ++j) s = fmaf(v[j], xv[j], s);
            acc[m] += on ? s : 0.0f;
          }
        }
      }
#pragma unroll
      for (int m = 0; m < 8; ++m) {
        if (m < mc) {
          float s = acc[m];
          for (int o = 16; o > 0; o >>= 1) s += rlx_q_shfl(s, o);
          if (lane == 0) y[(m0 + m) * N + n] = s;
        }
      }
    }
  }
}

// y = the blocks of x as f32: a thread per part.
template <int T>
static __device__ __forceinline__ void rlx_deq(const unsigned char* __restrict__ x, float* __restrict__ y,
                                               long long nblocks) {
  rlx_grid_dependency_wait();  // first: a programmatic dependent launch is safe (codegen/c.hpp)
  typedef rlx_qt<T> Q;
  const long long total = nblocks * Q::parts, step = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += step) {
    const long long blk = i / Q::parts;
    float v[8];
    int e[2];
    Q::part(x + blk * Q::bytes, (int)(i % Q::parts), v, e);
    float* yo = y + blk * Q::elems;
#pragma unroll
    for (int j = 0; j < 8; ++j) yo[e[j >> 2] + (j & 3)] = v[j];
  }
}

// The row of id r: a negative id counts from the end once, then it is clamped to the table.
static __device__ __forceinline__ long long rlx_q_row(const void* ids, long long r, long long ids64, long long vocab) {
  long long id = ids64 ? ((const long long*)ids)[r] : (long long)((const int*)ids)[r];
  if (id < 0) id += vocab;
  return id < 0 ? 0 : id >= vocab ? vocab - 1 : id;
}

// out [R, row] = the rows of a block table picked by ids, dequantized: a thread per part.
template <int T>
static __device__ __forceinline__ void rlx_emb(const unsigned char* __restrict__ table, const void* __restrict__ ids,
                                               float* __restrict__ out, long long R, long long nbrow, long long vocab,
                                               long long ids64) {
  rlx_grid_dependency_wait();  // first: a programmatic dependent launch is safe (codegen/c.hpp)
  typedef rlx_qt<T> Q;
  const long long per_row = nbrow * Q::parts, total = R * per_row, step = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += step) {
    const long long r = i / per_row, blk = (i % per_row) / Q::parts;
    const long long row = rlx_q_row(ids, r, ids64, vocab);
    float v[8];
    int e[2];
    Q::part(table + (row * nbrow + blk) * Q::bytes, (int)(i % Q::parts), v, e);
    float* yo = out + (r * nbrow + blk) * Q::elems;
#pragma unroll
    for (int j = 0; j < 8; ++j) yo[e[j >> 2] + (j & 3)] = v[j];
  }
}

// out [R, D] = the rows of a table of another type, copied as they are: a thread per element.
template <class E>
static __device__ __forceinline__ void rlx_emb_plain(const E* __restrict__ table, const void* __restrict__ ids,
                                                     E* __restrict__ out, long long R, long long D, long long vocab,
                                                     long long ids64) {
  rlx_grid_dependency_wait();  // first: a programmatic dependent launch is safe (codegen/c.hpp)
  const long long total = R * D, step = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += step)
    out[i] = table[rlx_q_row(ids, i / D, ids64, vocab) * D + i % D];
}
extern "C" __global__ void rlx_emb_b1(const unsigned char* t, const void* ids, unsigned char* o, long long R,
                                      long long D, long long vocab, long long ids64) {
  rlx_emb_plain(t, ids, o, R, D, vocab, ids64);
}
extern "C" __global__ void rlx_emb_b2(const unsigned short* t, const void* ids, unsigned short* o, long long R,
                                      long long D, long long vocab, long long ids64) {
  rlx_emb_plain(t, ids, o, R, D, vocab, ids64);
}
extern "C" __global__ void rlx_emb_b4(const unsigned* t, const void* ids, unsigned* o, long long R, long long D,
                                      long long vocab, long long ids64) {
  rlx_emb_plain(t, ids, o, R, D, vocab, ids64);
}
extern "C" __global__ void rlx_emb_b8(const unsigned long long* t, const void* ids, unsigned long long* o, long long R,
                                      long long D, long long vocab, long long ids64) {
  rlx_emb_plain(t, ids, o, R, D, vocab, ids64);
}
)";

// Per block type: its traits and its three entries, rlx_qmm_<type>, rlx_deq_<type> and rlx_emb_<type>.
constexpr std::string_view kPerType = R"(
template <> struct rlx_qt<{id}> {{
  enum {{ bytes = {bytes}, elems = {elems}, parts = {elems} / 8 }};
  static __device__ __forceinline__ void part(const unsigned char* b, int p, float* v, int* e) {{
    rlx_q_part_{name}(b, p, v, e);
  }}
}};
extern "C" __global__ void __launch_bounds__(128) rlx_qmm_{name}(const float* x, const unsigned char* w, float* y,
                                                                long long M, long long N, long long K, long long q8) {{
  rlx_qmm<{id}>(x, w, y, M, N, K, q8);
}}
extern "C" __global__ void rlx_deq_{name}(const unsigned char* x, float* y, long long nblocks) {{
  rlx_deq<{id}>(x, y, nblocks);
}}
extern "C" __global__ void rlx_emb_{name}(const unsigned char* t, const void* ids, float* o, long long R,
                                         long long nbrow, long long vocab, long long ids64) {{
  rlx_emb<{id}>(t, ids, o, R, nbrow, vocab, ids64);
}}
)";

int type_id(ir::DType t) {
  const auto* it = std::find(std::begin(ir::kBlockDTypes), std::end(ir::kBlockDTypes), t);
  return it == std::end(ir::kBlockDTypes) ? -1 : int(it - std::begin(ir::kBlockDTypes));
}

constexpr unsigned kThreads = 256;          // dequantize and embedding
constexpr unsigned kGemvWarps = 4;          // warps per block of quantized_matmul (its __launch_bounds__)
constexpr std::int64_t kMaxGrid = 1 << 16;  // the grid-stride loops cover the rest

unsigned blocks_for(std::int64_t work, std::int64_t per_block) {
  return unsigned(std::clamp<std::int64_t>((work + per_block - 1) / per_block, 1, kMaxGrid));
}

}  // namespace

const std::string& quant_program(ir::DType t) {
  static std::mutex mu;
  static std::map<ir::DType, std::string> programs;
  std::lock_guard lock(mu);
  std::string& s = programs[type_id(t) >= 0 ? t : ir::DType::F32];
  if (s.empty()) {
    s = std::string(kHead) + std::string(codegen::c::kCudaGridDependencyWait) + std::string(kPartsCode) + "\n" +
        std::string(kKernels);
    if (type_id(t) >= 0)
      s += fmt::format(fmt::runtime(kPerType), fmt::arg("id", type_id(t)), fmt::arg("name", ir::dtype_name(t)),
                       fmt::arg("bytes", ir::block_bytes(t)), fmt::arg("elems", ir::block_elems(t)));
  }
  return s;
}

bool plan_quant(const compile::LirModule& lir, const compile::Kernel& k, QuantLaunch* out, std::string* why) {
  std::vector<compile::BufferId> ins;
  const ir::Node* op = sole_op(k, &ins, why);
  if (!op) return false;
  if (op->op != ir::OpKind::QuantizedMatmul && op->op != ir::OpKind::Dequantize && op->op != ir::OpKind::Embedding)
    return *why = "no quantized_matmul, dequantize or embedding in the kernel", false;
  for (auto id : ins)
    if (!lir.buffer(id).shape.empty() && lir.buffer(id).numel() == 0) return *why = "an empty operand", false;
  auto shape = [&](std::size_t i) -> const std::vector<std::int64_t>& { return lir.buffer(ins[i]).shape; };
  auto dtype = [&](std::size_t i) { return lir.buffer(ins[i]).dtype; };
  QuantLaunch l;
  l.buffers = ins;
  l.buffers.push_back(k.outputs[0]);
  switch (op->op) {
    case ir::OpKind::QuantizedMatmul: {
      const ir::DType wt = dtype(1);
      if (type_id(wt) < 0 || dtype(0) != ir::DType::F32) return *why = "not f32 x and a block-typed w", false;
      const std::int64_t N = shape(1).at(0), K = shape(1).at(1);
      std::int64_t M = 1;
      for (std::size_t d = 0; d + 1 < shape(0).size(); ++d) M *= shape(0)[d];
      if (M * N == 0) return *why = "an empty product", false;
      const bool q8 = op->attrs.get_str("activations") == "q8";
      l.entry = fmt::format("rlx_qmm_{}", ir::dtype_name(wt));
      l.program = wt;
      l.block = 32 * kGemvWarps;
      l.grid = blocks_for(N, kGemvWarps);
      l.scalars = {M, N, K, q8 ? 1 : 0};
      break;
    }
    case ir::OpKind::Dequantize: {
      const ir::DType t = dtype(0);
      if (type_id(t) < 0) return *why = "not a block type", false;
      std::int64_t n = 1;
      for (auto d : shape(0)) n *= d;
      const std::int64_t blocks = n / std::int64_t(ir::block_elems(t));
      if (blocks == 0) return *why = "an empty operand", false;
      l.entry = fmt::format("rlx_deq_{}", ir::dtype_name(t));
      l.program = t;
      l.block = kThreads;
      l.grid = blocks_for(blocks * std::int64_t(ir::block_elems(t)) / 8, kThreads);
      l.scalars = {blocks};
      break;
    }
    default: {  // embedding
      const ir::DType t = dtype(0), it = dtype(1);
      if (it != ir::DType::I32 && it != ir::DType::I64) return *why = "ids neither i32 nor i64", false;
      std::int64_t R = 1;
      for (auto d : shape(1)) R *= d;
      const std::int64_t vocab = shape(0).at(0), D = shape(0).at(1);
      if (R * D == 0 || vocab == 0) return *why = "an empty table or no ids", false;
      const std::int64_t ids64 = it == ir::DType::I64 ? 1 : 0;
      l.block = kThreads;
      if (type_id(t) >= 0) {
        const auto elems = std::int64_t(ir::block_elems(t));
        l.entry = fmt::format("rlx_emb_{}", ir::dtype_name(t));
        l.program = t;
        l.grid = blocks_for(R * D / 8, kThreads);
        l.scalars = {R, D / elems, vocab, ids64};
      } else {
        const std::size_t size = ir::dtype_size(t);
        if (size != 1 && size != 2 && size != 4 && size != 8) return *why = "an element of an odd size", false;
        l.entry = fmt::format("rlx_emb_b{}", size);
        l.grid = blocks_for(R * D, kThreads);
        l.scalars = {R, D, vocab, ids64};
      }
    }
  }
  *out = std::move(l);
  return true;
}

}  // namespace rlx::backends::cuda
