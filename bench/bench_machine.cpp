// Machine limits measured on the spot: peak f32 FMA throughput (all cores)
// and memory copy bandwidth (all cores). Every other figure is reported as a
// percentage of one of these. Also prints the machine and OpenBLAS version.
#include <cblas.h>
#include <immintrin.h>

#include <fstream>

#include "common.hpp"

namespace {

using namespace rlx::bench;

// More independent accumulators than FMA latency x pipes, so the loop is
// throughput bound, yet few enough to stay in registers (32 zmm, 16 ymm).
constexpr int kAcc512 = 16, kAcc256 = 12;
constexpr long kIters = 20'000'000;

// One thread's FMA loop; returns a value so the compiler keeps the work.
__attribute__((target("avx512f,fma"))) float fma_loop_avx512(long iters) {
  __m512 acc[kAcc512];
  for (int j = 0; j < kAcc512; ++j) acc[j] = _mm512_set1_ps(0.001f * j);
  const __m512 m = _mm512_set1_ps(0.999999f), a = _mm512_set1_ps(1e-7f);
  for (long i = 0; i < iters; ++i)
    for (int j = 0; j < kAcc512; ++j) acc[j] = _mm512_fmadd_ps(acc[j], m, a);
  for (int j = 1; j < kAcc512; ++j) acc[0] = _mm512_add_ps(acc[0], acc[j]);
  alignas(64) float v[16];
  _mm512_store_ps(v, acc[0]);
  return v[0] + v[15];
}

__attribute__((target("avx2,fma"))) float fma_loop_avx2(long iters) {
  __m256 acc[kAcc256];
  for (int j = 0; j < kAcc256; ++j) acc[j] = _mm256_set1_ps(0.001f * j);
  const __m256 m = _mm256_set1_ps(0.999999f), a = _mm256_set1_ps(1e-7f);
  for (long i = 0; i < iters; ++i)
    for (int j = 0; j < kAcc256; ++j) acc[j] = _mm256_fmadd_ps(acc[j], m, a);
  for (int j = 1; j < kAcc256; ++j) acc[0] = _mm256_add_ps(acc[0], acc[j]);
  alignas(32) float v[8];
  _mm256_store_ps(v, acc[0]);
  return v[0] + v[7];
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.starts_with("model name")) return line.substr(line.find(':') + 2);
  return "unknown";
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = std::stoi(arg(argc, argv, "--reps", "5"));
  const bool avx512 = __builtin_cpu_supports("avx512f");
  const double flops_per_iter = avx512 ? 2.0 * kAcc512 * 16 : 2.0 * kAcc256 * 8;
  volatile float sink = 0;

  auto fma_all_cores = [&] {
    std::vector<float> partial(cores());
    {
      std::vector<std::jthread> pool;
      for (unsigned t = 0; t < cores(); ++t)
        pool.emplace_back([&, t] { partial[t] = avx512 ? fma_loop_avx512(kIters) : fma_loop_avx2(kIters); });
    }
    for (float p : partial) sink = sink + p;
  };
  auto fma = interleave({{"fma_loop", fma_all_cores}}, {.reps = reps});
  Work fma_work{flops_per_iter * double(kIters) * cores(), 0};
  emit("machine_peak_fma", fma_work, fma);
  progress("machine_peak_fma", fma);

  // 256 MiB per side: far past the last-level cache on any current CPU.
  const std::size_t n = std::size_t(256) << 20;
  std::vector<char> src(n, 1), dst(n, 0);
  auto copy = interleave({{"memcpy", [&] { parallel_memcpy(dst.data(), src.data(), n); }}}, {.reps = reps});
  emit("machine_copy", {0, 2.0 * double(n)}, copy);
  progress("machine_copy", copy);

  nlohmann::json info{
      {"machine", {{"cpu", cpu_model()}, {"cores", cores()}, {"isa", avx512 ? "avx512f+fma" : "avx2+fma"}}},
      {"versions", {{"rlx", RLX_VERSION}, {"openblas", openblas_get_config()}}}};
  std::printf("%s\n", info.dump().c_str());
}
