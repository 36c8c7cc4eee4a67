#pragma once
// The digits MLP of docs/training.md (64 -> 128 -> 10, relu, cross-entropy)
// and its data: scikit-learn's digits from the .venv's wheel (read with
// gzip -dc), or, where that wheel is absent, a fixed-seed stand-in of the same
// shapes (pixels 0..16, labels 0..9).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "rlx/ir/graph.hpp"
#include "rlx/train/train.hpp"

namespace rlx::test {

struct Digits {
  std::vector<float> x;  // [n, 64], pixels / 16
  std::vector<std::int64_t> y;
  std::int64_t n = 0;
  std::string source;
};

inline Digits load_digits(std::int64_t want) {
  Digits d;
  namespace fs = std::filesystem;
  std::string path;
  const fs::path lib = fs::path(RLX_SOURCE_DIR) / ".venv" / "lib";
  std::error_code ec;
  if (fs::is_directory(lib, ec))
    for (const auto& py : fs::directory_iterator(lib, ec)) {
      auto p = py.path() / "site-packages/sklearn/datasets/data/digits.csv.gz";
      if (fs::exists(p, ec)) path = p.string();
    }
  if (!path.empty())
    if (FILE* f = popen(("gzip -dc '" + path + "'").c_str(), "r")) {
      std::vector<int> row;
      int v = 0;
      char sep = 0;
      while (d.n < want && std::fscanf(f, "%d%c", &v, &sep) == 2) {
        row.push_back(v);
        if (sep == '\n') {
          if (row.size() == 65) {
            for (int i = 0; i < 64; ++i) d.x.push_back(static_cast<float>(row[i]) / 16.0F);
            d.y.push_back(row[64]);
            ++d.n;
          }
          row.clear();
        }
      }
      pclose(f);
      d.source = "sklearn digits (" + path + ")";
    }
  if (d.n < want) {  // the stand-in
    d = Digits{};
    std::mt19937 rng(1234);
    // Learnable, as the digits are: the label is the brightest of the first 10 pixels, so a short training run
    // lowers the loss (the tests check that it learns) on a machine without sklearn too.
    for (std::int64_t i = 0; i < want; ++i) {
      for (int k = 0; k < 64; ++k) d.x.push_back(static_cast<float>(rng() % 17) / 16.0F);
      const auto first = d.x.end() - 64;
      d.y.push_back(static_cast<std::int64_t>(std::max_element(first, first + 10) - first));
    }
    d.n = want;
    d.source = "a fixed-seed stand-in of the digits' shapes (no sklearn in .venv)";
  }
  return d;
}

// The model at batch `batch`: inputs x [batch, 64] and y [batch] (i64); first output the loss.
inline ir::Graph digits_mlp(std::int64_t batch) {
  ir::Graph g("digits_mlp");
  auto x = g.input("x", {batch, 64});
  auto y = g.input("y", {batch}, ir::DType::I64);
  auto w1 = g.param("w1", {64, 128});
  auto b1 = g.param("b1", {128});
  auto w2 = g.param("w2", {128, 10});
  auto b2 = g.param("b2", {10});
  auto h = g.relu(g.linear(x, w1, b1));
  g.add_output(train::cross_entropy(g, g.linear(h, w2, b2), y), "loss");
  return g;
}

inline train::TensorMap digits_params(std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0F, 1.0F);
  const auto fill = [&](std::vector<std::int64_t> shape, float scale) {
    std::int64_t n = 1;
    for (auto s : shape) n *= s;
    std::vector<float> v(static_cast<std::size_t>(n));
    for (auto& e : v) e = nd(rng) * scale;
    return ir::Tensor::from_f32(std::move(shape), v);
  };
  return {{"w1", fill({64, 128}, 0.125F)},
          {"b1", fill({128}, 0.01F)},
          {"w2", fill({128, 10}, 0.088F)},
          {"b2", fill({10}, 0.01F)}};
}

// The classifier alone (logits [batch, 10]), for inference and PTQ, with digits_mlp's params.
inline ir::Graph digits_classifier(std::int64_t batch) {
  ir::Graph g("digits_classifier");
  auto x = g.input("x", {batch, 64});
  auto h = g.relu(g.linear(x, g.param("w1", {64, 128}), g.param("b1", {128})));
  g.add_output(g.linear(h, g.param("w2", {128, 10}), g.param("b2", {10})), "logits");
  return g;
}

// The images [lo, lo + rows) as one x batch [batch, 64], zero past the rows given (and past d.n).
inline ir::Tensor digits_x(const Digits& d, std::int64_t lo, std::int64_t rows, std::int64_t batch) {
  std::vector<float> x(static_cast<std::size_t>(batch * 64), 0.0F);
  for (std::int64_t i = 0; i < std::min(rows, d.n - lo); ++i)
    std::copy_n(d.x.begin() + (lo + i) * 64, 64, x.begin() + i * 64);
  return ir::Tensor::from_f32({batch, 64}, x);
}

// docs/training.md's example in C++: AdamW (lr 3e-3), batch 64, `epochs` passes over images [0, n_train) in
// order; returns the trained params.
inline train::TensorMap train_digits(const Digits& d, std::int64_t n_train, int epochs, std::uint32_t seed = 0) {
  constexpr std::int64_t kBatch = 64;
  train::Trainer trainer(digits_mlp(kBatch), digits_params(seed), train::AdamW{.lr = 3e-3});
  for (int e = 0; e < epochs; ++e)
    for (std::int64_t lo = 0; lo + kBatch <= n_train; lo += kBatch) {
      ir::Tensor y(ir::DType::I64, {kBatch});
      for (std::int64_t i = 0; i < kBatch; ++i) y.set(i, static_cast<double>(d.y[static_cast<std::size_t>(lo + i)]));
      trainer.step(train::TensorMap{{"x", digits_x(d, lo, kBatch, kBatch)}, {"y", y}});
    }
  return trainer.params();
}

// The fraction of images [lo, d.n) that `logits` (x [batch, 64] -> [batch, 10]) classifies right, in batches
// of `batch` (the last one zero-padded).
inline double digits_accuracy(const Digits& d, std::int64_t lo, std::int64_t batch,
                              const std::function<ir::Tensor(const ir::Tensor&)>& logits) {
  std::int64_t right = 0;
  for (std::int64_t b0 = lo; b0 < d.n; b0 += batch) {
    const ir::Tensor out = logits(digits_x(d, b0, batch, batch));
    for (std::int64_t i = 0; i < std::min(batch, d.n - b0); ++i) {
      std::int64_t best = 0;
      for (std::int64_t c = 1; c < 10; ++c)
        if (out.get(i * 10 + c) > out.get(i * 10 + best)) best = c;
      right += best == d.y[static_cast<std::size_t>(b0 + i)];
    }
  }
  return static_cast<double>(right) / static_cast<double>(d.n - lo);
}

}  // namespace rlx::test
