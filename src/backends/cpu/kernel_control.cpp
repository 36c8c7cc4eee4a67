// Control-flow kernels (scan, if, while) as packed host loops: each body is
// compiled once, through this same backend, into a nested executable, and a
// run binds pointers into the arena step by step. Scan x slices are read in
// place, y slices are written straight into the stacked result, and carries
// ping-pong between two scratch areas (a body's outputs may not alias its
// inputs), the last step writing the final carries where they belong.
#include <fmt/format.h>

#include <cstring>
#include <mutex>

#include "backends/cpu/kernels.hpp"
#include "rlx/backends/cpu/cpu_backend.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/control_flow.hpp"
#include "rlx/run_control.hpp"

namespace rlx::backends::cpu {

namespace {

using runtime::ExecutableGraph;

std::size_t aligned(std::size_t n) { return (n + 63) / 64 * 64; }

// A body compiled once. A nested executable owns an arena, so concurrent
// runs (of clones of the outer executable) each take an instance of their
// own; the pool grows, and allocates, only when runs actually overlap.
class Body {
 public:
  Body(const ir::Graph& g, const compile::CompileOptions& options) {
    auto backend = make_cpu_backend();
    compile::CompileOptions o = options;
    o.bind.clear();
    o.param_bindings.clear();
    o.promote_constants_over_bytes = 0;
    o.inspect = nullptr;
    auto res = compile::compile(g, backend->traits(), o);
    free_.reserve(4);
    free_.push_back(backend->compile_lir(res.lir, o));
    proto_ = free_.back().get();
  }

  void run(std::span<const void* const> in, std::span<void* const> out) const {
    std::unique_ptr<ExecutableGraph> exe;
    {
      std::lock_guard lock(mu_);
      if (!free_.empty()) {
        exe = std::move(free_.back());
        free_.pop_back();
      }
    }
    if (!exe) exe = proto_->clone();  // clone() reads only what instances share, so proto_ may be running
    exe->run(in, out);
    std::lock_guard lock(mu_);
    free_.push_back(std::move(exe));
  }

 private:
  mutable std::mutex mu_;
  mutable std::vector<std::unique_ptr<ExecutableGraph>> free_;
  const ExecutableGraph* proto_ = nullptr;
};

// The first of the op's sibling nodes in `body` (a copy of the kernel's body or the body itself).
const ir::Node& anchor(const ir::Graph& body, const BuildCtx& b) {
  for (const auto& n : body.nodes())
    if (ir::is_control_flow(n.op)) return n;
  b.fail("has no control-flow node");
}

struct Ptr {
  compile::BufferId buffer = -1;  // -1: a scratch slot
  std::size_t scratch = 0;        // offset into the shared scratch when buffer < 0
  std::size_t bytes = 0;
  std::byte* at(const RunCtx& c) const { return buffer >= 0 ? c.ptrs[buffer] : c.shared + scratch; }
};

class ControlKernel : public CpuKernel {
 public:
  explicit ControlKernel(const BuildCtx& b) : b_(b.kernel.body), op_(anchor(b_, b)) {
    // Operand i of the op -> kernel input buffer.
    std::vector<compile::BufferId> of_input(b_.size(), -1);
    std::size_t next = 0;
    for (const auto& n : b_.nodes())
      if (n.op == ir::OpKind::Input) of_input[n.id] = b.kernel.inputs.at(next++);
    for (auto in : op_.inputs) operands_.push_back({of_input[in], 0, std::size_t(b.lir.buffer(of_input[in]).nbytes())});
    results_.resize(ir::num_results(op_));
    for (std::size_t j = 0; j < b.kernel.outputs.size(); ++j) {
      const ir::Node& r = b_.node(b_.outputs()[j].node);
      const auto& buf = b.out(j);
      results_[std::size_t(r.attrs.get_int("result"))] = {buf.id, 0, std::size_t(buf.nbytes())};
    }
  }

