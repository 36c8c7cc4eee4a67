// The CUDA backend's headline figures (docs/backends/cuda.md), in the keys of
// vulkan_bench so that bench/gpu_peers.py puts them next to PyTorch's: f32
// GEMM, the fused 8-op elementwise chain against a device-to-device copy, a
// 3x3 conv and the encoder block. Kernel figures are GPU time from the events
// the executable records around each kernel (kernel_times); the encoder also
// reports wall time per run (staging copies, graph launch and sync included).
//
//   cuda_bench                 the figures above
//   cuda_bench decode [DIR]    GGUF decode (issue 15, "SmolLM2 decode on the GPU"): SmolLM2-135M's shapes with
//                              seeded random weights, quantized to Q4_1 (the shipped file's type), Q4_0, Q8_0 and
//                              Q4_K, each decoded greedily on the GPU; tokens/s and GB/s against the copy
//                              bandwidth. DIR (default /tmp/rlx/llm) receives what gpu_peers.py --llm reads: the
//                              Q4_1 model's weights dequantized to f32, its config and RLX's first logits.
//   cuda_bench decode DIR --smoke   the same files for a two-layer model of small widths, on the CPU, no figures
//                              (checks the files without a GPU)
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "gpu_common.hpp"
#include "rlx/backends/cuda/cuda_backend.hpp"
#include "rlx/env.hpp"
#include "rlx/error.hpp"
#include "rlx/gguf/gguf.hpp"
#include "rlx/gguf/quants.hpp"
#include "rlx/gguf/requantize.hpp"
#include "rlx/llm/model.hpp"
#include "rlx/models/demo_models.hpp"
#include "rlx/runtime/calibration.hpp"
#include "rlx/runtime/graph_devices.hpp"

using namespace rlx;
namespace cu = backends::cuda;
using namespace rlx::bench;

namespace {

// SmolLM2-135M's hyperparameters (the shipped SmolLM2-135M-Instruct.Q4_1.gguf's metadata).
struct Smol {
  std::int64_t layers = 30, embd = 576, ff = 1536, heads = 9, kv_heads = 3, vocab = 49152, context = 2048;
  double rope_base = 100000, eps = 1e-5;
};

// The f32 GGUF: the metadata LlamaConfig::from_gguf reads and seeded random weights (N(0, 0.02) matrices, norms
// near 1), a tied output as SmolLM2's.
void write_f32_model(const std::filesystem::path& path, const Smol& s, unsigned seed) {
  gguf::Writer w;
  auto& m = w.metadata();
  m.set("general.architecture", "llama");
  m.set("llama.block_count", std::uint32_t(s.layers));
  m.set("llama.embedding_length", std::uint32_t(s.embd));
  m.set("llama.feed_forward_length", std::uint32_t(s.ff));
  m.set("llama.attention.head_count", std::uint32_t(s.heads));
  m.set("llama.attention.head_count_kv", std::uint32_t(s.kv_heads));
  m.set("llama.context_length", std::uint32_t(s.context));
  m.set("llama.rope.freq_base", float(s.rope_base));
  m.set("llama.attention.layer_norm_rms_epsilon", float(s.eps));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  auto add = [&](const std::string& name, std::int64_t rows, std::int64_t cols, bool norm) {
    std::vector<float> v(std::size_t(rows * cols));
    for (auto& x : v) x = norm ? 1.0f + nd(rng) : nd(rng);
    std::vector<std::byte> bytes(v.size() * sizeof(float));
    std::memcpy(bytes.data(), v.data(), bytes.size());
    // ggml's dims run innermost first: a [rows, cols] matrix is {cols, rows}.
    w.add_tensor(name, gguf::GgmlType::F32, rows == 1 ? std::vector<std::int64_t>{cols} : std::vector{cols, rows},
                 std::move(bytes));
  };
  const std::int64_t D = s.embd / s.heads;
  add("token_embd.weight", s.vocab, s.embd, false);
  add("output_norm.weight", 1, s.embd, true);
  for (std::int64_t i = 0; i < s.layers; ++i) {
    const std::string b = fmt::format("blk.{}.", i);
    add(b + "attn_norm.weight", 1, s.embd, true);
    add(b + "attn_q.weight", s.heads * D, s.embd, false);
    add(b + "attn_k.weight", s.kv_heads * D, s.embd, false);
    add(b + "attn_v.weight", s.kv_heads * D, s.embd, false);
    add(b + "attn_output.weight", s.embd, s.heads * D, false);
    add(b + "ffn_norm.weight", 1, s.embd, true);
    add(b + "ffn_gate.weight", s.ff, s.embd, false);
    add(b + "ffn_up.weight", s.ff, s.embd, false);
    add(b + "ffn_down.weight", s.embd, s.ff, false);
  }
  w.write(path);
}

// The peer's inputs: every tensor dequantized to f32 back to back (weights.f32) and where each lies (model.json).
void write_dequantized(const gguf::File& f, const Smol& s, const std::filesystem::path& dir,
                       const std::vector<std::int32_t>& prompt, int tokens) {
  std::ofstream out(dir / "weights.f32", std::ios::binary);
  std::string index;
  std::int64_t at = 0;
  for (const auto& t : f.tensors()) {
    std::int64_t n = 1;
    for (auto d : t.dims) n *= d;
    std::vector<float> v(static_cast<std::size_t>(n));
    gguf::dequantize(t.type, f.tensor(t.name).bytes, v);
    out.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * sizeof(float)));
    std::vector<std::int64_t> shape(t.dims.rbegin(), t.dims.rend());
    index += fmt::format("{}\n    \"{}\": {{\"offset\": {}, \"shape\": [{}]}}", index.empty() ? "" : ",", t.name, at,
                         fmt::join(shape, ", "));
    at += n;
  }
  if (!out) throw Error(fmt::format("cuda_bench: writing {} failed", (dir / "weights.f32").string()));
  std::ofstream json(dir / "model.json");
  json << fmt::format(
      "{{\n  \"layers\": {}, \"embd\": {}, \"ff\": {}, \"heads\": {}, \"kv_heads\": {}, \"vocab\": {},\n"
      "  \"rope_base\": {}, \"eps\": {}, \"prompt\": [{}], \"decode_tokens\": {},\n  \"tensors\": {{{}\n  }}\n}}\n",
      s.layers, s.embd, s.ff, s.heads, s.kv_heads, s.vocab, s.rope_base, s.eps, fmt::join(prompt, ", "), tokens, index);
}

