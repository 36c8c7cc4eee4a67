// ONNX ops that RLX has no single op for, built from several: the losses, scatters, data-dependent ops
// whose inputs are known at import (NonZero, Compress), the signal windows and CenterCropPad.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numbers>
#include <numeric>

#include "onnx/detail.hpp"
#include "onnx/proto/onnx.pb.h"
#include "rlx/ir/limits.hpp"

namespace rlx::onnx::detail {

namespace {

using ir::OpKind;

// Negative indices count from the end of an axis of extent d.
NodeId wrap(Ctx& c, NodeId idx, std::int64_t d) {
  return c.g.where(c.g.binary(OpKind::Lt, idx, k(c, 0, idx)), c.g.add(idx, k(c, double(d), idx)), idx);
}

// NegativeLogLikelihoodLoss of log-probabilities x [N, C, d...] at integer targets [N, d...]: the target's
// entry picked by a one-hot mask, weighted, with ignore_index's entries weighing 0.
NodeId nll(Ctx& c, NodeId x, NodeId target, std::optional<NodeId> weight) {
  const auto sh = ext(c, x);
  if (sh.size() < 2) c.fail("the input must be [N, C, ...]");
  const auto r = sh.size();
  const auto dt = c.g.node(x).dtype;
  auto t = cast_to(c, target, ir::DType::I64);
  auto tu = c.g.unsqueeze(t, {1});
  auto onehot = c.g.cast(c.g.binary(OpKind::Eq, c.g.iota(ir::Shape(sh), 1, ir::DType::I64), tu), dt);
  NodeId w = c.g.expand(c.g.scalar(1, dt), ir::Shape(ext(c, t)));
  if (weight) {
    I64s wsh(r, 1);
    wsh[1] = sh[1];
    w = c.g.sum(c.g.mul(onehot, c.g.reshape(*weight, wsh)), {1});
  }
  if (c.has_attr("ignore_index")) {
    auto keep = c.g.binary(OpKind::Ne, t, c.g.scalar(double(c.attr_int("ignore_index")), ir::DType::I64));
    w = c.g.mul(w, c.g.cast(keep, dt));
  }
  auto picked = c.g.sum(c.g.mul(x, onehot), {1});
  auto loss = c.g.mul(c.g.unary(OpKind::Neg, picked), w);
  const auto reduction = c.attr_str("reduction", "mean");
  if (reduction == "none") return loss;
  I64s all(ext(c, loss).size());
  std::iota(all.begin(), all.end(), 0);
  auto total = c.g.sum(loss, all);
  if (reduction == "sum") return total;
  if (reduction != "mean") c.fail(fmt::format("reduction '{}' is not none, sum or mean", reduction));
  return c.g.div(total, c.g.sum(w, all));
}

// ScatterElements' rule: `none` overwrites, `add` accumulates (both over scatter_add). `mul`, `max` and `min`
// compare every update with every position along the axis: a mask [.., updates j, positions k, ..] of
// idx[.., j, ..] == k selects the updates each position receives, which reduce over j, and positions that
// receive none keep their data.
NodeId scatter(Ctx& c, NodeId data, NodeId idx, NodeId upd, std::int64_t axis, const std::string& reduction) {
  if (reduction == "add") return c.g.scatter_add(data, idx, upd, axis);
  const auto dt = c.g.node(data).dtype;
  if (reduction == "none") {
    auto zeros = c.g.expand(c.g.scalar(0, dt), c.g.node(data).shape);
    auto ones = c.g.expand(c.g.scalar(1, dt), c.g.node(upd).shape);
    auto hit = c.g.binary(OpKind::Gt, c.g.scatter_add(zeros, idx, ones, axis), c.g.scalar(0, dt));
    return c.g.where(hit, c.g.scatter_add(zeros, idx, upd, axis), data);
  }
  OpKind reduce, combine;
  if (reduction == "mul") {
    reduce = OpKind::ReduceProd, combine = OpKind::Mul;
  } else if (reduction == "max") {
    reduce = OpKind::ReduceMax, combine = OpKind::Max;
  } else if (reduction == "min") {
    reduce = OpKind::ReduceMin, combine = OpKind::Min;
  } else {
    c.fail(fmt::format("reduction '{}' is not none, add, mul, max or min", reduction));
  }
  const auto ds = ext(c, data), is = ext(c, idx);
  const auto a = std::size_t(axis);
  for (std::size_t i = 0; i < ds.size(); ++i)
    if (i != a && is[i] > ds[i]) c.fail("indices reach past the data's extents");
  I64s wide = is;  // [.., j, k, ..]
  wide.insert(wide.begin() + std::ptrdiff_t(a) + 1, ds[a]);
  ir::limits::check_allocation(ir::limits::checked_mul(ir::Shape(wide).numel(), 8, "a scatter's mask"),
                               "a scatter's mask (updates x positions)");
  auto mask = c.g.binary(OpKind::Eq, c.g.expand(c.g.unsqueeze(idx, {axis + 1}), ir::Shape(wide)),
                         c.g.iota(ir::Shape(wide), axis + 1, ir::DType::I64));
  // The reduction's identity fills the pairs that do not match: 1 for the product, the lowest value for max
  // and the highest for min.
  double identity = 1;
  if (reduce != OpKind::ReduceProd) {
    const bool lowest = reduce == OpKind::ReduceMax;
    if (ir::is_float(dt))
      identity = lowest ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
    else if (dt == ir::DType::I8)
      identity = lowest ? -128 : 127;
    else if (dt == ir::DType::U8)
      identity = lowest ? 0 : 255;
    else if (dt == ir::DType::I32)
      identity = lowest ? -2147483648.0 : 2147483647.0;
    else if (dt == ir::DType::I64)
      identity = lowest ? -9223372036854775808.0 : 9223372036854775807.0;
    else
      c.fail(fmt::format("reduction '{}' on {} is not supported", reduction, ir::dtype_name(dt)));
  }
  auto upd_w = c.g.expand(c.g.unsqueeze(upd, {axis + 1}), ir::Shape(wide));
  auto fill = c.g.expand(c.g.scalar(identity, dt), ir::Shape(wide));
  auto got = c.g.reduce(reduce, c.g.where(mask, upd_w, fill), {axis});  // idx's extents, ds[a] along the axis
  auto hit = c.g.reduce(OpKind::ReduceMax, c.g.cast(mask, ir::DType::I32), {axis});
  I64s pads(2 * ds.size(), 0);  // positions past idx's extents receive nothing
  for (std::size_t i = 0; i < ds.size(); ++i)
    if (i != a) pads[ds.size() + i] = ds[i] - is[i];
  got = c.g.pad(got, pads, reduce == OpKind::ReduceProd ? 1 : 0);
  hit = c.g.pad(hit, pads, 0);
  auto combined = c.g.binary(combine, data, got);
  return c.g.where(c.g.binary(OpKind::Gt, hit, c.g.scalar(0, ir::DType::I32)), combined, data);
}

NodeId scatter_elements(Ctx& c) {
  const auto axis = axis_of(c, c.attr_int("axis", 0), c.rank(0));
  auto idx = wrap(c, cast_to(c, c.in(1), ir::DType::I64), c.shape(0)[std::size_t(axis)]);
  return scatter(c, c.in(0), idx, c.in(2), axis, c.attr_str("reduction", "none"));
}

// A window of `size` points: sum_j coef[j] * cos(2 pi j n / N), N = size (periodic) or size - 1.
void window(Table& t, const char* name, const std::vector<double>& coef) {
  t[name] = {[coef](Ctx& c) -> Outs {
    const auto size = std::int64_t(c.scalar(0, "size"));
    if (size < 0 || size > (std::int64_t(1) << 24)) c.fail(fmt::format("size {} is out of range", size));
    auto dt = dtype_of(c.attr_int("output_datatype", 1));
    if (!dt) c.fail("output_datatype names a type RLX lacks");
    const double n_den = c.attr_int("periodic", 1) != 0 ? double(size) : double(size - 1);
    ir::Tensor out(*dt, {size});
    for (std::int64_t n = 0; n < size; ++n) {
      double v = 0;
      for (std::size_t j = 0; j < coef.size(); ++j)
        v += coef[j] * std::cos(2 * std::numbers::pi * double(j) * double(n) / n_den);
      out.set(n, v);
    }
    return {c.constant(out)};
  }};
}

// TopK as k rounds of arg-extreme, gather and mask: ties go to the lower index, as ONNX's. Integers
// search in f64 so that the mask's infinity is below (above) every value.
Outs topk(Ctx& c) {
  auto x = c.in(0);
  const auto axis = axis_of(c, c.attr_int("axis", -1), c.rank(0));
  const auto kk = c.ints(1, "K");
  if (kk.size() != 1 || kk[0] < 0 || kk[0] > c.shape(0)[std::size_t(axis)]) c.fail("K is out of range");
  if (kk[0] > 4096) c.fail("K over 4096 is not supported (TopK is k rounds of argmax)");
  const bool largest = c.attr_int("largest", 1) != 0;
  auto cur = ir::is_float(c.dtype(0)) ? x : c.g.cast(x, ir::DType::F64);
  const double inf = std::numeric_limits<double>::infinity();
  auto pos = c.g.iota(c.g.node(x).shape, axis, ir::DType::I64);
  std::vector<NodeId> vals, idxs;
  for (std::int64_t j = 0; j < kk[0]; ++j) {
    auto i = largest ? c.g.argmax(cur, axis, true) : c.g.argmin(cur, axis, true);
    idxs.push_back(i);
    vals.push_back(c.g.gather(x, i, axis));
    cur = c.g.where(c.g.binary(OpKind::Eq, pos, i), k(c, largest ? -inf : inf, cur), cur);
  }
  if (vals.empty()) {
    auto sh = c.shape(0);
    sh[std::size_t(axis)] = 0;
    return {c.g.slice(x, {axis}, {0}, {0}), c.g.expand(c.g.scalar(0, ir::DType::I64), ir::Shape(sh))};
  }
  return {c.g.concat(vals, axis), c.g.concat(idxs, axis)};
}

// Einsum over single letters: every operand permuted and reshaped onto all the letters (output letters
// first), multiplied with broadcasting, then summed over the contracted ones.
// Einsum: each operand's letters laid out along one list of all the letters, the operands multiplied
// broadcast over it, the letters not in the output summed. An ellipsis stands for unnamed letters, aligned
// from the right across the operands as numpy broadcasts; a letter repeated within one operand takes the
// diagonal first.
NodeId einsum(Ctx& c) {
  std::string eq;
  for (char ch : c.attr_str("equation", ""))
    if (ch != ' ') eq += ch;
  const auto arrow = eq.find("->");
  std::vector<std::string> terms;
  const std::string lhs = eq.substr(0, arrow);
  for (std::size_t at = 0;;) {
    const auto comma = lhs.find(',', at);
    terms.push_back(lhs.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  if (terms.size() != c.num_inputs()) c.fail("the equation's operands do not match the inputs");
  // The ellipsis' letters: chars no equation uses, the last ones shared by operands with fewer dims.
  auto dots = [&](const std::string& t) {
    const auto at = t.find("...");
    if (at != std::string::npos && t.find('.', at + 3) != std::string::npos) c.fail("a term has two ellipses");
    if (at == std::string::npos && t.find('.') != std::string::npos) c.fail("a '.' outside an ellipsis");
    return at;
  };
  std::size_t ell = 0;
  for (std::size_t i = 0; i < terms.size(); ++i)
    if (dots(terms[i]) != std::string::npos) {
      if (c.rank(i) + 3 < terms[i].size()) c.fail(fmt::format("operand {} has fewer dims than its term", i));
      ell = std::max(ell, c.rank(i) + 3 - terms[i].size());
    }
  if (ell > 64) c.fail("an ellipsis over 64 dims");
  auto unnamed = [&](std::size_t n) {
    std::string u;
    for (std::size_t k = ell - n; k < ell; ++k) u += char(0x80 + k);
    return u;
  };
  for (std::size_t i = 0; i < terms.size(); ++i)
    if (const auto at = dots(terms[i]); at != std::string::npos)
      terms[i] = terms[i].substr(0, at) + unnamed(c.rank(i) + 3 - terms[i].size()) + terms[i].substr(at + 3);
  std::string out;
  if (arrow != std::string::npos) {
    out = eq.substr(arrow + 2);
    if (const auto at = dots(out); at != std::string::npos) out = out.substr(0, at) + unnamed(ell) + out.substr(at + 3);
  } else {
    std::map<char, int> count;
    for (const auto& t : terms)
      for (char ch : t) count[ch]++;  // a letter repeated in one operand is summed too ("ii": the trace)
    out = unnamed(ell);
    for (auto [ch, n] : count)
      if (n == 1 && (unsigned char)(ch) < 0x80) out += ch;
  }
  for (std::size_t a = 0; a < out.size(); ++a) {
    bool used = false;
    for (const auto& t : terms) used = used || t.find(out[a]) != std::string::npos;
    if (out.find(out[a]) != a || !used) c.fail("an output letter is repeated or in no operand");
  }
  std::string letters = out;
  for (const auto& t : terms)
    for (char ch : t)
      if (letters.find(ch) == std::string::npos) letters += ch;
  std::optional<NodeId> acc;
  for (std::size_t i = 0; i < terms.size(); ++i) {
    auto term = terms[i];
    auto x = c.in(i);
    auto sh = c.shape(i);
    if (term.size() != sh.size())
      c.fail(fmt::format("operand {} has rank {}, its term '{}' has {} letters", i, sh.size(), term, term.size()));
    // A repeated letter: the diagonal (x times the identity over the two axes, summed over the second).
    for (std::size_t q = 0; q < term.size(); ++q) {
      const auto p = term.find(term[q]);
      if (p == q) continue;
      if (sh[p] != sh[q])
        c.fail(fmt::format("the letter '{}' of operand {} has extents {} and {}", term[q], i, sh[p], sh[q]));
      I64s eye_sh(sh.size(), 1);
      eye_sh[p] = eye_sh[q] = sh[p];
      auto eye = c.g.binary(OpKind::Eq, c.g.iota(ir::Shape(eye_sh), std::int64_t(p)),
                            c.g.iota(ir::Shape(eye_sh), std::int64_t(q)));
      x = c.g.sum(c.g.mul(x, c.g.cast(eye, c.dtype(i))), {std::int64_t(q)});
      term.erase(q, 1);
      sh.erase(sh.begin() + std::ptrdiff_t(q));
      --q;
    }
    I64s perm, full;
    for (char ch : letters) {
      const auto at = term.find(ch);
      if (at != std::string::npos) perm.push_back(std::int64_t(at));
      full.push_back(at == std::string::npos ? 1 : sh[at]);
    }
    x = c.g.reshape(c.g.permute(x, perm), full);
    acc = acc ? c.g.mul(*acc, x) : x;
  }
  I64s contracted;
  for (std::size_t a = out.size(); a < letters.size(); ++a) contracted.push_back(std::int64_t(a));
  return contracted.empty() ? *acc : c.g.sum(*acc, contracted);
}

// Resize's interpolation weights for one output position at fractional offset `ratio` (ONNX's reference).
std::vector<double> resize_coeffs(Ctx& c, const std::string& mode, double ratio, double scale) {
  if (mode == "nearest") {
    const auto nm = c.attr_str("nearest_mode", "round_prefer_floor");
    if (ratio == std::floor(ratio)) return {0, 1};
    if (nm == "round_prefer_floor") return {double(ratio <= 0.5), double(ratio > 0.5)};
    if (nm == "round_prefer_ceil") return {double(ratio < 0.5), double(ratio >= 0.5)};
    if (nm == "floor") return {1, 0};
    if (nm == "ceil") return {0, 1};
    c.fail(fmt::format("nearest_mode '{}' is not supported", nm));
  }
  const bool aa = c.attr_int("antialias", 0) != 0;
  if (mode == "linear") {
    if (!aa) return {1 - ratio, ratio};
    const double sc = std::min(scale, 1.0);
    const auto start = std::int64_t(std::floor(-1 / sc) + 1), n = 2 - 2 * start;
    std::vector<double> w;
    double sum = 0;
    for (std::int64_t i = start; i < start + n; ++i)
      sum += w.emplace_back(std::clamp(1 - std::abs((double(i) - ratio) * sc), 0.0, 1.0));
    for (auto& v : w) v /= sum;
    return w;
  }
  if (mode == "cubic") {
    const double a = c.attr_float("cubic_coeff_a", -0.75);
    if (!aa) {
      const double r = ratio, s = 1 - ratio;
      return {((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a, ((a + 2) * r - (a + 3)) * r * r + 1,
              ((a + 2) * s - (a + 3)) * s * s + 1, ((a * (s + 1) - 5 * a) * (s + 1) + 8 * a) * (s + 1) - 4 * a};
    }
    const double sc = std::min(scale, 1.0);
    auto coeff = [a](double x) {
      x = std::abs(x);
      if (x <= 1) return (a + 2) * x * x * x - (a + 3) * x * x + 1;
      if (x < 2) return a * x * x * x - 5 * a * x * x + 8 * a * x - 4 * a;
      return 0.0;
    };
    const auto start = std::int64_t(std::floor(-2 / sc) + 1), end = 2 - start;
    std::vector<double> w;
    double sum = 0;
    for (std::int64_t i = start; i < end; ++i) sum += w.emplace_back(coeff(sc * (double(i) - ratio)));
    for (auto& v : w) v /= sum;
    return w;
  }
  c.fail(fmt::format("mode '{}' is not supported", mode));
}

// Resize, separable: along each resized axis, every output position is a weighted sum of n input
// positions, gathered with index_select; the positions and weights are computed here, at import.
NodeId resize(Ctx& c) {
  if (c.opset() < 11) c.fail("Resize before opset 11 is not supported");
  auto x = c.in(0);
  const auto sh = c.shape(0);
  const auto r = sh.size();
  const auto dt = c.dtype(0);
  const auto mode = c.attr_str("mode", "nearest");
  const auto ctm = c.attr_str("coordinate_transformation_mode", "half_pixel");
  I64s axes(r);
  std::iota(axes.begin(), axes.end(), 0);
  if (c.has_attr("axes")) axes = c.attr_ints("axes");
  for (auto& a : axes) a = axis_of(c, a, r);
  std::vector<double> scales(r, 1.0), roi_lo(r, 0.0), roi_hi(r, 1.0);
  I64s out(sh);
  std::vector<double> roi;
  if (c.has(1) && c.value(1) && c.value(1)->numel() > 0) roi = c.value(1)->to_f64();
  if (ctm == "tf_crop_and_resize" && roi.empty()) c.fail("tf_crop_and_resize needs roi, known at import");
  if (!roi.empty()) {
    if (roi.size() != 2 * axes.size()) c.fail("roi must hold two entries per resized axis");
    for (std::size_t i = 0; i < axes.size(); ++i) {
      roi_lo[std::size_t(axes[i])] = roi[i];
      roi_hi[std::size_t(axes[i])] = roi[axes.size() + i];
    }
  }
  if (c.has(3) && c.value(3) && c.value(3)->numel() > 0) {
    const auto sizes = c.ints(3, "sizes");
    if (sizes.size() != axes.size()) c.fail("sizes must hold one entry per resized axis");
    for (std::size_t i = 0; i < axes.size(); ++i) {
      if (sizes[i] <= 0 || sh[std::size_t(axes[i])] <= 0) c.fail("sizes and the resized extents must be positive");
      out[std::size_t(axes[i])] = sizes[i];
      scales[std::size_t(axes[i])] = double(sizes[i]) / double(sh[std::size_t(axes[i])]);
    }
    const auto policy = c.attr_str("keep_aspect_ratio_policy", "stretch");
    if (policy != "stretch") {
      double sc = policy == "not_larger" ? 1e300 : -1e300;
      for (auto a : axes)
        sc = policy == "not_larger" ? std::min(sc, scales[std::size_t(a)]) : std::max(sc, scales[std::size_t(a)]);
      for (auto a : axes) {
        scales[std::size_t(a)] = sc;
        out[std::size_t(a)] = std::int64_t(std::floor(sc * double(sh[std::size_t(a)]) + 0.5));  // ONNX rounds half up
      }
    }
  } else if (c.has(2) && c.value(2) && c.value(2)->numel() > 0) {
    const auto sv = c.value(2)->to_f64();
    if (sv.size() != axes.size()) c.fail("scales must hold one entry per resized axis");
    for (std::size_t i = 0; i < axes.size(); ++i) {
      if (!(sv[i] > 0 && sv[i] < 1e6)) c.fail(fmt::format("scale {} is out of range", sv[i]));
      scales[std::size_t(axes[i])] = sv[i];
      out[std::size_t(axes[i])] = std::int64_t(sv[i] * double(sh[std::size_t(axes[i])]));
    }
  } else {
    c.fail("scales or sizes must be given and known at import");
  }
  const auto work = ir::is_float(dt) ? dt : ir::DType::F32;
  x = cast_to(c, x, work);
  const bool exclude = c.attr_int("exclude_outside", 0) != 0;
  for (auto a : axes) {
    const auto ax = std::size_t(a);
    const std::int64_t in_w = sh[ax], out_w = out[ax];
    const double scale = scales[ax];
    if (std::abs(scale - 1.0) < 1e-12 && out_w == in_w && roi_lo[ax] == 0.0 && roi_hi[ax] == 1.0) continue;
    if (out_w <= 0 || in_w <= 0) c.fail("an empty resize is not supported");
    if (out_w > (std::int64_t(1) << 24)) c.fail(fmt::format("a resized extent of {} is over 2^24", out_w));
    if (c.attr_int("antialias", 0) != 0 && scale < 1.0 / 256)
      c.fail("antialiased downscaling by more than 256x is not supported");
    const double out_f = scale * double(in_w);
    std::vector<double> xo(static_cast<std::size_t>(out_w));
    std::vector<bool> extrap(static_cast<std::size_t>(out_w), false);
    for (std::int64_t i = 0; i < out_w; ++i) {
      const double y = double(i);
      double v = 0;
      if (ctm == "align_corners")
        v = out_f == 1 ? 0 : y * double(in_w - 1) / (out_f - 1);
      else if (ctm == "asymmetric")
        v = y / scale;
      else if (ctm == "pytorch_half_pixel")
        v = out_f == 1 ? -0.5 : (y + 0.5) / scale - 0.5;
      else if (ctm == "half_pixel")
        v = (y + 0.5) / scale - 0.5;
      else if (ctm == "half_pixel_symmetric") {
        const double adj = double(out_w) / out_f, center = double(in_w) / 2;
        v = center * (1 - adj) + (y + 0.5) / scale - 0.5;
      } else if (ctm == "tf_crop_and_resize") {
        const double lo = roi_lo[ax], hi = roi_hi[ax];
        v = out_f == 1 ? (hi - lo) * double(in_w - 1) / 2 : y * (hi - lo) * double(in_w - 1) / (out_f - 1);
        v += lo * double(in_w - 1);
        extrap[std::size_t(i)] = v < 0 || v > double(in_w - 1);
      } else {
        c.fail(fmt::format("coordinate_transformation_mode '{}' is not supported", ctm));
      }
      xo[std::size_t(i)] = v;
    }
    std::vector<std::vector<double>> coeffs;
    for (double v : xo) coeffs.push_back(resize_coeffs(c, mode, v == std::floor(v) ? 1.0 : v - std::floor(v), scale));
    const auto n = std::int64_t(coeffs[0].size());
    const auto pad = (n + 1) / 2;
    ir::Tensor idx(ir::DType::I64, {out_w * n});
    I64s wsh(r + 1, 1);
    wsh[ax] = out_w;
    wsh[ax + 1] = n;
    ir::Tensor w(work, wsh);
    for (std::int64_t i = 0; i < out_w; ++i) {
      const double xp = xo[std::size_t(i)] + double(pad);
      const double p = std::floor(xp), frac = xp - p;
      const std::int64_t off =
          n % 2 == 0 ? (frac == 0 ? -(n / 2) : -(n / 2) + 1) : (frac <= 0.5 ? -((n - 1) / 2) : -((n - 1) / 2) + 1);
      auto& cf = coeffs[std::size_t(i)];
      if (std::int64_t(cf.size()) != n) c.fail("interpolation weights of varying length");
      double sum = 0;
      for (std::int64_t j = 0; j < n; ++j) {
        const std::int64_t at = std::int64_t(p) + off + j - pad;
        if (exclude && (at < 0 || at >= in_w)) cf[std::size_t(j)] = 0;
        sum += cf[std::size_t(j)];
        idx.set(i * n + j, double(std::clamp<std::int64_t>(at, 0, in_w - 1)));
      }
      for (std::int64_t j = 0; j < n; ++j)
        w.set(i * n + j, exclude && sum != 0 ? cf[std::size_t(j)] / sum : cf[std::size_t(j)]);
    }
    auto g = c.g.index_select(x, c.constant(idx), a);
    I64s split = ext(c, g);
    split[ax] = out_w;
    split.insert(split.begin() + a + 1, n);
    x = c.g.sum(c.g.mul(c.g.reshape(g, split), c.constant(w)), {a + 1});
    if (std::find(extrap.begin(), extrap.end(), true) != extrap.end()) {
      I64s msh(r, 1);
      msh[ax] = out_w;
      ir::Tensor m(ir::DType::Bool, msh);
      for (std::int64_t i = 0; i < out_w; ++i) m.set(i, extrap[std::size_t(i)] ? 1 : 0);
      x = c.g.where(c.constant(m), c.g.scalar(c.attr_float("extrapolation_value", 0), work), x);
    }
  }
  if (work == dt) return x;
  // Integers: saturated to the type's range, then truncated, as ONNX's saturate_cast.
  if (dt == ir::DType::U8) x = c.g.clamp(x, 0, 255);
  if (dt == ir::DType::I8) x = c.g.clamp(x, -128, 127);
  return c.g.cast(x, dt);
}

// RNN, GRU and LSTM unrolled over their (static) sequence, one direction at a time, as ONNX defines them.
enum class Cell : std::uint8_t { Rnn, Gru, Lstm };

NodeId activation(Ctx& c, const std::string& name, NodeId x) {
  if (name == "Sigmoid") return c.g.unary(OpKind::Sigmoid, x);
  if (name == "Tanh") return c.g.unary(OpKind::Tanh, x);
  if (name == "Relu") return c.g.relu(x);
  c.fail(fmt::format("activation '{}' is not supported (Sigmoid, Tanh, Relu)", name));
}

Outs recurrent(Ctx& c, Cell cell) {
  const std::int64_t gates = cell == Cell::Rnn ? 1 : cell == Cell::Gru ? 3 : 4;
  const bool batch_major = c.attr_int("layout", 0) != 0;
  auto x = c.in(0);
  if (c.rank(0) != 3 || c.rank(1) != 3 || c.rank(2) != 3) c.fail("X, W and R must be 3-D");
  if (batch_major) x = c.g.permute(x, {1, 0, 2});
  const auto xs = ext(c, x);
  const std::int64_t seq = xs[0], batch = xs[1];
  const std::int64_t hidden = ext(c, c.in(2))[2];
  if (seq > 4096) c.fail("sequences over 4096 steps are not supported (the loop is unrolled)");
  for (std::size_t i : {3, 5, 6, 7})
    if (c.has(i) && c.rank(i) != (i == 3 || i == 7 ? 2u : 3u)) c.fail(fmt::format("input {} has the wrong rank", i));
  if (c.has(4)) {
    for (auto len : c.ints(4, "sequence_lens"))
      if (len != seq) c.fail("sequence_lens shorter than the sequence are not supported");
  }
  const auto direction = c.attr_str("direction", "forward");
  if (direction != "forward" && direction != "reverse" && direction != "bidirectional")
    c.fail(fmt::format("direction '{}' is not forward, reverse or bidirectional", direction));
  const std::int64_t dirs = direction == "bidirectional" ? 2 : 1;
  if (ext(c, c.in(1))[0] != dirs || ext(c, c.in(1))[1] != gates * hidden)
    c.fail("W does not match the direction and hidden_size");
  std::vector<std::string> acts;
  if (const auto* a = c.attr("activations"))
    for (const auto& s : a->strings()) acts.push_back(s);
  const std::vector<std::string> defaults = cell == Cell::Rnn   ? std::vector<std::string>{"Tanh"}
                                            : cell == Cell::Gru ? std::vector<std::string>{"Sigmoid", "Tanh"}
                                                                : std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"};
  const double clip = c.attr_float("clip", 0.0);
  auto pre = [&](NodeId v) { return clip > 0 ? c.g.clamp(v, -clip, clip) : v; };
  const bool lbr = c.attr_int("linear_before_reset", 0) != 0;
  auto row = [&](NodeId v, std::int64_t d) { return c.g.squeeze(c.g.slice(v, {0}, {d}, {d + 1}), {0}); };
  auto part = [&](NodeId v, std::int64_t k) { return c.g.slice(v, {-1}, {k * hidden}, {(k + 1) * hidden}); };
  std::vector<NodeId> ys, hs, cs;
  for (std::int64_t d = 0; d < dirs; ++d) {
    const bool reverse = direction == "reverse" || d == 1;
    std::vector<std::string> f(defaults);
    for (std::size_t i = 0; i < f.size(); ++i)
      if (acts.size() >= std::size_t(d + 1) * f.size()) f[i] = acts[std::size_t(d) * f.size() + i];
    auto wt = c.g.transpose(row(c.in(1), d));  // [input, G*h]
    auto rt = c.g.transpose(row(c.in(2), d));  // [h, G*h]
    std::optional<NodeId> wb, rb;
    if (c.has(3)) {
      auto bd = row(c.in(3), d);
      wb = c.g.slice(bd, {0}, {0}, {gates * hidden});
      rb = c.g.slice(bd, {0}, {gates * hidden}, {2 * gates * hidden});
    }
    auto xw = c.g.matmul(x, wt);  // [seq, batch, G*h], every step at once
    if (wb) xw = c.g.add(xw, *wb);
    auto zeros = c.g.expand(c.g.scalar(0, c.dtype(0)), ir::Shape(I64s{batch, hidden}));
    NodeId h = c.has(5) ? row(c.in(5), d) : zeros;
    NodeId cst = c.has(6) ? row(c.in(6), d) : zeros;
    std::optional<NodeId> p;
    if (c.has(7)) p = row(c.in(7), d);  // LSTM peepholes [3h]: i, o, f
    std::vector<NodeId> steps(static_cast<std::size_t>(seq));
    for (std::int64_t s = 0; s < seq; ++s) {
      const std::int64_t tt = reverse ? seq - 1 - s : s;
      auto xt = c.g.squeeze(c.g.slice(xw, {0}, {tt}, {tt + 1}), {0});
      auto hr = c.g.matmul(h, rt);
      if (rb) hr = c.g.add(hr, *rb);
      if (cell == Cell::Rnn) {
        h = activation(c, f[0], pre(c.g.add(xt, hr)));
      } else if (cell == Cell::Gru) {
        auto z = activation(c, f[0], pre(c.g.add(part(xt, 0), part(hr, 0))));
        auto r = activation(c, f[0], pre(c.g.add(part(xt, 1), part(hr, 1))));
        NodeId cand;
        if (lbr) {
          cand = c.g.add(part(xt, 2), c.g.mul(r, part(hr, 2)));
        } else {
          auto rh = c.g.matmul(c.g.mul(r, h), c.g.slice(rt, {1}, {2 * hidden}, {3 * hidden}));
          if (rb) rh = c.g.add(rh, c.g.slice(*rb, {0}, {2 * hidden}, {3 * hidden}));
          cand = c.g.add(part(xt, 2), rh);
        }
        auto hh = activation(c, f[1], pre(cand));
        h = c.g.add(c.g.mul(c.g.sub(k(c, 1, z), z), hh), c.g.mul(z, h));
      } else {
        auto gate = [&](std::int64_t k, std::optional<std::int64_t> peep, NodeId cell_state) {
          auto v = c.g.add(part(xt, k), part(hr, k));
          if (p && peep)
            v = c.g.add(v, c.g.mul(c.g.slice(*p, {0}, {*peep * hidden}, {(*peep + 1) * hidden}), cell_state));
          return pre(v);
        };
        auto i = activation(c, f[0], gate(0, 0, cst));
        auto fg = activation(c, f[0], gate(2, 2, cst));
        auto cc = activation(c, f[1], gate(3, std::nullopt, cst));
        cst = c.g.add(c.g.mul(fg, cst), c.g.mul(i, cc));
        auto o = activation(c, f[0], gate(1, 1, cst));
        h = c.g.mul(o, activation(c, f[2], cst));
      }
      steps[std::size_t(tt)] = c.g.unsqueeze(h, {0});
    }
    ys.push_back(c.g.unsqueeze(c.g.concat(steps, 0), {1}));  // [seq, 1, batch, h]
    hs.push_back(c.g.unsqueeze(h, {0}));
    cs.push_back(c.g.unsqueeze(cst, {0}));
  }
  auto y = c.g.concat(ys, 1), yh = c.g.concat(hs, 0), yc = c.g.concat(cs, 0);
  if (batch_major) {
    y = c.g.permute(y, {2, 0, 1, 3});
    yh = c.g.permute(yh, {1, 0, 2});
    yc = c.g.permute(yc, {1, 0, 2});
  }
  if (cell == Cell::Lstm) return {y, yh, yc};
  return {y, yh};
}

}  // namespace

void register_misc(Table& t) {
  // If, Loop and Scan hold subgraphs, which the importer converts itself (importer.cpp): an If or Loop
  // known at import is inlined or unrolled, the rest become RLX's if, while and scan. These entries claim
  // the ops and are not reached.
  for (const char* op : {"If", "Loop", "Scan"})
    t[op] = {[](Ctx& c) -> Outs { c.fail("control flow is converted by the importer, not the op table"); }};
  t["AffineGrid"] = {[](Ctx& c) -> Outs {
    // theta [N, k, k+1] times the homogeneous coordinates (x, y[, z], 1) of every output position, each in
    // [-1, 1] (pixel centres, or corners with align_corners).
    const auto size = c.ints(1, "size");
    const std::size_t k = size.size() - 2;
    if ((k != 2 && k != 3) || c.rank(0) != 3) c.fail("theta must be [N, 2, 3] or [N, 3, 4] and size 4-D or 5-D");
    const bool corners = c.attr_int("align_corners", 0) != 0;
    const I64s dims(size.begin() + 2, size.end());
    const std::int64_t n_pos = ir::checked_numel(dims, "the grid");
    ir::Tensor base(c.dtype(0), {std::int64_t(k + 1), n_pos});
    for (std::int64_t p = 0; p < n_pos; ++p) {
      std::int64_t rest = p;
      for (std::size_t d = k; d-- > 0;) {
        const std::int64_t n = dims[d], i = rest % n;
        rest /= n;
        const double v = corners ? (n == 1 ? -1.0 : -1.0 + 2.0 * double(i) / double(n - 1))
                                 : -1.0 + (2.0 * double(i) + 1.0) / double(n);
        base.set(std::int64_t(k - 1 - d) * n_pos + p, v);  // row 0 is x, the last dim
      }
      base.set(std::int64_t(k) * n_pos + p, 1);
    }
    auto grid = c.g.permute(c.g.matmul(c.in(0), c.constant(base)), {0, 2, 1});  // [N, P, k]
    I64s out{c.shape(0)[0]};
    out.insert(out.end(), dims.begin(), dims.end());
    out.push_back(std::int64_t(k));
    return {c.g.reshape(grid, out)};
  }};
  t["RNN"] = {[](Ctx& c) -> Outs { return recurrent(c, Cell::Rnn); }};
  t["GRU"] = {[](Ctx& c) -> Outs { return recurrent(c, Cell::Gru); }};
  t["LSTM"] = {[](Ctx& c) -> Outs { return recurrent(c, Cell::Lstm); }};
  t["Resize"] = {[](Ctx& c) -> Outs { return {resize(c)}; }};
  t["TopK"] = {[](Ctx& c) -> Outs { return topk(c); }};
  t["Einsum"] = {[](Ctx& c) -> Outs { return {einsum(c)}; }};
  t["CumProd"] = {[](Ctx& c) -> Outs {
    auto x = c.in(0);
    const auto axis = axis_of(c, std::int64_t(c.scalar(1, "axis")), c.rank(0));
    const std::int64_t d = c.shape(0)[std::size_t(axis)];
    const bool excl = c.attr_int("exclusive", 0) != 0, rev = c.attr_int("reverse", 0) != 0;
    if (d == 0) return {x};
    if (d > 4096) c.fail("an axis over 4096 is not supported (CumProd is one product per position)");
    std::vector<NodeId> parts(static_cast<std::size_t>(d));
    auto sh = c.shape(0);
    sh[std::size_t(axis)] = 1;
    std::optional<NodeId> run;
    for (std::int64_t j = 0; j < d; ++j) {
      const std::int64_t at = rev ? d - 1 - j : j;
      auto xi = c.g.slice(x, {axis}, {at}, {at + 1});
      if (excl) parts[std::size_t(at)] = run ? *run : c.g.expand(c.g.scalar(1, c.dtype(0)), ir::Shape(sh));
      run = run ? c.g.mul(*run, xi) : xi;
      if (!excl) parts[std::size_t(at)] = *run;
    }
    return {c.g.concat(parts, axis)};
  }};
  t["ReverseSequence"] = {[](Ctx& c) -> Outs {
    const auto sh = c.shape(0);
    const auto bax = axis_of(c, c.attr_int("batch_axis", 1), sh.size()),
               tax = axis_of(c, c.attr_int("time_axis", 0), sh.size());
    const auto lens = c.ints(1, "sequence_lens");
    const std::int64_t nb = sh[std::size_t(bax)], nt = sh[std::size_t(tax)];
    if (std::int64_t(lens.size()) != nb) c.fail("sequence_lens must have one entry per batch");
    // The source time of each (batch, time), laid out with 1s on the other axes and expanded.
    I64s ish(sh.size(), 1);
    ish[std::size_t(bax)] = nb;
    ish[std::size_t(tax)] = nt;
    ir::Tensor idx(ir::DType::I64, ish);
    for (std::int64_t b = 0; b < nb; ++b)
      for (std::int64_t tt = 0; tt < nt; ++tt) {
        const std::int64_t len = std::clamp<std::int64_t>(lens[std::size_t(b)], 0, nt);
        const std::int64_t at = bax < tax ? b * nt + tt : tt * nb + b;
        idx.set(at, double(tt < len ? len - 1 - tt : tt));
      }
    auto full = c.g.expand(c.constant(idx), ir::Shape(sh));
    return {c.g.gather(c.in(0), full, tax)};
  }};
  t["NegativeLogLikelihoodLoss"] = {[](Ctx& c) -> Outs {
    std::optional<NodeId> w;
    if (c.has(2)) w = c.in(2);
    return {nll(c, c.in(0), c.in(1), w)};
  }};
  t["SoftmaxCrossEntropyLoss"] = {[](Ctx& c) -> Outs {
    std::optional<NodeId> w;
    if (c.has(2)) w = c.in(2);
    auto lp = c.g.log_softmax(c.in(0), 1);
    return {nll(c, lp, c.in(1), w), lp};
  }};
  t["ScatterElements"] = {[](Ctx& c) -> Outs { return {scatter_elements(c)}; }};
  t["Scatter"] = {[](Ctx& c) -> Outs { return {scatter_elements(c)}; }};
  t["ScatterND"] = {[](Ctx& c) -> Outs {
    // Rows of data flattened to [rows, inner], one row per index tuple, scattered along axis 0.
    const auto data_sh = c.shape(0), idx_sh = c.shape(1);
    if (idx_sh.empty() || idx_sh.back() < 1) c.fail("indices must have rank >= 1 and a last dim >= 1");
    const auto q = std::size_t(idx_sh.back());
    if (q > data_sh.size()) c.fail("index tuples are longer than the data's rank");
    std::int64_t rows = 1, inner = 1, tuples = 1;
    for (std::size_t i = 0; i < q; ++i) rows *= data_sh[i];
    for (std::size_t i = q; i < data_sh.size(); ++i) inner *= data_sh[i];
    for (std::size_t i = 0; i + 1 < idx_sh.size(); ++i) tuples *= idx_sh[i];
    I64s strides(q, 1);
    for (std::size_t j = q; j-- > 1;) strides[j - 1] = strides[j] * data_sh[j];
    auto idx = c.g.reshape(cast_to(c, c.in(1), ir::DType::I64), I64s{tuples, std::int64_t(q)});
    ir::Tensor dims(ir::DType::I64, {1, std::int64_t(q)}), st(ir::DType::I64, {1, std::int64_t(q)});
    for (std::size_t j = 0; j < q; ++j) {
      dims.set(std::int64_t(j), double(data_sh[j]));
      st.set(std::int64_t(j), double(strides[j]));
    }
    idx = c.g.where(c.g.binary(OpKind::Lt, idx, c.g.scalar(0, ir::DType::I64)), c.g.add(idx, c.constant(dims)), idx);
    auto row = c.g.sum(c.g.mul(idx, c.constant(st)), {1}, true);  // [tuples, 1]
    auto row_idx = c.g.expand(row, ir::Shape(I64s{tuples, inner}));
    auto flat = c.g.reshape(c.in(0), I64s{rows, inner});
    auto upd = c.g.reshape(c.in(2), I64s{tuples, inner});
    auto out = scatter(c, flat, row_idx, upd, 0, c.attr_str("reduction", "none"));
    return {c.g.reshape(out, data_sh)};
  }};
  t["Compress"] = {[](Ctx& c) -> Outs {
    // The kept positions must be known at import: they fix the result's shape.
    auto cond = c.ints(1, "condition");
    auto x = c.in(0);
    std::int64_t axis = 0;
    if (c.has_attr("axis")) {
      axis = axis_of(c, c.attr_int("axis"), c.rank(0));
    } else {
      x = c.g.reshape(x, I64s{ir::checked_numel(c.shape(0))});
    }
    const std::int64_t d = ext(c, x)[std::size_t(axis)];
    I64s keep;
    for (std::size_t i = 0; i < cond.size() && std::int64_t(i) < d; ++i)
      if (cond[i]) keep.push_back(std::int64_t(i));
    return {c.g.index_select(x, c.i64s(keep), axis)};
  }};
  t["NonZero"] = {[](Ctx& c) -> Outs {
    const ir::Tensor* v = c.value(0);
    if (!v) c.fail("input 0 must be known at import (NonZero's result shape depends on its values)");
    const auto& sh = v->shape();
    I64s hits;
    for (std::int64_t i = 0; i < v->numel(); ++i)
      if (v->get(i) != 0) hits.push_back(i);
    const auto n = std::int64_t(hits.size());
    ir::Tensor out(ir::DType::I64, {std::int64_t(sh.size()), n});
    for (std::int64_t j = 0; j < n; ++j) {
      std::int64_t rest = hits[std::size_t(j)];
      for (std::size_t a = sh.size(); a-- > 0;) {
        out.set(std::int64_t(a) * n + j, double(rest % sh[a]));
        rest /= sh[a];
      }
    }
    return {c.constant(out)};
  }};
  t["CenterCropPad"] = {[](Ctx& c) -> Outs {
    auto x = c.in(0);
    const auto target = c.ints(1, "shape");
    const auto r = c.rank(0);
    I64s axes(target.size());
    std::iota(axes.begin(), axes.end(), 0);
    if (c.has_attr("axes")) axes = c.attr_ints("axes");
    if (axes.size() != target.size()) c.fail("shape must have one entry per axis");
    for (std::size_t i = 0; i < axes.size(); ++i) {
      const auto a = axis_of(c, axes[i], r);
      const std::int64_t d = ext(c, x)[std::size_t(a)], want = target[i];
      if (d > want) {
        const std::int64_t start = (d - want) / 2;
        x = c.g.slice(x, {a}, {start}, {start + want});
      } else if (d < want) {
        I64s pads(2 * r, 0);
        pads[std::size_t(a)] = (want - d) / 2;
        pads[r + std::size_t(a)] = want - d - (want - d) / 2;
        x = c.g.pad(x, pads, 0);
      }
    }
    return {x};
  }};
  window(t, "HannWindow", {0.5, -0.5});
  window(t, "HammingWindow", {25.0 / 46.0, -21.0 / 46.0});
  window(t, "BlackmanWindow", {0.42, -0.5, 0.08});
}

}  // namespace rlx::onnx::detail