 protected:
  // Scratch for a result no one reads (the loop still needs somewhere to put it).
  void scratch_for_unused(std::span<const std::size_t> bytes) {
    for (std::size_t r = 0; r < results_.size(); ++r)
      if (results_[r].buffer < 0) results_[r] = {-1, take(bytes[r]), bytes[r]};
  }
  std::size_t take(std::size_t bytes) {
    std::size_t at = shared_bytes;
    shared_bytes += aligned(bytes);
    return at;
  }
  // The pointer arrays a nested run takes, in the shared scratch.
  struct Args {
    const void** in;
    void** out;
  };
  void reserve_args(std::size_t n_in, std::size_t n_out) {
    n_in_ = n_in;
    n_out_ = n_out;
    args_at_ = take((n_in + n_out) * sizeof(void*));
  }
  Args args(const RunCtx& c) const {
    auto** p = reinterpret_cast<void**>(c.shared + args_at_);
    return {const_cast<const void**>(p), p + n_in_};
  }
  std::span<const void* const> ins(const Args& a) const { return {a.in, n_in_}; }
  std::span<void* const> outs(const Args& a) const { return {a.out, n_out_}; }

  ir::Graph b_;  // the kernel body, which holds the op's bodies
  const ir::Node& op_;
  std::vector<Ptr> operands_, results_;
  std::size_t args_at_ = 0, n_in_ = 0, n_out_ = 0;
};

// Carries double-buffered in scratch: step s reads `cur`, writes `nxt`.
struct Carries {
  std::vector<std::size_t> at[2];
  std::vector<std::size_t> bytes;
};

class ScanKernel final : public ControlKernel {
 public:
  ScanKernel(const BuildCtx& b, const compile::CompileOptions& o)
      : ControlKernel(b), body_(*op_.attrs.get_graph("body"), o) {
    const ir::Graph& body = *op_.attrs.get_graph("body");
    nc_ = std::size_t(op_.attrs.get_int("num_carries"));
    nk_ = std::size_t(op_.attrs.int_or("num_consts", 0));
    nx_ = operands_.size() - nc_ - nk_;
    length_ = op_.attrs.get_int("length");
    reverse_ = op_.attrs.bool_or("reverse", false);
    std::vector<std::size_t> bytes;
    for (const auto& o : body.outputs()) {
      const ir::Node& n = body.node(o.node);
      bytes.push_back(std::size_t(n.shape.numel()) * ir::dtype_size(n.dtype));
    }
    for (std::size_t i = 0; i < nc_; ++i) {
      carries_.bytes.push_back(bytes[i]);
      for (auto& side : carries_.at) side.push_back(take(bytes[i]));
    }
    y_bytes_.assign(bytes.begin() + std::ptrdiff_t(nc_), bytes.end());
    scratch_for_unused(bytes);  // an unused ys needs one step's room: every step overwrites it
    reserve_args(operands_.size(), bytes.size());
  }

  void run(const RunCtx& c) const override {
    Args a = args(c);
    for (std::size_t k = nc_ + nx_; k < operands_.size(); ++k) a.in[k] = operands_[k].at(c);
    for (std::int64_t s = 0; s < length_; ++s) {
      check_run("cpu scan loop");
      const auto t = std::size_t(reverse_ ? length_ - 1 - s : s);
      const bool first = s == 0, last = s == length_ - 1;
      const int cur = int(s & 1), nxt = 1 - cur;
      for (std::size_t i = 0; i < nc_; ++i) {
        a.in[i] = first ? operands_[i].at(c) : c.shared + carries_.at[cur][i];
        a.out[i] = last ? results_[i].at(c) : c.shared + carries_.at[nxt][i];
      }
      for (std::size_t j = 0; j < nx_; ++j) {
        const Ptr& x = operands_[nc_ + j];
        a.in[nc_ + j] = x.at(c) + t * (x.bytes / std::size_t(length_));
      }
      for (std::size_t j = 0; j < y_bytes_.size(); ++j) {
        const Ptr& y = results_[nc_ + j];
        a.out[nc_ + j] = y.at(c) + (y.buffer >= 0 ? t * y_bytes_[j] : 0);
      }
      body_.run(ins(a), outs(a));
    }
    if (length_ == 0)
      for (std::size_t i = 0; i < nc_; ++i) std::memcpy(results_[i].at(c), operands_[i].at(c), carries_.bytes[i]);
  }

