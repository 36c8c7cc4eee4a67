// The MLX backend's executable. The LIR's kernels split into steps: runs of
// kernels MLX can express form one segment, a pure function from the roots it
// reads to the roots it makes (mx::compile'd in Compiled mode), and each kernel
// MLX cannot express is a host step the CPU backend runs on copies of its
// operands (runtime::compile_host_kernel, as Vulkan and CUDA do). Values are
// mx::arrays keyed by root buffer; a view is its root's elements re-read at
// its offset, so the memory plan is never needed. MLX keeps process-wide state
// (streams, the compile cache), so every call into it holds one mutex: clones
// are safe to use from several threads, and their runs take turns.
#ifdef RLX_HAVE_MLX
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <unordered_map>

#include "backends/mlx/lower.hpp"
#include "rlx/backends/mlx/mlx_backend.hpp"
#include "rlx/error.hpp"
#include "rlx/runtime/host_kernel.hpp"
#include "rlx/runtime/pending_run.hpp"

namespace rlx::backends::mlx {

namespace {

using compile::Buffer;
using compile::BufferId;
using compile::LirModule;

std::mutex& mlx_mutex() {
  static std::mutex m;
  return m;
}

using Env = std::unordered_map<BufferId, mx::array>;  // root buffer -> its value
using SegmentFn = std::function<std::vector<mx::array>(const std::vector<mx::array>&)>;

// Buffer `id`'s value: its root's, or for a view the root's elements from its offset, reshaped.
mx::array value_of(const LirModule& lir, const Env& env, BufferId id) {
  const Buffer& b = lir.buffer(id);
  auto it = env.find(b.root);
  if (it == env.end()) throw Error(fmt::format("mlx: buffer b{} '{}' is read before it is written", id, b.name));
  const mx::array& root = it->second;
  if (b.root == id) return root;
  const Buffer& r = lir.buffer(b.root);
  const bool bytes = ir::is_block_quantized(b.dtype);
  const std::int64_t unit = bytes ? 1 : std::int64_t(ir::dtype_size(b.dtype));
  const std::int64_t first = b.view_offset / unit, count = bytes ? b.nbytes() : b.numel();
  if (count == 0) return from_bytes(nullptr, b.dtype, b.shape);  // no op on an empty value (lower_node says why)
  const auto shape = storage_shape(b.dtype, b.shape);
  const auto on = device_for(root);
  if (first == 0 && count == (bytes ? r.nbytes() : r.numel())) return mx::reshape(root, shape, on);
  auto flat = mx::reshape(root, {-1}, on);
  return mx::reshape(mx::slice(flat, {mx::ShapeElem(first)}, {mx::ShapeElem(first + count)}, on), shape, on);
}

struct Step {
  bool host = false;
  std::vector<std::size_t> kernels;  // a segment's kernels, or the host kernel
  std::vector<BufferId> ins;         // segment: the roots it reads from outside
  std::vector<BufferId> outs;        // segment: the roots it writes that are read after it
  std::string why;                   // host: why MLX does not run it
};

struct Plan {
  LirModule lir;
  Mode mode = Mode::Compiled;
  std::vector<Step> steps;
  std::vector<SegmentFn> fns;               // per step; empty for host steps
  std::vector<runtime::StagedKernel> host;  // per step; only host steps' are set
  std::vector<mx::array> constants;         // per LIR constant
};

using Clock = std::chrono::steady_clock;
double micros_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// The kernels of segment `s`, run over its inputs; Eager evaluates after every kernel. With `micros` (one entry
// per LIR kernel; kernel_times), every kernel is evaluated as in Eager and its wall time, building its MLX
// graph and evaluating it, is recorded.
std::vector<mx::array> run_segment(const Plan& p, const Step& s, const std::vector<mx::array>& ins,
                                   std::span<double> micros = {}) {
  Env env;
  for (std::size_t i = 0; i < s.ins.size(); ++i) env.insert_or_assign(s.ins[i], ins[i]);
  for (std::size_t ki : s.kernels) {
    const auto t0 = Clock::now();
    const compile::Kernel& k = p.lir.kernels[ki];
    const ir::Graph& body = k.body;
    std::vector<std::optional<mx::array>> v(body.size());
    std::vector<mx::array> operands;
    for (const auto& n : body.nodes()) {
      if (n.op == ir::OpKind::Input) {
        v[n.id] = value_of(p.lir, env, k.input_buffer(n));
        continue;
      }
      operands.clear();
      for (auto in : n.inputs) operands.push_back(*v[in]);
      v[n.id] = lower_node(body, n, operands);
    }
    std::vector<mx::array> made;
    for (std::size_t j = 0; j < k.outputs.size(); ++j) {
      made.push_back(*v[body.outputs()[j].node]);
      env.insert_or_assign(k.outputs[j], made.back());
    }
    if (p.mode == Mode::Eager || !micros.empty()) mx::eval(made);
    if (!micros.empty()) micros[ki] = micros_since(t0);
  }
  std::vector<mx::array> outs;
  for (BufferId r : s.outs) outs.push_back(env.at(r));
  return outs;
}

std::shared_ptr<Plan> build_plan(const LirModule& lir, const compile::CompileOptions& options, Mode mode) {
  auto plan = std::make_shared<Plan>();
  Plan& p = *plan;
  p.lir = lir;
  p.mode = mode;
  for (std::size_t ki = 0; ki < lir.kernels.size(); ++ki) {
    const auto& k = lir.kernels[ki];
    for (BufferId o : k.outputs)
      if (lir.buffer(o).root != o)
        throw Error(
            fmt::format("mlx: kernel '{}' writes b{}, a view (the LIR contract has kernels write roots)", k.name, o));
    std::string why = host_reason(k);
    if (!why.empty()) {
      p.steps.push_back({.host = true, .kernels = {ki}, .why = std::move(why)});
    } else if (p.steps.empty() || p.steps.back().host) {
      p.steps.push_back({.host = false, .kernels = {ki}});
    } else {
      p.steps.back().kernels.push_back(ki);
    }
  }
  // Which step writes each root, and the roots every later reader needs.
  std::vector<int> writer(lir.buffers.size(), -1);
  for (std::size_t s = 0; s < p.steps.size(); ++s)
    for (std::size_t ki : p.steps[s].kernels)
      for (BufferId o : lir.kernels[ki].outputs) writer[std::size_t(o)] = int(s);
  auto root = [&](BufferId b) { return lir.buffer(b).root; };
  auto add_unique = [](std::vector<BufferId>& v, BufferId b) {
    if (std::find(v.begin(), v.end(), b) == v.end()) v.push_back(b);
  };
  for (std::size_t s = 0; s < p.steps.size(); ++s)
    for (std::size_t ki : p.steps[s].kernels)
      for (BufferId in : lir.kernels[ki].inputs) {
        const BufferId r = root(in);
        const int w = writer[std::size_t(r)];
        if (w == int(s)) continue;
        if (!p.steps[s].host) add_unique(p.steps[s].ins, r);
        if (w >= 0 && !p.steps[std::size_t(w)].host) add_unique(p.steps[std::size_t(w)].outs, r);
      }
  for (BufferId o : lir.outputs)
    if (const int w = writer[std::size_t(root(o))]; w >= 0 && !p.steps[std::size_t(w)].host)
      add_unique(p.steps[std::size_t(w)].outs, root(o));

  for (std::size_t i = 0; i < lir.constants.size(); ++i) {
    const auto& v = lir.constant_values[i];
    p.constants.push_back(from_bytes(v.data(), v.dtype(), v.shape()));
  }
  p.fns.resize(p.steps.size());
  p.host.resize(p.steps.size());
  const Plan* raw = plan.get();  // the functions live in the plan they read
  for (std::size_t s = 0; s < p.steps.size(); ++s) {
    if (p.steps[s].host) {
      p.host[s] = runtime::compile_host_kernel(lir, p.steps[s].kernels[0], options);
      continue;
    }
    SegmentFn fn = [raw, s](const std::vector<mx::array>& ins) { return run_segment(*raw, raw->steps[s], ins); };
    p.fns[s] = mode == Mode::Compiled ? mx::compile(std::move(fn)) : std::move(fn);
  }
  return plan;
}

// Each compiled segment traced and run once on zeros, so that the first run does not pay for the trace and
// the fused kernels' builds. On failure one warning, and the plan runs uncompiled (Lazy): a failure here
// (MLX's CPU device builds fused kernels with the system C++ compiler) would fail every run the same way.
void warm_compile(Plan& p) {
  try {
    for (std::size_t s = 0; s < p.steps.size(); ++s) {
      if (p.steps[s].host) continue;
      std::vector<mx::array> ins;
      for (BufferId r : p.steps[s].ins) {
        const Buffer& b = p.lir.buffer(r);
        ins.push_back(mx::zeros(storage_shape(b.dtype, b.shape), storage_dtype(b.dtype)));
      }
      mx::eval(p.fns[s](ins));
    }
  } catch (const Error&) {
    throw;  // RLX's own refusal (a node the lowering rejects) is a compile error, not a tracing failure
  } catch (const std::exception& e) {
    std::fprintf(stderr,
                 "[rlx] mlx: warm_compile of '%s' failed (%s); it runs uncompiled (RLX_MLX_MODE=lazy), and the first "
                 "run pays the trace cost\n",
                 p.lir.name.c_str(), e.what());
    p.mode = Mode::Lazy;
    const Plan* raw = &p;
    for (std::size_t s = 0; s < p.steps.size(); ++s)
      if (!p.steps[s].host)
        p.fns[s] = [raw, s](const std::vector<mx::array>& ins) { return run_segment(*raw, raw->steps[s], ins); };
  }
}

// The params, shared by an executable and its clones (set_param on one is seen by all, as on the CPU).
struct Params {
  std::vector<mx::array> values;
};

class MlxExecutable final : public runtime::ExecutableGraph {
 public:
  MlxExecutable(std::shared_ptr<const Plan> plan, std::shared_ptr<Params> params)
      : plan_(std::move(plan)), params_(std::move(params)) {
    const LirModule& lir = plan_->lir;
    handles_.resize(lir.inputs.size());
    for (std::size_t s = 0; s < plan_->steps.size(); ++s) {
      if (!plan_->steps[s].host) {
        host_.emplace_back();
        continue;
      }
      const auto& proto = plan_->host[s];
      host_.push_back({proto.exe->clone(), proto.input_bytes, proto.output_bytes});
    }
  }
  ~MlxExecutable() override {
    pending_.finish();                  // before the lock: the run takes it
    std::lock_guard lock(mlx_mutex());  // arrays and compiled functions are released under the lock too
    handles_.clear();
    params_.reset();
    plan_.reset();
  }
  MlxExecutable(const MlxExecutable&) = delete;
  MlxExecutable& operator=(const MlxExecutable&) = delete;

