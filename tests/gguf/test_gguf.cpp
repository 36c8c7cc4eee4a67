// The GGUF container: metadata values and getters, the writer, round trips
// (a file we write reads back identically and loads in gguf-py's GGUFReader),
// and zero-copy views. The malformed corpus: test_gguf_malformed.cpp; the real
// SmolLM2 file: test_gguf_smollm2.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <random>

#include "gguf/gguf_py_compare.hpp"
#include "gguf/gguf_test_util.hpp"
#include "rlx/error.hpp"
#include "rlx/gguf/gguf.hpp"
#include "rlx/gguf/inspect.hpp"

namespace {

using namespace rlx::gguf;
using rlx::gguf::testing::RawGguf;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const rlx::Error& e) {
    return e.what();
  }
  return "(no error)";
}

std::vector<std::byte> random_bytes(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> b(n);
  for (auto& x : b) x = static_cast<std::byte>(rng() & 0xff);
  return b;
}

// Every value type, arrays of each, nested arrays (uniform, so GGUFReader's flattened view is comparable),
// empty arrays and strings, extremes.
Metadata every_type_metadata() {
  Metadata m;
  m.set("general.architecture", "llama");
  m.set("t.u8", std::uint8_t{255});
  m.set("t.i8", std::int8_t{-128});
  m.set("t.u16", std::uint16_t{65535});
  m.set("t.i16", std::int16_t{-32768});
  m.set("t.u32", std::uint32_t{4000000000u});
  m.set("t.i32", std::int32_t{-2000000000});
  m.set("t.f32", 0.1f);
  m.set("t.bool.true", true);
  m.set("t.bool.false", false);
  m.set("t.string", "h\xc3\xa9llo \xf0\x9f\x98\x80");
  m.set("t.string.empty", "");
  m.set("t.u64", std::numeric_limits<std::uint64_t>::max());
  m.set("t.i64", std::numeric_limits<std::int64_t>::min());
  m.set("t.f64", -1.0e300);
  m.set("a.u8", std::vector<std::uint8_t>{0, 1, 255});
  m.set("a.i8", std::vector<std::int8_t>{-1, 2});
  m.set("a.u16", std::vector<std::uint16_t>{7});
  m.set("a.i16", std::vector<std::int16_t>{-7, 7});
  m.set("a.u32", std::vector<std::uint32_t>{1, 2, 3});
  m.set("a.i32", std::vector<std::int32_t>{-1, 0, 1});
  m.set("a.f32", std::vector<float>{1.5f, -0.0f, 3.0e38f});
  m.set("a.bool", std::vector<bool>{true, false, true});
  m.set("a.string", std::vector<std::string>{"a", "", "ccc"});
  m.set("a.u64", std::vector<std::uint64_t>{1ull << 63});
  m.set("a.i64", std::vector<std::int64_t>{-5});
  m.set("a.f64", std::vector<double>{2.5, 1e-300});
  m.set("a.empty", Array::empty(ValueType::U32));
  m.set("a.nested", std::vector<Array>{Array(std::vector<std::uint32_t>{1, 2}), Array(std::vector<std::uint32_t>{3})});
  m.set("a.nested.strings", std::vector<Array>{Array(std::vector<std::string>{"x", "yy"})});
  m.set("a.nested3", std::vector<Array>{Array(std::vector<Array>{Array(std::vector<std::int16_t>{-1, 1})})});
  return m;
}

Writer every_type_writer(const std::vector<std::vector<std::byte>>& data) {
  Writer w(every_type_metadata());
  w.add_tensor("f32", GgmlType::F32, {3, 2}, data[0]);
  w.add_tensor("f16", GgmlType::F16, {5}, data[1]);
  w.add_tensor("q4_0", GgmlType::Q4_0, {64, 2}, data[2]);
  w.add_tensor("q8_0", GgmlType::Q8_0, {32, 1, 1, 3}, data[3]);
  w.add_tensor("q4_k", GgmlType::Q4_K, {256}, data[4]);
  w.add_tensor("empty", GgmlType::F32, {0, 4}, data[5]);
  w.add_tensor("i8", GgmlType::I8, {7}, data[6]);
  return w;
}

std::vector<std::vector<std::byte>> every_type_data() {
  return {random_bytes(24, 1),  random_bytes(10, 2), random_bytes(72, 3), random_bytes(102, 4),
          random_bytes(144, 5), random_bytes(0, 6),  random_bytes(7, 7)};
}

