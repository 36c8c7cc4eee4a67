// Generated docs come from the code; this test fails when a checked-in page
// drifts. Regenerate with: build/rlx ops --markdown > docs/op-coverage.md
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "rlx/runtime/backend.hpp"

namespace {
std::string read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
}  // namespace

TEST(GeneratedDocs, OpCoverageIsCurrent) {
  auto want = rlx::runtime::op_coverage_markdown();
  auto have = read(std::string(RLX_SOURCE_DIR) + "/docs/op-coverage.md");
  EXPECT_EQ(have, want) << "docs/op-coverage.md is stale: run `build/rlx ops --markdown > docs/op-coverage.md`";
  for (auto op : rlx::ir::kAllOps)
    EXPECT_NE(want.find("`" + std::string(rlx::ir::op_name(op)) + "`"), std::string::npos) << rlx::ir::op_name(op);
}