  runtime::ExecutableCapabilities capabilities() const override {
    runtime::ExecutableCapabilities c;
    // Handles are MLX arrays: in the device's memory, fed from outputs without a host round trip.
    c.clone = c.persistent_handles = c.gpu_handles = c.kv_resident = c.typed_io = c.async_pipeline = c.read_outputs =
        c.rng = c.copy_params = c.kernel_times = c.active_extent = true;
    return c;
  }

  // Off by default: a profiled run evaluates kernel by kernel (as the eager mode), so it loses mx::compile's
  // fusion across kernels; its times say where a graph's time goes, not what the compiled run costs.
  void set_profiling(bool on) override {
    require_idle("set_profiling");
    micros_.assign(on ? plan_->lir.kernels.size() : 0, 0.0);
    profiled_ = false;
  }

  std::vector<runtime::KernelTime> kernel_times() const override {
    require_idle("kernel_times");
    std::vector<runtime::KernelTime> out;
    if (!profiled_) return out;
    std::vector<bool> host(micros_.size(), false);
    for (const Step& s : plan_->steps)
      if (s.host) host[s.kernels[0]] = true;
    for (std::size_t k = 0; k < micros_.size(); ++k) out.push_back({plan_->lir.kernels[k].name, micros_[k], host[k]});
    return out;
  }

