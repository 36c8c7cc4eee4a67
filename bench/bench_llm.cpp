// LLM generation speed on a GGUF file: prefill (pp: a prompt of --prompt
// tokens from an empty cache) and decode (tg: --gen tokens one at a time),
// as seconds per token, in llama-bench's terms so bench/run.sh can set
// llama.cpp's figures beside them. bytes = the file's weight bytes per token,
// so the report shows decode against the memory-bandwidth roof.
//
//   bench_llm MODEL.gguf [--prompt 512] [--gen 128] [--reps 5] [--label smollm2_q4_1]
#include <cstdio>
#include <string>

#include "common.hpp"
#include "rlx/gguf/gguf.hpp"
#include "rlx/llm/model.hpp"

using namespace rlx;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_llm MODEL.gguf [--prompt N] [--gen N] [--reps N] [--label NAME]\n");
    return 2;
  }
  std::int64_t prompt = 512, gen = 128;
  int reps = 5;
  std::string label = "model";
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--prompt") prompt = std::stoll(argv[i + 1]);
    if (k == "--gen") gen = std::stoll(argv[i + 1]);
    if (k == "--reps") reps = std::stoi(argv[i + 1]);
    if (k == "--label") label = argv[i + 1];
  }
  try {
    const auto file = std::make_shared<const gguf::File>(gguf::File::open(argv[1]));
    double weight_bytes = 0;
    for (const auto& t : file->tensors()) weight_bytes += double(t.nbytes);
    llm::LlamaModel model = llm::LlamaModel::load(file, {.context = prompt + gen, .prefill_chunk = 64});
    std::vector<std::int32_t> ids(static_cast<std::size_t>(prompt));
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = std::int32_t(100 + (i * 7919) % 40000);

    bench::Timing timing{.reps = reps, .warmup = 1, .min_sample_s = 0, .settle_s = 0.05};
    auto pp = bench::interleave({{"rlx",
                                  [&] {
                                    model.reset();
                                    (void)model.forward(ids, false);
                                  }}},
                                timing);
    for (auto& s : pp[0].seconds) s /= double(prompt);
    const std::string pp_name = "llm_pp" + std::to_string(prompt) + "_" + label;
    bench::emit(pp_name, {}, pp);
    bench::progress(pp_name, pp);

    auto tg = bench::interleave({{"rlx",
                                  [&] {
                                    model.reset();
                                    std::int32_t tok = 1;
                                    for (std::int64_t i = 0; i < gen; ++i) {
                                      const auto logits = model.forward(std::span(&tok, 1), false);
                                      tok =
                                          std::int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
                                    }
                                  }}},
                                timing);
    for (auto& s : tg[0].seconds) s /= double(gen);
    const std::string tg_name = "llm_tg" + std::to_string(gen) + "_" + label;
    bench::emit(tg_name, {.bytes = weight_bytes}, tg);
    bench::progress(tg_name, tg);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_llm: %s\n", e.what());
    return 1;
  }
  return 0;
}