std::int32_t argmax(const std::vector<float>& v) {
  return std::int32_t(std::max_element(v.begin(), v.end()) - v.begin());
}

// Loads `path` on the GPU, runs the prompt and `tokens` greedy decode steps, and reports tokens/s against the
// bandwidth roof: the bytes one decode step reads (every weight once, the tied output reading the whole token
// table, plus the KV cache rows the attention reads, which are all of the graph's rows as the mask hides the
// unwritten ones) over the copy bandwidth. Returns the prompt's last logits.
std::vector<float> decode(const std::filesystem::path& path, const std::string& key, bool exact,
                          const std::vector<std::int32_t>& prompt, int tokens, double copy_gbps, Device device) {
  const auto file = std::make_shared<const gguf::File>(gguf::File::open(path));
  const auto t0 = std::chrono::steady_clock::now();
  // prefill_chunk 16: two graphs to compile (16-token prefill and decode) instead of three.
  auto model = llm::LlamaModel::load(file, {.context = 512, .prefill_chunk = 16, .device = device, .exact = exact});
  report(key + "_load_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), "s");
  const auto& c = model.config();
  std::vector<float> first = model.forward(prompt, false);
  std::int32_t next = argmax(first);
  for (int i = 0; i < 3; ++i) next = argmax(model.forward(std::span(&next, 1), false));  // warm-up
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < tokens; ++i) next = argmax(model.forward(std::span(&next, 1), false));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  double weights = 0;
  for (const auto& t : file->tensors()) weights += double(file->tensor(t.name).bytes.size());
  weights -= double(file->tensor("token_embd.weight").bytes.size()) * (1.0 - 1.0 / double(c.vocab));  // one row
  weights += c.tied_output ? double(file->tensor("token_embd.weight").bytes.size()) : 0.0;            // the output
  const double rows = 512 + 16 - 1;  // the context plus prefill_chunk - 1 (src/llm/model.cpp)
  const double kv = 2.0 * double(c.n_layer * c.n_head_kv * c.head_dim) * rows * 4.0;
  const double tok_s = tokens / secs, bytes = weights + kv;
  report(key + "_decode_tok_s", tok_s, "tok/s");
  report(key + "_decode_ms", 1e3 / tok_s, "ms");
  report(key + "_bytes_per_token_mb", bytes * 1e-6, "MB");
  report(key + "_decode_gbps", bytes * tok_s * 1e-9, "GB/s");
  report(key + "_roof_tok_s", copy_gbps * 1e9 / bytes, "tok/s");
  report(key + "_vs_roof", bytes * tok_s * 1e-9 / copy_gbps, "x");
  // Where a step's device time goes, and whether any kernel fell back to the host.
  model.set_profiling(true);
  (void)model.forward(std::span(&next, 1), false);
  double gpu = 0, host = 0;
  auto times = model.kernel_times(true);
  for (const auto& k : times) (k.host ? host : gpu) += k.micros;
  report(key + "_kernels", double(times.size()), "kernels");
  report(key + "_host_kernels", double(std::count_if(times.begin(), times.end(), [](auto& k) { return k.host; })),
         "kernels");
  report(key + "_decode_gpu_us", gpu, "us");
  std::sort(times.begin(), times.end(), [](auto& a, auto& b) { return a.micros > b.micros; });
  for (std::size_t i = 0; i < std::min<std::size_t>(6, times.size()); ++i)
    fmt::print("#   {:9.1f} us {}{}\n", times[i].micros, times[i].host ? "(host) " : "", times[i].kernel);
  return first;
}

