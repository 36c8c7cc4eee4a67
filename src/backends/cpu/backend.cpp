// The CPU backend: traits, compile_lir and the executable. Everything is
// planned at compile time; run() fills the input/output entries of a
// preallocated pointer table, runs the kernels and copies the outputs that
// were not written in place.
#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cassert>
#include <chrono>
#include <cstring>
#include <mutex>
#include <new>
#include <optional>
#include <utility>

#include "backends/cpu/gemm_pack.hpp"
#include "backends/cpu/kernels.hpp"
#include "backends/cpu/program.hpp"
#include "rlx/backends/cpu/cpu_backend.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/limits.hpp"
#include "rlx/ir/op_def.hpp"
#include "rlx/runtime/custom_kernels.hpp"
#include "rlx/runtime/pending_run.hpp"

namespace rlx::backends::cpu {

namespace {

using compile::BufferId;
using compile::BufferRole;

constexpr std::size_t kAlign = 64;
std::size_t align_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// One 64-byte aligned allocation.
class AlignedBytes {
 public:
  AlignedBytes() = default;
  // Refused up front when the machine cannot hold it: with overcommit, a huge
  // allocation "succeeds" and the first run is killed for memory instead.
  explicit AlignedBytes(std::size_t n, std::string_view what = "a CPU buffer")
      : p_((ir::limits::check_allocation(std::int64_t(n), what),
            static_cast<std::byte*>(::operator new(align_up(std::max<std::size_t>(n, 1)), std::align_val_t(kAlign))))),
        n_(n) {}
  std::byte* data() const { return p_.get(); }
  std::size_t size() const { return n_; }

 private:
  struct Free {
    void operator()(std::byte* p) const { ::operator delete(p, std::align_val_t(kAlign)); }
  };
  std::unique_ptr<std::byte, Free> p_;
  std::size_t n_ = 0;
};

// Where a buffer's bytes live: a base plus a byte offset.
enum class Base : std::uint8_t { Arena, Input, Param, Constant, Output };
struct Ref {
  Base base = Base::Arena;
  std::int32_t index = 0;
  std::int64_t offset = 0;
};

struct Output {
  BufferId buffer = 0;
  std::size_t bytes = 0;
  bool in_place = false;  // kernels write the caller's memory directly
};

// Immutable after compile_lir; shared by clones.
struct Plan {
  const KernelTable* isa = nullptr;
  const LowpTable* lowp = nullptr;  // the int8 and bf16 GEMMs (lowp_gemm.hpp)
  int threads = 1;
  std::vector<std::unique_ptr<CpuKernel>> kernels;
  std::vector<std::string> kernel_names;  // the LIR kernels', for kernel_times
  std::size_t shared_bytes = 0, thread_bytes = 0;
  std::size_t arena_bytes = 0;
  std::vector<AlignedBytes> constants;
  std::vector<std::size_t> param_bytes;
  std::vector<Ref> refs;                          // per buffer
  std::vector<std::pair<BufferId, Ref>> dynamic;  // entries bound per run (inputs, in-place outputs)
  std::vector<Output> outputs;
  // Per output: the input it may be computed over in place (-1: none). A dynamic_update_slice whose x is an
  // input that nothing else reads can write over it, so feeding the output back to that input's handle (a
  // KV cache) costs the update's rows, not a copy of the whole tensor.
  std::vector<std::int32_t> donor;
  std::size_t n_inputs = 0;
  std::vector<PackedOperand> packs;  // pointer table entries after the buffers' (gemm_pack.hpp)
  struct Io {
    ir::DType dtype;
    std::vector<std::int64_t> shape;
  };
  std::vector<Io> input_io, param_io, output_io;  // for typed I/O and handles
  // set_rng rebuilds the random leaf kernels with other seeds from this copy
  // of the LIR (constants dropped); null when the graph has no random op.
  std::vector<std::size_t> random_kernels;
  std::shared_ptr<const compile::LirModule> random_lir;
  std::int64_t stream = 0;
};

// The params, shared by an executable, its clones, and the executables of the same graph at other extents
// (share_params_from).
struct ParamStore {
  std::vector<AlignedBytes> data;
  // share_param: a param read in place from the caller's memory (null: from data), and what keeps it alive.
  std::vector<const std::byte*> shared;
  std::vector<std::shared_ptr<const void>> owners;
  std::uint64_t version = 0;  // bumped when a param moves (share_param, or back to a copy): pointers are re-read
  // Per param, bumped by every write, and their sum: a plan's packed copies of params are stale when it moved
  // since they were packed (a write through an executable of another plan that shares these params).
  std::vector<std::uint64_t> writes;
  std::atomic<std::uint64_t> total_writes{0};

