#pragma once
// Generated C, built and loaded: rlx::codegen::c sources are written into a
// fresh temporary folder, compiled with the system C compiler (strict C99,
// warnings as errors) into one shared object, loaded with dlopen and called
// into outputs the test provides. Shared by the C codegen tests and the
// op-parity suite's C executor, which builds all variants of one op as one
// module so that one `cc` run serves them all.
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "rlx/codegen/c.hpp"
#include "rlx/error.hpp"
#include "rlx/reference/interpreter.hpp"

namespace rlx::testing {

// The system compiler by its POSIX name; RLX reads no environment outside its
// catalog (src/ir/env.cpp), so there is no $CC override.
inline const std::string& c_compiler() {
  static const std::string cc = "cc";
  return cc;
}

inline bool have_c_compiler() {
  static const bool ok = std::system((c_compiler() + " --version > /dev/null 2>&1").c_str()) == 0;
  return ok;
}

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Generated functions built into one shared object. The module also emits a
// tiny driver, rlx_test_entry<i>(void** args), that calls function i with the
// pointers in signature order. The functions' names must differ.
class CModule {
 public:
  // `optimize` is the compiler's -O flag: the codegen tests build at -O2 (the
  // emitted code must stay within C's aliasing rules there), the op-parity
  // suite at -O1 to keep its one build per op fast.
  explicit CModule(std::vector<codegen::c::Source> sources, std::string optimize = "-O2") : srcs_(std::move(sources)) {
    namespace fs = std::filesystem;
    static std::atomic<int> counter{0};
    dir_ = fs::temp_directory_path() / ("rlx_codegen_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) +
                                        "_" + (srcs_.empty() ? "" : srcs_[0].function_name));
    fs::create_directories(dir_);
    std::ofstream driver(dir_ / "driver.c");
    std::string files;
    for (std::size_t k = 0; k < srcs_.size(); ++k) {
      const codegen::c::Source& src = srcs_[k];
      codegen::c::write(src, dir_);
      files += " '" + src.source_file + "'";
      std::size_t n = src.inputs.size() + src.params.size() + src.outputs.size() +
                      (src.workspace == codegen::c::WorkspaceMode::Caller ? 1 : 0);
      std::string call, entry = "rlx_test_entry" + std::to_string(k);
      for (std::size_t i = 0; i < n; ++i) call += (i ? ", a[" : "a[") + std::to_string(i) + "]";
      driver << "#include \"" << src.header_file << "\"\n"
             << "void " << entry << "(void** a);\n"
             << "void " << entry << "(void** a) { " << src.function_name << "(" << call << "); }\n";
    }
    driver.close();
    // One compiler run compiles every file and links them.
    std::string compile = "cd '" + dir_.string() + "' && " + c_compiler() +
                          " -std=c99 -pedantic -Wall -Wextra -Werror " + optimize + " -fPIC -shared -o gen.so" + files +
                          " driver.c -lm > cc.log 2>&1";
    if (std::system(compile.c_str()) != 0) {
      error_ = "C compiler failed (sources kept in " + dir_.string() + "):\n" + slurp(dir_ / "cc.log");
      std::size_t total = 0;
      for (const auto& src : srcs_) total += src.source.size();
      if (total < 30000)
        for (const auto& src : srcs_) error_ += "\n--- " + src.source_file + " ---\n" + src.source;
      return;
    }
    handle_ = ::dlopen((dir_ / "gen.so").c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle_) {
      error_ = std::string("dlopen: ") + ::dlerror();
      return;
    }
    for (std::size_t k = 0; k < srcs_.size(); ++k) {
      std::string entry = "rlx_test_entry" + std::to_string(k);
      entries_.push_back(reinterpret_cast<void (*)(void**)>(::dlsym(handle_, entry.c_str())));
      if (!entries_.back()) error_ = entry + " not found";
    }
  }
  explicit CModule(codegen::c::Source source, std::string optimize = "-O2")
      : CModule(std::vector<codegen::c::Source>{std::move(source)}, std::move(optimize)) {}
  ~CModule() {
    if (handle_) ::dlclose(handle_);
    std::error_code ec;
    if (error_.empty()) std::filesystem::remove_all(dir_, ec);  // kept for inspection when the build failed
  }
  CModule(const CModule&) = delete;
  CModule& operator=(const CModule&) = delete;

  // Empty once the module is built and loaded; otherwise what went wrong.
  const std::string& error() const { return error_; }
  std::size_t size() const { return srcs_.size(); }
  const codegen::c::Source& source(std::size_t k = 0) const { return srcs_.at(k); }

  // Calls function k with `inputs` and `params` by name into `outputs`, which
  // must have the declared dtypes and shapes; rlx::Error when they do not.
  // `params` is unused when the module bakes them.
  void run_into(std::size_t k, const reference::TensorMap& inputs, const reference::TensorMap& params,
                std::vector<ir::Tensor>& outputs) {
    if (!error_.empty()) throw Error("CModule: " + error_);
    const codegen::c::Source& src = srcs_.at(k);
    std::vector<void*> args;
    auto check = [](const codegen::c::Arg& a, const ir::Tensor& t) {
      if (t.dtype() != a.dtype || t.shape() != a.shape)
        throw Error("CModule: '" + a.name + "' is declared " + std::string(ir::dtype_name(a.dtype)) +
                    ir::Shape(a.shape).str() + " but given " + std::string(ir::dtype_name(t.dtype())) +
                    ir::Shape(t.shape()).str());
    };
    auto feed = [&](const std::vector<codegen::c::Arg>& specs, const reference::TensorMap& values) {
      for (const auto& a : specs) {
        auto it = values.find(a.name);
        if (it == values.end()) throw Error("CModule: no value for '" + a.name + "'");
        check(a, it->second);
        args.push_back(const_cast<std::byte*>(it->second.data()));
      }
    };
    feed(src.inputs, inputs);
    feed(src.params, params);
    if (outputs.size() != src.outputs.size())
      throw Error("CModule: " + std::to_string(outputs.size()) + " outputs given, " + src.function_name + " has " +
                  std::to_string(src.outputs.size()));
    for (std::size_t j = 0; j < outputs.size(); ++j) {
      check(src.outputs[j], outputs[j]);
      args.push_back(outputs[j].data());
    }
    std::vector<std::max_align_t> workspace(std::size_t(src.workspace_bytes) / sizeof(std::max_align_t) + 1);
    if (src.workspace == codegen::c::WorkspaceMode::Caller) args.push_back(workspace.data());
    entries_.at(k)(args.data());
  }

  // Function 0 into fresh outputs, poisoned (all bits set: NaN for floats, -1
  // for integers) so an element the code never writes cannot pass.
  std::vector<ir::Tensor> run(const reference::TensorMap& inputs, const reference::TensorMap& params = {}) {
    std::vector<ir::Tensor> outs;
    for (const auto& a : source(0).outputs) {
      outs.emplace_back(a.dtype, a.shape);
      std::fill(outs.back().data(), outs.back().data() + outs.back().nbytes(), std::byte{0xff});
    }
    run_into(0, inputs, params, outs);
    return outs;
  }

 private:
  std::vector<codegen::c::Source> srcs_;
  std::filesystem::path dir_;
  void* handle_ = nullptr;
  std::vector<void (*)(void**)> entries_;
  std::string error_;
};

}  // namespace rlx::testing
