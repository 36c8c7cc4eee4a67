#pragma once
// The conformance harness every backend runs through (in the spirit of ggml's
// test-backend-ops): compile a graph on a device, feed fresh random inputs,
// run into POISONED outputs and compare each output with the float64
// reference interpreter. A backend joins the suite by one line in backends().
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "rlx/compile/pipeline.hpp"
#include "rlx/env.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/text.hpp"
#include "rlx/reference/interpreter.hpp"
#include "rlx/runtime/session.hpp"
#include "support/c_module.hpp"
#include "support/testing.hpp"

// Test names and logs show "cpu", not a byte dump.
namespace rlx::runtime {
inline void PrintTo(Device d, std::ostream* os) { *os << device_label(d); }
}  // namespace rlx::runtime

namespace rlx::conformance {

using runtime::Device;
using Ints = std::vector<std::int64_t>;

inline const std::vector<Device>& backends() {
  static const std::vector<Device> devices{Device::Cpu, Device::Vulkan, Device::Cuda, Device::Mlx};
  return devices;
}

// Empty when the device can run; otherwise why not (the skip message).
inline std::string unavailable_reason(Device d) {
  if (runtime::is_available(d)) return {};
  try {
    runtime::make_backend(d);
  } catch (const Error& e) {
    return e.what();
  }
  return "unavailable";
}

// ---- input generators ------------------------------------------------------
// A generator makes the value of one input or param from its dtype and shape.
using Gen = std::function<ir::Tensor(ir::DType, const Ints&, std::mt19937_64&)>;

inline Gen uniform(double lo = -2.0, double hi = 2.0) {
  return
      [lo, hi](ir::DType t, const Ints& s, std::mt19937_64& rng) { return testing::random_tensor(t, s, rng, lo, hi); };
}
// Integer values in [lo, hi] (stored in any dtype: indices, exact ties).
inline Gen ints_in(std::int64_t lo, std::int64_t hi) {
  return [lo, hi](ir::DType t, const Ints& s, std::mt19937_64& rng) {
    ir::Tensor x(t, s);
    std::uniform_int_distribution<std::int64_t> u(lo, hi);
    for (std::int64_t i = 0; i < x.numel(); ++i) x.set(i, double(u(rng)));
    return x;
  };
}
// Magnitude in [lo, hi] with a random sign: divisors, reciprocals.
inline Gen nonzero(double lo, double hi) {
  return [lo, hi](ir::DType t, const Ints& s, std::mt19937_64& rng) {
    ir::Tensor x(t, s);
    std::uniform_real_distribution<double> u(lo, hi);
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      double v = u(rng);
      x.set(i, rng() & 1 ? v : -v);
    }
    return x;
  };
}
// Values drawn from a fixed set: ties for comparisons, halves for round, zeros for sign.
inline Gen one_of(std::vector<double> pool) {
  return [pool](ir::DType t, const Ints& s, std::mt19937_64& rng) {
    ir::Tensor x(t, s);
    std::uniform_int_distribution<std::size_t> u(0, pool.size() - 1);
    for (std::int64_t i = 0; i < x.numel(); ++i) x.set(i, pool[u(rng)]);
    return x;
  };
}
// The same values every run, in order (repeated): exact cases that must not depend on the seed.
inline Gen cycle_of(std::vector<double> values) {
  return [values](ir::DType t, const Ints& s, std::mt19937_64&) {
    ir::Tensor x(t, s);
    for (std::int64_t i = 0; i < x.numel(); ++i) x.set(i, values[std::size_t(i) % values.size()]);
    return x;
  };
}
inline Gen bools(double p_true = 0.5) {
  return [p_true](ir::DType t, const Ints& s, std::mt19937_64& rng) {
    ir::Tensor x(t, s);
    std::bernoulli_distribution b(p_true);
    for (std::int64_t i = 0; i < x.numel(); ++i) x.set(i, b(rng) ? 1.0 : 0.0);
    return x;
  };
}

using Gens = std::map<std::string, Gen, std::less<>>;

