// Device introspection and selection: what can run a graph, what each device
// would cost, which one wins and why; GraphDevices and FlexibleSession on top.
#include "rlx/runtime/graph_devices.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <set>

#include "rlx/env.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/custom_op.hpp"

namespace rlx::runtime {

namespace {

std::vector<std::string> capability_names(Device d) {
  auto names = advisory_capabilities(d).names();
  return {names.begin(), names.end()};
}

// The backend, or null with the reason (without make_backend's "device 'x' is unavailable: ").
std::unique_ptr<Backend> try_backend(Device d, std::string* why) {
  try {
    return make_backend(d);
  } catch (const Error& e) {
    *why = e.what();
    const auto prefix = fmt::format("device '{}' is unavailable: ", device_label(d));
    if (why->starts_with(prefix)) why->erase(0, prefix.size());
    return nullptr;
  }
}

// What stops `backend` from running `g`, found without compiling: ops left
// unsupported after the decompositions the pipeline would do, custom ops with
// neither a kernel nor a lowering, and non-float dtypes it does not compute
// (float ones are legalized with casts).
std::vector<std::string> blockers_of(const ir::Graph& g, const compile::BackendTraits& t) {
  const ir::Graph m = compile::passes::decompose(g, t.native_ops);
  std::vector<std::string> out;
  std::set<std::string> seen;
  auto add = [&](const std::string& what, std::string msg) {
    if (seen.insert(what).second) out.push_back(std::move(msg));
  };
  for (const auto& n : m.nodes()) {
    const auto op = std::string(ir::op_name(n.op));
    if (n.op == ir::OpKind::Custom) {
      const auto& name = n.attrs.get_str("op");
      if (!t.custom_kernels.contains(name) && !ir::is_op_registered(name))
        add("custom:" + name, fmt::format("custom op '{}' (%{}): no kernel on {} and no lowering", name, n.id, t.name));
    } else if (dispatch_tier(n.op, t) == compile::DispatchTier::Unsupported) {
      add(op, fmt::format("{} (%{}): {} has no kernel for it and no host fallback", op, n.id, t.name));
    }
    if (!ir::is_float(n.dtype) && !t.native_dtypes.contains(n.dtype))
      add(std::string(ir::dtype_name(n.dtype)),
          fmt::format("{} values ({} %{}): not a dtype {} computes", ir::dtype_name(n.dtype), op, n.id, t.name));
  }
  return out;
}

// Ties on the estimate go to the CPU (no transfers, every op native), then Device order.
int platform_priority(Device d) { return d == Device::Cpu ? -1 : int(d); }

constexpr double kTie = 1.10;  // estimates within 10% of the best tie

// Orders the viable candidates [0, n) of `c` (those with estimates) and
// writes each one's `why`; returns the order.
std::vector<std::size_t> rank(std::vector<DeviceCandidate>& c, const DevicePolicy& policy) {
  std::vector<std::size_t> idx;
  for (std::size_t i = 0; i < c.size(); ++i)
    if (c[i].viable() && c[i].estimate) idx.push_back(i);
  if (idx.empty()) return idx;
  double best = 1e300;
  for (auto i : idx) best = std::min(best, c[i].estimate->seconds);
  const auto& prefer = policy.preferred();
  auto pref = [&](Device d) { return std::size_t(std::find(prefer.begin(), prefer.end(), d) - prefer.begin()); };
  auto tied = [&](std::size_t i) { return c[i].estimate->seconds <= best * kTie; };
  std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) {
    if (tied(a) != tied(b)) return tied(a);
    if (tied(a)) {
      if (pref(c[a].device) != pref(c[b].device)) return pref(c[a].device) < pref(c[b].device);
    } else if (c[a].estimate->seconds != c[b].estimate->seconds) {
      return c[a].estimate->seconds < c[b].estimate->seconds;
    }
    return platform_priority(c[a].device) < platform_priority(c[b].device);
  });
  const auto n_tied = std::size_t(std::count_if(idx.begin(), idx.end(), tied));
  auto& first = c[idx[0]];
  if (idx.size() == 1)
    first.why = "the only viable device";
  else if (n_tied == 1)
    first.why = fmt::format("lowest estimate ({}; next {} at {})", seconds_str(first.estimate->seconds),
                            c[idx[1]].label, seconds_str(c[idx[1]].estimate->seconds));
  else if (pref(first.device) < prefer.size())
    first.why = fmt::format("{} devices within 10% of the best estimate ({}); first of them in the prefer list ({})",
                            n_tied, seconds_str(best), device_list_str(prefer));
  else
    first.why = fmt::format("{} devices within 10% of the best estimate ({}); ties go to the CPU, then Device order",
                            n_tied, seconds_str(best));
  for (std::size_t r = 1; r < idx.size(); ++r) {
    auto& x = c[idx[r]];
    x.why = fmt::format("rank {}: estimate {} ({:.2f}x the pick){}", r + 1, seconds_str(x.estimate->seconds),
                        x.estimate->seconds / first.estimate->seconds, tied(idx[r]) ? ", tied but ranked lower" : "");
  }
  return idx;
}

