// `rlx inspect`: a GGUF file's header, metadata and tensor table as text.
#include "rlx/gguf/inspect.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>

namespace rlx::gguf {

namespace {

std::string quoted(const std::string& s, std::size_t max_bytes) {
  std::string out = "\"";
  const std::size_t shown = std::min(s.size(), max_bytes);
  for (std::size_t i = 0; i < shown; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);  // UTF-8 passes through: tokens are text
    }
  }
  out += '"';
  if (shown < s.size()) out += fmt::format("... ({} bytes)", s.size());
  return out;
}

template <class T>
std::string scalar(const T& x, const InspectOptions& o) {
  if constexpr (std::is_same_v<T, std::string>)
    return quoted(x, o.max_string);
  else if constexpr (std::is_same_v<T, bool>)
    return x ? "true" : "false";
  else if constexpr (std::is_same_v<T, std::uint8_t> || std::is_same_v<T, std::int8_t>)
    return fmt::format("{}", static_cast<int>(x));
  else
    return fmt::format("{}", x);
}

std::string array_text(const Array& a, const InspectOptions& o) {
  std::string out = fmt::format("[{}] [", a.size());
  std::visit(
      [&](const auto& items) {
        const std::size_t n = std::min<std::size_t>(items.size(), o.max_items);
        for (std::size_t i = 0; i < n; ++i) {
          if (i) out += ", ";
          using T = typename std::decay_t<decltype(items)>::value_type;
          if constexpr (std::is_same_v<T, Array>)
            out += array_text(items[i], o);
          else
            out += scalar(static_cast<T>(items[i]), o);
        }
        if (items.size() > n) out += fmt::format(", ... ({} more)", items.size() - n);
      },
      a.storage());
  return out + "]";
}

std::string human_bytes(std::uint64_t n) {
  if (n >= (1ull << 30)) return fmt::format("{:.2f} GiB", static_cast<double>(n) / (1ull << 30));
  if (n >= (1ull << 20)) return fmt::format("{:.2f} MiB", static_cast<double>(n) / (1ull << 20));
  if (n >= (1ull << 10)) return fmt::format("{:.2f} KiB", static_cast<double>(n) / (1ull << 10));
  return fmt::format("{} B", n);
}

}  // namespace

std::string format_value(const Value& v, const InspectOptions& options) {
  return std::visit(
      [&](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, Array>)
          return array_text(x, options);
        else
          return scalar(x, options);
      },
      v.storage());
}

std::string inspect_text(const File& file, const InspectOptions& options) {
  std::string out = fmt::format("GGUF v{}: {} bytes ({}), alignment {}, data section at byte {}\n", file.version(),
                                file.file_size(), human_bytes(file.file_size()), file.alignment(), file.data_offset());
  const auto& md = file.metadata();
  std::size_t key_width = 0, type_width = 0;
  for (const auto& kv : md.entries()) {
    key_width = std::max(key_width, kv.key.size());
    type_width = std::max(type_width, kv.value.type_name().size());
  }
  key_width = std::min<std::size_t>(key_width, 48);
  out += fmt::format("\nmetadata: {} keys\n", md.size());
  for (const auto& kv : md.entries())
    out += fmt::format("  {:<{}}  {:<{}}  {}\n", kv.key, key_width, kv.value.type_name(), type_width,
                       format_value(kv.value, options));

  const auto& ts = file.tensors();
  std::uint64_t total_bytes = 0, total_elems = 0;
  struct PerType {
    std::size_t count = 0;
    std::uint64_t bytes = 0;
  };
  std::map<std::string_view, PerType> per_type;
  for (const auto& t : ts) {
    total_bytes += t.nbytes;
    total_elems += static_cast<std::uint64_t>(t.numel());
    auto& p = per_type[t.type_info().name];
    ++p.count;
    p.bytes += t.nbytes;
  }
  out += fmt::format("\ntensors: {}\n", ts.size());
  if (options.tensors && !ts.empty()) {
    std::size_t name_width = 4, shape_width = 5;
    std::vector<std::string> shapes;
    for (const auto& t : ts) {
      shapes.push_back(fmt::format("[{}]", fmt::join(t.dims, ", ")));
      name_width = std::max(name_width, t.name.size());
      shape_width = std::max(shape_width, shapes.back().size());
    }
    out += fmt::format("  {:<{}}  {:<7}  {:<{}}  {:>12}  {:>12}\n", "name", name_width, "type", "shape", shape_width,
                       "bytes", "offset");
    for (std::size_t i = 0; i < ts.size(); ++i) {
      const auto& t = ts[i];
      out += fmt::format("  {:<{}}  {:<7}  {:<{}}  {:>12}  {:>12}\n", t.name, name_width, t.type_info().name, shapes[i],
                         shape_width, t.nbytes, t.file_offset);
    }
  }
  std::vector<std::string> by_type;
  for (const auto& [name, p] : per_type)
    by_type.push_back(fmt::format("{} {} ({})", p.count, name, human_bytes(p.bytes)));
  out += fmt::format("\ntotal: {} tensors, {} elements, {} bytes ({}){}{}\n", ts.size(), total_elems, total_bytes,
                     human_bytes(total_bytes), by_type.empty() ? "" : ": ", fmt::join(by_type, ", "));
  return out;
}

}  // namespace rlx::gguf
