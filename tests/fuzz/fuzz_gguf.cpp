// Fuzz target: the GGUF reader (rlx::gguf::File). Any input must either parse
// or throw rlx::Error; anything else (a crash, a sanitizer report, another
// exception, a hang) is a bug. A file that parses must also: have every
// tensor's bytes inside the input (each is read end to end, so ASan sees any
// view past the buffer), print with `rlx inspect`'s formatter, and write back
// with rlx::gguf::Writer into a file that reads back to the same metadata,
// tensor infos and bytes.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <span>
#include <vector>

#include "rlx/error.hpp"
#include "rlx/gguf/gguf.hpp"
#include "rlx/gguf/inspect.hpp"

namespace {

[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "fuzz_gguf: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // A copy of exactly `size` bytes, so a read past the end is a heap overflow ASan reports.
  const std::vector<std::byte> bytes(reinterpret_cast<const std::byte*>(data),
                                     reinterpret_cast<const std::byte*>(data) + size);
  std::optional<rlx::gguf::File> file;
  try {
    file.emplace(rlx::gguf::File::view(bytes));
  } catch (const rlx::Error&) {
    return 0;  // a clear error is the right answer to bad input
  }
  const rlx::gguf::File& f = *file;

  unsigned sum = 0;
  for (const auto& t : f.tensors()) {
    const auto view = f.data(t);
    if (view.size() != t.nbytes || t.file_offset + t.nbytes > size) finding("a tensor view runs past the input");
    for (std::byte b : view) sum += static_cast<unsigned>(b);
  }
  (void)rlx::gguf::inspect_text(f, {.max_items = 4});

  // Write back: the tensors in file order, repacked. Whatever the reader accepted, the writer must take, and the
  // result must read back the same. The writer pads the header and every tensor to the alignment, so a tiny input
  // with general.alignment = 2^31 would write gigabytes: past 64 KiB the write-back is skipped.
  if (f.alignment() > (1u << 16)) return 0;
  std::vector<std::byte> again;
  try {
    rlx::gguf::Writer w(f.metadata());
    for (const auto& t : f.tensors()) w.add_tensor(t.name, t.type, t.dims, f.data(t));
    again = w.to_bytes();
  } catch (const rlx::Error& e) {
    std::fprintf(stderr, "the writer refused a file the reader accepted: %s\n", e.what());
    finding("write-back refused");
  }
  try {
    const auto g = rlx::gguf::File::view(again);
    if (!(g.metadata() == f.metadata())) finding("the metadata changed in the round trip");
    if (g.tensors().size() != f.tensors().size()) finding("the tensor count changed in the round trip");
    for (std::size_t i = 0; i < f.tensors().size(); ++i) {
      const auto& a = f.tensors()[i];
      const auto& b = g.tensors()[i];
      if (a.name != b.name || a.type != b.type || a.dims != b.dims || a.nbytes != b.nbytes)
        finding("a tensor info changed in the round trip");
      const auto da = f.data(a), db = g.data(b);
      if (!std::equal(da.begin(), da.end(), db.begin(), db.end())) finding("tensor bytes changed in the round trip");
    }
  } catch (const rlx::Error& e) {
    std::fprintf(stderr, "a written file does not read back: %s\n", e.what());
    finding("write-back unreadable");
  }
  return static_cast<int>(sum & 0);
}