  void set_param(std::size_t index, const void* data, std::size_t nbytes) override {
    require_idle("set_param");
    const Buffer& b = param_buffer(index, "set_param");
    check_bytes("set_param: param " + std::to_string(index), b, nbytes);
    std::lock_guard lock(mlx_mutex());
    params_->values[index] = from_bytes(data, b.dtype, b.shape);
  }

  void run(std::span<const void* const> inputs, std::span<void* const> outputs) override {
    require_idle("run");
    execute(inputs, outputs, false);
  }

  void run_read_outputs(std::span<const void* const> inputs, std::span<void* const> outputs) override {
    require_idle("run_read_outputs");
    execute(inputs, outputs, true);
  }

  std::unique_ptr<runtime::ExecutableGraph> clone() const override {
    require_idle("clone");
    std::lock_guard lock(mlx_mutex());
    auto c = std::make_unique<MlxExecutable>(plan_, params_);
    c->set_backend_name(backend_name());
    if (rng_.seed) c->apply_rng(rng_);
    return c;
  }

  void set_param_typed(std::size_t index, const ir::TensorView& value) override {
    require_idle("set_param_typed");
    const Buffer& b = param_buffer(index, "set_param_typed");
    auto t = converted(b, value, "set_param_typed: param " + std::to_string(index));
    set_param(index, t ? t->data() : value.data, t ? t->nbytes() : value.nbytes);
  }