// The device asked for explicitly (hint, then the policy's default, then
// RLX_DEVICE), checked against the policy and the graph; nullopt when none is.
std::optional<Device> explicit_device(const ir::Graph& g, std::optional<Device> hint, const DevicePolicy& policy) {
  std::string from;
  if (hint) {
    from = "the hint";
  } else if (policy.default_device()) {
    hint = policy.default_device();
    from = "the policy's default device";
  } else if (auto s = env::get("RLX_DEVICE")) {
    hint = parse_device_list(std::vector{*s}, "RLX_DEVICE").at(0);
    from = "RLX_DEVICE";
  } else {
    return std::nullopt;
  }
  const auto label = device_label(*hint);
  if (auto why = policy.blocked_reason(*hint); !why.empty())
    throw Error(fmt::format("{} asks for device '{}', which is {}", from, label, why));
  std::string why;
  auto backend = try_backend(*hint, &why);
  if (!backend) throw Error(fmt::format("{} asks for device '{}', which is unavailable: {}", from, label, why));
  if (auto b = blockers_of(g, backend->traits()); !b.empty())
    throw Error(fmt::format("{} asks for device '{}', which cannot run graph '{}': {}", from, label, g.name(),
                            fmt::join(b, "; ")));
  return hint;
}

double median_ms(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

std::vector<Device> available_devices() {
  std::vector<Device> out;
  for (auto d : registered_devices())
    if (is_available(d)) out.push_back(d);
  return out;
}

std::vector<Device> devices_for(const ir::Graph& graph) {
  std::vector<Device> out;
  for (auto d : registered_devices()) {
    std::string why;
    if (auto b = try_backend(d, &why); b && blockers_of(graph, b->traits()).empty()) out.push_back(d);
  }
  return out;
}

DeviceReport device_report(const ir::Graph& graph, const DevicePolicy& policy,
                           const std::vector<std::pair<std::string, std::int64_t>>& bind) {
  DeviceReport r{.graph = graph.name(), .policy = policy.describe(), .candidates = {}, .recommended = {}, .why = {}};
  const GraphCost cost = graph_cost(graph, bind);
  std::vector<DeviceCandidate> c;
  for (auto d : kAllDevices) {
    auto& x = c.emplace_back();
    x.device = d;
    x.label = std::string(device_label(d));
    x.capabilities = capability_names(d);
    x.policy_block = policy.blocked_reason(d);
    auto backend = try_backend(d, &x.unavailable_reason);
    x.available = backend != nullptr;
    if (!backend) {
      x.why = "unavailable: " + x.unavailable_reason;
      continue;
    }
    x.blockers = blockers_of(graph, backend->traits());
    if (!x.policy_block.empty()) {
      x.why = "blocked: " + x.policy_block;
    } else if (!x.blockers.empty()) {
      x.why = fmt::format("cannot run the graph: {}{}", x.blockers[0],
                          x.blockers.size() > 1 ? fmt::format(" (and {} more)", x.blockers.size() - 1) : "");
    } else {
      try {
        auto calib = calibration_for(d);
        x.estimate = estimate_cost(cost, calib);
        x.calibration_source = calib.source;
      } catch (const Error& e) {
        x.blockers.push_back(fmt::format("calibration failed: {}", e.what()));
        x.why = "cannot be estimated: " + x.blockers.back();
      }
    }
  }
  const auto order = rank(c, policy);
  for (auto i : order) r.candidates.push_back(c[i]);
  for (std::size_t i = 0; i < c.size(); ++i)
    if (std::find(order.begin(), order.end(), i) == order.end()) r.candidates.push_back(c[i]);
  if (!order.empty()) {
    r.candidates[0].recommended = true;
    r.recommended = r.candidates[0].device;
    r.why = fmt::format("{}: {}", r.candidates[0].label, r.candidates[0].why);
  } else {
    r.why = "no device is viable: " + [&] {
      std::vector<std::string> parts;
      for (const auto& x : r.candidates) parts.push_back(x.label + " " + x.why);
      return fmt::format("{}", fmt::join(parts, "; "));
    }();
  }
  return r;
}

std::string DeviceReport::to_text() const {
  std::string s = fmt::format("devices for graph '{}' (policy: {})\n", graph, policy);
  s += fmt::format("  {:<7} {:<12} {:<10} {}\n", "device", "status", "estimate", "why");
  for (const auto& x : candidates) {
    const char* status = x.recommended             ? "recommended"
                         : x.viable()              ? "viable"
                         : !x.available            ? "unavailable"
                         : !x.policy_block.empty() ? "blocked"
                                                   : "cannot run";
    s += fmt::format("  {:<7} {:<12} {:<10} {}\n", x.label, status, x.estimate ? seconds_str(x.estimate->seconds) : "-",
                     x.why);
    if (x.estimate) s += fmt::format("  {:<7} {:<12} {:<10} estimate: {}\n", "", "", "", x.estimate->explain);
    if (x.available)
      s += fmt::format("  {:<7} {:<12} {:<10} capabilities (advisory): {}\n", "", "", "",
                       fmt::join(x.capabilities, ","));
  }
  s += fmt::format("recommended: {}\n", recommended ? why : "none (" + why + ")");
  return s;
}

Device fastest_device_for(const ir::Graph& graph, const DevicePolicy& policy) {
  auto r = device_report(graph, policy);
  if (!r.recommended)
    throw Error(fmt::format("no device can run graph '{}' under the policy ({}): {}", graph.name(), r.policy, r.why));
  return *r.recommended;
}

Device resolve_device(const ir::Graph& graph, std::optional<Device> hint, const DevicePolicy& policy) {
  if (auto d = explicit_device(graph, hint, policy)) return *d;
  return fastest_device_for(graph, policy);
}

// ---- GraphDevices ----

GraphDevices::GraphDevices(ir::Graph graph, DevicePolicy policy, compile::CompileOptions options)
    : graph_(std::move(graph)), policy_(std::move(policy)), options_(std::move(options)) {}

const ir::Node& GraphDevices::param_node(std::string_view name) const { return graph_.node(graph_.find_param(name)); }

void GraphDevices::set_param(std::string_view name, const ir::Tensor& value) {
  const auto& n = param_node(name);
  if (value.dtype() != n.dtype)
    throw Error(fmt::format("set_param: param '{}' is {}, got {} (set_param_typed converts)", name,
                            ir::dtype_name(n.dtype), ir::dtype_name(value.dtype())));
  set_param_typed(name, value);
}

void GraphDevices::set_param_typed(std::string_view name, const ir::Tensor& value) {
  const auto& n = param_node(name);
  if (n.shape.is_static() && n.shape.extents() != value.shape())
    throw Error(
        fmt::format("set_param: param '{}' has shape {}, got {}", name, n.shape.str(), ir::Shape(value.shape()).str()));
  Param p{value, value.dtype() != n.dtype};
  for (auto& [d, c] : cache_) push(c, std::string(name), p);
  params_[std::string(name)] = std::move(p);
}

void GraphDevices::push(CompiledGraph& c, const std::string& name, const Param& p) const {
  const auto& specs = c.param_specs();
  auto it = std::find_if(specs.begin(), specs.end(), [&](const auto& s) { return s.name == name; });
  if (it == specs.end()) return;  // optimized away (unused) or specialized at compile time
  if (p.value.dtype() == it->dtype) {
    c.set_param(name, p.value);
  } else if (c.capabilities().typed_io) {
    c.set_param_typed(name, ir::view(p.value));
  } else {
    ir::Tensor t(it->dtype, p.value.shape());
    for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, p.value.get(i));
    c.set_param(name, t);
  }
}

