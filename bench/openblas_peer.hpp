#pragma once
// The OpenBLAS peer: cblas_sgemm on all cores. RLX's CPU backend pins
// OpenBLAS to one thread (it threads GEMM panels itself); the peer gets every
// core for its call and RLX gets its setting back.
#include <cblas.h>

#include <cstdint>

#include "common.hpp"

namespace rlx::bench {

// c[M, N] = a[M, K] @ b[K, N], all row-major and dense.
inline void openblas_sgemm(std::int64_t M, std::int64_t N, std::int64_t K, const float* a, const float* b, float* c) {
  const int rlx_threads = openblas_get_num_threads();
  openblas_set_num_threads(int(cores()));
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(M), int(N), int(K), 1.0f, a, int(K), b, int(N), 0.0f, c,
              int(N));
  openblas_set_num_threads(rlx_threads);
}

}  // namespace rlx::bench
