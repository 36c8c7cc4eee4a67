#include "rlx/runtime/handle_checks.hpp"

#include <fmt/format.h>

#include "rlx/error.hpp"

namespace rlx::runtime {

void HandleChecks::input(std::string_view method, std::size_t index) const {
  if (index >= in_bytes.size())
    throw Error(
        fmt::format("{}: {}: input index {} out of range ({} inputs)", backend, method, index, in_bytes.size()));
}

void HandleChecks::input(std::string_view method, std::size_t index, std::size_t nbytes) const {
  input(method, index);
  if (nbytes != in_bytes[index])
    throw Error(
        fmt::format("{}: {}: input {} holds {} bytes, got {}", backend, method, index, in_bytes[index], nbytes));
}

void HandleChecks::bound(std::string_view method, std::size_t index, const std::vector<bool>& is_bound) const {
  input(method, index);
  if (!is_bound.at(index))
    throw Error(fmt::format("{}: {}: input {} has no handle (bind_handle it first)", backend, method, index));
}

void HandleChecks::feed(std::size_t input, std::size_t output, const std::vector<bool>& is_bound) const {
  if (input >= in_bytes.size() || output >= out_bytes.size())
    throw Error(fmt::format("{}: feed_handle: input {} or output {} out of range ({} inputs, {} outputs)", backend,
                            input, output, in_bytes.size(), out_bytes.size()));
  bound("feed_handle", input, is_bound);
  if (in_bytes[input] != out_bytes[output])
    throw Error(fmt::format("{}: feed_handle: output {} holds {} bytes, input {} {}", backend, output,
                            out_bytes[output], input, in_bytes[input]));
}

}  // namespace rlx::runtime