void GraphDevices::sync_params_to_all() {
  for (auto& [d, c] : cache_)
    for (const auto& [name, p] : params_) push(c, name, p);
}

std::vector<Device> GraphDevices::devices() const {
  std::vector<Device> out;
  for (const auto& x : report().candidates)
    if (x.viable()) out.push_back(x.device);
  return out;
}

DeviceReport GraphDevices::report() const { return device_report(graph_, policy_, options_.bind); }

Device GraphDevices::fastest() const {
  auto r = report();
  if (!r.recommended)
    throw Error(fmt::format("no device can run graph '{}' under the policy ({}): {}", graph_.name(), r.policy, r.why));
  return *r.recommended;
}

Device GraphDevices::resolve(std::optional<Device> hint) const {
  if (auto d = explicit_device(graph_, hint, policy_)) return *d;
  if (policy_.strategy().kind == DevicePickStrategy::Kind::Benchmark && bench_winner_) return *bench_winner_;
  return fastest();
}

CompiledGraph& GraphDevices::compile(Device device) {
  if (auto it = cache_.find(device); it != cache_.end()) return it->second;
  if (auto why = policy_.blocked_reason(device); !why.empty())
    throw Error(fmt::format("device '{}' is {}", device_label(device), why));
  auto& c = cache_.emplace(device, Session(device).compile(graph_, options_)).first->second;
  try {
    for (const auto& [name, p] : params_) push(c, name, p);
  } catch (...) {
    cache_.erase(device);
    throw;
  }
  return c;
}

