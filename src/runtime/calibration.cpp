// Calibration caches (measure once, keep as JSON, never trust a bad file) and
// the roofline cost model that turns a graph's FLOPs and bytes into seconds.
#include "rlx/runtime/calibration.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "rlx/compile/pipeline.hpp"
#include "rlx/env.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/op_def.hpp"
#include "rlx/runtime/session.hpp"

namespace rlx::runtime {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

fs::path cache_dir() {
  if (auto d = env::get("RLX_CACHE_DIR")) return fs::path(*d);
  if (auto d = env::get("XDG_CACHE_HOME")) return fs::path(*d) / "rlx";
  if (auto d = env::get("HOME")) return fs::path(*d) / ".cache" / "rlx";
  return fs::temp_directory_path() / "rlx-cache";
}

fs::path calibration_path(std::string_view backend, std::string_view device, const fs::path& dir) {
  std::string id;
  for (char c : device) id += std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' ? c : '_';
  return dir / fmt::format("{}-calib-{}.json", backend, id.empty() ? "default" : id);
}

namespace {

std::int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The host CPU's model name names the CPU calibration file: a cache copied to
// another machine is not taken for this one.
std::string host_cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.starts_with("model name")) {
      auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  return "host";
}

}  // namespace

std::string device_id(Device device, const Backend& backend) {
  return device == Device::Cpu ? host_cpu_model() : backend.device_name();
}

std::optional<Calibration> load_calibration(const fs::path& path, std::string* why_not) {
  auto fail = [&](std::string why) -> std::optional<Calibration> {
    if (why_not) *why_not = std::move(why);
    return std::nullopt;
  };
  std::ifstream f(path);
  if (!f) return fail(fmt::format("no cache file {}", path.string()));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    return fail(fmt::format("corrupt cache file {}: {}", path.string(), e.what()));
  }
  if (!j.is_object()) return fail(fmt::format("corrupt cache file {}: not a JSON object", path.string()));
  Calibration c;
  try {
    if (!j.contains("version")) return fail(fmt::format("stale cache file {}: no version field", path.string()));
    c.version = j.at("version").get<int>();
    if (c.version != kCalibrationVersion)
      return fail(
          fmt::format("stale cache file {}: version {}, expected {}", path.string(), c.version, kCalibrationVersion));
    c.backend = j.value("backend", "");
    c.device = j.value("device", "");
    c.measured_at = j.at("measured_at").get<std::int64_t>();
    c.sgemm_gflops = j.at("sgemm_gflops").get<double>();
    c.roundtrip_overhead_ns = j.at("roundtrip_overhead_ns").get<double>();
    c.memory_bw_gbps = j.at("memory_bw_gbps").get<double>();
  } catch (const std::exception& e) {
    return fail(fmt::format("corrupt cache file {}: {}", path.string(), e.what()));
  }
  for (double v : {c.sgemm_gflops, c.roundtrip_overhead_ns, c.memory_bw_gbps})
    if (!std::isfinite(v) || v <= 0)
      return fail(fmt::format("corrupt cache file {}: a figure is {} (must be positive)", path.string(), v));
  const auto age = unix_now() - c.measured_at;
  if (age > std::int64_t(kCalibrationMaxAgeDays) * 86400 || age < -86400)
    return fail(fmt::format("stale cache file {}: measured {} days ago (limit {})", path.string(), age / 86400,
                            kCalibrationMaxAgeDays));
  c.source = "cache " + path.string();
  return c;
}

void save_calibration(const Calibration& c, const fs::path& path) {
  nlohmann::json j{{"version", c.version},
                   {"backend", c.backend},
                   {"device", c.device},
                   {"measured_at", c.measured_at},
                   {"sgemm_gflops", c.sgemm_gflops},
                   {"roundtrip_overhead_ns", c.roundtrip_overhead_ns},
                   {"memory_bw_gbps", c.memory_bw_gbps}};
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  // Written whole and renamed, so that a reader in another process never sees half a file.
  auto tmp = path;
  tmp += fmt::format(".tmp{}", unix_now() ^ reinterpret_cast<std::uintptr_t>(&c));
  {
    std::ofstream f(tmp);
    f << j.dump(2) << '\n';
    if (!f) throw Error(fmt::format("cannot write calibration cache {}", tmp.string()));
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw Error(fmt::format("cannot write calibration cache {}: {}", path.string(), ec.message()));
  }
}

