// scan, if and while in the reference: the bodies run through the reference
// itself, step by step. A node computes its whole op and keeps the result it
// stands for; siblings repeat the work, which the oracle can afford.
#include "rlx/ir/control_flow.hpp"

#include <algorithm>

#include "rlx/reference/interpreter.hpp"
#include "rlx/run_control.hpp"
#include "value.hpp"

namespace rlx::reference::detail {

namespace {

using Tensors = std::vector<ir::Tensor>;

Tensors run_body(const ir::Graph& body, std::span<const ir::Tensor> args) {
  TensorMap feeds;
  auto ids = body.input_ids();
  for (std::size_t i = 0; i < ids.size(); ++i) feeds.emplace(body.node(ids[i]).attrs.get_str("name"), args[i]);
  return run(body, feeds);
}

// Row t of a tensor along axis 0.
ir::Tensor row(const ir::Tensor& t, std::int64_t i) {
  std::vector<std::int64_t> ext(t.shape().begin() + 1, t.shape().end());
  std::size_t bytes = t.shape()[0] ? t.nbytes() / std::size_t(t.shape()[0]) : 0;
  return ir::Tensor(t.dtype(), std::move(ext), {t.data() + std::size_t(i) * bytes, bytes});
}

ir::Tensor scan(const Ctx& c, const Tensors& in, std::size_t r) {
  const ir::Attrs& a = c.attrs();
  const ir::Graph& body = *a.get_graph("body");
  const auto nc = std::size_t(a.get_int("num_carries")), nk = std::size_t(a.int_or("num_consts", 0));
  const std::size_t nx = in.size() - nc - nk;
  const std::int64_t length = a.get_int("length");
  Tensors carries(in.begin(), in.begin() + std::ptrdiff_t(nc));
  ir::Tensor ys;
  if (r >= nc) ys = ir::Tensor(c.n.dtype, c.declared());
  const std::size_t y_bytes = length ? ys.nbytes() / std::size_t(length) : 0;
  Tensors args(in.size());
  for (std::int64_t s = 0; s < length; ++s) {
    std::int64_t t = a.bool_or("reverse", false) ? length - 1 - s : s;
    for (std::size_t i = 0; i < nc; ++i) args[i] = std::move(carries[i]);
    for (std::size_t j = 0; j < nx; ++j) args[nc + j] = row(in[nc + j], t);
    for (std::size_t k = nc + nx; k < in.size(); ++k) args[k] = in[k];
    Tensors outs = run_body(body, args);
    for (std::size_t i = 0; i < nc; ++i) carries[i] = std::move(outs[i]);
    if (r >= nc) std::copy_n(outs[r].data(), y_bytes, ys.data() + std::size_t(t) * y_bytes);
  }
  return r < nc ? carries[r] : ys;
}

ir::Tensor while_loop(const Ctx& c, Tensors in, std::size_t r) {
  const ir::Attrs& a = c.attrs();
  const ir::Graph &cond = *a.get_graph("cond"), &body = *a.get_graph("body");
  const auto nc = std::size_t(a.get_int("num_carries"));
  const std::int64_t max_trips = a.int_or("max_trip_count", -1);
  for (std::int64_t trip = 0; max_trips < 0 || trip < max_trips; ++trip) {
    check_run("reference while loop");
    if (run_body(cond, in).at(0).get(0) == 0) break;
    Tensors outs = run_body(body, in);
    for (std::size_t i = 0; i < nc; ++i) in[i] = std::move(outs[i]);
  }
  return in[r];
}

}  // namespace

Value eval_control_flow(const Ctx& c) {
  Tensors in;
  for (std::size_t i = 0; i < c.in.size(); ++i)
    in.push_back(ir::Tensor::from_f64(c.g.node(c.n.inputs[i]).dtype, c.x(i).ext, c.x(i).v));
  const auto r = std::size_t(c.attrs().get_int("result"));
  ir::Tensor out;
  switch (c.n.op) {
    case ir::OpKind::Scan: out = scan(c, in, r); break;
    case ir::OpKind::If: {
      const auto& body = *c.attrs().get_graph(in[0].get(0) != 0 ? "then" : "else");
      out = run_body(body, std::span(in).subspan(1)).at(r);
      break;
    }
    case ir::OpKind::While: out = while_loop(c, std::move(in), r); break;
    default: c.fail("is not a control-flow op");
  }
  Value v(out.dtype(), out.shape());
  v.v = out.to_f64();
  return v;
}

}  // namespace rlx::reference::detail
