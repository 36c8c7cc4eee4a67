// pyrlx bindings for backend selection (rlx/runtime/graph_devices.hpp,
// router.hpp): DevicePolicy, the device report, GraphDevices, DeviceRouter and
// the manifest. Devices cross the boundary as their labels ("cpu", "vulkan");
// the Python layer (pyrlx/__init__.py) adds dict I/O around the runners.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "convert.hpp"
#include "rlx/error.hpp"
#include "rlx/runtime/router.hpp"

namespace nb = nanobind;
using namespace nb::literals;
namespace ir = rlx::ir;
namespace rt = rlx::runtime;

namespace {

using pyrlx::AnyArray;
using NamedArrays = std::vector<std::tuple<std::string, AnyArray, std::string>>;

std::string label(rt::Device d) { return std::string(rt::device_label(d)); }
std::vector<std::string> labels(const std::vector<rt::Device>& ds) {
  std::vector<std::string> out;
  for (auto d : ds) out.push_back(label(d));
  return out;
}
std::vector<rt::Device> devices(const std::vector<std::string>& names, std::string_view what) {
  return rt::parse_device_list(names, what);
}
std::optional<rt::Device> device_opt(const std::optional<std::string>& name) {
  if (!name) return std::nullopt;
  return rt::parse_device(*name);
}

// Views of the caller's arrays; `shapes` keeps the shape storage alive.
std::vector<rt::NamedTensor> views(const NamedArrays& in, std::vector<std::vector<std::int64_t>>& shapes) {
  shapes.resize(in.size());
  std::vector<rt::NamedTensor> out;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const auto& [name, arr, dtype] = in[i];
    out.push_back({name, pyrlx::array_view(arr, ir::parse_dtype(dtype), shapes[i])});
  }
  return out;
}

nb::list arrays(const std::vector<ir::Tensor>& ts) {
  nb::list l;
  for (const auto& t : ts) l.append(pyrlx::tensor_to_array(t));
  return l;
}

// Runs `f` without the GIL (backends may take a while; other Python threads go on).
template <class F>
auto released(F&& f) {
  nb::gil_scoped_release release;
  return f();
}

// The value of a param given as raw bytes in `dtype`, shaped like the graph's param.
ir::Tensor param_from_bytes(const ir::Graph& g, const std::string& name, nb::bytes data, const std::string& dtype) {
  const auto& n = g.node(g.find_param(name));
  ir::Tensor t(ir::parse_dtype(dtype), n.shape.extents());
  if (data.size() != t.nbytes())
    throw rlx::Error("set_param_typed: param '" + name + "' holds " + std::to_string(t.numel()) + " " + dtype +
                     " values (" + std::to_string(t.nbytes()) + " bytes), got " + std::to_string(data.size()) +
                     " bytes");
  std::memcpy(t.data(), data.c_str(), t.nbytes());
  return t;
}

// set_param from an array for a holder of several compiled graphs. The GIL is released while their run locks are
// taken: a run in progress may need it (a Python kernel).
template <class Holder>
auto set_param_from_array() {
  return [](Holder& r, const std::string& name, const AnyArray& a, const std::string& dtype) {
    auto t = pyrlx::array_to_tensor(a, ir::parse_dtype(dtype));
    nb::gil_scoped_release release;
    r.set_param(name, t);
  };
}

}  // namespace

