// pyrlx bindings for GGUF files and the Llama model: rlx.load_gguf and the
// model under rlx.LLM (pyrlx/llm.py). Metadata comes back as Python values,
// tensors as numpy arrays (dequantized to float32, or the raw block bytes).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <memory>

#include "convert.hpp"
#include "rlx/gguf/gguf.hpp"
#include "rlx/gguf/quants.hpp"
#include "rlx/gguf/requantize.hpp"
#include "rlx/llm/llm.hpp"
#include "rlx/llm/model.hpp"

namespace nb = nanobind;
using namespace nb::literals;
namespace ir = rlx::ir;
namespace gguf = rlx::gguf;
namespace llm = rlx::llm;

namespace {

nb::object to_python(const gguf::Array& a);

nb::object to_python(const gguf::Value& v) {
  return std::visit(
      [](const auto& x) -> nb::object {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, gguf::Array>)
          return to_python(x);
        else if constexpr (std::is_same_v<T, std::string>)
          return nb::str(x.data(), x.size());
        else
          return nb::cast(x);
      },
      v.storage());
}

nb::object to_python(const gguf::Array& a) {
  return std::visit(
      [](const auto& items) -> nb::object {
        nb::list out;
        for (const auto& x : items) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, gguf::Array>)
            out.append(to_python(x));
          else if constexpr (std::is_same_v<T, std::string>)
            out.append(nb::str(x.data(), x.size()));
          else
            out.append(nb::cast(static_cast<T>(x)));
        }
        return out;
      },
      a.storage());
}

// A parsed file shared with the arrays that view it.
struct PyGguf {
  std::shared_ptr<const gguf::File> file;
};

nb::object tensor(const PyGguf& g, const std::string& name, bool dequantize) {
  const gguf::TensorView t = g.file->tensor(name);
  std::vector<std::int64_t> shape(t.info->dims.rbegin(), t.info->dims.rend());  // numpy's row-major view
  if (!dequantize) {
    ir::Tensor raw(ir::DType::U8, {std::int64_t(t.bytes.size())}, t.bytes);
    return pyrlx::tensor_to_array(raw);
  }
  ir::Tensor out(ir::DType::F32, shape);
  {
    nb::gil_scoped_release unlocked;
    gguf::dequantize(t.info->type, t.bytes, {out.data_as<float>(), std::size_t(out.numel())});
  }
  return pyrlx::tensor_to_array(out);
}

}  // namespace