  std::vector<ir::Tensor> run_typed(std::span<const ir::TensorView> inputs) override {
    require_idle("run_typed");
    const LirModule& lir = plan_->lir;
    if (inputs.size() != lir.inputs.size())
      throw Error(fmt::format("mlx: run_typed got {} inputs, expected {}", inputs.size(), lir.inputs.size()));
    std::vector<std::optional<ir::Tensor>> conv(inputs.size());
    std::vector<const void*> in(inputs.size(), nullptr);
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (handles_[i]) continue;
      conv[i] = converted(lir.buffer(lir.inputs[i]), inputs[i], "run_typed: input " + std::to_string(i));
      in[i] = conv[i] ? conv[i]->data() : inputs[i].data;
    }
    std::vector<ir::Tensor> outs;
    std::vector<void*> out;
    outs.reserve(lir.outputs.size());
    for (BufferId o : lir.outputs) out.push_back(outs.emplace_back(lir.buffer(o).dtype, lir.buffer(o).shape).data());
    execute(in, out, false);
    return outs;
  }

  // The run happens on a thread of its own (MLX's own evaluation is asynchronous only within one graph).
  void commit_no_wait(std::span<const void* const> inputs, std::span<void* const> outputs) override {
    pending_.start(inputs, outputs, [this](auto in, auto out) { execute(in, out, false); });
  }

  void sync_pending() override { pending_.wait(); }

  void run_pipelined(std::span<const std::vector<const void*>> inputs,
                     std::span<const std::vector<void*>> outputs) override {
    require_idle("run_pipelined");
    runtime::run_sets_in_order("mlx", inputs, outputs, [this](auto in, auto out) { execute(in, out, false); });
  }

  void bind_handle(std::size_t index, const void* data, std::size_t nbytes) override {
    require_idle("bind_handle");
    const Buffer& b = input_buffer(index, "bind_handle");
    check_bytes("bind_handle: input " + std::to_string(index), b, nbytes);
    std::lock_guard lock(mlx_mutex());
    handles_[index] = from_bytes(data, b.dtype, b.shape);
  }

  void read_handle(std::size_t index, void* dst, std::size_t nbytes) const override {
    require_idle("read_handle");
    const Buffer& b = input_buffer(index, "read_handle");
    if (!handles_[index])
      throw Error(fmt::format("mlx: read_handle: input {} has no handle (bind_handle it first)", index));
    check_bytes("read_handle: input " + std::to_string(index), b, nbytes);
    std::lock_guard lock(mlx_mutex());
    to_bytes(*handles_[index], dst, nbytes);
  }

