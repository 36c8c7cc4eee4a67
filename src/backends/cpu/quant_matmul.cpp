#include "backends/cpu/quant_matmul.hpp"

#include <algorithm>
#include <span>

#include "backends/cpu/thread_pool.hpp"
#include "rlx/env.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/quants.hpp"

namespace rlx::backends::cpu {

using ir::DType;

namespace {

bool cpu_has_avx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
bool cpu_has_avx512vnni() {
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

std::string type_name(DType t) { return std::string(ir::dtype_name(t)); }

void check_shape(const char* what, DType t, std::int64_t rows, std::int64_t cols, std::int64_t n) {
  const auto block = static_cast<std::int64_t>(ir::block_elems(t));
  if (rows <= 0 || n <= 0)
    throw Error(std::string(what) + " of " + type_name(t) + ": rows (" + std::to_string(rows) + ") and n (" +
                std::to_string(n) + ") must be positive");
  if (cols <= 0 || cols % block != 0)
    throw Error(std::string(what) + " of " + type_name(t) + ": cols = " + std::to_string(cols) +
                " is not a positive multiple of the block (" + std::to_string(block) + ")");
}

// Rows per task: at least ~32 KB of weights, so the pool's hand-off stays small against the work, and a
// multiple of 16, the kernels' row tile (a task's boundary then never splits one).
std::int64_t row_grain(std::size_t row_bytes) {
  const auto rows = std::max<std::int64_t>(1, static_cast<std::int64_t>(32768 / std::max<std::size_t>(row_bytes, 1)));
  return (rows + 15) / 16 * 16;
}

// Scratch that survives between calls on one thread (no allocation in steady state).
std::byte* scratch(std::vector<std::byte>& v, std::size_t bytes) {
  if (v.size() < bytes) v.resize(bytes);
  return v.data();
}

}  // namespace

bool quant_fast_supported(DType t) {
  switch (t) {
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q8_0:
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K: return true;
    default: return false;
  }
}

bool quant_exact_supported(DType t) { return ir::can_dequantize(t); }

DType quant_act_type(DType t) {
  if (!quant_fast_supported(t))
    throw Error("quantized matmul: no fast kernel for " + type_name(t) +
                " (fast: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)");
  return ir::block_elems(t) == 256 ? DType::Q8_K : DType::Q8_0;
}

std::size_t quant_act_bytes(DType t, std::int64_t cols) {
  const DType a = quant_act_type(t);
  return a == DType::Q8_K ? static_cast<std::size_t>(cols / 256) * sizeof(ir::BlockQ8_K)
                          : static_cast<std::size_t>(cols / 32) * sizeof(ActQ8);
}

std::vector<std::string> quant_isas() {
  std::vector<std::string> out;
  if (cpu_has_avx512vnni()) out.emplace_back("avx512vnni");
  if (cpu_has_avx2()) out.emplace_back("avx2");
  out.emplace_back("generic");
  return out;
}

const QuantTable& quant_table(std::string_view isa) {
  if (isa == "generic") return generic::quant_table();
  if (isa == "avx2" && cpu_has_avx2()) return avx2::quant_table();
  if (isa == "avx512vnni" && cpu_has_avx512vnni()) return avx512vnni::quant_table();
  if (isa == "avx2" || isa == "avx512vnni")
    throw Error("quantized matmul: CPU ISA '" + std::string(isa) + "' is not supported by this processor");
  throw Error("quantized matmul: unknown ISA '" + std::string(isa) + "' (expected generic, avx2 or avx512vnni)");
}

const QuantTable& select_quant_table() {
  auto want = env::get("RLX_CPU_ISA");
  if (want && *want == "generic") return generic::quant_table();
  if (want && *want == "avx2") return quant_table("avx2");
  // avx512 (or no choice): the best this CPU has.
  return quant_table(quant_isas().front());
}

void quant_activations_with(const QuantTable& table, DType t, const float* x, std::int64_t cols, std::int64_t n,
                            std::byte* out, int max_threads) {
  check_shape("quantized activations", t, 1, cols, n);
  const DType act = quant_act_type(t);
  const auto bytes = static_cast<std::int64_t>(quant_act_bytes(t, cols));
  parallel_for(
      n, std::max<std::int64_t>(1, 16384 / cols),
      [&](std::int64_t j0, std::int64_t j1) {
        for (std::int64_t j = j0; j < j1; ++j) table.quantize_act(act, x + j * cols, cols, out + j * bytes);
      },
      max_threads);
}

void quant_gemm_with(const QuantTable& table, DType t, const std::byte* w, std::int64_t rows, std::int64_t cols,
                     const float* x, std::int64_t n, float* y, QuantMode mode, int max_threads) {
  if (mode == QuantMode::Exact && !quant_exact_supported(t))
    throw Error("quantized matmul (exact): " + type_name(t) + " cannot be dequantized");
  if (mode == QuantMode::Fast) (void)quant_act_type(t);  // throws naming t when it has no fast kernel
  check_shape(mode == QuantMode::Fast ? "quantized matmul" : "quantized matmul (exact)", t, rows, cols, n);
  const std::size_t row_bytes = ir::quantized_bytes(t, static_cast<std::size_t>(cols));
  const std::int64_t grain = row_grain(row_bytes);
  if (mode == QuantMode::Exact) {
    parallel_for(
        rows, grain,
        [&](std::int64_t r0, std::int64_t r1) {
          thread_local std::vector<std::byte> buf;
          auto* row = reinterpret_cast<float*>(scratch(buf, static_cast<std::size_t>(cols) * sizeof(float)));
          for (std::int64_t r = r0; r < r1; ++r) {
            ir::dequantize(t, std::span(w + r * static_cast<std::int64_t>(row_bytes), row_bytes),
                           std::span(row, static_cast<std::size_t>(cols)));
            for (std::int64_t j = 0; j < n; ++j) y[j * rows + r] = table.dot_f32(row, x + j * cols, cols);
          }
        },
        max_threads);
    return;
  }
  const auto act_bytes = static_cast<std::int64_t>(quant_act_bytes(t, cols));
  thread_local std::vector<std::byte> act_buf;
  std::byte* act = scratch(act_buf, static_cast<std::size_t>(act_bytes * n));
  quant_activations_with(table, t, x, cols, n, act, max_threads);
  const std::int64_t nb = cols / static_cast<std::int64_t>(ir::block_elems(t));
  const auto scratch_bytes = static_cast<std::size_t>(table.scratch_bytes(t, cols, n));
  parallel_for(
      rows, grain,
      [&](std::int64_t r0, std::int64_t r1) {
        thread_local std::vector<std::byte> buf;
        std::byte* s = scratch_bytes > 0 ? scratch(buf, scratch_bytes) : nullptr;
        if (!table.dot_rows(t, w, static_cast<std::int64_t>(row_bytes), r0, r1, nb, act, act_bytes, n, y, rows, s))
          throw Error("quantized matmul: no fast kernel for " + type_name(t));
      },
      max_threads);
}

void quant_gemv(DType t, const std::byte* w, std::int64_t rows, std::int64_t cols, const float* x, float* y,
                QuantMode mode) {
  quant_gemm_with(select_quant_table(), t, w, rows, cols, x, 1, y, mode);
}

void quant_gemm(DType t, const std::byte* w, std::int64_t rows, std::int64_t cols, const float* x, std::int64_t n,
                float* y, QuantMode mode) {
  quant_gemm_with(select_quant_table(), t, w, rows, cols, x, n, y, mode);
}

}  // namespace rlx::backends::cpu
