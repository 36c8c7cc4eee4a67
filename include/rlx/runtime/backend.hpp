#pragma once
// The backend interface. A backend is small: it declares its traits
// (supported ops and dtypes) and compiles an LIR module into an executable.
// Everything shared (legalization, fusion, memory planning, input checking)
// lives once, in rlx::compile and rlx::runtime::CompiledGraph.
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "rlx/compile/pipeline.hpp"
#include "rlx/ir/tensor.hpp"

namespace rlx::runtime {

enum class Device : std::uint8_t { Cpu, Cuda, Rocm, Metal, Mlx, Gpu, Vulkan, CoreMl, Tpu };
std::string_view device_label(Device d);     // "cpu", "cuda", ...
Device parse_device(std::string_view name);  // aliases nvidia->cuda, wgpu->gpu; throws rlx::Error

// A compiled graph on one backend. Inputs and outputs are in LIR order
// (LirModule::inputs / outputs); CompiledGraph maps names and checks them.
class ExecutableGraph {
 public:
  virtual ~ExecutableGraph() = default;
  // Writes a param (already checked against the LIR buffer's dtype and shape).
  virtual void set_param(std::size_t param_index, const void* data, std::size_t nbytes) = 0;
  // Runs once. `inputs[i]` points at LIR input i's bytes; `outputs[j]` at a
  // caller-owned buffer of LIR output j's size. Must not allocate.
  virtual void run(std::span<const void* const> inputs, std::span<void* const> outputs) = 0;
  // A copy that shares params (weights) but owns its arena, so that clones
  // can run concurrently from different threads.
  virtual std::unique_ptr<ExecutableGraph> clone() const = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  virtual compile::BackendTraits traits() const = 0;
  // Empty when available; otherwise the reason it is not.
  virtual std::string unavailable_reason() const { return {}; }
  virtual std::unique_ptr<ExecutableGraph> compile_lir(const compile::LirModule& lir,
                                                       const compile::CompileOptions& options) = 0;
};

using BackendFactory = std::function<std::unique_ptr<Backend>()>;
// Registers (or replaces) the backend for a device.
void register_backend(Device device, BackendFactory factory);
// The backend for `device`; throws rlx::Error saying why it is unavailable.
std::unique_ptr<Backend> make_backend(Device device);
bool is_available(Device device);
// Devices with a registered backend (available or not).
std::vector<Device> registered_devices();
inline constexpr Device kAllDevices[] = {Device::Cpu, Device::Cuda,   Device::Rocm,   Device::Metal, Device::Mlx,
                                         Device::Gpu, Device::Vulkan, Device::CoreMl, Device::Tpu};

// docs/op-coverage.md, generated from the registered backends' traits: each
// op's dispatch tier per backend. A test fails when the checked-in file drifts.
std::string op_coverage_markdown();

}  // namespace rlx::runtime
