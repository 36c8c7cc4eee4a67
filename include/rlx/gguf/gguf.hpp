#pragma once
// The GGUF container (v3, and v2, which has the same layout): a reader that
// maps the file and hands out zero-copy tensor views, and a writer. The format
// as RLX reads it, and every check the reader makes: docs/gguf.md.
//
//   auto f = rlx::gguf::File::open("model.gguf");
//   auto layers = f.metadata().get_u32("llama.block_count");
//   auto w = f.tensor("blk.0.attn_q.weight");  // w.info->type, w.info->dims, w.bytes (into the mapping)
//
// A malformed file never leads to an out-of-bounds read: every count, length
// and offset is checked against the file's size before it is used, with
// overflow-safe arithmetic, and each failure is an rlx::Error that names the
// field and its byte offset in the file.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <variant>
#include <vector>

#include "rlx/gguf/metadata.hpp"
#include "rlx/gguf/types.hpp"

namespace rlx::gguf {

inline constexpr std::uint32_t kVersion = 3;            // what the writer writes
inline constexpr std::uint32_t kDefaultAlignment = 32;  // without general.alignment
inline constexpr std::uint32_t kMaxDims = 4;            // GGML_MAX_DIMS
inline constexpr std::size_t kMaxTensorNameBytes = 63;  // ggml: GGML_MAX_NAME (64) with the NUL
inline constexpr std::size_t kMaxKeyBytes = 65535;      // the spec: keys are at most 2^16 - 1 bytes
inline constexpr int kMaxArrayDepth = 8;                // arrays of arrays; real files use 1
inline constexpr std::string_view kAlignmentKey = "general.alignment";

// A read-only, private memory mapping of a whole file. Move-only; unmaps on destruction.
class Mapping {
 public:
  Mapping() = default;
  // rlx::Error naming the path and the system's reason when it cannot be opened or mapped. An empty file maps
  // to an empty span (mmap refuses length 0).
  static Mapping open(const std::filesystem::path& path);
  Mapping(Mapping&& o) noexcept;
  Mapping& operator=(Mapping&& o) noexcept;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping();

  std::span<const std::byte> bytes() const { return {static_cast<const std::byte*>(addr_), size_}; }

 private:
  Mapping(void* addr, std::size_t size) : addr_(addr), size_(size) {}
  void* addr_ = nullptr;
  std::size_t size_ = 0;
};

// One tensor-info entry. dims are in ggml's order: dims[0] is the innermost (contiguous) dimension, the
// reverse of a row-major shape; numpy's view of a [576, 49152] GGUF tensor is (49152, 576).
struct TensorInfo {
  std::string name;
  GgmlType type = GgmlType::F32;
  std::vector<std::int64_t> dims;
  std::uint64_t offset = 0;       // from the start of the data section, as stored
  std::uint64_t file_offset = 0;  // of the first byte of the data in the file
  std::uint64_t nbytes = 0;
  std::uint64_t info_offset = 0;  // where the tensor-info entry starts in the file (for messages)

  std::int64_t numel() const;
  GgmlTypeInfo type_info() const { return ggml_type_info(type); }
};

struct TensorView {
  const TensorInfo* info = nullptr;
  std::span<const std::byte> bytes;  // into the file's mapping: valid while the File lives
};

// A parsed GGUF file. Move-only: it owns the mapping (or the buffer) its tensor views point into.
class File {
 public:
  // Maps the file and parses it; rlx::Error on any problem, naming the path, the field and the byte offset.
  static File open(const std::filesystem::path& path);
  // Parses a buffer the File then owns.
  static File from_bytes(std::vector<std::byte> bytes, std::string source = "<memory>");
  // Parses bytes the caller keeps alive for the File's lifetime (the fuzzer, tests).
  static File view(std::span<const std::byte> bytes, std::string source = "<memory>");

  File(File&&) noexcept = default;
  File& operator=(File&&) noexcept = default;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File() = default;

  std::uint32_t version() const { return version_; }
  std::uint32_t alignment() const { return alignment_; }
  // Where the data section starts (the end of the tensor infos, padded to the alignment).
  std::uint64_t data_offset() const { return data_offset_; }
  std::uint64_t file_size() const { return bytes_.size(); }
  const std::string& source() const { return source_; }
  const Metadata& metadata() const { return metadata_; }
  // In file order.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;
  // The tensor and its bytes; rlx::Error naming the tensor when there is none of that name.
  TensorView tensor(std::string_view name) const;
  std::span<const std::byte> data(const TensorInfo& t) const { return bytes_.subspan(t.file_offset, t.nbytes); }
  std::span<const std::byte> bytes() const { return bytes_; }

 private:
  File() = default;
  void parse();

  std::variant<std::monostate, Mapping, std::vector<std::byte>> storage_;
  std::span<const std::byte> bytes_;
  std::string source_;
  std::uint32_t version_ = 0;
  std::uint32_t alignment_ = kDefaultAlignment;
  std::uint64_t data_offset_ = 0;
  Metadata metadata_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string_view, std::size_t> tensor_index_;  // views into tensors_[i].name
};

// The bytes of a tensor of this type and these dims (ggml order); rlx::Error when dims[0] is not a multiple of the
// type's block, a dim is negative, or the size overflows 64 bits.
std::uint64_t tensor_nbytes(GgmlType type, std::span<const std::int64_t> dims);

// Builds a GGUF v3 file: the metadata in order, the tensor infos in the order added, then each tensor's data at
// the next multiple of the alignment (general.alignment if the metadata sets it, else 32), padded with zeros.
// That is the layout llama.cpp requires (it refuses tensors out of order or with gaps) and the one gguf-py
// writes, so a file read and written back comes out byte for byte the same.
class Writer {
 public:
  Writer() = default;
  explicit Writer(Metadata metadata) : metadata_(std::move(metadata)) {}

  Metadata& metadata() { return metadata_; }
  const Metadata& metadata() const { return metadata_; }

  // Borrows the bytes (a File's tensor views, a vector the caller keeps): they must stay alive until the file
  // is written. rlx::Error when the name is empty, too long or taken, the dims are not 1 to 4 non-negative
  // extents, or the bytes are not the size the type and dims need.
  void add_tensor(std::string name, GgmlType type, std::vector<std::int64_t> dims, std::span<const std::byte> data);
  // Takes ownership of the bytes (only an rvalue: an lvalue vector is borrowed by the overload above).
  void add_tensor(std::string name, GgmlType type, std::vector<std::int64_t> dims, std::vector<std::byte>&& data);
  std::size_t tensor_count() const { return tensors_.size(); }

  // The whole file in memory.
  std::vector<std::byte> to_bytes() const;
  // Writes to `path` through a temporary file next to it, renamed into place once complete, so a failed write
  // never leaves a truncated model behind.
  void write(const std::filesystem::path& path) const;
  // The size of the file to_bytes() / write() produce.
  std::uint64_t file_size() const;

 private:
  struct Pending {
    std::string name;
    GgmlType type;
    std::vector<std::int64_t> dims;
    std::variant<std::span<const std::byte>, std::vector<std::byte>> data;
    std::span<const std::byte> bytes() const;
  };
  void check_tensor(const std::string& name, GgmlType type, const std::vector<std::int64_t>& dims,
                    std::size_t nbytes) const;
  std::uint32_t alignment() const;
  std::vector<std::byte> header() const;  // everything before the data section, padding included

  Metadata metadata_;
  std::vector<Pending> tensors_;
  std::unordered_set<std::string> names_;
};

}  // namespace rlx::gguf
