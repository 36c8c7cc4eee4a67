// Kernel-level workloads whose peers run in this process, interleaved with
// RLX rep by rep: f32 GEMM/GEMV vs cblas_sgemm on the same buffers, and a
// fused 8-op elementwise chain vs all-core memcpy and vs the same chain unfused.

#include <random>

#include "distributed/digits_mlp.hpp"
#include "openblas_peer.hpp"
#include "rlx/compile/quantize.hpp"
#include "rlx/ir/graph.hpp"
#include "rlx/models/demo_models.hpp"

namespace {

using namespace rlx;
using namespace rlx::bench;

float max_abs_diff(const ir::Tensor& a, const ir::Tensor& b) {
  float d = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) d = std::max(d, std::abs(a.data_as<float>()[i] - b.data_as<float>()[i]));
  return d;
}

void gemm(const Session& session, const std::string& name, std::int64_t M, std::int64_t N, std::int64_t K, int reps) {
  ir::Graph g("gemm");
  g.add_output(g.matmul(g.input("a", {M, K}), g.input("b", {K, N})), "c");
  Runner rlx(session.compile(g), {}, {{"a", random_f32({M, K}, 1)}, {"b", random_f32({K, N}, 2)}});
  ir::Tensor c(ir::DType::F32, {M, N});
  const float* a = rlx.input("a").data_as<float>();
  const float* b = rlx.input("b").data_as<float>();
  auto blas = [&] { openblas_sgemm(M, N, K, a, b, c.data_as<float>()); };

  auto s = interleave({{"rlx", std::ref(rlx)}, {"openblas", blas}}, {.reps = reps});
  // GEMV is bound by streaming B once, so its bytes are reported (and its limit is copy bandwidth).
  const double bytes = M == 1 ? double(K * N + K + N) * sizeof(float) : 0;
  emit(name, {2.0 * double(M) * double(N) * double(K), bytes}, s);
  progress(name, s);
  std::fprintf(stderr, "    check: max |rlx - openblas| = %g\n", max_abs_diff(rlx.outputs()[0], c));
}

// The low-precision GEMMs against RLX's own f32 GEMM on the same layer (x @ w, w a weight): int8 (u8 x i8 -> i32
// exact, VNNI) and bf16 (bf16 x bf16 -> f32 accumulation). The records carry each one's operations per second;
// the ratios to the f32 record are the precision issue's figures. No peer here runs either product in process
// (Debian's OpenBLAS has no sbgemm).
void gemm_lowp(const Session& session, std::int64_t n, int reps) {
  auto layer = [&](ir::DType a, ir::DType w, ir::DType wide) {
    ir::Graph g("gemm " + std::string(ir::dtype_name(a)));
    auto x = g.input("x", {n, n}, a), b = g.param("w", {n, n}, w);
    g.add_output(a == wide ? g.matmul(x, b) : g.matmul(g.cast(x, wide), g.cast(b, wide)), "y");
    return g;
  };
  auto bytes = [&](ir::DType t, std::uint64_t seed) {
    ir::Tensor v(t, {n, n});
    std::mt19937_64 rng(seed);
    // Any byte for the 8-bit types; bf16 as normal numbers of either sign in [2^-7, 2).
    for (std::size_t i = 0; i < v.nbytes(); ++i)
      v.data()[i] = std::byte(t == ir::DType::BF16 && i % 2 ? 0x3c | (rng() & 0x83) : rng() & 0xff);
    return v;
  };
  Runner f32(session.compile(layer(ir::DType::F32, ir::DType::F32, ir::DType::F32)), {{"w", random_f32({n, n}, 2)}},
             {{"x", random_f32({n, n}, 1)}});
  Runner i8(session.compile(layer(ir::DType::U8, ir::DType::I8, ir::DType::I32)), {{"w", bytes(ir::DType::I8, 2)}},
            {{"x", bytes(ir::DType::U8, 1)}});
  Runner bf16(session.compile(layer(ir::DType::BF16, ir::DType::BF16, ir::DType::F32)),
              {{"w", bytes(ir::DType::BF16, 2)}}, {{"x", bytes(ir::DType::BF16, 1)}});
  auto s =
      interleave({{"rlx", std::ref(f32)}, {"rlx_int8", std::ref(i8)}, {"rlx_bf16", std::ref(bf16)}}, {.reps = reps});
  const std::string name = "gemm_lowp_" + std::to_string(n) + "^3";
  emit(name, {2.0 * double(n) * double(n) * double(n), 0}, s);
  progress(name, s);
}

