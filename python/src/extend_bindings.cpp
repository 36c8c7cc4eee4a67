// rlx.register_op: a Python-defined custom op. Its callables are held by
// leaked references: the registries are process-wide statics that outlive the
// interpreter, so they must never drop a Python reference at exit.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <mutex>

#include "convert.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/custom_op.hpp"
#include "rlx/runtime/custom_kernels.hpp"

namespace nb = nanobind;
namespace ir = rlx::ir;

namespace {

nb::object* keep(nb::object o) { return o.is_none() ? nullptr : new nb::object(std::move(o)); }

// Every PyOp's Python callables, released at interpreter exit (pyrlx registers
// the atexit hook): the registry holding the ops outlives Python, and
// references it still held would be reported as leaks by nanobind.
std::mutex live_ops_mutex;
std::vector<nb::object**> live_callables;

nb::dict attrs_to_dict(const ir::Attrs& attrs) {
  nb::dict d;
  for (const auto& [k, v] : attrs.items()) {
    if (k == "op") continue;
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, ir::DType>)
            d[k.c_str()] = std::string(ir::dtype_name(x));
          else if constexpr (!std::is_same_v<T, ir::GraphRef>)
            d[k.c_str()] = x;  // custom ops take no bodies
        },
        v);
  }
  return d;
}

using pyrlx::shape_tuple;
using pyrlx::to_shape;

// Python exceptions from user callables become rlx::Error with their message.
template <class F>
auto guarded(std::string_view what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (nb::python_error& e) {
    throw rlx::Error(std::string(what) + ": " + e.what());
  } catch (nb::cast_error& e) {
    throw rlx::Error(std::string(what) + ": returned a value of the wrong type (" + e.what() + ")");
  }
}

class PyOp final : public ir::OpExtension {
 public:
  PyOp(std::string name, int n_in, std::vector<ir::AttrSpec> schema, std::vector<std::string> keys, nb::object infer,
       nb::object lower, nb::object kernel, nb::object wrap_lower, nb::object call_kernel)
      : name_(std::move(name)),
        n_in_(n_in),
        keys_(std::move(keys)),
        schema_(std::move(schema)),
        infer_(keep(std::move(infer))),
        lower_(keep(std::move(lower))),
        kernel_(keep(std::move(kernel))),
        wrap_lower_(keep(std::move(wrap_lower))),
        call_kernel_(keep(std::move(call_kernel))) {
    for (std::size_t i = 0; i < schema_.size(); ++i) schema_[i].key = keys_[i];  // keys_ owns the strings
    std::lock_guard lock(live_ops_mutex);
    for (auto** p : {&infer_, &lower_, &kernel_, &wrap_lower_, &call_kernel_}) live_callables.push_back(p);
  }
  std::string_view name() const override { return name_; }
  int num_inputs() const override { return n_in_; }
  std::vector<ir::AttrSpec> attr_schema() const override { return schema_; }

  ir::TypeInfo infer(std::span<const ir::TypeInfo> in, const ir::Attrs& attrs) const override {
    nb::gil_scoped_acquire gil;
    return guarded("infer_shape of custom op '" + name_ + "'", [&] {
      nb::list shapes, dtypes;
      for (const auto& t : in) {
        shapes.append(shape_tuple(t.shape));
        dtypes.append(std::string(ir::dtype_name(t.dtype)));
      }
      if (!infer_) throw rlx::Error("its Python functions were released at interpreter exit");
      nb::object r = (*infer_)(shapes, dtypes, attrs_to_dict(attrs));
      // Either a shape (dtype of the first input) or (shape, dtype).
      if (nb::isinstance<nb::tuple>(r) && nb::len(r) == 2 && nb::isinstance<nb::str>(r[1]))
        return ir::TypeInfo{ir::parse_dtype(nb::cast<std::string>(r[1])), to_shape(r[0])};
      if (in.empty()) throw rlx::Error("infer_shape must return (shape, dtype) for an op without inputs");
      return ir::TypeInfo{in[0].dtype, to_shape(r)};
    });
  }

  std::optional<ir::NodeId> lower(ir::Graph& g, std::span<const ir::NodeId> in, const ir::Attrs& attrs) const override {
    if (!lower_) return std::nullopt;
    nb::gil_scoped_acquire gil;
    return guarded("lower of custom op '" + name_ + "'", [&] {
      std::vector<ir::NodeId> ids(in.begin(), in.end());
      nb::object native = nb::cast(&g, nb::rv_policy::reference);
      return nb::cast<ir::NodeId>((*wrap_lower_)(*lower_, native, ids, attrs_to_dict(attrs)));
    });
  }

