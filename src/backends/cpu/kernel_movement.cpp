// Movement kernels: dtype-agnostic copies by element size. Permute, slice,
// flip, expand and non-view reshapes are one strided copy; concat, pad and
// the indexed ops have their own loops.
#include <algorithm>
#include <cstring>

#include "backends/cpu/kernels.hpp"
#include "rlx/error.hpp"

namespace rlx::backends::cpu {

namespace {

using ir::OpKind;

template <class U>
void copy_strided(std::byte* d, const std::byte* s, i64 n, i64 stride) {
  auto* out = reinterpret_cast<U*>(d);
  auto* in = reinterpret_cast<const U*>(s);
  for (i64 i = 0; i < n; ++i) std::memcpy(out + i, in + i * stride, sizeof(U));
}
// Copies n elements of es bytes, reading every `stride`-th element (0 fills).
void copy_elems(std::byte* d, const std::byte* s, i64 n, i64 stride, std::size_t es) {
  if (stride == 1) {
    std::memcpy(d, s, std::size_t(n) * es);
    return;
  }
  switch (es) {
    case 1: copy_strided<std::uint8_t>(d, s, n, stride); break;
    case 2: copy_strided<std::uint16_t>(d, s, n, stride); break;
    case 4: copy_strided<std::uint32_t>(d, s, n, stride); break;
    default: copy_strided<std::uint64_t>(d, s, n, stride); break;
  }
}
void fill_elems(std::byte* d, const std::byte* value, i64 n, std::size_t es) {
  for (i64 i = 0; i < n; ++i) std::memcpy(d + std::size_t(i) * es, value, es);
}

// Big contiguous copies are split over the pool.
void parallel_memcpy(std::byte* d, const std::byte* s, std::size_t n, int threads) {
  constexpr std::size_t kPiece = 1 << 18;
  parallel_for(
      i64((n + kPiece - 1) / kPiece), 1,
      [&](i64 b, i64 e) {
        std::size_t lo = std::size_t(b) * kPiece, hi = std::min(n, std::size_t(e) * kPiece);
        std::memcpy(d + lo, s + lo, hi - lo);
      },
      threads);
}

// out[i...] = in[base + sum(i_d * stride_d)], out contiguous.
class StridedCopy final : public CpuKernel {
 public:
  StridedCopy(compile::BufferId in, compile::BufferId out, std::size_t es, std::vector<i64> ext,
              std::vector<i64> stride, i64 base)
      : in_(in), out_(out), es_(es), base_(base) {
    // Drop unit dims and merge dims that stay adjacent in the input.
    for (std::size_t d = 0; d < ext.size(); ++d) {
      if (ext[d] == 1) continue;
      if (!ext_.empty() && st_.back() == stride[d] * ext[d]) {
        ext_.back() *= ext[d];
        st_.back() = stride[d];
      } else {
        ext_.push_back(ext[d]);
        st_.push_back(stride[d]);
      }
    }
    total_ = numel(ext);
    if (!ext_.empty() && st_.back() != 1 && st_.back() != 0)
      for (std::size_t d = 0; d + 1 < ext_.size(); ++d)
        if (st_[d] == 1) tdim_ = int(d);
  }

  void run(const RunCtx& c) const override {
    const std::byte* src = c.ptrs[in_] + base_ * i64(es_);
    std::byte* dst = c.ptrs[out_];
    if (total_ == 0) return;
    if (ext_.empty()) {
      std::memcpy(dst, src, es_);
      return;
    }
    if (ext_.size() == 1 && st_[0] == 1) {
      parallel_memcpy(dst, src, std::size_t(total_) * es_, c.max_threads);
      return;
    }
    if (tdim_ >= 0) {
      transpose(c, src, dst);
      return;
    }
    const std::size_t r = ext_.size();
    const i64 len = ext_.back(), rows = total_ / len, s = st_.back();
    parallel_for(
        rows, std::max<i64>(1, kGrain * 4 / len),
        [&](i64 b, i64 e) {
          i64 idx[kMaxRank + 1], off = 0, rem = b;
          for (std::size_t d = r - 1; d-- > 0;) {
            idx[d] = rem % ext_[d];
            rem /= ext_[d];
            off += idx[d] * st_[d];
          }
          for (i64 row = b; row < e; ++row) {
            copy_elems(dst + std::size_t(row * len) * es_, src + off * i64(es_), len, s, es_);
            for (std::size_t d = r - 1; d-- > 0;) {
              off += st_[d];
              if (++idx[d] < ext_[d]) break;
              off -= st_[d] * ext_[d];
              idx[d] = 0;
            }
          }
        },
        c.max_threads);
  }

