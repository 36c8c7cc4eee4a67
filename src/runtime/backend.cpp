#include "rlx/runtime/backend.hpp"

#include <array>
#include <mutex>
#include <string>

#include "rlx/error.hpp"

namespace rlx::runtime {

namespace {
constexpr std::array<std::pair<Device, std::string_view>, 9> kLabels{{{Device::Cpu, "cpu"},
                                                                      {Device::Cuda, "cuda"},
                                                                      {Device::Rocm, "rocm"},
                                                                      {Device::Metal, "metal"},
                                                                      {Device::Mlx, "mlx"},
                                                                      {Device::Gpu, "gpu"},
                                                                      {Device::Vulkan, "vulkan"},
                                                                      {Device::CoreMl, "coreml"},
                                                                      {Device::Tpu, "tpu"}}};

struct Registry {
  std::mutex mu;
  std::array<BackendFactory, kLabels.size()> factories;
};
// Function-local static: safe to use from other translation units' static
// initializers (backends register themselves when librlx loads).
Registry& registry() {
  static Registry r;
  return r;
}
}  // namespace

namespace {
struct GpuChoice {
  std::mutex mu;
  int ordinal = 0;
  bool claimed = false;
};
GpuChoice& gpu_choice() {
  static GpuChoice g;
  return g;
}
}  // namespace

void set_gpu(int ordinal) {
  if (ordinal < 0) throw Error("set_gpu: GPU " + std::to_string(ordinal) + " is not a GPU ordinal (0, 1, ...)");
  GpuChoice& g = gpu_choice();
  std::lock_guard lock(g.mu);
  if (g.claimed && g.ordinal != ordinal)
    throw Error("set_gpu: this process already runs the CUDA backend on GPU " + std::to_string(g.ordinal) +
                "; it cannot move to GPU " + std::to_string(ordinal) +
                " (the backend starts on its GPU when it is first created: a Session or make_backend for cuda; "
                "choose the GPU before that, or start one process per GPU)");
  g.ordinal = ordinal;
}

int gpu() {
  GpuChoice& g = gpu_choice();
  std::lock_guard lock(g.mu);
  return g.ordinal;
}

int claim_gpu() {
  GpuChoice& g = gpu_choice();
  std::lock_guard lock(g.mu);
  g.claimed = true;
  return g.ordinal;
}

std::string_view device_label(Device d) { return kLabels[static_cast<std::size_t>(d)].second; }

Device parse_device(std::string_view name) {
  std::string s(name);
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s == "nvidia") s = "cuda";
  if (s == "wgpu" || s == "webgpu") s = "gpu";
  for (const auto& [d, label] : kLabels)
    if (label == s) return d;
  std::string known;
  for (const auto& [d, label] : kLabels) known += (known.empty() ? "" : ", ") + std::string(label);
  throw Error("unknown device '" + std::string(name) + "' (known: " + known + "; aliases nvidia, wgpu)");
}

namespace {
class UnavailableBackend final : public Backend {
 public:
  UnavailableBackend(std::string name, compile::BackendTraits traits, std::string why)
      : name_(std::move(name)), traits_(std::move(traits)), why_(std::move(why)) {}
  std::string_view name() const override { return name_; }
  std::string unavailable_reason() const override { return why_; }
  compile::BackendTraits traits() const override { return traits_; }
  std::unique_ptr<ExecutableGraph> compile_lir(const compile::LirModule&, const compile::CompileOptions&) override {
    throw Error("device '" + name_ + "' is unavailable: " + why_);
  }

 private:
  std::string name_;
  compile::BackendTraits traits_;
  std::string why_;
};
}  // namespace

std::unique_ptr<Backend> make_unavailable_backend(std::string name, compile::BackendTraits traits, std::string why) {
  return std::make_unique<UnavailableBackend>(std::move(name), std::move(traits), std::move(why));
}

void register_backend(Device device, BackendFactory factory) {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  r.factories[static_cast<std::size_t>(device)] = std::move(factory);
}

std::unique_ptr<Backend> make_backend(Device device) {
  BackendFactory factory;
  {
    auto& r = registry();
    std::lock_guard lock(r.mu);
    factory = r.factories[static_cast<std::size_t>(device)];
  }
  if (!factory)
    throw Error("device '" + std::string(device_label(device)) +
                "' is unavailable: no backend for it is built into this RLX");
  auto backend = factory();
  if (auto why = backend->unavailable_reason(); !why.empty())
    throw Error("device '" + std::string(device_label(device)) + "' is unavailable: " + why);
  return backend;
}

std::unique_ptr<Backend> registered_backend(Device device) {
  BackendFactory factory;
  {
    auto& r = registry();
    std::lock_guard lock(r.mu);
    factory = r.factories[static_cast<std::size_t>(device)];
  }
  return factory ? factory() : nullptr;
}

std::vector<Device> registered_devices() {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  std::vector<Device> out;
  for (auto d : kAllDevices)
    if (r.factories[static_cast<std::size_t>(d)]) out.push_back(d);
  return out;
}

bool is_available(Device device) {
  try {
    make_backend(device);
    return true;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace rlx::runtime
