// The wider integer types and the storage-only types (float8, float4, int4, int2): their codecs against
// bit patterns worked out by hand from the formats' definitions (ONNX's and ml_dtypes'), ONNX's Cast rounding
// (saturate, e8m0's round modes), and the errors an op gives for a type it does not take.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "rlx/error.hpp"
#include "rlx/ir/graph.hpp"
#include "rlx/ir/op_def.hpp"
#include "rlx/ir/text.hpp"
#include "rlx/reference/interpreter.hpp"

namespace rlx::ir {
namespace {

struct Bits {
  DType t;
  double value;
  std::uint8_t bits;
};

// Each value is exact in its type: it encodes to `bits`, and `bits` decodes to it.
constexpr Bits kExact[] = {
    {DType::F8E4M3FN, 1.0, 0x38},
    {DType::F8E4M3FN, -2.0, 0xc0},
    {DType::F8E4M3FN, 448.0, 0x7e},
    {DType::F8E4M3FN, 0x1p-9, 0x01},
    {DType::F8E4M3FN, 0x1p-6, 0x08},
    {DType::F8E4M3FN, -0.0, 0x80},
    {DType::F8E4M3FNUZ, 1.0, 0x40},
    {DType::F8E4M3FNUZ, 240.0, 0x7f},
    {DType::F8E4M3FNUZ, 0x1p-10, 0x01},
    {DType::F8E5M2, 1.0, 0x3c},
    {DType::F8E5M2, 57344.0, 0x7b},
    {DType::F8E5M2, -0x1p-16, 0x81},
    {DType::F8E5M2FNUZ, 1.0, 0x40},
    {DType::F8E5M2FNUZ, 57344.0, 0x7f},
    {DType::F8E5M2FNUZ, 0x1p-17, 0x01},
    {DType::F8E8M0, 1.0, 0x7f},
    {DType::F8E8M0, 0x1p-127, 0x00},
    {DType::F8E8M0, 0x1p127, 0xfe},
    {DType::F4E2M1, 6.0, 0x7},
    {DType::F4E2M1, -0.5, 0x9},
    {DType::F4E2M1, 1.5, 0x3},
    {DType::I4, -8, 0x8},
    {DType::I4, 7, 0x7},
    {DType::I4, -1, 0xf},
    {DType::U4, 15, 0xf},
    {DType::I2, -2, 0x2},
    {DType::U2, 3, 0x3},
};

TEST(StorageDTypes, KnownBitPatterns) {
  for (const Bits& b : kExact) {
    SCOPED_TRACE(std::string(dtype_name(b.t)) + " " + std::to_string(b.value));
    EXPECT_EQ(storage_encode(b.t, b.value), b.bits);
    const double back = storage_decode(b.t, b.bits);
    EXPECT_EQ(back, b.value);
    EXPECT_EQ(std::signbit(back), std::signbit(b.value));
  }
}

TEST(StorageDTypes, NaNsAndInfinities) {
  EXPECT_TRUE(std::isnan(storage_decode(DType::F8E4M3FN, 0x7f)));
  EXPECT_TRUE(std::isnan(storage_decode(DType::F8E4M3FN, 0xff)));
  EXPECT_EQ(storage_decode(DType::F8E4M3FN, 0x7e), 448);  // S.1111.110 is finite in the FN types
  EXPECT_TRUE(std::isnan(storage_decode(DType::F8E4M3FNUZ, 0x80)));
  EXPECT_TRUE(std::isnan(storage_decode(DType::F8E5M2FNUZ, 0x80)));
  EXPECT_EQ(storage_decode(DType::F8E5M2, 0x7c), std::numeric_limits<double>::infinity());
  EXPECT_EQ(storage_decode(DType::F8E5M2, 0xfc), -std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(storage_decode(DType::F8E5M2, 0x7e)));
  EXPECT_TRUE(std::isnan(storage_decode(DType::F8E8M0, 0xff)));
  // FNUZ has no -0: a negative zero stores as +0, not as the NaN 0x80.
  EXPECT_EQ(storage_encode(DType::F8E4M3FNUZ, -0.0), 0x00);
}

// Every byte of a float8 type that is not a NaN decodes to a value that encodes back to it.
TEST(StorageDTypes, EveryFloat8ByteRoundTrips) {
  for (DType t : {DType::F8E4M3FN, DType::F8E4M3FNUZ, DType::F8E5M2, DType::F8E5M2FNUZ, DType::F8E8M0}) {
    int checked = 0;
    for (int b = 0; b < 256; ++b) {
      const double v = storage_decode(t, std::uint8_t(b));
      if (std::isnan(v)) continue;
      EXPECT_EQ(storage_encode(t, v), b) << dtype_name(t) << " byte " << b;
      ++checked;
    }
    EXPECT_GT(checked, 200) << dtype_name(t);
  }
}

TEST(StorageDTypes, CastRoundingFollowsOnnx) {
  const double inf = std::numeric_limits<double>::infinity();
  // Round to nearest, ties to even: 464 lies between 448 (mantissa 110) and 480, which is E4M3FN's NaN.
  EXPECT_EQ(round_to_dtype(464, DType::F8E4M3FN, {}), 448);
  EXPECT_EQ(round_to_dtype(1.0625, DType::F8E4M3FN, {}), 1.0);  // a tie rounds to the even 1.0
  EXPECT_EQ(round_to_dtype(1.1875, DType::F8E4M3FN, {}), 1.25);
  // Saturating (ONNX's default) and not.
  EXPECT_EQ(round_to_dtype(1e6, DType::F8E4M3FN, {.saturate = true}), 448);
  EXPECT_EQ(round_to_dtype(-inf, DType::F8E4M3FN, {.saturate = true}), -448);
  EXPECT_TRUE(std::isnan(round_to_dtype(1e6, DType::F8E4M3FN, {.saturate = false})));
  EXPECT_EQ(round_to_dtype(1e6, DType::F8E5M2, {.saturate = false}), inf);
  EXPECT_EQ(round_to_dtype(1e6, DType::F8E5M2, {.saturate = true}), 57344);
  EXPECT_TRUE(std::isnan(round_to_dtype(-1e6, DType::F8E5M2FNUZ, {.saturate = false})));
  // The plain rounding keeps what a cast produced: an inf in E5M2, a saturated value, a NaN.
  EXPECT_EQ(round_to_dtype(inf, DType::F8E5M2), inf);
  EXPECT_EQ(round_to_dtype(448, DType::F8E4M3FN), 448);
  // float4 e2m1: ties to even, and it saturates (it has no inf or NaN).
  EXPECT_EQ(round_to_dtype(2.5, DType::F4E2M1), 2);
  EXPECT_EQ(round_to_dtype(5, DType::F4E2M1), 4);
  EXPECT_EQ(round_to_dtype(-100, DType::F4E2M1), -6);
  // float8 e8m0: a power of two, the exponent rounded up (default), down or to nearest.
  EXPECT_EQ(round_to_dtype(0.3, DType::F8E8M0, {}), 0.5);
  EXPECT_EQ(round_to_dtype(0.3, DType::F8E8M0, {.round = E8M0Round::Down}), 0.25);
  EXPECT_EQ(round_to_dtype(0.3, DType::F8E8M0, {.round = E8M0Round::Nearest}), 0.25);
  EXPECT_EQ(round_to_dtype(0.375, DType::F8E8M0, {.round = E8M0Round::Nearest}), 0.5);
  EXPECT_EQ(round_to_dtype(0x1.8p127, DType::F8E8M0, {.saturate = true}), 0x1p127);
  // The small integers wrap like the others.
  EXPECT_EQ(round_to_dtype(9, DType::I4), -7);
  EXPECT_EQ(round_to_dtype(-1, DType::U2), 3);
}

TEST(WideIntegers, RoundingAndRanges) {
  EXPECT_EQ(round_to_dtype(40000, DType::I16), 40000 - 65536);
  EXPECT_EQ(round_to_dtype(-1, DType::U16), 65535);
  EXPECT_EQ(round_to_dtype(-1, DType::U32), 4294967295.0);
  EXPECT_EQ(round_to_dtype(-1, DType::U64), 18446744073709551615.0);  // as close as a double gets
  EXPECT_EQ(round_to_dtype(18446744073709551616.0 + 8192.0, DType::U64), 8192.0);
  EXPECT_EQ(dtype_size(DType::I16), 2u);
  EXPECT_EQ(dtype_size(DType::U32), 4u);
  EXPECT_EQ(dtype_size(DType::U64), 8u);
  EXPECT_EQ(dtype_size(DType::F8E4M3FN), 1u);
  EXPECT_TRUE(is_integer(DType::U64));
  EXPECT_FALSE(is_integer(DType::I4));  // storage-only: no op computes with it
  EXPECT_TRUE(is_unsigned(DType::U16));
  EXPECT_FALSE(is_float(DType::F8E5M2));
  // A u64 tensor holds values past 2^63 exactly; only Tensor::get's double rounds them.
  Tensor t(DType::U64, {1});
  t.data_as<std::uint64_t>()[0] = 18446744073709551615ull;
  EXPECT_EQ(t.get(0), 18446744073709551616.0);
}

TEST(StorageDTypes, TextFormRoundTrips) {
  const std::string text = R"(graph g {
  %0 = input "x" : f32[3]
  %1 = cast %0 {saturate=false, to=f8e4m3fn} : f8e4m3fn[3]
  %2 = cast %0 {round_mode="nearest", to=f8e8m0} : f8e8m0[3]
  %3 = constant {value=[-8, 7]} : i4[2]
  %4 = constant {value=[65535, 0]} : u16[2]
  %5 = constant {value=[0.5, 448]} : f8e4m3fn[2]
  %6 = cast %0 {to=u64} : u64[3]
  output %1, %2, %3, %4, %5, %6
}
)";
  EXPECT_EQ(to_text(parse_text(text)), text);
  for (DType t : kStorageDTypes) EXPECT_EQ(parse_dtype(dtype_name(t)), t);
  for (DType t : kAllDTypes) EXPECT_EQ(parse_dtype(dtype_name(t)), t);
}