void bind_runtime(nb::module_& m) {
  nb::class_<rt::DevicePolicy>(m, "DevicePolicy",
                               "Which devices may be used and how one is picked; with_* return a changed copy.")
      .def(nb::init<>())
      .def_static("all", &rt::DevicePolicy::all)
      .def_static(
          "only", [](const std::vector<std::string>& d) { return rt::DevicePolicy::only(devices(d, "only")); },
          "devices"_a)
      .def_static("from_env", &rt::DevicePolicy::from_env)
      .def_static(
          "from_env_key", [](const std::string& prefix) { return rt::DevicePolicy::from_env_key(prefix); }, "prefix"_a)
      .def(
          "with_deny",
          [](const rt::DevicePolicy& p, const std::vector<std::string>& d) {
            return p.with_deny(devices(d, "with_deny"));
          },
          "devices"_a)
      .def(
          "with_prefer",
          [](const rt::DevicePolicy& p, const std::vector<std::string>& d) {
            return p.with_prefer(devices(d, "with_prefer"));
          },
          "devices"_a)
      .def("with_benchmark_pick", &rt::DevicePolicy::with_benchmark_pick, "runs"_a)
      .def(
          "with_default_device",
          [](const rt::DevicePolicy& p, const std::optional<std::string>& d) {
            return p.with_default_device(device_opt(d));
          },
          "device"_a.none())
      .def(
          "with_chain",
          [](const rt::DevicePolicy& p, const std::vector<std::string>& d) {
            return p.with_chain(devices(d, "with_chain"));
          },
          "devices"_a)
      .def("allows", [](const rt::DevicePolicy& p, const std::string& d) { return p.allows(rt::parse_device(d)); })
      .def("blocked_reason",
           [](const rt::DevicePolicy& p, const std::string& d) { return p.blocked_reason(rt::parse_device(d)); })
      .def_prop_ro("allowed",
                   [](const rt::DevicePolicy& p) -> std::optional<std::vector<std::string>> {
                     if (!p.allowed()) return std::nullopt;
                     return labels(*p.allowed());
                   })
      .def_prop_ro("denied", [](const rt::DevicePolicy& p) { return labels(p.denied()); })
      .def_prop_ro("preferred", [](const rt::DevicePolicy& p) { return labels(p.preferred()); })
      .def_prop_ro("chain", [](const rt::DevicePolicy& p) { return labels(p.chain()); })
      .def_prop_ro("default_device",
                   [](const rt::DevicePolicy& p) -> std::optional<std::string> {
                     if (!p.default_device()) return std::nullopt;
                     return label(*p.default_device());
                   })
      .def_prop_ro("strategy",
                   [](const rt::DevicePolicy& p) {
                     return p.strategy().kind == rt::DevicePickStrategy::Kind::Benchmark
                                ? nb::make_tuple("benchmark", p.strategy().runs)
                                : nb::make_tuple("cost_model", 0);
                   })
      .def("describe", &rt::DevicePolicy::describe)
      .def("__eq__", [](const rt::DevicePolicy& a, const rt::DevicePolicy& b) { return a == b; })
      .def("__repr__", [](const rt::DevicePolicy& p) { return "DevicePolicy(" + p.describe() + ")"; });

  nb::class_<rt::DeviceCandidate>(m, "DeviceCandidate")
      .def_prop_ro("device", [](const rt::DeviceCandidate& c) { return c.label; })
      .def_ro("label", &rt::DeviceCandidate::label)
      .def_ro("available", &rt::DeviceCandidate::available)
      .def_ro("unavailable_reason", &rt::DeviceCandidate::unavailable_reason)
      .def_ro("policy_block", &rt::DeviceCandidate::policy_block)
      .def_ro("blockers", &rt::DeviceCandidate::blockers)
      .def_ro("capabilities", &rt::DeviceCandidate::capabilities)
      .def_prop_ro("estimate_seconds",
                   [](const rt::DeviceCandidate& c) -> std::optional<double> {
                     if (!c.estimate) return std::nullopt;
                     return c.estimate->seconds;
                   })
      .def_prop_ro("estimate_explain",
                   [](const rt::DeviceCandidate& c) { return c.estimate ? c.estimate->explain : std::string(); })
      .def_ro("calibration_source", &rt::DeviceCandidate::calibration_source)
      .def_ro("recommended", &rt::DeviceCandidate::recommended)
      .def_ro("why", &rt::DeviceCandidate::why)
      .def_prop_ro("viable", &rt::DeviceCandidate::viable)
      .def("__repr__", [](const rt::DeviceCandidate& c) {
        return "DeviceCandidate(" + c.label +
               (c.recommended ? ", recommended"
                : c.viable()  ? ", viable"
                              : "") +
               ": " + c.why + ")";
      });

  nb::class_<rt::DeviceReport>(m, "DeviceReport", "Every device, viable ones best first: report[0] is the pick.")
      .def_ro("graph", &rt::DeviceReport::graph)
      .def_ro("policy", &rt::DeviceReport::policy)
      .def_ro("candidates", &rt::DeviceReport::candidates)
      .def_prop_ro("recommended",
                   [](const rt::DeviceReport& r) -> std::optional<std::string> {
                     if (!r.recommended) return std::nullopt;
                     return label(*r.recommended);
                   })
      .def_ro("why", &rt::DeviceReport::why)
      .def("to_text", &rt::DeviceReport::to_text)
      .def("__len__", [](const rt::DeviceReport& r) { return r.candidates.size(); })
      .def("__getitem__",
           [](const rt::DeviceReport& r, std::int64_t i) {
             const auto n = std::int64_t(r.candidates.size());
             if (i < 0) i += n;
             if (i < 0 || i >= n) throw nb::index_error("device report index out of range");
             return r.candidates[std::size_t(i)];
           })
      .def("__repr__", &rt::DeviceReport::to_text);

  nb::class_<rt::DeviceBenchResult>(m, "DeviceBenchResult")
      .def_prop_ro("device", [](const rt::DeviceBenchResult& b) { return b.label; })
      .def_ro("label", &rt::DeviceBenchResult::label)
      .def_ro("runs", &rt::DeviceBenchResult::runs)
      .def_ro("median_ms", &rt::DeviceBenchResult::median_ms)
      .def_ro("min_ms", &rt::DeviceBenchResult::min_ms)
      .def_ro("ok", &rt::DeviceBenchResult::ok)
      .def_ro("error", &rt::DeviceBenchResult::error)
      .def("__repr__", [](const rt::DeviceBenchResult& b) {
        return "DeviceBenchResult(" + b.label + ", " +
               (b.ok ? "median " + std::to_string(b.median_ms) + " ms" : "failed: " + b.error) + ")";
      });

  m.def(
      "device_report", [](const ir::Graph& g, const rt::DevicePolicy& p) { return rt::device_report(g, p); }, "graph"_a,
      "policy"_a = rt::DevicePolicy::all());
  m.def(
      "fastest_device_for",
      [](const ir::Graph& g, const rt::DevicePolicy& p) { return label(rt::fastest_device_for(g, p)); }, "graph"_a,
      "policy"_a = rt::DevicePolicy::all());
  m.def(
      "resolve_device",
      [](const ir::Graph& g, const std::optional<std::string>& hint, const rt::DevicePolicy& p) {
        return label(rt::resolve_device(g, device_opt(hint), p));
      },
      "graph"_a, "device"_a.none() = nb::none(), "policy"_a = rt::DevicePolicy::all());
  m.def(
      "devices_for", [](const ir::Graph& g) { return labels(rt::devices_for(g)); }, "graph"_a);
  m.def("advisory_capabilities", [](const std::string& d) {
    auto names = rt::advisory_capabilities(rt::parse_device(d)).names();
    return std::vector<std::string>(names.begin(), names.end());
  });
  m.def("backends_manifest", [] { return rt::BackendsManifest::current().to_json(); });

  nb::class_<rt::GraphDevices>(m, "_GraphDevices")
      .def("__init__", [](rt::GraphDevices* self, const ir::Graph& g,
                          const rt::DevicePolicy& p) { new (self) rt::GraphDevices(g, p); })
      .def("set_param", set_param_from_array<rt::GraphDevices>())
      .def("set_param_typed",
           [](rt::GraphDevices& r, const std::string& name, nb::bytes data, const std::string& dtype) {
             r.set_param_typed(name, param_from_bytes(r.graph(), name, data, dtype));
           })
      .def("sync_params_to_all", &rt::GraphDevices::sync_params_to_all)
      .def("devices", [](const rt::GraphDevices& r) { return labels(r.devices()); })
      .def("report", &rt::GraphDevices::report)
      .def("fastest", [](const rt::GraphDevices& r) { return label(r.fastest()); })
      .def(
          "resolve",
          [](const rt::GraphDevices& r, const std::optional<std::string>& d) {
            return label(r.resolve(device_opt(d)));
          },
          "device"_a.none() = nb::none())
      .def("compile", [](rt::GraphDevices& r, const std::string& d) { r.compile(rt::parse_device(d)); })
      .def("run",
           [](rt::GraphDevices& r, const std::string& d, const NamedArrays& in) {
             std::vector<std::vector<std::int64_t>> shapes;
             auto v = views(in, shapes);
             const auto dev = rt::parse_device(d);
             return arrays(released([&] { return r.run(dev, v); }));
           })
      .def("run_resolved",
           [](rt::GraphDevices& r, const NamedArrays& in, const std::optional<std::string>& d) {
             std::vector<std::vector<std::int64_t>> shapes;
             auto v = views(in, shapes);
             const auto hint = device_opt(d);
             return arrays(released([&] { return r.run_resolved_with_inputs(hint, v); }));
           })
      .def("run_chain",
           [](rt::GraphDevices& r, const NamedArrays& in, const std::optional<std::vector<std::string>>& c) {
             std::vector<std::vector<std::int64_t>> shapes;
             auto v = views(in, shapes);
             std::optional<std::vector<rt::Device>> chain;
             if (c) chain = devices(*c, "run_chain");
             auto [d, outs] = released([&] { return r.run_chain(chain, v); });
             return nb::make_tuple(label(d), arrays(outs));
           })
      .def("run_try",
           [](rt::GraphDevices& r, const std::vector<std::string>& order, const NamedArrays& in) {
             std::vector<std::vector<std::int64_t>> shapes;
             auto v = views(in, shapes);
             auto ds = devices(order, "run_try");
             auto [d, outs] = released([&] { return r.run_try(ds, v); });
             return nb::make_tuple(label(d), arrays(outs));
           })
      .def("failures",
           [](const rt::GraphDevices& r) {
             std::vector<std::pair<std::string, std::string>> out;
             for (const auto& [d, why] : r.failures()) out.emplace_back(label(d), why);
             return out;
           })
      .def("warm_all", [](rt::GraphDevices& r) { return labels(released([&] { return r.warm_all(); })); })
      .def("benchmark",
           [](rt::GraphDevices& r, const NamedArrays& in, int runs) {
             std::vector<std::vector<std::int64_t>> shapes;
             auto v = views(in, shapes);
             return released([&] { return r.benchmark(v, runs); });
           })
      .def_prop_ro("benchmark_winner",
                   [](const rt::GraphDevices& r) -> std::optional<std::string> {
                     if (!r.benchmark_winner()) return std::nullopt;
                     return label(*r.benchmark_winner());
                   })
      .def("invalidate_cache", &rt::GraphDevices::invalidate_cache)
      .def("cached_devices", [](const rt::GraphDevices& r) { return labels(r.cached_devices()); });

  nb::class_<rt::DeviceRouter>(m, "_DeviceRouter")
      .def("__init__",
           [](rt::DeviceRouter* self, const ir::Graph& g, const rt::DevicePolicy& p) {
             nb::gil_scoped_release release;
             new (self) rt::DeviceRouter(g, p);
           })
      .def("set_param", set_param_from_array<rt::DeviceRouter>())
      .def("set_param_typed",
           [](rt::DeviceRouter& r, const std::string& name, nb::bytes data, const std::string& dtype) {
             r.set_param_typed(name, param_from_bytes(r.devices().graph(), name, data, dtype));
           })
      .def(
          "set_rebench_on_throttle",
          [](rt::DeviceRouter& r, bool on, double check_every_s) {
            r.set_rebench_on_throttle(on, std::chrono::milliseconds(std::int64_t(check_every_s * 1000)));
          },
          "on"_a, "check_every_s"_a = 1.0)
      // The callable returns (current MHz, maximum MHz); it is called with the GIL held.
      .def("set_snapshot_source",
           [](rt::DeviceRouter& r, nb::callable fn) {
             r.set_snapshot_source([fn = nb::object(fn)] {
               nb::gil_scoped_acquire gil;
               auto [cur, max] = nb::cast<std::pair<double, double>>(fn());
               return rt::HwSnapshot{cur, max, "python"};
             });
           })
      .def("run",
           [](rt::DeviceRouter& r, const NamedArrays& in, const std::optional<std::string>& d) {
             std::vector<std::vector<std::int64_t>> shapes;
             auto v = views(in, shapes);
             const auto hint = device_opt(d);
             auto [dev, outs] = released([&] { return r.run(v, hint); });
             return nb::make_tuple(label(dev), arrays(outs));
           })
      .def("run_chain",
           [](rt::DeviceRouter& r, const NamedArrays& in) {
             std::vector<std::vector<std::int64_t>> shapes;
             auto v = views(in, shapes);
             auto [dev, outs] = released([&] { return r.run_chain(v); });
             return nb::make_tuple(label(dev), arrays(outs));
           })
      .def("run_on",
           [](rt::DeviceRouter& r, const std::string& d, const NamedArrays& in) {
             std::vector<std::vector<std::int64_t>> shapes;
             auto v = views(in, shapes);
             const auto dev = rt::parse_device(d);
             return arrays(released([&] { return r.run_on(dev, v); }));
           })
      .def_prop_ro("current",
                   [](const rt::DeviceRouter& r) -> std::optional<std::string> {
                     if (!r.current()) return std::nullopt;
                     return label(*r.current());
                   })
      .def_prop_ro("rebenchmarks", &rt::DeviceRouter::rebenchmarks)
      .def_prop_ro("warmed", [](const rt::DeviceRouter& r) { return labels(r.warmed()); });
}
