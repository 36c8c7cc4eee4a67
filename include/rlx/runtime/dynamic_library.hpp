#pragma once
// Shared libraries opened with dlopen at run time, as IREE's dynamic_symbols
// does: no link-time dependency on a vendor library (CUDA, NCCL), and a machine
// without it reports the feature unavailable instead of failing to load librlx.
// Users: the CUDA backend (driver, NVRTC, cuBLASLt) and rlx::distributed (NCCL).
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "rlx/error.hpp"

namespace rlx::runtime {

// A shared library, open for as long as the value lives.
class Library {
 public:
  Library() = default;
  // The first of `names` that dlopen finds; `why` collects each failure. Empty when none opened.
  static Library open(std::initializer_list<const char*> names, std::string* why);
  ~Library();
  Library(Library&& o) noexcept : handle_(o.handle_), name_(std::move(o.name_)) { o.handle_ = nullptr; }
  Library& operator=(Library&& o) noexcept;
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;
  explicit operator bool() const { return handle_ != nullptr; }
  const std::string& name() const { return name_; }
  void* symbol(const char* name) const;  // nullptr when missing

 private:
  void* handle_ = nullptr;
  std::string name_;
};

// Looks `name` up in `lib` into the function pointer `fn`; a missing symbol is appended to `missing`.
template <class F>
void load_symbol(const Library& lib, F& fn, const char* name, std::string& missing) {
  fn = reinterpret_cast<F>(lib.symbol(name));
  if (!fn) missing += (missing.empty() ? "" : ", ") + std::string(name);
}

// Opens the first of `names` into `lib`; empty, or "`what` (dlopen's reasons)".
std::string open_library(Library& lib, std::initializer_list<const char*> names, std::string_view what);

// `T` loaded once per process (per `T`) by `load`, which fills it and returns why it is unusable (empty: usable).
// Never destroyed: kernels and collectives may run from static destructors' threads. Throws rlx::Error
// "<prefix>: <why>" while unusable.
template <class T, class Load>
const T& load_once(std::string_view prefix, Load load) {
  static const auto* state = [&] {
    auto* s = new std::pair<T, std::string>();
    s->second = load(s->first);
    return s;
  }();
  if (!state->second.empty()) throw Error(std::string(prefix) + ": " + state->second);
  return state->first;
}

}  // namespace rlx::runtime
