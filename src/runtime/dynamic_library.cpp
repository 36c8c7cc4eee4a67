#include "rlx/runtime/dynamic_library.hpp"

#include <dlfcn.h>

namespace rlx::runtime {

Library Library::open(std::initializer_list<const char*> names, std::string* why) {
  Library lib;
  for (const char* n : names) {
    dlerror();
    if (void* h = dlopen(n, RTLD_NOW | RTLD_LOCAL)) {
      lib.handle_ = h;
      lib.name_ = n;
      return lib;
    }
    const char* err = dlerror();
    if (why) *why += (why->empty() ? "" : "; ") + std::string(err ? err : n);
  }
  return lib;
}

Library::~Library() {
  if (handle_) dlclose(handle_);
}

Library& Library::operator=(Library&& o) noexcept {
  if (this != &o) {
    if (handle_) dlclose(handle_);
    handle_ = o.handle_;
    name_ = std::move(o.name_);
    o.handle_ = nullptr;
  }
  return *this;
}

void* Library::symbol(const char* name) const { return handle_ ? dlsym(handle_, name) : nullptr; }

std::string open_library(Library& lib, std::initializer_list<const char*> names, std::string_view what) {
  std::string why;
  lib = Library::open(names, &why);
  return lib ? std::string() : std::string(what) + " (" + why + ")";
}

}  // namespace rlx::runtime