 private:
  Body body_;
  std::size_t nc_ = 0, nk_ = 0, nx_ = 0;
  std::int64_t length_ = 0;
  bool reverse_ = false;
  Carries carries_;
  std::vector<std::size_t> y_bytes_;
};

class IfKernel final : public ControlKernel {
 public:
  IfKernel(const BuildCtx& b, const compile::CompileOptions& o)
      : ControlKernel(b), then_(*op_.attrs.get_graph("then"), o), else_(*op_.attrs.get_graph("else"), o) {
    const ir::Graph& body = *op_.attrs.get_graph("then");
    std::vector<std::size_t> bytes;
    for (const auto& out : body.outputs()) {
      const ir::Node& n = body.node(out.node);
      bytes.push_back(std::size_t(n.shape.numel()) * ir::dtype_size(n.dtype));
    }
    scratch_for_unused(bytes);
    reserve_args(operands_.size() - 1, results_.size());
  }

  void run(const RunCtx& c) const override {
    Args a = args(c);
    for (std::size_t k = 1; k < operands_.size(); ++k) a.in[k - 1] = operands_[k].at(c);
    for (std::size_t r = 0; r < results_.size(); ++r) a.out[r] = results_[r].at(c);
    bool taken = *reinterpret_cast<const bool*>(operands_[0].at(c));
    (taken ? then_ : else_).run(ins(a), outs(a));
  }

 private:
  Body then_, else_;
};

class WhileKernel final : public ControlKernel {
 public:
  WhileKernel(const BuildCtx& b, const compile::CompileOptions& o)
      : ControlKernel(b), cond_(*op_.attrs.get_graph("cond"), o), body_(*op_.attrs.get_graph("body"), o) {
    nc_ = results_.size();
    max_trips_ = op_.attrs.int_or("max_trip_count", -1);
    for (std::size_t i = 0; i < nc_; ++i) {
      carries_.bytes.push_back(operands_[i].bytes);
      for (auto& side : carries_.at) side.push_back(take(operands_[i].bytes));
    }
    flag_at_ = take(1);
    reserve_args(operands_.size(), nc_);
  }

  void run(const RunCtx& c) const override {
    Args a = args(c);
    for (std::size_t k = 0; k < operands_.size(); ++k) a.in[k] = operands_[k].at(c);
    void* flag = c.shared + flag_at_;
    int nxt = 0;
    for (std::int64_t trip = 0; max_trips_ < 0 || trip < max_trips_; ++trip) {
      check_run("cpu while loop");  // a condition that never turns false ends by cancel or timeout
      cond_.run(ins(a), std::span<void* const>(&flag, 1));
      if (!*static_cast<const bool*>(flag)) break;
      for (std::size_t i = 0; i < nc_; ++i) a.out[i] = c.shared + carries_.at[nxt][i];
      body_.run(ins(a), outs(a));
      for (std::size_t i = 0; i < nc_; ++i) a.in[i] = a.out[i];
      nxt = 1 - nxt;
    }
    for (std::size_t i = 0; i < nc_; ++i)
      if (results_[i].buffer >= 0) std::memcpy(results_[i].at(c), a.in[i], carries_.bytes[i]);
  }

 private:
  Body cond_, body_;
  std::size_t nc_ = 0;
  std::int64_t max_trips_ = -1;
  Carries carries_;
  std::size_t flag_at_ = 0;
};

}  // namespace

std::unique_ptr<CpuKernel> build_control_flow(const BuildCtx& b, const compile::CompileOptions& options) {
  try {
    switch (anchor(b.kernel.body, b).op) {
      case ir::OpKind::Scan: return std::make_unique<ScanKernel>(b, options);
      case ir::OpKind::If: return std::make_unique<IfKernel>(b, options);
      case ir::OpKind::While: return std::make_unique<WhileKernel>(b, options);
      default: break;
    }
  } catch (const Error& e) {
    b.fail(fmt::format("compiling its body: {}", e.what()));
  }
  b.fail("is not a control-flow kernel");
}

}  // namespace rlx::backends::cpu
