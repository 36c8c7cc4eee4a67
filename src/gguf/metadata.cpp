// GGUF metadata values: names of types, equality by bits, the typed getters' messages.
#include "rlx/gguf/metadata.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <limits>

#include "rlx/error.hpp"

namespace rlx::gguf {

std::string value_type_name(ValueType t) {
  switch (t) {
    case ValueType::U8: return "u8";
    case ValueType::I8: return "i8";
    case ValueType::U16: return "u16";
    case ValueType::I16: return "i16";
    case ValueType::U32: return "u32";
    case ValueType::I32: return "i32";
    case ValueType::F32: return "f32";
    case ValueType::Bool: return "bool";
    case ValueType::String: return "string";
    case ValueType::Array: return "array";
    case ValueType::U64: return "u64";
    case ValueType::I64: return "i64";
    case ValueType::F64: return "f64";
  }
  return fmt::format("type {}", static_cast<std::uint32_t>(t));
}

std::size_t value_type_size(ValueType t) {
  switch (t) {
    case ValueType::U8:
    case ValueType::I8:
    case ValueType::Bool: return 1;
    case ValueType::U16:
    case ValueType::I16: return 2;
    case ValueType::U32:
    case ValueType::I32:
    case ValueType::F32: return 4;
    case ValueType::U64:
    case ValueType::I64:
    case ValueType::F64: return 8;
    case ValueType::String:
    case ValueType::Array: return 0;
  }
  return 0;
}

namespace detail {
void throw_array_type_error(ValueType expected, ValueType actual) {
  throw Error(fmt::format("gguf: expected an array of {}, found an array of {}", value_type_name(expected),
                          value_type_name(actual)));
}
}  // namespace detail

// ---- Array ----

Array Array::empty(ValueType elem) {
  Array a;
  switch (elem) {
    case ValueType::U8: a.items_.emplace<0>(); break;
    case ValueType::I8: a.items_.emplace<1>(); break;
    case ValueType::U16: a.items_.emplace<2>(); break;
    case ValueType::I16: a.items_.emplace<3>(); break;
    case ValueType::U32: a.items_.emplace<4>(); break;
    case ValueType::I32: a.items_.emplace<5>(); break;
    case ValueType::F32: a.items_.emplace<6>(); break;
    case ValueType::Bool: a.items_.emplace<7>(); break;
    case ValueType::String: a.items_.emplace<8>(); break;
    case ValueType::Array: a.items_.emplace<9>(); break;
    case ValueType::U64: a.items_.emplace<10>(); break;
    case ValueType::I64: a.items_.emplace<11>(); break;
    case ValueType::F64: a.items_.emplace<12>(); break;
    default: throw Error("gguf: no array element type " + value_type_name(elem));
  }
  return a;
}

std::size_t Array::size() const {
  return std::visit([](const auto& v) { return v.size(); }, items_);
}

int Array::depth() const {
  int inner = 0;
  if (const auto* nested = std::get_if<std::vector<Array>>(&items_))
    for (const auto& a : *nested) inner = std::max(inner, a.depth());
  return 1 + inner;
}

namespace {

// Floats compare by their bits: a container round trip must give back the same bytes, NaNs and -0 included.
template <class T>
auto bits(T x) {
  if constexpr (std::is_same_v<T, float>)
    return std::bit_cast<std::uint32_t>(x);
  else
    return std::bit_cast<std::uint64_t>(x);
}

template <class T>
bool same_bits(T a, T b) {
  return bits(a) == bits(b);
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](T x, T y) { return same_bits(x, y); });
}

}  // namespace

bool operator==(const Array& a, const Array& b) {
  if (a.items_.index() != b.items_.index()) return false;
  return std::visit(
      [&](const auto& x) {
        using V = std::decay_t<decltype(x)>;
        const auto& y = std::get<V>(b.items_);
        if constexpr (std::is_same_v<V, std::vector<float>> || std::is_same_v<V, std::vector<double>>)
          return same_bits(x, y);
        else
          return x == y;
      },
      a.items_);
}

// ---- Value ----

