#pragma once
// How a MatMul kernel maps onto one cuBLASLt call (backend.cpp issues it).
// Row-major C[M,N] = A[M,K] B[K,N] is the column-major C^T = B^T A^T:
// cuBLAS's m is N, its n is the rows, its A is our B (N x K, leading dim N)
// and its B our A (K x rows, leading dim K). Batches are strided; an operand
// with no batch dims of its own is shared (stride 0), and a batched A against
// one B is a single GEMM of batch * M rows. bf16 and f16 operands are read as
// stored, through the widening casts the lowering puts in the kernel
// (BackendTraits::matmul_widened_operands), with f32 accumulation; a product
// whose one use is the kernel's output cast back to that type is written in it
// (cuBLASLt's D type), so no f32 copy of it reaches memory. A kernel whose rest is
// only a bias row, a residual and a relu runs them in cuBLASLt's epilogue, D = relu(A B + C + bias) with the
// residual as C, so no second kernel reads the product back. Needs no GPU: the tests check the
// mapping on the host against the reference interpreter.
#include <cstdint>
#include <optional>
#include <string>

#include "rlx/compile/lir.hpp"

namespace rlx::backends::cuda {

// What cuBLASLt's epilogue computes after the product: D = relu?(A B + residual + bias). Each is a body Input.
struct GemmEpilogue {
  std::optional<ir::NodeId> bias;      // a row of n, added to every row (CUBLASLT_EPILOGUE_BIAS)
  std::optional<ir::NodeId> residual;  // the product's shape, as C with beta 1
  bool relu = false;
};

struct GemmShape {
  std::int64_t n = 0, k = 0, rows = 0, batches = 1;
  // Elements between consecutive batches of our A, our B and the product (0: one matrix for every batch).
  std::int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  bool f64 = false;
  ir::DType operands = ir::DType::F32;  // A's and B's stored type: f32, f64, bf16 or f16
  ir::DType result = ir::DType::F32;    // the stored product's: the matmul's, or the output cast's
  bool cast_output = false;             // the kernel's one output is the product cast to `result`
  ir::NodeId matmul = 0, a = 0, b = 0;  // body nodes: the matmul and its two Input operands
  bool trans_b = false;                 // b holds B transposed ([..., N, K]), read with cuBLASLt's op T
  // Set when the kernel's one output is an f32 product of one GEMM through only a bias, a residual and a relu.
  std::optional<GemmEpilogue> epilogue;
};

// Nullopt with the reason in *why when the kernel's matmul is not one strided GEMM with f32, f64, bf16 or f16
// operands (then the generated nest runs it).
std::optional<GemmShape> gemm_shape(const compile::Kernel& kernel, std::string* why);

// The product exactly as the cuBLASLt call computes it, with its epilogue when `bias`/`residual` are given with `s`, on
// the host in double: c = A B per batch, with a, b and c read and written through the strides and leading dims above.
void gemm_on_host(const GemmShape& s, const double* a, const double* b, double* c, const double* bias = nullptr,
                  const double* residual = nullptr);

}  // namespace rlx::backends::cuda
