#pragma once
// Every RLX_* environment variable RLX reads is declared once, in the table in
// src/ir/env.cpp, with its type, default and a doc line. `rlx env` prints the
// catalog and docs/env-vars.md is generated from it (a test fails on drift).
// Reading a variable that is not declared is a programming error (assert);
// a malformed value is a user error: rlx::Error naming the variable.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rlx::env {

enum class Type { String, Int, Bool, List };

struct Var {
  std::string_view name;
  Type type;
  std::string_view default_value;  // as it would be written in the environment; empty = unset
  std::string_view doc;
};

const std::vector<Var>& catalog();

// The raw value, or nullopt when unset or empty.
std::optional<std::string> get(std::string_view name);
// Typed readers: throw rlx::Error naming the variable on a malformed value.
std::optional<long long> get_int(std::string_view name);
bool get_bool(std::string_view name);  // 1/true/yes/on vs 0/false/no/off; unset = the declared default
std::vector<std::string> get_list(std::string_view name);  // comma separated, trimmed

// The same variable read under another prefix: get_list("RLX_DEVICES", "MYAPP")
// reads MYAPP_DEVICES, with RLX_DEVICES's type and default; errors name
// MYAPP_DEVICES. For applications that give RLX settings their own names.
std::optional<std::string> get(std::string_view name, std::string_view prefix);
std::optional<long long> get_int(std::string_view name, std::string_view prefix);
bool get_bool(std::string_view name, std::string_view prefix);
std::vector<std::string> get_list(std::string_view name, std::string_view prefix);

// While alive, every reader sees `value` for `name` (nullopt: unset) instead of
// the process environment, without touching the environment itself. Overrides
// nest and undo in reverse order. For tests and for hosts that configure RLX
// in code; not meant to be changed from several threads at once.
class ScopedOverride {
 public:
  ScopedOverride(std::string name, std::optional<std::string> value);
  ~ScopedOverride();
  ScopedOverride(const ScopedOverride&) = delete;
  ScopedOverride& operator=(const ScopedOverride&) = delete;

 private:
  std::string name_;
};

std::string catalog_markdown();

}  // namespace rlx::env