std::string Value::type_name() const {
  if (const auto* a = get_if<Array>()) {
    // Nested: "array of array of u32" for as deep as the first element goes.
    std::string name = "array of ";
    const Array* cur = a;
    while (cur->elem_type() == ValueType::Array) {
      name += "array of ";
      const auto& inner = cur->as<Array>();
      if (inner.empty()) return name.substr(0, name.size() - 4);  // "array of array"
      cur = inner.data();
    }
    return name + value_type_name(cur->elem_type());
  }
  return value_type_name(type());
}

bool operator==(const Value& a, const Value& b) {
  if (a.v_.index() != b.v_.index()) return false;
  if (const auto* f = a.get_if<float>()) return same_bits(*f, *b.get_if<float>());
  if (const auto* d = a.get_if<double>()) return same_bits(*d, *b.get_if<double>());
  return a.v_ == b.v_;
}

// ---- Metadata ----

void Metadata::set(std::string key, Value value, std::uint64_t file_offset) {
  if (auto it = index_.find(key); it != index_.end()) {
    entries_[it->second].value = std::move(value);
    entries_[it->second].file_offset = file_offset;
    return;
  }
  index_.emplace(key, entries_.size());
  entries_.push_back({std::move(key), std::move(value), file_offset});
}

void Metadata::add(std::string key, Value value, std::uint64_t file_offset) {
  if (index_.count(key)) throw Error(fmt::format("gguf: duplicate metadata key '{}'", key));
  set(std::move(key), std::move(value), file_offset);
}

bool Metadata::erase(std::string_view key) {
  auto it = index_.find(std::string(key));
  if (it == index_.end()) return false;
  entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(it->second));
  index_.clear();
  for (std::size_t i = 0; i < entries_.size(); ++i) index_.emplace(entries_[i].key, i);
  return true;
}

const KeyValue* Metadata::entry(std::string_view key) const {
  auto it = index_.find(std::string(key));
  return it == index_.end() ? nullptr : &entries_[it->second];
}

const Value* Metadata::find(std::string_view key) const {
  const KeyValue* e = entry(key);
  return e ? &e->value : nullptr;
}

const Value& Metadata::at(std::string_view key) const {
  if (const Value* v = find(key)) return *v;
  throw Error(fmt::format("gguf: metadata has no key '{}'", key));
}

void Metadata::type_error(std::string_view key, const Value& v, std::string_view expected) const {
  const KeyValue* e = entry(key);
  const std::string where = e && e->file_offset ? fmt::format(" (at byte {})", e->file_offset) : "";
  throw Error(fmt::format("gguf: metadata '{}'{}: expected {}, found {}", key, where, expected, v.type_name()));
}

std::int64_t Metadata::get_integer(std::string_view key) const {
  const Value& v = at(key);
  return std::visit(
      [&](const auto& x) -> std::int64_t {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::uint64_t>) {
          if (x > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
            throw Error(fmt::format("gguf: metadata '{}': {} does not fit in int64", key, x));
          return static_cast<std::int64_t>(x);
        } else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
          return static_cast<std::int64_t>(x);
        } else {
          type_error(key, v, "an integer");
        }
      },
      v.storage());
}

double Metadata::get_float(std::string_view key) const {
  const Value& v = at(key);
  if (const auto* f = v.get_if<float>()) return *f;
  if (const auto* d = v.get_if<double>()) return *d;
  type_error(key, v, "f32 or f64");
}

std::optional<std::int64_t> Metadata::find_integer(std::string_view key) const {
  if (!contains(key)) return std::nullopt;
  return get_integer(key);
}

std::optional<std::string> Metadata::find_string(std::string_view key) const {
  if (!contains(key)) return std::nullopt;
  return get_string(key);
}

bool operator==(const Metadata& a, const Metadata& b) {
  return std::equal(a.entries_.begin(), a.entries_.end(), b.entries_.begin(), b.entries_.end(),
                    [](const KeyValue& x, const KeyValue& y) { return x.key == y.key && x.value == y.value; });
}

}  // namespace rlx::gguf
