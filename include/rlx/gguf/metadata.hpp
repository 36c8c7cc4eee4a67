#pragma once
// GGUF metadata: typed key-value pairs in file order (docs/gguf.md).
//
// A Value holds one of GGUF's thirteen value types; the alternatives of its
// variant are in the order of GGUF's type ids, so `type()` is the id the file
// stores. An Array holds elements of one type, arrays included (nested
// arrays), in a vector of that type. Values own their data: metadata is small
// next to the tensors (1.7 MB of tokenizer strings for SmolLM2), and owning it
// lets the reader and the writer share one type and lets `==` be the
// round-trip check. Floats compare by their bits, so a NaN written reads back
// equal to itself.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace rlx::gguf {

// GGUF's metadata value types (gguf_metadata_value_type), ids as in the file.
enum class ValueType : std::uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  Bool = 7,
  String = 8,
  Array = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};
inline constexpr std::uint32_t kValueTypeCount = 13;

// "u32", "string", "array"...; "type 42" for an id outside the enum.
std::string value_type_name(ValueType t);
// The size in the file of one value of a fixed-size type; 0 for string and array.
std::size_t value_type_size(ValueType t);

class Array;

namespace detail {
template <class T>
inline constexpr bool kIsScalar =
    std::is_same_v<T, std::uint8_t> || std::is_same_v<T, std::int8_t> || std::is_same_v<T, std::uint16_t> ||
    std::is_same_v<T, std::int16_t> || std::is_same_v<T, std::uint32_t> || std::is_same_v<T, std::int32_t> ||
    std::is_same_v<T, float> || std::is_same_v<T, bool> || std::is_same_v<T, std::uint64_t> ||
    std::is_same_v<T, std::int64_t> || std::is_same_v<T, double>;
[[noreturn]] void throw_array_type_error(ValueType expected, ValueType actual);
}  // namespace detail

// The ValueType of a C++ type: value_type_of<std::uint32_t> == ValueType::U32.
template <class T>
constexpr ValueType value_type_of() {
  if constexpr (std::is_same_v<T, std::uint8_t>) return ValueType::U8;
  if constexpr (std::is_same_v<T, std::int8_t>) return ValueType::I8;
  if constexpr (std::is_same_v<T, std::uint16_t>) return ValueType::U16;
  if constexpr (std::is_same_v<T, std::int16_t>) return ValueType::I16;
  if constexpr (std::is_same_v<T, std::uint32_t>) return ValueType::U32;
  if constexpr (std::is_same_v<T, std::int32_t>) return ValueType::I32;
  if constexpr (std::is_same_v<T, float>) return ValueType::F32;
  if constexpr (std::is_same_v<T, bool>) return ValueType::Bool;
  if constexpr (std::is_same_v<T, std::string>) return ValueType::String;
  if constexpr (std::is_same_v<T, Array>) return ValueType::Array;
  if constexpr (std::is_same_v<T, std::uint64_t>) return ValueType::U64;
  if constexpr (std::is_same_v<T, std::int64_t>) return ValueType::I64;
  if constexpr (std::is_same_v<T, double>) return ValueType::F64;
}

// An array of one element type. Nested arrays are a vector<Array>; each inner
// array has its own element type, as the format allows.
class Array {
 public:
  // Alternatives in ValueType order: the index is the element type.
  using Storage = std::variant<std::vector<std::uint8_t>, std::vector<std::int8_t>, std::vector<std::uint16_t>,
                               std::vector<std::int16_t>, std::vector<std::uint32_t>, std::vector<std::int32_t>,
                               std::vector<float>, std::vector<bool>, std::vector<std::string>, std::vector<Array>,
                               std::vector<std::uint64_t>, std::vector<std::int64_t>, std::vector<double>>;

  Array() = default;  // an empty array of u8
  template <class T>
  explicit Array(std::vector<T> items) : items_(std::move(items)) {}
  // An empty array of the given element type.
  static Array empty(ValueType elem);

  ValueType elem_type() const { return static_cast<ValueType>(items_.index()); }
  std::size_t size() const;
  bool empty() const { return size() == 0; }
  // The elements as a vector of T; throws rlx::Error naming both types when the element type is not T.
  template <class T>
  const std::vector<T>& as() const;
  template <class T>
  bool holds() const {
    return std::holds_alternative<std::vector<T>>(items_);
  }
  const Storage& storage() const { return items_; }
  Storage& storage() { return items_; }
  // Deepest nesting: 1 for an array of scalars or strings, 2 for an array of those, ...
  int depth() const;

  friend bool operator==(const Array& a, const Array& b);

 private:
  Storage items_;
};

class Value {
 public:
  // Alternatives in ValueType order: the index is the type id.
  using Storage = std::variant<std::uint8_t, std::int8_t, std::uint16_t, std::int16_t, std::uint32_t, std::int32_t,
                               float, bool, std::string, Array, std::uint64_t, std::int64_t, double>;

