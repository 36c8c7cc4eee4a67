#pragma once
// Calibration caches and the cost model behind device picks.
//
// One JSON file per backend and device, <cache dir>/<backend>-calib-<device>.json:
//   {"version": 1, "backend": "cpu", "device": "...", "measured_at": <unix s>,
//    "sgemm_gflops": ..., "roundtrip_overhead_ns": ..., "memory_bw_gbps": ...}
// A file that is missing, unreadable, corrupt, of another version, older than
// kCalibrationMaxAgeDays or with a non-positive figure is measured again and
// rewritten, never trusted.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "rlx/ir/graph.hpp"
#include "rlx/runtime/backend.hpp"

namespace rlx::runtime {

inline constexpr int kCalibrationVersion = 1;
inline constexpr int kCalibrationMaxAgeDays = 30;

struct Calibration {
  std::string backend, device;
  double sgemm_gflops = 0;           // f32 GEMM throughput, through a compiled RLX matmul
  double roundtrip_overhead_ns = 0;  // one run of a tiny graph, inputs in, outputs back
  double memory_bw_gbps = 0;         // bytes read + written per second by a large elementwise graph
  std::int64_t measured_at = 0;      // unix seconds
  int version = kCalibrationVersion;
  // Where the figures came from, for reports: "cache <path>" or "measured (<why the cache was not used>)".
  std::string source;
};

// RLX_CACHE_DIR, else $XDG_CACHE_HOME/rlx, else $HOME/.cache/rlx (all through the env catalog).
std::filesystem::path cache_dir();
// <dir>/<backend>-calib-<device>.json, the device name reduced to [A-Za-z0-9._-].
std::filesystem::path calibration_path(std::string_view backend, std::string_view device,
                                       const std::filesystem::path& dir = cache_dir());

// The file's figures, or nullopt with `why_not` saying what was wrong with it.
std::optional<Calibration> load_calibration(const std::filesystem::path& path, std::string* why_not = nullptr);
// Writes atomically (temp file + rename); throws rlx::Error when it cannot.
void save_calibration(const Calibration& c, const std::filesystem::path& path);
// Times three small graphs compiled on `backend` (well under a second on a CPU):
// a 256x256x256 f32 matmul, a one-element add, and a 2M-element add. Backend::calibrate's default.
Calibration measure_calibration(Backend& backend);

// The pieces every backend's measurement shares (measure_calibration and the GPU backends' calibrate()):
// - the round trip: the median wall time, in ns, of `runs` runs (after one warm-up) of a one-element graph
//   (x + 1) through ExecutableGraph::run: inputs in, one kernel, outputs back, as every run pays it;
// - the f32 GEMM rate, in GFLOP/s, of an n x n x n matmul of two params (zeros: the speed does not depend on the
//   values) timed by the executable's kernel_times (device timers where the backend has them): the best of `runs`
//   runs after a warm-up (which loads modules). Outputs stay on the device where the executable offers
//   read_outputs. Needs the kernel_times capability.
double measure_roundtrip_ns(Backend& backend, int runs);
double measure_sgemm_gflops(Backend& backend, std::int64_t n, int runs);

// The cached figures for `device` when the file under `dir` is valid; otherwise
// measured now (Backend::calibrate) and saved. Throws rlx::Error when the device is unavailable.
// Remembered per file for the process (a changed file is read again).
Calibration calibration_for(Device device, const std::filesystem::path& dir = cache_dir());
// Which device of its kind `backend` drives: Backend::device_name(), or the
// host CPU's model name for the CPU. Names calibration files and manifest rows.
std::string device_id(Device device, const Backend& backend);
// The file calibration_for reads for `device` (the CPU's is named by its model).
std::filesystem::path calibration_path_for(Device device, const std::filesystem::path& dir = cache_dir());

// What a graph costs to run, from a walk of its primitives (composites are
// decomposed first; symbolic dims count as 1 unless bound in `bind`).
struct GraphCost {
  double flops = 0;         // multiply-adds count 2
  double matmul_flops = 0;  // the part in matmuls (runs at sgemm speed)
  double bytes = 0;         // each primitive's operands read and result written
  std::size_t ops = 0;      // primitives
};
GraphCost graph_cost(const ir::Graph& graph, const std::vector<std::pair<std::string, std::int64_t>>& bind = {});

// A roofline estimate: overhead + max(compute, memory). Elementwise and
// reduce FLOPs are charged at a quarter of GEMM speed.
struct CostEstimate {
  double seconds = 0, compute_s = 0, memory_s = 0, overhead_s = 0;
  std::string explain;  // "1.1 GFLOP at 92 GFLOP/s = 12 ms; 8.4 MB at 11 GB/s = 0.76 ms; overhead 4 us -> 12 ms
                        // (compute bound)"
};
CostEstimate estimate_cost(const GraphCost& cost, const Calibration& calib);
std::string seconds_str(double seconds);  // "12.3 us"

}  // namespace rlx::runtime