  // The array itself: MLX arrays are immutable, so the two executables share it until one run replaces it.
  void copy_handle_to(std::size_t index, runtime::ExecutableGraph& dst, std::size_t nbytes) const override {
    auto* other = dynamic_cast<MlxExecutable*>(&dst);
    if (!other) return ExecutableGraph::copy_handle_to(index, dst, nbytes);
    require_idle("copy_handle_to");
    other->require_idle("copy_handle_to");
    const Buffer& b = input_buffer(index, "copy_handle_to");
    if (!handles_[index])
      throw Error(fmt::format("mlx: copy_handle_to: input {} has no handle (bind_handle it first)", index));
    check_bytes("copy_handle_to: input " + std::to_string(index), b, nbytes);
    check_bytes("copy_handle_to: input " + std::to_string(index), other->input_buffer(index, "copy_handle_to"), nbytes);
    std::lock_guard lock(mlx_mutex());
    other->handles_[index] = handles_[index];
  }

  void feed_handle(std::size_t index, std::size_t output) override {
    require_idle("feed_handle");
    const LirModule& lir = plan_->lir;
    const Buffer& b = input_buffer(index, "feed_handle");
    if (!handles_[index])
      throw Error(fmt::format("mlx: feed_handle: input {} has no handle (bind_handle it first)", index));
    if (output >= lir.outputs.size())
      throw Error(fmt::format("mlx: feed_handle: output {} out of range ({} outputs)", output, lir.outputs.size()));
    const Buffer& o = lir.buffer(lir.outputs[output]);
    if (o.dtype != b.dtype || o.shape != b.shape)
      throw Error(fmt::format("mlx: feed_handle: output {} ({}{}) does not match input {} ({}{})", output,
                              ir::dtype_name(o.dtype), ir::Shape(o.shape).str(), index, ir::dtype_name(b.dtype),
                              ir::Shape(b.shape).str()));
    for (auto& f : feeds_)
      if (f.first == index) {
        f.second = output;
        return;
      }
    feeds_.emplace_back(index, output);
  }

  void set_rng(const runtime::RngOptions& rng) override {
    require_idle("set_rng");
    apply_rng(rng);
  }
  runtime::RngOptions rng() const override { return rng_; }

  void copy_params_from(const runtime::ExecutableGraph& src) override {
    require_idle("copy_params_from");
    const MlxExecutable& other = same_params(src, "copy_params_from");
    if (other.params_ == params_) return;  // clones share their params already
    std::lock_guard lock(mlx_mutex());
    params_->values = other.params_->values;  // arrays are immutable: sharing them is a copy
  }

  // The graph at another extent reads the same Params from now on: a set_param through either is seen by both.
  void share_params_from(const runtime::ExecutableGraph& src) override {
    require_idle("share_params_from");
    const MlxExecutable& other = same_params(src, "share_params_from");
    std::lock_guard lock(mlx_mutex());
    params_ = other.params_;
  }

 private:
  void apply_rng(const runtime::RngOptions& rng) {
    // Random samples are drawn by host steps (traits(): the CPU backend's counter-based streams).
    for (auto& h : host_)
      if (h.exe) h.exe->set_rng(rng);
    rng_ = rng;
  }

  void require_idle(const char* method) const { pending_.require_idle(method); }
  // `src` as an MLX executable whose params have this one's number, dtypes and shapes; rlx::Error naming `method`.
  const MlxExecutable& same_params(const runtime::ExecutableGraph& src, const char* method) const {
    const auto* other = dynamic_cast<const MlxExecutable*>(&src);
    if (!other)
      throw Error(std::string("mlx: ") + method + ": the source is an executable of backend '" + src.backend_name() +
                  "'");
    const LirModule &a = plan_->lir, &b = other->plan_->lir;
    bool same = a.params.size() == b.params.size();
    for (std::size_t i = 0; same && i < a.params.size(); ++i)
      same = a.buffer(a.params[i]).dtype == b.buffer(b.params[i]).dtype &&
             a.buffer(a.params[i]).shape == b.buffer(b.params[i]).shape;
    if (!same) throw Error(std::string("mlx: ") + method + ": the source's params differ in number, dtype or shape");
    return *other;
  }

