// Fuzz target: the IR text parser and the verifier it runs. Any input must
// either parse into a verified graph or throw rlx::Error; anything else (a
// crash, a sanitizer report, another exception, a hang) is a bug. A graph
// that parses must also print and parse back to the same text.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "rlx/error.hpp"
#include "rlx/ir/text.hpp"
#include "support/test_ops.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  rlx::testing::register_test_ops();  // custom ops in inputs resolve, so their paths are fuzzed too
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  rlx::ir::Graph g;
  try {
    g = rlx::ir::parse_text(text);
  } catch (const rlx::Error&) {
    return 0;  // a clear error is the right answer to bad input
  }
  const std::string printed = rlx::ir::to_text(g);
  std::string again;
  try {
    again = rlx::ir::to_text(rlx::ir::parse_text(printed));
  } catch (const rlx::Error& e) {
    std::fprintf(stderr, "a printed graph does not parse: %s\n%s", e.what(), printed.c_str());
    std::abort();
  }
  if (again != printed) {
    std::fprintf(stderr, "the text round trip changed the graph:\n%s\n----\n%s", printed.c_str(), again.c_str());
    std::abort();
  }
  return 0;
}