  const std::byte* base(std::size_t i) const { return shared[i] ? shared[i] : data[i].data(); }
  void wrote(std::size_t i) {
    ++writes[i];
    total_writes.fetch_add(1, std::memory_order_release);
  }
};

// One plan's packed copies of params and constants (gemm_pack.hpp), shared by its executable and their clones.
struct PackStore {
  std::vector<AlignedBytes> packed;      // per Plan::packs
  std::vector<std::uint64_t> packed_at;  // per pack of a param: that param's ParamStore::writes it was packed from
  std::atomic<std::uint64_t> seen{0};    // ParamStore::total_writes when every pack was last brought up to date
  std::mutex mutex;                      // clones running at once bring them up to date one at a time
};

// (Re)packs plan.packs[i] from its source's current bytes.
void pack_operand(const Plan& plan, const ParamStore& store, PackStore& packs, std::size_t i) {
  const PackedOperand& op = plan.packs[i];
  const Ref& r = plan.refs[std::size_t(op.buffer)];
  const std::byte* base =
      r.base == Base::Param ? store.base(std::size_t(r.index)) : plan.constants[std::size_t(r.index)].data();
  const std::byte* src = base + r.offset;
  std::byte* out = packs.packed[i].data();
  if (r.base == Base::Param) packs.packed_at[i] = store.writes[std::size_t(r.index)];
  const i64 ldb = op.transposed ? op.K : op.N;
  if (op.spec.format == PackFormat::Winograd) {
    // U = G g G^T for every (output, input) channel pair, computed in f64: 16 [C, O] matrices, each packed
    // for the GEMM. G's rows: [1 0 0], [1/2 1/2 1/2], [1/2 -1/2 1/2], [0 0 1].
    static constexpr double G[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};
    const KernelTable& isa = *plan.isa;
    const i64 O = op.N, C = op.K / 9, panels = (O + isa.gemm_nr - 1) / isa.gemm_nr;
    const std::size_t each = packed_floats(isa, C, O);
    const auto* w = reinterpret_cast<const float*>(src);
    auto* dst = reinterpret_cast<float*>(out);
    parallel_for(
        16, 1,
        [&](i64 x0, i64 x1) {
          std::vector<float> u(std::size_t(C * O));
          for (i64 xi = x0; xi < x1; ++xi) {
            const double* gi = G[xi / 4];
            const double* gj = G[xi % 4];
            for (i64 o = 0; o < O; ++o)
              for (i64 c = 0; c < C; ++c) {
                const float* k = w + (o * C + c) * 9;
                double acc = 0;
                for (int a = 0; a < 3; ++a)
                  for (int bb = 0; bb < 3; ++bb) acc += gi[a] * double(k[a * 3 + bb]) * gj[bb];
                u[std::size_t(c * O + o)] = float(acc);
              }
            isa.gemm_pack_b(u.data(), O, C, O, dst + std::size_t(xi) * each, 0, panels);
          }
        },
        plan.threads);
    return;
  }
  if (op.spec.format == PackFormat::Conv) {
    const KernelTable& isa = *plan.isa;
    const i64 G = op.spec.groups, Og = op.N / G, taps = op.spec.taps, Cg = op.K / taps;
    parallel_for(
        G * (Og / isa.conv_block), 1,
        [&](i64 u0, i64 u1) {
          isa.conv_pack_weights(reinterpret_cast<const float*>(src), G, Og, Cg, taps, reinterpret_cast<float*>(out), u0,
                                u1);
        },
        plan.threads);
    return;
  }
  if (op.spec.format != PackFormat::F32) {
    const LowpTable& t = *plan.lowp;
    const bool int8 = op.spec.format == PackFormat::Int8;
    // A narrowed param: its f32 values rounded to bf16 as the precision pass's cast would round them, then packed.
    std::vector<std::uint16_t> rounded;
    if (op.spec.round_from_f32) {
      rounded.resize(std::size_t(op.K * op.N));
      const auto* f = reinterpret_cast<const float*>(src);
      for (std::size_t e = 0; e < rounded.size(); ++e) rounded[e] = ir::float_to_bf16(f[e]);
      src = reinterpret_cast<const std::byte*>(rounded.data());
    }
    parallel_for(
        i64(lowp_panels(int8 ? t.i8_nr : t.bf16_nr, op.N)), 1,
        [&](i64 p0, i64 p1) {
          if (int8)
            t.i8_pack_b(reinterpret_cast<const std::uint8_t*>(src), op.spec.source_unsigned, op.transposed, ldb, op.K,
                        op.N, out, p0, p1);
          else
            t.bf16_pack_b(reinterpret_cast<const std::uint16_t*>(src), op.transposed, ldb, op.K, op.N, out, p0, p1);
        },
        plan.threads);
    return;
  }
  const auto* b = reinterpret_cast<const float*>(src);
  auto* dst = reinterpret_cast<float*>(out);
  const KernelTable& isa = *plan.isa;
  parallel_for((op.N + isa.gemm_nr - 1) / isa.gemm_nr, 1,
               [&](i64 p0, i64 p1) {
                 if (op.transposed)
                   isa.gemm_pack_bt(b, ldb, op.K, op.N, dst, p0, p1);
                 else
                   isa.gemm_pack_b(b, ldb, op.K, op.N, dst, p0, p1);
               },
               plan.threads);
}

std::size_t nbytes_of(const compile::Buffer& b) { return ir::storage_bytes(b.dtype, b.shape); }

// Plan::donor: output j may be computed over input i when a dynamic_update_slice writes it (in place, as an
// output of its own) from x = input i whole, and no other kernel or output reads input i's bytes.
std::vector<std::int32_t> donors(const compile::LirModule& lir, const Plan& plan,
                                 std::span<const std::pair<BufferId, BufferId>> updates) {
  std::vector<std::int32_t> donor(lir.outputs.size(), -1);
  auto root_of = [&](BufferId id) {
    const auto& b = lir.buffer(id);
    return b.root < 0 ? id : b.root;
  };
  std::vector<int> readers(lir.buffers.size(), 0);
  for (const auto& k : lir.kernels)
    for (BufferId in : k.inputs) ++readers[std::size_t(root_of(in))];
  for (BufferId out : lir.outputs) ++readers[std::size_t(root_of(out))];
  for (const auto& [x, y] : updates) {
    const auto& xb = lir.buffer(x);
    const auto& root = lir.buffer(root_of(x));
    if (root.role != BufferRole::Input || readers[std::size_t(root.id)] != 1 || xb.nbytes() != root.nbytes() ||
        (xb.root >= 0 && xb.root != xb.id && xb.view_offset != 0))
      continue;
    for (std::size_t j = 0; j < lir.outputs.size(); ++j)
      if (lir.outputs[j] == y && plan.outputs[j].in_place) donor[j] = root.external_index;
  }
  return donor;
}

class CpuExecutable final : public runtime::ExecutableGraph {
 public:
  CpuExecutable(std::shared_ptr<const Plan> plan, std::shared_ptr<ParamStore> params, std::shared_ptr<PackStore> packs)
      : plan_(std::move(plan)),
        params_(std::move(params)),
        packs_(std::move(packs)),
        arena_(plan_->arena_bytes, "the CPU arena"),
        shared_(plan_->shared_bytes, "the CPU scratch area"),
        stride_(align_up(plan_->thread_bytes)),
        threads_(stride_ * std::size_t(ThreadPool::instance().size())),
        ptrs_(plan_->refs.size() + plan_->packs.size(), nullptr),
        handles_(plan_->n_inputs),
        donated_(plan_->outputs.size(), false),
        out_scratch_(plan_->outputs.size()) {
    for (const auto& k : plan_->kernels) kernels_.push_back(k.get());
    set_backend_name("cpu");
    resolve_pointers();
  }