// `smoke`: a two-layer model of small widths on the CPU, four tokens, to check the files and the peer's inputs
// on a machine without a GPU (no figures).
int decode_bench(const std::filesystem::path& dir, bool smoke) {
  Smol s;
  if (smoke) s = {.layers = 2, .embd = 64, .ff = 128, .heads = 4, .kv_heads = 2, .vocab = 256, .context = 512};
  const Device device = smoke ? Device::Cpu : Device::Cuda;
  std::filesystem::create_directories(dir);
  const double copy = smoke ? 1.0 : cu::copy_bandwidth_gbps(std::uint64_t(1) << 30);
  report("copy_d2d_gbps", copy, "GB/s");
  const auto f32 = dir / "smol-f32.gguf";
  write_f32_model(f32, s, 15);
  const std::vector<std::int32_t> prompt{1, 50, 214, 31, 253, 227, 30, 198};
  const int tokens = smoke ? 4 : 128;
  int failed = 0;
  for (auto [type, name] : {std::pair{gguf::GgmlType::Q4_1, "q4_1"},
                            {gguf::GgmlType::Q4_0, "q4_0"},
                            {gguf::GgmlType::Q8_0, "q8_0"},
                            {gguf::GgmlType::Q4_K, "q4_k"}}) {
    // Each type on its own: one that fails says why and the others still run.
    try {
      const auto path = dir / fmt::format("smol-{}.gguf", name);
      const auto rep = gguf::requantize(f32, path, type);
      std::string types;
      for (const auto& [t, n] : rep.tensors_per_type) types += fmt::format(" {} {}", t, n);
      fmt::print("# {}: {:.1f} MB of tensors:{}\n", name, double(rep.bytes_out) * 1e-6, types);
      const auto key = fmt::format("llm_{}", name);
      const std::vector<float> logits = decode(path, key, false, prompt, tokens, copy, device);
      if (type != gguf::GgmlType::Q4_1) continue;
      if (!smoke) {  // each kernel launched after the previous one ends, to compare with the programmatic launches
        env::ScopedOverride serial("RLX_CUDA_PROGRAMMATIC_LAUNCH", "0");
        decode(path, key + "_serial", false, prompt, tokens, copy, device);
      }
      // The peer's inputs, and RLX's first logits in both modes for its comparison.
      const std::vector<float> exact = decode(path, key + "_f32act", true, prompt, tokens, copy, device);
      write_dequantized(gguf::File::open(path), s, dir, prompt, tokens);
      for (auto [what, v] : {std::pair{"logits_q8.f32", &logits}, {"logits_f32.f32", &exact}}) {
        std::ofstream o(dir / what, std::ios::binary);
        o.write(reinterpret_cast<const char*>(v->data()), std::streamsize(v->size() * sizeof(float)));
      }
    } catch (const std::exception& e) {
      fmt::print(stderr, "cuda_bench decode: {}: {}\n", name, e.what());
      fmt::print("# llm_{}: failed: {}\n", name, e.what());
      ++failed;
    }
    if (smoke) break;
  }
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string_view(argv[1]) == "decode") {
    try {
      const bool smoke = argc > 3 && std::string_view(argv[3]) == "--smoke";
      if (auto why = cu::unavailable_reason(); !why.empty() && !smoke) {
        fmt::print(stderr, "cuda is unavailable: {}\n", why);
        return 2;
      }
      return decode_bench(argc > 2 ? argv[2] : "/tmp/rlx/llm", smoke);
    } catch (const std::exception& e) {
      fmt::print(stderr, "cuda_bench decode: {}\n", e.what());
      return 1;
    }
  }
  try {
    if (auto why = cu::unavailable_reason(); !why.empty()) {
      fmt::print(stderr, "cuda is unavailable: {}\n", why);
      return 2;
    }
    auto dev = cu::selected_device();
    fmt::print("# device '{}' ({}, {} SMs, driver {})\n", dev.name, dev.arch, dev.multiprocessors, dev.driver_version);
    auto backend = cu::make_cuda_backend();

    const std::int64_t n = 4096;
    ir::Graph mm("gemm");
    mm.add_output(mm.matmul(mm.param("a", ir::Shape{n, n}), mm.param("b", ir::Shape{n, n})), "c");
    auto gemm = prepare(*backend, mm);
    auto tg = time_runs(*gemm.compiled.exe, gemm.in, gemm.out, 1, 3);
    report(fmt::format("gemm_f32_{}_tflops", n), 2.0 * double(n * n * n) / tg.gpu_s * 1e-12, "TFLOP/s");

    {
      // bf16 operands with f32 accumulation (the bf16 GEMM figure).
      const std::int64_t nb = 8192;
      ir::Graph mb("gemm_bf16");
      mb.add_output(mb.matmul(mb.param("a", ir::Shape{nb, nb}, ir::DType::BF16),
                              mb.param("b", ir::Shape{nb, nb}, ir::DType::BF16)),
                    "c");
      auto g16 = prepare(*backend, mb);
      auto t16 = time_runs(*g16.compiled.exe, g16.in, g16.out, 1, 3);
      report(fmt::format("gemm_bf16_{}_tflops", nb), 2.0 * double(nb * nb * nb) / t16.gpu_s * 1e-12, "TFLOP/s");
      print_kernels(*g16.compiled.exe);
    }

    {
      // Host overhead: the median wall time of a run of a tiny 3-kernel graph (staging, graph launch, sync).
      ir::Graph small("overhead");
      auto x = small.input("x", ir::Shape{256});
      auto s1 = small.sum(x, {0}, true);                 // kernel 1
      auto s2 = small.sum(small.mul(x, s1), {0}, true);  // kernel 2 reads kernel 1's sum
      small.add_output(small.sum(small.mul(x, s2), {0}), "y");
      auto o = prepare(*backend, small);
      auto& exe = *o.compiled.exe;
      report("overhead_3k_kernels", double(o.compiled.result->lir.kernels.size()), "kernels");
      report("overhead_3k_us", median_wall_s([&] { exe.run(o.in, o.out); }, 500, 2000) * 1e6, "us");
      // Without the copies in and out (the input a handle, the output left on the device): launch and sync.
      exe.bind_handle(0, o.in[0], o.inputs[0].size());
      std::vector<const void*> no_in(o.in.size(), nullptr);
      std::vector<void*> no_out(o.out.size(), nullptr);
      report("overhead_3k_resident_us", median_wall_s([&] { exe.run_read_outputs(no_in, no_out); }, 500, 2000) * 1e6,
             "us");
      {
        // The same graph with each kernel launched after the previous one ends (no programmatic launches).
        env::ScopedOverride serial("RLX_CUDA_PROGRAMMATIC_LAUNCH", "0");
        auto os = prepare(*backend, small);
        auto& se = *os.compiled.exe;
        se.bind_handle(0, os.in[0], os.inputs[0].size());
        report("overhead_3k_resident_serial_us",
               median_wall_s([&] { se.run_read_outputs(no_in, no_out); }, 500, 2000) * 1e6, "us");
      }
      exe.set_profiling(true);
      exe.run_read_outputs(no_in, no_out);
      double busy = 0;
      for (const auto& k : exe.kernel_times()) busy += k.micros;
      report("overhead_3k_kernels_us", busy, "us");
    }

    const std::int64_t m = std::int64_t(1) << 28;
    ir::Graph ch("chain8");
    ch.add_output(chain8(ch, ch.param("x", ir::Shape{m})), "y");
    auto chain = prepare(*backend, ch);
    const double bytes = 8.0 * double(m);
    auto tc = time_runs(*chain.compiled.exe, chain.in, chain.out, 2, 10);
    const double copy = cu::copy_bandwidth_gbps(std::uint64_t(4 * m));
    report("chain8_kernels", double(chain.compiled.result->lir.kernels.size()), "kernels");
    report("chain8_gbps", bytes / tc.gpu_s * 1e-9, "GB/s");
    report("copy_d2d_gbps", copy, "GB/s");
    report("bench_copy_memcpy_gbps", copy, "GB/s");
    report("chain8_vs_copy", bytes / tc.gpu_s * 1e-9 / copy, "x");
    {
      // The chain's result against the host, every 4097th element and the last ones (a wrong unrolled or
      // vectorized loop shows up here, in elements the small conformance shapes never reach).
      auto params = models::random_params(ch, 7);
      const ir::Tensor& xt = params.at("x");
      const auto* ys = reinterpret_cast<const float*>(chain.out[0]);
      double worst = 0;
      auto check = [&](std::int64_t i) {
        const float x = xt.data_as<float>()[i];
        float y = x * 1.5f;
        y = y + 0.25f;
        y = y * y;
        y = y - 0.5f;
        y = std::max(y, -1.0f);
        y = y + x;
        y = y * 0.75f;
        y = std::min(y, 4.0f);
        worst = std::max(worst, double(std::abs(ys[i] - y)));
      };
      for (std::int64_t i = 0; i < m; i += 4097) check(i);
      for (std::int64_t i = m - 4096; i < m; ++i) check(i);
      report("chain8_max_abs_err", worst, "");
    }
    // The chain compiled under the environment's current settings: its best device time over 5 runs, the param
    // resident and the output left on the device.
    auto resident_chain_s = [&] {
      auto v = prepare(*backend, ch);
      auto& exe = *v.compiled.exe;
      std::vector<const void*> no_in(v.in.size(), nullptr);
      std::vector<void*> no_out(v.out.size(), nullptr);
      exe.set_profiling(true);
      double best = 1e30;
      for (int r = 0; r < 6; ++r) {
        exe.run_read_outputs(no_in, no_out);
        double s = 0;
        for (const auto& k : exe.kernel_times()) s += k.micros * 1e-6;
        if (r > 0) best = std::min(best, s);
      }
      return best;
    };
    // The same chain as the scalar grid-stride loop (RLX_CUDA_VECTOR_BYTES=0) and with 16-byte accesses at each
    // unrolling of the loop (RLX_CUDA_VECTOR_UNROLL; 0 is NVRTC's choice).
    for (auto [vb, unroll] : {std::pair{0, 0}, {16, 1}, {16, 2}, {16, 4}, {16, 0}}) {
      env::ScopedOverride width("RLX_CUDA_VECTOR_BYTES", std::to_string(vb));
      env::ScopedOverride steps("RLX_CUDA_VECTOR_UNROLL", std::to_string(unroll));
      report(vb ? fmt::format("chain8_vector{}_unroll{}_gbps", vb, unroll) : "chain8_scalar_gbps",
             bytes / resident_chain_s() * 1e-9, "GB/s");
    }
    // The grid's size: at most RLX_CUDA_BLOCKS_PER_SM blocks per multiprocessor, each thread looping over the
    // rest, or (0, the default) one step per thread, as torch.compile's kernels run.
    for (int per_sm : {8, 16, 32, 64, 0}) {
      env::ScopedOverride blocks("RLX_CUDA_BLOCKS_PER_SM", std::to_string(per_sm));
      report(fmt::format("chain8_blocks_per_sm{}_gbps", per_sm), bytes / resident_chain_s() * 1e-9, "GB/s");
    }

    {
      ir::Graph cv("conv2d");
      cv.add_output(cv.conv2d(cv.param("x", ir::Shape{8, 256, 14, 14}), cv.param("w", ir::Shape{256, 256, 3, 3}),
                              std::nullopt, {1, 1}, {1, 1}),
                    "y");
      auto conv = prepare(*backend, cv);
      auto tv = time_runs(*conv.compiled.exe, conv.in, conv.out, 1, 5);
      report("conv2d_8x256x14x14_k3_tflops", 2.0 * 8 * 256 * 196 * 256 * 9 / tv.gpu_s * 1e-12, "TFLOP/s");
      print_kernels(*conv.compiled.exe);
    }

    {
      // Attention: the flash-attention kernel against the decomposition (RLX_CUDA_FLASH_ATTENTION=0: cuBLASLt
      // matmuls and the native softmax), the graph's device time, and the largest difference between the two.
      struct Attention {
        const char* name;
        std::int64_t b, h, hkv, sq, sk, d;
        bool causal;
      };
      for (const Attention& a : {Attention{"attn_b8_h16_s512_d64_causal", 8, 16, 16, 512, 512, 64, true},
                                 Attention{"attn_b1_h32_kv8_s2048_d128_causal", 1, 32, 8, 2048, 2048, 128, true},
                                 Attention{"attn_b4_h16_s1024_d64", 4, 16, 16, 1024, 1024, 64, false},
                                 Attention{"attn_decode_h9_kv3_k512_d64", 1, 9, 3, 1, 512, 64, false}}) {
        ir::Graph g(a.name);
        auto q = g.input("q", ir::Shape{a.b, a.h, a.sq, a.d});
        auto k = g.input("k", ir::Shape{a.b, a.hkv, a.sk, a.d});
        auto v = g.input("v", ir::Shape{a.b, a.hkv, a.sk, a.d});
        g.add_output(g.attention(q, k, v, std::nullopt, a.causal), "y");
        const double flops = 4.0 * double(a.b * a.h * a.sq * a.sk * a.d) * (a.causal ? 0.5 : 1.0);
        std::vector<float> y[2];
        for (int flash : {1, 0}) {
          env::ScopedOverride use("RLX_CUDA_FLASH_ATTENTION", flash ? "1" : "0");
          auto p = prepare(*backend, g);
          auto t = time_runs(*p.compiled.exe, p.in, p.out, 1, 5);
          const std::string key = fmt::format("{}_{}", a.name, flash ? "flash" : "decomposed");
          report(key + "_us", t.gpu_s * 1e6, "us");
          report(key + "_tflops", flops / t.gpu_s * 1e-12, "TFLOP/s");
          report(key + "_host_kernels", double(t.host_kernels), "kernels");
          const auto* out = reinterpret_cast<const float*>(p.out[0]);
          y[flash].assign(out, out + p.outputs[0].size() / sizeof(float));
        }
        double worst = 0;
        for (std::size_t i = 0; i < y[0].size(); ++i) worst = std::max(worst, double(std::abs(y[0][i] - y[1][i])));
        report(fmt::format("{}_flash_vs_decomposed_max_abs_diff", a.name), worst, "");
      }
    }

    for (auto [name, cfg] : {std::pair<const char*, models::EncoderConfig>{"encoder", {}},
                             {"encoder_large", {8, 512, 1024, 16, 4096, 1e-5}}}) {
      auto enc = prepare(*backend, models::encoder_block(cfg));
      auto te = time_runs(*enc.compiled.exe, enc.in, enc.out, 2, 10);
      report(std::string(name) + "_wall_us", te.wall_s * 1e6, "us");
      report(std::string(name) + "_gpu_us", te.gpu_s * 1e6, "us");
      report(std::string(name) + "_kernels", double(enc.compiled.result->lir.kernels.size()), "kernels");
      report(std::string(name) + "_host_kernels", double(te.host_kernels), "kernels");
      print_kernels(*enc.compiled.exe);
      // As PyTorch runs it: the input already on the device (a handle), the output left there.
      auto& exe = *enc.compiled.exe;
      exe.set_profiling(false);
      exe.bind_handle(0, enc.in[0], enc.inputs[0].size());
      std::vector<const void*> no_in(enc.in.size(), nullptr);
      std::vector<void*> no_out(enc.out.size(), nullptr);
      report(std::string(name) + "_resident_wall_us",
             median_wall_s([&] { exe.run_read_outputs(no_in, no_out); }, 3, 20) * 1e6, "us");
    }
    {
      // The large encoder in bf16 auto-mixed precision against its f32 form: resident wall time, and the
      // largest difference of the outputs relative to the f32 output's largest magnitude.
      const auto g = models::encoder_block({8, 512, 1024, 16, 4096, 1e-5});
      compile::CompileOptions bf16;
      bf16.precision = compile::Precision::Bf16;
      auto f32 = prepare(*backend, g), mixed = prepare(*backend, g, bf16);
      int lowered = 0;
      for (const auto& e : mixed.compiled.result->precision.entries) lowered += e.dtype == ir::DType::BF16;
      double resident[2] = {0, 0};
      for (int i = 0; i < 2; ++i) {
        auto& p = i ? mixed : f32;
        p.compiled.exe->run(p.in, p.out);  // outputs read back once, to compare
        auto& exe = *p.compiled.exe;
        exe.bind_handle(0, p.in[0], p.inputs[0].size());
        std::vector<const void*> no_in(p.in.size(), nullptr);
        std::vector<void*> no_out(p.out.size(), nullptr);
        resident[i] = median_wall_s([&] { exe.run_read_outputs(no_in, no_out); }, 3, 20);
      }
      const auto* a = reinterpret_cast<const float*>(f32.outputs[0].data());
      const auto* b = reinterpret_cast<const float*>(mixed.outputs[0].data());
      double worst = 0, scale = 0;
      for (std::size_t i = 0; i < f32.outputs[0].size() / sizeof(float); ++i) {
        worst = std::max(worst, double(std::abs(a[i] - b[i])));
        scale = std::max(scale, double(std::abs(a[i])));
      }
      report("encoder_large_amp_bf16_matmuls", lowered, "matmuls");
      report("encoder_large_amp_bf16_resident_us", resident[1] * 1e6, "us");
      report("encoder_large_amp_f32_resident_us", resident[0] * 1e6, "us");
      report("encoder_large_amp_speedup", resident[0] / resident[1], "x");
      report("encoder_large_amp_max_rel_err", worst / scale, "");
      auto& m = *mixed.compiled.exe;
      m.set_profiling(true);
      m.run_read_outputs(std::vector<const void*>(mixed.in.size(), nullptr),
                         std::vector<void*>(mixed.out.size(), nullptr));
      print_kernels(m);
    }

    // The cost model's view of this GPU: its calibration (measured now, or read from the cache) and the large
    // encoder's device report, which ranks CUDA against Vulkan on the same GPU and the CPU, each with its reason.
    {
      const runtime::Calibration c = runtime::calibration_for(runtime::Device::Cuda);
      report("calib_sgemm_gflops", c.sgemm_gflops, "GFLOP/s");
      report("calib_memory_bw_gbps", c.memory_bw_gbps, "GB/s");
      report("calib_roundtrip_us", c.roundtrip_overhead_ns * 1e-3, "us");
      fmt::print("# calibration: {} ({})\n", runtime::calibration_path_for(runtime::Device::Cuda).string(), c.source);
      const auto devices = runtime::device_report(models::encoder_block({8, 512, 1024, 16, 4096, 1e-5}));
      std::string text = devices.to_text();
      for (std::size_t at = 0; at < text.size();) {  // as comments: gpu_peers.py reads the other lines
        const std::size_t end = std::min(text.find('\n', at), text.size());
        fmt::print("# {}\n", text.substr(at, end - at));
        at = end + 1;
      }
    }
  } catch (const Error& e) {
    fmt::print(stderr, "cuda_bench: {}\n", e.what());
    return 1;
  }
  return 0;
}
