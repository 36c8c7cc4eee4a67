// The GGUF writer: header, metadata and tensor infos in one buffer, then each
// tensor's bytes at the next multiple of the alignment. It refuses what the
// reader (or llama.cpp) would refuse, so a file it writes always reads back.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <bit>
#include <cstring>
#include <fstream>

#include "gguf/detail.hpp"
#include "rlx/error.hpp"
#include "rlx/gguf/gguf.hpp"

namespace rlx::gguf {

namespace {

class Out {
 public:
  explicit Out(std::vector<std::byte>& buf) : buf_(buf) {}
  template <class T>
  void put(T v) {
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    buf_.insert(buf_.end(), p, p + sizeof(T));
  }
  template <class T>
  void put_all(const std::vector<T>& v) {
    const auto* p = reinterpret_cast<const std::byte*>(v.data());
    buf_.insert(buf_.end(), p, p + v.size() * sizeof(T));
  }
  void put_string(std::string_view s) {
    put<std::uint64_t>(s.size());
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    buf_.insert(buf_.end(), p, p + s.size());
  }
  void pad_to(std::uint64_t alignment) { buf_.resize((buf_.size() + alignment - 1) / alignment * alignment); }

 private:
  std::vector<std::byte>& buf_;
};

void put_array(Out& out, const Array& a, std::string_view key, int depth);

void put_value(Out& out, const Value& v, std::string_view key) {
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::string>)
          out.put_string(x);
        else if constexpr (std::is_same_v<T, Array>)
          put_array(out, x, key, 1);
        else if constexpr (std::is_same_v<T, bool>)
          out.put<std::uint8_t>(x ? 1 : 0);
        else
          out.put(x);
      },
      v.storage());
}

void put_array(Out& out, const Array& a, std::string_view key, int depth) {
  if (depth > kMaxArrayDepth)
    throw Error(fmt::format("gguf: metadata '{}': arrays nested more than {} deep", key, kMaxArrayDepth));
  out.put(static_cast<std::uint32_t>(a.elem_type()));
  out.put<std::uint64_t>(a.size());
  std::visit(
      [&](const auto& items) {
        using T = typename std::decay_t<decltype(items)>::value_type;
        if constexpr (std::is_same_v<T, std::string>) {
          for (const auto& s : items) out.put_string(s);
        } else if constexpr (std::is_same_v<T, Array>) {
          for (const auto& inner : items) put_array(out, inner, key, depth + 1);
        } else if constexpr (std::is_same_v<T, bool>) {
          for (bool b : items) out.put<std::uint8_t>(b ? 1 : 0);
        } else {
          out.put_all(items);
        }
      },
      a.storage());
}

}  // namespace

std::span<const std::byte> Writer::Pending::bytes() const {
  if (const auto* owned = std::get_if<std::vector<std::byte>>(&data)) return *owned;
  return std::get<std::span<const std::byte>>(data);
}

void Writer::check_tensor(const std::string& name, GgmlType type, const std::vector<std::int64_t>& dims,
                          std::size_t nbytes) const {
  if (name.empty()) throw Error("gguf: a tensor needs a name");
  if (name.size() > kMaxTensorNameBytes)
    throw Error(fmt::format("gguf: tensor name '{}' is {} bytes; ggml allows at most {}", name, name.size(),
                            kMaxTensorNameBytes));
  if (names_.count(name)) throw Error(fmt::format("gguf: duplicate tensor name '{}'", name));
  if (dims.empty() || dims.size() > kMaxDims)
    throw Error(fmt::format("gguf: tensor '{}' has {} dims; GGUF takes 1 to {}", name, dims.size(), kMaxDims));
  std::string why;
  const std::uint64_t expected = detail::nbytes_or(type, dims, why);
  if (!why.empty()) throw Error(fmt::format("gguf: tensor '{}': {}", name, why));
  if (expected != nbytes)
    throw Error(fmt::format("gguf: tensor '{}' of {} [{}] takes {} bytes, given {}", name, ggml_type_info(type).name,
                            fmt::join(dims, ", "), expected, nbytes));
}