 private:
  // Output dim tdim_ reads the input contiguously while the innermost one
  // strides: copy 32x32 tiles so that both sides stay in cache.
  void transpose(const RunCtx& c, const std::byte* src, std::byte* dst) const {
    constexpr i64 kTile = 64;
    const std::size_t r = ext_.size(), t = std::size_t(tdim_);
    i64 os[kMaxRank + 1];
    os[r - 1] = 1;
    for (std::size_t d = r - 1; d-- > 0;) os[d] = os[d + 1] * ext_[d + 1];
    const i64 ni = ext_[t], nj = ext_.back(), sj = st_.back();
    const i64 tiles_i = (ni + kTile - 1) / kTile, outer = total_ / (ni * nj);
    parallel_for(
        outer * tiles_i, 1,
        [&](i64 b, i64 e) {
          for (i64 u = b; u < e; ++u) {
            i64 o = u / tiles_i, ti = u % tiles_i, in_off = 0, out_off = 0, rem = o;
            for (std::size_t d = r - 1; d-- > 0;) {
              if (d == t) continue;
              i64 id = rem % ext_[d];
              rem /= ext_[d];
              in_off += id * st_[d];
              out_off += id * os[d];
            }
            const i64 i0 = ti * kTile, i1 = std::min(ni, i0 + kTile);
            if (es_ == 4) {  // SIMD 8x8 blocks: out rows i read input columns
              c.isa->transpose32(reinterpret_cast<const std::uint32_t*>(src) + in_off + i0, sj,
                                 reinterpret_cast<std::uint32_t*>(dst) + out_off + i0 * os[t], os[t], nj, i1 - i0);
              continue;
            }
            for (i64 j0 = 0; j0 < nj; j0 += kTile) {
              const i64 j1 = std::min(nj, j0 + kTile);
              for (i64 i = i0; i < i1; ++i)
                copy_elems(dst + std::size_t(out_off + i * os[t] + j0) * es_, src + (in_off + i + j0 * sj) * i64(es_),
                           j1 - j0, sj, es_);
            }
          }
        },
        c.max_threads);
  }

  compile::BufferId in_, out_;
  std::size_t es_;
  i64 base_, total_ = 0;
  std::vector<i64> ext_, st_;
  int tdim_ = -1;
};

class ConcatKernel final : public CpuKernel {
 public:
  std::vector<compile::BufferId> ins;
  std::vector<std::size_t> chunk;  // bytes per outer row of each input
  compile::BufferId out = 0;
  i64 outer = 1;
  std::size_t row = 0;  // bytes per outer row of the output

  void run(const RunCtx& c) const override {
    std::byte* dst = c.ptrs[out];
    if (outer < 4 * c.max_threads) {
      for (i64 o = 0; o < outer; ++o) {
        std::size_t at = 0;
        for (std::size_t k = 0; k < ins.size(); ++k) {
          parallel_memcpy(dst + std::size_t(o) * row + at, c.ptrs[ins[k]] + std::size_t(o) * chunk[k], chunk[k],
                          c.max_threads);
          at += chunk[k];
        }
      }
      return;
    }
    parallel_for(
        outer, std::max<i64>(1, i64(kGrain * 4 / std::max<std::size_t>(row, 1))),
        [&](i64 b, i64 e) {
          for (i64 o = b; o < e; ++o) {
            std::size_t at = 0;
            for (std::size_t k = 0; k < ins.size(); ++k) {
              std::memcpy(dst + std::size_t(o) * row + at, c.ptrs[ins[k]] + std::size_t(o) * chunk[k], chunk[k]);
              at += chunk[k];
            }
          }
        },
        c.max_threads);
  }
};

class PadKernel final : public CpuKernel {
 public:
  compile::BufferId in = 0, out = 0;
  std::size_t es = 0;
  std::vector<i64> in_ext, out_ext, before, in_strides;
  std::byte value[8] = {};