// An op that computes refuses a storage-only operand, naming the op, the operand and its dtype.
TEST(StorageDTypes, OpsRefuseThemByName) {
  Graph g("g");
  auto x = g.input("x", Shape{4}, DType::F8E4M3FN);
  try {
    g.unary(OpKind::Exp, x);
    FAIL() << "exp took f8e4m3fn";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("exp"), std::string::npos) << what;
    EXPECT_NE(what.find("operand 0 is f8e4m3fn"), std::string::npos) << what;
    EXPECT_NE(what.find("storage-only"), std::string::npos) << what;
  }
  EXPECT_THROW(g.binary(OpKind::Add, x, x), Error);
  // Cast and movement take them; a cast to a block type is refused.
  auto moved = g.permute(g.reshape(x, Shape{2, 2}), {1, 0});
  EXPECT_EQ(g.node(g.cast(moved, DType::F32)).dtype, DType::F32);
  EXPECT_THROW(g.cast(x, DType::Q4_0), Error);
  // An unknown round mode is an error naming it.
  Attrs bad{{"to", DType::F8E8M0}, {"round_mode", std::string("sideways")}};
  try {
    g.add(OpKind::Cast, {g.input("y", Shape{2}, DType::F32)}, bad);
    FAIL() << "round_mode 'sideways' accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sideways"), std::string::npos) << e.what();
  }
}

// The reference interpreter rounds a cast with its mode, and keeps the result through its own rounding.
TEST(StorageDTypes, ReferenceCastsWithTheMode) {
  Graph g("g");
  auto x = g.input("x", Shape{3}, DType::F32);
  auto sat = g.cast(g.cast(x, DType::F8E5M2), DType::F32);
  Attrs no_sat{{"to", DType::F8E5M2}, {"saturate", false}};
  auto over = g.cast(g.add(OpKind::Cast, {x}, no_sat), DType::F32);
  g.add_output(sat);
  g.add_output(over);
  auto outs = reference::run(g, {{"x", Tensor::from_f64(DType::F32, {3}, std::vector<double>{1e6, -0.3, 3})}});
  EXPECT_EQ(outs[0].get(0), 57344);
  EXPECT_EQ(outs[1].get(0), std::numeric_limits<double>::infinity());
  EXPECT_EQ(outs[0].get(1), -0.3125);
  EXPECT_EQ(outs[1].get(2), 3);
}

}  // namespace
}  // namespace rlx::ir
