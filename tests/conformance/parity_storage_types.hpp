// Op-parity variants of the wider integer types (i16, u16, u32, u64) and the storage-only types (float8,
// float4, int4, int2; rlx/ir/dtype.hpp), in the style of parity_block_types.hpp: random inputs, checked against
// the float64 reference into poisoned outputs by tests/conformance/test_op_parity.cpp, which appends these to
// the variants of the ops they use.
#pragma once

#include <string>
#include <vector>

#include "conformance/parity_variant.hpp"

namespace rlx::conformance {

using ir::OpKind;

inline constexpr DType kWideInts[] = {DType::I16, DType::U16, DType::U32, DType::U64};

// Values each wide integer type holds, with signs where it has them; past i16's and u16's range the sums and
// products wrap, which the reference and every backend must agree on.
inline Gen wide_int_values(DType t) {
  switch (t) {
    case DType::I16: return ints_in(-32768, 32767);
    case DType::U16: return ints_in(0, 65535);
    case DType::U32: return ints_in(0, 4294967295);
    default: return ints_in(0, std::int64_t(1) << 40);  // u64: exact in the float64 reference
  }
}

// Arithmetic and min/max of the wide integers, broadcast; division and modulo without zero divisors.
inline Variants wide_int_binary_variants(OpKind op) {
  Variants r;
  if (op == OpKind::Pow) return r;
  for (DType t : kWideInts)
    for (const auto& [sa, sb] : {std::pair<Ints, Ints>{{2, 3}, {3}}, {{3, 1}, {1, 4}}, {{64}, {64}}}) {
      V v(std::string(ir::op_name(op)) + " " + dt(t) + str(sa) + " x " + str(sb));
      const bool divides = op == OpKind::Div || op == OpKind::Mod;
      // Products of u32 and u64 stay below 2^53, where the float64 reference is exact.
      const bool mul = op == OpKind::Mul && (t == DType::U32 || t == DType::U64);
      auto a = v.in("a", t, sa, mul ? ints_in(0, 1 << 20) : wide_int_values(t));
      auto b = v.in("b", t, sb, divides ? one_of({1, 2, 3, 7, 255}) : mul ? ints_in(0, 1 << 20) : wide_int_values(t));
      r.push_back(v.out({v.g().binary(op, a, b)}));
    }
  return r;
}

inline Variants wide_int_compare_variants(OpKind op) {
  Variants r;
  for (DType t : kWideInts) {
    V v(std::string(ir::op_name(op)) + " " + dt(t) + "[4,5] x [5]");
    r.push_back(v.out({v.g().binary(op, v.in("a", t, {4, 5}, ints_in(0, 3)), v.in("b", t, {5}, ints_in(0, 3)))}));
  }
  return r;
}

// Sums and extrema of the wide integers (u16 sums stay in range; u32 and u64 sums of small values too).
inline Variants wide_int_reduce_variants(OpKind op) {
  Variants r;
  if (op == OpKind::ReduceMean || op == OpKind::ReduceProd) return r;
  for (DType t : kWideInts) {
    V v(std::string(ir::op_name(op)) + " " + dt(t) + "[3,7] axes [1]");
    auto x = v.in("x", t, {3, 7}, t == DType::I16 ? ints_in(-1000, 1000) : ints_in(0, 2000));
    r.push_back(v.out({v.g().reduce(op, x, {1}, false)}));
  }
  return r;
}

// The values a storage-only type holds and the ones it rounds, saturates or overflows: the float types over
// their range and past it (float8e8m0 over positive powers and between them), the small integers in range.
inline Gen storage_values(DType t) {
  switch (t) {
    case DType::F8E4M3FN: return uniform(-500, 500);
    case DType::F8E4M3FNUZ: return uniform(-260, 260);
    case DType::F8E5M2:
    case DType::F8E5M2FNUZ: return one_of({0, -0.0, 1e-6, -3.1e-5, 0.3, -1.7, 100.5, 6e4, -7e4, 57344, 1e9});
    case DType::F8E8M0: return one_of({0.25, 0.3, 1, 1.5, 3, 6, 1e-30, 1e30, 0.75, 2.5});
    case DType::F4E2M1: return uniform(-8, 8);
    case DType::I4: return ints_in(-8, 7);
    case DType::U4: return ints_in(0, 15);
    case DType::I2: return ints_in(-2, 1);
    default: return ints_in(0, 3);
  }
}

// f32 -> storage type -> f32, saturating and not (float8), each e8m0 round mode; and a storage-typed value
// moved (transposed, sliced, joined) between the casts, so the movement kernels carry its bytes.
inline Variants storage_cast_variants() {
  Variants r;
  for (DType t : ir::kStorageDTypes) {
    const DType src = ir::is_storage_float(t) ? DType::F32 : DType::I32;
    {
      V v("cast " + dt(src) + " -> " + dt(t) + " -> " + dt(src));
      r.push_back(v.out({v.g().cast(v.g().cast(v.in("x", src, {4, 9}, storage_values(t)), t), src)}));
    }
    {
      V v("cast " + dt(src) + " -> " + dt(t) + ", permute, slice, concat -> f32");
      auto q = v.g().cast(v.in("x", src, {3, 4}, storage_values(t)), t);
      auto moved = v.g().slice(v.g().permute(q, {1, 0}), {0}, {1}, {4});
      r.push_back(v.out({v.g().cast(v.g().concat({moved, moved}, 1), DType::F32)}));
    }
    if (ir::is_storage_float(t) && t != DType::F8E8M0 && t != DType::F4E2M1) {
      V v("cast f32 -> " + dt(t) + " {saturate=false} -> f32");
      ir::Attrs a{{"to", t}, {"saturate", false}};
      auto q = v.g().add(OpKind::Cast, {v.in("x", DType::F32, {4, 9}, storage_values(t))}, a);
      r.push_back(v.out({v.g().cast(q, DType::F32)}));
    }
    if (t == DType::F8E8M0)
      for (const char* mode : {"down", "nearest"}) {
        V v(std::string("cast f32 -> f8e8m0 {round_mode=") + mode + "} -> f32");
        ir::Attrs a{{"to", t}, {"round_mode", std::string(mode)}};
        auto q = v.g().add(OpKind::Cast, {v.in("x", DType::F32, {4, 9}, storage_values(t))}, a);
        r.push_back(v.out({v.g().cast(q, DType::F32)}));
      }
  }
  for (DType t : kWideInts) {  // wide integers to and from f32 and i64
    V v("cast i64 -> " + dt(t) + " -> f32, f64");
    auto x = v.g().cast(v.in("x", DType::I64, {5, 6}, wide_int_values(t)), t);
    r.push_back(v.out({v.g().cast(x, DType::F32), v.g().cast(x, DType::F64)}));
  }
  return r;
}

}  // namespace rlx::conformance