  // ptrs_ for every buffer not bound per run (arena, params, constants, packed copies).
  void resolve_pointers() {
    for (std::size_t i = 0; i < plan_->refs.size(); ++i) {
      const Ref& r = plan_->refs[i];
      std::byte* base = nullptr;
      switch (r.base) {
        case Base::Arena: base = arena_.data(); break;
        // Kernels only read params (the const_cast below never leads to a write).
        case Base::Param: base = const_cast<std::byte*>(params_->base(std::size_t(r.index))); break;
        case Base::Constant: base = plan_->constants[std::size_t(r.index)].data(); break;
        default: continue;  // bound per run
      }
      ptrs_[i] = base + r.offset;
    }
    for (std::size_t i = 0; i < plan_->packs.size(); ++i) ptrs_[plan_->refs.size() + i] = packs_->packed[i].data();
    params_version_ = params_->version;
  }

  void set_param(std::size_t index, const void* data, std::size_t nbytes) override {
    require_idle("set_param");
    if (index >= plan_->param_bytes.size())
      throw Error("cpu: param index " + std::to_string(index) + " out of range (" +
                  std::to_string(plan_->param_bytes.size()) + " params)");
    if (nbytes != plan_->param_bytes[index])
      throw Error("cpu: param " + std::to_string(index) + " expects " + std::to_string(plan_->param_bytes[index]) +
                  " bytes, got " + std::to_string(nbytes));
    if (params_->shared[index]) {  // back to a copy of its own
      params_->shared[index] = nullptr;
      params_->owners[index].reset();
      params_->data[index] = AlignedBytes(nbytes, "a CPU param");
      ++params_->version;
      resolve_pointers();
    }
    if (nbytes) std::memcpy(params_->data[index].data(), data, nbytes);
    params_->wrote(index);
    repack(index);
  }

  // Aligned data, or a block type's (its kernels copy blocks out, never assuming alignment), is read in
  // place; anything else is copied, since the SIMD kernels load params at kAlign.
  void share_param(std::size_t index, const void* data, std::size_t nbytes,
                   const std::shared_ptr<const void>& owner) override {
    require_idle("share_param");
    const bool in_place =
        index < plan_->param_io.size() && nbytes == plan_->param_bytes[index] &&
        (reinterpret_cast<std::uintptr_t>(data) % kAlign == 0 || ir::is_block_quantized(plan_->param_io[index].dtype));
    if (!in_place || nbytes == 0) {
      set_param(index, data, nbytes);
      return;
    }
    params_->shared[index] = static_cast<const std::byte*>(data);
    params_->owners[index] = owner;
    params_->data[index] = AlignedBytes(0, "a CPU param");  // the copy is not needed any more
    ++params_->version;
    params_->wrote(index);
    resolve_pointers();
    repack(index);
  }

  // Repacks the packed copies of param `index`, or of every param (nullopt).
  void repack(std::optional<std::size_t> index) {
    std::lock_guard held(packs_->mutex);
    for (std::size_t i = 0; i < plan_->packs.size(); ++i) {
      const Ref& r = plan_->refs[std::size_t(plan_->packs[i].buffer)];
      if (r.base == Base::Param && (!index || std::size_t(r.index) == *index))
        pack_operand(*plan_, *params_, *packs_, i);
    }
  }

  // Repacks the packed copies of params written through an executable of another plan since they were packed.
  void refresh_packs() {
    const std::uint64_t total = params_->total_writes.load(std::memory_order_acquire);
    if (packs_->seen.load(std::memory_order_acquire) == total) return;
    std::lock_guard held(packs_->mutex);
    for (std::size_t i = 0; i < plan_->packs.size(); ++i) {
      const Ref& r = plan_->refs[std::size_t(plan_->packs[i].buffer)];
      if (r.base == Base::Param && packs_->packed_at[i] != params_->writes[std::size_t(r.index)])
        pack_operand(*plan_, *params_, *packs_, i);
    }
    packs_->seen.store(total, std::memory_order_release);
  }

