#pragma once
// The argument checks a backend's handle methods make (ExecutableGraph::bind_handle, read_handle,
// copy_handle_to, feed_handle, handle_address), written once: each throws rlx::Error
// "<backend>: <method>: ..." naming the input or output and what is wrong with it.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace rlx::runtime {

struct HandleChecks {
  std::string_view backend;                            // "cuda", "vulkan": the errors' prefix
  std::span<const std::uint64_t> in_bytes, out_bytes;  // per graph input and output

  // Input `index` exists; with `nbytes`, it also holds that many bytes.
  void input(std::string_view method, std::size_t index) const;
  void input(std::string_view method, std::size_t index, std::size_t nbytes) const;
  // Input `index` exists and is bound to a handle.
  void bound(std::string_view method, std::size_t index, const std::vector<bool>& is_bound) const;
  // feed_handle(input, output): both exist, the input is bound, and the two hold the same bytes.
  void feed(std::size_t input, std::size_t output, const std::vector<bool>& is_bound) const;
};

}  // namespace rlx::runtime
