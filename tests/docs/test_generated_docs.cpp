// Generated docs come from the code; this test fails when a checked-in page
// drifts. Regenerate with: build/rlx ops --markdown > docs/op-coverage.md
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "rlx/env.hpp"
#include "rlx/error.hpp"
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

TEST(GeneratedDocs, EnvVarsAreCurrent) {
  auto want = rlx::env::catalog_markdown();
  auto have = read(std::string(RLX_SOURCE_DIR) + "/docs/env-vars.md");
  EXPECT_EQ(have, want) << "docs/env-vars.md is stale: run `build/rlx env --markdown > docs/env-vars.md`";
}

TEST(Env, MalformedValuesNameTheVariable) {
  ::setenv("RLX_TEST_SEED", "12x", 1);
  try {
    rlx::env::get_int("RLX_TEST_SEED");
    ADD_FAILURE() << "no error";
  } catch (const rlx::Error& e) {
    EXPECT_NE(std::string(e.what()).find("RLX_TEST_SEED"), std::string::npos) << e.what();
  }
  ::unsetenv("RLX_TEST_SEED");
  ::setenv("RLX_DUMP", " mir , cse,", 1);
  EXPECT_EQ(rlx::env::get_list("RLX_DUMP"), (std::vector<std::string>{"mir", "cse"}));
  ::unsetenv("RLX_DUMP");
}

// The catalog is complete only if nothing reads the environment behind its back.
TEST(Env, OnlyTheCatalogReadsTheEnvironment) {
  namespace fs = std::filesystem;
  for (const char* dir : {"src", "tools", "include", "python/src"}) {
    for (const auto& e : fs::recursive_directory_iterator(fs::path(RLX_SOURCE_DIR) / dir)) {
      if (!e.is_regular_file() || e.path().filename() == "env.cpp") continue;
      EXPECT_EQ(read(e.path().string()).find("getenv("), std::string::npos)
          << e.path() << " reads the environment directly; declare the variable in src/ir/env.cpp";
    }
  }
}