  // The params of `src` (this backend, the same params: the graph at another extent), read where src keeps
  // them from now on; this plan's packed copies of them are made here.
  void share_params_from(const runtime::ExecutableGraph& src) override {
    require_idle("share_params_from");
    const CpuExecutable& cpu = same_params(src, "share_params_from");
    params_ = cpu.params_;
    resolve_pointers();
    repack(std::nullopt);
  }

  void run(std::span<const void* const> inputs, std::span<void* const> outputs) override {
    require_idle("run");
    execute(inputs, outputs, false);
  }

  runtime::ExecutableCapabilities capabilities() const override {
    runtime::ExecutableCapabilities c;
    c.clone = c.persistent_handles = c.kv_resident = c.typed_io = c.async_pipeline = c.read_outputs = c.rng =
        c.copy_params = c.kernel_times = c.shared_params = c.active_extent = true;
    return c;
  }

  // Off by default: two clock reads per kernel are measurable on tiny graphs (docs/performance.md).
  void set_profiling(bool on) override {
    require_idle("set_profiling");
    micros_.assign(on ? kernels_.size() : 0, 0.0);
    profiled_ = false;
  }

  std::vector<runtime::KernelTime> kernel_times() const override {
    require_idle("kernel_times");
    std::vector<runtime::KernelTime> out;
    if (!profiled_) return out;
    for (std::size_t i = 0; i < micros_.size(); ++i) out.push_back({plan_->kernel_names[i], micros_[i], false});
    return out;
  }

  void set_param_typed(std::size_t index, const ir::TensorView& value) override {
    require_idle("set_param_typed");
    if (index >= plan_->param_io.size())
      throw Error("cpu: param index " + std::to_string(index) + " out of range (" +
                  std::to_string(plan_->param_io.size()) + " params)");
    auto t = converted(plan_->param_io[index], value, "set_param_typed: param " + std::to_string(index));
    set_param(index, t ? t->data() : value.data, t ? t->nbytes() : value.nbytes);
  }

  std::vector<ir::Tensor> run_typed(std::span<const ir::TensorView> inputs) override {
    require_idle("run_typed");
    if (inputs.size() != plan_->n_inputs)
      throw Error("cpu: run_typed got " + std::to_string(inputs.size()) + " inputs, expected " +
                  std::to_string(plan_->n_inputs));
    std::vector<std::optional<ir::Tensor>> conv(inputs.size());
    std::vector<const void*> in(inputs.size(), this);  // any non-null pointer for handles and zero-size inputs
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (handles_[i]) continue;
      conv[i] = converted(plan_->input_io[i], inputs[i], "run_typed: input " + std::to_string(i));
      if (conv[i])
        in[i] = conv[i]->data();
      else if (inputs[i].data)
        in[i] = inputs[i].data;
    }
    std::vector<ir::Tensor> outs;
    std::vector<void*> out;
    outs.reserve(plan_->output_io.size());
    for (const auto& io : plan_->output_io) out.push_back(outs.emplace_back(io.dtype, io.shape).data());
    execute(in, out, false);
    return outs;
  }

  void run_read_outputs(std::span<const void* const> inputs, std::span<void* const> outputs) override {
    require_idle("run_read_outputs");
    execute(inputs, outputs, true);
  }

  // The run happens on a thread of its own; the pool's workers serve it as they serve any caller.
  void commit_no_wait(std::span<const void* const> inputs, std::span<void* const> outputs) override {
    pending_.start(inputs, outputs, [this](auto in, auto out) { execute(in, out, false); });
  }

  void sync_pending() override { pending_.wait(); }

  // No overlap to gain on the CPU: the sets run back to back.
  void run_pipelined(std::span<const std::vector<const void*>> inputs,
                     std::span<const std::vector<void*>> outputs) override {
    require_idle("run_pipelined");
    runtime::run_sets_in_order("cpu", inputs, outputs, [this](auto in, auto out) { execute(in, out, false); });
  }

  void bind_handle(std::size_t index, const void* data, std::size_t nbytes) override {
    require_idle("bind_handle");
    const std::size_t want = index < plan_->input_io.size() ? io_bytes(plan_->input_io[index]) : 0;
    if (index >= plan_->n_inputs || nbytes != want)
      throw Error("cpu: bind_handle: input " + std::to_string(index) + " expects " + std::to_string(want) +
                  " bytes, got " + std::to_string(nbytes));
    if (!handles_[index]) handles_[index].emplace(nbytes);
    if (nbytes) std::memcpy(handles_[index]->data(), data, nbytes);
  }

  void read_handle(std::size_t index, void* dst, std::size_t nbytes) const override {
    require_idle("read_handle");
    if (index >= plan_->n_inputs || !handles_[index])
      throw Error("cpu: read_handle: input " + std::to_string(index) + " has no handle (bind_handle first)");
    if (nbytes != handles_[index]->size())
      throw Error("cpu: read_handle: input " + std::to_string(index) + " holds " +
                  std::to_string(handles_[index]->size()) + " bytes, asked for " + std::to_string(nbytes));
    if (nbytes) std::memcpy(dst, handles_[index]->data(), nbytes);
  }

  // One copy, host memory to host memory.
  void copy_handle_to(std::size_t index, runtime::ExecutableGraph& dst, std::size_t nbytes) const override {
    require_idle("copy_handle_to");
    if (index >= handles_.size() || !handles_[index])
      throw Error("cpu: copy_handle_to: input " + std::to_string(index) + " has no handle (bind_handle it first)");
    dst.bind_handle(index, handles_[index]->data(), nbytes);  // its own size checks
  }

