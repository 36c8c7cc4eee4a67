// Leaf kernels: iota and the counter-based random ops (rlx/ir/random.hpp),
// element i a pure function of its flat index, so threading cannot change them.
#include "backends/cpu/kernels.hpp"
#include "rlx/ir/random.hpp"

namespace rlx::backends::cpu {

namespace {

class LeafKernel final : public CpuKernel {
 public:
  ir::OpKind op = ir::OpKind::Iota;
  compile::BufferId out = 0;
  ir::DType dtype = ir::DType::F32;
  i64 total = 0, axis_extent = 1, axis_inner = 1;  // iota: index = flat / inner % extent
  std::uint64_t seed = 0;
  double a = 0, b = 1;  // uniform: low, high; normal: mean, std

  void run(const RunCtx& c) const override {
    std::byte* dst = c.ptrs[out];
    const std::size_t es = ir::dtype_size(dtype);
    parallel_for(
        total, kGrain,
        [&](i64 begin, i64 end) {
          for (i64 i = begin; i < end; ++i) {
            double v;
            switch (op) {
              case ir::OpKind::Iota: v = double(i / axis_inner % axis_extent); break;
              case ir::OpKind::RandomUniform:
                v = a + (b - a) * double(ir::rng_uniform01(seed, std::uint64_t(i)));
                break;
              default: v = a + b * ir::rng_normal(seed, std::uint64_t(i)); break;
            }
            ir::write_element(dst + std::size_t(i) * es, dtype, v);
          }
        },
        c.max_threads);
  }
};

}  // namespace

std::unique_ptr<CpuKernel> build_leaf(const BuildCtx& b) {
  const ir::Node& n = b.anchor();
  const auto& ob = b.out(0);
  auto k = std::make_unique<LeafKernel>();
  k->op = n.op;
  k->out = ob.id;
  k->dtype = ob.dtype;
  k->total = numel(ob.shape);
  switch (n.op) {
    case ir::OpKind::Iota:
      if (!ob.shape.empty()) {
        auto axis = std::size_t(ir::normalize_axis(n.attrs.get_int("axis"), ob.shape.size()));
        k->axis_extent = std::max<i64>(ob.shape[axis], 1);
        for (std::size_t d = axis + 1; d < ob.shape.size(); ++d) k->axis_inner *= ob.shape[d];
      }
      break;
    case ir::OpKind::RandomUniform:
      k->seed = std::uint64_t(n.attrs.get_int("seed"));
      k->a = n.attrs.float_or("low", 0.0);
      k->b = n.attrs.float_or("high", 1.0);
      break;
    case ir::OpKind::RandomNormal:
      k->seed = std::uint64_t(n.attrs.get_int("seed"));
      k->a = n.attrs.float_or("mean", 0.0);
      k->b = n.attrs.float_or("std", 1.0);
      break;
    default: b.fail("op " + std::string(ir::op_name(n.op)) + " is not a leaf op");
  }
  return k;
}

}  // namespace rlx::backends::cpu
