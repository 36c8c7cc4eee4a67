// llama.cpp's logits for a token sequence, every position, as float32: the peer's side of the
// fast-mode accuracy comparison (bench/llm_accuracy.py). Built against the libllama of
// scripts/build_llama_cpp.sh (target `logits`), not part of RLX.
//
//   llama_logits MODEL.gguf OUT.f32 ID...     writes len(ids) x vocab floats, row-major
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "llama.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s MODEL.gguf OUT.f32 ID...\n", argv[0]);
    return 2;
  }
  std::vector<llama_token> ids;
  for (int i = 3; i < argc; ++i) ids.push_back(llama_token(std::atoi(argv[i])));
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) {
    std::fprintf(stderr, "cannot load %s\n", argv[1]);
    return 1;
  }
  llama_context_params cp = llama_context_default_params();
  const auto n = static_cast<std::uint32_t>(ids.size());
  cp.n_ctx = n < 64 ? 64 : n;
  cp.n_batch = cp.n_ubatch = cp.n_ctx;
  cp.n_threads = cp.n_threads_batch = 2;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) {
    std::fprintf(stderr, "cannot create a context\n");
    return 1;
  }
  llama_batch batch = llama_batch_init(int32_t(n), 0, 1);
  for (std::uint32_t i = 0; i < n; ++i) {
    batch.token[i] = ids[i];
    batch.pos[i] = llama_pos(i);
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = 0;
    batch.logits[i] = 1;
  }
  batch.n_tokens = int32_t(n);
  if (llama_decode(ctx, batch) != 0) {
    std::fprintf(stderr, "llama_decode failed\n");
    return 1;
  }
  const int vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  std::FILE* f = std::fopen(argv[2], "wb");
  if (!f) return 1;
  for (std::uint32_t i = 0; i < n; ++i)
    std::fwrite(llama_get_logits_ith(ctx, int32_t(i)), sizeof(float), std::size_t(vocab), f);
  std::fclose(f);
  llama_batch_free(batch);
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}