  void feed_handle(std::size_t index, std::size_t output) override {
    require_idle("feed_handle");
    if (index >= plan_->n_inputs || !handles_[index] || output >= plan_->outputs.size() ||
        plan_->outputs[output].bytes != handles_[index]->size())
      throw Error("cpu: feed_handle: input " + std::to_string(index) + " needs a bound handle the size of output " +
                  std::to_string(output));
    // One feed per handle: feeding it again replaces the output it comes from.
    std::erase_if(feeds_, [&](const auto& f) {
      if (f.first == index) donated_[f.second] = false;
      return f.first == index;
    });
    feeds_.emplace_back(index, output);
    if (plan_->donor[output] == std::int32_t(index)) donated_[output] = true;
  }

  void set_rng(const runtime::RngOptions& rng) override {
    require_idle("set_rng");
    reseeded_.clear();
    for (std::size_t i = 0; i < kernels_.size(); ++i) kernels_[i] = plan_->kernels[i].get();
    rng_ = rng;
    if (rng.seed == 0) return;
    for (std::size_t i : plan_->random_kernels) {
      compile::Kernel k = plan_->random_lir->kernels[i];
      ir::Graph body(k.body.name());
      for (ir::Node n : k.body.nodes()) {
        if (n.op == ir::OpKind::RandomUniform || n.op == ir::OpKind::RandomNormal)
          n.attrs.set("seed", std::int64_t(runtime::effective_seed(std::uint64_t(n.attrs.get_int("seed")), rng)));
        body.add_raw(std::move(n));
      }
      for (const auto& o : k.body.outputs()) body.add_output(o.node, o.name);
      k.body = std::move(body);
      auto kernel = build_leaf(BuildCtx{*plan_->random_lir, k, plan_->threads, plan_->stream, nullptr});
      assert(kernel->shared_bytes == 0 && kernel->thread_bytes == 0);
      kernels_[i] = reseeded_.emplace_back(std::move(kernel)).get();
    }
  }

  runtime::RngOptions rng() const override { return rng_; }

  void copy_params_from(const runtime::ExecutableGraph& src) override {
    require_idle("copy_params_from");
    const CpuExecutable& cpu = same_params(src, "copy_params_from");
    if (cpu.params_ == params_) return;  // clones share their params already
    for (std::size_t i = 0; i < plan_->param_bytes.size(); ++i)
      set_param(i, cpu.params_->base(i), plan_->param_bytes[i]);
  }

 private:
  // `src` as a CPU executable whose params have this one's number, dtypes and shapes; rlx::Error naming `method`.
  const CpuExecutable& same_params(const runtime::ExecutableGraph& src, const char* method) const {
    const auto* cpu = dynamic_cast<const CpuExecutable*>(&src);
    if (!cpu)
      throw Error(std::string("cpu: ") + method + ": the source is an executable of backend '" + src.backend_name() +
                  "'");
    bool same = cpu->plan_->param_io.size() == plan_->param_io.size();
    for (std::size_t i = 0; same && i < plan_->param_io.size(); ++i)
      same = cpu->plan_->param_io[i].dtype == plan_->param_io[i].dtype &&
             cpu->plan_->param_io[i].shape == plan_->param_io[i].shape;
    if (!same) throw Error(std::string("cpu: ") + method + ": the source's params differ in number, dtype or shape");
    return *cpu;
  }

  static std::size_t io_bytes(const Plan::Io& io) { return ir::storage_bytes(io.dtype, io.shape); }

  void require_idle(const char* method) const { pending_.require_idle(method); }

  // `value` converted to `io`'s dtype, or nullopt when it has that dtype already.
  static std::optional<ir::Tensor> converted(const Plan::Io& io, const ir::TensorView& value, const std::string& what) {
    const std::size_t n = std::size_t(numel(io.shape));
    if (value.dtype != io.dtype && (ir::is_block_quantized(value.dtype) || ir::is_block_quantized(io.dtype)))
      throw Error("cpu: " + what + " expects " + std::string(ir::dtype_name(io.dtype)) + ", got " +
                  std::string(ir::dtype_name(value.dtype)) + " (block-quantized values are not converted)");
    if (value.nbytes != ir::storage_bytes(value.dtype, io.shape) || (n && !value.data))
      throw Error("cpu: " + what + " expects " + std::to_string(n) + " elements of " +
                  std::string(ir::dtype_name(value.dtype)) + ", got " + std::to_string(value.nbytes) + " bytes");
    if (value.dtype == io.dtype) return std::nullopt;
    ir::Tensor src(value.dtype, io.shape, {static_cast<const std::byte*>(value.data), value.nbytes});
    ir::Tensor dst(io.dtype, io.shape);
    for (std::int64_t i = 0; i < dst.numel(); ++i) dst.set(i, src.get(i));
    return dst;
  }

