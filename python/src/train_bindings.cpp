// pyrlx bindings for rlx::train: the loss builders, the step graph and the
// Trainer. The Python-facing API (optimiser dataclasses, dict I/O) lives in
// pyrlx/train.py; this layer converts arrays and releases the GIL per step.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <set>

#include "convert.hpp"
#include "rlx/error.hpp"
#include "rlx/train/train.hpp"

namespace nb = nanobind;
using namespace nb::literals;
namespace ir = rlx::ir;
namespace train = rlx::train;

namespace {

using pyrlx::AnyArray;
using NamedArrays = std::vector<std::tuple<std::string, AnyArray, std::string>>;
using pyrlx::array_shape;

// A numpy array owning a copy of `t`: the trainer's buffers are rewritten by
// every step, so Python never sees them directly.
nb::object to_numpy(const ir::Tensor& t) { return pyrlx::tensor_to_array(t); }

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
             const std::string& device, int num_threads, int micro_batches, bool data_parallel,
             const std::string& precision, bool tf32, const std::optional<std::map<std::string, double>>& scaling) {
            train::TensorMap values;
            for (const auto& [name, arr, dtype] : params)
              values.emplace(name, ir::Tensor(ir::parse_dtype(dtype), array_shape(arr),
                                              std::span(static_cast<const std::byte*>(arr.data()), arr.nbytes())));
            train::TrainerOptions o;
            o.device = rlx::runtime::parse_device(device);
            o.trainable = trainable;
            o.compile.num_threads = num_threads;
            o.micro_batches = micro_batches;
            o.data_parallel = data_parallel;
            o.compile.precision = rlx::compile::parse_precision(precision);
            o.compile.tf32 = tf32;
            if (scaling) {  // pyrlx.LossScaling's fields, checked there
              train::LossScaling ls;
              ls.init_scale = scaling->at("init_scale");
              ls.growth_factor = scaling->at("growth_factor");
              ls.backoff_factor = scaling->at("backoff_factor");
              ls.growth_interval = int(scaling->at("growth_interval"));
              o.loss_scaling = ls;
            }
            new (self) PyTrainer{train::Trainer(g, std::move(values), optimizer(kind, hyper), std::move(o))};
          },
          "graph"_a, "params"_a, "kind"_a, "hyper"_a, "trainable"_a, "device"_a, "num_threads"_a, "micro_batches"_a = 1,
          "data_parallel"_a = false, "precision"_a = "f32", "tf32"_a = false, "loss_scaling"_a = nb::none())
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
      .def_prop_ro("loss_scale", [](const PyTrainer& p) { return p.t.loss_scale(); })
      .def_prop_ro("skipped_steps", [](const PyTrainer& p) { return p.t.skipped_steps(); })
      .def_prop_rw(
          "lr", [](const PyTrainer& p) { return p.t.lr(); }, [](PyTrainer& p, double lr) { p.t.set_lr(lr); })
      .def("step_graph", [](const PyTrainer& p) { return p.t.step_graph().graph; })
      .def("summary", [](const PyTrainer& p) { return p.t.compiled().compile_result().summary(); })
      .def_prop_ro("micro_batches", [](const PyTrainer& p) { return p.t.micro_batches(); })
      .def_prop_ro("data_parallel", [](const PyTrainer& p) { return p.t.communicator().has_value(); });

  // rlx.distributed (pyrlx/distributed.py): the process's world communicator.
  m.def(
      "_distributed_init",
      [](const std::string& engine, int device) {
        namespace d = rlx::distributed;
        auto c = d::init({.engine = d::parse_engine(engine, "engine"), .device = device});
        return std::make_tuple(c.rank(), c.world_size(), std::string(c.engine()));
      },
      "engine"_a, "device"_a);
  m.def("_distributed_is_initialized", &rlx::distributed::is_initialized);
  m.def("_distributed_unavailable", [](const std::string& engine) {
    return rlx::distributed::engine_unavailable_reason(rlx::distributed::parse_engine(engine, "engine"));
  });
  // In place on a contiguous f32 or f64 array: the world's sum (max, min) in rank order.
  m.def(
      "_distributed_all_reduce",
      [](const nb::ndarray<nb::c_contig, nb::device::cpu>& arr, const std::string& op) {
        namespace d = rlx::distributed;
        const d::ReduceOp rop = op == "sum"   ? d::ReduceOp::Sum
                                : op == "max" ? d::ReduceOp::Max
                                : op == "min" ? d::ReduceOp::Min
                                              : throw rlx::Error("all_reduce: op '" + op + "' is not sum, max or min");
        ir::DType dt;
        if (arr.dtype() == nb::dtype<float>()) {
          dt = ir::DType::F32;
        } else if (arr.dtype() == nb::dtype<double>()) {
          dt = ir::DType::F64;
        } else {
          throw rlx::Error("all_reduce: the array must be float32 or float64");
        }
        auto c = d::world();
        nb::gil_scoped_release release;
        c.all_reduce(d::Buffer{arr.data(), arr.size(), dt}, rop);
      },
      "array"_a, "op"_a);
  m.def("_distributed_barrier", [] {
    auto c = rlx::distributed::world();
    nb::gil_scoped_release release;
    c.barrier();
  });
}
