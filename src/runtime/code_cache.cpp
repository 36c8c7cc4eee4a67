#include "rlx/runtime/code_cache.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <vector>

namespace rlx::runtime {

namespace {

std::uint64_t fnv(std::string_view s, std::uint64_t h) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  return h ^ (h >> 33);
}

// Every 256th write looks whether the folder outgrew kMaxCodeFiles (random test graphs alone make thousands
// of unique kernels).
void prune(const std::filesystem::path& dir, const std::filesystem::path& extension) {
  static std::atomic<std::uint64_t> writes{0};
  if (++writes % 256) return;
  std::error_code ec;
  std::vector<std::pair<std::filesystem::file_time_type, std::filesystem::path>> files;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.path().extension() == extension) files.emplace_back(e.last_write_time(ec), e.path());
  if (files.size() <= kMaxCodeFiles) return;
  std::sort(files.begin(), files.end());
  for (std::size_t i = 0; i < files.size() - kMaxCodeFiles * 3 / 4; ++i) std::filesystem::remove(files[i].second, ec);
}

}  // namespace

std::string code_key(std::string_view text) {
  return fmt::format("{:016x}{:016x}", fnv(text, 1469598103934665603ull), fnv(text, 0x9E3779B97F4A7C15ull));
}

std::string read_code_file(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) return {};
  const auto n = std::streamsize(f.tellg());
  if (n <= 0) return {};
  std::string s(std::size_t(n), '\0');
  f.seekg(0);
  f.read(s.data(), n);
  return f ? s : std::string();
}

void write_code_file(const std::filesystem::path& path, std::string_view bytes) {
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  if (ec) return;
  auto tmp = path;
  tmp += fmt::format(".tmp{}", ::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return;
    f.write(bytes.data(), std::streamsize(bytes.size()));
    if (!f) return;
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return;
  }
  prune(path.parent_path(), path.extension());
}

}  // namespace rlx::runtime
