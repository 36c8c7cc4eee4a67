// The GGUF reader. Every read goes through Cursor, which checks the bytes are
// there before it copies them out; every count, length and offset read from
// the file is checked against the bytes left (or the file's size) before it
// sizes anything or moves the cursor, with arithmetic that cannot wrap. The
// layout and the list of checks: docs/gguf.md. llama.cpp's GGUF CVEs of 2024
// (lengths and counts that overflowed a size computation, n_dims past the dims
// array, offsets past the end) are each one of the checks below.
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <unordered_map>

#include "gguf/detail.hpp"
#include "rlx/error.hpp"
#include "rlx/gguf/gguf.hpp"

namespace rlx::gguf {

static_assert(std::endian::native == std::endian::little, "GGUF's default byte order is little-endian");

// ---- Mapping ----

Mapping Mapping::open(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(fmt::format("gguf: cannot open '{}': {}", path.string(), std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw Error(fmt::format("gguf: cannot stat '{}': {}", path.string(), std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(fmt::format("gguf: '{}' is not a regular file", path.string()));
  }
  const auto size = static_cast<std::size_t>(st.st_size);
  if (size == 0) {  // mmap refuses length 0; the parser reports the missing header
    ::close(fd);
    return {};
  }
  void* addr = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (addr == MAP_FAILED) throw Error(fmt::format("gguf: cannot map '{}': {}", path.string(), std::strerror(err)));
  return {addr, size};
}

Mapping::Mapping(Mapping&& o) noexcept : addr_(std::exchange(o.addr_, nullptr)), size_(std::exchange(o.size_, 0)) {}

Mapping& Mapping::operator=(Mapping&& o) noexcept {
  if (this != &o) {
    if (addr_) ::munmap(addr_, size_);
    addr_ = std::exchange(o.addr_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

Mapping::~Mapping() {
  if (addr_) ::munmap(addr_, size_);
}

// ---- sizes ----

namespace {

constexpr std::uint64_t kInt64Max = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());

}  // namespace

std::uint64_t detail::nbytes_or(GgmlType type, std::span<const std::int64_t> dims, std::string& why) {
  const GgmlTypeInfo t = ggml_type_info(type);
  std::uint64_t numel = 1;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 0) {
      why = fmt::format("dim {} is negative ({})", i, dims[i]);
      return 0;
    }
    if (__builtin_mul_overflow(numel, static_cast<std::uint64_t>(dims[i]), &numel) || numel > kInt64Max) {
      why = fmt::format("the element count of dims [{}] overflows int64", fmt::join(dims, ", "));
      return 0;
    }
  }
  if (!dims.empty() && dims[0] % t.block_elems != 0) {
    why = fmt::format("dim 0 ({}) is not a multiple of {}'s block of {} elements", dims[0], t.name, t.block_elems);
    return 0;
  }
  std::uint64_t bytes = 0;
  if (__builtin_mul_overflow(numel / t.block_elems, static_cast<std::uint64_t>(t.block_bytes), &bytes)) {
    why = fmt::format("the byte size of dims [{}] of {} overflows 64 bits", fmt::join(dims, ", "), t.name);
    return 0;
  }
  return bytes;
}

namespace {

using detail::nbytes_or;

std::uint64_t align_up(std::uint64_t x, std::uint64_t alignment) { return (x + alignment - 1) / alignment * alignment; }

// A metadata value's place, for messages: "metadata 'tokenizer.ggml.tokens' element 7". Built only on failure.
struct Path {
  std::string_view key;
  const Path* parent = nullptr;
  std::uint64_t index = 0;
  std::string str() const {
    if (!parent) return fmt::format("metadata '{}'", key);
    return fmt::format("{} element {}", parent->str(), index);
  }
};

class Cursor {
 public:
  Cursor(std::span<const std::byte> bytes, const std::string& source) : bytes_(bytes), source_(source) {}

  [[noreturn]] void fail(std::uint64_t at, const std::string& what) const {
    throw Error(fmt::format("gguf {}: {} (at byte {})", source_, what, at));
  }

  std::uint64_t pos() const { return pos_; }
  std::uint64_t size() const { return bytes_.size(); }
  std::uint64_t left() const { return bytes_.size() - pos_; }

  // `what` names the field; it is called only to build a message.
  template <class Describe>
  void need(std::uint64_t n, const Describe& what) const {
    if (n > left())
      fail(pos_, fmt::format("truncated: {} needs {} bytes, but the file ends at byte {}", what(), n, size()));
  }

  template <class T, class Describe>
  T read(const Describe& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  // n elements of T in one copy; the caller has checked that they fit.
  template <class T>
  void read_into(std::vector<T>& out, std::uint64_t n) {
    out.resize(n);
    if (n) std::memcpy(out.data(), bytes_.data() + pos_, n * sizeof(T));
    pos_ += n * sizeof(T);
  }

  // A GGUF string: a u64 length, then that many bytes (not NUL-terminated, not checked as UTF-8).
  template <class Describe>
  std::string read_string(const Describe& what, std::uint64_t max_len) {
    const std::uint64_t at = pos_;
    const auto len = read<std::uint64_t>([&] { return what() + " length"; });
    if (len > left())
      fail(at, fmt::format("{} length {} runs past the end of the file ({} bytes left)", what(), len, left()));
    if (len > max_len) fail(at, fmt::format("{} length {} is more than the {} bytes allowed", what(), len, max_len));
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), len);
    pos_ += len;
    return s;
  }

  void seek(std::uint64_t p) { pos_ = p; }

 private:
  std::span<const std::byte> bytes_;
  const std::string& source_;
  std::uint64_t pos_ = 0;
};

// The smallest number of bytes one element of this type takes in the file: bounds an array's count before
// anything is allocated for it.
std::uint64_t min_elem_bytes(ValueType t) {
  if (t == ValueType::String) return 8;     // the length
  if (t == ValueType::Array) return 4 + 8;  // element type and count
  return value_type_size(t);
}

class MetadataReader {
 public:
  explicit MetadataReader(Cursor& c) : c_(c) {}

  ValueType read_type(const Path& path, const char* which) {
    const std::uint64_t at = c_.pos();
    const auto id = c_.read<std::uint32_t>([&] { return fmt::format("{} {}", path.str(), which); });
    if (id >= kValueTypeCount)
      fail_at(at,
              fmt::format("{} {} {} is not a GGUF value type (0 to {})", path.str(), which, id, kValueTypeCount - 1));
    return static_cast<ValueType>(id);
  }

  Value read_value(ValueType t, const Path& path, int depth) {
    auto what = [&] { return path.str(); };
    switch (t) {
      case ValueType::U8: return c_.read<std::uint8_t>(what);
      case ValueType::I8: return c_.read<std::int8_t>(what);
      case ValueType::U16: return c_.read<std::uint16_t>(what);
      case ValueType::I16: return c_.read<std::int16_t>(what);
      case ValueType::U32: return c_.read<std::uint32_t>(what);
      case ValueType::I32: return c_.read<std::int32_t>(what);
      case ValueType::F32: return c_.read<float>(what);
      case ValueType::U64: return c_.read<std::uint64_t>(what);
      case ValueType::I64: return c_.read<std::int64_t>(what);
      case ValueType::F64: return c_.read<double>(what);
      case ValueType::Bool: return read_bool(path);
      case ValueType::String: return c_.read_string(what, std::numeric_limits<std::uint64_t>::max());
      case ValueType::Array: return read_array(path, depth + 1);
    }
    fail_at(c_.pos(), fmt::format("{}: value type {} is not a GGUF value type", path.str(), static_cast<int>(t)));
  }

 private:
  [[noreturn]] void fail_at(std::uint64_t at, const std::string& what) const { c_.fail(at, what); }

  bool read_bool(const Path& path) {
    const std::uint64_t at = c_.pos();
    const auto b = c_.read<std::uint8_t>([&] { return path.str(); });
    // ggml reads any nonzero byte as true; a strict reader catches corruption, and writers only write 0 and 1.
    if (b > 1) fail_at(at, fmt::format("{}: bool value {} is not 0 or 1", path.str(), b));
    return b == 1;
  }

  template <class T>
  Array read_fixed(std::uint64_t n) {
    std::vector<T> v;
    c_.read_into(v, n);
    return Array(std::move(v));
  }

  Array read_array(const Path& path, int depth) {
    if (depth > kMaxArrayDepth)
      fail_at(c_.pos(), fmt::format("{}: arrays nested more than {} deep", path.str(), kMaxArrayDepth));
    const ValueType elem = read_type(path, "array element type");
    const std::uint64_t count_at = c_.pos();
    const auto n = c_.read<std::uint64_t>([&] { return path.str() + " array count"; });
    // Bound the count by the bytes left before sizing anything: 2^63 strings must not become a 2^63 reserve.
    if (n > c_.left() / min_elem_bytes(elem))
      fail_at(count_at, fmt::format("{}: array count {} of {} is more than the {} bytes left can hold (each takes at "
                                    "least {}): the file is truncated or the count is corrupt",
                                    path.str(), n, value_type_name(elem), c_.left(), min_elem_bytes(elem)));
    switch (elem) {
      case ValueType::U8: return read_fixed<std::uint8_t>(n);
      case ValueType::I8: return read_fixed<std::int8_t>(n);
      case ValueType::U16: return read_fixed<std::uint16_t>(n);
      case ValueType::I16: return read_fixed<std::int16_t>(n);
      case ValueType::U32: return read_fixed<std::uint32_t>(n);
      case ValueType::I32: return read_fixed<std::int32_t>(n);
      case ValueType::F32: return read_fixed<float>(n);
      case ValueType::U64: return read_fixed<std::uint64_t>(n);
      case ValueType::I64: return read_fixed<std::int64_t>(n);
      case ValueType::F64: return read_fixed<double>(n);
      case ValueType::Bool: {
        std::vector<bool> v(n);
        for (std::uint64_t i = 0; i < n; ++i) v[i] = read_bool(Path{{}, &path, i});
        return Array(std::move(v));
      }
      case ValueType::String: {
        std::vector<std::string> v;
        v.reserve(n);
        for (std::uint64_t i = 0; i < n; ++i) {
          const Path elem_path{{}, &path, i};
          v.push_back(c_.read_string([&] { return elem_path.str(); }, std::numeric_limits<std::uint64_t>::max()));
        }
        return Array(std::move(v));
      }
      case ValueType::Array: {
        std::vector<Array> v;
        v.reserve(n);
        for (std::uint64_t i = 0; i < n; ++i) {
          const Path elem_path{{}, &path, i};
          v.push_back(read_array(elem_path, depth + 1));
        }
        return Array(std::move(v));
      }
    }
    fail_at(count_at, "unreachable array element type");
  }

  Cursor& c_;
};

}  // namespace

std::uint64_t tensor_nbytes(GgmlType type, std::span<const std::int64_t> dims) {
  std::string why;
  const std::uint64_t n = nbytes_or(type, dims, why);
  if (!why.empty()) throw Error("gguf: " + why);
  return n;
}

std::int64_t TensorInfo::numel() const {
  std::int64_t n = 1;
  for (auto d : dims) n *= d;  // checked when the file was read
  return n;
}

// ---- File ----

File File::open(const std::filesystem::path& path) {
  File f;
  f.storage_ = Mapping::open(path);
  f.bytes_ = std::get<Mapping>(f.storage_).bytes();
  f.source_ = "'" + path.string() + "'";
  f.parse();
  return f;
}

File File::from_bytes(std::vector<std::byte> bytes, std::string source) {
  File f;
  f.storage_ = std::move(bytes);
  f.bytes_ = std::get<std::vector<std::byte>>(f.storage_);
  f.source_ = std::move(source);
  f.parse();
  return f;
}

File File::view(std::span<const std::byte> bytes, std::string source) {
  File f;
  f.bytes_ = bytes;
  f.source_ = std::move(source);
  f.parse();
  return f;
}

const TensorInfo* File::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

TensorView File::tensor(std::string_view name) const {
  const TensorInfo* t = find_tensor(name);
  if (!t) throw Error(fmt::format("gguf {}: no tensor named '{}'", source_, name));
  return {t, data(*t)};
}

void File::parse() {
  Cursor c(bytes_, source_);

  // Header: magic, version, tensor_count, metadata_kv_count.
  const auto magic = c.read<std::array<char, 4>>([] { return std::string("magic"); });
  if (std::memcmp(magic.data(), "GGUF", 4) != 0) {
    std::string shown;
    for (char ch : magic) shown += (ch >= 0x20 && ch < 0x7f) ? ch : '?';
    c.fail(0,
           fmt::format("bad magic '{}' (bytes {:02x} {:02x} {:02x} {:02x}): not a GGUF file, which starts with 'GGUF'",
                       shown, static_cast<unsigned char>(magic[0]), static_cast<unsigned char>(magic[1]),
                       static_cast<unsigned char>(magic[2]), static_cast<unsigned char>(magic[3])));
  }
  version_ = c.read<std::uint32_t>([] { return std::string("version"); });
  if (version_ != 2 && version_ != 3) {
    std::string why;
    if (version_ == 1)
      why = "GGUF v1 (32-bit counts, 2023) is not supported; convert the model again with a current llama.cpp";
    else if (version_ != 0 && (version_ & 0xffffu) == 0)
      why = "this looks like a big-endian GGUF file, which this little-endian reader does not read";
    else
      why = "this reader reads versions 2 and 3";
    c.fail(4, fmt::format("unsupported GGUF version {}: {}", version_, why));
  }
  // v2 and v3 have the same layout (v3 only allowed big-endian files), so both read the same way.
  const std::uint64_t n_tensors_at = c.pos();
  const auto n_tensors = c.read<std::uint64_t>([] { return std::string("tensor_count"); });
  const std::uint64_t n_kv_at = c.pos();
  const auto n_kv = c.read<std::uint64_t>([] { return std::string("metadata_kv_count"); });
  // Each entry takes at least 13 bytes (key length, type, a u8) and each tensor info 32 (name length, n_dims,
  // one dim, type, offset): counts beyond what the file can hold are refused before any loop or allocation.
  const char* corrupt = "the file is truncated or the count is corrupt";
  if (n_kv > c.left() / 13)
    c.fail(n_kv_at, fmt::format("metadata_kv_count {} is more than the {} bytes left can hold (each entry takes at "
                                "least 13): {}",
                                n_kv, c.left(), corrupt));
  if (n_tensors > c.left() / 32)
    c.fail(n_tensors_at, fmt::format("tensor_count {} is more than the {} bytes left can hold (each tensor info takes "
                                     "at least 32): {}",
                                     n_tensors, c.left(), corrupt));

  // Metadata.
  MetadataReader mr(c);
  for (std::uint64_t i = 0; i < n_kv; ++i) {
    const std::uint64_t at = c.pos();
    std::string key = c.read_string([&] { return fmt::format("metadata entry {} key", i); }, kMaxKeyBytes);
    const Path path{key};
    if (metadata_.contains(key)) {
      c.fail(at, fmt::format("duplicate metadata key '{}' (entries {} and {})", key,
                             metadata_.entry(key) - metadata_.entries().data(), i));
    }
    const ValueType t = mr.read_type(path, "value type");
    Value v = mr.read_value(t, path, 0);
    metadata_.add(std::move(key), std::move(v), at);
  }

  // general.alignment: ggml reads it as a u32 and requires a nonzero power of two.
  if (const KeyValue* e = metadata_.entry(kAlignmentKey)) {
    const auto* a = e->value.get_if<std::uint32_t>();
    if (!a)
      c.fail(e->file_offset, fmt::format("metadata '{}' must be u32, found {}", kAlignmentKey, e->value.type_name()));
    if (*a == 0 || !std::has_single_bit(*a))
      c.fail(e->file_offset, fmt::format("metadata '{}' is {}, which is not a power of two", kAlignmentKey, *a));
    alignment_ = *a;
  }

  // Tensor infos.
  std::vector<std::uint64_t> offset_field_at;  // where each tensor's offset field is, for the data checks
  std::unordered_map<std::string, std::size_t> by_name;
  for (std::uint64_t i = 0; i < n_tensors; ++i) {
    TensorInfo t;
    t.info_offset = c.pos();
    t.name = c.read_string([&] { return fmt::format("tensor {} name", i); }, std::numeric_limits<std::uint64_t>::max());
    if (t.name.empty()) c.fail(t.info_offset, fmt::format("tensor {} has an empty name", i));
    if (t.name.size() > kMaxTensorNameBytes)
      c.fail(t.info_offset,
             fmt::format("tensor {} name is {} bytes; ggml allows at most {}", i, t.name.size(), kMaxTensorNameBytes));
    if (auto [it, fresh] = by_name.emplace(t.name, i); !fresh)
      c.fail(t.info_offset, fmt::format("duplicate tensor name '{}' (tensors {} and {})", t.name, it->second, i));
    const std::string& name = t.name;
    const std::uint64_t n_dims_at = c.pos();
    const auto n_dims = c.read<std::uint32_t>([&] { return fmt::format("tensor '{}' n_dims", name); });
    if (n_dims == 0 || n_dims > kMaxDims)
      c.fail(n_dims_at, fmt::format("tensor '{}' n_dims {} is not 1 to {}", name, n_dims, kMaxDims));
    for (std::uint32_t d = 0; d < n_dims; ++d) {
      const std::uint64_t dim_at = c.pos();
      const auto dim = c.read<std::uint64_t>([&] { return fmt::format("tensor '{}' dim {}", name, d); });
      if (dim > kInt64Max) c.fail(dim_at, fmt::format("tensor '{}' dim {} is {}, more than int64 holds", name, d, dim));
      t.dims.push_back(static_cast<std::int64_t>(dim));
    }
    const std::uint64_t type_at = c.pos();
    const auto type_id = c.read<std::uint32_t>([&] { return fmt::format("tensor '{}' type", name); });
    const auto info = ggml_type_info(type_id);
    if (!info) c.fail(type_at, fmt::format("tensor '{}' type {} is not a ggml type RLX knows", name, type_id));
    t.type = info->type;
    std::string why;
    t.nbytes = nbytes_or(t.type, t.dims, why);
    if (!why.empty()) c.fail(n_dims_at, fmt::format("tensor '{}' dims: {}", name, why));
    offset_field_at.push_back(c.pos());
    t.offset = c.read<std::uint64_t>([&] { return fmt::format("tensor '{}' offset", name); });
    if (t.offset % alignment_ != 0)
      c.fail(offset_field_at.back(),
             fmt::format("tensor '{}' offset {} is not a multiple of the alignment {}", name, t.offset, alignment_));
    tensors_.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment. A file without tensors may end before it; one
  // with tensors, even only empty ones, may not, so every tensor's file_offset is inside the file.
  data_offset_ = align_up(c.pos(), alignment_);
  if (!tensors_.empty() && data_offset_ > c.size())
    c.fail(c.pos(), fmt::format("the data section starts at byte {} (the tensor infos end at byte {}, padded to the "
                                "alignment {}), past the end of the file ({} bytes)",
                                data_offset_, c.pos(), alignment_, c.size()));
  const std::uint64_t data_size = c.size() > data_offset_ ? c.size() - data_offset_ : 0;
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    TensorInfo& t = tensors_[i];
    // offset + nbytes may not be representable: compare against what is left after the offset instead.
    if (t.offset > data_size || t.nbytes > data_size - t.offset)
      c.fail(offset_field_at[i],
             fmt::format("tensor '{}' offset {} + {} bytes runs past the end of the file (the data section at byte {} "
                         "holds {} bytes)",
                         t.name, t.offset, t.nbytes, data_offset_, data_size));
    t.file_offset = data_offset_ + t.offset;
  }
  // Tensors must not share bytes: sorted by offset, each must end before the next starts.
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < tensors_.size(); ++i)
    if (tensors_[i].nbytes) order.push_back(i);
  std::sort(order.begin(), order.end(), [&](auto a, auto b) { return tensors_[a].offset < tensors_[b].offset; });
  for (std::size_t k = 1; k < order.size(); ++k) {
    const TensorInfo& prev = tensors_[order[k - 1]];
    const TensorInfo& cur = tensors_[order[k]];
    if (cur.offset < prev.offset + prev.nbytes)
      c.fail(offset_field_at[order[k]],
             fmt::format("tensor '{}' data at offset {} overlaps tensor '{}' (offset {}, {} bytes)", cur.name,
                         cur.offset, prev.name, prev.offset, prev.nbytes));
  }
  for (std::size_t i = 0; i < tensors_.size(); ++i) tensor_index_.emplace(tensors_[i].name, i);
}

}  // namespace rlx::gguf
