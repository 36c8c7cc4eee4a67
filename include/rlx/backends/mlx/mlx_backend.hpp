#pragma once
// The MLX backend ("mlx", Device::Mlx): LIR kernels lowered onto mlx::core ops
// (MLX's C++ library, from PyPI's mlx-cpu wheel in the project's .venv, found at
// configure time). Kernels MLX cannot run (control flow left as a host loop,
// f64, block-quantized types, random samples, integer matmuls, host custom
// kernels) run on the host through the CPU backend, between MLX segments.
// Built without MLX, the backend registers as unavailable with the reason.
// See docs/backends/mlx.md.
#include <memory>
#include <string>
#include <string_view>

#include "rlx/runtime/backend.hpp"

namespace rlx::backends::mlx {

std::unique_ptr<runtime::Backend> make_mlx_backend();
// Empty when the backend can run here; otherwise why not.
std::string unavailable_reason();
// What the backend declares to the compile pipeline, with or without MLX.
compile::BackendTraits traits();

// How runs execute (RLX_MLX_MODE): Eager evaluates after every kernel, Lazy
// builds each segment's graph and evaluates it once, Compiled (the default)
// runs each segment through mx::compile, traced once at compile time.
enum class Mode : std::uint8_t { Eager, Lazy, Compiled };
std::string_view mode_name(Mode m);
Mode parse_mode(std::string_view name);  // case-insensitive; throws rlx::Error naming the choices
Mode mode_from_env();                    // RLX_MLX_MODE, Compiled when unset

}  // namespace rlx::backends::mlx