  void run(const RunCtx& c) const override {
    const std::byte* src = c.ptrs[in];
    std::byte* dst = c.ptrs[out];
    const std::size_t r = out_ext.size();
    if (r == 0) {
      std::memcpy(dst, src, es);
      return;
    }
    const i64 len = out_ext.back(), rows = numel(out_ext) / std::max<i64>(len, 1);
    if (len == 0) return;
    const i64 bl = before.back(), j0 = std::clamp<i64>(bl, 0, len), j1 = std::clamp<i64>(bl + in_ext.back(), j0, len);
    parallel_for(
        rows, std::max<i64>(1, kGrain * 4 / len),
        [&](i64 b, i64 e) {
          for (i64 row = b; row < e; ++row) {
            std::byte* d = dst + std::size_t(row * len) * es;
            i64 rem = row, off = 0;
            bool inside = true;
            for (std::size_t k = r - 1; k-- > 0;) {
              i64 i = rem % out_ext[k] - before[k];
              rem /= out_ext[k];
              inside = inside && i >= 0 && i < in_ext[k];
              off += i * in_strides[k];
            }
            if (!inside || j1 <= j0) {
              fill_elems(d, value, len, es);
              continue;
            }
            fill_elems(d, value, j0, es);
            std::memcpy(d + std::size_t(j0) * es, src + std::size_t(off + j0 - bl) * es, std::size_t(j1 - j0) * es);
            fill_elems(d + std::size_t(j1) * es, value, len - j1, es);
          }
        },
        c.max_threads);
  }
};

class GatherKernel final : public CpuKernel {
 public:
  compile::BufferId x = 0, idx = 0, out = 0;
  std::size_t es = 0, axis = 0;
  std::vector<i64> x_ext, x_strides, i_ext;
  IndexReader index;

  void run(const RunCtx& c) const override {
    const std::byte *src = c.ptrs[x], *ip = c.ptrs[idx];
    std::byte* dst = c.ptrs[out];
    const std::size_t r = i_ext.size();
    const i64 total = numel(i_ext);
    if (total == 0) return;
    const i64 len = i_ext.back(), rows = total / len;
    parallel_for(
        rows, std::max<i64>(1, kGrain / len),
        [&](i64 b, i64 e) {
          for (i64 row = b; row < e; ++row) {
            i64 rem = row, base = 0;
            for (std::size_t k = r - 1; k-- > 0;) {
              if (k != axis) base += (rem % i_ext[k]) * x_strides[k];
              rem /= i_ext[k];
            }
            for (i64 j = 0; j < len; ++j) {
              i64 f = row * len + j;
              i64 off = base + index(ip, f, x_ext[axis], axis) * x_strides[axis];
              if (axis != r - 1) off += j * x_strides[r - 1];
              std::memcpy(dst + std::size_t(f) * es, src + std::size_t(off) * es, es);
            }
          }
        },
        c.max_threads);
  }
};

class IndexSelectKernel final : public CpuKernel {
 public:
  compile::BufferId x = 0, idx = 0, out = 0;
  i64 outer = 1, n = 1, k = 1, axis = 0;
  std::size_t inner_bytes = 0;
  IndexReader index;