std::vector<ir::Tensor> GraphDevices::run(Device device, std::span<const NamedTensor> inputs) {
  return compile(device).run(inputs);
}

std::vector<ir::Tensor> GraphDevices::run_resolved_with_inputs(std::optional<Device> hint,
                                                               std::span<const NamedTensor> inputs) {
  if (!hint && !policy_.default_device() && !env::get("RLX_DEVICE") &&
      policy_.strategy().kind == DevicePickStrategy::Kind::Benchmark && !bench_winner_)
    benchmark(inputs, policy_.strategy().runs);
  return run(resolve(hint), inputs);
}

std::pair<Device, std::vector<ir::Tensor>> GraphDevices::run_chain(std::optional<std::vector<Device>> chain,
                                                                   std::span<const NamedTensor> inputs) {
  if (!chain && !policy_.chain().empty()) chain = policy_.chain();
  if (!chain)
    if (auto env_chain = env::get_list("RLX_DEVICE_CHAIN"); !env_chain.empty())
      chain = parse_device_list(env_chain, "RLX_DEVICE_CHAIN");
  if (!chain) chain = devices();
  return run_try(*chain, inputs);
}

std::pair<Device, std::vector<ir::Tensor>> GraphDevices::run_try(std::span<const Device> order,
                                                                 std::span<const NamedTensor> inputs) {
  failures_.clear();
  for (auto d : order) {
    try {
      return {d, run(d, inputs)};
    } catch (const std::exception& e) {
      failures_.emplace_back(d, e.what());
    }
  }
  std::vector<std::string> parts;
  for (const auto& [d, why] : failures_) parts.push_back(fmt::format("{}: {}", device_label(d), why));
  throw Error(
      fmt::format("no device ran graph '{}' (tried {}): {}", graph_.name(), device_list_str(order),
                  parts.empty() ? std::string("the list is empty") : fmt::format("{}", fmt::join(parts, "; "))));
}