void Writer::add_tensor(std::string name, GgmlType type, std::vector<std::int64_t> dims,
                        std::span<const std::byte> data) {
  check_tensor(name, type, dims, data.size());
  names_.insert(name);
  tensors_.push_back({std::move(name), type, std::move(dims), data});
}

void Writer::add_tensor(std::string name, GgmlType type, std::vector<std::int64_t> dims,
                        std::vector<std::byte>&& data) {
  check_tensor(name, type, dims, data.size());
  names_.insert(name);
  tensors_.push_back({std::move(name), type, std::move(dims), std::move(data)});
}

std::uint32_t Writer::alignment() const {
  const Value* v = metadata_.find(kAlignmentKey);
  if (!v) return kDefaultAlignment;
  const auto* a = v->get_if<std::uint32_t>();
  if (!a) throw Error(fmt::format("gguf: metadata '{}' must be u32, found {}", kAlignmentKey, v->type_name()));
  if (*a == 0 || !std::has_single_bit(*a))
    throw Error(fmt::format("gguf: metadata '{}' is {}, which is not a power of two", kAlignmentKey, *a));
  return *a;
}

std::vector<std::byte> Writer::header() const {
  const std::uint32_t align = alignment();
  std::vector<std::byte> buf;
  Out out(buf);
  out.put(std::array<char, 4>{'G', 'G', 'U', 'F'});
  out.put(kVersion);
  out.put<std::uint64_t>(tensors_.size());
  out.put<std::uint64_t>(metadata_.size());
  for (const auto& kv : metadata_.entries()) {
    if (kv.key.size() > kMaxKeyBytes)
      throw Error(fmt::format("gguf: metadata key '{}...' is {} bytes; GGUF keys are at most {}", kv.key.substr(0, 40),
                              kv.key.size(), kMaxKeyBytes));
    out.put_string(kv.key);
    out.put(static_cast<std::uint32_t>(kv.value.type()));
    put_value(out, kv.value, kv.key);
  }
  std::uint64_t offset = 0;
  for (const auto& t : tensors_) {
    out.put_string(t.name);
    out.put(static_cast<std::uint32_t>(t.dims.size()));
    for (auto d : t.dims) out.put(static_cast<std::uint64_t>(d));
    out.put(static_cast<std::uint32_t>(t.type));
    out.put(offset);
    offset += (t.bytes().size() + align - 1) / align * align;
  }
  out.pad_to(align);
  return buf;
}

std::uint64_t Writer::file_size() const {
  const std::uint32_t align = alignment();
  std::uint64_t size = header().size();
  for (const auto& t : tensors_) size += (t.bytes().size() + align - 1) / align * align;
  return size;
}

std::vector<std::byte> Writer::to_bytes() const {
  const std::uint32_t align = alignment();
  std::vector<std::byte> buf = header();
  Out out(buf);
  for (const auto& t : tensors_) {
    const auto bytes = t.bytes();
    buf.insert(buf.end(), bytes.begin(), bytes.end());
    out.pad_to(align);
  }
  return buf;
}

void Writer::write(const std::filesystem::path& path) const {
  const std::uint32_t align = alignment();
  const std::vector<std::byte> head = header();
  std::filesystem::path tmp = path;
  tmp += ".partial";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw Error(fmt::format("gguf: cannot write '{}': {}", tmp.string(), std::strerror(errno)));
    const std::vector<char> zeros(align, 0);
    auto put = [&](std::span<const std::byte> b) {
      f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
    };
    put(head);
    for (const auto& t : tensors_) {
      const auto bytes = t.bytes();
      put(bytes);
      const std::size_t pad = (align - bytes.size() % align) % align;
      f.write(zeros.data(), static_cast<std::streamsize>(pad));
    }
    f.flush();
    if (!f) {
      const int err = errno;
      f.close();
      std::filesystem::remove(tmp);
      throw Error(fmt::format("gguf: writing '{}' failed: {}", tmp.string(), std::strerror(err)));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp);
    throw Error(fmt::format("gguf: cannot rename '{}' to '{}': {}", tmp.string(), path.string(), ec.message()));
  }
}

}  // namespace rlx::gguf