// ---- poisoned outputs -------------------------------------------------------
// NaN for floats and 0x5A bytes otherwise: an element the backend forgets to
// write cannot pass (a bool byte of 0x5A is caught by check_bool_bytes).
inline ir::Tensor poisoned(ir::DType t, const Ints& shape) {
  ir::Tensor x(t, shape);
  if (ir::is_float(t)) {
    for (std::int64_t i = 0; i < x.numel(); ++i) x.set(i, std::numeric_limits<double>::quiet_NaN());
  } else if (x.nbytes()) {
    std::memset(x.data(), 0x5A, x.nbytes());
  }
  return x;
}

inline ::testing::AssertionResult check_bool_bytes(const ir::Tensor& t) {
  if (t.dtype() != ir::DType::Bool) return ::testing::AssertionSuccess();
  for (std::size_t i = 0; i < t.nbytes(); ++i) {
    auto b = std::to_integer<unsigned>(t.data()[i]);
    if (b > 1) return ::testing::AssertionFailure() << "bool element " << i << " holds byte " << b << " (unwritten?)";
  }
  return ::testing::AssertionSuccess();
}

// ---- the check ---------------------------------------------------------------
struct Check {
  compile::CompileOptions options;
  Gens gens;  // by input/param name; others get uniform(-2, 2)
  Gen fallback = uniform();
  // Replaces tolerance_for(dtype) for float outputs. Integer and bool outputs are always exact.
  std::optional<testing::Tolerance> tol;
  std::uint64_t seed = 0;
  // Each run draws fresh inputs into freshly poisoned outputs: a second run
  // catches state left in the arena or params by the first.
  int runs = 2;
  std::string label;  // printed on failure
};

inline ir::Tensor make_value(const ir::Node& n, const Check& c, std::mt19937_64& rng) {
  const auto& name = n.attrs.get_str("name");
  auto it = c.gens.find(name);
  return (it != c.gens.end() ? it->second : c.fallback)(n.dtype, n.shape.extents(), rng);
}

// One executor under test as the check drives it: a compiled graph on a
// device, or generated C (test_op_parity.cpp). `run_into` writes every output
// into the tensors given, which have the declared dtypes and shapes.
struct Executor {
  std::vector<CompiledGraph::IoSpec> outputs;
  std::function<void(const std::string& name, const ir::Tensor& value)> set_param;
  std::function<void(const reference::TensorMap& inputs, std::vector<ir::Tensor>& outputs)> run_into;
};

