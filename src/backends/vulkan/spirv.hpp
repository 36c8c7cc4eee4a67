#pragma once
// GLSL compute source -> SPIR-V with shaderc, through a cache keyed by a hash
// of the source, the optimization level and the compiler's version: in memory for this process, and on
// disk under <cache>/vulkan-spirv/<hash>.spv across processes.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace rlx::backends::vulkan {

// Throws rlx::Error naming `kernel` and quoting shaderc's message when the source does not compile.
// `optimize` runs SPIR-V's performance passes (loop unrolling, scalar replacement of the generated
// register arrays): 17% on an H200's GEMM, at about 30% more compile time, which is why a CPU device,
// whose LLVM back end optimizes anyway, does without them.
std::vector<std::uint32_t> compile_glsl(const std::string& source, std::string_view kernel, bool optimize);

// runtime::cache_dir(): RLX_CACHE_DIR, else $XDG_CACHE_HOME/rlx, else $HOME/.cache/rlx.
std::string cache_root();

// The in-process cache is dropped (the disk cache stays): for tests of the disk cache.
void forget_compiled_shaders();

}  // namespace rlx::backends::vulkan
