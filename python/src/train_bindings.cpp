// pyrlx bindings for rlx::train: the loss builders, the step graph and the
// Trainer. The Python-facing API (optimiser dataclasses, dict I/O) lives in
// pyrlx/train.py; this layer converts arrays and releases the GIL per step.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <set>

#include "rlx/error.hpp"
#include "rlx/train/train.hpp"

namespace nb = nanobind;
using namespace nb::literals;
namespace ir = rlx::ir;
namespace train = rlx::train;

namespace {

using AnyArray = nb::ndarray<nb::c_contig, nb::device::cpu>;
using NamedArrays = std::vector<std::tuple<std::string, AnyArray, std::string>>;

std::vector<std::int64_t> array_shape(const AnyArray& a) {
  std::vector<std::int64_t> s(a.ndim());
  for (std::size_t i = 0; i < a.ndim(); ++i) s[i] = static_cast<std::int64_t>(a.shape(i));
  return s;
}

// bf16 travels as uint16 bits, as in the rest of pyrlx.
nb::dlpack::dtype dl_dtype(ir::DType t) {
  switch (t) {
    case ir::DType::F32: return nb::dtype<float>();
    case ir::DType::F64: return nb::dtype<double>();
    case ir::DType::F16: return {static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float), 16, 1};
    case ir::DType::BF16: return nb::dtype<std::uint16_t>();
    case ir::DType::I8: return nb::dtype<std::int8_t>();
    case ir::DType::U8: return nb::dtype<std::uint8_t>();
    case ir::DType::I32: return nb::dtype<std::int32_t>();
    case ir::DType::I64: return nb::dtype<std::int64_t>();
    case ir::DType::Bool: return nb::dtype<bool>();
  }
  return nb::dtype<float>();
}

// A numpy array owning a copy of `t`: the trainer's buffers are rewritten by
// every step, so Python never sees them directly.
nb::object to_numpy(const ir::Tensor& t) {
  auto* copy = new ir::Tensor(t);
  nb::capsule owner(copy, [](void* p) noexcept { delete static_cast<ir::Tensor*>(p); });
  std::vector<std::size_t> shape(t.shape().begin(), t.shape().end());
  return nb::cast(
      nb::ndarray<nb::numpy>(copy->data(), shape.size(), shape.data(), owner, nullptr, dl_dtype(t.dtype())));
}

train::Optimizer optimizer(const std::string& kind, const std::map<std::string, double>& h) {
  std::set<std::string> used;
  auto get = [&](const char* key, double fallback) {
    auto it = h.find(key);
    if (it == h.end()) return fallback;
    used.insert(key);
    return it->second;
  };
  train::Optimizer opt;
  if (kind == "sgd") {
    train::Sgd d;
    opt = train::Sgd{get("lr", d.lr), get("momentum", d.momentum), get("weight_decay", d.weight_decay)};
  } else if (kind == "adam" || kind == "adamw") {
    auto adam = [&](auto d) {
      return decltype(d){get("lr", d.lr), get("b1", d.b1), get("b2", d.b2), get("eps", d.eps),
                         get("weight_decay", d.weight_decay)};
    };
    opt = kind == "adam" ? train::Optimizer(adam(train::Adam{})) : train::Optimizer(adam(train::AdamW{}));
  } else {
    throw rlx::Error("unknown optimizer '" + kind + "' (expected sgd, adam or adamw)");
  }
  for (const auto& [k, v] : h)
    if (!used.contains(k)) throw rlx::Error("optimizer '" + kind + "' has no hyperparameter '" + k + "'");
  return opt;
}

struct PyTrainer {
  train::Trainer t;

  double step(const NamedArrays& inputs) {
    std::vector<std::vector<std::int64_t>> shapes(inputs.size());
    std::vector<rlx::runtime::NamedTensor> named;
    named.reserve(inputs.size());
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      const auto& [name, arr, dtype] = inputs[i];
      shapes[i] = array_shape(arr);
      named.push_back({name, {ir::parse_dtype(dtype), shapes[i], arr.data(), arr.nbytes()}});
    }
    nb::gil_scoped_release release;
    return t.step(named);
  }
};

}  // namespace

void bind_train(nb::module_& m) {
  m.def("_cross_entropy", &train::cross_entropy, "graph"_a, "logits"_a, "labels"_a);
  m.def("_mse", &train::mse, "graph"_a, "pred"_a, "target"_a);
  m.def(
      "_train_step",
      [](const ir::Graph& g, const std::vector<std::string>& params, const std::string& kind,
         const std::map<std::string, double>& hyper) {
        train::TrainStep ts = train::train_step(g, params, optimizer(kind, hyper));
        std::vector<std::tuple<std::string, std::string, std::vector<std::int64_t>>> state;
        for (const auto& s : ts.state)
          state.emplace_back(s.name, std::string(ir::dtype_name(s.dtype)), s.shape.extents());
        return std::make_tuple(std::move(ts.graph), std::move(state));
      },
      "graph"_a, "params"_a, "kind"_a, "hyper"_a);

  nb::class_<PyTrainer>(m, "_Trainer")
      .def(
          "__init__",
          [](PyTrainer* self, const ir::Graph& g, const NamedArrays& params, const std::string& kind,
             const std::map<std::string, double>& hyper, const std::vector<std::string>& trainable,
             const std::string& device, int num_threads) {
            train::TensorMap values;
            for (const auto& [name, arr, dtype] : params)
              values.emplace(name, ir::Tensor(ir::parse_dtype(dtype), array_shape(arr),
                                              std::span(static_cast<const std::byte*>(arr.data()), arr.nbytes())));
            train::TrainerOptions o;
            o.device = rlx::runtime::parse_device(device);
            o.trainable = trainable;
            o.compile.num_threads = num_threads;
            new (self) PyTrainer{train::Trainer(g, std::move(values), optimizer(kind, hyper), std::move(o))};
          },
          "graph"_a, "params"_a, "kind"_a, "hyper"_a, "trainable"_a, "device"_a, "num_threads"_a)
      .def("step", &PyTrainer::step, "inputs"_a)
      .def("param", [](const PyTrainer& p, const std::string& name) { return to_numpy(p.t.param(name)); })
      .def("state", [](const PyTrainer& p, const std::string& name) { return to_numpy(p.t.state(name)); })
      .def("params",
           [](const PyTrainer& p) {
             nb::dict out;
             for (const auto& [name, value] : p.t.params()) out[name.c_str()] = to_numpy(value);
             return out;
           })
      .def("state_names",
           [](const PyTrainer& p) {
             std::vector<std::string> names;
             for (const auto& s : p.t.step_graph().state) names.push_back(s.name);
             return names;
           })
      .def("trained", [](const PyTrainer& p) { return p.t.step_graph().params; })
      .def_prop_ro("steps", [](const PyTrainer& p) { return p.t.steps(); })
      .def_prop_rw(
          "lr", [](const PyTrainer& p) { return p.t.lr(); }, [](PyTrainer& p, double lr) { p.t.set_lr(lr); })
      .def("step_graph", [](const PyTrainer& p) { return p.t.step_graph().graph; })
      .def("summary", [](const PyTrainer& p) { return p.t.compiled().compile_result().summary(); });
}
