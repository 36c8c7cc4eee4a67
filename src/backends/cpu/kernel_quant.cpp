// The block-quantized ops on the CPU: quantized_matmul through the integer kernels of
// quant_matmul.hpp (the weight stays in its blocks), embedding rows dequantized as they are
// picked, and dequantize / quantize a row at a time with rlx/ir/quants.hpp's codecs.
#include <cstring>

#include "backends/cpu/kernels.hpp"
#include "backends/cpu/quant_matmul.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/quants.hpp"

namespace rlx::backends::cpu {

namespace {

using ir::DType;

// Rows of a block-typed buffer: the last axis holds whole blocks.
struct Rows {
  i64 rows = 0, cols = 0;
  std::size_t row_bytes = 0;
};
Rows rows_of(const compile::Buffer& b) {
  Rows r;
  r.cols = b.shape.empty() ? 1 : b.shape.back();
  r.rows = r.cols ? numel(b.shape) / r.cols : 0;
  r.row_bytes = ir::storage_bytes(b.dtype, std::vector<i64>{r.cols});
  return r;
}

class QuantizedMatmulKernel final : public CpuKernel {
 public:
  compile::BufferId x = 0, w = 0, y = 0;
  DType type = DType::Q4_0;
  i64 n = 0, k = 0, m = 0;  // w is [n, k]; x holds m rows of k
  QuantMode mode = QuantMode::Exact;
  const QuantTable* table = nullptr;
  int threads = 1;

  void run(const RunCtx& c) const override {
    if (m == 0) return;
    quant_gemm_with(*table, type, c.ptrs[w], n, k, at<float>(c, x), m, at_mut<float>(c, y), mode, threads);
  }
};

class EmbeddingKernel final : public CpuKernel {
 public:
  compile::BufferId table = 0, ids = 0, out = 0;
  DType type = DType::F32;
  i64 vocab = 0, count = 0;
  Rows row;
  std::size_t out_row_bytes = 0;
  IndexReader index;  // the ids: wrapped once Python style and range-checked, as gather's

  void run(const RunCtx& c) const override {
    const std::byte *src = c.ptrs[table], *ip = c.ptrs[ids];
    std::byte* dst = c.ptrs[out];
    const bool block = ir::is_block_quantized(type);
    parallel_for(
        count, 1,
        [&](i64 b, i64 e) {
          for (i64 i = b; i < e; ++i) {
            const i64 r = index(ip, i, vocab, 0);
            const std::byte* s = src + std::size_t(r) * row.row_bytes;
            std::byte* d = dst + std::size_t(i) * out_row_bytes;
            if (block)
              ir::dequantize(type, std::span(s, row.row_bytes),
                             std::span(reinterpret_cast<float*>(d), std::size_t(row.cols)));
            else
              std::memcpy(d, s, row.row_bytes);
          }
        },
        threads);
  }
  int threads = 1;
};

// dequantize (block -> f32) or quantize (f32 -> block), row by row.
class CodecKernel final : public CpuKernel {
 public:
  compile::BufferId x = 0, y = 0;
  DType block = DType::Q4_0;
  bool to_block = false;
  Rows row;
  int threads = 1;
  std::string where;

  void run(const RunCtx& c) const override {
    const std::byte* src = c.ptrs[x];
    std::byte* dst = c.ptrs[y];
    const std::size_t floats = std::size_t(row.cols) * sizeof(float);
    parallel_for(
        row.rows, 1,
        [&](i64 b, i64 e) {
          for (i64 r = b; r < e; ++r) {
            if (to_block) {
              try {
                ir::quantize(
                    block,
                    std::span(reinterpret_cast<const float*>(src + std::size_t(r) * floats), std::size_t(row.cols)),
                    std::span(dst + std::size_t(r) * row.row_bytes, row.row_bytes));
              } catch (const Error& err) {
                throw Error(where + ": row " + std::to_string(r) + ": " + err.what());
              }
            } else {
              ir::dequantize(block, std::span(src + std::size_t(r) * row.row_bytes, row.row_bytes),
                             std::span(reinterpret_cast<float*>(dst + std::size_t(r) * floats), std::size_t(row.cols)));
            }
          }
        },
        threads);
  }
};

}  // namespace

std::unique_ptr<CpuKernel> build_quant(const BuildCtx& b) {
  const ir::Node& n = b.anchor();
  const compile::Buffer& y = b.out(0);
  switch (n.op) {
    case ir::OpKind::QuantizedMatmul: {
      auto k = std::make_unique<QuantizedMatmulKernel>();
      const compile::Buffer &xb = b.in_of(n.inputs.at(0)), &wb = b.in_of(n.inputs.at(1));
      k->x = xb.id, k->w = wb.id, k->y = y.id, k->type = wb.dtype;
      k->n = wb.shape.at(0), k->k = wb.shape.at(1), k->m = k->k ? numel(xb.shape) / k->k : 0;
      k->mode = n.attrs.get_str("activations") == "q8" ? QuantMode::Fast : QuantMode::Exact;
      if (k->mode == QuantMode::Fast && !quant_fast_supported(k->type))
        b.fail("no integer kernel for " + std::string(ir::dtype_name(k->type)) + " weights");
      k->table = &select_quant_table();
      k->threads = b.threads;
      return k;
    }
    case ir::OpKind::Embedding: {
      auto k = std::make_unique<EmbeddingKernel>();
      const compile::Buffer &tb = b.in_of(n.inputs.at(0)), &ib = b.in_of(n.inputs.at(1));
      k->table = tb.id, k->ids = ib.id, k->out = y.id, k->type = tb.dtype;
      k->index = {ib.dtype, b.where()};
      k->vocab = tb.shape.at(0), k->count = numel(ib.shape);
      k->row = rows_of(tb);
      k->out_row_bytes = ir::storage_bytes(y.dtype, std::vector<i64>{k->row.cols});
      k->threads = b.threads;
      return k;
    }
    case ir::OpKind::Dequantize:
    case ir::OpKind::Quantize: {
      auto k = std::make_unique<CodecKernel>();
      const compile::Buffer& xb = b.in_of(n.inputs.at(0));
      k->x = xb.id, k->y = y.id;
      k->to_block = n.op == ir::OpKind::Quantize;
      k->block = k->to_block ? y.dtype : xb.dtype;
      k->row = rows_of(k->to_block ? y : xb);
      k->threads = b.threads;
      k->where = b.where();
      return k;
    }
    default: b.fail("op " + std::string(ir::op_name(n.op)) + " has no block-quantized CPU kernel");
  }
}

}  // namespace rlx::backends::cpu