  void run(const RunCtx& c) const override {
    const std::byte *src = c.ptrs[x], *ip = c.ptrs[idx];
    std::byte* dst = c.ptrs[out];
    parallel_for(
        outer * k, std::max<i64>(1, i64(kGrain * 4 / std::max<std::size_t>(inner_bytes, 1))),
        [&](i64 b, i64 e) {
          for (i64 u = b; u < e; ++u) {
            i64 o = u / k, j = u % k, at = index(ip, j, n, std::size_t(axis));
            std::memcpy(dst + std::size_t(u) * inner_bytes, src + std::size_t(o * n + at) * inner_bytes, inner_bytes);
          }
        },
        c.max_threads);
  }
};

template <class T>
void add_into(std::byte* d, const std::byte* s) {
  T a, b;
  std::memcpy(&a, d, sizeof(T));
  std::memcpy(&b, s, sizeof(T));
  if constexpr (std::is_integral_v<T>)
    a = T(std::make_unsigned_t<T>(a) + std::make_unsigned_t<T>(b));
  else
    a += b;
  std::memcpy(d, &a, sizeof(T));
}

class ScatterAddKernel final : public CpuKernel {
 public:
  compile::BufferId x = 0, idx = 0, upd = 0, out = 0;
  ir::DType dtype = ir::DType::F32;
  std::size_t es = 0, axis = 0;
  std::vector<i64> x_ext, x_strides, i_ext;
  IndexReader index;

  void add(std::byte* d, const std::byte* s) const {
    switch (dtype) {
      case ir::DType::F32: add_into<float>(d, s); break;
      case ir::DType::F64: add_into<double>(d, s); break;
      case ir::DType::I8: add_into<std::int8_t>(d, s); break;
      case ir::DType::U8: add_into<std::uint8_t>(d, s); break;
      case ir::DType::I32: add_into<std::int32_t>(d, s); break;
      case ir::DType::I64: add_into<std::int64_t>(d, s); break;
      case ir::DType::I16: add_into<std::int16_t>(d, s); break;
      case ir::DType::U16: add_into<std::uint16_t>(d, s); break;
      case ir::DType::U32: add_into<std::uint32_t>(d, s); break;
      case ir::DType::U64: add_into<std::uint64_t>(d, s); break;
      case ir::DType::F16:
      case ir::DType::BF16: {
        std::uint16_t a, b;
        std::memcpy(&a, d, 2);
        std::memcpy(&b, s, 2);
        bool h = dtype == ir::DType::F16;
        float sum =
            (h ? ir::half_to_float(a) : ir::bf16_to_float(a)) + (h ? ir::half_to_float(b) : ir::bf16_to_float(b));
        a = h ? ir::float_to_half(sum) : ir::float_to_bf16(sum);
        std::memcpy(d, &a, 2);
        break;
      }
      case ir::DType::Bool: *d = std::byte(*d != std::byte{0} || *s != std::byte{0}); break;
      default: break;  // the block types: infer keeps them out of these kernels
    }
  }

  void run(const RunCtx& c) const override {
    std::byte* dst = c.ptrs[out];
    const std::size_t bytes = std::size_t(numel(x_ext)) * es;
    parallel_memcpy(dst, c.ptrs[x], bytes, c.max_threads);
    const std::byte *ip = c.ptrs[idx], *up = c.ptrs[upd];
    const std::size_t r = i_ext.size();
    const i64 total = numel(i_ext);
    if (total == 0) return;
    // Positions that differ in dim 0 (when it is not the axis) write disjoint rows.
    const i64 parts = axis != 0 && r > 0 ? i_ext[0] : 1, per = total / std::max<i64>(parts, 1);
    parallel_for(
        parts, 1,
        [&](i64 b, i64 e) {
          for (i64 f = b * per; f < e * per; ++f) {
            i64 rem = f, off = 0;
            for (std::size_t k = r; k-- > 0;) {
              i64 i = rem % i_ext[k];
              rem /= i_ext[k];
              off += (k == axis ? index(ip, f, x_ext[axis], axis) : i) * x_strides[k];
            }
            add(dst + std::size_t(off) * es, up + std::size_t(f) * es);
          }
        },
        c.max_threads);
  }
};

// x with the update's rows at start along the axis. When the executable runs it over its own input (a KV
// cache handle donated to the output: Plan's donation), y is x and only the update's rows are written.
class DynamicUpdateSliceKernel final : public CpuKernel {
 public:
  compile::BufferId x = 0, upd = 0, start = 0, y = 0;
  IndexReader index;
  std::size_t x_bytes = 0, row = 0;  // the rows: the bytes of one position along the axis, times the inner dims
  i64 outer = 1, extent = 0, rows = 0;