void bind_llm(nb::module_& m) {
  nb::class_<PyGguf>(m, "GgufFile",
                     "A GGUF file, mapped read-only: .metadata (dict), .tensors (name, type, shape), .tensor(name)")
      .def_prop_ro("version", [](const PyGguf& g) { return g.file->version(); })
      .def_prop_ro("alignment", [](const PyGguf& g) { return g.file->alignment(); })
      .def_prop_ro("metadata",
                   [](const PyGguf& g) {
                     nb::dict d;
                     for (const auto& kv : g.file->metadata().entries())
                       d[nb::str(kv.key.c_str())] = to_python(kv.value);
                     return d;
                   })
      .def_prop_ro("tensors",
                   [](const PyGguf& g) {
                     nb::list out;
                     for (const auto& t : g.file->tensors()) {
                       std::vector<std::int64_t> shape(t.dims.rbegin(), t.dims.rend());
                       out.append(nb::make_tuple(t.name, std::string(t.type_info().name), nb::cast(shape)));
                     }
                     return out;
                   })
      .def("tensor", &tensor, "name"_a, "dequantize"_a = true,
           "The tensor as a float32 array in numpy's row-major shape (dequantize=False: its raw bytes, uint8)");
  m.def(
      "load_gguf",
      [](const std::filesystem::path& path) { return PyGguf{std::make_shared<gguf::File>(gguf::File::open(path))}; },
      "path"_a, "Opens and checks a GGUF file (rlx.Error naming the field and byte offset if it is malformed).");

  m.def(
      "quantize",
      [](const std::filesystem::path& in, const std::filesystem::path& out, const std::string& type) {
        auto t = gguf::parse_ggml_type(type);
        if (!t) throw rlx::Error("quantize: unknown type '" + type + "'");
        gguf::RequantizeReport r;
        {
          nb::gil_scoped_release unlocked;
          r = gguf::requantize(in, out, *t);
        }
        nb::dict d;
        for (const auto& [k, v] : r.tensors_per_type) d[nb::str(k.c_str())] = v;
        return d;
      },
      "in_path"_a, "out_path"_a, "qtype"_a,
      "Rewrites a GGUF model with its weights in qtype (Q8_0, Q4_0, Q4_K, ...; docs/gguf.md, `rlx quantize`); "
      "returns the written file's tensor count per type.");

  nb::class_<llm::LlamaModel>(m, "_LlamaModel")
      .def_static(
          "load",
          [](const std::filesystem::path& path, std::int64_t context, std::int64_t prefill_chunk, bool exact) {
            nb::gil_scoped_release unlocked;
            return llm::LlamaModel::load(path, {.context = context, .prefill_chunk = prefill_chunk, .exact = exact});
          },
          "path"_a, "context"_a = 0, "prefill_chunk"_a = 64, "exact"_a = false)
      .def_prop_ro("vocab", [](const llm::LlamaModel& m) { return m.config().vocab; })
      .def_prop_ro("context", &llm::LlamaModel::context)
      .def_prop_ro("position", &llm::LlamaModel::position)
      .def("reset", &llm::LlamaModel::reset)
      .def(
          "forward",
          [](llm::LlamaModel& m, const std::vector<std::int32_t>& ids, bool all_positions) {
            std::vector<float> logits;
            {
              nb::gil_scoped_release unlocked;
              logits = m.forward(ids, all_positions);
            }
            const std::int64_t vocab = m.config().vocab, rows = std::int64_t(logits.size()) / vocab;
            std::vector<std::int64_t> shape =
                all_positions ? std::vector<std::int64_t>{rows, vocab} : std::vector<std::int64_t>{vocab};
            return pyrlx::tensor_to_array(ir::Tensor::from_f32(shape, logits));
          },
          "ids"_a, "all_positions"_a = true);

  nb::class_<llm::Generation>(m, "_Generation")
      .def("next",
           [](llm::Generation& g) {
             std::optional<std::int32_t> id;
             {
               nb::gil_scoped_release unlocked;
               id = g.next();
             }
             return id;
           })
      .def_prop_ro("text", [](const llm::Generation& g) { return g.text(); })
      .def_prop_ro("prompt_tokens", [](const llm::Generation& g) { return g.stats().prompt_tokens; })
      .def_prop_ro("generated_tokens", [](const llm::Generation& g) { return g.stats().generated_tokens; })
      .def_prop_ro("prefill_tokens_per_s", [](const llm::Generation& g) { return g.stats().prefill_tokens_per_s(); })
      .def_prop_ro("decode_tokens_per_s", [](const llm::Generation& g) { return g.stats().decode_tokens_per_s(); });

  nb::class_<llm::Llm>(m, "_Llm")
      .def_static(
          "load",
          [](const std::filesystem::path& path, std::int64_t context, bool exact) {
            nb::gil_scoped_release unlocked;
            return llm::Llm::load(path, {.context = context, .exact = exact});
          },
          "path"_a, "context"_a = 0, "exact"_a = false)
      .def("tokenize", &llm::Llm::tokenize, "text"_a, "add_special"_a = true)
      .def("detokenize", [](const llm::Llm& l, const std::vector<std::int32_t>& ids) { return l.detokenize(ids); })
      .def("chat_prompt",
           [](const llm::Llm& l, const std::vector<std::pair<std::string, std::string>>& messages) {
             std::vector<llm::ChatMessage> m;
             for (const auto& [role, content] : messages) m.push_back({role, content});
             return l.chat_prompt(m);
           })
      .def_prop_ro("vocab", [](llm::Llm& l) { return l.model().config().vocab; })
      .def_prop_ro("context", [](llm::Llm& l) { return l.model().context(); })
      .def_prop_ro("eog_ids", [](const llm::Llm& l) { return l.tokenizer().eog_ids(); })
      .def(
          "start",
          [](llm::Llm& l, const std::vector<std::int32_t>& ids, std::int32_t max_tokens, float temperature,
             std::int32_t top_k, float top_p, float min_p, float repeat_penalty, std::uint64_t seed, bool stop) {
            llm::GenerateOptions o{.max_tokens = max_tokens, .stop_at_end_of_generation = stop};
            o.sampling = {.temperature = temperature,
                          .top_k = top_k,
                          .top_p = top_p,
                          .min_p = min_p,
                          .repeat_penalty = repeat_penalty,
                          .seed = seed};
            nb::gil_scoped_release unlocked;
            return l.start(ids, o);
          },
          "ids"_a, "max_tokens"_a, "temperature"_a, "top_k"_a, "top_p"_a, "min_p"_a, "repeat_penalty"_a, "seed"_a,
          "stop_at_end"_a, nb::keep_alive<0, 1>())
      .def("logits", [](llm::Llm& l, const std::vector<std::int32_t>& ids) {
        std::vector<float> logits;
        {
          nb::gil_scoped_release unlocked;
          logits = l.logits(ids);
        }
        const std::int64_t vocab = l.model().config().vocab;
        return pyrlx::tensor_to_array(ir::Tensor::from_f32({std::int64_t(ids.size()), vocab}, logits));
      });
}
