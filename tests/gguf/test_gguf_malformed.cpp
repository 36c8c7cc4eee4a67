// The malformed-GGUF corpus: every case is a valid file built by hand with one
// field broken (or cut short), and must give an rlx::Error whose message names
// the problem. Beyond the named cases: every prefix of a valid file, and every
// single-bit flip of it, must either parse or throw rlx::Error.
//
// tests/malformed/gguf/ holds the same cases as files (for `rlx inspect` in
// tests/tools/check_cli.sh and as fuzz seeds); regenerate them with
//   RLX_GGUF_WRITE_MALFORMED=tests/malformed/gguf build/tests/gguf_test_gguf_malformed
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>

#include "gguf/gguf_test_util.hpp"
#include "rlx/error.hpp"
#include "rlx/gguf/gguf.hpp"

namespace {

using rlx::gguf::File;
using rlx::gguf::testing::RawGguf;
using Bytes = std::vector<std::byte>;

constexpr std::uint64_t k2p63 = 1ull << 63;

struct BaseOptions {
  std::string kv2_key = "test.flag";
  std::string t0_name = "t0";
  std::string t1_name = "t1";
  bool alignment = false;            // add general.alignment as the last entry
  std::uint32_t alignment_type = 4;  // u32
  std::uint32_t alignment_value = 32;
};

// A small valid file, with the positions of its fields.
struct Base {
  RawGguf f;
  std::size_t n_tensors_at = 8, n_kv_at = 16;
  std::size_t key0_len_at = 0, key0_at = 0, value0_len_at = 0;   // general.architecture = "llama"
  std::size_t type1_at = 0, value1_at = 0;                       // test.count = u32 7
  std::size_t value2_at = 0;                                     // test.flag = true
  std::size_t elem3_type_at = 0, count3_at = 0, item3_1_at = 0;  // test.tokens = ["a", "bc", "def"]
  std::size_t inner4_count_at = 0;                               // test.nested = [[1, 2], [3]]
  std::size_t alignment_value_at = 0;
  struct Info {
    std::size_t name_at, n_dims_at, dim0_at, dim1_at, type_at, offset_at;
  } t0{}, t1{};
  std::size_t data_at = 0;
  std::size_t data_end = 0;  // end of the last tensor's bytes (before the final padding)
};

Base make_base(const BaseOptions& o = {}) {
  Base b;
  RawGguf& f = b.f;
  f.header(2, o.alignment ? 6 : 5);
  b.key0_len_at = f.size();
  f.str("general.architecture");
  b.key0_at = b.key0_len_at + 8;
  f.u32(8);
  b.value0_len_at = f.size();
  f.str("llama");

  f.str("test.count");
  b.type1_at = f.size();
  f.u32(4);
  b.value1_at = f.size();
  f.u32(7);

  f.str(o.kv2_key).u32(7);
  b.value2_at = f.size();
  f.u8(1);

  f.str("test.tokens").u32(9);
  b.elem3_type_at = f.size();
  f.u32(8);
  b.count3_at = f.size();
  f.u64(3).str("a");
  b.item3_1_at = f.size();
  f.str("bc").str("def");

  f.str("test.nested").u32(9).u32(9).u64(2);
  f.u32(4);
  b.inner4_count_at = f.size();
  f.u64(2).u32(1).u32(2);
  f.u32(4).u64(1).u32(3);

  if (o.alignment) {
    f.str("general.alignment").u32(o.alignment_type);
    b.alignment_value_at = f.size();
    if (o.alignment_type == 8)
      f.str(std::to_string(o.alignment_value));
    else if (o.alignment_type == 10)
      f.u64(o.alignment_value);
    else
      f.u32(o.alignment_value);
  }

  auto info = [&](Base::Info& in, const std::string& name, const std::vector<std::uint64_t>& dims, std::uint32_t type,
                  std::uint64_t offset) {
    in.name_at = f.size();
    f.str(name);
    in.n_dims_at = f.size();
    f.u32(static_cast<std::uint32_t>(dims.size()));
    in.dim0_at = f.size();
    in.dim1_at = f.size() + 8;
    for (auto d : dims) f.u64(d);
    in.type_at = f.size();
    f.u32(type);
    in.offset_at = f.size();
    f.u64(offset);
  };
  info(b.t0, o.t0_name, {8, 2}, 0, 0);  // F32: 64 bytes
  info(b.t1, o.t1_name, {32}, 8, 64);   // Q8_0: one block, 34 bytes
  f.pad_to(o.alignment && o.alignment_type == 4 && o.alignment_value && !(o.alignment_value & (o.alignment_value - 1))
               ? o.alignment_value
               : 32);
  b.data_at = f.size();
  for (int i = 0; i < 16; ++i) f.put(static_cast<float>(i));
  for (int i = 0; i < 34; ++i) f.u8(static_cast<std::uint8_t>(i));
  b.data_end = f.size();
  f.pad_to(32);
  return b;
}

struct Case {
  std::string name;
  std::function<Bytes()> make;
  std::vector<std::string> words;  // each must appear in the message
};

template <class T>
Bytes patched(Base b, std::size_t at, T v) {
  b.f.patch(at, v);
  return b.f.bytes;
}

// A file of one entry and no tensors, so that a cut inside the entry is reported where it falls (in the
// base file, a cut in the first entries leaves fewer bytes than its five entries need at least, which the
// header's count check reports first).
struct Single {
  RawGguf f;
  std::size_t key_at = 0, type_at = 0, value_at = 0;
};
Single single(const std::string& key, std::uint32_t type, const std::function<void(RawGguf&)>& value) {
  Single s;
  s.f.header(0, 1);
  s.key_at = s.f.size() + 8;
  s.f.str(key);
  s.type_at = s.f.size();
  s.f.u32(type);
  s.value_at = s.f.size();
  value(s.f);
  return s;
}
Single tokens() {
  return single("k.tokens", 9, [](RawGguf& f) { f.u32(8).u64(3).str("<|endoftext|>").str("bc").str("def"); });
}

Bytes nested(int depth) {
  RawGguf f;
  f.header(0, 1).str("deep").u32(9);
  for (int i = 1; i < depth; ++i) f.u32(9).u64(1);
  f.u32(4).u64(1).u32(5);
  return f.bytes;
}

std::vector<Case> cases() {
  const Base b = make_base();
  const auto cut = [](const Base& base, std::size_t n) { return base.f.prefix(n); };
  std::vector<Case> c;  // each case runs after this function returns, so it captures by value
  auto add = [&](std::string name, std::function<Bytes()> make, std::vector<std::string> words) {
    c.push_back({std::move(name), std::move(make), std::move(words)});
  };
  // Header.
  add("empty", [] { return Bytes{}; }, {"truncated", "magic", "at byte 0"});
  add("cut_in_magic", [=] { return cut(b, 3); }, {"truncated", "magic"});
  add("bad_magic", [=] { return patched(b, 0, std::array<char, 4>{'G', 'G', 'M', 'L'}); }, {"bad magic 'GGML'"});
  add("version_0", [=] { return patched<std::uint32_t>(b, 4, 0); }, {"unsupported GGUF version 0", "at byte 4"});
  add("version_1", [=] { return patched<std::uint32_t>(b, 4, 1); }, {"version 1", "v1"});
  add("version_4", [=] { return patched<std::uint32_t>(b, 4, 4); }, {"version 4", "versions 2 and 3"});
  add("version_big_endian", [=] { return patched<std::uint32_t>(b, 4, 0x03000000); }, {"big-endian"});
  add("cut_in_version", [=] { return cut(b, 6); }, {"truncated", "version"});
  add("cut_in_tensor_count", [=] { return cut(b, 12); }, {"truncated", "tensor_count", "at byte 8"});
  add("cut_in_kv_count", [=] { return cut(b, 20); }, {"truncated", "metadata_kv_count", "at byte 16"});
  add("huge_kv_count", [=] { return patched<std::uint64_t>(b, b.n_kv_at, k2p63); },
      {"metadata_kv_count 9223372036854775808", "at byte 16"});
  add("kv_count_past_eof", [=] { return patched<std::uint64_t>(b, b.n_kv_at, 1000); },
      {"metadata_kv_count 1000", "bytes left"});
  add("huge_tensor_count", [=] { return patched<std::uint64_t>(b, b.n_tensors_at, k2p63); },
      {"tensor_count 9223372036854775808", "at byte 8"});
  add("max_tensor_count", [=] { return patched<std::uint64_t>(b, b.n_tensors_at, ~0ull); },
      {"tensor_count 18446744073709551615"});
  // Keys.
  add("cut_in_first_entry", [=] { return cut(b, b.key0_len_at + 3); },
      {"metadata_kv_count 5 is more than the 3 bytes left", "truncated"});
  add("cut_in_key", [] { return tokens().f.prefix(tokens().key_at + 5); },
      {"metadata entry 0 key length 8", "past the end", "at byte 24"});
  add("huge_key_length", [=] { return patched<std::uint64_t>(b, b.key0_len_at, k2p63); },
      {"key length 9223372036854775808", "past the end", "at byte 24"});
  add("key_over_65535_bytes",
      [] {
        RawGguf f;
        f.header(0, 1).str(std::string(70000, 'k')).u32(4).u32(1);
        return f.bytes;
      },
      {"key length 70000", "65535"});
  add("duplicate_key", [] { return make_base({.kv2_key = "test.count"}).f.bytes; },
      {"duplicate metadata key 'test.count'", "entries 1 and 2"});
  // Values.
  add("unknown_value_type", [=] { return patched<std::uint32_t>(b, b.type1_at, 13); },
      {"metadata 'test.count' value type 13", "not a GGUF value type"});
  add("huge_value_type", [=] { return patched<std::uint32_t>(b, b.type1_at, 0x80000000u); }, {"value type 2147483648"});
  add("cut_in_value_type", [] { return tokens().f.prefix(tokens().type_at + 1); },
      {"truncated", "metadata 'k.tokens' value type"});
  add("cut_in_u32_value",
      [] {
        const Single s = single("k.count", 4, [](RawGguf& f) { f.u32(7); });
        return s.f.prefix(s.value_at + 2);
      },
      {"truncated", "metadata 'k.count' needs 4 bytes"});
  add("cut_in_string_value",
      [] {
        const Single s = single("k.name", 8, [](RawGguf& f) { f.str("llama"); });
        return s.f.prefix(s.value_at + 8 + 2);
      },
      {"metadata 'k.name' length 5", "past the end"});
  add("cut_in_string_length",
      [] {
        const Single s = single("k.name", 8, [](RawGguf& f) { f.str("llama"); });
        return s.f.prefix(s.value_at + 4);
      },
      {"truncated", "metadata 'k.name' length"});
  add("huge_string_length", [=] { return patched<std::uint64_t>(b, b.value0_len_at, k2p63); },
      {"'general.architecture' length 9223372036854775808", "past the end"});
  add("string_length_past_eof", [=] { return patched<std::uint64_t>(b, b.value0_len_at, b.f.size()); },
      {"'general.architecture' length", "runs past the end of the file"});
  add("bool_2", [=] { return patched<std::uint8_t>(b, b.value2_at, 2); }, {"metadata 'test.flag'", "bool value 2"});
  add("bool_255", [=] { return patched<std::uint8_t>(b, b.value2_at, 255); }, {"bool value 255"});
  add("unknown_array_elem_type", [=] { return patched<std::uint32_t>(b, b.elem3_type_at, 99); },
      {"'test.tokens' array element type 99"});
  add("huge_array_count", [=] { return patched<std::uint64_t>(b, b.count3_at, k2p63); },
      {"'test.tokens'", "array count 9223372036854775808"});
  add("array_count_past_eof", [=] { return patched<std::uint64_t>(b, b.count3_at, 1000); },
      {"'test.tokens'", "array count 1000", "bytes left"});
  add("cut_in_array_elem_type", [] { return tokens().f.prefix(tokens().value_at + 3); },
      {"truncated", "'k.tokens' array element type"});
  add("cut_in_array_count", [] { return tokens().f.prefix(tokens().value_at + 4 + 5); },
      {"truncated", "'k.tokens' array count"});
  add("cut_in_array", [] { return tokens().f.prefix(tokens().value_at + 12 + 21 + 3); },
      {"truncated", "'k.tokens' element 1 length"});
  add("cut_in_array_string", [] { return tokens().f.prefix(tokens().value_at + 12 + 21 + 10 + 9); },
      {"'k.tokens' element 2 length 3", "past the end"});
  add("array_item_length_past_eof", [=] { return patched<std::uint64_t>(b, b.item3_1_at, 1ull << 40); },
      {"'test.tokens' element 1 length 1099511627776", "past the end"});
  add("huge_nested_count", [=] { return patched<std::uint64_t>(b, b.inner4_count_at, k2p63); },
      {"'test.nested' element 0: array count 9223372036854775808"});
  add("nested_too_deep", [] { return nested(9); }, {"metadata 'deep'", "nested more than 8 deep"});
  // general.alignment.
  add("alignment_0", [] { return make_base({.alignment = true, .alignment_value = 0}).f.bytes; },
      {"'general.alignment' is 0", "power of two"});
  add("alignment_3", [] { return make_base({.alignment = true, .alignment_value = 3}).f.bytes; },
      {"'general.alignment' is 3", "not a power of two"});
  add("alignment_u64", [] { return make_base({.alignment = true, .alignment_type = 10}).f.bytes; },
      {"'general.alignment' must be u32, found u64"});
  add("alignment_string", [] { return make_base({.alignment = true, .alignment_type = 8}).f.bytes; },
      {"'general.alignment' must be u32, found string"});
  add("alignment_128_misaligns_offset", [] { return make_base({.alignment = true, .alignment_value = 128}).f.bytes; },
      {"tensor 't1' offset 64", "not a multiple of the alignment 128"});
  // Tensor infos.
  add("cut_in_tensor_name", [=] { return cut(b, b.t0.name_at + 9); }, {"tensor 0 name length 2", "past the end"});
  add("huge_tensor_name_length", [=] { return patched<std::uint64_t>(b, b.t0.name_at, k2p63); },
      {"tensor 0 name length 9223372036854775808"});
  add("empty_tensor_name", [] { return make_base({.t0_name = ""}).f.bytes; }, {"tensor 0 has an empty name"});
  add("tensor_name_64_bytes", [] { return make_base({.t0_name = std::string(64, 'n')}).f.bytes; },
      {"tensor 0 name is 64 bytes", "at most 63"});
  add("duplicate_tensor_name", [] { return make_base({.t1_name = "t0"}).f.bytes; },
      {"duplicate tensor name 't0'", "tensors 0 and 1"});
  add("cut_in_n_dims", [=] { return cut(b, b.t0.n_dims_at + 2); }, {"truncated", "tensor 't0' n_dims"});
  add("n_dims_0", [=] { return patched<std::uint32_t>(b, b.t0.n_dims_at, 0); }, {"tensor 't0' n_dims 0", "1 to 4"});
  add("n_dims_5", [=] { return patched<std::uint32_t>(b, b.t0.n_dims_at, 5); }, {"tensor 't0' n_dims 5"});
  add("n_dims_huge", [=] { return patched<std::uint32_t>(b, b.t0.n_dims_at, 0xFFFFFFFFu); }, {"n_dims 4294967295"});
  add("cut_in_dims", [=] { return cut(b, b.t0.dim1_at + 1); }, {"truncated", "tensor 't0' dim 1"});
  add("dim_2p63", [=] { return patched<std::uint64_t>(b, b.t0.dim0_at, k2p63); },
      {"tensor 't0' dim 0 is 9223372036854775808", "int64"});
  add("dims_product_overflow",
      [=] {
        Base x = b;
        x.f.patch<std::uint64_t>(x.t0.dim0_at, 1ull << 32);
        x.f.patch<std::uint64_t>(x.t0.dim1_at, 1ull << 32);
        return x.f.bytes;
      },
      {"tensor 't0' dims", "element count", "overflows int64"});
  add("dims_bytes_overflow",
      [=] {
        Base x = b;
        x.f.patch<std::uint64_t>(x.t0.dim0_at, 1ull << 62);
        x.f.patch<std::uint64_t>(x.t0.dim1_at, 1);
        return x.f.bytes;
      },
      {"tensor 't0' dims", "byte size", "overflows 64 bits"});
  add("cut_in_tensor_type", [=] { return cut(b, b.t1.type_at + 3); }, {"truncated", "tensor 't1' type"});
  add("unknown_tensor_type_4", [=] { return patched<std::uint32_t>(b, b.t1.type_at, 4); },
      {"tensor 't1' type 4", "not a ggml type"});
  add("unknown_tensor_type_max", [=] { return patched<std::uint32_t>(b, b.t1.type_at, 0xFFFFFFFFu); },
      {"tensor 't1' type 4294967295"});
  add("dim0_not_block_multiple", [=] { return patched<std::uint64_t>(b, b.t1.dim0_at, 31); },
      {"tensor 't1' dims", "dim 0 (31)", "Q8_0's block of 32"});
  add("cut_in_tensor_offset", [=] { return cut(b, b.t1.offset_at + 7); }, {"truncated", "tensor 't1' offset"});
  add("misaligned_offset", [=] { return patched<std::uint64_t>(b, b.t1.offset_at, 65); },
      {"tensor 't1' offset 65", "not a multiple of the alignment 32"});
  add("offset_past_eof", [=] { return patched<std::uint64_t>(b, b.t1.offset_at, 1ull << 40); },
      {"tensor 't1' offset 1099511627776", "runs past the end"});
  add("offset_wraps_around", [=] { return patched<std::uint64_t>(b, b.t1.offset_at, ~0ull - 31); },
      {"tensor 't1' offset 18446744073709551584", "runs past the end"});
  add("data_past_eof_first", [=] { return cut(b, b.data_at + 10); }, {"tensor 't0'", "runs past the end"});
  add("data_past_eof_last", [=] { return cut(b, b.data_end - 1); },
      {"tensor 't1' offset 64 + 34 bytes", "past the end"});
  add("cut_before_data_section", [=] { return cut(b, b.t1.offset_at + 8); },
      {"the data section starts at byte 352", "past the end of the file"});
  add("cut_in_data_section_padding", [=] { return cut(b, b.data_at - 1); },
      {"the data section starts at byte 352", "past the end of the file"});
  add("overlapping_tensors", [=] { return patched<std::uint64_t>(b, b.t1.offset_at, 32); },
      {"tensor 't1' data at offset 32 overlaps tensor 't0'"});
  add("same_offset_tensors", [=] { return patched<std::uint64_t>(b, b.t1.offset_at, 0); },
      {"overlaps tensor 't0' (offset 0, 64 bytes)"});
  return c;
}

void expect_error(const Bytes& bytes, const std::vector<std::string>& words, const std::string& name) {
  try {
    (void)File::view(bytes, "'" + name + "'");
    ADD_FAILURE() << name << ": parsed without an error";
  } catch (const rlx::Error& e) {
    const std::string msg = e.what();
    for (const auto& w : words) EXPECT_NE(msg.find(w), std::string::npos) << name << ": no '" << w << "' in: " << msg;
  }
}

TEST(GgufMalformed, TheBaseFileIsValid) {
  const Base b = make_base();
  const File f = File::view(b.f.bytes);
  EXPECT_EQ(f.metadata().get_string("general.architecture"), "llama");
  EXPECT_EQ(f.metadata().get_u32("test.count"), 7u);
  EXPECT_TRUE(f.metadata().get_bool("test.flag"));
  EXPECT_EQ(f.metadata().get_array_of<std::string>("test.tokens"), (std::vector<std::string>{"a", "bc", "def"}));
  EXPECT_EQ(f.metadata().get_array("test.nested").depth(), 2);
  ASSERT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.tensors()[1].nbytes, 34u);
  EXPECT_EQ(f.data_offset(), b.data_at);
  EXPECT_NO_THROW(File::view(make_base({.alignment = true}).f.bytes));
  EXPECT_NO_THROW(File::view(nested(8)));  // the deepest nesting allowed
}

