// Op-parity variants of GGUF's block-quantized types: dequantize, quantize and quantized_matmul over every
// block type, with rows and columns past the CUDA GEMV's tiles (tests/conformance/test_op_parity.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "conformance/parity_variant.hpp"

namespace rlx::conformance {

// A block-typed value: random values quantized (its elements are its blocks' values).
inline Gen quantized(double lo = -2.0, double hi = 2.0) {
  return [lo, hi](DType t, const Ints& s, std::mt19937_64& rng) {
    const ir::Tensor f = testing::random_tensor(DType::F32, s, rng, lo, hi);
    return ir::Tensor::from_f64(t, s, f.to_f64());
  };
}
// Two blocks per row.
inline std::int64_t two_blocks(DType t) { return 2 * std::int64_t(ir::block_elems(t)); }

inline Variants dequantize_variants() {
  Variants r;
  for (DType t : ir::kBlockDTypes)
    for (const Ints& lead : {Ints{}, Ints{3}, Ints{2, 1}}) {
      Ints s = lead;
      s.push_back(two_blocks(t));
      V v("dequantize " + dt(t) + str(s));
      r.push_back(v.out({v.g().dequantize(v.in("x", t, s, quantized()))}));
    }
  return r;
}

// The quantized value read back: each row's blocks from ggml's reference quantizer.
inline Variants quantize_variants() {
  Variants r;
  for (DType t : ir::kBlockDTypes) {
    const Ints s{3, two_blocks(t)};
    V v("quantize f32" + str(s) + " to " + dt(t));
    r.push_back(v.out({v.g().dequantize(v.g().quantize(v.in("x", DType::F32, s, uniform(-3, 3)), t))}));
  }
  return r;
}

// x [.., K] against a weight [5, K] in each block type, with f32 and q8 activations; the weight is a param,
// as a model's is.
inline Variants quantized_matmul_variants() {
  Variants r;
  for (DType t : ir::kBlockDTypes)
    for (const char* act : {"f32", "q8"})
      for (const Ints& lead : {Ints{}, Ints{4}, Ints{2, 3}}) {
        if (std::string_view(act) == "q8" && (t == DType::Q8_1 || t == DType::Q8_K)) continue;  // activation formats
        const std::int64_t K = two_blocks(t);
        Ints xs = lead;
        xs.push_back(K);
        V v(std::string("quantized_matmul ") + act + " activations, x" + str(xs) + ", w " + dt(t) + "[5, " +
            std::to_string(K) + "]");
        v.v.gens["w"] = quantized(-1, 1);
        auto w = v.g().param("w", Shape{5, K}, t);
        r.push_back(v.tol({1e-4, 1e-4}).out({v.g().quantized_matmul(v.in("x", DType::F32, xs), w, act)}));
      }
  // More rows than the CUDA GEMV takes in one pass over a weight row (8), more columns than a block of its
  // warps (4), and 3 blocks a row: Q4_1 and Q8_0 (SmolLM2's file), Q4_0, Q4_K and Q6_K.
  for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::Q4_K, DType::Q6_K})
    for (const char* act : {"f32", "q8"}) {
      const std::int64_t K = 3 * std::int64_t(ir::block_elems(t));
      V v(std::string("quantized_matmul ") + act + " activations, x[2, 9, " + std::to_string(K) + "], w " + dt(t) +
          "[13, " + std::to_string(K) + "]");
      v.v.gens["w"] = quantized(-1, 1);
      auto w = v.g().param("w", Shape{13, K}, t);
      r.push_back(v.tol({1e-4, 1e-4}).out({v.g().quantized_matmul(v.in("x", DType::F32, {2, 9, K}), w, act)}));
    }
  return r;
}

}  // namespace rlx::conformance
