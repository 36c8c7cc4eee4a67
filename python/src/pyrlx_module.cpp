// The _pyrlx extension: a thin nanobind layer over the C++ API. The Python
// DSL (pyrlx/__init__.py) builds on the generic `Graph.op(name, inputs, attrs)`
// entry point, so this file does not mirror every builder by hand; the builders
// that check an axis are bound typed.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "convert.hpp"
#include "rlx/autodiff/autodiff.hpp"
#include "rlx/compile/quantize.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/control_flow.hpp"
#include "rlx/ir/custom_op.hpp"
#include "rlx/ir/op_def.hpp"
#include "rlx/ir/text.hpp"
#include "rlx/reference/interpreter.hpp"
#include "rlx/runtime/session.hpp"

namespace nb = nanobind;
using namespace nb::literals;
namespace ir = rlx::ir;

namespace {

using namespace pyrlx;  // shapes, arrays, tensors (convert.hpp)

// A Python value converted to an attribute by the op's schema, so that e.g.
// a dtype given as "f16" or a float given as 1 come out typed.
ir::AttrValue to_attr(ir::OpKind op, const std::vector<ir::AttrSpec>& schema, const std::string& key, nb::handle v) {
  for (const auto& spec : schema) {
    if (spec.key != key) continue;
    switch (spec.type) {
      case ir::AttrType::Int: return nb::cast<std::int64_t>(v);
      case ir::AttrType::Float: return nb::cast<double>(v);
      case ir::AttrType::Bool: return nb::cast<bool>(v);
      case ir::AttrType::String: return nb::cast<std::string>(v);
      case ir::AttrType::Ints: return nb::cast<std::vector<std::int64_t>>(v);
      case ir::AttrType::DType: return ir::parse_dtype(nb::cast<std::string>(v));
      case ir::AttrType::Graph:
        throw rlx::Error("op '" + std::string(ir::op_name(op)) +
                         "' takes a body; build it with rlx.scan, rlx.cond or rlx.while_loop");
    }
  }
  throw rlx::Error("op '" + std::string(ir::op_name(op)) + "' has no attribute '" + key + "'");
}

ir::OpKind parse_op_or_throw(const std::string& name) {
  auto op = ir::parse_op(name);
  if (!op) throw rlx::Error("unknown op '" + name + "'");
  return *op;
}

// The compiled graph as Python sees it: it keeps its own copy of everything
// it needs, so deleting the Python Graph while it is alive is safe.
struct PyCompiled {
  rlx::CompiledGraph g;

  void set_param(const std::string& name, const AnyArray& a, const std::string& dtype) {
    std::vector<std::int64_t> shape;
    const ir::TensorView view = array_view(a, ir::parse_dtype(dtype), shape);
    // The GIL is released while waiting for the graph's run lock: a run in another thread may need it
    // for a Python custom-op kernel, and holding it here would deadlock both.
    nb::gil_scoped_release release;
    g.set_param(name, view);
  }

  nb::list run(const std::vector<std::tuple<std::string, AnyArray, std::string>>& inputs) {
    std::vector<std::vector<std::int64_t>> shapes(inputs.size());
    std::vector<rlx::runtime::NamedTensor> named;
    named.reserve(inputs.size());
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      const auto& [name, arr, dtype] = inputs[i];
      named.push_back({name, array_view(arr, ir::parse_dtype(dtype), shapes[i])});
    }
    // Outputs are numpy arrays allocated up front; the run writes straight into them.
    const auto& specs = g.output_specs();
    nb::list outs;
    std::vector<void*> ptrs;
    for (const auto& s : specs) {
      std::byte* data = nullptr;
      outs.append(new_array(s.dtype, s.shape, &data));
      ptrs.push_back(data);
    }
    {
      nb::gil_scoped_release release;
      g.run_raw(named, ptrs);
    }
    return outs;
  }
};

}  // namespace