// Auto-mixed precision's linear layer, x @ w with f32 weights narrowed to bf16 (the precision pass's graph): the
// weight rounded as it is packed, once (rlx_bf16_amp), against the same layer with the weight cast and packed
// every run (rlx_bf16_cast_per_run: w fed as an input, which is what a param cost before the pack took the
// cast over), and f32 (rlx). M rows of 1024 x 1024.
void amp_linear(const Session& session, std::int64_t m, int reps) {
  const std::int64_t n = 1024;
  auto layer = [&](bool narrow, bool w_param) {
    ir::Graph g("amp linear");
    auto x = g.input("x", {m, n});
    auto w = w_param ? g.param("w", {n, n}) : g.input("w", {n, n});
    const auto bf16 = [&](ir::NodeId v) { return g.cast(g.cast(v, ir::DType::BF16), ir::DType::F32); };
    g.add_output(narrow ? g.matmul(bf16(x), bf16(w)) : g.matmul(x, w), "y");
    return g;
  };
  const ir::Tensor x = random_f32({m, n}, 1), w = random_f32({n, n}, 2);
  Runner f32(session.compile(layer(false, true)), {{"w", w}}, {{"x", x}});
  Runner amp(session.compile(layer(true, true)), {{"w", w}}, {{"x", x}});
  Runner per_run(session.compile(layer(true, false)), {}, {{"x", x}, {"w", w}});
  auto s = interleave(
      {{"rlx", std::ref(f32)}, {"rlx_bf16_amp", std::ref(amp)}, {"rlx_bf16_cast_per_run", std::ref(per_run)}},
      {.reps = reps});
  const std::string name = "amp_linear_" + std::to_string(m) + "x1024x1024";
  emit(name, {2.0 * double(m) * double(n) * double(n), 0}, s);
  progress(name, s);
}

// Auto-mixed precision on a whole encoder block (models::encoder_block, B1 S128 D512): precision=bf16 against f32,
// where the CPU's bf16 GEMM beats its f32 one (BackendTraits::fast_low_precision; otherwise both are f32 and the
// record says 1.0x). The bf16 output's largest difference from f32's, relative to f32's largest value, goes to
// stderr.
void amp_encoder(const Session& session, int reps) {
  const ir::Graph g = models::encoder_block();
  const auto params = models::random_params(g, 31);
  const auto inputs = models::random_inputs(g, 32);
  compile::CompileOptions bf16;
  bf16.precision = compile::Precision::Bf16;
  Runner f32(session.compile(g), params, inputs);
  Runner amp(session.compile(g, bf16), params, inputs);
  f32();
  amp();
  const double gap = max_abs_diff(f32.outputs()[0], amp.outputs()[0]), top = max_abs(f32.outputs()[0]);
  std::size_t lowered = 0;
  for (const auto& e : amp.graph().compile_result().precision.entries) lowered += e.dtype == ir::DType::BF16;
  auto s = interleave({{"rlx", std::ref(f32)}, {"rlx_bf16_amp", std::ref(amp)}}, {.reps = reps});
  const models::EncoderConfig c;
  const double flops = 2.0 * double(c.seq) * (4.0 * double(c.d_model * c.d_model) + 2.0 * double(c.d_model * c.d_ff)) +
                       4.0 * double(c.heads) * double(c.seq * c.seq) * double(c.d_model / c.heads);
  emit("amp_encoder_s128_d512_h8", {flops, 0}, s);
  progress("amp_encoder_s128_d512_h8", s);
  std::fprintf(stderr, "    %zu ops in bf16; max |bf16 - f32| = %.2e of the largest |y| %.2f\n", lowered, gap / top,
               top);
}

// Post-training int8 quantization end to end (compile::quantize): a 256 x 1024 -> 1024 -> relu -> 10
// classifier, f32 against its PTQ form, which quantizes the wide layer (its input quantized, its output
// dequantized in the GEMM's epilogue) and leaves the 10-wide one in f32 (docs/precision.md).
void ptq_mlp(const Session& session, int reps) {
  const std::int64_t b = 256, w = 1024;
  ir::Graph g("ptq_mlp");
  auto x = g.input("x", {b, w});
  auto h = g.relu(g.linear(x, g.param("w1", {w, w}), g.param("b1", {w})));
  g.add_output(g.linear(h, g.param("w2", {w, 10}), g.param("b2", {10})), "logits");
  std::map<std::string, ir::Tensor, std::less<>> params{{"w1", random_f32({w, w}, 3)},
                                                        {"b1", random_f32({w}, 4)},
                                                        {"w2", random_f32({w, 10}, 5)},
                                                        {"b2", random_f32({10}, 6)}};
  const std::map<std::string, ir::Tensor, std::less<>> in{{"x", random_f32({b, w}, 7)}};
  const std::vector<reference::TensorMap> calib{{{"x", random_f32({b, w}, 8)}}};
  const auto q = compile::quantize(g, params, calib, session.backend().traits());
  Runner f32(session.compile(g), params, in), i8(session.compile(q.graph), q.params, in);
  auto s = interleave({{"rlx", std::ref(f32)}, {"rlx_int8", std::ref(i8)}}, {.reps = reps});
  const std::string name = "ptq_mlp_b256_w1024";
  emit(name, {2.0 * double(b) * double(w) * double(w + 10), 0}, s);
  progress(name, s);
  std::fprintf(stderr, "    check: max |int8 - f32| = %g (of max |f32| %g); %s",
               max_abs_diff(i8.outputs()[0], f32.outputs()[0]),
               max_abs_diff(f32.outputs()[0], ir::Tensor(ir::DType::F32, {b, 10})), q.report_text().c_str());
}