  const Buffer& param_buffer(std::size_t index, std::string_view method) const {
    const LirModule& lir = plan_->lir;
    if (index >= lir.params.size())
      throw Error(fmt::format("mlx: {}: param index {} out of range ({} params)", method, index, lir.params.size()));
    return lir.buffer(lir.params[index]);
  }
  const Buffer& input_buffer(std::size_t index, std::string_view method) const {
    const LirModule& lir = plan_->lir;
    if (index >= lir.inputs.size())
      throw Error(fmt::format("mlx: {}: input index {} out of range ({} inputs)", method, index, lir.inputs.size()));
    return lir.buffer(lir.inputs[index]);
  }
  static void check_bytes(const std::string& what, const Buffer& b, std::size_t nbytes) {
    const std::size_t want = ir::storage_bytes(b.dtype, b.shape);
    if (nbytes != want) throw Error(fmt::format("mlx: {} holds {} bytes, got {}", what, want, nbytes));
  }

  // `value` converted to `b`'s dtype, or nullopt when it has that dtype already.
  static std::optional<ir::Tensor> converted(const Buffer& b, const ir::TensorView& value, const std::string& what) {
    if (value.dtype != b.dtype && (ir::is_block_quantized(value.dtype) || ir::is_block_quantized(b.dtype)))
      throw Error(fmt::format("mlx: {} expects {}, got {} (block-quantized values are not converted)", what,
                              ir::dtype_name(b.dtype), ir::dtype_name(value.dtype)));
    if (value.nbytes != ir::storage_bytes(value.dtype, b.shape) || (b.numel() && !value.data))
      throw Error(fmt::format("mlx: {} expects {} elements of {}, got {} bytes", what, b.numel(),
                              ir::dtype_name(value.dtype), value.nbytes));
    if (value.dtype == b.dtype) return std::nullopt;
    ir::Tensor src(value.dtype, b.shape, {static_cast<const std::byte*>(value.data), value.nbytes});
    ir::Tensor dst(b.dtype, b.shape);
    for (std::int64_t i = 0; i < dst.numel(); ++i) dst.set(i, src.get(i));
    return dst;
  }

  // One run. With `sparse`, outputs[j] == nullptr means output j is not read back (nor computed, unless fed).
  void execute(std::span<const void* const> inputs, std::span<void* const> outputs, bool sparse) {
    const Plan& p = *plan_;
    const LirModule& lir = p.lir;
    if (inputs.size() != lir.inputs.size() || outputs.size() != lir.outputs.size())
      throw Error(fmt::format("mlx: run() got {} inputs and {} outputs, expected {} and {}", inputs.size(),
                              outputs.size(), lir.inputs.size(), lir.outputs.size()));
    std::lock_guard lock(mlx_mutex());
    Env env;
    for (std::size_t i = 0; i < lir.inputs.size(); ++i) {
      const Buffer& b = lir.buffer(lir.inputs[i]);
      env.insert_or_assign(lir.inputs[i], handles_[i] ? *handles_[i] : from_bytes(inputs[i], b.dtype, b.shape));
    }
    for (std::size_t i = 0; i < lir.params.size(); ++i) env.insert_or_assign(lir.params[i], params_->values[i]);
    for (std::size_t i = 0; i < lir.constants.size(); ++i) env.insert_or_assign(lir.constants[i], p.constants[i]);
    const bool profiling = !micros_.empty();
    for (std::size_t s = 0; s < p.steps.size(); ++s) {
      const Step& step = p.steps[s];
      if (step.host) {
        const auto t0 = Clock::now();
        run_host(s, env);
        if (profiling) micros_[step.kernels[0]] = micros_since(t0);
        continue;
      }
      std::vector<mx::array> ins;
      for (BufferId r : step.ins) ins.push_back(env.at(r));
      if (profiling) mx::eval(ins);  // what earlier steps left lazy is theirs, not this segment's first kernel's
      auto outs = profiling ? run_segment(p, step, ins, micros_) : p.fns[s](ins);
      for (std::size_t j = 0; j < step.outs.size(); ++j) env.insert_or_assign(step.outs[j], outs[j]);
    }
    // Everything read back or fed evaluates together.
    std::vector<mx::array> results;
    for (std::size_t j = 0; j < lir.outputs.size(); ++j) results.push_back(value_of(lir, env, lir.outputs[j]));
    std::vector<mx::array> wanted;
    for (std::size_t j = 0; j < results.size(); ++j)
      if (!sparse || outputs[j]) wanted.push_back(results[j]);
    for (auto [i, j] : feeds_) wanted.push_back(results[j]);
    mx::eval(wanted);
    for (std::size_t j = 0; j < results.size(); ++j)
      if (!sparse || outputs[j]) to_bytes(results[j], outputs[j], lir.buffer(lir.outputs[j]).nbytes());
    for (auto [i, j] : feeds_) handles_[i] = results[j];
    profiled_ = profiling;
  }