double measure_roundtrip_ns(Backend& backend, int runs) {
  ir::Graph g("calib_roundtrip");
  g.add_output(g.add(g.input("x", ir::Shape{1}), g.scalar(1)));
  auto trip = backend.compile(g);
  float x = 0, y = 0;
  const void* in = &x;
  void* out = &y;
  std::vector<double> ns;
  for (int r = 0; r <= std::max(runs, 1); ++r) {
    const auto t0 = Clock::now();
    trip.exe->run({&in, 1}, {&out, 1});
    if (r > 0) ns.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count());
  }
  std::nth_element(ns.begin(), ns.begin() + std::ptrdiff_t(ns.size() / 2), ns.end());
  return ns[ns.size() / 2];
}

double measure_sgemm_gflops(Backend& backend, std::int64_t n, int runs) {
  ir::Graph mm("calib_sgemm");
  mm.add_output(mm.matmul(mm.param("a", ir::Shape{n, n}), mm.param("b", ir::Shape{n, n})));
  auto gemm = backend.compile(mm);
  gemm.exe->set_profiling(true);
  const bool sparse = gemm.exe->capabilities().read_outputs;
  std::vector<float> product(sparse ? 0 : std::size_t(n * n));
  std::vector<void*> out{sparse ? nullptr : product.data()};
  double best = INFINITY;
  for (int r = 0; r <= std::max(runs, 1); ++r) {
    if (sparse)
      gemm.exe->run_read_outputs({}, out);
    else
      gemm.exe->run({}, out);
    double s = 0;
    for (const auto& k : gemm.exe->kernel_times()) s += k.micros * 1e-6;
    if (r > 0) best = std::min(best, s);
  }
  return 2.0 * double(n) * double(n) * double(n) / std::max(best, 1e-12) * 1e-9;
}

Calibration measure_calibration(Backend& backend) {
  // Compiles `g` with inputs filled with 0.5 and returns the best of `runs`
  // timed runs (after one warm-up), in seconds.
  auto time_graph = [&](const ir::Graph& g, int runs) {
    auto [result, exe] = backend.compile(g);
    CompiledGraph c(std::move(result), std::move(exe));
    std::vector<ir::Tensor> ins, outs;
    std::vector<NamedTensor> named;
    for (const auto& s : c.input_specs()) {
      auto& t = ins.emplace_back(s.dtype, s.shape);
      for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, 0.5);
    }
    for (std::size_t i = 0; i < ins.size(); ++i) named.push_back({c.input_specs()[i].name, ir::view(ins[i])});
    for (const auto& s : c.output_specs()) outs.emplace_back(s.dtype, s.shape);
    c.run_into(named, outs);
    std::vector<double> t(static_cast<std::size_t>(runs));
    for (auto& s : t) {
      auto t0 = Clock::now();
      c.run_into(named, outs);
      s = std::chrono::duration<double>(Clock::now() - t0).count();
    }
    return std::max(*std::min_element(t.begin(), t.end()), 1e-9);
  };
  Calibration c;
  c.backend = std::string(backend.name());
  c.device = backend.device_name();
  c.measured_at = unix_now();
  {
    constexpr std::int64_t n = 256;
    ir::Graph g("calib_sgemm");
    g.add_output(g.matmul(g.input("a", {n, n}), g.input("b", {n, n})));
    c.sgemm_gflops = 2.0 * n * n * n / time_graph(g, 8) / 1e9;
  }
  c.roundtrip_overhead_ns = measure_roundtrip_ns(backend, 64);
  {
    constexpr std::int64_t n = 1 << 21;
    ir::Graph g("calib_bandwidth");
    auto x = g.input("x", {n});
    g.add_output(g.add(x, x));
    c.memory_bw_gbps = 2.0 * n * sizeof(float) / time_graph(g, 6) / 1e9;
  }
  return c;
}

Calibration Backend::calibrate() { return measure_calibration(*this); }