// The digits classifier (docs/training.md: 64 -> 128 -> relu -> 10, trained here in f32 on sklearn's digits,
// 30 epochs of AdamW on the first 1438 images) at batch 256, f32 against its PTQ form (calibrated on the
// training images; int8 where the backend's traits say it pays, and quant_propagate's requantize between the
// layers), both timed on the first 256 held-out images; the accuracy of each on all 359 is printed.
void ptq_digits(const Session& session, int reps) {
  const std::int64_t b = 256;
  const auto data = test::load_digits(1797);
  const std::int64_t n_train = data.n - 359;
  const auto params = test::train_digits(data, n_train, 30);
  const ir::Graph g = test::digits_classifier(b);
  std::vector<reference::TensorMap> calib;
  for (std::int64_t lo = 0; lo < n_train; lo += b)
    calib.push_back({{"x", test::digits_x(data, lo, std::min(b, n_train - lo), b)}});
  const auto q = compile::quantize(g, params, calib, session.backend().traits());
  // Both layers in int8 whatever the traits say (the 10-wide one too): what int8 gives at this size.
  auto all_traits = session.backend().traits();
  all_traits.int8_matmul_min_macs = all_traits.int8_matmul_min_n = all_traits.int8_matmul_min_row_macs = 0;
  const auto all = compile::quantize(g, params, calib, all_traits);
  const std::map<std::string, ir::Tensor, std::less<>> in{{"x", test::digits_x(data, n_train, b, b)}};
  Runner f32(session.compile(g), params, in), i8(session.compile(q.graph), q.params, in),
      i8_all(session.compile(all.graph), all.params, in);
  // Scored by graphs of their own (a run changes a compiled graph's state; the timed ones stay as bound).
  auto accuracy = [&](const ir::Graph& graph, const reference::TensorMap& p) {
    auto c = session.compile(graph);
    for (const auto& [name, t] : p) c.set_param(name, t);
    return test::digits_accuracy(data, n_train, b, [&](const ir::Tensor& x) { return c.run({{"x", x}}).at(0); });
  };
  const double acc_f32 = accuracy(g, params), acc_i8 = accuracy(q.graph, q.params),
               acc_all = accuracy(all.graph, all.params);
  auto s = interleave({{"rlx", std::ref(f32)}, {"rlx_int8", std::ref(i8)}, {"rlx_int8_all", std::ref(i8_all)}},
                      {.reps = reps});
  const std::string name = "ptq_digits_b256";
  emit(name, {2.0 * double(b) * (64.0 * 128 + 128.0 * 10), 0}, s);
  progress(name, s);
  // Where the time goes: each kernel's median over 201 profiled runs, and the whole run's.
  auto profile = [&](const char* label, const ir::Graph& graph, const reference::TensorMap& p,
                     const compile::CompileOptions& options = {}) {
    auto c = session.compile(graph, options);
    for (const auto& [pn, t] : p) c.set_param(pn, t);
    c.set_profiling(true);
    std::vector<std::vector<double>> per;
    std::vector<double> whole;
    for (int r = 0; r < 201; ++r) {
      const double t0 = now_s();
      c.run(in);
      whole.push_back((now_s() - t0) * 1e6);
      const auto times = c.kernel_times();
      per.resize(times.size());
      for (std::size_t k = 0; k < times.size(); ++k) per[k].push_back(times[k].micros);
    }
    auto median = [](std::vector<double> v) {
      std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(v.size() / 2), v.end());
      return v[v.size() / 2];
    };
    std::fprintf(stderr, "    %s: run() %.1f us (with output allocation)", label, median(whole));
    const auto times = c.kernel_times();
    for (std::size_t k = 0; k < per.size(); ++k)
      std::fprintf(stderr, "; %s %.1f us", times[k].kernel.c_str(), median(per[k]));
    std::fprintf(stderr, "\n");
  };
  profile("f32", g, params);
  profile("int8 (as the traits decide)", q.graph, q.params);
  profile("int8 (both layers)", all.graph, all.params);
  // The same without quant_propagate (in quantize and in the pipeline): the hidden activation through f32.
  const auto all_plain = compile::quantize(g, params, calib, all_traits, {.propagate = false});
  profile("int8 (both layers, no quant_propagate)", all_plain.graph, all_plain.params, {.quant_propagate = false});
  std::fprintf(stderr,
               "    check: test accuracy f32 %.2f%%, int8 %.2f%%, int8 (both layers) %.2f%% (%lld images; %s); "
               "kernels f32 %zu, int8 %zu, int8 (both layers) %zu\n%s%s",
               100 * acc_f32, 100 * acc_i8, 100 * acc_all, static_cast<long long>(data.n - n_train),
               data.source.c_str(), f32.graph().compile_result().lir.kernels.size(),
               i8.graph().compile_result().lir.kernels.size(), i8_all.graph().compile_result().lir.kernels.size(),
               q.report_text().c_str(), all.report_text().c_str());
}