  void run(const RunCtx& c) const override {
    std::byte* dst = c.ptrs[y];
    if (dst != c.ptrs[x] && x_bytes) parallel_memcpy(dst, c.ptrs[x], x_bytes, c.max_threads);
    if (rows == 0 || row == 0) return;  // nothing to write (and a zero-size update may have no storage)
    const i64 s = std::clamp<i64>(index.raw(c.ptrs[start], 0), 0, extent - rows);
    const std::byte* u = c.ptrs[upd];
    for (i64 o = 0; o < outer; ++o)
      std::memcpy(dst + std::size_t(o * extent + s) * row, u + std::size_t(o * rows) * row, std::size_t(rows) * row);
  }
};

}  // namespace

std::unique_ptr<CpuKernel> build_dynamic_update_slice(const BuildCtx& b) {
  const ir::Node& n = b.anchor();
  const auto &xb = b.in_of(n.inputs.at(0)), &ub = b.in_of(n.inputs.at(1)), &sb = b.in_of(n.inputs.at(2));
  const std::size_t axis = std::size_t(ir::normalize_axis(n.attrs.get_int("axis"), xb.shape.size()));
  auto k = std::make_unique<DynamicUpdateSliceKernel>();
  k->x = xb.id, k->upd = ub.id, k->start = sb.id, k->y = b.out(0).id;
  k->index = IndexReader{sb.dtype, b.where()};
  k->x_bytes = ir::storage_bytes(xb.dtype, xb.shape);
  k->row = ir::dtype_size(xb.dtype);
  for (std::size_t d = 0; d < xb.shape.size(); ++d)
    if (d < axis)
      k->outer *= xb.shape[d];
    else if (d > axis)
      k->row *= std::size_t(xb.shape[d]);
  k->extent = xb.shape[axis];
  k->rows = ub.shape[axis];
  return k;
}

std::unique_ptr<CpuKernel> build_movement(const BuildCtx& b) {
  const ir::Node& n = b.anchor();
  const auto& xb = b.in_of(n.inputs.at(0));
  const auto& ob = b.out(0);
  const std::size_t es = ir::dtype_size(ob.dtype), rank = xb.shape.size();
  const auto cs = ir::contiguous_strides(xb.shape);
  auto axis_of = [&](std::int64_t a) { return std::size_t(ir::normalize_axis(a, rank)); };
  auto strided = [&](std::vector<i64> st, i64 base) {
    return std::make_unique<StridedCopy>(xb.id, ob.id, es, ob.shape, std::move(st), base);
  };
  switch (n.op) {
    case OpKind::Reshape:
    case OpKind::Squeeze:
    case OpKind::Unsqueeze:
      return std::make_unique<StridedCopy>(xb.id, ob.id, es, std::vector<i64>{numel(ob.shape)}, std::vector<i64>{1}, 0);
    case OpKind::Permute: {
      const auto& perm = n.attrs.get_ints("perm");
      std::vector<i64> st;
      for (auto p : perm) st.push_back(cs[axis_of(p)]);
      return strided(st, 0);
    }
    case OpKind::Slice: {
      const auto &starts = n.attrs.get_ints("starts"), &steps = n.attrs.get_ints("steps");
      std::vector<i64> st(rank);
      i64 base = 0;
      for (std::size_t d = 0; d < rank; ++d) {
        i64 s = std::clamp<i64>(starts[d] < 0 ? starts[d] + xb.shape[d] : starts[d], 0, xb.shape[d]);
        st[d] = cs[d] * steps[d];
        base += s * cs[d];
      }
      return strided(st, base);
    }
    case OpKind::Flip: {
      std::vector<i64> st = cs;
      i64 base = 0;
      for (auto a : n.attrs.get_ints("axes")) {
        std::size_t d = axis_of(a);
        if (xb.shape[d] > 0 && st[d] > 0) {
          base += (xb.shape[d] - 1) * cs[d];
          st[d] = -cs[d];
        }
      }
      return strided(st, base);
    }
    case OpKind::Expand: {
      std::vector<i64> st(ob.shape.size(), 0);
      std::size_t lead = ob.shape.size() - rank;
      for (std::size_t d = 0; d < rank; ++d)
        if (xb.shape[d] != 1) st[lead + d] = cs[d];
      return strided(st, 0);
    }
    case OpKind::Concat: {
      auto k = std::make_unique<ConcatKernel>();
      std::size_t axis = axis_of(n.attrs.get_int("axis"));
      for (std::size_t d = 0; d < axis; ++d) k->outer *= ob.shape[d];
      i64 inner = 1;
      for (std::size_t d = axis + 1; d < ob.shape.size(); ++d) inner *= ob.shape[d];
      k->out = ob.id;
      k->row = std::size_t(ob.shape[axis] * inner) * es;
      for (auto in : n.inputs) {
        const auto& ib = b.in_of(in);
        k->ins.push_back(ib.id);
        k->chunk.push_back(std::size_t(ib.shape[axis] * inner) * es);
      }
      return k;
    }
    case OpKind::Pad: {
      auto k = std::make_unique<PadKernel>();
      const auto& pads = n.attrs.get_ints("pads");
      k->in = xb.id;
      k->out = ob.id;
      k->es = es;
      k->in_ext = xb.shape;
      k->out_ext = ob.shape;
      k->before.assign(pads.begin(), pads.begin() + std::ptrdiff_t(rank));
      k->in_strides = cs;
      ir::write_element(k->value, ob.dtype, n.attrs.float_or("value", 0.0));
      return k;
    }
    case OpKind::Gather: {
      auto k = std::make_unique<GatherKernel>();
      const auto& ib = b.in_of(n.inputs.at(1));
      k->x = xb.id;
      k->idx = ib.id;
      k->out = ob.id;
      k->es = es;
      k->axis = axis_of(n.attrs.get_int("axis"));
      k->x_ext = xb.shape;
      k->x_strides = cs;
      k->i_ext = ib.shape;
      k->index = IndexReader{ib.dtype, b.where()};
      if (ib.shape.size() != rank) b.fail("gather indices need the input's rank");
      return k;
    }
    case OpKind::IndexSelect: {
      auto k = std::make_unique<IndexSelectKernel>();
      const auto& ib = b.in_of(n.inputs.at(1));
      std::size_t axis = axis_of(n.attrs.get_int("axis"));
      k->x = xb.id;
      k->idx = ib.id;
      k->out = ob.id;
      k->axis = i64(axis);
      for (std::size_t d = 0; d < axis; ++d) k->outer *= xb.shape[d];
      i64 inner = 1;
      for (std::size_t d = axis + 1; d < rank; ++d) inner *= xb.shape[d];
      k->n = xb.shape[axis];
      k->k = numel(ib.shape);
      k->inner_bytes = std::size_t(inner) * es;
      k->index = IndexReader{ib.dtype, b.where()};
      return k;
    }
    case OpKind::ScatterAdd: {
      auto k = std::make_unique<ScatterAddKernel>();
      const auto& ib = b.in_of(n.inputs.at(1));
      const auto& ub = b.in_of(n.inputs.at(2));
      k->x = xb.id;
      k->idx = ib.id;
      k->upd = ub.id;
      k->out = ob.id;
      k->dtype = ob.dtype;
      k->es = es;
      k->axis = axis_of(n.attrs.get_int("axis"));
      k->x_ext = xb.shape;
      k->x_strides = cs;
      k->i_ext = ib.shape;
      k->index = IndexReader{ib.dtype, b.where()};
      if (ib.shape != ub.shape) b.fail("scatter_add indices and updates differ in shape");
      for (std::size_t d = 0; d < rank; ++d)
        if (d != k->axis && ib.shape[d] > xb.shape[d])
          b.fail("scatter_add index shape exceeds the input on axis " + std::to_string(d));
      return k;
    }
    default: b.fail("unsupported movement op " + std::string(ir::op_name(n.op)));
  }
}

}  // namespace rlx::backends::cpu
