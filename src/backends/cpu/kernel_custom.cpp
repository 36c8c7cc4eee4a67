// Custom ops with a host kernel (runtime::register_host_kernel) run here on
// the arena's buffers directly: the CPU is the host, so no staging.
#include <array>

#include "backends/cpu/kernels.hpp"
#include "rlx/error.hpp"
#include "rlx/runtime/custom_kernels.hpp"

namespace rlx::backends::cpu {

namespace {
class CustomKernel final : public CpuKernel {
 public:
  CustomKernel(const BuildCtx& b, const runtime::HostKernel* fn) : fn_(fn), attrs_(b.anchor().attrs) {
    for (std::size_t i = 0; i < b.kernel.inputs.size(); ++i) {
      const auto& buf = b.in(i);
      inputs_.push_back({buf.id, buf.dtype, buf.shape, static_cast<std::size_t>(buf.nbytes())});
    }
    out_ = b.out().id;
    out_dtype_ = b.out().dtype;
    out_shape_ = b.out().shape;
    out_bytes_ = static_cast<std::size_t>(b.out().nbytes());
  }
  void run(const RunCtx& ctx) const override {
    // Views are rebuilt per run from the pointer table; at most a few inputs, so
    // a fixed array keeps the run free of heap allocation.
    std::array<ir::TensorView, 64> views;
    for (std::size_t i = 0; i < inputs_.size(); ++i)
      views[i] = {inputs_[i].dtype, inputs_[i].shape, ctx.ptrs[inputs_[i].id], inputs_[i].nbytes};
    (*fn_)(std::span<const ir::TensorView>(views.data(), inputs_.size()),
           ir::MutableTensorView{out_dtype_, out_shape_, ctx.ptrs[out_], out_bytes_}, attrs_);
  }

 private:
  struct In {
    compile::BufferId id;
    ir::DType dtype;
    std::vector<std::int64_t> shape;
    std::size_t nbytes;
  };
  const runtime::HostKernel* fn_;
  ir::Attrs attrs_;
  std::vector<In> inputs_;
  compile::BufferId out_;
  ir::DType out_dtype_;
  std::vector<std::int64_t> out_shape_;
  std::size_t out_bytes_;
};
}  // namespace

std::unique_ptr<CpuKernel> build_custom(const BuildCtx& b) {
  const auto& name = b.anchor().attrs.get_str("op");
  const auto* fn = runtime::find_host_kernel(name);
  if (!fn) b.fail("custom op '" + name + "' has no host kernel (register_host_kernel) and was not inlined");
  return std::make_unique<CustomKernel>(b, fn);
}

}  // namespace rlx::backends::cpu