TEST(GgufMalformed, EveryCaseThrowsAnErrorNamingTheProblem) {
  const auto all = cases();
  EXPECT_GE(all.size(), 30u);
  for (const auto& c : all) expect_error(c.make(), c.words, c.name);
}

TEST(GgufMalformed, EveryPrefixOfAValidFileIsRefused) {
  const Base b = make_base();
  // Past data_end only the final padding is missing, which is allowed.
  for (std::size_t n = 0; n < b.data_end; ++n) {
    try {
      (void)File::view(b.f.prefix(n));
      ADD_FAILURE() << "a prefix of " << n << " bytes parsed";
    } catch (const rlx::Error& e) {
      const std::string msg = e.what();
      EXPECT_TRUE(msg.find("truncated") != std::string::npos || msg.find("past the end") != std::string::npos ||
                  msg.find("bytes left") != std::string::npos)
          << n << ": " << msg;
    }
  }
  EXPECT_NO_THROW(File::view(b.f.prefix(b.data_end)));
}

TEST(GgufMalformed, EverySingleBitFlipParsesOrThrowsRlxError) {
  const Base b = make_base({.alignment = true});
  int refused = 0;
  for (std::size_t i = 0; i < b.data_at; ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      Bytes x = b.f.bytes;
      x[i] ^= std::byte(1u << bit);
      try {
        const File f = File::view(x);
        for (const auto& t : f.tensors()) ASSERT_LE(t.file_offset + t.nbytes, x.size());
      } catch (const rlx::Error&) {
        ++refused;
      }
    }
  }
  EXPECT_GT(refused, 0);
}

