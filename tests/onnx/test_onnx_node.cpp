// ONNX's backend node tests, run through the importer and the CPU backend, each checked against the
// outputs ONNX ships with ONNX's tolerance (rtol 1e-3, atol 1e-7). The tests come from the onnx Python
// package (tests/onnx/gen_node_tests.py writes them under the build folder on first use). Each test runs
// in a child process, so a crash is counted as one rather than ending the run. The per-op table goes to
// docs/onnx-coverage.md, which this test keeps current.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "rlx/error.hpp"
#include "rlx/onnx/onnx.hpp"
#include "rlx/runtime/session.hpp"
#include "support/testing.hpp"

namespace fs = std::filesystem;

namespace {

using rlx::testing::read_bytes;

std::string read_text(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::pair<std::string, rlx::ir::Tensor> read_tensor(const fs::path& p) {
  return rlx::onnx::read_tensor_proto(read_bytes(p));
}

// "pass", or the reason it did not: "unsupported: ...", "error: ...", "wrong: ...".
std::string run_one(const fs::path& dir, const std::vector<std::string>& input_names) {
  try {
    rlx::onnx::Model m;
    try {
      m = rlx::onnx::import(dir / "model.onnx");
    } catch (const rlx::Error& e) {
      // Shape data (axes, pads, a target shape, Resize's scales) fed as graph inputs must be known at
      // import: the test is imported again with its integer inputs, its one-element inputs and its small
      // (<= 64 elements) inputs after the first fixed to the first data set's values.
      if (std::string(e.what()).find("known at import") == std::string::npos) throw;
      rlx::onnx::ImportOptions o;
      const auto first = dir / "test_data_set_0";
      for (std::size_t i = 0; fs::exists(first / fmt::format("input_{}.pb", i)); ++i) {
        auto t = read_tensor(first / fmt::format("input_{}.pb", i));
        if (rlx::ir::is_integer(t.second.dtype()) || t.second.dtype() == rlx::ir::DType::Bool ||
            t.second.numel() <= 1 || (i > 0 && t.second.numel() <= 64))
          o.constant_inputs.emplace(input_names.at(i), std::move(t.second));
      }
      m = rlx::onnx::import(dir / "model.onnx", std::move(o));
    }
    auto cg = rlx::runtime::Session(rlx::runtime::Device::Cpu).compile(m.graph);
    for (const auto& [name, value] : m.params) cg.set_param(name, value);
    for (const auto& ds : fs::directory_iterator(dir)) {
      if (!ds.is_directory()) continue;
      std::map<std::string, rlx::ir::Tensor, std::less<>> inputs;
      for (std::size_t i = 0; i < input_names.size(); ++i) {
        auto p = ds.path() / fmt::format("input_{}.pb", i);
        if (!fs::exists(p)) return "unsupported: an input is not a tensor";
        bool is_input = false;  // still an input: not fixed at import
        for (auto id : m.graph.input_ids())
          is_input = is_input || m.graph.node(id).attrs.get_str("name") == input_names[i];
        if (is_input) inputs.emplace(input_names[i], read_tensor(p).second);
      }
      auto outs = cg.run(inputs);
      for (std::size_t i = 0; i < outs.size(); ++i) {
        auto p = ds.path() / fmt::format("output_{}.pb", i);
        if (!fs::exists(p)) return "unsupported: an output is not a tensor";
        auto want = rlx::onnx::read_tensor_proto(read_bytes(p)).second;
        const auto& have = outs[i];
        if (have.dtype() != want.dtype())
          return fmt::format("wrong: output {} is {}, expected {}", i, rlx::ir::dtype_name(have.dtype()),
                             rlx::ir::dtype_name(want.dtype()));
        if (have.shape() != want.shape())
          return fmt::format("wrong: output {} has shape {}, expected {}", i, fmt::join(have.shape(), ","),
                             fmt::join(want.shape(), ","));
        for (std::int64_t j = 0; j < want.numel(); ++j) {
          const double a = have.get(j), b = want.get(j);
          if (std::isnan(a) && std::isnan(b)) continue;
          if (a == b) continue;
          if (!(std::abs(a - b) <= 1e-7 + 1e-3 * std::abs(b)))
            return fmt::format("wrong: output {} element {} is {}, expected {}", i, j, a, b);
        }
      }
    }
    return "pass";
  } catch (const rlx::Error& e) {
    const std::string what = e.what();
    if (what.find("unsupported op") != std::string::npos) return "unsupported: " + what;
    return "error: " + what;
  } catch (const std::exception& e) {
    return std::string("crash: a non-rlx exception: ") + e.what();
  }
}

// Runs one test in a child; the child's one line of result comes back through a pipe.
std::string run_isolated(const fs::path& dir, const std::vector<std::string>& input_names) {
  int fds[2];
  if (pipe(fds) != 0) return "crash: pipe failed";
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    alarm(120);
    std::string r = run_one(dir, input_names);
    std::replace(r.begin(), r.end(), '\n', ' ');
    if (r.size() > 300) r.resize(300);
    (void)!write(fds[1], r.data(), r.size());
    close(fds[1]);
    _exit(0);
  }
  close(fds[1]);
  std::string out;
  char buf[512];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, std::size_t(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFSIGNALED(status)) return fmt::format("crash: signal {}", WTERMSIG(status));
  if (out.empty()) return "crash: no result";
  return out;
}

struct OpStats {
  int pass = 0, total = 0;
  int untyped = 0;  // tests that need an element type RLX has no dtype for (string, complex, float6)
  std::string domain;
};

std::string coverage_markdown(const std::map<std::string, OpStats>& ops, const std::string& version) {
  const auto claimed_list = rlx::onnx::supported_ops();
  const std::set<std::string> claimed(claimed_list.begin(), claimed_list.end());
  int n_claimed = 0, claimed_pass = 0, claimed_total = 0, claimed_untyped = 0, all_pass = 0, all_total = 0;
  for (const auto& [op, s] : ops) {
    all_pass += s.pass;
    all_total += s.total;
    if (s.domain == "ai.onnx" && claimed.count(op)) {
      claimed_pass += s.pass;
      claimed_total += s.total;
      claimed_untyped += s.untyped;
    }
  }
  const int typed_total = claimed_total - claimed_untyped;
  for (const auto& op : claimed) n_claimed += ops.count(op) ? 1 : 0;
  std::string md =
      "# ONNX coverage\n\n"
      "Generated by `tests/onnx/test_onnx_node.cpp` from ONNX's backend node tests (" +
      version +
      "), each imported with `rlx::onnx::import` and run on the CPU backend, compared with ONNX's expected "
      "outputs at rtol 1e-3, atol 1e-7. Regenerate: `RLX_ONNX_COVERAGE_WRITE=1 build/tests/onnx_test_onnx_node`; "
      "the test fails when this page is stale. What the importer does: [onnx.md](onnx.md).\n\n";
  md += fmt::format("- ops claimed (with node tests): {}; ops the importer maps: {}\n", n_claimed, claimed.size());
  md += fmt::format("- node tests of claimed ops passing: {} / {} ({:.1f}%)\n", claimed_pass, claimed_total,
                    claimed_total ? 100.0 * claimed_pass / claimed_total : 0.0);
  md += fmt::format(
      "- of those, the tests whose element types RLX has (all but string, complex and float6): {} / {} "
      "({:.1f}%)\n",
      claimed_pass, typed_total, typed_total ? 100.0 * claimed_pass / typed_total : 0.0);
  md += fmt::format("- all node tests passing: {} / {}\n\n", all_pass, all_total);
  md += "| op | domain | claimed | tests passing | tests needing a type RLX lacks |\n|---|---|---|---|---|\n";
  for (const auto& [op, s] : ops)
    md += fmt::format("| {} | {} | {} | {} / {} | {} |\n", op, s.domain,
                      s.domain == "ai.onnx" && claimed.count(op) ? "yes" : "no", s.pass, s.total, s.untyped);
  return md;
}

fs::path node_dir() { return fs::path(RLX_ONNX_NODE_DIR); }

}  // namespace

