#pragma once
// The on-disk caches of compiled GPU code (Vulkan's SPIR-V, CUDA's cubins):
// files named by a hash of everything that made them, under
// runtime::cache_dir(). Writes are best effort (a cache that cannot be written
// only costs compile time), atomic (a concurrent reader sees the old file or
// the new one), and bounded: when a folder holds more than kMaxCodeFiles files
// of one extension, the least recently written quarter goes.
#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

namespace rlx::runtime {

inline constexpr std::size_t kMaxCodeFiles = 8192;

// 32 hex digits: two 64-bit FNV-1a hashes of `text`, finalized.
std::string code_key(std::string_view text);
// The file's bytes; empty when it is missing or unreadable.
std::string read_code_file(const std::filesystem::path& path);
void write_code_file(const std::filesystem::path& path, std::string_view bytes);

}  // namespace rlx::runtime
