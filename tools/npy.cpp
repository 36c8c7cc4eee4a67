#include "npy.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "rlx/error.hpp"

namespace rlx::tools {

namespace {

struct Descr {
  const char* text;
  ir::DType dtype;
};
constexpr std::array<Descr, 13> kDescrs{{{"<f4", ir::DType::F32},
                                         {"<f8", ir::DType::F64},
                                         {"<f2", ir::DType::F16},
                                         {"<i8", ir::DType::I64},
                                         {"<i4", ir::DType::I32},
                                         {"<i2", ir::DType::I16},
                                         {"|i1", ir::DType::I8},
                                         {"|u1", ir::DType::U8},
                                         {"<u2", ir::DType::U16},
                                         {"<u4", ir::DType::U32},
                                         {"<u8", ir::DType::U64},
                                         {"|b1", ir::DType::Bool},
                                         {"<V2", ir::DType::BF16}}};  // ml_dtypes' bfloat16 saves as raw 2 bytes

// The value of 'key' in the header's Python dict literal, as text.
std::string field(const std::string& header, const std::string& key, const std::filesystem::path& path) {
  const auto at = header.find("'" + key + "'");
  if (at == std::string::npos) throw Error(fmt::format("{}: the .npy header has no '{}'", path.string(), key));
  auto colon = header.find(':', at);
  if (colon == std::string::npos) throw Error(fmt::format("{}: malformed .npy header", path.string()));
  auto start = header.find_first_not_of(' ', colon + 1);
  if (start == std::string::npos) throw Error(fmt::format("{}: malformed .npy header", path.string()));
  std::size_t end = 0;
  if (header[start] == '(') {
    end = header.find(')', start);
    if (end == std::string::npos) throw Error(fmt::format("{}: malformed shape in the .npy header", path.string()));
    return header.substr(start + 1, end - start - 1);
  }
  end = header.find_first_of(",}", start);
  std::string v = header.substr(start, end - start);
  if (!v.empty() && (v.front() == '\'' || v.front() == '"')) v = v.substr(1, v.size() - 2);
  return v;
}

}  // namespace

ir::Tensor read_npy(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(fmt::format("cannot open '{}'", path.string()));
  const std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (bytes.size() < 10 || std::string(bytes.data() + 1, 5) != "NUMPY" || bytes[0] != '\x93')
    throw Error(fmt::format("{}: not a .npy file (no \\x93NUMPY magic)", path.string()));
  const int major = static_cast<unsigned char>(bytes[6]);
  std::size_t hlen = 0, hstart = 0;
  if (major == 1) {
    hlen = std::size_t(static_cast<unsigned char>(bytes[8])) | std::size_t(static_cast<unsigned char>(bytes[9])) << 8;
    hstart = 10;
  } else {
    if (bytes.size() < 12) throw Error(fmt::format("{}: truncated .npy header", path.string()));
    for (int i = 0; i < 4; ++i) hlen |= std::size_t(static_cast<unsigned char>(bytes[8 + std::size_t(i)])) << (8 * i);
    hstart = 12;
  }
  if (hlen > bytes.size() - hstart) throw Error(fmt::format("{}: the .npy header runs past the end", path.string()));
  const std::string header(bytes.data() + hstart, hlen);
  const std::string descr = field(header, "descr", path);
  if (field(header, "fortran_order", path) != "False")
    throw Error(
        fmt::format("{}: Fortran-order arrays are not supported (save with np.ascontiguousarray)", path.string()));
  std::optional<ir::DType> dtype;
  for (const auto& d : kDescrs)
    if (descr == d.text) dtype = d.dtype;
  if (!dtype) throw Error(fmt::format("{}: dtype '{}' is not supported", path.string(), descr));
  std::vector<std::int64_t> shape;
  const std::string dims = field(header, "shape", path);
  std::size_t pos = 0;
  while (pos < dims.size()) {
    const auto next = dims.find(',', pos);
    const std::string part = dims.substr(pos, next == std::string::npos ? std::string::npos : next - pos);
    if (part.find_first_not_of(' ') != std::string::npos) {
      try {
        shape.push_back(std::stoll(part));
      } catch (const std::exception&) {
        throw Error(fmt::format("{}: malformed shape '({})'", path.string(), dims));
      }
    }
    if (next == std::string::npos) break;
    pos = next + 1;
  }
  const std::size_t data_at = hstart + hlen;
  return ir::Tensor(*dtype, shape,
                    std::as_bytes(std::span<const char>(bytes.data() + data_at, bytes.size() - data_at)));
}

void write_npy(const std::filesystem::path& path, const ir::Tensor& t) {
  const char* descr = nullptr;
  for (const auto& d : kDescrs)
    if (d.dtype == t.dtype() && !descr) descr = d.text;
  // The storage-only types save as ml_dtypes' do, one raw byte an element (numpy has no name for them, so
  // read_npy cannot tell them apart and refuses '|V1').
  if (!descr && ir::is_storage_only(t.dtype())) descr = "|V1";
  if (!descr) throw Error(fmt::format("{}: .npy has no dtype for {}", path.string(), ir::dtype_name(t.dtype())));
  std::string shape = fmt::format("{}", fmt::join(t.shape(), ", "));
  if (t.shape().size() == 1) shape += ",";
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}", descr, shape);
  // The header pads to a multiple of 64 bytes with spaces and ends in a newline.
  const std::size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  if (!f) throw Error(fmt::format("cannot write '{}'", path.string()));
  const std::array<char, 8> magic{'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
  f.write(magic.data(), magic.size());
  const auto hlen = static_cast<std::uint16_t>(header.size());
  const std::array<char, 2> len{static_cast<char>(hlen & 0xff), static_cast<char>(hlen >> 8)};
  f.write(len.data(), 2);
  f.write(header.data(), std::streamsize(header.size()));
  f.write(reinterpret_cast<const char*>(t.data()), std::streamsize(t.nbytes()));
}

}  // namespace rlx::tools
