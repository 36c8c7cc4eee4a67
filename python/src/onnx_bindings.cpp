// pyrlx bindings for ONNX import: rlx.import_onnx returns an rlx.Graph whose params carry the model's
// weights, so it compiles and runs like any other graph.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "convert.hpp"
#include "rlx/onnx/onnx.hpp"

namespace nb = nanobind;
using namespace nb::literals;
namespace ir = rlx::ir;

void bind_onnx(nb::module_& m) {
  // (graph, {param name: array}, report rows, opsets); python/pyrlx/__init__.py wraps it as rlx.import_onnx.
  m.def(
      "_import_onnx",
      [](const std::filesystem::path& path, const std::map<std::string, std::int64_t>& dims,
         const std::map<std::string, std::vector<std::int64_t>>& input_shapes, std::int64_t max_constant_elements) {
        rlx::onnx::ImportOptions o;
        o.dims.insert(dims.begin(), dims.end());
        o.input_shapes.insert(input_shapes.begin(), input_shapes.end());
        o.max_constant_elements = max_constant_elements;
        auto model = rlx::onnx::import(path, std::move(o));
        nb::dict params;
        for (const auto& [name, value] : model.params) params[name.c_str()] = pyrlx::tensor_to_array(value);
        nb::list report;
        for (const auto& r : model.report) {
          const char* fate = r.fate == rlx::onnx::NodeReport::Fate::Mapped   ? "mapped"
                             : r.fate == rlx::onnx::NodeReport::Fate::Folded ? "folded"
                                                                             : "unsupported";
          report.append(nb::make_tuple(r.name, r.op_type, fate, r.detail));
        }
        nb::dict opsets;
        for (const auto& [d, v] : model.opsets) opsets[d.c_str()] = v;
        return nb::make_tuple(std::move(model.graph), params, report, opsets);
      },
      "path"_a, "dims"_a, "input_shapes"_a, "max_constant_elements"_a);
  m.def("onnx_supported_ops", &rlx::onnx::supported_ops, "The ONNX op types (default domain) rlx.import_onnx maps.");
}