  Value() = default;  // u8 0
  template <class T, class = std::enable_if_t<detail::kIsScalar<T> || std::is_same_v<T, std::string> ||
                                              std::is_same_v<T, Array>>>
  Value(T v) : v_(std::move(v)) {}                   // NOLINT(google-explicit-constructor): values read like literals
  Value(const char* s) : v_(std::string(s)) {}       // NOLINT(google-explicit-constructor)
  Value(std::string_view s) : v_(std::string(s)) {}  // NOLINT(google-explicit-constructor)
  template <class T>
  Value(std::vector<T> items) : v_(Array(std::move(items))) {}  // NOLINT(google-explicit-constructor)

  ValueType type() const { return static_cast<ValueType>(v_.index()); }
  template <class T>
  bool holds() const {
    return std::holds_alternative<T>(v_);
  }
  template <class T>
  const T* get_if() const {
    return std::get_if<T>(&v_);
  }
  const Storage& storage() const { return v_; }
  // "array of string", "u32": the type as the messages and `rlx inspect` name it.
  std::string type_name() const;

  friend bool operator==(const Value& a, const Value& b);

 private:
  Storage v_;
};

struct KeyValue {
  std::string key;
  Value value;
  // Where the entry starts in the file it was read from (for messages); 0 for entries made in code.
  std::uint64_t file_offset = 0;
};

// Metadata in file order, with a lookup by key. Keys are unique: set() replaces
// an existing key's value in place.
class Metadata {
 public:
  void set(std::string key, Value value, std::uint64_t file_offset = 0);
  // Adds a key that must be new; throws rlx::Error naming the key when it is a duplicate.
  void add(std::string key, Value value, std::uint64_t file_offset = 0);
  bool erase(std::string_view key);

  bool contains(std::string_view key) const { return find(key) != nullptr; }
  const Value* find(std::string_view key) const;
  // The value, or rlx::Error "metadata has no key '...'".
  const Value& at(std::string_view key) const;
  const KeyValue* entry(std::string_view key) const;

  // Typed getters: rlx::Error naming the key, the expected and the actual type.
  template <class T>
  const T& get(std::string_view key) const;
  std::uint8_t get_u8(std::string_view key) const { return get<std::uint8_t>(key); }
  std::int8_t get_i8(std::string_view key) const { return get<std::int8_t>(key); }
  std::uint16_t get_u16(std::string_view key) const { return get<std::uint16_t>(key); }
  std::int16_t get_i16(std::string_view key) const { return get<std::int16_t>(key); }
  std::uint32_t get_u32(std::string_view key) const { return get<std::uint32_t>(key); }
  std::int32_t get_i32(std::string_view key) const { return get<std::int32_t>(key); }
  std::uint64_t get_u64(std::string_view key) const { return get<std::uint64_t>(key); }
  std::int64_t get_i64(std::string_view key) const { return get<std::int64_t>(key); }
  float get_f32(std::string_view key) const { return get<float>(key); }
  double get_f64(std::string_view key) const { return get<double>(key); }
  bool get_bool(std::string_view key) const { return get<bool>(key); }
  const std::string& get_string(std::string_view key) const { return get<std::string>(key); }
  const Array& get_array(std::string_view key) const { return get<Array>(key); }
  // An array whose elements are T: get_array_of<std::string>("tokenizer.ggml.tokens").
  template <class T>
  const std::vector<T>& get_array_of(std::string_view key) const;
  // Any integer type, as int64 (writers disagree on u32 vs u64 vs i32 for counts); rlx::Error for a
  // non-integer or a u64 above INT64_MAX.
  std::int64_t get_integer(std::string_view key) const;
  // Any float type (f32 or f64), as double.
  double get_float(std::string_view key) const;
  // The same getters for optional keys: nullopt when the key is absent, rlx::Error when its type is wrong.
  std::optional<std::int64_t> find_integer(std::string_view key) const;
  std::optional<std::string> find_string(std::string_view key) const;

  const std::vector<KeyValue>& entries() const { return entries_; }
  std::size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }

  // Same keys in the same order with equal values (file offsets are not compared).
  friend bool operator==(const Metadata& a, const Metadata& b);

 private:
  [[noreturn]] void type_error(std::string_view key, const Value& v, std::string_view expected) const;

  std::vector<KeyValue> entries_;
  std::unordered_map<std::string, std::size_t> index_;  // key -> position in entries_
};

// ---- templates ----

template <class T>
const std::vector<T>& Array::as() const {
  if (const auto* v = std::get_if<std::vector<T>>(&items_)) return *v;
  detail::throw_array_type_error(value_type_of<T>(), elem_type());
}

template <class T>
const T& Metadata::get(std::string_view key) const {
  const Value& v = at(key);
  if (const T* p = v.get_if<T>()) return *p;
  type_error(key, v, value_type_name(value_type_of<T>()));
}

template <class T>
const std::vector<T>& Metadata::get_array_of(std::string_view key) const {
  const Array& a = get_array(key);
  if (!a.holds<T>()) type_error(key, at(key), "array of " + value_type_name(value_type_of<T>()));
  return a.as<T>();
}

}  // namespace rlx::gguf