std::vector<Device> GraphDevices::warm_all() {
  failures_.clear();
  std::vector<Device> ok;
  for (auto d : devices()) {
    try {
      compile(d);
      ok.push_back(d);
    } catch (const std::exception& e) {
      failures_.emplace_back(d, e.what());
    }
  }
  return ok;
}

std::vector<DeviceBenchResult> GraphDevices::benchmark(std::span<const NamedTensor> inputs, int runs) {
  if (runs <= 0) throw Error(fmt::format("benchmark: runs must be positive, got {}", runs));
  std::vector<DeviceBenchResult> out;
  for (auto d : devices()) {
    auto& r = out.emplace_back();
    r.device = d;
    r.label = std::string(device_label(d));
    try {
      auto& c = compile(d);
      std::vector<ir::Tensor> outs = c.run(inputs);  // warm-up, and the output buffers for the timed runs
      std::vector<double> ms;
      for (int i = 0; i < runs; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        c.run_into(inputs, outs);
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
      r.runs = runs;
      r.min_ms = *std::min_element(ms.begin(), ms.end());
      r.median_ms = median_ms(ms);
      r.ok = true;
    } catch (const std::exception& e) {
      r.error = e.what();
    }
  }
  const DeviceBenchResult* best = nullptr;
  for (const auto& r : out)
    if (r.ok && (!best || r.median_ms < best->median_ms)) best = &r;
  if (best) bench_winner_ = best->device;
  return out;
}

void GraphDevices::invalidate_cache() {
  cache_.clear();
  bench_winner_.reset();
}

std::vector<Device> GraphDevices::cached_devices() const {
  std::vector<Device> out;
  for (const auto& [d, c] : cache_) out.push_back(d);
  return out;
}

// ---- FlexibleSession ----

CompiledGraph FlexibleSession::compile_resolved(const ir::Graph& graph, std::optional<Device> hint,
                                                const compile::CompileOptions& options) const {
  return Session(resolve(graph, hint)).compile(graph, options);
}

CompiledGraph FlexibleSession::compile_on(const ir::Graph& graph, Device device,
                                          const compile::CompileOptions& options) const {
  if (auto why = policy_.blocked_reason(device); !why.empty())
    throw Error(fmt::format("compile_on: device '{}' is {}", device_label(device), why));
  return Session(device).compile(graph, options);
}

// ---- BackendsManifest ----

BackendsManifest BackendsManifest::current() {
  BackendsManifest m;
  const auto registered = registered_devices();
  for (auto d : kAllDevices) {
    auto& e = m.backends.emplace_back();
    e.device = d;
    e.label = std::string(device_label(d));
    e.built_in = std::find(registered.begin(), registered.end(), d) != registered.end();
    e.advisory_capabilities = capability_names(d);
    if (auto b = try_backend(d, &e.reason)) {
      e.available = true;
      e.backend = std::string(b->name());
      e.device_name = device_id(d, *b);
    }
  }
  return m;
}

std::string BackendsManifest::to_json() const {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& e : backends)
    list.push_back({{"device", e.label},
                    {"built_in", e.built_in},
                    {"available", e.available},
                    {"reason", e.reason},
                    {"backend", e.backend},
                    {"device_name", e.device_name},
                    {"advisory_capabilities", e.advisory_capabilities}});
  return nlohmann::json{{"version", 1}, {"backends", list}}.dump(2);
}

std::string BackendsManifest::to_text() const {
  std::string s = fmt::format("  {:<7} {:<9} {:<10} {}\n", "device", "built in", "available", "backend / why not");
  for (const auto& e : backends)
    s += fmt::format("  {:<7} {:<9} {:<10} {}\n", e.label, e.built_in ? "yes" : "no", e.available ? "yes" : "no",
                     e.available ? fmt::format("{} ({})", e.backend, e.device_name) : e.reason);
  return s;
}

}  // namespace rlx::runtime