  // One run. With `sparse`, outputs[j] == nullptr means output j is not read
  // back: in-place outputs then land in scratch, allocated on first use.
  void execute(std::span<const void* const> inputs, std::span<void* const> outputs, bool sparse) {
    if (inputs.size() != plan_->n_inputs || outputs.size() != plan_->outputs.size())
      throw Error("cpu: run() got " + std::to_string(inputs.size()) + " inputs and " + std::to_string(outputs.size()) +
                  " outputs, expected " + std::to_string(plan_->n_inputs) + " and " +
                  std::to_string(plan_->outputs.size()));
    for (const auto& [buffer, r] : plan_->dynamic) {
      const auto i = std::size_t(r.index);
      const void* base = nullptr;
      if (r.base == Base::Input) {
        base = handles_[i] ? handles_[i]->data() : inputs[i];
      } else if (donated_[i]) {
        base = handles_[std::size_t(plan_->donor[i])]->data();  // computed over its own handle (feed_handle)
      } else {
        base = outputs[i];
        if (!base && sparse) {
          if (!out_scratch_[i]) out_scratch_[i].emplace(plan_->outputs[i].bytes);
          base = out_scratch_[i]->data();
        }
      }
      ptrs_[std::size_t(buffer)] = static_cast<std::byte*>(const_cast<void*>(base)) + r.offset;
    }
    if (params_version_ != params_->version) resolve_pointers();  // a clone's sibling shared a param
    refresh_packs();
    const RunCtx ctx{ptrs_.data(), shared_.data(), threads_.data(), stride_, plan_->threads, plan_->isa};
    if (micros_.empty()) {
      for (const CpuKernel* k : kernels_) k->run(ctx);
    } else {
      for (std::size_t i = 0; i < kernels_.size(); ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        kernels_[i]->run(ctx);
        micros_[i] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      }
      profiled_ = true;
    }
    for (std::size_t j = 0; j < plan_->outputs.size(); ++j) {
      const Output& o = plan_->outputs[j];
      if ((o.in_place && !donated_[j]) || o.bytes == 0 || !outputs[j]) continue;
      const std::byte* src = ptrs_[std::size_t(o.buffer)];
      auto* dst = static_cast<std::byte*>(outputs[j]);
      constexpr std::size_t kPiece = 1 << 20;
      parallel_for(
          i64((o.bytes + kPiece - 1) / kPiece), 1,
          [&](i64 b, i64 e) {
            std::size_t lo = std::size_t(b) * kPiece, hi = std::min(o.bytes, std::size_t(e) * kPiece);
            std::memcpy(dst + lo, src + lo, hi - lo);
          },
          plan_->threads);
    }
    for (const auto& [in, out] : feeds_)
      if (!donated_[out])
        std::memmove(handles_[in]->data(), ptrs_[std::size_t(plan_->outputs[out].buffer)], handles_[in]->size());
  }

 public:
  // Handles, feeds and pending runs are per executable; the rng setting carries over.
  std::unique_ptr<runtime::ExecutableGraph> clone() const override {
    auto c = std::make_unique<CpuExecutable>(plan_, params_, packs_);
    c->set_backend_name(backend_name());
    if (rng_.seed) c->set_rng(rng_);
    return c;
  }

  std::size_t packed_operands() const { return plan_->packs.size(); }
  std::vector<std::string> strategies() const {
    std::vector<std::string> out;
    for (const auto& k : plan_->kernels) out.push_back(k->strategy());
    return out;
  }

 private:
  std::shared_ptr<const Plan> plan_;
  std::shared_ptr<ParamStore> params_;
  std::shared_ptr<PackStore> packs_;
  AlignedBytes arena_, shared_;
  std::size_t stride_;
  AlignedBytes threads_;
  std::vector<std::byte*> ptrs_;
  std::vector<const CpuKernel*> kernels_;  // plan_->kernels, with set_rng's reseeded ones swapped in
  std::vector<double> micros_;             // per kernel while profiling (empty: off)
  bool profiled_ = false;                  // a run since profiling was turned on
  std::vector<std::unique_ptr<CpuKernel>> reseeded_;
  runtime::RngOptions rng_;
  std::vector<std::optional<AlignedBytes>> handles_;        // per input
  std::uint64_t params_version_ = 0;                        // params_->version that ptrs_ reflects
  std::vector<std::pair<std::size_t, std::size_t>> feeds_;  // (input, output) copied after each run
  std::vector<bool> donated_;  // per output: fed to its Plan::donor's handle, so computed in that handle
  std::vector<std::optional<AlignedBytes>> out_scratch_;  // per output, for outputs not read back
  runtime::PendingRun pending_{"cpu"};  // last: destroyed first, so a pending run finishes before the rest goes
};

// OpenBLAS runs single-threaded inside the pool's tasks (matmul panels, conv
// tiles, attention blocks): one threading layer, no oversubscription, and
// epilogues run on the panel a task just wrote. This sets a process-wide
// OpenBLAS setting, once.
void single_threaded_blas() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

// Outputs bigger than the last-level cache are written with non-temporal
// stores. Virtual machines often report the host's whole L3 (or nothing), so
// the size is clamped to what one core can actually use.
std::int64_t stream_threshold() {
  long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return std::clamp<std::int64_t>(l3 > 0 ? l3 : 32 << 20, 8 << 20, 32 << 20);
}

class CpuBackend final : public runtime::Backend {
 public:
  std::string_view name() const override { return "cpu"; }