TEST(GgufMetadata, TypedGettersNameTheKeyAndBothTypes) {
  Metadata m = every_type_metadata();
  EXPECT_EQ(m.get_u32("t.u32"), 4000000000u);
  EXPECT_EQ(m.get_string("general.architecture"), "llama");
  EXPECT_EQ(m.get_array_of<std::uint32_t>("a.u32"), (std::vector<std::uint32_t>{1, 2, 3}));
  EXPECT_EQ(m.get_integer("t.i8"), -128);
  EXPECT_EQ(m.get_integer("t.u32"), 4000000000);
  EXPECT_DOUBLE_EQ(m.get_float("t.f32"), static_cast<double>(0.1f));
  EXPECT_EQ(m.find_integer("missing"), std::nullopt);
  EXPECT_EQ(m.find_string("general.architecture"), "llama");

  EXPECT_EQ(error_of([&] { (void)m.get_u32("t.string"); }), "gguf: metadata 't.string': expected u32, found string");
  EXPECT_EQ(error_of([&] { (void)m.get_u32("nope"); }), "gguf: metadata has no key 'nope'");
  EXPECT_EQ(error_of([&] { (void)m.get_array_of<std::string>("a.u32"); }),
            "gguf: metadata 'a.u32': expected array of string, found array of u32");
  EXPECT_EQ(error_of([&] { (void)m.get_string("a.nested3"); }),
            "gguf: metadata 'a.nested3': expected string, found array of array of array of i16");
  EXPECT_NE(error_of([&] { (void)m.get_integer("t.u64"); }).find("does not fit in int64"), std::string::npos);
  EXPECT_NE(error_of([&] { (void)m.get_integer("t.f32"); }).find("expected an integer, found f32"), std::string::npos);
  EXPECT_NE(error_of([&] { m.add("t.u8", 1); }).find("duplicate metadata key 't.u8'"), std::string::npos);
}

TEST(GgufMetadata, SetReplacesInPlaceAndEraseKeepsOrder) {
  Metadata m;
  m.set("a", 1);
  m.set("b", 2);
  m.set("c", 3);
  m.set("a", "one");
  EXPECT_EQ(m.entries()[0].key, "a");
  EXPECT_EQ(m.get_string("a"), "one");
  EXPECT_TRUE(m.erase("b"));
  EXPECT_FALSE(m.erase("b"));
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m.entries()[1].key, "c");
  EXPECT_EQ(m.get_i32("c"), 3);
}

TEST(GgufMetadata, FloatsCompareByBits) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(Value(nan), Value(nan));
  EXPECT_FALSE(Value(0.0f) == Value(-0.0f));
  EXPECT_EQ(Value(std::vector<double>{std::nan("")}), Value(std::vector<double>{std::nan("")}));
  EXPECT_FALSE(Value(std::uint32_t{1}) == Value(std::int32_t{1}));  // the type is part of the value
}

TEST(GgufRoundTrip, EveryValueTypeAndTensorTypeReadsBackIdentically) {
  const auto data = every_type_data();
  const Writer w = every_type_writer(data);
  const auto bytes = w.to_bytes();
  EXPECT_EQ(bytes.size(), w.file_size());
  const File f = File::view(bytes);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.metadata(), every_type_metadata());
  ASSERT_EQ(f.tensors().size(), 7u);
  const std::vector<std::string> names{"f32", "f16", "q4_0", "q8_0", "q4_k", "empty", "i8"};
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto& t = f.tensors()[i];
    EXPECT_EQ(t.name, names[i]);
    EXPECT_EQ(t.offset % 32, 0u);
    EXPECT_EQ(t.nbytes, data[i].size());
    const auto view = f.data(t);
    EXPECT_TRUE(std::equal(view.begin(), view.end(), data[i].begin(), data[i].end())) << t.name;
  }
  EXPECT_EQ(f.tensors()[3].dims, (std::vector<std::int64_t>{32, 1, 1, 3}));
  EXPECT_EQ(f.tensors()[3].type, GgmlType::Q8_0);
  EXPECT_EQ(f.tensors()[3].numel(), 96);

  // Written again from what was read: the same bytes.
  Writer again(f.metadata());
  for (const auto& t : f.tensors()) again.add_tensor(t.name, t.type, t.dims, f.data(t));
  EXPECT_EQ(again.to_bytes(), bytes);
}

