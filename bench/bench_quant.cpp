// Quantized GEMV (src/backends/cpu/quant_matmul.hpp) per ggml type at SmolLM2's shapes and 4096x4096,
// in GB/s of weight bytes, against OpenBLAS's f32 sgemv of the same shape and the machine's copy and
// read bandwidth. Two regimes per shape: "hot" (one copy of the weight, cache-resident where it
// fits) and "cold" (calls rotate over copies of at least 160 MB, so the weight streams from DRAM as
// it does in decode). JSON lines on stdout (bench/common.hpp); a table on stderr.
// Then GEMM (prefill, --gemm-n activation rows) in GFLOP/s against OpenBLAS's f32 sgemm.
//   bench_quant [--reps 5] [--threads all] [--shapes 576x576,...] [--types Q4_0,...]
//               [--gemm-shapes 576x576,...] [--gemm-n 512]
#include <cblas.h>

#include <cstdio>
#include <sstream>

#include "backends/cpu/quant_matmul.hpp"
#include "common.hpp"
#include "rlx/gguf/quants.hpp"
#include "rlx/ir/quants.hpp"

namespace {

using rlx::backends::cpu::QuantMode;
// A ggml type's name ("Q4_K") as the dtype of the same blocks.
std::optional<rlx::ir::DType> parse_type(std::string_view name) {
  const auto g = rlx::gguf::parse_ggml_type(name);
  return g ? rlx::gguf::to_dtype(*g) : std::nullopt;
}
using namespace rlx::bench;

constexpr std::size_t kColdBytes = std::size_t(160) << 20;

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

double best(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// Read bandwidth: a sum over n bytes split across the cores.
std::uint64_t parallel_read(const std::uint64_t* p, std::size_t words) {
  const unsigned t = cores();
  std::vector<std::uint64_t> part(t);
  {
    std::vector<std::jthread> pool;
    for (unsigned i = 0; i < t; ++i)
      pool.emplace_back([&, i] {
        const std::size_t b = words * i / t, e = words * (i + 1) / t;
        std::uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        std::size_t k = b;
        for (; k + 4 <= e; k += 4) {
          s0 += p[k];
          s1 += p[k + 1];
          s2 += p[k + 2];
          s3 += p[k + 3];
        }
        for (; k < e; ++k) s0 += p[k];
        part[i] = s0 + s1 + s2 + s3;
      });
  }
  std::uint64_t s = 0;
  for (auto v : part) s += v;
  return s;
}

struct Row {
  std::string shape, regime, impl;
  double gbs, ms, best_gbs;
};

}  // namespace

int main(int argc, char** argv) try {
  const int reps = std::stoi(arg(argc, argv, "--reps", "5"));
  const int threads = std::stoi(arg(argc, argv, "--threads", std::to_string(cores())));
  const auto shape_list = split(arg(argc, argv, "--shapes", "576x576,1536x576,576x1536,49152x576,4096x4096"));
  const auto type_list = split(arg(argc, argv, "--types", "Q4_0,Q4_1,Q5_0,Q5_1,Q8_0,Q2_K,Q3_K,Q4_K,Q5_K,Q6_K"));
  Timing timing;
  timing.reps = reps;
  timing.settle_s = 0.02;
  const auto gemm_shapes = split(arg(argc, argv, "--gemm-shapes", "576x576,1536x576,576x1536"));
  const std::int64_t gemm_n = std::stoll(arg(argc, argv, "--gemm-n", "512"));
  std::vector<Row> rows_out, gemm_out;
  std::fprintf(stderr, "bench_quant: %d threads, quant ISAs:", threads);
  for (const auto& isa : rlx::backends::cpu::quant_isas()) std::fprintf(stderr, " %s", isa.c_str());
  std::fprintf(stderr, "\n");

  // The bandwidth roofs.
  {
    const std::size_t n = std::size_t(256) << 20;
    std::vector<std::uint64_t> a(n / 8, 1), b(n / 8, 0);
    std::uint64_t sink = 0;
    auto s = interleave({{"memcpy", [&] { parallel_memcpy(b.data(), a.data(), n); }},
                         {"read", [&] { sink += parallel_read(a.data(), n / 8); }}},
                        timing);
    emit("bandwidth_256MB", Work{0, double(n)}, s);
    for (const auto& x : s)
      rows_out.push_back({"256MB", "dram", x.impl, double(n) / median(x.seconds) / 1e9, median(x.seconds) * 1e3,
                          double(n) / best(x.seconds) / 1e9});
    if (sink == 42) std::fprintf(stderr, " ");
  }

  for (const auto& shape : shape_list) {
    const auto xpos = shape.find('x');
    const std::int64_t rows = std::stoll(shape.substr(0, xpos)), cols = std::stoll(shape.substr(xpos + 1));
    rlx::ir::Tensor wf = random_f32({rows, cols}, 1);
    rlx::ir::Tensor xt = random_f32({cols}, 2);
    const float* x = xt.data_as<float>();
    std::vector<float> y(static_cast<std::size_t>(rows));
    const std::size_t f32_bytes = std::size_t(rows * cols) * 4;
    for (const char* regime : {"hot", "cold"}) {
      const bool cold = regime[0] == 'c';
      // f32: OpenBLAS sgemv on every core.
      {
        const std::size_t copies = cold ? std::max<std::size_t>(2, kColdBytes / f32_bytes + 1) : 1;
        std::vector<std::vector<float>> ws(copies - 1);
        for (auto& c : ws) c.assign(wf.data_as<float>(), wf.data_as<float>() + rows * cols);
        std::size_t next = 0;
        openblas_set_num_threads(threads);
        auto s = interleave({{"openblas_sgemv",
                              [&] {
                                const float* w = next == 0 ? wf.data_as<float>() : ws[next - 1].data();
                                next = (next + 1) % copies;
                                cblas_sgemv(CblasRowMajor, CblasNoTrans, int(rows), int(cols), 1.0f, w, int(cols), x, 1,
                                            0.0f, y.data(), 1);
                              }}},
                            timing);
        const std::string wl = std::string("gemv_f32_") + shape + "_" + regime;
        emit(wl, Work{2.0 * double(rows * cols), double(f32_bytes)}, s);
        progress(wl, s);
        rows_out.push_back({shape, regime, "f32 sgemv", double(f32_bytes) / median(s[0].seconds) / 1e9,
                            median(s[0].seconds) * 1e3, double(f32_bytes) / best(s[0].seconds) / 1e9});
      }
      for (const auto& tn : type_list) {
        const auto t = parse_type(tn);
        if (!t) throw rlx::Error("unknown type " + tn);
        if (cols % std::int64_t(rlx::ir::block_elems(*t)) != 0) continue;
        const std::size_t bytes = rlx::ir::quantized_bytes(*t, std::size_t(rows * cols));
        const std::size_t copies = cold ? std::max<std::size_t>(2, kColdBytes / bytes + 1) : 1;
        std::vector<std::vector<std::byte>> ws(copies);
        ws[0].resize(bytes);
        rlx::ir::quantize(*t, std::span(wf.data_as<float>(), std::size_t(rows * cols)), ws[0]);
        for (std::size_t c = 1; c < copies; ++c) ws[c] = ws[0];
        std::size_t next = 0;
        const auto& table = rlx::backends::cpu::select_quant_table();
        std::vector<Impl> impls = {{std::string("rlx_") + table.name, [&] {
                                      rlx::backends::cpu::quant_gemm_with(table, *t, ws[next].data(), rows, cols, x, 1,
                                                                          y.data(), QuantMode::Fast, threads);
                                      next = (next + 1) % copies;
                                    }}};
        if (std::string(table.name) != "avx2" && !cold)
          impls.push_back({"rlx_avx2", [&] {
                             rlx::backends::cpu::quant_gemm_with(rlx::backends::cpu::quant_table("avx2"), *t,
                                                                 ws[0].data(), rows, cols, x, 1, y.data(),
                                                                 QuantMode::Fast, threads);
                           }});
        auto s = interleave(impls, timing);
        const std::string wl = "gemv_" + tn + "_" + shape + "_" + regime;
        emit(wl, Work{2.0 * double(rows * cols), double(bytes)}, s);
        progress(wl, s);
        for (const auto& x2 : s)
          rows_out.push_back({shape, regime, tn + " " + x2.impl, double(bytes) / median(x2.seconds) / 1e9,
                              median(x2.seconds) * 1e3, double(bytes) / best(x2.seconds) / 1e9});
      }
    }
  }
  // Prefill: y [n, rows] = x [n, cols] @ W^T, in GFLOP/s, against OpenBLAS's f32 sgemm.
  for (const auto& shape : gemm_shapes) {
    const auto xpos = shape.find('x');
    const std::int64_t rows = std::stoll(shape.substr(0, xpos)), cols = std::stoll(shape.substr(xpos + 1));
    rlx::ir::Tensor wf = random_f32({rows, cols}, 3);
    rlx::ir::Tensor xt = random_f32({gemm_n, cols}, 4);
    std::vector<float> y(static_cast<std::size_t>(gemm_n * rows));
    const double flops = 2.0 * double(gemm_n) * double(rows) * double(cols);
    const std::string sname = shape + "_n" + std::to_string(gemm_n);
    {
      openblas_set_num_threads(threads);
      auto s = interleave({{"openblas_sgemm",
                            [&] {
                              cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(gemm_n), int(rows), int(cols),
                                          1.0f, xt.data_as<float>(), int(cols), wf.data_as<float>(), int(cols), 0.0f,
                                          y.data(), int(rows));
                            }}},
                          timing);
      emit("gemm_f32_" + sname, Work{flops, 0}, s);
      progress("gemm_f32_" + sname, s);
      gemm_out.push_back({sname, "", "f32 sgemm", flops / median(s[0].seconds) / 1e9, median(s[0].seconds) * 1e3,
                          flops / best(s[0].seconds) / 1e9});
    }
    for (const auto& tn : type_list) {
      const auto t = parse_type(tn);
      if (!t || cols % std::int64_t(rlx::ir::block_elems(*t)) != 0) continue;
      std::vector<std::byte> wq(rlx::ir::quantized_bytes(*t, std::size_t(rows * cols)));
      rlx::ir::quantize(*t, std::span(wf.data_as<float>(), std::size_t(rows * cols)), wq);
      const auto& table = rlx::backends::cpu::select_quant_table();
      auto s = interleave({{std::string("rlx_") + table.name,
                            [&] {
                              rlx::backends::cpu::quant_gemm_with(table, *t, wq.data(), rows, cols, xt.data_as<float>(),
                                                                  gemm_n, y.data(), QuantMode::Fast, threads);
                            }}},
                          timing);
      emit("gemm_" + tn + "_" + sname, Work{flops, double(wq.size())}, s);
      progress("gemm_" + tn + "_" + sname, s);
      gemm_out.push_back({sname, "", tn + " " + s[0].impl, flops / median(s[0].seconds) / 1e9,
                          median(s[0].seconds) * 1e3, flops / best(s[0].seconds) / 1e9});
    }
  }
  std::fprintf(stderr, "\n%-10s %-5s %-22s %9s %9s %9s\n", "shape", "", "impl", "GB/s", "best GB/s", "ms");
  for (const auto& r : rows_out)
    std::fprintf(stderr, "%-10s %-5s %-22s %9.1f %9.1f %9.4f\n", r.shape.c_str(), r.regime.c_str(), r.impl.c_str(),
                 r.gbs, r.best_gbs, r.ms);
  std::fprintf(stderr, "\n%-16s %-22s %9s %9s %9s\n", "gemm", "impl", "GFLOP/s", "best", "ms");
  for (const auto& r : gemm_out)
    std::fprintf(stderr, "%-16s %-22s %9.1f %9.1f %9.4f\n", r.shape.c_str(), r.impl.c_str(), r.gbs, r.best_gbs, r.ms);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_quant: %s\n", e.what());
  return 1;
}