// Builds an executor for `graph` with `make` and compares it with the
// reference run of `oracle` (the same graph, or the graph it was derived
// from, with the same inputs and params). Never throws: an exception is a
// failure.
inline ::testing::AssertionResult matches_reference(const std::function<Executor()>& make, const ir::Graph& graph,
                                                    const ir::Graph& oracle, const Check& c) {
  auto context = [&] {
    return "\n  case: " + c.label + "\n  seed: " + std::to_string(c.seed) + "\n  graph:\n" + ir::to_text(graph);
  };
  std::mt19937_64 rng(c.seed);
  std::string stage = "compile";
  // RLX_TEST_TIMING=1: each case's time per stage on stderr (where a slow suite spends it, e.g. on a GPU).
  static const bool timing = rlx::env::get_bool("RLX_TEST_TIMING");
  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  };
  double ms_compile = 0, ms_reference = 0, ms_run = 0;
  struct Report {
    const bool& on;
    const std::string& label;
    const double &compile, &reference, &run;
    ~Report() {
      if (on)
        std::fprintf(stderr, "[timing] %s: compile %.1f ms, reference %.1f ms, runs %.1f ms\n", label.c_str(), compile,
                     reference, run);
    }
  } report{timing, c.label, ms_compile, ms_reference, ms_run};
  try {
    auto t0 = Clock::now();
    Executor exe = make();
    ms_compile = since(t0);
    stage = "set_param";
    reference::TensorMap params;
    for (ir::NodeId id : graph.param_ids()) {
      const auto& n = graph.node(id);
      auto& value = params[n.attrs.get_str("name")] = make_value(n, c, rng);
      exe.set_param(n.attrs.get_str("name"), value);
    }
    for (int run = 0; run < c.runs; ++run) {
      reference::TensorMap inputs;
      for (ir::NodeId id : graph.input_ids())
        inputs[graph.node(id).attrs.get_str("name")] = make_value(graph.node(id), c, rng);
      stage = "reference";
      auto t1 = Clock::now();
      auto want = reference::run(oracle, inputs, params);
      ms_reference += since(t1);
      const auto& specs = exe.outputs;
      if (specs.size() != want.size())
        return ::testing::AssertionFailure()
               << specs.size() << " outputs, the reference has " << want.size() << context();
      std::vector<ir::Tensor> got;
      for (std::size_t j = 0; j < specs.size(); ++j) {
        if (specs[j].dtype != want[j].dtype() || specs[j].shape != want[j].shape())
          return ::testing::AssertionFailure()
                 << "output " << j << " is declared " << ir::dtype_name(specs[j].dtype)
                 << ir::Shape(specs[j].shape).str() << ", the reference gives " << ir::dtype_name(want[j].dtype())
                 << ir::Shape(want[j].shape()).str() << context();
        got.push_back(poisoned(specs[j].dtype, specs[j].shape));
      }
      stage = "run " + std::to_string(run);
      auto t2 = Clock::now();
      exe.run_into(inputs, got);
      ms_run += since(t2);
      for (std::size_t j = 0; j < got.size(); ++j) {
        auto tol = c.tol && ir::is_float(want[j].dtype()) ? *c.tol : testing::tolerance_for(want[j].dtype());
        auto close = testing::tensors_close(got[j], want[j], tol);
        if (close) close = check_bool_bytes(got[j]);
        if (!close)
          return ::testing::AssertionFailure()
                 << "run " << run << ", output " << j << " '" << specs[j].name << "': " << close.message() << context();
      }
    }
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << stage << " threw: " << e.what() << context();
  }
  return ::testing::AssertionSuccess();
}

// Compiles `graph` on `device` through Session and checks it as above.
inline ::testing::AssertionResult matches_reference(Device device, const ir::Graph& graph, const ir::Graph& oracle,
                                                    const Check& c) {
  return matches_reference(
      [&] {
        auto session = std::make_shared<Session>(device);
        auto exe = std::make_shared<CompiledGraph>(session->compile(graph, c.options));
        return Executor{exe->output_specs(),
                        [exe](const std::string& name, const ir::Tensor& value) { exe->set_param(name, value); },
                        [session, exe](const reference::TensorMap& inputs, std::vector<ir::Tensor>& outputs) {
                          std::vector<runtime::NamedTensor> named;
                          for (const auto& [name, t] : inputs) named.push_back({name, ir::view(t)});
                          exe->run_into(named, outputs);
                        }};
      },
      graph, oracle, c);
}

inline ::testing::AssertionResult matches_reference(Device device, const ir::Graph& graph, const Check& c) {
  return matches_reference(device, graph, graph, c);
}

// Ops the pipeline must decompose unless a backend claims them.
inline bool is_hir_only(ir::OpKind k) {
  return ir::op_info(k).cls == ir::OpClass::Composite || k == ir::OpKind::Squeeze || k == ir::OpKind::Unsqueeze;
}
inline bool has_hir_only(const ir::Graph& g) {
  for (const auto& n : g.nodes())
    if (is_hir_only(n.op)) return true;
  return false;
}

// ---- generated C as an executor ----------------------------------------------
// Function k of a built rlx::codegen::c module (support/c_module.hpp) as the
// harness drives it; params are kept here and passed as the pointer
// arguments of every run.
inline Executor c_executor(testing::CModule& module, std::size_t k) {
  Executor e;
  for (const auto& a : module.source(k).outputs) e.outputs.push_back({a.name, a.dtype, a.shape});
  auto params = std::make_shared<reference::TensorMap>();
  e.set_param = [params](const std::string& name, const ir::Tensor& value) { (*params)[name] = value; };
  e.run_into = [&module, k, params](const reference::TensorMap& inputs, std::vector<ir::Tensor>& outputs) {
    module.run_into(k, inputs, *params, outputs);
  };
  return e;
}

}  // namespace rlx::conformance