TEST(GgufRoundTrip, AlignmentFromMetadataPadsEveryTensor) {
  Metadata m;
  m.set(std::string(kAlignmentKey), std::uint32_t{256});
  Writer w(m);
  w.add_tensor("a", GgmlType::F32, {3}, random_bytes(12, 1));
  w.add_tensor("b", GgmlType::F32, {100}, random_bytes(400, 2));
  w.add_tensor("c", GgmlType::F16, {1}, random_bytes(2, 3));
  const auto bytes = w.to_bytes();
  const File f = File::view(bytes);
  EXPECT_EQ(f.alignment(), 256u);
  EXPECT_EQ(f.data_offset() % 256, 0u);
  EXPECT_EQ(f.tensors()[1].offset, 256u);
  EXPECT_EQ(f.tensors()[2].offset, 768u);
  EXPECT_EQ(bytes.size() % 256, 0u);
}

TEST(GgufRoundTrip, WriteToAFileThenOpenMapsIt) {
  const auto data = every_type_data();
  const auto dir = std::filesystem::temp_directory_path() / ("rlx_gguf_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = dir / "every_type.gguf";
  every_type_writer(data).write(path);
  EXPECT_FALSE(std::filesystem::exists(dir / "every_type.gguf.partial"));
  {
    File f = File::open(path);
    EXPECT_EQ(f.metadata(), every_type_metadata());
    // Zero copy: the view points into the file's mapping.
    const auto view = f.tensor("q4_k");
    EXPECT_EQ(view.bytes.data(), f.bytes().data() + view.info->file_offset);
    EXPECT_EQ(view.info->dims, (std::vector<std::int64_t>{256}));
    File moved = std::move(f);
    EXPECT_EQ(moved.tensor("q4_k").bytes.data(), view.bytes.data());  // moving keeps the mapping
    EXPECT_NE(error_of([&] { (void)moved.tensor("nope"); }).find("no tensor named 'nope'"), std::string::npos);
  }
  std::filesystem::remove_all(dir);
}

TEST(GgufRoundTrip, ReadsInGgufPysReader) {
  std::string why;
  if (!rlx::gguf::testing::python_with_gguf(why)) GTEST_SKIP() << why;
  const auto data = every_type_data();
  const auto dir = std::filesystem::temp_directory_path() / ("rlx_gguf_py_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = dir / "every_type.gguf";
  every_type_writer(data).write(path);
  const auto py = rlx::gguf::testing::gguf_py_dump(path);
  ASSERT_FALSE(py.is_null());
  rlx::gguf::testing::expect_matches_gguf_py(File::open(path), py);
  std::filesystem::remove_all(dir);
}

// Built byte by byte, not by the writer: v2, a gap between the tensors, no padding after the last one.
RawGguf hand_built_v2() {
  RawGguf f;
  f.header(2, 2, 2);
  f.str("general.name").u32(8).str("hand");
  f.str("x.scale").u32(12).put(0.25);
  f.str("a").u32(2).u64(4).u64(4).u32(0).u64(0);
  f.str("b").u32(1).u64(2).u32(0).u64(96);
  f.pad_to(32);
  for (int i = 0; i < 16; ++i) f.put(static_cast<float>(i));
  f.zeros(32);
  for (int i = 0; i < 2; ++i) f.put(-1.0f);
  return f;
}

TEST(GgufReader, ReadsAHandBuiltFile) {
  const RawGguf f = hand_built_v2();
  const std::size_t data_at = f.size() - 104;  // 64 + 32 + 8 bytes of data
  const File file = File::view(f.bytes);
  EXPECT_EQ(file.version(), 2u);
  EXPECT_EQ(file.data_offset(), data_at);
  EXPECT_EQ(file.metadata().get_string("general.name"), "hand");
  EXPECT_EQ(file.metadata().get_f64("x.scale"), 0.25);
  const auto a = file.tensor("a");
  EXPECT_EQ(a.info->dims, (std::vector<std::int64_t>{4, 4}));
  EXPECT_EQ(a.bytes.size(), 64u);
  float first = 0;
  std::memcpy(&first, a.bytes.data() + 4, 4);
  EXPECT_EQ(first, 1.0f);
  EXPECT_EQ(file.tensor("b").info->file_offset, data_at + 96);
  EXPECT_EQ(data_at % 32, 0u);
}

TEST(GgufReader, AFileWithoutTensorsMayEndBeforeTheDataSection) {
  RawGguf f;
  f.header(0, 1).str("k").u32(4).u32(1);  // 41 bytes; the data section would start at 64
  const File file = File::view(f.bytes);
  EXPECT_EQ(file.metadata().get_u32("k"), 1u);
  EXPECT_TRUE(file.tensors().empty());
}

TEST(GgufReader, OpenNamesThePathWhenItCannot) {
  EXPECT_NE(error_of([] { (void)File::open("/nonexistent/model.gguf"); }).find("cannot open '/nonexistent/model.gguf'"),
            std::string::npos);
  EXPECT_NE(error_of([] { (void)File::open("/"); }).find("not a regular file"), std::string::npos);
  const auto empty = std::filesystem::temp_directory_path() / ("rlx_gguf_empty_" + std::to_string(::getpid()));
  std::ofstream(empty).close();
  const std::string msg = error_of([&] { (void)File::open(empty); });
  EXPECT_NE(msg.find("truncated: magic"), std::string::npos) << msg;
  EXPECT_NE(msg.find(empty.string()), std::string::npos) << msg;
  std::filesystem::remove(empty);
}

TEST(GgufWriter, RefusesWhatTheReaderWouldRefuse) {
  const auto b32 = random_bytes(32, 1);
  Writer w;
  EXPECT_NE(error_of([&] { w.add_tensor("x", GgmlType::F32, {7}, b32); }).find("takes 28 bytes, given 32"),
            std::string::npos);
  EXPECT_NE(error_of([&] { w.add_tensor("x", GgmlType::Q8_0, {8}, b32); }).find("not a multiple of Q8_0's block"),
            std::string::npos);
  EXPECT_NE(error_of([&] { w.add_tensor("x", GgmlType::F32, {}, b32); }).find("1 to 4"), std::string::npos);
  EXPECT_NE(error_of([&] {
              w.add_tensor("x", GgmlType::F32, {1, 1, 1, 1, 8}, b32);
            }).find("1 to 4"),
            std::string::npos);
  EXPECT_NE(error_of([&] { w.add_tensor("x", GgmlType::F32, {-8}, b32); }).find("negative"), std::string::npos);
  EXPECT_NE(error_of([&] { w.add_tensor(std::string(64, 'n'), GgmlType::F32, {8}, b32); }).find("at most 63"),
            std::string::npos);
  EXPECT_NE(error_of([&] { w.add_tensor("", GgmlType::F32, {8}, b32); }).find("needs a name"), std::string::npos);
  w.add_tensor("x", GgmlType::F32, {8}, b32);
  EXPECT_NE(error_of([&] { w.add_tensor("x", GgmlType::F32, {8}, b32); }).find("duplicate tensor name 'x'"),
            std::string::npos);

  w.metadata().set(std::string(kAlignmentKey), std::uint32_t{48});
  EXPECT_NE(error_of([&] { (void)w.to_bytes(); }).find("not a power of two"), std::string::npos);
  w.metadata().set(std::string(kAlignmentKey), std::uint64_t{64});
  EXPECT_NE(error_of([&] { (void)w.to_bytes(); }).find("must be u32, found u64"), std::string::npos);
  w.metadata().erase(kAlignmentKey);

  Array deep(std::vector<std::uint8_t>{1});
  for (int i = 1; i <= kMaxArrayDepth; ++i) deep = Array(std::vector<Array>{deep});
  w.metadata().set("deep", deep);
  EXPECT_NE(error_of([&] { (void)w.to_bytes(); }).find("nested more than 8 deep"), std::string::npos);
  w.metadata().erase("deep");
  w.metadata().set(std::string(70000, 'k'), 1);
  EXPECT_NE(error_of([&] { (void)w.to_bytes(); }).find("GGUF keys are at most 65535"), std::string::npos);
}

TEST(GgufSizes, TensorBytesFollowTheBlocks) {
  EXPECT_EQ(tensor_nbytes(GgmlType::F32, std::vector<std::int64_t>{576, 49152}), 576ull * 49152 * 4);
  EXPECT_EQ(tensor_nbytes(GgmlType::Q4_1, std::vector<std::int64_t>{576, 1536}), 576ull / 32 * 20 * 1536);
  EXPECT_EQ(tensor_nbytes(GgmlType::Q6_K, std::vector<std::int64_t>{512, 2}), 2ull * 210 * 2);
  EXPECT_EQ(tensor_nbytes(GgmlType::F16, std::vector<std::int64_t>{0, 9}), 0u);
  EXPECT_THROW((void)tensor_nbytes(GgmlType::Q4_K, std::vector<std::int64_t>{576}), rlx::Error);
  EXPECT_THROW((void)tensor_nbytes(GgmlType::F32, std::vector<std::int64_t>{1ll << 62, 4}), rlx::Error);
}

TEST(GgufInspect, PrintsMetadataTensorsAndTotals) {
  const auto data = every_type_data();
  const auto bytes = every_type_writer(data).to_bytes();
  const File f = File::view(bytes);
  const std::string text = inspect_text(f, {.max_items = 2});
  EXPECT_NE(text.find("GGUF v3"), std::string::npos);
  EXPECT_NE(text.find("metadata: 31 keys"), std::string::npos) << text;
  EXPECT_NE(text.find("[3] [\"a\", \"\", ... (1 more)]"), std::string::npos) << text;
  EXPECT_NE(text.find("array of array of u32"), std::string::npos) << text;
  EXPECT_NE(text.find("q8_0"), std::string::npos);
  EXPECT_NE(text.find("[32, 1, 1, 3]"), std::string::npos) << text;
  EXPECT_NE(text.find("total: 7 tensors"), std::string::npos) << text;
  EXPECT_EQ(format_value(Value("a\"b\n\x01")), "\"a\\\"b\\n\\x01\"");
  EXPECT_EQ(format_value(Value(std::uint8_t{200})), "200");
  EXPECT_EQ(format_value(Value(std::vector<bool>{true, false})), "[2] [true, false]");
}

// The fuzz harness's seed corpus (tests/fuzz/corpus/gguf): small valid files, the same bytes as the writer
// makes now. Regenerate with RLX_GGUF_WRITE_SEEDS=tests/fuzz/corpus/gguf build/tests/gguf_test_gguf.
TEST(GgufFuzzSeeds, AreTheWritersFilesAndParse) {
  const auto data = every_type_data();
  std::vector<std::pair<std::string, std::vector<std::byte>>> seeds;
  seeds.emplace_back("every_type.gguf", every_type_writer(data).to_bytes());
  {
    Metadata m;
    m.set("general.architecture", "llama");
    m.set("llama.block_count", std::uint32_t{2});
    m.set("tokenizer.ggml.tokens", std::vector<std::string>{"<s>", "</s>", "a", "b"});
    seeds.emplace_back("metadata_only.gguf", Writer(m).to_bytes());
  }
  {
    Metadata m;
    m.set(std::string(kAlignmentKey), std::uint32_t{64});
    Writer w(m);
    w.add_tensor("blk.0.attn_q.weight", GgmlType::Q4_0, {32, 2}, random_bytes(36, 11));
    w.add_tensor("blk.0.attn_norm.weight", GgmlType::F32, {5}, random_bytes(20, 12));
    w.add_tensor("blk.0.ffn_down.weight", GgmlType::Q6_K, {256}, random_bytes(210, 13));
    seeds.emplace_back("aligned_64.gguf", w.to_bytes());
  }
  seeds.emplace_back("hand_v2.gguf", hand_built_v2().bytes);

  const std::string dir = std::string(RLX_SOURCE_DIR) + "/tests/fuzz/corpus/gguf";
  if (const char* out = std::getenv("RLX_GGUF_WRITE_SEEDS"))
    for (const auto& [name, bytes] : seeds)
      std::ofstream(std::string(out) + "/" + name, std::ios::binary)
          .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  for (const auto& [name, bytes] : seeds) {
    EXPECT_LE(bytes.size(), 8192u) << name << ": scripts/fuzz.sh runs with -max_len=8192";
    const File f = File::open(dir + "/" + name);
    EXPECT_TRUE(std::equal(f.bytes().begin(), f.bytes().end(), bytes.begin(), bytes.end()))
        << name << " differs from what the writer makes now; regenerate the seeds";
  }
}

}  // namespace
