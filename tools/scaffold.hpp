#pragma once
// `rlx new-op Name` and `rlx new-model Name`: ready-to-fill C++ templates that
// compile and run as written, against <rlx/extend.hpp> and librlx.
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace rlx::tools {

struct ScaffoldFile {
  std::string filename;  // "<snake_name>.cpp"
  std::string text;
};

// An OpExtension subclass (infer + lower), its register function and a main()
// that runs a graph using it on the CPU against the reference interpreter.
// `name` is a C++ identifier (GatedGate or gated_gate); the class is CamelCase
// and the op name snake_case. Throws rlx::Error for an unusable name.
ScaffoldFile scaffold_op(std::string_view name);
// A LayerStage block, a ModelFlow stacking two of them and a main() that runs
// the model on the CPU against the reference interpreter.
ScaffoldFile scaffold_model(std::string_view name);
// `rlx new-op --builtin NAME [--kind unary|composite]`: a new op of the closed
// set, in the source tree at `root`. Adds its row to RLX_OPS
// (include/rlx/ir/op.hpp) and a table entry to its family file (src/ops/unary.cpp,
// a formula; src/ops/nn.cpp, infer + decomposition + reference) to be filled
// in, and returns the files it changed. Throws rlx::Error for an unusable name,
// an op that exists, or a tree without the markers.
std::vector<std::filesystem::path> scaffold_builtin_op(std::string_view name, std::string_view kind,
                                                       const std::filesystem::path& root);
// Writes `file` into `dir` (created if missing) and returns its path; throws
// rlx::Error rather than overwrite an existing file.
std::filesystem::path write_scaffold(const ScaffoldFile& file, const std::filesystem::path& dir);

}  // namespace rlx::tools