// Defined in train_bindings.cpp (losses, optimisers) and extend_bindings.cpp (register_op).
void bind_train(nb::module_& m);
void bind_extend(nb::module_& m);
void bind_runtime(nb::module_& m);  // runtime_bindings.cpp: DevicePolicy, GraphDevices, DeviceRouter, ...
void bind_llm(nb::module_& m);      // llm_bindings.cpp: load_gguf, the Llama model under rlx.LLM
void bind_onnx(nb::module_& m);     // onnx_bindings.cpp: rlx.import_onnx

NB_MODULE(_pyrlx, m) {
  m.doc() = "RLX: an ML graph compiler and runtime (C++ core)";
  static nb::object error_type = nb::exception<rlx::Error>(m, "Error", PyExc_RuntimeError);
  // Every C++ exception reaches Python as rlx.Error (never MemoryError, ValueError or a crash):
  // bad_alloc and length_error come from a size no machine holds, anything else is a bug in RLX
  // that must still be catchable. Translators registered later run first; nanobind's own
  // (python_error, next_overload, cast errors) stay ahead of this one.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const std::bad_alloc&) {
      PyErr_SetString(error_type.ptr(), "out of memory: an allocation failed");
    } catch (const std::length_error& e) {
      PyErr_SetString(error_type.ptr(), (std::string("a size is too large: ") + e.what()).c_str());
    } catch (const std::bad_cast& e) {
      PyErr_SetString(error_type.ptr(), (std::string("a value has the wrong type or range: ") + e.what()).c_str());
    }
  });

  nb::class_<ir::Graph>(m, "_Graph")
      .def(nb::init<std::string>(), "name"_a = "graph")
      .def_prop_ro("name", &ir::Graph::name)
      .def("__len__", &ir::Graph::size)
      .def("input",
           [](ir::Graph& g, std::string name, nb::handle shape, const std::string& dtype) {
             return g.input(std::move(name), to_shape(shape), ir::parse_dtype(dtype));
           })
      .def("param",
           [](ir::Graph& g, std::string name, nb::handle shape, const std::string& dtype) {
             return g.param(std::move(name), to_shape(shape), ir::parse_dtype(dtype));
           })
      .def("constant", [](ir::Graph& g, const AnyArray& a,
                          const std::string& dtype) { return g.constant(array_to_tensor(a, ir::parse_dtype(dtype))); })
      .def(
          "op",
          [](ir::Graph& g, const std::string& name, const std::vector<ir::NodeId>& inputs, nb::dict attrs,
             std::optional<std::string> dtype, nb::object shape) {
            auto op = parse_op_or_throw(name);
            ir::Attrs a;
            // A custom op's schema depends on which op it is: read "op" first.
            if (attrs.contains("op")) a.set("op", nb::cast<std::string>(attrs["op"]));
            auto schema = ir::attr_schema_of(op, a);
            for (auto [k, v] : attrs) {
              auto key = nb::cast<std::string>(k);
              a.set(key, to_attr(op, schema, key, v));
            }
            if (dtype || !shape.is_none()) {
              auto d = dtype ? ir::parse_dtype(*dtype) : g.node(inputs.at(0)).dtype;
              return g.add_declared(op, inputs, std::move(a), d, to_shape(shape));
            }
            return g.add(op, inputs, std::move(a));
          },
          "op"_a, "inputs"_a, "attrs"_a = nb::dict(), "dtype"_a = nb::none(), "shape"_a = nb::none())
      .def("slice", &ir::Graph::slice)
      // The typed builders that take an axis: they refuse one outside [-rank, rank) (normalize_axis), where
      // the generic `op` path stores what it is given.
      .def("argmax", &ir::Graph::argmax)
      .def("argmin", &ir::Graph::argmin)
      .def("permute", &ir::Graph::permute)
      .def("squeeze", &ir::Graph::squeeze)
      .def("unsqueeze", &ir::Graph::unsqueeze)
      .def("flip", &ir::Graph::flip)
      .def("concat", &ir::Graph::concat)
      .def("pad", &ir::Graph::pad)
      .def("gather", &ir::Graph::gather)
      .def("index_select", &ir::Graph::index_select)
      .def("softmax", &ir::Graph::softmax)
      .def("log_softmax", &ir::Graph::log_softmax)
      .def("layer_norm", &ir::Graph::layer_norm)
      .def("reduce", [](ir::Graph& g, const std::string& op, ir::NodeId x, std::vector<std::int64_t> axes,
                        bool keepdims) { return g.reduce(parse_op_or_throw(op), x, std::move(axes), keepdims); })
      .def("reshape",
           [](ir::Graph& g, ir::NodeId x, std::vector<std::int64_t> shape) { return g.reshape(x, std::move(shape)); })
      .def("shape", [](const ir::Graph& g, ir::NodeId id) { return shape_tuple(g.node(id).shape); })
      .def("dtype", [](const ir::Graph& g, ir::NodeId id) { return std::string(ir::dtype_name(g.node(id).dtype)); })
      .def("op_name", [](const ir::Graph& g, ir::NodeId id) { return std::string(ir::op_name(g.node(id).op)); })
      .def("add_output", &ir::Graph::add_output, "node"_a, "name"_a = "")
      .def("set_outputs", &ir::Graph::set_outputs)
      .def("outputs", &ir::Graph::output_ids)
      .def("input_names",
           [](const ir::Graph& g) {
             std::vector<std::string> names;
             for (auto id : g.input_ids()) names.push_back(g.node(id).attrs.get_str("name"));
             return names;
           })
      .def("param_names",
           [](const ir::Graph& g) {
             std::vector<std::string> names;
             for (auto id : g.param_ids()) names.push_back(g.node(id).attrs.get_str("name"));
             return names;
           })
      .def("verify", &ir::Graph::verify)
      .def("to_text", [](const ir::Graph& g) { return ir::to_text(g); })
      .def("to_dot", [](const ir::Graph& g) { return ir::to_dot(g); })
      .def("write_svg", [](const ir::Graph& g, const std::string& path) { ir::write_svg(g, path); })
      .def("copy", [](const ir::Graph& g) { return ir::Graph(g); });

  m.def(
      "parse", [](const std::string& text) { return ir::parse_text(text); }, "text"_a);
  // For the DSL's composites that index shapes in Python (cumsum, split, var): the builders' own axis check.
  m.def("_normalize_axis", [](std::int64_t axis, std::size_t rank) { return ir::normalize_axis(axis, rank); });

  // Control flow: the DSL (rlx.scan, rlx.cond, rlx.while_loop) traces the bodies
  // into graphs; each returns the ids of the op's result nodes.
  m.def("_scan", [](ir::Graph& g, const ir::Graph& body, std::vector<ir::NodeId> init, std::vector<ir::NodeId> xs,
                    std::int64_t length, bool reverse, std::vector<ir::NodeId> consts) {
    return ir::scan(g, ir::body_ref(body), std::move(init), std::move(xs), length, reverse, std::move(consts));
  });
  m.def("_if", [](ir::Graph& g, ir::NodeId cond, const ir::Graph& then_body, const ir::Graph& else_body,
                  std::vector<ir::NodeId> operands) {
    return ir::if_else(g, cond, ir::body_ref(then_body), ir::body_ref(else_body), std::move(operands));
  });
  m.def("_while", [](ir::Graph& g, const ir::Graph& cond, const ir::Graph& body, std::vector<ir::NodeId> init,
                     std::vector<ir::NodeId> consts, std::int64_t max_trip_count) {
    return ir::while_loop(g, ir::body_ref(cond), ir::body_ref(body), std::move(init), std::move(consts),
                          max_trip_count);
  });

  // Autodiff transforms: each returns a new graph with the same inputs and params.
  auto transform = [&m](const char* name, ir::Graph (*fn)(const ir::Graph&, std::span<const std::string>,
                                                          const rlx::autodiff::Options&)) {
    m.def(
        name,
        [fn](const ir::Graph& g, const std::vector<std::string>& wrt, const std::vector<ir::NodeId>& stop,
             std::int64_t checkpoint_every, const std::vector<ir::NodeId>& checkpoint_at) {
          rlx::autodiff::Options o;
          o.stop_gradient.insert(stop.begin(), stop.end());
          o.checkpoint.every = checkpoint_every;
          o.checkpoint.boundaries.insert(checkpoint_at.begin(), checkpoint_at.end());
          return fn(g, wrt, o);
        },
        "graph"_a, "wrt"_a, "stop_gradient"_a = std::vector<ir::NodeId>{}, "checkpoint_every"_a = 0,
        "checkpoint_at"_a = std::vector<ir::NodeId>{});
  };
  transform("_grad", &rlx::autodiff::grad);
  transform("_value_and_grad", &rlx::autodiff::value_and_grad);
  transform("_jvp", &rlx::autodiff::jvp);
  // A symbolic batch size is a string (the symbol), a static one an int.
  m.def(
      "_vmap",
      [](const ir::Graph& g, const std::vector<std::string>& batched,
         const std::variant<std::int64_t, std::string>& size, std::int64_t in_axis, std::int64_t out_axis) {
        ir::Dim d = std::holds_alternative<std::string>(size) ? ir::Dim::symbol(std::get<std::string>(size))
                                                              : ir::Dim(std::get<std::int64_t>(size));
        return rlx::autodiff::vmap(g, {.batched = batched, .size = d, .in_axis = in_axis, .out_axis = out_axis});
      },
      "graph"_a, "batched"_a, "size"_a, "in_axis"_a, "out_axis"_a);

  m.def("reference_run",
        [](const ir::Graph& g, const std::vector<std::tuple<std::string, AnyArray, std::string>>& inputs,
           const std::vector<std::tuple<std::string, AnyArray, std::string>>& params) {
          rlx::reference::TensorMap in, pa;
          for (const auto& [n, a, d] : inputs) in.emplace(n, array_to_tensor(a, ir::parse_dtype(d)));
          for (const auto& [n, a, d] : params) pa.emplace(n, array_to_tensor(a, ir::parse_dtype(d)));
          nb::list outs;
          for (const auto& t : rlx::reference::run(g, in, pa)) outs.append(tensor_to_array(t));
          return outs;
        });

  m.def("quantize_graph",
        [](const ir::Graph& g, const std::vector<std::tuple<std::string, AnyArray, std::string>>& params,
           const std::vector<std::vector<std::tuple<std::string, AnyArray, std::string>>>& batches,
           const std::string& device, const std::string& calibration, double percentile) {
          rlx::reference::TensorMap pa;
          for (const auto& [n, a, d] : params) pa.emplace(n, array_to_tensor(a, ir::parse_dtype(d)));
          std::vector<rlx::reference::TensorMap> bs;
          for (const auto& b : batches) {
            auto& in = bs.emplace_back();
            for (const auto& [n, a, d] : b) in.emplace(n, array_to_tensor(a, ir::parse_dtype(d)));
          }
          rlx::compile::QuantizeOptions o;
          if (calibration == "percentile")
            o.calibration = rlx::compile::Calibration::Percentile;
          else if (calibration == "mse")
            o.calibration = rlx::compile::Calibration::Mse;
          else if (calibration != "minmax")
            throw rlx::Error("quantize_graph: calibration '" + calibration + "': expected minmax, percentile or mse");
          o.percentile = percentile;
          const auto traits = rlx::runtime::make_backend(rlx::runtime::parse_device(device))->traits();
          auto q = rlx::compile::quantize(g, pa, bs, traits, o);
          nb::dict values;
          for (const auto& [n, t] : q.params) values[nb::str(n.c_str())] = tensor_to_array(t);
          nb::list report;
          for (const auto& e : q.report)
            report.append(
                nb::make_tuple(e.node, std::string(ir::op_name(e.op)), std::string(ir::dtype_name(e.dtype)), e.reason));
          return nb::make_tuple(std::move(q.graph), values, report);
        });

  nb::class_<PyCompiled>(m, "_Compiled")
      .def("set_param", &PyCompiled::set_param)
      .def("run", &PyCompiled::run)
      .def("clone",
           [](const PyCompiled& c) {
             nb::gil_scoped_release release;  // waits for the run lock (see set_param)
             return PyCompiled{c.g.clone()};
           })
      .def("set_active_extent",
           [](PyCompiled& c, const std::string& symbol, std::optional<std::int64_t> extent) {
             nb::gil_scoped_release release;  // waits for the run lock, and may compile (see set_param)
             c.g.set_active_extent(symbol, extent);
           })
      .def("active_extent", [](const PyCompiled& c, const std::string& symbol) { return c.g.active_extent(symbol); })
      .def("ir", [](const PyCompiled& c, const std::string& level) { return c.g.ir(level); })
      .def("summary", [](const PyCompiled& c) { return c.g.compile_result().summary(); })
      .def("set_profiling",
           [](PyCompiled& c, bool on) {
             nb::gil_scoped_release release;  // waits for the run lock (see set_param)
             c.g.set_profiling(on);
           })
      // Lock-free and quick: callable from any thread while another runs this graph with the GIL released.
      .def("cancel", [](PyCompiled& c) { c.g.cancel(); })
      .def(
          "set_run_timeout",
          [](PyCompiled& c, std::optional<double> seconds) {
            if (seconds && !(*seconds > 0))
              throw rlx::Error("set_timeout: seconds must be > 0, or None for no timeout");
            if (!seconds) return c.g.set_run_timeout(std::nullopt);
            c.g.set_run_timeout(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                std::chrono::duration<double>(std::min(*seconds, 1e9))));
          },
          nb::arg("seconds").none())
      .def("kernel_times",
           [](const PyCompiled& c) {
             std::vector<rlx::runtime::KernelTime> times;
             {
               nb::gil_scoped_release release;  // waits for the run lock (see set_param)
               times = c.g.kernel_times();
             }
             nb::list rows;
             for (const auto& t : times) rows.append(nb::make_tuple(t.kernel, t.micros, t.host));
             return rows;
           })
      .def("dispatch_report",
           [](const PyCompiled& c) {
             nb::list rows;
             for (const auto& e : c.g.compile_result().dispatch.entries)
               rows.append(nb::make_tuple(e.hir_node, std::string(ir::op_name(e.op)),
                                          std::string(rlx::compile::dispatch_tier_name(e.tier)), e.reason));
             return rows;
           })
      .def("precision_report",
           [](const PyCompiled& c) {
             nb::list rows;
             for (const auto& e : c.g.compile_result().precision.entries)
               rows.append(nb::make_tuple(e.node, std::string(ir::op_name(e.op)), std::string(ir::dtype_name(e.dtype)),
                                          e.reason));
             return rows;
           })
      .def("memory_plan",
           [](const PyCompiled& c) {
             const auto& lir = c.g.compile_result().lir;
             nb::list slots;
             for (const auto& b : lir.buffers) {
               if (b.role != rlx::compile::BufferRole::Arena || b.root != b.id) continue;
               nb::dict slot;
               slot["buffer"] = b.id;
               slot["name"] = b.name;
               slot["offset"] = b.arena_offset;
               slot["bytes"] = b.nbytes();
               slot["dtype"] = std::string(ir::dtype_name(b.dtype));
               slots.append(slot);
             }
             nb::dict plan;
             plan["arena_bytes"] = lir.memory.arena_bytes;
             plan["naive_bytes"] = lir.memory.naive_bytes;
             plan["views"] = lir.memory.view_count;
             plan["slots"] = slots;
             return plan;
           })
      .def("io", [](const PyCompiled& c) {
        auto conv = [](const std::vector<rlx::CompiledGraph::IoSpec>& specs) {
          nb::list l;
          for (const auto& s : specs) l.append(nb::make_tuple(s.name, std::string(ir::dtype_name(s.dtype)), s.shape));
          return l;
        };
        return nb::make_tuple(conv(c.g.input_specs()), conv(c.g.param_specs()), conv(c.g.output_specs()));
      });

  nb::class_<rlx::Session>(m, "_Session")
      .def("__init__",
           [](rlx::Session* s, const std::string& device) { new (s) rlx::Session(rlx::runtime::parse_device(device)); })
      .def(
          "compile",
          [](const rlx::Session& s, const ir::Graph& g, bool optimize, bool fusion, int num_threads,
             const std::string& dump, const std::map<std::string, std::int64_t>& bind, const std::string& precision,
             bool tf32) {
            rlx::compile::CompileOptions o;
            o.bind.assign(bind.begin(), bind.end());
            o.optimize = optimize;
            o.fusion = fusion;
            o.num_threads = num_threads;
            o.dump = dump;
            o.precision = rlx::compile::parse_precision(precision);
            o.tf32 = tf32;
            return PyCompiled{s.compile(g, o)};
          },
          "graph"_a, "optimize"_a = true, "fusion"_a = true, "num_threads"_a = 0, "dump"_a = "",
          "bind"_a = std::map<std::string, std::int64_t>{}, "precision"_a = "f32", "tf32"_a = false)
      .def_prop_ro("device", [](const rlx::Session& s) { return std::string(rlx::runtime::device_label(s.device())); });

  m.def("available_devices", [] {
    std::vector<std::string> out;
    for (auto d : {rlx::Device::Cpu, rlx::Device::Cuda, rlx::Device::Rocm, rlx::Device::Metal, rlx::Device::Mlx,
                   rlx::Device::Gpu, rlx::Device::Vulkan, rlx::Device::CoreMl, rlx::Device::Tpu})
      if (rlx::runtime::is_available(d)) out.emplace_back(rlx::runtime::device_label(d));
    return out;
  });
  m.def("is_available",
        [](const std::string& name) { return rlx::runtime::is_available(rlx::runtime::parse_device(name)); });
  m.def("parse_device", [](const std::string& name) {
    return std::string(rlx::runtime::device_label(rlx::runtime::parse_device(name)));
  });
  // The op table, for the builders pyrlx generates for ops without a hand-written one (pyrlx/__init__.py).
  m.def("op_table", [] {
    nb::list out;
    for (auto k : ir::kAllOps) {
      const ir::OpDef& d = ir::op_def(k);
      nb::dict e;
      e["name"] = std::string(ir::op_name(k));
      e["class"] = std::string(ir::op_class_name(ir::op_info(k).cls));
      e["doc"] = std::string(d.doc);
      nb::list operands, attrs;
      for (auto o : d.operands) operands.append(std::string(o));
      for (const auto& a : d.attrs) {
        nb::dict spec;
        spec["key"] = std::string(a.key);
        spec["required"] = a.required;
        spec["default"] = a.default_value ? nb::cast(ir::attr_value_str(*a.default_value)) : nb::none();
        attrs.append(spec);
      }
      e["operands"] = operands;
      e["attrs"] = attrs;
      e["formula"] = bool(d.formula);
      out.append(e);
    }
    return out;
  });
  m.def("op_names", [] {
    std::vector<std::string> out;
    for (auto k : ir::kAllOps) out.emplace_back(ir::op_name(k));
    return out;
  });
  bind_train(m);
  bind_extend(m);
  bind_runtime(m);
  bind_llm(m);
  bind_onnx(m);
}