// The committed files: the same cases (tests/malformed/gguf/expected.txt lists each file's words).
TEST(GgufMalformed, CommittedFilesMatchTheCases) {
  const std::string dir = std::string(RLX_SOURCE_DIR) + "/tests/malformed/gguf";
  if (const char* out = std::getenv("RLX_GGUF_WRITE_MALFORMED")) {
    std::ofstream manifest(std::string(out) + "/expected.txt");
    manifest << "# Malformed GGUF files, one per line: the file, a tab, then the words its rlx::Error must contain,\n"
                "# separated by ' | '. Written by tests/gguf/test_gguf_malformed.cpp (RLX_GGUF_WRITE_MALFORMED=dir);\n"
                "# read by that test and by tests/tools/check_cli.sh (`rlx inspect` on each).\n";
    for (const auto& c : cases()) {
      const Bytes bytes = c.make();
      if (bytes.size() > 4096) continue;  // the 70 kB key stays in code
      std::ofstream(std::string(out) + "/" + c.name + ".gguf", std::ios::binary)
          .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
      manifest << c.name << ".gguf\t";
      for (std::size_t i = 0; i < c.words.size(); ++i) manifest << (i ? " | " : "") << c.words[i];
      manifest << "\n";
    }
  }
  std::ifstream manifest(dir + "/expected.txt");
  ASSERT_TRUE(manifest) << "missing " << dir << "/expected.txt";
  std::string line;
  int n = 0;
  while (std::getline(manifest, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto tab = line.find('\t');
    ASSERT_NE(tab, std::string::npos) << line;
    const std::string file = line.substr(0, tab);
    std::vector<std::string> words;
    std::string rest = line.substr(tab + 1);
    for (std::size_t at = 0;;) {
      const auto sep = rest.find(" | ", at);
      words.push_back(rest.substr(at, sep == std::string::npos ? std::string::npos : sep - at));
      if (sep == std::string::npos) break;
      at = sep + 3;
    }
    try {
      (void)File::open(dir + "/" + file);
      ADD_FAILURE() << file << " parsed";
    } catch (const rlx::Error& e) {
      const std::string msg = e.what();
      for (const auto& w : words) EXPECT_NE(msg.find(w), std::string::npos) << file << ": no '" << w << "' in " << msg;
    }
    ++n;
  }
  EXPECT_GE(n, 30);
}

}  // namespace