// x*a+b -> relu -> -c -> *d -> max e -> min f -> +x: eight cheap ops on one
// 64 MiB input, so a fused kernel is bound by memory traffic alone.
ir::Graph elementwise_chain(std::int64_t n) {
  ir::Graph g("chain8");
  auto x = g.input("x", {n});
  auto k = [&](double v) { return g.scalar(v); };
  auto y = g.mul(x, k(1.5));
  y = g.add(y, k(0.25));
  y = g.relu(y);
  y = g.sub(y, k(0.5));
  y = g.mul(y, k(0.75));
  y = g.binary(ir::OpKind::Max, y, k(-0.2));
  y = g.binary(ir::OpKind::Min, y, k(0.9));
  y = g.add(y, x);
  g.add_output(y, "y");
  return g;
}

void elementwise(const Session& session, int reps) {
  const std::int64_t n = std::int64_t(16) << 20;
  auto g = elementwise_chain(n);
  auto x = random_f32({n}, 3);
  compile::CompileOptions unfused_opts;
  unfused_opts.fusion = false;
  Runner fused(session.compile(g), {}, {{"x", x}});
  Runner unfused(session.compile(g, unfused_opts), {}, {{"x", x}});
  std::vector<float> dst(static_cast<std::size_t>(n));
  const float* src = fused.input("x").data_as<float>();
  auto copy = [&] { parallel_memcpy(dst.data(), src, dst.size() * sizeof(float)); };
  auto s = interleave({{"rlx", std::ref(fused)}, {"memcpy", copy}, {"rlx_unfused", std::ref(unfused)}}, {.reps = reps});
  const std::string name = "elementwise_chain8_16M";
  emit(name, {0, 2.0 * double(n) * sizeof(float)}, s);
  progress(name, s);
  std::fprintf(stderr, "    check: max |fused - unfused| = %g; kernels fused %zu, unfused %zu\n",
               max_abs_diff(fused.outputs()[0], unfused.outputs()[0]),
               fused.graph().compile_result().lir.kernels.size(), unfused.graph().compile_result().lir.kernels.size());
}

}  // namespace

int main(int argc, char** argv) try {
  const int reps = std::stoi(arg(argc, argv, "--reps", "7"));
  // Which OpenBLAS kernel the peer runs: run.sh unsets OPENBLAS_CORETYPE for this process, which otherwise
  // pins OpenBLAS to Haswell's AVX2 kernels on an AVX-512 machine (half its speed).
  std::printf("{\"versions\": {\"openblas_core\": \"%s\"}}\n", openblas_get_corename());
  // --only SUBSTR: the workloads whose record name holds SUBSTR (while tuning one of them).
  const std::string only = arg(argc, argv, "--only");
  auto want = [&](const std::string& name) { return only.empty() || name.find(only) != std::string::npos; };
  Session session;
  for (std::int64_t n : {512, 1024, 2048})
    if (const auto name = "gemm_" + std::to_string(n) + "^3"; want(name)) gemm(session, name, n, n, n, reps);
  if (want("gemv_1x4096x4096")) gemm(session, "gemv_1x4096x4096", 1, 4096, 4096, reps);
  if (want("gemm_lowp_1024^3")) gemm_lowp(session, 1024, reps);
  for (std::int64_t m : {1, 16, 64, 256})
    if (want("amp_linear_" + std::to_string(m) + "x1024x1024")) amp_linear(session, m, reps);
  if (want("amp_encoder_s128_d512_h8")) amp_encoder(session, reps);
  if (want("ptq_mlp_b256_w1024")) ptq_mlp(session, reps);
  if (want("ptq_digits_b256")) ptq_digits(session, reps);
  if (want("elementwise_chain8_16M")) elementwise(session, reps);
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_kernels: %s\n", e.what());
  return 1;
}