Calibration calibration_for(Device device, const fs::path& dir) {
  auto backend = make_backend(device);
  const auto path = calibration_path(device_label(device), device_id(device, *backend), dir);
  // Remembered per path and file time, so a file replaced meanwhile is read again.
  static std::mutex mu;
  static std::map<std::string, std::pair<fs::file_time_type, Calibration>> memo;
  std::lock_guard lock(mu);
  std::error_code ec;
  auto mtime = fs::last_write_time(path, ec);
  if (!ec)
    if (auto it = memo.find(path.string()); it != memo.end() && it->second.first == mtime) return it->second.second;
  std::string why;
  auto c = load_calibration(path, &why);
  if (!c) {
    c = backend->calibrate();
    c->backend = std::string(device_label(device));
    c->device = device_id(device, *backend);
    c->source = "measured now (" + why + ")";
    try {
      save_calibration(*c, path);
    } catch (const Error& e) {
      c->source += "; not saved: " + std::string(e.what());
    }
  }
  mtime = fs::last_write_time(path, ec);
  if (!ec) memo[path.string()] = {mtime, *c};
  return *c;
}

std::filesystem::path calibration_path_for(Device device, const std::filesystem::path& dir) {
  auto backend = make_backend(device);
  return calibration_path(device_label(device), device_id(device, *backend), dir);
}

GraphCost graph_cost(const ir::Graph& graph, const std::vector<std::pair<std::string, std::int64_t>>& bind) {
  const ir::Graph g = compile::passes::decompose(bind.empty() ? graph : ir::bind_symbols(graph, bind), {});
  auto bytes = [](const ir::Node& n) { return ir::estimated_numel(n.shape) * ir::element_bytes(n.dtype); };
  GraphCost c;
  std::vector<ir::TypeInfo> in;
  for (const auto& n : g.nodes()) {
    const auto cls = ir::op_info(n.op).cls;
    if (cls == ir::OpClass::Leaf || n.op == ir::OpKind::Reshape)
      continue;  // leaves are read by their users; reshape is a view
    ++c.ops;
    in.clear();
    for (auto i : n.inputs) {
      in.push_back({g.node(i).dtype, g.node(i).shape});
      c.bytes += bytes(g.node(i));
    }
    c.bytes += bytes(n);
    const double flops = ir::op_flops(n.op, in, {n.dtype, n.shape});
    c.flops += flops;
    if (cls == ir::OpClass::MatMul) c.matmul_flops += flops;
  }
  return c;
}

namespace {
std::string si(double v, std::string_view unit) {
  const char* prefixes[] = {"", "k", "M", "G", "T"};
  int i = 0;
  while (std::fabs(v) >= 1000 && i < 4) v /= 1000, ++i;
  return fmt::format("{:.3g} {}{}", v, prefixes[i], unit);
}
}  // namespace

std::string seconds_str(double s) {
  if (s < 1e-6) return fmt::format("{:.3g} ns", s * 1e9);
  if (s < 1e-3) return fmt::format("{:.3g} us", s * 1e6);
  if (s < 1) return fmt::format("{:.3g} ms", s * 1e3);
  return fmt::format("{:.3g} s", s);
}

CostEstimate estimate_cost(const GraphCost& cost, const Calibration& calib) {
  CostEstimate e;
  const double gemm = calib.sgemm_gflops * 1e9, other = gemm / 4;
  e.compute_s = cost.matmul_flops / gemm + (cost.flops - cost.matmul_flops) / other;
  e.memory_s = cost.bytes / (calib.memory_bw_gbps * 1e9);
  e.overhead_s = calib.roundtrip_overhead_ns * 1e-9;
  e.seconds = e.overhead_s + std::max(e.compute_s, e.memory_s);
  e.explain =
      fmt::format("{} at {} = {}; {} at {} = {}; overhead {} -> {} ({})", si(cost.flops, "FLOP"), si(gemm, "FLOP/s"),
                  seconds_str(e.compute_s), si(cost.bytes, "B"), si(calib.memory_bw_gbps * 1e9, "B/s"),
                  seconds_str(e.memory_s), seconds_str(e.overhead_s), seconds_str(e.seconds),
                  e.overhead_s >= std::max(e.compute_s, e.memory_s) ? "overhead bound"
                  : e.compute_s >= e.memory_s                       ? "compute bound"
                                                                    : "memory bound");
  return e;
}

}  // namespace rlx::runtime