  compile::BackendTraits traits() const override {
    using ir::OpKind;
    compile::BackendTraits t;
    t.name = "cpu";
    // Every primitive, except formula ops without an instruction of their own (those run as their formula).
    // The formula ops' instructions are SIMD kernels in f32 (f16 and bf16 compute in f32): at other dtypes
    // (f64) they run as their formula too, so the op table's expression is the one scalar path.
    for (OpKind op : ir::kAllOps)
      if (ir::op_info(op).cls != ir::OpClass::Composite && (!ir::op_def(op).formula || has_instruction(op))) {
        t.native_ops.insert(op);
        if (ir::op_def(op).formula) t.native_ops.only_at[op] = {ir::DType::F32, ir::DType::F16, ir::DType::BF16};
      }
    for (OpKind op : {OpKind::Softmax, OpKind::LogSoftmax, OpKind::LayerNorm, OpKind::RmsNorm, OpKind::Conv1d,
                      OpKind::Conv2d, OpKind::MaxPool2d, OpKind::AvgPool2d, OpKind::Attention, OpKind::Rope,
                      OpKind::SoftmaxBackward, OpKind::LayerNormBackward, OpKind::RmsNormBackward}) {
      t.native_ops.insert(op);
      t.f32_compute_ops.insert(op);
    }
    // The block-quantized ops (kernel_quant.cpp): the weight stays in its blocks; embedding picks rows of any
    // table (a block table's rows dequantized as they are copied).
    t.native_ops.insert(OpKind::QuantizedMatmul);
    t.native_ops.insert(OpKind::Embedding);
    t.native_ops.insert(OpKind::DynamicUpdateSlice);  // any dtype: rows copied (kernel_movement.cpp)
    t.f32_compute_ops.insert(OpKind::MatMul);
    t.matmul_transposed_b = true;
    // Attention reads q, k and v and writes its result through head-split permutes (its GEMMs' leading dims).
    t.attention_layout_views = true;
    t.matmul_multi_output_epilogue = true;
    t.matmul_widened_operands = true;  // int8 and bf16 GEMMs (lowp_gemm.hpp)
    // bf16 weights rounded as they are packed, once per write (a PackSpec with round_from_f32).
    t.matmul_narrowed_params = select_lowp_table().bf16_nr > 0;
    // PTQ's int8 matmuls where the CPU has an int8 GEMM (VNNI); bf16 matmuls only on AMX: with vdpbf16ps
    // alone, bf16's peak is f32's, so auto-mixed precision would only add casts (docs/precision.md).
    if (select_lowp_table().i8_nr > 0) t.fast_low_precision.insert({OpKind::MatMul, ir::DType::I8});
    if (bf16_beats_f32(select_lowp_table())) t.fast_low_precision.insert({OpKind::MatMul, ir::DType::BF16});
    // A weight rounded and packed once per write (matmul_narrowed_params: a [K, N] f32 param read as B) costs
    // nothing per run, so such a bf16 layer pays from one row and the precision pass applies no floor to it (Zen
    // 4, 1024 x 1024, bench_kernels amp_linear: 1.6x f32 at 1 row, 1.7x at 16, 1.9x at 64). Any other B (a
    // transposed weight, an activation) is cast and packed every run, K·N work that only enough rows pay back:
    // 0.11x f32 at 1 row, 0.29x at 16, 0.91x at 64, 1.5x at 256 there; on AMX 0.77x at 64 and 1.2x at 256.
    t.low_precision_matmul_min_rows = 256;
    // Where PTQ's int8 form of a matmul beats its f32 one: measured per lowp table (lowp_impl.inc).
    t.int8_matmul_min_macs = select_lowp_table().i8_min_macs;
    t.int8_matmul_min_n = select_lowp_table().i8_min_n;
    t.int8_matmul_min_row_macs = select_lowp_table().i8_min_row_macs;
    for (auto& name : runtime::host_kernel_names()) t.custom_kernels.insert(std::move(name));
    t.arena_alignment = std::int64_t(kAlign);
    return t;
  }

