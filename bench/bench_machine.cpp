// Machine limits measured on the spot, all cores: peak f32 FMA throughput, peak
// int8 dot-product throughput (AVX-512 VNNI's vpdpbusd, the quantized kernels'
// instruction), memory copy bandwidth and memory read bandwidth. Every other
// figure is reported as a percentage of one of these. Also prints the machine
// and OpenBLAS version.
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

// One thread's vpdpbusd loop: 64 multiply-adds (128 int8 ops) per instruction.
__attribute__((target("avx512f,avx512vnni"))) int vnni_loop(long iters) {
  __m512i acc[kAcc512];
  for (int j = 0; j < kAcc512; ++j) acc[j] = _mm512_set1_epi32(j);
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
  for (long i = 0; i < iters; ++i)
    for (int j = 0; j < kAcc512; ++j) acc[j] = _mm512_dpbusd_epi32(acc[j], a, b);
  for (int j = 1; j < kAcc512; ++j) acc[0] = _mm512_add_epi32(acc[0], acc[j]);
  return _mm512_reduce_add_epi32(acc[0]);
}

// One thread's streaming read of [p, p + n): the sum of its 64-byte lines (four accumulators, so the loop
// waits on memory, not on the adds).
__attribute__((target("avx2"))) long read_loop(const char* p, std::size_t n) {
  __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
  for (std::size_t o = 0; o + 128 <= n; o += 128) {
    s0 = _mm256_add_epi64(s0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + o)));
    s1 = _mm256_add_epi64(s1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + o + 32)));
    s2 = _mm256_add_epi64(s2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + o + 64)));
    s3 = _mm256_add_epi64(s3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + o + 96)));
  }
  const __m256i s = _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3));
  return _mm256_extract_epi64(s, 0) + _mm256_extract_epi64(s, 1) + _mm256_extract_epi64(s, 2) +
         _mm256_extract_epi64(s, 3);
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

  if (__builtin_cpu_supports("avx512vnni")) {
    auto dot = interleave({{"vpdpbusd_loop",
                            [&] {
                              std::vector<int> partial(cores());
                              {
                                std::vector<std::jthread> pool;
                                for (unsigned t = 0; t < cores(); ++t)
                                  pool.emplace_back([&, t] { partial[t] = vnni_loop(kIters); });
                              }
                              for (int p : partial) sink = sink + float(p);
                            }}},
                          {.reps = reps});
    // Reported as flops: two int8 operations per multiply-add, 64 multiply-adds per instruction.
    emit("machine_peak_int8", Work{2.0 * 64 * kAcc512 * double(kIters) * cores(), 0}, dot);
    progress("machine_peak_int8", dot);
  }

  // 256 MiB per side: far past the last-level cache on any current CPU.
  const std::size_t n = std::size_t(256) << 20;
  std::vector<char> src(n, 1), dst(n, 0);
  auto copy = interleave({{"memcpy", [&] { parallel_memcpy(dst.data(), src.data(), n); }}}, {.reps = reps});
  emit("machine_copy", {0, 2.0 * double(n)}, copy);
  progress("machine_copy", copy);
  // Read only (a decode step's weights): each core streams its share of src.
  std::vector<long> sums(cores());
  auto* base = reinterpret_cast<char*>((reinterpret_cast<std::uintptr_t>(src.data()) + 63) / 64 * 64);
  const std::size_t usable = (n - 64) / cores() / 128 * 128;
  auto read = interleave({{"read_loop",
                           [&] {
                             {
                               std::vector<std::jthread> pool;
                               for (unsigned t = 0; t < cores(); ++t)
                                 pool.emplace_back([&, t] { sums[t] = read_loop(base + t * usable, usable); });
                             }
                             for (long v : sums) sink = sink + float(v);
                           }}},
                         {.reps = reps});
  emit("machine_read", {0, double(usable) * cores()}, read);
  progress("machine_read", read);

  nlohmann::json info{
      {"machine", {{"cpu", cpu_model()}, {"cores", cores()}, {"isa", avx512 ? "avx512f+fma" : "avx2+fma"}}},
      {"versions", {{"rlx", RLX_VERSION}, {"openblas", openblas_get_config()}}}};
  std::printf("%s\n", info.dump().c_str());
}