  std::optional<ir::Tensor> reference(std::span<const ir::Tensor> in, const ir::Attrs& attrs,
                                      const ir::TypeInfo& out) const override {
    if (!kernel_) return std::nullopt;
    std::vector<ir::TensorView> views;
    for (const auto& t : in) views.push_back(ir::view(t));
    ir::Tensor result(out.dtype, out.shape.extents());
    run_kernel(views, {result.dtype(), result.shape(), result.data(), result.nbytes()}, attrs);
    return result;
  }

  void run_kernel(std::span<const ir::TensorView> in, const ir::MutableTensorView& out, const ir::Attrs& attrs) const {
    nb::gil_scoped_acquire gil;
    guarded("cpu_kernel of custom op '" + name_ + "'", [&] {
      nb::list arrays;
      for (const auto& v : in) {
        std::vector<std::int64_t> shape(v.shape.begin(), v.shape.end());
        arrays.append(nb::make_tuple(nb::bytes(static_cast<const char*>(v.data), v.nbytes),
                                     std::string(ir::dtype_name(v.dtype)), shape));
      }
      std::vector<std::int64_t> oshape(out.shape.begin(), out.shape.end());
      // The Python side converts the result to the output's dtype and checks its shape.
      nb::bytes r =
          nb::cast<nb::bytes>(!kernel_ ? throw rlx::Error("its Python functions were released at interpreter exit")
                                       : (*call_kernel_)(*kernel_, arrays, oshape,
                                                         std::string(ir::dtype_name(out.dtype)), attrs_to_dict(attrs)));
      if (r.size() != out.nbytes)
        throw rlx::Error("the result has " + std::to_string(r.size()) + " bytes, the output needs " +
                         std::to_string(out.nbytes));
      std::memcpy(out.data, r.c_str(), r.size());
      return 0;
    });
  }
  bool has_kernel() const { return kernel_ != nullptr; }

 private:
  std::string name_;
  int n_in_;
  std::vector<std::string> keys_;
  std::vector<ir::AttrSpec> schema_;
  nb::object *infer_, *lower_, *kernel_, *wrap_lower_, *call_kernel_;
};

}  // namespace

void bind_extend(nb::module_& m) {
  m.def(
      "_register_op",
      [](const std::string& name, int n_in, const std::vector<std::pair<std::string, std::string>>& attrs,
         nb::object infer, nb::object lower, nb::object kernel, nb::object wrap_lower, nb::object call_kernel) {
        std::vector<ir::AttrSpec> schema;
        std::vector<std::string> keys;
        for (const auto& [key, type] : attrs) {
          ir::AttrType t = type == "int"     ? ir::AttrType::Int
                           : type == "float" ? ir::AttrType::Float
                           : type == "bool"  ? ir::AttrType::Bool
                           : type == "str"   ? ir::AttrType::String
                           : type == "ints"  ? ir::AttrType::Ints
                           : type == "dtype"
                               ? ir::AttrType::DType
                               : throw rlx::Error("register_op: attribute '" + key + "' has unknown type '" + type +
                                                  "' (int, float, bool, str, ints, dtype)");
          keys.push_back(key);
          schema.push_back({"", t, true});
        }
        auto op =
            std::make_shared<PyOp>(name, n_in, std::move(schema), std::move(keys), std::move(infer), std::move(lower),
                                   std::move(kernel), std::move(wrap_lower), std::move(call_kernel));
        ir::register_op(op);
        if (op->has_kernel()) {
          // The extension lives as long as the process (the registry holds it).
          const PyOp* raw = op.get();
          rlx::runtime::register_host_kernel(
              name, [raw](std::span<const ir::TensorView> in, const ir::MutableTensorView& out, const ir::Attrs& a) {
                raw->run_kernel(in, out, a);
              });
        }
      },
      nb::arg("name"), nb::arg("num_inputs"), nb::arg("attrs"), nb::arg("infer"), nb::arg("lower").none(),
      nb::arg("kernel").none(), nb::arg("wrap_lower"), nb::arg("call_kernel"));
  m.def("is_op_registered", [](const std::string& name) { return ir::is_op_registered(name); });
  // Called at interpreter exit; a custom op used after it reports that its Python side is gone.
  m.def("_release_python_ops", [] {
    std::lock_guard lock(live_ops_mutex);
    for (auto** p : live_callables) {
      delete *p;
      *p = nullptr;
    }
    live_callables.clear();
  });
}
