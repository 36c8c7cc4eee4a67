// The registry of register_mlx_kernel (rlx/backends/mlx/mlx_kernel.hpp). The
// names are also given to the runtime (register_backend_kernel_name), so that
// custom_op_route and the traits' custom_kernels see them.
#ifdef RLX_HAVE_MLX
#include <map>
#include <mutex>

#include "rlx/backends/mlx/mlx_kernel.hpp"
#include "rlx/error.hpp"
#include "rlx/runtime/custom_kernels.hpp"

namespace rlx::backends::mlx {

namespace {
struct Registry {
  std::mutex mu;
  std::map<std::string, MlxKernel, std::less<>> kernels;
};
Registry& registry() {
  static Registry r;
  return r;
}
}  // namespace

void register_mlx_kernel(std::string op_name, MlxKernel kernel) {
  if (!kernel) throw Error("register_mlx_kernel: '" + op_name + "' was given an empty function");
  runtime::register_backend_kernel_name(runtime::Device::Mlx, op_name);
  std::lock_guard lock(registry().mu);
  registry().kernels[std::move(op_name)] = std::move(kernel);
}

// A copy, not a pointer: a run that is lowering the node keeps a whole function while the name is registered
// again from another thread.
MlxKernel find_mlx_kernel(std::string_view op_name) {
  std::lock_guard lock(registry().mu);
  auto it = registry().kernels.find(op_name);
  return it == registry().kernels.end() ? MlxKernel{} : it->second;
}

std::vector<std::string> mlx_kernel_names() {
  std::lock_guard lock(registry().mu);
  std::vector<std::string> out;
  for (const auto& [name, k] : registry().kernels) out.push_back(name);
  return out;
}

}  // namespace rlx::backends::mlx
#endif  // RLX_HAVE_MLX
