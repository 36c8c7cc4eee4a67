#ifdef RLX_HAVE_VULKAN
#include "backends/vulkan/spirv.hpp"

#include <fmt/format.h>
#include <shaderc/shaderc.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <unordered_map>

#include "rlx/backends/vulkan/vulkan_backend.hpp"
#include "rlx/error.hpp"
#include "rlx/runtime/calibration.hpp"

namespace rlx::backends::vulkan {

namespace {

std::atomic<std::uint64_t> n_compiled{0}, n_disk{0}, n_memory{0};

struct MemoryCache {
  std::mutex mu;
  std::unordered_map<std::string, std::vector<std::uint32_t>> map;
};
MemoryCache& memory_cache() {
  static auto* c = new MemoryCache;
  return *c;
}

shaderc_compiler_t compiler() {
  static shaderc_compiler_t c = shaderc_compiler_initialize();  // compiles are thread-safe; never released
  return c;
}

std::uint64_t fnv(std::string_view s, std::uint64_t h) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  return h ^ (h >> 33);
}

bool valid_spirv(const std::vector<std::uint32_t>& w) { return w.size() >= 5 && w[0] == 0x07230203u; }

std::vector<std::uint32_t> read_spv(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary | std::ios::ate);
  if (!f) return {};
  auto n = std::size_t(f.tellg());
  if (n == 0 || n % 4) return {};
  std::vector<std::uint32_t> words(n / 4);
  f.seekg(0);
  f.read(reinterpret_cast<char*>(words.data()), std::streamsize(n));
  if (!f || !valid_spirv(words)) return {};
  return words;
}

// The cache is bounded: every 256th write, when it holds more than kMaxFiles
// shaders, the least recently written quarter goes (random test graphs alone
// make thousands of unique shaders).
constexpr std::size_t kMaxFiles = 8192;

void prune(const std::filesystem::path& dir) {
  static std::atomic<std::uint64_t> writes{0};
  if (++writes % 256) return;
  std::error_code ec;
  std::vector<std::pair<std::filesystem::file_time_type, std::filesystem::path>> files;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.path().extension() == ".spv") files.emplace_back(e.last_write_time(ec), e.path());
  if (files.size() <= kMaxFiles) return;
  std::sort(files.begin(), files.end());
  for (std::size_t i = 0; i < files.size() - kMaxFiles * 3 / 4; ++i) std::filesystem::remove(files[i].second, ec);
}

// Best effort: a cache that cannot be written (read-only home) only costs compile time.
void write_spv(const std::filesystem::path& p, const std::vector<std::uint32_t>& words) {
  std::error_code ec;
  std::filesystem::create_directories(p.parent_path(), ec);
  if (ec) return;
  auto tmp = p;
  tmp += fmt::format(".tmp{}", ::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return;
    f.write(reinterpret_cast<const char*>(words.data()), std::streamsize(words.size() * 4));
    if (!f) return;
  }
  std::filesystem::rename(tmp, p, ec);  // atomic: a concurrent reader sees the old file or the new one
  if (ec) std::filesystem::remove(tmp, ec);
  prune(p.parent_path());
}

std::string key_prefix() {
  unsigned version = 0, revision = 0;
  shaderc_get_spv_version(&version, &revision);
  return fmt::format("rlx-spirv-1|spv {}.{}|vulkan1.2|", version, revision);
}

}  // namespace

std::string hash_hex(std::string_view s) {
  return fmt::format("{:016x}{:016x}", fnv(s, 1469598103934665603ull), fnv(s, 0x9E3779B97F4A7C15ull));
}

std::string cache_root() { return runtime::cache_dir().string(); }

std::string spirv_cache_dir() {
  auto root = cache_root();
  return root.empty() ? root : root + "/vulkan-spirv";
}

void forget_compiled_shaders() {
  auto& mc = memory_cache();
  std::lock_guard lock(mc.mu);
  mc.map.clear();
}

SpirvCacheStats spirv_cache_stats() { return {n_compiled.load(), n_disk.load(), n_memory.load()}; }

std::vector<std::uint32_t> compile_glsl(const std::string& source, std::string_view kernel, bool optimize) {
  static const std::string prefix = key_prefix();
  const std::string key = hash_hex(prefix + (optimize ? "O|" : "O0|") + source);
  auto& mc = memory_cache();
  {
    std::lock_guard lock(mc.mu);
    if (auto it = mc.map.find(key); it != mc.map.end()) {
      ++n_memory;
      return it->second;
    }
  }
  std::filesystem::path file;
  if (auto dir = spirv_cache_dir(); !dir.empty()) file = std::filesystem::path(dir) / (key + ".spv");
  std::vector<std::uint32_t> words;
  if (!file.empty()) words = read_spv(file);
  if (!words.empty()) {
    ++n_disk;
  } else {
    shaderc_compile_options_t opts = shaderc_compile_options_initialize();
    shaderc_compile_options_set_target_env(opts, shaderc_target_env_vulkan, shaderc_env_version_vulkan_1_2);
    shaderc_compile_options_set_optimization_level(
        opts, optimize ? shaderc_optimization_level_performance : shaderc_optimization_level_zero);
    shaderc_compilation_result_t res = shaderc_compile_into_spv(
        compiler(), source.data(), source.size(), shaderc_compute_shader, "rlx_kernel.comp", "main", opts);
    shaderc_compile_options_release(opts);
    bool ok = shaderc_result_get_compilation_status(res) == shaderc_compilation_status_success;
    if (!ok) {
      std::string msg = shaderc_result_get_error_message(res);
      shaderc_result_release(res);
      throw Error(fmt::format("vulkan: the shader for kernel '{}' failed to compile:\n{}", kernel, msg));
    }
    const auto* bytes = reinterpret_cast<const std::uint32_t*>(shaderc_result_get_bytes(res));
    words.assign(bytes, bytes + shaderc_result_get_length(res) / 4);
    shaderc_result_release(res);
    ++n_compiled;
    if (!file.empty()) write_spv(file, words);
  }
  std::lock_guard lock(mc.mu);
  mc.map.emplace(key, words);
  return words;
}

}  // namespace rlx::backends::vulkan
#endif