TEST(OnnxNodeTests, ClaimedOpsPassAndUnclaimedOnesFailClearly) {
  const fs::path dir = node_dir();
  if (!fs::exists(dir / "manifest.tsv")) {
    const fs::path py = fs::path(RLX_SOURCE_DIR) / ".venv/bin/python";
    if (!fs::exists(py)) GTEST_SKIP() << "no .venv with the onnx package (scripts/bootstrap.sh installs it)";
    const std::string cmd = fmt::format("'{}' '{}/tests/onnx/gen_node_tests.py' '{}' >/dev/null 2>&1", py.string(),
                                        RLX_SOURCE_DIR, dir.string());
    if (std::system(cmd.c_str()) != 0 || !fs::exists(dir / "manifest.tsv"))
      GTEST_SKIP() << "could not generate the node tests (is the onnx package installed?): " << cmd;
  }
  std::map<std::string, OpStats> ops;
  std::ofstream log(dir.parent_path() / "onnx-node-results.tsv");
  std::istringstream manifest(read_text(dir / "manifest.tsv"));
  const auto claimed_list = rlx::onnx::supported_ops();
  const std::set<std::string> claimed(claimed_list.begin(), claimed_list.end());
  std::string line;
  int crashes = 0;
  while (std::getline(manifest, line)) {
    std::istringstream fields(line);
    std::string name, op, domain;
    std::getline(fields, name, '\t');
    std::getline(fields, op, '\t');
    std::getline(fields, domain, '\t');
    std::vector<std::string> input_names;
    for (std::string in; std::getline(fields, in, '\t');) input_names.push_back(in);
    const std::string r = run_isolated(dir / name, input_names);
    auto& s = ops[op];
    s.domain = domain;
    s.total++;
    s.pass += r == "pass";
    s.untyped +=
        r.find("RLX has no dtype for") != std::string::npos || r.find("names a type RLX lacks") != std::string::npos;
    log << name << '\t' << op << '\t' << r << '\n';
    if (r.rfind("crash", 0) == 0) {
      ++crashes;
      ADD_FAILURE() << name << ": " << r;
    }
    // A test of an op the importer does not claim must end in the clear error. (An _expanded test holds
    // the op's function body instead of the op, so it may run and merely miss the tolerance.)
    const bool expanded = name.find("_expanded") != std::string::npos;
    if (!(domain == "ai.onnx" && claimed.count(op)) && !expanded && r.rfind("unsupported", 0) != 0 &&
        r.rfind("error", 0) != 0 && r != "pass")
      ADD_FAILURE() << name << " (unclaimed " << op << "): " << r;
  }
  EXPECT_EQ(crashes, 0);
  const auto md = coverage_markdown(ops, read_text(dir / "VERSION").substr(0, read_text(dir / "VERSION").find(',')));
  const fs::path doc = fs::path(RLX_SOURCE_DIR) / "docs/onnx-coverage.md";
  if (std::getenv("RLX_ONNX_COVERAGE_WRITE")) std::ofstream(doc) << md;
  EXPECT_EQ(read_text(doc), md) << "docs/onnx-coverage.md is stale: run RLX_ONNX_COVERAGE_WRITE=1 "
                                   "build/tests/onnx_test_onnx_node (results per test: "
                                << (dir.parent_path() / "onnx-node-results.tsv") << ")";
}