  std::unique_ptr<runtime::ExecutableGraph> compile_lir(const compile::LirModule& lir,
                                                        const compile::CompileOptions& options) override {
    single_threaded_blas();
    auto plan = std::make_shared<Plan>();
    plan->isa = &select_kernels();
    plan->lowp = &select_lowp_table();
    const int pool = ThreadPool::instance().size();
    plan->threads = options.num_threads > 0 ? std::min(options.num_threads, pool) : pool;
    plan->arena_bytes = std::size_t(std::max<std::int64_t>(lir.memory.arena_bytes, 0));
    plan->n_inputs = lir.inputs.size();
    const std::int64_t stream = stream_threshold();
    plan->stream = stream;
    auto io = [&](BufferId id) { return Plan::Io{lir.buffer(id).dtype, lir.buffer(id).shape}; };
    for (BufferId id : lir.inputs) plan->input_io.push_back(io(id));
    for (BufferId id : lir.params) plan->param_io.push_back(io(id));
    for (BufferId id : lir.outputs) plan->output_io.push_back(io(id));
    PackRegistry packs{plan->isa, plan->lowp, lir.buffers.size(), {}};

    std::vector<std::pair<BufferId, BufferId>> updates_in_place;  // (x, y) of each dynamic_update_slice
    for (const auto& k : lir.kernels) {
      BuildCtx b{lir, k, plan->threads, stream, &packs};
      if (k.kind == compile::KernelKind::Native && b.anchor().op == ir::OpKind::DynamicUpdateSlice)
        updates_in_place.emplace_back(b.in_of(b.anchor().inputs.at(0)).id, b.out(0).id);
      std::unique_ptr<CpuKernel> ck;
      switch (k.kind) {
        case compile::KernelKind::Elementwise: ck = build_elementwise(b); break;
        case compile::KernelKind::Reduce: ck = build_reduce(b); break;
        case compile::KernelKind::MatMul: ck = build_matmul(b); break;
        case compile::KernelKind::Movement: ck = build_movement(b); break;
        case compile::KernelKind::Native:
          ck = b.anchor().op == ir::OpKind::Custom ? build_custom(b) : build_native(b);
          break;
        case compile::KernelKind::Leaf: ck = build_leaf(b); break;
        case compile::KernelKind::ControlFlow: ck = build_control_flow(b, options); break;
      }
      if (k.kind == compile::KernelKind::Leaf &&
          (b.anchor().op == ir::OpKind::RandomUniform || b.anchor().op == ir::OpKind::RandomNormal))
        plan->random_kernels.push_back(plan->kernels.size());
      plan->shared_bytes = std::max(plan->shared_bytes, align_up(ck->shared_bytes));
      plan->thread_bytes = std::max(plan->thread_bytes, align_up(ck->thread_bytes));
      plan->kernels.push_back(std::move(ck));
      plan->kernel_names.push_back(k.name);
    }

    for (const auto& v : lir.constant_values) {
      AlignedBytes c(v.nbytes(), "a CPU constant");
      if (v.nbytes()) std::memcpy(c.data(), v.data(), v.nbytes());
      plan->constants.push_back(std::move(c));
    }
    auto params = std::make_shared<ParamStore>();
    for (BufferId id : lir.params) {
      std::size_t n = nbytes_of(lir.buffer(id));
      plan->param_bytes.push_back(n);
      params->data.emplace_back(n,
                                "a CPU param");  // not cleared: CompiledGraph refuses to run until set_param wrote it
    }
    params->shared.assign(params->data.size(), nullptr);
    params->owners.resize(params->data.size());
    params->writes.assign(params->data.size(), 0);

    // Arena outputs that own their storage are written straight into the caller's memory.
    std::vector<int> out_of(lir.buffers.size(), -1);
    for (std::size_t j = 0; j < lir.outputs.size(); ++j) {
      const auto& b = lir.buffer(lir.outputs[j]);
      Output o{b.id, nbytes_of(b), false};
      if (b.role == BufferRole::Arena && (b.root < 0 || b.root == b.id) && o.bytes > 0 &&
          out_of[std::size_t(b.id)] < 0) {
        o.in_place = true;
        out_of[std::size_t(b.id)] = int(j);
      }
      plan->outputs.push_back(o);
    }

    plan->refs.resize(lir.buffers.size());
    for (const auto& b : lir.buffers) {
      const auto& root = lir.buffer(b.root < 0 ? b.id : b.root);
      Ref r;
      r.offset = b.root < 0 || b.root == b.id ? 0 : b.view_offset;
      if (root.root >= 0 && root.root != root.id)
        throw Error("cpu: buffer " + std::to_string(b.id) + " is a view of a view (" + std::to_string(root.id) + ")");
      switch (root.role) {
        case BufferRole::Arena:
          if (out_of[std::size_t(root.id)] >= 0) {
            r.base = Base::Output;
            r.index = out_of[std::size_t(root.id)];
          } else {
            r.base = Base::Arena;
            r.offset += root.arena_offset;
            if (root.arena_offset < 0 || std::size_t(root.arena_offset) + nbytes_of(root) > plan->arena_bytes)
              throw Error("cpu: arena buffer " + std::to_string(root.id) + " (" + root.name +
                          ") lies outside the planned arena of " + std::to_string(plan->arena_bytes) + " bytes");
          }
          break;
        case BufferRole::Input:
          r.base = Base::Input;
          r.index = root.external_index;
          break;
        case BufferRole::Param:
          r.base = Base::Param;
          r.index = root.external_index;
          break;
        case BufferRole::Constant:
          r.base = Base::Constant;
          r.index = root.external_index;
          break;
      }
      plan->refs[std::size_t(b.id)] = r;
      if (r.base == Base::Input || r.base == Base::Output) plan->dynamic.emplace_back(b.id, r);
    }

    plan->donor = donors(lir, *plan, updates_in_place);

    if (!plan->random_kernels.empty()) {
      auto copy = std::make_shared<compile::LirModule>(lir);
      copy->constant_values.clear();
      plan->random_lir = std::move(copy);
    }

    // Packed copies of params are written by set_param (like the params; a
    // fresh page is only faulted in once), those of constants here.
    plan->packs = std::move(packs.operands);
    auto pack_store = std::make_shared<PackStore>();
    pack_store->packed_at.assign(plan->packs.size(), 0);
    for (std::size_t i = 0; i < plan->packs.size(); ++i) {
      const PackedOperand& op = plan->packs[i];
      const Base base = plan->refs[std::size_t(op.buffer)].base;
      if (base != Base::Param && base != Base::Constant)
        throw Error("cpu: packed GEMM operand " + std::to_string(op.buffer) + " is not a param or constant");
      pack_store->packed.emplace_back(packed_bytes(*plan->isa, op));
      if (base == Base::Constant) pack_operand(*plan, *params, *pack_store, i);
    }
    return std::make_unique<CpuExecutable>(std::move(plan), std::move(params), std::move(pack_store));
  }
};

[[maybe_unused]] const bool registered =
    (runtime::register_backend(runtime::Device::Cpu, [] { return std::make_unique<CpuBackend>(); }), true);

}  // namespace

std::unique_ptr<runtime::Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

std::size_t packed_operand_count(const runtime::ExecutableGraph& exe) {
  const auto* cpu = dynamic_cast<const CpuExecutable*>(&exe);
  if (!cpu) throw Error("packed_operand_count: not an executable of the CPU backend");
  return cpu->packed_operands();
}

std::vector<std::string> kernel_strategies(const runtime::ExecutableGraph& exe) {
  const auto* cpu = dynamic_cast<const CpuExecutable*>(&exe);
  if (!cpu) throw Error("kernel_strategies: not an executable of the CPU backend");
  return cpu->strategies();
}

std::vector<std::string> available_isas() { return supported_isas(); }

std::string selected_isa() { return select_kernels().name; }

}  // namespace rlx::backends::cpu