  // Host step s: its operands copied out of MLX, the CPU backend's kernel, its results copied in.
  void run_host(std::size_t s, Env& env) {
    const LirModule& lir = plan_->lir;
    const compile::Kernel& k = lir.kernels[plan_->steps[s].kernels[0]];
    runtime::StagedKernel& h = host_[s];
    std::vector<std::vector<std::byte>> in_bytes(k.inputs.size()), out_bytes(k.outputs.size());
    std::vector<const void*> in;
    std::vector<void*> out;
    for (std::size_t i = 0; i < k.inputs.size(); ++i) {
      in_bytes[i].resize(h.input_bytes[i]);
      to_bytes(value_of(lir, env, k.inputs[i]), in_bytes[i].data(), h.input_bytes[i]);
      in.push_back(in_bytes[i].data());
    }
    for (std::size_t j = 0; j < k.outputs.size(); ++j) {
      out_bytes[j].resize(h.output_bytes[j]);
      out.push_back(out_bytes[j].data());
    }
    h.run(in, out);
    for (std::size_t j = 0; j < k.outputs.size(); ++j) {
      const Buffer& b = lir.buffer(k.outputs[j]);
      env.insert_or_assign(k.outputs[j], from_bytes(out[j], b.dtype, b.shape));
    }
  }

  std::shared_ptr<const Plan> plan_;
  std::shared_ptr<Params> params_;
  std::vector<runtime::StagedKernel> host_;  // per step: clones of the plan's host kernels (own arenas)
  std::vector<std::optional<mx::array>> handles_;
  std::vector<std::pair<std::size_t, std::size_t>> feeds_;  // (input, output): the output becomes the handle
  runtime::RngOptions rng_;
  std::vector<double> micros_;          // per LIR kernel while profiling (empty: off)
  bool profiled_ = false;               // a run since profiling was turned on
  runtime::PendingRun pending_{"mlx"};  // last: destroyed first, so a pending run finishes before the rest goes
};

class MlxBackend final : public runtime::Backend {
 public:
  std::string_view name() const override { return "mlx"; }
  compile::BackendTraits traits() const override { return mlx::traits(); }
  std::string device_name() const override {
    std::lock_guard lock(mlx_mutex());
    return fmt::format("mlx-{}", mx::default_device().type == mx::Device::gpu ? "gpu" : "cpu");
  }
  std::unique_ptr<runtime::ExecutableGraph> compile_lir(const compile::LirModule& lir,
                                                        const compile::CompileOptions& options) override {
    const Mode mode = mode_from_env();
    std::lock_guard lock(mlx_mutex());
    auto plan = build_plan(lir, options, mode);
    if (mode == Mode::Compiled) warm_compile(*plan);
    auto params = std::make_shared<Params>();
    for (BufferId id : lir.params) {
      const Buffer& b = lir.buffer(id);
      // Zeros until set_param, as on the CPU.
      params->values.push_back(mx::zeros(storage_shape(b.dtype, b.shape), storage_dtype(b.dtype)));
    }
    return std::make_unique<MlxExecutable>(std::move(plan), std::move(params));
  }
};

}  // namespace

std::unique_ptr<runtime::Backend> make_mlx_backend() {
  // MLX's CUDA build runs f32 matmuls, convolutions and attention as TF32 unless MLX_ENABLE_TF32 is 0, a setting
  // it reads once per process. RLX's f32 is exact (TF32 only when asked, as on the CUDA backend), so it is turned
  // off before MLX first reads it, unless the environment already sets it (docs/backends/mlx.md).
  ::setenv("MLX_ENABLE_TF32", "0", /*overwrite=*/0);
  return std::make_unique<MlxBackend>();
}
std::string unavailable_reason() { return {}; }

}  // namespace rlx::backends::mlx
#endif  // RLX_HAVE_MLX
