#pragma once
// rlx::Error is the one exception type RLX throws for user errors: malformed
// graphs, bad inputs at run time, unparsable files, unsupported ops. The
// library never aborts on user error; internal invariants use assert().
#include <stdexcept>
#include <string>

namespace rlx {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace rlx
